"""Compiled CPU partitions: a flat list of bound kernel calls over value slots.

Everything that can be decided when the partition compiles is decided then
(kernel lookup, attributes, slot indices, when each value dies), so the per-node
run loop only calls kernels and moves references.

A partition compiled with ``inter_op_num_threads`` N > 1 (the session's
``ExecutionMode.ORT_PARALLEL``) whose nodes are not one chain also gets a dependency
schedule (:class:`_Schedule`): a run then starts every node whose inputs are ready, on
the caller's thread and up to N - 1 helper threads of the executable's own pool.
"""

from __future__ import annotations

import collections
import math
import os
import sys
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from time import perf_counter_ns

import numpy as np

from .registry import REGISTRY, SCOPE, KernelContext

_getrefcount = sys.getrefcount


def inplace_variant(kernel_fn, *positions):
    """Register ``variant`` as the in-place form of ``kernel_fn`` (a decorator).

    ``variant(ctx, owned, *inputs, **attrs)`` must return exactly what ``kernel_fn`` returns;
    it may overwrite (and return) input ``owned``, one of ``positions``. The executable calls
    it instead of the kernel only when that input's array is exclusively this call's:

    * at compile time: the value is an intermediate of this partition (not a partition input,
      output or constant), this node is its last reader and reads it once;
    * at run time: the array is writeable, nothing else references it (reference count: no
      other slot, view, cache or caller holds it; a view of it would hold it through ``base``),
      and it owns its memory or is a view of an array that only it references (the owner's
      reference count says so: a reshape of a kernel's fresh result qualifies, a view of a
      feed, initializer or any live value does not).

    Otherwise the plain kernel runs. A variant still checks shapes and dtypes itself (say, that
    the owned array has the broadcast result's shape) and falls back to fresh arrays.
    """
    def deco(variant):
        kernel_fn.inplace = (tuple(positions), variant)
        return variant
    return deco


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
_PAIR_FUSERS: list = []


def pairs(fuser):
    """Register ``fuser(ctx_a, ctx_b)`` (a decorator), asked once after a partition's first run
    about each two consecutive steps, the first one bound (see :func:`binds`), where the first
    one's only output is an intermediate that only the second reads, as its first input, and
    the second has one output and no in-place variant. It returns None or
    ``run(args_a, args_b)``, which computes the second node's result from both nodes' inputs
    at once (the first one's output never made whole), or returns None for inputs it does
    not take (then the two steps run). Plain sequential runs call it from then on; profiled
    and parallel runs keep the two steps, so a profile still times each node."""
    _PAIR_FUSERS.append(fuser)
    return fuser


#: ``fuser(ctx_a, ctx_b)`` -> ``run(args_a, args_b)`` or None (see :func:`siblings`)
_SIBLING_FUSERS: list = []


def siblings(fuser):
    """Register ``fuser(ctx_a, ctx_b)`` (a decorator), asked once after a partition's first run
    about each two consecutive bound steps that read the same first input, the second not
    reading the first's output, each with one output. It returns None or
    ``run(args_a, args_b)``, which computes both nodes' results at once (say, from one copy
    of their shared input), a tuple, or None for inputs it does not take (then the two steps
    run). As with :func:`pairs`, plain sequential runs only."""
    _SIBLING_FUSERS.append(fuser)
    return fuser


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
        raise _kernel_error(ca, exc) from exc


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


class CPUKernelError(RuntimeError):
    """A kernel raised; carries the node's name and op so the core can say where."""

    def __init__(self, message: str, node_name: str, op_type: str):
        super().__init__(message)
        self.node_name = node_name
        self.op_type = op_type


def intra_op_threads(partition) -> int:
    """The threads a compiled kernel of this partition may use: the session's
    ``intra_op_num_threads`` (plugin API 1.2), else (an older core, a subgraph body) the
    cores this process may run on."""
    n = int(getattr(partition, "intra_op_num_threads", 0) or 0)
    if n > 0:
        return n
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _kernel_error(ctx, exc: Exception) -> CPUKernelError:
    """The error a run raises for a kernel that raised ``exc``: names the node and its op."""
    node = ctx.node
    return CPUKernelError(f"{node.op_type} node {node.name!r} failed: {type(exc).__name__}: {exc}",
                          node.name, node.op_type)


_NONE_SLOT = 0  # slot 0 always holds None: omitted optional inputs read it


