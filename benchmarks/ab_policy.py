"""In-process A/B of one CPU policy switch on a whole model: two sessions of the same model in
this process, one made (its first run: plans, pairs and measured choices) with a boolean field
of ``runtime_provider_cpu.fast.policy.Policy`` turned off, the other with the default policy;
then alternating rounds (the order flips each round) of ``--runs`` timed runs each. Prints
each round's medians and the ratio on / off, the median of those ratios and the largest
difference between the two sessions' outputs. Run (feeds: ``MODEL.npz`` beside the model if
present, else random):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/ab_policy.py MODEL.onnx expand_dw

On a shared machine give several rounds and report them with the load average: a round is
only as good as the moment it ran in.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np


def feeds_for(sess, path):
    npz = os.path.splitext(path)[0] + ".npz"
    if os.path.exists(npz):
        return dict(np.load(npz))
    rng = np.random.default_rng(0)
    return {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape]).astype(np.float32)
            for i in sess.get_inputs()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("field", help="a boolean Policy field, off in the B session (expand_dw, conv_maxpool, ...)")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)

    import runtime_core as rt
    from runtime_provider_cpu.fast import policy

    if not isinstance(getattr(policy.current(), a.field, None), bool):
        p.error(f"{a.field!r} is not a boolean field of the CPU policy")
    so = rt.SessionOptions()
    so.intra_op_num_threads = a.threads
    on = rt.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])
    feeds = feeds_for(on, a.model)
    y_on = on.run(None, feeds)[0]
    off = rt.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])
    with policy.installed(**{a.field: False}):
        y_off = off.run(None, feeds)[0]

    def timed(sess):
        ts = []
        for _ in range(a.runs):
            t0 = time.perf_counter()
            sess.run(None, feeds)
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts) * 1e3

    ratios = []
    for r in range(a.rounds):
        if r % 2:
            t_off, t_on = timed(off), timed(on)
        else:
            t_on, t_off = timed(on), timed(off)
        ratios.append(t_on / t_off)
        print(f"round {r + 1}: {a.field} on {t_on:.2f} ms, off {t_off:.2f} ms, ratio {ratios[-1]:.3f}")
    print(f"median ratio on / off: {statistics.median(ratios):.3f}; "
          f"max |on - off| {float(np.abs(y_on - y_off).max()):.3g}; load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
