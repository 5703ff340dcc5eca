"""CPU provider nn kernels against onnxruntime (the oracle), node by node: Conv (direct,
depthwise, strided, auto_pad, 1-D/3-D) and ConvTranspose.

Where onnxruntime departs from the ONNX spec (ConvTranspose SAME padding with a
too-small kernel), an independent naive loop implementation of the spec is the oracle instead.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import helper

from oracle import check_node
from runtime_core.errors import InvalidModelError
from providers.cpu.nn_cases import F32, rnd, run_model, tol


# ------------------------------------------------------------------------------ Conv

CONV_CASES = list(itertools.product(
    [(3, 4, 1), (4, 6, 2), (4, 4, 4), (4, 8, 4), (1, 3, 1)],  # (C, M, group): dense, grouped, depthwise
    [(1, 1), (3, 3), (2, 3)],                                    # kernel
    [1, 2],                                                      # stride
    [None, [1, 1, 1, 1], [0, 1, 2, 1]],                          # pads
    [1, 2],                                                      # dilation
))


@pytest.mark.parametrize("cmg,ks,stride,pads,dil", CONV_CASES)
def test_conv2d(cmg, ks, stride, pads, dil):
    C, M, g = cmg
    inits = {"w": rnd(M, C // g, *ks), "b": rnd(M)}
    kw = {"pads": pads} if pads else {}
    check_node("Conv", {"x": rnd(2, C, 9, 8)}, initializers=inits, group=g, strides=[stride, stride],
               dilations=[dil, dil], opset=11, **kw, **F32)


@pytest.mark.parametrize("stride,dil,pads,bias", [
    (1, 1, [1, 1, 1, 1], True), (2, 1, [1, 1, 1, 1], True), (2, 1, [0, 1, 2, 0], False),
    (1, 2, [2, 2, 2, 2], True), (3, 1, None, True)])
def test_depthwise_flat_path(stride, dil, pads, bias, cpu_policy):
    # without the compiled kernel (float64, or a build without a C compiler), large images take
    # the flat multiply-add path (with the bias added by its final crop); forced here on a small
    # image by lowering the einsum path's size bound to nothing
    cpu_policy(native=None, dw_einsum_max_pixels=0)
    inits = {"w": rnd(6, 1, 3, 3)}
    if bias:
        inits["b"] = rnd(6)
    kw = {"pads": pads} if pads else {}
    check_node("Conv", {"x": rnd(2, 6, 13, 11)}, initializers=inits, group=6, strides=[stride, stride],
               dilations=[dil, dil], opset=11, **kw, **F32)


@pytest.mark.parametrize("ks,strides,dil,pads", [
    ((3, 3), [1, 1], [1, 1], [1, 1, 1, 1]), ((3, 3), [2, 2], [1, 1], [1, 1, 1, 1]),
    ((3, 3), [2, 2], [1, 1], [0, 1, 2, 0]), ((3, 3), [1, 1], [2, 2], [2, 2, 2, 2]),
    ((3, 3), [3, 2], [1, 1], None), ((5, 5), [2, 2], [1, 1], [2, 2, 2, 2]),
    ((1, 1), [1, 1], [1, 1], [1, 0, 0, 1]), ((2, 4), [1, 3], [2, 1], [0, 3, 1, 2]),
    ((3, 3), [1, 1], [1, 1], [4, 4, 4, 4]),   # padding wider than the kernel: all-zero rows
])
@pytest.mark.native
def test_depthwise_native(ks, strides, dil, pads):
    # the compiled depthwise kernel (float32; every shape here goes through it)
    from runtime_provider_cpu.fast import policy

    assert policy.NATIVE is not None, policy.NATIVE_ERROR  # the wheel is built with its C extension
    kw = {"pads": pads} if pads else {}
    # widths below, at and past the 8-wide vectors of the 3x3 kernel, whole and partial, and
    # planes smaller than one vector (a short row's vector must not spill past the plane)
    for shape, bias in [((2, 5, 13, 11), True), ((1, 3, 7, 9), False), ((1, 4, 21, 37), True),
                        ((1, 2, 16, 16), False), ((1, 3, 2, 1), True), ((2, 2, 5, 2), False),
                        ((1, 1, 1, 1), True)]:
        inits = {"w": rnd(shape[1], 1, *ks)}
        if bias:
            inits["b"] = rnd(shape[1])
        p = pads or [0, 0, 0, 0]
        if any(shape[2 + i] + p[i] + p[i + 2] < (ks[i] - 1) * dil[i] + 1 for i in range(2)):
            # a window larger than the padded plane: refused, as onnxruntime does
            with pytest.raises(InvalidModelError, match="kernel window"):
                check_node("Conv", {"x": rnd(*shape)}, initializers=inits, group=shape[1], strides=strides,
                           dilations=dil, opset=11, **kw, **F32)
            continue
        check_node("Conv", {"x": rnd(*shape)}, initializers=inits, group=shape[1], strides=strides,
                   dilations=dil, opset=11, **kw, **F32)


@pytest.mark.kernel
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.native
def test_depthwise_native_threads(stride, fast):
    # channel planes split between the kernel threads (from 8K outputs a thread): the same
    # bits on any thread count, and the einsum reference's values, on both 3x3 paths
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast.depthwise import depthwise_einsum

    x, w, b = rnd(2, 40, 97, 95), rnd(40, 1, 3, 3), rnd(40)  # 188K-737K outputs: 2-8 threads
    out = [(97 - 1) // stride + 1, (95 - 1) // stride + 1]
    outs = []
    for threads in (1, 2, 3, 8):
        y = np.empty((2, 40, *out), np.float32)
        _native.depthwise2d(x, w, b, y, x.shape, tuple(out), (3, 3), (stride, stride), (1, 1), (1, 1),
                            -np.inf, np.inf, threads, fast)
        outs.append(y)
    for y in outs[1:]:
        assert np.array_equal(y, outs[0])
    ref = depthwise_einsum(x, w, [stride, stride], [1, 1], [1, 1], [1, 1], out) + b.reshape(40, 1, 1)
    np.testing.assert_allclose(outs[0], ref, rtol=1e-4, atol=1e-5)


def _dw_reference(x, w, b, s, pads, lo, hi):
    """float64 k x k depthwise convolution by shifted slices, then the clip"""
    pt, pl, pb, pr = pads
    N, C, H, W = x.shape
    k = w.shape[-1]
    OH, OW = (H + pt + pb - k) // s + 1, (W + pl + pr - k) // s + 1
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    ref = np.zeros((N, C, OH, OW))
    for ky in range(k):
        for kx in range(k):
            ref += w[None, :, 0, ky, kx, None, None] * xp[:, :, ky:ky + s * (OH - 1) + 1:s,
                                                          kx:kx + s * (OW - 1) + 1:s]
    if b is not None:
        ref += b[None, :, None, None]
    return np.clip(ref, lo, hi)


@pytest.mark.kernel
@pytest.mark.parametrize("k", [3, 5, 7])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.native
def test_depthwise_native_phase_planes(stride, k):
    # the AVX-512 k x k path (phase planes, flat-index vectors below 16 outputs a row, row
    # vectors from 16; 5x5 and 7x7 four vectors at once) against float64 and the portable
    # path (fast=False), over plane sizes around 16 and 32 columns, odd sizes and every
    # padding the kernel is given
    from runtime_provider_cpu import _native

    rng = np.random.default_rng(6)
    for H, W in [(1, 1), (2, 3), (7, 7), (14, 14), (13, 17), (16, 15), (31, 33), (4, 40), (40, 4),
                 (9, 64), (3, 65), (3, 112), (2, 99)]:  # several whole 32-column chunks, then a tail
        for pads in [(1, 1, 1, 1), (0, 0, 0, 0), (1, 0, 0, 1), (0, 1, 1, 0), (2, 2, 2, 2),
                     (2, 1, 0, 2), (3, 3, 3, 3), (3, 0, 2, 1)]:
            pt, pl, pb, pr = pads
            OH, OW = (H + pt + pb - k) // stride + 1, (W + pl + pr - k) // stride + 1
            if OH < 1 or OW < 1:
                continue
            x = rng.standard_normal((2, 3, H, W)).astype(np.float32)
            w = rng.standard_normal((3, 1, k, k)).astype(np.float32)
            b = rng.standard_normal(3).astype(np.float32)
            for bias, lo, hi in ((None, -np.inf, np.inf), (b, 0.0, 0.5)):
                ys = []
                for fast in (True, False):
                    y = np.full((2, 3, OH, OW), np.nan, np.float32)
                    _native.depthwise2d(x, w, bias, y, x.shape, (OH, OW), (k, k), (stride, stride),
                                        (1, 1), (pt, pl), lo, hi, 2, fast)
                    ys.append(y)
                ref = _dw_reference(x, w, bias, stride, pads, lo, hi)
                for y in ys:
                    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5, err_msg=f"{H}x{W} {pads}")
    # a NaN input stays NaN through the clip on both paths; every other output is clipped
    x = np.ones((1, 2, 7, 7), np.float32)
    x[0, 1, 3, 3] = np.nan
    w = np.ones((2, 1, k, k), np.float32)
    p = k // 2
    OH = (7 + 2 * p - k) // stride + 1
    for fast in (True, False):
        y = np.zeros((1, 2, OH, OH), np.float32)
        _native.depthwise2d(x, w, None, y, x.shape, (OH, OH), (k, k), (stride, stride), (1, 1), (p, p),
                            0.0, 5.0, 1, fast)
        ref = _dw_reference(np.nan_to_num(x, nan=0.0), w, None, stride, (p,) * 4, 0.0, 5.0)
        nan = np.isnan(_dw_reference(x, w, None, stride, (p,) * 4, -np.inf, np.inf))
        assert nan.any() and np.array_equal(np.isnan(y), nan)
        np.testing.assert_allclose(y[~nan], ref[~nan])


def _dw_reference_k(x, w, b, s, pads, lo, hi):
    """float64 KH x KW depthwise convolution by shifted slices, then the clip"""
    pt, pl, pb, pr = pads
    N, C, H, W = x.shape
    KH, KW = w.shape[-2:]
    OH, OW = (H + pt + pb - KH) // s + 1, (W + pl + pr - KW) // s + 1
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    ref = np.zeros((N, C, OH, OW)) + (0 if b is None else b[None, :, None, None])
    for ky in range(KH):
        for kx in range(KW):
            ref += w[None, :, 0, ky, kx, None, None] * xp[:, :, ky:ky + s * (OH - 1) + 1:s, kx:kx + s * (OW - 1) + 1:s]
    return np.clip(ref, lo, hi)


@pytest.mark.kernel
@pytest.mark.parametrize("ks", [(3, 3), (5, 5), (7, 7), (1, 1), (3, 5)])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.native
def test_depthwise_native_lanes(stride, ks):
    # the channels-in-lanes kernel (lanes=True: 16 channels of an image a block, register
    # transposes in and out) against float64: channel counts around 16, plane widths around
    # 16, every padding, bias and clip, one thread and two (the same bits)
    from runtime_provider_cpu import _native

    if not getattr(_native, "CONV_FAST", 0):
        pytest.skip("the lanes depthwise kernel needs the AVX-512 build (CONV_FAST)")
    rng = np.random.default_rng(7)
    KH, KW = ks
    for C, (H, W) in [(3, (7, 7)), (16, (14, 14)), (17, (1, 1)), (33, (13, 17)), (20, (16, 15)), (5, (3, 40))]:
        for pads in [(KH // 2, KW // 2, KH // 2, KW // 2), (0, 0, 0, 0), (1, 0, 0, 1), (3, 2, 0, 3)]:
            pt, pl, pb, pr = pads
            OH, OW = (H + pt + pb - KH) // stride + 1, (W + pl + pr - KW) // stride + 1
            if OH < 1 or OW < 1:
                continue
            x = rng.standard_normal((2, C, H, W)).astype(np.float32)
            w = rng.standard_normal((C, 1, KH, KW)).astype(np.float32)
            b = rng.standard_normal(C).astype(np.float32)
            for bias, lo, hi in ((None, -np.inf, np.inf), (b, 0.0, 0.5)):
                ys = []
                for threads in (1, 2):
                    y = np.full((2, C, OH, OW), np.nan, np.float32)
                    _native.depthwise2d(x, w, bias, y, x.shape, (OH, OW), ks, (stride, stride), (1, 1), (pt, pl),
                                        lo, hi, threads, True, True)
                    ys.append(y)
                np.testing.assert_allclose(ys[0], _dw_reference_k(x, w, bias, stride, pads, lo, hi), rtol=1e-5,
                                           atol=1e-5, err_msg=f"C={C} {H}x{W} {pads}")
                assert np.array_equal(ys[0], ys[1])
    # a NaN input stays NaN through the clip; every other output is clipped
    x = np.ones((1, 18, 7, 7), np.float32)
    x[0, 17, 2, 2] = np.nan
    w = np.ones((18, 1, KH, KW), np.float32)
    pads = (KH // 2, KW // 2, KH // 2, KW // 2)
    OH, OW = (7 + 2 * pads[0] - KH) // stride + 1, (7 + 2 * pads[1] - KW) // stride + 1
    y = np.zeros((1, 18, OH, OW), np.float32)
    _native.depthwise2d(x, w, None, y, x.shape, (OH, OW), ks, (stride, stride), (1, 1), pads[:2], 0.0, 5.0, 1,
                        True, True)
    nan = np.isnan(_dw_reference_k(x, w, None, stride, pads, -np.inf, np.inf))
    assert nan.any() and np.array_equal(np.isnan(y), nan)
    ref = _dw_reference_k(np.nan_to_num(x, nan=0.0), w, None, stride, pads, 0.0, 5.0)
    np.testing.assert_allclose(y[~nan], ref[~nan])


@pytest.mark.kernel
@pytest.mark.native
def test_depthwise_native_checks_buffers():
    # a buffer that does not hold what the shape says is a ValueError, never a read past it
    from runtime_provider_cpu import _native

    x = np.zeros((1, 2, 4, 4), np.float32)
    w = np.zeros((2, 1, 3, 3), np.float32)
    y = np.zeros((1, 2, 4, 4), np.float32)
    args = ((1, 2, 4, 4), (4, 4), (3, 3), (1, 1), (1, 1), (1, 1), 0.0, 0.5)
    with pytest.raises(ValueError, match="X holds"):
        _native.depthwise2d(x[:, :1], w, None, y, *args)
    with pytest.raises(ValueError, match="B holds"):
        _native.depthwise2d(x, w, np.zeros(3, np.float32), y, *args)
    with pytest.raises(ValueError, match="Y holds"):
        _native.depthwise2d(x, w, None, y.astype(np.float64), *args)
    with pytest.raises(ValueError, match="contiguous"):
        _native.depthwise2d(x, w, None, y[..., ::2], *args)  # not contiguous
    with pytest.raises(ValueError, match="zero size"):
        _native.depthwise2d(x, w, None, y, (1, 2, 4, 4), (4, 4), (3, 3), (0, 1), (1, 1), (1, 1), 0.0, 0.5)
    _native.depthwise2d(np.ones_like(x), np.ones_like(w), None, y, *args)
    assert (y == 0.5).all()  # every sum of 4..9 ones clipped to hi


@pytest.mark.parametrize("ks,strides,pads", [
    ((7, 7), [2, 2], [3, 3, 3, 3]),   # a ResNet stem: the phase-split im2col
    ((7, 7), [2, 2], [3, 3, 2, 1]),   # odd sizes, uneven end padding
    ((5, 5), [2, 2], [4, 4, 4, 4]),   # padding wider than the stride
    ((4, 4), [2, 2], [1, 0, 2, 0]),   # exactly 4 taps per phase
    ((7, 5), [3, 2], [2, 1, 0, 2]),   # unequal strides, phases of unequal tap counts
    ((5, 5), [2, 2], None),
    ((4, 4), [4, 4], None),           # non-overlapping patches (ViT): the transpose im2col
    ((3, 4), [3, 4], [0, 0, 2, 3]),   # patches with end padding: the patch view would not fit
    ((2, 3), [2, 3], [0, 0, 0, 0]),   # patches not covering the whole input (23 % 2, 21 % 3)
])
def test_conv_strided_many_taps(ks, strides, pads):
    kw = {"pads": pads} if pads else {}
    for shape in [(2, 3, 23, 21), (1, 2, 12, 16)]:
        check_node("Conv", {"x": rnd(*shape)}, initializers={"w": rnd(4, shape[1], *ks), "b": rnd(4)},
                   strides=strides, **kw, **F32)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID", "NOTSET"])
@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("dil", [1, 2])
def test_conv_auto_pad(auto_pad, stride, k, dil):
    check_node("Conv", {"x": rnd(1, 3, 9, 10)}, initializers={"w": rnd(4, 3, k, k)}, auto_pad=auto_pad,
               strides=[stride, stride], dilations=[dil, dil], opset=22, **F32)


@pytest.mark.parametrize("stride,dil,g", list(itertools.product([1, 2], [1, 2], [1, 2, 4])))
def test_conv1d_3d(stride, dil, g):
    check_node("Conv", {"x": rnd(2, 4, 11)}, initializers={"w": rnd(8, 4 // g, 3), "b": rnd(8)},
               strides=[stride], dilations=[dil], pads=[1, 2], group=g, **F32)
    check_node("Conv", {"x": rnd(1, 4, 5, 6, 7)}, initializers={"w": rnd(8, 4 // g, 3, 2, 3)},
               strides=[stride] * 3, dilations=[dil] * 3, pads=[1, 0, 1, 1, 1, 0], group=g, **F32)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("opset", [1, 11, 22])
def test_conv_dtypes_opsets(dtype, opset):
    # weights as a graph input too: the kernel must not rely on constant weights
    check_node("Conv", {"x": rnd(2, 3, 7, 7, dtype=dtype), "w": rnd(4, 3, 3, 3, dtype=dtype),
                        "b": rnd(4, dtype=dtype)}, pads=[1, 1, 1, 1], strides=[2, 1], opset=opset,
               **tol(dtype))


def test_conv_kernel_shape_attr_and_batch():
    check_node("Conv", {"x": rnd(3, 2, 6, 6)}, initializers={"w": rnd(5, 2, 3, 3)}, kernel_shape=[3, 3],
               **F32)


def test_conv_does_not_modify_inputs():
    x = rnd(1, 2, 5, 5)
    w = rnd(3, 2, 3, 3)
    x0, w0 = x.copy(), w.copy()
    x.setflags(write=False)
    w.setflags(write=False)
    check_node("Conv", {"x": x, "w": w}, pads=[1, 1, 1, 1], **F32)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(w, w0)


# ------------------------------------------------------------------------------ ConvTranspose

CT_CASES = [c for c in itertools.product(
    [(3, 4, 1), (4, 6, 2), (4, 4, 4)], [(1, 1), (3, 3), (2, 3)], [1, 2, 3], [None, [1, 1, 1, 1], [0, 1, 2, 1]],
    [1, 2], [None, [1, 1]])
    if not (c[5] and c[2] == 1)]  # output_padding must stay below the stride


@pytest.mark.parametrize("cmg,ks,stride,pads,dil,opad", CT_CASES)
def test_conv_transpose2d(cmg, ks, stride, pads, dil, opad):
    C, M, g = cmg
    kw = {}
    if pads:
        kw["pads"] = pads
    if opad:
        kw["output_padding"] = opad
    check_node("ConvTranspose", {"x": rnd(2, C, 5, 4)}, initializers={"w": rnd(C, M // g, *ks), "b": rnd(M)},
               group=g, strides=[stride, stride], dilations=[dil, dil], opset=11, **kw, **F32)


def _ct_consistent(in_sp, ks, st, osh):
    return all((i - 1) * s + k >= o for i, k, s, o in zip(in_sp, ks, st, osh))


CT_OSH = [(ap, osh, st, k) for ap, osh, st, k in itertools.product(
    ["SAME_UPPER", "SAME_LOWER", "VALID", "NOTSET"], [None, [8, 9], [7, 12], [4, 5]], [1, 2, 3], [2, 3])
    if not (osh is None and ap == "NOTSET") and (osh is None or _ct_consistent((4, 5), (k, k), (st, st), osh))
    and not (osh is None and ap.startswith("SAME") and st > k)]  # onnxruntime ignores SAME there


@pytest.mark.parametrize("auto_pad,osh,stride,k", CT_OSH)
def test_conv_transpose_output_shape_auto_pad(auto_pad, osh, stride, k):
    kw = {"output_shape": osh} if osh else {}
    check_node("ConvTranspose", {"x": rnd(1, 3, 4, 5)}, initializers={"w": rnd(3, 2, k, k)}, auto_pad=auto_pad,
               strides=[stride, stride], opset=22, **kw, **F32)


def naive_conv_transpose(x, w, strides, pads_b, out):
    """Spec ConvTranspose (group 1, no dilation) by direct scatter."""
    N, C = x.shape[:2]
    M = w.shape[1]
    ks = w.shape[2:]
    y = np.zeros((N, M, *out), np.float64)
    for idx in np.ndindex(*x.shape[2:]):
        for kk in np.ndindex(*ks):
            o = [idx[i] * strides[i] + kk[i] - pads_b[i] for i in range(len(idx))]
            if all(0 <= o[i] < out[i] for i in range(len(o))):
                y[(slice(None), slice(None)) + tuple(o)] += np.einsum(
                    "nc,cm->nm", x[(slice(None), slice(None)) + idx], w[(slice(None), slice(None)) + kk])
    return y.astype(x.dtype)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
def test_conv_transpose_same_small_kernel_spec(auto_pad):
    # kernel 2 < stride 3: 'SAME' cannot reach in*stride; the output is the full result (ONNX inference)
    x, w = rnd(1, 3, 4, 5), rnd(3, 2, 2, 2)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], auto_pad=auto_pad, strides=[3, 3])
    run_model([node], {"x": x, "w": w}, ["y"], opset=22, **F32,
              oracle=lambda f: [naive_conv_transpose(x, w, [3, 3], [0, 0], [11, 14])])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("opset", [1, 11, 22])
def test_conv_transpose_1d_3d_dtypes(dtype, opset):
    check_node("ConvTranspose", {"x": rnd(2, 3, 7, dtype=dtype)}, initializers={"w": rnd(3, 2, 3, dtype=dtype)},
               strides=[2], pads=[1, 0], opset=opset, **tol(dtype))
    check_node("ConvTranspose", {"x": rnd(1, 2, 3, 4, 3, dtype=dtype), "w": rnd(2, 2, 2, 3, 2, dtype=dtype),
                                 "b": rnd(2, dtype=dtype)}, strides=[2, 1, 2], opset=opset, **tol(dtype))
