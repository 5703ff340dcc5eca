"""Typed errors raised by runtime-core.

Every error the runtime raises on purpose derives from :class:`RuntimeCoreError`.
Errors that describe bad arguments also derive from the matching builtin
(``ValueError``, ``TypeError``, ``KeyError``) so that generic handlers keep working.
Each message names the thing, what was expected, what was received, and, where
there are alternatives, lists them.

Each also derives from the exception class onnxruntime raises in the same situation
(:mod:`runtime_core.capi.onnxruntime_pybind11_state`), so that an onnxruntime script's
``except InvalidArgument`` or ``except Fail`` keeps catching it.
"""

from __future__ import annotations

from .capi import onnxruntime_pybind11_state as _ort

__all__ = [
    "RuntimeCoreError",
    "ModelLoadError",
    "InvalidModelError",
    "UnsupportedModelError",
    "ExternalDataError",
    "ModelFileNotFoundError",
    "InvalidProtobufError",
    "ModelTypeError",
    "InvalidArgumentError",
    "InputError",
    "InputNameError",
    "MissingInputError",
    "InputTypeError",
    "InputShapeError",
    "InputTooLargeError",
    "OutputNameError",
    "ProviderError",
    "UnknownProviderError",
    "ProviderUnavailableError",
    "ProviderOptionsError",
    "FallbackRefusedError",
    "UnsupportedDeviceOperationError",
    "PluginError",
    "PartitionError",
    "ExecutionError",
    "RunTerminatedError",
    "OutOfMemoryError",
]


class RuntimeCoreError(Exception):
    """Base class of every error that runtime-core raises on purpose."""


class ModelLoadError(RuntimeCoreError, _ort.Fail):
    """The model could not be read (file missing, not a protobuf, ...)."""


class InvalidModelError(ModelLoadError, ValueError, _ort.InvalidGraph, _ort.InvalidArgument):
    """The model was read but is not a valid ONNX model (checker failure, cycles, ...).

    onnxruntime raises Fail, InvalidGraph or InvalidArgument for invalid models, depending on
    the defect; this class is all three so that any of those handlers catches it."""


class UnsupportedModelError(ModelLoadError):
    """The model is valid ONNX but uses an IR version or opset outside the supported range."""


class ModelFileNotFoundError(ModelLoadError, _ort.NoSuchFile):
    """The model path does not exist (onnxruntime: NoSuchFile)."""


class InvalidProtobufError(InvalidModelError, _ort.InvalidProtobuf):
    """The model's bytes are not an ONNX protobuf (onnxruntime: InvalidProtobuf)."""


class ModelTypeError(InvalidModelError):
    """A node's output type contradicts the type the graph declares for that value
    (onnxruntime refuses such a model at session creation with Fail)."""


class ExternalDataError(ModelLoadError):
    """External tensor data refers to a location outside the model's folder, or is unsafe."""


class InvalidArgumentError(RuntimeCoreError, ValueError, _ort.InvalidArgument):
    """An argument of a public call is malformed."""


class InputError(InvalidArgumentError):
    """Base class of errors about the feeds passed to ``run``."""


class InputNameError(InputError, KeyError):
    """A feed names an input the model does not have."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class MissingInputError(InputError):
    """A required model input was not fed."""


class InputTypeError(InputError, TypeError):
    """A feed has the wrong element type (or is not a tensor at all)."""


class InputShapeError(InputError):
    """A feed has the wrong rank or a dimension that contradicts the model."""


class InputTooLargeError(InputError, MemoryError):
    """A feed would have to be copied (a broadcast or strided view, another byte order) into
    more memory than the session's tensor-size cap allows."""


class OutputNameError(InvalidArgumentError, KeyError):
    """``run`` asked for an output the model does not have."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ProviderError(RuntimeCoreError, _ort.EPFail):
    """Base class of errors about execution providers."""


class UnknownProviderError(ProviderError, ValueError, RuntimeError):
    """A provider name that no installed plugin registers."""


class ProviderUnavailableError(ProviderError):
    """A provider is installed but cannot run here (no device, missing library, ...)."""


class ProviderOptionsError(ProviderError, ValueError):
    """Provider options that the provider rejects."""


class FallbackRefusedError(ProviderError):
    """``session.disable_cpu_ep_fallback=1`` is set and the session would fall back."""


class UnsupportedDeviceOperationError(ProviderError, NotImplementedError):
    """A provider declines an operation on its device memory (DLPack, raw pointers,
    writing in place); the message names the provider and gives its reason."""


class PluginError(ProviderError):
    """A plugin broke a rule of the plugin contract."""


class PartitionError(RuntimeCoreError, _ort.NotImplemented, _ort.Fail):
    """The graph could not be partitioned (for example, a node nobody can run)."""


class ExecutionError(RuntimeCoreError, RuntimeError, _ort.Fail, _ort.RuntimeException):
    """A kernel failed while running; the message names the node and its provider."""


class RunTerminatedError(ExecutionError):
    """A run ended early because its ``RunOptions.terminate`` was set (before or during it);
    the session is unchanged and later runs work as before."""


class OutOfMemoryError(ExecutionError, MemoryError):
    """A tensor would exceed the session's size cap (config entry ``session.max_tensor_bytes``)
    or memory ran out; the message names the node, the shape and the bytes. Also a
    ``MemoryError``, so generic handlers keep working."""
