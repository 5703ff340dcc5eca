"""Model factories for the real-model tests: small, fast, deterministic, built at test time.

Nothing is downloaded. Every factory seeds its own RNGs, so the same call gives the same
weights and the same example inputs.

* :func:`export_torch` -- a PyTorch module exported with the TorchScript exporter
  (``dynamo=False``) or the dynamo exporter (``dynamo=True``, needs onnxscript), as a
  :class:`TorchExport` (serialized model, feeds at the export batch and at another batch,
  PyTorch's own outputs for those feeds).
* :func:`build_classic` -- a scikit-learn (skl2onnx), LightGBM or XGBoost (onnxmltools)
  model as a :class:`ClassicModel` (serialized model and feeds).
"""

from __future__ import annotations

import io
import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import onnx

# ---------------------------------------------------------------------------------------------
# PyTorch
# ---------------------------------------------------------------------------------------------

#: (exporter, opset) pairs every torch model is exported with. The dynamo exporter implements
#: opset 18 and newer (asking it for 17 down-converts with the onnx C API); 20 is the first
#: opset with a ``Gelu`` op, so 18 and 20 give two different graphs of each transformer.
TORCH_EXPORTS = [("torchscript", 13), ("torchscript", 17), ("dynamo", 18), ("dynamo", 20)]


@dataclass
class TorchExport:
    """One exported model. ``feeds``: the other-batch inputs the tests run with (a batch size
    different from the export's wherever the axis is dynamic); ``export_feeds``: the example
    inputs the model was exported with; ``expected``/``export_expected``: PyTorch's outputs."""

    name: str
    exporter: str
    opset: int
    model: bytes
    feeds: dict
    export_feeds: dict
    expected: list
    export_expected: list
    dynamic: dict = field(default_factory=dict)  # input name -> {axis: dim name}

    def proto(self) -> onnx.ModelProto:
        return onnx.load_from_string(self.model)


def _torch():
    import torch

    return torch


