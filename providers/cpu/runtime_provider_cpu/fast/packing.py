"""Weight layouts the compiled kernels read, made once per weight (a node's constant)."""

from __future__ import annotations

import math
import weakref

import numpy as np

from .policy import NATIVE as _native  # the build's layout constants (CONV_MR, CONV_LANES)

_F32 = np.float32


def shared(ctx, w, layout, make):
    """``make()``, the layout ``layout`` (a hashable key) of the constant ``w``, made once for
    every node of the partition that reads ``w`` (``ctx.weights``): a weight shared by many
    nodes (ALBERT's one layer run 12 times) is packed once. The store holds both weakly: a
    copy lives while a node's plan holds it, and dies with the last one."""
    store = getattr(ctx, "weights", None)
    if store is None:
        return make()
    key = (id(w), layout)
    hit = store.get(key)
    if hit is not None and hit[0]() is w:
        out = hit[1]()
        if out is not None:
            return out
    out = make()
    store[key] = (weakref.ref(w), weakref.ref(out))
    return out


def blocked(w, mr):
    """Weights [M, ...] as float32 [ceil(M / mr), mr, K] (K the rest), zeros past M."""
    M = w.shape[0]
    K = w.size // M if M else 0
    mb = -(-M // mr)
    wp = np.zeros((mb * mr, K), _F32)
    wp[:M] = w.reshape(M, K)
    return wp.reshape(mb, mr, K)


def pack_rows(w):
    """w [M, C] as ``_native.pointwise_lanes`` reads it: [ceil(M / 12), C, 12], zeros past M."""
    return np.ascontiguousarray(blocked(w, 12).transpose(0, 2, 1))


def empty64(shape):
    """An uninitialised float32 array of ``shape``, 64-byte aligned: the kernels load whole vectors."""
    n = math.prod(shape)
    raw = np.empty(n + 16, _F32)
    skip = (-raw.ctypes.data % 64) // 4
    return raw[skip:skip + n].reshape(shape)


def pack_linear(w, trans):
    """w ([K, N], or [N, K] with ``trans``) as ``_native.linear`` reads it: [ceil(N / 32), K,
    32], zeros past N, 64-byte aligned; written straight from w (a transposed or padded
    temporary of a vocabulary-sized weight would double the peak)."""
    N, K = w.shape if trans else w.shape[::-1]
    lanes = _native.CONV_LANES
    nb = -(-N // lanes)
    out = empty64((nb, K, lanes))
    full = N // lanes
    if full:
        src = w[:full * lanes] if trans else w[:, :full * lanes]
        if trans:  # [N, K] -> [nb, K, lanes]: out[j, k, l] = w[j * lanes + l, k]
            out[:full] = src.reshape(full, lanes, K).transpose(0, 2, 1)
        else:      # [K, N] -> out[j, k, l] = w[k, j * lanes + l]
            out[:full] = src.reshape(K, full, lanes).transpose(1, 0, 2)
    if full < nb:
        out[full] = 0
        rest = N - full * lanes
        out[full, :, :rest] = w[full * lanes:].T if trans else w[:, full * lanes:]
    return out


def pack_direct(w):
    """Dense conv weights [M, C, KH, KW] as ``_native.conv2d`` reads them:
    [ceil(M / CONV_MR), C * KH * KW, CONV_MR], zeros past M."""
    return np.ascontiguousarray(blocked(w, _native.CONV_MR).transpose(0, 2, 1))


def pack_lanes(w):
    """Dense conv weights [M, C, KH, KW] as ``_native.conv2d(..., lanes=True)`` reads them:
    [ceil(M / CONV_LANES), C * KH * KW, CONV_LANES], zeros past M, 64-byte aligned (the
    kernel loads them as whole vectors): the Linear's layout of w as [M, C * KH * KW]."""
    return pack_linear(w.reshape(w.shape[0], -1), True)


#: Winograd F(2x2, 3x3) transforms: U = G g G^T (weights), V = B^T d B (input patches),
#: Y = A^T M A (outputs)
WINO_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])


def winograd_u(w):
    """G g G^T of dense 3x3 conv weights [M, C, 3, 3], computed in float64: [16, M, C]."""
    M, C = w.shape[:2]
    return np.einsum("ik,mckl,jl->ijmc", WINO_G, w.astype(np.float64), WINO_G).reshape(16, M, C)


def pack_winograd(w):
    """Dense 3x3 conv weights [M, C, 3, 3] as ``_native.winograd3x3`` reads them: G g G^T
    (``winograd_u``), packed [16][ceil(M / CONV_MR)][C][CONV_MR], zeros past M."""
    mr = _native.CONV_MR
    M, C = w.shape[:2]
    mb = -(-M // mr)
    u = winograd_u(w)
    up = np.zeros((16, mb * mr, C), _F32)
    up[:, :M] = u
    return np.ascontiguousarray(up.reshape(16, mb, mr, C).transpose(0, 1, 3, 2))


def pack_winograd_lanes(w):
    """Dense 3x3 conv weights [M, C, 3, 3] as ``_native.winograd3x3(..., lanes=True)`` reads
    them: G g G^T packed [16][ceil(M / CONV_LANES)][C][CONV_LANES], zeros past M, 64-byte
    aligned (each of the 16 the Linear's layout of that [M, C] matrix)."""
    M, C = w.shape[:2]
    lanes = _native.CONV_LANES
    u = winograd_u(w).astype(_F32)
    out = empty64((16, -(-M // lanes), C, lanes))
    for xi in range(16):
        out[xi] = pack_linear(u[xi], True)
    return out
