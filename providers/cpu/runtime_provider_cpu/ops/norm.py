"""CPU kernels: normalizations (BatchNormalization, InstanceNormalization, LayerNormalization,
GroupNormalization, LRN, LpNormalization, MeanVarianceNormalization).

Float16 work is done in float32 and cast back; float32 LayerNormalization rows run one
compiled pass (``_native.skip_layer_norm``) where the extension is built.
"""

from __future__ import annotations

import numpy as np

from ..executable import inplace_variant
from ..fast.policy import current
from ..registry import kernel
from ._common import ignore_fp, mean_last, normalize_axis
from ._nncommon import _BF16, _F32, _FLOAT, _as, _attr, _cdtype, _spatial_axes


def _bn_apply(x, scale, b, mean, var, epsilon, param_shape):
    dt = x.dtype
    cd = _cdtype(dt)
    inv = _as(scale, cd) / np.sqrt(_as(var, cd) + cd.type(epsilon))
    shift = _as(b, cd) - _as(mean, cd) * inv
    y = _as(x, cd) * inv.reshape(param_shape)
    y += shift.reshape(param_shape)
    return _as(y, dt)


def _bn_param_shape(x):
    return (x.shape[1],) + (1,) * (x.ndim - 2) if x.ndim >= 2 else (-1,)


def _bn_inference_only(node):
    if any(node.outputs[1:]):
        return ("BatchNormalization: the mean/var/saved_mean/saved_var outputs (training) "
                "are not implemented; only inference (output Y) is")
    return None


def _bn6_check(node):
    if any(node.outputs[1:]):
        return (f"BatchNormalization-{node.since_version}: the mean/var/saved_mean/saved_var outputs "
                "are not implemented: the opset does not define saved_var (Caffe2, where the op comes "
                "from, saved the inverse standard deviation) nor whether the running variance uses "
                "the biased or the unbiased batch variance; output Y alone is")
    return None


def _bn_legacy_shape(x, p, spatial, v):
    """Broadcast shape of a BatchNormalization-1/6 parameter: its schema says "1-dimensional of
    size C"; with spatial=0 a per-feature parameter of shape X.shape[1:] is accepted too."""
    C = x.shape[1]
    if p.ndim == 1 and p.shape[0] == C:
        return _bn_param_shape(x)
    if not spatial and p.shape == x.shape[1:]:
        return p.shape
    raise ValueError(f"BatchNormalization-{v}: parameter of shape {p.shape} does not fit X of shape "
                     f"{x.shape} (spatial={spatial})")


def _batchnorm_legacy(ctx, x, scale, b, mean, var, epsilon, is_test, spatial):
    # opsets 1 and 6. is_test=1: the given mean/var. is_test=0 (training; the default): Y is
    # normalised with the batch statistics (biased variance, as in the cited paper), taken over
    # N and the spatial axes when ``spatial`` is set, else over N alone (per feature)
    v = ctx.node.since_version
    shape = _bn_legacy_shape(x, scale, spatial, v)
    for t in (b, mean, var):
        if _bn_legacy_shape(x, t, spatial, v) != shape:
            raise ValueError(f"BatchNormalization-{v}: scale, B, mean and var must have one shape")
    if not is_test:
        cd = _cdtype(x.dtype)
        xc = _as(x, cd)
        axes = (0,) + _spatial_axes(x) if spatial else (0,)
        m = xc.mean(axis=axes, keepdims=True)
        d = xc - m
        vv = np.mean(d * d, axis=axes, keepdims=True)
        sc = _as(scale, cd).reshape(shape)
        y = d * (sc / np.sqrt(vv + cd.type(epsilon))) + _as(b, cd).reshape(shape)
        y = _as(y, x.dtype)
    else:
        y = _bn_apply(x, scale, b, mean, var, epsilon, shape)
    return (y,) + (None,) * (ctx.n_outputs - 1) if ctx.n_outputs > 1 else y


@kernel("BatchNormalization", 1, dtypes=_FLOAT, check=_bn6_check)
def batchnorm_1(ctx, x, scale, b, mean, var, *, consumed_inputs, epsilon, is_test, momentum, spatial):
    # consumed_inputs is a legacy in-place optimisation hint: no effect on the values
    return _batchnorm_legacy(ctx, x, scale, b, mean, var, epsilon, is_test, spatial)


