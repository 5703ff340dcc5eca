"""CPU kernels, elementwise family: Cast, CastLike (numeric, strings, float8, float4,
float8e8m0, sub-byte) and BitCast.

Each case runs on runtime-core and on the oracle (onnxruntime, or onnx.reference where ORT
cannot run it) and the outputs are compared.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

from oracle import assert_close, check_node, make_model, np_to_elem, run_ours
from providers.cpu.ew_cases import BF16, F16, F32, F64, assert_declined, rand, run_model, run_typed


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


# -- float8e8m0, sub-byte out-of-range, BitCast ---------------------------------------------------

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
