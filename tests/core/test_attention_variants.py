"""The fusions on transformers as users export them (``tests/models/hf_variants.py``):
Hugging Face-style BERT (two extended-mask constants), DistilBERT, GPT-2 (Where-masked and
SDPA), ViT and T5, from the TorchScript exporter at opsets 14, 17 and 20 with static and
dynamic axes, and from the dynamo exporter. Each must reach the expected fused ops at the
ALL level with outputs equal to onnxruntime's on the unoptimized model."""

from __future__ import annotations

import numpy as np
import pytest

import runtime_core as rt
from oracle import run_oracle

torch = pytest.importorskip("torch", reason="torch is a test-only dependency")

from models import hf_variants as V  # noqa: E402 - after the torch check

L = rt.GraphOptimizationLevel
CPU = ["CPUExecutionProvider"]

#: (exporter, opset, dynamic axes) every variant is exported with here; 14 writes LayerNorm
#: out (decomposed), 17 has LayerNormalization, 20 has Gelu. (``python tests/models/hf_variants.py``
#: surveys every opset with both axes kinds and the dynamo exporter.)
TORCHSCRIPT = [("torchscript", 14, True), ("torchscript", 17, True), ("torchscript", 20, False)]

#: fused ops each variant reaches (2 layers; "gelu": the Gelu family). SkipLayerNormalization: at least the two
#: residual norms per layer (the embedding norm after its Add is one too where the export
#: keeps that Add next to it); every other LayerNorm must be fused as well (no ReduceMean left).
EXPECT = {
    "bert": {"Attention": 2, "SkipLayerNormalization": 4, "gelu": 2},
    "bert_finfo": {"Attention": 2, "SkipLayerNormalization": 4, "gelu": 2},
    "distilbert": {"Attention": 2, "SkipLayerNormalization": 4, "gelu": 2},
    "gpt2": {"Attention": 2, "SkipLayerNormalization": 4, "gelu": 2},
    "gpt2_sdpa": {"Attention": 2, "SkipLayerNormalization": 4, "gelu": 2},
    "vit": {"Attention": 2, "SkipLayerNormalization": 4, "gelu": 2},
    "t5": {"Attention": 2},
    "whisper": {"Attention": 2, "SkipLayerNormalization": 4, "gelu": 4},  # (2 in the front end)
    "whisper_sdpa": {"Attention": 2, "SkipLayerNormalization": 4, "gelu": 4},
}


def _assert_expected(name, opset, counts, ops):
    want = EXPECT[name]
    got = {k: counts.get(k, 0) for k in want}
    # the Gelu family: BiasGelu (bias taken in), FastGelu (tanh form), Gelu (opset 20's op)
    got["gelu"] = sum(counts.get(k, 0) for k in ("Gelu", "FastGelu", "BiasGelu")) if "gelu" in want else None
    if "gelu" not in want:
        del got["gelu"]
    if "SkipLayerNormalization" in want:
        got["SkipLayerNormalization"] = min(got["SkipLayerNormalization"], want["SkipLayerNormalization"])
        # below opset 17 there is no LayerNormalization op: a norm with no Add before it (ViT's
        # final one, an embedding norm) stays decomposed (2 ReduceMeans); every other is fused
        assert ops.count("ReduceMean") <= (2 if opset < 17 else 0), counts
    assert got == want, counts
    assert "Softmax" not in counts, counts  # every attention went into the fused op

CASES = [(name, ex, op, dyn) for name in V.VARIANTS for ex, op, dyn in TORCHSCRIPT]


def _id(c):
    return f"{c[0]}-{c[1]}{c[2]}-{'dynamic' if c[3] else 'static'}"


@pytest.fixture(scope="session")
def exports():
    """Exports made once per session (several tests read the same one)."""
    cache: dict = {}

    def get(name, exporter, opset, dynamic):
        key = (name, exporter, opset, dynamic)
        if key not in cache:
            if exporter == "dynamo":
                pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
            cache[key] = V.export(name, exporter, opset, dynamic)
        return cache[key]
    return get


def _check(ex, rtol=1e-4, atol=1e-4):
    """Fused op counts of ``ex`` at the ALL level; asserts outputs equal onnxruntime's on the
    unoptimized model."""
    so = rt.SessionOptions()
    so.graph_optimization_level = L.ORT_ENABLE_ALL
    s = rt.InferenceSession(ex.model.SerializeToString(), so, providers=CPU)
    got = s.run(None, ex.feeds)
    ref = run_oracle(ex.model, ex.feeds)
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    ops = [n.op_type for n in s._graph.nodes]
    return {op: ops.count(op) for op in V.FUSED if op in ops}, ops


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_variant_fuses_and_matches_onnxruntime(exports, case):
    _assert_expected(case[0], case[2], *_check(exports(*case)))


@pytest.mark.parametrize("name", ["gpt2_sdpa", "whisper", "whisper_sdpa"])  # dynamo's K^T (an export: ~10 s)
def test_variant_from_dynamo_dynamic(exports, name):
    _assert_expected(name, 18, *_check(exports(name, "dynamo", 18, True)))


