"""Host-side index arithmetic for the kernels: strides, broadcasting, dimension merging.

Broadcast shapes are numpy's (``np.broadcast_shapes``, the rule ONNX specifies);
this module only turns shapes into the element strides the kernels walk.
"""

from __future__ import annotations

import math

import numpy as np

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def size_of(shape) -> int:
    """The element count of ``shape``, exact (Python integers: numpy's int64 product would wrap)."""
    dims = [int(d) for d in shape]
    if any(d < 0 for d in dims):
        raise ValueError(f"shape {tuple(dims)} has a negative dimension")
    return math.prod(dims)


def nbytes_of(shape, dtype) -> int:
    """Bytes of a C-contiguous tensor of ``shape`` and ``dtype``; ``OverflowError`` past int64."""
    n = size_of(shape) * np.dtype(dtype).itemsize
    if n > INT64_MAX:
        raise OverflowError(f"a tensor of shape {tuple(int(d) for d in shape)} and dtype "
                            f"{np.dtype(dtype).name} needs {n} bytes, more than a 64-bit size holds")
    return n


def int32_array(values) -> np.ndarray:
    """``values`` as an int32 array for a kernel's index table; ``OverflowError`` instead of
    wrapping when one does not fit (an int64 array's astype would wrap silently)."""
    arr = np.asarray(values)
    if arr.size and arr.dtype.kind in "iu" and (int(arr.min()) < -INT32_MAX - 1 or int(arr.max()) > INT32_MAX):
        raise OverflowError(f"index value(s) {int(arr.min())}..{int(arr.max())} do not fit a kernel's int32")
    return np.asarray(arr, dtype=np.int32)


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
    return int32_array([int(v) for p in parts for v in p])


def normalize_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis
