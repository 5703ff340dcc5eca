"""CPU kernels: elementwise unary math, activations and Clip (and the float32 erf/Gelu passes
the fused kernels share).

Every kernel is registered for the ONNX schema since-versions whose semantics it
implements exactly, from the op's oldest version on; ``consumed_inputs`` (an opset-1
memory hint) has no effect on values and is ignored. Each kernel's ``check`` declines
nodes whose input dtypes the node's schema version does not allow (:mod:`._dtypes`).

Low-precision floats without native numpy arithmetic (bfloat16, float8, ...)
are computed in float32 and rounded back; float16 uses numpy's float16 loops
for single ufuncs and float32 for composite formulas (activations).

Binary arithmetic, logic, comparisons and the variadic ops are in :mod:`.arith`; Cast,
CastLike and BitCast in :mod:`.casting`.
"""

from __future__ import annotations

import math

import numpy as np

from ..executable import inplace_variant
from ._dtypes import _F16, _F32, _F64, _IGNORE, _ML_FLOATS, _formula, _in_dtype, _is_float, _lowp, _ufunc1, _up, reg

# the compiled kernels (None without them, or with RUNTIME_CORE_CPU_NATIVE=0: the numpy blocks below)
from ..fast.policy import NATIVE as _native
from ._common import ignore_fp

# -- unary math --------------------------------------------------------------

def _unary(op: str, versions: tuple, f, inplace=None, extra=None):
    """Register ``f(x)`` for ``versions`` (opset-1 versions add consumed_inputs, ignored).
    ``inplace(x)``: the same result written into a float ``x`` the executable hands over;
    ``extra``: the kernel's further check (``reg``)."""
    fn = _ufunc1(f)

    def k(ctx, x, *, consumed_inputs=None):
        return fn(x)  # the executable ignores floating-point warnings around every run
    k.__name__ = op.lower()
    reg(op, *versions, extra=extra)(k)
    if inplace is not None:
        @inplace_variant(k, 0)
        def k_inplace(ctx, owned, x, *, consumed_inputs=None):
            return inplace(x) if x.dtype.kind == "f" else fn(x)


def _ufunc_out(f):
    return lambda x: f(x, out=x)


# erf for float32: Eigen's rational approximation (the one TensorFlow and PyTorch use on CPU),
# evaluated with numpy's SIMD loops. scipy's float32 erf is a scalar loop through double (about
# 18 ns an element, 7 ms for a 128x3072 BERT activation); this is about 1 ms. The approximation
# itself is within 7e-8 of erf; evaluated in float32 the result is within 4.5e-7 (a few ulp of 1).
_ERF_P = tuple(np.float32(c) for c in (
    -2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
    -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02))
_ERF_Q = tuple(np.float32(c) for c in (
    -1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
    -1.42647390514189e-02))
_F32_4 = np.float32(4.0)


_BLOCK = 65536  # elements per block: a block's four temporaries (256 KiB each) stay in cache


#: the numerator's coefficients halved (exactly): erf(a) / 2
_ERF_P_HALF = tuple(c * np.float32(0.5) for c in _ERF_P)


def _erf_block(a, x2, p, q, pc=_ERF_P):
    """erf of the float32 block ``a`` (already clipped to [-4, 4]) into ``a``; x2/p/q: scratch.
    ``pc``: the numerator's coefficients (``_ERF_P_HALF`` gives erf / 2)."""
    np.multiply(a, a, out=x2)
    np.multiply(x2, pc[0], out=p)
    p += pc[1]
    for c in pc[2:]:
        p *= x2
        p += c
    p *= a
    np.multiply(x2, _ERF_Q[0], out=q)
    q += _ERF_Q[1]
    for c in _ERF_Q[2:]:
        q *= x2
        q += c
    np.divide(p, q, out=a)


