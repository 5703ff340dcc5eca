"""ORT-compatible profiling: a Chrome-trace JSON with onnxruntime's event schema.

Enabled by ``SessionOptions.enable_profiling``; the session then records

* ``cat: "Session"`` events: ``model_loading_uri`` / ``model_loading_array``,
  ``session_initialization``, and per run ``model_run`` and ``SequentialExecutor::Execute``;
* ``cat: "Node"`` events named ``<node name>_kernel_time`` with ORT's ``args``: ``op_name``,
  ``provider``, ``node_index``, ``input_type_shape``, ``output_type_shape`` (lists of
  ``{"float": [2, 3]}``), ``output_size``, ``activation_size``, ``parameter_size`` (byte
  counts as strings, as ORT writes them).

``ts`` and ``dur`` are microseconds, ``ts`` relative to the profiler's start (the start of
session creation). ``sess.end_profiling()`` writes ``<profile_file_prefix>_<date>_<time>.json``
and returns its path; later runs are no longer recorded.

Per-node timing costs nothing when profiling is off: the session then never wraps its
executables and the providers' ordinary ``run`` loops are used. When on, each partition's
executable is wrapped; a provider whose executable has ``run_profiled(inputs, record)``
(the CPU provider) reports every node, others are timed as one event per partition
(``op_name`` ``"Partition"``). The memory and thread-pool statistics of ORT 1.19+ traces
(``mem_*``, ``thread_scheduling_stats``) are not written: runtime-core has no arena whose
numbers they would describe.
"""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np

from ..execution.cancel import accepts_stop

# onnxruntime's names for element types in input_type_shape / output_type_shape
_ORT_TYPE_NAMES = {
    "float32": "float", "float64": "double", "float16": "float16", "bfloat16": "bfloat16",
    "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
    "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
    "bool": "bool", "object": "string", "complex64": "complex64", "complex128": "complex128",
}


def _type_shape(v) -> dict:
    """``{"float": [2, 3]}`` for one value (ORT's ``input_type_shape`` entry)."""
    if isinstance(v, np.ndarray):
        name = _ORT_TYPE_NAMES.get(v.dtype.name, v.dtype.name)
        if v.dtype.kind in "OUS":
            name = "string"
        return {name: [int(d) for d in v.shape]}
    if isinstance(v, (list, tuple)):
        return {"sequence": [len(v)]}
    if isinstance(v, dict):
        return {"map": [len(v)]}
    if v is None:
        return {"none": []}
    shape = getattr(v, "shape", None)
    dtype = getattr(v, "dtype", None)
    if shape is not None:  # a device tensor
        dname = np.dtype(dtype).name if dtype is not None else "unknown"
        return {_ORT_TYPE_NAMES.get(dname, dname): [int(d) for d in shape]}
    return {type(v).__name__: []}


def _nbytes(v) -> int:
    n = getattr(v, "nbytes", None)
    try:
        return int(n) if n is not None and not isinstance(v, (list, dict)) else 0
    except (TypeError, ValueError):
        return 0