@kernel("BatchNormalization", 6, dtypes=_FLOAT, check=_bn6_check)
def batchnorm_6(ctx, x, scale, b, mean, var, *, epsilon, is_test, momentum, spatial):
    return _batchnorm_legacy(ctx, x, scale, b, mean, var, epsilon, is_test, spatial)


@kernel("BatchNormalization", 7, dtypes=_FLOAT, check=_bn_inference_only)
def batchnorm_7(ctx, x, scale, b, mean, var, *, epsilon, momentum, spatial):
    shape = _bn_param_shape(x) if spatial else scale.shape
    return _bn_apply(x, scale, b, mean, var, epsilon, shape)


@kernel("BatchNormalization", 9, dtypes=_FLOAT, check=_bn_inference_only)
def batchnorm_9(ctx, x, scale, b, mean, var, *, epsilon, momentum):
    return _bn_apply(x, scale, b, mean, var, epsilon, _bn_param_shape(x))


def _bn14_check(node):
    if not _attr(node, "training_mode", 0) and any(node.outputs[1:]):
        return ("BatchNormalization: running_mean/running_var outputs are only defined in "
                "training mode (training_mode=0 here)")
    return None


@kernel("BatchNormalization", 14, 15, dtypes=_FLOAT, check=_bn14_check)
def batchnorm_14(ctx, x, scale, b, input_mean, input_var, *, epsilon, momentum, training_mode):
    shape = _bn_param_shape(x)
    if not training_mode:
        y = _bn_apply(x, scale, b, input_mean, input_var, epsilon, shape)
        return (y,) + (None,) * (ctx.n_outputs - 1) if ctx.n_outputs > 1 else y
    cd = _cdtype(x.dtype)
    axes = (0,) + _spatial_axes(x)
    xc = _as(x, cd)
    m = xc.mean(axis=axes)
    v = xc.var(axis=axes)
    y = _bn_apply(x, scale, b, m, v, epsilon, shape)
    mom = cd.type(momentum)
    rm = _as(input_mean, cd) * mom + m * (cd.type(1) - mom)
    rv = _as(input_var, cd) * mom + v * (cd.type(1) - mom)
    outs = (y, _as(rm, input_mean.dtype), _as(rv, input_var.dtype))
    return outs[:ctx.n_outputs]


@kernel("InstanceNormalization", 1, dtypes=_FLOAT)
def instance_norm_1(ctx, x, scale, b, *, consumed_inputs, epsilon):
    # opset 1 = opset 6 plus consumed_inputs, a legacy in-place hint with no effect on values
    return instance_norm(ctx, x, scale, b, epsilon=epsilon)


@kernel("InstanceNormalization", 6, 22, dtypes=_FLOAT)
def instance_norm(ctx, x, scale, b, *, epsilon):
    dt = x.dtype
    cd = _cdtype(dt)
    xc = _as(x, cd)
    axes = _spatial_axes(x)
    mean = xc.mean(axis=axes, keepdims=True)
    d = xc - mean
    var = np.mean(d * d, axis=axes, keepdims=True)
    shape = _bn_param_shape(x)
    y = d * (_as(scale, cd).reshape(shape) / np.sqrt(var + cd.type(epsilon))) + _as(b, cd).reshape(shape)
    return _as(y, dt)


_STASH = {1: np.dtype(np.float32)}


def _stash_check(node):
    st = _attr(node, "stash_type", 1)
    if st not in _STASH:
        return f"{node.op_type}: stash_type {st} is not implemented (only 1 = float)"
    return None


@kernel("LayerNormalization", 17, dtypes=_FLOAT, check=_stash_check)
def layer_norm(ctx, x, scale, b=None, *, axis, epsilon, stash_type):
    return _layer_norm(ctx, x, scale, b, axis, epsilon, stash_type, False)


@inplace_variant(layer_norm, 0)
def layer_norm_inplace(ctx, owned, x, scale, b=None, *, axis, epsilon, stash_type):
    return _layer_norm(ctx, x, scale, b, axis, epsilon, stash_type, True)


