"""CPU kernels: tensor creation and shape manipulation."""

from __future__ import annotations

import math

import numpy as np

from ..limits import check_alloc
from ..registry import kernel
from ._common import ignore_fp, normalize_axes, normalize_axis

INT64_MAX = np.iinfo(np.int64).max
# ONNX TensorProto element types -> numpy (the CPU provider does not import onnx)
_ELEM = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
         9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}


def _ints(t) -> list[int]:
    return [int(v) for v in np.asarray(t).reshape(-1)]


@kernel("Identity", 1, 13, 14, 16, 19, 21, 23, 24, 25)
def identity(ctx, x):
    return x


@kernel("Constant", 1, 9, 11, 12, 13, 19, 21, 23, 24, 25)
def constant(ctx, *, value=None, sparse_value=None, value_float=None, value_floats=None,
             value_int=None, value_ints=None, value_string=None, value_strings=None):
    if value is not None:
        return np.array(value, copy=True)
    if sparse_value is not None:
        sp = sparse_value
        # onnx.reference's SparseTensor: ``shape`` (``dense_shape`` in older onnx releases)
        shape = getattr(sp, "dense_shape", None)
        dense = np.zeros(tuple(sp.shape if shape is None else shape), dtype=sp.values.dtype)
        idx = np.asarray(sp.indices)
        if idx.ndim == 1:
            dense.reshape(-1)[idx] = sp.values
        else:
            dense[tuple(idx.T)] = sp.values
        return dense
    if value_float is not None:
        return np.array(value_float, np.float32)
    if value_floats is not None:
        return np.array(value_floats, np.float32)
    if value_int is not None:
        return np.array(value_int, np.int64)
    if value_ints is not None:
        return np.array(value_ints, np.int64)
    if value_string is not None:
        return np.array(value_string, dtype=object)
    if value_strings is not None:
        return np.array(value_strings, dtype=object)
    raise ValueError("Constant has no value attribute")


@kernel("ConstantOfShape", 9, 20, 21, 23, 24, 25)
def constant_of_shape(ctx, shape, *, value=None):
    v = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    return np.full(check_alloc(ctx, "ConstantOfShape", _ints(shape), v.dtype.itemsize), v[0], dtype=v.dtype)


@kernel("Shape", 1, 13, 15, 19, 21, 23, 24, 25)
def shape(ctx, x, *, start=None, end=None):
    s = np.array(x.shape, dtype=np.int64)
    r = len(s)
    a = 0 if start is None else start
    b = r if end is None else end
    a = min(max(a + r if a < 0 else a, 0), r)
    b = min(max(b + r if b < 0 else b, 0), r)
    return s[a:b].copy()


@kernel("Size", 1, 13, 19, 21, 23, 24, 25)
def size(ctx, x):
    return np.array(x.size, dtype=np.int64)


@kernel("Reshape", 5, 13, 14, 19, 21, 23, 24, 25)
def reshape(ctx, x, shape, *, allowzero=0):
    dims = _ints(shape)
    if not allowzero:
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return x.reshape(dims)


@kernel("Flatten", 1, 9, 11, 13, 21, 23, 24, 25)
def flatten(ctx, x, *, axis):
    a = axis + x.ndim if axis < 0 else axis  # Flatten's axis lies in [-r, r]
    if not 0 <= a <= x.ndim:
        raise ValueError(f"Flatten axis {axis} is out of range for rank {x.ndim}")
    lead = math.prod(x.shape[:a])  # Python ints: np.prod took ~3 us a call
    return x.reshape(lead, -1) if x.size else x.reshape(lead, math.prod(x.shape[a:]))


@kernel("Squeeze", 1, 11, 13, 21, 23, 24, 25)
def squeeze(ctx, x, axes_in=None, *, axes=None):
    ax = axes if axes_in is None else _ints(axes_in)
    if ax is None or len(ax) == 0:
        return x.reshape([d for d in x.shape if d != 1])
    return np.squeeze(x, axis=normalize_axes(ax, x.ndim))


