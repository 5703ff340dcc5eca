"""runtime-core: an ONNX runtime whose hardware back ends are pip-installed providers.

A drop-in for ONNX Runtime's Python API::

    import runtime_core as ort
    sess = ort.InferenceSession("model.onnx", providers=["cuda", "cpu"])
    outputs = sess.run(None, {"x": x})
"""

from __future__ import annotations

from . import errors
from ._version import __version__
from .session import (
    ExecutionMode,
    GraphOptimizationLevel,
    InferenceSession,
    ModelMetadata,
    NodeArg,
    ProviderFallbackWarning,
    RunOptions,
    SessionOptions,
)
from .session.iobinding import IOBinding, SessionIOBinding
from .session.ortvalue import OrtValue

__all__ = [
    "ExecutionMode",
    "GraphOptimizationLevel",
    "IOBinding",
    "InferenceSession",
    "ModelMetadata",
    "NodeArg",
    "OrtValue",
    "ProviderFallbackWarning",
    "RunOptions",
    "SessionIOBinding",
    "SessionOptions",
    "__version__",
    "errors",
    "get_all_providers",
    "get_available_providers",
    "get_device",
    "get_provider_info",
]


def get_available_providers() -> list[str]:
    """Names of providers usable now, in priority order; always ends with ``CPUExecutionProvider``."""
    from .plugin.registry import get_registry

    names = [r.name for r in get_registry().loaded() if r.available]
    if "CPUExecutionProvider" not in names:
        names.append("CPUExecutionProvider")
    return names


def get_all_providers() -> list[str]:
    """Names of every installed provider that registered, available or not."""
    from .plugin.registry import get_registry

    return [r.name for r in get_registry().loaded()]


def get_provider_info() -> list[dict]:
    """One dict per installed provider *and* per broken plugin.

    Keys: ``name``, ``alias``, ``distribution``, ``version``, ``plugin_api``,
    ``available``, ``reason``, ``status`` (``loaded`` or why loading failed),
    ``devices``, ``entry_point``.
    """
    from .plugin.registry import get_registry

    return [r.to_dict() for r in get_registry().records]


def get_device() -> str:
    """ORT compatibility: the default device of this build (``"CPU"``)."""
    return "CPU"
