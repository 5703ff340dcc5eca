"""The partition report: where each node runs, who declined it and why, every copy, the
nodes a provider has come to run as one since the session was made (run-time fusions), and
the kernels a provider chose for nodes on this machine."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field


@dataclass
class NodeEntry:
    """One node: ``declined`` maps each higher-priority provider that declined it to its reason."""

    name: str
    op_type: str
    provider: str
    partition: int
    declined: dict = field(default_factory=dict)
    domain: str = ""


@dataclass
class CopyEntry:
    """One device copy at a partition boundary; ``bytes`` is None when the shape is dynamic."""

    value: str
    src: str
    dst: str
    bytes: int | None = None


@dataclass
class FusionEntry:
    """Nodes of one partition that its executable runs as one step, decided after the session
    was made (the CPU provider fuses pairs after the first run): ``kind`` is the provider's
    word for it (``"pair"``: a chain, ``"siblings"``: two readers of one input)."""

    partition: int
    provider: str
    kind: str
    nodes: list = field(default_factory=list)


@dataclass
class PartitionReport:
    """``nodes`` in execution order, ``copies`` in the order they happen, ``fusions`` and
    ``kernels`` as the executables report them when the report is asked for (they appear after
    the first run)."""

    nodes: list = field(default_factory=list)
    copies: list = field(default_factory=list)
    providers: list = field(default_factory=list)
    unavailable: dict = field(default_factory=dict)
    fusions: list = field(default_factory=list)
    #: node name -> the kernel its provider chose for it on this machine (plugin API 1.4
    #: ``kernels()``; the CPU provider's measured choices appear after the run that made them)
    kernels: dict = field(default_factory=dict)

    @property
    def partitions(self) -> list[dict]:
        """One summary per partition: id, provider, node count."""
        parts: dict[int, dict] = {}
        for n in self.nodes:
            p = parts.setdefault(n.partition, {"id": n.partition, "provider": n.provider, "nodes": 0})
            p["nodes"] += 1
        return [parts[k] for k in sorted(parts)]

    def counts(self) -> dict[str, int]:
        """Node count per provider."""
        return dict(Counter(n.provider for n in self.nodes))

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {
            "providers": list(self.providers),
            "unavailable": dict(self.unavailable),
            "nodes": [asdict(n) for n in self.nodes],
            "copies": [asdict(c) for c in self.copies],
            "fusions": [asdict(f) for f in self.fusions],
            "kernels": dict(self.kernels),
            "partitions": self.partitions,
            "counts": self.counts(),
        }

    def summary(self) -> str:
        """One line per provider and the copy total."""
        lines = [f"{p}: {c} node(s)" for p, c in self.counts().items()]
        parts = self.partitions
        total = sum(c.bytes or 0 for c in self.copies)
        unknown = sum(1 for c in self.copies if c.bytes is None)
        lines.append(f"{len(parts)} partition(s), {len(self.copies)} copy(ies), {total} bytes"
                     + (f" (+{unknown} of dynamic size)" if unknown else ""))
        if self.fusions:
            lines.append(f"{len(self.fusions)} run-time fusion(s) of "
                         f"{sum(len(f.nodes) for f in self.fusions)} node(s)")
        for name, why in self.unavailable.items():
            lines.append(f"requested but unavailable: {name}: {why}")
        return "\n".join(lines)

    def __str__(self) -> str:
        rows = [("node", "op", "provider", "part", "declined by")]
        for n in self.nodes:
            dec = "; ".join(f"{p}: {r}" for p, r in n.declined.items())
            rows.append((n.name, n.op_type, n.provider, str(n.partition), dec))
        widths = [min(max(len(r[i]) for r in rows), 40) for i in range(4)]
        out = []
        for r in rows:
            cells = [r[i][:40].ljust(widths[i]) for i in range(4)] + [r[4]]
            out.append("  ".join(cells).rstrip())
        if self.copies:
            out.append("")
            out.append("copies:")
            for c in self.copies:
                size = "dynamic size" if c.bytes is None else f"{c.bytes} bytes"
                out.append(f"  {c.value}: {c.src} -> {c.dst} ({size})")
        if self.fusions:
            out.append("")
            out.append("fused at run time (one step each):")
            for f in self.fusions:
                out.append(f"  {' + '.join(f.nodes)}: {f.kind}, {f.provider} partition {f.partition}")
        if self.kernels:
            out.append("")
            out.append("kernels chosen on this machine:")
            for name, kernel in self.kernels.items():
                out.append(f"  {name}: {kernel}")
        out.append("")
        out.append(self.summary())
        return "\n".join(out)
