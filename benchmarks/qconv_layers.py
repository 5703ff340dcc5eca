"""ResNet-18's convolutions one by one on runtime-core: a one-node ``QLinearConv`` (int8 activations
with zero point -128, per-channel int8 weights, int32 bias) against the float ``Conv`` + ``Relu`` of
the same shape (fused, on the float plans), batch 1, in one process, interleaved, median of 15 runs
a round, three rounds. Issue 31's per-layer view of "int8 faster than float"::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/qconv_layers.py [--threads 2] [NAME ...]

Another build (a main checkout with its extension built) runs the same script with
``PYTHONPATH=CHECKOUT:CHECKOUT/providers/cpu`` in front: alternate the two for an A/B.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import runtime_core as rt

#: (name, C, M, kernel, stride, input size)
LAYERS = [("stem", 3, 64, 7, 2, 224), ("s1", 64, 64, 3, 1, 56), ("s2a", 64, 128, 3, 2, 56), ("s2", 128, 128, 3, 1, 28),
          ("s3a", 128, 256, 3, 2, 28), ("s3", 256, 256, 3, 1, 14), ("s4a", 256, 512, 3, 2, 14), ("s4", 512, 512, 3, 1, 7),
          ("d2", 64, 128, 1, 2, 56), ("d3", 128, 256, 1, 2, 28), ("d4", 256, 512, 1, 2, 14)]


def models(C, M, k, s, H):
    """(float model, its input, QLinearConv model, its input) for one layer, random seeded values."""
    r = np.random.default_rng(0)
    p = k // 2
    w = r.normal(0, 0.05, (M, C, k, k)).astype(np.float32)
    b = r.normal(0, 0.1, (M,)).astype(np.float32)
    conv = {"kernel_shape": [k, k], "strides": [s, s], "pads": [p] * 4}
    fl = h.make_graph([h.make_node("Conv", ["x", "W", "B"], ["c"], **conv), h.make_node("Relu", ["c"], ["y"])], "f",
                      [h.make_tensor_value_info("x", T.FLOAT, [1, C, H, H])],
                      [h.make_tensor_value_info("y", T.FLOAT, None)], [nh.from_array(w, "W"), nh.from_array(b, "B")])
    inits = [nh.from_array(np.array(0.02, np.float32), "xs"), nh.from_array(np.array(-128, np.int8), "xz"),
             nh.from_array(r.integers(-127, 128, (M, C, k, k)).astype(np.int8), "Wq"),
             nh.from_array((r.random(M) * 0.01 + 0.001).astype(np.float32), "ws"),
             nh.from_array(np.zeros(M, np.int8), "wz"), nh.from_array(np.array(0.5, np.float32), "ys"),
             nh.from_array(np.array(-128, np.int8), "yz"), nh.from_array(r.integers(-5000, 5000, M).astype(np.int32), "Bq")]
    q = h.make_graph([h.make_node("QLinearConv", ["x", "xs", "xz", "Wq", "ws", "wz", "ys", "yz", "Bq"], ["y"], **conv)],
                     "q", [h.make_tensor_value_info("x", T.INT8, [1, C, H, H])],
                     [h.make_tensor_value_info("y", T.INT8, None)], inits)

    def mk(g):
        return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8).SerializeToString()

    return (mk(fl), r.random((1, C, H, H)).astype(np.float32), mk(q),
            r.integers(-128, 128, (1, C, H, H)).astype(np.int8))


def median_ms(sess, x, n):
    sess.run(None, {"x": x})
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        sess.run(None, {"x": x})
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("names", nargs="*", help="layers (default: all): " + ", ".join(n for n, *_ in LAYERS))
    args = ap.parse_args()
    so = rt.SessionOptions()
    so.intra_op_num_threads = args.threads
    for name, C, M, k, s, H in LAYERS:
        if args.names and name not in args.names:
            continue
        fm, xf, qm, xq = models(C, M, k, s, H)
        sf = rt.InferenceSession(fm, so, providers=["CPUExecutionProvider"])
        sq = rt.InferenceSession(qm, so, providers=["CPUExecutionProvider"])
        rf, rq = [], []
        for _ in range(3):
            rf.append(median_ms(sf, xf, 15))
            rq.append(median_ms(sq, xq, 15))
        f, q = float(np.median(rf)), float(np.median(rq))
        print(f"{name:5s} C{C:4d} M{M:4d} k{k} s{s} H{H:4d}  float {f:7.3f} ms  int8 {q:7.3f} ms  int8/float {q / f:5.2f}"
              f"  rounds float {' '.join(f'{v:.3f}' for v in rf)} int8 {' '.join(f'{v:.3f}' for v in rq)}")


if __name__ == "__main__":
    main()
