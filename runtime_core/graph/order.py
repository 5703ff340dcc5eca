"""A stable topological order of nodes given as dependency sets (Kahn's algorithm on a heap)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def stable_order(deps: Sequence[set[int]]) -> list[int] | None:
    """Indices ``0..len(deps)-1`` so that each comes after every index in its ``deps`` entry,
    otherwise in index order; None when the dependencies hold a cycle."""
    users: dict[int, list[int]] = {}
    for i, d in enumerate(deps):
        for j in d:
            users.setdefault(j, []).append(i)
    indeg = [len(d) for d in deps]
    ready = [i for i, k in enumerate(indeg) if k == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, ()):
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(ready, u)
    return order if len(order) == len(deps) else None
