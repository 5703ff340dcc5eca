"""Small transformers written the way Hugging Face's modeling code writes them, for the
attention and norm fusion tests: the export variants users produce, without downloads.

Every model is 2 layers, hidden 64, 4 heads, built from a fixed seed. The forms follow the
library's source line by line where the exporters see a difference:

* ``bert`` / ``bert_finfo``: BertModel (q/k/v Linear, ``view`` + ``permute`` heads,
  ``/ math.sqrt(d)``, extended mask ``(1 - mask[:, None, None, :]) * -10000`` or
  ``* finfo.min``, token_type_ids, post-LN, erf GELU);
* ``distilbert``: ``q / sqrt(d)`` before the MatMul, ``masked_fill(mask == 0, finfo.min)``;
* ``gpt2``: Conv1D ``addmm`` c_attn then ``split``, the causal ``tril`` bool buffer through
  ``torch.where(causal, w, finfo.min)``, pre-LN, the tanh "gelu_new";
* ``gpt2_sdpa``: the same with ``F.scaled_dot_product_attention(is_causal=True)``;
* ``vit``: Conv2d patches, cls token, pre-LN, no mask;
* ``t5``: RMSNorm (T5LayerNorm), relative position bias added to the scores, no scaling;
* ``whisper``: WhisperEncoder (Conv1d + GELU front end, pre-LN), eager attention with
  ``q_proj(x) * scaling`` before the heads are split and a k_proj without bias;
* ``whisper_sdpa``: the same with ``F.scaled_dot_product_attention`` (no mask, not causal).

``python tests/models/hf_variants.py`` prints, for every variant x exporter x opset x axes,
the fused ops ``optimize()`` leaves (the survey in the fusion report).
"""

from __future__ import annotations

import io
import math
import warnings
from dataclasses import dataclass

import onnx

VARIANTS = ["bert", "bert_finfo", "distilbert", "gpt2", "gpt2_sdpa", "vit", "t5", "whisper", "whisper_sdpa"]
D, H, LAYERS, VOCAB, MAXLEN = 64, 4, 2, 50, 32


