"""One runtime's round of ``runtime-core bench --compare``, in a fresh process of its own.

Run as a script (``python -c "runpy.run_path(...)"``, see :mod:`runtime_core.bench_protocol`),
never imported from the package: the onnxruntime child must not load runtime-core (its imports,
thread pools and memory would count against onnxruntime). Only the standard library, numpy and
the runtime under test are imported. The result is one line on stdout, ``RESULT_TAG`` + JSON.

    worker.py probe
    worker.py run RUNTIME MODEL --inputs FEEDS.npz [--threads N] [--level L] [--providers P,...]
              [--warmup W] [--repeat R] [--min-time S] [--save-outputs OUT.npz]

``RUNTIME`` is ``ours`` or ``onnxruntime``. Each runtime keeps its defaults: only the intra-op
thread count (and the optimization level, when one is given) is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

RESULT_TAG = "RUNTIME_CORE_BENCH_RESULT "
BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
_ORT_LEVELS = {0: "ORT_DISABLE_ALL", 1: "ORT_ENABLE_BASIC", 2: "ORT_ENABLE_EXTENDED", 99: "ORT_ENABLE_ALL"}


def _status_mb(field: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def _peak_rss_mb() -> float:
    """This process's peak RSS. ``VmHWM`` where there is one: Linux keeps ``ru_maxrss`` across
    ``exec``, so a child's getrusage reports the forking parent's peak when that was larger."""
    hwm = _status_mb("VmHWM")
    if hwm is not None:
        return hwm
    import resource

    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / (1024.0 * 1024.0) if sys.platform == "darwin" else kb / 1024.0  # macOS counts bytes


def _numpy_blas() -> list:
    """numpy's BLAS libraries as threadpoolctl sees them in this process (scipy's and others
    left out: the CPU provider's GEMMs go through numpy)."""
    import numpy as np  # noqa: F401 - loads the BLAS threadpoolctl inspects

    try:
        from threadpoolctl import threadpool_info
    except ImportError as exc:
        return [{"error": f"threadpoolctl not importable: {exc}"}]
    infos = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    mine = [i for i in infos if "numpy" in str(i.get("filepath", ""))] or infos
    keys = ("internal_api", "version", "architecture", "num_threads", "threading_layer", "filepath")
    return [{k: i.get(k) for k in keys} for i in mine]


def _common() -> dict:
    import numpy as np

    return {"python": sys.version.split()[0], "numpy": np.__version__, "pid": os.getpid(),
            "env": {k: os.environ.get(k) for k in BLAS_ENV}}


def _session(runtime: str, model: str, threads: int, level: int | None, providers: list | None):
    if runtime == "onnxruntime":
        import onnxruntime as ort

        so = ort.SessionOptions()  # spinning, execution mode, arenas: as shipped
        if threads:
            so.intra_op_num_threads = threads
        if level is not None:
            so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _ORT_LEVELS[level])
        return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]), ort.__version__
    import runtime_core as rt

    so = rt.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    if level is not None:
        so.graph_optimization_level = rt.GraphOptimizationLevel(level)
    return rt.InferenceSession(model, so, providers=providers or ["CPUExecutionProvider"]), rt.__version__


def run(a) -> dict:
    import numpy as np

    if a.runtime == "onnxruntime":
        import onnxruntime  # noqa: F401 - import cost is not session creation
    else:
        import runtime_core
        from runtime_core.plugin.registry import get_registry

        get_registry()  # plugin discovery happens once per process, like onnxruntime's import
        del runtime_core
    with np.load(a.inputs, allow_pickle=False) as z:
        feeds = {k: z[k] for k in z.files}
    rss_before = _status_mb("VmRSS")
    providers = [p for p in (a.providers or "").split(",") if p] or None
    t0 = time.perf_counter()
    sess, version = _session(a.runtime, a.model, a.threads, a.level, providers)
    create_s = time.perf_counter() - t0
    feeds = {i.name: feeds[i.name] for i in sess.get_inputs()}
    for _ in range(a.warmup):
        sess.run(None, feeds)
    pc = time.perf_counter
    times: list = []
    cap = max(1, a.repeat) * 100
    while len(times) < max(1, a.repeat) or (sum(times) < a.min_time and len(times) < cap):
        t = pc()
        outs = sess.run(None, feeds)
        times.append(pc() - t)
    if a.save_outputs:
        keep: dict = {f"out{i}": np.asarray(o) for i, o in enumerate(outs)
                if isinstance(o, np.ndarray) and o.dtype.kind in "fiub"}
        np.savez(a.save_outputs, **keep)
    times_ms = [t * 1e3 for t in times]
    return dict(_common(), runtime=a.runtime, version=version, create_s=create_s, times_ms=times_ms,
                median_ms=statistics.median(times_ms), runs=len(times_ms), warmup=a.warmup, threads=a.threads,
                rss_before_session_mb=rss_before, peak_rss_mb=_peak_rss_mb(), blas=_numpy_blas())


def probe() -> dict:
    return dict(_common(), blas=_numpy_blas())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench_worker")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("probe")
    r = sub.add_parser("run")
    r.add_argument("runtime", choices=("ours", "onnxruntime"))
    r.add_argument("model")
    r.add_argument("--inputs", required=True)
    r.add_argument("--threads", type=int, default=0)
    r.add_argument("--level", type=int, choices=sorted(_ORT_LEVELS))
    r.add_argument("--providers")
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--repeat", type=int, default=10)
    r.add_argument("--min-time", type=float, default=0.0)
    r.add_argument("--save-outputs")
    a = p.parse_args(argv)
    d = probe() if a.cmd == "probe" else run(a)
    sys.stdout.write(RESULT_TAG + json.dumps(d) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
