"""CPU kernels: Resize and Upsample.

Resize follows onnxruntime's CPU kernel arithmetic: coordinates are computed in float32
with the same formulas, so the nearest pixel picked is the same.
"""

from __future__ import annotations

import math

import numpy as np

from ..limits import check_alloc
from ..registry import kernel
from ._common import normalize_axis
from ._nncommon import _F32, _FLOAT, _as, _attr, _cdtype, _in_dtype


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
                extrapolation, antialias=0, axes=None, policy="stretch", what="Resize"):
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
    # the output size comes from the scales/sizes values: the cap first (interpolation runs in
    # the compute dtype, float32 or float64)
    itemsize = x.dtype.itemsize if mode == "nearest" else max(x.dtype.itemsize, _cdtype(x.dtype).itemsize)
    check_alloc(ctx, what, out, itemsize)
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


def _upsample(ctx, x, scales, mode):
    sc = np.asarray(scales, dtype=_F32).reshape(-1)
    if sc.size != x.ndim:
        raise ValueError(f"Upsample: {sc.size} scales for an input of rank {x.ndim}")
    if np.any(sc < 1):
        raise ValueError(f"Upsample: scales must be >= 1, got {sc.tolist()}")
    return _resize_run(ctx, x, None, sc, None, mode=mode, ctm="asymmetric", nearest_mode="simple",
                       cubic_a=-0.75, exclude_outside=0, extrapolation=0.0, what="Upsample")


@kernel("Upsample", 7, check=_resize_check)
def upsample_7(ctx, x, *, mode, scales):
    return _upsample(ctx, x, scales, mode)


@kernel("Upsample", 9, 10, check=_resize_check)
def upsample_9(ctx, x, scales, *, mode):
    # opset 10 has the text, inputs and types of opset 9 (it only marks the op deprecated, which
    # makes onnx.checker, and so the core's loader, reject it)
    return _upsample(ctx, x, scales, mode)


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
    return _upsample(ctx, x, [1.0, 1.0, height_scale, width_scale], mode)


