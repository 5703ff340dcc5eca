"""GEMM rates on this machine against its FMA peak: what ``runtime-core bench --gemm`` prints
(through :func:`runtime_provider_cpu.api.gemm_benchmark`).

The peak is measured, not looked up: ``_native.fma_peak`` runs 12 independent chains of
fused multiply-adds in the widest vectors the CPU has on each thread (no wider than the kernels'
cap, ``RUNTIME_CORE_CPU_ISA``: ymm under ``avx2``, so the rates are against the AVX2 peak), timed by the thread's
own CPU time; its rate is cores x clock x FMA units x lanes x 2 (double-pumped AVX-512 counted
as it runs), and the clock in ``/proc/cpuinfo`` gives the FMA units that implies. GEMMs are
timed by wall clock (best of the repeats) and by the process's CPU time over the threads
(less sensitive to other processes on the cores; a BLAS whose idle threads spin counts them).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time

import numpy as np

from . import autotune
from .packing import pack_linear
from .policy import current


def cpu_mhz() -> float | None:
    """The clock ``/proc/cpuinfo`` states (the first core's; a VM's is often the nominal one)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    return float(line.split(":", 1)[1])
    except (OSError, ValueError):
        pass
    return None


#: accumulator chains a thread of ``_native.fma_peak`` runs (``FP_CHAINS``, cpu_features.c)
FMA_PEAK_CHAINS = 12


def fma_peak(threads: int) -> dict:
    """The measured float32 FMA peak of ``threads`` cores: flop/s, lanes a vector, the stated
    clock and the FMA vectors a cycle that it implies (None without the compiled kernels).
    ``flops`` sums each thread's rate over its own CPU time; ``flops_wall`` is the same runs'
    flops over the call's wall clock (the threads started together), so it counts a thread
    only while both actually ran: a GEMM's wall-clock rate is fairly compared with it where
    the threads did not get their cores at once (``flops_wall`` below ``flops``)."""
    nat = current().native
    if nat is None or not hasattr(nat, "fma_peak"):
        return {"flops": None, "flops_wall": None, "lanes": None, "mhz": cpu_mhz(), "fma_per_cycle": None}
    best, best_wall, iters = (0.0, 0, 0.0), 0.0, 5_000_000
    for _ in range(3):
        t0 = time.perf_counter()
        got = nat.fma_peak(int(threads), iters)
        wall = time.perf_counter() - t0
        best = max(best, got)
        best_wall = max(best_wall, 2.0 * got[1] * FMA_PEAK_CHAINS * iters * threads / wall)
    flops, lanes, _ = best
    mhz = cpu_mhz()
    per_cycle = flops / threads / (2 * lanes * mhz * 1e6) if mhz else None
    return {"flops": flops, "flops_wall": best_wall, "lanes": lanes, "mhz": mhz, "fma_per_cycle": per_cycle}


