"""CPU kernels: quantization. QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
QLinearMatMul, QLinearConv, MatMulInteger, ConvInteger.

Granularities (QuantizeLinear / DequantizeLinear): per tensor (a scalar or one-element
scale), per axis (a 1-D scale of length ``x.shape[axis]``) and, from opset 21, blocked
(``block_size`` > 0: the scale has x's rank, ``ceil(D_axis / block_size)`` along ``axis``).

Precision: QuantizeLinear divides in the type of ``y_scale`` (opset 23+: or in the type named
by ``precision``), before 23 in the type shared by x and the scale; float16/bfloat16
divisions are done in float32 and rounded to the type (exact: float32 has more than twice
their precision). Integer targets round half to even, add the zero point and saturate;
float8 targets saturate to +/-FLT_MAX when ``saturate`` is set (else ml_dtypes' overflow:
Inf or NaN per type); float4e2m1/float6 have no Inf/NaN and saturate (NaN -> -0 as ml_dtypes).

Integer products (MatMulInteger, ConvInteger, QLinear*) run through BLAS in float32 when the
sum of absolute products provably stays below 2**24 (exact), else in float64 (exact below
2**53); int32 results wrap as the spec allows ("accumulation may overflow in 32 bits").
With the compiled extension, MatMulInteger and QLinearMatMul of 8-bit A [..., M, K] by a 2-D B
(per-tensor A parameters, B's per tensor or per column) run on ``_native.qgemm``: an int8 GEMM
with int32 accumulation and the requantizing epilogue, B packed once when it is a constant;
a 2-D ungrouped QLinearConv is the same GEMM (bias and per-channel requantization in its
epilogue, the output written in NCHW planes) on im2col rows (gathered as it packs them: an implicit GEMM), or for a pointwise (1x1, stride 1)
one on the input's pixels; with 256+ output pixels (pointwise, or a reduction C*KH*KW up to 64)
the roles swap (``_native.qconv_nchw``): the weight is A, the image's own planes (or K x P im2col
rows) are B, and Y comes out as plane runs; a 2-D depthwise QLinearConv runs on ``_native.qdwconv`` (16 channels a vector, padded at
the zero point); DynamicQuantizeLinear of float32 is one compiled pass (``_native.dyn_quantize``),
and so is a per-tensor QuantizeLinear of float32 to 8 bits (``_native.qquantize``).
All give the numpy paths' results bit for bit.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
from onnx import TensorProto, helper

from ..fast.policy import NATIVE as _native
from ..registry import kernel
from ._common import normalize_axis
from ._nncommon import _is_const
from ._dtypes import _allowed, _checker, _fmt_dtypes, _in_dtype, _schema_types

_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_BF16 = np.dtype(ml_dtypes.bfloat16)
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
_F8 = frozenset(np.dtype(t) for t in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz,
                                      ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz))
#: no Inf/NaN encodings: ml_dtypes' conversion saturates
_SMALL_FLOATS = frozenset(np.dtype(getattr(ml_dtypes, n)) for n in
                          ("float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn") if hasattr(ml_dtypes, n))
_INT_TARGETS = frozenset(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, ml_dtypes.int4,
                                               ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2))
_PRECISIONS = {TensorProto.FLOAT: _F32, TensorProto.FLOAT16: _F16, TensorProto.BFLOAT16: _BF16,
               TensorProto.DOUBLE: _F64}


def _elem_dtype(elem):
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(int(elem)))
    except Exception:  # noqa: BLE001 - not a tensor type numpy can hold
        return None


def _irange(dt):
    info = ml_dtypes.iinfo(dt) if dt.kind not in "iu" else np.iinfo(dt)
    return int(info.min), int(info.max)


def _widen(dt):
    """The numpy type holding the values of ``dt`` (int4 -> int8, ...) for integer math."""
    if dt.kind in "iu":
        return dt
    if dt in (np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.int2)):
        return np.dtype(np.int8)
    if dt in (np.dtype(ml_dtypes.uint4), np.dtype(ml_dtypes.uint2)):
        return np.dtype(np.uint8)
    return None


# -- granularity -----------------------------------------------------------------

def _expand(v, shape, axis, block_size, name, op):
    """Scale / zero point reshaped (blocked: replicated) to broadcast against ``shape``."""
    if v.size == 1:
        return v.reshape(())
    rank = len(shape)
    if not block_size:
        if v.ndim != 1:
            raise ValueError(f"{op}: {name} of shape {v.shape} must be a scalar or 1-D (per axis) "
                             "unless block_size is set (blocked quantization, opset 21+)")
        a = normalize_axis(axis, rank)
        if v.shape[0] != shape[a]:
            raise ValueError(f"{op}: {name} has {v.shape[0]} elements, input axis {a} has {shape[a]}")
        return v.reshape([-1 if i == a else 1 for i in range(rank)])
    if block_size < 0:
        raise ValueError(f"{op}: block_size must be positive, got {block_size}")
    if v.ndim != rank:
        raise ValueError(f"{op}: blocked {name} must have the input's rank {rank}, got shape {v.shape}")
    a = normalize_axis(axis, rank)
    for i in range(rank):
        want = -(-shape[i] // block_size) if i == a else shape[i]
        if v.shape[i] != want:
            raise ValueError(f"{op}: blocked {name} of shape {v.shape} does not fit input shape {tuple(shape)} "
                             f"with axis={a}, block_size={block_size} (dim {i} should be {want})")
    r = np.repeat(v, block_size, axis=a)
    if r.shape[a] != shape[a]:
        r = r[(slice(None),) * a + (slice(0, shape[a]),)]
    return r


def _check_zp_shape(scale, zp, op):
    if zp is not None and zp.shape != scale.shape and not (zp.size == 1 and scale.size == 1):
        raise ValueError(f"{op}: zero point shape {zp.shape} differs from the scale's {scale.shape}")


# -- QuantizeLinear ------------------------------------------------------------------

def _divide(x, s, prec):
    """``x / s`` in precision ``prec``; returns float32 (or float64) values of that type."""
    if prec == _F64:
        return np.divide(x.astype(_F64), s.astype(_F64))
    if prec == _F32:
        return np.divide(x.astype(_F32, copy=False), s.astype(_F32, copy=False))
    # float16 / bfloat16: operands rounded to the type, the float32 quotient rounded once more
    q = np.divide(x.astype(prec).astype(_F32), s.astype(prec).astype(_F32))
    return q.astype(prec).astype(_F32)


def _default_precision(scale_dt):
    if scale_dt in (_F16, _BF16, _F32, _F64):
        return scale_dt
    if scale_dt.kind in "iu":
        return _F64  # int32 scales: exact quotient in double
    return _F32  # float8e8m0 (powers of two): the division is exact in float32 in range


def _quantize(x, scale, zp, *, axis, block_size, out_dt, saturate, prec, op):
    _check_zp_shape(scale, zp, op)
    s = _expand(scale, x.shape, axis, block_size, "y_scale", op)
    q = _divide(x, s, prec)
    if isinstance(q, np.generic):  # a 0-d input gives a numpy scalar: in-place ops need an array
        q = np.asarray(q)  # (only then: the kernel also runs on device arrays for the CUDA provider)
    with np.errstate(invalid="ignore", over="ignore"):
        if out_dt in _INT_TARGETS:
            lo, hi = _irange(out_dt)
            np.rint(q, out=q)
            if zp is not None:
                q += _expand(zp, x.shape, axis, block_size, "y_zero_point", op).astype(q.dtype)
            np.clip(q, lo, hi, out=q)
            q[np.isnan(q)] = 0  # undefined by the spec: NaN quantizes to 0
            return q.astype(np.int32).astype(out_dt)
        if zp is not None:
            z = _expand(zp, x.shape, axis, block_size, "y_zero_point", op).astype(_F32)
            if np.any(z):
                q = q + z
        if out_dt in _F8:
            if saturate:
                m = float(ml_dtypes.finfo(out_dt).max)
                q = np.clip(q, -m, m)
            return q.astype(out_dt)
        if out_dt in _SMALL_FLOATS:
            return q.astype(out_dt)
    raise ValueError(f"{op}: output type {out_dt.name} is not a quantized type")


def _q_out_dtype(node, zp_dt):
    """(output dtype, reason) of a QuantizeLinear node."""
    attr = node.attrs.get("output_dtype") or 0
    od = _elem_dtype(attr) if attr else None
    if attr and od is None:
        return None, f"QuantizeLinear output_dtype={attr} is not a tensor type numpy can hold"
    if zp_dt is not None:
        if od is not None and od != zp_dt:
            return None, (f"QuantizeLinear output_dtype {od.name} differs from the zero point's type "
                          f"{zp_dt.name} (they must match)")
        return zp_dt, None
    return (od if od is not None else np.dtype(np.uint8)), None


def _q_check(node):
    zp_dt = _in_dtype(node, 2)
    od, why = _q_out_dtype(node, zp_dt)
    if why:
        return why
    if od not in _INT_TARGETS and od not in _F8 and od not in _SMALL_FLOATS:
        return f"QuantizeLinear to {od.name} is not a quantized type"
    _, tc, outs = _schema_types(node.op_type, node.since_version)
    allowed = _allowed(tc, outs[0][1])
    if allowed is not None and od not in allowed:
        return f"QuantizeLinear-{node.since_version} cannot produce {od.name} (allowed: {_fmt_dtypes(allowed)})"
    p = node.attrs.get("precision") or 0
    if p and p not in _PRECISIONS:
        return f"QuantizeLinear precision={p} is not implemented (FLOAT, FLOAT16, BFLOAT16 or DOUBLE)"
    if node.attrs.get("block_size", 0) and node.attrs["block_size"] < 0:
        return f"QuantizeLinear block_size={node.attrs['block_size']} must be positive"
    return None


def _q_run(ctx, x, y_scale, y_zero_point, axis=1, block_size=0, output_dtype=0, saturate=1, precision=0):
    op = f"QuantizeLinear-{ctx.node.since_version}"
    out_dt, why = _q_out_dtype(ctx.node, None if y_zero_point is None else y_zero_point.dtype)
    if why:
        raise ValueError(why)
    prec = _PRECISIONS[precision] if precision else _default_precision(y_scale.dtype)
    if (_native is not None and type(x) is np.ndarray and type(y_scale) is np.ndarray and x.dtype == _F32
            and prec == _F32 and y_scale.dtype == _F32 and y_scale.size == 1 and not block_size and x.size
            and out_dt in (_I8, _U8) and (y_zero_point is None or y_zero_point.size == 1)):
        s = float(y_scale.reshape(()))
        if math.isfinite(s) and s != 0.0:  # else the numpy path's inf / NaN rules
            y = np.empty(x.shape, out_dt)
            _native.qquantize(np.ascontiguousarray(x), y, x.size, s,
                              0 if y_zero_point is None else int(y_zero_point.reshape(())), out_dt == _I8,
                              max(1, int(ctx.threads)))
            return y
    return _quantize(x, y_scale, y_zero_point, axis=axis, block_size=block_size, out_dt=out_dt,
                     saturate=saturate, prec=prec, op=op)


def _per_tensor_only(v, name, op):
    if v.size != 1:
        raise ValueError(f"{op}: {name} must be a scalar (per tensor), got shape {v.shape}")


@kernel("QuantizeLinear", 10, check=_checker(_q_check))
def quantize_linear_10(ctx, x, y_scale, y_zero_point=None):
    _per_tensor_only(y_scale, "y_scale", "QuantizeLinear-10")
    return _q_run(ctx, x, y_scale, y_zero_point)


@kernel("QuantizeLinear", 13, check=_checker(_q_check))
def quantize_linear_13(ctx, x, y_scale, y_zero_point=None, *, axis):
    return _q_run(ctx, x, y_scale, y_zero_point, axis=axis)


@kernel("QuantizeLinear", 19, check=_checker(_q_check))
def quantize_linear_19(ctx, x, y_scale, y_zero_point=None, *, axis, saturate):
    return _q_run(ctx, x, y_scale, y_zero_point, axis=axis, saturate=saturate)


@kernel("QuantizeLinear", 21, check=_checker(_q_check))
def quantize_linear_21(ctx, x, y_scale, y_zero_point=None, *, axis, block_size, output_dtype, saturate):
    return _q_run(ctx, x, y_scale, y_zero_point, axis=axis, block_size=block_size,
                  output_dtype=output_dtype, saturate=saturate)


@kernel("QuantizeLinear", 23, 24, 25, 28, check=_checker(_q_check))
def quantize_linear_23(ctx, x, y_scale, y_zero_point=None, *, axis, block_size, output_dtype, precision,
                       saturate):
    return _q_run(ctx, x, y_scale, y_zero_point, axis=axis, block_size=block_size,
                  output_dtype=output_dtype, saturate=saturate, precision=precision)


# -- DequantizeLinear ----------------------------------------------------------------------

def _dq_out_dtype(node, scale_dt):
    attr = node.attrs.get("output_dtype") or 0
    if attr:
        od = _elem_dtype(attr)
        if od not in (_F32, _F16, _BF16):
            return None, f"DequantizeLinear output_dtype={attr} is not float, float16 or bfloat16"
        return od, None
    if scale_dt is not None and scale_dt not in (_F32, _F16, _BF16):
        return None, (f"DequantizeLinear with a {scale_dt.name} x_scale needs output_dtype "
                      "(the output type defaults to the scale's, which is not an output type)")
    return scale_dt, None


def _dq_check(node):
    _, why = _dq_out_dtype(node, _in_dtype(node, 1))
    return why


def _dequantize(ctx, x, x_scale, x_zero_point=None, axis=1, block_size=0):
    op = f"DequantizeLinear-{ctx.node.since_version}"
    out_dt, why = _dq_out_dtype(ctx.node, x_scale.dtype)
    if why:
        raise ValueError(why)
    _check_zp_shape(x_scale, x_zero_point, op)
    s = _expand(x_scale, x.shape, axis, block_size, "x_scale", op)
    wide = _widen(x.dtype)
    if wide is not None:
        # (x - zero point) is exact in float32 for up to 16-bit inputs; int32 needs float64
        cd = _F64 if x.dtype.itemsize > 2 else _F32
        if x_zero_point is not None:
            z = _expand(x_zero_point, x.shape, axis, block_size, "x_zero_point", op)
            d = np.subtract(x.astype(wide).astype(np.int64 if cd == _F64 else np.int32),
                            z.astype(wide).astype(np.int64 if cd == _F64 else np.int32)).astype(cd)
        else:
            d = x.astype(wide).astype(cd)
    else:  # float8 / float4 / float6 values
        cd = _F32
        d = x.astype(_F32)
        if x_zero_point is not None:
            z = _expand(x_zero_point, x.shape, axis, block_size, "x_zero_point", op).astype(_F32)
            if np.any(z):
                d = d - z
    with np.errstate(over="ignore", invalid="ignore"):
        # the scale in the output type (the precision of the multiplication), the product
        # rounded once to the output type
        sc = s.astype(out_dt).astype(_F64 if cd == _F64 or out_dt != _F32 else _F32)
        y = np.multiply(d, sc)
        return y.astype(out_dt)


@kernel("DequantizeLinear", 10, check=_checker(_dq_check))
def dequantize_linear_10(ctx, x, x_scale, x_zero_point=None):
    _per_tensor_only(x_scale, "x_scale", "DequantizeLinear-10")
    return _dequantize(ctx, x, x_scale, x_zero_point)


@kernel("DequantizeLinear", 13, 19, check=_checker(_dq_check))
def dequantize_linear_13(ctx, x, x_scale, x_zero_point=None, *, axis):
    return _dequantize(ctx, x, x_scale, x_zero_point, axis=axis)


@kernel("DequantizeLinear", 21, check=_checker(_dq_check))
def dequantize_linear_21(ctx, x, x_scale, x_zero_point=None, *, axis, block_size):
    return _dequantize(ctx, x, x_scale, x_zero_point, axis=axis, block_size=block_size)


@kernel("DequantizeLinear", 23, 24, 25, 28, check=_checker(_dq_check))
def dequantize_linear_23(ctx, x, x_scale, x_zero_point=None, *, axis, block_size, output_dtype):
    return _dequantize(ctx, x, x_scale, x_zero_point, axis=axis, block_size=block_size)


# -- DynamicQuantizeLinear ----------------------------------------------------------------

@kernel("DynamicQuantizeLinear", 11, check=_checker())
def dynamic_quantize_linear(ctx, x):
    if _native is not None and type(x) is np.ndarray and x.dtype == _F32 and x.size:
        xc = np.ascontiguousarray(x)
        y = np.empty(x.shape, np.uint8)
        scale, zp = _native.dyn_quantize(xc, y, xc.size)
        return y, np.array(scale, dtype=_F32), np.array(zp, dtype=np.uint8)
    qmin, qmax = 0.0, 255.0
    x = x.astype(_F32, copy=False)
    if x.size:  # NaNs are left out of the range, as onnxruntime does (fmax / fmin skip them; no copy)
        hi = np.float32(max(0.0, float(np.fmax.reduce(x, axis=None))))
        lo = np.float32(min(0.0, float(np.fmin.reduce(x, axis=None))))
    else:
        hi = lo = np.float32(0)
    # the data range includes 0; an all-zero range gives scale 1 (as onnxruntime)
    scale = np.float32(1.0) if hi == lo else np.float32((hi - lo) / np.float32(qmax - qmin))
    zp = np.float32(np.rint(np.clip(np.float32(qmin) - lo / scale, qmin, qmax)))
    with np.errstate(invalid="ignore"):
        y = np.rint(x / scale)
        y += zp
        np.clip(y, qmin, qmax, out=y)
        y[np.isnan(y)] = 0  # onnxruntime's saturation of NaN
    return y.astype(np.uint8), np.array(scale, dtype=_F32), np.array(zp, dtype=np.uint8)


# -- integer matmul / conv helpers ------------------------------------------------------------

def _centered(v, zp):
    """``v - zp`` as int32 (8-bit inputs)."""
    a = v.astype(np.int32)
    if zp is not None:
        a = a - zp.astype(np.int32)
    return a


def _exact_dtype(a, b, k):
    """float32 if every partial sum of k products of a and b stays below 2**24, else float64."""
    ma = int(np.max(np.abs(a))) if a.size else 0
    mb = int(np.max(np.abs(b))) if b.size else 0
    return _F32 if k * ma * mb < (1 << 24) else _F64


def _int_matmul(a, b):
    """Exact integer matmul (numpy matmul broadcasting) through BLAS; returns float array."""
    k = a.shape[-1]
    cd = _exact_dtype(a, b, k)
    return np.matmul(a.astype(cd), b.astype(cd))


def _to_int32(y):
    """float holding integers -> int32, wrapping (two's complement) outside the int32 range."""
    if y.dtype == _F32 or (y.size and float(np.max(np.abs(y))) < 2 ** 31):
        return y.astype(np.int32)
    return y.astype(np.int64).astype(np.int32)


def _row_param(v, a, name, op):
    """A per-row (a: [..., M, K]) scale/zero point broadcastable to [..., M, 1]."""
    if v is None or v.size == 1:
        return None if v is None else v.reshape(())
    if v.ndim == 1 and a.ndim >= 1:
        if a.ndim < 2 or v.shape[0] != a.shape[-2]:
            raise ValueError(f"{op}: {name} of shape {v.shape} must have M={a.shape[-2] if a.ndim >= 2 else 1} "
                             "elements (per row)")
        return v.reshape(-1, 1)
    return v


def _col_param(v, b, name, op):
    """A per-column (b: [..., K, N]) scale/zero point broadcastable to [..., 1, N]."""
    if v is None or v.size == 1:
        return None if v is None else v.reshape(())
    if v.ndim == 1:
        if v.shape[0] != b.shape[-1]:
            raise ValueError(f"{op}: {name} of shape {v.shape} must have N={b.shape[-1]} elements (per column)")
        return v
    return v


def _matmul_shapes_ok(a, b, op):
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"{op}: inputs must have rank >= 1, got {a.shape} and {b.shape}")
    ka = a.shape[-1]
    kb = b.shape[-2] if b.ndim >= 2 else b.shape[0]
    if ka != kb:
        raise ValueError(f"{op}: inner dimensions differ: {a.shape} @ {b.shape}")


