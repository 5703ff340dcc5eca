"""The ONNX backend suite's comparison rules (``onnx.backend.test.runner``), as one function.

Outputs are compared position by position: the count must match; a sequence is
compared element-wise (its length must match); an empty optional (``None``) matches
only ``None``; a tensor must have exactly the expected shape and dtype; strings and
other object arrays must be equal; numbers must satisfy
``|actual - expected| <= atol + rtol * |expected|`` with NaNs in the same places
(bfloat16 gets at least two ULPs of relative tolerance, as the official runner does).
"""

from __future__ import annotations

import numpy as np

__all__ = ["compare_outputs"]


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
