"""OpenCL platforms and devices: probing, selection by option, and one context per device.

pyopencl is imported lazily (:func:`import_pyopencl`), so importing this module is
cheap. A :class:`DeviceContext` owns the pyopencl context, its in-order command
queue, and the programs built from the package's ``kernels/*.cl`` files, compiled
once per context and cached for the life of the process (every session on the
same device shares them).
"""

from __future__ import annotations

import logging
import operator
import os
import re
import threading
from dataclasses import dataclass
from importlib import resources

import numpy as np

logger = logging.getLogger("runtime_provider_opencl")

INSTALL_HINT = ("pip install 'runtime-provider-opencl[pocl]' installs pyopencl and PoCL, "
                "a CPU OpenCL device")


class OpenCLUnavailable(RuntimeError):
    """No usable OpenCL device: pyopencl is missing, or there is no platform or device."""


class OpenCLGuardError(RuntimeError):
    """Guard mode found a command that wrote outside its buffer (a kernel or copy bug)."""


#: ``RUNTIME_CORE_OPENCL_GUARD=1``: every device buffer sits between two guard zones that are
#: checked after every kernel and copy (a debug mode: it waits for the queue each time)
GUARD_ENV = "RUNTIME_CORE_OPENCL_GUARD"
GUARD_MIN = 256  # bytes of guard on each side (rounded up to the sub-buffer alignment)
GUARD_BYTE = 0xA5
POISON_BYTE = 0xFF  # 0xFFFFFFFF is a NaN in float32, 0xFFFF one in float16
#: bytes per element of the OpenCL C types kernels take pointers to
ELEMENT_SIZES = {"float": 4, "half": 2, "uchar": 1, "char": 1, "ushort": 2, "short": 2, "uint": 4, "int": 4,
                 "ulong": 8, "long": 8}


def import_pyopencl():
    """Import and return ``pyopencl``; :class:`OpenCLUnavailable` with the reason if it fails."""
    try:
        import pyopencl as cl
    except ImportError as exc:
        raise OpenCLUnavailable(f"pyopencl is not installed ({exc}); {INSTALL_HINT}") from exc
    except Exception as exc:  # a broken install, e.g. a missing libOpenCL
        raise OpenCLUnavailable(
            f"pyopencl failed to import: {type(exc).__name__}: {exc}") from exc
    return cl


@dataclass(frozen=True)
class DeviceInfo:
    """One OpenCL device, with its position: ``platform`` and ``device`` indices."""

    platform: int
    device: int
    platform_name: str
    device_name: str
    device_type: str
    version: str
    #: the platform's version string, compacted (``PoCL 3.1+debian, LLVM 15.0.6`` for PoCL)
    platform_version: str = ""

    def __str__(self) -> str:
        where = f"{self.platform_name}, {self.platform_version}" if self.platform_version else self.platform_name
        return f"{self.platform}:{self.device} {self.device_name} ({self.device_type}, {where}, {self.version})"


def platform_version(p) -> str:
    """The platform's version, short: PoCL's ``OpenCL 3.0 PoCL 3.1+debian  Linux, ..., LLVM 15.0.6,
    ...`` becomes ``PoCL 3.1+debian, LLVM 15.0.6`` (which PoCL, built on which LLVM)."""
    try:
        text = " ".join(str(p.version).split())
    except Exception:  # noqa: BLE001 - a platform without the query
        return ""
    pocl = re.search(r"PoCL \S+", text)
    if pocl is None:
        return text
    llvm = re.search(r"LLVM [0-9][\w.]*", text)
    return pocl.group(0) + (f", {llvm.group(0)}" if llvm else "")


def _type_name(cl, dev) -> str:
    t = dev.type
    for flag, name in ((cl.device_type.GPU, "GPU"), (cl.device_type.ACCELERATOR, "accelerator"),
                       (cl.device_type.CPU, "CPU")):
        if t & flag:
            return name
    return "other"


#: environment defaults of the ``platform`` / ``device`` options (same syntax), for runs that
#: cannot pass options (``runtime-core conformance``, a test suite pinned to one of two PoCLs)
PLATFORM_ENV = "RUNTIME_CORE_OPENCL_PLATFORM"
DEVICE_ENV = "RUNTIME_CORE_OPENCL_DEVICE"


