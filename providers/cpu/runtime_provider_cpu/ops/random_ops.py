"""CPU kernels: random generators (RandomUniform/Normal[Like], Bernoulli, Multinomial).

Design notes
------------
* The spec leaves the generator unspecified ("if not specified we will auto generate
  one"), so numbers cannot match another runtime's. The generator used here is numpy's
  legacy ``RandomState``, the one onnx's reference evaluator uses, drawn the same way
  (``rand`` for uniforms, ``normal`` for normals, ``binomial(1, p)`` for Bernoulli): with
  a ``seed`` attribute a node gives the same numbers as ``onnx.reference`` on every run;
  without one a fresh OS-seeded state is drawn per run.
* The seeded ONNX backend cases (``test_bernoulli*``) store numbers drawn from numpy's
  *global* stream after other draws of the test generator, not from
  ``RandomState(seed)``; no generator seeded from the node's attribute reproduces them.
* Values are drawn in float64 and cast to the output type once.
"""

from __future__ import annotations

import math

import numpy as np

from ..limits import check_alloc
from ..registry import kernel
from .signal import _ELEM

_RANDOM_OUT = frozenset({1, 10, 11, 16})  # float, float16, double, bfloat16
_BERNOULLI_OUT = frozenset({1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 16})
_FLOAT_IN = frozenset({"float16", "float32", "float64", "bfloat16"})
_DRAW = 8  # bytes per element: values are drawn in float64 (int64 for samples) before the cast


def _state(seed) -> np.random.RandomState:
    if seed is None or (isinstance(seed, float) and math.isnan(seed)):
        return np.random.RandomState()
    return np.random.RandomState(seed=int(seed) & 0xFFFFFFFF)


def _out_dtype(dtype, like=None):
    if dtype is None:
        return None if like is None else like.dtype
    return np.dtype(_ELEM[dtype])


def _dtype_check(allowed, required=False):
    def check(node):
        d = node.attrs.get("dtype")
        if d is None:
            return "the dtype attribute is required" if required else None
        if d not in allowed or d not in _ELEM:
            return f"dtype={d} is not a supported output type of {node.op_type}"
        return None
    return check


def _shape_check(node):
    r = _dtype_check(_RANDOM_OUT, required=False)(node)
    if r:
        return r
    shape = node.attrs.get("shape")
    if shape is None:
        return "the shape attribute is required"
    if any(int(s) < 0 for s in shape):
        return f"shape {list(shape)} has a negative dimension"
    return None


@kernel("RandomUniform", 1, 22, check=_shape_check)
def random_uniform(ctx, *, dtype, high, low, seed, shape):
    y = _state(seed).rand(*check_alloc(ctx, "RandomUniform", shape, _DRAW)) * (high - low) + low
    return np.asarray(y).astype(_out_dtype(dtype))


@kernel("RandomNormal", 1, 22, check=_shape_check)
def random_normal(ctx, *, dtype, mean, scale, seed, shape):
    y = _state(seed).normal(mean, scale, size=check_alloc(ctx, "RandomNormal", shape, _DRAW))
    return np.asarray(y).astype(_out_dtype(dtype))


@kernel("RandomUniformLike", 1, 22, check=_dtype_check(_RANDOM_OUT))
def random_uniform_like(ctx, x, *, dtype, high, low, seed):
    dt = _out_dtype(dtype, x)
    if dt.kind != "f" and dt != _ELEM.get(16):
        raise ValueError(f"RandomUniformLike cannot produce {dt} (give a float dtype attribute)")
    y = _state(seed).rand(*check_alloc(ctx, "RandomUniformLike", x.shape, _DRAW)) * (high - low) + low
    return np.asarray(y).astype(dt)


@kernel("RandomNormalLike", 1, 22, check=_dtype_check(_RANDOM_OUT))
def random_normal_like(ctx, x, *, dtype, mean, scale, seed):
    dt = _out_dtype(dtype, x)
    if dt.kind != "f" and dt != _ELEM.get(16):
        raise ValueError(f"RandomNormalLike cannot produce {dt} (give a float dtype attribute)")
    y = _state(seed).normal(mean, scale, size=check_alloc(ctx, "RandomNormalLike", x.shape, _DRAW))
    return np.asarray(y).astype(dt)


@kernel("Bernoulli", 15, 22, check=_dtype_check(_BERNOULLI_OUT), dtypes=_FLOAT_IN)
def bernoulli(ctx, x, *, dtype, seed):
    dt = _out_dtype(dtype, x)
    check_alloc(ctx, "Bernoulli", x.shape, _DRAW)
    p = np.asarray(x, dtype=np.float64)
    if p.size and (np.isnan(p).any() or p.min() < 0.0 or p.max() > 1.0):
        raise ValueError("Bernoulli probabilities must lie in [0, 1]")
    y = _state(seed).binomial(1, p=p, size=p.shape)
    return np.asarray(y).astype(dt)


@kernel("Multinomial", 7, 22, check=_dtype_check({6, 7}), dtypes=_FLOAT_IN)
def multinomial(ctx, x, *, dtype, sample_size, seed):
    if x.ndim != 2:
        raise ValueError(f"Multinomial input must be [batch_size, class_size], got shape {x.shape}")
    B, C = x.shape
    S = int(sample_size)
    check_alloc(ctx, "Multinomial", (B, S), _DRAW)  # sample_size sets the output's width
    dt = np.dtype(_ELEM[dtype])
    if B == 0 or S == 0:
        return np.zeros((B, S), dtype=dt)
    logits = np.asarray(x, dtype=np.float64)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    cdf = np.cumsum(e, axis=1)
    cdf /= cdf[:, -1:]
    u = _state(seed).rand(B, S)
    # one searchsorted over rows laid end to end (row r's cdf shifted by r)
    off = np.arange(B, dtype=np.float64)[:, None]
    idx = np.searchsorted((cdf + off).reshape(-1), (u + off).reshape(-1), side="right").reshape(B, S)
    idx = np.minimum(idx - (np.arange(B) * C)[:, None], C - 1)
    return idx.astype(dt)
