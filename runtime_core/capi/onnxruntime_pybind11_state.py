"""onnxruntime's exception classes (``onnxruntime.capi.onnxruntime_pybind11_state``).

A script written for onnxruntime catches these (``except InvalidArgument``); every typed
error of :mod:`runtime_core.errors` subclasses the one onnxruntime raises in the same
situation, so such handlers keep working. This module imports nothing from runtime_core
(:mod:`runtime_core.errors` imports it).
"""

from __future__ import annotations

__all__ = [
    "EPFail",
    "EngineError",
    "Fail",
    "InvalidArgument",
    "InvalidGraph",
    "InvalidProtobuf",
    "ModelLoaded",
    "NoModel",
    "NoSuchFile",
    "NotImplemented",
    "RuntimeException",
]


class Fail(Exception):
    """onnxruntime's FAIL status: a generic failure (a kernel that failed, a model it refuses)."""


class InvalidArgument(Exception):
    """onnxruntime's INVALID_ARGUMENT status: a feed, output name or option is wrong."""


class NoSuchFile(Exception):
    """onnxruntime's NO_SUCHFILE status: the model file does not exist."""


class NoModel(Exception):
    """onnxruntime's NO_MODEL status: no model was loaded."""


class EngineError(Exception):
    """onnxruntime's ENGINE_ERROR status: an execution provider failed."""


class RuntimeException(Exception):
    """onnxruntime's RUNTIME_EXCEPTION status: an error while running."""


class InvalidProtobuf(Exception):
    """onnxruntime's INVALID_PROTOBUF status: the bytes are not an ONNX protobuf."""


class ModelLoaded(Exception):
    """onnxruntime's MODEL_LOADED status: a model is already loaded."""


class NotImplemented(Exception):  # noqa: A001 - onnxruntime's name
    """onnxruntime's NOT_IMPLEMENTED status: no kernel or provider can run a node."""


class InvalidGraph(Exception):
    """onnxruntime's INVALID_GRAPH status: the model's graph is invalid."""


class EPFail(Exception):
    """onnxruntime's EP_FAIL status: an execution provider refused or failed."""