def _randomize_batchnorm(module, seed: int = 1) -> None:
    """Non-trivial BatchNorm statistics and affine parameters (defaults are identity)."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
            c = m.num_features
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(c, generator=g) * 0.2)
                m.running_var.copy_(torch.rand(c, generator=g) + 0.5)
                m.weight.copy_(torch.rand(c, generator=g) + 0.5)
                m.bias.copy_(torch.randn(c, generator=g) * 0.1)


def _define_modules():
    """The nn.Module classes (defined lazily so importing this file does not need torch)."""
    torch = _torch()
    nn = torch.nn
    F = torch.nn.functional

    class ResCNN(nn.Module):
        """(a) Conv+BatchNorm+ReLU stem, two residual blocks (identity and strided 1x1
        projection), a BatchNorm after an add (not foldable into a Conv), MaxPool,
        AdaptiveAvgPool, Flatten, Linear."""

        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
            self.pool = nn.MaxPool2d(3, stride=2, padding=1)
            self.b1 = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                                    nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16))
            self.b2 = nn.Sequential(nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32),
                                    nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32))
            self.down = nn.Sequential(nn.Conv2d(16, 32, 1, stride=2, bias=False), nn.BatchNorm2d(32))
            self.post_bn = nn.BatchNorm2d(32)
            self.gap = nn.AdaptiveAvgPool2d((1, 1))
            self.flatten = nn.Flatten()
            self.fc = nn.Linear(32, 10)

        def forward(self, x):
            x = self.pool(self.stem(x))
            x = F.relu(x + self.b1(x))
            x = F.relu(self.post_bn(self.down(x) + self.b2(x)))
            return self.fc(self.flatten(self.gap(x)))

    class DepthwiseCNN(nn.Module):
        """(b) MobileNet-style: depthwise 3x3 convs (groups=channels), pointwise 1x1 convs,
        ReLU6 and Hardswish, an inverted-residual block with a squeeze-excite (Hardsigmoid)."""

        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16),
                                      nn.Hardswish())
            self.dw1 = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False), nn.BatchNorm2d(16),
                                     nn.ReLU6(), nn.Conv2d(16, 24, 1, bias=False), nn.BatchNorm2d(24))
            # inverted residual: expand 24 -> 48, depthwise 5x5, squeeze-excite, project 48 -> 24
            self.expand = nn.Sequential(nn.Conv2d(24, 48, 1, bias=False), nn.BatchNorm2d(48), nn.Hardswish())
            self.dw2 = nn.Sequential(nn.Conv2d(48, 48, 5, padding=2, groups=48, bias=False), nn.BatchNorm2d(48),
                                     nn.Hardswish())
            self.se_reduce = nn.Conv2d(48, 12, 1)
            self.se_expand = nn.Conv2d(12, 48, 1)
            self.project = nn.Sequential(nn.Conv2d(48, 24, 1, bias=False), nn.BatchNorm2d(24))
            self.dw3 = nn.Sequential(nn.Conv2d(24, 24, 3, stride=2, padding=1, groups=24, bias=False),
                                     nn.BatchNorm2d(24), nn.ReLU6(), nn.Conv2d(24, 32, 1, bias=False),
                                     nn.BatchNorm2d(32), nn.ReLU6())
            self.head = nn.Linear(32, 5)

        def forward(self, x):
            x = self.dw1(self.stem(x))
            h = self.dw2(self.expand(x))
            s = F.adaptive_avg_pool2d(h, 1)
            s = F.hardsigmoid(self.se_expand(F.relu(self.se_reduce(s))))
            x = x + self.project(h * s)
            x = self.dw3(x)
            return self.head(x.mean(dim=(2, 3)))

    class SelfAttention(nn.Module):
        """Hand-written multi-head attention: fused QKV projection, scaled scores, an additive
        padding mask from a 0/1 token mask and/or a causal mask, softmax, output projection."""

        def __init__(self, d, heads):
            super().__init__()
            self.h, self.dk = heads, d // heads
            self.qkv = nn.Linear(d, 3 * d)
            self.out = nn.Linear(d, d)

        def forward(self, x, add_mask=None):
            b, t, d = x.shape
            q, k, v = self.qkv(x).split(d, dim=-1)
            q, k, v = (z.reshape(b, t, self.h, self.dk).transpose(1, 2) for z in (q, k, v))
            att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.dk)
            if add_mask is not None:
                att = att + add_mask
            y = torch.matmul(att.softmax(dim=-1), v)
            return self.out(y.transpose(1, 2).reshape(b, t, d))

    class BertEmbeddings(nn.Module):
        """Token + position (from position ids) + token-type embeddings, LayerNorm."""

        def __init__(self, vocab, d, max_len):
            super().__init__()
            self.tok = nn.Embedding(vocab, d, padding_idx=0)
            self.pos = nn.Embedding(max_len, d)
            self.typ = nn.Embedding(2, d)
            self.ln = nn.LayerNorm(d, eps=1e-12)
            self.register_buffer("position_ids", torch.arange(max_len).unsqueeze(0), persistent=False)

        def forward(self, ids):
            t = ids.shape[1]
            pos_ids = self.position_ids[:, :t]
            types = torch.zeros_like(ids)
            return self.ln(self.tok(ids) + self.pos(pos_ids) + self.typ(types))

    class Bert(nn.Module):
        """(c) BERT-style encoder, hand-written attention: post-LayerNorm blocks, exact GELU,
        the HF-style extended attention mask ``(1 - mask) * -10000``, tanh pooler."""

        def __init__(self, vocab=100, d=64, heads=4, layers=2, max_len=32):
            super().__init__()
            self.emb = BertEmbeddings(vocab, d, max_len)
            self.blocks = nn.ModuleList(nn.ModuleDict({
                "att": SelfAttention(d, heads), "ln1": nn.LayerNorm(d, eps=1e-12),
                "ff": nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)),
                "ln2": nn.LayerNorm(d, eps=1e-12)}) for _ in range(layers))
            self.pooler = nn.Linear(d, d)

        def forward(self, ids, mask):
            x = self.emb(ids)
            ext = (1.0 - mask[:, None, None, :].to(x.dtype)) * -10000.0
            for blk in self.blocks:
                x = blk["ln1"](x + blk["att"](x, ext))
                x = blk["ln2"](x + blk["ff"](x))
            return x, torch.tanh(self.pooler(x[:, 0]))

    class BertTorchEncoder(nn.Module):
        """(c) The same architecture from nn.TransformerEncoder: the 0/1 mask becomes a boolean
        ``src_key_padding_mask``; GELU feed-forward; 2 layers; hidden 64."""

        def __init__(self, vocab=100, d=64, heads=4, layers=2, max_len=32):
            super().__init__()
            self.emb = BertEmbeddings(vocab, d, max_len)
            layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=4 * d, dropout=0.0, activation="gelu",
                                               batch_first=True, layer_norm_eps=1e-12)
            self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.pooler = nn.Linear(d, d)

        def forward(self, ids, mask):
            x = self.enc(self.emb(ids), src_key_padding_mask=mask == 0)
            return x, torch.tanh(self.pooler(x[:, 0]))

    class GPT(nn.Module):
        """(d) GPT-style decoder: pre-LayerNorm blocks, causal attention, tanh-GELU MLP, final
        LayerNorm, LM head tied to the token embedding. ``mask="buffer"``: GPT-2's
        ``tril(ones)`` buffer sliced to the sequence length; ``mask="triu"``: an additive
        ``triu(full(-inf), 1)`` mask built in forward for the actual length."""

        def __init__(self, vocab=80, d=48, heads=4, layers=2, max_len=32, mask="buffer"):
            super().__init__()
            self.mask_kind = mask
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(max_len, d)
            self.blocks = nn.ModuleList(nn.ModuleDict({
                "ln1": nn.LayerNorm(d), "att": SelfAttention(d, heads), "ln2": nn.LayerNorm(d),
                "ff": nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))})
                for _ in range(layers))
            self.lnf = nn.LayerNorm(d)
            self.lm_head = nn.Linear(d, vocab, bias=False)
            self.lm_head.weight = self.tok.weight  # tied embeddings
            self.register_buffer("causal", torch.tril(torch.ones(max_len, max_len)).view(1, 1, max_len, max_len),
                                 persistent=False)

        def forward(self, ids):
            t = ids.shape[1]
            x = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
            if self.mask_kind == "buffer":
                keep = self.causal[:, :, :t, :t]
                add = torch.zeros_like(keep).masked_fill(keep == 0, float("-inf"))
            else:
                add = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
            for b in self.blocks:
                x = x + b["att"](b["ln1"](x), add)
                x = x + b["ff"](b["ln2"](x))
            return self.lm_head(self.lnf(x))

    class Recurrent(nn.Module):
        """(e) A 2-layer bidirectional batch_first LSTM or GRU feeding a Linear head; returns
        per-step logits and the final hidden state."""

        def __init__(self, kind):
            super().__init__()
            cls = nn.LSTM if kind == "lstm" else nn.GRU
            self.rnn = cls(8, 16, num_layers=2, bidirectional=True, batch_first=True)
            self.head = nn.Linear(32, 3)

        def forward(self, x):
            y, state = self.rnn(x)
            h = state[0] if isinstance(state, tuple) else state
            return self.head(y), h

    class Upsampler(nn.Module):
        """(f) F.interpolate nearest (scale 2), bilinear (scale 2, align_corners=False),
        bilinear to a fixed size with align_corners=True, and ConvTranspose2d (stride 2, with
        and without output_padding)."""

        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 8, 3, padding=1)
            self.up = nn.ConvTranspose2d(8, 6, 4, stride=2, padding=1)
            self.up2 = nn.ConvTranspose2d(6, 3, 3, stride=2, padding=1, output_padding=1)

        def forward(self, x):
            h = self.conv(x)
            a = F.interpolate(h, scale_factor=2, mode="nearest")
            b = F.interpolate(h, scale_factor=2, mode="bilinear", align_corners=False)
            y = self.up(F.relu(a + b))  # 8x8 -> 16x16 -> 32x32
            c = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=True)
            return self.up2(y + c.mean(dim=1, keepdim=True))  # 32x32 -> 64x64

    return {"ResCNN": ResCNN, "DepthwiseCNN": DepthwiseCNN, "Bert": Bert, "BertTorchEncoder": BertTorchEncoder,
            "GPT": GPT, "Recurrent": Recurrent, "Upsampler": Upsampler}


_MODULES: dict = {}


def _cls(name):
    if not _MODULES:
        _MODULES.update(_define_modules())
    return _MODULES[name]


def _token_batch(gen, lengths, t, vocab):
    """ids (int64, 0 after each row's length) and the 0/1 attention mask (int64)."""
    torch = _torch()
    b = len(lengths)
    ids = torch.randint(1, vocab, (b, t), generator=gen)
    mask = torch.zeros(b, t, dtype=torch.int64)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return ids * mask, mask


@dataclass
class TorchCase:
    module: object
    input_names: list
    output_names: list
    export_args: tuple
    run_args: tuple
    dynamic: dict  # input name -> {axis: name}
    dim_max: dict = field(default_factory=dict)  # dim name -> max (dynamo)


#: names accepted by :func:`torch_case` / :func:`export_torch`
TORCH_MODELS = ["rescnn", "depthwise", "bert", "bert_torch_encoder", "gpt", "gpt_triu", "lstm", "gru", "upsample"]

#: (model, exporter, opset) combinations the exporter itself cannot produce, with why. The
#: tests still try them and skip only when the export raises.
TORCH_UNEXPORTABLE: dict = {
    ("gpt_triu", "torchscript", 13): "the TorchScript exporter has no aten::triu below opset 14 "
                                     "(UnsupportedOperatorError: Trilu is an opset-14 op)",
    ("bert_torch_encoder", "torchscript", 13): "the TorchScript exporter has no "
                                               "aten::scaled_dot_product_attention (used by "
                                               "nn.MultiheadAttention) below opset 14",
}


def torch_case(name: str, exporter: str = "dynamo") -> TorchCase:
    """A fresh module in eval mode plus its example inputs (deterministic). ``exporter`` only
    matters where the exporters support different dynamic axes."""
    torch = _torch()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1234)
    batch = {0: "batch"}
    if name == "rescnn":
        m = _cls("ResCNN")()
        _randomize_batchnorm(m)
        case = TorchCase(m, ["x"], ["logits"], (torch.randn(2, 3, 32, 32, generator=gen),),
                         (torch.randn(3, 3, 32, 32, generator=gen),), {"x": batch})
    elif name == "depthwise":
        m = _cls("DepthwiseCNN")()
        _randomize_batchnorm(m)
        case = TorchCase(m, ["x"], ["logits"], (torch.randn(2, 3, 32, 32, generator=gen),),
                         (torch.randn(3, 3, 32, 32, generator=gen),), {"x": batch})
    elif name in ("bert", "bert_torch_encoder"):
        m = _cls("Bert" if name == "bert" else "BertTorchEncoder")()
        # exported at batch 3 (seq 12), run at batch 2 (seq 10): every row has different padding.
        # The TorchScript exporter bakes the sequence length of nn.MultiheadAttention's
        # reshapes into the graph (the model fails in onnxruntime at another length), so with
        # it only the batch axis of nn.TransformerEncoder is dynamic and the run keeps seq 12.
        fixed_seq = name == "bert_torch_encoder" and exporter == "torchscript"
        export = _token_batch(gen, [12, 9, 4], 12, 100)
        run = _token_batch(gen, [12, 6] if fixed_seq else [10, 6], 12 if fixed_seq else 10, 100)
        dyn = {0: "batch"} if fixed_seq else {0: "batch", 1: "seq"}
        case = TorchCase(m, ["input_ids", "attention_mask"], ["last_hidden_state", "pooler_output"], export, run,
                         {"input_ids": dyn, "attention_mask": dyn}, {"seq": 32})
    elif name in ("gpt", "gpt_triu"):
        m = _cls("GPT")(mask="buffer" if name == "gpt" else "triu")
        export = (torch.randint(0, 80, (2, 16), generator=gen),)
        run = (torch.randint(0, 80, (3, 11), generator=gen),)
        case = TorchCase(m, ["input_ids"], ["logits"], export, run, {"input_ids": {0: "batch", 1: "seq"}},
                         {"seq": 32})
    elif name in ("lstm", "gru"):
        m = _cls("Recurrent")(name)
        case = TorchCase(m, ["x"], ["logits", "h_n"], (torch.randn(2, 7, 8, generator=gen),),
                         (torch.randn(4, 7, 8, generator=gen),), {"x": batch})
    elif name == "upsample":
        m = _cls("Upsampler")()
        case = TorchCase(m, ["x"], ["y"], (torch.randn(1, 4, 8, 8, generator=gen),),
                         (torch.randn(2, 4, 8, 8, generator=gen),), {"x": batch})
    else:
        raise KeyError(f"unknown torch model {name!r}; known: {TORCH_MODELS}")
    case.module.eval()
    return case


