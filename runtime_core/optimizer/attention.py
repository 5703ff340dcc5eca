"""Self-attention subgraphs (as PyTorch exports hand-written multi-head attention) ->
one ``com.microsoft.Attention``.

Matched, from the Softmax outwards::

    qkv = x @ W (+ bias)                      W constant [D, 3*hidden], or three
    q, k, v = Split(qkv, 3, axis=-1)          projections x @ Wq, x @ Wk, x @ Wv
    Q = Transpose(Reshape(q, [B, S, H, dk]), [0, 2, 1, 3])   (V the same)
    K = Transpose(Reshape(k, [B, S, H, dk]), [0, 2, 3, 1])
    P = Softmax(Q @ K (/ c | * c) (+ mask), axis=-1)
    y = Reshape(Transpose(P @ V, [0, 2, 1, 3]), [B, S, hidden])

The Reshapes are proven to split/merge only the last axis: their shape inputs
are evaluated symbolically (``shapes.reshape_target``) and must give x's own
batch and sequence dims. The mask becomes

* ``mask_index`` (a raw 2-D int32 mask) for the BERT form
  ``(1 - Cast(Unsqueeze(m, [1, 2]))) * c`` with ``m`` of shape [B, S] (or dims
  not known to differ: the kernel broadcasts a [1|B, 1|S] mask); with
  ``mask_filter_value = c`` this is exact for the 0/1 masks the form is written
  for (onnxruntime's own fusion makes the same reading);
* ``attention_bias`` for any other additive mask of shape [B|1, H|1, S, S]
  (rank-2 and rank-3 masks are unsqueezed to that), e.g. a causal mask; dims
  that are unknown are accepted (see ``_bias_mask``), dims known to differ
  (e.g. the [B, 1, 1, S] padding mask when it is not the raw form) are not;

* for ``Where(cond, fill, scores)`` / ``Where(cond, scores, fill)`` with a fill of at most
  -1e30 (which absorbs any real score, so adding it is exact): ``mask_index`` =
  ``m != 0`` when cond is DistilBERT's ``Equal(m, 0)`` laid out as [B, 1, 1, S], else
  ``attention_bias = Where(cond, 0, fill)`` (GPT-2's causal buffer sliced to the length);

and otherwise the subgraph is left alone. SDPA's is_causal bias (dynamo: ``Where(Trilu(ones [S, S]) == 0,
fill, 0)``) becomes ``unidirectional``. Also matched: a scalar scale on the q (and k)
heads or on the q (and k) projection before its heads are split (Whisper's ``q_proj(x) * scaling``),
GPT-2's Conv1D projection ``Reshape(Gemm(Reshape(x, [*, D])), [B, S, N])``, dynamo's
SDPA K^T (``Reshape(Transpose(Reshape(K, [B*H, S, dk]), [0, 2, 1]), [B, H, dk, S])``) and
a context flattened to [B*S, hidden] (that Reshape stays). With dynamic axes the exporters
size every Reshape from ``Shape`` of the value reshaped: those shape computations go with
the pattern, or are re-sourced from x when something else reads them
(``attention_trace._shape_readers``); the dims are compared as symbols after
``shapes.refine_symbols``.
"""

from __future__ import annotations

import numpy as np
import onnx

from ..graph.ir import Node
from .attention_trace import _fuse_traced, _may_be, _need, _NoMatch, _shape_readers, shape_only
from .attention_trace import _linear as _linear2d
from .editor import EXTENDED, MS_DOMAIN, Editor
from .rewrite import RewriteRule
from .shapes import dim_of, reshape_target, shape_tensor

_F32 = np.dtype(np.float32)


def _op(ed, name, op):
    n = ed.producer(name) if name else None
    return n if n is not None and n.op_type == op and n.domain == "" else None


def _data_readers(ed: Editor, name: str) -> list[Node]:
    """The readers of ``name`` other than those reading its dims alone (``shape_only``)."""
    return [c for c in ed.consumers(name) if not shape_only(ed, c)]


