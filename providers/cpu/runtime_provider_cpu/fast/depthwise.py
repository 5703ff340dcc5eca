"""Depthwise convolution (one input and one output channel a group): the compiled plan for
one float32 image, and the numpy paths the general convolution takes for the others."""

from __future__ import annotations

import numpy as np

from .plan import ConvPlan


def depthwise_flat(xp, wk, ks, strides, dilations, out, b=None):
    """2-D depthwise convolution (one input channel and one output channel per group) of the
    padded input ``xp`` [N, C, Hp, Wp] with ``wk`` [C, KH*KW]: one multiply and one add per
    kernel tap over *flat contiguous* rows, so numpy's inner loops run the whole image
    instead of one output row. A tap (i, j) of a stride-1 convolution reads the flattened
    input shifted by ``i*dh*Wp + j*dw``; the columns past the output width are computed and
    dropped. With stride s > 1 (no dilation) the input is first split into its s*s phases
    (rows and columns congruent mod s), each a contiguous image, and a tap reads the phase
    (i % s, j % s) shifted by (i // s, j // s): again a stride-1 shift. A bias ``b`` [C] is
    added by the copy that drops those columns (one pass fewer than adding it afterwards)."""
    N, C = xp.shape[:2]
    OH, OW = out
    sh, sw = strides
    if sh == 1 and sw == 1:
        phases = {(0, 0): xp}
        dh, dw = dilations
        tap = [((0, 0), i * dh, j * dw) for i in range(ks[0]) for j in range(ks[1])]
    else:
        phases = {}
        tap = []
        for i in range(ks[0]):
            for j in range(ks[1]):
                key = (i % sh, j % sw)
                if key not in phases:
                    phases[key] = None
                tap.append((key, i // sh, j // sw))
    # every phase as [N, C, PH, PW] with PW >= OW + max column shift, PH enough rows
    max_r = max(t[1] for t in tap)
    max_c = max(t[2] for t in tap)
    PH, PW = OH + max_r, OW + max_c
    if sh == 1 and sw == 1:
        src = xp[:, :, :PH, :PW]
        flat = {(0, 0): np.ascontiguousarray(src).reshape(N, C, PH * PW)}
    else:
        flat = {}
        for a, bb in phases:
            ph = xp[:, :, a::sh, bb::sw][:, :, :PH, :PW]
            if ph.shape[2] < PH or ph.shape[3] < PW:  # the last phases may be short: zero-fill
                full = np.zeros((N, C, PH, PW), dtype=xp.dtype)
                full[:, :, :ph.shape[2], :ph.shape[3]] = ph
                ph = full
            flat[(a, bb)] = np.ascontiguousarray(ph).reshape(N, C, PH * PW)
    L = (OH - 1) * PW + OW  # flat length covering every output pixel
    y = np.empty((N, C, OH * PW), dtype=xp.dtype)
    yl = y[:, :, :L]
    tmp = np.empty((N, C, L), dtype=xp.dtype)
    for kidx, (key, r, c) in enumerate(tap):
        off = r * PW + c
        src = flat[key][:, :, off:off + L]
        wv = wk[:, kidx].reshape(1, C, 1)
        if kidx == 0:
            np.multiply(src, wv, out=yl)
        else:
            np.multiply(src, wv, out=tmp)
            yl += tmp
    crop = y.reshape(N, C, OH, PW)[:, :, :, :OW]
    if b is None:
        return np.ascontiguousarray(crop)
    return np.add(crop, b.reshape(1, C, 1, 1).astype(crop.dtype, copy=False))


#: below this many output pixels per channel a depthwise convolution is one einsum over a


def depthwise_einsum(x, w, strides, dilations, pb, pe, out):
    """Depthwise 2-D convolution (one channel per group) as ``einsum`` over a strided
    ``[N, KH, KW, OH, OW, C]`` window view of the zero-padded input in channels-last order:
    one pass whose inner loop runs along the channels with a per-channel weight, writing the
    NCHW result directly."""
    N, C, H, W = x.shape
    KH, KW = w.shape[2:]
    OH, OW = out
    xp = np.zeros((N, H + pb[0] + pe[0], W + pb[1] + pe[1], C), dtype=x.dtype)
    xp[:, pb[0]:pb[0] + H, pb[1]:pb[1] + W] = x.transpose(0, 2, 3, 1)
    sn, sh, sw, sc = xp.strides
    view = np.lib.stride_tricks.as_strided(
        xp, shape=(N, KH, KW, OH, OW, C),
        strides=(sn, dilations[0] * sh, dilations[1] * sw, strides[0] * sh, strides[1] * sw, sc),
        writeable=False)
    wt = np.ascontiguousarray(w.reshape(C, KH, KW).transpose(1, 2, 0))
    return np.einsum("nijhwc,ijc->nchw", view, wt)


class DepthwisePlan(ConvPlan):
    """``_native.depthwise2d`` for the whole batch in one call: any kernel size, stride and
    dilation, bias and clip in the same pass, channel planes split between the kernel threads."""

    __slots__ = ()
    KIND = "depthwise"
    NATIVE_ACT = True
    #: the kernel's layout (depthwise2d's lanes): 0 one channel plane at a time, 1 16 channels in
    #: the lanes, 2 the same with the weights packed for it
    LANES = 0

    def __init__(self, x, w, b, clip, native, out, ks, strides, dilations, pb, threads):
        super().__init__(x, w, b, clip, native, threads)
        self.w2 = np.ascontiguousarray(w)
        self.shape = (x.shape[0], w.shape[0]) + out
        self.args = (x.shape, out, ks, tuple(strides), tuple(dilations), (pb[0], pb[1]),
                     self.lo, self.hi, self.threads)

    def _kernel_w(self):
        """The weights as the call's layout takes them."""
        return self.w2

    def _make_call(self):
        empty, f32, contig = np.empty, np.float32, np.ascontiguousarray
        fn, w2, b2, shape = self.native.depthwise2d, self._kernel_w(), self.b2, self.shape
        args = self.args + (1, self.LANES)  # fast (the AVX-512 direct rows where they apply), the layout
        if self.act is not None:
            args += self.act

        def call(x, z):
            if not x.flags.c_contiguous:
                x = contig(x)
            y = empty(shape, f32)
            fn(x, w2, b2, y, *args)
            return y
        return call


class DepthwiseLanesPlan(DepthwisePlan):
    """The same call with 16 channels of an image in the vector lanes (dilation 1, windows up
    to 7x7, the AVX-512 build): no halo or row tail computed, which a small plane is mostly
    (7x7 under 5x5), for two register transposes a block. Chosen per shape by measurement."""

    __slots__ = ("wpack",)
    KIND = "depthwise_lanes"
    #: 2: the weights packed once here (``pack_lanes16``), one load a tap instead of a gather
    #: whose lines a model's run finds cold; ``w2`` stays [C, 1, KH, KW] for the pair fusers
    LANES = 2

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.wpack = pack_lanes16(self.w2)

    def _kernel_w(self):
        return self.wpack


def pack_lanes16(w):
    """Depthwise weights [C, 1, KH, KW] as the lanes kernel loads them: [ceil(C / 16), KH * KW, 16],
    channel c of a block in lane c % 16, zeros past C."""
    C, kk = w.shape[0], w.shape[2] * w.shape[3]
    p = np.zeros((-(-C // 16) * 16, kk), np.float32)
    p[:C] = w.reshape(C, kk)
    return np.ascontiguousarray(p.reshape(-1, 16, kk).transpose(0, 2, 1))
