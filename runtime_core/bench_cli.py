"""``runtime-core bench`` and ``runtime-core profile`` (see :mod:`runtime_core.bench`)."""

from __future__ import annotations

import json
import os

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


_IN_PROCESS_ONLY = ("settle", "ort_spinning", "create_repeat", "memory_runs", "no_memory")


def _corpus_entries(args, log) -> list:
    """``--corpus HALF``: the corpus models of that half, built into ``--cache`` (or found there)."""
    from .bench_protocol import load_corpus
    from .cli_args import check_output_dir

    if not args.cache:
        raise UsageError("--corpus needs --cache DIR: the folder the corpus models are built into")
    corpus = load_corpus(args.corpus_path)

    os.makedirs(args.cache, exist_ok=True)
    check_output_dir(args.cache, "--cache folder")
    entries = []
    for name in corpus.select(args.corpus):
        log(f"corpus: building {name} (or taking it from the cache)")
        model, inputs = corpus.build(name, args.cache, args.corpus_size)
        entries.append((name, str(model), str(inputs)))
    return entries


def cmd_bench(args, out) -> int:
    import sys

    from .bench import BenchError

    compare = False
    if args.compare:
        if args.compare.lower() != "onnxruntime":
            raise UsageError(f"--compare takes 'onnxruntime', got {args.compare!r}")
        compare = True
    if not args.model and not args.corpus:
        raise UsageError("name a model (or several), or --corpus tune|report|all with --compare onnxruntime, "
                         "or --gemm")
    if args.corpus and not (compare and not args.in_process):
        raise UsageError("--corpus runs the protocol: use it with --compare onnxruntime (without --in-process)")
    for m in args.model:
        _check_model(m)
    _check_inputs(args)
    if args.inputs and len(args.model) + bool(args.corpus) > 1:
        raise UsageError("--inputs feeds one model; with several, put MODEL.npz next to each model")

    def log(msg):
        sys.stderr.write(msg + "\n")
        sys.stderr.flush()

    try:
        if compare and not args.in_process:
            return _protocol(args, out, log)
        for opt in ("rounds", "keep_blas_env", "child_timeout", "out"):
            if getattr(args, opt) not in (None, False):
                raise UsageError(f"--{opt.replace('_', '-')} belongs to the protocol of --compare onnxruntime "
                                 "(not with --in-process or without --compare)")
        return _in_process(args, out, compare)
    except BenchError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2


def _in_process(args, out, compare) -> int:
    from .bench import bench, format_result

    def opt(name, default):
        v = getattr(args, name)
        return default if v is None else v

    results = []
    for model in args.model:
        r = bench(model, providers=_providers(args.providers), threads=args.threads, compare=compare,
                  warmup=args.warmup, repeat=opt("repeat", 20), level=opt("level", 99), inputs=args.inputs,
                  dim=args.dim, memory=not args.no_memory, memory_runs=opt("memory_runs", 3),
                  create_repeat=opt("create_repeat", 1), ort_spinning=args.ort_spinning,
                  min_time=opt("min_time", 0.0), settle=opt("settle", 0.2))
        results.append(r)
        if not args.json:
            out.write(format_result(r) + "\n" + ("\n" if len(args.model) > 1 else ""))
    if args.json:
        d = [r.to_dict() for r in results]
        out.write(json.dumps(d[0] if len(d) == 1 else d, indent=2) + "\n")
    return 0


