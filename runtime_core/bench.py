"""Latency, session creation and peak memory of runtime-core, optionally against onnxruntime.

:func:`bench` is what ``runtime-core bench`` runs:

* **latency**: both sessions live in this process; after ``warmup`` runs of each, the
  ``repeat`` timed runs alternate between them (ours, ORT, ORT, ours, ...), so that load
  from other processes falls on both alike; with ``min_time`` they go on until the timed runs
  add up to that many seconds (at most 50x ``repeat``). Median, min and max of ``time.perf_counter``
  around ``sess.run``; the ratio is ours / onnxruntime of the medians.
  With ``settle`` > 0 (what ``runtime-core bench --compare`` and ``benchmarks/run_all.py``
  use) the runtimes alternate in blocks of about ``block_time`` seconds instead, each block
  after ``settle`` seconds of idling and with its first run untimed: a thread pool that
  spin-waits after its runtime's run (numpy's OpenBLAS after our GEMMs, onnxruntime's
  with spinning on) otherwise takes the cores of the other runtime's next run. onnxruntime's
  BERT-base ran 19% slower right after a burst of numpy GEMMs: run by run, our BLAS-heavy
  models were flattered.
* **session creation**: wall time of the ``InferenceSession(...)`` call from the model path,
  for each runtime, in this process, after both runtimes are imported and runtime-core's plugins
  discovered (once per process, like onnxruntime's import); with
  ``create_repeat`` > 1 the minimum is reported.
* **peak memory**: measured in a fresh subprocess per runtime (``python -m runtime_core.bench
  --child ...``): after the runtime is imported and the inputs are loaded the process's peak
  RSS is reset (Linux ``/proc/self/clear_refs`` ``5``), then the session is created from the
  model path and run ``memory_runs`` times; the figure is ``VmHWM`` (peak RSS) minus the RSS
  just before session creation, so it covers the model's weights, the session's own
  structures and the run's intermediates (all allocations, not only numpy's). Where the
  peak cannot be reset, ``ru_maxrss`` minus that RSS is used and the method says so.

onnxruntime is optional: ``compare=True`` without it raises :class:`BenchError` saying so.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ORT = "onnxruntime"


class BenchError(RuntimeError):
    """A benchmark could not run (onnxruntime missing, bad inputs, a child process failed)."""


@dataclass
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    runs: int

    @classmethod
    def of(cls, seconds: list[float]) -> "Timing":
        ms = [s * 1e3 for s in seconds]
        return cls(statistics.median(ms), min(ms), max(ms), len(ms))


@dataclass
class RuntimeResult:
    runtime: str  # "runtime-core" or "onnxruntime"
    latency: Timing
    create_s: float
    peak_mb: float | None = None
    memory_method: str = ""


@dataclass
class BenchResult:
    model: str
    threads: int
    providers: list
    level: int
    warmup: int
    repeat: int
    inputs: str
    nodes: int
    ours: RuntimeResult
    ort: RuntimeResult | None = None
    max_abs_diff: float | None = None
    notes: list = field(default_factory=list)
    blas: str = ""

    @property
    def ratio(self) -> float | None:
        if self.ort is None or not self.ort.latency.median_ms:
            return None
        return self.ours.latency.median_ms / self.ort.latency.median_ms

    @property
    def create_ratio(self) -> float | None:
        if self.ort is None or not self.ort.create_s:
            return None
        return self.ours.create_s / self.ort.create_s

    @property
    def memory_ratio(self) -> float | None:
        if self.ort is None or not self.ort.peak_mb or self.ours.peak_mb is None:
            return None
        return self.ours.peak_mb / self.ort.peak_mb

    @property
    def per_node_us(self) -> float:
        return self.ours.latency.median_ms * 1e3 / max(1, self.nodes)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(ratio=self.ratio, create_ratio=self.create_ratio, memory_ratio=self.memory_ratio,
                 per_node_us=self.per_node_us)
        return d


def blas_description() -> str:
    """numpy's BLAS as threadpoolctl sees it: library, version, kernel set and threads, and
    the environment variables that pin OpenBLAS's kernel choice. The CPU provider's GEMMs run
    there, so a kernel set narrower than the CPU's (``OPENBLAS_CORETYPE=Haswell`` on an AVX-512
    host) slows every GEMM-bound model while onnxruntime's own kernels are unaffected."""
    try:
        from threadpoolctl import threadpool_info

        infos = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    except Exception as exc:  # threadpoolctl missing or failing: say so
        return f"unknown ({type(exc).__name__}: {exc})"
    parts = [" ".join(str(v) for v in (i.get("internal_api"), i.get("version"), i.get("architecture")) if v)
             + f" kernels, {i.get('num_threads')} threads" for i in infos] or ["none found"]
    pins = [f"{k}={os.environ[k]}" for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if os.environ.get(k)]
    return "; ".join(parts) + (f" (pinned by {', '.join(pins)})" if pins else "")


