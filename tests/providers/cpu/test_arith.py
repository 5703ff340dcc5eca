"""CPU kernels, elementwise family: binary arithmetic (opset < 7 broadcasting included), logic,
bitwise ops, comparisons, Where and the variadic ops.

Each case runs on runtime-core and on the oracle (onnxruntime, or onnx.reference where ORT
cannot run it) and the outputs are compared.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import runtime_core as rt
from oracle import assert_close, check_node, run_ours
from providers.cpu.ew_cases import BF16, F16, F32, F64, rand, run_typed, session, tol, typed_model


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


# -- legacy size-1 broadcast --------------------------------------------------------------------

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
