"""Linear: float32 ``a @ w`` (MatMul and Gemm by a 2-D weight), one plan class per algorithm,
the one a node takes for a row count chosen on this machine (``fast/autotune.py``).

* :class:`BlasLinear`: numpy's matmul, i.e. the BLAS library's sgemm (the library call);
* :class:`PackedLinear`: ``_native.linear`` on the weight packed once per node (a constant
  weight; the AVX-512 build);
* :class:`StreamLinear`: ``_native.linear`` packing a weight computed at run time a chunk
  at a time;
* :class:`RowsLinear`: ``_native.gemm_rows`` for a few rows (a classifier head at batch 1-8).

:func:`linear` returns None where no compiled candidate applies (the caller's numpy path).
"""

from __future__ import annotations

import numpy as np

from ..ops._nncommon import _F32, _is_const
from . import autotune
from .packing import pack_linear, shared
from .policy import current
from .sgemm import pooled_matmul

_F32_DT = np.dtype(np.float32)


class LinearPlan:
    """``run(a2, bias, relu=False)``: the [R, N] product of the rows ``a2`` [R, K] (C-contiguous
    float32) with the node's weight (``w`` [K, N], or [N, K] with ``trans``), plus ``bias`` [N]
    or None, then Relu with ``relu``."""

    __slots__ = ("w", "trans", "K", "N", "native", "threads")
    KIND = ""

    def __init__(self, w, trans, native, threads):
        self.w, self.trans, self.native, self.threads = w, bool(trans), native, max(1, int(threads))
        self.N, self.K = w.shape if trans else w.shape[::-1]

    def run(self, a2, bias, relu=False):
        raise NotImplementedError


_INF = float("inf")
_RELU_BOUNDS = (0.0, _INF)


def _clip(relu):
    """``_native.linear``'s clip bounds: Relu's, or none."""
    return _RELU_BOUNDS if relu else ()


class BlasLinear(LinearPlan):
    """numpy's matmul (BLAS sgemm, the weight read transposed in place with ``trans``)."""

    __slots__ = ()
    KIND = "blas"

    def run(self, a2, bias, relu=False):
        # numpy's BLAS is held at one thread (fast/sgemm.hold_blas): its sgemm runs as tiles on
        # the kernel pool where it can (a transposed weight read in place), so this candidate is
        # the library at our thread count
        y = pooled_matmul(self.threads, a2, self.w.T if self.trans else self.w)
        if y is None:
            y = np.matmul(a2, self.w.T if self.trans else self.w)
        if bias is not None:
            y += bias
        if relu:
            np.maximum(y, 0.0, out=y)
        return y


class PackedLinear(LinearPlan):
    """``_native.linear`` on ``packed`` (``pack_linear``: made once per node, shared by the
    node's plans of every row count), bias in its epilogue, on the kernel threads."""

    __slots__ = ("packed",)
    KIND = "packed"

    def __init__(self, w, trans, native, threads, packed):
        super().__init__(w, trans, native, threads)
        self.packed = packed

    def run(self, a2, bias, relu=False):
        R = a2.shape[0]
        y = np.empty((R, self.N), _F32_DT)
        if relu:
            self.native.linear(a2, self.packed, bias, y, (R, self.K, self.N), self.threads, True, 0.0, _INF)
        else:
            self.native.linear(a2, self.packed, bias, y, (R, self.K, self.N), self.threads, True)
        return y


class StreamLinear(LinearPlan):
    """``_native.linear`` on a [K, N] weight computed at run time, packed a chunk at a time."""

    __slots__ = ()
    KIND = "stream"

    def run(self, a2, bias, relu=False):
        R = a2.shape[0]
        y = np.empty((R, self.N), _F32)
        self.native.linear(a2, np.ascontiguousarray(self.w), bias, y, (R, self.K, self.N), self.threads, False,
                           *_clip(relu))
        return y


class RowsLinear(LinearPlan):
    """``_native.gemm_rows``: a few rows, the weight read as stored, split over the columns."""

    __slots__ = ()
    KIND = "rows"

    def run(self, a2, bias, relu=False):
        R = a2.shape[0]
        y = np.empty((R, self.N), _F32)
        self.native.gemm_rows(a2, self.w, y, (R, self.K, self.N), self.trans, self.threads)
        if bias is not None:
            y += bias
        if relu:
            np.maximum(y, 0.0, out=y)
        return y


def linear_weight(ctx, w, trans):
    """``w`` packed for ``_native.linear`` and kept in the node's cache, where w is the
    partition's constant (an initializer: the same array every run, never written); else None
    (a weight computed or fed at run time, or an initializer the caller overrides)."""
    cache = getattr(ctx, "cache", None)
    if cache is None or not _is_const(ctx, 1, w):
        return None
    packed = cache.get("linear")
    if packed is None:
        packed = cache["linear"] = shared(ctx, w, ("linear", bool(trans)), lambda: pack_linear(w, trans))
    return packed


def candidates(ctx, w, trans, R) -> list[str]:
    """The plans that apply to ``R`` rows times this node's float32 weight, "blas" first."""
    p = current()
    nat = p.native
    names = ["blas"]
    if nat is None:
        return names
    const = getattr(ctx, "cache", None) is not None and _is_const(ctx, 1, w)
    if p.linear and const:
        names.append("packed")
    elif p.linear and not trans and not const:
        names.append("stream")
    if R <= p.rows_max and w.flags.c_contiguous:
        names.append("rows")
    return names


def make_plan(ctx, name, w, trans, threads) -> LinearPlan:
    nat = current().native
    if name == "packed":
        return PackedLinear(w, trans, nat, threads, linear_weight(ctx, w, trans))
    cls = {"blas": BlasLinear, "stream": StreamLinear, "rows": RowsLinear}[name]
    return cls(w, trans, nat, threads)


