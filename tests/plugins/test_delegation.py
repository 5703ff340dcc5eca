"""Plugin API 1.4: what a provider needs to hand whole partitions to another runtime.

``NodeView.to_proto`` (faithful, attribute types and bodies kept), ``opset_imports`` /
``ir_version`` (bodies' domains included), ``Partition.to_model`` (checker-clean, outer-scope
values as inputs), types after the optimizer's contrib ops, partition shaping, the session's
settings, and the loader naming the value its checker refuses.
"""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import runtime_core as rt
from runtime_core.errors import InvalidModelError
from runtime_core.graph.ir import Graph
from runtime_core.graph.loader import load_model
from runtime_core.partition import partition_graph
from runtime_core.plugin import API_VERSION, Capability, NodeView, SessionSettings, reload_plugins
from runtime_core.plugin.registry import get_registry

RNG = np.random.default_rng(3)


def _model(nodes, inputs, outputs, inits=(), opsets=(("", 17),), ir=8):
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = ir
    return m


def _if_model(extra_domain=True):
    """An If whose branches read an outer input ``x`` and an outer initializer ``w``; the then
    branch nests a Loop and (optionally) uses a domain nothing outside the bodies uses."""
    loop_body = h.make_graph(
        [h.make_node("Add", ["acc", "w"], ["acc_out"]), h.make_node("Identity", ["cond_in"], ["cond_out"])],
        "loop_body", [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("cond_in", T.BOOL, []),
                      h.make_tensor_value_info("acc", T.FLOAT, None)],
        [h.make_tensor_value_info("cond_out", T.BOOL, []), h.make_tensor_value_info("acc_out", T.FLOAT, None)])
    then_nodes = [h.make_node("Loop", ["trips", "", "x"], ["t"], body=loop_body)]
    if extra_domain:  # read by nothing: only its domain matters
        then_nodes.append(h.make_node("LabelEncoder", ["lbl"], ["lbl_out"], domain="ai.onnx.ml",
                                      keys_int64s=[1, 2], values_int64s=[5, 6]))
    then_nodes.append(h.make_node("Identity", ["t"], ["r"]))
    then = h.make_graph(then_nodes, "then", [], [h.make_tensor_value_info("r", T.FLOAT, None)])
    els = h.make_graph([h.make_node("Sub", ["x", "w"], ["r2"])], "else", [],
                       [h.make_tensor_value_info("r2", T.FLOAT, None)])
    nodes = [h.make_node("ReduceSum", ["x"], ["s"], keepdims=0), h.make_node("Greater", ["s", "zero"], ["c"]),
             h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=els),
             h.make_node("LeakyRelu", ["y"], ["z"], alpha=0.25)]
    inits = [nh.from_array(np.array([1, 2, 3], np.float32), "w"), nh.from_array(np.array(0, np.float32), "zero"),
             nh.from_array(np.array(2, np.int64), "trips"), nh.from_array(np.array([1, 2], np.int64), "lbl")]
    opsets = [("", 17), ("ai.onnx.ml", 3)] if extra_domain else [("", 17)]
    return _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, ["N", 3])],
                  [h.make_tensor_value_info("z", T.FLOAT, ["N", 3])], inits, opsets)


class ClaimAll:
    """Claims every node it is offered (or those of ``ops``), one by one."""

    name = "ClaimAll"

    def __init__(self, ops=None):
        self.ops = ops
        self.views = []

    def get_capability(self, graph):
        self.views.append(graph)
        cap = Capability()
        for n in graph:
            if self.ops is None or n.op_type in self.ops:
                cap.claims.append(n)
            else:
                cap.declined[n.name] = f"{n.op_type} is not in the allow-list"
        return cap


def _cpu():
    return get_registry().lookup("cpu").cls({})


