"""Helpers the nn kernel families share: compute dtypes, attribute reads, window geometry
(convolution and pooling pads, output sizes, the taps a window position reads)."""

from __future__ import annotations

import numpy as np

_FLOAT = frozenset({"float16", "float32", "float64"})
_BF16 = frozenset({"bfloat16"})  # ml_dtypes.bfloat16: computed in float32, cast back
_MATMUL_TYPES = _FLOAT | {"int32", "int64", "uint32", "uint64"}
_F32 = np.float32


def _cdtype(dt) -> np.dtype:
    """Compute dtype for a float input dtype: float16 is computed in float32."""
    dt = np.dtype(dt)
    return np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)


def _as(x, dt):
    return x if x.dtype == dt else x.astype(dt)


def _attr(node, name, default=None):
    v = node.attrs.get(name)
    return default if v is None else v


def _in_dtype(node, i=0):
    info = node.input_info[i] if len(node.input_info) > i else None
    return None if info is None or info.dtype is None else np.dtype(info.dtype)


def _is_const(ctx, i, a):
    """Whether ``a``, the node's input ``i``, is the partition's constant for it (the same
    array every run, never written), so that what a kernel derives from it may be kept."""
    info = getattr(getattr(ctx, "node", None), "input_info", None)
    return info is not None and len(info) > i and info[i] is not None and getattr(info[i], "const", None) is a


def _ints(v, n, fill):
    return [fill] * n if not v else [int(i) for i in v]


def _split_same(total, auto_pad):
    small = total // 2
    return (small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small)


def _pad_const(x, begins, ends, value):
    """Pad (or crop, for negative amounts) the spatial axes (2:) of ``x``."""
    nd = len(begins)
    if not any(begins) and not any(ends):
        return x
    if any(p < 0 for p in list(begins) + list(ends)):
        sl = [slice(None), slice(None)]
        for b, e in zip(begins, ends):
            sl.append(slice(-b if b < 0 else 0, e if e < 0 else None))
        x = x[tuple(sl)]
        begins = [max(b, 0) for b in begins]
        ends = [max(e, 0) for e in ends]
        if not any(begins) and not any(ends):
            return x
    shape = list(x.shape[:2]) + [x.shape[2 + i] + begins[i] + ends[i] for i in range(nd)]
    out = np.full(shape, value, dtype=x.dtype)
    out[(slice(None), slice(None)) + tuple(slice(b, b + x.shape[2 + i])
                                           for i, b in enumerate(begins))] = x
    return out


def _tap_slice(off, stride, n_out):
    return slice(off, off + (n_out - 1) * stride + 1, stride)



