"""Elementwise chains on the numexpr provider vs the CPU provider, in the same run.

    python benchmarks/bench_chain.py [--elements N ...] [--repeat R]

Prints the median latency of each model on both providers and their ratio
(CPU time / numexpr time: above 1 means numexpr is faster). Nothing is asserted:
the numbers depend on the machine (cores, SIMD, memory bandwidth).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from onnx import TensorProto, helper

import runtime_core as rt


def _model(name, nodes, inputs, n):
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info(i, TensorProto.FLOAT, [n]) for i in inputs],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])],
                          initializer=[helper.make_tensor(k, TensorProto.FLOAT, [], [v]) for k, v in
                                       (("half", 0.5), ("one", 1.0), ("k", 0.7978845608), ("c", 0.044715),
                                        ("three", 3.0))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def models(n):
    """(name, model bytes, input names) of a few chains of n-element tensors."""
    N = helper.make_node
    yield "a*b+c*a-b (4 nodes)", _model("arith", [
        N("Mul", ["a", "b"], ["t0"]), N("Mul", ["half", "a"], ["t1"]), N("Add", ["t0", "t1"], ["t2"]),
        N("Sub", ["t2", "b"], ["y"])], ["a", "b"], n), ["a", "b"]
    yield "gelu, tanh form (8 nodes)", _model("gelu", [
        N("Pow", ["a", "three"], ["p"]), N("Mul", ["c", "p"], ["q"]), N("Add", ["a", "q"], ["r"]),
        N("Mul", ["k", "r"], ["s"]), N("Tanh", ["s"], ["t"]), N("Add", ["one", "t"], ["u"]),
        N("Mul", ["half", "a"], ["v"]), N("Mul", ["v", "u"], ["y"])], ["a"], n), ["a"]
    yield "silu + residual (3 nodes)", _model("silu", [
        N("Sigmoid", ["a"], ["s"]), N("Mul", ["a", "s"], ["m"]), N("Add", ["m", "b"], ["y"])], ["a", "b"], n), \
        ["a", "b"]


def median_ms(sess, feeds, repeat):
    sess.run(None, feeds)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, nargs="*", default=[1 << 14, 1 << 18, 1 << 22])
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"{'model':32s} {'elements':>9s} {'cpu ms':>9s} {'numexpr ms':>11s} {'cpu/numexpr':>11s}")
    for n in args.elements:
        for name, model, inputs in models(n):
            feeds = {i: rng.standard_normal(n).astype(np.float32) for i in inputs}
            cpu = rt.InferenceSession(model, providers=["cpu"])
            nex = rt.InferenceSession(model, providers=["numexpr", "cpu"])
            assert {x.provider for x in nex.get_partition_report().nodes} == {"NumexprExecutionProvider"}
            np.testing.assert_allclose(nex.run(None, feeds)[0], cpu.run(None, feeds)[0], rtol=1e-4, atol=1e-5)
            t_cpu, t_nex = median_ms(cpu, feeds, args.repeat), median_ms(nex, feeds, args.repeat)
            print(f"{name:32s} {n:9d} {t_cpu:9.3f} {t_nex:11.3f} {t_cpu / t_nex:11.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
