"""Pass at level ALL: the transposes and scalar scales around a product of two computed tensors
(attention's ``Q @ K^T`` and ``P @ V`` where no attention fusion took them, e.g. in dynamically
quantized models whose projections are int8 ops) -> one ``com.microsoft.FusedMatMul``, as
onnxruntime's MatmulTransposeFusion and MatMulScaleFusion make it::

    y = (Transpose(a) [* c | / c]) @ (Transpose(b) [* c | / c])  [* c | / c]
    ->  y = FusedMatMul(a, b, alpha=prod(c), transA, transB)

Each Transpose folded swaps the last two axes only (``perm`` = [0, .., r-3, r-1, r-2]), each
scale is a float32 constant of one element that does not raise the rank, and every folded node
is read by the next step alone. The kernel reads the transposed operands in place (no copy) and
applies ``alpha`` to the fresh product. Level ALL, after the extended passes have converged, so
that the attention fusions still see the plain MatMuls they match; products by a constant
(Linear layers) are left to the MatMul/Gemm fusions and the Linear kernel.

Then ``Softmax(FusedMatMul(q, k^T) [+ bias]) @ v`` on heads of one shape becomes
``runtime_core.fused::ScaledDotProductAttention`` (``ScaledDotProductFusion``).
"""

from __future__ import annotations

import numpy as np

from ..graph.ir import Node
from .editor import ALL, FUSED_DOMAIN, MS_DOMAIN, Editor
from .match import only_reader
from .rewrite import RewriteRule

_F32 = np.dtype(np.float32)


def _swaps_last_two(n: Node) -> bool:
    perm = list(n.attrs.get("perm") or [])
    r = len(perm)
    return r >= 2 and perm == list(range(r - 2)) + [r - 1, r - 2]


def _scale_of(ed: Editor, n: Node, x: str) -> float | None:
    """The factor a Mul/Div by a one-element float32 constant applies to ``x`` (None: not one)."""
    if n.domain or n.op_type not in ("Mul", "Div") or len(n.inputs) != 2 or x not in n.inputs:
        return None
    other = n.inputs[1] if n.inputs[0] == x else n.inputs[0]
    if n.op_type == "Div" and n.inputs[1] != other:
        return None  # c / x is no scale of x
    c = ed.const(other)
    if c is None or c.dtype != _F32 or c.size != 1 or other == x:
        return None
    rx = ed.rank(x)
    if rx is None or c.ndim > rx:  # a [1, 1, 1] constant would raise a lower rank
        return None
    v = float(c.reshape(-1)[0])
    if n.op_type == "Div":
        return None if v == 0.0 else 1.0 / v
    return v