def survey() -> tuple[list[tuple[object, list[object]]], list[str]]:
    """``([(platform, [usable devices])], [why each other device is unusable])``.

    Platforms come in the ICD loader's order. A device is usable when it is available and
    its compiler builds a kernel (:func:`build_problem`: one one-line build per device,
    once per process). Raises :class:`OpenCLUnavailable` when there is no platform."""
    cl = import_pyopencl()
    try:
        platforms = cl.get_platforms()
    except Exception as exc:  # clGetPlatformIDs fails with PLATFORM_NOT_FOUND_KHR
        raise OpenCLUnavailable(
            f"no OpenCL platform found ({type(exc).__name__}: {exc}); install an OpenCL driver "
            f"(ICD), or {INSTALL_HINT}") from exc
    if not platforms:
        raise OpenCLUnavailable(f"no OpenCL platform found; install an OpenCL driver (ICD), or {INSTALL_HINT}")
    out = []
    unusable = []
    for p in platforms:
        try:
            devs = [d for d in p.get_devices() if d.available]
        except Exception:  # DEVICE_NOT_FOUND on a platform with no device
            devs = []
        usable = []
        pv = platform_version(p)
        where = f"{p.name.strip()}{', ' + pv if pv else ''}"
        for d in devs:
            why = build_problem(cl, d)
            if why is None:
                usable.append(d)
            else:
                unusable.append(f"{d.name.strip()!r} ({where}): {why}")
                logger.info("OpenCL device %r of %r is skipped: %s", d.name.strip(), where, why)
        out.append((p, usable))
    return out, unusable


def enumerate_devices() -> list[tuple[object, list[object]]]:
    """``[(platform, [usable devices])]`` as pyopencl objects (see :func:`survey`); raises
    :class:`OpenCLUnavailable`, naming every device and why it is unusable, when no device is."""
    out, unusable = survey()
    if not any(devs for _, devs in out):
        names = ", ".join(repr(p.name.strip()) + (f" [{platform_version(p)}]" if platform_version(p) else "")
                          for p, _ in out)
        if unusable:
            raise OpenCLUnavailable(f"OpenCL platform(s) {names} found, but no usable device: "
                                    + "; ".join(unusable))
        raise OpenCLUnavailable(f"OpenCL platform(s) {names} found, but no available device")
    return out


#: a kernel every OpenCL C compiler builds; a device whose compiler cannot is not usable
_PROBE_KERNEL = "__kernel void rc_probe(__global float *a) { a[get_global_id(0)] += 1.0f; }"
_BUILD_PROBLEMS: dict = {}
_BUILD_LOCK = threading.Lock()


def build_problem(cl, dev) -> str | None:
    """Why ``dev``'s OpenCL C compiler cannot build a one-line kernel, or None when it can.

    Checked once per device and process. PoCL, for one, compiles through its own LLVM, which
    cannot target a CPU newer than itself (PoCL 3.0's LLVM 14 on an AMD family-0x1A CPU:
    "unknown target CPU 'generic'"); such a device is listed by the driver but every build on
    it fails, so it is reported unusable here instead of failing each session later."""
    try:
        key = (dev.platform.name, dev.name, dev.driver_version)
    except Exception:  # noqa: BLE001 - an object without the queries: check it each time
        key = None
    with _BUILD_LOCK:
        if key is not None and key in _BUILD_PROBLEMS:
            return _BUILD_PROBLEMS[key]
        try:
            cl.Program(cl.Context([dev]), _PROBE_KERNEL).build()
            why = None
        except Exception as exc:  # noqa: BLE001 - any failure makes the device unusable
            text = str(exc)
            errors = [ln.strip() for ln in text.splitlines() if "error" in ln.lower() and ln.strip()]
            detail = next((ln for ln in errors if ln.lower().startswith("error:")), errors[0] if errors else text)
            why = f"its OpenCL C compiler cannot build a kernel ({type(exc).__name__}: {detail[:300]})"
        if key is not None:
            _BUILD_PROBLEMS[key] = why
        return why


def _info(cl, pi, di, p, d) -> DeviceInfo:
    return DeviceInfo(pi, di, p.name.strip(), d.name.strip(), _type_name(cl, d), d.version.strip(),
                      platform_version(p))


