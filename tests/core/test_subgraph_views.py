"""Subgraph bodies reach providers as views (``NodeView.subgraphs``, plugin API 1.3): resolved
attributes with the schema's defaults, types inferred with the outer scope's types, nested
bodies in their own views; the CPU provider compiles from them alone."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt
from runtime_core.graph import Graph
from runtime_core.plugin import GraphBody, NodeView

vi = helper.make_tensor_value_info


def _nested_model():
    """Loop(M, c, v) whose body runs If(cond) on an outer value ``w`` (shape [3]) and, in its
    then-branch, a Softmax with no axis attribute (the default, -1, comes from the schema)."""
    then_b = helper.make_graph(
        [helper.make_node("Add", ["body_v", "w"], ["t0"]), helper.make_node("Softmax", ["t0"], ["t_out"])],
        "then", [], [vi("t_out", TensorProto.FLOAT, None)])
    else_b = helper.make_graph([helper.make_node("Identity", ["body_v"], ["e_out"])], "else", [],
                               [vi("e_out", TensorProto.FLOAT, None)])
    body = helper.make_graph(
        [helper.make_node("Identity", ["body_c"], ["body_c_out"]),
         helper.make_node("If", ["flag"], ["body_v_out"], then_branch=then_b, else_branch=else_b)],
        "body",
        [vi("body_i", TensorProto.INT64, []), vi("body_c", TensorProto.BOOL, []), vi("body_v", TensorProto.FLOAT, [3])],
        [vi("body_c_out", TensorProto.BOOL, []), vi("body_v_out", TensorProto.FLOAT, [3])])
    g = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "v"], ["y"], body=body)], "g",
        [vi("M", TensorProto.INT64, []), vi("flag", TensorProto.BOOL, []), vi("v", TensorProto.FLOAT, [3])],
        [vi("y", TensorProto.FLOAT, [3])],
        [numpy_helper.from_array(np.array([0.5, -1.0, 2.0], np.float32), "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _reference(m, flag, v, w):
    for _ in range(m):
        if flag:
            t = v + w
            e = np.exp(t - t.max())
            v = e / e.sum()
    return v


def test_the_core_hands_bodies_over_as_views():
    graph = Graph(_nested_model())
    view = graph.node_view(graph.nodes[0])
    assert list(view.subgraphs) == ["body"]
    body = view.subgraphs["body"]
    assert isinstance(body, GraphBody) and body is view.subgraphs["body"]  # built once
    assert body.inputs == ("body_i", "body_c", "body_v") and body.outputs == ("body_c_out", "body_v_out")
    assert set(body.outer_inputs) == {"flag", "w"}  # the nested branch's read of w included
    assert body.value("w").static_shape == (3,) and body.value("w").is_constant
    if_view = body.nodes[1]
    assert isinstance(if_view, NodeView) and if_view.name == f"{view.name}/body/{if_view.name.rsplit('/', 1)[1]}"
    then_b = if_view.subgraphs["then_branch"]
    softmax = then_b.nodes[1]
    assert softmax.attrs["axis"] == -1 and softmax.since_version == 13  # resolved by the core
    # types inferred through two scopes: body_v (the Loop body's input) and w (the model's)
    assert softmax.input_info[0].dtype == np.float32 and softmax.input_info[0].shape == (3,)
    # a second view of the same node reuses the bodies (no second shape inference)
    assert graph.node_view(graph.nodes[0]).subgraphs["body"] is body


def test_a_node_without_subgraphs_has_none():
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [vi("x", TensorProto.FLOAT, [2])],
                          [vi("y", TensorProto.FLOAT, [2])])
    graph = Graph(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert dict(graph.node_view(graph.nodes[0]).subgraphs) == {}


def test_a_body_with_an_unknown_attribute_is_declined_with_the_reason():
    body = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], bogus=3)], "b", [],
                             [vi("t", TensorProto.FLOAT, [2])])
    g = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body)], "g",
                          [vi("c", TensorProto.BOOL, []), vi("x", TensorProto.FLOAT, [2])],
                          [vi("y", TensorProto.FLOAT, [2])])
    graph = Graph(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    subs = graph.node_view(graph.nodes[0]).subgraphs
    with pytest.raises(ValueError, match="bogus"):
        subs["then_branch"]
    from runtime_provider_cpu.plugin import decline_reason

    assert "bogus" in decline_reason(graph.node_view(graph.nodes[0]))


@pytest.mark.parametrize("flag", [True, False])
def test_nested_bodies_run_from_the_views(flag):
    m = _nested_model()
    so = rt.SessionOptions()
    so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = rt.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    v = np.array([1.0, 2.0, 3.0], np.float32)
    (y,) = sess.run(None, {"M": np.array(3, np.int64), "flag": np.array(flag), "v": v})
    np.testing.assert_allclose(y, _reference(3, flag, v, numpy_helper.to_array(m.graph.initializer[0])),
                               rtol=1e-6)


def test_cpu_compile_needs_only_the_partition():
    # no get_capability call first: everything compile needs comes with the partition
    from runtime_provider_cpu.plugin import CPUExecutionProvider

    from runtime_core.partition import partition_graph

    graph = Graph(_nested_model())
    planned, _ = partition_graph(graph, [CPUExecutionProvider()])
    fresh = CPUExecutionProvider()
    assert not hasattr(fresh, "_opsets")
    (exe,) = [fresh.compile(pp.partition) for pp in planned]
    v = np.array([1.0, 2.0, 3.0], np.float32)
    feeds = {"M": np.array(2, np.int64), "flag": np.array(True), "v": v}
    (y,) = exe.run([feeds[n] for n in planned[0].partition.inputs])
    np.testing.assert_allclose(y, _reference(2, True, v, graph.initializers["w"]), rtol=1e-6)


def test_the_cpu_provider_reads_no_subgraph_protobuf():
    import pathlib

    from runtime_provider_cpu import execution

    for path in pathlib.Path(execution.__file__).parent.glob("*.py"):
        src = path.read_text()
        assert "import onnx" not in src and "GraphProto" not in src, path.name
