"""CPU kernels, elementwise family: unary math, activations, Clip and the declined cases;
arithmetic, logic, comparisons and variadic ops are in test_arith.py, Cast and BitCast in test_cast.py.

Each case runs on runtime-core and on the oracle (onnxruntime, or onnx.reference where ORT
cannot run it) and the outputs are compared.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

from oracle import assert_close, check_node, make_model
from runtime_core.errors import InvalidModelError
from providers.cpu.ew_cases import BF16, F16, F32, F64, assert_declined, rand, run_model, run_typed, session, tol


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


@pytest.mark.native
@pytest.mark.parametrize("op,args", [("HardSwish", ()), ("HardSigmoid", (0.3, 0.4))])
def test_hard_activations_compiled_pass_matches_numpy_path(monkeypatch, op, args):
    """float32 HardSwish / HardSigmoid steps run ``_native.activate``; numpy's passes stay for
    other dtypes and without the extension: the two within a rounding, NaN and infinities alike."""
    from runtime_provider_cpu.ops import elementwise as ew

    f = ew._hard_swish if op == "HardSwish" else ew._hard_sigmoid
    x = np.concatenate([rand((2, 37), F32, -8, 8).ravel(), [np.nan, np.inf, -np.inf, 3.0, -3.0, 0.0]]).astype(F32)
    x = x.reshape(1, -1)[:, ::-1]  # not contiguous
    y = f(x, *args)
    assert y.dtype == F32 and y.shape == x.shape
    monkeypatch.setattr(ew, "_native", None)
    np.testing.assert_allclose(y, f(x, *args), rtol=1e-6, atol=1e-7, equal_nan=True)


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


# -- declined cases ------------------------------------------------------------------------------


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
