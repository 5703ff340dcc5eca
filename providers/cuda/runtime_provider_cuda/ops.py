"""Which ops run on CUDA, with which implementation, and why the others do not.

There is one implementation of each op's semantics:

* :data:`FAST` ops have a CUDA fast path in :mod:`runtime_provider_cuda.kernels`;
* :data:`GENERIC` ops reuse the CPU provider's kernel function unchanged: those kernels
  are array-module generic (they only call numpy functions that dispatch to cupy for
  cupy arrays through NEP 13/18, and never create host arrays from scratch). The list
  holds exactly the ops whose CPU kernels pass the genericity test of
  ``tests/providers/cuda/test_generic_kernels.py`` (numpy stand-in for cupy, the ONNX
  backend node cases as inputs); an op is added only with that test passing;
* :data:`HOST_RESULT` ops read only metadata of a device tensor (its shape) and return
  a small host result, uploaded to the device;
* everything else is declined with ``"no CUDA kernel; runs on the CPU provider"``.

Inputs listed in :data:`HOST_INPUTS` are parameters a kernel reads on the host (shapes,
axes, pads, ...); they are given to the kernel as numpy arrays (a constant's host copy, or
a device value copied back).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import kernels as K

NO_KERNEL = "no CUDA kernel; runs on the CPU provider"

#: dtypes a cupy array can hold
CUDA_DTYPES = frozenset({"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                         "uint64", "float16", "float32", "float64", "complex64", "complex128"})


@dataclass(frozen=True)
class FastPath:
    fn: Callable
    versions: tuple
    dtypes: tuple = K.FLOATS


FAST: dict[str, FastPath] = {
    "MatMul": FastPath(K.matmul, (1, 9, 13)),
    "Gemm": FastPath(K.gemm, (7, 9, 11, 13)),
    "Conv": FastPath(K.conv, (1, 11, 22)),
    "Softmax": FastPath(K.softmax_13, (13,)),
    "LogSoftmax": FastPath(K.log_softmax_13, (13,)),
    "LayerNormalization": FastPath(K.layer_norm, (17,)),
    "Erf": FastPath(K.erf_op, (9, 13)),
    "Gelu": FastPath(K.gelu, (20,)),
}
#: Softmax / LogSoftmax before opset 13 (2-D coercion)
FAST_OLD = {("Softmax", 1): K.softmax_1, ("Softmax", 11): K.softmax_1,
            ("LogSoftmax", 1): K.log_softmax_1, ("LogSoftmax", 11): K.log_softmax_1}

#: ops whose CPU kernels are array-module generic (see the module docstring)
GENERIC = frozenset({
    "Abs", "Acos", "Acosh", "Add", "And", "Asin", "Asinh", "Atan", "Atanh",
    "BatchNormalization", "BitShift", "BitwiseAnd", "BitwiseNot", "BitwiseOr", "BitwiseXor",
    "Cast", "CastLike", "Ceil", "Celu", "Clip", "Concat", "Cos", "Cosh", "DeformConv",
    "DepthToSpace", "DequantizeLinear", "Div", "Elu", "Equal", "Exp", "Expand", "Flatten",
    "Floor", "GlobalAveragePool", "GlobalMaxPool", "Greater", "GreaterOrEqual", "GridSample",
    "GroupNormalization", "HardSigmoid", "HardSwish", "Hardmax", "Identity",
    "InstanceNormalization", "IsInf", "IsNaN", "LRN", "LeakyRelu", "Less", "LessOrEqual",
    "Log", "LpNormalization", "MatMulInteger", "MeanVarianceNormalization", "Mish", "Mod",
    "Mul", "Neg", "Not", "Or", "PRelu", "Pow", "QLinearConv", "QLinearMatMul",
    "QuantizeLinear", "RMSNormalization", "Reciprocal", "Relu", "Reshape", "Resize", "Round",
    "Selu", "Shrink", "Sign", "Sin", "Sinh", "Slice", "Softplus", "Softsign", "SpaceToDepth",
    "Split", "Sqrt", "Squeeze", "Sub", "SwiGLU", "Tan", "Tanh", "ThresholdedRelu", "Tile",
    "TopK", "Transpose", "Trilu", "Unsqueeze", "Upsample", "Where", "Xor",
})

HOST_RESULT = frozenset({"Shape", "Size"})

#: op -> indices of inputs read on the host
HOST_INPUTS = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Squeeze": (1,),
    "Unsqueeze": (1,), "Pad": (1, 3), "Split": (1,), "TopK": (1,), "CumSum": (1,),
    "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,),
    "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSum": (1,), "ReduceLogSumExp": (1,),
    "ReduceSumSquare": (1,), "OneHot": (1,), "Trilu": (1,), "CenterCropPad": (1,),
    "Resize": (1, 2, 3), "Upsample": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2),
}


def fast_path(node):
    """The fast path for ``node`` (``None`` when it has none for this version/dtype)."""
    old = FAST_OLD.get((node.op_type, node.since_version))
    dt = _first_dtype(node)
    if old is not None:
        return old if dt in K.FLOATS else None
    fp = FAST.get(node.op_type)
    if fp is None or node.since_version not in fp.versions:
        return None
    return fp.fn if dt in fp.dtypes else None


def _first_dtype(node) -> str | None:
    info = node.input_info[0] if node.input_info else None
    return None if info is None or info.dtype is None else np.dtype(info.dtype).name


def dtype_reason(node) -> str | None:
    """Why the node's values cannot live in cupy arrays (``None`` when they can)."""
    for vi in tuple(node.input_info) + tuple(node.output_info):
        if vi is None:
            continue
        if vi.kind != "tensor":
            return f"{vi.kind} value {vi.name!r} is not a tensor; sequences, maps and optionals stay on CPU"
        if vi.dtype is not None and np.dtype(vi.dtype).name not in CUDA_DTYPES:
            return (f"value {vi.name!r} is {np.dtype(vi.dtype).name}, which cupy arrays cannot hold "
                    f"(CUDA dtypes: {', '.join(sorted(CUDA_DTYPES))})")
    return None


