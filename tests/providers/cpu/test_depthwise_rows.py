"""Depthwise convolutions wide enough that the phase-plane kernel writes row vectors (16 or
more outputs a row: its planes' rows padded to whole vectors, the stride-2 fill taking whole
32-column chunks), through a session against onnxruntime: stride 1 and 2, even and odd input
sizes, symmetric and one-sided pads, a fused activation, each compiled plan forced, 1 and 2
threads."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import runtime_core as rt
from oracle import assert_close, make_model, run_oracle

RNG = np.random.default_rng(31)

# (N, C, H, W), kernel, stride, pads (top, left, bottom, right), activation after the conv
CASES = [
    ((1, 24, 112, 112), 3, 2, [1, 1, 1, 1], "HardSwish"),  # MobileNetV3's 64x112 node, narrower
    ((2, 20, 37, 99), 3, 2, [1, 1, 1, 1], "Relu"),         # odd sizes: 32-column chunks, then a tail
    ((1, 18, 50, 66), 5, 2, [2, 2, 2, 2], None),           # 5x5 stride 2, even sizes
    ((1, 17, 41, 70), 3, 2, [0, 1, 1, 0], "HardSwish"),    # one-sided pads: odd plane offsets
    ((1, 16, 33, 47), 3, 1, [1, 1, 1, 1], "Relu"),         # stride 1, rows of 47 -> 48
    ((1, 12, 20, 35), 7, 1, [3, 2, 3, 4], None),           # 7x7, uneven pads
]


def _model(shape, k, s, pads, act):
    C = shape[1]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if act else "y"], group=C, strides=[s, s], pads=pads,
                              kernel_shape=[k, k])]
    if act:
        nodes.append(helper.make_node(act, ["c"], ["y"]))
    x = RNG.standard_normal(shape).astype(np.float32)
    w = (RNG.standard_normal((C, 1, k, k)) * 0.3).astype(np.float32)
    b = RNG.standard_normal(C).astype(np.float32)
    return make_model(nodes, {"x": x}, ["y"], opset=14, initializers={"w": w, "b": b}), x, w, b


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", ["depthwise", "depthwise_lanes"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_wide_depthwise_matches_onnxruntime(case, name, threads, cpu_policy):
    from runtime_provider_cpu.fast import policy

    if policy.NATIVE is None:
        pytest.skip(policy.NATIVE_ERROR)
    if name == "depthwise_lanes" and not getattr(policy.NATIVE, "CONV_FAST", 0):
        pytest.skip("the lanes kernel is the AVX-512 build's (CONV_FAST): not offered on this CPU or ISA cap")
    model, x, _, _ = _model(*CASES[case])
    cpu_policy(conv_kernel=name)
    so = rt.SessionOptions()
    so.intra_op_num_threads = threads
    sess = rt.InferenceSession(model.SerializeToString(), so, providers=["cpu"])
    got = sess.run(None, {"x": x})
    assert_close(got, run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-5)
    assert list(sess.get_partition_report().kernels.values()) == [name]


@pytest.mark.parametrize("case", [0, 3, 4])
def test_wide_depthwise_portable_path_matches_onnxruntime(case, cpu_policy):
    # the same convolutions without the compiled kernels' fast path: the portable plane kernel
    from runtime_provider_cpu import _native

    shape, k, s, pads, _ = CASES[case]
    pt, pl, pb, pr = pads
    model, x, w, b = _model(shape, k, s, pads, None)
    OH, OW = (shape[2] + pt + pb - k) // s + 1, (shape[3] + pl + pr - k) // s + 1
    want = run_oracle(model, {"x": x})[0]
    for fast in (True, False):
        y = np.full((shape[0], shape[1], OH, OW), np.nan, np.float32)
        _native.depthwise2d(x, w, b, y, x.shape, (OH, OW), (k, k), (s, s), (1, 1), (pt, pl), -np.inf, np.inf, 2,
                            fast)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
