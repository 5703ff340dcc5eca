"""The tuning policy of the CPU provider's fast paths: one frozen object, no module globals.

Every threshold and switch the fast paths consult lives in :class:`Policy`; the kernels read
the installed one (:func:`current`) when they decide, so a test (or a caller comparing paths)
installs another with :func:`installed` instead of patching modules. The thresholds' history
and measurements: ``providers/cpu/docs/performance.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, Iterator

try:  # the compiled kernels, built with the wheel; without them the numpy paths run
    from .. import _native as NATIVE  # type: ignore[attr-defined]  # the C extension
except ImportError as exc:  # pragma: no cover - only a build without a C compiler
    NATIVE = None
    NATIVE_ERROR: str | None = f"{type(exc).__name__}: {exc}"
else:
    NATIVE_ERROR = None

_FAST = NATIVE is not None and bool(getattr(NATIVE, "CONV_FAST", 0))  # the AVX-512 build


@dataclass(frozen=True)
class Policy:
    """Which fast paths the CPU kernels take, and from what sizes."""

    #: the compiled kernels (``runtime_provider_cpu._native``), or None: the numpy paths only
    native: Any = NATIVE
    #: float32 MatMul / Gemm by a constant weight on ``_native.linear`` (the AVX-512 build)
    linear: bool = _FAST
    #: ... from this many multiply-adds
    linear_min_macs: int = 1 << 18
    #: Gemm products of fewer multiply-adds skip BLAS (its woken threads spin past the call)
    blas_min_macs: int = 1 << 19
    #: float32 Gemms of at most this many rows of A take ``_native.gemm_rows``
    rows_max: int = 8
    #: the compiled kernels call SciPy's sgemm where it is found (False: numpy's matmul)
    sgemm: bool = True
    #: depthwise convolutions of at most this many output pixels a channel: one einsum
    dw_einsum_max_pixels: int = 1600
    #: a strided im2col splits the input into phases from this many taps a phase
    phase_taps: int = 4
    #: the compiled direct convolution (``_native.conv2d``; elsewhere im2col and BLAS win)
    direct: bool = _FAST
    #: ... for dense convolutions of at least this many terms a sum (C * KH * KW)
    direct_min_k: int = 16
    #: the direct kernel with the output channels in the vector lanes: outputs at most this wide
    lanes_max_ow: int = 32
    #: ... with at least this many terms a sum
    lanes_min_k: int = 256
    #: Winograd F(2x2, 3x3) for 3x3 stride-1 convolutions at least this wide ...
    wino_min_ow: int = 24
    #: ... with at least this many input channels
    wino_min_c: int = 32
    #: Winograd with the output channels in the lanes for widths in this closed range ...
    wino_lanes_ow: tuple = (10, 16)
    #: ... with at least this many input channels
    wino_lanes_min_c: int = 128
    #: 1x1 convolutions on ``_native.pointwise_lanes`` (needs ``linear``)
    pw_lanes: bool = True
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
