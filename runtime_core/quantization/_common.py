"""Shared pieces of the quantization tool: the type enums, the scale/zero-point arithmetic
and a small editable view of a model (initializers, producers, consumers, element types).

The arithmetic follows onnxruntime's quantization tool so that, for the same ranges, the
scales and zero points written here are the ones onnxruntime's tool writes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from ..errors import InvalidArgumentError

MS_DOMAIN = "com.microsoft"
FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16)


class QuantType(enum.Enum):
    """Element type of quantized tensors (values as in onnxruntime.quantization)."""

    QInt8 = 0
    QUInt8 = 1
    QInt16 = 3
    QUInt16 = 4
    QInt4 = 5
    QUInt4 = 6

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def from_string(t: str) -> "QuantType":
        """``QuantType["QInt8"]`` with a typed error listing the names."""
        try:
            return QuantType[t]
        except KeyError:
            raise InvalidArgumentError(f"unknown QuantType {t!r}; expected one of "
                                       f"{', '.join(m.name for m in QuantType)}") from None

    @property
    def tensor_type(self) -> int:
        """The ONNX element type (``TensorProto.INT8``, ...)."""
        return _TENSOR_TYPE[self]


_TENSOR_TYPE = {QuantType.QInt8: TensorProto.INT8, QuantType.QUInt8: TensorProto.UINT8,
                QuantType.QInt16: TensorProto.INT16, QuantType.QUInt16: TensorProto.UINT16,
                QuantType.QInt4: TensorProto.INT4, QuantType.QUInt4: TensorProto.UINT4}


class QuantFormat(enum.Enum):
    """QOperator: quantized operators (QLinearConv, ...); QDQ: Quantize/DequantizeLinear pairs."""

    QOperator = 0
    QDQ = 1

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def from_string(f: str) -> "QuantFormat":
        """``QuantFormat["QDQ"]`` with a typed error listing the names."""
        try:
            return QuantFormat[f]
        except KeyError:
            raise InvalidArgumentError(f"unknown QuantFormat {f!r}; expected QOperator or QDQ") from None


class CalibrationMethod(enum.Enum):
    """How activation ranges are chosen from calibration data."""

    MinMax = 0
    Entropy = 1
    Percentile = 2
    Distribution = 3


#: (qmin, qmax) per element type: full, symmetric (int types drop their lowest value), reduced (7 bits)
_RANGE: dict[int, tuple[int, int]] = {TensorProto.UINT8: (0, 255), TensorProto.INT8: (-128, 127), TensorProto.UINT16: (0, 65535),
          TensorProto.INT16: (-32768, 32767), TensorProto.UINT4: (0, 15), TensorProto.INT4: (-8, 7)}
_SYMMETRIC_RANGE: dict[int, tuple[int, int]] = {TensorProto.INT8: (-127, 127), TensorProto.INT16: (-32767, 32767)}
_REDUCED_RANGE: dict[int, tuple[int, int]] = {TensorProto.UINT8: (0, 127), TensorProto.INT8: (-64, 64), TensorProto.UINT16: (0, 32767),
                  TensorProto.INT16: (-16384, 16384), TensorProto.UINT4: (0, 7), TensorProto.INT4: (-4, 3)}
#: numpy storage of each quantized type (4-bit values are held one per byte until packed)
NP_STORAGE: dict[int, Any] = {TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8, TensorProto.UINT16: np.uint16,
              TensorProto.INT16: np.int16, TensorProto.UINT4: np.uint8, TensorProto.INT4: np.int8}


def qrange(qtype: int, reduce_range: bool = False, symmetric: bool = False) -> tuple[int, int]:
    """(qmin, qmax) that onnxruntime's tool uses for this type and these flags."""
    if reduce_range:
        return _REDUCED_RANGE[qtype]
    if symmetric and qtype in _SYMMETRIC_RANGE:
        return _SYMMETRIC_RANGE[qtype]
    return _RANGE[qtype]


