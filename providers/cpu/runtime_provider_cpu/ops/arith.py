"""CPU kernels: elementwise binary arithmetic (Add, Sub, Mul, Div, Pow, Mod, BitShift), logic,
bitwise ops, comparisons, Where and the variadic ops (Max, Min, Sum, Mean).

Old (opset < 7) binary ops with the ``broadcast``/``axis`` attributes are implemented with
their limited broadcasting rule; ``consumed_inputs`` (an opset-1 memory hint) is ignored.
Each kernel's ``check`` declines nodes whose input dtypes the node's schema version does not
allow (:mod:`._dtypes`), and a few attribute values that are not defined (``_mod_check``).
"""

from __future__ import annotations

import functools

import numpy as np

from ..executable import inplace_variant
from ._dtypes import _F16, _F32, _F64, _IGNORE, _ML_FLOATS, _in_dtype, _is_float, _lowp, reg
from ._common import broadcast_shape, ignore_fp


# -- binary arithmetic ---------------------------------------------------------

def _legacy_b(a: np.ndarray, b: np.ndarray, broadcast, axis) -> np.ndarray:
    """Opset < 7 broadcasting: B (right-hand side) broadcast to A's shape."""
    if not broadcast:
        if a.shape != b.shape:
            raise ValueError(f"broadcast=0 needs equal shapes, got {a.shape} and {b.shape} "
                             "(set broadcast=1 to broadcast B)")
        return b
    if b.size == 1:
        return b.reshape(())
    if b.ndim > a.ndim:
        raise ValueError(f"B of shape {b.shape} cannot be broadcast to A of shape {a.shape}")
    if axis is None:
        start = a.ndim - b.ndim
    else:
        start = axis + a.ndim if axis < 0 else axis
    seg = a.shape[start:start + b.ndim] if start >= 0 else ()
    # B's dims match A's from ``start`` on; a size-1 dim of B expands ("1-dim expansion", left
    # undefined by the opset < 7 docs, is what the ONNX test data of these versions expect)
    if start < 0 or len(seg) != b.ndim or any(bd != ad and bd != 1 for bd, ad in zip(b.shape, seg)):
        raise ValueError(f"B of shape {b.shape} does not match A of shape {a.shape} at axis {start}")
    return b.reshape(b.shape + (1,) * (a.ndim - start - b.ndim))


def _div(a, b):
    if a.dtype.kind in "iu":
        with ignore_fp(**_IGNORE):
            q = np.floor_divide(a, b)
            if a.dtype.kind == "i":
                # C semantics: truncate toward zero
                fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
                q = q + fix.astype(q.dtype)
        return q
    return np.divide(a, b)


def _arith(f):
    """Binary arithmetic in T; ml_dtypes floats via float32."""
    def run(a, b):
        if a.dtype in _ML_FLOATS:
            return f(a.astype(_F32), b.astype(_F32)).astype(a.dtype)
        return f(a, b)
    return run


def _pow(a, b):
    """Pow: the result has the base's dtype."""
    da, db = a.dtype, b.dtype
    if da in _ML_FLOATS or da == _F16:
        a32 = a.astype(_F32)
        b32 = b.astype(_F64 if db.kind in "iu" or db == _F64 else _F32)
        return np.power(a32, b32).astype(da)
    if da == db and da.kind == "f":
        return np.power(a, b)
    if da.kind in "iu" and db.kind in "iu":
        if np.all(b >= 0):
            return np.power(a, b.astype(da, copy=False) if db != da else b)
        # negative exponents: as std::pow(double, double), truncated back to the base type
        return np.power(a.astype(_F64), b.astype(_F64)).astype(da)
    if db in _ML_FLOATS:
        b = b.astype(_F32)
    ct = np.result_type(a.dtype if a.dtype.kind == "f" else _F64, b.dtype if b.dtype.kind == "f" else _F64)
    return np.power(a.astype(ct, copy=False), b.astype(ct, copy=False)).astype(da, copy=False)


def _binary(op, versions_legacy, versions, f, *, extra=None, inplace=None):
    def k(ctx, a, b):
        return f(a, b)
    k.__name__ = op.lower()
    reg(op, *versions, extra=extra)(k)
    if inplace is not None:
        ufunc, kinds = inplace

        @inplace_variant(k, 0, 1)
        def k_inplace(ctx, owned, a, b):
            t = b if owned else a
            if (a.dtype == b.dtype and t.dtype.kind in kinds
                    and t.shape == broadcast_shape(a.shape, b.shape)):
                return ufunc(a, b, out=t)
            return f(a, b)
    if versions_legacy:
        # opset 1 adds consumed_inputs (a memory hint without effect on values) for some ops
        def k_legacy(ctx, a, b, *, axis=None, broadcast=0, consumed_inputs=None):
            return f(a, _legacy_b(a, b, broadcast, axis))
        k_legacy.__name__ = f"{op.lower()}_legacy"
        reg(op, *versions_legacy)(k_legacy)


_binary("Add", (1, 6), (7, 13, 14), _arith(np.add), inplace=(np.add, "fiu"))
_binary("Sub", (1, 6), (7, 13, 14), _arith(np.subtract), inplace=(np.subtract, "fiu"))
_binary("Mul", (1, 6), (7, 13, 14), _arith(np.multiply), inplace=(np.multiply, "fiu"))
_binary("Div", (1, 6), (7, 13, 14), _arith(_div), inplace=(np.divide, "f"))
_binary("Pow", (1,), (7, 12, 13, 15), _pow)


