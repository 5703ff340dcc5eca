"""Objects that cross the boundary between the core and a provider.

The core hands providers read-only *views* of the graph (:class:`GraphView`,
:class:`NodeView`, :class:`ValueInfo`, :class:`Partition`); providers answer with
plain objects that have the attributes documented here (:class:`ProbeResult`,
:class:`Capability`, or any object of the same shape: the CPU provider, which
must not import runtime-core, returns its own). Attribute values in
``NodeView.attrs`` are already resolved against the ONNX schema, defaults
included, so kernels never invent defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

__all__ = [
    "SessionSettings",
    "ValueInfo",
    "NodeView",
    "GraphBody",
    "GraphView",
    "Partition",
    "ProbeResult",
    "Capability",
]


@dataclass(frozen=True, eq=False)
class ValueInfo:
    """What is known about one value (tensor) of the graph before it runs.

    ``dtype`` is a numpy dtype (``object`` for strings; ml_dtypes types for
    bfloat16/float8), or ``None`` when unknown. ``shape`` is a tuple whose dims are
    ``int`` (static), ``str`` (symbolic, by name) or ``None`` (unknown), or
    ``None`` when even the rank is unknown. ``kind`` is ``"tensor"``,
    ``"sequence"``, ``"optional"`` or ``"map"``. ``const`` holds the value when it
    is an initializer or otherwise known at session creation.
    """

    name: str
    dtype: np.dtype | None = None
    shape: tuple | None = None
    kind: str = "tensor"
    const: np.ndarray | None = None

    @property
    def is_constant(self) -> bool:
        """True when the value is known at session creation (``const`` is set)."""
        return self.const is not None

    @property
    def static_shape(self) -> tuple[int, ...] | None:
        """The shape when every dim is a known int, else ``None``."""
        if self.shape is None or any(not isinstance(d, int) for d in self.shape):
            return None
        return tuple(self.shape)

    @property
    def nbytes(self) -> int | None:
        """Size in bytes when dtype and shape are static, else ``None``."""
        shape = self.static_shape
        if shape is None or self.dtype is None or self.dtype == np.dtype(object):
            return None
        return int(np.prod(shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass(frozen=True, eq=False)
class NodeView:
    """One node as providers see it.

    ``since_version`` is the version of the ONNX schema that applies to this node
    under the model's opset import (``None`` for ops without a known schema);
    ``opset`` is the imported opset of the node's domain. ``inputs`` and
    ``outputs`` are value names; an empty string marks an omitted optional
    input or output. ``implicit_inputs`` lists outer-scope values read by the
    node's subgraphs.

    ``subgraphs`` (plugin API 1.3) maps each GRAPH attribute (``name[i]`` for the graphs of
    a GRAPHS attribute) to its body as a :class:`GraphBody`, built by the core on first
    access: providers never read a subgraph's protobuf or resolve its attributes themselves.

    ``proto_attrs`` (plugin API 1.4) are the node's ``AttributeProto``s as the model (or the
    optimizer's fusion) wrote them, types and subgraphs included: what :meth:`to_proto`
    uses. Empty for a view built without them (attributes are then rebuilt from ``attrs``).
    """

    name: str
    op_type: str
    domain: str
    since_version: int | None
    opset: int
    attrs: Mapping[str, Any]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    input_info: tuple[ValueInfo | None, ...]
    output_info: tuple[ValueInfo | None, ...]
    implicit_inputs: tuple[str, ...] = ()
    index: int = -1
    subgraphs: Mapping[str, "GraphBody"] = field(default_factory=dict, repr=False)
    proto_attrs: tuple = field(default=(), repr=False)

    def to_proto(self):
        """The node as an ``onnx.NodeProto`` (plugin API 1.4): its name, op type, domain,
        inputs and outputs, and its attributes as written in the model, with their types;
        GRAPH attributes carry their bodies as they are (their own nodes, initializers and
        outer-scope reads). Attributes the model left to their defaults stay unset, as in the
        model. A new object on each call: changing it changes nothing in the core."""
        from .export import node_proto

        return node_proto(self)

    @property
    def qualified_op(self) -> str:
        """``domain::op_type-since_version`` (``ai.onnx`` for the default domain)."""
        dom = self.domain or "ai.onnx"
        ver = "?" if self.since_version is None else str(self.since_version)
        return f"{dom}::{self.op_type}-{ver}"


@dataclass(frozen=True, eq=False)
class GraphBody:
    """A subgraph (an If branch, a Loop or Scan body, ...) as providers see it (plugin API 1.3).

    ``nodes`` are :class:`NodeView` objects in the body's order, named
    ``{node}/{attribute}/{body node}``, attributes resolved and types inferred as for the
    main graph (nested bodies in their own ``subgraphs``). ``inputs`` are the body's formal
    inputs, ``outer_inputs`` the enclosing scopes' values it reads (nested bodies' reads
    included), ``outputs`` its outputs, ``constants`` its initializers as host arrays and
    ``value(name)`` the :class:`ValueInfo` of any value it sees (outer ones included).
    """

    name: str
    nodes: tuple[NodeView, ...]
    inputs: tuple[str, ...]
    outer_inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    constants: Mapping[str, np.ndarray]
    values: Mapping[str, ValueInfo] = field(default_factory=dict, repr=False)
    opsets: Mapping[str, int] = field(default_factory=dict)

    def value(self, name: str) -> ValueInfo:
        """The :class:`ValueInfo` of ``name`` (an empty one when nothing is known)."""
        return self.values.get(name) or ValueInfo(name)


class GraphView:
    """A read-only view of (part of) the graph offered to ``get_capability``.

    Iterating yields the :class:`NodeView` of every node still unclaimed, in a
    topological order. ``value(name)`` returns the :class:`ValueInfo` of any value.

    ``opset_imports`` (plugin API 1.4; ``opsets`` is the same mapping) is the model's
    opset import, domain (``""`` for ``ai.onnx``) to version: every domain the model uses,
    inside subgraph bodies included, and any domain the optimizer's fusions added
    (``com.microsoft``). ``ir_version`` (1.4) is the model's IR version (0 when the view
    was built without one). ``settings`` (1.4) is the session's :class:`SessionSettings`.
    """

    def __init__(self, nodes: Sequence[NodeView], values: Mapping[str, ValueInfo],
                 opsets: Mapping[str, int], all_nodes: Sequence[NodeView] | None = None, *,
                 ir_version: int = 0, settings: "SessionSettings | None" = None,
                 type_lookup: Callable[[str], Any] | None = None):
        self._nodes = tuple(nodes)
        self._values = values
        self.opsets = dict(opsets)
        self._all = tuple(all_nodes) if all_nodes is not None else self._nodes
        self.ir_version = int(ir_version)
        self.settings = settings if settings is not None else SessionSettings()
        self._type_lookup = type_lookup

    def to_model(self, nodes: Sequence[NodeView]):
        """``nodes`` (some of this view's, in order) as a standalone ``onnx.ModelProto``
        (plugin API 1.4), built as :meth:`Partition.to_model` builds a partition's: for a
        provider that asks its back end, in ``get_capability``, whether it takes a node or a
        group. Its inputs are the values the nodes read and do not compute (initializers
        become initializers), its outputs every value they compute."""
        from .export import opsets_of, partition_model

        nodes = tuple(nodes)
        produced: list[str] = []
        read: list[str] = []
        for n in nodes:
            for i in tuple(i for i in n.inputs if i) + tuple(n.implicit_inputs):
                if i not in produced and i not in read:
                    read.append(i)
            produced.extend(o for o in n.outputs if o)
        consts: dict[str, np.ndarray] = {}
        for i in read:
            const = self.value(i).const
            if const is not None:
                consts[i] = const
        part = Partition(id=0, provider="", nodes=nodes, inputs=tuple(i for i in read if i not in consts),
                         outputs=tuple(produced), constants=consts, values=self._values,
                         opset_imports=opsets_of(nodes, self.opsets), ir_version=self.ir_version,
                         settings=self.settings, type_lookup=self._type_lookup)
        return partition_model(part)

    @property
    def opset_imports(self) -> dict[str, int]:
        """The model's opset imports, domain (``""`` for ``ai.onnx``) -> version (plugin API 1.4)."""
        return dict(self.opsets)

    @property
    def all_nodes(self) -> tuple[NodeView, ...]:
        """Every node of the graph, offered or not (plugin API 1.1): for ops whose meaning
        depends on other nodes (``Gradient`` differentiates the nodes that compute its ``y``)."""
        return self._all

    @property
    def nodes(self) -> tuple[NodeView, ...]:
        """The offered nodes, topologically ordered."""
        return self._nodes

    def __iter__(self) -> Iterator[NodeView]:
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def value(self, name: str) -> ValueInfo:
        """The :class:`ValueInfo` of ``name`` (an empty one when nothing is known)."""
        return self._values.get(name) or ValueInfo(name)


@dataclass(frozen=True, eq=False)
class Partition:
    """A convex group of nodes handed to one provider's ``compile``.

    ``inputs`` are the values the executable receives at run time, in order, already
    on the provider's device; ``outputs`` are the values it must return, in order.
    ``constants`` maps each initializer the nodes read to its host array: the
    executable binds them once (for a device provider, uploads them once).

    ``inter_op_num_threads`` is how many threads the executable may use to run
    independent nodes at once, the caller's included: 1 (the default, and always under
    ``ExecutionMode.ORT_SEQUENTIAL``) means in order on the caller's thread; under
    ``ORT_PARALLEL`` it is the session's ``inter_op_num_threads`` (0 already resolved to
    the core count). A provider may ignore it; one that uses it must give the results
    of the sequential order and stay safe under concurrent ``run`` calls.

    ``intra_op_num_threads`` (plugin API 1.2) is how many threads one node's kernel may
    use: the session's ``intra_op_num_threads``, 0 resolved to the cores this process may
    run on; 0 here means the session did not say (a provider picks its own default).

    ``cpu_mem_arena`` is ``SessionOptions.enable_cpu_mem_arena``: whether host memory freed
    by a run may be kept for the next one instead of going back to the system (a hint a
    provider may ignore).

    ``max_tensor_bytes`` (plugin API 1.3) is the session's tensor-size cap (config entry
    ``session.max_tensor_bytes``): a kernel whose output size comes from input values
    (Expand, ConstantOfShape, Tile, Range, Pad, ...) refuses a larger output with
    ``MemoryError`` before allocating it; 0 means the session did not say.

    What the fields hold for nodes with subgraphs (If, Loop, Scan, ...): ``inputs`` are
    every value the nodes read that the partition does not compute and that is not an
    initializer, in first-read order: explicit inputs and the outer-scope values their
    bodies read (at any depth) alike. ``constants`` are the main graph's initializers the
    nodes read, directly or from inside a body; a body's own initializers stay in the body.
    The two never overlap. ``outputs`` are the values the partition computes that a node
    outside it, or the graph's output list, reads. Values a body computes are never
    partition inputs or outputs.

    Plugin API 1.4: ``opset_imports`` (domain -> version, ``""`` for ``ai.onnx``) are the
    opsets the nodes need, domains used only inside bodies included, at the model's
    versions; ``ir_version`` is the model's IR version; ``settings`` is the session's
    :class:`SessionSettings`; :meth:`to_model` gives the partition as a standalone model.
    ``config`` (plugin API 1.4) is the session's config entries (``SessionOptions.
    add_session_config_entry``), read-only: a provider reads its own (the CPU provider's
    ``session.cpu.autotune``) and ignores the rest.
    """

    id: int
    provider: str
    nodes: tuple[NodeView, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    constants: Mapping[str, np.ndarray]
    values: Mapping[str, ValueInfo] = field(default_factory=dict, repr=False)
    inter_op_num_threads: int = 1
    cpu_mem_arena: bool = True
    intra_op_num_threads: int = 0
    max_tensor_bytes: int = 0
    opset_imports: Mapping[str, int] = field(default_factory=dict)
    ir_version: int = 0
    settings: "SessionSettings" = field(default_factory=lambda: SessionSettings())
    #: name -> ``onnx.TypeProto`` (or ``None``) as the core knows it; used by :meth:`to_model`
    type_lookup: Callable[[str], Any] | None = field(default=None, repr=False)
    config: Mapping[str, str] = field(default_factory=dict, repr=False)

    def value(self, name: str) -> ValueInfo:
        """The :class:`ValueInfo` of ``name``."""
        return self.values.get(name) or ValueInfo(name)

    def to_model(self):
        """The partition as a standalone ``onnx.ModelProto`` (plugin API 1.4), for a provider
        that hands it to another runtime.

        Its graph inputs are ``inputs`` in order, with their types and shapes (symbolic dims
        by name); its initializers are ``constants``; its outputs are ``outputs`` in order,
        typed; its nodes are ``[n.to_proto() for n in nodes]`` (subgraphs included, reading
        the outer-scope values that are graph inputs or initializers here); ``value_info``
        types every value the nodes compute whose type is known; its opset imports are
        ``opset_imports`` and its IR version ``ir_version``. The model passes
        ``onnx.checker.check_model`` whenever the rank of every input and output is known
        (the core types the outputs of its own fused ``com.microsoft`` ops too); a value of
        unknown rank is declared with its element type only, which onnxruntime accepts and
        the checker does not. A new model on each call."""
        from .export import partition_model

        return partition_model(self)


@dataclass(frozen=True)
class SessionSettings:
    """The session's settings that a provider (above all one delegating to another runtime)
    may want to follow, in one object (plugin API 1.4): ``Partition.settings`` and
    ``GraphView.settings``. A provider may ignore any of them.

    * ``graph_optimization_level``: ``SessionOptions.graph_optimization_level`` as an int
      (0 disabled, 1 basic, 2 extended, 99 all; onnxruntime's values). The core has already
      optimized at this level; a delegate may optimize its partition at the same level;
    * ``log_severity_level`` / ``log_verbosity_level``: ``SessionOptions``' (0 verbose,
      1 info, 2 warning, 3 error, 4 fatal);
    * ``intra_op_num_threads``: threads one node's kernel may use (0 in the session resolved
      to the cores this process may run on), as ``Partition.intra_op_num_threads``;
    * ``inter_op_num_threads``: the session's value, 0 resolved the same way (used only under
      ``execution_mode`` 1, parallel);
    * ``execution_mode``: 0 sequential, 1 parallel (``ExecutionMode``);
    * ``enable_cpu_mem_arena``, ``enable_mem_pattern``, ``enable_mem_reuse``,
      ``use_deterministic_compute``: ``SessionOptions``' flags;
    * ``config_entries``: every session config entry (``add_session_config_entry``), strings.

    The defaults are ``SessionOptions()``'s (threads 0: not said).
    """

    graph_optimization_level: int = 99
    log_severity_level: int = 2
    log_verbosity_level: int = 0
    intra_op_num_threads: int = 0
    inter_op_num_threads: int = 0
    execution_mode: int = 0
    enable_cpu_mem_arena: bool = True
    enable_mem_pattern: bool = True
    enable_mem_reuse: bool = True
    use_deterministic_compute: bool = False
    config_entries: Mapping[str, str] = field(default_factory=dict)


@dataclass
class ProbeResult:
    """What ``probe()`` returns: can this provider run here, on what, and if not, why."""

    available: bool
    reason: str = ""
    devices: list = field(default_factory=list)


@dataclass
class Capability:
    """What ``get_capability()`` returns.

    ``claims`` is a list whose items are a :class:`NodeView` (claimed alone; the
    core merges neighbouring single claims into convex partitions) or a sequence
    of NodeViews (a group the provider wants compiled as one unit; it must be
    convex, else the core rejects it and says why). ``declined`` maps a node name
    to the reason the provider does not take it (op, opset, dtype, attribute or
    shape); nodes neither claimed nor declined are reported as declined with
    "no reason given".
    """

    claims: list = field(default_factory=list)
    declined: dict = field(default_factory=dict)
