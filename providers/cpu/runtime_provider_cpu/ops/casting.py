"""CPU kernels: Cast, CastLike, BitCast; and the casts to the sub-byte integer types (INT4,
UINT4, INT2, UINT2), computed here, not by ml_dtypes.

Cast nodes whose target the node's schema version does not allow, or that are not
implemented (float6), are declined with a reason (``_cast_target_reason``).

Sub-byte integers: ml_dtypes' own ``astype`` from a float to these types changed between releases: up to 0.6
it truncates toward zero and keeps the low bits, from 0.7 on an out-of-range value becomes
0. Our results must not depend on which release sits beside us (tritonclient 2.73 pins
``ml-dtypes<=0.5.4``), so the conversion is done in int64 and only exact, in-range int8
values are handed to ml_dtypes.

The rule is the one of ONNX's notes on these types (docs/technical/int4.md, int2.md):
round to the nearest integer, ties to even, then truncate to the type's bits (two's
complement for the signed ones); integer sources keep their low bits, as the Cast spec
says for fixed point to fixed point. Onnx's published backend-test data for these casts
are exactly that. What the Cast spec leaves open (NaN, +/-Inf, magnitudes of 2**63 and
more, where the low bits are not defined) gives 0, as every ml_dtypes release does.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import TensorProto, helper

from ._dtypes import (
    _BF16, _E8M0, _F4, _F6, _F8, _F8_FNUZ, _F16, _F32, _F64, _IGNORE, _ML_FLOATS, _ML_INTS, _OBJ, _allowed,
    _fmt_dtypes, _in_dtype, _schema_types, reg,
)
from ._common import ignore_fp

__all__ = ["SUBBYTE_INTS", "to_subbyte_int"]

#: sub-byte integer dtype -> (bits, signed)
SUBBYTE_INTS = {
    np.dtype(ml_dtypes.int4): (4, True),
    np.dtype(ml_dtypes.uint4): (4, False),
    np.dtype(ml_dtypes.int2): (2, True),
    np.dtype(ml_dtypes.uint2): (2, False),
}

_INT64_SPAN = 2.0 ** 63


def to_subbyte_int(x: np.ndarray, dst: np.dtype) -> np.ndarray:
    """``x`` (bool, integer or numpy float) cast to the sub-byte integer type ``dst``."""
    dst = np.dtype(dst)
    bits, signed = SUBBYTE_INTS[dst]
    x = np.asarray(x)
    kind = x.dtype.kind
    if kind == "b":
        v = x.astype(np.int64)
    elif kind in "iu":
        v = x.astype(np.int64)  # uint64 wraps to int64: the low bits are unchanged
    elif kind == "f":
        with ignore_fp(invalid="ignore"):
            r = np.rint(x.astype(np.float64))  # float16/32/64 are exact in float64; rint is ties-to-even
            defined = np.isfinite(r) & (np.abs(r) < _INT64_SPAN)
            v = np.where(defined, r, 0.0).astype(np.int64)
    else:
        raise TypeError(f"cannot cast {x.dtype} to {dst.name} (expected bool, an integer or a numpy float)")
    low = v & np.int64((1 << bits) - 1)
    if signed:
        low = np.where(low >= (1 << (bits - 1)), low - (1 << bits), low)
    # every value is now in the target's range: ml_dtypes converts those exactly in every release
    return low.astype(np.int8).astype(dst)


# -- Cast / CastLike -------------------------------------------------------------

_UNSUPPORTED_TARGETS = {}
for _d in _F6:
    _UNSUPPORTED_TARGETS[_d] = f"{_d.name} (float6 conversion is not implemented)"


def _elem_dtype(elem: int):
    if elem == TensorProto.STRING:
        return _OBJ
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem))
    except Exception:  # noqa: BLE001
        return None


def _cast_target_reason(node, dst) -> str | None:
    if dst is None:
        return f"{node.op_type}: target type {node.attrs.get('to')!r} is not a tensor type numpy can hold"
    if dst in _UNSUPPORTED_TARGETS:
        return f"{node.op_type} to {_UNSUPPORTED_TARGETS[dst]} is declined"
    _, tc, outs = _schema_types(node.op_type, node.since_version)
    allowed = _allowed(tc, outs[0][1]) if outs else None
    if allowed is not None and dst not in allowed:
        return (f"{node.op_type}-{node.since_version} cannot produce {dst.name} "
                f"(allowed: {_fmt_dtypes(allowed)})")
    return None


def _cast1_dtype(to: str):
    try:
        return _elem_dtype(TensorProto.DataType.Value(str(to).upper()))
    except ValueError:
        return None


def _cast_check(node):
    if node.since_version == 1:
        dst = _cast1_dtype(node.attrs.get("to"))
    else:
        dst = _elem_dtype(node.attrs.get("to"))
    return _cast_target_reason(node, dst)


def _castlike_check(node):
    dst = _in_dtype(node, 1)
    if dst is None:
        return None
    return _cast_target_reason(node, dst)


def _fmt_float(v: np.ndarray) -> np.ndarray:
    """Floats as strings the way ORT writes them: %.8g, NaN, INF, -INF."""
    s = np.char.mod("%.8g", v).astype(object)
    bad = ~np.isfinite(v)
    if bad.any():
        s[np.isnan(v)] = "NaN"
        s[np.isposinf(v)] = "INF"
        s[np.isneginf(v)] = "-INF"
    return s


def _to_string(x: np.ndarray) -> np.ndarray:
    dt = x.dtype
    if dt.kind in "OUS":
        return x.astype(object, copy=False)
    if dt == np.bool_:
        return np.where(x, "1", "0").astype(object)
    if dt in _ML_FLOATS:
        x, dt = x.astype(_F32), _F32
    if dt in _ML_INTS:
        x, dt = x.astype(_ML_INTS[dt]), _ML_INTS[dt]
    if dt.kind == "f":
        return _fmt_float(x if dt != _F16 else x.astype(_F32))
    return x.astype(str).astype(object)


def _as_text(s) -> str:
    if isinstance(s, bytes):
        s = s.decode("utf-8")
    return str(s).strip()


def _parse_float(s) -> float:
    t = _as_text(s)
    try:
        return float(t)
    except ValueError:
        pass
    try:
        return float.fromhex(t)
    except ValueError:
        raise ValueError(f"cannot cast string {s!r} to a number") from None


def _parse_int(s) -> int:
    t = _as_text(s)
    try:
        return int(t)
    except ValueError:
        return int(_parse_float(t))


_M64 = (1 << 64) - 1


def _from_string(x: np.ndarray, dst: np.dtype, saturate, fnuz_inf_nan, round_mode="up"):
    flat = x.reshape(-1)
    if dst.kind == "f" or dst in _ML_FLOATS:
        v = np.array([_parse_float(s) for s in flat], dtype=_F64).reshape(x.shape)
        if dst == _F32:
            return v.astype(_F32)
        return _cast_num(v, dst, saturate, fnuz_inf_nan, round_mode)
    ints = [_parse_int(s) for s in flat]
    if dst == np.bool_:
        return np.array([i != 0 for i in ints], dtype=bool).reshape(x.shape)
    v = np.array([i & _M64 for i in ints], dtype=np.uint64).reshape(x.shape)
    return _cast_num(v, dst, saturate, fnuz_inf_nan)


def _to_e8m0(x: np.ndarray, saturate, round_mode) -> np.ndarray:
    """float -> float8e8m0 (an 8-bit power-of-two exponent, bias 127, 0xFF = NaN).

    The float32 exponent field is kept and rounded per ``round_mode`` from the mantissa
    (``up``: any fraction rounds away from zero; ``down``: truncate; ``nearest``: by the
    guard bit, ties away except in the subnormal range, as onnx.numpy_helper.to_float8e8m0).
    The sign is ignored (negative inputs are unspecified). Special values follow the Cast
    table: saturate -> Inf and overflow give E8M0_MAX; non-saturating -> 0, Inf and
    overflow give NaN; NaN is always NaN.
    """
    if round_mode not in ("up", "down", "nearest"):
        raise ValueError(f"Cast round_mode={round_mode!r} is not defined (up, down or nearest)")
    bits = np.ascontiguousarray(x, dtype=_F32).view(np.uint32)
    exp = ((bits >> np.uint32(23)) & np.uint32(0xFF)).astype(np.uint16)
    special = exp == 0xFF
    nan = special & ((bits & np.uint32(0x7FFFFF)) != 0)
    if round_mode == "up":
        inc = (bits & np.uint32(0x7FFFFF)) != 0
    elif round_mode == "nearest":
        g = (bits & np.uint32(0x400000)) != 0
        rs = (bits & np.uint32(0x3FFFFF)) != 0
        inc = g & (rs | (exp > 0))
    else:
        inc = np.zeros(exp.shape, dtype=bool)
    inc &= ~special
    out = exp + inc.astype(np.uint16)
    if saturate:
        out = np.minimum(out, 0xFE)  # Inf and overflow saturate to E8M0_MAX
        out[nan] = 0xFF
    else:
        out = np.minimum(out, 0xFF)  # overflow and Inf -> NaN
        out[(bits & np.uint32(0x7FFFFFFF)) == 0] = 0xFF  # 0 -> NaN
    return out.astype(np.uint8).view(_E8M0).reshape(np.shape(x))


def _cast_num(x: np.ndarray, dst: np.dtype, saturate, fnuz_inf_nan, round_mode="up") -> np.ndarray:
    """Numeric (and bool) -> numeric cast following the ONNX Cast rules."""
    src = x.dtype
    if src == dst:
        return x
    if src in _ML_FLOATS:
        x, src = x.astype(_F32), _F32
        if dst == _F32:
            return x
    elif src in _ML_INTS:
        x, src = x.astype(_ML_INTS[src]), _ML_INTS[src]
        if src == dst:
            return x
    with ignore_fp(**_IGNORE):
        if dst == np.bool_:
            return x != 0
        if dst in _F8:
            if src.kind != "f":
                x = x.astype(_F64)
            if saturate:
                m = float(ml_dtypes.finfo(dst).max)
                if fnuz_inf_nan and dst in _F8_FNUZ and np.isinf(x).any():
                    x = np.where(np.isinf(x), np.nan, x)
                x = np.clip(x, -m, m)
            return x.astype(dst)
        if dst == _F4:
            if src.kind != "f":
                x = x.astype(_F32)
            # RNE; out of range and +/-inf saturate to +/-6 (float4e2m1 has no inf/NaN);
            # NaN has no encoding either: it becomes -0 (ml_dtypes, as the ONNX test data)
            return x.astype(_F4)
        if dst == _E8M0:
            return _to_e8m0(x, saturate, round_mode)
        if dst in _ML_INTS:
            # to_subbyte_int (above): ml_dtypes' own float -> intN cast differs between releases
            return to_subbyte_int(x, dst)
        if dst == _BF16:
            if src.kind != "f":
                x = x.astype(_F32 if src.itemsize <= 2 or src == np.bool_ else _F64)
            return x.astype(_BF16)
        return x.astype(dst)


def _cast(x: np.ndarray, dst: np.dtype, saturate=1, fnuz_inf_nan=False, round_mode="up") -> np.ndarray:
    if dst == _OBJ:
        return _to_string(x)
    if x.dtype.kind in "OUS":
        return _from_string(x, dst, saturate, fnuz_inf_nan, round_mode)
    return _cast_num(x, dst, saturate, fnuz_inf_nan, round_mode)


@reg("Cast", 1, extra=_cast_check)
def cast_1(ctx, x, *, to):
    return _cast(x, _cast1_dtype(to))


@reg("Cast", 6, 9, 13, extra=_cast_check)
def cast_6(ctx, x, *, to):
    return _cast(x, _elem_dtype(to))


@reg("Cast", 19, 21, 23, extra=_cast_check)
def cast_19(ctx, x, *, saturate, to):
    # before opset 24, saturating +/-inf into a float8 *fnuz* type gives NaN
    return _cast(x, _elem_dtype(to), saturate, fnuz_inf_nan=True)


@reg("Cast", 24, 25, 28, extra=_cast_check)
def cast_24(ctx, x, *, round_mode, saturate, to):
    # round_mode only affects float8e8m0 targets
    return _cast(x, _elem_dtype(to), saturate, fnuz_inf_nan=False, round_mode=round_mode)


@reg("CastLike", 15, extra=_castlike_check)
def castlike_15(ctx, x, like):
    return _cast(x, like.dtype)


@reg("CastLike", 19, 21, 23, extra=_castlike_check)
def castlike_19(ctx, x, like, *, saturate):
    return _cast(x, like.dtype, saturate, fnuz_inf_nan=True)


@reg("CastLike", 24, 25, extra=_castlike_check)
def castlike_24(ctx, x, like, *, round_mode, saturate):
    return _cast(x, like.dtype, saturate, fnuz_inf_nan=False, round_mode=round_mode)


# -- BitCast -----------------------------------------------------------------------

#: ONNX bit widths of the sub-byte types (held one per byte, in the low bits, by ml_dtypes)
_SUBBYTE_BITS = {np.dtype(ml_dtypes.int4): 4, np.dtype(ml_dtypes.uint4): 4, _F4: 4,
                 np.dtype(ml_dtypes.int2): 2, np.dtype(ml_dtypes.uint2): 2}


def _bit_width(dt: np.dtype) -> int:
    return _SUBBYTE_BITS.get(dt, dt.itemsize * 8)


def _bitcast_check(node):
    dst = _elem_dtype(node.attrs.get("to"))
    if dst is None or dst == _OBJ:
        return f"BitCast to type {node.attrs.get('to')!r} is not defined (string and non-tensor types excluded)"
    _, tc, outs = _schema_types(node.op_type, node.since_version)
    allowed = _allowed(tc, outs[0][1])
    if allowed is not None and dst not in allowed:
        return f"BitCast-{node.since_version} cannot produce {dst.name} (allowed: {_fmt_dtypes(allowed)})"
    src = _in_dtype(node, 0)
    if src is not None and _bit_width(src) != _bit_width(dst):
        return (f"BitCast needs input and output types of the same bit width: {src.name} has "
                f"{_bit_width(src)} bits, {dst.name} {_bit_width(dst)}")
    return None


@reg("BitCast", 26, extra=_bitcast_check)
def bitcast(ctx, x, *, to):
    dst = _elem_dtype(to)
    src = x.dtype
    if _bit_width(src) != _bit_width(dst):
        raise ValueError(f"BitCast: {src.name} ({_bit_width(src)} bits) and {dst.name} "
                         f"({_bit_width(dst)} bits) differ in bit width")
    x = np.ascontiguousarray(x).reshape(x.shape)  # (ascontiguousarray makes 0-d arrays 1-d)
    if src.byteorder == ">" or (src.byteorder == "=" and not np.little_endian):
        x = x.astype(src.newbyteorder("<"))  # the bytes are read as little endian
    if src in _SUBBYTE_BITS or dst in _SUBBYTE_BITS:
        bits = x.view(np.uint8) & np.uint8((1 << _bit_width(dst)) - 1)
        return bits.view(dst)
    if dst == np.bool_:
        # a bool holds 0 or 1 only: any nonzero byte reads as true
        return x.view(np.uint8) != 0
    y = x.view(dst.newbyteorder("<"))
    return y.astype(dst, copy=False)
