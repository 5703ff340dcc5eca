"""``runtime-core check MODEL`` and ``runtime-core ops``: what can run a model, before anything runs.

``check_model`` loads a model (no optimization: the ops as written), asks every
requested provider for its capability over *all* nodes (each independently, not in
priority order), and groups the answers by (domain, op, schema version): for each
provider, how many of those nodes it takes and, for the others, why not; then says
which provider the session's priority order would give each op to. ``op_table`` lists
the CPU provider's kernel registry (op, domain, schema versions, input types) as a
markdown table; ``docs/supported-ops.md`` is generated from it.
"""

from __future__ import annotations

import collections
import warnings
from dataclasses import dataclass, field

__all__ = ["CheckReport", "check_model", "op_table", "register"]


@dataclass
class OpRow:
    """One (domain, op, since-version) of the model."""

    domain: str
    op_type: str
    version: int | None
    nodes: int = 0
    #: provider name -> (nodes it takes, {reason: count} for the rest)
    answers: dict = field(default_factory=dict)
    runs_on: str | None = None

    @property
    def qualified(self) -> str:
        return f"{self.domain or 'ai.onnx'}::{self.op_type}" + (f"-{self.version}" if self.version else "")


@dataclass
class CheckReport:
    """What ``check_model`` found: rows per op, providers asked, and unavailable ones with why."""

    model: str
    providers: list
    unavailable: dict
    rows: list
    opsets: dict

    @property
    def runnable(self) -> bool:
        """Whether every node has a provider among the available ones."""
        return all(r.runs_on is not None for r in self.rows)

    def text(self) -> str:
        out = [f"model: {self.model}", "opsets: " + ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in
                                                             sorted(self.opsets.items()))]
        fallback = self.providers[-1] if self.providers else None
        for name, why in self.unavailable.items():
            # the same words as the session's warning: run skips it and falls back
            out.append(f"provider {name}: unavailable, skipped: {why}"
                       + (f"; its nodes fall back to {fallback}" if fallback else ""))
        for r in self.rows:
            out.append(f"{r.qualified} ({r.nodes} node{'s' if r.nodes != 1 else ''}): "
                       + (f"runs on {r.runs_on}" if r.runs_on else "NO PROVIDER CAN RUN IT"))
            for prov in self.providers:
                took, why = r.answers.get(prov, (0, {}))
                if took == r.nodes:
                    out.append(f"  {prov}: yes")
                else:
                    part = f"{took} of {r.nodes} nodes; " if took else ""
                    reasons = "; ".join(f"{w}" + (f" (x{c})" if c > 1 else "") for w, c in why.items())
                    out.append(f"  {prov}: no: {part}{reasons}")
            for name, why in self.unavailable.items():
                out.append(f"  {name}: no: unavailable ({why})")
        bad = [r.qualified for r in self.rows if r.runs_on is None]
        out.append(f"{len(self.rows)} op(s); " + (f"{len(bad)} cannot run: {', '.join(bad)}" if bad
                                                  else "every op has a provider"))
        return "\n".join(out)

    def to_dict(self) -> dict:
        return {"model": self.model, "providers": self.providers, "unavailable": self.unavailable,
                "opsets": self.opsets, "runnable": self.runnable,
                "ops": [{"domain": r.domain, "op_type": r.op_type, "version": r.version, "nodes": r.nodes,
                         "runs_on": r.runs_on,
                         "providers": {p: {"nodes": a[0], "declined": a[1]} for p, a in r.answers.items()}}
                        for r in self.rows]}


def _instances(providers):
    from .plugin.registry import get_registry

    from .plugin.registry import FALLBACK_ALIAS

    reg = get_registry()
    if not providers:
        providers = [r.name for r in reg.loaded()]
    providers = list(providers)
    if not any(getattr(reg.lookup(p), "alias", None) == FALLBACK_ALIAS for p in providers):
        providers.append(FALLBACK_ALIAS)  # as in a session: CPU is always the last resort
    chosen, unavailable = [], {}
    for name in providers:
        rec = reg.lookup(name)
        if rec is None:
            known = ", ".join(r.alias for r in reg.loaded()) or "none"
            unavailable[name] = f"no installed plugin provides it (installed: {known})"
        elif rec.status != "loaded" or not rec.available:
            unavailable[rec.name] = rec.reason or rec.status
        else:
            try:
                chosen.append(rec.cls({}))
            except Exception as exc:  # noqa: BLE001 - reported, not raised
                unavailable[rec.name] = f"could not be created: {type(exc).__name__}: {exc}"
    return chosen, unavailable


