"""Small MLP, CNN and attention-block models on ["opencl", "cpu"] against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import runtime_core as rt
from oracle import assert_close, make_model, run_oracle

from opencl_helpers import CPU, OCL, check_model, ocl, placement, requires_pocl, session

pytestmark = requires_pocl

rng = np.random.default_rng(7)


def w(*shape, scale=0.3):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def heavy_nodes(sess):
    return {n.name: n.provider for n in sess.get_partition_report().nodes
            if n.op_type in ("MatMul", "Gemm", "Softmax", "LayerNormalization", "Conv")}


def mlp():
    x = w(8, 16, scale=1.0)
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h1"], name="mm1"),
        helper.make_node("Add", ["h1", "b1"], ["a1"], name="add1"),
        helper.make_node("Relu", ["a1"], ["r1"], name="relu1"),
        helper.make_node("Gemm", ["r1", "W2", "b2"], ["h2"], name="gemm2", transB=1),
        helper.make_node("Tanh", ["h2"], ["t2"], name="tanh2"),
        helper.make_node("Gemm", ["t2", "W3", "b3"], ["h3"], name="gemm3"),
        helper.make_node("Softmax", ["h3"], ["y"], name="softmax", axis=-1),
    ]
    inits = {"W1": w(16, 32), "b1": w(32), "W2": w(24, 32), "b2": w(24), "W3": w(24, 10), "b3": w(10)}
    return make_model(nodes, {"x": x}, ["y"], initializers=inits), {"x": x}


def cnn():
    x = w(2, 3, 16, 16, scale=1.0)
    nodes = [
        helper.make_node("Conv", ["x", "c1w", "c1b"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "dww", "dwb"], ["c2"], name="dwconv", group=8, strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("HardSwish", ["c2"], ["r2"], name="hswish"),
        helper.make_node("Conv", ["r2", "pww"], ["c3"], name="pwconv"),
        helper.make_node("Clip", ["c3", "lo", "hi"], ["r3"], name="relu6"),
        helper.make_node("Flatten", ["r3"], ["f"], name="flatten", axis=1),
        helper.make_node("Gemm", ["f", "fcw", "fcb"], ["logits"], name="fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["y"], name="softmax", axis=1),
    ]
    inits = {"c1w": w(8, 3, 3, 3), "c1b": w(8), "dww": w(8, 1, 3, 3), "dwb": w(8), "pww": w(12, 8, 1, 1),
             "lo": np.array(0, np.float32), "hi": np.array(6, np.float32),
             "fcw": w(10, 12 * 8 * 8, scale=0.05), "fcb": w(10)}
    return make_model(nodes, {"x": x}, ["y"], initializers=inits), {"x": x}


def attention_block(b=2, t=8, d=32, heads=4):
    hd = d // heads
    x = w(b, t, d, scale=1.0)
    n = helper.make_node
    nodes = [
        n("LayerNormalization", ["x", "ln1s", "ln1b"], ["ln1"], name="ln1", axis=-1, epsilon=1e-5),
        n("MatMul", ["ln1", "Wq"], ["q0"], name="mm_q"), n("Add", ["q0", "bq"], ["q1"], name="add_q"),
        n("MatMul", ["ln1", "Wk"], ["k0"], name="mm_k"),
        n("MatMul", ["ln1", "Wv"], ["v0"], name="mm_v"),
        n("Reshape", ["q1", "heads_shape"], ["q2"], name="reshape_q"),
        n("Reshape", ["k0", "heads_shape"], ["k2"], name="reshape_k"),
        n("Reshape", ["v0", "heads_shape"], ["v2"], name="reshape_v"),
        n("Transpose", ["q2"], ["q"], name="tr_q", perm=[0, 2, 1, 3]),
        n("Transpose", ["k2"], ["kT"], name="tr_k", perm=[0, 2, 3, 1]),
        n("Transpose", ["v2"], ["v"], name="tr_v", perm=[0, 2, 1, 3]),
        n("MatMul", ["q", "kT"], ["s0"], name="mm_qk"),
        n("Mul", ["s0", "scale"], ["s1"], name="scale"),
        n("Add", ["s1", "mask"], ["s2"], name="mask"),
        n("Softmax", ["s2"], ["p"], name="softmax", axis=-1),
        n("MatMul", ["p", "v"], ["o0"], name="mm_pv"),
        n("Transpose", ["o0"], ["o1"], name="tr_o", perm=[0, 2, 1, 3]),
        n("Reshape", ["o1", "model_shape"], ["o2"], name="reshape_o"),
        n("MatMul", ["o2", "Wo"], ["o3"], name="mm_o"),
        n("Add", ["x", "o3"], ["h"], name="residual1"),
        n("LayerNormalization", ["h", "ln2s", "ln2b"], ["ln2"], name="ln2", axis=-1, epsilon=1e-5),
        n("MatMul", ["ln2", "W1"], ["f0"], name="mm_ff1"),
        # GELU written out with Erf, as exporters emit it
        n("Div", ["f0", "sqrt2"], ["g0"], name="gelu_div"), n("Erf", ["g0"], ["g1"], name="gelu_erf"),
        n("Add", ["g1", "one"], ["g2"], name="gelu_add"), n("Mul", ["f0", "g2"], ["g3"], name="gelu_mul"),
        n("Mul", ["g3", "half"], ["g4"], name="gelu_half"),
        n("MatMul", ["g4", "W2"], ["f1"], name="mm_ff2"),
        n("Add", ["h", "f1"], ["y"], name="residual2"),
    ]
    causal = np.triu(np.full((t, t), -1e9, np.float32), k=1)
    inits = {"ln1s": 1 + w(d), "ln1b": w(d), "Wq": w(d, d), "bq": w(d), "Wk": w(d, d), "Wv": w(d, d),
             "heads_shape": np.array([b, t, heads, hd], np.int64), "scale": np.array(hd ** -0.5, np.float32),
             "mask": causal, "model_shape": np.array([b, t, d], np.int64), "Wo": w(d, d),
             "ln2s": 1 + w(d), "ln2b": w(d), "W1": w(d, 4 * d), "W2": w(4 * d, d),
             "sqrt2": np.array(np.sqrt(2), np.float32), "one": np.array(1, np.float32),
             "half": np.array(0.5, np.float32)}
    return make_model(nodes, {"x": x}, ["y"], initializers=inits), {"x": x}


@pytest.mark.parametrize("build", [mlp, cnn, attention_block], ids=["mlp", "cnn", "attention"])
def test_model_runs_on_opencl_and_matches_onnxruntime(build):
    model, feeds = build()
    _, sess = check_model(model, feeds)
    assert sess.get_providers() == [OCL, CPU]
    heavy = heavy_nodes(sess)
    assert heavy and set(heavy.values()) == {OCL}
    rep = sess.get_partition_report()
    assert len(rep.partitions) == 1
    # initializers are uploaded at compile time: the only copies are the feed and the result
    copies = [(c.value, c.src, c.dst) for c in rep.copies]
    assert copies == [("x", "host", OCL), ("y", OCL, "host")]
    assert rep.copies[0].bytes == feeds["x"].nbytes
    # a second run reuses the compiled kernels and constants
    again = sess.run(None, feeds)
    assert_close(again, run_oracle(model, feeds), 1e-3, 1e-3)


def test_values_cross_to_cpu_and_back_with_copies_in_the_report():
    x = w(4, 8, scale=1.0)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Identity", ["r"], ["i"], name="ident"),
             helper.make_node("Sigmoid", ["i"], ["s"], name="sigmoid"),
             helper.make_node("Add", ["s", "r"], ["y"], name="add")]
    model = make_model(nodes, {"x": x}, ["y"], initializers={"W": w(8, 8)})
    so = rt.SessionOptions()
    so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = session(model, [ocl(exclude_ops="Identity"), "cpu"], sess_options=so)
    where = placement(sess)
    assert where == {"mm": OCL, "relu": OCL, "ident": CPU, "sigmoid": OCL, "add": OCL}
    ident = next(n for n in sess.get_partition_report().nodes if n.name == "ident")
    assert ident.declined[OCL] == "excluded by the provider option exclude_ops"
    copies = [(c.value, c.src, c.dst, c.bytes) for c in sess.get_partition_report().copies]
    assert copies == [("x", "host", OCL, 128), ("r", OCL, CPU, 128), ("i", CPU, OCL, 128),
                      ("y", OCL, "host", 128)]
    assert_close(sess.run(None, {"x": x}), run_oracle(model, {"x": x}), 1e-3, 1e-3)


def test_declined_nodes_are_reported_with_reasons():
    x = w(3, 4, scale=1.0)
    idx = np.arange(3, dtype=np.int64)
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu"),
             helper.make_node("Identity", ["idx"], ["idx_out"], name="int_identity")]
    model = make_model(nodes, {"x": x, "idx": idx}, ["y", "idx_out"])
    so = rt.SessionOptions()
    so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = session(model, sess_options=so)
    rep = {n.name: n for n in sess.get_partition_report().nodes}
    assert rep["relu"].provider == OCL and rep["int_identity"].provider == CPU
    assert "int64" in rep["int_identity"].declined[OCL] and "stay on CPU" in rep["int_identity"].declined[OCL]
    out = sess.run(None, {"x": x, "idx": idx})
    np.testing.assert_array_equal(out[1], idx)
    np.testing.assert_allclose(out[0], np.maximum(x, 0))


def test_int64_shape_computation_stays_on_cpu():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as exporters emit it (needs CPU kernels)."""
    x = w(2, 3, 4, scale=1.0)
    n = helper.make_node
    nodes = [n("Relu", ["x"], ["r"], name="relu"),
             n("Shape", ["r"], ["shp"], name="shape"),
             n("Gather", ["shp", "zero"], ["batch"], name="gather", axis=0),
             n("Unsqueeze", ["batch", "axes0"], ["batch1"], name="unsqueeze"),
             n("Concat", ["batch1", "minus1"], ["new_shape"], name="concat", axis=0),
             n("Reshape", ["r", "new_shape"], ["flat"], name="reshape"),
             n("Softmax", ["flat"], ["y"], name="softmax", axis=-1)]
    inits = {"zero": np.array(0, np.int64), "axes0": np.array([0], np.int64), "minus1": np.array([-1], np.int64)}
    model = make_model(nodes, {"x": x}, ["y"], initializers=inits)
    # with static shapes the optimizer folds the whole computation into a constant; this test is about
    # partitioning what exporters emit when it is not folded (dynamic dims elsewhere), so no optimizer
    so = rt.SessionOptions()
    so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = session(model, sess_options=so)
    where = placement(sess)
    assert where["relu"] == where["shape"] == where["reshape"] == where["softmax"] == OCL
    assert where["gather"] == where["unsqueeze"] == where["concat"] == CPU
    rep = {n.name: n for n in sess.get_partition_report().nodes}
    assert "int64" in rep["unsqueeze"].declined[OCL] and "int64" in rep["concat"].declined[OCL]
    copies = [(c.value, c.src, c.dst) for c in sess.get_partition_report().copies]
    # the shape crosses as 24 bytes; the activation never leaves the device
    assert ("shp", OCL, CPU) in copies and ("r", OCL, CPU) not in copies
    assert_close(sess.run(None, {"x": x}), run_oracle(model, {"x": x}), 1e-3, 1e-3)


