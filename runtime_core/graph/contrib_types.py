"""Types of values that onnx shape inference leaves unknown: the outputs of the non-ONNX ops
the optimizer emits, and everything downstream of them.

onnx knows no schema for ``com.microsoft`` ops (``Attention``, ``SkipLayerNormalization``,
``SimplifiedLayerNormalization``, ``SkipSimplifiedLayerNormalization``, ``FusedConv``, ``Gelu``,
``FastGelu``, ``BiasGelu``, ``FusedMatMul``) nor for the core's channels-last
``runtime_core.nhwc`` ops and ``runtime_core.fused``'s ``MatMulActivation`` and ``ScaledDotProductAttention``, so after them every value has an unknown type, and providers that
need types decline correct work. :func:`fill_types` walks the graph once, in order, and
types each untyped output: a contrib op by its rule here, any other op by onnx's inference of
that one node (``onnx.shape_inference.infer_node_outputs``) from the types of its inputs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import onnx
from onnx import TensorProto, helper

from .validate import _extreme_int

logger = logging.getLogger("runtime_core.graph")

MS = "com.microsoft"
NHWC = "runtime_core.nhwc"
FUSED = "runtime_core.fused"

TypeMap = dict  # value name -> onnx.TypeProto


def _dims(tp: onnx.TypeProto | None) -> list | None:
    if tp is None or tp.WhichOneof("value") != "tensor_type" or not tp.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tp.tensor_type.shape.dim]


def _elem(tp: onnx.TypeProto | None) -> int:
    if tp is None or tp.WhichOneof("value") != "tensor_type":
        return TensorProto.UNDEFINED
    return tp.tensor_type.elem_type


def _tensor(elem: int, dims: list | None) -> onnx.TypeProto:
    if dims is None:
        tp = onnx.TypeProto()
        tp.tensor_type.elem_type = elem
        return tp
    return helper.make_tensor_type_proto(elem, dims)


def _by_proxy(op: str, inputs: list, attrs: list, types: Mapping, opset: int) -> list:
    """Output types of the standard op ``op`` on these inputs (onnx's own inference)."""
    schema = onnx.defs.get_schema(op, max_inclusive_version=opset, domain="")
    node = helper.make_node(op, [f"i{k}" if i else "" for k, i in enumerate(inputs)], ["o"])
    node.attribute.extend(attrs)
    if _extreme_int("", node) is not None:  # what onnx's inference crashes on
        return [None]
    ins = {f"i{k}": types[i] for k, i in enumerate(inputs) if i}
    out = onnx.shape_inference.infer_node_outputs(schema, node, ins,
                                                  opset_imports=[helper.make_opsetid("", opset)])
    return [out.get("o")]


def _same_as_input(node, types, opset) -> list:
    return [types.get(node.inputs[0])]


def _bias_gelu(node, types, opset) -> list:
    if len(node.inputs) < 2 or not node.inputs[1]:
        return [types.get(node.inputs[0])]
    return _by_proxy("Add", node.inputs[:2], [], types, max(opset, 14))


def _skip_layer_norm(node, types, opset) -> list:
    x = types.get(node.inputs[0])
    dims = _dims(x)
    stat = _tensor(TensorProto.FLOAT, None if dims is None else dims[:-1] + [1])
    return [x, stat, stat, x]


def _simplified_layer_norm(node, types, opset) -> list:
    """Y as X; inv_std_var in the stash type with 1s over the normalized axes."""
    x = types.get(node.inputs[0])
    dims = _dims(x)
    stash = TensorProto.DOUBLE if node.attrs.get("stash_type", 1) == 11 else TensorProto.FLOAT
    axis = node.attrs.get("axis", -1)
    if dims is not None:
        ax = axis + len(dims) if axis < 0 else axis
        dims = dims[:ax] + [1] * (len(dims) - ax) if 0 <= ax < len(dims) else None
    return [x, _tensor(stash, dims)]


def _attention(node, types, opset) -> list:
    x, w = types.get(node.inputs[0]), types.get(node.inputs[1]) if len(node.inputs) > 1 else None
    xd, wd = _dims(x), _dims(w)
    if xd is None or len(xd) != 3:
        return [None]
    sizes = node.attrs.get("qkv_hidden_sizes")
    if sizes:
        v_hidden = int(sizes[2])
    elif wd is not None and len(wd) == 2 and isinstance(wd[1], int):
        v_hidden = wd[1] // 3
    else:
        v_hidden = None
    return [_tensor(_elem(x), [xd[0], xd[1], v_hidden])]


def _fused_conv(node, types, opset) -> list:
    attrs = [a for a in node.proto_attrs if a.name not in ("activation", "activation_params")]
    return _by_proxy("Conv", node.inputs[:3], attrs, types, max(opset, 11))


def _matmul_activation(node, types, opset) -> list:
    return _by_proxy("MatMul", node.inputs[:2], [], types, 13)


def _fused_matmul(node, types, opset) -> list:
    """MatMul's inference on the operands with their last two axes swapped where transA/transB."""
    swapped = dict(types)
    for k, flag in ((0, "transA"), (1, "transB")):
        tp = types.get(node.inputs[k]) if len(node.inputs) > k else None
        dims = _dims(tp)
        if node.attrs.get(flag) and tp is not None:
            if dims is None or len(dims) < 2:
                return [None]
            swapped[node.inputs[k]] = _tensor(_elem(tp), dims[:-2] + [dims[-1], dims[-2]])
    return _by_proxy("MatMul", node.inputs[:2], [], swapped, 13)


def _nhwc(node, types, opset) -> list:
    """A channels-last op: the NCHW op's inference on the transposed input, transposed back."""
    x = types.get(node.inputs[0])
    xd = _dims(x)
    if xd is None or len(xd) != 4:
        return [None]
    nchw = {**types, node.inputs[0]: _tensor(_elem(x), [xd[0], xd[3], xd[1], xd[2]])}
    attrs = [a for a in node.proto_attrs if a.name != "since_version"]
    since = int(node.attrs.get("since_version") or opset)
    out = _by_proxy(node.op_type, node.inputs, attrs, nchw, since)[0]
    od = _dims(out)
    if od is None or len(od) != 4:
        return [None]
    return [_tensor(_elem(out), [od[0], od[2], od[3], od[1]])]


#: (domain, op type) -> rule giving the output types (``None`` where unknown)
RULES: dict[tuple[str, str], Callable] = {
    (MS, "Gelu"): _same_as_input,
    (MS, "FastGelu"): _bias_gelu,
    (MS, "BiasGelu"): _bias_gelu,
    (MS, "SkipLayerNormalization"): _skip_layer_norm,
    (MS, "SkipSimplifiedLayerNormalization"): _skip_layer_norm,
    (MS, "SimplifiedLayerNormalization"): _simplified_layer_norm,
    (MS, "Attention"): _attention,
    (MS, "FusedConv"): _fused_conv,
    (FUSED, "MatMulActivation"): _matmul_activation,
    (MS, "FusedMatMul"): _fused_matmul,
    (FUSED, "ScaledDotProductAttention"): _same_as_input,  # q, k, v and y share one shape
    **{(NHWC, op): _nhwc for op in ("Conv", "MaxPool", "AveragePool", "GlobalAveragePool")},
}


def _known(tp) -> bool:
    return tp is not None and bool(tp.WhichOneof("value")) and (
        tp.WhichOneof("value") != "tensor_type" or tp.tensor_type.elem_type != TensorProto.UNDEFINED)


def _complete(tp) -> bool:
    """Known, and for a tensor, with a shape (a rank)."""
    return _known(tp) and (tp.WhichOneof("value") != "tensor_type" or tp.tensor_type.HasField("shape"))


def fill_types(graph) -> int:
    """Type every untyped node output of ``graph`` (a :class:`~runtime_core.graph.ir.Graph`) that
    a rule here or onnx's per-node inference can type; returns how many were added. Best
    effort: a node whose inference fails keeps its outputs untyped."""
    types: dict = graph.types
    added = 0

    def type_of(name: str):
        return graph.type_of(name) if name else None

    for node in graph.nodes:
        missing = [o for o in node.outputs if o and not _complete(types.get(o))]
        if not missing or any(i and not _known(type_of(i)) for i in node.inputs):
            continue
        known = {i: type_of(i) for i in node.inputs if i}
        opset = graph.opsets.get(node.domain, 1) if node.domain else graph.opsets.get("", 1)
        try:
            rule = RULES.get((node.domain, node.op_type))
            if rule is not None:
                outs = rule(node, known, graph.opsets.get("", 1))
            elif node.domain == "" and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                               for a in node.proto_attrs):
                schema = onnx.defs.get_schema(node.op_type, max_inclusive_version=opset, domain=node.domain)
                proto = helper.make_node(node.op_type, node.inputs, node.outputs, domain=node.domain)
                proto.attribute.extend(node.proto_attrs)
                if _extreme_int("", proto) is not None:  # what onnx's inference crashes on
                    continue
                data = {i: _const(graph, i) for i in node.inputs if i in graph.initializers}
                res = onnx.shape_inference.infer_node_outputs(
                    schema, proto, known, {k: v for k, v in data.items() if v is not None},
                    opset_imports=[helper.make_opsetid(d, v) for d, v in graph.opsets.items()])
                outs = [res.get(o) for o in node.outputs]
            else:
                continue
        except Exception as exc:  # noqa: BLE001 - inference is advisory
            logger.debug("no types for the outputs of %s (%s): %s", node.name, node.op_type, exc)
            continue
        for o, tp in zip(node.outputs, outs):
            if o and tp is not None and _known(tp) and not _complete(types.get(o)) and (
                    _complete(tp) or not _known(types.get(o))):
                types[o] = tp
                added += 1
    return added


def _const(graph, name: str):
    """A small initializer as a TensorProto (data propagation for Reshape targets and the like)."""
    from onnx import numpy_helper

    arr = graph.initializers.get(name)
    if arr is None or arr.size > 64 or arr.dtype.kind not in "biuf":
        return None
    return numpy_helper.from_array(arr, name)
