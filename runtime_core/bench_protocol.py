"""``runtime-core bench --compare onnxruntime``: each runtime alone in a fresh process, as users run it.

For every model, :func:`compare` runs ``rounds`` rounds (at least 3). A round starts one child
process per runtime (:mod:`runtime_core.bench_worker`, run as a script so that the onnxruntime
child never imports runtime-core), one after the other, the runtime that goes first alternating
from round to round. Each child creates its session with the runtime's default settings (only
``intra_op_num_threads`` = ``threads`` for both; onnxruntime's thread pool spins as shipped),
runs ``warmup`` untimed runs, then at least ``repeat`` timed runs (and until they add up to
``min_time`` seconds), and reports their median, its session creation time and its peak RSS
(``VmHWM``, else ``getrusage``: the whole process, imports included; plus the RSS just before
session creation).

The figure per model is the median of the per-round ratios ours / onnxruntime (a slow phase of
a shared machine falls on one round, both runtimes alike), with each runtime's median latency
(median of its per-round medians). ``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE`` are removed
from both children's environments unless ``keep_blas_env``: users do not set them, and they pin
numpy's OpenBLAS (where the CPU provider's GEMMs run) to a narrower kernel than the CPU has.
The header says what the children saw: CPU model, ISA level, numpy's BLAS library, version and
kernel (threadpoolctl, queried in a child with the same environment) and the thread count.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .bench import ORT, BenchError, default_inputs_path, import_ort, load_inputs, make_session
from .bench_worker import BLAS_ENV, RESULT_TAG

WORKER = Path(__file__).resolve().with_name("bench_worker.py")
#: a child's output differs from onnxruntime's by more than this, relative to the output's scale
MISMATCH_TOLERANCE = 1e-3
_ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
              "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8")


# -- the machine ------------------------------------------------------------------------------

def _amx_state() -> str:
    """The CPU provider's AMX int8 tiles here: "granted", or why they do not run."""
    try:
        from runtime_provider_cpu.api import amx_int8_state
    except ImportError:  # no CPU provider, or one older than API 1.2
        return "not reported by the installed CPU provider"
    return amx_int8_state()


def cpu_description(cpuinfo: str | None = None) -> dict:
    """CPU model, family/model numbers and ISA level from ``/proc/cpuinfo`` (or ``platform`` where
    there is none)."""
    here = cpuinfo is None
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    first: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if first:
                break
            continue
        k, _, v = line.partition(":")
        first.setdefault(k.strip(), v.strip())
    flags = set(first.get("flags", "").split())
    present = [f for f in _ISA_FLAGS if f in flags]
    if "avx512f" in flags:
        level = "AVX-512"
    elif "avx2" in flags and "fma" in flags:
        level = "AVX2+FMA"
    elif "avx" in flags:
        level = "AVX"
    elif flags:
        level = "SSE"
    else:
        level = f"unknown ({platform.machine()})"
    if "avx512_vnni" in flags or "avx_vnni" in flags:
        level += " + VNNI"
    if here and "amx_int8" in flags:  # whether our int8 kernels get the tiles: the OS may refuse them
        level += f" + AMX int8 ({_amx_state()})"
    return {"model": first.get("model name") or platform.processor() or platform.machine(),
            "family": first.get("cpu family"), "model_number": first.get("model"),
            "logical_cpus": os.cpu_count(), "isa_level": level, "isa_flags": present}


def child_env(keep_blas_env: bool = False, base: dict | None = None) -> dict:
    """The environment of both children: ours with the OpenBLAS pins removed unless kept."""
    env = dict(os.environ if base is None else base)
    if not keep_blas_env:
        for k in BLAS_ENV:
            env.pop(k, None)
    return env


def _spawn(args: list, env: dict, timeout: float) -> dict:
    code = "import runpy, sys; sys.argv[0] = sys.argv[1]; del sys.argv[1]; runpy.run_path(sys.argv[0], run_name='__main__')"
    cmd = [sys.executable, "-c", code, str(WORKER), *map(str, args)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"the child timed out after {timeout:g} s") from exc
    lines = [x for x in r.stdout.splitlines() if x.startswith(RESULT_TAG)]
    if r.returncode != 0 or not lines:
        tail = (r.stderr.strip() or r.stdout.strip())[-1500:]
        raise BenchError(f"the child exited with {r.returncode}: {tail}")
    return json.loads(lines[-1][len(RESULT_TAG):])


