"""Casts to the sub-byte integer types (INT4, UINT4, INT2, UINT2), computed here, not by ml_dtypes.

ml_dtypes' own ``astype`` from a float to these types changed between releases: up to 0.6
it truncates toward zero and keeps the low bits, from 0.7 on an out-of-range value becomes
0. Our results must not depend on which release sits beside us (tritonclient 2.73 pins
``ml-dtypes<=0.5.4``), so the conversion is done in int64 and only exact, in-range int8
values are handed to ml_dtypes.

The rule is the one of ONNX's notes on these types (docs/technical/int4.md, int2.md):
round to the nearest integer, ties to even, then truncate to the type's bits (two's
complement for the signed ones); integer sources keep their low bits, as the Cast spec
says for fixed point to fixed point. Onnx's published backend-test data for these casts
are exactly that. What the Cast spec leaves open (NaN, +/-Inf, magnitudes of 2**63 and
more, where the low bits are not defined) gives 0, as every ml_dtypes release does.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = ["SUBBYTE_INTS", "to_subbyte_int"]

#: sub-byte integer dtype -> (bits, signed)
SUBBYTE_INTS = {
    np.dtype(ml_dtypes.int4): (4, True),
    np.dtype(ml_dtypes.uint4): (4, False),
    np.dtype(ml_dtypes.int2): (2, True),
    np.dtype(ml_dtypes.uint2): (2, False),
}

_INT64_SPAN = 2.0 ** 63


def to_subbyte_int(x: np.ndarray, dst: np.dtype) -> np.ndarray:
    """``x`` (bool, integer or numpy float) cast to the sub-byte integer type ``dst``."""
    dst = np.dtype(dst)
    bits, signed = SUBBYTE_INTS[dst]
    x = np.asarray(x)
    kind = x.dtype.kind
    if kind == "b":
        v = x.astype(np.int64)
    elif kind in "iu":
        v = x.astype(np.int64)  # uint64 wraps to int64: the low bits are unchanged
    elif kind == "f":
        with np.errstate(invalid="ignore"):
            r = np.rint(x.astype(np.float64))  # float16/32/64 are exact in float64; rint is ties-to-even
            defined = np.isfinite(r) & (np.abs(r) < _INT64_SPAN)
            v = np.where(defined, r, 0.0).astype(np.int64)
    else:
        raise TypeError(f"cannot cast {x.dtype} to {dst.name} (expected bool, an integer or a numpy float)")
    low = v & np.int64((1 << bits) - 1)
    if signed:
        low = np.where(low >= (1 << (bits - 1)), low - (1 << bits), low)
    # every value is now in the target's range: ml_dtypes converts those exactly in every release
    return low.astype(np.int8).astype(dst)
