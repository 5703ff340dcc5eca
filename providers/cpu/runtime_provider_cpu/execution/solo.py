"""Whether a partition's runs use the kernel pool or the caller's thread alone, chosen by
measuring both as the runs go.

On cores that other processes keep busy, a run on several threads can be slower than on one:
its caller gets a smaller share of a core for the serial steps, and a pool worker descheduled
mid-part makes the caller wait (the pool's stall guard, ``native/threadpool.c``, handles the
second per job). Which is faster depends on the machine's load, so it is measured, but only once
the load shows: runs of one input signature are pooled while their recent median stays within
``_CONTENDED`` of the fastest pooled run (a quiet machine never runs a model on one thread).
Past it, runs alternate between the modes until running alone has ``_SAMPLES`` times, then run
in the faster mode (alone only when clearly faster), with every ``_EXPLORE``-th run in the other
mode; measuring alone stops once pooled runs are back to their quiet pace. The first ``_WARM``
runs of a signature run pooled (kernel choices are measured then, at the session's threads)."""

from __future__ import annotations

from collections import deque
from statistics import median
from time import perf_counter_ns

_WARM = 3  # runs of a signature before any is run alone
_SAMPLES = 5  # run times kept per mode
_EXPLORE = 32  # every this many runs try the mode not chosen
_MARGIN = 0.95  # alone must take at most this share of the pooled time to be chosen
_SIGNATURES = 8  # input signatures remembered (a dynamic-shape model sees many)
_CONTENDED = 1.5  # recent pooled median over the fastest pooled run: other processes hold cores (a quiet
# virtual machine's runs reach 1.25x their best)


class _Times:
    __slots__ = ("runs", "pooled", "alone", "best", "since")

    def __init__(self) -> None:
        self.runs = 0
        self.pooled: deque = deque(maxlen=_SAMPLES)
        self.alone: deque = deque(maxlen=_SAMPLES)
        self.best = float("inf")  # the fastest pooled run
        self.since: int | None = None  # the run from which running alone is measured too


class SoloChooser:
    """Per input signature, whether the next run's kernels run on the caller alone; thread-safe
    enough for concurrent runs (a lost sample only delays a choice)."""

    def __init__(self, native) -> None:
        self._native = native
        self._by_sig: dict = {}

    def _times(self, sig) -> _Times:
        t = self._by_sig.get(sig)
        if t is None:
            if len(self._by_sig) >= _SIGNATURES:
                self._by_sig.clear()
            t = self._by_sig[sig] = _Times()
        return t

    def alone(self, sig) -> bool:
        """Whether the run about to start with input signature ``sig`` runs alone."""
        t = self._times(sig)
        t.runs += 1
        n = t.runs - _WARM
        if n <= 0:
            return False
        if t.since is None:
            if len(t.pooled) < _SAMPLES or median(t.pooled) <= _CONTENDED * t.best:
                return False
            t.since = n  # the load shows: measure running alone too
        m = n - t.since
        if len(t.alone) < _SAMPLES:
            return m % 2 == 0
        pooled = median(t.pooled)
        if median(t.alone) < _MARGIN * pooled:
            return m % _EXPLORE != 0
        if pooled <= _CONTENDED * t.best:  # the pool is back to its quiet pace
            t.since = None
            t.alone.clear()
            return False
        return m % _EXPLORE == 0

    def record(self, sig, alone: bool, ns: int) -> None:
        t = self._times(sig)
        if t.runs > _WARM:
            if alone:
                t.alone.append(ns)
            else:
                t.pooled.append(ns)
                t.best = min(t.best, ns)

    def run(self, sig, fn, *args):
        """``fn(*args)`` in the mode chosen for ``sig``, timed for the next choices."""
        alone = self.alone(sig)
        before = self._native.run_solo(alone)
        t0 = perf_counter_ns()
        try:
            out = fn(*args)
        finally:
            self._native.run_solo(before)
        self.record(sig, alone, perf_counter_ns() - t0)
        return out
