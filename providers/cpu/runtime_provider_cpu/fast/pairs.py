"""Pair fusers: two conv-family steps that run as one compiled call (AVX-512 builds).

Each is registered with the executable's ``pairs`` (a producer and its only consumer) or
``siblings`` (two steps reading the same input) and asked once, after the session's first
run has made both nodes' plans; it returns ``run(args_a, args_b)`` or None (kept apart).
The policy's ``expand_dw``, ``conv_maxpool`` and ``conv_shortcut`` switch each off.
"""

from __future__ import annotations

import numpy as np

from ..executable import pairs, siblings
# the module, not its names: fast.conv imports the ops package, which imports this module
from . import autotune as _autotune
from . import conv as _fconv
from .packing import pack_direct, pack_lanes
from .policy import current

_F32 = np.float32


def _plan(ctx):
    """The node's conv plan, or None where its result is more than the plan's (a FusedConv
    activation applied after it, :func:`~.conv.bind_plan`'s ``post``): no fused call has it."""
    return None if ctx.cache.get("conv_post") else ctx.cache.get("conv_plan")


def _plan_act(ctx):
    """The node's conv plan where its result is the plan's own, a FusedConv activation in its
    kernel's epilogue (``plan.act``) included; None where an activation runs after the plan."""
    plan = ctx.cache.get("conv_plan")
    if plan is None or (ctx.cache.get("conv_post") and (plan.act is None or not plan.NATIVE_ACT)):
        return None
    return plan


@pairs
def _fuse_expand_depthwise(ca, cb):
    """An inverted-residual block's expansion and depthwise convolution as one call of
    ``_native.expand_dw`` (AVX-512): both nodes planned (``fast/conv.py``) on the compiled
    pointwise kernel and the phase-plane depthwise one (3x3, 5x5 or 7x7, stride 1 or 2 both
    ways, no dilation; each with its FusedConv activation in the kernels' epilogues),
    the second reading the first's output shape (a depthwise plan of 16 channels in the lanes
    gives the same sums in another order: the pair is then not bit for bit the two steps, but
    within rounding): the expanded tensor is never written and read
    back whole. A batch is one call an image (each image's expansion stays in L2; a batch of 8
    at 112 x 112 wrote and read back 25 MB). Whether the pair is fused is measured on this
    machine (``fast/autotune.py``, family "pair": the fused call against the two steps, on a
    random input of the shape) and cached per shape; with tuning off it is fused."""
    pol = current()
    _native = pol.native
    pa, pb = _plan_act(ca), _plan_act(cb)
    if (not pol.expand_dw or pa is None or pb is None or not getattr(_native, "CONV_FAST", 0)
            or not hasattr(_native, "expand_dw") or pa.kind != "pointwise" or pa.sub is not None
            or pa.w12 is None or pb.kind not in ("depthwise", "depthwise_lanes") or pb.xshape != pa.shape):
        return None
    _, out, ks, strides, dilations, pads, lo, hi, threads = pb.args
    if (ks[0] != ks[1] or ks[0] not in (3, 5, 7) or strides[0] != strides[1] or strides[0] not in (1, 2)
            or tuple(dilations) != (1, 1)):
        return None
    M, C, H, W = pa.shape[1], pa.xshape[1], pa.xshape[2], pa.xshape[3]
    none = (-1, 1.0 / 6.0, 0.5)
    geometry = ((M, C, H, W), (out[0], out[1], strides[0], pads[0], pads[1]), lo, hi, pa.threads, ks[0],
                tuple(pa.act or none), tuple(pb.act or none))
    lo1, hi1 = pa.args[1], pa.args[2]
    w12, b1, wd, bd, shape, N = pa.w12, pa.b2, pb.w2, pb.b2, pb.shape, pa.xshape[0]
    fn = _native.expand_dw

    def run(args_a, args_b):
        if (len(args_b) > 2 or args_b[0] is not pb.w or (args_b[1] if len(args_b) > 1 else None) is not pb.b
                or not _fconv.plan_takes(pa, args_a)):
            return None
        return fused(_fconv.contig(args_a[0]))

    def fused(x):
        y = np.empty(shape, _F32)
        for n in range(N):  # contiguous images of x and y: the kernel's one-image buffers
            fn(w12, x[n], b1, lo1, hi1, wd, bd, y[n], *geometry)
        return y

    key = _autotune.cache_key("pair", ("expand_dw",) + tuple(pa.xshape) + (M,) + tuple(ks) + tuple(strides)
                              + tuple(pads) + geometry[-2][:1] + geometry[-1][:1], "float32", pa.threads)
    name = _autotune.decide("pair", key, ["fused", "apart"], "fused", getattr(ca, "tune", True))
    if name is None:
        x = np.random.default_rng(0).standard_normal(pa.xshape).astype(_F32)
        call_a, call_b = pa.fast_call(), pb.fast_call()
        name, _ = _autotune.measure(key, {"fused": lambda: fused(x), "apart": lambda: call_b(call_a(x, None), None)})
    return run if name == "fused" else None


