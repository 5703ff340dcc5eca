"""Compiled CPU partitions: a flat list of bound kernel calls over value slots.

Everything that can be decided when the partition compiles is decided then (kernel
lookup, attributes, slot indices, when each value dies, in-place candidates), so a run
only calls kernels and moves references, each through the one step body
(:func:`~.step.run_step`).

A partition compiled with ``inter_op_num_threads`` N > 1 (the session's
``ExecutionMode.ORT_PARALLEL``) whose nodes are not one chain also gets a dependency
schedule (:class:`~.schedule.Schedule`): a run then starts every node whose inputs are
ready, on the caller's thread and up to N - 1 helper threads of the executable's own pool.
"""

from __future__ import annotations

import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from time import perf_counter_ns

import numpy as np

from ..fast import nchwc
from ..fast.sgemm import hold_blas, uses_blas
from ..registry import REGISTRY, KernelContext
from . import fusion, inplace
from .parallel import ParallelRun
from .schedule import Schedule
from .solo import SoloChooser
from .step import _NATIVE, FP_IGNORED, NONE_SLOT, STOP, end_scope, run_scope, run_step
from .subgraph import compile_subgraphs, with_outer


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


#: the session config entry (plugin API 1.4 ``Partition.config``) that turns measuring
#: kernels off ("0": the library calls; see ``fast/autotune.py``)
AUTOTUNE_CONFIG = "session.cpu.autotune"


#: "1": sequential runs on several kernel threads choose between the pool and the caller alone
#: once the load shows (``execution/solo.py``); off by default: on a noisy virtual machine the
#: alone runs it measures slowed benchmark medians and tail latency
SOLO_CONFIG = "session.cpu.solo_choice"


def solo_enabled(partition) -> bool:
    """Whether this partition's runs may choose the caller alone: ``session.cpu.solo_choice``."""
    config = getattr(partition, "config", None) or {}
    return str(config.get(SOLO_CONFIG, "0")).strip() == "1"


#: the runs (of any session) in flight past which a run of this session waits its turn before it
#: starts (first come first served, the GIL released): "0" no limit; unset, the process's
#: (the cores it may use, or ``RUNTIME_CORE_CPU_MAX_RUNS``; ``_native.run_gate``)
MAX_RUNS_CONFIG = "session.cpu.max_concurrent_runs"


def max_concurrent_runs(partition) -> int:
    """This partition's limit on the runs in flight (``session.cpu.max_concurrent_runs``; -1:
    the process's); a typed error for anything but a count."""
    config = getattr(partition, "config", None) or {}
    raw = str(config.get(MAX_RUNS_CONFIG, "")).strip()
    if not raw:
        return -1
    if not raw.isdigit() or int(raw) > 1 << 20:
        raise ValueError(f"session config entry {MAX_RUNS_CONFIG!r} must be a count of runs (0: no limit), "
                         f"got {raw!r}")
    return int(raw)


def autotune_enabled(partition) -> bool:
    """Whether this partition's kernels measure their candidates: its session's
    ``session.cpu.autotune`` (default "1"); a core older than plugin API 1.4 says nothing."""
    config = getattr(partition, "config", None) or {}
    return str(config.get(AUTOTUNE_CONFIG, "1")).strip() != "0"


