"""Pattern passes: rewrite rules and the driver that walks the graph once for all of them.

As onnxruntime's ``RewriteRule`` (``core/optimizer/rewrite_rule.h``): a rule names
the op types it starts from (``targets``), a ``condition`` on a node of one of those
types, and an ``apply`` that rewrites the graph around that node through the
:class:`~runtime_core.optimizer.editor.Editor` and says whether it changed anything.
:func:`walk` visits the nodes once, in order, and offers each node to the rules that
target its op type, in the rules' order; a node a rule removed is offered to no
further rule. Nodes a rule adds are visited by the next walk (``optimize`` repeats the
passes of a level until a round changes nothing).

A rule is a :class:`~runtime_core.optimizer.editor.Pass` (a name, a level, an
``apply(graph)`` of its own that walks with it alone), so it is listed, disabled by
name and counted like any other pass.
"""

from __future__ import annotations

from typing import ClassVar, Iterable

from ..graph.ir import Graph, Node
from .editor import Editor, Pass


class RewriteRule(Pass):
    """Base of the pattern passes.

    ``targets`` are the op types the rule starts from, as ``"Op"`` (ai.onnx) or
    ``"domain::Op"``; ``None`` offers every node. ``start(ed)`` runs once per walk
    before any node (reset per-walk state; return False to sit the walk out, e.g. when
    a precondition of the whole graph fails); ``condition(ed, node)`` is the cheap test
    on the target node; ``rewrite(ed, node)`` matches the rest of the pattern and
    rewrites, returning True when it changed the graph.
    """

    targets: ClassVar[frozenset[str] | None] = None
    #: rules of a later stage get the graph after the earlier stages' walk (a rule whose
    #: match would take away a node a bigger pattern of another rule needs goes later)
    stage: ClassVar[int] = 0

    def start(self, ed: Editor) -> bool:
        return True

    def condition(self, ed: Editor, node: Node) -> bool:
        return True

    def rewrite(self, ed: Editor, node: Node) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def finish(self, ed: Editor) -> int:
        """After the walk: whole-graph work the rule's rewrites call for; returns the
        rewrites it made there."""
        return 0

    def apply(self, graph: Graph) -> int:
        return walk(graph, [self])[self.name]


def _key(node: Node) -> str:
    return f"{node.domain}::{node.op_type}" if node.domain else node.op_type


def walk(graph: Graph, rules: Iterable[RewriteRule]) -> dict[str, int]:
    """Offer every node of ``graph`` once to the rules targeting its op type (once per
    stage, the rules' ``stage`` in order); returns the rewrites per rule name."""
    rules = list(rules)
    counts = {r.name: 0 for r in rules}
    for stage in sorted({r.stage for r in rules}):
        for name, n in _walk(graph, [r for r in rules if r.stage == stage]).items():
            counts[name] += n
    return counts


def _walk(graph: Graph, rules: list[RewriteRule]) -> dict[str, int]:
    counts = {r.name: 0 for r in rules}
    ed = Editor(graph, "")
    active = []
    for r in rules:
        ed.pass_name = r.name
        if r.start(ed):
            active.append(r)
    by_op: dict[str, list[RewriteRule]] = {}
    every = [r for r in active if r.targets is None]
    for r in active:
        for t in r.targets or ():
            by_op.setdefault(t, []).append(r)
    if by_op or every:
        for node in list(graph.nodes):
            todo = by_op.get(_key(node), ())
            if every:
                todo = sorted((*todo, *every), key=active.index)
            for r in todo:
                if not ed.alive(node):
                    break
                ed.pass_name = r.name
                if r.condition(ed, node) and r.rewrite(ed, node):
                    counts[r.name] += 1
    ed.flush()
    for r in active:
        ed.pass_name = r.name
        counts[r.name] += r.finish(ed) or 0
    ed.flush()
    return counts
