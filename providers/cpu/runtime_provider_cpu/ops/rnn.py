"""CPU kernels: LSTM, GRU and RNN (all directions, sequence lengths, layouts).

The input projection of every time step is one matmul; only the recurrence loops.

Legacy versions (LSTM-1, GRU-1, GRU-3, RNN-1) run the opset-7 kernels. What differs:

* ``output_sequence`` (removed in 7) only says whether output Y may be omitted ("optional if
  0"); it does not change any value, so Y is computed whenever the node asks for it.
* no ``layout`` (added in 14): always 0; GRU-1 has no ``linear_before_reset`` (0) and its
  ``direction`` default is misspelt ``"foward"`` in the schema (read as forward, which its
  description names as the default).
* the legacy equations write the recurrence as ``Ht-1*R`` where opset 7 writes ``Ht-1*(R^T)``.
  That ^T was added to opset 7's text in June 2018 (onnx PR #1103) as a clarification with no
  version bump, i.e. the same words were taken to mean the transposed product; the R layout
  (``[num_directions, k*hidden_size, hidden_size]``, blocks stacked along dimension 0 like W)
  is unchanged, so the legacy versions use ``Ht-1 @ R^T`` too.
"""

from __future__ import annotations

import numpy as np

from ..fast.policy import NATIVE as _native  # the compiled time loop (None without the extension: the numpy loops)
from ..fast.sgemm import pooled_matmul, sgemm_ready
from ..registry import kernel

#: the batches up to which the compiled loop was measured against the numpy loop's GEMM a step
#: (a direction on one thread each, the weights read once a block of rows: faster throughout)
NATIVE_MAX_BATCH = 256


def _sigmoid(x, a, b):
    return 1.0 / (1.0 + np.exp(-x))


_ACT = {
    "sigmoid": (0, _sigmoid),
    "tanh": (0, lambda x, a, b: np.tanh(x)),
    "relu": (0, lambda x, a, b: np.maximum(x, 0)),
    "affine": (2, lambda x, a, b: a * x + b),
    "leakyrelu": (1, lambda x, a, b: np.where(x >= 0, x, a * x)),
    "thresholdedrelu": (1, lambda x, a, b: np.where(x > a, x, 0)),
    "scaledtanh": (2, lambda x, a, b: a * np.tanh(b * x)),
    "hardsigmoid": (2, lambda x, a, b: np.clip(a * x + b, 0, 1)),
    "elu": (1, lambda x, a, b: np.where(x >= 0, x, a * (np.exp(x) - 1))),
    "softsign": (0, lambda x, a, b: x / (1 + np.abs(x))),
    "softplus": (0, lambda x, a, b: np.log1p(np.exp(x))),
}
_ACT_DEFAULTS = {"affine": (1.0, 0.0), "leakyrelu": (0.01, 0.0), "thresholdedrelu": (1.0, 0.0),
                 "scaledtanh": (1.0, 1.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, 0.0)}


def _activations(names, alphas, betas, defaults, num_dir):
    names = list(names) if names else list(defaults) * num_dir
    if len(names) == len(defaults) and num_dir == 2:
        names = names * 2
    alphas = list(alphas or [])
    betas = list(betas or [])
    fns = []
    ai = bi = 0
    for n in names:
        key = n.lower()
        if key not in _ACT:
            raise ValueError(f"activation {n!r} is not supported (supported: {', '.join(sorted(_ACT))})")
        nparams, fn = _ACT[key]
        a, b = _ACT_DEFAULTS.get(key, (0.0, 0.0))
        if nparams >= 1 and ai < len(alphas):
            a = alphas[ai]
            ai += 1
        if nparams >= 2 and bi < len(betas):
            b = betas[bi]
            bi += 1
        fns.append((fn, a, b))
    return fns


def _check_acts(defaults):
    def check(node):
        names = node.attrs.get("activations") or []
        bad = [n for n in names if n.lower() not in _ACT]
        if bad:
            return f"activation(s) {', '.join(bad)} are not implemented"
        return None
    return check


