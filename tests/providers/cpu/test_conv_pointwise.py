"""1x1 stride-1 convolutions: ``_native.pointwise_lanes`` (the compiled Linear's
tiles, the weights packed once; a batch in one call) where the AVX-512 build runs; else ``_native.pointwise``,
blocks of the output split between the kernel threads, each one single-threaded sgemm of
SciPy's BLAS and its bias, residual and clip, that library kept at one thread; numpy's
matmul where neither is to be had."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import runtime_core as rt
from oracle import assert_close, make_model, run_oracle

RNG = np.random.default_rng(20261208)
pytestmark = pytest.mark.native  # the compiled kernels' own tests


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.fixture(autouse=True)
def forced(cpu_policy):
    """The kernels under test wherever they apply, not the ones measured faster here."""
    cpu_policy(conv_kernel="pointwise")


@pytest.fixture
def calls(spy_native, cpu_policy):
    """The calls of the sgemm kernel (``pointwise``), with the lanes kernel off."""
    from runtime_provider_cpu.fast.sgemm import sgemm_control

    assert sgemm_control() is not None  # SciPy's OpenBLAS, which threadpoolctl knows
    cpu_policy(pw_lanes=False)
    seen = []
    spy_native("pointwise", lambda args: seen.append((args[5], args[-1])))  # (M, K, P), threads
    return seen


@pytest.fixture
def lane_calls(spy_native, cpu_policy):
    """The calls of the lanes kernel (``pointwise_lanes``), forced wherever the Linear's tiles run:
    sessions take it unmeasured on AVX-512 only (``pw_lanes``), its AVX2 tiles are checked here too."""
    from runtime_provider_cpu.fast import policy

    if not policy.current().linear:
        pytest.skip(f"pointwise_lanes needs the Linear's AVX-512 or AVX2 tiles (LINEAR_TILES: "
                    f"{getattr(policy.NATIVE, 'LINEAR_TILES', None)})")
    cpu_policy(pw_lanes=True)
    seen = []
    spy_native("pointwise_lanes", lambda args: seen.append((args[5], args[-1])))  # (M, C, P), threads
    return seen


@pytest.mark.parametrize("C,M,H,W", [
    (32, 16, 112, 112),   # column blocks of the output (P = 12544)
    (960, 320, 7, 7),     # row blocks (49 columns, 320 rows)
    (3, 5, 4, 3),         # tiny: one part
    (24, 144, 17, 9),     # column tails
])
@pytest.mark.parametrize("kernel", ["pointwise", "pointwise_lanes"])
def test_pointwise_matches_onnxruntime(C, M, H, W, kernel, request):
    calls = request.getfixturevalue("calls" if kernel == "pointwise" else "lane_calls")
    x, w, b = rnd(1, C, H, W), rnd(M, C, 1, 1) * 0.1, rnd(M)
    r = rnd(1, M, H, W)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]),
             helper.make_node("Add", ["c", "r"], ["s"]),
             helper.make_node("Clip", ["s", "lo", "hi"], ["y"])]
    inits = {"w": w, "b": b, "lo": np.array(0, np.float32), "hi": np.array(1.5, np.float32)}
    model = make_model(nodes, {"x": x, "r": r}, ["y"], opset=13, initializers=inits)
    so = rt.SessionOptions()
    so.intra_op_num_threads = 2
    sess = rt.InferenceSession(model.SerializeToString(), so, providers=["cpu"])
    out = sess.run(None, {"x": x, "r": r})
    assert_close(out, run_oracle(model, {"x": x, "r": r}), rtol=1e-4, atol=1e-5)
    assert calls == [((M, C, H * W), 2)]  # one fused call: Conv + Add + Clip
    assert (out[0] == 0).any() and (out[0] == 1.5).any()


def test_pointwise_keeps_its_blas_at_one_thread(calls):
    # a session of another intra_op_num_threads sets every BLAS library to its count: the next
    # run sets this one back to one thread (our threads each call it)
    from runtime_provider_cpu.fast.sgemm import sgemm_control

    ctl = sgemm_control()
    x, w = rnd(1, 16, 20, 20), rnd(8, 16, 1, 1)
    node = helper.make_node("Conv", ["x", "w"], ["y"])
    model = make_model([node], {"x": x}, ["y"], opset=13, initializers={"w": w})
    sess = rt.InferenceSession(model.SerializeToString(), providers=["cpu"])
    ctl.set_num_threads(2)
    assert_close(sess.run(None, {"x": x}), run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-5)
    assert ctl.get_num_threads() == 1
    assert len(calls) == 1


@pytest.mark.kernel
def test_pointwise_on_any_thread_count():
    # the blocks follow the thread count, and BLAS sums a block of another size in another
    # order: the same bits for the same count, within rounding across counts (as with BLAS's
    # own threads)
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast.sgemm import sgemm_control

    assert sgemm_control() is not None
    for M, K, P in [(40, 64, 3000), (600, 96, 49)]:  # column blocks, row blocks
        w, x, b, z = rnd(M, K), rnd(K, P), rnd(M), rnd(M, P)
        ref = np.clip(w.astype(np.float64) @ x + b[:, None] + z, -1, 1)
        for threads in (1, 2, 3, 8):
            ys = []
            for _ in range(2):
                y = np.full((M, P), np.nan, np.float32)
                _native.pointwise(w, x, b, z, y, (M, K, P), -1.0, 1.0, threads)
                ys.append(y)
            assert np.array_equal(ys[0], ys[1])
            np.testing.assert_allclose(ys[0], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,strides", [((1, 64, 56, 56), [2, 2]), ((1, 24, 15, 9), [2, 3]),
                                            ((1, 8, 5, 5), [4, 4])])
def test_strided_pointwise_on_the_subsampled_image(shape, strides, lane_calls):
    """ResNet's downsampling shortcut (1x1, stride 2, one image, Z and Relu fused)."""
    x, w, b = rnd(*shape), rnd(40, shape[1], 1, 1) * 0.2, rnd(40)
    out = [len(range(0, shape[2], strides[0])), len(range(0, shape[3], strides[1]))]
    r = rnd(1, 40, *out)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=strides),
             helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    model = make_model(nodes, {"x": x, "r": r}, ["y"], opset=13, initializers={"w": w, "b": b})
    sess = rt.InferenceSession(model.SerializeToString(), providers=["cpu"])
    for _ in range(2):
        assert_close(sess.run(None, {"x": x, "r": r}), run_oracle(model, {"x": x, "r": r}), rtol=1e-4, atol=1e-5)
    assert [c[0] for c in lane_calls] == [(40, shape[1], out[0] * out[1])] * 2


