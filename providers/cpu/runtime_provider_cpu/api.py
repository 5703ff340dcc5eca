"""The documented, versioned API of runtime-provider-cpu for other distributions.

Everything else in ``runtime_provider_cpu`` is internal and may change in any release.
Other providers (runtime-provider-cuda, runtime-provider-opencl) and runtime-core's
``ops`` table import only from here; runtime-core itself reaches the CPU provider
through the plugin registry (its provider object: ``get_capability`` / ``compile``), not
through this module, except for that table.

Guarantees, for a given :data:`API_VERSION` major version:

* the names in ``__all__`` keep their meaning and signatures; a minor bump only adds;
* kernel functions keep the calling convention of :func:`kernel_for` (below): they take
  ``(ctx, *inputs, **attrs)`` with the attributes resolved by runtime-core against the
  ONNX schema, and return one array, a tuple of arrays (several outputs) or a list
  (a sequence value); kernels of the ``generic`` kind only call numpy functions that
  dispatch on the array type (NEP 13/18), so they also run on other array modules;
* :func:`decline_reason` is the CPU provider's own capability answer, so a provider that
  reuses its kernels declines the same nodes for the same reasons;
* ``CPUExecutable(partition)`` compiles a runtime-core ``Partition`` of nodes the CPU
  provider claims into an object whose ``run(inputs: list) -> list`` computes them on the
  host (inputs and outputs in the partition's order; safe to call from several threads),
  exactly what ``CPUExecutionProvider.compile`` returns.

A dependent distribution declares ``runtime-provider-cpu`` with a version range in its
``pyproject.toml`` and may check ``API_VERSION`` at import time.

Versions:

1.0: :data:`API_VERSION`, :class:`KernelContext`, :func:`decline_reason`,
:func:`kernel_for`, :func:`supported_ops`, :class:`CPUExecutable`.
1.1: :func:`gemm_benchmark`.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from .executable import CPUExecutable
from .plugin import decline_reason
from .registry import REGISTRY, KernelContext

API_VERSION = "1.2"
"""This module's API version: major for incompatible changes, minor for additions."""

__all__ = ["API_VERSION", "CPUExecutable", "KernelContext", "Kernel", "amx_int8_state", "decline_reason",
           "gemm_benchmark", "kernel_for", "supported_ops"]


class Kernel(NamedTuple):
    """One registered CPU kernel.

    ``fn(ctx, *inputs, **attrs)`` computes the node (``ctx`` a :class:`KernelContext`);
    ``control`` is True for kernels with subgraphs (If, Loop, Scan, ...), which also need
    ``ctx.subgraphs`` and an ``outer=`` keyword and are not meant to be called from outside
    a :class:`CPUExecutable`; ``dtypes`` is the set of first-input dtype names it accepts
    (``None``: per schema).
    """

    fn: Callable[..., Any]
    control: bool
    dtypes: frozenset | None


def kernel_for(domain: str, op_type: str, since_version: int | None) -> Kernel | None:
    """The CPU kernel of ``domain::op_type`` at exactly that ONNX schema ``since_version``
    (``None``: the newest, for ops without a schema), or ``None`` when there is none.
    Whether a particular node (attributes, dtypes) is supported is :func:`decline_reason`'s
    answer, not this one's."""
    spec = REGISTRY.lookup(domain, op_type, since_version)
    return None if spec is None else Kernel(spec.fn, spec.control, spec.dtypes)


def supported_ops() -> list[tuple[str, str, list[int], frozenset | None]]:
    """Every registered op as ``(domain, op_type, schema since-versions, dtypes of the newest
    version's first input or None)``, sorted."""
    out = []
    for domain, op, versions in REGISTRY.ops():
        spec = REGISTRY.lookup(domain, op, versions[-1])
        out.append((domain, op, versions, None if spec is None else spec.dtypes))
    return out


def gemm_benchmark(sizes: list[tuple[int, int, int]], threads: int = 1, repeats: int = 5) -> dict:
    """float32 GEMM rates on this machine for each ``(M, K, N)`` of ``sizes`` on ``threads``
    threads: numpy's matmul (its BLAS held at ``threads``) and the provider's own packed
    kernel where it is built, against the measured FMA peak. Returns ``{"cpu", "isa",
    "threads", "blas": [threadpoolctl's BLAS entries: internal_api, version, architecture,
    ...], "peak": {"flops", "flops_wall", "lanes", "mhz", "fma_per_cycle"}, "rows": [{"size",
    "numpy", "ours", "ours_cold", "peak"}]}``, each rate ``{"gflops_wall", "gflops_cpu", "seconds"}``
    (``ours_cold``, added in API 1.2: ours on copies of the packed weight taken in turn, its
    weights past L2 as in a model; ``ours`` and ``ours_cold`` None where not built; a row's
    ``peak``, added in API 1.2: the higher of the peak readings taken just before and just after
    ours (and ours_cold) of that size (the peak moves between readings), the top-level ``peak``
    the highest;
    ``gflops_cpu`` by the process's CPU time over the threads; the peak's ``flops`` by each
    thread's CPU time, ``flops_wall`` by the wall clock of the threads started together)."""
    from .fast.peak import gemm_rates

    return gemm_rates([tuple(int(d) for d in s) for s in sizes], int(threads), int(repeats))


def amx_int8_state() -> str:
    """Whether the int8 kernels run on AMX tiles here: ``"granted"``, or why not (the CPU has
    no AMX int8, the OS refused the tile state, the compiled kernels are not built). Added in
    API 1.2."""
    try:
        from . import _native  # type: ignore[attr-defined]  # the C extension, where built
    except ImportError:
        return "the CPU provider's compiled kernels are not built"
    return getattr(_native, "AMX_INT8", "not in this build")
