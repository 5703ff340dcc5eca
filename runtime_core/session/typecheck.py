"""Model-level checks and rewrites done at session creation, before the graph is built:
type consistency (as onnxruntime checks it), free-dimension overrides, and turning
overridable initializers into inputs."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import InvalidArgumentError, ModelTypeError
from ..graph import Graph
from ..graph.validate import infer_shapes


def _tensor_elem(t: onnx.TypeProto) -> int:
    return t.tensor_type.elem_type if t.WhichOneof("value") == "tensor_type" else 0


_KNOWN = frozenset(onnx.TensorProto.DataType.values()) - {0}


def _type_name(elem: int) -> str:
    try:
        return f"tensor({onnx.TensorProto.DataType.Name(elem).lower()})"
    except ValueError:
        return f"tensor(<type {elem}>)"


def check_types(model: onnx.ModelProto, weights: dict | None = None) -> None:
    """Refuse a model whose nodes produce an element type other than the one the graph
    declares for that value (graph outputs and ``value_info``): onnxruntime refuses such a
    model at session creation (Fail: "Type Error"), so a run never computes a value whose
    type contradicts the model. Raises :class:`ModelTypeError` naming the value, its producer
    and both types."""
    g = model.graph
    declared = {vi.name: _tensor_elem(vi.type) for vi in list(g.output) + list(g.value_info)}
    declared = {k: v for k, v in declared.items() if v}
    fed = {i.name for i in g.input} | {t.name for t in g.initializer}
    declared = {k: v for k, v in declared.items() if k not in fed}  # a graph input's type is the truth
    if not declared:
        return
    probe = onnx.ModelProto()
    probe.CopyFrom(Graph._skeleton(model, weights))  # large weights left out: only types matter
    del probe.graph.value_info[:]
    for vi in probe.graph.output:  # inference then says what the nodes make
        vi.ClearField("type")
    try:
        inferred = infer_shapes(probe, data_prop=False)  # a child process for crash-prone models
    except Exception:  # noqa: BLE001 - inference is advisory; the run still checks outputs
        return
    got = {vi.name: _tensor_elem(vi.type) for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    producer = {o: n for n in g.node for o in n.output}
    bad = []
    for name, want in declared.items():
        have = got.get(name, 0)
        if have and have != want and have in _KNOWN:  # an unknown type is the graph's to report
            node = producer.get(name)
            who = ("its producer" if node is None else f"node {node.name!r} ({node.op_type})" if node.name
                   else f"its {node.op_type} node")
            bad.append(f"{name!r} is declared {_type_name(want)} but {who} produces {_type_name(have)}")
    if bad:
        raise ModelTypeError("type error in the model: " + "; ".join(bad[:10])
                             + ("" if len(bad) <= 10 else f" (and {len(bad) - 10} more)")
                             + "; fix the declared type or the producer")


def apply_free_dimension_overrides(model: onnx.ModelProto, opts) -> None:
    """Fix symbolic dims named in ``SessionOptions.add_free_dimension_override_by_name`` /
    ``_by_denotation`` to their values, in the graph's inputs, outputs and value_info, so that
    the optimizer sees them fixed and ``get_inputs()`` reports them (as onnxruntime does)."""
    by_name = dict(getattr(opts, "_free_dims_by_name", {}) or {})
    by_den = dict(getattr(opts, "_free_dims_by_denotation", {}) or {})
    if not by_name and not by_den:
        return
    g = model.graph
    infos = list(g.input) + list(g.output) + list(g.value_info)
    for vi in infos:  # a denotation fixes its dim, and so every dim of the same name
        if vi.type.WhichOneof("value") != "tensor_type":
            continue
        for d in vi.type.tensor_type.shape.dim:
            if d.denotation in by_den and d.HasField("dim_param"):
                by_name.setdefault(d.dim_param, by_den[d.denotation])
    for vi in infos:
        if vi.type.WhichOneof("value") != "tensor_type":
            continue
        for d in vi.type.tensor_type.shape.dim:
            if d.denotation in by_den and not d.HasField("dim_value"):
                d.dim_value = by_den[d.denotation]
            elif d.HasField("dim_param") and d.dim_param in by_name:
                d.dim_value = by_name[d.dim_param]


def check_free_dimension(kind: str, key, value) -> tuple[str, int]:
    """Validate one free-dimension override (``kind`` is ``name`` or ``denotation``)."""
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError(f"add_free_dimension_override_by_{kind} takes a non-empty "
                                   f"dimension {kind} (str), got {key!r}")
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise InvalidArgumentError(f"add_free_dimension_override_by_{kind}({key!r}, ...) takes a "
                                   f"dimension value, an int >= 0, got {value!r}")
    return key, int(value)


def initializers_as_inputs(model: onnx.ModelProto, names) -> dict[str, np.ndarray]:
    """Remove the initializers ``names`` (which are also graph inputs) from ``model`` so that
    they are plain inputs; returns their values (the defaults a run feeds when the caller
    does not)."""
    g = model.graph
    keep, defaults = [], {}
    for t in g.initializer:
        if t.name in names:
            defaults[t.name] = numpy_helper.to_array(t)
        else:
            keep.append(t)
    del g.initializer[:]
    g.initializer.extend(keep)
    return defaults
