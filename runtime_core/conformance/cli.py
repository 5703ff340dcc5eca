"""``runtime-core conformance``: the ONNX backend test suite against the installed providers."""

from __future__ import annotations

import json
import sys

__all__ = ["register"]


from ..cli_args import UsageError, check_output_file, float_at_least, int_at_least


def register(sub) -> None:
    """Add the ``conformance`` subcommand to the CLI's subparsers."""
    sp = sub.add_parser("conformance", help="run the ONNX backend test suite (2033 cases)")
    sp.add_argument("--providers", default="cpu", help="comma-separated providers in priority order (default cpu)")
    sp.add_argument("-k", dest="pattern", help="only cases whose folder/name matches this regular expression")
    sp.add_argument("--folders", help="comma-separated folders (node, simple, pytorch-converted, "
                                      "pytorch-operator, real); default all")
    sp.add_argument("--jobs", type=int_at_least(0), default=0, help="worker processes (default: CPU count)")
    sp.add_argument("--timeout", type=float_at_least(0.001), default=300.0, help="seconds a case may run")
    sp.add_argument("--json", metavar="FILE", help="write every result to FILE")
    sp.add_argument("--per-provider", action="store_true",
                    help="also count the cases whose nodes the first provider claims entirely")
    sp.add_argument("--quiet", action="store_true", help="no list of failures")
    sp.add_argument("--check", action="store_true",
                    help="exit 1 when a case outside the exclusion list fails or a listed case passes")
    sp.set_defaults(fn=cmd_conformance)


def cmd_conformance(args, out) -> int:
    from .cases import load_cases
    from .exclusions import load_exclusions, may_pass
    from .runner import Summary, run_cases

    import re

    from .cases import FOLDERS

    providers = [p.strip() for p in args.providers.split(",") if p.strip()]
    folders = [f.strip() for f in args.folders.split(",")] if args.folders else None
    unknown = [f for f in folders or () if f not in FOLDERS]
    if unknown:
        raise UsageError(f"--folders: unknown folder(s) {', '.join(map(repr, unknown))}; "
                         f"the folders are {', '.join(FOLDERS)}")
    if args.pattern:
        try:
            re.compile(args.pattern)
        except re.error as exc:
            raise UsageError(f"-k {args.pattern!r} is not a regular expression: {exc}") from None
    if args.json:
        check_output_file(args.json, "--json")  # before hours of cases, not after
    cases = load_cases(folders, args.pattern)
    if not cases:
        out.write("no case matches\n")
        return 1

    def progress(res, done, total):
        if res.status != "passed" and not args.quiet:
            sys.stderr.write(f"[{done}/{total}] {res.status}: {res.id}\n")

    results = run_cases(cases, providers, jobs=args.jobs or None, timeout=args.timeout, progress=progress)
    summary = Summary(results)
    excl = load_exclusions()
    if not args.quiet:
        for r in results:
            if not r.passed:
                first = r.message.splitlines()[0] if r.message else ""
                tag = " (excluded)" if r.id in excl else ""
                out.write(f"{r.status:8s} {r.id}{tag}: {first[:300]}\n")
    out.write(f"providers: {', '.join(providers)}\n")
    out.write(summary.table() + "\n")
    if args.per_provider and len(providers) > 1:
        from ..plugin.registry import get_registry

        rec = get_registry().lookup(providers[0])
        first = rec.name if rec is not None else providers[0]
        claimed = [r for r in results if r.placement and set(r.placement) == {first}]
        out.write(f"{first}: claims every node of {len(claimed)} case(s); "
                  f"{sum(r.passed for r in claimed)} passed, {sum(not r.passed for r in claimed)} failed\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"providers": providers, "results": [r.to_dict() for r in results]}, f, indent=1)
    unexpected = [r.id for r in results if not r.passed and r.id not in excl]
    stale = [r.id for r in results if r.passed and r.id in excl and not may_pass(excl[r.id])]
    if args.check and (unexpected or stale):
        out.write(f"{len(unexpected)} failure(s) not in the exclusion list; "
                  f"{len(stale)} listed case(s) now pass\n")
    out.write(f"{summary.passed} passed, {summary.failed} failed\n")
    return 1 if args.check and (unexpected or stale) else 0
