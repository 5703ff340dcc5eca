"""The optimizer's one door to the CPU provider: the registered provider object.

Fusions may introduce only nodes the fallback provider runs, and constant folding
computes a node exactly as the run would. Both questions go through the CPU
provider found in the plugin registry (``get_registry().lookup("cpu")``), by its
plugin contract only: ``get_capability`` on a one-node :class:`GraphView` ("can it
run this node?") and ``compile`` of a one-node :class:`Partition` whose inputs are
all constants ("what does it compute?"), the way onnxruntime's constant folding
runs nodes on its CPU execution provider object. No module of the CPU provider is
imported here.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any

import numpy as np

from ..graph.ir import Graph, Node
from ..plugin.contract import GraphView, NodeView, Partition

logger = logging.getLogger("runtime_core.optimizer")

FALLBACK_ALIAS = "cpu"


class FallbackProvider:
    """The CPU provider as the optimizer asks it; unavailable (``provider is None``) when
    no CPU provider is registered, in which case nothing is folded and nothing fused."""

    def __init__(self, provider: Any | None):
        self.provider = provider

    @classmethod
    def from_registry(cls) -> "FallbackProvider":
        """A fresh instance of the registered CPU provider (not the session's own: asking
        it questions must not change the state of the one that compiles the session)."""
        from ..plugin.registry import get_registry

        rec = get_registry().lookup(FALLBACK_ALIAS)
        if rec is None or rec.status != "loaded" or rec.cls is None:
            why = "not installed" if rec is None else f"{rec.status}: {rec.reason}"
            logger.warning("no CPU provider for the optimizer (%s): no folding, no fusion", why)
            return cls(None)
        try:
            return cls(rec.cls({}))
        except Exception as exc:  # noqa: BLE001 - a broken plugin never breaks the core
            logger.warning("the CPU provider could not be created for the optimizer (%s: %s)",
                           type(exc).__name__, exc)
            return cls(None)

    @property
    def available(self) -> bool:
        return self.provider is not None

    # -- "can it run this node?" ------------------------------------------------------
    def decline_reason(self, graph: Graph, node: Node) -> str | None:
        """Why the provider would not run ``node`` (``None`` when it claims it)."""
        if self.provider is None:
            return "no CPU provider is registered"
        view = graph.node_view(node)
        return self.decline_view(graph, view)

    def decline_view(self, graph: Graph, view: NodeView) -> str | None:
        values = {vi.name: vi for vi in (*view.input_info, *view.output_info) if vi is not None}
        gv = GraphView([view], values, graph.opsets, all_nodes=[view])
        try:
            cap = self.provider.get_capability(gv)
        except Exception as exc:  # noqa: BLE001 - a provider bug means "no"
            return f"get_capability raised {type(exc).__name__}: {exc}"
        for claim in cap.claims:
            items = claim if isinstance(claim, (list, tuple)) else (claim,)
            if any(getattr(c, "name", None) == view.name for c in items):
                return None
        return str(cap.declined.get(view.name, "not claimed"))

    # -- "what does it compute?" -----------------------------------------------------------
    def evaluate(self, graph: Graph, node: Node, view: NodeView, constants: dict[str, np.ndarray]
                 ) -> list[np.ndarray | None] | None:
        """The outputs of ``node`` (every input a constant), computed by the provider's
        compiled one-node partition; ``None`` when it declines or raises (the run would
        raise the same way: leave it to the run)."""
        why = self.decline_view(graph, view)
        if why is not None:
            logger.debug("not folding %s (%s): %s", node.name, node.op_type, why)
            return None
        outputs = tuple(o for o in node.outputs if o)
        values = {vi.name: vi for vi in (*view.input_info, *view.output_info) if vi is not None}
        part = Partition(id=-1, provider=str(self.provider.name), nodes=(view,), inputs=(), outputs=outputs,
                         constants=dict(constants), values=values, cpu_mem_arena=False,
                         intra_op_num_threads=1)
        try:
            with np.errstate(all="ignore"):
                res = list(self.provider.compile(part).run([]))
        except Exception as exc:  # noqa: BLE001 - the run would fail the same way
            logger.debug("not folding %s (%s): %s: %s", node.name, node.op_type, type(exc).__name__, exc)
            return None
        by_name = dict(zip(outputs, res))
        return [by_name.get(o) if o else None for o in node.outputs]


#: the fallback provider of the ``optimize`` call in progress (set there, once per call)
CURRENT: ContextVar[FallbackProvider | None] = ContextVar("runtime_core_optimizer_fallback", default=None)


def current() -> FallbackProvider:
    """The fallback provider of the running ``optimize`` call, or a fresh one (a pass
    applied on its own, outside ``optimize``)."""
    fp = CURRENT.get()
    return FallbackProvider.from_registry() if fp is None else fp
