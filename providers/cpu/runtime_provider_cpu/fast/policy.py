"""The tuning policy of the CPU provider's fast paths: one frozen object, no module globals.

Every threshold and switch the fast paths consult lives in :class:`Policy`; the kernels read
the installed one (:func:`current`) when they decide, so a test (or a caller comparing paths)
installs another with :func:`installed` instead of patching modules. Which algorithm a node
takes where a compiled one competes with a library call is not a threshold here: it is
measured on the machine (``fast/autotune.py``); the fields below say which candidates exist
and in which layout, or force one. The thresholds' history: ``providers/cpu/docs/performance.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Iterator

#: ``RUNTIME_CORE_CPU_NATIVE=0``: behave as a build without the compiled kernels (the numpy
#: paths everywhere), as on a platform where ``_native`` cannot be built; CI runs the model
#: tests so (``nox -s nonative``)
NATIVE_ENV = "RUNTIME_CORE_CPU_NATIVE"
NATIVE: Any
NATIVE_ERROR: str | None
if os.environ.get(NATIVE_ENV, "") == "0":
    NATIVE, NATIVE_ERROR = None, f"disabled by {NATIVE_ENV}=0"
else:
    try:  # the compiled kernels, built with the wheel where a C compiler is found
        from .. import _native as NATIVE  # type: ignore[attr-defined, no-redef]  # the C extension
    except ImportError as exc:  # a build without a C compiler (the extension is optional)
        NATIVE, NATIVE_ERROR = None, f"{type(exc).__name__}: {exc}"
    else:
        NATIVE_ERROR = None

_FAST = NATIVE is not None and bool(getattr(NATIVE, "CONV_FAST", 0))  # the AVX-512 build
# the Linear's register tiles run as AVX-512 or AVX2 + FMA code here (not the baseline x86-64's)
_LINEAR = _FAST or (NATIVE is not None and getattr(NATIVE, "LINEAR_TILES", "") == "avx2")


@dataclass(frozen=True)
class Policy:
    """Which fast paths the CPU kernels take, and from what sizes."""

    #: the compiled kernels (``runtime_provider_cpu._native``), or None: the numpy paths only
    native: Any = NATIVE
    #: where a compiled path competes with a library call, measure the candidates on this
    #: machine and keep the faster (``fast/autotune.py``); False: the library call (as a
    #: session's ``session.cpu.autotune`` = "0")
    tune: bool = True
    #: force one candidate wherever it applies ("": chosen as above; "a,b": the first of them
    #: that applies; elsewhere the library call): Linear "blas", "packed", "stream" or "rows"
    #: (``fast/linear.py``) ...
    linear_kernel: str = ""
    #: ... Conv "im2col", "im2col_sgemm", "winograd", "direct", "pointwise", "pointwise_rows",
    #: "depthwise" or "depthwise_lanes" (``fast/conv.py``) ...
    conv_kernel: str = ""
    #: ... Attention's heads "numpy", "native" (sgemm calls) or "tiles" (the Linear's tiles) (``ops/fused.py``)
    mha_kernel: str = ""
    #: ... MatMulNBits "dequant" (a float copy of the weight, BLAS) or "native" (``_native.nbits_matmul``
    #: on the 4-bit codes; ``ops/quant_contrib.py``)
    nbits_kernel: str = ""
    #: ... a pair of steps (``fast/pairs.py``'s ``expand_dw``) "fused" (one call) or "apart" (the two
    #: steps); with tuning off: fused
    pair_kernel: str = ""
    #: ... the dynamic-int8 matmuls (``ops/quant_dyn.py``) "vnni" (``_native.dqmm``'s VNNI tile) or
    #: "amx" (its AMX tiles, where the OS grants them: ``_native.AMX_INT8``)
    dqmm_kernel: str = ""
    #: float32 MatMul / Gemm by a constant weight: ``_native.linear`` is a candidate (on an AVX-512 or
    #: an AVX2 + FMA CPU, ``_native.LINEAR_TILES``)
    linear: bool = _LINEAR
    #: Gemm products of fewer multiply-adds skip BLAS (its woken threads spin past the call)
    blas_min_macs: int = 1 << 19
    #: products of at most this many rows: ``_native.gemm_rows`` is a candidate
    rows_max: int = 8
    #: the compiled kernels call SciPy's sgemm where it is found (False: numpy's matmul)
    sgemm: bool = True
    #: depthwise convolutions of at most this many output pixels a channel: one einsum
    dw_einsum_max_pixels: int = 1600
    #: a strided im2col splits the input into phases from this many taps a phase
    phase_taps: int = 4
    #: the compiled direct convolution and Winograd are candidates (the AVX-512 build; the
    #: portable clones keep their accumulators in memory)
    direct: bool = _FAST
    #: the direct kernel with the output channels in the vector lanes (a layout, not an
    #: algorithm): outputs at most this wide ...
    lanes_max_ow: int = 32
    #: ... with at least this many terms a sum
    lanes_min_k: int = 256
    #: Winograd F(2x2, 3x3) in the wide layout for outputs at least this wide ...
    wino_min_ow: int = 1
    #: ... with at least this many input channels
    wino_min_c: int = 1
    #: Winograd with the output channels in the lanes for widths in this closed range ...
    wino_lanes_ow: tuple = (10, 16)
    #: ... with at least this many input channels (the lanes layout wins where both apply)
    wino_lanes_min_c: int = 128
    #: 1x1 convolutions on ``_native.pointwise_lanes`` (needs ``linear``; taken unmeasured, so on
    #: AVX-512 CPUs only: its AVX2 tiles are measured on the Linear alone)
    pw_lanes: bool = _FAST
    #: pair fusions (see ``fast/pairs.py``): expansion + depthwise, stem + MaxPool, shortcut
    expand_dw: bool = True
    conv_maxpool: bool = True
    conv_shortcut: bool = True

    def replace(self, **changes) -> Policy:
        """This policy with ``changes`` (field names as above)."""
        return dataclasses.replace(self, **changes)


DEFAULT = Policy()
_CURRENT = [DEFAULT]


def current() -> Policy:
    """The installed policy (the default: :data:`DEFAULT`, chosen from this build)."""
    return _CURRENT[0]


def install(policy: Policy) -> Policy:
    """Install ``policy`` for the whole process; return the one it replaces. Plans already
    made keep what they decided (a plan is made on a node's first run)."""
    if not isinstance(policy, Policy):
        raise TypeError(f"install() takes a Policy, got {type(policy).__name__}")
    previous, _CURRENT[0] = _CURRENT[0], policy
    return previous


@contextlib.contextmanager
def installed(policy: Policy | None = None, **changes) -> Iterator[Policy]:
    """``with installed(policy, **changes):`` runs the block under ``policy`` (default: the
    current one) with ``changes``, and puts the previous one back after it."""
    p = (current() if policy is None else policy).replace(**changes)
    previous = install(p)
    try:
        yield p
    finally:
        install(previous)
