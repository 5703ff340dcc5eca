"""Extended passes for layer normalization: the decomposed form becomes
``LayerNormalization`` (opset >= 17) or ``com.microsoft.SkipLayerNormalization``, and a
``LayerNormalization`` of a residual ``Add`` becomes ``SkipLayerNormalization``."""

from __future__ import annotations

import numpy as np

from ..graph.ir import Node
from .editor import EXTENDED, MS_DOMAIN, Editor, same_dim
from .match import F32, FLOATS, const_vector, last_axis, op_of, only_reader, other_input, reduce_axes, scalar_operand
from .rewrite import RewriteRule


def _skip_layer_norm(ed: Editor, s: str, gamma: str, beta: str | None, eps: float, out: str,
                     pattern: list[Node], base: str) -> bool:
    """Replace ``LN(s)`` (its nodes: ``pattern``) by ``SkipLayerNormalization`` when ``s`` is
    an ``Add`` whose operands fit it (onnxruntime's shape rules: input rank 2 or 3, skip
    with the same last two dims, skip's batch equal or 1). A constant-vector ``Add`` on one
    operand becomes the ``bias`` input. ``s`` may have other readers: it is output 3."""
    add = op_of(ed, s, "Add")
    if add is None or len(add.inputs) != 2 or ed.dtype(s) != F32:
        return False
    ss = ed.shape(s)
    if ss is None or len(ss) not in (2, 3) or not isinstance(ss[-1], int):
        return False
    d = ss[-1]
    for inp, skip in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        si, sk = ed.shape(inp), ed.shape(skip)
        if si is None or sk is None or len(si) != len(ss) or len(sk) not in (2, 3) or len(sk) > len(si):
            continue
        if not all(same_dim(a, b) for a, b in zip(si, ss)):
            continue
        if not (same_dim(sk[-1], d) and same_dim(sk[-2], si[-2])):
            continue
        if len(sk) == 3 and not (sk[0] == 1 or same_dim(sk[0], si[0])):
            continue
        if ed.const(inp) is not None or ed.const(skip) is not None:
            continue
        remove = [add, *pattern]
        inputs = [inp, skip, gamma, beta or ""]
        b_add = op_of(ed, skip, "Add")
        if b_add is not None and ed.single_use(skip, add):
            for m, c in ((b_add.inputs[0], b_add.inputs[1]), (b_add.inputs[1], b_add.inputs[0])):
                cv = ed.const(c)
                sm = ed.shape(m)
                if (cv is not None and cv.shape == (d,) and cv.dtype == F32 and sm is not None
                        and len(sm) == len(sk) and all(same_dim(a, b) for a, b in zip(sm, sk))
                        and ed.const(m) is None):
                    inputs = [inp, m, gamma, beta or "", c]
                    remove.append(b_add)
                    break
        while inputs and not inputs[-1]:
            inputs.pop()
        readers_outside = [c for c in ed.consumers(s) if all(c is not p for p in pattern)]
        outputs = [out] if not readers_outside and not ed.is_output(s) else [out, "", "", s]
        new = ed.new_node("SkipLayerNormalization", inputs, outputs, base=base + "_skipln", domain=MS_DOMAIN,
                          attrs={"epsilon": float(eps)})
        if ed.replace(remove, [new]):
            ed.log("%s -> SkipLayerNormalization %s%s", base, new.name, " (+bias)" if len(inputs) == 5 else "")
            return True
    return False


def _ln_params(ed: Editor, d, gamma: str | None, beta: str | None, dtype):
    """Names of a gamma/beta pair usable by LayerNormalization (vectors of size ``d``),
    creating them when the pattern had none; None when they do not fit."""
    if not isinstance(d, int):
        return None
    if gamma is None:
        g = ed.add_const(np.ones(d, dtype), "ln_scale")
    else:
        v = const_vector(ed, gamma, d)
        if v is None or v.dtype != dtype:
            return None
        g = gamma if ed.const(gamma).shape == (d,) else ed.add_const(v, gamma + "_vec")
    b = None
    if beta is not None:
        v = const_vector(ed, beta, d)
        if v is None or v.dtype != dtype:
            return None
        b = beta if ed.const(beta).shape == (d,) else ed.add_const(v, beta + "_vec")
    return g, b