def _channels_first(x, ax):
    """x's channels-first array where x (rank >= 3, normalised over its last axis only) is a
    transposed view whose last axis is that array's second, as ``Transpose(perm=[0, 2, ..,
    1])`` of a C-contiguous [N, C, ...] leaves it; else None."""
    if x.ndim < 3 or ax != x.ndim - 1 or x.flags.c_contiguous:
        return None
    base = x.transpose((0, x.ndim - 1) + tuple(range(1, x.ndim - 1)))
    return base if base.flags.c_contiguous else None


def _layer_norm(ctx, x, scale, b, axis, epsilon, stash_type, owned):
    dt = x.dtype
    cd = _STASH[stash_type]
    ax = normalize_axis(axis, x.ndim)
    nat = current().native
    if (nat is not None and type(x) is np.ndarray and dt == _F32 and cd == _F32 and x.size
            and scale.dtype == _F32
            and scale.shape == x.shape[ax:] and (b is None or (b.dtype == _F32 and b.shape == scale.shape))
            and all(t is None or np.dtype(t) == _F32 for t in ctx.output_dtypes[1:ctx.n_outputs])):
        # one compiled pass a row (``_native.skip_layer_norm`` without a skip): numpy's took
        # BLAS products with ones for the means, which woke BLAS's worker threads
        d = scale.size
        st = x.shape[:ax] + (1,) * (x.ndim - ax)
        mean = np.empty(st, _F32) if ctx.n_outputs > 1 else None
        inv = np.empty(st, _F32) if ctx.n_outputs > 2 else None
        cf = _channels_first(x, ax)
        if cf is not None:
            # the last axis of a channels-first tensor's NHWC view (ConvNeXt): read in place,
            # the transpose never copied
            y = np.empty(x.shape, _F32)
            nat.layer_norm_cf(cf, np.ascontiguousarray(scale).reshape(d),
                              None if b is None else np.ascontiguousarray(b).reshape(d), y, mean, inv,
                              (cf.shape[0], d, cf.size // (cf.shape[0] * d)),
                              float(epsilon), getattr(ctx, "threads", 1))
            return (y, mean, inv)[:ctx.n_outputs] if ctx.n_outputs > 1 else y
        y = x if owned and x.flags.c_contiguous else np.empty(x.shape, _F32)
        nat.skip_layer_norm(np.ascontiguousarray(x), None, np.ascontiguousarray(scale).reshape(d),
                                None if b is None else np.ascontiguousarray(b).reshape(d), None, y, mean, inv,
                                None, (x.size // d, d, 1), float(epsilon), False,
                                max(int(getattr(ctx, "threads", 1) or 1), 1))
        return (y, mean, inv)[:ctx.n_outputs] if ctx.n_outputs > 1 else y
    xc = _as(x, cd)
    mean = mean_last(xc, ax)  # BLAS products with ones: faster than numpy's short-row means
    # x - mean, into x itself when the executable handed x over (same dtype: xc is x)
    d = np.subtract(xc, mean, out=xc if owned and xc is x else None)
    sq = np.square(d)
    var = mean_last(sq, ax)
    del sq
    inv = cd.type(1) / np.sqrt(var + cd.type(epsilon))
    d *= inv  # d is ours: normalise, scale and shift in place
    d *= _as(scale, cd)
    if b is not None:
        d += _as(b, cd)
    y = _as(d, dt)
    if ctx.n_outputs == 1:
        return y
    od = ctx.output_dtypes
    mdt = od[1] if len(od) > 1 and od[1] is not None else cd
    idt = od[2] if len(od) > 2 and od[2] is not None else cd
    outs = (y, _as(mean, mdt), _as(inv, idt))
    return outs[:ctx.n_outputs]


def _gn_core(x, num_groups, epsilon, cd):
    N, C = x.shape[:2]
    xr = _as(x, cd).reshape(N, num_groups, -1)
    mean = xr.mean(axis=-1, keepdims=True)
    d = xr - mean
    var = np.mean(d * d, axis=-1, keepdims=True)
    return d / np.sqrt(var + cd.type(epsilon))  # [N, G, C/G * spatial]


@kernel("GroupNormalization", 18, dtypes=_FLOAT)
def group_norm_18(ctx, x, scale, bias, *, epsilon, num_groups):
    # opset 18: scale and bias are per GROUP, shape (num_groups) (opset 21 made them per channel).
    # onnx marks this schema deprecated, so onnx.checker (which the core's loader runs) rejects
    # models that use it; the kernel serves callers that load without that check.
    N, C = x.shape[:2]
    if num_groups < 1 or C % num_groups:
        raise ValueError(f"GroupNormalization-18: num_groups {num_groups} does not divide C={C}")
    if scale.shape != (num_groups,) or bias.shape != (num_groups,):
        raise ValueError(f"GroupNormalization-18: scale and bias must have shape ({num_groups},), got "
                         f"{scale.shape} and {bias.shape}")
    cd = _cdtype(x.dtype)
    xn = _gn_core(x, num_groups, epsilon, cd)  # [N, G, C/G * spatial]
    y = xn * _as(scale, cd)[:, None] + _as(bias, cd)[:, None]
    return _as(y.reshape(x.shape), x.dtype)


@kernel("GroupNormalization", 21, dtypes=_FLOAT, check=_stash_check)
def group_norm_21(ctx, x, scale, bias, *, epsilon, num_groups, stash_type):
    # opset 21: scale and bias are per channel, shape (C)
    cd = _STASH[stash_type]
    xn = _gn_core(x, num_groups, epsilon, cd).reshape(x.shape)
    shape = _bn_param_shape(x)
    y = xn * _as(scale, cd).reshape(shape) + _as(bias, cd).reshape(shape)
    return _as(y, x.dtype)


@kernel("LRN", 1, 13, dtypes=_FLOAT)
def lrn(ctx, x, *, alpha, beta, bias, size):
    dt = x.dtype
    cd = _cdtype(dt)
    xc = _as(x, cd)
    C = x.shape[1]
    # window ends past the channels read only zeros: clamp them, so a huge size costs O(C)
    pre = min((size - 1) // 2, max(C - 1, 0))
    post = min(size - 1 - (size - 1) // 2, max(C - 1, 0))
    sq = xc * xc
    pad = [(0, 0)] * x.ndim
    pad[1] = (pre, post)
    sqp = np.pad(sq, pad)
    acc = sqp[:, 0:C].copy()
    for j in range(1, pre + post + 1):
        acc += sqp[:, j:j + C]
    y = xc / (cd.type(bias) + cd.type(alpha / size) * acc) ** cd.type(beta)
    return _as(y, dt)




# ---------------------------------------------------------------------------------------
# LpNormalization / MeanVarianceNormalization
# ---------------------------------------------------------------------------------------

def _lpnorm_check(node):
    p = _attr(node, "p", 2)
    if p not in (1, 2):
        return f"LpNormalization: p={p} is not defined (only 1 and 2 are)"
    return None


@kernel("LpNormalization", 1, 22, dtypes=_FLOAT | _BF16, check=_lpnorm_check)
def lp_normalization(ctx, x, *, axis, p):
    if x.size == 0:
        return x.copy()
    ax = normalize_axis(axis, x.ndim)
    cd = _cdtype(x.dtype)
    xc = _as(x, cd)
    if p == 1:
        norm = np.sum(np.abs(xc), axis=ax, keepdims=True)
    else:
        norm = np.sqrt(np.sum(xc * xc, axis=ax, keepdims=True))
    with ignore_fp(divide="ignore", invalid="ignore"):
        y = np.where(norm == 0, cd.type(0), xc / norm)
    return _as(y, x.dtype)


@kernel("MeanVarianceNormalization", 9, 13, dtypes=_FLOAT | _BF16)
def mean_variance_normalization(ctx, x, *, axes):
    # the schema's function: (X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9)
    ax = tuple(sorted({normalize_axis(a, x.ndim) for a in axes}))
    cd = _cdtype(x.dtype)
    xc = _as(x, cd)
    mean = np.mean(xc, axis=ax, keepdims=True)
    var = np.mean(xc * xc, axis=ax, keepdims=True) - mean * mean
    std = np.sqrt(np.maximum(var, cd.type(0)))
    return _as((xc - mean) / (std + cd.type(1e-9)), x.dtype)

