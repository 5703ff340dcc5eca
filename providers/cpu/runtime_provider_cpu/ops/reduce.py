"""CPU kernels: reductions (Reduce*), ArgMax/ArgMin, CumSum.

``axes`` is an attribute up to ReduceSum-11 / Reduce*-13 and an optional input
from ReduceSum-13 / Reduce*-18 on (with ``noop_with_empty_axes``). Reductions
over an empty set follow the spec: 0 (Sum, L1, L2, SumSquare), 1 (Prod),
-inf (LogSum, LogSumExp), -inf or the dtype's minimum (Max), +inf or its
maximum (Min); Mean of an empty set is NaN for floats. Integer results are
computed exactly in the integer type where the op allows it (Mean truncates
toward zero); formulas that leave the integers (L2, LogSum, LogSumExp) run in
float64 and are cast back. float16 / bfloat16 accumulate in float32.
"""

from __future__ import annotations

import math

import numpy as np

from ._common import ignore_fp, normalize_axes, normalize_axis
from ._dtypes import _ML_FLOATS, reg
from .pool import row_means

_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_IGNORE = dict(all="ignore")


def _lowp(dt: np.dtype) -> bool:
    return dt == _F16 or dt in _ML_FLOATS


def _acc_dtype(dt: np.dtype) -> np.dtype:
    """Accumulator: float32 for 16-bit and smaller floats, else the dtype itself."""
    return _F32 if _lowp(dt) else dt


def _axes(x: np.ndarray, axes) -> tuple | None:
    """Normalized, duplicate-free axes; ``None`` means every axis, ``()`` none."""
    if axes is None:
        return None
    if isinstance(axes, tuple) and not axes:
        return ()
    ax = normalize_axes(axes, x.ndim)
    if len(set(ax)) != len(ax):
        raise ValueError(f"axes {list(np.asarray(axes).reshape(-1))} contain a duplicate")
    if x.ndim == 0:
        return None
    return ax


def _count(x: np.ndarray, axes) -> int:
    if axes is None:
        return int(x.size)
    n = 1
    for a in axes:
        n *= x.shape[a]
    return n


def _sum(x, axes, keepdims):
    acc = _acc_dtype(x.dtype)
    return np.sum(x, axis=axes, keepdims=keepdims, dtype=acc)


def _r_sum(x, axes, keepdims):
    return _sum(x, axes, keepdims)


#: the dtypes whose mean over trailing axes takes pool.row_means
_ROW_MEAN = (np.dtype(np.float32), np.dtype(np.float64))


def _r_mean(x, axes, keepdims):
    n = _count(x, axes)
    if x.dtype.kind in "iu":
        wide = np.int64 if x.dtype.kind == "i" else np.uint64
        s = np.sum(x, axis=axes, keepdims=keepdims, dtype=wide)
        if n == 0:
            return s
        q = s // wide(n)
        if x.dtype.kind == "i":
            q = q + ((s % wide(n) != 0) & (s < 0)).astype(wide)  # truncate toward zero
        return q
    k = x.ndim - len(axes) if axes is not None else 0
    if (n and x.dtype in _ROW_MEAN and x.flags.c_contiguous and axes and 0 < k
            and sorted(axes) == list(range(k, x.ndim))):
        # the trailing axes (squeeze-excite's spatial mean): rows of one contiguous axis
        s = row_means(x, math.prod(x.shape[:k]))
        return s.reshape(x.shape[:k] + (1,) * len(axes) if keepdims else x.shape[:k])
    s = _sum(x, axes, keepdims)
    return s / s.dtype.type(n) if n else s * s.dtype.type(np.nan)


def _extreme(x, axes, keepdims, f, is_max):
    if x.dtype in _ML_FLOATS:
        x = x.astype(_F32)
    if _count(x, axes) == 0:
        if x.dtype == np.bool_:
            init = not is_max  # False < True
        elif x.dtype.kind == "f":
            init = -np.inf if is_max else np.inf
        else:
            info = np.iinfo(x.dtype)
            init = info.min if is_max else info.max
        return f(x, axis=axes, keepdims=keepdims, initial=init)
    return f(x, axis=axes, keepdims=keepdims)


