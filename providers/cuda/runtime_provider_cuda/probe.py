"""Is CUDA usable here? Precise reasons when it is not; never raises.

The checks, in order, each with its own reason:

1. cupy imports (``cupy is not installed`` / ``cupy failed to import``);
2. a CUDA driver is present (``cudaDriverGetVersion`` is 0 without one) and new
   enough for the CUDA runtime cupy was built for (cupy raises
   ``cudaErrorInsufficientDriver`` otherwise);
3. at least one device is visible (``cudaErrorNoDevice``, or a count of 0, e.g.
   with ``CUDA_VISIBLE_DEVICES`` empty).

Availability is claimed only after a device has been opened and a tiny kernel
has run on it, so a half-working installation is reported, not used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

INSTALL_HINT = ("install the extra that matches the driver: pip install "
                "'runtime-provider-cuda[cuda12]' (CUDA 12.x) or 'runtime-provider-cuda[cuda13]' (CUDA 13.x)")


class CUDAUnavailable(Exception):
    """Raised by :func:`check_cuda` with the human reason."""


@dataclass
class DeviceInfo:
    """One CUDA device as ``probe()`` lists it."""

    index: int
    name: str
    compute_capability: str
    total_memory: int

    def __str__(self) -> str:
        return (f"cuda:{self.index} {self.name} (sm_{self.compute_capability}, "
                f"{self.total_memory / 2**30:.1f} GiB)")


@dataclass
class CudaStatus:
    """What :func:`check_cuda` found."""

    cupy_version: str
    runtime_version: int
    driver_version: int
    devices: list = field(default_factory=list)


def _version_str(v: int) -> str:
    """CUDA's integer version (12090) as ``12.9``."""
    return f"{v // 1000}.{(v % 1000) // 10}" if v else "none"


def _cupy_package() -> str:
    try:
        from importlib import metadata

        for name in ("cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x", "cupy"):
            try:
                return f"{name} {metadata.version(name)}"
            except metadata.PackageNotFoundError:
                continue
    except Exception:  # noqa: BLE001
        pass
    return "cupy"


def import_cupy():
    """Import cupy, or raise :class:`CUDAUnavailable` saying why it cannot be imported."""
    try:
        import cupy  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in ("cupy", "cupy_backends"):
            raise CUDAUnavailable(f"cupy is not installed; {INSTALL_HINT}") from None
        raise CUDAUnavailable(f"cupy failed to import: {type(exc).__name__}: {exc}") from None
    except ImportError as exc:
        if "cupy" in str(exc) and getattr(exc, "name", None) in ("cupy", None) and "No module" in str(exc):
            raise CUDAUnavailable(f"cupy is not installed; {INSTALL_HINT}") from None
        raise CUDAUnavailable(f"cupy failed to import (a CUDA library may be missing): "
                              f"{type(exc).__name__}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - any import failure is a reason, never a crash
        raise CUDAUnavailable(f"cupy failed to import: {type(exc).__name__}: {exc}") from None
    return cupy


def _error_name(exc) -> str:
    """The CUDA error name inside a cupy ``CUDARuntimeError`` message."""
    text = str(exc)
    return text.split(":", 1)[0].strip() if text.startswith("cuda") else ""


def check_cuda() -> CudaStatus:
    """Import cupy, check the driver and list the devices; :class:`CUDAUnavailable` otherwise."""
    cupy = import_cupy()
    pkg = _cupy_package()
    try:
        from cupy.cuda import runtime
    except Exception as exc:  # noqa: BLE001
        raise CUDAUnavailable(f"{pkg} has no CUDA runtime module: {type(exc).__name__}: {exc}") from None
    try:
        rt_version = int(runtime.runtimeGetVersion())
    except Exception as exc:  # noqa: BLE001
        raise CUDAUnavailable(f"{pkg} cannot load its CUDA runtime library: "
                              f"{type(exc).__name__}: {exc}") from None
    try:
        drv_version = int(runtime.driverGetVersion())
    except Exception as exc:  # noqa: BLE001
        drv_version = -1
        drv_error = f"{type(exc).__name__}: {exc}"
    else:
        drv_error = ""
    if drv_version == 0:
        raise CUDAUnavailable(
            f"no CUDA driver found (cudaDriverGetVersion reports 0: libcuda is not installed or "
            f"not loadable); {pkg} needs an NVIDIA driver supporting CUDA {_version_str(rt_version)} "
            "or newer")
    if drv_version < 0:
        raise CUDAUnavailable(f"the CUDA driver could not be queried: {drv_error}")
    try:
        count = int(runtime.getDeviceCount())
    except Exception as exc:  # noqa: BLE001
        name = _error_name(exc)
        if name == "cudaErrorInsufficientDriver" or "InsufficientDriver" in str(exc):
            raise CUDAUnavailable(
                f"the CUDA driver is too old (cudaErrorInsufficientDriver): the driver supports CUDA "
                f"{_version_str(drv_version)}, {pkg} needs CUDA {_version_str(rt_version)}; update the "
                "NVIDIA driver or install the cupy wheel of an older CUDA major "
                "(runtime-provider-cuda[cuda12])") from None
        if name == "cudaErrorNoDevice" or "NoDevice" in str(exc):
            raise CUDAUnavailable("no CUDA device found (cudaErrorNoDevice)"
                                  + _visible_devices_note()) from None
        raise CUDAUnavailable(f"CUDA device enumeration failed: {type(exc).__name__}: {exc}") from None
    if count <= 0:
        raise CUDAUnavailable("no CUDA device found (cudaGetDeviceCount reports 0)" + _visible_devices_note())
    devices = []
    for i in range(count):
        try:
            props = runtime.getDeviceProperties(i)
            name = props["name"]
            name = name.decode() if isinstance(name, bytes) else str(name)
            devices.append(DeviceInfo(i, name, f"{props['major']}{props['minor']}", int(props["totalGlobalMem"])))
        except Exception as exc:  # noqa: BLE001
            raise CUDAUnavailable(f"CUDA device {i} cannot be queried: {type(exc).__name__}: {exc}") from None
    try:  # one tiny kernel: a device that enumerates but cannot run is not available
        with cupy.cuda.Device(0):
            ok = int((cupy.arange(4, dtype=cupy.float32) * 2).sum().get())
        if ok != 12:
            raise CUDAUnavailable(f"a test kernel on cuda:0 returned {ok}, expected 12")
    except CUDAUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001
        raise CUDAUnavailable(f"cuda:0 ({devices[0].name}) cannot run a kernel: "
                              f"{type(exc).__name__}: {exc}") from None
    return CudaStatus(getattr(cupy, "__version__", "?"), rt_version, drv_version, devices)


def _visible_devices_note() -> str:
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    return f" (CUDA_VISIBLE_DEVICES={vis!r})" if vis is not None else ""


_STATUS: CudaStatus | None = None


def cuda_status() -> CudaStatus:
    """:func:`check_cuda`, remembered after the first success (devices do not come and go)."""
    global _STATUS
    if _STATUS is None:
        _STATUS = check_cuda()
    return _STATUS
