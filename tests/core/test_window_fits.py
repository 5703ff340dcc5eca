"""Kernel windows larger than the padded input: refused where onnxruntime refuses them.

Conv, ConvInteger and QLinearConv refuse a window wider than an axis's padded input
("Invalid input shape"), pools an empty non-batch axis or a negative output size, ConvTranspose an
output axis <= 0. With the input's shape in the model the session refuses to build
(InvalidModelError); with a symbolic shape the run fails with a typed error and the session goes on
working. onnxruntime is the oracle for which geometries are refused and for the results of the rest.
"""

from __future__ import annotations


import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt
from runtime_core.errors import InvalidModelError, RuntimeCoreError

ort = pytest.importorskip("onnxruntime")

F = TensorProto.FLOAT
U8 = TensorProto.UINT8


def _model(op, x_shape, k, stride, dil, pads, auto_pad=None, symbolic=False, **extra):
    """One ``op`` node over a [1, 2, H, W] input with a k x k window; ``symbolic``: the input's
    spatial dims are names (only the run knows them)."""
    rng = np.random.default_rng(0)
    attrs = {"strides": [stride] * 2, **extra}
    if dil != 1:
        attrs["dilations"] = [dil] * 2
    if auto_pad:
        attrs["auto_pad"] = auto_pad
    elif pads:
        attrs["pads"] = [pads] * 4
    inits, ins, x_elem, y_elem = [], ["x"], F, F
    if op in ("Conv", "ConvTranspose"):
        w_shape = [3, 2, k, k] if op == "Conv" else [2, 3, k, k]
        inits = [numpy_helper.from_array(rng.standard_normal(w_shape).astype(np.float32), "w")]
        ins.append("w")
    elif op == "ConvInteger":
        inits = [numpy_helper.from_array(rng.integers(0, 255, [3, 2, k, k]).astype(np.uint8), "w")]
        ins.append("w")
        x_elem, y_elem = U8, TensorProto.INT32
    elif op == "QLinearConv":
        vals = {"xs": np.array(0.05, np.float32), "xz": np.array(7, np.uint8),
                "w": rng.integers(-100, 100, [3, 2, k, k]).astype(np.int8), "ws": np.array(0.02, np.float32),
                "wz": np.array(0, np.int8), "ys": np.array(0.2, np.float32), "yz": np.array(9, np.uint8)}
        inits = [numpy_helper.from_array(v, n) for n, v in vals.items()]
        ins += list(vals)
        x_elem = y_elem = U8
    else:
        attrs["kernel_shape"] = [k, k]
    dims = [1, 2, "h", "w"] if symbolic else list(x_shape)
    g = helper.make_graph([helper.make_node(op, ins, ["y"], **attrs)], "g",
                          [helper.make_tensor_value_info("x", x_elem, dims)],
                          [helper.make_tensor_value_info("y", y_elem, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    m.ir_version = 9
    return m.SerializeToString(), x_elem


def _feed(shape, elem):
    rng = np.random.default_rng(1)
    if elem == U8:
        return rng.integers(0, 255, shape).astype(np.uint8)
    return rng.standard_normal(shape).astype(np.float32)


def _ort(model, x):
    so = ort.SessionOptions()
    so.log_severity_level = 4
    try:
        return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    except Exception:  # noqa: BLE001 - a refusal is what is compared
        return None


# (input side, kernel, stride, dilation, pads, auto_pad): fitting, just not fitting, far from fitting
GEOMETRIES = [
    (3, 3, 1, 1, 0, None), (3, 4, 1, 1, 0, None), (3, 5, 2, 1, 0, None), (3, 7, 2, 1, 0, None),
    (3, 9, 3, 1, 0, None), (3, 2, 1, 3, 0, None), (1, 3, 1, 1, 1, None), (1, 4, 1, 1, 1, None),
    (3, 5, 1, 1, 0, "VALID"), (3, 5, 1, 1, 0, "SAME_UPPER"), (0, 1, 1, 1, 0, None),
]


@pytest.mark.parametrize("op", ["Conv", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool"])
def test_refused_where_onnxruntime_refuses(op):
    for side, k, s, d, p, ap in GEOMETRIES:
        if op == "MaxPool" and d != 1 or op in ("AveragePool", "LpPool") and d != 1:
            continue  # dilations: MaxPool only (AveragePool 19 too); kept to the conv family here
        model, elem = _model(op, [1, 2, side, side], k, s, d, p, ap)
        x = _feed([1, 2, side, side], elem)
        ref = _ort(model, x)
        what = f"{op} in={side} k={k} s={s} d={d} pads={p} auto_pad={ap}"
        if ref is None:
            with pytest.raises(InvalidModelError):
                rt.InferenceSession(model, providers=["cpu"])
            continue
        ours = rt.InferenceSession(model, providers=["cpu"]).run(None, {"x": x})[0]
        if op in ("MaxPool", "AveragePool", "LpPool") and side + 2 * p - ((k - 1) * d + 1) < 0:
            # onnxruntime truncates a negative span toward zero (an output of 1 over a window
            # past the input); the ONNX formula floors it: an empty axis. Both run.
            assert ours.size == 0 or ours.shape == ref.shape, what
            continue
        assert ours.shape == ref.shape, what
        if ours.size:
            tol = 1 if ours.dtype == np.uint8 else 1e-4
            assert np.abs(ours.astype(np.float64) - ref.astype(np.float64)).max() <= tol, what


def test_maxpool_dilated_window_runs_to_an_empty_axis_like_onnxruntime():
    model, _ = _model("MaxPool", [1, 2, 3, 3], 2, 1, 3, 0)
    x = _feed([1, 2, 3, 3], F)
    assert rt.InferenceSession(model, providers=["cpu"]).run(None, {"x": x})[0].shape == _ort(model, x).shape


@pytest.mark.parametrize("pads,output_shape", [(2, None), (0, [0, 3]), (0, None)])
def test_conv_transpose_output_axis_must_be_positive(pads, output_shape):
    extra = {"output_shape": output_shape} if output_shape else {}
    side = 0 if pads == 0 and not output_shape else 3
    model, _ = _model("ConvTranspose", [1, 2, side, 3], 1, 1, 1, pads, **extra)
    assert _ort(model, _feed([1, 2, side, 3], F)) is None
    with pytest.raises(InvalidModelError, match="ConvTranspose"):
        rt.InferenceSession(model, providers=["cpu"])


@pytest.mark.parametrize("op", ["Conv", "ConvInteger", "QLinearConv", "MaxPool", "ConvTranspose"])
def test_symbolic_shapes_refused_at_run_and_session_keeps_working(op):
    k, pads = (7, 0) if op != "ConvTranspose" else (1, 3)
    model, elem = _model(op, None, k, 1, 1, pads, symbolic=True)
    sess = rt.InferenceSession(model, providers=["cpu"])
    small, big = _feed([1, 2, 3, 3], elem), _feed([1, 2, 9, 9], elem)
    assert _ort(model, small) is None
    with pytest.raises(RuntimeCoreError):
        sess.run(None, {"x": small})
    ours = sess.run(None, {"x": big})[0]
    ref = _ort(model, big)
    assert ours.shape == ref.shape
    assert np.abs(ours.astype(np.float64) - ref.astype(np.float64)).max() <= (1 if elem == U8 else 1e-3)


def test_reported_names_the_node_and_the_geometry():
    model, _ = _model("QLinearConv", [1, 2, 3, 3], 5, 1, 1, 0)
    with pytest.raises(InvalidModelError, match=r"QLinearConv.*kernel window of axis 0 \(5 wide"):
        rt.InferenceSession(model, providers=["cpu"])
