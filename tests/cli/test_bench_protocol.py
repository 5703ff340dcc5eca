"""The protocol of ``runtime-core bench --compare onnxruntime``: each runtime alone in a fresh
process per round, alternating rounds, median of per-round ratios, OpenBLAS pins removed in the
children, a header that names the machine (one tiny model, 3 rounds of few runs; timings are
never asserted)."""

import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime_core import bench_protocol as bp
from runtime_core.bench import BenchError

PINS = {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "1048576"}


def _tiny(path: Path) -> Path:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path.write_bytes(m.SerializeToString())
    return path


def _fake_corpus(folder: Path, model: Path) -> Path:
    """A corpus package with the interface of benchmarks/corpus (select, build) and one entry."""
    folder.mkdir()
    (folder / "__init__.py").write_text(textwrap.dedent(f"""
        from pathlib import Path
        import shutil
        import numpy as np

        def select(half):
            return {{"tune": ["tiny_mm"], "report": [], "all": ["tiny_mm"]}}[half]

        def build(name, cache, size):
            assert size == "bench"
            out = Path(cache) / (name + ".onnx")
            shutil.copy({str(model)!r}, out)
            np.savez(out.with_suffix(".npz"), x=np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8))
            return out, out.with_suffix(".npz")
        """))
    return folder


