"""``OrtValue``: a tensor in host memory or on a provider's device (ORT-compatible).

A host ``OrtValue`` wraps a numpy array without copying it. A device ``OrtValue``
holds a tensor object owned by a provider (an ``OpenCLTensor``, a cupy array, ...)
together with the provider instance that made it; the core never looks inside the
tensor, it only asks the provider (``copy_to_host``, ``tensor_info``, ...).

Devices are named as in ONNX Runtime (``"cpu"``, ``"cuda"``) and resolved through
the plugin registry: a device name is the alias, the ORT name or the
``device_type`` of an installed, available provider; ``device_id`` picks one of
its devices (:meth:`ExecutionProvider.for_device`).

Only dense tensors are supported: sequences, maps and sparse tensors are declined.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from ..errors import (
    ExecutionError,
    InvalidArgumentError,
    ProviderUnavailableError,
    RuntimeCoreError,
    UnknownProviderError,
    UnsupportedDeviceOperationError,
)
from ..execution.executor import HOST, device_of, same_device
from ..graph.types import dtype_to_elem, elem_to_dtype, elem_type_name

__all__ = ["OrtValue", "resolve_device"]

# DLPack's DLDeviceType values (dlpack.h), for messages
DLPACK_DEVICE_NAMES = {1: "kDLCPU", 2: "kDLCUDA", 3: "kDLCUDAHost", 4: "kDLOpenCL", 7: "kDLVulkan",
                       8: "kDLMetal", 9: "kDLVPI", 10: "kDLROCM", 11: "kDLROCMHost", 12: "kDLExtDev",
                       13: "kDLCUDAManaged", 14: "kDLOneAPI", 15: "kDLWebGPU", 16: "kDLHexagon"}
KDLCPU = 1

ONLY_TENSORS = ("an OrtValue holds only dense tensors for now: sequences (lists), maps (dicts) "
                "and sparse tensors are not supported")


# -- devices ---------------------------------------------------------------------------

_DEVICE_CACHE: dict[tuple, tuple] = {}
_CACHE_LOCK = threading.Lock()


def _known_devices(registry) -> str:
    names = ["cpu"]
    for rec in registry.loaded():
        dt = getattr(rec.cls, "device_type", HOST)
        if dt != HOST:
            state = "" if rec.available else f", unavailable: {rec.reason}"
            names.append(f"{dt} ({rec.name}, alias {rec.alias!r}{state})")
    return ", ".join(names)


def _record_for(device_type: str, registry):
    low = device_type.strip().lower()
    rec = registry.lookup(low)
    if rec is not None and rec.status == "loaded":
        return rec
    by_type = [r for r in registry.loaded() if str(getattr(r.cls, "device_type", "")).lower() == low]
    by_type.sort(key=lambda r: not r.available)
    return by_type[0] if by_type else rec


def _device_id(device_id) -> int:
    if isinstance(device_id, bool) or not isinstance(device_id, (int, np.integer)) or device_id < 0:
        raise InvalidArgumentError(f"device_id must be a non-negative int, got {device_id!r}")
    return int(device_id)


def resolve_device(device_type, device_id=0, providers=()):
    """The provider instance whose memory ``device_type``/``device_id`` names, or ``None``
    for host memory.

    ``providers`` (a session's instances) are preferred, so a value made for a
    session lives where its partitions run; otherwise one instance per device and
    process is made with ``for_device(device_id)``. Raises
    :class:`~runtime_core.errors.UnknownProviderError` for a name no installed
    provider has and :class:`~runtime_core.errors.ProviderUnavailableError` for a
    provider that cannot run here, both naming the device and the known ones.
    """
    from ..plugin.registry import get_registry

    if not isinstance(device_type, str) or not device_type.strip():
        raise InvalidArgumentError(f"device_type must be a device name such as 'cpu' or 'cuda', "
                                   f"got {device_type!r}")
    dev_id = _device_id(device_id)
    low = device_type.strip().lower()
    if low in (HOST, "host"):
        if dev_id != 0:
            raise InvalidArgumentError(f"device 'cpu' has only device_id 0, got {dev_id}")
        return None
    registry = get_registry()
    rec = _record_for(low, registry)
    if rec is None:
        raise UnknownProviderError(f"unknown device {device_type!r}: no installed provider has that "
                                   f"alias, name or device type (devices: {_known_devices(registry)})")
    if rec.status != "loaded":
        raise ProviderUnavailableError(f"device {device_type!r} is unavailable: the plugin of "
                                       f"{rec.name} failed to load ({rec.status}): {rec.reason}")
    if getattr(rec.cls, "device_type", HOST) == HOST:
        if dev_id != 0:
            raise InvalidArgumentError(f"device {device_type!r} is host memory, which has only "
                                       f"device_id 0, got {dev_id}")
        return None
    if not rec.available:
        raise ProviderUnavailableError(f"device {device_type!r} ({rec.name}) is unavailable: "
                                       f"{rec.reason or 'probe() reported it unavailable'}")
    for p in providers:
        if type(p) is rec.cls and int(getattr(p, "device_id", 0) or 0) == dev_id:
            return p
    key = (rec.name, dev_id)
    with _CACHE_LOCK:
        hit = _DEVICE_CACHE.get(key)
        if hit is not None and hit[0] is registry:
            return hit[1]
        inst = _make_device_provider(rec.cls, dev_id, device_type)
        _DEVICE_CACHE[key] = (registry, inst)
        return inst


def _make_device_provider(cls, device_id: int, device_type: str):
    factory = getattr(cls, "for_device", None)
    try:
        if factory is not None:
            return factory(device_id)
        if device_id != 0:
            raise ValueError(f"{cls.name} has a single device (device_id 0), not {device_id}")
        return cls({})
    except RuntimeCoreError:
        raise
    except ValueError as exc:
        raise InvalidArgumentError(f"device {device_type!r} has no device_id {device_id}: {exc}") from exc
    except Exception as exc:
        raise ProviderUnavailableError(f"could not open device {device_type!r} (device_id {device_id}) "
                                       f"of {cls.name}: {type(exc).__name__}: {exc}") from exc


def provider_call(provider, method: str, *args, what: str):
    """Call an optional device method of ``provider``; map its failures to typed errors.

    ``NotImplementedError`` (or a missing method) becomes
    :class:`~runtime_core.errors.UnsupportedDeviceOperationError` with the
    provider's reason; ``TypeError``/``ValueError`` an ``InvalidArgumentError``;
    anything else an ``ExecutionError``.
    """
    name = getattr(provider, "name", type(provider).__name__)
    fn = getattr(provider, method, None)
    if fn is None:
        raise UnsupportedDeviceOperationError(f"{name} cannot {what}: it does not implement {method}()")
    try:
        return fn(*args)
    except RuntimeCoreError:
        raise
    except NotImplementedError as exc:
        raise UnsupportedDeviceOperationError(f"{name} cannot {what}: {exc}") from exc
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{name} cannot {what}: {exc}") from exc
    except Exception as exc:
        raise ExecutionError(f"{name} failed to {what}: {type(exc).__name__}: {exc}") from exc


# -- element types ---------------------------------------------------------------------

def to_dtype(element_type) -> np.dtype:
    """numpy dtype of ``element_type``: a numpy type/dtype or an ONNX ``TensorProto`` int."""
    if isinstance(element_type, (int, np.integer)) and not isinstance(element_type, bool):
        dt = elem_to_dtype(int(element_type))
        if dt is None:
            raise InvalidArgumentError(f"element_type {element_type} is not an ONNX tensor element type "
                                       "with a numpy equivalent")
        return dt
    try:
        return np.dtype(element_type)
    except TypeError as exc:
        raise InvalidArgumentError(f"element_type must be a numpy type (numpy.float32) or an ONNX "
                                   f"TensorProto element type (1 = FLOAT), got {element_type!r}") from exc


def _shape(shape) -> tuple[int, ...]:
    try:
        dims = tuple(shape)
    except TypeError:
        raise InvalidArgumentError(f"shape must be a sequence of ints, got {shape!r}") from None
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0:
            raise InvalidArgumentError(f"shape must be a sequence of non-negative ints, got {shape!r}")
    return tuple(int(d) for d in dims)


def _check_vendor(vendor_id) -> None:
    if vendor_id not in (-1, None):
        raise InvalidArgumentError(f"vendor_id={vendor_id!r} is not supported: runtime-core names a device "
                                   "by its provider ('cuda', 'opencl') and device_id")


def _host_array(obj) -> np.ndarray:
    if isinstance(obj, OrtValue):
        raise InvalidArgumentError("got an OrtValue where a numpy array was expected")
    if isinstance(obj, (list, tuple, dict)):
        raise InvalidArgumentError(f"{ONLY_TENSORS}; got a {type(obj).__name__}, pass a numpy array")
    if isinstance(obj, np.generic):
        obj = np.asarray(obj)
    if not isinstance(obj, np.ndarray):
        raise InvalidArgumentError(f"expected a numpy array, got {type(obj).__name__} (use "
                                   "OrtValue.from_dlpack for torch/cupy tensors)")
    return obj


def host_array_from_pointer(ptr, shape, dtype) -> np.ndarray:
    """A numpy array over host memory at address ``ptr`` (no copy; the caller keeps it alive)."""
    dtype = np.dtype(dtype)
    shape = _shape(shape)
    if dtype.hasobject:
        raise InvalidArgumentError(f"a raw pointer cannot hold {dtype} elements (strings/objects)")
    if isinstance(ptr, bool) or not isinstance(ptr, (int, np.integer)) or int(ptr) <= 0:
        raise InvalidArgumentError(f"buffer_ptr must be a non-null address (an int), got {ptr!r}")
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return np.empty(shape, dtype)
    buf = (ctypes.c_char * (count * dtype.itemsize)).from_address(int(ptr))
    return np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)


# -- DLPack ----------------------------------------------------------------------------

_CAPSULE_IS_VALID = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_CAPSULE_POINTER = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
# offset of DLTensor.device in DLManagedTensor / DLManagedTensorVersioned
_CAPSULE_DEVICE_OFFSET = ((b"dltensor", 8), (b"dltensor_versioned", 40))


def capsule_device(capsule) -> tuple[int, int]:
    """``(DLDeviceType, device_id)`` of an unconsumed DLPack capsule."""
    for name, offset in _CAPSULE_DEVICE_OFFSET:
        if _CAPSULE_IS_VALID(capsule, name):
            ptr = _CAPSULE_POINTER(capsule, name)
            dev = (ctypes.c_int32 * 2).from_address(ptr + offset)
            return int(dev[0]), int(dev[1])
    raise InvalidArgumentError(
        f"from_dlpack expects an object with __dlpack__ (a torch, cupy or numpy array) or an unused "
        f"DLPack capsule named 'dltensor', got {type(capsule).__name__} (a capsule is consumed by "
        "its first import)")


class _CapsuleHolder:
    """Gives a raw host capsule the ``__dlpack__`` protocol, for ``numpy.from_dlpack``."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return self.capsule

    def __dlpack_device__(self):
        return (KDLCPU, 0)


def _dlpack_name(dev_type: int) -> str:
    return f"{DLPACK_DEVICE_NAMES.get(dev_type, 'unknown')} ({dev_type})"


def _dlpack_provider(dev_type: int, dev_id: int):
    from ..plugin.registry import get_registry

    registry = get_registry()
    recs = [r for r in registry.loaded() if getattr(r.cls, "dlpack_device_type", None) == dev_type]
    if not recs:
        have = ", ".join(f"{r.name}: {_dlpack_name(r.cls.dlpack_device_type)}" for r in registry.loaded()
                         if getattr(r.cls, "dlpack_device_type", None) is not None) or "none"
        raise UnknownProviderError(f"no installed provider holds DLPack device {_dlpack_name(dev_type)} "
                                   f"memory (providers with DLPack devices: {have}; host memory is kDLCPU)")
    rec = next((r for r in recs if r.available), recs[0])
    return resolve_device(rec.alias, dev_id)


# -- OrtValue ---------------------------------------------------------------------------

class OrtValue:
    """A tensor on the host or on a provider's device (ONNX Runtime's ``OrtValue``).

    Make one with :meth:`ortvalue_from_numpy`, :meth:`ortvalue_from_shape_and_type`
    or :meth:`from_dlpack`; ``IOBinding.get_outputs()`` returns them too. A host
    value shares memory with its numpy array; :meth:`numpy` of a device value
    copies it to the host.
    """

    #: the object a value imported through DLPack came from (its capsule is the fallback export)
    _dlpack_source = None

    _rt_device_value = True  # how feed validation recognises an OrtValue

    def __init__(self, value, provider=None, keepalive=None):
        """Wrap a host numpy array (``provider=None``) or a device tensor of ``provider``.

        Internal: use the factory methods. ``keepalive`` is kept referenced for
        as long as this value (the object whose memory it borrows).
        """
        if provider is not None and device_of(provider) == HOST:
            provider = None  # a host provider's tensors are numpy arrays
        if provider is None:
            value = _host_array(value)
            self._shape = tuple(int(d) for d in value.shape)
            self._dtype = value.dtype
        else:
            if hasattr(provider, "tensor_info"):
                shape, dtype = provider_call(provider, "tensor_info", value, what="describe its tensor")
            else:  # a duck-typed provider: its tensors carry shape and dtype
                shape, dtype = value.shape, value.dtype
            self._shape = tuple(int(d) for d in shape)
            self._dtype = np.dtype(dtype)
        self._value = value
        self._provider = provider
        self._keepalive = keepalive

    # -- factories ------------------------------------------------------------------
    @classmethod
    def ortvalue_from_numpy(cls, numpy_obj, /, device_type="cpu", device_id=0, vendor_id=-1) -> "OrtValue":
        """An OrtValue holding ``numpy_obj``: on the host it shares its memory (a
        non-contiguous or byte-swapped array is copied first); on a device
        (``"cuda"``, ``"opencl"``, ...) the data is copied there."""
        _check_vendor(vendor_id)
        arr = _host_array(numpy_obj)
        provider = resolve_device(device_type, device_id)
        keep = arr
        if not arr.dtype.isnative:
            arr = arr.astype(arr.dtype.newbyteorder("="))
        if not arr.flags.c_contiguous:
            arr = arr.copy(order="C")
        if provider is None:
            return cls(arr, None, keep)
        if arr.dtype.hasobject or arr.dtype.kind in "US":
            raise InvalidArgumentError(f"a tensor of {arr.dtype} (strings) cannot live on device "
                                       f"{device_type!r}; only host OrtValues hold strings")
        tensor = provider_call(provider, "copy_to_device", arr, what=f"copy an array to {device_type!r}")
        return cls(tensor, provider)

    @classmethod
    def ortvalue_from_numpy_with_onnx_type(cls, data, /, onnx_element_type: int) -> "OrtValue":
        """A host OrtValue over ``data`` reinterpreted as ONNX element type
        ``onnx_element_type`` of the same item size (no copy)."""
        arr = _host_array(data)
        dt = to_dtype(int(onnx_element_type))
        if dt.itemsize != arr.dtype.itemsize or dt.hasobject or arr.dtype.hasobject:
            raise InvalidArgumentError(f"cannot reinterpret {arr.dtype} ({arr.dtype.itemsize} bytes) as "
                                       f"tensor({elem_type_name(int(onnx_element_type))}) "
                                       f"({dt.itemsize} bytes): the item sizes must match")
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
        return cls(arr.view(dt), None, data)

    @classmethod
    def ortvalue_from_shape_and_type(cls, shape, element_type, device_type: str = "cpu", device_id: int = 0,
                                     vendor_id=-1, memory_info=None) -> "OrtValue":
        """An uninitialised tensor of ``shape`` and ``element_type`` (a numpy type or an
        ONNX element type int) on ``device_type``/``device_id``."""
        _check_vendor(vendor_id)
        if memory_info is not None:
            raise InvalidArgumentError("memory_info is not supported: name the device by "
                                       "device_type and device_id")
        dims = _shape(shape)
        dt = to_dtype(element_type)
        provider = resolve_device(device_type, device_id)
        if provider is None:
            arr = np.full(dims, "", dtype=object) if dt.hasobject else np.empty(dims, dt)
            return cls(arr)
        if dt.hasobject:
            raise InvalidArgumentError(f"string tensors cannot live on device {device_type!r}")
        tensor = provider_call(provider, "allocate", dims, dt, what=f"allocate {dims} {dt} on {device_type!r}")
        return cls(tensor, provider)

    @classmethod
    def ort_value_from_sparse_tensor(cls, sparse_tensor) -> "OrtValue":
        """Declined: sparse tensors are not supported."""
        raise InvalidArgumentError(ONLY_TENSORS)

    @classmethod
    def from_dlpack(cls, data, /) -> "OrtValue":
        """An OrtValue sharing the memory of ``data``: an object with ``__dlpack__``
        (a torch or cupy tensor, a numpy array) or an unused DLPack capsule.

        Host memory (``kDLCPU``) is imported through numpy; other devices through
        the provider whose ``dlpack_device_type`` matches. Only C-contiguous
        tensors are accepted (as in ONNX Runtime).
        """
        if hasattr(data, "__dlpack__"):
            if hasattr(data, "__dlpack_device__"):
                dev_type, dev_id = (int(v) for v in data.__dlpack_device__())
            else:
                dev_type, dev_id = KDLCPU, 0
            source = data
        else:
            dev_type, dev_id = capsule_device(data)
            source = _CapsuleHolder(data) if dev_type == KDLCPU else data
        if dev_type != KDLCPU:
            provider = _dlpack_provider(dev_type, dev_id)
            tensor = provider_call(provider, "from_dlpack", source,
                                   what=f"import DLPack device {_dlpack_name(dev_type)} memory")
            return cls(tensor, provider, data)
        try:
            arr = np.from_dlpack(source)
        except (BufferError, TypeError, ValueError, RuntimeError) as exc:
            raise InvalidArgumentError(f"numpy cannot import this DLPack tensor: {exc}") from exc
        if not arr.flags.c_contiguous:
            raise InvalidArgumentError(f"only contiguous tensors can be imported through DLPack (got shape "
                                       f"{arr.shape} with strides {arr.strides}); make it contiguous first, "
                                       "e.g. tensor.contiguous()")
        value = cls(arr, None, data)
        if source is data:
            value._dlpack_source = data  # numpy < 2 cannot export the read-only array it imported
        return value

    # -- ORT accessors --------------------------------------------------------------
    def device_name(self) -> str:
        """Where the data lives: ``"cpu"``, or the provider's ``device_type`` (``"cuda"``, ``"opencl"``)."""
        return HOST if self._provider is None else str(device_of(self._provider)).lower()

    def shape(self) -> list[int]:
        """The tensor's dims."""
        return list(self._shape)

    def data_type(self) -> str:
        """ORT's type string, e.g. ``"tensor(float)"``."""
        return f"tensor({elem_type_name(self.element_type())})"

    def element_type(self) -> int:
        """The ONNX ``TensorProto`` element type (1 for float)."""
        elem = dtype_to_elem(self._dtype)
        if elem is None:
            raise InvalidArgumentError(f"numpy dtype {self._dtype} has no ONNX element type")
        return int(elem)

    def tensor_size_in_bytes(self) -> int:
        """Bytes of the tensor's data."""
        return int(np.prod(self._shape, dtype=np.int64)) * self._dtype.itemsize

    def has_value(self) -> bool:
        """Always True: an OrtValue here always holds a tensor (no empty optionals)."""
        return True

    def is_tensor(self) -> bool:
        """Always True (only tensors are supported)."""
        return True

    def is_sparse_tensor(self) -> bool:
        """Always False."""
        return False

    def is_tensor_sequence(self) -> bool:
        """Always False."""
        return False

    def as_sparse_tensor(self):
        """Declined: sparse tensors are not supported."""
        raise InvalidArgumentError(ONLY_TENSORS)

    def data_ptr(self) -> int:
        """Address of the first element (host), or the provider's device pointer/handle."""
        if self._provider is None:
            return int(self._value.__array_interface__["data"][0])
        return int(provider_call(self._provider, "data_ptr", self._value, what="expose a device pointer"))

    def numpy(self) -> np.ndarray:
        """The data as a numpy array: the wrapped array itself on the host (shared
        memory), a fresh host copy for a device value."""
        if self._provider is None:
            return self._value
        return provider_call(self._provider, "copy_to_host", self._value, what="copy a tensor to the host")

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        if copy is not None:
            return np.array(arr, dtype=dtype, copy=copy)
        return arr if dtype is None else np.asarray(arr, dtype=dtype)

    def update_inplace(self, data) -> None:
        """Overwrite the data in place (same memory) from a numpy array or another OrtValue."""
        if isinstance(data, OrtValue):
            src_shape, src_dtype = data._shape, data._dtype
        else:
            if not isinstance(data, np.ndarray):
                raise InvalidArgumentError(f"update_inplace takes a numpy array or an OrtValue, "
                                           f"got {type(data).__name__}")
            src_shape, src_dtype = tuple(data.shape), data.dtype
        if src_dtype != self._dtype or int(np.prod(src_shape, dtype=np.int64)) != int(
                np.prod(self._shape, dtype=np.int64)):
            raise InvalidArgumentError(f"update_inplace needs {self._dtype} data of {list(self._shape)} "
                                       f"({int(np.prod(self._shape))} elements), got {src_dtype} of "
                                       f"{list(src_shape)}")
        if self._provider is None:
            np.copyto(self._value, (data.numpy() if isinstance(data, OrtValue) else data).reshape(self._shape))
            return
        if isinstance(data, OrtValue) and data._provider is not None and same_device(
                data._provider, self._provider, data._value):
            src = data._value
        else:
            src = np.ascontiguousarray((data.numpy() if isinstance(data, OrtValue) else data)
                                       .reshape(self._shape))
        provider_call(self._provider, "copy_into", self._value, src, what="write into a device tensor")

    # -- DLPack ---------------------------------------------------------------------
    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule sharing this value's memory (the DLPack protocol)."""
        if self._provider is None:
            kwargs = {k: v for k, v in (("max_version", max_version), ("dl_device", dl_device),
                                        ("copy", copy)) if v is not None}
            try:
                try:
                    return self._value.__dlpack__(stream=stream, **kwargs)
                except TypeError:
                    if "max_version" not in kwargs:
                        raise
                    # numpy < 2.1 has no versioned capsules: the legacy one is what the protocol
                    # then gives (torch.from_dlpack asks with max_version and reads either)
                    kwargs.pop("max_version")
                    return self._value.__dlpack__(stream=stream, **kwargs)
            except BufferError as exc:
                if self._dlpack_source is None:
                    raise InvalidArgumentError(f"this {self._value.dtype} tensor cannot be exported through "
                                               f"DLPack: {exc}") from exc
                # the memory came from this producer: its own capsule shares it, in any numpy
                return self._dlpack_source.__dlpack__(stream=stream, **kwargs)
            except (TypeError, ValueError, RuntimeError) as exc:
                raise InvalidArgumentError(f"this {self._value.dtype} tensor cannot be exported through "
                                           f"DLPack: {exc}") from exc
        return provider_call(self._provider, "to_dlpack", self._value, stream, what="export DLPack")

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(DLDeviceType, device_id)`` of the memory (``(1, 0)`` on the host)."""
        if self._provider is None:
            return (KDLCPU, 0)
        dev_type = getattr(self._provider, "dlpack_device_type", None)
        if dev_type is None:
            raise UnsupportedDeviceOperationError(f"{self._provider.name} memory has no DLPack device type")
        return (int(dev_type), int(getattr(self._provider, "device_id", 0) or 0))

    def to_dlpack(self):
        """A DLPack capsule sharing this value's memory (``torch.utils.dlpack.from_dlpack`` takes it)."""
        return self.__dlpack__()

    def __repr__(self) -> str:
        where = self.device_name()
        if self._provider is not None:
            where += f":{int(getattr(self._provider, 'device_id', 0) or 0)}"
        return f"OrtValue(shape={self.shape()}, type={self.data_type()!r}, device={where!r})"
