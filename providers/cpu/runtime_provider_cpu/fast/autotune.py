"""Kernels chosen on this machine: where a compiled path competes with a library call (the
Linear kernels with BLAS's sgemm, the conv plans with im2col and GEMM, the attention heads
kernel with numpy's batched matmul), each candidate is timed on the node's own weights and
first input, the fastest is kept, and the choice is cached per machine and shape.

A choice is keyed by the family, the shape, the dtype and the kernel threads; it is kept in
memory for the process and in one JSON file per machine (CPU model, ISA, BLAS library and
kernel, the compiled module's build, this provider's version): ``<folder>/autotune-<hash>.json``,
the folder ``$RUNTIME_CORE_AUTOTUNE_DIR``, else ``$XDG_CACHE_HOME/runtime-core``, else
``~/.cache/runtime-core`` (``RUNTIME_CORE_AUTOTUNE_DIR=0``: memory only). Writes are atomic
(a temporary file renamed over the old one, merged with what other processes wrote); a file
that does not parse is ignored with a warning and replaced.

A measurement made while other threads held the cores is not written to the file: the time this
process's threads spent runnable but waiting for a core (``/proc/self/task/*/schedstat``) and the
time the hypervisor took from the virtual CPUs (steal, ``/proc/stat``) are read around it and
after each group of rounds (:data:`GROUP_S`), and past :data:`NOISY_SHARE` of the wall time the choice holds for this process
only (a later process measures it again), unless every candidate had a round under that share
with no more runnable threads on the machine than cores (``/proc/loadavg``; a queued thread's
wait is counted only when it runs again) and those quiet rounds pick the same candidate: a plan chosen beside busy processes was kept on
disk for good and ran twice as slow on the quiet machine.

The policy decides before any measurement (:func:`decide`): a forced candidate
(``Policy.linear_kernel`` and the like, what tests use; "a,b": the first that applies)
wherever it applies; with tuning off
(``Policy.tune`` False, or a session's ``session.cpu.autotune`` = ``"0"``) the library call.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import tempfile
import threading
import time
from typing import Any, Callable

from .. import arena
from .._version import __version__
from .policy import current

_log = logging.getLogger("runtime_provider_cpu")

#: the folder of the cache files ("0": no file, the choices live as long as the process)
DIR_ENV = "RUNTIME_CORE_AUTOTUNE_DIR"
#: timed rounds per candidate (after one untimed call each), alternating between candidates
ROUNDS = 3
#: stop adding rounds once the measurement took this long (seconds), one timed round at least
BUDGET_S = 0.5
#: quick candidates (all rounds so far under QUICK_S) get up to MAX_ROUNDS rounds: on a loaded
#: machine a sub-millisecond call is often preempted, and a choice kept on disk for good should
#: not rest on three samples (a plan 8x slower was kept that way beside busy processes)
MAX_ROUNDS = 15
QUICK_S = 0.05
#: a measurement whose threads waited for a core (or lost it to the hypervisor) this share of
#: its wall time or more is noisy: its choice is kept in memory, not on disk
NOISY_SHARE = 0.1
#: rounds are read for noise in groups of at least this long (seconds): a reading costs ~30 us
GROUP_S = 0.001

_LOCK = threading.Lock()
_MEMORY: dict[str, str] = {}
_STATE: dict[str, Any] = {"machine": None, "loaded": None}


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; elsewhere what ``platform`` says)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def isa_level() -> str:
    """The widest vector ISA of this CPU that the kernels and BLAS may use."""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    if {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags:
        return "x86-64-v4 (AVX-512)"
    if {"avx2", "fma"} <= flags:
        return "x86-64-v3 (AVX2, FMA)"
    return platform.machine() + (" (" + ", ".join(sorted(f for f in flags if f.startswith("sse4"))) + ")"
                                 if flags else "")


def blas_info() -> list[dict]:
    """numpy's (and SciPy's, when loaded) BLAS libraries as threadpoolctl sees them: library,
    version and kernel (``architecture``; OpenBLAS's depends on ``OPENBLAS_CORETYPE``);
    empty without threadpoolctl."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    out = []
    for lib in threadpool_info():
        if lib.get("user_api") == "blas":
            out.append({k: lib.get(k) for k in ("internal_api", "version", "architecture", "num_threads",
                                                  "filepath")})
    return out


def machine() -> dict:
    """What a cached choice holds for: CPU model, ISA, BLAS libraries and kernels, the
    compiled kernels' build and this provider's version (once per process; SciPy's BLAS,
    which some compiled kernels call, is loaded first where it is installed)."""
    if _STATE["machine"] is None:
        try:  # the library the sgemm-calling kernels use, so that it is in the fingerprint
            from .sgemm import cython_blas

            cython_blas()
        except Exception:  # noqa: BLE001 - no SciPy: those kernels are not candidates
            pass
        nat = current().native
        _STATE["machine"] = {
            "cpu": cpu_model(),
            "isa": isa_level(),
            "blas": sorted({f"{b['internal_api']} {b['version']} {b['architecture']}" for b in blas_info()}),
            "native": None if nat is None else f"CONV_FAST={getattr(nat, 'CONV_FAST', 0)} {_build_id(nat)}",
            "provider": __version__,
        }
    return _STATE["machine"]


def _build_id(module) -> str:
    """The compiled module's file size and modification time: a rebuilt extension (a new
    kernel among the candidates, with the same provider version) measures its choices again
    instead of reusing the old build's."""
    try:
        st = os.stat(module.__file__)
        return f"build={st.st_size}-{int(st.st_mtime)}"
    except (AttributeError, TypeError, OSError):
        return "build=?"


def cache_path() -> str | None:
    """The cache file of this machine, or None (``RUNTIME_CORE_AUTOTUNE_DIR=0``)."""
    folder = os.environ.get(DIR_ENV, "")
    if folder == "0":
        return None
    if not folder:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        folder = os.path.join(base, "runtime-core")
    import zlib  # a file name, not a security digest: hashlib would load OpenSSL (~3.5 MiB resident)

    data = json.dumps(machine(), sort_keys=True).encode()
    digest = f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}"
    return os.path.join(folder, f"autotune-{digest}.json")


