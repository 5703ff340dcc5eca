"""A small ViT-style model (patch-embedding Conv, class token, position embedding, pre-norm
transformer blocks with hand-written multi-head attention and GELU MLPs), exported with a
dynamic batch axis, for the OpenCL model tests and benchmarks. Built at test time, seeded."""

from __future__ import annotations

import io
import warnings

import numpy as np


def _define():
    import torch
    from torch import nn

    class Attention(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.heads = heads
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.scale = (d // heads) ** -0.5

        def forward(self, x):
            b, n, c = x.shape
            qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            attn = torch.softmax((q @ k.transpose(-2, -1)) * self.scale, dim=-1)
            return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))

    class Block(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.ln1 = nn.LayerNorm(d)
            self.attn = Attention(d, heads)
            self.ln2 = nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class ViT(nn.Module):
        def __init__(self, image=16, patch=4, d=32, heads=4, layers=2, classes=10):
            super().__init__()
            self.patch = nn.Conv2d(3, d, patch, stride=patch)
            n = (image // patch) ** 2
            self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.1)
            self.pos = nn.Parameter(torch.randn(1, n + 1, d) * 0.1)
            self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, classes)

        def forward(self, x):
            x = self.patch(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
            x = self.norm(self.blocks(x))
            return self.head(x[:, 0])

    return ViT


def export_vit(exporter: str = "torchscript", opset: int = 17, export_batch: int = 2, run_batch: int = 3):
    """``(model bytes, run feeds, torch outputs for them)``; the batch axis is dynamic."""
    import torch

    torch.manual_seed(0)
    m = _define()().eval()
    gen = torch.Generator().manual_seed(3)
    x_export = torch.randn(export_batch, 3, 16, 16, generator=gen)
    x_run = torch.randn(run_batch, 3, 16, 16, generator=gen)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            buf = io.BytesIO()
            torch.onnx.export(m, (x_export,), buf, dynamo=False, opset_version=opset, input_names=["x"],
                              output_names=["logits"], dynamic_axes={"x": {0: "batch"}})
            data = buf.getvalue()
        else:
            batch = torch.export.Dim("batch", min=1, max=64)
            prog = torch.onnx.export(m, (x_export,), dynamo=True, opset_version=opset, input_names=["x"],
                                     output_names=["logits"], dynamic_shapes=({0: batch},), verbose=False)
            data = prog.model_proto.SerializeToString()
    with torch.no_grad():
        expected = m(x_run).numpy()
    return data, {"x": x_run.numpy()}, [expected]


if __name__ == "__main__":
    data, feeds, expected = export_vit()
    print(len(data), feeds["x"].shape, np.asarray(expected[0]).shape)