def check_model(model, providers=None) -> CheckReport:
    """Ask ``providers`` (names; default every installed one) about each op of ``model``."""
    from .graph import Graph, load_model
    from .partition.partitioner import _normalize_capability, _ValueMap
    from .plugin.contract import GraphView

    proto, _ = load_model(model)
    graph = Graph(proto)
    cache: dict = {}
    views = [graph.node_view(n, i, cache) for i, n in enumerate(graph.nodes)]
    values = _ValueMap(graph, cache)
    insts, unavailable = _instances(providers)
    rows: dict = {}
    for v in views:
        key = (v.domain, v.op_type, getattr(v, "since_version", None))
        rows.setdefault(key, OpRow(*key))
        rows[key].nodes += 1
    claimed_by: dict = {}
    for p in insts:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                claims, declined = _normalize_capability(p.get_capability(GraphView(views, values, graph.opsets)))
        except Exception as exc:  # noqa: BLE001
            claims, declined = [], {v.name: f"get_capability raised {type(exc).__name__}: {exc}" for v in views}
        names = set()
        for c in claims:
            for m in ([c] if not isinstance(c, (list, tuple)) else c):
                names.add(m if isinstance(m, str) else m.name)
        claimed_by[p.name] = names
        for v in views:
            row = rows[(v.domain, v.op_type, getattr(v, "since_version", None))]
            took, why = row.answers.setdefault(p.name, (0, collections.Counter()))
            if v.name in names:
                row.answers[p.name] = (took + 1, why)
            else:
                why[str(declined.get(v.name, "no reason given"))] += 1
    for row in rows.values():
        for p in insts:
            if row.answers.get(p.name, (0,))[0] == row.nodes:
                row.runs_on = p.name
                break
        else:
            if any(row.answers.get(p.name, (0,))[0] for p in insts):
                row.runs_on = "+".join(p.name for p in insts if row.answers.get(p.name, (0,))[0])
        for p in insts:
            took, why = row.answers.get(p.name, (0, {}))
            row.answers[p.name] = (took, dict(why))
    ordered = sorted(rows.values(), key=lambda r: (r.runs_on is not None, r.domain, r.op_type, r.version or 0))
    return CheckReport(str(model) if isinstance(model, str) else "<model>", [p.name for p in insts],
                       unavailable, ordered, dict(graph.opsets))


def op_table() -> str:
    """The CPU provider's registry as a markdown table (op, domain, since-versions, input types)."""
    import onnx.defs

    from runtime_provider_cpu.api import supported_ops  # the CPU provider's documented API

    lines = ["| domain | op | schema versions | first-input types |", "|---|---|---|---|"]
    for domain, op, versions, dtypes in supported_ops():
        types = ", ".join(sorted(dtypes)) if dtypes else "per schema"
        try:
            latest = onnx.defs.get_schema(op, domain=domain).since_version
        except Exception:  # noqa: BLE001 - contrib ops have no onnx schema
            latest = None
        vs = ", ".join(str(v) for v in versions)
        if latest is not None and latest not in versions:
            vs += f" (newest schema {latest} not implemented)"
        lines.append(f"| {domain or 'ai.onnx'} | {op} | {vs} | {types} |")
    return "\n".join(lines)


def register(sub) -> None:
    """Add the ``check`` and ``ops`` subcommands."""
    sp = sub.add_parser("check", help="say which installed provider can run each op of a model, and why not")
    sp.add_argument("model")
    sp.add_argument("--providers", help="comma-separated providers to ask (default: every installed one)")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_check)
    sp = sub.add_parser("ops", help="the CPU provider's supported-op table (markdown)")
    sp.set_defaults(fn=cmd_ops)


def cmd_check(args, out) -> int:
    import json

    provs = [p.strip() for p in args.providers.split(",") if p.strip()] if args.providers else None
    rep = check_model(args.model, provs)
    out.write((json.dumps(rep.to_dict(), indent=1) if args.json else rep.text()) + "\n")
    return 0 if rep.runnable else 1


def cmd_ops(args, out) -> int:
    from . import __version__

    out.write(f"# Supported ops of the CPU provider\n\nGenerated by `runtime-core ops` (runtime-core "
              f"{__version__}) from the CPU provider's kernel registry. A node whose op, schema version "
              f"or type is not listed is declined with a reason (`runtime-core check MODEL` says which).\n\n")
    out.write(op_table() + "\n")
    return 0
