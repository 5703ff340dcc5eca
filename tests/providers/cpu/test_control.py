"""Control flow (If, Loop, Scan), sequences and optionals on the CPU provider, against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

import runtime_core as rt
from oracle import assert_close, run_oracle, run_ours

F = T.FLOAT
I64 = T.INT64


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, opset=17, initializers=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _compare(model, feeds, **tol):
    ours, sess = run_ours(model, feeds)
    assert all(n.provider == "CPUExecutionProvider" for n in sess.get_partition_report().nodes)
    ref = run_oracle(model, feeds)
    assert_close(ours, ref, **tol)
    return ours


@pytest.mark.parametrize("cond", [True, False])
def test_if_reads_outer_scope(cond):
    # both branches read graph inputs and a value computed in the main graph
    then = helper.make_graph(
        [helper.make_node("Mul", ["x", "s"], ["t0"]), helper.make_node("Add", ["t0", "y"], ["t"])],
        "then", [], [_vi("t", F, [2, 3])])
    els = helper.make_graph([helper.make_node("Sub", ["s", "y"], ["e"])], "else", [], [_vi("e", F, [2, 3])])
    m = _model([helper.make_node("Exp", ["x"], ["s"]),
                helper.make_node("If", ["c"], ["z"], then_branch=then, else_branch=els),
                helper.make_node("Neg", ["z"], ["w"])],
               [_vi("c", T.BOOL, []), _vi("x", F, [2, 3]), _vi("y", F, [2, 3])],
               [_vi("w", F, [2, 3])])
    rng = np.random.default_rng(0)
    _compare(m, {"c": np.array(cond), "x": rng.standard_normal((2, 3)).astype(np.float32),
                 "y": rng.standard_normal((2, 3)).astype(np.float32)})


def test_nested_loop_with_outer_reads_and_scan_outputs():
    # inner: acc_out = acc_in + a * j (reads the outer body's `a` and the graph's `bias`)
    inner = helper.make_graph(
        [helper.make_node("Identity", ["ci"], ["co"]),
         helper.make_node("Cast", ["j"], ["jf"], to=F),
         helper.make_node("Mul", ["a", "jf"], ["aj"]),
         helper.make_node("Add", ["acc_in", "aj"], ["acc0"]),
         helper.make_node("Add", ["acc0", "bias"], ["acc_out"]),
         helper.make_node("Identity", ["acc_out"], ["inner_scan"])],
        "inner", [_vi("j", I64, []), _vi("ci", T.BOOL, []), _vi("acc_in", F, [3])],
        [_vi("co", T.BOOL, []), _vi("acc_out", F, [3]), _vi("inner_scan", F, [3])])
    # outer: a = x * (i + 1); runs the inner loop n times; carries v; scans the inner's final acc
    outer = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Add", ["fi", "one"], ["fi1"]),
         helper.make_node("Mul", ["x", "fi1"], ["a"]),
         helper.make_node("Loop", ["n", "", "v_in"], ["v_out", "inner_scans"], body=inner),
         helper.make_node("ReduceSum", ["inner_scans"], ["scan_out"], keepdims=0)],
        "outer", [_vi("i", I64, []), _vi("c_in", T.BOOL, []), _vi("v_in", F, [3])],
        [_vi("c_out", T.BOOL, []), _vi("v_out", F, [3]), _vi("scan_out", F, [])])
    m = _model([helper.make_node("Loop", ["trip", "cond", "v0"], ["v", "scans"], body=outer)],
               [_vi("trip", I64, []), _vi("cond", T.BOOL, []), _vi("v0", F, [3]), _vi("x", F, [3]),
                _vi("bias", F, [3]), _vi("n", I64, [])],
               [_vi("v", F, [3]), _vi("scans", F, [None])],
               initializers=[onnx.numpy_helper.from_array(np.array(1, np.float32), "one")])
    feeds = {"trip": np.array(4, np.int64), "cond": np.array(True), "v0": np.zeros(3, np.float32),
             "x": np.array([1, 2, 3], np.float32), "bias": np.array([0.5, 0, -1], np.float32),
             "n": np.array(3, np.int64)}
    _compare(m, feeds)
    feeds["trip"] = np.array(0, np.int64)  # no iteration: v is v0, scans is empty
    ours = _compare(m, feeds)
    assert ours[1].shape == (0,)


def test_loop_while_condition_and_sequence_carried():
    # a while loop (no trip count) that appends i to a sequence until i == 3
    body = helper.make_graph(
        [helper.make_node("Constant", [], ["three"], value=helper.make_tensor("k", I64, [], [3])),
         helper.make_node("Less", ["i", "three"], ["c_out"]),
         helper.make_node("Unsqueeze", ["i", "ax"], ["i1"]),
         helper.make_node("SequenceInsert", ["seq_in", "i1"], ["seq_out"])],
        "body", [_vi("i", I64, []), _vi("c_in", T.BOOL, []),
                 helper.make_tensor_sequence_value_info("seq_in", I64, None)],
        [_vi("c_out", T.BOOL, []), helper.make_tensor_sequence_value_info("seq_out", I64, None)])
    m = _model([helper.make_node("SequenceEmpty", [], ["s0"], dtype=I64),
                helper.make_node("Loop", ["", "cond", "s0"], ["s"], body=body),
                helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0),
                helper.make_node("SequenceLength", ["s"], ["n"])],
               [_vi("cond", T.BOOL, [])], [_vi("y", I64, [None]), _vi("n", I64, [])],
               initializers=[onnx.numpy_helper.from_array(np.array([0], np.int64), "ax")])
    y, n = _compare(m, {"cond": np.array(True)})
    assert y.tolist() == [0, 1, 2, 3] and int(n) == 4


@pytest.mark.parametrize("opset", [9, 11, 16])
def test_scan_reverse_directions_and_axes(opset):
    # state: running sum; scan outputs: the sum (reversed output, axis 1) and x * 2
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "xt"], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["y1"]),
         helper.make_node("Add", ["xt", "xt"], ["y2"])],
        "body", [_vi("s_in", F, [2]), _vi("xt", F, [2])],
        [_vi("s_out", F, [2]), _vi("y1", F, [2]), _vi("y2", F, [2])])
    m = _model([helper.make_node("Scan", ["s0", "x"], ["s", "y1", "y2"], body=body, num_scan_inputs=1,
                                 scan_input_axes=[1], scan_input_directions=[1],
                                 scan_output_axes=[1, 0], scan_output_directions=[1, 0])],
               [_vi("s0", F, [2]), _vi("x", F, [2, 4])],
               [_vi("s", F, [2]), _vi("y1", F, [2, 4]), _vi("y2", F, [4, 2])], opset=opset)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    _compare(m, {"s0": np.array([1, -1], np.float32), "x": x})


def test_scan8_batch_and_sequence_lens():
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "xt"], ["s_out"]), helper.make_node("Identity", ["s_out"], ["y"])],
        "body", [_vi("s_in", F, [2]), _vi("xt", F, [2])], [_vi("s_out", F, [2]), _vi("y", F, [2])])
    m = _model([helper.make_node("Scan", ["lens", "s0", "x"], ["s", "y"], body=body, num_scan_inputs=1,
                                 directions=[1])],
               [_vi("lens", I64, [2]), _vi("s0", F, [2, 2]), _vi("x", F, [2, 3, 2])],
               [_vi("s", F, [2, 2]), _vi("y", F, [2, 3, 2])], opset=8)
    x = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
    feeds = {"lens": np.array([3, 2], np.int64), "s0": np.zeros((2, 2), np.float32), "x": x}
    ours = _compare(m, feeds)
    # batch 1 runs 2 steps, reversed over its first 2 elements; its last output is zero
    np.testing.assert_array_equal(ours[0], [[6, 9], [14, 16]])
    np.testing.assert_array_equal(ours[1][1], [[8, 9], [14, 16], [0, 0]])
    feeds["lens"] = np.array([3, 3], np.int64)
    _compare(m, feeds)


def test_sequence_pipeline():
    nodes = [
        helper.make_node("SplitToSequence", ["x"], ["s"], axis=1, keepdims=0),   # 4 x [3]
        helper.make_node("SequenceErase", ["s", "p0"], ["s1"]),                  # drop the first
        helper.make_node("SequenceInsert", ["s1", "t", "pm1"], ["s2"]),          # before the last
        helper.make_node("SequenceAt", ["s2", "pm1"], ["last"]),
        helper.make_node("SequenceLength", ["s2"], ["n"]),
        helper.make_node("ConcatFromSequence", ["s2"], ["stacked"], axis=-1, new_axis=1),
        helper.make_node("SplitToSequence", ["x", "sizes"], ["parts"], axis=1),
        helper.make_node("ConcatFromSequence", ["parts"], ["again"], axis=1),
    ]
    inits = [onnx.numpy_helper.from_array(np.array(0, np.int64), "p0"),
             onnx.numpy_helper.from_array(np.array(-1, np.int64), "pm1"),
             onnx.numpy_helper.from_array(np.array([1, 3], np.int64), "sizes")]
    m = _model(nodes, [_vi("x", F, [3, 4]), _vi("t", F, [3])],
               [_vi("last", F, [3]), _vi("n", I64, []), _vi("stacked", F, [3, 4]), _vi("again", F, [3, 4])],
               initializers=inits)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    last, n, stacked, again = _compare(m, {"x": x, "t": np.ones(3, np.float32)})
    assert int(n) == 4
    np.testing.assert_array_equal(again, x)


def test_sequence_map_with_outer_read():
    body = helper.make_graph([helper.make_node("Add", ["e", "k"], ["e0"]), helper.make_node("Mul", ["e0", "w"], ["o"])],
                             "body", [_vi("e", F, None), _vi("k", F, [])], [_vi("o", F, None)])
    m = _model([helper.make_node("SequenceMap", ["s", "k"], ["r"], body=body)],
               [helper.make_tensor_sequence_value_info("s", F, None), _vi("k", F, []), _vi("w", F, [])],
               [helper.make_tensor_sequence_value_info("r", F, None)])
    s = [np.arange(3, dtype=np.float32), np.ones((2, 2), np.float32)]
    ours, _ = run_ours(m, {"s": s, "k": np.array(1, np.float32), "w": np.array(2, np.float32)})
    assert isinstance(ours[0], list) and len(ours[0]) == 2
    np.testing.assert_array_equal(ours[0][0], [2, 4, 6])
    np.testing.assert_array_equal(ours[0][1], np.full((2, 2), 4, np.float32))


@pytest.mark.parametrize("cond", [True, False])
def test_optionals_through_if(cond):
    seq_t = helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, [2]))
    opt_t = helper.make_optional_type_proto(seq_t)
    then = helper.make_graph([helper.make_node("Optional", [], ["o"], type=seq_t)], "then", [],
                             [helper.make_value_info("o", opt_t)])
    els = helper.make_graph([helper.make_node("SequenceConstruct", ["x", "x"], ["sq"]),
                             helper.make_node("Optional", ["sq"], ["o2"])], "else", [],
                            [helper.make_value_info("o2", opt_t)])
    m = _model([helper.make_node("If", ["c"], ["opt"], then_branch=then, else_branch=els),
                helper.make_node("OptionalHasElement", ["opt"], ["has"])],
               [_vi("c", T.BOOL, []), _vi("x", F, [2])],
               [helper.make_value_info("opt", opt_t), _vi("has", T.BOOL, [])], opset=18)
    ours, _ = run_ours(m, {"c": np.array(cond), "x": np.array([1, 2], np.float32)})
    if cond:
        assert ours[0] is None and not bool(ours[1])
    else:
        assert isinstance(ours[0], list) and len(ours[0]) == 2 and bool(ours[1])


def test_optional_sequence_feed_and_get_element():
    seq_t = helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, [2]))
    opt_t = helper.make_optional_type_proto(seq_t)
    m = _model([helper.make_node("OptionalGetElement", ["o"], ["s"]),
                helper.make_node("OptionalHasElement", ["o"], ["has"])],
               [helper.make_value_info("o", opt_t)],
               [helper.make_value_info("s", seq_t), _vi("has", T.BOOL, [])], opset=18)
    sess = rt.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    s, has = sess.run(None, {"o": [np.ones(2, np.float32)]})
    assert isinstance(s, list) and len(s) == 1 and bool(has)
    m.graph.node.pop(0)
    m.graph.output.pop(0)
    sess = rt.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    (has,) = sess.run(None, {})  # an optional input not fed is empty
    assert not bool(has)


def test_body_with_unsupported_op_is_declined_naming_it():
    then = helper.make_graph([helper.make_node("Abs", ["x"], ["t"])], "then", [], [_vi("t", F, [2])])
    els = helper.make_graph([helper.make_node("Abs", ["x"], ["a"]),
                             helper.make_node("Foo", ["a"], ["e"], domain="com.example")],
                            "else", [], [_vi("e", F, [2])])
    g = helper.make_graph([helper.make_node("If", ["c"], ["z"], then_branch=then, else_branch=els)], "g",
                          [_vi("c", T.BOOL, []), _vi("x", F, [2])], [_vi("z", F, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    with pytest.raises(rt.PartitionError if hasattr(rt, "PartitionError") else Exception) as ei:
        rt.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    msg = str(ei.value)
    assert "else_branch" in msg and "com.example::Foo" in msg
