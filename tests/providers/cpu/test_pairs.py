"""Fused step pairs (``executable.pairs``): after a partition's first run, an inverted-residual
block's expansion (a 1x1 Conv) and the 3x3 depthwise Conv that alone reads it run as one call
of ``_native.expand_dw`` (the AVX-512 build), the expanded tensor never whole. The pair must
give exactly what the two steps give, for any later input, and stay two steps wherever the
expansion is read by anything else; profiled runs keep both nodes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from oracle import assert_close, compiled_partitions, cpu_session, make_model, run_oracle

RNG = np.random.default_rng(20261206)
pytestmark = pytest.mark.native  # the compiled kernels' own tests


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.fixture(autouse=True)
def forced(cpu_policy):
    """The plans the pair fusers take wherever they apply, not the ones measured faster here."""
    cpu_policy(conv_kernel="pointwise,depthwise,direct", pair_kernel="fused")


def _fast():
    from runtime_provider_cpu import _native

    return bool(getattr(_native, "CONV_FAST", 0))


def _block(C, M, stride, bias=True, act="Clip", extra_out=False, extra_reader=False, k=3):
    """x -> 1x1 Conv (C -> M) + act -> k x k depthwise Conv (stride) + act -> y; optionally the
    expansion also a graph output, or also read by another node"""
    ins1 = ["x", "w1", "b1"] if bias else ["x", "w1"]
    ins2 = ["e", "wd", "bd"] if bias else ["e", "wd"]
    clip = ["lo", "hi"] if act == "Clip" else []
    nodes = [helper.make_node("Conv", ins1, ["c1"]),
             helper.make_node(act, ["c1"] + clip, ["e"]),
             helper.make_node("Conv", ins2, ["c2"], group=M, pads=[k // 2] * 4, strides=[stride, stride]),
             helper.make_node(act, ["c2"] + clip, ["y"])]
    outs = ["y"]
    if extra_out:
        outs.append("e")
    if extra_reader:
        nodes.append(helper.make_node("ReduceMax", ["e"], ["m"], keepdims=0))
        outs.append("m")
    inits = {"w1": rnd(M, C, 1, 1) * 0.4, "wd": rnd(M, 1, k, k)}
    if bias:
        inits.update(b1=rnd(M), bd=rnd(M))
    if act == "Clip":
        inits.update(lo=np.array(0, np.float32), hi=np.array(6, np.float32))
    return nodes, inits, outs


def _against_two_steps(model, flag, make_x, oracle=lambda run: True):
    """Three runs of ``model`` in a session whose pair is fused and in one whose pair ``flag``
    kept apart by the policy field ``flag`` (a pair is decided at the session's first run): onnxruntime's result (on the
    runs ``oracle`` names) and the same bits from both. The fused session and its last result."""
    from runtime_provider_cpu.fast import policy

    sess, apart = cpu_session(model), cpu_session(model)
    for run in range(3):
        x = make_x(run)
        got = sess.run(None, {"x": x})
        if oracle(run):
            assert_close(got, run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-4)
        with policy.installed(**{flag: False}):
            two = apart.run(None, {"x": x})
        assert np.array_equal(got[0], two[0], equal_nan=True), run
    assert _lengths(apart)[1] == _lengths(apart)[0]
    return sess, got[0]


def _stays_two_steps(model, shape):
    """Three runs of ``model``, onnxruntime's results, and no pair fused."""
    sess = cpu_session(model)
    for _ in range(3):
        x = rnd(*shape)
        assert_close(sess.run(None, {"x": x}), run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-4)
    steps, run_steps = _lengths(sess)
    assert run_steps == steps


def _lengths(sess):
    (exe,) = compiled_partitions(sess)
    return len(exe.steps), len(exe.run_steps)


@pytest.mark.parametrize("N,C,M,H,W,stride,bias,act", [
    (1, 16, 96, 28, 28, 2, True, "Clip"),    # MobileNetV2's second block, smaller
    (1, 24, 144, 14, 14, 1, True, "Clip"),   # a stride-1 block: 196 positions, a 4-wide tail panel
    (1, 8, 30, 9, 13, 2, False, "Relu"),     # no bias; 30 channels: a 6-row last panel; odd sizes
    (1, 5, 12, 7, 40, 1, True, "Relu"),      # rows of 16 or more: the row mode of the phase planes
    (1, 40, 17, 3, 5, 2, True, "Clip"),      # a 2 x 3 output, one short panel
    (3, 16, 64, 20, 20, 2, True, "Relu"),    # a batch: one call an image
    (2, 8, 30, 9, 13, 1, False, "Clip"),     # a batch, odd sizes, no bias
    (1, 16, 40, 17, 19, 2, True, "HardSwish"),  # MobileNetV3's activation, in both kernels' epilogues
    (2, 8, 24, 12, 12, 1, True, "Sigmoid"),
])
@pytest.mark.parametrize("k", [3, 5])
def test_expansion_and_depthwise_are_one_step(N, C, M, H, W, stride, bias, act, k):
    # the same tiles and the same depthwise code: bit for bit the two steps' result
    nodes, inits, outs = _block(C, M, stride, bias, act, k=k)
    model = make_model(nodes, {"x": rnd(N, C, H, W)}, outs, opset=14, initializers=inits)
    sess, y = _against_two_steps(model, "expand_dw", lambda run: rnd(N, C, H, W))
    steps, run_steps = _lengths(sess)
    assert steps == 2  # Conv + Clip / Relu, twice: two FusedConv nodes
    assert run_steps == (1 if _fast() else 2)
    if act == "Sigmoid":
        assert ((y > 0) & (y < 1)).all() and y.std() > 0.05
    else:
        assert (y == 0).any() and (y > 0).any()


@pytest.mark.parametrize("extra_out,extra_reader", [(True, False), (False, True)])
def test_no_pair_where_the_expansion_is_read_elsewhere(extra_out, extra_reader):
    nodes, inits, outs = _block(8, 24, 2, extra_out=extra_out, extra_reader=extra_reader)
    model = make_model(nodes, {"x": rnd(1, 8, 12, 12)}, outs, opset=13, initializers=inits)
    _stays_two_steps(model, (1, 8, 12, 12))


def test_pair_follows_a_new_input_shape():
    # symbolic dims: a shape the plans were not made for (another size, a batch of 2) runs
    # the two steps (their kernels, new plans); the first shape still gives its own result
    nodes, inits, _ = _block(8, 36, 2)
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, "H", "W"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 36, "OH", "OW"])],
                          initializer=[helper.make_tensor(k, TensorProto.FLOAT, v.shape, v.ravel())
                                       for k, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    sess = cpu_session(model)
    for shape in [(1, 8, 15, 17), (1, 8, 15, 17), (1, 8, 9, 30), (1, 8, 15, 17), (2, 8, 6, 6)]:
        x = rnd(*shape)
        assert_close(sess.run(None, {"x": x}), run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-4)
    assert _lengths(sess)[1] == (1 if _fast() else 2)


def test_profiled_runs_keep_both_nodes():
    nodes, inits, outs = _block(8, 24, 1)
    x = rnd(1, 8, 10, 10)
    model = make_model(nodes, {"x": x}, outs, opset=13, initializers=inits)
    sess = cpu_session(model)
    sess.run(None, {"x": x})
    (exe,) = compiled_partitions(sess)
    seen = []
    out = exe.run_profiled([x], lambda node, *rest: seen.append(node.op_type))
    assert seen == ["FusedConv", "FusedConv"]
    assert np.array_equal(out[0], exe.run([x])[0])


@pytest.mark.kernel
@pytest.mark.skipif(not _fast(), reason="expand_dw is the AVX-512 build's (CONV_FAST); elsewhere the "
                                        "pair stays two steps, which the tests above check")
def test_expand_dw_same_result_on_any_thread_count_and_checks_buffers():
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast.packing import pack_rows as _pack_rows

    M, C, H, W = 40, 12, 17, 19
    x, w, b, wd, bd = rnd(1, C, H, W), rnd(M, C) * 0.3, rnd(M), rnd(M, 1, 3, 3), rnd(M)
    w12 = _pack_rows(w)
    geo = ((M, C, H, W), (9, 10, 2, 1, 1), -1.0, 1.0)
    outs = []
    for threads in (1, 2, 3, 8):
        y = np.empty((1, M, 9, 10), np.float32)
        _native.expand_dw(w12, x, b, 0.0, 6.0, wd, bd, y, *geo, threads)
        outs.append(y)
    for y in outs[1:]:
        assert np.array_equal(y, outs[0])
    e = np.clip(np.einsum("mc,chw->mhw", w.astype(np.float64), x[0].astype(np.float64)) + b[:, None, None], 0, 6)
    ep = np.pad(e, ((0, 0), (1, 1), (1, 1)))
    ref = sum(wd[:, 0, ky, kx, None, None] * ep[:, ky:ky + 17:2, kx:kx + 19:2] for ky in range(3) for kx in range(3))
    np.testing.assert_allclose(outs[0][0], np.clip(ref + bd[:, None, None], -1, 1), rtol=1e-4, atol=1e-4)
    y = np.zeros((1, M, 9, 10), np.float32)
    with pytest.raises(ValueError, match="W holds"):
        _native.expand_dw(w12[:-1], x, b, 0.0, 6.0, wd, bd, y, *geo, 2)
    with pytest.raises(ValueError, match="X holds"):
        _native.expand_dw(w12, x[:, :-1], b, 0.0, 6.0, wd, bd, y, *geo, 2)
    with pytest.raises(ValueError, match="WD holds"):
        _native.expand_dw(w12, x, b, 0.0, 6.0, wd[:-1], bd, y, *geo, 2)
    with pytest.raises(ValueError, match="Y holds"):
        _native.expand_dw(w12, x, b, 0.0, 6.0, wd, bd, y[:, :-1], *geo, 2)
    with pytest.raises(ValueError, match="stride"):
        _native.expand_dw(w12, x, b, 0.0, 6.0, wd, bd, y, (M, C, H, W), (9, 10, 3, 1, 1), -1.0, 1.0, 2)
    assert not y.any()


def _stem(C, M, k, stride, pool=None, bias=True, outs=("y",)):
    """x -> k x k Conv (stride, pads k // 2) + Relu -> MaxPool (3x3 stride 2 pads 1 unless
    ``pool`` gives other attributes) -> y"""
    pool = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]) if pool is None else pool
    ins = ["x", "w", "b"] if bias else ["x", "w"]
    p = k // 2
    nodes = [helper.make_node("Conv", ins, ["c"], pads=[p] * 4, strides=[stride, stride]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], list(outs), **pool)]
    inits = {"w": rnd(M, C, k, k) * 0.2}
    if bias:
        inits["b"] = rnd(M)
    return nodes, inits


