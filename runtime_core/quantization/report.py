"""Accuracy report: float model vs quantized model, tensor by tensor.

Both models run on runtime_core sessions over the same feeds; every float tensor the two
graphs share by name (graph outputs and the activations the quantizer kept names for) is
compared. Rows come worst first (lowest SQNR)."""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass

import numpy as np
import onnx

from ..errors import InvalidArgumentError
from ._common import FLOAT_TYPES
from ..graph.validate import infer_shapes  # the one door to onnx's shape inference

__all__ = ["TensorError", "accuracy_report", "format_report"]


@dataclass
class TensorError:
    """One tensor of the report: signal-to-quantization-noise ratio (dB; inf when equal),
    largest absolute difference, the float range seen and the quantized model's range."""

    name: str
    sqnr_db: float
    max_abs_error: float
    float_min: float
    float_max: float
    quant_min: float
    quant_max: float
    is_output: bool

    def to_dict(self) -> dict:
        return asdict(self)


def _session(model: onnx.ModelProto, names: list[str], providers):
    from ..session import GraphOptimizationLevel, InferenceSession, SessionOptions

    m = copy.deepcopy(model)
    have = {o.name for o in m.graph.output}
    for n in names:
        if n not in have:
            m.graph.output.append(onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None))
    so = SessionOptions()
    so.graph_optimization_level = GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every compared value
    return InferenceSession(m.SerializeToString(), so, providers=list(providers or ["cpu"]))


def _load(m) -> onnx.ModelProto:
    if isinstance(m, onnx.ModelProto):
        return m
    from .quantize import load_model

    return load_model(m)


def accuracy_report(float_model, quantized_model, feeds, providers=None) -> list[TensorError]:
    """Compare the two models over ``feeds`` (an iterable of input dicts, or a
    CalibrationDataReader) and return one :class:`TensorError` per shared float tensor,
    lowest SQNR first."""
    fm = infer_shapes(_load(float_model), data_prop=False)
    qm = _load(quantized_model)
    ftypes = {vi.name: vi.type.tensor_type.elem_type for vi in
              list(fm.graph.value_info) + list(fm.graph.output) if vi.type.HasField("tensor_type")}
    qproduced = {o for n in qm.graph.node for o in n.output}
    outputs = [o.name for o in fm.graph.output]
    names = [n for n in dict.fromkeys(o for node in fm.graph.node for o in node.output)
             if ftypes.get(n) == onnx.TensorProto.FLOAT and n in qproduced]
    names = list(dict.fromkeys(outputs + names))
    names = [n for n in names if ftypes.get(n) in FLOAT_TYPES]
    fs, qs = _session(fm, names, providers), _session(qm, names, providers)
    sig = dict.fromkeys(names, 0.0)
    noise = dict.fromkeys(names, 0.0)
    mx = dict.fromkeys(names, 0.0)
    fr = {n: [math.inf, -math.inf] for n in names}
    qr = {n: [math.inf, -math.inf] for n in names}
    it = iter(feeds.get_next, None) if hasattr(feeds, "get_next") else iter(feeds)
    count = 0
    for feed in it:
        count += 1
        fv = fs.run(names, feed)
        qv = qs.run(names, feed)
        for n, a, b in zip(names, fv, qv):
            a = np.asarray(a, np.float64)
            b = np.asarray(b, np.float64)
            if a.shape != b.shape or a.size == 0:
                continue
            d = a - b
            sig[n] += float(np.sum(a * a))
            noise[n] += float(np.sum(d * d))
            mx[n] = max(mx[n], float(np.max(np.abs(d))))
            fr[n] = [min(fr[n][0], float(a.min())), max(fr[n][1], float(a.max()))]
            qr[n] = [min(qr[n][0], float(b.min())), max(qr[n][1], float(b.max()))]
    if not count:
        raise InvalidArgumentError("accuracy_report needs at least one input feed")
    rows = []
    for n in names:
        if fr[n][0] == math.inf:
            continue
        sq = math.inf if noise[n] == 0 else (10 * math.log10(sig[n] / noise[n]) if sig[n] > 0 else -math.inf)
        rows.append(TensorError(n, sq, mx[n], fr[n][0], fr[n][1], qr[n][0], qr[n][1], n in outputs))
    rows.sort(key=lambda r: (r.sqnr_db, -r.max_abs_error))
    return rows


def format_report(rows: list[TensorError], limit: int | None = None) -> str:
    """The rows as an aligned text table."""
    head = ("tensor", "SQNR dB", "max |err|", "float range", "quantized range")
    lines = [head]
    for r in rows[:limit]:
        name = r.name + (" (output)" if r.is_output else "")
        lines.append((name, f"{r.sqnr_db:.1f}", f"{r.max_abs_error:.4g}", f"[{r.float_min:.4g}, {r.float_max:.4g}]",
                      f"[{r.quant_min:.4g}, {r.quant_max:.4g}]"))
    w = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(k) for c, k in zip(line, w)).rstrip() for line in lines) + "\n"