# -- sessions ---------------------------------------------------------------------------

def import_ort():
    """onnxruntime, or a :class:`BenchError` that says how to get it."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise BenchError("--compare onnxruntime needs the onnxruntime package, which is not installed "
                         "(pip install onnxruntime); it is never a dependency of runtime-core") from exc
    return onnxruntime


_ORT_LEVELS = {0: "ORT_DISABLE_ALL", 1: "ORT_ENABLE_BASIC", 2: "ORT_ENABLE_EXTENDED", 99: "ORT_ENABLE_ALL"}


def make_session(runtime: str, model: str, *, threads: int = 0, level: int = 99, providers=None,
                 profile_prefix: str | None = None, ort_spinning: bool = False):
    """An ``InferenceSession`` of runtime-core (``runtime="ours"``) or onnxruntime.

    ``ort_spinning=False`` sets onnxruntime's ``session.intra_op.allow_spinning=0``: in an
    interleaved benchmark its worker threads would otherwise spin-wait after each of its runs
    on the cores the next run (ours) needs."""
    if level not in _ORT_LEVELS:
        raise BenchError(f"optimization level must be one of {sorted(_ORT_LEVELS)}, got {level}")
    if runtime == ORT:
        ort = import_ort()
        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _ORT_LEVELS[level])
        if threads:
            so.intra_op_num_threads = threads
        if not ort_spinning:
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if profile_prefix:
            so.enable_profiling = True
            so.profile_file_prefix = profile_prefix
        return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    import runtime_core as rt

    so = rt.SessionOptions()
    so.graph_optimization_level = rt.GraphOptimizationLevel(level)
    if threads:
        so.intra_op_num_threads = threads
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sess = rt.InferenceSession(model, so, providers=providers)
    for w in caught:
        sys.stderr.write(f"warning: {w.message}\n")
    return sess


def default_inputs_path(model: str) -> str | None:
    """``MODEL.npz`` next to ``MODEL.onnx`` (what ``benchmarks/models.py`` writes), if present."""
    p = Path(model).with_suffix(".npz")
    return str(p) if p.is_file() else None


def load_inputs(sess, inputs: str | None, dim: int = 1) -> dict:
    """Feeds from an ``.npz`` (names = the model's inputs), else random ones of the right types."""
    if inputs:
        with np.load(inputs, allow_pickle=False) as z:
            feeds = {k: z[k] for k in z.files}
        want = [i.name for i in sess.get_inputs()]
        missing = [n for n in want if n not in feeds]
        if missing:
            raise BenchError(f"{inputs} has no value for input(s) {', '.join(missing)} "
                             f"(it holds {', '.join(feeds) or 'nothing'})")
        return {n: feeds[n] for n in want}
    from .cli import random_feeds

    return random_feeds(sess, dim=dim)


def _warm_file_cache(model) -> None:
    """Read the model file once, in chunks, so that it is in the OS cache for both runtimes."""
    import os

    if isinstance(model, (str, os.PathLike)) and os.path.isfile(model):
        with open(model, "rb") as f:
            while f.read(16 << 20):
                pass


def _create(runtime, model, repeat, **kw):
    best, sess = None, None
    for _ in range(max(1, repeat)):
        sess = None  # free the previous one before timing the next
        t0 = time.perf_counter()
        sess = make_session(runtime, model, **kw)
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return sess, best


# -- memory (fresh subprocess per runtime) ----------------------------------------------------

def _status_kb(field_name: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _child(argv) -> int:
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("runtime")
    p.add_argument("model")
    p.add_argument("--inputs")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--level", type=int, default=99)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--providers")
    a = p.parse_args(argv)
    if a.runtime == ORT:
        import_ort()
    else:
        import runtime_core  # noqa: F401 - imported before the baseline, like onnxruntime
        from runtime_core.plugin.registry import get_registry

        get_registry()  # plugin discovery is import-time cost, not the session's
    feeds_file = None
    if a.inputs:
        with np.load(a.inputs, allow_pickle=False) as z:
            feeds_file = {k: z[k] for k in z.files}
    reset = False
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        reset = True
    except OSError:
        pass
    base = _status_kb("VmRSS")
    providers = [s for s in (a.providers or "").split(",") if s] or None
    sess = make_session(a.runtime, a.model, threads=a.threads, level=a.level, providers=providers)
    feeds = load_inputs(sess, None) if feeds_file is None else {
        i.name: feeds_file[i.name] for i in sess.get_inputs()}
    for _ in range(max(1, a.runs)):
        sess.run(None, feeds)
    if reset and base is not None:
        peak = _status_kb("VmHWM")
        method = "peak RSS (VmHWM) growth from session creation, fresh process"
    else:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        base = base or 0
        method = "ru_maxrss minus RSS before session creation, fresh process (peak not resettable)"
    print(json.dumps({"peak_mb": (peak - base) / 1024.0, "method": method}))
    return 0


def measure_memory(runtime: str, model: str, *, inputs=None, threads=0, level=99, runs=3,
                   providers=None, timeout=1800) -> tuple[float, str]:
    """Peak RSS growth (MiB) of creating a session and running it, in a fresh subprocess."""
    cmd = [sys.executable, "-m", "runtime_core.bench", "--child", runtime, model, "--threads", str(threads),
           "--level", str(level), "--runs", str(runs)]
    if inputs:
        cmd += ["--inputs", inputs]
    if providers:
        cmd += ["--providers", ",".join(providers)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise BenchError(f"memory measurement of {runtime} failed (exit {r.returncode}): "
                         f"{r.stderr.strip()[-2000:]}")
    d = json.loads(r.stdout.strip().splitlines()[-1])
    return float(d["peak_mb"]), d["method"]


# -- the benchmark ----------------------------------------------------------------------------

def bench(model: str, *, providers=None, threads: int = 2, compare: bool = False, warmup: int = 3,
          repeat: int = 20, level: int = 99, inputs: str | None = None, dim: int = 1,
          memory: bool = True, memory_runs: int = 3, create_repeat: int = 1, check: bool = True,
          log=None, ort_spinning: bool = False, min_time: float = 0.0, settle: float = 0.0,
          block_time: float = 0.3) -> BenchResult:
    """Benchmark ``model`` (a path). See the module docstring for what is measured and how.

    ``ort_spinning``: leave onnxruntime's intra-op spin-waiting on (its default); off by default
    here because in interleaved runs its spinning thread takes a core from the next run (ours).
    ``min_time``: keep interleaving past ``repeat`` runs until the timed runs add up to at least
    this many seconds (at most 50x ``repeat`` runs): a model of a few milliseconds then spans
    enough of the machine's load swings for its medians to settle."""
    model = str(model)
    if min_time < 0 or min_time != min_time:
        raise BenchError(f"min_time must be >= 0 seconds, got {min_time!r}")
    if not (0 <= settle < 60) or not (0 < block_time < 600):
        raise BenchError(f"settle must be in [0, 60) and block_time in (0, 600) seconds, got "
                         f"{settle!r} and {block_time!r}")
    if providers is None:
        providers = ["CPUExecutionProvider"]  # what onnxruntime is compared on
    if not Path(model).is_file():
        raise BenchError(f"model file {model!r} does not exist")
    if compare:
        import_ort()  # fail before spending minutes on our side
    from .plugin.registry import get_registry

    get_registry()  # plugin discovery: once per process, not part of session creation
    if inputs is None:
        inputs = default_inputs_path(model)
    kw = dict(threads=threads, level=level)
    _warm_file_cache(model)  # whoever is timed first must not pay for reading the file from disk
    ours, ours_create = _create("ours", model, create_repeat, providers=providers, **kw)
    feeds = load_inputs(ours, inputs, dim)
    ort_sess = ort_create = None
    if compare:
        ort_sess, ort_create = _create(ORT, model, create_repeat, ort_spinning=ort_spinning, **kw)
    for _ in range(max(0, warmup)):
        ours.run(None, feeds)
        if ort_sess is not None:
            ort_sess.run(None, feeds)
    a, o = [], []
    pc = time.perf_counter
    sessions = (ours, ort_sess)
    if settle > 0 and ort_sess is not None:
        # blocks: settle, one untimed run, then timed runs for about block_time seconds (no
        # more than repeat of them without min_time, nor than the 50x repeat cap with it)
        block = max(1, round(block_time / max(_time_one(ours, feeds), _time_one(ort_sess, feeds), 1e-6)))
        cap = max(1, repeat) * (50 if min_time > 0 else 1)
        block = min(block, cap)
        i = 0
        while len(a) < max(1, repeat) or (sum(a) + sum(o) < min_time and len(a) < cap):
            n = min(block, cap - len(a))
            for which in ((0, 1) if i % 2 == 0 else (1, 0)):
                time.sleep(settle)
                sessions[which].run(None, feeds)
                out = a if which == 0 else o
                for _ in range(n):
                    t = pc()
                    sessions[which].run(None, feeds)
                    out.append(pc() - t)
            i += 1
    else:
        start = pc()
        i = 0
        while i < max(1, repeat) or (pc() - start < min_time and i < 50 * max(1, repeat)):
            order = (0, 1) if i % 2 == 0 else (1, 0)
            i += 1
            for which in order:
                if which == 0:
                    t = pc()
                    ours.run(None, feeds)
                    a.append(pc() - t)
                elif ort_sess is not None:
                    t = pc()
                    ort_sess.run(None, feeds)
                    o.append(pc() - t)
    diff = None
    notes = []
    if settle > 0 and ort_sess is not None:
        notes.append(f"the runtimes alternated in blocks of {block} timed run(s), each block after "
                     f"{settle:g} s idle and one untimed run")
    if check and ort_sess is not None:
        ra, rb = ours.run(None, feeds), ort_sess.run(None, feeds)
        diffs = []
        for x, y in zip(ra, rb):
            x, y = np.asarray(x), np.asarray(y)
            if x.dtype.kind in "fiub" and y.dtype.kind in "fiub" and x.shape == y.shape and x.size:
                diffs.append(float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))))
            elif x.shape != y.shape:
                notes.append(f"output shapes differ: {x.shape} vs {y.shape}")
        diff = max(diffs) if diffs else None
    nodes = len(ours.get_partition_report().nodes)
    prov_names = ours.get_providers()
    del ours, ort_sess
    res_ours = RuntimeResult("runtime-core", Timing.of(a), ours_create)
    res_ort = RuntimeResult(ORT, Timing.of(o), ort_create) if compare else None
    if memory:
        for res, rt_name in ((res_ours, "ours"), (res_ort, ORT)):
            if res is None:
                continue
            if log:
                log(f"measuring peak memory of {res.runtime} in a fresh process")
            res.peak_mb, res.memory_method = measure_memory(
                rt_name, model, inputs=inputs, threads=threads, level=level, runs=memory_runs,
                providers=providers if rt_name == "ours" else None)
    return BenchResult(model=model, threads=threads, providers=prov_names, level=level, warmup=warmup,
                       repeat=len(a), inputs=inputs or f"random (symbolic dims = {dim})", nodes=nodes,
                       ours=res_ours, ort=res_ort, max_abs_diff=diff, notes=notes,
                       blas=blas_description())


