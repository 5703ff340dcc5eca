"""Compiled CPU partitions: a flat list of bound kernel calls over value slots.

Everything that can be decided when the partition compiles is decided then
(kernel lookup, attributes, slot indices, when each value dies), so the per-node
run loop only calls kernels and moves references.
"""

from __future__ import annotations

import os

import numpy as np

from .registry import REGISTRY, KernelContext


class CPUKernelError(RuntimeError):
    """A kernel raised; carries the node's name and op so the core can say where."""

    def __init__(self, message: str, node_name: str, op_type: str):
        super().__init__(message)
        self.node_name = node_name
        self.op_type = op_type


_NONE_SLOT = 0  # slot 0 always holds None: omitted optional inputs read it


class CPUExecutable:
    """Runs the nodes of one partition in order. Thread-safe: state is per call."""

    def __init__(self, partition, check_kernels: bool | None = None):
        self.partition = partition
        slot_of: dict[str, int] = {"": _NONE_SLOT}
        template: list = [None]

        def slot(name: str) -> int:
            if name not in slot_of:
                slot_of[name] = len(template)
                template.append(None)
            return slot_of[name]

        for name, value in partition.constants.items():
            template[slot(name)] = value
        self.input_slots = [slot(n) for n in partition.inputs]
        steps = []
        for node in partition.nodes:
            spec = REGISTRY.lookup(node.domain, node.op_type, node.since_version)
            if spec is None:  # the provider never claims such a node
                raise RuntimeError(f"no CPU kernel for {node.qualified_op} (node {node.name!r})")
            ins = list(node.inputs)
            while ins and not ins[-1]:
                ins.pop()
            ctx = KernelContext(
                node=node,
                n_outputs=len(node.outputs),
                input_dtypes=tuple(i.dtype if i is not None else None for i in node.input_info),
                output_dtypes=tuple(o.dtype if o is not None else None for o in node.output_info),
            )
            in_slots = tuple(slot(n) for n in ins)
            out_slots = tuple(slot(n) if n else -1 for n in node.outputs)
            steps.append([spec.fn, ctx, in_slots, out_slots, dict(node.attrs), ()])
        self.n_slots = len(template)
        self.template = template
        self.output_slots = [slot_of[n] for n in partition.outputs]
        # free each intermediate after its last reader (partition outputs and constants stay)
        keep = set(self.output_slots) | {slot_of[n] for n in partition.constants} | {_NONE_SLOT}
        last_use: dict[int, int] = {}
        for i, st in enumerate(steps):
            for s in st[2]:
                last_use[s] = i
            for s in st[3]:
                if s >= 0:
                    last_use.setdefault(s, i)
        frees: dict[int, list[int]] = {}
        for s, i in last_use.items():
            if s not in keep:
                frees.setdefault(i, []).append(s)
        for i, st in enumerate(steps):
            st[5] = tuple(frees.get(i, ()))
        self.steps = [tuple(st) for st in steps]
        if check_kernels is None:
            check_kernels = os.environ.get("RUNTIME_CORE_CHECK_KERNELS", "") not in ("", "0")
        self.check_kernels = check_kernels

    def run(self, inputs):
        slots = list(self.template)
        for s, v in zip(self.input_slots, inputs):
            slots[s] = v
        for fn, ctx, in_slots, out_slots, attrs, frees in self.steps:
            try:
                res = fn(ctx, *[slots[s] for s in in_slots], **attrs)
            except CPUKernelError:
                raise
            except Exception as exc:
                node = ctx.node
                raise CPUKernelError(
                    f"{node.op_type} node {node.name!r} failed: {type(exc).__name__}: {exc}",
                    node.name, node.op_type) from exc
            if type(res) is not tuple:
                res = (res,)
            for s, r in zip(out_slots, res):
                if s >= 0:
                    if type(r) is not np.ndarray and r is not None and not isinstance(r, (list, dict)):
                        r = np.asarray(r)
                    slots[s] = r
            if self.check_kernels:
                self._check(ctx, res)
            for s in frees:
                slots[s] = None
        return [slots[s] for s in self.output_slots]

    @staticmethod
    def _check(ctx, res) -> None:
        node = ctx.node
        n_wanted = sum(1 for o in node.outputs if o)
        produced = sum(1 for o, r in zip(node.outputs, res) if o)
        if produced < n_wanted:
            raise CPUKernelError(f"{node.op_type} node {node.name!r} returned {len(res)} outputs, "
                                 f"the node declares {len(node.outputs)}", node.name, node.op_type)
        for i, (name, r) in enumerate(zip(node.outputs, res)):
            want = ctx.output_dtypes[i] if i < len(ctx.output_dtypes) else None
            if not name or want is None or not isinstance(r, np.ndarray):
                continue
            got = np.asarray(r).dtype
            if got != want and not (want == np.dtype(object) and got.kind in "OUS"):
                raise CPUKernelError(
                    f"{node.op_type} node {node.name!r} output {i} ({name!r}) has dtype {got}, "
                    f"the model says {want}", node.name, node.op_type)