def probe(env: dict, timeout: float = 120) -> dict:
    """numpy's BLAS, numpy and Python versions and the pins, as a child with ``env`` sees them."""
    return _spawn(["probe"], env, timeout)


def _blas_text(blas: list) -> str:
    out = []
    for b in blas:
        if "error" in b:
            out.append(b["error"])
            continue
        name = " ".join(str(b[k]) for k in ("internal_api", "version") if b.get(k))
        out.append(f"{name}, kernel {b.get('architecture') or '?'}, {b.get('num_threads')} threads")
    return "; ".join(out) or "none found"


# -- results ----------------------------------------------------------------------------------

@dataclass
class Side:
    """One runtime's figures for a model, over the rounds."""
    version: str = ""
    median_ms: float | None = None  # median of the per-round medians
    round_ms: list = field(default_factory=list)
    create_s: float | None = None  # median over the rounds
    peak_rss_mb: float | None = None  # the largest of the children's
    rss_before_session_mb: float | None = None
    env_seen: dict = field(default_factory=dict)
    blas: str = ""


@dataclass
class ModelComparison:
    label: str
    model: str
    inputs: str
    rounds: list = field(default_factory=list)  # {"first": runtime, "ours_ms", "ort_ms", "ratio"}
    ours: Side = field(default_factory=Side)
    ort: Side = field(default_factory=Side)
    ratio: float | None = None  # median of the per-round ratios
    max_abs_diff: float | None = None
    max_rel_diff: float | None = None  # max abs diff / the largest |value| of onnxruntime's output
    mismatch: str | None = None
    error: str | None = None

    @property
    def memory_ratio(self) -> float | None:
        """Peak RSS of the whole processes, ours / onnxruntime's."""
        if self.ours.peak_rss_mb and self.ort.peak_rss_mb:
            return self.ours.peak_rss_mb / self.ort.peak_rss_mb
        return None

    @property
    def growth_ratio(self) -> float | None:
        """Peak RSS growth from just before session creation (imports left out), ours / onnxruntime's."""
        g = [s.peak_rss_mb - s.rss_before_session_mb if s.peak_rss_mb is not None
             and s.rss_before_session_mb is not None else None for s in (self.ours, self.ort)]
        return g[0] / g[1] if g[0] is not None and g[1] else None

    def to_dict(self) -> dict:
        return dict(asdict(self), memory_ratio=self.memory_ratio, growth_ratio=self.growth_ratio)


@dataclass
class ProtocolReport:
    header: dict
    models: list

    @property
    def median_ratio(self) -> float | None:
        rs = [m.ratio for m in self.models if m.ratio is not None]
        return statistics.median(rs) if rs else None

    def to_dict(self) -> dict:
        return {"header": self.header, "models": [m.to_dict() for m in self.models],
                "median_ratio": self.median_ratio}


def _compare_outputs(mc: ModelComparison, ours_npz: Path, ort_npz: Path,
                     tolerance: float = MISMATCH_TOLERANCE) -> None:
    with np.load(ours_npz) as a, np.load(ort_npz) as b:
        if sorted(a.files) != sorted(b.files):
            mc.mismatch = f"numeric outputs differ: ours {sorted(a.files)}, onnxruntime {sorted(b.files)}"
            return
        worst_abs = worst_rel = 0.0
        for k in a.files:
            x, y = a[k], b[k]
            if x.shape != y.shape:
                mc.mismatch = f"output {k}: shape {x.shape} against onnxruntime's {y.shape}"
                return
            if not x.size:
                continue
            x64, y64 = x.astype(np.float64), y.astype(np.float64)
            both_nan = np.isnan(x64) & np.isnan(y64)
            d = np.where(both_nan | (x64 == y64), 0.0, np.abs(x64 - y64))  # equal infinities too
            d = np.where(np.isnan(d), np.inf, d)  # a NaN on one side only is a mismatch
            scale = float(np.nanmax(np.abs(y64))) if np.isfinite(y64).any() else 1.0
            worst_abs = max(worst_abs, float(d.max()))
            worst_rel = max(worst_rel, float(d.max()) / max(scale, 1e-12))
        mc.max_abs_diff, mc.max_rel_diff = worst_abs, worst_rel
        if worst_rel > tolerance:
            mc.mismatch = (f"outputs differ from onnxruntime's: max abs difference {worst_abs:.3g} "
                           f"({worst_rel:.3g} of the output's largest magnitude)")


