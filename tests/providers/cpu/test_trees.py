"""The tree-ensemble walk: the compiled walk (``_native.tree_leaves``) against the numpy walk and
onnxruntime, on random trees of every comparison mode, missing values, both threshold types,
unbalanced depths and batches that are not a multiple of the walk's 8-row groups."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import runtime_core as rt
from runtime_provider_cpu.ops.ml import forest

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the test oracle")

MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]


def _random_trees(rng, n_trees, n_feat, max_depth, modes, n_targets, p_weight=0.8):
    a = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_modes",
                         "nodes_values", "nodes_truenodeids", "nodes_falsenodeids",
                         "nodes_missing_value_tracks_true", "target_treeids", "target_nodeids",
                         "target_ids", "target_weights")}
    for t in range(n_trees):
        count = [0]

        def grow(depth):
            nid = count[0]
            count[0] += 1
            slot = len(a["nodes_treeids"])
            for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_modes", "nodes_values",
                      "nodes_truenodeids", "nodes_falsenodeids", "nodes_missing_value_tracks_true"):
                a[k].append(0)
            a["nodes_treeids"][slot], a["nodes_nodeids"][slot] = t, nid
            # unbalanced: a branch stops early a third of the time
            if depth >= max_depth or (depth > 0 and rng.random() < 0.33):
                a["nodes_modes"][slot] = "LEAF"
                for k in range(n_targets):
                    if rng.random() < p_weight:
                        a["target_treeids"].append(t)
                        a["target_nodeids"].append(nid)
                        a["target_ids"].append(k)
                        a["target_weights"].append(float(rng.normal()))
                return nid
            a["nodes_modes"][slot] = modes[int(rng.integers(len(modes)))]
            a["nodes_featureids"][slot] = int(rng.integers(n_feat))
            a["nodes_values"][slot] = float(rng.integers(-3, 4)) + (0.5 if rng.random() < 0.5 else 0.0)
            a["nodes_missing_value_tracks_true"][slot] = int(rng.random() < 0.5)
            a["nodes_truenodeids"][slot] = grow(depth + 1)
            a["nodes_falsenodeids"][slot] = grow(depth + 1)
            return nid

        grow(0)
    return a


def _model(attrs, n_feat, n_targets, x_type, agg="SUM"):
    node = helper.make_node("TreeEnsembleRegressor", ["X"], ["Y"], domain="ai.onnx.ml",
                            n_targets=n_targets, aggregate_function=agg, **attrs)
    g = helper.make_graph([node], "trees", [helper.make_tensor_value_info("X", x_type, [None, n_feat])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, n_targets])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    m.ir_version = 8
    return m.SerializeToString()


@pytest.mark.parametrize("modes", [["BRANCH_LEQ"], ["BRANCH_LT"], ["BRANCH_NEQ"], ["BRANCH_EQ"], MODES],
                         ids=["leq", "lt", "neq", "eq", "mixed"])
@pytest.mark.parametrize("x_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", [1, 7, 8, 37])
def test_compiled_walk_matches_numpy_walk_and_onnxruntime(modes, x_dtype, rows, monkeypatch):
    if forest._native is None:
        pytest.skip("the compiled extension is not built (a build without a C compiler)")
    rng = np.random.default_rng(len(modes) * 100 + rows + (7 if x_dtype == np.float64 else 0))
    n_feat, n_targets = 5, 2
    attrs = _random_trees(rng, n_trees=12, n_feat=n_feat, max_depth=9, modes=modes, n_targets=n_targets)
    x_type = TensorProto.DOUBLE if x_dtype == np.float64 else TensorProto.FLOAT
    blob = _model(attrs, n_feat, n_targets, x_type)
    # integers and halves hit the thresholds exactly (EQ / NEQ / LEQ vs LT differ there); NaNs
    # take the missing-value branch
    X = (rng.integers(-4, 5, size=(rows, n_feat)) + 0.5 * rng.integers(0, 2, size=(rows, n_feat))).astype(x_dtype)
    X[rng.random(X.shape) < 0.15] = np.nan
    walks = []
    real = forest._Forest.leaves
    monkeypatch.setattr(forest._Forest, "leaves", lambda self, X, native=True: walks.append(native) or real(self, X, native))
    got = rt.InferenceSession(blob, providers=["cpu"]).run(None, {"X": X})[0]
    monkeypatch.setattr(forest._Forest, "leaves", lambda self, X, native=True: walks.append(False) or real(self, X, False))
    numpy_walk = rt.InferenceSession(blob, providers=["cpu"]).run(None, {"X": X})[0]
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"X": X})[0]
    assert walks == [True, False]
    np.testing.assert_array_equal(got, numpy_walk)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _compiled_equals_numpy_and_onnxruntime(blob, X, monkeypatch):
    """The session's output through the compiled sums (checked taken) is the numpy path's bits and
    onnxruntime's values."""
    calls = []
    real = forest._Forest._native_sums
    monkeypatch.setattr(forest._Forest, "_native_sums", lambda self, X, threads=1: calls.append(threads) or real(self, X, threads))
    got = rt.InferenceSession(blob, providers=["cpu"]).run(None, {"X": X})[0]
    assert calls, "the dense forest did not take the compiled sums"
    monkeypatch.setattr(forest._Forest, "_native_sums", lambda self, X, threads=1: None)
    numpy_sums = rt.InferenceSession(blob, providers=["cpu"]).run(None, {"X": X})[0]
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"X": X})[0]
    np.testing.assert_array_equal(got, numpy_sums)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("modes", [["BRANCH_LEQ"], MODES], ids=["leq", "mixed"])
