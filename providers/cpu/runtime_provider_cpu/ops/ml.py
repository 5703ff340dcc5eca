"""CPU kernels: the ``ai.onnx.ml`` operators (traditional machine learning).

Semantics are those of the ONNX-ML specification as onnxruntime implements them
(the project's oracle): output dtypes and shapes, the binary-classifier label and
score conventions, which post transforms apply to single-column scores, and the
float32 arithmetic of scores. Where onnxruntime's behaviour is undefined (reads of
uninitialised memory) the kernels write zeros.

Tree ensembles are compiled once per node (``ctx.cache``) into flat node arrays
(feature, threshold, comparison, children) and evaluated for every row and tree
at once: one vectorised step per tree depth level, leaves loop on themselves.
"""

from __future__ import annotations

import math

import numpy as np

from ..registry import kernel
from ..fast.policy import NATIVE as _native  # the compiled kernels (None in a build without them)

ML = "ai.onnx.ml"
_F32 = np.float32
_F64 = np.float64

# ---------------------------------------------------------------------------
# score transforms (onnxruntime ml_common.h, float32 arithmetic)
# ---------------------------------------------------------------------------

_TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT")


def _logistic(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, _F32)
    with np.errstate(over="ignore"):
        v = _F32(1) / (_F32(1) + np.exp(-np.abs(x)))
    return np.where(x < 0, _F32(1) - v, v).astype(_F32, copy=False)


_ERF_A = _F32(2) / (_F32(math.pi) * _F32(0.147))
_ERF_B = _F32(1) / _F32(0.147)
_SQRT2 = _F32(math.sqrt(2.0))


def _erfinv(x: np.ndarray) -> np.ndarray:
    """onnxruntime's ErfInv approximation (Winitzki), in float32."""
    x = np.asarray(x, _F32)
    sgn = np.where(x < 0, _F32(-1), _F32(1)).astype(_F32)
    y = (_F32(1) - x) * (_F32(1) + x)
    with np.errstate(divide="ignore", invalid="ignore"):
        lg = np.log(y)
        v = _ERF_A + _F32(0.5) * lg
        v2 = _ERF_B * lg
        v3 = -v + np.sqrt(v * v - v2)
        return (sgn * np.sqrt(v3)).astype(_F32, copy=False)


def _probit(x: np.ndarray) -> np.ndarray:
    return (_SQRT2 * _erfinv(_F32(2) * np.asarray(x, _F32) - _F32(1))).astype(_F32, copy=False)


def _softmax(s: np.ndarray) -> np.ndarray:
    s = np.asarray(s, _F32)
    m = s.max(axis=1, keepdims=True)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(s - m)
        return (e / e.sum(axis=1, keepdims=True)).astype(_F32, copy=False)


def _softmax_zero(s: np.ndarray) -> np.ndarray:
    s = np.asarray(s, _F32)
    m = np.maximum(s.max(axis=1, keepdims=True), -np.finfo(_F32).max)
    nz = (s > _F32(1e-7)) | (s < _F32(-1e-7))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        e = np.where(nz, np.exp(s - m), s * np.exp(-m))
        tot = np.where(nz, e, _F32(0)).sum(axis=1, keepdims=True)
        return (e / tot).astype(_F32, copy=False)


def _transform_rows(s: np.ndarray, post: str) -> np.ndarray:
    """The post transform of a score row with two or more values (float32 out)."""
    s = np.asarray(s, _F32)
    if post == "LOGISTIC":
        return _logistic(s)
    if post == "SOFTMAX":
        return _softmax(s)
    if post == "SOFTMAX_ZERO":
        return _softmax_zero(s)
    if post == "PROBIT":
        return _probit(s)
    return s


def _binary_expand(s: np.ndarray, post: str, add_second_class) -> np.ndarray:
    """One score per row expanded to two columns (onnxruntime ``write_scores``).

    ``add_second_class``: 0/1 -> ``[1 - s, s]``; 2/3 -> ``[-s, s]``; LOGISTIC with
    0..3 -> ``[logistic(-s), logistic(s)]``; -1 -> ``[s, 0]``; PROBIT ->
    ``[probit(s), 0]`` (onnxruntime leaves the second value uninitialised).
    ``add_second_class`` may be an array (one code per row).
    """
    s = np.asarray(s, _F32).reshape(-1)
    out = np.zeros((s.shape[0], 2), _F32)
    if post == "PROBIT":
        out[:, 0] = _probit(s)
        return out
    a = np.broadcast_to(np.asarray(add_second_class), s.shape)
    c01 = (a == 0) | (a == 1)
    c23 = (a == 2) | (a == 3)
    cm1 = ~(c01 | c23)
    if post == "LOGISTIC":
        neg, pos = _logistic(-s), _logistic(s)
    else:
        neg, pos = -s, s
    if post == "LOGISTIC":  # onnxruntime >= 1.2x applies the logistic for 0/1 too
        out[:, 0] = np.where(c01 | c23, neg, s)
        out[:, 1] = np.where(c01 | c23, pos, _F32(0))
    else:
        out[:, 0] = np.where(c01, _F32(1) - s, np.where(c23, neg, s))
        out[:, 1] = np.where(c01, s, np.where(c23, pos, _F32(0)))
    out[cm1, 1] = 0
    return out


def _as_2d(x: np.ndarray, op: str) -> np.ndarray:
    if x.ndim == 0:
        raise ValueError(f"{op}: input must have at least one dimension")
    if x.ndim == 1:
        return x.reshape(1, -1)
    if x.ndim > 2:
        raise ValueError(f"{op}: input must be 1D or 2D, got shape {x.shape}")
    return x


def _to_f32(x: np.ndarray) -> np.ndarray:
    return x if x.dtype == _F32 else x.astype(_F32)


def _labels_array(values, strings: bool) -> np.ndarray:
    if strings:
        arr = np.empty(len(values), dtype=object)
        arr[:] = list(values)
        return arr
    return np.asarray(values, dtype=np.int64)


def _strings_out(values) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


# ---------------------------------------------------------------------------
# tree ensembles
# ---------------------------------------------------------------------------

# comparison codes, in the order of TreeEnsemble-5's nodes_modes enumeration
_LEQ, _LT, _GTE, _GT, _EQ, _NEQ, _MEMBER = range(7)
_LEAF = -1
_MODE_CODES = {"BRANCH_LEQ": _LEQ, "BRANCH_LT": _LT, "BRANCH_GTE": _GTE, "BRANCH_GT": _GT,
               "BRANCH_EQ": _EQ, "BRANCH_NEQ": _NEQ, "LEAF": _LEAF}
# bit set of {x < t: 1, x == t: 2, x > t: 4} for which a comparison is true
_MODE_BITS = np.array([3, 1, 6, 4, 2, 5], dtype=np.uint8)
_AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")


