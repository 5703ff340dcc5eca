"""MatMulTransposeFusion: last-two-axes Transposes and scalar Mul/Div around a product of two
computed tensors -> ``com.microsoft.FusedMatMul`` (level ALL), and ScaledDotProductFusion:
``Softmax(FusedMatMul(q, k^T) [+ bias]) @ v`` -> ``runtime_core.fused::ScaledDotProductAttention``. Outputs equal onnxruntime's on the
unoptimized graph; the fold is left alone where a folded value has another reader or the
Transpose/scale is not one; a saved optimized model loads in onnxruntime; and in dynamically
quantized encoder blocks from both torch exporters (where the attention fusion finds float
projections nowhere) Q @ K^T becomes a FusedMatMul with the scale inside, and the whole attention
one ScaledDotProductAttention where K^T is a Transpose (TorchScript)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt
from oracle import run_oracle

L = rt.GraphOptimizationLevel
CPU = ["CPUExecutionProvider"]
RNG = np.random.default_rng(11)
SHAPE = (2, 3, 5, 4)  # q, k: [B, H, S, d]


def _model(kt="transpose", qscale=None, kscale=None, post=None, qt=False, extra_reader=None, kperm=(0, 1, 3, 2),
           kshape=None, opset=17):
    """scores = (q [op] [scale]) @ (k^T [scale]) [post scale]; ``kt`` "transpose" (k [B, H, S, d]
    transposed by ``kperm``) or "given" (k fed as [B, H, d, S])."""
    nodes, inits = [], []

    def scale(x, how, tag):
        if how is None:
            return x
        op, const_first, value, rank = (*how, 0) if len(how) == 3 else how
        c = f"c_{tag}"
        inits.append(numpy_helper.from_array(np.array(value, np.float32).reshape((1,) * rank), c))
        nodes.append(helper.make_node(op, [c, x] if const_first else [x, c], [f"{tag}_s"]))
        return f"{tag}_s"

    q = "q"
    if qt:
        nodes.append(helper.make_node("Transpose", [q], ["qt"], perm=[0, 1, 3, 2]))
        q = "qt"
    q = scale(q, qscale, "q")
    k = "k"
    if kt == "transpose":
        nodes.append(helper.make_node("Transpose", [k], ["kt"], perm=list(kperm)))
        k = "kt"
    k = scale(k, kscale, "k")
    nodes.append(helper.make_node("MatMul", [q, k], ["z"]))
    y = scale("z", post, "z")
    nodes.append(helper.make_node("Softmax", [y], ["y"], axis=-1))
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader:
        nodes.append(helper.make_node("Neg", [extra_reader], ["r"]))
        outs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    B, H, S, d = SHAPE
    qshape = [B, H, d, S] if qt else [B, H, S, d]
    kshape = kshape or ([B, H, d, S] if kt == "given" else [B, H, S, d])
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("q", TensorProto.FLOAT, qshape),
                                       helper.make_tensor_value_info("k", TensorProto.FLOAT, kshape)], outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _feeds(m):
    return {i.name: RNG.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in m.graph.input}


def _run(m, level=L.ORT_ENABLE_ALL, **so_kw):
    feeds = _feeds(m)
    so = rt.SessionOptions()
    so.graph_optimization_level = level
    for k, v in so_kw.items():
        setattr(so, k, v)
    s = rt.InferenceSession(m.SerializeToString(), so, providers=CPU)
    for a, r in zip(s.run(None, feeds), run_oracle(m, feeds)):
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-6)
    return s._graph.nodes


def _fused(nodes):
    return [n for n in nodes if n.op_type == "FusedMatMul" and n.domain == "com.microsoft"]


@pytest.mark.parametrize("kw, trans, alpha", [
    ({}, (0, 1), 1.0),
    ({"qt": True}, (1, 1), 1.0),
    ({"qscale": ("Mul", False, 0.5), "kscale": ("Mul", True, 0.25)}, (0, 1), 0.125),
    ({"qscale": ("Div", False, 8.0)}, (0, 1), 0.125),
    ({"post": ("Div", False, 2.0, 4)}, (0, 1), 0.5),  # a [1, 1, 1, 1] divisor of the 4-D scores
    ({"kt": "given", "qscale": ("Mul", True, 3.0)}, (0, 0), 3.0),
])
def test_folded(kw, trans, alpha):
    nodes = _run(_model(**kw))
    (f,) = _fused(nodes)
    assert (f.attrs.get("transA", 0), f.attrs.get("transB", 0)) == trans
    assert f.attrs.get("alpha") == pytest.approx(alpha)
    assert not [n for n in nodes if n.op_type in ("MatMul", "Transpose", "Mul", "Div")]


@pytest.mark.parametrize("kw", [
    {"extra_reader": "kt"},                                  # the transpose is read elsewhere
    {"kperm": (3, 1, 2, 0), "kshape": [7, 3, 4, 2]},         # not the last two axes, keys not q's shape
    {"kt": "given", "qscale": ("Div", True, 2.0)},           # 2 / q is no scale of q
    {"kt": "given", "post": ("Mul", False, 2.0, 5)},         # a rank-5 constant raises the rank
])
def test_left_alone(kw):
    assert not _fused(_run(_model(**kw)))


def test_k_transposed_from_another_layout_is_read_in_heads_layout():
    """K^T = Transpose(k, p) with p not a last-two swap, where Transpose(k, p with its last two
    swapped) has q's shape (GPT-2's [0, 2, 3, 1]): that Transpose (the same copy), read transposed."""
    nodes = _run(_model(kperm=(3, 1, 2, 0), kshape=[5, 3, 4, 2]))
    (f,) = _fused(nodes)
    (t,) = [n for n in nodes if n.op_type == "Transpose"]
    assert f.attrs.get("transB") == 1 and list(t.attrs["perm"]) == [3, 1, 0, 2]


def test_extended_level_keeps_matmul():
    """The fold is a level-ALL pass: a model optimized at EXTENDED keeps its MatMul."""
    assert not _fused(_run(_model(qscale=("Mul", False, 0.5)), level=L.ORT_ENABLE_EXTENDED))


def test_product_by_a_constant_is_left_to_the_linear_fusions():
    w = RNG.standard_normal((4, 6)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["z"]), helper.make_node("Mul", ["z", "c"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.float32(2.0), "c")])
    assert not _fused(_run(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])))


@pytest.mark.parametrize("shapes, ta, tb, alpha", [
    (((2, 3, 4, 5), (2, 3, 6, 4)), 1, 1, 0.3),
    (((3, 5, 4), (6, 4)), 0, 1, 2.0),          # a 2-D second operand, transposed: the Linear path
    (((3, 5, 4), (4, 6)), 0, 0, -1.5),
    (((4, 3), (1, 4, 6)), 1, 0, 1.0),          # broadcast batch
])
def test_kernel_matches_onnxruntime(shapes, ta, tb, alpha):
    """The CPU kernel on FusedMatMul nodes written by hand, onnxruntime's own contrib op the oracle."""
    a, b = (RNG.standard_normal(s).astype(np.float32) for s in shapes)
    g = helper.make_graph(
        [helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain="com.microsoft", alpha=alpha, transA=ta, transB=tb)],
        "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, a.shape),
              helper.make_tensor_value_info("b", TensorProto.FLOAT, b.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    feeds = {"a": a, "b": b}
    (ours,) = rt.InferenceSession(m.SerializeToString(), providers=CPU).run(None, feeds)
    (ref,) = run_oracle(m, feeds)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


def test_saved_model_loads_in_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    m = _model(qscale=("Mul", False, 0.5), qt=True)
    path = tmp_path / "opt.onnx"
    _run(m, optimized_model_filepath=str(path))
    saved = onnx.load(str(path))
    assert [n.op_type for n in saved.graph.node if n.domain == "com.microsoft"] == ["FusedMatMul"]
    feeds = _feeds(m)
    (ours,) = ort.InferenceSession(str(path), providers=CPU).run(None, feeds)
    (ref,) = run_oracle(m, feeds)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


# -- dynamically quantized encoder blocks, from both exporters ----------------------------------
torch = pytest.importorskip("torch", reason="torch is a test-only dependency")


def _encoder(tmp_path, dynamo):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 2, dim_feedforward=64, dropout=0.0, batch_first=True)
    layer = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False).eval()
    x = torch.randn(2, 16, 32)
    path = tmp_path / f"enc_{'dynamo' if dynamo else 'ts'}.onnx"
    kw = {"dynamo": True} if dynamo else {"dynamo": False}
    if dynamo:
        pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
    # not under no_grad: that exports the fused encoder kernel, which has no ONNX form
    torch.onnx.export(layer, (x,), str(path), input_names=["x"], output_names=["y"], opset_version=18, **kw)
    return path, x.numpy()


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_quantized_encoder_block(tmp_path, dynamo):
    from runtime_core.quantization import QuantType, quantize_dynamic

    src, x = _encoder(tmp_path, dynamo)
    dst = tmp_path / "q.onnx"
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
    s = rt.InferenceSession(str(dst), providers=CPU)
    (ours,) = s.run(None, {"x": x})
    (ref,) = run_oracle(onnx.load(str(dst)), {"x": x})
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4)
    scale = 32 ** -0.5 * 2 ** 0.5  # 1 / sqrt(head dim 16)
    if dynamo:  # K^T built as Reshape(Transpose(K [S, B*H, d], [1, 2, 0])), which stays: the scale folds
        assert any(f.attrs.get("alpha") == pytest.approx(scale) for f in _fused(s._graph.nodes)), \
            [(n.op_type, n.attrs) for n in s._graph.nodes]
    else:  # TorchScript: K^T a Transpose, sqrt(scale) on both operands; the whole attention fuses
        (a,) = [n for n in s._graph.nodes if n.op_type == "ScaledDotProductAttention"]
        assert a.attrs["scale"] == pytest.approx(scale)


