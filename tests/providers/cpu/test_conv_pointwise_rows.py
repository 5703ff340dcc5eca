"""1x1 convolutions on ``_native.pointwise_rows``: the Linear's 12 x 32 tiles over the output
positions (12-row panels split evenly over the plane), the output channels in the vector
lanes, any stride read in place, each tile transposed back into NCHW with its bias,
residual, clip and activation. Tied to onnxruntime (sessions) and to a float64 product and
``pointwise_lanes`` (the kernel itself)."""

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
def row_calls(spy_native, cpu_policy):
    """The calls of ``pointwise_rows``, forced wherever it applies (``pw_lanes``: sessions take the
    lanes kernels by default on AVX-512 only; forced, their AVX2 tiles are checked too)."""
    _native()
    cpu_policy(conv_kernel="pointwise_rows", pw_lanes=True)
    seen = []
    spy_native("pointwise_rows", lambda args: seen.append((args[5], args[6], args[-1])))  # dims, strides, N
    return seen


def _native():
    from runtime_provider_cpu.fast import policy

    if not (policy.current().linear and hasattr(policy.NATIVE, "pointwise_rows")):
        pytest.skip(f"pointwise_rows needs the Linear's AVX-512 or AVX2 tiles (LINEAR_TILES: "
                    f"{getattr(policy.NATIVE, 'LINEAR_TILES', None)})")
    return policy.NATIVE


def _reference(w, x, b, z, strides, lo, hi):
    """float64 y = clip(w x_sub + b + z) of N x C x H x W x, and the float32 rounding bound of
    its sums ((C + 2) eps * sum of |terms|, whatever the data)."""
    xs = x[:, :, ::strides[0], ::strides[1]].astype(np.float64)
    y = np.einsum("mc,nchw->nmhw", w.astype(np.float64), xs)
    mag = np.einsum("mc,nchw->nmhw", np.abs(w).astype(np.float64), np.abs(xs))
    if b is not None:
        y += b[None, :, None, None]
        mag += np.abs(b)[None, :, None, None]
    if z is not None:
        y += z
        mag += np.abs(z)
    return np.clip(y, lo, hi), (x.shape[1] + 2) * np.finfo(np.float32).eps * mag


@pytest.mark.parametrize("N,C,M,H,W,strides", [
    (1, 64, 40, 7, 7, [1, 1]),      # 49 positions: 5 panels of 10, 10, 10, 10, 9
    (1, 96, 70, 14, 14, [1, 1]),    # 196: 17 panels; 70 channels: a short last lane panel
    (1, 48, 33, 14, 14, [2, 2]),    # ResNet's downsampling shortcut, read in place
    (2, 24, 40, 15, 9, [2, 3]),     # odd plane, unequal strides, a batch
    (1, 300, 17, 5, 5, [1, 1]),     # channels past one chunk, fewer positions than a panel
    (3, 5, 3, 3, 4, [3, 1]),        # tiny
])
def test_pointwise_rows_matches_onnxruntime(N, C, M, H, W, strides, row_calls):
    x, w, b = rnd(N, C, H, W), rnd(M, C, 1, 1) * 0.2, rnd(M)
    out = [len(range(0, H, strides[0])), len(range(0, W, strides[1]))]
    r = rnd(N, M, *out)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=strides),
             helper.make_node("Add", ["c", "r"], ["s"]),
             helper.make_node("Clip", ["s", "lo", "hi"], ["y"])]
    inits = {"w": w, "b": b, "lo": np.array(0, np.float32), "hi": np.array(1.5, np.float32)}
    model = make_model(nodes, {"x": x, "r": r}, ["y"], opset=13, initializers=inits)
    so = rt.SessionOptions()
    so.intra_op_num_threads = 2
    sess = rt.InferenceSession(model.SerializeToString(), so, providers=["cpu"])
    ref = run_oracle(model, {"x": x, "r": r})
    for _ in range(2):
        out_ = sess.run(None, {"x": x, "r": r})
        assert_close(out_, ref, rtol=1e-4, atol=1e-5)
    assert row_calls == [((M, C, H, W), tuple(strides), N)] * 2  # one fused call a run: Conv + Add + Clip
    assert (out_[0] == 0).any() and (out_[0] == 1.5).any()


