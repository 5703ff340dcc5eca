"""The AVX-512 depthwise kernel with 16 channels in the vector lanes (``depthwise2d(..., lanes=True)``,
the small planes' plan) against a float64 reference: its input filled 16 pixels of the flat plane
a transpose (across row ends; rows and columns past the padded extent dropped), 8 output pixels of
a row a pass (row tails of 1 to 7, rows shorter than a pass), the 3/5/7-wide windows at stride 1
and 2 on their own loops and any other window (2x2, 4x4, 3x5, 6x6) on the general one, channel
counts off the 16-lane blocks, a batch, no bias, one-sided, oversized and no pads, clip and the
epilogue's activations, 1 and 2 threads; and the same bits as the phase-plane kernel's sums where
both add the taps in the same order (its direct rows, ``fast=3``, are compared within rounding)."""

from __future__ import annotations

import numpy as np
import pytest

_native = pytest.importorskip("runtime_provider_cpu._native")

pytestmark = pytest.mark.native

RNG = np.random.default_rng(2710)
FAST = bool(getattr(_native, "CONV_FAST", 0))

# activate's kinds as depthwise2d takes them: (kind, alpha, beta)
ACTS = {None: (), "HardSwish": (0, 1.0 / 6.0, 0.5), "Sigmoid": (2, 0.0, 0.0), "SiLU": (3, 0.0, 0.0)}


def _reference(x, w, b, s, pads, out, lo, hi, act):
    """float64 depthwise convolution: rows / columns outside the input read 0"""
    N, C, H, W = x.shape
    KH, KW = w.shape[-2:]
    (sh, sw), (pt, pl), (OH, OW) = s, pads, out
    Hp, Wp = max(H + pt, (OH - 1) * sh + KH), max(W + pl, (OW - 1) * sw + KW)
    xp = np.zeros((N, C, Hp, Wp))
    xp[:, :, pt:pt + H, pl:pl + W] = x
    y = np.zeros((N, C, OH, OW)) + (0.0 if b is None else b.astype(np.float64)[None, :, None, None])
    for ky in range(KH):
        for kx in range(KW):
            y += w[None, :, 0, ky, kx, None, None].astype(np.float64) * \
                xp[:, :, ky:ky + (OH - 1) * sh + 1:sh, kx:kx + (OW - 1) * sw + 1:sw]
    y = np.clip(y, lo, hi)
    if act == "HardSwish":
        y = y * np.clip(y / 6 + 0.5, 0, 1)
    elif act == "Sigmoid":
        y = 1 / (1 + np.exp(-y))
    elif act == "SiLU":
        y = y / (1 + np.exp(-y))
    return y


def _run(x, w, b, s, pads, out, lo=-np.inf, hi=np.inf, act=None, threads=1, lanes=True, fast=1):
    N, C, H, W = x.shape
    y = np.full((N, C) + out, np.nan, np.float32)
    _native.depthwise2d(x, w, b, y, (N, C, H, W), out, w.shape[-2:], s, (1, 1), pads, lo, hi, threads, fast,
                        lanes, *ACTS[act])
    return y


