"""A compiled CUDA partition: values stay on the device from its inputs to its outputs.

Constants are uploaded once at compile time (a host copy is kept for the inputs a kernel
reads on the host, :data:`~runtime_provider_cuda.ops.HOST_INPUTS`). Chains of
elementwise nodes whose intermediate values are read by nothing else are fused into one
:class:`~runtime_provider_cuda.kernels.FusedProgram` (one ``ElementwiseKernel`` launch).
Every kernel runs on the session's stream (``backend.activate()``); nothing is copied to
the host inside ``run`` except small host parameters computed on the device.
"""

from __future__ import annotations

import numpy as np

from . import kernels as K
from .ops import HOST_INPUTS, implementation


class CUDAKernelError(RuntimeError):
    """A node failed on the device; ``node_name`` and ``op_type`` name it for the core."""

    def __init__(self, message: str, node_name: str, op_type: str):
        super().__init__(message)
        self.node_name = node_name
        self.op_type = op_type


def _fusible(node) -> bool:
    spec = K.FUSIBLE.get(node.op_type)
    if spec is None or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
        return False
    ins = [i for i in node.inputs]
    if len(ins) != spec[0] or not all(ins):
        return False
    infos = tuple(node.input_info) + tuple(node.output_info)
    dts = {None if i is None or i.dtype is None else np.dtype(i.dtype).name for i in infos}
    return len(dts) == 1 and next(iter(dts)) in K.FLOATS


class _Step:
    __slots__ = ("node", "kind", "fn", "ctx", "ins", "outs", "attrs", "host", "frees", "program")

    def __init__(self, node, kind, fn, ctx, ins, outs, attrs, host=(), program=None):
        self.node, self.kind, self.fn, self.ctx = node, kind, fn, ctx
        self.ins, self.outs, self.attrs, self.host = ins, outs, attrs, host
        self.frees = ()
        self.program = program


