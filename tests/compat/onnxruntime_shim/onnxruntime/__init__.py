"""``import onnxruntime`` resolved to runtime_core, for running third-party test suites
(skl2onnx, onnxmltools) unchanged against runtime-core: put the folder holding this package
first on ``PYTHONPATH``. Test-only; never installed."""

from runtime_core import *  # noqa: F403 - the shim is runtime_core under onnxruntime's name
from runtime_core import (  # noqa: F401
    ExecutionMode,
    GraphOptimizationLevel,
    InferenceSession,
    IOBinding,
    ModelMetadata,
    NodeArg,
    OrtValue,
    RunOptions,
    SessionIOBinding,
    SessionOptions,
    get_all_providers,
    get_available_providers,
    get_device,
)

from . import capi  # noqa: F401

#: the onnxruntime API level runtime_core follows; suites gate tests on this version, so they
#: pick the same tests as with the onnxruntime it is compared against
__version__ = "1.32.0"
