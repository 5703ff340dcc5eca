"""CPU kernels: Softmax, LogSoftmax and Hardmax (opset 1-11 on the 2-D coercion, 13 on one axis)."""

from __future__ import annotations

import math

import numpy as np

from ..executable import inplace_variant
from ..fast.policy import NATIVE as _native
from ..registry import kernel
from ._common import normalize_axis
from ._nncommon import _BF16, _FLOAT, _as, _cdtype


def _softmax_axis(x, axis, log):
    if x.size == 0:
        return x.copy()
    dt = x.dtype
    xc = _as(x, _cdtype(dt))
    m = np.max(xc, axis=axis, keepdims=True)
    e = xc - m
    if log:
        y = e - np.log(np.sum(np.exp(e), axis=axis, keepdims=True))
    else:
        np.exp(e, out=e)
        e /= np.sum(e, axis=axis, keepdims=True)
        y = e
    return _as(y, dt)


def _softmax_native(ctx, x, axis, own):
    """float32 C-contiguous ``x`` over its last axis: the compiled row softmax
    (``_native.softmax``, one pass a row on the kernel pool; numpy took ~7 passes), in ``x``
    where ``own`` else in a copy; None where it does not apply (numpy then)."""
    if (_native is None or x.dtype != np.float32 or not x.size or not x.flags.c_contiguous
            or axis != x.ndim - 1):
        return None
    y = x if own else x.copy()
    t = x.shape[-1]
    _native.softmax(y, (y.size // t, t), 1, max(1, int(getattr(ctx, "threads", 1) or 1)))
    return y


def _hardmax_axis(x, axis):
    y = np.zeros_like(x)
    if x.size == 0:
        return y
    idx = np.expand_dims(np.argmax(x, axis=axis), axis)
    np.put_along_axis(y, idx, 1, axis=axis)
    return y


def _coerce_2d(fn):
    def run(x, axis):
        ax = normalize_axis(axis, x.ndim) if x.ndim else 0
        lead = math.prod(x.shape[:ax])
        return fn(x.reshape(lead, -1), 1).reshape(x.shape)
    return run


@kernel("Softmax", 1, 11, dtypes=_FLOAT)
def softmax_1(ctx, x, *, axis):
    if x.ndim:
        ax = normalize_axis(axis, x.ndim)
        y = _softmax_native(ctx, x.reshape(math.prod(x.shape[:ax]), -1), 1, False)
        if y is not None:
            return y.reshape(x.shape)
    return _coerce_2d(lambda a, ax: _softmax_axis(a, ax, False))(x, axis)


@kernel("Softmax", 13, dtypes=_FLOAT | _BF16)
def softmax_13(ctx, x, *, axis):
    ax = normalize_axis(axis, x.ndim)
    y = _softmax_native(ctx, x, ax, False)
    if y is not None:
        return y
    return _softmax_axis(x, normalize_axis(axis, x.ndim), False)


@inplace_variant(softmax_13, 0)
def softmax_13_inplace(ctx, owned, x, *, axis):
    if x.dtype not in (np.float32, np.float64) or x.size == 0:
        return softmax_13(ctx, x, axis=axis)
    ax = normalize_axis(axis, x.ndim)
    y = _softmax_native(ctx, x, ax, True)
    if y is not None:
        return y
    # _softmax_axis's arithmetic, in x
    m = np.max(x, axis=ax, keepdims=True)
    np.subtract(x, m, out=x)
    np.exp(x, out=x)
    x /= np.sum(x, axis=ax, keepdims=True)
    return x


@kernel("LogSoftmax", 1, 11, dtypes=_FLOAT)
def log_softmax_1(ctx, x, *, axis):
    return _coerce_2d(lambda a, ax: _softmax_axis(a, ax, True))(x, axis)


@kernel("LogSoftmax", 13, dtypes=_FLOAT | _BF16)
def log_softmax_13(ctx, x, *, axis):
    return _softmax_axis(x, normalize_axis(axis, x.ndim), True)


@kernel("Hardmax", 1, 11, dtypes=_FLOAT)
def hardmax_1(ctx, x, *, axis):
    return _coerce_2d(_hardmax_axis)(x, axis)


@kernel("Hardmax", 13, dtypes=_FLOAT)
def hardmax_13(ctx, x, *, axis):
    return _hardmax_axis(x, normalize_axis(axis, x.ndim))


