"""SkipLayerNormalization takes the projection's bias Add along whichever operand of the
residual Add the projection is: ``proj(h) + h`` (ViT, BERT) as well as ``h + proj(h)``
(Whisper). Against onnxruntime, on both torch exporters (decomposed LayerNorm at opset 16,
LayerNormalization at 18), and the optimized model saved at EXTENDED loads there."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

import runtime_core as rt
from oracle import assert_close, run_oracle

L = rt.GraphOptimizationLevel


def _export(first, exporter, path):
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.proj, self.ln = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32), torch.nn.LayerNorm(32)
            torch.nn.init.normal_(self.proj.bias)

        def forward(self, x):
            h = self.fc(x)
            return self.ln(self.proj(h) + h if first else h + self.proj(h))

    torch.manual_seed(0)
    x = np.random.default_rng(3).standard_normal((2, 7, 32)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kw = dict(input_names=["x"], output_names=["y"])
        if exporter == "torchscript":
            torch.onnx.export(Block().eval(), (torch.from_numpy(x),), str(path), dynamo=False, opset_version=16, **kw)
        else:
            torch.onnx.export(Block().eval(), (torch.from_numpy(x),), dynamo=True, opset_version=18,
                              **kw).save(str(path))
    return onnx.load(str(path)), {"x": x}


@pytest.mark.parametrize("first", [True, False], ids=["proj_first", "proj_second"])
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_skip_layer_norm_takes_the_bias_on_either_operand(exporter, first, tmp_path):
    model, feeds = _export(first, exporter, tmp_path / "block.onnx")
    so = rt.SessionOptions()
    so.graph_optimization_level = L.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    sess = rt.InferenceSession(model.SerializeToString(), so, providers=["cpu"])
    skip = [n for n in sess._graph.nodes if n.op_type == "SkipLayerNormalization"]
    assert len(skip) == 1 and len(skip[0].inputs) == 5  # input, skip, gamma, beta, bias
    want = run_oracle(model, feeds)
    assert_close(sess.run(None, feeds), want, rtol=1e-4, atol=1e-5)
    assert_close(run_oracle(onnx.load(so.optimized_model_filepath), feeds), want, rtol=1e-4, atol=1e-5)


def _nbits_block(rng, D=64, bs=32, bias_first=True):
    """LayerNorm(MatMulNBits(x) + b + x) with x [1, seq, D] (seq symbolic), as a 4-bit quantizer writes
    a projection and its residual: the contrib op has no onnx shape inference."""
    from onnx import TensorProto, helper, numpy_helper

    nb = D // bs
    inits = {"q": rng.integers(0, 256, (D, nb, bs // 2)).astype(np.uint8),
             "s": rng.uniform(0.01, 0.05, D * nb).astype(np.float32),
             "b": rng.standard_normal(D).astype(np.float32),
             "g": rng.uniform(0.5, 1.5, D).astype(np.float32), "be": rng.standard_normal(D).astype(np.float32)}
    nodes = [helper.make_node("MatMulNBits", ["x", "q", "s"], ["m"], domain="com.microsoft", K=D, N=D, bits=4,
                              block_size=bs),
             helper.make_node("Add", ["m", "b"] if bias_first else ["b", "m"], ["mb"]),
             helper.make_node("Add", ["mb", "x"], ["r"]),
             helper.make_node("LayerNormalization", ["r", "g", "be"], ["y"], axis=-1, epsilon=1e-5)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", D])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 17),
                                                 onnx.helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("bias_first", [True, False])
def test_skip_layer_norm_forms_after_matmul_nbits(bias_first, tmp_path):
    """The residual Add after a 4-bit projection (its bias folded into the MatMulNBits) becomes
    SkipLayerNormalization: the optimizer gives MatMulNBits' output a shape (A's dims, N last)."""
    rng = np.random.default_rng(11)
    model = _nbits_block(rng, bias_first=bias_first)
    so = rt.SessionOptions()
    so.graph_optimization_level = L.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    sess = rt.InferenceSession(model.SerializeToString(), so, providers=["cpu"])
    ops = [n.op_type for n in sess._graph.nodes]
    assert ops == ["MatMulNBits", "SkipLayerNormalization"], ops
    for seq in (1, 9):
        feeds = {"x": rng.standard_normal((1, seq, 64)).astype(np.float32)}
        want = run_oracle(model, feeds)
        assert_close(sess.run(None, feeds), want, rtol=1e-4, atol=1e-5)
        assert_close(run_oracle(onnx.load(so.optimized_model_filepath), feeds), want, rtol=1e-4, atol=1e-5)
