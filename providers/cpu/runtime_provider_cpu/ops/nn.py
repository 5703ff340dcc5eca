"""CPU kernels: nn (MatMul/Gemm, convolutions, pooling, normalizations, softmax, dropout, resize).

Design notes
------------
* Float16 work is done in float32 (BLAS, and better accumulation) and cast back; float32
  stays float32 end to end (scalars are cast to the compute dtype before they meet arrays).
* Conv: im2col through ``sliding_window_view`` and one BLAS matmul per group (stacked
  ``np.matmul``); 1x1 kernels are a plain matmul over the (strided) input; depthwise
  convolutions (one input channel per group) in float32 run the compiled kernel of
  ``_native.c`` (one pass, bias included); other dtypes accumulate one vectorised
  multiply-add per kernel tap. ConvTranspose is one matmul per group followed by a col2im scatter-add
  per kernel tap.
* Pooling reduces strided views, one per kernel tap along one axis at a time (max, sum
  and Lp sums are separable), so no Python loop ever runs over output pixels.
* Resize follows onnxruntime's CPU kernel arithmetic: coordinates are computed in
  float32 with the same formulas, so the nearest pixel picked is the same.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..executable import binds, inplace_variant, pairs, siblings
from ..registry import kernel
from ._common import Scratch, mean_last, normalize_axis

try:  # the compiled kernels, built with the wheel; without them the numpy paths run
    from .. import _native
except ImportError as exc:  # pragma: no cover - only a build without a C compiler
    _native = None
    NATIVE_ERROR = f"{type(exc).__name__}: {exc}"
else:
    NATIVE_ERROR = None

_FLOAT = frozenset({"float16", "float32", "float64"})
_BF16 = frozenset({"bfloat16"})  # ml_dtypes.bfloat16: computed in float32, cast back
_MATMUL_TYPES = _FLOAT | {"int32", "int64", "uint32", "uint64"}
_F32 = np.float32


def _cdtype(dt) -> np.dtype:
    """Compute dtype for a float input dtype: float16 is computed in float32."""
    dt = np.dtype(dt)
    return np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)


def _as(x, dt):
    return x if x.dtype == dt else x.astype(dt)


def _attr(node, name, default=None):
    v = node.attrs.get(name)
    return default if v is None else v


def _in_dtype(node, i=0):
    info = node.input_info[i] if len(node.input_info) > i else None
    return None if info is None or info.dtype is None else np.dtype(info.dtype)


# ---------------------------------------------------------------------------------------
# MatMul / Gemm
# ---------------------------------------------------------------------------------------

#: float32 MatMul / Gemm by a weight that is the same array every run (an initializer) on
#: ``_native.linear`` (the weight packed once, on the kernel threads) from this many
#: multiply-adds; needs the AVX-512 build (``CONV_FAST``). Measured against numpy's threaded
#: OpenBLAS on this host, 2 threads: 128 x 768 x 3072 at 180-190 GFLOP/s against 150-170
_LINEAR = _native is not None and bool(getattr(_native, "CONV_FAST", 0))
_LINEAR_MIN_MACS = 1 << 18


def _linear_weight(ctx, w, trans):
    """``w`` ([K, N], or [N, K] with ``trans``; the node's input 1) packed for
    ``_native.linear`` and kept in the node's cache, where w is the partition's constant
    (an initializer: the same array every run, never written); else None (a weight computed
    or fed at run time, or an initializer the caller overrides)."""
    cache = getattr(ctx, "cache", None)
    if cache is None or not _is_const(ctx, 1, w):
        return None
    # the node's constant and its trans attribute are the same every run: packed once
    packed = cache.get("linear")
    if packed is None:
        packed = cache["linear"] = _pack_linear(w, trans)
    return packed


def _is_const(ctx, i, a):
    """Whether ``a``, the node's input ``i``, is the partition's constant for it (the same
    array every run, never written), so that what a kernel derives from it may be kept."""
    info = getattr(getattr(ctx, "node", None), "input_info", None)
    return info is not None and len(info) > i and info[i] is not None and getattr(info[i], "const", None) is a


def _pack_rows(w):
    """w [M, C] as ``_native.pointwise_lanes`` reads it: [ceil(M / 12), C, 12], zeros past M."""
    return np.ascontiguousarray(_blocked(w, 12).transpose(0, 2, 1))


def _empty64(shape):
    """An uninitialised float32 array of ``shape``, 64-byte aligned: the kernels load whole vectors."""
    n = math.prod(shape)
    raw = np.empty(n + 16, _F32)
    skip = (-raw.ctypes.data % 64) // 4
    return raw[skip:skip + n].reshape(shape)


def _pack_linear(w, trans):
    """w ([K, N], or [N, K] with ``trans``) as ``_native.linear`` reads it: [ceil(N / 32), K,
    32], zeros past N, 64-byte aligned; written straight from w (a transposed or padded
    temporary of a 50257-column weight was 154 MB more at the peak)."""
    N, K = w.shape if trans else w.shape[::-1]
    lanes = _native.CONV_LANES
    nb = -(-N // lanes)
    out = _empty64((nb, K, lanes))
    full = N // lanes
    if full:
        src = w[:full * lanes] if trans else w[:, :full * lanes]
        if trans:  # [N, K] -> [nb, K, lanes]: out[j, k, l] = w[j * lanes + l, k]
            out[:full] = src.reshape(full, lanes, K).transpose(0, 2, 1)
        else:      # [K, N] -> out[j, k, l] = w[k, j * lanes + l]
            out[:full] = src.reshape(K, full, lanes).transpose(1, 0, 2)
    if full < nb:
        out[full] = 0
        rest = N - full * lanes
        out[full, :, :rest] = w[full * lanes:].T if trans else w[:, full * lanes:]
    return out


def _linear(ctx, a, w, trans=False, bias=None):
    """a [..., K] times the weight w ([K, N], or [N, K] with ``trans``) on ``_native.linear``
    (plus ``bias`` [N]), or None where that does not apply (the caller uses numpy)."""
    if (not _LINEAR or _native is None or type(a) is not np.ndarray or type(w) is not np.ndarray
            or a.dtype != _F32 or w.dtype != _F32 or w.ndim != 2 or a.ndim < 1):
        return None
    N, K = w.shape if trans else w.shape[::-1]
    if a.shape[-1] != K or a.size == 0 or N == 0 or a.size * N < _LINEAR_MIN_MACS:
        return None
    wp = _linear_weight(ctx, w, trans)
    packed = wp is not None
    if not packed:
        if trans:
            return None
        wp = np.ascontiguousarray(w)  # a weight computed at run time: packed a chunk at a time
    R = a.size // K
    y = np.empty(a.shape[:-1] + (N,), _F32)
    _native.linear(np.ascontiguousarray(a), wp, bias, y, (R, K, N), getattr(ctx, "threads", 1), packed)
    return y


def _matmul(a, b):
    if a.ndim > 2 and b.ndim == 2:
        # one BLAS call over the folded batch instead of one per matrix
        lead = a.shape[:-1]
        y = np.matmul(a.reshape(-1, a.shape[-1]), b)
        return y.reshape(*lead, b.shape[1])
    return np.matmul(a, b)


@kernel("MatMul", 1, 9, 13, dtypes=_MATMUL_TYPES | _BF16)
def matmul(ctx, a, b):
    if a.dtype.name in ("float16", "bfloat16") or b.dtype.name in ("float16", "bfloat16"):
        return _matmul(a.astype(_F32), b.astype(_F32)).astype(a.dtype)
    if a.ndim >= 2 and b.ndim == 2 and a.dtype == _F32:
        y = _linear(ctx, a, b)
        if y is not None:
            return y
    return _matmul(a, b)


def _gemm6_check(node):
    if len(node.inputs) < 3 or not node.inputs[2]:
        return f"Gemm-{node.since_version}: input C is required"
    return None


@kernel("Gemm", 1, 6, dtypes=_FLOAT, check=_gemm6_check)
def gemm_6(ctx, a, b, c, *, alpha, beta, broadcast, transA, transB):
    # opsets 1 and 6 (same attributes and text; 1 only notes C "can be inplace", which is no
    # semantic difference): C is broadcast to (M, N) only when ``broadcast`` is set, else it
    # must be (M, N)
    v = ctx.node.since_version
    M = a.shape[1] if transA else a.shape[0]
    N = b.shape[0] if transB else b.shape[1]
    if broadcast:
        if np.broadcast_shapes(c.shape, (M, N)) != (M, N):
            raise ValueError(f"Gemm-{v}: C of shape {c.shape} does not broadcast to {(M, N)}")
    elif c.shape != (M, N):
        raise ValueError(f"Gemm-{v}: C must have shape {(M, N)} when broadcast=0, got {c.shape}")
    return gemm(ctx, a, b, c, alpha=alpha, beta=beta, transA=transA, transB=transB)


#: Gemm products of fewer multiply-adds than this skip BLAS (see ``gemm``)
_BLAS_MIN_MACS = 1 << 19
#: float32 Gemms of at most this many rows of A take ``_native.gemm_rows``
_ROWS_MAX = 8


@kernel("Gemm", 7, 9, 11, 13, dtypes=_MATMUL_TYPES)
def gemm(ctx, a, b, c=None, *, alpha, beta, transA, transB):
    A = a.T if transA else a
    B = b.T if transB else b
    dt = a.dtype
    use_c = c is not None and beta != 0.0
    if dt.kind == "f":
        cd = _cdtype(dt)
        A, B = _as(A, cd), _as(B, cd)
        src = b if transB else B  # B as stored: [N, K] with transB, else [K, N]
        if (_native is not None and cd == _F32 and 0 < A.shape[0] <= _ROWS_MAX and A.size and B.size
                and src.dtype == _F32 and src.flags.c_contiguous):
            # a classifier head at batch 1-8: the compiled kernel on the session's threads
            # (1 x 512 x 1000: 46 us against 111 for BLAS, 80 for einsum)
            y = np.empty((A.shape[0], B.shape[1]), _F32)
            _native.gemm_rows(np.ascontiguousarray(A), src, y, (A.shape[0], A.shape[1], B.shape[1]),
                              bool(transB), getattr(ctx, "threads", 1))
        elif not transA and (y := _linear(ctx, A, b, bool(transB))) is not None:
            pass  # a weight packed once, on the kernel threads
        elif A.shape[0] * A.shape[1] * B.shape[1] < _BLAS_MIN_MACS:
            # a small product of more rows: a BLAS call would wake its worker threads, which
            # then spin on the cores for milliseconds, taking them from the compiled kernels
            # of the next run (a 1 x 512 x 1000 head through BLAS: ResNet-18 48 -> 34 ms a
            # run); numpy's own loop is single-threaded, ~2.5x BLAS's time per call, hence
            # the small bound
            y = np.einsum("ij,jk->ik", A, B)
        else:
            y = np.matmul(A, B)
        if alpha != 1.0:
            y *= cd.type(alpha)
        if use_c:
            cc = _as(c, cd)
            if beta != 1.0:
                cc = cc * cd.type(beta)
            if y.shape == np.broadcast_shapes(y.shape, cc.shape):
                y += cc  # y is a fresh matmul result: add the bias in place
            else:
                y = y + cc
        return _as(y, dt)
    y = np.matmul(A, B)
    if alpha == 1.0 and (not use_c or beta == 1.0):
        if use_c:
            y = y + c.astype(dt, copy=False)
        return _as(y, dt)
    yf = y.astype(np.float64) * alpha
    if use_c:
        yf = yf + c.astype(np.float64) * beta
    return yf.astype(dt)


# ---------------------------------------------------------------------------------------
# shared geometry
# ---------------------------------------------------------------------------------------

def _ints(v, n, fill):
    return [fill] * n if not v else [int(i) for i in v]


def _split_same(total, auto_pad):
    small = total // 2
    return (small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small)


def _pad_const(x, begins, ends, value):
    """Pad (or crop, for negative amounts) the spatial axes (2:) of ``x``."""
    nd = len(begins)
    if not any(begins) and not any(ends):
        return x
    if any(p < 0 for p in list(begins) + list(ends)):
        sl = [slice(None), slice(None)]
        for b, e in zip(begins, ends):
            sl.append(slice(-b if b < 0 else 0, e if e < 0 else None))
        x = x[tuple(sl)]
        begins = [max(b, 0) for b in begins]
        ends = [max(e, 0) for e in ends]
        if not any(begins) and not any(ends):
            return x
    shape = list(x.shape[:2]) + [x.shape[2 + i] + begins[i] + ends[i] for i in range(nd)]
    out = np.full(shape, value, dtype=x.dtype)
    out[(slice(None), slice(None)) + tuple(slice(b, b + x.shape[2 + i])
                                           for i, b in enumerate(begins))] = x
    return out


def _tap_slice(off, stride, n_out):
    return slice(off, off + (n_out - 1) * stride + 1, stride)


# ---------------------------------------------------------------------------------------
# Conv
# ---------------------------------------------------------------------------------------

def _conv_check(node):
    ap = _attr(node, "auto_pad", "NOTSET")
    if ap not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        return f"{node.op_type}: auto_pad {ap!r} is not a valid value"
    if _attr(node, "group", 1) < 1:
        return f"{node.op_type}: group must be >= 1"
    return None


def _conv_pads(in_sp, k_eff, strides, pads, auto_pad):
    nd = len(in_sp)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        b, e = [], []
        for i in range(nd):
            out = -(-in_sp[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + k_eff[i] - in_sp[i])
            hb, he = _split_same(total, auto_pad)
            b.append(hb)
            e.append(he)
        return b, e
    if auto_pad == "VALID":
        return [0] * nd, [0] * nd
    p = _ints(pads, 2 * nd, 0)
    return p[:nd], p[nd:]


def _depthwise_2d(xp, wk, ks, strides, dilations, out, b=None):
    """2-D depthwise convolution (one input channel and one output channel per group) of the
    padded input ``xp`` [N, C, Hp, Wp] with ``wk`` [C, KH*KW]: one multiply and one add per
    kernel tap over *flat contiguous* rows, so numpy's inner loops run the whole image
    instead of one output row. A tap (i, j) of a stride-1 convolution reads the flattened
    input shifted by ``i*dh*Wp + j*dw``; the columns past the output width are computed and
    dropped. With stride s > 1 (no dilation) the input is first split into its s*s phases
    (rows and columns congruent mod s), each a contiguous image, and a tap reads the phase
    (i % s, j % s) shifted by (i // s, j // s): again a stride-1 shift. A bias ``b`` [C] is
    added by the copy that drops those columns (one pass fewer than adding it afterwards)."""
    N, C = xp.shape[:2]
    OH, OW = out
    sh, sw = strides
    if sh == 1 and sw == 1:
        phases = {(0, 0): xp}
        dh, dw = dilations
        tap = [((0, 0), i * dh, j * dw) for i in range(ks[0]) for j in range(ks[1])]
    else:
        phases = {}
        tap = []
        for i in range(ks[0]):
            for j in range(ks[1]):
                key = (i % sh, j % sw)
                if key not in phases:
                    phases[key] = None
                tap.append((key, i // sh, j // sw))
    # every phase as [N, C, PH, PW] with PW >= OW + max column shift, PH enough rows
    max_r = max(t[1] for t in tap)
    max_c = max(t[2] for t in tap)
    PH, PW = OH + max_r, OW + max_c
    if sh == 1 and sw == 1:
        src = xp[:, :, :PH, :PW]
        flat = {(0, 0): np.ascontiguousarray(src).reshape(N, C, PH * PW)}
    else:
        flat = {}
        for a, bb in phases:
            ph = xp[:, :, a::sh, bb::sw][:, :, :PH, :PW]
            if ph.shape[2] < PH or ph.shape[3] < PW:  # the last phases may be short: zero-fill
                full = np.zeros((N, C, PH, PW), dtype=xp.dtype)
                full[:, :, :ph.shape[2], :ph.shape[3]] = ph
                ph = full
            flat[(a, bb)] = np.ascontiguousarray(ph).reshape(N, C, PH * PW)
    L = (OH - 1) * PW + OW  # flat length covering every output pixel
    y = np.empty((N, C, OH * PW), dtype=xp.dtype)
    yl = y[:, :, :L]
    tmp = np.empty((N, C, L), dtype=xp.dtype)
    for kidx, (key, r, c) in enumerate(tap):
        off = r * PW + c
        src = flat[key][:, :, off:off + L]
        wv = wk[:, kidx].reshape(1, C, 1)
        if kidx == 0:
            np.multiply(src, wv, out=yl)
        else:
            np.multiply(src, wv, out=tmp)
            yl += tmp
    crop = y.reshape(N, C, OH, PW)[:, :, :, :OW]
    if b is None:
        return np.ascontiguousarray(crop)
    return np.add(crop, b.reshape(1, C, 1, 1).astype(crop.dtype, copy=False))


#: below this many output pixels per channel a depthwise convolution is one einsum over a
#: channels-last window view (a per-tap multiply-add over [C, pixels] rows pays numpy's
#: per-row loop overhead C * taps times; measured crossover between 28x28 and 56x56)
_DW_EINSUM_MAX_PIXELS = 1600


def _depthwise_einsum(x, w, strides, dilations, pb, pe, out):
    """Depthwise 2-D convolution (one channel per group) as ``einsum`` over a strided
    ``[N, KH, KW, OH, OW, C]`` window view of the zero-padded input in channels-last order:
    one pass whose inner loop runs along the channels with a per-channel weight, writing the
    NCHW result directly."""
    N, C, H, W = x.shape
    KH, KW = w.shape[2:]
    OH, OW = out
    xp = np.zeros((N, H + pb[0] + pe[0], W + pb[1] + pe[1], C), dtype=x.dtype)
    xp[:, pb[0]:pb[0] + H, pb[1]:pb[1] + W] = x.transpose(0, 2, 3, 1)
    sn, sh, sw, sc = xp.strides
    view = np.lib.stride_tricks.as_strided(
        xp, shape=(N, KH, KW, OH, OW, C),
        strides=(sn, dilations[0] * sh, dilations[1] * sw, strides[0] * sh, strides[1] * sw, sc),
        writeable=False)
    wt = np.ascontiguousarray(w.reshape(C, KH, KW).transpose(1, 2, 0))
    return np.einsum("nijhwc,ijc->nchw", view, wt)


def _tap_range(size, pad, off, stride, n_out):
    """Output positions ``o`` whose tap ``o * stride + off - pad`` falls inside ``[0, size)``."""
    lo = max(0, -(-(pad - off) // stride))
    hi = min(n_out, (size - 1 + pad - off) // stride + 1)
    return lo, max(lo, hi)


def _im2col_2d(x, ks, strides, dilations, pb, out):
    """The im2col matrix of a 2-D convolution as ``[C, KH, KW, N, OH, OW]`` in reused scratch
    memory (see ``Scratch``), read straight from the unpadded input: each kernel tap is one
    strided copy of the input rectangle it sees, and only the border strips that fall in the
    padding are zeroed. This is ~2x faster than copying a transposed ``sliding_window_view``
    of a padded copy (that copy runs inner loops over the kernel taps)."""
    N, C, H, W = x.shape
    KH, KW = ks
    OH, OW = out
    sh, sw = strides
    dh, dw = dilations
    cols = Scratch.get((C, KH, KW, N, OH, OW), x.dtype)
    if ((sh, sw) == (KH, KW) and dh == 1 and dw == 1 and pb[0] == 0 and pb[1] == 0
            and OH * KH <= H and OW * KW <= W):
        # non-overlapping patches (a ViT patch embedding, 16x16/16): the im2col matrix is a
        # transpose of the input, one copy (224x224: 1.5 -> 0.2 ms, against 256 tap copies)
        patches = x[:, :, :OH * KH, :OW * KW].reshape(N, C, OH, KH, OW, KW)
        np.copyto(cols, patches.transpose(1, 3, 5, 0, 2, 4))
        return cols
    if (sh > 1 or sw > 1) and dh == 1 and dw == 1 and KH * KW >= _PHASE_TAPS * sh * sw:
        return _im2col_phases(x, ks, strides, pb, out, cols)
    xt = x.transpose(1, 0, 2, 3)  # [C, N, H, W] view
    for i in range(KH):
        r0, r1 = _tap_range(H, pb[0], i * dh, sh, OH)
        for j in range(KW):
            c0, c1 = _tap_range(W, pb[1], j * dw, sw, OW)
            dst = cols[:, i, j]
            if r0 > 0:
                dst[:, :, :r0] = 0
            if r1 < OH:
                dst[:, :, r1:] = 0
            if c0 > 0:
                dst[:, :, r0:r1, :c0] = 0
            if c1 < OW:
                dst[:, :, r0:r1, c1:] = 0
            if r1 > r0 and c1 > c0:
                ir = r0 * sh + i * dh - pb[0]
                ic = c0 * sw + j * dw - pb[1]
                dst[:, :, r0:r1, c0:c1] = xt[:, :, ir:ir + (r1 - r0 - 1) * sh + 1:sh,
                                             ic:ic + (c1 - c0 - 1) * sw + 1:sw]
    return cols


#: a strided im2col splits the input into phases when it has at least this many taps per phase
_PHASE_TAPS = 4


def _im2col_phases(x, ks, strides, pb, out, cols):
    """``_im2col_2d`` of a strided convolution with many taps per phase (a 7x7 stride-2 stem):
    the zero-padded input is first split into its ``sh * sw`` phases (rows and columns
    congruent mod the stride, each a contiguous copy), so that every tap copies unit-stride
    rows of one phase instead of gathering every ``sw``-th element (a 224x224 7x7/2 stem:
    1.9 -> 0.8 ms; with few taps per phase, 3x3/2, the phase copies cost more than they save)."""
    N, C, H, W = x.shape
    KH, KW = ks
    OH, OW = out
    sh, sw = strides
    # pad the end just enough for the last output's taps (the convolution's own end padding
    # may be larger: those rows are never read)
    pe = [max(0, (OH - 1) * sh + KH - (H + pb[0])), max(0, (OW - 1) * sw + KW - (W + pb[1]))]
    xt = _pad_const(x, pb, pe, 0).transpose(1, 0, 2, 3)  # [C, N, Hp, Wp]
    phases = {}
    for i in range(KH):
        for j in range(KW):
            key = (i % sh, j % sw)
            ph = phases.get(key)
            if ph is None:
                ph = phases[key] = np.ascontiguousarray(xt[:, :, key[0]::sh, key[1]::sw])
            r, c = i // sh, j // sw
            cols[:, i, j] = ph[:, :, r:r + OH, c:c + OW]
    return cols


def _conv_out(in_sp, ks, strides, dilations, pb, pe) -> list:
    """The output's spatial sizes of a convolution (0 where the kernel does not fit)."""
    return [max(0, (in_sp[i] + pb[i] + pe[i] - (ks[i] - 1) * dilations[i] - 1) // strides[i] + 1)
            for i in range(len(in_sp))]


def _conv_core(x, w, b, group, strides, dilations, pb, pe, clip=None, z=None, threads=1):
    """The convolution of padded ``x`` by ``w`` plus ``b`` (plus ``z``, of the result's shape:
    a fused residual sum); ``clip`` = (lo, hi) then clips it (a fused Relu or Clip). Where the
    extension is built these are one pass over the result."""
    N, C = x.shape[:2]
    nd = x.ndim - 2
    M = w.shape[0]
    ks = w.shape[2:]
    k_eff = [(ks[i] - 1) * dilations[i] + 1 for i in range(nd)]
    out = _conv_out(x.shape[2:], ks, strides, dilations, pb, pe)
    if z is not None and z.shape != (N, M, *out):
        raise ValueError(f"FusedConv: Z of shape {z.shape} must have the output's shape {(N, M, *out)}")
    Cg, Mg = C // group, M // group
    P = math.prod(out)
    K = math.prod(ks)
    nonneg = nd == 2 and min(pb) >= 0 and min(pe) >= 0
    taps = nonneg and K > 1 and Cg * group == C and not (Cg == 1 and group > 1)
    dw_einsum = nonneg and Cg == 1 and Mg == 1 and group > 1 and P <= _DW_EINSUM_MAX_PIXELS
    native_dw = (_native is not None and nonneg and Cg == 1 and Mg == 1 and group > 1
                 and x.dtype == _F32 and z is None)
    # the im2col copies, the einsum and the compiled depthwise kernel pad themselves; every
    # other path reads a padded copy
    xp = None if (taps or dw_einsum or native_dw or N == 0 or P == 0 or M == 0) else _pad_const(x, pb, pe, 0)
    if N == 0 or P == 0 or M == 0:
        y = np.zeros((N, M, *out), dtype=x.dtype)
    elif native_dw:
        # the compiled depthwise kernel: one pass, bias included (see _native.c)
        y = np.empty((N, M, *out), dtype=_F32)
        lo, hi = (-np.inf, np.inf) if clip is None else clip
        _native.depthwise2d(np.ascontiguousarray(x), np.ascontiguousarray(w),
                            None if b is None else np.ascontiguousarray(b), y, x.shape, tuple(out),
                            tuple(ks), tuple(strides), tuple(dilations), (pb[0], pb[1]),
                            lo, hi)
        return y
    elif dw_einsum:
        y = _depthwise_einsum(x, w, strides, dilations, pb, pe, out)
    elif Cg == 1 and group > 1 and Mg == 1 and nd == 2 and (
            strides == [1, 1] or dilations == [1, 1]):
        y = _depthwise_2d(xp, w.reshape(group, K), ks, strides, dilations, out, b)
        b = None  # added by the crop
    elif Cg == 1 and group > 1:
        # depthwise (channel multiplier Mg): one multiply-add per kernel tap
        wk = w.reshape(group, Mg, K)
        y = tmp = None
        for kidx, offs in enumerate(np.ndindex(*ks)):
            sl = xp[(slice(None), slice(None)) + tuple(
                _tap_slice(offs[i] * dilations[i], strides[i], out[i]) for i in range(nd))]
            wv = wk[:, :, kidx].reshape((1, group, Mg) + (1,) * nd)
            if y is None:
                y = np.multiply(sl[:, :, None], wv)
                continue
            tmp = np.multiply(sl[:, :, None], wv, out=tmp)
            y += tmp
    else:
        if K == 1:
            sl = xp[(slice(None), slice(None)) + tuple(
                _tap_slice(0, strides[i], out[i]) for i in range(nd))]
            if N == 1:
                cols = sl.reshape(group, Cg, P)
            else:
                cols = sl.reshape(N, group, Cg, P).transpose(1, 2, 0, 3).reshape(group, Cg, N * P)
        elif taps:
            cols = _im2col_2d(x, ks, strides, dilations, pb, out).reshape(group, Cg * K, N * P)
        else:
            win = sliding_window_view(xp, k_eff, axis=tuple(range(2, 2 + nd)))
            win = win[(slice(None), slice(None))
                      + tuple(slice(None, (out[i] - 1) * strides[i] + 1, strides[i]) for i in range(nd))
                      + tuple(slice(None, None, dilations[i]) for i in range(nd))]
            # -> [C, *k, N, *out] so that one reshape gives [group, Cg*K, N*P]
            perm = (1,) + tuple(range(2 + nd, 2 + 2 * nd)) + (0,) + tuple(range(2, 2 + nd))
            cols = np.ascontiguousarray(win.transpose(perm)).reshape(group, Cg * K, N * P)
        wm = w.reshape(group, Mg, Cg * K)
        if (group == 1 and N == 1 and type(x) is np.ndarray and type(w) is np.ndarray  # host arrays only
                and x.dtype == _F32 and w.dtype == _F32 and _sgemm_ready()):
            # one image: the compiled pointwise kernel on the GEMM (single-threaded sgemm a
            # block on the kernel threads, bias, sum and clip in its epilogue; numpy's threaded
            # BLAS would wake worker threads that spin through the next nodes)
            lo, hi = (-np.inf, np.inf) if clip is None else clip
            y = np.empty((1, M, *out), _F32)
            _native.pointwise(np.ascontiguousarray(wm[0]), np.ascontiguousarray(cols[0]),
                              None if b is None else np.ascontiguousarray(b, dtype=_F32),
                              None if z is None else np.ascontiguousarray(z, dtype=_F32).reshape(M, P), y,
                              (M, Cg * K, P), float(lo), float(hi), max(1, int(threads)))
            return y
        y = np.matmul(wm, cols)  # [group, Mg, N*P]
        if N == 1:
            y = y.reshape(1, M, *out)
        else:
            y = np.ascontiguousarray(y.reshape(M, N, P).transpose(1, 0, 2)).reshape(N, M, *out)
    y = y.reshape(N, M, *out)
    if b is None and clip is None and z is None:
        return y
    if _native is not None and y.dtype == _F32 and y.flags.c_contiguous:  # z has y's dtype
        lo, hi = (-np.inf, np.inf) if clip is None else clip
        bb = None if b is None else np.ascontiguousarray(b, dtype=_F32)
        zz = None if z is None else np.ascontiguousarray(z)
        for n in range(N):  # bias, sum and clip in one pass
            _native.bias_clip(y[n], bb, (M, P), lo, hi, None if zz is None else zz[n])
        return y
    if b is not None:
        y += b.reshape((M,) + (1,) * nd).astype(y.dtype, copy=False)
    if z is not None:
        y += z
    if clip is not None:
        np.clip(y, y.dtype.type(clip[0]), y.dtype.type(clip[1]), out=y)
    return y


@kernel("Conv", 1, 11, 22, dtypes=_FLOAT, check=_conv_check)
@binds
def conv(ctx, x, w, b=None, *, auto_pad, dilations, group, kernel_shape, pads, strides):
    cache = plan_cache(ctx, w, b)
    y = conv_clipped(x, w, b, None, auto_pad=auto_pad, dilations=dilations, group=group,
                     kernel_shape=kernel_shape, pads=pads, strides=strides, cache=cache,
                     threads=getattr(ctx, "threads", 1))
    bind_plan(cache, conv, dict(auto_pad=auto_pad, dilations=dilations, group=group,
                                kernel_shape=kernel_shape, pads=pads, strides=strides))
    return y


def plan_cache(ctx, w, b):
    """The node's cache for its conv plan, or None (no plan, the general path every run): a
    plan keeps what it derived from the weights (packed copies), so only weights and bias
    that are the partition's constants may have one. A weight fed at run time can be the
    same array written in place between runs; a plan keyed on its identity read the old
    values (Linear tests the same way, ``_linear``). A caller without a context: no plan."""
    cache = getattr(ctx, "cache", None)
    if cache is None or not _is_const(ctx, 1, w) or (b is not None and not _is_const(ctx, 2, b)):
        return None
    return cache


def bind_plan(cache, kernel_fn, attrs):
    """Once per node (``cache`` from :func:`plan_cache`, None: nothing): ``cache["bound"]``
    (see :func:`~runtime_provider_cpu.executable.binds`), the node's plan run straight on
    the inputs it takes (:meth:`_ConvPlan.takes`, conv_clipped's own test), else
    ``kernel_fn(ctx, *inputs, **attrs)``. None when the first run made no plan."""
    if cache is None or "bound" in cache:
        return
    plan = cache.get("conv_plan")
    if plan is None or plan.kind is None:
        cache["bound"] = None
        return
    fast, xshape, W, B, shape = plan.fast_call(), plan.xshape, plan.w, plan.b, plan.shape
    takes_z = plan.kind in _ConvPlan.Z_KINDS

    def bound(ctx, x, w, b=None, *z):  # z: FusedConv's residual, when given
        # what plan.takes asks, inline (a bound Conv is ~2 us of Python; each call counts)
        if x.shape == xshape and w is W and b is B:
            if not z:
                return fast(x, None)
            if takes_z and len(z) == 1 and z[0].shape == shape and z[0].dtype == _F32:
                return fast(x, z[0])
        return kernel_fn(ctx, x, w, b, *z, **attrs)

    cache["bound"] = bound


def _plan_takes(plan, args):
    """Whether a fused step's ``plan`` takes this node's inputs ``(x, w[, b])`` (no residual)."""
    return len(args) <= 3 and plan.takes(args[0], args[1], args[2] if len(args) > 2 else None, None)


def _contig(x):
    return x if x.flags.c_contiguous else np.ascontiguousarray(x)


#: an expansion (1x1) and the 3x3 depthwise convolution that alone reads it, one image:
#: ``_native.expand_dw``, the expanded tensor never whole (see _fuse_expand_depthwise)
_EXPAND_DW = True


@pairs
def _fuse_expand_depthwise(ca, cb):
    """An inverted-residual block's expansion and depthwise convolution as one call of
    ``_native.expand_dw`` (AVX-512): both nodes planned (``_ConvPlan``) on the compiled pointwise
    kernel and the phase-plane depthwise one (3x3, stride 1 or 2 both ways, no dilation) for
    one image, the second reading the first's output shape. In the model: MobileNetV2's 96-
    channel 112 x 112 stride-2 block no longer writes and reads back 4.8 MB."""
    pa, pb = ca.cache.get("conv_plan"), cb.cache.get("conv_plan")
    if (not _EXPAND_DW or pa is None or pb is None or not getattr(_native, "CONV_FAST", 0)
            or not hasattr(_native, "expand_dw") or pa.kind != "pointwise" or pa.sub is not None
            or pa.w12 is None or pb.kind != "depthwise" or pa.xshape[0] != 1 or pb.xshape != pa.shape):
        return None
    _, out, ks, strides, dilations, pads, lo, hi, threads = pb.args
    if ks != (3, 3) or strides[0] != strides[1] or strides[0] not in (1, 2) or tuple(dilations) != (1, 1):
        return None
    M, C, H, W = pa.shape[1], pa.xshape[1], pa.xshape[2], pa.xshape[3]
    geometry = ((M, C, H, W), (out[0], out[1], strides[0], pads[0], pads[1]), lo, hi, pa.threads)
    lo1, hi1 = pa.args[1], pa.args[2]
    w12, b1, wd, bd, shape = pa.w12, pa.b2, pb.w2, pb.b2, pb.shape

    def run(args_a, args_b):
        if (len(args_b) > 2 or args_b[0] is not pb.w or (args_b[1] if len(args_b) > 1 else None) is not pb.b
                or not _plan_takes(pa, args_a)):
            return None
        y = np.empty(shape, _F32)
        _native.expand_dw(w12, _contig(args_a[0]), b1, lo1, hi1, wd, bd, y, *geometry)
        return y

    return run


#: a dense convolution and the 3x3 stride-2 MaxPool (padded by 1) that alone reads it, one
#: image: ``_native.conv_maxpool`` (see _fuse_conv_maxpool)
_CONV_MAXPOOL = True


@pairs
def _fuse_conv_maxpool(ca, cb):
    """A stem and its pool (ResNet's 7x7 stride-2 convolution and 3x3 stride-2 MaxPool) as
    one call of ``_native.conv_maxpool`` (AVX-512): the convolution planned on the direct
    kernel's position tiles for one image, the pool 3x3, stride 2, padded by 1 on every side,
    no dilation, no ceil mode and no Indices output. Its 3.2 MB output at 112 x 112 is no
    longer written and read back."""
    pa = ca.cache.get("conv_plan")
    node = cb.node
    if (not _CONV_MAXPOOL or pa is None or pa.kind != "direct" or pa.args[-1] or pa.xshape[0] != 1
            or tuple(pa.args[3]) != (1, 1) or node.op_type != "MaxPool" or node.domain not in ("", "ai.onnx")
            or not getattr(_native, "CONV_FAST", 0) or not hasattr(_native, "conv_maxpool")):
        return None
    at = node.attrs
    if (list(at.get("kernel_shape") or ()) != [3, 3] or list(at.get("strides") or ()) != [2, 2]
            or list(at.get("pads") or ()) != [1, 1, 1, 1] or list(at.get("dilations") or [1, 1]) != [1, 1]
            or at.get("ceil_mode") or (at.get("auto_pad") or "NOTSET") != "NOTSET"
            or len([o for o in node.outputs if o]) != 1):
        return None
    xshape, mk, strides, _, pads, out, lo, hi, threads, _ = pa.args
    pooled = ((out[0] - 1) // 2 + 1, (out[1] - 1) // 2 + 1)
    geometry = (xshape[1:], mk, tuple(strides), pads, out, lo, hi, pooled, threads)
    w2, b2, shape = pa.w2, pa.b2, (1, mk[0]) + pooled

    def run(args_a, args_b):
        if args_b or not _plan_takes(pa, args_a):
            return None
        y = np.empty(shape, _F32)
        _native.conv_maxpool(_contig(args_a[0]), w2, b2, y, *geometry)
        return y

    return run


#: a strided 3x3 convolution and the strided 1x1 one beside it on the same input (ResNet's
#: downsampling block): one ``_native.conv2d`` call (see _fuse_conv_shortcut)
_CONV_SHORTCUT = True


@siblings
def _fuse_conv_shortcut(ca, cb):
    """A downsampling block's first convolution (the direct kernel, one image) and its
    shortcut, a 1x1 convolution of the same strides and output size on the same input
    (pointwise plan on the subsampled image), as one ``_native.conv2d`` call with ``extra``:
    the shortcut reads the phase planes the first one filled, at the window position of
    input (0, 0) (its top and left pads), instead of numpy's strided copy of the input and a
    kernel of its own. Bit-identical to the two steps."""
    pa, pb = ca.cache.get("conv_plan"), cb.cache.get("conv_plan")
    if (not _CONV_SHORTCUT or pa is None or pb is None or pa.kind != "direct" or pb.kind != "pointwise"
            or pb.sub is None or pa.xshape != pb.xshape or pa.xshape[0] != 1 or pa.shape[2:] != pb.shape[2:]
            or tuple(pa.args[2]) != tuple(pb.sub)):
        return None
    xshape, mk, strides, dilations, pads, out, lo, hi, threads, lanes = pa.args
    if pads[0] > (mk[1] - 1) * dilations[0] or pads[1] > (mk[2] - 1) * dilations[1]:
        return None
    M2, C = pb.w2.shape
    w4 = pb.w2.reshape(M2, C, 1, 1)
    wp2 = _pack_lanes(w4) if lanes else _pack_direct(w4)
    fn, w2, b2, shape_a, shape_b, args = _native.conv2d, pa.w2, pa.b2, pa.shape, pb.shape, pa.args
    extra_tail = (M2, pads[0], pads[1], pb.args[1], pb.args[2], lanes)

    def run(args_a, args_b):
        if not _plan_takes(pa, args_a) or not _plan_takes(pb, args_b):
            return None
        ya, yb = np.empty(shape_a, _F32), np.empty(shape_b, _F32)
        fn(_contig(args_a[0]), w2, b2, None, ya, *args, (wp2, pb.b2, None, yb) + extra_tail)
        return ya, yb

    return run


#: the compiled direct convolution (``_native.conv2d``) takes dense float32 convolutions of
#: stride at most 2 (but 1x1 stride 1, a plain GEMM) with at least this many terms a sum
#: (C * KH * KW). An RGB 3x3 stem (27) takes it since its epilogue is vectorized: MobileNetV2
#: 0.94-0.96x the time of im2col and one GEMM for it (/tmp/w/abl.py); it was 64 before
_DIRECT_MIN_K = 16
#: whether the direct convolution is taken: where its AVX-512 build runs (elsewhere im2col and
#: a BLAS GEMM are faster; the tests turn it on everywhere to check its results)
_DIRECT = _native is not None and bool(getattr(_native, "CONV_FAST", 0))
#: outputs at most this wide, with at least _LANES_MIN_K terms a sum, take the direct kernel
#: with the output channels in the vector lanes: no column past the output's width is
#: computed (the position tiles compute Wq >= OW + 2 columns a row). Measured on ResNet-18's
#: shapes, 2 threads: 7 x 7 0.81x the time, 14 x 14 0.82-0.92x, 28 x 28 0.90-0.94x, 56 x 56
#: 1.0x, and its 7 x 7 stem (147 terms a sum, the transposing epilogue not paid back) 1.14x
_LANES_MAX_OW = 32
_LANES_MIN_K = 256
#: 3x3 stride-1 convolutions at least this wide, with at least _WINO_MIN_C input channels,
#: take Winograd's F(2x2, 3x3) (``_native.winograd3x3``: 2.25x fewer multiply-adds, plus the
#: transforms). Measured against the direct kernel on this host, 2 threads: ResNet's 56 x 56
#: 0.63-0.69x the time, 28 x 28 0.70-0.71x, 14 x 14 1.17x and 7 x 7 2.2x (tiles come 48 a
#: block, and its weights are 16/9 as large), a 16-channel 9 x 11 0.95x
_WINO_MIN_OW = 24
_WINO_MIN_C = 32
#: narrower ones, from _WINO_LANES_OW[0] to [1] wide with at least _WINO_LANES_MIN_C input
#: channels, take it with the output channels in the lanes (``lanes=True``: the tiles
#: compact, 12 a GEMM tile, where 48 a block left ResNet's 14 x 14 half waste). Measured
#: in the same process, 2 threads, against the direct kernel: 256 x 14 x 14 0.74-0.76x the time,
#: 128 x 14 x 14 0.88x, 256 x 10 x 10 0.80x; 64 x 14 x 14 1.12x and 512 x 7 x 7 1.04x (so not
#: those); at 28 x 28 and wider the blocks of 48 are full and 1.5-2x faster than this
_WINO_LANES_OW = (10, 16)
_WINO_LANES_MIN_C = 128


def _blocked(w, mr):
    """Weights [M, ...] as float32 [ceil(M / mr), mr, K] (K the rest), zeros past M."""
    M = w.shape[0]
    K = w.size // M if M else 0
    mb = -(-M // mr)
    wp = np.zeros((mb * mr, K), _F32)
    wp[:M] = w.reshape(M, K)
    return wp.reshape(mb, mr, K)


def _pack_direct(w):
    """Dense conv weights [M, C, KH, KW] as ``_native.conv2d`` reads them:
    [ceil(M / CONV_MR), C * KH * KW, CONV_MR], zeros past M."""
    return np.ascontiguousarray(_blocked(w, _native.CONV_MR).transpose(0, 2, 1))


def _pack_lanes(w):
    """Dense conv weights [M, C, KH, KW] as ``_native.conv2d(..., lanes=True)`` reads them:
    [ceil(M / CONV_LANES), C * KH * KW, CONV_LANES], zeros past M, 64-byte aligned (the
    kernel loads them as whole vectors): the Linear's layout of w as [M, C * KH * KW]."""
    return _pack_linear(w.reshape(w.shape[0], -1), True)


#: Winograd F(2x2, 3x3) transforms: U = G g G^T (weights), V = B^T d B (input patches),
#: Y = A^T M A (outputs)
_WINO_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])


def _winograd_u(w):
    """G g G^T of dense 3x3 conv weights [M, C, 3, 3], computed in float64: [16, M, C]."""
    M, C = w.shape[:2]
    return np.einsum("ik,mckl,jl->ijmc", _WINO_G, w.astype(np.float64), _WINO_G).reshape(16, M, C)


def _pack_winograd(w):
    """Dense 3x3 conv weights [M, C, 3, 3] as ``_native.winograd3x3`` reads them: G g G^T
    (``_winograd_u``), packed [16][ceil(M / CONV_MR)][C][CONV_MR], zeros past M."""
    mr = _native.CONV_MR
    M, C = w.shape[:2]
    mb = -(-M // mr)
    u = _winograd_u(w)
    up = np.zeros((16, mb * mr, C), _F32)
    up[:, :M] = u
    return np.ascontiguousarray(up.reshape(16, mb, mr, C).transpose(0, 1, 3, 2))


def _pack_winograd_lanes(w):
    """Dense 3x3 conv weights [M, C, 3, 3] as ``_native.winograd3x3(..., lanes=True)`` reads
    them: G g G^T packed [16][ceil(M / CONV_LANES)][C][CONV_LANES], zeros past M, 64-byte
    aligned (each of the 16 the Linear's layout of that [M, C] matrix)."""
    M, C = w.shape[:2]
    lanes = _native.CONV_LANES
    u = _winograd_u(w).astype(_F32)
    out = _empty64((16, -(-M // lanes), C, lanes))
    for xi in range(16):
        out[xi] = _pack_linear(u[xi], True)
    return out


_SGEMM: list = []  # [controller of the library or None], once decided


def _sgemm_control():
    """The threadpoolctl controller of the BLAS library whose sgemm ``_native.pointwise``
    calls (SciPy's, taken from ``scipy.linalg.cython_blas``), or None where that is not to
    be had: then pointwise convolutions stay on numpy's matmul. Decided once."""
    if not _SGEMM:
        ctl = None
        try:
            import os

            from scipy.linalg import cython_blas
            from threadpoolctl import ThreadpoolController

            path = _native.set_sgemm(cython_blas.__pyx_capi__["sgemm"])
            if path:
                real = os.path.realpath(path)
                for lib in ThreadpoolController().lib_controllers:
                    if os.path.realpath(lib.filepath) == real:
                        ctl = lib
        except Exception:  # no SciPy BLAS capsule, or a library threadpoolctl does not know
            ctl = None
        _SGEMM.append(ctl)
    return _SGEMM[0]


def _sgemm_ready():
    """Whether SciPy's sgemm is there for the compiled kernels that call it on the kernel
    threads (``_native.pointwise``, ``_native.mha``), that library then set to one thread
    (a session of other intra_op_num_threads sets every BLAS library it finds)."""
    if not _POINTWISE_NATIVE or _native is None:
        return False
    ctl = _sgemm_control()
    if ctl is None:
        return False
    if ctl.get_num_threads() != 1:
        ctl.set_num_threads(1)
    return True


#: pointwise convolutions on ``_native.pointwise`` (single-threaded sgemm a block, on the
#: kernel threads) where SciPy's BLAS is found; else numpy's matmul
_POINTWISE_NATIVE = True
_PW_LANES = True


class _ConvPlan:
    """What one Conv node does for one input shape, decided on its first run (float32,
    2-D): a dense 3x3 stride-1 convolution wide enough is Winograd, another dense one with
    several taps the compiled direct kernel (weights packed once, any batch, bias, residual
    and clip in the epilogue, on ``threads`` threads); for one image, a 1x1 stride-1 unpadded
    convolution is the compiled pointwise kernel (or one GEMM plus the compiled epilogue
    without SciPy's BLAS) and a depthwise one the compiled depthwise kernel; anything else
    (``kind`` None) takes the general path. Later runs with the same shape, weights and bias go
    straight to it. The prepared weights are kept with the arrays they came from, so only
    weights and bias that are the partition's constants get a plan (``plan_cache``): a
    weight fed at run time may be the same array with new values."""

    __slots__ = ("xshape", "w", "b", "clip", "kind", "w2", "w12", "b2", "shape", "args", "threads", "sub",
                 "_call")
    #: the kinds whose kernels add a residual in their epilogue
    Z_KINDS = ("pointwise", "direct", "winograd")

    def __init__(self, x, w, b, clip, group, strides, dilations, pb, pe, threads=1):
        self.xshape, self.w, self.b, self.clip, self.kind, self._call = x.shape, w, b, clip, None, None
        if (_native is None or x.dtype != _F32 or w.dtype != _F32 or x.ndim != 4
                or (b is not None and b.shape != (w.shape[0],))):
            return
        N, C, H, W = x.shape
        M = w.shape[0]
        ks = tuple(w.shape[2:])
        lo, hi = (-np.inf, np.inf) if clip is None else clip
        self.b2 = None if b is None else np.ascontiguousarray(b, dtype=_F32)
        out = tuple(_conv_out(x.shape[2:], ks, strides, dilations, pb, pe))
        wino = (_DIRECT and group == 1 and ks == (3, 3) and list(strides) == [1, 1] and list(dilations) == [1, 1]
                and min(pb) >= 0 and min(pe) >= 0 and N > 0)
        wide = wino and C >= _WINO_MIN_C and out[1] >= _WINO_MIN_OW
        lanes = (wino and C >= _WINO_LANES_MIN_C and _WINO_LANES_OW[0] <= out[1] <= _WINO_LANES_OW[1])
        if wide or lanes:
            self.kind = "winograd"
            self.w2 = _pack_winograd_lanes(w) if lanes else _pack_winograd(w)
            self.shape = (N, M) + out
            self.args = (x.shape, M, (pb[0], pb[1]), out, float(lo), float(hi), max(1, int(threads)), lanes)
        elif (N == 1 and ks == (1, 1) and group == 1 and max(strides) > 1 and not any(pb) and not any(pe)
              and _PW_LANES and _LINEAR):
            # a strided 1x1 (ResNet's downsampling shortcut): the pointwise kernel on the
            # subsampled image (128 x 28 x 28 from 64 x 56 x 56: 198 -> ~70 us; the direct
            # kernel's phase planes cost more than its few multiply-adds)
            self.kind = "pointwise"
            self.sub = (int(strides[0]), int(strides[1]))
            self.w2 = np.ascontiguousarray(w.reshape(M, C))
            self.w12 = _pack_rows(self.w2)
            self.shape = (N, M) + out
            self.args = ((M, out[0] * out[1]), float(lo), float(hi))
            self.threads = max(1, int(threads))
        elif (_DIRECT and group == 1 and (ks != (1, 1) or max(strides) > 1) and C * ks[0] * ks[1] >= _DIRECT_MIN_K
                and max(strides) <= 2
                and min(pb) >= 0 and min(pe) >= 0 and min(out) > 0 and N > 0):
            self.kind = "direct"
            lanes = out[1] <= _LANES_MAX_OW and C * ks[0] * ks[1] >= _LANES_MIN_K
            self.w2 = _pack_lanes(w) if lanes else _pack_direct(w)
            self.shape = (N, M) + out
            self.args = (x.shape, (M,) + ks, tuple(strides), tuple(dilations), (pb[0], pb[1]), out,
                         float(lo), float(hi), max(1, int(threads)), lanes)
        elif N != 1:
            return
        elif ks == (1, 1) and group == 1 and list(strides) == [1, 1] and not any(pb) and not any(pe):
            self.kind = "pointwise"
            self.sub = None
            self.w2 = np.ascontiguousarray(w.reshape(M, C))
            self.w12 = _pack_rows(self.w2) if _PW_LANES and _LINEAR else None
            self.shape = (N, M, H, W)
            self.args = ((M, H * W), float(lo), float(hi))
            self.threads = max(1, int(threads))
        elif w.shape[1] == 1 and M == C == group and group > 1 and min(pb) >= 0 and min(pe) >= 0:
            if min(out) > 0:
                self.kind = "depthwise"
                self.w2 = np.ascontiguousarray(w)
                self.shape = (N, M) + out
                self.args = (x.shape, out, ks, tuple(strides), tuple(dilations), (pb[0], pb[1]),
                             float(lo), float(hi), max(1, int(threads)))

    def takes(self, x, w, b, z):
        """Whether ``run`` computes this node's convolution of these inputs: a plan, made for
        x's shape and these weight arrays; a residual only on the kernels with an epilogue."""
        return (self.kind is not None and x.shape == self.xshape and w is self.w and b is self.b
                and (z is None or (self.kind in self.Z_KINDS and z.shape == self.shape and z.dtype == _F32)))

    def fast_call(self):
        """The plan's convolution as one closure ``call(x, z)`` (z None or a residual ``takes``
        accepts), the kernel and its arguments fixed once, on first use: what ``run`` and the
        bound step (``bind_plan``) call."""
        if self._call is None:
            self._call = self._make_call()
        return self._call

    def run(self, x, z=None):
        """The convolution of ``x`` (plus ``z``: pointwise, direct and winograd plans only)."""
        return self.fast_call()(x, z)

    def _make_call(self):
        empty, f32, contig, shape = np.empty, _F32, np.ascontiguousarray, self.shape
        w2, b2, args = self.w2, self.b2, self.args
        if self.kind in ("direct", "winograd"):
            fn = _native.conv2d if self.kind == "direct" else _native.winograd3x3

            def call(x, z):
                if not x.flags.c_contiguous:
                    x = contig(x)
                y = empty(shape, f32)
                fn(x, w2, b2, None if z is None else contig(z), y, *args)
                return y
            return call
        if self.kind == "depthwise":
            fn = _native.depthwise2d

            def call(x, z):
                if not x.flags.c_contiguous:
                    x = contig(x)
                y = empty(shape, f32)
                fn(x, w2, b2, y, *args)
                return y
            return call
        # pointwise: the lanes kernel, else SciPy's sgemm a block, else one GEMM and the epilogue
        w12, th, sub = self.w12, self.threads, self.sub
        (M, P), lo, hi = args[0], args[1], args[2]
        dims = (M, self.xshape[1], P)
        if w12 is not None and sub is None:
            fn = _native.pointwise_lanes

            def call(x, z):
                if not x.flags.c_contiguous:
                    x = contig(x)
                y = empty(shape, f32)
                fn(w12, x, b2, None if z is None else contig(z), y, dims, lo, hi, th)
                return y
            return call

        def call(x, z):
            if sub is not None:  # a strided 1x1: the subsampled image
                x = x[:, :, ::sub[0], ::sub[1]]
            if not x.flags.c_contiguous:
                x = contig(x)
            zz = None if z is None else contig(z)
            if w12 is not None:
                y = empty(shape, f32)
                _native.pointwise_lanes(w12, x, b2, zz, y, dims, lo, hi, th)
                return y
            if _sgemm_ready():
                y = empty(shape, f32)
                _native.pointwise(w2, x, b2, zz, y, dims, lo, hi, th)
                return y
            y = np.matmul(w2, x.reshape(dims[1], P))
            if zz is None:
                _native.bias_clip(y, b2, *args)
            else:
                _native.bias_clip(y, b2, *args, zz)
            return y.reshape(shape)
        return call


def conv_clipped(x, w, b, clip, *, auto_pad, dilations, group, kernel_shape, pads, strides, z=None,
                 cache=None, threads=1):
    """Conv plus ``z`` when given, then clipped to ``clip`` = (lo, hi) when given (FusedConv's
    sum and Relu / Clip). ``cache`` (the node's) keeps what the first run decided for the
    input's shape (:class:`_ConvPlan`); ``threads`` bounds the compiled kernels' threads."""
    if cache is not None:
        plan = cache.get("conv_plan")
        if plan is None or plan.xshape != x.shape or plan.w is not w or plan.b is not b or plan.clip != clip:
            plan = None
            if x.ndim == 4 and x.shape[1] == w.shape[1] * group and w.ndim == 4:
                st, dl = _ints(strides, 2, 1), _ints(dilations, 2, 1)
                k_eff = [(w.shape[2 + i] - 1) * dl[i] + 1 for i in range(2)]
                pb, pe = _conv_pads(x.shape[2:], k_eff, st, pads, auto_pad)
                plan = _ConvPlan(x, w, b, clip, group, st, dl, pb, pe, threads)
                cache["conv_plan"] = plan
        if plan is not None and plan.takes(x, w, b, z):
            return plan.run(x, z)
    nd = x.ndim - 2
    if nd < 1:
        raise ValueError(f"Conv needs an input of rank >= 3, got shape {x.shape}")
    strides = _ints(strides, nd, 1)
    dilations = _ints(dilations, nd, 1)
    ks = w.shape[2:]
    k_eff = [(ks[i] - 1) * dilations[i] + 1 for i in range(nd)]
    pb, pe = _conv_pads(x.shape[2:], k_eff, strides, pads, auto_pad)
    if x.shape[1] != w.shape[1] * group:
        raise ValueError(f"Conv: input channels {x.shape[1]} != W.shape[1] {w.shape[1]} * group {group}")
    dt = x.dtype
    cd = _cdtype(dt)
    y = _conv_core(_as(x, cd), _as(w, cd), None if b is None else _as(b, cd), group, strides,
                   dilations, pb, pe, clip, z if z is None else _as(z, cd), threads)
    return _as(y, dt)


# ---------------------------------------------------------------------------------------
# ConvTranspose
# ---------------------------------------------------------------------------------------

@kernel("ConvTranspose", 1, 11, 22, dtypes=_FLOAT, check=_conv_check)
def conv_transpose(ctx, x, w, b=None, *, auto_pad, dilations, group, kernel_shape,
                   output_padding, output_shape, pads, strides):
    v1 = ctx.node.since_version == 1
    N, C = x.shape[:2]
    nd = x.ndim - 2
    strides = _ints(strides, nd, 1)
    dilations = _ints(dilations, nd, 1)
    opad = _ints(output_padding, nd, 0)
    ks = w.shape[2:]
    in_sp = x.shape[2:]
    Mg = w.shape[1]
    M = Mg * group
    Cg = C // group
    if w.shape[0] != C:
        raise ValueError(f"ConvTranspose: W.shape[0] {w.shape[0]} != input channels {C}")
    full = [(in_sp[i] - 1) * strides[i] + (ks[i] - 1) * dilations[i] + 1 + opad[i] for i in range(nd)]
    if output_shape:
        osh = [int(v) for v in output_shape]
        osh = osh[-nd:] if len(osh) == nd + 2 else osh
        pb, pe, out = [], [], []
        for i in range(nd):
            total = max(0, full[i] - osh[i])
            small = total // 2
            upper_first = (auto_pad == "SAME_UPPER") != v1  # v1 documents the opposite split
            hb = small if upper_first else total - small
            pb.append(hb)
            pe.append(total - hb)
            out.append(osh[i])
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pb, pe, out = [], [], []
        for i in range(nd):
            target = in_sp[i] * strides[i]
            total = max(0, full[i] - target)
            small = total // 2
            upper_first = (auto_pad == "SAME_UPPER") != v1
            hb = small if upper_first else total - small
            pb.append(hb)
            pe.append(total - hb)
            out.append(full[i] - total)  # == target unless the kernel is too small to reach it
    else:
        p = [0] * (2 * nd) if auto_pad == "VALID" else _ints(pads, 2 * nd, 0)
        pb, pe = p[:nd], p[nd:]
        out = [full[i] - pb[i] - pe[i] for i in range(nd)]
    dt = x.dtype
    cd = _cdtype(dt)
    xc, wc = _as(x, cd), _as(w, cd)
    P = math.prod(in_sp)
    K = math.prod(ks)
    # one matmul per group: [group, Mg*K, Cg] @ [group, Cg, N*P]
    if N == 1:
        xg = xc.reshape(group, Cg, P)
    else:
        xg = xc.reshape(N, group, Cg, P).transpose(1, 2, 0, 3).reshape(group, Cg, N * P)
    wg = wc.reshape(group, Cg, Mg * K).transpose(0, 2, 1)
    cols = np.matmul(wg, xg).reshape(group * Mg, K, N, *in_sp)
    # col2im: the output window we keep is [pb, pb + out) of the full (uncropped) result
    ext = [max(full[i], pb[i] + out[i]) - min(0, pb[i]) for i in range(nd)]
    shift = [-min(0, pb[i]) for i in range(nd)]
    yfull = np.zeros((M, N, *ext), dtype=cd)
    for kidx, offs in enumerate(np.ndindex(*ks)):
        sl = (slice(None), slice(None)) + tuple(
            _tap_slice(shift[i] + offs[i] * dilations[i], strides[i], in_sp[i]) for i in range(nd))
        yfull[sl] += cols[:, kidx]
    y = yfull[(slice(None), slice(None)) + tuple(
        slice(shift[i] + pb[i], shift[i] + pb[i] + out[i]) for i in range(nd))]
    y = np.ascontiguousarray(np.moveaxis(y, 0, 1)) if N > 1 else y.reshape(1, M, *out)
    if b is not None:
        y = y + _as(b, cd).reshape((M,) + (1,) * nd)
    return _as(y, dt)


# ---------------------------------------------------------------------------------------
# pooling
# ---------------------------------------------------------------------------------------

def _pool_check(node):
    ap = _attr(node, "auto_pad", "NOTSET")
    if ap not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        return f"{node.op_type}: auto_pad {ap!r} is not a valid value"
    return None


def _pool_geometry(in_sp, ks, strides, pads, dilations, auto_pad, ceil_mode):
    """(pads_begin, explicit pads_end, output sizes) as the ONNX pooling shape rules give them."""
    nd = len(in_sp)
    k_eff = [(ks[i] - 1) * dilations[i] + 1 for i in range(nd)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pb, pe, out = [], [], []
        for i in range(nd):
            o = -(-in_sp[i] // strides[i])
            total = max(0, (o - 1) * strides[i] + k_eff[i] - in_sp[i])
            hb, he = _split_same(total, auto_pad)
            pb.append(hb)
            pe.append(he)
            out.append(o)
        return pb, pe, out
    if auto_pad == "VALID":
        pb, pe = [0] * nd, [0] * nd
    else:
        p = _ints(pads, 2 * nd, 0)
        pb, pe = p[:nd], p[nd:]
    out = []
    for i in range(nd):
        span = in_sp[i] + pb[i] + pe[i] - k_eff[i]
        if ceil_mode:
            o = -(-span // strides[i]) + 1
            # a window may not start in the right padding (ONNX / PyTorch rule)
            if (o - 1) * strides[i] >= in_sp[i] + pb[i]:
                o -= 1
        else:
            o = span // strides[i] + 1
        out.append(max(0, o))
    return pb, pe, out


def _pooled_padded(x, pb, pe, out, strides, k_eff, fill):
    """x padded so that every window of the output fits (ceil mode may need extra)."""
    nd = len(pb)
    ends = [max(pe[i], (out[i] - 1) * strides[i] + k_eff[i] - x.shape[2 + i] - pb[i])
            if out[i] > 0 else pe[i] for i in range(nd)]
    return _pad_const(x, pb, ends, fill)


def _reduce_axis(x, axis, k, stride, dil, n_out, op, pad=0):
    """Windowed reduction along one axis: op over the k taps (stride, dilation) of ``x``
    padded by ``pad`` in front (and at the end as far as the windows reach) with ``op``'s
    identity, without building that padded copy: each tap reduces only the outputs whose
    window position falls inside x (on an already padded input, ``pad`` 0, every tap covers
    every output). ``None`` when no tap covers every output (a window could hold padding only)."""
    size = x.shape[axis]
    ranges = [_tap_range(size, pad, t * dil, stride, n_out) for t in range(k)]
    full = next((t for t, (lo, hi) in enumerate(ranges) if lo == 0 and hi == n_out), None)
    if full is None:
        return None

    def view(t, lo, hi):
        start = lo * stride + t * dil - pad
        sl = [slice(None)] * x.ndim
        sl[axis] = slice(start, start + (hi - lo - 1) * stride + 1, stride)
        return x[tuple(sl)]

    acc = view(full, 0, n_out).copy()
    for t, (lo, hi) in enumerate(ranges):
        if t != full and hi > lo:
            sl = [slice(None)] * x.ndim
            sl[axis] = slice(lo, hi)
            part = acc[tuple(sl)]
            op(part, view(t, lo, hi), out=part)
    return acc


def _separable_pool(x, ks, strides, dilations, out, op, pads=None):
    """The pooling reduction axis by axis; ``pads`` (begin pads, one per axis): x is unpadded
    (see ``_reduce_axis``), and the result is ``None`` where a window could be all padding."""
    y = x
    for i in range(len(ks)):
        y = _reduce_axis(y, 2 + i, ks[i], strides[i], dilations[i], out[i], op, 0 if pads is None else pads[i])
        if y is None:
            return None
    return y


def _maxpool_unpadded(x, ks, strides, dilations, pb, pe, out):
    """MaxPool values over the unpadded input (no -inf-filled copy: the copy and its fill were
    half of a ResNet stem's 3x3/2 pooling); ``None`` where that does not apply (negative pads,
    or a window that could be all padding)."""
    if min(pb) < 0 or min(pe) < 0:
        return None
    return _separable_pool(x, ks, strides, dilations, out, np.maximum, pads=pb)


def _neg_fill(dt):
    return -np.inf if dt.kind == "f" else np.iinfo(dt).min


def _maxpool_impl(ctx, x, auto_pad, ceil_mode, dilations, kernel_shape, pads, storage_order, strides):
    nd = x.ndim - 2
    ks = [int(k) for k in kernel_shape]
    strides = _ints(strides, nd, 1)
    dilations = _ints(dilations, nd, 1)
    pb, pe, out = _pool_geometry(x.shape[2:], ks, strides, pads, dilations, auto_pad, ceil_mode)
    k_eff = [(ks[i] - 1) * dilations[i] + 1 for i in range(nd)]
    want_idx = ctx.n_outputs > 1 and ctx.outputs_wanted[1]
    N, C = x.shape[:2]
    if N * C * math.prod(out) == 0:
        y = np.zeros((N, C, *out), dtype=x.dtype)
        return (y, np.zeros(y.shape, np.int64)) if ctx.n_outputs > 1 else y
    if not want_idx and _native is not None and nd == 2 and x.dtype == _F32 and min(pb) >= 0:
        # compiled: separable, unit-stride (column phases), over the kernel threads; ResNet's
        # 3x3/2 pooling of 64x112x112: ~1.0 ms for the numpy reductions -> ~0.5
        y = np.empty((N, C, *out), _F32)
        _native.maxpool2d(np.ascontiguousarray(x), y, x.shape, tuple(out), tuple(ks), tuple(strides),
                          tuple(dilations), (pb[0], pb[1]), getattr(ctx, "threads", 1))
        return (y, None) if ctx.n_outputs > 1 else y
    if not want_idx:
        y = _maxpool_unpadded(x, ks, strides, dilations, pb, pe, out)
        if y is None:
            xp = _pooled_padded(x, pb, pe, out, strides, k_eff, _neg_fill(x.dtype))
            y = _separable_pool(xp, ks, strides, dilations, out, np.maximum)
        return (y, None) if ctx.n_outputs > 1 else y
    xp = _pooled_padded(x, pb, pe, out, strides, k_eff, _neg_fill(x.dtype))
    best = None
    arg = np.zeros((N, C, *out), dtype=np.int64)
    for kidx, offs in enumerate(np.ndindex(*ks)):
        sl = xp[(slice(None), slice(None)) + tuple(
            _tap_slice(offs[i] * dilations[i], strides[i], out[i]) for i in range(nd))]
        if best is None:
            best = sl.copy()
            continue
        m = sl > best
        np.copyto(best, sl, where=m)
        arg[m] = kidx
    # window tap -> input coordinates -> flat index over N*C*spatial
    k_unr = np.unravel_index(arg, ks)
    in_sp = x.shape[2:]
    coords = []
    for i in range(nd):
        o = np.arange(out[i]).reshape((1, 1) + tuple(out[i] if j == i else 1 for j in range(nd)))
        coords.append(o * strides[i] - pb[i] + k_unr[i] * dilations[i])
    sp_size = math.prod(in_sp)
    flat = np.ravel_multi_index(tuple(np.clip(c, 0, in_sp[i] - 1) for i, c in enumerate(coords)),
                                in_sp, order="F" if storage_order else "C")
    nc = np.arange(N * C, dtype=np.int64).reshape((N, C) + (1,) * nd)
    idx = nc * sp_size + flat
    return best, idx.astype(np.int64)


@kernel("MaxPool", 1, dtypes=_FLOAT, check=_pool_check)
def maxpool_1(ctx, x, *, auto_pad, kernel_shape, pads, strides):
    return _maxpool_impl(ctx, x, auto_pad, 0, None, kernel_shape, pads, 0, strides)


@kernel("MaxPool", 8, dtypes=_FLOAT, check=_pool_check)
def maxpool_8(ctx, x, *, auto_pad, kernel_shape, pads, storage_order, strides):
    return _maxpool_impl(ctx, x, auto_pad, 0, None, kernel_shape, pads, storage_order, strides)


@kernel("MaxPool", 10, 11, 12, 22, dtypes=_FLOAT | {"int8", "uint8"}, check=_pool_check)
def maxpool_10(ctx, x, *, auto_pad, ceil_mode, dilations, kernel_shape, pads, storage_order, strides):
    return _maxpool_impl(ctx, x, auto_pad, ceil_mode, dilations, kernel_shape, pads, storage_order, strides)


def _avgpool_impl(x, auto_pad, ceil_mode, count_include_pad, dilations, kernel_shape, pads, strides):
    nd = x.ndim - 2
    ks = [int(k) for k in kernel_shape]
    strides = _ints(strides, nd, 1)
    dilations = _ints(dilations, nd, 1)
    in_sp = x.shape[2:]
    pb, pe, out = _pool_geometry(in_sp, ks, strides, pads, dilations, auto_pad, ceil_mode)
    k_eff = [(ks[i] - 1) * dilations[i] + 1 for i in range(nd)]
    dt = x.dtype
    cd = _cdtype(dt)
    N, C = x.shape[:2]
    if N * C * math.prod(out) == 0:
        return np.zeros((N, C, *out), dtype=dt)
    xp = _pooled_padded(_as(x, cd), pb, pe, out, strides, k_eff, 0)
    s = _separable_pool(xp, ks, strides, dilations, out, np.add)
    # divisor: taps that fall on the input (plus the explicit pads when counted); separable
    cnt = np.ones((1, 1) + (1,) * nd, dtype=cd)
    for i in range(nd):
        pos = np.arange(out[i])[:, None] * strides[i] - pb[i] + np.arange(ks[i])[None, :] * dilations[i]
        if count_include_pad:
            ok = (pos >= -pb[i]) & (pos < in_sp[i] + pe[i])
        else:
            ok = (pos >= 0) & (pos < in_sp[i])
        c = ok.sum(axis=1).astype(cd)
        cnt = cnt * c.reshape((1, 1) + tuple(out[i] if j == i else 1 for j in range(nd)))
    with np.errstate(divide="ignore", invalid="ignore"):
        y = s / cnt
    return _as(y, dt)


def _avgpool1_check(node):
    reason = _pool_check(node)
    if reason:
        return reason
    if _attr(node, "auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER") or any(_attr(node, "pads", [])):
        return ("AveragePool-1 with padding is not implemented: opset 1 predates count_include_pad "
                "and does not say whether padded cells count in the divisor")
    return None


@kernel("AveragePool", 1, dtypes=_FLOAT, check=_avgpool1_check)
def averagepool_1(ctx, x, *, auto_pad, kernel_shape, pads, strides):
    # without padding (see the check) every window lies on the input: a plain mean
    return _avgpool_impl(x, auto_pad, 0, 0, None, kernel_shape, pads, strides)


@kernel("AveragePool", 7, dtypes=_FLOAT, check=_pool_check)
def averagepool_7(ctx, x, *, auto_pad, count_include_pad, kernel_shape, pads, strides):
    return _avgpool_impl(x, auto_pad, 0, count_include_pad, None, kernel_shape, pads, strides)


@kernel("AveragePool", 10, 11, dtypes=_FLOAT, check=_pool_check)
def averagepool_10(ctx, x, *, auto_pad, ceil_mode, count_include_pad, kernel_shape, pads, strides):
    return _avgpool_impl(x, auto_pad, ceil_mode, count_include_pad, None, kernel_shape, pads, strides)


@kernel("AveragePool", 19, 22, dtypes=_FLOAT, check=_pool_check)
def averagepool_19(ctx, x, *, auto_pad, ceil_mode, count_include_pad, dilations, kernel_shape, pads,
                   strides):
    return _avgpool_impl(x, auto_pad, ceil_mode, count_include_pad, dilations, kernel_shape, pads, strides)


def _lppool_impl(x, auto_pad, ceil_mode, dilations, kernel_shape, p, pads, strides):
    nd = x.ndim - 2
    ks = [int(k) for k in kernel_shape]
    strides = _ints(strides, nd, 1)
    dilations = _ints(dilations, nd, 1)
    pb, pe, out = _pool_geometry(x.shape[2:], ks, strides, pads, dilations, auto_pad, ceil_mode)
    k_eff = [(ks[i] - 1) * dilations[i] + 1 for i in range(nd)]
    dt = x.dtype
    cd = _cdtype(dt)
    N, C = x.shape[:2]
    if N * C * math.prod(out) == 0:
        return np.zeros((N, C, *out), dtype=dt)
    xa = np.abs(_as(x, cd))
    xa = xa * xa if p == 2 else xa ** cd.type(p)
    xp = _pooled_padded(xa, pb, pe, out, strides, k_eff, 0)
    s = _separable_pool(xp, ks, strides, dilations, out, np.add)
    y = np.sqrt(s) if p == 2 else s ** cd.type(1.0 / p)
    return _as(y, dt)


def _lppool1_check(node):
    if not _attr(node, "kernel_shape"):
        return ("LpPool-1 without kernel_shape is not implemented: opset 1 makes the attribute "
                "optional but defines no default window")
    return _pool_check(node)


@kernel("LpPool", 1, dtypes=_FLOAT, check=_lppool1_check)
def lppool_1(ctx, x, *, auto_pad, kernel_shape, p, pads, strides):
    # opset 1: as opset 2 except that p is a FLOAT (default 2.0) and kernel_shape is optional
    return _lppool_impl(x, auto_pad, 0, None, kernel_shape, p, pads, strides)


@kernel("LpPool", 2, 11, dtypes=_FLOAT, check=_pool_check)
def lppool_2(ctx, x, *, auto_pad, kernel_shape, p, pads, strides):
    return _lppool_impl(x, auto_pad, 0, None, kernel_shape, p, pads, strides)


@kernel("LpPool", 18, 22, dtypes=_FLOAT, check=_pool_check)
def lppool_18(ctx, x, *, auto_pad, ceil_mode, dilations, kernel_shape, p, pads, strides):
    return _lppool_impl(x, auto_pad, ceil_mode, dilations, kernel_shape, p, pads, strides)


def _spatial_axes(x):
    return tuple(range(2, x.ndim))


@kernel("GlobalAveragePool", 1, 22, dtypes=_FLOAT)
def global_average_pool(ctx, x):
    cd = _cdtype(x.dtype)
    xc = _as(x, cd)
    if x.ndim >= 3 and xc.flags.c_contiguous and x.size:
        # one contiguous axis: np.mean over two axes took ~85 us for ResNet's 512 x 7 x 7
        # inside a run (the reduction is the same pairwise sum)
        n = xc.shape[0] * xc.shape[1]
        if x.size // n <= 4096:
            # einsum's SIMD row sums: 9 against 21 us for 512 x 7 x 7 (a sequential sum in
            # 8-16 lanes; numpy's pairwise one is kept for larger planes)
            s = np.einsum("ij->i", xc.reshape(n, -1))
        else:
            s = np.add.reduce(xc.reshape(n, -1), axis=1)
        s /= cd.type(x.size // n)
        return _as(s.reshape(x.shape[:2] + (1,) * (x.ndim - 2)), x.dtype)
    return _as(np.mean(xc, axis=_spatial_axes(x), keepdims=True), x.dtype)


@kernel("GlobalMaxPool", 1, 22, dtypes=_FLOAT)
def global_max_pool(ctx, x):
    return np.max(x, axis=_spatial_axes(x), keepdims=True)


@kernel("GlobalLpPool", 1, 2, 22, dtypes=_FLOAT)
def global_lp_pool(ctx, x, *, p):
    # opset 1 takes p as a FLOAT (default 2.0), opset 2+ as an INT: the same formula
    cd = _cdtype(x.dtype)
    xa = np.abs(_as(x, cd))
    s = np.sum(xa * xa if p == 2 else xa ** cd.type(p), axis=_spatial_axes(x), keepdims=True)
    return _as(np.sqrt(s) if p == 2 else s ** cd.type(1.0 / p), x.dtype)


# ---------------------------------------------------------------------------------------
# normalizations
# ---------------------------------------------------------------------------------------

def _bn_apply(x, scale, b, mean, var, epsilon, param_shape):
    dt = x.dtype
    cd = _cdtype(dt)
    inv = _as(scale, cd) / np.sqrt(_as(var, cd) + cd.type(epsilon))
    shift = _as(b, cd) - _as(mean, cd) * inv
    y = _as(x, cd) * inv.reshape(param_shape)
    y += shift.reshape(param_shape)
    return _as(y, dt)


def _bn_param_shape(x):
    return (x.shape[1],) + (1,) * (x.ndim - 2) if x.ndim >= 2 else (-1,)


def _bn_inference_only(node):
    if any(node.outputs[1:]):
        return ("BatchNormalization: the mean/var/saved_mean/saved_var outputs (training) "
                "are not implemented; only inference (output Y) is")
    return None


def _bn6_check(node):
    if any(node.outputs[1:]):
        return (f"BatchNormalization-{node.since_version}: the mean/var/saved_mean/saved_var outputs "
                "are not implemented: the opset does not define saved_var (Caffe2, where the op comes "
                "from, saved the inverse standard deviation) nor whether the running variance uses "
                "the biased or the unbiased batch variance; output Y alone is")
    return None


def _bn_legacy_shape(x, p, spatial, v):
    """Broadcast shape of a BatchNormalization-1/6 parameter: its schema says "1-dimensional of
    size C"; with spatial=0 a per-feature parameter of shape X.shape[1:] is accepted too."""
    C = x.shape[1]
    if p.ndim == 1 and p.shape[0] == C:
        return _bn_param_shape(x)
    if not spatial and p.shape == x.shape[1:]:
        return p.shape
    raise ValueError(f"BatchNormalization-{v}: parameter of shape {p.shape} does not fit X of shape "
                     f"{x.shape} (spatial={spatial})")


def _batchnorm_legacy(ctx, x, scale, b, mean, var, epsilon, is_test, spatial):
    # opsets 1 and 6. is_test=1: the given mean/var. is_test=0 (training; the default): Y is
    # normalised with the batch statistics (biased variance, as in the cited paper), taken over
    # N and the spatial axes when ``spatial`` is set, else over N alone (per feature)
    v = ctx.node.since_version
    shape = _bn_legacy_shape(x, scale, spatial, v)
    for t in (b, mean, var):
        if _bn_legacy_shape(x, t, spatial, v) != shape:
            raise ValueError(f"BatchNormalization-{v}: scale, B, mean and var must have one shape")
    if not is_test:
        cd = _cdtype(x.dtype)
        xc = _as(x, cd)
        axes = (0,) + _spatial_axes(x) if spatial else (0,)
        m = xc.mean(axis=axes, keepdims=True)
        d = xc - m
        vv = np.mean(d * d, axis=axes, keepdims=True)
        sc = _as(scale, cd).reshape(shape)
        y = d * (sc / np.sqrt(vv + cd.type(epsilon))) + _as(b, cd).reshape(shape)
        y = _as(y, x.dtype)
    else:
        y = _bn_apply(x, scale, b, mean, var, epsilon, shape)
    return (y,) + (None,) * (ctx.n_outputs - 1) if ctx.n_outputs > 1 else y


@kernel("BatchNormalization", 1, dtypes=_FLOAT, check=_bn6_check)
def batchnorm_1(ctx, x, scale, b, mean, var, *, consumed_inputs, epsilon, is_test, momentum, spatial):
    # consumed_inputs is a legacy in-place optimisation hint: no effect on the values
    return _batchnorm_legacy(ctx, x, scale, b, mean, var, epsilon, is_test, spatial)


@kernel("BatchNormalization", 6, dtypes=_FLOAT, check=_bn6_check)
def batchnorm_6(ctx, x, scale, b, mean, var, *, epsilon, is_test, momentum, spatial):
    return _batchnorm_legacy(ctx, x, scale, b, mean, var, epsilon, is_test, spatial)


@kernel("BatchNormalization", 7, dtypes=_FLOAT, check=_bn_inference_only)
def batchnorm_7(ctx, x, scale, b, mean, var, *, epsilon, momentum, spatial):
    shape = _bn_param_shape(x) if spatial else scale.shape
    return _bn_apply(x, scale, b, mean, var, epsilon, shape)


@kernel("BatchNormalization", 9, dtypes=_FLOAT, check=_bn_inference_only)
def batchnorm_9(ctx, x, scale, b, mean, var, *, epsilon, momentum):
    return _bn_apply(x, scale, b, mean, var, epsilon, _bn_param_shape(x))


def _bn14_check(node):
    if not _attr(node, "training_mode", 0) and any(node.outputs[1:]):
        return ("BatchNormalization: running_mean/running_var outputs are only defined in "
                "training mode (training_mode=0 here)")
    return None


@kernel("BatchNormalization", 14, 15, dtypes=_FLOAT, check=_bn14_check)
def batchnorm_14(ctx, x, scale, b, input_mean, input_var, *, epsilon, momentum, training_mode):
    shape = _bn_param_shape(x)
    if not training_mode:
        y = _bn_apply(x, scale, b, input_mean, input_var, epsilon, shape)
        return (y,) + (None,) * (ctx.n_outputs - 1) if ctx.n_outputs > 1 else y
    cd = _cdtype(x.dtype)
    axes = (0,) + _spatial_axes(x)
    xc = _as(x, cd)
    m = xc.mean(axis=axes)
    v = xc.var(axis=axes)
    y = _bn_apply(x, scale, b, m, v, epsilon, shape)
    mom = cd.type(momentum)
    rm = _as(input_mean, cd) * mom + m * (cd.type(1) - mom)
    rv = _as(input_var, cd) * mom + v * (cd.type(1) - mom)
    outs = (y, _as(rm, input_mean.dtype), _as(rv, input_var.dtype))
    return outs[:ctx.n_outputs]


@kernel("InstanceNormalization", 1, dtypes=_FLOAT)
def instance_norm_1(ctx, x, scale, b, *, consumed_inputs, epsilon):
    # opset 1 = opset 6 plus consumed_inputs, a legacy in-place hint with no effect on values
    return instance_norm(ctx, x, scale, b, epsilon=epsilon)


@kernel("InstanceNormalization", 6, 22, dtypes=_FLOAT)
def instance_norm(ctx, x, scale, b, *, epsilon):
    dt = x.dtype
    cd = _cdtype(dt)
    xc = _as(x, cd)
    axes = _spatial_axes(x)
    mean = xc.mean(axis=axes, keepdims=True)
    d = xc - mean
    var = np.mean(d * d, axis=axes, keepdims=True)
    shape = _bn_param_shape(x)
    y = d * (_as(scale, cd).reshape(shape) / np.sqrt(var + cd.type(epsilon))) + _as(b, cd).reshape(shape)
    return _as(y, dt)


_STASH = {1: np.dtype(np.float32)}


def _stash_check(node):
    st = _attr(node, "stash_type", 1)
    if st not in _STASH:
        return f"{node.op_type}: stash_type {st} is not implemented (only 1 = float)"
    return None


@kernel("LayerNormalization", 17, dtypes=_FLOAT, check=_stash_check)
def layer_norm(ctx, x, scale, b=None, *, axis, epsilon, stash_type):
    return _layer_norm(ctx, x, scale, b, axis, epsilon, stash_type, False)


@inplace_variant(layer_norm, 0)
def layer_norm_inplace(ctx, owned, x, scale, b=None, *, axis, epsilon, stash_type):
    return _layer_norm(ctx, x, scale, b, axis, epsilon, stash_type, True)


def _layer_norm(ctx, x, scale, b, axis, epsilon, stash_type, owned):
    dt = x.dtype
    cd = _STASH[stash_type]
    ax = normalize_axis(axis, x.ndim)
    if (_native is not None and type(x) is np.ndarray and dt == _F32 and cd == _F32 and x.size
            and scale.dtype == _F32
            and scale.shape == x.shape[ax:] and (b is None or (b.dtype == _F32 and b.shape == scale.shape))
            and all(t is None or np.dtype(t) == _F32 for t in ctx.output_dtypes[1:ctx.n_outputs])):
        # one compiled pass a row (``_native.skip_layer_norm`` without a skip): numpy's took
        # BLAS products with ones for the means, which woke BLAS's worker threads
        d = scale.size
        y = x if owned and x.flags.c_contiguous else np.empty(x.shape, _F32)
        st = x.shape[:ax] + (1,) * (x.ndim - ax)
        mean = np.empty(st, _F32) if ctx.n_outputs > 1 else None
        inv = np.empty(st, _F32) if ctx.n_outputs > 2 else None
        _native.skip_layer_norm(np.ascontiguousarray(x), None, np.ascontiguousarray(scale).reshape(d),
                                None if b is None else np.ascontiguousarray(b).reshape(d), None, y, mean, inv,
                                None, (x.size // d, d, 1), float(epsilon))
        return (y, mean, inv)[:ctx.n_outputs] if ctx.n_outputs > 1 else y
    xc = _as(x, cd)
    mean = mean_last(xc, ax)  # BLAS products with ones: faster than numpy's short-row means
    # x - mean, into x itself when the executable handed x over (same dtype: xc is x)
    d = np.subtract(xc, mean, out=xc if owned and xc is x else None)
    sq = np.square(d)
    var = mean_last(sq, ax)
    del sq
    inv = cd.type(1) / np.sqrt(var + cd.type(epsilon))
    d *= inv  # d is ours: normalise, scale and shift in place
    d *= _as(scale, cd)
    if b is not None:
        d += _as(b, cd)
    y = _as(d, dt)
    if ctx.n_outputs == 1:
        return y
    od = ctx.output_dtypes
    mdt = od[1] if len(od) > 1 and od[1] is not None else cd
    idt = od[2] if len(od) > 2 and od[2] is not None else cd
    outs = (y, _as(mean, mdt), _as(inv, idt))
    return outs[:ctx.n_outputs]


def _gn_core(x, num_groups, epsilon, cd):
    N, C = x.shape[:2]
    xr = _as(x, cd).reshape(N, num_groups, -1)
    mean = xr.mean(axis=-1, keepdims=True)
    d = xr - mean
    var = np.mean(d * d, axis=-1, keepdims=True)
    return d / np.sqrt(var + cd.type(epsilon))  # [N, G, C/G * spatial]


@kernel("GroupNormalization", 18, dtypes=_FLOAT)
def group_norm_18(ctx, x, scale, bias, *, epsilon, num_groups):
    # opset 18: scale and bias are per GROUP, shape (num_groups) (opset 21 made them per channel).
    # onnx marks this schema deprecated, so onnx.checker (which the core's loader runs) rejects
    # models that use it; the kernel serves callers that load without that check.
    N, C = x.shape[:2]
    if num_groups < 1 or C % num_groups:
        raise ValueError(f"GroupNormalization-18: num_groups {num_groups} does not divide C={C}")
    if scale.shape != (num_groups,) or bias.shape != (num_groups,):
        raise ValueError(f"GroupNormalization-18: scale and bias must have shape ({num_groups},), got "
                         f"{scale.shape} and {bias.shape}")
    cd = _cdtype(x.dtype)
    xn = _gn_core(x, num_groups, epsilon, cd)  # [N, G, C/G * spatial]
    y = xn * _as(scale, cd)[:, None] + _as(bias, cd)[:, None]
    return _as(y.reshape(x.shape), x.dtype)


@kernel("GroupNormalization", 21, dtypes=_FLOAT, check=_stash_check)
def group_norm_21(ctx, x, scale, bias, *, epsilon, num_groups, stash_type):
    # opset 21: scale and bias are per channel, shape (C)
    cd = _STASH[stash_type]
    xn = _gn_core(x, num_groups, epsilon, cd).reshape(x.shape)
    shape = _bn_param_shape(x)
    y = xn * _as(scale, cd).reshape(shape) + _as(bias, cd).reshape(shape)
    return _as(y, x.dtype)


@kernel("LRN", 1, 13, dtypes=_FLOAT)
def lrn(ctx, x, *, alpha, beta, bias, size):
    dt = x.dtype
    cd = _cdtype(dt)
    xc = _as(x, cd)
    C = x.shape[1]
    pre = (size - 1) // 2
    post = size - 1 - pre
    sq = xc * xc
    pad = [(0, 0)] * x.ndim
    pad[1] = (pre, post)
    sqp = np.pad(sq, pad)
    acc = sqp[:, 0:C].copy()
    for j in range(1, size):
        acc += sqp[:, j:j + C]
    y = xc / (cd.type(bias) + cd.type(alpha / size) * acc) ** cd.type(beta)
    return _as(y, dt)


# ---------------------------------------------------------------------------------------
# Softmax / LogSoftmax / Hardmax
# ---------------------------------------------------------------------------------------

def _softmax_axis(x, axis, log):
    if x.size == 0:
        return x.copy()
    dt = x.dtype
    xc = _as(x, _cdtype(dt))
    m = np.max(xc, axis=axis, keepdims=True)
    e = xc - m
    if log:
        y = e - np.log(np.sum(np.exp(e), axis=axis, keepdims=True))
    else:
        np.exp(e, out=e)
        e /= np.sum(e, axis=axis, keepdims=True)
        y = e
    return _as(y, dt)


def _hardmax_axis(x, axis):
    y = np.zeros_like(x)
    if x.size == 0:
        return y
    idx = np.expand_dims(np.argmax(x, axis=axis), axis)
    np.put_along_axis(y, idx, 1, axis=axis)
    return y


def _coerce_2d(fn):
    def run(x, axis):
        ax = normalize_axis(axis, x.ndim) if x.ndim else 0
        lead = math.prod(x.shape[:ax])
        return fn(x.reshape(lead, -1), 1).reshape(x.shape)
    return run


@kernel("Softmax", 1, 11, dtypes=_FLOAT)
def softmax_1(ctx, x, *, axis):
    return _coerce_2d(lambda a, ax: _softmax_axis(a, ax, False))(x, axis)


@kernel("Softmax", 13, dtypes=_FLOAT | _BF16)
def softmax_13(ctx, x, *, axis):
    return _softmax_axis(x, normalize_axis(axis, x.ndim), False)


@inplace_variant(softmax_13, 0)
def softmax_13_inplace(ctx, owned, x, *, axis):
    if x.dtype not in (np.float32, np.float64) or x.size == 0:
        return softmax_13(ctx, x, axis=axis)
    # _softmax_axis's arithmetic, in x
    ax = normalize_axis(axis, x.ndim)
    m = np.max(x, axis=ax, keepdims=True)
    np.subtract(x, m, out=x)
    np.exp(x, out=x)
    x /= np.sum(x, axis=ax, keepdims=True)
    return x


@kernel("LogSoftmax", 1, 11, dtypes=_FLOAT)
def log_softmax_1(ctx, x, *, axis):
    return _coerce_2d(lambda a, ax: _softmax_axis(a, ax, True))(x, axis)


@kernel("LogSoftmax", 13, dtypes=_FLOAT | _BF16)
def log_softmax_13(ctx, x, *, axis):
    return _softmax_axis(x, normalize_axis(axis, x.ndim), True)


@kernel("Hardmax", 1, 11, dtypes=_FLOAT)
def hardmax_1(ctx, x, *, axis):
    return _coerce_2d(_hardmax_axis)(x, axis)


@kernel("Hardmax", 13, dtypes=_FLOAT)
def hardmax_13(ctx, x, *, axis):
    return _hardmax_axis(x, normalize_axis(axis, x.ndim))


# ---------------------------------------------------------------------------------------
# Dropout
# ---------------------------------------------------------------------------------------

def _dropout1_check(node):
    if _attr(node, "is_test", 0) and len(node.outputs) > 1 and node.outputs[1]:
        return (f"Dropout-{node.since_version}: the mask output with is_test=1 is not implemented: "
                "the opset says it 'is not filled' in test mode, so its value is undefined")
    return None


def _dropout_legacy(ctx, data, ratio, is_test):
    # opsets 1 and 6: is_test=1 is the identity; is_test=0 (the default) is training dropout,
    # scaled by 1/(1-ratio). No seed attribute: a fresh generator each run (numpy's legacy
    # MT19937 stream, as Dropout-12 uses). The mask output has type T (the schema's type
    # constraint, whatever the prose says about Tensor<bool>): 1 where kept, 0 where dropped.
    if is_test:
        return (data,) + (None,) * (ctx.n_outputs - 1) if ctx.n_outputs > 1 else data
    r = float(ratio)
    if not 0.0 <= r <= 1.0:
        raise ValueError(f"Dropout ratio must be in [0, 1], got {r}")
    keep = np.random.RandomState(None).uniform(0.0, 1.0, data.shape) >= r
    if r >= 1.0:
        y = np.zeros_like(data)
    else:
        cd = _cdtype(data.dtype)
        y = _as(np.where(keep, _as(data, cd) * cd.type(1.0 / (1.0 - r)), cd.type(0)), data.dtype)
    if ctx.n_outputs < 2:
        return y
    return y, (keep.astype(data.dtype) if ctx.outputs_wanted[1] else None)


@kernel("Dropout", 1, dtypes=_FLOAT, check=_dropout1_check)
def dropout_1(ctx, data, *, consumed_inputs, is_test, ratio):
    # consumed_inputs: a legacy in-place hint, no effect on values
    return _dropout_legacy(ctx, data, ratio, is_test)


@kernel("Dropout", 6, dtypes=_FLOAT, check=_dropout1_check)
def dropout_6(ctx, data, *, is_test, ratio):
    return _dropout_legacy(ctx, data, ratio, is_test)


def _dropout7_check(node):
    if len(node.outputs) > 1 and node.outputs[1]:
        return (f"Dropout-{node.since_version} mask output is not implemented (its inference-mode value "
                "is defined differently by runtimes; opset 12+ is)")
    return None


@kernel("Dropout", 7, 10, check=_dropout7_check)
def dropout_7(ctx, data, *, ratio):
    # inference: identity (the mask output, when declared, is never requested: see the check)
    return (data,) + (None,) * (ctx.n_outputs - 1) if ctx.n_outputs > 1 else data


@kernel("Dropout", 12, 13, 22)
def dropout_12(ctx, data, ratio=None, training_mode=None, *, seed):
    training = training_mode is not None and bool(np.asarray(training_mode).reshape(-1)[0])
    r = 0.5 if ratio is None else float(np.asarray(ratio).reshape(-1)[0])
    want_mask = ctx.n_outputs > 1 and ctx.outputs_wanted[1]
    if not training or r == 0.0:
        if ctx.n_outputs < 2:
            return data
        return data, (np.ones(data.shape, dtype=bool) if want_mask else None)
    if not 0.0 <= r <= 1.0:
        raise ValueError(f"Dropout ratio must be in [0, 1), got {r}")
    # the spec leaves the generator unspecified; onnx's reference and the backend test data use
    # numpy's legacy MT19937 stream: RandomState(seed).uniform(0, 1, shape) >= ratio
    rs = np.random.RandomState(None if seed is None else int(seed) & 0xFFFFFFFF)
    keep = rs.uniform(0.0, 1.0, data.shape) >= r
    if r >= 1.0:
        y = np.zeros_like(data)
    else:
        cd = _cdtype(data.dtype) if data.dtype.kind == "f" else data.dtype
        y = _as(np.where(keep, _as(data, cd) * cd.type(1.0 / (1.0 - r)), cd.type(0)), data.dtype)
    if ctx.n_outputs < 2:
        return y
    return y, (keep if want_mask else None)


# ---------------------------------------------------------------------------------------
# Resize / Upsample
# ---------------------------------------------------------------------------------------

_CTM = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
        "tf_half_pixel_for_nn", "tf_crop_and_resize")
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _resize_check(node):
    v = node.since_version or 0
    mode = _attr(node, "mode", "nearest")
    if mode not in ("nearest", "linear", "cubic"):
        return f"{node.op_type}: mode {mode!r} is not one of nearest, linear, cubic"
    if node.op_type == "Upsample" and mode == "cubic":
        return "Upsample: mode 'cubic' is not defined for Upsample"
    if v >= 11 and node.op_type == "Resize":
        ctm = _attr(node, "coordinate_transformation_mode", "half_pixel")
        allowed = _CTM if v >= 19 else tuple(m for m in _CTM if m != "half_pixel_symmetric")
        if ctm not in allowed:
            return f"Resize-{v}: coordinate_transformation_mode {ctm!r} is not defined"
        nm = _attr(node, "nearest_mode", "round_prefer_floor")
        if nm not in _NEAREST:
            return f"Resize: nearest_mode {nm!r} is not defined"
    elif v == 10 and mode == "cubic":
        return "Resize-10: mode 'cubic' is not defined before opset 11"
    if v >= 18:
        pol = _attr(node, "keep_aspect_ratio_policy", "stretch")
        if pol not in ("stretch", "not_larger", "not_smaller"):
            return f"Resize: keep_aspect_ratio_policy {pol!r} is not defined"
    dt = _in_dtype(node)
    if mode != "nearest" and dt is not None and dt.name not in _FLOAT:
        return (f"{node.op_type}: mode {mode!r} on {dt.name} is not implemented (the spec leaves the "
                "rounding of interpolated integers open); float16/float32/float64 are, and mode "
                "'nearest' takes every type")
    if dt is not None and dt.kind not in "biufcOUS":
        return f"{node.op_type} on {dt.name} is not implemented"
    return None


def _coords(ctm, out_len, in_len, scale, roi_s, roi_e):
    """x_original for every output index, in float32 like onnxruntime."""
    x = np.arange(out_len, dtype=_F32)
    sc = _F32(scale)
    lr = _F32(out_len)
    lo = _F32(in_len)
    h = _F32(0.5)
    if ctm == "asymmetric":
        return x / sc
    if ctm == "pytorch_half_pixel":
        return (x + h) / sc - h if out_len > 1 else np.zeros(out_len, _F32)
    if ctm == "tf_half_pixel_for_nn":
        return (x + h) / sc
    if ctm == "align_corners":
        # length_resized is length_original * scale, fractional when a scale does not land on
        # an integer size (the spec's definition, and the ONNX reference's)
        lf = sc * lo
        if abs(float(lf) - out_len) > 1e-4 * max(out_len, 1):
            lr = lf
        if lr == _F32(1):
            return np.zeros(out_len, _F32)
        return x * (lo - _F32(1)) / (lr - _F32(1))
    if ctm == "tf_crop_and_resize":
        rs, re_ = _F32(roi_s), _F32(roi_e)
        if out_len > 1:
            return rs * (lo - _F32(1)) + (x * (re_ - rs) * (lo - _F32(1))) / (lr - _F32(1))
        return np.full(out_len, 0.5 * (float(rs) + float(re_)) * (float(lo) - 1.0), dtype=_F32)
    if ctm == "half_pixel_symmetric":
        output_width = sc * lo
        adjustment = lr / output_width
        center = lo / _F32(2)
        offset = center * (_F32(1) - adjustment)
        return ((np.float64(offset) + (x.astype(np.float64) + 0.5) / np.float64(sc)) - 0.5).astype(_F32)
    return (x + h) / sc - h  # half_pixel


def _nearest_index(xo, nearest_mode, scale):
    if nearest_mode == "simple":  # Resize-10 / Upsample
        xi = np.ceil(xo) if scale < 1 else np.trunc(xo)
    elif nearest_mode == "round_prefer_ceil":
        xi = np.sign(xo) * np.floor(np.abs(xo) + _F32(0.5))  # std::round: half away from zero
    elif nearest_mode == "floor":
        xi = np.floor(xo)
    elif nearest_mode == "ceil":
        xi = np.ceil(xo)
    else:  # round_prefer_floor
        half = xo == np.trunc(xo) + _F32(0.5)
        xi = np.where(half, np.floor(xo), np.sign(xo) * np.floor(np.abs(xo) + _F32(0.5)))
    return xi.astype(np.int64)


def _cubic_coeffs(s, a):
    a = _F32(a)
    s = np.abs(s).astype(_F32)
    one, two = _F32(1), _F32(2)
    c0 = ((a * (s + one) - _F32(5) * a) * (s + one) + _F32(8) * a) * (s + one) - _F32(4) * a
    c1 = ((a + two) * s - (a + _F32(3))) * s * s + one
    t = one - s
    c2 = ((a + two) * t - (a + _F32(3))) * t * t + one
    u = two - s
    c3 = ((a * u - _F32(5) * a) * u + _F32(8) * a) * u - _F32(4) * a
    return np.stack([c0, c1, c2, c3])  # [4, out]


def _aa_filter(mode, xs, a):
    ax = np.abs(xs)
    if mode == "linear":
        return np.where(ax < 1, _F32(1) - ax, _F32(0)).astype(_F32)
    a = _F32(a)
    w1 = ((a + _F32(2)) * ax - (a + _F32(3))) * ax * ax + _F32(1)
    w2 = (((ax - _F32(5)) * ax + _F32(8)) * ax - _F32(4)) * a
    return np.where(ax < 1, w1, np.where(ax < 2, w2, _F32(0))).astype(_F32)


def _axis_taps(mode, xo, in_len, scale, cubic_a, exclude_outside, antialias):
    """(indices [T, out], weights [T, out] float32) of one axis' interpolation."""
    out_len = xo.shape[0]
    if antialias:
        rscale = _F32(scale)
        sc = _F32(1) / rscale
        support_size = _F32(2) if mode == "linear" else _F32(4)
        support = (support_size * _F32(0.5)) * sc if sc >= 1 else support_size * _F32(0.5)
        window = int(math.ceil(float(support))) * 2 + 1
        inv = _F32(1) / sc if sc >= 1 else _F32(1)
        center = _F32(0.5) + xo
        c64 = center.astype(np.float64)
        xmin_real = np.floor(c64 - float(support) + 0.5).astype(np.int64)
        xmax_real = np.floor(c64 + float(support) + 0.5).astype(np.int64)
        if exclude_outside:
            xmin = np.maximum(xmin_real, 0)
            xmax = np.minimum(xmax_real, in_len)
        else:
            xmin, xmax = xmin_real, xmax_real
        j = np.arange(window)[None, :]
        pos = xmin[:, None] + j
        valid = j < (xmax - xmin)[:, None]
        arg = (pos.astype(_F32) - center[:, None] + _F32(0.5)) * inv
        w = np.where(valid, _aa_filter(mode, arg, cubic_a), _F32(0)).astype(_F32)
        total = w.sum(axis=1, dtype=_F32)
        norm = (total != 0) & (total != 1)
        w = np.where(norm[:, None], w / np.where(norm, total, _F32(1))[:, None], w).astype(_F32)
        # weights of taps outside the input go to the edge pixel (no exclude_outside)
        pos = np.clip(pos, 0, in_len - 1)
        return pos.T, w.T
    if mode == "linear":
        xc = np.clip(xo, _F32(0), _F32(in_len - 1))
        i0 = np.minimum(xc.astype(np.int64), in_len - 1)
        i1 = np.minimum(i0 + 1, in_len - 1)
        d1 = np.abs(xc - i0.astype(_F32))
        d2 = np.abs(xc - i1.astype(_F32))
        same = i0 == i1
        d1 = np.where(same, _F32(0.5), d1)
        d2 = np.where(same, _F32(0.5), d2)
        return np.stack([i0, i1]), np.stack([d2, d1]).astype(_F32)
    # cubic
    fl = np.floor(xo)
    xi = fl.astype(np.int64)
    s = (xo - fl).astype(_F32)
    w = _cubic_coeffs(s, cubic_a)
    idx = xi[None, :] + np.arange(-1, 3)[:, None]
    if exclude_outside:
        inside = (idx >= 0) & (idx < in_len)
        w = np.where(inside, w, _F32(0))
        w = (w / w.sum(axis=0, dtype=_F32)[None, :]).astype(_F32)
    return np.clip(idx, 0, in_len - 1), w


def _resize_core(x, out_shape, scales, roi, mode, ctm, nearest_mode, cubic_a, exclude_outside,
                 extrapolation, antialias):
    rank = x.ndim
    if tuple(out_shape) == x.shape and all(s == 1 for s in scales):
        return x.copy()
    if any(o == 0 for o in out_shape) or x.size == 0:
        return np.zeros(tuple(out_shape), dtype=x.dtype)
    crop = ctm == "tf_crop_and_resize"
    axes_info = []
    for ax in range(rank):
        n_in, n_out = x.shape[ax], int(out_shape[ax])
        rs, re_ = float(roi[ax]), float(roi[rank + ax])
        if scales[ax] == 1 and n_in == n_out and (not crop or (rs == 0 and re_ == 1)):
            continue  # no resizing along this axis
        xo = _coords(ctm, n_out, n_in, scales[ax], rs, re_)
        out_of_range = ((xo < 0) | (xo > _F32(n_in - 1))) if crop else None
        axes_info.append((ax, n_in, n_out, scales[ax], xo, out_of_range))
    if mode == "nearest":
        # one gather per resized axis (shrinking axes first): contiguous takes beat one N-D fancy index
        y = x
        for ax, n_in, n_out, sc, xo, _ in sorted(axes_info, key=lambda a: a[2] / a[1]):
            y = np.take(y, np.clip(_nearest_index(xo, nearest_mode, sc), 0, n_in - 1), axis=ax)
        if y is x:
            y = x.copy()
    else:
        dt = x.dtype
        cd = _cdtype(dt)
        y = _as(x, cd)
        # shrink first: later passes then touch less data
        for ax, n_in, n_out, sc, xo, _ in sorted(axes_info, key=lambda a: a[2] / a[1]):
            aa = antialias and mode in ("linear", "cubic")
            idx, w = _axis_taps(mode, xo, n_in, sc, cubic_a, exclude_outside, aa)
            wshape = [1] * rank
            wshape[ax] = n_out
            acc = None
            for t in range(idx.shape[0]):
                term = np.take(y, idx[t], axis=ax)
                term *= w[t].astype(cd).reshape(wshape)
                if acc is None:
                    acc = term
                else:
                    acc += term
            y = acc
        y = _as(y, dt)
    if crop:
        bad = None
        for ax, n_in, n_out, sc, xo, oor in axes_info:
            if oor is not None and oor.any():
                shape = [1] * rank
                shape[ax] = n_out
                m = oor.reshape(shape)
                bad = m if bad is None else (bad | m)
        if bad is not None:
            y = np.where(np.broadcast_to(bad, y.shape), np.asarray(extrapolation).astype(y.dtype), y)
    return y


def _scales_vec(scales, rank, axes):
    s = np.asarray(scales, dtype=_F32).reshape(-1)
    if axes:
        full = np.ones(rank, _F32)
        for i, a in enumerate(axes):
            full[a] = s[i]
        return full
    if s.size != rank:
        raise ValueError(f"Resize: {s.size} scales for an input of rank {rank}")
    return s


def _resize_run(ctx, x, roi, scales, sizes, *, mode, ctm, nearest_mode, cubic_a, exclude_outside,
                extrapolation, antialias=0, axes=None, policy="stretch"):
    rank = x.ndim
    axes_n = [normalize_axis(a, rank) for a in axes] if axes else None
    # roi: [starts..., ends...] over all axes (or over ``axes``)
    r = np.concatenate([np.zeros(rank), np.ones(rank)]).astype(_F32)
    if roi is not None and np.asarray(roi).size and ctm == "tf_crop_and_resize":
        rv = np.asarray(roi, dtype=_F32).reshape(-1)
        if axes_n:
            n = len(axes_n)
            for i, a in enumerate(axes_n):
                r[a], r[rank + a] = rv[i], rv[n + i]
        else:
            r = rv
    if scales is not None and np.asarray(scales).size:
        sc = _scales_vec(scales, rank, axes_n)
        if np.any(sc <= 0):
            raise ValueError(f"Resize: scales must be > 0, got {sc.tolist()}")
        out = [int(sc[i] * _F32(x.shape[i])) for i in range(rank)]
    elif sizes is not None and np.asarray(sizes).size:
        sz = [int(v) for v in np.asarray(sizes).reshape(-1)]
        out = list(x.shape)
        if axes_n:
            for i, a in enumerate(axes_n):
                out[a] = sz[i]
        else:
            if len(sz) != rank:
                raise ValueError(f"Resize: {len(sz)} sizes for an input of rank {rank}")
            out = sz
        sc = np.array([_F32(out[i]) / _F32(x.shape[i]) if x.shape[i] else _F32(1) for i in range(rank)],
                      dtype=_F32)
        if policy != "stretch":
            scope = axes_n if axes_n else list(range(rank))
            pick = min if policy == "not_larger" else max
            ps = pick(sc[a] for a in scope)
            for i in range(rank):
                if i in scope:
                    sc[i] = ps
                    out[i] = int(np.floor(ps * _F32(x.shape[i]) + _F32(0.5)))
                else:
                    sc[i] = 1
                    out[i] = x.shape[i]
    else:
        raise ValueError("Resize: one of scales or sizes must be given")
    return _resize_core(x, out, sc, r, mode, ctm, nearest_mode, cubic_a, exclude_outside,
                        extrapolation, antialias)


@kernel("Resize", 10, check=_resize_check)
def resize_10(ctx, x, scales, *, mode):
    return _resize_run(ctx, x, None, scales, None, mode=mode, ctm="asymmetric", nearest_mode="simple",
                       cubic_a=-0.75, exclude_outside=0, extrapolation=0.0)


@kernel("Resize", 11, 13, check=_resize_check)
def resize_11(ctx, x, roi=None, scales=None, sizes=None, *, coordinate_transformation_mode, cubic_coeff_a,
              exclude_outside, extrapolation_value, mode, nearest_mode):
    return _resize_run(ctx, x, roi, scales, sizes, mode=mode, ctm=coordinate_transformation_mode,
                       nearest_mode=nearest_mode, cubic_a=cubic_coeff_a, exclude_outside=exclude_outside,
                       extrapolation=extrapolation_value)


@kernel("Resize", 18, 19, check=_resize_check)
def resize_18(ctx, x, roi=None, scales=None, sizes=None, *, antialias, axes, coordinate_transformation_mode,
              cubic_coeff_a, exclude_outside, extrapolation_value, keep_aspect_ratio_policy, mode,
              nearest_mode):
    return _resize_run(ctx, x, roi, scales, sizes, mode=mode, ctm=coordinate_transformation_mode,
                       nearest_mode=nearest_mode, cubic_a=cubic_coeff_a, exclude_outside=exclude_outside,
                       extrapolation=extrapolation_value, antialias=antialias, axes=axes,
                       policy=keep_aspect_ratio_policy)


def _upsample(x, scales, mode):
    sc = np.asarray(scales, dtype=_F32).reshape(-1)
    if sc.size != x.ndim:
        raise ValueError(f"Upsample: {sc.size} scales for an input of rank {x.ndim}")
    if np.any(sc < 1):
        raise ValueError(f"Upsample: scales must be >= 1, got {sc.tolist()}")
    return _resize_run(None, x, None, sc, None, mode=mode, ctm="asymmetric", nearest_mode="simple",
                       cubic_a=-0.75, exclude_outside=0, extrapolation=0.0)


@kernel("Upsample", 7, check=_resize_check)
def upsample_7(ctx, x, *, mode, scales):
    return _upsample(x, scales, mode)


@kernel("Upsample", 9, 10, check=_resize_check)
def upsample_9(ctx, x, scales, *, mode):
    # opset 10 has the text, inputs and types of opset 9 (it only marks the op deprecated, which
    # makes onnx.checker, and so the core's loader, reject it)
    return _upsample(x, scales, mode)


def _upsample1_check(node):
    mode = _attr(node, "mode", "nearest")
    if mode == "bilinear":
        return ("Upsample-1 mode 'bilinear' is not implemented: opset 1 defines only the output "
                "size, not which input coordinate an output pixel maps to (asymmetric, as Upsample-7 "
                "'linear' later fixed, or align-corners, as Caffe2's UpsampleBilinear computes)")
    if mode != "nearest":
        return f"Upsample-1: mode {mode!r} is not one of nearest, bilinear"
    return None


@kernel("Upsample", 1, check=_upsample1_check)
def upsample_1(ctx, x, *, height_scale, mode, width_scale):
    # opset 1 (experimental): 4-D NCHW, output = floor(in * scale) on H and W; nearest picks
    # input pixel floor(out / scale), as the example and Upsample-7 define
    if x.ndim != 4:
        raise ValueError(f"Upsample-1 takes a 4-D NCHW input, got shape {x.shape}")
    return _upsample(x, [1.0, 1.0, height_scale, width_scale], mode)


# ---------------------------------------------------------------------------------------
# MaxRoiPool
# ---------------------------------------------------------------------------------------

def _round_half_away(v):
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def _max_levels(a):
    """Sparse table along the FIRST axis: level k holds max(a[i:i + 2**k]) (-inf past the end).
    Returns [K, *a.shape]; level rows are contiguous blocks, so gathers by (level, i) are cheap."""
    n = a.shape[0]
    levels = [a]
    s = 1
    while 2 * s <= n:
        prev = levels[-1]
        nxt = np.full_like(prev, -np.inf)
        np.maximum(prev[:n - 2 * s + 1], prev[s:n - s + 1], out=nxt[:n - 2 * s + 1])
        levels.append(nxt)
        s *= 2
    return np.stack(levels)


def _range_query(lo, hi):
    """(level, second start) of the sparse-table query for [lo, hi); empty ranges read [lo, lo+1)."""
    length = np.maximum(hi - lo, 1)
    k = np.floor(np.log2(length)).astype(np.int64)
    k -= (np.left_shift(1, k) > length)  # guard the float log2 at exact powers of two
    k += (np.left_shift(1, k + 1) <= length)
    return k, lo + length - np.left_shift(1, k)


@kernel("MaxRoiPool", 1, 22, dtypes=_FLOAT | _BF16)
def max_roi_pool(ctx, x, rois, *, pooled_shape, spatial_scale):
    """Caffe2's RoIPool (where the op comes from; onnxruntime computes the same bins): each RoI
    corner is scaled and rounded (half away from zero), the RoI spans round(x1*s)..round(x2*s)
    inclusive (at least 1 pixel), bin i covers [floor(i*len/P), ceil((i+1)*len/P)) of it, clipped
    to the input; an empty bin is 0. Bin maxima are range-maximum queries on sparse tables, along
    W (one table for the input) and then H (one per chunk of RoIs): gathers, no loop per bin."""
    if x.ndim != 4:
        raise ValueError(f"MaxRoiPool takes a 4-D NCHW input, got shape {x.shape}")
    if rois.ndim != 2 or rois.shape[1] != 5:
        raise ValueError(f"MaxRoiPool: rois must have shape (num_rois, 5), got {rois.shape}")
    if len(pooled_shape) != 2 or min(pooled_shape) < 1:
        raise ValueError(f"MaxRoiPool: pooled_shape must be 2 positive ints, got {pooled_shape}")
    PH, PW = (int(v) for v in pooled_shape)
    N, C, H, W = x.shape
    R = rois.shape[0]
    dt = x.dtype
    cd = np.dtype(np.float32) if dt.name in ("float16", "bfloat16") else dt
    if R == 0 or C == 0 or H == 0 or W == 0:
        return np.zeros((R, C, PH, PW), dtype=dt)
    r = rois.astype(np.float32)
    bid = r[:, 0].astype(np.int64)
    if np.any(bid < 0) or np.any(bid >= N):
        raise ValueError(f"MaxRoiPool: batch index out of range [0, {N})")
    sc = np.float32(spatial_scale)
    x1, y1, x2, y2 = (_round_half_away(r[:, i] * sc).astype(np.int64) for i in range(1, 5))

    def bins(start, end, P, size):
        length = np.maximum(end - start + 1, 1).astype(np.float32)
        bin_sz = length / np.float32(P)  # [R]
        i = np.arange(P, dtype=np.float32)
        lo = np.floor(i[None, :] * bin_sz[:, None]).astype(np.int64) + start[:, None]
        hi = np.ceil((i[None, :] + 1) * bin_sz[:, None]).astype(np.int64) + start[:, None]
        lo, hi = np.clip(lo, 0, size), np.clip(hi, 0, size)
        ok = hi > lo
        lo = np.minimum(lo, size - 1)
        k, lo2 = _range_query(lo, hi)
        return lo, lo2, k, ok  # [R, P] each

    hlo, hlo2, hk, okh = bins(y1, y2, PH, H)
    wlo, wlo2, wk, okw = bins(x1, x2, PW, W)
    tw = _max_levels(np.ascontiguousarray(_as(x, cd).transpose(3, 0, 2, 1)))  # [KW, W, N, H, C]
    kh_n = max(1, int(np.floor(np.log2(H))) + 1)
    out = np.empty((R, C, PH, PW), dtype=cd)
    step = max(1, 8_000_000 // max(1, PW * C * H * (kh_n + 1)))
    for s0 in range(0, R, step):  # chunks bound the temporaries
        sl = slice(s0, min(R, s0 + step))
        b = bid[sl][:, None]
        t = np.maximum(tw[wk[sl], wlo[sl], b], tw[wk[sl], wlo2[sl], b])  # [r, PW, H, C]
        th = _max_levels(np.ascontiguousarray(t.transpose(2, 0, 1, 3)))  # [KH, H, r, PW, C]
        ri = np.arange(t.shape[0])[:, None, None]
        pi = np.arange(PW)[None, None, :]
        kk = hk[sl][:, :, None]
        y = np.maximum(th[kk, hlo[sl][:, :, None], ri, pi], th[kk, hlo2[sl][:, :, None], ri, pi])
        out[sl] = y.transpose(0, 3, 1, 2)  # [r, PH, PW, C] -> [r, C, PH, PW]
    empty = ~(okh[:, :, None] & okw[:, None, :])  # [R, PH, PW]
    out = np.where(empty[:, None], cd.type(0), out)
    return _as(out, dt)