@pytest.mark.parametrize("x_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", [1, 37])
@pytest.mark.parametrize("agg", ["SUM", "AVERAGE"])
def test_compiled_sums_match_numpy_sums_and_onnxruntime(modes, x_dtype, rows, agg, monkeypatch):
    """Every leaf weighs every target (a random forest): one ``_native.tree_sums`` call walks and
    sums, in the numpy path's order (the same bits)."""
    if forest._native is None:
        pytest.skip("the compiled extension is not built (a build without a C compiler)")
    rng = np.random.default_rng(rows + (7 if x_dtype == np.float64 else 0) + 50 * len(modes))
    n_feat, n_targets = 5, 3
    attrs = _random_trees(rng, n_trees=12, n_feat=n_feat, max_depth=9, modes=modes, n_targets=n_targets,
                          p_weight=1.0)
    x_type = TensorProto.DOUBLE if x_dtype == np.float64 else TensorProto.FLOAT
    blob = _model(attrs, n_feat, n_targets, x_type, agg)
    X = (rng.integers(-4, 5, size=(rows, n_feat)) + 0.5 * rng.integers(0, 2, size=(rows, n_feat))).astype(x_dtype)
    X[rng.random(X.shape) < 0.15] = np.nan
    _compiled_equals_numpy_and_onnxruntime(blob, X, monkeypatch)


@pytest.mark.parametrize("n_targets", [1, 2, 4, 5])
def test_compiled_sums_every_target_count(n_targets, monkeypatch):
    """The sums' loops for 1-4 targets (a constant count each) and the general one: the numpy path's
    bits, onnxruntime's values, on full 8-row blocks and a partial one."""
    if forest._native is None:
        pytest.skip("the compiled extension is not built (a build without a C compiler)")
    rng = np.random.default_rng(90 + n_targets)
    n_feat = 5
    attrs = _random_trees(rng, n_trees=10, n_feat=n_feat, max_depth=8, modes=MODES, n_targets=n_targets,
                          p_weight=1.0)
    blob = _model(attrs, n_feat, n_targets, TensorProto.FLOAT)
    X = (rng.integers(-4, 5, size=(29, n_feat)) + 0.5 * rng.integers(0, 2, size=(29, n_feat))).astype(np.float32)
    _compiled_equals_numpy_and_onnxruntime(blob, X, monkeypatch)


