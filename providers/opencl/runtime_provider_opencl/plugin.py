"""The OpenCL execution provider and its plugin hook.

Importing this module is cheap (no pyopencl): the hook only registers the class;
``probe()`` imports pyopencl and looks for devices; a session's provider instance
opens (or reuses) the context of the device its options select.

Provider options (strings, as in ORT):

* ``platform``: platform index or a substring of its name or vendor;
* ``device``: device index (within the platform) or a substring of its name;
* ``exclude_ops``: comma-separated op types to leave to the next provider (to
  bisect a kernel problem, or to keep an op on CPU).

Device values (``OrtValue(..., "opencl", device_id)``, ``IOBinding``): ``device_id``
is the device's position in ``probe()``'s device list (every platform, in order);
tensors are shared by every session and value on the same device, because they
share its context. Raw pointers are ``cl_mem`` handles (``data_ptr()``,
``bind_input(..., buffer_ptr)``); DLPack is declined (see :data:`NO_DLPACK`).
"""

from __future__ import annotations

import logging

import numpy as np

from runtime_core.plugin import Capability, ExecutionProvider, ProbeResult, hookimpl

from ._version import __version__

logger = logging.getLogger("runtime_provider_opencl")

OPTIONS = ("platform", "device", "exclude_ops")

NO_DLPACK = ("OpenCL buffers cannot be exchanged through DLPack: pyopencl implements neither DLPack "
             "export nor import, and an OpenCL buffer is a cl_mem handle, not an address other "
             "libraries could read; copy with OrtValue.numpy(), or pass the handle with "
             "data_ptr() and IOBinding.bind_input(..., buffer_ptr)")


def decline_reason(node, spec) -> str | None:
    """Why OpenCL does not run ``node`` (``None`` when it does), before any device is used."""
    from .registry import check_outputs

    if node.domain not in ("", "ai.onnx"):
        return f"op {node.domain}::{node.op_type} is not implemented by the OpenCL provider"
    if spec is None:
        return f"op {node.op_type} is not implemented by the OpenCL provider"
    if node.since_version not in spec.versions:
        return (f"{node.op_type} version {node.since_version} (opset {node.opset}) is not implemented; "
                f"the OpenCL provider has versions {', '.join(map(str, spec.versions))}")
    try:
        why = check_outputs(node, spec.out_dtypes) or spec.check(node)
    except Exception as exc:  # a check must not break capability
        return f"capability check failed: {type(exc).__name__}: {exc}"
    return why or None


