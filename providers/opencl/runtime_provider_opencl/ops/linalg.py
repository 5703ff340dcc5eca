"""MatMul (numpy semantics, batched with broadcasting) and Gemm, on one tiled kernel."""

from __future__ import annotations

import numpy as np

from ..registry import FLOAT_ONLY, In, Launch, Out, check_inputs, is_static, op, present, rank, shape
from ..shapes import broadcast_strides, int32_array

FILE = "matmul.cl"


def _matmul_dims(a, b):
    """(batch shape, M, K, N, a batch shape, b batch shape) of numpy matmul, or a reason."""
    a2 = a if len(a) >= 2 else (1,) + tuple(a)
    b2 = b if len(b) >= 2 else tuple(b) + (1,)
    if a2[-1] != b2[-2]:
        return f"MatMul inner dimensions differ: {a} @ {b}"
    try:
        batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    except ValueError:
        return f"MatMul batch dimensions of {a} and {b} do not broadcast"
    return tuple(batch), a2[-2], a2[-1], b2[-1], a2[:-2], b2[:-2]


def _numpy_matmul_shape(a, b, dims):
    batch, m, _, n, _, _ = dims
    out = list(batch)
    if len(a) >= 2:
        out.append(m)
    if len(b) >= 2:
        out.append(n)
    return tuple(out)


def _same_dtype(node, idx):
    dts = {str(node.input_info[i].dtype) for i in idx if present(node, i)}
    return None if len(dts) <= 1 else f"{node.op_type} inputs have different dtypes {sorted(dts)}"


def _check_matmul(node):
    why = check_inputs(node, FLOAT_ONLY, [0, 1]) or _same_dtype(node, (0, 1))
    if why:
        return why
    if rank(node, 0) == 0 or rank(node, 1) == 0:
        return "MatMul of a scalar"
    if not is_static(node):
        return None
    a, b = shape(node, 0), shape(node, 1)
    dims = _matmul_dims(a, b)
    if isinstance(dims, str):
        return dims
    expect = _numpy_matmul_shape(a, b, dims)
    out = node.output_info[0]
    if out is not None and out.static_shape is not None and tuple(out.static_shape) != expect:
        return f"inferred output shape {out.static_shape} differs from matmul's {expect}"
    return None


def _matmul_infer(node):
    a, b = shape(node, 0), shape(node, 1)
    dims = _matmul_dims(a, b)
    if isinstance(dims, str):
        raise ValueError(dims)
    return [_numpy_matmul_shape(a, b, dims)]


def gemm_launch(ctx, M, N, K, trans_a, trans_b, alpha, beta, c_strides, offsets, dtype=None):
    """One launch of the tiled kernel over ``len(offsets)`` batches; inputs In(0..2)."""
    ts = ctx.dev.tile
    nb = len(offsets)
    g = ((N + ts - 1) // ts * ts, (M + ts - 1) // ts * ts, nb)
    boffs = ctx.upload(int32_array(offsets).reshape(-1))
    has_c = c_strides is not None
    csm, csn = c_strides if has_c else (0, 0)
    args = [In(0), In(1), In(2) if has_c else ctx.dev.dummy, Out(0),
            np.int32(M), np.int32(N), np.int32(K), np.int32(trans_a), np.int32(trans_b),
            np.float32(alpha), np.float32(beta), np.int32(has_c), np.int32(csm), np.int32(csn),
            boffs, np.int32(nb)]
    return Launch(ctx.kernel(FILE, "gemm", dtype), g, (ts, ts, 1), args)


@op("MatMul", 1, 9, 13, check=_check_matmul, infer=_matmul_infer)
def _matmul(node, ctx):
    a, b = shape(node, 0), shape(node, 1)
    batch, M, K, N, ba, bb = _matmul_dims(a, b)
    sa = [s * M * K for s in broadcast_strides(ba, batch)]
    sb = [s * K * N for s in broadcast_strides(bb, batch)]
    if batch:
        idx = np.indices(batch).reshape(len(batch), -1).T
        offs = np.stack([idx @ np.asarray(sa, np.int64), idx @ np.asarray(sb, np.int64)], axis=1)
    else:
        offs = np.zeros((1, 2), np.int64)
    launch = gemm_launch(ctx, M, N, K, 0, 0, 1.0, 0.0, None, offs, node.input_info[0].dtype)
    return ctx.step(node, [launch], inputs=node.inputs[:2])


def _gemm_dims(node):
    a, b = shape(node, 0), shape(node, 1)
    ta, tb = int(node.attrs["transA"]), int(node.attrs["transB"])
    M, K = (a[1], a[0]) if ta else (a[0], a[1])
    K2, N = (b[1], b[0]) if tb else (b[0], b[1])
    return M, K, K2, N


def _check_gemm(node):
    why = check_inputs(node, FLOAT_ONLY, [0, 1, 2]) or _same_dtype(node, (0, 1, 2))
    if why:
        return why
    if rank(node, 0) != 2 or rank(node, 1) != 2:
        return f"Gemm needs 2-D A and B, got ranks {rank(node, 0)} and {rank(node, 1)}"
    if present(node, 2) and rank(node, 2) > 2:
        return f"Gemm C of rank {rank(node, 2)}"
    if not is_static(node):
        return None
    M, K, K2, N = _gemm_dims(node)
    if K != K2:
        return f"Gemm inner dimensions differ ({K} and {K2})"
    if present(node, 2):
        c = shape(node, 2)
        c2 = (1,) * (2 - len(c)) + tuple(c)
        if len(c) > 2 or c2[0] not in (1, M) or c2[1] not in (1, N):
            return f"Gemm C of shape {c} does not broadcast to ({M}, {N})"
    return None


def _gemm_infer(node):
    M, _, _, N = _gemm_dims(node)
    return [(M, N)]


@op("Gemm", 7, 9, 11, 13, check=_check_gemm, infer=_gemm_infer)
def _gemm(node, ctx):
    M, K, _, N = _gemm_dims(node)
    c_strides = None
    ins = list(node.inputs[:2])
    if present(node, 2) and node.attrs["beta"] != 0.0:
        c = shape(node, 2)
        cm, cn = (1,) * (2 - len(c)) + tuple(c)
        c_strides = (cn if cm != 1 else 0, 1 if cn != 1 else 0)
        ins.append(node.inputs[2])
    launch = gemm_launch(ctx, M, N, K, int(node.attrs["transA"]), int(node.attrs["transB"]),
                         node.attrs["alpha"], node.attrs["beta"], c_strides, [(0, 0)],
                         node.input_info[0].dtype)
    return ctx.step(node, [launch], inputs=ins)
