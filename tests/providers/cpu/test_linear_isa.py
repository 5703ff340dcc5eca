"""The Linear's tiles for CPUs without AVX-512 (``native/linear_avx2.c``): the AVX2 + FMA tiles
and the baseline x86-64 ones, run here under ``RUNTIME_CORE_CPU_ISA`` (read once at import, so
each cap in a fresh process) against numpy in float64: odd sizes, one row, K and N tails, the
bias, the clip, the unpacked weight; ``pointwise_lanes``'s epilogue (row bias, residual,
activations) on the same tiles; the cap's own contract (the peak's lanes, a bad value)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import numpy as np
import pytest

from runtime_provider_cpu.fast.policy import NATIVE

pytestmark = [
    pytest.mark.native,
    pytest.mark.skipif(NATIVE is None, reason="the compiled extension is not built here"),
    pytest.mark.skipif(not (sys.platform.startswith("linux") and platform.machine() == "x86_64"),
                       reason="the ISA cap is an x86-64 Linux build's"),
]

# R, K, N: one row, a partial row panel (R % 12), partial 6-row sub-tiles, K tails (K % 8 for the
# AVX2 transpose, K past one chunk of 256), N tails (N % 32, N % 16, N < 16); 400 rows on 2 threads
# the row panels' order (linear.c's ln_part_panels)
SIZES = [(1, 1, 1), (1, 768, 96), (5, 7, 33), (7, 300, 45), (12, 257, 64), (13, 64, 17), (19, 513, 70),
         (25, 16, 1000), (37, 9, 8), (128, 768, 768), (400, 300, 70)]

PROBE = r"""
import json, sys
import numpy as np
from runtime_provider_cpu.fast.packing import pack_linear, pack_rows
from runtime_provider_cpu.fast.policy import NATIVE as nat, current

rng = np.random.default_rng(7)
out = {"isa": nat.CPU_ISA, "tiles": nat.LINEAR_TILES, "conv_fast": nat.CONV_FAST,
       "policy_linear": current().linear, "lanes": nat.fma_peak(1, 1000)[1], "err": []}

def err(y, want):
    return float(np.max(np.abs(y - want)) / (1.0 + np.max(np.abs(want))))

