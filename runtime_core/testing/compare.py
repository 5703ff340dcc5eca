"""Comparing a provider's outputs with the CPU provider's, with tolerances per dtype.

Floating-point results may differ by rounding (another summation order, fused
multiply-add, a different ``exp``), so each float dtype has its own relative and
absolute tolerance; every other dtype (integers, bool, strings) must match
exactly. NaN must be NaN in the same places, infinities must match with their
sign, and shapes and dtypes must match exactly.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

__all__ = ["DEFAULT_TOLERANCES", "Mismatch", "assert_same", "parse_tolerance", "tolerance_for",
           "tolerances_for_ops"]

#: dtype name -> (rtol, atol) for comparing a provider with the CPU provider
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-6, 1e-9),
    "float32": (1e-4, 1e-5),
    "float16": (1e-2, 1e-3),
    "bfloat16": (2e-2, 1e-2),
    "complex128": (1e-6, 1e-9),
    "complex64": (1e-4, 1e-5),
    # 8-bit and 4-bit floats: one step of their mantissa
    "float8e4m3fn": (0.13, 1e-3),
    "float8e4m3fnuz": (0.13, 1e-3),
    "float8e5m2": (0.26, 1e-3),
    "float8e5m2fnuz": (0.26, 1e-3),
    "float4e2m1": (0.51, 1e-3),
}


class Mismatch(AssertionError):
    """Two results differ beyond the tolerance; the message says where and by how much."""


def _is_float_like(dtype: np.dtype) -> bool:
    return dtype.kind in "fc" or dtype.name in DEFAULT_TOLERANCES


def tolerance_for(dtype, tolerances: Mapping[str, tuple[float, float]] | None = None
                  ) -> tuple[float, float] | None:
    """``(rtol, atol)`` for ``dtype``, or ``None`` when it must match exactly."""
    dtype = np.dtype(dtype)
    table = {**DEFAULT_TOLERANCES, **(tolerances or {})}
    if dtype.name in table:
        return table[dtype.name]
    if dtype.kind in "fc":  # an unlisted float type: as loose as float16
        return table["float16"]
    return None


def tolerances_for_ops(tolerances: Mapping[str, tuple[float, float]] | None,
                       op_tolerances: Mapping[str, tuple[float, float]] | None,
                       ops) -> dict[str, tuple[float, float]]:
    """The per-dtype table for a model whose nodes are ``ops`` (``(domain, op_type)`` pairs).

    ``op_tolerances`` maps an op (``"DFT"``, or ``"com.microsoft::Attention"`` for another
    domain) to ``(rtol, atol)``: a model with that op compares every float output with at
    least that tolerance (the looser of it and the dtype's, per bound), since an op's
    rounding error flows into whatever follows it."""
    table = {**DEFAULT_TOLERANCES, **(tolerances or {})}
    extra = []
    for domain, op in ops:
        for key in (op if domain in ("", "ai.onnx") else f"{domain}::{op}", f"{domain or 'ai.onnx'}::{op}"):
            if op_tolerances and key in op_tolerances:
                extra.append(tuple(float(x) for x in op_tolerances[key]))
                break
    if not extra:
        return table
    rtol, atol = max(r for r, _ in extra), max(a for _, a in extra)
    return {k: (max(r, rtol), max(a, atol)) for k, (r, a) in table.items()}


def parse_tolerance(spec: str) -> tuple[str, tuple[float, float]]:
    """``"OP=RTOL,ATOL"`` -> ``(OP, (rtol, atol))``; raises ``ValueError`` saying what is wrong."""
    key, sep, rest = str(spec).partition("=")
    parts = rest.split(",")
    try:
        if not sep or not key.strip() or len(parts) != 2:
            raise ValueError
        rtol, atol = float(parts[0]), float(parts[1])
    except ValueError:
        raise ValueError(f"a tolerance is OP=RTOL,ATOL (for example DFT=1e-3,1e-3), got {spec!r}") from None
    if not (rtol >= 0 and atol >= 0):
        raise ValueError(f"tolerances must be >= 0, got {spec!r}")
    return key.strip(), (rtol, atol)


def _as_float(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "c":
        return a.astype(np.complex128)
    return a.astype(np.float64)


def _compare_array(where: str, expected: np.ndarray, actual, tolerances) -> None:
    if not isinstance(actual, np.ndarray):
        raise Mismatch(f"{where}: expected a numpy array of {expected.dtype} {list(expected.shape)}, "
                       f"got {type(actual).__name__}")
    if actual.dtype != expected.dtype:
        raise Mismatch(f"{where}: dtype {actual.dtype}, expected {expected.dtype}")
    if actual.shape != expected.shape:
        raise Mismatch(f"{where}: shape {list(actual.shape)}, expected {list(expected.shape)}")
    tol = tolerance_for(expected.dtype, tolerances)
    if tol is None or not _is_float_like(expected.dtype):
        if expected.dtype.kind in "OUS":
            same = np.array([a == b for a, b in zip(expected.ravel().tolist(), actual.ravel().tolist())],
                            dtype=bool)
        else:
            same = expected == actual
        if not np.all(same):
            bad = np.argwhere(~np.asarray(same).reshape(expected.shape))
            first = tuple(int(i) for i in bad[0]) if bad.size else ()
            raise Mismatch(f"{where}: {int(bad.shape[0])} of {expected.size} elements differ "
                           f"(exact match required for {expected.dtype}); first at {list(first)}: "
                           f"got {actual[first]!r}, expected {expected[first]!r}")
        return
    rtol, atol = tol
    e, a = _as_float(expected), _as_float(actual)
    e_nan, a_nan = np.isnan(e), np.isnan(a)
    if not np.array_equal(e_nan, a_nan):
        n = int(np.count_nonzero(e_nan != a_nan))
        raise Mismatch(f"{where}: NaN in different places ({n} elements)")
    finite = ~e_nan
    e_inf = np.isinf(e) & finite
    if not np.array_equal(e[e_inf], a[e_inf]) or np.any(np.isinf(a) & finite & ~e_inf):
        raise Mismatch(f"{where}: infinities differ")
    ok = finite & ~e_inf
    diff = np.abs(e[ok] - a[ok])
    bound = atol + rtol * np.abs(e[ok])
    over = diff > bound
    if np.any(over):
        worst = int(np.argmax(diff - bound))
        raise Mismatch(f"{where}: {int(np.count_nonzero(over))} of {expected.size} elements differ beyond "
                       f"rtol={rtol:g}, atol={atol:g} for {expected.dtype}; max abs diff "
                       f"{float(np.max(diff)):.6g} (got {a[ok][worst]!r}, expected {e[ok][worst]!r})")


def assert_same(expected, actual, tolerances: Mapping[str, tuple[float, float]] | None = None,
                where: str = "output") -> None:
    """Raise :class:`Mismatch` unless ``actual`` equals ``expected`` within the dtype's tolerance.

    Both may be numpy arrays, lists (sequences, compared element by element),
    dicts (maps) or ``None`` (empty optionals); ``tolerances`` overrides
    :data:`DEFAULT_TOLERANCES` per dtype name.
    """
    if expected is None or actual is None:
        if expected is not actual:
            raise Mismatch(f"{where}: expected {'nothing' if expected is None else 'a value'}, "
                           f"got {'nothing' if actual is None else type(actual).__name__}")
        return
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(expected) != set(actual):
            raise Mismatch(f"{where}: expected a map with keys {sorted(expected)!r}, got {actual!r}")
        for k in expected:  # map values may be numpy or Python scalars
            e, a = expected[k], actual[k]
            if np.isscalar(e) and np.isscalar(a):
                e, a = np.asarray(e), np.asarray(a)
            assert_same(e, a, tolerances, f"{where}[{k!r}]")
        return
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            got = f"{type(actual).__name__} of {len(actual)}" if isinstance(actual, (list, tuple)) \
                else type(actual).__name__
            raise Mismatch(f"{where}: expected a sequence of {len(expected)}, got {got}")
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_same(e, a, tolerances, f"{where}[{i}]")
        return
    _compare_array(where, np.asarray(expected), actual, tolerances)
