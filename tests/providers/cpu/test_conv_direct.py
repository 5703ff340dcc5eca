"""The compiled direct convolution (``_native.conv2d``): dense float32 convolutions with
several taps (or stride 2), read from the input's stride phases without an im2col matrix,
bias, residual and clip in the tile epilogue, on the session's ``intra_op_num_threads``."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import runtime_core as rt
from oracle import assert_close, make_model, run_oracle

RNG = np.random.default_rng(20261205)
pytestmark = pytest.mark.native  # the compiled kernels' own tests


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.fixture(autouse=True)
def forced(cpu_policy):
    """The kernels under test wherever they apply, not the ones measured faster here."""
    cpu_policy(conv_kernel="direct")


class Calls(list):
    """The thread counts of the direct kernel's calls; ``lanes``: each call's tiling."""

    lanes: list


@pytest.fixture
def calls(cpu_policy, spy_native):
    """Every call of the direct kernel: its thread count, recorded."""
    cpu_policy(direct=True)  # sessions take it even without AVX-512 (slower there)
    seen = Calls()
    seen.lanes = []

    def record(args):
        seen.append(args[13])  # threads
        seen.lanes.append(bool(args[14]) if len(args) > 14 else False)

    spy_native("conv2d", record)
    return seen


@pytest.fixture(params=["rows", "lanes"])
def layout(request, cpu_policy):
    """Both tilings of the direct kernel: position tiles (rows) and output channels in the
    vector lanes, whichever the shape would pick."""
    cpu_policy(wino_min_ow=1 << 30, wino_lanes_min_c=1 << 30)  # Winograd has tests of its own
    if request.param == "lanes":
        cpu_policy(lanes_max_ow=1 << 30, lanes_min_k=0)
    else:
        cpu_policy(lanes_max_ow=0)
    return request.param == "lanes"


def conv_session(x, w, b, threads=2, **attrs):
    inits = {"w": w} if b is None else {"w": w, "b": b}
    node = helper.make_node("Conv", ["x"] + list(inits), ["y"], **attrs)
    model = make_model([node], {"x": x}, ["y"], opset=11, initializers=inits)
    so = rt.SessionOptions()
    so.intra_op_num_threads = threads
    so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    return model, rt.InferenceSession(model.SerializeToString(), so, providers=["cpu"])


@pytest.mark.parametrize("ks,strides,dil,pads", [
    ((3, 3), [1, 1], [1, 1], [1, 1, 1, 1]),
    ((3, 3), [2, 2], [1, 1], [1, 1, 1, 1]),
    ((3, 3), [2, 2], [1, 1], [0, 1, 2, 0]),   # uneven padding
    ((3, 3), [1, 1], [2, 2], [2, 2, 2, 2]),   # dilation
    ((7, 7), [2, 2], [1, 1], [3, 3, 3, 3]),   # a ResNet stem
    ((1, 1), [2, 2], [1, 1], None),           # a ResNet downsample
    ((2, 3), [1, 2], [2, 1], [0, 3, 1, 2]),   # unequal everything
    ((3, 3), [1, 1], [1, 1], [4, 4, 4, 4]),   # padding wider than the kernel
    ((3, 3), [2, 1], [1, 1], None),           # no padding, row stride only
])
@pytest.mark.parametrize("shape,M,bias", [
    ((1, 64, 9, 11), 24, True),      # whole channel blocks
    ((2, 72, 5, 4), 13, False),      # a channel tail, batch 2, fewer positions than a vector
    ((1, 64, 23, 37), 8, True),      # several position tiles and a partial one
    ((1, 66, 3, 3), 3, True),        # a 3x3 image: one or a few outputs
])
def test_conv_direct_matches_onnxruntime(ks, strides, dil, pads, shape, M, bias, calls, layout, cpu_policy):
    # a strided 1x1 of one image goes to the pointwise kernel on the subsampled image
    # (test_conv_pointwise.py); the direct kernel still takes it with that kernel off
    cpu_policy(pw_lanes=False)
    x = rnd(*shape)
    w = rnd(M, shape[1], *ks) * 0.1
    b = rnd(M) if bias else None
    attrs = dict(strides=strides, dilations=dil, **({"pads": pads} if pads else {}))
    model, sess = conv_session(x, w, b, **attrs)
    ref = run_oracle(model, {"x": x})
    assert_close(sess.run(None, {"x": x}), ref, rtol=1e-4, atol=1e-5)
    assert_close(sess.run(None, {"x": x}), ref, rtol=1e-4, atol=1e-5)  # the plan's second run
    assert calls == [2, 2]  # both runs went through the direct kernel, on the session's threads
    assert calls.lanes == [layout] * 2


@pytest.mark.parametrize("shape,M,ks,strides", [
    ((1, 300, 9, 10), 20, (3, 3), [1, 1]),   # input channels in several chunks, position tiles outer
    ((1, 40, 6, 6), 600, (3, 3), [1, 1]),    # weights the larger operand: channel blocks outer, > 64 of them
    ((1, 48, 70, 60), 16, (3, 3), [1, 1]),   # > 64 position tiles in one part's group
    ((1, 200, 30, 30), 16, (3, 3), [2, 2]),  # stride 2: chunks of a four-phase stripe
])
def test_conv_direct_chunks_and_groups(shape, M, ks, strides, calls, layout):
    # the kernel sums a tile's input channels a chunk at a time (its partial sums kept between
    # chunks) and takes tiles up to 64 in a group: every split must give the whole sum
    x = rnd(*shape)
    w = rnd(M, shape[1], *ks) * 0.05
    b = rnd(M)
    model, sess = conv_session(x, w, b, pads=[1, 1, 1, 1], strides=strides)
    for threads in (1, 2):
        so = rt.SessionOptions()
        so.intra_op_num_threads = threads
        so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
        s = rt.InferenceSession(model.SerializeToString(), so, providers=["cpu"])
        assert_close(s.run(None, {"x": x}), run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-4)
    assert calls == [1, 2]
    assert calls.lanes == [layout] * 2


@pytest.mark.kernel
def test_conv_direct_reads_only_the_phases_it_fills():
    # a 1x1 stride-2 convolution fills one of the four stride phases; the work buffer the
    # thread keeps still holds a 3x3 stride-2 convolution's four phases of NaN
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast.packing import pack_direct as _pack_direct

    nan = np.full((1, 16, 20, 20), np.nan, np.float32)
    w3 = _pack_direct(rnd(8, 16, 3, 3))
    y3 = np.empty((1, 8, 10, 10), np.float32)
    _native.conv2d(nan, w3, None, None, y3, (1, 16, 20, 20), (8, 3, 3), (2, 2), (1, 1), (1, 1),
                   (10, 10), -np.inf, np.inf, 2)
    assert np.isnan(y3).all()
    x, w = rnd(1, 16, 20, 20), rnd(8, 16, 1, 1)
    y = np.empty((1, 8, 10, 10), np.float32)
    _native.conv2d(x, _pack_direct(w), None, None, y, (1, 16, 20, 20), (8, 1, 1), (2, 2), (1, 1),
                   (0, 0), (10, 10), -np.inf, np.inf, 2)
    ref = np.einsum("mc,nchw->nmhw", w[:, :, 0, 0], x[:, :, ::2, ::2])
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_conv_direct_takes_the_session_threads(calls):
    x, w = rnd(1, 16, 12, 12), rnd(32, 16, 3, 3)
    _, sess = conv_session(x, w, None, threads=3, pads=[1, 1, 1, 1])
    sess.run(None, {"x": x})
    assert calls == [3]


@pytest.mark.kernel
def test_conv_direct_same_result_on_any_thread_count():
    # each tile is computed the same way whichever thread takes it: bit-identical results
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast.packing import pack_direct as _pack_direct

    x, w, b = rnd(2, 32, 30, 30), rnd(40, 32, 3, 3), rnd(40)
    z = rnd(2, 40, 15, 15)
    wp = _pack_direct(w)
    outs = []
    for threads in (1, 2, 3, 8):
        y = np.empty((2, 40, 15, 15), np.float32)
        _native.conv2d(x, wp, b, z, y, (2, 32, 30, 30), (40, 3, 3), (2, 2), (1, 1), (1, 1), (15, 15),
                       -0.5, 0.5, threads)
        outs.append(y)
    for y in outs[1:]:
        assert np.array_equal(y, outs[0])
    assert (outs[0] == 0.5).any() and (outs[0] == -0.5).any()  # both clip bounds reached


@pytest.mark.kernel
def test_kernel_pool_bounds_each_job_by_its_threads():
    # the pool grows to the largest thread count asked for; a later job asking for fewer
    # threads (another session's intra_op_num_threads) must not run on more
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast.packing import pack_direct as _pack_direct

    x, w = rnd(1, 64, 56, 56), rnd(64, 64, 3, 3)
    wp, y = _pack_direct(w), np.empty((1, 64, 56, 56), np.float32)
    args = ((1, 64, 56, 56), (64, 3, 3), (1, 1), (1, 1), (1, 1), (56, 56), -np.inf, np.inf)
    _native.conv2d(x, wp, None, None, y, *args, 8)
    assert _native.pool_stats()[0] >= 7
    for _ in range(20):  # the workers of the 8-thread job are awake and looking for work
        _native.conv2d(x, wp, None, None, y, *args, 2)
        assert 1 <= _native.pool_stats()[1] <= 2
        _native.conv2d(x, wp, None, None, y, *args, 1)  # one thread: the pool is not used
        assert _native.pool_stats()[1] <= 2


@pytest.mark.kernel
def test_conv_direct_lanes_same_result_on_any_thread_count():
    # the lane tiling: bit-identical on 1-8 threads, with a residual, both clip bounds, a
    # channel tail (40 = 32 + 8), batch 2, rows split into segments (19 wide: 10 + 9), and
    # the same sums, in the same order, as the position tiles
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast.packing import pack_direct as _pack_direct
    from runtime_provider_cpu.fast.packing import pack_lanes as _pack_lanes

    x, w, b = rnd(2, 32, 38, 38), rnd(40, 32, 3, 3), rnd(40)
    z = rnd(2, 40, 19, 19)
    args = ((2, 32, 38, 38), (40, 3, 3), (2, 2), (1, 1), (1, 1), (19, 19), -0.5, 0.5)
    wl = _pack_lanes(w)
    assert wl.ctypes.data % 64 == 0
    outs = []
    for threads in (1, 2, 3, 8):
        y = np.empty((2, 40, 19, 19), np.float32)
        _native.conv2d(x, wl, b, z, y, *args, threads, True)
        outs.append(y)
    for y in outs[1:]:
        assert np.array_equal(y, outs[0])
    assert (outs[0] == 0.5).any() and (outs[0] == -0.5).any()
    rows = np.empty_like(outs[0])
    _native.conv2d(x, _pack_direct(w), b, z, rows, *args, 2)
    assert np.array_equal(rows, outs[0])


@pytest.mark.kernel
def test_conv_direct_lanes_refuses_unaligned_weights():
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast.packing import pack_lanes as _pack_lanes

    x = np.ones((1, 8, 6, 6), np.float32)
    wl = _pack_lanes(np.ones((4, 8, 3, 3), np.float32))
    raw = np.empty(wl.size + 16, np.float32)
    skip = (-raw.ctypes.data % 64) // 4 + 1  # 4 bytes past a 64-byte boundary
    moved = raw[skip:skip + wl.size].reshape(wl.shape)
    moved[...] = wl
    y = np.zeros((1, 4, 6, 6), np.float32)
    args = ((1, 8, 6, 6), (4, 3, 3), (1, 1), (1, 1), (1, 1), (6, 6), -np.inf, np.inf, 2, True)
    with pytest.raises(ValueError, match="64-byte aligned"):
        _native.conv2d(x, moved, None, None, y, *args)
    with pytest.raises(ValueError, match="W holds"):
        _native.conv2d(x, wl[:, :10], None, None, y, *args)
    assert not y.any()
    _native.conv2d(x, wl, None, None, y, *args)
    assert y[0, :, 1, 1].tolist() == [72.0] * 4  # an inner output: 8 channels x 9 taps of ones


def test_conv_direct_picks_lanes_for_narrow_outputs(calls):
    # ResNet's 7 x 7 stage takes the lane tiling, its 7x7-kernel stem (147 terms a sum) and
    # a 56-wide stride-2 convolution the position tiles
    cases = [((1, 64, 7, 7), (32, 64, 3, 3), [1, 1, 1, 1], True),
             ((1, 3, 64, 64), (16, 3, 7, 7), [3, 3, 3, 3], False),
             ((1, 32, 112, 112), (16, 32, 3, 3), [1, 1, 1, 1], False)]
    for xs, ws, pads, lanes in cases:
        x, w = rnd(*xs), rnd(*ws) * 0.1
        model, sess = conv_session(x, w, None, pads=pads, strides=[2, 2])
        assert_close(sess.run(None, {"x": x}), run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-5)
        assert calls.lanes[-1] is lanes


@pytest.mark.kernel
def test_conv_direct_checks_buffers():
    # a buffer that does not hold what the shapes say is a ValueError, never a read past it
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast.packing import pack_direct as _pack_direct

    x = np.zeros((1, 8, 6, 6), np.float32)
    wp = _pack_direct(np.ones((4, 8, 3, 3), np.float32))
    y = np.zeros((1, 4, 6, 6), np.float32)
    args = ((1, 8, 6, 6), (4, 3, 3), (1, 1), (1, 1), (1, 1), (6, 6), -np.inf, 1.5, 2)
    with pytest.raises(ValueError, match="X holds"):
        _native.conv2d(x[:, :4], wp, None, None, y, *args)
    with pytest.raises(ValueError, match="W holds"):
        _native.conv2d(x, wp[:, :10], None, None, y, *args)
    with pytest.raises(ValueError, match="B holds"):
        _native.conv2d(x, wp, np.zeros(3, np.float32), None, y, *args)
    with pytest.raises(ValueError, match="Z holds"):
        _native.conv2d(x, wp, None, y[:, :2], y, *args)
    with pytest.raises(ValueError, match="Y holds"):
        _native.conv2d(x, wp, None, None, y.astype(np.float64), *args)
    with pytest.raises(ValueError, match="zero size"):
        _native.conv2d(x, wp, None, None, y, (1, 8, 6, 6), (4, 3, 3), (0, 1), (1, 1), (1, 1), (6, 6),
                       -np.inf, 1.5, 2)
    assert not y.any()  # nothing was written by the refused calls
    _native.conv2d(np.ones_like(x), wp, None, None, y, *args)
    assert (y == 1.5).all()  # every sum of 32..72 ones clipped to hi


def test_conv_direct_only_where_its_fast_build_runs(cpu_policy):
    # without AVX-512 the portable build is slower than im2col + GEMM: not a candidate
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast import policy
    from runtime_provider_cpu.fast.conv import select_plan

    assert policy.DEFAULT.direct == bool(_native.CONV_FAST)
    x, w = rnd(1, 16, 8, 8), rnd(8, 16, 3, 3)
    for fast, kind in [(True, "direct"), (False, "im2col")]:
        cpu_policy(direct=fast)
        assert select_plan(x, w, None, None, 1, [1, 1], [1, 1], [1, 1], [1, 1], 2).kind == kind


ACTS = [(0, 1 / 6, 0.5), (1, 0.3, 0.4), (2, 1 / 6, 0.5), (3, 1 / 6, 0.5)]  # HardSwish, HardSigmoid, Sigmoid, SiLU


@pytest.mark.kernel
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("case", ["rows", "lanes", "planeless"])
@pytest.mark.parametrize("residual", [False, True])
def test_conv_direct_activation_in_epilogue(act, case, residual):
    # FusedConv's activation in the kernel's epilogue (conv2d's act): the same bits as the
    # convolution followed by _native.activate's pass, on every tiling: position tiles (a 112-wide
    # stride-2 stem: runs that end mid-vector), the lane tiles (a channel tail, segments of a row)
    # and the planeless path of a window far larger than its data; with and without a residual
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast.packing import pack_direct as _pack_direct
    from runtime_provider_cpu.fast.packing import pack_lanes as _pack_lanes

    if case == "rows":
        xs, (M, KH, KW), strides, dil, pads, out = (1, 3, 61, 61), (20, 3, 3), (2, 2), (1, 1), (1, 1), (31, 31)
    elif case == "lanes":
        xs, (M, KH, KW), strides, dil, pads, out = (2, 32, 19, 19), (40, 3, 3), (1, 1), (1, 1), (1, 1), (19, 19)
    else:
        xs, (M, KH, KW), strides, dil, pads, out = (1, 2, 5, 5), (3, 2, 2), (1, 1), (4000, 4000), (3998, 3998), (2, 2)
    lanes = case == "lanes"
    x, w, b = rnd(*xs), rnd(M, xs[1], KH, KW) * 0.3, rnd(M)
    wp = _pack_lanes(w) if lanes else _pack_direct(w)
    z = rnd(xs[0], M, *out) if residual else None
    args = (xs, (M, KH, KW), strides, dil, pads, out, -2.5, 3.0, 2, lanes)
    want = np.empty((xs[0], M) + out, np.float32)
    _native.conv2d(x, wp, b, z, want, *args)
    assert np.abs(want).max() > 0.5  # a convolution that computed something
    _native.activate(want, want, want.size, *act)
    for threads in (1, 2):
        got = np.full_like(want, np.nan)
        _native.conv2d(x, wp, b, z, got, *args[:-2], threads, lanes, None, act)
        assert np.array_equal(got, want), (case, act, threads)
    # kind -1: no activation, as without the argument
    plain = np.empty_like(want)
    _native.conv2d(x, wp, b, z, plain, *args, None, (-1, 1 / 6, 0.5))
    ref = np.empty_like(want)
    _native.conv2d(x, wp, b, z, ref, *args)
    assert np.array_equal(plain, ref)


@pytest.mark.kernel
def test_conv_direct_activation_checked():
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast.packing import pack_direct as _pack_direct

    x, wp = rnd(1, 4, 6, 6), _pack_direct(rnd(4, 4, 3, 3))
    y = np.zeros((1, 4, 6, 6), np.float32)
    args = ((1, 4, 6, 6), (4, 3, 3), (1, 1), (1, 1), (1, 1), (6, 6), -np.inf, np.inf, 1, False, None)
    with pytest.raises(ValueError, match="activation kind"):
        _native.conv2d(x, wp, None, None, y, *args, (4, 0.0, 0.0))
    with pytest.raises(TypeError):
        _native.conv2d(x, wp, None, None, y, *args, (0, 0.5))
    assert not y.any()


@pytest.mark.parametrize("act", ["HardSwish", "Sigmoid"])
def test_fused_conv_activation_runs_in_the_direct_kernel(act, spy_native, cpu_policy):
    # a stem and its activation (fused into FusedConv by the optimizer) take the direct kernel
    # with the activation in its epilogue: no pass of _native.activate after it
    cpu_policy(direct=True)  # a candidate by default on AVX-512 only (CONV_FAST); the portable build too
    passes = []
    spy_native("activate", passes.append)
    x, w, b = rnd(1, 3, 40, 40), rnd(16, 3, 3, 3) * 0.3, rnd(16)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node(act, ["c"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"], opset=14, initializers={"w": w, "b": b})
    so = rt.SessionOptions()
    so.intra_op_num_threads = 2
    sess = rt.InferenceSession(model.SerializeToString(), so, providers=["cpu"])
    ref = run_oracle(model, {"x": x})
    for _ in range(2):  # the plan's first run, then the bound step
        assert_close(sess.run(None, {"x": x}), ref, rtol=1e-4, atol=1e-5)
    assert set(sess.get_partition_report().kernels.values()) == {"direct"} and not passes
