"""The benchmark model set, built at bench time into a cache folder (nothing is downloaded).

``python benchmarks/models.py [--cache DIR] [NAME ...]`` builds the models (all by default)
and prints where they are. Each model is ``DIR/NAME.onnx`` with its inputs in
``DIR/NAME.npz`` (``runtime-core bench`` picks that file up); a model already in the cache
is not rebuilt (delete the folder to rebuild).

* torch models: exported with ``torch.onnx.export`` (TorchScript exporter, opset 17), random
  weights (seeded); architectures written out here (no torchvision / transformers needed);
* tree ensembles: scikit-learn RandomForest (skl2onnx), LightGBM and XGBoost (onnxmltools),
  100+ trees, batch 100;
* ``add_chain``: 1000 tiny ``Add`` nodes built with ``onnx.helper`` (benched with
  optimizations disabled: the per-node dispatch cost).

``MODELS`` maps each name to ``(builder, bench_args)``; ``bench_args`` are extra keyword
arguments for :func:`runtime_core.bench.bench` (``level`` = graph optimization level).
"""

from __future__ import annotations

import argparse
import io
import math
import os
import sys
import warnings
from pathlib import Path

import numpy as np

DEFAULT_CACHE = Path(os.environ.get("RUNTIME_CORE_BENCH_CACHE", Path.home() / ".cache" / "runtime-core-bench"))


# ------------------------------------------------------------------------------------------
# torch
# ------------------------------------------------------------------------------------------

def _export(module, args, names, dynamic=None) -> bytes:
    import torch

    module.eval()
    b = io.BytesIO()
    with warnings.catch_warnings():  # not under no_grad: that takes the fused encoder path
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, b, dynamo=False, opset_version=17, input_names=names,
                          do_constant_folding=True, dynamic_axes=dynamic)
    return b.getvalue()


def _randomize_bn(module, seed=1):
    import torch

    g = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)


def _distinct_weights(module, std=0.02):
    """Fresh random matrices per layer: ``TransformerEncoder`` deep-copies one layer, and the
    exporter would store the identical weights once (a model of 1/12 the real size)."""
    import torch

    with torch.no_grad():
        for p in module.parameters():
            if p.dim() > 1:
                p.normal_(0.0, std)


def _encoder(layers, d, heads, ff, seq, batch):
    import torch

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True, activation="gelu")
    enc = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
    _distinct_weights(enc)
    x = torch.randn(batch, seq, d)
    return _export(enc, (x,), ["x"]), {"x": x.numpy()}


def bert_base():
    """BERT-base-sized encoder: 12 layers x 768, 12 heads, ff 3072, seq 128, batch 1."""
    return _encoder(12, 768, 12, 3072, 128, 1)


def bert_tiny_b8():
    """BERT-tiny-sized encoder: 2 layers x 128, 2 heads, ff 512, seq 128, batch 8."""
    return _encoder(2, 128, 2, 512, 128, 8)