class _Forest:
    """A compiled tree ensemble.

    Nodes are laid out breadth first so that the false child of every branch
    node directly follows its true child: one step of the traversal is
    ``idx = base1[idx] - cond`` (``base1`` is the false child). Leaves get a NaN
    threshold, which makes ``cond`` constant, and a ``base1`` that maps them onto
    themselves. Rows x trees are evaluated together, tree-major.
    """

    __slots__ = ("feat", "thr", "base1", "bits", "nan_true", "is_branch", "same_mode", "has_nan_true",
                 "slot", "roots", "depth", "n_targets", "agg", "W", "H", "W1", "max_feature",
                 "thr_dtype", "groups", "const_has", "n_trees", "packed", "native")

    def _cond(self, v, th, node_bits, node_nan, nan_check):
        mode = self.same_mode
        if mode == _LEQ:
            cond = v <= th
        elif mode == _LT:
            cond = v < th
        elif mode == _GTE:
            cond = v >= th
        elif mode == _GT:
            cond = v > th
        elif mode == _EQ:
            cond = v == th
        elif mode == _NEQ:
            cond = v != th
        else:
            code = (v < th).view(np.uint8) | ((v == th).view(np.uint8) << 1) | (
                (v > th).view(np.uint8) << 2)
            cond = (node_bits() & code) != 0
        if nan_check:
            cond |= node_nan() & np.isnan(v)
        return cond

    def _native_layout(self, itemsize: int):
        """``(nodes, roots, slot)`` for ``_native.tree_leaves`` with thresholds of ``itemsize``
        bytes, or None when the ids do not fit its 32-bit fields.

        The nodes are re-laid tree by tree (breadth first inside each tree, so the children of a
        branch stay adjacent and one step is still ``next - cond``), each packed into one
        16- or 24-byte record: a tree's rows then walk a tree that sits in L1, where the
        level-major layout of the numpy walk puts every step of a tree on another cache line."""
        got = self.native.get(itemsize, ())
        if got != ():
            return got
        L = self.feat.shape[0]
        if L >= 2 ** 31 - 1 or (L and int(self.feat.max()) >= 2 ** 31):
            self.native[itemsize] = None
            return None
        tree = np.empty(L, np.int64)
        level = self.roots
        tree[level] = np.arange(level.size)
        while level.size:  # every node is below exactly one root (the layout is built that way)
            b = level[self.is_branch[level]]
            level = np.concatenate([self.base1[b] - 1, self.base1[b]])
            tree[level] = np.concatenate([tree[b], tree[b]])
        order = np.lexsort((np.arange(L), tree))
        new = np.empty(L, np.int64)
        new[order] = np.arange(L)
        branch = self.is_branch[order]
        own = np.arange(L, dtype=np.int64)
        leaf_next = own + 1 if self.same_mode == _NEQ else own  # NaN != NaN is true for leaves
        nxt = np.where(branch, new[np.where(branch, self.base1[order], 0)], leaf_next)
        # the C structs rc_node_f / rc_node_d of native/trees.c, field for field, in native byte order
        if itemsize == 4:
            dt = np.dtype([("feat", "=i4"), ("thr", "=f4"), ("next", "=i4"), ("branch", "u1"),
                           ("nan_true", "u1"), ("bits", "u1"), ("pad", "u1")])
        else:
            dt = np.dtype([("thr", "=f8"), ("feat", "=i4"), ("next", "=i4"), ("branch", "u1"),
                           ("nan_true", "u1"), ("bits", "u1"), ("pad", "u1", (5,))])
        nodes = np.zeros(L, dt)
        nodes["feat"] = self.feat[order]
        nodes["thr"] = self.thr[order]
        nodes["next"] = nxt
        nodes["branch"] = branch
        nodes["nan_true"] = self.nan_true[order]
        nodes["bits"] = self.bits[order]
        got = (nodes.view(np.uint8), np.ascontiguousarray(new[self.roots]), self.slot[order])
        self.native[itemsize] = got
        return got

    def leaves(self, X: np.ndarray, native: bool = True) -> np.ndarray:
        """Leaf slot reached by every row in every tree: ``(n_trees, N)`` intp.

        The walk is ``_native.tree_leaves`` where it is built and ``X`` is float; the level-by-
        level numpy walk below otherwise (``native=False`` forces it)."""
        n, c = X.shape
        roots = self.roots
        t = roots.shape[0]
        if self.depth == 0 or n * t == 0:
            return np.broadcast_to(self.slot[roots][:, None], (t, n)).copy()
        # compare in the wider of the two types, as numpy's promotion does
        isz = 8 if (X.dtype == np.float64 or self.thr_dtype == np.float64) else 4
        lay = self._native_layout(isz) if native and _native is not None and X.dtype.kind == "f" else None
        if lay is not None and c > 0:
            nodes, new_roots, slot = lay
            reached = np.empty((t, n), np.int64)
            _native.tree_leaves(np.ascontiguousarray(X, dtype=np.float64 if isz == 8 else np.float32),
                                nodes, new_roots, reached, (n, c, self.feat.shape[0], t), isz,
                                self.depth, self.same_mode, int(self.has_nan_true))
            return slot.take(reached, mode=_CLIP)
        # missing-value routing only matters when some input is NaN: one check per batch
        nan_check = self.has_nan_true and X.dtype.kind == "f" and bool(np.isnan(X).any())
        # level 0: every row of a tree is at its root, a broadcast comparison
        v = X[:, self.feat[roots]].T
        cond = self._cond(v, self.thr[roots][:, None], lambda: self.bits[roots][:, None],
                          lambda: self.nan_true[roots][:, None], nan_check)
        idx = (self.base1[roots][:, None] - cond).reshape(-1)
        flat = X.reshape(-1)
        rowoff = np.tile(np.arange(n, dtype=np.intp) * c, t)
        thr, is_branch = self.thr, self.is_branch
        packed = self.packed
        feat, base1 = self.feat, self.base1
        out = None
        pos = None
        for level in range(1, self.depth):
            if level >= 3 and level % 2 == 1:
                act = is_branch.take(idx, mode=_CLIP)
                k = int(np.count_nonzero(act))
                if k == 0:
                    break
                if k < 0.6 * idx.size:  # compact: carry on with the paths still in branches
                    if out is None:
                        out = idx.copy()
                        pos = np.flatnonzero(act)
                    else:
                        out[pos] = idx
                        pos = pos[act]
                    idx = idx[act]
                    rowoff = rowoff[act]
            cur = idx
            if packed is not None:
                # take() over 1-D tables is faster than fancy indexing; the subtraction reuses pk
                pk = packed.take(cur, mode=_CLIP)
                f = pk & 0xFFFFF
                f += rowoff
                v = flat.take(f, mode=_CLIP)
                cond = self._cond(v, thr.take(cur, mode=_CLIP), lambda: self.bits[cur], lambda: self.nan_true[cur],
                                  nan_check)
                pk >>= 20
                idx = np.subtract(pk, cond, out=pk)
            else:
                v = flat.take(rowoff + feat.take(cur, mode=_CLIP), mode=_CLIP)
                cond = self._cond(v, thr.take(cur, mode=_CLIP), lambda: self.bits[cur], lambda: self.nan_true[cur],
                                  nan_check)
                idx = base1.take(cur, mode=_CLIP) - cond
        if out is not None:
            out[pos] = idx
            idx = out
        return self.slot.take(idx, mode=_CLIP).reshape(t, n)

    def scores(self, X: np.ndarray):
        """Aggregated leaf weights ``(N, n_targets)`` (threshold dtype) and has-score flags.

        Sums run sequentially in tree order in the threshold dtype, as onnxruntime does.
        """
        n = X.shape[0]
        t = self.roots.shape[0]
        k = self.n_targets
        acc = self.thr_dtype
        out = np.zeros((n, k), dtype=acc)
        has = np.zeros((n, k), dtype=bool)
        if t == 0 or n == 0:
            return out, has
        chunk = max(1, (1 << 20) // max(1, t))
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            slots = self.leaves(X[start:stop])  # (t, rows)
            o = out[start:stop]
            if self.groups is not None:  # every tree writes one target: trees grouped by target
                vals = self.W1.take(slots, mode=_CLIP)
                for target, a, b in self.groups:
                    o[:, target] = _seq_reduce(vals[a:b], self.agg)
            else:
                o[:] = _seq_reduce(self.W.take(slots, axis=0, mode=_CLIP), self.agg)  # take: ~4x faster than W[slots]
            if self.const_has is None:
                has[start:stop] = self.H.take(slots, axis=0, mode=_CLIP).any(axis=0)
        if self.const_has is not None:
            has[:] = self.const_has
        if self.agg in ("MIN", "MAX"):
            out = np.where(has, out, acc.type(0))
        return out, has


#: every index the tree walk gathers with is valid by construction (children and leaf slots are
#: checked when the forest is built, feature ids against the input's width before a run):
#: ``take(mode="clip")`` skips the per-element bounds check that "raise" does (~30% of a gather)
_CLIP = "clip"


def _seq_reduce(vals: np.ndarray, agg: str) -> np.ndarray:
    """Reduce over axis 0 (trees), in order."""
    if agg == "MIN":
        return vals.min(axis=0)
    if agg == "MAX":
        return vals.max(axis=0)
    if vals.shape[0] == 0:
        return np.zeros(vals.shape[1:], vals.dtype)
    if vals[0].size < 2:  # numpy sums a single contiguous column pairwise: accumulate instead
        return np.add.accumulate(vals, axis=0)[-1]
    return vals.sum(axis=0, dtype=vals.dtype)


def _build_forest(feat, thr, modes, tchild, fchild, miss, roots, leaf_nodes, leaf_targets,
                  leaf_weights, n_targets, agg, thr_dtype) -> _Forest:
    """Compile global node arrays (``modes`` == -1 for leaves) into a :class:`_Forest`.

    ``leaf_nodes``/``leaf_targets``/``leaf_weights`` list the weights: weights on
    a node that is not a leaf are ignored (as onnxruntime does).
    """
    n = feat.shape[0]
    thr_dtype = np.dtype(thr_dtype)
    is_leaf = np.asarray(modes) == _LEAF
    feat = np.asarray(feat, dtype=np.intp)
    tchild = np.asarray(tchild, dtype=np.intp)
    fchild = np.asarray(fchild, dtype=np.intp)
    br = ~is_leaf
    if br.any() and ((tchild[br] < 0).any() or (tchild[br] >= n).any() or (fchild[br] < 0).any()
                     or (fchild[br] >= n).any()):
        raise ValueError("a tree node points to a child that does not exist")
    if br.any() and (feat[br] < 0).any():
        raise ValueError("negative feature id in a tree node")
    k = int(n_targets)
    # leaf weights, per original node
    ln = np.asarray(leaf_nodes, dtype=np.intp)
    lt = np.asarray(leaf_targets, dtype=np.intp)
    lw = np.asarray(leaf_weights, dtype=thr_dtype)
    keep = is_leaf[ln] if ln.size else np.zeros(0, dtype=bool)
    ln, lt, lw = ln[keep], lt[keep], lw[keep]
    if lt.size and ((lt < 0).any() or (lt >= k).any()):
        raise ValueError(f"a leaf weight targets index {int(lt.max())}, outside [0, {k})")
    leaf_ids = np.flatnonzero(is_leaf)
    lslot = np.zeros(n, dtype=np.intp)
    lslot[leaf_ids] = np.arange(leaf_ids.size)
    L = leaf_ids.size
    H = np.zeros((L, k), dtype=bool)
    if agg == "MIN":
        W = np.full((L, k), np.inf, dtype=thr_dtype)
        np.minimum.at(W, (lslot[ln], lt), lw)
    elif agg == "MAX":
        W = np.full((L, k), -np.inf, dtype=thr_dtype)
        np.maximum.at(W, (lslot[ln], lt), lw)
    else:
        W = np.zeros((L, k), dtype=thr_dtype)
        np.add.at(W, (lslot[ln], lt), lw)
    H[lslot[ln], lt] = True
    roots = np.asarray(roots, dtype=np.intp)
    n_trees = roots.size
    # which targets each tree writes: group trees by target when each writes one only
    # (breadth-first labelling of the original nodes with their tree)
    lv_nodes, lv_tree = roots, np.arange(n_trees, dtype=np.intp)
    leaf_tree_pairs = []
    guard = 0
    while lv_nodes.size:
        lf = is_leaf[lv_nodes]
        leaf_tree_pairs.append((lv_nodes[lf], lv_tree[lf]))
        b = ~lf
        lv_nodes = np.concatenate([tchild[lv_nodes[b]], fchild[lv_nodes[b]]])
        lv_tree = np.concatenate([lv_tree[b], lv_tree[b]])
        guard += 1
        if guard > n + 1:
            raise ValueError("the trees contain a cycle")
    pl = np.concatenate([p for p, _ in leaf_tree_pairs]) if leaf_tree_pairs else np.zeros(0, np.intp)
    pt = np.concatenate([q for _, q in leaf_tree_pairs]) if leaf_tree_pairs else np.zeros(0, np.intp)
    ph = H[lslot[pl]] if pl.size else np.zeros((0, k), bool)
    any_t = np.zeros((n_trees, k), dtype=bool)
    all_t = np.ones((n_trees, k), dtype=bool)
    np.logical_or.at(any_t, pt, ph)
    np.logical_and.at(all_t, pt, ph)
    const_has = any_t.any(axis=0) if np.array_equal(any_t, all_t) else None
    groups = None
    tree_order = np.arange(n_trees)
    n_written = any_t.sum(axis=1)
    if (n_written <= 1).all() and agg in ("SUM", "AVERAGE", "MIN", "MAX"):
        tgt = np.where(n_written == 1, any_t.argmax(axis=1), 0)
        tree_order = np.argsort(tgt, kind="stable")  # keeps each target's trees in order
        st = tgt[tree_order]
        groups = []
        for c in range(k):
            a, b = np.searchsorted(st, c, "left"), np.searchsorted(st, c, "right")
            if b > a:
                groups.append((c, int(a), int(b)))
    roots = roots[tree_order]
    # breadth-first layout: the children of each branch node are adjacent (true, false)
    level = roots
    new_old = [level]
    base1_parts = []
    nxt = level.size
    depth = 0
    while True:
        lf = is_leaf[level]
        b = ~lf
        cnt = int(np.count_nonzero(b))
        first = nxt - level.size  # new id of level[0]
        own = first + np.arange(level.size, dtype=np.intp)
        base1 = own.copy()  # leaves map onto themselves (their cond is False)
        base1[b] = nxt + 2 * np.arange(cnt, dtype=np.intp) + 1
        base1_parts.append(base1)
        if cnt == 0:
            break
        depth += 1
        if depth > n + 1:
            raise ValueError("the trees contain a cycle")
        ch = np.empty(2 * cnt, dtype=np.intp)
        ch[0::2] = tchild[level[b]]
        ch[1::2] = fchild[level[b]]
        level = ch
        new_old.append(level)
        nxt += 2 * cnt
    old = np.concatenate(new_old)
    base1 = np.concatenate(base1_parts)
    F = _Forest()
    F.native = {}
    F.thr_dtype = thr_dtype
    F.n_trees = n_trees
    leaf_new = is_leaf[old]
    F.is_branch = ~leaf_new
    F.feat = np.where(leaf_new, 0, feat[old]).astype(np.intp)
    modes_new = np.asarray(modes)[old]
    branch_modes = np.unique(modes_new[~leaf_new])
    F.same_mode = int(branch_modes[0]) if branch_modes.size == 1 else -1
    F.thr = np.where(leaf_new, np.nan, np.asarray(thr)[old]).astype(thr_dtype)
    if F.same_mode == _NEQ:
        base1 = np.where(leaf_new, base1 + 1, base1)  # NaN != NaN is true for leaves
    F.base1 = base1
    # feature and false child in one int64, one gather per step
    F.packed = ((base1.astype(np.int64) << 20) | F.feat).astype(np.intp) \
        if F.feat.size and F.feat.max() < (1 << 20) and base1.max() < (1 << 42) else None
    mcode = np.where(leaf_new, 0, modes_new).astype(np.intp)
    F.bits = np.where(leaf_new, 0, _MODE_BITS[mcode]).astype(np.uint8)
    nan_true = np.asarray(miss, dtype=bool)[old] & ~leaf_new
    if F.same_mode == -1:
        nan_true = nan_true | ((modes_new == _NEQ) & ~leaf_new)  # NaN != t is true
    F.nan_true = nan_true
    F.has_nan_true = bool(nan_true.any())
    F.max_feature = int(F.feat[~leaf_new].max()) if (~leaf_new).any() else -1
    F.roots = np.arange(roots.size, dtype=np.intp)
    F.depth = depth
    F.slot = np.where(leaf_new, lslot[old], 0).astype(np.intp)
    F.n_targets = k
    F.agg = agg
    F.W, F.H = W, H
    F.groups = groups
    if groups is not None:
        # the one weight of each leaf for its tree's target (0 if the leaf has none)
        W1 = np.zeros(L, dtype=thr_dtype)
        fill = 0.0 if agg in ("SUM", "AVERAGE") else (np.inf if agg == "MIN" else -np.inf)
        W1[:] = fill
        if pl.size:
            tgt_of_tree = np.zeros(n_trees, dtype=np.intp)
            tgt_of_tree[tree_order] = np.repeat([g[0] for g in groups], [g[2] - g[1] for g in groups]) \
                if groups else 0
            sl = lslot[pl]
            W1[sl] = W[sl, tgt_of_tree[pt]]
        F.W1 = W1
    else:
        F.W1 = None
    F.const_has = const_has
    return F


def _forest_v3(attrs, prefix: str, n_targets: int, agg: str, x_dtype) -> _Forest:
    """TreeEnsembleRegressor/Classifier-1/3 attributes -> :class:`_Forest`.

    Thresholds, weights and sums are double for double inputs (or double
    ``*_as_tensor`` attributes), else float, as in onnxruntime.
    """
    treeids = np.asarray(attrs.get("nodes_treeids") or [], dtype=np.int64)
    nodeids = np.asarray(attrs.get("nodes_nodeids") or [], dtype=np.int64)
    n = treeids.size
    featids = np.asarray(attrs.get("nodes_featureids") or [], dtype=np.int64)
    modes_s = attrs.get("nodes_modes") or []
    true_ids = np.asarray(attrs.get("nodes_truenodeids") or [], dtype=np.int64)
    false_ids = np.asarray(attrs.get("nodes_falsenodeids") or [], dtype=np.int64)
    thr_dtype = np.float64 if np.dtype(x_dtype) == np.float64 else np.float32
    vt = attrs.get("nodes_values_as_tensor")
    if vt is not None:
        thr = np.asarray(vt).reshape(-1)
        if thr.dtype == np.float64:
            thr_dtype = np.float64
    else:
        thr = np.asarray(attrs.get("nodes_values") or [], dtype=np.float32)
    wt = attrs.get(f"{prefix}_weights_as_tensor")
    if wt is not None:
        weights = np.asarray(wt).reshape(-1)
        if weights.dtype == np.float64:
            thr_dtype = np.float64
    else:
        weights = np.asarray(attrs.get(f"{prefix}_weights") or [], dtype=np.float32)
    for name, arr in (("nodes_nodeids", nodeids), ("nodes_featureids", featids),
                      ("nodes_truenodeids", true_ids), ("nodes_falsenodeids", false_ids),
                      ("nodes_values", thr)):
        if arr.size != n:
            raise ValueError(f"{name} has {arr.size} entries, nodes_treeids has {n}")
    if len(modes_s) != n:
        raise ValueError(f"nodes_modes has {len(modes_s)} entries, nodes_treeids has {n}")
    try:
        modes = np.array([_MODE_CODES[m] for m in modes_s], dtype=np.int64)
    except KeyError as exc:
        raise ValueError(f"unknown node mode {exc.args[0]!r}") from None
    mv = attrs.get("nodes_missing_value_tracks_true") or []
    miss = np.zeros(n, dtype=bool)
    m = min(len(mv), n)
    miss[:m] = np.asarray(mv[:m], dtype=np.int64) == 1
    # (tree, node) -> position
    if n:
        if (nodeids < 0).any():
            raise ValueError("negative node id")
        span = int(max(nodeids.max(), true_ids.max(initial=0), false_ids.max(initial=0))) + 1
        tmin = int(treeids.min())
        keys = (treeids - tmin) * span + nodeids
        order = np.argsort(keys, kind="stable")
        skeys = keys[order]
        if (skeys[1:] == skeys[:-1]).any():
            raise ValueError("a (tree id, node id) pair appears twice")
    else:
        span, tmin, order, skeys = 1, 0, np.zeros(0, np.intp), np.zeros(0, np.int64)

    def lookup(tids, nids, what):
        tids = np.asarray(tids, dtype=np.int64)
        nids = np.asarray(nids, dtype=np.int64)
        if tids.size == 0:
            return np.zeros(0, dtype=np.intp)
        k = (tids - tmin) * span + nids
        pos = np.searchsorted(skeys, k)
        posc = np.minimum(pos, max(skeys.size - 1, 0))
        ok = (pos < skeys.size) & (nids >= 0) & (nids < span) & (tids >= tmin)
        if skeys.size:
            ok &= skeys[posc] == k
        if not ok.all():
            bad = int(np.flatnonzero(~ok)[0])
            raise ValueError(f"{what} refers to node {int(nids[bad])} of tree {int(tids[bad])}, "
                             "which does not exist")
        return order[posc]

    is_leaf = modes == _LEAF
    br = ~is_leaf
    tchild = np.zeros(n, dtype=np.intp)
    fchild = np.zeros(n, dtype=np.intp)
    tchild[br] = lookup(treeids[br], true_ids[br], "nodes_truenodeids")
    fchild[br] = lookup(treeids[br], false_ids[br], "nodes_falsenodeids")
    # a root starts each run of equal tree ids (onnxruntime)
    roots = np.flatnonzero(np.r_[True, treeids[1:] != treeids[:-1]]) if n else np.zeros(0, np.intp)
    ttree = np.asarray(attrs.get(f"{prefix}_treeids") or [], dtype=np.int64)
    tnode = np.asarray(attrs.get(f"{prefix}_nodeids") or [], dtype=np.int64)
    tid = np.asarray(attrs.get(f"{prefix}_ids") or [], dtype=np.int64)
    if not (ttree.size == tnode.size == tid.size == weights.size):
        raise ValueError(f"{prefix}_treeids/_nodeids/_ids/_weights have different lengths")
    lnodes = lookup(ttree, tnode, f"{prefix}_nodeids")
    return _build_forest(featids, thr, modes, tchild, fchild, miss, roots, lnodes, tid, weights,
                         n_targets, agg, thr_dtype)


def _float_or_tensor(attrs, name):
    t = attrs.get(f"{name}_as_tensor")
    if t is not None:
        return np.asarray(t).reshape(-1)
    v = attrs.get(name)
    return np.asarray(v if v is not None else [], dtype=np.float32)


def _tree_input(X: np.ndarray, F: _Forest, op: str) -> np.ndarray:
    X = _as_2d(X, op)
    if X.dtype.kind in "iu":
        X = X.astype(F.thr_dtype)  # integers compare as the threshold type
    elif X.dtype == np.float16:
        X = X.astype(_F32)
    if F.max_feature >= X.shape[1]:
        raise ValueError(f"{op}: a tree reads feature {F.max_feature} but the input has "
                         f"{X.shape[1]} features")
    return X


def _regression_finalize(score, has, F: _Forest, base, post: str, n_trees: int, out_dtype):
    """TreeAggregator{Sum,Average,Min,Max}.FinalizeScores(1)."""
    k = F.n_targets
    acc = F.thr_dtype.type
    base = np.asarray(base, dtype=F.thr_dtype)
    if k == 1:
        origin = base[0] if base.size == 1 else acc(0)
        s = score[:, 0]
        if F.agg == "SUM":
            s = s + origin
        elif F.agg == "AVERAGE":
            s = s / acc(n_trees) + origin
        else:
            s = np.where(has[:, 0], s + origin, origin)
        if post == "PROBIT":
            s = _probit(s.astype(_F32))
        return s.astype(out_dtype).reshape(-1, 1)
    use_base = base.size == k
    if F.agg == "SUM":
        s = score + base if use_base else score
    elif F.agg == "AVERAGE":
        s = score / acc(n_trees)
        if use_base:
            s = s + base
    else:
        s = score + base if use_base else score
    # a target no leaf wrote is 0, base value or not (onnxruntime writes has_score ? score : 0)
    s = np.where(has, s, acc(0))
    if post == "NONE":
        return s.astype(out_dtype)
    return _transform_rows(s.astype(_F32), post).astype(out_dtype)


def _regressor_forest(ctx, attrs, x_dtype):
    F = ctx.cache.get("forest")
    if F is None:
        n_targets = attrs.get("n_targets")
        if not n_targets or n_targets <= 0:
            raise ValueError("n_targets must be a positive integer")
        agg = attrs.get("aggregate_function") or "SUM"
        if agg not in _AGGREGATES:
            raise ValueError(f"unknown aggregate_function {agg!r}")
        F = _forest_v3(attrs, "target", n_targets, agg, x_dtype)
        ctx.cache["forest"] = F
    return F


def _check_post(name="post_transform"):
    def check(node):
        v = node.attrs.get(name)
        if v is not None and v not in _TRANSFORMS:
            return f"{name}={v!r} is not one of {', '.join(_TRANSFORMS)}"
        return None
    return check


def _check_tree_regressor(node):
    a = node.attrs
    why = _check_post()(node)
    if why:
        return why
    if a.get("aggregate_function") not in (None, *_AGGREGATES):
        return f"aggregate_function={a.get('aggregate_function')!r} is not supported"
    return None


@kernel("TreeEnsembleRegressor", 1, 3, 5, domain=ML, check=_check_tree_regressor,
        dtypes={"float32", "float64", "int64", "int32"})
def tree_ensemble_regressor(ctx, X, **attrs):
    F = _regressor_forest(ctx, attrs, X.dtype)
    Xc = _tree_input(X, F, "TreeEnsembleRegressor")
    score, has = F.scores(Xc)
    base = _float_or_tensor(attrs, "base_values")
    return _regression_finalize(score, has, F, base, attrs.get("post_transform") or "NONE",
                                F.n_trees, _F32)


def _check_tree_classifier(node):
    a = node.attrs
    why = _check_post()(node)
    if why:
        return why
    if not a.get("classlabels_strings") and not a.get("classlabels_int64s"):
        return "TreeEnsembleClassifier needs classlabels_strings or classlabels_int64s"
    return None


@kernel("TreeEnsembleClassifier", 1, 3, 5, domain=ML, check=_check_tree_classifier,
        dtypes={"float32", "float64", "int64", "int32"})
def tree_ensemble_classifier(ctx, X, **attrs):
    st = ctx.cache.get("clf")
    if st is None:
        strings = attrs.get("classlabels_strings") or []
        ints = attrs.get("classlabels_int64s") or []
        use_strings = bool(strings)
        labels = _labels_array(strings if use_strings else ints, use_strings)
        k = len(labels)
        F = _forest_v3(attrs, "class", k, "SUM", X.dtype)
        cw = _float_or_tensor(attrs, "class_weights")
        cids = attrs.get("class_ids") or []
        binary_case = k == 2 and len(set(cids)) == 1
        all_positive = not (cw < 0).any()
        base = _float_or_tensor(attrs, "base_values").astype(F.thr_dtype)
        st = (F, labels, use_strings, binary_case, all_positive, base)
        ctx.cache["clf"] = st
    F, labels, use_strings, binary_case, all_positive, base = st
    post = attrs.get("post_transform") or "NONE"
    Xc = _tree_input(X, F, "TreeEnsembleClassifier")
    score, has = F.scores(Xc)
    n = score.shape[0]
    k = F.n_targets
    acc = F.thr_dtype.type
    if k > 2:
        nb = min(base.size, k)
        if nb:
            score[:, :nb] += base[:nb]
            has[:, :nb] = True
        masked = np.where(has, score, -np.inf)
        maxclass = np.argmax(masked, axis=1)
        Y = labels[maxclass]
        z = np.where(has, score, acc(0)).astype(_F32)
        Z = z if post == "NONE" else _transform_rows(z, post)
        return Y, Z
    if k == 2:
        s0, s1 = score[:, 0].copy(), score[:, 1].copy()
        h0, h1 = has[:, 0].copy(), has[:, 1].copy()
        wa = np.full(n, -1, dtype=np.int64)
        if base.size == 2:
            s1 = np.where(h1, base[1] + s0, s1 + base[1])
            s0 = np.where(h1, -s1, s0 + base[0])
            two = np.ones(n, dtype=bool)
        elif base.size == 1:
            s0 = s0 + base[0]
            two = h1.copy()
        elif base.size == 0:
            wa[:] = 3
            two = h1.copy()
        else:
            two = np.ones(n, dtype=bool)
        pos_weight = np.where(two & h1, s1, np.where(h0, s0, acc(0)))
        if binary_case:
            if all_positive:
                positive = pos_weight > 0.5
                wa = np.where(positive, 0, 1)
            else:
                positive = pos_weight > 0
                wa = np.where(positive, 2, 3)
            Y = labels[positive.astype(np.intp)]
        else:
            positive = pos_weight > 0
            if use_strings:
                Y = labels[positive.astype(np.intp)]
            else:  # onnxruntime returns the raw 1/0 here, not a class label
                Y = positive.astype(np.int64)
        v0 = np.where(h0, s0, acc(0)).astype(_F32)
        v1 = np.where(h1, s1, acc(0)).astype(_F32)
        Z = np.empty((n, 2), dtype=_F32)
        if two.any():
            z2 = np.stack([v0[two], v1[two]], axis=1)
            Z[two] = z2 if post == "NONE" else _transform_rows(z2, post)
        one = ~two
        if one.any():
            Z[one] = _binary_expand(v0[one], post, wa[one])
        return Y, Z
    # a single class: TreeAggregatorClassifier.FinalizeScores1
    s = score[:, 0]
    if base.size >= 1:
        s = s + (base[1] if base.size == 2 else base[0])
    positive = s > 0
    Y = labels[np.minimum(positive.astype(np.intp), len(labels) - 1)] if use_strings else positive.astype(np.int64)
    z = s.astype(_F32)
    if post == "PROBIT":
        z = _probit(z)
    return Y, z.reshape(-1, 1)


_V5_AGG = {0: "AVERAGE", 1: "SUM", 2: "MIN", 3: "MAX"}
_V5_POST = {0: "NONE", 1: "SOFTMAX", 2: "LOGISTIC", 3: "SOFTMAX_ZERO", 4: "PROBIT"}


def _check_tree_v5(node):
    a = node.attrs
    if a.get("aggregate_function") not in _V5_AGG:
        return f"aggregate_function={a.get('aggregate_function')!r} is not in 0..3"
    if a.get("post_transform") not in _V5_POST:
        return f"post_transform={a.get('post_transform')!r} is not in 0..4"
    return None


def _forest_v5(attrs, thr_dtype) -> _Forest:
    splits = np.asarray(attrs["nodes_splits"]).reshape(-1)
    n = splits.size
    featids = np.asarray(attrs["nodes_featureids"], dtype=np.int64)
    modes = np.asarray(attrs["nodes_modes"]).reshape(-1).astype(np.int64)
    tids = np.asarray(attrs["nodes_truenodeids"], dtype=np.int64)
    fids = np.asarray(attrs["nodes_falsenodeids"], dtype=np.int64)
    tleaf = np.asarray(attrs["nodes_trueleafs"], dtype=np.int64) != 0
    fleaf = np.asarray(attrs["nodes_falseleafs"], dtype=np.int64) != 0
    for name, arr in (("nodes_featureids", featids), ("nodes_modes", modes), ("nodes_truenodeids", tids),
                      ("nodes_falsenodeids", fids), ("nodes_trueleafs", tleaf), ("nodes_falseleafs", fleaf)):
        if arr.size != n:
            raise ValueError(f"{name} has {arr.size} entries, nodes_splits has {n}")
    if ((modes < 0) | (modes > _MEMBER)).any():
        raise ValueError("nodes_modes values must be in 0..6")
    lw = np.asarray(attrs["leaf_weights"]).reshape(-1)
    lt = np.asarray(attrs["leaf_targetids"], dtype=np.int64)
    if lw.size != lt.size:
        raise ValueError("leaf_weights and leaf_targetids have different lengths")
    nl = lw.size
    mv = attrs.get("nodes_missing_value_tracks_true")
    miss = np.zeros(n, dtype=bool)
    if mv:
        m = min(len(mv), n)
        miss[:m] = np.asarray(mv[:m], dtype=np.int64) != 0
    roots_in = np.asarray(attrs["tree_roots"], dtype=np.int64)
    if ((roots_in < 0) | (roots_in >= max(n, 1))).any() and n:
        raise ValueError("tree_roots must index nodes_*")
    if ((tids < 0) | np.where(tleaf, tids >= nl, tids >= n)).any() or (
            (fids < 0) | np.where(fleaf, fids >= nl, fids >= n)).any():
        raise ValueError("a node's true/false id is out of range")
    # global layout: [interior nodes 0..n) [leaves n..n+nl) [unrolled member nodes]
    g_t = np.where(tleaf, n + tids, tids)
    g_f = np.where(fleaf, n + fids, fids)
    g_feat = featids.copy()
    g_thr = splits.astype(thr_dtype)
    g_mode = modes.copy()
    g_miss = miss.copy()
    extra_feat, extra_thr, extra_t, extra_f, extra_miss = [], [], [], [], []
    member = np.flatnonzero(modes == _MEMBER)
    if member.size:
        mvals = attrs.get("membership_values")
        if mvals is None:
            raise ValueError("BRANCH_MEMBER nodes need membership_values")
        mvals = np.asarray(mvals).reshape(-1)
        nan_pos = np.flatnonzero(np.isnan(mvals))
        sets = np.split(mvals, nan_pos)
        sets = [s[~np.isnan(s)] for s in sets]
        base_id = n + nl
        for j, node in enumerate(member.tolist()):
            vals = sets[j] if j < len(sets) else np.zeros(0, mvals.dtype)
            if vals.size == 0:
                # an empty set: nothing is a member (NaN may still track true)
                vals = np.array([np.nan], dtype=mvals.dtype)
            # a chain of BRANCH_EQ tests, one per member, all with the node's true branch;
            # the last test's false branch is the node's false branch
            real_false = g_f[node]
            g_mode[node] = _EQ
            g_thr[node] = vals[0]
            prev = node
            for v in vals[1:].tolist():
                nid = base_id + len(extra_feat)
                if prev == node:
                    g_f[node] = nid
                else:
                    extra_f[prev - base_id] = nid
                extra_feat.append(featids[node])
                extra_thr.append(v)
                extra_t.append(g_t[node])
                extra_miss.append(miss[node])
                extra_f.append(real_false)
                prev = nid
    ne = len(extra_feat)
    feat = np.concatenate([g_feat, np.zeros(nl, np.int64), np.asarray(extra_feat, np.int64)])
    thr = np.concatenate([g_thr, np.zeros(nl, thr_dtype), np.asarray(extra_thr, thr_dtype)])
    mode = np.concatenate([g_mode, np.full(nl, _LEAF, np.int64), np.full(ne, _EQ, np.int64)])
    tch = np.concatenate([g_t, np.zeros(nl, np.int64), np.asarray(extra_t, np.int64)])
    fch = np.concatenate([g_f, np.zeros(nl, np.int64), np.asarray(extra_f, np.int64)])
    msv = np.concatenate([g_miss, np.zeros(nl, bool), np.asarray(extra_miss, bool)])
    # a root whose two branches reach the same leaf is that leaf
    root_leaf = tleaf[roots_in] & fleaf[roots_in] & (tids[roots_in] == fids[roots_in]) if n else \
        np.zeros(0, bool)
    roots = np.where(root_leaf, n + tids[roots_in] if n else 0, roots_in)
    n_targets = attrs.get("n_targets")
    if n_targets is None:
        n_targets = int(lt.max()) + 1 if lt.size else 1
    agg = _V5_AGG[attrs["aggregate_function"]]
    return _build_forest(feat, thr, mode, tch, fch, msv, roots, n + np.arange(nl), lt, lw, n_targets,
                         agg, thr_dtype)


@kernel("TreeEnsemble", 5, domain=ML, check=_check_tree_v5, dtypes={"float32", "float64", "float16"})
def tree_ensemble(ctx, X, **attrs):
    F = ctx.cache.get("forest")
    if F is None:
        thr_dtype = _F64 if X.dtype == _F64 else _F32
        F = _forest_v5(attrs, thr_dtype)
        ctx.cache["forest"] = F
    Xc = _tree_input(X, F, "TreeEnsemble")
    score, has = F.scores(Xc)
    post = _V5_POST[attrs["post_transform"]]
    return _regression_finalize(score, has, F, [], post, F.n_trees, X.dtype)


# ---------------------------------------------------------------------------
# linear models
# ---------------------------------------------------------------------------


def _batched_update(scores: np.ndarray, post: str, add_second_class: int) -> np.ndarray:
    """onnxruntime ``batched_update_scores_inplace`` on ``(N, K)`` float32 scores."""
    k = scores.shape[1]
    if k > 1:
        return _transform_rows(scores, post)
    if post == "PROBIT":
        p = _probit(scores[:, 0])
        if add_second_class >= 0:
            out = np.zeros((scores.shape[0], 2), _F32)
            out[:, 0] = p
            return out
        return p.reshape(-1, 1)
    if add_second_class >= 0:
        return _binary_expand(scores[:, 0], post, add_second_class)
    return scores


@kernel("LinearClassifier", 1, domain=ML, check=_check_post(),
        dtypes={"float32", "float64", "int64", "int32"})
def linear_classifier(ctx, X, *, coefficients, intercepts, post_transform, classlabels_ints,
                      classlabels_strings, multi_class):
    X2 = _to_f32(_as_2d(X, "LinearClassifier"))
    n, f = X2.shape
    st = ctx.cache.get("lin")
    if st is None:
        coef = np.asarray(coefficients, dtype=_F32)
        inter = np.asarray(intercepts or [], dtype=_F32)
        k = inter.size if inter.size else (coef.size // f if f else 0)
        if inter.size == 0:
            inter = np.zeros(k, _F32)
        if k == 0 or coef.size != k * f:
            raise ValueError(f"LinearClassifier: {coef.size} coefficients do not fit {k} classes "
                             f"x {f} features")
        st = (np.ascontiguousarray(coef.reshape(k, f).T), inter, k)
        ctx.cache["lin"] = st
    coefT, inter, k = st
    if coefT.shape[0] != f:
        raise ValueError(f"LinearClassifier: input has {f} features, the model {coefT.shape[0]}")
    scores = (X2 @ coefT + inter).astype(_F32, copy=False)
    use_strings = bool(classlabels_strings)
    labels = list(classlabels_strings) if use_strings else list(classlabels_ints or [])
    if k == 1:
        two = len(labels) == 2
        pos = labels[1] if two else ("1" if use_strings else 1)
        neg = labels[0] if two else ("0" if use_strings else 0)
        positive = scores[:, 0] > 0
        if use_strings:
            Y = _strings_out([pos if p else neg for p in positive.tolist()])
        else:
            Y = np.where(positive, np.int64(pos), np.int64(neg)).astype(np.int64)
        add = two
    else:
        maxclass = np.argmax(scores, axis=1)
        if len(labels) < k:
            raise ValueError(f"LinearClassifier: {k} classes but {len(labels)} class labels")
        Y = _labels_array(labels, use_strings)[maxclass]
        add = False
    if post_transform != "NONE" or add:
        Z = _batched_update(scores, post_transform, 1 if add else -1)
    else:
        Z = scores
    return Y, Z


@kernel("LinearRegressor", 1, domain=ML, check=_check_post(),
        dtypes={"float32", "float64", "int64", "int32"})
def linear_regressor(ctx, X, *, coefficients, intercepts, targets, post_transform):
    X2 = _to_f32(_as_2d(X, "LinearRegressor"))
    n, f = X2.shape
    coef = np.asarray(coefficients or [], dtype=_F32)
    t = int(targets)
    if coef.size != t * f:
        raise ValueError(f"LinearRegressor: {coef.size} coefficients do not fit {t} targets x {f} features")
    Y = X2 @ coef.reshape(t, f).T
    inter = intercepts or []
    if len(inter) == t:
        Y = Y + np.asarray(inter, dtype=_F32)
    Y = Y.astype(_F32, copy=False)
    if post_transform != "NONE":
        Y = _batched_update(Y, post_transform, -1)
    return Y


# ---------------------------------------------------------------------------
# SVM
# ---------------------------------------------------------------------------


def _svm_kernel(X: np.ndarray, SV: np.ndarray, ktype: str, params) -> np.ndarray:
    gamma = _F32(params[0]) if params else _F32(0)
    coef0 = _F32(params[1]) if params and len(params) > 1 else _F32(0)
    degree = _F32(params[2]) if params and len(params) > 2 else _F32(0)
    if ktype == "RBF":
        x64 = X.astype(_F64)
        s64 = SV.astype(_F64)
        d = (x64 * x64).sum(1)[:, None] + (s64 * s64).sum(1)[None, :] - 2.0 * (x64 @ s64.T)
        d = np.maximum(d, 0.0)
        return np.exp(-_F64(gamma) * d).astype(_F32)
    dot = (X @ SV.T).astype(_F32, copy=False)
    if ktype == "LINEAR":
        return dot
    k = gamma * dot + coef0
    if ktype == "POLY":
        if degree == 2:
            return k * k
        if degree == 3:
            return k * k * k
        return np.power(k, degree).astype(_F32)
    return np.tanh(k).astype(_F32)


def _check_svm(node):
    why = _check_post()(node)
    if why:
        return why
    kt = node.attrs.get("kernel_type")
    if kt not in (None, "LINEAR", "POLY", "RBF", "SIGMOID"):
        return f"kernel_type={kt!r} is not LINEAR, POLY, RBF or SIGMOID"
    return None


def _multiclass_probability(P: np.ndarray) -> np.ndarray:
    """Pairwise coupling (libsvm / onnxruntime ``multiclass_probability``), all rows at once."""
    n, k, _ = P.shape
    P = P.astype(_F32)
    Q = np.zeros((n, k, k), _F32)
    for i in range(k):
        for j in range(k):
            if j != i:
                Q[:, i, i] += P[:, j, i] * P[:, j, i]
                Q[:, i, j] = -P[:, j, i] * P[:, i, j]
    p = np.full((n, k), _F32(1) / _F32(k), _F32)
    eps = _F32(0.005) / _F32(k)
    active = np.ones(n, dtype=bool)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for _ in range(100):
            Qa = Q[active]
            pa = p[active]
            Qp = np.einsum("nij,nj->ni", Qa, pa).astype(_F32)
            pQp = (pa * Qp).sum(1).astype(_F32)
            err = np.abs(Qp - pQp[:, None]).max(1)
            done = err < eps
            idx = np.flatnonzero(active)
            active[idx[done]] = False
            if not active.any():
                break
            keep = ~done
            Qa, pa, Qp, pQp = Qa[keep], pa[keep], Qp[keep], pQp[keep]
            for i in range(k):
                qii = Qa[:, i, i]
                diff = ((-Qp[:, i] + pQp) / qii).astype(_F32)
                pa[:, i] += diff
                one = _F32(1) + diff
                pQp = ((pQp + diff * (diff * qii + _F32(2) * Qp[:, i])) / one / one).astype(_F32)
                Qp = ((Qp + diff[:, None] * Qa[:, i, :]) / one[:, None]).astype(_F32)
                pa = (pa / one[:, None]).astype(_F32)
            p[idx[keep]] = pa
    return p


@kernel("SVMClassifier", 1, domain=ML, check=_check_svm, dtypes={"float32", "float64", "int64", "int32"})
def svm_classifier(ctx, X, *, classlabels_ints, classlabels_strings, coefficients, kernel_params,
                   kernel_type, post_transform, prob_a, prob_b, rho, support_vectors, vectors_per_class):
    X2 = _to_f32(_as_2d(X, "SVMClassifier"))
    n, f = X2.shape
    use_strings = bool(classlabels_strings)
    labels = list(classlabels_strings) if use_strings else list(classlabels_ints or [])
    k = len(labels) if labels else 1
    coef = np.asarray(coefficients or [], dtype=_F32)
    rho_a = np.asarray(rho or [0.0], dtype=_F32)
    vpc = [int(v) for v in (vectors_per_class or [])]
    nv = sum(vpc)
    have_proba = bool(prob_a)
    n_clf = k * (k - 1) // 2
    votes = None
    if nv > 0:  # SVC
        sv = np.asarray(support_vectors or [], dtype=_F32)
        fc = sv.size // nv
        if fc != f:
            raise ValueError(f"SVMClassifier: input has {f} features, the support vectors {fc}")
        kern = _svm_kernel(X2, sv.reshape(nv, fc), kernel_type, kernel_params)
        C = coef.reshape(-1, nv)
        starts = np.cumsum([0] + vpc)
        clf = np.zeros((n, max(n_clf, 0)), _F32)
        votes = np.zeros((n, k), dtype=np.int64)
        c = 0
        for i in range(k - 1):
            si = slice(starts[i], starts[i + 1])
            for j in range(i + 1, k):
                sj = slice(starts[j], starts[j + 1])
                s = ((kern[:, si] * C[j - 1, si]).astype(_F64).sum(1)
                     + (kern[:, sj] * C[i, sj]).astype(_F64).sum(1) + _F64(rho_a[c]))
                clf[:, c] = s.astype(_F32)
                win_i = s > 0
                votes[:, i] += win_i
                votes[:, j] += ~win_i
                c += 1
        if have_proba:
            pa = np.asarray(prob_a, dtype=_F32)
            pb = np.asarray(prob_b or [], dtype=_F32)
            P = np.zeros((n, k, k), _F32)
            c = 0
            for i in range(k - 1):
                for j in range(i + 1, k):
                    val1 = _F32(1) - _logistic(clf[:, c] * pa[c] + pb[c])
                    val2 = np.minimum(np.maximum(val1, _F32(1e-7)), _F32(1) - _F32(1e-7))
                    P[:, i, j] = val2
                    P[:, j, i] = _F32(1) - val2
                    c += 1
            scores = _multiclass_probability(P)
        else:
            scores = clf
        maxclass = np.argmax(votes, axis=1)
        max_weight = np.zeros(n, _F32)
    else:  # linear
        if coef.size % k:
            raise ValueError("SVMClassifier: coefficients do not fit the classes")
        fc = coef.size // k
        if fc != f:
            raise ValueError(f"SVMClassifier: input has {f} features, the model {fc}")
        scores = (X2 @ coef.reshape(k, fc).T + rho_a[0]).astype(_F32)
        maxclass = np.argmax(scores, axis=1)
        max_weight = scores[np.arange(n), maxclass]
    lab = _labels_array(labels, use_strings) if labels else np.zeros(1, np.int64)
    if n_clf == 1:
        if not have_proba:
            all_pos = bool((coef >= 0).all())
            if all_pos:
                pick1 = max_weight >= 0.5
            else:
                pick1 = max_weight > 0
            idx = np.where(pick1, 1, maxclass)
        else:
            idx = maxclass
        Y = lab[idx]
    else:
        Y = lab[np.minimum(maxclass, lab.size - 1)]
    # scores
    if nv > 0 and not have_proba and k <= 2:
        wa = 2 if post_transform == "NONE" else 0
        Z = _batched_update(scores[:, :1], post_transform, wa)
    elif post_transform == "NONE":
        Z = scores.astype(_F32, copy=False)
    else:
        Z = _batched_update(scores.astype(_F32, copy=False), post_transform, -1)
    return Y, Z


@kernel("SVMRegressor", 1, domain=ML, check=_check_svm, dtypes={"float32", "float64", "int64", "int32"})
def svm_regressor(ctx, X, *, coefficients, kernel_params, kernel_type, n_supports, one_class,
                  post_transform, rho, support_vectors):
    X2 = _to_f32(_as_2d(X, "SVMRegressor"))
    n, f = X2.shape
    coef = np.asarray(coefficients or [], dtype=_F32)
    rho0 = _F32(rho[0]) if rho else _F32(0)
    nv = int(n_supports or 0)
    if nv > 0:
        sv = np.asarray(support_vectors or [], dtype=_F32)
        fc = sv.size // nv
        if fc != f:
            raise ValueError(f"SVMRegressor: input has {f} features, the support vectors {fc}")
        kern = _svm_kernel(X2, sv.reshape(nv, fc), kernel_type, kernel_params)
        y = kern @ coef[:nv] + rho0
    else:
        if coef.size != f:
            raise ValueError(f"SVMRegressor: input has {f} features, the model {coef.size}")
        y = X2 @ coef + rho0
    y = y.astype(_F32, copy=False)
    if one_class:
        y = np.where(y > 0, _F32(1), _F32(-1))
    return y.reshape(-1, 1)


# ---------------------------------------------------------------------------
# preprocessing
# ---------------------------------------------------------------------------


@kernel("Scaler", 1, domain=ML, dtypes={"float32", "float64", "int64", "int32"})
def scaler(ctx, X, *, offset, scale):
    if X.ndim == 0:
        raise ValueError("Scaler: input has no dimensions")
    stride = X.shape[0] if X.ndim == 1 else X.shape[1]
    sc = np.asarray(scale or [], dtype=_F32)
    off = np.asarray(offset if offset is not None else [0.0] * max(sc.size, 1), dtype=_F32)
    if sc.size == 0:
        raise ValueError("Scaler: scale is empty")
    xs = X.astype(_F64) if X.dtype == _F64 else _to_f32(X)
    if sc.size == stride and off.size == stride:
        flat = xs.reshape(-1)
        cols = np.arange(flat.size) % stride if X.ndim > 2 else None
        if cols is None:
            shape = (1,) * (X.ndim - 1) + (stride,)
            y = (xs - off.astype(xs.dtype).reshape(shape)) * sc.astype(xs.dtype).reshape(shape)
        else:
            y = ((flat - off.astype(xs.dtype)[cols]) * sc.astype(xs.dtype)[cols]).reshape(X.shape)
    elif sc.size == 1 and off.size == 1:
        y = (xs - off.astype(xs.dtype)[0]) * sc.astype(xs.dtype)[0]
    else:
        raise ValueError(f"Scaler: scale and offset must both have size {stride} or 1 "
                         f"(got {sc.size} and {off.size})")
    return np.asarray(y).astype(_F32, copy=False)


@kernel("Normalizer", 1, domain=ML, dtypes={"float32", "float64", "int64", "int32"})
def normalizer(ctx, X, *, norm):
    if norm not in ("MAX", "L1", "L2"):
        raise ValueError(f"Normalizer: norm={norm!r} is not MAX, L1 or L2")
    if X.ndim == 0:
        raise ValueError("Normalizer: input has no dimensions")
    axis = 0 if X.ndim == 1 else 1
    xf = _to_f32(X)
    if norm == "MAX":
        d = xf.max(axis=axis, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(d != 0, xf / np.where(d != 0, d, 1), xf).astype(_F32, copy=False)
    if norm == "L1":
        d = np.abs(X).astype(_F32).sum(axis=axis, keepdims=True, dtype=_F32)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(d != 0, xf / np.where(d != 0, d, 1), xf).astype(_F32, copy=False)
    sq = (X * X).astype(_F32)
    d = sq.sum(axis=axis, keepdims=True, dtype=_F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.sqrt(sq / np.where(d != 0, d, 1))
        r = np.where(X < 0, -r, r)
        return np.where(d != 0, r, xf).astype(_F32, copy=False)


@kernel("Binarizer", 1, domain=ML, dtypes={"float32", "float64", "int64", "int32"})
def binarizer(ctx, X, *, threshold):
    return (X > threshold).astype(X.dtype)


@kernel("Imputer", 1, domain=ML, dtypes={"float32", "float64", "int64", "int32"})
def imputer(ctx, X, *, imputed_value_floats, imputed_value_int64s, replaced_value_float,
            replaced_value_int64):
    if X.ndim == 0:
        raise ValueError("Imputer: input has no dimensions")
    if X.dtype.kind == "f":
        vals, rep = imputed_value_floats, replaced_value_float
    else:
        vals, rep = imputed_value_int64s, replaced_value_int64
    if not vals:
        raise ValueError("Imputer: no imputed values for this input type")
    imp = np.asarray(vals).astype(X.dtype)
    stride = X.shape[0] if X.ndim == 1 else X.shape[1]
    rep_x = np.asarray(rep).astype(X.dtype) if X.dtype.kind != "f" else X.dtype.type(rep)
    if X.dtype.kind == "f":
        hit = (X == rep_x) | (np.isnan(X) & bool(np.isnan(rep)))
    else:
        hit = X == rep_x
    if imp.size == stride and X.ndim <= 2:
        fill = np.broadcast_to(imp, X.shape) if X.ndim == 1 else np.broadcast_to(imp[None, :], X.shape)
    elif imp.size == stride:
        fill = imp[np.arange(X.size) % stride].reshape(X.shape)
    else:
        fill = imp[0]
    return np.where(hit, fill, X).astype(X.dtype, copy=False)


@kernel("ArrayFeatureExtractor", 1, domain=ML,
        dtypes={"float32", "float64", "int64", "int32", "object"})
def array_feature_extractor(ctx, X, Y):
    if X.ndim == 0:
        raise ValueError("ArrayFeatureExtractor: X has no dimensions")
    idx = np.asarray(Y, dtype=np.int64).reshape(-1)
    if idx.size == 0:
        raise ValueError("ArrayFeatureExtractor: no indices")
    stride = X.shape[-1]
    if (idx >= stride).any() or (idx < 0).any():
        bad = idx[(idx >= stride) | (idx < 0)][0]
        raise ValueError(f"ArrayFeatureExtractor: index {int(bad)} is out of range [0, {stride})")
    Z = np.take(X, idx, axis=-1)
    if X.ndim == 1:
        Z = Z.reshape(1, -1)
    return Z


@kernel("OneHotEncoder", 1, domain=ML, dtypes={"float32", "float64", "int64", "int32", "object"})
def one_hot_encoder(ctx, X, *, cats_int64s, cats_strings, zeros):
    st = ctx.cache.get("ohe")
    if st is None:
        if cats_int64s and cats_strings:
            raise ValueError("OneHotEncoder: give cats_int64s or cats_strings, not both")
        if cats_strings:
            d = {}
            for i, c in enumerate(cats_strings):
                d[c] = i  # the last occurrence wins (onnxruntime)
            st = ("s", d, len(cats_strings))
        elif cats_int64s:
            cats = np.asarray(cats_int64s, dtype=np.int64)
            rev = cats[::-1]
            u, first_rev = np.unique(rev, return_index=True)
            pos = (cats.size - 1 - first_rev).astype(np.int64)  # last occurrence
            st = ("i", (u, pos), cats.size)
        else:
            raise ValueError("OneHotEncoder: no categories")
        ctx.cache["ohe"] = st
    kind, table, ncat = st
    out = np.zeros(X.shape + (ncat,), dtype=_F32)
    flat_out = out.reshape(-1, ncat)
    if X.dtype == object:
        if kind == "s":
            pos = np.fromiter((table.get(v, -1) for v in X.reshape(-1).tolist()), dtype=np.int64,
                              count=X.size)
        else:
            pos = np.full(X.size, -1, dtype=np.int64)
    else:
        if kind == "i":
            u, p = table
            with np.errstate(invalid="ignore"):
                xi = X.reshape(-1).astype(np.int64)
            j = np.searchsorted(u, xi)
            jc = np.minimum(j, u.size - 1)
            found = (j < u.size) & (u[jc] == xi)
            pos = np.where(found, p[jc], -1)
        else:
            pos = np.full(X.size, -1, dtype=np.int64)
    ok = pos >= 0
    if not zeros and not ok.all():
        raise ValueError("OneHotEncoder: unknown category and zeros = 0")
    rows = np.flatnonzero(ok)
    flat_out[rows, pos[ok]] = 1.0
    return out


@kernel("FeatureVectorizer", 1, domain=ML, dtypes={"float32", "float64", "int64", "int32"})
def feature_vectorizer(ctx, *inputs, inputdimensions):
    dims = [int(d) for d in (inputdimensions or [])]
    if len(dims) != len(inputs):
        raise ValueError(f"FeatureVectorizer: {len(inputs)} inputs but {len(dims)} inputdimensions")
    first = inputs[0]
    n = 1 if first.ndim <= 1 else first.shape[0]
    total = sum(dims)
    Y = np.zeros((n, total), dtype=_F32)
    off = 0
    for x, d in zip(inputs, dims):
        xn = 1 if x.ndim <= 1 else x.shape[0]
        x2 = x.reshape(xn, -1)
        w = min(x2.shape[1], d)
        r = min(xn, n)
        Y[:r, off:off + w] = x2[:r, :w]
        off += d
    return Y


# ---------------------------------------------------------------------------
# label and category mapping
# ---------------------------------------------------------------------------


def _numeric_lookup(keys: np.ndarray, values: np.ndarray, x: np.ndarray, default, out_dtype,
                    first_wins=True, nan_key=True) -> np.ndarray:
    """Map ``x`` through ``keys -> values``; absent keys get ``default``."""
    flat = x.reshape(-1)
    keys = np.asarray(keys)
    if keys.size == 0:
        out = np.empty(flat.size, dtype=out_dtype)
        out[:] = default
        return out.reshape(x.shape)
    order = np.arange(keys.size)
    if not first_wins:
        order = order[::-1]
    k2 = keys[order]
    u, first = np.unique(k2, return_index=True)
    vals = np.asarray(values, dtype=out_dtype if out_dtype != object else object)[order][first]
    if u.dtype.kind == "f":
        nan_mask_u = np.isnan(u)
        nan_val = vals[nan_mask_u][0] if (nan_key and nan_mask_u.any()) else None
        u, vals = u[~nan_mask_u], vals[~nan_mask_u]
    else:
        nan_val = None
    fx = flat.astype(u.dtype) if flat.dtype != u.dtype else flat
    if u.size:
        j = np.searchsorted(u, fx)
        jc = np.minimum(j, u.size - 1)
        found = (j < u.size) & (u[jc] == fx)
    else:
        jc = np.zeros(flat.size, dtype=np.intp)
        found = np.zeros(flat.size, dtype=bool)
    out = np.empty(flat.size, dtype=out_dtype)
    out[:] = default
    if found.any():
        out[found] = vals[jc[found]]
    if nan_val is not None and flat.dtype.kind == "f":
        out[np.isnan(flat)] = nan_val
    return out.reshape(x.shape)


def _string_lookup(mapping: dict, x: np.ndarray, default, out_dtype) -> np.ndarray:
    flat = x.reshape(-1).tolist()
    if out_dtype == object:
        out = np.empty(len(flat), dtype=object)
        out[:] = [mapping.get(v, default) for v in flat]
    else:
        out = np.fromiter((mapping.get(v, default) for v in flat), dtype=out_dtype, count=len(flat))
    return out.reshape(x.shape)


def _first_wins_dict(keys, values) -> dict:
    d = {}
    for k_, v_ in zip(keys, values):
        d.setdefault(k_, v_)
    return d


@kernel("LabelEncoder", 1, domain=ML, dtypes={"int64", "object"})
def label_encoder_1(ctx, X, *, classes_strings, default_int64, default_string):
    classes = list(classes_strings or [])
    if X.dtype == object:
        d = {c: i for i, c in enumerate(classes)}  # the last occurrence wins
        return _string_lookup(d, X, int(default_int64), np.int64)
    xi = X.astype(np.int64, copy=False)
    ok = (xi >= 0) & (xi < len(classes))
    cls = _strings_out(classes) if classes else np.empty(0, dtype=object)
    out = np.empty(X.shape, dtype=object)
    out[...] = default_string
    if ok.any():
        out[ok] = cls[xi[ok]]
    return out


_LE_TYPES = {"strings": object, "int64s": np.int64, "floats": _F32}


def _le_value_kind(attrs, out_dtype):
    """Which values_* attribute (and output dtype) a LabelEncoder-2 node uses."""
    present = [s for s in ("strings", "int64s", "floats") if attrs.get(f"values_{s}") is not None]
    if out_dtype is not None:
        od = np.dtype(out_dtype)
        for s in present:
            if np.dtype(_LE_TYPES[s]) == od:
                return s
    if len(present) == 1:
        return present[0]
    if out_dtype is not None:
        od = np.dtype(out_dtype)
        for s, t in _LE_TYPES.items():
            if np.dtype(t) == od:
                return s
    raise ValueError("LabelEncoder: cannot tell which values_* attribute to use")


def _le_key_kind(x_dtype):
    if x_dtype == object:
        return "strings"
    if x_dtype.kind in "iu":
        return "int64s"
    return "floats"


def _le2_default(attrs, vkind):
    if vkind == "strings":
        return attrs.get("default_string")
    if vkind == "int64s":
        return attrs.get("default_int64")
    return attrs.get("default_float")


def _apply_label_map(keys, values, X, default, out_dtype):
    if X.dtype == object:
        d = _first_wins_dict(list(keys), list(values))
        return _string_lookup(d, X, default, out_dtype)
    return _numeric_lookup(np.asarray(keys), np.asarray(values, dtype=out_dtype), X, default, out_dtype)


@kernel("LabelEncoder", 2, domain=ML, dtypes={"int64", "object", "float32"})
def label_encoder_2(ctx, X, **attrs):
    kk = _le_key_kind(X.dtype)
    vk = _le_value_kind(attrs, ctx.output_dtypes[0] if ctx.output_dtypes else None)
    keys = attrs.get(f"keys_{kk}") or []
    values = attrs.get(f"values_{vk}") or []
    if len(keys) != len(values):
        raise ValueError(f"LabelEncoder: keys_{kk} has {len(keys)} entries, values_{vk} {len(values)}")
    out_dtype = _LE_TYPES[vk]
    if kk == "floats":
        keys = np.asarray(keys, dtype=_F32)
    elif kk == "int64s":
        keys = np.asarray(keys, dtype=np.int64)
    if vk == "floats":
        values = np.asarray(values, dtype=_F32)
    return _apply_label_map(keys, values, X, _le2_default(attrs, vk), out_dtype)


def _le4_keys(attrs, x_dtype):
    t = attrs.get("keys_tensor")
    if t is not None:
        return np.asarray(t).reshape(-1)
    if x_dtype == object:
        return np.asarray(attrs.get("keys_strings") or [], dtype=object)
    if x_dtype.kind == "f":
        return np.asarray(attrs.get("keys_floats") or [], dtype=x_dtype)
    return np.asarray(attrs.get("keys_int64s") or [], dtype=x_dtype)


def _le4_values(attrs, out_dtype):
    t = attrs.get("values_tensor")
    if t is not None:
        v = np.asarray(t).reshape(-1)
        return v, np.dtype(object) if v.dtype.kind in "OUS" else v.dtype
    kinds = [s for s in ("strings", "int64s", "floats") if attrs.get(f"values_{s}") is not None]
    if out_dtype is not None:
        od = np.dtype(out_dtype)
        pick = None
        for s in kinds:
            if (s == "strings") == (od == object) and (s == "floats") == (od.kind == "f"):
                pick = s
                break
        if pick is None and kinds:
            pick = kinds[0]
        dt = od
    else:
        if len(kinds) != 1:
            raise ValueError("LabelEncoder: cannot tell which values_* attribute to use")
        pick = kinds[0]
        dt = np.dtype(_LE_TYPES[pick])
    if pick is None:
        return np.zeros(0, dtype=dt), dt
    vals = attrs.get(f"values_{pick}")
    return (np.asarray(vals, dtype=object) if dt == object else np.asarray(vals).astype(dt)), dt


def _le4_default(attrs, dt):
    t = attrs.get("default_tensor")
    if t is not None:
        v = np.asarray(t).reshape(-1)
        if v.size:
            x = v[0]
            return str(x) if dt == object and not isinstance(x, str) else x
    if dt == object:
        return attrs.get("default_string")
    if dt == np.int64:
        return attrs.get("default_int64")
    if dt.kind == "f":
        return attrs.get("default_float")
    return -1


@kernel("LabelEncoder", 4, domain=ML, dtypes={"int64", "object", "float32", "float64", "int32", "int16"})
def label_encoder_4(ctx, X, **attrs):
    st = ctx.cache.get("le4")
    if st is None:
        keys = _le4_keys(attrs, X.dtype)
        values, dt = _le4_values(attrs, ctx.output_dtypes[0] if ctx.output_dtypes else None)
        if keys.size != values.size:
            raise ValueError(f"LabelEncoder: {keys.size} keys but {values.size} values")
        if X.dtype == object:
            keys = np.asarray([k if isinstance(k, str) else (k.decode() if isinstance(k, bytes) else str(k))
                               for k in keys.tolist()], dtype=object)
        else:
            keys = keys.astype(X.dtype)
        default = _le4_default(attrs, dt)
        if dt == object and isinstance(default, bytes):
            default = default.decode()
        if dt == object:
            values = np.asarray([v.decode() if isinstance(v, bytes) else v for v in values.tolist()],
                                dtype=object)
        st = (keys, values, default, dt)
        ctx.cache["le4"] = st
    keys, values, default, dt = st
    return _apply_label_map(keys, values, X, default, dt)


@kernel("CategoryMapper", 1, domain=ML, dtypes={"int64", "object"})
def category_mapper(ctx, X, *, cats_int64s, cats_strings, default_int64, default_string):
    ints = list(cats_int64s or [])
    strs = list(cats_strings or [])
    if len(ints) != len(strs):
        raise ValueError("CategoryMapper: cats_int64s and cats_strings differ in length")
    if X.dtype == object:
        d = _first_wins_dict(strs, ints)
        return _string_lookup(d, X, int(default_int64), np.int64)
    vals = _strings_out(strs) if strs else np.empty(0, dtype=object)
    return _numeric_lookup(np.asarray(ints, dtype=np.int64), vals, X.astype(np.int64, copy=False),
                           default_string, object)


# ---------------------------------------------------------------------------
# maps and sequences
# ---------------------------------------------------------------------------


@kernel("ZipMap", 1, domain=ML, dtypes={"float32"})
def zipmap(ctx, X, *, classlabels_int64s, classlabels_strings):
    if bool(classlabels_int64s) == bool(classlabels_strings):
        raise ValueError("ZipMap: give classlabels_strings or classlabels_int64s (not both)")
    keys = list(classlabels_strings) if classlabels_strings else [int(v) for v in classlabels_int64s]
    if X.ndim == 0 or X.ndim > 2:
        raise ValueError(f"ZipMap: input must be 1D or 2D, got shape {X.shape}")
    X2 = X.reshape(1, -1) if X.ndim == 1 else X
    if X2.shape[1] != len(keys):
        raise ValueError(f"ZipMap: {X2.shape[1]} values per row but {len(keys)} class labels")
    return [dict(zip(keys, row)) for row in X2.tolist()]


def _map_value_dtype(ctx, mapping):
    want = ctx.output_dtypes[0] if ctx.output_dtypes else None
    if want is not None:
        return np.dtype(want)
    vals = list(mapping.values())
    if not vals:
        return np.dtype(_F32)
    v = vals[0]
    if isinstance(v, str):
        return np.dtype(object)
    if isinstance(v, np.generic):
        return v.dtype
    if isinstance(v, (bool, int, np.integer)):
        return np.dtype(np.int64)
    return np.dtype(_F32)


@kernel("DictVectorizer", 1, domain=ML)
def dict_vectorizer(ctx, X, *, int64_vocabulary, string_vocabulary):
    if not isinstance(X, dict):
        raise ValueError(f"DictVectorizer expects a map, got {type(X).__name__}")
    vocab = list(string_vocabulary) if string_vocabulary else [int(v) for v in (int64_vocabulary or [])]
    dt = _map_value_dtype(ctx, X)
    zero = "" if dt == object else dt.type(0)
    out = np.empty((1, len(vocab)), dtype=dt)
    out[0, :] = [X.get(k, zero) for k in vocab]
    return out


def _castmap_value(v, to: str):
    if to == "TO_FLOAT":
        return float(v)
    if to == "TO_INT64":
        return int(float(v)) if not isinstance(v, str) else int(v.strip())
    if isinstance(v, str):
        return v
    return "%f" % float(np.float32(v))  # std::to_string(float)


def _check_castmap(node):
    a = node.attrs
    if a.get("cast_to") not in ("TO_FLOAT", "TO_STRING", "TO_INT64"):
        return f"cast_to={a.get('cast_to')!r} is not TO_FLOAT, TO_STRING or TO_INT64"
    if a.get("map_form") not in ("DENSE", "SPARSE"):
        return f"map_form={a.get('map_form')!r} is not DENSE or SPARSE"
    return None


@kernel("CastMap", 1, domain=ML, check=_check_castmap)
def cast_map(ctx, X, *, cast_to, map_form, max_map):
    if not isinstance(X, dict):
        raise ValueError(f"CastMap expects a map, got {type(X).__name__}")
    items = sorted((int(k), v) for k, v in X.items())
    dt = {"TO_FLOAT": np.dtype(_F32), "TO_INT64": np.dtype(np.int64), "TO_STRING": np.dtype(object)}[cast_to]
    if map_form == "DENSE":
        vals = [_castmap_value(v, cast_to) for _, v in items]
    else:
        if items and items[0][0] < 0:
            raise ValueError("CastMap: negative keys are not permitted with SPARSE")
        pad = "0.f" if cast_to == "TO_STRING" else 0
        m = int(max_map)
        vals = [pad] * m
        for k_, v in items:
            if k_ < m:
                vals[k_] = _castmap_value(v, cast_to)
    out = np.empty((1, len(vals)), dtype=dt)
    out[0, :] = vals
    return out
