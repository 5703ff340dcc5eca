"""The op registry: which ONNX ops (and schema versions) run on OpenCL, and how.

An op is registered with :func:`op` for the exact schema versions whose semantics it
implements, with a ``check(node) -> reason | None`` (dtype, attribute and shape
conditions) and a ``build(node, ctx) -> step`` that turns the node into kernel
launches whose every size and scalar argument is fixed at compile time (only
static shapes are claimed). Kernel modules are imported by name in ``ops/__init__``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .shapes import INT32_MAX, size_of
from .tensor import OpenCLTensor

F32 = np.dtype(np.float32)
BOOL = np.dtype(bool)
INT64 = np.dtype(np.int64)
FLOAT_ONLY = (F32,)
DATA = (F32, BOOL)  # dtypes that layout ops (views, copies) move


@dataclass
class OpSpec:
    op_type: str
    versions: tuple[int, ...]
    check: Callable
    build: Callable
    out_dtypes: tuple = FLOAT_ONLY


REGISTRY: dict[str, OpSpec] = {}


def op(op_type: str, *versions: int, check: Callable, out_dtypes=FLOAT_ONLY):
    """Register ``build`` for ``op_type`` at the ai.onnx schema ``versions``."""
    def deco(build):
        if op_type in REGISTRY:
            raise ValueError(f"{op_type} is registered twice")
        REGISTRY[op_type] = OpSpec(op_type, tuple(sorted(versions)), check, build, tuple(out_dtypes))
        return build
    return deco


# -- checks ------------------------------------------------------------------------------

def _dt(vi) -> str:
    return "unknown" if vi is None or vi.dtype is None else np.dtype(vi.dtype).name


def _dims(shape) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"


def check_value(vi, what: str, dtypes) -> str | None:
    """Why value ``vi`` (an input or output) cannot be a kernel operand, or None."""
    if vi is None:
        return f"{what} is missing"
    if vi.kind != "tensor":
        return f"{what} {vi.name!r} is a {vi.kind}, not a tensor"
    if vi.dtype is None:
        return f"{what} {vi.name!r} has an unknown element type"
    dt = np.dtype(vi.dtype)
    if dt not in dtypes:
        allowed = ", ".join(d.name for d in dtypes)
        extra = " (integer tensors, such as shape computations, stay on CPU)" if dt.kind in "iu" else ""
        return f"{what} {vi.name!r} is {dt.name}; OpenCL kernels here take {allowed}{extra}"
    if vi.shape is None:
        return f"{what} {vi.name!r} has an unknown shape (OpenCL kernels are compiled for static shapes)"
    if vi.static_shape is None:
        return (f"{what} {vi.name!r} has a dynamic shape {_dims(vi.shape)} "
                "(OpenCL kernels are compiled for static shapes)")
    n = size_of(vi.static_shape)
    if n == 0:
        return f"{what} {vi.name!r} is empty {vi.static_shape}"
    if n > INT32_MAX:
        return f"{what} {vi.name!r} has {n} elements, over the 2**31-1 a kernel indexes"
    return None


def check_inputs(node, dtypes=FLOAT_ONLY, indices=None) -> str | None:
    """Check the given (default: all present) inputs of ``node``."""
    idx = range(len(node.inputs)) if indices is None else indices
    for i in idx:
        if i >= len(node.inputs) or not node.inputs[i]:
            continue
        why = check_value(node.input_info[i], f"input {i}", dtypes)
        if why:
            return why
    return None


def check_outputs(node, dtypes) -> str | None:
    for i, name in enumerate(node.outputs):
        if not name:
            continue
        why = check_value(node.output_info[i], f"output {i}", dtypes)
        if why:
            return why
    return None


def shape(node, i: int, out: bool = False) -> tuple[int, ...]:
    """The static shape of input (or output) ``i``."""
    vi = (node.output_info if out else node.input_info)[i]
    return tuple(vi.static_shape)


def present(node, i: int) -> bool:
    return i < len(node.inputs) and bool(node.inputs[i])


# -- compiled steps --------------------------------------------------------------------

class In:
    """Placeholder for the buffer of the step's input ``i`` in a launch's arguments."""

    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i


class Out:
    """Placeholder for the buffer of the step's output ``i`` in a launch's arguments."""

    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i


@dataclass
class Launch:
    kernel: object
    global_size: tuple
    local_size: tuple | None
    args: list


@dataclass
class KernelStep:
    """Allocate the outputs, then enqueue the launches (arguments bound at compile time)."""

    node: object
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    out_specs: tuple  # ((shape, dtype), ...) per output name (None for omitted outputs)
    launches: list = field(default_factory=list)

    def run(self, env: dict, dev) -> None:
        ins = [env[n] for n in self.inputs]
        outs = [None if spec is None else OpenCLTensor.empty(spec[0], spec[1], dev)
                for spec in self.out_specs]
        for ln in self.launches:
            args = [ins[a.i].buffer if type(a) is In else outs[a.i].buffer if type(a) is Out else a
                    for a in ln.args]
            dev.launch(ln.kernel, ln.global_size, ln.local_size, args)
        for name, t in zip(self.outputs, outs):
            if name:
                env[name] = t


@dataclass
class ViewStep:
    """A metadata-only op: the output shares the input's buffer under another shape."""

    node: object
    input: str
    output: str
    shape: tuple

    def run(self, env: dict, dev) -> None:
        env[self.output] = env[self.input].view(self.shape)


@dataclass
class ConstStep:
    """An output known at compile time (uploaded once), e.g. Shape of a static tensor."""

    node: object
    output: str
    tensor: OpenCLTensor

    def run(self, env: dict, dev) -> None:
        env[self.output] = self.tensor


class BuildContext:
    """What a builder may use: the device, kernels, and compile-time constants."""

    def __init__(self, dev, constants):
        self.dev = dev
        self.constants = constants

    def kernel(self, filename: str, name: str):
        return self.dev.kernel(filename, name)

    def upload(self, array) -> object:
        """A read-only device buffer holding ``array`` (index tables, per-node metadata)."""
        arr = np.ascontiguousarray(array)
        return self.dev.buffer(arr.nbytes, hostbuf=arr)

    def const(self, node, i: int):
        """The host value of input ``i`` when it is known at compile time, else None."""
        if not present(node, i):
            return None
        name = node.inputs[i]
        if name in self.constants:
            return np.asarray(self.constants[name])
        vi = node.input_info[i]
        return None if vi is None or vi.const is None else np.asarray(vi.const)

    def grid_1d(self, n: int):
        """(global, local) sizes covering ``n`` work-items in work-groups of the device's size."""
        ls = self.dev.local_1d
        return ((n + ls - 1) // ls * ls,), (ls,)

    def out_specs(self, node):
        specs = []
        for i, name in enumerate(node.outputs):
            if not name:
                specs.append(None)
                continue
            vi = node.output_info[i]
            specs.append((tuple(vi.static_shape), np.dtype(vi.dtype)))
        return tuple(specs)

    def step(self, node, launches, inputs=None) -> KernelStep:
        ins = tuple(n for n in node.inputs if n) if inputs is None else tuple(inputs)
        return KernelStep(node, ins, tuple(node.outputs), self.out_specs(node), launches)
