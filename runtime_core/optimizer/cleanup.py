"""The first and last basic passes: ``Constant`` nodes to initializers, ``Identity`` nodes
dropped, and dead nodes (and the initializers only they read) removed."""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from ..graph.attrs import attr_value
from ..graph.ir import Graph, Node
from .editor import BASIC, Editor, Pass
from .rewrite import RewriteRule


class ConstantToInitializer(RewriteRule):
    """``Constant`` nodes become initializers, so providers see them as constants."""

    name = "ConstantToInitializer"
    level = BASIC
    targets = frozenset({"Constant"})

    def condition(self, ed: Editor, n: Node) -> bool:
        return len(n.proto_attrs) == 1

    def rewrite(self, ed: Editor, n: Node) -> bool:
        a = n.proto_attrs[0]
        if a.name == "value":
            value = numpy_helper.to_array(a.t)
        elif a.name in ("value_float", "value_int", "value_floats", "value_ints"):
            value = np.array(attr_value(a), dtype=np.float32 if "float" in a.name else np.int64)
        elif a.name in ("value_string", "value_strings"):
            value = np.array(attr_value(a), dtype=object)
        else:  # sparse_value: left to the kernel
            return False
        ed.g.initializers[n.outputs[0]] = value
        ed.drop(n)
        return True


class IdentityElimination(RewriteRule):
    """Drop ``Identity`` nodes by renaming their readers (not when the output is a graph
    output or read by a subgraph)."""

    name = "IdentityElimination"
    level = BASIC
    targets = frozenset({"Identity"})

    def condition(self, ed: Editor, n: Node) -> bool:
        return bool(n.inputs and n.inputs[0])

    def rewrite(self, ed: Editor, n: Node) -> bool:
        out = n.outputs[0]
        if ed.is_output(out) or ed.is_implicit(out):
            return False
        ed.drop(n)
        ed.rename_uses(out, n.inputs[0])
        return True


class DeadNodeElimination(Pass):
    """Remove nodes none of whose outputs is read or is a graph output."""

    name = "DeadNodeElimination"
    level = BASIC

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
