"""Basic optimization passes: what they remove, when they must not, and equal outputs."""

import numpy as np
import onnx
import pytest
from onnx import helper

import runtime_core as rt
from oracle import make_model, run_oracle
from runtime_core.cli import sample_model_path
from runtime_core.graph import Graph
from runtime_core.optimizer import OPTIMIZERS, optimize
from runtime_core.optimizer.folding import DEFAULT_MAX_BYTES

L = rt.GraphOptimizationLevel
X = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)


def opts(level, disable=None, path=None):
    so = rt.SessionOptions()
    so.graph_optimization_level = level
    if disable:
        so.add_session_config_entry("optimization.disable_specified_optimizers", disable)
    if path:
        so.optimized_model_filepath = str(path)
    return so


def chain_model():
    nodes = [
        helper.make_node("Constant", [], ["c"], name="const", value=onnx.numpy_helper.from_array(np.float32(2.0) * np.ones(4, np.float32))),
        helper.make_node("Identity", ["x"], ["xi"], name="ident"),
        helper.make_node("Mul", ["xi", "c"], ["m"], name="mul"),
        helper.make_node("Relu", ["x"], ["dead"], name="unused"),
        helper.make_node("Identity", ["m"], ["y"], name="ident_out"),
    ]
    return make_model(nodes, {"x": X}, ["y"])


def ops(sess):
    return [n.name for n in sess.get_partition_report().nodes]


def test_disable_all_keeps_every_node():
    s = rt.InferenceSession(chain_model().SerializeToString(), opts(L.ORT_DISABLE_ALL))
    assert ops(s) == ["const", "ident", "mul", "unused", "ident_out"]
    np.testing.assert_allclose(s.run(None, {"x": X})[0], X * 2)


def test_basic_removes_constant_identity_and_dead_nodes_but_keeps_output_identity():
    s = rt.InferenceSession(chain_model().SerializeToString(), opts(L.ORT_ENABLE_BASIC))
    assert ops(s) == ["mul", "ident_out"]
    done = {k: v for k, v in s.optimizations.items() if v}
    assert done == {"ConstantToInitializer": 1, "IdentityElimination": 1, "DeadNodeElimination": 1}
    basic = {p.name for p in OPTIMIZERS if p.level == 1}
    assert set(s.optimizations) == basic  # every basic pass ran, no fusion did
    np.testing.assert_allclose(s.run(None, {"x": X})[0], X * 2)


def test_disable_specified_optimizers():
    s = rt.InferenceSession(chain_model().SerializeToString(),
                            opts(L.ORT_ENABLE_ALL, disable="IdentityElimination,DeadNodeElimination"))
    assert ops(s) == ["ident", "mul", "unused", "ident_out"]


def _ort_optimized_ops(model, level, tmp_path, **kw):
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level.name)
    so.optimized_model_filepath = str(tmp_path / "ort.onnx")
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"], **kw)
    return [n.name for n in onnx.load(str(tmp_path / "ort.onnx")).graph.node]


@pytest.mark.parametrize("names", [["EliminateIdentity"], {"EliminateIdentity", "ConstantSharing"}])
def test_disabled_optimizers_kwarg_keeps_the_nodes_onnxruntime_keeps(names, tmp_path):
    """onnxruntime's kwarg, with its rule names: the Identity it keeps, we keep; outputs unchanged."""
    m = chain_model()
    s = rt.InferenceSession(m.SerializeToString(), opts(L.ORT_ENABLE_BASIC), disabled_optimizers=names)
    ort_ops = _ort_optimized_ops(m, L.ORT_ENABLE_BASIC, tmp_path, disabled_optimizers=names)
    assert "ident" in ort_ops and "ident" in ops(s)
    assert "IdentityElimination" not in s.optimizations
    np.testing.assert_allclose(s.run(None, {"x": X})[0], X * 2)
    # and the default still removes it, in both
    assert "ident" not in _ort_optimized_ops(m, L.ORT_ENABLE_BASIC, tmp_path)
    assert "ident" not in ops(rt.InferenceSession(m.SerializeToString(), opts(L.ORT_ENABLE_BASIC)))


