"""Loading a model: bytes or path -> a checked, self-contained ``onnx.ModelProto``.

Steps: split the serialized model into a small protobuf *skeleton* and its large
weights (read straight into numpy arrays, never into protobuf); parse the skeleton;
reject unsafe external data *before any file is opened*; read the external data;
IR-version and opset checks; ``onnx.checker``; inline model-local functions; the attribute
rules of :mod:`.validate`.

Why the split: a parsed ``ModelProto`` keeps every weight in protobuf memory that
upb does not give back until the whole message is freed, and ``numpy_helper.to_array``
then copies each weight again; with the file's bytes that made three copies of the
weights at once. :func:`load` reads each large ``raw_data`` payload once, into the
array the graph keeps.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
import onnx.inliner
from onnx import external_data_helper

from ..errors import ExternalDataError, InvalidModelError, ModelLoadError, UnsupportedModelError
from .validate import validate_model

MIN_IR_VERSION = 3
MAX_IR_VERSION = onnx.IR_VERSION
MIN_OPSET = 1
MAX_OPSET = onnx.defs.onnx_opset_version()
ML_DOMAIN = "ai.onnx.ml"
MAX_ML_OPSET = max(v for (d, v) in onnx.helper.OP_SET_ID_VERSION_MAP if d == ML_DOMAIN)


def _parse(data: bytes, origin: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as exc:  # protobuf raises DecodeError and friends
        raise InvalidModelError(f"{origin} is not an ONNX model (protobuf parse failed: {exc})") from exc
    if not model.HasField("graph"):
        raise InvalidModelError(f"{origin} is not an ONNX model: it has no graph")
    return model


def _external_tensors(model: onnx.ModelProto):
    return [t for t in external_data_helper._get_all_tensors(model)
            if external_data_helper.uses_external_data(t)]


def check_external_data(model: onnx.ModelProto, base_dir: Path | None, origin: str) -> None:
    """Reject external data locations that leave ``base_dir``; opens no file.

    Absolute paths, ``..`` components, symbolic links (anywhere on the path inside
    the folder) and files with more than one hard link are refused.
    """
    tensors = _external_tensors(model)
    if not tensors:
        return
    if base_dir is None:
        raise ExternalDataError(
            f"{origin} refers to external data ({tensors[0].name!r}), but was given as bytes: "
            "load it from its file path so the data can be found next to it")
    base = base_dir.resolve()
    for t in tensors:
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        where = f"tensor {t.name!r} external data location {loc!r}"
        if not loc:
            raise ExternalDataError(f"{where}: no location given")
        p = Path(loc)
        if p.is_absolute() or loc.startswith(("/", "\\")) or (len(loc) > 1 and loc[1] == ":"):
            raise ExternalDataError(f"{where} is an absolute path; it must be relative to the model's folder {base}")
        parts = Path(loc.replace("\\", "/")).parts
        if ".." in parts:
            raise ExternalDataError(f"{where} contains '..'; it must stay inside the model's folder {base}")
        cur = base
        for part in parts:
            cur = cur / part
            try:
                st = os.lstat(cur)
            except FileNotFoundError:
                raise ExternalDataError(f"{where}: {cur} does not exist") from None
            except OSError as exc:  # a file used as a folder, a name too long, no permission, ...
                raise ExternalDataError(f"{where}: {cur} cannot be examined: {exc.strerror or exc}") from exc
            if stat.S_ISLNK(st.st_mode):
                raise ExternalDataError(f"{where}: {cur} is a symbolic link; links are refused")
        if not stat.S_ISREG(st.st_mode):
            raise ExternalDataError(f"{where}: {cur} is not a regular file")
        if st.st_nlink > 1:
            raise ExternalDataError(f"{where}: {cur} has {st.st_nlink} hard links; linked files are refused")
        for key in ("offset", "length"):
            if key in info and (not info[key].isdigit()):
                raise ExternalDataError(f"{where}: {key} {info[key]!r} is not a non-negative integer")


def check_versions(model: onnx.ModelProto, origin: str) -> None:
    """IR version and opsets within what this runtime supports, else a typed error."""
    ir = model.ir_version
    if ir < MIN_IR_VERSION or ir > MAX_IR_VERSION:
        raise UnsupportedModelError(
            f"{origin} has IR version {ir}; runtime-core supports IR versions "
            f"{MIN_IR_VERSION} to {MAX_IR_VERSION} (onnx {onnx.__version__})")
    limits = {"": (MIN_OPSET, MAX_OPSET), "ai.onnx": (MIN_OPSET, MAX_OPSET), ML_DOMAIN: (1, MAX_ML_OPSET)}
    for imp in model.opset_import:
        lo_hi = limits.get(imp.domain)
        if lo_hi is None:
            continue  # custom domains: nodes are declined by providers if unknown
        lo, hi = lo_hi
        if not lo <= imp.version <= hi:
            dom = imp.domain or "ai.onnx"
            raise UnsupportedModelError(
                f"{origin} imports opset {imp.version} of domain {dom}; runtime-core supports "
                f"{dom} opsets {lo} to {hi}")


#: main-graph initializers whose ``raw_data`` is larger than this are split off the protobuf
STRIP_BYTES = 4096

#: ONNX element types whose ``raw_data`` is the plain little-endian numpy layout
#: (what ``numpy_helper.to_array`` reads with ``np.frombuffer``); others stay in the proto
_RAW_DTYPES = {
    onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.INT8: np.int8,
    onnx.TensorProto.UINT16: np.uint16, onnx.TensorProto.INT16: np.int16, onnx.TensorProto.INT32: np.int32,
    onnx.TensorProto.INT64: np.int64, onnx.TensorProto.BOOL: np.bool_, onnx.TensorProto.FLOAT16: np.float16,
    onnx.TensorProto.DOUBLE: np.float64, onnx.TensorProto.UINT32: np.uint32, onnx.TensorProto.UINT64: np.uint64,
    onnx.TensorProto.COMPLEX64: np.complex64, onnx.TensorProto.COMPLEX128: np.complex128,
}

# protobuf field numbers (onnx.proto)
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_T_DIMS, _T_DATA_TYPE, _T_NAME, _T_RAW_DATA, _T_DOC, _T_LOCATION, _T_METADATA = 1, 2, 8, 9, 12, 14, 16


class LoadedModel(NamedTuple):
    """What :func:`load` returns.

    ``model`` is the checked model, except that the main-graph initializers named in
    ``weights`` carry no data there (name, type and dims only); ``weights`` holds their
    values as read-only numpy arrays (``Graph(model, weights=weights)`` uses them).
    ``base_dir`` is the model's folder (``None`` for bytes)."""

    model: onnx.ModelProto
    weights: dict
    base_dir: Path | None


