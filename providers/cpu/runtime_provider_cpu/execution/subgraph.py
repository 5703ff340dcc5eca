"""Subgraphs (If / Loop / Scan / SequenceMap bodies) compiled into nested executables.

A body is compiled once, when the partition holding its node compiles, into a nested
:class:`~.executable.CPUExecutable` over duck-typed node views (this package does not import
runtime-core). Its inputs are the body's formal inputs followed by the outer-scope values it
reads.
"""

from __future__ import annotations

import numpy as np

from ..registry import SCOPE
from .step import STOP


def with_outer(fn, n_explicit: int, names: tuple):
    """Call ``fn`` with the explicit inputs positionally and the implicit ones as ``outer``."""
    def call(ctx, *args, **attrs):
        return fn(ctx, *args[:n_explicit], outer=dict(zip(names, args[n_explicit:])), **attrs)
    return call


def _graph_attrs(node) -> dict:
    """``attr name -> GraphProto`` (``name[i]`` for GRAPHS attributes) of a node."""
    import onnx

    out = {}
    for k, v in node.attrs.items():
        if isinstance(v, onnx.GraphProto):
            out[k] = v
        elif isinstance(v, list) and v and all(isinstance(x, onnx.GraphProto) for x in v):
            for i, g in enumerate(v):
                out[f"{k}[{i}]"] = g
    return out


def compile_subgraphs(ctx, node, partition, opsets, check_kernels) -> None:
    outer_info = getattr(partition, "value", None)
    if opsets is None:
        scope = SCOPE.get()
        opsets = dict(scope[0]) if scope else {}
    opsets = dict(opsets)
    opsets.setdefault(node.domain, node.opset)
    for attr, g in _graph_attrs(node).items():
        ctx.subgraphs[attr] = Subgraph(g, opsets, outer_info, name=f"{node.name}/{attr}",
                                       check_kernels=check_kernels)


def subgraph_outer_names(g) -> list[str]:
    """Names a (nested) subgraph reads that it does not define itself.

    The same rule as ``runtime_core.graph.ir.subgraph_outer_names``: the CPU provider does
    not import the core (the core depends on it, never the other way), so the few graph
    helpers that subgraph compilation needs live here too (also ``_resolve_attrs``).
    """
    import onnx

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


class BodyValue:
    """What is known about one value of a subgraph (the core's ValueInfo, duck-typed)."""

    __slots__ = ("const", "dtype", "kind", "name", "shape", "type_proto")

    def __init__(self, name, dtype=None, shape=None, kind="tensor", const=None, type_proto=None):
        self.name, self.dtype, self.shape, self.kind, self.const = name, dtype, shape, kind, const
        self.type_proto = type_proto  # the full onnx type when known (nested bodies' inference)

    @property
    def is_constant(self) -> bool:
        return self.const is not None

    @property
    def static_shape(self):
        if self.shape is None or any(not isinstance(d, int) for d in self.shape):
            return None
        return tuple(self.shape)

    @property
    def nbytes(self):
        shape = self.static_shape
        if shape is None or self.dtype is None or self.dtype == np.dtype(object):
            return None
        return int(np.prod(shape, dtype=np.int64)) * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"BodyValue({self.name!r}, {self.dtype}, {self.shape}, {self.kind})"


class BodyNode:
    """One node of a subgraph (the core's NodeView, duck-typed)."""

    __slots__ = (
        "attrs",
        "domain",
        "implicit_inputs",
        "index",
        "input_info",
        "inputs",
        "name",
        "op_type",
        "opset",
        "output_info",
        "outputs",
        "since_version",
    )

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)

    @property
    def qualified_op(self) -> str:
        dom = self.domain or "ai.onnx"
        ver = "?" if self.since_version is None else str(self.since_version)
        return f"{dom}::{self.op_type}-{ver}"


def _elem_dtype(elem: int):
    import onnx
    from onnx import helper

    if elem == onnx.TensorProto.UNDEFINED:
        return None
    if elem == onnx.TensorProto.STRING:
        return np.dtype(object)
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem))
    except (KeyError, ValueError, TypeError):
        return None


def _value_from_type(name: str, tp) -> BodyValue:
    v = _value_from_type1(name, tp)
    v.type_proto = tp
    return v


def _value_from_type1(name: str, tp) -> BodyValue:
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        t = tp.tensor_type
        shape = None
        if t.HasField("shape"):
            shape = tuple(int(d.dim_value) if d.HasField("dim_value") else
                          (d.dim_param if d.HasField("dim_param") and d.dim_param else None)
                          for d in t.shape.dim)
        return BodyValue(name, _elem_dtype(t.elem_type), shape, "tensor")
    if which == "sequence_type":
        inner = _value_from_type(name, tp.sequence_type.elem_type)
        return BodyValue(name, inner.dtype, None, "sequence")
    if which == "optional_type":
        inner = _value_from_type(name, tp.optional_type.elem_type)
        return BodyValue(name, inner.dtype, None, "optional")
    if which == "map_type":
        return BodyValue(name, None, None, "map")
    return BodyValue(name)