def _protocol(args, out, log) -> int:
    from .bench_protocol import compare, format_header, format_report

    given = [o for o in _IN_PROCESS_ONLY if getattr(args, o) not in (None, False)]
    if given:
        raise UsageError(f"--{given[0].replace('_', '-')} belongs to --in-process; the protocol of "
                         "--compare onnxruntime always measures peak RSS in its children and leaves "
                         "onnxruntime's spinning as shipped")
    if args.out:
        from .cli_args import check_output_file

        check_output_file(args.out, "--out file")
    models = [(os.path.splitext(os.path.basename(m))[0], m, args.inputs) for m in args.model]
    if args.corpus:
        models += _corpus_entries(args, log)

    said: list = []

    def progress(head, mc):
        if not said:  # the header once, before the first model's line
            log(format_header(head))
            said.append(True)
        if mc.error:
            log(f"{mc.label}: FAILED: {mc.error}")
            return
        rounds = ", ".join(f"{x['ratio']:.2f}" for x in mc.rounds)
        log(f"{mc.label}: ratio {mc.ratio:.2f} (rounds {rounds})"
            + (f"; MISMATCH: {mc.mismatch}" if mc.mismatch else ""))

    rep = compare(models, threads=args.threads, rounds=args.rounds or 3, warmup=args.warmup,
                  repeat=args.repeat or 10, min_time=1.0 if args.min_time is None else args.min_time,
                  level=args.level, providers=_providers(args.providers), dim=args.dim,
                  keep_blas_env=bool(args.keep_blas_env), timeout=args.child_timeout or 1800, log=log,
                  on_model=progress)
    text = (json.dumps(rep.to_dict(), indent=2) if args.json else format_report(rep)) + "\n"
    out.write(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    return 1 if any(m.error or m.mismatch for m in rep.models) else 0


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


def _common(sp, many=False):
    if many:
        sp.add_argument("model", nargs="*", help="paths of .onnx models")
    else:
        sp.add_argument("model", help="path of an .onnx model")
    sp.add_argument("--providers", help="comma-separated provider names in priority order (default: CPUExecutionProvider)")
    sp.add_argument("--threads", type=int_at_least(0), default=2, help="intra-op threads for both runtimes (default 2)")
    sp.add_argument("--level", type=int, default=None if many else 99, choices=(0, 1, 2, 99),
                    help="graph optimization level for both runtimes (default 99"
                         + ("; the protocol leaves each runtime's default unless given)" if many else ")"))
    sp.add_argument("--inputs", metavar="FILE.npz",
                    help="feeds (default: MODEL.npz next to the model if present, else random)")
    sp.add_argument("--dim", type=int_at_least(0), default=1, help="symbolic dims of random inputs")
    sp.add_argument("--json", action="store_true")


def register(subparsers) -> None:
    sp = subparsers.add_parser("bench", help="latency against onnxruntime, each runtime in its own fresh "
                                             "process per round (--compare onnxruntime), or in this "
                                             "process (--in-process, or without --compare)")
    _common(sp, many=True)
    sp.add_argument("--compare", metavar="onnxruntime",
                    help="compare with onnxruntime: by default each runtime alone in a fresh process per "
                         "round, default settings, alternating rounds, median of per-round ratios")
    sp.add_argument("--in-process", action="store_true",
                    help="the older mode: both sessions in this process, runs interleaved")
    sp.add_argument("--rounds", type=int_at_least(3), default=None,
                    help="protocol rounds, each a fresh process per runtime, alternating which goes first "
                         "(default 3)")
    sp.add_argument("--keep-blas-env", action="store_true", default=None,
                    help="keep OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE in the children (removed by default: "
                         "users do not set them)")
    sp.add_argument("--child-timeout", type=float_at_least(1.0), default=None, metavar="SECONDS",
                    help="longest a protocol child may run (default 1800)")
    sp.add_argument("--corpus", choices=("tune", "report", "all"),
                    help="also bench the benchmark corpus (benchmarks/corpus): the half kernels are tuned "
                         "on, the half reported only, or both; needs --cache")
    sp.add_argument("--cache", metavar="DIR", help="folder the corpus models are built into and kept")
    sp.add_argument("--corpus-size", choices=("bench", "tiny"), default="bench",
                    help="the corpus models' documented sizes, or tiny ones of the same structure (a quick "
                         "check that every model runs; its timings mean nothing)")
    sp.add_argument("--corpus-path", metavar="DIR",
                    help="the corpus package folder (default: $RUNTIME_CORE_CORPUS, else benchmarks/corpus "
                         "of the source checkout or of the working folder)")
    sp.add_argument("--out", metavar="FILE", help="protocol: also write the report (text, or JSON with --json) here")
    sp.add_argument("--warmup", type=int_at_least(0), default=3, help="untimed runs first (per round)")
    sp.add_argument("--repeat", type=int_at_least(1), default=None,
                    help="timed runs of each runtime (default 20 in process; 10 per round in the protocol)")
    sp.add_argument("--min-time", type=float_at_least(0.0), default=None, metavar="SECONDS",
                    help="keep timing past --repeat until the timed runs add up to this long (default 1 s "
                         "per round in the protocol, capped at 100x --repeat; 0 in process, capped at 50x)")
    sp.add_argument("--create-repeat", type=int_at_least(1), default=None,
                    help="in process: session creations timed (minimum kept; default 1)")
    sp.add_argument("--memory-runs", type=int_at_least(1), default=None,
                    help="in process: runs in each memory subprocess (default 3)")
    sp.add_argument("--no-memory", action="store_true", help="in process: skip the peak-memory subprocesses")
    sp.add_argument("--settle", type=float_at_least(0.0), default=None, metavar="SECONDS",
                    help="in process with --compare: alternate the runtimes in blocks of ~0.3 s, each after "
                         "this long idle (default 0.2) and one untimed run, so that one runtime's "
                         "spin-waiting thread pool does not slow the other's runs; 0: run by run")
    sp.add_argument("--ort-spinning", action="store_true",
                    help="in process: leave onnxruntime's intra-op spin-waiting on (off there: in "
                         "interleaved runs its spinning thread takes a core from ours)")
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
