"""Bound steps: after a partition's first run, a Conv or FusedConv step whose first run made a
plan calls that plan straight (``ctx.cache["bound"]``, executable.binds) instead of the kernel
with its attributes. The bound call must give what the kernel gives for any later input:
another shape, another weight array, a residual of another shape."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from oracle import assert_close, compiled_partitions, cpu_session, make_model, run_oracle

RNG = np.random.default_rng(20261206)


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _conv_steps(sess):
    return [s for exe in compiled_partitions(sess) for s in exe.steps
            if s[1].node.op_type in ("Conv", "FusedConv")]


def _block(x_shape):
    """pointwise Conv + Add + Clip (a FusedConv with a residual), then a depthwise 3x3 Conv
    with no activation (a plain Conv), then a dense 3x3 Conv + Relu (FusedConv, direct)"""
    C = x_shape[1]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]),
             helper.make_node("Add", ["c1", "x"], ["s1"]),
             helper.make_node("Clip", ["s1", "lo", "hi"], ["a1"]),
             helper.make_node("Conv", ["a1", "wd"], ["c2"], group=C, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c2", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c3"], ["y"])]
    inits = {"w1": rnd(C, C, 1, 1) * 0.3, "b1": rnd(C), "lo": np.array(-1, np.float32),
             "hi": np.array(1.5, np.float32), "wd": rnd(C, 1, 3, 3), "w3": rnd(24, C, 3, 3) * 0.1,
             "b3": rnd(24)}
    return nodes, inits


def test_conv_steps_are_bound_after_the_first_run():
    x = rnd(1, 16, 20, 18)
    nodes, inits = _block(x.shape)
    model = make_model(nodes, {"x": x}, ["y"], opset=13, initializers=inits)
    sess = cpu_session(model)
    kernels = [st[0] for st in _conv_steps(sess)]
    assert len(kernels) == 3 and all(getattr(k, "binds", False) for k in kernels)
    for run in range(3):
        x = rnd(1, 16, 20, 18)
        assert_close(sess.run(None, {"x": x}), run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-4)
        steps = _conv_steps(sess)
        # bound from the first run on: the plan's call, no attributes
        assert all(st[0] is not k and st[4] == {} for st, k in zip(steps, kernels)), run


def test_bound_steps_follow_a_new_input_shape():
    # symbolic dims: a shape the plan was not made for goes to the kernel (a new plan), and the
    # first shape still gives its own result after it
    nodes, inits = _block((1, 8, 0, 0))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, "H", "W"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 24, "OH", "OW"])],
                          initializer=[helper.make_tensor(k, TensorProto.FLOAT, v.shape, v.ravel())
                                       for k, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    sess = cpu_session(model)
    for shape in [(1, 8, 15, 17), (1, 8, 9, 30), (1, 8, 15, 17), (1, 8, 4, 4)]:
        x = rnd(*shape)
        assert_close(sess.run(None, {"x": x}), run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-4)


def test_bound_steps_read_weights_fed_at_run_time():
    # a weight that is a graph input is a new array every run: the bound call's identity test
    # fails and the kernel runs with it (and its own new plan)
    x, w = rnd(1, 6, 11, 13), rnd(10, 6, 3, 3)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                        helper.make_node("Relu", ["c"], ["y"])], {"x": x, "w": w}, ["y"], opset=13)
    sess = cpu_session(model)
    for run in range(3):
        w = rnd(10, 6, 3, 3)
        out = sess.run(None, {"x": x, "w": w})
        assert_close(out, run_oracle(model, {"x": x, "w": w}), rtol=1e-4, atol=1e-4)
    buf = w.copy()
    first = sess.run(None, {"x": x, "w": buf})[0]
    buf *= -1  # the same array, written in place: read again (a plan keeps only weights it owns)
    second = sess.run(None, {"x": x, "w": buf})[0]
    assert_close([second], run_oracle(model, {"x": x, "w": buf}), rtol=1e-4, atol=1e-4)
    assert not np.array_equal(first, second)