@pairs
def _fuse_conv_maxpool(ca, cb):
    """A stem and its pool (ResNet's 7x7 stride-2 convolution and 3x3 stride-2 MaxPool) as
    one call of ``_native.conv_maxpool`` (AVX-512): the convolution planned on the direct
    kernel's position tiles for one image, the pool 3x3, stride 2, padded by 1 on every side,
    no dilation, no ceil mode and no Indices output: the convolution's output is never written
    and read back whole."""
    pol = current()
    _native = pol.native
    pa = _plan(ca)
    node = cb.node
    if (not pol.conv_maxpool or pa is None or pa.kind != "direct" or pa.args[-1] or pa.xshape[0] != 1
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
        if args_b or not _fconv.plan_takes(pa, args_a):
            return None
        y = np.empty(shape, _F32)
        _native.conv_maxpool(_fconv.contig(args_a[0]), w2, b2, y, *geometry)
        return y

    return run


@siblings
def _fuse_conv_shortcut(ca, cb):
    """A downsampling block's first convolution (the direct kernel, one image) and its
    shortcut, a 1x1 convolution of the same strides and output size on the same input
    (pointwise plan on the subsampled image), as one ``_native.conv2d`` call with ``extra``:
    the shortcut reads the phase planes the first one filled, at the window position of
    input (0, 0) (its top and left pads), instead of numpy's strided copy of the input and a
    kernel of its own. Bit-identical to the two steps of a pointwise shortcut; a shortcut on
    ``pointwise_rows`` (which reads its positions in place too) sums in another order: within
    rounding of it."""
    pol = current()
    pa, pb = _plan(ca), _plan(cb)
    sub = None if pb is None else pb.sub if pb.kind == "pointwise" else (
        pb.args[1] if pb.kind == "pointwise_rows" and max(pb.args[1]) > 1 else None)
    if (not pol.conv_shortcut or pol.native is None or pa is None or pb is None or pa.kind != "direct"
            or sub is None or pa.xshape != pb.xshape or pa.xshape[0] != 1
            or pa.shape[2:] != pb.shape[2:] or tuple(pa.args[2]) != tuple(sub)):
        return None
    xshape, mk, strides, dilations, pads, out, lo, hi, threads, lanes = pa.args
    if pads[0] > (mk[1] - 1) * dilations[0] or pads[1] > (mk[2] - 1) * dilations[1]:
        return None
    M2, C = pb.w.shape[:2]
    w4 = np.ascontiguousarray(pb.w, dtype=_F32).reshape(M2, C, 1, 1)
    wp2 = pack_lanes(w4) if lanes else pack_direct(w4)
    fn, w2, b2, shape_a, shape_b, args = pol.native.conv2d, pa.w2, pa.b2, pa.shape, pb.shape, pa.args
    extra_tail = (M2, pads[0], pads[1], pb.lo, pb.hi, lanes)

    def run(args_a, args_b):
        if not _fconv.plan_takes(pa, args_a) or not _fconv.plan_takes(pb, args_b):
            return None
        ya, yb = np.empty(shape_a, _F32), np.empty(shape_b, _F32)
        fn(_fconv.contig(args_a[0]), w2, b2, None, ya, *args, (wp2, pb.b2, None, yb) + extra_tail)
        return ya, yb

    return run

