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

and otherwise the subgraph is left alone.
"""

from __future__ import annotations

import numpy as np
import onnx

from ..graph.ir import Graph, Node
from .base import EXTENDED, MS_DOMAIN, Editor, Pass
from .shapes import dim_of, reshape_target

_F32 = np.dtype(np.float32)


def _op(ed, name, op):
    n = ed.producer(name) if name else None
    return n if n is not None and n.op_type == op and n.domain == "" else None


def _perm(n: Node):
    return list(n.attrs.get("perm") or [])


class AttentionFusion(Pass):
    name = "AttentionFusion"
    level = EXTENDED

    def apply(self, graph: Graph) -> int:
        ed = Editor(graph, self.name)
        count = 0
        self._mask_casts: dict[str, str] = {}
        if not ed.can_emit("Attention", MS_DOMAIN):
            return 0
        for sm in list(graph.nodes):
            if sm.op_type != "Softmax" or sm.domain != "" or not ed.alive(sm):
                continue
            try:
                if self._fuse(ed, sm):
                    count += 1
                continue
            except _NoMatch as why:
                first = why
            try:
                if _fuse_traced(self, ed, sm):
                    count += 1
            except _NoMatch as why:
                ed.log("%s: not fused: %s; traced: %s", sm.name, first, why)
        return count

    # -- the match ----------------------------------------------------------------------
    def _fuse(self, ed: Editor, sm: Node) -> bool:
        need = _need
        nodes: list[Node] = [sm]
        axis = sm.attrs.get("axis")
        need(axis in (-1, 3), f"softmax axis {axis}")
        # scores: (Q @ K) [scale] [+ mask]
        s_in = sm.inputs[0]
        need(ed.single_use(s_in, sm), "scores read elsewhere")
        mask = None
        add = _op(ed, s_in, "Add")
        cur = s_in
        if add is not None:
            nodes.append(add)
            a, b = add.inputs
            # the operand coming from the MatMul side is the scores
            if self._scores_side(ed, a):
                cur, mask = a, b
            elif self._scores_side(ed, b):
                cur, mask = b, a
            else:
                raise _NoMatch("no MatMul behind the mask Add")
            need(ed.single_use(cur, add), "scaled scores read elsewhere")
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
        q_part, q_dims, q_nodes = self._head(ed, qt, qk, [0, 2, 1, 3])
        k_part, k_dims, k_nodes = self._head(ed, kt, qk, [0, 2, 3, 1])
        v_part, v_dims, v_nodes = self._head(ed, vt, pv, [0, 2, 1, 3])
        nodes += q_nodes + k_nodes + v_nodes
        need(q_dims == k_dims == v_dims, "q, k and v split into different heads")
        heads, dk = q_dims
        hidden = heads * dk
        # output: Reshape(Transpose(P @ V, [0, 2, 1, 3]), [B, S, hidden])
        tr = ed.consumers(pv.outputs[0])
        need(len(tr) == 1 and tr[0].op_type == "Transpose" and _perm(tr[0]) == [0, 2, 1, 3]
             and not ed.is_output(pv.outputs[0]), "context not transposed back")
        tr = tr[0]
        rs = ed.consumers(tr.outputs[0])
        need(len(rs) == 1 and rs[0].op_type == "Reshape" and rs[0].inputs[0] == tr.outputs[0]
             and not ed.is_output(tr.outputs[0]), "context not reshaped back")
        rs = rs[0]
        nodes += [tr, rs]
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
        need(tgt is not None and tgt == [bdim, sdim, hidden], f"output reshape {tgt} is not [B, S, {hidden}]")
        # every intermediate is read inside the pattern only
        inside = nodes
        for n in nodes:
            if n is rs:
                continue
            for o in n.outputs:
                if o:
                    need(ed.internal(o, inside), f"{o} is read outside the attention")
        # the mask
        extra: list[Node] = []
        inputs = [x, None, None]
        attrs = {"num_heads": int(heads), "scale": float(scale), "unidirectional": 0}
        if mask is not None:
            raw = self._raw_mask(ed, mask, bdim, sdim)
            if raw is not None:
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
        att = ed.new_node("Attention", inputs, [rs.outputs[0]], base=sm.name + "_attention", domain=MS_DOMAIN,
                          attrs=attrs)
        if not ed.replace(nodes, extra + [att], at=rs):
            self._mask_casts = {k: v for k, v in self._mask_casts.items() if ed.producer(v) is not None}
            return False
        if ed.shape(rs.outputs[0]) is None:
            ed.set_type(rs.outputs[0], _F32, [d if isinstance(d, (int, str)) else None for d in xs[:2]] + [hidden])
        ed.log("%d nodes -> Attention %s (heads %d, head size %d, mask %s)", len(nodes), att.name, heads, dk,
               "none" if mask is None else ("raw 2-D" if "mask_filter_value" in attrs else "attention_bias"))
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
    def _head(ed: Editor, name: str, reader: Node, perm: list[int]):
        t = _op(ed, name, "Transpose")
        _need(t is not None and _perm(t) == perm and ed.single_use(name, reader), f"no Transpose {perm} head")
        r = _op(ed, t.inputs[0], "Reshape")
        _need(r is not None and ed.single_use(t.inputs[0], t), "no head Reshape")
        tgt = reshape_target(ed, r)
        _need(tgt is not None and len(tgt) == 4 and isinstance(tgt[2], int) and isinstance(tgt[3], int),
              f"head reshape target {tgt}")
        return r.inputs[0], (tgt[2], tgt[3]), [r, t]

    @staticmethod
    def _projections(ed: Editor, q: str, k: str, v: str, hidden: int):
        """(x, W [D, 3*hidden], bias [3*hidden], nodes) from a Split of one projection or
        from three projections of the same x."""
        def linear(name):
            """x, W, b, nodes of ``x @ W (+ b)`` producing ``name``."""
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


def _may_be(d, target) -> bool:
    """``d`` is ``target``, or unknown (a symbol of its own), or 1 (broadcast)."""
    return d == target or d == 1 or not isinstance(d, int)


class _NoMatch(Exception):
    pass


def _need(cond, why: str) -> None:
    if not cond:
        raise _NoMatch(why)


# -- the traced match ---------------------------------------------------------------------
#
# The exporters write the same attention with many layouts: torch.nn.MultiheadAttention
# (TorchScript and dynamo) projects a sequence-first copy of x, reshapes the packed qkv to
# [S, B, 3, D], selects q/k/v with Unsqueeze/Transpose/Squeeze/Gather, folds the heads into
# the batch ([S, B*H, dk] -> [B*H, S, dk] -> [B, H, S, dk]), splits the scale between q and
# k, and brings the context back through [S*B, D] around the out-projection Gemm;
# F.scaled_dot_product_attention scales q and k the same way; GPT-2 masks with Where.
# Rather than one pattern per layout, the layout ops between the projection and the score
# MatMuls (and between the context and the output) are *replayed on index arrays* (static
# shapes only): each element of the traced q/k/v operands names the projection row (one
# position (b, s) of x) and column it is; the match holds exactly when every head reads
# the rows of one batch entry in sequence order, the columns of one head, and the context
# lands on the [B, S, hidden] output in order. Column selections become the Attention
# weights (any column order is exact: it is a gather of W). Nothing else is assumed.

_LAYOUT_OPS = {"Reshape", "Transpose", "Unsqueeze", "Squeeze", "Gather", "Split", "Slice", "Flatten", "Identity"}
_MAX_ELEMS = 1 << 22


def _ints(ed: Editor, name: str):
    c = ed.const(name) if name else None
    if c is None or c.dtype.kind not in "iu":
        return None
    return [int(v) for v in c.reshape(-1)]


def _axes(ed: Editor, node: Node):
    if len(node.inputs) > 1 and node.inputs[1]:
        return _ints(ed, node.inputs[1])
    a = node.attrs.get("axes")
    return None if a is None else [int(v) for v in a]


def _replay(ed: Editor, node: Node, arr: np.ndarray, out_index: int = 0) -> np.ndarray:
    """Output ``out_index`` of layout op ``node`` applied to ``arr`` (its data input)."""
    op = node.op_type
    r = arr.ndim
    if op == "Identity":
        return arr
    if op in ("Mul", "Div"):  # a scalar scale (recorded by _trace_back): the layout as is
        c = [ed.const(i) for i in node.inputs]
        c = [v for v in c if v is not None and v.size == 1]
        _need(c and c[0].ndim <= r, "scale enlarges the rank")
        return arr
    if op == "Reshape":
        tgt = _ints(ed, node.inputs[1])
        _need(tgt is not None, "reshape target is not constant")
        allowzero = node.attrs.get("allowzero") or 0
        shape = []
        for i, d in enumerate(tgt):
            if d == 0 and not allowzero:
                _need(i < r, "reshape 0 beyond the input rank")
                d = arr.shape[i]
            shape.append(d)
        _need(shape.count(-1) <= 1 and all(d >= -1 for d in shape), "bad reshape target")
        try:
            return arr.reshape(shape)
        except ValueError as e:
            raise _NoMatch(f"reshape: {e}")
    if op == "Transpose":
        perm = node.attrs.get("perm")
        perm = list(range(r))[::-1] if perm is None else [int(p) for p in perm]
        _need(sorted(perm) == list(range(r)), "bad perm")
        return arr.transpose(perm)
    if op == "Flatten":
        ax = int(node.attrs.get("axis", 1))
        ax = ax + r if ax < 0 else ax
        return arr.reshape(int(np.prod(arr.shape[:ax], dtype=np.int64)), -1)
    if op == "Unsqueeze":
        axes = _axes(ed, node)
        _need(axes is not None, "unsqueeze axes not constant")
        ro = r + len(axes)
        axes = sorted(a + ro if a < 0 else a for a in axes)
        _need(len(set(axes)) == len(axes) and all(0 <= a < ro for a in axes), "bad unsqueeze axes")
        for a in axes:
            arr = np.expand_dims(arr, a)
        return arr
    if op == "Squeeze":
        axes = _axes(ed, node)
        if axes is None:
            _need(len(node.inputs) < 2 or not node.inputs[1], "squeeze axes not constant")
            return np.squeeze(arr)
        axes = tuple(a + r if a < 0 else a for a in axes)
        _need(all(0 <= a < r and arr.shape[a] == 1 for a in axes), "bad squeeze axes")
        return np.squeeze(arr, axis=axes)
    if op == "Gather":
        idx = ed.const(node.inputs[1])
        _need(idx is not None and idx.dtype.kind in "iu", "gather indices not constant")
        ax = int(node.attrs.get("axis", 0))
        ax = ax + r if ax < 0 else ax
        _need(0 <= ax < r and np.all((idx >= -arr.shape[ax]) & (idx < arr.shape[ax])), "gather out of range")
        return np.take(arr, idx.astype(np.int64), axis=ax)
    if op == "Split":
        ax = int(node.attrs.get("axis", 0))
        ax = ax + r if ax < 0 else ax
        _need(0 <= ax < r, "bad split axis")
        n_out = len(node.outputs)
        sizes = None
        if len(node.inputs) > 1 and node.inputs[1]:
            sizes = _ints(ed, node.inputs[1])
            _need(sizes is not None, "split sizes not constant")
        elif node.attrs.get("split"):
            sizes = [int(v) for v in node.attrs["split"]]
        else:
            d = arr.shape[ax]
            k = node.attrs.get("num_outputs") or n_out
            chunk = -(-d // k)
            sizes = [min(chunk, d - i * chunk) for i in range(k)]
        _need(len(sizes) == n_out and sum(sizes) == arr.shape[ax] and min(sizes) >= 0, "bad split sizes")
        start = sum(sizes[:out_index])
        return np.take(arr, np.arange(start, start + sizes[out_index]), axis=ax)
    if op == "Slice":
        starts, ends = _ints(ed, node.inputs[1]), _ints(ed, node.inputs[2])
        axes = _ints(ed, node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] else list(range(len(starts or [])))
        steps = _ints(ed, node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] else [1] * len(axes or [])
        _need(None not in (starts, ends, axes, steps) and len({len(starts), len(ends), len(axes), len(steps)}) == 1,
              "slice parameters not constant")
        for st, en, a, sp in zip(starts, ends, axes, steps):
            a = a + r if a < 0 else a
            _need(0 <= a < r and sp != 0, "bad slice")
            d = arr.shape[a]
            st = st + d if st < 0 else st
            en = en + d if en < 0 else en
            if sp > 0:
                st, en = min(max(st, 0), d), min(max(en, 0), d)
            else:
                st, en = min(max(st, 0), d - 1), min(max(en, -1), d - 1)
            arr = np.take(arr, np.arange(st, en, sp, dtype=np.int64), axis=a)
        return arr
    raise _NoMatch(f"{op} is not a layout op")


def _is_layout(n: Node | None) -> bool:
    return n is not None and n.domain == "" and n.op_type in _LAYOUT_OPS


def _linear(ed: Editor, name: str):
    """(x, W [D, N], b [N], nodes) when ``name`` is ``x @ W (+ b)`` or ``Gemm(x, W, b)`` with
    constant float32 weights; otherwise None."""
    p = ed.producer(name)
    if p is None or p.domain != "":
        return None
    nodes = []
    b = None
    if p.op_type == "Add":
        for mm_out, c in ((p.inputs[0], p.inputs[1]), (p.inputs[1], p.inputs[0])):
            cv = ed.const(c)
            mm = _op(ed, mm_out, "MatMul")
            if mm is not None and cv is not None and cv.ndim == 1 and ed.single_use(mm_out, p):
                b, p = cv, mm
                nodes.append(ed.producer(name))
                break
        else:
            return None
    if p.op_type == "MatMul":
        w = ed.const(p.inputs[1])
        if w is None or w.ndim != 2 or w.dtype != _F32:
            return None
        if b is None:
            b = np.zeros(w.shape[1], _F32)
        if b.shape != (w.shape[1],) or b.dtype != _F32:
            return None
        return p.inputs[0], w, b, nodes + [p]
    if p.op_type == "Gemm" and not nodes:
        w = ed.const(p.inputs[1])
        if w is None or w.ndim != 2 or w.dtype != _F32 or p.attrs.get("transA"):
            return None
        if p.attrs.get("transB"):
            w = w.T
        alpha, beta = float(p.attrs.get("alpha", 1.0)), float(p.attrs.get("beta", 1.0))
        w = (w * np.float32(alpha)).astype(_F32) if alpha != 1.0 else np.ascontiguousarray(w)
        b = np.zeros(w.shape[1], _F32)
        if len(p.inputs) > 2 and p.inputs[2]:
            c = ed.const(p.inputs[2])
            if c is None or c.dtype != _F32 or c.size not in (1, w.shape[1]) or c.ndim > 2 or (
                    c.ndim == 2 and c.shape[0] != 1):
                return None
            b = (np.broadcast_to(c.reshape(-1), (w.shape[1],)) * np.float32(beta)).astype(_F32)
        return p.inputs[0], w, b, [p]
    return None


def _trace_back(ed: Editor, name: str, reader: Node, allow_scale: bool):
    """Walk from a score/context MatMul operand back through layout ops (and scalar scales)
    to a projection. Returns (projection output, [(node, output index)] in forward order,
    scale, nodes)."""
    steps, nodes, scale = [], [], 1.0
    cur = name
    for _ in range(16):
        if _linear(ed, cur) is not None:
            return cur, steps[::-1], scale, nodes
        p = ed.producer(cur)
        _need(p is not None and p.domain == "", f"{cur}: no projection behind the head")
        if allow_scale and p.op_type in ("Mul", "Div"):
            c, other = ed.scalar(p.inputs[1]), p.inputs[0]
            if c is None and p.op_type == "Mul":
                c, other = ed.scalar(p.inputs[0]), p.inputs[1]
            _need(c is not None and c != 0 and np.isfinite(c), "non-constant scale")
            scale = scale / c if p.op_type == "Div" else scale * c
            steps.append((p, 0))
            nodes.append(p)
            cur = other
            continue
        _need(_is_layout(p), f"{p.op_type} between the projection and the head")
        steps.append((p, list(p.outputs).index(cur)))
        nodes.append(p)
        cur = p.inputs[0]
    raise _NoMatch("head chain too long")


def _rows(ed: Editor, x: str, src: str, chain: list[Node]):
    """Row ids (positions of src's first two axes) of the rows of ``x`` reached from ``src``
    by ``chain`` (layout ops that must keep the last axis whole)."""
    shp = ed.static_shape(src)
    d = shp[2]
    idx = np.arange(int(np.prod(shp, dtype=np.int64)), dtype=np.int64).reshape(shp)
    for node in chain:
        idx = _replay(ed, node, idx, 0)
    _need(idx.ndim >= 1 and idx.shape[-1] == d, "x layout moves the hidden axis")
    rows = idx[..., 0] // d
    _need(np.array_equal(idx, rows[..., None] * d + np.arange(d)), "x layout moves the hidden axis")
    return rows


def _x_candidates(ed: Editor, x: str):
    """(src, chain) pairs: x itself and the rank-3 values before up to 4 layout ops."""
    out, chain, cur = [], [], x
    for _ in range(5):
        s = ed.static_shape(cur)
        if s is not None and len(s) == 3 and s[2] > 0 and ed.dtype(cur) == _F32:
            out.append((cur, list(reversed(chain))))
        p = ed.producer(cur)
        if p is None or p.domain != "" or p.op_type not in ("Transpose", "Reshape", "Unsqueeze", "Squeeze",
                                                            "Identity", "Flatten"):
            break
        chain.append(p)
        cur = p.inputs[0]
    return out


def _heads_of(arr: np.ndarray, n_cols: int, bs_of, seq: int, kind: str):
    """Per group: (batch index [G], columns [G, d]) of a traced operand [G, S, d]."""
    rows, cols = arr // n_cols, arr % n_cols
    b, s = bs_of(rows)
    _need(np.all(b == b[:, :1, :1]), f"{kind}: a head mixes batch entries")
    _need(arr.shape[1] == seq and np.all(s == np.arange(seq)[None, :, None]), f"{kind}: rows not in sequence order")
    _need(np.all(cols == cols[:, :1, :]), f"{kind}: columns differ along the sequence")
    return b[:, 0, 0], cols[:, 0, :]


def _fuse_traced(fusion: "AttentionFusion", ed: Editor, sm: Node) -> bool:
    need = _need
    nodes: list[Node] = [sm]
    sshape = ed.static_shape(sm.inputs[0])
    need(sshape is not None and len(sshape) >= 3, "scores shape not static")
    # the last axis: at every opset (before 13 the softmax of a [N, last] flattening: the same)
    need(sm.attrs.get("axis", 1 if ed.opset("") < 13 else -1) in (-1, len(sshape) - 1), "softmax axis")
    # scores: MatMul [scale] [+ mask] [Where causal], in any order after the MatMul
    cur, scale, mask, where = sm.inputs[0], 1.0, None, None
    for _ in range(4):
        p = ed.producer(cur)
        need(p is not None and p.domain == "" and ed.single_use(cur, nodes[-1]), "scores read elsewhere")
        if p.op_type == "MatMul":
            break
        nodes.append(p)
        if p.op_type in ("Mul", "Div"):
            c, other = ed.scalar(p.inputs[1]), p.inputs[0]
            if c is None and p.op_type == "Mul":
                c, other = ed.scalar(p.inputs[0]), p.inputs[1]
            need(c is not None and c != 0 and np.isfinite(c), "non-constant scale")
            need(ed.static_shape(other) == sshape, "scale broadcasts the scores")
            scale = scale / c if p.op_type == "Div" else scale * c
            cur = other
        elif p.op_type == "Add" and mask is None:
            a, b = p.inputs
            if ed.static_shape(a) == sshape and _leads_to_matmul(ed, a):
                cur, mask = a, b
            elif ed.static_shape(b) == sshape and _leads_to_matmul(ed, b):
                cur, mask = b, a
            else:
                raise _NoMatch("no MatMul behind the mask Add")
        elif p.op_type == "Where" and where is None:
            cond = ed.const(p.inputs[0])
            need(cond is not None and cond.dtype == np.bool_, "Where condition is not constant")
            f1, f2 = ed.scalar(p.inputs[1]), ed.scalar(p.inputs[2])
            if f1 is not None and ed.static_shape(p.inputs[2]) == sshape:
                masked, fill, cur = cond, f1, p.inputs[2]
            elif f2 is not None and ed.static_shape(p.inputs[1]) == sshape:
                masked, fill, cur = ~cond, f2, p.inputs[1]
            else:
                raise _NoMatch("Where is not a scalar fill of the scores")
            need(ed.dtype(p.inputs[1]) == ed.dtype(p.inputs[2]) == _F32, "Where dtype")
            need(fill <= float(np.finfo(np.float32).min), f"Where fill {fill} is not -inf")
            try:
                full = np.broadcast_to(masked, sshape)
            except ValueError:
                raise _NoMatch("Where condition does not broadcast to the scores")
            need(np.broadcast_shapes(masked.shape, sshape) == tuple(sshape), "Where enlarges the scores")
            causal = np.triu(np.ones(sshape[-2:], bool), 1)
            need(np.array_equal(full, np.broadcast_to(causal, sshape)), "Where mask is not causal")
            where = p
        else:
            raise _NoMatch(f"{p.op_type} on the scores")
    qk = _op(ed, cur, "MatMul")
    need(qk is not None and ed.static_shape(cur) == sshape, "scores are not a MatMul")
    nodes.append(qk)
    pv = ed.consumers(sm.outputs[0])
    need(len(pv) == 1 and pv[0].op_type == "MatMul" and pv[0].domain == "" and pv[0].inputs[0] == sm.outputs[0]
         and pv[0].inputs[1] != sm.outputs[0] and not ed.is_output(sm.outputs[0]), "softmax not read by one MatMul")
    pv = pv[0]
    nodes.append(pv)
    # the three operands back to their projections
    chains = {}
    for kind, name, reader in (("q", qk.inputs[0], qk), ("k", qk.inputs[1], qk), ("v", pv.inputs[1], pv)):
        need(ed.single_use(name, reader), f"{kind} read elsewhere")
        proj, steps, sc, cn = _trace_back(ed, name, reader, allow_scale=kind != "v")
        chains[kind] = (proj, steps, cn)
        scale *= sc
        nodes += cn
    projs = {}
    for kind in "qkv":
        proj = chains[kind][0]
        if proj not in projs:
            projs[proj] = _linear(ed, proj)
    xs = {projs[p][0] for p in projs}
    need(len(xs) == 1, "q, k and v project different inputs")
    x = xs.pop()
    for p in projs.values():
        nodes += p[3]
    vshape = ed.static_shape(pv.inputs[1])
    need(vshape is not None and len(vshape) == len(sshape) and tuple(vshape[:-2]) == tuple(sshape[:-2])
         and vshape[-2] == sshape[-1], "context shape")
    # which (src, orientation) makes q, k, v whole heads
    match = None
    cands = []
    for src, pre in _x_candidates(ed, x):
        d0, d1, dmodel = ed.static_shape(src)
        if d0 * d1 * dmodel > _MAX_ELEMS:
            continue
        try:
            cands.append((src, d0, d1, dmodel, _rows(ed, x, src, pre)))
        except _NoMatch:
            continue
    for swapped in (False, True):  # batch-first x (no Transpose to add) preferred
        for src, d0, d1, dmodel, rows in cands:
            bsz, seq = (d1, d0) if swapped else (d0, d1)
            if swapped:
                bs_of = lambda r, d1=d1: (r % d1, r // d1)  # noqa: E731
            else:
                bs_of = lambda r, d1=d1: (r // d1, r % d1)  # noqa: E731
            try:
                match = (src, swapped, bsz, seq, dmodel) + _match_heads(ed, chains, projs, rows, bs_of, bsz, seq,
                                                                        sshape)
            except _NoMatch:
                continue
            break
        if match is not None:
            break
    need(match is not None, "q, k and v are not whole heads of one projection")
    src, swapped, bsz, seq, dmodel, heads, w, bias, sizes, group_b, group_h, natural = match
    dk, dv = sizes[0] // heads, sizes[2] // heads
    need(w.shape[0] == dmodel, "projection input size")
    # the context forward to the output
    hv = sizes[2]
    ctx_idx = ((group_b[:, None, None] * seq + np.arange(seq)[None, :, None]) * hv
               + group_h[:, None, None] * dv + np.arange(dv)[None, None, :])
    out_shape = ed.static_shape(pv.outputs[0])
    need(out_shape is not None and int(np.prod(out_shape)) == ctx_idx.size, "context shape")
    end = _trace_forward(ed, pv, ctx_idx.reshape(out_shape), bsz, seq, hv)
    fwd_nodes, lin, end_name, end_swapped = end
    nodes += fwd_nodes
    # masks: only on [B, H, S, S] scores laid out in order
    need(dk * heads == sizes[0], "head size")
    extra: list[Node] = []
    attrs = {"num_heads": int(heads), "scale": float(scale), "unidirectional": 1 if where is not None else 0,
             "qkv_hidden_sizes": [int(v) for v in sizes]}
    inputs = [src, "", ""]
    if mask is not None:
        need(natural and len(sshape) == 4, "masked scores are not [B, H, S, S]")
        raw = fusion._raw_mask(ed, mask, bsz, seq)
        if raw is not None:
            m2d, filt = raw
            inputs += [fusion._int32_mask(ed, m2d, extra), ""]
            attrs["mask_filter_value"] = float(filt)
        else:
            inputs += ["", "", AttentionFusion._bias_mask(ed, mask, bsz, seq, heads, extra)]
    if where is not None:
        need(ed.opset("") >= 9, "opset")
    # every intermediate is read inside the pattern only
    uniq, seen = [], set()
    for nd in nodes:
        if id(nd) not in seen:
            seen.add(id(nd))
            uniq.append(nd)
    nodes = uniq
    for nd in nodes:
        for o in nd.outputs:
            if o and o != end_name and (ed.consumers(o) or ed.is_output(o)):
                need(ed.internal(o, nodes), f"{o} is read outside the attention")
    need(ed.dtype(src) == _F32, "dtype")
    if swapped:
        xt = ed.fresh(src + "_bsd")
        extra.append(ed.new_node("Transpose", [src], [xt], base=src + "_to_bsd", attrs={"perm": [1, 0, 2]}))
        ed.set_type(xt, _F32, [bsz, seq, dmodel])
        inputs[0] = xt
    inputs[1] = ed.add_const(np.ascontiguousarray(w), "attention_qkv_weight")
    inputs[2] = ed.add_const(np.ascontiguousarray(bias), "attention_qkv_bias")
    while inputs and not inputs[-1]:
        inputs.pop()
    # Attention [-> MatMul (-> Add)] [-> Transpose to sequence-first], the last writing end_name
    tail = []
    if lin is not None:
        tail.append(("MatMul", lin[0], lin[0].shape[1]))
        if np.any(lin[1]):
            tail.append(("Add", lin[1], lin[0].shape[1]))
    if end_swapped:
        tail.append(("Transpose", None, None))
    feat = hv
    att_out = ed.fresh(sm.name + "_attention_out") if tail else end_name
    new = extra + [ed.new_node("Attention", inputs, [att_out], base=sm.name + "_attention", domain=MS_DOMAIN,
                               attrs=attrs)]
    if tail:
        ed.set_type(att_out, _F32, [bsz, seq, hv])
    cur = att_out
    for i, (op, val, f) in enumerate(tail):
        out = end_name if i == len(tail) - 1 else ed.fresh(sm.name + f"_attention_{op.lower()}")
        if op == "Transpose":
            new.append(ed.new_node("Transpose", [cur], [out], base=sm.name + "_attention_to_sbd",
                                   attrs={"perm": [1, 0, 2]}))
        else:
            new.append(ed.new_node(op, [cur, ed.add_const(val, f"attention_out_{op.lower()}")], [out],
                                   base=sm.name + f"_attention_out_{op.lower()}"))
            feat = f
        if out != end_name:
            ed.set_type(out, _F32, [bsz, seq, feat])
        cur = out
    if not ed.replace(nodes, new, at=fwd_nodes[-1] if fwd_nodes else pv):
        fusion._mask_casts = {k: v for k, v in fusion._mask_casts.items() if ed.producer(v) is not None}
        return False
    ed.log("%d nodes -> Attention (traced; heads %d, sizes %s, %s%s%s)", len(nodes), heads, sizes,
           "sequence-first" if swapped else "batch-first", ", causal" if where is not None else "",
           ", + out projection" if lin is not None else "")
    return True


def _leads_to_matmul(ed: Editor, name: str) -> bool:
    for _ in range(4):
        p = ed.producer(name)
        if p is None or p.domain != "":
            return False
        if p.op_type == "MatMul":
            return True
        if p.op_type in ("Mul", "Div"):
            name = p.inputs[0] if ed.scalar(p.inputs[1]) is not None else p.inputs[1]
        elif p.op_type == "Where":
            name = p.inputs[2] if ed.scalar(p.inputs[1]) is not None else p.inputs[1]
        elif p.op_type == "Add":
            return any(_leads_to_matmul(ed, i) for i in p.inputs)
        else:
            return False
    return False


def _match_heads(ed, chains, projs, rows, bs_of, bsz, seq, sshape):
    """Heads of the traced q, k, v: (H, W, b, sizes, group batch [G], group head [G], natural)."""
    batch = tuple(sshape[:-2])
    g = int(np.prod(batch, dtype=np.int64)) if batch else 1
    traced = {}
    memo: dict = {}  # (projection, leading steps) -> traced array: q, k, v of one packed
    for kind in "qkv":  # projection share the steps before their Split/Gather
        proj, steps, _ = chains[kind]
        x, w, b, _ = projs[proj]
        n = w.shape[1]
        key: tuple = (proj,)
        arr = memo.get(key)
        if arr is None:
            arr = memo[key] = rows[..., None] * n + np.arange(n)
        for node, k in steps:
            key = key + ((id(node), k),)
            nxt = memo.get(key)
            if nxt is None:
                nxt = memo[key] = _replay(ed, node, arr, k)
            arr = nxt
        traced[kind] = (arr, n)
        if kind == "q":
            q = arr
            _need(q.ndim == len(sshape) and tuple(q.shape[:-2]) == batch and q.shape[-2] == seq, "q shape")
        elif kind == "k":
            _need(arr.ndim == len(sshape) and tuple(arr.shape[:-2]) == batch and arr.shape[-1] == seq
                  and arr.shape[-2] == q.shape[-1], "k shape")
        else:
            _need(arr.ndim == len(sshape) and tuple(arr.shape[:-2]) == batch and arr.shape[-2] == seq, "v shape")
    q, nq = traced["q"]
    k, nk = traced["k"]
    v, nv = traced["v"]
    bq, cq = _heads_of(q.reshape(g, seq, q.shape[-1]), nq, bs_of, seq, "q")
    bk, ck = _heads_of(np.swapaxes(k.reshape(g, k.shape[-2], seq), 1, 2), nk, bs_of, seq, "k")
    bv, cv = _heads_of(v.reshape(g, seq, v.shape[-1]), nv, bs_of, seq, "v")
    _need(np.array_equal(bq, bk) and np.array_equal(bq, bv), "q, k and v heads of different batch entries")
    keys = [(cq[i].tobytes(), ck[i].tobytes(), cv[i].tobytes()) for i in range(g)]
    heads = [keys[i] for i in range(g) if bq[i] == 0]
    _need(len(heads) > 0 and len(set(heads)) == len(heads), "heads repeat")
    hidx = {key: i for i, key in enumerate(heads)}
    _need(all(key in hidx for key in keys), "batch entries have different heads")
    gh = np.array([hidx[key] for key in keys], np.int64)
    nh = len(heads)
    _need(g == bsz * nh and len(set(zip(bq.tolist(), gh.tolist()))) == g and set(bq.tolist()) == set(range(bsz)),
          "groups are not batch x heads")
    first = {}
    for i in range(g):
        if bq[i] == 0:
            first[gh[i]] = i
    order = [first[h] for h in range(nh)]
    # the columns of W (and b) each of q, k, v reads, heads in order; runs of one projection
    # merged, so that a packed projection read in order is used as it is (no copy)
    runs: list = []
    for kind, cols in (("q", cq), ("k", ck), ("v", cv)):
        proj = projs[chains[kind][0]]
        c = np.concatenate([cols[i] for i in order])
        if runs and runs[-1][0] is proj:
            runs[-1][1].append(c)
        else:
            runs.append((proj, [c]))
    sel_w, sel_b = [], []
    for proj, cs in runs:
        w, b = proj[1], proj[2]
        c = np.concatenate(cs) if len(cs) > 1 else cs[0]
        if c.size == w.shape[1] and np.array_equal(c, np.arange(c.size)):  # every column in order
            sel_w.append(w)
            sel_b.append(b)
        else:
            sel_w.append(np.take(w, c, axis=1))  # C-ordered, unlike w[:, c]
            sel_b.append(b[c])
    # float32 already (_linear takes only float32 weights); one C-contiguous copy at most
    w = sel_w[0] if len(sel_w) == 1 else np.concatenate(sel_w, axis=1)
    bias = sel_b[0] if len(sel_b) == 1 else np.concatenate(sel_b)
    w, bias = np.ascontiguousarray(w, dtype=_F32), np.ascontiguousarray(bias, dtype=_F32)
    sizes = [cq.shape[1] * nh, ck.shape[1] * nh, cv.shape[1] * nh]
    _need(sizes[0] == sizes[1], "q and k head sizes differ")
    natural = len(batch) == 2 and batch == (bsz, nh) and np.array_equal(bq, np.arange(g) // nh) and np.array_equal(
        gh, np.arange(g) % nh)
    return nh, w, bias, sizes, bq, gh, natural


def _trace_forward(ed: Editor, pv: Node, arr: np.ndarray, bsz: int, seq: int, feat: int):
    """Follow the context through layout ops and at most one row-wise linear to where it is
    the [B, S, F] output in order (or [S, B, F]: a Transpose then). Returns (nodes,
    (W, b) or None, end value, end is sequence-first)."""
    cur = pv.outputs[0]
    nodes: list[Node] = []
    lin = None
    fallback = None
    for _ in range(16):
        if arr.shape == (bsz, seq, feat) and np.array_equal(arr.reshape(-1), np.arange(arr.size)):
            return nodes, lin, cur, False
        if arr.shape == (seq, bsz, feat) and np.array_equal(arr.transpose(1, 0, 2).reshape(-1), np.arange(arr.size)):
            fallback = (list(nodes), lin, cur, True)
        cons = ed.consumers(cur)
        if len(cons) != 1 or ed.is_output(cur) or ed.is_implicit(cur):
            break
        c = cons[0]
        if _is_layout(c) and c.inputs[0] == cur and c.op_type != "Split":
            arr = _replay(ed, c, arr, 0)
            nodes.append(c)
            cur = c.outputs[0]
            continue
        if lin is None and c.domain == "" and c.op_type in ("MatMul", "Gemm") and c.inputs[0] == cur:
            out = c.outputs[0]
            # a bias Add right after the MatMul belongs to it
            adds = ed.consumers(out)
            if c.op_type == "MatMul" and len(adds) == 1 and adds[0].op_type == "Add" and not ed.is_output(out):
                got = _linear(ed, adds[0].outputs[0])
                if got is not None and got[3][-1] is c:
                    out = adds[0].outputs[0]
            got = _linear(ed, out)
            if got is None or got[3][-1] is not c:
                break
            _, w, b, ln = got
            if arr.ndim < 1 or arr.shape[-1] != feat or w.shape[0] != feat:
                break
            rows = arr[..., 0] // feat
            if not np.array_equal(arr, rows[..., None] * feat + np.arange(feat)):
                break
            feat = w.shape[1]
            arr = rows[..., None] * feat + np.arange(feat)
            lin = (w, b)
            nodes += ln[::-1]
            cur = out
            continue
        break
    if fallback is not None:
        return fallback
    raise _NoMatch("the context does not reach a [B, S, hidden] output in order")
