"""The kit's checks, run in-process on fixture providers: the good one passes, each fault is caught.

Every fault provider breaks one rule; the tests assert that exactly the matching
check fails, with a message that names the problem, and that the others pass.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from kit_helpers import CASES
from runtime_core.plugin import API_VERSION
from runtime_core.testing import ConformanceFailure, ConformanceKit
from runtime_core.testing.kit import CHAIN, FAILED, FULL, PARTIAL, PASSED


def kit(name, **kw):
    return ConformanceKit(name, pattern=kw.pop("pattern", CASES), **kw)


def test_the_good_provider_passes_every_check(kit_site):
    k = kit("kitgood")
    assert k.run_all(), k.summary()
    names = {e.name for e in k.claimed_cases()}
    assert names == {"test_add", "test_mul", "test_relu"}
    assert {e.name for e in k.partial_cases()} == {"test_mish_expanded", "test_celu_expanded",
                                                    "test_prelu_example_expanded"}
    assert set(k.results[FULL]) == {"node/test_add", "node/test_mul", "node/test_relu"}
    assert all(r.outcome == PASSED for kind in (FULL, PARTIAL, CHAIN) for r in k.results[kind].values())
    # chains ran on the device, with copies both ways, and compared with the CPU provider
    assert {r.case for r in k.results[CHAIN].values()} == {"node/test_add", "node/test_mul", "node/test_relu"}
    assert k.copy_dtypes() == [np.dtype(np.float32)]
    summary = k.summary()
    for line in ("discovery: passed", "claimed fully: 3, partially: 3", "Add-14, Mul-14, Relu-14",
                 "claimed cases: 3 run, 3 passed, 0 failed", "partial cases (CPU fallback): 3 run, 3 passed",
                 "fallback chains: 3 run, 3 passed", "copies round-trip: 1 dtype(s) passed"):
        assert line in summary, summary


def test_partial_cases_run_with_cpu_fallback_as_claimed(kit_site):
    k = kit("kitgood", pattern=r"^node/test_mish_expanded$")
    (e,) = k.partial_cases()
    assert [n.op_type for n in e.nodes if n.name in e.claimed] == ["Mul"]
    assert k.run_case(e).outcome == PASSED


def test_wrong_results_fail_the_claimed_cases(kit_site):
    k = kit("kitwrong", pattern=r"^node/test_(add|mul)$")
    k.check_capability()
    by_name = {e.name: e for e in k.claimed_cases()}
    with pytest.raises(ConformanceFailure, match=r"(?s)test_add \(claimed\).*vs the CPU provider.*"
                                                 r"vs the case's expected output"):
        k.check_case(by_name["test_add"])
    k.check_case(by_name["test_mul"])
    assert k.results[FULL]["node/test_add"].outcome == FAILED
    assert "claimed cases: 2 run, 1 passed, 1 failed" in k.summary()


def test_a_non_convex_group_is_caught(kit_site):
    k = kit("kitnonconvex", pattern=r"^node/test_mish_expanded$")
    with pytest.raises(ConformanceFailure, match=r"group claim .* is not convex: a path leaves it and "
                                                 r"re-enters it through node .*\(Tanh\)"):
        k.check_capability()
    assert k.claimed_cases() == [] and k.partial_cases() == []


def test_declines_without_reasons_are_caught(kit_site):
    k = kit("kitsilent")
    k.check_capability()
    with pytest.raises(ConformanceFailure, match=r"declined \d+ node\(s\) without a reason.*Softplus"):
        k.check_decline_reasons()


def test_claiming_and_declining_the_same_node_is_caught(kit_site):
    k = kit("kitboth", pattern=r"^node/test_add$")
    with pytest.raises(ConformanceFailure, match="is both claimed and declined"):
        k.check_capability()


def test_a_raising_capability_is_caught(kit_site):
    k = kit("kitraises")
    with pytest.raises(ConformanceFailure, match="get_capability raised RuntimeError: capability exploded"):
        k.check_capability()


def test_unstable_answers_are_caught(kit_site):
    k = kit("kitunstable", pattern=r"^node/test_add$")
    with pytest.raises(ConformanceFailure, match="asked twice"):
        k.check_capability()


def test_claiming_nodes_that_were_not_offered_is_caught(kit_site):
    k = kit("kitstray", pattern=r"^node/test_mish_expanded$")
    with pytest.raises(ConformanceFailure, match="which were not offered"):
        k.check_capability()


def test_shared_state_between_runs_is_caught(kit_site):
    k = kit("kitracy", pattern=r"^node/test_(add|mul)$")
    for e in k.claimed_cases():  # alone, every run is right
        k.check_case(e)
    with pytest.raises(ConformanceFailure, match="differed from the single-threaded result"):
        k.check_concurrency()


def test_a_hanging_case_fails_and_the_kit_goes_on(kit_site):
    k = kit("kithangs", pattern=r"^node/test_(mul|add)$", case_timeout=0.5)
    by_name = {e.name: e for e in k.claimed_cases()}
    with pytest.raises(ConformanceFailure, match=r"test_mul \(claimed\): did not finish within 0.5 s"):
        k.check_case(by_name["test_mul"])
    k.check_case(by_name["test_add"])


def test_lossy_copies_are_caught(kit_site):
    k = kit("kitlossy", pattern=r"^node/test_add$")
    with pytest.raises(ConformanceFailure, match=r"(?s)device copies of float32 .* do not round-trip.*"
                                                 r"values changed on the way"):
        k.check_copies(np.float32)


def test_copies_of_the_good_provider_round_trip_every_dtype(kit_site):
    k = kit("kitgood")
    for dt in (np.float32, np.float64, np.int64, np.uint8, np.bool_, np.float16, object):
        k.check_copies(dt)


@pytest.mark.parametrize("name,match", [
    ("kitunavailable", "installed but unavailable here: no kit device is plugged in"),
    ("kitoldapi", r"did not load \(api-mismatch\): plugin supports plugin API >=0.1,<1, but runtime-core "
                  r"provides plugin API " + re.escape(API_VERSION)),
    ("nosuchprovider", r"no installed plugin provides 'nosuchprovider'.*Installed providers: .*KitGood"),
    ("kit-other", r"alias 'kit-other' differs from its entry-point name 'kitmisnamed'; distribution "
                  r"'someone-else' is not the installed distribution 'rt-kit-faults'"),
])
def test_discovery_failures_say_why(kit_site, name, match):
    k = kit(name)
    with pytest.raises(ConformanceFailure, match=match):
        k.check_discovery()
    assert "discovery: FAILED" in k.summary()
    assert not k.run_all()


def test_probe_is_checked(kit_site):
    kit("kitgood").check_probe()
    with pytest.raises(ConformanceFailure, match="not loaded"):
        kit("kitoldapi").check_probe()


def test_the_cpu_provider_passes_its_own_kit():
    k = ConformanceKit("cpu", pattern=r"^node/test_(add|relu|softmax_example)$")
    k.check_discovery()
    k.check_capability()
    k.check_decline_reasons()
    for e in k.claimed_cases():
        k.check_case(e)
    assert len(k.results[FULL]) >= 3
