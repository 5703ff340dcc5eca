"""Reference kernels for the ``com.microsoft`` quantized ops onnxruntime's quantizer (and
``runtime_core.quantization``) writes: QGemm, QLinearAdd, QLinearMul, QLinearSigmoid,
QLinearLeakyRelu, QLinearAveragePool, QLinearGlobalAveragePool, QLinearConcat,
QLinearSoftmax, MatMulNBits and the contrib QuantizeLinear / DequantizeLinear.

Semantics are onnxruntime's contrib ops (checked against onnxruntime in
``tests/providers/cpu/test_quant_contrib.py``). Integer products accumulate exactly in int32
(as onnxruntime) through the helpers of :mod:`.quant`; the element-wise ops dequantize,
compute in float32 and requantize with round-half-to-even and saturation. 8-bit unary ops use
a 256-entry lookup table, as onnxruntime does, so each code maps to exactly one output code.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..fast.policy import NATIVE as _native
from ..registry import kernel
from ._common import normalize_axis
from ._nncommon import _is_const
from .quant import _centered, _dequantize, _int_matmul, _qgemm, _quantize, _to_int32

MS = "com.microsoft"
_F32 = np.dtype(np.float32)
_Q8 = {"int8", "uint8"}


def _scalar(v, name, op):
    if v is None:
        return None
    if v.size != 1:
        raise ValueError(f"{op}: {name} must be a scalar (per tensor), got shape {v.shape}")
    return v.reshape(())


def _deq(x, s, z):
    """(x - z) * s in float32."""
    d = x.astype(np.int32)
    if z is not None:
        d = d - z.astype(np.int32)
    return d.astype(_F32) * s.astype(_F32)


def _req(y, s, z, out_dt):
    """saturate(round_half_even(y / s) + z) to the 8-bit type ``out_dt``."""
    info = np.iinfo(out_dt)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        q = np.rint(np.asarray(y, _F32) / s.astype(_F32))
        if z is not None:
            q += z.astype(_F32)
        np.clip(q, info.min, info.max, out=q)
        q[np.isnan(q)] = 0
    return q.astype(out_dt)


def _out_dtype(y_zp, x):
    return (y_zp if y_zp is not None else x).dtype


# -- binary element-wise ---------------------------------------------------------------

def _binary_params(op, a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp):
    if a.dtype != b.dtype:
        raise ValueError(f"{op}: A ({a.dtype}) and B ({b.dtype}) must have the same type")
    return (_scalar(a_scale, "A_scale", op), _scalar(a_zp, "A_zero_point", op), _scalar(b_scale, "B_scale", op),
            _scalar(b_zp, "B_zero_point", op), _scalar(c_scale, "C_scale", op), _scalar(c_zp, "C_zero_point", op))


def _qlinear_add_native(ctx, a, ra, za, b, rb, zb, zc):
    """QLinearAdd of same-shaped operands on ``_native.qadd_lut``: the per-code tables of
    (code - z) * r computed here as ``_deq`` computes them, so the sums, the rounding and the
    saturation are the numpy path's, bit for bit; None where it does not apply."""
    if (_native is None or type(a) is not np.ndarray or type(b) is not np.ndarray or a.shape != b.shape
            or not a.size or (zc is not None and zc.dtype != a.dtype)):
        return None

    def tables():
        codes = np.arange(256, dtype=np.uint8).view(a.dtype)  # table index = the code's byte
        with np.errstate(all="ignore"):
            ta, tb = _deq(codes, ra, za), _deq(codes, rb, zb)
        return (ta, tb) if np.all(np.isfinite(ta)) and np.all(np.isfinite(tb)) else None

    params = (float(ra), None if za is None else int(za), float(rb), None if zb is None else int(zb))
    got = ctx.cache.get("qadd_lut")
    if got is None or got[0] != params:  # built once while the scales and zero points stay
        got = (params, tables())
        ctx.cache["qadd_lut"] = got
    if got[1] is None:
        return None
    y = np.empty(a.shape, a.dtype)
    _native.qadd_lut(np.ascontiguousarray(a), np.ascontiguousarray(b), got[1][0], got[1][1],
                     float(zc) if zc is not None else 0.0, y, a.dtype == np.int8, a.size, max(1, int(ctx.threads)),
                     (params[0], params[1] or 0, params[2], params[3] or 0))
    return y