def test_compiled_sums_split_rows_over_threads(monkeypatch):
    """A walk long enough for the kernel pool: rows split over 2 threads give the bits of one, and the
    split is taken or not by the measured time of each way."""
    if forest._native is None:
        pytest.skip("the compiled extension is not built (a build without a C compiler)")
    rng = np.random.default_rng(5)
    n_feat, n_targets = 6, 3
    attrs = _random_trees(rng, n_trees=40, n_feat=n_feat, max_depth=9, modes=MODES, n_targets=n_targets,
                          p_weight=1.0)
    blob = _model(attrs, n_feat, n_targets, TensorProto.FLOAT)
    X = (rng.integers(-4, 5, size=(203, n_feat)) + 0.5 * rng.integers(0, 2, size=(203, n_feat))).astype(np.float32)
    X[rng.random(X.shape) < 0.1] = np.nan
    calls, forests = _spy_tree_sums(monkeypatch)
    so = rt.SessionOptions()
    so.intra_op_num_threads = 1
    one = rt.InferenceSession(blob, so, providers=["cpu"]).run(None, {"X": X})[0]
    assert calls == [1]
    so.intra_op_num_threads = 2
    sess = rt.InferenceSession(blob, so, providers=["cpu"])
    # each way once (the caller alone first), then the one with the shorter measured time per row
    runs = [sess.run(None, {"X": X})[0] for _ in range(2)]
    assert calls[1:] == [1, 2]
    F = forests[-1]
    st = F.timing[X.shape[0].bit_length()]
    st[1:] = [1.0, 2.0]  # the pool measured slower: the caller alone, and the pool every 16th call
    del calls[:]
    runs += [sess.run(None, {"X": X})[0] for _ in range(14)]
    assert calls == [1] * 13 + [2]
    st[1:] = [2.0, 1.0]  # the pool measured faster
    del calls[:]
    runs += [sess.run(None, {"X": X})[0] for _ in range(3)]
    assert calls == [2, 2, 2]
    # one call of a way counts at most twice its mean (a preempted call does not flip the choice)
    st[1:] = [1.0, 1.2]
    before = list(st)
    runs.append(sess.run(None, {"X": X})[0])
    assert calls[-1] == 1 and st[1] < before[1]  # the caller alone, measured: its mean moved down (~0.1 us a row)
    st[1:] = [1e-12, 1.2]  # the caller alone's mean far below any real call: the call counts as 2e-12
    runs.append(sess.run(None, {"X": X})[0])
    assert calls[-1] == 1 and st[1] == pytest.approx(1e-12 + 0.25 * (2e-12 - 1e-12))
    for r in runs:
        np.testing.assert_array_equal(r, one)
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"X": X})[0]
    np.testing.assert_allclose(one, want, rtol=1e-5, atol=1e-5)


def _spy_tree_sums(monkeypatch):
    """The threads argument of every ``_native.tree_sums`` call, and the forests that made them."""
    calls, forests = [], []
    native = forest._native

    class Spy:
        def __getattr__(self, name):
            return getattr(native, name)

        def tree_sums(self, *args):
            calls.append(args[-1])
            return native.tree_sums(*args)

    real = forest._Forest._native_sums
    monkeypatch.setattr(forest, "_native", Spy())
    monkeypatch.setattr(forest._Forest, "_native_sums",
                        lambda self, X, threads=1: forests.append(self) or real(self, X, threads))
    return calls, forests


