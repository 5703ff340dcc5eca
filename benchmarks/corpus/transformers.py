"""Transformer families written out in plain torch as their reference implementations (Hugging
Face's modeling code) lay them out, so that the exports have the real structure: HF-style BERT,
DistilBERT, GPT-2, ViT, a T5-style encoder, a Whisper-style encoder and an ALBERT-style encoder
whose layers share one set of weights.

Every builder is ``builder(path, size, *, exporter, opset, dynamic, batch, seq, cfg)``: it
exports to ``path`` and returns the feeds. ``size="tiny"`` swaps in a small config (and at most
batch 2, seq 16) with the same structure, for the test suite.
"""

from __future__ import annotations

import math

import numpy as np

from ._export import export, init_transformer

#: (layers, hidden, heads, feed-forward, vocab)
CONFIGS = {
    "base": (12, 768, 12, 3072, 30522),  # BERT-base / DistilBERT (6 layers) / ViT-B
    "small": (4, 512, 8, 2048, 30522),  # BERT-small
    "gpt2": (12, 768, 12, 3072, 50257),  # GPT-2 small
    "vit_s": (12, 384, 6, 1536, 0),  # ViT-S/16
    "vit_ti": (12, 192, 3, 768, 0),  # ViT-Ti/16
    "t5_small": (6, 512, 8, 2048, 32128),  # t5-small encoder
    "whisper_tiny": (4, 384, 6, 1536, 0),  # whisper-tiny encoder
    "whisper_base": (6, 512, 8, 2048, 0),  # whisper-base encoder
    "tiny": (2, 32, 2, 64, 100),
}


def _shrink(size, cfg, batch, seq):
    if size == "tiny":
        return CONFIGS["tiny"], min(batch, 2), min(seq, 16)
    return CONFIGS[cfg], batch, seq


def _axes(dynamic, names_2d=(), names_out=()):
    """dynamic_axes for token inputs [batch, seq] and outputs [batch, seq, ...]."""
    if not dynamic:
        return None
    axes = {n: {0: "batch", 1: "seq"} for n in names_2d}
    axes.update({n: {0: "batch", 1: "seq"} for n in names_out})
    return axes


def _ids(batch, seq, vocab, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=(batch, seq)).astype(np.int64)
    mask = np.ones((batch, seq), np.int64)
    for b in range(batch):  # padded rows, as a batch of real sentences has
        mask[b, seq - (b * seq) // (2 * max(batch, 1)):] = 0
    return ids, mask


# -- BERT (HF BertModel) ----------------------------------------------------------------------

def _export_ids_mask(cls, path, batch, seq, vocab, *, exporter, opset, dynamic, std=None):
    """Seeded ``cls()``, its weights initialised, exported with ``input_ids`` and ``attention_mask``
    in and ``last_hidden_state`` out; returns the feeds."""
    import torch

    torch.manual_seed(0)
    m = cls()
    if std is None:
        init_transformer(m)
    else:
        init_transformer(m, std=std)
    ids, mask = _ids(batch, seq, vocab)
    names = ["input_ids", "attention_mask"]
    export(m, (torch.from_numpy(ids), torch.from_numpy(mask)), path, inputs=names, outputs=["last_hidden_state"],
           exporter=exporter, opset=opset, dynamic=_axes(dynamic, names, ["last_hidden_state"]))
    return {"input_ids": ids, "attention_mask": mask}


def _bert_modules():
    import torch
    from torch import nn

    class SelfAttention(nn.Module):
        def __init__(self, d, h):
            super().__init__()
            self.h, self.dh = h, d // h
            self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

        def split(self, x):
            return x.view(x.size()[:-1] + (self.h, self.dh)).permute(0, 2, 1, 3)

        def forward(self, x, ext_mask):
            q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.dh)
            if ext_mask is not None:  # ViT has no mask
                scores = scores + ext_mask
            ctx = torch.matmul(nn.functional.softmax(scores, dim=-1), v).permute(0, 2, 1, 3).contiguous()
            return ctx.view(ctx.size()[:-2] + (self.h * self.dh,))

    class Layer(nn.Module):
        def __init__(self, d, h, ff):
            super().__init__()
            self.attn = SelfAttention(d, h)
            self.attn_out, self.ln1 = nn.Linear(d, d), nn.LayerNorm(d, eps=1e-12)
            self.inter, self.out, self.ln2 = nn.Linear(d, ff), nn.Linear(ff, d), nn.LayerNorm(d, eps=1e-12)

        def forward(self, x, ext_mask):
            x = self.ln1(self.attn_out(self.attn(x, ext_mask)) + x)
            return self.ln2(self.out(nn.functional.gelu(self.inter(x))) + x)

    return SelfAttention, Layer


