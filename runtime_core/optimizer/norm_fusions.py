"""Extended passes for layer normalization: the decomposed form becomes
``LayerNormalization`` (opset >= 17) or ``com.microsoft.SkipLayerNormalization``, and a
``LayerNormalization`` of a residual ``Add`` becomes ``SkipLayerNormalization``. The same for
RMSNorm (T5's ``x * rsqrt(mean(x^2) + eps) * w``): ``com.microsoft.SimplifiedLayerNormalization``,
or ``com.microsoft.SkipSimplifiedLayerNormalization`` of a residual ``Add``."""

from __future__ import annotations

import numpy as np

from ..graph.ir import Node
from .editor import EXTENDED, MS_DOMAIN, Editor, same_dim
from .match import (F32, FLOATS, const_vector, last_axis, near, op_of, only_reader, other_input, reduce_axes,
                    scalar_operand)
from .rewrite import RewriteRule


def _skip_layer_norm(ed: Editor, s: str, gamma: str, beta: str | None, eps: float, out: str,
                     pattern: list[Node], base: str, simplified: bool = False) -> bool:
    """Replace ``LN(s)`` (its nodes: ``pattern``) by ``SkipLayerNormalization`` when ``s`` is
    an ``Add`` whose operands fit it (onnxruntime's shape rules: input rank 2 or 3, skip
    with the same last two dims, skip's batch equal or 1). A constant-vector ``Add`` on one
    operand becomes the ``bias`` input. ``s`` may have other readers: it is output 3.
    ``simplified``: ``RMSNorm(s)`` -> ``SkipSimplifiedLayerNormalization`` (no beta)."""
    op = "SkipSimplifiedLayerNormalization" if simplified else "SkipLayerNormalization"
    add = op_of(ed, s, "Add")
    if add is None or len(add.inputs) != 2 or ed.dtype(s) != F32:
        return False
    ss = ed.shape(s)
    if ss is None or len(ss) not in (2, 3) or not isinstance(ss[-1], int):
        return False
    d = ss[-1]
    # either operand may be the skip: the order whose skip is a bias Add (a projection's
    # output, as ``dense(x) + x`` writes it) takes that Add along, else the first that fits
    found = [f for inp, skip in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0]))
             if (f := _skip_operands(ed, add, inp, skip, ss, d)) is not None]
    if not found:
        return False
    inp, skip, b_add, bias = next((f for f in found if f[2] is not None), found[0])
    remove = [add, *pattern] + ([b_add] if b_add is not None else [])
    params = [gamma] if simplified else [gamma, beta or ""]
    inputs = [inp, skip, *params] + ([bias] if bias else [])
    while inputs and not inputs[-1]:
        inputs.pop()
    readers_outside = [c for c in ed.consumers(s) if all(c is not p for p in pattern)]
    outputs = [out] if not readers_outside and not ed.is_output(s) else [out, "", "", s]
    new = ed.new_node(op, inputs, outputs, base=base + "_skipln", domain=MS_DOMAIN,
                      attrs={"epsilon": float(eps)})
    if ed.replace(remove, [new]):
        ed.log("%s -> %s %s%s", base, op, new.name, " (+bias)" if bias else "")
        return True
    return False


def _skip_operands(ed: Editor, add: Node, inp: str, skip: str, ss, d):
    """``(input, skip, bias Add or None, bias or None)`` when ``inp`` and ``skip`` (the two
    operands of ``add``, whose sum has shape ``ss``) fit SkipLayerNormalization that way
    round; a constant-vector ``Add`` on the skip, read only there, becomes its bias."""
    si, sk = ed.shape(inp), ed.shape(skip)
    if si is None or sk is None or len(si) != len(ss) or len(sk) not in (2, 3) or len(sk) > len(si):
        return None
    if not all(same_dim(a, b) for a, b in zip(si, ss)):
        return None
    if not (same_dim(sk[-1], d) and same_dim(sk[-2], si[-2])):
        return None
    if len(sk) == 3 and not (sk[0] == 1 or same_dim(sk[0], si[0])):
        return None
    if ed.const(inp) is not None:
        return None  # a constant skip stays (ViT's position table added to the patches)
    b_add = op_of(ed, skip, "Add")
    if b_add is not None and ed.single_use(skip, add):
        for m, c in ((b_add.inputs[0], b_add.inputs[1]), (b_add.inputs[1], b_add.inputs[0])):
            cv = ed.const(c)
            sm = ed.shape(m)
            if (cv is not None and cv.shape == (d,) and cv.dtype == F32 and sm is not None
                    and len(sm) == len(sk) and all(same_dim(a, b) for a, b in zip(sm, sk))
                    and ed.const(m) is None):
                return inp, m, b_add, c
    return inp, skip, None, None


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
    simplified = False  # the norm has no centering (and no beta): the Skip op is the simplified one

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
                                [ln], ln.name, simplified=self.simplified)


def _is_centered(ed: Editor, x: str) -> bool:
    """``x`` is ``Sub(a, ReduceMean(a))``: the variance half of a layer norm, left to LayerNormFusion."""
    sub = op_of(ed, x, "Sub")
    r = op_of(ed, sub.inputs[1], "ReduceMean") if sub is not None and len(sub.inputs) == 2 else None
    return r is not None and r.inputs[0] == sub.inputs[0]