def list_devices() -> list[DeviceInfo]:
    """Every usable device on every platform (see :func:`enumerate_devices`); raises
    :class:`OpenCLUnavailable`."""
    cl = import_pyopencl()
    infos = []
    for pi, (p, devs) in enumerate(enumerate_devices()):
        for di, d in enumerate(devs):
            infos.append(_info(cl, pi, di, p, d))
    return infos


def _choices(platforms) -> str:
    lines = []
    for pi, (p, devs) in enumerate(platforms):
        ds = ", ".join(f"{di}: {d.name.strip()!r}" for di, d in enumerate(devs)) or "no usable device"
        lines.append(f"platform {pi}: {p.name.strip()!r} [{platform_version(p)}] (devices {ds})")
    return "; ".join(lines)


def _match(value: str, items: list, names, what: str, platforms, prefer=None) -> int:
    value = str(value).strip()
    if value.lstrip("-").isdigit():
        idx = int(value)
        if 0 <= idx < len(items):
            return idx
        raise ValueError(f"{what} index {idx} is out of range (0..{len(items) - 1}); "
                         f"available: {_choices(platforms)}")
    low = value.lower()
    hits = [i for i, item in enumerate(items) if any(low in str(n).lower() for n in names(item))]
    if not hits:
        raise ValueError(f"no OpenCL {what} matches {value!r}; available: {_choices(platforms)}")
    # two PoCLs share a name: the first match that has a usable device
    return next((i for i in hits if prefer is None or prefer(i)), hits[0])


def _option(value, env: str):
    """An option's value, else its environment default, else None."""
    if value is not None and str(value).strip() != "":
        return value
    return os.environ.get(env, "").strip() or None


def select_device(platform: str | None = None, device: str | None = None) -> DeviceInfo:
    """Resolve the ``platform`` / ``device`` options (an index or a name substring).

    ``platform`` matches a platform's name, vendor or version (``"debian"`` or ``"3.0"``
    pick one of two PoCLs); unset, it defaults to ``$RUNTIME_CORE_OPENCL_PLATFORM``, and
    ``device`` to ``$RUNTIME_CORE_OPENCL_DEVICE``. Without them the provider takes the first
    usable device (one whose compiler builds a kernel), trying platforms in the ICD loader's
    order, a GPU before any other device: the first platform with a usable GPU and its first
    usable GPU, else the first platform with a usable device and its first one. A device name
    given without a platform is searched on every platform. Raises ``ValueError`` listing
    the choices for an option that matches nothing, and :class:`OpenCLUnavailable` (with
    every device's reason) when no device is usable.
    """
    cl = import_pyopencl()
    platforms = enumerate_devices()
    platform = _option(platform, PLATFORM_ENV)
    device = _option(device, DEVICE_ENV)

    def is_gpu(d) -> bool:
        return bool(d.type & cl.device_type.GPU)

    if platform is not None:
        pi = _match(platform, [p for p, _ in platforms],
                    lambda p: (p.name, p.vendor, getattr(p, "version", "")), "platform", platforms,
                    prefer=lambda i: bool(platforms[i][1]))
        if not platforms[pi][1]:
            raise ValueError(f"OpenCL platform {pi} ({platforms[pi][0].name.strip()!r}) has no "
                             f"usable device; available: {_choices(platforms)}")
        search = [pi]
    else:
        with_devices = [i for i, (_, devs) in enumerate(platforms) if devs]
        with_gpu = [i for i in with_devices if any(is_gpu(d) for d in platforms[i][1])]
        search = with_gpu[:1] or with_devices[:1]
        if device is not None and not str(device).strip().lstrip("-").isdigit():
            search = with_devices  # a device name: look on every platform
    if device is not None:
        value = str(device).strip()
        if value.lstrip("-").isdigit():
            pi = search[0]
            di = _match(value, platforms[pi][1], lambda d: (d.name,), f"device (platform {pi})",
                        platforms)
        else:
            low = value.lower()
            hits = [(pi, di) for pi in search for di, d in enumerate(platforms[pi][1])
                    if low in d.name.lower()]
            if not hits:
                raise ValueError(f"no OpenCL device matches {value!r}; available: {_choices(platforms)}")
            pi, di = hits[0]
    else:
        pi = search[0]
        devs = platforms[pi][1]
        di = next((i for i, d in enumerate(devs) if is_gpu(d)), 0)
    p, devs = platforms[pi]
    return _info(cl, pi, di, p, devs[di])


