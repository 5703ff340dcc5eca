"""Held-out models for the OpenCL acceptance checks, built and exported at test time (seeded):

* ``bert``: a BERT-style encoder written the way Hugging Face writes it: int64 token ids,
  Gather embeddings (token, position ids sliced from a buffer, token types expanded from a
  zero buffer), the int64 attention mask cast to bool, expanded to (batch, 1, seq, seq) and
  turned into an additive mask with ``torch.where`` (Cast int64->bool, Expand, Where in the
  graph: the Cast once wrote four bytes per one-byte bool element and corrupted the heap),
  post-LayerNorm blocks, exact GELU, a tanh pooler;
* ``resnet``: a ResNet-style CNN: stem Conv/BatchNorm/ReLU/MaxPool, basic blocks with
  strided 1x1-conv shortcuts, global average pooling, a Linear head.

Both are exported with a dynamic batch axis (``bert`` also a dynamic sequence length) by the
TorchScript exporter (``dynamo=False``) or the dynamo exporter. ``run.py``-style use:
``python heldout_builder.py MODEL EXPORTER [REPEATS]`` runs the model on ["opencl", "cpu"]
against onnxruntime and prints one JSON line (the tests run it in a subprocess, so a heap
corruption or a crash fails the test instead of the test run)."""

from __future__ import annotations

import io
import json
import math
import sys
import warnings

import numpy as np

HEAVY = {"Conv", "MatMul", "Gemm", "BatchNormalization", "LayerNormalization", "RMSNormalization",
         "GroupNormalization", "InstanceNormalization", "Softmax", "LogSoftmax",
         # contrib ops the optimizer could fuse heavy nodes into
         "Attention", "MultiHeadAttention", "SkipLayerNormalization", "FusedConv", "FusedGemm", "FusedMatMul",
         "EmbedLayerNormalization"}
VOCAB, MAX_LEN = 120, 40


def _define():
    import torch
    from torch import nn

    class SelfAttention(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.h, self.dk = heads, d // heads
            self.query, self.key, self.value, self.out = (nn.Linear(d, d) for _ in range(4))

        def forward(self, x, mask):
            b, t, d = x.shape
            q, k, v = (lin(x).view(b, -1, self.h, self.dk).permute(0, 2, 1, 3)
                       for lin in (self.query, self.key, self.value))
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.dk) + mask
            y = torch.matmul(nn.functional.softmax(scores, dim=-1), v)
            return self.out(y.permute(0, 2, 1, 3).contiguous().view(b, t, d))

    class Bert(nn.Module):
        def __init__(self, d=64, heads=4, layers=2):
            super().__init__()
            self.tok = nn.Embedding(VOCAB, d, padding_idx=0)
            self.pos = nn.Embedding(MAX_LEN, d)
            self.typ = nn.Embedding(2, d)
            self.eln = nn.LayerNorm(d, eps=1e-12)
            self.register_buffer("position_ids", torch.arange(MAX_LEN).expand((1, -1)), persistent=False)
            self.register_buffer("token_type_ids", torch.zeros((1, MAX_LEN), dtype=torch.long), persistent=False)
            self.blocks = nn.ModuleList(nn.ModuleDict({
                "att": SelfAttention(d, heads), "ln1": nn.LayerNorm(d, eps=1e-12),
                "ff": nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)),
                "ln2": nn.LayerNorm(d, eps=1e-12)}) for _ in range(layers))
            self.pooler = nn.Linear(d, d)

        def forward(self, input_ids, attention_mask):
            b, t = input_ids.shape
            types = self.token_type_ids[:, :t].expand(b, t)
            x = self.eln(self.tok(input_ids) + self.typ(types) + self.pos(self.position_ids[:, :t]))
            # the int64 mask as bool (Cast int64 -> bool), expanded, then an additive mask (Where)
            keep = attention_mask[:, None, None, :].bool().expand(b, 1, t, t)
            mask = torch.where(keep, torch.zeros((), dtype=x.dtype), torch.finfo(x.dtype).min)
            for blk in self.blocks:
                x = blk["ln1"](x + blk["att"](x, mask))
                x = blk["ln2"](x + blk["ff"](x))
            return x, torch.tanh(self.pooler(x[:, 0]))

    class Basic(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                          if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            return torch.relu(self.b2(self.c2(y)) + self.short(x))

    class ResNet(nn.Module):
        def __init__(self, classes=10):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
            self.layers = nn.Sequential(Basic(16, 16, 1), Basic(16, 32, 2), Basic(32, 48, 2))
            self.head = nn.Linear(48, classes)

        def forward(self, x):
            return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))

    return Bert, ResNet


