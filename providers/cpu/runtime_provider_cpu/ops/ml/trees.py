"""CPU kernels: the ``ai.onnx.ml`` tree ensembles (TreeEnsembleRegressor, TreeEnsembleClassifier,
TreeEnsemble); the forest they compile lives in :mod:`.forest`."""

from __future__ import annotations

import numpy as np

from ...executable import binds
from ...registry import kernel
from ._common import ML, _F32, _F64, _as_2d, _binary_expand, _check_post, _labels_array, _probit, _transform_rows
from .forest import _AGGREGATES, _V5_AGG, _Forest, _forest_v3, _forest_v5


def _float_or_tensor(attrs, name):
    t = attrs.get(f"{name}_as_tensor")
    if t is not None:
        return np.asarray(t).reshape(-1)
    v = attrs.get(name)
    return np.asarray(v if v is not None else [], dtype=np.float32)


def _tree_input(X: np.ndarray, F: _Forest, op: str) -> np.ndarray:
    X = _as_2d(X, op)
    if X.dtype.kind in "iu":
        X = X.astype(F.thr_dtype)  # integers compare as the threshold type
    elif X.dtype == np.float16:
        X = X.astype(_F32)
    if F.max_feature >= X.shape[1]:
        raise ValueError(f"{op}: a tree reads feature {F.max_feature} but the input has "
                         f"{X.shape[1]} features")
    return X


def _regression_finalize(score, has, F: _Forest, base, post: str, n_trees: int, out_dtype):
    """TreeAggregator{Sum,Average,Min,Max}.FinalizeScores(1)."""
    k = F.n_targets
    acc = F.thr_dtype.type
    base = np.asarray(base, dtype=F.thr_dtype)
    if k == 1:
        origin = base[0] if base.size == 1 else acc(0)
        s = score[:, 0]
        if F.agg == "SUM":
            s = s + origin
        elif F.agg == "AVERAGE":
            s = s / acc(n_trees) + origin
        else:
            s = s + origin if has is None else np.where(has[:, 0], s + origin, origin)
        if post == "PROBIT":
            s = _probit(s.astype(_F32))
        return s.astype(out_dtype).reshape(-1, 1)
    use_base = base.size == k
    if F.agg == "SUM":
        s = score + base if use_base else score
    elif F.agg == "AVERAGE":
        s = score / acc(n_trees)
        if use_base:
            s = s + base
    else:
        s = score + base if use_base else score
    # a target no leaf wrote is 0, base value or not (onnxruntime writes has_score ? score : 0)
    if has is not None:
        s = np.where(has, s, acc(0))
    if post == "NONE":
        return s.astype(out_dtype)
    return _transform_rows(s.astype(_F32), post).astype(out_dtype)


def _regressor_forest(ctx, attrs, x_dtype):
    F = ctx.cache.get("forest")
    if F is None:
        n_targets = attrs.get("n_targets")
        if not n_targets or n_targets <= 0:
            raise ValueError("n_targets must be a positive integer")
        agg = attrs.get("aggregate_function") or "SUM"
        if agg not in _AGGREGATES:
            raise ValueError(f"unknown aggregate_function {agg!r}")
        F = _forest_v3(attrs, "target", n_targets, agg, x_dtype)
        ctx.cache["forest"] = F
    return F


def _check_tree_regressor(node):
    a = node.attrs
    why = _check_post()(node)
    if why:
        return why
    if a.get("aggregate_function") not in (None, *_AGGREGATES):
        return f"aggregate_function={a.get('aggregate_function')!r} is not supported"
    return None


@kernel("TreeEnsembleRegressor", 1, 3, 5, domain=ML, check=_check_tree_regressor,
        dtypes={"float32", "float64", "int64", "int32"})
@binds
def tree_ensemble_regressor(ctx, X, **attrs):
    if ctx.cache.get("reg") is None:
        F = _regressor_forest(ctx, attrs, X.dtype)
        ctx.cache["reg"] = (F, _float_or_tensor(attrs, "base_values"), attrs.get("post_transform") or "NONE")
        ctx.cache["bound"] = _regress  # the attributes live in the cache: later runs skip them
    return _regress(ctx, X)


def _regress(ctx, X):
    F, base, post = ctx.cache["reg"]
    Xc = _tree_input(X, F, "TreeEnsembleRegressor")
    score, has = F.scores(Xc, ctx.threads)
    return _regression_finalize(score, has, F, base, post, F.n_trees, _F32)


def _check_tree_classifier(node):
    a = node.attrs
    why = _check_post()(node)
    if why:
        return why
    if not a.get("classlabels_strings") and not a.get("classlabels_int64s"):
        return "TreeEnsembleClassifier needs classlabels_strings or classlabels_int64s"
    return None


@kernel("TreeEnsembleClassifier", 1, 3, 5, domain=ML, check=_check_tree_classifier,
        dtypes={"float32", "float64", "int64", "int32"})
