"""FusedConv's HardSwish, HardSigmoid, Sigmoid and SiLU applied with the convolution (the
depthwise and pointwise kernels' epilogues, a compiled pass after the others' plans), each
plan forced, against onnxruntime running the unfused Conv + activation."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import runtime_core as rt
from oracle import assert_close, cpu_policy, make_model, record_plan_kinds, run_oracle  # noqa: F401 - a fixture

CPU = ["CPUExecutionProvider"]
RNG = np.random.default_rng(27)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def act_nodes(act, src, out):
    """``act`` of ``src`` as an exporter writes it (SiLU: c * Sigmoid(c))."""
    if act == "SiLU":
        return [helper.make_node("Sigmoid", [src], ["sg"]), helper.make_node("Mul", [src, "sg"], [out])]
    if act == "HardSigmoid":
        return [helper.make_node("HardSigmoid", [src], [out], alpha=0.3, beta=0.4)]
    return [helper.make_node(act, [src], [out])]


# (plan kind, x shape, W shape, group, strides, pads)
CASES = [
    ("pointwise", (1, 24, 10, 13), (40, 24, 1, 1), 1, (1, 1), (0, 0, 0, 0)),
    ("pointwise_sgemm", (2, 24, 10, 13), (40, 24, 1, 1), 1, (1, 1), (0, 0, 0, 0)),
    ("depthwise", (1, 24, 19, 21), (24, 1, 3, 3), 24, (1, 1), (1, 1, 1, 1)),
    ("depthwise", (2, 20, 17, 17), (20, 1, 5, 5), 20, (2, 2), (2, 2, 2, 2)),
    ("depthwise_lanes", (1, 40, 7, 7), (40, 1, 5, 5), 40, (1, 1), (2, 2, 2, 2)),
    ("depthwise_lanes", (1, 18, 9, 9), (18, 1, 3, 3), 18, (2, 2), (1, 1, 1, 1)),
    ("direct", (1, 3, 32, 32), (16, 3, 3, 3), 1, (2, 2), (1, 1, 1, 1)),
    ("im2col", (1, 3, 32, 32), (16, 3, 3, 3), 1, (2, 2), (1, 1, 1, 1)),
]


@pytest.mark.native
@pytest.mark.parametrize("act", ["HardSwish", "SiLU", "Sigmoid", "HardSigmoid"])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[2][2]}x{c[2][3]}-s{c[4][0]}-n{c[1][0]}" for c in CASES])
def test_activation_with_each_conv_plan_matches_onnxruntime(case, act, monkeypatch, cpu_policy):
    from runtime_provider_cpu.fast import policy

    kind, xs, ws, group, strides, pads = case
    assert policy.NATIVE is not None, "runtime_provider_cpu._native did not build"
    if kind == "depthwise_lanes" and not getattr(policy.NATIVE, "CONV_FAST", 0):
        pytest.skip("the lanes depthwise kernel is the AVX-512 build's")
    if kind == "pointwise_sgemm":  # the pointwise plan on SciPy's sgemm (the lanes kernel off)
        from runtime_provider_cpu.fast.sgemm import sgemm_ready

        if not sgemm_ready():
            pytest.skip("no sgemm for the pointwise kernel")
        kind = "pointwise"
        cpu_policy(direct=True, conv_kernel=kind, pw_lanes=False)
    else:
        cpu_policy(direct=True, conv_kernel=kind)
    acts = []
    planned = record_plan_kinds(monkeypatch, check=lambda p: acts.append(p.act))
    x = f32(*xs) * 3  # both bounds of the hard forms reached
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=group, strides=list(strides), pads=list(pads))]
    nodes += act_nodes(act, "c", "y")
    m = make_model(nodes, {"x": x}, ["y"], opset=17, initializers={"w": f32(*ws), "b": f32(ws[0])})
    ref = run_oracle(m, {"x": x})
    s = rt.InferenceSession(m.SerializeToString(), providers=CPU)
    assert [n.op_type for n in s._graph.nodes] == ["FusedConv"]
    for _ in range(3):  # the first run (plan made), then the bound step
        assert_close(s.run(None, {"x": x}), ref, rtol=1e-4, atol=1e-5)
    assert planned and set(planned) == {kind}, planned
    assert all(a is not None for a in acts)  # the activation went with the plan


@pytest.mark.kernel
@pytest.mark.native
@pytest.mark.parametrize("fn", ["depthwise2d", "pointwise_lanes"])
def test_kernels_refuse_an_unknown_activation_kind(fn):
    from runtime_provider_cpu.fast.policy import NATIVE as nat

    x = np.ones((1, 4, 5, 5), np.float32)
    y = np.empty((1, 4, 5, 5), np.float32)
    if fn == "depthwise2d":
        call = lambda k: nat.depthwise2d(x, np.ones((4, 1, 3, 3), np.float32), None, y, x.shape, (5, 5), (3, 3),  # noqa: E731
                                         (1, 1), (1, 1), (1, 1), -np.inf, np.inf, 1, True, False, k, 0.2, 0.5)
    else:
        from runtime_provider_cpu.fast.packing import pack_rows

        w12 = pack_rows(np.ones((4, 4), np.float32))
        call = lambda k: nat.pointwise_lanes(w12, x, None, None, y, (4, 4, 25), -np.inf, np.inf, 1, k,  # noqa: E731
                                             0.2, 0.5)
    for bad in (4, -2):
        with pytest.raises(ValueError, match="activation kind"):
            call(bad)
    call(1)  # HardSigmoid(0.2, 0.5) of 4 or 9 (1x1 of four ones; 3x3 of ones, padded)
    assert np.isin(y, np.float32(1.0)).all()


# -- SqueezeExcite on _native.squeeze_excite ---------------------------------------------------

def _se_model(act, gate, n, c, cr, hw):
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]), helper.make_node("Conv", ["p", "w1", "b1"], ["c1"])]
    nodes += act_nodes(act, "c1", "a1") if act != "Relu" else [helper.make_node("Relu", ["c1"], ["a1"])]
    nodes += [helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"]), helper.make_node(gate, ["c2"], ["g"]),
              helper.make_node("Mul", ["x", "g"], ["y"])]
    x = f32(n, c, hw, hw)
    inits = {"w1": f32(cr, c, 1, 1) * 0.3, "b1": f32(cr), "w2": f32(c, cr, 1, 1) * 0.3, "b2": f32(c)}
    return make_model(nodes, {"x": x}, ["y"], opset=17, initializers=inits), {"x": x}


@pytest.mark.native
@pytest.mark.parametrize("act,gate", [("Relu", "HardSigmoid"), ("SiLU", "Sigmoid"), ("HardSwish", "HardSigmoid")])
# (8, 256, 128, 12, 2): every pass large enough (64 KB a thread) to be split over 2 threads
@pytest.mark.parametrize("n,c,cr,hw,threads", [(1, 40, 10, 9, 1), (3, 96, 24, 17, 2), (2, 19, 5, 3, 2),
                                               (8, 256, 128, 12, 2)])
def test_squeeze_excite_kernel_split_over_threads_matches_onnxruntime(act, gate, n, c, cr, hw, threads):
    m, feeds = _se_model(act, gate, n, c, cr, hw)
    so = rt.SessionOptions()
    so.intra_op_num_threads = threads
    s = rt.InferenceSession(m.SerializeToString(), so, providers=CPU)
    assert [nd.op_type for nd in s._graph.nodes] == ["SqueezeExcite"]
    ref = run_oracle(m, feeds)
    for _ in range(2):
        assert_close(s.run(None, feeds), ref, rtol=1e-5, atol=1e-5)


def _se_reference(x, w1, b1, w2, b2, gate):
    """Relu inside, ``gate`` (HardSigmoid 1/6, 0.5 or Sigmoid) outside, in float64."""
    s = x.astype(np.float64).mean(axis=(2, 3))
    h = np.maximum(s @ w1.reshape(w1.shape[0], -1).T.astype(np.float64) + b1, 0.0)
    g = h @ w2.reshape(w2.shape[0], -1).T.astype(np.float64) + b2
    g = 1 / (1 + np.exp(-g)) if gate == "Sigmoid" else np.clip(g / 6 + 0.5, 0, 1)
    return x * g[:, :, None, None]


@pytest.mark.native
@pytest.mark.parametrize("gate", ["HardSigmoid", "Sigmoid"])
# channel and reduced counts off the four-row dot products' multiple; planes off 8 and 16; the
# larger ones (over 256 KB a pass) split over the threads
@pytest.mark.parametrize("n,c,cr,hw", [(1, 9, 3, 5), (2, 130, 33, 10), (1, 962, 241, 7), (3, 150, 7, 31)])
def test_squeeze_excite_kernel_same_bits_at_any_thread_count_and_as_numpy_path(monkeypatch, gate, n, c, cr, hw):
    from runtime_provider_cpu.ops import fused

    x = f32(n, c, hw, hw)
    w1, b1, w2, b2 = f32(cr, c, 1, 1) * 0.1, f32(cr), f32(c, cr, 1, 1) * 0.1, f32(c)
    gp = [1 / 6, 0.5] if gate == "HardSigmoid" else []
    ys = [fused._squeeze_excite(x, w1, b1, w2, b2, "Relu", [], gate, gp, None, t) for t in (1, 2, 3)]
    for y in ys[1:]:
        np.testing.assert_array_equal(y, ys[0])
    np.testing.assert_allclose(ys[0], _se_reference(x, w1, b1, w2, b2, gate), rtol=2e-5, atol=2e-6)
    monkeypatch.setattr(fused, "_native", None)  # the numpy path: the same block, other rounding
    np.testing.assert_allclose(fused._squeeze_excite(x, w1, b1, w2, b2, "Relu", [], gate, gp, None, 2), ys[0],
                               rtol=2e-5, atol=2e-6)


@pytest.mark.kernel
@pytest.mark.native
def test_squeeze_excite_kernel_pools_its_large_passes_only():
    from runtime_provider_cpu.fast.policy import NATIVE as nat

    started = 4  # pool_stats(): parts of jobs asking for several threads, ever
    act = (0.0, np.inf, -1, 0.0, 0.0, 1, 1 / 6, 0.5)

    def pooled_parts(c, cr, hw, threads):
        x, w1, w2 = f32(1, c, hw, hw), f32(cr, c), f32(c, cr)
        y = np.empty_like(x)
        before = nat.pool_stats()[started]
        nat.squeeze_excite(x, w1, None, w2, None, y, (1, c, cr, hw * hw), *act, threads)
        return nat.pool_stats()[started] - before

    assert pooled_parts(72, 24, 8, 2) == 0  # a few KB a pass: on the caller alone
    assert pooled_parts(960, 240, 7, 1) == 0  # one thread asked
    # MobileNetV3's last blocks: the 0.9 MB weight matrices' passes split (a flops count kept them whole)
    assert pooled_parts(960, 240, 7, 2) > 0


@pytest.mark.kernel
@pytest.mark.native
def test_squeeze_excite_kernel_checks_its_arguments():
    from runtime_provider_cpu.fast.policy import NATIVE as nat

    x = np.ones((1, 4, 3, 3), np.float32)
    w1, w2, y = np.ones((2, 4), np.float32), np.ones((4, 2), np.float32), np.empty((1, 4, 3, 3), np.float32)
    ok = (-np.inf, np.inf, -1, 0.0, 0.0, 2, 0.0, 0.0, 1)
    with pytest.raises(ValueError, match="activation kind"):
        nat.squeeze_excite(x, w1, None, w2, None, y, (1, 4, 2, 9), -np.inf, np.inf, 4, 0.0, 0.0, 2, 0.0, 0.0, 1)
    with pytest.raises(ValueError, match="W2"):
        nat.squeeze_excite(x, w1, None, w2[:3], None, y, (1, 4, 2, 9), *ok)
    with pytest.raises(ValueError, match="positive"):
        nat.squeeze_excite(x, w1, None, w2, None, y, (1, 4, 0, 9), *ok)
    nat.squeeze_excite(x, w1, None, w2, None, y, (1, 4, 2, 9), *ok)
    # mean 1, h = 4, g = sigmoid(8): every output x * g
    np.testing.assert_allclose(y, np.full(y.shape, 1 / (1 + np.exp(-8.0))), rtol=1e-6)
