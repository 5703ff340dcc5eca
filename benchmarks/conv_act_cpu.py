"""``_native.conv2d`` with FusedConv's activation in its epilogue (``act``) against the
convolution followed by ``_native.activate``'s pass over its output (how the direct plan ran
before), one image, the kernels on one thread: this thread's CPU time, the minimum of 3 batches
of 10 calls a round, the two alternating, and the ratio of each round. The shapes are
MobileNetV3's (HardSwish) and EfficientNet-B0's (SiLU) stems and two narrow outputs of the lane
tiling. ``--old PATH``: the "before" side calls that build of the extension (a ``_native*.so``
built from an older commit), so the epilogue's other changes are measured too. Run (the AVX-512
build):

    python benchmarks/conv_act_cpu.py [--old /path/to/old/_native.cpython-311-x86_64-linux-gnu.so]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

import numpy as np

HARDSWISH, SILU = (0, 1 / 6, 0.5), (3, 1 / 6, 0.5)
#: (M, C, H, kernel, stride, activation, lanes)
SHAPES = [(16, 3, 224, 3, 2, HARDSWISH, False), (32, 3, 224, 3, 2, SILU, False),
          (64, 64, 14, 3, 1, SILU, True), (40, 256, 7, 3, 1, HARDSWISH, True)]


def _load(path):
    spec = importlib.util.spec_from_file_location("old_build._native", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cpu_us(fn, n=10, batches=3):
    best = float("inf")
    for _ in range(batches):
        t0 = time.thread_time_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.thread_time_ns() - t0) / n / 1e3)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", help="the extension build the 'before' side calls")
    ap.add_argument("--rounds", type=int, default=9)
    a = ap.parse_args()
    from runtime_provider_cpu import _native as nv
    from runtime_provider_cpu.fast.packing import pack_direct, pack_lanes

    old = _load(a.old) if a.old else nv
    rng = np.random.default_rng(0)
    for M, C, H, k, s, act, lanes in SHAPES:
        x = rng.standard_normal((1, C, H, H)).astype(np.float32)
        w = rng.standard_normal((M, C, k, k)).astype(np.float32) * 0.3
        b = rng.standard_normal(M).astype(np.float32)
        wp = pack_lanes(w) if lanes else pack_direct(w)
        o = (H + 2 - k) // s + 1
        args = ((1, C, H, H), (M, k, k), (s, s), (1, 1), (1, 1), (o, o), -np.inf, np.inf, 1, lanes)

        def before():
            y = np.empty((1, M, o, o), np.float32)
            old.conv2d(x, wp, b, None, y, *args)
            old.activate(y, y, y.size, *act)
            return y

        def after():
            y = np.empty((1, M, o, o), np.float32)
            nv.conv2d(x, wp, b, None, y, *args, None, act)
            return y

        assert np.array_equal(before(), after())
        ratios = [_cpu_us(after) / _cpu_us(before) for _ in range(a.rounds)]
        print(f"{C}->{M} at {H}x{H}, {k}x{k} stride {s}, act {act[0]}, lanes {lanes}: epilogue / pass after "
              f"{statistics.median(ratios):.2f} ({' '.join(f'{r:.2f}' for r in ratios)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
