"""Loading a model: bytes or path -> a checked, self-contained ``onnx.ModelProto``.

Steps: parse; reject unsafe external data *before any file is opened*; read the
external data; ``onnx.checker``; IR-version and opset checks; inline
model-local functions.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import onnx
import onnx.inliner
from onnx import external_data_helper

from ..errors import ExternalDataError, InvalidModelError, ModelLoadError, UnsupportedModelError

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


def load_model(path_or_bytes, *, check: bool = True) -> tuple[onnx.ModelProto, Path | None]:
    """Load, check and prepare a model. Returns the model and its folder (None for bytes)."""
    base_dir: Path | None = None
    data = None  # the serialized model, when we have it (the checker then needs no re-serialization)
    if isinstance(path_or_bytes, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(path_or_bytes)
        origin = "the model"
    elif isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        data = bytes(path_or_bytes)
        model = _parse(data, "the model bytes")
        origin = "the model bytes"
    elif isinstance(path_or_bytes, (str, os.PathLike)):
        path = Path(path_or_bytes)
        origin = f"model file {str(path)!r}"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ModelLoadError(f"{origin} does not exist") from None
        except IsADirectoryError:
            raise ModelLoadError(f"{origin} is a directory, not an .onnx file") from None
        except OSError as exc:
            raise ModelLoadError(f"{origin} cannot be read: {exc}") from exc
        model = _parse(data, origin)
        base_dir = path.parent
    else:
        raise ModelLoadError(
            f"expected a path (str or os.PathLike) or the model's bytes, got {type(path_or_bytes).__name__}")

    check_external_data(model, base_dir, origin)
    if _external_tensors(model):
        data = None
    if base_dir is not None and _external_tensors(model):
        try:
            external_data_helper.load_external_data_for_model(model, str(base_dir))
        except Exception as exc:
            raise ExternalDataError(f"{origin}: reading external data failed: {exc}") from exc
    check_versions(model, origin)
    if check:
        try:
            onnx.checker.check_model(model if data is None else data, full_check=False)
        except onnx.checker.ValidationError as exc:
            raise InvalidModelError(f"{origin} failed the ONNX checker: {exc}") from exc
    data = None  # the file's bytes are not needed any more (the model holds everything)
    if model.functions:
        try:
            model = onnx.inliner.inline_local_functions(model)
        except Exception as exc:
            raise InvalidModelError(f"{origin}: inlining model-local functions failed: {exc}") from exc
    return model, base_dir
