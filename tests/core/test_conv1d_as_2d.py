"""A 1-D Conv (Whisper's front end) runs as a 2-D one over one row (``Conv1dAs2dFusion``):
the 2-D plans chosen by measurement instead of the N-D numpy path. Outputs against
onnxruntime on every attribute variant and on both torch exporters; the Conv folds still
apply first."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import helper

import runtime_core as rt
from oracle import assert_close, make_model, run_oracle

RNG = np.random.default_rng(1500)
L = rt.GraphOptimizationLevel


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def optimized(model, feeds, level=L.ORT_ENABLE_EXTENDED):
    so = rt.SessionOptions()
    so.graph_optimization_level = level
    sess = rt.InferenceSession(model.SerializeToString(), so, providers=["cpu"])
    for _ in range(2):  # the plan measured on the first run, taken on the second
        assert_close(sess.run(None, feeds), run_oracle(model, feeds), rtol=1e-4, atol=1e-4)
    return [(n.op_type, len(sess._graph.value_info(n.outputs[0]).shape or ())) for n in sess._graph.nodes]


@pytest.mark.parametrize("attrs,cin,group", [
    ({"pads": [1, 1]}, 8, 1),
    ({"pads": [1, 1], "strides": [2]}, 8, 1),
    ({"pads": [2, 0], "dilations": [2]}, 8, 1),
    ({"auto_pad": "SAME_UPPER", "strides": [2]}, 8, 1),
    ({}, 8, 4),
])
@pytest.mark.parametrize("bias", [True, False])
def test_conv1d_as_one_row_matches_onnxruntime(attrs, cin, group, bias):
    x, w = f32(2, cin, 37), f32(12, cin // group, 3)
    ins = ["x", "w", "b"] if bias else ["x", "w"]
    m = make_model([helper.make_node("Conv", ins, ["y"], group=group, **attrs)], {"x": x}, ["y"],
                   initializers={"w": w, **({"b": f32(12)} if bias else {})})
    assert optimized(m, {"x": x}) == [("Unsqueeze", 4), ("Conv", 4), ("Squeeze", 3)]
    assert optimized(m, {"x": x}, L.ORT_ENABLE_BASIC) == [("Conv", 3)]


def test_batchnorm_folds_into_the_1d_weights_first():
    x = f32(1, 6, 20)
    bn = {"sc": np.abs(f32(5)) + 0.5, "bi": f32(5), "mu": f32(5), "var": np.abs(f32(5)) + 0.5}
    m = make_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1]),
                    helper.make_node("BatchNormalization", ["c", "sc", "bi", "mu", "var"], ["y"])],
                   {"x": x}, ["y"], initializers={"w": f32(5, 6, 3), **bn})
    assert [op for op, _ in optimized(m, {"x": x})] == ["Unsqueeze", "Conv", "Squeeze"]


def test_a_weight_fed_at_run_time_stays_1d():
    x, w = f32(1, 4, 16), f32(3, 4, 3)
    m = make_model([helper.make_node("Conv", ["x", "w"], ["y"])], {"x": x, "w": w}, ["y"])
    assert optimized(m, {"x": x, "w": w}) == [("Conv", 3)]


def _export(module, x, path, exporter):
    """A ``module`` class, built after seeding torch and exported by the TorchScript (opset 17) or the dynamo (opset 18) exporter, loaded back."""
    import onnx
    import torch

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kw = dict(input_names=["x"], output_names=["y"])
        if exporter == "torchscript":
            torch.onnx.export(module().eval(), (torch.from_numpy(x),), str(path), dynamo=False, opset_version=17, **kw)
        else:
            torch.onnx.export(module().eval(), (torch.from_numpy(x),), dynamo=True, opset_version=18, **kw).save(str(path))
    return onnx.load(str(path))


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_whisper_front_end_of_both_exporters(exporter, tmp_path):
    """Two Conv1d + GELU (the second with stride 2), as Whisper's encoder starts."""
    import torch

    class Front(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv1d(10, 16, 3, padding=1)
            self.conv2 = torch.nn.Conv1d(16, 16, 3, stride=2, padding=1)

        def forward(self, x):
            x = torch.nn.functional.gelu(self.conv1(x))
            return torch.nn.functional.gelu(self.conv2(x)).permute(0, 2, 1)

    x = f32(1, 10, 40)
    got = optimized(_export(Front, x, tmp_path / "front.onnx", exporter), {"x": x}, L.ORT_ENABLE_ALL)
    assert [r for op, r in got if op == "Conv"] == [4, 4]


@pytest.mark.parametrize("act,kw", [("Relu", {}), ("LeakyRelu", {"alpha": 0.2}), ("Sigmoid", {}),
                                    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4})])
def test_activation_fuses_into_the_1d_conv_before_it_goes_2d(act, kw):
    """The activation joins the 1-D Conv (FusedConv) before the rewrite: after it, a Squeeze
    would stand between the Conv and the activation."""
    x = f32(2, 8, 37)
    m = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1], strides=[2]),
                    helper.make_node(act, ["c"], ["y"], **kw)],
                   {"x": x}, ["y"], initializers={"w": f32(12, 8, 3), "b": f32(12)})
    assert optimized(m, {"x": x}) == [("Unsqueeze", 4), ("FusedConv", 4), ("Squeeze", 3)]


def test_residual_of_a_1d_fused_conv_goes_2d_too():
    """``Relu(Conv(x) + z)``: the residual ``Z`` gets its own Unsqueeze."""
    x, z = f32(1, 8, 30), f32(1, 12, 30)
    m = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1]),
                    helper.make_node("Add", ["c", "z"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
                   {"x": x, "z": z}, ["y"], initializers={"w": f32(12, 8, 3), "b": f32(12)})
    got = optimized(m, {"x": x, "z": z})
    assert sorted(got) == sorted([("Unsqueeze", 4), ("Unsqueeze", 4), ("FusedConv", 4), ("Squeeze", 3)])


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_conv1d_relu_of_both_exporters(exporter, tmp_path):
    """A torch Conv1d + ReLU ends as one 2-D FusedConv (no Relu node left)."""
    import torch

    class Front(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv1d(10, 16, 3, stride=2, padding=1)

        def forward(self, x):
            return torch.relu(self.conv(x))

    x = f32(1, 10, 40)
    got = optimized(_export(Front, x, tmp_path / "relu.onnx", exporter), {"x": x}, L.ORT_ENABLE_ALL)
    assert [op for op, _ in got if op not in ("Unsqueeze", "Squeeze")] == ["FusedConv"]
    assert ("FusedConv", 4) in got
