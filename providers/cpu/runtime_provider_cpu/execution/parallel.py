"""One parallel run of a compiled partition: the caller's thread and helper threads take
ready steps from its :class:`~.schedule.Schedule`."""

from __future__ import annotations

import collections
import threading
from time import perf_counter_ns

import numpy as np

from .step import STOP, end_scope, run_scope, run_step


class ParallelRun:
    """One parallel run: the caller's thread and helper threads take ready steps.

    All counters live under ``lock``. A thread that finishes a step makes its successors
    ready, keeps the first for itself and queues the rest, asking the pool for helpers
    (at most ``threads - 1`` at a time); a helper returns as soon as nothing is ready, and
    never waits for anything, so runs sharing a pool cannot starve each other: the caller
    alone can always finish its run. After a failure (a kernel's error, or ``stop`` raising:
    a cancelled run) nothing new starts; the caller waits for the steps in flight, then
    raises the first error (the sequential loop's :class:`CPUKernelError`).
    """

    def __init__(self, exe, slots: list, record, stop=None):
        sched = exe._schedule
        self.exe = exe
        self.sched = sched
        self.slots = slots
        self.record = record
        self.stop = stop
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
        # its kernels count for the pool and poll the stop flag; it works for a run already
        # admitted, so it never waits for the gate (the run would wait on itself)
        scope = run_scope(self.stop, joined=True)
        token = STOP.set(self.stop)  # subgraph bodies run on this thread see the run's stop
        try:
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
        finally:
            end_scope(scope)
            STOP.reset(token)

    def _step(self, i: int):
        """Run step ``i`` (counted in ``running``); returns the next step this thread should run."""
        exe = self.exe
        st = exe.steps[i]
        slots = self.slots
        record = self.record
        try:
            if self.stop is not None:
                self.stop()
            if record is not None:
                t0 = perf_counter_ns()
                args = run_step(st, slots, exe.check_kernels)
                t1 = perf_counter_ns()
                record(st[1].node, t0, t1, args, [slots[s] for s in st[3] if s >= 0])
            else:
                run_step(st, slots, exe.check_kernels)
        except BaseException as exc:  # noqa: BLE001 - recorded for the caller: a helper must never die silently
            with self.lock:
                self.running -= 1
                if self.failed is None:
                    self.failed = exc
                self.ready.clear()
                self.cond.notify()
            return None
        args = None
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