def _prep(x, layout, seq_lens):
    if layout == 1:
        x = np.swapaxes(x, 0, 1)
    seq, batch = x.shape[0], x.shape[1]
    lens = None if seq_lens is None else np.asarray(seq_lens).astype(np.int64).reshape(-1)
    if lens is not None and (lens.size != batch or lens.size and (lens.min() < 0 or lens.max() > seq)):
        # a length past the sequence would read past X (onnxruntime refuses them too)
        raise ValueError(f"input 'sequence_lens' must hold {batch} lengths in [0, {seq}] (one per batch "
                         f"entry), got {lens.tolist()[:16]}")
    if lens is not None and np.all(lens == seq):
        lens = None
    return x, seq, batch, lens


def _finish(ys, hs, cs, layout, wanted):
    # ys: [num_dir][seq, batch, H] -> Y [seq, num_dir, batch, H]
    y = np.stack(ys, axis=1) if wanted[0] else None
    yh = np.stack(hs, axis=0)
    yc = np.stack(cs, axis=0) if cs is not None else None
    return _in_layout(y, yh, yc, layout)


def _in_layout(y, yh, yc, layout):
    """Y [seq, num_dir, batch, H] and the last states [num_dir, batch, H] as ``layout`` asks
    (1: batch first)."""
    if layout == 1:
        if y is not None:
            y = np.transpose(y, (2, 0, 1, 3))
        yh = np.swapaxes(yh, 0, 1)
        if yc is not None:
            yc = np.swapaxes(yc, 0, 1)
    return y, yh, yc


def _directions(direction):
    if direction == "forward":
        return [False]
    if direction == "reverse":
        return [True]
    if direction == "bidirectional":
        return [False, True]
    raise ValueError(f"direction {direction!r} is not forward, reverse or bidirectional")


def _steps(seq, reverse):
    """Time steps in the order a direction visits them."""
    return range(seq - 1, -1, -1) if reverse else range(seq)


def _defaults(acts, names):
    """True when every direction uses the named default activations (their alpha/beta are unused)."""
    return all(fn is _ACT[names[i % len(names)]][1] for i, (fn, _, _) in enumerate(acts))


def _run(x, lens, reverse, step, h0, extra0, dtype):
    """Loop over time; ``step(t, h, extra) -> (h, extra)``; masked by sequence lengths."""
    seq = x.shape[0]
    h, extra = h0, extra0
    ys = np.zeros((seq,) + h0.shape, dtype=dtype)
    for t in _steps(seq, reverse):
        nh, nextra = step(t, h, extra)
        if lens is not None:
            valid = (t < lens)[:, None]
            nh = np.where(valid, nh, h)
            if nextra is not None:
                nextra = np.where(valid, nextra, extra)
            ys[t] = np.where(valid, nh, 0)
        else:
            ys[t] = nh
        h, extra = nh, nextra
    return ys, h, extra


