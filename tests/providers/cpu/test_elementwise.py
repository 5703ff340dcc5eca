"""CPU kernels, elementwise family: each case runs on runtime-core and on the oracle
(onnxruntime, or onnx.reference where ORT cannot run it) and the outputs are compared."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

import runtime_core as rt
from oracle import assert_close, check_node, make_model, np_to_elem, run_oracle, run_ours
from runtime_core.errors import InvalidModelError, PartitionError

RNG = np.random.default_rng(1234)
F32, F64, F16 = np.float32, np.float64, np.float16
BF16 = ml_dtypes.bfloat16


def rand(shape, dtype=F32, lo=-3.0, hi=3.0):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return RNG.random(shape) > 0.5
    if dtype.kind in "iu":
        lo_i = max(int(lo), int(np.iinfo(dtype).min))
        return RNG.integers(lo_i, int(hi) + 1, size=shape).astype(dtype)
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


def tol(dtype):
    dtype = np.dtype(dtype)
    if dtype == F16:
        return dict(rtol=3e-3, atol=3e-3)
    if dtype == np.dtype(BF16):
        return dict(rtol=2e-2, atol=2e-2)
    if dtype == F64:
        return dict(rtol=1e-7, atol=1e-9)
    return dict(rtol=2e-5, atol=2e-6)


def run_model(model, feeds, **tolerance):
    """Run a ready model on both sides (for multi-node or hand-typed models)."""
    ours, sess = run_ours(model, dict(feeds))
    assert all(n.provider == "CPUExecutionProvider" for n in sess.get_partition_report().nodes)
    ref = run_oracle(model, dict(feeds))
    assert_close(ours, ref, **tolerance)
    return ours


def typed_model(node, inputs, out_dtype, out_shape, opset):
    """A one-node model whose output type is given (old opsets have no shape inference)."""
    ins = [helper.make_tensor_value_info(n, np_to_elem(a.dtype), list(a.shape)) for n, a in inputs.items()]
    out = helper.make_tensor_value_info(node.output[0], np_to_elem(np.dtype(out_dtype)), list(out_shape))
    m = helper.make_model(helper.make_graph([node], "g", ins, [out]), opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def run_typed(node, inputs, out_dtype, out_shape, opset):
    return run_ours(typed_model(node, inputs, out_dtype, out_shape, opset), dict(inputs))[0]


def session(node, inputs, opset, **kw):
    model = make_model([node], inputs, list(node.output), opset=opset, **kw)
    return rt.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


# -- unary math ------------------------------------------------------------------------

UNARY = {  # op -> (input range, first opset it exists at)
    "Abs": ((-3, 3), 1), "Neg": ((-3, 3), 1), "Exp": ((-3, 3), 1), "Log": ((0.1, 5), 1),
    "Sqrt": ((0, 5), 1), "Reciprocal": ((0.5, 3), 1), "Floor": ((-3, 3), 1), "Ceil": ((-3, 3), 1),
    "Round": ((-3, 3), 11), "Sign": ((-3, 3), 9), "Sin": ((-3, 3), 7), "Cos": ((-3, 3), 7),
    "Tan": ((-1.2, 1.2), 7), "Asin": ((-0.99, 0.99), 7), "Acos": ((-0.99, 0.99), 7),
    "Atan": ((-3, 3), 7), "Sinh": ((-3, 3), 9), "Cosh": ((-3, 3), 9), "Asinh": ((-3, 3), 9),
    "Acosh": ((1, 5), 9), "Atanh": ((-0.95, 0.95), 9), "Erf": ((-3, 3), 9), "Tanh": ((-3, 3), 1),
}


@pytest.mark.parametrize("opset", [6, 13, 22])
@pytest.mark.parametrize("dtype", [F32, F64, F16])
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_float(op, dtype, opset):
    (lo, hi), since = UNARY[op]
    if opset < since:
        pytest.skip(f"{op} does not exist at opset {opset}")
    x = rand((3, 4, 5), dtype, lo, hi)
    if op == "Round":  # exact halves round to even
        x.reshape(-1)[:6] = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5], dtype)
    check_node(op, {"x": x}, opset=opset, **tol(dtype))


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
@pytest.mark.parametrize("op", ["Abs", "Neg", "Sign"])
def test_unary_int(op, dtype):
    x = rand((4, 5), dtype, -100, 100)
    x.reshape(-1)[0] = np.iinfo(dtype).min  # wraps like C
    check_node(op, {"x": x}, opset=13)


def test_unary_special_values_and_unsigned():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30], F32)
    for op in ("Abs", "Neg", "Floor", "Sign", "Exp", "Sqrt", "Log"):
        check_node(op, {"x": x}, opset=13)
    u = rand((6,), np.uint8, 0, 255)
    check_node("Abs", {"x": u}, opset=13)
    check_node("Sign", {"x": u}, opset=13)


def test_unary_scalar_and_empty():
    check_node("Exp", {"x": np.array(0.5, F32)}, opset=13)
    check_node("Sin", {"x": np.zeros((0, 3), F32)}, opset=13)


def test_unary_opset1_consumed_inputs():
    x = rand((3, 4))
    ours = check_node("Relu", {"x": x}, opset=6)
    node = helper.make_node("Relu", ["x"], ["y"], consumed_inputs=[0])
    got = run_typed(node, {"x": x}, F32, x.shape, 1)
    np.testing.assert_array_equal(got[0], ours[0])


@pytest.mark.parametrize("opset", [9, 13, 20])
def test_isnan_isinf(opset):
    x = np.array([[0.0, np.nan, np.inf], [-np.inf, 1.5, -0.0]], F32)
    check_node("IsNaN", {"x": x}, opset=opset)
    check_node("IsNaN", {"x": x.astype(F64)}, opset=opset)
    if opset >= 10:
        for neg, pos in ((1, 1), (1, 0), (0, 1), (0, 0)):
            check_node("IsInf", {"x": x}, opset=opset, detect_negative=neg, detect_positive=pos)
    if opset >= 20:
        check_node("IsInf", {"x": x.astype(F16)}, opset=opset)


@pytest.mark.parametrize("opset", [1, 13])
def test_not(opset):
    check_node("Not", {"x": rand((3, 4), np.bool_)}, opset=opset)


# -- activations -----------------------------------------------------------------------

ACTIVATIONS = [  # op, attrs, first opset
    ("Relu", {}, 1), ("LeakyRelu", {}, 1), ("LeakyRelu", {"alpha": 0.2}, 1), ("Elu", {}, 1),
    ("Elu", {"alpha": 0.5}, 1), ("Selu", {}, 1), ("Selu", {"alpha": 1.5, "gamma": 2.0}, 1),
    ("Celu", {}, 12), ("Celu", {"alpha": 2.0}, 12), ("Sigmoid", {}, 1), ("HardSigmoid", {}, 1),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, 1), ("HardSwish", {}, 14), ("Softplus", {}, 1),
    ("Softsign", {}, 1), ("Tanh", {}, 1), ("Gelu", {}, 20), ("Gelu", {"approximate": "tanh"}, 20),
    ("Mish", {}, 18), ("ThresholdedRelu", {}, 10), ("ThresholdedRelu", {"alpha": 0.5}, 10),
    ("Shrink", {}, 9), ("Shrink", {"bias": 0.5, "lambd": 1.0}, 9), ("Swish", {}, 24),
    ("Swish", {"alpha": 0.7}, 24),
]


@pytest.mark.parametrize("opset", [6, 13, 17, 22, 24])
@pytest.mark.parametrize("dtype", [F32, F64, F16])
@pytest.mark.parametrize("op,attrs,since", ACTIVATIONS,  # ORT evaluates some float64 formulas in float32
                         ids=[f"{o}-{'-'.join(f'{k}{v}' for k, v in a.items())}" for o, a, _ in ACTIVATIONS])
def test_activation(op, attrs, since, dtype, opset):
    if opset < since:
        pytest.skip(f"{op} does not exist at opset {opset}")
    if op == "Celu" and dtype != F32 and opset < 28:
        pytest.skip("Celu before opset 28 is float32 only")
    x = rand((2, 3, 8), dtype, -5, 5)
    x.reshape(-1)[:3] = np.array([0.0, attrs.get("alpha", 1.0), -attrs.get("lambd", 0.5)], dtype)
    check_node(op, {"x": x}, opset=opset, **tol(F32 if dtype == F64 else dtype), **attrs)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_relu_int_and_shrink_int(dtype):
    x = rand((3, 5), dtype, -50, 50)
    check_node("Relu", {"x": x}, opset=14)
    check_node("Shrink", {"x": x}, opset=9, lambd=1.5, bias=1.0)


@pytest.mark.parametrize("op", ["Relu", "LeakyRelu", "Elu", "Selu", "Sigmoid", "HardSigmoid", "HardSwish", "Softplus",
                                "Softsign", "ThresholdedRelu", "Mish", "Celu", "Shrink", "Sign", "Round", "Abs"])
def test_nan_propagation(op):
    check_node(op, {"x": np.array([np.nan, 1.0, -1.0, 5.0, -0.0], F32)}, opset=22)


def test_nan_clip_max_min():
    x = np.array([np.nan, 1.0, -1.0, 5.0], F32)
    check_node("Clip", {"x": x}, initializers={"lo": np.float32(0), "hi": np.float32(2)}, opset=13)
    check_node("Clip", {"x": x}, opset=6, min=0.0, max=2.0)
    for op in ("Max", "Min"):
        check_node(op, {"a": x, "b": np.array([0, np.nan, 0, 0], F32)}, opset=13)


def test_bfloat16_exact_ops():
    """bfloat16 (onnx.reference is the oracle): ops whose result is one rounding are bit-exact."""
    c = np.array([[0.5, 1.0, -1.0, 5.0], [0.25, 2, 3, -2]], F32).astype(BF16)
    special = np.array([[np.nan, 1.0, -1.0, 5.0], [np.inf, 2, 3, -np.inf]], F32).astype(BF16)
    check_node("IsNaN", {"x": special}, opset=13)
    check_node("IsInf", {"x": special}, opset=20)
    for op in ("Relu", "Abs", "Neg", "Floor", "Sqrt"):
        check_node(op, {"x": np.abs(c) if op == "Sqrt" else c}, opset=14)
    for op in ("Div", "Max", "Min", "Equal", "Less"):
        check_node(op, {"a": c, "b": c[0]}, opset=13)
    check_node("Where", {"w": np.array([True, False, True, True]), "a": c, "b": c[0]}, opset=16)
    check_node("Clip", {"x": c}, initializers={"lo": np.array(0, BF16)}, opset=13)
    check_node("Pow", {"a": c, "b": np.array(2.0, F32)}, opset=15)
    check_node("Mod", {"a": c, "b": c[0]}, opset=13, fmod=1)


def test_activation_extremes():
    x = np.array([-1000.0, -80.0, -20.0, 0.0, 20.0, 80.0, 1000.0, np.inf, -np.inf], F32)
    for op in ("Sigmoid", "Softplus", "Tanh", "Softsign", "Elu", "Selu", "HardSwish", "Mish"):
        check_node(op, {"x": x}, opset=18)


@pytest.mark.parametrize("opset", [7, 9, 16])
@pytest.mark.parametrize("slope_shape", [(1,), (5,), (4, 1), (3, 4, 5)])
def test_prelu(slope_shape, opset):
    x = rand((3, 4, 5))
    check_node("PRelu", {"x": x, "slope": rand(slope_shape, F32, 0, 1)}, opset=opset)


@pytest.mark.parametrize("dtype", [F64, np.int32, np.int64])
def test_prelu_dtypes(dtype):
    x = rand((3, 4), dtype, -10, 10)
    check_node("PRelu", {"x": x, "slope": rand((4,), dtype, 0, 3)}, opset=9)


# -- Clip -------------------------------------------------------------------------------

@pytest.mark.parametrize("attrs", [{}, {"min": -0.5}, {"max": 0.5}, {"min": -1.0, "max": 1.0}])
def test_clip_6(attrs):
    x = rand((3, 4, 5))
    check_node("Clip", {"x": x}, opset=6, **attrs)
    check_node("Clip", {"x": x.astype(F16)}, opset=6, **tol(F16), **attrs)


def test_clip_1():
    x = rand((3, 4))
    node = helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=1.0)
    got = run_typed(node, {"x": x}, F32, x.shape, 1)
    ref = check_node("Clip", {"x": x}, opset=6, min=-0.5, max=1.0)
    np.testing.assert_array_equal(got[0], ref[0])


@pytest.mark.parametrize("opset", [11, 12, 13])
@pytest.mark.parametrize("bounds", ["both", "min", "max", "none", "inverted"])
@pytest.mark.parametrize("dtype", [F32, F64, np.int32, np.int64, np.uint8])
def test_clip_inputs(dtype, bounds, opset):
    if np.dtype(dtype).kind in "iu" and opset < 12:
        pytest.skip("integer Clip from opset 12")
    x = rand((4, 5), dtype, 0 if dtype == np.uint8 else -10, 10)
    lo, hi = {"both": (-2, 3), "min": (-2, None), "max": (None, 3), "none": (None, None),
              "inverted": (3, -2)}[bounds]
    if dtype == np.uint8 and lo is not None:
        lo, hi = (2, hi if hi is None else 7) if bounds != "inverted" else (7, 2)
    inits = {}
    names = ["x", "", ""]
    if lo is not None:
        inits["lo"] = np.array(lo, dtype)
        names[1] = "lo"
    if hi is not None:
        inits["hi"] = np.array(hi, dtype)
        names[2] = "hi"
    while names and not names[-1]:
        names.pop()
    node = helper.make_node("Clip", names, ["y"])
    model = make_model([node], {"x": x}, ["y"], opset=opset, initializers=inits)
    run_model(model, {"x": x})


def test_clip_runtime_bounds():
    x = rand((2, 6))
    check_node("Clip", {"x": x, "lo": np.array(-1.0, F32), "hi": np.array(0.5, F32)}, opset=13)


# -- binary arithmetic ---------------------------------------------------------------------

SHAPES = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 3, 4), (3, 1)), ((1, 4), (3, 1)), ((3, 4), ()),
          ((), (2, 3)), ((0, 4), (4,))]


@pytest.mark.parametrize("opset", [7, 13, 14])
@pytest.mark.parametrize("shapes", SHAPES, ids=[f"{a}x{b}" for a, b in SHAPES])
@pytest.mark.parametrize("dtype", [F32, F64, F16, np.int32, np.int64])
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_arith(op, dtype, shapes, opset):
    a = rand(shapes[0], dtype, -20, 20)
    b = rand(shapes[1], dtype, -20, 20)
    if op == "Div":
        b = np.where(b == 0, np.ones_like(b), b)
    check_node(op, {"a": a, "b": b}, opset=opset, **tol(dtype))


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32])
def test_int_div_truncates_and_arith_wraps(dtype):
    a = rand((40,), dtype, -100, 100)
    b = rand((40,), dtype, -9, 9)
    b[b == 0] = 3
    check_node("Div", {"a": a, "b": b}, opset=14)
    big = np.array([np.iinfo(dtype).max] * 3, dtype)
    check_node("Add", {"a": big, "b": np.array([1, 2, 3], dtype)}, opset=14)
    check_node("Mul", {"a": big, "b": np.array([2, 3, 5], dtype)}, opset=14)


def test_arith_float_special():
    a = np.array([1.0, -1.0, 0.0, np.inf, np.nan, 0.0], F32)
    b = np.array([0.0, 0.0, 0.0, np.inf, 1.0, -np.inf], F32)
    for op in ("Add", "Sub", "Mul", "Div"):
        check_node(op, {"a": a, "b": b}, opset=14)


def test_arith_bfloat16_reference():
    a = rand((3, 4), F32).astype(BF16)
    b = rand((4,), F32).astype(BF16)
    for op in ("Add", "Mul", "Sub"):
        check_node(op, {"a": a, "b": b}, opset=14, **tol(BF16))


LEGACY = [((2, 3, 4, 5), (), None), ((2, 3, 4, 5), (1, 1), None), ((2, 3, 4, 5), (5,), None),
          ((2, 3, 4, 5), (4, 5), None), ((2, 3, 4, 5), (3, 4), 1), ((2, 3, 4, 5), (2,), 0),
          ((2, 3, 4, 5), (2, 3, 4, 5), None)]


@pytest.mark.parametrize("opset", [1, 6])
@pytest.mark.parametrize("case", LEGACY, ids=[f"{a}-{b}-axis{ax}" for a, b, ax in LEGACY])
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "Greater", "And"])
def test_legacy_broadcast(op, case, opset):
    """opset < 7 broadcast/axis rule: compared with the same op at opset 7 on B reshaped by hand."""
    ashape, bshape, axis = case
    dt = np.bool_ if op == "And" else F32
    a = rand(ashape, dt, 0.5, 3)
    b = rand(bshape, dt, 0.5, 3)
    if op in ("Equal",):
        a, b = np.round(a).astype(np.int32), np.round(b).astype(np.int32)
    if op in ("Pow", "Equal", "Less", "Greater", "And") and opset == 6:
        pytest.skip(f"{op} has no opset-6 version (opset 6 uses {op}-1)")
    attrs = {"broadcast": 1} if bshape != ashape else {}
    if axis is not None:
        attrs["axis"] = axis
    node = helper.make_node(op, ["a", "b"], ["y"], **attrs)
    out_dt = np.bool_ if op in ("Equal", "Less", "Greater", "And") else a.dtype
    ours = run_typed(node, {"a": a, "b": b}, out_dt, ashape, opset)
    start = len(ashape) - len(bshape) if axis is None else axis
    b7 = b.reshape(()) if b.size == 1 else b.reshape(bshape + (1,) * (len(ashape) - start - len(bshape)))
    ref = check_node(op, {"a": a, "b": b7}, opset=7)
    assert_close(ours, ref)


def test_legacy_broadcast_0_needs_equal_shapes():
    a, b = rand((2, 3)), rand((3,))
    node = helper.make_node("Add", ["a", "b"], ["y"])
    sess = session(node, {"a": a, "b": b}, 6)
    with pytest.raises(rt.errors.ExecutionError, match="broadcast=0"):
        sess.run(None, {"a": a, "b": b})


POW_TYPES = [(F32, F32), (F64, F64), (F32, np.int64), (F32, np.int32), (F64, F32), (np.int32, np.int32),
             (np.int64, np.int64), (np.int64, F32), (np.int32, F64), (F16, F16), (F16, F32)]


@pytest.mark.parametrize("opset", [12, 13, 15])
@pytest.mark.parametrize("types", POW_TYPES, ids=[f"{np.dtype(a).name}^{np.dtype(b).name}" for a, b in POW_TYPES])
def test_pow(types, opset):
    ta, tb = types
    a = rand((3, 4), ta, 1, 4)
    b = rand((4,), tb, 0, 3)
    check_node("Pow", {"a": a, "b": b}, opset=opset, **tol(ta))


def test_pow_7_and_negative_float_base():
    a = rand((3, 4), F32, -3, 3)
    b = np.array([2.0, 3.0, 0.0, 0.5], F32)
    check_node("Pow", {"a": a, "b": b}, opset=7)
    check_node("Pow", {"a": np.array([2, -2, 3, 1], np.int64), "b": np.array([-1, 0, 2, -3], np.int64)},
               opset=15)


@pytest.mark.parametrize("opset", [10, 13])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint16, np.uint64])
@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_int(fmod, dtype, opset):
    signed = np.dtype(dtype).kind == "i"
    a = rand((5, 6), dtype, -20 if signed else 0, 20)
    b = rand((6,), dtype, -7 if signed else 1, 7)
    b[b == 0] = 3
    check_node("Mod", {"a": a, "b": b}, opset=opset, fmod=fmod)


@pytest.mark.parametrize("opset", [10, 13])
@pytest.mark.parametrize("dtype", [F32, F64, F16])
def test_mod_float_fmod(dtype, opset):
    a = rand((5, 6), dtype, -20, 20)
    b = rand((5, 1), dtype, -7, 7)
    check_node("Mod", {"a": a, "b": b}, opset=opset, fmod=1, **tol(dtype))


@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_28_float(fmod):
    a = np.array([5.5, -5.5, 5.5, -5.5, 0.0, -0.0, 3.0, -3.0, 7.25], F32)
    b = np.array([2.0, 2.0, -2.0, -2.0, 3.0, -3.0, np.inf, np.inf, 0.5], F32)
    check_node("Mod", {"a": a, "b": b}, opset=28, fmod=fmod)
    check_node("Mod", {"a": np.array([7, -7, 7, -7], np.int32), "b": np.array([3, 3, -3, -3], np.int32)},
               opset=28, fmod=fmod)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_bitshift_unsigned(dtype, direction):
    bits = np.dtype(dtype).itemsize * 8
    x = rand((4, 5), dtype, 0, 200)
    y = rand((5,), dtype, 0, bits - 1)
    check_node("BitShift", {"x": x, "s": y}, opset=11, direction=direction)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8])
def test_bitshift_28_signed_and_out_of_range(dtype, direction):
    bits = np.dtype(dtype).itemsize * 8
    signed = np.dtype(dtype).kind == "i"
    x = np.array([5, -5, 1, -1, 7, -128, 3, -3] if signed else [5, 250, 1, 255, 7, 128, 3, 9], dtype)
    y = np.array([1, 1, bits - 1, bits - 1, bits, bits, 0, -1 if signed else bits + 1], dtype)
    check_node("BitShift", {"x": x, "s": y}, opset=28, direction=direction)


# -- logic, bitwise, comparisons ---------------------------------------------------------------

@pytest.mark.parametrize("shapes", SHAPES[:5], ids=[f"{a}x{b}" for a, b in SHAPES[:5]])
@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(op, shapes):
    check_node(op, {"a": rand(shapes[0], np.bool_), "b": rand(shapes[1], np.bool_)}, opset=7)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint64])
@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"])
def test_bitwise(op, dtype):
    lo = 0 if np.dtype(dtype).kind == "u" else -100
    ins = {"a": rand((3, 4), dtype, lo, 100)}
    if op != "BitwiseNot":
        ins["b"] = rand((4,), dtype, lo, 100)
    check_node(op, ins, opset=18)


CMP_CASES = [(op, v) for op in ("Equal", "Less", "Greater") for v in (7, 11, 13, 19)] + \
            [(op, v) for op in ("LessOrEqual", "GreaterOrEqual") for v in (12, 16)]


@pytest.mark.parametrize("dtype", [F32, F64, F16, np.int32, np.int64, np.uint8, np.bool_])
@pytest.mark.parametrize("op,opset", CMP_CASES)
def test_compare(op, opset, dtype):
    dt = np.dtype(dtype)
    if dt == np.bool_ and op != "Equal":
        pytest.skip("only Equal takes bool")
    if opset < 11 and op == "Equal" and dt not in (np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.bool_)):
        pytest.skip("Equal-7 takes bool/int32/int64 only")
    if opset < 9 and op in ("Less", "Greater") and dt.kind != "f":
        pytest.skip("Less/Greater-7 take floats only")
    a = rand((3, 4), dtype, -3, 3)
    b = rand((4,), dtype, -3, 3)
    check_node(op, {"a": a, "b": b}, opset=opset)


def test_compare_nan_and_strings():
    a = np.array([np.nan, 1.0, np.inf, -0.0], F32)
    b = np.array([np.nan, np.nan, np.inf, 0.0], F32)
    for op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"):
        check_node(op, {"a": a, "b": b}, opset=16)
    s = np.array([["a", "bc", ""], ["x", "y", "z"]], dtype=object)
    check_node("Equal", {"a": s, "b": np.array(["a", "b", ""], dtype=object)}, opset=19)


@pytest.mark.parametrize("opset", [9, 16])
@pytest.mark.parametrize("dtype", [F32, F64, np.int32, np.int64, np.bool_, np.uint8, object])
def test_where(dtype, opset):
    c = rand((3, 1, 4), np.bool_)
    if dtype is object:
        x = np.array(["a", "b", "c", "d"], dtype=object)
        y = np.array([["p"], ["q"]], dtype=object)
    else:
        x, y = rand((4,), dtype, -5, 5), rand((2, 1), dtype, -5, 5)
    check_node("Where", {"c": c, "a": x, "b": y}, opset=opset)


# -- variadic ---------------------------------------------------------------------------------

@pytest.mark.parametrize("opset", [6, 8, 13])
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("dtype", [F32, F64, F16])
@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
def test_variadic(op, dtype, n, opset):
    # (onnx.reference's Mean adds in place: the first input must have the broadcast shape)
    shapes = [(3, 4)] * n if opset < 8 else [(2, 3, 4), (4,), (3, 1)][:n]
    ins = {f"x{i}": rand(s, dtype) for i, s in enumerate(shapes)}
    check_node(op, ins, opset=opset, **tol(dtype))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.int8])
@pytest.mark.parametrize("op", ["Max", "Min"])
def test_variadic_int(op, dtype):
    ins = {f"x{i}": rand(s, dtype, 0, 100) for i, s in enumerate([(3, 4), (4,), (3, 1)])}
    check_node(op, ins, opset=13)


def test_variadic_opset6_needs_equal_shapes():
    a, b = rand((3, 4)), rand((4,))
    sess = session(helper.make_node("Sum", ["a", "b"], ["y"]), {"a": a, "b": b}, 6)
    with pytest.raises(rt.errors.ExecutionError, match="same shape"):
        sess.run(None, {"a": a, "b": b})


def test_variadic_does_not_modify_inputs():
    a, b, c = rand((3, 4)), rand((3, 4)), rand((3, 4))
    keep = [v.copy() for v in (a, b, c)]
    for op in ("Sum", "Max", "Mean"):
        check_node(op, {"a": a, "b": b, "c": c}, opset=13)
    for v, k in zip((a, b, c), keep):
        np.testing.assert_array_equal(v, k)


# -- Cast / CastLike ----------------------------------------------------------------------------

NUMERIC = [F32, F64, F16, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
           np.uint64, np.bool_]


def cast_input(dtype):
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rand((2, 7), np.bool_)
    if dt.kind == "f":
        x = rand((2, 7), dtype, -100, 100)
        x.reshape(-1)[:4] = np.array([0.0, -0.0, 1.5, -2.5], dtype)
        return x
    lo = 0 if dt.kind == "u" else -120
    return rand((2, 7), dtype, lo, 120)


@pytest.mark.parametrize("opset", [6, 13, 19, 21])
@pytest.mark.parametrize("src", NUMERIC, ids=[np.dtype(d).name for d in NUMERIC])
@pytest.mark.parametrize("dst", NUMERIC, ids=[np.dtype(d).name for d in NUMERIC])
def test_cast_numeric(src, dst, opset):
    x = cast_input(src)
    if np.dtype(src).kind == "f" and np.dtype(dst).kind == "u":
        x = np.abs(x)  # negative floats to unsigned is undefined
    to = helper.np_dtype_to_tensor_dtype(np.dtype(dst))
    check_node("Cast", {"x": x}, opset=opset, to=to)


def test_cast_int_wraps_and_float_overflow():
    x = np.array([200, -200, 70000, -70000, 2**40 + 5], np.int64)
    for to in (TP.INT8, TP.UINT8, TP.INT16, TP.UINT16, TP.INT32, TP.FLOAT16):
        check_node("Cast", {"x": x}, opset=13, to=to)
    f = np.array([1e10, -1e10, 7e4, np.inf, -np.inf, np.nan, 1e-8], F64)
    for to in (TP.FLOAT, TP.FLOAT16, TP.BOOL):
        check_node("Cast", {"x": f}, opset=13, to=to)


def test_cast_1_string_to():
    x = cast_input(F32)
    node = helper.make_node("Cast", ["x"], ["y"], to="INT32")
    got = run_typed(node, {"x": x}, np.int32, x.shape, 1)
    ref = check_node("Cast", {"x": x}, opset=6, to=TP.INT32)
    assert_close(got, ref)


STRINGS = ["1.5", "-2", "1e-5", "1E8", "INF", "-inf", "+INF", "NaN", "nan", "0", " 3", "100.25", "-0"]


@pytest.mark.parametrize("opset", [9, 13, 19, 21])
@pytest.mark.parametrize("to", [TP.FLOAT, TP.DOUBLE, TP.FLOAT16])
def test_cast_from_string_float(to, opset):
    check_node("Cast", {"x": np.array(STRINGS, dtype=object).reshape(1, -1)}, opset=opset, to=to)


@pytest.mark.parametrize("to", [TP.INT8, TP.INT32, TP.INT64, TP.UINT8, TP.UINT64, TP.BOOL])
def test_cast_from_string_int(to):
    s = {TP.INT8: ["1", "-2", "0", "100", "-128", "127"], TP.UINT8: ["1", "0", "100", "255"],
         TP.UINT64: ["0", "7", "18446744073709551615"], TP.BOOL: ["1", "0", "7"]}.get(
        to, ["1", "-2", "0", "100", "-128", "255", "2147483647"])
    check_node("Cast", {"x": np.array(s, dtype=object)}, opset=13, to=to)


def test_cast_from_string_int_out_of_range_wraps():
    # neither oracle defines this: values wrap like a fixed-point cast
    s = np.array(["255", "-129", "256"], dtype=object)
    got = run_ours(make_model([helper.make_node("Cast", ["x"], ["y"], to=TP.INT8)], {"x": s}, ["y"], opset=13),
                   {"x": s})[0][0]
    np.testing.assert_array_equal(got, np.array([255, -129, 256], np.int64).astype(np.int8))


@pytest.mark.parametrize("src", NUMERIC, ids=[np.dtype(d).name for d in NUMERIC])
def test_cast_to_string(src):
    x = cast_input(src)
    if np.dtype(src).kind == "f":
        with np.errstate(over="ignore"):
            x = np.concatenate([x.reshape(-1), np.array([np.nan, np.inf, -np.inf, 1e10, 1e-7, 1 / 3], src)])
    check_node("Cast", {"x": x}, opset=13, to=TP.STRING)


def test_cast_string_to_string_and_castlike_string():
    s = np.array(["a", "bc", "1.5"], dtype=object)
    check_node("Cast", {"x": s}, opset=13, to=TP.STRING)
    check_node("CastLike", {"x": np.array([1.5, 2.0], F32), "like": s}, opset=15)
    check_node("CastLike", {"x": np.array(["1.5", "-2"], dtype=object), "like": np.zeros(1, F64)}, opset=15)


@pytest.mark.parametrize("opset", [15, 19, 21])
@pytest.mark.parametrize("pair", [(F32, np.int32), (np.int64, F32), (F64, F16), (F32, np.bool_), (np.uint8, F64)],
                         ids=lambda p: f"{np.dtype(p[0]).name}-{np.dtype(p[1]).name}" if isinstance(p, tuple) else "")
def test_castlike(pair, opset):
    src, dst = pair
    check_node("CastLike", {"x": np.abs(cast_input(src)), "like": np.zeros((1,), dst)}, opset=opset)


F8 = [(TP.FLOAT8E4M3FN, ml_dtypes.float8_e4m3fn), (TP.FLOAT8E4M3FNUZ, ml_dtypes.float8_e4m3fnuz),
      (TP.FLOAT8E5M2, ml_dtypes.float8_e5m2), (TP.FLOAT8E5M2FNUZ, ml_dtypes.float8_e5m2fnuz)]


def cast_chain(x, to, opset, back=TP.FLOAT, **attrs):
    """x -> Cast(to) -> Cast(back): ORT runs it (its float8/int4 values stay inside the graph)."""
    n1 = helper.make_node("Cast", ["x"], ["m"], to=to, **attrs)
    n2 = helper.make_node("Cast", ["m"], ["y"], to=back)
    return make_model([n1, n2], {"x": x}, ["y"], opset=opset)


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("opset", [19, 21])
@pytest.mark.parametrize("to,np_t", F8, ids=[n for n in ("e4m3fn", "e4m3fnuz", "e5m2", "e5m2fnuz")])
def test_cast_float8_roundtrip(to, np_t, opset, saturate):
    x = np.concatenate([rand((40,), F32, -300, 300), rand((20,), F32, -1, 1),
                        np.array([0.0, 1e5, -1e5, 448.0, 470.0, 500.0, 57344.0, 61000.0, 1e-9], F32)])
    if not saturate:  # keep clear of the NaN/Inf encodings that differ between implementations
        x = np.clip(x, -float(ml_dtypes.finfo(np_t).max), float(ml_dtypes.finfo(np_t).max))
    run_model(cast_chain(x, to, opset, saturate=saturate), {"x": x})
    for src in (F16, F64):
        with np.errstate(over="ignore"):
            xs = x.astype(src)
        if src == F16:
            xs = xs[np.isfinite(xs)]
        run_model(cast_chain(xs, to, opset, saturate=saturate), {"x": xs})


@pytest.mark.parametrize("to,np_t", F8, ids=["e4m3fn", "e4m3fnuz", "e5m2", "e5m2fnuz"])
def test_cast_float8_special_values(to, np_t):
    x = np.array([np.inf, -np.inf, np.nan, 1e6, -1e6, -0.0], F32)
    ours24, _ = run_ours(make_model([helper.make_node("Cast", ["x"], ["y"], to=to)], {"x": x}, ["y"], opset=24),
                         {"x": x})
    ours19, _ = run_ours(make_model([helper.make_node("Cast", ["x"], ["y"], to=to)], {"x": x}, ["y"], opset=19),
                         {"x": x})
    m = float(ml_dtypes.finfo(np_t).max)
    fnuz = "fnuz" in np.dtype(np_t).name
    y24 = ours24[0].astype(F32)
    y19 = ours19[0].astype(F32)
    np.testing.assert_array_equal(y24[[0, 1, 3, 4]], [m, -m, m, -m])  # opset 24: inf saturates
    assert np.isnan(y24[2]) and np.isnan(y19[2])
    if fnuz:  # opset 19-23: +/-inf -> NaN for the fnuz types even when saturating
        assert np.isnan(y19[0]) and np.isnan(y19[1])
        assert not np.signbit(y24[5])
    else:
        np.testing.assert_array_equal(y19[[0, 1]], [m, -m])


@pytest.mark.parametrize("to,np_t", [(TP.INT4, ml_dtypes.int4), (TP.UINT4, ml_dtypes.uint4)], ids=["int4", "uint4"])
def test_cast_int4(to, np_t):
    lo = -8 if to == TP.INT4 else 0
    xi = rand((3, 10), np.int32, lo, lo + 15)
    run_model(cast_chain(xi, to, 21, back=TP.INT32), {"x": xi})
    xf = np.array([0.0, 1.0, 2.4, 2.6, 3.4, 4.7, 5.0, 6.9], F32) * (1 if lo == 0 else -1)
    run_model(cast_chain(xf, to, 21), {"x": xf})
    # the onnx int4 note: round to nearest, ties to even (ORT rounds ties away from zero)
    ties = np.array([0.5, 1.5, 2.5, 3.5], F32) * (1 if lo == 0 else -1)
    got = run_ours(cast_chain(ties, to, 21), {"x": ties})[0][0]
    np.testing.assert_array_equal(got, np.rint(ties))
    v = xi.astype(np_t)
    check_node("Cast", {"x": v}, opset=21, to=TP.FLOAT)
    check_node("Cast", {"x": v}, opset=21, to=TP.INT64)


def test_cast_bfloat16_reference():
    x = rand((3, 5), F32, -100, 100)
    check_node("Cast", {"x": x}, opset=13, to=TP.BFLOAT16)
    check_node("Cast", {"x": x.astype(BF16)}, opset=13, to=TP.FLOAT)
    check_node("Cast", {"x": x.astype(BF16)}, opset=13, to=TP.INT32)


def test_cast_float4():
    x = np.array([0.0, 0.2, 0.3, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 100.0, -100.0, -0.0, -1.25], F32)
    check_node("Cast", {"x": x}, opset=23, to=TP.FLOAT4E2M1)
    check_node("Cast", {"x": x.astype(ml_dtypes.float4_e2m1fn)}, opset=23, to=TP.FLOAT)
    y, _ = run_ours(make_model([helper.make_node("Cast", ["x"], ["y"], to=TP.FLOAT4E2M1)],
                               {"x": np.array([np.nan, np.inf, -np.inf], F32)}, ["y"], opset=23),
                    {"x": np.array([np.nan, np.inf, -np.inf], F32)})
    # +/-inf saturate to +/-6; NaN (no encoding in float4e2m1) becomes -0 as in the onnx 1.23
    # backend test data (test_cast_FLOAT_to_FLOAT4E2M1, generated with ml_dtypes)
    got = y[0].astype(F32)
    np.testing.assert_array_equal(got, [0.0, 6.0, -6.0])
    assert np.signbit(got[0])


# -- declined cases ------------------------------------------------------------------------------

def assert_declined(node, inputs, opset, *reason_parts, **kw):
    with pytest.raises(PartitionError) as ei:
        session(node, inputs, opset, **kw)
    msg = str(ei.value)
    for part in reason_parts:
        assert part in msg, msg


def test_declined_mod_float_fmod0_before_28():
    x = rand((3,))
    assert_declined(helper.make_node("Mod", ["a", "b"], ["y"]), {"a": x, "b": x}, 13,
                    "fmod=0 is defined for integer types only")


def test_declined_cast_float6():
    x = rand((3,))
    assert_declined(helper.make_node("Cast", ["x"], ["y"], to=TP.FLOAT6E2M3), {"x": x}, 28, "float6")


def test_wrong_dtype_for_version_is_refused_at_load():
    # a type the op's schema does not allow is an invalid graph, refused at load as onnxruntime
    # does (InvalidGraph), before any provider is asked
    x = rand((3,), np.int32, -3, 3)
    for op in ("Sqrt", "Relu"):
        with pytest.raises(InvalidModelError, match=f"tensor\\(int32\\).*::{op}-13 accepts"):
            session(helper.make_node(op, ["x"], ["y"]), {"x": x}, 13)
    assert_declined(helper.make_node("Cast", ["x"], ["y"], to=TP.FLOAT8E4M3FN), {"x": rand((3,))}, 13,
                    "Cast-13 cannot produce float8_e4m3fn")


def test_declined_prelu_before_7():
    x = rand((2, 3, 4))
    assert_declined(helper.make_node("PRelu", ["x", "s"], ["y"]), {"x": x, "s": rand((3, 4))}, 6,
                    "PRelu-6 is implemented for a slope of size 1 (shared) or a 1-D slope")


@pytest.mark.parametrize("opset", [1, 6])
def test_prelu_before_7_per_channel_slope(opset):
    x = rand((2, 3, 4, 5))
    s = rand((3,), F32, 0, 1)
    got = run_typed(helper.make_node("PRelu", ["x", "s"], ["y"]), {"x": x, "s": s}, F32, x.shape, opset)
    np.testing.assert_allclose(got[0], np.where(x < 0, x * s.reshape(3, 1, 1), x), rtol=1e-6)


@pytest.mark.parametrize("opset", [1, 6])
def test_prelu_before_7_scalar_slope(opset):
    x = rand((2, 3, 4))
    s = np.array([0.25], F32)
    got = run_typed(helper.make_node("PRelu", ["x", "s"], ["y"]), {"x": x, "s": s}, F32, x.shape, opset)
    assert_close(got, check_node("PRelu", {"x": x, "s": s}, opset=7))


def test_declined_bad_attribute_values():
    x = rand((3,))
    assert_declined(helper.make_node("Gelu", ["x"], ["y"], approximate="fast"), {"x": x}, 20, "approximate")
    u = rand((3,), np.uint8, 0, 9)
    assert_declined(helper.make_node("BitShift", ["x", "s"], ["y"], direction="UP"), {"x": u, "s": u}, 11,
                    "direction")


def test_inputs_are_not_modified():
    x = rand((4, 5))
    x.setflags(write=False)
    for op in ("Relu", "HardSwish", "Softsign", "HardSigmoid", "Gelu", "Abs"):
        check_node(op, {"x": x}, opset=20)
    check_node("Div", {"a": np.arange(1, 7, dtype=np.int32), "b": np.array([2, -2, 3, -3, 4, -4], np.int32)},
               opset=14)


# -- float8e8m0, sub-byte out-of-range, BitCast, legacy size-1 broadcast --------------------------

def _e8m0_expected(x, saturate, round_mode):
    """Hand-written float8e8m0 rule (the float32 exponent, rounded per round_mode; sign ignored)."""
    out = []
    for v in np.asarray(x, F32).ravel().tolist():
        bits = int(np.array(v, F32).view(np.uint32))
        e, frac = (bits >> 23) & 0xFF, bits & 0x7FFFFF
        if e == 0xFF:
            out.append(0xFF if frac or not saturate else 0xFE)
            continue
        if round_mode == "up":
            e += frac != 0
        elif round_mode == "nearest":
            e += bool(frac & 0x400000) and (bool(frac & 0x3FFFFF) or e > 0)
        if not saturate and (bits & 0x7FFFFFFF) == 0:
            e = 0xFF
        out.append(min(e, 0xFE) if saturate else min(e, 0xFF))
    return np.array(out, np.uint8).view(ml_dtypes.float8_e8m0fnu).reshape(np.shape(x))


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [1, 0])
def test_cast_float8e8m0(round_mode, saturate):
    x = np.array([0.0, 0.124, 0.25, 0.5, 1.1, 1.5, 1.75, 2.0, 3.0, 4.0, 8.0, 1e-39, 3e38, np.inf, np.nan,
                  2.0 ** 127 * 1.5, 6e-39], F32)
    node = helper.make_node("Cast", ["x"], ["y"], to=TP.FLOAT8E8M0, saturate=saturate, round_mode=round_mode)
    y, _ = run_ours(make_model([node], {"x": x}, ["y"], opset=24), {"x": x})
    want = _e8m0_expected(x, saturate, round_mode)
    assert y[0].dtype == want.dtype
    np.testing.assert_array_equal(y[0].view(np.uint8), want.view(np.uint8))
    # float16 input: the same values through float32
    xh = x[np.isfinite(x.astype(F16))].astype(F16)
    y, _ = run_ours(make_model([node], {"x": xh}, ["y"], opset=25), {"x": xh})
    np.testing.assert_array_equal(y[0].view(np.uint8), _e8m0_expected(xh.astype(F32), saturate, round_mode)
                                  .view(np.uint8))


@pytest.mark.parametrize("to,np_t", [(TP.INT4, ml_dtypes.int4), (TP.UINT4, ml_dtypes.uint4),
                                     (TP.INT2, ml_dtypes.int2), (TP.UINT2, ml_dtypes.uint2)],
                         ids=["int4", "uint4", "int2", "uint2"])
def test_cast_float_to_subbyte_out_of_range_wraps(to, np_t):
    # onnx's int4/int2 notes: round half to even, then truncate to the type's bits (ml_dtypes 0.7
    # gives 0 there instead; tests/providers/cpu/test_cast_subbyte.py has the full table)
    lo, hi = int(ml_dtypes.iinfo(np_t).min), int(ml_dtypes.iinfo(np_t).max)
    x = np.array([lo - 1, lo, lo + 0.4, hi - 0.5, hi, hi + 1, hi + 7, np.nan, np.inf], F32)
    span = hi - lo + 1
    for src in (F32, F16):
        y, _ = run_ours(make_model([helper.make_node("Cast", ["x"], ["y"], to=to)], {"x": x.astype(src)}, ["y"],
                                   opset=25), {"x": x.astype(src)})
        want = np.array([hi, lo, lo, np.rint(hi - 0.5), hi, lo, (hi + 7 - lo) % span + lo, 0, 0]).astype(np.int8)
        assert y[0].dtype == np.dtype(np_t)
        np.testing.assert_array_equal(y[0].astype(np.int8), want)


@pytest.mark.parametrize("src,dst", [(F32, np.int32), (np.int64, F64), (F16, np.uint16), (BF16, np.int16),
                                     (np.uint8, np.int8), (np.bool_, np.uint8), (np.uint8, np.bool_),
                                     (np.complex64, np.int64), (ml_dtypes.float8_e4m3fn, np.uint8),
                                     (np.int8, ml_dtypes.float8_e5m2)])
def test_bitcast(src, dst):
    if np.dtype(src) == np.bool_:
        x = rand((3, 4), np.bool_)
    elif np.dtype(src).kind == "c":
        x = (rand((3, 4), F32) + 1j * rand((3, 4), F32)).astype(src)
    else:
        x = rand((3, 4), F32, -100, 100).astype(src) if np.dtype(src).kind != "u" else rand((3, 4), src, 0, 200)
    node = helper.make_node("BitCast", ["x"], ["y"], to=np_to_elem(dst))
    y, _ = run_ours(make_model([node], {"x": x}, ["y"], opset=26), {"x": x})
    assert y[0].dtype == np.dtype(dst) and y[0].shape == x.shape
    want = (x.view(np.uint8) != 0) if np.dtype(dst) == np.bool_ else x.view(dst)
    np.testing.assert_array_equal(y[0].view(np.uint8), want.view(np.uint8))


def test_bitcast_subbyte_and_scalar():
    x = np.array([-8, -1, 0, 3, 7], np.int8).astype(ml_dtypes.int4)
    y, _ = run_ours(make_model([helper.make_node("BitCast", ["x"], ["y"], to=TP.UINT4)], {"x": x}, ["y"],
                               opset=26), {"x": x})
    np.testing.assert_array_equal(y[0].astype(np.uint8), [8, 15, 0, 3, 7])
    y, _ = run_ours(make_model([helper.make_node("BitCast", ["x"], ["y"], to=TP.FLOAT4E2M1)], {"x": x}, ["y"],
                               opset=26), {"x": x})
    np.testing.assert_array_equal(y[0].astype(F32), [-0.0, -6.0, 0.0, 1.5, 6.0])
    s = np.array(1.0, F32)
    y, _ = run_ours(make_model([helper.make_node("BitCast", ["x"], ["y"], to=TP.INT32)], {"x": s}, ["y"],
                               opset=26), {"x": s})
    assert y[0].shape == () and int(y[0]) == 0x3F800000


def test_declined_bitcast_width_mismatch():
    assert_declined(helper.make_node("BitCast", ["x"], ["y"], to=TP.INT64), {"x": rand((3,))}, 26,
                    "same bit width", "float32 has 32 bits")


@pytest.mark.parametrize("b_shape,axis", [((2, 1), 0), ((1, 3), 0), ((3,), 1), ((1,), None), ((2, 3, 1), 1)])
def test_legacy_add_size1_expansion(b_shape, axis):
    a = rand((4, 2, 3, 5)) if len(b_shape) == 3 else rand((2, 3))
    b = rand(b_shape)
    kw = {"broadcast": 1} if axis is None else {"broadcast": 1, "axis": axis}
    node = helper.make_node("Add", ["a", "b"], ["y"], **kw)
    y = run_ours(typed_model(node, {"a": a, "b": b}, F32, a.shape, 6), {"a": a, "b": b})[0][0]
    start = a.ndim - b.ndim if axis is None else axis
    np.testing.assert_allclose(y, a + b.reshape(b.shape + (1,) * (a.ndim - start - b.ndim)), rtol=1e-6)


def test_legacy_add_rejects_mismatch():
    a, b = rand((2, 3)), rand((2, 2))
    node = helper.make_node("Add", ["a", "b"], ["y"], broadcast=1, axis=0)
    with pytest.raises(Exception, match="does not match A"):
        run_ours(typed_model(node, {"a": a, "b": b}, F32, a.shape, 6), {"a": a, "b": b})
