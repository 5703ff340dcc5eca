"""The AMX int8 tiles of the dynamic-int8 matmuls (native/int8_amx.c, ``_native.dqmm(..., tile=1)``):
bit for bit the VNNI tile's results and a numpy reference of the unfused steps, across row, K
and column tails; the plan's choice between the two (ops/quant_dyn.py ``_dqmm_tile``). Skipped
where the CPU lacks AMX or the OS refuses the tile state (the reason is the module's AMX_INT8)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from oracle import cpu_policy  # noqa: F401 - a fixture
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt

MS = "com.microsoft"


def _nat():
    from runtime_provider_cpu.fast.policy import NATIVE

    return NATIVE


def _amx_or_skip():
    nat = _nat()
    if nat is None:
        pytest.skip("the compiled extension is not built")
    if getattr(nat, "AMX_INT8", "") != "granted":
        pytest.skip(f"no AMX int8 tiles on this machine (CPU lacks AMX or the OS refused): {nat.AMX_INT8}")
    return nat


def _ref(aq, za, b, zb, scale, bias):
    """The unfused MatMulInteger, Cast, Mul, Add in int64 then float32."""
    acc = (aq.astype(np.int64) - np.int64(za)) @ (b.astype(np.int64) - (0 if zb is None else zb.astype(np.int64)))
    y = acc.astype(np.int32).astype(np.float32) * scale
    return y if bias is None else y + bias


def _dqmm(nat, a, kind, za, b, zb, sb, bias, tile, threads):
    K, N = b.shape
    buf = np.empty(nat.qgemm_packed_size((K, N)), np.int8)
    nat.qgemm_pack(b, buf, (K, N), b.dtype == np.int8)
    y = np.full((a.shape[0], N), np.nan, np.float32)
    got = nat.dqmm(a, kind, 0.03, za, buf, b.dtype == np.int8, zb, sb, bias, y, (a.shape[0], K, N), threads, tile)
    return y, got


# M: one row, under and over the 16-row tile and the 32-row pair, 300; K: 61 (16 groups, the least
# the tiles take), a multiple of 64, groups not a multiple of 16 (the right-aligned last step), 770
# (a K tail inside a group); N: tails of the 16- and 32-column panels
@pytest.mark.kernel
@pytest.mark.parametrize("M", [1, 8, 15, 16, 17, 31, 32, 33, 100, 300])
@pytest.mark.parametrize("K,N", [(61, 1), (64, 33), (100, 16), (130, 47), (770, 96)])
@pytest.mark.parametrize("kind", [0, 1, 2])
def test_amx_tile_matches_vnni_and_reference(M, K, N, kind):
    nat = _amx_or_skip()
    rng = np.random.default_rng(M * 7919 + K * 31 + N + kind)
    for b_dt in (np.int8, np.uint8):
        info = np.iinfo(b_dt)
        b = rng.integers(info.min, info.max + 1, (K, N)).astype(b_dt)
        zb = rng.integers(info.min, info.max + 1, N).astype(np.int32)
        sb = rng.uniform(0.001, 0.02, N).astype(np.float32)
        bias = rng.standard_normal(N).astype(np.float32)
        if kind == 0:
            a = rng.standard_normal((M, K)).astype(np.float32)
            a[0, 0] += 3.0
            za = 0
        else:
            a_dt = np.uint8 if kind == 1 else np.int8
            a = rng.integers(np.iinfo(a_dt).min, np.iinfo(a_dt).max + 1, (M, K)).astype(a_dt)
            za = int(rng.integers(np.iinfo(a_dt).min, np.iinfo(a_dt).max + 1))
        vnni, qv = _dqmm(nat, a, kind, za, b, zb, sb, bias, 0, 1)
        for threads in (1, 2):
            amx, qa = _dqmm(nat, a, kind, za, b, zb, sb, bias, 1, threads)
            assert qa == qv
            np.testing.assert_array_equal(amx, vnni)
        if kind:
            want = _ref(a, za, b, zb, np.float32(0.03) * sb, bias)
        else:
            s, z = np.float32(qv[0]), qv[1]
            aq = np.clip(np.rint(a / s) + z, 0, 255).astype(np.uint8)
            want = _ref(aq, z, b, zb, s * sb, bias)
        np.testing.assert_array_equal(amx, want)


@pytest.mark.kernel
def test_amx_tile_argument_is_checked():
    nat = _nat()
    if nat is None:
        pytest.skip("the compiled extension is not built")
    b = np.ones((64, 16), np.int8)
    args = (np.ones((4, 64), np.float32), 0, 1.0, 0, np.zeros(nat.qgemm_packed_size((64, 16)), np.int8), True, None,
            np.ones(16, np.float32), None, np.empty((4, 16), np.float32), (4, 64, 16), 1)
    nat.qgemm_pack(b, args[4], (64, 16), True)
    with pytest.raises(ValueError, match="tile must be"):
        nat.dqmm(*args, 2)
    if nat.AMX_INT8 != "granted":  # asking for AMX where it does not run names why
        with pytest.raises(ValueError, match=re.escape(nat.AMX_INT8)):  # a reason, not a pattern
            nat.dqmm(*args, 1)


def _model(a_shape, b, b_scale):
    g = helper.make_graph([helper.make_node("DynamicQuantizeMatMul", ["A", "B", "b_scale"], ["y"], domain=MS)], "g",
                          [helper.make_tensor_value_info("A", TensorProto.FLOAT, a_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(b, "B"), numpy_helper.from_array(b_scale, "b_scale")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m.SerializeToString()


@pytest.mark.parametrize("forced", ["amx", "vnni", ""])
def test_session_plan_picks_a_tile(forced, cpu_policy, tmp_path, monkeypatch):  # noqa: F811 - the fixture
    """A session on the plan: forced AMX, forced VNNI or measured; the results as the reference,
    the choice in the kernels report."""
    nat = _amx_or_skip()
    monkeypatch.setenv("RUNTIME_CORE_AUTOTUNE_DIR", "0")
    from runtime_provider_cpu.fast import autotune

    autotune.forget()
    cpu_policy(dqmm_kernel=forced, tune=True)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((2, 40, 200)).astype(np.float32)
    b = rng.integers(-128, 128, (200, 70)).astype(np.int8)
    sb = np.array(0.01, np.float32)
    s = rt.InferenceSession(_model(a.shape, b, sb))
    got = s.run(None, {"A": a})[0]
    buf = np.empty(nat.qgemm_packed_size((200, 70)), np.int8)
    nat.qgemm_pack(b, buf, (200, 70), True)
    y = np.empty((80, 70), np.float32)
    sa, za = nat.dqmm(a.reshape(80, 200), 0, 1.0, 0, buf, True, None, np.full(70, sb), None, y, (80, 200, 70), 1, 0)
    aq = np.clip(np.rint(a / np.float32(sa)) + za, 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(got, _ref(aq, za, b, None, np.float32(sa) * sb, None))
    chosen = list(s.get_partition_report().kernels.values())
    assert chosen == [forced] if forced else len(chosen) == 1 and chosen[0] in ("amx", "vnni")
    autotune.forget()


# qgemm (MatMulInteger, QLinearMatMul, the pointwise QLinearConv's product): its products of 16+
# rows on the tiles, each output mode, A and B of either sign, the NCHW planes output
@pytest.mark.kernel
@pytest.mark.parametrize("M,K,N", [(16, 64, 32), (17, 61, 5), (40, 130, 47), (300, 256, 70), (64, 770, 33)])
@pytest.mark.parametrize("mode", [0, 1, 2])
def test_qgemm_on_amx_matches_vnni(M, K, N, mode):
    nat = _amx_or_skip()
    rng = np.random.default_rng(M * 131 + K * 7 + N + mode)
    for a_signed, b_signed in ((False, True), (True, False)):
        a = rng.integers(-128 if a_signed else 0, 128 if a_signed else 256, (M, K)).astype(np.int8 if a_signed
                                                                                         else np.uint8)
        b = rng.integers(-128 if b_signed else 0, 128 if b_signed else 256, (K, N)).astype(np.int8 if b_signed
                                                                                         else np.uint8)
        buf = np.empty(nat.qgemm_packed_size((K, N)), np.int8)
        nat.qgemm_pack(b, buf, (K, N), b_signed)
        za = int(rng.integers(-9, 9) if a_signed else rng.integers(120, 136))
        zb = rng.integers(-9, 9, N).astype(np.int32) if b_signed else rng.integers(120, 136, N).astype(np.int32)
        mult = rng.uniform(1e-5, 1e-4, N).astype(np.float32)
        bias = rng.integers(-5000, 5000, N).astype(np.int32)
        dt = np.int32 if mode == 0 else np.uint8 if mode == 1 else np.int8
        planes = 8 if M % 8 == 0 else 0
        outs = []
        try:
            for on in (False, True):
                assert nat.qgemm_amx(int(on)) == on
                y = np.empty((M, N), dt)
                nat.qgemm(a, a_signed, za, buf, b_signed, zb, y, (M, K, N), mode, mult, 3, 2, bias)
                yp = np.zeros((M // 8, N, 8) if planes else (1,), dt)
                if planes:
                    nat.qgemm(a, a_signed, za, buf, b_signed, zb, yp, (M, K, N), mode, mult, 3, 2, bias, planes)
                outs.append((y, yp))
        finally:
            nat.qgemm_amx(1)
        np.testing.assert_array_equal(outs[1][0], outs[0][0])
        np.testing.assert_array_equal(outs[1][1], outs[0][1])
        if mode == 0:  # the int32 sums themselves, against int64 numpy
            want = (a.astype(np.int64) - za) @ (b.astype(np.int64) - zb) + bias
            np.testing.assert_array_equal(outs[1][0], want.astype(np.int32))
