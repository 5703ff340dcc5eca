"""Shared by the ``ai.onnx.ml`` kernels: the domain name, onnxruntime's score transforms
(float32 arithmetic) and the input/label helpers every family uses."""

from __future__ import annotations

import math

import numpy as np
from .._common import ignore_fp


ML = "ai.onnx.ml"
_F32 = np.float32
_F64 = np.float64

# ---------------------------------------------------------------------------
# score transforms (onnxruntime ml_common.h, float32 arithmetic)
# ---------------------------------------------------------------------------

_TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT")


def _logistic(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, _F32)
    with ignore_fp(over="ignore"):
        v = _F32(1) / (_F32(1) + np.exp(-np.abs(x)))
    return np.where(x < 0, _F32(1) - v, v).astype(_F32, copy=False)


_ERF_A = _F32(2) / (_F32(math.pi) * _F32(0.147))
_ERF_B = _F32(1) / _F32(0.147)
_SQRT2 = _F32(math.sqrt(2.0))


def _erfinv(x: np.ndarray) -> np.ndarray:
    """onnxruntime's ErfInv approximation (Winitzki), in float32."""
    x = np.asarray(x, _F32)
    sgn = np.where(x < 0, _F32(-1), _F32(1)).astype(_F32)
    y = (_F32(1) - x) * (_F32(1) + x)
    with ignore_fp(divide="ignore", invalid="ignore"):
        lg = np.log(y)
        v = _ERF_A + _F32(0.5) * lg
        v2 = _ERF_B * lg
        v3 = -v + np.sqrt(v * v - v2)
        return (sgn * np.sqrt(v3)).astype(_F32, copy=False)


def _probit(x: np.ndarray) -> np.ndarray:
    return (_SQRT2 * _erfinv(_F32(2) * np.asarray(x, _F32) - _F32(1))).astype(_F32, copy=False)


def _softmax(s: np.ndarray) -> np.ndarray:
    s = np.asarray(s, _F32)
    m = s.max(axis=1, keepdims=True)
    with ignore_fp(over="ignore", invalid="ignore"):
        e = np.exp(s - m)
        return (e / e.sum(axis=1, keepdims=True)).astype(_F32, copy=False)


def _softmax_zero(s: np.ndarray) -> np.ndarray:
    s = np.asarray(s, _F32)
    m = np.maximum(s.max(axis=1, keepdims=True), -np.finfo(_F32).max)
    nz = (s > _F32(1e-7)) | (s < _F32(-1e-7))
    with ignore_fp(over="ignore", invalid="ignore", divide="ignore"):
        e = np.where(nz, np.exp(s - m), s * np.exp(-m))
        tot = np.where(nz, e, _F32(0)).sum(axis=1, keepdims=True)
        return (e / tot).astype(_F32, copy=False)


def _transform_rows(s: np.ndarray, post: str) -> np.ndarray:
    """The post transform of a score row with two or more values (float32 out)."""
    s = np.asarray(s, _F32)
    if post == "LOGISTIC":
        return _logistic(s)
    if post == "SOFTMAX":
        return _softmax(s)
    if post == "SOFTMAX_ZERO":
        return _softmax_zero(s)
    if post == "PROBIT":
        return _probit(s)
    return s


def _binary_expand(s: np.ndarray, post: str, add_second_class) -> np.ndarray:
    """One score per row expanded to two columns (onnxruntime ``write_scores``).

    ``add_second_class``: 0/1 -> ``[1 - s, s]``; 2/3 -> ``[-s, s]``; LOGISTIC with
    0..3 -> ``[logistic(-s), logistic(s)]``; -1 -> ``[s, 0]``; PROBIT ->
    ``[probit(s), 0]`` (onnxruntime leaves the second value uninitialised).
    ``add_second_class`` may be an array (one code per row).
    """
    s = np.asarray(s, _F32).reshape(-1)
    out = np.zeros((s.shape[0], 2), _F32)
    if post == "PROBIT":
        out[:, 0] = _probit(s)
        return out
    a = np.broadcast_to(np.asarray(add_second_class), s.shape)
    c01 = (a == 0) | (a == 1)
    c23 = (a == 2) | (a == 3)
    cm1 = ~(c01 | c23)
    if post == "LOGISTIC":
        neg, pos = _logistic(-s), _logistic(s)
    else:
        neg, pos = -s, s
    if post == "LOGISTIC":  # onnxruntime >= 1.2x applies the logistic for 0/1 too
        out[:, 0] = np.where(c01 | c23, neg, s)
        out[:, 1] = np.where(c01 | c23, pos, _F32(0))
    else:
        out[:, 0] = np.where(c01, _F32(1) - s, np.where(c23, neg, s))
        out[:, 1] = np.where(c01, s, np.where(c23, pos, _F32(0)))
    out[cm1, 1] = 0
    return out


def _as_2d(x: np.ndarray, op: str) -> np.ndarray:
    if x.ndim == 0:
        raise ValueError(f"{op}: input must have at least one dimension")
    if x.ndim == 1:
        return x.reshape(1, -1)
    if x.ndim > 2:
        raise ValueError(f"{op}: input must be 1D or 2D, got shape {x.shape}")
    return x


def _to_f32(x: np.ndarray) -> np.ndarray:
    return x if x.dtype == _F32 else x.astype(_F32)


def _labels_array(values, strings: bool) -> np.ndarray:
    if strings:
        arr = np.empty(len(values), dtype=object)
        arr[:] = list(values)
        return arr
    return np.asarray(values, dtype=np.int64)


def _strings_out(values) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def _check_post(name="post_transform"):
    def check(node):
        v = node.attrs.get(name)
        if v is not None and v not in _TRANSFORMS:
            return f"{name}={v!r} is not one of {', '.join(_TRANSFORMS)}"
        return None
    return check
