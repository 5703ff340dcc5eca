"""Explicit kernel registration for the CPU provider.

A kernel is registered with :func:`kernel`, keyed by domain, op type and the ONNX
schema *since-versions* whose semantics it implements::

    @kernel("Softmax", 13)
    def softmax(ctx, x, *, axis):
        ...

Kernels are called as ``fn(ctx, *inputs, **attrs)``: ``inputs`` are numpy arrays
(``None`` for an omitted optional input; trailing omitted inputs are not
passed), ``attrs`` are every attribute of the schema, resolved by the core with
the schema's defaults (``None`` when absent and without a default). ``ctx`` is a
:class:`KernelContext`. A kernel returns one array, or a *tuple* of arrays for a
node with several outputs (a *list* is a sequence value).

A node whose schema version is not listed for its op is declined with a reason;
``check(node)`` may decline further (attributes, dtypes, shapes) by returning a
reason string. Modules of kernels are imported by name in ``ops/__init__.py``.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

__all__ = ["KernelContext", "KernelSpec", "REGISTRY", "kernel"]


@dataclass(frozen=True)
class KernelContext:
    """Static facts about the node a kernel runs, fixed when the partition compiles.

    ``node`` is the core's NodeView (name, op_type, attrs, inputs, outputs, ...).
    ``n_outputs`` counts the node's declared outputs (omitted ones included);
    ``input_dtypes`` / ``output_dtypes`` are inferred numpy dtypes or ``None``.
    ``cache`` is a dict the kernel may fill at first run with values derived only
    from attributes and constant inputs. ``threads`` is how many threads a kernel of its
    own (a compiled one) may use: the partition's ``intra_op_num_threads``.
    """

    node: Any
    n_outputs: int
    input_dtypes: tuple
    output_dtypes: tuple
    cache: dict = field(default_factory=dict, compare=False)
    threads: int = 1
    #: the session's tensor-size cap in bytes (plugin API 1.3 ``Partition.max_tensor_bytes``);
    #: 0: the default of :mod:`runtime_provider_cpu.limits`
    max_tensor_bytes: int = 0
    #: whether kernels with competing candidates measure them on this machine (``fast/autotune.py``);
    #: False (session config entry ``session.cpu.autotune`` = "0"): the library call
    tune: bool = True
    #: control-flow kernels only: the node's GRAPH attributes compiled to
    #: :class:`~runtime_provider_cpu.execution.subgraph.Subgraph` objects, by attribute name
    subgraphs: dict = field(default_factory=dict, compare=False)
    #: what kernels derive from constant weights, shared by every node of the partition
    #: (one dict per compiled partition; see :func:`~runtime_provider_cpu.fast.packing.shared`)
    weights: dict = field(default_factory=dict, compare=False)

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def outputs_wanted(self) -> tuple[bool, ...]:
        """For each declared output, whether the graph uses it (name not empty)."""
        return tuple(bool(o) for o in self.node.outputs)


@dataclass(frozen=True)
class KernelSpec:
    domain: str
    op_type: str
    versions: tuple[int, ...]
    fn: Callable
    check: Callable | None = None
    dtypes: frozenset | None = None
    control: bool = False


class KernelRegistry:
    """Kernels by (domain, op type, since-version)."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str, int], KernelSpec] = {}
        self._versions: dict[tuple[str, str], set[int]] = {}

    def add(self, spec: KernelSpec) -> None:
        for v in spec.versions:
            key = (spec.domain, spec.op_type, v)
            if key in self._by_key:
                raise ValueError(f"kernel for {spec.domain or 'ai.onnx'}::{spec.op_type}-{v} registered twice")
            self._by_key[key] = spec
            self._versions.setdefault((spec.domain, spec.op_type), set()).add(v)

    def lookup(self, domain: str, op_type: str, version: int | None) -> KernelSpec | None:
        """The kernel for exactly this schema version, or ``None``."""
        if version is None:
            # ops without a schema the core knows (custom domains): take the newest
            vers = self._versions.get((domain, op_type))
            if not vers:
                return None
            version = max(vers)
        return self._by_key.get((domain, op_type, version))

    def versions(self, domain: str, op_type: str) -> list[int]:
        """The schema versions registered for an op, sorted (empty when none)."""
        return sorted(self._versions.get((domain, op_type), ()))

    def ops(self) -> list[tuple[str, str, list[int]]]:
        """Every registered op as (domain, op_type, versions)."""
        return sorted((d, o, sorted(v)) for (d, o), v in self._versions.items())


REGISTRY = KernelRegistry()

#: What a kernel's ``check`` may look up while the provider answers ``get_capability``:
#: ``(opsets, value_info)`` with ``opsets`` the (sub)graph's opset imports (domain -> version,
#: ``""`` for ai.onnx) and ``value_info(name)`` the ValueInfo of a value in scope; for the
#: main graph a third item holds every NodeView of the graph (``Gradient`` reads the nodes
#: it differentiates there). Compilation needs none of it: the partition carries everything.
SCOPE: contextvars.ContextVar = contextvars.ContextVar("runtime_provider_cpu_scope", default=None)


def kernel(op_type: str, *versions: int, domain: str = "", check: Callable | None = None,
           dtypes=None, control: bool = False):
    """Register the decorated function as the kernel of ``op_type`` at ``versions``.

    ``versions`` are ONNX schema since-versions (``onnx.defs`` history) whose
    semantics the function implements exactly. ``dtypes``, when given, is the set
    of numpy dtype names the kernel accepts for its first input; other dtypes are
    declined with a reason. ``check(node) -> str | None`` declines further.

    ``control=True`` marks a kernel with subgraphs (If, Loop, Scan, SequenceMap): its
    GRAPH attributes are compiled once into ``ctx.subgraphs`` (attribute name ->
    :class:`~runtime_provider_cpu.execution.subgraph.Subgraph`), and it is called with one more
    keyword, ``outer``: a dict of the outer-scope values its subgraphs read (the node's
    implicit inputs). Each subgraph's ops are checked at capability time (a body with an
    op the provider cannot run declines the node, naming that op).
    """
    if not versions:
        raise ValueError(f"kernel {op_type}: give at least one schema version")

    def deco(fn: Callable) -> Callable:
        REGISTRY.add(KernelSpec(domain, op_type, tuple(versions), fn, check,
                                frozenset(dtypes) if dtypes else None, control))
        return fn

    return deco


def as_array(x) -> np.ndarray:
    """``np.asarray`` that keeps sequences (lists) and ``None`` untouched."""
    if x is None or isinstance(x, (np.ndarray, list)):
        return x
    return np.asarray(x)