def _r_max(x, axes, keepdims):
    return _extreme(x, axes, keepdims, np.max, True)


def _r_min(x, axes, keepdims):
    return _extreme(x, axes, keepdims, np.min, False)


def _r_prod(x, axes, keepdims):
    return np.prod(x, axis=axes, keepdims=keepdims, dtype=_acc_dtype(x.dtype))


def _r_l1(x, axes, keepdims):
    xa = x.astype(_F32) if x.dtype in _ML_FLOATS else x
    return _sum(np.abs(xa), axes, keepdims)


def _square(x):
    if x.dtype == _F16 or x.dtype in _ML_FLOATS:
        x = x.astype(_F32)
    return np.multiply(x, x)


def _r_sumsquare(x, axes, keepdims):
    return _sum(_square(x), axes, keepdims)


def _r_l2(x, axes, keepdims):
    s = _sum(_square(x), axes, keepdims)
    if s.dtype.kind in "iu":
        s = s.astype(_F64)
    return np.sqrt(s)


def _r_logsum(x, axes, keepdims):
    s = _sum(x, axes, keepdims)
    if s.dtype.kind in "iu":
        s = s.astype(_F64)
    return np.log(s)


def _r_logsumexp(x, axes, keepdims):
    is_int = x.dtype.kind in "iu"
    xf = x.astype(_F64) if is_int else (x.astype(_F32) if _lowp(x.dtype) else x)
    if _count(xf, axes) == 0:
        m = np.max(xf, axis=axes, keepdims=True, initial=-np.inf)
    else:
        m = np.max(xf, axis=axes, keepdims=True)
    m = np.where(np.isfinite(m), m, xf.dtype.type(0))
    e = np.exp(xf - m)
    r = np.log(np.sum(e, axis=axes, keepdims=keepdims))
    if is_int:
        # integers: max + the log term truncated in the integer type (as onnxruntime does)
        r = np.floor(r)
    r += m if keepdims else m.reshape(r.shape)
    return r


_REDUCERS = {
    "ReduceSum": _r_sum, "ReduceMean": _r_mean, "ReduceMax": _r_max, "ReduceMin": _r_min,
    "ReduceProd": _r_prod, "ReduceL1": _r_l1, "ReduceL2": _r_l2, "ReduceLogSum": _r_logsum,
    "ReduceLogSumExp": _r_logsumexp, "ReduceSumSquare": _r_sumsquare,
}


_IDENTITY_ON_NO_AXES = {_r_sum, _r_mean, _r_max, _r_min, _r_prod}


def _reduce(f, x, axes, keepdims):
    with ignore_fp(**_IGNORE):
        r = f(x, _axes(x, axes), bool(keepdims))
        r = np.asarray(r)
        return r if r.dtype == x.dtype else r.astype(x.dtype)


def _register(op, attr_versions, input_versions):
    f = _REDUCERS[op]

    def k_attr(ctx, x, *, axes=None, keepdims):
        # an empty axes attribute is the same as none: reduce over every axis
        return _reduce(f, x, axes if axes else None, keepdims)

    def k_input(ctx, x, axes=None, *, keepdims, noop_with_empty_axes):
        if axes is None or axes.size == 0:
            if noop_with_empty_axes:
                # reduce over the empty set of axes (numpy axis=()): the reduction is the
                # identity, the non-reduction steps still apply (ReduceLogSum -> Log, ...)
                if f in _IDENTITY_ON_NO_AXES:
                    return x
                return _reduce(f, x, (), keepdims)
            axes = None
        return _reduce(f, x, axes, keepdims)

    k_attr.__name__ = f"{op.lower()}_axes_attribute"
    k_input.__name__ = f"{op.lower()}_axes_input"
    reg(op, *attr_versions)(k_attr)
    reg(op, *input_versions)(k_input)