def _torch_outputs(module, args) -> list:
    torch = _torch()
    with torch.no_grad():
        out = module(*args)
    out = out if isinstance(out, (tuple, list)) else (out,)
    return [o.detach().numpy() for o in out]


def export_torch(name: str, exporter: str, opset: int) -> TorchExport:
    """Export ``name`` with ``exporter`` ("torchscript" or "dynamo") at ``opset``.

    Dynamic axes (batch, and sequence for the transformers) are declared to both exporters.
    The combinations in :data:`TORCH_UNEXPORTABLE` raise the exporter's own error.
    """
    torch = _torch()
    case = torch_case(name, exporter)
    m = case.module
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            buf = io.BytesIO()
            torch.onnx.export(m, case.export_args, buf, dynamo=False, opset_version=opset,
                              input_names=case.input_names, output_names=case.output_names,
                              dynamic_axes=case.dynamic or None)
            data = buf.getvalue()
        elif exporter == "dynamo":
            dims = {}
            shapes = []
            for n in case.input_names:
                axes = case.dynamic.get(n)
                if not axes:
                    shapes.append(None)
                    continue
                spec = {}
                for ax, dn in axes.items():
                    if dn not in dims:
                        dims[dn] = torch.export.Dim(dn, min=1, max=case.dim_max.get(dn, 1024))
                    spec[ax] = dims[dn]
                shapes.append(spec)
            prog = torch.onnx.export(m, case.export_args, dynamo=True, opset_version=opset,
                                     input_names=case.input_names, output_names=case.output_names,
                                     dynamic_shapes=tuple(shapes), verbose=False)
            data = prog.model_proto.SerializeToString()
        else:
            raise ValueError(f"exporter must be 'torchscript' or 'dynamo', got {exporter!r}")
    feeds = {n: a.numpy() for n, a in zip(case.input_names, case.run_args)}
    export_feeds = {n: a.numpy() for n, a in zip(case.input_names, case.export_args)}
    return TorchExport(name, exporter, opset, data, feeds, export_feeds, _torch_outputs(m, case.run_args),
                       _torch_outputs(m, case.export_args), dict(case.dynamic))


