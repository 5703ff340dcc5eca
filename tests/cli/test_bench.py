"""``runtime-core bench`` / ``runtime-core profile`` and the benchmark model builders (tiny models,
few repeats; timings are never asserted, only that they are measured and reported)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]


def cli(*args, check=True, env=None):
    proc = subprocess.run([sys.executable, "-m", "runtime_core", *args], capture_output=True, text=True,
                          timeout=300, env=env)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def _tiny(path: Path, with_inputs=True) -> Path:
    w = numpy_helper.from_array(np.ones((8, 8), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Abs", ["m"], ["y"], name="relu")]  # not Relu: MatMul + Relu fuses at ALL
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path.write_bytes(m.SerializeToString())
    if with_inputs:
        np.savez(path.with_suffix(".npz"), x=np.full((3, 8), 0.5, np.float32))
    return path


def _models_module():
    spec = importlib.util.spec_from_file_location("bench_models", ROOT / "benchmarks" / "models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_against_onnxruntime_prints_the_table(tmp_path):
    pytest.importorskip("onnxruntime")
    model = _tiny(tmp_path / "tiny.onnx")
    out = cli("bench", str(model), "--compare", "onnxruntime", "--in-process", "--repeat", "3", "--warmup", "1",
              "--threads", "2", "--memory-runs", "1").stdout
    for needle in ("latency median", "latency min", "latency max", "session creation", "peak memory",
                   "runtime-core", "onnxruntime", "ratio (runtime-core / onnxruntime, median latency):",
                   "threads: 2", "providers: CPUExecutionProvider", "per node", "max abs difference to onnxruntime 0",
                   f"inputs: {model.with_suffix('.npz')}", "VmHWM"):
        assert needle in out, (needle, out)


def test_bench_json_has_every_measurement(tmp_path):
    pytest.importorskip("onnxruntime")
    model = _tiny(tmp_path / "tiny.onnx")
    d = json.loads(cli("bench", str(model), "--compare", "onnxruntime", "--in-process", "--repeat", "2",
                       "--warmup", "0", "--memory-runs", "1", "--json").stdout)
    for side in ("ours", "ort"):
        lat = d[side]["latency"]
        assert lat["runs"] == 2 and 0 < lat["min_ms"] <= lat["median_ms"] <= lat["max_ms"]
        assert d[side]["create_s"] > 0 and d[side]["peak_mb"] is not None
    assert d["ratio"] == pytest.approx(d["ours"]["latency"]["median_ms"] / d["ort"]["latency"]["median_ms"])
    assert d["nodes"] == 2 and d["max_abs_diff"] == 0


def test_bench_without_compare_or_memory(tmp_path):
    model = _tiny(tmp_path / "tiny.onnx", with_inputs=False)
    out = cli("bench", str(model), "--repeat", "2", "--no-memory", "--dim", "4").stdout
    assert "latency median" in out and "onnxruntime" not in out and "peak memory" not in out
    assert "inputs: random (symbolic dims = 4)" in out


@pytest.mark.parametrize("pin", [None, "Haswell"])
def test_bench_names_numpys_blas_kernels_and_their_pin(tmp_path, pin):
    # the CPU provider's GEMMs run in numpy's BLAS: the reader of a ratio must see which
    # kernels it ran and whether OPENBLAS_CORETYPE chose them
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if pin and not any(i.get("internal_api") == "openblas" for i in threadpoolctl.threadpool_info()):
        pytest.skip("numpy's BLAS here is not OpenBLAS, which is what OPENBLAS_CORETYPE pins")
    model = _tiny(tmp_path / "tiny.onnx")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    if pin:
        env["OPENBLAS_CORETYPE"] = pin
    out = cli("bench", str(model), "--repeat", "2", "--no-memory", "--threads", "1", env=env).stdout
    line = next(x for x in out.splitlines() if x.startswith("numpy BLAS: "))
    assert "1 threads" in line, line
    if pin:
        assert f"pinned by OPENBLAS_CORETYPE={pin}" in line and f"{pin} kernels" in line, line
    else:
        assert "pinned" not in line, line


def test_min_time_keeps_interleaving_past_repeat(tmp_path):
    pytest.importorskip("onnxruntime")
    model = _tiny(tmp_path / "tiny.onnx")
    d = json.loads(cli("bench", str(model), "--compare", "onnxruntime", "--in-process", "--repeat", "2",
                       "--warmup", "0", "--no-memory", "--min-time", "0.3", "--json").stdout)
    ours, ort = d["ours"]["latency"]["runs"], d["ort"]["latency"]["runs"]
    # a run of this model takes well under 3 ms here, so 0.3 s needs far more than 2 pairs; the
    # loop stops at 50x repeat, and both runtimes are timed alike
    assert 2 < ours <= 100 and ours == ort == d["repeat"]
    d = json.loads(cli("bench", str(model), "--repeat", "3", "--warmup", "0", "--no-memory", "--json").stdout)
    assert d["ours"]["latency"]["runs"] == 3 and d["repeat"] == 3
    proc = cli("bench", str(model), "--repeat", "2", "--no-memory", "--min-time", "-1", check=False)
    assert proc.returncode == 2 and "--min-time: must be a finite number >= 0" in proc.stderr


def test_settle_alternates_blocks_and_says_so(tmp_path):
    # blocks of each runtime's runs after an idle pause (the default with --compare), or run by
    # run with --settle 0; both runtimes timed alike either way
    pytest.importorskip("onnxruntime")
    model = _tiny(tmp_path / "tiny.onnx")
    out = cli("bench", str(model), "--compare", "onnxruntime", "--in-process", "--repeat", "4", "--warmup", "0",
              "--no-memory", "--settle", "0.05").stdout
    assert "the runtimes alternated in blocks of 4 timed run(s), each block after 0.05 s idle" in out, out
    d = json.loads(cli("bench", str(model), "--compare", "onnxruntime", "--in-process", "--repeat", "3",
                       "--warmup", "0", "--no-memory", "--settle", "0", "--json").stdout)
    assert d["ours"]["latency"]["runs"] == d["ort"]["latency"]["runs"] == 3
    assert not any("blocks" in n for n in d["notes"])
    proc = cli("bench", str(model), "--compare", "onnxruntime", "--in-process", "--repeat", "2", "--no-memory",
               "--settle", "-1", check=False)
    assert proc.returncode == 2 and "--settle: must be a finite number >= 0" in proc.stderr


def test_compare_without_onnxruntime_is_a_clear_error(tmp_path):
    model = _tiny(tmp_path / "tiny.onnx")
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "onnxruntime.py").write_text("raise ImportError('onnxruntime is blocked for this test')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")]))
    proc = cli("bench", str(model), "--compare", "onnxruntime", "--repeat", "1", check=False, env=env)
    assert proc.returncode == 2
    assert "needs the onnxruntime package, which is not installed" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_compare_takes_only_onnxruntime(tmp_path):
    proc = cli("bench", str(_tiny(tmp_path / "t.onnx")), "--compare", "tvm", check=False)
    assert proc.returncode != 0 and "--compare takes 'onnxruntime'" in proc.stderr


def test_inputs_missing_a_feed_is_reported(tmp_path):
    model = _tiny(tmp_path / "tiny.onnx", with_inputs=False)
    np.savez(tmp_path / "other.npz", z=np.zeros(1))
    proc = cli("bench", str(model), "--inputs", str(tmp_path / "other.npz"), "--no-memory", check=False)
    assert proc.returncode == 2 and "has no value for input(s) x" in proc.stderr


def test_profile_prints_op_provider_and_top_nodes(tmp_path):
    model = _tiny(tmp_path / "tiny.onnx")
    out = cli("profile", str(model), "--repeat", "3", "--prefix", str(tmp_path / "p")).stdout
    assert "(3 run(s)" in out
    assert "time by op type:" in out and "time by provider:" in out and "top 2 nodes:" in out
    lines = out.splitlines()
    op_rows = lines[lines.index("time by op type:") + 2: lines.index("time by op type:") + 4]
    assert sorted(r.split()[0] for r in op_rows) == ["Abs", "MatMul"]
    assert any(r.split()[:1] == ["CPUExecutionProvider"] and r.split()[3] == "6" for r in lines)
    traces = list(tmp_path.glob("p_*.json"))
    assert len(traces) == 1
    s = json.loads(cli("profile", str(traces[0]), "--json").stdout)  # an existing trace
    # the trace holds the warm-up run too (the summary above leaves it out)
    assert s["runs"] == 4 and {r[0] for r in s["by_op"]} == {"MatMul", "Abs"}
    assert [n[0] for n in s["top_nodes"]] and {n[0] for n in s["top_nodes"]} == {"mm", "relu"}


def test_profile_summarizes_onnxruntimes_own_trace(tmp_path):
    pytest.importorskip("onnxruntime")
    model = _tiny(tmp_path / "tiny.onnx")
    out = cli("profile", str(model), "--onnxruntime", "--repeat", "2", "--prefix", str(tmp_path / "o")).stdout
    assert "(2 run(s)" in out and "CPUExecutionProvider" in out and "Abs" in out


def test_add_chain_builder_and_cache(tmp_path):
    mod = _models_module()
    assert {"bert_base", "gpt2_small", "resnet18", "mobilenet_v2", "vit_tiny", "bert_tiny_b8", "lstm", "gru",
            "random_forest", "lightgbm", "xgboost", "add_chain"} <= set(mod.MODELS)
    model, feeds = mod.build("add_chain", tmp_path)
    import onnx

    m = onnx.load(str(model))
    assert len(m.graph.node) == 1000 and {n.op_type for n in m.graph.node} == {"Add"}
    assert mod.MODELS["add_chain"][1] == {"level": 0}
    mtime = model.stat().st_mtime_ns
    assert mod.build("add_chain", tmp_path)[0].stat().st_mtime_ns == mtime  # cached, not rebuilt
    import runtime_core as rt

    so = rt.SessionOptions()
    so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    x = np.load(feeds)["x"]
    y = rt.InferenceSession(str(model), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(y, x + 1000)


def test_unknown_benchmark_model_is_named(tmp_path):
    with pytest.raises(KeyError, match="unknown benchmark model 'nope'; known: bert_base"):
        _models_module().build("nope", tmp_path)
