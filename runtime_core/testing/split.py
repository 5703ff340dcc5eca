"""A helper provider of the kit: takes the nodes it is told to, and runs them on the host.

Registered only while the kit runs (never through an installed entry point), ahead
of the provider under test, so that provider sees what it sees in a real session
with a higher-priority provider: a view with some nodes already taken, and values
that arrive from, and leave to, another provider through host copies. The nodes
it takes are named by the provider option ``claim`` (comma-separated node names);
it runs them with the registered CPU provider (its ``get_capability`` and ``compile``).
"""

from __future__ import annotations

from importlib import metadata

from ..plugin.contract import Capability, ProbeResult
from ..plugin.provider import ExecutionProvider
from ..plugin.registry import ENTRY_POINT_GROUP, hookimpl

ALIAS = "kit-split"


class KitSplitExecutionProvider(ExecutionProvider):
    """Claims exactly the nodes named in the option ``claim`` and runs them on the host."""

    name = "KitSplitExecutionProvider"
    alias = ALIAS
    version = "1"
    distribution = "runtime-core"
    plugin_api = ">=1.0,<2"
    device_type = "cpu"

    def __init__(self, options=None):
        super().__init__(options)
        from ..plugin.registry import FALLBACK_ALIAS, get_registry

        self.claim = {n for n in str(self.options.get("claim", "")).split(",") if n}
        rec = get_registry().lookup(FALLBACK_ALIAS)  # the registered CPU provider, by its contract
        if rec is None or rec.cls is None:
            raise RuntimeError("the kit's split provider needs the CPU provider, which is not registered")
        self._cpu = rec.cls({})

    @classmethod
    def probe(cls) -> ProbeResult:
        """Always available: it runs on the host."""
        return ProbeResult(True, "", ["host"])

    def get_capability(self, graph) -> Capability:
        """Claim the nodes named in ``claim`` (one by one); decline the rest."""
        cap = Capability()
        for node in graph:
            if node.name in self.claim:
                cap.claims.append(node)
            else:
                cap.declined[node.name] = "not selected by the kit"
        return cap

    def compile(self, partition):
        """Compile with the CPU provider."""
        return self._cpu.compile(partition)


@hookimpl
def runtime_core_register_providers(registrar):
    """Register :class:`KitSplitExecutionProvider`."""
    registrar.register(KitSplitExecutionProvider)


def entry_points_with_split() -> list:
    """The installed provider entry points plus the kit's helper provider."""
    eps = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name != ALIAS]
    eps.append(metadata.EntryPoint(ALIAS, __name__, ENTRY_POINT_GROUP))
    return eps