def test_disabled_optimizers_onnxruntime_names_of_the_transpose_fold(tmp_path):
    """onnxruntime's MatmulTransposeFusion folds a last-two-axes Transpose into FusedMatMul, as ours
    does: disabling it by its name keeps the Transpose in both runtimes."""
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Transpose", ["b"], ["bt"], perm=[0, 2, 1], name="t"),
                           helper.make_node("MatMul", ["a", "bt"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3, 4]),
                           helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 5, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    names = ["MatmulTransposeFusion"]
    assert "t" not in ops(rt.InferenceSession(m.SerializeToString(), opts(L.ORT_ENABLE_ALL)))
    assert "t" not in _ort_optimized_ops(m, L.ORT_ENABLE_ALL, tmp_path)
    assert "t" in ops(rt.InferenceSession(m.SerializeToString(), opts(L.ORT_ENABLE_ALL), disabled_optimizers=names))
    assert "t" in _ort_optimized_ops(m, L.ORT_ENABLE_ALL, tmp_path, disabled_optimizers=names)


def test_disabled_optimizers_kwarg_adds_to_the_config_entry_and_survives_a_rebuild():
    s = rt.InferenceSession(chain_model().SerializeToString(), opts(L.ORT_ENABLE_ALL, disable="DeadNodeElimination"),
                            disabled_optimizers=("IdentityElimination",))
    assert ops(s) == ["ident", "mul", "unused", "ident_out"]
    s.set_providers(["CPUExecutionProvider"])
    assert ops(s) == ["ident", "mul", "unused", "ident_out"]


@pytest.mark.parametrize("bad, match", [
    (["IdentityElimnation"], "did you mean 'IdentityElimination'"),
    (["NoSuchPass"], "unknown optimizer 'NoSuchPass'"),
    ([1], "optimizer names"),
    (5, "list or set"),
])
def test_disabled_optimizers_kwarg_refuses_what_names_no_pass(bad, match):
    """A misspelt name would leave on the pass meant to be off: refused with the names there are.
    (onnxruntime ignores unknown names; names of its passes we have no counterpart for are accepted.)"""
    with pytest.raises(rt.errors.InvalidArgumentError, match=match):
        rt.InferenceSession(chain_model().SerializeToString(), opts(L.ORT_ENABLE_ALL), disabled_optimizers=bad)
    with pytest.raises(rt.errors.InvalidArgumentError, match="unknown optimizer"):
        rt.InferenceSession(chain_model().SerializeToString(), opts(L.ORT_ENABLE_ALL, disable="Nope"))


def test_optimized_model_file_runs_in_onnxruntime(tmp_path):
    out = tmp_path / "opt.onnx"
    rt.InferenceSession(chain_model().SerializeToString(), opts(L.ORT_ENABLE_ALL, path=out))
    m = onnx.load(out)
    onnx.checker.check_model(m)
    assert [n.op_type for n in m.graph.node] == ["Mul", "Identity"]
    np.testing.assert_allclose(run_oracle(m, {"x": X})[0], X * 2)


@pytest.mark.parametrize("level", list(L))
def test_every_level_gives_the_same_outputs(level):
    img = np.random.default_rng(0).standard_normal((2, 1, 28, 28)).astype(np.float32)
    ref = rt.InferenceSession(str(sample_model_path()), opts(L.ORT_DISABLE_ALL)).run(None, {"image": img})[0]
    got = rt.InferenceSession(str(sample_model_path()), opts(level)).run(None, {"image": img})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4)


# -- the other basic passes: where each applies, where it must not ------------------------------

def run_levels(model, feeds, level=L.ORT_ENABLE_BASIC):
    """(op types left at ``level``, outputs at ``level``, outputs with everything disabled)."""
    data = model.SerializeToString()
    ref = rt.InferenceSession(data, opts(L.ORT_DISABLE_ALL)).run(None, feeds)
    s = rt.InferenceSession(data, opts(level))
    got = s.run(None, feeds)
    for a, b in zip(got, ref):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    return [n.op_type for n in s.get_partition_report().nodes], s


def graph_after(model, level=1):
    g = Graph(model)
    optimize(g, level)
    return [n.op_type for n in g.nodes], g


def test_constant_folding_runs_kernels_on_constant_chains():
    a, b, c = (np.arange(4, dtype=np.float32) + k for k in range(3))
    nodes = [helper.make_node("Add", ["a", "b"], ["ab"]), helper.make_node("Mul", ["ab", "c"], ["abc"]),
             helper.make_node("Sqrt", ["abc"], ["r"]), helper.make_node("Add", ["x", "r"], ["y"])]
    m = make_model(nodes, {"x": X}, ["y"], initializers={"a": a, "b": b, "c": c})
    left, s = run_levels(m, {"x": X})
    assert left == ["Add"] and s.optimizations["ConstantFolding"] == 3


def test_constant_folding_never_folds_random_ops_or_huge_outputs():
    big = np.array([DEFAULT_MAX_BYTES // 4 + 1], np.int64)  # float32 zeros: one element over the cap
    nodes = [helper.make_node("RandomUniformLike", ["x"], ["r"]),
             helper.make_node("ConstantOfShape", ["big"], ["z"]),
             helper.make_node("ReduceSum", ["z"], ["zs"], keepdims=0),
             helper.make_node("Add", ["r", "zs"], ["y"])]
    m = make_model(nodes, {"x": X}, ["y"], initializers={"big": big})
    left, g = graph_after(m)
    assert left == ["RandomUniformLike", "ConstantOfShape", "ReduceSum", "Add"]


def test_constant_folding_keeps_initializers_that_feeds_may_override():
    """An initializer that is also a graph input is not a constant (a feed may replace it)."""
    nodes = [helper.make_node("Neg", ["w"], ["nw"]), helper.make_node("Add", ["x", "nw"], ["y"])]
    m = make_model(nodes, {"x": X}, ["y"], initializers={"w": np.ones(4, np.float32)})
    m.graph.input.append(helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [4]))
    left, _ = graph_after(m)
    assert left == ["Neg", "Add"]


def test_shape_folding_static_and_partially_dynamic():
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["y"])]
    left, s = run_levels(make_model(nodes, {"x": X}, ["y"]), {"x": X})
    assert left == ["Reshape"] and s.optimizations["ShapeFolding"] == 1
    # symbolic batch: Shape(x)[1] (static) folds, Shape(x)[0] (the batch) does not
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
             helper.make_node("Gather", ["s", "i1"], ["k"], axis=0),
             helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]), helper.make_node("Unsqueeze", ["k", "ax"], ["k1"]),
             helper.make_node("Concat", ["k1", "n1"], ["t"], axis=0), helper.make_node("Reshape", ["x", "t"], ["y"])]
    m = make_model(nodes, {"x": X}, ["y"], initializers={"i0": np.array(0), "i1": np.array(1),
                                                         "ax": np.array([0])})
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    left, s = run_levels(m, {"x": X})
    assert left == ["Shape", "Gather", "Unsqueeze", "Concat", "Reshape"]
    np.testing.assert_array_equal(s.run(None, {"x": X[:2]})[0], X[:2].reshape(4, 2))


