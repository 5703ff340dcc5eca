"""SciPy's sgemm for the compiled kernels that call it a block at a time on the kernel
threads (``_native.pointwise``, ``_native.mha``), that BLAS library held at one thread."""

from __future__ import annotations

import logging

from .policy import current

_SGEMM: list = []  # [controller of the library or None], once decided
#: why SciPy's sgemm is not used by the compiled kernels ("" while it is, or before deciding)
SGEMM_REASON = ""
_log = logging.getLogger("runtime_provider_cpu")


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

            from scipy.linalg import cython_blas
            from threadpoolctl import ThreadpoolController

            path = nat.set_sgemm(cython_blas.__pyx_capi__["sgemm"])
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
