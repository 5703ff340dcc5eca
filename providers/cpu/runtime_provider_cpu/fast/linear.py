"""Linear: float32 ``a @ w`` by a constant weight on ``_native.linear`` (the weight packed
once per node, on the kernel threads), where the policy takes it; None elsewhere (the
caller's numpy path)."""

from __future__ import annotations

import numpy as np

from ..ops._nncommon import _F32, _is_const
from .packing import pack_linear
from .policy import current


def linear_weight(ctx, w, trans):
    """``w`` ([K, N], or [N, K] with ``trans``; the node's input 1) packed for
    ``_native.linear`` and kept in the node's cache, where w is the partition's constant
    (an initializer: the same array every run, never written); else None (a weight computed
    or fed at run time, or an initializer the caller overrides)."""
    cache = getattr(ctx, "cache", None)
    if cache is None or not _is_const(ctx, 1, w):
        return None
    # the node's constant and its trans attribute are the same every run: packed once
    packed = cache.get("linear")
    if packed is None:
        packed = cache["linear"] = pack_linear(w, trans)
    return packed


def linear(ctx, a, w, trans=False, bias=None):
    """a [..., K] times the weight w ([K, N], or [N, K] with ``trans``) on ``_native.linear``
    (plus ``bias`` [N]), or None where that does not apply (the caller uses numpy)."""
    p = current()
    nat = p.native
    if (not p.linear or nat is None or type(a) is not np.ndarray or type(w) is not np.ndarray
            or a.dtype != _F32 or w.dtype != _F32 or w.ndim != 2 or a.ndim < 1):
        return None
    N, K = w.shape if trans else w.shape[::-1]
    if a.shape[-1] != K or a.size == 0 or N == 0 or a.size * N < p.linear_min_macs:
        return None
    wp = linear_weight(ctx, w, trans)
    packed = wp is not None
    if not packed:
        if trans:
            return None
        wp = np.ascontiguousarray(w)  # a weight computed at run time: packed a chunk at a time
    R = a.size // K
    y = np.empty(a.shape[:-1] + (N,), _F32)
    nat.linear(np.ascontiguousarray(a), wp, bias, y, (R, K, N), getattr(ctx, "threads", 1), packed)
    return y
