"""The one place the conformance comparison skips values: float -> sub-byte integer casts out of
range, which the Cast spec leaves undefined (compare.undefined_positions). Everything in range
is still compared, and no other case is touched."""

from __future__ import annotations

import math

import numpy as np
import pytest

from runtime_core.conformance.compare import undefined_positions


@pytest.mark.parametrize("name,lo,hi", [
    ("node/test_cast_FLOAT_to_INT4", -8, 7),
    ("node/test_castlike_FLOAT16_to_UINT4_expanded", 0, 15),
    ("node/test_cast_FLOAT_to_INT2", -2, 1),
    ("node/test_castlike_FLOAT_to_UINT2", 0, 3),
])
def test_marks_exactly_the_out_of_range_inputs(name, lo, hi):
    x = np.array([-9.0, -8.5, -8.0, -2.5, -0.5, 0.0, 1.5, 3.4, 7.0, 7.5, 15.0, 15.5, 16.0, math.nan, math.inf],
                 dtype=np.float32)
    mask = undefined_positions(name, [x])
    assert mask is not None and mask.shape == x.shape
    r = [round(float(v)) if math.isfinite(v) else None for v in x]  # ties to even, as the cast
    assert mask.tolist() == [v is None or not lo <= v <= hi for v in r]


@pytest.mark.parametrize("name", ["node/test_cast_INT4_to_FLOAT", "node/test_cast_FLOAT_to_INT8",
                                  "node/test_cast_FLOAT_to_FLOAT8E4M3FN", "node/test_relu",
                                  "simple/test_cast_FLOAT_to_INT4"])
def test_leaves_every_other_case_alone(name):
    assert undefined_positions(name, [np.array([100.0], np.float32)]) is None
