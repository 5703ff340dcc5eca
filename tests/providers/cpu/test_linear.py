"""The compiled float32 product by a weight (``_native.linear``): MatMul and Gemm by an
initializer (packed once), by a weight fed at run time (packed a chunk at a time), and the
projection of the fused Attention; plus the compiled LayerNormalization."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from oracle import assert_close, cpu_session, make_model, run_oracle

RNG = np.random.default_rng(20261205)
pytestmark = pytest.mark.native  # the compiled kernels' own tests


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.fixture
def calls(spy_native, cpu_policy):
    seen = []
    # ((R, K, N), threads, packed)
    spy_native("linear", lambda args: seen.append((args[4], args[5], args[6] if len(args) > 6 else True)))
    cpu_policy(linear_kernel="packed")  # the compiled kernel, not the one measured faster here
    return seen


@pytest.mark.parametrize("lead,K,N", [((128,), 768, 96), ((2, 13), 300, 45), ((1, 5), 64, 1024), ((37,), 257, 33)])
def test_matmul_by_an_initializer_matches_onnxruntime(lead, K, N, calls, linear_tiles):
    a, b = rnd(*lead, K), rnd(K, N)
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": a}, ["y"], initializers={"b": b})
    sess = cpu_session(model, threads=3)
    want = run_oracle(model, {"a": a})
    for _ in range(2):  # packed on the first run, the packed copy reused on the second
        assert_close(sess.run(None, {"a": a}), want, rtol=1e-4, atol=1e-4)
    R = int(np.prod(lead))
    assert calls == [((R, K, N), 3, True)] * 2


def test_tuning_off_takes_blas(calls, cpu_policy):
    """``session.cpu.autotune`` = "0": the library call (numpy's BLAS), nothing measured."""
    import runtime_core as rt

    cpu_policy(linear_kernel="")
    a, b = rnd(40, 160), rnd(160, 48)
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": a}, ["y"], initializers={"b": b})
    so = rt.SessionOptions()
    so.add_session_config_entry("session.cpu.autotune", "0")
    sess = rt.InferenceSession(model.SerializeToString(), so, providers=["cpu"])
    assert_close(sess.run(None, {"a": a}), run_oracle(model, {"a": a}), rtol=1e-5, atol=1e-5)
    assert calls == []
    assert sess.get_partition_report().kernels == {sess.get_partition_report().nodes[0].name: "blas"}


def test_matmul_by_a_weight_fed_at_run_time(calls, cpu_policy, linear_tiles):
    """A B that is not an initializer is never kept packed: each run reads the array it gets,
    even the same object written in place between runs."""
    cpu_policy(linear_kernel="stream")
    a, b = rnd(40, 200), rnd(200, 70)
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": a, "b": b}, ["y"])
    sess = cpu_session(model)
    for _ in range(3):
        assert_close(sess.run(None, {"a": a, "b": b}), run_oracle(model, {"a": a, "b": b}), rtol=1e-4, atol=1e-4)
        b *= -2.0
    assert calls == [((40, 200, 70), 2, False)] * 3


@pytest.mark.parametrize("transB", [0, 1])
@pytest.mark.parametrize("bias_shape", [None, (70,), (1, 70), (19, 70)])
def test_gemm_by_an_initializer(transB, bias_shape, calls, linear_tiles):
    a = rnd(19, 300)
    b = rnd(70, 300) if transB else rnd(300, 70)
    inits = {"b": b}
    ins = ["a", "b"]
    if bias_shape is not None:
        inits["c"] = rnd(*bias_shape)
        ins.append("c")
    node = helper.make_node("Gemm", ins, ["y"], transB=transB, alpha=1.5, beta=0.5)
    model = make_model([node], {"a": a}, ["y"], opset=13, initializers=inits)
    assert_close(cpu_session(model).run(None, {"a": a}), run_oracle(model, {"a": a}), rtol=1e-4, atol=1e-4)
    assert calls == [((19, 300, 70), 2, True)]


def test_matmul_by_a_transposed_weight_reads_it_in_place(spy_native, cpu_policy):
    """MatMul(a, Transpose(W)) with the Transpose not folded (a tied LM head over the
    constant-folding cap): the pooled sgemm reads W [N, K] transposed, no copy of W^T a run."""
    import runtime_core as rt

    seen = []
    spy_native("sgemm", lambda args: seen.append((args[3], args[5] if len(args) > 5 else False)))
    cpu_policy(linear_kernel="blas")
    a, w = rnd(2, 37, 96), rnd(300, 96)
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]), helper.make_node("MatMul", ["a", "wt"], ["y"])]
    model = make_model(nodes, {"a": a}, ["y"], initializers={"w": w})
    so = rt.SessionOptions()
    so.add_session_config_entry("optimization.constant_folding_max_bytes", "0")
    sess = rt.InferenceSession(model.SerializeToString(), so, providers=["cpu"])
    assert "Transpose" in [n.op_type for n in sess._graph.nodes]
    for _ in range(2):
        assert_close(sess.run(None, {"a": a}), run_oracle(model, {"a": a}), rtol=1e-4, atol=1e-4)
    assert seen == [((74, 96, 300), True)] * 2
    from runtime_provider_cpu import _native

    y = np.empty((74, 300), np.float32)
    for threads in (1, 3):
        _native.sgemm(a.reshape(74, 96), w, y, (74, 96, 300), threads, True)
        np.testing.assert_allclose(y, a.reshape(74, 96) @ w.T, rtol=1e-5, atol=1e-4)


