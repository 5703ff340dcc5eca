"""The guide's delegating provider (section 6) works as printed: extracted from
``docs/writing-a-provider.md``, installed into a temporary folder, it runs a CNN and a
transformer block through onnxruntime with ``partition.to_model()``, and passes a part of the
conformance kit with no node declined for a missing type."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import runtime_core as rt
from runtime_core.plugin import reload_plugins
from runtime_core.testing import ConformanceKit

pytest.importorskip("onnxruntime")  # the example's back end: without it there is nothing to delegate to

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "writing-a-provider.md"
EXAMPLE = re.compile(r"<!-- example: (\S+) -->\n```\w*\n(.*?)```", re.S)
RNG = np.random.default_rng(11)


@pytest.fixture
def ortdelegate(tmp_path, monkeypatch):
    ((path, source),) = EXAMPLE.findall(GUIDE.read_text(encoding="utf-8"))
    assert path == "runtime_provider_ortdelegate.py"
    site = tmp_path / "site"
    info = site / "runtime_provider_ortdelegate-0.1.0.dist-info"
    info.mkdir(parents=True)
    (site / path).write_text(source)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: runtime-provider-ortdelegate\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[runtime_core.providers]\nortdelegate = runtime_provider_ortdelegate\n")
    monkeypatch.syspath_prepend(str(site))
    sys.modules.pop("runtime_provider_ortdelegate", None)
    reload_plugins()
    yield "OrtDelegateExecutionProvider"
    monkeypatch.undo()
    reload_plugins()


def _init(name, *shape):
    return nh.from_array((RNG.standard_normal(shape) * 0.3).astype(np.float32), name)


def _cnn():
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             h.make_node("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             h.make_node("BatchNormalization", ["c2", "g", "bt", "m", "v"], ["bn"]),
             h.make_node("Relu", ["bn"], ["r2"]), h.make_node("GlobalAveragePool", ["r2"], ["gp"]),
             h.make_node("Flatten", ["gp"], ["f"]), h.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1)]
    inits = [_init("w1", 4, 3, 3, 3), _init("b1", 4), _init("w2", 6, 4, 3, 3), _init("g", 6), _init("bt", 6),
             _init("m", 6), nh.from_array(np.full(6, 0.9, np.float32), "v"), _init("fw", 5, 6), _init("fb", 5)]
    g = h.make_graph(nodes, "cnn", [h.make_tensor_value_info("x", T.FLOAT, ["N", 3, 8, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["N", 5])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m, {"x": RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)}


def _transformer_block():
    """Self-attention + residual + LayerNorm + MLP, written as the exporters write it: at
    ORT_ENABLE_ALL the core's optimizer fuses parts into com.microsoft ops."""
    d, heads = 8, 2
    dh = d // heads

    def split(name, src):
        return [h.make_node("MatMul", [src, f"w{name}"], [f"{name}0"]),
                h.make_node("Add", [f"{name}0", f"b{name}"], [f"{name}1"]),
                h.make_node("Reshape", [f"{name}1", "hshape"], [f"{name}2"]),
                h.make_node("Transpose", [f"{name}2"], [f"{name}3"], perm=[0, 2, 1, 3])]

    nodes = split("q", "x") + split("k", "x") + split("v", "x") + [
        h.make_node("Transpose", ["k3"], ["kt"], perm=[0, 1, 3, 2]),
        h.make_node("MatMul", ["q3", "kt"], ["s0"]), h.make_node("Div", ["s0", "scale"], ["s1"]),
        h.make_node("Softmax", ["s1"], ["p"], axis=-1), h.make_node("MatMul", ["p", "v3"], ["o0"]),
        h.make_node("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
        h.make_node("Reshape", ["o1", "dshape"], ["o2"]),
        h.make_node("MatMul", ["o2", "wo"], ["o3"]), h.make_node("Add", ["o3", "bo"], ["o4"]),
        h.make_node("Add", ["o4", "x"], ["res"]),
        h.make_node("LayerNormalization", ["res", "lg", "lb"], ["ln"], axis=-1, epsilon=1e-5),
        h.make_node("MatMul", ["ln", "w1"], ["h0"]), h.make_node("Add", ["h0", "b1"], ["h1"]),
        h.make_node("Relu", ["h1"], ["h2"]), h.make_node("MatMul", ["h2", "w2"], ["h3"]),
        h.make_node("Add", ["h3", "b2"], ["y"])]
    inits = [_init(f"w{n}", d, d) for n in "qkvo"] + [_init(f"b{n}", d) for n in "qkvo"] + [
        nh.from_array(np.array([0, 0, heads, dh], np.int64), "hshape"),
        nh.from_array(np.array([0, 0, d], np.int64), "dshape"),
        nh.from_array(np.array(np.sqrt(dh), np.float32), "scale"), _init("lg", d), _init("lb", d),
        _init("w1", d, 16), _init("b1", 16), _init("w2", 16, d), _init("b2", d)]
    g = h.make_graph(nodes, "block", [h.make_tensor_value_info("x", T.FLOAT, [2, 5, d])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2, 5, d])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m, {"x": RNG.standard_normal((2, 5, d)).astype(np.float32)}


@pytest.mark.parametrize("build", [_cnn, _transformer_block])
@pytest.mark.parametrize("level", [rt.GraphOptimizationLevel.ORT_DISABLE_ALL, rt.GraphOptimizationLevel.ORT_ENABLE_ALL])
def test_the_example_runs_models_through_onnxruntime(ortdelegate, build, level):
    model, feeds = build()
    so = rt.SessionOptions()
    so.graph_optimization_level = level
    so.log_severity_level = 3
    sess = rt.InferenceSession(model.SerializeToString(), so, providers=["ortdelegate", "cpu"])
    report = sess.get_partition_report()
    assert {n.provider for n in report.nodes} == {ortdelegate}, str(report)
    assert len({n.partition for n in report.nodes}) == 1  # one delegate session for the whole graph
    ref = rt.InferenceSession(model.SerializeToString(), providers=["cpu"]).run(None, feeds)
    got = sess.run(None, feeds)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-4, atol=1e-5)


def test_the_example_passes_a_part_of_the_kit(ortdelegate):
    k = ConformanceKit("ortdelegate", pattern=r"^node/test_(add|relu|if|loop11|conv_with_strides_padding|"
                                              r"layer_normalization_2d_axis0|gather_0|sequence_map_add_2_sequences)$")
    ok = k.run_all()
    assert ok, k.summary()
    assert len(k.claimed_cases()) >= 6, k.summary()
    untyped = [r for e in k.scan() for r in e.declined.values() if "is unknown" in r]
    assert not untyped, untyped
