"""The blocked layout (NCHW16c) path: each kernel against a float64 reference of the NCHW op,
the partition rewrite (``fast/nchwc.regions``) on small models against onnxruntime, the session
entry that turns it off, and the corpus's depthwise-separable models against onnxruntime."""

from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import helper

import runtime_core as rt
from oracle import assert_close, compiled_partitions, make_model, run_oracle

RNG = np.random.default_rng(27)
INF = float("inf")


def _nchwc():
    from runtime_provider_cpu.fast import nchwc

    if not nchwc.available():
        pytest.skip("the blocked kernels need the AVX-512 build (_native.NCHWC)")
    return nchwc


def f32(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


# -- float64 references of the NCHW ops --------------------------------------------------------

def act64(v, epi):
    lo, hi, kind, alpha, beta = epi
    v = np.clip(v, lo, hi)
    if kind == 0:
        return v * np.clip(v / 6 + 0.5, 0, 1)
    if kind == 1:
        return np.clip(alpha * v + beta, 0, 1)
    if kind == 2:
        return 1 / (1 + np.exp(-v))
    if kind == 3:
        return v / (1 + np.exp(-v))
    return v


def depthwise64(x, w, b, strides, pads):
    n, c, h, wd = x.shape
    kh, kw = w.shape[2:]
    sh, sw = strides
    pt, pl, pb, pr = pads
    xp = np.zeros((n, c, h + pt + pb, wd + pl + pr))
    xp[:, :, pt:pt + h, pl:pl + wd] = x
    oh, ow = (h + pt + pb - kh) // sh + 1, (wd + pl + pr - kw) // sw + 1
    y = np.zeros((n, c, oh, ow)) + b.reshape(1, c, 1, 1)
    for i in range(kh):
        for j in range(kw):
            y += xp[:, :, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw] * w[:, 0, i, j].reshape(1, c, 1, 1)
    return y


EPIS = {
    "none": (-INF, INF, -1, 1 / 6, 0.5),
    "relu": (0.0, INF, -1, 1 / 6, 0.5),
    "clip": (-0.5, 0.7, -1, 1 / 6, 0.5),
    "hardswish": (-INF, INF, 0, 1 / 6, 0.5),
    "hardsigmoid": (-INF, INF, 1, 0.3, 0.4),
    "sigmoid": (-INF, INF, 2, 1 / 6, 0.5),
    "silu": (-INF, INF, 3, 1 / 6, 0.5),
}


# -- kernels -----------------------------------------------------------------------------------

@pytest.mark.native
@pytest.mark.parametrize("c,hw", [(1, 1), (16, 49), (24, 7), (40, 50), (72, 196), (33, 17)])
def test_reorder_round_trip_pads_lanes_with_zeros(c, hw):
    nchwc = _nchwc()
    x = f32(2, c, hw, 1)
    y = nchwc.to_blocked(x, threads=2)
    cb = nchwc.blocks(c)
    ref = np.zeros((2, cb * 16, hw), np.float32)
    ref[:, :c] = x.reshape(2, c, hw)
    assert np.array_equal(y, ref.reshape(2, cb, 16, hw).transpose(0, 1, 3, 2))
    assert np.array_equal(nchwc.from_blocked(y, c, (hw, 1)), x)


PW_CASES = [  # (N, C, M, H, W)
    (1, 16, 64, 7, 7), (1, 24, 40, 14, 14), (2, 40, 24, 5, 3), (1, 300, 48, 7, 7),  # 300: two K chunks
    (1, 72, 200, 1, 1), (1, 960, 160, 7, 7), (3, 8, 8, 2, 13),
]


def shapes_threads_activations(cases, epis):
    """Every shape at both thread counts, the activations taken in turn over those pairs: each
    activation then runs at both thread counts and on two or more shapes, not on all of them.
    The shape decides the blocking (channel tails, K chunks, rows per thread); the activation
    is applied lane-wise where a finished block is stored, the same code for any shape, so the
    full product (shapes x activations x threads) ran no path that this does not."""
    params = []
    for i, case in enumerate(cases):
        for threads in (1, 2):
            epi = epis[(2 * i + threads - 1) % len(epis)]
            params.append(pytest.param(case, epi, threads, id=f"{case}-{epi}-{threads}"))
    assert {p.values[1] for p in params} == set(epis)
    assert all({p.values[2] for p in params if p.values[1] == e} == {1, 2} for e in epis)
    return params


@pytest.mark.kernel
@pytest.mark.native
@pytest.mark.parametrize("case,epi,threads",
                         shapes_threads_activations(PW_CASES, ["none", "relu", "hardswish", "silu", "hardsigmoid"]))
def test_pointwise_matches_float64(case, epi, threads):
    nchwc = _nchwc()
    from runtime_provider_cpu.fast.policy import NATIVE

    n, c, m, h, w = case
    x, wt, b, z = f32(n, c, h, w), f32(m, c, 1, 1, scale=c ** -0.5), f32(m), f32(n, m, h, w)
    wp, bias = nchwc.pack_pointwise(wt, b)
    cib, cob = nchwc.blocks(c), nchwc.blocks(m)
    for zz in (None, z):
        y = np.empty((n, cob, h * w, 16), np.float32)
        NATIVE.nchwc_pointwise(nchwc.to_blocked(x), wp, bias, None if zz is None else nchwc.to_blocked(zz), y,
                               (n, cib, cob, h * w), *EPIS[epi], threads)
        ref = np.einsum("nchw,mc->nmhw", x.astype(np.float64), wt.reshape(m, c).astype(np.float64))
        ref += b.reshape(1, m, 1, 1)
        if zz is not None:
            ref += zz
        np.testing.assert_allclose(nchwc.from_blocked(y, m, (h, w)), act64(ref, EPIS[epi]), rtol=1e-4, atol=1e-4)


DW_CASES = [  # (N, C, H, W, K, stride, pads)
    (1, 16, 112, 112, 3, 1, (1, 1, 1, 1)), (1, 64, 24, 24, 3, 2, (1, 1, 1, 1)), (2, 40, 7, 7, 5, 1, (2, 2, 2, 2)),
    (1, 72, 15, 13, 5, 2, (2, 2, 2, 2)), (1, 24, 3, 3, 3, 1, (1, 1, 1, 1)), (1, 20, 9, 11, 7, 1, (3, 3, 3, 3)),
    (1, 18, 10, 9, 3, 2, (0, 0, 1, 1)), (1, 33, 6, 5, 3, 1, (0, 1, 2, 0)), (2, 8, 1, 1, 3, 1, (1, 1, 1, 1)),
]


@pytest.mark.kernel
@pytest.mark.native
@pytest.mark.parametrize("case,epi,threads",
                         shapes_threads_activations(DW_CASES, ["relu", "clip", "hardswish", "silu", "sigmoid"]))
def test_depthwise_matches_float64(case, epi, threads):
    nchwc = _nchwc()
    from runtime_provider_cpu.fast.policy import NATIVE

    n, c, h, w, k, s, pads = case
    x, wt, b = f32(n, c, h, w), f32(c, 1, k, k, scale=1 / k), f32(c)
    wp, bias = nchwc.pack_depthwise(wt, b)
    ref = act64(depthwise64(x.astype(np.float64), wt.astype(np.float64), b, (s, s), pads), EPIS[epi])
    oh, ow = ref.shape[2:]
    cb = nchwc.blocks(c)
    y = np.empty((n, cb, oh * ow, 16), np.float32)
    NATIVE.nchwc_depthwise(nchwc.to_blocked(x), wp, bias, y, (n, cb, h, w), (k, k), (s, s), pads[:2], (oh, ow),
                           *EPIS[epi], threads)
    np.testing.assert_allclose(nchwc.from_blocked(y, c, (oh, ow)), ref, rtol=1e-4, atol=1e-5)


ED_CASES = [  # (N, C, M, H, W, K, stride, pads)
    (1, 16, 64, 20, 21, 3, 2, (1, 1, 1, 1)), (2, 24, 72, 9, 9, 5, 1, (2, 2, 2, 2)), (1, 300, 40, 7, 7, 3, 1, (1, 1, 1, 1)),
    (1, 40, 120, 14, 13, 5, 2, (2, 2, 2, 2)), (1, 8, 24, 30, 3, 7, 1, (3, 3, 3, 3)),
]


@pytest.mark.kernel
@pytest.mark.native
@pytest.mark.parametrize("case", ED_CASES, ids=[str(c) for c in ED_CASES])
@pytest.mark.parametrize("threads", [1, 2])
def test_expand_depthwise_is_the_two_kernels_bit_for_bit(case, threads):
    nchwc = _nchwc()
    from runtime_provider_cpu.fast.policy import NATIVE

    n, c, m, h, w, k, s, pads = case
    x, we, be = f32(n, c, h, w), f32(m, c, 1, 1, scale=c ** -0.5), f32(m)
    wd, bd = f32(m, 1, k, k, scale=1 / k), f32(m)
    wep, bep = nchwc.pack_pointwise(we, be)
    wdp, bdp = nchwc.pack_depthwise(wd, bd)
    cib, cob = nchwc.blocks(c), nchwc.blocks(m)
    oh, ow = (h + pads[0] + pads[2] - k) // s + 1, (w + pads[1] + pads[3] - k) // s + 1
    xb = nchwc.to_blocked(x)
    e = np.empty((n, cob, h * w, 16), np.float32)
    NATIVE.nchwc_pointwise(xb, wep, bep, None, e, (n, cib, cob, h * w), *EPIS["hardswish"], threads)
    ref = np.empty((n, cob, oh * ow, 16), np.float32)
    NATIVE.nchwc_depthwise(e, wdp, bdp, ref, (n, cob, h, w), (k, k), (s, s), pads[:2], (oh, ow), *EPIS["relu"],
                           threads)
    y = np.empty_like(ref)
    NATIVE.nchwc_expand_dw(xb, wep, bep, wdp, bdp, y, (n, cib, cob, h, w), (k, k), (s, s), pads[:2], (oh, ow),
                           EPIS["hardswish"], EPIS["relu"], threads)
    assert np.array_equal(nchwc.from_blocked(y, m, (oh, ow)), nchwc.from_blocked(ref, m, (oh, ow)))


@pytest.mark.kernel
@pytest.mark.native
@pytest.mark.parametrize("n,c,cr,hw", [(1, 72, 24, 784), (2, 40, 10, 49), (1, 960, 240, 49), (1, 20, 5, 1)])
@pytest.mark.parametrize("threads", [1, 2])
def test_squeeze_excite_and_mean_match_float64(n, c, cr, hw, threads):
    nchwc = _nchwc()
    from runtime_provider_cpu.fast.policy import NATIVE

    x, w1, b1, w2, b2 = f32(n, c, hw, 1), f32(cr, c, scale=0.2), f32(cr), f32(c, cr, scale=0.3), f32(c)
    cb = nchwc.blocks(c)
    xb = nchwc.to_blocked(x)
    s = x.astype(np.float64).mean(axis=(2, 3))
    h = np.maximum(s @ w1.T + b1, 0)
    g = np.clip((h @ w2.T + b2) * 0.2 + 0.5, 0, 1)
    y = np.empty_like(xb)
    NATIVE.nchwc_se(xb, w1, b1, w2, b2, y, (n, cb, c, cr, hw), 0.0, INF, -1, 0.0, 0.0, 1, 0.2, 0.5, threads)
    np.testing.assert_allclose(nchwc.from_blocked(y, c, (hw, 1)), x * g[:, :, None, None], rtol=1e-4, atol=1e-5)
    means = np.empty((n, c), np.float32)
    NATIVE.nchwc_se(xb, None, None, None, None, means, (n, cb, c, 1, hw), -INF, INF, -1, 0, 0, -1, 0, 0, threads)
    np.testing.assert_allclose(means, s, rtol=1e-5, atol=1e-6)
    NATIVE.nchwc_se(xb, w1, b1, w2, b2, xb, (n, cb, c, cr, hw), 0.0, INF, -1, 0.0, 0.0, 1, 0.2, 0.5, threads)
    assert np.array_equal(xb, y)  # the gated product written in place


@pytest.mark.kernel
@pytest.mark.native
def test_kernels_refuse_bad_input():
    _nchwc()
    from runtime_provider_cpu.fast.policy import NATIVE

    x = np.zeros((1, 1, 49, 16), np.float32)
    y = np.zeros((1, 1, 49, 16), np.float32)
    w, b = np.zeros((1, 16, 16), np.float32), np.zeros(16, np.float32)
    with pytest.raises(ValueError, match="KW must be 3, 5 or 7"):
        NATIVE.nchwc_depthwise(x, np.zeros((1, 16, 16), np.float32), b, y, (1, 1, 7, 7), (4, 4), (1, 1), (1, 1),
                               (6, 6), -INF, INF, -1, 0.0, 0.0, 1)
    with pytest.raises(ValueError, match="W"):
        NATIVE.nchwc_depthwise(x, w, b, y, (1, 1, 7, 7), (3, 3), (1, 1), (1, 1), (7, 7), -INF, INF, -1, 0.0, 0.0, 1)
    with pytest.raises(ValueError, match="sizes must be positive"):
        NATIVE.nchwc_pointwise(x, w, b, None, y, (1, 1, 1, 0), -INF, INF, -1, 0.0, 0.0, 1)
    with pytest.raises(ValueError, match="activation kind"):
        NATIVE.nchwc_pointwise(x, np.zeros(256, np.float32), b, None, y, (1, 1, 1, 49), -INF, INF, 7, 0.0, 0.0, 1)
    with pytest.raises(ValueError, match="X"):
        NATIVE.nchwc_pointwise(x[:, :, :48], np.zeros(256, np.float32), b, None, y, (1, 1, 1, 49), -INF, INF, -1,
                               0.0, 0.0, 1)
    with pytest.raises(ValueError, match="KW must be 3, 5 or 7"):
        NATIVE.nchwc_expand_dw(x, w, b, w, b, y, (1, 1, 1, 7, 7), (3, 2), (1, 1), (1, 1), (7, 6), EPIS["none"],
                               EPIS["none"], 1)
    with pytest.raises(ValueError, match="We"):
        NATIVE.nchwc_expand_dw(x, np.zeros(100, np.float32), b, np.zeros(144, np.float32), b, y, (1, 1, 1, 7, 7),
                               (3, 3), (1, 1), (1, 1), (7, 7), EPIS["none"], EPIS["none"], 1)
    with pytest.raises(ValueError, match="C does not fit"):
        NATIVE.nchwc_se(x, None, None, None, None, y, (1, 1, 17, 1, 49), -INF, INF, -1, 0, 0, -1, 0, 0, 1)


# -- the rewrite ----------------------------------------------------------------------------

def block_nodes(i, x, c_in, c_mid, c_out, k, stride, act, se, residual, inits):
    """A MobileNetV3 / EfficientNet block: expand 1x1 + act, depthwise kxk + act, [SE], project
    1x1, [+ x]; its weights into ``inits``."""
    p = f"b{i}_"
    inits[p + "we"], inits[p + "be"] = f32(c_mid, c_in, 1, 1, scale=c_in ** -0.5), f32(c_mid, scale=0.1)
    inits[p + "wd"], inits[p + "bd"] = f32(c_mid, 1, k, k, scale=1 / k), f32(c_mid, scale=0.1)
    inits[p + "wp"], inits[p + "bp"] = f32(c_out, c_mid, 1, 1, scale=c_mid ** -0.5), f32(c_out, scale=0.1)
    nodes = [helper.make_node("Conv", [x, p + "we", p + "be"], [p + "e"])]
    nodes += act_nodes(act, p + "e", p + "ea")
    nodes.append(helper.make_node("Conv", [p + "ea", p + "wd", p + "bd"], [p + "d"], group=c_mid,
                                  kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4))
    nodes += act_nodes(act, p + "d", p + "da")
    top = p + "da"
    if se:
        cr = max(1, c_mid // 4)
        inits[p + "w1"], inits[p + "b1"] = f32(cr, c_mid, 1, 1, scale=0.3), f32(cr, scale=0.1)
        inits[p + "w2"], inits[p + "b2"] = f32(c_mid, cr, 1, 1, scale=0.3), f32(c_mid, scale=0.1)
        nodes += [helper.make_node("GlobalAveragePool", [top], [p + "gp"]),
                  helper.make_node("Conv", [p + "gp", p + "w1", p + "b1"], [p + "s1"]),
                  helper.make_node("Relu", [p + "s1"], [p + "s1a"]),
                  helper.make_node("Conv", [p + "s1a", p + "w2", p + "b2"], [p + "s2"]),
                  helper.make_node("HardSigmoid", [p + "s2"], [p + "g"], alpha=1 / 6, beta=0.5),
                  helper.make_node("Mul", [top, p + "g"], [p + "se"])]
        top = p + "se"
    nodes.append(helper.make_node("Conv", [top, p + "wp", p + "bp"], [p + "p"]))
    out = p + "out"
    if residual:
        nodes.append(helper.make_node("Add", [p + "p", x], [out]))
    else:
        nodes[-1].output[0] = out
    return nodes, out


def act_nodes(act, src, out):
    if act == "SiLU":
        return [helper.make_node("Sigmoid", [src], [out + "_s"]), helper.make_node("Mul", [src, out + "_s"], [out])]
    return [helper.make_node(act, [src], [out])]


def chain_model(blocks, c0=16, size=14, batch=1, gap=True, extra_output=None):
    inits: dict = {}
    nodes, x, c = [], "x", c0
    for i, (c_mid, c_out, k, stride, act, se) in enumerate(blocks):
        more, x = block_nodes(i, x, c, c_mid, c_out, k, stride, act, se, stride == 1 and c == c_out, inits)
        nodes += more
        c = c_out
    outputs = [x]
    if gap:
        nodes.append(helper.make_node("GlobalAveragePool", [x], ["pool"]))
        nodes.append(helper.make_node("Flatten", ["pool"], ["y"]))
        outputs = ["y"]
    if extra_output:
        outputs.append(extra_output)
    feed = {"x": f32(batch, c0, size, size)}
    return make_model(nodes, feed, outputs, opset=17, initializers=inits), feed


def regions_of(sess):
    return [r for exe in compiled_partitions(sess) for r in getattr(exe, "_regions", [])]


def session(model, threads=2, **config):
    so = rt.SessionOptions()
    so.intra_op_num_threads = threads
    for k, v in config.items():
        so.add_session_config_entry(k, v)
    return rt.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


MODELS = {  # (expand, out, k, stride, act, se) per block
    "mobilenet": [(64, 24, 3, 2, "Relu", False), (72, 24, 3, 1, "Relu", False), (72, 40, 5, 2, "Relu", True),
                  (120, 40, 5, 1, "HardSwish", True), (240, 80, 3, 2, "HardSwish", False)],
    "efficientnet": [(96, 24, 3, 2, "SiLU", True), (144, 24, 3, 1, "SiLU", True), (144, 40, 5, 2, "SiLU", True),
                     (240, 40, 5, 1, "SiLU", True)],
    "odd_channels": [(20, 20, 3, 1, "Relu", False), (36, 20, 7, 1, "HardSwish", False),
                     (52, 36, 3, 2, "HardSwish", True)],
}


@pytest.mark.native
@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("threads", [1, 2])
def test_chains_run_blocked_and_match_onnxruntime(name, threads):
    nchwc = _nchwc()
    model, feed = chain_model(MODELS[name], c0=16 if name != "odd_channels" else 20)
    sess = session(model, threads)
    ref = run_oracle(model, feed)
    for _ in range(3):  # the first run, then the runs after binding
        assert_close(sess.run(None, feed), ref, rtol=1e-4, atol=1e-5)
    found = regions_of(sess)
    assert len(found) == 1, found
    region = found[0][2][0]
    assert isinstance(region, nchwc.Region)
    assert {op.kind for op in region.ops} >= {"pw", "ed", "gap"}  # the expands run with their depthwise
    # the blocked program ran, not the fallback to the nodes' own steps
    assert all(p != region._steps for p in region._programs.values()) and region._programs


@pytest.mark.native
def test_chain_without_the_expand_fusion_matches_onnxruntime(monkeypatch):
    nchwc = _nchwc()
    monkeypatch.setattr(nchwc, "FUSE_EXPAND", False)
    model, feed = chain_model(MODELS["efficientnet"])
    sess = session(model)
    assert_close(sess.run(None, feed), run_oracle(model, feed), rtol=1e-4, atol=1e-5)
    region = regions_of(sess)[0][2][0]
    assert "ed" not in {op.kind for op in region.ops} and "dw" in {op.kind for op in region.ops}


@pytest.mark.native
def test_intermediate_output_leaves_the_region_and_batches_vary():
    _nchwc()
    blocks = MODELS["mobilenet"][:3]
    model, feed = chain_model(blocks, gap=False, extra_output="b0_out")
    # a symbolic batch: one region program per input shape
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    for o in model.graph.output:
        o.type.tensor_type.shape.dim[0].dim_param = "N"
    sess = session(model)
    assert regions_of(sess)
    for n in (1, 3):
        f = {"x": f32(n, 16, 14, 14)}
        assert_close(sess.run(None, f), run_oracle(model, f), rtol=1e-4, atol=1e-5)
    region = regions_of(sess)[0][2][0]
    assert region.outputs[-1] == "b2_out" and "b0_out" in region.outputs
    assert len(region._programs) == 2


@pytest.mark.native
def test_a_value_read_by_a_body_after_the_region_leaves_it():
    _nchwc()
    inits = {"w1": f32(32, 16, 1, 1, scale=0.25), "wd": f32(32, 1, 3, 3, scale=0.3), "w2": f32(16, 32, 1, 1, scale=0.2)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]), helper.make_node("Relu", ["a"], ["ar"]),
             helper.make_node("Conv", ["ar", "wd"], ["mid"], group=32, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["mid", "w2"], ["c"])]
    out = helper.make_tensor_value_info("o", 1, None)
    then_g = helper.make_graph([helper.make_node("Relu", ["mid"], ["o"])], "then", [], [out])
    else_g = helper.make_graph([helper.make_node("Neg", ["mid"], ["o"])], "else", [], [out])
    nodes.append(helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g))
    feed = {"x": f32(1, 16, 9, 9), "cond": np.array(True)}
    model = make_model(nodes, feed, ["c", "y"], initializers=inits)
    sess = session(model)
    assert regions_of(sess) and "mid" in regions_of(sess)[0][2][0].outputs
    for cond in (True, False):
        feed["cond"] = np.array(cond)
        assert_close(sess.run(None, feed), run_oracle(model, feed), rtol=1e-4, atol=1e-5)


