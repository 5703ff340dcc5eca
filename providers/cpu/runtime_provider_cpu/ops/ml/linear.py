"""CPU kernels: the ``ai.onnx.ml`` linear models and support vector machines."""

from __future__ import annotations

import numpy as np

from ...registry import kernel
from ._common import (
    ML, _F32, _F64, _as_2d, _binary_expand, _check_post, _labels_array, _logistic, _probit, _strings_out, _to_f32,
    _transform_rows,
)
from .._common import ignore_fp


def _batched_update(scores: np.ndarray, post: str, add_second_class: int) -> np.ndarray:
    """onnxruntime ``batched_update_scores_inplace`` on ``(N, K)`` float32 scores."""
    k = scores.shape[1]
    if k > 1:
        return _transform_rows(scores, post)
    if post == "PROBIT":
        p = _probit(scores[:, 0])
        if add_second_class >= 0:
            out = np.zeros((scores.shape[0], 2), _F32)
            out[:, 0] = p
            return out
        return p.reshape(-1, 1)
    if add_second_class >= 0:
        return _binary_expand(scores[:, 0], post, add_second_class)
    return scores


@kernel("LinearClassifier", 1, domain=ML, check=_check_post(),
        dtypes={"float32", "float64", "int64", "int32"})
def linear_classifier(ctx, X, *, coefficients, intercepts, post_transform, classlabels_ints,
                      classlabels_strings, multi_class):
    X2 = _to_f32(_as_2d(X, "LinearClassifier"))
    n, f = X2.shape
    st = ctx.cache.get("lin")
    if st is None:
        coef = np.asarray(coefficients, dtype=_F32)
        inter = np.asarray(intercepts or [], dtype=_F32)
        k = inter.size if inter.size else (coef.size // f if f else 0)
        if inter.size == 0:
            inter = np.zeros(k, _F32)
        if k == 0 or coef.size != k * f:
            raise ValueError(f"LinearClassifier: {coef.size} coefficients do not fit {k} classes "
                             f"x {f} features")
        st = (np.ascontiguousarray(coef.reshape(k, f).T), inter, k)
        ctx.cache["lin"] = st
    coefT, inter, k = st
    if coefT.shape[0] != f:
        raise ValueError(f"LinearClassifier: input has {f} features, the model {coefT.shape[0]}")
    scores = (X2 @ coefT + inter).astype(_F32, copy=False)
    use_strings = bool(classlabels_strings)
    labels = list(classlabels_strings) if use_strings else list(classlabels_ints or [])
    if k == 1:
        two = len(labels) == 2
        pos = labels[1] if two else ("1" if use_strings else 1)
        neg = labels[0] if two else ("0" if use_strings else 0)
        positive = scores[:, 0] > 0
        if use_strings:
            Y = _strings_out([pos if p else neg for p in positive.tolist()])
        else:
            Y = np.where(positive, np.int64(pos), np.int64(neg)).astype(np.int64)
        add = two
    else:
        maxclass = np.argmax(scores, axis=1)
        if len(labels) < k:
            raise ValueError(f"LinearClassifier: {k} classes but {len(labels)} class labels")
        Y = _labels_array(labels, use_strings)[maxclass]
        add = False
    if post_transform != "NONE" or add:
        Z = _batched_update(scores, post_transform, 1 if add else -1)
    else:
        Z = scores
    return Y, Z


@kernel("LinearRegressor", 1, domain=ML, check=_check_post(),
        dtypes={"float32", "float64", "int64", "int32"})
def linear_regressor(ctx, X, *, coefficients, intercepts, targets, post_transform):
    X2 = _to_f32(_as_2d(X, "LinearRegressor"))
    n, f = X2.shape
    coef = np.asarray(coefficients or [], dtype=_F32)
    t = int(targets)
    if coef.size != t * f:
        raise ValueError(f"LinearRegressor: {coef.size} coefficients do not fit {t} targets x {f} features")
    Y = X2 @ coef.reshape(t, f).T
    inter = intercepts or []
    if len(inter) == t:
        Y = Y + np.asarray(inter, dtype=_F32)
    Y = Y.astype(_F32, copy=False)
    if post_transform != "NONE":
        Y = _batched_update(Y, post_transform, -1)
    return Y


# ---------------------------------------------------------------------------
# SVM
# ---------------------------------------------------------------------------


def _svm_kernel(X: np.ndarray, SV: np.ndarray, ktype: str, params) -> np.ndarray:
    gamma = _F32(params[0]) if params else _F32(0)
    coef0 = _F32(params[1]) if params and len(params) > 1 else _F32(0)
    degree = _F32(params[2]) if params and len(params) > 2 else _F32(0)
    if ktype == "RBF":
        x64 = X.astype(_F64)
        s64 = SV.astype(_F64)
        d = (x64 * x64).sum(1)[:, None] + (s64 * s64).sum(1)[None, :] - 2.0 * (x64 @ s64.T)
        d = np.maximum(d, 0.0)
        return np.exp(-_F64(gamma) * d).astype(_F32)
    dot = (X @ SV.T).astype(_F32, copy=False)
    if ktype == "LINEAR":
        return dot
    k = gamma * dot + coef0
    if ktype == "POLY":
        if degree == 2:
            return k * k
        if degree == 3:
            return k * k * k
        return np.power(k, degree).astype(_F32)
    return np.tanh(k).astype(_F32)


def _check_svm(node):
    why = _check_post()(node)
    if why:
        return why
    kt = node.attrs.get("kernel_type")
    if kt not in (None, "LINEAR", "POLY", "RBF", "SIGMOID"):
        return f"kernel_type={kt!r} is not LINEAR, POLY, RBF or SIGMOID"
    return None


def _multiclass_probability(P: np.ndarray) -> np.ndarray:
    """Pairwise coupling (libsvm / onnxruntime ``multiclass_probability``), all rows at once."""
    n, k, _ = P.shape
    P = P.astype(_F32)
    Q = np.zeros((n, k, k), _F32)
    for i in range(k):
        for j in range(k):
            if j != i:
                Q[:, i, i] += P[:, j, i] * P[:, j, i]
                Q[:, i, j] = -P[:, j, i] * P[:, i, j]
    p = np.full((n, k), _F32(1) / _F32(k), _F32)
    eps = _F32(0.005) / _F32(k)
    active = np.ones(n, dtype=bool)
    with ignore_fp(divide="ignore", invalid="ignore", over="ignore"):
        for _ in range(100):
            Qa = Q[active]
            pa = p[active]
            Qp = np.einsum("nij,nj->ni", Qa, pa).astype(_F32)
            pQp = (pa * Qp).sum(1).astype(_F32)
            err = np.abs(Qp - pQp[:, None]).max(1)
            done = err < eps
            idx = np.flatnonzero(active)
            active[idx[done]] = False
            if not active.any():
                break
            keep = ~done
            Qa, pa, Qp, pQp = Qa[keep], pa[keep], Qp[keep], pQp[keep]
            for i in range(k):
                qii = Qa[:, i, i]
                diff = ((-Qp[:, i] + pQp) / qii).astype(_F32)
                pa[:, i] += diff
                one = _F32(1) + diff
                pQp = ((pQp + diff * (diff * qii + _F32(2) * Qp[:, i])) / one / one).astype(_F32)
                Qp = ((Qp + diff[:, None] * Qa[:, i, :]) / one[:, None]).astype(_F32)
                pa = (pa / one[:, None]).astype(_F32)
            p[idx[keep]] = pa
    return p


@kernel("SVMClassifier", 1, domain=ML, check=_check_svm, dtypes={"float32", "float64", "int64", "int32"})
def svm_classifier(ctx, X, *, classlabels_ints, classlabels_strings, coefficients, kernel_params,
                   kernel_type, post_transform, prob_a, prob_b, rho, support_vectors, vectors_per_class):
    X2 = _to_f32(_as_2d(X, "SVMClassifier"))
    n, f = X2.shape
    use_strings = bool(classlabels_strings)
    labels = list(classlabels_strings) if use_strings else list(classlabels_ints or [])
    k = len(labels) if labels else 1
    coef = np.asarray(coefficients or [], dtype=_F32)
    rho_a = np.asarray(rho or [0.0], dtype=_F32)
    vpc = [int(v) for v in (vectors_per_class or [])]
    nv = sum(vpc)
    have_proba = bool(prob_a)
    n_clf = k * (k - 1) // 2
    votes = None
    if nv > 0:  # SVC
        sv = np.asarray(support_vectors or [], dtype=_F32)
        fc = sv.size // nv
        if fc != f:
            raise ValueError(f"SVMClassifier: input has {f} features, the support vectors {fc}")
        kern = _svm_kernel(X2, sv.reshape(nv, fc), kernel_type, kernel_params)
        C = coef.reshape(-1, nv)
        starts = np.cumsum([0] + vpc)
        clf = np.zeros((n, max(n_clf, 0)), _F32)
        votes = np.zeros((n, k), dtype=np.int64)
        c = 0
        for i in range(k - 1):
            si = slice(starts[i], starts[i + 1])
            for j in range(i + 1, k):
                sj = slice(starts[j], starts[j + 1])
                s = ((kern[:, si] * C[j - 1, si]).astype(_F64).sum(1)
                     + (kern[:, sj] * C[i, sj]).astype(_F64).sum(1) + _F64(rho_a[c]))
                clf[:, c] = s.astype(_F32)
                win_i = s > 0
                votes[:, i] += win_i
                votes[:, j] += ~win_i
                c += 1
        if have_proba:
            pa = np.asarray(prob_a, dtype=_F32)
            pb = np.asarray(prob_b or [], dtype=_F32)
            P = np.zeros((n, k, k), _F32)
            c = 0
            for i in range(k - 1):
                for j in range(i + 1, k):
                    val1 = _F32(1) - _logistic(clf[:, c] * pa[c] + pb[c])
                    val2 = np.minimum(np.maximum(val1, _F32(1e-7)), _F32(1) - _F32(1e-7))
                    P[:, i, j] = val2
                    P[:, j, i] = _F32(1) - val2
                    c += 1
            scores = _multiclass_probability(P)
        else:
            scores = clf
        maxclass = np.argmax(votes, axis=1)
        max_weight = np.zeros(n, _F32)
    else:  # linear
        if coef.size % k:
            raise ValueError("SVMClassifier: coefficients do not fit the classes")
        fc = coef.size // k
        if fc != f:
            raise ValueError(f"SVMClassifier: input has {f} features, the model {fc}")
        scores = (X2 @ coef.reshape(k, fc).T + rho_a[0]).astype(_F32)
        maxclass = np.argmax(scores, axis=1)
        max_weight = scores[np.arange(n), maxclass]
    lab = _labels_array(labels, use_strings) if labels else np.zeros(1, np.int64)
    if n_clf == 1:
        if not have_proba:
            all_pos = bool((coef >= 0).all())
            if all_pos:
                pick1 = max_weight >= 0.5
            else:
                pick1 = max_weight > 0
            idx = np.where(pick1, 1, maxclass)
        else:
            idx = maxclass
        Y = lab[idx]
    else:
        Y = lab[np.minimum(maxclass, lab.size - 1)]
    # scores
    if nv > 0 and not have_proba and k <= 2:
        wa = 2 if post_transform == "NONE" else 0
        Z = _batched_update(scores[:, :1], post_transform, wa)
    elif post_transform == "NONE":
        Z = scores.astype(_F32, copy=False)
    else:
        Z = _batched_update(scores.astype(_F32, copy=False), post_transform, -1)
    return Y, Z


@kernel("SVMRegressor", 1, domain=ML, check=_check_svm, dtypes={"float32", "float64", "int64", "int32"})
def svm_regressor(ctx, X, *, coefficients, kernel_params, kernel_type, n_supports, one_class,
                  post_transform, rho, support_vectors):
    X2 = _to_f32(_as_2d(X, "SVMRegressor"))
    n, f = X2.shape
    coef = np.asarray(coefficients or [], dtype=_F32)
    rho0 = _F32(rho[0]) if rho else _F32(0)
    nv = int(n_supports or 0)
    if nv > 0:
        sv = np.asarray(support_vectors or [], dtype=_F32)
        fc = sv.size // nv
        if fc != f:
            raise ValueError(f"SVMRegressor: input has {f} features, the support vectors {fc}")
        kern = _svm_kernel(X2, sv.reshape(nv, fc), kernel_type, kernel_params)
        y = kern @ coef[:nv] + rho0
    else:
        if coef.size != f:
            raise ValueError(f"SVMRegressor: input has {f} features, the model {coef.size}")
        y = X2 @ coef + rho0
    y = y.astype(_F32, copy=False)
    if one_class:
        y = np.where(y > 0, _F32(1), _F32(-1))
    return y.reshape(-1, 1)