def test_compiled_sums_refuse_bad_buffers():
    if forest._native is None:
        pytest.skip("the compiled extension is not built (a build without a C compiler)")
    sums = forest._native.tree_sums
    L, n, c, k = 3, 2, 2, 2
    nodes = _node_records([1, 0, 0], [0.5, np.nan, np.nan], [2, 1, 2], [1, 0, 0])
    roots = np.array([0], np.int64)
    X = np.array([[0.0, 0.0], [0.0, 1.0]], np.float32)
    W = np.array([[0, 0], [1, 2], [3, 4]], np.float32)
    reached = np.empty((1, n), np.int64)
    out = np.full((n, k), np.nan, np.float32)
    sums(X, nodes, roots, reached, W, out, (n, c, L, 1, k), 4, 1, 0, 0, 4)
    assert out.tolist() == [[1, 2], [3, 4]]
    with pytest.raises(ValueError, match="feature id"):
        sums(X, _node_records([2, 0, 0], [0.5, np.nan, np.nan], [2, 1, 2], [1, 0, 0]), roots, reached, W, out,
             (n, c, L, 1, k), 4, 1, 0, 0, 1)
    with pytest.raises(ValueError, match="outside the 3 nodes"):
        sums(X, nodes, np.array([5], np.int64), reached, W, out, (n, c, L, 1, k), 4, 1, 0, 0, 1)
    with pytest.raises(ValueError, match="weights"):  # fewer than L x k weights
        sums(X, nodes, roots, reached, W[:2], out, (n, c, L, 1, k), 4, 1, 0, 0, 1)
    with pytest.raises(ValueError, match="sums"):
        sums(X, nodes, roots, reached, W, out[:1], (n, c, L, 1, k), 4, 1, 0, 0, 1)
    with pytest.raises(ValueError):  # read-only output
        sums(X, nodes, roots, reached, W, np.broadcast_to(out, out.shape), (n, c, L, 1, k), 4, 1, 0, 0, 1)
    with pytest.raises(ValueError, match="bad sizes"):
        sums(X, nodes, roots, reached, W, out, (n, c, L, 1, 0), 4, 1, 0, 0, 1)


def _node_records(feat, thr, nxt, branch):
    dt = np.dtype([("feat", "=i4"), ("thr", "=f4"), ("next", "=i4"), ("branch", "u1"),
                   ("nan_true", "u1"), ("bits", "u1"), ("pad", "u1")])
    nodes = np.zeros(len(feat), dt)
    nodes["feat"], nodes["thr"], nodes["next"], nodes["branch"] = feat, thr, nxt, branch
    return nodes.view(np.uint8)


def test_compiled_walk_refuses_bad_buffers():
    if forest._native is None:
        pytest.skip("the compiled extension is not built (a build without a C compiler)")
    walk = forest._native.tree_leaves
    L, n, c = 3, 2, 2
    # a root that sends feature 1 <= 0.5 to node 1 (true) and the rest to node 2; leaves map to themselves
    nodes = _node_records([1, 0, 0], [0.5, np.nan, np.nan], [2, 1, 2], [1, 0, 0])
    roots = np.array([0], np.int64)
    X = np.array([[0.0, 0.0], [0.0, 1.0]], np.float32)
    out = np.full((1, n), -1, np.int64)
    walk(X, nodes, roots, out, (n, c, L, 1), 4, 1, 0, 0)
    assert out.tolist() == [[1, 2]]
    out[:] = -1
    with pytest.raises(ValueError, match="feature id"):
        walk(X, _node_records([2, 0, 0], [0.5, np.nan, np.nan], [2, 1, 2], [1, 0, 0]), roots, out,
             (n, c, L, 1), 4, 1, 0, 0)
    with pytest.raises(ValueError, match="outside the 3 nodes"):
        walk(X, _node_records([1, 0, 0], [0.5, np.nan, np.nan], [3, 1, 2], [1, 0, 0]), roots, out,
             (n, c, L, 1), 4, 1, 0, 0)
    with pytest.raises(ValueError, match="outside the 3 nodes"):
        walk(X, nodes, np.array([5], np.int64), out, (n, c, L, 1), 4, 1, 0, 0)
    with pytest.raises(ValueError, match="bytes"):
        walk(X.astype(np.float64), nodes, roots, out, (n, c, L, 1), 4, 1, 0, 0)
    with pytest.raises(ValueError, match="bytes"):  # 16-byte records for float, 24 for double
        walk(X.astype(np.float64), nodes, roots, out, (n, c, L, 1), 8, 1, 0, 0)
    with pytest.raises(ValueError, match="bad sizes"):
        walk(X, nodes, roots, out, (n, c, L, 1), 4, 1, 9, 0)
    ro = out.copy()
    ro.flags.writeable = False
    with pytest.raises((ValueError, BufferError)):
        walk(X, nodes, roots, ro, (n, c, L, 1), 4, 1, 0, 0)
    assert (out == -1).all()