def _read(path: str) -> dict[str, str]:
    """The choices in ``path`` ({} when missing; a file that does not parse: {} and a warning)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        choices = data["choices"]
        if not isinstance(choices, dict) or not all(isinstance(v, str) for v in choices.values()):
            raise ValueError("'choices' is not a map of strings")
        return dict(choices)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _log.warning("CPU provider: ignoring the kernel choice cache %s (%s: %s); it is measured again",
                     path, type(exc).__name__, exc)
        return {}


def _load() -> None:
    """The cache file's choices into memory, once (under _LOCK)."""
    path = cache_path()
    if _STATE["loaded"] != path:
        _STATE["loaded"] = path
        if path is not None:
            for k, v in _read(path).items():
                _MEMORY.setdefault(k, v)


def _write(key: str, name: str) -> None:
    """``key: name`` into the cache file: merged with what is there, written to a temporary
    file in the same folder and renamed over it (a reader sees the old file or the new one)."""
    path = cache_path()
    if path is None:
        return
    try:
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        choices = _read(path)
        choices[key] = name
        fd, tmp = tempfile.mkstemp(prefix=".autotune-", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"machine": machine(), "choices": choices}, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as exc:  # a read-only home: the choice holds for this process only
        _log.info("CPU provider: could not write the kernel choice cache %s: %s", path, exc)


def cache_key(family: str, shape: tuple, dtype: str, threads: int) -> str:
    """The key of one choice: family, shape (what the candidates' speed depends on), dtype, threads."""
    return f"{family}|{'x'.join(str(d) for d in shape)}|{dtype}|t{int(threads)}"


def decide(family: str, key: str, names: list[str], library: str, tune: bool = True) -> str | None:
    """The candidate of ``names`` the policy or an earlier measurement decided for ``key``,
    or None (measure it: :func:`measure`). ``library`` is the library call's name, taken with
    tuning off; a forced candidate that does not apply here: the library call."""
    p = current()
    forced = getattr(p, f"{family}_kernel", "")
    if forced:  # "a,b": the first of them that applies
        return next((f for f in forced.split(",") if f in names), library)
    if len(names) == 1:
        return names[0]
    if not (tune and p.tune):
        return library
    with _LOCK:
        _load()
        name = _MEMORY.get(key)
    return name if name in names else None


def _ticks_ns() -> float:
    """Nanoseconds of one ``/proc/stat`` tick."""
    try:
        return 1e9 / os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):
        return 1e7


