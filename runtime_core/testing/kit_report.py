"""The conformance kit's summary: what was checked, what passed, and why anything was not run."""

from __future__ import annotations

import textwrap
from collections import Counter

from .kit_cases import CHAIN, FAILED, FULL, NOT_EXERCISED, PARTIAL, PASSED

__all__ = ["summary"]

def summary(kit) -> str:
    """What was checked: claimed ops, passed, failed, declined; for each kind of run, why
    any scanned case was not run; for each failure, where its model and data are."""
    rec = kit.record
    head = (f"{rec.name} ({rec.alias} {rec.version}, {rec.distribution or '?'}, plugin API "
            f"{rec.plugin_api})" if rec is not None else f"{kit.provider} (not installed)")
    lines = [f"runtime-core provider kit: {head}"]
    if kit.options:
        lines.append("  options: " + ", ".join(f"{k}={v}" for k, v in kit.options.items()))
    for check, status in kit.checks.items():
        if not check.startswith("copies "):
            lines.append(f"  {check}: {'passed' if status == PASSED else 'FAILED'}")
    copies = {k[len('copies '):]: v for k, v in kit.checks.items() if k.startswith("copies ")}
    if copies:
        ok = [d for d, v in copies.items() if v == PASSED]
        bad = [d for d, v in copies.items() if v != PASSED]
        lines.append(f"  copies round-trip: {len(ok)} dtype(s) passed"
                     + (f", FAILED for {', '.join(bad)}" if bad else ""))
    if kit._scan is not None:
        scan = kit._scan
        loaded = [e for e in scan if not e.error]
        full = sum(e.full for e in loaded)
        part = sum(e.partial for e in loaded)
        stuck = sum(e.partial and not e.runnable for e in loaded)
        lines.append(f"  cases scanned: {len(scan)} ({', '.join(kit.folders)}"
                     + (f", matching {kit.pattern!r}" if kit.pattern else "") + f"); claimed fully: "
                     f"{full}, partially: {part}"
                     + (f" ({stuck} of them with nodes the CPU provider declines too)" if stuck else "")
                     + f", not at all: {len(loaded) - full - part}"
                     + (f"; not loadable by the core: {len(scan) - len(loaded)}"
                        if len(loaded) != len(scan) else ""))
        rnd = sum(bool(e.random) and (e.full or e.partial) for e in loaded)
        if rnd:
            lines.append(f"  not run: {rnd} claimed case(s) with random results (e.g. RandomUniformLike)")
        ops = sorted({v.qualified_op.removeprefix("ai.onnx::") for e in loaded
                      for v in e.nodes if v.name in set(e.claimed)})
        lines.append(f"  claimed ops ({len(ops)}, op-version):")
        lines.extend(textwrap.wrap(", ".join(ops) if ops else "none", 100,
                                   initial_indent="    ", subsequent_indent="    "))
        reasons = Counter(r for e in loaded for r in e.declined.values())
        n_declined = sum(len(e.declined) for e in loaded)
        lines.append(f"  declined: {n_declined} node(s), {len(reasons)} distinct reason(s)")
        for r, c in reasons.most_common(5):
            lines.append(f"    {c:5d} x {r[:110]}")
    for kind, label in ((FULL, "claimed cases"), (PARTIAL, "partial cases (CPU fallback)"),
                        (CHAIN, "fallback chains")):
        res = list(kit.results[kind].values())
        if not res:
            continue
        cnt = Counter(r.outcome for r in res)
        lines.append(f"  {label}: {len(res)} run, {cnt[PASSED]} passed, {cnt[FAILED]} failed"
                     + (f", {cnt[NOT_EXERCISED]} not exercised" if cnt[NOT_EXERCISED] else ""))
        lines.extend(f"    {gap}" for gap in _gaps(kit, kind, res))
        for r in [r for r in res if r.outcome == NOT_EXERCISED][:5]:
            lines.append(f"    not exercised {r.case}: {r.message[:160]}")
        for r in [r for r in res if r.outcome == FAILED][:10]:
            lines.append(f"    FAILED {r.case}: {r.message[:160]}")
            if r.location:
                lines.append(f"      {r.location}")
    return "\n".join(lines)


def _gaps(kit, kind: str, res: list) -> list[str]:
    """Why fewer cases ran than the scan counted (every case left out, by reason)."""
    if kit._scan is None:
        return []
    loaded = [e for e in kit._scan if not e.error]
    if kind == CHAIN:
        one = [e for e in kit.claimed_cases() if len(e.nodes) == 1]
        return [f"(of {len(one)} fully claimed one-node case(s), one per op-version and dtype among "
                "those whose output has the type and static shape of an input)"] if one else []
    wanted = [e for e in loaded if (e.full if kind == FULL else e.partial)]
    ran = {r.case for r in res}
    left = [e for e in wanted if e.id not in ran]
    if not left:
        return []
    why: Counter = Counter()
    for e in left:
        if e.violations:
            why["its capability answer broke the contract (see the capability check)"] += 1
        elif e.random:
            why["random results, which two sessions cannot compare"] += 1
        elif kind == PARTIAL and not e.runnable:
            why["nodes neither this provider nor the CPU provider takes"] += 1
        else:
            why["not selected in this run (-k or a failed earlier check)"] += 1
    word = "fully" if kind == FULL else "partially"
    return [f"(of {len(wanted)} {word} claimed case(s), not run: "
            + "; ".join(f"{c} with {w}" for w, c in why.most_common()) + ")"]