# ---------------------------------------------------------------------------------------------
# Classic ML: scikit-learn (skl2onnx), LightGBM and XGBoost (onnxmltools)
# ---------------------------------------------------------------------------------------------

#: skl2onnx target opsets: the main domain and ai.onnx.ml (skl2onnx emits ai.onnx.ml <= 3)
SKL_OPSET = {"": 17, "ai.onnx.ml": 3}
#: onnxmltools' target_opset for LightGBM / XGBoost (an int: the main domain's opset)
MLTOOLS_OPSET = 15


@dataclass
class ClassicModel:
    name: str
    model: bytes
    feeds: dict
    estimator: object = None

    def proto(self) -> onnx.ModelProto:
        return onnx.load_from_string(self.model)


def _datasets():
    from sklearn.datasets import make_classification, make_regression

    xb, yb = make_classification(240, 8, n_informative=5, random_state=0)
    xm, ym = make_classification(240, 8, n_informative=6, n_classes=3, n_clusters_per_class=1, random_state=1)
    xr, yr = make_regression(240, 8, n_informative=6, noise=0.5, random_state=2)
    return {"binary": (xb.astype(np.float32), yb), "multi": (xm.astype(np.float32), ym),
            "reg": (xr.astype(np.float32), yr.astype(np.float32))}


