"""A compiled partition: constants uploaded once, one step per node, specialized per shape.

Partitions may be claimed with symbolic dims (a dynamic batch, a sequence length): the
ranks and dtypes are known, the sizes are not. The executable then specializes on each
run: from the actual input tensors (and the host values of the small integer inputs that
nodes read as values: Reshape's shape, Slice's starts, ...) it propagates concrete shapes
through the partition's nodes with the ops' shape rules, re-checks every node with the
concrete shapes, builds its kernel launches (sizes, index tables) and caches the result
per input signature in a small LRU. A fully static partition is specialized once, at
compile time, exactly as before.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import OrderedDict

import numpy as np

from runtime_core.plugin import Partition, ValueInfo

from .registry import REGISTRY, BuildContext, ConstStep, HostStep, check_outputs
from .tensor import OpenCLTensor

logger = logging.getLogger("runtime_provider_opencl")

LRU_SIZE = 8  # specializations kept per executable
VALUE_LIMIT = 64  # integer partition inputs up to this size are read as values when a node needs it


class OpenCLKernelError(RuntimeError):
    """A node failed on the device; ``node_name`` and ``op_type`` name it for the core."""

    def __init__(self, message: str, node_name: str, op_type: str):
        super().__init__(message)
        self.node_name = node_name
        self.op_type = op_type


@dataclasses.dataclass
class Specialization:
    """The steps of one input signature, and the buffers they keep across runs."""

    steps: list
    kept: set
    host_fallbacks: tuple


class OpenCLExecutable:
    """Runs a partition's nodes on one device; every value stays on the device.

    ``run`` keeps all state in locals (the LRU of specializations has its own lock),
    and kernel launches go through the device context's lock, so one executable serves
    many threads.
    """

    def __init__(self, partition, dev):
        self.partition = partition
        self.dev = dev
        self.inputs = tuple(partition.inputs)
        self.outputs = tuple(partition.outputs)
        self.expected = []
        for name in self.inputs:
            vi = partition.value(name)
            self.expected.append((None if vi.shape is None else tuple(vi.shape),
                                  None if vi.dtype is None else np.dtype(vi.dtype)))
        value_inputs: set[str] = set()
        tensor_inputs: set[str] = set()
        for node in partition.nodes:
            vals = REGISTRY[node.op_type].values_of(node)
            for i, name in enumerate(node.inputs):
                if name:
                    (value_inputs if i in vals else tensor_inputs).add(name)
        # partition inputs whose host value a node needs (they join the signature)
        self._value_inputs = tuple(i for i, n in enumerate(self.inputs) if n in value_inputs)
        # constants that some kernel reads as a tensor, uploaded once (values read on the
        # host only, such as Reshape's shape, are never uploaded)
        self.constants = {}
        for name, arr in partition.constants.items():
            arr = np.asarray(arr)
            if name in tensor_inputs and arr.dtype.kind in "fbiu":
                self.constants[name] = OpenCLTensor.from_numpy(arr, dev, mirror=arr.dtype.kind in "iu")
        self.frees = self._lifetimes()
        self._lock = threading.Lock()
        self._cache: OrderedDict = OrderedDict()
        self.specializations = 0  # how many were built (tests check the cache)
        self.host_fallbacks: tuple = ()
        self.static = not self._value_inputs and all(
            shp is not None and dt is not None and all(isinstance(d, int) for d in shp)
            for shp, dt in self.expected)
        if self.static:  # build now: errors surface at session creation
            sig = tuple((s, d.str) for s, d in self.expected)
            self._cache[sig] = self._specialize([s for s, _ in self.expected],
                                                [d for _, d in self.expected], {})

    # -- planning -------------------------------------------------------------------
    def _lifetimes(self):
        keep = set(self.outputs)
        last: dict[str, int] = {}
        for idx, node in enumerate(self.partition.nodes):
            for name in node.inputs:
                if name:
                    last[name] = idx
        frees = [[] for _ in self.partition.nodes]
        for name, idx in last.items():
            if name not in keep and name not in self.constants:
                frees[idx].append(name)
        return [tuple(f) for f in frees]

    def _specialize(self, shapes, dtypes, values) -> Specialization:
        """Propagate concrete shapes through the nodes and build every node's step."""
        part = self.partition
        info: dict[str, ValueInfo] = {}
        for name, arr in part.constants.items():
            arr = np.asarray(arr)
            info[name] = ValueInfo(name, arr.dtype, tuple(arr.shape), "tensor", arr)
        for name, shape, dtype in zip(self.inputs, shapes, dtypes):
            info[name] = ValueInfo(name, dtype, tuple(shape), "tensor", values.get(name))
        ctx = BuildContext(self.dev, part.constants)
        steps, fallbacks = [], []
        for node in part.nodes:
            spec = REGISTRY[node.op_type]
            ins = tuple(info[n] if n else None for n in node.inputs)
            view = dataclasses.replace(node, input_info=ins)
            try:
                out_shapes = spec.infer(view)
            except Exception as exc:
                raise OpenCLKernelError(f"shape inference for input shapes "
                                        f"{[None if v is None else v.shape for v in ins]} failed: "
                                        f"{type(exc).__name__}: {exc}", node.name, node.op_type) from exc
            outs = []
            for i, name in enumerate(node.outputs):
                old = node.output_info[i] if i < len(node.output_info) else None
                if not name:
                    outs.append(old)
                    continue
                dt = None if old is None or old.dtype is None else np.dtype(old.dtype)
                outs.append(ValueInfo(name, dt, tuple(int(d) for d in out_shapes[i]), "tensor"))
            view = dataclasses.replace(view, output_info=tuple(outs))
            why = check_outputs(view, spec.out_dtypes) or spec.check(view)
            if why:
                step = self._host_step(view, ctx, why)
                fallbacks.append((node.name, why))
            else:
                try:
                    step = spec.build(view, ctx)
                except Exception as exc:
                    raise OpenCLKernelError(f"building the kernels for shapes "
                                            f"{[None if v is None else v.shape for v in ins]} failed: "
                                            f"{type(exc).__name__}: {exc}", node.name,
                                            node.op_type) from exc
            steps.append(step)
            for vi in outs:
                if vi is not None and vi.name:
                    info[vi.name] = vi
            if isinstance(step, ConstStep) and step.value is not None:
                info[step.output] = dataclasses.replace(info[step.output], const=step.value)
        kept = {id(t.buffer) for t in self.constants.values() if t.buffer is not None}
        kept.update(id(st.tensor.buffer) for st in steps
                    if isinstance(getattr(st, "tensor", None), OpenCLTensor) and st.tensor.buffer is not None)
        self.specializations += 1
        return Specialization(steps, kept, tuple(fallbacks))

    def _host_step(self, view, ctx, why) -> HostStep:
        """The node through the CPU provider's kernel (its run-time shapes fail our check)."""
        from runtime_provider_cpu.api import CPUExecutable  # the CPU provider's documented API

        logger.info("OpenCL node %r (%s) runs on the host for these shapes: %s",
                       view.name, view.op_type, why)
        ins = tuple(n for n in view.inputs if n)
        consts = {n: ctx.constants[n] for n in ins if n in ctx.constants}
        feeds = tuple(n for n in ins if n not in consts)
        values = {vi.name: vi for vi in tuple(view.input_info) + tuple(view.output_info) if vi is not None}
        part = Partition(-1, "CPUExecutionProvider", (view,), feeds,
                         tuple(o for o in view.outputs if o), consts, values)
        return HostStep(view, feeds, tuple(view.outputs), CPUExecutable(part))

    def _signature(self, inputs):
        sig = []
        values = {}
        for t in inputs:
            sig.append((t.shape, t.dtype.str))
        for i in self._value_inputs:
            t = inputs[i]
            if t.dtype.kind not in "iu" or t.size > VALUE_LIMIT:
                raise ValueError(f"input {self.inputs[i]!r} is read as a value (a shape or index "
                                 f"list) but is a {t.dtype.name} tensor of shape {t.shape}")
            v = t.host_value()
            values[self.inputs[i]] = v
            sig.append(tuple(int(x) for x in v.reshape(-1)))
        return tuple(sig), values

    def _get(self, inputs) -> Specialization:
        if self.static:
            return next(iter(self._cache.values()))
        sig, values = self._signature(inputs)
        with self._lock:
            spec = self._cache.get(sig)
            if spec is not None:
                self._cache.move_to_end(sig)
                return spec
        spec = self._specialize([t.shape for t in inputs], [t.dtype for t in inputs], values)
        with self._lock:
            self._cache[sig] = spec
            self._cache.move_to_end(sig)
            while len(self._cache) > LRU_SIZE:
                self._cache.popitem(last=False)
        return spec

    # -- running --------------------------------------------------------------------
    def run(self, inputs: list, stop=None) -> list:
        """The partition's outputs for ``inputs`` (device tensors, left on the device).

        ``stop`` (plugin API 1.3), when given, is called before each kernel is enqueued; the
        ``RunTerminatedError`` it raises propagates unwrapped, so a cancelled run enqueues
        nothing more (kernels already enqueued finish on the device).
        """
        if len(inputs) != len(self.inputs):
            raise ValueError(f"expected {len(self.inputs)} inputs, got {len(inputs)}")
        env = dict(self.constants)
        for name, t, (shape, dtype) in zip(self.inputs, inputs, self.expected):
            if not isinstance(t, OpenCLTensor):
                raise TypeError(f"input {name!r} reached the OpenCL device as {type(t).__name__}, "
                                "not an OpenCLTensor (a copy_to_device is missing)")
            if t.device is not self.dev:
                raise ValueError(f"input {name!r} lives on {t.device.info}, not on {self.dev.info}")
            if shape is not None and (len(t.shape) != len(shape) or any(
                    isinstance(d, int) and d != s for d, s in zip(shape, t.shape))):
                raise ValueError(f"input {name!r} has shape {t.shape}; this partition was compiled "
                                 f"for {tuple('?' if not isinstance(d, int) else d for d in shape)}")
            if dtype is not None and t.dtype != dtype:
                raise ValueError(f"input {name!r} is {t.dtype.name}, expected {dtype.name}")
            env[name] = t
        spec = self._get(inputs)
        self.host_fallbacks = spec.host_fallbacks
        dev = self.dev
        for step, frees in zip(spec.steps, self.frees):
            if stop is not None:
                stop()
            try:
                step.run(env, dev)
            except Exception as exc:
                node = step.node
                raise OpenCLKernelError(f"{type(exc).__name__}: {exc}", node.name, node.op_type) from exc
            for name in frees:
                env.pop(name, None)
        outs = [env[o] for o in self.outputs]
        if spec.kept:
            outs = [t.clone() if t.buffer is not None and id(t.buffer) in spec.kept else t for t in outs]
        return outs
