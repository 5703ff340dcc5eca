"""The pass framework and the basic (semantics-preserving) passes.

Each pass is a small class with a ``name``, the ``level`` it belongs to and an
``apply(graph) -> int`` that returns how many rewrites it made. Passes whose
level is above the session's level, or whose name is listed in the config entry
``optimization.disable_specified_optimizers`` (comma-separated), do not run.
"""

from __future__ import annotations

import logging

from onnx import numpy_helper

from ..graph.attrs import attr_value
from ..graph.ir import Graph

logger = logging.getLogger("runtime_core.optimizer")

BASIC, EXTENDED, ALL = 1, 2, 99


class Pass:
    """Base class: subclasses set ``name`` and ``level`` and implement ``apply``."""

    name = ""
    level = BASIC

    def apply(self, graph: Graph) -> int:  # pragma: no cover - interface
        raise NotImplementedError


class ConstantToInitializer(Pass):
    """``Constant`` nodes become initializers, so providers see them as constants."""

    name = "ConstantToInitializer"

    def apply(self, graph: Graph) -> int:
        keep, changed = [], 0
        for n in graph.nodes:
            if n.op_type == "Constant" and n.domain == "" and len(n.proto_attrs) == 1:
                a = n.proto_attrs[0]
                if a.name == "value":
                    graph.initializers[n.outputs[0]] = numpy_helper.to_array(a.t)
                elif a.name in ("value_float", "value_int", "value_floats", "value_ints"):
                    import numpy as np

                    dt = np.float32 if "float" in a.name else np.int64
                    graph.initializers[n.outputs[0]] = np.array(attr_value(a), dtype=dt)
                elif a.name in ("value_string", "value_strings"):
                    import numpy as np

                    graph.initializers[n.outputs[0]] = np.array(attr_value(a), dtype=object)
                else:
                    keep.append(n)
                    continue
                changed += 1
            else:
                keep.append(n)
        graph.nodes = keep
        return changed


class IdentityElimination(Pass):
    """Drop ``Identity`` nodes by renaming their readers (not when the output is a graph output)."""

    name = "IdentityElimination"

    def apply(self, graph: Graph) -> int:
        outputs = set(graph.output_names)
        implicit = {i for n in graph.nodes for i in n.implicit_inputs}
        rename: dict[str, str] = {}
        keep = []
        for n in graph.nodes:
            if (n.op_type == "Identity" and n.domain == "" and n.inputs and n.inputs[0]
                    and n.outputs[0] not in outputs and n.outputs[0] not in implicit):
                src = n.inputs[0]
                rename[n.outputs[0]] = rename.get(src, src)
                continue
            keep.append(n)
        for n in keep:
            n.inputs = [rename.get(i, i) for i in n.inputs]
        graph.nodes = keep
        return len(rename)


class DeadNodeElimination(Pass):
    """Remove nodes none of whose outputs is read or is a graph output."""

    name = "DeadNodeElimination"

    def apply(self, graph: Graph) -> int:
        removed = 0
        while True:
            needed = set(graph.output_names)
            for n in graph.nodes:
                needed.update(n.all_inputs())
            keep = [n for n in graph.nodes if any(o in needed for o in n.outputs if o)]
            if len(keep) == len(graph.nodes):
                break
            removed += len(graph.nodes) - len(keep)
            graph.nodes = keep
        used = set(graph.input_names) | set(graph.output_names)
        for n in graph.nodes:
            used.update(n.all_inputs())
        for name in [k for k in graph.initializers if k not in used]:
            del graph.initializers[name]
        return removed


OPTIMIZERS: list[Pass] = [ConstantToInitializer(), IdentityElimination(), DeadNodeElimination()]


def optimize(graph: Graph, level: int, disabled: set[str] | None = None) -> dict[str, int]:
    """Run every enabled pass of ``level`` or below, in order; returns rewrites per pass."""
    disabled = disabled or set()
    done: dict[str, int] = {}
    for p in OPTIMIZERS:
        if p.level > level or p.name in disabled:
            continue
        n = p.apply(graph)
        done[p.name] = n
        if n:
            logger.debug("pass %s: %d rewrite(s)", p.name, n)
    return done
