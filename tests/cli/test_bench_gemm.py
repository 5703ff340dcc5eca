"""``runtime-core bench --gemm``: GFLOP/s of our GEMM and numpy's, with its BLAS kernel and the
measured FMA peak; its mistakes are one ``error:`` line and exit status 2."""

from __future__ import annotations

import io
import json

import pytest

from runtime_core.cli import main


def run(*argv):
    out = io.StringIO()
    import contextlib

    with contextlib.redirect_stdout(out):
        code = main(list(argv))
    return code, out.getvalue()


def test_bench_gemm_table():
    code, text = run("bench", "--gemm", "--sizes", "16x32x48,5x7x9", "--threads", "1", "--gemm-repeat", "1")
    assert code == 0
    assert "numpy BLAS:" in text and "FMA peak:" in text
    rows = [line.split() for line in text.splitlines() if line.startswith(("16x32x48", "5x7x9"))]
    assert [r[0] for r in rows] == ["16x32x48", "5x7x9"]
    assert all(float(r[1]) > 0 for r in rows)  # numpy's GFLOP/s


def test_bench_gemm_json_against_the_api():
    from runtime_provider_cpu.api import gemm_benchmark

    code, text = run("bench-gemm", "--sizes", "8x8x8", "--threads", "1", "--gemm-repeat", "1", "--json")
    res = json.loads(text)
    assert code == 0 and res["threads"] == 1 and [r["size"] for r in res["rows"]] == [[8, 8, 8]]
    direct = gemm_benchmark([(8, 8, 8)], 1, 1)
    assert set(direct) == set(res) and direct["cpu"] == res["cpu"]
    from runtime_provider_cpu.fast import policy

    if policy.NATIVE is not None:
        assert direct["peak"]["flops"] > 0 and direct["peak"]["lanes"] in (4, 8, 16)
    row = direct["rows"][0]
    if row["ours"] is None:
        assert row["ours_cold"] is None
    else:  # ours again with the packed weight's copies taken in turn (each checked: same sums)
        assert row["ours_cold"]["gflops_wall"] > 0 and row["ours_cold"]["seconds"] > 0


def test_bench_gemm_cold_weights_column():
    """The table has ours with the weights past L2 beside ours; gemm_rates checks the product
    the last of those calls wrote (the copies hold the same weights) against numpy's."""
    code, text = run("bench", "--gemm", "--sizes", "13x40x70", "--threads", "1", "--gemm-repeat", "2")
    assert code == 0
    header = next(line for line in text.splitlines() if line.startswith("M x K x N"))
    assert "ours, cold W" in header
    row = next(line for line in text.splitlines() if line.startswith("13x40x70"))
    from runtime_provider_cpu.fast import policy

    if policy.NATIVE is not None and policy.current().linear:
        assert float(row.split()[5]) > 0  # ours, cold W


@pytest.mark.parametrize("argv,msg", [
    (["bench", "--gemm", "--sizes", "8x8"], "--sizes takes MxKxN"),
    (["bench", "--gemm", "--sizes", "8x0x8"], "--sizes takes MxKxN"),
    (["bench"], "name a model (or several), or --corpus"),
])
def test_bench_gemm_mistakes(argv, msg, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and msg in err and err.count("\n") == 1


def test_the_peak_by_wall_clock_is_no_more_than_by_each_threads_cpu_time():
    """fma_peak's two rates of the same runs: each thread's CPU time is at most the call's wall
    clock, so the wall-clock peak of two threads started together cannot pass the sum of their
    CPU-time rates (it falls below where a thread waited for its core)."""
    from runtime_provider_cpu.fast import policy
    from runtime_provider_cpu.fast.peak import fma_peak

    if policy.NATIVE is None:
        pytest.skip("no compiled kernels: no peak measured")
    for threads in (1, 2):
        peak = fma_peak(threads)
        assert 0 < peak["flops_wall"] <= peak["flops"] * 1.001
    code, text = run("bench", "--gemm", "--sizes", "8x8x8", "--threads", "2", "--gemm-repeat", "1")
    assert code == 0 and "FMA peak by wall clock" in text


def test_each_size_against_the_peak_read_around_it():
    """The FMA peak moves between readings (the clock under the host's load): gemm_rates reads it
    before and after each size's timings, each row carries the higher of its two readings, the
    top-level peak is the highest of all, and the table's '% peak' is against the row's."""
    from runtime_core.bench_gemm import format_gemm
    from runtime_provider_cpu.api import gemm_benchmark
    from runtime_provider_cpu.fast import policy

    res = gemm_benchmark([(8, 8, 8), (5, 7, 9)], 1, 1)
    if policy.NATIVE is not None:
        for r in res["rows"]:
            assert 0 < r["peak"]["flops"] <= res["peak"]["flops"]
            assert r["peak"]["lanes"] == res["peak"]["lanes"]
    rate = {"gflops_wall": 50.0, "gflops_cpu": 50.0, "seconds": 1.0}
    peak = {"flops": 200e9, "flops_wall": 190e9, "lanes": 16, "mhz": None, "fma_per_cycle": None}
    fake = {"cpu": "x", "isa": "y", "threads": 1, "blas": [], "peak": peak,
            "rows": [{"size": (1, 2, 3), "numpy": rate, "ours": rate, "ours_cold": rate,
                      "peak": dict(peak, flops=100e9)},
                     {"size": (4, 5, 6), "numpy": rate, "ours": rate, "ours_cold": rate}]}
    lines = format_gemm(fake).splitlines()
    assert next(x for x in lines if x.startswith("1x2x3")).split()[1:5] == ["50.0", "50%", "50.0", "50%"]
    # a row without its own readings (an older result) is against the top-level peak
    assert next(x for x in lines if x.startswith("4x5x6")).split()[1:5] == ["50.0", "25%", "50.0", "25%"]


def test_the_higher_of_two_peak_readings():
    from runtime_provider_cpu.fast.peak import _higher

    none = {"flops": None, "flops_wall": None, "lanes": None, "mhz": None, "fma_per_cycle": None}
    lo = {"flops": 1.0e11, "flops_wall": 0.9e11, "lanes": 16, "mhz": 2600.0, "fma_per_cycle": 1.0}
    hi = {"flops": 1.2e11, "flops_wall": 0.8e11, "lanes": 16, "mhz": 2600.0, "fma_per_cycle": 1.2}
    for a, b in ((lo, hi), (hi, lo)):
        got = _higher(a, b)
        assert got["flops"] == 1.2e11 and got["fma_per_cycle"] == 1.2 and got["flops_wall"] == 0.9e11
    assert _higher(none, lo) is lo and _higher(lo, none) is lo and _higher(none, none)["flops"] is None