def linear(ctx, a, w, trans=False, bias=None, relu=False):
    """a [..., K] times the weight w ([K, N], or [N, K] with ``trans``), plus ``bias`` [N], then
    Relu with ``relu`` (the compiled kernels' epilogue), on the plan chosen for this node and
    row count; None where only numpy's path applies (another dtype, an empty product, no
    compiled kernels)."""
    cache = getattr(ctx, "cache", None)
    if cache is not None and type(a) is np.ndarray:
        hit = cache.get("linear_hit")
        # the node's last call again (the same weight object and row shape): what that call
        # checked and chose holds, so the plan runs straight (~5 us less Python a call)
        if (hit is not None and hit[0] is w and hit[2] == a.shape and hit[1] == trans and a.dtype is _F32_DT
                and (bias is None or (type(bias) is np.ndarray and bias.dtype is _F32_DT
                                      and bias.flags.c_contiguous))
                and current().native is not None):
            y = hit[3].run(np.ascontiguousarray(a.reshape(hit[4])), bias, relu)
            return y if hit[5] is None else y.reshape(hit[5])
    w0, trans0 = w, trans
    p = current()
    if (p.native is None or type(a) is not np.ndarray or type(w) is not np.ndarray
            or a.dtype != _F32 or w.dtype != _F32 or w.ndim != 2 or a.ndim < 1
            or (bias is not None and (bias.dtype != _F32 or not bias.flags.c_contiguous))):
        return None
    if not trans and not w.flags.c_contiguous and w.T.flags.c_contiguous:
        w, trans = w.T, True  # a Transpose view (a tied weight too large to fold): read in place
    N, K = w.shape if trans else w.shape[::-1]
    if a.shape[-1] != K or a.size == 0 or N == 0:
        return None
    R = a.size // K
    threads = getattr(ctx, "threads", 1)
    plans = {} if cache is None else cache.setdefault("linear_plans", {})
    plan = plans.get(R)
    if plan is None or plan.w is not w:
        plan = choose(ctx, a.reshape(R, K), w, trans, bias, threads)
        if plan is None:
            return None
        plans[R] = plan
    out_shape = None if a.ndim == 2 else a.shape[:-1] + (N,)
    if cache is not None:
        cache["linear_hit"] = (w0, trans0, a.shape, plan, (R, K), out_shape)
    y = plan.run(np.ascontiguousarray(a.reshape(R, K)), bias, relu)
    return y if out_shape is None else y.reshape(out_shape)


def bind_matmul(ctx, w, kernel_fn) -> None:
    """Once per node: ``ctx.cache["bound"]`` (see :func:`~runtime_provider_cpu.executable.binds`)
    for a MatMul by the partition's constant weight ``w`` whose first call took a plan
    (:func:`linear`'s ``linear_hit``): a packed plan's ``_native.linear`` called straight on the
    same row shape, without the kernel's and :func:`linear`'s checks, another plan through
    :func:`linear`'s last-call path; ``kernel_fn(ctx, a, b)`` for anything else.
    None (no binding) otherwise."""
    cache = getattr(ctx, "cache", None)
    if cache is None or "bound" in cache:
        return
    hit = cache.get("linear_hit")
    if hit is None or hit[0] is not w or hit[1] or not _is_const(ctx, 1, w):
        cache["bound"] = None
        return
    shape, plan, rk, out_shape = hit[2], hit[3], hit[4], hit[5]
    if plan.KIND == "packed":
        # the plan's _native.linear call itself on a C-contiguous ``a`` (the kernel reads it as
        # R x K rows and writes R x N: the result made in the output's shape needs no reshape)
        lin, packed, dims, threads = plan.native.linear, plan.packed, (rk[0], plan.K, plan.N), plan.threads
        y_shape = (rk[0], plan.N) if out_shape is None else out_shape

        def bound(ctx, a, b):
            if (b is w and type(a) is np.ndarray and a.shape == shape and a.dtype is _F32_DT and a.flags.c_contiguous
                    and current().native is not None):
                y = np.empty(y_shape, _F32_DT)
                lin(a, packed, None, y, dims, threads, True)
                return y
            return kernel_fn(ctx, a, b)

        cache["bound"] = bound
        return

    def bound(ctx, a, b):
        # linear()'s last-call path (linear_hit) without the kernel's dtype tests before it
        y = linear(ctx, a, b) if b is w else None
        return y if y is not None else kernel_fn(ctx, a, b)

    cache["bound"] = bound


def choose(ctx, a2, w, trans, bias, threads):
    """The plan for ``R`` rows of this node: forced, cached or measured on ``a2`` itself; None
    where it is the library call and the caller's own numpy path does that."""
    names = candidates(ctx, w, trans, a2.shape[0])
    N, K = w.shape if trans else w.shape[::-1]
    key = autotune.cache_key("linear", (a2.shape[0], K, N, int(trans), int("stream" in names)), "float32", threads)
    name = autotune.decide("linear", key, names, "blas", getattr(ctx, "tune", True))
    if name is None:
        a2 = np.ascontiguousarray(a2)
        made = {n: make_plan(ctx, n, w, trans, threads) for n in names}
        name, _ = autotune.measure(key, {n: (lambda pl=pl: pl.run(a2, bias)) for n, pl in made.items()})
    autotune.note(ctx, f"{a2.shape[0]} rows", name)
    cache = getattr(ctx, "cache", None)
    if cache is not None and name != "packed" and "linear" in cache and not any(
            pl.KIND == "packed" for pl in cache.get("linear_plans", {}).values()):
        del cache["linear"]  # measured and lost: the packed copy is not kept
    return make_plan(ctx, name, w, trans, threads)
