"""The ONNX backend test suite on the CPU provider, through the isolated runner.

Every case runs; the test fails when a case outside ``exclusions.txt`` fails, when an
excluded case passes (the list must stay true), or when fewer than 2013 of 2033 pass.
"""

from __future__ import annotations

import os

import pytest

from runtime_core.conformance.cases import FOLDERS, load_cases
from runtime_core.conformance.exclusions import load_exclusions
from runtime_core.conformance.runner import Summary, run_cases

#: the issue's floor: at most 20 of the 2033 cases may fail
FLOOR = 2013


@pytest.fixture(scope="module")
def results():
    cases = load_cases()
    return cases, run_cases(cases, ["cpu"], jobs=os.cpu_count() or 2)


def test_every_folder_is_there(results):
    cases, _ = results
    counts = {f: sum(c.folder == f for c in cases) for f in FOLDERS}
    assert counts == {"node": 1884, "simple": 23, "pytorch-converted": 82, "pytorch-operator": 35, "real": 9}


def test_cpu_passes_all_but_the_listed_cases(results):
    _, res = results
    excl = load_exclusions()
    summary = Summary(res)
    print("\n" + summary.table())
    unexpected = [f"{r.id}: {r.status}: {r.message.splitlines()[0] if r.message else ''}"[:300]
                  for r in res if not r.passed and r.id not in excl]
    stale = [r.id for r in res if r.passed and r.id in excl]
    assert not unexpected, f"{len(unexpected)} failing case(s) not in exclusions.txt:\n" + "\n".join(unexpected)
    assert not stale, f"excluded case(s) that now pass (remove them from exclusions.txt): {stale}"
    assert summary.passed >= FLOOR, f"{summary.passed} of {len(res)} passed; the floor is {FLOOR}"


def test_exclusions_name_real_cases_with_reasons():
    ids = {c.id for c in load_cases()}
    excl = load_exclusions()
    assert len(excl) <= len(ids) - FLOOR
    assert not [k for k in excl if k not in ids]
    assert all(len(v) > 10 for v in excl.values())