def implementation(node):
    """``(kind, fn)`` for a claimed node: ``("fast", fn)``, ``("generic", cpu_fn)`` or
    ``("host-result", cpu_fn)``; ``None`` when CUDA has nothing for it."""
    fn = fast_path(node)
    if fn is not None:
        return "fast", fn
    if node.op_type in GENERIC or node.op_type in HOST_RESULT:
        from runtime_provider_cpu.api import kernel_for  # the CPU provider's documented API

        spec = kernel_for(node.domain, node.op_type, node.since_version)
        if spec is None or spec.control:
            return None
        return ("generic" if node.op_type in GENERIC else "host-result"), spec.fn
    return None


def decline_reason(node) -> str | None:
    """Why CUDA does not run ``node`` (``None`` when it does)."""
    dom = node.domain or "ai.onnx"
    if node.domain not in ("", "ai.onnx"):
        return f"{dom}::{node.op_type}: {NO_KERNEL}"
    if node.op_type not in FAST and node.op_type not in GENERIC and node.op_type not in HOST_RESULT:
        return f"{node.op_type}: {NO_KERNEL}"
    from runtime_provider_cpu.api import decline_reason as cpu_decline  # the CPU provider's documented API

    why = cpu_decline(node)  # the semantics (versions, attributes) are the CPU provider's
    if why:
        return f"{why} (CUDA shares the CPU provider's op semantics)"
    why = dtype_reason(node)
    if why:
        return why
    if implementation(node) is None:
        fp = FAST.get(node.op_type)
        dt = _first_dtype(node)
        if fp is not None and dt not in fp.dtypes:
            return (f"{node.op_type} on {dt} has no CUDA kernel (CUDA: {', '.join(fp.dtypes)}); "
                    "runs on the CPU provider")
        return f"{node.op_type}-{node.since_version}: {NO_KERNEL}"
    return None
