"""Where a CPU run's time goes between and around the kernels: the wall time of whole runs
against the sum of their steps' times (the executor's and Python's share), each step's time and
the kernel-pool jobs it opens (``_native.pool_stats()``), at each thread count given, every count
in a fresh process of its own and the counts alternating round by round. The steps are the
executable's plain sequential ones (pairs fused after the first run, bound convolutions), each
timed around ``run_step`` in model order, so a step sees the caches its predecessors left.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/step_times.py MODEL.onnx \\
        [--threads 1 2] [--rounds 3] [--runs 40] [--load-rule off|on|full] [--top 25]

Feeds come from MODEL.npz beside the model (the corpus cache's), else random. With the load rule
off (the default here) the pool's jobs are opened to workers whatever the machine's load, as on a
quiet host; its results are only meaningful on one. ``full`` has the rule find the cores taken by
other processes, so that every job runs on its caller alone as beside busy processes, on a quiet
machine: what a run at the default thread count costs there against one at one thread."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _feeds(sess, model):
    import numpy as np

    npz = os.path.splitext(model)[0] + ".npz"
    if os.path.exists(npz):
        d = dict(np.load(npz))
        vals = list(d.values())
        return {i.name: d.get(i.name, vals[k]) for k, i in enumerate(sess.get_inputs())}
    rng = np.random.default_rng(0)
    return {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape]).astype(np.float32)
            for i in sess.get_inputs()}


def measure(model: str, threads: int, runs: int, load_rule: str) -> dict:
    """One process's figures: median wall of ``runs`` runs, the median of the per-run step sums,
    and per step its median time and its pool jobs a run."""
    import gc

    import numpy as np

    import runtime_core as rt
    from runtime_provider_cpu import _native as nat
    from runtime_provider_cpu.execution import step as S
    from runtime_provider_cpu.execution.executable import CPUExecutable

    if load_rule == "full":  # other processes' runnable threads: one a core
        nat.pool_load_rule(True, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    else:
        nat.pool_load_rule(load_rule == "on")
    so = rt.SessionOptions()
    so.intra_op_num_threads = threads
    sess = rt.InferenceSession(model, so)
    feeds = _feeds(sess, model)
    for _ in range(10):
        sess.run(None, feeds)
    exes = [o for o in gc.get_objects() if isinstance(o, CPUExecutable) and o.partition.nodes]
    exe = max(exes, key=lambda e: len(e.run_steps))
    steps = exe.run_steps
    per = [[] for _ in steps]
    jobs = [0] * len(steps)
    walls, sums = [], []
    for _ in range(runs):  # a whole run and a stepped one in turn, so both see the same moments
        t = time.perf_counter_ns()
        sess.run(None, feeds)
        walls.append(time.perf_counter_ns() - t)
        slots = list(exe.template)
        for s, v in zip(exe.input_slots, [feeds[n] for n in exe.partition.inputs]):
            slots[s] = v
        scope = S.run_scope(None)
        total = 0
        with np.errstate(all="ignore"):
            for i, st in enumerate(steps):
                j0 = nat.pool_stats()[6]
                t0 = time.perf_counter_ns()
                S.run_step(st, slots, False)
                dt = time.perf_counter_ns() - t0
                jobs[i] += nat.pool_stats()[6] - j0
                per[i].append(dt)
                total += dt
                for s in st[5]:
                    slots[s] = None
        S.end_scope(scope)
        del slots
        sums.append(total)
    names = [f"{st[1].node.op_type} {st[1].node.name}" for st in steps]
    return {"threads": threads, "wall_us": statistics.median(walls) / 1e3,
            "steps_us": statistics.median(sums) / 1e3, "load": os.getloadavg()[0],
            "steps": [(n, statistics.median(p) / 1e3, j / runs) for n, p, j in zip(names, per, jobs)]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--load-rule", choices=["off", "on", "full"], default="off")
    ap.add_argument("--top", type=int, default=25, help="steps listed, the slowest at the first thread count")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(measure(a.model, a.threads[0], a.runs, a.load_rule)))
        return 0
    results: dict[int, list] = {t: [] for t in a.threads}
    for r in range(a.rounds):
        order = a.threads if r % 2 == 0 else list(reversed(a.threads))
        for t in order:
            out = subprocess.run([sys.executable, __file__, a.model, "--child", "--threads", str(t), "--runs",
                                  str(a.runs), "--load-rule", a.load_rule], check=True, capture_output=True, text=True)
            res = json.loads(out.stdout.strip().splitlines()[-1])
            results[t].append(res)
            print(f"round {r + 1} threads {t}: wall {res['wall_us']:.0f} us, steps {res['steps_us']:.0f} us, "
                  f"outside {res['wall_us'] - res['steps_us']:.0f} us, load {res['load']:.2f}")
    # steps by name (a process's fusions are its autotune's choices, so step lists may differ)
    med: dict[int, dict[str, tuple[float, float]]] = {}
    for t in a.threads:
        by: dict[str, list] = {}
        for rr in results[t]:
            for name, us, jobs in rr["steps"]:
                by.setdefault(name, []).append((us, jobs))
        med[t] = {n: (statistics.median(u for u, _ in v), statistics.median(j for _, j in v)) for n, v in by.items()}
    first = a.threads[0]
    names = sorted(med[first], key=lambda n: -med[first][n][0])[:a.top]
    print("step".ljust(60) + "".join(f"{t} thr: us  jobs".rjust(18) for t in a.threads))
    for n in names:
        row = n[:60].ljust(60)
        for t in a.threads:
            us, jobs = med[t].get(n, (float("nan"), float("nan")))
            row += f"{us:12.1f} {jobs:5.1f}"
        print(row)
    for t in a.threads:
        print(f"threads {t}: steps summed {sum(u for u, _ in med[t].values()):.0f} us, "
              f"jobs a run {sum(j for _, j in med[t].values()):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
