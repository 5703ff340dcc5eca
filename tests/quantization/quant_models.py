"""Tiny float models for the quantization tests: a CNN built with onnx.helper and
BERT-style / GPT-style blocks exported from torch (both exporters)."""

from __future__ import annotations

import io

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh


def cnn(seed: int = 0) -> onnx.ModelProto:
    """Conv-Relu-Conv-Add(residual)-Relu-MaxPool-Reshape-Gemm, 3x8x8 input."""
    r = np.random.default_rng(seed)

    def init(name, *shape, s=0.3):
        return nh.from_array(r.normal(0, s, shape).astype(np.float32), name)

    inits = [init("W1", 8, 3, 3, 3), init("B1", 8, s=0.1), init("W2", 8, 8, 3, 3, s=0.2), init("B2", 8, s=0.1),
             init("Wf", 10, 128, s=0.2), init("Bf", 10, s=0.1), nh.from_array(np.array([0, -1], np.int64), "sh")]
    nodes = [h.make_node("Conv", ["x", "W1", "B1"], ["c1"], "conv1", pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c1"], ["r1"], "relu1"),
             h.make_node("Conv", ["r1", "W2", "B2"], ["c2"], "conv2", pads=[1, 1, 1, 1]),
             h.make_node("Add", ["c2", "r1"], ["a"], "add"),
             h.make_node("Relu", ["a"], ["r2"], "relu2"),
             h.make_node("MaxPool", ["r2"], ["p"], "pool", kernel_shape=[2, 2], strides=[2, 2]),
             h.make_node("Reshape", ["p", "sh"], ["f"], "flat"),
             h.make_node("Gemm", ["f", "Wf", "Bf"], ["y"], "fc", transB=1)]
    g = h.make_graph(nodes, "cnn", [h.make_tensor_value_info("x", T.FLOAT, ["N", 3, 8, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["N", 10])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def unary_ops(seed: int = 0) -> onnx.ModelProto:
    """Conv then the ops with their own QLinear form: Sigmoid, LeakyRelu, Concat, Pad, Split,
    AveragePool, GlobalAveragePool, Softmax."""
    r = np.random.default_rng(seed)
    inits = [nh.from_array(r.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "W"),
             nh.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads")]
    nodes = [h.make_node("Conv", ["x", "W"], ["c"], "conv", pads=[1, 1, 1, 1]),
             h.make_node("Sigmoid", ["c"], ["s"], "sig"),
             h.make_node("LeakyRelu", ["c"], ["lr"], "lrelu", alpha=0.1),
             h.make_node("Concat", ["s", "lr"], ["cat"], "cat", axis=1),
             h.make_node("Pad", ["cat", "pads"], ["pd"], "pad"),
             h.make_node("Split", ["pd"], ["p1", "p2"], "split", axis=1, num_outputs=2),
             h.make_node("AveragePool", ["p1"], ["ap"], "ap", kernel_shape=[2, 2]),
             h.make_node("GlobalAveragePool", ["ap"], ["g"], "gap"),
             h.make_node("GlobalAveragePool", ["p2"], ["g2"], "gap2"),
             h.make_node("Concat", ["g", "g2"], ["gg"], "cat2", axis=1),
             h.make_node("Flatten", ["gg"], ["f"], "flat"),
             h.make_node("Softmax", ["f"], ["y"], "softmax", axis=-1)]
    g = h.make_graph(nodes, "unary", [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 8])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 18)], ir_version=8)


def unary_feeds(n: int, seed: int = 1) -> list[dict]:
    r = np.random.default_rng(seed)
    return [{"x": r.normal(0, 1, (1, 3, 8, 8)).astype(np.float32)} for _ in range(n)]


def cnn_feeds(n: int, seed: int = 1) -> list[dict]:
    r = np.random.default_rng(seed)
    return [{"x": r.normal(0, 1, (2, 3, 8, 8)).astype(np.float32)} for _ in range(n)]


def _torch_blocks():
    import torch
    from torch import nn

    class Block(nn.Module):
        """Pre-LN transformer block; ``causal`` makes it GPT-style."""

        def __init__(self, d=32, heads=2, causal=False):
            super().__init__()
            self.h, self.causal = heads, causal
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, s, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
            q, k, v = (t.reshape(b, s, self.h, d // self.h).transpose(1, 2) for t in (q, k, v))
            att = q @ k.transpose(-1, -2) / (d // self.h) ** 0.5
            if self.causal:
                mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
                att = att.masked_fill(mask, -1e4)
            o = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, s, d)
            x = x + self.proj(o)
            return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))

    return torch, Block


def torch_block(kind: str, exporter: str) -> onnx.ModelProto:
    """A BERT-style (kind="bert") or GPT-style (kind="gpt") block, exported by torch's
    TorchScript (exporter="torchscript") or dynamo (exporter="dynamo") exporter."""
    torch, Block = _torch_blocks()
    torch.manual_seed(0)
    m = Block(causal=kind == "gpt").eval()
    x = torch.randn(1, 8, 32)
    if exporter == "torchscript":
        buf = io.BytesIO()
        torch.onnx.export(m, (x,), buf, dynamo=False, opset_version=17, input_names=["x"], output_names=["y"])
        return onnx.load_from_string(buf.getvalue())
    prog = torch.onnx.export(m, (x,), dynamo=True, opset_version=18, input_names=["x"], output_names=["y"])
    return prog.model_proto


def block_feeds(n: int, seed: int = 2) -> list[dict]:
    r = np.random.default_rng(seed)
    return [{"x": r.normal(0, 1, (1, 8, 32)).astype(np.float32)} for _ in range(n)]


def torch_cnn(exporter: str) -> onnx.ModelProto:
    """Conv-BN-ReLU-MaxPool-Conv-ReLU + residual-GlobalAvgPool-Linear from torch (1x3x16x16)."""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
            self.c2, self.fc = nn.Conv2d(8, 8, 3, padding=1), nn.Linear(8, 10)

        def forward(self, x):
            x = nn.functional.max_pool2d(torch.relu(self.bn(self.c1(x))), 2)
            x = torch.relu(self.c2(x)) + x
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    torch.manual_seed(0)
    m = Net().eval()
    x = torch.randn(1, 3, 16, 16)
    if exporter == "torchscript":
        buf = io.BytesIO()
        torch.onnx.export(m, (x,), buf, dynamo=False, opset_version=17, input_names=["x"], output_names=["y"])
        return onnx.load_from_string(buf.getvalue())
    return torch.onnx.export(m, (x,), dynamo=True, opset_version=18, input_names=["x"], output_names=["y"]).model_proto


def torch_cnn_feeds(n: int, seed: int = 4) -> list[dict]:
    r = np.random.default_rng(seed)
    return [{"x": r.normal(0, 1, (1, 3, 16, 16)).astype(np.float32)} for _ in range(n)]