class OpenCLExecutionProvider(ExecutionProvider):
    """Runs float32 (and, with cl_khr_fp16, float16) ONNX nodes as OpenCL C kernels on one device."""

    name = "OpenCLExecutionProvider"
    alias = "opencl"
    version = __version__
    distribution = "runtime-provider-opencl"
    plugin_api = ">=1.0,<2"
    device_type = "opencl"
    dlpack_device_type = 4  # kDLOpenCL (DLPack itself is declined, see NO_DLPACK)

    def __init__(self, options=None):
        super().__init__(options)
        unknown = sorted(k for k in self.options if k not in OPTIONS)
        if unknown:
            raise ValueError(f"unknown OpenCL provider option(s) {', '.join(map(repr, unknown))}; "
                             f"known: {', '.join(OPTIONS)}")
        from .device import get_context, select_device

        self.exclude_ops = {o.strip() for o in str(self.options.get("exclude_ops", "")).split(",")
                            if o.strip()}
        from . import ops  # noqa: F401 - registers the op modules
        from .registry import REGISTRY

        bad = sorted(o for o in self.exclude_ops if o not in REGISTRY)
        if bad:
            raise ValueError(f"exclude_ops names op(s) the OpenCL provider does not implement: "
                             f"{', '.join(bad)}; it implements {', '.join(sorted(REGISTRY))}")
        self.device_info = select_device(self.options.get("platform"), self.options.get("device"))
        self.dev = get_context(self.device_info)
        from .device import list_devices

        where = (self.device_info.platform, self.device_info.device)
        self.device_id = next(i for i, d in enumerate(list_devices()) if (d.platform, d.device) == where)
        logger.info("OpenCL provider on %s (device_id %d)", self.device_info, self.device_id)

    @classmethod
    def for_device(cls, device_id: int = 0) -> "OpenCLExecutionProvider":
        """The provider on device ``device_id``: its position in ``probe()``'s device list."""
        from .device import list_devices

        devices = list_devices()
        if not 0 <= int(device_id) < len(devices):
            listing = "; ".join(f"{i}: {d}" for i, d in enumerate(devices))
            raise ValueError(f"OpenCL device_id {device_id} is out of range; devices: {listing}")
        info = devices[int(device_id)]
        return cls({"platform": str(info.platform), "device": str(info.device)})

    # -- identity -------------------------------------------------------------
    @classmethod
    def probe(cls) -> ProbeResult:
        """Available when pyopencl imports and at least one OpenCL device builds a kernel.

        ``devices`` lists every usable device (``platform:device name (type, platform, its
        version, device version)``), the default one marked ``[default]``; when available,
        ``reason`` says which device a session without options uses and why any other device
        was skipped (``runtime-core providers`` shows it); when not, why none is usable."""
        try:
            from .device import OpenCLUnavailable, list_devices, select_device, survey

            try:
                devices = list_devices()
            except OpenCLUnavailable as exc:
                return ProbeResult(False, str(exc), [])
            try:
                chosen = select_device()
                note = f"uses {chosen} by default"
            except ValueError as exc:  # $RUNTIME_CORE_OPENCL_PLATFORM / _DEVICE match nothing
                chosen, note = None, f"the environment's default device is invalid: {exc}"
            skipped = survey()[1]
            if skipped:
                note += "; skipped: " + "; ".join(skipped)
            listing = [str(d) + (" [default]" if chosen is not None and
                                 (d.platform, d.device) == (chosen.platform, chosen.device) else "")
                       for d in devices]
            return ProbeResult(True, note, listing)
        except Exception as exc:  # noqa: BLE001 - probe never raises
            return ProbeResult(False, f"OpenCL probe failed: {type(exc).__name__}: {exc}", [])

    def get_options(self) -> dict[str, str]:
        """The effective options: the selected platform and device indices (and exclusions)."""
        out = {"platform": str(self.device_info.platform), "device": str(self.device_info.device)}
        if self.exclude_ops:
            out["exclude_ops"] = ",".join(sorted(self.exclude_ops))
        return out

    # -- partitioning ---------------------------------------------------------
    def get_capability(self, graph) -> Capability:
        """Claim each node one by one; the core merges neighbours into partitions."""
        from . import ops  # noqa: F401 - registers the op modules
        from .registry import REGISTRY

        cap = Capability()
        on_device: set[str] = set()  # values produced by nodes claimed here
        host_known: set[str] = set()  # ... whose value is known when the partition specializes
        for node in graph:
            spec = REGISTRY.get(node.op_type) if node.domain in ("", "ai.onnx") else None
            if node.op_type in self.exclude_ops:
                why = "excluded by the provider option exclude_ops"
            else:
                why = decline_reason(node, spec)
            if why is None:
                why = self._too_big(node)
            if why is None and not self.dev.fp16:
                why = next((f"{vi.name!r} is float16 and the device lacks cl_khr_fp16"
                            for vi in node.input_info + node.output_info
                            if vi is not None and vi.dtype is not None and np.dtype(vi.dtype) == np.float16),
                           None)
            if why is None:
                for i in spec.values_of(node):
                    name = node.inputs[i]
                    if name in on_device and name not in host_known:
                        why = (f"input {i} ({name!r}) is read on the host as a value, but it is computed "
                               "on the device by a node whose value is not known before it runs")
            if why is None and node.op_type == "Shape" and node.inputs[0] not in on_device:
                why = ("Shape of a value that is not computed on OpenCL stays on CPU "
                       "(claiming it would copy the tensor to the device for its shape)")
            if why:
                cap.declined[node.name] = why
                continue
            cap.claims.append(node)
            on_device.update(o for o in node.outputs if o)
            if node.op_type == "Shape":
                host_known.update(o for o in node.outputs if o)
        return cap

    def _too_big(self, node) -> str | None:
        for vi in node.input_info + node.output_info:
            if vi is not None and (vi.nbytes or 0) > self.dev.max_alloc:
                return (f"{vi.name!r} needs {vi.nbytes} bytes, over the device's largest allocation "
                        f"({self.dev.max_alloc} bytes)")
        return None

    def compile(self, partition):
        from . import ops  # noqa: F401
        from .executable import OpenCLExecutable

        return OpenCLExecutable(partition, self.dev)

    # -- device memory ------------------------------------------------------
    def allocate(self, shape, dtype):
        from .tensor import OpenCLTensor

        return OpenCLTensor.empty(shape, dtype, self.dev)

    def copy_to_device(self, array):
        from .tensor import OpenCLTensor

        if isinstance(array, OpenCLTensor):
            if array.device is self.dev:
                return array
            array = array.numpy()
        array = np.asarray(array)
        # small integer tensors (shapes computed on CPU, index lists) keep a host mirror: an
        # executable that reads them as values (Reshape's shape) needs no download
        mirror = array.dtype.kind in "iu" and array.size <= 4096
        return OpenCLTensor.from_numpy(array, self.dev, mirror=mirror)

    def copy_to_host(self, tensor) -> np.ndarray:
        from .tensor import OpenCLTensor

        if not isinstance(tensor, OpenCLTensor):
            raise TypeError(f"copy_to_host got {type(tensor).__name__}, not an OpenCLTensor")
        return tensor.numpy()

    def synchronize(self) -> None:
        """Wait for every command queued on the device."""
        self.dev.finish()

    # -- device values (OrtValue / IOBinding) -------------------------------------------
    def holds(self, tensor) -> bool:
        """An :class:`OpenCLTensor` in this device's context is used as is."""
        from .tensor import OpenCLTensor

        return isinstance(tensor, OpenCLTensor) and tensor.device is self.dev

    def tensor_info(self, tensor):
        """``(shape, dtype)`` of an :class:`OpenCLTensor`."""
        self._check(tensor)
        return tensor.shape, tensor.dtype

    def copy_into(self, dst, src) -> None:
        """Write a host array, or a tensor on this device (a device-side copy), into ``dst``."""
        self._check(dst)
        shape = tuple(src.shape) if hasattr(src, "shape") else np.asarray(src).shape
        if shape != dst.shape:
            raise ValueError(f"cannot write shape {shape} into a tensor of shape {dst.shape}")
        dst.copy_from(src)

    def data_ptr(self, tensor) -> int:
        """The ``cl_mem`` handle of the tensor's buffer (0 for an empty tensor)."""
        self._check(tensor)
        return 0 if tensor.buffer is None else int(tensor.buffer.int_ptr)

    def tensor_from_pointer(self, ptr, shape, dtype):
        """Wrap a ``cl_mem`` handle of a buffer in this device's context (no copy)."""
        from .shapes import nbytes_of
        from .tensor import OpenCLTensor

        dtype = np.dtype(dtype)
        shape = tuple(int(d) for d in shape)
        if dtype.hasobject:
            raise TypeError(f"an OpenCL buffer cannot hold {dtype} elements")
        nbytes = nbytes_of(shape, dtype)
        if nbytes == 0:
            return OpenCLTensor(None, shape, dtype, self.dev)
        if not ptr:
            raise ValueError("buffer_ptr is null")
        cl = self.dev.cl
        buf = cl.Buffer.from_int_ptr(int(ptr), retain=True)
        if not self.dev.owns(buf):
            raise ValueError(f"buffer_ptr {ptr:#x} is not a buffer of the OpenCL context of "
                             f"{self.device_info}")
        if buf.size < nbytes:
            raise ValueError(f"buffer_ptr {ptr:#x} holds {buf.size} bytes; shape {list(shape)} of "
                             f"{dtype} needs {nbytes}")
        return OpenCLTensor(buf, shape, dtype, self.dev)

    def to_dlpack(self, tensor, stream=None):
        """Declined, with the reason (:data:`NO_DLPACK`)."""
        raise NotImplementedError(NO_DLPACK)

    def from_dlpack(self, obj):
        """Declined, with the reason (:data:`NO_DLPACK`)."""
        raise NotImplementedError(NO_DLPACK)

    def _check(self, tensor) -> None:
        from .tensor import OpenCLTensor

        if not isinstance(tensor, OpenCLTensor):
            raise TypeError(f"expected an OpenCLTensor, got {type(tensor).__name__}")
        if tensor.device is not self.dev:
            raise ValueError(f"the tensor lives on {tensor.device.info}, not on {self.device_info}")


@hookimpl
def runtime_core_register_providers(registrar):
    """Register :class:`OpenCLExecutionProvider` (cheap: no pyopencl import here)."""
    registrar.register(OpenCLExecutionProvider)