def _mod_check(node):
    dt = _in_dtype(node, 0)
    if node.attrs.get("fmod") not in (0, 1):
        return f"Mod fmod={node.attrs.get('fmod')!r} is not defined (0 or 1)"
    if node.since_version < 28 and node.attrs.get("fmod") == 0 and dt is not None and _is_float(dt):
        return (f"Mod-{node.since_version} with fmod=0 is defined for integer types only "
                f"(got {dt.name}); floating-point inputs need fmod=1 before opset 28")
    return None


@reg("Mod", 10, 13, 28, extra=_mod_check)
def mod(ctx, a, b, *, fmod):
    f = np.fmod if fmod else np.mod  # fmod: C fmod (trunc); else floor (sign of the divisor)
    with ignore_fp(**_IGNORE):
        if a.dtype in _ML_FLOATS:
            return f(a.astype(_F32), b.astype(_F32)).astype(a.dtype)
        return f(a, b)


def _bitshift_check(node):
    if node.attrs.get("direction") not in ("LEFT", "RIGHT"):
        return f"BitShift direction={node.attrs.get('direction')!r} is not defined (LEFT or RIGHT)"
    return None


@reg("BitShift", 11, 28, extra=_bitshift_check)
def bitshift(ctx, x, y, *, direction):
    bits = x.dtype.itemsize * 8
    t = x.dtype.type
    # shift amounts outside [0, bits) give the sign fill (-1 for RIGHT of a negative X, else 0)
    out_of_range = (y < 0) | (y >= bits) if y.dtype.kind == "i" else (y >= bits)
    ys = y if not out_of_range.any() else np.where(out_of_range, 0, y)
    ys = ys.astype(x.dtype, copy=False)
    if direction == "LEFT":
        r = np.left_shift(x, ys)
        if out_of_range.any():
            r = np.where(out_of_range, t(0), r)
    else:
        r = np.right_shift(x, ys)
        if out_of_range.any():
            fill = np.where(x < 0, t(-1), t(0)) if x.dtype.kind == "i" else t(0)
            r = np.where(out_of_range, fill, r)
    return r.astype(x.dtype, copy=False)


# -- logic, bitwise, comparisons --------------------------------------------------

_binary("And", (1,), (7,), np.logical_and)
_binary("Or", (1,), (7,), np.logical_or)
_binary("Xor", (1,), (7,), np.logical_xor)
_binary("BitwiseAnd", (), (18,), np.bitwise_and)
_binary("BitwiseOr", (), (18,), np.bitwise_or)
_binary("BitwiseXor", (), (18,), np.bitwise_xor)


def _compare(f):
    def run(a, b):
        if a.dtype in _ML_FLOATS:
            return f(a.astype(_F32), b.astype(_F32))
        r = f(a, b)
        return r if r.dtype == np.bool_ else r.astype(bool)
    return run


_binary("Equal", (1,), (7, 11, 13, 19), _compare(np.equal))
_binary("Less", (1,), (7, 9, 13), _compare(np.less))
_binary("Greater", (1,), (7, 9, 13), _compare(np.greater))
_binary("LessOrEqual", (), (12, 16), _compare(np.less_equal))
_binary("GreaterOrEqual", (), (12, 16), _compare(np.greater_equal))


@reg("Where", 9, 16)
def where(ctx, cond, x, y):
    return np.where(cond, x, y)


# -- variadic ----------------------------------------------------------------------

def _same_shapes(xs):
    s = xs[0].shape
    for x in xs[1:]:
        if x.shape != s:
            raise ValueError(f"all inputs must have the same shape before opset 8, got {s} and {x.shape}")


def _fold(f, xs):
    if len(xs) == 1:
        return xs[0]
    ml = xs[0].dtype in _ML_FLOATS
    vals = [x.astype(_F32) for x in xs] if ml else xs
    r = np.asarray(f(vals[0], vals[1]))  # a fresh array (0-d inputs give a numpy scalar)
    for x in vals[2:]:
        if r.shape == np.broadcast_shapes(r.shape, x.shape):
            f(r, x, out=r)
        else:
            r = f(r, x)
    return r.astype(xs[0].dtype) if ml else r


def _mean(xs):
    dt = xs[0].dtype
    if len(xs) == 1:
        return xs[0]
    vals = [x.astype(_F32) for x in xs] if _lowp(dt) else xs
    r = np.asarray(np.add(vals[0], vals[1]))
    for x in vals[2:]:
        if r.shape == np.broadcast_shapes(r.shape, x.shape):
            np.add(r, x, out=r)
        else:
            r = np.add(r, x)
    r = np.divide(r, r.dtype.type(len(xs)), out=r)
    return r.astype(dt, copy=False)


def _variadic(op, f):
    """Register the opset 1/6 kernel (equal shapes); return the broadcasting one (8+)."""
    def k_same_shape(ctx, *xs, consumed_inputs=None):
        _same_shapes(xs)
        with ignore_fp(**_IGNORE):
            return f(xs)

    def k(ctx, *xs):
        with ignore_fp(**_IGNORE):
            return f(xs)

    k_same_shape.__name__ = f"{op.lower()}_1"
    k.__name__ = op.lower()
    reg(op, 1, 6)(k_same_shape)
    return k


reg("Max", 8, 12, 13)(_variadic("Max", functools.partial(_fold, np.maximum)))
reg("Min", 8, 12, 13)(_variadic("Min", functools.partial(_fold, np.minimum)))
reg("Sum", 8, 13)(_variadic("Sum", functools.partial(_fold, np.add)))
reg("Mean", 8, 13)(_variadic("Mean", _mean))
