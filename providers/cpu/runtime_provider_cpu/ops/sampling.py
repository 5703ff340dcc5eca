"""CPU kernels: ops that sample an input at computed coordinates (GridSample, AffineGrid,
DeformConv).

Interpolation is separable: every spatial axis contributes a few taps (index, weight,
validity) and the N-D result is the sum over the tensor product of taps, each one a single
vectorised gather over the flattened spatial axes (``take_along_axis``). float16 / bfloat16
are computed in float32 and cast back; float32 and float64 stay as they are.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..limits import check_alloc
from ..registry import kernel
from ._nncommon import _BF16, _FLOAT, _as, _attr, _cdtype, _in_dtype, _in_rank, _ints


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
    check_alloc(ctx, "AffineGrid", (max(N, 1), *sp, nd + 1), cd.itemsize)  # size's values set the grid's
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


