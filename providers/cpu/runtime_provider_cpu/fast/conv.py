"""Which conv plan a node takes (:func:`select_plan`), and the node's cache and bound step.

The candidates of a float32 2-D convolution are the algorithms whose kernels take its
geometry: im2col and a GEMM (the library call: :class:`~.im2col.Im2colPlan`; for one image
also on SciPy's sgemm a block on the kernel threads, ``Im2colSgemmPlan``, or on the pointwise
kernel's packed tiles, ``Im2colLanesPlan``), Winograd
(dense 3x3 stride 1), the direct kernel (dense, stride at most 2), the pointwise kernel
(1x1, no pads; a batch one image at a time) and the compiled depthwise ones (any batch; one
channel plane at a time, or 16 channels in the vector lanes).
Which of them a shape takes is measured on this machine on the node's weights and first input
(``fast/autotune.py``), or forced by the policy; a plan of kind None takes the general path
(``ops/conv.py``). The layouts (output channels in the vector lanes or not) are the policy's.
"""

from __future__ import annotations

import numpy as np

from ..ops._nncommon import _F32, _conv_out, _is_const, _native_geometry_ok
from .. import arena
from . import autotune
# the plan modules, not their names: each imports the ops package, whose conv kernels import
# this module, so any of them may be the first imported
from . import depthwise, direct, im2col, pointwise, winograd
from .plan import ConvPlan
from .policy import current
from .sgemm import sgemm_ready


def candidates(x, w, b, clip, group, strides, dilations, pb, pe, threads=1) -> dict:
    """name -> a function making that plan, for each algorithm that takes this convolution
    ("im2col", the library call, first); {} where none does (the general path)."""
    p = current()
    nat = p.native
    if (x.dtype != _F32 or w.dtype != _F32 or x.ndim != 4
            or (b is not None and b.shape != (w.shape[0],))):
        return {}
    N, C, H, W = x.shape
    M = w.shape[0]
    ks = tuple(w.shape[2:])
    out = tuple(_conv_out(x.shape[2:], ks, strides, dilations, pb, pe))
    if not _native_geometry_ok(x.shape[2:], ks, strides, dilations, pb, pe, out):
        return {}  # extreme pads, strides or dilations: the general path
    found = {"im2col": lambda: im2col.Im2colPlan(x, w, b, clip, nat, out, group, strides, dilations, pb, pe, threads)}
    if nat is None or N == 0 or min(out) <= 0:
        return found
    nonneg = min(pb) >= 0 and min(pe) >= 0
    dense = group == 1 and nonneg
    if N == 1 and group == 1 and sgemm_ready():
        found["im2col_sgemm"] = lambda: im2col.Im2colSgemmPlan(x, w, b, clip, nat, out, group, strides, dilations, pb, pe,
                                                        threads)
    if N == 1 and dense and ks != (1, 1) and p.pw_lanes and p.linear:
        found["im2col_lanes"] = lambda: im2col.Im2colLanesPlan(x, w, b, clip, nat, out, strides, dilations, pb, threads)
    if p.direct and dense and ks == (3, 3) and list(strides) == [1, 1] and list(dilations) == [1, 1]:
        wide = C >= p.wino_min_c and out[1] >= p.wino_min_ow
        lanes = C >= p.wino_lanes_min_c and p.wino_lanes_ow[0] <= out[1] <= p.wino_lanes_ow[1]
        if wide or lanes:
            found["winograd"] = lambda lanes=lanes: winograd.WinogradPlan(x, w, b, clip, nat, out, pb, lanes, threads)
    terms = C * ks[0] * ks[1]
    if p.direct and dense and (ks != (1, 1) or max(strides) > 1) and max(strides) <= 2:
        lanes = out[1] <= p.lanes_max_ow and terms >= p.lanes_min_k
        found["direct"] = lambda lanes=lanes: direct.DirectPlan(x, w, b, clip, nat, out, strides, dilations, pb, lanes, threads)
    if ks == (1, 1) and group == 1 and not any(pb) and not any(pe):
        if list(strides) == [1, 1]:
            found["pointwise"] = lambda: pointwise.PointwisePlan(x, w, b, clip, nat, (H, W), None, p.pw_lanes and p.linear,
                                                       threads)
        elif p.pw_lanes and p.linear:
            found["pointwise"] = lambda: pointwise.PointwisePlan(x, w, b, clip, nat, out, (int(strides[0]), int(strides[1])),
                                                       True, threads)
        if p.pw_lanes and p.linear and hasattr(nat, "pointwise_rows"):
            found["pointwise_rows"] = lambda: pointwise.PointwiseRowsPlan(x, w, b, clip, nat, out, strides, threads)
    if w.shape[1] == 1 and M == C == group and group > 1 and nonneg:
        found["depthwise"] = lambda: depthwise.DepthwisePlan(x, w, b, clip, nat, out, ks, strides, dilations, pb, threads)
        if getattr(nat, "CONV_FAST", 0) and max(ks) <= 7 and tuple(dilations) == (1, 1):
            found["depthwise_lanes"] = lambda: depthwise.DepthwiseLanesPlan(x, w, b, clip, nat, out, ks, strides,
                                                                            dilations, pb, threads)
    return found