# -- the protobuf wire walk ---------------------------------------------------------------

class _WireError(Exception):
    """The bytes are not what the walk understands; the full protobuf parse decides."""


def _varint_bytes(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _decode_varint(buf, off: int) -> tuple[int, int]:
    result = shift = 0
    n = len(buf)
    while True:
        if off >= n or shift >= 70:
            raise _WireError("bad varint")
        b = buf[off]
        off += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, off
        shift += 7


def _signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


class _Reader:
    """Sequential reads of a serialized model from bytes or an unbuffered file, with the
    absolute position. Large payloads go straight into numpy arrays (``read_array``)."""

    CHUNK = 1 << 20

    def __init__(self, data=None, f=None):
        self._f = f
        self._buf = data if data is not None else b""
        self._off = 0
        self.pos = 0

    def _more(self, need: int) -> None:
        rest = self._buf[self._off:]
        parts = [rest]
        have = len(rest)
        while self._f is not None and have < need:
            chunk = self._f.read(max(self.CHUNK, need - have))
            if not chunk:
                break
            parts.append(chunk)
            have += len(chunk)
        self._buf = b"".join(parts)  # kept even when short: varint() may need fewer bytes
        self._off = 0
        if have < need:
            raise _WireError("truncated")

    def read(self, n: int) -> bytes:
        if len(self._buf) - self._off < n:
            self._more(n)
        out = self._buf[self._off:self._off + n]
        self._off += n
        self.pos += n
        return out

    def varint(self) -> tuple[int, bytes]:
        """A varint and its bytes as written (copied verbatim into the skeleton)."""
        if len(self._buf) - self._off < 10:
            try:
                self._more(10)
            except _WireError:
                pass  # fewer than 10 bytes left: fine if the varint ends before them
        start = self._off
        v, end = _decode_varint(self._buf, start)
        self._off = end
        self.pos += end - start
        return v, self._buf[start:end]

    def read_array(self, n: int) -> np.ndarray:
        """``n`` bytes into a new (aligned) uint8 array: one copy, no intermediate bytes."""
        arr = np.empty(n, np.uint8)
        have = min(n, len(self._buf) - self._off)
        if have:
            arr[:have] = np.frombuffer(self._buf, np.uint8, have, self._off)
            self._off += have
        if have < n:
            if self._f is None:
                raise _WireError("truncated")
            mv = memoryview(arr)[have:]
            while len(mv):
                k = self._f.readinto(mv)
                if not k:
                    raise _WireError("truncated")
                mv = mv[k:]
            self._buf, self._off = b"", 0
        self.pos += n
        return arr

    def value(self, wire_type: int, end: int) -> tuple[bytes, object]:
        """One field value after its tag: (bytes as written, decoded value or payload)."""
        if wire_type == 0:
            v, raw = self.varint()
        elif wire_type == 1:
            raw = v = self.read(8)
        elif wire_type == 5:
            raw = v = self.read(4)
        elif wire_type == 2:
            n, pre = self.varint()
            if n > end - self.pos:
                raise _WireError("length past the end of the message")
            v = self.read(n)
            raw = pre + v
        else:  # groups (deprecated) and invalid wire types
            raise _WireError(f"wire type {wire_type}")
        if self.pos > end:
            raise _WireError("field past the end of the message")
        return raw, v


def _tag(r: _Reader) -> tuple[int, int, bytes]:
    tag, raw = r.varint()
    if tag >> 3 == 0:
        raise _WireError("field number 0")
    return tag >> 3, tag & 7, raw


def _split_tensor(r: _Reader, end: int, weights: dict) -> bytes:
    """A TensorProto; when it is a plain, well-formed raw-data tensor its data goes to
    ``weights`` and the returned bytes lack the ``raw_data`` field, else they are the
    tensor as written (the checker and ``to_array`` judge it then, as before)."""
    pieces: list = []
    raws: list = []
    dims: list[int] = []
    dtype, name, location, plain = 0, "", 0, True
    while r.pos < end:
        field, wt, traw = _tag(r)
        if field == _T_RAW_DATA and wt == 2:
            n, pre = r.varint()
            if n > end - r.pos:
                raise _WireError("raw_data past the end of the tensor")
            raws.append((traw + pre, r.read_array(n)))
            pieces.append(len(raws) - 1)
            continue
        raw, v = r.value(wt, end)
        pieces.append(traw + raw)
        if field == _T_DIMS and wt == 0:
            dims.append(_signed64(v))
        elif field == _T_DIMS and wt == 2:  # packed
            off = 0
            while off < len(v):
                d, off = _decode_varint(v, off)
                dims.append(_signed64(d))
        elif field == _T_DATA_TYPE and wt == 0:
            dtype = _signed64(v)
        elif field == _T_NAME and wt == 2:
            try:
                name = v.decode("utf-8")
            except UnicodeDecodeError:
                plain = False
        elif field == _T_LOCATION and wt == 0:
            location = v
        elif field not in (_T_DOC, _T_METADATA):
            plain = False  # typed data fields, segments, external data: not ours to judge
    if r.pos != end:
        raise _WireError("tensor overruns its length")
    np_dtype = _RAW_DTYPES.get(dtype)
    if (plain and name and len(raws) == 1 and location == onnx.TensorProto.DEFAULT and np_dtype is not None
            and sys.byteorder == "little" and all(d >= 0 for d in dims)):
        nelem = 1
        for d in dims:
            nelem *= d
        buf = raws[0][1]
        if nelem and buf.size == nelem * np.dtype(np_dtype).itemsize:
            arr = buf.view(np_dtype).reshape(dims)
            arr.flags.writeable = False  # as numpy_helper.to_array's arrays over protobuf bytes
            weights[name] = arr
            return b"".join(p for p in pieces if not isinstance(p, int))
    return b"".join(raws[p][0] + raws[p][1].tobytes() if isinstance(p, int) else p for p in pieces)


def _rewrite(r: _Reader, end: int, field_no: int, child, what: str, outer: str, min_len: int = 0) -> bytes:
    """The message from ``r.pos`` to ``end`` re-serialized field by field, each length-delimited
    field ``field_no`` of more than ``min_len`` bytes replaced by ``child(r, child_end)``
    (shorter ones are copied as written)."""
    out: list[bytes] = []
    while r.pos < end:
        field, wt, traw = _tag(r)
        if field == field_no and wt == 2:
            n, pre = r.varint()
            if n > end - r.pos:
                raise _WireError(f"{what} past the end of the {outer}")
            if n > min_len:
                body = child(r, r.pos + n)
                out += [traw, _varint_bytes(len(body)), body]
            else:
                out += [traw, pre, r.read(n)]
            continue
        out += [traw, r.value(wt, end)[0]]
    if r.pos != end:
        raise _WireError(f"{outer} overruns its length")
    return b"".join(out)


def _split_graph(r: _Reader, end: int, weights: dict) -> bytes:
    # small tensors stay in the protobuf as they are
    return _rewrite(r, end, _GRAPH_INITIALIZER, lambda r, t_end: _split_tensor(r, t_end, weights),
                    "initializer", "graph", min_len=STRIP_BYTES)


def _split_model(r: _Reader, size: int) -> tuple[bytes, dict]:
    """The serialized model without the large raw data of its main graph's initializers,
    and those initializers as numpy arrays (name -> array)."""
    weights: dict = {}
    body = _rewrite(r, size, _MODEL_GRAPH, lambda r, g_end: _split_graph(r, g_end, weights), "graph", "model")
    return body, weights


def _read_split(path: Path, origin: str) -> tuple[bytes | None, dict, bytes | None]:
    """Split the model file (see :func:`_split_model`): ``(skeleton, weights, None)``; or
    ``(None, {}, None)`` when the walk does not understand the file, which is then read and
    parsed whole (so protobuf words the error); or ``(None, {}, data)`` for a pipe or device,
    read to its end through this one open (a second open of a FIFO would miss what the writer
    sent to the first, or find the writer gone)."""
    try:
        with open(path, "rb", buffering=0) as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                return None, {}, f.readall()  # a pipe or device: read it as a stream
            size = st.st_size
            try:
                return (*_split_model(_Reader(f=f), size), None)
            except _WireError:
                return None, {}, None
    except FileNotFoundError:
        raise ModelLoadError(f"{origin} does not exist") from None
    except IsADirectoryError:
        raise ModelLoadError(f"{origin} is a directory, not an .onnx file") from None
    except OSError as exc:
        raise ModelLoadError(f"{origin} cannot be read: {exc}") from exc


def _read_whole(path: Path, origin: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ModelLoadError(f"{origin} does not exist") from None
    except IsADirectoryError:
        raise ModelLoadError(f"{origin} is a directory, not an .onnx file") from None
    except OSError as exc:
        raise ModelLoadError(f"{origin} cannot be read: {exc}") from exc


def _is_stripped(t: onnx.TensorProto) -> bool:
    return not (t.HasField("raw_data") or t.float_data or t.int32_data or t.int64_data or t.double_data
                or t.uint64_data or t.string_data or t.external_data)


def _read_external(t: onnx.TensorProto, base_dir: str) -> bytes:
    """The bytes of ``t``'s external data, with onnx's checks of location and bounds."""
    read = getattr(external_data_helper, "_read_external_data_bytes", None)  # in 1.23.2, not 1.23.0
    if read is not None:
        return read(t, base_dir)
    external_data_helper.load_external_data_for_tensor(t, base_dir)  # onnx 1.23.0: into raw_data
    data = t.raw_data
    t.ClearField("raw_data")
    return data


def _load_external(model: onnx.ModelProto, base_dir: Path, weights: dict, origin: str) -> None:
    """Read external data: main-graph initializers of plain types into ``weights`` (the
    proto keeps name, type and dims), every other tensor into its ``raw_data`` as
    ``onnx.external_data_helper`` does. Locations were checked by :func:`check_external_data`."""
    try:
        for t in model.graph.initializer:
            np_dtype = _RAW_DTYPES.get(t.data_type)
            if not external_data_helper.uses_external_data(t) or np_dtype is None or not t.name or (
                    sys.byteorder != "little"):
                continue
            data = _read_external(t, str(base_dir))
            t.data_location = onnx.TensorProto.DEFAULT
            del t.external_data[:]
            shape = tuple(t.dims)
            nelem = 1
            for d in shape:
                nelem *= d
            if all(d >= 0 for d in shape) and nelem and len(data) == nelem * np.dtype(np_dtype).itemsize:
                weights[t.name] = np.frombuffer(data, np_dtype).reshape(shape)  # read-only, like to_array
            else:
                t.raw_data = data  # malformed: the checker and the graph judge it as before
        for t in _external_tensors(model):  # subgraphs, attributes, other element types
            external_data_helper.load_external_data_for_tensor(t, str(base_dir))
    except Exception as exc:
        raise ExternalDataError(f"{origin}: reading external data failed: {exc}") from exc


def _subgraphs(graph: onnx.GraphProto):
    """``graph`` and every graph nested in its nodes' attributes."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _subgraphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _subgraphs(g)


def _drop_untyped_value_info(model: onnx.ModelProto) -> None:
    """Remove ``value_info`` entries that have no type: they say nothing, onnxruntime ignores
    them, and onnx's checker refuses them (skl2onnx writes such entries)."""
    for graph in _subgraphs(model.graph):
        keep = [vi for vi in graph.value_info if vi.HasField("type")]
        if len(keep) != len(graph.value_info):
            del graph.value_info[:]
            graph.value_info.extend(keep)


def _shapeless_tensor_io(graph: onnx.GraphProto):
    """Graph inputs and outputs typed as tensors but without a shape (unknown rank)."""
    for vi in list(graph.input) + list(graph.output):
        if vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape"):
            yield vi


def _untyped_outputs(graph: onnx.GraphProto):
    """Graph outputs declared by name only (onnxruntime infers their type)."""
    return [vi for vi in graph.output if not vi.HasField("type")]


def _accept_unknown_rank(view: onnx.ModelProto) -> None:
    """Let the checker pass graph inputs/outputs of unknown rank and graph outputs without a
    type, as onnxruntime does: in the checker's copy only, such a value gets an empty shape (and
    an output an undefined element type): the checker, without shape inference, judges the
    fields' presence, not their values. The loaded model keeps them as they are."""
    for graph in _subgraphs(view.graph):
        for vi in _untyped_outputs(graph):
            vi.type.tensor_type.elem_type = onnx.TensorProto.UNDEFINED
        for vi in _shapeless_tensor_io(graph):
            vi.type.tensor_type.shape.SetInParent()


def _culprits(model: onnx.ModelProto, weights: dict, message: str = "") -> str:
    """`` (at graph input 'x': ...)``: the main graph's values the checker refuses, one by one
    (its message names a node, never a value); empty when no single value is at fault."""
    view = onnx.ModelProto()
    view.ParseFromString(_checker_view(model, weights))
    g = view.graph
    found = []
    for kind, vis in (("graph input", g.input), ("graph output", g.output), ("value_info entry", g.value_info)):
        for k, vi in enumerate(vis):
            try:
                onnx.checker.check_value_info(vi, onnx.checker.DEFAULT_CONTEXT)
            except onnx.checker.ValidationError as exc:
                first = str(exc).strip().splitlines()[0]
                why = _type_desc(vi) + ("" if message.startswith(first) else f": {first}")
                found.append((f"{kind} {vi.name!r}" if vi.name else f"{kind} #{k} (unnamed)") + f", {why}")
    if not found:
        return ""
    more = f" and {len(found) - 5} more" if len(found) > 5 else ""
    return " [at " + "; ".join(found[:5]) + more + "]"


def _type_desc(vi: onnx.ValueInfoProto) -> str:
    which = vi.type.WhichOneof("value")
    if which is None:
        return "declared without a type"
    return f"declared as {which.removesuffix('_type')}" + (
        "" if which != "tensor_type" or vi.type.tensor_type.HasField("shape") else " without a shape")


def _type_str(tp: onnx.TypeProto) -> str | None:
    """A type as onnx schemas spell their allowed types, spaces removed (None: not fully known)."""
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        if not tp.tensor_type.elem_type:
            return None
        return f"tensor({onnx.helper.tensor_dtype_to_string(tp.tensor_type.elem_type).split('.')[-1].lower()})"
    if which == "map_type":
        key = onnx.helper.tensor_dtype_to_string(tp.map_type.key_type).split(".")[-1].lower()
        value = _type_str(tp.map_type.value_type)
        return None if value is None else f"map({key},{value})"
    if which in ("sequence_type", "optional_type"):
        inner = _type_str(getattr(tp, which).elem_type)
        return None if inner is None else f"{'seq' if which == 'sequence_type' else 'optional'}({inner})"
    return None


def _allowed(type_strs) -> set[str]:
    out = set()
    for t in type_strs:
        t = t.replace(" ", "")
        if t.startswith("map(") and "(" not in t[4:-1]:  # "map(string, float)": the value is a tensor
            key, value = t[4:-1].split(",")
            t = f"map({key},tensor({value}))"
        out.add(t)
    return out


def _check_input_types(model: onnx.ModelProto, origin: str) -> None:
    """Graph inputs fed to a node input whose schema does not allow their type are refused at
    load time, as onnxruntime refuses them ("Type Error"), naming the node, value and types."""
    declared = {vi.name: _type_str(vi.type) for vi in model.graph.input}
    opsets = {imp.domain or "": imp.version for imp in model.opset_import}
    for node in model.graph.node:
        domain = node.domain if node.domain != "ai.onnx" else ""
        if domain not in opsets or not any(i in declared for i in node.input):
            continue
        try:
            schema = onnx.defs.get_schema(node.op_type, opsets[domain], domain)
        except onnx.defs.SchemaError:
            continue
        constraints = {tc.type_param_str: tc.allowed_type_strs for tc in schema.type_constraints}
        formals = list(schema.inputs)
        for k, name in enumerate(node.input):
            if not formals or declared.get(name) is None:
                continue
            formal = formals[min(k, len(formals) - 1)]
            if k >= len(formals) and formal.option != onnx.defs.OpSchema.FormalParameterOption.Variadic:
                continue
            allowed = _allowed(constraints.get(formal.type_str, [formal.type_str]))
            if declared[name] not in allowed:
                raise InvalidModelError(  # onnxruntime's wording, which scripts match on
                    f"{origin}: Type Error: Type '{declared[name]}' of input parameter ({name}) of operator "
                    f"({node.op_type}) in node ({node.name}) is invalid: input {formal.name!r} of "
                    f"{domain or 'ai.onnx'}::{node.op_type}-{schema.since_version} accepts "
                    f"{', '.join(sorted(allowed))}")


def _sparse_tensors(model: onnx.ModelProto):
    """Sparse initializers and sparse attribute values (Constant's ``sparse_value``), all graphs."""
    for graph in _subgraphs(model.graph):
        yield from graph.sparse_initializer
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.SPARSE_TENSOR:
                    yield attr.sparse_tensor


def _unsorted_sparse(model: onnx.ModelProto) -> list:
    """Sparse tensors whose COO indices are not in increasing order (onnxruntime takes them)."""
    out = []
    for sp in _sparse_tensors(model):
        idx = onnx.numpy_helper.to_array(sp.indices).astype(np.int64)
        if idx.ndim == 2:  # (nnz, rank): row-major linear positions
            idx = np.ravel_multi_index(tuple(idx.T), tuple(sp.dims)) if idx.size else idx.reshape(-1)
        if idx.size > 1 and np.any(np.diff(idx) <= 0) and np.unique(idx).size == idx.size:
            out.append((sp, np.argsort(idx, kind="stable")))
    return out


def _sort_sparse(view: onnx.ModelProto) -> None:
    """In the checker's copy, sparse tensors with distinct but unordered COO indices get
    them sorted (with their values): the same tensor, which the checker requires in order and
    onnxruntime accepts as given. Repeated indices stay a checker error."""
    for sp, order in _unsorted_sparse(view):
        values = onnx.numpy_helper.to_array(sp.values)[order]
        indices = onnx.numpy_helper.to_array(sp.indices)[order]
        sp.values.CopyFrom(onnx.numpy_helper.from_array(values, sp.values.name))
        sp.indices.CopyFrom(onnx.numpy_helper.from_array(indices, sp.indices.name))


def _checker_view(model: onnx.ModelProto, weights: dict) -> bytes:
    """The model as the checker sees it: each split-off initializer becomes a 0-element
    tensor of its name and type (the checker verdicts on names, types, graph inputs and
    nodes are the same; its data was validated when it was split off), graph inputs and
    outputs of unknown rank are accepted (:func:`_accept_unknown_rank`), and so is a main graph
    without a name (onnxmltools writes ``name=""``; onnxruntime accepts it there, not on a
    subgraph)."""
    shapeless = any(True for g in _subgraphs(model.graph) for _ in _shapeless_tensor_io(g)) or any(
        _untyped_outputs(g) for g in _subgraphs(model.graph))
    unsorted = bool(_unsorted_sparse(model))
    unnamed = not model.graph.name
    if not weights and not shapeless and not unsorted and not unnamed:
        return model.SerializeToString()
    view = onnx.ModelProto()
    view.CopyFrom(model)
    if shapeless:
        _accept_unknown_rank(view)
    if unnamed:
        view.graph.name = "unnamed"
    if unsorted:
        _sort_sparse(view)
    for t in view.graph.initializer:
        if t.name in weights and _is_stripped(t):
            del t.dims[:]
            t.dims.append(0)
    return view.SerializeToString()


def _local_calls(model: onnx.ModelProto) -> list[str]:
    """Names of the model-local functions the main graph (and its subgraphs) still call."""
    local = {(f.domain, f.name) for f in model.functions}
    return sorted({f"{n.domain}::{n.op_type}" for g in _subgraphs(model.graph) for n in g.node
                   if (n.domain, n.op_type) in local})


def _changed_ops(fn: onnx.FunctionProto, domain: str, have: int, want: int) -> list[str]:
    """Ops of ``domain`` in ``fn`` whose schema differs between opsets ``have`` and ``want``."""
    differ = []
    for n in fn.node:
        if (n.domain if n.domain != "ai.onnx" else "") != domain:
            continue
        try:
            a = onnx.defs.get_schema(n.op_type, have, n.domain).since_version
            b = onnx.defs.get_schema(n.op_type, want, n.domain).since_version
        except onnx.defs.SchemaError:
            continue  # a call of another local function, or a custom op: no version semantics
        if a != b:
            differ.append(f"{n.op_type} (opset {have}: version {a}, opset {want}: version {b})")
    return differ


def _inline_functions(model: onnx.ModelProto, origin: str) -> onnx.ModelProto:
    """Inline model-local functions whatever opsets they import, as onnxruntime runs them.

    A function importing the model's opsets is inlined as is. One importing another version
    (skl2onnx writes functions at its default opset into models of a newer one) is
    version-converted by onnx; where the converter cannot, its imports are retargeted to the
    model's when every op it uses has the same schema in both versions (the same semantics),
    else the model is refused naming the ops that changed."""
    try:
        inlined = onnx.inliner.inline_local_functions(model)
    except Exception as exc:
        raise InvalidModelError(f"{origin}: inlining model-local functions failed: {exc}") from exc
    if not _local_calls(inlined):
        return inlined
    try:
        converted = onnx.inliner.inline_local_functions(model, convert_version=True)
    except Exception:  # noqa: BLE001 - the converter lacks an adapter: try the schema comparison
        converted = None
    if converted is not None and not _local_calls(converted):
        return converted
    model_ops = {imp.domain or "": imp.version for imp in model.opset_import}
    retargeted = onnx.ModelProto()
    retargeted.CopyFrom(model)
    problems = []
    for fn in retargeted.functions:
        for imp in fn.opset_import:
            want = model_ops.get(imp.domain or "")
            if want is None or want == imp.version:
                continue
            differ = _changed_ops(fn, imp.domain or "", imp.version, want)
            if differ:
                problems.append(f"function {fn.domain}::{fn.name}: {', '.join(differ)}")
            else:
                imp.version = want
    if problems:
        raise UnsupportedModelError(
            f"{origin}: model-local functions import other opsets than the model and cannot be "
            f"converted to the model's: {'; '.join(problems)}")
    try:
        inlined = onnx.inliner.inline_local_functions(retargeted)
    except Exception as exc:
        raise InvalidModelError(f"{origin}: inlining model-local functions failed: {exc}") from exc
    left = _local_calls(inlined)
    if left:
        raise UnsupportedModelError(f"{origin}: model-local function(s) {', '.join(left)} could not be inlined")
    return inlined


def load(path_or_bytes, *, check: bool = True) -> LoadedModel:
    """Load, check and prepare a model, its large weights kept out of protobuf (see
    :class:`LoadedModel`). Errors are the same as :func:`load_model`'s."""
    base_dir: Path | None = None
    weights: dict = {}
    skeleton: bytes | None = None
    if isinstance(path_or_bytes, onnx.ModelProto):
        origin = "the model"
        try:
            data = path_or_bytes.SerializeToString()
        except ValueError as exc:  # over protobuf's 2 GB limit
            raise ModelLoadError(f"{origin} cannot be serialized ({exc}); save it with external data "
                                 "and load it from its path") from exc
    elif isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        data = bytes(path_or_bytes)
        origin = "the model bytes"
    elif isinstance(path_or_bytes, (str, os.PathLike)):
        path = Path(path_or_bytes)
        origin = f"model file {str(path)!r}"
        skeleton, weights, data = _read_split(path, origin)
        if skeleton is None and data is None:
            data = _read_whole(path, origin)
        base_dir = path.parent
    else:
        raise ModelLoadError(
            f"expected a path (str or os.PathLike) or the model's bytes, got {type(path_or_bytes).__name__}")
    if skeleton is None:
        try:
            skeleton, weights = _split_model(_Reader(data=data), len(data))
        except _WireError:
            skeleton, weights = data, {}  # protobuf will say what is wrong
    data = None
    model = _parse(skeleton, origin)
    skeleton = None

    check_external_data(model, base_dir, origin)
    if base_dir is not None and _external_tensors(model):
        _load_external(model, base_dir, weights, origin)
    check_versions(model, origin)
    _drop_untyped_value_info(model)
    if check:
        try:
            onnx.checker.check_model(_checker_view(model, weights), full_check=False)
        except onnx.checker.ValidationError as exc:
            raise InvalidModelError(f"{origin} failed the ONNX checker: {exc}{_culprits(model, weights, str(exc))}") from exc
        _check_input_types(model, origin)
    if model.functions:
        model = _inline_functions(model, origin)
    validate_model(model, origin)  # before onnx's shape inference and the kernels read the attributes
    return LoadedModel(model, weights, base_dir)


def load_model(path_or_bytes, *, check: bool = True) -> tuple[onnx.ModelProto, Path | None]:
    """Load, check and prepare a model. Returns the model, every weight in it, and its
    folder (None for bytes). :func:`load` is the same without copying the weights back
    into protobuf."""
    model, weights, base_dir = load(path_or_bytes, check=check)
    for t in model.graph.initializer:
        arr = weights.get(t.name)
        if arr is not None and _is_stripped(t):
            t.raw_data = arr.tobytes()
    return model, base_dir
