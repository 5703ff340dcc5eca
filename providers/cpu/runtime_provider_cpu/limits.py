"""The tensor-size cap: kernels whose output size comes from input *values* check it first.

A shape feed such as ``Expand(x, [2**20, 2**20])`` or ``ConstantOfShape([3e8])`` must not be
allowed to ask the system for terabytes (Linux overcommits, so the allocation may "succeed"
and the process dies on first touch). :func:`check_alloc` raises ``MemoryError`` with the
shape, the bytes and the cap before anything is allocated; the core turns it into its typed
out-of-memory error.

The cap is the session's: its config entry ``session.max_tensor_bytes`` reaches each kernel as
``KernelContext.max_tensor_bytes`` (plugin API 1.3 ``Partition.max_tensor_bytes``); where it
is 0 (not said), ``$RUNTIME_CORE_MAX_TENSOR_BYTES`` or ``max(physical memory / 2, 1 GiB)``.
"""

from __future__ import annotations

import os

ENV = "RUNTIME_CORE_MAX_TENSOR_BYTES"


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: assume a small machine
        return 8 << 30


def default_max_tensor_bytes() -> int:
    """``$RUNTIME_CORE_MAX_TENSOR_BYTES`` if set (an int), else half the physical memory (>= 1 GiB)."""
    env = os.environ.get(ENV, "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(_physical_memory() // 2, 1 << 30)


_DEFAULT = default_max_tensor_bytes()


def check_alloc(ctx, what: str, shape, itemsize: int) -> tuple[int, ...]:
    """``shape`` as a tuple of ints when a tensor of it fits under the cap, else ``MemoryError``
    (``ValueError`` for a negative dimension). Sizes are Python ints: no overflow."""
    dims = tuple(int(d) for d in shape)
    n = 1
    for d in dims:
        if d < 0:
            raise ValueError(f"{what}: negative dimension in shape {list(dims)}")
        n *= d
    nbytes = n * int(itemsize)
    cap = getattr(ctx, "max_tensor_bytes", 0) or _DEFAULT
    if nbytes > cap:
        raise MemoryError(f"{what}: a tensor of shape {list(dims)} needs {nbytes} bytes, more than the "
                          f"tensor size cap of {cap} bytes (session config entry 'session.max_tensor_bytes' "
                          f"or ${ENV})")
    return dims
