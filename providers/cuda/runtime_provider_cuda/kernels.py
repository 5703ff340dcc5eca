"""CUDA fast paths, written against an array module ``xp`` (cupy, or the numpy stand-in).

Each fast path is ``fn(be, ctx, *inputs, **attrs)`` like a CPU kernel, with ``be``
the back end (``be.xp`` the array module; ``be.cuda_kernels`` whether hand-written
CUDA kernels may be launched). The semantics are the ONNX ones the CPU provider
implements; where a hand-written kernel (RawKernel, ElementwiseKernel) is used it
computes the same formula as the ``xp`` path beside it, which is what runs on the
stand-in.

* MatMul / Gemm: ``xp.matmul`` (cuBLAS GEMM, strided-batched for batches).
* Conv: implicit im2col as a strided view + one batched ``xp.matmul`` per group.
* Softmax, LayerNormalization: one-block-per-row RawKernels for float32 rows
  (last axis), the ``xp`` formula otherwise.
* Erf, Gelu: ``cupyx.scipy.special.erf``.
* Fused elementwise chains (see :func:`fused_program`): one ``ElementwiseKernel``.
"""

from __future__ import annotations

import functools
import hashlib
import math

import numpy as np

FLOATS = ("float16", "float32", "float64")


# -- helpers ---------------------------------------------------------------------------

def is_cupy(xp) -> bool:
    return getattr(xp, "__name__", "") == "cupy"


def erf(xp, a):
    """``erf`` in the array module of ``a`` (cupyx on the GPU; scipy for the stand-in)."""
    if is_cupy(xp):
        import cupyx.scipy.special as sp

        return sp.erf(a)
    import scipy.special

    return xp.asarray(scipy.special.erf(a.view(np.ndarray)))


def as_strided(xp, a, shape, strides):
    return xp.lib.stride_tricks.as_strided(a, shape=shape, strides=strides)


# -- MatMul / Gemm (cuBLAS) ------------------------------------------------------------------

def matmul(be, ctx, a, b):
    """ONNX MatMul (numpy matmul semantics) on cuBLAS; float16 is computed in float32 as on CPU."""
    xp = be.xp
    if a.dtype == np.float16 or b.dtype == np.float16:
        return xp.matmul(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)
    return xp.matmul(a, b)


def gemm(be, ctx, a, b, c=None, *, alpha, beta, transA, transB):
    """Y = alpha * A' @ B' + beta * C (opset 7+; C unidirectionally broadcast)."""
    xp = be.xp
    A = a.T if transA else a
    B = b.T if transB else b
    y = matmul(be, ctx, A, B)
    if alpha != 1.0:
        y *= y.dtype.type(alpha)
    if c is not None and beta != 0.0:
        y += (c if beta == 1.0 else c * c.dtype.type(beta)).astype(y.dtype, copy=False)
    return y if y.flags.c_contiguous else xp.ascontiguousarray(y)


# -- Conv (implicit GEMM over an im2col view) ----------------------------------------------

