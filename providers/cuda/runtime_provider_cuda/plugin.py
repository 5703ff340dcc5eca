"""The CUDA execution provider and its plugin hook.

Importing this module is cheap (no cupy): the hook only registers the class;
``probe()`` imports cupy and checks driver and devices
(:mod:`runtime_provider_cuda.probe`); a session's provider instance opens its
device and, at the first compile, the session's CUDA stream.

Provider options (strings, as in ORT):

* ``device_id``: the CUDA device (default ``0``);
* ``gpu_mem_limit``: bytes this session may allocate on the device (its own cupy
  memory pool with that limit; default: cupy's shared pool, unlimited);
* ``exclude_ops``: comma-separated op types to leave to the next provider.

ORT's other CUDA options (``arena_extend_strategy``, ``cudnn_conv_algo_search``, ...)
are accepted and ignored with a log line, so ORT scripts run unchanged.

Device values (``OrtValue(..., "cuda", device_id)``, ``IOBinding``) are cupy arrays;
DLPack goes through cupy (``kDLCUDA`` = 2), raw pointers are device addresses.
"""

from __future__ import annotations

import logging

import numpy as np

from runtime_core.plugin import Capability, ExecutionProvider, ProbeResult, hookimpl

from ._version import __version__

logger = logging.getLogger("runtime_provider_cuda")

OPTIONS = ("device_id", "gpu_mem_limit", "exclude_ops")
ORT_IGNORED = ("arena_extend_strategy", "cudnn_conv_algo_search", "do_copy_in_default_stream",
               "cudnn_conv_use_max_workspace", "cudnn_conv1d_pad_to_nc1d", "enable_cuda_graph",
               "tunable_op_enable", "tunable_op_tuning_enable", "use_tf32", "prefer_nhwc",
               "enable_skip_layer_norm_strict_mode", "use_ep_level_unified_stream", "has_user_compute_stream",
               "user_compute_stream", "gpu_external_alloc", "gpu_external_free", "gpu_external_empty_cache")


def _int_option(name, value, minimum=0) -> int:
    try:
        v = int(str(value).strip())
    except ValueError:
        raise ValueError(f"CUDA provider option {name}={value!r} is not an integer") from None
    if v < minimum:
        raise ValueError(f"CUDA provider option {name}={v} must be >= {minimum}")
    return v


