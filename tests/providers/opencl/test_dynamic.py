"""Symbolic dims: nodes are claimed with their ranks and dtypes known, and the executable
specializes per run for the actual input shapes (and the host values of shape inputs)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from oracle import assert_close, make_model, run_oracle

from opencl_helpers import CPU, OCL, TEST_PLATFORM, node_view, placement, requires_pocl, session, vi

pytestmark = requires_pocl

rng = np.random.default_rng(5)


def w(*shape, scale=0.3):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def symbolic(model, dims: dict):
    """Replace input dims by names: ``{input: {axis: name}}``."""
    for inp in model.graph.input:
        for axis, name in dims.get(inp.name, {}).items():
            d = inp.type.tensor_type.shape.dim[axis]
            d.Clear()
            d.dim_param = name
    return model


def no_opt():
    import runtime_core as rt

    so = rt.SessionOptions()
    so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    return so


def exporter_style_model():
    """Conv -> Relu -> (Shape -> Gather -> Unsqueeze -> Concat) -> Reshape -> MatMul -> Softmax
    with a symbolic batch: the shape computation is int64 (CPU), everything else OpenCL."""
    x = w(2, 3, 6, 6, scale=1.0)
    n = helper.make_node
    nodes = [n("Conv", ["x", "cw", "cb"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             n("Relu", ["c"], ["r"], name="relu"),
             n("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
             n("Shape", ["p"], ["shp"], name="shape"),
             n("Gather", ["shp", "zero"], ["batch"], name="gather", axis=0),
             n("Unsqueeze", ["batch", "axes0"], ["batch1"], name="unsqueeze"),
             n("Concat", ["batch1", "minus1"], ["new_shape"], name="concat", axis=0),
             n("Reshape", ["p", "new_shape"], ["flat"], name="reshape"),
             n("MatMul", ["flat", "fw"], ["logits"], name="fc"),
             n("Softmax", ["logits"], ["y"], name="softmax", axis=-1)]
    inits = {"cw": w(4, 3, 3, 3), "cb": w(4), "zero": np.array(0, np.int64),
             "axes0": np.array([0], np.int64), "minus1": np.array([-1], np.int64), "fw": w(36, 5)}
    model = make_model(nodes, {"x": x}, ["y"], initializers=inits)
    return symbolic(model, {"x": {0: "N"}})


def test_symbolic_batch_runs_on_opencl_for_every_batch():
    model = exporter_style_model()
    sess = session(model, sess_options=no_opt())
    where = placement(sess)
    assert {k: v for k, v in where.items() if v == OCL} == {
        "conv": OCL, "relu": OCL, "pool": OCL, "shape": OCL, "reshape": OCL, "fc": OCL, "softmax": OCL}
    assert where["gather"] == where["unsqueeze"] == where["concat"] == CPU
    for batch in (2, 5, 1, 2):
        feeds = {"x": w(batch, 3, 6, 6, scale=1.0)}
        out = sess.run(None, feeds)
        assert out[0].shape == (batch, 5)
        assert_close(out, run_oracle(model, feeds), 1e-3, 1e-3)
    copies = {c.value for c in sess.get_partition_report().copies}
    # only the feed, the 8-byte... shape values and the result cross; the activations never do
    assert copies <= {"x", "shp", "new_shape", "y"} and "p" not in copies


def test_symbolic_batch_with_the_default_optimizer():
    model = exporter_style_model()
    sess = session(model)
    heavy = {n.name: n.provider for n in sess.get_partition_report().nodes
             if n.op_type in ("Conv", "MatMul", "Gemm", "Softmax", "MaxPool")}
    assert heavy and set(heavy.values()) == {OCL}
    for batch in (3, 1):
        feeds = {"x": w(batch, 3, 6, 6, scale=1.0)}
        assert_close(sess.run(None, feeds), run_oracle(model, feeds), 1e-3, 1e-3)


def _relu_partition(provider, dims=("N", 4)):
    from runtime_core.plugin import Partition

    x, y = vi("x", dims), vi("y", dims)
    node = node_view("Relu", [x], [y], since=14)
    return provider.compile(Partition(0, provider.name, (node,), ("x",), ("y",), {}, {"x": x, "y": y}))


def test_specializations_are_cached_in_a_small_lru(provider):
    from runtime_provider_opencl.executable import LRU_SIZE

    exe = _relu_partition(provider)
    assert exe.specializations == 0  # nothing is known before the first run
    for n in list(range(1, LRU_SIZE + 3)) + [LRU_SIZE + 2, LRU_SIZE + 1]:
        x = w(n, 4, scale=1.0)
        (y,) = exe.run([provider.copy_to_device(x)])
        np.testing.assert_array_equal(provider.copy_to_host(y), np.maximum(x, 0))
    # one build per distinct shape; the two repeats hit the cache
    assert exe.specializations == LRU_SIZE + 2
    assert len(exe._cache) == LRU_SIZE
    x = w(1, 4, scale=1.0)  # evicted: built again
    exe.run([provider.copy_to_device(x)])
    assert exe.specializations == LRU_SIZE + 3


def test_static_dims_of_a_symbolic_input_are_still_checked(provider):
    exe = _relu_partition(provider)
    with pytest.raises(ValueError, match="compiled for"):
        exe.run([provider.copy_to_device(w(2, 5))])


def test_empty_batch_falls_back_to_the_cpu_kernel(provider):
    exe = _relu_partition(provider)
    (y,) = exe.run([provider.copy_to_device(np.zeros((0, 4), np.float32))])
    assert provider.copy_to_host(y).shape == (0, 4)
    assert exe.host_fallbacks and "empty" in exe.host_fallbacks[0][1]
    exe.run([provider.copy_to_device(w(3, 4))])
    assert exe.host_fallbacks == ()


def test_reshape_to_a_shape_fed_at_run_time():
    """The Reshape's target is a model input: its value is read from the host mirror made
    when it was copied to the device (no download), and each value gets its own build."""
    x = w(2, 12, scale=1.0)
    n = helper.make_node
    nodes = [n("Relu", ["x"], ["r"], name="relu"), n("Reshape", ["r", "s"], ["t"], name="reshape"),
             n("Softmax", ["t"], ["y"], name="softmax", axis=-1)]
    model = make_model(nodes, {"x": x, "s": np.array([2, 3, 4], np.int64)}, ["y"])
    sess = session(model, sess_options=no_opt())
    where = placement(sess)
    assert where == {"relu": OCL, "reshape": OCL, "softmax": OCL}
    from runtime_provider_opencl.device import get_context, select_device

    dev = get_context(select_device(TEST_PLATFORM))
    for shape in ([2, 3, 4], [4, 3, 2], [-1, 2, 1], [2, 3, 4]):
        feeds = {"x": x, "s": np.array(shape, np.int64)}
        before = dev.transfers["downloads"]
        out = sess.run(None, feeds)
        assert dev.transfers["downloads"] - before == 1  # the result only: the shape is not read back
        assert_close(out, run_oracle(model, feeds), 1e-5, 1e-6)


def test_a_target_of_unknown_length_leaves_its_consumers_rank_unknown():
    x = w(2, 12, scale=1.0)
    n = helper.make_node
    nodes = [n("Reshape", ["x", "s"], ["t"], name="reshape"), n("Softmax", ["t"], ["y"], name="softmax", axis=-1)]
    model = symbolic(make_model(nodes, {"x": x, "s": np.array([2, 3, 4], np.int64)}, ["y"]), {"s": {0: "R"}})
    sess = session(model, sess_options=no_opt())
    rep = {n.name: n for n in sess.get_partition_report().nodes}
    assert rep["reshape"].provider == OCL and rep["softmax"].provider == CPU
    assert "not even its rank" in rep["softmax"].declined[OCL]
    for shape in ([4, 6], [2, 3, 2, 2]):
        feeds = {"x": x, "s": np.array(shape, np.int64)}
        assert_close(sess.run(None, feeds), run_oracle(model, feeds), 1e-5, 1e-6)


def test_an_unknown_rank_is_declined_with_a_reason():
    from runtime_provider_opencl import ops  # noqa: F401
    from runtime_provider_opencl.plugin import decline_reason
    from runtime_provider_opencl.registry import REGISTRY

    node = node_view("Softmax", [vi("x", None)], [vi("y", None)], since=13, attrs={"axis": -1})
    assert "not even its rank" in decline_reason(node, REGISTRY["Softmax"])
    # elementwise ops work at any rank: claimed, the rank is known when the partition specializes
    assert decline_reason(node_view("Relu", [vi("x", None)], [vi("y", None)], since=14), REGISTRY["Relu"]) is None


def test_threads_with_different_batches_share_one_session():
    from concurrent.futures import ThreadPoolExecutor

    model = exporter_style_model()
    sess = session(model, sess_options=no_opt())
    feeds = [{"x": w(b, 3, 6, 6, scale=1.0)} for b in (1, 2, 3, 4) * 3]
    expect = [run_oracle(model, f) for f in feeds]
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda f: sess.run(None, f), feeds))
    for o, e in zip(outs, expect):
        assert_close(o, e, 1e-3, 1e-3)