class RMSNormFusion(RewriteRule):
    """The decomposed RMSNorm ``x * 1 / sqrt(mean(x^2) + eps) * w`` over the last axis ->
    ``com.microsoft.SimplifiedLayerNormalization``, or, when ``x`` is an ``Add`` that fits,
    ``com.microsoft.SkipSimplifiedLayerNormalization``. Accepted forms (what TorchScript,
    dynamo and hand-written exports write): the square as ``Pow(x, 2)`` or ``Mul(x, x)``;
    ``ReduceMean`` (keepdims) then ``Add(eps)``; then ``Sqrt`` with ``Div(1, .)``,
    ``Reciprocal`` or ``Div(x, .)``, or ``Pow(., -0.5)``; a ``Mul`` by
    ``x`` on either side, and an optional ``Mul`` by a constant weight vector on either side."""

    name = "RMSNormFusion"
    level = EXTENDED
    targets = frozenset({"ReduceMean"})

    def rewrite(self, ed: Editor, r: Node) -> bool:
        got = self._match(ed, r)
        if got is None:
            return False
        x, gamma, eps, out, nodes = got
        shape = ed.shape(x)
        d = shape[-1] if shape else None
        params = _ln_params(ed, d, gamma, None, ed.dtype(x))
        if params is None:
            return False
        g = params[0]
        if _skip_layer_norm(ed, x, g, None, eps, out, nodes, r.name, simplified=True):
            return True
        if ed.opset("") < 23:
            # onnxruntime has SimplifiedLayerNormalization only in its own ai.onnx registry, not in
            # com.microsoft: emitting it would make a saved optimized model unloadable there
            return False
        new = ed.new_node("RMSNormalization", [x, g], [out], base=r.name + "_rms",
                          attrs={"axis": -1, "epsilon": float(eps), "stash_type": 1})
        if ed.replace(nodes, [new]):
            ed.log("decomposed form -> RMSNormalization %s", new.name)
            return True
        return False

    @staticmethod
    def _match(ed: Editor, r: Node):
        sq = op_of(ed, r.inputs[0], "Pow") or op_of(ed, r.inputs[0], "Mul")
        if sq is None or len(sq.inputs) != 2 or not ed.single_use(sq.outputs[0], r):
            return None
        x = sq.inputs[0]
        if not (sq.inputs[1] == x if sq.op_type == "Mul" else ed.scalar(sq.inputs[1]) == 2.0):
            return None
        rank = ed.rank(x)
        if (ed.dtype(x) not in FLOATS or not last_axis(reduce_axes(ed, r), rank) or not r.attrs.get("keepdims", 1)
                or _is_centered(ed, x)):
            return None
        ae = only_reader(ed, r.outputs[0], "Add")
        eps = None if ae is None else scalar_operand(ed, ae, r.outputs[0])
        if eps is None or not eps >= 0:
            return None
        nodes = [sq, r, ae]
        nxt = only_reader(ed, ae.outputs[0], ("Sqrt", "Pow"))
        if nxt is None:
            return None
        nodes.append(nxt)
        v = nxt.outputs[0]
        if nxt.op_type == "Pow":  # (ms + eps) ^ -0.5: the inverse itself
            if nxt.inputs[0] != ae.outputs[0] or not near(ed.scalar(nxt.inputs[1]), -0.5):
                return None
            inv = v
        else:
            inv_node = only_reader(ed, v, ("Reciprocal", "Div"))
            if inv_node is None:
                return None
            if inv_node.op_type == "Div" and inv_node.inputs == [x, v]:  # x / sqrt(..): already normalized
                nodes.append(inv_node)
                return RMSNormFusion._weight(ed, x, eps, inv_node.outputs[0], nodes)
            if inv_node.op_type == "Div" and (inv_node.inputs[1] != v or ed.scalar(inv_node.inputs[0]) != 1.0):
                return None
            nodes.append(inv_node)
            inv = inv_node.outputs[0]
        mul = only_reader(ed, inv, "Mul")
        if mul is None or other_input(mul, inv) != x:
            return None
        nodes.append(mul)
        return RMSNormFusion._weight(ed, x, eps, mul.outputs[0], nodes)

    @staticmethod
    def _weight(ed: Editor, x: str, eps: float, out: str, nodes: list[Node]):
        # a constant weight vector (a scalar or a broadcast tensor stays an outside Mul)
        gamma = None
        shape = ed.shape(x)
        wmul = only_reader(ed, out, "Mul")
        if wmul is not None and shape:
            g = other_input(wmul, out)
            if g is not None and const_vector(ed, g, shape[-1]) is not None:
                gamma, out = g, wmul.outputs[0]
                nodes.append(wmul)
        return x, gamma, eps, out, nodes


class SkipSimplifiedLayerNormFusion(SkipLayerNormFusion):
    """``SimplifiedLayerNormalization`` or ``RMSNormalization`` (opset 23) of ``a + b`` over the
    last axis (constant vector scale, stash_type 1, only output 0 used) ->
    ``com.microsoft.SkipSimplifiedLayerNormalization`` (shape rules as ``_skip_layer_norm``)."""

    name = "SkipSimplifiedLayerNormFusion"
    targets = frozenset({f"{MS_DOMAIN}::SimplifiedLayerNormalization", "RMSNormalization"})
    simplified = True
