"""CPU kernels: region pooling (MaxRoiPool, RoiAlign).

RoiAlign builds, per region, two small interpolation matrices (rows x H and cols x W) so
that the average pool is two matmuls; its max mode follows onnxruntime / the ONNX reference
(the max over samples of the largest of the four weighted corner values).
"""

from __future__ import annotations

import math

import numpy as np

from ..limits import check_alloc
from ..registry import kernel
from ._nncommon import _BF16, _FLOAT, _as, _attr, _cdtype, _in_rank


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
    # pooled_shape sets the output's size, the bins' tables and one RoI's sparse table
    check_alloc(ctx, "MaxRoiPool", (R, C, PH, PW), cd.itemsize)
    check_alloc(ctx, "MaxRoiPool bins", (R, PH + PW, 6), 8)
    check_alloc(ctx, "MaxRoiPool table", (max(1, int(np.floor(np.log2(max(H, 1)))) + 1) + 1, H, PW, C),
                cd.itemsize)
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


# ---------------------------------------------------------------------------------------
# RoiAlign
# ---------------------------------------------------------------------------------------

def _roialign_check(node):
    mode = _attr(node, "mode", "avg")
    if mode not in ("avg", "max"):
        return f"RoiAlign: mode {mode!r} is not one of avg, max"
    ctm = _attr(node, "coordinate_transformation_mode", "half_pixel")
    if node.since_version >= 16 and ctm not in ("half_pixel", "output_half_pixel"):
        return f"RoiAlign: coordinate_transformation_mode {ctm!r} is not one of half_pixel, output_half_pixel"
    r = _in_rank(node)
    if r is not None and r != 4:
        return f"RoiAlign is defined for 4-D input only, got rank {r}"
    return None


def _roi_axis(start, bin_size, n_bins, grid, L, cd):
    """Per sample along one axis: (low, high, w_low, w_high, valid), each [n_bins, grid]."""
    s = (start + np.arange(n_bins, dtype=cd)[:, None] * bin_size
         + (np.arange(grid, dtype=cd)[None, :] + cd.type(0.5)) * bin_size / cd.type(grid))
    valid = ~((s < cd.type(-1)) | (s > cd.type(L)))
    s = np.maximum(s, cd.type(0))
    low = s.astype(np.int64)
    edge = low >= L - 1
    low = np.where(edge, L - 1, low)
    high = np.where(edge, L - 1, low + 1)
    s = np.where(edge, low.astype(cd), s)
    lw = s - low.astype(cd)
    hw = cd.type(1) - lw
    return low, high, hw, lw, valid


def _roialign(ctx, x, rois, batch_indices, mode, out_h, out_w, sampling_ratio, spatial_scale, half_pixel):
    Nb, C, H, W = x.shape
    R = rois.shape[0]
    if rois.ndim != 2 or rois.shape[1] != 4 or batch_indices.shape != (R,):
        raise ValueError(f"RoiAlign: rois {rois.shape} / batch_indices {batch_indices.shape} are inconsistent")
    cd = _cdtype(x.dtype)
    check_alloc(ctx, "RoiAlign", (R, C, out_h, out_w), cd.itemsize)  # output_height/width set it
    y = np.zeros((R, C, out_h, out_w), dtype=cd)
    if R == 0 or C == 0 or out_h * out_w == 0:
        return _as(y, x.dtype)
    xc = _as(x, cd)
    rc = _as(rois, cd)
    bidx = np.asarray(batch_indices).astype(np.int64)
    if ((bidx < 0) | (bidx >= Nb)).any():
        raise ValueError(f"RoiAlign: batch index out of range [0, {Nb})")
    off = cd.type(0.5) if half_pixel else cd.type(0)
    sc = cd.type(spatial_scale)
    for r in range(R):
        x1, y1, x2, y2 = (rc[r, k] * sc - off for k in range(4))
        rw, rh = x2 - x1, y2 - y1
        if not half_pixel:
            rw, rh = max(rw, cd.type(1)), max(rh, cd.type(1))
        bh, bw = rh / cd.type(out_h), rw / cd.type(out_w)
        gh = int(sampling_ratio) if sampling_ratio > 0 else int(math.ceil(rh / out_h))
        gw = int(sampling_ratio) if sampling_ratio > 0 else int(math.ceil(rw / out_w))
        if gh <= 0 or gw <= 0:
            continue  # no samples: the output stays 0
        # sampling_ratio (or a huge RoI) sets the samples per bin: capped before the grids are built
        check_alloc(ctx, "RoiAlign samples", (C, out_h, gh, out_w, gw) if mode == "max"
                    else (out_h * gh + out_w * gw, 8), max(cd.itemsize, 8))
        yl, yh, yhw, ylw, yv = _roi_axis(y1, bh, out_h, gh, H, cd)
        xl, xh, xhw, xlw, xv = _roi_axis(x1, bw, out_w, gw, W, cd)
        img = xc[bidx[r]]  # [C, H, W]
        if mode == "avg":
            # separable: Ay [out_h, H] and Ax [out_w, W] sum the weights of all samples of a bin
            Ay = np.zeros((out_h, H), cd)
            Ax = np.zeros((out_w, W), cd)
            rows_h = np.repeat(np.arange(out_h), gh)
            rows_w = np.repeat(np.arange(out_w), gw)
            np.add.at(Ay, (rows_h, yl.reshape(-1)), (yhw * yv).reshape(-1))
            np.add.at(Ay, (rows_h, yh.reshape(-1)), (ylw * yv).reshape(-1))
            np.add.at(Ax, (rows_w, xl.reshape(-1)), (xhw * xv).reshape(-1))
            np.add.at(Ax, (rows_w, xh.reshape(-1)), (xlw * xv).reshape(-1))
            y[r] = np.matmul(np.matmul(Ay, img), Ax.T) / cd.type(max(gh * gw, 1))
        else:
            def corner(yi, xi, wy, wx):
                v = img[:, yi[:, :, None, None], xi[None, None, :, :]]  # [C, oh, gh, ow, gw]
                return v * (wy[:, :, None, None] * wx[None, None, :, :])
            m = np.maximum(np.maximum(corner(yl, xl, yhw, xhw), corner(yl, xh, yhw, xlw)),
                           np.maximum(corner(yh, xl, ylw, xhw), corner(yh, xh, ylw, xlw)))
            ok = yv[:, :, None, None] & xv[None, None, :, :]
            m = np.where(ok, m, cd.type(0))  # samples outside the image count as 0
            y[r] = m.max(axis=(2, 4))
    return _as(y, x.dtype)


@kernel("RoiAlign", 10, dtypes=_FLOAT, check=_roialign_check)
def roi_align_10(ctx, x, rois, batch_indices, *, mode, output_height, output_width, sampling_ratio,
                 spatial_scale):
    return _roialign(ctx, x, rois, batch_indices, mode, output_height, output_width, sampling_ratio,
                     spatial_scale, False)


@kernel("RoiAlign", 16, 22, dtypes=_FLOAT | _BF16, check=_roialign_check)
def roi_align_16(ctx, x, rois, batch_indices, *, coordinate_transformation_mode, mode, output_height,
                 output_width, sampling_ratio, spatial_scale):
    return _roialign(ctx, x, rois, batch_indices, mode, output_height, output_width, sampling_ratio,
                     spatial_scale, coordinate_transformation_mode == "half_pixel")
