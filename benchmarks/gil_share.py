"""How much of a run holds the GIL: the time concurrent clients of one session cannot share.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/gil_share.py MODEL.onnx \\
        [--threads 1] [--seconds 10] [--top 20]

A loop of ``sess.run`` on one session (feeds from MODEL.npz beside the model, else random) is
sampled twice by py-spy (a benchmark-only tool: ``pip install py-spy``), each time in a fresh
process: ``record --gil`` (only the thread holding the GIL) and a plain ``record``. The share is
the GIL-held samples over all samples inside ``run``; "GIL us a run" is the GIL-held samples over
the rate and the runs done. A loaded machine inflates both (a holder that loses its core keeps
the GIL): compare builds in the same minutes. Also prints the lines that held the GIL most.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile

RATE = 2000  # samples a second
LOOP_LINE = "gil_share_loop"


def loop(model: str, threads: int, seconds: float) -> None:
    """The sampled child: warm runs, then runs for ``seconds``; prints how many."""
    import time

    import runtime_core as rt
    from step_times import _feeds  # this folder is the child's sys.path[0]

    so = rt.SessionOptions()
    so.intra_op_num_threads = threads
    sess = rt.InferenceSession(model, so, providers=["cpu"])
    feeds = _feeds(sess, model)  # MODEL.npz beside the model, else random
    for _ in range(20):
        sess.run(None, feeds)
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        gil_share_loop(sess, feeds)
        n += 1
    print(n)


def gil_share_loop(sess, feeds):  # the frame that marks a run in the samples
    sess.run(None, feeds)


def _samples(path: str):
    """(samples inside a run, per leaf frame) from py-spy's raw (collapsed-stack) output."""
    total, leaves = 0, collections.Counter()
    with open(path, encoding="utf-8") as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            if LOOP_LINE not in stack:
                continue
            total += int(count)
            leaves[stack.split(";")[-1]] += int(count)
    return total, leaves


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--loop", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.loop:
        loop(args.model, args.threads, args.seconds)
        return 0
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        sys.exit("gil_share: py-spy is not installed (pip install py-spy)")
    child = [sys.executable, os.path.abspath(__file__), args.model, "--loop", "--threads", str(args.threads),
             "--seconds", str(args.seconds)]
    got = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("gil", "all"):
            out = os.path.join(tmp, f"{kind}.txt")
            cmd = [spy, "record", "-r", str(RATE), "-f", "raw", "-o", out, *(["--gil"] if kind == "gil" else []),
                   "--", *child]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0 or not os.path.exists(out):
                sys.exit(f"gil_share: {' '.join(cmd)} failed:\n{res.stderr[-2000:]}")
            counts = [ln for ln in res.stdout.splitlines() if ln.strip().isdigit()]  # py-spy talks there too
            runs = int(counts[-1]) if counts else 0
            got[kind] = (*_samples(out), runs)
    gil, leaves, gil_runs = got["gil"]
    every, _, _ = got["all"]
    if not every or not gil_runs:
        sys.exit("gil_share: no samples inside run (py-spy needs ptrace permission)")
    print(f"{os.path.basename(args.model)}, intra_op {args.threads}, load {os.getloadavg()[0]:.1f}: "
          f"GIL held {gil / every:.3f} of a run's samples, {gil / RATE / gil_runs * 1e6:.0f} us a run "
          f"({gil_runs} runs in the GIL profile)")
    for leaf, c in leaves.most_common(args.top):
        print(f"{100.0 * c / gil:5.1f}%  {leaf[:140]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
