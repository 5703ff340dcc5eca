"""Run conformance cases isolated in worker processes; tabulate the results.

Each case runs in a worker process (``spawn``): a case that crashes the interpreter or
runs past its time limit is recorded as ``crash`` / ``timeout`` and the worker is
replaced; nothing one case does can stop the run. Statuses: ``passed``, ``failed``
(outputs differ: the message says where), ``error`` (an exception while loading or
running: type and message), ``crash``, ``timeout``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import wait

from .cases import FOLDERS, Case

__all__ = ["CaseResult", "Summary", "run_case", "run_cases"]

DEFAULT_TIMEOUT = 300.0


@dataclass
class CaseResult:
    """What became of one case."""

    id: str
    folder: str
    status: str
    message: str = ""
    seconds: float = 0.0
    #: where the nodes ran: provider name -> node count (empty when no session was built)
    placement: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict:
        return asdict(self)


def run_case(case: Case, providers: list, provider_options=None, threads: int = 1) -> CaseResult:
    """Run one case in this process (no isolation); never raises."""
    import warnings

    import numpy as np

    from ..session import InferenceSession, SessionOptions
    from .compare import compare_outputs, undefined_positions

    t0 = time.perf_counter()
    placement: dict = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            opts = SessionOptions()
            opts.intra_op_num_threads = threads
            sess = InferenceSession(str(case.model_path), sess_options=opts, providers=providers,
                                    provider_options=provider_options)
            for n in sess.get_partition_report().nodes:
                placement[n.provider] = placement.get(n.provider, 0) + 1
            names = [i.name for i in sess.get_inputs()]
            for inputs, expected in case.data_sets():
                feed = dict(zip(names, inputs))
                with np.errstate(all="ignore"):
                    outs = sess.run(None, feed)
                undefined = undefined_positions(case.id, inputs)
                if undefined is not None and undefined.any():
                    outs = [_take_undefined(a, e, undefined) for a, e in zip(outs, expected)]
                compare_outputs(expected, outs, case.rtol, case.atol)
    except AssertionError as exc:
        return CaseResult(case.id, case.folder, "failed", str(exc)[:2000], time.perf_counter() - t0, placement)
    except Exception as exc:  # noqa: BLE001 - every failure is a result
        msg = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, _expected_errors()):
            msg += "\n" + "".join(traceback.format_exception(exc)[-3:])
        return CaseResult(case.id, case.folder, "error", msg[:2000], time.perf_counter() - t0, placement)
    return CaseResult(case.id, case.folder, "passed", "", time.perf_counter() - t0, placement)


def _take_undefined(actual, expected, undefined):
    """``actual`` with the expected values where the spec defines none (see compare.undefined_positions)."""
    if not hasattr(actual, "shape") or actual.shape != undefined.shape or getattr(expected, "shape", None) != actual.shape:
        return actual  # a wrong shape is reported by the comparison
    out = actual.copy()
    out[undefined] = expected[undefined]
    return out


def _expected_errors():
    from ..errors import RuntimeCoreError

    return (RuntimeCoreError,)


def _worker(conn, providers, provider_options, threads):  # pragma: no cover - runs in a child
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(threads))
    while True:
        try:
            case = conn.recv()
        except EOFError:
            return
        if case is None:
            return
        conn.send(run_case(case, providers, provider_options, threads))


class _Slot:
    def __init__(self, ctx, args):
        self.ctx, self.args = ctx, args
        self.start()

    def start(self):
        parent, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker, args=(child, *self.args), daemon=True)
        self.proc.start()
        child.close()
        self.conn = parent
        self.case = None
        self.t0 = 0.0

    def stop(self, kill=False):
        try:
            if kill:
                self.proc.kill()
            else:
                self.conn.send(None)
        except Exception:  # noqa: BLE001
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()


def run_cases(cases: list[Case], providers=("cpu",), provider_options=None, jobs: int | None = None,
              timeout: float = DEFAULT_TIMEOUT, threads: int = 1, progress=None) -> list[CaseResult]:
    """Run ``cases`` on ``jobs`` worker processes; results in the order of ``cases``."""
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(cases) or 1))
    ctx = mp.get_context("spawn")
    args = (list(providers), provider_options, threads)
    # the biggest cases first, so that a slow model does not trail the run
    order = sorted(range(len(cases)), key=lambda i: cases[i].folder != "real")
    pending = list(reversed(order))
    results: dict[int, CaseResult] = {}
    slots = [_Slot(ctx, args) for _ in range(jobs)]
    try:
        def feed(slot):
            if pending:
                i = pending.pop()
                slot.case, slot.t0 = i, time.perf_counter()
                slot.conn.send(cases[i])

        for s in slots:
            feed(s)
        while len(results) < len(cases):
            busy = [s for s in slots if s.case is not None]
            ready = wait([s.conn for s in busy], timeout=1.0)
            now = time.perf_counter()
            for s in busy:
                i = s.case
                c = cases[i]
                if s.conn in ready:
                    try:
                        res = s.conn.recv()
                    except (EOFError, OSError):
                        s.proc.join(1)
                        res = CaseResult(c.id, c.folder, "crash",
                                         f"the worker process died (exit code {s.proc.exitcode}) running this case",
                                         now - s.t0)
                        s.stop(kill=True)
                        s.start()
                elif now - s.t0 > timeout:
                    res = CaseResult(c.id, c.folder, "timeout", f"no result after {timeout:.0f} s", now - s.t0)
                    s.stop(kill=True)
                    s.start()
                else:
                    continue
                results[i] = res
                s.case = None
                if progress is not None:
                    progress(res, len(results), len(cases))
                feed(s)
    finally:
        for s in slots:
            s.stop()
    return [results[i] for i in range(len(cases))]


@dataclass
class Summary:
    """Counts per folder and overall, plus the failures."""

    results: list

    def by_folder(self) -> dict[str, dict[str, int]]:
        table: dict[str, dict[str, int]] = {}
        for r in self.results:
            row = table.setdefault(r.folder, {"total": 0})
            row["total"] += 1
            row[r.status] = row.get(r.status, 0) + 1
        return {f: table[f] for f in FOLDERS if f in table}

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def failed(self) -> int:
        return len(self.results) - self.passed

    def table(self) -> str:
        cols = ("passed", "failed", "error", "crash", "timeout")
        rows = [("folder", "total", *cols)]
        for f, row in self.by_folder().items():
            rows.append((f, str(row["total"]), *(str(row.get(c, 0)) for c in cols)))
        tot = {c: sum(r.status == c for r in self.results) for c in cols}
        rows.append(("all", str(len(self.results)), *(str(tot[c]) for c in cols)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                         for r in rows)