def _keep_qadd_run(ctx, a, zc, ins):
    """Keeps the ``qadd_lut`` call with its tables and scalars worked out while every scale and
    zero point is the partition's constant (MobileNetV2's residual adds: the per-run Python set-up
    was more than the kernel's time); later runs with same-shaped A and B go straight to it."""
    got = ctx.cache.get("qadd_lut")
    if got is None or got[1] is None or not all(v is None or _is_const(ctx, i, v) for i, v in ins):
        return
    ta, tb = got[1]
    ys8, dt, shape = a.dtype == np.int8, a.dtype, a.shape
    aff, n = got[0], a.size

    def run(ctx, a, b):
        y = np.empty(shape, dt)
        _native.qadd_lut(np.ascontiguousarray(a), np.ascontiguousarray(b), ta, tb, zc, y, ys8, n,
                         max(1, int(ctx.threads)), (aff[0], aff[1] or 0, aff[2], aff[3] or 0))
        return y

    ctx.cache["qadd_run"] = (shape, dt, tuple(v for _, v in ins), run)


@kernel("QLinearAdd", 1, domain=MS, dtypes=_Q8)
def qlinear_add(ctx, a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point=None):
    """C = quantize(dequantize(A) + dequantize(B)), numpy broadcasting. Computed as onnxruntime
    does, (A - za) * (sa / sc) + (B - zb) * (sb / sc) + zc in float32, so ties round alike."""
    op = "QLinearAdd"
    ins = ((1, a_scale), (2, a_zero_point), (4, b_scale), (5, b_zero_point), (6, c_scale), (7, c_zero_point))
    fast = ctx.cache.get("qadd_run") if type(a) is np.ndarray and type(b) is np.ndarray else None
    if (fast is not None and a.shape == fast[0] and b.shape == fast[0] and a.dtype == fast[1] and b.dtype == fast[1]
            and all(x is y for x, (_, y) in zip(fast[2], ins))):
        return fast[3](ctx, a, b)  # the same constants and shapes: the checks and set-up below as last run
    sa, za, sb, zb, sc, zc = _binary_params(op, a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale,
                                            c_zero_point)
    ra = sa.astype(_F32) / sc.astype(_F32)
    rb = sb.astype(_F32) / sc.astype(_F32)
    y = _qlinear_add_native(ctx, a, ra, za, b, rb, zb, zc)
    if y is not None:
        _keep_qadd_run(ctx, a, float(zc) if zc is not None else 0.0, ins)
        return y
    v = _deq(a, ra, za) + _deq(b, rb, zb)
    if zc is not None:
        v += zc.astype(_F32)
    return _req(v, np.float32(1), None, _out_dtype(zc, a))


@kernel("QLinearMul", 1, domain=MS, dtypes=_Q8)
def qlinear_mul(ctx, a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point=None):
    """C = quantize(dequantize(A) * dequantize(B)), numpy broadcasting; as onnxruntime,
    (A - za) * (B - zb) * (sa * sb / sc) + zc in float32."""
    op = "QLinearMul"
    sa, za, sb, zb, sc, zc = _binary_params(op, a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale,
                                            c_zero_point)
    r = sa.astype(_F32) * sb.astype(_F32) / sc.astype(_F32)
    v = _deq(a, np.float32(1), za) * _deq(b, np.float32(1), zb) * r
    if zc is not None:
        v += zc.astype(_F32)
    return _req(v, np.float32(1), None, _out_dtype(zc, a))


# -- unary (lookup table) ----------------------------------------------------------------

def _qunary(op, fn, x, x_scale, x_zp, y_scale, y_zp):
    sx, zx = _scalar(x_scale, "X_scale", op), _scalar(x_zp, "X_zero_point", op)
    sy, zy = _scalar(y_scale, "Y_scale", op), _scalar(y_zp, "Y_zero_point", op)
    info = np.iinfo(x.dtype)
    codes = np.arange(info.min, info.max + 1, dtype=np.int32).astype(x.dtype)
    with np.errstate(over="ignore"):
        table = _req(fn(_deq(codes, sx, zx)), sy, zy, _out_dtype(zy, x))
    return table[x.astype(np.int32) - info.min]