class Profiler:
    """Collects one session's events; :meth:`end` writes them."""

    def __init__(self, prefix: str | None):
        self.prefix = prefix or "onnxruntime_profile_"
        self.start_ns = time.perf_counter_ns()
        self.start_wall_ns = time.time_ns()
        self.pid = os.getpid()
        self.events: list[dict] = []
        self.enabled = True
        self._lock = threading.Lock()
        self._mark = self.start_ns
        self.node_index: dict[str, int] = {}
        self.params: dict[str, int] = {}

    # -- event helpers ----------------------------------------------------------------
    def _event(self, cat: str, name: str, t0: int, t1: int, args: dict | None = None) -> None:
        ev = {"cat": cat, "pid": self.pid, "tid": threading.get_native_id(),
              "dur": max(0, (t1 - t0) // 1000), "ts": max(0, (t0 - self.start_ns) // 1000),
              "ph": "X", "name": name, "args": args if args is not None else {}}
        with self._lock:
            self.events.append(ev)

    def mark(self, name: str) -> None:
        """A ``Session`` event from the previous mark (or the start) to now."""
        now = time.perf_counter_ns()
        self._event("Session", name, self._mark, now)
        self._mark = now

    # -- session creation -----------------------------------------------------------------
    def wrap(self, planned, providers, executables, graph=None) -> list:
        """Executables that time themselves while profiling is on (one per partition)."""
        out = []
        index = 0
        for pp, exe in zip(planned, executables):
            prov = providers[pp.provider_pos]
            part = pp.partition
            for node in part.nodes:
                self.node_index[node.name] = index
                index += 1
                if graph is not None:
                    self.params[node.name] = sum(
                        int(getattr(graph.initializers.get(i), "nbytes", 0) or 0)
                        for i in node.inputs if i and i in graph.initializers)
            out.append(_ProfiledExecutable(self, exe, getattr(prov, "name", type(prov).__name__), part))
        return out

    # -- runs ---------------------------------------------------------------------------
    def run_model(self, fn, *args, **kwargs):
        """Call ``fn`` (the plan's run) recording ``model_run`` and the executor event."""
        if not self.enabled:
            return fn(*args, **kwargs)
        t0 = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            t1 = time.perf_counter_ns()
            self._event("Session", "SequentialExecutor::Execute", t0, t1)
            self._event("Session", "model_run", t0, t1)

    def node(self, node, provider: str, t0: int, t1: int, inputs, outputs) -> None:
        """One ``Node`` event (``inputs``/``outputs``: the values the kernel saw and made)."""
        out_size = sum(_nbytes(v) for v in outputs)
        in_size = sum(_nbytes(v) for v in inputs)
        param = self.params.get(node.name, 0)
        args = {
            "op_name": node.op_type,
            "provider": provider,
            "node_index": str(self.node_index.get(node.name, getattr(node, "index", 0))),
            "activation_size": str(max(0, in_size - param)),
            "parameter_size": str(param),
            "output_size": str(out_size),
            "input_type_shape": [_type_shape(v) for v in inputs],
            "output_type_shape": [_type_shape(v) for v in outputs],
        }
        self._event("Node", f"{node.name}_kernel_time", t0, t1, args)

    # -- end ------------------------------------------------------------------------------
    def end(self) -> str:
        """Write the trace, stop recording; returns the file's path."""
        self.enabled = False
        stamp = time.localtime(self.start_wall_ns / 1e9)
        ms = (self.start_wall_ns // 1_000_000) % 1000
        path = f"{self.prefix}_{time.strftime('%Y-%m-%d_%H-%M-%S', stamp)}_{ms:03d}.json"
        with self._lock:
            events = list(self.events)
        d = os.path.dirname(path)
        if d:
            os.makedirs(d, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write("[\n")
            f.write(",\n".join(json.dumps(e, separators=(",", ":")) for e in events))
            f.write("\n]\n")
        return path


class _ProfiledExecutable:
    """Wraps one partition's executable; times its nodes while the profiler is enabled."""

    def __init__(self, profiler: Profiler, exe, provider_name: str, partition):
        self._profiler = profiler
        self._exe = exe
        self._provider = provider_name
        self._partition = partition
        self._per_node = callable(getattr(exe, "run_profiled", None))
        # what takes the run's ``stop`` (plugin API 1.3): decided once, as the plan does
        self._stop_run = accepts_stop(exe.run)
        self._stop_profiled = self._per_node and accepts_stop(exe.run_profiled)

    def __getattr__(self, name):  # everything else is the wrapped executable's
        return getattr(self._exe, name)

    def run(self, inputs, stop=None):
        prof = self._profiler
        kw = {"stop": stop} if stop is not None and self._stop_run else {}
        if not prof.enabled:
            return self._exe.run(inputs, **kw)
        if self._per_node:
            provider = self._provider

            def record(node, t0, t1, ins, outs):
                prof.node(node, provider, t0, t1, ins, outs)

            if stop is not None and self._stop_profiled:
                return self._exe.run_profiled(inputs, record, stop=stop)
            return self._exe.run_profiled(inputs, record)
        t0 = time.perf_counter_ns()
        outs = self._exe.run(inputs, **kw)
        t1 = time.perf_counter_ns()
        part = self._partition
        node = _PartitionNode(f"partition_{getattr(part, 'id', 0)}", "Partition",
                              getattr(part, "nodes", ()))
        prof.node(node, self._provider, t0, t1, list(inputs), list(outs))
        return outs


class _PartitionNode:
    def __init__(self, name, op_type, nodes):
        self.name = name
        self.op_type = op_type
        self.index = nodes[0].index if nodes and hasattr(nodes[0], "index") else 0