class CPUExecutable:
    """Runs the nodes of one partition: in order, or (``partition.inter_op_num_threads`` > 1)
    each node as soon as its inputs are ready, on up to that many threads. Thread-safe:
    state is per call."""

    def __init__(self, partition, check_kernels: bool | None = None, opsets: dict | None = None):
        self.partition = partition
        if check_kernels is None:
            check_kernels = os.environ.get("RUNTIME_CORE_CHECK_KERNELS", "") not in ("", "0")
        slot_of: dict[str, int] = {"": _NONE_SLOT}
        template: list = [None]

        def slot(name: str) -> int:
            if name not in slot_of:
                slot_of[name] = len(template)
                template.append(None)
            return slot_of[name]

        for name, value in partition.constants.items():
            template[slot(name)] = value
        self.input_slots = [slot(n) for n in partition.inputs]
        steps = []
        kernel_threads = intra_op_threads(partition)
        for node in partition.nodes:
            spec = REGISTRY.lookup(node.domain, node.op_type, node.since_version)
            if spec is None:  # the provider never claims such a node
                raise RuntimeError(f"no CPU kernel for {node.qualified_op} (node {node.name!r})")
            ins = list(node.inputs)
            while ins and not ins[-1]:
                ins.pop()
            ctx = KernelContext(
                node=node,
                n_outputs=len(node.outputs),
                input_dtypes=tuple(i.dtype if i is not None else None for i in node.input_info),
                output_dtypes=tuple(o.dtype if o is not None else None for o in node.output_info),
                threads=kernel_threads,
            )
            in_slots = tuple(slot(n) for n in ins)
            out_slots = tuple(slot(n) if n else -1 for n in node.outputs)
            fn = spec.fn
            if spec.control:
                # compile the bodies once; the kernel gets the outer-scope values it reads
                # as ``outer=``: their slots follow the explicit inputs
                _compile_subgraphs(ctx, node, partition, opsets, check_kernels)
                implicit = tuple(node.implicit_inputs)
                in_slots = in_slots + tuple(slot(n) for n in implicit)
                fn = _with_outer(spec.fn, len(ins), implicit)
            steps.append([fn, ctx, in_slots, out_slots, dict(node.attrs), (), getattr(spec.fn, "inplace", None)])
        self.n_slots = len(template)
        self.template = template
        self.output_slots = [slot_of[n] for n in partition.outputs]
        # free each intermediate after its last reader (partition outputs and constants stay)
        keep = set(self.output_slots) | {slot_of[n] for n in partition.constants} | {_NONE_SLOT}
        last_use: dict[int, int] = {}
        for i, st in enumerate(steps):
            for s in st[2]:
                last_use[s] = i
            for s in st[3]:
                if s >= 0:
                    last_use.setdefault(s, i)
        frees: dict[int, list[int]] = {}
        for s, i in last_use.items():
            if s not in keep:
                frees.setdefault(i, []).append(s)
        inputs_set = set(self.input_slots)
        threads = getattr(partition, "inter_op_num_threads", 1)  # absent on subgraph bodies
        self._schedule = _Schedule.build(steps, keep, int(threads or 1))
        self._pool = None
        self._pool_lock = threading.Lock()
        self.n_inplace_steps = 0
        for i, st in enumerate(steps):
            st[5] = tuple(frees.get(i, ()))
            # in-place candidates: inputs that die here, read once by this node, never a
            # partition input (feeds belong to the caller) nor kept (outputs, constants).
            # Never with a parallel schedule: "last reader" is then an order in time that no
            # longer holds (an earlier reader may run at the same time on another thread and
            # still be about to read the slot that ``_owned`` clears), and the reference count
            # ``_owned`` relies on can change under it. Nested subgraph executables stay
            # sequential (their partitions carry no thread count), so their in-place steps
            # are safe: a body's intermediates are only ever seen by the thread running it.
            alt = st[6]
            st[6] = None
            if alt is not None and _INPLACE and self._schedule is None and not _small_outputs(st[1].node):
                dying = set(st[5])
                cands = tuple((p, st[2][p]) for p in alt[0] if p < len(st[2])
                              and st[2][p] in dying and st[2][p] not in inputs_set
                              and st[2].count(st[2][p]) == 1)
                if cands:
                    st[6] = (alt[1], cands)
                    self.n_inplace_steps += 1
        self.steps = [tuple(st) for st in steps]
        self.check_kernels = check_kernels
        # steps whose kernel may leave a faster call of itself after its first run
        # (``ctx.cache["bound"]``, see :func:`binds`); looked at once, after the first run
        self._bindable = [i for i, st in enumerate(self.steps)
                          if getattr(st[0], "binds", False) and st[6] is None]
        # what plain sequential runs iterate: the steps, with pairs fused after binding
        self.run_steps = self.steps

    @property
    def parallel(self) -> bool:
        """Whether runs schedule independent nodes on several threads."""
        return self._schedule is not None

    def run(self, inputs):
        # floating-point warnings are the IEEE results ONNX asks for (inf, nan): ignored once
        # per run here rather than per kernel call (np.errstate costs more than a tiny add)
        with np.errstate(all="ignore"):
            if self._schedule is not None:
                return self._run_parallel(inputs, None)
            return self._run(inputs)

    def _run(self, inputs):
        slots = list(self.template)
        inputs = list(inputs)  # holds every feed for the whole run (never donated)
        for s, v in zip(self.input_slots, inputs):
            slots[s] = v
        v = r = res = None
        check = self.check_kernels
        ndarray = np.ndarray
        for fn, ctx, in_slots, out_slots, attrs, frees, alt in self.run_steps:
            args = [slots[s] for s in in_slots]
            try:
                if alt is not None and (own := _owned(args, slots, alt[1])) >= 0:
                    res = alt[0](ctx, own, *args, **attrs)
                else:
                    res = fn(ctx, *args, **attrs)
            except CPUKernelError:
                raise
            except Exception as exc:
                raise _kernel_error(ctx, exc) from exc
            if type(res) is ndarray and len(out_slots) == 1:
                # the common case, one array for one output (~0.25 us a node less than the loop)
                if out_slots[0] >= 0:
                    slots[out_slots[0]] = res
                if check:
                    self._check(ctx, (res,))
            else:
                if type(res) is not tuple:
                    res = (res,)
                for s, r in zip(out_slots, res):
                    if s >= 0:
                        if type(r) is not ndarray and r is not None and not isinstance(r, (list, dict)):
                            r = np.asarray(r)
                        slots[s] = r
                if check:
                    self._check(ctx, res)
            for s in frees:
                slots[s] = None
            args = res = r = None  # no stray reference may survive into the next ownership test
        if self._bindable:
            self._bind()
        return [slots[s] for s in self.output_slots]

    def _bind(self):
        """Each bindable step whose kernel left ``ctx.cache["bound"]`` calls that from now on,
        without the attributes (a Conv's plan run straight: about 4.5 us of Python a node
        less). Once, after the first run; a list item replaced whole, so a run in another
        thread sees the old step or the new one."""
        bindable, self._bindable = self._bindable, []
        for i in bindable:
            fn, ctx, in_slots, out_slots, attrs, frees, alt = self.steps[i]
            bound = ctx.cache.get("bound")
            if bound is not None:
                self.steps[i] = (bound, ctx, in_slots, out_slots, {}, frees, alt)
        if bindable and (_PAIR_FUSERS or _SIBLING_FUSERS):
            self.run_steps = self._fuse_pairs()

    def _fuse_pairs(self) -> list:
        """The steps, each two that a :func:`pairs` or :func:`siblings` fuser takes made one."""
        steps = self.steps
        reads = collections.Counter(s for st in steps for s in st[2])
        keep = set(self.output_slots) | set(self.input_slots)
        out, i = [], 0
        while i < len(steps):
            a = steps[i]
            fa, ca, ia, oa, _, fr_a, _ = a
            # the first of two bound (its kernel's call replaced by its own bound one)
            if i + 1 < len(steps) and fa is ca.cache.get("bound") and len(oa) == 1 and ia:
                fb, cb, ib, ob, attrs_b, fr_b, alt_b = steps[i + 1]
                e, run = oa[0], None
                # a chain: a's only output read only by b, as its first input
                if (e >= 0 and alt_b is None and len(ob) == 1 and ib and ib[0] == e
                        and reads[e] == 1 and e not in keep and e in fr_b and self.template[e] is None):
                    run = _first_taker(_PAIR_FUSERS, ca, cb)
                if run is not None:
                    out.append((_pair_call(run, fa, ca, fb, attrs_b, len(ia)), cb, ia + ib[1:], ob, {},
                                fr_a + tuple(s for s in fr_b if s != e), None))
                    i += 2
                    continue
                # siblings: the same first input, independent, both bound
                if (len(ob) == 1 and ib and ia[0] == ib[0] and e not in ib
                        and fb is cb.cache.get("bound") and alt_b is None):
                    run = _first_taker(_SIBLING_FUSERS, ca, cb)
                if run is not None:
                    out.append((_sibling_call(run, fa, ca, fb, len(ia)), cb, ia + ib[1:], oa + ob, {},
                                fr_a + fr_b, None))
                    i += 2
                    continue
            out.append(a)
            i += 1
        return out

    def run_profiled(self, inputs, record):
        """``run`` that times each kernel call: ``record(node, t0_ns, t1_ns, inputs, outputs)``
        after each node (profiling; a separate loop so that ``run`` pays nothing for it)."""
        with np.errstate(all="ignore"):
            if self._schedule is not None:
                return self._run_parallel(inputs, record)
            return self._run_profiled(inputs, record)

    def _run_profiled(self, inputs, record):
        slots = list(self.template)
        inputs = list(inputs)
        for s, v in zip(self.input_slots, inputs):
            slots[s] = v
        v = r = res = outs = None
        for fn, ctx, in_slots, out_slots, attrs, frees, alt in self.steps:
            args = [slots[s] for s in in_slots]
            t0 = perf_counter_ns()
            try:
                if alt is not None and (own := _owned(args, slots, alt[1])) >= 0:
                    res = alt[0](ctx, own, *args, **attrs)
                else:
                    res = fn(ctx, *args, **attrs)
            except CPUKernelError:
                raise
            except Exception as exc:
                raise _kernel_error(ctx, exc) from exc
            t1 = perf_counter_ns()
            if type(res) is not tuple:
                res = (res,)
            for s, r in zip(out_slots, res):
                if s >= 0:
                    if type(r) is not np.ndarray and r is not None and not isinstance(r, (list, dict)):
                        r = np.asarray(r)
                    slots[s] = r
            if self.check_kernels:
                self._check(ctx, res)
            outs = [slots[s] for s in out_slots if s >= 0]
            record(ctx.node, t0, t1, args, outs)
            for s in frees:
                slots[s] = None
            args = res = r = outs = None
        return [slots[s] for s in self.output_slots]

    def _run_parallel(self, inputs, record):
        slots = list(self.template)
        inputs = list(inputs)
        for s, v in zip(self.input_slots, inputs):
            slots[s] = v
        return _ParallelRun(self, slots, record).main()

    def _helper_pool(self) -> ThreadPoolExecutor:
        """The executable's helper threads (made on first use; shut down with it)."""
        pool = self._pool
        if pool is None:
            with self._pool_lock:
                pool = self._pool
                if pool is None:
                    pool = ThreadPoolExecutor(max_workers=self._schedule.threads - 1,
                                              thread_name_prefix="runtime_core-inter-op")
                    # idle workers hold only a weak reference to their pool; this wakes and
                    # ends them as soon as the executable (its session) is collected
                    weakref.finalize(self, pool.shutdown, wait=False)
                    self._pool = pool
        return pool

    @staticmethod
    def _check(ctx, res) -> None:
        node = ctx.node
        n_wanted = sum(1 for o in node.outputs if o)
        produced = sum(1 for o, r in zip(node.outputs, res) if o)
        if produced < n_wanted:
            raise CPUKernelError(f"{node.op_type} node {node.name!r} returned {len(res)} outputs, "
                                 f"the node declares {len(node.outputs)}", node.name, node.op_type)
        for i, (name, r) in enumerate(zip(node.outputs, res)):
            want = ctx.output_dtypes[i] if i < len(ctx.output_dtypes) else None
            if not name or want is None or not isinstance(r, np.ndarray):
                continue
            got = np.asarray(r).dtype
            if got != want and not (want == np.dtype(object) and got.kind in "OUS"):
                raise CPUKernelError(
                    f"{node.op_type} node {node.name!r} output {i} ({name!r}) has dtype {got}, "
                    f"the model says {want}", node.name, node.op_type)