def bert(path, size, *, exporter, opset, dynamic, batch, seq, cfg="base"):
    """HF-style BertModel: word + position + token type embeddings, the extended attention mask
    ``(1 - mask) * finfo.min``, post-LN layers, erf GELU, pooler; outputs the last hidden state
    and the pooled output."""
    import torch
    from torch import nn

    (layers, d, h, ff, vocab), batch, seq = _shrink(size, cfg, batch, seq)
    _, Layer = _bert_modules()

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.word, self.pos, self.token_type = nn.Embedding(vocab, d), nn.Embedding(512, d), nn.Embedding(2, d)
            self.ln = nn.LayerNorm(d, eps=1e-12)
            self.register_buffer("position_ids", torch.arange(512).expand((1, -1)), persistent=False)
            self.layers = nn.ModuleList(Layer(d, h, ff) for _ in range(layers))
            self.pooler = nn.Linear(d, d)

        def forward(self, input_ids, attention_mask, token_type_ids):
            n = input_ids.size(1)
            x = self.word(input_ids) + self.token_type(token_type_ids) + self.pos(self.position_ids[:, :n])
            x = self.ln(x)
            ext = attention_mask[:, None, None, :].to(torch.float32)
            ext = (1.0 - ext) * torch.finfo(torch.float32).min
            for layer in self.layers:
                x = layer(x, ext)
            return x, torch.tanh(self.pooler(x[:, 0]))

    torch.manual_seed(0)
    m = Bert()
    init_transformer(m)
    ids, mask = _ids(batch, seq, vocab)
    tt = np.zeros_like(ids)
    tt[:, seq // 2:] = 1
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = _axes(dynamic, names, ["last_hidden_state"])
    if axes:
        axes["pooler_output"] = {0: "batch"}
    export(m, tuple(torch.from_numpy(a) for a in (ids, mask, tt)), path, inputs=names,
           outputs=["last_hidden_state", "pooler_output"], exporter=exporter, opset=opset, dynamic=axes)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": tt}


def albert(path, size, *, exporter, opset, dynamic, batch, seq, cfg="base"):
    """ALBERT-style encoder: factorised embeddings (128 -> hidden) and one BERT layer whose weights
    every one of the ``layers`` repeats shares (the exporter stores them once; each use is a
    separate subgraph on the same initializers)."""
    import torch
    from torch import nn

    (layers, d, h, ff, vocab), batch, seq = _shrink(size, cfg, batch, seq)
    e = 128 if size != "tiny" else 16
    _, Layer = _bert_modules()

    class Albert(nn.Module):
        def __init__(self):
            super().__init__()
            self.word, self.pos, self.token_type = nn.Embedding(vocab, e), nn.Embedding(512, e), nn.Embedding(2, e)
            self.ln, self.proj = nn.LayerNorm(e, eps=1e-12), nn.Linear(e, d)
            self.layer = Layer(d, h, ff)

        def forward(self, input_ids, attention_mask):
            n = input_ids.size(1)
            pos = torch.arange(n, device=input_ids.device).unsqueeze(0)
            x = self.proj(self.ln(self.word(input_ids) + self.pos(pos) + self.token_type(torch.zeros_like(input_ids))))
            ext = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * torch.finfo(torch.float32).min
            for _ in range(layers):
                x = self.layer(x, ext)
            return x

    return _export_ids_mask(Albert, path, batch, seq, vocab, exporter=exporter, opset=opset, dynamic=dynamic)


# -- DistilBERT (HF DistilBertModel) ------------------------------------------------------------

def distilbert(path, size, *, exporter, opset, dynamic, batch, seq, cfg="base"):
    """HF-style DistilBertModel: 6 layers (of the config's width), q scaled before the product,
    the mask applied with ``masked_fill(mask == 0, finfo.min)``, no token types, no pooler."""
    import torch
    from torch import nn

    (layers, d, h, ff, vocab), batch, seq = _shrink(size, cfg, batch, seq)
    layers = layers // 2 if size != "tiny" else layers
    dh = d // h

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_lin, self.k_lin, self.v_lin, self.out_lin = (nn.Linear(d, d) for _ in range(4))
            self.sa_layer_norm = nn.LayerNorm(d, eps=1e-12)
            self.lin1, self.lin2 = nn.Linear(d, ff), nn.Linear(ff, d)
            self.output_layer_norm = nn.LayerNorm(d, eps=1e-12)

        def forward(self, x, mask):
            bs, k_len = x.size(0), x.size(1)

            def shape(t):
                return t.view(bs, -1, h, dh).transpose(1, 2)

            q = shape(self.q_lin(x)) / math.sqrt(dh)
            k, v = shape(self.k_lin(x)), shape(self.v_lin(x))
            scores = torch.matmul(q, k.transpose(2, 3))
            m = (mask == 0).view(bs, 1, 1, k_len).expand_as(scores)
            scores = scores.masked_fill(m, torch.tensor(torch.finfo(scores.dtype).min))
            ctx = torch.matmul(nn.functional.softmax(scores, dim=-1), v).transpose(1, 2).reshape(bs, -1, h * dh)
            x = self.sa_layer_norm(self.out_lin(ctx) + x)
            return self.output_layer_norm(self.lin2(nn.functional.gelu(self.lin1(x))) + x)

    class DistilBert(nn.Module):
        def __init__(self):
            super().__init__()
            self.word, self.pos = nn.Embedding(vocab, d), nn.Embedding(512, d)
            self.ln = nn.LayerNorm(d, eps=1e-12)
            self.register_buffer("position_ids", torch.arange(512).expand((1, -1)), persistent=False)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))

        def forward(self, input_ids, attention_mask):
            x = self.ln(self.word(input_ids) + self.pos(self.position_ids[:, : input_ids.size(1)]))
            for b in self.blocks:
                x = b(x, attention_mask)
            return x

    return _export_ids_mask(DistilBert, path, batch, seq, vocab, exporter=exporter, opset=opset, dynamic=dynamic)


