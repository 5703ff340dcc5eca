"""The CPU "memory arena": keep freed memory in the process for the next run.

numpy gets every array of more than a few hundred kilobytes from ``malloc``, and glibc
serves such requests with a fresh ``mmap`` (its dynamic threshold starts at 128 KiB) and
gives them back with ``munmap``, or trims the top of the heap, when they are freed. Every
intermediate of every run is therefore new memory, and the first write to each of its pages
is a page fault: on a virtual machine that costs microseconds per 4 KiB page, which for a
CNN is as much time as the arithmetic (a 1.6 MB activation is 400 faults).

onnxruntime avoids this with its own arena allocator (``SessionOptions.enable_cpu_mem_arena``,
on by default). numpy's allocations cannot be routed into an arena from Python, so this
does the equivalent with glibc's own knobs: ``M_MMAP_THRESHOLD`` at its maximum (32 MiB on
64-bit) so such blocks come from the heap, and ``M_TRIM_THRESHOLD`` at 1 GiB so freed heap
memory stays for reuse. Like onnxruntime's arena, memory a run frees is kept by the process
(its resident size stays near its peak) rather than returned to the system; the peak itself
does not grow. The setting is process-wide and cannot be undone: it is applied once, by the
first CPU partition compiled for a session with ``enable_cpu_mem_arena`` on (the default),
and only where the C library is glibc. ``enable_cpu_mem_arena = False`` in every session
(or ``RUNTIME_CORE_CPU_ARENA=0``) leaves ``malloc`` as it is.

What is kept is what the runs reuse; memory freed by one-off work is not: :func:`release`
gives it back (``malloc_trim``) after a kernel choice was measured (``fast/autotune.py``: every
candidate's trial results and scratch, freed, would otherwise stay resident for good and
fragment the heap the runs draw from).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading
from typing import Any

logger = logging.getLogger("runtime_provider_cpu.arena")

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's maximum for 64-bit
TRIM_THRESHOLD = 1024 * 1024 * 1024

_LOCK = threading.Lock()
_state: dict[str, Any] = {"applied": None}  # None: not tried; True: applied; False: not possible here


def _glibc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        version = libc.gnu_get_libc_version
    except (OSError, AttributeError):
        return None
    version.restype = ctypes.c_char_p
    return libc


def enable() -> bool:
    """Apply the arena setting (once per process). True when ``malloc`` keeps freed memory."""
    if _state["applied"] is not None:
        return bool(_state["applied"])
    with _LOCK:
        if _state["applied"] is not None:
            return bool(_state["applied"])
        if os.environ.get("RUNTIME_CORE_CPU_ARENA", "1") == "0":
            _state["applied"] = False
            return False
        libc = _glibc()
        ok = False
        if libc is not None:
            try:
                ok = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
                    libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
            except Exception as exc:  # noqa: BLE001 - a C library without mallopt
                logger.debug("mallopt failed: %s", exc)
                ok = False
        if not ok:
            logger.debug("CPU memory arena: not available here (needs glibc's mallopt)")
        _state["applied"] = ok
        return ok


def release() -> bool:
    """Give the memory ``malloc`` holds free back to the system (glibc's ``malloc_trim(0)``:
    the heap's top and its free pages, in every thread's arena), where the arena setting is in
    effect; for one-off work whose freed buffers the runs would not reuse. True when it ran."""
    if not _state["applied"]:
        return False
    libc = _state.get("libc") or _glibc()
    if libc is None:
        return False
    _state["libc"] = libc
    try:
        libc.malloc_trim(0)
    except Exception as exc:  # noqa: BLE001 - a glibc without malloc_trim: nothing to give back
        logger.debug("malloc_trim failed: %s", exc)
        return False
    return True


def enabled() -> bool:
    """Whether the setting is in effect in this process."""
    return bool(_state["applied"])
