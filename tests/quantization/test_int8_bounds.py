"""Whole-model int8 agreement with onnxruntime, bounded by the model's own quantization error.

A small CNN (onnx.helper) and a small BERT-style block (a torch export) are quantized by
onnxruntime's tool and by ours, static QDQ (per channel) and dynamic. Each quantized model runs on
runtime_core and on onnxruntime with its default optimizations (its int8 kernels and QDQ fusions,
so the arithmetic is not the same as ours). The largest output difference between the two
runtimes must stay within the int8 model's own error against the float model as onnxruntime
computes it: two int8 engines may round intermediate values differently, but a difference larger
than what quantizing the model costs in the first place is a bug, not rounding.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the test oracle")
oq = pytest.importorskip("onnxruntime.quantization")

sys.path.insert(0, str(Path(__file__).parent))
import quant_models as M  # noqa: E402

import runtime_core as rt  # noqa: E402
from runtime_core import quantization as rq  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


class _Reader:
    def __init__(self, feeds):
        self.it = iter(feeds)

    def get_next(self):
        return next(self.it, None)


def _ort(path, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return np.stack([s.run(None, f)[0] for f in feeds])


def _rt(path, feeds):
    s = rt.InferenceSession(str(path), providers=["cpu"])
    return np.stack([s.run(None, f)[0] for f in feeds])


def _quantize(tool, src, dst, mode, calib):
    if mode == "dynamic":
        tool.quantize_dynamic(src, dst, per_channel=True)
    else:
        tool.quantize_static(src, dst, _Reader(calib), quant_format=tool.QuantFormat.QDQ, per_channel=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("int8")
    cnn, bert = d / "cnn.onnx", d / "bert.onnx"
    onnx.save(M.cnn(), cnn)
    onnx.save(M.torch_block("bert", "torchscript"), bert)
    return {"cnn": (cnn, M.cnn_feeds(8, seed=1), M.cnn_feeds(6, seed=7)),
            "bert": (bert, M.block_feeds(8, seed=2), M.block_feeds(6, seed=9))}


@pytest.mark.parametrize("tool_name", ["onnxruntime", "ours"])
@pytest.mark.parametrize("mode", ["static_qdq", "dynamic"])
@pytest.mark.parametrize("model", ["cnn", "bert"])
def test_int8_difference_within_the_models_own_quantization_error(models, tmp_path, model, mode, tool_name):
    src, calib, feeds = models[model]
    q = tmp_path / f"{model}-{mode}-{tool_name}.onnx"
    _quantize(oq if tool_name == "onnxruntime" else rq, src, q, mode, calib)
    ref_float = _ort(src, feeds)
    theirs, ours = _ort(q, feeds), _rt(q, feeds)
    own_error = float(np.abs(theirs - ref_float).max())  # what int8 costs this model, on onnxruntime
    diff = float(np.abs(ours - theirs).max())
    assert own_error > 0, "the quantized model computes the float model exactly: nothing is quantized"
    assert diff <= own_error, (f"{model} {mode} by {tool_name}: runtime_core differs from onnxruntime by {diff:.4g}, "
                               f"more than the int8 model's own error against float ({own_error:.4g})")
