"""Each OpenCL kernel against onnxruntime (rtol = atol = 1e-3), one node per model."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from opencl_helpers import check_node, requires_pocl

pytestmark = requires_pocl

rng = np.random.default_rng(42)


def rand(*shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


# -- unary ----------------------------------------------------------------------------

UNARY_CASES = [
    ("Relu", {}, None), ("Sigmoid", {}, None), ("Tanh", {}, None), ("Erf", {}, None),
    ("Exp", {}, None), ("Log", {}, (0.1, 4.0)), ("Sqrt", {}, (0.0, 4.0)), ("Neg", {}, None),
    ("Abs", {}, None), ("LeakyRelu", {"alpha": 0.2}, None), ("HardSwish", {}, (-5.0, 5.0)),
]


@pytest.mark.parametrize("op_type,attrs,bounds", UNARY_CASES, ids=[c[0] for c in UNARY_CASES])
def test_unary(op_type, attrs, bounds):
    lo, hi = bounds or (-3.0, 3.0)
    check_node(op_type, {"x": rand(3, 5, 7, lo=lo, hi=hi)}, **attrs)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate):
    check_node("Gelu", {"x": rand(4, 33)}, opset=20, approximate=approximate)


def test_clip_attributes_opset6():
    check_node("Clip", {"x": rand(2, 50)}, opset=6, min=-0.5, max=0.75)


@pytest.mark.parametrize("lo,hi", [(-0.5, 0.5), (None, 0.25), (-0.25, None), (None, None)])
def test_clip_inputs(lo, hi):
    inits, names = {}, ["x"]
    for name, v in (("lo", lo), ("hi", hi)):
        if v is None:
            names.append("")
        else:
            inits[name] = np.array(v, np.float32)
            names.append(name)
    while names[-1] == "":
        names.pop()
    check_node("Clip", {"x": rand(3, 40)}, initializers=inits, node_inputs=names, opset=13)


# -- broadcasting ---------------------------------------------------------------------

SHAPES = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 3, 4), (3, 1)), ((1,), (2, 3)), ((), (2, 3)),
          ((2, 1, 4), (1, 3, 1)), ((5, 1, 1, 6), (1, 7, 2, 1)), ((130,), (130,))]


@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("sa,sb", SHAPES, ids=[f"{a}x{b}" for a, b in SHAPES])
def test_binary_broadcast(op_type, sa, sb):
    b = rand(*sb)
    if op_type == "Div":
        b = np.where(np.abs(b) < 0.1, 0.5, b).astype(np.float32)
    check_node(op_type, {"a": rand(*sa), "b": b}, node_inputs=["a", "b"])


def test_pow():
    check_node("Pow", {"a": rand(3, 4, lo=0.1, hi=3.0), "b": rand(4, lo=-2.0, hi=2.0)})


@pytest.mark.parametrize("op_type", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
def test_comparisons(op_type):
    a = np.round(rand(4, 5)).astype(np.float32)
    b = np.round(rand(5)).astype(np.float32)
    out, _ = check_node(op_type, {"a": a, "b": b})
    assert out[0].dtype == np.bool_


def test_where_broadcast():
    cond = rng.random((3, 1, 5)) > 0.5
    check_node("Where", {"c": cond, "p": rand(4, 5), "q": rand(3, 4, 1)})


def test_constant_initializer_operand():
    check_node("Add", {"x": rand(2, 3, 8)}, initializers={"b": rand(8)})


# -- MatMul / Gemm --------------------------------------------------------------------

MATMUL = [((3, 4), (4, 5)), ((17, 33), (33, 19)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (3, 4, 6)),
          ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((2, 5, 20), (2, 20, 3)), ((1, 40), (40, 1))]


@pytest.mark.parametrize("sa,sb", MATMUL, ids=[f"{a}@{b}" for a, b in MATMUL])
def test_matmul(sa, sb):
    check_node("MatMul", {"a": rand(*sa), "b": rand(*sb)})


@pytest.mark.parametrize("ta", [0, 1])
@pytest.mark.parametrize("tb", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (), (7,), (5, 1), (5, 7)])
def test_gemm(ta, tb, c_shape):
    m, k, n = 5, 19, 7
    a = rand(*((k, m) if ta else (m, k)))
    b = rand(*((n, k) if tb else (k, n)))
    inputs = {"a": a, "b": b}
    if c_shape is not None:
        inputs["c"] = rand(*c_shape)
    check_node("Gemm", inputs, opset=13, alpha=0.5, beta=2.0, transA=ta, transB=tb)


def test_gemm_constant_weights_opset11():
    check_node("Gemm", {"x": rand(6, 10)}, initializers={"w": rand(4, 10), "bias": rand(4)},
               opset=11, transB=1)


# -- Softmax / LayerNormalization -----------------------------------------------------

@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset,axis", [(13, -1), (13, 1), (13, 0), (11, 1), (11, 2)])
def test_softmax(op_type, opset, axis):
    check_node(op_type, {"x": rand(3, 4, 5, lo=-5, hi=5)}, opset=opset, axis=axis)


@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layernorm(axis, with_bias):
    x = rand(2, 6, 10)
    norm = x.shape[axis:]
    inits = {"s": rand(*norm)}
    if with_bias:
        inits["b"] = rand(*norm)
    check_node("LayerNormalization", {"x": x}, initializers=inits, axis=axis, epsilon=1e-5)


def test_layernorm_mean_and_invstd_outputs():
    check_node("LayerNormalization", {"x": rand(4, 12)}, initializers={"s": rand(12), "b": rand(12)},
               outputs=("y", "mean", "inv"), axis=-1)


# -- Conv -----------------------------------------------------------------------------

CONV = [
    dict(x=(1, 3, 9, 9), w=(4, 3, 3, 3), pads=[1, 1, 1, 1]),
    dict(x=(2, 4, 10, 8), w=(6, 4, 3, 3), strides=[2, 2]),
    dict(x=(1, 2, 11, 11), w=(3, 2, 3, 3), dilations=[2, 2], pads=[2, 1, 0, 2]),
    dict(x=(1, 4, 7, 7), w=(6, 2, 3, 3), group=2, pads=[1, 1, 1, 1]),
    dict(x=(2, 8, 8, 8), w=(8, 1, 3, 3), group=8, pads=[1, 1, 1, 1], strides=[2, 2]),
    dict(x=(1, 3, 8, 7), w=(5, 3, 3, 2), auto_pad="SAME_UPPER", strides=[2, 2]),
    dict(x=(1, 3, 8, 7), w=(5, 3, 2, 3), auto_pad="SAME_LOWER"),
    dict(x=(1, 3, 8, 7), w=(5, 3, 3, 3), auto_pad="VALID"),
    dict(x=(2, 3, 6, 6), w=(4, 3, 1, 1), bias=False),
    dict(x=(2, 3, 20), w=(4, 3, 5), pads=[2, 1], strides=[2]),
]


@pytest.mark.parametrize("case", CONV, ids=[str(i) for i in range(len(CONV))])
def test_conv(case):
    case = dict(case)
    x, w = rand(*case.pop("x")), rand(*case.pop("w"))
    inits = {"w": w}
    if case.pop("bias", True):
        inits["b"] = rand(w.shape[0])
    check_node("Conv", {"x": x}, initializers=inits, **case)


# -- layout ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape,perm", [((3, 4), None), ((2, 3, 4), [1, 0, 2]), ((2, 3, 4, 5), [0, 2, 1, 3]),
                                        ((2, 3, 4, 5), [3, 1, 2, 0]), ((1, 6, 1, 4), [2, 3, 0, 1])])
def test_transpose(shape, perm):
    attrs = {} if perm is None else {"perm": perm}
    check_node("Transpose", {"x": rand(*shape)}, **attrs)


def test_transpose_bool():
    check_node("Transpose", {"x": rng.random((3, 4, 5)) > 0.5}, perm=[2, 0, 1])


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    shapes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    for i, s in enumerate(shapes):
        s[axis] = i + 1
    inputs = {f"x{i}": rand(*s) for i, s in enumerate(shapes)}
    check_node("Concat", inputs, axis=axis)


def test_concat_bool_and_repeated_input():
    b = rng.random((2, 3)) > 0.5
    check_node("Concat", {"a": b}, node_inputs=["a", "a"], axis=0)


def test_reshape_with_zero_and_minus_one():
    check_node("Reshape", {"x": rand(2, 3, 4)}, initializers={"s": np.array([0, -1, 2], np.int64)})


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_flatten(axis):
    check_node("Flatten", {"x": rand(2, 3, 4)}, axis=axis)


def test_squeeze_unsqueeze():
    check_node("Squeeze", {"x": rand(1, 3, 1, 4)}, initializers={"axes": np.array([0, 2], np.int64)})
    check_node("Unsqueeze", {"x": rand(3, 4)}, initializers={"axes": np.array([0, -1], np.int64)})
    check_node("Squeeze", {"x": rand(1, 3, 1, 4)}, opset=11, axes=[0])


def test_identity():
    check_node("Identity", {"x": rand(3, 4)})


def test_shape_of_a_device_value_stays_on_device():
    x = rand(2, 3, 4)
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Shape", ["r"], ["s"], name="shape", start=1)]
    from oracle import make_model

    from opencl_helpers import check_model

    model = make_model(nodes, {"x": x}, ["r", "s"], opset=15)
    out, sess = check_model(model, {"x": x})
    assert out[1].tolist() == [3, 4] and out[1].dtype == np.int64
    copies = [(c.value, c.bytes) for c in sess.get_partition_report().copies]
    assert ("s", 16) in copies


def test_bool_input_feeds_where():
    # a bool graph input is copied to the device and read by a kernel
    cond = rng.random((4,)) > 0.5
    check_node("Where", {"c": cond, "p": rand(4), "q": rand(4)})


def test_large_elementwise_uses_many_work_groups():
    check_node("Add", {"a": rand(3, 1000), "b": rand(1000)})