@pytest.mark.parametrize("C,M,H,W,k,stride,bias", [
    (3, 20, 40, 36, 7, 2, True),   # ResNet's stem, smaller: 20 x 18, two bands of pooled rows
    (3, 64, 64, 64, 7, 2, True),   # 32 x 32: four bands, eight channel blocks
    (8, 9, 17, 13, 3, 1, False),   # odd sizes (a lone last pooled column), a channel tail, no bias
    (2, 16, 9, 70, 5, 2, True),    # rows wider than 48 positions a tile, an even width
])
def test_conv_and_maxpool_are_one_step(C, M, H, W, k, stride, bias, cpu_policy):
    cpu_policy(direct=True)  # the direct kernel on any build (the pair needs AVX-512)
    nodes, inits = _stem(C, M, k, stride, bias=bias)
    model = make_model(nodes, {"x": rnd(1, C, H, W)}, ["y"], opset=13, initializers=inits)

    def make_x(run):
        x = rnd(1, C, H, W)
        if run == 2:
            # NaN through the convolution and the pool (where any tap is NaN, as maxpool2d;
            # onnxruntime's pool drops some of them, so against the two steps only)
            x[0, 0, H // 2, W // 3] = np.nan
        return x

    sess, y = _against_two_steps(model, "conv_maxpool", make_x, oracle=lambda run: run < 2)
    assert np.isnan(y).any() and not np.isnan(y).all()
    steps, run_steps = _lengths(sess)
    assert steps == 2 and run_steps == (1 if _fast() else 2)


@pytest.mark.parametrize("pool,outs", [
    (dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1), ("y",)),
    (dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]), ("y",)),
    (dict(kernel_shape=[2, 2], strides=[2, 2]), ("y",)),
    (dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), ("y", "idx")),
])
def test_no_conv_maxpool_pair_for_other_pools(pool, outs, cpu_policy):
    cpu_policy(direct=True)
    nodes, inits = _stem(3, 8, 7, 2, pool=pool, outs=outs)
    model = make_model(nodes, {"x": rnd(1, 3, 30, 30)}, list(outs), opset=13, initializers=inits)
    _stays_two_steps(model, (1, 3, 30, 30))