class MatMulTransposeFusion(RewriteRule):
    """``MatMul`` of two computed float32 tensors of rank >= 2 with last-two-axes Transposes
    and scalar Mul/Div on its operands or result -> ``com.microsoft.FusedMatMul``."""

    name = "MatMulTransposeFusion"
    level = ALL
    targets = frozenset({"MatMul"})

    def rewrite(self, ed: Editor, mm: Node) -> bool:
        if mm.domain or len(mm.inputs) != 2 or mm.inputs[0] == mm.inputs[1]:
            return False
        a, b = mm.inputs
        if ed.const(b) is not None or ed.dtype(a) != _F32 or ed.dtype(b) != _F32:
            return False
        ra, rb = ed.rank(a), ed.rank(b)
        if ra is None or rb is None or ra < 2 or rb < 2:
            return False
        alpha = 1.0
        group: list[Node] = [mm]
        srcs, trans, readers = [], [], []
        for x in (a, b):
            src, t, reader = x, False, mm
            for _ in range(3):  # a Transpose and a scale, in either order
                p = ed.producer(src)
                if p is None or p.domain or not ed.single_use(src, reader):
                    break
                if p.op_type == "Transpose" and not t and _swaps_last_two(p):
                    t, nxt = True, p.inputs[0]
                elif p.op_type in ("Mul", "Div"):
                    const_first = p.op_type == "Mul" and ed.const(p.inputs[0]) is not None
                    nxt = p.inputs[1] if const_first else p.inputs[0]
                    f = _scale_of(ed, p, nxt)
                    if f is None or ed.rank(nxt) != ed.rank(src):
                        break
                    alpha *= f
                else:
                    break
                group.append(p)
                src, reader = nxt, p
            srcs.append(src)
            trans.append(t)
            readers.append(reader)
        if any(ed.const(x) is not None for x in srcs):
            return False  # a tied weight's unfolded Transpose: the Linear path reads it in place, unpacked
        extra = self._heads_of_k(ed, srcs, trans, readers[1], group)
        out = mm.outputs[0]
        post = only_reader(ed, out, ("Mul", "Div"))
        if post is not None:
            f = _scale_of(ed, post, out)
            if f is not None and ed.rank(post.outputs[0]) == ed.rank(out):
                alpha *= f
                group.append(post)
                out = post.outputs[0]
        if len(group) == 1 or len({id(n) for n in group}) != len(group):
            return False
        attrs = {"alpha": float(np.float32(alpha)), "transA": int(trans[0]), "transB": int(trans[1])}
        node = ed.new_node("FusedMatMul", srcs, [out], base=mm.name + "_fused", domain=MS_DOMAIN, attrs=attrs)
        if ed.replace(group, extra + [node], at=mm):
            ed.log("%s: FusedMatMul (transA=%d, transB=%d, alpha=%g; %d nodes)", mm.name, trans[0], trans[1],
                   alpha, len(group))
            return True
        return False

    @staticmethod
    def _heads_of_k(ed: Editor, srcs: list, trans: list, reader: Node, group: list) -> list:
        """GPT-2's K^T = Transpose(k, [0, 2, 3, 1]) as Transpose(k, [0, 2, 1, 3]) read transposed
        (the same copy), where that gives the q operand's own shape: K in the heads' layout, as the
        ScaledDotProductFusion takes it. Edits ``srcs``/``trans``/``group``; returns the new node."""
        p = ed.producer(srcs[1])
        if (trans[1] or p is None or p.domain or p.op_type != "Transpose" or not ed.single_use(srcs[1], reader)
                or not ed.single_use(srcs[1])):
            return []
        perm = list(p.attrs.get("perm") or [])
        x_shape, q_shape = ed.shape(p.inputs[0]), ed.shape(srcs[0])
        if len(perm) < 3 or x_shape is None or q_shape is None or len(x_shape) != len(perm):
            return []
        perm = perm[:-2] + [perm[-1], perm[-2]]
        heads = tuple(x_shape[i] for i in perm)
        if any(d is None for d in heads) or heads != tuple(q_shape):
            return []
        out = ed.fresh(srcs[1] + "_heads")
        t = ed.new_node("Transpose", [p.inputs[0]], [out], base=p.name + "_heads", attrs={"perm": perm})
        ed.set_type(out, _F32, heads)
        group.append(p)
        srcs[1], trans[1] = out, True
        return [t]


