"""``pytest --runtime-provider NAME`` and the class-based API, run as a user would: in a subprocess."""

from __future__ import annotations

import re

from kit_helpers import CASES, SITE, run_pytest


def _counts(stdout: str) -> dict[str, int]:
    tail = stdout.strip().splitlines()[-1]
    return {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", tail)}


def test_the_option_runs_the_kit_and_prints_the_summary(tmp_path):
    proc = run_pytest(["--runtime-provider", "kitgood", "--runtime-provider-cases", CASES, "-q"], tmp_path,
                      [SITE])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    out = proc.stdout
    counts = _counts(out)
    # 4 contract checks + 3 claimed + 3 partial + 3 chains + concurrency + 1 copy dtype
    assert counts == {"passed": 15}, out[-3000:]
    assert "runtime-core provider kit: KitGoodExecutionProvider" in out
    for line in ("claimed fully: 3, partially: 3", "Add-14, Mul-14, Relu-14", "claimed cases: 3 run, 3 passed",
                 "partial cases (CPU fallback): 3 run, 3 passed", "fallback chains: 3 run, 3 passed",
                 "declined: "):
        assert line in out, out[-3000:]


def test_failures_are_test_failures_and_listed_in_the_summary(tmp_path):
    proc = run_pytest(["--runtime-provider", "kitwrong", "--runtime-provider-cases", r"^node/test_(add|mul)$",
                       "-q", "-rf"], tmp_path, [SITE])
    assert proc.returncode == 1, proc.stdout[-4000:]
    out = proc.stdout
    assert re.search(r"FAILED .*test_claimed_case\[test_add\]", out), out[-3000:]
    assert not re.search(r"FAILED .*test_claimed_case\[test_mul\]", out)
    assert re.search(r"FAILED .*test_fallback_chain\[test_add\]", out)
    assert "claimed cases: 2 run, 1 passed, 1 failed" in out
    assert "FAILED node/test_add: data set 0: vs the CPU provider" in out


def test_an_unknown_provider_fails_discovery_with_the_installed_ones(tmp_path):
    proc = run_pytest(["--runtime-provider", "nosuch", "--runtime-provider-cases", CASES, "-q"], tmp_path)
    assert proc.returncode == 1
    assert "no installed plugin provides 'nosuch'" in proc.stdout
    assert "CPUExecutionProvider (cpu)" in proc.stdout


def test_bad_kit_options_are_usage_errors(tmp_path):
    proc = run_pytest(["--runtime-provider", "kitgood", "--runtime-provider-option", "novalue"], tmp_path, [SITE])
    assert proc.returncode == 4 and "--runtime-provider-option takes KEY=VALUE" in proc.stderr
    proc = run_pytest(["--runtime-provider", "kitgood", "--runtime-provider-folders", "nodes"], tmp_path, [SITE])
    assert proc.returncode == 4 and "unknown folder(s) ['nodes']" in proc.stderr


def test_without_the_option_nothing_is_added(tmp_path):
    (tmp_path / "test_one.py").write_text("def test_one():\n    assert True\n")
    proc = run_pytest(["-q"], tmp_path, [SITE])
    assert proc.returncode == 0 and _counts(proc.stdout) == {"passed": 1}
    assert "provider kit" not in proc.stdout


def test_the_class_based_api_with_options(tmp_path):
    (tmp_path / "test_conformance.py").write_text(
        "from runtime_core.testing.suite import ProviderConformance\n\n\n"
        "class TestGood(ProviderConformance):\n"
        "    provider = 'kitgood'\n"
        f"    cases = {CASES!r}\n"
        "    tolerances = {'float32': (1e-3, 1e-4)}\n\n\n"
        "class TestLossy(ProviderConformance):\n"
        "    provider = 'kitlossy'\n"
        "    cases = r'^node/test_add$'\n")
    proc = run_pytest(["-q", "-rf"], tmp_path, [SITE])
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:]
    failed = re.findall(r"FAILED \S+::(\w+)::(\w+(?:\[[^\]]*\])?)", out)
    assert ("TestLossy", "test_copies_round_trip[float32]") in failed, out[-3000:]
    assert all(cls == "TestLossy" for cls, _ in failed), failed
    assert "runtime-core provider kit: KitGoodExecutionProvider" in out
    assert "runtime-core provider kit: KitLossyExecutionProvider" in out
