"""Feed validation: names, element types, ranks and dims, before anything runs."""

from __future__ import annotations

import difflib
import os

import numpy as np

from ..errors import (InputNameError, InputShapeError, InputTooLargeError, InputTypeError, MissingInputError,
                      OutputNameError)


def _nearest(name: str, options) -> str:
    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""


def _fmt_shape(shape) -> str:
    if shape is None:
        return "unknown"
    return "(" + ", ".join(repr(d) if isinstance(d, str) else ("?" if d is None else str(d))
                           for d in shape) + ("," if len(shape) == 1 else "") + ")"


class InputSpec:
    """What one model input accepts, precomputed at session creation."""

    __slots__ = ("dtype", "kind", "name", "optional", "plain", "shape", "type_str")

    def __init__(self, name, dtype, shape, kind, type_str, optional=False):
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.kind = kind
        self.type_str = type_str
        self.optional = optional
        # a plain numeric tensor: a feed of exactly its dtype needs only the shape check
        self.plain = (kind == "tensor" and dtype is not None and dtype != np.dtype(object)
                      and not type_str.startswith(("map(", "seq(map(")))


def check_output_names(names, known: list[str]) -> list[str]:
    """The outputs to compute: ``None`` or an empty list means all (as in onnxruntime)."""
    if names is None:
        return list(known)
    if isinstance(names, str):
        names = [names]
    out = list(names)
    if not out:
        return list(known)
    for n in out:
        if n not in known:
            raise OutputNameError(f"output {n!r} is not an output of this model{_nearest(n, known)} "
                                  f"(outputs: {', '.join(known)})")
    return out


def validate_feeds(input_feed, specs: dict[str, InputSpec], max_bytes: int | None = None) -> dict:
    """Return the feeds as native, C-contiguous arrays, or raise a typed error. A feed that
    must be copied into more than ``max_bytes`` (default :func:`default_max_bytes`) is refused."""
    if not hasattr(input_feed, "items"):
        raise InputTypeError(f"input_feed must be a dict of input name to array, got {type(input_feed).__name__}")
    expected = list(specs)
    feeds = {}
    for name, value in input_feed.items():
        spec = specs.get(name)
        if spec is None:
            raise InputNameError(
                f"{name!r} is not an input of this model{_nearest(str(name), expected)} "
                f"(expected inputs: {', '.join(expected) or 'none'})")
        feeds[name] = _convert(spec, value, max_bytes)
    missing = [n for n, s in specs.items() if n not in feeds and not s.optional]
    for n, s in specs.items():
        if n not in feeds and s.optional:
            feeds[n] = None  # an optional input not fed is an empty optional
    if missing:
        raise MissingInputError(
            f"missing input(s) {', '.join(repr(m) for m in missing)}; the model needs "
            + ", ".join(f"{n} {specs[n].type_str} {_fmt_shape(specs[n].shape)}" for n in missing))
    return feeds


_MAP_KEYS = {"string": str, "int64": int}
_MAP_VALUES = {"float": np.float32, "double": np.float64, "int64": np.int64, "string": object}


def _map_types(type_str: str):
    """``map(K,tensor(V))`` -> (key kind, value dtype); None when not a map of those types."""
    if not type_str.startswith("map(") or ",tensor(" not in type_str:
        return None
    key, _, rest = type_str[4:].partition(",tensor(")
    value = rest.rstrip(")")
    if key not in _MAP_KEYS or value not in _MAP_VALUES:
        return None
    return key, value


def _convert_map(name: str, type_str: str, value) -> dict:
    """One map feed as onnxruntime takes it: a dict, keys of the key type (str, or integers for
    int64), values converted as Python numbers (``float(v)``, ``int(v)``) or strings."""
    types = _map_types(type_str)
    if types is None:
        raise InputTypeError(f"input {name!r} has type {type_str}, which runtime-core cannot feed")
    if not isinstance(value, dict):
        raise InputTypeError(f"input {name!r} expects {type_str} (a dict), got {type(value).__name__}")
    key, vtype = types
    out = {}
    for k, v in value.items():
        if key == "string" and not isinstance(k, str):
            raise InputTypeError(f"input {name!r} expects {type_str}: key {k!r} is not a str")
        if key == "int64":
            if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
                raise InputTypeError(f"input {name!r} expects {type_str}: key {k!r} is not an integer")
            k = int(k)
        try:
            if vtype == "string":
                if not isinstance(v, str):
                    raise TypeError(f"{type(v).__name__} is not a str")
            elif isinstance(v, (str, bytes)):
                raise TypeError(f"{type(v).__name__} is not a number")
            elif vtype == "int64":
                if isinstance(v, np.ndarray):  # onnxruntime reads a dict of arrays as map(K,tensor(float))
                    raise TypeError("a numpy array is not an int64 value (pass an int or a numpy integer "
                                    "scalar, as onnxruntime requires)")
                v = int(v)
            else:
                v = float(v)
        except (TypeError, ValueError) as exc:
            raise InputTypeError(f"input {name!r} expects {type_str}: the value of key {k!r} ({v!r}) "
                                 f"cannot be converted: {exc}") from exc
        out[k] = v
    return out


def _convert_maps(spec: InputSpec, value):
    """A ``map(...)`` feed (a dict) or a ``seq(map(...))`` feed (a list of dicts)."""
    if spec.kind == "map":
        return _convert_map(spec.name, spec.type_str, value)
    if not isinstance(value, (list, tuple)):
        raise InputTypeError(f"input {spec.name!r} expects {spec.type_str} (a list of dicts), "
                             f"got {type(value).__name__}")
    inner = spec.type_str[len("seq("):-1]
    return [_convert_map(spec.name, inner, v) for v in value]


def _to_string_tensor(name: str, type_str: str, value: np.ndarray) -> np.ndarray:
    """A string-tensor feed as onnxruntime reads one: ``str(x)`` of each element of an object
    array (so ``nan`` becomes ``'nan'``, ``None`` ``'None'``), UTF-8 decoded bytes of an ``S``
    array, the strings of a ``U`` array."""
    kind = value.dtype.kind
    if kind == "U":
        return value.astype(object)
    if kind == "S":
        return np.array(np.frompyfunc(lambda b: b.decode("utf-8", errors="surrogateescape"), 1, 1)(value),
                        dtype=object)
    if kind == "O":
        if value.size and not all(type(v) is str for v in value.flat):
            value = np.array(np.frompyfunc(str, 1, 1)(value), dtype=object)
        return value
    raise InputTypeError(f"input {name!r} expects {type_str}, got an array of {value.dtype}")


def _convert(spec: InputSpec, value, max_bytes: int | None = None):
    if spec.plain and type(value) is np.ndarray and value.dtype is spec.dtype and value.flags.c_contiguous:
        return _check_shape(spec, value)  # the common feed, checked once per run
    name = spec.name
    if spec.type_str.startswith(("map(", "seq(map(")):
        return _convert_maps(spec, value)
    if spec.kind == "sequence":
        if not isinstance(value, (list, tuple)):
            raise InputTypeError(f"input {name!r} expects {spec.type_str} (a list of arrays), "
                                 f"got {type(value).__name__}")
        return [_convert(InputSpec(name, spec.dtype, None, "tensor", spec.type_str), v, max_bytes) for v in value]
    if spec.kind == "optional":
        if value is None:
            return None
        if spec.type_str.startswith("optional(seq("):  # an optional holding a sequence
            inner = spec.type_str[len("optional("):-1]
            return _convert(InputSpec(name, spec.dtype, None, "sequence", inner), value, max_bytes)
    if hasattr(value, "_rt_device_value"):  # an OrtValue
        value = value.numpy()
    if isinstance(value, (list, tuple)) and spec.dtype is not None and spec.dtype != np.dtype(object):
        try:  # onnxruntime makes a tensor of the input's type from a (nested) list
            value = np.array(value, dtype=spec.dtype)
        except (ValueError, TypeError) as exc:
            raise InputTypeError(f"input {name!r} expects {spec.type_str}; the list given cannot become "
                                 f"one (ragged or not numbers): {exc}") from None
    if not isinstance(value, np.ndarray):
        if isinstance(value, (np.generic, int, float, bool, str, list, tuple)):
            try:
                value = np.asarray(value)
            except ValueError as exc:  # a ragged list
                raise InputTypeError(f"input {name!r} expects {spec.type_str}; the list given cannot "
                                     f"become a tensor (ragged?): {exc}") from None
        else:
            raise InputTypeError(f"input {name!r} expects a numpy array of {spec.type_str}, "
                                 f"got {type(value).__name__}")
    want = spec.dtype
    got = value.dtype
    if want is not None:
        if want == np.dtype(object):
            if got.kind not in "OUS":
                raise InputTypeError(f"input {name!r} expects {spec.type_str}, got an array of {got}")
            if got.kind != "O":
                _check_copy(name, value, max_bytes)
            value = _to_string_tensor(name, spec.type_str, value)
        elif got != want:
            if got.kind == want.kind and got.itemsize == want.itemsize and got.newbyteorder("=") == want:
                _check_copy(name, value, max_bytes)
                value = value.astype(want)  # non-native byte order: same values
            else:
                raise InputTypeError(
                    f"input {name!r} expects {spec.type_str} (numpy {want}), got an array of {got}; "
                    f"convert it with .astype(numpy.{want.name})")
    if not value.dtype.isnative:
        _check_copy(name, value, max_bytes)
        value = value.astype(value.dtype.newbyteorder("="))
    value = _check_shape(spec, value)
    if not value.flags.c_contiguous:
        _check_copy(name, value, max_bytes)
        value = np.ascontiguousarray(value)
    return value


def _check_shape(spec: InputSpec, value: np.ndarray) -> np.ndarray:
    """``value``, or the typed error for a rank or fixed dimension the input does not have."""
    name = spec.name
    if spec.shape is not None:
        if value.ndim != len(spec.shape):
            raise InputShapeError(
                f"input {name!r} expects rank {len(spec.shape)} with shape {_fmt_shape(spec.shape)}, "
                f"got rank {value.ndim} with shape {tuple(value.shape)}")
        for axis, (d, g) in enumerate(zip(spec.shape, value.shape)):
            if isinstance(d, int) and d != g:
                raise InputShapeError(
                    f"input {name!r} dim {axis} must be {d} (expected shape {_fmt_shape(spec.shape)}), "
                    f"got {g} (shape {tuple(value.shape)})")
    return value


def default_max_bytes() -> int:
    """Half the physical memory (at least 1 GiB): the copy limit when the session sets none."""
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        phys = 8 << 30
    return max(phys // 2, 1 << 30)


def _check_copy(name: str, value: np.ndarray, max_bytes: int | None) -> None:
    """A view over little memory (``np.broadcast_to``: stride 0) may stand for terabytes: refuse to
    copy it past the cap instead of letting numpy fail (or the kernel's overcommit kill us)."""
    limit = max_bytes or default_max_bytes()
    nbytes = value.size * value.dtype.itemsize
    if nbytes > limit:
        raise InputTooLargeError(
            f"input {name!r} of shape {tuple(value.shape)} ({value.dtype}) must be copied into a contiguous "
            f"array of {nbytes} bytes, more than the tensor size cap of {limit} bytes "
            f"(session config entry 'session.max_tensor_bytes')")