class _Schedule:
    """The dependency graph of a partition's steps, for parallel runs.

    ``deps[i]``: how many distinct steps produce the inputs of step ``i``; ``succ[i]``: the
    steps that read an output of step ``i``; ``readers[s]``: how many distinct steps read
    slot ``s`` (a value is freed when the last of them has finished, whatever the order);
    ``reads[i]``: the slots step ``i`` reads that may be freed; ``dead[i]``: the outputs of
    step ``i`` that nothing reads nor keeps (freed at once).
    """

    __slots__ = ("threads", "deps", "succ", "readers", "reads", "dead", "roots")

    @classmethod
    def build(cls, steps, keep, threads: int):
        """The schedule, or ``None`` when runs are sequential: one thread, or nodes that form
        a single chain (each step reads the previous one's output: nothing could overlap)."""
        if threads <= 1 or len(steps) < 2:
            return None
        producer: dict[int, int] = {}
        for i, st in enumerate(steps):
            for s in st[3]:
                if s >= 0:
                    producer[s] = i
        dep_sets = [{producer[s] for s in st[2] if s in producer} for st in steps]
        if all(i - 1 in dep_sets[i] for i in range(1, len(steps))):
            return None
        self = cls()
        self.threads = threads
        self.deps = tuple(len(d) for d in dep_sets)
        succ: list[list[int]] = [[] for _ in steps]
        for i, d in enumerate(dep_sets):
            for j in sorted(d):
                succ[j].append(i)
        self.succ = tuple(tuple(x) for x in succ)
        n_slots = 1 + max([0] + [s for st in steps for s in (*st[2], *st[3])])
        readers = [0] * n_slots
        reads = []
        for st in steps:
            mine = tuple(dict.fromkeys(s for s in st[2] if s not in keep))
            for s in mine:
                readers[s] += 1
            reads.append(mine)
        self.readers = tuple(readers)
        self.reads = tuple(reads)
        self.dead = tuple(tuple(s for s in st[3] if s >= 0 and s not in keep and readers[s] == 0)
                          for st in steps)
        self.roots = tuple(i for i, n in enumerate(self.deps) if n == 0)
        return self