def _time_one(sess, feeds) -> float:
    t = time.perf_counter()
    sess.run(None, feeds)
    return time.perf_counter() - t


def format_result(r: BenchResult) -> str:
    """The text ``runtime-core bench`` prints."""
    lines = [f"model: {r.model}",
             f"providers: {', '.join(r.providers)}; threads: {r.threads}; optimization level: {r.level}; "
             f"warmup {r.warmup}, {r.repeat} interleaved runs each",
             f"inputs: {r.inputs}",
             f"numpy BLAS: {r.blas}",
             f"nodes (runtime-core, after optimization): {r.nodes}"]
    rows = [("", "runtime-core") + ((ORT, "ratio") if r.ort else ())]

    def ms(t):
        return f"{t:.3f} ms"

    def row(label, f, fmt, ratio=None):
        cells = [label, fmt(f(r.ours))]
        if r.ort:
            v = f(r.ort)
            cells += [fmt(v) if v is not None else "-", f"{ratio:.2f}" if ratio is not None else "-"]
        rows.append(tuple(cells))

    row("latency median", lambda x: x.latency.median_ms, ms, r.ratio)
    row("latency min", lambda x: x.latency.min_ms, ms,
        r.ours.latency.min_ms / r.ort.latency.min_ms if r.ort and r.ort.latency.min_ms else None)
    row("latency max", lambda x: x.latency.max_ms, ms,
        r.ours.latency.max_ms / r.ort.latency.max_ms if r.ort and r.ort.latency.max_ms else None)
    row("session creation", lambda x: x.create_s, lambda v: f"{v:.3f} s", r.create_ratio)
    if r.ours.peak_mb is not None:
        row("peak memory", lambda x: x.peak_mb, lambda v: f"{v:.1f} MiB", r.memory_ratio)
    widths = [max(len(str(x[i])) for x in rows) for i in range(len(rows[0]))]
    for x in rows:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(x, widths)).rstrip())
    lines.append(f"per node (runtime-core median / nodes): {r.per_node_us:.2f} us")
    if r.ratio is not None:
        lines.append(f"ratio (runtime-core / onnxruntime, median latency): {r.ratio:.3f}")
    if r.ours.memory_method:
        lines.append(f"memory: {r.ours.memory_method}")
    if r.max_abs_diff is not None:
        lines.append(f"outputs: max abs difference to onnxruntime {r.max_abs_diff:.3g}")
    lines.extend(r.notes)
    return "\n".join(lines)


