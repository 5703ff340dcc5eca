"""The ``runtime-core`` command line: providers, run, partition."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import warnings
from importlib import resources
from pathlib import Path

import numpy as np

from .cli_args import Parser, UsageError, check_output_dir, check_output_file, int_at_least, load_npy

SAMPLE = "sample_cnn.onnx"


def sample_model_path() -> Path:
    """Path of the small CNN bundled with the package."""
    return Path(str(resources.files("runtime_core") / "samples" / SAMPLE))


def _table(rows: list[tuple], out) -> None:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")


def cmd_providers(args, out) -> int:
    import runtime_core as rt

    info = rt.get_provider_info()
    if args.json:
        out.write(json.dumps(info, indent=2) + "\n")
        return 0
    rows = [("name", "alias", "distribution", "version", "plugin API", "available", "reason")]
    for i in info:
        if i["status"] != "loaded":
            continue
        rows.append((i["name"], i["alias"], i["distribution"], i["version"], i["plugin_api"],
                     "yes" if i["available"] else "no", i["reason"] or "-"))
    _table(rows, out)
    from runtime_core.plugin.registry import get_registry

    unknown = get_registry().unknown_allowed
    if unknown:
        sys.stderr.write(f"warning: RUNTIME_CORE_PLUGINS names {', '.join(map(repr, unknown))}, which no "
                         "installed plugin provides; check the spelling (entry-point names: "
                         + ", ".join(i["alias"] for i in info) + ")\n")
    broken = [i for i in info if i["status"] != "loaded"]
    if broken:
        out.write("\nplugins not loaded:\n")
        rows = [("entry point", "distribution", "status", "error")]
        for i in broken:
            rows.append((i["alias"], i["distribution"] or "-", i["status"], i["reason"]))
        _table(rows, out)
    from runtime_core.plugin import API_VERSION

    out.write(f"\nruntime-core {rt.__version__}, plugin API {API_VERSION}\n")
    return 0


def _providers_arg(s: str | None):
    if not s:
        return None
    return [p.strip() for p in s.split(",") if p.strip()]


def _model_arg(args) -> str:
    if args.sample or args.model in (None, "sample"):
        if args.model not in (None, "sample"):
            raise UsageError("give either MODEL or --sample, not both")
        return str(sample_model_path())
    return args.model


def _session(args):
    import runtime_core as rt

    so = rt.SessionOptions()
    if getattr(args, "threads", None):
        so.intra_op_num_threads = args.threads
    if getattr(args, "strict", False):
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sess = rt.InferenceSession(_model_arg(args), so, providers=_providers_arg(args.providers))
    for w in caught:
        sys.stderr.write(f"warning: {w.message}\n")
    return sess


_DTYPES = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16,
    "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32, "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_,
    "tensor(string)": object,
}


def random_feeds(sess, dim: int = 1, seed: int = 0) -> dict:
    """Random inputs of the right types; symbolic or unknown dims get ``dim``."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in sess.get_inputs():
        dt = _DTYPES.get(i.type)
        if dt is None:
            raise UsageError(f"cannot make a random value for input {i.name!r} of type {i.type}; "
                             f"pass it with --input {i.name}=FILE.npy")
        shape = [d if isinstance(d, int) else dim for d in (i.shape or [])]
        if dt is object:
            feeds[i.name] = np.array(rng.choice(["a", "b", "c"], size=shape), dtype=object)
        elif np.issubdtype(dt, np.floating):
            feeds[i.name] = rng.standard_normal(shape).astype(dt)
        elif dt is np.bool_:
            feeds[i.name] = rng.random(shape) > 0.5
        else:
            feeds[i.name] = rng.integers(0, 2, size=shape).astype(dt)
    return feeds


def _input_files(specs) -> dict:
    """``--input NAME=FILE.npy`` values, loaded (every mistake is a :class:`UsageError`)."""
    given = {}
    for spec in specs or []:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--input takes NAME=FILE.npy (the model input's name, then its .npy file), "
                             f"got {spec!r}")
        if name in given:
            raise UsageError(f"--input {name}= is given twice")
        given[name] = load_npy(path, f"--input {name}: file")
    return given