def _feeds_file(model: str, inputs: str | None, dim: int, providers, tmp: Path) -> tuple[str, str]:
    """The feeds both children load: ``inputs``, MODEL.npz next to the model, or random ones
    saved once so that both runtimes get the same values; and how to name them in the report."""
    if inputs is None:
        inputs = default_inputs_path(model)
    if inputs:
        return inputs, inputs
    sess = make_session("ours", model, providers=providers)
    path = tmp / "random_feeds.npz"
    np.savez(path, **load_inputs(sess, None, dim))
    return str(path), f"random (symbolic dims = {dim})"


def compare_model(model: str, *, label: str | None = None, inputs: str | None = None, threads: int = 2,
                  rounds: int = 3, warmup: int = 3, repeat: int = 10, min_time: float = 1.0,
                  level: int | None = None, providers=None, dim: int = 1, env: dict | None = None,
                  timeout: float = 1800, check: bool = True, log=None,
                  tolerance: float = MISMATCH_TOLERANCE) -> ModelComparison:
    """The protocol for one model (see the module docstring). A child that fails is recorded in
    the result's ``error`` (the other models of a corpus go on), never raised. ``tolerance``: the
    largest output difference, relative to the output's largest magnitude, not called a mismatch."""
    if rounds < 3:
        raise BenchError(f"the protocol needs at least 3 rounds, got {rounds}")
    env = child_env() if env is None else env
    mc = ModelComparison(label=label or Path(model).stem, model=str(model), inputs="")
    with tempfile.TemporaryDirectory(prefix="rc_bench_") as td:
        tmp = Path(td)
        try:
            feeds, mc.inputs = _feeds_file(str(model), inputs, dim, providers, tmp)
        except Exception as exc:  # a model our runtime cannot load: reported, the corpus goes on
            mc.error = f"runtime-core could not make inputs: {type(exc).__name__}: {exc}"
            return mc
        common = ["--inputs", feeds, "--threads", threads, "--warmup", warmup, "--repeat", repeat,
                  "--min-time", min_time]
        if level is not None:
            common += ["--level", level]
        results: dict[str, list] = {"ours": [], ORT: []}
        for r in range(rounds):
            order = ("ours", ORT) if r % 2 == 0 else (ORT, "ours")
            got = {}
            for rt_name in order:
                args = ["run", rt_name, str(model), *common]
                if rt_name == "ours" and providers:
                    args += ["--providers", ",".join(providers)]
                if check and r == 0:
                    args += ["--save-outputs", tmp / f"{rt_name}.npz"]
                if log:
                    log(f"{mc.label}: round {r + 1}/{rounds}, {'runtime-core' if rt_name == 'ours' else ORT}")
                try:
                    got[rt_name] = _spawn(args, env, timeout)
                except BenchError as exc:
                    who = "runtime-core" if rt_name == "ours" else ORT
                    mc.error = f"{who} failed in round {r + 1}: {exc}"
                    break
                results[rt_name].append(got[rt_name])
            if mc.error:
                break
            ratio = got["ours"]["median_ms"] / got[ORT]["median_ms"] if got[ORT]["median_ms"] else None
            mc.rounds.append({"first": "runtime-core" if order[0] == "ours" else ORT,
                              "ours_ms": got["ours"]["median_ms"], "ort_ms": got[ORT]["median_ms"],
                              "ratio": ratio})
            if check and r == 0:
                _compare_outputs(mc, tmp / "ours.npz", tmp / f"{ORT}.npz", tolerance)
        for rt_name, side in (("ours", mc.ours), (ORT, mc.ort)):
            res = results[rt_name]
            if not res:
                continue
            side.version = res[0]["version"]
            side.round_ms = [x["median_ms"] for x in res]
            side.median_ms = statistics.median(side.round_ms)
            side.create_s = statistics.median(x["create_s"] for x in res)
            side.peak_rss_mb = max(x["peak_rss_mb"] for x in res)
            before = [x["rss_before_session_mb"] for x in res if x["rss_before_session_mb"] is not None]
            side.rss_before_session_mb = statistics.median(before) if before else None
            side.env_seen = res[0]["env"]
            side.blas = _blas_text(res[0]["blas"])
    ratios = [x["ratio"] for x in mc.rounds if x["ratio"] is not None]
    mc.ratio = statistics.median(ratios) if ratios and not mc.error else None
    return mc


