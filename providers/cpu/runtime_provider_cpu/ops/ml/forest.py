"""The compiled tree ensemble of the ``ai.onnx.ml`` tree kernels.

Tree ensembles are compiled once per node (``ctx.cache``) into flat node arrays
(feature, threshold, comparison, children) and evaluated for every row and tree
at once: one vectorised step per tree depth level, leaves loop on themselves.
:func:`_forest_v3` reads TreeEnsembleRegressor/Classifier attributes, :func:`_forest_v5`
TreeEnsemble-5's.
"""

from __future__ import annotations

import time

import numpy as np

from ...fast.policy import NATIVE as _native  # the compiled kernels (None in a build without them)


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
                 "thr_dtype", "groups", "const_has", "dense", "n_trees", "packed", "native", "timing")

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

    def _native_sums(self, X: np.ndarray, threads: int = 1):
        """Each row's leaf weights summed over the trees, ``(N, n_targets)``, by one
        ``_native.tree_sums`` call (rows over up to ``threads`` threads); None where it does not apply (no extension, an input wider
        than the thresholds, a walk of depth 0, too many targets to copy per node)."""
        isz = self.thr_dtype.itemsize
        if _native is None or X.dtype.kind != "f" or X.dtype.itemsize > isz or self.depth == 0 or X.shape[1] == 0:
            return None
        lay = self._native_layout(isz)
        if lay is None:
            return None
        nodes, roots, slot = lay
        k = self.n_targets
        L = self.feat.shape[0]
        key = ("weights", isz)
        if key not in self.native:  # the weights of the leaf at each node of the layout (branches: unused rows)
            self.native[key] = np.ascontiguousarray(self.W[slot]) if k <= 16 and L * k <= (1 << 24) else None
        wn = self.native[key]
        if wn is None:
            return None
        n, c = X.shape
        t = roots.shape[0]
        out = np.empty((n, k), self.thr_dtype)
        X = np.ascontiguousarray(X, dtype=self.thr_dtype)
        reached = np.empty((t, n), np.int64)
        threads = max(1, int(threads))
        # tree_sums splits a walk of fewer steps than this over one thread anyway (native/trees.c)
        if threads == 1 or n * t * self.depth < 2 * _POOL_STEPS or n < 2 * _LANES:
            _native.tree_sums(X, nodes, roots, reached, wn, out, (n, c, L, t, k), isz, self.depth, self.same_mode,
                              int(self.has_nan_true), threads)
            return out
        st = self.timing.get(n.bit_length())
        if st is None:
            st = self.timing[n.bit_length()] = [0, None, None]
        st[0] += 1
        one, pool = st[1], st[2]
        if one is None or pool is None:
            use_pool = one is not None  # each way once, one thread first
        else:
            use_pool = pool < one
            if st[0] % _RETRY_EVERY == 0:  # the way not taken, now and then: the load may have changed
                use_pool = not use_pool
        t0 = time.perf_counter()
        _native.tree_sums(X, nodes, roots, reached, wn, out, (n, c, L, t, k), isz, self.depth, self.same_mode,
                          int(self.has_nan_true), threads if use_pool else 1)
        dt = (time.perf_counter() - t0) / n
        i = 2 if use_pool else 1
        st[i] = dt if st[i] is None else st[i] + _TIMING_WEIGHT * (min(dt, _TIMING_CLAMP * st[i]) - st[i])
        return out

    def _block(self, X: np.ndarray):
        """The aggregated leaf weights of a block of rows, and its has-score flags where they
        depend on the leaves (None where ``const_has`` says)."""
        slots = self.leaves(X)  # (t, rows)
        if self.groups is not None:  # every tree writes one target: trees grouped by target
            out = np.zeros((X.shape[0], self.n_targets), dtype=self.thr_dtype)
            vals = self.W1.take(slots, mode=_CLIP)
            for target, a, b in self.groups:
                out[:, target] = _seq_reduce(vals[a:b], self.agg)
        else:
            out = _seq_reduce(self.W.take(slots, axis=0, mode=_CLIP), self.agg)  # take: ~4x faster than W[slots]
        has = self.H.take(slots, axis=0, mode=_CLIP).any(axis=0) if self.const_has is None else None
        return out, has

    def scores(self, X: np.ndarray, threads: int = 1):
        """Aggregated leaf weights ``(N, n_targets)`` (threshold dtype) and has-score flags
        (``None`` when every tree writes every target: every row has every score).

        Sums run sequentially in tree order in the threshold dtype, as onnxruntime does.
        """
        n = X.shape[0]
        t = self.roots.shape[0]
        k = self.n_targets
        acc = self.thr_dtype
        dense = self.dense
        if t == 0 or n == 0:
            return np.zeros((n, k), dtype=acc), (None if dense else np.zeros((n, k), dtype=bool))
        chunk = max(1, (1 << 20) // max(1, t))
        if dense and n <= chunk and self.agg in ("SUM", "AVERAGE"):
            out = self._native_sums(X, threads)
            if out is not None:
                return out, None
        blocks = [self._block(X[start:start + chunk]) for start in range(0, n, chunk)]
        if len(blocks) == 1:  # a small batch: the block is the result, nothing copied
            out, has = blocks[0]
        else:
            out = np.concatenate([o for o, _ in blocks])
            has = None if blocks[0][1] is None else np.concatenate([h for _, h in blocks])
        if has is None and not dense:
            has = np.broadcast_to(self.const_has, (n, k)).copy()
        if self.agg in ("MIN", "MAX") and has is not None:
            out = np.where(has, out, acc.type(0))
        return out, has


#: the pool or the caller alone, for a walk long enough to split (native/trees.c's threshold,
#: 2^15 steps a helper, and its RC_LANES rows a block): each way's wall time per row, a moving
#: mean per forest and batch size (within 2x), and the faster one taken. A helper descheduled by
#: another process holds the part it took for a whole scheduler slice, which costs a short walk
#: more than a second thread saves; the mean takes those slices in, so under load a short walk
#: stays on the caller and on a quiet machine it splits. A call counts at most twice its way's
#: mean: the caller alone loses its core to a busy process too, now and then, and one such call
#: (a 4 ms slice against ~0.1 ms) made the pool look faster for the next ~150 calls (38% of a
#: RandomForest b100's calls went to the pool beside two busy processes, each ~20% slower than
#: the caller alone); a helper descheduled often still lifts the pool's mean within a few calls.
_POOL_STEPS = 32768
_LANES = 8
_RETRY_EVERY = 16
_TIMING_WEIGHT = 0.25
_TIMING_CLAMP = 2.0

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
    F.timing = {}
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
    # every tree writes every target: no row lacks a score, the kernels skip the has-masks
    F.dense = const_has is not None and bool(const_has.all())
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


_V5_AGG = {0: "AVERAGE", 1: "SUM", 2: "MIN", 3: "MAX"}


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