@pytest.mark.parametrize("act_node,attrs", [("Relu", {}), ("HardSigmoid", {"alpha": 0.2, "beta": 0.5}),
                                            ("Sigmoid", {}), ("HardSwish", {})])
def test_pointwise_rows_activation_in_the_epilogue(act_node, attrs, row_calls):
    x, w, b = rnd(1, 32, 7, 7), rnd(48, 32, 1, 1) * 0.3, rnd(48)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node(act_node, ["c"], ["y"], **attrs)]
    model = make_model(nodes, {"x": x}, ["y"], opset=14, initializers={"w": w, "b": b})
    sess = rt.InferenceSession(model.SerializeToString(), providers=["cpu"])
    assert_close(sess.run(None, {"x": x}), run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-5)
    assert len(row_calls) == 1


@pytest.mark.kernel
@pytest.mark.parametrize("M,C,H,W,s", [(40, 64, 56, 56, (1, 1)), (600, 96, 7, 7, (1, 1)), (13, 300, 6, 11, (1, 2)),
                                       (5, 3, 1, 1, (1, 1)), (64, 512, 14, 14, (2, 2)), (26, 100, 9, 13, (3, 2))])
def test_pointwise_rows_same_bits_on_any_thread_count(M, C, H, W, s):
    from runtime_provider_cpu.fast.packing import pack_linear

    nat = _native()
    OH, OW = (H - 1) // s[0] + 1, (W - 1) // s[1] + 1
    w, x, b, z = rnd(M, C), rnd(1, C, H, W), rnd(M), rnd(1, M, OH, OW)
    wp = pack_linear(w, True)
    ref, bound = _reference(w, x, b, z, s, -1.0, 1.0)
    outs = []
    for threads in (1, 2, 3, 8):
        y = np.full((1, M, OH, OW), np.nan, np.float32)
        nat.pointwise_rows(wp, x, b, z, y, (M, C, H, W), s, -1.0, 1.0, threads)
        outs.append(y)
    for y in outs[1:]:
        assert np.array_equal(y, outs[0])  # each element summed the same way by any thread
    assert (np.abs(outs[0] - ref) <= bound).all()
    y = np.full((1, M, OH, OW), np.nan, np.float32)
    nat.pointwise_rows(wp, x, None, None, y, (M, C, H, W), s, -np.inf, np.inf, 2)
    ref, bound = _reference(w, x, None, None, s, -np.inf, np.inf)
    assert (np.abs(y - ref) <= bound).all()


@pytest.mark.kernel
@pytest.mark.parametrize("act", [-1, 0, 1, 2, 3])
def test_pointwise_rows_epilogue_as_the_lanes_kernel(act):
    # the same bias, residual, clip and activation as pointwise_lanes's epilogue, on the same
    # sums (both the Linear's tiles over the same chunks of channels)
    from runtime_provider_cpu.fast.packing import pack_linear, pack_rows

    nat = _native()
    M, C, P = 70, 300, 49
    w, x, b, z = rnd(M, C) * 0.1, rnd(C, P), rnd(M), rnd(M, P)
    a = (act, 1.0 / 6.0, 0.5)
    lanes = np.empty((M, P), np.float32)
    nat.pointwise_lanes(pack_rows(w), x, b, z, lanes, (M, C, P), -2.0, 3.0, 2, *a)
    rows = np.full((M, P), np.nan, np.float32)
    nat.pointwise_rows(pack_linear(w, True), x, b, z, rows, (M, C, 7, 7), (1, 1), -2.0, 3.0, 2, *a)
    np.testing.assert_allclose(rows, lanes, rtol=1e-5, atol=1e-5)


@pytest.mark.kernel
@pytest.mark.parametrize("N,M,C,H,W,s", [(3, 40, 64, 17, 9, (1, 1)), (8, 64, 96, 7, 7, (1, 1)),
                                         (2, 13, 300, 14, 14, (2, 2)), (2, 20, 37, 9, 11, (1, 1))])
