"""``runtime-core bench --gemm`` (and ``runtime-core bench-gemm``): float32 GEMM rates of the
CPU provider's own kernel and numpy's BLAS on this machine, against its FMA peak (from
``runtime_provider_cpu.api.gemm_benchmark``; the peak is measured by a tight FMA loop on each
thread: cores x GHz x FMA units x lanes x 2)."""

from __future__ import annotations

import json

from .cli_args import UsageError, int_at_least

#: BERT-base's products at sequence 128: Q/K/V and output projections, the two MLP layers,
#: the fused QKV projection
DEFAULT_SIZES = "128x768x768,128x768x3072,128x3072x768,128x768x2304"


def _sizes(text: str) -> list[tuple[int, int, int]]:
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        dims = part.lower().split("x")
        if len(dims) != 3 or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise UsageError(f"--sizes takes MxKxN[,MxKxN...] of positive ints, got {part!r}")
        out.append((int(dims[0]), int(dims[1]), int(dims[2])))
    if not out:
        raise UsageError("--sizes names no size")
    return out


def _pct(rate, peak):
    return f"{100 * rate / peak:.0f}%" if rate and peak else "-"


def format_gemm(res: dict) -> str:
    """The table ``runtime-core bench --gemm`` prints."""
    peak = res["peak"]
    lines = [f"CPU: {res['cpu']}, {res['isa']}; {res['threads']} thread(s)"]
    for b in res["blas"] or [{"internal_api": "unknown (threadpoolctl not installed)"}]:
        lines.append(f"numpy BLAS: {b.get('internal_api')} {b.get('version') or ''} kernel "
                     f"{b.get('architecture') or '?'} ({b.get('filepath') or '-'})")
    if peak["flops"]:
        mhz = f"{peak['mhz']:.0f} MHz stated in /proc/cpuinfo" if peak["mhz"] else "no clock stated"
        units = f", i.e. {peak['fma_per_cycle']:.2f} FMA vectors a cycle a core at that clock" \
            if peak["fma_per_cycle"] else ""
        lines.append(f"FMA peak: {peak['flops'] / 1e9:.1f} GFLOP/s measured ({res['threads']} thread(s) x "
                     f"{peak['lanes']} float32 lanes x 2 flops x FMA units x clock; {mhz}{units})")
        if peak.get("flops_wall"):
            lines.append(f"FMA peak by wall clock, the threads started together: {peak['flops_wall'] / 1e9:.1f} "
                         "GFLOP/s (below the one above where a thread waited for its core)")
    else:
        lines.append("FMA peak: not measured (no compiled kernels)")
    pk = peak["flops"] / 1e9 if peak["flops"] else None
    rows = [("M x K x N", "numpy GFLOP/s", "% peak", "ours GFLOP/s", "% peak", "ours, cold W", "% peak",
             "numpy (cpu time)", "ours (cpu time)")]
    for r in res["rows"]:
        n, o, oc = r["numpy"], r["ours"], r.get("ours_cold")
        # each size against the peak read around its timings, where given
        rp = r["peak"]["flops"] / 1e9 if (r.get("peak") or {}).get("flops") else pk
        rows.append(("x".join(map(str, r["size"])), f"{n['gflops_wall']:.1f}", _pct(n["gflops_wall"], rp),
                     f"{o['gflops_wall']:.1f}" if o else "not built", _pct(o["gflops_wall"], rp) if o else "-",
                     f"{oc['gflops_wall']:.1f}" if oc else "-", _pct(oc["gflops_wall"], rp) if oc else "-",
                     f"{n['gflops_cpu']:.1f}" if n["gflops_cpu"] else "-",
                     f"{o['gflops_cpu']:.1f}" if o and o["gflops_cpu"] else "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.append("GFLOP/s by wall clock (best of the repeats); '% peak': against the higher of the FMA peak "
                 "readings taken just before and after our timings of that size (the peak above: the highest reading); "
                 "'cold W': ours on copies of the packed weight taken in turn (64 MiB), its weights from L3 or "
                 "memory as in a model; 'cpu time': by the process's CPU time over the threads (steadier on a busy "
                 "machine)")
    return "\n".join(lines)


def cmd_gemm(args, out) -> int:
    from runtime_provider_cpu.api import gemm_benchmark

    threads = args.threads or 1
    res = gemm_benchmark(_sizes(args.sizes), threads, args.gemm_repeat)
    out.write((json.dumps(res, indent=2, default=str) if args.json else format_gemm(res)) + "\n")
    return 0


def _gemm_options(sp, with_threads: bool) -> None:
    sp.add_argument("--sizes", default=DEFAULT_SIZES, metavar="MxKxN,...",
                    help=f"GEMM sizes for --gemm (default: BERT-base's at sequence 128, {DEFAULT_SIZES})")
    sp.add_argument("--gemm-repeat", type=int_at_least(1), default=5, help="timed calls of each GEMM")
    if with_threads:
        sp.add_argument("--threads", type=int_at_least(1), default=2, help="threads (default 2)")
        sp.add_argument("--json", action="store_true")


def register(subparsers) -> None:
    """``bench-gemm``; and ``--gemm`` on ``bench`` where that is registered first (its MODEL
    then optional)."""
    sp = subparsers.add_parser("bench-gemm", help="GEMM GFLOP/s: ours, numpy's BLAS and this CPU's FMA peak")
    _gemm_options(sp, True)
    sp.set_defaults(fn=cmd_gemm)
    bench = subparsers.choices.get("bench")
    if bench is None:
        return
    bench.add_argument("--gemm", action="store_true",
                       help="no model: GEMM GFLOP/s of ours, numpy's BLAS and this CPU's FMA peak (see --sizes)")
    _gemm_options(bench, False)
    single = False
    for action in bench._actions:
        if action.dest == "model" and action.nargs is None:  # one MODEL: make it optional
            action.nargs, action.required, single = "?", False, True
    model_fn = bench.get_default("fn")

    def fn(args, out):
        if args.gemm:
            return cmd_gemm(args, out)
        if single and not args.model:
            raise UsageError("bench needs a MODEL (or --gemm)")
        return model_fn(args, out)  # bench's own checks (several models, --corpus, ...)

    bench.set_defaults(fn=fn)