class CPUExecutable:
    """Runs the nodes of one partition: in order, or (``partition.inter_op_num_threads`` > 1)
    each node as soon as its inputs are ready, on up to that many threads. Thread-safe:
    state is per call."""

    def __init__(self, partition, check_kernels: bool | None = None):
        self.partition = partition
        if check_kernels is None:
            check_kernels = os.environ.get("RUNTIME_CORE_CHECK_KERNELS", "") not in ("", "0")
        slot_of: dict[str, int] = {"": NONE_SLOT}
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
        if uses_blas((n.domain, n.op_type) for n in partition.nodes):
            hold_blas(kernel_threads)  # BLAS's own threads, set once for the process
        cap = int(getattr(partition, "max_tensor_bytes", 0) or 0)
        tune = autotune_enabled(partition)
        self._max_runs = max_concurrent_runs(partition)
        weights: dict = {}  # one packed copy per (constant, layout) for the partition's nodes
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
                max_tensor_bytes=cap,
                tune=tune,
                weights=weights,
            )
            in_slots = tuple(slot(n) for n in ins)
            out_slots = tuple(slot(n) if n else -1 for n in node.outputs)
            fn = spec.fn
            if spec.control:
                # compile the bodies once; the kernel gets the outer-scope values it reads
                # as ``outer=``: their slots follow the explicit inputs
                compile_subgraphs(ctx, node, check_kernels)
                implicit = tuple(node.implicit_inputs)
                in_slots = in_slots + tuple(slot(n) for n in implicit)
                fn = with_outer(spec.fn, len(ins), implicit)
            steps.append([fn, ctx, in_slots, out_slots, dict(node.attrs), (), getattr(spec.fn, "inplace", None)])
        self.n_slots = len(template)
        self.template = template
        self.output_slots = [slot_of[n] for n in partition.outputs]
        # free each intermediate after its last reader (partition outputs and constants stay)
        keep = set(self.output_slots) | {slot_of[n] for n in partition.constants} | {NONE_SLOT}
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
        for i, st in enumerate(steps):
            st[5] = tuple(frees.get(i, ()))
        threads = getattr(partition, "inter_op_num_threads", 1)  # absent on subgraph bodies
        self._schedule = Schedule.build(steps, keep, int(threads or 1))
        self._pool = None
        self._pool_lock = threading.Lock()
        self.n_inplace_steps = inplace.assign(steps, self.input_slots, self._schedule is not None)
        self.steps = [tuple(st) for st in steps]
        self.check_kernels = check_kernels
        # steps whose kernel may leave a faster call of itself after its first run
        # (``ctx.cache["bound"]``, see :func:`~.fusion.binds`); looked at once, after the first run
        self._bindable = [i for i, st in enumerate(self.steps)
                          if getattr(st[0], "binds", False) and st[6] is None]
        # runs of convolutions in the blocked layout, one step each (plain sequential runs only)
        self._regions = [] if self._schedule is not None else nchwc.regions(
            self.steps, partition, slot_of, template, kernel_threads,
            lambda node: KernelContext(node=node, n_outputs=len(node.outputs), input_dtypes=(),
                                       output_dtypes=(), threads=kernel_threads, max_tensor_bytes=cap, tune=tune,
                                       weights=weights))
        # what plain sequential runs iterate: the steps (regions made one), with pairs fused after binding
        self.run_steps = nchwc.substitute(self.steps, self._regions) if self._regions else self.steps
        self._fused: list = []
        # sequential runs on several kernel threads: pooled or on the caller alone, by measurement
        self._solo = (SoloChooser(_NATIVE) if _NATIVE is not None and kernel_threads > 1 and tune
                      and self._schedule is None and solo_enabled(partition) else None)

    @property
    def parallel(self) -> bool:
        """Whether runs schedule independent nodes on several threads."""
        return self._schedule is not None

    def fusions(self) -> list[tuple[str, tuple[str, ...]]]:
        """The steps that plain sequential runs execute as one: ``(kind, node names)``, ``kind``
        ``"nchwc"`` (a run of convolutions in the blocked layout, from compilation), ``"pair"`` (a
        chain) or ``"siblings"`` (two readers of one input), those two since the first run (plugin
        API 1.3: shown by the session's partition report)."""
        return [("nchwc", step[1].node.members) for _, _, step in self._regions] + list(self._fused)

    def kernels(self) -> list[tuple[str, str]]:
        """``(node name, kernel)`` for each node whose kernel was chosen among candidates on this
        machine (``fast/autotune.py``), after the run that chose it; a node run at several input
        sizes lists each (plugin API 1.4: shown by the session's partition report)."""
        out = []
        for st in self.steps:
            chosen = st[1].cache.get("kernels")
            if chosen:
                items = list(chosen.items())
                text = items[0][1] if len(items) == 1 else ", ".join(f"{k}: {v}" for k, v in items)
                out.append((st[1].node.name, text))
        return out

    def run(self, inputs, stop=None):
        """The partition's outputs for ``inputs``. ``stop`` (plugin API 1.3), when given, is
        called before each step and passed to the subgraphs that kernels run (Loop, Scan and
        If bodies); it raises when the caller wants the run to end, and that error leaves the
        run as it is."""
        # floating-point warnings are the IEEE results ONNX asks for (inf, nan): ignored once
        # per run here rather than per kernel call (np.errstate costs more than a tiny add)
        scope = run_scope(stop, self._max_runs)  # may wait its turn among concurrent runs
        token = STOP.set(stop)
        try:
            with np.errstate(all="ignore"):
                if self._schedule is not None:
                    return self._run_parallel(inputs, None, stop)
                if self._solo is not None:
                    sig = tuple(getattr(v, "shape", None) for v in inputs)
                    outs = self._solo.run(sig, self._run, self.run_steps, inputs, stop)
                else:
                    outs = self._run(self.run_steps, inputs, stop)
        finally:
            end_scope(scope)
            STOP.reset(token)
        if self._bindable:
            self._bind()
        return outs

    def run_profiled(self, inputs, record, stop=None):
        """``run`` that times each kernel call: ``record(node, t0_ns, t1_ns, inputs, outputs)``
        after each node (profiling; never the fused steps, so that each node is timed)."""
        scope = run_scope(stop, self._max_runs)
        token = STOP.set(stop)
        try:
            with np.errstate(all="ignore"):
                if self._schedule is not None:
                    return self._run_parallel(inputs, record, stop)
                return self._run(self.steps, inputs, stop, record)
        finally:
            end_scope(scope)
            STOP.reset(token)

    def _run(self, steps, inputs, stop, record=None):
        """The steps on this thread, inside the caller's ``np.errstate(all="ignore")`` (which
        :data:`~.step.FP_IGNORED` tells the kernels, so that they skip their own)."""
        slots = list(self.template)
        inputs = list(inputs)  # holds every feed for the whole run (never donated)
        for s, v in zip(self.input_slots, inputs):
            slots[s] = v
        check = self.check_kernels
        step = run_step
        token = FP_IGNORED.set(True)
        try:
            if record is None:
                if stop is None:
                    for st in steps:
                        step(st, slots, check)
                        for s in st[5]:
                            slots[s] = None
                else:
                    for st in steps:
                        stop()
                        step(st, slots, check)
                        for s in st[5]:
                            slots[s] = None
            else:
                self._run_timed(steps, slots, stop, record, check)
        finally:
            FP_IGNORED.reset(token)
        return [slots[s] for s in self.output_slots]

    @staticmethod
    def _run_timed(steps, slots, stop, record, check):
        """:meth:`_run`'s loop when profiling: the same steps, each timed."""
        step = run_step
        for st in steps:
            if stop is not None:
                stop()
            t0 = perf_counter_ns()
            args = step(st, slots, check)
            t1 = perf_counter_ns()
            record(st[1].node, t0, t1, args, [slots[s] for s in st[3] if s >= 0])
            args = None  # no stray reference may survive into the next ownership test
            for s in st[5]:
                slots[s] = None

    def _bind(self):
        """Each bindable step whose kernel left ``ctx.cache["bound"]`` calls that from now on,
        without the attributes (a Conv's plan run straight); then neighbouring bound steps
        that a fuser takes become one. Once, after the first sequential run."""
        bindable, self._bindable = self._bindable, []
        fusion.bind(self.steps, bindable)
        if bindable:
            base = nchwc.substitute(self.steps, self._regions) if self._regions else self.steps
            run_steps, fused = fusion.fuse(base, self.template, self.input_slots, self.output_slots)
            self._fused = fused
            self.run_steps = run_steps if fused else base

    def _run_parallel(self, inputs, record, stop):
        slots = list(self.template)
        inputs = list(inputs)
        for s, v in zip(self.input_slots, inputs):
            slots[s] = v
        return ParallelRun(self, slots, record, stop).main()

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
