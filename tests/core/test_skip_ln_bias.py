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
