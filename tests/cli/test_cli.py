"""The console script, run as a new user would (subprocesses)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from oracle import make_model

SITE = Path(__file__).resolve().parents[1] / "plugins" / "fixtures" / "site"


def cli(*args, env_extra=None, check=True):
    env = dict(os.environ)
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, "-m", "runtime_core", *args], capture_output=True, text=True,
                          env=env, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_console_script_is_installed():
    import shutil

    exe = shutil.which("runtime-core") or str(Path(sys.executable).parent / "runtime-core")
    proc = subprocess.run([exe, "providers"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "CPUExecutionProvider" in proc.stdout


def test_providers_table_lists_cpu():
    out = cli("providers").stdout
    header, row = out.splitlines()[:2]
    for col in ("name", "alias", "distribution", "version", "plugin API", "available", "reason"):
        assert col in header
    assert "CPUExecutionProvider" in row and "cpu" in row and "yes" in row


def test_providers_lists_broken_plugins_and_still_works():
    out = cli("providers", env_extra={"PYTHONPATH": str(SITE)}).stdout
    assert "FakeGpuExecutionProvider" in out
    assert "brokenimport" in out and "missing native library" in out
    assert "api-mismatch" in out
    info = json.loads(cli("providers", "--json", env_extra={"PYTHONPATH": str(SITE)}).stdout)
    assert {i["alias"]: i["status"] for i in info}["brokenimport"] == "import-error"


def test_run_sample():
    out = cli("run", "--sample", "--repeat", "3", "--providers", "cpu").stdout
    assert "probabilities" in out and "latency: median" in out
    # the sample's 10 nodes minus its BatchNormalization, folded into the Conv at the default level
    assert "CPUExecutionProvider: 7 node(s)" in out  # 9 nodes; two Conv+Relu pairs become FusedConv


def test_run_with_inputs_and_save(tmp_path):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    m = make_model([helper.make_node("Identity", ["x"], ["y"])], {"x": x}, ["y"])
    onnx.save(m, tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", x)
    cli("run", str(tmp_path / "m.onnx"), "--input", f"x={tmp_path / 'x.npy'}", "--save", str(tmp_path))
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), x)


def test_partition_table_and_json():
    out = cli("partition", "sample", "--providers", "cpu").stdout
    assert "conv1" in out and "CPUExecutionProvider" in out
    d = json.loads(cli("partition", "--sample", "--json", "--providers", "cpu").stdout)
    # 10 nodes: BatchNormalization folded into its Conv, two Conv+Relu pairs -> FusedConv
    assert len(d["nodes"]) == 7 and d["copies"] == []


def test_partition_with_fixture_device_shows_declines():
    out = cli("partition", "--sample", "--providers", "fakegpu,cpu", env_extra={"PYTHONPATH": str(SITE)}).stdout
    assert "FakeGpuExecutionProvider" in out and "not supported by the fake device" in out
    assert "copies:" in out


def test_errors_are_reported_not_tracebacks(tmp_path):
    proc = cli("run", str(tmp_path / "missing.onnx"), check=False)
    assert proc.returncode == 2
    # ModelFileNotFoundError is a ModelLoadError (and onnxruntime's NoSuchFile)
    assert "ModelFileNotFoundError" in proc.stderr and "missing.onnx" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = cli("run", "--sample", "--strict", "--providers", "nosuch,cpu", check=False)
    assert proc.returncode == 2 and "FallbackRefusedError" in proc.stderr


def _gelu_mlp(tmp_path):
    """MatMul -> Add -> erf-form Gelu -> MatMul: fuses into onnxruntime contrib ops."""
    rng = np.random.default_rng(3)
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w1"], ["h"]), n("Add", ["h", "b1"], ["hb"]),
             n("Div", ["hb", "sqrt2"], ["d"]), n("Erf", ["d"], ["e"]), n("Add", ["e", "one"], ["e1"]),
             n("Mul", ["hb", "e1"], ["m"]), n("Mul", ["m", "half"], ["g"]), n("MatMul", ["g", "w2"], ["y"])]
    f = np.float32
    inits = {"w1": rng.standard_normal((16, 32)).astype(f), "b1": rng.standard_normal(32).astype(f),
             "sqrt2": np.array(np.sqrt(2.0), f), "one": np.array(1.0, f), "half": np.array(0.5, f),
             "w2": rng.standard_normal((32, 8)).astype(f)}
    x = rng.standard_normal((2, 5, 16)).astype(f)
    path = tmp_path / "mlp.onnx"
    onnx.save(make_model(nodes, {"x": x}, ["y"], initializers=inits), str(path))
    return path, {"x": x}


@pytest.mark.parametrize("model", ["sample", "gelu_mlp"])
def test_optimize_writes_a_model_both_runtimes_run(model, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    import runtime_core as rt

    if model == "sample":
        src = Path(rt.__file__).parent / "samples" / "sample_cnn.onnx"
        feeds = {"image": np.random.default_rng(0).standard_normal((2, 1, 28, 28)).astype(np.float32)}
    else:
        src, feeds = _gelu_mlp(tmp_path)
    dst = tmp_path / "optimized.onnx"
    out = cli("optimize", str(src), str(dst), "--level", "all").stdout
    before, after = len(onnx.load(str(src)).graph.node), len(onnx.load(str(dst)).graph.node)
    assert after < before and f"{before} nodes" in out and f"{after} nodes" in out
    if model == "gelu_mlp":
        assert "com.microsoft::BiasGelu" in out and "onnxruntime loads this model too" in out
    else:
        assert "com.microsoft::FusedConv" in out and "onnxruntime loads this model too" in out
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    theirs = ort.InferenceSession(str(dst), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    ours = rt.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b, c in zip(ref, theirs, ours):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(c, a, rtol=1e-4, atol=1e-5)