@pytest.mark.parametrize("op, sa, sb, ta, tb, batched", [
    ("FusedMatMul", (4, 2, 64, 32), (4, 2, 64, 32), 0, 1, True),
    ("FusedMatMul", (4, 2, 32, 64), (4, 2, 32, 48), 1, 0, True),
    ("FusedMatMul", (64, 32), (3, 2, 48, 32), 0, 1, True),   # a broadcast over the batch
    ("MatMul", (4, 2, 64, 64), (4, 2, 64, 32), 0, 0, True),
    ("MatMul", (1, 2, 64, 64), (3, 2, 64, 32), 0, 0, False),  # a partial broadcast: numpy's
    ("MatMul", (3, 64, 64), (64, 48), 0, 0, False),           # the Linear path
])
def test_batched_products_on_two_threads(monkeypatch, op, sa, sb, ta, tb, batched):
    """Products big enough for the batched kernel (``_native.bmm``) against numpy in float64, at
    one thread and two (the same bits)."""
    from runtime_provider_cpu.fast.policy import current
    from runtime_provider_cpu.fast.sgemm import sgemm_ready

    nat, calls = current().native, []
    if nat is not None:
        bmm = nat.bmm
        monkeypatch.setattr(nat, "bmm", lambda *a: calls.append(a[3]) or bmm(*a))
    a, b = (RNG.standard_normal(s).astype(np.float32) for s in (sa, sb))
    attrs = {"alpha": 0.7, "transA": ta, "transB": tb} if op == "FusedMatMul" else {}
    g = helper.make_graph(
        [helper.make_node(op, ["a", "b"], ["y"], domain="com.microsoft" if attrs else "", **attrs)], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, a.shape),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, b.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    outs = []
    for threads in (1, 2):
        so = rt.SessionOptions()
        so.intra_op_num_threads = threads
        (y,) = rt.InferenceSession(m.SerializeToString(), so, providers=CPU).run(None, {"a": a, "b": b})
        outs.append(y)
    A = a.astype(np.float64).swapaxes(-1, -2) if ta else a.astype(np.float64)
    B = b.astype(np.float64).swapaxes(-1, -2) if tb else b.astype(np.float64)
    ref = np.matmul(A, B) * attrs.get("alpha", 1.0)
    for y in outs:
        assert y.shape == ref.shape and y.dtype == np.float32
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    assert bool(calls) == (batched and sgemm_ready())
    if calls:  # the units do not depend on the thread count
        np.testing.assert_array_equal(outs[0], outs[1])


