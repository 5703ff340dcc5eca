"""A compiled partition: constants uploaded once, one step per node, lifetimes planned."""

from __future__ import annotations

import numpy as np

from .registry import REGISTRY, BuildContext
from .tensor import OpenCLTensor


class OpenCLKernelError(RuntimeError):
    """A node failed on the device; ``node_name`` and ``op_type`` name it for the core."""

    def __init__(self, message: str, node_name: str, op_type: str):
        super().__init__(message)
        self.node_name = node_name
        self.op_type = op_type


class OpenCLExecutable:
    """Runs a partition's nodes on one device; every value stays on the device.

    ``run`` keeps all state in locals, and kernel launches go through the device
    context's lock, so one executable serves many threads.
    """

    def __init__(self, partition, dev):
        self.partition = partition
        self.dev = dev
        self.inputs = tuple(partition.inputs)
        self.outputs = tuple(partition.outputs)
        self.expected = []
        for name in self.inputs:
            vi = partition.value(name)
            self.expected.append((None if vi.static_shape is None else tuple(vi.static_shape),
                                  None if vi.dtype is None else np.dtype(vi.dtype)))
        # constants that some kernel reads as a tensor, uploaded once (shape-only inputs
        # such as Reshape's shape are read at compile time and never uploaded)
        self.constants = {}
        for name, arr in partition.constants.items():
            arr = np.asarray(arr)
            if arr.dtype.kind in "fb" and arr.dtype in (np.float32, np.bool_):
                self.constants[name] = OpenCLTensor.from_numpy(arr, dev)
        ctx = BuildContext(dev, partition.constants)
        self.steps = []
        for node in partition.nodes:
            spec = REGISTRY[node.op_type]
            try:
                self.steps.append(spec.build(node, ctx))
            except Exception as exc:
                raise RuntimeError(f"building node {node.name!r} ({node.op_type}) for OpenCL failed: "
                                   f"{type(exc).__name__}: {exc}") from exc
        self.frees = self._lifetimes()
        # buffers this executable keeps across runs (constants, compile-time outputs): an output
        # that is one of them (or a view of one) is cloned, since a caller may write into it
        self._kept = {id(t.buffer) for t in self.constants.values() if t.buffer is not None}
        self._kept.update(id(st.tensor.buffer) for st in self.steps
                          if isinstance(getattr(st, "tensor", None), OpenCLTensor)
                          and st.tensor.buffer is not None)

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

    def run(self, inputs: list) -> list:
        if len(inputs) != len(self.inputs):
            raise ValueError(f"expected {len(self.inputs)} inputs, got {len(inputs)}")
        env = dict(self.constants)
        for name, t, (shape, dtype) in zip(self.inputs, inputs, self.expected):
            if not isinstance(t, OpenCLTensor):
                raise TypeError(f"input {name!r} reached the OpenCL device as {type(t).__name__}, "
                                "not an OpenCLTensor (a copy_to_device is missing)")
            if t.device is not self.dev:
                raise ValueError(f"input {name!r} lives on {t.device.info}, not on {self.dev.info}")
            if shape is not None and t.shape != shape:
                raise ValueError(f"input {name!r} has shape {t.shape}; this partition was compiled "
                                 f"for {shape}")
            if dtype is not None and t.dtype != dtype:
                raise ValueError(f"input {name!r} is {t.dtype.name}, expected {dtype.name}")
            env[name] = t
        dev = self.dev
        for step, frees in zip(self.steps, self.frees):
            try:
                step.run(env, dev)
            except Exception as exc:
                node = step.node
                raise OpenCLKernelError(f"{type(exc).__name__}: {exc}", node.name, node.op_type) from exc
            for name in frees:
                env.pop(name, None)
        outs = [env[o] for o in self.outputs]
        if self._kept:
            outs = [t.clone() if t.buffer is not None and id(t.buffer) in self._kept else t for t in outs]
        return outs