def _token_batch(rng, lengths, t):
    ids = rng.integers(1, VOCAB, (len(lengths), t)).astype(np.int64)
    mask = np.zeros((len(lengths), t), np.int64)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        ids[i, n:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def build(model: str, exporter: str):
    """``(onnx bytes, [feed dicts])``: the export and feeds at several batch sizes (and
    sequence lengths for ``bert``), the export's own batch first."""
    import torch

    Bert, ResNet = _define()
    torch.manual_seed(0)
    rng = np.random.default_rng(7)
    if model == "bert":
        m = Bert().eval()
        feeds = [_token_batch(rng, [12, 9, 4], 12), _token_batch(rng, [10, 6], 10), _token_batch(rng, [7], 7),
                 _token_batch(rng, [16, 3, 16, 9, 1], 16)]
        names, outs = ["input_ids", "attention_mask"], ["last_hidden_state", "pooler_output"]
        dyn = {n: {0: "batch", 1: "seq"} for n in names}
    elif model == "resnet":
        m = ResNet().eval()
        with torch.no_grad():  # non-trivial BatchNorm statistics
            for mod in m.modules():
                if isinstance(mod, torch.nn.BatchNorm2d):
                    mod.running_mean.uniform_(-0.2, 0.2)
                    mod.running_var.uniform_(0.5, 1.5)
                    mod.weight.uniform_(0.5, 1.5)
                    mod.bias.uniform_(-0.2, 0.2)
        feeds = [{"x": rng.standard_normal((b, 3, 32, 32)).astype(np.float32)} for b in (2, 3, 1, 5)]
        names, outs = ["x"], ["logits"]
        dyn = {"x": {0: "batch"}}
    else:
        raise KeyError(f"unknown held-out model {model!r}; known: bert, resnet")
    args = tuple(torch.from_numpy(feeds[0][n]) for n in names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            buf = io.BytesIO()
            torch.onnx.export(m, args, buf, dynamo=False, opset_version=17, input_names=names,
                              output_names=outs, dynamic_axes=dyn)
            data = buf.getvalue()
        elif exporter == "dynamo":
            dims = {"batch": torch.export.Dim("batch", min=1, max=64), "seq": torch.export.Dim("seq", min=2, max=MAX_LEN)}
            shapes = tuple({ax: dims[d] for ax, d in dyn[n].items()} for n in names)
            data = torch.onnx.export(m, args, dynamo=True, opset_version=18, input_names=names, output_names=outs,
                                     dynamic_shapes=shapes, verbose=False).model_proto.SerializeToString()
        else:
            raise ValueError(f"exporter must be 'torchscript' or 'dynamo', got {exporter!r}")
    return data, feeds


def check(model: str, exporter: str, repeats: int, options: dict) -> dict:
    """Run ``model`` on ["opencl", "cpu"]: the heavy-node share on OpenCL, the largest
    difference from onnxruntime over every feed and repeat, and the batch sizes seen."""
    import onnx
    import onnxruntime as ort

    import runtime_core as rt

    data, feeds = build(model, exporter)
    proto = onnx.load_from_string(data)
    batch_dim = proto.graph.input[0].type.tensor_type.shape.dim[0]
    sess = rt.InferenceSession(data, providers=[("opencl", options), "cpu"])
    rep = sess.get_partition_report()
    heavy = [n for n in rep.nodes if n.op_type in HEAVY]
    so = ort.SessionOptions()
    so.log_severity_level = 3
    ref = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    expected = [ref.run(None, f) for f in feeds]
    worst = 0.0
    runs = 0
    for _ in range(repeats):
        for f, want in zip(feeds, expected):
            got = sess.run(None, f)
            runs += 1
            for a, b in zip(got, want):
                if a.shape != b.shape:
                    raise AssertionError(f"shape {a.shape} != onnxruntime's {b.shape}")
                worst = max(worst, float(np.max(np.abs(a.astype(np.float64) - b))))
                if not np.allclose(a, b, rtol=1e-3, atol=1e-3):
                    raise AssertionError(f"run {runs}: differs from onnxruntime by {worst}")
    from runtime_provider_opencl.device import get_context, select_device

    opts = sess.get_provider_options()["OpenCLExecutionProvider"]
    dev = get_context(select_device(opts["platform"], opts["device"]))
    return {"model": model, "exporter": exporter, "device": str(dev.info), "dynamic_batch": bool(batch_dim.dim_param),
            "heavy": len(heavy), "heavy_on_opencl": sum(n.provider == "OpenCLExecutionProvider" for n in heavy),
            "runs": runs, "max_abs_diff": worst, "batches": sorted({next(iter(f.values())).shape[0] for f in feeds}),
            "guard": dev.guard, "guard_checks": dev.guard_checks}


if __name__ == "__main__":
    model, exporter = sys.argv[1], sys.argv[2]
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    platform = sys.argv[4] if len(sys.argv) > 4 else ""
    print(json.dumps(check(model, exporter, repeats, {"platform": platform} if platform else {})))