def gpt2_small(seq: int = 128):
    """GPT-2-small-sized decoder: vocab 50257, 12 layers x 768, 12 heads, seq 128 (or ``seq``),
    batch 1, causal attention written as GPT-2 does (matmuls, mask, softmax), tied LM head."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, d, h):
            super().__init__()
            self.h = h
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x, mask):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q = q.view(b, t, self.h, d // self.h).transpose(1, 2)
            k = k.view(b, t, self.h, d // self.h).transpose(1, 2)
            v = v.view(b, t, self.h, d // self.h).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.h)
            att = att.masked_fill(mask[:, :, :t, :t] == 0, float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, d)
            x = x + self.proj(y)
            return x + self.out(nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self, vocab=50257, ctx=1024, d=768, layers=12, h=12):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
            self.blocks = nn.ModuleList(Block(d, h) for _ in range(layers))
            self.ln = nn.LayerNorm(d)
            self.register_buffer("mask", torch.tril(torch.ones(ctx, ctx)).view(1, 1, ctx, ctx))

        def forward(self, ids):
            t = ids.shape[1]
            x = self.wte(ids) + self.wpe(torch.arange(t).unsqueeze(0))
            for blk in self.blocks:
                x = blk(x, self.mask)
            return self.ln(x) @ self.wte.weight.t()

    torch.manual_seed(0)
    ids = torch.randint(0, 50257, (1, seq))
    return _export(GPT(), (ids,), ["input_ids"]), {"input_ids": ids.numpy()}


def resnet18():
    """ResNet-18 (torchvision's layout), 224x224, batch 1."""
    import torch
    from torch import nn

    class Basic(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
            layers, cin = [], 64
            for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
                layers += [Basic(cin, cout, stride), Basic(cout, cout, 1)]
                cin = cout
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(512, 1000)

        def forward(self, x):
            x = self.layers(self.stem(x))
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    torch.manual_seed(0)
    m = ResNet()
    _randomize_bn(m)
    x = torch.randn(1, 3, 224, 224)
    return _export(m, (x,), ["x"]), {"x": x.numpy()}


def mobilenet_v2():
    """MobileNetV2 (width 1.0, torchvision's layout), 224x224, batch 1."""
    import torch
    from torch import nn

    def cbr(cin, cout, k, s, groups=1, act=True):
        layers = [nn.Conv2d(cin, cout, k, s, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        if act:
            layers.append(nn.ReLU6())
        return nn.Sequential(*layers)

    class Inverted(nn.Module):
        def __init__(self, cin, cout, s, t):
            super().__init__()
            hid = cin * t
            layers = [] if t == 1 else [cbr(cin, hid, 1, 1)]
            layers += [cbr(hid, hid, 3, s, groups=hid), cbr(hid, cout, 1, 1, act=False)]
            self.body = nn.Sequential(*layers)
            self.res = s == 1 and cin == cout

        def forward(self, x):
            return x + self.body(x) if self.res else self.body(x)

    class MobileNetV2(nn.Module):
        def __init__(self):
            super().__init__()
            cfg = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                   (6, 160, 3, 2), (6, 320, 1, 1)]
            layers, cin = [cbr(3, 32, 3, 2)], 32
            for t, c, n, s in cfg:
                for i in range(n):
                    layers.append(Inverted(cin, c, s if i == 0 else 1, t))
                    cin = c
            layers.append(cbr(cin, 1280, 1, 1))
            self.features = nn.Sequential(*layers)
            self.fc = nn.Linear(1280, 1000)

        def forward(self, x):
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))

    torch.manual_seed(0)
    m = MobileNetV2()
    _randomize_bn(m)
    x = torch.randn(1, 3, 224, 224)
    return _export(m, (x,), ["x"]), {"x": x.numpy()}


def vit_tiny():
    """ViT-tiny: patch 16 at 224 (196 patches + class token), 12 layers x 192, 3 heads, mlp 768."""
    import torch
    from torch import nn

    class ViT(nn.Module):
        def __init__(self, d=192, layers=12, heads=3, mlp=768):
            super().__init__()
            self.patch = nn.Conv2d(3, d, 16, 16)
            self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.02)
            self.pos = nn.Parameter(torch.randn(1, 197, d) * 0.02)
            layer = nn.TransformerEncoderLayer(d, heads, mlp, dropout=0.0, batch_first=True,
                                               activation="gelu", norm_first=True)
            self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            _distinct_weights(self.enc)
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, 1000)

        def forward(self, x):
            x = self.patch(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
            return self.head(self.ln(self.enc(x))[:, 0])

    torch.manual_seed(0)
    x = torch.randn(1, 3, 224, 224)
    return _export(ViT(), (x,), ["x"]), {"x": x.numpy()}


def _rnn(cls):
    import torch

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = cls(64, 256, num_layers=2, batch_first=True)
            self.fc = torch.nn.Linear(256, 10)

        def forward(self, x):
            y, _ = self.rnn(x)
            return self.fc(y[:, -1])

    torch.manual_seed(0)
    x = torch.randn(1, 100, 64)
    return _export(M(), (x,), ["x"]), {"x": x.numpy()}


def lstm():
    """2-layer LSTM (input 64, hidden 256), seq 100, batch 1, + a Linear head."""
    import torch

    return _rnn(torch.nn.LSTM)


def gru():
    """2-layer GRU (input 64, hidden 256), seq 100, batch 1, + a Linear head."""
    import torch

    return _rnn(torch.nn.GRU)


# ------------------------------------------------------------------------------------------
# tree ensembles (batch 100)
# ------------------------------------------------------------------------------------------

def _tree_data():
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=2000, n_features=20, n_informative=10, n_classes=3,
                               random_state=0)
    return X.astype(np.float32), y


def random_forest():
    """scikit-learn RandomForestClassifier, 100 trees (max_depth 10), 20 features, 3 classes."""
    from skl2onnx import to_onnx
    from sklearn.ensemble import RandomForestClassifier

    X, y = _tree_data()
    est = RandomForestClassifier(n_estimators=100, max_depth=10, random_state=0).fit(X, y)
    onx = to_onnx(est, X[:1], options={id(est): {"zipmap": False}}, target_opset={"": 17, "ai.onnx.ml": 3})
    return onx.SerializeToString(), {onx.graph.input[0].name: X[:100]}


