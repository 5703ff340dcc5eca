"""``runtime-core optimize IN OUT [--level ...]``: write the optimized model (ORT's offline mode)."""

from __future__ import annotations

import collections

__all__ = ["register"]

LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
          "all": "ORT_ENABLE_ALL"}

#: domains whose ops onnxruntime also runs (its contrib ops are in com.microsoft)
ORT_DOMAINS = {"", "ai.onnx", "ai.onnx.ml", "com.microsoft"}


def register(sub) -> None:
    """Add the ``optimize`` subcommand."""
    sp = sub.add_parser("optimize", help="optimize a model and write it (offline mode)")
    sp.add_argument("input", help="model to optimize (.onnx)")
    sp.add_argument("output", help="where to write the optimized model")
    sp.add_argument("--level", choices=sorted(LEVELS), default="all", help="graph optimization level (default all)")
    sp.add_argument("--providers", help="comma-separated providers the optimized model is meant for "
                                        "(fusions leave the nodes other providers take alone); default cpu")
    sp.add_argument("--disable", default="", help="comma-separated pass names to disable")
    sp.set_defaults(fn=cmd_optimize)


def cmd_optimize(args, out) -> int:
    import os
    import warnings

    import onnx

    from ..cli_args import check_output_file, check_readable
    from ..session import GraphOptimizationLevel, InferenceSession, SessionOptions

    check_readable(args.input, "input model")
    check_output_file(args.output, "output", not_same_as=args.input)
    existed = os.path.exists(args.output)
    so = SessionOptions()
    so.graph_optimization_level = getattr(GraphOptimizationLevel, LEVELS[args.level])
    so.optimized_model_filepath = args.output
    if args.disable:
        so.add_session_config_entry("optimization.disable_specified_optimizers", args.disable)
    providers = [p.strip() for p in (args.providers or "cpu").split(",") if p.strip()]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sess = InferenceSession(args.input, so, providers=providers)
    except BaseException:
        if not existed and os.path.exists(args.output):  # nothing partial is left behind
            os.unlink(args.output)
        raise
    before = onnx.load(args.input, load_external_data=False)  # the session loaded it: it is valid
    after = onnx.load(args.output, load_external_data=False)
    n0, n1 = len(before.graph.node), len(after.graph.node)
    out.write(f"{args.input}: {n0} nodes -> {args.output}: {n1} nodes "
              f"({100 * (1 - n1 / max(n0, 1)):.0f}% fewer) at level {args.level}\n")
    done = {k: v for k, v in sess.optimizations.items() if v}
    if done:
        out.write("rewrites: " + ", ".join(f"{k} {v}" for k, v in done.items()) + "\n")
    fused = collections.Counter(f"{n.domain}::{n.op_type}" for n in after.graph.node if n.domain not in ("", "ai.onnx"))
    if fused:
        out.write("non-standard ops: " + ", ".join(f"{k} x{v}" for k, v in fused.most_common()) + "\n")
        ours_only = [k for k in fused if k.split("::")[0] not in ORT_DOMAINS]
        if ours_only:
            out.write(f"runs on runtime-core only: {', '.join(ours_only)}\n")
        else:
            out.write("the com.microsoft ops are onnxruntime contrib ops: onnxruntime loads this model too\n")
    else:
        out.write("standard ONNX ops only: onnxruntime and any ONNX runtime load this model\n")
    return 0
