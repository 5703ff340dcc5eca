"""CPU kernels: the ``com.microsoft`` dynamic-int8 matmuls onnxruntime fuses dynamically quantized
models into, and ``dynq_fusions.py`` (EXTENDED level) makes of the same groups:

* ``DynamicQuantizeMatMul(A, B, b_scale[, b_zero_point, bias])``: A float32, quantized as
  DynamicQuantizeLinear does (uint8, per tensor, the range with 0), then
  ``Y = float(MatMulInteger(A_q, B, a_zp, b_zp)) * (a_scale * b_scale) + bias``;
* ``MatMulIntegerToFloat(A, B, a_scale, b_scale[, a_zero_point, b_zero_point, bias])``: the same
  with A already 8-bit.

The float steps are the unfused graph's (Cast, Mul by the product of the two scales, Add) in float32
and in that order. Per tensor A parameters; B's scale and zero point per tensor or per column
(``[N]``). With the compiled extension, a 2-D 8-bit B and float32 scales run on ``_native.dqmm``:
A quantized into the int8 GEMM's packed rows, B packed once when constant, the dequantization
and bias in the GEMM's epilogue; bit for bit the numpy path's results. Where the OS grants the AMX
tile state, the AMX tiles and the VNNI tile are timed per shape (``_dqmm_tile``).
"""

from __future__ import annotations

import numpy as np

from ..fast.policy import NATIVE as _native
from ..registry import kernel
from ._nncommon import _is_const
from .quant_contrib import _scalar
from .quant import _centered, _col_param, _int_matmul, _matmul_shapes_ok, _to_int32, dynamic_quantize_linear

MS = "com.microsoft"
_F32 = np.dtype(np.float32)
_I8, _U8 = np.dtype(np.int8), np.dtype(np.uint8)


def _check_b(b, b_scale, b_zero_point, bias, op):
    if b.dtype not in (_I8, _U8):
        raise ValueError(f"{op}: B must be int8 or uint8, got {b.dtype}")
    if b_zero_point is not None and b_zero_point.dtype != b.dtype:
        raise ValueError(f"{op}: b_zero_point ({b_zero_point.dtype}) must have B's type ({b.dtype})")
    n = b.shape[-1] if b.ndim >= 1 else 1
    for v, name in ((b_scale, "b_scale"), (b_zero_point, "b_zero_point")):
        if v is not None and v.size != 1 and (v.ndim != 1 or v.shape[0] != n):
            raise ValueError(f"{op}: {name} of shape {v.shape} must be a scalar or [N={n}] (per column)")
    if bias is not None and (bias.ndim != 1 or bias.shape[0] != n):
        raise ValueError(f"{op}: bias of shape {bias.shape} must be [N={n}]")


def _reference(acc, scale, bias, dt):
    """The unfused float steps: Cast, Mul by the scales' product, Add."""
    y = acc.astype(dt) * scale.astype(dt)
    return y if bias is None else y + bias.astype(dt)


def _native_ok(a, b, *vs):
    # numpy arrays only: the kernels also run on device arrays elsewhere (numpy path)
    return (_native is not None and type(a) is np.ndarray and type(b) is np.ndarray and b.ndim == 2
            and a.ndim >= 1 and 0 not in a.shape and 0 not in b.shape
            and all(v is None or (type(v) is np.ndarray and v.dtype != np.float16) for v in vs))


def _dqmm(ctx, a, kind, a_scale, a_zp, b, b_scale, b_zp, bias):
    """``_native.dqmm``: y [..., N] float32 (the packed B kept in the node's cache when constant)."""
    K, N = b.shape
    M = a.size // K
    packed = ctx.cache.get("dqmm_b")
    if packed is None or packed[0] is not b:
        buf = np.empty(_native.qgemm_packed_size((K, N)), np.int8)
        _native.qgemm_pack(np.ascontiguousarray(b), buf, (K, N), b.dtype == _I8)
        packed = (b, buf)
        if _is_const(ctx, 1, b):
            ctx.cache["dqmm_b"] = packed
    vecs = ctx.cache.get("dqmm_vecs")
    if vecs is None or vecs[0] is not b_zp or vecs[1] is not b_scale or vecs[2] is not bias:
        # B's zero points as int32 [N], its scales and the bias as float32 [N]: once for constants
        vecs = (b_zp, b_scale, bias,
                None if b_zp is None else np.ascontiguousarray(np.broadcast_to(b_zp.astype(np.int32).reshape(-1), (N,))),
                np.ascontiguousarray(np.broadcast_to(b_scale.astype(_F32).reshape(-1), (N,))),
                None if bias is None else np.ascontiguousarray(bias, _F32))
        if all(v is None or _is_const(ctx, i, v) for i, v in ((2 if kind == 0 else 3, b_scale),
                                                              (3 if kind == 0 else 5, b_zp), (4 if kind == 0 else 6, bias))):
            ctx.cache["dqmm_vecs"] = vecs
    zb, sb, bs = vecs[3:]
    a = np.ascontiguousarray(a)
    threads = max(1, int(ctx.threads))
    y = np.empty(a.shape[:-1] + (N,), _F32)
    args = (a, kind, float(a_scale), int(a_zp), packed[1], b.dtype == _I8, zb, sb, bs)
    _native.dqmm(*args, y, (M, K, N), threads, _dqmm_tile(ctx, args, M, K, N, threads))
    return y