# -- profile summaries ------------------------------------------------------------------------

def summarize_profile(path: str, top: int = 10, skip_runs: int = 0) -> dict:
    """Time by op type, by provider and the slowest nodes of a trace (ours or onnxruntime's);
    the node events of the first ``skip_runs`` runs (warm-ups) are left out."""
    with open(path, encoding="utf-8") as f:
        events = json.load(f)
    if skip_runs:
        runs_at = sorted((int(e.get("ts", 0)), int(e.get("ts", 0)) + int(e.get("dur", 0))) for e in events
                         if e.get("cat") == "Session" and e.get("name") == "model_run")[:skip_runs]
        end = runs_at[-1][1] if runs_at else -1
        events = [e for e in events if int(e.get("ts", 0)) > end
                  or (e.get("cat") == "Session" and e.get("name") != "model_run")]
    by_op: dict[str, list] = {}
    by_prov: dict[str, list] = {}
    by_node: dict[str, list] = {}
    runs = 0
    for e in events:
        if e.get("cat") == "Session" and e.get("name") == "model_run":
            runs += 1
        if e.get("cat") != "Node" or not str(e.get("name", "")).endswith("_kernel_time"):
            continue
        args = e.get("args", {})
        op, prov, dur = args.get("op_name", "?"), args.get("provider", "?"), int(e.get("dur", 0))
        node = e["name"][: -len("_kernel_time")]
        for d, k in ((by_op, op), (by_prov, prov)):
            acc = d.setdefault(k, [0, 0])
            acc[0] += dur
            acc[1] += 1
        acc = by_node.setdefault(node, [0, 0, op, prov])
        acc[0] += dur
        acc[1] += 1
    total = sum(v[0] for v in by_op.values()) or 1
    return {
        "file": path, "runs": runs, "total_us": total,
        "by_op": sorted(((k, v[0], v[1], v[0] / total) for k, v in by_op.items()), key=lambda t: -t[1]),
        "by_provider": sorted(((k, v[0], v[1], v[0] / total) for k, v in by_prov.items()),
                              key=lambda t: -t[1]),
        "top_nodes": sorted(((k, v[2], v[3], v[0], v[1]) for k, v in by_node.items()),
                            key=lambda t: -t[3])[:top],
    }


