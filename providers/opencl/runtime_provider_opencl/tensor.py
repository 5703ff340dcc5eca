"""Device tensors: an OpenCL buffer with a shape and a dtype.

Tensors are contiguous (C order) and never written by kernels after the kernel that
produced them, so metadata-only views (Reshape, Flatten, Squeeze, Unsqueeze, Identity)
share the buffer. Only a caller writes into a tensor it holds (``OrtValue.update_inplace``,
a preallocated ``IOBinding`` output), through :meth:`OpenCLTensor.copy_from`; an
executable never hands out buffers it keeps (its constants are cloned first). A tensor is deliberately not array-like: host code must go through
``copy_to_host`` (or :meth:`OpenCLTensor.numpy`), so a missing copy fails loudly.
"""

from __future__ import annotations

import numpy as np

from .shapes import nbytes_of, size_of


class OpenCLTensor:
    """Memory on an OpenCL device: ``buffer`` (a ``pyopencl.Buffer``, ``None`` when empty),
    ``shape``, ``dtype`` and the :class:`~runtime_provider_opencl.device.DeviceContext`
    that owns it."""

    __slots__ = ("buffer", "shape", "dtype", "device", "host")
    device_type = "opencl"  # the provider's device_type: what holds this tensor

    def __init__(self, buffer, shape, dtype, device, host=None):
        self.buffer = buffer
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.device = device
        # a private host copy of a small integer tensor (a shape, an index list) made when it
        # was uploaded, so that an executable can read the value without a download
        self.host = host

    def host_value(self) -> np.ndarray:
        """The tensor's value on the host: the mirror when there is one, else a download."""
        if self.host is not None:
            return self.host
        return self.numpy()

    @property
    def size(self) -> int:
        return size_of(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def view(self, shape) -> "OpenCLTensor":
        """The same buffer with another shape of the same element count (no copy)."""
        shape = tuple(int(d) for d in shape)
        if size_of(shape) != self.size:
            raise ValueError(f"cannot view a tensor of shape {self.shape} as {shape}")
        return OpenCLTensor(self.buffer, shape, self.dtype, self.device)

    @classmethod
    def from_numpy(cls, array, device, mirror: bool = False) -> "OpenCLTensor":
        """Upload a host array (made C-contiguous first) to ``device``."""
        arr = np.asarray(array)
        if arr.dtype.kind in "OUSV" or arr.dtype.hasobject:
            raise TypeError(f"an array of dtype {arr.dtype} cannot live on an OpenCL device")
        if not arr.dtype.isnative:
            arr = arr.astype(arr.dtype.newbyteorder("="))
        if not arr.flags.c_contiguous:
            arr = arr.copy(order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
        host = None
        if mirror:
            host = arr.copy()
            host.flags.writeable = False
        if arr.size == 0:
            return cls(None, arr.shape, arr.dtype, device, host)
        return cls(device.buffer(arr.nbytes, hostbuf=arr), arr.shape, arr.dtype, device, host)

    @classmethod
    def empty(cls, shape, dtype, device) -> "OpenCLTensor":
        """An uninitialised tensor on ``device``."""
        shape = tuple(int(d) for d in shape)
        dtype = np.dtype(dtype)
        n = nbytes_of(shape, dtype)
        return cls(device.buffer(n) if n else None, shape, dtype, device)

    def copy_from(self, src) -> None:
        """Overwrite this tensor's buffer with ``src``: a host array (uploaded) or an
        :class:`OpenCLTensor` on the same device (copied on the device). Shapes may
        differ only by a reshape; dtypes must match."""
        if isinstance(src, OpenCLTensor):
            if src.dtype != self.dtype or src.size != self.size:
                raise ValueError(f"cannot copy {src} into {self}: dtype and element count must match")
            if src.device is not self.device:
                src = src.numpy()  # another context: through the host
            else:
                if self.nbytes and src.buffer is not self.buffer:
                    self.device.copy(self.buffer, src.buffer, self.nbytes)
                return
        arr = np.asarray(src)
        if arr.dtype != self.dtype or arr.size != self.size:
            raise ValueError(f"cannot write a {arr.dtype} array of shape {arr.shape} into {self}: "
                             "dtype and element count must match")
        if not arr.dtype.isnative:
            arr = arr.astype(arr.dtype.newbyteorder("="))
        arr = np.ascontiguousarray(arr)
        if self.nbytes:
            self.device.write(self.buffer, arr)

    def clone(self) -> "OpenCLTensor":
        """A new buffer with the same contents (copied on the device)."""
        out = OpenCLTensor.empty(self.shape, self.dtype, self.device)
        if self.nbytes:
            self.device.copy(out.buffer, self.buffer, self.nbytes)
        out.host = self.host
        return out

    def numpy(self) -> np.ndarray:
        """Copy to a new host array (blocks until the kernels that write it have run)."""
        out = np.empty(self.shape, self.dtype)
        if out.size:
            self.device.read(out, self.buffer)
        return out

    def __repr__(self) -> str:
        return (f"OpenCLTensor(shape={self.shape}, dtype={self.dtype.name}, "
                f"device={self.device.info.device_name!r})")
