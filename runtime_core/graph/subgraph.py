"""Subgraph bodies (If / Loop / Scan / SequenceMap ...) as views for providers.

A node's GRAPH attributes reach providers as :class:`~runtime_core.plugin.contract.GraphBody`
objects in ``NodeView.subgraphs``: node views with resolved attributes (the same rules as the
main graph's, :mod:`.attrs`), and value types from onnx shape inference over the body, its
outer-scope reads declared with their types from the enclosing scope. Built lazily, the
first time a provider looks, and once per body (cached on the :class:`~.ir.Graph`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..plugin.contract import GraphBody, NodeView, ValueInfo
from .attrs import get_schema, resolve_attrs
from .types import dtype_of, dtype_to_elem, shape_of, type_kind
from .validate import infer_shapes

logger = logging.getLogger("runtime_core.graph")

#: name -> what the enclosing scope knows of it (``None``: nothing)
ValueLookup = Callable[[str], "ValueInfo | None"]
TypeLookup = Callable[[str], "onnx.TypeProto | None"]


def subgraph_outer_names(g: onnx.GraphProto) -> list[str]:
    """Names a (nested) subgraph reads that it does not define itself."""
    defined = {i.name for i in g.input} | {t.name for t in g.initializer} | {
        t.values.name for t in g.sparse_initializer}
    used: list[str] = []
    for n in g.node:
        for i in n.input:
            if i and i not in defined and i not in used:
                used.append(i)
        for a in n.attribute:
            subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
            for sg in subs:
                for i in subgraph_outer_names(sg):
                    if i not in defined and i not in used:
                        used.append(i)
        defined.update(o for o in n.output if o)
    for o in g.output:
        if o.name not in defined and o.name not in used:
            used.append(o.name)
    return used


def graph_attrs(attrs: Mapping) -> dict[str, onnx.GraphProto]:
    """``attr name -> GraphProto`` of resolved attributes (``name[i]`` for GRAPHS ones)."""
    out: dict[str, onnx.GraphProto] = {}
    for k, v in attrs.items():
        if isinstance(v, onnx.GraphProto):
            out[k] = v
        elif isinstance(v, list) and v and all(isinstance(x, onnx.GraphProto) for x in v):
            for i, g in enumerate(v):
                out[f"{k}[{i}]"] = g
    return out


def type_of_array(arr: np.ndarray) -> onnx.TypeProto | None:
    """The tensor TypeProto of a constant (``None`` for a dtype ONNX has no type for)."""
    elem = dtype_to_elem(arr.dtype)
    return None if elem is None else helper.make_tensor_type_proto(elem, list(arr.shape))


def _value(name: str, tp: onnx.TypeProto) -> ValueInfo:
    return ValueInfo(name, dtype_of(tp), shape_of(tp), type_kind(tp))


def dense_of_sparse(st: onnx.SparseTensorProto) -> np.ndarray:
    """A sparse initializer as the dense array kernels read (imported lazily: rare)."""
    values = numpy_helper.to_array(st.values)
    idx = numpy_helper.to_array(st.indices)
    dense = np.zeros(tuple(st.dims), dtype=values.dtype)
    if idx.ndim == 1:  # linearized indices
        dense.reshape(-1)[idx] = values
    else:  # [NNZ, rank] coordinates
        dense[tuple(idx.T)] = values
    return dense


def _infer_types(g: onnx.GraphProto, opsets: Mapping[str, int], outer: list[str],
                 outer_type: TypeLookup) -> dict[str, onnx.TypeProto]:
    """Types of a body's values: what it declares, merged with onnx shape inference over the
    body, its outer reads declared as extra graph inputs. Best effort: inference failing
    leaves what the body declares (kernels cope with unknown types)."""
    types = {vi.name: vi.type for vi in list(g.input) + list(g.value_info) + list(g.output)
             if vi.type.WhichOneof("value")}
    gg = onnx.GraphProto()
    gg.CopyFrom(g)
    for name in outer:
        vi = onnx.ValueInfoProto(name=name)
        tp = outer_type(name)
        if tp is not None:
            vi.type.CopyFrom(tp)
        gg.input.append(vi)
    try:
        model = helper.make_model(gg, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()
                                                      if v is not None])
        model.ir_version = onnx.IR_VERSION
        inferred = infer_shapes(model)  # a child process for crash-prone bodies
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
            if vi.type.WhichOneof("value"):
                types[vi.name] = vi.type
    except Exception as exc:  # noqa: BLE001 - inference is advisory
        logger.info("shape inference of subgraph %r failed, continuing without it: %s", g.name, exc)
    return types


def body_view(g: onnx.GraphProto, opsets: Mapping[str, int], outer_value: ValueLookup,
              outer_type: TypeLookup, name: str) -> GraphBody:
    """The :class:`GraphBody` of subgraph ``g`` read inside a scope that knows
    ``outer_value(name)`` / ``outer_type(name)``; its nodes are named ``{name}/{node}``.
    Raises ``ValueError`` for attributes the schema does not define or required ones missing."""
    outer_names = subgraph_outer_names(g)
    types = _infer_types(g, opsets, outer_names, outer_type)
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    for st in g.sparse_initializer:
        consts[st.values.name] = dense_of_sparse(st)
    values: dict[str, ValueInfo] = {}

    def value(n: str) -> ValueInfo | None:
        if not n:
            return None
        if n not in values:
            if n in consts:
                a = consts[n]
                values[n] = ValueInfo(n, a.dtype, tuple(a.shape), "tensor", a)
            elif n in types:
                values[n] = _value(n, types[n])
            else:
                known = outer_value(n) if n in outer_names else None
                values[n] = known if known is not None else ValueInfo(n)
        return values[n]

    def inner_type(n: str) -> onnx.TypeProto | None:
        if n in types:
            return types[n]
        if n in consts:
            return type_of_array(consts[n])
        return outer_type(n)

    def inner_value(n: str) -> ValueInfo | None:
        return value(n) if (n in types or n in consts or n in values) else outer_value(n)

    nodes = []
    used: set[str] = set()
    for idx, n in enumerate(g.node):
        domain = "" if n.domain == "ai.onnx" else n.domain
        opset = opsets.get(domain)
        schema = get_schema(n.op_type, domain, opset if opset else 10 ** 6)
        nname = n.name or f"{n.op_type}_{idx}"
        while nname in used:
            nname = f"{nname}_{idx}"
        used.add(nname)
        full = f"{name}/{nname}" if name else nname
        attrs = resolve_attrs(n.op_type, n.attribute, schema)
        implicit: list[str] = []
        for sg in graph_attrs(attrs).values():
            for i in subgraph_outer_names(sg):
                if i not in implicit:
                    implicit.append(i)
        nodes.append(NodeView(
            name=full, op_type=n.op_type, domain=domain,
            since_version=schema.since_version if schema is not None else None,
            opset=opset if opset is not None else (schema.since_version if schema is not None else 1),
            attrs=attrs, inputs=tuple(n.input), outputs=tuple(n.output),
            input_info=tuple(value(i) for i in n.input), output_info=tuple(value(o) for o in n.output),
            implicit_inputs=tuple(implicit), index=idx, proto_attrs=tuple(n.attribute),
            subgraphs=SubgraphViews(full, attrs, opsets, inner_value, inner_type)))
    for vi in list(g.input) + list(g.output):
        value(vi.name)
    for n in outer_names:
        value(n)
    return GraphBody(name=name, nodes=tuple(nodes), inputs=tuple(i.name for i in g.input),
                     outer_inputs=tuple(outer_names), outputs=tuple(o.name for o in g.output),
                     constants=consts, values=values, opsets=dict(opsets))


class SubgraphViews(Mapping):
    """``NodeView.subgraphs``: attribute name (``name[i]`` for GRAPHS) -> :class:`GraphBody`,
    each built on first access and then kept. A body that cannot be read (an attribute its
    schema does not define, say) raises ``ValueError`` naming it when it is looked up."""

    def __init__(self, node_name: str, attrs: Mapping, opsets: Mapping[str, int],
                 outer_value: ValueLookup, outer_type: TypeLookup, cache: dict | None = None):
        self._graphs = graph_attrs(attrs)
        self._node = node_name
        self._opsets = dict(opsets)
        self._outer_value = outer_value
        self._outer_type = outer_type
        self._cache = cache if cache is not None else {}

    def __getitem__(self, attr: str) -> GraphBody:
        g = self._graphs[attr]
        key = (self._node, attr)
        hit = self._cache.get(key)
        if hit is not None and hit[0] is g:
            return hit[1]
        body = body_view(g, self._opsets, self._outer_value, self._outer_type, f"{self._node}/{attr}")
        self._cache[key] = (g, body)
        return body

    def __iter__(self) -> Iterator[str]:
        return iter(self._graphs)

    def __len__(self) -> int:
        return len(self._graphs)