def _out(H, W, k, s, pads_b, pads_e):
    return ((H + pads_b[0] + pads_e[0] - k[0]) // s[0] + 1, (W + pads_b[1] + pads_e[1] - k[1]) // s[1] + 1)


# (N, C, H, W), (KH, KW), (sh, sw), pads begin (top, left), pads end (bottom, right)
CASES = [
    ((1, 960, 7, 7), (5, 5), (1, 1), (2, 2), (2, 2)),        # MobileNetV3's last stage: a 7-pixel row
    ((1, 40, 14, 14), (3, 3), (1, 1), (1, 1), (1, 1)),       # 14: one pass of 8 and a tail of 6
    ((2, 17, 9, 9), (5, 5), (2, 2), (2, 2), (2, 2)),         # stride 2, a batch, one channel past a block
    ((1, 33, 28, 28), (5, 5), (2, 2), (1, 1), (2, 2)),       # one-sided pads (TF "SAME"), 14 outputs a row
    ((1, 5, 11, 17), (7, 7), (1, 1), (3, 3), (3, 3)),        # 7x7, rows of 17: two passes and a tail of 1
    ((1, 16, 13, 10), (7, 7), (2, 2), (3, 1), (3, 2)),       # 7x7 stride 2, uneven pads
    ((1, 20, 8, 8), (3, 3), (2, 2), (0, 0), (0, 0)),         # no pads: the last input row and column unread
    ((1, 7, 5, 6), (3, 3), (1, 1), (4, 3), (4, 5)),          # pads wider than the window: all-zero rows
    ((1, 18, 12, 12), (2, 2), (1, 1), (0, 0), (1, 1)),       # even windows: the general loop
    ((1, 24, 10, 9), (4, 4), (2, 2), (1, 2), (2, 1)),
    ((1, 19, 9, 12), (3, 5), (1, 2), (1, 2), (1, 2)),        # KH != KW, the column stride alone 2
    ((1, 16, 15, 15), (6, 6), (1, 1), (3, 2), (2, 3)),
    ((1, 3, 1, 1), (3, 3), (1, 1), (1, 1), (1, 1)),          # one pixel
    ((1, 32, 3, 20), (5, 5), (1, 1), (2, 2), (2, 2)),        # fewer rows than the window
]


@pytest.mark.skipif(not FAST, reason="the lanes kernel is the AVX-512 build's")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_lanes_match_reference(case, threads):
    shape, k, s, pb, pe = CASES[case]
    out = _out(shape[2], shape[3], k, s, pb, pe)
    x = RNG.standard_normal(shape).astype(np.float32)
    w = (RNG.standard_normal((shape[1], 1) + k) * 0.3).astype(np.float32)
    b = RNG.standard_normal(shape[1]).astype(np.float32)
    for bias in (b, None):
        got = _run(x, w, bias, s, pb, out, threads=threads)
        np.testing.assert_allclose(got, _reference(x, w, bias, s, pb, out, -np.inf, np.inf, None),
                                   rtol=1e-5, atol=1e-5)
    # the direct rows sum the same taps: equal within rounding on every shape
    np.testing.assert_allclose(got, _run(x, w, None, s, pb, out, lanes=False, fast=3), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not FAST, reason="the lanes kernel is the AVX-512 build's")
@pytest.mark.parametrize("act", ["HardSwish", "Sigmoid", "SiLU"])
@pytest.mark.parametrize("case", [0, 2, 5, 10])
def test_lanes_clip_and_activation(case, act):
    shape, k, s, pb, pe = CASES[case]
    out = _out(shape[2], shape[3], k, s, pb, pe)
    x = (RNG.standard_normal(shape) * 3).astype(np.float32)
    w = (RNG.standard_normal((shape[1], 1) + k) * 0.3).astype(np.float32)
    b = RNG.standard_normal(shape[1]).astype(np.float32)
    got = _run(x, w, b, s, pb, out, lo=-2.5, hi=4.0, act=act, threads=2)
    np.testing.assert_allclose(got, _reference(x, w, b, s, pb, out, -2.5, 4.0, act), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not FAST, reason="the lanes kernel is the AVX-512 build's")
def test_lanes_keep_nan_and_leave_other_outputs_alone():
    # a NaN input reaches exactly the outputs whose windows hold it; the batch's other image is clean
    x = RNG.standard_normal((2, 16, 7, 7)).astype(np.float32)
    x[0, 3, 0, 6] = np.nan
    w = RNG.standard_normal((16, 1, 3, 3)).astype(np.float32)
    got = _run(x, w, None, (1, 1), (1, 1), (7, 7))
    bad = np.isnan(got)
    assert bad[0, 3, :2, 5:].all() and bad.sum() == 4
    assert not bad[1].any()


@pytest.mark.kernel
@pytest.mark.skipif(not FAST, reason="the lanes kernel is the AVX-512 build's")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_lanes_packed_weights_give_the_same_bits(case, threads):
    # lanes=2: the weights packed once (the plan's pack_lanes16), one load a tap instead of a gather;
    # the same taps in the same order as lanes=1, so the same bits, with and without an activation
    from runtime_provider_cpu.fast.depthwise import pack_lanes16

    shape, k, s, pb, pe = CASES[case]
    out = _out(shape[2], shape[3], k, s, pb, pe)
    x = (RNG.standard_normal(shape) * 2).astype(np.float32)
    w = (RNG.standard_normal((shape[1], 1) + k) * 0.3).astype(np.float32)
    b = RNG.standard_normal(shape[1]).astype(np.float32)
    wp = pack_lanes16(w)
    assert wp.shape == (-(-shape[1] // 16), k[0] * k[1], 16)
    for act in (None, "SiLU"):
        want = _run(x, w, b, s, pb, out, lo=-3.0, hi=5.0, act=act, threads=threads, lanes=1)
        got = np.full_like(want, np.nan)
        _native.depthwise2d(x, wp, b, got, shape, out, k, s, (1, 1), pb, -3.0, 5.0, threads, 1, 2, *ACTS[act])
        assert np.array_equal(got, want, equal_nan=True), act
        assert not np.isnan(got).any()


@pytest.mark.kernel
def test_lanes_packed_weights_checked():
    from runtime_provider_cpu.fast.depthwise import pack_lanes16

    x = RNG.standard_normal((1, 20, 7, 7)).astype(np.float32)
    w = RNG.standard_normal((20, 1, 3, 3)).astype(np.float32)
    with pytest.raises(ValueError, match="lanes"):  # out of range
        _run(x, w, None, (1, 1), (1, 1), (7, 7), lanes=3)
    y = np.empty((1, 20, 7, 7), np.float32)
    args = ((1, 20, 7, 7), (7, 7), (3, 3), (1, 1), (1, 1), (1, 1), -np.inf, np.inf, 1, 1, 2)
    if not FAST:  # no lanes kernel: packed weights have no reader
        with pytest.raises(ValueError, match="packed weights"):
            _native.depthwise2d(x, pack_lanes16(w), None, y, *args)
        return
    with pytest.raises(ValueError):  # the unpacked size where the packed one (32 channels) is expected
        _native.depthwise2d(x, w, None, y, *args)
    y = np.empty((1, 20, 4, 4), np.float32)  # dilation 2: not the lanes kernel's
    with pytest.raises(ValueError, match="packed weights"):
        _native.depthwise2d(x, pack_lanes16(w), None, y, (1, 20, 7, 7), (4, 4), (3, 3), (1, 1), (2, 2), (1, 1),
                            -np.inf, np.inf, 1, 1, 2)
