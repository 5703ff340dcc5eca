"""Open Inference Protocol v2 tensors: JSON ``data`` and the binary tensor data extension, both ways.

A request body is a JSON header, optionally followed by raw tensor bytes; the
``Inference-Header-Content-Length`` header says where the JSON ends, and each input that
travels as bytes says how many in ``parameters.binary_data_size`` (in input order). ``BYTES``
elements travel as a 4-byte little-endian length and the bytes.

JSON has no NaN or infinities: in ``data`` of FP16/FP32/FP64 tensors they travel as the strings
``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` (written so in responses, which stay strict JSON;
accepted in requests, as are the bare ``NaN``/``Infinity`` tokens that Python's json writes).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field

import numpy as np

from .errors import RequestError

#: OIP datatype -> numpy dtype (BYTES: object arrays of ``bytes``/``str``)
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
_ONNX_TYPES = {
    "tensor(bool)": "BOOL", "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16", "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64", "tensor(int8)": "INT8", "tensor(int16)": "INT16", "tensor(int32)": "INT32",
    "tensor(int64)": "INT64", "tensor(float16)": "FP16", "tensor(float)": "FP32", "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}
_OF_DTYPE = {dt: name for name, dt in DATATYPES.items() if name != "BYTES"}
HEADER_LENGTH = "inference-header-content-length"
#: the strings that stand for the IEEE values JSON cannot write
NONFINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def datatype_of_onnx(type_str: str) -> str:
    """The OIP datatype of an ONNX type string (``tensor(float)`` -> ``FP32``); other types keep
    their ONNX spelling, which no client can send (the request is refused with the model's type)."""
    return _ONNX_TYPES.get(type_str, type_str)


def datatype_of_array(value: np.ndarray) -> str:
    """The OIP datatype of a numpy array."""
    if value.dtype.kind in "OSU":
        return "BYTES"
    name = _OF_DTYPE.get(value.dtype)
    if name is not None:
        return name
    raise RequestError(f"output dtype {value.dtype} has no Open Inference Protocol datatype")


@dataclass
class InferRequest:
    """A decoded ``/infer`` request: feeds in request order, and the outputs asked for."""

    id: str | None
    inputs: dict[str, np.ndarray]
    #: output name -> send as binary; empty: every output, as ``binary_default`` says
    outputs: dict[str, bool] = field(default_factory=dict)
    binary_default: bool = False


def _shape(name: str, raw) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                            for d in raw):
        raise RequestError(f"input {name!r}: 'shape' must be a list of non-negative integers, got {raw!r}")
    return tuple(raw)


