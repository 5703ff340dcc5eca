"""The pass interface and :class:`Editor`, the graph-editing helpers every pass shares.

A pass is a small class with a ``name``, the ``level`` it belongs to and an
``apply(graph) -> int`` returning how many rewrites it made. Passes edit the
core :class:`~runtime_core.graph.ir.Graph` in place through :class:`Editor`,
which answers the questions every rewrite must ask before it applies (who
produces and who reads a value, is it a graph output, is it a constant, what
is its shape) and keeps the node list topologically ordered.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any, Iterable

import numpy as np
import onnx

from ..graph.ir import Graph, Node
from ..graph.order import stable_order
from ..graph.types import dtype_to_elem

logger = logging.getLogger("runtime_core.optimizer")

BASIC, EXTENDED, ALL = 1, 2, 99

MS_DOMAIN = "com.microsoft"
#: the domain of the fused ops only runtime-core runs (``portable.py`` writes them back as standard ops)
FUSED_DOMAIN = "runtime_core.fused"

#: ops whose outputs differ from run to run: never folded, never merged
NONDETERMINISTIC = frozenset({
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
    "Bernoulli",
})


#: names of nodes that fusions must leave alone (they run on a provider other than the CPU
#: one, which may not implement the fused op); set by ``optimize`` for the EXTENDED levels
FROZEN: ContextVar[frozenset] = ContextVar("runtime_core_optimizer_frozen", default=frozenset())


class Pass:
    """Base class: subclasses set ``name`` and ``level`` and implement ``apply``."""

    name = ""
    level = BASIC

    def apply(self, graph: Graph) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} level={self.level}>"


class Editor:
    """Index of a graph (producers, consumers, outputs) plus safe editing primitives.

    The index is rebuilt lazily after every edit (``touch``), so a pass can match,
    rewrite and match again without bookkeeping of its own.
    """

    def __init__(self, graph: Graph, pass_name: str = ""):
        self.g = graph
        self.pass_name = pass_name
        self._dirty = True
        self._prod: dict[str, Node] = {}
        self._cons: dict[str, list[Node]] = {}
        self._pos: dict[int, int] = {}
        self._implicit: set[str] = set()
        self._outputs = set(graph.output_names)
        self._inputs = set(graph.input_names)
        self._names: set[str] | None = None
        self._fallback = None
        self._dead: set[int] = set()

    # -- index ------------------------------------------------------------------
    def touch(self) -> None:
        self._dirty = True

    def _index(self) -> None:
        if not self._dirty:
            return
        self.flush()
        self._prod, self._cons, self._pos, self._implicit = {}, {}, {}, set()
        for idx, n in enumerate(self.g.nodes):
            self._pos[id(n)] = idx
            for o in n.outputs:
                if o:
                    self._prod[o] = n
            seen = set()
            for i in n.inputs:
                if i and i not in seen:
                    seen.add(i)
                    self._cons.setdefault(i, []).append(n)
            for i in n.implicit_inputs:
                self._implicit.add(i)
                if i not in seen:
                    seen.add(i)
                    self._cons.setdefault(i, []).append(n)
        self._dirty = False

    def drop(self, node: Node) -> None:
        """Remove ``node`` whose outputs are now defined otherwise (initializers), without
        re-indexing the graph: folding many nodes costs one pass over the node list."""
        self._index()
        if self._pos.pop(id(node), None) is None:
            return
        for o in node.outputs:
            if o and self._prod.get(o) is node:
                del self._prod[o]
        for i in {*node.inputs, *node.implicit_inputs}:
            readers = self._cons.get(i)
            if readers:
                readers[:] = [c for c in readers if c is not node]
        self._dead.add(id(node))

    def flush(self) -> None:
        """Take the nodes ``drop`` removed out of the graph's node list."""
        if self._dead:
            self.g.nodes = [n for n in self.g.nodes if id(n) not in self._dead]
            self._dead.clear()
            self._dirty = True  # positions are list indices

    def producer(self, name: str) -> Node | None:
        self._index()
        return self._prod.get(name)

    def consumers(self, name: str) -> list[Node]:
        self._index()
        return list(self._cons.get(name, ()))

    def position(self, node: Node) -> int:
        self._index()
        return self._pos[id(node)]

    def alive(self, node: Node) -> bool:
        self._index()
        return id(node) in self._pos

    def is_output(self, name: str) -> bool:
        return name in self._outputs

    def is_implicit(self, name: str) -> bool:
        self._index()
        return name in self._implicit

    def single_use(self, name: str, reader: Node | None = None) -> bool:
        """``name`` is read by exactly one node (``reader`` when given, possibly through
        several of its inputs), is not a graph output and is not read by a subgraph."""
        if not name or self.is_output(name) or self.is_implicit(name):
            return False
        cons = self.consumers(name)
        return len(cons) == 1 and (reader is None or cons[0] is reader)

    def internal(self, name: str, readers: Iterable[Node]) -> bool:
        """Every reader of ``name`` is one of ``readers`` and it is no graph output."""
        if not name or self.is_output(name) or self.is_implicit(name):
            return False
        ids = {id(r) for r in readers}
        return all(id(c) in ids for c in self.consumers(name))

    # -- values -----------------------------------------------------------------
    def const(self, name: str) -> np.ndarray | None:
        """The value of ``name`` when it is an initializer that no feed can override."""
        if not name or name in self._inputs:
            return None
        return self.g.initializers.get(name)

    def scalar(self, name: str) -> float | None:
        """A constant with exactly one element, as a Python float."""
        v = self.const(name)
        if v is None or v.size != 1 or v.dtype.kind not in "fiub":
            return None
        return float(v.reshape(-1)[0])

    def shape(self, name: str) -> tuple | None:
        if not name:
            return None
        return self.g.value_info(name).shape

    def rank(self, name: str) -> int | None:
        s = self.shape(name)
        return None if s is None else len(s)

    def dtype(self, name: str) -> np.dtype | None:
        if not name:
            return None
        dt = self.g.value_info(name).dtype
        return None if dt is None else np.dtype(dt)

    def static_shape(self, name: str) -> tuple[int, ...] | None:
        s = self.shape(name)
        if s is None or any(not isinstance(d, int) for d in s):
            return None
        return tuple(s)

    # -- names ------------------------------------------------------------------
    def _all_names(self) -> set[str]:
        if self._names is None:
            self.flush()
            names = set(self.g.initializers) | self._inputs | self._outputs | set(self.g.types)
            for n in self.g.nodes:
                names.update(n.inputs)
                names.update(n.outputs)
                names.update(n.implicit_inputs)
                names.add(n.name)
            self._names = names
        return self._names

    def fresh(self, base: str) -> str:
        """A value/node name not used anywhere in the graph."""
        names = self._all_names()
        base = base or "v"
        cand, k = base, 0
        while cand in names:
            k += 1
            cand = f"{base}_{k}"
        names.add(cand)
        return cand

    def add_const(self, array: np.ndarray, base: str) -> str:
        """A new initializer holding ``array``; or the one a pass added before with equal
        contents (the same fusion applied to each of several layers that share their weights,
        as ALBERT's do, must not make one copy of the fused weight per layer)."""
        array = np.asarray(array)
        added = self.g.__dict__.setdefault("_added_consts", {})  # the graph's, across passes
        key = None
        if array.dtype != object and array.size:
            flat = array.reshape(-1)
            key = (array.dtype.str, array.shape, flat[::max(1, flat.size // 256)].tobytes())
            for name in added.get(key, ()):
                if (self.g.initializers.get(name) is not None and name not in self._inputs
                        and np.array_equal(self.g.initializers[name], array)):
                    return name
        name = self.fresh(base)
        self.g.initializers[name] = array
        if key is not None:
            added.setdefault(key, []).append(name)
        return name

    def set_type(self, name: str, dtype, shape: Iterable | None = None) -> None:
        """Record the type of a value a pass creates (providers read dtypes and shapes)."""
        elem = dtype_to_elem(dtype)
        if elem is None:
            return
        dims = None if shape is None else [d if isinstance(d, (int, str)) else None for d in shape]
        self.g.types[name] = onnx.helper.make_tensor_type_proto(elem, dims)

    def copy_type(self, dst: str, src: str) -> None:
        tp = self.g.types.get(src)
        if tp is not None:
            self.g.types[dst] = tp

    # -- nodes ------------------------------------------------------------------
    def ensure_opset(self, domain: str, version: int = 1) -> None:
        """Import ``domain`` into the model (so the node resolves and the saved model loads)."""
        if domain in self.g.opsets:
            return
        self.g.opsets[domain] = version
        self.g.model.opset_import.append(onnx.helper.make_opsetid(domain, version))

    def can_emit(self, node: Node) -> bool:
        """Whether the CPU provider (the fallback every session has) claims ``node``, a node
        a rewrite proposes (built with ``new_node``/``make_node``, not yet in the graph):
        fusions introduce only nodes that can always run. Asked of the registered provider
        object (``fallback.py``), with the node's real attributes and value types."""
        if self._fallback is None:
            from .fallback import current

            self._fallback = current()
        why = self._fallback.decline_reason(self.g, node)
        if why is not None:
            self.log("%s (%s) cannot be emitted: %s", node.name, node.op_type, why)
        return why is None

    def opset(self, domain: str = "") -> int:
        return self.g.opsets.get(domain, 0)

    def new_node(self, op_type: str, inputs: list[str], outputs: list[str], *, base: str,
                 domain: str = "", attrs: dict[str, Any] | None = None) -> Node:
        if domain:
            self.ensure_opset(domain)
        return self.g.make_node(op_type, list(inputs), list(outputs), name=self.fresh(base),
                                domain=domain, attrs=dict(attrs or {}))

    def replace(self, remove: Iterable[Node], add: Iterable[Node], at: Node | None = None) -> bool:
        """Remove ``remove`` and insert ``add`` where ``at`` (default: the last removed node)
        stood, then restore a topological order. Returns False, changing nothing, when the
        result would have a cycle or would read a value nothing defines."""
        remove = list(remove)
        add = list(add)
        frozen = FROZEN.get()
        if add and frozen and any(n.name in frozen for n in remove):
            logger.debug("%s: rewrite of %s refused (runs on another provider)", self.pass_name,
                         ", ".join(n.name for n in remove if n.name in frozen))
            return False
        self.flush()
        known = {(n.domain, n.op_type) for n in remove}
        for n in add:  # a node of an op the rewrite did not start from must be runnable
            if (n.domain, n.op_type) not in known and not self.can_emit(n):
                return False
        self._index()
        if at is None and remove:
            at = max(remove, key=lambda n: self._pos[id(n)])
        rm = {id(n) for n in remove}
        out: list[Node] = []
        for n in self.g.nodes:
            if n is at:
                out.extend(add)
            if id(n) not in rm:
                out.append(n)
        if at is None:
            out.extend(add)
        before = self.g.nodes
        self.g.nodes = out
        self.touch()
        if add and not self.toposort():
            self.g.nodes = before
            self.touch()
            logger.debug("%s: rewrite refused (it would break the topological order)", self.pass_name)
            return False
        return True

    def toposort(self) -> bool:
        """Stable topological sort of the node list (False when impossible)."""
        self.flush()
        nodes = self.g.nodes
        defined = set(self.g.input_names) | set(self.g.initializers) | {""}
        prod: dict[str, int] = {}
        for idx, n in enumerate(nodes):
            for o in n.outputs:
                if o:
                    prod[o] = idx
        deps: list[set[int]] = []
        for idx, n in enumerate(nodes):
            d = set()
            for i in n.all_inputs():
                if i in defined:
                    continue
                p = prod.get(i)
                if p is None:
                    return False
                if p != idx:
                    d.add(p)
                else:
                    return False
            deps.append(d)
        if all(all(p < idx for p in d) for idx, d in enumerate(deps)):
            return True
        order = stable_order(deps)
        if order is None:
            return False
        self.g.nodes = [nodes[i] for i in order]
        self.touch()
        return True

    def rename_uses(self, old: str, new: str) -> None:
        """Every reader of ``old`` reads ``new`` instead (``old`` must not be read by a
        subgraph; callers check ``is_implicit``). The index is updated in place."""
        readers = self.consumers(old)
        into = self._cons.setdefault(new, [])
        for n in readers:
            n.inputs = [new if i == old else i for i in n.inputs]
            if all(c is not n for c in into):
                into.append(n)
        self._cons.pop(old, None)

    def bypass(self, node: Node, out: str, src: str) -> bool:
        """Drop ``node`` whose output ``out`` equals value ``src``: its readers read ``src``.
        Refused (False) when ``out`` is a graph output or read by a subgraph."""
        if self.is_output(out) or self.is_implicit(out):
            return False
        self.rename_uses(out, src)
        if not any(o and o != out and self.consumers(o) for o in node.outputs) and not any(
                self.is_output(o) for o in node.outputs if o):
            self.drop(node)
        return True

    def dead_code(self) -> None:
        """Remove nodes whose outputs nobody reads (cheap cleanup inside a pass)."""
        self.flush()
        while True:
            needed = set(self._outputs)
            for n in self.g.nodes:
                needed.update(n.all_inputs())
            keep = [n for n in self.g.nodes if any(o in needed for o in n.outputs if o)]
            if len(keep) == len(self.g.nodes):
                return
            self.g.nodes = keep
            self.touch()

    def log(self, msg: str, *args) -> None:
        logger.debug("%s: " + msg, self.pass_name, *args)


def same_dim(a, b) -> bool:
    """Two dims known to be equal: the same number, or the same symbol."""
    if a is None or b is None:
        return False
    return a == b


def attr_float(node: Node, name: str, default=None):
    v = node.attrs.get(name, default)
    return default if v is None else v
