"""The device back end of a provider instance: cupy on one device, one stream.

A back end has the array module ``xp`` and moves data: ``to_device`` /
``to_host`` / ``empty``, ``activate()`` (a context manager entering the device,
the session's stream and its memory pool) and ``synchronize()``. Kernels are
written against ``xp`` only, so :class:`~runtime_provider_cuda.standin.StandInBackend`
runs the same code without a GPU.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np


class CupyBackend:
    """cupy on device ``device_id``; a stream created on first use, shared by every
    executable and copy of the provider instance (one per session)."""

    name = "cupy"
    cuda_kernels = True

    def __init__(self, device_id: int = 0, memory_limit: int | None = None):
        import cupy

        self.xp = cupy
        self.device_id = int(device_id)
        self.device = cupy.cuda.Device(self.device_id)
        self.memory_limit = memory_limit
        self.pool = None
        if memory_limit:
            with self.device:
                self.pool = cupy.cuda.MemoryPool()
                self.pool.set_limit(size=int(memory_limit))
        self._stream = None
        self._lock = threading.Lock()
        self.transfers = {"to_device": 0, "to_host": 0}

    @property
    def stream(self):
        """The session's stream (non-blocking, created at first compile or copy)."""
        if self._stream is None:
            with self._lock:
                if self._stream is None:
                    with self.device:
                        self._stream = self.xp.cuda.Stream(non_blocking=True)
        return self._stream

    @contextlib.contextmanager
    def activate(self):
        """Enter the device, the session stream and (with a memory limit) its pool."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(self.device)
            stack.enter_context(self.stream)
            if self.pool is not None:
                stack.enter_context(self.xp.cuda.using_allocator(self.pool.malloc))
            yield

    def is_device(self, a) -> bool:
        return isinstance(a, self.xp.ndarray)

    def to_device(self, host):
        if isinstance(host, self.xp.ndarray):
            if host.device.id == self.device_id:
                return host
            with self.activate():
                return host.copy()  # peer copy onto this device
        arr = np.ascontiguousarray(host)
        with self.activate():
            out = self.xp.empty(arr.shape, arr.dtype)
            out.set(arr, stream=self.stream)
        self.transfers["to_device"] += 1
        return out

    def to_host(self, dev):
        if not isinstance(dev, self.xp.ndarray):
            raise TypeError(f"copy_to_host got {type(dev).__name__}, not a cupy array")
        with self.activate():
            # a host copy waits for every kernel queued before it on the session stream
            out = dev.get(stream=self.stream)
            self.stream.synchronize()
        self.transfers["to_host"] += 1
        return out

    def empty(self, shape, dtype):
        with self.activate():
            return self.xp.empty(tuple(shape), np.dtype(dtype))

    def synchronize(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()