# -- 1. NodeView.to_proto --------------------------------------------------------------------
def test_to_proto_gives_back_every_node_as_written():
    const = h.make_node("Constant", [], ["k"], value=nh.from_array(np.arange(6, dtype=np.float32).reshape(2, 3)))
    conv = h.make_node("Conv", ["img", "cw"], ["cv"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1])
    cast = h.make_node("Cast", ["cv"], ["cc"], to=T.DOUBLE)
    model = _if_model()
    model.graph.node.extend([const, conv, cast])
    model.graph.input.append(h.make_tensor_value_info("img", T.FLOAT, [1, 2, 4, 4]))
    model.graph.initializer.append(nh.from_array(RNG.standard_normal((2, 2, 3, 3)).astype(np.float32), "cw"))
    model.graph.output.append(h.make_tensor_value_info("cc", T.DOUBLE, [1, 2, 4, 4]))
    graph = Graph(model)
    for proto, node in zip(model.graph.node, graph.nodes):
        got = graph.node_view(node).to_proto()
        want = onnx.NodeProto()
        want.CopyFrom(proto)
        want.name = node.name  # the core names unnamed nodes
        assert got.SerializeToString() == want.SerializeToString(), node.name
    # attribute types survive: FLOAT stays FLOAT, INTS stay INTS, TENSOR and GRAPH are kept
    by_op = {n.op_type: graph.node_view(n).to_proto() for n in graph.nodes}
    types = {a.name: a.type for p in by_op.values() for a in p.attribute}
    assert types["alpha"] == onnx.AttributeProto.FLOAT and types["pads"] == onnx.AttributeProto.INTS
    assert types["value"] == onnx.AttributeProto.TENSOR and types["then_branch"] == onnx.AttributeProto.GRAPH
    # a body node too: its view gives its proto with its own subgraph
    body_loop = graph.node_view(graph.nodes[2]).subgraphs["then_branch"].nodes[0]
    assert body_loop.op_type == "Loop" and body_loop.to_proto().attribute[0].g.name == "loop_body"
    # the proto is a copy: editing it changes nothing in the core
    p = by_op["LeakyRelu"]
    p.attribute[0].f = 9.0
    assert graph.node_view(graph.nodes[3]).to_proto().attribute[0].f == pytest.approx(0.25)


def test_to_proto_of_a_view_built_without_protos_uses_the_schema_types():
    view = NodeView(name="lr", op_type="LeakyRelu", domain="", since_version=16, opset=17,
                    attrs={"alpha": 1}, inputs=("x",), outputs=("y",), input_info=(None,), output_info=(None,))
    (a,) = view.to_proto().attribute
    assert a.type == onnx.AttributeProto.FLOAT and a.f == 1.0  # an int value, a FLOAT attribute
    view = NodeView(name="t", op_type="Transpose", domain="", since_version=13, opset=17,
                    attrs={"perm": None}, inputs=("x",), outputs=("y",), input_info=(None,), output_info=(None,))
    assert list(view.to_proto().attribute) == []  # unset optional attributes stay unset


# -- 2. opset_imports / ir_version ----------------------------------------------------------
def test_opset_imports_cover_domains_used_only_inside_bodies():
    graph = Graph(_if_model())
    prov = ClaimAll(ops={"If", "LeakyRelu"})
    planned, _ = partition_graph(graph, [prov, _cpu()])
    gv = prov.views[0]
    assert gv.opset_imports == {"": 17, "ai.onnx.ml": 3} and gv.ir_version == 8
    parts = {tuple(n.op_type for n in pp.partition.nodes): pp.partition for pp in planned}
    with_if = parts[("If", "LeakyRelu")]
    assert with_if.opset_imports == {"": 17, "ai.onnx.ml": 3}  # LabelEncoder is only in the then branch
    assert with_if.ir_version == 8
    plain = parts[("ReduceSum", "Greater")]
    assert plain.opset_imports == {"": 17}


# -- 3. Partition.to_model --------------------------------------------------------------------
def test_to_model_is_checker_clean_and_runs_like_the_original():
    ort = pytest.importorskip("onnxruntime")
    model = _if_model()
    graph = Graph(model)
    prov = ClaimAll(ops={"If", "LeakyRelu"})
    planned, _ = partition_graph(graph, [prov, _cpu()])
    part = next(pp.partition for pp in planned if pp.partition.provider == "ClaimAll")
    # outer-scope reads of the bodies: the input x and the initializer w, never both
    assert set(part.inputs) == {"c", "x"} and set(part.constants) >= {"w", "trips", "lbl"}
    assert not set(part.inputs) & set(part.constants)
    m = part.to_model()
    onnx.checker.check_model(m, full_check=True)
    assert [i.name for i in m.graph.input] == list(part.inputs)
    assert [o.name for o in m.graph.output] == list(part.outputs) == ["z"]
    x_in = next(i for i in m.graph.input if i.name == "x")
    assert x_in.type.tensor_type.elem_type == T.FLOAT and x_in.type.tensor_type.shape.dim[0].dim_param == "N"
    # the partition's model gives what the whole model gives, through onnxruntime
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    whole = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for x in (np.ones((2, 3), np.float32), -np.ones((4, 3), np.float32)):
        c = np.array(x.sum() > 0)
        (got,) = sess.run(None, {"c": c, "x": x})
        (want,) = whole.run(None, {"x": x})
        np.testing.assert_array_equal(got, want)


