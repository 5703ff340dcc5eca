"""Dtype classes and the schema-driven dtype check of the elementwise-style kernels.

``reg(op, *versions)`` registers a kernel whose ``check`` declines nodes whose input dtypes the
node's schema version does not allow (with the allowed list), plus an optional ``extra`` check.
Low-precision floats without native numpy arithmetic (bfloat16, float8, ...) are computed in
float32 and rounded back: ``_ML_FLOATS``, ``_lowp``, ``_ufunc1``, ``_formula`` say which.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper

from ..registry import kernel

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
