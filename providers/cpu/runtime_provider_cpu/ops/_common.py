"""Helpers shared by kernel modules: axis handling and dtype rules, defined once."""

from __future__ import annotations

import numpy as np


def normalize_axis(axis: int, rank: int) -> int:
    """Map a possibly negative axis into ``[0, rank)``; raise ``ValueError`` when out of range."""
    a = int(axis)
    if a < -rank or a >= max(rank, 1):
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return a + rank if a < 0 else a


def normalize_axes(axes, rank: int) -> tuple[int, ...]:
    """Normalize a list of axes (``None`` stays ``None``)."""
    if axes is None:
        return None
    return tuple(normalize_axis(a, rank) for a in np.asarray(axes).reshape(-1).tolist())


def same_dtype(result, like) -> np.ndarray:
    """Cast ``result`` to the dtype of ``like`` when numpy promoted it (e.g. float32 -> float64)."""
    dt = like.dtype if isinstance(like, np.ndarray) else np.dtype(like)
    result = np.asarray(result)
    return result if result.dtype == dt else result.astype(dt)
