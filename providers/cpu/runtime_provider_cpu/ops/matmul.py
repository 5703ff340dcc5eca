"""CPU kernels: MatMul and Gemm.

Float16 / bfloat16 are computed in float32 and cast back; float32 products by a 2-D weight
take the Linear plan chosen for their shape on this machine (``fast/linear.py``: BLAS as
sgemm tiles on the kernel pool, the packed compiled kernel or the few-rows one), small Gemm
products without the compiled kernels numpy's own loop (BLAS's woken threads would spin past
the call), other float32 products single-threaded sgemm tiles on the kernel pool
(``fast/sgemm.pooled_matmul``), other dtypes BLAS.
"""

from __future__ import annotations

import numpy as np

from ..executable import binds
from ..fast import linear as fast_linear
from ..fast.policy import current
from ..fast.sgemm import pooled_matmul, sgemm_ready
from ..registry import kernel
from ._common import broadcast_shape
from ._dtypes import _F32 as _F32_DT  # the float32 descriptor (identity tests)
from ._nncommon import _BF16, _F32, _FLOAT, _MATMUL_TYPES, _as, _cdtype


def _matmul(a, b):
    if a.ndim > 2 and b.ndim == 2:
        # one BLAS call over the folded batch instead of one per matrix
        lead = a.shape[:-1]
        y = np.matmul(a.reshape(-1, a.shape[-1]), b)
        return y.reshape(*lead, b.shape[1])
    return np.matmul(a, b)


def batched_matmul(ctx, a, b, transA=False, transB=False, alpha=1.0):
    """``alpha * op(a) @ op(b)`` for C-contiguous float32 ``a``, ``b`` of rank >= 3 (or one of them
    2-D, broadcast) on ``_native.bmm``: the matrices of the batch (blocks of their rows) spread
    over the kernel threads, each a single-threaded sgemm reading the transposes in place. None
    where that is not the path (another dtype, layout or broadcast, a small product, no sgemm).
    Taken at one thread too (no slower than numpy's loop there): the same bits at any count."""
    threads = getattr(ctx, "threads", 1)
    if (type(a) is not np.ndarray or type(b) is not np.ndarray or a.dtype != _F32
            or b.dtype != _F32 or a.ndim < 2 or b.ndim < 2 or max(a.ndim, b.ndim) < 3
            or not a.flags.c_contiguous or not b.flags.c_contiguous):
        return None
    M, K = a.shape[-2:][::-1] if transA else a.shape[-2:]
    Kb, N = b.shape[-2:][::-1] if transB else b.shape[-2:]
    la, lb = a.shape[:-2], b.shape[:-2]
    na, nb = int(np.prod(la)), int(np.prod(lb))
    if K != Kb or not (la == lb or na == 1 or nb == 1):
        return None
    lead = la if la == lb else np.broadcast_shapes(la, lb)
    batch = int(np.prod(lead))
    if batch * M * K * N < current().blas_min_macs or M == 0 or N == 0 or K == 0 or not sgemm_ready():
        return None
    y = np.empty((*lead, M, N), np.float32)
    current().native.bmm(a, b, y, (batch, M, K, N, na == batch, nb == batch), bool(transA),
                         bool(transB), float(alpha), threads)
    return y


@kernel("MatMul", 1, 9, 13, dtypes=_MATMUL_TYPES | _BF16)
@binds
def matmul(ctx, a, b):
    f32 = a.dtype is _F32_DT  # identity: numpy's dtype.name is a Python property, ~5 us a call
    if not f32 or b.dtype is not _F32_DT:
        if a.dtype.name in ("float16", "bfloat16") or b.dtype.name in ("float16", "bfloat16"):
            return _matmul(a.astype(_F32), b.astype(_F32)).astype(a.dtype)
        f32 = a.dtype == _F32
    if f32 and a.ndim >= 2 and b.ndim == 2:
        y = fast_linear.linear(ctx, a, b)
        fast_linear.bind_matmul(ctx, b, matmul)
        if y is None:  # numpy's BLAS is held at one thread: large products go to the pool
            y = pooled_matmul(getattr(ctx, "threads", 1), a, b)
        if y is not None:
            return y
    if a.ndim >= 3 and b.ndim >= 3 and (y := batched_matmul(ctx, a, b)) is not None:
        return y
    return _matmul(a, b)


#: the optimizer's private fused ops (``runtime_core.fused``; not onnxruntime's)
FUSED = "runtime_core.fused"