@pytest.mark.kernel
@pytest.mark.skipif(not _fast(), reason="conv_maxpool is the AVX-512 build's (CONV_FAST); elsewhere the "
                                        "pair stays two steps, which the tests above check")
def test_conv_maxpool_same_result_on_any_thread_count_and_checks_buffers():
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast.packing import pack_direct as _pack_direct

    x, w, b = rnd(1, 3, 50, 46), rnd(12, 3, 7, 7) * 0.2, rnd(12)
    wp = _pack_direct(w)
    geo = ((3, 50, 46), (12, 7, 7), (2, 2), (3, 3), (25, 23), 0.0, 6.0, (13, 12))
    outs = []
    for threads in (1, 2, 3, 8):
        y = np.empty((1, 12, 13, 12), np.float32)
        _native.conv_maxpool(x, wp, b, y, *geo, threads)
        outs.append(y)
    for y in outs[1:]:
        assert np.array_equal(y, outs[0])
    xp = np.pad(x[0].astype(np.float64), ((0, 0), (3, 3), (3, 3)))
    c = np.zeros((12, 25, 23))
    for ky in range(7):
        for kx in range(7):
            c += np.einsum("mc,chw->mhw", w[:, :, ky, kx].astype(np.float64), xp[:, ky:ky + 49:2, kx:kx + 45:2])
    c = np.pad(np.clip(c + b[:, None, None], 0, 6), ((0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    ref = np.max([c[:, dy:dy + 25:2, dx:dx + 23:2] for dy in range(3) for dx in range(3)], axis=0)
    np.testing.assert_allclose(outs[0][0], ref, rtol=1e-4, atol=1e-4)
    y = np.zeros((1, 12, 13, 12), np.float32)
    with pytest.raises(ValueError, match="W holds"):
        _native.conv_maxpool(x, wp[:-1], b, y, *geo, 2)
    with pytest.raises(ValueError, match="X holds"):
        _native.conv_maxpool(x[:, :2], wp, b, y, *geo, 2)
    with pytest.raises(ValueError, match="Y holds"):
        _native.conv_maxpool(x, wp, b, y[:, :-1], *geo, 2)
    with pytest.raises(ValueError, match="pooled sizes"):
        _native.conv_maxpool(x, wp, b, y, *geo[:-1], (12, 12), 2)
    assert not y.any()


def _down_block(C, M, pads=(1, 1, 1, 1)):
    """ResNet's downsampling block: x -> 3x3 Conv stride 2 + Relu -> 3x3 Conv, plus the 1x1
    stride-2 shortcut of x, then Relu (the second Conv, Add and Relu one FusedConv with Z)"""
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=list(pads), strides=[2, 2]),
             helper.make_node("Relu", ["c1"], ["a1"]),
             helper.make_node("Conv", ["x", "wd", "bd"], ["d"], strides=[2, 2]),
             helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "d"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    inits = {"w1": rnd(M, C, 3, 3) * 0.2, "b1": rnd(M), "wd": rnd(M, C, 1, 1) * 0.3, "bd": rnd(M),
             "w2": rnd(M, M, 3, 3) * 0.1, "b2": rnd(M)}
    return nodes, inits


@pytest.mark.parametrize("C,M,H,W", [
    (8, 16, 12, 12),    # the position tiles (8 x 9 terms a sum)
    (32, 40, 11, 13),   # the lanes (32 x 9 terms, 7 wide): odd sizes, a second channel block
    (16, 24, 30, 18),   # tall: several position tiles a channel block
])
def test_strided_conv_and_its_shortcut_are_one_step(C, M, H, W, cpu_policy):
    cpu_policy(direct=True)
    nodes, inits = _down_block(C, M)
    model = make_model(nodes, {"x": rnd(1, C, H, W)}, ["y"], opset=13, initializers=inits)
    sess, _ = _against_two_steps(model, "conv_shortcut", lambda run: rnd(1, C, H, W))
    steps, run_steps = _lengths(sess)
    assert steps == 3  # FusedConv (c1 + Relu), Conv (the shortcut), FusedConv (c2 + Z + Relu)
    assert run_steps == (2 if _fast() else 3)


def test_shortcut_pair_also_takes_a_rows_shortcut(cpu_policy):
    # the shortcut measured faster on pointwise_rows: still one step with the first convolution
    from runtime_provider_cpu.fast import policy

    if not hasattr(policy.NATIVE, "pointwise_rows") or not policy.current().linear:
        pytest.skip("the rows kernel needs the AVX-512 build's Linear tiles")
    cpu_policy(direct=True, conv_kernel="pointwise_rows,depthwise,direct")
    C, M, H, W = 32, 40, 11, 13
    nodes, inits = _down_block(C, M)
    model = make_model(nodes, {"x": rnd(1, C, H, W)}, ["y"], opset=13, initializers=inits)
    sess, apart = cpu_session(model), cpu_session(model)
    for _ in range(3):
        x = rnd(1, C, H, W)
        got = sess.run(None, {"x": x})
        assert_close(got, run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-4)
        with policy.installed(conv_shortcut=False):
            two = apart.run(None, {"x": x})
        np.testing.assert_allclose(got[0], two[0], rtol=1e-5, atol=1e-5)  # the rows kernel's sums: another order
    assert _lengths(sess) == (3, 2 if _fast() else 3)
    assert _lengths(apart)[1] == _lengths(apart)[0]


def test_no_shortcut_pair_when_the_outputs_differ():
    # an unpadded first convolution: 5 x 5 from 12 x 12 where the shortcut gives 6 x 6
    # (and the second convolution pads back to it): each reads the input its own way
    nodes, inits = _down_block(8, 16, pads=(0, 0, 0, 0))
    nodes[3] = helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"], pads=[1, 1, 2, 2])
    model = make_model(nodes, {"x": rnd(1, 8, 12, 12)}, ["y"], opset=13, initializers=inits)
    _stays_two_steps(model, (1, 8, 12, 12))


@pytest.mark.kernel
@pytest.mark.skipif(not _fast(), reason="the direct kernel is the AVX-512 build's (CONV_FAST)")
def test_conv2d_extra_checks_buffers():
    from runtime_provider_cpu import _native
    from runtime_provider_cpu.fast.packing import pack_direct as _pack_direct

    x, w, wd = rnd(1, 8, 10, 10), rnd(16, 8, 3, 3), rnd(16, 8, 1, 1)
    wp, wdp = _pack_direct(w), _pack_direct(wd)
    y, y2 = np.zeros((1, 16, 5, 5), np.float32), np.zeros((1, 16, 5, 5), np.float32)
    args = ((1, 8, 10, 10), (16, 3, 3), (2, 2), (1, 1), (1, 1), (5, 5), -np.inf, np.inf, 2, False)
    with pytest.raises(ValueError, match="W2 holds"):
        _native.conv2d(x, wp, None, None, y, *args,
                       (wdp.ravel()[:-8], None, None, y2, 16, 1, 1, -np.inf, np.inf, False))
    with pytest.raises(ValueError, match="Y2 holds"):
        _native.conv2d(x, wp, None, None, y, *args, (wdp, None, None, y2[:, :8], 16, 1, 1, -np.inf, np.inf, False))
    with pytest.raises(ValueError, match="window"):
        _native.conv2d(x, wp, None, None, y, *args, (wdp, None, None, y2, 16, 3, 1, -np.inf, np.inf, False))
    assert not y.any() and not y2.any()
    _native.conv2d(x, wp, None, None, y, *args, (wdp, None, None, y2, 16, 1, 1, -np.inf, np.inf, False))
    ref = np.einsum("mc,chw->mhw", wd[:, :, 0, 0].astype(np.float64), x[0, :, ::2, ::2].astype(np.float64))
    np.testing.assert_allclose(y2[0], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block", ["pair", "siblings"])
def test_fusions_made_after_the_first_run_show_in_the_partition_report(block, cpu_policy):
    if block == "pair":
        nodes, inits, outs = _block(8, 24, 2)
        shape = (1, 8, 12, 12)
    else:
        cpu_policy(direct=True)
        nodes, inits = _down_block(8, 16)
        outs, shape = ["y"], (1, 8, 12, 12)
    model = make_model(nodes, {"x": rnd(*shape)}, outs, opset=13, initializers=inits)
    sess = cpu_session(model)
    assert sess.get_partition_report().fusions == []  # nothing fused before the first run
    x = rnd(*shape)
    sess.run(None, {"x": x})
    report = sess.get_partition_report()
    steps, run_steps = _lengths(sess)
    assert len(report.fusions) == steps - run_steps == (1 if _fast() else 0)
    names = {n.name: n for n in report.nodes}
    for f in report.fusions:
        assert f.kind == block and f.provider == "CPUExecutionProvider" and len(f.nodes) == 2
        assert all(names[n].partition == f.partition for n in f.nodes)
        assert " + ".join(f.nodes) in str(report)
    assert report.to_dict()["fusions"] == [
        {"partition": f.partition, "provider": f.provider, "kind": f.kind, "nodes": f.nodes}
        for f in report.fusions]
    if report.fusions:
        assert "fused at run time" in str(report) and "run-time fusion" in report.summary()


@pytest.mark.skipif(not _fast(), reason="expand_dw is the AVX-512 build's (CONV_FAST)")
def test_pair_over_a_depthwise_plan_in_the_lanes(cpu_policy):
    # the depthwise node planned with 16 channels in the lanes: the pair (phase planes) gives
    # the same sums in another order, within rounding of the two steps
    from runtime_provider_cpu.fast import policy

    cpu_policy(conv_kernel="pointwise,depthwise_lanes", pair_kernel="fused")
    nodes, inits, outs = _block(16, 48, 2, act="HardSwish", k=5)
    x = rnd(2, 16, 15, 15)
    model = make_model(nodes, {"x": x}, outs, opset=14, initializers=inits)
    sess, apart = cpu_session(model), cpu_session(model)
    got = sess.run(None, {"x": x})
    with policy.installed(expand_dw=False):
        two = apart.run(None, {"x": x})
    assert_close(got, run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[0], two[0], rtol=1e-5, atol=1e-5)
    assert _lengths(sess) == (2, 1)


@pytest.mark.parametrize("choice", ["apart", ""])
def test_pair_kept_apart_or_measured(choice, cpu_policy):
    # forced apart: two steps; measured (tuning on): either, the same bits as the two steps
    cpu_policy(conv_kernel="pointwise,depthwise", pair_kernel=choice)
    nodes, inits, outs = _block(8, 36, 1, act="HardSwish")
    model = make_model(nodes, {"x": rnd(2, 8, 10, 10)}, outs, opset=14, initializers=inits)
    sess, y = _against_two_steps(model, "expand_dw", lambda run: rnd(2, 8, 10, 10))
    steps, run_steps = _lengths(sess)
    assert run_steps == 2 if choice == "apart" else run_steps in (1, 2)
