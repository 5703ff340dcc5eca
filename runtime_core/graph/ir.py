"""The core's in-memory graph: what the optimizer rewrites and the partitioner cuts.

Built from a loaded ``ModelProto``: node names made unique, schema versions and
attributes resolved once, types from onnx shape inference, initializers as
numpy arrays (taken as they are from the loader's ``weights`` for the ones it kept
out of protobuf), outer-scope reads of subgraphs recorded as implicit inputs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import InvalidModelError
from ..plugin.contract import NodeView, ValueInfo
from .attrs import get_schema, resolve_attrs
from .contrib_types import fill_types
from .subgraph import SubgraphViews, dense_of_sparse, subgraph_outer_names, type_of_array
from .types import dtype_of, shape_of, type_kind
from .validate import infer_shapes

__all__ = ["Graph", "Node", "subgraph_outer_names"]

logger = logging.getLogger("runtime_core.graph")


#: initializers bigger than this are left out of shape inference (as typed inputs)
_SKELETON_BYTES = 4096


@dataclass
class Node:
    """One node of the core graph (mutable: optimizer passes rewrite it)."""

    name: str
    op_type: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any]
    since_version: int | None
    opset: int
    proto_attrs: list = field(default_factory=list, repr=False)
    implicit_inputs: list[str] = field(default_factory=list)

    def all_inputs(self) -> list[str]:
        """Explicit inputs (non-empty) followed by implicit (outer-scope) ones."""
        return [i for i in self.inputs if i] + self.implicit_inputs


def _copy_type(t: onnx.TypeProto) -> onnx.TypeProto:
    c = onnx.TypeProto()
    c.CopyFrom(t)
    return c


class Graph:
    """A model's main graph in the core's form."""

    def __init__(self, model: onnx.ModelProto, infer_shapes: bool = True, weights: dict | None = None):
        """``weights``: values of main-graph initializers that ``model`` lists without data
        (``graph.loader.load``); the arrays are used as they are, not copied."""
        weights = weights or {}
        self.model = model
        self.opsets: dict[str, int] = {}
        for imp in model.opset_import:
            self.opsets["" if imp.domain == "ai.onnx" else imp.domain] = imp.version
        self.opsets.setdefault("", 1)
        self.ir_version = int(model.ir_version)
        self._bodies: dict = {}  # (node, attribute) -> (GraphProto, GraphBody): see node_view
        g = model.graph
        typed = g
        if infer_shapes:
            typed = self._infer(model, weights).graph
        self.types: dict[str, onnx.TypeProto] = {}
        for vi in list(typed.value_info) + list(typed.input) + list(typed.output):
            if vi.type.WhichOneof("value"):
                # from an inferred model, a copy: a reference would keep that model alive
                self.types[vi.name] = vi.type if typed is g else _copy_type(vi.type)
        typed = None  # the inferred model is freed here, not at the end of __init__
        self.initializers: dict[str, np.ndarray] = {}
        for t in g.initializer:
            arr = weights.get(t.name)
            if arr is None:
                try:
                    arr = numpy_helper.to_array(t)
                except Exception as exc:  # a malformed tensor the checker let through (or no checker)
                    raise InvalidModelError(
                        f"initializer {t.name!r} cannot be read: {type(exc).__name__}: {exc} "
                        f"(element type {t.data_type}, dims {list(t.dims)})") from exc
            self.initializers[t.name] = arr
        for st in g.sparse_initializer:
            self.initializers[st.values.name] = dense_of_sparse(st)
        self.inputs: list[onnx.ValueInfoProto] = [i for i in g.input]
        self.outputs: list[onnx.ValueInfoProto] = [o for o in g.output]
        self.nodes: list[Node] = []
        used_names: set[str] = set()
        for idx, n in enumerate(g.node):
            name = n.name or f"{n.op_type}_{idx}"
            while name in used_names:
                name = f"{name}_{idx}"
            used_names.add(name)
            self.nodes.append(self.make_node(n.op_type, list(n.input), list(n.output), name=name,
                                             domain=n.domain, proto_attrs=list(n.attribute)))
        self._check_defined()
        if infer_shapes:  # what onnx cannot type: contrib ops' outputs and what follows them
            fill_types(self)

    # -- construction helpers ------------------------------------------------
    @staticmethod
    def _skeleton(model: onnx.ModelProto, weights: dict | None = None) -> onnx.ModelProto:
        """The model without the data of its large initializers, which become typed graph inputs:
        all shape inference needs (small constants keep their values for data propagation), and
        it serializes in milliseconds instead of copying every weight. Initializers whose values
        are in ``weights`` (listed without data) are large ones."""
        g = model.graph
        weights = weights or {}
        big = [t for t in g.initializer if t.name in weights or t.ByteSize() > _SKELETON_BYTES]
        if not big:
            return model
        sk = onnx.ModelProto(ir_version=model.ir_version)
        sk.opset_import.extend(model.opset_import)
        sk.functions.extend(model.functions)
        sg = sk.graph
        sg.name = g.name
        sg.node.extend(g.node)
        sg.output.extend(g.output)
        sg.value_info.extend(g.value_info)
        sg.sparse_initializer.extend(g.sparse_initializer)
        names = {t.name for t in big}
        sg.initializer.extend(t for t in g.initializer if t.name not in names)
        listed = {i.name for i in g.input}
        sg.input.extend(g.input)
        sg.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                        for t in big if t.name not in listed)
        return sk

    @staticmethod
    def _infer(model: onnx.ModelProto, weights: dict | None = None) -> onnx.ModelProto:
        try:
            # in a child process for models on which onnx's C++ inference is known to crash
            return infer_shapes(Graph._skeleton(model, weights))
        except Exception as exc:  # inference is advisory; the run still checks everything
            logger.info("onnx shape inference failed, continuing without it: %s", exc)
            return model

    def make_node(self, op_type: str, inputs: list[str], outputs: list[str], *, name: str,
                  domain: str = "", proto_attrs: list | None = None, attrs: dict | None = None) -> Node:
        """Create a node with its schema version and resolved attributes."""
        domain = "" if domain == "ai.onnx" else domain
        opset = self.opsets.get(domain, 1)
        schema = get_schema(op_type, domain, opset)
        proto_attrs = list(proto_attrs or [])
        if attrs is not None:
            proto_attrs = [onnx.helper.make_attribute(k, v) for k, v in attrs.items()]
        try:  # from the protos as they are: a copy of a tree ensemble's would be megabytes
            resolved = resolve_attrs(op_type, proto_attrs, schema)
        except ValueError as exc:
            raise InvalidModelError(f"node {name!r} ({op_type}): {exc}") from exc
        implicit: list[str] = []
        for a in proto_attrs:
            subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else (
                list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else [])
            for sg in subs:
                for i in subgraph_outer_names(sg):
                    if i not in implicit:
                        implicit.append(i)
        return Node(name=name, op_type=op_type, domain=domain, inputs=inputs, outputs=outputs,
                    attrs=resolved, since_version=schema.since_version if schema else None,
                    opset=opset, proto_attrs=proto_attrs, implicit_inputs=implicit)

    def _check_defined(self) -> None:
        defined = {i.name for i in self.inputs} | set(self.initializers)
        for n in self.nodes:
            for i in n.all_inputs():
                if i not in defined:
                    raise InvalidModelError(
                        f"node {n.name!r} ({n.op_type}) reads {i!r}, which no earlier node, input "
                        "or initializer defines (the graph is not topologically sorted or is broken)")
            defined.update(o for o in n.outputs if o)
        for o in self.outputs:
            if o.name not in defined:
                raise InvalidModelError(f"graph output {o.name!r} is never produced")

    # -- queries -------------------------------------------------------------
    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.outputs]

    def feed_inputs(self) -> list[onnx.ValueInfoProto]:
        """Graph inputs a caller must (or may) feed: those without an initializer."""
        return [i for i in self.inputs if i.name not in self.initializers]

    def value_info(self, name: str) -> ValueInfo:
        """Everything known about value ``name`` at session creation."""
        if name in self.initializers:
            arr = self.initializers[name]
            return ValueInfo(name, arr.dtype, tuple(arr.shape), "tensor", arr)
        tp = self.types.get(name)
        if tp is None:
            return ValueInfo(name)
        return ValueInfo(name, dtype_of(tp), shape_of(tp), type_kind(tp))

    def node_view(self, node: Node, index: int = -1, cache: dict | None = None) -> NodeView:
        """The read-only view of ``node`` that providers get."""
        def vi(n: str):
            if not n:
                return None
            if cache is not None:
                if n not in cache:
                    cache[n] = self.value_info(n)
                return cache[n]
            return self.value_info(n)

        subgraphs: Mapping = {}
        if node.implicit_inputs or any(isinstance(v, (onnx.GraphProto, list)) for v in node.attrs.values()):
            subgraphs = SubgraphViews(node.name, node.attrs, self.opsets, self.value_info, self.type_of,
                                      cache=self._bodies)
        return NodeView(
            name=node.name, op_type=node.op_type, domain=node.domain,
            since_version=node.since_version, opset=node.opset, attrs=dict(node.attrs),
            inputs=tuple(node.inputs), outputs=tuple(node.outputs),
            input_info=tuple(vi(i) for i in node.inputs),
            output_info=tuple(vi(o) for o in node.outputs),
            implicit_inputs=tuple(node.implicit_inputs), index=index, subgraphs=subgraphs,
            proto_attrs=tuple(node.proto_attrs))

    def type_of(self, name: str) -> onnx.TypeProto | None:
        """The ONNX type of value ``name`` (an initializer's from its array), or ``None``."""
        if name in self.initializers:
            return type_of_array(self.initializers[name])
        return self.types.get(name)

    def consumers(self) -> dict[str, list[int]]:
        """Value name -> indices of nodes that read it (implicit reads included)."""
        out: dict[str, list[int]] = {}
        for idx, n in enumerate(self.nodes):
            for i in n.all_inputs():
                out.setdefault(i, []).append(idx)
        return out

    def producers(self) -> dict[str, int]:
        """Value name -> index of the node that writes it."""
        return {o: idx for idx, n in enumerate(self.nodes) for o in n.outputs if o}

    def to_model(self) -> onnx.ModelProto:
        """Serialise the current graph back to a ModelProto (for offline optimization)."""
        m = onnx.ModelProto()
        m.CopyFrom(self.model)
        g = m.graph
        del g.node[:]
        for n in self.nodes:
            p = onnx.helper.make_node(n.op_type, n.inputs, n.outputs, name=n.name, domain=n.domain)
            p.attribute.extend(n.proto_attrs)
            g.node.append(p)
        del g.initializer[:]
        del g.sparse_initializer[:]
        g.initializer.extend(numpy_helper.from_array(v, k) for k, v in self.initializers.items())
        return m
