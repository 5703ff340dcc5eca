"""Extended passes for the Gelu family: the erf and tanh forms exporters write out become
one ``Gelu`` (opset >= 20) or ``com.microsoft.Gelu`` / ``FastGelu``, and a bias ``Add``
before one goes into ``com.microsoft.BiasGelu`` / ``FastGelu``."""

from __future__ import annotations

import math

from ..graph.ir import Node
from .editor import EXTENDED, MS_DOMAIN, Editor
from .match import F32, FLOATS, near, only_reader, op_of, other_input, scalar_operand
from .rewrite import RewriteRule


def _gelu_tail(ed: Editor, t_out: str, x: str):
    """``0.5 * x * (1 + t)`` in any of the exporters' orders, from ``t``'s output.
    Returns (final node, pattern nodes) or None."""
    a = only_reader(ed, t_out, "Add")
    if a is None or not near(scalar_operand(ed, a, t_out), 1.0):
        return None
    m1 = only_reader(ed, a.outputs[0], "Mul")
    if m1 is None:
        return None
    o = other_input(m1, a.outputs[0])
    if o is None:
        return None
    if o == x:  # (x * (1 + t)) * 0.5
        m2 = only_reader(ed, m1.outputs[0], "Mul")
        if m2 is not None and near(scalar_operand(ed, m2, m1.outputs[0]), 0.5):
            return m2, [a, m1, m2]
        return None
    half = op_of(ed, o, "Mul")  # (x * 0.5) * (1 + t)
    if half is not None and ed.single_use(o, m1) and near(scalar_operand(ed, half, x), 0.5):
        return m1, [a, half, m1]
    if near(ed.scalar(o), 0.5):  # ((1 + t) * 0.5) * x
        m2 = only_reader(ed, m1.outputs[0], "Mul")
        if m2 is not None and other_input(m2, m1.outputs[0]) == x:
            return m2, [a, m1, m2]
    return None


def _emit_gelu(ed: Editor, x: str, out: str, approximate: str, base: str, remove: list[Node], form: str) -> bool:
    """Replace ``remove`` by the Gelu that fits ``x``: the standard op (opset >= 20), else the
    ``com.microsoft`` one (float32), whichever the CPU provider runs."""
    dt = ed.dtype(x)
    candidates = []
    if ed.opset("") >= 20 and dt in FLOATS:
        candidates.append(("Gelu", "", {"approximate": approximate}))
    if dt == F32:
        candidates.append(("Gelu" if approximate == "none" else "FastGelu", MS_DOMAIN, {}))
    for op, domain, attrs in candidates:
        new = ed.g.make_node(op, [x], [out], name=ed.fresh(base + "_gelu"), domain=domain, attrs=attrs)
        if not ed.can_emit(new):
            continue
        if domain:
            ed.ensure_opset(domain)
        if ed.replace(remove, [new]):
            ed.log("%s form -> %s %s", form, op, new.name)
            return True
        return False
    return False


class GeluFusion(RewriteRule):
    """``x * 0.5 * (1 + erf(x / sqrt(2)))`` (any order; ``/ sqrt 2`` or ``* 1/sqrt 2``) ->
    ``Gelu`` (opset >= 20) or ``com.microsoft.Gelu``."""

    name = "GeluFusion"
    level = EXTENDED
    targets = frozenset({"Erf"})

    def rewrite(self, ed: Editor, e: Node) -> bool:
        u = e.inputs[0]
        pu = ed.producer(u)
        if pu is None or pu.domain != "" or not ed.single_use(u, e):
            return False
        x = None
        if pu.op_type == "Div" and near(ed.scalar(pu.inputs[1]), math.sqrt(2.0)):
            x = pu.inputs[0]
        elif pu.op_type == "Mul":
            for cand in pu.inputs:
                if near(scalar_operand(ed, pu, cand), 1.0 / math.sqrt(2.0)):
                    x = cand
                    break
        if x is None:
            return False
        tail = _gelu_tail(ed, e.outputs[0], x)
        if tail is None:
            return False
        final, nodes = tail
        return _emit_gelu(ed, x, final.outputs[0], "none", e.name, [pu, e, *nodes], "erf")


