"""CPU kernels: CenterCropPad (crop or zero-pad each named axis around its center)."""

from __future__ import annotations

import numpy as np

from ..limits import check_alloc
from ..registry import kernel
from ._common import normalize_axis


@kernel("CenterCropPad", 18)
def center_crop_pad(ctx, x, shape, *, axes):
    rank = x.ndim
    ax = [normalize_axis(a, rank) for a in axes] if axes else list(range(rank))
    sh = [int(v) for v in np.asarray(shape).reshape(-1)]
    if len(sh) != len(ax):
        raise ValueError(f"CenterCropPad: {len(sh)} sizes for {len(ax)} axes")
    crop = [slice(None)] * rank
    place = [slice(None)] * rank
    new_shape = list(x.shape)
    for a, s in zip(ax, sh):
        d = x.shape[a]
        if s < 0:
            raise ValueError(f"CenterCropPad: negative size {s}")
        new_shape[a] = s
        if s < d:
            b = (d - s) // 2
            crop[a] = slice(b, b + s)
        elif s > d:
            b = (s - d) // 2
            place[a] = slice(b, b + d)
    check_alloc(ctx, "CenterCropPad", new_shape, x.dtype.itemsize)  # the sizes come from the shape values
    cropped = x[tuple(crop)]
    if tuple(new_shape) == cropped.shape:
        return np.ascontiguousarray(cropped) if cropped is not x else x.copy()
    out = np.zeros(new_shape, dtype=x.dtype)
    out[tuple(place)] = cropped
    return out
