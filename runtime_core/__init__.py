"""runtime-core: an ONNX runtime whose hardware back ends are pip-installed providers.

A drop-in for ONNX Runtime's Python API::

    import runtime_core as ort
    sess = ort.InferenceSession("model.onnx", providers=["cuda", "cpu"])
    outputs = sess.run(None, {"x": x})
"""

from __future__ import annotations

import logging as _logging

from . import capi, errors
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
    "capi",
    "errors",
    "get_all_providers",
    "get_available_providers",
    "get_device",
    "get_provider_info",
    "set_default_logger_severity",
    "set_default_logger_verbosity",
]

#: onnxruntime's severities (0 verbose .. 4 fatal) as ``logging`` levels
_SEVERITY_LEVELS = {0: _logging.DEBUG, 1: _logging.INFO, 2: _logging.WARNING, 3: _logging.ERROR,
                    4: _logging.CRITICAL}
_VERBOSITY = [0]


def _level_arg(fn: str, level, allowed: str) -> int:
    import operator

    try:
        if isinstance(level, bool):
            raise TypeError
        return operator.index(level)
    except TypeError:
        raise errors.InvalidArgumentError(f"{fn} takes an int ({allowed}), got {level!r}") from None


def set_default_logger_severity(level: int) -> None:
    """onnxruntime's default log severity, set on the ``runtime_core`` logger: 0 verbose
    (``DEBUG``), 1 info, 2 warning (the default), 3 error, 4 fatal (``CRITICAL``)."""
    n = _level_arg("set_default_logger_severity", level, "0 verbose, 1 info, 2 warning, 3 error, 4 fatal")
    if n not in _SEVERITY_LEVELS:
        raise errors.InvalidArgumentError(
            f"set_default_logger_severity takes 0 (verbose), 1 (info), 2 (warning), 3 (error) or 4 (fatal), got {n}")
    _logging.getLogger("runtime_core").setLevel(_SEVERITY_LEVELS[n])


def set_default_logger_verbosity(level: int) -> None:
    """onnxruntime's verbose-log verbosity (>= 0). ``logging`` has no levels below ``DEBUG``,
    so a verbosity above 0 only means: log at ``DEBUG`` (severity 0) on the ``runtime_core``
    logger; 0 leaves the severity as it is."""
    n = _level_arg("set_default_logger_verbosity", level, ">= 0")
    if n < 0:
        raise errors.InvalidArgumentError(f"set_default_logger_verbosity takes an int >= 0, got {n}")
    _VERBOSITY[0] = n
    if n > 0:
        _logging.getLogger("runtime_core").setLevel(_logging.DEBUG)


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


def __getattr__(name: str):
    """``runtime_core.quantization`` is imported on first use (it is not needed to run models)."""
    if name == "quantization":
        import importlib

        return importlib.import_module(".quantization", __name__)
    raise AttributeError(f"module 'runtime_core' has no attribute {name!r}")
