"""CPU kernels: ``ai.onnx.ml`` preprocessing (Scaler, Normalizer, Binarizer, Imputer,
ArrayFeatureExtractor, OneHotEncoder, FeatureVectorizer)."""

from __future__ import annotations

import numpy as np

from ...registry import kernel
from ._common import ML, _F32, _F64, _to_f32
from .._common import ignore_fp


@kernel("Scaler", 1, domain=ML, dtypes={"float32", "float64", "int64", "int32"})
def scaler(ctx, X, *, offset, scale):
    if X.ndim == 0:
        raise ValueError("Scaler: input has no dimensions")
    stride = X.shape[0] if X.ndim == 1 else X.shape[1]
    sc = np.asarray(scale or [], dtype=_F32)
    off = np.asarray(offset if offset is not None else [0.0] * max(sc.size, 1), dtype=_F32)
    if sc.size == 0:
        raise ValueError("Scaler: scale is empty")
    xs = X.astype(_F64) if X.dtype == _F64 else _to_f32(X)
    if sc.size == stride and off.size == stride:
        flat = xs.reshape(-1)
        cols = np.arange(flat.size) % stride if X.ndim > 2 else None
        if cols is None:
            shape = (1,) * (X.ndim - 1) + (stride,)
            y = (xs - off.astype(xs.dtype).reshape(shape)) * sc.astype(xs.dtype).reshape(shape)
        else:
            y = ((flat - off.astype(xs.dtype)[cols]) * sc.astype(xs.dtype)[cols]).reshape(X.shape)
    elif sc.size == 1 and off.size == 1:
        y = (xs - off.astype(xs.dtype)[0]) * sc.astype(xs.dtype)[0]
    else:
        raise ValueError(f"Scaler: scale and offset must both have size {stride} or 1 "
                         f"(got {sc.size} and {off.size})")
    return np.asarray(y).astype(_F32, copy=False)


@kernel("Normalizer", 1, domain=ML, dtypes={"float32", "float64", "int64", "int32"})
def normalizer(ctx, X, *, norm):
    if norm not in ("MAX", "L1", "L2"):
        raise ValueError(f"Normalizer: norm={norm!r} is not MAX, L1 or L2")
    if X.ndim == 0:
        raise ValueError("Normalizer: input has no dimensions")
    axis = 0 if X.ndim == 1 else 1
    xf = _to_f32(X)
    if norm == "MAX":
        d = xf.max(axis=axis, keepdims=True)
        with ignore_fp(divide="ignore", invalid="ignore"):
            return np.where(d != 0, xf / np.where(d != 0, d, 1), xf).astype(_F32, copy=False)
    if norm == "L1":
        d = np.abs(X).astype(_F32).sum(axis=axis, keepdims=True, dtype=_F32)
        with ignore_fp(divide="ignore", invalid="ignore"):
            return np.where(d != 0, xf / np.where(d != 0, d, 1), xf).astype(_F32, copy=False)
    sq = (X * X).astype(_F32)
    d = sq.sum(axis=axis, keepdims=True, dtype=_F32)
    with ignore_fp(divide="ignore", invalid="ignore"):
        r = np.sqrt(sq / np.where(d != 0, d, 1))
        r = np.where(X < 0, -r, r)
        return np.where(d != 0, r, xf).astype(_F32, copy=False)


@kernel("Binarizer", 1, domain=ML, dtypes={"float32", "float64", "int64", "int32"})
def binarizer(ctx, X, *, threshold):
    return (X > threshold).astype(X.dtype)


@kernel("Imputer", 1, domain=ML, dtypes={"float32", "float64", "int64", "int32"})
def imputer(ctx, X, *, imputed_value_floats, imputed_value_int64s, replaced_value_float,
            replaced_value_int64):
    if X.ndim == 0:
        raise ValueError("Imputer: input has no dimensions")
    if X.dtype.kind == "f":
        vals, rep = imputed_value_floats, replaced_value_float
    else:
        vals, rep = imputed_value_int64s, replaced_value_int64
    if not vals:
        raise ValueError("Imputer: no imputed values for this input type")
    imp = np.asarray(vals).astype(X.dtype)
    stride = X.shape[0] if X.ndim == 1 else X.shape[1]
    rep_x = np.asarray(rep).astype(X.dtype) if X.dtype.kind != "f" else X.dtype.type(rep)
    if X.dtype.kind == "f":
        hit = (X == rep_x) | (np.isnan(X) & bool(np.isnan(rep)))
    else:
        hit = X == rep_x
    if imp.size == stride and X.ndim <= 2:
        fill = np.broadcast_to(imp, X.shape) if X.ndim == 1 else np.broadcast_to(imp[None, :], X.shape)
    elif imp.size == stride:
        fill = imp[np.arange(X.size) % stride].reshape(X.shape)
    else:
        fill = imp[0]
    return np.where(hit, fill, X).astype(X.dtype, copy=False)


