"""CPU kernels: pooling (MaxPool, AveragePool, LpPool, their Global forms, MaxUnpool).

Pooling reduces strided views, one per kernel tap along one axis at a time (max, sum and Lp
sums are separable), so no Python loop ever runs over output pixels; float32 2-D MaxPool
runs the compiled separable kernel (``_native.maxpool2d``) where the extension is built.
"""

from __future__ import annotations

import math

import numpy as np

from ..fast.policy import current
from ..limits import check_alloc
from ..registry import kernel
from ._nncommon import (
    _F32, _FLOAT, _as, _attr, _cdtype, _check_pool_fits, _ints, _native_geometry_ok, _pad_const, _padding_extreme, _spatial_axes,
    _split_same, _tap_range, _tap_slice, _window_gather,
)
from ._common import ignore_fp


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


def _windows(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, op="MaxPool"):
    """MaxPool's and LpPool's window attributes resolved against x: ``(nd, kernel, strides,
    dilations, begin pads, end pads, output sizes, effective kernel extents)``."""
    nd = x.ndim - 2
    ks = [int(k) for k in kernel_shape]
    strides = _ints(strides, nd, 1)
    dilations = _ints(dilations, nd, 1)
    pb, pe, out = _pool_geometry(x.shape[2:], ks, strides, pads, dilations, auto_pad, ceil_mode)
    k_eff = [(ks[i] - 1) * dilations[i] + 1 for i in range(nd)]
    _check_pool_fits(op, x.shape, k_eff, strides, pb, pe)
    return nd, ks, strides, dilations, pb, pe, out, k_eff


def _pooled_padded(x, pb, pe, out, strides, k_eff, fill):
    """x padded so that every window of the output fits (ceil mode may need extra)."""
    nd = len(pb)
    ends = [max(pe[i], (out[i] - 1) * strides[i] + k_eff[i] - x.shape[2 + i] - pb[i])
            if out[i] > 0 else pe[i] for i in range(nd)]
    return _pad_const(x, pb, ends, fill)


def _pool_windows(x, ks, strides, dilations, pb, pe, out, k_eff, fill):
    """``(xp, strides, dilations)``: x padded with ``fill`` so that every window of the
    output fits, read with these strides and dilations; where that padding would be far
    larger than what the output reads (extreme pads, strides or dilations) the windows'
    positions gathered instead (``_window_gather``: strides ``ks``, no dilation)."""
    if _padding_extreme(x.shape[2:], ks, strides, dilations, pb, pe, out):
        return _window_gather(x, ks, strides, dilations, pb, out, fill), list(ks), [1] * len(ks)
    return _pooled_padded(x, pb, pe, out, strides, k_eff, fill), strides, dilations


def _reduce_axis(x, axis, k, stride, dil, n_out, op, pad=0):
    """Windowed reduction along one axis: op over the k taps (stride, dilation) of ``x``
    padded by ``pad`` in front (and at the end as far as the windows reach) with ``op``'s
    identity, without building that padded copy: each tap reduces only the outputs whose
    window position falls inside x (on an already padded input, ``pad`` 0, every tap covers
    every output). ``None`` when no tap covers every output (a window could hold padding only)."""
    size = x.shape[axis]
    ranges = {t: _tap_range(size, pad, t * dil, stride, n_out) for t in _taps_touching(size, pad, k, stride, dil, n_out)}
    full = next((t for t, (lo, hi) in ranges.items() if lo == 0 and hi == n_out), None)
    if full is None:
        return None

    def view(t, lo, hi):
        start = lo * stride + t * dil - pad
        sl = [slice(None)] * x.ndim
        sl[axis] = slice(start, start + (hi - lo - 1) * stride + 1, stride)
        return x[tuple(sl)]

    acc = view(full, 0, n_out).copy()
    for t, (lo, hi) in ranges.items():
        if t != full and hi > lo:
            sl = [slice(None)] * x.ndim
            sl[axis] = slice(lo, hi)
            part = acc[tuple(sl)]
            op(part, view(t, lo, hi), out=part)
    return acc