class _ParallelRun:
    """One parallel run: the caller's thread and helper threads take ready steps.

    All counters live under ``lock``. A thread that finishes a step makes its successors
    ready, keeps the first for itself and queues the rest, asking the pool for helpers
    (at most ``threads - 1`` at a time); a helper returns as soon as nothing is ready, and
    never waits for anything, so runs sharing a pool cannot starve each other: the caller
    alone can always finish its run. After a failure nothing new starts; the caller waits
    for the steps in flight, then raises the first error (the sequential loop's
    :class:`CPUKernelError`).
    """

    def __init__(self, exe: CPUExecutable, slots: list, record):
        sched = exe._schedule
        self.exe = exe
        self.sched = sched
        self.slots = slots
        self.record = record
        self.deps = list(sched.deps)
        self.readers = list(sched.readers)
        self.ready = collections.deque(sched.roots)
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.left = len(exe.steps)
        self.running = 0
        self.helpers = 0
        self.failed: BaseException | None = None

    def main(self) -> list:
        lock, cond, ready = self.lock, self.cond, self.ready
        with lock:  # the caller takes the first ready step; helpers are asked for the others
            step = ready.popleft()
            self.running += 1
            spawn = self._want_helpers()
        self._spawn(spawn)
        try:
            while True:
                if step is not None:
                    step = self._step(step)
                    continue
                with lock:
                    while True:
                        if self.failed is not None:
                            if self.running == 0:
                                break
                        elif self.left == 0:
                            break
                        elif ready:
                            step = ready.popleft()
                            self.running += 1
                            break
                        cond.wait()
                if step is None:
                    break
        except BaseException as exc:  # interrupted while waiting: stop the helpers too
            with lock:
                if self.failed is None:
                    self.failed = exc
                ready.clear()
            raise
        failed, self.failed = self.failed, None
        slots, self.slots = self.slots, None  # a helper still queued must not keep values alive
        if failed is not None:
            raise failed
        return [slots[s] for s in self.exe.output_slots]

    def _want_helpers(self) -> int:
        """Helpers to ask for now (under ``lock``): one per queued step, within the bound."""
        n = min(len(self.ready), self.sched.threads - 1 - self.helpers)
        if n <= 0:
            return 0
        self.helpers += n
        return n

    def _spawn(self, n: int) -> None:
        if not n:
            return
        pool = self.exe._helper_pool()
        for k in range(n):
            try:
                pool.submit(self._help)
            except RuntimeError:  # the pool is shutting down (interpreter exit): the caller works
                with self.lock:
                    self.helpers -= n - k
                return

    def _help(self) -> None:
        lock, ready = self.lock, self.ready
        with np.errstate(all="ignore"):  # floating-point state is per thread
            while True:
                with lock:
                    if self.failed is not None or not ready:
                        self.helpers -= 1
                        return
                    step = ready.popleft()
                    self.running += 1
                while step is not None:
                    step = self._step(step)

    def _step(self, i: int):
        """Run step ``i`` (counted in ``running``); returns the next step this thread should run."""
        exe = self.exe
        fn, ctx, in_slots, out_slots, attrs, _, _ = exe.steps[i]
        slots = self.slots
        record = self.record
        args = [slots[s] for s in in_slots]
        in_kernel = True
        try:
            if record is not None:
                t0 = perf_counter_ns()
                res = fn(ctx, *args, **attrs)
                t1 = perf_counter_ns()
            else:
                res = fn(ctx, *args, **attrs)
            in_kernel = False
            if type(res) is not tuple:
                res = (res,)
            for s, r in zip(out_slots, res):
                if s >= 0:
                    if type(r) is not np.ndarray and r is not None and not isinstance(r, (list, dict)):
                        r = np.asarray(r)
                    slots[s] = r
            if exe.check_kernels:
                exe._check(ctx, res)
            if record is not None:
                record(ctx.node, t0, t1, args, [slots[s] for s in out_slots if s >= 0])
        except BaseException as exc:  # recorded for the caller: a helper must never die silently
            err = exc
            if in_kernel and isinstance(exc, Exception) and not isinstance(exc, CPUKernelError):
                err = _kernel_error(ctx, exc)
                err.__cause__ = exc
            with self.lock:
                self.running -= 1
                if self.failed is None:
                    self.failed = err
                self.ready.clear()
                self.cond.notify()
            return None
        args = res = r = None
        sched = self.sched
        for s in sched.dead[i]:
            slots[s] = None
        nxt = None
        spawn = 0
        with self.lock:
            self.running -= 1
            self.left -= 1
            readers = self.readers
            for s in sched.reads[i]:
                readers[s] -= 1
                if not readers[s]:  # every reader has finished: gone before a successor starts
                    slots[s] = None
            if self.failed is None:
                deps = self.deps
                for j in sched.succ[i]:
                    deps[j] -= 1
                    if not deps[j]:
                        if nxt is None:
                            nxt = j
                            self.running += 1
                        else:
                            self.ready.append(j)
                if self.ready:
                    spawn = self._want_helpers()
                    self.cond.notify()
                elif not self.left:
                    self.cond.notify()
            else:
                self.cond.notify()
        self._spawn(spawn)
        return nxt


