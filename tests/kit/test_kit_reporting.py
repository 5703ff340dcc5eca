"""The kit's per-op tolerances, where a failing case's files are, and why cases were not run."""

from __future__ import annotations

import pytest

from kit_helpers import CASES
from runtime_core.testing import ConformanceFailure, ConformanceKit
from runtime_core.testing.compare import DEFAULT_TOLERANCES, parse_tolerance, tolerances_for_ops
from runtime_core.testing.kit import FAILED, FULL, PASSED
from runtime_core.testing.plugin import cli_settings


def test_op_tolerances_loosen_only_cases_with_that_op():
    ops = {("", "DFT"), ("", "Mul")}
    table = tolerances_for_ops(None, {"DFT": (1e-3, 5e-4)}, ops)
    assert table["float32"] == (1e-3, 5e-4) and table["float64"] == (1e-3, 5e-4)
    assert table["float16"] == DEFAULT_TOLERANCES["float16"]  # already looser: kept
    assert tolerances_for_ops(None, {"DFT": (1e-3, 5e-4)}, {("", "Mul")})["float32"] == DEFAULT_TOLERANCES["float32"]
    other = tolerances_for_ops(None, {"com.microsoft::Attention": (0.1, 0.1)}, {("com.microsoft", "Attention")})
    assert other["float32"] == (0.1, 0.1)


def test_the_tolerance_option_parses_and_refuses_nonsense():
    assert parse_tolerance("DFT=1e-3,2e-4") == ("DFT", (1e-3, 2e-4))
    for bad in ("DFT", "DFT=1e-3", "=1,2", "DFT=a,b", "DFT=-1,0"):
        with pytest.raises(ValueError, match="OP=RTOL,ATOL|>= 0"):
            parse_tolerance(bad)

    class Config:
        def __init__(self, tol):
            self.opts = {"--runtime-provider-tolerance": tol}

        def getoption(self, name, default=None):
            return self.opts.get(name, default)

    got = cli_settings(Config(["DFT=1e-3,1e-4", "float32=1e-3,1e-5"]))
    assert got["op_tolerances"] == {"DFT": (1e-3, 1e-4)} and got["tolerances"] == {"float32": (1e-3, 1e-5)}
    with pytest.raises(pytest.UsageError, match="--runtime-provider-tolerance"):
        cli_settings(Config(["DFT=1e-3"]))


def test_a_failing_case_says_where_its_model_and_data_are(kit_site):
    k = ConformanceKit("kitwrong", pattern=r"^node/test_add$")
    (e,) = k.claimed_cases()
    with pytest.raises(ConformanceFailure) as info:
        k.check_case(e)
    msg = str(info.value)
    assert str(e.case.model_path) in msg and str(e.case.data_dirs[0]) in msg, msg
    assert (e.case.model_path).is_file()
    assert k.results[FULL][e.id].location in k.summary()


def test_an_op_tolerance_is_applied_to_the_cases_with_that_op(kit_site):
    # kitwrong's Add computes a - b: off by 2b, which only an absurd tolerance forgives
    k = ConformanceKit("kitwrong", pattern=r"^node/test_(add|mul)$", op_tolerances={"Add": (0.0, 1e3)})
    results = {e.name: k.run_case(e).outcome for e in k.claimed_cases()}
    assert results == {"test_add": PASSED, "test_mul": PASSED}
    strict = ConformanceKit("kitwrong", pattern=r"^node/test_add$", op_tolerances={"Mul": (0.0, 1e3)})
    assert [strict.run_case(e).outcome for e in strict.claimed_cases()] == [FAILED]


def test_the_summary_explains_every_case_not_run(kit_site):
    k = ConformanceKit("kitgood", pattern=CASES)
    scan = k.scan()
    full = [e for e in scan if e.full]
    full[0].random = "r (RandomUniformLike)"  # as if its result were random: it is not run
    for e in k.claimed_cases() + k.partial_cases():
        k.run_case(e)
    summary = k.summary()
    assert f"claimed cases: {len(full) - 1} run" in summary
    assert f"(of {len(full)} fully claimed case(s), not run: 1 with random results" in summary, summary