def test_pointwise_rows_batch_is_each_image(N, M, C, H, W, s):
    from runtime_provider_cpu.fast.packing import pack_linear

    nat = _native()
    OH, OW = (H - 1) // s[0] + 1, (W - 1) // s[1] + 1
    w, x, b, z = rnd(M, C), rnd(N, C, H, W), rnd(M), rnd(N, M, OH, OW)
    wp, a = pack_linear(w, True), (2, 1.0 / 6.0, 0.5)
    one = np.empty((N, M, OH, OW), np.float32)
    for n in range(N):
        nat.pointwise_rows(wp, x[n:n + 1], b, z[n:n + 1], one[n:n + 1], (M, C, H, W), s, -3.0, 3.0, 1, *a)
    for threads in (1, 2, 3):
        y = np.full((N, M, OH, OW), np.nan, np.float32)
        nat.pointwise_rows(wp, x, b, z, y, (M, C, H, W), s, -3.0, 3.0, threads, *a, N)
        assert np.array_equal(y, one)


@pytest.mark.kernel
def test_pointwise_rows_checks_its_arguments():
    from runtime_provider_cpu.fast.packing import empty64, pack_linear, pack_rows

    nat = _native()
    w, x = np.ones((4, 8), np.float32), np.ones((1, 8, 5, 2), np.float32)
    wp = pack_linear(w, True)
    y = np.zeros((1, 4, 5, 2), np.float32)
    args = ((4, 8, 5, 2), (1, 1), -np.inf, np.inf, 2)
    with pytest.raises(ValueError, match="W holds"):
        nat.pointwise_rows(pack_rows(w), x, None, None, y, *args)  # the lanes kernel's layout
    with pytest.raises(ValueError, match="X holds"):
        nat.pointwise_rows(wp, x[:, :4], None, None, y, *args)
    with pytest.raises(ValueError, match="Z holds"):
        nat.pointwise_rows(wp, x, None, y[:, :2], y, *args)
    with pytest.raises(ValueError, match="Y holds"):
        nat.pointwise_rows(wp, x, None, None, y.reshape(-1)[:20], *args)  # the output of strides (2, 1)
    with pytest.raises(ValueError, match="strides must be positive"):
        nat.pointwise_rows(wp, x, None, None, y, (4, 8, 5, 2), (0, 1), -np.inf, np.inf, 2)
    with pytest.raises(ValueError, match="activation kind"):
        nat.pointwise_rows(wp, x, None, None, y, *args, 7)
    with pytest.raises(ValueError, match="lo <= hi"):
        nat.pointwise_rows(wp, x, None, None, y, (4, 8, 5, 2), (1, 1), 1.0, 0.0, 2)
    odd = empty64((wp.size + 1,))[1:]  # 4 bytes past a 64-byte boundary
    odd[:] = wp.ravel()
    with pytest.raises(ValueError, match="64-byte aligned"):
        nat.pointwise_rows(odd, x, None, None, y, *args)
    with pytest.raises(ValueError):  # N x C x H x W past the address space: refused, nothing read
        nat.pointwise_rows(wp, x, None, None, y, *args, -1, 1.0 / 6.0, 0.5, 2 ** 62)
    assert not y.any()
    nat.pointwise_rows(wp, x, None, None, y, *args)
    assert (y == 8).all()


def test_pointwise_rows_is_a_candidate_of_the_1x1_convolutions_only(cpu_policy):
    from runtime_provider_cpu.fast import conv

    _native()
    cpu_policy(pw_lanes=True)  # the lanes kernels' switch, on by default on AVX-512 only
    x = rnd(1, 16, 7, 7)
    one = rnd(8, 16, 1, 1)
    assert "pointwise_rows" in conv.candidates(x, one, None, None, 1, [1, 1], [1, 1], [0, 0], [0, 0])
    assert "pointwise_rows" in conv.candidates(x, one, None, None, 1, [2, 2], [1, 1], [0, 0], [0, 0])
    assert "pointwise_rows" not in conv.candidates(x, one, None, None, 1, [1, 1], [1, 1], [1, 1], [1, 1])  # pads
    assert "pointwise_rows" not in conv.candidates(x, rnd(8, 16, 3, 3), None, None, 1, [1, 1], [1, 1], [1, 1],
                                                   [1, 1])
    assert "pointwise_rows" not in conv.candidates(x, rnd(8, 8, 1, 1), None, None, 2, [1, 1], [1, 1], [0, 0],
                                                   [0, 0])  # grouped
