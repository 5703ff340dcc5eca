"""The CPU execution provider and its plugin hook.

This distribution must not depend on runtime-core (runtime-core depends on it), so
it implements the provider contract by duck typing and its hook is recognised by
its ``runtime_core_`` name prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import arena, ops  # noqa: F401  - ops: imports every kernel module by name
from ._version import __version__
from .executable import CPUExecutable
from .registry import REGISTRY, SCOPE


@dataclass
class _Probe:
    available: bool
    reason: str = ""
    devices: list = field(default_factory=list)


@dataclass
class _Capability:
    claims: list = field(default_factory=list)
    declined: dict = field(default_factory=dict)


def decline_reason(node) -> str | None:
    """Why the CPU provider cannot run ``node`` (``None`` when it can)."""
    versions = REGISTRY.versions(node.domain, node.op_type)
    dom = node.domain or "ai.onnx"
    if not versions:
        return f"op {dom}::{node.op_type} is not implemented by the CPU provider"
    spec = REGISTRY.lookup(node.domain, node.op_type, node.since_version)
    if spec is None:
        return (f"{dom}::{node.op_type} version {node.since_version} (opset {node.opset}) is not "
                f"implemented; the CPU provider has versions {', '.join(map(str, versions))}")
    if spec.dtypes is not None and node.input_info and node.input_info[0] is not None:
        dt = node.input_info[0].dtype
        if dt is not None and np.dtype(dt).name not in spec.dtypes:
            return (f"{node.op_type} on {np.dtype(dt).name} is not implemented "
                    f"(supported: {', '.join(sorted(spec.dtypes))})")
    if spec.check is not None:
        try:
            why = spec.check(node)
        except Exception as exc:  # a check must not break capability
            return f"capability check failed: {type(exc).__name__}: {exc}"
        if why:
            return why
    return None


class CPUExecutionProvider:
    """Runs ONNX nodes with numpy kernels on the host."""

    name = "CPUExecutionProvider"
    alias = "cpu"
    version = __version__
    distribution = "runtime-provider-cpu"
    plugin_api = ">=1.3,<2"  # 1.3: subgraph bodies as views (NodeView.subgraphs)
    device_type = "cpu"

    def __init__(self, options=None):
        self.options = dict(options or {})

    @classmethod
    def probe(cls):
        from .fast.policy import NATIVE_ERROR

        native = "compiled kernels" if NATIVE_ERROR is None else f"no compiled kernels ({NATIVE_ERROR})"
        return _Probe(True, "", ["host (numpy %s, %s)" % (np.__version__, native)])

    def get_capability(self, graph):
        cap = _Capability()
        # what kernel checks may look up: Gradient reads the nodes it differentiates
        token = SCOPE.set((dict(getattr(graph, "opsets", None) or {}), getattr(graph, "value", None),
                           tuple(getattr(graph, "all_nodes", None) or getattr(graph, "nodes", ()))))
        try:
            for node in graph:
                why = decline_reason(node)
                if why is None:
                    cap.claims.append(node)
                else:
                    cap.declined[node.name] = why
        finally:
            SCOPE.reset(token)
        return cap

    def compile(self, partition):
        if getattr(partition, "cpu_mem_arena", True):
            arena.enable()  # process-wide, once: see arena.py
        return CPUExecutable(partition)  # everything it needs is in the partition

    # host memory: copies are identities
    def allocate(self, shape, dtype):
        return np.empty(shape, dtype)

    def copy_to_device(self, array):
        return array

    def copy_to_host(self, tensor):
        return np.asarray(tensor)

    def synchronize(self):
        return None

    def get_options(self):
        return {k: str(v) for k, v in self.options.items()}


def runtime_core_register_providers(registrar):
    """Register :class:`CPUExecutionProvider` (the core's fallback provider)."""
    registrar.register(CPUExecutionProvider)