def _define():
    import torch
    from torch import nn
    from torch.nn import functional as F

    class BertSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.num_attention_heads, self.attention_head_size = H, D // H
            self.all_head_size = D
            self.query, self.key, self.value = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
            self.dropout = nn.Dropout(0.1)

        def transpose_for_scores(self, x):
            new_x_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
            return x.view(new_x_shape).permute(0, 2, 1, 3)

        def forward(self, hidden_states, attention_mask=None):
            q = self.transpose_for_scores(self.query(hidden_states))
            k = self.transpose_for_scores(self.key(hidden_states))
            v = self.transpose_for_scores(self.value(hidden_states))
            scores = torch.matmul(q, k.transpose(-1, -2))
            scores = scores / math.sqrt(self.attention_head_size)
            if attention_mask is not None:
                scores = scores + attention_mask
            probs = self.dropout(nn.functional.softmax(scores, dim=-1))
            ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
            return ctx.view(ctx.size()[:-2] + (self.all_head_size,))

    class BertLayer(nn.Module):
        def __init__(self, act="erf", pre_ln=False):
            super().__init__()
            self.attention = BertSelfAttention()
            self.attn_out = nn.Linear(D, D)
            self.ln1 = nn.LayerNorm(D, eps=1e-12)
            self.intermediate = nn.Linear(D, 4 * D)
            self.output = nn.Linear(4 * D, D)
            self.ln2 = nn.LayerNorm(D, eps=1e-12)
            self.dropout = nn.Dropout(0.1)
            self.pre_ln = pre_ln

        def forward(self, x, mask=None):
            if self.pre_ln:  # ViT
                x = self.dropout(self.attn_out(self.attention(self.ln1(x), mask))) + x
                return self.output(F.gelu(self.intermediate(self.ln2(x)))) + x
            x = self.ln1(self.dropout(self.attn_out(self.attention(x, mask))) + x)
            return self.ln2(self.dropout(self.output(F.gelu(self.intermediate(x)))) + x)

    class Bert(nn.Module):
        def __init__(self, finfo=False):
            super().__init__()
            self.word = nn.Embedding(VOCAB, D)
            self.pos = nn.Embedding(MAXLEN, D)
            self.tok_type = nn.Embedding(2, D)
            self.ln = nn.LayerNorm(D, eps=1e-12)
            self.register_buffer("position_ids", torch.arange(MAXLEN).expand((1, -1)), persistent=False)
            self.layers = nn.ModuleList(BertLayer() for _ in range(LAYERS))
            self.finfo = finfo

        def forward(self, input_ids, attention_mask, token_type_ids):
            seq = input_ids.size(1)
            pos = self.position_ids[:, :seq]
            x = self.ln(self.word(input_ids) + self.tok_type(token_type_ids) + self.pos(pos))
            ext = attention_mask[:, None, None, :].to(dtype=x.dtype)
            ext = (1.0 - ext) * (torch.finfo(x.dtype).min if self.finfo else -10000.0)
            for layer in self.layers:
                x = layer(x, ext)
            return x

    class DistilAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.n_heads, self.dim = H, D
            self.q_lin, self.k_lin, self.v_lin, self.out_lin = (nn.Linear(D, D) for _ in range(4))
            self.dropout = nn.Dropout(0.1)

        def forward(self, x, mask):
            bs, q_length, dim = x.size()
            dim_per_head = self.dim // self.n_heads
            mask_reshp = (bs, 1, 1, x.size(1))

            def shape(t):
                return t.view(bs, -1, self.n_heads, dim_per_head).transpose(1, 2)

            q = shape(self.q_lin(x)) / math.sqrt(dim_per_head)
            k, v = shape(self.k_lin(x)), shape(self.v_lin(x))
            scores = torch.matmul(q, k.transpose(2, 3))
            m = (mask == 0).view(mask_reshp).expand_as(scores)
            scores = scores.masked_fill(m, torch.tensor(torch.finfo(scores.dtype).min))
            weights = self.dropout(nn.functional.softmax(scores, dim=-1))
            ctx = torch.matmul(weights, v).transpose(1, 2).contiguous().view(bs, -1, self.n_heads * dim_per_head)
            return self.out_lin(ctx)

    class DistilBert(nn.Module):
        def __init__(self):
            super().__init__()
            self.word, self.pos = nn.Embedding(VOCAB, D), nn.Embedding(MAXLEN, D)
            self.ln = nn.LayerNorm(D, eps=1e-12)
            self.att = nn.ModuleList(DistilAttention() for _ in range(LAYERS))
            self.sa_ln = nn.ModuleList(nn.LayerNorm(D, eps=1e-12) for _ in range(LAYERS))
            self.ff = nn.ModuleList(nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
                                    for _ in range(LAYERS))
            self.out_ln = nn.ModuleList(nn.LayerNorm(D, eps=1e-12) for _ in range(LAYERS))

        def forward(self, input_ids, attention_mask):
            pos = torch.arange(input_ids.size(1), dtype=torch.long).unsqueeze(0).expand_as(input_ids)
            x = self.ln(self.word(input_ids) + self.pos(pos))
            for att, ln1, ff, ln2 in zip(self.att, self.sa_ln, self.ff, self.out_ln):
                x = ln1(att(x, attention_mask) + x)
                x = ln2(ff(x) + x)
            return x

    class Conv1D(nn.Module):
        """GPT-2's transposed Linear: ``addmm(b, x.view(-1, nx), W)``."""

        def __init__(self, nf, nx):
            super().__init__()
            self.nf = nf
            self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
            self.bias = nn.Parameter(torch.randn(nf) * 0.02)

        def forward(self, x):
            size_out = x.size()[:-1] + (self.nf,)
            return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size_out)

    class GPT2Attention(nn.Module):
        def __init__(self, sdpa=False):
            super().__init__()
            self.register_buffer("bias", torch.tril(torch.ones((MAXLEN, MAXLEN), dtype=torch.bool)).view(
                1, 1, MAXLEN, MAXLEN), persistent=False)
            self.num_heads, self.head_dim, self.split_size = H, D // H, D
            self.c_attn, self.c_proj = Conv1D(3 * D, D), Conv1D(D, D)
            self.attn_dropout, self.resid_dropout = nn.Dropout(0.1), nn.Dropout(0.1)
            self.sdpa = sdpa

        def _split_heads(self, t):
            return t.view(t.size()[:-1] + (self.num_heads, self.head_dim)).permute(0, 2, 1, 3)

        def forward(self, x):
            q, k, v = self.c_attn(x).split(self.split_size, dim=2)
            q, k, v = self._split_heads(q), self._split_heads(k), self._split_heads(v)
            if self.sdpa:
                a = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=True)
            else:
                w = torch.matmul(q, k.transpose(-1, -2))
                w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype, device=w.device)
                ql, kl = q.size(-2), k.size(-2)
                causal = self.bias[:, :, kl - ql:kl, :kl]
                mask_value = torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype, device=w.device)
                w = torch.where(causal, w.to(w.dtype), mask_value)
                w = self.attn_dropout(nn.functional.softmax(w, dim=-1))
                a = torch.matmul(w, v)
            a = a.permute(0, 2, 1, 3).contiguous()
            a = a.view(a.size()[:-2] + (self.num_heads * self.head_dim,))
            return self.resid_dropout(self.c_proj(a))

    class GPT2(nn.Module):
        def __init__(self, sdpa=False):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(MAXLEN, D)
            self.ln_1 = nn.ModuleList(nn.LayerNorm(D) for _ in range(LAYERS))
            self.attn = nn.ModuleList(GPT2Attention(sdpa) for _ in range(LAYERS))
            self.ln_2 = nn.ModuleList(nn.LayerNorm(D) for _ in range(LAYERS))
            self.c_fc = nn.ModuleList(Conv1D(4 * D, D) for _ in range(LAYERS))
            self.c_fc_proj = nn.ModuleList(Conv1D(D, 4 * D) for _ in range(LAYERS))
            self.ln_f = nn.LayerNorm(D)

        @staticmethod
        def gelu_new(x):
            return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

        def forward(self, input_ids):
            pos = torch.arange(0, input_ids.size(-1), dtype=torch.long).unsqueeze(0)
            x = self.wte(input_ids) + self.wpe(pos)
            for ln1, att, ln2, fc, proj in zip(self.ln_1, self.attn, self.ln_2, self.c_fc, self.c_fc_proj):
                x = att(ln1(x)) + x
                x = proj(self.gelu_new(fc(ln2(x)))) + x
            return self.ln_f(x)

    class ViT(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch = nn.Conv2d(3, D, 4, stride=4)
            self.cls = nn.Parameter(torch.randn(1, 1, D) * 0.02)
            self.pos = nn.Parameter(torch.randn(1, 17, D) * 0.02)
            self.layers = nn.ModuleList(BertLayer(pre_ln=True) for _ in range(LAYERS))
            self.ln = nn.LayerNorm(D, eps=1e-12)

        def forward(self, pixel_values):
            x = self.patch(pixel_values).flatten(2).transpose(1, 2)
            x = torch.cat((self.cls.expand(x.shape[0], -1, -1), x), dim=1) + self.pos
            for layer in self.layers:
                x = layer(x)
            return self.ln(x)

    class T5LayerNorm(nn.Module):
        def __init__(self, eps=1e-6):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(D) + 0.1 * torch.randn(D))
            self.variance_epsilon = eps

        def forward(self, x):
            variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
            return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))

    class T5Attention(nn.Module):
        def __init__(self, has_bias):
            super().__init__()
            self.n_heads, self.key_value_proj_dim, self.inner_dim = H, D // H, D
            self.q, self.k, self.v, self.o = (nn.Linear(D, D, bias=False) for _ in range(4))
            self.num_buckets, self.max_distance = 32, 128
            self.has_bias = has_bias
            self.dropout = nn.Dropout(0.1)
            if has_bias:
                self.relative_attention_bias = nn.Embedding(self.num_buckets, H)

        @staticmethod
        def _bucket(rel, num_buckets, max_distance):
            num_buckets //= 2
            buckets = (rel > 0).to(torch.long) * num_buckets
            rel = torch.abs(rel)
            max_exact = num_buckets // 2
            is_small = rel < max_exact
            large = max_exact + (torch.log(rel.float() / max_exact) / math.log(max_distance / max_exact)
                                 * (num_buckets - max_exact)).to(torch.long)
            large = torch.min(large, torch.full_like(large, num_buckets - 1))
            return buckets + torch.where(is_small, rel, large)

        def compute_bias(self, q_len, k_len):
            ctx = torch.arange(q_len, dtype=torch.long)[:, None]
            mem = torch.arange(k_len, dtype=torch.long)[None, :]
            buckets = self._bucket(mem - ctx, self.num_buckets, self.max_distance)
            return self.relative_attention_bias(buckets).permute([2, 0, 1]).unsqueeze(0)

        def forward(self, x, mask, position_bias=None):
            bs, seq = x.shape[:2]

            def shape(t):
                return t.view(bs, -1, self.n_heads, self.key_value_proj_dim).transpose(1, 2)

            q, k, v = shape(self.q(x)), shape(self.k(x)), shape(self.v(x))
            scores = torch.matmul(q, k.transpose(3, 2))
            if position_bias is None:
                position_bias = self.compute_bias(seq, seq) + mask
            scores += position_bias
            w = self.dropout(nn.functional.softmax(scores.float(), dim=-1).type_as(scores))
            ctx = torch.matmul(w, v).transpose(1, 2).contiguous().view(bs, -1, self.inner_dim)
            return self.o(ctx), position_bias

    class T5(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, D)
            self.ln1 = nn.ModuleList(T5LayerNorm() for _ in range(LAYERS))
            self.att = nn.ModuleList(T5Attention(i == 0) for i in range(LAYERS))
            self.ln2 = nn.ModuleList(T5LayerNorm() for _ in range(LAYERS))
            self.wi = nn.ModuleList(nn.Linear(D, 4 * D, bias=False) for _ in range(LAYERS))
            self.wo = nn.ModuleList(nn.Linear(4 * D, D, bias=False) for _ in range(LAYERS))
            self.final = T5LayerNorm()

        def forward(self, input_ids, attention_mask):
            x = self.embed(input_ids)
            ext = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
            bias = None
            for ln1, att, ln2, wi, wo in zip(self.ln1, self.att, self.ln2, self.wi, self.wo):
                y, bias = att(ln1(x), ext, bias)
                x = x + y
                x = x + wo(F.relu(wi(ln2(x))))
            return self.final(x)

    class WhisperAttention(nn.Module):
        def __init__(self, sdpa):
            super().__init__()
            self.num_heads, self.head_dim, self.scaling, self.sdpa = H, D // H, (D // H) ** -0.5, sdpa
            self.k_proj = nn.Linear(D, D, bias=False)
            self.v_proj, self.q_proj, self.out_proj = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)

        def _shape(self, t, seq, bsz):
            return t.view(bsz, seq, self.num_heads, self.head_dim).transpose(1, 2).contiguous()

        def forward(self, x):
            bsz, tgt_len, _ = x.size()
            if self.sdpa:
                q = self._shape(self.q_proj(x), tgt_len, bsz)
                k, v = self._shape(self.k_proj(x), -1, bsz), self._shape(self.v_proj(x), -1, bsz)
                a = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False)
            else:
                q = self._shape(self.q_proj(x) * self.scaling, tgt_len, bsz)
                k, v = self._shape(self.k_proj(x), -1, bsz), self._shape(self.v_proj(x), -1, bsz)
                w = nn.functional.softmax(torch.matmul(q, k.transpose(2, 3)), dim=-1)
                a = torch.matmul(w, v)
            return self.out_proj(a.transpose(1, 2).reshape(bsz, tgt_len, D))

    class Whisper(nn.Module):
        def __init__(self, sdpa=False):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv1d(8, D, 3, padding=1), nn.Conv1d(D, D, 3, stride=2, padding=1)
            self.embed_positions = nn.Parameter(torch.randn(MAXLEN, D) * 0.02)
            self.ln1 = nn.ModuleList(nn.LayerNorm(D) for _ in range(LAYERS))
            self.attn = nn.ModuleList(WhisperAttention(sdpa) for _ in range(LAYERS))
            self.ln2 = nn.ModuleList(nn.LayerNorm(D) for _ in range(LAYERS))
            self.fc1 = nn.ModuleList(nn.Linear(D, 4 * D) for _ in range(LAYERS))
            self.fc2 = nn.ModuleList(nn.Linear(4 * D, D) for _ in range(LAYERS))
            self.ln = nn.LayerNorm(D)

        def forward(self, input_features):
            x = F.gelu(self.conv2(F.gelu(self.conv1(input_features)))).permute(0, 2, 1)
            x = x + self.embed_positions[: x.size(1)]
            for ln1, att, ln2, fc1, fc2 in zip(self.ln1, self.attn, self.ln2, self.fc1, self.fc2):
                x = x + att(ln1(x))
                x = x + fc2(F.gelu(fc1(ln2(x))))
            return self.ln(x)

    return {"bert": lambda: Bert(), "bert_finfo": lambda: Bert(finfo=True), "distilbert": DistilBert,
            "gpt2": lambda: GPT2(), "gpt2_sdpa": lambda: GPT2(sdpa=True), "vit": ViT, "t5": T5,
            "whisper": lambda: Whisper(), "whisper_sdpa": lambda: Whisper(sdpa=True)}