def _lstm(ctx, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *,
          activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
          hidden_size=None, input_forget=0, layout=0):
    dt = X.dtype
    x, seq, batch, lens = _prep(X, layout, sequence_lens)
    H = R.shape[-1]
    dirs = _directions(direction)
    acts = _activations(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh", "Tanh"], len(dirs))
    if layout == 1:
        initial_h = None if initial_h is None else np.swapaxes(initial_h, 0, 1)
        initial_c = None if initial_c is None else np.swapaxes(initial_c, 0, 1)
    # default activations, no clip, peepholes or masking: the loop below runs ~10 ufuncs a step
    fast = (lens is None and clip is None and P is None and not input_forget
            and _defaults(acts, ["sigmoid", "tanh", "tanh"]))
    if fast and _native_ok(dt, seq, batch):
        return _native_node(ctx, x, W, R, B, initial_h, initial_c, len(dirs), dirs[0], True, 0, layout)
    ys, hs, cs = [], [], []
    for d, rev in enumerate(dirs):
        (f, fa, fb), (g, ga, gb), (hh, ha, hb) = acts[3 * d:3 * d + 3]
        b = np.zeros(8 * H, dt) if B is None else B[d]
        xw = (x.reshape(seq * batch, -1) @ W[d].T).reshape(seq, batch, 4 * H) + (b[:4 * H] + b[4 * H:])
        h0 = np.zeros((batch, H), dt) if initial_h is None else initial_h[d]
        c0 = np.zeros((batch, H), dt) if initial_c is None else initial_c[d]
        if fast:
            y, h, c = _lstm_fast(xw, _recurrence(ctx, R, d, 3 * H), h0, c0, rev, dt, H)
            ys.append(y)
            hs.append(h)
            cs.append(c)
            continue
        rt = R[d].T
        p = np.zeros(3 * H, dt) if P is None else P[d]
        pi, po, pf = p[:H], p[H:2 * H], p[2 * H:]

        def step(t, h, c, xw=xw, rt=rt, pi=pi, po=po, pf=pf, f=f, fa=fa, fb=fb, g=g, ga=ga, gb=gb,
                 hh=hh, ha=ha, hb=hb):
            gates = xw[t] + h @ rt
            i_, o_, f_, c_ = gates[:, :H], gates[:, H:2 * H], gates[:, 2 * H:3 * H], gates[:, 3 * H:]
            # clip bounds the input of each activation: after the peephole terms
            cl = (lambda v: v) if clip is None else (lambda v: np.clip(v, -clip, clip))
            i = f(cl(i_ + pi * c), fa, fb)
            fg = 1 - i if input_forget else f(cl(f_ + pf * c), fa, fb)
            cn = fg * c + i * g(cl(c_), ga, gb)
            o = f(cl(o_ + po * cn), fa, fb)
            return (o * hh(cn, ha, hb)).astype(dt, copy=False), cn.astype(dt, copy=False)

        y, h, c = _run(xw, lens, rev, step, h0, c0, dt)
        ys.append(y)
        hs.append(h)
        cs.append(c)
    return _finish(ys, hs, cs, layout, ctx.outputs_wanted)


@kernel("LSTM", 7, 14, 22, check=_check_acts(None), dtypes={"float32", "float64", "float16"})
def lstm(ctx, *args, **kw):
    return _lstm(ctx, *args, **kw)


@kernel("GRU", 7, 14, 22, check=_check_acts(None), dtypes={"float32", "float64", "float16"})
def gru(ctx, X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
        activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None,
        layout=0, linear_before_reset=0):
    dt = X.dtype
    x, seq, batch, lens = _prep(X, layout, sequence_lens)
    H = R.shape[-1]
    dirs = _directions(direction)
    acts = _activations(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh"], len(dirs))
    if layout == 1 and initial_h is not None:
        initial_h = np.swapaxes(initial_h, 0, 1)
    fast = lens is None and clip is None and _defaults(acts, ["sigmoid", "tanh"])
    if fast and _native_ok(dt, seq, batch):
        y, yh, _ = _native_node(ctx, x, W, R, B, initial_h, None, len(dirs), dirs[0], False,
                                linear_before_reset, layout)
        return y, yh
    ys, hs = [], []
    for d, rev in enumerate(dirs):
        (f, fa, fb), (g, ga, gb) = acts[2 * d:2 * d + 2]
        b = np.zeros(6 * H, dt) if B is None else B[d]
        wb, rb = b[:3 * H], b[3 * H:]
        xw = (x.reshape(seq * batch, -1) @ W[d].T).reshape(seq, batch, 3 * H) + wb
        h0 = np.zeros((batch, H), dt) if initial_h is None else initial_h[d]
        if fast:  # both fast loops take the recurrence biases folded into the input term
            xw[..., :2 * H] += rb[:2 * H]
            if not linear_before_reset:
                xw[..., 2 * H:] += rb[2 * H:]  # outside the reset product: a constant of the input term
        if fast:
            y, h = _gru_fast(xw, _recurrence(ctx, R, d, 2 * H), rb, h0, rev, dt, H, linear_before_reset)
            ys.append(y)
            hs.append(h)
            continue
        rz_r = R[d][:2 * H].T
        rh = R[d][2 * H:].T

        def step(t, h, _, xw=xw, rz_r=rz_r, rh=rh, rb=rb, f=f, fa=fa, fb=fb, g=g, ga=ga, gb=gb):
            zr = xw[t][:, :2 * H] + h @ rz_r + rb[:2 * H]
            if clip is not None:
                zr = np.clip(zr, -clip, clip)
            z = f(zr[:, :H], fa, fb)
            r = f(zr[:, H:], fa, fb)
            if linear_before_reset:
                hpre = xw[t][:, 2 * H:] + r * (h @ rh + rb[2 * H:])
            else:
                hpre = xw[t][:, 2 * H:] + (r * h) @ rh + rb[2 * H:]
            if clip is not None:
                hpre = np.clip(hpre, -clip, clip)
            ht = g(hpre, ga, gb)
            return ((1 - z) * ht + z * h).astype(dt, copy=False), None

        y, h, _ = _run(xw, lens, rev, step, h0, None, dt)
        ys.append(y)
        hs.append(h)
    y, yh, _ = _finish(ys, hs, None, layout, ctx.outputs_wanted)
    return y, yh


@kernel("RNN", 7, 14, 22, check=_check_acts(None), dtypes={"float32", "float64", "float16"})
def rnn(ctx, X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
        activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None, layout=0):
    dt = X.dtype
    x, seq, batch, lens = _prep(X, layout, sequence_lens)
    H = R.shape[-1]
    dirs = _directions(direction)
    acts = _activations(activations, activation_alpha, activation_beta, ["Tanh"], len(dirs))
    if layout == 1 and initial_h is not None:
        initial_h = np.swapaxes(initial_h, 0, 1)
    fast = lens is None and clip is None and _defaults(acts, ["tanh"])
    ys, hs = [], []
    for d, rev in enumerate(dirs):
        (f, fa, fb) = acts[d]
        b = np.zeros(2 * H, dt) if B is None else B[d]
        xw = (x.reshape(seq * batch, -1) @ W[d].T).reshape(seq, batch, H) + (b[:H] + b[H:])
        h0 = np.zeros((batch, H), dt) if initial_h is None else initial_h[d]
        if fast:
            y, h = _rnn_fast(xw, R[d], h0, rev, dt)
            ys.append(y)
            hs.append(h)
            continue
        rt = R[d].T

        def step(t, h, _, xw=xw, rt=rt, f=f, fa=fa, fb=fb):
            pre = xw[t] + h @ rt
            if clip is not None:
                pre = np.clip(pre, -clip, clip)
            return f(pre, fa, fb).astype(dt, copy=False), None

        y, h, _ = _run(xw, lens, rev, step, h0, None, dt)
        ys.append(y)
        hs.append(h)
    y, yh, _ = _finish(ys, hs, None, layout, ctx.outputs_wanted)
    return y, yh


# ---------------------------------------------------------------------------------------
# fast recurrences: default activations, no clip, no peepholes, no sequence-length masking.
# sigmoid(v) = 1 / (1 + exp(-v)); the sign is folded into the (exactly negated) input
# projection and recurrence weights of the sigmoid gates, so the sigmoid gates of a step are
# one exp, one add and one reciprocal over a slice of a preallocated buffer that one matmul
# fills. numpy's float32 exp is ~2x faster than its tanh here, and this form is accurate in
# the tails, where 0.5 + 0.5 * tanh(v / 2) cancels; exp(-v) overflows to inf for v << 0,
# which gives sigmoid 0 exactly (the run loop's np.errstate keeps that quiet). Scalars are
# 0-d arrays: a Python float operand costs ~0.4 us a call in conversion. States are updated
# in place and each new hidden state is written straight into its row of Y. The negated,
# transposed recurrence matrix is made once per node when R is an initializer
# (``ctx.cache``), else once per run.
# ---------------------------------------------------------------------------------------

def _from_input(ctx, index, key, make):
    """``make()``, an array prepared from the node's input ``index``, made once per node when
    that input is an initializer (``ctx.cache``) and once per run when it is a graph input."""
    info = ctx.node.input_info[index] if len(ctx.node.input_info) > index else None
    if info is None or not info.is_constant:
        return make()
    out = ctx.cache.get(key)
    if out is None:
        out = ctx.cache[key] = make()
    return out


def _from_r(ctx, R, key, make):
    """``make()``, a matrix prepared from R (input 2), cached as :func:`_from_input` does."""
    return _from_input(ctx, 2, key + (R.dtype.str,), make)


def _recurrence(ctx, R, d, rows):
    """``R[d].T`` with its first ``rows`` rows (the sigmoid gates) negated."""
    def make():
        r = np.array(R[d], copy=True)
        np.negative(r[:rows], out=r[:rows])
        return r.T
    return _from_r(ctx, R, ("recurrence", d, rows), make)


def _native_ok(dt, seq, batch):
    return _native is not None and dt == np.float32 and seq > 0 and 0 < batch <= NATIVE_MAX_BATCH


def _packed(ctx, R, gates):
    """The rows of ``gates`` of every direction's R packed for ``_native.recurrence``:
    [dir, chunk, k, gate, unit] for chunks of ``RECURRENCE_UNITS`` hidden units (the last one
    zero-padded), so one chunk's gates for one k are contiguous. Cached per node when R is an
    initializer."""
    def make():
        nd, H = R.shape[0], R.shape[-1]
        u = _native.RECURRENCE_UNITS
        nc = -(-H // u)
        pad = np.zeros((nd, len(gates), nc * u, H), np.float32)
        pad[:, :, :H] = R.reshape(nd, -1, H, H)[:, list(gates)]  # [dir, gate, unit, k]
        return np.ascontiguousarray(pad.reshape(nd, len(gates), nc, u, H).transpose(0, 2, 4, 1, 3))
    return _from_r(ctx, R, ("packed", gates), make)


def _native_node(ctx, x, W, R, B, h0, c0, ndir, rev, lstm, lbr, layout):
    """Every direction of an LSTM (``lstm``) or GRU node through the compiled loop: one
    product projects the input of every step and direction, the biases are added as the
    loop reads it. Y is returned as a [seq, dir, batch, H] view of a [seq, batch, dir, H]
    buffer: the Transpose(0, 2, 1, 3) and Reshape to [seq, batch, dir * H] that exporters put
    after a bidirectional layer are then views too. ``h0``/``c0``: [dir, batch, H] or None.
    Returns (Y or None when not wanted, Y_h, Y_c or None)."""
    seq, batch, H = x.shape[0], x.shape[1], R.shape[-1]
    g = 4 if lstm else 3
    # W of every direction as one [input, dir * gates * H] operand: one product for the node
    wt = _from_input(ctx, 1, ("wt",), lambda: np.ascontiguousarray(
        W.astype(np.float32, copy=False).reshape(ndir * g * H, -1).T))
    x2 = x.reshape(seq * batch, -1)
    xw = pooled_matmul(getattr(ctx, "threads", 1), x2, wt)
    if xw is None:
        xw = np.matmul(x2, wt)
    xb = rbn = None
    if B is not None:
        b = B.reshape(ndir, 2, g, H).astype(np.float32)
        xb = b[:, 0] + b[:, 1]
        if lbr:  # Rb of the n gate is inside the reset product
            xb[:, 2] = b[:, 0, 2]
            rbn = np.ascontiguousarray(b[:, 1, 2])
        xb = np.ascontiguousarray(xb)
    elif lbr:
        rbn = np.zeros((ndir, H), np.float32)
    if lstm:
        p1, p2 = _packed(ctx, R, (0, 1, 2, 3)), None
    elif lbr:
        p1, p2 = _packed(ctx, R, (0, 1, 2)), None
    else:
        p1, p2 = _packed(ctx, R, (0, 1)), _packed(ctx, R, (2,))
    h = (np.zeros((ndir, batch, H), np.float32) if h0 is None
         else np.ascontiguousarray(h0, np.float32))
    c = None
    if lstm:
        c = (np.zeros((ndir, batch, H), np.float32) if c0 is None
             else np.array(c0, dtype=np.float32, order="C", copy=True))
    ys = np.empty((seq, batch, ndir, H), np.float32)
    # the directions in parallel only where BLAS is held at one thread (its spinning workers
    # would hold the cores right after the projection otherwise)
    threads = int(getattr(ctx, "threads", 1)) if sgemm_ready() else 1
    _native.recurrence(lstm, bool(lbr), rev, xw, xb, p1, p2, rbn, h, c, ys,
                       (seq, ndir, batch, H, ndir * g * H), True, threads)
    # the last state of each direction: forward's at the last step, reverse's at the first
    last = [ys[0 if (rev if ndir == 1 else d == 1) else seq - 1, :, d] for d in range(ndir)]
    yh = np.stack(last, axis=0)
    y = np.transpose(ys, (0, 2, 1, 3)) if ctx.outputs_wanted[0] else None
    return _in_layout(y, yh, c, layout)


def _lstm_fast(xw, rt, h0, c0, rev, dt, H):
    """``rt``: from :func:`_recurrence` (gates i, o, f are sigmoid; c is tanh)."""
    seq, batch = xw.shape[0], xw.shape[1]
    np.negative(xw[..., :3 * H], out=xw[..., :3 * H])
    ys = np.empty((seq, batch, H), dt)
    g = np.empty((batch, 4 * H), dt)
    tmp = np.empty((batch, H), dt)
    sig, gi, go, gf, gc = g[:, :3 * H], g[:, :H], g[:, H:2 * H], g[:, 2 * H:3 * H], g[:, 3 * H:]
    c = np.array(c0, dtype=dt, copy=True)
    h = np.ascontiguousarray(h0, dtype=dt)
    one = np.ones((), dt)
    matmul, tanh, multiply, exp, reciprocal = np.matmul, np.tanh, np.multiply, np.exp, np.reciprocal
    for t in _steps(seq, rev):
        matmul(h, rt, out=g)
        g += xw[t]
        exp(sig, out=sig)
        sig += one
        reciprocal(sig, out=sig)
        tanh(gc, out=gc)
        c *= gf
        gc *= gi
        c += gc
        tanh(c, out=tmp)
        h = ys[t]
        multiply(go, tmp, out=h)
    return ys, h, c  # h is a row of ys: _finish's np.stack copies it


def _gru_fast(xw, rt, rb, h0, rev, dt, H, linear_before_reset):
    """``rt``: from :func:`_recurrence` (gates z, r are sigmoid; h is tanh); ``xw`` has the
    recurrence biases folded in but the n gate's when ``linear_before_reset``."""
    seq, batch = xw.shape[0], xw.shape[1]
    np.negative(xw[..., :2 * H], out=xw[..., :2 * H])
    xzr, xn = xw[..., :2 * H], xw[..., 2 * H:]
    rbh = rb[2 * H:]
    ys = np.empty((seq, batch, H), dt)
    g = np.empty((batch, 3 * H), dt)
    zr, z, r, n = g[:, :2 * H], g[:, :H], g[:, H:2 * H], g[:, 2 * H:]
    h = np.ascontiguousarray(h0, dtype=dt)
    one = np.ones((), dt)
    matmul, tanh, multiply, subtract = np.matmul, np.tanh, np.multiply, np.subtract
    exp, reciprocal = np.exp, np.reciprocal
    if not linear_before_reset:
        rzr, rh = rt[:, :2 * H], rt[:, 2 * H:]
        rh_in = np.empty((batch, H), dt)
    for t in _steps(seq, rev):
        if linear_before_reset:
            matmul(h, rt, out=g)
        else:
            matmul(h, rzr, out=zr)
        zr += xzr[t]
        exp(zr, out=zr)
        zr += one
        reciprocal(zr, out=zr)
        if linear_before_reset:
            n += rbh
            n *= r
        else:
            multiply(r, h, out=rh_in)
            matmul(rh_in, rh, out=n)
        n += xn[t]
        tanh(n, out=n)
        hn = ys[t]  # h' = (1 - z) * n + z * h = n + z * (h - n)
        subtract(h, n, out=hn)
        hn *= z
        hn += n
        h = hn
    return ys, h


def _rnn_fast(xw, R, h0, rev, dt):
    seq = xw.shape[0]
    rt = R.T
    ys = np.empty(xw.shape, dt)
    h = np.ascontiguousarray(h0, dtype=dt)
    matmul, tanh = np.matmul, np.tanh
    for t in _steps(seq, rev):
        y = ys[t]
        matmul(h, rt, out=y)
        y += xw[t]
        tanh(y, out=y)
        h = y
    return ys, h


# ---------------------------------------------------------------------------------------
# legacy versions (see the module docstring)
# ---------------------------------------------------------------------------------------

def _legacy_direction(direction):
    return "forward" if direction == "foward" else direction


@kernel("LSTM", 1, check=_check_acts(None), dtypes={"float32", "float64", "float16"})
def lstm_1(ctx, *args, output_sequence=0, **kw):
    return _lstm(ctx, *args, **kw)


@kernel("GRU", 1, check=_check_acts(None), dtypes={"float32", "float64", "float16"})
def gru_1(ctx, *args, output_sequence=0, direction="forward", **kw):
    return gru(ctx, *args, direction=_legacy_direction(direction), **kw)


@kernel("GRU", 3, check=_check_acts(None), dtypes={"float32", "float64", "float16"})
def gru_3(ctx, *args, output_sequence=0, **kw):
    return gru(ctx, *args, **kw)


@kernel("RNN", 1, check=_check_acts(None), dtypes={"float32", "float64", "float16"})
def rnn_1(ctx, *args, output_sequence=0, **kw):
    return rnn(ctx, *args, **kw)
