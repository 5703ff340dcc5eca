"""The AVX-512 depthwise kernel's direct rows (``depthwise2d(..., fast=3)``: every output vector
from the input rows themselves, no phase planes) against a float64 reference and against the
phase planes (``fast=2``) and the 8-float path (``fast=0``): 3x3, 5x5 and 7x7, stride 1 and 2,
no, symmetric, one-sided and oversized pads, rows shorter and longer than a vector, fewer
output rows than a pass computes, a batch (the channel cycling through the weights), no bias,
an activation in the epilogue (each kind: the 3x3 and 5x5 rows are an instance per kind),
1 and 2 threads. Also the default (``fast=1``, the direct rows on
the AVX-512 build) and the expansion + depthwise pair on a 112 x 112 plane, which runs its
depthwise step through them too."""

from __future__ import annotations

import numpy as np
import pytest

_native = pytest.importorskip("runtime_provider_cpu._native")

pytestmark = pytest.mark.native

RNG = np.random.default_rng(27)
FAST = bool(getattr(_native, "CONV_FAST", 0))
# activate's kinds as depthwise2d takes them: (kind, alpha, beta)
ACTS = {"HardSwish": (0, 1.0 / 6.0, 0.5), "HardSigmoid": (1, 0.2, 0.5), "Sigmoid": (2, 0.0, 0.0), "SiLU": (3, 0.0, 0.0)}


def _reference(x, w, b, s, pt, pl, OH, OW, lo, hi, act=None):
    """float64 depthwise convolution: rows / columns outside the input read 0"""
    N, C, H, W = x.shape
    k = w.shape[-1]
    Hp, Wp = max(H + pt, (OH - 1) * s + k), max(W + pl, (OW - 1) * s + k)
    xp = np.zeros((N, C, Hp, Wp))
    xp[:, :, pt:pt + H, pl:pl + W] = x
    y = np.zeros((N, C, OH, OW)) + (0.0 if b is None else b.astype(np.float64)[None, :, None, None])
    for ky in range(k):
        for kx in range(k):
            y += w[None, :, 0, ky, kx, None, None].astype(np.float64) * \
                xp[:, :, ky:ky + (OH - 1) * s + 1:s, kx:kx + (OW - 1) * s + 1:s]
    y = np.clip(y, lo, hi)
    if act == "HardSwish":
        y = y * np.clip(y / 6 + 0.5, 0, 1)
    elif act == "HardSigmoid":
        y = np.clip(y * 0.2 + 0.5, 0, 1)
    elif act == "Sigmoid":
        y = 1 / (1 + np.exp(-y))
    elif act == "SiLU":
        y = y / (1 + np.exp(-y))
    return y


def _run(x, w, b, s, pads, out, lo, hi, fast, threads=1, act=None):
    N, C, H, W = x.shape
    k = w.shape[-1]
    y = np.full((N, C) + out, np.nan, np.float32)
    args = [x, w, b, y, (N, C, H, W), out, (k, k), (s, s), (1, 1), pads, lo, hi, threads, fast, False]
    if act is not None:
        args += list(ACTS[act])
    _native.depthwise2d(*args)
    return y


# (N, C, H, W), k, s, (pt, pl), (OH, OW)
CASES = [
    ((1, 5, 112, 112), 3, 2, (1, 1), (56, 56)),    # MobileNetV3's / EfficientNet's stride-2 112 x 112
    ((1, 4, 112, 112), 3, 1, (1, 1), (112, 112)),  # their stride-1 112 x 112
    ((1, 3, 113, 111), 3, 2, (0, 1), (56, 56)),    # odd sizes, one-sided pads (TF "SAME")
    ((2, 3, 37, 45), 5, 2, (2, 2), (19, 23)),      # a batch: the channels cycle through the weights
    ((1, 3, 30, 50), 5, 1, (2, 1), (30, 48)),      # uneven pads, a short last vector a row
    ((1, 2, 21, 40), 7, 1, (3, 3), (21, 40)),      # 7x7
    ((1, 2, 22, 41), 7, 2, (3, 2), (11, 20)),      # 7x7 stride 2
    ((1, 3, 9, 9), 3, 1, (1, 1), (9, 9)),          # rows shorter than a vector
    ((1, 3, 5, 36), 3, 2, (1, 1), (3, 18)),        # fewer output rows than a pass (4)
    ((1, 2, 6, 33), 5, 1, (0, 0), (2, 29)),        # no pads: 2 output rows
    ((1, 2, 8, 20), 3, 1, (4, 5), (10, 22)),       # pads larger than the window
    ((1, 2, 1, 1), 3, 1, (1, 1), (1, 1)),          # one pixel
    ((1, 2, 6, 20), 3, 2, (9, 20), (12, 24)),      # large pads: whole vectors and rows of padding
    ((1, 2, 6, 20), 5, 2, (40, 50), (3, 20)),      # pads past every output's window: the bias alone
    ((1, 3, 6, 23), 3, 1, (1, 1), (6, 23)),        # stride 1, 4 to 7 output rows: passes of 4, the last moved up
    ((1, 2, 7, 19), 7, 1, (3, 3), (7, 19)),        # 7x7 on 7 rows: every pass at the row edges
    ((1, 3, 12, 30), 5, 1, (2, 2), (12, 30)),      # a pass of 8 rows, then 8 moved up to end at row 12
    ((2, 3, 13, 17), 5, 1, (2, 2), (13, 17)),      # a batch, 8 + 8 rows overlapping by 3
]