class CUDAExecutionProvider(ExecutionProvider):
    """Runs ONNX nodes on one NVIDIA GPU with cupy (cuBLAS, fused and hand-written kernels)."""

    name = "CUDAExecutionProvider"
    alias = "cuda"
    version = __version__
    distribution = "runtime-provider-cuda"
    plugin_api = ">=1.0,<2"
    device_type = "cuda"
    dlpack_device_type = 2  # kDLCUDA

    def __init__(self, options=None):
        super().__init__(options)
        unknown = sorted(k for k in self.options if k not in OPTIONS and k not in ORT_IGNORED)
        if unknown:
            raise ValueError(f"unknown CUDA provider option(s) {', '.join(map(repr, unknown))}; "
                             f"known: {', '.join(OPTIONS)} (and ORT's {', '.join(ORT_IGNORED[:3])}, ..., "
                             "accepted and ignored)")
        for k in self.options:
            if k in ORT_IGNORED:
                logger.info("CUDA provider option %s=%r is accepted and ignored", k, self.options[k])
        self.device_id = _int_option("device_id", self.options.get("device_id", 0))
        limit = self.options.get("gpu_mem_limit")
        self.gpu_mem_limit = _int_option("gpu_mem_limit", limit, 1) if limit not in (None, "") else None
        from . import ops

        self.exclude_ops = {o.strip() for o in str(self.options.get("exclude_ops", "")).split(",")
                            if o.strip()}
        known = set(ops.FAST) | set(ops.GENERIC) | set(ops.HOST_RESULT)
        bad = sorted(o for o in self.exclude_ops if o not in known)
        if bad:
            raise ValueError(f"exclude_ops names op(s) the CUDA provider does not run: {', '.join(bad)}; "
                             f"it runs {', '.join(sorted(known))}")
        self.backend = self._make_backend()

    def _make_backend(self):
        """The device back end (cupy on ``device_id``); checks the device exists."""
        from .probe import cuda_status

        status = cuda_status()
        n = len(status.devices)
        if not 0 <= self.device_id < n:
            listing = "; ".join(str(d) for d in status.devices)
            raise ValueError(f"CUDA device_id {self.device_id} is out of range; devices: {listing}")
        from .backend import CupyBackend

        return CupyBackend(self.device_id, self.gpu_mem_limit)

    @classmethod
    def for_device(cls, device_id: int = 0) -> "CUDAExecutionProvider":
        return cls({"device_id": str(int(device_id))})

    # -- identity -------------------------------------------------------------
    @classmethod
    def probe(cls) -> ProbeResult:
        """Available when cupy imports, the driver is new enough and a device runs a kernel."""
        try:
            from .probe import CUDAUnavailable, cuda_status

            try:
                status = cuda_status()
            except CUDAUnavailable as exc:
                return ProbeResult(False, str(exc), [])
            return ProbeResult(True, "", [str(d) for d in status.devices])
        except Exception as exc:  # noqa: BLE001 - probe never raises
            return ProbeResult(False, f"CUDA probe failed: {type(exc).__name__}: {exc}", [])

    def get_options(self) -> dict[str, str]:
        out = {"device_id": str(self.device_id)}
        if self.gpu_mem_limit:
            out["gpu_mem_limit"] = str(self.gpu_mem_limit)
        if self.exclude_ops:
            out["exclude_ops"] = ",".join(sorted(self.exclude_ops))
        return out

    # -- partitioning ---------------------------------------------------------
    def get_capability(self, graph) -> Capability:
        """Claim node by node; the core merges neighbours into partitions."""
        from .ops import HOST_RESULT, decline_reason

        cap = Capability()
        on_device: set[str] = set()
        for node in graph:
            if node.op_type in self.exclude_ops:
                why = "excluded by the provider option exclude_ops"
            else:
                why = decline_reason(node)
            if why is None and node.op_type in HOST_RESULT and node.inputs[0] not in on_device:
                why = (f"{node.op_type} of a value not computed on CUDA stays on CPU (claiming it "
                       "would copy the tensor to the device for its shape)")
            if why:
                cap.declined[node.name] = why
                continue
            cap.claims.append(node)
            on_device.update(o for o in node.outputs if o)
        return cap

    def compile(self, partition):
        from .executable import CUDAExecutable

        return CUDAExecutable(partition, self.backend)

    # -- device memory ------------------------------------------------------
    def allocate(self, shape, dtype):
        return self.backend.empty(tuple(int(d) for d in shape), np.dtype(dtype))

    def copy_to_device(self, array):
        return self.backend.to_device(array)

    def copy_to_host(self, tensor) -> np.ndarray:
        return self.backend.to_host(tensor)

    def synchronize(self) -> None:
        """Wait for the session stream's queued work."""
        self.backend.synchronize()

    # -- device values (OrtValue / IOBinding / DLPack) -----------------------------------
    def holds(self, tensor) -> bool:
        """A device array on this instance's device is used as is."""
        return self.backend.is_device(tensor) and self._device_of(tensor) == self.device_id

    def _device_of(self, tensor) -> int:
        dev = getattr(tensor, "device", None)
        return int(getattr(dev, "id", self.device_id)) if dev is not None else self.device_id

    def _check(self, tensor) -> None:
        if not self.backend.is_device(tensor):
            raise TypeError(f"expected a CUDA device array, got {type(tensor).__name__}")
        if self._device_of(tensor) != self.device_id:
            raise ValueError(f"the tensor lives on cuda:{self._device_of(tensor)}, not on cuda:{self.device_id}")

    def tensor_info(self, tensor):
        self._check(tensor)
        return tuple(int(d) for d in tensor.shape), np.dtype(tensor.dtype)

    def copy_into(self, dst, src) -> None:
        """Write a host array or a device array into ``dst`` (on the session stream)."""
        self._check(dst)
        shape = tuple(src.shape)
        if shape != tuple(dst.shape):
            raise ValueError(f"cannot write shape {shape} into a tensor of shape {tuple(dst.shape)}")
        be = self.backend
        with be.activate():
            if be.is_device(src):
                dst[...] = src
            else:
                dst[...] = be.to_device(np.asarray(src, dtype=dst.dtype))
        be.synchronize()

    def to_dlpack(self, tensor, stream=None):
        """A DLPack capsule sharing the cupy array's memory (after the session stream's work)."""
        self._check(tensor)
        self.backend.synchronize()
        if stream is not None:
            return tensor.__dlpack__(stream=stream)
        return tensor.toDlpack()

    def from_dlpack(self, obj):
        """Import a ``__dlpack__`` object (torch CUDA tensor, ...) or capsule as a cupy array."""
        xp = self.backend.xp
        with self.backend.activate():
            arr = xp.from_dlpack(obj)
        if not arr.flags.c_contiguous:
            raise ValueError(f"only C-contiguous tensors can be imported through DLPack (shape "
                             f"{tuple(arr.shape)}, strides {arr.strides})")
        self._check(arr)
        return arr

    def data_ptr(self, tensor) -> int:
        self._check(tensor)
        return int(tensor.data.ptr)

    def tensor_from_pointer(self, ptr, shape, dtype):
        """Wrap device memory at ``ptr`` (not owned) as a cupy array."""
        xp = self.backend.xp
        dtype = np.dtype(dtype)
        shape = tuple(int(d) for d in shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if not ptr and nbytes:
            raise ValueError("buffer_ptr is null")
        mem = xp.cuda.UnownedMemory(int(ptr), nbytes, owner=None, device_id=self.device_id)
        return xp.ndarray(shape, dtype, xp.cuda.MemoryPointer(mem, 0))


@hookimpl
def runtime_core_register_providers(registrar):
    """Register :class:`CUDAExecutionProvider` (cheap: no cupy import here)."""
    registrar.register(CUDAExecutionProvider)