def _conv_pads(in_sp, k_eff, strides, pads, auto_pad):
    nd = len(in_sp)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        b, e = [], []
        for i in range(nd):
            out = -(-in_sp[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + k_eff[i] - in_sp[i])
            hb, he = _split_same(total, auto_pad)
            b.append(hb)
            e.append(he)
        return b, e
    if auto_pad == "VALID":
        return [0] * nd, [0] * nd
    p = _ints(pads, 2 * nd, 0)
    return p[:nd], p[nd:]

def _tap_range(size, pad, off, stride, n_out):
    """Output positions ``o`` whose tap ``o * stride + off - pad`` falls inside ``[0, size)``."""
    lo = max(0, -(-(pad - off) // stride))
    hi = min(n_out, (size - 1 + pad - off) // stride + 1)
    return lo, max(lo, hi)


def _conv_out(in_sp, ks, strides, dilations, pb, pe) -> list:
    """The output's spatial sizes of a convolution (0 where the kernel does not fit)."""
    return [max(0, (in_sp[i] + pb[i] + pe[i] - (ks[i] - 1) * dilations[i] - 1) // strides[i] + 1)
            for i in range(len(in_sp))]


def _check_kernel_shape(op, kernel_shape, w_shape):
    """Raise where a convolution's ``kernel_shape`` attribute is not W's spatial shape: the
    kernels read W, so running it would compute another model (onnxruntime refuses it: "kernel_shape
    is not compatible with W shape"). Load refuses it where W's shape is known then."""
    if kernel_shape is not None and len(kernel_shape) and tuple(kernel_shape) != tuple(w_shape[2:]):
        raise ValueError(f"{op}: attribute kernel_shape {[int(k) for k in kernel_shape]} is not compatible "
                         f"with W's shape {tuple(w_shape)} (its spatial axes {tuple(w_shape[2:])})")


def _check_window_fits(op, in_sp, k_eff, pb, pe):
    """Raise where a convolution's kernel window is larger than an axis's padded input (an empty
    input axis included): onnxruntime refuses these ("Invalid input shape") instead of an empty
    output."""
    for i in range(len(in_sp)):
        if in_sp[i] + pb[i] + pe[i] < k_eff[i]:
            raise ValueError(f"{op}: invalid input shape {tuple(in_sp)}: the kernel window of axis {i} "
                             f"({k_eff[i]} wide with dilations) is larger than the padded input "
                             f"({in_sp[i]} + pads {pb[i]}, {pe[i]})")


def _check_pool_fits(op, shape, k_eff, strides, pb, pe):
    """Raise where onnxruntime refuses a pooling geometry: an empty axis other than the batch,
    or a window so far past the padded input that its output size formula goes negative
    (``trunc((in + pads - window) / stride) + 1 < 0``); smaller misfits give an empty axis."""
    if shape[0] != 0 and 0 in shape[1:]:
        raise ValueError(f"{op}: invalid input shape {tuple(shape)}: only the batch dimension may be 0")
    for i, n in enumerate(shape[2:]):
        if n + pb[i] + pe[i] - k_eff[i] <= -2 * strides[i]:
            raise ValueError(f"{op}: the output size of axis {i} is negative: input {n}, pads {pb[i]}, "
                             f"{pe[i]}, window {k_eff[i]} (with dilations), stride {strides[i]}")


def _spatial_axes(x):
    return tuple(range(2, x.ndim))


def _in_rank(node, i=0):
    info = node.input_info[i] if len(node.input_info) > i else None
    return None if info is None or info.shape is None else len(info.shape)



#: a window geometry past these never reaches the compiled kernels, whose per-stride and
#: per-tap tables live on the stack (no real model comes near them): padded extents, pads and
#: dilations; strides; kernel sizes
_NATIVE_MAX_EXTENT = 1 << 24
_NATIVE_MAX_STRIDE = 1 << 10
_NATIVE_MAX_TAPS = 1 << 14


def _padding_extreme(in_sp, ks, strides, dilations, pb, pe, out) -> bool:
    """Whether a padded copy of the input would be far larger than what the output reads:
    over the spatial axes, more than 4x the input plus the positions the output's windows
    read (``out * k`` an axis), or an axis past ``_NATIVE_MAX_EXTENT``. Then the windows are
    gathered (:func:`_window_gather`) instead, sized from the output."""
    padded = 1
    for i in range(len(in_sp)):
        ext = in_sp[i] + max(pb[i], 0) + max(pe[i], 0)
        if ext >= _NATIVE_MAX_EXTENT or (ks[i] - 1) * dilations[i] >= _NATIVE_MAX_EXTENT:
            return True
        padded *= ext
    reads = 1
    size = 1
    for i in range(len(in_sp)):
        reads *= out[i] * ks[i]
        size *= in_sp[i]
    return padded > 4 * (reads + size)


def _native_geometry_ok(in_sp, ks, strides, dilations, pb, pe, out) -> bool:
    """Whether a window geometry is in the range the compiled kernels are for (see
    ``_NATIVE_MAX_EXTENT``) and padding it costs no more than the output needs."""
    lim = _NATIVE_MAX_EXTENT
    if (any(v >= lim or v <= -lim for v in (*dilations, *pb, *pe, *out))
            or max(strides, default=1) > _NATIVE_MAX_STRIDE or max(ks, default=1) > _NATIVE_MAX_TAPS):
        return False
    return not _padding_extreme(in_sp, ks, strides, dilations, pb, pe, out)


def _window_gather(x, ks, strides, dilations, pb, out, fill):
    """The positions the output's windows read, axis by axis: x's spatial axis i becomes
    ``out[i] * ks[i]`` long (window o's taps at ``o * ks[i] ...``; a position in the padding
    holds ``fill``), so the same windows are read with strides ``ks``, no dilation and no
    padding. Its size follows the output, not the padded extent."""
    for i in range(len(ks)):
        ax = 2 + i
        idx = (np.arange(out[i], dtype=np.int64)[:, None] * strides[i]
               + np.arange(ks[i], dtype=np.int64)[None, :] * dilations[i] - pb[i]).reshape(-1)
        inside = (idx >= 0) & (idx < x.shape[ax])
        g = np.take(x, np.clip(idx, 0, max(x.shape[ax] - 1, 0)), axis=ax) if x.shape[ax] else None
        if g is None or not inside.all():
            shape = list(x.shape)
            shape[ax] = idx.size
            full = np.full(shape, fill, dtype=x.dtype)
            if g is not None:
                sl = [slice(None)] * x.ndim
                sl[ax] = inside
                full[tuple(sl)] = g[tuple(sl)]
            g = full
        x = g
    return x
