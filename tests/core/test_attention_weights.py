"""The traced attention match builds the fused QKV weight from the projections' columns:
a packed projection read in order is used as it is; heads whose columns interleave q, k and
v are gathered; three separate projections are concatenated. Outputs agree with the
unoptimized model in every case."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import helper

import runtime_core as rt
import runtime_provider_cpu.ops.fused  # noqa: F401 - registers the com.microsoft kernels
from oracle import make_model
from runtime_core.graph import Graph
from runtime_core.optimizer import optimize

L = rt.GraphOptimizationLevel
CPU = ["CPUExecutionProvider"]
B, S, D, H = 2, 5, 8, 2
DK = D // H
RNG = np.random.default_rng(11)


def f32(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def n(op, ins, outs, **kw):
    return helper.make_node(op, ins, outs, **kw)


def _tail(c, nodes, q, kt, v):
    """Scores, softmax, context and the [B, S, D] output from heads q, kt ([B,H,dk,S]), v."""
    c["c"] = np.float32(math.sqrt(DK))
    c["os"] = np.array([B, S, D], np.int64)
    nodes += [n("MatMul", [q, kt], ["qk"]), n("Div", ["qk", "c"], ["sc"]), n("Softmax", ["sc"], ["pr"], axis=-1),
              n("MatMul", ["pr", v], ["ctx"]), n("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3]),
              n("Reshape", ["ctxt", "os"], ["y"])]


def packed_model(interleaved: bool):
    """x @ Wqkv + b, then q, k, v picked out of [B, S, 3, H, dk] (in order) or out of
    [B, S, H, 3, dk] (each head's q, k, v side by side) with Gather: no Split, so only the
    traced match applies."""
    c = {"w": f32(D, 3 * D, scale=0.3), "b": f32(3 * D), "i0": np.array(0, np.int64), "i1": np.array(1, np.int64),
         "i2": np.array(2, np.int64)}
    if interleaved:
        c["hs"] = np.array([B, S, H, 3, DK], np.int64)
        perm = [3, 0, 2, 1, 4]  # -> [3, B, H, S, dk]
    else:
        c["hs"] = np.array([B, S, 3, H, DK], np.int64)
        perm = [2, 0, 3, 1, 4]
    nodes = [n("MatMul", ["x", "w"], ["p"]), n("Add", ["p", "b"], ["qkv"]), n("Reshape", ["qkv", "hs"], ["r"]),
             n("Transpose", ["r"], ["t"], perm=perm)]
    for name, i in (("q", "i0"), ("k", "i1"), ("v", "i2")):
        nodes.append(n("Gather", ["t", i], [name], axis=0))
    nodes.append(n("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]))
    _tail(c, nodes, "q", "kt", "v")
    feeds = {"x": f32(B, S, D)}
    return make_model(nodes, feeds, ["y"], initializers=c), feeds


def separate_model():
    """Three projections; k reaches its head through two Transposes (not the plain pattern)."""
    c = {"hs": np.array([B, S, H, DK], np.int64)}
    nodes = []
    for name in "qkv":
        c["w" + name], c["b" + name] = f32(D, D, scale=0.3), f32(D)
        nodes += [n("MatMul", ["x", "w" + name], ["p" + name]), n("Add", ["p" + name, "b" + name], ["l" + name]),
                  n("Reshape", ["l" + name, "hs"], ["r" + name]),
                  n("Transpose", ["r" + name], [name + "h"], perm=[0, 2, 1, 3])]
    nodes.append(n("Transpose", ["kh"], ["kt"], perm=[0, 1, 3, 2]))
    _tail(c, nodes, "qh", "kt", "vh")
    feeds = {"x": f32(B, S, D)}
    return make_model(nodes, feeds, ["y"], initializers=c), feeds


def optimized(model):
    g = Graph(model)
    before = dict(g.initializers)
    optimize(g, int(L.ORT_ENABLE_EXTENDED))
    att = [x for x in g.nodes if x.op_type == "Attention"]
    return g, before, att


def same_outputs(model, feeds):
    data = model.SerializeToString()
    so = rt.SessionOptions()
    so.graph_optimization_level = L.ORT_DISABLE_ALL
    ref = rt.InferenceSession(data, so, providers=CPU).run(None, feeds)[0]
    got = rt.InferenceSession(data, providers=CPU).run(None, feeds)[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_packed_projection_in_order_is_used_as_it_is():
    m, feeds = packed_model(interleaved=False)
    g, before, att = optimized(m)
    assert len(att) == 1
    w = g.initializers[att[0].inputs[1]]
    assert w is before["w"]  # no copy of the packed weight
    assert g.initializers[att[0].inputs[2]] is before["b"]
    same_outputs(m, feeds)


def test_interleaved_heads_gather_their_columns():
    m, feeds = packed_model(interleaved=True)
    g, before, att = optimized(m)
    assert len(att) == 1
    w = g.initializers[att[0].inputs[1]]
    src = before["w"]
    # column j of the fused q block: head j // dk, position j % dk, at H x (3, dk) in the packed W
    cols = [h * 3 * DK + part * DK + j for part in range(3) for h in range(H) for j in range(DK)]
    np.testing.assert_array_equal(w, src[:, cols])
    assert w.flags.c_contiguous and w.dtype == np.float32
    same_outputs(m, feeds)


def test_three_projections_are_concatenated():
    m, feeds = separate_model()
    g, before, att = optimized(m)
    assert len(att) == 1
    w = g.initializers[att[0].inputs[1]]
    np.testing.assert_array_equal(w, np.concatenate([before["wq"], before["wk"], before["wv"]], axis=1))
    np.testing.assert_array_equal(g.initializers[att[0].inputs[2]],
                                  np.concatenate([before["bq"], before["bk"], before["bv"]]))
    assert w.flags.c_contiguous
    same_outputs(m, feeds)


@pytest.mark.parametrize("build", [lambda: packed_model(False), lambda: packed_model(True), separate_model],
                         ids=["packed", "interleaved", "separate"])
def test_replaced_projection_weights_leave_the_graph(build):
    m, feeds = build()
    g, before, att = optimized(m)
    names = [k for k in before if k.startswith(("w", "b"))]
    read = {i for x in g.nodes for i in x.inputs}
    for k in names:  # read by nothing now, so dropped (a reused array lives on under the fused name)
        assert k not in read and k not in g.initializers
