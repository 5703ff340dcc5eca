"""ORT_ENABLE_ALL's layout pass: NHWC variants for the nodes whose provider asks for them."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import helper

import runtime_core as rt
from oracle import assert_close, make_model
from runtime_core.graph import Graph
from runtime_core.optimizer import optimize
from runtime_core.optimizer.layout import NHWC_DOMAIN
from runtime_provider_cpu.plugin import CPUExecutionProvider

rng = np.random.default_rng(7)
L = rt.GraphOptimizationLevel


class _PrefersNhwc:
    """Takes Conv and pooling (and their NHWC forms) and asks for channels-last Conv/pools."""

    name, alias, device_type = "NhwcTestProvider", "nhwctest", "cpu"
    OPS = {"Conv", "MaxPool", "AveragePool", "GlobalAveragePool"}

    def __init__(self, layout="NHWC"):
        self.layout = layout
        self.asked = []

    def preferred_layout(self, node):
        self.asked.append(node.name)
        return self.layout if node.op_type in self.OPS else None

    def get_capability(self, graph):
        claims = [v for v in graph if v.op_type in self.OPS and v.domain in ("", NHWC_DOMAIN)]
        return SimpleNamespace(claims=claims, declined={v.name: "not a conv/pool" for v in graph if v not in claims})


def _cnn():
    x = rng.standard_normal((2, 3, 12, 12)).astype(np.float32)
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             n("Conv", ["c1", "w2"], ["c2"], name="conv2", strides=[2, 2]),
             n("MaxPool", ["c2"], ["p"], name="pool", kernel_shape=[2, 2], strides=[1, 1]),
             n("Relu", ["p"], ["r"], name="relu"),
             n("GlobalAveragePool", ["r"], ["y"], name="gap")]
    inits = {"w1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
             "b1": rng.standard_normal(8).astype(np.float32),
             "w2": rng.standard_normal((4, 8, 3, 3)).astype(np.float32)}
    return make_model(nodes, {"x": x}, ["y"], initializers=inits), {"x": x}


def _ops(g):
    return [(n.domain, n.op_type) for n in g.nodes]


def test_nodes_of_a_provider_that_asks_become_nhwc_and_inner_transposes_cancel():
    model, feeds = _cnn()
    g = Graph(model)
    done = optimize(g, int(L.ORT_ENABLE_ALL), providers=[_PrefersNhwc(), CPUExecutionProvider()])
    assert done.get("LayoutTransformation") == 4
    assert _ops(g) == [("", "Transpose"), (NHWC_DOMAIN, "Conv"), (NHWC_DOMAIN, "Conv"), (NHWC_DOMAIN, "MaxPool"),
                       ("", "Transpose"), ("", "Relu"), ("", "Transpose"), (NHWC_DOMAIN, "GlobalAveragePool"),
                       ("", "Transpose")]
    # the optimized model (saved as a user would) runs anywhere: the CPU provider has NHWC kernels
    optimized = g.to_model()
    assert any(o.domain == NHWC_DOMAIN for o in optimized.opset_import)
    ref = rt.InferenceSession(model.SerializeToString(), _opts(L.ORT_DISABLE_ALL), providers=["cpu"]).run(None, feeds)
    ours = rt.InferenceSession(optimized.SerializeToString(), _opts(L.ORT_DISABLE_ALL), providers=["cpu"])
    assert_close(ours.run(None, feeds), ref, rtol=1e-5, atol=1e-5)
    assert {n.op_type for n in ours.get_partition_report().nodes if n.domain == NHWC_DOMAIN} == {
        "Conv", "MaxPool", "GlobalAveragePool"}


def _opts(level):
    so = rt.SessionOptions()
    so.graph_optimization_level = level
    return so


@pytest.mark.parametrize("case", ["cpu_only", "extended", "no_preference", "disabled"])
def test_no_layout_change_unless_all_and_asked(case):
    model, _ = _cnn()
    g = Graph(model)
    providers = [_PrefersNhwc(None if case == "no_preference" else "NHWC"), CPUExecutionProvider()]
    if case == "cpu_only":
        providers = [CPUExecutionProvider()]
    level = L.ORT_ENABLE_EXTENDED if case == "extended" else L.ORT_ENABLE_ALL
    disabled = {"LayoutTransformation"} if case == "disabled" else None
    optimize(g, int(level), disabled, providers=providers)
    assert all(n.domain != NHWC_DOMAIN for n in g.nodes)
    assert [n.op_type for n in g.nodes] == ["Conv", "Conv", "MaxPool", "Relu", "GlobalAveragePool"]


def test_maxpool_with_indices_and_non_4d_inputs_stay():
    x = rng.standard_normal((2, 3, 10)).astype(np.float32)
    n = helper.make_node
    nodes = [n("Conv", ["x", "w"], ["c"], name="conv1d"),
             n("Unsqueeze", ["c", "ax"], ["c4"], name="unsq"),
             n("MaxPool", ["c4"], ["p", "idx"], name="pool", kernel_shape=[1, 2])]
    inits = {"w": rng.standard_normal((4, 3, 3)).astype(np.float32), "ax": np.array([2], np.int64)}
    g = Graph(make_model(nodes, {"x": x}, ["p", "idx"], initializers=inits))
    optimize(g, int(L.ORT_ENABLE_ALL), providers=[_PrefersNhwc(), CPUExecutionProvider()])
    assert all(n.domain != NHWC_DOMAIN for n in g.nodes)


def test_cpu_nhwc_kernel_declines_without_its_version():
    from runtime_core.errors import PartitionError

    x = rng.standard_normal((1, 5, 5, 3)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], domain=NHWC_DOMAIN, name="c")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 3, 3, 2])],
                          initializer=[onnx.numpy_helper.from_array(
                              rng.standard_normal((2, 3, 3, 3)).astype(np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(NHWC_DOMAIN, 1)])
    with pytest.raises(PartitionError, match="since_version"):
        rt.InferenceSession(m.SerializeToString(), providers=["cpu"])