def _owned(args, slots, cands) -> int:
    """The position of the first candidate input whose array is exclusively this call's, or -1.

    A candidate's slot dies at this step, so it is cleared first (the step's ``frees`` would
    clear it anyway); then the only references left are ``args``, the local name and
    ``getrefcount``'s own argument: any other holder (another slot aliasing the same object, a
    view's ``base``, a kernel cache, the caller) makes the count larger.
    """
    for p, s in cands:
        a = args[p]
        if type(a) is not np.ndarray or not a.flags.writeable:
            continue
        base = a.base
        if base is not None:
            # a view (a reshape of a kernel's fresh result, say) of an array that nothing else
            # holds: numpy points every view at the array owning the memory, so a count of 2
            # (``a.base`` and this name, plus getrefcount's argument: 3) means no other view
            if type(base) is not np.ndarray or base.base is not None or _getrefcount(base) != 3:
                continue
        base = None
        slots[s] = None
        if _getrefcount(a) == 3:
            return p
    return -1


def _calibrate() -> bool:
    """Whether reference counts mean what ``_owned`` assumes on this interpreter: an exclusive
    array (and a view of an otherwise unreferenced array) is accepted, and one extra holder of
    either is refused. Checked once at import; in-place execution is off when not, or when
    ``RUNTIME_CORE_CPU_INPLACE=0``."""
    if os.environ.get("RUNTIME_CORE_CPU_INPLACE", "") == "0":
        return False
    try:
        args = [np.empty(4)]
        ok = _owned(args, [None, args[0]], ((0, 1),)) == 0
        held = np.empty(4)
        args = [held]
        ok = ok and _owned(args, [None, held], ((0, 1),)) == -1
        args = [np.empty(8).reshape(2, 4)]
        ok = ok and _owned(args, [None, args[0]], ((0, 1),)) == 0
        base = np.empty(8)
        args = [base.reshape(2, 4)]
        ok = ok and _owned(args, [None, args[0]], ((0, 1),)) == -1
        del base, held, args
        return ok
    except Exception:  # noqa: BLE001 - any surprise: run every kernel out of place
        return False


_INPLACE = _calibrate()


def _inplace_min_elements() -> int:
    raw = os.environ.get("RUNTIME_CORE_CPU_INPLACE_MIN", "")
    try:
        return max(0, int(raw)) if raw else 4096
    except ValueError:
        return 4096