_DATA: dict = {}


def dataset(kind: str):
    """("binary" | "multi" | "reg") -> (X float32 [240, 8], y)."""
    if not _DATA:
        _DATA.update(_datasets())
    return _DATA[kind]


def _skl(est, X, y, *, options=None, fit=True):
    from skl2onnx import to_onnx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if fit:
            est.fit(X, y)
        onx = to_onnx(est, X[:1], target_opset=dict(SKL_OPSET), options=options)
    return onx.SerializeToString()


def _column_transformer(cat_kind: str):
    """ColumnTransformer(StandardScaler on 3 numeric columns, OneHotEncoder on 1 categorical
    column) + LogisticRegression. The ONNX model has two inputs: ``num`` (float [N, 3]) and
    ``cat`` (string or int64 [N, 1]); skl2onnx maps column 3 to the second input."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType, Int64TensorType, StringTensorType
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    rng = np.random.default_rng(7)
    n = 200
    num = rng.standard_normal((n, 3)).astype(np.float32)
    codes = rng.integers(0, 4, n)
    label = ((num[:, 0] + 0.9 * (codes == 2) - 0.7 * (codes == 0) + 0.3 * num[:, 1]) > 0.2).astype(np.int64)
    if cat_kind == "str":
        cat = np.array(["red", "green", "blue", "amber"], dtype=object)[codes].reshape(-1, 1)
        cat_type = StringTensorType([None, 1])
    else:
        cat = (codes * 10 + 3).astype(np.int64).reshape(-1, 1)
        cat_type = Int64TensorType([None, 1])
    fit_x = np.hstack([num.astype(object), cat])  # sklearn sees one object array
    pipe = Pipeline([("ct", ColumnTransformer([("num", StandardScaler(), [0, 1, 2]),
                                               ("cat", OneHotEncoder(handle_unknown="ignore"), [3])])),
                     ("clf", LogisticRegression(max_iter=500))])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe.fit(fit_x[:150], label[:150])
        onx = convert_sklearn(pipe, initial_types=[("num", FloatTensorType([None, 3])), ("cat", cat_type)],
                              target_opset=dict(SKL_OPSET))
    test_cat = cat[150:].copy()
    # a category never seen in training: handle_unknown="ignore" gives an all-zero one-hot row
    test_cat[0, 0] = "violet" if cat_kind == "str" else 999
    feeds = {"num": num[150:], "cat": test_cat.astype(object) if cat_kind == "str" else test_cat}
    return ClassicModel(f"column_transformer_{cat_kind}", onx.SerializeToString(), feeds, pipe)


def _sklearn(name):
    from sklearn.ensemble import (
        GradientBoostingClassifier,
        GradientBoostingRegressor,
        RandomForestClassifier,
        RandomForestRegressor,
    )
    from sklearn.linear_model import LinearRegression, LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import Binarizer, MinMaxScaler, Normalizer, StandardScaler
    from sklearn.svm import SVC, SVR

    def rf_clf():
        return RandomForestClassifier(n_estimators=15, max_depth=6, random_state=0)

    table = {
        "logreg_pipeline": (lambda: Pipeline([("scale", StandardScaler()),
                                              ("clf", LogisticRegression(max_iter=500))]), "multi", None),
        "logreg_binary_nozipmap": (lambda: Pipeline([("scale", StandardScaler()),
                                                     ("clf", LogisticRegression(max_iter=500))]), "binary",
                                   {"zipmap": False}),
        "rf_binary_zipmap": (rf_clf, "binary", None),
        "rf_binary_nozipmap": (rf_clf, "binary", {"zipmap": False}),
        "rf_multi_zipmap": (rf_clf, "multi", None),
        "rf_multi_nozipmap": (rf_clf, "multi", {"zipmap": False}),
        "rf_regressor": (lambda: RandomForestRegressor(n_estimators=15, max_depth=6, random_state=0), "reg", None),
        "gb_regressor": (lambda: GradientBoostingRegressor(n_estimators=30, max_depth=3, random_state=0), "reg",
                         None),
        "gb_classifier": (lambda: GradientBoostingClassifier(n_estimators=20, max_depth=3, random_state=0), "multi",
                          {"zipmap": False}),
        "svc_proba_binary": (lambda: SVC(probability=True, random_state=0), "binary", None),
        "svc_proba_multi": (lambda: SVC(probability=True, random_state=0), "multi", {"zipmap": False}),
        "svr": (lambda: SVR(C=10.0), "reg", None),
        "linreg": (lambda: LinearRegression(), "reg", None),
        # double inputs: skl2onnx keeps float64 through MatMul/Add (trees have no double
        # converter that onnxruntime accepts)
        "linreg_double": (lambda: LinearRegression(), "reg", None),
        "logreg_double_nozipmap": (lambda: LogisticRegression(max_iter=500), "multi", {"zipmap": False}),
        "scalers_binarizer": (lambda: Pipeline([("mm", MinMaxScaler()), ("norm", Normalizer()),
                                                ("bin", Binarizer(threshold=0.1))]), "reg", None),
    }
    make, kind, options = table[name]
    X, y = dataset(kind)
    if "double" in name:
        X = X.astype(np.float64)
    est = make()
    if name == "scalers_binarizer":
        y = None
    opts = None
    if options is not None:
        # options address the final estimator (the classifier of a pipeline)
        target = est.steps[-1][1] if hasattr(est, "steps") else est
        opts = {id(target): options}
    data = _skl(est, X[:180], None if y is None else y[:180], options=opts)
    return ClassicModel(name, data, {"X": X[180:]}, est)


def _string_labels():
    from sklearn.linear_model import LogisticRegression

    X, y = dataset("multi")
    labels = np.array(["cat", "dog", "eel"], dtype=object)[y]
    est = LogisticRegression(max_iter=500)
    data = _skl(est, X[:180], labels[:180])
    return ClassicModel("logreg_string_labels", data, {"X": X[180:]}, est)


def _lightgbm(name):
    import lightgbm as lgb
    from onnxmltools import convert_lightgbm
    from onnxmltools.convert.common.data_types import FloatTensorType

    kind = {"lgbm_binary": "binary", "lgbm_multi": "multi", "lgbm_multi_zipmap": "multi",
            "lgbm_regressor": "reg"}[name]
    X, y = dataset(kind)
    params = dict(n_estimators=40, num_leaves=15, learning_rate=0.1, min_child_samples=5, random_state=0,
                  verbose=-1)
    est = lgb.LGBMRegressor(**params) if kind == "reg" else lgb.LGBMClassifier(**params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(X[:180], y[:180])
        onx = convert_lightgbm(est, initial_types=[("X", FloatTensorType([None, X.shape[1]]))],
                               target_opset=MLTOOLS_OPSET, zipmap=name == "lgbm_multi_zipmap")
    return ClassicModel(name, onx.SerializeToString(), {"X": X[180:]}, est)


def _xgboost(name):
    import xgboost as xgb
    from onnxmltools import convert_xgboost
    from onnxmltools.convert.common.data_types import FloatTensorType

    kind = {"xgb_binary": "binary", "xgb_multi": "multi", "xgb_regressor": "reg"}[name]
    X, y = dataset(kind)
    params = dict(n_estimators=40, max_depth=4, learning_rate=0.2, random_state=0, n_jobs=1)
    est = xgb.XGBRegressor(**params) if kind == "reg" else xgb.XGBClassifier(**params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(X[:180], y[:180])
        onx = convert_xgboost(est, initial_types=[("X", FloatTensorType([None, X.shape[1]]))],
                              target_opset=MLTOOLS_OPSET)
    return ClassicModel(name, onx.SerializeToString(), {"X": X[180:]}, est)


SKLEARN_MODELS = ["logreg_pipeline", "logreg_binary_nozipmap", "logreg_string_labels", "rf_binary_zipmap",
                  "rf_binary_nozipmap", "rf_multi_zipmap", "rf_multi_nozipmap", "rf_regressor", "gb_regressor",
                  "gb_classifier", "column_transformer_str", "column_transformer_int", "svc_proba_binary",
                  "svc_proba_multi", "svr", "linreg", "linreg_double", "logreg_double_nozipmap", "scalers_binarizer"]
LIGHTGBM_MODELS = ["lgbm_binary", "lgbm_multi", "lgbm_multi_zipmap", "lgbm_regressor"]
XGBOOST_MODELS = ["xgb_binary", "xgb_multi", "xgb_regressor"]
CLASSIC_MODELS = SKLEARN_MODELS + LIGHTGBM_MODELS + XGBOOST_MODELS


def build_classic(name: str) -> ClassicModel:
    """Fit and convert one classic-ML model (deterministic: fixed data and seeds)."""
    if name == "logreg_string_labels":
        return _string_labels()
    if name.startswith("column_transformer_"):
        return _column_transformer(name.rsplit("_", 1)[1])
    if name in LIGHTGBM_MODELS:
        return _lightgbm(name)
    if name in XGBOOST_MODELS:
        return _xgboost(name)
    if name in SKLEARN_MODELS:
        return _sklearn(name)
    raise KeyError(f"unknown classic model {name!r}; known: {CLASSIC_MODELS}")
