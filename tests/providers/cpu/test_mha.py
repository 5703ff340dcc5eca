"""The compiled core of ``com.microsoft.Attention`` (``_native.mha``): a unit a head (or a
block of a head's rows) on the kernel threads, single-threaded sgemm calls, against the numpy
path it replaces and against onnxruntime."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper

import runtime_core as rt
from oracle import assert_close, make_model, run_oracle

MS = "com.microsoft"
RNG = np.random.default_rng(20261205)
pytestmark = pytest.mark.native  # the compiled kernels' own tests


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _model(B, S, D, H, names=(), extra=None, sizes=None, **attrs):
    W = 3 * D if sizes is None else sum(sizes)
    inits = {"W": rnd(D, W) * 0.3, "B": rnd(W)}
    if sizes is not None:
        attrs["qkv_hidden_sizes"] = list(sizes)
    node = helper.make_node("Attention", ["x", "W", "B", *names], ["y"], domain=MS, num_heads=H, **attrs)
    inputs = {"x": rnd(B, S, D), **(extra or {})}
    m = make_model([node], inputs, [], initializers=inits, extra_opsets={MS: 1})
    dv = D if sizes is None else sizes[2]
    m.graph.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, S, dv]))
    return m, inputs


def _run(m, inputs, threads):
    so = rt.SessionOptions()
    so.intra_op_num_threads = threads
    return rt.InferenceSession(m.SerializeToString(), so, providers=["cpu"]).run(None, inputs)[0]


CASES = [
    # (B, S, D, H, names, extra-maker, attrs)
    (1, 37, 48, 4, (), None, {}),
    (2, 9, 16, 2, (), None, {"unidirectional": 1}),
    (2, 20, 32, 1, ("m",), lambda B, S: {"m": (RNG.random((B, S)) > 0.3).astype(np.int32)}, {}),
    (3, 11, 24, 3, ("m",), lambda B, S: {"m": np.array([4, 11, 1], np.int32)}, {"unidirectional": 1}),
    (2, 8, 16, 2, ("m",), lambda B, S: {"m": (RNG.random((B, S, S)) > 0.4).astype(np.int32)}, {"scale": 0.3}),
    (2, 6, 16, 4, ("", "", "ab"), lambda B, S: {"ab": rnd(1, 4, S, S)}, {}),
    (2, 6, 16, 4, ("m", "", "ab"), lambda B, S: {"m": np.array([[1] * 6, [1, 1, 1, 0, 0, 0]], np.int32),
                                                 "ab": rnd(2, 1, 1, S)}, {"mask_filter_value": -50.0}),
    # causal over more than one block of rows: each block skips the keys past its last row
    (1, 150, 32, 2, (), None, {"unidirectional": 1}),
    (2, 130, 16, 2, ("m", "", "ab"), lambda B, S: {"m": (RNG.random((B, S)) > 0.2).astype(np.int32),
                                                   "ab": rnd(1, 2, S, S)}, {"unidirectional": 1}),
    # longer than one block of rows (at most 256; Whisper's 1500 positions): odd lengths, the last
    # block short, with a key mask and a per-head bias
    (1, 601, 32, 2, (), None, {}),
    (1, 263, 48, 3, ("m", "", "ab"), lambda B, S: {"m": (RNG.random((B, S)) > 0.2).astype(np.int32),
                                                   "ab": rnd(1, 3, S, S)}, {}),
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("threads", [1, 2, 5])
def test_mha_matches_the_numpy_path_and_onnxruntime(case, threads, spy_native, monkeypatch, cpu_policy):
    from runtime_provider_cpu.ops import fused

    B, S, D, H, names, extra, attrs = CASES[case]
    seen = []
    spy_native("mha", lambda args: seen.append(args[10]))  # threads
    cpu_policy(mha_kernel="native")  # where it applies; the numpy path below
    m, inputs = _model(B, S, D, H, names, extra(B, S) if extra else None, **attrs)
    ours = _run(m, inputs, threads)
    assert seen == [threads]
    monkeypatch.setattr(fused, "_MHA_NATIVE", False)
    numpy_ = _run(m, inputs, threads)
    assert len(seen) == 1
    np.testing.assert_allclose(ours, numpy_, rtol=1e-5, atol=1e-5)
    if "ab" not in inputs or inputs["ab"].shape[1] == H and inputs["ab"].shape[0] in (1, B):
        assert_close([ours], run_oracle(m, inputs), 1e-4, 1e-5)


TILE_CASES = [
    # (B, S, D, H, names, extra-maker, attrs): value heads of 32 or 64 (whole column panels)
    (1, 37, 64, 2, (), None, {}),
    (2, 12, 64, 1, (), None, {"unidirectional": 1}),
    (2, 29, 128, 2, ("m",), lambda B, S: {"m": (RNG.random((B, S)) > 0.3).astype(np.int32)}, {}),
    (3, 25, 96, 3, ("m",), lambda B, S: {"m": np.array([4, 25, 1], np.int32)}, {"unidirectional": 1}),
    (2, 14, 64, 2, ("m", "", "ab"), lambda B, S: {"m": (RNG.random((B, S, S)) > 0.4).astype(np.int32),
                                                  "ab": rnd(1, 2, S, S)}, {"scale": 0.3}),
    # more keys than one chunk of the value product (256 terms), the last row panel short
    (1, 601, 64, 2, (), None, {}),
    # ViT-Ti's heads: 197 keys, 12 vectors of 16 and a tail of 5 in each softmax row
    (2, 197, 192, 3, (), None, {}),
    (1, 263, 96, 3, ("m", "", "ab"), lambda B, S: {"m": (RNG.random((B, S)) > 0.2).astype(np.int32),
                                                   "ab": rnd(1, 3, S, S)}, {"unidirectional": 1}),
]


@pytest.mark.parametrize("case", range(len(TILE_CASES)))
@pytest.mark.parametrize("threads", [1, 3])
def test_mha_tiles_match_the_numpy_path_and_onnxruntime(case, threads, spy_native, monkeypatch, cpu_policy):
    """The tiles form (the Linear's 12 x 32 tiles, AVX-512 builds) against the numpy path and
    onnxruntime, and the same bits on any thread count."""
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.ops import fused

    if not getattr(_native, "CONV_FAST", 0):
        pytest.skip("the tiles form runs on AVX-512 builds only")
    B, S, D, H, names, extra, attrs = TILE_CASES[case]
    seen = []
    spy_native("mha", lambda args: seen.append(args[11:]))
    cpu_policy(mha_kernel="tiles", linear_kernel="packed")
    m, inputs = _model(B, S, D, H, names, extra(B, S) if extra else None, **attrs)
    ours = _run(m, inputs, threads)
    assert seen == [(True,)]
    assert np.array_equal(_run(m, inputs, 2), ours)
    monkeypatch.setattr(fused, "_MHA_NATIVE", False)
    numpy_ = _run(m, inputs, threads)
    assert len(seen) == 2
    # float32 sums in another order, over head widths of up to 64 (outputs up to ~10)
    np.testing.assert_allclose(ours, numpy_, rtol=1e-5, atol=1e-5 * np.abs(numpy_).max())
    assert_close([ours], run_oracle(m, inputs), 1e-4, 1e-5 * np.abs(numpy_).max())


@pytest.mark.kernel
def test_mha_tiles_against_the_sgemm_form():
    """``_native.mha(..., tiles=True)`` and the sgemm form on the same projections: the same
    attention (sums in another order); a value width the tiles do not take runs the sgemm form."""
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.ops import fused

    if not getattr(_native, "CONV_FAST", 0) or not fused._sgemm_ready():
        pytest.skip("needs the AVX-512 build and SciPy's sgemm")
    for (B, S, H, dq, dv), causal in itertools.product(
            [(2, 50, 3, 64, 64), (1, 300, 2, 40, 32), (1, 13, 2, 16, 48)], (False, True)):
        W = H * (2 * dq + dv)
        qkv = rnd(B, S, W)
        ys = []
        for tiles in (False, True):
            y = np.full((B, S, H * dv), np.nan, np.float32)
            _native.mha(qkv, (B, S, W, 0, H * dq, 2 * H * dq), (H, dq, dv), 0.2, causal, None, None, None, None,
                        y, 2, tiles)
            ys.append(y)
        np.testing.assert_allclose(ys[1], ys[0], rtol=1e-5, atol=1e-6)


def _attention(qkv, H, dq, dv, scale):
    """softmax(q k^T * scale) v per head of a (B, S, H * (2 dq + dv)) projection, in float64"""
    B, S, _ = qkv.shape
    x = qkv.astype(np.float64)
    q = x[..., :H * dq].reshape(B, S, H, dq).transpose(0, 2, 1, 3)
    k = x[..., H * dq:2 * H * dq].reshape(B, S, H, dq).transpose(0, 2, 1, 3)
    v = x[..., 2 * H * dq:].reshape(B, S, H, dv).transpose(0, 2, 1, 3)
    z = q @ k.transpose(0, 1, 3, 2) * scale
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ v).transpose(0, 2, 1, 3).reshape(B, S, H * dv)


@pytest.mark.kernel
def test_mha_tiles_pack_their_heads_in_the_work_buffer_between_calls_of_other_sizes():
    """The tiles form packs each head's k^T and v into the work buffer of the part that reads
    them (a thread's buffer, kept between calls): calls that grow and shrink it, with a Linear
    between them (the same buffer of the same thread), and calls from another thread all give
    the attention of their own inputs."""
    import threading

    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast.packing import pack_linear

    if not getattr(_native, "CONV_FAST", 0):
        pytest.skip("the tiles form runs on AVX-512 builds only")
    shapes = [(1, 40, 2, 64, 64), (2, 300, 3, 64, 32), (1, 40, 2, 64, 64), (3, 97, 1, 32, 64)]

    def calls(threads, errors):
        # its own generator: the data do not depend on which tests ran before (or on the thread)
        rng = np.random.default_rng(20261207 + threads)

        def rnd(*shape):
            return rng.standard_normal(shape).astype(np.float32)

        try:
            for B, S, H, dq, dv in shapes * 2:
                W = H * (2 * dq + dv)
                qkv = rnd(B, S, W)
                y = np.full((B, S, H * dv), np.nan, np.float32)
                _native.mha(qkv, (B, S, W, 0, H * dq, 2 * H * dq), (H, dq, dv), 0.3, False, None, None, None,
                            None, y, threads, True)
                # float32 logits of 32-64 terms (|z| up to ~10): an output's error reaches a few 1e-6
                # whatever its size (atol 2e-6 failed on 3 of 6 seeds, one element of 57600)
                np.testing.assert_allclose(y, _attention(qkv, H, dq, dv, 0.3), rtol=2e-5, atol=2e-5)
                a, w = rnd(S, 64), rnd(64, 96)
                got = np.empty((S, 96), np.float32)
                _native.linear(a, pack_linear(w, False), None, got, (S, 64, 96), threads, True)
                np.testing.assert_allclose(got, a.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    errors: list = []
    calls(2, errors)
    ts = [threading.Thread(target=calls, args=(t, errors)) for t in (1, 2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors


@pytest.mark.kernel
def test_mha_tiles_run_alone_are_split_as_for_one_thread(planned_alone):
    """A tiles job its caller runs alone (run_solo, or other processes' threads on every core) is
    split as on one thread, a whole head a part, each head packed once: the same bits as on one
    thread and on four, and the job counted as run alone for the load."""
    from runtime_provider_cpu import _native

    if not getattr(_native, "CONV_FAST", 0):
        pytest.skip("the tiles form runs on AVX-512 builds only")
    rng = np.random.default_rng(31)
    B, S, H, dq, dv = 2, 77, 3, 64, 32
    W = H * (2 * dq + dv)
    qkv = rng.standard_normal((B, S, W)).astype(np.float32)

    def mha(threads):
        y = np.full((B, S, H * dv), np.nan, np.float32)
        _native.mha(qkv, (B, S, W, 0, H * dq, 2 * H * dq), (H, dq, dv), 0.25, False, None, None, None,
                    None, y, threads, True)
        return y

    one = mha(1)
    np.testing.assert_allclose(one, _attention(qkv, H, dq, dv, 0.25), rtol=2e-5, atol=2e-5)
    planned_alone(mha, one)


def test_mha_same_bits_on_any_thread_count(cpu_policy):
    # the projection's kernel forced too: autotune may choose another one per thread count (the
    # library call's tiles then differ), and this test is about the heads' kernel
    cpu_policy(mha_kernel="native", linear_kernel="packed")
    m, inputs = _model(2, 50, 64, 2, unidirectional=1)  # 4 heads: rows split at 3+ threads
    outs = [_run(m, inputs, t) for t in (1, 2, 3, 8)]
    for y in outs[1:]:
        assert np.array_equal(y, outs[0])
    m, inputs = _model(1, 200, 32, 2, unidirectional=1)  # causal: blocks of rows on any count
    outs = [_run(m, inputs, t) for t in (1, 2, 3, 8)]
    for y in outs[1:]:
        assert np.array_equal(y, outs[0])
    m, inputs = _model(1, 530, 32, 2)  # whole heads longer than a block: blocks of the same rows on any count
    outs = [_run(m, inputs, t) for t in (1, 2, 3)]
    for y in outs[1:]:
        assert np.array_equal(y, outs[0])


def test_mha_value_heads_of_another_width(spy_native, cpu_policy):
    seen = []
    spy_native("mha", lambda args: seen.append(args[2]))
    cpu_policy(mha_kernel="native")
    m, inputs = _model(1, 10, 16, 2, sizes=(16, 16, 8))
    assert_close([_run(m, inputs, 2)], run_oracle(m, inputs), 1e-4, 1e-5)
    assert seen == [(2, 8, 4)]  # (heads, query/key width, value width)


def test_mha_refuses_a_bias_that_does_not_broadcast():
    m, inputs = _model(2, 6, 16, 2, ("", "", "ab"), {"ab": rnd(2, 3, 6, 6)})
    with pytest.raises(Exception, match="does not broadcast"):
        _run(m, inputs, 2)


@pytest.mark.kernel
def test_mha_checks_its_buffers():
    from runtime_provider_cpu import _native

    qkv, y = rnd(1, 4, 24), np.empty((1, 4, 8), np.float32)
    with pytest.raises(ValueError, match="past W"):
        _native.mha(qkv, (1, 4, 24, 0, 8, 20), (2, 4, 4), 0.5, False, None, None, None, None, y, 1)
    with pytest.raises(ValueError, match="Y"):
        _native.mha(qkv, (1, 4, 24, 0, 8, 16), (2, 4, 4), 0.5, False, None, None, None, None, y[:, :2], 1)
    with pytest.raises(ValueError, match="broadcast"):
        _native.mha(qkv, (1, 4, 24, 0, 8, 16), (2, 4, 4), 0.5, False, rnd(1, 3, 1, 4), (1, 3, 1), None, None, y, 1)
    with pytest.raises(ValueError, match="mask"):
        _native.mha(qkv, (1, 4, 24, 0, 8, 16), (2, 4, 4), 0.5, False, rnd(1, 1, 1, 3), (1, 1, 1), None, None, y, 1)
