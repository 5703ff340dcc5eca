"""onnxruntime's exception classes, as suites import them: runtime_core's own module of them
where it has one (its typed errors subclass them), else runtime_core's errors mapped by name."""

try:
    from runtime_core.capi.onnxruntime_pybind11_state import *  # noqa: F403
except ImportError:  # a runtime_core without onnxruntime's exception classes
    from runtime_core.errors import (
        ExecutionError,
        InvalidArgumentError,
        InvalidModelError,
        ModelLoadError,
        PartitionError,
        RuntimeCoreError,
    )

    Fail = RuntimeCoreError  # onnxruntime's catch-all status
    InvalidArgument = InvalidArgumentError
    InvalidGraph = InvalidModelError
    InvalidProtobuf = ModelLoadError
    NoSuchFile = ModelLoadError
    NotImplemented = PartitionError
    RuntimeException = ExecutionError
    EPFail = RuntimeCoreError
