"""Build the benchmark set and bench every model against onnxruntime; write a markdown table.

    python benchmarks/run_all.py [--threads 2] [--rounds 3] [--out benchmarks/RESULTS.md] [--cache DIR] [NAME ...]

Each model, by default: the protocol of ``runtime-core bench --compare onnxruntime``
(:mod:`runtime_core.bench_protocol`: each runtime alone in a fresh process per round, default
settings, alternating rounds, median of per-round ratios, OpenBLAS pins removed unless
``--keep-blas-env``). ``--in-process``: the older ``runtime_core.bench.bench(..., compare=True)``
(interleaved runs in this process, onnxruntime's spinning off), kept for comparison with old tables.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import models  # noqa: E402  (benchmarks/models.py)

from runtime_core.bench import blas_description, bench, format_result  # noqa: E402

# the targets: median latency ratio ours / onnxruntime
TARGETS = {"bert_base": 1.15, "gpt2_small": 1.15, "resnet18": 1.15, "mobilenet_v2": 1.5, "vit_tiny": 1.5,
           "bert_tiny_b8": 1.5, "lstm": 1.5, "gru": 1.5, "random_forest": 2.0, "lightgbm": 2.0, "xgboost": 2.0}
BIG = {"bert_base", "gpt2_small"}


def _protocol(a, argv) -> list:
    from runtime_core.bench_protocol import compare, format_header, format_rows

    entries = []
    for name in a.names or list(models.MODELS):
        path, inputs = models.build(name, Path(a.cache))
        entries.append((name, str(path), str(inputs)))
    levels = {models.MODELS[n][1].get("level") for n, _, _ in entries}
    rows = []
    # the add chain is benched with optimizations off (the dispatch cost); every other model at defaults
    for level in sorted(levels, key=lambda v: -1 if v is None else v):
        group = [e for e in entries if models.MODELS[e[0]][1].get("level") == level]
        rep = compare(group, threads=a.threads, rounds=a.rounds, keep_blas_env=a.keep_blas_env, level=level,
                      log=lambda m: print(m, file=sys.stderr, flush=True))
        print(format_header(rep.header) + "\n\n" + format_rows(rep.models), flush=True)
        rows += [(mc.label, rep.header, mc) for mc in rep.models]
    cpu = rows[0][1]["cpu"] if rows else {}
    head = rows[0][1] if rows else {}
    lines = ["# Benchmark results", "",
             f"`python benchmarks/run_all.py {' '.join(argv if argv is not None else sys.argv[1:])}`; "
             f"{time.strftime('%Y-%m-%d %H:%M')}; CPU: {cpu.get('model')} (family {cpu.get('family')}), ISA "
             f"{cpu.get('isa_level')}; numpy BLAS in the children: {head.get('blas_text')}; "
             f"pins {'kept' if a.keep_blas_env else 'removed'}; {a.threads} threads; {a.rounds} rounds.",
             "Each runtime alone in a fresh process per round with its default settings, alternating rounds; "
             "ratio = median of per-round ratios ours / onnxruntime. Peak RSS of the whole child process.", "",
             "| model | ours ms | onnxruntime ms | ratio | target | peak RSS ours / ort MiB | per-round ratios |",
             "|---|---|---|---|---|---|---|"]
    for name, _, mc in rows:
        t = TARGETS.get(name)
        target = f"<= {t}" if t else "-"
        if mc.error:
            lines.append(f"| {models.MODELS[name][2]} | - | - | FAILED | {target} | - | {mc.error[:80]} |")
            continue
        per_round = " ".join(f"{x['ratio']:.2f}" for x in mc.rounds)
        lines.append(f"| {models.MODELS[name][2]} | {mc.ours.median_ms:.2f} | {mc.ort.median_ms:.2f} | "
                     f"{mc.ratio:.2f} | {target} | {mc.ours.peak_rss_mb:.0f} / {mc.ort.peak_rss_mb:.0f} | "
                     f"{per_round} |")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help=f"models (default all): {', '.join(models.MODELS)}")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="protocol rounds (at least 3)")
    p.add_argument("--keep-blas-env", action="store_true", help="keep OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE")
    p.add_argument("--in-process", action="store_true", help="the older in-process, interleaved measurement")
    p.add_argument("--repeat", type=int, default=0, help="in process: timed runs each (default 15 big / 30 others)")
    p.add_argument("--min-time", type=float, default=3.0,
                   help="in process: seconds of interleaved runs at least, for the models other than the two big ones")
    p.add_argument("--cache", default=str(models.DEFAULT_CACHE))
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "RESULTS.md"))
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--settle", type=float, default=0.2,
                   help="in process: seconds idle before each block of one runtime's runs (0: run by run; see "
                        "runtime-core bench --settle)")
    a = p.parse_args(argv)
    if not a.in_process:
        lines = _protocol(a, argv)
        Path(a.out).write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        return 0
    rows = []
    for name in a.names or list(models.MODELS):
        path, inputs = models.build(name, Path(a.cache))
        _, kw, desc = models.MODELS[name]
        repeat = a.repeat or (15 if name in BIG else 30)
        # models of a few ms: at least 3 s of interleaved runs, so that a load swing of the
        # machine does not decide the medians (30 runs of a 2 ms model last 0.1 s)
        r = bench(str(path), threads=a.threads, compare=True, warmup=3, repeat=repeat, inputs=str(inputs),
                  memory=not a.no_memory, min_time=a.min_time if name not in BIG else 0.0,
                  settle=a.settle, **kw)
        print(f"== {name}\n{format_result(r)}\n", flush=True)
        rows.append((name, desc, r))
    latency = ("Latency: median of runs in one process, the runtimes alternating in blocks of ~0.3 s, "
               f"each after {a.settle:g} s idle and one untimed run (ratio = ours / onnxruntime)."
               if a.settle > 0 else
               "Latency: median of interleaved runs in one process (ratio = ours / onnxruntime).")
    lines = ["# Benchmark results", "",
             f"`python benchmarks/run_all.py {' '.join(argv if argv is not None else sys.argv[1:])}`; "
             f"{time.strftime('%Y-%m-%d %H:%M')}, "
             f"{platform.machine()} {platform.system()}, Python {platform.python_version()}; "
             f"numpy BLAS: {blas_description()}.",
             latency + " Session creation from the model path. Peak memory: peak RSS growth of creating "
             "the session and running it 3 times, in a fresh process per runtime.", "",
             "| model | ours ms | onnxruntime ms | ratio | target | creation ours / ort s | peak MiB ours / ort "
             "| per node us | nodes |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, desc, r in rows:
        t = TARGETS.get(name)
        target = f"<= {t}" if t else ("<= 5 us/node" if name == "add_chain" else "-")
        mem = (f"{r.ours.peak_mb:.0f} / {r.ort.peak_mb:.0f}" if r.ours.peak_mb is not None and r.ort.peak_mb
               is not None else "-")
        lines.append(f"| {desc} | {r.ours.latency.median_ms:.2f} | {r.ort.latency.median_ms:.2f} | "
                     f"{r.ratio:.2f} | {target} | {r.ours.create_s:.2f} / {r.ort.create_s:.2f} | {mem} | "
                     f"{r.per_node_us:.2f} | {r.nodes} |")
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