def _taps_touching(size, pad, k, stride, dil, n_out):
    """The taps of a k-tap window that read the input for some output (tap 0 always, for an
    empty output): all k when that is cheap, else only those, so that a kernel of 2**40 taps
    costs what the input and output cost."""
    per_out = size // dil + 2  # at most this many taps of one window position fall inside x
    if k <= n_out * per_out:
        return range(k)
    taps = {0}
    for o in range(n_out):
        start = o * stride - pad  # the input position tap 0 of output o reads
        lo = max(0, -(start // dil))  # the first tap t with start + t * dil >= 0
        hi = min(k - 1, (size - 1 - start) // dil)  # the last tap inside x
        taps.update(range(lo, hi + 1))
    return sorted(taps)


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


def _cap(ctx, op, x, out, itemsize):
    """The tensor-size cap on a pool's output (pads, strides or dilations near 2**62 make it huge)."""
    check_alloc(ctx, op, (*x.shape[:2], *out), itemsize)


def _neg_fill(dt):
    return -np.inf if dt.kind == "f" else np.iinfo(dt).min


def _maxpool_impl(ctx, x, auto_pad, ceil_mode, dilations, kernel_shape, pads, storage_order, strides):
    nd, ks, strides, dilations, pb, pe, out, k_eff = _windows(x, kernel_shape, strides, dilations, pads,
                                                               auto_pad, ceil_mode)
    want_idx = ctx.n_outputs > 1 and ctx.outputs_wanted[1]
    _cap(ctx, "MaxPool", x, out, max(x.dtype.itemsize, 8 if ctx.n_outputs > 1 else 1))
    N, C = x.shape[:2]
    if N * C * math.prod(out) == 0:
        y = np.zeros((N, C, *out), dtype=x.dtype)
        return (y, np.zeros(y.shape, np.int64)) if ctx.n_outputs > 1 else y
    nat = current().native
    if (not want_idx and nat is not None and nd == 2 and x.dtype == _F32 and min(pb) >= 0
            and _native_geometry_ok(x.shape[2:], ks, strides, dilations, pb, pe, out)):
        # compiled: separable, unit-stride (column phases), over the kernel threads
        # (measurements: providers/cpu/docs/performance.md)
        y = np.empty((N, C, *out), _F32)
        nat.maxpool2d(np.ascontiguousarray(x), y, x.shape, tuple(out), tuple(ks), tuple(strides),
                      tuple(dilations), (pb[0], pb[1]), getattr(ctx, "threads", 1))
        return (y, None) if ctx.n_outputs > 1 else y
    if not want_idx:
        y = _maxpool_unpadded(x, ks, strides, dilations, pb, pe, out)
        if y is None:
            xp, st, dl = _pool_windows(x, ks, strides, dilations, pb, pe, out, k_eff, _neg_fill(x.dtype))
            y = _separable_pool(xp, ks, st, dl, out, np.maximum)
        return (y, None) if ctx.n_outputs > 1 else y
    xp, st, dl = _pool_windows(x, ks, strides, dilations, pb, pe, out, k_eff, _neg_fill(x.dtype))
    best = None
    arg = np.zeros((N, C, *out), dtype=np.int64)
    for kidx, offs in enumerate(np.ndindex(*ks)):
        sl = xp[(slice(None), slice(None)) + tuple(
            _tap_slice(offs[i] * dl[i], st[i], out[i]) for i in range(nd))]
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


def _avgpool_impl(ctx, x, auto_pad, ceil_mode, count_include_pad, dilations, kernel_shape, pads, strides):
    nd = x.ndim - 2
    ks = [int(k) for k in kernel_shape]
    strides = _ints(strides, nd, 1)
    dilations = _ints(dilations, nd, 1)
    in_sp = x.shape[2:]
    pb, pe, out = _pool_geometry(in_sp, ks, strides, pads, dilations, auto_pad, ceil_mode)
    k_eff = [(ks[i] - 1) * dilations[i] + 1 for i in range(nd)]
    _check_pool_fits("AveragePool", x.shape, k_eff, strides, pb, pe)
    dt = x.dtype
    cd = _cdtype(dt)
    N, C = x.shape[:2]
    _cap(ctx, "AveragePool", x, out, cd.itemsize)
    if N * C * math.prod(out) == 0:
        return np.zeros((N, C, *out), dtype=dt)
    xp, st, dl = _pool_windows(_as(x, cd), ks, strides, dilations, pb, pe, out, k_eff, 0)
    s = _separable_pool(xp, ks, st, dl, out, np.add)
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
    with ignore_fp(divide="ignore", invalid="ignore"):
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
    return _avgpool_impl(ctx, x, auto_pad, 0, 0, None, kernel_shape, pads, strides)


@kernel("AveragePool", 7, dtypes=_FLOAT, check=_pool_check)
def averagepool_7(ctx, x, *, auto_pad, count_include_pad, kernel_shape, pads, strides):
    return _avgpool_impl(ctx, x, auto_pad, 0, count_include_pad, None, kernel_shape, pads, strides)


@kernel("AveragePool", 10, 11, dtypes=_FLOAT, check=_pool_check)
def averagepool_10(ctx, x, *, auto_pad, ceil_mode, count_include_pad, kernel_shape, pads, strides):
    return _avgpool_impl(ctx, x, auto_pad, ceil_mode, count_include_pad, None, kernel_shape, pads, strides)


@kernel("AveragePool", 19, 22, dtypes=_FLOAT, check=_pool_check)
def averagepool_19(ctx, x, *, auto_pad, ceil_mode, count_include_pad, dilations, kernel_shape, pads,
                   strides):
    return _avgpool_impl(ctx, x, auto_pad, ceil_mode, count_include_pad, dilations, kernel_shape, pads, strides)


def _lppool_impl(ctx, x, auto_pad, ceil_mode, dilations, kernel_shape, p, pads, strides):
    nd, ks, strides, dilations, pb, pe, out, k_eff = _windows(x, kernel_shape, strides, dilations, pads,
                                                               auto_pad, ceil_mode, "LpPool")
    dt = x.dtype
    cd = _cdtype(dt)
    N, C = x.shape[:2]
    _cap(ctx, "LpPool", x, out, cd.itemsize)
    if N * C * math.prod(out) == 0:
        return np.zeros((N, C, *out), dtype=dt)
    xa = np.abs(_as(x, cd))
    xa = xa * xa if p == 2 else xa ** cd.type(p)
    xp, st, dl = _pool_windows(xa, ks, strides, dilations, pb, pe, out, k_eff, 0)
    s = _separable_pool(xp, ks, st, dl, out, np.add)
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
    return _lppool_impl(ctx, x, auto_pad, 0, None, kernel_shape, p, pads, strides)


@kernel("LpPool", 2, 11, dtypes=_FLOAT, check=_pool_check)
def lppool_2(ctx, x, *, auto_pad, kernel_shape, p, pads, strides):
    return _lppool_impl(ctx, x, auto_pad, 0, None, kernel_shape, p, pads, strides)


@kernel("LpPool", 18, 22, dtypes=_FLOAT, check=_pool_check)
def lppool_18(ctx, x, *, auto_pad, ceil_mode, dilations, kernel_shape, p, pads, strides):
    return _lppool_impl(ctx, x, auto_pad, ceil_mode, dilations, kernel_shape, p, pads, strides)


def row_means(xc, n, threads=1):
    """The mean of each of the ``n`` rows of the C-contiguous, non-empty float ``xc`` read as
    ``[n, -1]`` (GlobalAveragePool; ReduceMean over trailing axes, squeeze-excite's): float32 in
    one compiled pass (``_native.row_means``, the sums of ``_native.squeeze_excite``'s means: a
    lone step's numpy calls cost several times their warm time in a model run), else one
    contiguous axis, where np.mean over two axes is slower (the same pairwise sum)."""
    r = xc.reshape(n, -1)
    nat = current().native
    if type(xc) is np.ndarray and xc.dtype == _F32 and nat is not None and hasattr(nat, "row_means"):  # host arrays only
        s = np.empty(n, _F32)
        nat.row_means(r, s, r.shape, max(1, int(threads)))
        return s
    if r.shape[1] <= 4096:
        # einsum's SIMD row sums for small planes (a sequential sum in 8-16 lanes; numpy's
        # pairwise one is kept for larger planes)
        s = np.einsum("ij->i", r)
    else:
        s = np.add.reduce(r, axis=1)
    s /= xc.dtype.type(r.shape[1])
    return s


@kernel("GlobalAveragePool", 1, 22, dtypes=_FLOAT)
def global_average_pool(ctx, x):
    cd = _cdtype(x.dtype)
    xc = _as(x, cd)
    if x.ndim >= 3 and xc.flags.c_contiguous and x.size:
        s = row_means(xc, xc.shape[0] * xc.shape[1], getattr(ctx, "threads", 1))
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

