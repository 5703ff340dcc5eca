"""The optimizer's seam to the CPU provider, its rule driver and the constant-folding cap."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tracemalloc

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import runtime_core as rt
from oracle import make_model
from runtime_core.errors import InvalidArgumentError
from runtime_core.graph import Graph
from runtime_core.optimizer import OPTIMIZERS, optimize
from runtime_core.optimizer.folding import MAX_BYTES_KEY
from runtime_core.optimizer.rewrite import RewriteRule, walk

L = rt.GraphOptimizationLevel
CPU = ["CPUExecutionProvider"]
RNG = np.random.default_rng(11)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def n(op, ins, outs, **kw):
    return helper.make_node(op, ins, outs, **kw)


def many_fusions_model():
    """A bias + erf Gelu + decomposed LayerNorm chain and a Conv + BN + Relu branch."""
    h = [n("MatMul", ["x", "w"], ["xw"]), n("Add", ["xw", "bias"], ["xb"]),
         n("Div", ["xb", "s2"], ["u"]), n("Erf", ["u"], ["e"]), n("Add", ["e", "one"], ["p"]),
         n("Mul", ["xb", "p"], ["m"]), n("Mul", ["m", "half"], ["ge"]),
         n("ReduceMean", ["ge"], ["mu"], axes=[-1]), n("Sub", ["ge", "mu"], ["d"]), n("Pow", ["d", "two"], ["d2"]),
         n("ReduceMean", ["d2"], ["var"], axes=[-1]), n("Add", ["var", "eps"], ["ve"]), n("Sqrt", ["ve"], ["sd"]),
         n("Div", ["d", "sd"], ["nz"]), n("Mul", ["nz", "g"], ["gz"]), n("Add", ["gz", "b"], ["y"])]
    c = [n("Conv", ["img", "cw"], ["c"], pads=[1, 1, 1, 1]),
         n("BatchNormalization", ["c", "sc", "bi", "cmu", "cvar"], ["bn"]), n("Relu", ["bn"], ["z"])]
    inits = {"w": f32(8, 8), "bias": f32(8), "s2": np.float32(math.sqrt(2.0)), "one": np.float32(1.0),
             "half": np.float32(0.5), "two": np.float32(2.0), "eps": np.float32(1e-5), "g": f32(8), "b": f32(8),
             "cw": f32(4, 3, 3, 3), "sc": np.abs(f32(4)) + 0.5, "bi": f32(4), "cmu": f32(4),
             "cvar": np.abs(f32(4)) + 0.5}
    feeds = {"x": f32(2, 5, 8), "img": f32(1, 3, 8, 8)}
    return make_model(h + c, feeds, ["y", "z"], initializers=inits), feeds


#: fusion -> the fusions whose output it starts from (disabling one of those stops it too)
FUSIONS = {"GeluFusion": (), "BiasGeluFusion": ("GeluFusion",), "LayerNormFusion": (),
           "ConvBatchNormFusion": (), "ConvActivationFusion": ("ConvBatchNormFusion",)}


@pytest.mark.parametrize("off", [p.name for p in OPTIMIZERS])
def test_fusions_happen_with_any_other_pass_disabled(off):
    m, feeds = many_fusions_model()
    g = Graph(m)
    done = optimize(g, int(L.ORT_ENABLE_EXTENDED), {off})
    for fusion, needs in FUSIONS.items():
        if fusion != off and off not in needs:
            assert done.get(fusion, 0) >= 1, (fusion, done)
    # and the result is what the model computes
    s_ref = rt.InferenceSession(m.SerializeToString(), _opts(L.ORT_DISABLE_ALL))
    so = _opts(L.ORT_ENABLE_EXTENDED)
    so.add_session_config_entry("optimization.disable_specified_optimizers", off)
    s = rt.InferenceSession(m.SerializeToString(), so)
    for a, b in zip(s.run(None, feeds), s_ref.run(None, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_fusions_without_constant_folding_in_a_fresh_interpreter(tmp_path):
    """The defect this guards: the kernel registry the fusions asked was filled only as a side
    effect of importing ConstantFolding's CPU modules; a fresh process shows it."""
    m, _ = many_fusions_model()
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    code = ("import json, sys, onnx\nfrom runtime_core.graph import Graph\nfrom runtime_core.optimizer import optimize\n"
            f"g = Graph(onnx.load({str(path)!r}))\n"
            "print(json.dumps(optimize(g, 2, {'ConstantFolding'})))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    done = json.loads(out.stdout.splitlines()[0])
    for fusion in FUSIONS:
        assert done.get(fusion, 0) >= 1, (fusion, done)


def _opts(level, **config):
    so = rt.SessionOptions()
    so.graph_optimization_level = level
    for k, v in config.items():
        so.add_session_config_entry(k, v)
    return so


# -- the constant-folding cap --------------------------------------------------------------

def bomb_model(n_elems):
    """An all-constant ``ConstantOfShape([n])`` reduced to one number, added to x."""
    nodes = [n("ConstantOfShape", ["shape"], ["z"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
             n("ReduceSum", ["z"], ["zs"], keepdims=0), n("Add", ["x", "zs"], ["y"])]
    return make_model(nodes, {"x": np.zeros(3, np.float32)}, ["y"],
                      initializers={"shape": np.array([n_elems], np.int64)})


def test_constant_of_shape_bomb_is_not_folded_and_costs_nothing_at_session_creation():
    m = bomb_model(300_000_000)  # 1.2 GB of float32 if folded
    tracemalloc.start()  # numpy reports its buffers to tracemalloc
    try:
        s = rt.InferenceSession(m.SerializeToString(), _opts(L.ORT_ENABLE_ALL), providers=CPU)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    ops = [e.op_type for e in s.get_partition_report().nodes]
    assert ops[:2] == ["ConstantOfShape", "ReduceSum"], ops  # kept as nodes: nothing was computed
    assert s.optimizations["ConstantFolding"] == 0
    assert peak < 64 << 20, peak  # folding it allocated 1.2 GB


def test_the_cap_is_a_session_config_entry():
    m = bomb_model(1000)  # 4000 bytes of float32
    small = rt.InferenceSession(m.SerializeToString(), _opts(L.ORT_ENABLE_BASIC, **{MAX_BYTES_KEY: "3999"}))
    big = rt.InferenceSession(m.SerializeToString(), _opts(L.ORT_ENABLE_BASIC, **{MAX_BYTES_KEY: "4000"}))
    assert [e.op_type for e in small.get_partition_report().nodes] == ["ConstantOfShape", "ReduceSum", "Add"]
    assert [e.op_type for e in big.get_partition_report().nodes] == ["Add"]
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(small.run(None, {"x": x})[0], big.run(None, {"x": x})[0])
    np.testing.assert_array_equal(big.run(None, {"x": x})[0], x + 1000)


@pytest.mark.parametrize("bad", ["-1", "lots", "1.5"])
def test_a_bad_cap_is_a_typed_error(bad):
    with pytest.raises(InvalidArgumentError, match=MAX_BYTES_KEY):
        rt.InferenceSession(bomb_model(10).SerializeToString(), _opts(L.ORT_ENABLE_BASIC, **{MAX_BYTES_KEY: bad}))


def test_a_loop_with_constant_inputs_is_not_folded():
    """A doubling Loop whose trip count and state are constants stays a node (folding it would
    run the whole loop at session creation)."""
    body = helper.make_graph(
        [n("Concat", ["s_in", "s_in"], ["s_out"], axis=0), n("Identity", ["c_in"], ["c_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s_out", TensorProto.FLOAT, None)])
    nodes = [n("Loop", ["trips", "cond", "s0"], ["s"], body=body), n("ReduceSum", ["s"], ["t"], keepdims=0),
             n("Add", ["x", "t"], ["y"])]
    m = make_model(nodes, {"x": np.zeros(2, np.float32)}, ["y"],
                   initializers={"trips": np.array(4, np.int64), "cond": np.array(True),
                                 "s0": np.ones(3, np.float32)})
    s = rt.InferenceSession(m.SerializeToString(), _opts(L.ORT_ENABLE_ALL))
    assert [e.op_type for e in s.get_partition_report().nodes] == ["Loop", "ReduceSum", "Add"]
    np.testing.assert_array_equal(s.run(None, {"x": np.zeros(2, np.float32)})[0], np.full(2, 48, np.float32))


# -- the rule driver -------------------------------------------------------------------------

class _CountRelu(RewriteRule):
    name = "CountRelu"
    targets = frozenset({"Relu"})

    def start(self, ed):
        self.seen = []
        return True

    def rewrite(self, ed, node):
        self.seen.append(node.name)
        return False


class _DropNeg(RewriteRule):
    """Removes a ``Relu`` right after a ``Neg`` (its readers read the Neg's output)."""

    name = "DropReluAfterNeg"
    targets = frozenset({"Relu"})

    def rewrite(self, ed, node):
        p = ed.producer(node.inputs[0])
        if p is None or p.op_type != "Neg":
            return False
        return ed.bypass(node, node.outputs[0], node.inputs[0])


def test_walk_offers_each_target_node_once_and_skips_nodes_an_earlier_rule_removed():
    nodes = [n("Neg", ["x"], ["a"], name="neg"), n("Relu", ["a"], ["b"], name="r1"),
             n("Abs", ["b"], ["c"], name="abs"), n("Relu", ["c"], ["y"], name="r2")]
    g = Graph(make_model(nodes, {"x": np.zeros(3, np.float32)}, ["y"]))
    drop, count = _DropNeg(), _CountRelu()
    done = walk(g, [drop, count])
    assert done == {"DropReluAfterNeg": 1, "CountRelu": 0}
    assert count.seen == ["r2"]  # r1 was removed by the first rule before the second saw it
    assert [x.name for x in g.nodes] == ["neg", "abs", "r2"] and g.nodes[1].inputs == ["a"]


def _single_op_graph(op, inits, **attrs):
    """``y = x + ReduceSum(op(constants))`` with the op's output type forgotten (as when shape
    inference could not say): the cap must come from the constant inputs themselves."""
    nodes = [n(op, list(inits), ["z"], **attrs), n("ReduceSum", ["z"], ["zs"], keepdims=0),
             n("Add", ["x", "zs"], ["y"])]
    g = Graph(make_model(nodes, {"x": np.zeros(3, np.float32)}, ["y"], initializers=inits))
    g.types.pop("z", None)
    return g


@pytest.mark.parametrize("op,small,bomb", [
    ("Expand", {"v": np.ones((1, 4), np.float32), "s": np.array([3, 4], np.int64)},
     {"v": np.ones((1, 4), np.float32), "s": np.array([1 << 20, 1 << 20, 4], np.int64)}),
    ("Tile", {"v": np.ones((2, 2), np.float32), "r": np.array([3, 1], np.int64)},
     {"v": np.ones((2, 2), np.float32), "r": np.array([1 << 30, 1 << 30], np.int64)}),
    ("Range", {"a": np.array(0, np.int64), "b": np.array(10, np.int64), "d": np.array(1, np.int64)},
     {"a": np.array(0, np.int64), "b": np.array(1 << 40, np.int64), "d": np.array(1, np.int64)}),
    ("ConstantOfShape", {"s": np.array([2, 3], np.int64)}, {"s": np.array([1 << 20, 1 << 20], np.int64)}),
])
def test_growing_ops_of_unknown_shape_fold_by_their_inputs_size(op, small, bomb):
    g = _single_op_graph(op, small)
    assert optimize(g, 1)["ConstantFolding"] >= 1 and [x.op_type for x in g.nodes] == ["Add"]
    g = _single_op_graph(op, bomb)
    tracemalloc.start()
    try:
        done = optimize(g, 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [x.op_type for x in g.nodes][:2] == [op, "ReduceSum"] and done["ConstantFolding"] == 0
    assert peak < 64 << 20, peak
