"""The benchmark corpus: models we did not write the kernels against, in the export variants
users produce, built at benchmark time into a cache folder (random weights, nothing downloaded).

Families (transformers, convolutional networks, recurrent networks, tree ensembles) are written
out in plain torch in their reference layouts (:mod:`.transformers`, :mod:`.vision`,
:mod:`.classic`) and exported with the TorchScript exporter (``dynamo=False``, opsets 14-17) or
the dynamo exporter (opsets 18-20), with static or dynamic axes, at batch 1 or 8 and sequence
128 or 384. Sizes are stated in each entry's description ("-sized": the real architecture's
layer count and widths, random weights).

**The split.** ``FAMILIES`` is a fixed list; family ``i`` belongs to the **tune** half when ``i``
is even and to the **report** half when ``i`` is odd, with every variant of a family in the same
half. Kernels and fusions are developed against ``select("tune")`` only; ``select("report")``
is measured and reported, never looked at while tuning. Adding a family at the end of the list
never moves an existing one between halves.

    python -m corpus list                         (from benchmarks/)
    python -m corpus build --cache DIR [NAME ...]
    python -m corpus check --cache DIR [--size tiny] [NAME ...]
    runtime-core bench --compare onnxruntime --corpus tune|report|all --cache DIR
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import classic, transformers, vision

#: the split's order: never reorder, only append (see the module docstring)
FAMILIES = ("bert", "distilbert", "gpt2", "vit", "t5_encoder", "whisper_encoder", "albert_shared", "resnet50",
            "mobilenet_v3", "efficientnet_b0", "convnext_tiny", "lstm", "gru", "random_forest", "lightgbm",
            "xgboost")
SIZES = ("bench", "tiny")


def half_of(family: str) -> str:
    """``"tune"`` for the even positions of ``FAMILIES``, ``"report"`` for the odd ones."""
    return "tune" if FAMILIES.index(family) % 2 == 0 else "report"


@dataclass(frozen=True)
class Entry:
    name: str
    family: str
    builder: object
    kwargs: dict = field(default_factory=dict)
    description: str = ""

    @property
    def half(self) -> str:
        return half_of(self.family)


def _t(name, family, builder, desc, *, exporter, opset, dynamic=False, **kw):
    return Entry(name, family, builder, dict(exporter=exporter, opset=opset, dynamic=dynamic, **kw), desc)


TS, DY = "torchscript", "dynamo"
T, V, C = transformers, vision, classic

ENTRIES = {e.name: e for e in [
    # -- tune half -----------------------------------------------------------------------------
    _t("bert_base_ts14_dyn_b1_s128", "bert", T.bert, "BERT-base-sized (12x768), TorchScript, opset 14, "
       "dynamic batch/seq, b1 s128", exporter=TS, opset=14, dynamic=True, batch=1, seq=128),
    _t("bert_base_dynamo18_b1_s128", "bert", T.bert, "BERT-base-sized (12x768), dynamo, opset 18, static, "
       "b1 s128", exporter=DY, opset=18, batch=1, seq=128),
    _t("bert_small_ts17_dyn_b8_s384", "bert", T.bert, "BERT-small-sized (4x512), TorchScript, opset 17, "
       "dynamic, b8 s384", exporter=TS, opset=17, dynamic=True, batch=8, seq=384, cfg="small"),
    _t("gpt2_ts17_triu_b1_s128", "gpt2", T.gpt2, "GPT-2-small-sized (12x768, vocab 50257, tied head), causal "
       "mask as a registered tril buffer, TorchScript, opset 17, b1 s128", exporter=TS, opset=17, batch=1,
       seq=128),
    _t("gpt2_dynamo18_sdpa_dyn_b1_s384", "gpt2", T.gpt2, "GPT-2-small-sized, SDPA is_causal=True, dynamo, "
       "opset 18, dynamic, b1 s384", exporter=DY, opset=18, dynamic=True, batch=1, seq=384, attention="sdpa"),
    _t("t5_small_enc_ts15_dyn_b1_s128", "t5_encoder", T.t5_encoder, "T5-small-sized encoder (6x512, RMSNorm, "
       "relative position bias), TorchScript, opset 15, dynamic, b1 s128", exporter=TS, opset=15, dynamic=True,
       batch=1, seq=128),
    _t("t5_small_enc_dynamo19_b8_s128", "t5_encoder", T.t5_encoder, "T5-small-sized encoder, dynamo, opset 19, "
       "static, b8 s128", exporter=DY, opset=19, batch=8, seq=128),
    _t("albert_base_ts16_b1_s384", "albert_shared", T.albert, "ALBERT-base-sized (one shared 768-wide layer "
       "x12, factorised embeddings), TorchScript, opset 16, b1 s384", exporter=TS, opset=16, batch=1, seq=384),
    _t("mobilenet_v3_ts14_b1", "mobilenet_v3", V.mobilenet_v3, "MobileNetV3-large at 224, TorchScript, opset 14, "
       "b1", exporter=TS, opset=14, batch=1),
    _t("mobilenet_v3_dynamo18_dyn_b8", "mobilenet_v3", V.mobilenet_v3, "MobileNetV3-large at 224, dynamo, "
       "opset 18, dynamic batch, b8", exporter=DY, opset=18, dynamic=True, batch=8),
    _t("convnext_tiny_ts17_b1", "convnext_tiny", V.convnext_tiny, "ConvNeXt-tiny at 224, TorchScript, opset 17, "
       "b1", exporter=TS, opset=17, batch=1),
    _t("convnext_tiny_dynamo20_b1", "convnext_tiny", V.convnext_tiny, "ConvNeXt-tiny at 224, dynamo, opset 20, "
       "b1", exporter=DY, opset=20, batch=1),
    _t("gru_bi2x256_ts14_dyn_b8_s384", "gru", C.rnn, "bidirectional 2-layer GRU (80 -> 256), TorchScript, "
       "opset 14, dynamic batch/frames, b8 s384", exporter=TS, opset=14, dynamic=True, batch=8, seq=384,
       cell="gru"),
    Entry("lightgbm_b100", "lightgbm", C.lightgbm, dict(opset=15, batch=100),
          "LightGBM, 100 rounds x 3 classes, onnxmltools opset 15, batch 100"),
    # -- report half ---------------------------------------------------------------------------
    _t("distilbert_ts16_dyn_b1_s384", "distilbert", T.distilbert, "DistilBERT-base-sized (6x768), TorchScript, "
       "opset 16, dynamic, b1 s384", exporter=TS, opset=16, dynamic=True, batch=1, seq=384),
    _t("distilbert_dynamo19_b8_s128", "distilbert", T.distilbert, "DistilBERT-base-sized, dynamo, opset 19, "
       "static, b8 s128", exporter=DY, opset=19, batch=8, seq=128),
    _t("vit_s16_ts16_b1", "vit", T.vit, "ViT-S/16-sized (12x384) at 224, TorchScript, opset 16, b1",
       exporter=TS, opset=16, batch=1),
    _t("vit_ti16_dynamo18_dyn_b8", "vit", T.vit, "ViT-Ti/16-sized (12x192) at 224, dynamo, opset 18, dynamic "
       "batch, b8", exporter=DY, opset=18, dynamic=True, batch=8, cfg="vit_ti"),
    _t("whisper_tiny_enc_ts17_b1", "whisper_encoder", T.whisper_encoder, "Whisper-tiny-sized encoder (4x384, "
       "80 mels x 3000 frames), TorchScript, opset 17, b1", exporter=TS, opset=17, batch=1),
    _t("whisper_base_enc_dynamo18_dyn_b1", "whisper_encoder", T.whisper_encoder, "Whisper-base-sized encoder "
       "(6x512), dynamo, opset 18, dynamic batch, b1", exporter=DY, opset=18, dynamic=True, batch=1,
       cfg="whisper_base"),
    _t("resnet50_ts17_b1", "resnet50", V.resnet50, "ResNet-50 at 224, TorchScript, opset 17, b1",
       exporter=TS, opset=17, batch=1),
    _t("resnet50_dynamo18_dyn_b1", "resnet50", V.resnet50, "ResNet-50 at 224, dynamo, opset 18, dynamic batch, "
       "b1", exporter=DY, opset=18, dynamic=True, batch=1),
    _t("efficientnet_b0_ts14_b1", "efficientnet_b0", V.efficientnet_b0, "EfficientNet-B0 at 224, TorchScript, "
       "opset 14, b1", exporter=TS, opset=14, batch=1),
    _t("efficientnet_b0_dynamo20_dyn_b8", "efficientnet_b0", V.efficientnet_b0, "EfficientNet-B0 at 224, dynamo, "
       "opset 20, dynamic batch, b8", exporter=DY, opset=20, dynamic=True, batch=8),
    _t("lstm_bi2x256_ts15_dyn_b1_s384", "lstm", C.rnn, "bidirectional 2-layer LSTM (80 -> 256), TorchScript, "
       "opset 15, dynamic batch/frames, b1 s384", exporter=TS, opset=15, dynamic=True, batch=1, seq=384,
       cell="lstm"),
    Entry("random_forest_b100", "random_forest", C.random_forest, dict(opset=17, batch=100),
          "scikit-learn RandomForest, 100 trees of depth 10, skl2onnx opset 17, batch 100"),
    Entry("xgboost_b100", "xgboost", C.xgboost, dict(opset=15, batch=100),
          "XGBoost, 100 rounds x 3 classes, onnxmltools opset 15, batch 100"),
]}


def select(half: str = "all") -> list:
    """Entry names of ``half`` (``"tune"``, ``"report"`` or ``"all"``), in a fixed order."""
    if half not in ("tune", "report", "all"):
        raise ValueError(f"half must be 'tune', 'report' or 'all', got {half!r}")
    return [n for n, e in ENTRIES.items() if half == "all" or e.half == half]


def build(name: str, cache, size: str = "bench") -> tuple[Path, Path]:
    """Build entry ``name`` at ``size`` into ``cache`` unless it is there; returns (model, feeds)
    paths (``NAME.onnx`` with its feeds in ``NAME.npz``, under ``cache/tiny`` at the tiny size)."""
    if name not in ENTRIES:
        raise KeyError(f"unknown corpus model {name!r}; known: {', '.join(ENTRIES)}")
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    folder = Path(cache) / ("tiny" if size == "tiny" else "")
    folder.mkdir(parents=True, exist_ok=True)
    model, feeds = folder / f"{name}.onnx", folder / f"{name}.npz"
    if not (model.exists() and feeds.exists()):
        e = ENTRIES[name]
        tmp = folder / f"{name}.tmp.onnx"
        inputs = e.builder(tmp, size, **e.kwargs)
        np.savez(feeds, **inputs)
        os.replace(tmp, model)  # a half-written model is never taken from the cache
    return model, feeds
