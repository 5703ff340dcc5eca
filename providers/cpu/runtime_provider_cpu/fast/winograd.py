"""Winograd F(2x2, 3x3) for dense 3x3 stride-1 convolutions (``_native.winograd3x3``):
2.25x fewer multiply-adds than the direct kernel, plus the transforms."""

from __future__ import annotations

from .packing import pack_winograd, pack_winograd_lanes
from .plan import ConvPlan, dense_call


class WinogradPlan(ConvPlan):
    """Tiles of 48 a block; with ``lanes`` (narrow outputs) the output channels in the vector
    lanes and the tiles compacted, 12 a GEMM tile. Any batch; bias, residual and clip in the
    epilogue."""

    __slots__ = ()
    KIND = "winograd"

    def __init__(self, x, w, b, clip, native, out, pb, lanes, threads):
        super().__init__(x, w, b, clip, native, threads)
        self.w2 = pack_winograd_lanes(w) if lanes else pack_winograd(w)
        self.shape = (x.shape[0], w.shape[0]) + out
        self.args = (x.shape, w.shape[0], (pb[0], pb[1]), out, self.lo, self.hi, self.threads, lanes)

    def _make_call(self):
        return dense_call(self.native.winograd3x3, self.w2, self.b2, self.shape, self.args)