# -- GPT-2 (HF GPT2LMHeadModel) -------------------------------------------------------------------

def gpt2(path, size, *, exporter, opset, dynamic, batch, seq, cfg="gpt2", attention="buffer"):
    """HF-style GPT-2 with its LM head (tied to the token embedding): Conv1D projections
    (``addmm`` on the flattened input), ``gelu_new`` written out with tanh, pre-LN blocks.
    ``attention="buffer"``: the causal mask is a registered lower-triangular bool buffer sliced to
    the sequence and applied with ``torch.where(mask, scores, finfo.min)`` (HF's eager path);
    ``"sdpa"``: ``scaled_dot_product_attention(..., is_causal=True)``."""
    import torch
    from torch import nn

    (layers, d, h, _, vocab), batch, seq = _shrink(size, cfg, batch, seq)
    n_ctx = 1024

    class Conv1D(nn.Module):
        def __init__(self, nf, nx):
            super().__init__()
            self.weight, self.bias = nn.Parameter(torch.empty(nx, nf)), nn.Parameter(torch.zeros(nf))

        def forward(self, x):
            out = x.size()[:-1] + (self.weight.size(-1),)
            return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(out)

    def gelu_new(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn, self.c_proj = Conv1D(3 * d, d), Conv1D(d, d)
            if attention == "buffer":
                self.register_buffer("bias", torch.tril(torch.ones((n_ctx, n_ctx), dtype=torch.bool))
                                     .view(1, 1, n_ctx, n_ctx), persistent=False)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.c_attn(x).split(d, dim=2)
            q, k, v = (z.view(b, t, h, d // h).permute(0, 2, 1, 3) for z in (q, k, v))
            if attention == "sdpa":
                y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                w = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], v.size(-1) ** 0.5, dtype=q.dtype)
                q_len, k_len = q.size(-2), k.size(-2)
                causal = self.bias[:, :, k_len - q_len: k_len, :k_len]
                w = torch.where(causal, w, torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype))
                y = torch.matmul(nn.functional.softmax(w, dim=-1), v)
            return self.c_proj(y.permute(0, 2, 1, 3).contiguous().view(b, t, d))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(d, eps=1e-5), nn.LayerNorm(d, eps=1e-5)
            self.attn = Attn()
            self.c_fc, self.c_proj = Conv1D(4 * d, d), Conv1D(d, 4 * d)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.c_proj(gelu_new(self.c_fc(self.ln_2(x))))

    class GPT2(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(n_ctx, d)
            self.h = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(d, eps=1e-5)
            self.lm_head = nn.Linear(d, vocab, bias=False)
            self.lm_head.weight = self.wte.weight  # tied, as GPT2LMHeadModel

        def forward(self, input_ids):
            pos = torch.arange(input_ids.size(-1), dtype=torch.long).unsqueeze(0)
            x = self.wte(input_ids) + self.wpe(pos)
            for blk in self.h:
                x = blk(x)
            return self.lm_head(self.ln_f(x))

    torch.manual_seed(0)
    m = GPT2()
    init_transformer(m)
    ids, _ = _ids(batch, seq, vocab)
    export(m, (torch.from_numpy(ids),), path, inputs=["input_ids"], outputs=["logits"], exporter=exporter,
           opset=opset, dynamic=_axes(dynamic, ["input_ids"], ["logits"]))
    return {"input_ids": ids}


# -- ViT (HF ViTModel) ----------------------------------------------------------------------------

def vit(path, size, *, exporter, opset, dynamic, batch, seq=0, cfg="vit_s"):
    """HF-style ViT: 16x16 patch convolution, class token, learned positions, pre-LN blocks with
    separate q/k/v projections, GELU MLP, final LayerNorm and a 1000-way head on the class token;
    224 x 224 images (32 x 32 with patch 8 at the tiny size)."""
    import torch
    from torch import nn

    (layers, d, h, ff, _), batch, _ = _shrink(size, cfg, batch, 16)
    img, patch = (224, 16) if size != "tiny" else (32, 8)
    n = (img // patch) ** 2
    SelfAttention, _ = _bert_modules()

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_before, self.ln_after = nn.LayerNorm(d, eps=1e-12), nn.LayerNorm(d, eps=1e-12)
            self.attn, self.attn_out = SelfAttention(d, h), nn.Linear(d, d)
            self.inter, self.out = nn.Linear(d, ff), nn.Linear(ff, d)

        def forward(self, x):
            x = self.attn_out(self.attn(self.ln_before(x), None)) + x
            return self.out(nn.functional.gelu(self.inter(self.ln_after(x)))) + x

    class ViT(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch = nn.Conv2d(3, d, patch, patch)
            self.cls = nn.Parameter(torch.zeros(1, 1, d))
            self.pos = nn.Parameter(torch.zeros(1, n + 1, d))
            self.layers = nn.ModuleList(Layer() for _ in range(layers))
            self.ln = nn.LayerNorm(d, eps=1e-12)
            self.head = nn.Linear(d, 1000 if size != "tiny" else 10)

        def forward(self, pixel_values):
            x = self.patch(pixel_values).flatten(2).transpose(1, 2)
            x = torch.cat((self.cls.expand(x.shape[0], -1, -1), x), dim=1) + self.pos
            for layer in self.layers:
                x = layer(x)
            return self.head(self.ln(x)[:, 0, :])

    torch.manual_seed(0)
    m = ViT()
    init_transformer(m)
    x = np.random.default_rng(0).standard_normal((batch, 3, img, img)).astype(np.float32)
    axes = {"pixel_values": {0: "batch"}, "logits": {0: "batch"}} if dynamic else None
    export(m, (torch.from_numpy(x),), path, inputs=["pixel_values"], outputs=["logits"], exporter=exporter,
           opset=opset, dynamic=axes)
    return {"pixel_values": x}


# -- T5 encoder (HF T5EncoderModel) ---------------------------------------------------------------

def t5_encoder(path, size, *, exporter, opset, dynamic, batch, seq, cfg="t5_small"):
    """HF-style T5 encoder: RMSNorm (T5LayerNorm: no mean, no bias), unscaled attention scores plus
    a bucketed relative position bias computed in the first layer and shared by the rest, the
    extended mask added to it, ReLU feed-forward without biases."""
    import torch
    from torch import nn

    (layers, d, h, ff, vocab), batch, seq = _shrink(size, cfg, batch, seq)
    dh, buckets, max_dist = d // h, 32, 128

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight, self.eps = nn.Parameter(torch.ones(d)), 1e-6

        def forward(self, x):
            variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
            return self.weight * (x * torch.rsqrt(variance + self.eps))

    def bucket(rel):  # bidirectional, as T5Attention._relative_position_bucket
        nb = buckets // 2
        out = (rel > 0).to(torch.long) * nb
        rel = torch.abs(rel)
        max_exact = nb // 2
        is_small = rel < max_exact
        large = max_exact + (torch.log(rel.float() / max_exact) / math.log(max_dist / max_exact)
                             * (nb - max_exact)).to(torch.long)
        large = torch.min(large, torch.full_like(large, nb - 1))
        return out + torch.where(is_small, rel, large)

    class Attn(nn.Module):
        def __init__(self, has_bias):
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
            self.rel = nn.Embedding(buckets, h) if has_bias else None

        def position_bias(self, n):
            ctx = torch.arange(n, dtype=torch.long)[:, None]
            mem = torch.arange(n, dtype=torch.long)[None, :]
            return self.rel(bucket(mem - ctx)).permute([2, 0, 1]).unsqueeze(0)

        def forward(self, x, bias):
            b, n, _ = x.shape
            q, k, v = (z(x).view(b, -1, h, dh).transpose(1, 2) for z in (self.q, self.k, self.v))
            scores = torch.matmul(q, k.transpose(3, 2)) + bias
            y = torch.matmul(nn.functional.softmax(scores.float(), dim=-1), v)
            return self.o(y.transpose(1, 2).contiguous().view(b, -1, d))

    class Layer(nn.Module):
        def __init__(self, first):
            super().__init__()
            self.ln1, self.attn, self.ln2 = RMSNorm(), Attn(first), RMSNorm()
            self.wi, self.wo = nn.Linear(d, ff, bias=False), nn.Linear(ff, d, bias=False)

        def forward(self, x, bias):
            x = x + self.attn(self.ln1(x), bias)
            return x + self.wo(nn.functional.relu(self.wi(self.ln2(x))))

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.layers = nn.ModuleList(Layer(i == 0) for i in range(layers))
            self.final = RMSNorm()

        def forward(self, input_ids, attention_mask):
            x = self.embed(input_ids)
            ext = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * torch.finfo(torch.float32).min
            bias = self.layers[0].attn.position_bias(input_ids.size(1)) + ext
            for layer in self.layers:
                x = layer(x, bias)
            return self.final(x)

    return _export_ids_mask(Encoder, path, batch, seq, vocab, exporter=exporter, opset=opset, dynamic=dynamic,
                            std=0.05)


# -- Whisper encoder (HF WhisperEncoder) ------------------------------------------------------------

def whisper_encoder(path, size, *, exporter, opset, dynamic, batch, seq=0, cfg="whisper_tiny"):
    """HF-style Whisper encoder: two Conv1d + GELU over 80 mel bins x 3000 frames (the second
    with stride 2: 1500 positions), sinusoidal positions, pre-LN blocks whose key projection has
    no bias and whose queries are scaled before the product, final LayerNorm. Tiny size: 160
    frames."""
    import torch
    from torch import nn

    (layers, d, h, ff, _), batch, _ = _shrink(size, cfg, batch, 16)
    mels, frames = 80, 3000 if size != "tiny" else 160
    dh = d // h

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj = nn.Linear(d, d), nn.Linear(d, d, bias=False)
            self.v_proj, self.out_proj = nn.Linear(d, d), nn.Linear(d, d)

        def forward(self, x):
            b, n, _ = x.shape
            q = (self.q_proj(x) * dh ** -0.5).view(b, n, h, dh).transpose(1, 2)
            k = self.k_proj(x).view(b, n, h, dh).transpose(1, 2)
            v = self.v_proj(x).view(b, n, h, dh).transpose(1, 2)
            w = nn.functional.softmax(torch.matmul(q, k.transpose(2, 3)), dim=-1)
            return self.out_proj(torch.matmul(w, v).transpose(1, 2).reshape(b, n, d))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.attn, self.ln2 = nn.LayerNorm(d), Attn(), nn.LayerNorm(d)
            self.fc1, self.fc2 = nn.Linear(d, ff), nn.Linear(ff, d)

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))

    def sinusoids(length, channels):
        inc = math.log(10000) / (channels // 2 - 1)
        inv = torch.exp(-inc * torch.arange(channels // 2))
        t = torch.arange(length)[:, None] * inv[None, :]
        return torch.cat([torch.sin(t), torch.cos(t)], dim=1)

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv1d(mels, d, 3, padding=1)
            self.conv2 = nn.Conv1d(d, d, 3, stride=2, padding=1)
            self.register_buffer("embed_positions", sinusoids(frames // 2, d))
            self.layers = nn.ModuleList(Layer() for _ in range(layers))
            self.ln = nn.LayerNorm(d)

        def forward(self, input_features):
            x = nn.functional.gelu(self.conv1(input_features))
            x = nn.functional.gelu(self.conv2(x)).permute(0, 2, 1)
            x = x + self.embed_positions
            for layer in self.layers:
                x = layer(x)
            return self.ln(x)

    torch.manual_seed(0)
    m = Encoder()
    init_transformer(m)
    x = np.random.default_rng(0).standard_normal((batch, mels, frames)).astype(np.float32)
    axes = {"input_features": {0: "batch"}, "last_hidden_state": {0: "batch"}} if dynamic else None
    export(m, (torch.from_numpy(x),), path, inputs=["input_features"], outputs=["last_hidden_state"],
           exporter=exporter, opset=opset, dynamic=axes)
    return {"input_features": x}
