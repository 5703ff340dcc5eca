"""CPU kernels: attention and LLM building blocks.

``Attention`` (23, 24, 25), ``ai.onnx.preview::FlexAttention`` (1), ``RMSNormalization`` (23),
``RotaryEmbedding`` (23), ``LinearAttention`` (27), ``CausalConvWithState`` (27),
``SwiGLU`` (28) and ``TensorScatter`` (24).

Design notes
------------
* Matmuls run in float32 (float64 for double inputs) through BLAS (``np.matmul``);
  grouped-query attention reshapes the query heads to ``(B, H_kv, group, S, D)`` so each
  K/V head is shared by broadcasting instead of being copied.
* float16 / bfloat16: every step the specification performs in the tensor type (scaled
  Q and K, the QK product, softcap, mask addition, softmax, the probabilities cast back
  to ``T1``, the output product) is computed in float32 and rounded to the tensor type
  at that point, which is what an elementwise float16 evaluation does, so results agree
  with a float16 evaluation of the operator's definition to the last bit in most places.
* Attention masks are additive biases kept at their broadcast (smallest) shape: a boolean
  mask becomes ``0 / -inf``; causal, sliding-window and ``nonpad_kv_seqlen`` padding
  constraints add ``-inf`` where disallowed. A query row whose combined bias is all
  ``-inf`` produces zero probabilities (zero output row), not NaN, as the spec requires.
* ``LinearAttention`` runs its recurrence one time step at a time (the recurrence is
  sequential); each step is a batched matmul over batch and heads, state in float32.
* ``FlexAttention`` runs its ``score_mod`` / ``prob_mod`` subgraphs (compiled once, like
  If/Loop bodies) on the scores / probabilities in the softmax precision.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..registry import kernel
from ._common import ignore_fp, normalize_axis

_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_BF16 = np.dtype(ml_dtypes.bfloat16)
_LOWP = (_F16, _BF16)
_FLOATS = frozenset({"float16", "float32", "float64", "bfloat16"})
_FLOATS_NO_F64 = frozenset({"float16", "float32", "bfloat16"})
#: softmax_precision attribute values (TensorProto element types) -> numpy dtype
_PRECISION = {1: _F32, 10: _F16, 11: _F64, 16: _BF16}
_NEG_INF = -np.inf


def _cdtype(dt) -> np.dtype:
    """Compute dtype for a float dtype: double stays double, the rest is float32."""
    return _F64 if np.dtype(dt) == _F64 else _F32


def _rounder(dt, cd):
    """``f(x)``: round a ``cd`` array to ``dt`` precision (kept in ``cd``); identity when
    ``dt`` is at least as precise as ``cd``."""
    dt = np.dtype(dt)
    if dt in _LOWP or (dt == _F32 and cd == _F64):
        return lambda x: x.astype(dt).astype(cd)
    return lambda x: x


def _as(x, dt):
    return x if x.dtype == dt else x.astype(dt)


def _info(node, i):
    if i < len(node.input_info) and node.inputs[i]:
        return node.input_info[i]
    return None


def _dtype_of(node, i):
    info = _info(node, i)
    return None if info is None or info.dtype is None else np.dtype(info.dtype)


def _rank_of(node, i):
    info = _info(node, i)
    return None if info is None or info.shape is None else len(info.shape)


def _attr(node, name, default=None):
    v = node.attrs.get(name)
    return default if v is None else v


def _softmax_lastaxis(x, rnd):
    """Softmax over the last axis of ``x`` (float32/64), each step rounded by ``rnd``.

    A row that is entirely ``-inf`` gives zeros instead of ``NaN``.
    """
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0, m).astype(x.dtype, copy=False)
    e = rnd(np.exp(rnd(x - m)))
    s = rnd(np.sum(e, axis=-1, keepdims=True))
    s = np.where(s == 0, 1, s).astype(x.dtype, copy=False)
    return rnd(e / s)


# =======================================================================================
# Attention (23, 24, 25)
# =======================================================================================

def _attention_check(node):
    t1 = _dtype_of(node, 0)
    if t1 is not None and t1.name not in _FLOATS:
        return f"Attention on {t1.name} is not implemented (supported: {sorted(_FLOATS)})"
    t2 = _dtype_of(node, 2)
    if t2 is not None and t2.name not in _FLOATS:
        return f"Attention: V of type {t2.name} is not supported"
    mt = _dtype_of(node, 3)
    if mt is not None and mt != np.dtype(bool) and (t1 is None or mt != t1):
        return (f"Attention: attn_mask of type {mt.name} is not implemented (a boolean mask, or a "
                f"float mask of the query's type {t1.name if t1 is not None else '?'})")
    sp = _attr(node, "softmax_precision")
    if sp is not None and sp not in _PRECISION:
        return f"Attention: softmax_precision={sp} is not supported (1, 10, 11, 16)"
    mode = _attr(node, "qk_matmul_output_mode", 0)
    if mode not in (0, 1, 2, 3):
        return f"Attention: qk_matmul_output_mode={mode} is not a valid value (0..3)"
    for w in ("left_window_size", "right_window_size"):
        v = _attr(node, w, -1)
        if v < -1:
            return f"Attention: {w}={v} must be -1 or nonnegative"
    rank = _rank_of(node, 0)
    if rank is not None and rank not in (3, 4):
        return f"Attention: rank-{rank} Q is not supported (3 or 4)"
    if rank == 3 and (_attr(node, "q_num_heads") is None or _attr(node, "kv_num_heads") is None):
        return "Attention: 3D inputs need the q_num_heads and kv_num_heads attributes"
    if (_info(node, 4) is None) != (_info(node, 5) is None):
        return "Attention: past_key and past_value must be given together"
    return None


def _to_4d(x, heads, name):
    b, s, hidden = x.shape
    if heads is None or heads <= 0 or hidden % heads:
        raise ValueError(f"Attention: {name} hidden size {hidden} is not divisible by num_heads {heads}")
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def _attention(ctx, version, Q, K, V, attn_mask, past_key, past_value, nonpad,
               *, is_causal, kv_num_heads, q_num_heads, qk_matmul_output_mode, scale,
               softcap, softmax_precision, left_window_size=-1, right_window_size=-1):
    if not (Q.ndim == K.ndim == V.ndim) or Q.ndim not in (3, 4):
        raise ValueError(f"Attention: Q, K, V must all be 3D or all 4D, got {Q.shape}, {K.shape}, {V.shape}")
    if (past_key is None) != (past_value is None):
        raise ValueError("Attention: past_key and past_value must be given together")
    if nonpad is not None and past_key is not None:
        raise ValueError("Attention: nonpad_kv_seqlen cannot be combined with past_key/past_value")
    t1 = Q.dtype
    cd = _cdtype(t1)
    r1 = _rounder(t1, cd)
    rank3 = Q.ndim == 3
    if rank3:
        Q4 = _to_4d(Q, q_num_heads, "Q")
        K4 = _to_4d(K, kv_num_heads, "K")
        V4 = _to_4d(V, kv_num_heads, "V")
    else:
        Q4, K4, V4 = Q, K, V
    B, Hq, Sq, D = Q4.shape
    Hkv = K4.shape[1]
    if V4.shape[1] != Hkv or K4.shape[3] != D or V4.shape[2] != K4.shape[2]:
        raise ValueError(f"Attention: incompatible Q/K/V shapes {Q4.shape}, {K4.shape}, {V4.shape}")
    if Hkv <= 0 or Hq % Hkv:
        raise ValueError(f"Attention: q_num_heads {Hq} is not a multiple of kv_num_heads {Hkv}")
    G = Hq // Hkv

    # KV cache
    if past_key is not None:
        present_key = np.concatenate((past_key, _as(K4, past_key.dtype)), axis=2)
        present_value = np.concatenate((past_value, _as(V4, past_value.dtype)), axis=2)
        past_len = past_key.shape[2]
    else:
        present_key, present_value, past_len = K4, V4, 0
    Kt, Vt = present_key, present_value
    T = Kt.shape[2]

    # scaled Q and K (sqrt(scale) each, in T1)
    sc = (1.0 / math.sqrt(D)) if scale is None else float(scale)
    s = cd.type(t1.type(np.sqrt(np.float64(sc))))
    qs = r1(_as(Q4, cd) * s)
    ks = r1(_as(Kt, cd) * s)
    qk = np.matmul(qs.reshape(B, Hkv, G, Sq, D), np.swapaxes(ks, -1, -2)[:, :, None])
    qk = r1(qk.reshape(B, Hq, Sq, T))
    raw_qk = qk
    if softcap > 0:
        sc_ = cd.type(t1.type(softcap))
        qk = r1(r1(np.tanh(r1(qk / sc_))) * sc_)

    # additive bias, kept at its broadcast shape (rank <= 4)
    bias = None
    if attn_mask is not None:
        m = attn_mask
        if m.ndim == 0:
            m = m.reshape(1)
        if version >= 24 and m.shape[-1] < T:
            padw = [(0, 0)] * (m.ndim - 1) + [(0, T - m.shape[-1])]
            m = np.pad(m, padw, mode="constant", constant_values=(False if m.dtype == bool else _NEG_INF))
        if m.dtype == bool:
            bias = np.where(m, cd.type(0), cd.type(_NEG_INF))
        else:
            bias = _as(m, cd)
    if nonpad is not None:
        nonpad = np.asarray(nonpad).reshape(-1).astype(np.int64)
        if nonpad.shape[0] != B:
            raise ValueError(f"Attention: nonpad_kv_seqlen has {nonpad.shape[0]} entries for batch {B}")
        offset = (nonpad - Sq).reshape(B, 1, 1, 1)
    else:
        offset = past_len
    use_window = left_window_size >= 0 or right_window_size >= 0
    allowed = None
    if is_causal or use_window:
        i_idx = np.arange(Sq).reshape(Sq, 1)
        j_idx = np.arange(T).reshape(1, T)
        diff = (i_idx + offset) - j_idx        # (Sq, T) or (B, 1, Sq, T)
        allowed = np.ones(diff.shape, dtype=bool)
        if is_causal:
            allowed &= diff >= 0
        if left_window_size >= 0:
            allowed &= diff <= left_window_size
        if right_window_size >= 0:
            allowed &= -diff <= right_window_size
    if nonpad is not None:
        pad_ok = (np.arange(T).reshape(1, T) < nonpad.reshape(B, 1)).reshape(B, 1, 1, T)
        allowed = pad_ok if allowed is None else (allowed & pad_ok)
    if allowed is not None:
        extra = np.where(allowed, cd.type(0), cd.type(_NEG_INF))
        bias = extra if bias is None else bias + extra

    with ignore_fp(invalid="ignore", over="ignore", divide="ignore"):
        qkb = qk if bias is None else r1(qk + bias)
        sp = _PRECISION[softmax_precision] if softmax_precision is not None else t1
        scd = _F64 if sp == _F64 else _F32
        rs = _rounder(sp, scd)
        probs = _softmax_lastaxis(rs(_as(qkb, scd)), rs)
        if bias is not None:
            masked = np.isneginf(np.max(bias, axis=-1, keepdims=True))
            if masked.any():
                probs = np.where(masked, scd.type(0), probs)
        probs = r1(_as(probs, cd))
        y = np.matmul(probs.reshape(B, Hkv, G, Sq, T), _as(Vt, cd)[:, :, None])
    Dv = Vt.shape[3]
    y = y.reshape(B, Hq, Sq, Dv)
    if rank3:
        y = y.transpose(0, 2, 1, 3).reshape(B, Sq, Hq * Dv)
    y = y.astype(t1)

    n = ctx.n_outputs
    want = ctx.outputs_wanted
    outs = [y]
    if n > 1:
        outs.append(np.ascontiguousarray(present_key) if want[1] else None)
    if n > 2:
        outs.append(np.ascontiguousarray(present_value) if want[2] else None)
    if n > 3:
        if not want[3]:
            outs.append(None)
        else:
            if qk_matmul_output_mode == 0:
                qo = raw_qk
            elif qk_matmul_output_mode == 1:
                qo = qk
            elif qk_matmul_output_mode == 2:
                qo = np.broadcast_to(qkb, (B, Hq, Sq, T))
            else:
                qo = probs
            outs.append(np.ascontiguousarray(qo).astype(t1))
    return tuple(outs) if n > 1 else y


@kernel("Attention", 23, check=_attention_check)
def attention_23(ctx, Q, K, V, attn_mask=None, past_key=None, past_value=None, *, is_causal,
                 kv_num_heads, q_num_heads, qk_matmul_output_mode, scale, softcap,
                 softmax_precision):
    return _attention(ctx, 23, Q, K, V, attn_mask, past_key, past_value, None,
                      is_causal=is_causal, kv_num_heads=kv_num_heads, q_num_heads=q_num_heads,
                      qk_matmul_output_mode=qk_matmul_output_mode, scale=scale, softcap=softcap,
                      softmax_precision=softmax_precision)


@kernel("Attention", 24, check=_attention_check)
def attention_24(ctx, Q, K, V, attn_mask=None, past_key=None, past_value=None,
                 nonpad_kv_seqlen=None, *, is_causal, kv_num_heads, q_num_heads,
                 qk_matmul_output_mode, scale, softcap, softmax_precision):
    return _attention(ctx, 24, Q, K, V, attn_mask, past_key, past_value, nonpad_kv_seqlen,
                      is_causal=is_causal, kv_num_heads=kv_num_heads, q_num_heads=q_num_heads,
                      qk_matmul_output_mode=qk_matmul_output_mode, scale=scale, softcap=softcap,
                      softmax_precision=softmax_precision)


@kernel("Attention", 25, check=_attention_check)
def attention_25(ctx, Q, K, V, attn_mask=None, past_key=None, past_value=None,
                 nonpad_kv_seqlen=None, *, is_causal, kv_num_heads, q_num_heads,
                 qk_matmul_output_mode, scale, softcap, softmax_precision,
                 left_window_size, right_window_size):
    if left_window_size < -1 or right_window_size < -1:
        raise ValueError("Attention: left_window_size/right_window_size must be -1 or nonnegative")
    return _attention(ctx, 25, Q, K, V, attn_mask, past_key, past_value, nonpad_kv_seqlen,
                      is_causal=is_causal, kv_num_heads=kv_num_heads, q_num_heads=q_num_heads,
                      qk_matmul_output_mode=qk_matmul_output_mode, scale=scale, softcap=softcap,
                      softmax_precision=softmax_precision, left_window_size=left_window_size,
                      right_window_size=right_window_size)


# =======================================================================================
# FlexAttention (ai.onnx.preview, 1)
# =======================================================================================

def _flex_check(node):
    if any(node.attrs.get(g) is not None for g in ("score_mod", "prob_mod")):
        from .control import check_bodies  # the modifier subgraphs: can every op of them run?

        why = check_bodies(node)
        if why:
            return f"FlexAttention: {why}"
    sp = _attr(node, "softmax_precision")
    if sp is not None and sp not in _PRECISION:
        return f"FlexAttention: softmax_precision={sp} is not supported (1, 10, 11, 16)"
    for i in range(3):
        r = _rank_of(node, i)
        if r is not None and r != 4:
            return f"FlexAttention: input {i} has rank {r}; rank-4 inputs are required"
    return None


def _modifier(ctx, attr, x, sp, scd, outer):
    """Run the ``score_mod`` / ``prob_mod`` subgraph on ``x`` (B, Hq, L, S) in the softmax type."""
    out = ctx.subgraphs[attr].run([np.ascontiguousarray(x.astype(sp, copy=False))], outer)
    if len(out) != 1 or np.shape(out[0]) != x.shape:
        raise ValueError(f"FlexAttention: {attr} must return one tensor of shape {x.shape}, "
                         f"got {[np.shape(o) for o in out]}")
    return _as(np.asarray(out[0]), scd)


@kernel("FlexAttention", 1, domain="ai.onnx.preview", check=_flex_check, dtypes=_FLOATS, control=True)
def flex_attention(ctx, Q, K, V, *, prob_mod, scale, score_mod, softmax_precision, outer=None):
    if Q.ndim != 4 or K.ndim != 4 or V.ndim != 4:
        raise ValueError(f"FlexAttention: rank-4 inputs required, got {Q.shape}, {K.shape}, {V.shape}")
    B, Hq, L, E = Q.shape
    _, Hkv, S, Ek = K.shape
    if V.shape[1] != Hkv or V.shape[2] != S or Ek != E or Hkv <= 0 or Hq % Hkv:
        raise ValueError(f"FlexAttention: incompatible shapes Q {Q.shape}, K {K.shape}, V {V.shape}")
    G = Hq // Hkv
    t1 = Q.dtype
    cd = _cdtype(t1)
    r1 = _rounder(t1, cd)
    sc = (1.0 / math.sqrt(E)) if scale is None else float(scale)
    s = cd.type(t1.type(np.sqrt(np.float32(sc))))
    qs = r1(_as(Q, cd) * s)
    ks = r1(_as(K, cd) * s)
    scores = np.matmul(qs.reshape(B, Hkv, G, L, E), np.swapaxes(ks, -1, -2)[:, :, None])
    scores = r1(scores)
    if softmax_precision is not None:
        sp = _PRECISION[softmax_precision]
    else:
        sp = _F64 if t1 == _F64 else _F32
    scd = _F64 if sp == _F64 else _F32
    rs = _rounder(sp, scd)
    with ignore_fp(invalid="ignore", over="ignore"):
        x = rs(_as(scores, scd))
        S = x.shape[-1]
        if score_mod is not None:
            x = rs(_modifier(ctx, "score_mod", x.reshape(B, Hq, L, S), sp, scd, outer).reshape(x.shape))
        m = np.max(x, axis=-1, keepdims=True)
        e = rs(np.exp(rs(x - m)))
        probs = rs(e / rs(np.sum(e, axis=-1, keepdims=True)))
        if prob_mod is not None:
            probs = rs(_modifier(ctx, "prob_mod", probs.reshape(B, Hq, L, S), sp, scd, outer).reshape(probs.shape))
        y = rs(np.matmul(probs, rs(_as(V, scd))[:, :, None]))
    return y.reshape(B, Hq, L, V.shape[3]).astype(V.dtype)


# =======================================================================================
# RMSNormalization (23)
# =======================================================================================

_STASH = {1: _F32, 11: _F64}


def _rms_check(node):
    st = _attr(node, "stash_type", 1)
    if st not in _STASH:
        return f"RMSNormalization: stash_type={st} is not implemented (1 = float32, 11 = double)"
    xt, wt = _dtype_of(node, 0), _dtype_of(node, 1)
    if xt is not None and wt is not None and xt != wt:
        return f"RMSNormalization: X ({xt.name}) and scale ({wt.name}) of different types are not supported"
    return None


@kernel("RMSNormalization", 23, check=_rms_check, dtypes=_FLOATS)
def rms_normalization(ctx, x, scale, *, axis, epsilon, stash_type):
    st = _STASH[stash_type]
    ax = normalize_axis(axis, x.ndim)
    xu = _as(x, st)
    axes = tuple(range(ax, x.ndim))
    ms = np.mean(xu * xu, axis=axes, keepdims=True, dtype=st)
    rms = np.sqrt(ms + st.type(epsilon))
    normalized = (xu / rms).astype(x.dtype)
    cd = _cdtype(x.dtype)
    y = _as(normalized, cd) * _as(scale, cd)
    if y.shape != x.shape:
        raise ValueError(f"RMSNormalization: scale of shape {scale.shape} does not broadcast to X {x.shape}")
    return y.astype(x.dtype)


# =======================================================================================
# RotaryEmbedding (23)
# =======================================================================================

@kernel("RotaryEmbedding", 23, dtypes=_FLOATS_NO_F64)
def rotary_embedding(ctx, x, cos_cache, sin_cache, position_ids=None, *, interleaved,
                     num_heads, rotary_embedding_dim):
    t = x.dtype
    cd = _F32
    r = _rounder(t, cd)
    if x.ndim == 4:
        B, H, S, D = x.shape
        xv = x  # (B, H, S, D); caches broadcast as (B, 1, S, rd/2)
        head_axis = 1
    elif x.ndim == 3:
        B, S, hidden = x.shape
        if not num_heads or hidden % num_heads:
            raise ValueError(f"RotaryEmbedding: 3D input needs num_heads dividing {hidden}, got {num_heads}")
        D = hidden // num_heads
        xv = x.reshape(B, S, num_heads, D)  # caches broadcast as (B, S, 1, rd/2)
        head_axis = 2
    else:
        raise ValueError(f"RotaryEmbedding: input must be 3D or 4D, got {x.shape}")
    rd = rotary_embedding_dim or D
    if rd > D or rd % 2:
        raise ValueError(f"RotaryEmbedding: rotary_embedding_dim {rd} must be even and <= head_size {D}")
    half = rd // 2
    if position_ids is not None:
        pid = np.asarray(position_ids, dtype=np.int64)
        cos = cos_cache[pid]
        sin = sin_cache[pid]
    else:
        cos, sin = cos_cache, sin_cache
    if cos.shape[-1] != half or sin.shape[-1] != half:
        raise ValueError(f"RotaryEmbedding: cache last dim {cos.shape[-1]} != rotary_embedding_dim/2 {half}")
    if cos.ndim != 3 or cos.shape[:2] != (B, S) or sin.shape != cos.shape:
        cos = np.broadcast_to(cos, (B, S, half))
        sin = np.broadcast_to(sin, (B, S, half))
    cos = np.expand_dims(_as(cos, cd), head_axis)
    sin = np.expand_dims(_as(sin, cd), head_axis)
    xr = _as(xv[..., :rd], cd)
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
    else:
        x1, x2 = xr[..., :half], xr[..., half:]
    real = r(r(cos * x1) - r(sin * x2))
    imag = r(r(sin * x1) + r(cos * x2))
    out = np.array(xv, dtype=t, copy=True)
    if interleaved:
        out[..., 0:rd:2] = real.astype(t)
        out[..., 1:rd:2] = imag.astype(t)
    else:
        out[..., :half] = real.astype(t)
        out[..., half:rd] = imag.astype(t)
    return out.reshape(x.shape)


# =======================================================================================
# SwiGLU (28)
# =======================================================================================

@kernel("SwiGLU", 28, dtypes=_FLOATS)
def swiglu(ctx, a, b, *, alpha):
    if a.shape != b.shape:
        raise ValueError(f"SwiGLU: A {a.shape} and B {b.shape} must have the same shape (no broadcasting)")
    if a.dtype != b.dtype:
        raise ValueError(f"SwiGLU: A ({a.dtype}) and B ({b.dtype}) must have the same type")
    t = a.dtype
    cd = _cdtype(t)
    r = _rounder(t, cd)
    af = _as(a, cd)
    al = cd.type(t.type(alpha))
    with ignore_fp(over="ignore"):
        sig = r(cd.type(1) / r(cd.type(1) + r(np.exp(r(-al * af)))))
    return r(r(af * sig) * _as(b, cd)).astype(t)


# =======================================================================================
# TensorScatter (24)
# =======================================================================================

def _tensor_scatter_check(node):
    mode = _attr(node, "mode", "linear")
    if mode not in ("linear", "circular"):
        return f"TensorScatter: mode {mode!r} is not supported (linear, circular)"
    return None


@kernel("TensorScatter", 24, check=_tensor_scatter_check)
def tensor_scatter(ctx, past_cache, update, write_indices=None, *, axis, mode):
    rank = past_cache.ndim
    ax = normalize_axis(axis, rank)
    if ax == 0:
        raise ValueError("TensorScatter: axis cannot be 0 (the batch axis)")
    if update.ndim != rank or any(update.shape[i] != past_cache.shape[i] for i in range(rank) if i != ax):
        raise ValueError(f"TensorScatter: update {update.shape} does not match cache {past_cache.shape}")
    M, S, B = past_cache.shape[ax], update.shape[ax], past_cache.shape[0]
    if S > M:
        raise ValueError(f"TensorScatter: update length {S} exceeds the cache length {M}")
    if write_indices is None:
        wi = np.zeros((B,), dtype=np.int64)
    else:
        wi = np.asarray(write_indices, dtype=np.int64).reshape(-1)
        if wi.shape[0] != B:
            raise ValueError(f"TensorScatter: write_indices has {wi.shape[0]} entries for batch {B}")
    idx = wi[:, None] + np.arange(S, dtype=np.int64)[None, :]          # (B, S)
    if mode == "circular":
        idx = idx % M
    elif S and (wi.min() < 0 or (wi + S).max() > M):
        raise ValueError(f"TensorScatter: linear write indices {wi.tolist()} + {S} exceed the cache length {M}")
    present = past_cache.copy()
    if S == 0 or B == 0:
        return present
    pv = np.moveaxis(present, ax, 1)                                     # a view of present
    uv = np.moveaxis(update, ax, 1)
    pv[np.arange(B)[:, None], idx] = uv
    return present


# =======================================================================================
# CausalConvWithState (27)
# =======================================================================================

def _ccws_check(node):
    act = _attr(node, "activation", "none")
    if act not in ("none", "silu", "swish"):
        return f"CausalConvWithState: activation {act!r} is not supported (none, silu, swish)"
    for i, want in ((0, 3), (1, 3)):
        r = _rank_of(node, i)
        if r is not None and r != want:
            return f"CausalConvWithState: input {i} must be rank {want}, got rank {r}"
    return None


@kernel("CausalConvWithState", 27, check=_ccws_check, dtypes=_FLOATS_NO_F64)
def causal_conv_with_state(ctx, x, weight, bias=None, past_state=None, *, activation):
    if x.ndim != 3 or weight.ndim != 3:
        raise ValueError(f"CausalConvWithState: input {x.shape} and weight {weight.shape} must be rank 3")
    B, C, L = x.shape
    k = weight.shape[2]
    if weight.shape[0] != C or weight.shape[1] != 1 or k < 1:
        raise ValueError(f"CausalConvWithState: weight {weight.shape} must be ({C}, 1, k)")
    t = x.dtype
    cd = _F32
    r = _rounder(t, cd)
    if past_state is None:
        pad = np.zeros((B, C, k - 1), dtype=t)
    else:
        if past_state.shape != (B, C, k - 1):
            raise ValueError(f"CausalConvWithState: past_state {past_state.shape} must be {(B, C, k - 1)}")
        pad = _as(past_state, t)
    padded = np.concatenate((pad, x), axis=2)                         # (B, C, L + k - 1)
    win = sliding_window_view(_as(padded, cd), k, axis=2)              # (B, C, L, k)
    y = np.matmul(win, _as(weight, cd).reshape(C, k, 1))[..., 0]       # (B, C, L)
    if bias is not None:
        y = y + _as(bias, cd).reshape(C, 1)
    y = r(y)
    if activation in ("silu", "swish"):
        with ignore_fp(over="ignore"):
            y = y * (cd.type(1) / (cd.type(1) + np.exp(-y)))
    present = np.ascontiguousarray(padded[:, :, padded.shape[2] - (k - 1):])
    return y.astype(t), present


# =======================================================================================
# LinearAttention (27)
# =======================================================================================

_RULES = ("linear", "gated", "delta", "gated_delta")


def _linear_attention_check(node):
    rule = _attr(node, "update_rule", "gated_delta")
    if rule not in _RULES:
        return f"LinearAttention: update_rule {rule!r} is not supported ({', '.join(_RULES)})"
    qh, kh = _attr(node, "q_num_heads"), _attr(node, "kv_num_heads")
    if qh is None or kh is None:
        return "LinearAttention: q_num_heads and kv_num_heads are required"
    if qh <= 0 or kh <= 0 or qh % kh:
        return f"LinearAttention: q_num_heads {qh} must be a positive multiple of kv_num_heads {kh}"
    gating = rule in ("gated", "gated_delta")
    delta = rule in ("delta", "gated_delta")
    if gating != (_info(node, 4) is not None):
        return f"LinearAttention: update_rule {rule!r} {'requires' if gating else 'forbids'} the decay input"
    if delta != (_info(node, 5) is not None):
        return f"LinearAttention: update_rule {rule!r} {'requires' if delta else 'forbids'} the beta input"
    return None


@kernel("LinearAttention", 27, check=_linear_attention_check, dtypes=_FLOATS_NO_F64)
def linear_attention(ctx, query, key, value, past_state=None, decay=None, beta=None, *,
                     chunk_size, kv_num_heads, q_num_heads, scale, update_rule):
    gating = update_rule in ("gated", "gated_delta")
    delta = update_rule in ("delta", "gated_delta")
    if gating != (decay is not None) or delta != (beta is not None):
        raise ValueError(f"LinearAttention: inputs do not match update_rule {update_rule!r}")
    for nm, a in (("query", query), ("key", key), ("value", value)):
        if a.ndim != 3:
            raise ValueError(f"LinearAttention: {nm} must be rank 3 (B, T, H*D), got {a.shape}")
    B, T, qhid = query.shape
    Hq, Hkv = q_num_heads, kv_num_heads
    if qhid % Hq or key.shape[-1] % Hkv or value.shape[-1] % Hkv:
        raise ValueError("LinearAttention: hidden sizes are not divisible by the head counts")
    dk, dv, G = qhid // Hq, value.shape[-1] // Hkv, Hq // Hkv
    if key.shape != (B, T, Hkv * dk) or value.shape[:2] != (B, T):
        raise ValueError(f"LinearAttention: key {key.shape} / value {value.shape} do not match query {query.shape}")
    f = _F32
    q4 = _as(query, f).reshape(B, T, Hkv, G, dk)                         # per step: (B, Hkv, G, dk)
    k4 = _as(key, f).reshape(B, T, Hkv, dk)
    v4 = _as(value, f).reshape(B, T, Hkv, dv)
    if gating:
        if decay.ndim != 3 or decay.shape[:2] != (B, T):
            raise ValueError(f"LinearAttention: decay must be (B, T, ...), got {decay.shape}")
        if decay.shape[-1] == Hkv:
            g4 = np.exp(_as(decay, f)).reshape(B, T, Hkv, 1, 1)
        elif decay.shape[-1] == Hkv * dk:
            g4 = np.exp(_as(decay, f)).reshape(B, T, Hkv, dk, 1)
        else:
            raise ValueError(f"LinearAttention: decay last dim {decay.shape[-1]} must be {Hkv} or {Hkv * dk}")
    if delta:
        if beta.ndim != 3 or beta.shape[:2] != (B, T) or beta.shape[-1] not in (Hkv, 1):
            raise ValueError(f"LinearAttention: beta must be (B, T, {Hkv} or 1), got {beta.shape}")
        b4 = _as(beta, f).reshape(B, T, beta.shape[-1], 1)
    if past_state is not None:
        if past_state.shape != (B, Hkv, dk, dv):
            raise ValueError(f"LinearAttention: past_state {past_state.shape} must be {(B, Hkv, dk, dv)}")
        state_dt = past_state.dtype
        state = past_state.astype(f)                                    # a copy
    else:
        od = ctx.output_dtypes[1] if len(ctx.output_dtypes) > 1 else None
        state_dt = np.dtype(od) if od is not None else query.dtype
        state = np.zeros((B, Hkv, dk, dv), dtype=f)
    sc = np.float64(1.0 / math.sqrt(dk)) if not scale else np.float64(scale)
    out = np.empty((B, T, Hkv, G, dv), dtype=f)
    for t in range(T):
        if gating:
            state *= g4[:, t]
        k_t = k4[:, t]                                                  # (B, Hkv, dk)
        v_t = v4[:, t]                                                  # (B, Hkv, dv)
        if delta:
            retrieved = np.matmul(k_t[:, :, None, :], state)[:, :, 0, :]   # (B, Hkv, dv)
            v_t = b4[:, t] * (v_t - retrieved)
        state += k_t[:, :, :, None] * v_t[:, :, None, :]
        out[:, t] = np.matmul(q4[:, t], state)                          # (B, Hkv, G, dv)
    y = (out.reshape(B, T, Hq * dv) * sc).astype(query.dtype)
    return y, state.astype(state_dt)
