"""QOperator format (static: QLinearConv, QLinearMatMul, QGemm, QLinearAdd/Mul) and the
integer-ops form of dynamic quantization (DynamicQuantizeLinear + MatMulInteger/ConvInteger).

Quantized values flow from one quantized op to the next; a DequantizeLinear is added only
where a float consumer (or a graph output) needs the value back. The forms and names are
those onnxruntime's ONNXQuantizer emits."""

from __future__ import annotations

from dataclasses import dataclass

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from ._common import MS_DOMAIN, ModelView, make_tensor, node_attr, quantize_weight, weight_params
from ._quantizer import Settings, activation_params

DIRECT_8BIT = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose"}


@dataclass
class QValue:
    q_name: str
    scale: str
    zp: str
    axis: int | None = None


def _attrs(node: onnx.NodeProto, drop: tuple = ()) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name not in drop}


class QOperatorQuantizer:
    """Rewrites the graph node by node into ``new`` (static QOperator or dynamic integer ops)."""

    def __init__(self, mv: ModelView, s: Settings, ranges: dict | None):
        self.mv, self.s = mv, s
        self.params = activation_params(mv, s, ranges) if s.static else {}
        self.qmap: dict[str, QValue] = {}
        self.new: list[onnx.NodeProto] = []
        self.produced: set[str] = set()
        self.qnodes: dict[str, onnx.NodeProto] = {}  # activation -> its Quantize node
        self.scale_mul: dict[str, str] = {}

    def emit(self, *nodes: onnx.NodeProto) -> None:
        for n in nodes:
            self.new.append(n)
            self.produced.update(n.output)

    def run(self) -> None:
        handlers = {"Conv": self.conv, "MatMul": self.matmul, "Gather": self.gather}
        if self.s.static:
            handlers.update({"Gemm": self.gemm, "Add": self.binary, "Mul": self.binary,
                             "Relu": self.relu, "Clip": self.relu, "MaxPool": self.maxpool,
                             "Sigmoid": self.unary, "LeakyRelu": self.unary, "AveragePool": self.unary,
                             "Softmax": self.softmax, "GlobalAveragePool": self.global_pool, "Concat": self.concat,
                             "Split": self.split, "Pad": self.pad, "Resize": self.resize})
        for op in DIRECT_8BIT if self.s.static else ("Transpose",):
            handlers[op] = self.direct
        for node in list(self.mv.graph.node):
            h = handlers.get(node.op_type)
            if h is not None and self.s.should_quantize(node) and self._float_input(node) and h(node):
                continue
            self.keep(node)
        for o in self.mv.graph.output:
            self._dequantize(o.name)
        del self.mv.graph.node[:]
        self.mv.graph.node.extend(self.new)
        self.mv.drop_unused_initializers()
        self.mv.ensure_ms_opset()

    def _float_input(self, node) -> bool:
        return self.mv.is_float(node.input[0]) or (len(node.input) > 1 and self.mv.is_float(node.input[1]))

    def keep(self, node: onnx.NodeProto) -> None:
        for i in node.input:
            self._dequantize(i)
        self.emit(node)

    def _dequantize(self, name: str) -> None:
        qv = self.qmap.get(name)
        if qv is None or name in self.produced or name in self.mv.graph_inputs or self.mv.is_initializer(name):
            return
        kw: dict[str, Any] = {"axis": qv.axis} if qv.axis is not None else {}
        self.emit(helper.make_node("DequantizeLinear", [qv.q_name, qv.scale, qv.zp], [name],
                                   name + "_DequantizeLinear", **kw))

    # -- inputs ------------------------------------------------------------------------
    def _out_params(self, t: str, fixed: tuple[float, int] | None = None) -> tuple[str, str] | None:
        p = self.params.get(t)
        if p is None:
            return None
        scale, zp = (np.asarray(p.scale, np.float32), np.asarray(p.zero_point)) if fixed is None else \
            (np.asarray(fixed[0], np.float32), np.asarray(fixed[1]))
        sn, zn = t + "_scale", t + "_zero_point"
        self.mv.add_initializer(make_tensor(sn, scale))
        self.mv.add_initializer(make_tensor(zn, zp, p.qtype))
        return sn, zn

    def _initializer(self, t: str, qtype: int, reduce_range: bool, axis: int | None) -> QValue | None:
        if t in self.qmap:
            return self.qmap[t]
        w, s = self.mv.array(t), self.s
        sym = s.weight_symmetric(qtype) if qtype == s.weight_type else s.activation_symmetric
        if axis is not None:  # per-channel constants are weights whatever their type
            sym = s.weight_symmetric(qtype)
            axis = axis % w.ndim
        p = weight_params(w, qtype, sym, reduce_range, axis, s.min_real_range)
        qn = self.mv.add_initializer(make_tensor(t + "_quantized", quantize_weight(w, p), qtype))
        sn = self.mv.add_initializer(make_tensor(t + "_scale", p.scale.astype(w.dtype)))
        zn = self.mv.add_initializer(make_tensor(t + "_zero_point", p.zero_point, qtype))
        self.qmap[t] = QValue(qn, sn, zn, axis)
        return self.qmap[t]

    def _activation(self, t: str) -> QValue | None:
        if t in self.qmap:
            return self.qmap[t]
        if self.mv.is_initializer(t):
            return self._initializer(t, self.s.activation_type, False, None)
        if t + "_QuantizeLinear" in self.qnodes:
            return self.qmap[t]
        qn = t + "_quantized"
        if self.s.static:
            sz = self._out_params(t)
            if sz is None:
                return None
            node = helper.make_node("QuantizeLinear", [t, *sz], [qn], t + "_QuantizeLinear")
            qv = QValue(qn, *sz)
        else:  # uint8 activations, range computed at run time
            sn, zn = t + "_scale", t + "_zero_point"
            node = helper.make_node("DynamicQuantizeLinear", [t], [qn, sn, zn], t + "_QuantizeLinear")
            qv = QValue(qn, sn, zn)
        self.qnodes[node.name] = node
        self.emit(node)
        self.qmap[t] = qv
        return qv

    def _weight(self, t: str, per_channel_axis: int | None, reduce_range: bool) -> QValue | None:
        if self.mv.is_initializer(t):
            axis = per_channel_axis if self.s.per_channel else None
            return self._initializer(t, self.s.weight_type, self.s.reduce_range and reduce_range, axis)
        return self._activation(t)

    def _bias(self, b: str, a: QValue, w: QValue, beta: float = 1.0) -> str:
        if b in self.qmap:
            return self.qmap[b].q_name
        si = np.asarray(self.mv.array(a.scale) if self.mv.is_initializer(a.scale) else 1.0, np.float32)
        sw = np.asarray(self.mv.array(w.scale), np.float32)
        data = self.mv.array(b)
        scale = (si * sw * np.float32(beta)).astype(np.float32)
        q = np.clip(np.round(data.astype(np.float64) / scale.astype(np.float64)),
                    np.iinfo(np.int32).min, np.iinfo(np.int32).max).astype(np.int32).reshape(data.shape)
        qn = self.mv.add_initializer(make_tensor(b + "_quantized", q))
        self.qmap[b] = QValue(qn, "", "")
        return qn

    def _finish(self, node: onnx.NodeProto, op: str, inputs: list[str], out: tuple[str, str], **kw) -> None:
        y = node.output[0]
        self.emit(helper.make_node(op, inputs, [y + "_quantized"], node.name + "_quant" if node.name else "", **kw))
        self.qmap[y] = QValue(y + "_quantized", *out)

    # -- ops -------------------------------------------------------------------------------
    def conv(self, node) -> bool:
        if not self.s.static:
            return self._integer(node, "ConvInteger", self._weight_plain(node.input[1]))
        out = self._out_params(node.output[0])
        if self.mv.is_initializer(node.input[1]) and self.s.per_channel:
            a = self._activation(node.input[0])
            w = self._initializer(node.input[1], TensorProto.INT8, self.s.reduce_range, 0)
        else:
            a = self._activation(node.input[0])
            w = self._weight_plain(node.input[1])
        if out is None or a is None or w is None:
            return False
        ins = [a.q_name, a.scale, a.zp, w.q_name, w.scale, w.zp, *out]
        if len(node.input) > 2 and node.input[2]:
            ins.append(self._bias(node.input[2], a, w))
        self._finish(node, "QLinearConv", ins, out, **_attrs(node))
        return True

    def _weight_plain(self, t: str) -> QValue | None:
        if self.mv.is_initializer(t):
            return self._initializer(t, self.s.weight_type, self.s.reduce_range, None)
        return self._activation(t)

    def matmul(self, node) -> bool:
        if self.s.matmul_const_b_only and not self.mv.is_initializer(node.input[1]):
            return False
        if not self.s.static:
            return self._integer(node, "MatMulInteger", self._weight(node.input[1], -1, True))
        out = self._out_params(node.output[0])
        a = self._activation(node.input[0])
        w = self._weight(node.input[1], -1, True)
        if out is None or a is None or w is None:
            return False
        self._finish(node, "QLinearMatMul", [a.q_name, a.scale, a.zp, w.q_name, w.scale, w.zp, *out], out)
        return True

    def _integer(self, node, op: str, w: QValue | None) -> bool:
        a = self._activation(node.input[0])
        if a is None or w is None:
            return False
        y = node.output[0]
        name = node.name + "_quant" if node.name else ""
        iy = y + "_output_quantized"
        self.emit(helper.make_node(op, [a.q_name, w.q_name, a.zp, w.zp], [iy], name,
                                   **(_attrs(node) if op == "ConvInteger" else {})))
        otype = self.mv.types.get(y, TensorProto.FLOAT) or TensorProto.FLOAT
        self.emit(helper.make_node("Cast", [iy], [iy + "_cast_output"], iy + "_cast", to=otype))
        mul_name = name + "_scales_mul" if name else f"{a.scale}_{w.scale}_mul"
        if mul_name not in self.scale_mul:
            self.emit(helper.make_node("Mul", [a.scale, w.scale], [mul_name + ":0"], mul_name))
            self.scale_mul[mul_name] = mul_name + ":0"
        has_bias = op == "ConvInteger" and len(node.input) > 2 and node.input[2]
        scaled = y + "quant_scaled_output" if has_bias else y
        self.emit(helper.make_node("Mul", [iy + "_cast_output", self.scale_mul[mul_name]], [scaled],
                                   name + "_output_scale_mul" if name else ""))
        if has_bias:
            shape = np.ones(len(self.mv.initializers[node.input[1]].dims), np.int64)
            shape[1] = -1
            sn = self.mv.add_initializer(make_tensor(y + "_bias_reshape_shape", shape))
            self.emit(helper.make_node("Reshape", [node.input[2], sn], [y + "_bias_reshape_output"]),
                      helper.make_node("Add", [scaled, y + "_bias_reshape_output"], [y], y + "_bias_add"))
        return True

    def gemm(self, node) -> bool:
        out = self._out_params(node.output[0])
        a = self._activation(node.input[0])
        if self.mv.is_initializer(node.input[1]) and self.s.per_channel:
            w = self._initializer(node.input[1], self.s.weight_type, self.s.reduce_range,
                                  0 if node_attr(node, "transB", 0) else 1)
        else:
            w = self._weight_plain(node.input[1])
        if out is None or a is None or w is None:
            return False
        bias = ""
        if len(node.input) > 2 and node.input[2]:
            if not self.mv.is_initializer(node.input[2]):
                return False
            bias = self._bias(node.input[2], a, w, float(node_attr(node, "beta", 1.0)))
        ins = [a.q_name, a.scale, a.zp, w.q_name, w.scale, w.zp, bias, *out]
        self._finish(node, "QGemm", ins, out, domain=MS_DOMAIN, **_attrs(node, ("beta",)))
        return True

    def binary(self, node) -> bool:
        out = self._out_params(node.output[0])
        a, b = self._activation(node.input[0]), self._activation(node.input[1])
        if out is None or a is None or b is None:
            return False
        self._finish(node, "QLinear" + node.op_type, [a.q_name, a.scale, a.zp, b.q_name, b.scale, b.zp, *out], out,
                     domain=MS_DOMAIN, **_attrs(node))
        return True

    def unary(self, node, fixed: tuple[float, int] | None = None, **extra) -> bool:
        """QLinearSigmoid / QLinearLeakyRelu / QLinearAveragePool / QLinearSoftmax (com.microsoft)."""
        out = self._out_params(node.output[0], fixed)
        a = self._activation(node.input[0]) if out is not None else None
        if out is None or a is None:
            return False
        self._finish(node, "QLinear" + node.op_type, [a.q_name, a.scale, a.zp, *out], out, domain=MS_DOMAIN,
                     **_attrs(node), **extra)
        return True

    def softmax(self, node) -> bool:
        """Softmax's output is in [0, 1]: a fixed scale of 1/256 (onnxruntime's choice)."""
        zp = 0 if self.s.activation_type == TensorProto.UINT8 else -128
        return self.unary(node, (1 / 256.0, zp), opset=self.mv.opset)

    def global_pool(self, node) -> bool:
        """Only after a quantized producer; the output keeps the input's scale when uncalibrated."""
        qv = self.qmap.get(node.input[0])
        if qv is None:
            return False
        out = self._out_params(node.output[0]) or (qv.scale, qv.zp)
        self._finish(node, "QLinearGlobalAveragePool", [qv.q_name, qv.scale, qv.zp, *out], out, domain=MS_DOMAIN,
                     **_attrs(node), channels_last=0)
        return True

    def concat(self, node) -> bool:
        out = self._out_params(node.output[0])
        if out is None:
            return False
        ins = [self._activation(i) for i in node.input]
        if any(q is None for q in ins):
            return False
        flat = [x for q in ins if q is not None for x in (q.q_name, q.scale, q.zp)]
        self._finish(node, "QLinearConcat", [*out, *flat], out, domain=MS_DOMAIN, **_attrs(node))
        return True

    def split(self, node) -> bool:
        """Split of the quantized values: every part keeps the input's scale."""
        a = self._activation(node.input[0])
        if a is None:
            return False
        for i in node.input[1:]:
            self._dequantize(i)
        outs = [y + "quantized" for y in node.output]
        self.emit(helper.make_node("Split", [a.q_name, *node.input[1:]], outs,
                                   node.name + "_quant" if node.name else "", **_attrs(node)))
        for y, q in zip(node.output, outs):
            self.qmap[y] = QValue(q, a.scale, a.zp)
        return True

    def resize(self, node) -> bool:
        return self.mv.opset >= 11 and self.direct(node)

    def pad(self, node) -> bool:
        """Pad of a quantized value; the pad value is quantized with the input's parameters."""
        qv = self.qmap.get(node.input[0])
        if qv is None or self.mv.opset < 11:
            return False
        n = onnx.NodeProto()
        n.CopyFrom(node)
        if node_attr(node, "mode", b"constant") == b"constant":
            if len(n.input) > 2 and n.input[2]:
                if not self.mv.is_initializer(n.input[2]):
                    return False
                from ._common import quantize_array

                c = quantize_array(self.mv.array(n.input[2]), np.float32(self.mv.array(qv.scale)),
                                   np.float32(self.mv.array(qv.zp)), self.s.activation_type)
                n.input[2] = self.mv.add_initializer(make_tensor(n.input[2] + "_quantized", c,
                                                                 self.s.activation_type))
            elif len(n.input) == 2:
                n.input.append(qv.zp)  # padding with 0.0 is padding with the zero point
            else:
                n.input[2] = qv.zp
        n.input[0] = qv.q_name
        n.output[0] = node.output[0] + "_quantized"
        self.emit(n)
        self.qmap[node.output[0]] = QValue(n.output[0], qv.scale, qv.zp)
        return True

    def relu(self, node) -> bool:
        if node.input[0] not in self.qmap or self.s.activation_symmetric:
            return False
        self.qmap[node.output[0]] = self.qmap[node.input[0]]
        return True

    def maxpool(self, node) -> bool:
        return self.mv.opset >= 12 and self.direct(node)

    def direct(self, node) -> bool:
        x = node.input[0]
        if x not in self.qmap:
            if not (self.s.force_no_input_check and self.s.static and self.mv.is_float(x)):
                return False
            if self._activation(x) is None:
                return False
        qv = self.qmap[x]
        y = node.output[0]
        n = onnx.NodeProto()
        n.CopyFrom(node)
        n.input[0] = qv.q_name
        n.output[0] = y + "_quantized"
        for i in list(n.input[1:]):
            self._dequantize(i)
        self.emit(n)
        self.qmap[y] = QValue(y + "_quantized", qv.scale, qv.zp, qv.axis)
        return True

    def gather(self, node) -> bool:
        if not (self.mv.is_initializer(node.input[0]) and self.mv.is_float(node.input[0])):
            return False
        qv = self._activation(node.input[0])
        if qv is None:
            return False
        self._dequantize(node.input[1])
        y = node.output[0]
        self.emit(helper.make_node("Gather", [qv.q_name, node.input[1]], [y + "_quantized"], node.name,
                                   **_attrs(node)))
        self.qmap[y] = QValue(y + "_quantized", qv.scale, qv.zp)
        return True


