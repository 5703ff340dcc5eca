"""onnxruntime's exception classes as runtime_core's: suites catch these names."""

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
NotImplemented = PartitionError  # an op nobody implements (onnxruntime: NOT_IMPLEMENTED)
RuntimeException = ExecutionError
EPFail = RuntimeCoreError
