"""RMSNorm: the decomposed forms exporters write fuse into ``SimplifiedLayerNormalization`` /
``SkipSimplifiedLayerNormalization`` (the T5-style encoder of ``tests/models/hf_variants.py``
among them), and the CPU kernels of those ops match onnxruntime's contrib ops."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import runtime_core as rt
from runtime_core.errors import RuntimeCoreError

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the oracle")

L = rt.GraphOptimizationLevel
CPU = ["CPUExecutionProvider"]
MS = "com.microsoft"
D = 16


def _ours(model, feeds, level=L.ORT_ENABLE_ALL):
    so = rt.SessionOptions()
    so.graph_optimization_level = level
    s = rt.InferenceSession(model.SerializeToString(), so, providers=CPU)
    return s.run(None, feeds), [n.op_type for n in s._graph.nodes], s


def _oracle(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=CPU).run(None, feeds)


def _c(name, value):
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def _rms_model(square, inverse, weight, residual, opset=17):
    """``y = RMSNorm(x)`` written out: square ``pow``/``mul``; inverse ``div1`` (Div(1, Sqrt)),
    ``recip`` (Reciprocal(Sqrt)), ``pow`` (Pow(., -0.5)) or ``divx`` (Div(x, Sqrt)); weight
    ``left``/``right``/``none``; residual ``none``, ``add`` (x = a + b, also an output) or
    ``bias`` (x = a + (b + bias))."""
    rng = np.random.default_rng(0)
    inits = [_c("two", 2.0), _c("eps", 1e-6), _c("one", 1.0), _c("mhalf", -0.5),
             _c("w", 1.0 + 0.1 * rng.standard_normal(D)), _c("bias", 0.1 * rng.standard_normal(D)),
             numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    nodes, outs = [], ["y"]
    if residual == "none":
        x = "a"
    elif residual == "add":
        nodes.append(h.make_node("Add", ["a", "b"], ["x"]))
        x = "x"
        outs.append("x")
    else:
        nodes += [h.make_node("Add", ["b", "bias"], ["bb"]), h.make_node("Add", ["a", "bb"], ["x"])]
        x = "x"
    nodes.append(h.make_node("Pow", [x, "two"], ["sq"]) if square == "pow" else h.make_node("Mul", [x, x], ["sq"]))
    rm = (h.make_node("ReduceMean", ["sq", "axes"], ["ms"]) if opset >= 18
          else h.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]))
    nodes += [rm, h.make_node("Add", ["ms", "eps"], ["var"])]
    if inverse == "pow":
        nodes.append(h.make_node("Pow", ["var", "mhalf"], ["inv"]))
    else:
        nodes.append(h.make_node("Sqrt", ["var"], ["rms"]))
        if inverse == "div1":
            nodes.append(h.make_node("Div", ["one", "rms"], ["inv"]))
        elif inverse == "recip":
            nodes.append(h.make_node("Reciprocal", ["rms"], ["inv"]))
    n = "y" if weight == "none" else "n"
    if inverse == "divx":
        nodes.append(h.make_node("Div", [x, "rms"], [n]))
    else:
        nodes.append(h.make_node("Mul", ["inv", x] if square == "mul" else [x, "inv"], [n]))
    if weight != "none":
        nodes.append(h.make_node("Mul", ["w", "n"] if weight == "left" else ["n", "w"], ["y"]))
    vi = [h.make_tensor_value_info(n, T.FLOAT, [2, 5, D]) for n in ("a", "b")]
    g = h.make_graph(nodes, "rms", vi if residual != "none" else vi[:1],
                     [h.make_tensor_value_info(o, T.FLOAT, [2, 5, D]) for o in outs], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


FORMS = [("pow", "div1", "left", "none"), ("mul", "recip", "right", "none"), ("pow", "pow", "none", "none"),
         ("mul", "divx", "left", "none"), ("pow", "div1", "left", "add"), ("mul", "pow", "right", "bias"),
         ("pow", "recip", "none", "add"), ("pow", "divx", "right", "bias")]


@pytest.mark.parametrize("form", FORMS + [("pow", "recip", "left", "add", 18)], ids=lambda f: "-".join(map(str, f)))
def test_decomposed_forms_fuse_and_match_onnxruntime(form):
    """The last form is the dynamo exporter's (opset 18: ReduceMean's axes an input; rsqrt as
    Reciprocal(Sqrt))."""
    if form[3] == "none" and len(form) == 4:
        form = form + (23,)  # without a residual Add: the standard RMSNormalization (opset 23)
    model = _rms_model(*form)
    rng = np.random.default_rng(1)
    feeds = {"a": rng.standard_normal((2, 5, D)).astype(np.float32),
             "b": rng.standard_normal((2, 5, D)).astype(np.float32)}
    if form[3] == "none":
        del feeds["b"]
    got, ops, _ = _ours(model, feeds)
    want = "RMSNormalization" if form[3] == "none" else "SkipSimplifiedLayerNormalization"
    assert ops == [want], ops  # every node of the pattern (and the residual Adds) went in
    for a, b in zip(got, _oracle(model, feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_a_layer_norm_is_not_taken_for_an_rms_norm():
    """The variance half of a decomposed LayerNorm is an RMSNorm of the centered input: it
    stays LayerNormFusion's."""
    x = h.make_tensor_value_info("x", T.FLOAT, [2, 5, D])
    nodes = [h.make_node("ReduceMean", ["x"], ["m"], axes=[-1]), h.make_node("Sub", ["x", "m"], ["d"]),
             h.make_node("Pow", ["d", "two"], ["sq"]), h.make_node("ReduceMean", ["sq"], ["v"], axes=[-1]),
             h.make_node("Add", ["v", "eps"], ["ve"]), h.make_node("Sqrt", ["ve"], ["s"]),
             h.make_node("Div", ["d", "s"], ["y"])]
    g = h.make_graph(nodes, "ln", [x], [h.make_tensor_value_info("y", T.FLOAT, [2, 5, D])],
                     [_c("two", 2.0), _c("eps", 1e-5)])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    feeds = {"x": np.random.default_rng(2).standard_normal((2, 5, D)).astype(np.float32)}
    got, ops, _ = _ours(model, feeds)
    assert ops == ["LayerNormalization"]
    np.testing.assert_allclose(got[0], _oracle(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_weight_that_is_not_a_vector_stays_outside():
    """A scalar after the normalization is no RMSNorm weight: fused without it, kept as a Mul."""
    model = _rms_model("pow", "div1", "left", "none", 23)
    for t in model.graph.initializer:
        if t.name == "w":
            t.CopyFrom(_c("w", 1.5))
    feeds = {"a": np.random.default_rng(3).standard_normal((2, 5, D)).astype(np.float32)}
    got, ops, _ = _ours(model, feeds)
    assert sorted(ops) == ["Mul", "RMSNormalization"]
    np.testing.assert_allclose(got[0], _oracle(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_without_a_residual_add_below_opset_23_it_stays_as_written(tmp_path):
    """No op for it that onnxruntime loads from com.microsoft: the optimized model, saved, still
    loads in onnxruntime."""
    import onnx

    import runtime_core as rt

    model = _rms_model("pow", "div1", "left", "none")
    feeds = {"a": np.random.default_rng(6).standard_normal((2, 5, D)).astype(np.float32)}
    got, ops, _ = _ours(model, feeds)
    assert "ReduceMean" in ops and "SimplifiedLayerNormalization" not in ops, ops
    so = rt.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    rt.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    saved = onnx.load(str(tmp_path / "opt.onnx"))
    np.testing.assert_allclose(_oracle(saved, feeds)[0], _oracle(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_rms_normalization_23_of_a_residual_add_becomes_skip():
    w = 1.0 + 0.1 * np.random.default_rng(4).standard_normal(D)
    nodes = [h.make_node("Add", ["a", "b"], ["x"]),
             h.make_node("RMSNormalization", ["x", "w"], ["y"], epsilon=1e-6, axis=-1)]
    vi = [h.make_tensor_value_info(n, T.FLOAT, [2, 5, D]) for n in ("a", "b")]
    g = h.make_graph(nodes, "rms23", vi, [h.make_tensor_value_info("y", T.FLOAT, [2, 5, D])], [_c("w", w)])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 23)])
    rng = np.random.default_rng(5)
    feeds = {k: rng.standard_normal((2, 5, D)).astype(np.float32) for k in ("a", "b")}
    got, ops, _ = _ours(model, feeds)
    assert ops == ["SkipSimplifiedLayerNormalization"]
    np.testing.assert_allclose(got[0], _oracle(model, feeds)[0], rtol=1e-5, atol=1e-5)


# -- the kernels against onnxruntime's contrib ops ---------------------------------------------

def _single(op, domain, ins, outs, attrs, opsets):
    """A one-node model; ``ins``: (name, elem type, shape); outputs: x's type but the
    statistics (``mean``, ``inv``: float32)."""
    node = h.make_node(op, [i[0] for i in ins], outs, domain=domain, **attrs)
    g = h.make_graph([node], "k", [h.make_tensor_value_info(n, t, s) for n, t, s in ins],
                     [h.make_tensor_value_info(o, T.FLOAT if o in ("mean", "inv") else ins[0][1], None)
                      for o in outs])
    return h.make_model(g, opset_imports=[h.make_opsetid(d, v) for d, v in opsets.items()])


@pytest.fixture(params=["compiled", "numpy"])
def kernel_path(request, monkeypatch):
    """Each kernel test runs on the compiled row kernel (where it is built) and on the numpy path."""
    from runtime_provider_cpu.ops import fused

    if request.param == "numpy":
        monkeypatch.setattr(fused, "_native", None)
    elif fused._native is None:
        pytest.skip("the compiled extension is not built here")
    return request.param


@pytest.mark.parametrize("case", ["bias-all-outputs", "batch1-skip", "2d-default-eps", "fp16"])
def test_skip_simplified_layer_norm_matches_onnxruntime(case, kernel_path):
    rng = np.random.default_rng(6)
    shape = (6, D) if case.startswith("2d") else (3, 4, D)
    skip_shape = (1, 4, D) if case == "batch1-skip" else shape
    dt, et = (np.float16, T.FLOAT16) if case == "fp16" else (np.float32, T.FLOAT)
    feeds = {"x": 0.01 * rng.standard_normal(shape).astype(dt), "s": 0.01 * rng.standard_normal(skip_shape).astype(dt),
             "g": (1 + 0.1 * rng.standard_normal(D)).astype(dt)}
    ins = [("x", et, shape), ("s", et, skip_shape), ("g", et, [D])]
    if case == "bias-all-outputs":
        feeds["b"] = (0.01 * rng.standard_normal(D)).astype(dt)
        ins.append(("b", et, [D]))
    outs = ["y", "mean", "inv", "sum"] if case in ("bias-all-outputs", "fp16") else ["y"]
    attrs = {} if case.startswith("2d") else {"epsilon": 1e-6}
    model = _single("SkipSimplifiedLayerNormalization", MS, ins, outs, attrs, {"": 17, MS: 1})
    got, _, _ = _ours(model, feeds, L.ORT_DISABLE_ALL)
    ref = _oracle(model, feeds)
    tol = 2e-3 if dt == np.float16 else 1e-5
    for a, b in zip(got, ref, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), rtol=tol, atol=tol)


@pytest.mark.parametrize("axis", [-1, 1])
def test_simplified_layer_norm_matches_onnxruntime(axis, kernel_path):
    """onnxruntime registers its SimplifiedLayerNormalization in the ai.onnx domain; ours is the
    com.microsoft op the fusion writes: the same node under each name."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, D)).astype(np.float32)
    scale_shape = [3, D] if axis == 1 else [D]
    feeds = {"x": x, "w": rng.standard_normal(scale_shape).astype(np.float32)}
    ins = [("x", T.FLOAT, [2, 3, D]), ("w", T.FLOAT, scale_shape)]
    attrs = {"axis": axis, "epsilon": 1e-5}
    ref = _oracle(_single("SimplifiedLayerNormalization", "", ins, ["y", "inv"], attrs, {"": 17}), feeds)
    got, _, _ = _ours(_single("SimplifiedLayerNormalization", MS, ins, ["y", "inv"], attrs, {"": 17, MS: 1}),
                      feeds, L.ORT_DISABLE_ALL)
    for a, b in zip(got, ref, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_skip_that_does_not_fit_is_a_typed_error(kernel_path):
    ins = [("x", T.FLOAT, [2, 4, D]), ("s", T.FLOAT, None), ("g", T.FLOAT, [D])]
    model = _single("SkipSimplifiedLayerNormalization", MS, ins, ["y"], {"epsilon": 1e-6}, {"": 17, MS: 1})
    feeds = {"x": np.ones((2, 4, D), np.float32), "s": np.ones((2, 3, D), np.float32),
             "g": np.ones(D, np.float32)}
    with pytest.raises(RuntimeCoreError, match="skip of shape"):
        _ours(model, feeds, L.ORT_DISABLE_ALL)


@pytest.mark.parametrize("op", ["SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"])
def test_contrib_outputs_are_typed_on_load(op):
    """A model that holds the contrib op (as a saved optimized model does): its outputs and what
    reads them get types though onnx knows no schema for it."""
    from runtime_core.graph import Graph

    ins = [h.make_tensor_value_info("x", T.FLOAT, ["n", 5, D]), h.make_tensor_value_info("g", T.FLOAT, [D])]
    if op == "SimplifiedLayerNormalization":
        node = h.make_node(op, ["x", "g"], ["y", "inv"], domain=MS, epsilon=1e-6)
        stats = ["inv"]
    else:
        ins.append(h.make_tensor_value_info("s", T.FLOAT, ["n", 5, D]))
        node = h.make_node(op, ["x", "s", "g"], ["y", "mean", "inv", "sum"], domain=MS, epsilon=1e-6)
        stats = ["mean", "inv"]
    g = h.make_graph([node, h.make_node("Relu", ["y"], ["z"])], "t", ins,
                     [h.make_tensor_value_info("z", T.FLOAT, None)])
    graph = Graph(h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(MS, 1)]))

    def dims(name):
        tp = graph.type_of(name)
        assert tp.tensor_type.elem_type == T.FLOAT, name
        return [d.dim_value or d.dim_param for d in tp.tensor_type.shape.dim]

    assert dims("y") == dims("z") == ["n", 5, D]
    for name in stats:
        assert dims(name) == ["n", 5, 1]


# -- the T5-style encoder as exported --------------------------------------------------------

torch = pytest.importorskip("torch", reason="torch is a test-only dependency")


@pytest.mark.parametrize("opset,dynamic", [(14, True), (17, False)])
def test_t5_encoder_rms_norms_fuse_and_match_onnxruntime(opset, dynamic):
    """Two layers: the first norm (after the embedding) has no residual Add; the other four do."""
    from models import hf_variants as V
    from oracle import run_oracle

    ex = V.export("t5", "torchscript", opset, dynamic)
    got, ops, _ = _ours(ex.model, ex.feeds)
    # the first norm has no residual Add and, below opset 23, stays as written (see above)
    assert ops.count("SkipSimplifiedLayerNormalization") == 4 and "SimplifiedLayerNormalization" not in ops
    assert ops.count("ReduceMean") == 1 and ops.count("Sqrt") <= 1, ops
    np.testing.assert_allclose(got[0], run_oracle(ex.model, ex.feeds)[0], rtol=1e-4, atol=1e-4)
