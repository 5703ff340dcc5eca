"""The compiled few-row float32 Gemm (``_native.gemm_rows``): a classifier head at batch 1-8,
with B stored [N, K] (transB) or [K, N], on the session's threads."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import runtime_core as rt
from oracle import assert_close, make_model, run_oracle

RNG = np.random.default_rng(20261207)
pytestmark = pytest.mark.native  # the compiled kernels' own tests


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.fixture
def calls(spy_native, cpu_policy):
    seen = []
    spy_native("gemm_rows", lambda args: seen.append((args[3], args[4], args[5])))  # (R, K, N), trans, threads
    cpu_policy(linear_kernel="rows")  # where it applies (up to 8 rows; elsewhere BLAS)
    return seen


@pytest.mark.parametrize("R,K,N", [(1, 512, 1000), (3, 37, 5), (8, 16, 64), (4, 100, 130), (9, 20, 30)])
@pytest.mark.parametrize("transA,transB", [(0, 1), (0, 0), (1, 1), (1, 0)])
def test_gemm_rows_matches_onnxruntime(R, K, N, transA, transB, calls):
    a = rnd(K, R) if transA else rnd(R, K)
    b = rnd(N, K) if transB else rnd(K, N)
    c = rnd(N)
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=transA, transB=transB, alpha=0.5, beta=2.0)
    model = make_model([node], {"a": a}, ["y"], opset=13, initializers={"b": b, "c": c})
    so = rt.SessionOptions()
    so.intra_op_num_threads = 3
    sess = rt.InferenceSession(model.SerializeToString(), so, providers=["cpu"])
    assert_close(sess.run(None, {"a": a}), run_oracle(model, {"a": a}), rtol=1e-4, atol=1e-4)
    # up to 8 rows take the compiled kernel, on the session's threads; 9 go to BLAS
    assert calls == ([] if R > 8 else [((R, K, N), bool(transB), 3)])


@pytest.mark.kernel
@pytest.mark.parametrize("trans", [True, False])
def test_gemm_rows_against_float64_on_any_thread_count(trans):
    from runtime_provider_cpu import _native

    R, K, N = 5, 1283, 777  # tails in K (not a multiple of 16) and in N
    a, b = rnd(R, K), rnd(N, K) if trans else rnd(K, N)
    ref = a.astype(np.float64) @ (b.T if trans else b).astype(np.float64)
    outs = []
    for threads in (1, 2, 3, 16):
        y = np.full((R, N), np.nan, np.float32)
        _native.gemm_rows(a, b, y, (R, K, N), trans, threads)
        outs.append(y)
    for y in outs[1:]:
        assert np.array_equal(y, outs[0])  # each column computed the same way by any thread
    np.testing.assert_allclose(outs[0], ref, rtol=1e-5, atol=1e-3)


@pytest.mark.kernel
def test_gemm_rows_checks_buffers():
    from runtime_provider_cpu import _native

    a, b = np.ones((2, 8), np.float32), np.ones((3, 8), np.float32)
    y = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="B holds"):
        _native.gemm_rows(a, b[:2], y, (2, 8, 3), True, 1)
    with pytest.raises(ValueError, match="Y holds"):
        _native.gemm_rows(a, b, y.astype(np.float64), (2, 8, 3), True, 1)
    with pytest.raises(ValueError, match="zero"):
        _native.gemm_rows(a, b, y, (0, 8, 3), True, 1)
    assert not y.any()
    _native.gemm_rows(a, b, y, (2, 8, 3), True, 1)
    assert (y == 8).all()
