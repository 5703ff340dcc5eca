"""The EXTENDED-level QDQ fusions (``runtime_core/optimizer/qdq_fusions.py``): on QDQ models made
by ``runtime_core.quantization.quantize_static`` (a tiny CNN, per tensor and per channel, and a
tiny MatMul model), ``DQ -> Conv/MatMul -> Q`` groups become QLinearConv / QLinearMatMul, and
``DQ x 2 -> Add -> Q`` QLinearAdd, and the outputs stay within one quantization step of the unfused
model and of onnxruntime."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the test oracle")

sys.path.insert(0, str(Path(__file__).parent))
import quant_models as M  # noqa: E402

import runtime_core as rt  # noqa: E402
from runtime_core import quantization as rq  # noqa: E402

L = rt.GraphOptimizationLevel


class Reader:
    def __init__(self, feeds):
        self.it = iter(feeds)

    def get_next(self):
        return next(self.it, None)


def matmul_model() -> onnx.ModelProto:
    """MatMul by a constant [16, 12] weight, Relu, MatMul by [12, 5]."""
    r = np.random.default_rng(3)
    inits = [nh.from_array(r.normal(0, 0.4, (16, 12)).astype(np.float32), "W1"),
             nh.from_array(r.normal(0, 0.4, (12, 5)).astype(np.float32), "W2")]
    nodes = [h.make_node("MatMul", ["x", "W1"], ["m1"], "mm1"), h.make_node("Relu", ["m1"], ["r"], "relu"),
             h.make_node("MatMul", ["r", "W2"], ["y"], "mm2")]
    g = h.make_graph(nodes, "mm", [h.make_tensor_value_info("x", T.FLOAT, ["N", 16])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["N", 5])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def mm_feeds(n, seed=5):
    r = np.random.default_rng(seed)
    return [{"x": r.normal(0, 1, (3, 16)).astype(np.float32)} for _ in range(n)]


def out_scale(model: onnx.ModelProto, out: str) -> float:
    """The scale of the DequantizeLinear producing the graph output ``out``."""
    inits = {t.name: nh.to_array(t) for t in model.graph.initializer}
    dq = next(n for n in model.graph.node if out in n.output)
    assert dq.op_type == "DequantizeLinear"
    return float(np.max(inits[dq.input[1]]))


def session(path, level):
    so = rt.SessionOptions()
    so.graph_optimization_level = level
    return rt.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("kind,per_channel", [("cnn", False), ("cnn", True), ("matmul", False), ("matmul", True)])
def test_qdq_groups_fuse_within_a_step(kind, per_channel, tmp_path):
    src, feeds = (M.cnn(), M.cnn_feeds(5)) if kind == "cnn" else (matmul_model(), mm_feeds(5))
    q = tmp_path / "q.onnx"
    logging.disable(logging.WARNING)
    try:
        rq.quantize_static(src, q, Reader(feeds[:4]), quant_format=rq.QuantFormat.QDQ, per_channel=per_channel,
                           activation_type=rq.QuantType.QUInt8, weight_type=rq.QuantType.QInt8)
    finally:
        logging.disable(logging.NOTSET)
    model = onnx.load(str(q))
    step = out_scale(model, "y")
    fused = session(q, L.ORT_ENABLE_EXTENDED)
    ops = [n.op_type for n in fused._graph.nodes]
    want = {"cnn": ("QLinearConv", 2), "matmul": ("QLinearMatMul", 2)}[kind]
    assert ops.count(want[0]) == want[1], ops
    assert "Conv" not in ops and "MatMul" not in ops
    plain = session(q, L.ORT_DISABLE_ALL)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    oracle = ort.InferenceSession(str(q), so, providers=["CPUExecutionProvider"])  # ORT fuses these too
    for feed in feeds:
        got, unfused, theirs = fused.run(None, feed)[0], plain.run(None, feed)[0], oracle.run(None, feed)[0]
        assert np.max(np.abs(got - unfused)) <= step * 1.001
        assert np.max(np.abs(got - theirs)) <= step * 1.001


def test_not_fused_when_the_product_has_another_reader(tmp_path):
    # the first MatMul's float output is also a graph output: that group stays as written
    q = tmp_path / "q.onnx"
    logging.disable(logging.WARNING)
    try:
        rq.quantize_static(matmul_model(), q, Reader(mm_feeds(2)), quant_format=rq.QuantFormat.QDQ)
    finally:
        logging.disable(logging.NOTSET)
    m = onnx.load(str(q))
    mm = next(n for n in m.graph.node if n.op_type == "MatMul")
    m.graph.output.append(h.make_tensor_value_info(mm.output[0], T.FLOAT, None))
    q2 = tmp_path / "q2.onnx"
    onnx.save(m, str(q2))
    ops = [n.op_type for n in session(q2, L.ORT_ENABLE_EXTENDED)._graph.nodes]
    assert ops.count("MatMul") == 1 and ops.count("QLinearMatMul") == 1, ops
    feed = mm_feeds(1)[0]
    got, want = session(q2, L.ORT_ENABLE_EXTENDED).run(None, feed), session(q2, L.ORT_DISABLE_ALL).run(None, feed)
    # the float product's kernel is chosen per session by measurement: equal to float32 rounding
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tool", ["ours", "onnxruntime"])
def test_residual_add_and_head_fuse(tool, tmp_path):
    """The residual ``DQ + DQ -> Add -> Q`` of a CNN quantized by either tool (uint8 and int8
    activations) becomes QLinearAdd and its ``DQ -> Gemm -> Q`` head QGemm; outputs within a step
    of the unfused model and of onnxruntime."""
    feeds = M.cnn_feeds(5)
    for act in ("QUInt8", "QInt8"):
        q = tmp_path / f"{tool}_{act}.onnx"
        if tool == "ours":
            tq = rq
        else:
            tq = pytest.importorskip("onnxruntime.quantization")
        logging.disable(logging.WARNING)
        try:
            tq.quantize_static(M.cnn(), str(q), Reader(feeds[:4]), quant_format=tq.QuantFormat.QDQ,
                               per_channel=True, activation_type=getattr(tq.QuantType, act),
                               weight_type=tq.QuantType.QInt8)
        finally:
            logging.disable(logging.NOTSET)
        model = onnx.load(str(q))
        step = out_scale(model, "y")
        fused = session(q, L.ORT_ENABLE_EXTENDED)
        ops = [n.op_type for n in fused._graph.nodes]
        assert ops.count("QLinearAdd") == 1 and "Add" not in ops, ops
        assert ops.count("QGemm") == 1 and "Gemm" not in ops, ops
        plain = session(q, L.ORT_DISABLE_ALL)
        so = ort.SessionOptions()
        so.log_severity_level = 3
        oracle = ort.InferenceSession(str(q), so, providers=["CPUExecutionProvider"])
        for feed in feeds:
            got, unfused, theirs = fused.run(None, feed)[0], plain.run(None, feed)[0], oracle.run(None, feed)[0]
            assert np.max(np.abs(got - unfused)) <= step * 1.001
            assert np.max(np.abs(got - theirs)) <= step * 1.001


def test_add_not_fused_across_types(tmp_path):
    """A QDQ Add whose operands are quantized to different types stays in float (QLinearAdd takes
    one type): the rewrite declines rather than emitting an op that cannot run."""
    x = h.make_tensor_value_info("x", T.FLOAT, [2, 3])
    inits = [nh.from_array(np.array(0.05, np.float32), "s"), nh.from_array(np.array(3, np.int8), "z8"),
             nh.from_array(np.array(120, np.uint8), "zu")]
    nodes = [h.make_node("QuantizeLinear", ["x", "s", "z8"], ["qa"]), h.make_node("QuantizeLinear", ["x", "s", "zu"], ["qb"]),
             h.make_node("DequantizeLinear", ["qa", "s", "z8"], ["da"]), h.make_node("DequantizeLinear", ["qb", "s", "zu"], ["db"]),
             h.make_node("Add", ["da", "db"], ["a"]), h.make_node("QuantizeLinear", ["a", "s", "z8"], ["qy"]),
             h.make_node("DequantizeLinear", ["qy", "s", "z8"], ["y"])]
    g = h.make_graph(nodes, "g", [x], [h.make_tensor_value_info("y", T.FLOAT, [2, 3])], inits)
    p = tmp_path / "m.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8), str(p))
    fused = session(p, L.ORT_ENABLE_EXTENDED)
    assert "QLinearAdd" not in [n.op_type for n in fused._graph.nodes]
    feed = {"x": np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3)}
    np.testing.assert_array_equal(fused.run(None, feed)[0], session(p, L.ORT_DISABLE_ALL).run(None, feed)[0])


def gap_model() -> onnx.ModelProto:
    """Conv-Relu-GlobalAveragePool-Flatten-Gemm, 3x10x10 input: a CNN's pooled head."""
    r = np.random.default_rng(7)
    inits = [nh.from_array(r.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "W"),
             nh.from_array(r.normal(0, 0.1, (8,)).astype(np.float32), "B"),
             nh.from_array(r.normal(0, 0.3, (5, 8)).astype(np.float32), "Wf")]
    nodes = [h.make_node("Conv", ["x", "W", "B"], ["c"], "conv", pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c"], ["r"], "relu"), h.make_node("GlobalAveragePool", ["r"], ["p"], "gap"),
             h.make_node("Flatten", ["p"], ["f"], "flat"), h.make_node("Gemm", ["f", "Wf"], ["y"], "fc", transB=1)]
    g = h.make_graph(nodes, "gap", [h.make_tensor_value_info("x", T.FLOAT, ["N", 3, 10, 10])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["N", 5])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def quantize_qdq(tool, model, path, feeds, act):
    """``quantize_static`` QDQ, per-channel int8 weights, ``act`` activations, by our tool or
    onnxruntime's, into ``path``."""
    tq = rq if tool == "ours" else pytest.importorskip("onnxruntime.quantization")
    logging.disable(logging.WARNING)
    try:
        tq.quantize_static(model, str(path), Reader(feeds), quant_format=tq.QuantFormat.QDQ, per_channel=True,
                           activation_type=getattr(tq.QuantType, act), weight_type=tq.QuantType.QInt8)
    finally:
        logging.disable(logging.NOTSET)


def within_a_step(path, model, fused, feeds):
    """``fused``'s output on every feed within one output step of the unfused model's and of
    onnxruntime's."""
    step = out_scale(model, "y")
    plain = session(path, L.ORT_DISABLE_ALL)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    oracle = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    for feed in feeds:
        got = fused.run(None, feed)[0]
        assert np.max(np.abs(got - plain.run(None, feed)[0])) <= step * 1.001
        assert np.max(np.abs(got - oracle.run(None, feed)[0])) <= step * 1.001


@pytest.mark.parametrize("tool", ["ours", "onnxruntime"])
def test_global_average_pool_fuses(tool, tmp_path):
    """``DQ -> GlobalAveragePool -> Q`` of a model quantized by either tool (int8 activations)
    becomes QLinearGlobalAveragePool (and the bias-less head QGemm); outputs within a step of the
    unfused model and of onnxruntime."""
    r = np.random.default_rng(8)
    feeds = [{"x": r.normal(0, 1, (2, 3, 10, 10)).astype(np.float32)} for _ in range(4)]
    q = tmp_path / "q.onnx"
    quantize_qdq(tool, gap_model(), q, feeds[:3], "QInt8")
    model = onnx.load(str(q))
    ops = [n.op_type for n in session(q, L.ORT_ENABLE_EXTENDED)._graph.nodes]
    assert ops.count("QLinearGlobalAveragePool") == 1 and "GlobalAveragePool" not in ops, ops
    assert ops.count("QGemm") == 1 and "Gemm" not in ops, ops
    within_a_step(q, model, session(q, L.ORT_ENABLE_EXTENDED), feeds)


def pool_model() -> onnx.ModelProto:
    """Conv-Relu-MaxPool(3x3, stride 2, padded)-Conv, 3x12x12 input: a ResNet stem."""
    r = np.random.default_rng(11)
    inits = [nh.from_array(r.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "W1"),
             nh.from_array(r.normal(0, 0.3, (4, 8, 1, 1)).astype(np.float32), "W2")]
    nodes = [h.make_node("Conv", ["x", "W1"], ["c"], "conv1", pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c"], ["r"], "relu"),
             h.make_node("MaxPool", ["r"], ["p"], "pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             h.make_node("Conv", ["p", "W2"], ["y"], "conv2")]
    g = h.make_graph(nodes, "pool", [h.make_tensor_value_info("x", T.FLOAT, ["N", 3, 12, 12])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["N", 4, 6, 6])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("tool,act", [("ours", "QInt8"), ("ours", "QUInt8"), ("onnxruntime", "QInt8")])
def test_maxpool_runs_on_the_codes(tool, act, tmp_path):
    """``DQ -> MaxPool -> Q`` with the same scale and zero point on both sides becomes a MaxPool of
    the 8-bit codes (no float round trip); outputs within a step of the unfused model and of
    onnxruntime."""
    r = np.random.default_rng(12)
    feeds = [{"x": r.normal(0, 1, (2, 3, 12, 12)).astype(np.float32)} for _ in range(4)]
    q = tmp_path / "q.onnx"
    quantize_qdq(tool, pool_model(), q, feeds[:3], act)
    model = onnx.load(str(q))
    fused = session(q, L.ORT_ENABLE_EXTENDED)
    pools = [n for n in fused._graph.nodes if n.op_type == "MaxPool"]
    assert len(pools) == 1, [n.op_type for n in fused._graph.nodes]
    src = next((n for n in fused._graph.nodes if pools[0].inputs[0] in n.outputs), None)
    assert src is not None and src.op_type == "QLinearConv", src
    within_a_step(q, model, fused, feeds)


@pytest.mark.parametrize("change", ["scale", "zero_point"])
def test_maxpool_kept_in_float_when_requantized(change, tmp_path):
    """A QuantizeLinear after MaxPool with another scale or zero point than the DequantizeLinear
    before it requantizes: the MaxPool stays in float and the result equals the unfused model's."""
    inits = [nh.from_array(np.array(0.05, np.float32), "s"), nh.from_array(np.array(3, np.int8), "z"),
             nh.from_array(np.array(0.07 if change == "scale" else 0.05, np.float32), "s2"),
             nh.from_array(np.array(3 if change == "scale" else -2, np.int8), "z2")]
    nodes = [h.make_node("QuantizeLinear", ["x", "s", "z"], ["qx"]), h.make_node("DequantizeLinear", ["qx", "s", "z"], ["dx"]),
             h.make_node("MaxPool", ["dx"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             h.make_node("QuantizeLinear", ["p", "s2", "z2"], ["qp"]), h.make_node("DequantizeLinear", ["qp", "s2", "z2"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 2, 4, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 2, 2, 2])], inits)
    p = tmp_path / "m.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8), str(p))
    fused = session(p, L.ORT_ENABLE_EXTENDED)
    pool = next(n for n in fused._graph.nodes if n.op_type == "MaxPool")
    assert next(n for n in fused._graph.nodes if pool.inputs[0] in n.outputs).op_type == "DequantizeLinear"
    feed = {"x": np.linspace(-5, 5, 32, dtype=np.float32).reshape(1, 2, 4, 4)}
    np.testing.assert_array_equal(fused.run(None, feed)[0], session(p, L.ORT_DISABLE_ALL).run(None, feed)[0])
