"""Pointwise (1x1) convolutions: ``_native.pointwise_lanes`` (the output channels in the
vector lanes; a batch in one call), else, one image at a time, SciPy's sgemm a block on the
kernel threads (``_native.pointwise``), else one numpy GEMM and the compiled epilogue; and
``_native.pointwise_rows`` (:class:`PointwiseRowsPlan`: the Linear over the positions, any
stride), a candidate of its own."""

from __future__ import annotations

import numpy as np

from .packing import pack_linear, pack_rows
from .plan import ConvPlan
from .sgemm import sgemm_ready

_F32 = np.float32


class PointwisePlan(ConvPlan):
    """``sub`` (strides, or None): a strided 1x1 (a downsampling shortcut) runs on the
    subsampled image, cheaper than the direct kernel's phase planes for its few
    multiply-adds. ``lanes``: ``w12`` holds the weights for the lanes kernel."""

    __slots__ = ("w12", "sub")
    KIND = "pointwise"
    NATIVE_ACT = True

    def __init__(self, x, w, b, clip, native, out, sub, lanes, threads):
        super().__init__(x, w, b, clip, native, threads)
        M, C = w.shape[:2]
        self.sub = sub
        self.w2 = np.ascontiguousarray(w.reshape(M, C))
        self.w12 = pack_rows(self.w2) if lanes else None
        self.shape = (x.shape[0], M) + out
        self.args = ((M, out[0] * out[1]), self.lo, self.hi)

    def _make_call(self):
        one, N = self._make_call_one(), self.xshape[0]
        if N == 1:
            return lambda x, z: one(x, z, None)
        empty, contig, shape = np.empty, np.ascontiguousarray, self.shape
        if self.w12 is not None and self.sub is None:
            return self._make_call_batch()

        def call(x, z):  # a batch: one GEMM an image on NCHW as it is (no [C, N*P] copy)
            if not x.flags.c_contiguous:
                x = contig(x)
            if z is not None and not z.flags.c_contiguous:
                z = contig(z)
            y = empty(shape, _F32)
            for n in range(N):
                one(x[n:n + 1], None if z is None else z[n:n + 1], y[n:n + 1])
            return y
        return call

    def _make_call_batch(self):
        """``call(x, z)`` of a batch as one ``pointwise_lanes`` call: the images' tiles are the
        kernel threads' units together (an image a call woke the threads N times, for a few
        tiles each at 14 x 14 and 7 x 7)."""
        empty, contig, fn = np.empty, np.ascontiguousarray, self.native.pointwise_lanes
        w12, b2, th, shape, N = self.w12, self.b2, self.threads, self.shape, self.xshape[0]
        (M, P), lo, hi = self.args
        dims = (M, self.xshape[1], P)
        act = (-1, 1.0 / 6.0, 0.5) if self.act is None else self.act

        def call(x, z):
            if not x.flags.c_contiguous:
                x = contig(x)
            y = empty(shape, _F32)
            fn(w12, x, b2, None if z is None else contig(z), y, dims, lo, hi, th, *act, N)
            return y
        return call

    def _make_call_one(self):
        """``call(x, z, y)``: one image's result, into ``y`` (contiguous) when given."""
        empty, contig, nat = np.empty, np.ascontiguousarray, self.native
        shape = (1,) + self.shape[1:]
        w2, b2, args, w12, th, sub = self.w2, self.b2, self.args, self.w12, self.threads, self.sub
        (M, P), lo, hi = args
        dims = (M, self.xshape[1], P)
        act = () if self.act is None else self.act  # the kernels' epilogue's activation
        if w12 is not None and sub is None:
            fn = nat.pointwise_lanes

            def call(x, z, y):
                if not x.flags.c_contiguous:
                    x = contig(x)
                if y is None:
                    y = empty(shape, _F32)
                fn(w12, x, b2, None if z is None else contig(z), y, dims, lo, hi, th, *act)
                return y
            return call

        def call(x, z, y):
            if sub is not None:  # a strided 1x1: the subsampled image
                x = x[:, :, ::sub[0], ::sub[1]]
            if not x.flags.c_contiguous:
                x = contig(x)
            zz = None if z is None else contig(z)
            if w12 is not None or sgemm_ready():
                if y is None:
                    y = empty(shape, _F32)
                if w12 is not None:
                    nat.pointwise_lanes(w12, x, b2, zz, y, dims, lo, hi, th, *act)
                else:
                    # a pass after: in sgemm's per-block epilogue the activation was slower
                    nat.pointwise(w2, x, b2, zz, y, dims, lo, hi, th)
                    if act:
                        nat.activate(y, y, y.size, *act)
                return y
            r = np.matmul(w2, x.reshape(dims[1], P), out=None if y is None else y.reshape(M, P))
            if zz is None:
                nat.bias_clip(r, b2, *args)
            else:
                nat.bias_clip(r, b2, *args, zz)
            if act:
                nat.activate(r, r, r.size, *act)
            return r.reshape(shape)
        return call


class PointwiseRowsPlan(ConvPlan):
    """A 1x1 convolution (no pads, strides ``strides``) on ``_native.pointwise_rows``: the
    positions in 12-row panels split as evenly as the plane allows (a 7 x 7 or 14 x 14 plane
    fills whole tiles, where the lanes kernel's 32-position panels compute 14-31% more), the output
    channels in the vector lanes; a strided one reads its positions in place (no subsampled
    copy). ``w2`` holds the weights packed as the Linear's [ceil(M / 32)][C][32]."""

    __slots__ = ()
    KIND = "pointwise_rows"
    NATIVE_ACT = True

    def __init__(self, x, w, b, clip, native, out, strides, threads):
        super().__init__(x, w, b, clip, native, threads)
        M, C = w.shape[:2]
        self.w2 = pack_linear(w.reshape(M, C), True)
        self.shape = (x.shape[0], M) + tuple(out)
        self.args = ((M, C, x.shape[2], x.shape[3]), (int(strides[0]), int(strides[1])))

    def _make_call(self):
        empty, contig, fn = np.empty, np.ascontiguousarray, self.native.pointwise_rows
        w2, b2, th, shape, N = self.w2, self.b2, self.threads, self.shape, self.xshape[0]
        dims, strides = self.args
        lo, hi = self.lo, self.hi
        act = (-1, 1.0 / 6.0, 0.5) if self.act is None else self.act

        def call(x, z):
            if not x.flags.c_contiguous:
                x = contig(x)
            y = empty(shape, _F32)
            fn(w2, x, b2, None if z is None else contig(z), y, dims, strides, lo, hi, th, *act, N)
            return y
        return call