# -- contexts -------------------------------------------------------------------------

KERNEL_FILES = ("elementwise.cl", "matmul.cl", "reduce.cl", "conv.cl", "copy.cl", "pool.cl", "index.cl")


def kernel_source(filename: str) -> str:
    """The OpenCL C source of one of the package's ``kernels/*.cl`` files (with ``common.h``)."""
    kernels = resources.files(__package__).joinpath("kernels")
    common = kernels.joinpath("common.h").read_text(encoding="utf-8")
    return common + "\n" + kernels.joinpath(filename).read_text(encoding="utf-8")


class DeviceContext:
    """A pyopencl context, queue and program cache for one device (shared by sessions).

    ``launch`` is the only way kernels are enqueued: setting a kernel's arguments and
    enqueueing it happen under one lock, because a pyopencl ``Kernel`` object holds
    its arguments and is shared by every thread that runs a session on this device.
    """

    def __init__(self, info: DeviceInfo):
        cl = import_pyopencl()
        self.cl = cl
        self.info = info
        _, devs = enumerate_devices()[info.platform]
        self.device = devs[info.device]
        self.context = cl.Context([self.device])
        self.queue = cl.CommandQueue(self.context, self.device)
        self.lock = threading.Lock()
        self._build_lock = threading.Lock()
        self._programs: dict[str, object] = {}
        self._kernels: dict[tuple[str, str], object] = {}
        self._arg_sizes: dict[int, tuple | None] = {}  # id(kernel) -> pointee sizes per argument
        self.max_work_group_size = int(self.device.max_work_group_size)
        self.tile = 16 if self.max_work_group_size >= 256 else 8
        self.local_1d = max(1, min(64, self.max_work_group_size))
        self.max_alloc = int(self.device.max_mem_alloc_size)
        # float16 tensors are stored as half and read/written with vload_half/vstore_half,
        # which are core OpenCL C (no cl_khr_fp16 needed: kernels compute in float); the
        # extension is only enabled where the device has it
        self.fp16_ext = "cl_khr_fp16" in (self.device.extensions or "").split()
        self.fp16 = True
        self.builds = 0  # programs built by this context (tests check the cache)
        # host<->device traffic through this context (tests count it): uploads and downloads
        # with their bytes, and copies between two buffers of the device
        self._stats_lock = threading.Lock()
        self.transfers = {"uploads": 0, "bytes_up": 0, "downloads": 0, "bytes_down": 0,
                          "device_copies": 0}
        # debug mode: every buffer sits between two guard zones, checked after every command
        self.guard = os.environ.get(GUARD_ENV, "") == "1"
        align = max(1, int(self.device.mem_base_addr_align) // 8)  # a sub-buffer's origin alignment
        self.guard_bytes = -(-GUARD_MIN // align) * align
        self.guard_checks = 0  # commands whose buffers' guards were checked (tests look)
        self.dummy = self.buffer(4)  # bound to the pointer arguments of absent optional inputs

    def build_options(self, real: str = "float") -> list[str]:
        # arg info: the element type of every pointer argument, checked against its tensor
        return [f"-DTS={self.tile}", "-cl-kernel-arg-info"] + (["-DHALF=1"] if real == "half" else [])

    def program(self, filename: str, real: str = "float"):
        """The built program of ``kernels/<filename>`` for element type ``real`` (``float``
        or ``half``), compiled on first use only."""
        key = filename if real == "float" else f"{filename}:{real}"
        prg = self._programs.get(key)
        if prg is not None:
            return prg
        with self._build_lock:
            prg = self._programs.get(key)
            if prg is None:
                src = kernel_source(filename)
                if real == "half" and self.fp16_ext:
                    src = "#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n" + src
                try:
                    prg = self.cl.Program(self.context, src).build(options=self.build_options(real))
                except self.cl.Error as exc:
                    raise RuntimeError(f"OpenCL build of kernels/{filename} failed on "
                                       f"{self.info.device_name}: {exc}") from exc
                self.builds += 1
                logger.debug("built kernels/%s (%s) for %s", filename, real, self.info)
                self._programs[key] = prg
        return prg

    def kernel(self, filename: str, name: str, real: str = "float"):
        """The ``cl.Kernel`` ``name`` of ``kernels/<filename>`` (one object per context)."""
        key = (filename, name, real)
        k = self._kernels.get(key)
        if k is None:
            prg = self.program(filename, real)
            with self._build_lock:
                k = self._kernels.get(key)
                if k is None:
                    k = self.cl.Kernel(prg, name)
                    self._arg_sizes[id(k)] = self._pointee_sizes(k, real)
                    self._kernels[key] = k
        return k

    def _pointee_sizes(self, kernel, real: str) -> tuple | None:
        """Per argument, the element size of a ``__global`` pointer (None for other
        arguments); None for the whole kernel when the driver gives no argument info."""
        cl = self.cl
        sizes = []
        try:
            for i in range(kernel.num_args):
                if kernel.get_arg_info(i, cl.kernel_arg_info.ADDRESS_QUALIFIER) != \
                        cl.kernel_arg_address_qualifier.GLOBAL:
                    sizes.append(None)
                    continue
                t = kernel.get_arg_info(i, cl.kernel_arg_info.TYPE_NAME).replace("const", "").strip()
                t = t.rstrip("*").strip()
                sizes.append((2 if real == "half" else 4) if t == "real" else ELEMENT_SIZES.get(t))
        except Exception as exc:  # noqa: BLE001 - a driver without kernel argument info
            logger.debug("no argument info for %s: %s", kernel.function_name, exc)
            return None
        return tuple(sizes)

    def arg_element_sizes(self, kernel) -> tuple | None:
        """What :meth:`_pointee_sizes` found for a kernel made by :meth:`kernel`."""
        return self._arg_sizes.get(id(kernel))

    def launch(self, kernel, global_size, local_size, args) -> None:
        """Set ``args`` and enqueue ``kernel`` atomically (see the class docstring)."""
        with self.lock:
            kernel.set_args(*args)
            self.cl.enqueue_nd_range_kernel(self.queue, kernel, global_size, local_size)
        if self.guard:
            self.check_guards([a for a in args if isinstance(a, self.cl.Buffer)],
                              f"kernel {kernel.function_name} (global size {tuple(global_size)})")

    def _count(self, kind: str, nbytes: int = 0, bytes_key: str | None = None) -> None:
        with self._stats_lock:
            self.transfers[kind] += 1
            if bytes_key:
                self.transfers[bytes_key] += int(nbytes)

    def buffer(self, nbytes: int, hostbuf=None):
        """A device buffer of ``nbytes`` (at least 1), filled from ``hostbuf`` when given.

        The size is checked as a Python integer against the device's largest allocation, so
        a size computed from huge dims fails here with the numbers instead of wrapping. A
        ``hostbuf`` is copied when the buffer is created (COPY_HOST_PTR), so the caller may
        release it at once."""
        mf = self.cl.mem_flags
        if hostbuf is not None:
            hostbuf = np.ascontiguousarray(hostbuf)
            nbytes = hostbuf.nbytes
        nbytes = max(1, operator.index(nbytes))
        if nbytes > self.max_alloc:
            raise MemoryError(f"an OpenCL buffer of {nbytes} bytes exceeds the largest allocation of "
                              f"{self.info.device_name} ({self.max_alloc} bytes)")
        if self.guard:
            return self._guarded_buffer(nbytes, hostbuf)
        if hostbuf is not None:
            buf = self.cl.Buffer(self.context, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=hostbuf)
            self._count("uploads", hostbuf.nbytes, "bytes_up")
            return buf
        return self.cl.Buffer(self.context, mf.READ_WRITE, size=nbytes)

    # -- guard mode (RUNTIME_CORE_OPENCL_GUARD=1) ----------------------------------------
    def _guarded_buffer(self, nbytes: int, hostbuf):
        """A sub-buffer of ``nbytes`` inside a parent with ``guard_bytes`` of GUARD_BYTE on each
        side; without ``hostbuf`` its contents are POISON_BYTE (NaN as float32/float16), so a
        kernel that reads an element nobody wrote yields NaN instead of a plausible number."""
        g = self.guard_bytes
        host = np.full(g + nbytes + g, GUARD_BYTE, np.uint8)
        if hostbuf is None:
            host[g:g + nbytes] = POISON_BYTE
        else:
            host[g:g + nbytes] = hostbuf.reshape(-1).view(np.uint8)
            self._count("uploads", hostbuf.nbytes, "bytes_up")
        mf = self.cl.mem_flags
        parent = self.cl.Buffer(self.context, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=host)
        return parent.get_sub_region(g, nbytes)

    def check_guards(self, buffers, what: str) -> None:
        """Wait for the queue, then raise :class:`OpenCLGuardError` when a guard zone around
        any of ``buffers`` (guarded sub-buffers; others are ignored) was written by ``what``."""
        cl = self.cl
        self.queue.finish()
        g = self.guard_bytes
        for i, buf in enumerate(buffers):
            try:
                parent = buf.get_info(cl.mem_info.ASSOCIATED_MEMOBJECT)
                offset = int(buf.get_info(cl.mem_info.OFFSET))
            except Exception:  # noqa: BLE001 - not a memory object of ours
                continue
            if parent is None or offset != g or parent.size != buf.size + 2 * g:
                continue
            zones = np.empty((2, g), np.uint8)
            with self.lock:
                self.cl.enqueue_copy(self.queue, zones[0], parent, src_offset=0, is_blocking=True)
                self.cl.enqueue_copy(self.queue, zones[1], parent, src_offset=g + buf.size, is_blocking=True)
            bad = zones != GUARD_BYTE
            if bad.any():
                before = int(bad[0].sum())
                after = int(bad[1].sum())
                last = int(np.nonzero(bad[1])[0].max()) + 1 if after else 0
                raise OpenCLGuardError(
                    f"{what} wrote outside buffer argument {i} ({buf.size} bytes): {before} guard "
                    f"byte(s) changed before it, {after} after it (up to {last} bytes past its end)")
        with self._stats_lock:
            self.guard_checks += 1

    def read(self, host, buf) -> None:
        """Blocking copy of ``buf`` into the host array ``host`` (waits for queued kernels).

        Every host<->device copy here is blocking: a non-blocking copy would need its host
        array kept alive until the copy's event completes, and none is needed."""
        if host.nbytes > buf.size:
            raise ValueError(f"reading {host.nbytes} bytes from an OpenCL buffer of {buf.size}")
        self.cl.enqueue_copy(self.queue, host, buf, is_blocking=True)
        self._count("downloads", host.nbytes, "bytes_down")

    def write(self, buf, host) -> None:
        """Blocking copy of the contiguous host array ``host`` into the existing ``buf``
        (queued after the kernels already enqueued, so they read the old contents)."""
        if host.nbytes > buf.size:
            raise ValueError(f"writing {host.nbytes} bytes into an OpenCL buffer of {buf.size}")
        self.cl.enqueue_copy(self.queue, buf, host, is_blocking=True)
        self._count("uploads", host.nbytes, "bytes_up")
        if self.guard:
            self.check_guards([buf], "a host-to-device copy")

    def copy(self, dst, src, nbytes: int) -> None:
        """Copy ``nbytes`` from buffer ``src`` to buffer ``dst`` on the device (queued in order)."""
        nbytes = operator.index(nbytes)
        if nbytes > min(dst.size, src.size):
            raise ValueError(f"copying {nbytes} bytes between OpenCL buffers of {src.size} and {dst.size}")
        self.cl.enqueue_copy(self.queue, dst, src, byte_count=nbytes)
        self._count("device_copies")
        if self.guard:
            self.check_guards([dst], "a device-to-device copy")

    def owns(self, buf) -> bool:
        """Whether the ``cl.Buffer`` ``buf`` belongs to this context."""
        try:
            return buf.context == self.context
        except Exception:  # noqa: BLE001 - not a memory object
            return False

    def finish(self) -> None:
        self.queue.finish()


_CONTEXTS: dict[tuple[int, int], DeviceContext] = {}
_CTX_LOCK = threading.Lock()


def get_context(info: DeviceInfo) -> DeviceContext:
    """The process-wide :class:`DeviceContext` of the device ``info`` names."""
    key = (info.platform, info.device)
    with _CTX_LOCK:
        ctx = _CONTEXTS.get(key)
        if ctx is None:
            ctx = DeviceContext(info)
            _CONTEXTS[key] = ctx
        return ctx