@pytest.mark.kernel
@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("R,K,N", [(1, 7, 5), (12, 256, 32), (13, 257, 33), (25, 600, 70), (130, 1000, 96)])
def test_linear_against_float64_on_any_thread_count(R, K, N, packed):
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast.packing import pack_linear as _pack_linear

    a, w, bias = rnd(R, K), rnd(K, N), rnd(N)
    wp = _pack_linear(w, False) if packed else w
    ref = a.astype(np.float64) @ w.astype(np.float64) + bias
    outs = []
    for threads in (1, 2, 3, 16):
        y = np.full((R, N), np.nan, np.float32)
        _native.linear(a, wp, bias, y, (R, K, N), threads, packed)
        outs.append(y)
    for y in outs[1:]:
        assert np.array_equal(y, outs[0])  # each element summed the same way by any thread
    # the packed weights and the chunks packed on the fly give the same sums
    y = np.empty((R, N), np.float32)
    _native.linear(a, w if packed else _pack_linear(w, False), bias, y, (R, K, N), 2, not packed)
    assert np.array_equal(y, outs[0])
    np.testing.assert_allclose(outs[0], ref, rtol=1e-5, atol=2e-4 * np.sqrt(K))


@pytest.mark.kernel
@pytest.mark.parametrize("kernel", ["linear", "pointwise_lanes", "sgemm"])
def test_jobs_run_alone_are_planned_as_for_one_thread(kernel, planned_alone):
    """A Linear (pointwise_lanes, or sgemm tiles) call its caller runs alone (run_solo, or other
    processes' threads on every core) is planned as on one thread: no job asking for several
    threads starts a part, the same bits as on one thread and on four, counted once as run alone
    for the load."""
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast.packing import pack_linear as _pack_linear
    from runtime_provider_cpu.fast.packing import pack_rows
    from runtime_provider_cpu.fast.sgemm import sgemm_ready

    if kernel == "sgemm":
        if not sgemm_ready():
            pytest.skip("no single-threaded BLAS sgemm (SciPy) here: the tiles are not the path")
        M, K, N = 384, 256, 1024  # tiles by size too: 201 MFLOP
        a, w = rnd(M, K), rnd(K, N)

        def call(threads):
            y = np.full((M, N), np.nan, np.float32)
            _native.sgemm(a, w, y, (M, K, N), threads)
            return y
    elif kernel == "linear":
        R, K, N = 200, 300, 160
        a, w, bias = rnd(R, K), rnd(K, N), rnd(N)
        wp = _pack_linear(w, False)

        def call(threads):
            y = np.full((R, N), np.nan, np.float32)
            _native.linear(a, wp, bias, y, (R, K, N), threads, True)
            return y
    else:
        M, K, P = 40, 64, 3000
        w, x, b = rnd(M, K), rnd(K, P), rnd(M)
        wp = pack_rows(w)

        def call(threads):
            y = np.full((M, P), np.nan, np.float32)
            _native.pointwise_lanes(wp, x, b, None, y, (M, K, P), -np.inf, np.inf, threads)
            return y

    planned_alone(call, call(1))


