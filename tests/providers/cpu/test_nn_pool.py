"""CPU provider nn kernels against onnxruntime (the oracle), node by node: MaxPool,
AveragePool, LpPool and the global pools.

Where onnxruntime departs from the ONNX spec (SAME padding with dilation or a
too-small kernel), an independent naive loop implementation of the spec is the oracle instead.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import helper

from oracle import check_node, cpu_policy, make_model, run_oracle  # noqa: F401 - a fixture
from providers.cpu.nn_cases import F32, RNG, expect_declined, node_check, rnd, run_model, tol


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


@pytest.mark.kernel
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


@pytest.mark.kernel
@pytest.mark.native
@pytest.mark.parametrize("rows,n", [(1, 1), (3, 7), (960, 49), (37, 16), (5, 3137), (2048, 49)])
def test_row_means_kernel_matches_float64_and_is_the_same_at_any_thread_count(rows, n):
    """``_native.row_means`` (GlobalAveragePool's float32 pass): within float32 summation error of
    the float64 mean, the same bits on 1, 2 and 3 threads (rows split, each summed alike)."""
    from runtime_provider_cpu import _native

    x = (RNG.standard_normal((rows, n)) + 3.0).astype(np.float32)
    ys = []
    for threads in (1, 2, 3):
        y = np.full(rows, np.nan, np.float32)
        _native.row_means(x, y, (rows, n), threads)
        ys.append(y)
    for y in ys[1:]:
        np.testing.assert_array_equal(y, ys[0])
    np.testing.assert_allclose(ys[0], x.astype(np.float64).mean(axis=1), rtol=2e-6)
    with pytest.raises(ValueError, match="row length"):
        _native.row_means(x, ys[0], (rows, 0))
    with pytest.raises(ValueError, match="Y"):
        _native.row_means(x, ys[0][:-1] if rows > 1 else np.empty(0, np.float32), (rows, n))


@pytest.mark.parametrize("shape", [(1, 960, 7, 7), (2, 19, 5, 3), (1, 3, 1, 1)])
def test_global_average_pool_float32_with_and_without_the_extension(cpu_policy, shape):
    """The compiled pass and numpy's row sums give GlobalAveragePool within a rounding."""
    x = rnd(*shape)
    check_node("GlobalAveragePool", {"x": x}, opset=17)
    cpu_policy(native=None)
    check_node("GlobalAveragePool", {"x": x}, opset=17)