@pytest.mark.skipif(not FAST, reason="the direct rows are the AVX-512 build's (CONV_FAST)")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_direct_rows_match_reference_and_the_phase_planes(case, threads):
    shape, k, s, pads, out = CASES[case]
    C = shape[1]
    x = RNG.standard_normal(shape).astype(np.float32)
    w = (RNG.standard_normal((C, 1, k, k)) * 0.3).astype(np.float32)
    b = RNG.standard_normal(C).astype(np.float32)
    want = _reference(x, w, b, s, *pads, *out, -1.0, 1.25)
    direct = _run(x, w, b, s, pads, out, -1.0, 1.25, 3, threads)
    np.testing.assert_allclose(direct, want, rtol=1e-5, atol=2e-5)
    for fast in (0, 2):  # the 8-float path and the phase planes: the same sums, another order
        np.testing.assert_allclose(direct, _run(x, w, b, s, pads, out, -1.0, 1.25, fast, threads), rtol=1e-5, atol=2e-5)
    if direct.size > 10000:  # the clip is applied
        assert (direct == -1.0).any() and (direct == 1.25).any()


@pytest.mark.skipif(not FAST, reason="the direct rows are the AVX-512 build's (CONV_FAST)")
@pytest.mark.parametrize("k,s", [(3, 1), (3, 2), (5, 2)])
def test_direct_rows_without_bias_and_with_an_activation(k, s):
    x = RNG.standard_normal((1, 3, 40, 35)).astype(np.float32)
    w = RNG.standard_normal((3, 1, k, k)).astype(np.float32)  # sums below -3: HardSwish's zeros
    p = k // 2
    out = ((40 + 2 * p - k) // s + 1, (35 + 2 * p - k) // s + 1)
    got = _run(x, w, None, s, (p, p), out, -np.inf, np.inf, 3, act="HardSwish")
    np.testing.assert_allclose(got, _reference(x, w, None, s, p, p, *out, -np.inf, np.inf, "HardSwish"),
                               rtol=1e-5, atol=2e-5)
    assert (got == 0).any() and (got < 0).any() and (got > 0).any()


@pytest.mark.skipif(not FAST, reason="the direct rows are the AVX-512 build's (CONV_FAST)")
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("k,s", [(3, 1), (3, 2), (5, 1), (5, 2), (7, 1)])
def test_direct_rows_every_activation_in_the_epilogue(k, s, act):
    # each window's instance per activation kind (a constant of the kernel): a plane with rows
    # longer than a pass and a short last vector, values spread so that every branch is met
    # (Sigmoid / SiLU past the exponential's clamp, HardSwish's and HardSigmoid's 0 and 1)
    x = (RNG.standard_normal((2, 3, 21, 37)) * 4).astype(np.float32)
    x[0, 0, 3, 4:9] = 400.0
    x[1, 2, 10, 20:25] = -400.0
    w = RNG.standard_normal((3, 1, k, k)).astype(np.float32)
    b = RNG.standard_normal(3).astype(np.float32)
    p = k // 2
    out = ((21 + 2 * p - k) // s + 1, (37 + 2 * p - k) // s + 1)
    got = _run(x, w, b, s, (p, p), out, -np.inf, np.inf, 3, threads=2, act=act)
    with np.errstate(over="ignore"):
        want = _reference(x, w, b, s, p, p, *out, -np.inf, np.inf, act)
    # float32 sums of terms up to ~1000: an absolute tolerance where they cancel
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-4)
    # fast=2: the phase planes' epilogue, the same activation on their sums (another order)
    np.testing.assert_allclose(got, _run(x, w, b, s, (p, p), out, -np.inf, np.inf, 2, act=act), rtol=2e-5, atol=2e-4)
    assert got.max() > 100 or act in ("Sigmoid", "HardSigmoid")
    lohi = (0.0, 1.0) if act in ("Sigmoid", "HardSigmoid") else (-0.4, np.inf)
    assert got.min() >= lohi[0] and got.max() <= lohi[1] and np.isfinite(got).all()


@pytest.mark.skipif(not FAST, reason="the direct rows are the AVX-512 build's (CONV_FAST)")
@pytest.mark.parametrize("act", list(ACTS))
def test_direct_rows_activation_keeps_nan(act):
    x = RNG.standard_normal((1, 2, 20, 40)).astype(np.float32)
    x[0, 0, 5, 7] = np.nan
    w = np.full((2, 1, 3, 3), 0.5, np.float32)
    got = _run(x, w, None, 1, (1, 1), (20, 40), -np.inf, np.inf, 3, act=act)
    assert np.isnan(got[0, 0, 4:7, 6:9]).all() and np.isfinite(got[0, 0, :3]).all() and np.isfinite(got[0, 1]).all()


@pytest.mark.skipif(not FAST, reason="the direct rows are the AVX-512 build's (CONV_FAST)")
def test_direct_rows_keep_nan_and_inf():
    x = RNG.standard_normal((1, 2, 20, 40)).astype(np.float32)
    x[0, 0, 5, 7] = np.nan
    x[0, 1, 10, 30] = np.inf
    w = np.full((2, 1, 3, 3), 0.5, np.float32)
    got = _run(x, w, None, 1, (1, 1), (20, 40), -np.inf, np.inf, 3)
    assert np.isnan(got[0, 0, 4:7, 6:9]).all() and np.isfinite(got[0, 0, :3]).all()
    assert np.isposinf(got[0, 1, 9:12, 29:32]).all() and np.isfinite(got[0, 1, :8]).all()


def test_default_choice_matches_reference_on_large_and_small_planes():
    # fast=1: the direct rows (the 8-float path without AVX-512), bit for bit fast=3's result
    for shape, k, s, pads, out in (CASES[0], CASES[1], CASES[3]):
        C = shape[1]
        x = RNG.standard_normal(shape).astype(np.float32)
        w = (RNG.standard_normal((C, 1, k, k)) * 0.3).astype(np.float32)
        b = RNG.standard_normal(C).astype(np.float32)
        got = _run(x, w, b, s, pads, out, 0.0, 6.0, 1, 2)
        np.testing.assert_allclose(got, _reference(x, w, b, s, *pads, *out, 0.0, 6.0), rtol=1e-5, atol=2e-5)
        if FAST:
            assert np.array_equal(got, _run(x, w, b, s, pads, out, 0.0, 6.0, 3, 1))


@pytest.mark.parametrize("fast", [-1, 4])
def test_fast_out_of_range_is_a_value_error(fast):
    x = np.zeros((1, 1, 4, 4), np.float32)
    w = np.zeros((1, 1, 3, 3), np.float32)
    with pytest.raises(ValueError, match="fast"):
        _run(x, w, None, 1, (1, 1), (4, 4), 0.0, 6.0, fast)


@pytest.mark.kernel
@pytest.mark.skipif(not FAST, reason="expand_dw is the AVX-512 build's (CONV_FAST)")
@pytest.mark.parametrize("k,s", [(3, 1), (3, 2)])
def test_expand_dw_on_a_large_plane_matches_reference(k, s):
    # the pair runs its depthwise step through the direct rows, here on 112 x 112
    from runtime_provider_cpu.fast.packing import pack_rows

    M, C, H, W = 20, 8, 112, 112
    p = k // 2
    OH, OW = (H + 2 * p - k) // s + 1, (W + 2 * p - k) // s + 1
    x = RNG.standard_normal((1, C, H, W)).astype(np.float32)
    w = (RNG.standard_normal((M, C)) * 0.3).astype(np.float32)
    b = RNG.standard_normal(M).astype(np.float32)
    wd = (RNG.standard_normal((M, 1, k, k)) * 0.3).astype(np.float32)
    bd = RNG.standard_normal(M).astype(np.float32)
    y = np.full((1, M, OH, OW), np.nan, np.float32)
    _native.expand_dw(pack_rows(w), x, b, 0.0, 6.0, wd, bd, y, (M, C, H, W), (OH, OW, s, p, p), -1.0, 1.0, 2, k)
    e = np.clip(np.einsum("mc,nchw->nmhw", w.astype(np.float64), x) + b[None, :, None, None], 0.0, 6.0)
    want = _reference(e, wd, bd, s, p, p, OH, OW, -1.0, 1.0)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