def lightgbm():
    """LightGBM LGBMClassifier, 100 rounds x 3 classes (300 trees), 31 leaves, 20 features."""
    import lightgbm as lgb
    from onnxmltools import convert_lightgbm
    from onnxmltools.convert.common.data_types import FloatTensorType

    X, y = _tree_data()
    est = lgb.LGBMClassifier(n_estimators=100, num_leaves=31, random_state=0, verbose=-1).fit(X, y)
    onx = convert_lightgbm(est, initial_types=[("X", FloatTensorType([None, X.shape[1]]))],
                           zipmap=False, target_opset=15)
    return onx.SerializeToString(), {"X": X[:100]}


def xgboost():
    """XGBoost XGBClassifier, 100 rounds x 3 classes (300 trees), depth 6, 20 features."""
    import xgboost as xgb
    from onnxmltools import convert_xgboost
    from onnxmltools.convert.common.data_types import FloatTensorType

    X, y = _tree_data()
    est = xgb.XGBClassifier(n_estimators=100, max_depth=6, random_state=0).fit(X, y)
    onx = convert_xgboost(est, initial_types=[("X", FloatTensorType([None, X.shape[1]]))], target_opset=15)
    return onx.SerializeToString(), {"X": X[:100]}


# ------------------------------------------------------------------------------------------
# dispatch overhead
# ------------------------------------------------------------------------------------------

def add_chain(n: int = 1000):
    """``n`` chained ``Add`` nodes on a [4] float tensor (each adds a constant)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits = [], [numpy_helper.from_array(np.ones(4, np.float32), "one")]
    prev = "x"
    for i in range(n):
        out = "y" if i == n - 1 else f"t{i}"
        nodes.append(helper.make_node("Add", [prev, "one"], [out], name=f"add_{i}"))
        prev = out
    g = helper.make_graph(nodes, "add_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m.SerializeToString(), {"x": np.zeros(4, np.float32)}


#: name -> (builder, bench keyword arguments, description for the table)
MODELS = {
    "bert_base": (bert_base, {}, "BERT-base-sized encoder (12x768, seq 128), b1"),
    "gpt2_small": (gpt2_small, {}, "GPT-2-small-sized decoder (12x768, vocab 50257, seq 128), b1"),
    "resnet18": (resnet18, {}, "ResNet-18 at 224, b1"),
    "mobilenet_v2": (mobilenet_v2, {}, "MobileNetV2 at 224, b1"),
    "vit_tiny": (vit_tiny, {}, "ViT-tiny (12x192, patch 16 at 224), b1"),
    "bert_tiny_b8": (bert_tiny_b8, {}, "BERT-tiny-sized encoder (2x128, seq 128), b8"),
    "lstm": (lstm, {}, "LSTM 2x256, seq 100, b1"),
    "gru": (gru, {}, "GRU 2x256, seq 100, b1"),
    "random_forest": (random_forest, {}, "sklearn RandomForest, 100 trees, batch 100"),
    "lightgbm": (lightgbm, {}, "LightGBM, 100 rounds x 3 classes, batch 100"),
    "xgboost": (xgboost, {}, "XGBoost, 100 rounds x 3 classes, batch 100"),
    "add_chain": (add_chain, {"level": 0}, "1000-node chain of [4] Adds, optimizations disabled"),
}


def build(name: str, cache: Path = DEFAULT_CACHE) -> tuple[Path, Path]:
    """Build model ``name`` into ``cache`` (unless there); returns (model path, inputs path)."""
    if name not in MODELS:
        raise KeyError(f"unknown benchmark model {name!r}; known: {', '.join(MODELS)}")
    cache = Path(cache)
    cache.mkdir(parents=True, exist_ok=True)
    model, feeds = cache / f"{name}.onnx", cache / f"{name}.npz"
    if not (model.exists() and feeds.exists()):
        data, inputs = MODELS[name][0]()
        tmp = model.with_suffix(".onnx.tmp")
        tmp.write_bytes(data)
        np.savez(feeds, **inputs)
        os.replace(tmp, model)
    return model, feeds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help=f"models to build (default: all): {', '.join(MODELS)}")
    p.add_argument("--cache", default=str(DEFAULT_CACHE), help="cache folder (default %(default)s)")
    args = p.parse_args(argv)
    for name in args.names or list(MODELS):
        model, _ = build(name, Path(args.cache))
        print(f"{name}: {model} ({model.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
