"""CPU kernels: Conv and ConvTranspose.

Conv: float32 2-D nodes with constant weights run the plan their first run chose
(``fast/conv.py``: Winograd, direct, pointwise, depthwise); the general path below is
im2col (``fast/im2col.py``) and one matmul per group (stacked ``np.matmul``), 1x1 kernels
a plain matmul over the (strided) input, depthwise convolutions one multiply-add per kernel
tap. Float16 is computed in float32 and cast back. Padding far larger than what the output
reads is never materialized: the windows are gathered instead (``_window_gather``).
ConvTranspose is one matmul per group followed by a col2im scatter-add per kernel tap, into
a buffer of the output's size.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..executable import binds
# the module, not its names: fast.conv imports ops._nncommon, so either may be imported first
from ..fast import conv as fast_conv
from ..fast import depthwise as fast_depthwise, im2col as fast_im2col
from ..fast.policy import current
from ..fast.sgemm import sgemm_ready
from ..limits import check_alloc
from ..registry import kernel
from ._nncommon import (
    _F32, _FLOAT, _as, _attr, _cdtype, _check_kernel_shape, _check_window_fits, _conv_out, _conv_pads, _ints, _native_geometry_ok, _pad_const,
    _padding_extreme, _tap_range, _tap_slice, _window_gather,
)


def _conv_check(node):
    ap = _attr(node, "auto_pad", "NOTSET")
    if ap not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        return f"{node.op_type}: auto_pad {ap!r} is not a valid value"
    if _attr(node, "group", 1) < 1:
        return f"{node.op_type}: group must be >= 1"
    return None



def _conv_core(x, w, b, group, strides, dilations, pb, pe, clip=None, z=None, threads=1, library=False):
    """The convolution of padded ``x`` by ``w`` plus ``b`` (plus ``z``, of the result's shape:
    a fused residual sum); ``clip`` = (lo, hi) then clips it (a fused Relu or Clip). Where the
    extension is built these are one pass over the result. ``library``: the GEMM on numpy's
    matmul and depthwise convolutions on numpy (the im2col plan, ``fast/im2col.py``)."""
    pol = current()
    nat = pol.native
    N, C = x.shape[:2]
    nd = x.ndim - 2
    M = w.shape[0]
    ks = w.shape[2:]
    out = _conv_out(x.shape[2:], ks, strides, dilations, pb, pe)
    if min(ks, default=1) > 0 and _padding_extreme(x.shape[2:], ks, strides, dilations, pb, pe, out):
        # the windows' positions only (sized from the output), read as a stride-ks convolution
        x = _window_gather(x, ks, strides, dilations, pb, out, 0)
        strides, dilations, pb, pe = list(ks), [1] * nd, [0] * nd, [0] * nd
    k_eff = [(ks[i] - 1) * dilations[i] + 1 for i in range(nd)]
    if z is not None and z.shape != (N, M, *out):
        raise ValueError(f"FusedConv: Z of shape {z.shape} must have the output's shape {(N, M, *out)}")
    Cg, Mg = C // group, M // group
    P = math.prod(out)
    K = math.prod(ks)
    nonneg = nd == 2 and min(pb) >= 0 and min(pe) >= 0
    taps = nonneg and K > 1 and Cg * group == C and not (Cg == 1 and group > 1)
    dw_einsum = nonneg and Cg == 1 and Mg == 1 and group > 1 and P <= pol.dw_einsum_max_pixels
    native_dw = (nat is not None and not library and nonneg and Cg == 1 and Mg == 1 and group > 1
                 and x.dtype == _F32 and z is None
                 and _native_geometry_ok(x.shape[2:], ks, strides, dilations, pb, pe, out))
    # the im2col copies, the einsum and the compiled depthwise kernel pad themselves; every
    # other path reads a padded copy
    xp = None if (taps or dw_einsum or native_dw or N == 0 or P == 0 or M == 0) else _pad_const(x, pb, pe, 0)
    if N == 0 or P == 0 or M == 0:
        y = np.zeros((N, M, *out), dtype=x.dtype)
    elif native_dw:
        # the compiled depthwise kernel: one pass, bias included (see native/depthwise.c)
        y = np.empty((N, M, *out), dtype=_F32)
        lo, hi = (-np.inf, np.inf) if clip is None else clip
        nat.depthwise2d(np.ascontiguousarray(x), np.ascontiguousarray(w),
                            None if b is None else np.ascontiguousarray(b), y, x.shape, tuple(out),
                            tuple(ks), tuple(strides), tuple(dilations), (pb[0], pb[1]),
                            lo, hi)
        return y
    elif dw_einsum:
        y = fast_depthwise.depthwise_einsum(x, w, strides, dilations, pb, pe, out)
    elif Cg == 1 and group > 1 and Mg == 1 and nd == 2 and (
            strides == [1, 1] or dilations == [1, 1]):
        y = fast_depthwise.depthwise_flat(xp, w.reshape(group, K), ks, strides, dilations, out, b)
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
            if N > 1:
                # a GEMM an image and group on the NCHW tensor as it is ([N, group, Mg, P]):
                # no [C, N*P] copy of the input and no transpose of the result back
                y = np.matmul(w.reshape(group, Mg, Cg), sl.reshape(N, group, Cg, P))
                return _epilogue(y.reshape(N, M, *out), b, clip, z, nat, N, M, P, nd)
            cols = sl.reshape(group, Cg, P)
        elif taps:
            cols = fast_im2col.im2col_2d(x, ks, strides, dilations, pb, out).reshape(group, Cg * K, N * P)
        else:
            win = sliding_window_view(xp, k_eff, axis=tuple(range(2, 2 + nd)))
            win = win[(slice(None), slice(None))
                      + tuple(slice(None, (out[i] - 1) * strides[i] + 1, strides[i]) for i in range(nd))
                      + tuple(slice(None, None, dilations[i]) for i in range(nd))]
            # -> [C, *k, N, *out] so that one reshape gives [group, Cg*K, N*P]
            perm = (1,) + tuple(range(2 + nd, 2 + 2 * nd)) + (0,) + tuple(range(2, 2 + nd))
            cols = np.ascontiguousarray(win.transpose(perm)).reshape(group, Cg * K, N * P)
        wm = w.reshape(group, Mg, Cg * K)
        if (group == 1 and N == 1 and not library and type(x) is np.ndarray and type(w) is np.ndarray  # host arrays only
                and x.dtype == _F32 and w.dtype == _F32 and sgemm_ready()):
            # one image: the compiled pointwise kernel on the GEMM (single-threaded sgemm a
            # block on the kernel threads, bias, sum and clip in its epilogue; numpy's threaded
            # BLAS would wake worker threads that spin through the next nodes)
            lo, hi = (-np.inf, np.inf) if clip is None else clip
            y = np.empty((1, M, *out), _F32)
            nat.pointwise(np.ascontiguousarray(wm[0]), np.ascontiguousarray(cols[0]),
                              None if b is None else np.ascontiguousarray(b, dtype=_F32),
                              None if z is None else np.ascontiguousarray(z, dtype=_F32).reshape(M, P), y,
                              (M, Cg * K, P), float(lo), float(hi), max(1, int(threads)))
            return y
        y = np.matmul(wm, cols)  # [group, Mg, N*P]
        if N == 1:
            y = y.reshape(1, M, *out)
        else:
            y = np.ascontiguousarray(y.reshape(M, N, P).transpose(1, 0, 2)).reshape(N, M, *out)
    return _epilogue(y.reshape(N, M, *out), b, clip, z, nat, N, M, P, nd)


def _epilogue(y, b, clip, z, nat, N, M, P, nd):
    """``y`` [N, M, *out] (ours) plus the bias and ``z``, clipped: in place, one pass where compiled."""
    if b is None and clip is None and z is None:
        return y
    if nat is not None and y.dtype == _F32 and y.flags.c_contiguous:  # z has y's dtype
        lo, hi = (-np.inf, np.inf) if clip is None else clip
        bb = None if b is None else np.ascontiguousarray(b, dtype=_F32)
        zz = None if z is None else np.ascontiguousarray(z)
        for n in range(N):  # bias, sum and clip in one pass
            nat.bias_clip(y[n], bb, (M, P), lo, hi, None if zz is None else zz[n])
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
    cache = fast_conv.plan_cache(ctx, w, b)
    y = conv_clipped(x, w, b, None, auto_pad=auto_pad, dilations=dilations, group=group,
                     kernel_shape=kernel_shape, pads=pads, strides=strides, cache=cache,
                     threads=getattr(ctx, "threads", 1), ctx=ctx)
    fast_conv.bind_plan(cache, conv, dict(auto_pad=auto_pad, dilations=dilations, group=group,
                                kernel_shape=kernel_shape, pads=pads, strides=strides))
    return y



def conv_clipped(x, w, b, clip, *, auto_pad, dilations, group, kernel_shape, pads, strides, z=None,
                 cache=None, threads=1, ctx=None, act=None):
    """Conv plus ``z`` when given, then clipped to ``clip`` = (lo, hi) when given (FusedConv's
    sum and Relu / Clip), then ``act`` = (kind, alpha, beta) of ``_native.activate`` when given
    (float32 only, the extension built: FusedConv's HardSwish, HardSigmoid, Sigmoid, SiLU, in
    the kernel's epilogue where it has one). ``cache`` (the node's) keeps what the first run decided for the
    input's shape (``fast/conv.py``); ``threads`` bounds the compiled kernels' threads;
    ``ctx`` (the node's) says whether its session measures kernels and records the choice."""
    if cache is not None:
        plan = cache.get("conv_plan")
        if (plan is None or plan.xshape != x.shape or plan.w is not w or plan.b is not b or plan.clip != clip
                or plan.act != act):
            plan = None
            _check_kernel_shape("Conv", kernel_shape, w.shape)  # a kept plan's W passed it
            _check_output(ctx, x, w, strides, dilations, pads, auto_pad)
            if x.ndim == 4 and x.shape[1] == w.shape[1] * group and w.ndim == 4:
                st, dl = _ints(strides, 2, 1), _ints(dilations, 2, 1)
                k_eff = [(w.shape[2 + i] - 1) * dl[i] + 1 for i in range(2)]
                pb, pe = _conv_pads(x.shape[2:], k_eff, st, pads, auto_pad)
                plan = fast_conv.select_plan(x, w, b, clip, group, st, dl, pb, pe, threads, ctx, act)
                cache["conv_plan"] = plan
        if plan is not None and plan.takes(x, w, b, z):
            return plan.run(x, z)
    nd = x.ndim - 2
    if nd < 1:
        raise ValueError(f"Conv needs an input of rank >= 3, got shape {x.shape}")
    _check_kernel_shape("Conv", kernel_shape, w.shape)
    strides = _ints(strides, nd, 1)
    dilations = _ints(dilations, nd, 1)
    ks = w.shape[2:]
    k_eff = [(ks[i] - 1) * dilations[i] + 1 for i in range(nd)]
    pb, pe = _conv_pads(x.shape[2:], k_eff, strides, pads, auto_pad)
    _check_window_fits("Conv", x.shape[2:], k_eff, pb, pe)
    check_alloc(ctx, "Conv", (x.shape[0], w.shape[0], *_conv_out(x.shape[2:], ks, strides, dilations, pb, pe)),
                x.dtype.itemsize)
    if x.shape[1] != w.shape[1] * group:
        raise ValueError(f"Conv: input channels {x.shape[1]} != W.shape[1] {w.shape[1]} * group {group}")
    dt = x.dtype
    cd = _cdtype(dt)
    y = _conv_core(_as(x, cd), _as(w, cd), None if b is None else _as(b, cd), group, strides,
                   dilations, pb, pe, clip, z if z is None else _as(z, cd), threads)
    y = _as(y, dt)
    if act is not None:
        y = np.ascontiguousarray(y)  # ours: a fresh result
        current().native.activate(y, y, y.size, *act)
    return y




def _check_output(ctx, x, w, strides, dilations, pads, auto_pad):
    """The tensor-size cap on the output, before a plan is chosen (pads or dilations near 2**62
    give a valid model with a huge output)."""
    nd = x.ndim - 2
    if nd < 1 or w.ndim != x.ndim:
        return
    st, dl = _ints(strides, nd, 1), _ints(dilations, nd, 1)
    k_eff = [(w.shape[2 + i] - 1) * dl[i] + 1 for i in range(nd)]
    pb, pe = _conv_pads(x.shape[2:], k_eff, st, pads, auto_pad)
    _check_window_fits("Conv", x.shape[2:], k_eff, pb, pe)
    check_alloc(ctx, "Conv", (x.shape[0], w.shape[0], *_conv_out(x.shape[2:], w.shape[2:], st, dl, pb, pe)),
                x.dtype.itemsize)


@kernel("ConvTranspose", 1, 11, 22, dtypes=_FLOAT, check=_conv_check)
def conv_transpose(ctx, x, w, b=None, *, auto_pad, dilations, group, kernel_shape,
                   output_padding, output_shape, pads, strides):
    v1 = ctx.node.since_version == 1
    N, C = x.shape[:2]
    nd = x.ndim - 2
    strides = _ints(strides, nd, 1)
    dilations = _ints(dilations, nd, 1)
    opad = _ints(output_padding, nd, 0)
    _check_kernel_shape("ConvTranspose", kernel_shape, w.shape)
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
    if any(o <= 0 for o in out):  # onnxruntime refuses an empty output axis
        raise ValueError(f"ConvTranspose: the output's spatial size {out} has an axis <= 0 (input {tuple(in_sp)}, "
                         f"pads {pb}, {pe}, output_shape {list(output_shape or [])})")
    dt = x.dtype
    cd = _cdtype(dt)
    # output_shape, strides or pads set the output's size: capped before anything is allocated
    check_alloc(ctx, "ConvTranspose", (N, M, *[max(o, 0) for o in out]), cd.itemsize)
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
    # col2im straight into the output: input position j of tap t lands on
    # j * stride + t * dilation - pb, kept where that falls in [0, out) (the full result's
    # cropped part, however large the strides, dilations or pads, is never built)
    y = np.zeros((M, N, *[max(o, 0) for o in out]), dtype=cd)
    for kidx, offs in enumerate(np.ndindex(*ks)):
        rng = [_tap_range(max(out[i], 0), pb[i], offs[i] * dilations[i], strides[i], in_sp[i]) for i in range(nd)]
        if any(hi <= lo for lo, hi in rng):
            continue
        dst = tuple(_tap_slice(rng[i][0] * strides[i] + offs[i] * dilations[i] - pb[i], strides[i],
                               rng[i][1] - rng[i][0]) for i in range(nd))
        y[(slice(None), slice(None)) + dst] += cols[(slice(None), kidx, slice(None))
                                                    + tuple(slice(lo, hi) for lo, hi in rng)]
    y = np.ascontiguousarray(np.moveaxis(y, 0, 1)) if N > 1 else y.reshape(1, M, *out)
    if b is not None:
        y = y + _as(b, cd).reshape((M,) + (1,) * nd)
    return _as(y, dt)
