"""Concurrent load: many threads calling ``run`` on one session, and runs beside busy processes.

``python benchmarks/concurrency.py [--part throughput|latency|all] [--rounds 3]``

* throughput: runs/s of one session of a BERT-tiny-sized encoder (2 x 128, 2 heads, ff 512,
  seq 128, batch 1; TorchScript export) driven by 1, 2, 4, 8, 16 client threads, each runtime
  with its default settings in its own fresh process, rounds alternating between the runtimes;
  the median over rounds and the median of the per-round ratios (our wall time / onnxruntime's);
* latency: p10 / p50 / p90 of single runs in turn while ``--busy`` (2) other processes spin on
  the cores, at the default thread count and at ``intra_op_num_threads=1``; ``--models`` runs
  this part on other models (each ``NAME.onnx`` with its feeds in ``NAME.npz``, e.g. the corpus
  cache: ``--part latency --models ~/.cache/rcb/*.onnx --latency-runtimes runtime_core``) and
  checks each against the targets (default-thread median no worse than one thread's, p90 at
  most 3x the median), with the kernel pool's stalls a run (a caller left waiting on a part
  that a descheduled worker holds; counted, not acted on). With
  ``--paired`` a runtime's two thread settings run in one process, alternating in blocks of
  ``--block`` runs for ``--seconds`` in all, so that a drifting background load (other users of a
  shared machine) falls on both alike; ``--pool-load-ab`` adds the default thread count with the
  kernel pool's load rule off as a third series. The pool's counts a run are printed beside: jobs
  opened to its workers, those no worker joined, and jobs run on their caller alone for the load.
  Beside them a series with no runtime at all, the scheduler's floor: a fixed CPU loop (``sum(range(n))``,
  n set to run as long as runtime-core's default-thread p50 of the same round, on one thread, in its own
  fresh process) timed the same way. A run that goes back to back with busy processes on every core
  loses its core to one of them now and then, for a scheduler slice; the floor row says what any
  computation of that length meets on this machine (``--no-floor`` leaves it out). ``--gap-ms`` pauses
  between runs, untimed, as a server idles between requests (all series alike).

Both runtimes run without ``OPENBLAS_CORETYPE`` / ``OPENBLAS_L2_SIZE`` (users do not have them)
unless ``--keep-openblas-env``. The CPU model, core count and load average are printed: the
figures mean something only on a quiet machine. onnxruntime and torch are benchmark-only
dependencies.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
MODEL = "bert_tiny_b1"


def _model_path(cache: Path) -> Path:
    """The BERT-tiny-sized b1 encoder and its feeds in ``cache`` (built once)."""
    sys.path.insert(0, str(HERE))
    from models import _encoder

    cache.mkdir(parents=True, exist_ok=True)
    onnx_path, npz = cache / f"{MODEL}.onnx", cache / f"{MODEL}.npz"
    if not onnx_path.exists() or not npz.exists():
        data, feeds = _encoder(2, 128, 2, 512, 128, 1)
        np.savez(npz, **feeds)
        onnx_path.write_bytes(data)
    return onnx_path


def _session(runtime: str, path: Path, threads: int):
    if runtime == "onnxruntime":
        import onnxruntime as ort

        so = ort.SessionOptions()
        if threads:
            so.intra_op_num_threads = threads
        return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    import runtime_core as rt

    so = rt.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    return rt.InferenceSession(str(path), so, providers=["cpu"])


def _loop_size(seconds: float) -> int:
    """n such that ``sum(range(n))`` (a fixed CPU loop: one thread, no memory traffic, no runtime)
    takes ``seconds`` uninterrupted: the best of 7 calls, which busy processes may lengthen by
    preempting them but not shorten."""
    n = 1 << 12
    while True:
        best = min(_timed(sum, range(n)) for _ in range(3))
        if best > 2e-4:
            break
        n <<= 1
    n = max(1, int(n * seconds / best))
    return max(1, int(n * seconds / min(_timed(sum, range(n)) for _ in range(7))))


def _floor(args) -> None:
    """The scheduler's floor: a fixed CPU loop of about ``--floor-ms``, timed in turn for
    ``--seconds`` like the runs; prints one JSON line."""
    n = _loop_size(args.floor_ms / 1e3)
    lat = []
    end = time.perf_counter() + args.seconds
    while time.perf_counter() < end or len(lat) < args.min_runs:
        lat.append(_timed(sum, range(n)))
        if args.gap_ms:
            time.sleep(args.gap_ms / 1e3)
    print(json.dumps(_stats(lat)))


def _warm(sess, feeds) -> list:
    """Warm-up runs (the autotuner's first-run measurements among them): 20, or as many as fit
    in 3 s but at least 3 (a corpus model of ~1 s a run); their times."""
    times: list = []
    t_end = time.perf_counter() + 3.0
    while len(times) < 20 and (len(times) < 3 or time.perf_counter() < t_end):
        times.append(_timed(sess.run, None, feeds))
    return times


def _timed(fn, *a) -> float:
    t0 = time.perf_counter()
    fn(*a)
    return time.perf_counter() - t0


def worker(args) -> None:
    """One measurement in this (fresh) process; prints one JSON line."""
    import threading

    if args.worker == "floor":
        _floor(args)
        return
    path = Path(args.model)
    feeds = dict(np.load(path.with_suffix(".npz")))
    if args.worker == "latency" and args.paired:
        _paired(args, path, feeds)
        return
    sess = _session(args.runtime, path, args.threads)
    _warm(sess, feeds)
    if args.worker == "throughput":
        n = int(args.clients)
        per = max(1, args.runs // n)

        def client():
            for _ in range(per):
                sess.run(None, feeds)

        ts = [threading.Thread(target=client) for _ in range(n)]
        c0, t0 = time.process_time(), time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        # CPU time (all threads) tells spinning and oversubscription apart from a busy machine
        print(json.dumps({"wall": wall, "cpu": cpu, "runs": n * per}))
    else:
        native = _native() if args.runtime == "runtime_core" else None
        before = _pool_counts(native)
        lat = []
        end = time.perf_counter() + args.seconds
        while time.perf_counter() < end or len(lat) < args.min_runs:
            t0 = time.perf_counter()
            sess.run(None, feeds)
            lat.append(time.perf_counter() - t0)
            if args.gap_ms:
                time.sleep(args.gap_ms / 1e3)
        # the kernel pool's stalls (a caller left waiting on a descheduled worker's part), jobs no
        # worker joined and jobs run alone for the load, a run
        delta = _pool_counts(native) - before if before is not None else None
        print(json.dumps(dict(_stats(lat), **_pool_fields(delta, len(lat)))))


def _stats(lat: list) -> dict:
    ms = np.asarray(lat) * 1e3
    return {"n": len(lat), "p10": float(np.percentile(ms, 10)), "p50": float(np.median(ms)),
            "p90": float(np.percentile(ms, 90))}


def _paired(args, path: Path, feeds: dict) -> None:
    """--paired: sessions at the default thread count and at one thread in this process, runs
    alternating in blocks of --block, so that both see the same background load; with
    --pool-load-ab a third series "0-off", the default thread count with the kernel pool's load
    rule off (``_native.pool_load_rule``); unless --no-floor a series "loop", the scheduler's floor
    in the same window: a fixed CPU loop (``_loop_size``) as long as the default session's
    uninterrupted run (its best warm-up run); prints one JSON line {"0": stats, "1": stats, ...}."""
    native = _native() if args.runtime == "runtime_core" else None
    series = [("0", 0, None), ("1", 1, None)]
    if args.pool_load_ab and native is not None:
        series.append(("0-off", 0, False))
    sessions = {key: _session(args.runtime, path, t) for key, t, _ in series}
    for s in sessions.values():
        warm = _warm(s, feeds)
        if s is sessions["0"]:
            ref = min(warm)
    calls = {key: (s.run, (None, feeds)) for key, s in sessions.items()}
    if args.floor:
        n = _loop_size(ref)
        series.append(("loop", None, None))
        calls["loop"] = (sum, (range(n),))
    lat: dict = {key: [] for key in calls}
    pool: dict = {key: np.zeros(6) for key in calls}
    end = time.perf_counter() + args.seconds
    while time.perf_counter() < end or min(len(v) for v in lat.values()) < args.min_runs:
        for key, _, rule in series:
            fn, fargs = calls[key]
            before_rule = native.pool_load_rule(rule) if rule is not None else None
            before = _pool_counts(native)
            for _ in range(args.block):
                lat[key].append(_timed(fn, *fargs))
                if args.gap_ms:
                    time.sleep(args.gap_ms / 1e3)
            if before is not None:
                pool[key] += _pool_counts(native) - before
            if before_rule is not None:
                native.pool_load_rule(*before_rule)
    out = {}
    for key, v in lat.items():
        out[key] = _stats(v) if key == "loop" else dict(
            _stats(v), **_pool_fields(pool[key] if native is not None else None, len(v)))
    print(json.dumps(out))


def _native():
    try:
        from runtime_provider_cpu.fast.policy import NATIVE
    except ImportError:
        return None
    return NATIVE


def _pool_counts(native):
    """(stalls, jobs opened to workers, jobs no worker joined, their ns, callers' waits ns, jobs
    run alone for the load) so far, or None without the extension (or an older one)."""
    st = native.pool_stats() if native is not None else ()
    return np.asarray(st[5:11], float) if len(st) >= 11 else None


def _pool_fields(delta, runs: int) -> dict:
    """The kernel pool's counts a run: stalls, jobs no worker joined of those opened to workers,
    the callers' waits on workers (ms), jobs run alone for the machine's load."""
    if delta is None:
        return {"stalls": None}
    return {"stalls": delta[0] / runs, "jobs": delta[1] / runs, "unjoined": delta[2] / runs,
            "wait_ms": delta[4] / runs / 1e6, "load_alone": delta[5] / runs}


def _child(env, model, *extra) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--model", str(model), *map(str, extra)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _machine() -> str:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    return f"{model}, {cores} cores available, load average {load[0]:.1f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=["throughput", "latency", "all"], default="all")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", default="1,2,4,8,16")
    ap.add_argument("--runs", type=int, default=400, help="runs per throughput measurement, over all clients")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of one latency measurement")
    ap.add_argument("--busy", type=int, default=2, help="busy background processes during the latency part")
    ap.add_argument("--models", nargs="*", help="latency part: these models instead of the BERT-tiny encoder")
    ap.add_argument("--latency-runtimes", default="runtime_core,onnxruntime")
    ap.add_argument("--min-runs", type=int, default=10, help="latency part: at least this many runs")
    ap.add_argument("--paired", action="store_true",
                    help="latency part: both thread settings in one process, runs alternating in blocks of --block "
                    "(both see the same background load: on a shared machine the load drifts between processes)")
    ap.add_argument("--block", type=int, default=5, help="--paired: runs a block")
    ap.add_argument("--pool-load-ab", action="store_true",
                    help="--paired: a third series, the default thread count with the kernel pool's load rule off "
                    "(a job on its caller alone while other processes' runnable threads fill the cores)")
    ap.add_argument("--no-floor", dest="floor", action="store_false",
                    help="latency part: leave out the no-runtime series (a fixed CPU loop of the run's length)")
    ap.add_argument("--gap-ms", type=float, default=0.0,
                    help="latency part: an untimed pause after each run (a server idle between requests)")
    ap.add_argument("--keep-openblas-env", action="store_true")
    ap.add_argument("--cache", default=os.environ.get("RUNTIME_CORE_BENCH_CACHE",
                                                      str(Path.home() / ".cache" / "runtime-core-bench")))
    # internal: one measurement in a child process
    ap.add_argument("--worker", choices=["throughput", "latency", "floor"])
    ap.add_argument("--floor-ms", type=float, default=1.0)
    ap.add_argument("--runtime", default="runtime_core")
    ap.add_argument("--model")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    env = dict(os.environ)
    if not args.keep_openblas_env:
        env.pop("OPENBLAS_CORETYPE", None)
        env.pop("OPENBLAS_L2_SIZE", None)
    model = _model_path(Path(args.cache))
    runtimes = ("runtime_core", "onnxruntime")
    print(f"# {_machine()}; OPENBLAS_* overrides {'kept' if args.keep_openblas_env else 'removed'}; "
          f"median of {args.rounds} alternating rounds, each runtime in a fresh process")
    if args.part in ("throughput", "all"):
        clients = [int(c) for c in args.clients.split(",")]
        print(f"\n## throughput: {MODEL}, one session, {args.runs} runs over N client threads (runs/s)\n")
        print("| clients | runtime-core | onnxruntime | wall ratio (ours / ort) | CPU ms a run: ours, ort |")
        print("|---|---|---|---|---|")
        for n in clients:
            rates: dict = {r: [] for r in runtimes}
            cpus: dict = {r: [] for r in runtimes}
            ratios = []
            for _ in range(args.rounds):
                walls = {}
                for r in runtimes:
                    got = _child(env, model, "--worker", "throughput", "--runtime", r, "--threads", 0,
                                 "--clients", n, "--runs", args.runs)
                    walls[r] = got["wall"] / got["runs"]
                    rates[r].append(got["runs"] / got["wall"])
                    cpus[r].append(got["cpu"] / got["runs"] * 1e3)
                ratios.append(walls["runtime_core"] / walls["onnxruntime"])
            print(f"| {n} | {np.median(rates['runtime_core']):.0f} | {np.median(rates['onnxruntime']):.0f} | "
                  f"{np.median(ratios):.2f} | {np.median(cpus['runtime_core']):.2f}, "
                  f"{np.median(cpus['onnxruntime']):.2f} |", flush=True)
    if args.part in ("latency", "all"):
        lat_models = [Path(m) for m in args.models] if args.models else [model]
        lat_runtimes = tuple(args.latency_runtimes.split(","))
        gap = ("--gap-ms", args.gap_ms) if args.gap_ms else ()
        paired = ("--paired", "--block", args.block, *gap, *(() if args.floor else ("--no-floor",))) \
            if args.paired else ()
        if args.paired and args.pool_load_ab:
            paired += ("--pool-load-ab",)
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
        try:
            for m in lat_models:
                name = MODEL if m == model else m.stem
                pause = f", {args.gap_ms:g} ms untimed pause after each" if args.gap_ms else ""
                print(f"\n## latency: {name}, runs in turn for {args.seconds:.0f} s (at least {args.min_runs}{pause}) "
                      f"beside {args.busy} busy processes (ms)\n")
                print("| runtime | intra_op_num_threads | p10 | p50 | p90 | pool stalls a run | "
                      "pool jobs a run: opened, no worker joined, alone for the load |")
                print("|---|---|---|---|---|---|---|", flush=True)
                res: dict = {}
                for _ in range(args.rounds):
                    for r in lat_runtimes:
                        if args.paired:
                            got = _child(env, m, "--worker", "latency", "--runtime", r, "--seconds", args.seconds,
                                         "--min-runs", args.min_runs, *paired)
                            for key, v in got.items():
                                res.setdefault((r, int(key) if key.isdigit() else key), []).append(v)
                            continue
                        for t in (0, 1):
                            got = _child(env, m, "--worker", "latency", "--runtime", r, "--threads", t,
                                         "--seconds", args.seconds, "--min-runs", args.min_runs, *gap)
                            res.setdefault((r, t), []).append(got)
                    if args.floor and not args.paired:
                        # as long as this round's default-thread run (runtime-core's, else the first runtime's)
                        ref = res.get(("runtime_core", 0)) or next(iter(res.values()))
                        got = _child(env, m, "--worker", "floor", "--floor-ms", ref[-1]["p50"],
                                     "--seconds", args.seconds, "--min-runs", args.min_runs, *gap)
                        res.setdefault(("no runtime: a fixed CPU loop", "-"), []).append(got)
                med = {key: {k: np.median([g[k] for g in got]) for k in ("p10", "p50", "p90")}
                       for key, got in res.items()}
                for (r, t), v in med.items():
                    st = [g["stalls"] for g in res[(r, t)] if g.get("stalls") is not None]
                    stalls = f"{np.median(st):.2f}" if st else "-"
                    jobs = "-"
                    if all(g.get("jobs") is not None for g in res[(r, t)]):
                        jobs = ", ".join(f"{np.median([g[k] for g in res[(r, t)]]):.0f}"
                                         for k in ("jobs", "unjoined", "load_alone"))
                    label = {0: "default", "0-off": "default, pool load rule off",
                             "loop": "none: a fixed CPU loop as long as a default run, same process"}.get(t, t)
                    print(f"| {r} | {label} | {v['p10']:.2f} | {v['p50']:.2f} | {v['p90']:.2f} | {stalls} | {jobs} |")
                if ("runtime_core", 0) in med:
                    d, one = med[("runtime_core", 0)], med[("runtime_core", 1)]
                    ok = d["p50"] <= one["p50"] * 1.05 and d["p90"] <= 3 * d["p50"]
                    rounds = [a["p50"] / b["p50"] for a, b in zip(res[("runtime_core", 0)], res[("runtime_core", 1)])]
                    print(f"\nruntime-core default / one thread p50 a round: {' '.join(f'{x:.2f}' for x in rounds)}")
                    print(f"runtime-core default / one thread p50: {d['p50'] / one['p50']:.2f}; default p90 / p50: "
                          f"{d['p90'] / d['p50']:.2f} ({'meets' if ok else 'MISSES'} the targets <= 1 (5% noise "
                          "allowed) and <= 3)", flush=True)
                fl = med.get(("runtime_core", "loop")) or med.get(("no runtime: a fixed CPU loop", "-"))
                if fl:
                    print(f"the scheduler's floor (a fixed CPU loop of that length, no runtime): p90 / p50 "
                          f"{fl['p90'] / fl['p50']:.2f}", flush=True)
                if ("runtime_core", "0-off") in res:
                    off = res[("runtime_core", "0-off")]
                    pairs = [(a["p50"] / b["p50"], c["p50"] / b["p50"])
                             for a, b, c in zip(res[("runtime_core", 0)], res[("runtime_core", 1)], off)]
                    print("runtime-core default / one thread p50 a round, load rule on (off): "
                          + " ".join(f"{a:.2f} ({c:.2f})" for a, c in pairs), flush=True)
        finally:
            for p in busy:
                p.kill()
                p.wait()
    print(f"\n# after: {_machine()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
