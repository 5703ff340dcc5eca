"""CPU kernels: more nn ops (sampling, geometry, normalizations, detection).

GridSample, AffineGrid, DeformConv, RoiAlign, Col2Im, MaxUnpool, CenterCropPad,
LpNormalization, MeanVarianceNormalization, NonMaxSuppression.

Design notes
------------
* Interpolation is separable: every spatial axis contributes a few taps (index, weight,
  validity) and the N-D result is the sum over the tensor product of taps, each one a single
  vectorised gather over the flattened spatial axes (``take_along_axis``).
* float16 / bfloat16 are computed in float32 and cast back; float32 and float64 stay as they are.
* RoiAlign builds, per region, two small interpolation matrices (rows x H and cols x W) so that
  the average pool is two matmuls; its max mode follows onnxruntime / the ONNX reference (the
  max over samples of the largest of the four weighted corner values).
* NonMaxSuppression computes the IoU of all candidates of a class at once and then runs the
  greedy selection over boxes (the selection is sequential by nature).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..registry import kernel
from .nn import _as, _attr, _in_dtype  # the nn family's small helpers
from ._common import normalize_axis

_FLOAT = frozenset({"float16", "float32", "float64"})
_BF16 = frozenset({"bfloat16"})


def _cdtype(dt) -> np.dtype:
    return np.dtype(np.float64) if np.dtype(dt) == np.float64 else np.dtype(np.float32)




def _in_rank(node, i=0):
    info = node.input_info[i] if len(node.input_info) > i else None
    return None if info is None or info.shape is None else len(info.shape)


def _ints(v, n, fill):
    return [fill] * n if not v else [int(i) for i in v]


# ---------------------------------------------------------------------------------------
# shared N-D sampling
# ---------------------------------------------------------------------------------------

def _gather_sum(xr, taps, in_sp):
    """Sum over the tensor product of per-axis taps.

    ``xr``: [B, G, Cg, P] (P = prod(in_sp)); ``taps[i]``: list of (index, weight) for spatial
    axis i, each array of shape [B, G, Q] (index int64 already inside [0, in_sp[i]); weight in
    the compute dtype with invalid taps weighted 0). Returns [B, G, Cg, Q].
    """
    nd = len(in_sp)
    strides = [math.prod(in_sp[i + 1:]) for i in range(nd)]
    acc = None
    for combo in itertools.product(*taps):
        flat = combo[0][0] * strides[0]
        w = combo[0][1]
        for i in range(1, nd):
            flat = flat + combo[i][0] * strides[i]
            w = w * combo[i][1]
        v = np.take_along_axis(xr, flat[:, :, None, :], axis=3)
        v *= w[:, :, None, :]
        if acc is None:
            acc = v
        else:
            acc += v
    return acc


def _cubic_coeffs(t, cd):
    a = cd.type(-0.75)
    one, two = cd.type(1), cd.type(2)
    t = np.abs(t)
    c0 = ((a * (t + one) - cd.type(5) * a) * (t + one) + cd.type(8) * a) * (t + one) - cd.type(4) * a
    c1 = ((a + two) * t - (a + cd.type(3))) * t * t + one
    u = one - t
    c2 = ((a + two) * u - (a + cd.type(3))) * u * u + one
    v = two - t
    c3 = ((a * v - cd.type(5) * a) * v + cd.type(8) * a) * v - cd.type(4) * a
    return [c0, c1, c2, c3]


def _reflect(x, lo, hi):
    """Reflect ``x`` by the near border until it lies in [lo, hi] (PyTorch / ONNX rule)."""
    rng = hi - lo
    if rng <= 0:
        return np.full_like(x, lo)
    below = x < lo
    above = x > hi
    dx = np.where(below, lo - x, x - hi)
    n = np.trunc(dx / rng)
    r = dx - n * rng
    even = np.fmod(n, 2) == 0
    fb = np.where(even, lo + r, hi - r)
    fa = np.where(even, hi - r, lo + r)
    return np.where(below, fb, np.where(above, fa, x)).astype(x.dtype, copy=False)


# ---------------------------------------------------------------------------------------
# GridSample
# ---------------------------------------------------------------------------------------

_GS_MODES = {16: ("bilinear", "nearest", "bicubic"), 20: ("linear", "nearest", "cubic"),
             22: ("linear", "nearest", "cubic")}
_GS_CANON = {"bilinear": "linear", "bicubic": "cubic", "linear": "linear", "cubic": "cubic",
             "nearest": "nearest"}


def _gridsample_check(node):
    v = node.since_version
    mode = _attr(node, "mode", "bilinear" if v == 16 else "linear")
    if mode not in _GS_MODES.get(v, ()):
        return f"GridSample-{v}: mode {mode!r} is not one of {', '.join(_GS_MODES.get(v, ()))}"
    pm = _attr(node, "padding_mode", "zeros")
    if pm not in ("zeros", "border", "reflection"):
        return f"GridSample: padding_mode {pm!r} is not one of zeros, border, reflection"
    r = _in_rank(node)
    if v == 16 and r is not None and r != 4:
        return f"GridSample-16 is defined for 4-D input only, got rank {r}"
    if r is not None and r < 3:
        return f"GridSample: input rank must be >= 3, got {r}"
    dt = _in_dtype(node)
    if dt is not None:
        if _GS_CANON[mode] != "nearest" and dt.name not in (_FLOAT | _BF16):
            return f"GridSample: mode {mode!r} on {dt.name} is not implemented (float types only)"
        if dt.kind not in "biufc" and dt.name not in _BF16:
            return f"GridSample on {dt.name} is not implemented"
    return None


def _gridsample(x, grid, mode, padding_mode, align_corners):
    mode = _GS_CANON[mode]
    N, C = x.shape[:2]
    in_sp = x.shape[2:]
    nd = len(in_sp)
    if grid.ndim != nd + 2 or grid.shape[0] != N or grid.shape[-1] != nd:
        raise ValueError(f"GridSample: grid shape {grid.shape} does not fit input shape {x.shape}")
    out_sp = grid.shape[1:-1]
    Q = math.prod(out_sp)
    if N * C * Q == 0 or math.prod(in_sp) == 0:
        return np.zeros((N, C, *out_sp), dtype=x.dtype)
    is_float = x.dtype.kind == "f" or x.dtype.name in _BF16
    cd = _cdtype(x.dtype) if is_float else _cdtype(grid.dtype)
    g = _as(grid, cd).reshape(N, 1, Q, nd)
    taps = []
    for i in range(nd):
        L = in_sp[i]
        n = g[..., nd - 1 - i]  # the grid lists coordinates innermost axis first (x, y, ...)
        if align_corners:
            xs = (n + cd.type(1)) / cd.type(2) * cd.type(L - 1)
            lo, hi = 0.0, float(L - 1)
        else:
            xs = ((n + cd.type(1)) * cd.type(L) - cd.type(1)) / cd.type(2)
            lo, hi = -0.5, L - 0.5
        if mode == "nearest":
            xs = np.rint(xs)
        if mode != "cubic":
            # a coordinate outside the borders is first moved in (clipped or reflected); cubic
            # applies the padding to each of its four taps only (PyTorch's grid_sample, which
            # the spec points to, and onnxruntime): moving the coordinate would bend the kernel
            outside = (xs < lo) | (xs > hi)
            if padding_mode == "border":
                xs = np.where(outside, np.clip(xs, cd.type(0), cd.type(L - 1)), xs)
            elif padding_mode == "reflection":
                xs = np.where(outside, _reflect(xs, cd.type(lo), cd.type(hi)), xs)

        def tap(idx, w, L=L, lo=lo, hi=hi):
            if padding_mode == "zeros":
                ok = (idx >= 0) & (idx < L)
                w = np.where(ok, w, cd.type(0))
                return np.clip(idx, 0, L - 1), w
            if padding_mode == "border":
                return np.clip(idx, 0, L - 1), w
            r = _reflect(idx.astype(np.float64), lo, hi)
            return np.clip(np.trunc(r).astype(np.int64), 0, L - 1), w

        if mode == "nearest":
            taps.append([tap(np.trunc(xs).astype(np.int64), np.ones(xs.shape, cd))])
        elif mode == "linear":
            f = np.floor(xs)
            t = (xs - f).astype(cd, copy=False)
            i0 = f.astype(np.int64)
            taps.append([tap(i0, cd.type(1) - t), tap(i0 + 1, t)])
        else:
            f = np.floor(xs)
            t = (xs - f).astype(cd, copy=False)
            i0 = f.astype(np.int64)
            cs = _cubic_coeffs(t, cd)
            taps.append([tap(i0 + k - 1, cs[k]) for k in range(4)])
    xr = x.reshape(N, 1, C, -1)
    if mode == "nearest":
        flat = None
        ok = None
        strides = [math.prod(in_sp[i + 1:]) for i in range(nd)]
        for i in range(nd):
            idx, w = taps[i][0]
            flat = idx * strides[i] if flat is None else flat + idx * strides[i]
            m = w != 0
            ok = m if ok is None else ok & m
        y = np.take_along_axis(xr, flat[:, :, None, :], axis=3)
        if padding_mode == "zeros" and not ok.all():
            y = np.where(ok[:, :, None, :], y, np.zeros((), dtype=x.dtype))
        return y.reshape(N, C, *out_sp)
    y = _gather_sum(_as(xr, cd), taps, in_sp)
    return _as(y.reshape(N, C, *out_sp), x.dtype)


@kernel("GridSample", 16, 20, 22, check=_gridsample_check)
def grid_sample(ctx, x, grid, *, align_corners, mode, padding_mode):
    return _gridsample(x, grid, mode, padding_mode, align_corners)


# ---------------------------------------------------------------------------------------
# AffineGrid
# ---------------------------------------------------------------------------------------

def _base_coords(L, align_corners):
    if align_corners:
        return np.linspace(-1.0, 1.0, L) if L > 1 else np.full(L, -1.0)
    return (2.0 * np.arange(L) + 1.0) / L - 1.0


@kernel("AffineGrid", 20, dtypes=_FLOAT | _BF16)
def affine_grid(ctx, theta, size, *, align_corners):
    sz = [int(v) for v in np.asarray(size).reshape(-1)]
    if len(sz) not in (4, 5):
        raise ValueError(f"AffineGrid: size must have 4 (2-D) or 5 (3-D) elements, got {sz}")
    N, sp = sz[0], sz[2:]
    nd = len(sp)
    if theta.shape != (N, nd, nd + 1):
        raise ValueError(f"AffineGrid: theta shape {theta.shape} != {(N, nd, nd + 1)} for size {sz}")
    cd = _cdtype(theta.dtype)
    axes = [_base_coords(L, align_corners).astype(cd) for L in sp]
    mesh = np.meshgrid(*axes, indexing="ij")  # each [*sp], spatial order (D,) H, W
    # homogeneous base coordinates in (x, y, (z), 1) order: x varies along the last axis
    base = np.stack([m.reshape(-1) for m in mesh[::-1]] + [np.ones(math.prod(sp), cd)], axis=0)
    grid = np.matmul(_as(theta, cd), base)  # [N, nd, P]
    return _as(np.ascontiguousarray(grid.transpose(0, 2, 1)).reshape(N, *sp, nd), theta.dtype)


# ---------------------------------------------------------------------------------------
# DeformConv
# ---------------------------------------------------------------------------------------

@kernel("DeformConv", 19, 22, dtypes=_FLOAT | _BF16)
def deform_conv(ctx, x, w, offset, b=None, mask=None, *, dilations, group, kernel_shape,
                offset_group, pads, strides):
    N, C = x.shape[:2]
    nd = x.ndim - 2
    if nd < 1:
        raise ValueError(f"DeformConv needs an input of rank >= 3, got shape {x.shape}")
    in_sp = x.shape[2:]
    ks = [int(k) for k in kernel_shape] if kernel_shape else list(w.shape[2:])
    strides = _ints(strides, nd, 1)
    dilations = _ints(dilations, nd, 1)
    p = _ints(pads, 2 * nd, 0)
    M = w.shape[0]
    if C != w.shape[1] * group or M % group:
        raise ValueError(f"DeformConv: X {x.shape}, W {w.shape} and group {group} are inconsistent")
    if C % offset_group:
        raise ValueError(f"DeformConv: {C} input channels are not divisible by offset_group {offset_group}")
    K = math.prod(ks)
    out_sp = offset.shape[2:]
    exp = [(in_sp[i] + p[i] + p[nd + i] - ((ks[i] - 1) * dilations[i] + 1)) // strides[i] + 1
           for i in range(nd)]
    if list(out_sp) != exp or offset.shape[:2] != (N, offset_group * K * nd):
        raise ValueError(f"DeformConv: offset shape {offset.shape} != {(N, offset_group * K * nd, *exp)}")
    Q = math.prod(out_sp)
    G = offset_group
    cd = _cdtype(x.dtype)
    off = _as(offset, cd).reshape(N, G, K, nd, Q)
    kpos = np.stack(np.meshgrid(*[np.arange(k) for k in ks], indexing="ij"), 0).reshape(nd, K)
    opos = np.stack(np.meshgrid(*[np.arange(o) for o in out_sp], indexing="ij"), 0).reshape(nd, Q)
    taps = []
    for i in range(nd):
        base = (opos[i] * strides[i] - p[i])[None, :] + (kpos[i] * dilations[i])[:, None]  # [K, Q]
        pos = base.astype(cd)[None, None] + off[:, :, :, i, :]  # [N, G, K, Q]
        f = np.floor(pos)
        t = (pos - f).reshape(N, G, K * Q)
        i0 = f.astype(np.int64).reshape(N, G, K * Q)
        L = in_sp[i]
        axis_taps = []
        for idx, wt in ((i0, cd.type(1) - t), (i0 + 1, t)):
            ok = (idx >= 0) & (idx < L)
            axis_taps.append((np.clip(idx, 0, L - 1), np.where(ok, wt, cd.type(0))))
        taps.append(axis_taps)
    xr = _as(x, cd).reshape(N, G, C // G, -1)
    cols = _gather_sum(xr, taps, in_sp)  # [N, G, C/G, K*Q]
    if mask is not None:
        cols *= _as(mask, cd).reshape(N, G, 1, K * Q)
    Cg, Mg = C // group, M // group
    cols = cols.reshape(N, group, Cg * K, Q)
    wm = _as(w, cd).reshape(group, Mg, Cg * K)
    y = np.matmul(wm[None], cols).reshape(N, M, *out_sp)
    if b is not None:
        y += _as(b, cd).reshape((M,) + (1,) * nd)
    return _as(y, x.dtype)


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


def _roialign(x, rois, batch_indices, mode, out_h, out_w, sampling_ratio, spatial_scale, half_pixel):
    Nb, C, H, W = x.shape
    R = rois.shape[0]
    if rois.ndim != 2 or rois.shape[1] != 4 or batch_indices.shape != (R,):
        raise ValueError(f"RoiAlign: rois {rois.shape} / batch_indices {batch_indices.shape} are inconsistent")
    cd = _cdtype(x.dtype)
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
    return _roialign(x, rois, batch_indices, mode, output_height, output_width, sampling_ratio,
                     spatial_scale, False)


@kernel("RoiAlign", 16, 22, dtypes=_FLOAT | _BF16, check=_roialign_check)
def roi_align_16(ctx, x, rois, batch_indices, *, coordinate_transformation_mode, mode, output_height,
                 output_width, sampling_ratio, spatial_scale):
    return _roialign(x, rois, batch_indices, mode, output_height, output_width, sampling_ratio,
                     spatial_scale, coordinate_transformation_mode == "half_pixel")


# ---------------------------------------------------------------------------------------
# Col2Im / MaxUnpool / CenterCropPad
# ---------------------------------------------------------------------------------------

@kernel("Col2Im", 18)
def col2im(ctx, data, image_shape, block_shape, *, dilations, pads, strides):
    img = [int(v) for v in np.asarray(image_shape).reshape(-1)]
    ks = [int(v) for v in np.asarray(block_shape).reshape(-1)]
    nd = len(img)
    if len(ks) != nd:
        raise ValueError(f"Col2Im: image_shape {img} and block_shape {ks} differ in length")
    dil = _ints(dilations, nd, 1)
    st = _ints(strides, nd, 1)
    p = _ints(pads, 2 * nd, 0)
    if data.ndim != 3:
        raise ValueError(f"Col2Im: input must be [N, C*prod(block_shape), L], got shape {data.shape}")
    N, CK, L = data.shape
    K = math.prod(ks)
    if K == 0 or CK % K:
        raise ValueError(f"Col2Im: input dim 1 ({CK}) is not a multiple of prod(block_shape) ({K})")
    C = CK // K
    blocks = [(img[i] + p[i] + p[nd + i] - (dil[i] * (ks[i] - 1) + 1)) // st[i] + 1 for i in range(nd)]
    if any(b < 1 for b in blocks) or math.prod(blocks) != L:
        raise ValueError(f"Col2Im: {L} blocks in the input, but the geometry gives {blocks}")
    ext = [max(img[i] + p[i] + p[nd + i], (blocks[i] - 1) * st[i] + (ks[i] - 1) * dil[i] + 1)
           for i in range(nd)]
    cols = data.reshape(N, C, K, *blocks)
    out = np.zeros((N, C, *ext), dtype=data.dtype)
    for kidx, offs in enumerate(np.ndindex(*ks)):
        sl = (slice(None), slice(None)) + tuple(
            slice(offs[i] * dil[i], offs[i] * dil[i] + (blocks[i] - 1) * st[i] + 1, st[i]) for i in range(nd))
        out[sl] += cols[:, :, kidx]
    return np.ascontiguousarray(out[(slice(None), slice(None)) + tuple(
        slice(p[i], p[i] + img[i]) for i in range(nd))])


@kernel("MaxUnpool", 9, 11, 22)
def max_unpool(ctx, x, indices, output_shape=None, *, kernel_shape, pads, strides):
    nd = x.ndim - 2
    ks = [int(k) for k in kernel_shape]
    if len(ks) != nd:
        raise ValueError(f"MaxUnpool: kernel_shape {ks} does not fit input rank {x.ndim}")
    st = _ints(strides, nd, 1)
    p = _ints(pads, 2 * nd, 0)
    inferred = [x.shape[0], x.shape[1]] + [(x.shape[2 + i] - 1) * st[i] - (p[i] + p[nd + i]) + ks[i]
                                           for i in range(nd)]
    if indices.shape != x.shape:
        raise ValueError(f"MaxUnpool: indices shape {indices.shape} != X shape {x.shape}")
    total = math.prod(inferred)
    idx = np.asarray(indices).reshape(-1).astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= total):
        raise ValueError(f"MaxUnpool: an index is out of range [0, {total})")
    y = np.zeros(total, dtype=x.dtype)
    y[idx] = x.reshape(-1)
    y = y.reshape(inferred)
    if output_shape is None or np.asarray(output_shape).size == 0:
        return y
    osh = [int(v) for v in np.asarray(output_shape).reshape(-1)]
    if len(osh) != x.ndim or any(o < i for o, i in zip(osh, inferred)):
        raise ValueError(f"MaxUnpool: output_shape {osh} is smaller than the unpooled shape {inferred}")
    if osh == inferred:
        return y
    res = np.zeros(osh, dtype=x.dtype)
    res[tuple(slice(0, i) for i in inferred)] = y
    return res


@kernel("CenterCropPad", 18)
def center_crop_pad(ctx, x, shape, *, axes):
    rank = x.ndim
    ax = [normalize_axis(a, rank) for a in axes] if axes else list(range(rank))
    sh = [int(v) for v in np.asarray(shape).reshape(-1)]
    if len(sh) != len(ax):
        raise ValueError(f"CenterCropPad: {len(sh)} sizes for {len(ax)} axes")
    crop = [slice(None)] * rank
    place = [slice(None)] * rank
    new_shape = list(x.shape)
    for a, s in zip(ax, sh):
        d = x.shape[a]
        if s < 0:
            raise ValueError(f"CenterCropPad: negative size {s}")
        new_shape[a] = s
        if s < d:
            b = (d - s) // 2
            crop[a] = slice(b, b + s)
        elif s > d:
            b = (s - d) // 2
            place[a] = slice(b, b + d)
    cropped = x[tuple(crop)]
    if tuple(new_shape) == cropped.shape:
        return np.ascontiguousarray(cropped) if cropped is not x else x.copy()
    out = np.zeros(new_shape, dtype=x.dtype)
    out[tuple(place)] = cropped
    return out


# ---------------------------------------------------------------------------------------
# LpNormalization / MeanVarianceNormalization
# ---------------------------------------------------------------------------------------

def _lpnorm_check(node):
    p = _attr(node, "p", 2)
    if p not in (1, 2):
        return f"LpNormalization: p={p} is not defined (only 1 and 2 are)"
    return None


@kernel("LpNormalization", 1, 22, dtypes=_FLOAT | _BF16, check=_lpnorm_check)
def lp_normalization(ctx, x, *, axis, p):
    if x.size == 0:
        return x.copy()
    ax = normalize_axis(axis, x.ndim)
    cd = _cdtype(x.dtype)
    xc = _as(x, cd)
    if p == 1:
        norm = np.sum(np.abs(xc), axis=ax, keepdims=True)
    else:
        norm = np.sqrt(np.sum(xc * xc, axis=ax, keepdims=True))
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(norm == 0, cd.type(0), xc / norm)
    return _as(y, x.dtype)


@kernel("MeanVarianceNormalization", 9, 13, dtypes=_FLOAT | _BF16)
def mean_variance_normalization(ctx, x, *, axes):
    # the schema's function: (X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9)
    ax = tuple(sorted({normalize_axis(a, x.ndim) for a in axes}))
    cd = _cdtype(x.dtype)
    xc = _as(x, cd)
    mean = np.mean(xc, axis=ax, keepdims=True)
    var = np.mean(xc * xc, axis=ax, keepdims=True) - mean * mean
    std = np.sqrt(np.maximum(var, cd.type(0)))
    return _as((xc - mean) / (std + cd.type(1e-9)), x.dtype)


# ---------------------------------------------------------------------------------------
# NonMaxSuppression
# ---------------------------------------------------------------------------------------

def _scalar(v, cast, default):
    if v is None:
        return default
    a = np.asarray(v).reshape(-1)
    return default if a.size == 0 else cast(a[0])


def _corners(boxes, center_point_box):
    """[..., 4] -> (y_min, x_min, y_max, x_max) in float64."""
    b = boxes.astype(np.float64)
    if center_point_box:
        xc, yc, w, h = b[..., 0], b[..., 1], b[..., 2] / 2, b[..., 3] / 2
        return yc - h, xc - w, yc + h, xc + w
    return (np.minimum(b[..., 0], b[..., 2]), np.minimum(b[..., 1], b[..., 3]),
            np.maximum(b[..., 0], b[..., 2]), np.maximum(b[..., 1], b[..., 3]))


def _nms_check(node):
    cpb = _attr(node, "center_point_box", 0)
    if cpb not in (0, 1):
        return f"NonMaxSuppression: center_point_box {cpb} is not 0 or 1"
    return None


@kernel("NonMaxSuppression", 10, 11, check=_nms_check)
def non_max_suppression(ctx, boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                        score_threshold=None, *, center_point_box):
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3:
        raise ValueError(f"NonMaxSuppression: boxes {boxes.shape} must be [B, N, 4] and scores "
                         f"{scores.shape} [B, C, N]")
    B, Nb = boxes.shape[:2]
    if scores.shape[0] != B or scores.shape[2] != Nb:
        raise ValueError(f"NonMaxSuppression: scores shape {scores.shape} does not fit boxes {boxes.shape}")
    max_out = max(_scalar(max_output_boxes_per_class, int, 0), 0)
    iou_t = _scalar(iou_threshold, float, 0.0)
    score_t = _scalar(score_threshold, float, None)
    C = scores.shape[1]
    if max_out == 0 or B * C * Nb == 0:
        return np.zeros((0, 3), dtype=np.int64)
    y0, x0, y1, x1 = _corners(boxes, center_point_box)
    area = (x1 - x0) * (y1 - y0)
    sel = []
    for b in range(B):
        for c in range(C):
            sc = scores[b, c].astype(np.float64)
            cand = np.nonzero(sc > score_t)[0] if score_t is not None else np.arange(Nb)
            if cand.size == 0:
                continue
            order = cand[np.lexsort((cand, -sc[cand]))]  # score descending, then lower index
            by0, bx0, by1, bx1, ba = (v[b, order] for v in (y0, x0, y1, x1, area))
            iy = np.minimum(by1[:, None], by1[None, :]) - np.maximum(by0[:, None], by0[None, :])
            ix = np.minimum(bx1[:, None], bx1[None, :]) - np.maximum(bx0[:, None], bx0[None, :])
            inter = np.where((iy > 0) & (ix > 0), iy * ix, 0.0)
            union = ba[:, None] + ba[None, :] - inter
            with np.errstate(divide="ignore", invalid="ignore"):
                ok = (inter > 0) & (ba[:, None] > 0) & (ba[None, :] > 0) & (union > 0)
                suppress = ok & (np.where(ok, inter / np.where(ok, union, 1.0), 0.0) > iou_t)
            kept = []
            for i in range(order.size):
                if kept and suppress[i, kept].any():
                    continue
                kept.append(i)
                if len(kept) >= max_out:
                    break
            sel.extend((b, c, int(order[i])) for i in kept)
    return np.array(sel, dtype=np.int64).reshape(-1, 3)