def test_dynamo_sdpa_is_causal_becomes_unidirectional(exports):
    """SDPA's is_causal bias (Where(Trilu(ones [S, S]) == 0, fill, 0), rebuilt from the shapes
    in every layer) is the fused op's own causal cut: no mask input, nothing of it left."""
    ex = exports("gpt2_sdpa", "dynamo", 18, True)
    assert "Trilu" in [n.op_type for n in ex.model.graph.node]
    so = rt.SessionOptions()
    so.graph_optimization_level = L.ORT_ENABLE_ALL
    s = rt.InferenceSession(ex.model.SerializeToString(), so, providers=CPU)
    att = [n for n in s._graph.nodes if n.op_type == "Attention"]
    assert len(att) == 2 and all(n.attrs.get("unidirectional") == 1 and len(n.inputs) == 3 for n in att)
    assert not {"Trilu", "Where", "Expand"} & {n.op_type for n in s._graph.nodes}
    feeds = {"input_ids": np.random.default_rng(3).integers(1, V.VOCAB, (2, 30)).astype(np.int64)}
    np.testing.assert_allclose(s.run(None, feeds)[0], run_oracle(ex.model, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["distilbert", "bert_finfo", "t5"])
def test_masks_beyond_zero_one_and_fully_masked_rows(exports, name):
    """The padding mask as fed: a row with every key masked (the large-negative fill makes
    softmax uniform there, in the fused kernel as in the graph) and, for DistilBERT's
    ``mask == 0`` test, values other than 0 and 1 (kept, as the graph keeps them)."""
    ex = exports(name, "torchscript", 17, True)
    feeds = dict(ex.feeds)
    m = feeds["attention_mask"].copy()
    m[0, :] = 0
    if name == "distilbert":
        m[1, :3] = [2, -1, 5]
    feeds["attention_mask"] = m
    so = rt.SessionOptions()
    so.graph_optimization_level = L.ORT_ENABLE_ALL
    s = rt.InferenceSession(ex.model.SerializeToString(), so, providers=CPU)
    assert "Attention" in [n.op_type for n in s._graph.nodes]
    np.testing.assert_allclose(s.run(None, feeds)[0], run_oracle(ex.model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_where_mask_with_a_small_fill_is_not_fused(exports):
    """masked_fill with -100 is not additive (a fully masked row differs): left unfused."""
    import onnx
    from onnx import numpy_helper

    ex = exports("distilbert", "torchscript", 17, True)
    m = onnx.ModelProto()
    m.CopyFrom(ex.model)
    fills = {n.input[1] for n in m.graph.node if n.op_type == "Where"}
    hit = 0
    for t in m.graph.initializer:
        if t.name in fills:
            t.CopyFrom(numpy_helper.from_array(np.array(-100.0, np.float32).reshape(numpy_helper.to_array(t).shape),
                                               t.name))
            hit += 1
    for n in m.graph.node:
        if n.op_type == "Constant" and n.output[0] in fills:
            n.attribute[0].t.CopyFrom(numpy_helper.from_array(np.array(-100.0, np.float32)))
            hit += 1
    assert hit
    feeds = dict(ex.feeds)
    mask = feeds["attention_mask"].copy()
    mask[0, :] = 0
    feeds["attention_mask"] = mask
    so = rt.SessionOptions()
    so.graph_optimization_level = L.ORT_ENABLE_ALL
    s = rt.InferenceSession(m.SerializeToString(), so, providers=CPU)
    assert "Attention" not in [n.op_type for n in s._graph.nodes]
    np.testing.assert_allclose(s.run(None, feeds)[0], run_oracle(m, feeds)[0], rtol=1e-4, atol=1e-4)


def test_dynamo_sdpa_upper_triangle_is_not_causal(exports):
    """The same bias with Trilu(upper=1) masks the past, not the future: kept as a bias."""
    import onnx

    ex = exports("gpt2_sdpa", "dynamo", 18, True)
    m = onnx.ModelProto()
    m.CopyFrom(ex.model)
    for n in m.graph.node:
        if n.op_type == "Trilu":
            del n.attribute[:]
            n.attribute.append(onnx.helper.make_attribute("upper", 1))
    so = rt.SessionOptions()
    so.graph_optimization_level = L.ORT_ENABLE_ALL
    s = rt.InferenceSession(m.SerializeToString(), so, providers=CPU)
    assert not any(n.attrs.get("unidirectional") for n in s._graph.nodes if n.op_type == "Attention")
    np.testing.assert_allclose(s.run(None, ex.feeds)[0], run_oracle(m, ex.feeds)[0], rtol=1e-4, atol=1e-4)


def test_every_layer_of_a_deep_dynamic_distilbert_fuses(monkeypatch):
    """Six layers of DistilBERT exported with dynamic axes: each layer's ``view(bs, -1, dim)`` of
    the context gets its own unk__N from onnx, proven equal to the sequence only through the
    layer before it; every layer's attention still fuses (with 4 rounds of symbol refinement
    layers 2-5 did not)."""
    monkeypatch.setattr(V, "LAYERS", 6)
    counts, ops = _check(V.export("distilbert", "torchscript", 17, True))
    assert counts.get("Attention", 0) == 6 and "Softmax" not in ops, counts