@kernel("ArrayFeatureExtractor", 1, domain=ML,
        dtypes={"float32", "float64", "int64", "int32", "object"})
def array_feature_extractor(ctx, X, Y):
    if X.ndim == 0:
        raise ValueError("ArrayFeatureExtractor: X has no dimensions")
    idx = np.asarray(Y, dtype=np.int64).reshape(-1)
    if idx.size == 0:
        raise ValueError("ArrayFeatureExtractor: no indices")
    stride = X.shape[-1]
    if (idx >= stride).any() or (idx < 0).any():
        bad = idx[(idx >= stride) | (idx < 0)][0]
        raise ValueError(f"ArrayFeatureExtractor: index {int(bad)} is out of range [0, {stride})")
    Z = np.take(X, idx, axis=-1)
    if X.ndim == 1:
        Z = Z.reshape(1, -1)
    return Z


@kernel("OneHotEncoder", 1, domain=ML, dtypes={"float32", "float64", "int64", "int32", "object"})
def one_hot_encoder(ctx, X, *, cats_int64s, cats_strings, zeros):
    st = ctx.cache.get("ohe")
    if st is None:
        if cats_int64s and cats_strings:
            raise ValueError("OneHotEncoder: give cats_int64s or cats_strings, not both")
        if cats_strings:
            d = {}
            for i, c in enumerate(cats_strings):
                d[c] = i  # the last occurrence wins (onnxruntime)
            st = ("s", d, len(cats_strings))
        elif cats_int64s:
            cats = np.asarray(cats_int64s, dtype=np.int64)
            rev = cats[::-1]
            u, first_rev = np.unique(rev, return_index=True)
            pos = (cats.size - 1 - first_rev).astype(np.int64)  # last occurrence
            st = ("i", (u, pos), cats.size)
        else:
            raise ValueError("OneHotEncoder: no categories")
        ctx.cache["ohe"] = st
    kind, table, ncat = st
    out = np.zeros(X.shape + (ncat,), dtype=_F32)
    flat_out = out.reshape(-1, ncat)
    if X.dtype == object:
        if kind == "s":
            pos = np.fromiter((table.get(v, -1) for v in X.reshape(-1).tolist()), dtype=np.int64,
                              count=X.size)
        else:
            pos = np.full(X.size, -1, dtype=np.int64)
    else:
        if kind == "i":
            u, p = table
            with ignore_fp(invalid="ignore"):
                xi = X.reshape(-1).astype(np.int64)
            j = np.searchsorted(u, xi)
            jc = np.minimum(j, u.size - 1)
            found = (j < u.size) & (u[jc] == xi)
            pos = np.where(found, p[jc], -1)
        else:
            pos = np.full(X.size, -1, dtype=np.int64)
    ok = pos >= 0
    if not zeros and not ok.all():
        raise ValueError("OneHotEncoder: unknown category and zeros = 0")
    rows = np.flatnonzero(ok)
    flat_out[rows, pos[ok]] = 1.0
    return out


@kernel("FeatureVectorizer", 1, domain=ML, dtypes={"float32", "float64", "int64", "int32"})
def feature_vectorizer(ctx, *inputs, inputdimensions):
    dims = [int(d) for d in (inputdimensions or [])]
    if len(dims) != len(inputs):
        raise ValueError(f"FeatureVectorizer: {len(inputs)} inputs but {len(dims)} inputdimensions")
    first = inputs[0]
    n = 1 if first.ndim <= 1 else first.shape[0]
    total = sum(dims)
    Y = np.zeros((n, total), dtype=_F32)
    off = 0
    for x, d in zip(inputs, dims):
        xn = 1 if x.ndim <= 1 else x.shape[0]
        x2 = x.reshape(xn, -1)
        w = min(x2.shape[1], d)
        r = min(xn, n)
        Y[:r, off:off + w] = x2[:r, :w]
        off += d
    return Y