def test_protocol_runs_each_runtime_in_fresh_children_and_reports_the_median_of_round_ratios(tmp_path):
    pytest.importorskip("onnxruntime")
    model = _tiny(tmp_path / "tiny.onnx")
    corpus = _fake_corpus(tmp_path / "corpus", model)
    env = dict(os.environ, **PINS)
    proc = subprocess.run([sys.executable, "-m", "runtime_core", "bench", "--compare", "onnxruntime", "--corpus",
                           "tune", "--cache", str(tmp_path / "cache"), "--corpus-path", str(corpus), "--rounds", "3",
                           "--repeat", "2", "--warmup", "1", "--min-time", "0", "--threads", "1", "--json"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    h = d["header"]
    assert h["cpu"]["model"] and h["cpu"]["isa_level"] and h["threads"] == 1 and h["rounds"] == 3
    assert h["blas"] and all({"internal_api", "version", "architecture"} <= set(b) for b in h["blas"])
    assert h["blas_env_in_children"] == {} and sorted(h["blas_env_removed"]) == sorted(PINS)
    (m,) = d["models"]
    assert m["label"] == "tiny_mm" and m["error"] is None and m["mismatch"] is None
    assert [r["first"] for r in m["rounds"]] == ["runtime-core", "onnxruntime", "runtime-core"]
    ratios = [r["ours_ms"] / r["ort_ms"] for r in m["rounds"]]
    assert [r["ratio"] for r in m["rounds"]] == pytest.approx(ratios)
    assert m["ratio"] == pytest.approx(statistics.median(ratios))
    for side, key in (("ours", "ours_ms"), ("ort", "ort_ms")):
        s = m[side]
        assert s["round_ms"] == pytest.approx([r[key] for r in m["rounds"]])
        assert s["median_ms"] == pytest.approx(statistics.median(s["round_ms"]))
        assert s["env_seen"] == {k: None for k in PINS}  # removed in both children
        assert s["peak_rss_mb"] > s["rss_before_session_mb"] > 0 and s["create_s"] > 0
    assert m["ours"]["version"] and m["ort"]["version"]
    assert m["max_rel_diff"] is not None and m["max_rel_diff"] < 1e-5
    # the header and each model's ratio go to stderr as the run goes
    assert "numpy BLAS in the children:" in proc.stderr and "tiny_mm: ratio" in proc.stderr


def test_children_keep_the_pins_only_when_told(tmp_path, monkeypatch):
    for k, v in PINS.items():
        monkeypatch.setenv(k, v)
    assert not set(PINS) & set(bp.child_env())
    kept = bp.child_env(keep_blas_env=True)
    assert {k: kept[k] for k in PINS} == PINS
    seen = bp.probe(kept)  # a child: numpy's BLAS as it sees it under this environment
    assert seen["env"] == PINS
    if any(b.get("internal_api") == "openblas" for b in seen["blas"]):
        assert seen["blas"][0]["architecture"] == "Haswell"  # the pin took effect in the child


def test_round_order_and_ratio_median_with_a_scripted_child(monkeypatch):
    # the figure is the median of per-round ratios, not the ratio of medians: here the two differ
    ours, ort = iter([10.0, 40.0, 20.0, 5.0]), iter([10.0, 10.0, 40.0, 5.0])
    calls = []

    def fake(args, env, timeout):
        runtime = args[1]
        calls.append(runtime)
        ms = next(ours if runtime == "ours" else ort)
        return {"median_ms": ms, "version": "v", "create_s": 0.1, "peak_rss_mb": 200.0 if runtime == "ours" else 100.0,
                "rss_before_session_mb": 50.0, "env": {}, "blas": []}

    monkeypatch.setattr(bp, "_spawn", fake)
    mc = bp.compare_model("m.onnx", inputs="feeds.npz", rounds=3, check=False)
    assert calls == ["ours", "onnxruntime", "onnxruntime", "ours", "ours", "onnxruntime"]
    assert [r["ratio"] for r in mc.rounds] == [1.0, 4.0, 0.5]
    assert mc.ratio == 1.0  # the ratio of the medians would be 20 / 10 = 2
    assert mc.ours.median_ms == 20.0 and mc.ort.median_ms == 10.0
    assert mc.memory_ratio == 2.0 and mc.growth_ratio == 150.0 / 50.0
    with pytest.raises(BenchError, match="at least 3 rounds"):
        bp.compare_model("m.onnx", inputs="feeds.npz", rounds=2)


def test_a_failing_child_is_reported_and_the_corpus_goes_on(monkeypatch):
    def fake(args, env, timeout):
        if args[1] == "ours" and args[2] == "bad.onnx":
            raise BenchError("the child exited with 1: InvalidGraph: no")
        return {"median_ms": 1.0, "version": "v", "create_s": 0.1, "peak_rss_mb": 1.0,
                "rss_before_session_mb": 0.5, "env": {}, "blas": []}

    monkeypatch.setattr(bp, "_spawn", fake)
    monkeypatch.setattr(bp, "header", lambda **kw: {"stub": True})
    rep = bp.compare([("bad", "bad.onnx", "f.npz"), ("good", "good.onnx", "f.npz")], check=False)
    bad, good = rep.models
    assert bad.ratio is None and "runtime-core failed in round 1" in bad.error and "InvalidGraph" in bad.error
    assert good.error is None and good.ratio == 1.0
    text = bp.format_rows(rep.models)
    assert "FAILED" in text and "bad: runtime-core failed" in text


def test_header_names_cpu_isa_blas_pins_and_threads():
    cpu = bp.cpu_description("processor\t: 0\nmodel name\t: Some CPU\ncpu family\t: 26\nmodel\t: 2\n"
                             "flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512bw avx512_vnni\n\nprocessor\t: 1\n")
    assert cpu["model"] == "Some CPU" and cpu["family"] == "26" and cpu["isa_level"] == "AVX-512 + VNNI"
    assert bp.cpu_description("model name : X\nflags : sse4_2 avx avx2 fma\n")["isa_level"] == "AVX2+FMA"
    h = {"cpu": cpu, "blas_text": "openblas 0.3.31, kernel SkylakeX, 2 threads", "numpy": "2", "python": "3",
         "keep_blas_env": False, "blas_env_removed": ["OPENBLAS_CORETYPE"], "blas_env_in_children": {},
         "threads": 2, "rounds": 3, "warmup": 3, "repeat": 10, "min_time": 1.0}
    text = bp.format_header(h)
    for needle in ("CPU: Some CPU (family 26, model 2)", "ISA level: AVX-512 + VNNI", "kernel SkylakeX",
                   "removed from both children (set here: OPENBLAS_CORETYPE)", "threads: 2", "rounds: 3"):
        assert needle in text, (needle, text)


@pytest.mark.parametrize("args, message", [
    (["--rounds", "2"], "--rounds"),
    (["--corpus", "tune"], "needs --cache"),
    (["--in-process", "--corpus", "tune", "--cache", "c"], "without --in-process"),
    (["--settle", "0.1"], "belongs to --in-process"),
    (["--in-process", "--rounds", "3"], "belongs to the protocol"),
])
def test_protocol_option_mistakes_are_usage_errors(tmp_path, capsys, args, message):
    from runtime_core.cli import main

    model = _tiny(tmp_path / "t.onnx")
    try:
        rc = main(["bench", str(model), "--compare", "onnxruntime", *args])
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2 and message in err, err


def test_an_output_difference_is_a_mismatch_above_the_rows_tolerance(tmp_path):
    y = np.linspace(-1, 1, 64, dtype=np.float32)
    np.savez(tmp_path / "ort.npz", y=y)
    np.savez(tmp_path / "ours.npz", y=y + np.float32(5e-3))  # 5e-3 of the largest magnitude
    for tol, flagged in ((bp.MISMATCH_TOLERANCE, True), (1e-2, False)):
        mc = bp.ModelComparison(label="m", model="m.onnx", inputs="")
        bp._compare_outputs(mc, tmp_path / "ours.npz", tmp_path / "ort.npz", tol)
        assert mc.max_rel_diff == pytest.approx(5e-3, rel=1e-3)
        assert (mc.mismatch is not None) is flagged, (tol, mc.mismatch)