#: a step whose outputs all have static sizes below this many elements runs its plain kernel:
#: the ownership test costs ~0.7 us a call, more than a fresh small array saves (a chain of
#: 4-element Adds: 2.7 -> 1.9 us a node; the saving passes the test's cost near 16k elements).
#: ``RUNTIME_CORE_CPU_INPLACE_MIN`` overrides it (the test suite sets 0, so that its small
#: tensors exercise every in-place variant).
_INPLACE_MIN_ELEMENTS = _inplace_min_elements()


def _small_outputs(node) -> bool:
    """Whether every output of ``node`` has a static shape of fewer than
    ``_INPLACE_MIN_ELEMENTS`` elements (unknown or symbolic shapes are not small)."""
    if _INPLACE_MIN_ELEMENTS <= 0:
        return False
    seen = False
    for info in node.output_info:
        if info is None:
            continue
        shape = info.shape
        if shape is None or not all(type(d) is int for d in shape):
            return False
        if math.prod(shape) >= _INPLACE_MIN_ELEMENTS:
            return False
        seen = True
    return seen


# -- subgraphs (If / Loop / Scan / SequenceMap bodies) ------------------------------------
#
# A body is compiled once, when the partition holding its node compiles, into a nested
# CPUExecutable over duck-typed node views (this package does not import runtime-core).
# Its inputs are the body's formal inputs followed by the outer-scope values it reads.


def _with_outer(fn, n_explicit: int, names: tuple):
    """Call ``fn`` with the explicit inputs positionally and the implicit ones as ``outer``."""
    def call(ctx, *args, **attrs):
        return fn(ctx, *args[:n_explicit], outer=dict(zip(names, args[n_explicit:])), **attrs)
    return call


def _graph_attrs(node) -> dict:
    """``attr name -> GraphProto`` (``name[i]`` for GRAPHS attributes) of a node."""
    import onnx

    out = {}
    for k, v in node.attrs.items():
        if isinstance(v, onnx.GraphProto):
            out[k] = v
        elif isinstance(v, list) and v and all(isinstance(x, onnx.GraphProto) for x in v):
            for i, g in enumerate(v):
                out[f"{k}[{i}]"] = g
    return out


def _compile_subgraphs(ctx, node, partition, opsets, check_kernels) -> None:
    outer_info = getattr(partition, "value", None)
    if opsets is None:
        scope = SCOPE.get()
        opsets = dict(scope[0]) if scope else {}
    opsets = dict(opsets)
    opsets.setdefault(node.domain, node.opset)
    for attr, g in _graph_attrs(node).items():
        ctx.subgraphs[attr] = Subgraph(g, opsets, outer_info, name=f"{node.name}/{attr}",
                                       check_kernels=check_kernels)


def subgraph_outer_names(g) -> list[str]:
    """Names a (nested) subgraph reads that it does not define itself.

    The same rule as ``runtime_core.graph.ir.subgraph_outer_names``: the CPU provider does
    not import the core (the core depends on it, never the other way), so the few graph
    helpers that subgraph compilation needs live here too (also ``_resolve_attrs``).
    """
    import onnx

    defined = {i.name for i in g.input} | {t.name for t in g.initializer} | {
        t.values.name for t in g.sparse_initializer}
    used: list[str] = []
    for n in g.node:
        for i in n.input:
            if i and i not in defined and i not in used:
                used.append(i)
        for a in n.attribute:
            subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
            for sg in subs:
                for i in subgraph_outer_names(sg):
                    if i not in defined and i not in used:
                        used.append(i)
        defined.update(o for o in n.output if o)
    for o in g.output:
        if o.name not in defined and o.name not in used:
            used.append(o.name)
    return used


class BodyValue:
    """What is known about one value of a subgraph (the core's ValueInfo, duck-typed)."""

    __slots__ = ("name", "dtype", "shape", "kind", "const", "type_proto")

    def __init__(self, name, dtype=None, shape=None, kind="tensor", const=None, type_proto=None):
        self.name, self.dtype, self.shape, self.kind, self.const = name, dtype, shape, kind, const
        self.type_proto = type_proto  # the full onnx type when known (nested bodies' inference)

    @property
    def is_constant(self) -> bool:
        return self.const is not None

    @property
    def static_shape(self):
        if self.shape is None or any(not isinstance(d, int) for d in self.shape):
            return None
        return tuple(self.shape)

    @property
    def nbytes(self):
        shape = self.static_shape
        if shape is None or self.dtype is None or self.dtype == np.dtype(object):
            return None
        return int(np.prod(shape, dtype=np.int64)) * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"BodyValue({self.name!r}, {self.dtype}, {self.shape}, {self.kind})"


class BodyNode:
    """One node of a subgraph (the core's NodeView, duck-typed)."""

    __slots__ = ("name", "op_type", "domain", "since_version", "opset", "attrs", "inputs",
                 "outputs", "input_info", "output_info", "implicit_inputs", "index")

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)

    @property
    def qualified_op(self) -> str:
        dom = self.domain or "ai.onnx"
        ver = "?" if self.since_version is None else str(self.since_version)
        return f"{dom}::{self.op_type}-{ver}"


def _elem_dtype(elem: int):
    import onnx
    from onnx import helper

    if elem == onnx.TensorProto.UNDEFINED:
        return None
    if elem == onnx.TensorProto.STRING:
        return np.dtype(object)
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem))
    except (KeyError, ValueError, TypeError):
        return None