def conv_pads(in_sp, k_sp, strides, dilations, pads, auto_pad):
    """Begin and end pads per spatial dim (``auto_pad`` resolved as ONNX says)."""
    nd = len(in_sp)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(nd):
            out = -(-in_sp[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + (k_sp[i] - 1) * dilations[i] + 1 - in_sp[i])
            small, big = total // 2, total - total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else big)
            end.append(big if auto_pad == "SAME_UPPER" else small)
        return begin, end
    if auto_pad == "VALID":
        return [0] * nd, [0] * nd
    pads = list(pads) if pads else [0] * (2 * nd)
    return pads[:nd], pads[nd:]


def conv(be, ctx, x, w, b=None, *, auto_pad, dilations, group, kernel_shape, pads, strides):
    """ONNX Conv (any number of spatial dims, groups, dilations, strides, pads)."""
    xp = be.xp
    N, C = x.shape[:2]
    M = w.shape[0]
    nd = x.ndim - 2
    k_sp = tuple(w.shape[2:])
    strides = list(strides) if strides else [1] * nd
    dilations = list(dilations) if dilations else [1] * nd
    begin, end = conv_pads(x.shape[2:], k_sp, strides, dilations, pads, auto_pad)
    G = int(group)
    Cg, Mg = C // G, M // G
    if any(begin) or any(end):
        xpad = xp.zeros((N, C) + tuple(s + b0 + e0 for s, b0, e0 in zip(x.shape[2:], begin, end)), x.dtype)
        xpad[(slice(None), slice(None)) + tuple(slice(b0, b0 + s) for s, b0 in zip(x.shape[2:], begin))] = x
    else:
        xpad = xp.ascontiguousarray(x)
    sp = xpad.shape[2:]
    out_sp = tuple((sp[i] - (k_sp[i] - 1) * dilations[i] - 1) // strides[i] + 1 for i in range(nd))
    if any(o <= 0 for o in out_sp):
        raise ValueError(f"Conv output would be empty: input {tuple(x.shape)}, kernel {k_sp}")
    P = int(np.prod(out_sp))
    K = int(np.prod(k_sp))
    wm = w.reshape(G, Mg, Cg * K)
    if K == 1 and all(s == 1 for s in strides):  # 1x1 stride 1: a plain GEMM over channels
        cols = xpad.reshape(N, G, Cg, P)
        y = xp.matmul(wm[None], cols)  # (N, G, Mg, P)
    else:
        st = xpad.strides
        view = as_strided(xp, xpad, (N, G, Cg) + out_sp + k_sp,
                          (st[0], Cg * st[1], st[1]) + tuple(st[2 + i] * strides[i] for i in range(nd))
                          + tuple(st[2 + i] * dilations[i] for i in range(nd)))
        # (N, G, Cg, *O, *K) -> (N, G, Cg, *K, *O) -> (N, G, Cg*K, P): the im2col matrix
        perm = (0, 1, 2) + tuple(range(3 + nd, 3 + 2 * nd)) + tuple(range(3, 3 + nd))
        cols = xp.ascontiguousarray(view.transpose(perm)).reshape(N, G, Cg * K, P)
        y = xp.matmul(wm[None], cols)  # batched GEMM: (N, G, Mg, P)
    y = y.reshape((N, M) + out_sp)
    if b is not None:
        y += b.reshape((1, M) + (1,) * nd).astype(y.dtype, copy=False)
    return y


# -- Softmax / LayerNormalization ----------------------------------------------------------

_ROW_KERNELS = r"""
__device__ __forceinline__ float rt_max(float a, float b) { return (b > a || b != b) ? b : a; }
__device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}
__device__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = rt_max(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}
__device__ float block_reduce(float v, float* sh, bool is_max) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    if (wid == 0) {
        float u = (lane < nw) ? sh[lane] : (is_max ? -INFINITY : 0.f);
        u = is_max ? warp_max(u) : warp_sum(u);
        if (lane == 0) sh[0] = u;
    }
    __syncthreads();
    float r = sh[0];
    __syncthreads();
    return r;
}
extern "C" __global__ void rt_softmax_rows(const float* __restrict__ x, float* __restrict__ y,
                                           long long n, int log) {
    __shared__ float sh[32];
    const float* xr = x + (long long)blockIdx.x * n;
    float* yr = y + (long long)blockIdx.x * n;
    float m = -INFINITY;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) m = rt_max(m, xr[i]);
    m = block_reduce(m, sh, true);
    float s = 0.f;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) s += expf(xr[i] - m);
    s = block_reduce(s, sh, false);
    if (log) {
        float ls = logf(s);
        for (long long i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] - m - ls;
    } else {
        float inv = 1.f / s;
        for (long long i = threadIdx.x; i < n; i += blockDim.x) yr[i] = expf(xr[i] - m) * inv;
    }
}
extern "C" __global__ void rt_layernorm_rows(const float* __restrict__ x, const float* __restrict__ g,
                                             const float* __restrict__ b, float* __restrict__ y,
                                             long long n, float eps, int has_b) {
    __shared__ float sh[32];
    const float* xr = x + (long long)blockIdx.x * n;
    float* yr = y + (long long)blockIdx.x * n;
    float s = 0.f;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
    float mean = block_reduce(s, sh, false) / (float)n;
    float q = 0.f;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) { float d = xr[i] - mean; q += d * d; }
    float rstd = rsqrtf(block_reduce(q, sh, false) / (float)n + eps);
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
        float v = (xr[i] - mean) * rstd * g[i];
        yr[i] = has_b ? v + b[i] : v;
    }
}
"""


@functools.lru_cache(maxsize=None)
def _row_module(device_id: int):
    import cupy

    with cupy.cuda.Device(device_id):
        return cupy.RawModule(code=_ROW_KERNELS, options=("--std=c++14",))


def _threads(n: int) -> int:
    return int(min(1024, max(32, 1 << (max(int(n) - 1, 1)).bit_length()))) if n < 256 else 256


def _rows_ok(be, x) -> bool:
    return bool(be.cuda_kernels) and x.dtype == np.float32 and x.size > 0


def softmax_last(be, x, log=False):
    """Softmax (or LogSoftmax) over the last axis of ``x``."""
    xp = be.xp
    if _rows_ok(be, x):
        x = xp.ascontiguousarray(x)
        n = x.shape[-1]
        y = xp.empty_like(x)
        fn = _row_module(be.device_id).get_function("rt_softmax_rows")
        fn((x.size // n,), (_threads(n),), (x, y, np.int64(n), np.int32(bool(log))))
        return y
    m = x.max(axis=-1, keepdims=True)
    d = x - m
    e = xp.exp(d)
    s = e.sum(axis=-1, keepdims=True)
    return d - xp.log(s) if log else e / s


def _softmax_axis(be, x, axis, log):
    if x.ndim == 0:
        raise ValueError("Softmax of a scalar")
    axis = axis + x.ndim if axis < 0 else axis
    if axis == x.ndim - 1:
        return softmax_last(be, x, log)
    return be.xp.moveaxis(softmax_last(be, be.xp.moveaxis(x, axis, -1), log), -1, axis)


def softmax_13(be, ctx, x, *, axis):
    return _softmax_axis(be, x, int(axis), False)


def log_softmax_13(be, ctx, x, *, axis):
    return _softmax_axis(be, x, int(axis), True)


def _coerce_2d(be, x, axis, log):
    axis = axis + x.ndim if axis < 0 else axis
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    return softmax_last(be, x.reshape(rows, -1), log).reshape(x.shape)


def softmax_1(be, ctx, x, *, axis):
    return _coerce_2d(be, x, int(axis), False)


def log_softmax_1(be, ctx, x, *, axis):
    return _coerce_2d(be, x, int(axis), True)


def layer_norm(be, ctx, x, scale, b=None, *, axis, epsilon, stash_type):
    """LayerNormalization-17 (normalizing over dims ``axis..``); float32 rows on a RawKernel."""
    xp = be.xp
    axis = int(axis) + x.ndim if int(axis) < 0 else int(axis)
    wanted = ctx.outputs_wanted if ctx is not None else (True,)
    n = int(np.prod(x.shape[axis:], dtype=np.int64))
    if (_rows_ok(be, x) and not any(wanted[1:]) and scale.dtype == np.float32 and scale.size == n
            and (b is None or (b.dtype == np.float32 and b.size == n)) and int(stash_type) == 1):
        x = xp.ascontiguousarray(x)
        g = xp.ascontiguousarray(scale).reshape(-1)
        bb = xp.ascontiguousarray(b).reshape(-1) if b is not None else g
        y = xp.empty_like(x)
        fn = _row_module(be.device_id).get_function("rt_layernorm_rows")
        fn((x.size // n,), (_threads(n),), (x, g, bb, y, np.int64(n), np.float32(epsilon),
                                             np.int32(b is not None)))
        return (y,) + (None,) * (len(wanted) - 1) if len(wanted) > 1 else y
    cd = np.float32 if int(stash_type) == 1 else np.float64
    xc = x.astype(cd)
    red = tuple(range(axis, x.ndim))
    mean = xc.mean(axis=red, keepdims=True)
    d = xc - mean
    var = (d * d).mean(axis=red, keepdims=True)
    inv = 1.0 / xp.sqrt(var + cd(epsilon))
    y = d * inv * scale.astype(cd)
    if b is not None:
        y = y + b.astype(cd)
    y = y.astype(x.dtype)
    if len(wanted) == 1:
        return y
    return (y, mean.astype(cd) if wanted[1] else None,
            inv.astype(cd) if len(wanted) > 2 and wanted[2] else None)[:len(wanted)]


# -- Erf / Gelu --------------------------------------------------------------------------

def erf_op(be, ctx, x):
    return erf(be.xp, x).astype(x.dtype, copy=False)


def gelu(be, ctx, x, *, approximate="none"):
    """Gelu-20: 0.5 x (1 + erf(x / sqrt 2)), or the tanh approximation."""
    xp = be.xp
    t = x.dtype.type
    if approximate == "tanh":
        inner = t(math.sqrt(2.0 / math.pi)) * (x + t(0.044715) * x * x * x)
        return (t(0.5) * x * (t(1) + xp.tanh(inner))).astype(x.dtype, copy=False)
    return (t(0.5) * x * (t(1) + erf(xp, x * t(1 / math.sqrt(2.0))))).astype(x.dtype, copy=False)


# -- fused elementwise chains --------------------------------------------------------------
#
# op -> (arity, CUDA C expression over {0}, {1} in compute type C, xp evaluation)

def _xp_relu(xp, a):
    return xp.where(a < 0, a.dtype.type(0), a)


def _xp_sigmoid(xp, a):
    one = a.dtype.type(1)
    return one / (one + xp.exp(-a))


FUSIBLE = {
    "Add": (2, "({0} + {1})", lambda xp, a, b: a + b),
    "Sub": (2, "({0} - {1})", lambda xp, a, b: a - b),
    "Mul": (2, "({0} * {1})", lambda xp, a, b: a * b),
    "Div": (2, "({0} / {1})", lambda xp, a, b: a / b),
    "Relu": (1, "({0} < (C)0 ? (C)0 : {0})", _xp_relu),
    "Sigmoid": (1, "((C)1 / ((C)1 + exp(-{0})))", _xp_sigmoid),
    "Tanh": (1, "tanh({0})", lambda xp, a: xp.tanh(a)),
    "Exp": (1, "exp({0})", lambda xp, a: xp.exp(a)),
    "Log": (1, "log({0})", lambda xp, a: xp.log(a)),
    "Sqrt": (1, "sqrt({0})", lambda xp, a: xp.sqrt(a)),
    "Neg": (1, "(-{0})", lambda xp, a: -a),
    "Abs": (1, "fabs({0})", lambda xp, a: xp.abs(a)),
    "Erf": (1, "erf({0})", lambda xp, a: erf(xp, a)),
    "Reciprocal": (1, "((C)1 / {0})", lambda xp, a: a.dtype.type(1) / a),
    "Identity": (1, "{0}", lambda xp, a: a),
}


class FusedProgram:
    """A chain of elementwise nodes as one expression program.

    ``inputs``: external value names in order; ``steps``: ``(op, [operand refs])`` where a
    ref is ``("in", i)`` or ``("t", j)`` (the j-th step's result); the last step is the result.
    """

    def __init__(self, names, inputs, steps, dtype):
        self.names = tuple(names)
        self.inputs = tuple(inputs)
        self.steps = tuple(steps)
        self.dtype = np.dtype(dtype)

    def cuda_source(self) -> tuple[str, str, str]:
        """``(in_params, out_params, operation)`` of the ElementwiseKernel."""
        C = "double" if self.dtype == np.float64 else "float"
        ins = ", ".join(f"{self.dtype.name} x{i}" for i in range(len(self.inputs)))
        body = []
        for j, (op, refs) in enumerate(self.steps):
            args = [f"(({C})x{i})" if k == "in" else f"t{i}" for k, i in refs]
            expr = FUSIBLE[op][1].replace("(C)", f"({C})").format(*args)
            body.append(f"{C} t{j} = {expr};")
        body.append(f"y = ({self.dtype.name}) t{len(self.steps) - 1};")
        return ins, f"{self.dtype.name} y", " ".join(body)

    def evaluate_xp(self, xp, values):
        """The same program with ``xp`` ufuncs (what runs on the stand-in)."""
        ts = []
        for op, refs in self.steps:
            args = [values[i] if k == "in" else ts[i] for k, i in refs]
            ts.append(FUSIBLE[op][2](xp, *args).astype(self.dtype, copy=False))
        return ts[-1]

    def run(self, be, values):
        if be.cuda_kernels:
            return _elementwise_kernel(*self.cuda_source())(*values)
        return self.evaluate_xp(be.xp, values)


@functools.lru_cache(maxsize=256)
def _elementwise_kernel(in_params, out_params, operation):
    import cupy

    name = "rt_fused_" + hashlib.sha1(f"{in_params}|{operation}".encode()).hexdigest()[:12]
    return cupy.ElementwiseKernel(in_params, out_params, operation, name)