def _type_from_value(info):
    """A TypeProto for an outer value's ValueInfo (``None`` when too little is known)."""
    import onnx
    from onnx import helper

    if info is None:
        return None
    if getattr(info, "type_proto", None) is not None:
        return info.type_proto
    if info.dtype is None:
        return None
    if info.dtype == np.dtype(object):
        elem = onnx.TensorProto.STRING
    else:
        try:
            elem = helper.np_dtype_to_tensor_dtype(np.dtype(info.dtype))
        except (KeyError, ValueError, TypeError):
            return None
    kind = getattr(info, "kind", "tensor")
    if kind == "tensor":
        shape = info.shape
        return helper.make_tensor_type_proto(
            elem, None if shape is None else [d if isinstance(d, (int, str)) else None for d in shape])
    if kind == "sequence":
        return helper.make_sequence_type_proto(helper.make_tensor_type_proto(elem, None))
    return None  # an optional's element kind is not known from a ValueInfo


def _infer_types(g, opsets: dict, outer: dict) -> dict:
    """Types of a subgraph's values from onnx shape inference over the body, its outer
    reads declared as extra graph inputs. Best effort: what the body declares otherwise."""
    import onnx
    from onnx import helper

    types = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if vi.type.WhichOneof("value"):
            types[vi.name] = vi.type
    gg = onnx.GraphProto()
    gg.CopyFrom(g)
    for name, info in outer.items():
        tp = _type_from_value(info)
        vi = onnx.ValueInfoProto(name=name)
        if tp is not None:
            vi.type.CopyFrom(tp)
        gg.input.append(vi)
    try:
        model = helper.make_model(gg, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()
                                                      if v is not None])
        model.ir_version = onnx.IR_VERSION
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False,
                                                     data_prop=True)
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
            if vi.type.WhichOneof("value"):  # inference merges what the body declares
                types[vi.name] = vi.type
    except Exception:  # noqa: BLE001 - inference is advisory; kernels cope with unknown types
        pass
    return types


def _resolve_attrs(n, schema) -> dict:
    from onnx import AttributeProto, helper, numpy_helper

    def value(a):
        t = a.type
        if t == AttributeProto.INT:
            return int(a.i)
        if t == AttributeProto.FLOAT:
            return float(a.f)
        if t == AttributeProto.STRING:
            return a.s.decode("utf-8", errors="surrogateescape")
        if t == AttributeProto.INTS:
            return [int(v) for v in a.ints]
        if t == AttributeProto.FLOATS:
            return [float(v) for v in a.floats]
        if t == AttributeProto.STRINGS:
            return [x.decode("utf-8", errors="surrogateescape") for x in a.strings]
        if t == AttributeProto.TENSOR:
            return numpy_helper.to_array(a.t)
        if t == AttributeProto.TENSORS:
            return [numpy_helper.to_array(x) for x in a.tensors]
        if t == AttributeProto.GRAPH:
            return a.g
        if t == AttributeProto.GRAPHS:
            return list(a.graphs)
        if t == AttributeProto.SPARSE_TENSOR:
            from onnx.reference.op_run import to_sparse_tensor

            return to_sparse_tensor(a.sparse_tensor)
        if t == AttributeProto.TYPE_PROTO:
            return a.tp
        if t == AttributeProto.TYPE_PROTOS:
            return list(a.type_protos)
        return helper.get_attribute_value(a)

    given = {a.name: a for a in n.attribute}
    if schema is None:
        return {k: value(a) for k, a in given.items()}
    out = {}
    for k, spec in schema.attributes.items():
        if k in given:
            out[k] = value(given[k])
        elif spec.required:
            raise ValueError(f"required attribute {k!r} of {n.op_type} is missing")
        else:
            d = spec.default_value
            out[k] = value(d) if d is not None and d.type != AttributeProto.UNDEFINED else None
    unknown = [k for k in given if k not in schema.attributes]
    if unknown:
        raise ValueError(f"attribute(s) {', '.join(unknown)} are not defined by "
                         f"{n.op_type}-{schema.since_version}")
    return out


class _BodyPartition:
    """A subgraph in the shape of a core Partition (what CPUExecutable compiles)."""

    def __init__(self, nodes, inputs, outputs, constants, values):
        self.id = -1
        self.provider = "CPUExecutionProvider"
        self.nodes = tuple(nodes)
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.constants = constants
        self.values = values

    def value(self, name):
        return self.values.get(name) or BodyValue(name)