def test_cse_merges_identical_nodes_only():
    nodes = [helper.make_node("Relu", ["x"], ["r1"]), helper.make_node("Relu", ["x"], ["r2"]),
             helper.make_node("LeakyRelu", ["x"], ["l1"], alpha=0.1),
             helper.make_node("LeakyRelu", ["x"], ["l2"], alpha=0.2),
             helper.make_node("Add", ["r1", "r2"], ["a"]), helper.make_node("Sub", ["l1", "l2"], ["b"]),
             helper.make_node("Mul", ["a", "b"], ["y"])]
    left, s = run_levels(make_model(nodes, {"x": X}, ["y"]), {"x": X})
    assert left == ["Relu", "LeakyRelu", "LeakyRelu", "Add", "Sub", "Mul"]
    assert s.optimizations["CommonSubexpressionElimination"] == 1


def test_cast_elimination_lossless_only():
    F, D, H = onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16
    nodes = [helper.make_node("Cast", ["x"], ["same"], to=F),
             helper.make_node("Cast", ["same"], ["d"], to=D), helper.make_node("Cast", ["d"], ["back"], to=F),
             helper.make_node("Cast", ["x"], ["h"], to=H), helper.make_node("Cast", ["h"], ["lossy"], to=F),
             helper.make_node("Add", ["back", "lossy"], ["y"])]
    xs = X * 1000.123
    left, s = run_levels(make_model(nodes, {"x": xs}, ["y"]), {"x": xs})
    assert left == ["Cast", "Cast", "Add"]  # float32 -> float16 -> float32 rounds: kept
    assert s.optimizations["CastElimination"] == 2  # same-type cast; f32->f64->f32 round trip


def test_transpose_pairs_cancel_or_compose():
    x3 = np.random.default_rng(2).standard_normal((2, 3, 4)).astype(np.float32)
    nodes = [helper.make_node("Transpose", ["x"], ["t1"], perm=[1, 0, 2]),
             helper.make_node("Transpose", ["t1"], ["t2"], perm=[1, 0, 2]),   # cancels t1
             helper.make_node("Transpose", ["t2"], ["t3"], perm=[2, 0, 1]),
             helper.make_node("Transpose", ["t3"], ["y"], perm=[0, 2, 1])]    # t3+y: one transpose
    left, _ = run_levels(make_model(nodes, {"x": x3}, ["y"]), {"x": x3})
    assert left == ["Transpose"]
    # an identity transpose that is a graph output stays (its name must be produced)
    nodes = [helper.make_node("Transpose", ["x"], ["y"], perm=[0, 1, 2])]
    left, _ = run_levels(make_model(nodes, {"x": x3}, ["y"]), {"x": x3})
    assert left == ["Transpose"]


def test_reshape_chains_collapse_unless_a_dim_is_copied():
    shapes = {"s12": np.array([12], np.int64), "s26": np.array([2, 6], np.int64),
              "s0": np.array([0, -1], np.int64)}
    nodes = [helper.make_node("Reshape", ["x", "s12"], ["a"]), helper.make_node("Reshape", ["a", "s26"], ["y"])]
    left, _ = run_levels(make_model(nodes, {"x": X}, ["y"], initializers=shapes), {"x": X})
    assert left == ["Reshape"]
    # 0 copies the dim of the intermediate ([2, 6] -> 2), not of x ([3, 4] -> 3): must stay
    nodes = [helper.make_node("Reshape", ["x", "s26"], ["a"]), helper.make_node("Reshape", ["a", "s0"], ["y"])]
    left, _ = run_levels(make_model(nodes, {"x": X}, ["y"], initializers=shapes), {"x": X})
    assert left == ["Reshape", "Reshape"]


def test_dropout_elimination_unless_the_mask_is_used():
    nodes = [helper.make_node("Dropout", ["x"], ["d"]), helper.make_node("Relu", ["d"], ["y"])]
    left, _ = run_levels(make_model(nodes, {"x": X}, ["y"]), {"x": X})
    assert left == ["Relu"]
    nodes = [helper.make_node("Dropout", ["x"], ["d", "mask"]), helper.make_node("Relu", ["d"], ["y"])]
    left, _ = graph_after(make_model(nodes, {"x": X}, ["y", "mask"]))
    assert left == ["Dropout", "Relu"]
