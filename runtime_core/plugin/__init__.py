"""The one import surface for provider authors.

Everything a provider needs is importable from here; nothing else in
``runtime_core`` is plugin API. See ``docs/architecture.md`` for the contract.
"""

from .contract import (
    Capability,
    GraphBody,
    GraphView,
    NodeView,
    Partition,
    ProbeResult,
    SessionSettings,
    ValueInfo,
)
from .hookspecs import hookspec
from .provider import ExecutionProvider
from .registry import (
    API_VERSION,
    ENTRY_POINT_GROUP,
    ProviderRecord,
    ProviderRegistrar,
    get_registry,
    hookimpl,
    reload_plugins,
)

__all__ = [
    "API_VERSION",
    "ENTRY_POINT_GROUP",
    "Capability",
    "ExecutionProvider",
    "GraphBody",
    "GraphView",
    "NodeView",
    "Partition",
    "ProbeResult",
    "ProviderRecord",
    "ProviderRegistrar",
    "SessionSettings",
    "ValueInfo",
    "get_registry",
    "hookimpl",
    "hookspec",
    "reload_plugins",
]
