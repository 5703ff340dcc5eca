"""Convolutions and pools with extreme pads, strides and dilations (issue 28, item 5): the
scratch memory follows the output, never the padded extent. Each case would need terabytes
for a padded copy of its input; the result is compared with onnxruntime where it computes
one, else with a numpy loop over the (few) output positions."""

from __future__ import annotations

import itertools
import tracemalloc

import numpy as np
import pytest
from onnx import helper

from oracle import assert_close, make_model, run_oracle, run_ours

from runtime_core.errors import InvalidModelError

RNG = np.random.default_rng(28)
BIG = 10 ** 6
#: what a case may allocate at its peak (its inputs and outputs are kilobytes)
PEAK_BYTES = 64 << 20


def rnd(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def run_bounded(model, feeds):
    """Our result, the Python allocations of the run bounded by ``PEAK_BYTES``."""
    tracemalloc.start()
    try:
        got = run_ours(model, feeds)[0]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < PEAK_BYTES, f"{peak / 2 ** 20:.0f} MiB at the peak"
    return got


def run_kernel_bounded(model, x):
    """The CPU kernel of the model's one node called directly on x (no session, so no load-time
    validation), its Python allocations bounded by ``PEAK_BYTES``."""
    from runtime_core.graph.ir import Graph
    from runtime_provider_cpu.api import KernelContext, kernel_for

    g = Graph(model if not isinstance(model, bytes) else __import__("onnx").load_from_string(model))
    (node,) = [g.node_view(n) for n in g.nodes]
    kernel = kernel_for(node.domain, node.op_type, node.since_version)
    ctx = KernelContext(node=node, n_outputs=len(node.outputs), input_dtypes=(x.dtype,), output_dtypes=(x.dtype,))
    tracemalloc.start()
    try:
        got = kernel.fn(ctx, x, **node.attrs)
        got = got[0] if isinstance(got, (tuple, list)) else got
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < PEAK_BYTES, f"{peak / 2 ** 20:.0f} MiB at the peak"
    return got


def window_reference(x, ks, strides, dilations, pb, out, fill, reduce):
    """``reduce`` over the window of each output position of x padded with ``fill`` (a loop
    over the output positions, reading only what each window covers)."""
    nd = len(ks)
    N, C = x.shape[:2]
    y = np.empty((N, C, *out), np.float64)
    for o in itertools.product(*[range(n) for n in out]):
        taps = []
        for t in itertools.product(*[range(k) for k in ks]):
            pos = [o[i] * strides[i] + t[i] * dilations[i] - pb[i] for i in range(nd)]
            inside = all(0 <= pos[i] < x.shape[2 + i] for i in range(nd))
            taps.append(x[(slice(None), slice(None)) + tuple(pos)] if inside else np.full((N, C), fill))
        y[(slice(None), slice(None)) + o] = reduce(np.stack(taps), axis=0)
    return y


def conv_model(x, w, b=None, **attrs):
    inits = {"w": w} if b is None else {"w": w, "b": b}
    node = helper.make_node("Conv", ["x"] + list(inits), ["y"], **attrs)
    return make_model([node], {"x": x}, ["y"], opset=11, initializers=inits)


CONV_CASES = [
    # (x shape, w shape, group, attrs): the padded input would be 10^12 elements a plane
    ((1, 2, 5, 6), (3, 2, 3, 3), 1, dict(pads=[BIG] * 4, strides=[BIG, BIG])),
    ((2, 3, 4, 4), (4, 3, 2, 2), 1, dict(pads=[BIG, 1, BIG, 2], strides=[BIG // 2, 1])),
    ((1, 4, 7, 7), (4, 1, 3, 3), 4, dict(pads=[BIG] * 4, strides=[BIG, BIG])),     # depthwise
    ((1, 2, 7, 7), (3, 2, 2, 2), 1, dict(pads=[BIG // 2] * 4, dilations=[BIG, BIG])),
    ((1, 3, 6, 6), (5, 3, 1, 1), 1, dict(pads=[BIG] * 4, strides=[BIG, BIG])),     # 1x1
    ((1, 4, 6, 6), (6, 2, 3, 3), 2, dict(pads=[BIG, 1, BIG, 1], strides=[BIG, 3])),  # grouped
    ((1, 2, 9), (3, 2, 3), 1, dict(pads=[BIG, BIG], strides=[BIG])),                 # 1-D
    ((1, 2, 3, 4, 5), (2, 2, 2, 2, 2), 1, dict(pads=[BIG] * 6, strides=[BIG] * 3)),  # 3-D
]


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("xs,ws,group,attrs", CONV_CASES)
def test_conv_with_extreme_geometry_matches_onnxruntime(xs, ws, group, attrs, native, cpu_policy):
    if not native:
        cpu_policy(native=None)  # the numpy paths, as a build without the extension
    x, w, b = rnd(*xs), rnd(*ws), rnd(ws[0])
    model = conv_model(x, w, b, group=group, **attrs)
    got = run_bounded(model, {"x": x})
    assert_close(got, run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-5)
    for _ in range(2):  # a second and third run: the node's plan (or its absence)
        assert_close(run_bounded(model, {"x": x}), got, rtol=0, atol=0)


@pytest.mark.parametrize("xs,ws,attrs", [
    ((1, 2, 3, 3), (2, 3, 2, 2), dict(strides=[BIG, BIG], pads=[BIG - 1] * 4)),
    ((1, 2, 3, 4), (2, 2, 3, 2), dict(strides=[BIG, 2], dilations=[BIG, 1], pads=[2 * BIG - 2, 0, 2 * BIG - 2, 1])),
    ((2, 1, 4), (1, 2, 3), dict(strides=[BIG], pads=[BIG + 3, BIG + 1])),
])
def test_conv_transpose_with_extreme_strides_matches_onnxruntime(xs, ws, attrs):
    # the full (uncropped) result would be 10^12 elements a plane; only the output is built
    x, w = rnd(*xs), rnd(*ws)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], **attrs)
    model = make_model([node], {"x": x}, ["y"], opset=11, initializers={"w": w})
    assert_close(run_bounded(model, {"x": x}), run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[3, 3], strides=[BIG, BIG]),
    dict(kernel_shape=[2, 3], strides=[2 ** 40, 1], pads=[1, 1, 0, 2]),
    dict(kernel_shape=[2, 2], dilations=[3, 2], strides=[1, 2 ** 40], ceil_mode=1),
])
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
def test_pool_with_extreme_strides_matches_onnxruntime(op, attrs):
    # strides and dilations far past any the compiled kernels are for: onnxruntime's result
    if op != "MaxPool" and "dilations" in attrs:
        attrs = {k: v for k, v in attrs.items() if k not in ("dilations", "ceil_mode")}
    x = rnd(2, 3, 9, 11)
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    model = make_model([node], {"x": x}, ["y"], opset=19 if op != "LpPool" else 18)
    assert_close(run_bounded(model, {"x": x}), run_oracle(model, {"x": x}), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("op,fill,reduce", [("MaxPool", -np.inf, np.max), ("AveragePool", 0.0, np.mean)])
def test_pool_with_pads_past_the_kernel_reads_only_the_windows(op, fill, reduce, native, cpu_policy):
    # pads of a million around a 5 x 6 image (onnxruntime refuses pads not smaller than the
    # kernel; the spec does not): windows of padding only give -inf (MaxPool) or the mean
    # of the counted pads (AveragePool, count_include_pad=1)
    if not native:
        cpu_policy(native=None)
    x = rnd(1, 2, 5, 6)
    ks, strides, pads = [3, 3], [BIG // 2, BIG // 2], [BIG, BIG, BIG, BIG]
    attrs = dict(kernel_shape=ks, strides=strides, pads=pads)
    if op == "AveragePool":
        attrs["count_include_pad"] = 1
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    model = make_model([node], {"x": x}, ["y"], opset=19)
    # sessions refuse such pads at load, as onnxruntime does (graph/validate.py); the kernel
    # itself must still read only the windows, whoever calls it
    with pytest.raises(InvalidModelError, match="must be smaller than 'kernel_shape'"):
        run_ours(model, {"x": x})
    got = run_kernel_bounded(model, x)
    out = [(5 + 2 * BIG - 3) // (BIG // 2) + 1, (6 + 2 * BIG - 3) // (BIG // 2) + 1]
    want = window_reference(x, ks, strides, [1, 1], pads[:2], out, fill, reduce)
    assert got.shape == want.shape == (1, 2, *out)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert np.isfinite(got).any() and (op != "MaxPool" or np.isneginf(got).any())


@pytest.mark.parametrize("size", [3, 5, 2**20 + 1, 2**31 - 1])
def test_lrn_with_a_huge_size_is_linear_in_the_channels(size):
    # LRN's window past the channels reads zeros: a size of 2**31 - 1 must not loop or pad that
    # far (onnxruntime asks for 72 GiB there); the reference sums each channel's window directly
    x = rnd(2, 6, 3, 3)
    alpha, beta, bias = 1e-3, 0.75, 1.0
    node = helper.make_node("LRN", ["x"], ["y"], size=size, alpha=alpha, beta=beta, bias=bias)
    got = run_bounded(make_model([node], {"x": x}, ["y"], opset=13), {"x": x})[0]
    assert got.shape == x.shape
    x64 = x.astype(np.float64)
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sums = np.stack([(x64[:, max(0, c - lo):c + hi + 1] ** 2).sum(axis=1) for c in range(x.shape[1])], axis=1)
    want = x64 / (bias + alpha / size * sums) ** beta
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _clipped_window_max(x, k, pb, axis):
    """MaxPool of stride 1 along ``axis`` with a window of k taps starting pb before each
    output: the max over the window's part inside x (never iterating over k)."""
    size = x.shape[axis]
    outs = []
    for o in range(size):
        lo, hi = max(0, o - pb), min(size - 1, o - pb + k - 1)
        outs.append(np.take(x, range(lo, hi + 1), axis=axis).max(axis=axis))
    return np.stack(outs, axis=axis)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("k", [7, 2**31, 2**40, 2**62])
def test_maxpool_with_a_huge_same_padded_kernel_costs_what_its_input_costs(k, auto_pad):
    # a kernel of 2**62 taps over a 5 x 6 image: only the taps that read the image are visited
    # (the reduction once looped over all k taps: a hang)
    x = rnd(1, 2, 5, 6)
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[k, 2], auto_pad=auto_pad)
    model = make_model([node], {"x": x}, ["y"], opset=12)
    (got,) = run_bounded(model, {"x": x})
    if k == 7:  # onnxruntime computes the small kernel: it must agree with the reference below
        assert_close(got, run_oracle(model, {"x": x})[0])
    want = x.astype(np.float64)
    for axis, kk in ((2, k), (3, 2)):
        total = kk - 1  # stride 1: SAME pads k - 1 in all
        pb = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        want = _clipped_window_max(want, kk, pb, axis)
    assert got.shape == want.shape == x.shape
    np.testing.assert_array_equal(got, want.astype(np.float32))
