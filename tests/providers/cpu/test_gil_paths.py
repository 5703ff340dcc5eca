"""The per-step shortcuts that keep a run's Python (the GIL-held part of a run) short: each one
must give exactly what the checked path gives, and fall back to it for any other input.

* a MatMul by a constant weight is bound after the first run (the Linear plan run straight);
* the Linear's last plan runs straight on the node's repeated row shape (``linear_hit``);
* SkipLayerNormalization (in place) and BiasGelu (in place) call their compiled pass straight;
* kernels skip their own ``np.errstate`` inside a run (``ignore_fp``), never outside one;
* ``broadcast_shape`` is ``np.broadcast_shapes`` for two shapes (the in-place Add, Mul, ...)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

from oracle import assert_close, compiled_partitions, cpu_session, make_model, run_oracle

from runtime_provider_cpu.execution.step import FP_IGNORED
from runtime_provider_cpu.fast.policy import NATIVE
from runtime_provider_cpu.ops._common import broadcast_shape, ignore_fp

RNG = np.random.default_rng(20261207)
#: the shortcuts are the compiled kernels' (RUNTIME_CORE_CPU_NATIVE=0: numpy's path, nothing bound)
COMPILED = NATIVE is not None


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _steps(sess, op_type):
    return [st for exe in compiled_partitions(sess) for st in exe.run_steps if st[1].node.op_type == op_type]


def _dyn_model(nodes, inputs, outputs, inits, domains=()):
    """A model whose inputs have a symbolic first dim ("B"), so that one session sees several shapes."""
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", *shape[1:]]) for n, shape in inputs.items()]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
    g = helper.make_graph(nodes, "g", ins, outs,
                          initializer=[helper.make_tensor(k, TensorProto.FLOAT, v.shape, v.ravel())
                                       for k, v in inits.items()])
    opsets = [helper.make_opsetid("", 17)] + [helper.make_opsetid(d, 1) for d in domains]
    model = helper.make_model(g, opset_imports=opsets)
    model.ir_version = 8
    return model


def test_matmul_by_a_constant_weight_is_bound_and_follows_new_shapes():
    w = rnd(32, 48)
    model = _dyn_model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Tanh", ["m"], ["y"])],
                       {"x": (2, 16, 32)}, ["y"], {"w": w})
    sess = cpu_session(model, threads=1)
    x0 = rnd(2, 16, 32)
    first = sess.run(None, {"x": x0})[0]  # the kernel's own path (and the plan's choice)
    assert_close([first], run_oracle(model, {"x": x0}), rtol=1e-4, atol=1e-4)
    (st,) = _steps(sess, "MatMul")
    assert ("bound" in st[0].__qualname__ and st[4] == {}) is COMPILED
    assert np.array_equal(sess.run(None, {"x": x0})[0], first)  # the bound call: the same bits
    for shape in [(3, 16, 32), (1, 16, 32), (2, 16, 32)]:  # other row counts go to the kernel
        x = rnd(*shape)
        assert_close(sess.run(None, {"x": x}), run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-4)


def test_matmul_by_a_weight_fed_at_run_time_is_not_bound():
    x, w = rnd(4, 32), rnd(32, 24)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": x, "w": w}, ["y"])
    sess = cpu_session(model, threads=1)
    for _ in range(3):
        x, w = rnd(4, 32), rnd(32, 24)
        assert_close(sess.run(None, {"x": x, "w": w}), run_oracle(model, {"x": x, "w": w}), rtol=1e-4, atol=1e-4)
    (st,) = _steps(sess, "MatMul")
    assert "bound" not in st[0].__qualname__


def test_linear_last_plan_runs_straight_and_rechecks_its_inputs():
    # Gemm with transB reads its weight transposed through the Linear; the same row shape again
    # takes the cached plan, another one the checked path
    from runtime_provider_cpu.fast import linear as fast_linear

    w, c = rnd(40, 32), rnd(40)
    model = _dyn_model([helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=1)], {"x": (8, 32)}, ["y"],
                       {"w": w, "c": c})
    sess = cpu_session(model, threads=1)
    x = rnd(8, 32)
    first = sess.run(None, {"x": x})[0]
    (st,) = _steps(sess, "Gemm")
    hit = st[1].cache.get("linear_hit")
    if hit is None:
        pytest.skip("no compiled Linear here (numpy's path)")
    assert hit[2] == (8, 32) and hit[1]
    assert np.array_equal(sess.run(None, {"x": x})[0], first)
    for rows in (3, 8, 17):
        x = rnd(rows, 32)
        assert_close(sess.run(None, {"x": x}), run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-4)
    # a float64 input of the cached shape is not the plan's: None (numpy's path), not a wrong call
    assert fast_linear.linear(st[1], rnd(8, 32).astype(np.float64), w, True) is None


@pytest.mark.parametrize("b_shape", [(1, 64), (1, 1)])  # skip the batch's shape, or one row broadcast
def test_skip_layer_norm_and_bias_gelu_in_place_repeat_runs(b_shape):
    H = 64
    inits = {"w1": rnd(H, H) * 0.2, "w2": rnd(H, 96) * 0.2, "g": rnd(H), "be": rnd(H), "bi": rnd(H),
             "b2": rnd(96)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m"]),
             helper.make_node("SkipLayerNormalization", ["m", "skip", "g", "be", "bi"], ["n"], domain="com.microsoft",
                              epsilon=1e-5),
             helper.make_node("MatMul", ["n", "w2"], ["h"]),
             helper.make_node("BiasGelu", ["h", "b2"], ["y"], domain="com.microsoft")]
    model = _dyn_model(nodes, {"x": (3, 8, H), "skip": (3, 8, H)}, ["y"], inits, domains=("com.microsoft",))
    sess = cpu_session(model, threads=1)
    feeds = {"x": rnd(3, 8, H), "skip": rnd(3, 8, H)}
    first = sess.run(None, feeds)[0]
    assert_close([first], run_oracle(model, feeds), rtol=1e-4, atol=1e-4)
    for _ in range(2):  # the compiled calls straight: the same bits as the checked path
        assert np.array_equal(sess.run(None, {k: v.copy() for k, v in feeds.items()})[0], first)
    (sln,) = _steps(sess, "SkipLayerNormalization")
    assert sln[6] is not None  # the in-place variant ran the node
    assert ("skip_ln_fast" in sln[1].cache) is COMPILED
    for B in (1, 5, 3):
        feeds = {"x": rnd(B, 8, H), "skip": rnd(B, 8, H)}
        assert_close(sess.run(None, feeds), run_oracle(model, feeds), rtol=1e-4, atol=1e-4)


def test_skip_layer_norm_fast_path_refuses_a_bad_skip():
    H = 16
    inits = {"w1": rnd(H, H), "g": rnd(H), "be": rnd(H)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m"]),
             helper.make_node("SkipLayerNormalization", ["m", "skip", "g", "be"], ["y"], domain="com.microsoft")]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 4, H]),
           helper.make_tensor_value_info("skip", TensorProto.FLOAT, ["S", 4, H])]
    g = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          initializer=[helper.make_tensor(k, TensorProto.FLOAT, v.shape, v.ravel())
                                       for k, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    sess = cpu_session(model, threads=1)
    feeds = {"x": rnd(2, 4, H), "skip": rnd(2, 4, H)}
    for _ in range(2):
        assert_close(sess.run(None, feeds), run_oracle(model, feeds), rtol=1e-4, atol=1e-4)
    with pytest.raises(Exception, match="skip of shape"):
        sess.run(None, {"x": rnd(2, 4, H), "skip": rnd(3, 4, H)})
    assert_close(sess.run(None, feeds), run_oracle(model, feeds), rtol=1e-4, atol=1e-4)


def test_ignore_fp_is_errstate_outside_a_run_and_nothing_inside():
    with np.errstate(all="warn"):
        with ignore_fp(over="ignore"):
            assert np.geterr()["over"] == "ignore" and np.geterr()["divide"] == "warn"
        with ignore_fp():
            assert set(np.geterr().values()) == {"ignore"}
        token = FP_IGNORED.set(True)
        try:
            with ignore_fp():
                assert np.geterr()["over"] == "warn"  # the run's own errstate is the one in force
        finally:
            FP_IGNORED.reset(token)
    assert FP_IGNORED.get() is False


def test_runs_stay_quiet_and_the_flag_ends_with_the_run():
    x = np.array([[1e30, -1.0, 0.0]], np.float32)
    model = make_model([helper.make_node("Mul", ["x", "x"], ["m"]), helper.make_node("Gelu", ["m"], ["g"],
                                                                                     domain="com.microsoft"),
                        helper.make_node("Div", ["g", "z"], ["y"])], {"x": x}, ["y"],
                       initializers={"z": np.zeros(3, np.float32)}, extra_opsets={"com.microsoft": 1})
    sess = cpu_session(model, threads=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = sess.run(None, {"x": x})[0]
    assert_close([out], run_oracle(model, {"x": x}))
    assert FP_IGNORED.get() is False


def test_broadcast_shape_matches_numpy():
    rng = np.random.default_rng(7)
    for _ in range(3000):
        a = tuple(int(d) for d in rng.integers(0, 4, rng.integers(0, 5)))
        b = tuple(int(d) for d in rng.integers(0, 4, rng.integers(0, 5)))
        try:
            ref = np.broadcast_shapes(a, b)
        except ValueError:
            ref = None
        assert broadcast_shape(a, b) == ref, (a, b)


@pytest.mark.parametrize("c_shape", [(24,), (1, 24), (6, 1), (6, 24), ()])
def test_gemm_bias_broadcast_in_place(c_shape):
    a, b = rnd(6, 10), rnd(10, 24)
    c = rnd(*c_shape) if c_shape else np.array(rnd(1)[0], np.float32)
    model = make_model([helper.make_node("Gemm", ["a", "b", "c"], ["y"], beta=0.5)], {"a": a}, ["y"],
                       initializers={"b": b, "c": c}, opset=13)
    assert_close(cpu_session(model, threads=1).run(None, {"a": a}), run_oracle(model, {"a": a}), rtol=1e-5,
                 atol=1e-5)


@pytest.mark.parametrize("shapes", [((5, 7), (7,)), ((5, 1), (1, 7)), ((2, 5, 7), (5, 7)), ((5, 7), (5, 7))])
def test_add_in_place_with_broadcast(shapes):
    sa, sb = shapes
    a, b = rnd(*sa), rnd(*sb)
    model = make_model([helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Add", ["r", "b"], ["y"])],
                       {"a": a, "b": b}, ["y"], opset=14)
    assert_close(cpu_session(model, threads=1).run(None, {"a": a, "b": b}), run_oracle(model, {"a": a, "b": b}))


@pytest.mark.parametrize("with_mask", [True, False])
def test_attention_repeat_runs_take_the_last_call_and_follow_the_mask(with_mask):
    B, S, H, heads = 2, 8, 64, 2
    inits = {"w": rnd(H, 3 * H) * 0.2, "b": rnd(3 * H)}
    ins = ["x", "w", "b"] + (["mask"] if with_mask else [])
    node = helper.make_node("Attention", ins, ["y"], domain="com.microsoft", num_heads=heads)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, H])]
    if with_mask:
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.INT32, [B, S]))
    g = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          initializer=[helper.make_tensor(k, TensorProto.FLOAT, v.shape, v.ravel())
                                       for k, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    sess = cpu_session(model, threads=1)

    def feeds():
        f = {"x": rnd(B, S, H)}
        if with_mask:
            f["mask"] = (RNG.random((B, S)) > 0.3).astype(np.int32)
        return f

    f0 = feeds()
    first = sess.run(None, f0)[0]
    assert_close([first], run_oracle(model, f0), rtol=1e-4, atol=1e-4)
    (st,) = _steps(sess, "Attention")
    if st[1].cache.get("mha", {}) and "numpy" not in st[1].cache["mha"].values():
        assert "attention_fast" in st[1].cache  # _native.mha ran: the next call takes it straight
    assert np.array_equal(sess.run(None, f0)[0], first)  # the same bits as the checked path
    for _ in range(3):  # new inputs and masks each run
        f = feeds()
        assert_close(sess.run(None, f), run_oracle(model, f), rtol=1e-4, atol=1e-4)
    if with_mask:
        with pytest.raises(Exception):
            sess.run(None, {"x": rnd(B, S, H), "mask": np.ones((B, S + 1), np.int32)})


def test_bound_matmul_takes_a_strided_input_through_the_kernel():
    # a Transpose's view is not C-contiguous: the bound call hands it to the kernel (which copies
    # it), the result is the reference's
    w = rnd(32, 40)
    model = _dyn_model([helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
                        helper.make_node("MatMul", ["t", "w"], ["m"]), helper.make_node("Tanh", ["m"], ["y"])],
                       {"x": (2, 32, 16)}, ["y"], {"w": w})
    sess = cpu_session(model, threads=1)
    for _ in range(3):
        x = rnd(2, 32, 16)
        assert_close(sess.run(None, {"x": x}), run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-4)
    (st,) = _steps(sess, "MatMul")
    assert ("bound" in st[0].__qualname__) is COMPILED