class LayerNormFusion(RewriteRule):
    """The decomposed layer norm ``(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * g + b``
    over the last axis (ReduceMean, Sub, Pow 2 or Mul, ReduceMean, Add eps, Sqrt, Div, Mul,
    Add) -> ``LayerNormalization`` (opset >= 17), or, below opset 17, when ``x`` is an
    ``Add`` that fits, ``com.microsoft.SkipLayerNormalization``."""

    name = "LayerNormFusion"
    level = EXTENDED
    targets = frozenset({"ReduceMean"})

    def rewrite(self, ed: Editor, r1: Node) -> bool:
        got = self._match(ed, r1)
        if got is None:
            return False
        x, gamma, beta, eps, out, nodes = got
        dt = ed.dtype(x)
        shape = ed.shape(x)
        d = shape[-1] if shape else None
        params = _ln_params(ed, d, gamma, beta, dt)
        if params is None:
            return False
        g, b = params
        if ed.opset("") >= 17:
            new = ed.new_node("LayerNormalization", [x, g] + ([b] if b else []), [out], base=r1.name + "_ln",
                              attrs={"axis": -1, "epsilon": float(eps), "stash_type": 1})
            if ed.replace(nodes, [new]):
                ed.log("decomposed form -> LayerNormalization %s", new.name)
                return True
            return False
        return _skip_layer_norm(ed, x, g, b, eps, out, nodes, r1.name)

    @staticmethod
    def _match(ed: Editor, r1: Node):
        x = r1.inputs[0]
        rank = ed.rank(x)
        if ed.dtype(x) not in FLOATS or not last_axis(reduce_axes(ed, r1), rank) or not r1.attrs.get("keepdims", 1):
            return None
        sub = only_reader(ed, r1.outputs[0], "Sub")
        if sub is None or sub.inputs != [x, r1.outputs[0]]:
            return None
        dd = sub.outputs[0]
        readers = ed.consumers(dd)
        if ed.is_output(dd) or ed.is_implicit(dd) or len(readers) != 2:
            return None
        sq = next((n for n in readers if n.domain == "" and (
            (n.op_type == "Pow" and n.inputs[0] == dd and ed.scalar(n.inputs[1]) == 2.0)
            or (n.op_type == "Mul" and n.inputs == [dd, dd]))), None)
        div = next((n for n in readers if n.op_type == "Div" and n.domain == "" and n.inputs[0] == dd), None)
        if sq is None or div is None or sq is div:
            return None
        r2 = only_reader(ed, sq.outputs[0], "ReduceMean")
        if r2 is None or not last_axis(reduce_axes(ed, r2), rank) or not r2.attrs.get("keepdims", 1):
            return None
        ae = only_reader(ed, r2.outputs[0], "Add")
        if ae is None:
            return None
        eps = scalar_operand(ed, ae, r2.outputs[0])
        if eps is None or not eps >= 0:
            return None
        sq_root = only_reader(ed, ae.outputs[0], "Sqrt")
        if sq_root is None or div.inputs[1] != sq_root.outputs[0] or not ed.single_use(sq_root.outputs[0], div):
            return None
        nodes = [r1, sub, sq, r2, ae, sq_root, div]
        out = div.outputs[0]
        gamma = beta = None
        mul = only_reader(ed, out, "Mul")
        if mul is not None:
            g = other_input(mul, out)
            if g is not None and ed.const(g) is not None:
                gamma, out = g, mul.outputs[0]
                nodes.append(mul)
        badd = only_reader(ed, out, "Add")
        if badd is not None:
            b = other_input(badd, out)
            if b is not None and ed.const(b) is not None:
                beta, out = b, badd.outputs[0]
                nodes.append(badd)
        return x, gamma, beta, eps, out, nodes


class SkipLayerNormFusion(RewriteRule):
    """``LayerNormalization(a + b)`` over the last axis (constant vector scale and bias,
    stash_type 1, only output 0 used) -> ``com.microsoft.SkipLayerNormalization``, taking a
    bias ``Add`` on the skip operand along (see ``_skip_layer_norm`` for the shape rules)."""

    name = "SkipLayerNormFusion"
    level = EXTENDED
    targets = frozenset({"LayerNormalization"})

    def condition(self, ed: Editor, ln: Node) -> bool:
        if any(o and (ed.consumers(o) or ed.is_output(o)) for o in ln.outputs[1:]):
            return False
        return ln.attrs.get("stash_type", 1) == 1 and last_axis([ln.attrs.get("axis", -1)], ed.rank(ln.inputs[0]))

    def rewrite(self, ed: Editor, ln: Node) -> bool:
        shape = ed.shape(ln.inputs[0])
        d = shape[-1] if shape else None
        gamma = ln.inputs[1]
        beta = ln.inputs[2] if len(ln.inputs) > 2 and ln.inputs[2] else None
        if const_vector(ed, gamma, d) is None or ed.const(gamma).ndim != 1:
            return False
        if beta is not None and (const_vector(ed, beta, d) is None or ed.const(beta).ndim != 1):
            return False
        return _skip_layer_norm(ed, ln.inputs[0], gamma, beta, ln.attrs.get("epsilon", 1e-5), ln.outputs[0],
                                [ln], ln.name)
