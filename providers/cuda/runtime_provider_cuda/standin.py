"""A numpy stand-in for cupy, to test device code on machines without a GPU.

:class:`DeviceStandIn` is an ``ndarray`` subclass that behaves like a cupy array
does towards numpy: through NEP 13/18 (``__array_ufunc__``, ``__array_function__``)
every numpy function given a stand-in returns stand-ins, exactly as
``np.add(cupy_array, ...)`` returns a cupy array. Functions that cupy does not
implement (when cupy is importable, its namespace is checked) raise ``TypeError``
as they would on a GPU. What creates host memory from scratch (``np.empty``,
``np.asarray``, ``np.array``, ``np.arange`` without ``like=``, scipy) returns a
plain ``ndarray``: so a kernel is *array-module generic* exactly when all its
outputs are still stand-ins.

:data:`xp` is the stand-in array module (``xp.asarray`` makes a stand-in, like
``cupy.asarray``), and :class:`StandInBackend` the provider back end built on it.
Test tooling only: no provider registered by this package uses it.
"""

from __future__ import annotations

import contextlib
import functools
import types

import numpy as np

__all__ = ["DeviceStandIn", "StandInBackend", "is_standin", "strict_host_conversion", "xp"]


def _cupy_namespace():
    try:
        import cupy

        return cupy
    except Exception:  # noqa: BLE001 - without cupy every numpy function is allowed
        return None


_CUPY = _cupy_namespace()


@functools.lru_cache(maxsize=None)
def _cupy_has(module: str, name: str) -> bool:
    if _CUPY is None:
        return True
    parts = (module or "numpy").split(".")
    if parts[0] != "numpy":
        return False
    obj = _CUPY
    for p in parts[1:]:
        if p.startswith("_"):  # numpy.lib._shape_base_impl etc.: public name lives at the top
            continue
        obj = getattr(obj, p, None)
        if obj is None:
            return False
    return hasattr(obj, name) or hasattr(_CUPY, name)


def _unwrap(x):
    if isinstance(x, DeviceStandIn):
        return x.view(np.ndarray)
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v) for v in x)
    if isinstance(x, dict):
        return {k: _unwrap(v) for k, v in x.items()}
    return x


def _wrap(x):
    if type(x) is np.ndarray:
        return x.view(DeviceStandIn)
    if isinstance(x, np.generic):  # cupy returns 0-d arrays where numpy returns scalars
        return np.asarray(x).view(DeviceStandIn)
    if isinstance(x, tuple):
        return tuple(_wrap(v) for v in x)
    if isinstance(x, list):
        return [_wrap(v) for v in x]
    return x


class DeviceStandIn(np.ndarray):
    """Device memory on a machine without a device: numpy data, cupy's dispatch rules."""

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        if _CUPY is not None:
            cu = getattr(_CUPY, ufunc.__name__, None)
            if cu is None or (method != "__call__" and not hasattr(cu, method)):
                return NotImplemented
        args = _unwrap(inputs)
        if out is not None:
            kwargs["out"] = tuple(_unwrap(o) for o in out)
        res = getattr(ufunc, method)(*args, **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return _wrap(res)

    def __array_function__(self, func, types_, args, kwargs):
        if not _cupy_has(func.__module__, func.__name__):
            raise TypeError(f"cupy has no {func.__module__}.{func.__name__}: it would not run on CUDA")
        return _wrap(func(*_unwrap(args), **_unwrap(kwargs)))

    def get(self, stream=None):
        """Like ``cupy.ndarray.get``: a host copy."""
        return np.array(self.view(np.ndarray), copy=True)


def is_standin(x) -> bool:
    return isinstance(x, DeviceStandIn)


# -- the array module ------------------------------------------------------------------

def _creator(name):
    fn = getattr(np, name)

    @functools.wraps(fn)
    def make(*args, **kwargs):
        return _wrap(np.asarray(fn(*_unwrap(args), **_unwrap(kwargs))))
    return make


def _as_strided(x, shape=None, strides=None):
    return _wrap(np.lib.stride_tricks.as_strided(_unwrap(x), shape=shape, strides=strides))


class _StandInModule(types.SimpleNamespace):
    """``cupy`` for the stand-in: creation functions return stand-ins; the rest is numpy
    (whose functions return stand-ins when given one)."""

    ndarray = DeviceStandIn

    def __getattr__(self, name):
        return getattr(np, name)


_CREATORS = ("asarray", "array", "ascontiguousarray", "empty", "zeros", "ones", "full", "arange",
             "eye", "empty_like", "zeros_like", "ones_like", "full_like", "linspace")
xp = _StandInModule(**{n: _creator(n) for n in _CREATORS})
xp.__name__ = "runtime_provider_cuda.standin.xp"
xp.lib = types.SimpleNamespace(stride_tricks=types.SimpleNamespace(as_strided=_as_strided))
xp.asnumpy = lambda a, stream=None: np.array(_unwrap(a), copy=True)


@contextlib.contextmanager
def strict_host_conversion():
    """Make ``np.asarray``/``np.array``/``np.ascontiguousarray`` of a stand-in raise, as
    cupy's implicit conversion does ("Implicit conversion to a NumPy array is not allowed")."""
    saved = {n: getattr(np, n) for n in ("asarray", "array", "ascontiguousarray", "asanyarray")}

    def guard(name, fn):
        @functools.wraps(fn)
        def call(a, *args, **kwargs):
            if isinstance(a, DeviceStandIn) or (isinstance(a, (list, tuple)) and any(
                    isinstance(v, DeviceStandIn) for v in a)):
                raise TypeError(f"np.{name} of a device array: implicit conversion to a NumPy array "
                                "is not allowed (cupy raises here)")
            return fn(a, *args, **kwargs)
        return call

    for n, fn in saved.items():
        setattr(np, n, guard(n, fn))
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(np, n, fn)


class StandInBackend:
    """The provider back end on :data:`xp` (host memory posing as a device)."""

    name = "standin"
    xp = xp

    def __init__(self, device_id: int = 0):
        self.device_id = device_id
        self.transfers = {"to_device": 0, "to_host": 0}
        self.cuda_kernels = False  # no RawKernel / ElementwiseKernel on the stand-in

    def is_device(self, a) -> bool:
        return isinstance(a, DeviceStandIn)

    def to_device(self, host):
        self.transfers["to_device"] += 1
        return np.array(_unwrap(host), copy=True).view(DeviceStandIn)

    def to_host(self, dev):
        if not isinstance(dev, DeviceStandIn):
            raise TypeError(f"copy_to_host got {type(dev).__name__}, not a device array")
        self.transfers["to_host"] += 1
        return np.array(dev.view(np.ndarray), copy=True)

    def empty(self, shape, dtype):
        return np.empty(shape, dtype).view(DeviceStandIn)

    def activate(self):
        return contextlib.nullcontext()

    def synchronize(self) -> None:
        return None
