"""CPU kernels: losses (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss).

Both ops share one gather: the loss of element (n, d1..dk) is ``-input[n, target[n, d..], d..]``
times the weight of its class (1 without weights); targets equal to ``ignore_index`` weigh 0.
``mean`` divides the weighted sum by the sum of the weights actually used (the spec's rule,
which is the plain mean when there are no weights and nothing is ignored).

float16 / bfloat16 are computed in float32 and cast back; float32 and float64 stay as they are.
"""

from __future__ import annotations

import numpy as np

from ..registry import kernel

_FLOAT = frozenset({"float16", "float32", "float64"})
_BF16 = frozenset({"bfloat16"})  # ml_dtypes.bfloat16, computed in float32
_REDUCTIONS = ("none", "sum", "mean")


def _cdtype(dt) -> np.dtype:
    return np.dtype(np.float64) if np.dtype(dt) == np.float64 else np.dtype(np.float32)


def _loss_check(node):
    red = node.attrs.get("reduction")
    red = "mean" if red is None else red
    if red not in _REDUCTIONS:
        return f"{node.op_type}: reduction {red!r} is not one of none, sum, mean"
    info = node.input_info[0] if node.input_info else None
    if info is not None and info.shape is not None and len(info.shape) < 2:
        return f"{node.op_type}: input must have rank >= 2 (N, C, ...), got rank {len(info.shape)}"
    return None


def _nll(logp, target, weight, ignore_index, reduction, out_dtype):
    """``logp``: [N, C, *D] in the compute dtype; ``target``: [N, *D] integers."""
    if logp.ndim < 2:
        raise ValueError(f"loss input must have rank >= 2 (N, C, ...), got shape {logp.shape}")
    C = logp.shape[1]
    if target.shape != (logp.shape[0],) + logp.shape[2:]:
        raise ValueError(f"target shape {target.shape} does not match input shape {logp.shape} "
                         "(expected (N, d1, ..., dk))")
    t = target.astype(np.int64, copy=False)
    ignored = (t == ignore_index) if ignore_index is not None else np.zeros(t.shape, dtype=bool)
    bad = ~ignored & ((t < 0) | (t >= C))
    if bad.any():
        raise ValueError(f"target value {int(t[bad][0])} is out of range [0, {C})")
    ts = np.where(ignored, 0, t)
    picked = np.take_along_axis(logp, ts[:, None], axis=1)[:, 0]
    cd = logp.dtype
    if weight is not None:
        if weight.shape != (C,):
            raise ValueError(f"weight must have shape ({C},), got {weight.shape}")
        w = np.take(weight.astype(cd, copy=False), ts)
        w = np.where(ignored, cd.type(0), w)
    elif ignored.any():
        w = np.where(ignored, cd.type(0), cd.type(1))
    else:
        w = None
    loss = -picked if w is None else -picked * w
    if reduction == "none":
        return loss.astype(out_dtype, copy=False)
    s = loss.sum(dtype=cd)
    if reduction == "sum":
        return np.asarray(s).astype(out_dtype)
    den = cd.type(loss.size) if w is None else w.sum(dtype=cd)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(s / den).astype(out_dtype)


@kernel("NegativeLogLikelihoodLoss", 12, 13, 22, dtypes=_FLOAT | _BF16, check=_loss_check)
def negative_log_likelihood_loss(ctx, x, target, weight=None, *, ignore_index, reduction):
    cd = _cdtype(x.dtype)
    return _nll(x.astype(cd, copy=False), target, weight, ignore_index, reduction, x.dtype)


def _log_softmax1(x):
    m = np.max(x, axis=1, keepdims=True)
    e = x - m
    return e - np.log(np.sum(np.exp(e), axis=1, keepdims=True))


@kernel("SoftmaxCrossEntropyLoss", 12, 13, dtypes=_FLOAT | _BF16, check=_loss_check)
def softmax_cross_entropy_loss(ctx, scores, labels, weights=None, *, ignore_index, reduction):
    if scores.ndim < 2:
        raise ValueError(f"scores must have rank >= 2 (N, C, ...), got shape {scores.shape}")
    cd = _cdtype(scores.dtype)
    logp = _log_softmax1(scores.astype(cd, copy=False)) if scores.size else scores.astype(cd)
    loss = _nll(logp, labels, weights, ignore_index, reduction, scores.dtype)
    if ctx.n_outputs > 1:
        return loss, (logp.astype(scores.dtype, copy=False) if ctx.outputs_wanted[1] else None)
    return loss