_CLASSES: dict = {}


def _module(name):
    import torch

    if not _CLASSES:
        _CLASSES.update(_define())
    torch.manual_seed(0)
    m = _CLASSES[name]()
    with torch.no_grad():  # non-trivial LayerNorm affines, so that a dropped gamma/beta shows
        for mod in m.modules():
            if isinstance(mod, torch.nn.LayerNorm):
                mod.weight.normal_(1.0, 0.1)
                mod.bias.normal_(0.0, 0.1)
    return m.eval()


def _inputs(name, batch, seq, seed):
    """Named example inputs: token ids with a right-padded 0/1 mask (rows of different
    lengths), token types, or pixels."""
    import torch

    g = torch.Generator().manual_seed(seed)
    if name == "vit":
        return {"pixel_values": torch.randn(batch, 3, 16, 16, generator=g)}
    if name.startswith("whisper"):  # 8 mel bins, 2 * seq frames (the stride-2 conv halves them)
        return {"input_features": torch.randn(batch, 8, 2 * seq, generator=g)}
    ids = torch.randint(1, VOCAB, (batch, seq), generator=g)
    if name.startswith("gpt2"):
        return {"input_ids": ids}
    mask = torch.ones(batch, seq, dtype=torch.int64)
    for i in range(1, batch):
        mask[i, max(1, seq - 2 * i):] = 0
    feeds = {"input_ids": ids, "attention_mask": mask}
    if name.startswith("bert"):
        feeds["token_type_ids"] = (torch.arange(seq)[None, :] >= seq // 2).to(torch.int64).expand(batch, -1)
    return feeds


@dataclass
class Export:
    name: str
    exporter: str
    opset: int
    dynamic: bool
    model: onnx.ModelProto
    feeds: dict  # numpy inputs to run with (another batch and length when the axes are dynamic)


def export(name: str, exporter: str, opset: int, dynamic: bool) -> Export:
    """``name`` exported by ``exporter`` ("torchscript" or "dynamo") at ``opset``, with the
    batch and sequence axes dynamic or not. Exported at batch 2 seq 8; run at batch 3 seq 7
    when dynamic (the same shape otherwise)."""
    import torch

    m = _module(name)
    ex = _inputs(name, 2, 8, 1)
    names = list(ex)
    # (Whisper's frames are fixed, as in the model: its positions are a parameter of that length)
    axes = {n: ({0: "batch"} if n in ("pixel_values", "input_features") else {0: "batch", 1: "seq"}) for n in names}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            buf = io.BytesIO()
            torch.onnx.export(m, tuple(ex.values()), buf, dynamo=False, opset_version=opset, input_names=names,
                              output_names=["y"], dynamic_axes=axes if dynamic else None)
            model = onnx.load_from_string(buf.getvalue())
        else:
            shapes = None
            if dynamic:
                dims = {"batch": torch.export.Dim("batch", min=1, max=16), "seq": torch.export.Dim("seq", min=2,
                                                                                                  max=MAXLEN)}
                shapes = tuple({a: dims[d] for a, d in axes[n].items()} for n in names)
            prog = torch.onnx.export(m, tuple(ex.values()), dynamo=True, opset_version=opset, input_names=names,
                                     output_names=["y"], dynamic_shapes=shapes, verbose=False)
            model = prog.model_proto
    run = _inputs(name, 3, 8 if "input_features" in ex else 7, 2) if dynamic else _inputs(name, 2, 8, 2)
    return Export(name, exporter, opset, dynamic, model, {k: v.numpy() for k, v in run.items()})


FUSED = ("Attention", "MultiHeadAttention", "SkipLayerNormalization", "LayerNormalization",
         "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization", "Gelu",
         "FastGelu", "BiasGelu", "Softmax")


def fused_counts(model: onnx.ModelProto) -> tuple[int, int, dict]:
    """(nodes before, nodes after, {fused op: count}) of ``optimize()`` at the ALL level."""
    from runtime_core.graph import Graph
    from runtime_core.optimizer import optimize

    g = Graph(model)
    before = len(g.nodes)
    optimize(g, 99)
    ops = [n.op_type for n in g.nodes]
    return before, len(ops), {op: ops.count(op) for op in FUSED if op in ops}


def _survey():  # pragma: no cover - a report, run by hand
    import sys
    import time

    combos = [("torchscript", o, dyn) for o in (14, 17, 20) for dyn in (False, True)] + [
        ("dynamo", 18, True), ("dynamo", 20, False)]
    names = sys.argv[1:] or VARIANTS
    for name in names:
        for exporter, opset, dyn in combos:
            t = time.perf_counter()
            try:
                ex = export(name, exporter, opset, dyn)
            except Exception as e:  # noqa: BLE001
                print(f"{name:11s} {exporter:11s} {opset:2d} {'dyn' if dyn else 'static':6s} export failed: "
                      f"{type(e).__name__}: {str(e)[:100]}")
                continue
            te = time.perf_counter() - t
            before, after, counts = fused_counts(ex.model)
            print(f"{name:11s} {exporter:11s} {opset:2d} {'dyn' if dyn else 'static':6s} {before:4d} -> {after:4d} "
                  f"{counts} (export {te:.1f}s)", flush=True)


if __name__ == "__main__":
    _survey()