def _perm(n: Node):
    return list(n.attrs.get("perm") or [])


class AttentionFusion(RewriteRule):
    name = "AttentionFusion"
    level = EXTENDED
    targets = frozenset({"Softmax"})

    def start(self, ed: Editor) -> bool:
        self._mask_casts: dict[str, str] = {}
        return True

    def rewrite(self, ed: Editor, sm: Node) -> bool:
        try:
            return self._fuse(ed, sm)
        except _NoMatch as why:
            first = why
        try:
            return _fuse_traced(self, ed, sm)
        except _NoMatch as why:
            ed.log("%s: not fused: %s; traced: %s", sm.name, first, why)
        return False

    # -- the match ----------------------------------------------------------------------
    def _fuse(self, ed: Editor, sm: Node) -> bool:
        need = _need
        nodes: list[Node] = [sm]
        axis = sm.attrs.get("axis")
        need(axis in (-1, 3), f"softmax axis {axis}")
        # scores: (Q @ K) [scale] [+ mask | Where(padding, fill, .)], the mask outside the scale
        s_in = sm.inputs[0]
        need(ed.single_use(s_in, sm), "scores read elsewhere")
        mask = where = None
        cur = s_in
        for _ in range(2):
            p = ed.producer(cur)
            if p is not None and p.domain == "" and p.op_type == "Add" and mask is None and where is None:
                nodes.append(p)
                a, b = p.inputs
                # the operand coming from the MatMul side is the scores
                if self._scores_side(ed, a):
                    cur, mask = a, b
                elif self._scores_side(ed, b):
                    cur, mask = b, a
                else:
                    raise _NoMatch("no MatMul behind the mask Add")
                need(ed.single_use(cur, p), "scaled scores read elsewhere")
            elif p is not None and p.domain == "" and p.op_type == "Where" and mask is None and where is None:
                where = self._padding_where(ed, p)
                nodes.append(p)
                cur = where[2]
                # (a Shape of the scores may size the condition's Expand, taken along below)
                need(_data_readers(ed, cur) == [p] and not ed.is_output(cur), "scaled scores read elsewhere")
                ex = _op(ed, where[0], "Expand")
                if ex is not None and ed.single_use(where[0], p):
                    nodes.append(ex)
            else:
                break
        scale = 1.0
        sc = ed.producer(cur)
        need(sc is not None and sc.domain == "", "no producer for scores")
        if sc.op_type in ("Div", "Mul"):
            c = ed.scalar(sc.inputs[1])
            other = sc.inputs[0]
            if c is None and sc.op_type == "Mul":
                c, other = ed.scalar(sc.inputs[0]), sc.inputs[1]
            need(c is not None and c != 0, "non-constant scale")
            scale = 1.0 / c if sc.op_type == "Div" else c
            nodes.append(sc)
            need(ed.single_use(other, sc), "raw scores read elsewhere")
            cur = other
        qk = _op(ed, cur, "MatMul")
        need(qk is not None, "scores are not a MatMul")
        nodes.append(qk)
        qt, kt = qk.inputs
        # P @ V
        pv = ed.consumers(sm.outputs[0])
        need(len(pv) == 1 and pv[0].op_type == "MatMul" and pv[0].inputs[0] == sm.outputs[0]
             and not ed.is_output(sm.outputs[0]), "softmax not read by one MatMul")
        pv = pv[0]
        nodes.append(pv)
        vt = pv.inputs[1]
        # heads: Transpose(Reshape(part))
        # a scalar scale on q (DistilBERT's q / sqrt(d)) or on both (SDPA's sqrt(scale) each)
        readers = []
        for name in (qt, kt):
            qs = _op(ed, name, "Div") or _op(ed, name, "Mul")
            c = None if qs is None else ed.scalar(qs.inputs[1])
            if c not in (None, 0.0) and np.isfinite(c) and ed.single_use(name, qk):
                scale *= 1.0 / c if qs.op_type == "Div" else c
                nodes.append(qs)
                readers.append((qs, qs.inputs[0]))
            else:
                readers.append((qk, name))
        q_part, q_dims, q_nodes = self._head(ed, readers[0][1], readers[0][0], [0, 2, 1, 3])
        k_part, k_dims, k_nodes = self._head(ed, readers[1][1], readers[1][0], [0, 2, 3, 1])
        v_part, v_dims, v_nodes = self._head(ed, vt, pv, [0, 2, 1, 3])
        nodes += q_nodes + k_nodes + v_nodes
        need(q_dims == k_dims == v_dims, "q, k and v split into different heads")
        heads, dk = q_dims
        hidden = heads * dk
        # output: Reshape(Transpose(P @ V, [0, 2, 1, 3]), [B, S, hidden])
        # (Shape readers: the output Reshape's target, checked with the other intermediates)
        tr = _data_readers(ed, pv.outputs[0])
        need(len(tr) == 1 and tr[0].op_type == "Transpose" and _perm(tr[0]) == [0, 2, 1, 3]
             and not ed.is_output(pv.outputs[0]), "context not transposed back")
        tr = tr[0]
        rs = _data_readers(ed, tr.outputs[0])
        need(len(rs) == 1 and rs[0].op_type == "Reshape" and rs[0].inputs[0] == tr.outputs[0]
             and not ed.is_output(tr.outputs[0]), "context not reshaped back")
        rs = rs[0]
        nodes += [tr, rs]
        # a scalar scale on a projection before its heads are split (Whisper's q_proj(x) * scaling)
        parts = []
        for part, head in ((q_part, q_nodes[0]), (k_part, k_nodes[0])):
            ps = _op(ed, part, "Mul") or _op(ed, part, "Div")
            c, other = (None, None) if ps is None else (ed.scalar(ps.inputs[1]), ps.inputs[0])
            if ps is not None and c is None and ps.op_type == "Mul":
                c, other = ed.scalar(ps.inputs[0]), ps.inputs[1]
            if c not in (None, 0.0) and np.isfinite(c) and ed.single_use(part, head) and not ed.is_output(part):
                scale *= 1.0 / c if ps.op_type == "Div" else c
                nodes.append(ps)
                part = other
            parts.append(part)
        q_part, k_part = parts
        # projections
        x, w, bias, proj_nodes = self._projections(ed, q_part, k_part, v_part, hidden)
        nodes += proj_nodes
        need(ed.dtype(x) == _F32, f"dtype {ed.dtype(x)} (Attention is float32 here)")
        xs = ed.shape(x)
        need(xs is not None and len(xs) == 3 and isinstance(xs[2], int) and xs[2] == w.shape[0], "x is not [B, S, D]")
        bdim, sdim = dim_of(ed, x, 0), dim_of(ed, x, 1)
        for part, node in ((q_part, q_nodes[0]), (k_part, k_nodes[0]), (v_part, v_nodes[0])):
            tgt = reshape_target(ed, node)
            need(tgt is not None and len(tgt) == 4 and tgt[0] == bdim and tgt[1] == sdim
                 and tgt[2] == heads and tgt[3] == dk, f"head reshape {tgt} is not [B, S, {heads}, {dk}]")
        tgt = reshape_target(ed, rs)
        # [B*S, hidden] (GPT-2's Conv1D flattening the context itself): the same elements in
        # the same order as Attention's [B, S, hidden] output, so that Reshape stays, reading it
        flat = tgt is not None and len(tgt) == 2 and tgt[1] == hidden and tgt != [bdim, sdim, hidden]
        need(tgt is not None and (tgt == [bdim, sdim, hidden] or flat),
             f"output reshape {tgt} is not [B, S, {hidden}] or [B*S, {hidden}]")
        # every intermediate is read inside the pattern only (or by the shape computations of
        # its own Reshapes, which go with it)
        gone, shape_nodes = _shape_readers(ed, nodes, keep=rs.outputs[0], x=x, stays=rs if flat else None)
        nodes += gone
        remade = {o for m in shape_nodes for o in m.outputs}
        inside = nodes
        for n in nodes:
            if n is rs:
                continue
            for o in n.outputs:
                if o and o not in remade:  # (a re-sourced Shape's output is made again)
                    need(ed.internal(o, inside), f"{o} is read outside the attention")
        # the mask
        extra: list[Node] = list(shape_nodes)
        inputs = [x, None, None]
        attrs = {"num_heads": int(heads), "scale": float(scale), "unidirectional": 0}
        if where is not None:
            try:
                m2d, filt = self._where_mask(ed, where, bdim, sdim)
            except _NoMatch:  # any other condition (e.g. a causal one sliced to the length)
                add_mask = self._where_bias(ed, where, extra)
                inputs += ["", "", self._bias_mask(ed, add_mask, bdim, sdim, heads, extra)]
            else:
                inputs += [self._keep_mask(ed, m2d, extra), ""]
                attrs["mask_filter_value"] = float(filt)
        elif mask is not None:
            raw = self._raw_mask(ed, mask, bdim, sdim)
            if self._causal_mask(ed, mask, sdim):
                # the kernel's own causal cut, which also skips the masked half of the work
                attrs["unidirectional"] = 1
            elif raw is not None:
                m2d, filt = raw
                inputs += [self._int32_mask(ed, m2d, extra), ""]
                attrs["mask_filter_value"] = float(filt)
            else:
                inputs += ["", "", self._bias_mask(ed, mask, bdim, sdim, heads, extra)]
        wn = ed.add_const(w, "attention_qkv_weight")
        bn = ed.add_const(bias, "attention_qkv_bias")
        inputs[1], inputs[2] = wn, bn
        while inputs and not inputs[-1]:
            inputs.pop()
        att_out = ed.fresh(sm.name + "_attention_out") if flat else rs.outputs[0]
        att = ed.new_node("Attention", inputs, [att_out], base=sm.name + "_attention", domain=MS_DOMAIN,
                          attrs=attrs)
        new = extra + [att]
        if flat:
            ed.set_type(att_out, _F32, [d if isinstance(d, (int, str)) else None for d in xs[:2]] + [hidden])
            new.append(ed.new_node("Reshape", [att_out, rs.inputs[1]], [rs.outputs[0]], base=rs.name,
                                   attrs=dict(rs.attrs)))
        if not ed.replace(nodes, new, at=rs):
            self._mask_casts = {k: v for k, v in self._mask_casts.items() if ed.producer(v) is not None}
            return False
        if not flat and ed.shape(rs.outputs[0]) is None:
            ed.set_type(rs.outputs[0], _F32, [d if isinstance(d, (int, str)) else None for d in xs[:2]] + [hidden])
        ed.log("%d nodes -> Attention %s (heads %d, head size %d, mask %s)", len(nodes), att.name, heads, dk,
               "raw 2-D" if "mask_filter_value" in attrs else ("attention_bias" if len(inputs) > 5 else "none"))
        return True

    @staticmethod
    def _scores_side(ed: Editor, name: str) -> bool:
        n = ed.producer(name)
        if n is None or n.domain != "":
            return False
        if n.op_type in ("Div", "Mul"):
            return any(_op(ed, i, "MatMul") is not None for i in n.inputs)
        return n.op_type == "MatMul"

    @staticmethod
    def _k_swapped(ed: Editor, name: str, reader: Node):
        """(heads value, nodes) for dynamo's SDPA K^T: ``Reshape(Transpose(Reshape(T, [B*H, S,
        dk]), [0, 2, 1]), [B, H, dk, S])`` with T = [B, H, S, dk] heads: T's last two axes
        swapped (the Reshapes only merge and split T's first two axes back)."""
        r2 = _op(ed, name, "Reshape")
        if r2 is None or _data_readers(ed, name) != [reader] or ed.is_output(name):
            return None
        t2 = _op(ed, r2.inputs[0], "Transpose")
        if t2 is None or _perm(t2) != [0, 2, 1] or _data_readers(ed, r2.inputs[0]) != [r2]:
            return None
        r1 = _op(ed, t2.inputs[0], "Reshape")
        if r1 is None or _data_readers(ed, t2.inputs[0]) != [t2]:
            return None
        heads = r1.inputs[0]
        d = [dim_of(ed, heads, i) for i in range(4)] if ed.rank(heads) == 4 else None
        t_in, t_out = reshape_target(ed, r1), reshape_target(ed, r2)
        if d is None or t_in is None or len(t_in) != 3 or t_in[1:] != [d[2], d[3]] or t_out != [d[0], d[1], d[3], d[2]]:
            return None
        if _data_readers(ed, heads) != [r1] or ed.is_output(heads):
            return None
        return heads, [r1, t2, r2]

    @classmethod
    def _head(cls, ed: Editor, name: str, reader: Node, perm: list[int]):
        if perm == [0, 2, 3, 1] and _op(ed, name, "Transpose") is None:
            swapped = cls._k_swapped(ed, name, reader)
            if swapped is not None:
                part, dims, nodes = cls._head(ed, swapped[0], swapped[1][0], [0, 2, 1, 3])
                return part, dims, nodes + swapped[1]
        t = _op(ed, name, "Transpose")
        _need(t is not None and _perm(t) == perm and _data_readers(ed, name) == [reader] and not ed.is_output(name),
              f"no Transpose {perm} head")
        r = _op(ed, t.inputs[0], "Reshape")
        _need(r is not None and _data_readers(ed, t.inputs[0]) == [t] and not ed.is_output(t.inputs[0]),
              "no head Reshape")
        tgt = reshape_target(ed, r)
        _need(tgt is not None and len(tgt) == 4 and isinstance(tgt[2], int) and isinstance(tgt[3], int),
              f"head reshape target {tgt}")
        return r.inputs[0], (tgt[2], tgt[3]), [r, t]

    @staticmethod
    def _projections(ed: Editor, q: str, k: str, v: str, hidden: int):
        """(x, W [D, 3*hidden], bias [3*hidden], nodes) from a Split of one projection or
        from three projections of the same x."""
        def linear(name):
            """x, W, b, nodes of ``x @ W (+ b)`` producing ``name``, or of GPT-2's Conv1D form
            ``Reshape(Gemm(Reshape(x, [*, D]), W, b), [B, S, N])``."""
            rs = _op(ed, name, "Reshape")
            if rs is not None:
                got = _linear2d(ed, rs.inputs[0])
                _need(got is not None and ed.single_use(rs.inputs[0], rs), "no projection behind the Reshape")
                x2, w, b, lnodes = got
                inner = _op(ed, x2, "Reshape")
                _need(inner is not None and ed.single_use(x2, lnodes[-1]), "projection input is not flattened x")
                x = inner.inputs[0]
                xs = ed.shape(x)
                _need(xs is not None and len(xs) == 3 and xs[2] == w.shape[0], "projection input is not [B, S, D]")
                t_in, t_out = reshape_target(ed, inner), reshape_target(ed, rs)
                _need(t_in is not None and len(t_in) == 2 and t_in[1] == w.shape[0], f"x flattened to {t_in}")
                _need(t_out == [dim_of(ed, x, 0), dim_of(ed, x, 1), w.shape[1]], f"projection reshaped to {t_out}")
                return x, w, b, [rs, *lnodes, inner]
            nodes = []
            add = _op(ed, name, "Add")
            b = None
            if add is not None:
                for mm_out, c in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
                    mm = _op(ed, mm_out, "MatMul")
                    if mm is not None and ed.const(c) is not None and ed.single_use(mm_out, add):
                        b, name = ed.const(c), mm_out
                        nodes.append(add)
                        break
                else:
                    raise _NoMatch("projection Add is not a bias")
            mm = _op(ed, name, "MatMul")
            _need(mm is not None, "no projection MatMul")
            w = ed.const(mm.inputs[1])
            _need(w is not None and w.ndim == 2 and w.dtype == _F32, "projection weight is not a constant matrix")
            if b is None:
                b = np.zeros(w.shape[1], w.dtype)
            _need(b.shape == (w.shape[1],) and b.dtype == w.dtype, "projection bias is not a vector")
            nodes.append(mm)
            return mm.inputs[0], w, b, nodes

        sp = ed.producer(q)
        if sp is not None and sp.op_type == "Split" and sp.domain == "" and list(sp.outputs) == [q, k, v]:
            _need(ed.rank(sp.inputs[0]) == 3 and (sp.attrs.get("axis") in (2, -1)), "split is not on the last axis")
            sizes = None
            if len(sp.inputs) > 1 and sp.inputs[1]:
                c = ed.const(sp.inputs[1])
                _need(c is not None, "split sizes are not constant")
                sizes = [int(s) for s in c.reshape(-1)]
            elif sp.attrs.get("split"):
                sizes = list(sp.attrs["split"])
            _need(sizes is None or sizes == [hidden] * 3, f"split sizes {sizes}")
            _need(ed.single_use(sp.inputs[0], sp), "qkv read elsewhere")
            x, w, b, nodes = linear(sp.inputs[0])
            _need(w.shape[1] == 3 * hidden, "qkv weight is not [D, 3*hidden]")
            return x, w, b, nodes + [sp]
        parts = [linear(p) for p in (q, k, v)]
        _need(all(p[0] == parts[0][0] for p in parts), "q, k and v project different inputs")
        _need(all(p[1].shape == (parts[0][1].shape[0], hidden) for p in parts), "projection sizes differ")
        w = np.concatenate([p[1] for p in parts], axis=1)
        b = np.concatenate([p[2] for p in parts])
        return parts[0][0], w, b, [n for p in parts for n in p[3]]

    @staticmethod
    def _raw_mask(ed: Editor, mask: str, bdim, sdim):
        """(m, c) for ``mask = (1 - Cast(Unsqueeze(m, [1, 2]))) * c``, m of shape [B, S]."""
        mul = _op(ed, mask, "Mul")
        if mul is None:
            return None
        for sub_out, c in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
            filt = ed.scalar(c)
            sub = _op(ed, sub_out, "Sub")
            if filt is None or sub is None or ed.scalar(sub.inputs[0]) != 1.0:
                continue
            cast = _op(ed, sub.inputs[1], "Cast")
            if cast is None or cast.attrs.get("to") != onnx.TensorProto.FLOAT:
                continue
            u = cast.inputs[0]
            axes_seen = []
            for _ in range(2):
                un = _op(ed, u, "Unsqueeze")
                if un is None:
                    break
                axes = un.attrs.get("axes")
                if axes is None and len(un.inputs) > 1:
                    cv = ed.const(un.inputs[1])
                    axes = None if cv is None else [int(a) for a in cv.reshape(-1)]
                if axes is None:
                    return None
                axes_seen.append(sorted(axes))
                u = un.inputs[0]
            if axes_seen not in ([[1, 2]], [[2], [1]], [[1], [1]]):
                continue
            s = ed.shape(u)
            if s is None or len(s) != 2 or not all(_may_be(dim_of(ed, u, i), t) for i, t in enumerate((bdim, sdim))):
                continue
            if ed.dtype(u) is None or ed.dtype(u).kind not in "biu":
                continue
            return u, filt
        return None

    @classmethod
    def _causal_mask(cls, ed: Editor, mask: str, sdim) -> bool:
        """True for dynamo's SDPA ``is_causal`` bias ``Where(Equal(Trilu(Expand(1, [S, S]),
        upper=0), 0), fill, 0)`` with S the sequence length and fill at most _FILL_MAX: key t
        masked for query s exactly where t > s, i.e. Attention's ``unidirectional``."""
        w = _op(ed, mask, "Where")
        if w is None or ed.scalar(w.inputs[2]) != 0.0 or ed.dtype(mask) != _F32:
            return False
        fill = ed.scalar(w.inputs[1])
        eq = _op(ed, w.inputs[0], "Equal")
        if fill is None or fill > cls._FILL_MAX or eq is None:
            return False
        tri = next((_op(ed, a, "Trilu") for a, b in (eq.inputs, eq.inputs[::-1]) if ed.scalar(b) == 0.0), None)
        if tri is None or tri.attrs.get("upper", 1) != 0:
            return False
        if len(tri.inputs) > 1 and tri.inputs[1] and ed.scalar(tri.inputs[1]) != 0.0:
            return False
        ex = _op(ed, tri.inputs[0], "Expand")
        one = None if ex is None else ed.scalar(ex.inputs[0])
        return one not in (None, 0.0) and shape_tensor(ed, ex.inputs[1]) == [sdim, sdim]

    #: a fill at most this (or -inf) absorbs any score below 1e22 in magnitude (s + fill
    #: rounds to fill in float32), so the kernel's additive mask gives Where's exact values
    _FILL_MAX = -1e30

    @classmethod
    def _padding_where(cls, ed: Editor, w: Node):
        """(cond, fill, scores, masked) of ``Where(cond, fill, scores)`` (masked_fill: cond
        masks, ``masked`` True) or ``Where(cond, scores, fill)`` (cond keeps) with a float32
        scalar fill of at most _FILL_MAX."""
        _need(ed.const(w.inputs[0]) is None, "a constant Where condition (the traced match's causal form)")
        for masked, f, sc in ((True, w.inputs[1], w.inputs[2]), (False, w.inputs[2], w.inputs[1])):
            fill = ed.scalar(f)
            if fill is not None and ed.dtype(f) == _F32 and ed.dtype(sc) == _F32 and ed.const(sc) is None:
                _need(fill <= cls._FILL_MAX, f"Where fill {fill} is not a large negative scalar")
                return w.inputs[0], fill, sc, masked
        raise _NoMatch("Where is not a scalar fill of the scores")

    @staticmethod
    def _where_bias(ed: Editor, where, extra: list) -> str:
        """``Where(cond, 0, fill)`` (or ``(cond, fill, 0)``): the condition as an additive
        float32 mask, exact for the fill (see _FILL_MAX)."""
        cond, fill, _, masked = where
        zero = ed.add_const(np.zeros((), _F32), "attention_where_zero")
        f = ed.add_const(np.array(fill, _F32), "attention_where_fill")
        out = ed.fresh(cond + "_bias")
        extra.append(ed.new_node("Where", [cond, f, zero] if masked else [cond, zero, f], [out],
                                 base=cond + "_to_bias"))
        s = ed.shape(cond)
        ed.set_type(out, _F32, None if s is None else [d if isinstance(d, (int, str)) else None for d in s])
        return out

    @staticmethod
    def _where_mask(ed: Editor, where, bdim, sdim):
        """(m, fill) for a condition ``Expand?(Reshape|Unsqueeze(Equal(m, 0)) -> [B, 1, 1, S])``:
        masked where ``m == 0``, m of shape [B, S] (or dims not known to differ)."""
        cond, fill, _, masked = where
        _need(masked, "a keep-form condition")
        ex = _op(ed, cond, "Expand")
        if ex is not None:
            tgt = shape_tensor(ed, ex.inputs[1])
            _need(tgt is not None and len(tgt) == 4 and tgt[0] in (bdim, 1) and tgt[1] in (1,)
                  or tgt is not None and len(tgt) == 4 and tgt[0] == bdim and tgt[3] == sdim,
                  f"padding mask expanded to {tgt}")
            cond = ex.inputs[0]
        r = ed.producer(cond)
        _need(r is not None and r.domain == "" and r.op_type in ("Reshape", "Unsqueeze"), "padding mask layout")
        eq = _op(ed, r.inputs[0], "Equal")
        _need(eq is not None, "padding mask is not Equal(m, 0)")
        m = next((a for a, b in (eq.inputs, eq.inputs[::-1]) if ed.scalar(b) == 0.0), None)
        _need(m is not None and ed.rank(m) == 2 and ed.dtype(m) is not None and ed.dtype(m).kind in "biu",
              "padding mask is not Equal(m, 0) of an integer [B, S]")
        _need(all(_may_be(dim_of(ed, m, i), t) for i, t in enumerate((bdim, sdim))), "padding mask shape")
        if r.op_type == "Reshape":
            tgt = reshape_target(ed, r)
            ok = tgt is not None and len(tgt) == 4 and tgt[1] == tgt[2] == 1 and tgt[0] == dim_of(ed, m, 0) and (
                tgt[3] == dim_of(ed, m, 1))
        else:
            axes = r.attrs.get("axes")
            if axes is None and len(r.inputs) > 1:
                cv = ed.const(r.inputs[1])
                axes = None if cv is None else [int(a) for a in cv.reshape(-1)]
            ok = axes is not None and sorted(axes) == [1, 2]
        _need(ok, "padding mask is not [B, 1, 1, S]")
        return eq.outputs[0], fill

    def _keep_mask(self, ed: Editor, masked: str, extra: list) -> str:
        """int32 1 where ``masked`` (bool) is false: the raw mask_index keeping those keys."""
        key = "not:" + masked
        if key in self._mask_casts:
            return self._mask_casts[key]
        keep = ed.fresh(masked + "_keep")
        out = ed.fresh(masked + "_keep_int32")
        extra.append(ed.new_node("Not", [masked], [keep], base=masked + "_not"))
        extra.append(ed.new_node("Cast", [keep], [out], base=keep + "_to_int32", attrs={"to": onnx.TensorProto.INT32}))
        ed.set_type(keep, np.bool_, ed.shape(masked))
        ed.set_type(out, np.int32, ed.shape(masked))
        self._mask_casts[key] = out
        return out

    def _int32_mask(self, ed: Editor, m: str, extra: list) -> str:
        if ed.dtype(m) == np.dtype(np.int32):
            return m
        if m in self._mask_casts:
            return self._mask_casts[m]
        out = ed.fresh(m + "_int32")
        extra.append(ed.new_node("Cast", [m], [out], base=m + "_to_int32", attrs={"to": onnx.TensorProto.INT32}))
        ed.set_type(out, np.int32, ed.shape(m))
        self._mask_casts[m] = out
        return out

    @staticmethod
    def _bias_mask(ed: Editor, mask: str, bdim, sdim, heads, extra: list) -> str:
        """The additive mask as a 4-D attention_bias. Its dims must be [B|1, H|1, S, S]:
        each provably so, or unknown (a symbol unrelated to x's): where the original graph
        runs, the mask cannot enlarge the scores (the proven [B, S, hidden] output reshape
        and P @ V would fail), and the kernel checks the broadcast at run time."""
        s = ed.shape(mask)
        _need(ed.dtype(mask) == _F32 and s is not None and 2 <= len(s) <= 4, f"mask shape {s}")
        r = len(s)
        dims = [dim_of(ed, mask, i) for i in range(r)]
        targets = [bdim, heads, sdim, sdim][4 - r:]
        for i, (d, t) in enumerate(zip(dims, targets)):
            k = i + 4 - r
            if d == t or (k < 2 and d == 1):
                continue
            # an int that is not the target (a 1 on S: onnxruntime does not broadcast there)
            _need(not isinstance(d, int), f"mask {s} is not [B|1, H|1, S, S]")
        if r == 4:
            return mask
        cm = ed.const(mask)
        if cm is not None:
            return ed.add_const(cm.reshape((1,) * (4 - r) + cm.shape), mask + "_4d")
        axes = [0, 1] if r == 2 else [0]
        out = ed.fresh(mask + "_4d")
        if ed.opset("") >= 13:
            ax = ed.add_const(np.array(axes, np.int64), "attention_bias_axes")
            node = ed.new_node("Unsqueeze", [mask, ax], [out], base=mask + "_unsqueeze")
        else:
            node = ed.new_node("Unsqueeze", [mask], [out], base=mask + "_unsqueeze", attrs={"axes": axes})
        extra.append(node)
        ed.set_type(out, _F32, [1] * (4 - r) + [d if isinstance(d, (int, str)) else None for d in s])
        return out
