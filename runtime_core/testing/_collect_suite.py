"""Collected by ``pytest --runtime-provider NAME``: the conformance suite for that provider."""

from runtime_core.testing.suite import ProviderConformance


class TestRuntimeProvider(ProviderConformance):
    """The kit on the provider named by ``--runtime-provider``."""

