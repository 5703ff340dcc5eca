"""im2col for the GEMM convolution: the ``[C, KH, KW, N, OH, OW]`` matrix of a 2-D
convolution in reused scratch memory, read straight from the unpadded input (sized from the
output, never from the padded extent); and :class:`Im2colPlan`, the conv plan of im2col and
a BLAS GEMM (the library call the compiled plans are measured against), and its compiled
variants (SciPy's sgemm a block, or the pointwise kernel's packed tiles)."""

from __future__ import annotations

import numpy as np

from ..ops._common import Scratch
from ..ops._nncommon import _pad_const, _tap_range
from .packing import pack_rows
from .plan import ConvPlan
from .policy import current


def im2col_2d(x, ks, strides, dilations, pb, out):
    """The im2col matrix of a 2-D convolution as ``[C, KH, KW, N, OH, OW]`` in reused scratch
    memory (see ``Scratch``), read straight from the unpadded input: each kernel tap is one
    strided copy of the input rectangle it sees, and only the border strips that fall in the
    padding are zeroed (a transposed ``sliding_window_view`` of a padded copy runs inner
    loops over the kernel taps)."""
    N, C, H, W = x.shape
    KH, KW = ks
    OH, OW = out
    sh, sw = strides
    dh, dw = dilations
    cols = Scratch.get((C, KH, KW, N, OH, OW), x.dtype)
    if ((sh, sw) == (KH, KW) and dh == 1 and dw == 1 and pb[0] == 0 and pb[1] == 0
            and OH * KH <= H and OW * KW <= W):
        # non-overlapping patches (a ViT patch embedding, 16x16/16): the im2col matrix is a
        # transpose of the input, one copy instead of one a tap
        patches = x[:, :, :OH * KH, :OW * KW].reshape(N, C, OH, KH, OW, KW)
        np.copyto(cols, patches.transpose(1, 3, 5, 0, 2, 4))
        return cols
    if (sh > 1 or sw > 1) and dh == 1 and dw == 1 and KH * KW >= current().phase_taps * sh * sw:
        return im2col_phases(x, ks, strides, pb, out, cols)
    xt = x.transpose(1, 0, 2, 3)  # [C, N, H, W] view
    for i in range(KH):
        r0, r1 = _tap_range(H, pb[0], i * dh, sh, OH)
        for j in range(KW):
            c0, c1 = _tap_range(W, pb[1], j * dw, sw, OW)
            dst = cols[:, i, j]
            if r0 > 0:
                dst[:, :, :r0] = 0
            if r1 < OH:
                dst[:, :, r1:] = 0
            if c0 > 0:
                dst[:, :, r0:r1, :c0] = 0
            if c1 < OW:
                dst[:, :, r0:r1, c1:] = 0
            if r1 > r0 and c1 > c0:
                ir = r0 * sh + i * dh - pb[0]
                ic = c0 * sw + j * dw - pb[1]
                dst[:, :, r0:r1, c0:c1] = xt[:, :, ir:ir + (r1 - r0 - 1) * sh + 1:sh,
                                             ic:ic + (c1 - c0 - 1) * sw + 1:sw]
    return cols




def im2col_phases(x, ks, strides, pb, out, cols):
    """``im2col_2d`` of a strided convolution with many taps per phase (a 7x7 stride-2 stem):
    the zero-padded input is first split into its ``sh * sw`` phases (rows and columns
    congruent mod the stride, each a contiguous copy), so that every tap copies unit-stride
    rows of one phase instead of gathering every ``sw``-th element (with few taps per phase,
    3x3/2, the phase copies cost more than they save)."""
    N, C, H, W = x.shape
    KH, KW = ks
    OH, OW = out
    sh, sw = strides
    # pad the end just enough for the last output's taps (the convolution's own end padding
    # may be larger: those rows are never read)
    pe = [max(0, (OH - 1) * sh + KH - (H + pb[0])), max(0, (OW - 1) * sw + KW - (W + pb[1]))]
    xt = _pad_const(x, pb, pe, 0).transpose(1, 0, 2, 3)  # [C, N, Hp, Wp]
    phases = {}
    for i in range(KH):
        for j in range(KW):
            key = (i % sh, j % sw)
            ph = phases.get(key)
            if ph is None:
                ph = phases[key] = np.ascontiguousarray(xt[:, :, key[0]::sh, key[1]::sw])
            r, c = i // sh, j // sw
            cols[:, i, j] = ph[:, :, r:r + OH, c:c + OW]
    return cols