def _blocks(x, out):
    """Flat contiguous views of ``x`` and of the result array (``out``, or a new one)."""
    xc = np.ascontiguousarray(x)
    if out is None or not out.flags.c_contiguous:
        res = np.empty(x.shape, dtype=np.float32)
    else:
        res = out
    return xc.reshape(-1), res, res.reshape(-1)


def _into(out, res):
    """The result of a blocked kernel: ``res``, copied into ``out`` when that was not it."""
    if out is not None and res is not out:
        out[...] = res
        return out
    return res


def erf_f32(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """erf of a float32 array (``out`` may be ``x`` itself, or another float32 array of its shape).

    Computed block by block so that the polynomial's temporaries stay in cache (and are
    allocated once per call, not once per term): no large temporaries, no page faults."""
    xf, res, rf = _blocks(x, out)
    n = xf.size
    m = min(n, _BLOCK)
    x2, p, q = np.empty(m, np.float32), np.empty(m, np.float32), np.empty(m, np.float32)
    for i in range(0, n, _BLOCK):
        j = min(i + _BLOCK, n)
        k = j - i
        a = np.clip(xf[i:j], -_F32_4, _F32_4, out=rf[i:j])  # erf(+-4) rounds to +-1; nan stays nan
        _erf_block(a, x2[:k], p[:k], q[:k])
    return _into(out, res)


def _gelu_native(x, bias, out, tanh_form, threads=1):
    """Gelu of float32 ``x`` (+ ``bias``) in the compiled pass (``_native.gelu_erf``, its rows split
    over ``threads`` kernel threads), into ``out`` when it can hold the result; the erf form, or
    the tanh form with ``tanh_form``."""
    d = x.shape[-1] if x.ndim else 1
    xc = np.ascontiguousarray(x)
    res = out if (out is not None and out.dtype is _F32 and out.shape == x.shape
                  and out.flags.c_contiguous) else np.empty(x.shape, _F32)
    # ascontiguousarray with a dtype costs ~1 us more than the test that it has nothing to do
    bc = bias if bias is None or (type(bias) is np.ndarray and bias.dtype is _F32 and bias.flags.c_contiguous) \
        else np.ascontiguousarray(bias, dtype=_F32)
    _native.gelu_erf(xc, bc, res, (xc.size // max(d, 1), d), tanh_form, max(int(threads), 1))
    return _into(out, res)


def gelu_erf_f32(x: np.ndarray, out: np.ndarray | None = None, bias: np.ndarray | None = None,
                 native: bool = True, threads: int = 1) -> np.ndarray:
    """0.5 * s * (1 + erf(s / sqrt(2))) of a float32 array, s = x (+ ``bias``, a float32
    vector of x's last dim), ``out`` may be x.

    With the compiled extension this is one pass (``_native.gelu_erf``, the same rational
    erf); otherwise (or ``native=False``) block by block in numpy: the 0.5 is folded into the
    numerator's coefficients (a power of two: exact), so a block is
    ``s * (0.5 + erf(s / sqrt(2)) / 2)``; s is read again only by the last multiply, so no
    copy of it is kept even when the result overwrites it."""
    if native and _native is not None and x.dtype == _F32:
        return _gelu_native(x, bias, out, False, threads)
    if bias is not None:
        x = np.add(x, bias, out=out if out is not None and out.shape == x.shape else None)
    xf, res, rf = _blocks(x, out)
    n = xf.size
    m = min(n, _BLOCK)
    x2, p, q, a = (np.empty(m, np.float32) for _ in range(4))
    c = np.float32(1.0 / math.sqrt(2.0))
    for i in range(0, n, _BLOCK):
        j = min(i + _BLOCK, n)
        k = j - i
        ab = np.multiply(xf[i:j], c, out=a[:k])
        np.clip(ab, -_F32_4, _F32_4, out=ab)
        _erf_block(ab, x2[:k], p[:k], q[:k], _ERF_P_HALF)
        ab += np.float32(0.5)
        np.multiply(ab, xf[i:j], out=rf[i:j])
    return _into(out, res)


# Gelu's tanh form 0.5 * x * (1 + tanh(u)), u = sqrt(2/pi) * (x + 0.044715 x^3), is
# x * sigmoid(2u) = x / (1 + exp(-2u)): one exp instead of a tanh (numpy's float32 tanh is a
# scalar loop on AVX2, ~3 ns an element; exp is vectorized, ~1.8) and four fewer passes. It is
# also the better-conditioned form: 1 + tanh(u) cancels for negative x, the sigmoid does not.
_GT_B = np.float32(-2.0 * math.sqrt(2.0 / math.pi))
_GT_A = np.float32(-2.0 * math.sqrt(2.0 / math.pi) * 0.044715)
_F32_1 = np.float32(1.0)


def gelu_tanh_f32(x: np.ndarray, bias: np.ndarray | None = None,
                  out: np.ndarray | None = None, native: bool = True, threads: int = 1) -> np.ndarray:
    """Gelu's tanh approximation of float32 ``x`` (plus ``bias``, a vector of x's last dim);
    ``out`` may be x. With the compiled extension one pass (``_native.gelu_erf`` with
    ``tanh_form``), otherwise (or ``native=False``) numpy in cache-sized blocks of whole rows."""
    if native and _native is not None and x.dtype == _F32:
        # compiled: the same formula in one pass (128x3072 with a bias: 1.1 -> 0.4 ms)
        return _gelu_native(x, bias, out, True, threads)
    xf, res, rf = _blocks(x, out)
    d = max(x.shape[-1], 1) if x.ndim else 1  # rows of d: the bias broadcasts over each block
    rows = xf.size // d
    x2, r2 = xf.reshape(rows, d), rf.reshape(rows, d)
    br = max(1, _BLOCK // d)
    m = min(rows, br)
    t = np.empty((m, d), np.float32)
    s = np.empty((m, d), np.float32) if bias is not None else None
    for i in range(0, rows, br):
        j = min(i + br, rows)
        k = j - i
        xb = x2[i:j] if bias is None else np.add(x2[i:j], bias, out=s[:k])
        tb = np.multiply(xb, xb, out=t[:k])
        tb *= _GT_A
        tb += _GT_B
        tb *= xb  # -2u
        np.exp(tb, out=tb)
        tb += _F32_1
        np.divide(xb, tb, out=r2[i:j])
    return _into(out, res)


def _erf(x):
    if x.dtype == _F32:
        return erf_f32(x)
    from scipy.special import erf

    r = erf(x)
    return r if r.dtype == x.dtype else r.astype(x.dtype)


def _erf_f64_import(node):
    """float64 Erf and Gelu run scipy's erf: its import (about 0.1 s) happens while the session
    is built, where the node's dtype is known, instead of in the session's first run."""
    if _in_dtype(node, 0) == _F64:
        import scipy.special  # noqa: F401
    return None


def _erf_any(x):
    if x.dtype.kind != "f" or x.dtype == _F16:
        return _erf(x.astype(_F32)).astype(x.dtype)
    return _erf(x)


for _op, _f in (("Abs", np.abs), ("Neg", np.negative), ("Exp", np.exp), ("Log", np.log),
                ("Sqrt", np.sqrt), ("Reciprocal", np.reciprocal), ("Floor", np.floor), ("Ceil", np.ceil),
                ("Tanh", np.tanh)):
    _unary(_op, (1, 6, 13), _f, _ufunc_out(_f))
_unary("Round", (11, 22), np.rint)  # round half to even
_unary("Sign", (9, 13), np.sign)
for _op, _f in (("Sin", np.sin), ("Cos", np.cos), ("Tan", np.tan), ("Asin", np.arcsin),
                ("Acos", np.arccos), ("Atan", np.arctan)):
    _unary(_op, (7, 22), _f)
for _op, _f in (("Sinh", np.sinh), ("Cosh", np.cosh), ("Asinh", np.arcsinh), ("Acosh", np.arccosh),
                ("Atanh", np.arctanh)):
    _unary(_op, (9, 22), _f)
_unary("Erf", (9, 13), _erf_any, lambda x: erf_f32(x, out=x) if x.dtype == _F32 else _erf_any(x),
       extra=_erf_f64_import)
_unary("Not", (1,), np.logical_not)
_unary("BitwiseNot", (18,), np.invert)


@reg("IsNaN", 9, 13, 20)
def isnan(ctx, x):
    return np.isnan(x.astype(_F32) if x.dtype in _ML_FLOATS else x)


@reg("IsInf", 10, 20)
def isinf(ctx, x, *, detect_negative, detect_positive):
    if x.dtype in _ML_FLOATS:
        x = x.astype(_F32)
    if detect_negative and detect_positive:
        return np.isinf(x)
    if detect_positive:
        return np.isposinf(x)
    if detect_negative:
        return np.isneginf(x)
    return np.zeros(x.shape, dtype=bool)


# -- activations ---------------------------------------------------------------

def _sigmoid_f(x):
    """1 / (1 + exp(-x)): the compiled pass for float32, else numpy's loops in place (no scipy:
    importing scipy.special on a session's first Sigmoid cost more than the run)."""
    if x.dtype == _F32 and _native is not None and x.size:
        xc = np.ascontiguousarray(x)
        r = np.empty(x.shape, _F32)
        _native.activate(xc, r, xc.size, 2)
        return r
    r = np.negative(x, out=np.empty(x.shape, x.dtype))  # exp(-x) -> inf: 1 / inf = 0, as expit
    np.exp(r, out=r)
    r += r.dtype.type(1)
    return np.reciprocal(r, out=r)


_sigmoid = _formula(_sigmoid_f)


def _activation(op, versions, f, attrs=()):
    """Register ``f(x, *attrs)`` (evaluated in float32 for low-precision floats)."""
    fn = _formula(f)

    def k(ctx, x, *, consumed_inputs=None, **kw):
        return fn(x, *[kw[a] for a in attrs])
    k.__name__ = op.lower()
    reg(op, *versions)(k)


def _relu(x):
    return np.maximum(x, x.dtype.type(0))


@reg("Relu", 1, 6, 13, 14)
def relu(ctx, x, *, consumed_inputs=None):
    # exact in every dtype: no float32 detour for float16
    if x.dtype in _ML_FLOATS:
        return _relu(x.astype(_F32)).astype(x.dtype)
    return _relu(x)


@inplace_variant(relu, 0)
def relu_inplace(ctx, owned, x, *, consumed_inputs=None):
    if x.dtype.kind in "fi":
        return np.maximum(x, x.dtype.type(0), out=x)
    return relu(ctx, x)


def _leaky(x, alpha):
    return np.where(x < 0, x * x.dtype.type(alpha), x)


def _elu(x, alpha):
    return np.where(x < 0, x.dtype.type(alpha) * np.expm1(x), x)


def _selu(x, alpha, gamma):
    a, g = x.dtype.type(alpha), x.dtype.type(gamma)
    return np.where(x > 0, g * x, (g * a) * np.expm1(x))


def _celu(x, alpha):
    a = x.dtype.type(alpha)
    return np.maximum(x, 0) + np.minimum(0, a * np.expm1(x / a))


def _native_activate(x, kind, alpha=1.0 / 6.0, beta=0.5):
    """``_native.activate``'s one pass of ``kind`` over float32 ``x`` into a new array (a step that
    did not fuse into its convolution: numpy's three or four passes and their code cost several
    times more there), or None where it does not apply."""
    if type(x) is not np.ndarray or x.dtype != _F32 or _native is None or not x.size:  # host arrays only
        return None
    xc = np.ascontiguousarray(x)
    r = np.empty(x.shape, _F32)
    _native.activate(xc, r, xc.size, kind, float(alpha), float(beta))
    return r


def _hard_sigmoid(x, alpha, beta):
    r = _native_activate(x, 1, alpha, beta)
    if r is not None:
        return r
    y = x * x.dtype.type(alpha)
    y += x.dtype.type(beta)
    return np.clip(y, 0, 1, out=y)


def _hard_swish(x):
    r = _native_activate(x, 0)
    if r is not None:
        return r
    y = x * x.dtype.type(1.0 / 6.0)
    y += x.dtype.type(0.5)
    np.clip(y, 0, 1, out=y)
    y *= x
    return y


def _softplus(x):
    # log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)): stable, and far faster than np.logaddexp
    y = np.abs(x)
    np.negative(y, out=y)
    np.exp(y, out=y)
    np.log1p(y, out=y)
    y += np.maximum(x, x.dtype.type(0))
    return y


def _softsign(x):
    d = np.abs(x)
    d += x.dtype.type(1)
    return np.divide(x, d, out=d)


def _thresholded(x, alpha):
    return np.where(x > x.dtype.type(alpha), x, x.dtype.type(0))


def _mish(x):
    y = _softplus(x)
    np.tanh(y, out=y)
    y *= x
    return y


def _swish(x, alpha):
    return x * _sigmoid_f(x * x.dtype.type(alpha))


_activation("LeakyRelu", (1, 6, 16), _leaky, ("alpha",))
_activation("Elu", (1, 6, 22), _elu, ("alpha",))
_activation("Selu", (1, 6, 22), _selu, ("alpha", "gamma"))
_activation("Celu", (12, 28), _celu, ("alpha",))
_activation("Sigmoid", (1, 6, 13), _sigmoid_f)
_activation("HardSigmoid", (1, 6, 22), _hard_sigmoid, ("alpha", "beta"))
_activation("HardSwish", (14, 22), _hard_swish)
_activation("Softplus", (1, 22), _softplus)
_activation("Softsign", (1, 22), _softsign)
_activation("ThresholdedRelu", (10, 22), _thresholded, ("alpha",))
_activation("Mish", (18, 22), _mish)
_activation("Swish", (24,), _swish, ("alpha",))


def _gelu_check(node):
    if node.attrs.get("approximate") not in ("none", "tanh"):
        return f"Gelu approximate={node.attrs.get('approximate')!r} is not defined (use 'none' or 'tanh')"
    return _erf_f64_import(node)  # the erf form in float64


def _gelu_f(x, approximate):
    t = x.dtype.type
    if approximate == "tanh" and x.dtype == _F32:
        return gelu_tanh_f32(x)
    if approximate == "tanh":
        inner = x * x
        inner *= t(0.044715)
        inner += t(1)
        inner *= x
        inner *= t(math.sqrt(2.0 / math.pi))
        y = np.tanh(inner, out=inner)
    elif x.dtype == _F32:
        return gelu_erf_f32(x)
    else:
        y = _erf(x * t(1.0 / math.sqrt(2.0)))
    y += t(1)
    y *= x
    y *= t(0.5)
    return y


_gelu = _formula(_gelu_f)


@reg("Gelu", 20, extra=_gelu_check)
def gelu(ctx, x, *, approximate):
    with ignore_fp(**_IGNORE):
        return _gelu(x, approximate)


@reg("Shrink", 9)
def shrink(ctx, x, *, bias, lambd):
    if _is_float(x.dtype):
        xf = _up(x)
        t = xf.dtype.type
        y = np.where(xf < t(-lambd), xf + t(bias), np.where(xf > t(lambd), xf - t(bias), t(0)))
        return y.astype(x.dtype, copy=False)
    # integer input: compare and shift in float64, results cast back to the input type
    xf = x.astype(_F64)
    y = np.where(xf < -lambd, xf + bias, np.where(xf > lambd, xf - bias, 0.0))
    with ignore_fp(**_IGNORE):
        return y.astype(x.dtype)


def _prelu_f(x, slope):
    return np.where(x < 0, x * slope, x)


def _prelu_old_check(node):
    info = node.input_info[1] if len(node.input_info) > 1 else None
    shape = info.static_shape if info is not None else None
    if shape is None or not (int(np.prod(shape, dtype=np.int64)) == 1 or len(shape) == 1):
        return (f"PRelu-{node.since_version} is implemented for a slope of size 1 (shared) or a 1-D slope "
                f"(one value per channel, axis 1); the spec before opset 7 defines no broadcasting rule "
                f"for other slopes; slope shape is "
                f"{'unknown' if info is None or info.shape is None else tuple(info.shape)}")
    return None


@reg("PRelu", 1, 6, extra=_prelu_old_check)
def prelu_1(ctx, x, slope, *, consumed_inputs=None):
    # "If slope is of size 1, the value is shared across different channels"; else one slope
    # per channel (axis 1), as the opset-6 test data (pytorch-converted PReLU_*_multiparam)
    if slope.size == 1:
        return prelu(ctx, x, slope.reshape(()))
    if slope.ndim != 1 or x.ndim < 2 or slope.shape[0] != x.shape[1]:
        raise ValueError(f"PRelu-{ctx.node.since_version}: a slope of shape {slope.shape} must have size 1 or "
                         f"one value per channel (X's axis 1 of shape {x.shape})")
    return prelu(ctx, x, slope.reshape((-1,) + (1,) * (x.ndim - 2)))


@reg("PRelu", 7, 9, 16)
def prelu(ctx, x, slope):
    # unidirectional broadcasting: the output has X's shape
    if np.broadcast_shapes(x.shape, slope.shape) != x.shape:
        raise ValueError(f"slope of shape {slope.shape} does not broadcast to X's shape {x.shape}")
    if _lowp(x.dtype):
        return _prelu_f(x.astype(_F32), slope.astype(_F32)).astype(x.dtype)
    return _prelu_f(x, slope)


# -- Clip --------------------------------------------------------------------

def _clip_attr(x, lo, hi):
    xf = _up(x)
    if xf.dtype.kind == "f":
        fi = np.finfo(xf.dtype)
        if lo is not None and lo <= float(fi.min):
            lo = None
        if hi is not None and hi >= float(fi.max):
            hi = None
    if lo is None and hi is None:
        return x
    t = xf.dtype.type
    y = xf
    if lo is not None:
        y = np.maximum(y, t(lo))
    if hi is not None:
        y = np.minimum(y, t(hi))
    return y.astype(x.dtype, copy=False)


@reg("Clip", 1)
def clip_1(ctx, x, *, consumed_inputs=None, max=None, min=None):
    return _clip_attr(x, min, max)


@reg("Clip", 6)
def clip_6(ctx, x, *, max, min):
    return _clip_attr(x, min, max)


def _scalar(v, name):
    if v.size != 1:
        raise ValueError(f"Clip {name} must be a scalar, got shape {v.shape}")
    return v.reshape(())


def _clip11(x, lo, hi, out=None):
    if lo is None and hi is None:
        return x
    ml = x.dtype in _ML_FLOATS
    y = x.astype(_F32) if ml else x
    lo = None if lo is None else _scalar(lo, "min").astype(y.dtype, copy=False)
    hi = None if hi is None else _scalar(hi, "max").astype(y.dtype, copy=False)
    if lo is not None and hi is not None:
        # min(max(x, lo), hi), nan kept (the onnx reference is np.clip itself); one pass, and
        # numpy's clip loop is several times faster than maximum then minimum
        y = np.clip(y, lo, hi, out=out)
    elif lo is not None:
        y = np.maximum(y, lo, out=out)
    else:
        y = np.minimum(y, hi, out=out)
    return y.astype(x.dtype) if ml else y


@reg("Clip", 11, 12, 13)
def clip_11(ctx, x, min=None, max=None):
    return _clip11(x, min, max)


@inplace_variant(clip_11, 0)
def clip_11_inplace(ctx, owned, x, min=None, max=None):
    if min is None and max is None:
        return x
    return _clip11(x, min, max, out=None if x.dtype in _ML_FLOATS else x)
