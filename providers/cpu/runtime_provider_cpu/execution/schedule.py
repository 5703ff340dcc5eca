"""The dependency schedule of a partition's steps, for parallel runs (``ORT_PARALLEL``)."""

from __future__ import annotations


class Schedule:
    """The dependency graph of a partition's steps, for parallel runs.

    ``deps[i]``: how many distinct steps produce the inputs of step ``i``; ``succ[i]``: the
    steps that read an output of step ``i``; ``readers[s]``: how many distinct steps read
    slot ``s`` (a value is freed when the last of them has finished, whatever the order);
    ``reads[i]``: the slots step ``i`` reads that may be freed; ``dead[i]``: the outputs of
    step ``i`` that nothing reads nor keeps (freed at once).
    """

    __slots__ = ("dead", "deps", "readers", "reads", "roots", "succ", "threads")

    @classmethod
    def build(cls, steps, keep, threads: int):
        """The schedule, or ``None`` when runs are sequential: one thread, or nodes that form
        a single chain (each step reads the previous one's output: nothing could overlap)."""
        if threads <= 1 or len(steps) < 2:
            return None
        producer: dict[int, int] = {}
        for i, st in enumerate(steps):
            for s in st[3]:
                if s >= 0:
                    producer[s] = i
        dep_sets = [{producer[s] for s in st[2] if s in producer} for st in steps]
        if all(i - 1 in dep_sets[i] for i in range(1, len(steps))):
            return None
        self = cls()
        self.threads = threads
        self.deps = tuple(len(d) for d in dep_sets)
        succ: list[list[int]] = [[] for _ in steps]
        for i, d in enumerate(dep_sets):
            for j in sorted(d):
                succ[j].append(i)
        self.succ = tuple(tuple(x) for x in succ)
        n_slots = 1 + max([0] + [s for st in steps for s in (*st[2], *st[3])])
        readers = [0] * n_slots
        reads = []
        for st in steps:
            mine = tuple(dict.fromkeys(s for s in st[2] if s not in keep))
            for s in mine:
                readers[s] += 1
            reads.append(mine)
        self.readers = tuple(readers)
        self.reads = tuple(reads)
        self.dead = tuple(tuple(s for s in st[3] if s >= 0 and s not in keep and readers[s] == 0)
                          for st in steps)
        self.roots = tuple(i for i, n in enumerate(self.deps) if n == 0)
        return self