@kernel("Unsqueeze", 1, 11, 13, 21, 23, 24, 25)
def unsqueeze(ctx, x, axes_in=None, *, axes=None):
    ax = axes if axes_in is None else _ints(axes_in)
    out_rank = x.ndim + len(ax)
    ax = sorted(normalize_axes(ax, out_rank))
    if len(set(ax)) != len(ax):
        raise ValueError(f"Unsqueeze axes {ax} repeat an axis")
    shape = list(x.shape)
    for a in ax:
        shape.insert(a, 1)
    return x.reshape(shape)


@kernel("Transpose", 1, 13, 21, 23, 24, 25)
def transpose(ctx, x, *, perm=None):
    return np.transpose(x, perm if perm else None)


@kernel("Reshape", 1)
def reshape_v1(ctx, x, *, shape=None, consumed_inputs=None):
    # consumed_inputs is a legacy in-place hint without effect on the result
    if shape is None:
        raise ValueError("Reshape-1 needs the shape attribute")
    dims = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return x.reshape(dims)


@kernel("Concat", 1)
def concat_v1(ctx, *xs, axis=None):
    # Concat-1: the axis attribute is optional and defaults to 1 (see the ONNX Changelog)
    return np.concatenate(xs, axis=normalize_axis(1 if axis is None else axis, xs[0].ndim))


@kernel("Concat", 4, 11, 13)
def concat(ctx, *xs, axis):
    a = normalize_axis(axis, xs[0].ndim)
    return np.concatenate(xs, axis=a)


