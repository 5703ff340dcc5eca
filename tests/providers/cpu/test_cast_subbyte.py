"""Cast/CastLike to the sub-byte and 8-bit float types against references written here from the
ONNX texts, not from ml_dtypes: its own conversions differ between releases (0.5/0.6 vs 0.7
for float -> INT4/UINT4/INT2/UINT2), and these tests must hold with any release we allow.

- INT4/UINT4/INT2/UINT2 (onnx docs/technical/int4.md, int2.md): round to nearest, ties to
  even, truncate to the type's bits; integers keep their low bits; NaN/Inf give 0.
- FLOAT8* / FLOAT4E2M1 (the Cast tables): round to nearest even on the type's own grid,
  decoded here from the bit fields; saturate -> +/-max, else NaN (or Inf for E5M2).
"""

from __future__ import annotations

import itertools
import math

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper
from oracle import np_to_elem, run_ours

SUBBYTE = {  # onnx type -> (ml_dtypes type, bits, signed)
    TensorProto.INT4: (ml_dtypes.int4, 4, True),
    TensorProto.UINT4: (ml_dtypes.uint4, 4, False),
    TensorProto.INT2: (ml_dtypes.int2, 2, True),
    TensorProto.UINT2: (ml_dtypes.uint2, 2, False),
}

# ties, out-of-range (both signs, wrapping), the int64 edge and the values the spec leaves open
FLOATS = [0.0, -0.0, 0.4, 0.5, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5, 7.4, 7.5, 8.0, 8.5, -8.5, -9.0, 15.0,
          15.5, 16.0, 17.0, -17.0, 300.0, -300.0, 1e9 + 3, -1e9 - 5, 2.0 ** 62 + 2.0 ** 40, 1e30,
          math.inf, -math.inf, math.nan]


def _ref_int(v: float, bits: int, signed: bool) -> int:
    if isinstance(v, float):
        if not math.isfinite(v) or abs(v) >= 2.0 ** 63:
            return 0
        v = round(v)  # Python's round is ties-to-even
    low = int(v) % (1 << bits)
    return low - (1 << bits) if signed and low >= 1 << (bits - 1) else low