for R, K, N in json.loads(sys.argv[1]):
    a = rng.standard_normal((R, K)).astype(np.float32)
    w = rng.standard_normal((K, N)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    ref = a.astype(np.float64) @ w.astype(np.float64)
    wp = pack_linear(w, False)
    for packed, bias, lo, hi in ((True, None, -np.inf, np.inf), (True, b, -np.inf, np.inf),
                                 (True, b, 0.0, np.inf), (False, b, -0.5, 0.75), (False, None, 0.0, np.inf)):
        y = np.full((R, N), np.nan, np.float32)
        nat.linear(a, wp if packed else w, bias, y, (R, K, N), 2, packed, lo, hi)
        want = np.clip(ref + (0.0 if bias is None else b), lo, hi)
        out["err"].append([R, K, N, packed, bias is not None, lo, err(y, want)])

# pointwise_lanes on the same tiles: y = act(clip(w x + b + z)) with the row bias, the residual
# and each activation of the epilogue
M, C, P = 19, 70, 45
w = rng.standard_normal((M, C)).astype(np.float32)
x = rng.standard_normal((C, P)).astype(np.float32)
b = rng.standard_normal(M).astype(np.float32)
z = rng.standard_normal((M, P)).astype(np.float32)
t = np.clip(w.astype(np.float64) @ x + b[:, None] + z, -1.0, 2.5)
hs = np.clip(t / 6 + 0.5, 0, 1)
sig = 1 / (1 + np.exp(-t))
for act, want in ((-1, t), (0, t * hs), (1, hs), (2, sig), (3, t * sig)):
    y = np.empty((M, P), np.float32)
    nat.pointwise_lanes(pack_rows(w), x, b, z, y, (M, C, P), -1.0, 2.5, 2, act)
    out["err"].append(["pointwise", act, err(y, want)])
print(json.dumps(out))
"""


def probe(cap: str | None, sizes=SIZES) -> dict:
    env = dict(os.environ)
    env.pop("RUNTIME_CORE_CPU_ISA", None)
    if cap is not None:
        env["RUNTIME_CORE_CPU_ISA"] = cap
    got = subprocess.run([sys.executable, "-c", PROBE, json.dumps(sizes)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    return json.loads(got.stdout)


ORDER = ["baseline", "avx2", "avx512"]


def has_avx2() -> bool:
    return bool(NATIVE.cpu_isa()["avx2"])


def capped(cap: str) -> str:
    """The ISA a cap gives here: no wider than this process's (uncapped: the build's, as
    ``RUNTIME_CORE_NATIVE_ISA`` made it)."""
    return ORDER[min(ORDER.index(cap), ORDER.index(NATIVE.CPU_ISA))]


@pytest.mark.skipif(os.environ.get("RUNTIME_CORE_CPU_ISA", "") not in ("", "avx512"),
                    reason="this process is capped itself")
@pytest.mark.parametrize("cap", ["avx2", "baseline"])
def test_linear_under_the_cap_matches_numpy(cap):
    want = capped(cap)
    tiles = "avx2" if want == "avx2" and has_avx2() else "baseline"
    out = probe(cap)
    assert out["isa"] == want
    assert out["tiles"] == tiles
    assert out["conv_fast"] == 0  # no AVX-512 path under either cap
    assert out["policy_linear"] == (tiles == "avx2")  # the baseline's tiles are no candidate
    assert out["lanes"] == (8 if tiles == "avx2" else 4)  # the peak is the cap's vectors
    bad = [e for e in out["err"] if e[-1] > 2e-5 or not np.isfinite(e[-1])]
    assert not bad, bad


@pytest.mark.skipif(os.environ.get("RUNTIME_CORE_CPU_ISA", "") not in ("", "avx512"),
                    reason="this process is capped itself (its NATIVE is not the uncapped probe's)")
def test_uncapped_tiles_follow_the_cpu():
    out = probe(None, [(5, 7, 33)])
    avx512 = bool(NATIVE.CONV_FAST)
    assert out["tiles"] == ("avx512" if avx512 else "avx2" if has_avx2() and NATIVE.CPU_ISA != "baseline"
                            else "baseline")
    assert out["isa"] == NATIVE.CPU_ISA
    assert out["lanes"] == {"avx512": 16, "avx2": 8, "baseline": 4}[out["tiles"]]
    assert max(e[-1] for e in out["err"]) < 2e-5


def test_a_cap_it_does_not_name_fails_the_import():
    env = dict(os.environ, RUNTIME_CORE_CPU_ISA="avx1024")
    got = subprocess.run([sys.executable, "-c", "import runtime_provider_cpu._native"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert got.returncode != 0
    assert "ValueError: RUNTIME_CORE_CPU_ISA=avx1024: expected avx512, avx2 or baseline" in got.stderr


def test_gemm_bench_under_the_avx2_cap_measures_the_ymm_peak():
    """``bench --gemm`` under the cap: our Linear is the AVX2 one, timed, and checked against numpy
    inside gemm_rates; the peak is measured in 8-lane vectors and the header says the cap."""
    if not has_avx2() or capped("avx2") != "avx2":
        pytest.skip("no AVX2 here (or a baseline build)")
    code = ("import json; from runtime_provider_cpu.fast.peak import gemm_rates; "
            "r = gemm_rates([(13, 70, 45)], 1, 1); "
            "print(json.dumps([r['isa'], r['peak']['lanes'], r['rows'][0]['ours'] is not None]))")
    env = dict(os.environ, RUNTIME_CORE_CPU_ISA="avx2")
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    isa, lanes, timed = json.loads(got.stdout)
    assert "kernels at avx2 (Linear tiles avx2)" in isa
    assert lanes == 8
    assert timed