_register("ReduceSum", (1, 11), (13,))
for _op in ("ReduceMean", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare"):
    _register(_op, (1, 11, 13), (18,))
_register("ReduceMax", (1, 11, 12, 13), (18, 20))
_register("ReduceMin", (1, 11, 12, 13), (18, 20))
_register("ReduceLogSum", (1, 11, 13), (18, 28))
_register("ReduceLogSumExp", (1, 11, 13), (18, 28))


# -- ArgMax / ArgMin -------------------------------------------------------------------

def _arg(x, axis, keepdims, last, f):
    if x.dtype in _ML_FLOATS:
        x = x.astype(_F32)
    ax = normalize_axis(axis, x.ndim)
    if x.ndim == 0:
        raise ValueError("ArgMax/ArgMin need an input of rank >= 1")
    n = x.shape[ax]
    if n == 0:
        raise ValueError(f"cannot take ArgMax/ArgMin over the empty axis {axis} of shape {x.shape}")
    if last:
        idx = (n - 1) - f(np.flip(x, ax), axis=ax)
    else:
        idx = f(x, axis=ax)
    idx = np.asarray(idx, dtype=np.int64)
    if keepdims:
        idx = np.expand_dims(idx, ax)
    return idx


@reg("ArgMax", 1, 11)
def argmax_1(ctx, x, *, axis, keepdims):
    return _arg(x, axis, keepdims, False, np.argmax)


@reg("ArgMax", 12, 13)
def argmax_12(ctx, x, *, axis, keepdims, select_last_index):
    return _arg(x, axis, keepdims, bool(select_last_index), np.argmax)


@reg("ArgMin", 1, 11)
def argmin_1(ctx, x, *, axis, keepdims):
    return _arg(x, axis, keepdims, False, np.argmin)


@reg("ArgMin", 12, 13)
def argmin_12(ctx, x, *, axis, keepdims, select_last_index):
    return _arg(x, axis, keepdims, bool(select_last_index), np.argmin)


def _cumulative(op, fn, identity, x, axis, exclusive, reverse):
    """CumSum / CumProd: ``fn`` (np.cumsum / np.cumprod) along ``axis``; exclusive runs on the
    input shifted by one with ``identity`` first; low-precision floats accumulate in float32."""
    a = np.asarray(axis).reshape(-1)
    if a.size != 1:
        raise ValueError(f"{op} axis must be a scalar, got shape {np.shape(axis)}")
    if x.ndim == 0:
        raise ValueError(f"{op} needs an input of rank >= 1")
    ax = normalize_axis(int(a[0]), x.ndim)
    ml = x.dtype in _ML_FLOATS
    y = x.astype(_F32) if ml else x
    if reverse:
        y = np.flip(y, ax)
    if exclusive:
        n = y.shape[ax]
        src = [slice(None)] * y.ndim
        src[ax] = slice(0, max(n - 1, 0))
        pad = list(y.shape)
        pad[ax] = min(n, 1)
        y = np.concatenate([np.full(pad, identity, y.dtype), y[tuple(src)]], axis=ax)
    c = fn(y, axis=ax, dtype=y.dtype)
    if reverse:
        c = np.ascontiguousarray(np.flip(c, ax))
    return c.astype(x.dtype) if ml else c


# -- CumSum, CumProd -------------------------------------------------------------------

@reg("CumSum", 11, 14)
def cumsum(ctx, x, axis, *, exclusive, reverse):
    return _cumulative("CumSum", np.cumsum, 0, x, axis, exclusive, reverse)


@reg("CumProd", 26)
def cumprod(ctx, x, axis, *, exclusive, reverse):
    return _cumulative("CumProd", np.cumprod, 1, x, axis, exclusive, reverse)
