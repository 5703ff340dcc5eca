"""SciPy's sgemm for the compiled kernels that call it a block at a time on the kernel
threads (``_native.pointwise``, ``_native.mha``), that BLAS library held at one thread."""

from __future__ import annotations

import logging

from .policy import current

_SGEMM: list = []  # [controller of the library or None], once decided
_CYTHON_BLAS: list = []  # [SciPy's cython_blas module], loaded alone (see cython_blas)
#: why SciPy's sgemm is not used by the compiled kernels ("" while it is, or before deciding)
SGEMM_REASON = ""
_log = logging.getLogger("runtime_provider_cpu")


def cython_blas():
    """SciPy's ``scipy.linalg.cython_blas`` (its BLAS function capsules), loaded without
    ``scipy.linalg``'s package import: that loads LAPACK wrappers and their libraries too, about
    14 MiB more resident for nothing the kernels call. The module is the one ``from scipy.linalg
    import cython_blas`` gives later (the extension is initialized once per process); where
    its file is not found, that import. Raises ImportError without SciPy."""
    import importlib.machinery
    import importlib.util
    import os
    import sys

    mod = sys.modules.get("scipy.linalg.cython_blas") or (_CYTHON_BLAS[0] if _CYTHON_BLAS else None)
    if mod is not None:
        return mod
    spec = importlib.util.find_spec("scipy")  # the top package only: no scipy.linalg import
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, "linalg", "cython_blas" + suffix)
            if os.path.isfile(path):
                sub = importlib.util.spec_from_file_location("scipy.linalg.cython_blas", path)
                if sub is None or sub.loader is None:
                    break
                mod = importlib.util.module_from_spec(sub)
                sub.loader.exec_module(mod)
                _CYTHON_BLAS.append(mod)
                return mod
    from scipy.linalg import cython_blas as mod

    return mod


def sgemm_control():
    """The threadpoolctl controller of the BLAS library whose sgemm ``_native.pointwise``
    calls (SciPy's, taken from ``scipy.linalg.cython_blas``), or None where that is not to
    be had: then pointwise convolutions stay on numpy's matmul. Decided once."""
    global SGEMM_REASON
    if not _SGEMM:
        ctl = None
        nat = current().native
        try:
            import os

            from threadpoolctl import ThreadpoolController

            path = nat.set_sgemm(cython_blas().__pyx_capi__["sgemm"])
            if path:
                real = os.path.realpath(path)
                for lib in ThreadpoolController().lib_controllers:
                    if os.path.realpath(lib.filepath) == real:
                        ctl = lib
        except Exception as exc:  # no SciPy BLAS capsule, or a library threadpoolctl does not know
            ctl = None
            SGEMM_REASON = f"SciPy's sgemm is not usable ({type(exc).__name__}: {exc}); numpy's matmul instead"
            _log.warning("CPU provider: %s", SGEMM_REASON)
        else:
            if ctl is None:
                SGEMM_REASON = "threadpoolctl does not control SciPy's BLAS; numpy's matmul instead"
                _log.info("CPU provider: %s", SGEMM_REASON)
        _SGEMM.append(ctl)
    return _SGEMM[0]


def sgemm_ready():
    """Whether SciPy's sgemm is there for the compiled kernels that call it on the kernel
    threads, that library then set to one thread (a session of other intra_op_num_threads
    sets every BLAS library it finds); the policy's ``sgemm`` False: never."""
    p = current()
    if not p.sgemm or p.native is None:
        return False
    ctl = sgemm_control()
    if ctl is None:
        return False
    if ctl.get_num_threads() != 1:
        ctl.set_num_threads(1)
    return True


_BLAS: list = []  # [the thread count numpy's BLAS was set to], once decided

#: ops whose CPU kernels never call a matrix product (BLAS or SciPy's sgemm): a partition made
#: only of these (a tree ensemble with its casts) has no BLAS threads to hold, and deciding would
#: import SciPy's BLAS (about 14 MiB resident) for nothing
BLAS_FREE_OPS = frozenset({
    ("ai.onnx.ml", "TreeEnsembleClassifier"), ("ai.onnx.ml", "TreeEnsembleRegressor"),
    ("ai.onnx.ml", "TreeEnsemble"), ("ai.onnx.ml", "ZipMap"), ("ai.onnx.ml", "LabelEncoder"),
    ("ai.onnx.ml", "Normalizer"), ("ai.onnx.ml", "Scaler"), ("ai.onnx.ml", "ArrayFeatureExtractor"),
    *(("", op) for op in ("Identity", "Cast", "CastLike", "Add", "Sub", "Mul", "Div", "Neg", "Abs",
                          "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Concat", "Slice", "Gather",
                          "Transpose", "ArgMax", "ArgMin", "Softmax", "Sigmoid", "Exp", "Log", "Where",
                          "Equal", "Greater", "Less", "Shape", "Constant")),
})


def uses_blas(ops) -> bool:
    """Whether a partition of these ``(domain, op_type)`` may reach a matrix product."""
    return any(op not in BLAS_FREE_OPS for op in ops)


def hold_blas(threads: int) -> None:
    """Set the BLAS libraries' own threads for the process, once, when a CPU partition
    compiles: one thread where SciPy's sgemm runs large float32 GEMMs as tiles on the kernel
    pool (:func:`pooled_matmul`), so that BLAS's threads, which split a call statically and spin
    between calls, never compete with the pool or with concurrent runs; else (no extension, no
    SciPy sgemm) ``threads``, BLAS's threads being the only parallel GEMM there is."""
    if _BLAS:
        return
    n = 1 if sgemm_ready() else max(1, int(threads))
    _BLAS.append(n)
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=n, user_api="blas")
    except Exception as exc:  # threadpoolctl missing or the BLAS unknown to it: said once
        _log.warning("CPU provider: could not set the BLAS threads to %d: %s", n, exc)


def pooled_matmul(threads: int, a, b):
    """``a @ b`` for float32 ``a`` [..., K] and 2-D ``b`` [K, N] as tiles of single-threaded
    sgemm on the kernel pool (``_native.sgemm``: a stopped run ends within one tile), or None
    where that is not the path: another dtype or layout, a product under the policy's
    ``blas_min_macs``, or no SciPy sgemm. A ``b`` that is the transpose of a C-contiguous
    array (a tied weight's ``Transpose`` view) is read in place, not copied."""
    import numpy as np

    if (type(a) is not np.ndarray or type(b) is not np.ndarray or a.dtype != np.float32
            or b.dtype != np.float32 or a.ndim < 2 or b.ndim != 2 or a.shape[-1] != b.shape[0]):
        return None
    K, N = b.shape
    M = a.size // K if K else 0
    p = current()
    if M == 0 or N == 0 or K == 0 or M * K * N < p.blas_min_macs or max(M, K, N) >= 1 << 31:
        return None
    if not sgemm_ready():
        return None
    a2 = np.ascontiguousarray(a.reshape(M, K))
    y = np.empty((M, N), np.float32)
    if not b.flags.c_contiguous and b.T.flags.c_contiguous:
        p.native.sgemm(a2, b.T, y, (M, K, N), int(threads), True)
    else:
        p.native.sgemm(a2, np.ascontiguousarray(b), y, (M, K, N), int(threads))
    return y.reshape(*a.shape[:-1], N)