class CUDAExecutable:
    """Runs one partition on the provider's device; ``run`` keeps all state in locals."""

    def __init__(self, partition, backend, fuse: bool = True):
        from runtime_provider_cpu.api import KernelContext  # the CPU provider's documented API

        self.partition = partition
        self.backend = backend
        self.inputs = tuple(partition.inputs)
        self.outputs = tuple(partition.outputs)
        nodes = list(partition.nodes)
        host_reads = {n.inputs[i] for n in nodes for i in HOST_INPUTS.get(n.op_type, ())
                      if i < len(n.inputs) and n.inputs[i]}
        device_reads = set()
        for n in nodes:
            hi = HOST_INPUTS.get(n.op_type, ())
            device_reads.update(v for i, v in enumerate(n.inputs) if v and i not in hi)
        self.host_constants = {k: np.asarray(v) for k, v in partition.constants.items() if k in host_reads}
        with backend.activate():
            self.constants = {k: backend.to_device(np.asarray(v)) for k, v in partition.constants.items()
                              if k in device_reads}
        groups = self._fusion_groups(nodes) if fuse and backend is not None else {}
        steps = []
        for idx, node in enumerate(nodes):
            g = groups.get(idx)
            if g == "skip":
                continue
            if g is not None:
                steps.append(g)
                continue
            impl = implementation(node)
            if impl is None:  # the provider never claims such a node
                raise RuntimeError(f"no CUDA implementation for {node.qualified_op} (node {node.name!r})")
            kind, fn = impl
            ins = list(node.inputs)
            while ins and not ins[-1]:
                ins.pop()
            ctx = KernelContext(
                node=node, n_outputs=len(node.outputs),
                input_dtypes=tuple(i.dtype if i is not None else None for i in node.input_info),
                output_dtypes=tuple(o.dtype if o is not None else None for o in node.output_info))
            host = tuple(i for i in HOST_INPUTS.get(node.op_type, ()) if i < len(ins))
            steps.append(_Step(node, kind, fn, ctx, tuple(ins), tuple(node.outputs), dict(node.attrs), host))
        self.steps = steps
        self.n_fused = sum(1 for s in steps if s.kind == "fused")
        self._plan_frees()

    # -- fusion ------------------------------------------------------------------------
    def _fusion_groups(self, nodes):
        """Map node index -> fused step (at the chain's last node) or ``"skip"`` (fused into a later one)."""
        consumers: dict[str, int] = {}
        for n in nodes:
            for v in n.inputs:
                if v:
                    consumers[v] = consumers.get(v, 0) + 1
        producer = {n.outputs[0]: i for i, n in enumerate(nodes) if n.outputs and n.outputs[0]}
        keep_out = set(self.outputs)
        trees: dict[int, list[int]] = {}  # root index -> member indices (current roots only)
        for i, n in enumerate(nodes):
            if not _fusible(n):
                continue
            tree: list[int] = []
            for v in n.inputs:
                p = producer.get(v)
                if p is not None and p in trees and consumers.get(v) == 1 and v not in keep_out:
                    tree += trees.pop(p)
            tree.append(i)
            trees[i] = tree
        out = {}
        for root, tree in trees.items():
            if len(tree) < 2:
                continue
            tree = sorted(tree)
            out[root] = self._fused_step([nodes[j] for j in tree])
            for j in tree[:-1]:
                out[j] = "skip"
        return out

    @staticmethod
    def _fused_step(chain):
        made = {n.outputs[0]: j for j, n in enumerate(chain)}
        inputs: list[str] = []
        steps = []
        for n in chain:
            refs = []
            for v in n.inputs:
                if v in made and made[v] < chain.index(n):
                    refs.append(("t", made[v]))
                else:
                    if v not in inputs:
                        inputs.append(v)
                    refs.append(("in", inputs.index(v)))
            steps.append((n.op_type, refs))
        dtype = chain[-1].output_info[0].dtype
        prog = K.FusedProgram([n.name for n in chain], inputs, steps, dtype)
        last = chain[-1]
        return _Step(last, "fused", None, None, tuple(inputs), (last.outputs[0],), {}, (), prog)

    def _plan_frees(self) -> None:
        keep = set(self.outputs) | set(self.constants)
        last: dict[str, int] = {}
        for i, st in enumerate(self.steps):
            for v in st.ins:
                if v:
                    last[v] = i
        frees: dict[int, list[str]] = {}
        for v, i in last.items():
            if v not in keep:
                frees.setdefault(i, []).append(v)
        for i, st in enumerate(self.steps):
            st.frees = tuple(frees.get(i, ()))

    # -- running -------------------------------------------------------------------------
    def _host(self, env, name):
        if not name:
            return None
        if name in self.host_constants:
            return self.host_constants[name]
        v = env[name]
        return self.backend.to_host(v) if self.backend.is_device(v) else v

    def run(self, inputs: list, stop=None) -> list:
        """The partition's outputs for ``inputs`` (device arrays, left on the device).

        ``stop`` (plugin API 1.3), when given, is called before each step (a node or a fused
        chain) is launched; the ``RunTerminatedError`` it raises propagates unwrapped, so a
        cancelled run launches nothing more (kernels already on the stream finish there).
        """
        be = self.backend
        if len(inputs) != len(self.inputs):
            raise ValueError(f"expected {len(self.inputs)} inputs, got {len(inputs)}")
        env = dict(self.constants)
        for name, t in zip(self.inputs, inputs):
            if not be.is_device(t):
                raise TypeError(f"input {name!r} reached the CUDA device as {type(t).__name__}, not a "
                                "device array (a copy_to_device is missing)")
            env[name] = t
        with be.activate():
            for st in self.steps:
                if stop is not None:
                    stop()
                try:
                    args = [self._host(env, v) if i in st.host else (env[v] if v else None)
                            for i, v in enumerate(st.ins)]
                    if st.kind == "fused":
                        res = (st.program.run(be, args),)
                    elif st.kind == "fast":
                        res = st.fn(be, st.ctx, *args, **st.attrs)
                    else:
                        res = st.fn(st.ctx, *args, **st.attrs)
                    if type(res) is not tuple:
                        res = (res,)
                    if st.kind == "host-result":
                        res = tuple(None if r is None else be.to_device(np.asarray(r)) for r in res)
                except CUDAKernelError:
                    raise
                except Exception as exc:
                    node = st.node
                    raise CUDAKernelError(f"{node.op_type} node {node.name!r} failed on CUDA: "
                                          f"{type(exc).__name__}: {exc}", node.name, node.op_type) from exc
                for name, r in zip(st.outs, res):
                    if not name:
                        continue
                    if r is None or not be.is_device(r):
                        node = st.node
                        raise CUDAKernelError(
                            f"{node.op_type} node {node.name!r} returned "
                            f"{'nothing' if r is None else type(r).__name__} for output {name!r}, not a "
                            "device array (its kernel is not array-module generic)", node.name, node.op_type)
                    env[name] = r
                for v in st.frees:
                    env.pop(v, None)
            outs = [env[o] for o in self.outputs]
        # an output that is one of the kept constants is copied, since a caller may write into it
        kept = {id(v) for v in self.constants.values()}
        return [o.copy() if id(o) in kept else o for o in outs]