def _sigmoid(v):
    return (1.0 / (1.0 + np.exp(-v))).astype(_F32)


@kernel("QLinearSigmoid", 1, domain=MS, dtypes=_Q8)
def qlinear_sigmoid(ctx, x, x_scale, x_zero_point, y_scale, y_zero_point=None):
    return _qunary("QLinearSigmoid", _sigmoid, x, x_scale, x_zero_point, y_scale, y_zero_point)


@kernel("QLinearLeakyRelu", 1, domain=MS, dtypes=_Q8)
def qlinear_leaky_relu(ctx, x, x_scale, x_zero_point, y_scale, y_zero_point=None, *, alpha=0.01):
    a = np.float32(alpha)
    return _qunary("QLinearLeakyRelu", lambda v: np.where(v >= 0, v, v * a).astype(_F32), x, x_scale,
                   x_zero_point, y_scale, y_zero_point)


# -- pooling -------------------------------------------------------------------------------

def _nchw(x, channels_last):
    return np.moveaxis(x, -1, 1) if channels_last else x


@kernel("QLinearGlobalAveragePool", 1, domain=MS, dtypes=_Q8)
def qlinear_global_average_pool(ctx, x, x_scale, x_zero_point, y_scale, y_zero_point=None, *, channels_last=0):
    """Mean over the spatial axes (int32 sums, as onnxruntime), kept as size-1 axes."""
    op = "QLinearGlobalAveragePool"
    if x.ndim < 3:
        raise ValueError(f"{op}: input must have rank >= 3, got shape {x.shape}")
    sx, zx = _scalar(x_scale, "x_scale", op), _scalar(x_zero_point, "x_zero_point", op)
    sy, zy = _scalar(y_scale, "y_scale", op), _scalar(y_zero_point, "y_zero_point", op)
    axes = tuple(range(1, x.ndim - 1)) if channels_last else tuple(range(2, x.ndim))
    n = int(np.prod([x.shape[i] for i in axes]))
    if not channels_last and type(x) is np.ndarray and x.dtype.itemsize == 1 and 0 < n < 2 ** 16:
        # the planes' sums as one float32 product with ones: exact (below 2^24), a third of the
        # time of numpy's integer reduction over short rows (MobileNet's 1280 planes of 7x7)
        s = np.ascontiguousarray(x).reshape(-1, n).astype(_F32) @ np.ones(n, _F32)
        acc = s.astype(np.int64).reshape(x.shape[:2] + (1,) * (x.ndim - 2)) - (0 if zx is None else int(zx) * n)
    else:
        acc = _centered(x, zx).sum(axis=axes, keepdims=True, dtype=np.int64)
    return _req(acc.astype(np.float64) * (float(sx) / n), sy, zy, _out_dtype(zy, x))


@kernel("QLinearAveragePool", 1, domain=MS, dtypes=_Q8)
def qlinear_average_pool(ctx, x, x_scale, x_zero_point, y_scale, y_zero_point=None, *, auto_pad="NOTSET",
                         ceil_mode=0, channels_last=0, count_include_pad=0, kernel_shape=None, pads=None,
                         strides=None):
    """AveragePool of the dequantized input (padding counts as the zero point), requantized."""
    from .pool import _avgpool_impl

    op = "QLinearAveragePool"
    if kernel_shape is None:
        raise ValueError(f"{op}: kernel_shape is required")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    sx, zx = _scalar(x_scale, "x_scale", op), _scalar(x_zero_point, "x_zero_point", op)
    sy, zy = _scalar(y_scale, "y_scale", op), _scalar(y_zero_point, "y_zero_point", op)
    xf = _nchw(_centered(x, zx).astype(_F32), channels_last)
    y = _avgpool_impl(ctx, xf, auto_pad, ceil_mode, count_include_pad, None, list(kernel_shape),
                      None if pads is None else list(pads), None if strides is None else list(strides))
    y = _req(y * sx.astype(_F32), sy, zy, _out_dtype(zy, x))
    return np.ascontiguousarray(np.moveaxis(y, 1, -1)) if channels_last else y


# -- concat / softmax ------------------------------------------------------------------------

