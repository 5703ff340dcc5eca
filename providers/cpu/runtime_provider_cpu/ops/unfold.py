"""CPU kernels: the window ops that scatter back into an image (Col2Im, the inverse of
im2col, and MaxUnpool, the inverse of MaxPool)."""

from __future__ import annotations

import math

import numpy as np

from ..limits import check_alloc
from ..registry import kernel
from ._nncommon import _ints


@kernel("Col2Im", 18)
def col2im(ctx, data, image_shape, block_shape, *, dilations, pads, strides):
    img = [int(v) for v in np.asarray(image_shape).reshape(-1)]
    ks = [int(v) for v in np.asarray(block_shape).reshape(-1)]
    nd = len(img)
    if len(ks) != nd:
        raise ValueError(f"Col2Im: image_shape {img} and block_shape {ks} differ in length")
    dil = _ints(dilations, nd, 1)
    st = _ints(strides, nd, 1)
    p = _ints(pads, 2 * nd, 0)
    if data.ndim != 3:
        raise ValueError(f"Col2Im: input must be [N, C*prod(block_shape), L], got shape {data.shape}")
    N, CK, L = data.shape
    K = math.prod(ks)
    if K == 0 or CK % K:
        raise ValueError(f"Col2Im: input dim 1 ({CK}) is not a multiple of prod(block_shape) ({K})")
    C = CK // K
    blocks = [(img[i] + p[i] + p[nd + i] - (dil[i] * (ks[i] - 1) + 1)) // st[i] + 1 for i in range(nd)]
    if any(b < 1 for b in blocks) or math.prod(blocks) != L:
        raise ValueError(f"Col2Im: {L} blocks in the input, but the geometry gives {blocks}")
    ext = [max(img[i] + p[i] + p[nd + i], (blocks[i] - 1) * st[i] + (ks[i] - 1) * dil[i] + 1)
           for i in range(nd)]
    cols = data.reshape(N, C, K, *blocks)
    # image_shape and the pads set the size of the padded image this scatters into
    out = np.zeros(check_alloc(ctx, "Col2Im", (N, C, *ext), data.dtype.itemsize), dtype=data.dtype)
    for kidx, offs in enumerate(np.ndindex(*ks)):
        sl = (slice(None), slice(None)) + tuple(
            slice(offs[i] * dil[i], offs[i] * dil[i] + (blocks[i] - 1) * st[i] + 1, st[i]) for i in range(nd))
        out[sl] += cols[:, :, kidx]
    return np.ascontiguousarray(out[(slice(None), slice(None)) + tuple(
        slice(p[i], p[i] + img[i]) for i in range(nd))])


@kernel("MaxUnpool", 9, 11, 22)
def max_unpool(ctx, x, indices, output_shape=None, *, kernel_shape, pads, strides):
    nd = x.ndim - 2
    ks = [int(k) for k in kernel_shape]
    if len(ks) != nd:
        raise ValueError(f"MaxUnpool: kernel_shape {ks} does not fit input rank {x.ndim}")
    st = _ints(strides, nd, 1)
    p = _ints(pads, 2 * nd, 0)
    inferred = [x.shape[0], x.shape[1]] + [(x.shape[2 + i] - 1) * st[i] - (p[i] + p[nd + i]) + ks[i]
                                           for i in range(nd)]
    if indices.shape != x.shape:
        raise ValueError(f"MaxUnpool: indices shape {indices.shape} != X shape {x.shape}")
    check_alloc(ctx, "MaxUnpool", inferred, x.dtype.itemsize)  # strides/pads set the unpooled size
    total = math.prod(inferred)
    idx = np.asarray(indices).reshape(-1).astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= total):
        raise ValueError(f"MaxUnpool: an index is out of range [0, {total})")
    y = np.zeros(total, dtype=x.dtype)
    y[idx] = x.reshape(-1)
    y = y.reshape(inferred)
    if output_shape is None or np.asarray(output_shape).size == 0:
        return y
    osh = [int(v) for v in np.asarray(output_shape).reshape(-1)]
    if len(osh) != x.ndim or any(o < i for o, i in zip(osh, inferred)):
        raise ValueError(f"MaxUnpool: output_shape {osh} is smaller than the unpooled shape {inferred}")
    if osh == inferred:
        return y
    res = np.zeros(check_alloc(ctx, "MaxUnpool", osh, x.dtype.itemsize), dtype=x.dtype)
    res[tuple(slice(0, i) for i in inferred)] = y
    return res
