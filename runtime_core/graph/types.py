"""ONNX type protos <-> numpy dtypes and ORT-style type strings, in one place."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

_ORT_NAMES = {
    TensorProto.FLOAT: "float", TensorProto.UINT8: "uint8", TensorProto.INT8: "int8",
    TensorProto.UINT16: "uint16", TensorProto.INT16: "int16", TensorProto.INT32: "int32",
    TensorProto.INT64: "int64", TensorProto.STRING: "string", TensorProto.BOOL: "bool",
    TensorProto.FLOAT16: "float16", TensorProto.DOUBLE: "double", TensorProto.UINT32: "uint32",
    TensorProto.UINT64: "uint64", TensorProto.COMPLEX64: "complex64",
    TensorProto.COMPLEX128: "complex128", TensorProto.BFLOAT16: "bfloat16",
}


def elem_type_name(elem_type: int) -> str:
    """ORT's element type spelling (``float``, ``int64``, ...)."""
    if elem_type in _ORT_NAMES:
        return _ORT_NAMES[elem_type]
    return TensorProto.DataType.Name(elem_type).lower()


def elem_to_dtype(elem_type: int) -> np.dtype | None:
    """numpy dtype for an ONNX element type (object for strings), None when unknown."""
    if elem_type == TensorProto.UNDEFINED:
        return None
    if elem_type == TensorProto.STRING:
        return np.dtype(object)
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, ValueError, TypeError):
        return None


def dtype_to_elem(dtype) -> int | None:
    """ONNX element type for a numpy dtype (strings and object -> STRING)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "OUS":
        return TensorProto.STRING
    try:
        return helper.np_dtype_to_tensor_dtype(dtype)
    except (KeyError, ValueError, TypeError):
        return None


def type_kind(tp: onnx.TypeProto) -> str:
    """``tensor``, ``sequence``, ``optional``, ``map``, ``sparse_tensor`` or ``unknown``."""
    which = tp.WhichOneof("value")
    return {"tensor_type": "tensor", "sequence_type": "sequence", "optional_type": "optional",
            "map_type": "map", "sparse_tensor_type": "sparse_tensor"}.get(which or "", "unknown")


def type_string(tp: onnx.TypeProto) -> str:
    """ORT-style type string: ``tensor(float)``, ``seq(tensor(int64))``, ``map(string,tensor(float))``."""
    kind = type_kind(tp)
    if kind in ("tensor", "sparse_tensor"):
        t = tp.tensor_type if kind == "tensor" else tp.sparse_tensor_type
        return f"{'tensor' if kind == 'tensor' else 'sparse_tensor'}({elem_type_name(t.elem_type)})"
    if kind == "sequence":
        return f"seq({type_string(tp.sequence_type.elem_type)})"
    if kind == "optional":
        return f"optional({type_string(tp.optional_type.elem_type)})"
    if kind == "map":
        return f"map({elem_type_name(tp.map_type.key_type)},{type_string(tp.map_type.value_type)})"
    return "unknown"


def shape_of(tp: onnx.TypeProto) -> tuple | None:
    """Dims of a tensor type: int, str (symbolic) or None (unknown); None if rank unknown."""
    if type_kind(tp) != "tensor" or not tp.tensor_type.HasField("shape"):
        return None
    dims = []
    for d in tp.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return tuple(dims)


def dtype_of(tp: onnx.TypeProto) -> np.dtype | None:
    """Element dtype of a tensor type (or of a sequence's / optional's tensor)."""
    kind = type_kind(tp)
    if kind == "tensor":
        return elem_to_dtype(tp.tensor_type.elem_type)
    if kind == "sequence":
        return dtype_of(tp.sequence_type.elem_type)
    if kind == "optional":
        return dtype_of(tp.optional_type.elem_type)
    return None