def _cast(x: np.ndarray, to: int, opset: int, like: np.ndarray | None = None, **attrs) -> np.ndarray:
    if to in (TensorProto.INT2, TensorProto.UINT2):
        opset = max(opset, 25)  # INT2/UINT2 exist from Cast-25
    if like is None:
        node = helper.make_node("Cast", ["x"], ["y"], to=to, **attrs)
        feeds = {"x": x}
    else:
        node = helper.make_node("CastLike", ["x", "like"], ["y"], **attrs)
        feeds = {"x": x, "like": like}
    ins = [helper.make_tensor_value_info(k, np_to_elem(v.dtype), list(v.shape)) for k, v in feeds.items()]
    out = helper.make_tensor_value_info("y", to, list(x.shape))
    m = helper.make_model(helper.make_graph([node], "cast", ins, [out]), opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 12 if to in (TensorProto.INT2, TensorProto.UINT2) else 11 if opset >= 23 else 10
    (y,), _ = run_ours(m, feeds)
    return y


@pytest.mark.parametrize("to", list(SUBBYTE), ids=lambda t: TensorProto.DataType.Name(t))
@pytest.mark.parametrize("src", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("opset", [21, 25])
def test_float_to_subbyte_rounds_to_even_and_wraps(to, src, opset):
    ml, bits, signed = SUBBYTE[to]
    vals = [v for v in FLOATS if src != np.float16 or not math.isfinite(v) or abs(v) < 65504]
    x = np.array(vals, dtype=src)
    y = _cast(x, to, opset)
    assert y.dtype == np.dtype(ml)
    want = [_ref_int(float(v), bits, signed) for v in x]  # the float16 value, not the literal
    assert y.astype(np.int64).tolist() == want


@pytest.mark.parametrize("to", list(SUBBYTE), ids=lambda t: TensorProto.DataType.Name(t))
@pytest.mark.parametrize("src", [np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint64])
def test_integer_to_subbyte_keeps_the_low_bits(to, src):
    _, bits, signed = SUBBYTE[to]
    info = np.iinfo(src)
    vals = sorted({v for v in (0, 1, -1, 2, 3, 7, 8, -8, -9, 15, 16, 17, -17, 100, -100, info.min, info.max)
                   if info.min <= v <= info.max})
    x = np.array(vals, dtype=src)
    y = _cast(x, to, 21)
    assert y.astype(np.int64).tolist() == [_ref_int(int(v), bits, signed) for v in vals]


@pytest.mark.parametrize("to", list(SUBBYTE), ids=lambda t: TensorProto.DataType.Name(t))
def test_castlike_bool_and_subbyte_sources(to):
    ml, bits, signed = SUBBYTE[to]
    like = np.zeros(1, dtype=ml)
    b = np.array([True, False, True])
    assert _cast(b, to, 21, like=like).astype(np.int64).tolist() == [1, 0, 1]
    # from another sub-byte type: fixed point to fixed point keeps the low bits
    for other, (oml, obits, osigned) in SUBBYTE.items():
        codes = np.arange(1 << obits)
        vals = [_ref_int(int(c), obits, osigned) for c in codes]
        x = np.array(vals, dtype=np.int8).astype(oml)
        y = _cast(x, to, 25, like=like)
        assert y.astype(np.int64).tolist() == [_ref_int(v, bits, signed) for v in vals], other


def test_string_to_subbyte():
    x = np.array(["9", "-9", "2.5", "17"], dtype=object)
    y = _cast(x, TensorProto.INT4, 21)
    assert y.astype(np.int64).tolist() == [_ref_int(v, 4, True) for v in (9, -9, 2.0, 17)]


# -- 8-bit and 4-bit floats --------------------------------------------------------------------

#: onnx type -> (ml_dtypes type, exponent bits, mantissa bits, bias, kind) with kind "fn" (no Inf,
#: all-ones code is NaN), "fnuz" (0x80 is the one NaN, no -0), "ieee" (E5M2: Inf and NaNs), "none" (E2M1)
FLOAT_TYPES = {
    TensorProto.FLOAT8E4M3FN: (ml_dtypes.float8_e4m3fn, 4, 3, 7, "fn"),
    TensorProto.FLOAT8E4M3FNUZ: (ml_dtypes.float8_e4m3fnuz, 4, 3, 8, "fnuz"),
    TensorProto.FLOAT8E5M2: (ml_dtypes.float8_e5m2, 5, 2, 15, "ieee"),
    TensorProto.FLOAT8E5M2FNUZ: (ml_dtypes.float8_e5m2fnuz, 5, 2, 16, "fnuz"),
    TensorProto.FLOAT4E2M1: (ml_dtypes.float4_e2m1fn, 2, 1, 1, "none"),
}


def _grid(e_bits, m_bits, bias, kind):
    """Finite non-negative codes -> value, decoded from the bit fields."""
    out = {}
    for code in range(1 << (e_bits + m_bits)):
        e, m = code >> m_bits, code & ((1 << m_bits) - 1)
        if kind == "fn" and e == (1 << e_bits) - 1 and m == (1 << m_bits) - 1:
            continue  # NaN
        if kind == "ieee" and e == (1 << e_bits) - 1:
            continue  # Inf / NaN
        out[code] = math.ldexp(m, 1 - bias - m_bits) if e == 0 else math.ldexp((1 << m_bits) + m, e - bias - m_bits)
    return out


def _ref_float(v: float, spec, saturate: bool, fnuz_inf_nan: bool):
    """The expected value (a Python float, NaN for NaN) of ``v`` cast to the type ``spec``."""
    _, e_bits, m_bits, bias, kind = spec
    grid = _grid(e_bits, m_bits, bias, kind)
    top = max(grid.values())
    top_code = max(grid, key=grid.get)
    if math.isnan(v):
        return math.nan
    if math.isinf(v):
        if kind == "fnuz" and fnuz_inf_nan:
            return math.nan
        if saturate:
            return math.copysign(top, v)
        return v if kind == "ieee" else math.nan
    a = abs(v)
    # one step past the top, as if the exponent went on: [x] above the top is an overflow
    ulp = math.ldexp(1, math.frexp(top)[1] - 1 - m_bits)
    cands = sorted(grid.items(), key=lambda kv: kv[1]) + [(top_code + 1, top + ulp)]
    best = min(cands, key=lambda kv: (abs(kv[1] - a), kv[0] & 1))  # nearest, ties to even mantissa
    if best[1] > top:
        if saturate:
            r = top
        else:
            return math.copysign(math.inf, v) if kind == "ieee" else math.nan
    else:
        r = best[1]
    if kind == "fnuz" and r == 0:
        return 0.0
    return math.copysign(r, v)


def _float_inputs(spec):
    _, e_bits, m_bits, bias, kind = spec
    grid = sorted(set(_grid(e_bits, m_bits, bias, kind).values()))
    mids = [(a + b) / 2 for a, b in itertools.pairwise(grid)]  # every tie
    top = grid[-1]
    ulp = math.ldexp(1, math.frexp(top)[1] - 1 - m_bits)
    extra = [top + ulp / 4, top + ulp / 2, top + ulp, 1e6, grid[1] / 2, grid[1] / 3, 1e-30, math.inf, math.nan]
    vals = grid + mids + [m * 1.01 for m in mids] + extra
    return [s * v for v in vals for s in (1.0, -1.0)]


@pytest.mark.parametrize("to", list(FLOAT_TYPES), ids=lambda t: TensorProto.DataType.Name(t))
@pytest.mark.parametrize("opset,saturate", [(21, 1), (21, 0), (25, 1), (25, 0)])
def test_float_to_small_floats_follows_the_cast_table(to, opset, saturate):
    spec = FLOAT_TYPES[to]
    if spec[4] == "none" and (opset < 23 or not saturate):
        pytest.skip("FLOAT4E2M1 exists from opset 23; the spec gives it no non-saturating rule (no Inf/NaN)")
    x = np.array(_float_inputs(spec), dtype=np.float32)
    ok = np.isfinite(x) | (spec[4] != "none")  # float4 has no NaN: its NaN result is left open
    x = x[ok]
    y = _cast(x, to, opset, saturate=saturate)
    assert y.dtype == np.dtype(spec[0])
    got = y.astype(np.float64)
    want = np.array([_ref_float(float(v), spec, bool(saturate), opset < 24) for v in x])
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), x[np.isnan(got) != nan]
    bad = ~nan & ((got != want) | (np.signbit(got) != np.signbit(want)))
    assert not bad.any(), list(zip(x[bad].tolist(), got[bad].tolist(), want[bad].tolist()))
