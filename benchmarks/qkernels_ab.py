"""MobileNetV2's int8 convolution kernels called directly on two builds of the compiled extension
in one process: depthwise ``qdwconv``, the stem's ``qim2col_rows`` + ``qconv_nchw`` and pointwise
``qconv_nchw`` on random bytes of the model's shapes. Pairs of 5 calls alternate between the builds
(41 pairs); the outputs are checked equal; each line gives both minima and the median of the
per-pair time ratios (this build / the other)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/qkernels_ab.py \\
        --other /work/main/providers/cpu/runtime_provider_cpu/_native.cpython-311-x86_64-linux-gnu.so [--threads 1]
"""

from __future__ import annotations

import argparse
import importlib.util
import time

import numpy as np

import runtime_provider_cpu._native as THIS


def _load(path):
    spec = importlib.util.spec_from_file_location("other._native", path)  # init name: the last part
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _dw(nat, rng, thr, C, H, s):
    x = rng.integers(0, 255, (1, C, H, H), dtype=np.uint8)
    w = rng.integers(-127, 127, (C, 1, 3, 3), dtype=np.int8)
    mult, bias = rng.random(C).astype(np.float32) * 0.01, rng.integers(-5000, 5000, C).astype(np.int32)
    oh = (H + 2 - 3) // s + 1
    y = np.empty((1, C, oh, oh), np.uint8)
    args = (x, False, 7, w, True, None, bias, mult, y, False, 3, x.shape, (3, 3), (oh, oh), (s, s), (1, 1), (1, 1), thr)
    return (lambda: nat.qdwconv(*args)), y


def _stem(nat, rng, thr):
    x = rng.integers(0, 255, (1, 3, 224, 224), dtype=np.uint8)
    w = rng.integers(-127, 127, (32, 27), dtype=np.int8)
    mult, bias = rng.random(32).astype(np.float32) * 0.001, rng.integers(-5000, 5000, 32).astype(np.int32)
    rows, y = np.empty((1, 27, 112 * 112), np.uint8), np.empty((1, 32, 112, 112), np.uint8)

    def f():
        nat.qim2col_rows(x, rows, x.shape, (3, 3), (112, 112), (2, 2), (1, 1), (1, 1), 7, thr)
        nat.qconv_nchw(rows, False, 7, w, True, None, y, (1, 32, 27, 112 * 112), mult, bias, False, 3, thr)

    return f, y


def _pw(nat, rng, thr, C, M, H):
    x = rng.integers(0, 255, (1, C, H * H), dtype=np.uint8)
    w = rng.integers(-127, 127, (M, C), dtype=np.int8)
    mult, bias = rng.random(M).astype(np.float32) * 0.001, rng.integers(-5000, 5000, M).astype(np.int32)
    y = np.empty((1, M, H * H), np.uint8)
    return (lambda: nat.qconv_nchw(x, False, 7, w, True, None, y, (1, M, C, H * H), mult, bias, False, 3, thr)), y


CASES = [("dw 32x112 s1", _dw, (32, 112, 1)), ("dw 96x112 s2", _dw, (96, 112, 2)), ("dw 144x56 s1", _dw, (144, 56, 1)),
         ("dw 144x56 s2", _dw, (144, 56, 2)), ("dw 192x28 s1", _dw, (192, 28, 1)), ("dw 384x14 s1", _dw, (384, 14, 1)),
         ("dw 576x14 s2", _dw, (576, 14, 2)), ("dw 960x7 s1", _dw, (960, 7, 1)), ("stem 3->32 s2", _stem, ()),
         ("pw 16->96 112", _pw, (16, 96, 112)), ("pw 32->16 112", _pw, (32, 16, 112)),
         ("pw 24->144 56", _pw, (24, 144, 56)), ("pw 96->576 14", _pw, (96, 576, 14))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("::")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--other", required=True, help="the other build's _native*.so")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=41)
    args = ap.parse_args()
    other = _load(args.other)
    for name, make, shape in CASES:
        fa, ya = make(other, np.random.default_rng(0), args.threads, *shape)
        fb, yb = make(THIS, np.random.default_rng(0), args.threads, *shape)
        fa(), fb()
        if not np.array_equal(ya, yb):
            raise SystemExit(f"{name}: the two builds' outputs differ")
        ta, tb, ratios = [], [], []
        for _ in range(args.pairs):
            t0 = time.perf_counter()
            for _ in range(5):
                fa()
            t1 = time.perf_counter()
            for _ in range(5):
                fb()
            t2 = time.perf_counter()
            ta.append((t1 - t0) / 5)
            tb.append((t2 - t1) / 5)
            ratios.append((t2 - t1) / (t1 - t0))
        print(f"{name:15s} other min {min(ta) * 1e6:7.1f} us  this min {min(tb) * 1e6:7.1f} us  "
              f"median pair ratio {np.median(ratios):.3f}")


if __name__ == "__main__":
    main()
