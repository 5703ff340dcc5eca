"""Which conv plan a node takes (:func:`select_plan`), and the node's cache and bound step.

A dense 3x3 stride-1 convolution wide enough is Winograd, another dense one with several
taps the direct kernel (any batch); for one image, a 1x1 unpadded convolution is the
pointwise kernel and a depthwise one the compiled depthwise kernel; anything else (a plan
of kind None) takes the general path (``ops/conv.py``). The thresholds are the policy's.
"""

from __future__ import annotations

import numpy as np

from ..ops._nncommon import _F32, _conv_out, _is_const, _native_geometry_ok
from .depthwise import DepthwisePlan
from .direct import DirectPlan
from .plan import ConvPlan
from .pointwise import PointwisePlan
from .policy import current
from .winograd import WinogradPlan


def select_plan(x, w, b, clip, group, strides, dilations, pb, pe, threads=1) -> ConvPlan:
    """The plan of a float32 2-D convolution of ``x`` by ``w`` (plus ``b``, clipped to
    ``clip``) with these resolved strides, dilations and pads; kind None: no fast path."""
    p = current()
    nat = p.native
    if (nat is None or x.dtype != _F32 or w.dtype != _F32 or x.ndim != 4
            or (b is not None and b.shape != (w.shape[0],))):
        return ConvPlan(x, w, b, clip)
    N, C, H, W = x.shape
    M = w.shape[0]
    ks = tuple(w.shape[2:])
    out = tuple(_conv_out(x.shape[2:], ks, strides, dilations, pb, pe))
    if not _native_geometry_ok(x.shape[2:], ks, strides, dilations, pb, pe, out):
        return ConvPlan(x, w, b, clip)  # extreme pads, strides or dilations: the general path
    nonneg = min(pb) >= 0 and min(pe) >= 0
    wino = (p.direct and group == 1 and ks == (3, 3) and list(strides) == [1, 1] and list(dilations) == [1, 1]
            and nonneg and N > 0)
    wide = wino and C >= p.wino_min_c and out[1] >= p.wino_min_ow
    lanes = wino and C >= p.wino_lanes_min_c and p.wino_lanes_ow[0] <= out[1] <= p.wino_lanes_ow[1]
    if wide or lanes:
        return WinogradPlan(x, w, b, clip, nat, out, pb, lanes, threads)
    if (N == 1 and ks == (1, 1) and group == 1 and max(strides) > 1 and not any(pb) and not any(pe)
            and p.pw_lanes and p.linear):
        return PointwisePlan(x, w, b, clip, nat, out, (int(strides[0]), int(strides[1])), True, threads)
    terms = C * ks[0] * ks[1]
    if (p.direct and group == 1 and (ks != (1, 1) or max(strides) > 1) and terms >= p.direct_min_k
            and max(strides) <= 2 and nonneg and min(out) > 0 and N > 0):
        lanes = out[1] <= p.lanes_max_ow and terms >= p.lanes_min_k
        return DirectPlan(x, w, b, clip, nat, out, strides, dilations, pb, lanes, threads)
    if N != 1:
        return ConvPlan(x, w, b, clip)
    if ks == (1, 1) and group == 1 and list(strides) == [1, 1] and not any(pb) and not any(pe):
        return PointwisePlan(x, w, b, clip, nat, (H, W), None, p.pw_lanes and p.linear, threads)
    if w.shape[1] == 1 and M == C == group and group > 1 and nonneg and min(out) > 0:
        return DepthwisePlan(x, w, b, clip, nat, out, ks, strides, dilations, pb, threads)
    return ConvPlan(x, w, b, clip)


def plan_cache(ctx, w, b):
    """The node's cache for its conv plan, or None (no plan, the general path every run): a
    plan keeps what it derived from the weights (packed copies), so only weights and bias
    that are the partition's constants may have one. A weight fed at run time can be the
    same array written in place between runs; a plan keyed on its identity read the old
    values (Linear tests the same way, ``fast/linear.py``). A caller without a context: no plan."""
    cache = getattr(ctx, "cache", None)
    if cache is None or not _is_const(ctx, 1, w) or (b is not None and not _is_const(ctx, 2, b)):
        return None
    return cache


def bind_plan(cache, kernel_fn, attrs):
    """Once per node (``cache`` from :func:`plan_cache`, None: nothing): ``cache["bound"]``
    (see :func:`~runtime_provider_cpu.executable.binds`), the node's plan run straight on
    the inputs it takes (:meth:`ConvPlan.takes`, conv_clipped's own test), else
    ``kernel_fn(ctx, *inputs, **attrs)``. None when the first run made no plan."""
    if cache is None or "bound" in cache:
        return
    plan = cache.get("conv_plan")
    if plan is None or plan.kind is None:
        cache["bound"] = None
        return
    fast, xshape, W, B, shape = plan.fast_call(), plan.xshape, plan.w, plan.b, plan.shape
    takes_z = plan.kind in ConvPlan.Z_KINDS

    def bound(ctx, x, w, b=None, *z):  # z: FusedConv's residual, when given
        # what plan.takes asks, inline (a bound Conv is ~2 us of Python; each call counts)
        if x.shape == xshape and w is W and b is B:
            if not z:
                return fast(x, None)
            if takes_z and len(z) == 1 and z[0].shape == shape and z[0].dtype == _F32:
                return fast(x, z[0])
        return kernel_fn(ctx, x, w, b, *z, **attrs)

    cache["bound"] = bound


def plan_takes(plan, args):
    """Whether a fused step's ``plan`` takes this node's inputs ``(x, w[, b])`` (no residual)."""
    return len(args) <= 3 and plan.takes(args[0], args[1], args[2] if len(args) > 2 else None, None)


def contig(x):
    return x if x.flags.c_contiguous else np.ascontiguousarray(x)
