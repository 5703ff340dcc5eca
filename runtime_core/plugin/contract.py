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
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

__all__ = [
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
    """

    def __init__(self, nodes: Sequence[NodeView], values: Mapping[str, ValueInfo],
                 opsets: Mapping[str, int], all_nodes: Sequence[NodeView] | None = None):
        self._nodes = tuple(nodes)
        self._values = values
        self.opsets = dict(opsets)
        self._all = tuple(all_nodes) if all_nodes is not None else self._nodes

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
    config: Mapping[str, str] = field(default_factory=dict, repr=False)

    def value(self, name: str) -> ValueInfo:
        """The :class:`ValueInfo` of ``name``."""
        return self.values.get(name) or ValueInfo(name)


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
