"""Nodes and partitions back as ONNX (plugin API 1.4), for providers that delegate to another runtime.

A provider that hands what it claims to another library (onnxruntime, TensorRT, OpenVINO,
a vendor compiler) needs the claimed nodes as a model, not as views: :func:`node_proto`
is ``NodeView.to_proto()`` and :func:`partition_model` is ``Partition.to_model()``.
Both are exact: a node's attributes are the protos it was loaded (or fused) with, types
and subgraphs included; only a view built without them (by a test, say) has its
attributes rebuilt from the resolved values and the schema's attribute types.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper

if TYPE_CHECKING:  # pragma: no cover
    from .contract import NodeView, Partition, ValueInfo

__all__ = ["node_proto", "opsets_of", "partition_model", "type_proto_of"]


def _attribute(name: str, value: Any, attr_type: int | None) -> AttributeProto:
    """One resolved attribute value as a proto of ``attr_type`` (the schema's), else guessed."""
    if isinstance(value, np.ndarray):
        value = numpy_helper.from_array(value)
    elif isinstance(value, list) and value and all(isinstance(v, np.ndarray) for v in value):
        value = [numpy_helper.from_array(v) for v in value]
    if attr_type == AttributeProto.TENSOR and not isinstance(value, onnx.TensorProto):
        value = numpy_helper.from_array(np.asarray(value))
    if isinstance(value, list) and not value and attr_type in (None, AttributeProto.UNDEFINED):
        raise ValueError(f"attribute {name!r} is an empty list and its type is not known")
    typed = attr_type if attr_type not in (None, AttributeProto.UNDEFINED) else None
    conv = _COERCE.get(typed) if typed is not None else None
    if conv is not None:  # resolved values are Python numbers: 1 for a FLOAT attribute is 1.0
        value = conv(value) if typed in (AttributeProto.INT, AttributeProto.FLOAT) else [conv(v) for v in value]
    return helper.make_attribute(name, value, attr_type=typed)


_COERCE: dict[int, type] = {AttributeProto.INT: int, AttributeProto.FLOAT: float, AttributeProto.INTS: int,
           AttributeProto.FLOATS: float}


def node_attributes(view: "NodeView") -> list[AttributeProto]:
    """The node's ``AttributeProto``s: as loaded when the view carries them, else rebuilt
    from ``attrs`` (defaults included, unset optional ones left out)."""
    if view.proto_attrs:
        return list(view.proto_attrs)
    from ..graph.attrs import get_schema

    schema = get_schema(view.op_type, view.domain, view.opset) if view.since_version is not None else None
    specs = schema.attributes if schema is not None else {}
    out = []
    for k, v in view.attrs.items():
        if v is None:
            continue
        spec = specs.get(k)
        out.append(_attribute(k, v, int(spec.type) if spec is not None else None))
    return out


def node_proto(view: "NodeView") -> onnx.NodeProto:
    """``NodeView.to_proto()``: the node as a ``NodeProto`` (see :mod:`.export`)."""
    p = helper.make_node(view.op_type, list(view.inputs), list(view.outputs), name=view.name,
                         domain=view.domain or None)
    for a in node_attributes(view):
        p.attribute.add().CopyFrom(a)
    return p


def _body_domains(g: onnx.GraphProto, out: set[str]) -> None:
    for n in g.node:
        out.add("" if n.domain == "ai.onnx" else n.domain)
        for a in n.attribute:
            for sg in ([a.g] if a.type == AttributeProto.GRAPH else list(a.graphs)):
                _body_domains(sg, out)


def opsets_of(nodes: Iterable["NodeView"], imports: Mapping[str, int]) -> dict[str, int]:
    """The opset imports ``nodes`` need: every domain used by a node or inside its subgraphs
    (at any depth), with the version the model imports (else 1)."""
    used: set[str] = set()
    for v in nodes:
        used.add(v.domain)
        for a in node_attributes(v):
            for sg in ([a.g] if a.type == AttributeProto.GRAPH else list(a.graphs)):
                _body_domains(sg, used)
    return {d: int(imports.get(d) or 1) for d in sorted(used)}


def type_proto_of(info: "ValueInfo | None") -> onnx.TypeProto | None:
    """A tensor ``TypeProto`` from a :class:`ValueInfo` (``None`` when its dtype is unknown
    or it is not a tensor); an unknown rank gives a tensor type without a shape."""
    from ..graph.types import dtype_to_elem

    if info is None or info.kind != "tensor" or info.dtype is None:
        return None
    elem = dtype_to_elem(info.dtype)
    if elem is None:
        return None
    if info.shape is None:
        tp = onnx.TypeProto()
        tp.tensor_type.elem_type = elem
        return tp
    return helper.make_tensor_type_proto(elem, [d if isinstance(d, (int, str)) else None for d in info.shape])


def _value_info(name: str, tp: onnx.TypeProto | None) -> onnx.ValueInfoProto:
    vi = onnx.ValueInfoProto(name=name)
    if tp is not None:
        vi.type.CopyFrom(tp)
    return vi


def partition_model(part: "Partition") -> onnx.ModelProto:
    """``Partition.to_model()``: the partition as a standalone model (see ``Partition.to_model``)."""
    lookup = part.type_lookup

    def type_of(name: str) -> onnx.TypeProto | None:
        tp = lookup(name) if lookup is not None else None
        return tp if tp is not None and tp.WhichOneof("value") else type_proto_of(part.value(name))

    nodes = [node_proto(v) for v in part.nodes]
    inits = []
    for name, arr in part.constants.items():
        a = np.asarray(arr)
        inits.append(numpy_helper.from_array(a.astype(object) if a.dtype.kind in "US" else a, name))
    boundary = set(part.inputs) | set(part.outputs) | set(part.constants)
    inner: list[str] = []
    for v in part.nodes:
        for o in v.outputs:
            if o and o not in boundary and o not in inner:
                inner.append(o)
    value_info = [_value_info(n, type_of(n)) for n in inner if type_of(n) is not None]
    graph = helper.make_graph(
        nodes, f"partition_{part.id}_{part.provider}",
        [_value_info(n, type_of(n)) for n in part.inputs],
        [_value_info(n, type_of(n)) for n in part.outputs],
        initializer=inits, value_info=value_info)
    opsets = dict(part.opset_imports) or opsets_of(part.nodes, {})
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in sorted(opsets.items())],
                              producer_name="runtime-core")
    model.ir_version = int(part.ir_version) or onnx.IR_VERSION
    return model