def _dqmm_tile(ctx, args, M, K, N, threads):
    """``dqmm``'s tile for this shape: 1 (AMX) or 0 (VNNI), forced, cached or measured
    (``fast/autotune.py``) on the node's input where the AMX tiles run (``_native.AMX_INT8``
    "granted", else it says why not) and K fills one (K > 60)."""
    if getattr(_native, "AMX_INT8", "") != "granted" or K <= 60:
        return 0
    known = ctx.cache.get("dqmm_tile")
    if known is not None and known[0] == (M, threads):
        return known[1]
    from ..fast import autotune

    key = autotune.cache_key("dqmm", (M, K, N), "int8", threads)
    name = autotune.decide("dqmm", key, ["vnni", "amx"], "vnni", getattr(ctx, "tune", True))
    if name is None:
        y = np.empty((M, N), _F32)
        name, _ = autotune.measure(key, {t: (lambda i=i: _native.dqmm(*args, y, (M, K, N), threads, i))
                                         for i, t in enumerate(("vnni", "amx"))})
    autotune.note(ctx, f"{M} rows", name)
    ctx.cache["dqmm_tile"] = ((M, threads), 1 if name == "amx" else 0)  # the next run of this size: no lookup
    return ctx.cache["dqmm_tile"][1]


@kernel("DynamicQuantizeMatMul", 1, domain=MS, dtypes={"float32"})
def dynamic_quantize_matmul(ctx, a, b, b_scale, b_zero_point=None, bias=None):
    op = "DynamicQuantizeMatMul"
    _matmul_shapes_ok(a, b, op)
    _check_b(b, b_scale, b_zero_point, bias, op)
    if _native_ok(a, b, b_scale, bias) and a.dtype == _F32:
        return _dqmm(ctx, a, 0, 1.0, 0, b, b_scale, b_zero_point, bias)
    aq, sa, za = dynamic_quantize_linear(ctx, a)
    acc = _to_int32(_int_matmul(_centered(aq, za), _centered(b, _col_param(b_zero_point, b, "b_zero_point", op))))
    return _reference(acc, sa * b_scale.astype(_F32), bias, a.dtype)


@kernel("MatMulIntegerToFloat", 1, domain=MS, dtypes={"int8", "uint8"})
def matmul_integer_to_float(ctx, a, b, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None):
    op = "MatMulIntegerToFloat"
    _matmul_shapes_ok(a, b, op)
    _check_b(b, b_scale, b_zero_point, bias, op)
    sa, za = _scalar(a_scale, "a_scale", op), _scalar(a_zero_point, "a_zero_point", op)
    if za is not None and za.dtype != a.dtype:
        raise ValueError(f"{op}: a_zero_point ({za.dtype}) must have A's type ({a.dtype})")
    if sa.dtype != b_scale.dtype or (bias is not None and bias.dtype != sa.dtype):
        raise ValueError(f"{op}: a_scale ({sa.dtype}), b_scale ({b_scale.dtype}) and bias must share one float type")
    if _native_ok(a, b, sa, b_scale, bias) and sa.dtype == _F32:
        return _dqmm(ctx, a, 2 if a.dtype == _I8 else 1, float(sa), 0 if za is None else int(za), b, b_scale,
                     b_zero_point, bias)
    acc = _to_int32(_int_matmul(_centered(a, za), _centered(b, _col_param(b_zero_point, b, "b_zero_point", op))))
    return _reference(acc, sa * b_scale, bias, sa.dtype)
