"""The row kernels of rows.c on the kernel threads: ``skip_layer_norm`` (SkipLayerNormalization,
LayerNormalization, the RMSNorm variants) and ``gelu_erf`` (BiasGelu, Gelu, FastGelu) split their
rows over the pool; every row is computed as one thread computes it, so any thread count gives
the same bits, and the sessions that run them at two threads agree with onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt

pytestmark = pytest.mark.native

JOBS = 6  # pool_stats()'s count of jobs run on the pool


@pytest.fixture
def native():
    from runtime_provider_cpu import _native

    assert _native is not None, "runtime_provider_cpu._native did not build"
    return _native


def _rnd(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _sln(native, x, skip, g, b, bias, rows, d, skip_rows, threads, rms=False):
    y = np.empty((rows, d), np.float32)
    mean, inv, s = np.empty(rows, np.float32), np.empty(rows, np.float32), np.empty((rows, d), np.float32)
    native.skip_layer_norm(x, skip, g, b, bias, y, mean, inv, None if skip is None else s,
                           (rows, d, skip_rows), 1e-5, rms, threads)
    return y, mean, inv, (s if skip is not None else None)


# skip_rows below rows: the skip repeats every skip_rows rows, and a part's first row may fall
# inside a period (rows 1576 of skip 197 split in 4 or 8 parts; 21 of 7 in 3, 4, 8)
@pytest.mark.parametrize("rows, d, skip_rows", [(1576, 192, 197), (1576, 192, 1576), (21, 17, 7), (7, 33, 7),
                                                (3000, 64, 1), (5, 768, 5), (1, 5, 1)])
@pytest.mark.parametrize("rms", [False, True])
def test_skip_layer_norm_same_bits_at_any_thread_count(native, rows, d, skip_rows, rms):
    rng = np.random.default_rng(rows + d)
    x, skip = _rnd(rng, rows, d), _rnd(rng, skip_rows, d)
    g, b, bias = _rnd(rng, d), _rnd(rng, d), _rnd(rng, d)
    for sk, bi in ((skip, bias), (skip, None), (None, None), (None, bias)):
        beta = None if rms else b
        one = _sln(native, x, sk, g, beta, bi, rows, d, skip_rows if sk is not None else 1, 1, rms)
        s = x + (0 if sk is None else np.tile(sk, (rows // sk.shape[0], 1))) + (0 if bi is None else bi)
        mu = 0 if rms else s.astype(np.float64).mean(-1, keepdims=True)
        var = ((s - mu).astype(np.float64) ** 2).mean(-1, keepdims=True)
        want = (s - mu) / np.sqrt(var + 1e-5) * g + (0 if beta is None else beta)
        np.testing.assert_allclose(one[0], want, rtol=1e-4, atol=1e-4)
        if sk is not None:
            np.testing.assert_array_equal(one[3], s)
        for threads in (2, 3, 8):
            got = _sln(native, x, sk, g, beta, bi, rows, d, skip_rows if sk is not None else 1, threads, rms)
            for a, c in zip(one, got):
                if a is not None:
                    np.testing.assert_array_equal(a, c)


@pytest.mark.kernel
@pytest.mark.parametrize("rows, d", [(1576, 768), (128, 3072), (7, 19), (3, 5), (0, 8)])
@pytest.mark.parametrize("tanh_form", [False, True])
def test_gelu_same_bits_at_any_thread_count(native, rows, d, tanh_form):
    rng = np.random.default_rng(rows * 7 + d)
    x, b = _rnd(rng, rows, d) * 3, _rnd(rng, d)
    for bias in (b, None):
        one = np.empty((rows, d), np.float32)
        native.gelu_erf(x, bias, one, (rows, d), tanh_form, 1)
        for threads in (2, 5):
            got = np.empty((rows, d), np.float32)
            native.gelu_erf(x, bias, got, (rows, d), tanh_form, threads)
            np.testing.assert_array_equal(one, got)
        # in place, split over threads: each row is read before it is written
        y = x.copy()
        native.gelu_erf(y, bias, y, (rows, d), tanh_form, 2)
        np.testing.assert_array_equal(one, y)


@pytest.mark.kernel
def test_large_rows_go_through_the_pool(native):
    rng = np.random.default_rng(3)
    x, b = _rnd(rng, 1576, 768), _rnd(rng, 768)
    y = np.empty_like(x)
    before = native.pool_stats()[JOBS]
    native.gelu_erf(x, b, y, (1576, 768), False, 2)
    native.skip_layer_norm(x, x, b, b, None, y, None, None, None, (1576, 768, 1576), 1e-5, False, 2)
    assert native.pool_stats()[JOBS] >= before + 2
    # one thread (the old call, without the argument) stays on the caller
    before = native.pool_stats()[JOBS]
    native.gelu_erf(x, b, y, (1576, 768))
    native.skip_layer_norm(x, x, b, b, None, y, None, None, None, (1576, 768, 1576), 1e-5)
    assert native.pool_stats()[JOBS] == before


def _vit_block_model():
    """x -> LayerNorm -> MatMul + b -> Gelu (erf, as the exporters write it) -> MatMul + b, + x,
    then LayerNorm: the fusions make SkipLayerNormalization, BiasGelu and LayerNormalization."""
    rng = np.random.default_rng(11)
    d, h = 64, 256
    inits = [numpy_helper.from_array(a, n) for a, n in (
        (_rnd(rng, d), "g1"), (_rnd(rng, d), "b1"), (_rnd(rng, d, h) * 0.1, "w1"), (_rnd(rng, h), "c1"),
        (_rnd(rng, h, d) * 0.1, "w2"), (_rnd(rng, d), "c2"), (_rnd(rng, d), "g2"), (_rnd(rng, d), "b2"),
        (np.float32([1.4142135381698608]), "sq2"), (np.float32([1.0]), "one"), (np.float32([0.5]), "half"))]
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g1", "b1"], ["n1"], axis=-1, epsilon=1e-6),
        helper.make_node("MatMul", ["n1", "w1"], ["m1"]),
        helper.make_node("Add", ["m1", "c1"], ["a1"]),
        helper.make_node("Div", ["a1", "sq2"], ["dv"]),
        helper.make_node("Erf", ["dv"], ["ef"]),
        helper.make_node("Add", ["ef", "one"], ["e1"]),
        helper.make_node("Mul", ["a1", "e1"], ["ge"]),
        helper.make_node("Mul", ["ge", "half"], ["g"]),
        helper.make_node("MatMul", ["g", "w2"], ["m2"]),
        helper.make_node("Add", ["m2", "c2"], ["a2"]),
        helper.make_node("Add", ["a2", "x"], ["r"]),
        helper.make_node("LayerNormalization", ["r", "g2", "b2"], ["y"], axis=-1, epsilon=1e-6),
    ]
    graph = helper.make_graph(nodes, "vit_block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 197, d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 197, d])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_block_at_two_threads_matches_onnxruntime_and_one_thread():
    ort = pytest.importorskip("onnxruntime")
    model = _vit_block_model()
    x = _rnd(np.random.default_rng(5), 8, 197, 64)
    outs = {}
    for th in (1, 2):
        so = rt.SessionOptions()
        so.intra_op_num_threads = th
        sess = rt.InferenceSession(model, so)
        ops = {n.op_type for n in sess.get_graph_nodes()}
        assert {"BiasGelu", "SkipLayerNormalization", "LayerNormalization"} <= ops, ops
        outs[th] = sess.run(None, {"x": x})[0]
    np.testing.assert_array_equal(outs[1], outs[2])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    want = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(outs[2], want, rtol=1e-4, atol=1e-4)