@kernel("QLinearConcat", 1, domain=MS, dtypes={"float32"})
def qlinear_concat(ctx, y_scale, y_zero_point, *inputs, axis):
    """Each (tensor, scale, zero point) triple requantized to Y's parameters, then concatenated."""
    op = "QLinearConcat"
    if not inputs or len(inputs) % 3:
        raise ValueError(f"{op}: inputs after Y_scale, Y_zero_point come in (tensor, scale, zero point) "
                         f"triples, got {len(inputs)}")
    sy, zy = _scalar(y_scale, "Y_scale", op), _scalar(y_zero_point, "Y_zero_point", op)
    out_dt = y_zero_point.dtype
    parts = []
    for i in range(0, len(inputs), 3):
        x, s, z = inputs[i], _scalar(inputs[i + 1], "scale", op), _scalar(inputs[i + 2], "zero point", op)
        if x.dtype != out_dt:
            raise ValueError(f"{op}: input {i // 3} is {x.dtype}, Y is {out_dt}")
        same = s.astype(_F32) == sy.astype(_F32) and (z if z is not None else 0) == (zy if zy is not None else 0)
        parts.append(x if same else _req(_deq(x, s, z), sy, zy, out_dt))
    return np.concatenate(parts, axis=normalize_axis(axis, parts[0].ndim))


@kernel("QLinearSoftmax", 1, domain=MS, dtypes=_Q8)
def qlinear_softmax(ctx, x, x_scale, x_zero_point, y_scale, y_zero_point=None, *, axis=-1, opset=13):
    """Softmax of the dequantized input; opset < 13 coerces to 2-D at ``axis`` (Softmax-1/11)."""
    op = "QLinearSoftmax"
    sx, zx = _scalar(x_scale, "X_scale", op), _scalar(x_zero_point, "x_zero_point", op)
    sy, zy = _scalar(y_scale, "y_scale", op), _scalar(y_zero_point, "y_zero_point", op)
    a = normalize_axis(axis, x.ndim)
    d = _deq(x, sx, zx)
    if opset < 13:
        shape = d.shape
        d = d.reshape(int(np.prod(shape[:a], dtype=np.int64)), -1)
        a = 1
    e = np.exp(d - d.max(axis=a, keepdims=True))
    y = e / e.sum(axis=a, keepdims=True)
    return _req(y, sy, zy, _out_dtype(zy, x)).reshape(x.shape)


# -- QGemm -----------------------------------------------------------------------------------

def _const_layout(ctx, b, B):
    """``B`` (``b`` or its transpose) as one contiguous array per constant ``b``, so that the
    compiled GEMM packs it once (a transposed view is a new object every run)."""
    if B is b:
        return b
    got = ctx.cache.get("qgemm_bt")
    if got is None or got[0] is not b:
        got = (b, np.ascontiguousarray(B))
        if _is_const(ctx, 3, b):
            ctx.cache["qgemm_bt"] = got
    return got[1]


@kernel("QGemm", 1, domain=MS, dtypes=_Q8)
def qgemm(ctx, a, a_scale, a_zero_point, b, b_scale, b_zero_point, c=None, y_scale=None, y_zero_point=None, *,
          alpha=1.0, transA=0, transB=0):
    """Y = alpha * a_scale * b_scale * ((A' - za)(B' - zb) + C), int32 accumulation; C is int32
    with scale a_scale * b_scale; quantized to (y_scale, y_zero_point) when y_scale is given,
    else float32. b_scale / b_zero_point: per tensor or per column (N)."""
    op = "QGemm"
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"{op}: A and B must be 2-D, got {a.shape} and {b.shape}")
    A = a.T if transA else a
    B = b.T if transB else b
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"{op}: inner dimensions differ: {A.shape} @ {B.shape}")
    n = B.shape[1]
    sa, za = _scalar(a_scale, "a_scale", op), _scalar(a_zero_point, "a_zero_point", op)

    def col(v, name):
        if v is None or v.size == 1:
            return None if v is None else v.reshape(())
        if v.ndim != 1 or v.shape[0] != n:
            raise ValueError(f"{op}: {name} of shape {v.shape} must be a scalar or have N={n} elements")
        return v

    sb, zb = col(b_scale, "b_scale"), col(b_zero_point, "b_zero_point")
    if c is not None and c.dtype != np.int32:
        raise ValueError(f"{op}: C must be int32, got {c.dtype}")
    # the int32 sums on the compiled GEMM (a constant B packed once, a 1-D C added in its epilogue)
    bias = c.reshape(-1) if c is not None and c.shape in ((n,), (1, n)) and type(c) is np.ndarray else None
    acc = _qgemm(ctx, 3, A, _const_layout(ctx, b, B), za, zb, bias=None if bias is None else np.ascontiguousarray(bias),
                 const=_is_const(ctx, 3, b))
    if acc is None:
        acc = _to_int32(_int_matmul(_centered(A, za), _centered(B, zb)))
        bias = None
    if c is not None and bias is None:
        acc = (acc.astype(np.int64) + c.astype(np.int64)).astype(np.int32)  # wraps as int32
    mult = np.float32(alpha) * sa.astype(_F32) * sb.astype(_F32)
    y = acc.astype(_F32) * mult
    if y_scale is None:
        return y
    sy, zy = _scalar(y_scale, "y_scale", op), _scalar(y_zero_point, "y_zero_point", op)
    return _req(y, sy, zy, _out_dtype(zy, a))


