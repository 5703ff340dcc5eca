"""Partitioning: providers claim nodes in the session's order; CPU takes the rest.

Each provider sees only nodes no earlier provider claimed. Single-node claims are
merged into partitions by cutting one topological order into runs of the same
provider; a contiguous run of a topological order is always convex (a path that
left and re-entered it would pass through a node inside the run). Group claims are
checked for convexity and kept whole.

Partition shaping (plugin API 1.4): once every node has a provider, each provider with a
``min_partition_size`` above 1 gives back the nodes of its partitions smaller than that,
and each provider with a ``review_partitions`` method is shown its proposed partitions and
may name nodes to give back. Given-back nodes are offered again to the providers after it
(the CPU provider last), and the cut is made again, until nobody gives anything back.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from ..errors import PartitionError, PluginError
from ..graph.contrib_types import fill_types
from ..graph.ir import Graph
from ..plugin.contract import GraphView, NodeView, Partition, SessionSettings
from .report import NodeEntry, PartitionReport

logger = logging.getLogger("runtime_core.partition")


@dataclass
class Assignment:
    """Which provider runs each node, and what the others said."""

    provider_of: dict[int, int] = field(default_factory=dict)  # node index -> provider position
    group_of: dict[int, int] = field(default_factory=dict)      # node index -> group id
    declined: dict[int, dict[str, str]] = field(default_factory=dict)


def _succ_pred(graph: Graph):
    producers = graph.producers()
    n = len(graph.nodes)
    succ: list[set[int]] = [set() for _ in range(n)]
    pred: list[set[int]] = [set() for _ in range(n)]
    for idx, node in enumerate(graph.nodes):
        for i in node.all_inputs():
            p = producers.get(i)
            if p is not None and p != idx:
                succ[p].add(idx)
                pred[idx].add(p)
    return succ, pred


def non_convex_witness(group: set[int], succ: list[set[int]]) -> int | None:
    """A node outside ``group`` on a path that leaves the group and re-enters it, or None."""
    # nodes reachable from the group through at least one outside node
    frontier = deque(s for g in group for s in succ[g] if s not in group)
    outside_reach: set[int] = set(frontier)
    while frontier:
        x = frontier.popleft()
        for s in succ[x]:
            if s in group:
                return x
            if s not in outside_reach:
                outside_reach.add(s)
                frontier.append(s)
    return None


def _normalize_capability(cap) -> tuple[list, dict]:
    if isinstance(cap, tuple) and len(cap) == 2:
        claims, declined = cap
    else:
        claims = getattr(cap, "claims", None)
        declined = getattr(cap, "declined", None)
        if claims is None:
            raise PluginError("get_capability() must return an object with .claims and .declined")
    return list(claims or []), dict(declined or {})


GIVEN_BACK = "given back"
"""How the reason of a node a provider claimed and then gave back (partition shaping) starts."""


def assign(graph: Graph, providers: list, views: list[NodeView], values, *,
           given_back: dict[int, dict[int, str]] | None = None,
           settings: SessionSettings | None = None, answers: dict | None = None) -> Assignment:
    """Offer unclaimed nodes to each provider in order and record claims and declines.

    ``given_back`` maps a provider position to the nodes it gave back (index -> reason): its
    claims of them are dropped and the reason recorded. ``answers`` caches capability answers
    by (provider position, offered nodes), so that a re-cut does not ask again."""
    given_back = given_back or {}
    answers = answers if answers is not None else {}
    succ, _ = _succ_pred(graph)
    by_name = {v.name: v.index for v in views}
    result = Assignment()
    unclaimed = list(range(len(views)))
    next_group = 0
    for pos, prov in enumerate(providers):
        if not unclaimed:
            break
        offered = [views[i] for i in unclaimed]
        gv = GraphView(offered, values, graph.opsets, views, ir_version=getattr(graph, "ir_version", 0),
                       settings=settings, type_lookup=graph.type_of)
        pname = prov.name
        back = given_back.get(pos, {})
        try:
            key = (pos, tuple(unclaimed))
            if key not in answers:
                answers[key] = _normalize_capability(prov.get_capability(gv))
            claims, declined = answers[key]
        except Exception as exc:  # a provider bug must not break the session
            logger.warning("%s.get_capability raised %s: %s; it runs nothing", pname, type(exc).__name__, exc)
            for i in unclaimed:
                result.declined.setdefault(i, {})[pname] = f"get_capability raised {type(exc).__name__}: {exc}"
            continue
        offered_set = set(unclaimed)
        taken: set[int] = set()
        rejected: dict[int, str] = {}
        for claim in claims:
            members = [claim] if isinstance(claim, (NodeView, str)) else list(claim)
            idxs = []
            bad = None
            if any(by_name.get(m if isinstance(m, str) else getattr(m, "name", None)) in back
                   for m in members):  # a claim with a given-back node is given back whole
                for m in members:
                    idx = by_name.get(m if isinstance(m, str) else getattr(m, "name", None))
                    if idx is not None and idx in offered_set:
                        rejected[idx] = back.get(idx) or next(iter(back.values()))
                continue
            for m in members:
                name = m if isinstance(m, str) else getattr(m, "name", None)
                idx = by_name.get(name)
                if idx is None or idx not in offered_set:
                    bad = f"claimed node {name!r} that was not offered to it"
                    break
                if idx in taken:
                    bad = f"claimed node {name!r} twice"
                    break
                idxs.append(idx)
            if bad:
                logger.warning("%s: %s; claim ignored", pname, bad)
                for i in idxs:
                    rejected[i] = f"claim rejected: {bad}"
                continue
            if len(idxs) > 1 and not isinstance(claim, (NodeView, str)):
                gset = set(idxs)
                w = non_convex_witness(gset, succ)
                if w is not None:
                    why = (f"group claim of {len(idxs)} nodes rejected: not convex (a path leaves "
                           f"the group and re-enters it through node {views[w].name!r})")
                    logger.warning("%s: %s", pname, why)
                    for i in idxs:
                        rejected[i] = why
                    continue
                for i in idxs:
                    result.group_of[i] = next_group
                next_group += 1
            for i in idxs:
                taken.add(i)
                result.provider_of[i] = pos
        for i in unclaimed:
            if i not in taken:
                name = views[i].name
                reason = rejected.get(i) or declined.get(name) or "no reason given"
                result.declined.setdefault(i, {})[pname] = str(reason)
        unclaimed = [i for i in unclaimed if i not in taken]
    if unclaimed:
        lines = []
        for i in unclaimed[:20]:
            v = views[i]
            why = "; ".join(f"{p}: {r}" for p, r in result.declined.get(i, {}).items())
            lines.append(f"  {v.name} ({v.qualified_op}): {why or 'no provider was asked'}")
        more = f"\n  ... and {len(unclaimed) - 20} more" if len(unclaimed) > 20 else ""
        raise PartitionError(f"{len(unclaimed)} node(s) cannot run on any provider of this session:\n"
                             + "\n".join(lines) + more)
    return result


def order_nodes(graph: Graph, asg: Assignment) -> list[list[int]]:
    """A topological order grouped into runs; returns the runs (each a list of node indices)."""
    succ, pred = _succ_pred(graph)
    n = len(graph.nodes)
    # contract groups: a unit is a group or a single node
    unit_of = {}
    units: list[list[int]] = []
    for idx in range(n):
        g = asg.group_of.get(idx)
        key = ("g", g) if g is not None else ("n", idx)
        if key not in unit_of:
            unit_of[key] = len(units)
            units.append([])
        units[unit_of[key]].append(idx)
    node_unit = {}
    for u, members in enumerate(units):
        for m in members:
            node_unit[m] = u
    usucc: list[set[int]] = [set() for _ in units]
    indeg = [0] * len(units)
    for a in range(n):
        for b in succ[a]:
            ua, ub = node_unit[a], node_unit[b]
            if ua != ub and ub not in usucc[ua]:
                usucc[ua].add(ub)
                indeg[ub] += 1
    prov = [asg.provider_of[units[u][0]] for u in range(len(units))]
    is_group = [asg.group_of.get(units[u][0]) is not None for u in range(len(units))]
    ready = [u for u in range(len(units)) if indeg[u] == 0]
    runs: list[list[int]] = []
    current: list[int] = []
    cur_prov = None
    while ready:
        # prefer a ready single unit of the current provider; keep original order otherwise
        pick = None
        if cur_prov is not None:
            for u in sorted(ready):
                if prov[u] == cur_prov and not is_group[u]:
                    pick = u
                    break
        if pick is None:
            pick = min(ready, key=lambda u: (is_group[u], units[u][0]))
        ready.remove(pick)
        if is_group[pick]:
            if current:
                runs.append(current)
            runs.append(sorted(units[pick]))
            current, cur_prov = [], None
        else:
            if prov[pick] != cur_prov and current:
                runs.append(current)
                current = []
            current.append(units[pick][0])
            cur_prov = prov[pick]
        for s in usucc[pick]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    if current:
        runs.append(current)
    if sum(len(r) for r in runs) != n:
        raise PartitionError("the graph has a cycle; it cannot be ordered")
    return runs


@dataclass
class PlannedPartition:
    partition: Partition
    provider_pos: int


#: a bound on re-cuts: each one gives back at least one node, so this is never reached in practice
_MAX_RECUTS = 64


def partition_graph(graph: Graph, providers: list, settings: SessionSettings | None = None
                    ) -> tuple[list[PlannedPartition], PartitionReport]:
    """Cut ``graph`` into compiled-ready partitions; ``providers`` are instances, CPU last.

    ``settings`` (the session's) reach providers through ``GraphView.settings`` and
    ``Partition.settings``. Partition shaping (see the module docstring) happens here."""
    settings = settings if settings is not None else SessionSettings()
    fill_types(graph)  # outputs of fused ops the optimizer emitted, and what reads them
    cache: dict = {}
    views = [graph.node_view(n, i, cache) for i, n in enumerate(graph.nodes)]
    values = _ValueMap(graph, cache)
    given_back: dict[int, dict[int, str]] = {}
    answers: dict = {}
    for _ in range(_MAX_RECUTS):
        asg = assign(graph, providers, views, values, given_back=given_back, settings=settings,
                     answers=answers)
        runs = order_nodes(graph, asg)
        planned = _partitions(graph, providers, views, values, runs, asg, settings)
        if not _shape(providers, planned, views, given_back):
            break
    else:  # pragma: no cover - see _MAX_RECUTS
        raise PartitionError(f"partition shaping did not settle after {_MAX_RECUTS} re-cuts")
    node_run = {}
    for r, members in enumerate(runs):
        for m in members:
            node_run[m] = r
    report = PartitionReport(
        nodes=[NodeEntry(name=views[i].name, op_type=views[i].op_type, domain=views[i].domain,
                         provider=providers[asg.provider_of[i]].name, partition=node_run[i],
                         declined=dict(asg.declined.get(i, {})))
               for r in runs for i in r],
        copies=[])
    return planned, report


def _shape(providers: list, planned: list[PlannedPartition], views: list[NodeView],
           given_back: dict[int, dict[int, str]]) -> bool:
    """Ask each shaping provider about its proposed partitions; True when a node was given back."""
    by_name = {v.name: v.index for v in views}
    more = False
    last = len(providers) - 1
    for pos, prov in enumerate(providers):
        if pos == last:  # the fallback runs what is left: nothing to give it back to
            break
        mine = [pp.partition for pp in planned if pp.provider_pos == pos]
        if not mine:
            continue
        back: dict[int, str] = {}
        try:
            min_size = int(getattr(prov, "min_partition_size", 1) or 1)
        except (TypeError, ValueError):
            logger.warning("%s.min_partition_size is not an int; ignored", prov.name)
            min_size = 1
        for part in mine:
            if len(part.nodes) < min_size:
                for v in part.nodes:
                    back[v.index] = (f"{GIVEN_BACK}: a partition of {len(part.nodes)} node(s) is below "
                                     f"the provider's min_partition_size {min_size}")
        review = getattr(prov, "review_partitions", None)
        if callable(review):
            kept = [p for p in mine if not any(v.index in back for v in p.nodes)]
            try:
                names = list(review(kept) or ()) if kept else []
            except Exception as exc:  # a provider bug must not break the session
                logger.warning("%s.review_partitions raised %s: %s; nothing given back",
                               prov.name, type(exc).__name__, exc)
                names = []
            owned = {v.name for p in kept for v in p.nodes}
            for name in names:
                if name not in owned:
                    logger.warning("%s.review_partitions gave back %r, which is not in its partitions; "
                                   "ignored", prov.name, name)
                    continue
                back.setdefault(by_name[name], f"{GIVEN_BACK} by review_partitions")
        if back:
            given_back.setdefault(pos, {}).update(back)
            more = True
            logger.info("%s gave back %d node(s) after seeing its partitions", prov.name, len(back))
    return more


def _partitions(graph: Graph, providers: list, views: list[NodeView], values, runs: list[list[int]],
                asg: Assignment, settings: SessionSettings) -> list[PlannedPartition]:
    from ..plugin.export import opsets_of

    consumers = graph.consumers()
    graph_outputs = set(graph.output_names)
    planned = []
    for r, members in enumerate(runs):
        produced = []
        read: list[str] = []
        inside = set(members)
        produced_set = set()
        for m in members:
            node = graph.nodes[m]
            for i in node.all_inputs():
                if i not in produced_set and i not in read:
                    read.append(i)
            for o in node.outputs:
                if o:
                    produced.append(o)
                    produced_set.add(o)
        consts = {i: graph.initializers[i] for i in read if i in graph.initializers}
        inputs = tuple(i for i in read if i not in consts)
        outputs = tuple(o for o in produced if o in graph_outputs or any(
            c not in inside for c in consumers.get(o, ())))
        pos = asg.provider_of[members[0]]
        nodes = tuple(views[m] for m in members)
        part = Partition(id=r, provider=providers[pos].name,
                         nodes=nodes, inputs=inputs, outputs=outputs,
                         constants=consts, values=values, opset_imports=opsets_of(nodes, graph.opsets),
                         ir_version=getattr(graph, "ir_version", 0), settings=settings,
                         type_lookup=graph.type_of)
        planned.append(PlannedPartition(part, pos))
    return planned


class _ValueMap(dict):
    """Lazy value-info mapping shared by every view of one graph."""

    def __init__(self, graph: Graph, cache: dict):
        super().__init__()
        self._graph = graph
        self._cache = cache

    def get(self, name, default=None):
        if name not in self._cache:
            self._cache[name] = self._graph.value_info(name)
        return self._cache[name]

    def __getitem__(self, name):
        return self.get(name)

    def __contains__(self, name):
        return True