def header(*, threads: int, rounds: int, warmup: int, repeat: int, min_time: float, keep_blas_env: bool,
           env: dict, timeout: float = 120) -> dict:
    """What every table must state: the CPU, ISA level, numpy's BLAS as the children see it,
    the pins removed or kept, the thread count and the protocol's parameters."""
    import_ort()  # a missing onnxruntime is said before anything runs
    seen = probe(env, timeout)
    removed = [k for k in BLAS_ENV if os.environ.get(k) and k not in env]
    return {"cpu": cpu_description(), "platform": f"{platform.system()} {platform.machine()}",
            "python": seen["python"], "numpy": seen["numpy"], "blas": seen["blas"], "blas_text": _blas_text(seen["blas"]),
            "blas_env_in_children": {k: v for k, v in seen["env"].items() if v is not None},
            "blas_env_removed": removed, "keep_blas_env": keep_blas_env, "threads": threads,
            "rounds": rounds, "warmup": warmup, "repeat": repeat, "min_time": min_time}


def compare(models: list, *, threads: int = 2, rounds: int = 3, warmup: int = 3, repeat: int = 10,
            min_time: float = 1.0, level: int | None = None, providers=None, dim: int = 1,
            keep_blas_env: bool = False, timeout: float = 1800, check: bool = True, log=None,
            on_model=None) -> ProtocolReport:
    """Run :func:`compare_model` on each ``(label, model path, inputs path or None)``, or
    ``(..., tolerance)`` for a model whose outputs may differ more than ``MISMATCH_TOLERANCE``
    by design; ``on_model(header, result)`` is called as each model finishes."""
    if rounds < 3:
        raise BenchError(f"the protocol needs at least 3 rounds, got {rounds}")
    env = child_env(keep_blas_env)
    head = header(threads=threads, rounds=rounds, warmup=warmup, repeat=repeat, min_time=min_time,
                  keep_blas_env=keep_blas_env, env=env)
    out = []
    for label, model, inputs, *tol in models:
        mc = compare_model(model, label=label, inputs=inputs, threads=threads, rounds=rounds, warmup=warmup,
                           repeat=repeat, min_time=min_time, level=level, providers=providers, dim=dim,
                           env=env, timeout=timeout, check=check, log=log,
                           tolerance=tol[0] if tol else MISMATCH_TOLERANCE)
        out.append(mc)
        if on_model:
            on_model(head, mc)
    return ProtocolReport(head, out)


# -- text -------------------------------------------------------------------------------------

def format_header(h: dict) -> str:
    cpu = h["cpu"]
    fam = f" (family {cpu['family']}, model {cpu['model_number']})" if cpu.get("family") else ""
    if h["keep_blas_env"]:
        pins = ("kept: " + ", ".join(f"{k}={v}" for k, v in h["blas_env_in_children"].items())
                if h["blas_env_in_children"] else "kept (none set)")
    else:
        pins = "removed from both children" + (f" (set here: {', '.join(h['blas_env_removed'])})"
                                               if h["blas_env_removed"] else " (none was set here)")
    threads = f"{h['threads']} (intra_op_num_threads of both)" if h["threads"] else "each runtime's default"
    return "\n".join([
        "protocol: each runtime alone in a fresh process per round, default settings (onnxruntime's "
        "thread pool spinning as shipped), alternating which goes first; ratio = median of the "
        "per-round ratios runtime-core / onnxruntime",
        f"CPU: {cpu['model']}{fam}, {cpu['logical_cpus']} logical CPUs; ISA level: {cpu['isa_level']} "
        f"({' '.join(cpu['isa_flags']) or 'no flags read'})",
        f"numpy BLAS in the children: {h['blas_text']}; numpy {h['numpy']}, Python {h['python']}",
        f"OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE: {pins}",
        f"threads: {threads}; rounds: {h['rounds']}; per round "
        f"{h['warmup']} warm-up run(s), then >= {h['repeat']} timed run(s) and >= {h['min_time']:g} s"])


