"""``runtime_core.testing.compare``: per-dtype tolerances, exact types, NaN/inf placement, containers."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from runtime_core.testing import DEFAULT_TOLERANCES, Mismatch, assert_same
from runtime_core.testing.compare import tolerance_for


def test_float32_within_and_beyond_its_tolerance():
    rtol, atol = DEFAULT_TOLERANCES["float32"]
    a = np.array([1.0, 100.0, 0.0], np.float32)
    assert_same(a, (a * (1 + rtol / 2)).astype(np.float32))
    assert_same(a, a + np.float32(atol / 2))
    with pytest.raises(Mismatch, match=r"1 of 3 elements differ beyond rtol=0.0001, atol=1e-05 for float32"):
        assert_same(a, np.array([1.0, 100.0 * (1 + 3 * rtol), 0.0], np.float32))


def test_each_float_dtype_has_its_own_tolerance():
    x = np.array([1.0, 2.0, 3.0])
    bumped = x * (1 + 5e-3)
    assert_same(x.astype(np.float16), bumped.astype(np.float16))       # within float16's 1e-2
    with pytest.raises(Mismatch):
        assert_same(x.astype(np.float32), bumped.astype(np.float32))   # beyond float32's 1e-4
    with pytest.raises(Mismatch):
        assert_same(x, x * (1 + 1e-5))                                  # beyond float64's 1e-6
    bf = ml_dtypes.bfloat16
    assert_same(x.astype(bf), bumped.astype(bf))
    assert tolerance_for(np.int32) is None and tolerance_for(np.bool_) is None
    assert tolerance_for(np.float32, {"float32": (0.5, 0.5)}) == (0.5, 0.5)


def test_integers_bools_and_strings_are_exact():
    assert_same(np.array([1, 2], np.int64), np.array([1, 2], np.int64))
    with pytest.raises(Mismatch, match=r"exact match required for int64\); first at \[1\]"):
        assert_same(np.array([1, 2], np.int64), np.array([1, 3], np.int64))
    with pytest.raises(Mismatch, match="exact match required for bool"):
        assert_same(np.array([True]), np.array([False]))
    assert_same(np.array(["a", "b"], object), np.array(["a", "b"], object))
    with pytest.raises(Mismatch, match="1 of 2 elements differ"):
        assert_same(np.array(["a", "b"], object), np.array(["a", "c"], object))


def test_dtype_and_shape_must_match_exactly():
    with pytest.raises(Mismatch, match="dtype float64, expected float32"):
        assert_same(np.zeros(2, np.float32), np.zeros(2, np.float64))
    with pytest.raises(Mismatch, match=r"shape \[2, 1\], expected \[2\]"):
        assert_same(np.zeros(2, np.float32), np.zeros((2, 1), np.float32))
    with pytest.raises(Mismatch, match="expected a numpy array"):
        assert_same(np.zeros(2, np.float32), [0.0, 0.0])


def test_nan_and_infinities_must_be_in_the_same_places():
    a = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)
    assert_same(a, a.copy())
    with pytest.raises(Mismatch, match="NaN in different places"):
        assert_same(a, np.array([0.0, np.inf, -np.inf, 1.0], np.float32))
    with pytest.raises(Mismatch, match="infinities differ"):
        assert_same(a, np.array([np.nan, -np.inf, -np.inf, 1.0], np.float32))
    with pytest.raises(Mismatch, match="infinities differ"):
        assert_same(a, np.array([np.nan, np.inf, -np.inf, np.inf], np.float32))


def test_sequences_maps_and_optionals():
    seq = [np.zeros(2, np.float32), np.ones(3, np.int64)]
    assert_same(seq, [s.copy() for s in seq])
    with pytest.raises(Mismatch, match=r"output\[1\]: .*exact match"):
        assert_same(seq, [seq[0], np.zeros(3, np.int64)])
    with pytest.raises(Mismatch, match="expected a sequence of 2, got list of 1"):
        assert_same(seq, seq[:1])
    assert_same(None, None)
    with pytest.raises(Mismatch, match="expected nothing"):
        assert_same(None, np.zeros(1))
    assert_same({1: np.float32(2.0)}, {1: np.float32(2.0)})
    with pytest.raises(Mismatch, match="keys"):
        assert_same({1: np.float32(2.0)}, {2: np.float32(2.0)})