def compute_scale_zp(rmin, rmax, qmin: int, qmax: int, symmetric: bool = False,
                     min_real_range: float | None = None, dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """Zero point and scale mapping [rmin, rmax] (widened to hold 0) onto [qmin, qmax].

    Works elementwise on arrays (per-channel). A range too small for a normal float gives
    scale 1 and zero point 0, as onnxruntime's tool does."""
    rmin = np.minimum(np.asarray(rmin, dtype=dtype), 0)
    rmax = np.maximum(np.asarray(rmax, dtype=dtype), 0)
    if min_real_range is not None:
        rmax = np.maximum(rmax, rmin + np.asarray(min_real_range, dtype=dtype))
    if symmetric:
        absmax = np.maximum(np.abs(rmin), np.abs(rmax))
        rmin, rmax = -absmax, absmax
    scale = (rmax.astype(np.float64) - rmin.astype(np.float64)) / (float(qmax) - float(qmin))
    tiny = np.finfo(dtype).tiny
    degenerate = scale < tiny
    if symmetric:
        zp = np.full(scale.shape, np.round((qmin + qmax) / 2.0))
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            zp = np.round(qmin - rmin.astype(np.float64) / np.where(degenerate, 1.0, scale))
    scale = np.where(degenerate, 1.0, scale).astype(dtype)
    zp = np.where(degenerate, 0, zp)
    return zp, scale


def quantize_array(x: np.ndarray, scale, zp, qtype: int) -> np.ndarray:
    """round(x / scale) + zp, saturated to the type (onnxruntime's rounding: half to even)."""
    lo, hi = _RANGE[qtype]
    q = np.asarray((x.astype(np.float32) / scale).round() + zp)
    return np.clip(q, lo, hi).astype(NP_STORAGE[qtype])


@dataclass
class QParams:
    """Quantization parameters of one tensor: scale and zero point (scalars, or vectors along
    ``axis``) and the element type."""

    scale: np.ndarray
    zero_point: np.ndarray
    qtype: int
    axis: int | None = None


def weight_params(w: np.ndarray, qtype: int, symmetric: bool, reduce_range: bool, axis: int | None,
                  min_real_range: float | None = None) -> QParams:
    """Parameters of a constant: per tensor, or per slice along ``axis``."""
    qmin, qmax = qrange(qtype, reduce_range, symmetric)
    if axis is None:
        lo = w.min() if w.size else 0.0
        hi = w.max() if w.size else 0.0
    else:
        moved = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
        lo, hi = moved.min(axis=1), moved.max(axis=1)
    zp, scale = compute_scale_zp(lo, hi, qmin, qmax, symmetric, min_real_range, dtype=w.dtype)
    return QParams(scale, zp.astype(NP_STORAGE[qtype]), qtype, axis)


def quantize_weight(w: np.ndarray, p: QParams) -> np.ndarray:
    """The constant ``w`` quantized with ``p`` (broadcast along ``p.axis`` when per channel)."""
    if p.axis is None:
        return quantize_array(w, p.scale, p.zero_point.astype(np.float64), p.qtype)
    shape = [1] * w.ndim
    shape[p.axis] = -1
    return quantize_array(w, p.scale.reshape(shape), p.zero_point.astype(np.float64).reshape(shape), p.qtype)


def make_tensor(name: str, values: np.ndarray, qtype: int | None = None) -> TensorProto:
    """An initializer; 4-bit types are packed two to a byte as ONNX stores them."""
    values = np.asarray(values)
    if qtype in (TensorProto.INT4, TensorProto.UINT4):
        return onnx.helper.make_tensor(name, qtype, list(values.shape), values.reshape(-1).tolist())
    if qtype is not None:
        values = values.astype(NP_STORAGE[qtype])
    return numpy_helper.from_array(values, name)


class ModelView:
    """The model being rewritten, with lookups kept in step with edits by the rewriters."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.graph = model.graph
        self.initializers = {t.name: t for t in self.graph.initializer}
        self.types: dict[str, int] = {}
        for vi in list(self.graph.value_info) + list(self.graph.input) + list(self.graph.output):
            if vi.type.HasField("tensor_type"):
                self.types[vi.name] = vi.type.tensor_type.elem_type
        for t in self.graph.initializer:
            self.types[t.name] = t.data_type
        self.graph_inputs = {i.name for i in self.graph.input}
        self.graph_outputs = {o.name for o in self.graph.output}
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        self._arrays: dict[str, np.ndarray] = {}

    def array(self, name: str) -> np.ndarray:
        """The value of an initializer as numpy (cached)."""
        if name not in self._arrays:
            self._arrays[name] = numpy_helper.to_array(self.initializers[name])
        return self._arrays[name]

    def is_initializer(self, name: str) -> bool:
        return name in self.initializers

    def is_float(self, name: str) -> bool:
        return self.types.get(name) in FLOAT_TYPES

    def consumers(self) -> dict[str, list[onnx.NodeProto]]:
        out: dict[str, list[onnx.NodeProto]] = {}
        for n in self.graph.node:
            for i in n.input:
                out.setdefault(i, []).append(n)
        return out

    def add_initializer(self, t: TensorProto) -> str:
        if t.name not in self.initializers:
            self.graph.initializer.append(t)
            self.initializers[t.name] = t
            self.types[t.name] = t.data_type
        return t.name

    def drop_unused_initializers(self) -> None:
        used = {i for n in self.graph.node for i in n.input} | self.graph_outputs
        _collect_subgraph_inputs(self.graph, used)
        keep = [t for t in self.graph.initializer if t.name in used]
        del self.graph.initializer[:]
        self.graph.initializer.extend(keep)
        self.initializers = {t.name: t for t in keep}

    def ensure_ms_opset(self) -> None:
        if any(n.domain == MS_DOMAIN for n in self.graph.node) and \
                not any(o.domain == MS_DOMAIN for o in self.model.opset_import):
            self.model.opset_import.append(onnx.helper.make_opsetid(MS_DOMAIN, 1))


def _collect_subgraph_inputs(graph: onnx.GraphProto, used: set[str]) -> None:
    for n in graph.node:
        for a in n.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                used.update(i for sn in g.node for i in sn.input)
                _collect_subgraph_inputs(g, used)


def node_attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default
