"""Host-side index arithmetic for the kernels: strides, broadcasting, dimension merging.

Broadcast shapes are numpy's (``np.broadcast_shapes``, the rule ONNX specifies);
this module only turns shapes into the element strides the kernels walk.
"""

from __future__ import annotations

import numpy as np

INT32_MAX = 2**31 - 1


def size_of(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def contiguous_strides(shape) -> list[int]:
    """Element strides of a C-contiguous array of ``shape``."""
    strides = [0] * len(shape)
    acc = 1
    for d in range(len(shape) - 1, -1, -1):
        strides[d] = acc
        acc *= int(shape[d])
    return strides


def broadcast_strides(shape, out_shape) -> list[int]:
    """Strides that read a contiguous array of ``shape`` broadcast to ``out_shape``."""
    shape = [1] * (len(out_shape) - len(shape)) + [int(d) for d in shape]
    base = contiguous_strides(shape)
    return [0 if s == 1 and o != 1 else st for s, o, st in zip(shape, out_shape, base)]


def coalesce(dims, *strides):
    """Drop size-1 dims and merge adjacent dims that every stride list walks contiguously.

    Returns ``(dims, [strides...])`` with at least one dimension.
    """
    keep = [d for d in range(len(dims)) if int(dims[d]) != 1]
    out_dims: list[int] = []
    out_strides: list[list[int]] = [[] for _ in strides]
    for d in keep:
        n = int(dims[d])
        if out_dims and all(s[d] * n == os[-1] for s, os in zip(strides, out_strides)):
            # the previous (outer) dim steps exactly over this one: merge them
            out_dims[-1] *= n
            for s, os in zip(strides, out_strides):
                os[-1] = s[d]
            continue
        out_dims.append(n)
        for s, os in zip(strides, out_strides):
            os.append(int(s[d]))
    if not out_dims:
        return [1], [[0] for _ in strides]
    return out_dims, out_strides


def meta_array(dims, strides_list, slots: int) -> np.ndarray:
    """``[dims | strides_0 | ... | strides_{slots-1}]`` as int32 (missing lists are zeros)."""
    rank = len(dims)
    parts = [list(dims)] + [list(s) for s in strides_list]
    parts += [[0] * rank] * (slots - len(strides_list))
    return np.asarray([v for p in parts for v in p], dtype=np.int32)


def normalize_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis
