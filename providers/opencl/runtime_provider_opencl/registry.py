"""The op registry: which ONNX ops (and schema versions) run on OpenCL, and how.

An op is registered with :func:`op` for the exact schema versions whose semantics it
implements, with

* ``check(node) -> reason | None``: dtype, attribute and shape conditions. It is asked
  at capability time, when dims may be symbolic (then only what does not depend on the
  dims is checked: :func:`is_static` tells), and again, with concrete shapes, when the
  executable specializes the partition for the shapes of a run;
* ``infer(node) -> [output shapes]``: the output shapes of a node whose inputs are
  static (``input_info`` with concrete shapes, ``const`` set for host-known values);
* ``build(node, ctx) -> step``: kernel launches whose every size and scalar argument is
  fixed, for one concrete specialization;
* ``value_inputs``: indices of inputs read on the host as values (Reshape's shape,
  Slice's starts, ...): constants, values computed by a CPU partition (they arrive as
  small device tensors with a host mirror), or the output of a claimed Shape.

Kernel modules are imported by name in ``ops/__init__``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .shapes import INT32_MAX, size_of
from .tensor import OpenCLTensor

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
BOOL = np.dtype(bool)
INT64 = np.dtype(np.int64)
INT32 = np.dtype(np.int32)
FLOAT_ONLY = (F32, F16)  # float16 is claimed only on devices with cl_khr_fp16 (see plugin)
DATA = (F32, F16, BOOL)  # dtypes that layout ops (views, copies) move
INDEX = (INT64, INT32)


@dataclass
class OpSpec:
    op_type: str
    versions: tuple[int, ...]
    check: Callable
    build: Callable
    out_dtypes: tuple = FLOAT_ONLY
    infer: Callable | None = None
    value_inputs: Callable | tuple = ()

    def values_of(self, node) -> tuple[int, ...]:
        """Indices of ``node``'s inputs that are read on the host as values."""
        v = self.value_inputs(node) if callable(self.value_inputs) else self.value_inputs
        return tuple(i for i in v if present(node, i))


REGISTRY: dict[str, OpSpec] = {}


def same_shape(node):
    """``infer`` of ops whose outputs all have input 0's shape."""
    return [shape(node, 0)] * len(node.outputs)


def op(op_type: str, *versions: int, check: Callable, out_dtypes=FLOAT_ONLY, infer=same_shape,
       value_inputs=()):
    """Register ``build`` for ``op_type`` at the ai.onnx schema ``versions``."""
    def deco(build):
        if op_type in REGISTRY:
            raise ValueError(f"{op_type} is registered twice")
        REGISTRY[op_type] = OpSpec(op_type, tuple(sorted(versions)), check, build, tuple(out_dtypes),
                                   infer, value_inputs)
        return build
    return deco


def is_static(node) -> bool:
    """Whether every present input and output of ``node`` has a static shape."""
    for vi in tuple(node.input_info) + tuple(node.output_info):
        if vi is not None and vi.static_shape is None:
            return False
    return True


def rank(node, i: int) -> int:
    return len(node.input_info[i].shape)


def host_value(node, i: int):
    """The host value of input ``i`` when known (constant, or fed at specialization), else None."""
    if not present(node, i):
        return None
    vi = node.input_info[i]
    return None if vi is None or vi.const is None else np.asarray(vi.const)


# -- checks ------------------------------------------------------------------------------

def _dt(vi) -> str:
    return "unknown" if vi is None or vi.dtype is None else np.dtype(vi.dtype).name


def _dims(shape) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"


def check_value(vi, what: str, dtypes, output: bool = False, any_rank: bool = False) -> str | None:
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
        if output or any_rank:  # computed / known when the executable specializes for a run's shapes
            return None
        return (f"{what} {vi.name!r} has an unknown shape, not even its rank (kernels are "
                "specialized per run for symbolic dims, but need the rank)")
    if vi.static_shape is None:  # symbolic dims: specialized at run time
        return None
    n = size_of(vi.static_shape)
    if n == 0:
        return f"{what} {vi.name!r} is empty {vi.static_shape}"
    if n > INT32_MAX:
        return f"{what} {vi.name!r} has {n} elements, over the 2**31-1 a kernel indexes"
    return None


def check_inputs(node, dtypes=FLOAT_ONLY, indices=None, any_rank: bool = False) -> str | None:
    """Check the given (default: all present) inputs of ``node``; ``any_rank``: the op works
    on inputs of any rank (elementwise), so an unknown rank is fine (known at run time)."""
    idx = range(len(node.inputs)) if indices is None else indices
    for i in idx:
        if i >= len(node.inputs) or not node.inputs[i]:
            continue
        why = check_value(node.input_info[i], f"input {i}", dtypes, any_rank=any_rank)
        if why:
            return why
    return None


def check_outputs(node, dtypes) -> str | None:
    for i, name in enumerate(node.outputs):
        if not name:
            continue
        why = check_value(node.output_info[i], f"output {i}", dtypes, output=True)
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
    value: np.ndarray | None = None  # the host value (a shape), for the nodes that read it

    def run(self, env: dict, dev) -> None:
        env[self.output] = self.tensor


@dataclass
class HostStep:
    """A claimed node whose run-time shapes fail its kernel's conditions (an empty tensor,
    say): it runs through the CPU provider's kernel on copies, so the semantics stay the
    CPU provider's. Counted in ``OpenCLExecutable.host_fallbacks`` and logged."""

    node: object
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    executable: object

    def run(self, env: dict, dev) -> None:
        ins = [None if not n else env[n].numpy() for n in self.inputs]
        outs = self.executable.run([a for a in ins if a is not None])
        for name, arr in zip([o for o in self.outputs if o], outs):
            env[name] = OpenCLTensor.from_numpy(np.asarray(arr), dev)


class BuildContext:
    """What a builder may use: the device, kernels, and compile-time constants."""

    def __init__(self, dev, constants):
        self.dev = dev
        self.constants = constants

    def kernel(self, filename: str, name: str, dtype=None):
        """Kernel ``name`` of ``kernels/<filename>``, built for ``dtype`` (float32 or float16)."""
        half = dtype is not None and np.dtype(dtype) == F16
        return self.dev.kernel(filename, name, "half" if half else "float")

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
        specs = self.out_specs(node)
        dtypes = {n: vi.dtype for n, vi in zip(node.inputs, node.input_info) if n and vi is not None}
        for ln in launches:
            self._check_element_sizes(node, ln, [dtypes.get(n) for n in ins], specs)
        return KernelStep(node, ins, tuple(node.outputs), specs, launches)

    def _check_element_sizes(self, node, launch, in_dtypes, out_specs) -> None:
        """Every tensor bound to a kernel's pointer argument has the element size the kernel
        reads or writes: a kernel writing 4-byte elements into a 1-byte bool buffer would
        write past it (and past the heap chunk it lives in, on a CPU device)."""
        sizes = self.dev.arg_element_sizes(launch.kernel) if hasattr(self.dev, "arg_element_sizes") else None
        if sizes is None:
            return
        for j, a in enumerate(launch.args):
            if type(a) is In:
                what, dt = f"input {a.i}", in_dtypes[a.i]
            elif type(a) is Out:
                what, dt = f"output {a.i}", None if out_specs[a.i] is None else out_specs[a.i][1]
            else:
                continue
            if dt is None or j >= len(sizes) or sizes[j] is None:
                continue
            if np.dtype(dt).itemsize != sizes[j]:
                raise TypeError(f"kernel {launch.kernel.function_name} argument {j} has {sizes[j]}-byte elements "
                                f"but is bound to {node.op_type} {what} of dtype {np.dtype(dt).name} "
                                f"({np.dtype(dt).itemsize} bytes)")