def _sdpa_model(bias_shape=None, extra_reader=False, dv=None, B=2, H=3, S=33, d=16):
    """Softmax(q @ k^T / sqrt(d) (+ bias)) @ v as the TorchScript exporter writes it."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["z"]),
             helper.make_node("Div", ["z", "c"], ["zs"])]
    inits = [numpy_helper.from_array(np.array(np.sqrt(d), np.float32), "c")]
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [B, H, S, d]) for n in "qk"]
    ins.append(helper.make_tensor_value_info("v", TensorProto.FLOAT, [B, H, S, dv or d]))
    z = "zs"
    if bias_shape is not None:
        ins.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, list(bias_shape)))
        nodes.append(helper.make_node("Add", ["m", z], ["zb"]))
        z = "zb"
    nodes += [helper.make_node("Softmax", [z], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader:
        outs.append(helper.make_tensor_value_info("p", TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "g", ins, outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _sdpa_nodes(nodes):
    return [n for n in nodes if n.op_type == "ScaledDotProductAttention" and n.domain == "runtime_core.fused"]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("bias_shape", [None, (2, 1, 1, 33), (33, 33), (2, 3, 33, 33), (1, 1, 1, 33)])
def test_sdpa_fused(bias_shape, threads):
    nodes = _run(_sdpa_model(bias_shape), intra_op_num_threads=threads)
    (a,) = _sdpa_nodes(nodes)
    assert a.attrs["scale"] == pytest.approx(0.25)
    assert not [n for n in nodes if n.op_type in ("MatMul", "FusedMatMul", "Softmax", "Transpose", "Div", "Add")]


@pytest.mark.parametrize("kw", [{"extra_reader": True}, {"dv": 8}])
def test_sdpa_left_alone(kw):
    """The probabilities read elsewhere, or v of another head size (the kernel takes one shape)."""
    nodes = _run(_sdpa_model(**kw))
    assert not _sdpa_nodes(nodes) and _fused(nodes)


def test_sdpa_kernel_without_compiled_code(monkeypatch):
    """The numpy path (no sgemm for the compiled kernel) gives the same outputs."""
    import runtime_provider_cpu.ops.matmul as mm

    monkeypatch.setattr(mm, "sgemm_ready", lambda: False)
    assert _sdpa_nodes(_run(_sdpa_model((2, 1, 1, 33))))


def test_sdpa_bad_bias_is_a_typed_error():
    m = _sdpa_model((2, 1, 1, 33))
    s = rt.InferenceSession(m.SerializeToString(), providers=CPU)
    assert _sdpa_nodes(s._graph.nodes)
    feeds = _feeds(m)
    feeds["m"] = np.zeros((3, 1, 1, 33), np.float32)  # batch 3 against 2
    with pytest.raises(rt.errors.RuntimeCoreError):
        s.run(None, feeds)


def test_sdpa_saved_model_loads_in_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    m = _sdpa_model((2, 1, 1, 33))
    path = tmp_path / "opt.onnx"
    _run(m, optimized_model_filepath=str(path))
    saved = onnx.load(str(path))
    assert not [n for n in saved.graph.node if n.domain == "runtime_core.fused"]
    assert "FusedMatMul" in [n.op_type for n in saved.graph.node]
    feeds = _feeds(m)
    (ours,) = ort.InferenceSession(str(path), providers=CPU).run(None, feeds)
    (ref,) = run_oracle(m, feeds)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


def test_contrib_types_of_loaded_fused_ops():
    """A model that holds FusedMatMul (e.g. saved by onnxruntime) gets its outputs typed on load."""
    from runtime_core.graph.contrib_types import RULES

    g = helper.make_graph(
        [helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain="com.microsoft", transA=1, transB=1)], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3, 4, "S"]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [5, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    assert ("com.microsoft", "FusedMatMul") in RULES
    s = rt.InferenceSession(m.SerializeToString(), providers=CPU)
    assert s._graph.value_info("y").shape == (2, 3, "S", 5)


def _gpt2_model(fill=-3.4e38, fill_first=True, B=1, S=24, H=2, d=8):
    """GPT-2's attention as its TorchScript export writes it: heads split from [B, S, H, d] by
    Transpose(0, 2, 1, 3) (q, v) and K^T by Transpose(0, 2, 3, 1); the scores masked by
    Where(causal, scores, fill) (``fill_first``: Where(not causal, fill, scores))."""
    causal = np.tril(np.ones((S, S), bool))[None, None]
    cond = ~causal if fill_first else causal
    nodes = [helper.make_node("Transpose", ["q"], ["qh"], perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1]),
             helper.make_node("Transpose", ["v"], ["vh"], perm=[0, 2, 1, 3]),
             helper.make_node("MatMul", ["qh", "kt"], ["z"]),
             helper.make_node("Div", ["z", "c"], ["zs"]),
             helper.make_node("Where", ["m", "f", "zs"] if fill_first else ["m", "zs", "f"], ["zm"]),
             helper.make_node("Softmax", ["zm"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "vh"], ["y"])]
    inits = [numpy_helper.from_array(np.array(np.sqrt(d), np.float32), "c"),
             numpy_helper.from_array(np.array(fill, np.float32), "f"), numpy_helper.from_array(cond, "m")]
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [B, S, H, d]) for n in "qkv"]
    g = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("fill_first", [True, False])
def test_sdpa_from_gpt2_heads_and_where_mask(fill_first, threads):
    nodes = _run(_gpt2_model(fill_first=fill_first), intra_op_num_threads=threads)
    (a,) = _sdpa_nodes(nodes)
    assert a.attrs["scale"] == pytest.approx(8 ** -0.5)
    assert not [n for n in nodes if n.op_type in ("MatMul", "FusedMatMul", "Softmax")]


def test_sdpa_where_with_a_finite_fill_is_left_alone():
    """A fill of -1e4 does not absorb the scores: the Where stays, and so does the Softmax."""
    nodes = _run(_gpt2_model(fill=-1e4))
    assert not _sdpa_nodes(nodes) and _fused(nodes)


def test_sdpa_where_saved_model_loads_in_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    m = _gpt2_model()
    path = tmp_path / "opt.onnx"
    _run(m, optimized_model_filepath=str(path))
    feeds = _feeds(m)
    (ours,) = ort.InferenceSession(str(path), providers=CPU).run(None, feeds)
    (ref,) = run_oracle(m, feeds)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)
