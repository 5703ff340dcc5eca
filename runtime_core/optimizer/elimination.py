"""Basic passes that remove work without changing a value bit: redundant Dropout, Cast,
Transpose and Reshape nodes, and repeated computations (CSE).

Each is a :class:`~runtime_core.optimizer.rewrite.RewriteRule`: the op types it starts
from, a condition, a rewrite.
"""

from __future__ import annotations

import zlib

import numpy as np
import onnx

from ..graph.ir import Node
from ..graph.types import elem_to_dtype
from .editor import BASIC, NONDETERMINISTIC, Editor, logger
from .rewrite import RewriteRule
from .shapes import shape_tensor


def has_subgraph(n: Node) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.proto_attrs)


class DropoutElimination(RewriteRule):
    """Inference-mode ``Dropout`` (no training_mode, or a constant false) whose mask nobody
    reads is the identity."""

    name = "DropoutElimination"
    level = BASIC
    targets = frozenset({"Dropout"})

    def condition(self, ed: Editor, n: Node) -> bool:
        return bool(n.inputs and n.inputs[0])

    def rewrite(self, ed: Editor, n: Node) -> bool:
        if len(n.inputs) > 2 and n.inputs[2]:
            tm = ed.const(n.inputs[2])
            if tm is None or bool(tm.reshape(-1)[0]):
                return False
        if n.attrs.get("is_test") == 0 and n.since_version is not None and n.since_version < 7:
            return False
        if len(n.outputs) > 1 and n.outputs[1] and (ed.consumers(n.outputs[1]) or ed.is_output(n.outputs[1])):
            return False
        if ed.bypass(n, n.outputs[0], n.inputs[0]):
            ed.log("removed %s", n.name)
            return True
        return False


#: casts that keep every value of the source type exactly
_LOSSLESS = {
    "bool": {"int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16",
             "float32", "float64"},
    "int8": {"int16", "int32", "int64", "float16", "float32", "float64"},
    "uint8": {"int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64"},
    "int16": {"int32", "int64", "float32", "float64"},
    "uint16": {"int32", "uint32", "int64", "uint64", "float32", "float64"},
    "int32": {"int64", "float64"},
    "uint32": {"int64", "uint64", "float64"},
    "float16": {"float32", "float64"},
    "float32": {"float64"},
}


class CastElimination(RewriteRule):
    """``Cast`` to the type its input already has is dropped; ``Cast(Cast(x, T1), T2)``
    reads ``x`` directly when ``x -> T1`` is lossless (then it is a single cast, or none
    when ``T2`` is ``x``'s type)."""

    name = "CastElimination"
    level = BASIC
    targets = frozenset({"Cast"})

    def condition(self, ed: Editor, n: Node) -> bool:
        return bool(n.inputs[0])

    def rewrite(self, ed: Editor, n: Node) -> bool:
        to = elem_to_dtype(n.attrs.get("to") or 0)
        src = ed.dtype(n.inputs[0])
        if to is None or src is None:
            return False
        if src == to:
            if ed.bypass(n, n.outputs[0], n.inputs[0]):
                ed.log("removed %s (cast to its own type %s)", n.name, to)
                return True
            return False
        prev = ed.producer(n.inputs[0])
        if prev is None or prev.op_type != "Cast" or prev.domain != "" or not prev.inputs[0]:
            return False
        x = prev.inputs[0]
        xd = ed.dtype(x)
        mid = elem_to_dtype(prev.attrs.get("to") or 0)
        if xd is None or mid is None or mid.name not in _LOSSLESS.get(xd.name, ()):
            return False
        if xd == to:
            if ed.bypass(n, n.outputs[0], x):
                ed.log("removed %s and read %s (lossless round trip %s->%s->%s)", n.name, x, xd, mid, to)
                return True
            return False
        n.inputs = [x]
        ed.touch()
        ed.log("%s reads %s directly (lossless %s->%s)", n.name, x, xd, mid)
        return True


class TransposeElimination(RewriteRule):
    """Identity ``Transpose`` is dropped; ``Transpose(Transpose(x))`` becomes one transpose
    with the composed permutation, or none when they cancel."""

    name = "TransposeElimination"
    level = BASIC
    targets = frozenset({"Transpose"})

    @staticmethod
    def _perm(ed: Editor, n: Node):
        p = n.attrs.get("perm")
        if p:
            return list(p)
        r = ed.rank(n.inputs[0])
        return None if r is None else list(range(r))[::-1]

    def rewrite(self, ed: Editor, n: Node) -> bool:
        p2 = self._perm(ed, n)
        if p2 is None:
            return False
        if p2 == sorted(p2):
            if ed.bypass(n, n.outputs[0], n.inputs[0]):
                ed.log("removed identity %s", n.name)
                return True
            return False
        prev = ed.producer(n.inputs[0])
        if prev is None or prev.op_type != "Transpose" or prev.domain != "":
            return False
        p1 = self._perm(ed, prev)
        if p1 is None or len(p1) != len(p2):
            return False
        q = [p1[k] for k in p2]
        x = prev.inputs[0]
        if q == sorted(q):
            if ed.bypass(n, n.outputs[0], x):
                ed.log("%s and %s cancel", prev.name, n.name)
                return True
            return False
        new = ed.new_node("Transpose", [x], list(n.outputs), base=n.name, attrs={"perm": q})
        if ed.replace([n], [new]):
            ed.log("%s + %s -> one Transpose %s", prev.name, n.name, q)
            return True
        return False


