"""The runtime-core conformance kit on the numexpr provider, with every op it has switched on."""

from runtime_core.testing.suite import ProviderConformance


class TestNumexprConformance(ProviderConformance):
    """Discovery, probe, capability, every claimed ONNX node case, fallback, threads, copies."""

    provider = "numexpr"
    # the node cases are tiny and numexpr here may lack VML: claim everything it implements
    options = {"min_elements": "0", "transcendentals": "always"}