def _rate(fn, flops: float, threads: int, repeats: int) -> dict:
    fn()
    walls, cpus = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        t1, c1 = time.perf_counter(), time.process_time()
        walls.append(t1 - t0)
        cpus.append(c1 - c0)
    wall = min(walls)
    cpu = sorted(cpus)[len(cpus) // 2] / max(1, threads)
    return {"gflops_wall": flops / wall / 1e9, "gflops_cpu": flops / cpu / 1e9 if cpu > 0 else None,
            "seconds": wall}


#: bytes of packed weight copies ``gemm_rates`` takes in turn for its weights-past-L2 rate
COLD_BYTES = 64 << 20


def gemm_rates(sizes, threads: int = 1, repeats: int = 5) -> dict:
    """For each (M, K, N) of ``sizes``: numpy's matmul (BLAS, held at ``threads`` threads) and
    ours (``_native.linear`` on a packed weight, where built) in GFLOP/s, ours also with its
    weights past L2 (``ours_cold``: copies taken in turn); each row's ``peak`` the higher of the
    FMA peak readings taken just before and just after ours (and ours_cold) of that size; plus the machine and the
    highest reading of all (``peak``)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # numpy's BLAS at its own thread count (said in the result)
        def threadpool_limits(**_):
            return contextlib.nullcontext()
    nat = current().native
    rng = np.random.default_rng(0)
    cases = []
    for M, K, N in sizes:
        cases.append((M, K, N, rng.standard_normal((M, K)).astype(np.float32),
                      rng.standard_normal((K, N)).astype(np.float32)))
    # ours first, every size, then numpy's: OpenBLAS's threads spin for tens of milliseconds
    # after each of its calls, and timed right after numpy's (or after the check below) our
    # second thread shared its core with them (docs/performance.md); in a model numpy's BLAS
    # is held at one thread (sgemm.hold_blas)
    # and ours again on copies of the packed weight taken in turn, COLD_BYTES in all: each call's
    # weights then come from L3 or memory, as a model's do (its other nodes' weights pass
    # between two runs of one)
    # and the peak read again after each size's timings: it moves by ~10% between readings (the
    # clock under the host's load), so each row is against the higher of the readings around
    # it, not against one taken seconds before (docs/performance.md)
    ours, colds, outs = [], [], []
    readings = [fma_peak(threads)]
    for M, K, N, a, w in cases:
        if nat is None or not current().linear:
            ours.append(None)
            colds.append(None)
            readings.append(readings[-1])
            continue
        wp = pack_linear(w, False)
        y = np.empty((M, N), np.float32)
        ours.append(_rate(lambda: nat.linear(a, wp, None, y, (M, K, N), int(threads), True), 2.0 * M * K * N,
                          threads, repeats))
        copies = [wp] + [pack_linear(w, False) for _ in range(max(1, min(15, -(-COLD_BYTES // wp.nbytes) - 1)))]
        turn = [0]

        def cold(a=a, y=y, copies=copies, turn=turn, M=M, K=K, N=N):
            turn[0] += 1
            nat.linear(a, copies[turn[0] % len(copies)], None, y, (M, K, N), int(threads), True)

        colds.append(_rate(cold, 2.0 * M * K * N, threads, repeats))
        del copies[1:]
        outs.append(y)
        readings.append(fma_peak(threads))
    rows = []
    with threadpool_limits(limits=int(threads), user_api="blas"):
        for i, ((M, K, N, a, w), o, oc) in enumerate(zip(cases, ours, colds)):
            flops = 2.0 * M * K * N
            rows.append({"size": (M, K, N), "numpy": _rate(lambda: np.matmul(a, w), flops, threads, repeats),
                         "ours": o, "ours_cold": oc, "peak": _higher(readings[i], readings[i + 1])})
        for (M, K, N, a, w), y in zip(cases, outs):
            np.testing.assert_allclose(y, a @ w, rtol=1e-3, atol=1e-3 * math.sqrt(K))
        blas = autotune.blas_info()
    isa = autotune.isa_level()
    if nat is not None and getattr(nat, "CPU_ISA", "avx512") != "avx512":
        # no AVX-512 kernels (the CPU, or RUNTIME_CORE_CPU_ISA / the build capping them): the
        # peak is measured in the vectors they use
        isa += f", kernels at {nat.CPU_ISA} (Linear tiles {getattr(nat, 'LINEAR_TILES', '?')})"
    peak = functools.reduce(_higher, readings)
    return {"cpu": autotune.cpu_model(), "isa": isa, "threads": int(threads),
            "blas": blas, "peak": peak, "rows": rows}


def _higher(p: dict, q: dict) -> dict:
    """Of two ``fma_peak`` readings, the higher one by ``flops`` (its ``flops_wall`` the higher of
    the two): the conservative peak to hold a rate against."""
    if not q["flops"]:
        return p
    if not p["flops"]:
        return q
    hi, lo = (p, q) if p["flops"] >= q["flops"] else (q, p)
    return dict(hi, flops_wall=max(hi["flops_wall"], lo["flops_wall"]))