_RESHAPE_LIKE = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}


class ReshapeElimination(RewriteRule):
    """``Reshape`` of a reshape-like op (Reshape/Flatten/Squeeze/Unsqueeze: element order
    unchanged) reads the original input when its target has no copy-dim 0; a ``Reshape``
    whose static output shape equals its static input shape is dropped."""

    name = "ReshapeElimination"
    level = BASIC
    targets = frozenset({"Reshape"})

    def condition(self, ed: Editor, n: Node) -> bool:
        return len(n.inputs) >= 2

    def rewrite(self, ed: Editor, n: Node) -> bool:
        tgt = ed.const(n.inputs[1])
        ins = ed.static_shape(n.inputs[0])
        if tgt is not None and ins is not None:
            shape = self._resolve(ins, [int(v) for v in tgt.reshape(-1)], n.attrs.get("allowzero") or 0)
            if shape is not None and tuple(shape) == ins:
                if ed.bypass(n, n.outputs[0], n.inputs[0]):
                    ed.log("removed %s (reshape to its own shape %s)", n.name, ins)
                    return True
                return False
        prev = ed.producer(n.inputs[0])
        if prev is None or prev.op_type not in _RESHAPE_LIKE or prev.domain != "" or not prev.inputs[0]:
            return False
        dims = shape_tensor(ed, n.inputs[1])
        if dims is None:
            return False
        if 0 in dims and not (n.attrs.get("allowzero") or 0):
            return False
        n.inputs = [prev.inputs[0], n.inputs[1]]
        ed.touch()
        ed.log("%s reads %s (skips %s %s)", n.name, prev.inputs[0], prev.op_type, prev.name)
        return True

    @staticmethod
    def _resolve(ins, tgt, allowzero):
        out = []
        for i, d in enumerate(tgt):
            if d == 0 and not allowzero:
                if i >= len(ins):
                    return None
                d = ins[i]
            out.append(d)
        if out.count(-1) > 1:
            return None
        if -1 in out:
            rest = int(np.prod([d for d in out if d != -1], dtype=np.int64))
            total = int(np.prod(ins, dtype=np.int64))
            if rest == 0 or total % rest:
                return None
            out[out.index(-1)] = total // rest
        return out


class CommonSubexpressionElimination(RewriteRule):
    """Identical constants are shared, then nodes with the same op, version, attributes and
    inputs are computed once (never non-deterministic ops or nodes with subgraphs)."""

    name = "CommonSubexpressionElimination"
    level = BASIC
    MAX_CONST_ELEMENTS = 1 << 20

    def start(self, ed: Editor) -> bool:
        graph = ed.g
        self._rename: dict[str, str] = {}
        self._seen: dict = {}
        self._outputs = set(graph.output_names)
        self._implicit = {i for n in graph.nodes for i in n.implicit_inputs}
        inputs = set(graph.input_names)
        seen_c: dict = {}
        for name, arr in graph.initializers.items():  # identical initializers (not overridable inputs)
            if (name in inputs or name in self._outputs or name in self._implicit or arr.dtype == object
                    or arr.size > self.MAX_CONST_ELEMENTS):
                continue
            key = (arr.dtype.str, arr.shape, zlib.crc32(np.ascontiguousarray(arr).tobytes()))  # array_equal confirms
            first = seen_c.get(key)
            if first is None:
                seen_c[key] = name
            elif np.array_equal(graph.initializers[first], arr):
                self._rename[name] = first
        self._n_const = len(self._rename)
        return True

    def condition(self, ed: Editor, n: Node) -> bool:
        if any(i in self._rename for i in n.inputs):  # a reader of a duplicate constant reads the first
            n.inputs = [self._rename.get(i, i) for i in n.inputs]
            ed.touch()
        return not (n.op_type in NONDETERMINISTIC or n.implicit_inputs or has_subgraph(n) or not any(n.inputs))

    def rewrite(self, ed: Editor, n: Node) -> bool:
        key = (n.domain, n.op_type, n.since_version, tuple(n.inputs), len(n.outputs),
               tuple(sorted((a.name, a.SerializeToString()) for a in n.proto_attrs)))
        first = self._seen.get(key)
        if first is not None and not ed.alive(first):
            first = self._seen[key] = None
        if first is None or any(o and (o in self._outputs or o in self._implicit) for o in n.outputs):
            if first is None:
                self._seen[key] = n
            return False
        if any(bool(a) != bool(b) for a, b in zip(first.outputs, n.outputs)):
            return False
        ed.drop(n)
        for a, b in zip(first.outputs, n.outputs):
            if b:
                ed.rename_uses(b, a)
        ed.log("%s (%s) is the same as %s", n.name, n.op_type, first.name)
        return True

    def finish(self, ed: Editor) -> int:
        if self._n_const:
            logger.debug("%s: %d duplicate constant(s) shared", self.name, self._n_const)
        return self._n_const