@binds
def tree_ensemble_classifier(ctx, X, **attrs):
    st = ctx.cache.get("clf")
    if st is None:
        strings = attrs.get("classlabels_strings") or []
        ints = attrs.get("classlabels_int64s") or []
        use_strings = bool(strings)
        labels = _labels_array(strings if use_strings else ints, use_strings)
        k = len(labels)
        F = _forest_v3(attrs, "class", k, "SUM", X.dtype)
        cw = _float_or_tensor(attrs, "class_weights")
        cids = attrs.get("class_ids") or []
        binary_case = k == 2 and len(set(cids)) == 1
        all_positive = not (cw < 0).any()
        base = _float_or_tensor(attrs, "base_values").astype(F.thr_dtype)
        ctx.cache["clf"] = (F, labels, use_strings, binary_case, all_positive, base,
                            attrs.get("post_transform") or "NONE")
        ctx.cache["bound"] = _classify  # the attributes live in the cache: later runs skip them
    return _classify(ctx, X)


def _classify(ctx, X):
    F, labels, use_strings, binary_case, all_positive, base, post = ctx.cache["clf"]
    Xc = _tree_input(X, F, "TreeEnsembleClassifier")
    score, has = F.scores(Xc, ctx.threads)
    n = score.shape[0]
    k = F.n_targets
    acc = F.thr_dtype.type
    if k > 2:
        nb = min(base.size, k)
        if nb:
            score[:, :nb] += base[:nb]
            if has is not None:
                has[:, :nb] = True
        if has is None:  # every class scored (a random forest): no masks to build
            Y = labels.take(score.argmax(axis=1))
            z = score.astype(_F32, copy=False)
        else:
            masked = np.where(has, score, -np.inf)
            Y = labels.take(np.argmax(masked, axis=1))
            z = np.where(has, score, acc(0)).astype(_F32)
        Z = z if post == "NONE" else _transform_rows(z, post)
        return Y, Z
    if has is None:
        has = np.ones((n, k), dtype=bool)
    if k == 2:
        s0, s1 = score[:, 0].copy(), score[:, 1].copy()
        h0, h1 = has[:, 0].copy(), has[:, 1].copy()
        wa = np.full(n, -1, dtype=np.int64)
        if base.size == 2:
            s1 = np.where(h1, base[1] + s0, s1 + base[1])
            s0 = np.where(h1, -s1, s0 + base[0])
            two = np.ones(n, dtype=bool)
        elif base.size == 1:
            s0 = s0 + base[0]
            two = h1.copy()
        elif base.size == 0:
            wa[:] = 3
            two = h1.copy()
        else:
            two = np.ones(n, dtype=bool)
        pos_weight = np.where(two & h1, s1, np.where(h0, s0, acc(0)))
        if binary_case:
            if all_positive:
                positive = pos_weight > 0.5
                wa = np.where(positive, 0, 1)
            else:
                positive = pos_weight > 0
                wa = np.where(positive, 2, 3)
            Y = labels[positive.astype(np.intp)]
        else:
            positive = pos_weight > 0
            if use_strings:
                Y = labels[positive.astype(np.intp)]
            else:  # onnxruntime returns the raw 1/0 here, not a class label
                Y = positive.astype(np.int64)
        v0 = np.where(h0, s0, acc(0)).astype(_F32)
        v1 = np.where(h1, s1, acc(0)).astype(_F32)
        Z = np.empty((n, 2), dtype=_F32)
        if two.any():
            z2 = np.stack([v0[two], v1[two]], axis=1)
            Z[two] = z2 if post == "NONE" else _transform_rows(z2, post)
        one = ~two
        if one.any():
            Z[one] = _binary_expand(v0[one], post, wa[one])
        return Y, Z
    # a single class: TreeAggregatorClassifier.FinalizeScores1
    s = score[:, 0]
    if base.size >= 1:
        s = s + (base[1] if base.size == 2 else base[0])
    positive = s > 0
    Y = labels[np.minimum(positive.astype(np.intp), len(labels) - 1)] if use_strings else positive.astype(np.int64)
    z = s.astype(_F32)
    if post == "PROBIT":
        z = _probit(z)
    return Y, z.reshape(-1, 1)
_V5_POST = {0: "NONE", 1: "SOFTMAX", 2: "LOGISTIC", 3: "SOFTMAX_ZERO", 4: "PROBIT"}


def _check_tree_v5(node):
    a = node.attrs
    if a.get("aggregate_function") not in _V5_AGG:
        return f"aggregate_function={a.get('aggregate_function')!r} is not in 0..3"
    if a.get("post_transform") not in _V5_POST:
        return f"post_transform={a.get('post_transform')!r} is not in 0..4"
    return None


@kernel("TreeEnsemble", 5, domain=ML, check=_check_tree_v5, dtypes={"float32", "float64", "float16"})
def tree_ensemble(ctx, X, **attrs):
    F = ctx.cache.get("forest")
    if F is None:
        thr_dtype = _F64 if X.dtype == _F64 else _F32
        F = _forest_v5(attrs, thr_dtype)
        ctx.cache["forest"] = F
    Xc = _tree_input(X, F, "TreeEnsemble")
    score, has = F.scores(Xc, ctx.threads)
    post = _V5_POST[attrs["post_transform"]]
    return _regression_finalize(score, has, F, [], post, F.n_trees, X.dtype)
