"""``_native.expand_dw`` (an inverted-residual block's expansion and depthwise convolution in one
call) against its two steps (``pointwise_lanes`` into a whole expanded tensor, then
``depthwise2d``), one image, the kernels on one thread: this thread's CPU time, the minimum of
15 alternating calls, so a shared machine's load moves the figures less than wall time. The
shapes are MobileNetV3's and EfficientNet-B0's blocks. Run (the AVX-512 build):

    python benchmarks/expand_dw_cpu.py
"""

from __future__ import annotations

import time

import numpy as np

SILU, HARDSWISH, NONE = (3, 1 / 6, 0.5), (0, 1 / 6, 0.5), (-1, 1 / 6, 0.5)
SHAPES = [(16, 64, 112, 3, 2, NONE), (16, 96, 112, 3, 2, SILU), (24, 144, 56, 3, 1, SILU), (24, 144, 56, 5, 2, SILU),
          (24, 72, 56, 3, 1, NONE), (40, 240, 28, 5, 1, SILU), (80, 480, 14, 3, 1, HARDSWISH),
          (112, 672, 14, 5, 1, HARDSWISH), (192, 1152, 7, 5, 1, SILU)]


def main() -> int:
    from runtime_provider_cpu import _native as nv
    from runtime_provider_cpu.fast.packing import pack_rows

    rng = np.random.default_rng(0)
    inf = np.inf
    for C, M, H, k, s, act in SHAPES:
        P, p = H * H, k // 2
        OH = (H + 2 * p - k) // s + 1
        x = rng.standard_normal((C, H, H)).astype(np.float32)
        w12 = pack_rows(rng.standard_normal((M, C)).astype(np.float32) * 0.3)
        b, bd = rng.standard_normal(M).astype(np.float32), rng.standard_normal(M).astype(np.float32)
        wd = rng.standard_normal((M, 1, k, k)).astype(np.float32)

        def apart():
            e = np.empty((M, H, H), np.float32)
            nv.pointwise_lanes(w12, x, b, None, e, (M, C, P), -inf, inf, 1, *act)
            y = np.empty((M, OH, OH), np.float32)
            nv.depthwise2d(e, wd, bd, y, (1, M, H, H), (OH, OH), (k, k), (s, s), (1, 1), (p, p), -inf, inf, 1, True,
                           False, *act)
            return y

        def fused():
            y = np.empty((M, OH, OH), np.float32)
            nv.expand_dw(w12, x, b, -inf, inf, wd, bd, y, (M, C, H, H), (OH, OH, s, p, p), -inf, inf, 1, k, act, act)
            return y

        assert np.array_equal(apart(), fused())
        ta, tf = [], []
        for _ in range(15):
            t0 = time.thread_time()
            apart()
            t1 = time.thread_time()
            fused()
            ta.append(t1 - t0)
            tf.append(time.thread_time() - t1)
        print(f"{C}->{M} at {H}x{H}, {k}x{k} stride {s}, act {act[0]}: two steps {min(ta) * 1e6:.0f} us, "
              f"expand_dw {min(tf) * 1e6:.0f} us, ratio {min(tf) / min(ta):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
