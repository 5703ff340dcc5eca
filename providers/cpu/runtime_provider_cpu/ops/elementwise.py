"""CPU kernels: elementwise math, activations, logic, comparisons, variadic ops, Cast.

Every kernel is registered for the ONNX schema since-versions whose semantics it
implements exactly, from the op's oldest version on. Old (opset < 7) binary ops
with the ``broadcast``/``axis`` attributes are implemented with their limited
broadcasting rule; ``consumed_inputs`` (an opset-1 memory hint) has no effect on
values and is ignored.

Each kernel's ``check`` declines nodes whose input dtypes the node's schema
version does not allow (with the allowed list), and a few attribute values
that are not implemented (see ``_cast_target_reason`` and ``_mod_check``).

Low-precision floats without native numpy arithmetic (bfloat16, float8, ...)
are computed in float32 and rounded back; float16 uses numpy's float16 loops
for single ufuncs and float32 for composite formulas (activations).
"""

from __future__ import annotations

import functools
import math

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper

from ..executable import inplace_variant
from ..registry import kernel
from .casting import to_subbyte_int

# the compiled kernels (None without them, or with RUNTIME_CORE_CPU_NATIVE=0: the numpy blocks below)
from ..fast.policy import NATIVE as _native

# -- dtype helpers -----------------------------------------------------------

_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_OBJ = np.dtype(object)
_BF16 = np.dtype(ml_dtypes.bfloat16)
_F8 = {
    np.dtype(ml_dtypes.float8_e4m3fn): TensorProto.FLOAT8E4M3FN,
    np.dtype(ml_dtypes.float8_e4m3fnuz): TensorProto.FLOAT8E4M3FNUZ,
    np.dtype(ml_dtypes.float8_e5m2): TensorProto.FLOAT8E5M2,
    np.dtype(ml_dtypes.float8_e5m2fnuz): TensorProto.FLOAT8E5M2FNUZ,
}
_F8_FNUZ = {np.dtype(ml_dtypes.float8_e4m3fnuz), np.dtype(ml_dtypes.float8_e5m2fnuz)}
_F4 = np.dtype(ml_dtypes.float4_e2m1fn)
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
_F6 = {np.dtype(getattr(ml_dtypes, n)) for n in ("float6_e2m3fn", "float6_e3m2fn") if hasattr(ml_dtypes, n)}
#: floats numpy has no native arithmetic for: computed in float32
_ML_FLOATS = frozenset({_BF16, _F4, _E8M0, *_F8, *_F6})
#: sub-byte integers (ml_dtypes): computed as int8/uint8
_ML_INTS = {
    np.dtype(ml_dtypes.int4): np.dtype(np.int8), np.dtype(ml_dtypes.uint4): np.dtype(np.uint8),
    np.dtype(ml_dtypes.int2): np.dtype(np.int8), np.dtype(ml_dtypes.uint2): np.dtype(np.uint8),
}


def _is_float(dt: np.dtype) -> bool:
    return dt.kind == "f" or dt in _ML_FLOATS


def _lowp(dt: np.dtype) -> bool:
    """Dtypes whose composite formulas run in float32 (then round back)."""
    return dt == _F16 or dt in _ML_FLOATS


def _up(x: np.ndarray) -> np.ndarray:
    """float32 view of a low-precision float array (others unchanged)."""
    return x.astype(_F32) if _lowp(x.dtype) else x


def _ufunc1(f):
    """Apply a numpy ufunc; ml_dtypes floats go through float32."""
    def run(x):
        if x.dtype in _ML_FLOATS:
            return f(x.astype(_F32)).astype(x.dtype)
        return f(x)
    return run


def _formula(f):
    """Apply a composite float formula in float32 for low-precision inputs."""
    def run(x, *args):
        if _lowp(x.dtype):
            return f(x.astype(_F32), *args).astype(x.dtype)
        return f(x, *args)
    return run


# -- schema-driven dtype checks ---------------------------------------------

def _type_str_dtype(s: str):
    if not (s.startswith("tensor(") and s.endswith(")")):
        return None
    name = s[7:-1]
    try:
        elem = TensorProto.DataType.Value(name.upper())
    except ValueError:
        return None
    if elem == TensorProto.STRING:
        return _OBJ
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem))
    except Exception:  # noqa: BLE001 - a type numpy cannot hold
        return None


@functools.lru_cache(maxsize=None)
def _schema_types(op: str, version: int):
    """(formal inputs as (name, type_str, variadic), type param -> allowed dtypes, outputs)."""
    s = onnx.defs.get_schema(op, version, "")
    tc = {}
    for t in s.type_constraints:
        tc[t.type_param_str] = frozenset(d for d in (_type_str_dtype(x) for x in t.allowed_type_strs)
                                         if d is not None)
    formal = tuple((f.name, f.type_str, f.option == onnx.defs.OpSchema.FormalParameterOption.Variadic)
                   for f in s.inputs)
    outs = tuple((f.name, f.type_str) for f in s.outputs)
    return formal, tc, outs


def _allowed(tc, type_str):
    if type_str in tc:
        return tc[type_str]
    d = _type_str_dtype(type_str)
    return frozenset({d}) if d is not None else None


def _fmt_dtypes(ds) -> str:
    return ", ".join(sorted(np.dtype(d).name for d in ds))


def _type_reason(node) -> str | None:
    """Why ``node``'s input dtypes are not what its schema version allows, or None."""
    formal, tc, _ = _schema_types(node.op_type, node.since_version)
    seen: dict[str, tuple[str, np.dtype]] = {}
    for i, info in enumerate(node.input_info):
        if info is None or info.dtype is None or not formal:
            continue
        if i < len(formal):
            name, type_str, _var = formal[i]
        elif formal[-1][2]:
            name, type_str, _var = formal[-1]
            name = f"{name}[{i - len(formal) + 1}]"
        else:
            continue
        dt = np.dtype(info.dtype)
        allowed = _allowed(tc, type_str)
        if allowed is not None and dt not in allowed:
            return (f"{node.op_type}-{node.since_version} input {name!r} has dtype {dt.name}, which this "
                    f"version does not accept (allowed: {_fmt_dtypes(allowed)})")
        if type_str in tc:
            if type_str in seen and seen[type_str][1] != dt:
                other, odt = seen[type_str]
                return (f"{node.op_type}-{node.since_version} inputs {other!r} ({odt.name}) and {name!r} "
                        f"({dt.name}) must have the same type {type_str}")
            seen.setdefault(type_str, (name, dt))
    return None


def _checker(extra=None):
    def check(node):
        why = _type_reason(node)
        if why is None and extra is not None:
            why = extra(node)
        return why
    return check


def reg(op: str, *versions: int, extra=None):
    """``kernel(op, *versions)`` with the schema dtype check (plus ``extra``)."""
    return kernel(op, *versions, check=_checker(extra))


def _in_dtype(node, i):
    if i < len(node.input_info) and node.input_info[i] is not None and node.input_info[i].dtype is not None:
        return np.dtype(node.input_info[i].dtype)
    return None


_IGNORE = dict(all="ignore")


# -- unary math --------------------------------------------------------------

def _unary(op: str, versions: tuple, f, inplace=None):
    """Register ``f(x)`` for ``versions`` (opset-1 versions add consumed_inputs, ignored).
    ``inplace(x)``: the same result written into a float ``x`` the executable hands over."""
    fn = _ufunc1(f)

    def k(ctx, x, *, consumed_inputs=None):
        return fn(x)  # the executable ignores floating-point warnings around every run
    k.__name__ = op.lower()
    reg(op, *versions)(k)
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


def _gelu_native(x, bias, out, tanh_form):
    """Gelu of float32 ``x`` (+ ``bias``) in the compiled pass (``_native.gelu_erf``), into
    ``out`` when it can hold the result; the erf form, or the tanh form with ``tanh_form``."""
    d = x.shape[-1] if x.ndim else 1
    xc = np.ascontiguousarray(x)
    res = out if (out is not None and out.dtype == _F32 and out.shape == x.shape
                  and out.flags.c_contiguous) else np.empty(x.shape, _F32)
    bc = None if bias is None else np.ascontiguousarray(bias, dtype=_F32)
    _native.gelu_erf(xc, bc, res, (xc.size // max(d, 1), d), tanh_form)
    return _into(out, res)


def gelu_erf_f32(x: np.ndarray, out: np.ndarray | None = None, bias: np.ndarray | None = None,
                 native: bool = True) -> np.ndarray:
    """0.5 * s * (1 + erf(s / sqrt(2))) of a float32 array, s = x (+ ``bias``, a float32
    vector of x's last dim), ``out`` may be x.

    With the compiled extension this is one pass (``_native.gelu_erf``, the same rational
    erf); otherwise (or ``native=False``) block by block in numpy: the 0.5 is folded into the
    numerator's coefficients (a power of two: exact), so a block is
    ``s * (0.5 + erf(s / sqrt(2)) / 2)``; s is read again only by the last multiply, so no
    copy of it is kept even when the result overwrites it."""
    if native and _native is not None and x.dtype == _F32:
        return _gelu_native(x, bias, out, False)
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
                  out: np.ndarray | None = None, native: bool = True) -> np.ndarray:
    """Gelu's tanh approximation of float32 ``x`` (plus ``bias``, a vector of x's last dim);
    ``out`` may be x. With the compiled extension one pass (``_native.gelu_erf`` with
    ``tanh_form``), otherwise (or ``native=False``) numpy in cache-sized blocks of whole rows."""
    if native and _native is not None and x.dtype == _F32:
        # compiled: the same formula in one pass (128x3072 with a bias: 1.1 -> 0.4 ms)
        return _gelu_native(x, bias, out, True)
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
_unary("Erf", (9, 13), _erf_any, lambda x: erf_f32(x, out=x) if x.dtype == _F32 else _erf_any(x))
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
    from scipy.special import expit

    r = expit(x)
    return r if r.dtype == x.dtype else r.astype(x.dtype)


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


def _hard_sigmoid(x, alpha, beta):
    y = x * x.dtype.type(alpha)
    y += x.dtype.type(beta)
    return np.clip(y, 0, 1, out=y)


def _hard_swish(x):
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
    return None


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
    with np.errstate(**_IGNORE):
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
    with np.errstate(**_IGNORE):
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


# -- binary arithmetic ---------------------------------------------------------

def _legacy_b(a: np.ndarray, b: np.ndarray, broadcast, axis) -> np.ndarray:
    """Opset < 7 broadcasting: B (right-hand side) broadcast to A's shape."""
    if not broadcast:
        if a.shape != b.shape:
            raise ValueError(f"broadcast=0 needs equal shapes, got {a.shape} and {b.shape} "
                             "(set broadcast=1 to broadcast B)")
        return b
    if b.size == 1:
        return b.reshape(())
    if b.ndim > a.ndim:
        raise ValueError(f"B of shape {b.shape} cannot be broadcast to A of shape {a.shape}")
    if axis is None:
        start = a.ndim - b.ndim
    else:
        start = axis + a.ndim if axis < 0 else axis
    seg = a.shape[start:start + b.ndim] if start >= 0 else ()
    # B's dims match A's from ``start`` on; a size-1 dim of B expands ("1-dim expansion", left
    # undefined by the opset < 7 docs, is what the ONNX test data of these versions expect)
    if start < 0 or len(seg) != b.ndim or any(bd != ad and bd != 1 for bd, ad in zip(b.shape, seg)):
        raise ValueError(f"B of shape {b.shape} does not match A of shape {a.shape} at axis {start}")
    return b.reshape(b.shape + (1,) * (a.ndim - start - b.ndim))


def _div(a, b):
    if a.dtype.kind in "iu":
        with np.errstate(**_IGNORE):
            q = np.floor_divide(a, b)
            if a.dtype.kind == "i":
                # C semantics: truncate toward zero
                fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
                q = q + fix.astype(q.dtype)
        return q
    return np.divide(a, b)


def _arith(f):
    """Binary arithmetic in T; ml_dtypes floats via float32."""
    def run(a, b):
        if a.dtype in _ML_FLOATS:
            return f(a.astype(_F32), b.astype(_F32)).astype(a.dtype)
        return f(a, b)
    return run


def _pow(a, b):
    """Pow: the result has the base's dtype."""
    da, db = a.dtype, b.dtype
    if da in _ML_FLOATS or da == _F16:
        a32 = a.astype(_F32)
        b32 = b.astype(_F64 if db.kind in "iu" or db == _F64 else _F32)
        return np.power(a32, b32).astype(da)
    if da == db and da.kind == "f":
        return np.power(a, b)
    if da.kind in "iu" and db.kind in "iu":
        if np.all(b >= 0):
            return np.power(a, b.astype(da, copy=False) if db != da else b)
        # negative exponents: as std::pow(double, double), truncated back to the base type
        return np.power(a.astype(_F64), b.astype(_F64)).astype(da)
    if db in _ML_FLOATS:
        b = b.astype(_F32)
    ct = np.result_type(a.dtype if a.dtype.kind == "f" else _F64, b.dtype if b.dtype.kind == "f" else _F64)
    return np.power(a.astype(ct, copy=False), b.astype(ct, copy=False)).astype(da, copy=False)


def _binary(op, versions_legacy, versions, f, *, extra=None, inplace=None):
    def k(ctx, a, b):
        return f(a, b)
    k.__name__ = op.lower()
    reg(op, *versions, extra=extra)(k)
    if inplace is not None:
        ufunc, kinds = inplace

        @inplace_variant(k, 0, 1)
        def k_inplace(ctx, owned, a, b):
            t = b if owned else a
            if (a.dtype == b.dtype and t.dtype.kind in kinds
                    and t.shape == (a.shape if a.shape == b.shape else np.broadcast_shapes(a.shape, b.shape))):
                return ufunc(a, b, out=t)
            return f(a, b)
    if versions_legacy:
        # opset 1 adds consumed_inputs (a memory hint without effect on values) for some ops
        def k_legacy(ctx, a, b, *, axis=None, broadcast=0, consumed_inputs=None):
            return f(a, _legacy_b(a, b, broadcast, axis))
        k_legacy.__name__ = f"{op.lower()}_legacy"
        reg(op, *versions_legacy)(k_legacy)


_binary("Add", (1, 6), (7, 13, 14), _arith(np.add), inplace=(np.add, "fiu"))
_binary("Sub", (1, 6), (7, 13, 14), _arith(np.subtract), inplace=(np.subtract, "fiu"))
_binary("Mul", (1, 6), (7, 13, 14), _arith(np.multiply), inplace=(np.multiply, "fiu"))
_binary("Div", (1, 6), (7, 13, 14), _arith(_div), inplace=(np.divide, "f"))
_binary("Pow", (1,), (7, 12, 13, 15), _pow)


def _mod_check(node):
    dt = _in_dtype(node, 0)
    if node.attrs.get("fmod") not in (0, 1):
        return f"Mod fmod={node.attrs.get('fmod')!r} is not defined (0 or 1)"
    if node.since_version < 28 and node.attrs.get("fmod") == 0 and dt is not None and _is_float(dt):
        return (f"Mod-{node.since_version} with fmod=0 is defined for integer types only "
                f"(got {dt.name}); floating-point inputs need fmod=1 before opset 28")
    return None


@reg("Mod", 10, 13, 28, extra=_mod_check)
def mod(ctx, a, b, *, fmod):
    f = np.fmod if fmod else np.mod  # fmod: C fmod (trunc); else floor (sign of the divisor)
    with np.errstate(**_IGNORE):
        if a.dtype in _ML_FLOATS:
            return f(a.astype(_F32), b.astype(_F32)).astype(a.dtype)
        return f(a, b)


def _bitshift_check(node):
    if node.attrs.get("direction") not in ("LEFT", "RIGHT"):
        return f"BitShift direction={node.attrs.get('direction')!r} is not defined (LEFT or RIGHT)"
    return None


@reg("BitShift", 11, 28, extra=_bitshift_check)
def bitshift(ctx, x, y, *, direction):
    bits = x.dtype.itemsize * 8
    t = x.dtype.type
    # shift amounts outside [0, bits) give the sign fill (-1 for RIGHT of a negative X, else 0)
    out_of_range = (y < 0) | (y >= bits) if y.dtype.kind == "i" else (y >= bits)
    ys = y if not out_of_range.any() else np.where(out_of_range, 0, y)
    ys = ys.astype(x.dtype, copy=False)
    if direction == "LEFT":
        r = np.left_shift(x, ys)
        if out_of_range.any():
            r = np.where(out_of_range, t(0), r)
    else:
        r = np.right_shift(x, ys)
        if out_of_range.any():
            fill = np.where(x < 0, t(-1), t(0)) if x.dtype.kind == "i" else t(0)
            r = np.where(out_of_range, fill, r)
    return r.astype(x.dtype, copy=False)


# -- logic, bitwise, comparisons --------------------------------------------------

_binary("And", (1,), (7,), np.logical_and)
_binary("Or", (1,), (7,), np.logical_or)
_binary("Xor", (1,), (7,), np.logical_xor)
_binary("BitwiseAnd", (), (18,), np.bitwise_and)
_binary("BitwiseOr", (), (18,), np.bitwise_or)
_binary("BitwiseXor", (), (18,), np.bitwise_xor)


def _compare(f):
    def run(a, b):
        if a.dtype in _ML_FLOATS:
            return f(a.astype(_F32), b.astype(_F32))
        r = f(a, b)
        return r if r.dtype == np.bool_ else r.astype(bool)
    return run


_binary("Equal", (1,), (7, 11, 13, 19), _compare(np.equal))
_binary("Less", (1,), (7, 9, 13), _compare(np.less))
_binary("Greater", (1,), (7, 9, 13), _compare(np.greater))
_binary("LessOrEqual", (), (12, 16), _compare(np.less_equal))
_binary("GreaterOrEqual", (), (12, 16), _compare(np.greater_equal))


@reg("Where", 9, 16)
def where(ctx, cond, x, y):
    return np.where(cond, x, y)


# -- variadic ----------------------------------------------------------------------

def _same_shapes(xs):
    s = xs[0].shape
    for x in xs[1:]:
        if x.shape != s:
            raise ValueError(f"all inputs must have the same shape before opset 8, got {s} and {x.shape}")


def _fold(f, xs):
    if len(xs) == 1:
        return xs[0]
    ml = xs[0].dtype in _ML_FLOATS
    vals = [x.astype(_F32) for x in xs] if ml else xs
    r = np.asarray(f(vals[0], vals[1]))  # a fresh array (0-d inputs give a numpy scalar)
    for x in vals[2:]:
        if r.shape == np.broadcast_shapes(r.shape, x.shape):
            f(r, x, out=r)
        else:
            r = f(r, x)
    return r.astype(xs[0].dtype) if ml else r


def _mean(xs):
    dt = xs[0].dtype
    if len(xs) == 1:
        return xs[0]
    vals = [x.astype(_F32) for x in xs] if _lowp(dt) else xs
    r = np.asarray(np.add(vals[0], vals[1]))
    for x in vals[2:]:
        if r.shape == np.broadcast_shapes(r.shape, x.shape):
            np.add(r, x, out=r)
        else:
            r = np.add(r, x)
    r = np.divide(r, r.dtype.type(len(xs)), out=r)
    return r.astype(dt, copy=False)


def _variadic(op, f):
    """Register the opset 1/6 kernel (equal shapes); return the broadcasting one (8+)."""
    def k_same_shape(ctx, *xs, consumed_inputs=None):
        _same_shapes(xs)
        with np.errstate(**_IGNORE):
            return f(xs)

    def k(ctx, *xs):
        with np.errstate(**_IGNORE):
            return f(xs)

    k_same_shape.__name__ = f"{op.lower()}_1"
    k.__name__ = op.lower()
    reg(op, 1, 6)(k_same_shape)
    return k


reg("Max", 8, 12, 13)(_variadic("Max", functools.partial(_fold, np.maximum)))
reg("Min", 8, 12, 13)(_variadic("Min", functools.partial(_fold, np.minimum)))
reg("Sum", 8, 13)(_variadic("Sum", functools.partial(_fold, np.add)))
reg("Mean", 8, 13)(_variadic("Mean", _mean))


# -- Cast / CastLike -------------------------------------------------------------

_UNSUPPORTED_TARGETS = {}
for _d in _F6:
    _UNSUPPORTED_TARGETS[_d] = f"{_d.name} (float6 conversion is not implemented)"


def _elem_dtype(elem: int):
    if elem == TensorProto.STRING:
        return _OBJ
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem))
    except Exception:  # noqa: BLE001
        return None


def _cast_target_reason(node, dst) -> str | None:
    if dst is None:
        return f"{node.op_type}: target type {node.attrs.get('to')!r} is not a tensor type numpy can hold"
    if dst in _UNSUPPORTED_TARGETS:
        return f"{node.op_type} to {_UNSUPPORTED_TARGETS[dst]} is declined"
    _, tc, outs = _schema_types(node.op_type, node.since_version)
    allowed = _allowed(tc, outs[0][1]) if outs else None
    if allowed is not None and dst not in allowed:
        return (f"{node.op_type}-{node.since_version} cannot produce {dst.name} "
                f"(allowed: {_fmt_dtypes(allowed)})")
    return None


def _cast1_dtype(to: str):
    try:
        return _elem_dtype(TensorProto.DataType.Value(str(to).upper()))
    except ValueError:
        return None


def _cast_check(node):
    if node.since_version == 1:
        dst = _cast1_dtype(node.attrs.get("to"))
    else:
        dst = _elem_dtype(node.attrs.get("to"))
    return _cast_target_reason(node, dst)


def _castlike_check(node):
    dst = _in_dtype(node, 1)
    if dst is None:
        return None
    return _cast_target_reason(node, dst)


def _fmt_float(v: np.ndarray) -> np.ndarray:
    """Floats as strings the way ORT writes them: %.8g, NaN, INF, -INF."""
    s = np.char.mod("%.8g", v).astype(object)
    bad = ~np.isfinite(v)
    if bad.any():
        s[np.isnan(v)] = "NaN"
        s[np.isposinf(v)] = "INF"
        s[np.isneginf(v)] = "-INF"
    return s


def _to_string(x: np.ndarray) -> np.ndarray:
    dt = x.dtype
    if dt.kind in "OUS":
        return x.astype(object, copy=False)
    if dt == np.bool_:
        return np.where(x, "1", "0").astype(object)
    if dt in _ML_FLOATS:
        x, dt = x.astype(_F32), _F32
    if dt in _ML_INTS:
        x, dt = x.astype(_ML_INTS[dt]), _ML_INTS[dt]
    if dt.kind == "f":
        return _fmt_float(x if dt != _F16 else x.astype(_F32))
    return x.astype(str).astype(object)


def _as_text(s) -> str:
    if isinstance(s, bytes):
        s = s.decode("utf-8")
    return str(s).strip()


def _parse_float(s) -> float:
    t = _as_text(s)
    try:
        return float(t)
    except ValueError:
        pass
    try:
        return float.fromhex(t)
    except ValueError:
        raise ValueError(f"cannot cast string {s!r} to a number") from None


def _parse_int(s) -> int:
    t = _as_text(s)
    try:
        return int(t)
    except ValueError:
        return int(_parse_float(t))


_M64 = (1 << 64) - 1


def _from_string(x: np.ndarray, dst: np.dtype, saturate, fnuz_inf_nan, round_mode="up"):
    flat = x.reshape(-1)
    if dst.kind == "f" or dst in _ML_FLOATS:
        v = np.array([_parse_float(s) for s in flat], dtype=_F64).reshape(x.shape)
        if dst == _F32:
            return v.astype(_F32)
        return _cast_num(v, dst, saturate, fnuz_inf_nan, round_mode)
    ints = [_parse_int(s) for s in flat]
    if dst == np.bool_:
        return np.array([i != 0 for i in ints], dtype=bool).reshape(x.shape)
    v = np.array([i & _M64 for i in ints], dtype=np.uint64).reshape(x.shape)
    return _cast_num(v, dst, saturate, fnuz_inf_nan)


def _to_e8m0(x: np.ndarray, saturate, round_mode) -> np.ndarray:
    """float -> float8e8m0 (an 8-bit power-of-two exponent, bias 127, 0xFF = NaN).

    The float32 exponent field is kept and rounded per ``round_mode`` from the mantissa
    (``up``: any fraction rounds away from zero; ``down``: truncate; ``nearest``: by the
    guard bit, ties away except in the subnormal range, as onnx.numpy_helper.to_float8e8m0).
    The sign is ignored (negative inputs are unspecified). Special values follow the Cast
    table: saturate -> Inf and overflow give E8M0_MAX; non-saturating -> 0, Inf and
    overflow give NaN; NaN is always NaN.
    """
    if round_mode not in ("up", "down", "nearest"):
        raise ValueError(f"Cast round_mode={round_mode!r} is not defined (up, down or nearest)")
    bits = np.ascontiguousarray(x, dtype=_F32).view(np.uint32)
    exp = ((bits >> np.uint32(23)) & np.uint32(0xFF)).astype(np.uint16)
    special = exp == 0xFF
    nan = special & ((bits & np.uint32(0x7FFFFF)) != 0)
    if round_mode == "up":
        inc = (bits & np.uint32(0x7FFFFF)) != 0
    elif round_mode == "nearest":
        g = (bits & np.uint32(0x400000)) != 0
        rs = (bits & np.uint32(0x3FFFFF)) != 0
        inc = g & (rs | (exp > 0))
    else:
        inc = np.zeros(exp.shape, dtype=bool)
    inc &= ~special
    out = exp + inc.astype(np.uint16)
    if saturate:
        out = np.minimum(out, 0xFE)  # Inf and overflow saturate to E8M0_MAX
        out[nan] = 0xFF
    else:
        out = np.minimum(out, 0xFF)  # overflow and Inf -> NaN
        out[(bits & np.uint32(0x7FFFFFFF)) == 0] = 0xFF  # 0 -> NaN
    return out.astype(np.uint8).view(_E8M0).reshape(np.shape(x))


def _cast_num(x: np.ndarray, dst: np.dtype, saturate, fnuz_inf_nan, round_mode="up") -> np.ndarray:
    """Numeric (and bool) -> numeric cast following the ONNX Cast rules."""
    src = x.dtype
    if src == dst:
        return x
    if src in _ML_FLOATS:
        x, src = x.astype(_F32), _F32
        if dst == _F32:
            return x
    elif src in _ML_INTS:
        x, src = x.astype(_ML_INTS[src]), _ML_INTS[src]
        if src == dst:
            return x
    with np.errstate(**_IGNORE):
        if dst == np.bool_:
            return x != 0
        if dst in _F8:
            if src.kind != "f":
                x = x.astype(_F64)
            if saturate:
                m = float(ml_dtypes.finfo(dst).max)
                if fnuz_inf_nan and dst in _F8_FNUZ and np.isinf(x).any():
                    x = np.where(np.isinf(x), np.nan, x)
                x = np.clip(x, -m, m)
            return x.astype(dst)
        if dst == _F4:
            if src.kind != "f":
                x = x.astype(_F32)
            # RNE; out of range and +/-inf saturate to +/-6 (float4e2m1 has no inf/NaN);
            # NaN has no encoding either: it becomes -0 (ml_dtypes, as the ONNX test data)
            return x.astype(_F4)
        if dst == _E8M0:
            return _to_e8m0(x, saturate, round_mode)
        if dst in _ML_INTS:
            # computed in casting.py: ml_dtypes' own float -> intN cast differs between releases
            return to_subbyte_int(x, dst)
        if dst == _BF16:
            if src.kind != "f":
                x = x.astype(_F32 if src.itemsize <= 2 or src == np.bool_ else _F64)
            return x.astype(_BF16)
        return x.astype(dst)


def _cast(x: np.ndarray, dst: np.dtype, saturate=1, fnuz_inf_nan=False, round_mode="up") -> np.ndarray:
    if dst == _OBJ:
        return _to_string(x)
    if x.dtype.kind in "OUS":
        return _from_string(x, dst, saturate, fnuz_inf_nan, round_mode)
    return _cast_num(x, dst, saturate, fnuz_inf_nan, round_mode)


@reg("Cast", 1, extra=_cast_check)
def cast_1(ctx, x, *, to):
    return _cast(x, _cast1_dtype(to))


@reg("Cast", 6, 9, 13, extra=_cast_check)
def cast_6(ctx, x, *, to):
    return _cast(x, _elem_dtype(to))


@reg("Cast", 19, 21, 23, extra=_cast_check)
def cast_19(ctx, x, *, saturate, to):
    # before opset 24, saturating +/-inf into a float8 *fnuz* type gives NaN
    return _cast(x, _elem_dtype(to), saturate, fnuz_inf_nan=True)


@reg("Cast", 24, 25, 28, extra=_cast_check)
def cast_24(ctx, x, *, round_mode, saturate, to):
    # round_mode only affects float8e8m0 targets
    return _cast(x, _elem_dtype(to), saturate, fnuz_inf_nan=False, round_mode=round_mode)


@reg("CastLike", 15, extra=_castlike_check)
def castlike_15(ctx, x, like):
    return _cast(x, like.dtype)


@reg("CastLike", 19, 21, 23, extra=_castlike_check)
def castlike_19(ctx, x, like, *, saturate):
    return _cast(x, like.dtype, saturate, fnuz_inf_nan=True)


@reg("CastLike", 24, 25, extra=_castlike_check)
def castlike_24(ctx, x, like, *, round_mode, saturate):
    return _cast(x, like.dtype, saturate, fnuz_inf_nan=False, round_mode=round_mode)


# -- BitCast -----------------------------------------------------------------------

#: ONNX bit widths of the sub-byte types (held one per byte, in the low bits, by ml_dtypes)
_SUBBYTE_BITS = {np.dtype(ml_dtypes.int4): 4, np.dtype(ml_dtypes.uint4): 4, _F4: 4,
                 np.dtype(ml_dtypes.int2): 2, np.dtype(ml_dtypes.uint2): 2}


def _bit_width(dt: np.dtype) -> int:
    return _SUBBYTE_BITS.get(dt, dt.itemsize * 8)


def _bitcast_check(node):
    dst = _elem_dtype(node.attrs.get("to"))
    if dst is None or dst == _OBJ:
        return f"BitCast to type {node.attrs.get('to')!r} is not defined (string and non-tensor types excluded)"
    _, tc, outs = _schema_types(node.op_type, node.since_version)
    allowed = _allowed(tc, outs[0][1])
    if allowed is not None and dst not in allowed:
        return f"BitCast-{node.since_version} cannot produce {dst.name} (allowed: {_fmt_dtypes(allowed)})"
    src = _in_dtype(node, 0)
    if src is not None and _bit_width(src) != _bit_width(dst):
        return (f"BitCast needs input and output types of the same bit width: {src.name} has "
                f"{_bit_width(src)} bits, {dst.name} {_bit_width(dst)}")
    return None


@reg("BitCast", 26, extra=_bitcast_check)
def bitcast(ctx, x, *, to):
    dst = _elem_dtype(to)
    src = x.dtype
    if _bit_width(src) != _bit_width(dst):
        raise ValueError(f"BitCast: {src.name} ({_bit_width(src)} bits) and {dst.name} "
                         f"({_bit_width(dst)} bits) differ in bit width")
    x = np.ascontiguousarray(x).reshape(x.shape)  # (ascontiguousarray makes 0-d arrays 1-d)
    if src.byteorder == ">" or (src.byteorder == "=" and not np.little_endian):
        x = x.astype(src.newbyteorder("<"))  # the bytes are read as little endian
    if src in _SUBBYTE_BITS or dst in _SUBBYTE_BITS:
        bits = x.view(np.uint8) & np.uint8((1 << _bit_width(dst)) - 1)
        return bits.view(dst)
    if dst == np.bool_:
        # a bool holds 0 or 1 only: any nonzero byte reads as true
        return x.view(np.uint8) != 0
    y = x.view(dst.newbyteorder("<"))
    return y.astype(dst, copy=False)