def _contrib_model():
    inits = [nh.from_array(RNG.standard_normal(8).astype(np.float32), n) for n in ("gamma", "beta", "gb")] + [
        nh.from_array(RNG.standard_normal((8, 24)).astype(np.float32), "wqkv"),
        nh.from_array(RNG.standard_normal(24).astype(np.float32), "bqkv"),
        nh.from_array(RNG.standard_normal((3, 2, 3, 3)).astype(np.float32), "cw")]
    nodes = [h.make_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta"], ["ln"], domain="com.microsoft",
                         epsilon=1e-5),
             h.make_node("Attention", ["ln", "wqkv", "bqkv"], ["att"], domain="com.microsoft", num_heads=2),
             h.make_node("BiasGelu", ["att", "gb"], ["bg"], domain="com.microsoft"),
             h.make_node("Relu", ["bg"], ["r"]),
             h.make_node("FastGelu", ["r"], ["fg"], domain="com.microsoft"),
             h.make_node("ReduceMean", ["fg"], ["y"], axes=[1]),
             h.make_node("FusedConv", ["img", "cw"], ["c"], domain="com.microsoft", activation="Relu",
                         pads=[1, 1, 1, 1]),
             h.make_node("Sigmoid", ["c"], ["z"])]
    return _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [2, 5, 8]),
                          h.make_tensor_value_info("skip", T.FLOAT, [2, 5, 8]),
                          h.make_tensor_value_info("img", T.FLOAT, [1, 2, 6, 6])],
                  [h.make_tensor_value_info("y", T.FLOAT, None), h.make_tensor_value_info("z", T.FLOAT, None)],
                  inits, [("", 13), ("com.microsoft", 1)])


def test_values_after_contrib_ops_are_typed_and_their_model_is_checker_clean():
    ort = pytest.importorskip("onnxruntime")
    model = _contrib_model()
    graph = Graph(model)
    feeds = {"x": RNG.standard_normal((2, 5, 8)).astype(np.float32),
             "skip": RNG.standard_normal((2, 5, 8)).astype(np.float32),
             "img": RNG.standard_normal((1, 2, 6, 6)).astype(np.float32)}
    names = ["ln", "att", "bg", "r", "fg", "y", "c", "z"]
    check = model.__class__()
    check.CopyFrom(model)
    del check.graph.output[:]
    check.graph.output.extend(h.make_empty_tensor_value_info(n) for n in names)
    got = dict(zip(names, ort.InferenceSession(check.SerializeToString(),
                                               providers=["CPUExecutionProvider"]).run(None, feeds)))
    for n in names:  # every value typed, as onnxruntime computes it
        v = graph.value_info(n)
        assert v.dtype == got[n].dtype and v.static_shape == got[n].shape, n
    prov = ClaimAll()
    planned, _ = partition_graph(graph, [prov, _cpu()])
    (pp,) = planned
    m = pp.partition.to_model()
    onnx.checker.check_model(m)
    assert dict((o.domain, o.version) for o in m.opset_import) == {"": 13, "com.microsoft": 1}
    out = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(out[0], got["y"], rtol=1e-6)


# -- partition shaping ---------------------------------------------------------------------------
def _islands_model():
    """Relu | Abs | Sigmoid -> Relu | Abs | Sigmoid: an allow-list of Relu/Sigmoid gives the
    islands {Relu}, {Sigmoid, Relu}, {Sigmoid}."""
    ops = ["Relu", "Abs", "Sigmoid", "Relu", "Abs", "Sigmoid"]
    names = ["x"] + [f"v{i}" for i in range(len(ops))]
    nodes = [h.make_node(op, [names[i]], [names[i + 1]], name=f"n{i}_{op}") for i, op in enumerate(ops)]
    return _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [3, 4])],
                  [h.make_tensor_value_info(names[-1], T.FLOAT, [3, 4])])


class Islands(ClaimAll):
    """Relu and Sigmoid, refusing partitions of a single node."""

    name = "Islands"
    min_partition_size = 2

    def __init__(self):
        super().__init__(ops={"Relu", "Sigmoid"})


def test_a_provider_refuses_single_node_islands():
    graph = Graph(_islands_model())
    planned, report = partition_graph(graph, [Islands(), _cpu()])
    placed = {n.name: n.provider for n in report.nodes}
    assert placed == {"n0_Relu": "CPUExecutionProvider", "n1_Abs": "CPUExecutionProvider",
                      "n2_Sigmoid": "Islands", "n3_Relu": "Islands", "n4_Abs": "CPUExecutionProvider",
                      "n5_Sigmoid": "CPUExecutionProvider"}
    mine = [pp.partition for pp in planned if pp.partition.provider == "Islands"]
    assert [len(p.nodes) for p in mine] == [2]
    why = next(n.declined["Islands"] for n in report.nodes if n.name == "n0_Relu")
    assert why.startswith("given back") and "min_partition_size 2" in why


