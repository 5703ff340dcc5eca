"""CPU provider nn kernels against onnxruntime (the oracle), node by node.

Where onnxruntime departs from the ONNX spec (pooling/ConvTranspose SAME padding with
dilation or a too-small kernel), an independent naive loop implementation of the spec is
the oracle instead.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx import helper

import runtime_core as rt
from runtime_core.errors import InvalidModelError, PartitionError
from oracle import assert_close, check_node, make_model, run_oracle, run_ours

RNG = np.random.default_rng(20240611)

F32 = dict(rtol=1e-4, atol=1e-5)
TOL = {np.float32: F32, np.float64: dict(rtol=1e-7, atol=1e-9), np.float16: dict(rtol=1e-2, atol=1e-2)}


def rnd(*shape, dtype=np.float32, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def tol(dtype):
    return TOL[np.dtype(dtype).type]


def run_model(nodes, inputs, outputs, *, opset, initializers=None, rtol=1e-4, atol=1e-5, oracle=None):
    """Build a model (nodes may use '' for omitted inputs), run ours and the oracle, compare.

    ``oracle(feeds) -> list`` replaces onnxruntime where it departs from the spec or lacks a case.
    """
    model = make_model(nodes, inputs, outputs, opset=opset, initializers=initializers)
    ours, sess = run_ours(model, dict(inputs))
    assert all(n.provider == "CPUExecutionProvider" for n in sess.get_partition_report().nodes)
    ref = oracle(dict(inputs)) if oracle is not None else run_oracle(model, dict(inputs))
    assert_close(ours, ref, rtol, atol)
    return ours


def node_check(op, inputs, outputs=("y",), *, opset, initializers=None, oracle=None,
               rtol=1e-4, atol=1e-5, **attrs):
    """check_node with a replacement oracle (``oracle(feeds) -> list of arrays``)."""
    node = helper.make_node(op, list(inputs) + list(initializers or {}), list(outputs), **attrs)
    return run_model([node], inputs, [o for o in outputs if o], opset=opset, initializers=initializers,
                     rtol=rtol, atol=atol, oracle=oracle)


def expect_declined(nodes, inputs, outputs, opset, initializers=None, reason=""):
    model = make_model(nodes, inputs, outputs, opset=opset, initializers=initializers)
    with pytest.raises(PartitionError) as ei:
        rt.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert reason in str(ei.value)


# ------------------------------------------------------------------------------ MatMul / Gemm

@pytest.mark.parametrize("shapes", [
    ((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((2, 3, 4), (4, 5)),
    ((2, 3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 6)), ((5, 4), (2, 3, 4, 6)), ((3, 0), (0, 2)),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int64])
def test_matmul(shapes, dtype):
    a, b = (rnd(*s, scale=3).astype(dtype) for s in shapes)
    t = tol(dtype) if np.dtype(dtype).kind == "f" else {}
    check_node("MatMul", {"a": a, "b": b}, opset=13, **t)


@pytest.mark.parametrize("opset", [1, 9, 13])
def test_matmul_opsets(opset):
    check_node("MatMul", {"a": rnd(2, 3, 4), "b": rnd(4, 3)}, opset=opset, **F32)


@pytest.mark.parametrize("transA,transB", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, 2.0), (1.5, 0.0)])
@pytest.mark.parametrize("c_shape", [None, (5,), (1, 5), (3, 1), (3, 5), ()])
def test_gemm(transA, transB, alpha, beta, c_shape):
    a = rnd(4, 3) if transA else rnd(3, 4)
    b = rnd(5, 4) if transB else rnd(4, 5)
    inits = {} if c_shape is None else {"c": rnd(*c_shape)}
    check_node("Gemm", {"a": a, "b": b}, initializers=inits, transA=transA, transB=transB, alpha=alpha,
               beta=beta, opset=13 if c_shape is None else 11, **F32)


@pytest.mark.parametrize("opset", [7, 9, 11, 13])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_gemm_opsets_dtypes(opset, dtype):
    check_node("Gemm", {"a": rnd(3, 4, dtype=dtype), "b": rnd(4, 2, dtype=dtype), "c": rnd(2, dtype=dtype)},
               alpha=0.7, beta=0.3, transB=0, opset=opset, **tol(dtype))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_gemm_int(dtype):
    a = RNG.integers(-5, 5, (3, 4)).astype(dtype)
    b = RNG.integers(-5, 5, (4, 2)).astype(dtype)
    c = RNG.integers(-5, 5, (2,)).astype(dtype)
    check_node("Gemm", {"a": a, "b": b, "c": c}, opset=13)


@pytest.mark.parametrize("broadcast,c_shape", [(1, (5,)), (1, (1, 5)), (1, ()), (0, (3, 5))])
@pytest.mark.parametrize("transA,transB", [(0, 0), (1, 1)])
def test_gemm_6(broadcast, c_shape, transA, transB):
    # onnxruntime has no Gemm-6: opset 7 (the same arithmetic, C broadcast) is the oracle
    a = rnd(4, 3) if transA else rnd(3, 4)
    b = rnd(5, 4) if transB else rnd(4, 5)
    c = rnd(*c_shape)
    feeds = {"a": a, "b": b, "c": c}
    attrs = dict(alpha=0.7, beta=1.3, transA=transA, transB=transB)
    ref = run_oracle(make_model([helper.make_node("Gemm", ["a", "b", "c"], ["y"], **attrs)], feeds, ["y"],
                                opset=7), feeds)
    node_check("Gemm", feeds, opset=6, oracle=lambda f: ref, broadcast=broadcast, **attrs, **F32)


def test_gemm_6_no_broadcast_needs_full_c():
    feeds = {"a": rnd(3, 4), "b": rnd(4, 5), "c": rnd(5)}
    model = make_model([helper.make_node("Gemm", ["a", "b", "c"], ["y"], broadcast=0)], feeds, ["y"], opset=6)
    with pytest.raises(Exception, match="broadcast=0"):
        run_ours(model, feeds)


@pytest.mark.parametrize("op,attrs", [("MatMul", {}), ("Softmax", {"axis": -1}), ("LogSoftmax", {"axis": 1})])
def test_bfloat16_computed_in_float32(op, attrs):
    import ml_dtypes

    bf = np.dtype(ml_dtypes.bfloat16)
    a = rnd(2, 3, 4).astype(bf)
    feeds = {"a": a, "b": rnd(4, 5).astype(bf)} if op == "MatMul" else {"a": a}
    node = helper.make_node(op, list(feeds), ["y"], **attrs)
    (y,), _ = run_ours(make_model([node], feeds, ["y"], opset=13), feeds)
    assert y.dtype == bf
    f32 = {k: v.astype(np.float32) for k, v in feeds.items()}
    (want,), _ = run_ours(make_model([node], f32, ["y"], opset=13), f32)
    np.testing.assert_allclose(y.astype(np.float32), want.astype(bf).astype(np.float32), rtol=1e-2, atol=1e-2)


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
        check_node("Conv", {"x": rnd(*shape)}, initializers=inits, group=shape[1], strides=strides,
                   dilations=dil, opset=11, **kw, **F32)


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
    """float64 3x3 depthwise convolution by shifted slices, then the clip"""
    pt, pl, pb, pr = pads
    N, C, H, W = x.shape
    OH, OW = (H + pt + pb - 3) // s + 1, (W + pl + pr - 3) // s + 1
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    ref = np.zeros((N, C, OH, OW))
    for ky in range(3):
        for kx in range(3):
            ref += w[None, :, 0, ky, kx, None, None] * xp[:, :, ky:ky + s * (OH - 1) + 1:s,
                                                          kx:kx + s * (OW - 1) + 1:s]
    if b is not None:
        ref += b[None, :, None, None]
    return np.clip(ref, lo, hi)


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.native
def test_depthwise_native_phase_planes(stride):
    # the AVX-512 3x3 path (phase planes, flat-index vectors below 16 outputs a row, row
    # vectors from 16) against float64 and the 8-float path (fast=False), over plane sizes
    # around 16 and 32 columns, odd sizes and every padding the kernel is given
    from runtime_provider_cpu import _native

    rng = np.random.default_rng(6)
    for H, W in [(1, 1), (2, 3), (7, 7), (14, 14), (13, 17), (16, 15), (31, 33), (4, 40), (40, 4),
                 (9, 64), (3, 65)]:
        for pads in [(1, 1, 1, 1), (0, 0, 0, 0), (1, 0, 0, 1), (0, 1, 1, 0), (2, 2, 2, 2),
                     (2, 1, 0, 2)]:
            pt, pl, pb, pr = pads
            OH, OW = (H + pt + pb - 3) // stride + 1, (W + pl + pr - 3) // stride + 1
            if OH < 1 or OW < 1:
                continue
            x = rng.standard_normal((2, 3, H, W)).astype(np.float32)
            w = rng.standard_normal((3, 1, 3, 3)).astype(np.float32)
            b = rng.standard_normal(3).astype(np.float32)
            for bias, lo, hi in ((None, -np.inf, np.inf), (b, 0.0, 0.5)):
                ys = []
                for fast in (True, False):
                    y = np.full((2, 3, OH, OW), np.nan, np.float32)
                    _native.depthwise2d(x, w, bias, y, x.shape, (OH, OW), (3, 3), (stride, stride),
                                        (1, 1), (pt, pl), lo, hi, 2, fast)
                    ys.append(y)
                ref = _dw_reference(x, w, bias, stride, pads, lo, hi)
                for y in ys:
                    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5, err_msg=f"{H}x{W} {pads}")
    # a NaN input stays NaN through the clip on both paths; every other output is clipped
    x = np.ones((1, 2, 7, 7), np.float32)
    x[0, 1, 3, 3] = np.nan
    w = np.ones((2, 1, 3, 3), np.float32)
    OH = (7 + 2 - 3) // stride + 1
    for fast in (True, False):
        y = np.zeros((1, 2, OH, OH), np.float32)
        _native.depthwise2d(x, w, None, y, x.shape, (OH, OH), (3, 3), (stride, stride), (1, 1), (1, 1),
                            0.0, 5.0, 1, fast)
        ref = _dw_reference(np.nan_to_num(x, nan=0.0), w, None, stride, (1, 1, 1, 1), 0.0, 5.0)
        nan = np.isnan(_dw_reference(x, w, None, stride, (1, 1, 1, 1), -np.inf, np.inf))
        assert nan.any() and np.array_equal(np.isnan(y), nan)
        np.testing.assert_allclose(y[~nan], ref[~nan])


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


# ------------------------------------------------------------------------------ pooling

POOL_CASES = [c for c in itertools.product(
    [0, 1], [[0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 2, 1]], [1, 2, 3], [2, 3], [1, 2])
    if max(c[1]) < c[3]]  # pads must be smaller than the kernel


@pytest.mark.parametrize("ceil_mode,pads,stride,k,dil", POOL_CASES)
def test_maxpool(ceil_mode, pads, stride, k, dil):
    check_node("MaxPool", {"x": rnd(2, 3, 9, 10)}, kernel_shape=[k, k], strides=[stride, stride], pads=pads,
               ceil_mode=ceil_mode, dilations=[dil, dil], opset=12, **F32)


def test_maxpool_without_padded_copy_matches_padded_path():
    # the values path reduces the unpadded input tap by tap; the reference is the max over
    # every window of the -inf-padded input (float with NaNs, and integers), over sizes,
    # kernels, strides, dilations, pads and ceil mode; configurations with a window of padding
    # only keep the padded path
    from numpy.lib.stride_tricks import sliding_window_view

    from runtime_provider_cpu.ops import pool

    rng = np.random.default_rng(3)
    fast = fallback = 0
    for h, k, s, d, pb, pe, cm in itertools.product([1, 4, 7], [1, 2, 3], [1, 2, 3], [1, 2], [0, 1, 2], [0, 2],
                                                     [0, 1]):
        if pb >= (k - 1) * d + 1 or pe >= (k - 1) * d + 1:
            continue
        geo = pool._pool_geometry((h, h + 1), [k, k], [s, s], [pb, pb, pe, pe], [d, d], "NOTSET", cm)
        if min(geo[2]) <= 0:
            continue
        for x in (rng.standard_normal((1, 2, h, h + 1)).astype(np.float32),
                  rng.integers(-50, 50, (1, 2, h, h + 1)).astype(np.int8)):
            if x.dtype.kind == "f":
                x.flat[::5] = np.nan
            xp = pool._pooled_padded(x, geo[0], geo[1], geo[2], [s, s], [(k - 1) * d + 1] * 2, pool._neg_fill(x.dtype))
            win = sliding_window_view(xp, ((k - 1) * d + 1,) * 2, axis=(2, 3))[:, :, ::s, ::s, ::d, ::d]
            want = win[:, :, :geo[2][0], :geo[2][1]].max(axis=(-2, -1))
            got = pool._maxpool_unpadded(x, [k, k], [s, s], [d, d], geo[0], geo[1], geo[2])
            if got is None:
                fallback += 1
                continue
            fast += 1
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)
    assert fast > 300 and fallback > 0
    assert pool._maxpool_unpadded(rnd(1, 1, 5, 5), [3, 3], [1, 1], [1, 1], [-1, 0], [0, 0], [3, 5]) is None


def test_maxpool_compiled_matches_padded_windows():
    # the compiled pooling (float32, 2-D: separable row maxima, or for 3x3 at stride 1 or 2
    # the AVX-512 phase planes where they run) against the max over every window of the
    # -inf-padded input, NaNs included, over sizes, kernels, strides, dilations, pads and ceil
    # mode (windows of padding only too: -inf, as the padded path gives); 1 and 3 threads alike
    # (the 120-row images are large enough to be split)
    from numpy.lib.stride_tricks import sliding_window_view

    from runtime_provider_cpu import _native
    from runtime_provider_cpu.ops import pool

    rng = np.random.default_rng(5)
    n = 0
    for h, k, s, d, pb, pe, cm in itertools.product([1, 4, 7, 40, 120], [1, 2, 3], [1, 2, 3], [1, 2], [0, 1, 2],
                                                     [0, 2], [0, 1]):
        geo = pool._pool_geometry((h, h + 3), [k, k], [s, s], [pb, pb, pe, pe], [d, d], "NOTSET", cm)
        if min(geo[2]) <= 0:
            continue
        x = rng.standard_normal((2, 3, h, h + 3)).astype(np.float32)
        x.flat[::7] = np.nan
        xp = pool._pooled_padded(x, geo[0], geo[1], geo[2], [s, s], [(k - 1) * d + 1] * 2, -np.inf)
        win = sliding_window_view(xp, ((k - 1) * d + 1,) * 2, axis=(2, 3))[:, :, ::s, ::s, ::d, ::d]
        want = win[:, :, :geo[2][0], :geo[2][1]].max(axis=(-2, -1))
        # fast=False: the row maxima path also where the AVX-512 3x3 one (stride 1 or 2) runs
        for threads, fast in itertools.product((1, 3), (True, False)):
            got = np.empty(want.shape, np.float32)
            _native.maxpool2d(x, got, x.shape, tuple(geo[2]), (k, k), (s, s), (d, d), tuple(geo[0]), threads,
                              fast)
            np.testing.assert_array_equal(got, want)
        n += 1
    assert n > 300


@pytest.mark.parametrize("ceil_mode,pads,stride,k,dil", POOL_CASES)
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_averagepool(ceil_mode, pads, stride, k, dil, count_include_pad):
    check_node("AveragePool", {"x": rnd(2, 3, 9, 10)}, kernel_shape=[k, k], strides=[stride, stride],
               pads=pads, ceil_mode=ceil_mode, dilations=[dil, dil], count_include_pad=count_include_pad,
               opset=19, **F32)


@pytest.mark.parametrize("ceil_mode,pads,stride,k,dil", POOL_CASES[::3])
@pytest.mark.parametrize("p", [1, 2, 3])
def test_lppool(ceil_mode, pads, stride, k, dil, p):
    check_node("LpPool", {"x": rnd(2, 3, 9, 10)}, kernel_shape=[k, k], strides=[stride, stride],
               pads=pads, ceil_mode=ceil_mode, dilations=[dil, dil], p=p, opset=18, **F32)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("stride,k", [(1, 2), (1, 3), (2, 2), (2, 3), (3, 3)])
def test_pool_auto_pad(op, auto_pad, stride, k):
    check_node(op, {"x": rnd(2, 3, 9, 10)}, kernel_shape=[k, k], strides=[stride, stride], auto_pad=auto_pad,
               opset=11, **F32)


def naive_pool(x, op, ks, st, pb, pe, dil, out, count_include_pad=0):
    N, C = x.shape[:2]
    in_sp = x.shape[2:]
    y = np.zeros((N, C, *out), np.float64)
    for o in np.ndindex(*out):
        vals, cnt = [], 0
        for kk in np.ndindex(*ks):
            pos = [o[i] * st[i] - pb[i] + kk[i] * dil[i] for i in range(len(ks))]
            if all(0 <= pos[i] < in_sp[i] for i in range(len(ks))):
                vals.append(x[(slice(None), slice(None)) + tuple(pos)].astype(np.float64))
                cnt += 1
            elif all(-pb[i] <= pos[i] < in_sp[i] + pe[i] for i in range(len(ks))):
                cnt += count_include_pad
        v = np.stack(vals)
        y[(slice(None), slice(None)) + o] = v.max(0) if op == "MaxPool" else v.sum(0) / cnt
    return y.astype(x.dtype)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("stride,k", [(1, 3), (2, 2), (2, 3)])
def test_pool_same_dilated_spec(op, auto_pad, stride, k):
    # onnxruntime ignores the dilation when it sizes SAME padding; the spec (and onnx shape
    # inference) use the dilated kernel: out = ceil(in / stride)
    x = rnd(1, 2, 9, 10)
    dil = 2
    keff = (k - 1) * dil + 1
    pb, pe, out = [], [], []
    for n in x.shape[2:]:
        o = -(-n // stride)
        total = max(0, (o - 1) * stride + keff - n)
        lo = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        pb.append(lo)
        pe.append(total - lo)
        out.append(o)
    node = helper.make_node(op, ["x"], ["y"], kernel_shape=[k, k], strides=[stride, stride],
                            dilations=[dil, dil], auto_pad=auto_pad)
    run_model([node], {"x": x}, ["y"], opset=19, **F32,
              oracle=lambda f: [naive_pool(x, op, [k, k], [stride] * 2, pb, pe, [dil] * 2, out)])


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("rank", [1, 3])
def test_pool_ranks_dtypes(op, dtype, rank):
    x = rnd(2, 3, *([7, 6, 5][:rank]), dtype=dtype)
    check_node(op, {"x": x}, kernel_shape=[3] * rank, strides=[2] * rank, pads=[1] * rank + [0] * rank,
               opset=11, **tol(dtype))


@pytest.mark.parametrize("opset", [1, 7, 8, 10, 11, 12, 19, 22])
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pool_opsets(op, opset):
    if op == "AveragePool" and opset == 1:
        # onnxruntime has no AveragePool-1; without padding the mean is that of opset 7
        x = rnd(1, 2, 6, 7)
        node = helper.make_node(op, ["x"], ["y"], kernel_shape=[3, 2], strides=[2, 1], pads=[0, 0, 0, 0])
        ref = run_oracle(make_model([node], {"x": x}, ["y"], opset=7), {"x": x})
        node_check(op, {"x": x}, opset=1, oracle=lambda feeds: ref, kernel_shape=[3, 2], strides=[2, 1],
                   pads=[0, 0, 0, 0], **F32)
        return
    check_node(op, {"x": rnd(1, 2, 6, 7)}, kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1],
               opset=opset, **F32)


@pytest.mark.parametrize("attrs", [{"pads": [1, 0, 1, 1]}, {"auto_pad": "SAME_UPPER"}])
def test_averagepool_1_padding_declined(attrs):
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 2], **attrs)
    expect_declined([node], {"x": rnd(1, 2, 6, 7)}, ["y"], 1, reason="AveragePool-1 with padding")


@pytest.mark.parametrize("opset", [2, 11, 18, 22])
def test_lppool_opsets(opset):
    check_node("LpPool", {"x": rnd(1, 2, 6, 7)}, kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1],
               opset=opset, **F32)


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("shape,ks,st,pads,dil", [
    ((2, 3, 9, 10), [3, 3], [2, 2], [1, 1, 1, 1], [1, 1]),
    ((1, 2, 8, 7), [2, 3], [1, 2], [0, 1, 1, 0], [2, 1]),
    ((2, 2, 11), [3], [2], [1, 1], [1]),
    ((1, 2, 5, 6, 4), [2, 3, 2], [1, 2, 2], [0, 1, 0, 1, 1, 0], [1, 1, 1]),
])
def test_maxpool_indices(storage_order, shape, ks, st, pads, dil):
    x = rnd(*shape)
    kw = {"dilations": dil} if any(d > 1 for d in dil) else {}
    check_node("MaxPool", {"x": x}, ("y", "idx"), kernel_shape=ks, strides=st, pads=pads,
               storage_order=storage_order, opset=12, **kw, **F32)


def test_maxpool_indices_ties_and_opset8():
    x = np.round(rnd(2, 2, 6, 6)).astype(np.float32)  # many equal values: first in window wins
    check_node("MaxPool", {"x": x}, ("y", "idx"), kernel_shape=[3, 3], strides=[1, 1], opset=8, **F32)
    check_node("MaxPool", {"x": x}, ("y", "idx"), kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, opset=12, **F32)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_maxpool_int8(dtype):
    x = RNG.integers(0 if dtype == np.uint8 else -100, 100, (1, 2, 7, 7)).astype(dtype)
    check_node("MaxPool", {"x": x}, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], opset=12)


GLOBAL_CASES = [(op, shape, dt) for op in ("GlobalAveragePool", "GlobalMaxPool")
                for shape in ((2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 4, 5))
                for dt in (np.float32, np.float64, np.float16)
                # onnxruntime (the oracle) has float64 GlobalMaxPool for 4-D input only
                if not (op == "GlobalMaxPool" and dt == np.float64 and len(shape) != 4)]


@pytest.mark.parametrize("op,shape,dtype", GLOBAL_CASES)
def test_global_pools(op, shape, dtype):
    check_node(op, {"x": rnd(*shape, dtype=dtype)}, opset=22 if dtype != np.float16 else 11, **tol(dtype))


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 4, 5)])
def test_global_lp_pool_matches_its_definition(shape):
    # onnxruntime has GlobalLpPool only at opset 2 and onnx.reference not at all: check the formula
    from oracle import make_model, run_ours

    x = rnd(*shape)
    node = helper.make_node("GlobalLpPool", ["x"], ["y"], p=3)
    (y,), _ = run_ours(make_model([node], {"x": x}, ["y"], opset=22), {"x": x})
    axes = tuple(range(2, x.ndim))
    want = (np.abs(x.astype(np.float64)) ** 3).sum(axis=axes, keepdims=True) ** (1 / 3)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, want, rtol=1e-5)


@pytest.mark.parametrize("p", [1, 3])
@pytest.mark.parametrize("opset", [2])  # onnxruntime's only GlobalLpPool; later versions: formula test above
def test_global_lp_pool_p(p, opset):
    check_node("GlobalLpPool", {"x": rnd(2, 3, 4, 5)}, p=p, opset=opset, **F32)


# ------------------------------------------------------------------------------ normalization

@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (2, 3, 4, 5), (1, 3, 2, 3, 4)])
@pytest.mark.parametrize("opset", [7, 9, 14, 15])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_batchnorm(shape, opset, dtype):
    C = shape[1]
    inits = {"s": rnd(C, dtype=dtype), "b": rnd(C, dtype=dtype), "m": rnd(C, dtype=dtype),
             "v": np.abs(rnd(C, dtype=dtype)) + dtype(0.5)}
    check_node("BatchNormalization", {"x": rnd(*shape, dtype=dtype)}, initializers=inits, epsilon=1e-3,
               opset=opset, **tol(dtype))


@pytest.mark.parametrize("spatial", [1, 0])
def test_batchnorm_6(spatial):
    # onnxruntime has no BatchNormalization-6: opset 7 (same inference arithmetic) is the oracle
    pshape = (3,) if spatial else (3, 4, 5)
    inits = {"s": rnd(*pshape), "b": rnd(*pshape), "m": rnd(*pshape), "v": np.abs(rnd(*pshape)) + np.float32(0.5)}
    x = rnd(2, 3, 4, 5)
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3, spatial=spatial)]
    ref = run_oracle(make_model(nodes, {"x": x}, ["y"], opset=7, initializers=inits), {"x": x})
    node_check("BatchNormalization", {"x": x}, opset=6, initializers=inits, oracle=lambda f: ref, epsilon=1e-3,
               is_test=1, spatial=spatial, **F32)


def test_batchnorm_6_training_outputs_declined():
    # is_test=0 with Y alone is implemented (test_legacy.py); the running/saved outputs are not
    inits = {"s": rnd(3), "b": rnd(3), "m": rnd(3), "v": np.abs(rnd(3)) + np.float32(0.5)}
    outs = ["y", "mean", "var", "saved_mean", "saved_var"]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], outs, is_test=0)
    expect_declined([node], {"x": rnd(2, 3, 4)}, outs, 6, inits, reason="saved_var")


def test_batchnorm_mixed_param_dtype():
    # opset 15: scale/bias (T1) and mean/var (T2) may differ from X (T)
    inits = {"s": rnd(3), "b": rnd(3), "m": rnd(3), "v": np.abs(rnd(3)) + np.float32(0.5)}
    check_node("BatchNormalization", {"x": rnd(2, 3, 4, 4, dtype=np.float16)}, initializers=inits,
               opset=15, rtol=1e-2, atol=1e-2)


def test_batchnorm_spatial0():
    inits = {"s": rnd(3, 4, 5), "b": rnd(3, 4, 5), "m": rnd(3, 4, 5), "v": np.abs(rnd(3, 4, 5)) + np.float32(0.5)}
    check_node("BatchNormalization", {"x": rnd(2, 3, 4, 5)}, initializers=inits, spatial=0, opset=7, **F32)


@pytest.mark.parametrize("opset", [14, 15])
@pytest.mark.parametrize("momentum", [0.9, 0.3])
def test_batchnorm_training(opset, momentum):
    inits = {"s": rnd(3), "b": rnd(3), "m": rnd(3), "v": np.abs(rnd(3)) + np.float32(0.5)}
    check_node("BatchNormalization", {"x": rnd(4, 3, 5, 6)}, ("y", "rm", "rv"), initializers=inits,
               training_mode=1, momentum=momentum, opset=opset, **F32)


def test_batchnorm_training_outputs_declined_before_14():
    inits = {"s": rnd(3), "b": rnd(3), "m": rnd(3), "v": np.abs(rnd(3)) + np.float32(0.5)}
    outs = ["y", "mean", "var", "saved_mean", "saved_var"]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], outs)
    expect_declined([node], {"x": rnd(2, 3, 4)}, outs, 9, inits, "training")


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 4, 5)])
@pytest.mark.parametrize("opset", [6, 22])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_instance_norm(shape, opset, dtype):
    C = shape[1]
    check_node("InstanceNormalization", {"x": rnd(*shape, dtype=dtype)},
               initializers={"s": rnd(C, dtype=dtype), "b": rnd(C, dtype=dtype)}, epsilon=1e-4,
               opset=opset if dtype != np.float16 else 6, **tol(dtype))


@pytest.mark.parametrize("shape,axis", [((2, 3, 4), -1), ((2, 3, 4), 1), ((2, 3, 4), 0), ((4, 6), -1),
                                        ((2, 3, 4, 5), 2), ((2, 3, 4, 5), -3)])
@pytest.mark.parametrize("with_bias", [0, 1])
@pytest.mark.parametrize("n_out", [1, 3])
def test_layer_norm(shape, axis, with_bias, n_out):
    nshape = shape[axis:] if axis >= 0 else shape[len(shape) + axis:]
    inits = {"s": rnd(*nshape)}
    if with_bias:
        inits["b"] = rnd(*nshape)
    outs = ("y", "mean", "inv")[:n_out]
    check_node("LayerNormalization", {"x": rnd(*shape)}, outs, initializers=inits, axis=axis, epsilon=1e-3,
               opset=17, **F32)


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_layer_norm_dtypes(dtype):
    check_node("LayerNormalization", {"x": rnd(3, 8, dtype=dtype)}, ("y", "mean", "inv"),
               initializers={"s": rnd(8, dtype=dtype), "b": rnd(8, dtype=dtype)}, opset=17,
               **(tol(dtype) if dtype == np.float16 else F32))


def test_layer_norm_scale_broadcast_and_only_inv():
    # scale broadcast from a lower rank; only InvStdDev wanted (Mean omitted)
    check_node("LayerNormalization", {"x": rnd(2, 3, 4)}, ("y", "", "inv"), initializers={"s": rnd(4)},
               axis=1, opset=17, **F32)


def test_layer_norm_stash_type_declined():
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y"], stash_type=16)
    expect_declined([node], {"x": rnd(2, 4)}, ["y"], 17, {"s": rnd(4)}, "stash_type 16")


@pytest.mark.parametrize("shape,groups", [((2, 6, 4), 3), ((2, 6, 3, 4), 2), ((1, 4, 2, 2, 3), 4), ((2, 6, 5), 1)])
@pytest.mark.parametrize("opset", [21, 22])
def test_group_norm(shape, groups, opset):
    # opset 21: scale/bias per channel (opset 18's per-group form: test_legacy.py)
    check_node("GroupNormalization", {"x": rnd(*shape)}, initializers={"s": rnd(shape[1]), "b": rnd(shape[1])},
               num_groups=groups, epsilon=1e-3, opset=opset, **F32)


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_group_norm_dtypes(dtype):
    check_node("GroupNormalization", {"x": rnd(2, 4, 5, dtype=dtype)},
               initializers={"s": rnd(4, dtype=dtype), "b": rnd(4, dtype=dtype)}, num_groups=2, opset=21,
               **(tol(dtype) if dtype == np.float16 else F32))


def naive_lrn(x, size, alpha, beta, bias):
    C = x.shape[1]
    xd = x.astype(np.float64)
    sq = np.zeros_like(xd)
    for c in range(C):
        lo, hi = max(0, c - (size - 1) // 2), min(C - 1, c + int(np.ceil((size - 1) / 2)))
        sq[:, c] = np.sum(xd[:, lo:hi + 1] ** 2, axis=1)
    return (xd / (bias + alpha / size * sq) ** beta).astype(x.dtype)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("shape", [(2, 7, 3, 4), (1, 5, 6, 2), (1, 5, 6), (1, 4, 2, 3, 2)])
@pytest.mark.parametrize("opset", [1, 13])
def test_lrn(size, shape, opset):
    x = rnd(*shape)
    kw = dict(size=size, alpha=0.01, beta=0.6, bias=1.5, opset=opset, **F32)
    if len(shape) == 4 and size % 2:
        check_node("LRN", {"x": x}, **kw)
    else:  # onnxruntime runs only 4-D LRN with an odd size (onnx.reference is broken): the spec formula
        node_check("LRN", {"x": x}, oracle=lambda f: [naive_lrn(x, size, 0.01, 0.6, 1.5)], **kw)


@pytest.mark.parametrize("dtype", [np.float16])  # onnxruntime has no float64 LRN
def test_lrn_dtypes(dtype):
    check_node("LRN", {"x": rnd(1, 6, 3, 3, dtype=dtype)}, size=3, opset=13, **tol(dtype))


# ------------------------------------------------------------------------------ softmax family

@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset", [1, 11, 13])
@pytest.mark.parametrize("shape,axis", [((3, 4), None), ((2, 3, 4), 0), ((2, 3, 4), 1), ((2, 3, 4), 2),
                                        ((2, 3, 4), -1), ((2, 3, 4, 5), -2), ((5,), 0)])
def test_softmax_family(op, opset, shape, axis):
    if opset == 1 and axis is not None and axis < 0:
        axis = len(shape) + axis  # negative axes arrive with opset 11
    kw = {} if axis is None else {"axis": axis}
    x = rnd(*shape, scale=3)
    if op == "Hardmax":
        x = np.round(x)  # ties: the first maximum wins
    check_node(op, {"x": x}, opset=opset, **kw, **F32)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_softmax_dtypes(op, dtype):
    check_node(op, {"x": rnd(3, 5, dtype=dtype)}, opset=13, **tol(dtype))


def test_softmax_large_values():
    check_node("Softmax", {"x": rnd(2, 6, scale=500)}, opset=13, **F32)
    check_node("LogSoftmax", {"x": rnd(2, 6, scale=500)}, opset=13, **F32)


# ------------------------------------------------------------------------------ Dropout

@pytest.mark.parametrize("opset,with_mask", [(o, m) for o in (7, 10, 12, 13, 22) for m in (False, True)
                                             if not (o < 12 and m)])  # the mask of Dropout-7/10 is declined
def test_dropout_inference(opset, with_mask):
    outs = ("y", "mask") if with_mask else ("y",)
    check_node("Dropout", {"x": rnd(3, 4)}, outs, opset=opset, ratio=0.3) if opset < 12 else \
        check_node("Dropout", {"x": rnd(3, 4)}, outs, opset=opset)


def test_dropout_10_mask_declined():
    node = helper.make_node("Dropout", ["x"], ["y", "mask"])
    expect_declined([node], {"x": rnd(3, 4)}, ["y", "mask"], 10, None, "Dropout-10 mask output is not implemented")


@pytest.mark.parametrize("opset", [12, 13, 22])
def test_dropout_inputs_training_false(opset):
    check_node("Dropout", {"x": rnd(3, 4)}, ("y", "mask"),
               initializers={"r": np.array(0.4, np.float32), "t": np.array(False)}, opset=opset)


@pytest.mark.parametrize("ratio", [0.0, 0.25, 0.75])
def test_dropout_training(ratio):
    x = np.abs(rnd(200, 50)) + np.float32(0.1)
    node = helper.make_node("Dropout", ["x", "r", "t"], ["y", "mask"], seed=3)
    model = make_model([node], {"x": x}, ["y", "mask"], opset=13,
                       initializers={"r": np.array(ratio, np.float32), "t": np.array(True)})
    (y, mask), _ = run_ours(model, {"x": x})
    assert y.dtype == np.float32 and mask.dtype == np.bool_
    scale = np.float32(1.0 / (1.0 - ratio))
    np.testing.assert_allclose(y[mask], x[mask] * scale, rtol=1e-6)
    assert not y[~mask].any()
    assert abs((~mask).mean() - ratio) < 0.03


# ------------------------------------------------------------------------------ Resize / Upsample

def resize_node(opset, roi=False, scales=False, sizes=False, **attrs):
    if opset == 10:
        return helper.make_node("Resize", ["x", "scales"], ["y"], **attrs)
    ins = ["x", "roi" if roi else "", "scales" if scales else "", "sizes" if sizes else ""]
    while ins[-1] == "":
        ins.pop()
    return helper.make_node("Resize", ins, ["y"], **attrs)


def run_resize(x, opset, scales=None, sizes=None, roi=None, rtol=1e-4, atol=1e-5, **attrs):
    inits = {}
    if roi is not None:
        inits["roi"] = np.asarray(roi, np.float32)
    if scales is not None:
        inits["scales"] = np.asarray(scales, np.float32)
    if sizes is not None:
        inits["sizes"] = np.asarray(sizes, np.int64)
    if opset == 11 and "roi" not in inits:  # roi and scales are required inputs in opset 11
        inits["roi"] = np.zeros(0, np.float32)
    if opset == 11 and "scales" not in inits:
        inits["scales"] = np.zeros(0, np.float32)
    node = resize_node(opset, roi="roi" in inits, scales="scales" in inits, sizes="sizes" in inits, **attrs)
    oracle = None
    if (attrs.get("coordinate_transformation_mode") == "align_corners" and scales is not None
            and any(float(np.float32(s) * np.float32(d)) % 1 for s, d in zip(scales, x.shape))):
        # a scale that does not land on an integer size: align_corners divides by
        # length_resized = scale * length_original (fractional), as the spec's
        # "scale = length_resized / length_original" and the ONNX reference (the backend
        # suite's expected data) have it; onnxruntime uses the integer output length instead
        model = make_model([node], {"x": x}, ["y"], opset=opset, initializers=inits)

        def oracle(feeds):
            from onnx.reference import ReferenceEvaluator

            return ReferenceEvaluator(model).run(None, feeds)
    return run_model([node], {"x": x}, ["y"], opset=opset, initializers=inits, rtol=rtol, atol=atol,
                     oracle=oracle)


CTMS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
SCALE_SETS = [[1, 1, 2, 2], [1, 1, 0.5, 0.5], [1, 1, 1.7, 0.6], [1, 1, 3, 1], [1, 1, 0.8, 2.5]]
SIZE_SETS = [[1, 2, 10, 12], [1, 2, 3, 3], [1, 2, 7, 13], [1, 2, 1, 4]]


@pytest.mark.parametrize("ctm", CTMS)
@pytest.mark.parametrize("nearest_mode", NEAREST_MODES)
@pytest.mark.parametrize("scales", SCALE_SETS)
def test_resize_nearest_scales(ctm, nearest_mode, scales):
    run_resize(rnd(1, 2, 5, 6), 13, scales=scales, mode="nearest", coordinate_transformation_mode=ctm,
               nearest_mode=nearest_mode)


@pytest.mark.parametrize("ctm", CTMS + ["half_pixel_symmetric"])
@pytest.mark.parametrize("nearest_mode", NEAREST_MODES)
@pytest.mark.parametrize("sizes", SIZE_SETS)
def test_resize_nearest_sizes(ctm, nearest_mode, sizes):
    if ctm == "tf_half_pixel_for_nn":
        opset = 13
    else:
        opset = 19
    run_resize(rnd(1, 2, 5, 6), opset, sizes=sizes, mode="nearest", coordinate_transformation_mode=ctm,
               nearest_mode=nearest_mode)


@pytest.mark.parametrize("ctm", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                                 "half_pixel_symmetric"])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("scales", SCALE_SETS)
def test_resize_interp_scales(ctm, mode, scales):
    run_resize(rnd(2, 3, 5, 6), 19, scales=scales, mode=mode, coordinate_transformation_mode=ctm)


@pytest.mark.parametrize("ctm", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("sizes", SIZE_SETS)
@pytest.mark.parametrize("exclude_outside", [0, 1])
def test_resize_interp_sizes(ctm, mode, sizes, exclude_outside):
    if mode == "linear" and exclude_outside:
        pytest.skip("onnxruntime rejects exclude_outside with linear (a no-op there)")
    run_resize(rnd(1, 2, 5, 6), 13, sizes=sizes, mode=mode, coordinate_transformation_mode=ctm,
               exclude_outside=exclude_outside, cubic_coeff_a=-0.5)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("scales", [[1, 1, 0.5, 0.5], [1, 1, 0.3, 0.7], [1, 1, 0.6, 1.8], [1, 1, 2, 2]])
@pytest.mark.parametrize("exclude_outside", [0, 1])
@pytest.mark.parametrize("ctm", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
def test_resize_antialias(mode, scales, exclude_outside, ctm):
    run_resize(rnd(1, 2, 10, 12), 18, scales=scales, mode=mode, antialias=1, exclude_outside=exclude_outside,
               coordinate_transformation_mode=ctm)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("roi", [[0, 0, 0.2, 0.1, 1, 1, 0.8, 0.9], [0, 0, -0.2, 0.3, 1, 1, 1.3, 0.7]])
@pytest.mark.parametrize("target", [("sizes", [1, 2, 7, 5]), ("scales", [1, 1, 1.5, 0.8])])
@pytest.mark.parametrize("extrapolation_value", [0.0, -3.5])
def test_resize_tf_crop_and_resize(mode, roi, target, extrapolation_value):
    kw = {target[0]: target[1]}
    run_resize(rnd(1, 2, 5, 6), 13, roi=roi, mode=mode, coordinate_transformation_mode="tf_crop_and_resize",
               extrapolation_value=extrapolation_value, **kw)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
@pytest.mark.parametrize("axes,sizes", [(None, [1, 2, 10, 7]), ([2, 3], [10, 7]), ([3, 2], [7, 10]), ([3], [9])])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_axes_keep_aspect_ratio(policy, axes, sizes, mode):
    kw = {"axes": axes} if axes else {}
    run_resize(rnd(1, 2, 5, 6), 18, sizes=sizes, mode=mode, keep_aspect_ratio_policy=policy, **kw)


@pytest.mark.parametrize("policy", ["stretch", "not_larger"])
def test_resize_negative_axes(policy):
    # onnxruntime mishandles negative axes: the same resize with the axes normalised is the oracle
    x = rnd(1, 2, 5, 6)
    sizes = np.array([9, 4], np.int64)

    def oracle(feeds):
        node = resize_node(18, sizes=True, mode="linear", axes=[3, 2], keep_aspect_ratio_policy=policy)
        return run_oracle(make_model([node], {"x": x}, ["y"], opset=18, initializers={"sizes": sizes}), feeds)

    node = resize_node(18, sizes=True, mode="linear", axes=[-1, -2], keep_aspect_ratio_policy=policy)
    run_model([node], {"x": x}, ["y"], opset=18, initializers={"sizes": sizes}, oracle=oracle)


@pytest.mark.parametrize("axes,scales", [([2, 3], [2.0, 0.5]), ([3], [1.5]), ([0, 2], [2.0, 3.0])])
def test_resize_axes_scales(axes, scales):
    run_resize(rnd(1, 2, 5, 6), 19, scales=scales, axes=axes, mode="nearest")
    if 0 not in axes:
        run_resize(rnd(1, 2, 5, 6), 19, scales=scales, axes=axes, mode="linear")


@pytest.mark.parametrize("opset", [10, 11, 13, 18, 19])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 2, 3], [1, 1, 0.5, 0.6], [1, 1, 1.5, 2.5]])
def test_resize_opsets(opset, mode, scales):
    run_resize(rnd(1, 2, 4, 5), opset, scales=scales, mode=mode)


@pytest.mark.parametrize("shape,scales", [((6,), [2.5]), ((4, 5), [0.5, 2]), ((2, 4, 5), [1, 2, 0.5]),
                                          ((1, 2, 3, 4, 5), [1, 1, 2, 0.5, 1.5])])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_ranks(shape, scales, mode):
    run_resize(rnd(*shape), 13, scales=scales, mode=mode)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.int64, np.uint8, np.int8])
def test_resize_nearest_dtypes(dtype):
    x = RNG.integers(0, 100, (1, 2, 4, 5)).astype(dtype)
    run_resize(x, 13, scales=[1, 1, 1.5, 0.6], mode="nearest")


def _nearest_gather_oracle(x, scales):
    """onnxruntime on the element indices (int32), mapped back to x: for types it lacks."""
    idx = np.arange(x.size, dtype=np.int32).reshape(x.shape)
    node = resize_node(13, scales=True, mode="nearest")
    model = make_model([node], {"x": idx}, ["y"], opset=13, initializers={"scales": np.asarray(scales, np.float32)})
    return x.reshape(-1)[run_oracle(model, {"x": idx})[0]]


@pytest.mark.parametrize("x", [RNG.integers(0, 2, (1, 2, 4, 5)).astype(bool),
                               np.array([["a", "bb", ""], ["ccc", "d", "e"]], dtype=object)])
def test_resize_nearest_bool_strings(x):
    scales = [1, 1, 1.5, 0.6] if x.ndim == 4 else [2.0, 1.5]
    node = resize_node(13, scales=True, mode="nearest")
    model = make_model([node], {"x": x}, ["y"], opset=13, initializers={"scales": np.asarray(scales, np.float32)})
    (y,), _ = run_ours(model, {"x": x})
    assert y.dtype == x.dtype
    assert y.tolist() == _nearest_gather_oracle(x, scales).tolist()


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_interp_dtypes(dtype, mode):
    t = tol(dtype) if dtype == np.float16 else F32
    run_resize(rnd(1, 2, 4, 5, dtype=dtype), 13, scales=[1, 1, 2, 1.5], mode=mode, **t)


def test_resize_sizes_from_graph_input():
    # sizes computed at run time (not a constant)
    x = rnd(1, 1, 4, 4)
    node = helper.make_node("Resize", ["x", "", "", "sz"], ["y"], mode="linear")
    run_model([node], {"x": x, "sz": np.array([1, 1, 7, 3], np.int64)}, ["y"], opset=13)


def test_resize_linear_int_declined():
    node = resize_node(13, scales=True, mode="linear")
    expect_declined([node], {"x": np.zeros((1, 1, 2, 2), np.int32)}, ["y"], 13,
                    {"scales": np.array([1, 1, 2, 2], np.float32)}, "mode 'linear' on int32 is not implemented")


def test_resize_half_pixel_symmetric_declined_before_19():
    node = resize_node(18, scales=True, mode="linear", coordinate_transformation_mode="half_pixel_symmetric")
    model = make_model([node], {"x": rnd(1, 1, 2, 2)}, ["y"], opset=18,
                       initializers={"scales": np.array([1, 1, 2, 2], np.float32)})
    with pytest.raises(PartitionError) as ei:
        rt.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert "half_pixel_symmetric" in str(ei.value)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 2, 2], [1, 1, 3, 1.5], [1, 1, 1, 2]])
@pytest.mark.parametrize("opset", [7, 9])
def test_upsample(mode, scales, opset):
    x = rnd(1, 2, 3, 4)
    if opset == 7:
        check_node("Upsample", {"x": x}, opset=7, mode=mode, scales=[float(v) for v in scales], **F32)
    else:
        check_node("Upsample", {"x": x}, initializers={"s": np.array(scales, np.float32)}, opset=9, mode=mode, **F32)


def test_upsample_int_nearest():
    x = RNG.integers(0, 9, (1, 1, 2, 3)).astype(np.int32)
    check_node("Upsample", {"x": x}, initializers={"s": np.array([1, 1, 2, 3], np.float32)}, opset=9)


# ------------------------------------------------------------------------------ declines / registry

def test_dtype_outside_the_schema_is_refused_at_load():
    # Conv-11 on int32 is an invalid graph (its schema allows float types only): refused at load
    # as onnxruntime does, naming the input and the allowed types
    node = helper.make_node("Conv", ["x", "w"], ["y"])
    model = make_model([node], {"x": np.zeros((1, 1, 3, 3), np.int32)}, ["y"], opset=11,
                       initializers={"w": np.zeros((1, 1, 1, 1), np.int32)})
    with pytest.raises(InvalidModelError, match=r"tensor\(int32\).*::Conv-11 accepts"):
        rt.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_every_schema_version_registered():
    from runtime_provider_cpu.registry import REGISTRY

    ops = ["MatMul", "Gemm", "Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool",
           "GlobalMaxPool", "LpPool", "GlobalLpPool", "BatchNormalization", "InstanceNormalization",
           "LayerNormalization", "GroupNormalization", "LRN", "Softmax", "LogSoftmax", "Hardmax", "Dropout",
           "Resize", "Upsample"]
    hist = {}
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain == "" and s.name in ops:
            hist.setdefault(s.name, []).append(s.since_version)
    for op in ops:
        ours = REGISTRY.versions("", op)
        assert ours, op
        newest = max(hist[op])
        assert newest in ours, (op, ours)
        # every version from the oldest we implement on is there
        assert [v for v in sorted(hist[op]) if min(ours) <= v <= newest] == ours, (op, ours, hist[op])