def format_profile(s: dict) -> str:
    runs = max(1, s["runs"])
    out = [f"profile: {s['file']} ({s['runs']} run(s); node time {s['total_us'] / 1e3:.3f} ms in all, "
           f"{s['total_us'] / 1e3 / runs:.3f} ms per run)"]

    def table(title, header, rows):
        out.append("")
        out.append(title)
        rows = [header] + rows
        widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
        for r in rows:
            out.append("  " + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())

    table("time by op type:", ("op", "total ms", "per run ms", "calls", "share"),
          [(k, f"{t / 1e3:.3f}", f"{t / 1e3 / runs:.3f}", n, f"{100 * sh:.1f}%") for k, t, n, sh in s["by_op"]])
    table("time by provider:", ("provider", "total ms", "per run ms", "calls", "share"),
          [(k, f"{t / 1e3:.3f}", f"{t / 1e3 / runs:.3f}", n, f"{100 * sh:.1f}%")
           for k, t, n, sh in s["by_provider"]])
    table(f"top {len(s['top_nodes'])} nodes:", ("node", "op", "provider", "total ms", "calls"),
          [(k, op, pv, f"{t / 1e3:.3f}", n) for k, op, pv, t, n in s["top_nodes"]])
    return "\n".join(out)


def profile(model: str, *, providers=None, threads: int = 0, level: int = 99, repeat: int = 10,
            inputs: str | None = None, dim: int = 1, prefix: str | None = None, runtime: str = "ours",
            warmup: int = 0) -> str:
    """Run ``model`` ``warmup + repeat`` times with profiling on (every run is in the trace, as
    in ORT); returns the trace file's path (``runtime="onnxruntime"`` profiles with onnxruntime).
    ``summarize_profile(path, skip_runs=warmup)`` leaves the warm-up runs out."""
    if inputs is None:
        inputs = default_inputs_path(model)
    if providers is None:
        providers = ["CPUExecutionProvider"]
    if prefix is None:
        import tempfile

        prefix = os.path.join(tempfile.gettempdir(), "runtime_core_profile")
    sess = make_session(runtime, model, threads=threads, level=level,
                        providers=providers if runtime == "ours" else None, profile_prefix=prefix)
    feeds = load_inputs(sess, inputs, dim)
    for _ in range(warmup + max(1, repeat)):
        sess.run(None, feeds)
    return sess.end_profiling()


if __name__ == "__main__":  # the per-runtime memory child
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.exit(_child(sys.argv[2:]))
    sys.exit("usage: python -m runtime_core.bench --child RUNTIME MODEL [...] (use `runtime-core bench`)")
