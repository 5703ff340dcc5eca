"""A session's first run imports nothing: Sigmoid's kernels do not load scipy.special (it cost
a first run about 0.1 s), and float64 Erf / Gelu, which need scipy's erf, load it while the
session is built. Sigmoid's compiled and numpy paths agree with onnxruntime at the extremes.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

import runtime_core as rt

F32, F64, F16 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16


def _model(op, elem, opset=20, **attrs):
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "g",
                          [helper.make_tensor_value_info("x", elem, [2, 3])],
                          [helper.make_tensor_value_info("y", elem, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m


CASES = [("Sigmoid", F32), ("Sigmoid", F64), ("Sigmoid", F16), ("Erf", F64), ("Gelu", F64)]


def test_first_run_imports_no_module(tmp_path):
    paths = []
    for op, elem in CASES:
        p = tmp_path / f"{op}_{elem}.onnx"
        p.write_bytes(_model(op, elem).SerializeToString())
        paths.append((str(p), helper.tensor_dtype_to_np_dtype(elem).name))
    code = (
        "import sys, numpy as np, runtime_core as rt\n"
        f"for path, dt in {paths!r}:\n"
        "    s = rt.InferenceSession(path, providers=['cpu'])\n"
        "    before = set(sys.modules)\n"
        "    s.run(None, {'x': np.linspace(-3, 3, 6).reshape(2, 3).astype(dt)})\n"
        "    print(path.rsplit('/', 1)[-1], sorted(set(sys.modules) - before))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == len(CASES), out.stdout
    for line in lines:
        assert line.endswith(" []"), line  # the first run loaded a module


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("elem", [F32, F64, F16])
def test_sigmoid_matches_onnxruntime_at_the_extremes(elem, native, monkeypatch):
    ort = pytest.importorskip("onnxruntime")
    from runtime_provider_cpu.ops import elementwise

    if not native:  # the numpy path (no compiled extension, or RUNTIME_CORE_CPU_NATIVE=0)
        monkeypatch.setattr(elementwise, "_native", None)
    elif elementwise._native is None:
        pytest.skip("the compiled extension is not built")
    dt = helper.tensor_dtype_to_np_dtype(elem)
    vals = np.concatenate([np.linspace(-120, 120, 2401), [-np.inf, np.inf, np.nan, 0.0, -0.0, 1e-30, -1e-30,
                                                         -87.3, -88.8, -103.9, -745.2, 709.8]])
    x = vals.astype(dt).reshape(1, -1)
    m = helper.make_model(helper.make_graph(
        [helper.make_node("Sigmoid", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", elem, list(x.shape))],
        [helper.make_tensor_value_info("y", elem, list(x.shape))]), opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 9
    ours = rt.InferenceSession(m.SerializeToString(), providers=["cpu"]).run(None, {"x": x})[0]
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with np.errstate(over="ignore"):
        exact = 1 / (1 + np.exp(-x.astype(np.float64)))  # 0 where exp(-x) overflows
    assert ours.dtype == dt and ours.shape == x.shape
    assert np.array_equal(np.isnan(ours), np.isnan(x))
    ok = ~np.isnan(x)
    # relative to the exact value, absolute below the dtype's smallest normal number
    rel = {np.dtype(np.float32): 2e-6, np.dtype(np.float64): 1e-14, np.dtype(np.float16): 1e-3}[np.dtype(dt)]
    err = np.abs(ours[ok].astype(np.float64) - exact[ok])
    bound = rel * exact[ok] + np.finfo(dt).tiny
    worst = np.argmax(err / bound)
    assert (err <= bound).all(), (x[ok][worst], ours[ok][worst], exact[ok][worst])
    ref_err = np.abs(ref[ok].astype(np.float64) - exact[ok])
    assert err.max() <= max(ref_err.max(), np.finfo(dt).eps / 2)  # no less accurate than onnxruntime
    assert ((ours[ok] >= 0) & (ours[ok] <= 1)).all()
