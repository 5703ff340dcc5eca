"""RunOptions.terminate on real models: the time from setting the flag (from another thread, at
a random point of a run) to ``run`` raising ``RunTerminatedError``.

    python benchmarks/cancellation.py [--trials 20] [--threads 2] MODEL.onnx ...

Each model's feeds come from ``MODEL.npz`` next to it (the corpus cache has them). Prints,
per model, the run's length, how many trials were still running at the flag, and the
latency's median and maximum (issue 28's figure: within 100 ms), and checks that the session
still gives the same outputs afterwards.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from pathlib import Path

import numpy as np

import runtime_core as rt
from runtime_core.errors import RunTerminatedError


def cancel_at(sess, feeds, delay: float) -> float | None:
    """Seconds from the flag to the error, or None when the run ended before the flag."""
    opts = rt.RunOptions()
    flagged: list[float] = []

    def flag():
        time.sleep(delay)
        flagged.append(time.perf_counter())
        opts.terminate = True

    t = threading.Thread(target=flag)
    t.start()
    try:
        sess.run(None, feeds, opts)
    except RunTerminatedError:
        t.join()
        return time.perf_counter() - flagged[0]
    t.join()
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=28)
    a = ap.parse_args(argv)
    rnd = random.Random(a.seed)
    worst = 0.0
    for m in a.models:
        p = Path(m)
        feeds = dict(np.load(p.with_suffix(".npz")))
        so = rt.SessionOptions()
        so.intra_op_num_threads = a.threads
        sess = rt.InferenceSession(str(p), so, providers=["cpu"])
        want = sess.run(None, feeds)
        t0 = time.perf_counter()
        sess.run(None, feeds)
        full = time.perf_counter() - t0
        lat = []
        for _ in range(a.trials):
            got = cancel_at(sess, feeds, rnd.uniform(0.05, 0.8) * full)
            if got is not None:
                lat.append(got)
        after = sess.run(None, feeds)
        same = all(np.allclose(x, y, rtol=1e-4, atol=1e-5) for x, y in zip(want, after))
        worst = max([worst, *lat])
        print(f"{p.stem}: run {full * 1e3:.0f} ms; {len(lat)}/{a.trials} stopped; latency median "
              f"{np.median(lat) * 1e3:.1f} ms, max {max(lat) * 1e3:.1f} ms; outputs afterwards "
              f"{'unchanged' if same else 'DIFFERENT'}" if lat else f"{p.stem}: no trial stopped", flush=True)
    return 0 if worst < 0.1 else 1


if __name__ == "__main__":
    sys.exit(main())