@pytest.mark.kernel
@pytest.mark.parametrize("M,K,P", [(40, 64, 3000), (600, 96, 49), (13, 300, 33), (5, 3, 7),
                                   (20, 16, 5000), (26, 100, 4001),  # groups of panels, tails
                                   (24, 300, 1000), (16, 520, 3136),  # x read in place, chunks
                                   (40, 64, 200)])  # packed at one thread, in place at 2 and 3
def test_pointwise_lanes_same_bits_on_any_thread_count(M, K, P):
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast.packing import pack_rows

    w, x, b, z = rnd(M, K), rnd(K, P), rnd(M), rnd(M, P)
    wp = pack_rows(w)
    assert wp.shape == (-(-M // 12), K, 12)
    for m in range(M):
        assert np.array_equal(wp[m // 12, :, m % 12], w[m])
    assert not wp[-1, :, M - 12 * (wp.shape[0] - 1):].any()  # zeros past M
    ref = np.clip(w.astype(np.float64) @ x + b[:, None] + z, -1, 1)
    outs = []
    for threads in (1, 2, 3, 8):
        y = np.full((M, P), np.nan, np.float32)
        _native.pointwise_lanes(wp, x, b, z, y, (M, K, P), -1.0, 1.0, threads)
        outs.append(y)
    for y in outs[1:]:
        assert np.array_equal(y, outs[0])  # each element summed the same way by any thread
    # float32 sums of K products: the rounding bound (K + 2) eps * sum |terms|, whatever the data
    # (a fixed rtol/atol failed at K = 300 for data a different test order drew)
    bound = (K + 2) * np.finfo(np.float32).eps * (np.abs(w).astype(np.float64) @ np.abs(x) + np.abs(b)[:, None]
                                                   + np.abs(z))
    assert (np.abs(outs[0] - ref) <= bound).all()
    y = np.empty((M, P), np.float32)
    _native.pointwise_lanes(wp, x, None, None, y, (M, K, P), -np.inf, np.inf, 2)
    assert (np.abs(y - w.astype(np.float64) @ x) <= bound).all()


@pytest.mark.kernel
@pytest.mark.parametrize("N,M,K,P,act", [(3, 40, 64, 300, -1), (8, 600, 96, 49, 2), (2, 13, 300, 33, 0),
                                         (5, 5, 3, 7, 3), (8, 672, 112, 196, 2)])
def test_pointwise_lanes_batch_is_each_image(N, M, K, P, act):
    # a batch in one call (the images' tiles split between the threads together): each image's
    # result the bits of its own call, on any thread count
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast import policy
    from runtime_provider_cpu.fast.packing import pack_rows

    if not policy.current().linear:
        pytest.skip("the lanes kernel needs the AVX-512 build (CONV_FAST)")
    w, x, b, z = rnd(M, K), rnd(N, K, P), rnd(M), rnd(N, M, P)
    wp, a = pack_rows(w), (act, 1.0 / 6.0, 0.5)
    one = np.empty((N, M, P), np.float32)
    for n in range(N):
        _native.pointwise_lanes(wp, x[n], b, z[n], one[n], (M, K, P), -3.0, 3.0, 1, *a)
    for threads in (1, 2, 3):
        y = np.full((N, M, P), np.nan, np.float32)
        _native.pointwise_lanes(wp, x, b, z, y, (M, K, P), -3.0, 3.0, threads, *a, N)
        assert np.array_equal(y, one)
    with pytest.raises(ValueError, match="X holds"):
        _native.pointwise_lanes(wp, x[:-1], b, z, y, (M, K, P), -3.0, 3.0, 2, *a, N)
    with pytest.raises(ValueError, match="Y holds"):
        _native.pointwise_lanes(wp, x, b, None, y[:-1], (M, K, P), -3.0, 3.0, 2, *a, N)
    with pytest.raises(ValueError, match="sizes"):
        _native.pointwise_lanes(wp, x, b, None, y, (M, K, P), -3.0, 3.0, 2, *a, 0)
    with pytest.raises(ValueError):  # N x C x P past the address space: refused, nothing read
        _native.pointwise_lanes(wp, x, b, None, y, (M, K, P), -3.0, 3.0, 2, *a, 2 ** 62)


@pytest.mark.parametrize("kernel", ["pointwise", "pointwise_lanes"])
def test_pointwise_checks_buffers(kernel):
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast import policy
    from runtime_provider_cpu.fast.packing import pack_rows
    from runtime_provider_cpu.fast.sgemm import sgemm_control

    lanes = kernel == "pointwise_lanes"
    if lanes and not policy.current().linear:
        pytest.skip("the lanes kernel needs the AVX-512 build (CONV_FAST)")
    if not lanes:
        assert sgemm_control() is not None
    fn = getattr(_native, kernel)
    w, x = np.ones((4, 8), np.float32), np.ones((8, 10), np.float32)
    wp = pack_rows(w)  # 12-row panels: 96 floats where the sgemm kernel reads 32
    mine, other = (wp, w) if lanes else (w, wp)
    y = np.zeros((4, 10), np.float32)
    args = ((4, 8, 10), -np.inf, np.inf, 2)
    with pytest.raises(ValueError, match="W holds"):
        fn(other, x, None, None, y, *args)  # the other kernel's weight layout
    with pytest.raises(ValueError, match="X holds"):
        fn(mine, x[:4], None, None, y, *args)
    with pytest.raises(ValueError, match="Z holds"):
        fn(mine, x, None, y[:2], y, *args)
    with pytest.raises(ValueError, match="sizes"):
        fn(mine, x, None, None, y, (4, 0, 10), -np.inf, np.inf, 2)
    assert not y.any()
    fn(mine, x, None, None, y, *args)
    assert (y == 8).all()


def test_pointwise_without_scipy_blas_uses_matmul(cpu_policy, calls):
    # where SciPy's BLAS is not to be had (or not known to threadpoolctl) numpy's matmul does it
    cpu_policy(sgemm=False)
    x, w, b = rnd(1, 16, 9, 9), rnd(8, 16, 1, 1), rnd(8)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"])
    model = make_model([node], {"x": x}, ["y"], opset=13, initializers={"w": w, "b": b})
    sess = rt.InferenceSession(model.SerializeToString(), providers=["cpu"])
    assert_close(sess.run(None, {"x": x}), run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-5)
    assert calls == []


# a strided 1x1 is a pointwise plan on the lanes kernel only
@pytest.mark.parametrize("path,strides", [("lanes", [1, 1]), ("lanes", [2, 2]), ("sgemm", [1, 1]),
                                          ("matmul", [1, 1])])
def test_pointwise_batch_on_the_nchw_tensor(path, strides, cpu_policy, spy_native):
    # a batch (MobileNetV3 at b8) runs on the NCHW tensor as it is, with the residual and clip
    # of each image: the lanes kernel (stride 1) in one call of all the images, the others an
    # image a call; every run after the first on the bound plan
    from runtime_provider_cpu.fast import policy

    if path == "lanes" and not policy.current().linear:
        pytest.skip("the lanes kernel needs the AVX-512 build (CONV_FAST)")
    cpu_policy(pw_lanes=path == "lanes", sgemm=path != "matmul")
    seen = []
    spy_native("pointwise_lanes" if path == "lanes" else "pointwise",
               lambda args: seen.append((args[5], args[-1] if len(args) > 12 else 1)))
    x, w, b = rnd(3, 24, 13, 11), rnd(40, 24, 1, 1) * 0.2, rnd(40)
    out = [len(range(0, 13, strides[0])), len(range(0, 11, strides[1]))]
    r = rnd(3, 40, *out)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=strides),
             helper.make_node("Add", ["c", "r"], ["s"]),
             helper.make_node("Clip", ["s", "lo", "hi"], ["y"])]
    inits = {"w": w, "b": b, "lo": np.array(-0.5, np.float32), "hi": np.array(1.0, np.float32)}
    model = make_model(nodes, {"x": x, "r": r}, ["y"], opset=13, initializers=inits)
    sess = rt.InferenceSession(model.SerializeToString(), providers=["cpu"])
    ref = run_oracle(model, {"x": x, "r": r})
    for _ in range(3):
        assert_close(sess.run(None, {"x": x, "r": r}), ref, rtol=1e-4, atol=1e-5)
    if path == "lanes" and strides == [1, 1]:
        assert seen == [((40, 24, out[0] * out[1]), 3)] * 3  # 3 runs, the 3 images in each
    elif path != "matmul":
        assert seen == [((40, 24, out[0] * out[1]), 1)] * 9  # 3 images x 3 runs
    else:
        assert seen == []


@pytest.mark.parametrize("C,M,H,W,k,s,p", [
    (3, 24, 32, 32, 4, 4, 0),    # ConvNeXt's stem (patches: im2col is one transpose)
    (16, 32, 14, 14, 2, 2, 0),   # its downsampling
    (3, 16, 23, 21, 3, 2, 1),    # MobileNet's stem (padded, overlapping)
])
def test_im2col_on_the_pointwise_tiles(C, M, H, W, k, s, p, cpu_policy, lane_calls):
    # im2col for one image and the lanes kernel's packed tiles, residual and clip in its epilogue
    cpu_policy(conv_kernel="im2col_lanes")
    x, w, b = rnd(1, C, H, W), rnd(M, C, k, k) * 0.2, rnd(M)
    oh, ow = (H + 2 * p - k) // s + 1, (W + 2 * p - k) // s + 1
    r = rnd(1, M, oh, ow)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4),
             helper.make_node("Add", ["c", "r"], ["t"]), helper.make_node("Relu", ["t"], ["y"])]
    model = make_model(nodes, {"x": x, "r": r}, ["y"], opset=13, initializers={"w": w, "b": b})
    sess = rt.InferenceSession(model.SerializeToString(), providers=["cpu"])
    ref = run_oracle(model, {"x": x, "r": r})
    for _ in range(2):
        assert_close(sess.run(None, {"x": x, "r": r}), ref, rtol=1e-4, atol=1e-5)
    assert [c[0] for c in lane_calls] == [(M, C * k * k, oh * ow)] * 2
