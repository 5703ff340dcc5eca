"""Bound steps and run-time fusions: what a partition's first run lets later runs skip.

After the first sequential run, a kernel marked with :func:`binds` may have left a faster
call of itself; then fusers registered with :func:`pairs` and :func:`siblings` are asked
about neighbouring bound steps (:func:`fuse`). What they take is listed by
``CPUExecutable.fusions()`` and shown in the session's partition report.
"""

from __future__ import annotations

import collections

from .step import CPUKernelError, kernel_error


def binds(kernel_fn):
    """Mark ``kernel_fn`` as one that may store a faster call of itself in
    ``ctx.cache["bound"]`` on its first run: ``bound(ctx, *inputs)`` (no attributes) must
    return exactly what ``kernel_fn(ctx, *inputs, **attrs)`` returns for any inputs, checking
    what it assumes and calling the kernel otherwise. After the partition's first run the
    executable calls it instead (sequential runs only: it is never combined with an in-place
    variant)."""
    kernel_fn.binds = True
    return kernel_fn


#: ``fuser(ctx_a, ctx_b)`` -> ``run(args_a, args_b)`` or None (see :func:`pairs`)
PAIR_FUSERS: list = []

#: ``fuser(ctx_a, ctx_b)`` -> ``run(args_a, args_b)`` or None (see :func:`siblings`)
SIBLING_FUSERS: list = []


def pairs(fuser):
    """Register ``fuser(ctx_a, ctx_b)`` (a decorator), asked once after a partition's first run
    about each two consecutive steps, the first one bound (see :func:`binds`), where the first
    one's only output is an intermediate that only the second reads, as its first input, and
    the second has one output and no in-place variant. It returns None or
    ``run(args_a, args_b)``, which computes the second node's result from both nodes' inputs
    at once (the first one's output never made whole), or returns None for inputs it does
    not take (then the two steps run). Plain sequential runs call it from then on; profiled
    and parallel runs keep the two steps, so a profile still times each node."""
    PAIR_FUSERS.append(fuser)
    return fuser


def siblings(fuser):
    """Register ``fuser(ctx_a, ctx_b)`` (a decorator), asked once after a partition's first run
    about each two consecutive bound steps that read the same first input, the second not
    reading the first's output, each with one output. It returns None or
    ``run(args_a, args_b)``, which computes both nodes' results at once (say, from one copy
    of their shared input), a tuple, or None for inputs it does not take (then the two steps
    run). As with :func:`pairs`, plain sequential runs only."""
    SIBLING_FUSERS.append(fuser)
    return fuser


def bind(steps, bindable) -> bool:
    """Replace each of ``bindable`` (step indices) whose kernel left ``ctx.cache["bound"]``
    by a step calling that, without the attributes. A list item is replaced whole, so a run
    in another thread sees the old step or the new one. Returns whether any was bound."""
    any_bound = False
    for i in bindable:
        st = steps[i]
        bound = st[1].cache.get("bound")
        if bound is not None:
            steps[i] = (bound, *st[1:4], {}, *st[5:])
            any_bound = True
    return any_bound


def _first_taker(fusers, ca, cb):
    """The first of ``fusers`` that takes steps ``ca`` and ``cb``: its ``run``, or None."""
    for fuser in fusers:
        run = fuser(ca, cb)
        if run is not None:
            return run
    return None


def _first_alone(fa, ca, args):
    """The first of two fused steps run alone (its fuser declined): its errors its own node's."""
    try:
        return fa(ca, *args)
    except CPUKernelError:
        raise
    except Exception as exc:
        raise kernel_error(ca, exc) from exc


def _sibling_call(run, fa, ca, fb, n):
    """One step for two (:func:`siblings`): ``run``, or the two steps' calls where it declines."""
    def call(ctx, *args):
        args_b = (args[0],) + args[n:]
        r = run(args[:n], args_b)
        return r if r is not None else (_first_alone(fa, ca, args[:n]), fb(ctx, *args_b))
    return call


def _pair_call(run, fa, ca, fb, attrs_b, n):
    """One step for two (:func:`pairs`): ``run``, or the two steps' calls where it declines."""
    def call(ctx, *args):
        y = run(args[:n], args[n:])
        return y if y is not None else fb(ctx, _first_alone(fa, ca, args[:n]), *args[n:], **attrs_b)
    return call


def fuse(steps, template, input_slots, output_slots) -> tuple[list, list]:
    """The steps with each two that a :func:`pairs` or :func:`siblings` fuser takes made one,
    and what was fused: ``(kind, (first node name, second node name))`` with ``kind``
    ``"pair"`` or ``"siblings"``."""
    if not PAIR_FUSERS and not SIBLING_FUSERS:
        return list(steps), []
    reads = collections.Counter(s for st in steps for s in st[2])
    keep = set(output_slots) | set(input_slots)
    out, fused, i = [], [], 0
    while i < len(steps):
        a = steps[i]
        fa, ca, ia, oa, _, fr_a, _ = a
        # the first of two bound (its kernel's call replaced by its own bound one)
        if i + 1 < len(steps) and fa is ca.cache.get("bound") and len(oa) == 1 and ia:
            fb, cb, ib, ob, attrs_b, fr_b, alt_b = steps[i + 1]
            e, run = oa[0], None
            # a chain: a's only output read only by b, as its first input
            if (e >= 0 and alt_b is None and len(ob) == 1 and ib and ib[0] == e
                    and reads[e] == 1 and e not in keep and e in fr_b and template[e] is None):
                run = _first_taker(PAIR_FUSERS, ca, cb)
            if run is not None:
                out.append((_pair_call(run, fa, ca, fb, attrs_b, len(ia)), cb, ia + ib[1:], ob, {},
                            fr_a + tuple(s for s in fr_b if s != e), None))
                fused.append(("pair", (ca.node.name, cb.node.name)))
                i += 2
                continue
            # siblings: the same first input, independent, both bound
            if (len(ob) == 1 and ib and ia[0] == ib[0] and e not in ib
                    and fb is cb.cache.get("bound") and alt_b is None):
                run = _first_taker(SIBLING_FUSERS, ca, cb)
            if run is not None:
                out.append((_sibling_call(run, fa, ca, fb, len(ia)), cb, ia + ib[1:], oa + ob, {},
                            fr_a + fr_b, None))
                fused.append(("siblings", (ca.node.name, cb.node.name)))
                i += 2
                continue
        out.append(a)
        i += 1
    return out, fused