class FastGeluFusion(RewriteRule):
    """``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`` (x^3 as ``Pow(x, 3)`` or
    ``x * x * x``) -> ``Gelu(approximate="tanh")`` (opset >= 20) or ``com.microsoft.FastGelu``."""

    name = "FastGeluFusion"
    level = EXTENDED
    targets = frozenset({"Tanh"})

    def rewrite(self, ed: Editor, t: Node) -> bool:
        got = self._inner(ed, t)
        if got is None:
            return False
        x, inner_nodes = got
        tail = _gelu_tail(ed, t.outputs[0], x)
        if tail is None:
            return False
        final, nodes = tail
        return _emit_gelu(ed, x, final.outputs[0], "tanh", t.name, [*inner_nodes, t, *nodes], "tanh")

    @staticmethod
    def _inner(ed: Editor, t: Node):
        u = t.inputs[0]
        k = op_of(ed, u, "Mul")
        if k is None or not ed.single_use(u, t):
            return None
        for inner in k.inputs:
            if not near(scalar_operand(ed, k, inner), math.sqrt(2.0 / math.pi)):
                continue
            add = op_of(ed, inner, "Add")
            if add is None or not ed.single_use(inner, k):
                continue
            for x in add.inputs:
                w = other_input(add, x)
                cm = op_of(ed, w, "Mul")
                if cm is None or not ed.single_use(w, add):
                    continue
                for cube in cm.inputs:
                    if not near(scalar_operand(ed, cm, cube), 0.044715):
                        continue
                    cn = _FastCube.match(ed, cube, x, cm)
                    if cn is not None:
                        return x, [*cn, cm, add, k]
        return None


class _FastCube:
    @staticmethod
    def match(ed: Editor, cube: str, x: str, reader: Node):
        """Nodes computing ``x**3`` into ``cube`` (read only by ``reader``), or None."""
        if not ed.single_use(cube, reader):
            return None
        p = op_of(ed, cube, "Pow")
        if p is not None and p.inputs[0] == x and ed.scalar(p.inputs[1]) == 3.0:
            return [p]
        m = op_of(ed, cube, "Mul")
        if m is None:
            return None
        sq = other_input(m, x)
        if sq is None:
            return None
        s = op_of(ed, sq, "Mul")
        if s is not None and s.inputs == [x, x] and ed.single_use(sq, m):
            return [s, m]
        return None


# -- BiasGelu -------------------------------------------------------------------------

class BiasGeluFusion(RewriteRule):
    """``Add(x, bias)`` (bias a constant vector of x's last dim) feeding an erf ``Gelu`` ->
    ``com.microsoft.BiasGelu``; feeding a tanh Gelu / ``FastGelu`` -> ``FastGelu(x, bias)``."""

    name = "BiasGeluFusion"
    level = EXTENDED
    targets = frozenset({"Gelu", MS_DOMAIN + "::Gelu", MS_DOMAIN + "::FastGelu"})

    def rewrite(self, ed: Editor, g: Node) -> bool:
        if g.domain == "":
            target = "BiasGelu" if g.attrs.get("approximate") == "none" else "FastGelu"
        elif g.op_type == "Gelu":
            target = "BiasGelu"
        elif len([i for i in g.inputs if i]) == 1:
            target = "FastGelu"
        else:
            return False
        s = g.inputs[0]
        add = op_of(ed, s, "Add")
        if add is None or not ed.single_use(s, g) or ed.dtype(s) != F32:
            return False
        shape = ed.shape(s)
        if not shape or not isinstance(shape[-1], int):
            return False
        for x, b in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
            bv = ed.const(b)
            if bv is None or bv.shape != (shape[-1],) or ed.const(x) is not None:
                continue
            sx = ed.shape(x)
            if sx is None or len(sx) != len(shape) or sx[-1] != shape[-1]:
                continue
            new = ed.new_node(target, [x, b], [g.outputs[0]], base=g.name + "_bias", domain=MS_DOMAIN)
            if ed.replace([add, g], [new]):
                ed.log("%s + %s -> %s", add.name, g.name, target)
                return True
            return False
        return False