def _value_from_type(name: str, tp) -> BodyValue:
    v = _value_from_type1(name, tp)
    v.type_proto = tp
    return v


def _value_from_type1(name: str, tp) -> BodyValue:
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        t = tp.tensor_type
        shape = None
        if t.HasField("shape"):
            shape = tuple(int(d.dim_value) if d.HasField("dim_value") else
                          (d.dim_param if d.HasField("dim_param") and d.dim_param else None)
                          for d in t.shape.dim)
        return BodyValue(name, _elem_dtype(t.elem_type), shape, "tensor")
    if which == "sequence_type":
        inner = _value_from_type(name, tp.sequence_type.elem_type)
        return BodyValue(name, inner.dtype, None, "sequence")
    if which == "optional_type":
        inner = _value_from_type(name, tp.optional_type.elem_type)
        return BodyValue(name, inner.dtype, None, "optional")
    if which == "map_type":
        return BodyValue(name, None, None, "map")
    return BodyValue(name)


def _type_from_value(info):
    """A TypeProto for an outer value's ValueInfo (``None`` when too little is known)."""
    import onnx
    from onnx import helper

    if info is None:
        return None
    if getattr(info, "type_proto", None) is not None:
        return info.type_proto
    if info.dtype is None:
        return None
    if info.dtype == np.dtype(object):
        elem = onnx.TensorProto.STRING
    else:
        try:
            elem = helper.np_dtype_to_tensor_dtype(np.dtype(info.dtype))
        except (KeyError, ValueError, TypeError):
            return None
    kind = getattr(info, "kind", "tensor")
    if kind == "tensor":
        shape = info.shape
        return helper.make_tensor_type_proto(
            elem, None if shape is None else [d if isinstance(d, (int, str)) else None for d in shape])
    if kind == "sequence":
        return helper.make_sequence_type_proto(helper.make_tensor_type_proto(elem, None))
    return None  # an optional's element kind is not known from a ValueInfo


def _infer_types(g, opsets: dict, outer: dict) -> dict:
    """Types of a subgraph's values from onnx shape inference over the body, its outer
    reads declared as extra graph inputs. Best effort: what the body declares otherwise."""
    import onnx
    from onnx import helper

    types = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if vi.type.WhichOneof("value"):
            types[vi.name] = vi.type
    gg = onnx.GraphProto()
    gg.CopyFrom(g)
    for name, info in outer.items():
        tp = _type_from_value(info)
        vi = onnx.ValueInfoProto(name=name)
        if tp is not None:
            vi.type.CopyFrom(tp)
        gg.input.append(vi)
    try:
        model = helper.make_model(gg, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()
                                                      if v is not None])
        model.ir_version = onnx.IR_VERSION
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False,
                                                     data_prop=True)
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
            if vi.type.WhichOneof("value"):  # inference merges what the body declares
                types[vi.name] = vi.type
    except Exception:  # noqa: BLE001 - inference is advisory; kernels cope with unknown types
        pass
    return types


def _resolve_attrs(n, schema) -> dict:
    from onnx import AttributeProto, helper, numpy_helper

    def value(a):
        t = a.type
        if t == AttributeProto.INT:
            return int(a.i)
        if t == AttributeProto.FLOAT:
            return float(a.f)
        if t == AttributeProto.STRING:
            return a.s.decode("utf-8", errors="surrogateescape")
        if t == AttributeProto.INTS:
            return [int(v) for v in a.ints]
        if t == AttributeProto.FLOATS:
            return [float(v) for v in a.floats]
        if t == AttributeProto.STRINGS:
            return [x.decode("utf-8", errors="surrogateescape") for x in a.strings]
        if t == AttributeProto.TENSOR:
            return numpy_helper.to_array(a.t)
        if t == AttributeProto.TENSORS:
            return [numpy_helper.to_array(x) for x in a.tensors]
        if t == AttributeProto.GRAPH:
            return a.g
        if t == AttributeProto.GRAPHS:
            return list(a.graphs)
        if t == AttributeProto.SPARSE_TENSOR:
            from onnx.reference.op_run import to_sparse_tensor

            return to_sparse_tensor(a.sparse_tensor)
        if t == AttributeProto.TYPE_PROTO:
            return a.tp
        if t == AttributeProto.TYPE_PROTOS:
            return list(a.type_protos)
        return helper.get_attribute_value(a)

    given = {a.name: a for a in n.attribute}
    if schema is None:
        return {k: value(a) for k, a in given.items()}
    out = {}
    for k, spec in schema.attributes.items():
        if k in given:
            out[k] = value(given[k])
        elif spec.required:
            raise ValueError(f"required attribute {k!r} of {n.op_type} is missing")
        else:
            d = spec.default_value
            out[k] = value(d) if d is not None and d.type != AttributeProto.UNDEFINED else None
    unknown = [k for k in given if k not in schema.attributes]
    if unknown:
        raise ValueError(f"attribute(s) {', '.join(unknown)} are not defined by "
                         f"{n.op_type}-{schema.since_version}")
    return out


class _BodyPartition:
    """A subgraph in the shape of a core Partition (what CPUExecutable compiles)."""

    def __init__(self, nodes, inputs, outputs, constants, values):
        self.id = -1
        self.provider = "CPUExecutionProvider"
        self.nodes = tuple(nodes)
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.constants = constants
        self.values = values

    def value(self, name):
        return self.values.get(name) or BodyValue(name)