_I8, _U8 = np.dtype(np.int8), np.dtype(np.uint8)


def _qgemm(ctx, bi, a, b, za, zb, out_dt=None, mult=None, yz=0, *, bias=None, pack_key="qgemm_b", const=None,
           planes=None, owner=None, conv=None):
    """``_native.qgemm`` for 8-bit ``a`` [..., M, K] @ 2-D ``b`` [K, N] (``b`` the node's input
    ``bi``), a scalar ``za`` and a scalar or [N] ``zb``: int32 (``out_dt`` None) or requantized
    by ``mult`` [N] and ``yz`` into ``out_dt``; None where the compiled GEMM does not apply.
    ``planes`` P: the result in NCHW planes [M / P, N, P] (a convolution's output, no transpose).
    ``owner``: the array the cached packing is keyed on (default ``b``; a convolution's 4-D
    weight, so that its [K, N] rearrangement is not kept once packed). ``conv`` (C, H, W, KH, KW, OH,
    OW, sh, sw, dh, dw, pt, pl): ``a`` is NCHW images and A their im2col rows, gathered block by block
    as the GEMM packs them (never stored whole)."""
    # numpy arrays only: the kernels also run on the CUDA provider's device arrays (numpy path)
    if (_native is None or type(a) is not np.ndarray or type(b) is not np.ndarray
            or a.dtype not in (_I8, _U8) or b.dtype not in (_I8, _U8) or b.ndim != 2
            or a.ndim < 1 or 0 in a.shape or 0 in b.shape or (za is not None and za.size != 1)
            or (zb is not None and zb.size != 1 and zb.shape != (b.shape[1],))):
        return None
    K, N = b.shape
    M = a.size // K if conv is None else a.shape[0] * conv[5] * conv[6]
    yp = planes or 0
    key = b if owner is None else owner
    packed = ctx.cache.get(pack_key)
    if packed is None or packed[0] is not key:
        # a constant B is packed once per node; one computed at run time every run
        buf = np.empty(_native.qgemm_packed_size((K, N)), np.int8)
        _native.qgemm_pack(np.ascontiguousarray(b), buf, (K, N), b.dtype == _I8)
        packed = (key, buf)
        if _is_const(ctx, bi, b) if const is None else const:
            ctx.cache[pack_key] = packed
    zbv = None if zb is None else np.ascontiguousarray(np.broadcast_to(zb.astype(np.int32), (N,)))
    ydt = np.int32 if out_dt is None else out_dt
    y = np.empty((M // yp, N, yp) if yp else (M, N) if conv else a.shape[:-1] + (N,), ydt)
    mode = 0 if out_dt is None else (1 if out_dt == _U8 else 2)
    _native.qgemm(np.ascontiguousarray(a), a.dtype == _I8, 0 if za is None else int(za.reshape(())), packed[1],
                  b.dtype == _I8, zbv, y, (M, K, N), mode, mult, int(yz), max(1, int(ctx.threads)), bias, yp, conv)
    return y


@kernel("MatMulInteger", 10, check=_checker())
def matmul_integer(ctx, a, b, a_zero_point=None, b_zero_point=None):
    op = "MatMulInteger"
    _matmul_shapes_ok(a, b, op)
    if a.ndim >= 2:
        y = _qgemm(ctx, 1, a, b, a_zero_point, b_zero_point)
        if y is not None:
            return y
    za = _row_param(a_zero_point, a, "a_zero_point", op)
    zb = _col_param(b_zero_point, b, "b_zero_point", op)
    return _to_int32(_int_matmul(_centered(a, za), _centered(b, zb)))


def _requantize(acc, mult, zp, out_dt, op):
    """y = saturate(round(acc * mult) + zp) for int8/uint8 (or float8) outputs; float32 math."""
    with np.errstate(over="ignore", invalid="ignore"):
        y = acc.astype(_F32, copy=False) * mult
        if out_dt.kind in "iu":
            lo, hi = _irange(out_dt)
            y = np.rint(y)
            if zp is not None:
                y = y + zp.astype(_F32)
            np.clip(y, lo, hi, out=y)
            return y.astype(out_dt)
        if out_dt in _F8:
            if zp is not None:
                z = zp.astype(_F32)
                if np.any(z):
                    y = y + z
            m = float(ml_dtypes.finfo(out_dt).max)
            return np.clip(y, -m, m).astype(out_dt)
    raise ValueError(f"{op}: output type {out_dt.name} is not supported")


def _scale32(v):
    return v.astype(_F32)


def _qlinear_matmul(ctx, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    op = f"QLinearMatMul-{ctx.node.since_version}"
    _matmul_shapes_ok(a, b, op)
    sa = _row_param(a_scale, a, "a_scale", op)
    za = _row_param(a_zero_point, a, "a_zero_point", op)
    sb = _col_param(b_scale, b, "b_scale", op)
    zb = _col_param(b_zero_point, b, "b_zero_point", op)
    y = _qlinear_native(ctx, a, sa, za, b, sb, zb, y_scale, y_zero_point)
    if y is not None:
        return y
    if a.dtype in _F8 or b.dtype in _F8:
        fa = a.astype(_F32) - (0 if za is None else za.astype(_F32))
        fb = b.astype(_F32) - (0 if zb is None else zb.astype(_F32))
        acc = np.matmul(fa, fb)
    else:
        acc = _int_matmul(_centered(a, za), _centered(b, zb))
        if acc.dtype == _F64 and acc.size and float(np.max(np.abs(acc))) >= 2 ** 31:
            acc = _to_int32(acc)  # the int32 accumulator may wrap
    ys = y_scale
    if ys.size != 1:
        ys = _col_param(ys, b, "y_scale", op)
    mult = (_scale32(sa) * _scale32(sb)) / _scale32(ys.reshape(()) if ys.size == 1 else ys)
    yz = y_zero_point
    if yz is not None and yz.size != 1:
        yz = _col_param(yz, b, "y_zero_point", op)
    elif yz is not None:
        yz = yz.reshape(())
    return _requantize(acc, mult, yz, y_zero_point.dtype, op)


def _qlinear_native(ctx, a, sa, za, b, sb, zb, y_scale, y_zero_point):
    """QLinearMatMul on ``_native.qgemm`` where A's parameters and Y's zero point are per tensor
    and the multiplier is finite (the numpy path's float32 arithmetic, bit for bit); else None."""
    if (_native is None or type(a) is not np.ndarray or type(y_scale) is not np.ndarray
            or a.ndim < 2 or b.ndim != 2 or y_zero_point is None
            or y_zero_point.dtype not in (_I8, _U8) or y_zero_point.size != 1
            or sa is None or sa.size != 1 or (za is not None and za.size != 1)
            or not (y_scale.size == 1 or y_scale.shape == (b.shape[-1],))):
        return None
    ys = y_scale.reshape(()) if y_scale.size == 1 else y_scale.reshape(-1)
    with np.errstate(all="ignore"):
        mult = (_scale32(sa) * _scale32(sb)) / _scale32(ys)
    if not np.all(np.isfinite(mult)):
        return None
    mult = np.ascontiguousarray(np.broadcast_to(mult, (b.shape[-1],)), dtype=_F32)
    return _qgemm(ctx, 3, a, b, za, zb, y_zero_point.dtype, mult, int(y_zero_point.reshape(())))


@kernel("QLinearMatMul", 10, 21, check=_checker())
def qlinear_matmul(ctx, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    return _qlinear_matmul(ctx, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point)


# -- integer convolutions ----------------------------------------------------------------------

def _conv_geometry(x, w, auto_pad, dilations, group, pads, strides, op, kernel_shape=None):
    from ._nncommon import _check_kernel_shape, _check_window_fits, _conv_pads, _ints

    nd = x.ndim - 2
    if nd < 1:
        raise ValueError(f"{op} needs an input of rank >= 3, got shape {x.shape}")
    if w.ndim != x.ndim:
        raise ValueError(f"{op}: W of shape {w.shape} must have X's rank {x.ndim}")
    if x.shape[1] != w.shape[1] * group:
        raise ValueError(f"{op}: input channels {x.shape[1]} != W.shape[1] {w.shape[1]} * group {group}")
    if w.shape[0] % group:
        raise ValueError(f"{op}: output channels {w.shape[0]} are not a multiple of group {group}")
    _check_kernel_shape(op, kernel_shape, w.shape)
    strides = _ints(strides, nd, 1)
    dilations = _ints(dilations, nd, 1)
    ks = w.shape[2:]
    k_eff = [(ks[i] - 1) * dilations[i] + 1 for i in range(nd)]
    pb, pe = _conv_pads(x.shape[2:], k_eff, strides, pads, auto_pad)
    _check_window_fits(op, x.shape[2:], k_eff, pb, pe)
    return strides, dilations, pb, pe


def _int_conv(xc, wc, group, strides, dilations, pb, pe):
    """Exact integer convolution of centered int32 inputs; returns float array."""
    from .conv import _conv_core

    k = (wc.shape[1] * math.prod(wc.shape[2:])) or 1
    cd = _exact_dtype(xc, wc, k)
    return _conv_core(xc.astype(cd), wc.astype(cd), None, group, strides, dilations, pb, pe)


def _w_channel_param(v, w, name, op):
    if v is None or v.size == 1:
        return None if v is None else v.reshape(())
    if v.ndim != 1 or v.shape[0] != w.shape[0]:
        raise ValueError(f"{op}: {name} of shape {v.shape} must be a scalar or have M={w.shape[0]} elements")
    return v.reshape((-1,) + (1,) * (w.ndim - 1))


def _int_conv_check(node):
    ap = node.attrs.get("auto_pad", "NOTSET")
    if ap not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        return f"{node.op_type}: auto_pad {ap!r} is not a valid value"
    if (node.attrs.get("group") or 1) < 1:
        return f"{node.op_type}: group must be >= 1"
    return None


@kernel("ConvInteger", 10, check=_checker(_int_conv_check))
def conv_integer(ctx, x, w, x_zero_point=None, w_zero_point=None, *, auto_pad, dilations, group,
                 kernel_shape, pads, strides):
    op = "ConvInteger"
    if x_zero_point is not None and x_zero_point.size != 1:
        raise ValueError(f"{op}: x_zero_point must be a scalar, got shape {x_zero_point.shape}")
    st, dl, pb, pe = _conv_geometry(x, w, auto_pad, dilations, group, pads, strides, op, kernel_shape)
    xc = _centered(x, x_zero_point)  # padding adds zeros after centering: zero-point padding
    wc = _centered(w, _w_channel_param(w_zero_point, w, "w_zero_point", op))
    return _to_int32(_int_conv(xc, wc, group, st, dl, pb, pe))


def _requant_mult(x_scale, w_scale, y_scale, M):
    """QLinearConv's requantizing multipliers x_scale * w_scale[m] / y_scale as float32 [M] (in
    float32, as the numpy path computes them), or None where one is not finite."""
    with np.errstate(all="ignore"):
        m = (_scale32(x_scale.reshape(())) * _scale32(w_scale.reshape(-1))) / _scale32(y_scale.reshape(()))
    if not np.all(np.isfinite(m)):
        return None
    return np.ascontiguousarray(np.broadcast_to(m, (M,)), dtype=_F32)


def _int32_bias(B):
    """QLinearConv's bias as contiguous int32 [M], or None."""
    return None if B is None else np.ascontiguousarray(B.reshape(-1), dtype=np.int32)


def _cached(ctx, key, ins, build):
    """``build()``, kept in the node's cache while ``ins`` ((input index, array) pairs: the
    values it derives from) are the same constant arrays: per-run Python work (multipliers,
    int32 vectors) done once per session for a QDQ model's constant scales."""
    got = ctx.cache.get(key)
    if got is not None and len(got[0]) == len(ins) and all(a is b for a, (_, b) in zip(got[0], ins)):
        return got[1]
    v = build()
    if all(a is None or _is_const(ctx, i, a) for i, a in ins):
        ctx.cache[key] = (tuple(a for _, a in ins), v)
    return v


def _qlinear_conv_native(ctx, x, x_scale, xz, w, w_scale, wz, y_scale, yz, B, group, st, dl, pb, pe, keep=None):
    """A 2-D, ungrouped QLinearConv on ``_native.qgemm`` against the weight as a packed
    [C*KH*KW, M] B, bias and per-channel requantization in its epilogue, Y written in NCHW
    planes; A is the input's pixels as rows for a pointwise convolution, else im2col rows (gathered block by block inside the GEMM,
    padded with x's zero point: zeros after centering, as the numpy path pads). None where it does
    not apply (depthwise convolutions: ``_qlinear_conv_depthwise``; other grouped ones: numpy)."""
    if (_native is None or type(x) is not np.ndarray or type(w) is not np.ndarray or type(x_scale) is not np.ndarray
            or group != 1 or x.ndim != 4 or x.dtype not in (_I8, _U8) or w.dtype not in (_I8, _U8)
            or yz is None or yz.dtype not in (_I8, _U8) or 0 in x.shape or 0 in w.shape
            or (wz is not None and wz.size != 1 and wz.shape != (w.shape[0],))
            or (w_scale.size != 1 and w_scale.shape != (w.shape[0],)) or (B is not None and B.size != w.shape[0])):
        return None
    M = w.shape[0]

    def prep():
        m = _requant_mult(x_scale, w_scale, y_scale, M)
        return None if m is None else (m, _int32_bias(B))

    got = _cached(ctx, "qconv_prep", ((1, x_scale), (4, w_scale), (6, y_scale), (8, B)), prep)
    if got is None:
        return None
    mult, bias = got
    n, c, kh, kw = x.shape[0], x.shape[1], w.shape[2], w.shape[3]
    y = _qlinear_conv_planes(ctx, x, xz, w, wz, yz, mult, bias, st, dl, pb, pe, keep)
    if y is not None:
        return y
    const = _is_const(ctx, 3, w)
    packed = ctx.cache.get("qconv_b")
    # B is [C*KH*KW, M] with rows in (kh, kw, c) order; once a constant weight is packed only
    # its shape is read (a view), so no rearranged copy outlives the packing
    b = w.reshape(M, -1).T if packed is not None and packed[0] is w else np.ascontiguousarray(
        w.transpose(0, 2, 3, 1).reshape(M, -1).T)
    if kh == kw == 1 and tuple(st) == (1, 1) and not any(pb) and not any(pe):
        # a pointwise convolution: no im2col, no padding; x's pixels are A's rows
        P = x.shape[2] * x.shape[3]
        a = np.empty((n * P, c), x.dtype)  # the pixels as rows: a compiled byte transpose (numpy's is slow)
        _native.qtranspose(np.ascontiguousarray(x), a, (n, c, P))
        y = _qgemm(ctx, 3, a, b, xz, wz, yz.dtype, mult, int(yz.reshape(())), bias=bias,
                   pack_key="qconv_b", const=const, planes=P, owner=w)
        return y.reshape(n, M, x.shape[2], x.shape[3])
    eh, ew = (kh - 1) * dl[0] + 1, (kw - 1) * dl[1] + 1
    ph, pw = x.shape[2] + pb[0] + pe[0], x.shape[3] + pb[1] + pe[1]
    if ph < eh or pw < ew or min(pb) < 0:
        return None
    oh, ow = (ph - eh) // st[0] + 1, (pw - ew) // st[1] + 1
    # an implicit GEMM: im2col rows in (kh, kw, c) order, padded with x's zero point (zeros after
    # centering), gathered from an NHWC copy of x for each 8-row block as the GEMM packs A
    conv = (c, x.shape[2], x.shape[3], kh, kw, oh, ow, st[0], st[1], dl[0], dl[1], pb[0], pb[1])
    y = _qgemm(ctx, 3, x, b, xz, wz, yz.dtype, mult, int(yz.reshape(())), bias=bias, pack_key="qconv_b",
               const=const, planes=oh * ow, owner=w, conv=conv)  # Y written in NCHW planes
    packed = ctx.cache.get("qconv_b")
    if keep is not None and packed is not None and packed[0] is w:
        # the call with the packed weight and every vector worked out, kept for x of this shape
        buf, ydt, P = packed[1], yz.dtype, oh * ow
        zbv = None if wz is None else np.ascontiguousarray(np.broadcast_to(wz.astype(np.int32).reshape(-1), (M,)))
        args = (x.dtype == _I8, 0 if xz is None else int(xz.reshape(())), buf, w.dtype == _I8, zbv)
        rest = ((n * P, kh * kw * c, M), 1 if ydt == _U8 else 2, mult, int(yz.reshape(())))

        def run(ctx, x):
            y = np.empty((n, M, P), ydt)
            _native.qgemm(np.ascontiguousarray(x), *args, y, *rest, max(1, int(ctx.threads)), bias, P, conv)
            return y.reshape(n, M, oh, ow)

        keep(run)
    return y.reshape(n, M, oh, ow)


#: output pixels from which a convolution runs as W times the image's rows (``_native.qconv_nchw``):
#: below, its 32-pixel tiles waste too much on padding (MobileNet's 7x7 planes; its 14x14 ones, 196
#: pixels in 7 tiles, still gain from skipping the transpose)
_PLANES_MIN_P = 192
#: reductions (C * KH * KW) up to which a non-pointwise convolution takes that path too: for longer
#: ones the pixel-row GEMM wins (its epilogue is a smaller share)
_PLANES_MAX_K = 64


def _qlinear_conv_planes(ctx, x, xz, w, wz, yz, mult, bias, st, dl, pb, pe, keep=None):
    """A 2-D ungrouped QLinearConv as W [M, C*KH*KW] times each image's rows [C*KH*KW, OH*OW] on
    ``_native.qconv_nchw``: the image's own planes for a pointwise convolution (no transpose), else
    im2col rows in (c, kh, kw) order, Y stored as NCHW planes directly; None where the pixel-row GEMM
    (``_qlinear_conv_native``) is the better layout. ``keep(run)`` is handed the call with
    everything but x worked out (``_keep_conv_run``)."""
    n, c, kh, kw, M = x.shape[0], x.shape[1], w.shape[2], w.shape[3], w.shape[0]
    eh, ew = (kh - 1) * dl[0] + 1, (kw - 1) * dl[1] + 1
    ph, pw = x.shape[2] + pb[0] + pe[0], x.shape[3] + pb[1] + pe[1]
    if ph < eh or pw < ew or min(pb) < 0:
        return None
    oh, ow = (ph - eh) // st[0] + 1, (pw - ew) // st[1] + 1
    P, K = oh * ow, c * kh * kw
    pointwise = kh == kw == 1 and tuple(st) == (1, 1) and not any(pb) and not any(pe)
    if P < _PLANES_MIN_P or not (pointwise or K <= _PLANES_MAX_K):
        return None
    got = ctx.cache.get("qconv_rows")
    if got is None or got[0] is not w or got[1] is not wz:
        wzv = None if wz is None else np.ascontiguousarray(np.broadcast_to(wz.astype(np.int32).reshape(-1), (M,)))
        got = (w, wz, np.ascontiguousarray(w.reshape(M, K)), wzv)
        if _is_const(ctx, 3, w) and (wz is None or _is_const(ctx, 5, wz)):
            ctx.cache["qconv_rows"] = got
    xzi, yzi, xdt, ydt = 0 if xz is None else int(xz.reshape(())), int(yz.reshape(())), x.dtype, yz.dtype
    xshape, wrows, wzv = x.shape, got[2], got[3]
    geom = ((kh, kw), (oh, ow), tuple(st), tuple(dl), (pb[0], pb[1]))

    def run(ctx, x):
        xq = np.ascontiguousarray(x)
        threads = max(1, int(ctx.threads))
        if pointwise:
            rows = xq
        else:
            rows = np.empty((n, K, P), xdt)
            _native.qim2col_rows(xq, rows, xshape, *geom, xzi, threads)
        y = np.empty((n, M, oh, ow), ydt)
        _native.qconv_nchw(rows, xdt == _I8, xzi, wrows, w.dtype == _I8, wzv, y, (n, M, K, P), mult, bias,
                           ydt == _I8, yzi, threads)
        return y

    if keep is not None:
        keep(run)
    return run(ctx, x)


def _qlinear_conv_depthwise(ctx, x, x_scale, xz, w, w_scale, wz, y_scale, yz, B, group, st, dl, pb, pe, keep=None):
    """A 2-D depthwise QLinearConv (group == C == M) on ``_native.qdwconv``: 16 channels a vector,
    padded with x's zero point, requantized as the numpy path does (bit for bit); None where it
    does not apply. ``keep(run)`` as for ``_qlinear_conv_planes``."""
    if (_native is None or type(x) is not np.ndarray or type(w) is not np.ndarray or type(x_scale) is not np.ndarray
            or x.ndim != 4 or group == 1 or group != x.shape[1] or w.shape[0] != group or w.shape[1] != 1
            or x.dtype not in (_I8, _U8) or w.dtype not in (_I8, _U8) or yz is None or yz.dtype not in (_I8, _U8)
            or 0 in x.shape or 0 in w.shape or (wz is not None and wz.size != 1 and wz.shape != (group,))
            or (w_scale.size != 1 and w_scale.shape != (group,)) or (B is not None and B.size != group)
            or w.shape[2] * w.shape[3] >= 33000):
        return None
    C = group

    def prep():
        m = _requant_mult(x_scale, w_scale, y_scale, C)
        return None if m is None else (
            m, None if wz is None else np.ascontiguousarray(np.broadcast_to(wz.astype(np.int32).reshape(-1), (C,))),
            _int32_bias(B))

    got = _cached(ctx, "qdw_prep", ((1, x_scale), (4, w_scale), (5, wz), (6, y_scale), (8, B)), prep)
    if got is None:
        return None
    mult, wzv, bias = got
    kh, kw = w.shape[2], w.shape[3]
    oh = (x.shape[2] + pb[0] + pe[0] - ((kh - 1) * dl[0] + 1)) // st[0] + 1
    ow = (x.shape[3] + pb[1] + pe[1] - ((kw - 1) * dl[1] + 1)) // st[1] + 1
    if oh < 1 or ow < 1:
        return None
    xzi, yzi, xs8, ys8, ydt = 0 if xz is None else int(xz.reshape(())), int(yz.reshape(())), x.dtype == _I8, \
        yz.dtype == _I8, yz.dtype
    wq, ws8, yshape, xshape = np.ascontiguousarray(w), w.dtype == _I8, (x.shape[0], C, oh, ow), x.shape
    geom = ((kh, kw), (oh, ow), tuple(st), tuple(dl), (pb[0], pb[1]))

    def run(ctx, x):
        y = np.empty(yshape, ydt)
        _native.qdwconv(np.ascontiguousarray(x), xs8, xzi, wq, ws8, wzv, bias, mult, y, ys8, yzi, xshape, *geom,
                        max(1, int(ctx.threads)))
        return y

    if keep is not None:
        keep(run)
    return run(ctx, x)


def _keep_conv_run(ctx, x, ins, run):
    """Keeps ``run(ctx, x)`` (a compiled QLinearConv call with its arguments but x worked out) in the
    node's cache while every other input is the partition's constant: later runs with x of the same
    shape and dtype skip the per-run checks and set-up (Python time that the kernels of MobileNet's
    small planes do not hide)."""
    if all(a is None or _is_const(ctx, i, a) for i, a in enumerate(ins, 1)):
        ctx.cache["qconv_run"] = (x.shape, x.dtype, ins, run)


@kernel("QLinearConv", 10, check=_checker(_int_conv_check))
def qlinear_conv(ctx, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B=None, *,
                 auto_pad, dilations, group, kernel_shape, pads, strides):
    op = "QLinearConv"
    ins = (x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B)
    fast = ctx.cache.get("qconv_run") if type(x) is np.ndarray and _native is not None else None
    if fast is not None and fast[0] == x.shape and fast[1] == x.dtype and all(a is b for a, b in zip(fast[2], ins)):
        return fast[3](ctx, x)  # the same constants and x's shape: the checks and set-up below as last run
    for name, v in (("x_scale", x_scale), ("x_zero_point", x_zero_point), ("y_scale", y_scale),
                    ("y_zero_point", y_zero_point)):
        if v is not None and v.size != 1:
            raise ValueError(f"{op}: {name} must be a scalar (per tensor), got shape {v.shape}")
    st, dl, pb, pe = _conv_geometry(x, w, auto_pad, dilations, group, pads, strides, op, kernel_shape)

    def keep(run):
        _keep_conv_run(ctx, x, ins, run)

    y = _qlinear_conv_native(ctx, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B,
                             group, st, dl, pb, pe, keep)
    if y is None:
        y = _qlinear_conv_depthwise(ctx, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point,
                                    B, group, st, dl, pb, pe, keep)
    if y is not None:
        return y
    xc = _centered(x, x_zero_point)
    wc = _centered(w, _w_channel_param(w_zero_point, w, "w_zero_point", op))
    acc = _int_conv(xc, wc, group, st, dl, pb, pe)
    nd = x.ndim - 2
    if B is not None:
        if B.size != w.shape[0]:
            raise ValueError(f"{op}: B has {B.size} elements, expected M={w.shape[0]}")
        acc = acc.astype(_F64, copy=False) + B.astype(_F64).reshape((-1,) + (1,) * nd)
    if acc.size and float(np.max(np.abs(acc))) >= 2 ** 31:
        acc = _to_int32(acc)
    ws = w_scale.reshape(()) if w_scale.size == 1 else _w_channel_param(w_scale, w, "w_scale", op).reshape(
        (-1,) + (1,) * nd)
    mult = (_scale32(x_scale.reshape(())) * _scale32(ws)) / _scale32(y_scale.reshape(()))
    return _requantize(acc, mult, y_zero_point.reshape(()) if y_zero_point is not None else None,
                       (y_zero_point if y_zero_point is not None else x).dtype, op)