class Reviewer(ClaimAll):
    """Sees its proposed partitions and gives back every partition that does not end in a Relu."""

    name = "Reviewer"

    def __init__(self):
        super().__init__(ops={"Relu", "Sigmoid"})
        self.seen = []

    def review_partitions(self, partitions):
        self.seen.append([[n.name for n in p.nodes] for p in partitions])
        return [n.name for p in partitions if p.nodes[-1].op_type != "Relu" for n in p.nodes]


def test_review_partitions_sees_the_cut_and_gives_nodes_back(monkeypatch):
    graph = Graph(_islands_model())
    rev = Reviewer()
    planned, report = partition_graph(graph, [rev, _cpu()])
    assert rev.seen[0] == [["n0_Relu"], ["n2_Sigmoid", "n3_Relu"], ["n5_Sigmoid"]]
    assert [[n.name for n in pp.partition.nodes] for pp in planned if pp.partition.provider == "Reviewer"] == [
        ["n0_Relu"], ["n2_Sigmoid", "n3_Relu"]]
    assert next(n for n in report.nodes if n.name == "n5_Sigmoid").declined["Reviewer"] == \
        "given back by review_partitions"


def test_shaping_in_a_session_gives_the_same_results(tmp_path, monkeypatch):
    _install(tmp_path, monkeypatch, "rt_islands_provider", ISLANDS_SOURCE, "islands")
    model = _islands_model().SerializeToString()
    sess = rt.InferenceSession(model, providers=["islands", "cpu"])
    placed = {n.name: n.provider for n in sess.get_partition_report().nodes}
    assert placed["n0_Relu"] == "CPUExecutionProvider" and placed["n3_Relu"] == "IslandsExecutionProvider"
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    want = rt.InferenceSession(model, providers=["cpu"]).run(None, {"x": x})
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want[0])


# -- session settings ---------------------------------------------------------------------------
ISLANDS_SOURCE = '''
from runtime_core.plugin import Capability, ExecutionProvider, hookimpl

SEEN = []


class IslandsExecutionProvider(ExecutionProvider):
    name = "IslandsExecutionProvider"
    alias = "islands"
    version = "1"
    distribution = "rt-islands-provider"
    plugin_api = ">=1.4,<2"
    min_partition_size = 2

    def __init__(self, options=None):
        super().__init__(options)
        from runtime_core.plugin.registry import get_registry

        self._cpu = get_registry().lookup("cpu").cls({})

    def get_capability(self, graph):
        SEEN.append(("graph", graph.settings))
        cap = Capability()
        for n in graph:
            if n.op_type in ("Relu", "Sigmoid"):
                cap.claims.append(n)
            else:
                cap.declined[n.name] = "not in the allow-list"
        return cap

    def compile(self, partition):
        SEEN.append(("partition", partition.settings))
        return self._cpu.compile(partition)


@hookimpl
def runtime_core_register_providers(registrar):
    registrar.register(IslandsExecutionProvider)
'''


def _install(tmp_path, monkeypatch, module: str, source: str, alias: str):
    """``source`` as an installed distribution with an entry point, for this test only."""
    site = tmp_path / "site"
    site.mkdir()
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[runtime_core.providers]\n{alias} = {module}\n")
    monkeypatch.syspath_prepend(str(site))
    sys.modules.pop(module, None)
    reload_plugins()


@pytest.fixture(autouse=True)
def _restore_plugins():
    yield
    reload_plugins()


def test_session_settings_reach_the_provider(tmp_path, monkeypatch):
    _install(tmp_path, monkeypatch, "rt_islands_provider", ISLANDS_SOURCE, "islands")
    import rt_islands_provider as mod

    so = rt.SessionOptions()
    so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.log_severity_level = 3
    so.intra_op_num_threads = 3
    so.inter_op_num_threads = 2
    so.execution_mode = rt.ExecutionMode.ORT_PARALLEL
    so.enable_cpu_mem_arena = False
    so.add_session_config_entry("vendor.flag", "on")
    rt.InferenceSession(_islands_model().SerializeToString(), so, providers=["islands", "cpu"])
    kinds = {k for k, _ in mod.SEEN}
    assert kinds == {"graph", "partition"}
    want = SessionSettings(graph_optimization_level=1, log_severity_level=3, log_verbosity_level=0,
                           intra_op_num_threads=3, inter_op_num_threads=2, execution_mode=1,
                           enable_cpu_mem_arena=False, config_entries={"vendor.flag": "on"})
    seen = [s for k, s in mod.SEEN if k in ("graph", "partition")]
    assert seen[-1] == want and seen[0] == want