def body_views(g, opsets: dict, outer_info=None, name: str = "") -> _BodyPartition:
    """The nodes of subgraph ``g`` as node views, with types and resolved attributes."""
    import onnx
    from onnx import numpy_helper

    outer_names = subgraph_outer_names(g)
    outer = {n: (outer_info(n) if outer_info is not None else None) for n in outer_names}
    types = _infer_types(g, opsets, outer)
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    for st in g.sparse_initializer:
        from onnx.reference.op_run import to_sparse_tensor

        sp = to_sparse_tensor(st)
        dense = np.zeros(tuple(sp.dense_shape), dtype=sp.values.dtype)
        idx = sp.indices
        if idx.ndim == 1:
            dense.reshape(-1)[idx] = sp.values
        else:
            dense[tuple(idx.T)] = sp.values
        consts[st.values.name] = dense
    values: dict = {}

    def vi(n):
        if not n:
            return None
        if n not in values:
            if n in consts:
                a = consts[n]
                values[n] = BodyValue(n, a.dtype, tuple(a.shape), "tensor", a)
            elif n in types:
                values[n] = _value_from_type(n, types[n])
            elif n in outer and outer[n] is not None:
                values[n] = outer[n]
            else:
                values[n] = BodyValue(n)
        return values[n]

    nodes = []
    used = set()
    for idx, n in enumerate(g.node):
        domain = "" if n.domain == "ai.onnx" else n.domain
        opset = opsets.get(domain)
        try:
            schema = onnx.defs.get_schema(n.op_type, max_inclusive_version=opset if opset else 10 ** 6,
                                          domain=domain)
        except onnx.defs.SchemaError:
            schema = None
        nname = n.name or f"{n.op_type}_{idx}"
        while nname in used:
            nname = f"{nname}_{idx}"
        used.add(nname)
        attrs = _resolve_attrs(n, schema)
        implicit: list[str] = []
        for a in n.attribute:
            subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else (
                list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else [])
            for sg in subs:
                for i in subgraph_outer_names(sg):
                    if i not in implicit:
                        implicit.append(i)
        nodes.append(BodyNode(
            name=f"{name}/{nname}" if name else nname, op_type=n.op_type, domain=domain,
            since_version=schema.since_version if schema is not None else None,
            opset=opset if opset is not None else (schema.since_version if schema is not None else 1),
            attrs=attrs, inputs=tuple(n.input), outputs=tuple(n.output),
            input_info=tuple(vi(i) for i in n.input), output_info=tuple(vi(o) for o in n.output),
            implicit_inputs=tuple(implicit), index=idx))
    for i in list(g.input) + list(g.output):
        vi(i.name)
    for n in outer_names:
        vi(n)
    return _BodyPartition(nodes, [i.name for i in g.input] + outer_names,
                          [o.name for o in g.output], consts, values)


def subgraph_decline_reason(node, decline) -> str | None:
    """Why a control-flow node cannot run: the first node of its subgraphs (nested ones
    included) that ``decline(view)`` refuses, named with its op. ``None`` when all can run."""
    scope = SCOPE.get()
    opsets = dict(scope[0]) if scope else {}
    opsets.setdefault(node.domain, node.opset)
    outer_info = scope[1] if scope else None
    for attr, g in _graph_attrs(node).items():
        try:
            part = body_views(g, opsets, outer_info, name=node.name)
        except Exception as exc:  # noqa: BLE001 - a malformed body is declined, not raised
            return f"{node.op_type} subgraph {attr!r} cannot be read: {type(exc).__name__}: {exc}"
        token = SCOPE.set((opsets, part.value))
        try:
            for view in part.nodes:
                why = decline(view)
                if why:
                    return (f"{node.op_type} subgraph {attr!r} node {view.name!r} "
                            f"({view.domain or 'ai.onnx'}::{view.op_type}): {why}")
        finally:
            SCOPE.reset(token)
    return None


class Subgraph:
    """A compiled body: ``run(inputs, outer)`` returns its outputs as a list.

    ``inputs`` are the values of the body's formal inputs in order; ``outer`` maps
    outer-scope names to values (a superset of what this body reads is fine).
    """

    def __init__(self, g, opsets: dict, outer_info=None, name: str = "",
                 check_kernels: bool | None = None):
        self.graph = g
        self.name = name
        part = body_views(g, opsets, outer_info, name=name)
        self.partition = part
        self.input_names = [i.name for i in g.input]
        self.output_names = [o.name for o in g.output]
        self.outer_names = part.inputs[len(self.input_names):]
        self.output_info = [part.value(o) for o in self.output_names]
        from .executable import CPUExecutable  # a body is a partition like any other

        token = SCOPE.set((opsets, part.value))
        try:
            self.executable = CPUExecutable(part, check_kernels=check_kernels, opsets=opsets)
        finally:
            SCOPE.reset(token)

    def run(self, inputs, outer: dict) -> list:
        if len(inputs) != len(self.input_names):
            raise ValueError(f"subgraph {self.name!r} takes {len(self.input_names)} inputs "
                             f"({', '.join(self.input_names)}), got {len(inputs)}")
        try:
            extra = [outer[n] for n in self.outer_names]
        except KeyError as exc:
            raise ValueError(f"subgraph {self.name!r} reads {exc.args[0]!r} from the outer scope, "
                             "which is not bound") from None
        return self.executable.run(list(inputs) + extra, stop=STOP.get())