def _head(path: str) -> bytes:
    """The first 256 bytes of ``path`` (os.read: a /proc file through open() costs 10x more)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 256)
    finally:
        os.close(fd)


def contention() -> tuple[int, float] | None:
    """(ns this process's threads have waited runnable for a core, ns of CPU time the hypervisor
    stole from each virtual CPU on average), both counted since boot; None where Linux's
    ``/proc`` does not say (no noise is detected there)."""
    try:
        waited = 0
        for tid in os.listdir("/proc/self/task"):
            try:
                waited += int(_head(f"/proc/self/task/{tid}/schedstat").split()[1])
            except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
                continue
        cpu = _head("/proc/stat").split(b"\n", 1)[0].split()  # the first line: all CPUs
        steal = int(cpu[8]) if len(cpu) > 8 and cpu[0] == b"cpu" else 0
        return waited, steal * _ticks_ns() / (os.cpu_count() or 1)
    except (OSError, ValueError):
        return None


def crowded() -> bool:
    """Whether more threads are runnable on the machine now than this process has cores (the
    instantaneous count in ``/proc/loadavg``): a thread that waits for a core shows in
    :func:`contention` only once it gets one back. False where Linux's ``/proc`` does not say."""
    try:
        running = int(_head("/proc/loadavg").split()[3].split(b"/")[0])
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return running > cores
    except (OSError, ValueError, IndexError):
        return False


def noise(before: tuple[int, float] | None, after: tuple[int, float] | None, wall_s: float) -> float:
    """The share of ``wall_s`` that this process's threads waited for a core or lost to the
    hypervisor between two :func:`contention` readings (0 where either is None)."""
    if before is None or after is None or wall_s <= 0:
        return 0.0
    return ((after[0] - before[0]) + (after[1] - before[1])) / (wall_s * 1e9)


def measure(key: str, runners: dict[str, Callable[[], Any]]) -> tuple[str, dict[str, float]]:
    """Time each of ``runners`` (name -> a call on the node's real inputs): one untimed call
    each, then alternating timed rounds (:data:`ROUNDS`, fewer past :data:`BUDGET_S`, up to
    :data:`MAX_ROUNDS` while the whole measurement stays under :data:`QUICK_S`);
    the fastest by its best round is kept for ``key`` (in memory; in the file too unless the
    measurement was noisy and its quiet rounds do not confirm the choice, :data:`NOISY_SHARE`)
    and returned with every candidate's best time in seconds."""
    names = list(runners)
    for n in names:
        runners[n]()
    best = dict.fromkeys(names, float("inf"))
    clean = dict.fromkeys(names, float("inf"))  # the best of rounds in which no thread waited long
    before = last = contention()
    prev_group: dict[str, float] = {}
    prev_ok = False
    group: dict[str, float] = {}  # each candidate's best in the rounds since the last reading
    group_s = 0.0
    start = time.perf_counter()
    for r in range(1, MAX_ROUNDS + 1):
        for n in names:
            t0 = time.perf_counter()
            runners[n]()
            dt = time.perf_counter() - t0
            best[n] = min(best[n], dt)
            group[n] = min(group.get(n, float("inf")), dt)
            group_s += dt
        took = time.perf_counter() - start
        done = r == MAX_ROUNDS or took > BUDGET_S or (r >= ROUNDS and took > QUICK_S)
        if group_s >= GROUP_S or done:
            now = contention()
            ok = noise(last, now, group_s) < NOISY_SHARE and not crowded()
            # a thread's wait is counted when it gets a core back: a worker still queued at a
            # reading shows in the next one, so a group is quiet once the next one is too
            if ok and prev_ok:
                for n, t in prev_group.items():
                    clean[n] = min(clean[n], t)
            prev_group, prev_ok, last = group, ok, now
            group, group_s = {}, 0.0
        if done:
            break
    share = noise(before, last, time.perf_counter() - start)
    name = min(names, key=best.__getitem__)
    # kept on disk where the whole measurement was quiet, or where every candidate had quiet
    # rounds (uncrowded, the next reading quiet too) and the quiet rounds pick the same candidate
    quiet = share < NOISY_SHARE or (max(clean.values()) < float("inf") and min(names, key=clean.__getitem__) == name)
    with _LOCK:
        _MEMORY[key] = name
        if quiet:
            _write(key, name)
    arena.release()  # the trial results, freed, are not kept by the arena
    _log.info("CPU provider: %s: %s (%s)%s", key, name,
              ", ".join(f"{n} {best[n] * 1e3:.3f} ms" for n in names),
              "" if quiet else f"; not cached on disk: threads waited for a core {share:.0%} of the time")
    return name, best


def note(ctx, what: str, name: str) -> None:
    """Record on the node (``ctx.cache["kernels"]``) that ``what`` (an input size) runs on
    ``name``: what ``CPUExecutable.kernels()`` reports."""
    cache = getattr(ctx, "cache", None)
    if cache is not None:
        cache.setdefault("kernels", {})[what] = name


def forget() -> None:
    """Drop the in-memory choices and the machine fingerprint (tests; a changed cache folder)."""
    with _LOCK:
        _MEMORY.clear()
        _STATE["machine"] = None
        _STATE["loaded"] = None