def _from_json(name: str, data, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    dt = DATATYPES[datatype]
    count = math.prod(shape)
    if datatype == "BYTES":
        flat = _flatten(name, data)
        if not all(isinstance(v, str) for v in flat):
            raise RequestError(f"input {name!r}: BYTES data must be strings")
        arr = np.array(flat, dtype=object)
    else:
        try:
            arr = np.asarray(data)
        except ValueError as exc:  # ragged nesting
            raise RequestError(f"input {name!r}: 'data' is not a regular array: {exc}") from None
        if arr.dtype.kind == "U" and dt.kind == "f":
            arr = _with_nonfinite(name, data, datatype)
        if arr.size == 0:
            arr = arr.astype(dt)
        elif arr.dtype.kind not in "biuf" or (dt.kind == "b" and arr.dtype.kind != "b") or (
                dt.kind in "iu" and arr.dtype.kind == "f"):
            raise RequestError(f"input {name!r}: datatype {datatype} needs "
                               f"{'true/false' if dt.kind == 'b' else 'integers' if dt.kind in 'iu' else 'numbers'}"
                               f" in 'data', got {_kind_word(arr)}")
        else:
            with np.errstate(over="ignore", invalid="ignore"):
                conv = arr.astype(dt)
            if dt.kind in "iu" and not np.array_equal(conv, arr):
                raise RequestError(f"input {name!r}: a value in 'data' is out of the range of {datatype}")
            arr = conv
    if arr.size != count:
        raise RequestError(f"input {name!r}: shape {list(shape)} needs {count} element(s), 'data' has {arr.size}")
    return arr.reshape(shape)


def _with_nonfinite(name: str, data, datatype: str) -> np.ndarray:
    """FP ``data`` that holds strings: each must be a number or one of :data:`NONFINITE`."""
    flat = _flatten(name, data)
    vals = []
    for v in flat:
        if isinstance(v, str):
            if v not in NONFINITE:
                raise RequestError(f"input {name!r}: datatype {datatype} needs numbers (or the strings "
                                   f"\"NaN\", \"Infinity\", \"-Infinity\") in 'data', got {v[:40]!r}")
            vals.append(NONFINITE[v])
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            vals.append(v)
        else:
            raise RequestError(f"input {name!r}: datatype {datatype} needs numbers in 'data', "
                               f"got {type(v).__name__}")
    return np.array(vals, dtype=np.float64)


def _kind_word(arr: np.ndarray) -> str:
    return {"b": "booleans", "i": "integers", "u": "integers", "f": "floating-point numbers"}.get(
        arr.dtype.kind, "strings or objects")


def _flatten(name: str, data) -> list:
    if not isinstance(data, list):
        return [data]
    out: list = []
    stack = [iter(data)]
    while stack:
        for v in stack[-1]:
            if isinstance(v, list):
                stack.append(iter(v))
                break
            out.append(v)
        else:
            stack.pop()
    return out


def _from_bytes(name: str, chunk: memoryview, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BYTES":
        items, pos = [], 0
        while pos < len(chunk):
            if pos + 4 > len(chunk):
                raise RequestError(f"input {name!r}: BYTES element {len(items)} is cut in its length prefix")
            (n,) = struct.unpack_from("<I", chunk, pos)
            if pos + 4 + n > len(chunk):
                raise RequestError(f"input {name!r}: BYTES element {len(items)} says {n} byte(s), "
                                   f"{len(chunk) - pos - 4} are left")
            try:  # the session's string tensors hold str
                items.append(bytes(chunk[pos + 4:pos + 4 + n]).decode("utf-8"))
            except UnicodeDecodeError:
                raise RequestError(f"input {name!r}: BYTES element {len(items)} is not UTF-8 text") from None
            pos += 4 + n
        if len(items) != count:
            raise RequestError(f"input {name!r}: shape {list(shape)} needs {count} element(s), "
                               f"the binary data holds {len(items)}")
        return np.array(items, dtype=object).reshape(shape)
    dt = DATATYPES[datatype]
    if len(chunk) != count * dt.itemsize:
        raise RequestError(f"input {name!r}: shape {list(shape)} of {datatype} needs {count * dt.itemsize} "
                           f"byte(s), binary_data_size is {len(chunk)}")
    return np.frombuffer(chunk, dtype=dt.newbyteorder("<")).astype(dt, copy=True).reshape(shape)


def decode_request(body: bytes, header_length: str | None) -> InferRequest:
    """Parse an ``/infer`` body (``header_length``: the Inference-Header-Content-Length value)."""
    if header_length is not None:
        try:
            hlen = int(header_length)
        except ValueError:
            raise RequestError(f"Inference-Header-Content-Length must be an integer, got {header_length!r}") from None
        if not 0 <= hlen <= len(body):
            raise RequestError(f"Inference-Header-Content-Length is {hlen} but the body has {len(body)} byte(s)")
    else:
        hlen = len(body)
    try:
        req = json.loads(bytes(body[:hlen]))
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request is not valid JSON: {exc}") from None
    if not isinstance(req, dict):
        raise RequestError(f"the request must be a JSON object, got {type(req).__name__}")
    raw_inputs = req.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise RequestError("the request needs 'inputs': a non-empty list of tensors")
    binary = memoryview(body)[hlen:]
    pos = 0
    inputs: dict[str, np.ndarray] = {}
    for i, t in enumerate(raw_inputs):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise RequestError(f"inputs[{i}] must be an object with a 'name' string")
        name = t["name"]
        if name in inputs:
            raise RequestError(f"input {name!r} is given twice")
        datatype = t.get("datatype")
        if datatype not in DATATYPES:
            raise RequestError(f"input {name!r}: unknown datatype {datatype!r} (known: {', '.join(DATATYPES)})")
        shape = _shape(name, t.get("shape"))
        params = t.get("parameters") or {}
        if not isinstance(params, dict):
            raise RequestError(f"input {name!r}: 'parameters' must be an object")
        size = params.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise RequestError(f"input {name!r}: binary_data_size must be a non-negative integer, got {size!r}")
            if pos + size > len(binary):
                raise RequestError(f"input {name!r}: binary_data_size is {size} but only {len(binary) - pos} "
                                   "byte(s) of binary data are left (truncated body?)")
            inputs[name] = _from_bytes(name, binary[pos:pos + size], datatype, shape)
            pos += size
        elif "data" in t:
            inputs[name] = _from_json(name, t["data"], datatype, shape)
        else:
            raise RequestError(f"input {name!r} has neither 'data' nor parameters.binary_data_size")
    if pos != len(binary):
        raise RequestError(f"{len(binary) - pos} byte(s) of binary data follow the inputs that no input claims")
    params = req.get("parameters") or {}
    binary_default = bool(params.get("binary_data_output", False)) if isinstance(params, dict) else False
    outputs: dict[str, bool] = {}
    raw_outputs = req.get("outputs") or []
    if not isinstance(raw_outputs, list):
        raise RequestError("'outputs' must be a list")
    for i, o in enumerate(raw_outputs):
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise RequestError(f"outputs[{i}] must be an object with a 'name' string")
        op = o.get("parameters") or {}
        outputs[o["name"]] = bool(op.get("binary_data", binary_default)) if isinstance(op, dict) else binary_default
    rid = req.get("id")
    return InferRequest(id=str(rid) if rid is not None else None, inputs=inputs, outputs=outputs,
                        binary_default=binary_default)


def _bytes_of(value: np.ndarray) -> bytes:
    if value.dtype.kind in "OSU":
        parts = []
        for v in value.reshape(-1):
            b = v if isinstance(v, bytes) else str(v).encode()
            parts.append(struct.pack("<I", len(b)) + b)
        return b"".join(parts)
    return np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<")).tobytes()


def _json_data(value: np.ndarray) -> list:
    if value.dtype.kind in "OSU":
        return [v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in value.reshape(-1)]
    flat = value.reshape(-1)
    out = flat.tolist()
    if flat.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(flat))
        for i in bad.tolist():  # strict JSON: the few non-finite values as their strings
            v = out[i]
            out[i] = "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
    return out


def encode_response(model: str, version: str, request_id: str | None,
                    outputs: list[tuple[str, np.ndarray, bool]]) -> tuple[bytes, int | None]:
    """The response body and, when some output travels as bytes, the JSON header's length."""
    tensors, chunks = [], []
    for name, value, as_binary in outputs:
        value = np.asarray(value)
        t: dict = {"name": name, "datatype": datatype_of_array(value), "shape": list(value.shape)}
        if as_binary:
            raw = _bytes_of(value)
            t["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            t["data"] = _json_data(value)
        tensors.append(t)
    head: dict = {"model_name": model, "model_version": version, "outputs": tensors}
    if request_id is not None:
        head["id"] = request_id
    header = json.dumps(head, separators=(",", ":"), allow_nan=False).encode()
    if not chunks:
        return header, None
    return header + b"".join(chunks), len(header)