@pytest.mark.kernel
@pytest.mark.parametrize("packed", [True, False])
def test_linear_rows_in_blocks_that_fit_l2(packed):
    """Packed rows of a past 1.5 MB are taken a block at a time over every column panel (K of
    4100: 8 panels of 12 rows a block, 150 rows make 2 blocks): the same sums as one panel at a
    time, on any thread count, against float64."""
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast.packing import pack_linear as _pack_linear

    R, K, N = 150, 4100, 70
    a, w, bias = rnd(R, K), rnd(K, N), rnd(N)
    wp = _pack_linear(w, False) if packed else w
    outs = []
    for threads in (1, 2, 3):
        y = np.full((R, N), np.nan, np.float32)
        _native.linear(a, wp, bias, y, (R, K, N), threads, packed)
        outs.append(y)
    for y in outs[1:]:
        assert np.array_equal(y, outs[0])
    y12 = np.full((12, N), np.nan, np.float32)  # one whole panel alone: no blocks
    _native.linear(a[24:36], wp, bias, y12, (12, K, N), 1, packed)
    assert np.array_equal(y12, outs[0][24:36])
    ref = a.astype(np.float64) @ w.astype(np.float64) + bias
    np.testing.assert_allclose(outs[0], ref, rtol=1e-5, atol=2e-4 * np.sqrt(K))


@pytest.mark.kernel
@pytest.mark.parametrize("R,K,N", [(400, 300, 70), (397, 5, 33), (1576, 192, 64), (385, 1000, 45)])
@pytest.mark.parametrize("relu", [False, True])
def test_linear_row_panel_order_sums_as_the_column_panel_order(R, K, N, relu):
    """Many rows (16 row panels a thread or more) by packed weights that fit in L2 are taken a
    row panel at a time over every column panel, each panel packed by its part (one thread
    here); fewer rows a thread (16 threads) run the column panels' order over a's packed
    panels. Both sum K in the same chunks: the same bits, the partial row panel, the N tail,
    the bias and the clip included, against float64."""
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast.packing import pack_linear as _pack_linear

    a, w, bias = rnd(R, K), rnd(K, N), rnd(N)
    wp = _pack_linear(w, False)
    clip = (0.0, float("inf")) if relu else ()
    outs = []
    for threads in (1, 2, 16):
        y = np.full((R, N), np.nan, np.float32)
        _native.linear(a, wp, bias, y, (R, K, N), threads, True, *clip)
        outs.append(y)
    for y in outs[1:]:
        assert np.array_equal(y, outs[0])
    y = np.full((R, N), np.nan, np.float32)  # the weights packed a chunk at a time: column panels
    _native.linear(a, w, bias, y, (R, K, N), 1, False, *clip)
    assert np.array_equal(y, outs[0])
    ref = a.astype(np.float64) @ w.astype(np.float64) + bias
    np.testing.assert_allclose(outs[0], np.maximum(ref, 0) if relu else ref, rtol=1e-5, atol=2e-4 * np.sqrt(K))


@pytest.mark.kernel
@pytest.mark.parametrize("rows", range(1, 13))
def test_linear_every_tile_height_and_step_count(rows):
    """Each tile height (a panel's last rows: 1 to 12) over K of 1-3 terms past a multiple of
    4 (the unrolled steps' remainder), and over a chunk long enough for the first row panel's
    steps that prefetch the next chunk (unpacked weights) or the others' shares of it (packed),
    against float64."""
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast.packing import pack_linear as _pack_linear

    for K in (1, 2, 3, 4, 7, 261, 517):
        R, N = 24 + rows, 40  # two whole row panels, then the tile under test
        a, w = rnd(R, K), rnd(K, N)
        ref = a.astype(np.float64) @ w.astype(np.float64)
        for wp, packed in ((_pack_linear(w, False), True), (w, False)):
            y = np.full((R, N), np.nan, np.float32)
            _native.linear(a, wp, None, y, (R, K, N), 1, packed)
            np.testing.assert_allclose(y, ref, rtol=1e-5, atol=2e-4 * np.sqrt(K))


