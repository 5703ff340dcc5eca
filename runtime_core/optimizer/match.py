"""Matching helpers the fusions share: who produces or reads a value, constant operands."""

from __future__ import annotations

import numpy as np

from ..graph.ir import Node
from .editor import Editor

FLOATS = frozenset({np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)})
F32 = np.dtype(np.float32)


def op_of(ed: Editor, name: str, op: str) -> Node | None:
    """The node producing ``name`` when it is an ai.onnx ``op``."""
    n = ed.producer(name) if name else None
    return n if n is not None and n.op_type == op and n.domain == "" else None


def other_input(node: Node, x: str) -> str | None:
    """The other input of a binary node one of whose inputs is ``x``."""
    if len(node.inputs) != 2:
        return None
    if node.inputs[0] == x:
        return node.inputs[1]
    if node.inputs[1] == x:
        return node.inputs[0]
    return None


def only_reader(ed: Editor, name: str, op: str | tuple) -> Node | None:
    """The only reader of ``name`` when it is an ai.onnx ``op`` (and ``name`` is internal)."""
    if not ed.single_use(name):
        return None
    n = ed.consumers(name)[0]
    ops = (op,) if isinstance(op, str) else op
    return n if n.op_type in ops and n.domain == "" else None


def near(v: float | None, target: float, rel: float = 1e-4) -> bool:
    return v is not None and abs(v - target) <= rel * abs(target)


def scalar_operand(ed: Editor, node: Node, x: str) -> float | None:
    o = other_input(node, x)
    return None if o is None else ed.scalar(o)


def last_axis(axes, rank) -> bool:
    axes = list(axes) if axes is not None else None
    if axes is None or len(axes) != 1:
        return False
    return axes[0] == -1 or (rank is not None and axes[0] == rank - 1)


def reduce_axes(ed: Editor, n: Node):
    axes = n.attrs.get("axes")
    if axes is None and len(n.inputs) > 1 and n.inputs[1]:
        c = ed.const(n.inputs[1])
        axes = None if c is None else [int(a) for a in c.reshape(-1)]
    return axes


def const_vector(ed: Editor, name: str, size) -> np.ndarray | None:
    """A constant that is a vector of ``size`` elements (leading 1s allowed), flattened."""
    v = ed.const(name)
    if v is None or not isinstance(size, int) or v.size != size or any(d != 1 for d in v.shape[:-1]):
        return None
    return v.reshape(-1)