class Im2colPlan(ConvPlan):
    """im2col and one GEMM a group (numpy's matmul: the BLAS library's sgemm), the numpy
    depthwise paths for depthwise convolutions, bias, residual and clip after it: the library
    call every compiled plan is measured against. Any batch, any group."""

    __slots__ = ()
    KIND = "im2col"
    #: the GEMM and depthwise convolutions on numpy (False: the compiled ones where they apply)
    LIBRARY = True

    def __init__(self, x, w, b, clip, native, out, group, strides, dilations, pb, pe, threads):
        super().__init__(x, w, b, clip, native, threads)
        self.shape = (x.shape[0], w.shape[0]) + tuple(out)
        self.args = (int(group), list(strides), list(dilations), list(pb), list(pe))

    def _make_call(self):
        from ..ops.conv import _conv_core  # the general path (ops/conv.py imports this module)

        w, b, clip, threads, library = self.w, self.b, self.clip, self.threads, self.LIBRARY
        group, strides, dilations, pb, pe = self.args
        if (self.LIBRARY and group == 1 and w.shape[2:] == (1, 1) and strides == [1, 1]
                and not any(pb) and not any(pe) and self.xshape[0] > 1):
            return self._pointwise_batch_call()

        def call(x, z):
            return _conv_core(x, w, b, group, strides, dilations, pb, pe, clip, z, threads, library=library)
        return call

    def _pointwise_batch_call(self):
        """A 1x1 stride-1 unpadded convolution of a batch: one GEMM per image written straight
        into the [N, M, H*W] result (numpy's batched matmul), then bias, sum and clip in place;
        the general path's [M, N*H*W] product and its transposed copy would hold two more
        result-sized arrays at once (MobileNet's 1x1 expansions at batch 8)."""
        N, M = self.shape[:2]
        C = self.w.shape[1]
        P = self.shape[2] * self.shape[3]
        wm = np.ascontiguousarray(self.w.reshape(M, C))
        b2, nat, shape = self.b2, self.native, self.shape
        lo, hi = self.lo, self.hi
        clip = self.clip is not None

        def call(x, z):
            y = np.matmul(wm, x.reshape(N, C, P))
            if nat is not None:
                zz = None if z is None else np.ascontiguousarray(z, dtype=np.float32).reshape(N, M, P)
                if b2 is not None or clip or zz is not None:
                    for n in range(N):  # bias, sum and clip in one pass
                        nat.bias_clip(y[n], b2, (M, P), lo, hi, None if zz is None else zz[n])
            else:
                if b2 is not None:
                    y += b2.reshape(M, 1)
                if z is not None:
                    y += z.reshape(N, M, P)
                if clip:
                    np.clip(y, np.float32(lo), np.float32(hi), out=y)
            return y.reshape(shape)
        return call


class Im2colSgemmPlan(Im2colPlan):
    """im2col for one image and SciPy's sgemm a block on the kernel threads, the epilogue
    compiled (``_native.pointwise``): the same GEMM without numpy's BLAS threads."""

    __slots__ = ()
    KIND = "im2col_sgemm"
    LIBRARY = False


class Im2colLanesPlan(ConvPlan):
    """im2col for one image (dense, group 1) and ``_native.pointwise_lanes`` on it: the
    weights packed once as the pointwise kernel's tiles, bias, residual and clip in its
    epilogue (ConvNeXt's 4x4/4 stem and 2x2/2 downsampling, whose im2col is one transpose)."""

    __slots__ = ("w12",)
    KIND = "im2col_lanes"

    def __init__(self, x, w, b, clip, native, out, strides, dilations, pb, threads):
        super().__init__(x, w, b, clip, native, threads)
        M = w.shape[0]
        self.w12 = pack_rows(np.ascontiguousarray(w.reshape(M, -1)))
        self.shape = (1, M) + tuple(out)
        self.args = (tuple(w.shape[2:]), list(strides), list(dilations), list(pb), tuple(out))

    def _make_call(self):
        empty, contig, fn, w12, b2 = np.empty, np.ascontiguousarray, self.native.pointwise_lanes, self.w12, self.b2
        ks, strides, dilations, pb, out = self.args
        shape, lo, hi, th = self.shape, self.lo, self.hi, self.threads
        dims = (shape[1], self.xshape[1] * ks[0] * ks[1], out[0] * out[1])

        def call(x, z):
            cols = im2col_2d(x, ks, strides, dilations, pb, out)  # [C*KH*KW, P] for one image
            y = empty(shape, np.float32)
            fn(w12, cols, b2, None if z is None else contig(z), y, dims, lo, hi, th)
            return y
        return call
