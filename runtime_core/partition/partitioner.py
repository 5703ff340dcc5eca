"""Partitioning: providers claim nodes in the session's order; CPU takes the rest.

Each provider sees only nodes no earlier provider claimed. Single-node claims are
merged into partitions by cutting one topological order into runs of the same
provider; a contiguous run of a topological order is always convex (a path that
left and re-entered it would pass through a node inside the run). Group claims are
checked for convexity and kept whole.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from ..errors import PartitionError, PluginError
from ..graph.ir import Graph
from ..plugin.contract import GraphView, NodeView, Partition
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


def assign(graph: Graph, providers: list, views: list[NodeView], values) -> Assignment:
    """Offer unclaimed nodes to each provider in order and record claims and declines."""
    succ, _ = _succ_pred(graph)
    by_name = {v.name: v.index for v in views}
    result = Assignment()
    unclaimed = list(range(len(views)))
    next_group = 0
    for pos, prov in enumerate(providers):
        if not unclaimed:
            break
        offered = [views[i] for i in unclaimed]
        gv = GraphView(offered, values, graph.opsets, views)
        pname = prov.name
        try:
            claims, declined = _normalize_capability(prov.get_capability(gv))
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


def partition_graph(graph: Graph, providers: list) -> tuple[list[PlannedPartition], PartitionReport]:
    """Cut ``graph`` into compiled-ready partitions; ``providers`` are instances, CPU last."""
    cache: dict = {}
    views = [graph.node_view(n, i, cache) for i, n in enumerate(graph.nodes)]
    values = _ValueMap(graph, cache)
    asg = assign(graph, providers, views, values)
    runs = order_nodes(graph, asg)
    consumers = graph.consumers()
    graph_outputs = set(graph.output_names)
    node_run = {}
    for r, members in enumerate(runs):
        for m in members:
            node_run[m] = r
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
        part = Partition(id=r, provider=providers[pos].name,
                         nodes=tuple(views[m] for m in members), inputs=inputs, outputs=outputs,
                         constants=consts, values=values)
        planned.append(PlannedPartition(part, pos))
    report = PartitionReport(
        nodes=[NodeEntry(name=views[i].name, op_type=views[i].op_type, domain=views[i].domain,
                         provider=providers[asg.provider_of[i]].name, partition=node_run[i],
                         declined=dict(asg.declined.get(i, {})))
               for r in runs for i in r],
        copies=[])
    return planned, report


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