def _matmul_activation_check(node):
    act = node.attrs.get("activation")
    if act != "Relu":
        return f"{FUSED}::MatMulActivation: activation {act!r} is not implemented (Relu)"
    info = node.input_info[1] if len(node.input_info) > 1 else None
    if info is not None and info.shape is not None and len(info.shape) != 2:
        return f"{FUSED}::MatMulActivation takes a 2-D weight, got rank {len(info.shape)}"
    return None


@kernel("MatMulActivation", 1, domain=FUSED, dtypes={"float32"}, check=_matmul_activation_check)
def matmul_activation(ctx, a, b, bias=None, *, activation):
    """``Relu(MatMul(a, b) (+ bias))`` (T5's feed-forward): the Relu in the Linear kernel's
    epilogue while the tile is in registers, instead of a pass of its own over the result."""
    if b.ndim != 2 or a.ndim < 1 or a.shape[-1] != b.shape[0]:
        raise ValueError(f"{FUSED}::MatMulActivation: a of shape {a.shape} does not multiply a weight of "
                         f"shape {b.shape}")
    if bias is not None and bias.shape != (b.shape[1],):
        raise ValueError(f"{FUSED}::MatMulActivation: bias of shape {bias.shape}, expected {(b.shape[1],)}")
    y = None
    if a.ndim >= 2:
        y = fast_linear.linear(ctx, a, b, bias=None if bias is None else np.ascontiguousarray(bias), relu=True)
    if y is None:
        y = _matmul(a, b)
        if bias is not None:
            y = y + bias
        y = np.maximum(y, np.float32(0), out=y)
    return y


def _gemm6_check(node):
    if len(node.inputs) < 3 or not node.inputs[2]:
        return f"Gemm-{node.since_version}: input C is required"
    return None


@kernel("Gemm", 1, 6, dtypes=_FLOAT, check=_gemm6_check)
def gemm_6(ctx, a, b, c, *, alpha, beta, broadcast, transA, transB):
    # opsets 1 and 6 (same attributes and text; 1 only notes C "can be inplace", which is no
    # semantic difference): C is broadcast to (M, N) only when ``broadcast`` is set, else it
    # must be (M, N)
    v = ctx.node.since_version
    M = a.shape[1] if transA else a.shape[0]
    N = b.shape[0] if transB else b.shape[1]
    if broadcast:
        if np.broadcast_shapes(c.shape, (M, N)) != (M, N):
            raise ValueError(f"Gemm-{v}: C of shape {c.shape} does not broadcast to {(M, N)}")
    elif c.shape != (M, N):
        raise ValueError(f"Gemm-{v}: C must have shape {(M, N)} when broadcast=0, got {c.shape}")
    return gemm(ctx, a, b, c, alpha=alpha, beta=beta, transA=transA, transB=transB)




@kernel("Gemm", 7, 9, 11, 13, dtypes=_MATMUL_TYPES)
def gemm(ctx, a, b, c=None, *, alpha, beta, transA, transB):
    A = a.T if transA else a
    B = b.T if transB else b
    dt = a.dtype
    use_c = c is not None and beta != 0.0
    if dt.kind == "f":
        pol = current()
        cd = _cdtype(dt)
        A, B = _as(A, cd), _as(B, cd)
        if cd is _F32_DT and (y := fast_linear.linear(ctx, A, _as(b, cd), bool(transB))) is not None:
            pass  # the Linear plan of this shape (fast/linear.py)
        elif A.shape[0] * A.shape[1] * B.shape[1] < pol.blas_min_macs:
            # a small product of more rows: a BLAS call would wake its worker threads, which
            # then spin on the cores, taking them from the compiled kernels of the next run;
            # numpy's own loop is single-threaded and slower, hence the small bound
            y = np.einsum("ij,jk->ik", A, B)
        elif cd != _F32 or (y := pooled_matmul(getattr(ctx, "threads", 1), A, B)) is None:
            y = np.matmul(A, B)
        if alpha != 1.0:
            y *= cd.type(alpha)
        if use_c:
            cc = _as(c, cd)
            if beta != 1.0:
                cc = cc * cd.type(beta)
            if broadcast_shape(y.shape, cc.shape) == y.shape:
                y += cc  # y is a fresh matmul result: add the bias in place
            else:
                y = y + cc
        return _as(y, dt)
    y = np.matmul(A, B)
    if alpha == 1.0 and (not use_c or beta == 1.0):
        if use_c:
            y = y + c.astype(dt, copy=False)
        return _as(y, dt)
    yf = y.astype(np.float64) * alpha
    if use_c:
        yf = yf + c.astype(np.float64) * beta
    return yf.astype(dt)