def test_the_plugin_api_says_what_1_4_added():
    from runtime_core.plugin import registry

    assert API_VERSION == "1.4"
    src = open(registry.__file__, encoding="utf-8").read()  # the history is API_VERSION's docstring
    entry = " ".join(src[src.index("1.4: "):src.index('"""', src.index("1.4: "))].split())
    for name in ("to_proto()", "opset_imports", "to_model()", "min_partition_size", "review_partitions",
                 "SessionSettings", "1.3 provider runs unchanged"):
        assert name in entry, name


# -- the loader names the value its checker refuses ---------------------------------------------
def test_a_checker_error_names_the_value():
    out = onnx.ValueInfoProto(name="the_output")
    out.type.tensor_type.shape.SetInParent()  # a tensor output without an element type
    bad = _model([h.make_node("Relu", ["x"], ["the_output"])], [h.make_tensor_value_info("x", T.FLOAT, [2])], [out])
    with pytest.raises(InvalidModelError, match=r"graph output 'the_output'"):
        load_model(bad.SerializeToString())
    inp = onnx.ValueInfoProto(name="the_input")
    inp.type.sequence_type.SetInParent()
    bad = _model([h.make_node("Identity", ["the_input"], ["y"])], [inp], [h.make_tensor_value_info("y", T.FLOAT, [2])])
    with pytest.raises(InvalidModelError, match=r"graph input 'the_input', declared as sequence"):
        load_model(bad.SerializeToString())


def test_the_kit_accepts_nodes_given_back_by_shaping(tmp_path, monkeypatch):
    _install(tmp_path, monkeypatch, "rt_islands_provider", ISLANDS_SOURCE, "islands")
    from runtime_core.testing import ConformanceKit
    from runtime_core.testing.kit import NOT_EXERCISED

    k = ConformanceKit("islands", pattern=r"^node/test_relu$")
    (e,) = k.claimed_cases()
    res = k.run_case(e)
    assert res.outcome == NOT_EXERCISED and "gave back every node" in res.message
    assert "min_partition_size 2" in res.message and "not exercised node/test_relu" in k.summary()


def test_a_model_written_by_the_optimizer_reloads_fully_typed():
    """The issue's case: ``runtime-core optimize`` writes com.microsoft ops; reloaded, every value
    after them has its type (onnx's inference stops at them)."""
    from runtime_core.optimizer import optimize

    def init(n, *s):
        return nh.from_array(RNG.standard_normal(s).astype(np.float32), n)

    nodes = [h.make_node("Add", ["x", "skip"], ["s"]),
             h.make_node("LayerNormalization", ["s", "g", "b"], ["ln"], axis=-1, epsilon=1e-5),
             h.make_node("MatMul", ["ln", "w"], ["m"]),
             h.make_node("Div", ["m", "sqrt2"], ["d"]), h.make_node("Erf", ["d"], ["e"]),
             h.make_node("Add", ["e", "one"], ["e1"]), h.make_node("Mul", ["m", "e1"], ["me"]),
             h.make_node("Mul", ["me", "half"], ["gelu"]), h.make_node("Relu", ["gelu"], ["r"]),
             h.make_node("Transpose", ["r"], ["y"], perm=[1, 0, 2])]
    inits = [init("g", 8), init("b", 8), init("w", 8, 16), nh.from_array(np.array(np.sqrt(2), np.float32), "sqrt2"),
             nh.from_array(np.array(1, np.float32), "one"), nh.from_array(np.array(0.5, np.float32), "half")]
    model = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [2, 5, 8]),
                           h.make_tensor_value_info("skip", T.FLOAT, [2, 5, 8])],
                   [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    graph = Graph(model)
    optimize(graph, 99)
    assert {(n.op_type, n.domain) for n in graph.nodes} >= {("SkipLayerNormalization", "com.microsoft"),
                                                            ("Gelu", "com.microsoft")}
    written = graph.to_model()
    for vi in list(written.graph.value_info):  # as a tool that keeps no types would write it
        written.graph.value_info.remove(vi)
    again = Graph(written)
    for n in again.nodes:
        for o in n.outputs:
            v = again.value_info(o)
            assert v.dtype == np.float32 and v.static_shape is not None, (n.op_type, o)
    assert again.value_info("y").static_shape == (5, 2, 16)
    (pp,) = partition_graph(again, [ClaimAll(), _cpu()])[0]
    onnx.checker.check_model(pp.partition.to_model())
