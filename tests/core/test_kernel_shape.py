"""A convolution's ``kernel_shape`` attribute that disagrees with W's spatial shape is refused.

onnxruntime refuses such a node ("kernel_shape is not compatible with W shape"; a wrong count
of axes already at load); our kernels read W's shape, so running it computed something the
model does not say. With W's shape in the model (an initializer, a declared input) the session
refuses to build; where only the run knows W's shape, the run fails with a typed error and the
session goes on working. onnxruntime is the oracle for the refusals and for the results.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt
from runtime_core.errors import InvalidModelError, RuntimeCoreError

ort = pytest.importorskip("onnxruntime")

F, U8, I8 = TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT8
OPS = ["Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "FusedConv"]


def _weights(op, k):
    rng = np.random.default_rng(0)
    if op == "ConvTranspose":
        return rng.standard_normal([2, 3, k, k]).astype(np.float32)
    if op == "ConvInteger":
        return rng.integers(0, 255, [3, 2, k, k]).astype(np.uint8)
    if op == "QLinearConv":
        return rng.integers(-100, 100, [3, 2, k, k]).astype(np.int8)
    return rng.standard_normal([3, 2, k, k]).astype(np.float32)


def _model(op, kernel_shape, k=3, w_input=None, **attrs):
    """One ``op`` over a [1, 2, 6, 6] input with a k x k W; ``w_input``: W is a graph input of
    that declared shape (None: an initializer)."""
    w = _weights(op, k)
    w_elem = {np.dtype(np.float32): F, np.dtype(np.uint8): U8, np.dtype(np.int8): I8}[w.dtype]
    x_elem = U8 if op in ("ConvInteger", "QLinearConv") else F
    y_elem = {"ConvInteger": TensorProto.INT32, "QLinearConv": U8}.get(op, F)
    vals = {}
    if op == "QLinearConv":
        vals = {"xs": np.array(0.05, np.float32), "xz": np.array(7, np.uint8), "w": w,
                "ws": np.array(0.02, np.float32), "wz": np.array(0, np.int8), "ys": np.array(0.2, np.float32),
                "yz": np.array(9, np.uint8)}
        ins = ["x", *vals]
    else:
        vals = {"w": w}
        ins = ["x", "w"]
    if kernel_shape is not None:
        attrs["kernel_shape"] = kernel_shape
    domain = "com.microsoft" if op == "FusedConv" else ""
    if op == "FusedConv":
        attrs["activation"] = "Relu"
    inputs = [helper.make_tensor_value_info("x", x_elem, [1, 2, 6, 6])]
    if w_input is not None:
        del vals["w"]
        inputs.append(helper.make_tensor_value_info("w", w_elem, w_input))
    g = helper.make_graph([helper.make_node(op, ins, ["y"], domain=domain, **attrs)], "g", inputs,
                          [helper.make_tensor_value_info("y", y_elem, None)],
                          [numpy_helper.from_array(v, n) for n, v in vals.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 9
    x = (np.random.default_rng(1).integers(0, 255, [1, 2, 6, 6]).astype(np.uint8) if x_elem == U8
         else np.random.default_rng(1).standard_normal([1, 2, 6, 6]).astype(np.float32))
    return m.SerializeToString(), x, w


def _ort_refuses(model, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 4
    try:
        ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception as e:  # noqa: BLE001 - the refusal is what is compared
        return str(e)
    return None


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("kernel_shape", [[2, 2], [3, 2], [3]])
def test_refused_at_load_where_w_is_an_initializer(op, kernel_shape):
    model, x, _ = _model(op, kernel_shape)
    why = _ort_refuses(model, {"x": x})
    assert why is not None and "kernel_shape" in why
    with pytest.raises(InvalidModelError, match=rf"\({op}\): attribute 'kernel_shape' .* not compatible with W"):
        rt.InferenceSession(model, providers=["cpu"])


@pytest.mark.parametrize("op", OPS)
def test_refused_at_load_where_w_is_a_declared_input(op):
    w_shape = list(_weights(op, 3).shape)
    model, x, w = _model(op, [2, 2], w_input=w_shape)
    assert _ort_refuses(model, {"x": x, "w": w}) is not None
    with pytest.raises(InvalidModelError, match="kernel_shape"):
        rt.InferenceSession(model, providers=["cpu"])


@pytest.mark.parametrize("op", OPS)
def test_refused_at_run_where_only_the_run_knows_w_and_the_session_goes_on(op):
    model, x, w3 = _model(op, [3, 3], w_input=["m", "c", "kh", "kw"])
    sess = rt.InferenceSession(model, providers=["cpu"])
    w2 = _weights(op, 2)
    assert "kernel_shape" in _ort_refuses(model, {"x": x, "w": w2})
    with pytest.raises(RuntimeCoreError, match="kernel_shape"):
        sess.run(None, {"x": x, "w": w2})
    so = ort.SessionOptions()
    so.log_severity_level = 4
    ref = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, {"x": x, "w": w3})[0]
    ours = sess.run(None, {"x": x, "w": w3})[0]
    np.testing.assert_allclose(ours.astype(np.float64), ref.astype(np.float64), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", OPS)
def test_a_matching_or_absent_kernel_shape_runs_as_onnxruntime_does(op):
    for ks in ([3, 3], None):
        model, x, _ = _model(op, ks)
        so = ort.SessionOptions()
        so.log_severity_level = 4
        ref = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        ours = rt.InferenceSession(model, providers=["cpu"]).run(None, {"x": x})[0]
        tol = 1 if ours.dtype == np.uint8 else 1e-4
        assert np.abs(ours.astype(np.float64) - ref.astype(np.float64)).max() <= tol, (op, ks)


def test_the_fuzzers_conv_is_refused_at_once():
    """The case that ran 9.7 s to a 134 MB output: huge pads and strides, kernel_shape not W's."""
    model, x, _ = _model("Conv", [1, 1], pads=[2**62] * 4, strides=[2**40] * 2)
    assert _ort_refuses(model, {"x": x}) is not None
    with pytest.raises(InvalidModelError, match="kernel_shape"):
        rt.InferenceSession(model, providers=["cpu"])  # at load: nothing computed
