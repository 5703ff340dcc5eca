"""``runtime-core bench`` and ``runtime-core profile`` (see :mod:`runtime_core.bench`)."""

from __future__ import annotations

import json

from .cli_args import UsageError, check_readable, float_at_least, int_at_least, load_npz


def _check_inputs(args) -> None:
    """``--inputs``: an .npz archive that can be read (checked before any session is made)."""
    if args.inputs:
        load_npz(args.inputs, "--inputs")


def _check_model(path: str) -> None:
    if not path.endswith(".json"):
        check_readable(path, "model file")


def _providers(s):
    return [p.strip() for p in s.split(",") if p.strip()] if s else None


def cmd_bench(args, out) -> int:
    from .bench import BenchError, bench, format_result

    compare = False
    if args.compare:
        if args.compare.lower() != "onnxruntime":
            raise UsageError(f"--compare takes 'onnxruntime', got {args.compare!r}")
        compare = True
    _check_model(args.model)
    _check_inputs(args)
    try:
        r = bench(args.model, providers=_providers(args.providers), threads=args.threads, compare=compare,
                  warmup=args.warmup, repeat=args.repeat, level=args.level, inputs=args.inputs, dim=args.dim,
                  memory=not args.no_memory, memory_runs=args.memory_runs, create_repeat=args.create_repeat,
                  ort_spinning=args.ort_spinning, min_time=args.min_time, settle=args.settle)
    except BenchError as exc:
        import sys

        sys.stderr.write(f"error: {exc}\n")
        return 2
    out.write((json.dumps(r.to_dict(), indent=2) if args.json else format_result(r)) + "\n")
    return 0


def cmd_profile(args, out) -> int:
    from .bench import BenchError, format_profile, profile, summarize_profile

    warmup = 0
    if args.model.endswith(".json"):  # summarize an existing trace (ours or onnxruntime's)
        path = check_readable(args.model, "profile trace")
    else:
        _check_model(args.model)
        _check_inputs(args)
        if args.prefix:
            import os

            from .cli_args import check_output_dir

            check_output_dir(os.path.dirname(os.path.abspath(args.prefix)), "--prefix folder")
        warmup = 1  # the first run compiles plans: it is in the trace but not in the summary
        try:
            path = profile(args.model, providers=_providers(args.providers), threads=args.threads,
                           level=args.level, repeat=args.repeat, inputs=args.inputs, dim=args.dim,
                           prefix=args.prefix, runtime="onnxruntime" if args.onnxruntime else "ours",
                           warmup=warmup)
        except BenchError as exc:
            import sys

            sys.stderr.write(f"error: {exc}\n")
            return 2
    try:
        s = summarize_profile(path, top=args.top, skip_runs=warmup)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # json.JSONDecodeError is a ValueError
        raise UsageError(f"profile trace {path!r} is not a Chrome-trace JSON list of events "
                         f"(onnxruntime's or ours): {type(exc).__name__}: {exc}") from None
    out.write((json.dumps(s, indent=2) if args.json else format_profile(s)) + "\n")
    return 0


def _common(sp):
    sp.add_argument("model", help="path of an .onnx model")
    sp.add_argument("--providers", help="comma-separated provider names in priority order (default: CPUExecutionProvider)")
    sp.add_argument("--threads", type=int_at_least(0), default=2, help="intra-op threads for both runtimes (default 2)")
    sp.add_argument("--level", type=int, default=99, choices=(0, 1, 2, 99),
                    help="graph optimization level for both runtimes (default 99)")
    sp.add_argument("--inputs", metavar="FILE.npz",
                    help="feeds (default: MODEL.npz next to the model if present, else random)")
    sp.add_argument("--dim", type=int_at_least(0), default=1, help="symbolic dims of random inputs")
    sp.add_argument("--json", action="store_true")


def register(subparsers) -> None:
    sp = subparsers.add_parser("bench", help="median latency, session creation and peak memory "
                                             "(optionally against onnxruntime, interleaved)")
    _common(sp)
    sp.add_argument("--compare", metavar="onnxruntime", help="also run onnxruntime, interleaved with ours")
    sp.add_argument("--warmup", type=int_at_least(0), default=3)
    sp.add_argument("--repeat", type=int_at_least(1), default=20, help="timed runs of each runtime")
    sp.add_argument("--min-time", type=float_at_least(0.0), default=0.0, metavar="SECONDS",
                    help="keep interleaving past --repeat until the timed runs add up to this long "
                         "(at most 50x --repeat runs; steadier medians for models of a few ms)")
    sp.add_argument("--create-repeat", type=int_at_least(1), default=1,
                    help="session creations timed (minimum kept)")
    sp.add_argument("--memory-runs", type=int_at_least(1), default=3, help="runs in each memory subprocess")
    sp.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    sp.add_argument("--settle", type=float_at_least(0.0), default=0.2, metavar="SECONDS",
                    help="with --compare, alternate the runtimes in blocks of ~0.3 s, each after this "
                         "long idle and one untimed run, so that one runtime's spin-waiting thread "
                         "pool (numpy's OpenBLAS after our GEMMs) does not slow the other's runs; "
                         "0: alternate run by run")
    sp.add_argument("--ort-spinning", action="store_true",
                    help="leave onnxruntime's intra-op spin-waiting on (off by default: in interleaved runs "
                         "its spinning thread takes a core from ours)")
    sp.set_defaults(fn=cmd_bench)
    sp = subparsers.add_parser("profile", help="profile a model: time by op type, by provider, top nodes "
                                               "(or summarize an existing trace .json)")
    _common(sp)
    sp.set_defaults(threads=0)
    sp.add_argument("--repeat", type=int_at_least(1), default=10,
                    help="profiled runs, after one warm-up run (in the trace, not in the summary)")
    sp.add_argument("--top", type=int_at_least(1), default=10, help="how many nodes to list")
    sp.add_argument("--prefix", help="profile_file_prefix (default: in the temp folder)")
    sp.add_argument("--onnxruntime", action="store_true", help="profile with onnxruntime instead")
    sp.set_defaults(fn=cmd_profile)