class ScaledDotProductFusion(RewriteRule):
    """``MatMul(Softmax(FusedMatMul(q, k, transB=1, alpha) [+ bias | masked by Where], axis=-1), v)``
    (a Where with a fill of at most -1e30 becomes the bias ``Where(c, 0, fill)``) with q, k, v of
    one shape [..., S, d] (float32, rank >= 3, every dim known or named) ->
    ``runtime_core.fused::ScaledDotProductAttention(q, k, v[, bias], scale=alpha)``: attention whose
    projections the attention fusion does not take (int8 ones), on the compiled per-head kernel.
    A later stage than MatMulTransposeFusion (it starts from the FusedMatMul that one makes);
    written back as the four ops in a saved model (``portable.py``)."""

    name = "ScaledDotProductFusion"
    level = ALL
    stage = 1
    targets = frozenset({"Softmax"})

    def rewrite(self, ed: Editor, sm: Node) -> bool:
        x = sm.inputs[0]
        r = ed.rank(x)
        if r is None or r < 3 or sm.attrs.get("axis", -1) not in (-1, r - 1) or not ed.single_use(x, sm):
            return False
        group, bias, extra = [sm], "", None
        p = ed.producer(x)
        if p is not None and not p.domain and p.op_type == "Add" and len(p.inputs) == 2:
            fm_in = next((i for i in p.inputs if self._qk(ed, i) is not None), None)
            if fm_in is None or not ed.single_use(fm_in, p):
                return False
            bias = p.inputs[1] if p.inputs[0] == fm_in else p.inputs[0]
            if ed.dtype(bias) != _F32 or (ed.rank(bias) or 99) > r:
                return False
            group.append(p)
            x = fm_in
        elif p is not None and not p.domain and p.op_type == "Where" and len(p.inputs) == 3:
            where = self._mask_where(ed, p)
            if where is None:
                return False
            x, extra = where
            group.append(p)
        fm = self._qk(ed, x)
        if fm is None:
            return False
        group.append(fm)
        mm = ed.consumers(sm.outputs[0])[0] if ed.single_use(sm.outputs[0]) else None
        if mm is None or mm.domain or mm.op_type != "MatMul" or mm.inputs[0] != sm.outputs[0]:
            return False
        group.append(mm)
        q, k = fm.inputs
        v = mm.inputs[1]
        shapes = [ed.shape(n) for n in (q, k, v)]
        if (any(s is None or len(s) != r or any(d is None for d in s) for s in shapes)
                or not shapes[0] == shapes[1] == shapes[2] or any(ed.dtype(n) != _F32 for n in (q, k, v))):
            return False
        if extra is not None:
            bias = extra.outputs[0]
        ins = [q, k, v] + ([bias] if bias else [])
        node = ed.new_node("ScaledDotProductAttention", ins, [mm.outputs[0]], base=sm.name + "_sdpa",
                           domain=FUSED_DOMAIN, attrs={"scale": float(fm.attrs.get("alpha", 1.0))})
        if ed.replace(group, ([extra] if extra is not None else []) + [node], at=mm):
            ed.log("%s: ScaledDotProductAttention (%d nodes)", sm.name, len(group))
            return True
        return False

    def _mask_where(self, ed: Editor, w: Node):
        """``Where(c, scores, fill)`` / ``Where(c, fill, scores)`` with a constant fill of at most -1e30
        (it absorbs any real score, so adding it is exact): (the scores, a new node computing the
        bias ``Where(c, 0, fill)``), else None."""
        cond, a, b = w.inputs
        for scores, other, fill_first in ((a, b, False), (b, a, True)):
            f = ed.scalar(other)
            if self._qk(ed, scores) is None or not ed.single_use(scores, w) or f is None or f > -1e30:
                continue
            if ed.dtype(other) != _F32:
                return None
            zero = ed.add_const(np.zeros((), np.float32), "sdpa_zero")
            out = ed.fresh(w.outputs[0] + "_bias")
            ins = [cond, other, zero] if fill_first else [cond, zero, other]
            node = ed.new_node("Where", ins, [out], base=w.name + "_bias")
            ed.set_type(out, _F32, ed.shape(cond))
            return scores, node
        return None

    @staticmethod
    def _qk(ed: Editor, name: str) -> Node | None:
        """The FusedMatMul q @ k^T producing ``name``."""
        n = ed.producer(name)
        if (n is None or n.domain != MS_DOMAIN or n.op_type != "FusedMatMul" or len(n.inputs) != 2
                or n.attrs.get("transA", 0) or not n.attrs.get("transB", 0) or n.attrs.get("transBatchA", 0)
                or n.attrs.get("transBatchB", 0)):
            return None
        return n