@pytest.mark.native
def test_session_entry_turns_the_path_off_and_short_runs_stay_nchw():
    _nchwc()
    model, feed = chain_model(MODELS["mobilenet"])
    off = session(model, **{"session.cpu.nchwc": "0"})
    assert regions_of(off) == []
    assert_close(off.run(None, feed), run_oracle(model, feed), rtol=1e-4, atol=1e-5)
    # two convolutions: not worth two reorders
    short = helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])
    m = make_model(list(short), {"x": f32(1, 16, 7, 7)}, ["y"], initializers={"w": f32(32, 16, 1, 1)})
    assert regions_of(session(m)) == []


@pytest.mark.native
def test_partition_report_names_each_region_and_its_nodes():
    _nchwc()
    model, feed = chain_model(MODELS["mobilenet"])
    sess = session(model)
    sess.run(None, feed)
    report = sess.get_partition_report()
    blocked = [f for f in report.fusions if f.kind == "nchwc"]
    (region,) = regions_of(sess)
    assert [list(f.nodes) for f in blocked] == [list(region[2][1].node.members)]
    names = {n.name for n in report.nodes}
    assert len(blocked[0].nodes) >= 3 and set(blocked[0].nodes) <= names
    assert " + ".join(blocked[0].nodes) in str(report)
    off = session(model, **{"session.cpu.nchwc": "0"})
    off.run(None, feed)
    assert not [f for f in off.get_partition_report().fusions if f.kind == "nchwc"]


