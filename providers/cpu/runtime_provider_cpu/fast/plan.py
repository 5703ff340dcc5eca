"""The conv plan: what one Conv node does for one input shape, decided on its first run.

A plan keeps what it derived from the weights (packed copies) with the arrays they came
from, so only weights and bias that are the partition's constants get one (a weight fed at
run time may be the same array with new values). Later runs with the same shape, weights
and bias go straight to its kernel. Each algorithm is a subclass (``fast/winograd.py``,
``direct.py``, ``pointwise.py``, ``depthwise.py``, ``im2col.py``); :func:`~.conv.select_plan`
picks one.
"""

from __future__ import annotations

import numpy as np

_F32 = np.float32


class ConvPlan:
    """No fast path (``kind`` None): the node takes the general convolution. Subclasses set
    ``w2`` (the packed weights), ``shape`` (the output's) and ``args`` (the kernel's fixed
    arguments) and build the call in :meth:`_make_call`."""

    __slots__ = ("xshape", "w", "b", "clip", "kind", "native", "w2", "b2", "lo", "hi", "shape", "args",
                 "threads", "_call", "act")
    KIND: str | None = None
    #: whether the kernel applies ``act`` in its own epilogue (else a pass over the result)
    NATIVE_ACT = False
    #: the kinds whose kernels add a residual in their epilogue
    Z_KINDS = ("pointwise", "direct", "winograd", "im2col", "im2col_sgemm", "im2col_lanes", "pointwise_rows")

    def __init__(self, x, w, b, clip, native=None, threads=1):
        self.xshape, self.w, self.b, self.clip, self.kind = x.shape, w, b, clip, self.KIND
        self.native, self.threads, self._call = native, max(1, int(threads)), None
        lo, hi = (-np.inf, np.inf) if clip is None else clip
        self.lo, self.hi = float(lo), float(hi)
        self.b2 = None if b is None or self.KIND is None else np.ascontiguousarray(b, dtype=_F32)
        self.w2 = self.shape = self.args = None
        self.act = None

    def set_act(self, act):
        """A FusedConv activation after the clip: ``act`` = (kind, alpha, beta), the kind as
        ``_native.activate``'s, or None. Set before the first call."""
        self.act = act
        self._call = None

    def takes(self, x, w, b, z):
        """Whether ``run`` computes this node's convolution of these inputs: a plan, made for
        x's shape and these weight arrays; a residual only on the kernels with an epilogue."""
        return (self.kind is not None and x.shape == self.xshape and w is self.w and b is self.b
                and (z is None or (self.kind in self.Z_KINDS and z.shape == self.shape and z.dtype == _F32)))

    def fast_call(self):
        """The plan's convolution as one closure ``call(x, z)`` (z None or a residual ``takes``
        accepts), the kernel and its arguments fixed once, on first use: what ``run`` and the
        bound step (``bind_plan``) call."""
        if self._call is None:
            self._call = self.act_call()
        return self._call

    def act_call(self):
        """A new ``call(x, z)`` with the activation: in the kernel's epilogue where it has one
        (``NATIVE_ACT``), else one compiled pass over the result."""
        call = self._make_call()
        if self.act is None or self.NATIVE_ACT:
            return call
        activate, (kind, alpha, beta) = self.native.activate, self.act

        def act_call(x, z):
            y = call(x, z)
            if not y.flags.c_contiguous:
                y = np.ascontiguousarray(y)
            activate(y, y, y.size, kind, alpha, beta)
            return y
        return act_call

    def run(self, x, z=None):
        """The convolution of ``x`` (plus ``z``: pointwise, direct and winograd plans only)."""
        return self.fast_call()(x, z)

    def _make_call(self):
        raise TypeError("a ConvPlan of kind None has no kernel to call")


def dense_call(fn, w2, b2, shape, args):
    """``call(x, z)`` of a kernel of the ``_native.conv2d`` signature (direct, Winograd)."""
    empty, contig = np.empty, np.ascontiguousarray

    def call(x, z):
        if not x.flags.c_contiguous:
            x = contig(x)
        y = empty(shape, _F32)
        fn(x, w2, b2, None if z is None else contig(z), y, *args)
        return y
    return call