@kernel("Split", 2, 11, 13, 18)
def split(ctx, x, split_in=None, *, axis, split=None, num_outputs=None):
    a = normalize_axis(axis, x.ndim)
    n = ctx.n_outputs
    sizes = _ints(split_in) if split_in is not None else split
    dim = x.shape[a]
    if not sizes:
        if num_outputs is not None:
            chunk = -(-dim // num_outputs)
            sizes = [chunk] * (dim // chunk) + ([dim % chunk] if dim % chunk else [])
        else:
            if dim % n:
                raise ValueError(f"cannot split dim {dim} into {n} equal parts")
            sizes = [dim // n] * n
    if sum(sizes) != dim:
        raise ValueError(f"split sizes {sizes} do not add up to dim {dim}")
    offs = np.cumsum([0] + list(sizes))
    sl = [slice(None)] * x.ndim
    outs = []
    for i in range(len(sizes)):
        sl[a] = slice(int(offs[i]), int(offs[i + 1]))
        outs.append(x[tuple(sl)])
    return tuple(outs)


def _split_v1_check(node):
    return None if node.attrs.get("axis") is not None else \
        "Split-1 without an axis attribute: the version-1 schema gives no default axis"


_split_v2 = split  # the kernel below has an attribute named split


@kernel("Split", 1, check=_split_v1_check)
def split_v1(ctx, x, split_in=None, *, axis, split=None):
    # the split lengths come from the optional second input or the split attribute
    sizes = _ints(split_in) if split_in is not None else split
    return _split_v2(ctx, x, None, axis=axis, split=list(sizes) if sizes else None)


def _slice(x, starts, ends, axes, steps):
    rank = x.ndim
    axes = list(range(len(starts))) if axes is None else list(normalize_axes(axes, rank))
    steps = [1] * len(starts) if steps is None else steps
    sl = [slice(None)] * rank
    for s, e, a, st in zip(starts, ends, axes, steps):
        if st == 0:
            raise ValueError("Slice step cannot be 0")
        dim = x.shape[a]
        s = s + dim if s < 0 else s
        e = e + dim if e < 0 else e
        if st > 0:
            s = min(max(s, 0), dim)
            e = min(max(e, 0), dim)
        else:
            s = min(max(s, -1), dim - 1)
            e = min(max(e, -1), dim - 1)
        sl[a] = slice(s, e if e >= 0 else None, st)
    return x[tuple(sl)]


@kernel("Slice", 1)
def slice_v1(ctx, x, *, starts, ends, axes=None):
    return _slice(x, starts, ends, axes, None)


@kernel("Slice", 10, 11, 13)
def slice_v10(ctx, x, starts, ends, axes=None, steps=None):
    return _slice(x, _ints(starts), _ints(ends), None if axes is None else _ints(axes),
                  None if steps is None else _ints(steps))


@kernel("Gather", 1, 11, 13)
def gather(ctx, x, indices, *, axis):
    a = normalize_axis(axis, x.ndim)
    idx = np.asarray(indices).astype(np.int64, copy=False)
    dim = x.shape[a]
    if idx.size and (idx.min() < -dim or idx.max() >= dim):
        raise IndexError(f"Gather indices out of range [-{dim}, {dim - 1}]")
    if idx.ndim == 0:
        # one index: a view of x (basic indexing; Ellipsis keeps a 0-d result an array), no copy
        # of the slab (q/k/v picked out of a packed projection are read once and reshaped)
        i = int(idx)
        return x[(slice(None),) * a + (i + dim if i < 0 else i, Ellipsis)]
    idx = np.where(idx < 0, idx + dim, idx)
    return np.take(x, idx, axis=a)


@kernel("GatherElements", 11, 13)
def gather_elements(ctx, x, indices, *, axis):
    a = normalize_axis(axis, x.ndim)
    idx = np.asarray(indices).astype(np.int64, copy=False)
    idx = np.where(idx < 0, idx + x.shape[a], idx)
    return np.take_along_axis(x, idx, axis=a)


@kernel("GatherND", 11, 12, 13)
def gather_nd(ctx, x, indices, *, batch_dims=0):
    idx = np.asarray(indices).astype(np.int64, copy=False)
    b = batch_dims
    batch_shape = x.shape[:b]
    nb = int(np.prod(batch_shape, dtype=np.int64))
    xr = x.reshape((nb,) + x.shape[b:])
    ir = idx.reshape((nb,) + idx.shape[b:])
    k = idx.shape[-1]
    inner = ir.shape[1:-1]
    out_tail = x.shape[b + k:]
    res = np.empty((nb,) + inner + out_tail, dtype=x.dtype)
    for i in range(nb):
        ii = ir[i].reshape(-1, k)
        dims = np.array(xr.shape[1:1 + k])
        ii = np.where(ii < 0, ii + dims, ii)
        res[i] = xr[i][tuple(ii.T)].reshape(inner + out_tail)
    return res.reshape(batch_shape + inner + out_tail)


_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


@kernel("ScatterElements", 11, 13, 16, 18)
def scatter_elements(ctx, x, indices, updates, *, axis, reduction="none"):
    a = normalize_axis(axis, x.ndim)
    out = np.array(x, copy=True)
    idx = np.asarray(indices).astype(np.int64, copy=False)
    idx = np.where(idx < 0, idx + x.shape[a], idx)
    grid = list(np.indices(idx.shape, sparse=True))
    grid[a] = idx
    key = tuple(np.broadcast_arrays(*grid))
    if reduction in (None, "none"):
        out[key] = updates
    else:
        _REDUCE[reduction].at(out, key, updates)
    return out


@kernel("Scatter", 9, 11)
def scatter(ctx, x, indices, updates, *, axis):
    return scatter_elements(ctx, x, indices, updates, axis=axis)


@kernel("ScatterND", 11, 13, 16, 18)
def scatter_nd(ctx, x, indices, updates, *, reduction="none"):
    out = np.array(x, copy=True)
    idx = np.asarray(indices).astype(np.int64, copy=False)
    k = idx.shape[-1]
    flat = idx.reshape(-1, k)
    upd = np.asarray(updates).reshape((flat.shape[0],) + x.shape[k:])
    if reduction in (None, "none"):
        for i in range(flat.shape[0]):
            out[tuple(flat[i])] = upd[i]
    else:
        f = _REDUCE[reduction]
        for i in range(flat.shape[0]):
            t = tuple(flat[i])
            out[t] = f(out[t], upd[i])
    return out


@kernel("Expand", 8, 13)
def expand(ctx, x, shape):
    dims = _ints(shape)
    target = np.broadcast_shapes(x.shape, tuple(dims))
    # a view, but every consumer may materialize it: it must fit under the cap too
    return np.broadcast_to(x, check_alloc(ctx, "Expand", target, x.dtype.itemsize))


@kernel("Tile", 1)
def tile_v1(ctx, x, tiles, axis):
    # Tile-1: repeat the whole tensor `tiles` times along the one axis `axis` (scalars)
    reps = [1] * x.ndim
    reps[normalize_axis(_ints(axis)[0], x.ndim)] = _ints(tiles)[0]
    return np.tile(x, _tile_reps(ctx, x, reps))


def _tile_reps(ctx, x, reps: list[int]) -> list[int]:
    if len(reps) != x.ndim:
        raise ValueError(f"Tile: repeats has {len(reps)} values for an input of rank {x.ndim}")
    if any(r < 0 for r in reps):
        raise ValueError(f"Tile: repeats must not be negative, got {reps}")
    check_alloc(ctx, "Tile", [d * r for d, r in zip(x.shape, reps)], x.dtype.itemsize)
    return reps


@kernel("Tile", 6, 13)
def tile(ctx, x, repeats):
    return np.tile(x, _tile_reps(ctx, x, _ints(repeats)))


def _pad(ctx, x, pads, mode, value, axes=None):
    rank = x.ndim
    axes = list(range(rank)) if axes is None else list(normalize_axes(axes, rank))
    n = len(axes)
    width = [(0, 0)] * rank
    for i, a in enumerate(axes):
        width[a] = (int(pads[i]), int(pads[i + n]))
    # negative pads crop
    crop = tuple(slice(-b if b < 0 else 0, x.shape[d] + e if e < 0 else None)
                 for d, (b, e) in enumerate(width))
    x = x[crop]
    width = [(max(b, 0), max(e, 0)) for b, e in width]
    check_alloc(ctx, "Pad", [d + b + e for d, (b, e) in zip(x.shape, width)], x.dtype.itemsize)
    if mode == "constant":
        v = 0 if value is None else value
        return np.pad(x, width, mode="constant", constant_values=np.asarray(v).astype(x.dtype))
    if mode == "reflect":
        return np.pad(x, width, mode="reflect")
    if mode == "edge":
        return np.pad(x, width, mode="edge")
    if mode == "wrap":
        return np.pad(x, width, mode="wrap")
    raise ValueError(f"Pad mode {mode!r} is not one of constant, reflect, edge, wrap")


@kernel("Pad", 1)
def pad_v1(ctx, x, *, paddings, mode, value):
    # Pad-1 is Pad-2 with the pads attribute named paddings
    return _pad(ctx, x, paddings, mode, value)


@kernel("Pad", 2)
def pad_v2(ctx, x, *, pads, mode, value):
    return _pad(ctx, x, pads, mode, value)


@kernel("Pad", 11, 13, 18, 19, 21, 23, 24, 25)
def pad_v11(ctx, x, pads, constant_value=None, axes=None, *, mode):
    v = None if constant_value is None or np.size(constant_value) == 0 else np.asarray(constant_value).reshape(-1)[0]
    return _pad(ctx, x, _ints(pads), mode, v, None if axes is None else _ints(axes))


def _range_values(ctx, start, limit, delta, compute=None):
    """Range: ``start + i * delta`` for ``i < max(ceil((limit - start) / delta), 0)``, computed in
    ``compute`` (default: the input type) and returned in the input type."""
    vals = []
    for name, v in (("start", start), ("limit", limit), ("delta", delta)):
        v = np.asarray(v)
        if v.size != 1:
            raise ValueError(f"Range {name} must be a scalar, got shape {v.shape}")
        vals.append(v.reshape(()))
    s, l, d = vals
    dt = s.dtype
    if dt.kind in "iu":
        si, li, di = int(s), int(l), int(d)
        if di == 0:
            raise ValueError("Range delta must not be 0")
        n = max(-((si - li) // di), 0)  # exact ceil((limit - start) / delta)
        check_alloc(ctx, "Range", [n], dt.itemsize)
        with ignore_fp(over="ignore"):
            return (np.arange(n, dtype=dt) * d + s).astype(dt, copy=False)
    ct = np.dtype(compute) if compute is not None else dt
    sf, lf, df = (float(v.astype(np.float64)) for v in (s, l, d))
    if df == 0.0:
        raise ValueError("Range delta must not be 0")
    q = (lf - sf) / df
    if not np.isfinite(q):
        raise ValueError(f"Range of start={sf}, limit={lf}, delta={df} has no finite length")
    n = max(int(np.ceil(q)), 0)
    check_alloc(ctx, "Range", [n], max(ct.itemsize, dt.itemsize))
    y = np.arange(n, dtype=ct) * d.astype(ct)
    y += s.astype(ct)
    return y.astype(dt, copy=False)


@kernel("Range", 11)
def range_(ctx, start, limit, delta):
    return _range_values(ctx, start, limit, delta)


_RANGE_LOWP = ("float16", "bfloat16")
_RANGE_STASH = {1: np.float32, 11: np.float64}  # TensorProto.FLOAT, TensorProto.DOUBLE


def _range27_check(node):
    info = node.input_info[0] if node.input_info else None
    dt = None if info is None or info.dtype is None else np.dtype(info.dtype)
    st = node.attrs.get("stash_type")
    if dt is not None and dt.name in _RANGE_LOWP and st not in _RANGE_STASH:
        return f"Range stash_type={st!r} is not implemented for {dt.name} (FLOAT=1 or DOUBLE=11)"
    return None


@kernel("Range", 27, check=_range27_check)
def range_27(ctx, start, limit, delta, *, stash_type):
    # stash_type: the accumulation type for float16/bfloat16 only (no effect for other types)
    lowp = np.asarray(start).dtype.name in _RANGE_LOWP
    return _range_values(ctx, start, limit, delta, _RANGE_STASH[stash_type] if lowp else None)


@kernel("Trilu", 14)
def trilu(ctx, x, k=None, *, upper):
    kk = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
    return np.triu(x, kk) if upper else np.tril(x, kk)


def _topk(x, k, axis, largest, sorted_):
    a = normalize_axis(axis, x.ndim)
    if x.dtype.kind == "f":
        key = -x if largest else x
    else:
        key = -x.astype(np.float64) if largest else x
    idx = np.argsort(key, axis=a, kind="stable")
    idx = np.take(idx, np.arange(k), axis=a)
    vals = np.take_along_axis(x, idx, axis=a)
    return vals, idx.astype(np.int64)


@kernel("TopK", 1)
def topk_v1(ctx, x, *, axis, k):
    return _topk(x, k, axis, True, True)


@kernel("TopK", 10)
def topk_v10(ctx, x, k, *, axis):
    return _topk(x, int(np.asarray(k).reshape(-1)[0]), axis, True, True)


@kernel("TopK", 11, 24)
def topk_v11(ctx, x, k, *, axis, largest, sorted):
    return _topk(x, int(np.asarray(k).reshape(-1)[0]), axis, bool(largest), bool(sorted))


@kernel("NonZero", 9, 13)
def nonzero(ctx, x):
    if x.ndim == 0:
        return np.zeros((0, int(bool(x))), np.int64) if not x else np.zeros((0, 1), np.int64)
    return np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)


@kernel("OneHot", 9, 11, 28)  # 28 adds bfloat16 values
def onehot(ctx, indices, depth, values, *, axis):
    d = int(np.asarray(depth).reshape(-1)[0])
    idx = np.asarray(indices).astype(np.int64)
    idx = np.where(idx < 0, idx + d, idx)
    rank = idx.ndim + 1
    a = normalize_axis(axis, rank)
    if d < 0:
        raise ValueError(f"OneHot: depth must not be negative, got {d}")
    check_alloc(ctx, "OneHot", idx.shape + (d,), max(np.dtype(values.dtype).itemsize, 8))  # the int64 compare too
    eye = (idx[..., None] == np.arange(d))
    eye = np.moveaxis(eye, -1, a)
    off, on = np.asarray(values).reshape(-1)[:2]
    return np.where(eye, on, off).astype(values.dtype)


@kernel("Compress", 9, 11, 28)  # 28 adds bfloat16
def compress(ctx, x, condition, *, axis=None):
    cond = np.asarray(condition).astype(bool).reshape(-1)
    if axis is None:
        flat = x.reshape(-1)
        return flat[:len(cond)][cond[:flat.size]]
    a = normalize_axis(axis, x.ndim)
    return np.compress(cond, x, axis=a)


@kernel("Unique", 11, 28)  # 28 adds bfloat16
def unique(ctx, x, *, axis=None, sorted=1):
    if axis is None:
        data = x.reshape(-1)
        u, first, inv, counts = np.unique(data, return_index=True, return_inverse=True, return_counts=True)
        ax = None
    else:
        ax = normalize_axis(axis, x.ndim)
        u, first, inv, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True, axis=ax)
    inv = np.asarray(inv).reshape(-1)
    if not sorted:
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        u = np.take(u, order, axis=0 if ax is None else ax)
        first, counts, inv = first[order], counts[order], rank[inv]
    return (u, first.astype(np.int64), inv.astype(np.int64), counts.astype(np.int64))


@kernel("DepthToSpace", 11, 13, 28)  # 13, 28 add types
def depth_to_space(ctx, x, *, blocksize, mode):
    b, c, h, w = x.shape
    bs = blocksize
    if mode == "DCR":
        t = x.reshape(b, bs, bs, c // (bs * bs), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        t = x.reshape(b, c // (bs * bs), bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    return t.reshape(b, c // (bs * bs), h * bs, w * bs)


@kernel("DepthToSpace", 1)
def depth_to_space_v1(ctx, x, *, blocksize):
    return depth_to_space(ctx, x, blocksize=blocksize, mode="DCR")


@kernel("SpaceToDepth", 1, 13)
def space_to_depth(ctx, x, *, blocksize):
    b, c, h, w = x.shape
    bs = blocksize
    t = x.reshape(b, c, h // bs, bs, w // bs, bs).transpose(0, 3, 5, 1, 2, 4)
    return t.reshape(b, c * bs * bs, h // bs, w // bs)


def _s2d_mode(node):
    mode = node.attrs.get("mode", "DCR")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    return None if mode in ("DCR", "CRD") else f"SpaceToDepth mode {mode!r} is not DCR or CRD"


@kernel("SpaceToDepth", 28, check=_s2d_mode)
def space_to_depth_v28(ctx, x, *, blocksize, mode):
    """Opset 28 adds ``mode``: DCR (the order of versions 1 and 13) or CRD."""
    if x.ndim != 4:
        raise ValueError(f"SpaceToDepth needs a 4-D input, got shape {x.shape}")
    b, c, h, w = x.shape
    bs = blocksize
    if h % bs or w % bs:
        raise ValueError(f"SpaceToDepth: spatial dims {h}x{w} are not divisible by blocksize {bs}")
    t = x.reshape(b, c, h // bs, bs, w // bs, bs)
    t = t.transpose(0, 3, 5, 1, 2, 4) if mode == "DCR" else t.transpose(0, 1, 3, 5, 2, 4)
    return t.reshape(b, c * bs * bs, h // bs, w // bs)


@kernel("EyeLike", 9, 22)
def eye_like(ctx, x, *, dtype=None, k=0):
    if dtype is None:
        dt = x.dtype
    elif ctx.output_dtypes and ctx.output_dtypes[0] is not None:
        dt = ctx.output_dtypes[0]
    else:
        dt = _ELEM.get(dtype)
        if dt is None:
            raise ValueError(f"EyeLike dtype {dtype} is not supported")
    return np.eye(x.shape[0], x.shape[1], k=k, dtype=dt)


@kernel("ReverseSequence", 10, 28)  # 28 adds bfloat16
def reverse_sequence(ctx, x, sequence_lens, *, batch_axis, time_axis):
    out = np.array(x, copy=True)
    for bi, n in enumerate(np.asarray(sequence_lens).reshape(-1).tolist()):
        src = [slice(None)] * x.ndim
        src[batch_axis] = bi
        src[time_axis] = slice(0, n)
        dst = list(src)
        dst[time_axis] = slice(n - 1, None, -1) if n > 0 else slice(0, 0)
        out[tuple(src)] = x[tuple(dst)]
    return out


@kernel("Einsum", 12, 28)  # 28 adds bfloat16
def einsum(ctx, *xs, equation):
    eq = equation.replace(" ", "")
    dt = xs[0].dtype
    if dt == np.float16 or dt.kind == "V" or dt.name == "bfloat16":
        xs = [x.astype(np.float32) for x in xs]  # 16-bit floats accumulate in float32
    r = np.einsum(eq, *xs, optimize=len(xs) > 2)
    return np.asarray(r).astype(dt, copy=False)
