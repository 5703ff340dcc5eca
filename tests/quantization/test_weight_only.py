"""4-bit weight-only MatMul quantization and float16 conversion, against onnxruntime's
MatMulNBitsQuantizer and onnxruntime.transformers.float16."""

from __future__ import annotations

import copy
import logging
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the test oracle")
pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).parent))
import quant_models as M  # noqa: E402

import runtime_core as rt  # noqa: E402
from runtime_core import quantization as rq  # noqa: E402
from runtime_core.errors import InvalidArgumentError  # noqa: E402


@pytest.fixture(scope="module")
def gpt():
    logging.disable(logging.WARNING)
    yield M.torch_block("gpt", "torchscript")
    logging.disable(logging.NOTSET)


def run_ort(model, feed, optimize=True):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feed)[0]


@pytest.mark.parametrize("k", [64, 100, 256])
@pytest.mark.parametrize("block_size", [32, 64, 128])
@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
def test_blockwise_packing_is_onnxruntimes(k, block_size, symmetric):
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits

    from runtime_core.quantization.nbits import quantize_blockwise_4bit

    n = 12
    w = np.random.default_rng(k + block_size).normal(0, 1, (k, n)).astype(np.float32)
    w[:3, :2] = 0  # an all-zero corner
    kb = (k + block_size - 1) // block_size
    packed = np.zeros((n, kb, block_size // 2), np.uint8)
    zp = np.zeros((n, (kb + 1) // 2), np.uint8)
    sc = np.zeros((n, kb), np.float32)
    quantize_matmul_4bits(packed, np.pad(w, ((0, kb * block_size - k), (0, 0))), sc, zp, block_size, n, k, symmetric)
    p2, s2, z2 = quantize_blockwise_4bit(w, block_size, symmetric)
    np.testing.assert_array_equal(p2, packed)
    np.testing.assert_array_equal(s2, sc)
    if not symmetric:
        np.testing.assert_array_equal(z2, zp)


@pytest.mark.parametrize("fmt", ["QOperator", "QDQ"])
@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
def test_matmul_nbits_matches_onnxruntime(gpt, fmt, symmetric):
    from onnxruntime.quantization import QuantFormat as OF
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer as OQ

    ours = rq.MatMulNBitsQuantizer(gpt, block_size=32, is_symmetric=symmetric,
                                   quant_format=getattr(rq.QuantFormat, fmt))
    ours.process()
    # onnxruntime rewrites the ModelProto it is given: hand it a copy
    theirs = OQ(copy.deepcopy(gpt), block_size=32, is_symmetric=symmetric, quant_format=getattr(OF, fmt))
    theirs.process()
    mo, mt = ours.model.model, theirs.model.model
    assert Counter(n.op_type for n in mo.graph.node) == Counter(n.op_type for n in mt.graph.node)
    feed = M.block_feeds(1)[0]
    a, b = run_ort(mo, feed), run_ort(mt, feed)
    np.testing.assert_array_equal(a, b)
    # both forms run on runtime_core (QOperator: the CPU provider's MatMulNBits kernel)
    r = rt.InferenceSession(mo.SerializeToString()).run(None, feed)[0]
    np.testing.assert_allclose(r, run_ort(mo, feed, optimize=False), atol=2e-5)


def test_matmul_nbits_arguments(gpt, tmp_path):
    with pytest.raises(InvalidArgumentError):
        rq.MatMulNBitsQuantizer(gpt, block_size=48)
    with pytest.raises(InvalidArgumentError):
        rq.MatMulNBitsQuantizer(gpt, bits=3)
    p = tmp_path / "g.onnx"
    onnx.save(gpt, p)
    rq.quantize_matmul_nbits(p, tmp_path / "q.onnx", block_size=64, quant_format=rq.QuantFormat.QDQ,
                             nodes_to_exclude=[n.name for n in gpt.graph.node if n.op_type == "MatMul"][:1])
    ops = Counter(n.op_type for n in onnx.load(tmp_path / "q.onnx").graph.node)
    assert ops["DequantizeLinear"] == 3  # four weight MatMuls, one excluded


@pytest.mark.parametrize("keep_io_types", [True, False])
def test_float16_matches_onnxruntime_converter(gpt, keep_io_types):
    from onnxruntime.transformers.float16 import convert_float_to_float16 as oc

    feed = M.block_feeds(1)[0]
    mo = rq.convert_float_to_float16(gpt, keep_io_types=keep_io_types)
    onnx.checker.check_model(mo)
    mt = oc(copy.deepcopy(gpt), keep_io_types=keep_io_types)
    x = feed if keep_io_types else {"x": feed["x"].astype(np.float16)}
    a, b = run_ort(mo, x), run_ort(mt, x)
    assert a.dtype == (np.float32 if keep_io_types else np.float16)
    np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), atol=4e-3)
    f = run_ort(gpt, feed)
    np.testing.assert_allclose(a.astype(np.float32), f, atol=2e-2)
    r = rt.InferenceSession(mo.SerializeToString()).run(None, x)[0]
    assert r.dtype == a.dtype
    np.testing.assert_allclose(r.astype(np.float32), a.astype(np.float32), atol=8e-3)
    assert gpt.graph.initializer[0].data_type == onnx.TensorProto.FLOAT  # the argument is unchanged


def test_float16_blocks_ops(gpt):
    mo = rq.convert_float_to_float16(gpt, keep_io_types=True, op_block_list=["Softmax"])
    sm = [n for n in mo.graph.node if n.op_type == "Softmax"]
    casts = {o for n in mo.graph.node if n.op_type == "Cast" for o in n.output}
    assert sm and all(i in casts for n in sm for i in n.input)  # fed through a Cast to float32
    feed = M.block_feeds(1)[0]
    np.testing.assert_allclose(rt.InferenceSession(mo.SerializeToString()).run(None, feed)[0],
                               run_ort(gpt, feed), atol=2e-2)
