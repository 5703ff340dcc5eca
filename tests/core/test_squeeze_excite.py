"""SqueezeExciteFusion: a squeeze-excite block (mean over H and W, 1x1 Conv, activation, 1x1
Conv, Sigmoid / HardSigmoid gate, Mul) -> runtime_core.fused::SqueezeExcite; its kernel and the
optimized model file against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import runtime_core as rt
from oracle import assert_close, make_model, run_oracle

L = rt.GraphOptimizationLevel
CPU = ["CPUExecutionProvider"]
RNG = np.random.default_rng(27)
C, CR = 24, 8


def f32(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


W1, B1 = f32(CR, C, 1, 1, scale=0.3), f32(CR, scale=0.1)
W2, B2 = f32(C, CR, 1, 1, scale=0.5), f32(C, scale=0.1)
WS = f32(C, C, 1, 1, scale=0.3)  # a stem 1x1 convolution: x becomes an intermediate


def se_nodes(x="x", out="y", pool="GlobalAveragePool", act="Relu", gate="HardSigmoid", swap=False, opset=17):
    nodes = []
    if pool == "GlobalAveragePool":
        nodes.append(helper.make_node("GlobalAveragePool", [x], ["p"]))
    elif opset >= 18:
        nodes.append(helper.make_node("ReduceMean", [x, "axes"], ["p"], keepdims=1))
    else:
        nodes.append(helper.make_node("ReduceMean", [x], ["p"], axes=[-2, -1], keepdims=1))
    nodes.append(helper.make_node("Conv", ["p", "w1", "b1"], ["c1"]))
    if act == "SiLU":
        nodes += [helper.make_node("Sigmoid", ["c1"], ["s1"]), helper.make_node("Mul", ["c1", "s1"], ["a1"])]
    elif act is None:
        nodes[-1].output[0] = "a1"
    else:
        nodes.append(helper.make_node(act, ["c1"], ["a1"]))
    nodes.append(helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"]))
    nodes.append(helper.make_node(gate, ["c2"], ["g"]))
    nodes.append(helper.make_node("Mul", ["g", x] if swap else [x, "g"], [out]))
    return nodes


def se_model(n=1, hw=5, stem=False, opset=17, **kw):
    feeds = {"x": f32(n, C, hw, hw)}
    inits = {"w1": W1, "b1": B1, "w2": W2, "b2": B2}
    nodes = se_nodes(x="xs" if stem else "x", opset=opset, **kw)
    if stem:
        nodes.insert(0, helper.make_node("Conv", ["x", "ws"], ["xs"]))
        inits["ws"] = WS
    if kw.get("pool") == "ReduceMean" and opset >= 18:
        inits["axes"] = np.array([2, 3], np.int64)
    return make_model(nodes, feeds, ["y"], opset=opset, initializers=inits), feeds


def session(model, level=L.ORT_ENABLE_ALL, so=None):
    so = so or rt.SessionOptions()
    so.graph_optimization_level = level
    return rt.InferenceSession(model.SerializeToString(), so, providers=CPU)


@pytest.mark.parametrize("pool,opset", [("GlobalAveragePool", 17), ("ReduceMean", 17), ("ReduceMean", 18)])
@pytest.mark.parametrize("act,gate", [("Relu", "HardSigmoid"), ("SiLU", "Sigmoid"), ("HardSwish", "HardSigmoid"),
                                      (None, "Sigmoid")])
def test_squeeze_excite_fuses_and_matches_onnxruntime(pool, opset, act, gate):
    m, feeds = se_model(n=2, pool=pool, opset=opset, act=act, gate=gate)
    s = session(m)
    assert [(n.domain, n.op_type) for n in s._graph.nodes] == [("runtime_core.fused", "SqueezeExcite")]
    ref = run_oracle(m, feeds)
    unfused = session(m, L.ORT_DISABLE_ALL).run(None, feeds)
    for _ in range(2):
        got = s.run(None, feeds)
        assert_close(got, ref, rtol=1e-5, atol=1e-6)
        assert_close(got, unfused, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("swap", [False, True])
def test_squeeze_excite_on_an_intermediate_writes_in_place_and_matches(n, swap):
    # x is the stem's fresh result read only by the block: the gate's product may overwrite it
    m, feeds = se_model(n=n, hw=7, stem=True, swap=swap)
    s = session(m)
    assert "SqueezeExcite" in [nd.op_type for nd in s._graph.nodes]
    ref = run_oracle(m, feeds)
    for _ in range(3):
        assert_close(s.run(None, feeds), ref, rtol=1e-5, atol=1e-6)


def test_squeeze_excite_stays_apart_where_an_intermediate_is_read_elsewhere():
    m, feeds = se_model()
    m.graph.output.append(onnx.ValueInfoProto(name="a1"))  # the hidden activation is an output
    s = session(m)
    assert "SqueezeExcite" not in [n.op_type for n in s._graph.nodes]
    assert_close(s.run(None, feeds), run_oracle(m, feeds), rtol=1e-5, atol=1e-6)


def test_squeeze_excite_needs_a_mean_over_both_spatial_axes():
    m, feeds = se_model(pool="ReduceMean", opset=17)
    for n in m.graph.node:
        if n.op_type == "ReduceMean":
            n.attribute[0].CopyFrom(helper.make_attribute("axes", [3]))  # over W only: [N, C, H, 1]
    onnx.checker.check_model(m)
    s = session(m)
    assert "SqueezeExcite" not in [n.op_type for n in s._graph.nodes]
    assert_close(s.run(None, feeds), run_oracle(m, feeds), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("act,gate", [("Relu", "HardSigmoid"), ("SiLU", "Sigmoid"), ("HardSwish", "Sigmoid")])
def test_optimized_model_file_has_standard_ops_and_loads_in_onnxruntime(tmp_path, act, gate):
    import onnxruntime as ort

    m, feeds = se_model(n=2, stem=True, act=act, gate=gate)
    ref = run_oracle(m, feeds)
    so = rt.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    s = session(m, L.ORT_ENABLE_EXTENDED, so)
    assert "SqueezeExcite" in [n.op_type for n in s._graph.nodes]
    assert_close(s.run(None, feeds), ref, rtol=1e-5, atol=1e-6)
    written = onnx.load(so.optimized_model_filepath)
    onnx.checker.check_model(written)
    assert not [n for n in written.graph.node if n.domain == "runtime_core.fused"]
    assert "runtime_core.fused" not in {o.domain for o in written.opset_import}
    assert "GlobalAveragePool" in [n.op_type for n in written.graph.node]
    loaded = ort.InferenceSession(so.optimized_model_filepath, providers=["CPUExecutionProvider"])
    assert_close(loaded.run(None, feeds), ref, rtol=1e-5, atol=1e-6)
    # and it fuses again when loaded here
    again = rt.InferenceSession(so.optimized_model_filepath, providers=CPU)
    assert "SqueezeExcite" in [n.op_type for n in again._graph.nodes]
    assert_close(again.run(None, feeds), ref, rtol=1e-5, atol=1e-6)


def test_squeeze_excite_node_with_weights_that_do_not_fit_is_a_typed_error():
    x = f32(1, C, 4, 4)
    node = helper.make_node("SqueezeExcite", ["x", "w1", "b1", "w2", "b2"], ["y"], domain="runtime_core.fused",
                            activation="Relu", gate="Sigmoid")
    bad_w2 = f32(C + 1, CR, 1, 1)  # one channel too many for x
    m = make_model([node], {"x": x}, ["y"], initializers={"w1": W1, "b1": B1, "w2": bad_w2, "b2": f32(C + 1)},
                   extra_opsets={"runtime_core.fused": 1}, output_types={"y": onnx.TensorProto.FLOAT})
    s = rt.InferenceSession(m.SerializeToString(), providers=CPU)
    with pytest.raises(rt.errors.RuntimeCoreError, match="W2"):
        s.run(None, {"x": x})
    good = make_model([node], {"x": x}, ["y"], initializers={"w1": W1, "b1": B1, "w2": W2, "b2": B2},
                      extra_opsets={"runtime_core.fused": 1}, output_types={"y": onnx.TensorProto.FLOAT})
    want = run_oracle(make_model(se_nodes(act="Relu", gate="Sigmoid"), {"x": x}, ["y"],
                                 initializers={"w1": W1, "b1": B1, "w2": W2, "b2": B2}), {"x": x})
    assert_close(rt.InferenceSession(good.SerializeToString(), providers=CPU).run(None, {"x": x}), want,
                 rtol=1e-5, atol=1e-6)


def _torch_block(kind):
    """A MobileNetV3 block (Hardswish, squeeze-excite with ReLU and Hardsigmoid, the residual)
    or an EfficientNet one (SiLU, squeeze-excite with SiLU and Sigmoid), written as
    torchvision writes them (``adaptive_avg_pool2d(x, 1)``, two 1x1 ``Conv2d``, ``scale * x``)."""
    import torch
    from torch import nn

    act, se_act, gate = ((nn.Hardswish, nn.ReLU, nn.Hardsigmoid) if kind == "mobilenet_v3"
                         else (nn.SiLU, nn.SiLU, nn.Sigmoid))

    class SE(nn.Module):
        def __init__(self, c, cr):
            super().__init__()
            self.fc1, self.fc2 = nn.Conv2d(c, cr, 1), nn.Conv2d(cr, c, 1)
            self.act, self.gate = se_act(), gate()

        def forward(self, x):
            s = nn.functional.adaptive_avg_pool2d(x, 1)
            return self.gate(self.fc2(self.act(self.fc1(s)))) * x

    class Block(nn.Module):
        def __init__(self, c=8, e=24):
            super().__init__()
            self.expand = nn.Sequential(nn.Conv2d(c, e, 1, bias=False), nn.BatchNorm2d(e), act())
            self.dw = nn.Sequential(nn.Conv2d(e, e, 3, padding=1, groups=e, bias=False), nn.BatchNorm2d(e), act())
            self.se = SE(e, 8)
            self.project = nn.Sequential(nn.Conv2d(e, c, 1, bias=False), nn.BatchNorm2d(c))

        def forward(self, x):
            return x + self.project(self.se(self.dw(self.expand(x))))

    torch.manual_seed(0)
    m = Block().eval()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):  # not the identity statistics of a fresh module
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 1.5)
    return m


@pytest.mark.parametrize("kind,exporter,opset", [("mobilenet_v3", "torchscript", 14), ("efficientnet", "torchscript", 17),
                                                 ("mobilenet_v3", "dynamo", 18)])
def test_exported_blocks_fuse_their_squeeze_excite(kind, exporter, opset):
    torch = pytest.importorskip("torch", reason="torch is a test-only dependency")
    import io
    import warnings

    m = _torch_block(kind)
    x = torch.randn(2, 8, 10, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
            data = torch.onnx.export(m, (x,), dynamo=True, opset_version=opset, input_names=["x"],
                                     verbose=False).model_proto.SerializeToString()
        else:
            buf = io.BytesIO()
            torch.onnx.export(m, (x,), buf, dynamo=False, opset_version=opset, input_names=["x"])
            data = buf.getvalue()
    feeds = {"x": x.numpy()}
    s = rt.InferenceSession(data, providers=CPU)
    assert [n.op_type for n in s._graph.nodes].count("SqueezeExcite") == 1
    ref = run_oracle(onnx.load_from_string(data), feeds)
    with torch.no_grad():
        assert_close([m(x).numpy()], ref, rtol=1e-4, atol=1e-5)
    for _ in range(2):
        assert_close(s.run(None, feeds), ref, rtol=1e-4, atol=1e-5)