# -- MatMulNBits ------------------------------------------------------------------------------

def _unpack4(packed, count):
    """uint8 bytes -> 4-bit codes, low nibble first, the last axis cut to ``count``."""
    q = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), np.uint8)
    q[..., 0::2] = packed & 0x0F
    q[..., 1::2] = packed >> 4
    return q[..., :count]


def _nbits_check(node):
    bits = node.attrs.get("bits", 4)
    bs = node.attrs.get("block_size")
    if bits != 4:
        return f"MatMulNBits: bits={bits} is not implemented (4 only)"
    if bs is None or bs < 16 or bs & (bs - 1):
        return f"MatMulNBits: block_size={bs} must be a power of two >= 16"
    if len(node.inputs) > 4 and node.inputs[4]:
        return "MatMulNBits: g_idx (act-order) is not implemented"
    return None


def _nbits_zeros(zero_points, N, nb, op):
    """The zero points as float32 [N, nb, 1] (8 where absent, as a scalar)."""
    if zero_points is None:
        return np.float32(8)
    if zero_points.dtype == np.uint8:
        zb = -(-nb // 2)
        if zero_points.size != N * zb:
            raise ValueError(f"{op}: packed zero_points has {zero_points.size} bytes, expected {N * zb}")
        return _unpack4(zero_points.reshape(N, zb), nb).astype(_F32).reshape(N, nb, 1)
    if zero_points.size != N * nb:
        raise ValueError(f"{op}: zero_points has {zero_points.size} elements, expected {N * nb}")
    return zero_points.reshape(N, nb, 1).astype(_F32)


def _nbits_weight(b, scales, zero_points, K, N, nb, block_size, op):
    """The dequantized weight, transposed: float32 [K, N]."""
    q = _unpack4(b.reshape(N, nb, block_size // 2), block_size).astype(_F32)  # [N, nb, bs]
    s = scales.reshape(N, nb, 1).astype(_F32)
    z = _nbits_zeros(zero_points, N, nb, op)
    return np.ascontiguousarray(((q - z) * s).reshape(N, nb * block_size)[:, :K].T)


def _nbits_int8_pack(b, scales, zero_points, N, nb, block_size, op):
    """B in ``_native.nbits_int8_matmul``'s layout: (codes [P][Kp / 8][16][4] bytes, byte (c, i) of
    a group of 8 terms holding column c's terms i (low nibble) and 4 + i (high); sb and z * sb
    [P][nb][16] float32), P = ceil(N / 16) panels, zeros past N."""
    kp, P = nb * block_size, -(-N // 16)
    q = np.zeros((P * 16, kp), np.uint8)
    q[:N] = _unpack4(b.reshape(N, nb, block_size // 2), block_size).reshape(N, kp)
    g = q.reshape(P, 16, kp // 8, 2, 4)
    bp = np.ascontiguousarray((g[:, :, :, 0, :] | (g[:, :, :, 1, :] << 4)).transpose(0, 2, 1, 3))
    s = scales.reshape(N, nb).astype(_F32)
    z = _nbits_zeros(zero_points, N, nb, op)
    zs = (s * (z if z.ndim == 0 else z.reshape(N, nb))).astype(_F32)
    sb, zsb = np.zeros((P * 16, nb), _F32), np.zeros((P * 16, nb), _F32)
    sb[:N], zsb[:N] = s, zs
    return (bp, np.ascontiguousarray(sb.reshape(P, 16, nb).transpose(0, 2, 1)),
            np.ascontiguousarray(zsb.reshape(P, 16, nb).transpose(0, 2, 1)))


#: the columns a MatMulNBits choice is measured on (both candidates on the same slice of the
#: weight's rows, so that the measurement never makes a float copy of a large weight)
NBITS_TUNE_COLS = 512
#: bytes of float copy the dequantized weight may keep where the kernel's tiles are the AVX-512
#: build: a larger weight takes the kernel unmeasured (the copy is 8 times the codes' memory,
#: the model's whole weight memory again; the kernel runs the same register tiles as Linear)
NBITS_COPY_MAX = 4 << 20


def _nbits_zp_ok(zero_points, N, nb):
    """Whether the compiled kernel takes these zero points (absent, packed uint8, float32)."""
    if zero_points is None:
        return True
    if zero_points.dtype == np.uint8:
        return zero_points.size == N * (-(-nb // 2))
    return zero_points.dtype == _F32 and zero_points.size == N * nb


def _nbits_panels(nat, b, N, K, nb, block_size):
    """The codes in ``nbits_matmul``'s panel layout (``_native.nbits_pack_panels``: a term's 32 columns
    in 16 bytes, uint8 [ceil(N / 32)][nb * block_size][16]); the scales and zero points stay as stored."""
    q = np.empty(-(-N // 32) * nb * block_size * 16, np.uint8)
    nat.nbits_pack_panels(np.ascontiguousarray(b), q, (N, K, block_size))
    return q


class _NbitsNative:
    """``_native.nbits_matmul`` on columns [0, n) of the node's codes as stored (no float copy); more
    rows than ``NBITS_DOT_ROWS`` read the codes repacked in panels (``_nbits_panels``, made on the
    first such call or taken from ``cache``, the node's cache shared by its row counts)."""

    KIND = "native"

    def __init__(self, nat, b, scales, zero_points, K, N, nb, block_size, threads, n=None, cache=None):
        n = N if n is None else n
        self.nat, self.K, self.N, self.bs, self.threads = nat, K, n, block_size, threads
        self.b = np.ascontiguousarray(b.reshape(N, -1)[:n])
        self.s = np.ascontiguousarray(scales.reshape(N, nb)[:n], _F32)
        self.zfloat = zero_points is not None and zero_points.dtype == _F32
        self.z = None if zero_points is None else np.ascontiguousarray(zero_points.reshape(N, -1)[:n])
        self.nb, self.cache = nb, {} if cache is None else cache

    def _panels(self):
        if not hasattr(self.nat, "nbits_pack_panels"):
            return None
        p = self.cache.get("nbits_panels")
        if p is None:
            p = self.cache["nbits_panels"] = _nbits_panels(self.nat, self.b, self.N, self.K, self.nb, self.bs)
        return p

    def run(self, a2, bias):
        y = np.empty((a2.shape[0], self.N), _F32)
        args = (a2, self.b, self.s, self.z, self.zfloat, bias, y, (a2.shape[0], self.K, self.N, self.bs), self.threads)
        panels = self._panels() if a2.shape[0] > getattr(self.nat, "NBITS_DOT_ROWS", 0) else None
        self.nat.nbits_matmul(*args, *(() if panels is None else (panels,)))
        return y


class _NbitsDequant:
    """The weight dequantized to float32 once, then numpy's matmul (BLAS)."""

    KIND = "dequant"

    def __init__(self, wt):
        self.wt = wt

    def run(self, a2, bias):
        y = np.matmul(a2, self.wt)
        if bias is not None:
            y += bias
        return y


def _nbits_native():
    """The compiled module where the policy lets kernels use it, else None."""
    from ..fast.policy import current

    return current().native


def _nbits_int8_fast(nat) -> bool:
    """Whether ``nbits_int8_matmul``'s AVX-512 VNNI or AVX2 loop runs on this CPU: elsewhere
    accuracy_level 4 keeps float compute (the level is a floor on accuracy; the portable int8 loop
    is slower than float)."""
    return nat is not None and hasattr(nat, "nbits_int8_matmul") and bool(getattr(nat, "NBITS_INT8_FAST", 0))


def _nbits_plan(ctx, a2, b, scales, zero_points, bias, K, N, nb, block_size, op, cache=None):
    """The plan of this node for ``a2``'s row count: the compiled kernel or the dequantized
    weight, forced, cached or measured (``fast/autotune.py``) on a slice of the weight's columns;
    None where only the dequantized weight applies."""
    from ..fast import autotune
    from ..fast.policy import current

    p = current()
    nat = p.native
    if (nat is None or not hasattr(nat, "nbits_matmul") or block_size > 256 or a2.dtype != _F32
            or scales.dtype != _F32 or not _nbits_zp_ok(zero_points, N, nb)
            or (bias is not None and (bias.dtype != _F32 or bias.size != N))):
        return None
    threads = max(1, int(getattr(ctx, "threads", 1)))
    R = a2.shape[0]
    key = autotune.cache_key("nbits", (R, K, N, block_size), "float32", threads)
    names = ["dequant", "native"]
    # a few rows read the codes once (an eighth of the float weight's bytes); many rows of a
    # large weight on the AVX-512 tiles: not worth a float copy of it
    if R <= getattr(nat, "NBITS_DOT_ROWS", 0) or (getattr(nat, "CONV_FAST", 0) and 4 * K * N > NBITS_COPY_MAX):
        names = ["native"]
    name = autotune.decide("nbits", key, names, "dequant", getattr(ctx, "tune", True))
    if name is None:
        n = min(N, NBITS_TUNE_COLS)
        w = _nbits_weight(b.reshape(N, -1)[:n], scales.reshape(N, nb)[:n],
                          None if zero_points is None else zero_points.reshape(N, -1)[:n], K, n, nb, block_size, op)
        bs = None if bias is None else np.ascontiguousarray(bias.reshape(N)[:n])
        made = {"dequant": _NbitsDequant(w),
                "native": _NbitsNative(nat, b, scales, zero_points, K, N, nb, block_size, threads, n)}
        name, _ = autotune.measure(key, {k: (lambda pl=pl: pl.run(a2, bs)) for k, pl in made.items()})
    autotune.note(ctx, f"{R} rows", name)
    if name == "native":
        return _NbitsNative(nat, b, scales, zero_points, K, N, nb, block_size, threads, cache=cache)
    return None


@kernel("MatMulNBits", 1, domain=MS, dtypes={"float32"}, check=_nbits_check)
def matmul_nbits(ctx, a, b, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits=4, block_size,
                 accuracy_level=0):
    """Y = A @ W^T (+ bias), W[n, k] = (q - zp) * scale per block of ``block_size`` along K;
    q: 4-bit codes packed two a byte (low nibble first) in B [N, n_blocks, block_size / 2];
    zp: packed uint8 [N * ceil(n_blocks / 2)], float of the scales' shape, or 8 when absent.
    Runs on ``_native.nbits_matmul`` (the codes as stored) or on the weight dequantized once,
    whichever was measured faster on this machine for the row count; accuracy_level 4 on a CPU
    with AVX-512 VNNI or AVX2: ``_native.nbits_int8_matmul`` (A quantized to int8 per block, int8 dots, as
    onnxruntime's CompInt8), the codes repacked once per session."""
    op = "MatMulNBits"
    if g_idx is not None:
        raise ValueError(f"{op}: g_idx is not implemented")
    nb = -(-K // block_size)
    if b.dtype != np.uint8 or b.size != N * nb * (block_size // 2):
        raise ValueError(f"{op}: B of shape {b.shape} ({b.dtype}) is not uint8 [N={N}, {nb}, {block_size // 2}]")
    if scales.size != N * nb:
        raise ValueError(f"{op}: scales has {scales.size} elements, expected N * n_blocks = {N * nb}")
    if a.shape[-1] != K:
        raise ValueError(f"{op}: A's last dim {a.shape[-1]} differs from K={K}")
    if bias is not None and bias.size != N:
        raise ValueError(f"{op}: bias has {bias.size} elements, expected N={N}")
    cache = getattr(ctx, "cache", None)
    const = cache is not None and all(_is_const(ctx, i, v) for i, v in ((1, b), (2, scales), (3, zero_points))
                                      if v is not None)
    if a.size == 0:  # an empty batch: no weight needed
        return np.zeros(a.shape[:-1] + (N,), a.dtype)
    a2 = np.ascontiguousarray(a.reshape(-1, K), dtype=_F32)
    nat = _nbits_native()
    if accuracy_level == 4 and _nbits_int8_fast(nat) and scales.dtype == _F32:
        # the model allows int8 compute (onnxruntime's CompInt8): a quantized per block, int8 dots
        packed = cache.get("nbits_int8") if const else None
        if packed is None:
            packed = _nbits_int8_pack(b, scales, zero_points, N, nb, block_size, op)
            if const:
                cache["nbits_int8"] = packed
        y = np.empty((a2.shape[0], N), _F32)
        nat.nbits_int8_matmul(a2, *packed, None if bias is None else np.ascontiguousarray(bias.reshape(N), _F32), y,
                              (a2.shape[0], K, N, block_size), max(1, int(getattr(ctx, "threads", 1))))
        return y.reshape(a.shape[:-1] + (N,)).astype(a.dtype, copy=False)
    if type(a) is np.ndarray:
        plans = cache.setdefault("nbits_plans", {}) if const else {}
        plan = plans.get(a2.shape[0])
        if plan is None:
            plan = _nbits_plan(ctx, a2, b, scales, zero_points, bias, K, N, nb, block_size, op,
                               cache if const else None) or "dequant"
            if const:
                plans[a2.shape[0]] = plan
        if plan != "dequant":
            y = plan.run(a2, None if bias is None else np.ascontiguousarray(bias.reshape(N), _F32))
            return y.reshape(a.shape[:-1] + (N,)).astype(a.dtype, copy=False)
    wt = cache.get("nbits_wt") if const else None
    if wt is None:
        wt = _nbits_weight(b, scales, zero_points, K, N, nb, block_size, op)
        if const:  # constant weights: dequantized once per session (float32, the float model's size)
            cache["nbits_wt"] = wt
    y = np.matmul(a.astype(_F32, copy=False), wt)
    if bias is not None:
        y += bias.astype(_F32).reshape(N)
    return y.astype(a.dtype, copy=False)


# -- contrib QuantizeLinear / DequantizeLinear ---------------------------------------------------

_QDQ_TYPES = {"float32", "float16"}


@kernel("QuantizeLinear", 1, domain=MS, dtypes=_QDQ_TYPES)
def ms_quantize_linear(ctx, x, y_scale, y_zero_point=None, *, axis=1, block_size=0, saturate=1):
    """onnxruntime's contrib QuantizeLinear: per tensor, per axis or blocked; the output type is
    the zero point's (int8/uint8/int16/uint16/int4/uint4), uint8 when it is absent."""
    out_dt = np.dtype(np.uint8) if y_zero_point is None else y_zero_point.dtype
    prec = _F32 if y_scale.dtype != np.float64 else np.dtype(np.float64)
    return _quantize(x, y_scale, y_zero_point, axis=axis, block_size=block_size, out_dt=out_dt,
                     saturate=saturate, prec=prec, op="com.microsoft.QuantizeLinear")


class _NodeView:
    """The attribute view ``_dequantize`` reads (no output_dtype: the scale's type)."""

    def __init__(self):
        self.attrs = {}
        self.since_version = 1


class _Ctx:
    node = _NodeView()


@kernel("DequantizeLinear", 1, domain=MS,
        dtypes={"int8", "uint8", "int16", "uint16", "int32", np.dtype(ml_dtypes.int4).name,
                np.dtype(ml_dtypes.uint4).name})
def ms_dequantize_linear(ctx, x, x_scale, x_zero_point=None, *, axis=1, block_size=0):
    """onnxruntime's contrib DequantizeLinear: (x - zero point) * scale, in the scale's type."""
    return _dequantize(_Ctx, x, x_scale, x_zero_point, axis=axis, block_size=block_size)
