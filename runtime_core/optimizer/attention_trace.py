"""The traced attention match: the layout ops between the projections and the score
MatMuls replayed on index arrays, for the layouts exporters write (see below). Used by
``attention.AttentionFusion`` when the direct match does not apply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..graph.ir import Node
from .editor import MS_DOMAIN, Editor

if TYPE_CHECKING:
    from .attention import AttentionFusion

_F32 = np.dtype(np.float32)


def _op(ed, name, op):
    n = ed.producer(name) if name else None
    return n if n is not None and n.op_type == op and n.domain == "" else None


def _may_be(d, target) -> bool:
    """``d`` is ``target``, or unknown (a symbol of its own), or 1 (broadcast)."""
    return d == target or d == 1 or not isinstance(d, int)


class _NoMatch(Exception):
    pass


def _need(cond, why: str) -> None:
    if not cond:
        raise _NoMatch(why)


# -- shape readers --------------------------------------------------------------------------
#
# Exports with dynamic axes compute every Reshape target from ``Shape`` of the value being
# reshaped (TorchScript: Shape -> Gather -> Unsqueeze -> Concat). Those Shape nodes read the
# pattern's intermediates, yet they only serve the pattern's own Reshapes: they are taken
# into the pattern (and removed with it) when nothing outside it reads what they compute.

_SHAPE_OPS = {"Shape", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Cast", "Identity", "Mul", "Div",
              "Add", "Sub", "Floor", "Sqrt", "Reshape", "Equal", "Where", "Range", "ConstantOfShape", "Expand"}
_SHAPE_CLOSURE_MAX = 96


def _shape_readers(ed: Editor, nodes: list[Node], keep: str | None = None, x: str | None = None,
                   stays: Node | None = None):
    """(remove, add) for the ``Shape`` readers of ``nodes``' outputs (other than ``keep``):
    a shape computation that feeds only ``nodes`` (and itself) goes with them; a Shape whose
    result is read elsewhere too is re-sourced from ``x`` (the attention input, which stays)
    when every dim it gives is one of x's or a number. ``stays``: a node of ``nodes`` the
    rewrite makes again with the same inputs (what it reads must stay). Raises _NoMatch
    otherwise."""
    inside = {id(n) for n in nodes if n is not stays}
    remove: list[Node] = []
    add: list[Node] = []
    for n in list(nodes):
        for o in n.outputs:
            if not o or o == keep:
                continue
            for c in ed.consumers(o):
                if id(c) in inside or not shape_only(ed, c):
                    continue  # a reader of another kind: the caller's check reports it
                shapes = [c] if c.op_type == "Shape" else ed.consumers(c.outputs[0])
                if c.op_type != "Shape":  # a layout op read only by Shape nodes goes too
                    inside.add(id(c))
                    remove.append(c)
                for sh in shapes:
                    if id(sh) in inside:
                        continue
                    seen = _shape_closure(ed, sh, inside)
                    if seen is None:
                        add += _resourced_shape(ed, sh, x)
                        seen = {id(sh)}
                    inside.update(seen)
                    remove += [m for m in ed.g.nodes if id(m) in seen]
    return remove, add


def shape_only(ed: Editor, c: Node) -> bool:
    """``c`` is a ``Shape``, or a layout op whose result only ``Shape`` nodes read (PyTorch's
    ``k.size(-2)`` after a transpose): it reads a value for its dims alone."""
    if c.domain != "":
        return False
    if c.op_type == "Shape":
        return True
    if c.op_type not in ("Transpose", "Reshape", "Identity", "Squeeze", "Unsqueeze") or len(c.outputs) != 1:
        return False
    o = c.outputs[0]
    cons = ed.consumers(o)
    return bool(cons) and not ed.is_output(o) and not ed.is_implicit(o) and all(
        r.op_type == "Shape" and r.domain == "" for r in cons)


def _shape_closure(ed: Editor, c: Node, inside: set) -> set | None:
    """Ids of the nodes computing from Shape node ``c`` when all they compute is read by
    ``inside`` or each other; None when something else reads it."""
    todo, seen = [c], {id(c)}
    while todo:
        m = todo.pop()
        if len(seen) > _SHAPE_CLOSURE_MAX:
            return None
        for mo in m.outputs:
            if not mo:
                continue
            if ed.is_output(mo) or ed.is_implicit(mo):
                return None
            for r in ed.consumers(mo):
                if id(r) in inside or id(r) in seen:
                    continue
                if r.domain != "" or r.op_type not in _SHAPE_OPS or not all(
                        ed.dtype(v) is not None and ed.dtype(v).kind in "iu" for v in r.outputs if v):
                    return None  # (only integer computations: a Slice of data is no shape)
                seen.add(id(r))
                todo.append(r)
    return seen


def _resourced_shape(ed: Editor, c: Node, x: str | None) -> list[Node]:
    """Nodes computing Shape node ``c``'s output from ``x``'s shape and constants."""
    from .shapes import dim_of

    v = c.inputs[0]
    r = ed.rank(v)
    xr = ed.rank(x) if x else None
    _need(r is not None and xr is not None, f"{c.name}: a Shape of the pattern read elsewhere")
    start, end = c.attrs.get("start") or 0, c.attrs.get("end")
    start = max(0, start + r if start < 0 else start)
    end = r if end is None else min(max(end + r if end < 0 else end, 0), r)
    xdims = [dim_of(ed, x, j) for j in range(xr)]
    consts, idx = [], []
    for i in range(start, end):
        d = dim_of(ed, v, i)
        if isinstance(d, (str, tuple)) and d in xdims:
            idx.append(xdims.index(d))
        elif isinstance(d, int):
            idx.append(xr + len(consts))
            consts.append(d)
        else:
            raise _NoMatch(f"{c.name}: dim {i} of {v} is not one of x's")
    xs = ed.fresh(x + "_shape")
    allv = ed.fresh(c.outputs[0] + "_dims")
    out = [ed.new_node("Shape", [x], [xs], base=c.name + "_of_x")]
    ed.set_type(xs, np.int64, [xr])
    if consts:
        cn = ed.add_const(np.array(consts, np.int64), "attention_shape_dims")
        out.append(ed.new_node("Concat", [xs, cn], [allv], base=c.name + "_dims", attrs={"axis": 0}))
        ed.set_type(allv, np.int64, [xr + len(consts)])
    else:
        allv = xs
    ix = ed.add_const(np.array(idx, np.int64), "attention_shape_index")
    out.append(ed.new_node("Gather", [allv, ix], [c.outputs[0]], base=c.name + "_gather", attrs={"axis": 0}))
    return out


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
            inputs += ["", "", fusion._bias_mask(ed, mask, bsz, seq, heads, extra)]
    if where is not None:
        need(ed.opset("") >= 9, "opset")
    # every intermediate is read inside the pattern only
    uniq, seen = [], set()
    for nd in nodes:
        if id(nd) not in seen:
            seen.add(id(nd))
            uniq.append(nd)
    nodes = uniq
    gone, shape_nodes = _shape_readers(ed, nodes, keep=end_name, x=None if swapped else src)
    nodes += gone
    extra += shape_nodes
    remade = {o for m in shape_nodes for o in m.outputs}  # a re-sourced Shape's output is made again
    for nd in nodes:
        for o in nd.outputs:
            if o and o != end_name and o not in remade and (ed.consumers(o) or ed.is_output(o)):
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
