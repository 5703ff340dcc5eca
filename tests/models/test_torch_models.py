"""PyTorch models exported at test time with both exporters, run on CPU, compared to onnxruntime."""

import io
import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is a test-only dependency (pip install torch==2.13.0)")
nn = torch.nn
F = torch.nn.functional

import runtime_core as rt  # noqa: E402
from oracle import assert_close, run_oracle  # noqa: E402

RTOL, ATOL = 1e-3, 1e-4


class ResCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.b1 = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                                nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16))
        self.down = nn.Sequential(nn.Conv2d(16, 32, 1, stride=2, bias=False), nn.BatchNorm2d(32))
        self.b2 = nn.Sequential(nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                                nn.Conv2d(32, 32, 3, padding=2, dilation=2, bias=False), nn.BatchNorm2d(32))
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        x = self.stem(x)
        x = F.relu(x + self.b1(x))
        x = F.relu(self.down(x) + self.b2(x))
        x = self.pool(x)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(x)


class DepthwiseCNN(nn.Module):
    def __init__(self):
        super().__init__()
        layers = [nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU6()]
        for cin, cout, s in ((16, 24, 1), (24, 32, 2)):
            layers += [nn.Conv2d(cin, cin, 3, stride=s, padding=1, groups=cin, bias=False), nn.BatchNorm2d(cin),
                       nn.Hardswish(), nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(32, 5)

    def forward(self, x):
        x = self.features(x)
        return self.head(x.mean(dim=(2, 3)))


class Attention(nn.Module):
    def __init__(self, d, heads, causal=False):
        super().__init__()
        self.h, self.dk, self.causal = heads, d // heads, causal
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x, mask=None):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.h, self.dk).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.dk)
        if self.causal:
            causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
            att = att.masked_fill(~causal, float("-inf"))
        if mask is not None:
            att = att + (1.0 - mask[:, None, None, :].to(att.dtype)) * -10000.0
        y = att.softmax(-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Bert(nn.Module):
    def __init__(self, vocab=100, d=64, heads=4, layers=2, max_len=32):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        self.ln = nn.LayerNorm(d)
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(nn.ModuleDict({"att": Attention(d, heads), "ln1": nn.LayerNorm(d),
                                              "ff": nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)),
                                              "ln2": nn.LayerNorm(d)}))
        self.pool = nn.Linear(d, d)

    def forward(self, ids, mask):
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        x = self.ln(self.tok(ids) + self.pos(pos))
        for blk in self.blocks:
            x = blk["ln1"](x + blk["att"](x, mask))
            x = blk["ln2"](x + blk["ff"](x))
        return x, torch.tanh(self.pool(x[:, 0]))


class TorchEncoder(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, x, pad):
        return self.enc(x, src_key_padding_mask=pad)


class GPT(nn.Module):
    def __init__(self, vocab=80, d=48, heads=4, layers=2, max_len=32):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "ln1": nn.LayerNorm(d), "att": Attention(d, heads, causal=True), "ln2": nn.LayerNorm(d),
            "ff": nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))})
            for _ in range(layers))
        self.lnf = nn.LayerNorm(d)

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for b in self.blocks:
            x = x + b["att"](b["ln1"](x))
            x = x + b["ff"](b["ln2"](x))
        return self.lnf(x) @ self.tok.weight.T  # tied embeddings


