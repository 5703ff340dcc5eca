"""Fixtures of the CPU provider's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def spy_native(monkeypatch):
    """``spy_native(name, record)``: every call of ``_native.<name>`` made by ``ops/nn`` or
    ``ops/fused`` passes its arguments to ``record`` first (which path a session took, on how
    many threads)."""
    from runtime_provider_cpu.ops import fused, nn

    assert nn._native is not None, nn.NATIVE_ERROR  # the wheel is built with its C extension
    real = nn._native

    def spy(name, record):
        fn = getattr(real, name)

        class Spy:
            def __getattr__(self, attr):
                return getattr(real, attr)

        def call(*args):
            record(args)
            return fn(*args)

        setattr(Spy, name, staticmethod(call))
        monkeypatch.setattr(nn, "_native", Spy())
        monkeypatch.setattr(fused, "_native", Spy())

    return spy
