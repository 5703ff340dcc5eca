"""The fuzzer (runtime_core/testing/fuzz.py): a short seeded run finds no crash, hang or
untyped error; it notices each kind when one happens; cases and reproducers are exact."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from runtime_core.testing import fuzz

SEED = 20261206


def test_short_seeded_run_is_clean(tmp_path):
    lines = []
    s = fuzz.fuzz(SEED, 50.0, tmp_path, max_cases=600, batch=300, progress=1.0, log=lines.append)
    assert any(" cases in " in line for line in lines), lines  # progress while it runs
    found = "; ".join(f"{f['kind']} {f['index']}: {f['detail']}" for f in s.findings)
    assert (s.crashes, s.hangs, s.untyped) == (0, 0, 0), found
    assert s.cases >= 60, s.to_dict()  # a slow, shared machine still gets through a good number
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["cases"] == s.cases and summary["seed"] == SEED and summary["done"]
    families = {k.split(":")[0] for k in summary["by_target"]}
    assert {"op", "mutate"} <= families


def test_every_kind_of_finding_is_recorded_with_a_reproducer(tmp_path, monkeypatch):
    monkeypatch.setenv(fuzz.SELFTEST_ENV, "crash:2,untyped:4,hang:6")
    # the timeout leaves room for an ordinary case on a loaded machine (3 s was hit by one there)
    # two children at once, slices of 3: a finding's child is replaced and the rest of its slice still runs
    s = fuzz.fuzz(SEED, 180.0, tmp_path, max_cases=8, batch=3, jobs=2, case_timeout=12.0, log=lambda *a: None)
    kinds = {(f["kind"], f["index"]) for f in s.findings}
    assert kinds == {("crash", 2), ("untyped", 4), ("hang", 6)}, s.findings
    assert (s.crashes, s.untyped, s.hangs, s.cases) == (1, 1, 1, 8)
    for f in s.findings:
        assert (tmp_path / f["reproducer"]).is_file()
    assert sum(s.by_target.values()) == 6  # the other cases, each once


def test_a_crash_while_onnxruntime_runs_the_case_is_counted_apart(tmp_path, monkeypatch):
    """With --compare, a child that dies after our side finished a case (onnxruntime segfaults on
    some models) is an oracle crash with a reproducer, not one of ours."""
    monkeypatch.setenv(fuzz.SELFTEST_ENV, "oracle-crash:1,crash:3")
    s = fuzz.fuzz(SEED, 120.0, tmp_path, max_cases=4, batch=4, case_timeout=12.0, targets=("act",), compare=True,
                  log=lambda *a: None)
    assert {(f["kind"], f["index"]) for f in s.findings} == {("oracle-crash", 1), ("crash", 3)}, s.findings
    assert (s.oracle_crashes, s.crashes, s.hangs, s.cases) == (1, 1, 0, 4)


def test_summary_is_written_while_running(tmp_path, monkeypatch):
    """A run killed midway still reports: summary.json is rewritten with each finding."""
    monkeypatch.setenv(fuzz.SELFTEST_ENV, "untyped:1")
    seen = []

    def log(line):
        if line.startswith("untyped"):
            seen.append(json.loads((tmp_path / "summary.json").read_text()))

    fuzz.fuzz(SEED, 120.0, tmp_path, max_cases=3, batch=3, log=log)
    assert len(seen) == 1 and seen[0]["untyped"] == 1 and not seen[0]["done"], seen


def test_cases_are_a_function_of_seed_and_index():
    for i in (0, 7, 123):
        a, b = fuzz.make_case(SEED, i), fuzz.make_case(SEED, i)
        assert a.model == b.model and a.what == b.what and sorted(a.feeds) == sorted(b.feeds)
    assert fuzz.make_case(SEED, 1).model != fuzz.make_case(SEED + 1, 1).model


@pytest.mark.parametrize("index", [0, 1])
def test_reproducer_script_runs_its_case(tmp_path, index):
    path = fuzz.write_reproducer(tmp_path, "untyped", SEED, index, "test")
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300,
                          check=False)
    case = fuzz.make_case(SEED, index)
    status, detail = fuzz.run_case(case)
    assert status == "ok"
    if detail == "result":
        assert proc.returncode == 0, proc.stderr[-2000:]
    else:  # the case ends in a typed error: the script shows that very error
        assert detail in proc.stderr, proc.stderr[-2000:]
