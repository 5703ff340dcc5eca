"""InferenceSession.validate_inputs (run's checks without a run) and get_graph_nodes (the optimized
graph the partition report describes, as read-only node views)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt
from runtime_core import errors
from runtime_core.plugin import NodeView


def _model(with_if: bool = False) -> bytes:
    f = TensorProto.FLOAT
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Sigmoid", ["h"], ["y"], name="relu")]  # not Relu: MatMul + Relu fuses at ALL
    if with_if:
        then_g = helper.make_graph([helper.make_node("Neg", ["y"], ["t"], name="neg")], "then", [],
                                   [helper.make_tensor_value_info("t", f, ["N", 3])])
        else_g = helper.make_graph([helper.make_node("Abs", ["y"], ["e"], name="abs")], "else", [],
                                   [helper.make_tensor_value_info("e", f, ["N", 3])])
        nodes.append(helper.make_node("If", ["c"], ["z"], name="branch", then_branch=then_g, else_branch=else_g))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, ["N", 4])]
                          + ([helper.make_tensor_value_info("c", TensorProto.BOOL, [])] if with_if else []),
                          [helper.make_tensor_value_info("z" if with_if else "y", f, ["N", 3])],
                          [numpy_helper.from_array(np.ones((4, 3), np.float32), "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("feed,outputs,err", [
    ({"xx": np.zeros((2, 4), np.float32)}, None, errors.InputNameError),
    ({}, None, errors.MissingInputError),
    ({"x": np.zeros((2, 4), np.int64)}, None, errors.InputTypeError),
    ({"x": np.zeros((2, 5), np.float32)}, None, errors.InputShapeError),
    ({"x": np.zeros((2, 4), np.float32)}, ["nope"], errors.OutputNameError),
    ([1, 2], None, errors.InputTypeError),
])
def test_validate_inputs_raises_what_run_raises(feed, outputs, err):
    sess = rt.InferenceSession(_model())
    with pytest.raises(err) as by_validate:
        sess.validate_inputs(feed, outputs)
    with pytest.raises(err) as by_run:
        sess.run(outputs, feed)
    assert str(by_validate.value) == str(by_run.value)


def test_validate_inputs_returns_the_feeds_run_uses():
    sess = rt.InferenceSession(_model())
    x = np.asfortranarray(np.arange(8, dtype=np.float32).reshape(2, 4))
    feeds = sess.validate_inputs({"x": x}, ["y"])
    assert list(feeds) == ["x"] and feeds["x"].flags.c_contiguous
    np.testing.assert_array_equal(feeds["x"], x)
    np.testing.assert_array_equal(sess.run(None, feeds)[0], sess.run(None, {"x": x})[0])


def test_get_graph_nodes_match_the_report():
    sess = rt.InferenceSession(_model(with_if=True))
    views = sess.get_graph_nodes()
    assert all(isinstance(v, NodeView) for v in views)
    assert sorted(v.name for v in views) == sorted(n.name for n in sess.get_partition_report().nodes)
    by = {v.name: v for v in views}
    assert by["mm"].inputs == ("x", "w")
    assert by["branch"].implicit_inputs == ("y",)
    assert {k: [n.op_type for n in by["branch"].subgraphs[k].nodes] for k in by["branch"].subgraphs} == {
        "then_branch": ["Neg"], "else_branch": ["Abs"]}
    assert sess.get_graph_nodes() is not views  # a new list each call
