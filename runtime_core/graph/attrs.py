"""Attribute resolution against ONNX schemas: values with defaults, before any kernel runs."""

from __future__ import annotations

import math
from typing import Any

import onnx
from onnx import AttributeProto, numpy_helper


#: repeated attributes at least this long are decoded with one object per distinct value
_SHARE_FROM = 64


def _utf8(b: bytes) -> str:
    return b.decode("utf-8", errors="surrogateescape")


def _shared(values, conv) -> list:
    """``[conv(v) for v in values]``, but a long list (tree ensembles carry 10^5-entry ints,
    floats and strings attributes, mostly repeats: node ids, feature ids, modes, zero
    weights) holds one object per *distinct* value, so a 100-tree forest decodes into a few
    MB rather than ~30 (a Python int or float is 24-32 bytes, a str ~60). Values that
    compare equal are the same value here, except the two zeros of a float: those are kept
    apart by their sign (NaNs never compare equal, so each keeps its own object)."""
    if len(values) < _SHARE_FROM:
        return [conv(v) for v in values]
    seen: dict = {}
    get = seen.setdefault
    if conv is not float:
        return [get(v, v) for v in map(conv, values)]
    pos, neg = 0.0, -0.0
    return [get(v, v) if v else (neg if math.copysign(1.0, v) < 0 else pos)
            for v in map(float, values)]


def attr_value(attr: AttributeProto) -> Any:
    """Python value of an attribute: int, float, str, list, ndarray, or GraphProto."""
    t = attr.type
    if t == AttributeProto.INT:
        return int(attr.i)
    if t == AttributeProto.FLOAT:
        return float(attr.f)
    if t == AttributeProto.STRING:
        return _utf8(attr.s)
    if t == AttributeProto.INTS:
        return _shared(attr.ints, int)
    if t == AttributeProto.FLOATS:
        return _shared(attr.floats, float)
    if t == AttributeProto.STRINGS:
        return _shared(attr.strings, _utf8)
    if t == AttributeProto.TENSOR:
        return numpy_helper.to_array(attr.t)
    if t == AttributeProto.TENSORS:
        return [numpy_helper.to_array(x) for x in attr.tensors]
    if t == AttributeProto.GRAPH:
        return attr.g
    if t == AttributeProto.GRAPHS:
        return list(attr.graphs)
    if t == AttributeProto.SPARSE_TENSOR:
        from onnx.reference.op_run import to_sparse_tensor  # lazily: rarely used

        return to_sparse_tensor(attr.sparse_tensor)
    if t == AttributeProto.TYPE_PROTO:
        return attr.tp
    if t == AttributeProto.TYPE_PROTOS:
        return list(attr.type_protos)
    return onnx.helper.get_attribute_value(attr)


def get_schema(op_type: str, domain: str, opset: int):
    """The schema in force for ``op_type`` at ``opset`` of ``domain``, or ``None``."""
    try:
        return onnx.defs.get_schema(op_type, max_inclusive_version=opset, domain=domain)
    except onnx.defs.SchemaError:
        return None


def resolve_attrs(op_type: str, attributes, schema) -> dict[str, Any]:
    """Every attribute of the schema with the node's value (``attributes``: the node's
    ``AttributeProto``s, read where they are, never copied), else the default, else None.

    Without a schema (custom domains) only the node's own attributes are returned.
    Raises ``ValueError`` for attributes the schema does not define or required
    ones the node lacks.
    """
    given = {a.name: a for a in attributes}
    if schema is None:
        return {name: attr_value(a) for name, a in given.items()}
    out: dict[str, Any] = {}
    known = schema.attributes
    unknown = [n for n in given if n not in known]
    if unknown:
        raise ValueError(f"attribute(s) {', '.join(unknown)} are not defined by "
                         f"{op_type}-{schema.since_version}; it has: {', '.join(sorted(known)) or 'none'}")
    for name, spec in known.items():
        if name in given:
            a = given[name]
            if a.ref_attr_name:
                raise ValueError(f"attribute {name} refers to {a.ref_attr_name!r} outside a function")
            out[name] = attr_value(a)
        elif spec.required:
            raise ValueError(f"required attribute {name!r} of {op_type} is missing")
        else:
            default = spec.default_value
            if default is not None and default.type != AttributeProto.UNDEFINED:
                out[name] = attr_value(default)
            else:
                out[name] = None
    return out