def body_views(g, opsets: dict, outer_info=None, name: str = "") -> _BodyPartition:
    """The nodes of subgraph ``g`` as node views, with types and resolved attributes."""
    import onnx
    from onnx import numpy_helper

    outer_names = subgraph_outer_names(g)
    outer = {n: (outer_info(n) if outer_info is not None else None) for n in outer_names}
    types = _infer_types(g, opsets, outer)
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    for st in g.sparse_initializer:
        from onnx.reference.op_run import to_sparse_tensor

        sp = to_sparse_tensor(st)
        dense = np.zeros(tuple(sp.dense_shape), dtype=sp.values.dtype)
        idx = sp.indices
        if idx.ndim == 1:
            dense.reshape(-1)[idx] = sp.values
        else:
            dense[tuple(idx.T)] = sp.values
        consts[st.values.name] = dense
    values: dict = {}

    def vi(n):
        if not n:
            return None
        if n not in values:
            if n in consts:
                a = consts[n]
                values[n] = BodyValue(n, a.dtype, tuple(a.shape), "tensor", a)
            elif n in types:
                values[n] = _value_from_type(n, types[n])
            elif n in outer and outer[n] is not None:
                values[n] = outer[n]
            else:
                values[n] = BodyValue(n)
        return values[n]

    nodes = []
    used = set()
    for idx, n in enumerate(g.node):
        domain = "" if n.domain == "ai.onnx" else n.domain
        opset = opsets.get(domain)
        try:
            schema = onnx.defs.get_schema(n.op_type, max_inclusive_version=opset if opset else 10 ** 6,
                                          domain=domain)
        except onnx.defs.SchemaError:
            schema = None
        nname = n.name or f"{n.op_type}_{idx}"
        while nname in used:
            nname = f"{nname}_{idx}"
        used.add(nname)
        attrs = _resolve_attrs(n, schema)
        implicit: list[str] = []
        for a in n.attribute:
            subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else (
                list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else [])
            for sg in subs:
                for i in subgraph_outer_names(sg):
                    if i not in implicit:
                        implicit.append(i)
        nodes.append(BodyNode(
            name=f"{name}/{nname}" if name else nname, op_type=n.op_type, domain=domain,
            since_version=schema.since_version if schema is not None else None,
            opset=opset if opset is not None else (schema.since_version if schema is not None else 1),
            attrs=attrs, inputs=tuple(n.input), outputs=tuple(n.output),
            input_info=tuple(vi(i) for i in n.input), output_info=tuple(vi(o) for o in n.output),
            implicit_inputs=tuple(implicit), index=idx))
    for i in list(g.input) + list(g.output):
        vi(i.name)
    for n in outer_names:
        vi(n)
    return _BodyPartition(nodes, [i.name for i in g.input] + outer_names,
                          [o.name for o in g.output], consts, values)


def subgraph_decline_reason(node, decline) -> str | None:
    """Why a control-flow node cannot run: the first node of its subgraphs (nested ones
    included) that ``decline(view)`` refuses, named with its op. ``None`` when all can run."""
    scope = SCOPE.get()
    opsets = dict(scope[0]) if scope else {}
    opsets.setdefault(node.domain, node.opset)
    outer_info = scope[1] if scope else None
    for attr, g in _graph_attrs(node).items():
        try:
            part = body_views(g, opsets, outer_info, name=node.name)
        except Exception as exc:  # noqa: BLE001 - a malformed body is declined, not raised
            return f"{node.op_type} subgraph {attr!r} cannot be read: {type(exc).__name__}: {exc}"
        token = SCOPE.set((opsets, part.value))
        try:
            for view in part.nodes:
                why = decline(view)
                if why:
                    return (f"{node.op_type} subgraph {attr!r} node {view.name!r} "
                            f"({view.domain or 'ai.onnx'}::{view.op_type}): {why}")
        finally:
            SCOPE.reset(token)
    return None


class Subgraph:
    """A compiled body: ``run(inputs, outer)`` returns its outputs as a list.

    ``inputs`` are the values of the body's formal inputs in order; ``outer`` maps
    outer-scope names to values (a superset of what this body reads is fine).
    """

    def __init__(self, g, opsets: dict, outer_info=None, name: str = "",
                 check_kernels: bool | None = None):
        self.graph = g
        self.name = name
        part = body_views(g, opsets, outer_info, name=name)
        self.partition = part
        self.input_names = [i.name for i in g.input]
        self.output_names = [o.name for o in g.output]
        self.outer_names = part.inputs[len(self.input_names):]
        self.output_info = [part.value(o) for o in self.output_names]
        token = SCOPE.set((opsets, part.value))
        try:
            self.executable = CPUExecutable(part, check_kernels=check_kernels, opsets=opsets)
        finally:
            SCOPE.reset(token)

    def run(self, inputs, outer: dict) -> list:
        if len(inputs) != len(self.input_names):
            raise ValueError(f"subgraph {self.name!r} takes {len(self.input_names)} inputs "
                             f"({', '.join(self.input_names)}), got {len(inputs)}")
        try:
            extra = [outer[n] for n in self.outer_names]
        except KeyError as exc:
            raise ValueError(f"subgraph {self.name!r} reads {exc.args[0]!r} from the outer scope, "
                             "which is not bound") from None
        return self.executable.run(list(inputs) + extra)