class Recurrent(nn.Module):
    def __init__(self, kind):
        super().__init__()
        cls = nn.LSTM if kind == "lstm" else nn.GRU
        self.rnn = cls(8, 16, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.head(y[:, -1])


class Upsampler(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.up = nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1, output_padding=0)

    def forward(self, x):
        a = F.interpolate(self.conv(x), scale_factor=2, mode="nearest")
        b = F.interpolate(self.conv(x), scale_factor=2, mode="bilinear", align_corners=False)
        return self.up(F.relu(a + b))


g = torch.Generator().manual_seed(0)


def _ids(b, t, vocab):
    return torch.randint(0, vocab, (b, t), generator=g)


def make(name):
    """(module, example args, run args with another batch size, input names, dynamic axes)."""
    torch.manual_seed(0)
    if name == "rescnn":
        return ResCNN(), (torch.randn(1, 3, 32, 32),), (torch.randn(3, 3, 32, 32),), ["x"], {"x": {0: "batch"}}
    if name == "depthwise":
        return DepthwiseCNN(), (torch.randn(1, 3, 32, 32),), (torch.randn(2, 3, 32, 32),), ["x"], {"x": {0: "batch"}}
    if name == "bert":
        m = torch.tensor([[1] * 12, [1] * 7 + [0] * 5])
        m3 = torch.tensor([[1] * 12, [1] * 9 + [0] * 3, [1] * 4 + [0] * 8])
        return (Bert(), (_ids(2, 12, 100), m), (_ids(3, 12, 100), m3), ["ids", "mask"],
                {"ids": {0: "batch"}, "mask": {0: "batch"}})
    if name == "torch_encoder":
        pad = torch.tensor([[False] * 10, [False] * 6 + [True] * 4])
        return (TorchEncoder(), (torch.randn(2, 10, 32), pad), (torch.randn(2, 10, 32), pad.flip(0)),
                ["x", "pad"], {})
    if name == "gpt":
        return GPT(), (_ids(1, 16, 80),), (_ids(2, 16, 80),), ["ids"], {"ids": {0: "batch"}}
    if name in ("lstm", "gru"):
        return (Recurrent(name), (torch.randn(2, 7, 8),), (torch.randn(4, 7, 8),), ["x"], {"x": {0: "batch"}})
    if name == "upsample":
        return Upsampler(), (torch.randn(1, 4, 8, 8),), (torch.randn(2, 4, 8, 8),), ["x"], {"x": {0: "batch"}}
    raise KeyError(name)


def export(name, dynamo, opset):
    module, args, run_args, names, dyn = make(name)
    module.eval()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            shapes = None
            if dyn:
                batch = torch.export.Dim("batch", min=1, max=64)
                shapes = tuple({0: batch} if n in dyn else None for n in names)
            prog = torch.onnx.export(module, args, dynamo=True, opset_version=opset, input_names=names,
                                     dynamic_shapes=shapes, verbose=False, optimize=True)
            model = prog.model_proto
        else:
            torch.onnx.export(module, args, buf, dynamo=False, opset_version=opset, input_names=names,
                              dynamic_axes=dyn or None)
            import onnx

            model = onnx.load_from_string(buf.getvalue())
    feeds = {n: a.numpy() for n, a in zip(names, run_args)}
    with torch.no_grad():
        expected = module(*run_args)
    return model, feeds, expected


MODELS = ["rescnn", "depthwise", "bert", "torch_encoder", "gpt", "lstm", "gru", "upsample"]
EXPORTS = [(False, 14), (False, 17), (True, 18), (True, 20)]  # torchscript at 13 lacks tril/sdpa


@pytest.mark.parametrize("dynamo,opset", EXPORTS, ids=[f"{'dynamo' if d else 'torchscript'}-op{o}" for d, o in EXPORTS])
@pytest.mark.parametrize("name", MODELS)
def test_exported_model_matches_onnxruntime(name, dynamo, opset):
    model, feeds, expected = export(name, dynamo, opset)
    data = model.SerializeToString()
    sess = rt.InferenceSession(data, providers=["CPUExecutionProvider"])
    ours = sess.run(None, feeds)
    ref = run_oracle(model, feeds)
    assert_close(ours, ref, rtol=RTOL, atol=ATOL)
    exp = expected if isinstance(expected, tuple) else (expected,)
    np.testing.assert_allclose(ours[0], exp[0].detach().numpy(), rtol=RTOL, atol=1e-3)
    rep = sess.get_partition_report()
    assert rep.nodes and all(n.provider == "CPUExecutionProvider" for n in rep.nodes)
    # the same outputs at every optimization level
    for level in (rt.GraphOptimizationLevel.ORT_DISABLE_ALL, rt.GraphOptimizationLevel.ORT_ENABLE_BASIC):
        so = rt.SessionOptions()
        so.graph_optimization_level = level
        again = rt.InferenceSession(data, so, providers=["cpu"]).run(None, feeds)
        assert_close(again, ours, rtol=1e-4, atol=1e-5)