def test_knn_imputer_from_skl2onnx_matches_onnxruntime():
    # skl2onnx's KNNImputer graph (model-local functions, NaN-aware distances, Gather/ScatterND on
    # NaN-holding rows), with the data of skl2onnx's own test: split between OpenCL and CPU, no NaN
    # may leak into the imputed values
    pytest.importorskip("sklearn")
    pytest.importorskip("skl2onnx")
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.impute import KNNImputer

    nan = np.nan
    x_train = np.array([[1, 2, nan, 12], [3, nan, 3, 13], [1, 4, nan, 1], [nan, 4, 3, 12]], dtype=np.float32)
    x_test = np.array([[1.3, 2.4, nan, 1], [-1.3, nan, 3.1, nan]], dtype=np.float32)
    imputer = KNNImputer(n_neighbors=3, metric="nan_euclidean").fit(x_train)
    model = convert_sklearn(imputer, "knn", [("input", FloatTensorType((None, 4)))])
    sess = session(model)
    assert OCL in placement(sess).values()
    (ours,) = sess.run(None, {"input": x_test})
    assert not np.isnan(ours).any()
    assert_close([ours], run_oracle(model, {"input": x_test}), 1e-5, 1e-5)
    np.testing.assert_allclose(ours, imputer.transform(x_test), rtol=1e-5, atol=1e-5)
