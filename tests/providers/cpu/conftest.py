"""Fixtures of the CPU provider's tests."""

from __future__ import annotations

import os

import pytest
from oracle import cpu_policy  # noqa: F401 - the fixture, for every test here


def pytest_collection_modifyitems(config, items):
    """Tests marked ``native`` (of the compiled kernels themselves) are skipped where the
    extension is disabled on purpose (``RUNTIME_CORE_CPU_NATIVE=0``, ``nox -s nonative``); a
    build that lost it fails them instead. Every other test runs on the numpy paths there."""
    if os.environ.get("RUNTIME_CORE_CPU_NATIVE", "") != "0":
        return
    skip = pytest.mark.skip(reason="the compiled kernels are disabled (RUNTIME_CORE_CPU_NATIVE=0)")
    for item in items:
        if item.get_closest_marker("native") is not None:
            item.add_marker(skip)


@pytest.fixture
def spy_native(monkeypatch, cpu_policy):
    """``spy_native(name, record)``: every call of ``_native.<name>`` made through the CPU
    provider's policy (the nn kernels and their fast paths) or by ``ops/fused`` passes its
    arguments to ``record`` first (which path a session took, on how many threads)."""
    from runtime_provider_cpu.fast import policy
    from runtime_provider_cpu.ops import fused

    assert policy.NATIVE is not None, policy.NATIVE_ERROR  # the wheel is built with its C extension
    real = policy.NATIVE

    def spy(name, record):
        fn = getattr(real, name)

        class Spy:
            def __getattr__(self, attr):
                return getattr(real, attr)

        def call(*args):
            record(args)
            return fn(*args)

        setattr(Spy, name, staticmethod(call))
        cpu_policy(native=Spy())
        monkeypatch.setattr(fused, "_native", Spy())

    return spy


@pytest.fixture
def linear_tiles():
    """Skips a test of the compiled Linear as a session's candidate where the extension does not
    offer it: its tiles are a candidate as AVX-512 or AVX2 + FMA code only (``_native.LINEAR_TILES``;
    "baseline" on an older x86-64 CPU or under ``RUNTIME_CORE_CPU_ISA=baseline``)."""
    from runtime_provider_cpu.fast import policy

    tiles = getattr(policy.NATIVE, "LINEAR_TILES", None)
    if tiles not in ("avx512", "avx2"):
        pytest.skip(f"the compiled Linear (_native.linear) is not a candidate here (LINEAR_TILES: {tiles})")
    return tiles


@pytest.fixture(autouse=True, scope="session")
def _pool_load_rule_quiet():
    """The kernel pool's load rule (a job on its caller alone while other processes' runnable
    threads fill the cores) sees no other load here, so that the tests of the pool see its
    workers join on a busy test machine; ``test_pool_load.py`` forces the load it tests."""
    from runtime_provider_cpu.fast.policy import NATIVE

    if NATIVE is None:
        yield
        return
    on, others = NATIVE.pool_load_rule(others=0)
    yield
    NATIVE.pool_load_rule(on, others)


@pytest.fixture
def planned_alone():
    """``planned_alone(call, one)``: ``call(4)`` (a compiled kernel asked for four threads) starts
    parts of a several-thread job with the pool free, none under ``run_solo`` or with other
    processes' threads on every core (``rc_job_threads``: planned as for one thread, counted once
    as run alone for the load), and gives ``one``'s bits each time."""
    import numpy as np
    from runtime_provider_cpu import _native

    STARTED, LOAD_ALONE = 4, 10  # pool_stats(): parts of jobs asking for several threads; jobs alone for the load

    def check(call, one):
        rule = _native.pool_load_rule(False)  # the pool whatever the machine's load
        try:
            started = _native.pool_stats()[STARTED]
            np.testing.assert_array_equal(call(4), one)
            assert _native.pool_stats()[STARTED] > started
        finally:
            _native.pool_load_rule(*rule)
        before = _native.run_solo(True)
        try:
            started = _native.pool_stats()[STARTED]
            np.testing.assert_array_equal(call(4), one)
            assert _native.pool_stats()[STARTED] == started
        finally:
            _native.run_solo(before)
        rule = _native.pool_load_rule(True, len(os.sched_getaffinity(0)))  # every core taken by others
        try:
            started, alone = _native.pool_stats()[STARTED], _native.pool_stats()[LOAD_ALONE]
            np.testing.assert_array_equal(call(4), one)
            assert _native.pool_stats()[STARTED] == started
            assert _native.pool_stats()[LOAD_ALONE] == alone + 1  # once a call (the Linear's packing job too)
        finally:
            _native.pool_load_rule(*rule)

    return check