def cmd_run(args, out) -> int:
    given = _input_files(args.input)  # every file is checked before the model loads
    if args.save:
        check_output_dir(args.save, "--save")
    sess = _session(args)
    names = [i.name for i in sess.get_inputs()]
    unknown = [n for n in given if n not in names]
    if unknown:
        raise UsageError(f"--input {unknown[0]}=: the model has no input {unknown[0]!r} "
                         f"(its inputs: {', '.join(names) or 'none'})")
    feeds = random_feeds(sess, dim=args.dim) if len(given) < len(names) else {}
    feeds.update(given)
    sess.run(None, feeds)  # warm-up
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        outs = sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    out.write(f"model: {_model_arg(args)}\n")
    out.write("inputs:\n")
    for i in sess.get_inputs():
        v = feeds[i.name]
        out.write(f"  {i.name}: {i.type} {list(np.shape(v))}\n")
    out.write("outputs:\n")
    for o, v in zip(sess.get_outputs(), outs):
        if isinstance(v, np.ndarray) and v.dtype.kind in "fiub" and v.size:
            stats = f"min {v.min():.4g} max {v.max():.4g} mean {v.astype(np.float64).mean():.4g}"
        else:
            stats = f"{type(v).__name__}"
        out.write(f"  {o.name}: {getattr(v, 'dtype', '')} {list(np.shape(v)) if isinstance(v, np.ndarray) else ''} {stats}\n")
    if args.save:
        _save_outputs(args.save, sess.get_outputs(), outs, out)
    out.write("partition:\n")
    for line in sess.get_partition_report().summary().splitlines():
        out.write(f"  {line}\n")
    med = sorted(times)[len(times) // 2] * 1e3
    out.write(f"latency: median {med:.3f} ms over {len(times)} run(s)\n")
    return 0


def _save_outputs(folder: str, specs, values, out) -> None:
    """Write each output as ``<name>.npy``; all or nothing (a file left half-written is removed)."""
    import os

    written = []
    try:
        for o, v in zip(specs, values):
            if not isinstance(v, np.ndarray) or v.dtype == object:
                out.write(f"  (output {o.name} is not a numeric array: not saved)\n")
                continue
            path = Path(folder) / (o.name.replace(os.sep, "_").replace("/", "_") + ".npy")
            written.append(path)
            np.save(path, v, allow_pickle=False)
    except OSError as exc:
        for p in written:
            p.unlink(missing_ok=True)
        raise UsageError(f"--save {folder!r}: writing {written[-1].name} failed: {exc.strerror or exc}; "
                         "nothing was saved") from None
    if written:
        out.write(f"saved: {', '.join(str(p) for p in written)}\n")


def cmd_partition(args, out) -> int:
    if getattr(args, "html", None):
        check_output_file(args.html, "--html")  # before the model loads
    sess = _session(args)
    rep = sess.get_partition_report()
    if getattr(args, "html", None):
        from .serving.page import write_partition_html

        write_partition_html(sess, Path(_model_arg(args)).stem, args.html)
        out.write(f"wrote {args.html}\n")
    if args.json:
        out.write(json.dumps(rep.to_dict(), indent=2) + "\n")
    else:
        out.write(str(rep) + "\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="runtime-core", description="Run ONNX models on pluggable execution providers.")
    sub = p.add_subparsers(dest="command", required=True)
    sp = sub.add_parser("providers", help="list installed providers and broken plugins")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_providers)
    for name, fn, hlp in (("run", cmd_run, "run a model (random inputs unless given)"),
                          ("partition", cmd_partition, "show where each node runs and why")):
        sp = sub.add_parser(name, help=hlp)
        sp.add_argument("model", nargs="?", help="path of an .onnx model ('sample' for the bundled one)")
        sp.add_argument("--sample", action="store_true", help="use the bundled sample CNN")
        sp.add_argument("--providers", help="comma-separated provider names in priority order")
        sp.add_argument("--strict", action="store_true", help="refuse to fall back to CPU")
        sp.add_argument("--threads", type=int_at_least(0), default=0, help="intra-op (BLAS) threads")
        if name == "run":
            sp.add_argument("--input", action="append", metavar="NAME=FILE.npy")
            sp.add_argument("--dim", type=int_at_least(0), default=1,
                            help="value for symbolic dims of random inputs")
            sp.add_argument("--repeat", type=int_at_least(1), default=10, help="timed runs (>= 1)")
            sp.add_argument("--save", metavar="DIR", help="save outputs as .npy files")
        else:
            sp.add_argument("--json", action="store_true")
            sp.add_argument("--html", metavar="OUT.html", help="also write the partition as a picture")
        sp.set_defaults(fn=fn)
    for mod in COMMAND_MODULES:
        importlib.import_module(mod).register(sub)
    return p


#: modules that add subcommands: each has ``register(subparsers)``, which adds its parsers
#: with ``set_defaults(fn=handler)``; a handler is ``fn(args, out) -> exit status``
COMMAND_MODULES = (
    "runtime_core.conformance.cli",
    "runtime_core.optimizer.cli",
    "runtime_core.check",
    "runtime_core.testing.cli",
    "runtime_core.bench_cli",
    "runtime_core.serving.cli",
    "runtime_core.quantization.cli",
    "runtime_core.bench_gemm",  # after bench_cli: adds --gemm to bench
)


def main(argv=None) -> int:
    from .errors import RuntimeCoreError

    args = build_parser().parse_args(argv)
    try:
        return args.fn(args, sys.stdout)
    except UsageError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except RuntimeCoreError as exc:
        msg = " ".join(str(exc).split())  # one line, whatever the message holds
        sys.stderr.write(f"error: {type(exc).__name__}: {msg}\n")
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
