"""The ONNX backend suite's comparison rules (``onnx.backend.test.runner``), as one function.

Outputs are compared position by position: the count must match; a sequence is
compared element-wise (its length must match); an empty optional (``None``) matches
only ``None``; a tensor must have exactly the expected shape and dtype; strings and
other object arrays must be equal; numbers must satisfy
``|actual - expected| <= atol + rtol * |expected|`` with NaNs in the same places
(bfloat16 gets at least two ULPs of relative tolerance, as the official runner does).

One departure, :func:`undefined_positions`: the Cast spec leaves a float cast to a fixed-point
type undefined when the value is out of range, and the generated expected data of the
suite's float -> INT4/UINT4/INT2/UINT2 cases hold, there, whatever the generating library
gave: the low bits with ml_dtypes up to 0.6 (as onnx's int4/int2 notes and its published
files), 0 from ml_dtypes 0.7, the clipped value with onnx 1.18 and older. Those positions
are not compared; every in-range value is.
"""

from __future__ import annotations

import re

import numpy as np

__all__ = ["compare_outputs", "undefined_positions"]

#: float -> sub-byte integer Cast/CastLike cases; groups: U (unsigned) and the bit width
_SUBBYTE_CAST = re.compile(r"^node/test_cast(?:like)?_(?:FLOAT|FLOAT16|DOUBLE|BFLOAT16)_to_(U?)INT([24])(?:_expanded)?$")


def undefined_positions(case_id: str, inputs) -> np.ndarray | None:
    """Where the spec defines no output of the case ``case_id`` (a bool mask), or ``None``."""
    m = _SUBBYTE_CAST.match(case_id)
    if m is None or not inputs:
        return None
    bits = int(m.group(2))
    lo, hi = (0, (1 << bits) - 1) if m.group(1) else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    with np.errstate(invalid="ignore"):
        r = np.rint(np.asarray(inputs[0]).astype(np.float64))
        return ~(np.isfinite(r) & (r >= lo) & (r <= hi))


def compare_outputs(expected, actual, rtol: float = 1e-3, atol: float = 1e-7, where: str = "output") -> None:
    """Raise ``AssertionError`` naming the first difference between ``expected`` and ``actual``."""
    expected = list(expected)
    actual = list(actual)
    if len(expected) != len(actual):
        raise AssertionError(f"{len(actual)} {where}s, expected {len(expected)}")
    for i, (e, a) in enumerate(zip(expected, actual)):
        _compare_one(e, a, rtol, atol, f"{where} {i}")


def _compare_one(e, a, rtol, atol, where):
    if e is None:
        if a is not None:
            raise AssertionError(f"{where}: expected an empty optional, got {type(a).__name__}")
        return
    if a is None:
        raise AssertionError(f"{where}: got an empty optional, expected {type(e).__name__}")
    if isinstance(e, dict):
        if not isinstance(a, dict) or set(e) != set(a):
            raise AssertionError(f"{where}: expected a map with keys {sorted(e)}")
        for k in e:
            _compare_one(e[k], a[k], rtol, atol, f"{where}[{k!r}]")
        return
    if isinstance(e, (list, tuple)):
        if not isinstance(a, (list, tuple)):
            raise AssertionError(f"{where}: expected a sequence, got {type(a).__name__}")
        if len(e) != len(a):
            raise AssertionError(f"{where}: sequence of {len(a)} elements, expected {len(e)}")
        for j, (ee, aa) in enumerate(zip(e, a)):
            _compare_one(ee, aa, rtol, atol, f"{where}[{j}]")
        return
    if isinstance(a, (list, tuple)):
        raise AssertionError(f"{where}: got a sequence, expected a tensor")
    e = np.asarray(e)
    if not isinstance(a, np.ndarray) and not np.isscalar(a):
        raise AssertionError(f"{where}: got {type(a).__name__}, expected a numpy array")
    a = np.asarray(a)
    if tuple(a.shape) != tuple(e.shape):
        raise AssertionError(f"{where}: shape {tuple(a.shape)}, expected {tuple(e.shape)}")
    if e.dtype == object or e.dtype.kind in "US":
        if a.dtype != object and a.dtype.kind not in "US":
            raise AssertionError(f"{where}: dtype {a.dtype}, expected strings")
        if not np.array_equal(a.astype(object), e.astype(object)):
            bad = np.flatnonzero(a.astype(object).reshape(-1) != e.astype(object).reshape(-1))
            k = int(bad[0]) if bad.size else 0
            raise AssertionError(f"{where}: strings differ at flat index {k}: "
                                 f"{a.reshape(-1)[k]!r} != {e.reshape(-1)[k]!r}")
        return
    if a.dtype != e.dtype:
        raise AssertionError(f"{where}: dtype {a.dtype}, expected {e.dtype}")
    r = rtol
    if e.dtype.name == "bfloat16":
        r = max(rtol, 2 ** -6)
    if e.dtype.kind not in "fcbiu":  # float8/float4/int4 and friends from ml_dtypes
        ef, af = e.astype(np.float32), a.astype(np.float32)
    else:
        ef, af = e, a
    if e.dtype.kind == "b":
        if not np.array_equal(af, ef):
            k = int(np.flatnonzero(af.reshape(-1) != ef.reshape(-1))[0])
            raise AssertionError(f"{where}: values differ at flat index {k}: "
                                 f"{af.reshape(-1)[k]!r} != {ef.reshape(-1)[k]!r} (and maybe more)")
        return
    try:
        np.testing.assert_allclose(af, ef, rtol=r, atol=atol)
    except AssertionError as exc:
        msg = str(exc).strip().splitlines()
        raise AssertionError(f"{where}: " + " ".join(line.strip() for line in msg[:6])) from None
