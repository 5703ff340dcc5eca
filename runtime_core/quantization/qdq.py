"""QDQ format: QuantizeLinear -> DequantizeLinear pairs on activations, quantized constants
behind a DequantizeLinear, int32 biases. Which tensors each op type marks, and the names of
what is inserted, follow onnxruntime's QDQ quantizer, so models match its output."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..errors import InvalidArgumentError
from ._common import ModelView, QParams, make_tensor, node_attr, quantize_weight, weight_params
from ._quantizer import Settings, activation_params

DIRECT_8BIT = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "AveragePool", "Slice", "TopK"}
NORMS = {"InstanceNormalization", "LayerNormalization", "BatchNormalization"}


class QDQQuantizer:
    """Marks tensors node by node, then inserts the Q/DQ nodes for all marked tensors."""

    def __init__(self, mv: ModelView, s: Settings, ranges: dict):
        self.mv, self.s = mv, s
        self.params = activation_params(mv, s, ranges)
        self.marked: dict[str, tuple] = {}   # tensor -> ("act",) | ("weight", axis) | ("shared", src)
        self.bias: dict[str, tuple] = {}     # bias -> (input, weight, beta)
        self.removed: list[onnx.NodeProto] = []
        self.qnames: dict[str, tuple[str, str]] = {}  # quantized tensor -> (scale name, zp name)
        self.wparams: dict[str, QParams] = {}

    # -- marking -------------------------------------------------------------------------
    def _quantizable(self, t: str) -> bool:
        return bool(t) and self.mv.is_float(t)

    def mark_act(self, t: str) -> None:
        if self._quantizable(t) and t not in self.marked:
            self.marked[t] = ("act",)

    def mark_weight(self, t: str, axis: int | None = None) -> None:
        if not self._quantizable(t):
            return
        if axis is not None and self.mv.is_initializer(t):
            self.marked[t] = ("weight", axis)
        elif t not in self.marked:
            self.marked[t] = ("weight", None)

    def mark_shared(self, out: str, src: str) -> None:
        if self._quantizable(out):
            self.marked[out] = ("shared", src)

    def is_marked(self, t: str) -> bool:
        return t in self.marked or t in self.bias

    def per_channel_axis(self, t: str, default: int, op_type: str | None = None) -> int | None:
        if not self.s.per_channel or not self.mv.is_initializer(t):
            return None
        axis = self.s.qdq_axis.get(op_type, default) if op_type else default
        rank = len(self.mv.initializers[t].dims)
        if not -rank <= axis < rank:
            return None
        return axis % rank

    def run(self) -> None:
        for node in list(self.mv.graph.node):
            if self.s.should_quantize(node):
                self.mark(node)
        self.insert()

    def mark(self, n: onnx.NodeProto) -> None:
        op, s = n.op_type, self.s
        out_ok = op not in s.no_output_ops
        if op in ("Conv", "ConvTranspose"):
            self.mark_act(n.input[0])
            if out_ok:
                self.mark_act(n.output[0])
            self.mark_weight(n.input[1], self.per_channel_axis(n.input[1], 0 if op == "Conv" else 1))
            if len(n.input) > 2 and n.input[2]:
                self.bias[n.input[2]] = (n.input[0], n.input[1], 1.0)
        elif op == "Gemm":
            self.mark_act(n.input[0])
            if out_ok:
                self.mark_act(n.output[0])
            tb = node_attr(n, "transB", 0)
            self.mark_weight(n.input[1], self.per_channel_axis(n.input[1], 0 if tb else 1))
            if len(n.input) > 2 and n.input[2] and self.mv.is_initializer(n.input[2]):
                self.bias[n.input[2]] = (n.input[0], n.input[1], float(node_attr(n, "beta", 1.0)))
                for a in n.attribute:  # the int32 bias already carries beta
                    if a.name == "beta":
                        a.f = 1.0
        elif op == "MatMul":
            for t in list(n.input) + (list(n.output) if out_ok else []):
                if self.mv.is_initializer(t):
                    self.mark_weight(t, self.per_channel_axis(t, 1, op))
                else:
                    self.mark_act(t)
        elif op in ("Relu", "Clip"):
            if not self.is_marked(n.input[0]):
                return
            if not s.activation_symmetric and not s.keep_removable and self._fold_into_producer(n):
                self.removed.append(n)
            else:
                self.mark_act(n.input[0])
            if out_ok:
                self.mark_act(n.output[0])
        elif op in DIRECT_8BIT or (op == "MaxPool" and self.mv.opset >= 12) or (op == "Resize" and self.mv.opset >= 11):
            if s.force_no_input_check:
                self.mark_act(n.input[0])
                if out_ok:
                    self.mark_shared(n.output[0], n.input[0])
            elif self.is_marked(n.input[0]) and out_ok:
                self.mark_shared(n.output[0], n.input[0])
        elif op in ("MaxPool", "Resize"):
            return
        elif op == "Split":
            if not self.is_marked(n.input[0]):
                self.mark_act(n.input[0])
            if out_ok:
                for o in n.output:
                    self.mark_shared(o, n.input[0])
        elif op in ("Gather", "GatherElements"):
            if (self.mv.is_initializer(n.input[0]) and self.mv.is_float(n.input[0])) or s.force_no_input_check:
                self.mark_act(n.input[0])
                self.mark_shared(n.output[0], n.input[0])
            elif self.is_marked(n.input[0]):
                self.mark_shared(n.output[0], n.input[0])
        elif op == "Where":
            if s.force_no_input_check:
                self.mark_act(n.input[1])
                self.mark_act(n.input[2])
                if out_ok:
                    self.mark_act(n.output[0])
            elif self.is_marked(n.input[1]) and self.is_marked(n.input[2]) and out_ok:
                self.mark_act(n.output[0])
        elif op in NORMS:
            self.mark_act(n.input[0])
            ax = self.per_channel_axis(n.input[1], 1, op)
            if ax is not None:
                self.mark_weight(n.input[1], ax)
            elif self.mv.is_initializer(n.input[1]):
                self.mark_weight(n.input[1])
            else:
                self.mark_act(n.input[1])
            if len(n.input) > 2 and n.input[2]:
                self.bias[n.input[2]] = (n.input[0], n.input[1], 1.0)
            if out_ok:
                for o in n.output:
                    self.mark_act(o)
        elif op == "Pad":
            self.mark_act(n.input[0])
            if out_ok:
                if self._pad_keeps_range(n):
                    self.mark_shared(n.output[0], n.input[0])
                else:
                    self.mark_act(n.output[0])
        else:
            for t in n.input:
                self.mark_act(t)
            if out_ok:
                for t in n.output:
                    self.mark_act(t)

    def _pad_keeps_range(self, n: onnx.NodeProto) -> bool:
        mode = node_attr(n, "mode", b"constant")
        if mode in (b"reflect", b"edge", b"wrap"):
            return True
        if len(n.input) >= 3 and n.input[2]:
            if not self.mv.is_initializer(n.input[2]):
                return False
            return float(self.mv.array(n.input[2]).reshape(-1)[0]) == 0.0
        return True

    def _fold_into_producer(self, relu: onnx.NodeProto) -> bool:
        """Relu/Clip after a quantized tensor disappears: its range is in the zero point."""
        up, out = relu.input[0], relu.output[0]
        consumers = self.mv.consumers()
        if out not in self.params or up not in self.params or len(consumers.get(up, [])) != 1:
            return False
        if up in self.mv.graph_outputs or up in self.mv.graph_inputs:
            return False
        for node in self.mv.graph.node:
            for i, o in enumerate(node.output):
                if o == up:
                    node.output[i] = out
        self.marked.pop(up, None)
        return True

    # -- insertion -----------------------------------------------------------------------
    def _replace_inputs(self, old: str, new: str, skip: set[int]) -> None:
        for node in self.mv.graph.node:
            if id(node) in skip:
                continue
            for i, x in enumerate(node.input):
                if x == old:
                    node.input[i] = new

    def _add_qdq(self, t: str, scale: str, zp: str) -> None:
        g = self.mv.graph
        if t in self.mv.graph_outputs:
            q_in, dq_out = t + "_QuantizeLinear_Input", t
            for node in g.node:
                for i, o in enumerate(node.output):
                    if o == t:
                        node.output[i] = q_in
        else:
            q_in, dq_out = t, t + "_DequantizeLinear_Output"
            self._replace_inputs(t, dq_out, set())
        qo = t + "_QuantizeLinear_Output"
        kw: dict[str, Any] = {"domain": self.s.qdq_domain} if self.s.qdq_domain else {}
        g.node.append(helper.make_node("QuantizeLinear", [q_in, scale, zp], [qo], t + "_QuantizeLinear", **kw))
        g.node.append(helper.make_node("DequantizeLinear", [qo, scale, zp], [dq_out], t + "_DequantizeLinear", **kw))
        self.qnames[t] = (scale, zp)

    def _weight_params(self, t: str, axis: int | None, is_weight: bool) -> QParams:
        s, w = self.s, self.mv.array(t)
        qtype = s.weight_type if is_weight else s.activation_type
        sym = axis is not None or (s.weight_symmetric(qtype) if is_weight else s.activation_symmetric)
        return weight_params(w, qtype, sym, s.reduce_range, axis, s.min_real_range)

    def _widen_weight_scales_for_bias(self) -> None:
        """A bias scale (input scale x weight scale) so small that the int32 bias would clip
        gets a larger weight scale instead (symmetric int8/int16 weights, as onnxruntime)."""
        qrange = float(np.iinfo(np.int32).max) - float(np.iinfo(np.int32).min + 1)
        for b, (inp, w, _beta) in self.bias.items():
            p = self.wparams.get(w)
            if (p is None or inp not in self.params or self.marked.get(inp) != ("act",)
                    or not self.mv.is_initializer(b) or p.qtype not in (TensorProto.INT8, TensorProto.INT16)
                    or np.asarray(p.zero_point).any()):
                continue
            si = float(self.params[inp].scale)
            bias = self.mv.array(b).astype(np.float64)
            scale = np.array(p.scale, dtype=np.float64, copy=True)
            if p.axis is None:
                lim = 1.0001 * 2.0 * max(abs(min(bias.min(), 0.0)), abs(max(bias.max(), 0.0))) / qrange
                c = si * float(scale)
                if 0.0 < c < lim:
                    scale = np.asarray(scale * (lim / c))
            else:
                need = 1.0001 * 2.0 * np.abs(bias.reshape(-1)) / qrange
                cand = si * scale
                grow = (cand > 0) & (cand < need)
                scale = np.where(grow, scale * need / np.where(grow, cand, 1.0), scale)
            new = scale.astype(p.scale.dtype)
            if not np.array_equal(new, p.scale):
                self.wparams[w] = QParams(new, p.zero_point, p.qtype, p.axis)

    def _weight(self, t: str, axis: int | None, is_weight: bool) -> None:
        s, w = self.s, self.mv.array(t)
        qtype = s.weight_type if is_weight else s.activation_type
        p = self.wparams[t]
        scale_n, zp_n = t + "_scale", t + "_zero_point"
        self.mv.add_initializer(make_tensor(scale_n, p.scale.astype(w.dtype)))
        self.mv.add_initializer(make_tensor(zp_n, p.zero_point, qtype))
        dq_out = t + "_DequantizeLinear_Output"
        self._replace_inputs(t, dq_out, set())
        kw: dict[str, Any] = {"axis": axis} if axis is not None else {}
        if s.qdq_domain:
            kw["domain"] = s.qdq_domain
        g = self.mv.graph
        if s.add_qdq_pair_to_weight:
            qo = t + "_QuantizeLinear_Output"
            g.node.append(helper.make_node("QuantizeLinear", [t, scale_n, zp_n], [qo], t + "_QuantizeLinear", **kw))
            g.node.append(helper.make_node("DequantizeLinear", [qo, scale_n, zp_n], [dq_out],
                                           t + "_DequantizeLinear", **kw))
        else:
            qn = self.mv.add_initializer(make_tensor(t + "_quantized", quantize_weight(w, p), qtype))
            g.node.append(helper.make_node("DequantizeLinear", [qn, scale_n, zp_n], [dq_out],
                                           t + "_DequantizeLinear", **kw))
        self.qnames[t] = (scale_n, zp_n)

    def _act_initializers(self, t: str) -> tuple[str, str]:
        p = self.params.get(t)
        if p is None:
            raise InvalidArgumentError(
                f"no calibrated range for tensor {t!r}, which the quantizer was asked to quantize; "
                "calibrate with the same op_types_to_quantize, or exclude the nodes that use it")
        scale_n, zp_n = t + "_scale", t + "_zero_point"
        self.mv.add_initializer(make_tensor(scale_n, np.asarray(p.scale, np.float32)))
        self.mv.add_initializer(make_tensor(zp_n, np.asarray(p.zero_point), p.qtype))
        return scale_n, zp_n

    def insert(self) -> None:
        for t, info in self.marked.items():
            if info[0] != "shared" and self.mv.is_initializer(t):
                self.wparams[t] = self._weight_params(t, info[1] if info[0] == "weight" else None,
                                                      info[0] == "weight")
        if not self.s.no_bias_weight_adjust:
            self._widen_weight_scales_for_bias()
        for t, info in list(self.marked.items()):
            if info[0] == "shared":
                continue
            if self.mv.is_initializer(t):
                self._weight(t, info[1] if info[0] == "weight" else None, info[0] == "weight")
            elif self._produced_by_dq(t):
                continue  # already a dequantized value (a pre-quantized model)
            else:
                self._add_qdq(t, *self._act_initializers(t))
        pending = {t: i[1] for t, i in self.marked.items() if i[0] == "shared"}
        while pending:
            done = [t for t, src in pending.items() if src in self.qnames]
            if not done:
                break  # their source was never quantized: they stay float
            for t in done:
                self._add_qdq(t, *self.qnames[pending.pop(t)])
        for b, (inp, w, beta) in self.bias.items():
            self._bias(b, inp, w, beta)
        if self.removed:
            keep = [n for n in self.mv.graph.node if all(n is not r for r in self.removed)]
            del self.mv.graph.node[:]
            self.mv.graph.node.extend(keep)
        if not self.s.add_qdq_pair_to_weight:
            self.mv.drop_unused_initializers()

    def _produced_by_dq(self, t: str) -> bool:
        return any(n.op_type == "DequantizeLinear" and t in n.output for n in self.mv.graph.node)

    def _scale_of(self, t: str) -> np.ndarray | None:
        if t in self.wparams:
            return np.asarray(self.wparams[t].scale, np.float32)
        if t in self.params:
            return np.asarray(self.params[t].scale, np.float32)
        return None

    def _bias(self, b: str, inp: str, w: str, beta: float) -> None:
        if not self.mv.is_initializer(b) or inp not in self.qnames or w not in self.qnames:
            return
        si, sw = self._scale_of(inp), self._scale_of(w)
        if si is None or sw is None:
            return
        data = self.mv.array(b)
        bias_scale = (si * sw * np.float32(beta)).astype(np.float32)
        bias_scale = np.where(bias_scale == 0, np.float32(1), bias_scale).astype(np.float32)
        q = np.clip(np.round(data.astype(np.float64) / bias_scale.astype(np.float64)),
                    np.iinfo(np.int32).min, np.iinfo(np.int32).max).astype(np.int32)
        qn = self.mv.add_initializer(make_tensor(b + "_quantized", q.reshape(data.shape)))
        sn = self.mv.add_initializer(make_tensor(b + "_quantized_scale", bias_scale.reshape(-1) if bias_scale.size > 1
                                                 else bias_scale.reshape(())))
        zp = np.zeros(bias_scale.size, np.int32) if bias_scale.size > 1 else np.zeros((), np.int32)
        zn = self.mv.add_initializer(make_tensor(b + "_quantized_zero_point", zp))
        kw: dict[str, Any] = {"axis": 0} if bias_scale.size > 1 else {}
        g = self.mv.graph
        keep = [t for t in g.initializer if t.name != b]
        del g.initializer[:]
        g.initializer.extend(keep)
        self.mv.initializers.pop(b, None)
        g.node.append(helper.make_node("DequantizeLinear", [qn, sn, zn], [b], b + "_DequantizeLinear", **kw))
