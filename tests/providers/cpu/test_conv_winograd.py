"""Winograd F(2x2, 3x3) for dense 3x3 stride-1 float32 convolutions (``_native.winograd3x3``),
both its layouts (blocks of 48 tiles by 8 channels; compact tiles by 32 channels in the lanes):
checked against onnxruntime, against a float64 reference next to the direct kernel's error,
on any thread count, with bias, residual and clip, and the plan's choice of it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import runtime_core as rt
from oracle import assert_close, make_model, record_plan_kinds, run_oracle

RNG = np.random.default_rng(20261206)
pytestmark = pytest.mark.native  # the compiled kernels' own tests


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.fixture(autouse=True)
def forced(cpu_policy):
    """The kernels under test wherever they apply, not the ones measured faster here."""
    cpu_policy(conv_kernel="winograd,direct")


def use_layout(cpu_policy, layout):
    """Winograd taken everywhere it can be (the shapes below are small), in one layout, and the
    direct kernel even without AVX-512."""
    from runtime_provider_cpu.fast import policy

    assert policy.NATIVE is not None, policy.NATIVE_ERROR
    if layout == "blocks":
        cpu_policy(direct=True, wino_min_ow=1, wino_min_c=1, wino_lanes_min_c=1 << 30)
    else:
        cpu_policy(direct=True, wino_min_ow=1 << 30, wino_lanes_ow=(1, 1 << 30), wino_lanes_min_c=1)


@pytest.fixture(params=["blocks", "lanes"])
def calls(request, monkeypatch, cpu_policy):
    """The plan kinds the Conv nodes ran with, recorded, in each layout (``use_layout``)."""
    use_layout(cpu_policy, request.param)

    def check(plan):
        if plan.kind == "winograd":
            assert bool(plan.args[-1]) == (request.param == "lanes")

    return record_plan_kinds(monkeypatch, check)


def session(model, threads=2):
    so = rt.SessionOptions()
    so.intra_op_num_threads = threads
    so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    return rt.InferenceSession(model.SerializeToString(), so, providers=["cpu"])


def reference(x, w, b, pads):
    """The convolution in float64."""
    N, C, H, W = x.shape
    pt, pl, pb, pr = pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    OH, OW = xp.shape[2] - 2, xp.shape[3] - 2
    y = np.zeros((N, w.shape[0], OH, OW))
    for kh in range(3):
        for kw in range(3):
            y += np.einsum("mc,nchw->nmhw", w[:, :, kh, kw].astype(np.float64), xp[:, :, kh:kh + OH, kw:kw + OW])
    return y if b is None else y + b[None, :, None, None]


@pytest.mark.parametrize("shape,M,pads,bias", [
    ((1, 64, 56, 56), 64, [1, 1, 1, 1], True),    # a ResNet stage: whole 48-tile blocks and a partial one
    ((1, 32, 9, 11), 24, [1, 1, 1, 1], True),     # odd height and width: a lone last row and column
    ((2, 20, 8, 7), 13, [0, 1, 2, 0], False),     # uneven pads, batch 2, a channel tail
    ((1, 8, 3, 3), 5, [0, 0, 0, 0], True),        # one 1 x 1 output
    ((1, 8, 2, 5), 8, [2, 2, 2, 2], True),        # pads wider than the image
    ((1, 40, 30, 4), 16, [1, 0, 1, 0], True),     # tall and narrow
    ((1, 48, 14, 14), 40, [1, 1, 1, 1], True),    # ResNet's 14 x 14: two lane blocks, the second short
    ((1, 16, 3, 40), 33, [1, 1, 1, 1], False),    # 20 tiles a row: two vectors a row in the lanes' input
    ((1, 136, 10, 12), 40, [1, 1, 1, 1], True),   # 136 input channels: the lanes' chunks of 128 and a tail
])
def test_winograd_matches_onnxruntime(shape, M, pads, bias, calls, cpu_policy):
    x = rnd(*shape)
    w = rnd(M, shape[1], 3, 3) * 0.1
    b = rnd(M) if bias else None
    inits = {"w": w} if b is None else {"w": w, "b": b}
    node = helper.make_node("Conv", ["x"] + list(inits), ["y"], pads=pads)
    model = make_model([node], {"x": x}, ["y"], opset=11, initializers=inits)
    sess = session(model)
    ref = run_oracle(model, {"x": x})
    assert_close(sess.run(None, {"x": x}), ref, rtol=1e-4, atol=1e-5)
    assert_close(sess.run(None, {"x": x}), ref, rtol=1e-4, atol=1e-5)
    assert calls == ["winograd"] * 2
    # no worse than the direct kernel against the float64 sums
    exact = reference(x, w, b, pads)
    err = np.abs(sess.run(None, {"x": x})[0] - exact).max()
    from runtime_provider_cpu.fast.conv import select_plan

    assert select_plan(x, w, b, None, 1, [1, 1], [1, 1], pads[:2], pads[2:], 2).kind == "winograd"
    cpu_policy(wino_min_ow=1 << 30, wino_lanes_min_c=1 << 30)
    direct = select_plan(x, w, b, None, 1, [1, 1], [1, 1], pads[:2], pads[2:], 2)
    assert direct.kind == "direct"
    err_direct = np.abs(direct.run(x) - exact).max()
    assert err <= 2 * err_direct + 1e-6


def test_winograd_fused_residual_and_clip(calls):
    # Conv + Add + Relu becomes one FusedConv: the residual and the clip in the output transform
    x, w, b = rnd(1, 32, 28, 28), rnd(32, 32, 3, 3) * 0.1, rnd(32)
    r = rnd(1, 32, 28, 28)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "r"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    model = make_model(nodes, {"x": x, "r": r}, ["y"], opset=13, initializers={"w": w, "b": b})
    sess = rt.InferenceSession(model.SerializeToString(), providers=["cpu"])
    out = sess.run(None, {"x": x, "r": r})
    assert_close(out, run_oracle(model, {"x": x, "r": r}), rtol=1e-4, atol=1e-5)
    assert calls == ["winograd"]
    assert (out[0] == 0).any() and (out[0] > 0).any()


@pytest.mark.kernel
@pytest.mark.parametrize("lanes", [False, True])
def test_winograd_same_result_on_any_thread_count(lanes):
    # each tile is computed the same way whichever thread takes it: bit-identical results,
    # with parts of whole tile blocks (1-3 threads) or of (tile block, channel block) pairs;
    # in the lanes' layout, of (channel block, segment group) units
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast.packing import pack_winograd as _pack_winograd
    from runtime_provider_cpu.fast.packing import pack_winograd_lanes as _pack_winograd_lanes

    x, w, b = rnd(2, 24, 31, 30), rnd(20, 24, 3, 3), rnd(20)
    z = rnd(2, 20, 31, 30)
    u = _pack_winograd_lanes(w) if lanes else _pack_winograd(w)
    outs = []
    for threads in (1, 2, 3, 8, 40):
        y = np.empty((2, 20, 31, 30), np.float32)
        _native.winograd3x3(x, u, b, z, y, (2, 24, 31, 30), 20, (1, 1), (31, 30), -2.0, 2.0, threads, lanes)
        outs.append(y)
    for y in outs[1:]:
        assert np.array_equal(y, outs[0])
    assert (outs[0] == 2).any() and (outs[0] == -2).any()
    exact = np.clip(reference(x, w, b, [1, 1, 1, 1]) + z, -2, 2)
    np.testing.assert_allclose(outs[0], exact, rtol=1e-4, atol=1e-4)


@pytest.mark.kernel
def test_winograd_checks_buffers():
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast.packing import pack_winograd as _pack_winograd

    x = np.ones((1, 8, 6, 6), np.float32)
    u = _pack_winograd(np.ones((4, 8, 3, 3), np.float32))
    y = np.zeros((1, 4, 6, 6), np.float32)
    args = ((1, 8, 6, 6), 4, (1, 1), (6, 6), -np.inf, np.inf, 2)
    with pytest.raises(ValueError, match="U holds"):
        _native.winograd3x3(x, u[:8], None, None, y, *args)
    with pytest.raises(ValueError, match="X holds"):
        _native.winograd3x3(x[:, :4], u, None, None, y, *args)
    with pytest.raises(ValueError, match="Z holds"):
        _native.winograd3x3(x, u, None, y[:, :2], y, *args)
    with pytest.raises(ValueError, match="zero size"):
        _native.winograd3x3(x, u, None, None, y, (1, 8, 6, 6), 0, (1, 1), (6, 6), -np.inf, np.inf, 2)
    assert not y.any()
    _native.winograd3x3(x, u, None, None, y, *args)
    assert y[0, :, 1:5, 1:5].tolist() == np.full((4, 4, 4), 72.0).tolist()  # 8 channels x 9 taps
    assert y[0, :, 0, 0].tolist() == [32.0] * 4  # a corner: 4 taps in the image
    # the lanes' layout: its own size, and whole aligned vectors
    from runtime_provider_cpu.fast.packing import pack_winograd_lanes as _pack_winograd_lanes

    ul = _pack_winograd_lanes(np.ones((4, 8, 3, 3), np.float32))
    with pytest.raises(ValueError, match="U holds"):
        _native.winograd3x3(x, u, None, None, y, *args, True)
    raw = np.empty(ul.size + 1, np.float32)
    odd = raw[1:] if raw.ctypes.data % 64 == 0 else raw[:-1]
    odd[:] = ul.ravel()
    with pytest.raises(ValueError, match="64-byte aligned"):
        _native.winograd3x3(x, odd, None, None, y, *args, True)
    y[:] = 0
    _native.winograd3x3(x, ul, None, None, y, *args, True)
    assert y[0, :, 1:5, 1:5].tolist() == np.full((4, 4, 4), 72.0).tolist()
    assert y[0, :, 0, 0].tolist() == [32.0] * 4


def test_winograd_where_it_applies(cpu_policy):
    # dense 3x3 stride-1 convolutions are Winograd candidates (measured against the direct
    # kernel and im2col); stride 2, dilation, groups or another kernel size are not; narrow
    # outputs with many channels take the lanes layout
    from runtime_provider_cpu.fast.conv import candidates

    cpu_policy(direct=True)
    p1 = [1, 1]
    # im2col on SciPy's sgemm or on the pointwise tiles: candidates beside the library's GEMM
    LIBRARY_GEMMS = {"im2col_sgemm", "im2col_lanes"}

    def names(xs, ws, strides=(1, 1), dil=(1, 1), group=1):
        return set(candidates(rnd(*xs), rnd(*ws), None, None, group, list(strides), list(dil), p1, p1, 2))

    for xs in [(1, 64, 56, 56), (1, 128, 28, 28), (1, 64, 14, 14), (1, 512, 7, 7), (1, 16, 56, 56)]:
        assert names(xs, (xs[1], xs[1], 3, 3)) - LIBRARY_GEMMS == {"im2col", "winograd", "direct"}, xs
    plan = candidates(rnd(1, 256, 14, 14), rnd(256, 256, 3, 3), None, None, 1, p1, p1, p1, p1, 2)["winograd"]()
    assert plan.kind == "winograd" and plan.args[-1]                   # 14 x 14: in the lanes
    plan = candidates(rnd(1, 64, 28, 28), rnd(64, 64, 3, 3), None, None, 1, p1, p1, p1, p1, 2)["winograd"]()
    assert not plan.args[-1]
    assert names((1, 64, 56, 56), (64, 64, 3, 3), strides=(2, 2)) - LIBRARY_GEMMS == {"im2col", "direct"}
    assert names((1, 64, 56, 56), (64, 64, 3, 3), dil=(2, 2)) - LIBRARY_GEMMS == {"im2col", "direct"}
    assert names((1, 64, 56, 56), (64, 32, 3, 3), group=2) == {"im2col"}  # grouped: im2col and GEMM
    assert names((1, 64, 56, 56), (64, 64, 5, 5)) - LIBRARY_GEMMS == {"im2col", "direct"}
    cpu_policy(direct=False)                                           # no AVX-512: neither
    assert names((1, 64, 56, 56), (64, 64, 3, 3)) - LIBRARY_GEMMS == {"im2col"}
