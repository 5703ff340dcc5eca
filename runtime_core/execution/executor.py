"""The execution plan: compiled partitions, boundary copies and value lifetimes.

Built once per session. ``run`` walks a flat list of steps; each step is either a
partition's executable or one device copy. Values are keyed by name on the host
and ``name@device`` elsewhere, and dropped after their last reader.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..errors import ExecutionError
from ..partition.report import CopyEntry

logger = logging.getLogger("runtime_core.execution")

HOST = "cpu"


def _key(name: str, device: str) -> str:
    return name if device == HOST else f"{name}@{device}"


@dataclass
class _RunStep:
    part_id: int
    provider: object
    executable: object
    in_keys: tuple
    out_keys: tuple
    frees: tuple = ()


@dataclass
class _CopyStep:
    value: str
    src: object
    dst: object
    src_key: str
    dst_key: str
    frees: tuple = ()


class ExecutionPlan:
    """Everything ``run`` needs, decided at session creation."""

    def __init__(self, graph, planned, providers, executables):
        self.steps: list = []
        self.copies: list[CopyEntry] = []
        location: dict[str, object] = {}  # value -> provider instance holding it
        host_provider = next((p for p in providers if getattr(p, "device_type", HOST) == HOST), None)
        materialized: set[str] = set()
        feed_names = set(graph.input_names)
        for name in feed_names:
            location[name] = None  # host memory, fed by the caller
            materialized.add(name)

        def dev(p):
            return HOST if p is None else getattr(p, "device_type", HOST)

        def ensure(name: str, dst) -> str:
            src = location[name]
            k = _key(name, dev(dst))
            if k not in materialized:
                self.steps.append(_CopyStep(name, src, dst, _key(name, dev(src)), k))
                materialized.add(k)
                vi = graph.value_info(name)
                self.copies.append(CopyEntry(
                    value=name, src=getattr(src, "name", "host") if src is not None else "host",
                    dst=getattr(dst, "name", "host") if dst is not None else "host", bytes=vi.nbytes))
            return k

        for pp, exe in zip(planned, executables):
            part = pp.partition
            prov = providers[pp.provider_pos]
            in_keys = tuple(ensure(i, prov) for i in part.inputs)
            out_keys = []
            for o in part.outputs:
                location[o] = prov
                k = _key(o, dev(prov))
                materialized.add(k)
                out_keys.append(k)
            self.steps.append(_RunStep(part.id, prov, exe, in_keys, tuple(out_keys)))
        self.const_outputs = {o: graph.initializers[o] for o in graph.output_names
                              if o in graph.initializers and o not in location}
        self.output_keys = {}
        for o in graph.output_names:
            if o in self.const_outputs:
                continue
            self.output_keys[o] = ensure(o, None) if dev(location[o]) != HOST else o
        # lifetimes: drop every key after its last reader, keep outputs
        keep = set(self.output_keys.values())
        last: dict[str, int] = {}
        for idx, st in enumerate(self.steps):
            reads = st.in_keys if isinstance(st, _RunStep) else (st.src_key,)
            for k in reads:
                last[k] = idx
        frees: dict[int, list[str]] = {}
        for k, idx in last.items():
            if k not in keep:
                frees.setdefault(idx, []).append(k)
        for idx, st in enumerate(self.steps):
            st.frees = tuple(frees.get(idx, ()))
        self.host_provider = host_provider

    def run(self, feeds: dict, output_names: list[str]) -> list:
        env = dict(feeds)
        for st in self.steps:
            if type(st) is _RunStep:
                try:
                    outs = st.executable.run([env[k] for k in st.in_keys])
                except Exception as exc:
                    node = getattr(exc, "node_name", None)
                    where = f" at node {node!r} ({getattr(exc, 'op_type', '?')})" if node else ""
                    raise ExecutionError(
                        f"{st.provider.name} failed in partition {st.part_id}{where}: {exc}") from exc
                if len(outs) != len(st.out_keys):
                    raise ExecutionError(
                        f"{st.provider.name} partition {st.part_id} returned {len(outs)} values, "
                        f"expected {len(st.out_keys)}")
                for k, v in zip(st.out_keys, outs):
                    env[k] = v
            else:
                try:
                    v = env[st.src_key]
                    if st.src is not None:
                        v = st.src.copy_to_host(v)
                    if st.dst is not None:
                        v = st.dst.copy_to_device(v)
                except Exception as exc:
                    src = getattr(st.src, "name", "host")
                    dst = getattr(st.dst, "name", "host")
                    raise ExecutionError(f"copying {st.value!r} from {src} to {dst} failed: {exc}") from exc
                env[st.dst_key] = v
            for k in st.frees:
                env.pop(k, None)
        result = []
        for name in output_names:
            if name in self.const_outputs:
                result.append(self.const_outputs[name].copy())
            else:
                result.append(env[self.output_keys[name]])
        return result
