"""Settings shared by the QDQ and QOperator rewriters, activation parameters from calibrated
ranges, and the final topological sort."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto

from ..errors import InvalidArgumentError
from ._common import ModelView, QParams, compute_scale_zp, qrange
from ..graph.order import stable_order


@dataclass
class Settings:
    """What onnxruntime's quantize_* arguments and extra_options ask for."""

    per_channel: bool = False
    reduce_range: bool = False
    weight_type: int = TensorProto.INT8
    activation_type: int = TensorProto.UINT8
    op_types: set[str] = field(default_factory=set)
    nodes_to_quantize: set[str] = field(default_factory=set)
    nodes_to_exclude: set[str] = field(default_factory=set)
    activation_symmetric: bool = False
    weight_symmetric_opt: bool | None = None
    force_no_input_check: bool = False
    matmul_const_b_only: bool = False
    add_qdq_pair_to_weight: bool = False
    keep_removable: bool = False
    no_output_ops: set[str] = field(default_factory=set)
    qdq_axis: dict[str, int] = field(default_factory=dict)
    qdq_domain: str | None = None
    min_real_range: float | None = None
    static: bool = True
    no_bias_weight_adjust: bool = False

    @classmethod
    def from_options(cls, extra: dict, **kw) -> "Settings":
        s = cls(**kw)
        s.activation_symmetric = bool(extra.get("ActivationSymmetric", False))
        ws = extra.get("WeightSymmetric", None)
        s.weight_symmetric_opt = None if ws is None else bool(ws)
        s.force_no_input_check = bool(extra.get("ForceQuantizeNoInputCheck", False))
        s.matmul_const_b_only = bool(extra.get("MatMulConstBOnly", not s.static))
        s.add_qdq_pair_to_weight = bool(extra.get("AddQDQPairToWeight", False))
        s.keep_removable = bool(extra.get("QDQKeepRemovableActivations", False))
        s.no_output_ops = set(extra.get("OpTypesToExcludeOutputQuantization", []) or [])
        s.qdq_axis = dict(extra.get("QDQOpTypePerChannelSupportToAxis", {}) or {})
        s.qdq_domain = "com.microsoft" if extra.get("UseQDQContribOps", False) else None
        s.no_bias_weight_adjust = bool(extra.get("QDQDisableWeightAdjustForInt32Bias", False))
        mrr = extra.get("MinimumRealRange", None)
        s.min_real_range = None if mrr is None else float(mrr)
        return s

    def weight_symmetric(self, qtype: int) -> bool:
        if self.weight_symmetric_opt is not None:
            return self.weight_symmetric_opt
        return qtype in (TensorProto.INT4, TensorProto.INT8, TensorProto.INT16)

    def should_quantize(self, node: onnx.NodeProto) -> bool:
        if self.nodes_to_quantize and node.name not in self.nodes_to_quantize:
            return False
        if node.op_type not in self.op_types or node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            return False
        return node.name not in self.nodes_to_exclude


def adjust_ranges(mv: ModelView, s: Settings, ranges: dict) -> dict:
    """A Relu/Clip's input takes its output's range (the activation then folds away);
    a Softmax's output is [0, 1]."""
    ranges = dict(ranges)
    consumers = mv.consumers()
    for n in mv.graph.node:
        if not s.should_quantize(n):
            continue
        if n.op_type in ("Relu", "Clip"):
            if len(consumers.get(n.input[0], [])) == 1 and n.input[0] in ranges and n.output[0] in ranges:
                ranges[n.input[0]] = ranges[n.output[0]]
        elif n.op_type == "Softmax":
            ranges[n.output[0]] = (np.float32(0.0), np.float32(1.0))
    return ranges


def _range_of(r) -> tuple:
    return r.range_value if hasattr(r, "range_value") else tuple(r)


def activation_params(mv: ModelView, s: Settings, ranges: dict | None) -> dict[str, QParams]:
    """Scale and zero point of every calibrated tensor for the activation type."""
    if not ranges:
        return {}
    out = {}
    qmin, qmax = qrange(s.activation_type, False, s.activation_symmetric)
    for t, r in adjust_ranges(mv, s, ranges).items():
        lo, hi = _range_of(r)
        zp, scale = compute_scale_zp(np.asarray(lo, np.float32), np.asarray(hi, np.float32), qmin, qmax,
                                     s.activation_symmetric, s.min_real_range)
        out[t] = QParams(scale.reshape(()), zp.reshape(()), s.activation_type)
    return out


def topological_sort(graph: onnx.GraphProto) -> None:
    """Reorder nodes so each comes after the producers of its inputs (stable otherwise)."""
    produced = {o: i for i, n in enumerate(graph.node) for o in n.output if o}
    nodes = list(graph.node)
    deps = []
    for n in nodes:
        d = {produced[i] for i in n.input if i in produced}
        for a in n.attribute:  # a subgraph may read outer values
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                d |= {produced[i] for sn in g.node for i in sn.input if i in produced}
        deps.append(d)
    order = stable_order(deps)
    if order is None:
        raise InvalidArgumentError("the quantized graph has a cycle; this is a bug in the quantizer")
    del graph.node[:]
    graph.node.extend(nodes[i] for i in order)
