"""Reference kernels for the ``com.microsoft`` ops the core's fusions introduce.

Semantics are onnxruntime's contrib ops (checked against onnxruntime in
``tests/core/test_fusions.py``): ``Gelu``, ``FastGelu``, ``BiasGelu``,
``SkipLayerNormalization``, ``SimplifiedLayerNormalization`` (RMSNorm),
``SkipSimplifiedLayerNormalization`` and ``Attention``. These ops have no ONNX schema, so
the core passes only the attributes a node carries; the keyword defaults below
are onnxruntime's documented defaults (the fusions always set every attribute).
``runtime_core.fused::SqueezeExcite`` is ours alone (a squeeze-excite block; checked against
onnxruntime running the unfused block in ``tests/core/test_squeeze_excite.py``).
"""

from __future__ import annotations

import math

import numpy as np

from ..executable import binds, inplace_variant
from ..registry import kernel
from ..fast import autotune as _autotune
# the module, not its names: fast.conv imports ops._nncommon, so either may be imported first
from ..fast import conv as fast_conv
from ..fast import linear as fast_linear
from ..fast.sgemm import sgemm_ready as _sgemm_ready
from ._nncommon import _is_const
from .conv import conv_clipped
from ._common import ignore_fp, mean_last, sum_last
from ._dtypes import _F32 as _F32_DT  # the float32 descriptor (identity tests)
from .pool import row_means
from .elementwise import _native
from .elementwise import gelu_erf_f32 as _gelu_erf_f32
from .elementwise import gelu_tanh_f32 as _gelu_tanh_f32

MS = "com.microsoft"
_F32 = {"float32"}


def _info(node, i):
    if i < len(node.input_info) and node.input_info[i] is not None:
        return node.input_info[i]
    return None


# -- activations ------------------------------------------------------------------------

def _threads(ctx):
    t = getattr(ctx, "threads", 1)
    return t if type(t) is int and t >= 1 else max(int(t or 1), 1)


def _is_f32(a) -> bool:
    """``a.dtype == float32``, by identity first (numpy's float32 descriptor is one object)."""
    return a.dtype is _F32_DT or a.dtype == _F32_DT


def _gelu_erf(x, out=None, threads=1):
    """Gelu (erf form), computed in float32 block by block (scipy's float32 erf is ~7x slower
    and the unblocked polynomial's full-size temporaries cost page faults); ``out`` may be x."""
    xf = x.astype(np.float32, copy=False)
    y = _gelu_erf_f32(xf, out=out if out is not None and out.dtype == np.float32 else None, threads=threads)
    return y.astype(x.dtype, copy=False)


def _gelu_tanh(x, bias=None, out=None, threads=1):
    """Gelu's tanh approximation of ``x (+ bias)`` in float32 (see ``gelu_tanh_f32``)."""
    xf = x.astype(np.float32, copy=False)
    bf = None if bias is None else bias.astype(np.float32, copy=False)
    y = _gelu_tanh_f32(xf, bf, out=out if out is not None and out.dtype == np.float32 else None,
                       threads=threads)
    return y.astype(x.dtype, copy=False)


def _bias_check(node):
    b = _info(node, 1)
    x = _info(node, 0)
    if b is not None and b.shape is not None and len(b.shape) != 1:
        return f"{node.op_type}: bias must be 1-D, got shape {b.shape}"
    if (b is not None and x is not None and b.shape and x.shape and isinstance(b.shape[0], int)
            and isinstance(x.shape[-1], int) and b.shape[0] != x.shape[-1]):
        return f"{node.op_type}: bias size {b.shape[0]} differs from the last dim {x.shape[-1]} of the input"
    return None


@kernel("Gelu", 1, domain=MS, dtypes=_F32)
def ms_gelu(ctx, x):
    """0.5 * x * (1 + erf(x / sqrt(2)))."""
    with ignore_fp():
        return _gelu_erf(x, threads=_threads(ctx))


def _fast_gelu(x, bias, out, threads=1):
    if bias is not None and (bias.ndim != 1 or x.ndim == 0 or bias.shape[0] != x.shape[-1]):
        raise ValueError(f"FastGelu bias of shape {bias.shape} does not match input {x.shape}")
    with ignore_fp():
        return _gelu_tanh(x, bias, out=out, threads=threads)


@kernel("FastGelu", 1, domain=MS, dtypes=_F32, check=_bias_check)
def fast_gelu(ctx, x, bias=None):
    """The tanh approximation of Gelu, of ``x + bias`` when a bias is given."""
    return _fast_gelu(x, bias, None, _threads(ctx))


@inplace_variant(fast_gelu, 0)
def fast_gelu_inplace(ctx, owned, x, bias=None):
    """``fast_gelu`` written into ``x`` (handed over by the executable)."""
    return _fast_gelu(x, bias, x, _threads(ctx))


@kernel("BiasGelu", 1, domain=MS, dtypes=_F32, check=_bias_check)
def bias_gelu(ctx, a, b):
    """Gelu (erf form) of ``a + b``, b a vector of a's last dim."""
    if b.ndim != 1 or b.shape[0] != a.shape[-1]:
        raise ValueError(f"BiasGelu bias of shape {b.shape} does not match input {a.shape}")
    with ignore_fp():
        if _is_f32(a) and _is_f32(b):
            # the sum and Gelu in one pass where compiled, its rows over the kernel threads
            return _gelu_erf_f32(a, bias=b, threads=_threads(ctx))
        s = a + b
        return _gelu_erf(s, out=s, threads=_threads(ctx))  # s is ours