def _unmeasured(found, w, strides, dilations) -> set:
    """The candidates not worth timing: numpy's K*K passes over each plane (the im2col plan of
    a depthwise convolution) against the AVX-512 phase planes (3x3, 5x5, 7x7, stride 1 or 2:
    4-16x apart on every shape measured). Timed on a loaded machine, a run on the kernel
    threads could lose to the single-threaded numpy one, and that choice is cached for good."""
    ks = tuple(w.shape[2:])
    if ("depthwise" in found and getattr(current().native, "CONV_FAST", 0) and ks[0] == ks[1]
            and ks[0] in (3, 5, 7) and strides[0] == strides[1] and strides[0] <= 2 and tuple(dilations) == (1, 1)):
        return {"im2col"}
    return set()


def select_plan(x, w, b, clip, group, strides, dilations, pb, pe, threads=1, ctx=None, act=None) -> ConvPlan:
    """The plan of a float32 2-D convolution of ``x`` by ``w`` (plus ``b``, clipped to
    ``clip``, then activated by ``act``: :meth:`ConvPlan.set_act`) with these resolved
    strides, dilations and pads: the candidate forced by the
    policy, cached for this machine and shape, or measured on ``x`` now; with tuning off
    (the policy's ``tune``, the node's session's ``session.cpu.autotune``) im2col and GEMM.
    Kind None: no candidate (the general path)."""
    found = candidates(x, w, b, clip, group, strides, dilations, pb, pe, threads)
    if not found:
        plan = ConvPlan(x, w, b, clip)
        plan.set_act(act)
        return plan
    names = list(found)
    shape = tuple(x.shape) + tuple(w.shape) + (group,) + tuple(strides) + tuple(dilations) + tuple(pb) + tuple(pe)
    if act is not None:  # measured with the activation (in some kernels' epilogue): its own entry
        shape += ("act", act[0])
    key = autotune.cache_key("conv", shape, "float32", threads)
    name = autotune.decide("conv", key, names, "im2col", getattr(ctx, "tune", True))
    if name is None:
        skip = _unmeasured(found, w, strides, dilations)
        made = {n: make() for n, make in found.items() if n not in skip}
        for pl in made.values():
            pl.set_act(act)
        if len(made) == 1:
            name = next(iter(made))
        else:
            calls = {n: pl.act_call() for n, pl in made.items()}  # not the plans' own: those are the runs
            name, _ = autotune.measure(key, {n: (lambda c=c: c(x, None)) for n, c in calls.items()})
        plan = made.pop(name)
        if made:  # the losers' packed weights and scratch, freed, given back rather than kept
            del made, calls
            arena.release()
    else:
        plan = found[name]()
        plan.set_act(act)
    autotune.note(ctx, "x".join(map(str, x.shape)), name)
    return plan


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


def bind_plan(cache, kernel_fn, attrs, post=None, activated=False):
    """Once per node (``cache`` from :func:`plan_cache`, None: nothing): ``cache["bound"]``
    (see :func:`~runtime_provider_cpu.executable.binds`), the node's plan run straight on
    the inputs it takes (:meth:`ConvPlan.takes`, conv_clipped's own test) and then ``post``
    on its result when given (FusedConv's activation past the epilogue's clip), else
    ``kernel_fn(ctx, *inputs, **attrs)``. None when the first run made no plan.
    ``activated``: the plan's own call applies FusedConv's activation (:meth:`ConvPlan.set_act`)."""
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

    if activated:
        cache["conv_post"] = True  # the pair fusers' calls have no activation
    if post is not None:
        def bound_post(ctx, x, w, b=None, *z):
            if x.shape == xshape and w is W and b is B:
                if not z:
                    return post(fast(x, None))
                if takes_z and len(z) == 1 and z[0].shape == shape and z[0].dtype == _F32:
                    return post(fast(x, z[0]))
            return kernel_fn(ctx, x, w, b, *z, **attrs)
        cache["bound"] = bound_post
        cache["conv_post"] = True  # the pair fusers (fast/pairs.py) must not take it
        return
    cache["bound"] = bound


def plan_takes(plan, args):
    """Whether a fused step's ``plan`` takes this node's inputs ``(x, w[, b])`` (no residual)."""
    return len(args) <= 3 and plan.takes(args[0], args[1], args[2] if len(args) > 2 else None, None)


def contig(x):
    return x if x.flags.c_contiguous else np.ascontiguousarray(x)