@pytest.mark.native
def test_profiled_runs_keep_one_step_per_node(tmp_path):
    _nchwc()
    model, feed = chain_model(MODELS["efficientnet"])
    so = rt.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "profile")
    sess = rt.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    assert_close(sess.run(None, feed), run_oracle(model, feed), rtol=1e-4, atol=1e-5)
    sess.end_profiling()


# -- whole models -----------------------------------------------------------------------------

CORPUS = os.path.expanduser("~/.cache/rcb")


@pytest.mark.native
@pytest.mark.parametrize("name", ["mobilenet_v3_ts14_b1", "efficientnet_b0_ts14_b1"])
def test_corpus_models_match_onnxruntime(name):
    _nchwc()
    path = os.path.join(CORPUS, name + ".onnx")
    if not os.path.exists(path):
        pytest.skip(f"{path}: the benchmark corpus is not built here")
    import onnxruntime as ort

    sess = rt.InferenceSession(path, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    feed = {inp.name: f32(1, 3, 224, 224)}
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feed)
    for _ in range(2):
        assert_close(sess.run(None, feed), ref, rtol=1e-3, atol=1e-4)
    assert regions_of(sess)


def test_unknown_layout_is_declined_without_the_kernels(monkeypatch):
    """Without the blocked kernels (no AVX-512, or no extension) no region is made."""
    from runtime_provider_cpu.fast import nchwc

    monkeypatch.setattr(nchwc, "available", lambda: False)
    model, feed = chain_model(MODELS["mobilenet"][:3])
    sess = session(model)
    assert regions_of(sess) == []
    assert_close(sess.run(None, feed), run_oracle(model, feed), rtol=1e-4, atol=1e-5)