@inplace_variant(bias_gelu, 0)
def bias_gelu_inplace(ctx, owned, a, b):
    """``bias_gelu`` with the sum written into ``a`` (handed over by the executable)."""
    if not _is_f32(a) or not _is_f32(b) or b.ndim != 1 or b.shape[0] != a.shape[-1]:
        return bias_gelu(ctx, a, b)
    if (_native is not None and type(a) is np.ndarray and type(b) is np.ndarray and a.flags.c_contiguous
            and b.flags.c_contiguous):
        # gelu_erf_f32's compiled pass called straight (the same call, three Python frames less)
        d = a.shape[-1]
        _native.gelu_erf(a, b, a, (a.size // max(d, 1), d), False, _threads(ctx))
        return a
    with ignore_fp():
        return _gelu_erf_f32(a, out=a, bias=b, threads=_threads(ctx))


# -- FusedConv --------------------------------------------------------------------------

#: activation name -> number of activation_params it takes (onnxruntime's FusedConv)
FUSED_CONV_ACTIVATIONS = {"Relu": 0, "Tanh": 0, "Sigmoid": 0, "LeakyRelu": 1, "Clip": 2, "HardSigmoid": 2,
                          "HardSwish": 0, "SiLU": 0}  # the last two ours, beyond onnxruntime's list
#: activations of _native.activate: name -> its kind
_NATIVE_ACT = {"HardSwish": 0, "HardSigmoid": 1, "Sigmoid": 2, "SiLU": 3}


def _native_act(act, params):
    """``(kind, alpha, beta)`` of ``_native.activate`` for ``act`` (HardSigmoid's alpha and beta
    from its params, HardSwish's fixed 1/6 and 1/2, ignored by the others), or None."""
    kind = _NATIVE_ACT.get(act)
    if kind is None:
        return None
    return (kind,) + ((float(params[0]), float(params[1])) if act == "HardSigmoid" else (1.0 / 6.0, 0.5))


def _fused_conv_check(node):
    act = node.attrs.get("activation")
    act = act.decode() if isinstance(act, bytes) else act
    if act is None:  # no activation: Conv(x) + z
        from .conv import _conv_check

        return _conv_check(node)
    if act not in FUSED_CONV_ACTIVATIONS:
        return (f"FusedConv: activation {act!r} is not one of "
                f"{', '.join(sorted(FUSED_CONV_ACTIVATIONS))}")
    params = list(node.attrs.get("activation_params") or [])
    if len(params) < FUSED_CONV_ACTIVATIONS[act]:
        return f"FusedConv: activation {act} needs {FUSED_CONV_ACTIVATIONS[act]} activation_params, got {len(params)}"
    from .conv import _conv_check

    return _conv_check(node)


def _activate(y, act, params):
    """Apply ``act`` to ``y`` in place (y is this call's own array). Relu and Clip are not
    here: the convolution's epilogue applies them."""
    na = _native_act(act, params)
    if na is not None and _native is not None and y.dtype == np.float32 and y.flags.c_contiguous:
        _native.activate(y, y, y.size, *na)  # one pass instead of numpy's three or four
        return y
    if act == "HardSwish":
        h = y * np.float32(1.0 / 6.0)
        h += np.float32(0.5)
        np.clip(h, np.float32(0), np.float32(1), out=h)
        y *= h
    elif act == "SiLU":
        y *= 1 / (1 + np.exp(-y, dtype=np.float32))
    elif act == "LeakyRelu":
        np.multiply(y, np.where(y < 0, np.float32(params[0]), np.float32(1)), out=y)
    elif act == "Tanh":
        np.tanh(y, out=y)
    elif act == "Sigmoid":
        np.negative(y, out=y)
        np.exp(y, out=y)
        y += np.float32(1)
        np.reciprocal(y, out=y)
    elif act == "HardSigmoid":
        y *= np.float32(params[0])
        y += np.float32(params[1])
        np.clip(y, np.float32(0), np.float32(1), out=y)
    return y


@kernel("FusedConv", 1, domain=MS, dtypes=_F32, check=_fused_conv_check)
@binds
def fused_conv(ctx, x, w, b=None, z=None, *, activation=None, activation_params=None, auto_pad="NOTSET",
               dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """onnxruntime's ``FusedConv``: ``activation(Conv(x, w, b) + z)``, z (optional) of the
    output's shape, no activation when the attribute is absent. The sum and Relu / Clip run
    in the convolution's epilogue; HardSwish, HardSigmoid, Sigmoid and SiLU (float32, the
    extension built) go with its plan (:meth:`~..fast.plan.ConvPlan.set_act`: the depthwise
    and pointwise-lanes kernels' epilogues, a compiled pass after the others); Tanh and
    LeakyRelu in place on its result."""
    act = activation.decode() if isinstance(activation, bytes) else activation
    params = list(activation_params or [])
    # the sum and a Relu / Clip are applied in the convolution's own epilogue
    clip = None
    if act == "Relu":
        clip, act = (0.0, np.inf), None
    elif act == "Clip":  # _fused_conv_check declined it without its two params
        clip, act = (float(params[0]), float(params[1])), None
    cache = fast_conv.plan_cache(ctx, w, b)
    # a compiled activation goes with the convolution (its kernel's epilogue where it has one)
    native_act = _native_act(act, params) if _native is not None and x.dtype == np.float32 else None
    y = conv_clipped(x, w, b, clip, auto_pad=auto_pad, dilations=dilations, group=group,
                         kernel_shape=kernel_shape, pads=pads, strides=strides, z=z,
                         cache=cache, threads=getattr(ctx, "threads", 1), ctx=ctx, act=native_act)
    post = None
    if act is not None and native_act is None:
        y = _activate(y, act, params)

        def post(r):
            return _activate(r, act, params)
    fast_conv.bind_plan(cache, fused_conv, dict(activation=activation, activation_params=activation_params,
                                          auto_pad=auto_pad, dilations=dilations, group=group,
                                          kernel_shape=kernel_shape, pads=pads, strides=strides), post,
                        activated=native_act is not None)
    return y


# -- SqueezeExcite ----------------------------------------------------------------------

#: the domain of the fused ops only runtime-core runs (``runtime_core/optimizer/portable.py``
#: writes them back as standard ops in a saved model)
RC_FUSED = "runtime_core.fused"
_SE_GATES = ("Sigmoid", "HardSigmoid")


def _se_check(node):
    act, gate = (node.attrs.get(k) for k in ("activation", "gate"))
    act, gate = (v.decode() if isinstance(v, bytes) else v for v in (act, gate))
    if gate not in _SE_GATES:
        return f"SqueezeExcite: gate {gate!r} is not one of {', '.join(_SE_GATES)}"
    for name, a, key in (("activation", act, "activation_params"), ("gate", gate, "gate_params")):
        if a is None:
            continue
        if a not in FUSED_CONV_ACTIVATIONS:
            return f"SqueezeExcite: {name} {a!r} is not one of {', '.join(sorted(FUSED_CONV_ACTIVATIONS))}"
        if len(node.attrs.get(key) or []) < FUSED_CONV_ACTIVATIONS[a]:
            return f"SqueezeExcite: {name} {a} needs {FUSED_CONV_ACTIVATIONS[a]} {key}, got fewer"
    if len(node.inputs) < 4 or not node.inputs[3]:
        return "SqueezeExcite needs inputs X, W1, B1 (may be empty), W2"
    return None


def _se_act(v, act, params):
    """``act`` of the small [N, C] array ``v`` (ours), in place."""
    if act == "Relu":
        np.maximum(v, np.float32(0), out=v)
    elif act == "Clip":
        np.clip(v, np.float32(params[0]), np.float32(params[1]), out=v)
    elif act is not None:
        _activate(v, act, params)
    return v


def _se_native(act, params, gate, gate_params):
    """``_native.squeeze_excite``'s (lo, hi, act, alpha, beta, gate, alpha, beta) for these
    activations, or None (the extension not built, or an activation it does not have)."""
    if _native is None or not hasattr(_native, "squeeze_excite"):
        return None
    lo, hi, a = -np.inf, np.inf, (-1, 1.0 / 6.0, 0.5)
    if act == "Relu":
        lo = 0.0
    elif act == "Clip":
        lo, hi = float(params[0]), float(params[1])
    elif act is not None:
        a = _native_act(act, params)
        if a is None:
            return None
    return (lo, hi) + a + _native_act(gate, gate_params)  # gate: Sigmoid or HardSigmoid (_se_check)


def _squeeze_excite(x, w1, b1, w2, b2, act, params, gate, gate_params, out, threads=1):
    if x.ndim != 4 or w1.ndim != 4 or w2.ndim != 4:
        raise ValueError(f"SqueezeExcite: X, W1 and W2 must be 4-D, got {x.shape}, {w1.shape}, {w2.shape}")
    n, c = x.shape[:2]
    cr = w1.shape[0]
    if w1.shape != (cr, c, 1, 1) or w2.shape != (c, cr, 1, 1):
        raise ValueError(f"SqueezeExcite: W1 of shape {w1.shape} and W2 of shape {w2.shape} do not fit "
                         f"X's {c} channels (expected ({cr}, {c}, 1, 1) and ({c}, {cr}, 1, 1))")
    for name, b, k in (("B1", b1, cr), ("B2", b2, c)):
        if b is not None and b.shape != (k,):
            raise ValueError(f"SqueezeExcite: {name} must have shape ({k},), got {b.shape}")
    if x.size == 0:
        return np.empty(x.shape, np.float32)
    xc = x if x.flags.c_contiguous else np.ascontiguousarray(x)
    native = _se_native(act, params, gate, gate_params)
    if native is not None and all(v is None or v.dtype == np.float32 for v in (xc, w1, b1, w2, b2)):
        # one compiled call: the means, the two products and the gated multiply on the kernel threads
        y = out if out is not None else np.empty(x.shape, np.float32)
        _native.squeeze_excite(xc, np.ascontiguousarray(w1), None if b1 is None else np.ascontiguousarray(b1),
                               np.ascontiguousarray(w2), None if b2 is None else np.ascontiguousarray(b2), y,
                               (n, c, cr, x.shape[2] * x.shape[3]), *native, max(1, int(threads)))
        return y
    # the squeeze as GlobalAveragePool's and the two [N, C] products on numpy's BLAS, held at
    # one thread: matrix-vector sizes, too small to hand to the kernel threads
    s = row_means(xc, n * c).reshape(n, c)
    h = s @ w1.reshape(cr, c).T
    if b1 is not None:
        h += b1
    h = _se_act(h, act, params)
    g = h @ w2.reshape(c, cr).T
    if b2 is not None:
        g += b2
    g = _se_act(g, gate, gate_params)
    return np.multiply(xc, g.reshape(n, c, 1, 1), out=out)


@kernel("SqueezeExcite", 1, domain=RC_FUSED, dtypes=_F32, check=_se_check)
def squeeze_excite(ctx, x, w1, b1=None, w2=None, b2=None, *, gate, gate_params=None, activation=None,
                   activation_params=None):
    """``X * gate(Conv(act(Conv(mean_hw(X), W1, B1)), W2, B2))``, the convolutions 1x1 on
    the [N, C, 1, 1] mean (the optimizer's ``SqueezeExciteFusion``): ``act`` and ``gate``
    are FusedConv's activations (no ``activation``: none), their params as FusedConv's."""
    act, gate = (v.decode() if isinstance(v, bytes) else v for v in (activation, gate))
    with ignore_fp():
        return _squeeze_excite(x, w1, b1, w2, b2, act, list(activation_params or []), gate,
                               list(gate_params or []), None, getattr(ctx, "threads", 1))


@inplace_variant(squeeze_excite, 0)
def squeeze_excite_inplace(ctx, owned, x, w1, b1=None, w2=None, b2=None, *, gate, gate_params=None,
                           activation=None, activation_params=None):
    """``squeeze_excite`` with the gated product written into ``x`` (handed over)."""
    act, gate = (v.decode() if isinstance(v, bytes) else v for v in (activation, gate))
    out = x if x.dtype == np.float32 and x.flags.c_contiguous else None
    with ignore_fp():
        return _squeeze_excite(x, w1, b1, w2, b2, act, list(activation_params or []), gate,
                               list(gate_params or []), out, getattr(ctx, "threads", 1))


# -- SkipLayerNormalization -------------------------------------------------------------

@kernel("SkipLayerNormalization", 1, domain=MS, dtypes={"float32", "float16"})
def skip_layer_norm(ctx, x, skip, gamma, beta=None, bias=None, *, epsilon=1e-12):
    """LayerNorm over the last axis of ``x + skip (+ bias)``; outputs: y, mean, inv_std_var,
    and the sum itself. Shapes as onnxruntime: x rank 2 or 3; skip with x's last two dims
    (rank 3: batch equal or 1); gamma/beta/bias vectors of the hidden size."""
    _skip_ln_checked(ctx, x, skip, gamma, beta, bias)
    return _skip_ln(ctx, x, skip, gamma, beta, bias, epsilon, None)


def _skip_ln_shapes(x, skip, gamma, beta, bias, op="SkipLayerNormalization"):
    if x.ndim not in (2, 3):
        raise ValueError(f"{op} input must be 2-D or 3-D, got shape {x.shape}")
    if skip.ndim not in (2, 3) or skip.shape[-2:] != x.shape[-2:] or skip.ndim > x.ndim or (
            skip.ndim == 3 and skip.shape[0] not in (1, x.shape[0])):
        raise ValueError(f"{op} skip of shape {skip.shape} does not fit input {x.shape}")
    d = x.shape[-1]
    for name, v in (("gamma", gamma), ("beta", beta), ("bias", bias)):
        if v is not None and v.shape != (d,):
            raise ValueError(f"{op} {name} must have shape ({d},), got {v.shape}")


@inplace_variant(skip_layer_norm, 0, 1)
def skip_layer_norm_inplace(ctx, owned, x, skip, gamma, beta=None, bias=None, *, epsilon=1e-12):
    """``skip_layer_norm`` with ``x + skip`` written into the input handed over (when it is a
    float32 array of x's shape: a skip broadcast over the batch is not)."""
    t = skip if owned else x
    cache = getattr(ctx, "cache", None)
    fast = None if cache is None else cache.get("skip_ln_fast")
    if (fast is not None and x.shape == fast[0] and skip.shape == fast[0] and gamma is fast[1] and beta is fast[2]
            and bias is fast[3] and epsilon is fast[4] and type(x) is np.ndarray and type(skip) is np.ndarray
            and x.dtype is _F32_DT and skip.dtype is _F32_DT and x.flags.c_contiguous and skip.flags.c_contiguous):
        # the node's last call again (its shapes, constants and checks): _skip_ln's compiled call
        _native.skip_layer_norm(x, skip, gamma, beta, bias, t, None, None, None, fast[5], fast[6], False, fast[7])
        return (t,)
    if not _is_f32(t) or t.shape != x.shape or not _is_f32(x) or not _is_f32(skip):
        return skip_layer_norm(ctx, x, skip, gamma, beta, bias, epsilon=epsilon)
    _skip_ln_checked(ctx, x, skip, gamma, beta, bias)
    y = _skip_ln(ctx, x, skip, gamma, beta, bias, epsilon, t)
    if (cache is not None and _native is not None and ctx.n_outputs <= 1 and x.size and skip.shape == x.shape
            and type(x) is np.ndarray and type(skip) is np.ndarray and y[0] is t
            and all(v is None or (type(v) is np.ndarray and v.dtype is _F32_DT and v.flags.c_contiguous)
                    for v in (gamma, beta, bias))):
        d = x.shape[-1]
        cache["skip_ln_fast"] = (x.shape, gamma, beta, bias, epsilon, (x.size // d, d, max(skip.size // d, 1)),
                                 float(epsilon), _threads(ctx))
    return y


def _skip_ln_checked(ctx, x, skip, gamma, beta, bias):
    """``_skip_ln_shapes``, skipped where the node's last call passed it with these shapes and
    the same gamma, beta and bias arrays (its constants)."""
    cache = getattr(ctx, "cache", None)
    seen = None if cache is None else cache.get("skip_ln_checked")
    if (seen is not None and seen[0] == x.shape and seen[1] == skip.shape and seen[2] is gamma
            and seen[3] is beta and seen[4] is bias):
        return
    _skip_ln_shapes(x, skip, gamma, beta, bias)
    if cache is not None:
        cache["skip_ln_checked"] = (x.shape, skip.shape, gamma, beta, bias)


def _skip_ln(ctx, x, skip, gamma, beta, bias, epsilon, out):
    f32 = np.float32
    n_out = max(ctx.n_outputs, 1)
    if (_native is not None and x.size and _is_f32(x) and _is_f32(skip) and _is_f32(gamma)
            and (beta is None or _is_f32(beta)) and (bias is None or _is_f32(bias))):
        # compiled: one pass a row (~9 numpy passes: ViT-tiny's 197 x 192, 84 -> 29 us isolated)
        d = x.shape[-1]
        y = out if out is not None and out.flags.c_contiguous else np.empty(x.shape, f32)
        if n_out > 1:
            mean = np.empty(x.shape[:-1] + (1,), f32)
            inv = np.empty(x.shape[:-1] + (1,), f32) if n_out > 2 else None
            s = np.empty(x.shape, f32) if n_out > 3 else None
        else:
            mean = inv = s = None
        _native.skip_layer_norm(np.ascontiguousarray(x), np.ascontiguousarray(skip),
                                np.ascontiguousarray(gamma), beta if beta is None else np.ascontiguousarray(beta),
                                bias if bias is None else np.ascontiguousarray(bias), y, mean, inv, s,
                                (x.size // d, d, max(skip.size // d, 1)), float(epsilon), False, _threads(ctx))
        return (y, mean, inv, s)[:n_out]
    # a new array (or the input the executable handed over): ours
    s = np.add(x.astype(f32, copy=False), skip.astype(f32, copy=False), out=out)
    if bias is not None:
        s += bias.astype(f32, copy=False)
    # row means as BLAS products with ones (``mean_last``): ~30% of the kernel at (197, 192)
    mean = mean_last(s, s.ndim - 1)
    # the same arithmetic as (s - mean), (dev * dev), dev * inv * gamma + beta, on two buffers:
    # dev overwrites s unless the sum itself is an output
    dev = np.subtract(s, mean, out=None if n_out > 3 else s)
    tmp = np.multiply(dev, dev)
    var = mean_last(tmp, tmp.ndim - 1)
    inv = f32(1.0) / np.sqrt(var + f32(epsilon))
    y = np.multiply(dev, inv, out=tmp)
    y *= gamma.astype(f32, copy=False)
    if beta is not None:
        y += beta.astype(f32, copy=False)
    outs = [y.astype(x.dtype, copy=False)]
    if n_out > 1:
        outs.append(mean.astype(f32, copy=False))
    if n_out > 2:
        outs.append(inv.astype(f32, copy=False))
    if n_out > 3:
        outs.append(s.astype(x.dtype, copy=False))
    return tuple(outs)


# -- SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization (RMSNorm) ---------------

def _rms_rows(s, d, epsilon, out=None):
    """``s / sqrt(mean(s^2) + eps)`` over rows of ``d`` (float32 or float64, C-contiguous)
    and the per-row inverse; the sum of squares is one einsum pass (no squared temporary;
    numpy's BLAS matrix-vector product is slower here under load)."""
    rows = s.reshape(-1, d)
    ms = np.einsum("ij,ij->i", rows, rows)
    ms /= d
    inv = 1.0 / np.sqrt(ms + s.dtype.type(epsilon))
    y = np.multiply(rows, inv[:, None], out=None if out is None else out.reshape(-1, d))
    return y.reshape(s.shape), inv


def _stash(stash_type):
    if stash_type not in (1, 11):
        raise ValueError(f"SimplifiedLayerNormalization: stash_type={stash_type} is not implemented "
                         "(1 = float32, 11 = double)")
    return np.float32 if stash_type == 1 else np.float64


@kernel("SimplifiedLayerNormalization", 1, domain=MS, dtypes={"float32", "float16", "float64"})
def simplified_layer_norm(ctx, x, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    """RMSNorm over axes ``axis..-1``: ``x / sqrt(mean(x^2) + epsilon) * scale`` computed in the
    stash type; outputs: Y (x's type) and inv_std_var (stash type, x's shape with 1s over the
    normalized axes). onnxruntime's op of this name (it registers it in the ai.onnx domain)."""
    st = _stash(stash_type)
    ax = axis + x.ndim if axis < 0 else axis
    if not 0 <= ax < x.ndim:
        raise ValueError(f"SimplifiedLayerNormalization: axis {axis} is out of range for rank {x.ndim}")
    d = math.prod(x.shape[ax:])
    if scale.size != d or np.broadcast_shapes(scale.shape, x.shape) != x.shape:
        raise ValueError(f"SimplifiedLayerNormalization: scale of shape {scale.shape} does not fit the "
                         f"normalized shape {x.shape[ax:]}")
    if st == np.float32 and x.dtype == np.float32 and scale.dtype == np.float32 and d:
        # rows of d with the scale flattened: inv_std_var is the kernel's third output
        fast = _native_rms(x, None, scale, None, epsilon, None, d, 3 if ctx.n_outputs > 1 else 1, _threads(ctx))
        if fast is not None:
            return (fast[0],) if ctx.n_outputs <= 1 else (fast[0], fast[2].reshape(x.shape[:ax] + (1,) * (x.ndim - ax)))
    xs = np.ascontiguousarray(x, dtype=st)
    if d == 0 or xs.size == 0:
        y, inv = xs.copy(), np.empty(x.shape[:ax] + (1,) * (x.ndim - ax), st)
    else:
        y, inv = _rms_rows(xs, d, epsilon, out=xs if xs is not x else None)
        y *= scale.reshape(x.shape[ax:]).astype(st, copy=False)
    outs = (y.astype(x.dtype, copy=False), inv.reshape(x.shape[:ax] + (1,) * (x.ndim - ax)))
    return outs[:max(ctx.n_outputs, 1)]


@kernel("SkipSimplifiedLayerNormalization", 1, domain=MS, dtypes={"float32", "float16"})
def skip_simplified_layer_norm(ctx, x, skip, gamma, bias=None, *, epsilon=1e-12):
    """RMSNorm over the last axis of ``x + skip (+ bias)`` scaled by gamma; outputs: output,
    mean (unused: zeros, as onnxruntime), inv_std_var and the sum itself. Shapes as
    ``SkipLayerNormalization``."""
    _skip_ln_shapes(x, skip, gamma, None, bias, "SkipSimplifiedLayerNormalization")
    return _skip_rms(ctx, x, skip, gamma, bias, epsilon, None)


@inplace_variant(skip_simplified_layer_norm, 0, 1)
def skip_simplified_layer_norm_inplace(ctx, owned, x, skip, gamma, bias=None, *, epsilon=1e-12):
    """``skip_simplified_layer_norm`` with ``x + skip`` written into the input handed over."""
    t = skip if owned else x
    if t.dtype != np.float32 or t.shape != x.shape or x.dtype != np.float32 or skip.dtype != np.float32:
        return skip_simplified_layer_norm(ctx, x, skip, gamma, bias, epsilon=epsilon)
    _skip_ln_shapes(x, skip, gamma, None, bias, "SkipSimplifiedLayerNormalization")
    return _skip_rms(ctx, x, skip, gamma, bias, epsilon, t)


def _native_rms(x, skip, gamma, bias, epsilon, out, d, n_out, threads=1):
    """The compiled row kernel (``skip_layer_norm`` with ``rms``): one pass a row where numpy
    takes four; outputs as ``_skip_rms``. None where it does not apply."""
    f32 = np.float32
    if _native is None or not x.size or not all(v is None or v.dtype == f32 for v in (x, skip, gamma, bias)):
        return None
    y = out if out is not None and out.flags.c_contiguous else np.empty(x.shape, f32)
    stat = (x.size // d,)  # one per row; the callers shape them
    mean = np.empty(stat, f32) if n_out > 1 else None
    inv = np.empty(stat, f32) if n_out > 2 else None
    s = np.empty(x.shape, f32) if n_out > 3 and skip is not None else None
    _native.skip_layer_norm(np.ascontiguousarray(x), None if skip is None else np.ascontiguousarray(skip),
                            np.ascontiguousarray(gamma).reshape(-1), None,
                            None if bias is None else np.ascontiguousarray(bias), y, mean, inv, s,
                            (x.size // d, d, 1 if skip is None else max(skip.size // d, 1)), float(epsilon), True,
                            threads)
    return (y, mean, inv, s)[:n_out]


def _skip_rms(ctx, x, skip, gamma, bias, epsilon, out):
    f32 = np.float32
    n_out = max(ctx.n_outputs, 1)
    d = x.shape[-1]
    fast = _native_rms(x, skip, gamma, bias, epsilon, out, d, n_out, _threads(ctx))
    if fast is not None:
        return tuple(v.reshape(x.shape[:-1] + (1,)) if k in (1, 2) else v for k, v in enumerate(fast))
    s = np.add(x.astype(f32, copy=False), skip.astype(f32, copy=False), out=out)
    if bias is not None:
        s += bias.astype(f32, copy=False)
    if s.size == 0:
        y, inv = s.copy(), np.empty(x.shape[:-1], f32)
    else:
        # y overwrites the sum unless the sum itself is an output
        y, inv = _rms_rows(s, d, epsilon, out=None if n_out > 3 else s)
        y *= gamma.astype(f32, copy=False)
    outs = [y.astype(x.dtype, copy=False)]
    if n_out > 1:
        outs.append(np.zeros(x.shape[:-1] + (1,), f32))
    if n_out > 2:
        outs.append(inv.reshape(x.shape[:-1] + (1,)))
    if n_out > 3:
        outs.append(s.astype(x.dtype, copy=False))
    return tuple(outs)


# -- Attention --------------------------------------------------------------------------

def _attention_check(node):
    a = node.attrs
    if a.get("do_rotary"):
        return "Attention with do_rotary=1 is not implemented"
    if a.get("past_present_share_buffer"):
        return "Attention with past_present_share_buffer=1 is not implemented"
    if len(node.inputs) > 4 and node.inputs[4]:
        return "Attention with a past state is not implemented"
    if len(node.inputs) > 6 and node.inputs[6]:
        return "Attention with past_sequence_length is not implemented"
    if len(node.outputs) > 1 and node.outputs[1]:
        return "Attention's present output is not implemented"
    if not a.get("num_heads"):
        return "Attention needs num_heads"
    m = _info(node, 3)
    if m is not None and m.dtype is not None and np.dtype(m.dtype) != np.int32:
        return f"Attention mask_index must be int32, got {np.dtype(m.dtype)}"
    if m is not None and m.shape is not None and len(m.shape) not in (1, 2, 3):
        return f"Attention mask_index of rank {len(m.shape)} is not implemented"
    return None


def _mask_bias(mask, b, s, t, filt):
    """Additive [B, S, T] (or broadcastable) float32 mask from onnxruntime's mask_index forms."""
    if mask.ndim == 1:
        pos = np.arange(t)
        if mask.shape[0] == b:
            keep = pos[None, :] < mask[:, None]
        elif mask.shape[0] == 2 * b:
            keep = (pos[None, :] < mask[:b, None]) & (pos[None, :] >= np.minimum(mask[b:, None], t))
        else:
            raise ValueError(f"Attention 1-D mask_index must have {b} or {2 * b} elements, got {mask.shape[0]}")
        return np.where(keep, np.float32(0), np.float32(filt))[:, None, :]
    if mask.ndim == 2:
        # onnxruntime: exactly (B, T); here also (1|B, 1|T), broadcast
        if mask.shape[0] not in (1, b) or mask.shape[1] not in (1, t):
            raise ValueError(f"Attention 2-D mask_index must be ({b}, {t}), got {mask.shape}")
        return np.where(mask > 0, np.float32(0), np.float32(filt))[:, None, :]
    if mask.shape != (b, s, t):
        raise ValueError(f"Attention 3-D mask_index must be ({b}, {s}, {t}), got {mask.shape}")
    return np.where(mask > 0, np.float32(0), np.float32(filt))


def _softmax(z):
    m = np.max(z, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, np.float32(0))
    e = np.exp(z - m)
    return e / np.sum(e, axis=-1, keepdims=True)


def _softmax_inplace(z):
    """``_softmax`` (the same arithmetic) overwriting ``z``, which must be the caller's own;
    float32 with the extension: one compiled pass a row (``_native.softmax``)."""
    t = z.shape[-1] if z.ndim else 1
    if _native is not None and z.dtype == np.float32 and z.flags.c_contiguous and t > 0 and z.size:
        _native.softmax(z, (z.size // t, t))
        return z
    m = np.max(z, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, np.float32(0))
    np.subtract(z, m, out=z)
    np.exp(z, out=z)
    tot = sum_last(z, t)
    if tot is None:
        z /= np.sum(z, axis=-1, keepdims=True)
    else:  # row sums as one BLAS product with ones, then one multiply by their reciprocals
        np.reciprocal(tot, out=tot)
        z *= tot.reshape(z.shape[:-1] + (1,))
    return z


def _add_into(z, other):
    """``z + other`` written into ``z`` (a fresh array of ours) when that keeps z's shape and dtype."""
    if np.broadcast_shapes(z.shape, other.shape) == z.shape and np.result_type(z, other) == z.dtype:
        z += other
        return z
    return z + other


#: Attention after its projection on ``_native.mha`` (a unit a head on the kernel threads,
#: single-threaded sgemm calls) is a candidate where SciPy's BLAS is found, and its "tiles" form
#: (the Linear's 12 x 32 tiles, a unit 12 query rows) on AVX-512 builds where a head's value
#: width is a multiple of 32 (both measured against numpy's batched matmuls: ``_mha_kernel``)
_MHA_NATIVE = True


def _check_attention_bias(attention_bias, scores):
    """onnxruntime takes ([1|B], [1|H], S, T); here any 4-D bias that broadcasts onto the
    scores' shape without enlarging it (a superset of onnxruntime's shapes)."""
    try:
        fits = attention_bias.ndim == 4 and np.broadcast_shapes(attention_bias.shape, scores) == scores
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"Attention attention_bias of shape {attention_bias.shape} does not broadcast to "
                         f"the scores' shape {scores}")


def _full_t(a, s):
    """A mask or bias for ``_native.mha``: float32, contiguous, its last axis broadcast to ``s``,
    and its leading dims."""
    if a.shape[3] != s:
        a = np.broadcast_to(a, a.shape[:3] + (s,))
    a = np.ascontiguousarray(a, dtype=np.float32)
    return a, a.shape[:3]


def _mha_native(ctx, proj, b, s, sizes, h, dq, dv, sc, mask_index, filt, unidirectional, attention_bias,
                tiles=False):
    """``_native.mha`` on the projected (b, s, W) float32 ``proj`` (ours, contiguous): the same
    sums as the numpy path below, in another order (``tiles``: on the Linear's tiles instead of
    sgemm calls). The mask (from ``_mask_bias``) and a checked attention bias have dims of 1 or
    full: the kernel takes them as they are, their last axis broadcast to s."""
    m1 = m2 = d1 = d2 = None
    if mask_index is not None:
        m1, d1 = _full_t(_mask_bias(mask_index, b, s, s, filt)[:, None], s)
    if attention_bias is not None:
        m2, d2 = _full_t(attention_bias, s)
    y = np.empty((b, s, h * dv), np.float32)
    _native.mha(proj, (b, s, proj.shape[-1], 0, sizes[0], sizes[0] + sizes[1]), (h, dq, dv), float(sc),
                bool(unidirectional), m1, d1, m2, d2, y, getattr(ctx, "threads", 1), bool(tiles))
    return y


@kernel("Attention", 1, domain=MS, dtypes=_F32, check=_attention_check)
def attention(ctx, x, weights, bias=None, mask_index=None, past=None, attention_bias=None, *,
              num_heads, scale=0.0, mask_filter_value=-10000.0, unidirectional=0, qkv_hidden_sizes=None,
              do_rotary=0, past_present_share_buffer=0, rotary_embedding_dim=0):
    """Multi-head self-attention of onnxruntime's ``com.microsoft.Attention`` (no past)."""
    if x.ndim != 3:
        raise ValueError(f"Attention input must be [batch, sequence, hidden], got {x.shape}")
    b, s, _ = x.shape
    cache = getattr(ctx, "cache", None)
    fast = None if cache is None else cache.get("attention_fast")
    if (fast is not None and x.shape == fast[0] and weights is fast[1] and bias is fast[2] and type(x) is np.ndarray
            and x.dtype is _F32_DT and attention_bias is None and (mask_index is None) is fast[3]):
        # the node's last call again (its shape, weights and kernel choice): the projection and
        # _mha_native's call straight, without re-deriving what that call checked
        proj = fast_linear.linear(ctx, x, weights, bias=bias)
        if proj is not None:
            m1 = d1 = None
            if mask_index is not None:
                m1, d1 = _full_t(_mask_bias(mask_index, b, s, s, mask_filter_value)[:, None], s)
            y = np.empty(fast[4], np.float32)
            _native.mha(proj, fast[5], fast[6], fast[7], fast[8], m1, d1, None, None, y, fast[9], fast[10])
            return y
    heads_of = None if cache is None else cache.get("attention_heads")
    if heads_of is None or heads_of[0] != weights.shape[1]:
        # what the attributes and the weights' width fix, worked out on the node's first call
        sizes = list(qkv_hidden_sizes) if qkv_hidden_sizes else [weights.shape[1] // 3] * 3
        if sum(sizes) != weights.shape[1] or sizes[0] != sizes[1]:
            raise ValueError(f"Attention qkv_hidden_sizes {sizes} do not fit weights {weights.shape}")
        h = int(num_heads)
        dq, dv = sizes[0] // h, sizes[2] // h
        sc = np.float32(scale if scale else 1.0 / math.sqrt(dq))
        heads_of = (weights.shape[1], sizes, h, dq, dv, sc)
        if cache is not None:
            cache["attention_heads"] = heads_of
    _, sizes, h, dq, dv, sc = heads_of
    # one BLAS call over the folded batch (3-D @ 2-D would loop over the batch)
    proj = None
    if bias is None or (bias.shape == (weights.shape[1],) and _is_f32(bias)):
        proj = fast_linear.linear(ctx, x, weights, bias=None if bias is None else np.ascontiguousarray(bias))
    if proj is None:
        proj = (x.reshape(b * s, x.shape[-1]) @ weights).reshape(b, s, weights.shape[1])
        if bias is not None:
            proj = _add_into(proj, bias)
    if attention_bias is not None:
        _check_attention_bias(attention_bias, (b, h, s, s))
    heads = (proj, b, s, sizes, h, dq, dv, sc, mask_index, mask_filter_value, unidirectional, attention_bias)
    if _native is not None and type(proj) is np.ndarray and _is_f32(proj) and b * s:
        kind = _mha_kernel(ctx, *heads)
        if kind != "numpy":
            y = _mha_native(ctx, *heads, tiles=kind == "tiles")
            if (cache is not None and attention_bias is None and type(x) is np.ndarray and x.dtype is _F32_DT
                    and _is_const(ctx, 1, weights) and (bias is None or (
                        type(bias) is np.ndarray and bias.dtype is _F32_DT and bias.flags.c_contiguous
                        and bias.shape == (weights.shape[1],)))):
                cache["attention_fast"] = (x.shape, weights, bias, mask_index is None, y.shape,
                                           (b, s, proj.shape[-1], 0, sizes[0], sizes[0] + sizes[1]), (h, dq, dv),
                                           float(sc), bool(unidirectional), getattr(ctx, "threads", 1), kind == "tiles")
            return y if y.dtype is x.dtype else y.astype(x.dtype, copy=False)
    return _mha_numpy(*heads).astype(x.dtype, copy=False)


def _mha_kernel(ctx, proj, b, s, sizes, h, dq, dv, *rest):
    """"native" (``_native.mha``), "tiles" (its tiles form) or "numpy" (batched matmuls, the library call) for this
    node's shape: forced by the policy, cached, or measured on ``proj`` (each candidate on a
    copy: numpy's path scales q in place)."""
    cache = getattr(ctx, "cache", None)
    shape = (b, s, h, dq, dv, int(rest[1] is not None), int(bool(rest[3])), int(rest[4] is not None))
    known = None if cache is None else cache.get("mha", {}).get(shape)
    if known is not None:
        return known
    names = ["numpy"]
    if (_MHA_NATIVE and proj.flags.c_contiguous and sizes[0] % h == 0 and sizes[2] % h == 0
            and _sgemm_ready()):
        names.append("native")
    if (_MHA_NATIVE and proj.flags.c_contiguous and sizes[0] % h == 0 and sizes[2] % h == 0 and dv % 32 == 0
            and getattr(_native, "CONV_FAST", 0)):
        names.append("tiles")
    threads = getattr(ctx, "threads", 1)
    key = _autotune.cache_key("mha", shape, "float32", threads)
    name = _autotune.decide("mha", key, names, "numpy", getattr(ctx, "tune", True))
    if name is None:
        copies = [proj.copy() for _ in range(len(names) * (1 + _autotune.ROUNDS))]

        def runner(fn):
            def run():
                p = copies.pop() if copies else proj.copy()
                fn(p)
            return run

        runs = {"numpy": lambda p: _mha_numpy(p, b, s, sizes, h, dq, dv, *rest),
                "native": lambda p: _mha_native(ctx, p, b, s, sizes, h, dq, dv, *rest),
                "tiles": lambda p: _mha_native(ctx, p, b, s, sizes, h, dq, dv, *rest, tiles=True)}
        name, _ = _autotune.measure(key, {n: runner(runs[n]) for n in names})
    _autotune.note(ctx, f"batch {b} sequence {s}", name)
    if cache is not None:
        cache.setdefault("mha", {})[shape] = name
    return name


def _mha_numpy(proj, b, s, sizes, h, dq, dv, sc, mask_index, mask_filter_value, unidirectional, attention_bias):
    """Attention after its projection in numpy: one batched matmul for the scores and one for
    the values (``proj`` is ours: q is scaled in place)."""
    q, k, v = np.split(proj, [sizes[0], sizes[0] + sizes[1]], axis=-1)
    q = q.reshape(b, s, h, dq).transpose(0, 2, 1, 3)
    k = k.reshape(b, s, h, dq).transpose(0, 2, 3, 1)
    v = v.reshape(b, s, h, dv).transpose(0, 2, 1, 3)
    if math.frexp(float(sc))[0] == 0.5:
        # a power of two (1/8 for heads of 64): scaling q first is exact (short of subnormals)
        # and touches s * dq elements per head instead of the scores' s * t (q views our proj)
        q *= sc
        z = q @ k
    else:
        z = q @ k
        z *= sc
    t = s
    if mask_index is not None:
        z = _add_into(z, _mask_bias(mask_index, b, s, t, mask_filter_value)[:, None])
    if unidirectional:
        future = np.triu(np.ones((s, t), dtype=bool), 1)
        z = np.where(future, np.float32(np.finfo(np.float32).min), z)
    if attention_bias is not None:  # checked by the caller
        z = _add_into(z, attention_bias)
    with ignore_fp():
        # z is ours (a fresh matmul result, or np.where's): normalised in place
        p = _softmax_inplace(z) if z.dtype == np.float32 else _softmax(z.astype(np.float32))
    return (p @ v).transpose(0, 2, 1, 3).reshape(b, s, h * dv)
