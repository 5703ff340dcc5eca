"""CPU kernels: linear algebra (Det)."""

from __future__ import annotations

import numpy as np

from ..registry import kernel


@kernel("Det", 11, 22)  # 22 adds bfloat16
def det(ctx, x):
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"Det needs an input of shape [*, M, M], got {x.shape}")
    dt = x.dtype
    xf = x if dt in (np.float32, np.float64) else x.astype(np.float32)  # float16 / bfloat16
    if x.shape[-1] == 0:
        r = np.ones(x.shape[:-2], xf.dtype)  # the determinant of a 0x0 matrix is 1
    else:
        r = np.linalg.det(xf)
    return np.asarray(r).astype(dt, copy=False)

