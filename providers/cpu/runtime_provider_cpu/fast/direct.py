"""The direct convolution (``_native.conv2d``): dense float32 convolutions of stride at
most 2, weights packed once, position tiles over phase planes of the input."""

from __future__ import annotations

from .packing import pack_direct, pack_lanes
from .plan import ConvPlan, dense_call


class DirectPlan(ConvPlan):
    """Any batch; bias, residual, clip and FusedConv's activation in the epilogue, on
    ``threads`` threads. With
    ``lanes`` (narrow outputs, many terms a sum) the output channels are in the vector lanes,
    so no column past the output's width is computed."""

    __slots__ = ()
    KIND = "direct"
    NATIVE_ACT = True

    def __init__(self, x, w, b, clip, native, out, strides, dilations, pb, lanes, threads):
        super().__init__(x, w, b, clip, native, threads)
        ks = tuple(w.shape[2:])
        self.w2 = pack_lanes(w) if lanes else pack_direct(w)
        self.shape = (x.shape[0], w.shape[0]) + out
        self.args = (x.shape, (w.shape[0],) + ks, tuple(strides), tuple(dilations), (pb[0], pb[1]), out,
                     self.lo, self.hi, self.threads, lanes)

    def _make_call(self):
        # the activation after ``args`` (no extra convolution): the pair fusers read ``args`` as they are
        args = self.args if self.act is None else self.args + (None, tuple(self.act))
        return dense_call(self.native.conv2d, self.w2, self.b2, self.shape, args)