@pytest.mark.kernel
@pytest.mark.parametrize("K", [5, 16, 40, 769])
def test_whole_row_panels_sum_as_single_rows(K):
    """Whole 12-row panels of A are packed 16 terms at a time on AVX-512 CPUs (a register
    transpose), a short panel (one row) by the scalar loop: every element is the same sum
    either way, so the rows computed together and one at a time agree bit for bit."""
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast.packing import pack_linear as _pack_linear

    R, N = 26, 70  # two whole panels and a short one
    a, w, bias = rnd(R, K), rnd(K, N), rnd(N)
    wp = _pack_linear(w, False)
    y = np.full((R, N), np.nan, np.float32)
    _native.linear(a, wp, bias, y, (R, K, N), 2, True)
    for r in range(R):
        yr = np.full((1, N), np.nan, np.float32)
        _native.linear(a[r:r + 1], wp, bias, yr, (1, K, N), 1, True)
        assert np.array_equal(yr[0], y[r]), r
    ref = a.astype(np.float64) @ w.astype(np.float64) + bias
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=2e-4 * np.sqrt(K))


def test_pack_linear_layout():
    from runtime_provider_cpu.fast.packing import pack_linear as _pack_linear

    w = rnd(9, 70)  # K = 9, N = 70: two whole panels of 32 and a tail of 6
    for packed in (_pack_linear(w, False), _pack_linear(np.ascontiguousarray(w.T), True)):
        assert packed.shape == (3, 9, 32) and packed.ctypes.data % 64 == 0
        for n in range(70):
            assert np.array_equal(packed[n // 32, :, n % 32], w[:, n])
        assert not packed[2, :, 6:].any()  # zeros past N


@pytest.mark.kernel
def test_linear_checks_buffers():
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast.packing import pack_linear as _pack_linear

    a, w = rnd(4, 8), rnd(8, 40)
    wp = _pack_linear(w, False)
    y = np.empty((4, 40), np.float32)
    with pytest.raises(ValueError, match="W"):
        _native.linear(a, wp[:1], None, y, (4, 8, 40), 1)
    with pytest.raises(ValueError, match="Y"):
        _native.linear(a, wp, None, y[:2], (4, 8, 40), 1)
    raw = np.zeros(wp.size + 1, np.float32)
    off = raw[1:] if raw[1:].ctypes.data % 64 else raw[:-1]  # surely not 64-byte aligned
    off[:] = wp.ravel()
    with pytest.raises(ValueError, match="aligned"):
        _native.linear(a, off, None, y, (4, 8, 40), 1)
    with pytest.raises(ValueError, match="positive"):
        _native.linear(a, wp, None, y, (0, 8, 40), 1)
    y[:] = 7.0
    _native.linear(a, w, None, y, (4, 8, 40), 1, False)  # unpacked: any alignment
    np.testing.assert_allclose(y, a @ w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,axis", [((2, 7, 192), -1), ((3, 5, 4, 6), 2), ((130, 33), 1)])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("n_out", [1, 3])
def test_layer_norm_compiled_matches_onnxruntime(shape, axis, with_bias, n_out, spy_native):
    seen = []
    spy_native("skip_layer_norm", lambda args: seen.append(args[1]))
    x = rnd(*shape) * 3 + 1
    norm = shape[axis:]
    inits = {"s": rnd(*norm)}
    ins = ["x", "s"]
    if with_bias:
        inits["b"] = rnd(*norm)
        ins.append("b")
    outs = ["y", "mean", "inv"][:n_out]
    node = helper.make_node("LayerNormalization", ins, outs, axis=axis, epsilon=1e-3)
    model = make_model([node], {"x": x}, outs, initializers=inits)
    got = cpu_session(model).run(None, {"x": x})
    assert_close(got, run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-4)
    assert seen == [None]  # the compiled pass, without a skip
    if n_out == 3:
        assert got[1].shape == shape[:len(shape) + axis if axis < 0 else axis] + (1,) * len(norm)
