"""Extended-level fusions: each where it applies (op types after, outputs equal to
ORT_DISABLE_ALL) and where it must not; the com.microsoft kernels against onnxruntime;
PyTorch-exported transformers at every level and the node-count reduction they reach."""

from __future__ import annotations

import math
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import runtime_core as rt
import runtime_provider_cpu.ops.fused  # noqa: F401 - registers the com.microsoft kernels
from oracle import assert_close, make_model, run_oracle

L = rt.GraphOptimizationLevel
MS = "com.microsoft"
CPU = ["CPUExecutionProvider"]
RNG = np.random.default_rng(7)


def f32(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def opts(level):
    so = rt.SessionOptions()
    so.graph_optimization_level = level
    return so


def fused(model, feeds, level=L.ORT_ENABLE_EXTENDED, rtol=1e-4, atol=1e-5):
    """Op types after optimizing at ``level``; asserts outputs equal those of ORT_DISABLE_ALL."""
    data = model.SerializeToString()
    ref = rt.InferenceSession(data, opts(L.ORT_DISABLE_ALL), providers=CPU).run(None, feeds)
    s = rt.InferenceSession(data, opts(level), providers=CPU)
    got = s.run(None, feeds)
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    assert len(s.get_partition_report().nodes) == len(s._graph.nodes)
    return [n.op_type for n in s._graph.nodes]  # the optimized graph, in its order


def n(op, ins, outs, **kw):
    return helper.make_node(op, ins, outs, **kw)


# -- Conv folds ---------------------------------------------------------------------------

X4 = f32(2, 3, 8, 8)
W4 = f32(4, 3, 3, 3)
BN = {"sc": np.abs(f32(4)) + 0.5, "bi": f32(4), "mu": f32(4), "var": np.abs(f32(4)) + 0.5}


def test_conv_batchnorm_folds_into_weights():
    nodes = [n("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             n("BatchNormalization", ["c", "sc", "bi", "mu", "var"], ["y"], epsilon=1e-3)]
    m = make_model(nodes, {"x": X4}, ["y"], initializers={"w": W4, **BN})
    assert fused(m, {"x": X4}) == ["Conv"]
    assert fused(m, {"x": X4}, L.ORT_ENABLE_BASIC) == ["Conv", "BatchNormalization"]


def test_conv_batchnorm_not_when_the_conv_output_is_read_twice():
    nodes = [n("Conv", ["x", "w", "b"], ["c"]), n("BatchNormalization", ["c", "sc", "bi", "mu", "var"], ["y"]),
             n("Relu", ["c"], ["z"])]
    m = make_model(nodes, {"x": X4}, ["y", "z"], initializers={"w": W4, "b": f32(4), **BN})
    assert fused(m, {"x": X4}) == ["Conv", "BatchNormalization", "Relu"]


def test_conv_add_and_mul_fold_per_channel_constants():
    nodes = [n("Conv", ["x", "w", "b"], ["c"]), n("Add", ["c", "k"], ["a"]), n("Mul", ["kk", "a"], ["y"])]
    m = make_model(nodes, {"x": X4}, ["y"], initializers={"w": W4, "b": f32(4), "k": f32(1, 4, 1, 1),
                                                         "kk": f32(4, 1, 1)})
    assert fused(m, {"x": X4}) == ["Conv"]


def test_conv_add_not_for_a_spatial_constant():
    nodes = [n("Conv", ["x", "w"], ["c"]), n("Add", ["c", "k"], ["y"])]
    m = make_model(nodes, {"x": X4}, ["y"], initializers={"w": W4, "k": f32(1, 4, 6, 6)})
    assert fused(m, {"x": X4}) == ["Conv", "Add"]


# -- MatMul + Add -> Gemm ---------------------------------------------------------------------

@pytest.mark.parametrize("bias_shape", [(5,), (1, 5), (3, 1), (3, 5), ()])
def test_matmul_add_becomes_gemm(bias_shape):
    a = f32(3, 4)
    nodes = [n("MatMul", ["a", "w"], ["m"]), n("Add", ["c", "m"], ["y"])]
    m = make_model(nodes, {"a": a}, ["y"], initializers={"w": f32(4, 5), "c": f32(*bias_shape)})
    assert fused(m, {"a": a}) == ["Gemm"]


@pytest.mark.parametrize("a_shape,bias_shape", [((3, 4), (2, 3, 5)), ((2, 3, 4), (5,))])
def test_matmul_add_stays_for_other_shapes(a_shape, bias_shape):
    """Gemm needs a 2-D A and a bias that broadcasts to [M, N] without growing it."""
    a = f32(*a_shape)
    nodes = [n("MatMul", ["a", "w"], ["m"]), n("Add", ["m", "c"], ["y"])]
    m = make_model(nodes, {"a": a}, ["y"], initializers={"w": f32(4, 5), "c": f32(*bias_shape)})
    assert fused(m, {"a": a}) == ["MatMul", "Add"]


def test_matmul_add_stays_when_the_bias_rows_are_unknown():
    """A fed bias [rows, 5]: rows may be 1 or 3 (fine) but is not known to be: not fused."""
    a, c = f32(3, 4), f32(1, 5)
    nodes = [n("MatMul", ["a", "w"], ["m"]), n("Add", ["m", "c"], ["y"])]
    m = make_model(nodes, {"a": a, "c": c}, ["y"], initializers={"w": f32(4, 5)})
    m.graph.input[1].type.tensor_type.shape.dim[0].dim_param = "rows"
    assert fused(m, {"a": a, "c": c}) == ["MatMul", "Add"]


# -- Gelu ---------------------------------------------------------------------------------------

XG = f32(2, 5, 8, scale=2.0)


def erf_gelu(variant=0, half=0.5):
    s2 = {"s2": np.float32(math.sqrt(2.0)), "is2": np.float32(1 / math.sqrt(2.0)), "one": np.float32(1.0),
          "half": np.float32(half)}
    head = n("Div", ["x", "s2"], ["u"]) if variant != 1 else n("Mul", ["is2", "x"], ["u"])
    tails = {0: [n("Mul", ["x", "p"], ["m"]), n("Mul", ["m", "half"], ["y"])],
             1: [n("Mul", ["x", "half"], ["h"]), n("Mul", ["h", "p"], ["y"])],
             2: [n("Mul", ["p", "half"], ["m"]), n("Mul", ["x", "m"], ["y"])]}[variant]
    nodes = [head, n("Erf", ["u"], ["e"]), n("Add", ["e", "one"], ["p"]), *tails]
    return nodes, s2


@pytest.mark.parametrize("variant", [0, 1, 2])
@pytest.mark.parametrize("opset,want", [(17, ("Gelu", MS)), (20, ("Gelu", ""))])
def test_gelu_erf_form(variant, opset, want):
    nodes, consts = erf_gelu(variant)
    m = make_model(nodes, {"x": XG}, ["y"], initializers=consts, opset=opset)
    assert fused(m, {"x": XG}) == ["Gelu"]
    g = rt.InferenceSession(m.SerializeToString(), opts(L.ORT_ENABLE_EXTENDED), providers=CPU)._graph
    assert [(x.op_type, x.domain) for x in g.nodes] == [want]


def test_gelu_not_with_other_coefficients():
    nodes, consts = erf_gelu(0, half=0.6)
    m = make_model(nodes, {"x": XG}, ["y"], initializers=consts)
    assert "Erf" in fused(m, {"x": XG})


def tanh_gelu(cube="pow"):
    c = {"k": np.float32(math.sqrt(2 / math.pi)), "a": np.float32(0.044715), "one": np.float32(1.0),
         "half": np.float32(0.5), "three": np.float32(3.0)}
    cube_nodes = ([n("Pow", ["x", "three"], ["x3"])] if cube == "pow"
                  else [n("Mul", ["x", "x"], ["x2"]), n("Mul", ["x", "x2"], ["x3"])])
    nodes = cube_nodes + [n("Mul", ["a", "x3"], ["ax3"]), n("Add", ["x", "ax3"], ["in"]),
                          n("Mul", ["k", "in"], ["kin"]), n("Tanh", ["kin"], ["t"]), n("Add", ["one", "t"], ["p"]),
                          n("Mul", ["x", "p"], ["m"]), n("Mul", ["half", "m"], ["y"])]
    return nodes, c


@pytest.mark.parametrize("cube", ["pow", "mul"])
@pytest.mark.parametrize("opset,want", [(17, "FastGelu"), (20, "Gelu")])
def test_gelu_tanh_form(cube, opset, want):
    nodes, c = tanh_gelu(cube)
    m = make_model(nodes, {"x": XG}, ["y"], initializers=c, opset=opset)
    assert fused(m, {"x": XG}) == [want]


def test_bias_gelu_and_fast_gelu_bias():
    nodes, consts = erf_gelu(0)
    nodes = [n("Add", ["b", "x0"], ["x"])] + nodes
    m = make_model(nodes, {"x0": XG}, ["y"], initializers={**consts, "b": f32(8)})
    assert fused(m, {"x0": XG}) == ["BiasGelu"]
    nodes, c = tanh_gelu()
    nodes = [n("Add", ["x0", "b"], ["x"])] + nodes
    m = make_model(nodes, {"x0": XG}, ["y"], initializers={**c, "b": f32(8)}, opset=20)
    assert fused(m, {"x0": XG}) == ["FastGelu"]


def test_bias_gelu_not_for_a_matrix_bias():
    nodes, consts = erf_gelu(0)
    nodes = [n("Add", ["b", "x0"], ["x"])] + nodes
    m = make_model(nodes, {"x0": XG}, ["y"], initializers={**consts, "b": f32(5, 8)})
    assert fused(m, {"x0": XG}) == ["Add", "Gelu"]


# -- LayerNormalization / SkipLayerNormalization --------------------------------------------------

def decomposed_ln(x="x", axes=(-1,), eps="eps", opset=17, square="pow"):
    """ReduceMean, Sub, Pow, ReduceMean, Add eps, Sqrt, Div, Mul gamma, Add beta."""
    if opset >= 18:
        rm = lambda i, o: n("ReduceMean", [i, "axes"], [o])  # noqa: E731
    else:
        rm = lambda i, o: n("ReduceMean", [i], [o], axes=list(axes))  # noqa: E731
    sq = n("Pow", ["d", "two"], ["d2"]) if square == "pow" else n("Mul", ["d", "d"], ["d2"])
    return [rm(x, "mu"), n("Sub", [x, "mu"], ["d"]), sq, rm("d2", "var"), n("Add", ["var", eps], ["ve"]),
            n("Sqrt", ["ve"], ["sd"]), n("Div", ["d", "sd"], ["nz"]), n("Mul", ["nz", "g"], ["gz"]),
            n("Add", ["gz", "b"], ["y"])]


LN_CONSTS = {"eps": np.float32(1e-5), "two": np.float32(2.0), "g": f32(8), "b": f32(8),
             "axes": np.array([-1], np.int64)}


@pytest.mark.parametrize("opset,square", [(17, "pow"), (17, "mul"), (18, "pow")])
def test_layer_norm_from_decomposed_form(opset, square):
    m = make_model(decomposed_ln(opset=opset, square=square), {"x": XG}, ["y"], initializers=LN_CONSTS,
                   opset=opset)
    assert fused(m, {"x": XG}) == ["LayerNormalization"]


def test_layer_norm_not_over_a_non_last_axis():
    m = make_model(decomposed_ln(axes=(1,)), {"x": XG}, ["y"], initializers={**LN_CONSTS, "g": f32(1, 8)})
    assert "LayerNormalization" not in fused(m, {"x": XG})


def test_layer_norm_not_with_a_fed_epsilon():
    m = make_model(decomposed_ln(eps="e"), {"x": XG, "e": np.float32(1e-5)}, ["y"], initializers=LN_CONSTS)
    assert "LayerNormalization" not in fused(m, {"x": XG, "e": np.float32(1e-5)})


def test_layer_norm_below_opset_17_becomes_skip_layer_norm_after_an_add():
    nodes = [n("Add", ["r", "s"], ["x"])] + decomposed_ln()
    feeds = {"r": XG, "s": f32(2, 5, 8)}
    m = make_model(nodes, feeds, ["y"], initializers=LN_CONSTS, opset=13)
    assert fused(m, feeds) == ["SkipLayerNormalization"]
    m = make_model(decomposed_ln(), {"x": XG}, ["y"], initializers=LN_CONSTS, opset=13)
    assert fused(m, {"x": XG}) == ["ReduceMean", "Sub", "Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "Add"]



def vit_stem(path, exporter, opset):
    """A ViT stem exported by ``exporter``: patch Conv, flatten, class token concatenated, a
    learned position table added, LayerNorm (its sum read on as the residual stream)."""
    import torch

    class Stem(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.patch = torch.nn.Conv2d(3, 16, 4, stride=4)
            self.cls = torch.nn.Parameter(torch.randn(1, 1, 16))
            self.pos = torch.nn.Parameter(torch.randn(1, 5, 16))
            self.ln = torch.nn.LayerNorm(16)

        def forward(self, x):
            p = self.patch(x).flatten(2).transpose(1, 2)
            h = torch.cat([self.cls.expand(x.shape[0], -1, -1), p], dim=1) + self.pos
            return self.ln(h), h

    torch.manual_seed(0)
    x = f32(1, 3, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kw = dict(opset_version=opset, input_names=["x"], output_names=["y", "h"])
        if exporter == "torchscript":
            torch.onnx.export(Stem().eval(), (torch.from_numpy(x),), str(path), dynamo=False, **kw)
        else:
            torch.onnx.export(Stem().eval(), (torch.from_numpy(x),), dynamo=True, **kw).save(str(path))
    return onnx.load(str(path)), {"x": x}


@pytest.mark.parametrize("exporter,opset", [("torchscript", 16), ("torchscript", 17), ("dynamo", 18)])
def test_layer_norm_of_patches_plus_a_constant_position_table(exporter, opset, tmp_path):
    """ViT's first LayerNorm, of ``Concat(cls, patches) + pos``: the Concat's length (an
    unk__N of onnx's inference, summed from its pieces) and the constant position table as
    the skip make it a SkipLayerNormalization (it stayed decomposed at opset 16); the sum,
    read on as the residual stream, is its output 3."""
    m, feeds = vit_stem(tmp_path / "stem.onnx", exporter, opset)
    got = fused(m, feeds)
    assert "SkipLayerNormalization" in got and "ReduceMean" not in got and "LayerNormalization" not in got
    assert_close(rt.InferenceSession(m.SerializeToString(), providers=CPU).run(None, feeds),
                 run_oracle(m, feeds), rtol=1e-4, atol=1e-5)

def skip_ln_model(skip_shape=(2, 5, 8), bias=True, sum_out=False):
    nodes = [n("MatMul", ["h", "w"], ["hw"])]
    nodes += [n("Add", ["hw", "bias"], ["hb"]), n("Add", ["r", "hb"], ["s"])] if bias else [
        n("Add", ["r", "hw"], ["s"])]
    nodes += [n("LayerNormalization", ["s", "g", "b"], ["y"], epsilon=1e-6)]
    outs = ["y"]
    if sum_out:
        nodes.append(n("Relu", ["s"], ["z"]))
        outs.append("z")
    feeds = {"r": XG, "h": f32(*skip_shape[:-1], 6)}
    return make_model(nodes, feeds, outs, initializers={"w": f32(6, 8), "bias": f32(8), "g": f32(8),
                                                        "b": f32(8)}), feeds


@pytest.mark.parametrize("skip_shape,bias,sum_out", [((2, 5, 8), True, False), ((5, 8), True, True),
                                                     ((1, 5, 8), False, True)])
def test_skip_layer_norm(skip_shape, bias, sum_out):
    m, feeds = skip_ln_model(skip_shape, bias, sum_out)
    want = ["MatMul", "SkipLayerNormalization"] + (["Relu"] if sum_out else [])
    assert fused(m, feeds) == want


def test_skip_layer_norm_not_when_the_skip_broadcasts_over_the_sequence():
    m, feeds = skip_ln_model((2, 1, 8))  # onnxruntime's SkipLayerNormalization needs skip's last two dims
    assert fused(m, feeds) == ["MatMul", "Add", "Add", "LayerNormalization"]


# -- Attention ------------------------------------------------------------------------------------

B_, S_, D_, H_ = 2, 5, 8, 2


def attention_model(mask="none", head_shape=(B_, S_, H_, D_ // H_), opset=17):
    """x @ Wqkv + b, Split, Reshape/Transpose into heads, scaled scores (+ mask), Softmax,
    @ V, back to [B, S, D]."""
    c = {"w": f32(D_, 3 * D_, scale=0.3), "bqkv": f32(3 * D_), "hs": np.array(head_shape, np.int64),
         "os": np.array([B_, S_, D_], np.int64), "c": np.float32(math.sqrt(D_ // H_)), "one": np.float32(1.0),
         "neg": np.float32(-10000.0), "ax": np.array([1, 2], np.int64)}
    nodes = [n("MatMul", ["x", "w"], ["p"]), n("Add", ["p", "bqkv"], ["qkv"]),
             n("Split", ["qkv"], ["q", "k", "v"], axis=2, num_outputs=3) if opset >= 18 else
             n("Split", ["qkv", "sp"], ["q", "k", "v"], axis=2)]
    c["sp"] = np.array([D_] * 3, np.int64)
    for name, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [n("Reshape", [name, "hs"], [name + "r"]), n("Transpose", [name + "r"], [name + "t"], perm=perm)]
    nodes += [n("MatMul", ["qt", "kt"], ["qk"]), n("Div", ["qk", "c"], ["sc"])]
    feeds = {"x": f32(B_, S_, D_)}
    if mask == "raw":
        feeds["m"] = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int64)
        nodes += [n("Unsqueeze", ["m", "ax"], ["mu"]), n("Cast", ["mu"], ["mf"], to=TensorProto.FLOAT),
                  n("Sub", ["one", "mf"], ["inv"]), n("Mul", ["inv", "neg"], ["add_mask"]),
                  n("Add", ["sc", "add_mask"], ["scm"])]
    elif mask == "padding_bias":  # an additive [B, 1, 1, S] mask fed as is: not onnxruntime's bias shape
        feeds["pm"] = np.where(RNG.random((B_, 1, 1, S_)) > 0.3, 0, -1e4).astype(np.float32)
        nodes += [n("Add", ["sc", "pm"], ["scm"])]
    elif mask == "causal":
        c["causal"] = np.triu(np.full((S_, S_), -np.inf, np.float32), 1)
        nodes += [n("Add", ["causal", "sc"], ["scm"])]
    else:
        nodes += [n("Identity", ["sc"], ["scm"])]
    nodes += [n("Softmax", ["scm"], ["pr"], axis=-1), n("MatMul", ["pr", "vt"], ["ctx"]),
              n("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3]), n("Reshape", ["ctxt", "os"], ["y"])]
    return make_model(nodes, feeds, ["y"], initializers=c, opset=opset), feeds


@pytest.mark.parametrize("mask", ["none", "raw", "causal"])
def test_attention_fusion(mask):
    m, feeds = attention_model(mask)
    got = fused(m, feeds)
    assert got == (["Cast", "Attention"] if mask == "raw" else ["Attention"])
    s = rt.InferenceSession(m.SerializeToString(), opts(L.ORT_ENABLE_ALL), providers=CPU)
    att = next(x for x in s._graph.nodes if x.op_type == "Attention")
    assert att.domain == MS and att.attrs["num_heads"] == H_
    assert len(att.inputs) == {"none": 3, "raw": 4, "causal": 6}[mask]


def test_attention_not_with_a_mask_of_another_shape():
    m, feeds = attention_model("padding_bias")
    assert "Attention" not in fused(m, feeds)


def test_attention_kernel_broadcasts_masks_onnxruntime_requires_full():
    """Beyond onnxruntime's shapes: a [1, T] raw mask and a [B, 1, 1, T] bias broadcast."""
    x, w, b = f32(2, 5, 8), f32(8, 24), f32(24)
    raw = np.array([[1, 1, 1, 1, 0]], np.int32)
    bias = np.where(RNG.random((2, 1, 1, 5)) > 0.5, 0, -30).astype(np.float32)
    from runtime_provider_cpu.ops.fused import attention

    full = attention(None, x, w, b, np.repeat(raw, 2, 0), num_heads=2)
    np.testing.assert_allclose(attention(None, x, w, b, raw, num_heads=2), full, rtol=1e-6)
    full = attention(None, x, w, b, None, None, np.broadcast_to(bias, (2, 2, 5, 5)).copy(), num_heads=2)
    np.testing.assert_allclose(attention(None, x, w, b, None, None, bias, num_heads=2), full, rtol=1e-6)


def test_attention_not_when_the_head_reshape_is_not_a_split_of_the_last_axis():
    m, feeds = attention_model(head_shape=(B_, H_, S_, D_ // H_))  # [B, H, S, dk]: another layout
    assert "Attention" not in fused(m, feeds)


def test_saved_fused_model_runs_in_onnxruntime(tmp_path):
    """The com.microsoft ops are onnxruntime's: the optimized model loads and agrees there."""
    m, feeds = attention_model("raw")
    so = opts(L.ORT_ENABLE_ALL)
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    rt.InferenceSession(m.SerializeToString(), so, providers=CPU)
    opt = onnx.load(so.optimized_model_filepath)
    assert [x.op_type for x in opt.graph.node] == ["Cast", "Attention"]
    assert_close(run_oracle(opt, feeds), run_oracle(m, feeds), rtol=1e-4, atol=1e-5)


# -- com.microsoft kernels against onnxruntime ------------------------------------------------------

def ms_model(op, inputs, inits, attrs, outs):
    node = helper.make_node(op, list(inputs) + list(inits), [o for o, _ in outs], domain=MS, **attrs)
    m = make_model([node], inputs, [], initializers=inits, extra_opsets={MS: 1})
    for o, shape in outs:
        if o:
            m.graph.output.append(helper.make_tensor_value_info(o, TensorProto.FLOAT, shape))
    return m


def check_ms(op, inputs, inits, attrs, outs, rtol=1e-5, atol=1e-5):
    m = ms_model(op, inputs, inits, attrs, outs)
    ours = rt.InferenceSession(m.SerializeToString(), providers=CPU).run(None, inputs)
    assert_close(ours, run_oracle(m, inputs), rtol, atol)


XK = f32(2, 5, 8)


@pytest.mark.parametrize("op,inits", [("Gelu", {}), ("FastGelu", {}), ("FastGelu", {"b": f32(8)}),
                                      ("BiasGelu", {"b": f32(8)})])
def test_ms_activation_kernels(op, inits):
    check_ms(op, {"x": XK}, inits, {}, [("y", XK.shape)])


@pytest.mark.parametrize("skip_shape,inits,outs", [
    ((2, 5, 8), ("g", "b", "bias"), ("y", "", "", "sum")),
    ((5, 8), ("g", "b", "bias"), ("y",)),
    ((1, 5, 8), ("g",), ("y", "", "", "sum")),
])
@pytest.mark.parametrize("native", [True, False])
def test_ms_skip_layer_norm_kernel(skip_shape, inits, outs, native, monkeypatch):
    from runtime_provider_cpu.ops import fused

    if native:
        assert fused._native is not None, "runtime_provider_cpu._native did not build"
    else:
        monkeypatch.setattr(fused, "_native", None)
    vals = {k: f32(8) for k in inits}
    shapes = {"y": XK.shape, "sum": XK.shape, "": None}
    check_ms("SkipLayerNormalization", {"x": XK, "s": f32(*skip_shape)}, vals, {"epsilon": 1e-5},
             [(o, shapes[o]) for o in outs])


@pytest.mark.parametrize("skip_batch,beta,bias", [(3, True, True), (1, False, True), (3, True, False)])
def test_skip_layer_norm_compiled_matches_numpy(skip_batch, beta, bias, monkeypatch):
    # every output (mean and inv_std_var too, which onnxruntime does not give) of the compiled
    # row pass against the numpy passes, at ViT-tiny's width; a skip of batch 1 is broadcast
    from runtime_provider_cpu.ops import fused

    class Ctx:
        n_outputs = 4

    x, skip = f32(3, 197, 192) * 3 + 1, f32(skip_batch, 197, 192)
    g, b, bb = f32(192), f32(192) if beta else None, f32(192) if bias else None
    compiled = fused._skip_ln(Ctx, x, skip, g, b, bb, 1e-5, None)
    monkeypatch.setattr(fused, "_native", None)
    numpy_ = fused._skip_ln(Ctx, x, skip, g, b, bb, 1e-5, None)
    assert [a.shape for a in compiled] == [a.shape for a in numpy_]
    for a, e in zip(compiled, numpy_):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("t", [1, 7, 8, 9, 128, 203])
def test_attention_softmax_compiled_matches_numpy(t, monkeypatch):
    # the compiled row softmax against the numpy passes: large and masked scores (-10000,
    # float32's min, -inf), a row of -inf only (NaN in both), a row with a NaN (NaN in both)
    from runtime_provider_cpu.ops import fused

    assert fused._native is not None, "runtime_provider_cpu._native did not build"
    z = f32(3, 4, 6, t) * 20
    z[0, 0, 1, ::2] = -10000.0
    z[0, 1, 2, 1::3] = np.finfo(np.float32).min
    z[1, 2, 3, :-1] = -np.inf
    z[2, 3, 4] = -np.inf
    z[2, 0, 5, t // 2] = np.nan
    with np.errstate(all="ignore"):
        compiled = fused._softmax_inplace(z.copy())
        monkeypatch.setattr(fused, "_native", None)
        numpy_ = fused._softmax_inplace(z.copy())
    np.testing.assert_allclose(compiled, numpy_, rtol=2e-6, atol=1e-7)  # NaNs where numpy's are
    assert np.isnan(compiled[2, 3, 4]).all() and np.isnan(compiled[2, 0, 5]).all()


RAW = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32)


@pytest.mark.parametrize("extra,names,attrs", [
    ({}, [], {"num_heads": 2}),
    ({}, [], {"num_heads": 4, "scale": 0.3}),
    ({}, [], {"num_heads": 2, "unidirectional": 1}),
    ({"m": RAW}, ["m"], {"num_heads": 2}),
    ({"m": RAW}, ["m"], {"num_heads": 2, "unidirectional": 1, "mask_filter_value": -50.0}),
    ({"m": np.array([3, 5], np.int32)}, ["m"], {"num_heads": 2}),
    ({"m": np.array([3, 5, 1, 0], np.int32)}, ["m"], {"num_heads": 2}),
    ({"m": (RNG.random((2, 5, 5)) > 0.3).astype(np.int32)}, ["m"], {"num_heads": 2}),
    ({"ab": f32(1, 1, 5, 5)}, ["", "", "ab"], {"num_heads": 2}),
    ({"ab": f32(2, 2, 5, 5), "m": RAW}, ["m", "", "ab"], {"num_heads": 2}),
])
def test_ms_attention_kernel(extra, names, attrs):
    inits = {"W": f32(8, 24), "B": f32(24)}
    node = helper.make_node("Attention", ["x", "W", "B"] + names, ["y"], domain=MS, **attrs)
    inputs = {"x": XK, **extra}
    m = make_model([node], inputs, [], initializers=inits, extra_opsets={MS: 1})
    m.graph.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, XK.shape))
    ours = rt.InferenceSession(m.SerializeToString(), providers=CPU).run(None, inputs)
    assert_close(ours, run_oracle(m, inputs), 1e-4, 1e-5)


# -- PyTorch-exported transformers ------------------------------------------------------------------

torch = pytest.importorskip("torch", reason="torch is a test-only dependency")

#: (model, exporter, opset): BERT-style (post-LN, erf GELU, 0/1 padding mask) and GPT-style
#: (pre-LN, tanh GELU, causal mask), each from both exporters; TorchScript at 13 exports
#: LayerNorm decomposed, at 17 as LayerNormalization; dynamo 18 has no Gelu op, 20 has one.
TORCH = [("bert", "torchscript", 13), ("bert", "dynamo", 20), ("gpt", "torchscript", 17), ("gpt", "dynamo", 18)]


@pytest.fixture(scope="module", params=TORCH, ids=[f"{a}-{b}-op{c}" for a, b, c in TORCH])
def export(request):
    from models import builders as B

    name, exporter, opset = request.param
    if exporter == "dynamo":
        pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
    ex = B.export_torch(name, exporter, opset)
    ref = rt.InferenceSession(ex.model, opts(L.ORT_DISABLE_ALL), providers=CPU).run(None, ex.feeds)
    return ex, ref


@pytest.mark.parametrize("level", [L.ORT_ENABLE_BASIC, L.ORT_ENABLE_EXTENDED, L.ORT_ENABLE_ALL])
def test_torch_transformer_every_level(export, level):
    ex, ref = export
    s = rt.InferenceSession(ex.model, opts(level), providers=CPU)
    assert_close(s.run(None, ex.feeds), ref, rtol=1e-4, atol=1e-4)
    assert_close(s.run(None, ex.export_feeds), [np.asarray(e) for e in ex.export_expected], rtol=1e-3, atol=1e-4)


def test_torch_transformer_node_count_reduction(export):
    """At ORT_ENABLE_ALL: attention, (Skip)LayerNorm and Gelu fused; >= 40% fewer nodes."""
    ex, _ = export
    before = len(ex.proto().graph.node)
    s = rt.InferenceSession(ex.model, opts(L.ORT_ENABLE_ALL), providers=CPU)
    ops = [x.op_type for x in s.get_partition_report().nodes]
    assert ops.count("SkipLayerNormalization") >= 4
    assert ops.count("BiasGelu") + ops.count("FastGelu") == 2
    assert ops.count("Attention") == 2
    reduction = 1 - len(ops) / before
    assert reduction >= 0.4, f"{before} -> {len(ops)} nodes ({reduction:.0%})"


# -- provider-aware fusions ------------------------------------------------------------------------

class _ClaimsMatMul:
    """A provider that runs MatMul only (it has no Gemm)."""

    name, alias, device_type = "MatMulOnlyProvider", "matmulonly", "cpu"

    def get_capability(self, graph):
        from types import SimpleNamespace

        claims = [v for v in graph if v.op_type == "MatMul"]
        return SimpleNamespace(claims=claims, declined={v.name: "not MatMul" for v in graph if v.op_type != "MatMul"})


def test_fusions_leave_nodes_of_other_providers_alone():
    from runtime_core.graph import Graph
    from runtime_core.optimizer import optimize
    from runtime_provider_cpu.plugin import CPUExecutionProvider

    a = f32(3, 4)
    nodes = [n("MatMul", ["a", "w"], ["m"], name="mm"), n("Add", ["m", "c"], ["y"], name="add")]
    m = make_model(nodes, {"a": a}, ["y"], initializers={"w": f32(4, 5), "c": f32(5)})
    g = Graph(m)
    optimize(g, 99, providers=[_ClaimsMatMul(), CPUExecutionProvider()])
    assert [x.op_type for x in g.nodes] == ["MatMul", "Add"]
    g = Graph(m)
    optimize(g, 99, providers=[CPUExecutionProvider()])
    assert [x.op_type for x in g.nodes] == ["Gemm"]


def test_batchnorm_after_a_residual_add_of_two_convs_folds_into_both():
    x = f32(2, 3, 8, 8)
    nodes = [n("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             n("Conv", ["x", "w2", "b2"], ["c2"], name="conv2"),
             n("Add", ["c1", "c2"], ["s"], name="add"),
             n("BatchNormalization", ["s", "g", "beta", "mu", "var"], ["y"], name="bn")]
    inits = {"w1": f32(4, 3, 3, 3), "w2": f32(4, 3, 1, 1), "b2": f32(4), "g": f32(4), "beta": f32(4),
             "mu": f32(4), "var": np.abs(f32(4)) + 0.5}
    m = make_model(nodes, {"x": x}, ["y"], initializers=inits)
    s = rt.InferenceSession(m.SerializeToString(), opts(L.ORT_ENABLE_ALL), providers=CPU)
    # BN folded into both convs; the residual Add then joins the second one as FusedConv's Z
    assert [v.op_type for v in s.get_partition_report().nodes] == ["Conv", "FusedConv"]
    ref = rt.InferenceSession(m.SerializeToString(), opts(L.ORT_DISABLE_ALL), providers=CPU).run(None, {"x": x})
    assert_close(s.run(None, {"x": x}), ref, rtol=1e-4, atol=1e-5)


def test_batchnorm_after_add_stays_when_a_conv_output_is_read_twice():
    x = f32(2, 3, 8, 8)
    nodes = [n("Conv", ["x", "w1"], ["c1"], name="conv1"),
             n("Conv", ["x", "w2"], ["c2"], name="conv2"),
             n("Add", ["c1", "c2"], ["s"], name="add"),
             n("BatchNormalization", ["s", "g", "beta", "mu", "var"], ["y"], name="bn"),
             n("Relu", ["c2"], ["r"], name="relu")]
    inits = {"w1": f32(4, 3, 1, 1), "w2": f32(4, 3, 1, 1), "g": f32(4), "beta": f32(4), "mu": f32(4),
             "var": np.abs(f32(4)) + 0.5}
    m = make_model(nodes, {"x": x}, ["y", "r"], initializers=inits)
    s = rt.InferenceSession(m.SerializeToString(), opts(L.ORT_ENABLE_ALL), providers=CPU)
    assert "BatchNormalization" in [v.op_type for v in s.get_partition_report().nodes]


# -- traced attention layouts (nn.MultiheadAttention, SDPA, GPT-2's Where mask) ---------------

def _export_static(module, x, exporter, opset):
    import io
    import warnings

    module.eval()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
            prog = torch.onnx.export(module, (x,), dynamo=True, opset_version=opset, input_names=["x"])
            return prog.model_proto
        torch.onnx.export(module, (x,), buf, dynamo=False, opset_version=opset, input_names=["x"])
    return onnx.load_from_string(buf.getvalue())


class _MHA(torch.nn.Module if "torch" in globals() else object):
    def __init__(self, batch_first=True):
        super().__init__()
        torch.manual_seed(3)
        self.m = torch.nn.MultiheadAttention(16, 2, batch_first=batch_first)
        with torch.no_grad():
            self.m.out_proj.bias.normal_()

    def forward(self, x):
        return self.m(x, x, x, need_weights=False)[0]


class _SDPA(torch.nn.Module if "torch" in globals() else object):
    def __init__(self, causal=False):
        super().__init__()
        torch.manual_seed(4)
        self.qkv, self.o, self.causal = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16), causal

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, 2, 8).transpose(1, 2) for z in self.qkv(x).split(16, dim=-1))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.o(y.transpose(1, 2).reshape(b, t, d))


def _fused_everywhere(m, feeds, tmp_path):
    """Fused op types at ORT_ENABLE_ALL (outputs equal to ORT_DISABLE_ALL), and the saved
    optimized model agreeing in onnxruntime."""
    got = fused(m, feeds, L.ORT_ENABLE_ALL)
    so = opts(L.ORT_ENABLE_ALL)
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    rt.InferenceSession(m.SerializeToString(), so, providers=CPU)
    assert_close(run_oracle(onnx.load(so.optimized_model_filepath), feeds), run_oracle(m, feeds), rtol=1e-4,
                 atol=1e-5)
    return got


TRACED = [(kind, ex, op) for kind in ("mha", "mha_seq_first", "sdpa", "sdpa_causal")
          for ex, op in (("torchscript", 14), ("torchscript", 17), ("dynamo", 18), ("dynamo", 20))]


@pytest.mark.parametrize("kind,exporter,opset", TRACED, ids=[f"{a}-{b}-op{c}" for a, b, c in TRACED])
def test_attention_fusion_of_torch_attention_layouts(kind, exporter, opset, tmp_path):
    if kind.startswith("mha"):
        mod = _MHA(batch_first=kind == "mha")
        x = torch.randn(2, 5, 16) if kind == "mha" else torch.randn(5, 2, 16)
    else:
        mod, x = _SDPA(causal=kind == "sdpa_causal"), torch.randn(2, 5, 16)
    m = _export_static(mod, x, exporter, opset)
    feeds = {"x": x.numpy()}
    got = _fused_everywhere(m, feeds, tmp_path)
    want = {"mha": ["Attention", "MatMul", "Add"], "mha_seq_first": ["Transpose", "Attention", "MatMul", "Add",
                                                                      "Transpose"],
            "sdpa": ["Attention", "MatMul", "Add"], "sdpa_causal": ["Attention", "MatMul", "Add"]}[kind]
    assert got == want
    with torch.no_grad():
        np.testing.assert_allclose(rt.InferenceSession(m.SerializeToString(), providers=CPU).run(None, feeds)[0],
                                   mod(x).numpy(), rtol=1e-4, atol=1e-5)


def gpt_attention_model(cond=None, fill=-np.inf, scale_q=None, extra_reader=False, cond_first=True):
    """GPT-2's form: packed qkv Split, heads, Div by sqrt(dk), Where(causal, -inf, scores)."""
    c = {"w": f32(D_, 3 * D_, scale=0.3), "bqkv": f32(3 * D_), "hs": np.array([B_, S_, H_, D_ // H_], np.int64),
         "os": np.array([B_, S_, D_], np.int64), "c": np.float32(math.sqrt(D_ // H_)), "sp": np.array([D_] * 3, np.int64),
         "fill": np.float32(fill),
         "cond": (np.triu(np.ones((S_, S_), bool), 1) if cond is None else cond).reshape(1, 1, S_, S_)}
    nodes = [n("MatMul", ["x", "w"], ["p"]), n("Add", ["bqkv", "p"], ["qkv"]), n("Split", ["qkv", "sp"], ["q", "k", "v"], axis=2)]
    for name, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [n("Reshape", [name, "hs"], [name + "r"]), n("Transpose", [name + "r"], [name + "t"], perm=perm)]
    qt = "qt"
    if scale_q is not None:
        c["sq"] = scale_q
        nodes.append(n("Mul", ["qt", "sq"], ["qts"]))
        qt = "qts"
    nodes += [n("MatMul", [qt, "kt"], ["qk"]), n("Div", ["qk", "c"], ["sc"]),
              n("Where", ["cond", "fill", "sc"], ["scm"]) if cond_first else
              n("Where", ["cond", "sc", "fill"], ["scm"]),
              n("Softmax", ["scm"], ["pr"], axis=-1), n("MatMul", ["pr", "vt"], ["ctx"]),
              n("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3]), n("Reshape", ["ctxt", "os"], ["y"])]
    outs = ["y"]
    if extra_reader:
        nodes.append(n("Relu", ["k"], ["k_relu"]))
        outs.append("k_relu")
    feeds = {"x": f32(B_, S_, D_)}
    return make_model(nodes, feeds, outs, initializers=c, opset=17), feeds


def test_attention_fusion_of_a_where_causal_mask_is_unidirectional(tmp_path):
    m, feeds = gpt_attention_model()
    assert _fused_everywhere(m, feeds, tmp_path) == ["Attention"]
    att = rt.InferenceSession(m.SerializeToString(), opts(L.ORT_ENABLE_ALL), providers=CPU)._graph.nodes[0]
    assert att.attrs["unidirectional"] == 1 and att.attrs["qkv_hidden_sizes"] == [D_] * 3
    assert att.attrs["scale"] == pytest.approx(1 / math.sqrt(D_ // H_))
    # the keep-mask form Where(keep, scores, -inf), and a scalar q scale folded into `scale`
    m, feeds = gpt_attention_model(cond=np.tril(np.ones((S_, S_), bool)), cond_first=False,
                                   scale_q=np.float32(0.7))
    assert _fused_everywhere(m, feeds, tmp_path) == ["Attention"]


@pytest.mark.parametrize("case", ["not_causal", "finite_fill", "vector_scale", "k_read_elsewhere"])
def test_attention_fusion_not_for_a_where_mask_it_cannot_express(case):
    kw = {"not_causal": {"cond": np.triu(np.ones((S_, S_), bool), 2)},  # one diagonal more visible
          "finite_fill": {"fill": -100.0},  # replaces by -100 (not an additive mask, not -inf)
          "vector_scale": {"scale_q": f32(D_ // H_)},  # per-feature scale: no `scale` expresses it
          "k_read_elsewhere": {"extra_reader": True}}[case]
    m, feeds = gpt_attention_model(**kw)
    assert "Attention" not in fused(m, feeds, L.ORT_ENABLE_ALL)


def test_traced_attention_not_when_heads_mix_batch_entries():
    """nn.MultiheadAttention's [S, B*H, dk] fold read back with B and H swapped: the heads
    are not whole (they mix batch entries), so nothing is fused and outputs still agree."""
    m = _export_static(_MHA(), torch.randn(2, 5, 16), "torchscript", 17)
    nodes = list(m.graph.node)
    # swap the perm of the context Transpose [2, 0, 1, 3] -> [2, 1, 0, 3]: the output rows permute
    hit = [x for x in nodes if x.op_type == "Transpose" and list(x.attribute[0].ints) == [2, 0, 1, 3]]
    assert len(hit) == 1
    hit[0].attribute[0].ints[:] = [2, 1, 0, 3]
    feeds = {"x": f32(2, 5, 16)}
    assert "Attention" not in fused(m, feeds, L.ORT_ENABLE_ALL)


def test_traced_attention_not_when_the_out_projection_input_is_read_elsewhere():
    m = _export_static(_SDPA(), torch.randn(2, 5, 16), "torchscript", 17)
    g = m.graph
    tr = [x for x in g.node if x.op_type == "Transpose" and list(x.attribute[0].ints) == [0, 2, 1, 3]][-1]
    g.node.append(helper.make_node("Relu", [tr.output[0]], ["extra"]))
    g.output.append(helper.make_tensor_value_info("extra", TensorProto.FLOAT, [2, 5, 2, 8]))
    feeds = {"x": f32(2, 5, 16)}
    got = fused(m, feeds, L.ORT_ENABLE_ALL)
    # the heads stay as they are (the level-ALL ScaledDotProductAttention may take their core)
    assert "Attention" not in got and ("Softmax" in got or "ScaledDotProductAttention" in got)