MS = "com.microsoft"


def _fused_matmul_check(node):
    for name in ("transBatchA", "transBatchB"):
        if node.attrs.get(name):
            return f"com.microsoft::FusedMatMul: {name}=1 is not implemented"
    return None


@kernel("FusedMatMul", 1, domain=MS, dtypes={"float32"}, check=_fused_matmul_check)
def fused_matmul(ctx, a, b, *, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0):
    """``alpha * op(a) @ op(b)`` (onnxruntime's contrib op; op transposes the last two axes):
    the transposed operands are read in place by BLAS (a strided view, not a copy)."""
    if transBatchA or transBatchB:
        raise ValueError("com.microsoft::FusedMatMul: transBatchA / transBatchB are not implemented")
    if (transA and a.ndim < 2) or (transB and b.ndim < 2):
        raise ValueError(f"com.microsoft::FusedMatMul: transA/transB need rank >= 2, got {a.shape} and {b.shape}")
    A = a.swapaxes(-1, -2) if transA else a
    if b.ndim == 2 and not transA:
        y = fast_linear.linear(ctx, A, b, bool(transB))  # a 2-D weight on the Linear plan
        if y is None:
            y = pooled_matmul(getattr(ctx, "threads", 1), A, b.T if transB else b)
    else:
        y = batched_matmul(ctx, a, b, transA, transB, alpha)
        if y is not None:
            return y
    if y is None:
        y = np.asarray(np.matmul(A, b.swapaxes(-1, -2) if transB else b))
    if alpha != 1.0:
        y *= np.float32(alpha)
    return y


def _sdpa_check(node):
    info = node.input_info[:3] if len(node.input_info) >= 3 else []
    ranks = {len(i.shape) for i in info if i is not None and i.shape is not None}
    if any(r < 3 for r in ranks):
        return f"{FUSED}::ScaledDotProductAttention takes q, k, v of rank >= 3"
    return None


@kernel("ScaledDotProductAttention", 1, domain=FUSED, dtypes={"float32"}, check=_sdpa_check)
def scaled_dot_product_attention(ctx, q, k, v, bias=None, *, scale):
    """``Softmax(scale * q @ k^T (+ bias), axis=-1) @ v`` for q, k, v [..., S, d] of one shape (the
    attention the optimizer finds around int8 projections, ``matmul_fusions.py``): on
    ``_native.sdpa`` a head's scores stay in a per-thread buffer (no [.., S, S] tensor and no
    separate Softmax pass), else numpy's batched products."""
    if q.ndim < 3 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"{FUSED}::ScaledDotProductAttention: q, k, v must share one shape of rank >= 3, got "
                         f"{q.shape}, {k.shape}, {v.shape}")
    S, d = q.shape[-2:]
    lead = q.shape[:-2]
    scores = (*lead, S, S)
    if bias is not None:
        try:
            ok = bias.ndim <= len(scores) and np.broadcast_shapes(bias.shape, scores) == scores
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"{FUSED}::ScaledDotProductAttention: bias of shape {bias.shape} does not broadcast "
                             f"to the scores' shape {scores}")
    BH = int(np.prod(lead))
    p = current()
    if (BH and S and d and q.dtype == _F32 and k.dtype == _F32 and v.dtype == _F32 and sgemm_ready()
            and (bias is None or bias.dtype == _F32)):
        m = md = None
        if bias is not None:
            ds = S if bias.ndim >= 2 and bias.shape[-2] != 1 else 1
            if all(x == 1 for x in bias.shape[:-2]):  # one bias for every head: not copied per head
                m = np.ascontiguousarray(np.broadcast_to(bias.reshape(bias.shape[-2:]), (ds, S)), dtype=_F32)
                md = (1, 1, ds)
            else:
                m = np.ascontiguousarray(np.broadcast_to(bias, (*lead, ds, S)), dtype=_F32)
                md = (BH, 1, ds)
        y = np.empty(q.shape, _F32)
        p.native.sdpa(np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v), (BH, S, d),
                      float(scale), m, md, y, getattr(ctx, "threads", 1))
        return y
    z = np.matmul(q, k.swapaxes(-1, -2)) * q.dtype.type(scale)
    if bias is not None:
        z = z + bias
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    z /= z.sum(axis=-1, keepdims=True)
    return np.matmul(z, v).astype(q.dtype, copy=False)