def gemm_to_matmul(mv: ModelView) -> None:
    """Plain Gemms (alpha = beta = 1, no transA) become MatMul (+ Add), so that dynamic
    quantization reaches them as MatMulInteger; a transposed constant B is stored transposed."""
    new: list[onnx.NodeProto] = []
    transposed: dict[str, str] = {}
    for node in mv.graph.node:
        if node.op_type != "Gemm" or node_attr(node, "alpha", 1.0) != 1.0 or node_attr(node, "beta", 1.0) != 1.0 \
                or node_attr(node, "transA", 0):
            new.append(node)
            continue
        b = node.input[1]
        if node_attr(node, "transB", 0):
            if mv.is_initializer(b):
                if b not in transposed:
                    name = b + "_Transposed"
                    k = 0
                    while name in mv.initializers or name in mv.types:
                        k += 1
                        name = f"{b}_Transposed_{k}"
                    mv.add_initializer(make_tensor(name, np.ascontiguousarray(mv.array(b).T)))
                    transposed[b] = name
                b = transposed[b]
            else:
                new.append(helper.make_node("Transpose", [b], [b + "_Transposed"],
                                            node.name + "_Transpose" if node.name else ""))
                b = b + "_Transposed"
                mv.types[b] = mv.types.get(node.input[1], TensorProto.FLOAT)
        y = node.output[0]
        has_c = len(node.input) > 2 and node.input[2]
        mm_out = y + "_MatMul" if has_c else y
        mv.types[mm_out] = mv.types.get(y, TensorProto.FLOAT)
        new.append(helper.make_node("MatMul", [node.input[0], b], [mm_out], node.name + "_MatMul" if node.name else ""))
        if has_c:
            new.append(helper.make_node("Add", [mm_out, node.input[2]], [y], node.name + "_Add" if node.name else ""))
    del mv.graph.node[:]
    mv.graph.node.extend(new)