def format_rows(models: list) -> str:
    rows = [("model", "ours ms", "ort ms", "ratio", "per-round ratios", "peak RSS ours / ort MiB", "mem ratio",
             "growth ratio", "max rel diff")]
    notes = []
    for m in models:
        if m.error:
            rows.append((m.label, "-", "-", "FAILED", "", "", "", "", ""))
            notes.append(f"{m.label}: {m.error}")
            continue
        mem = (f"{m.ours.peak_rss_mb:.0f} / {m.ort.peak_rss_mb:.0f}"
               if m.ours.peak_rss_mb is not None and m.ort.peak_rss_mb is not None else "-")
        rows.append((m.label, f"{m.ours.median_ms:.3f}", f"{m.ort.median_ms:.3f}",
                     f"{m.ratio:.2f}" if m.ratio is not None else "-",
                     " ".join(f"{x['ratio']:.2f}" for x in m.rounds),
                     mem, f"{m.memory_ratio:.2f}" if m.memory_ratio else "-",
                     f"{m.growth_ratio:.2f}" if m.growth_ratio is not None else "-",
                     f"{m.max_rel_diff:.1e}" if m.max_rel_diff is not None else "-"))
        if m.mismatch:
            notes.append(f"{m.label}: MISMATCH: {m.mismatch}")
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines + notes)


def format_report(rep: ProtocolReport) -> str:
    lines = [format_header(rep.header)]
    vers = next(((m.ours.version, m.ort.version) for m in rep.models if m.ours.version and m.ort.version), None)
    if vers:
        lines.append(f"runtime-core {vers[0]}, onnxruntime {vers[1]}")
    lines += ["", format_rows(rep.models)]
    ok = [m for m in rep.models if m.ratio is not None]
    if len(rep.models) > 1:
        failed = [m.label for m in rep.models if m.error]
        mism = [m.label for m in rep.models if m.mismatch]
        lines.append("")
        lines.append(f"{len(ok)} of {len(rep.models)} model(s) measured; median ratio "
                     + (f"{rep.median_ratio:.2f}" if rep.median_ratio is not None else "-")
                     + f"; over 1.3: {', '.join(m.label for m in ok if m.ratio > 1.3) or 'none'}"
                     + f"; failed: {', '.join(failed) or 'none'}; output mismatches: {', '.join(mism) or 'none'}")
    lines.append("peak RSS: the whole child process (VmHWM, else getrusage: interpreter, imports, model, "
                 "runs), the largest over the rounds; growth ratio: the same peak less the RSS just before "
                 "session creation (imports left out), ours / onnxruntime's")
    return "\n".join(lines)


# -- the corpus (benchmarks/corpus, not part of the wheel) -----------------------------------

def corpus_path(given: str | None = None) -> Path:
    """Where ``benchmarks/corpus`` is: ``given``, ``$RUNTIME_CORE_CORPUS``, the source checkout's
    (an editable install) or the working folder's."""
    from .cli_args import UsageError

    candidates = [given] if given else [os.environ.get("RUNTIME_CORE_CORPUS"),
                                        Path(__file__).resolve().parents[1] / "benchmarks" / "corpus",
                                        Path.cwd() / "benchmarks" / "corpus", Path.cwd() / "corpus"]
    for c in candidates:
        if c and (Path(c) / "__init__.py").is_file():
            return Path(c)
    raise UsageError(f"no benchmark corpus found (looked for {', '.join(str(c) for c in candidates if c)}): "
                     "it lives in benchmarks/corpus of the source tree; pass --corpus-path DIR")


def load_corpus(given: str | None = None):
    """The corpus package (``select(half)``, ``build(name, cache)``), imported from its folder."""
    import importlib.util

    path = corpus_path(given)
    spec = importlib.util.spec_from_file_location("runtime_core_bench_corpus", path / "__init__.py",
                                                  submodule_search_locations=[str(path)])
    if spec is None or spec.loader is None:
        raise BenchError(f"cannot import the corpus package from {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its builder modules import each other relatively
    spec.loader.exec_module(mod)
    return mod
