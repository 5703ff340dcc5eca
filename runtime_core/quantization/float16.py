"""Float16 conversion of a float32 model (onnxruntime.transformers.float16's
convert_float_to_float16, same arguments).

Float initializers, Constant values, graph value types and ``Cast(to=FLOAT)`` targets
become float16. Nodes of ``op_block_list`` (ops without float16 kernels; control-flow ops
are always kept) or named in ``node_block_list`` stay float32 behind Casts. Inputs that an
op's schema requires in float32 (Resize's scales, ...) stay float32. With
``keep_io_types`` the graph inputs and outputs keep float32 and Casts are added at the edges.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import InvalidArgumentError
from ..graph.validate import infer_shapes  # the one door to onnx's shape inference

__all__ = ["convert_float_to_float16", "DEFAULT_OP_BLOCK_LIST"]

DEFAULT_OP_BLOCK_LIST = ["ArrayFeatureExtractor", "Binarizer", "CastMap", "CategoryMapper", "DictVectorizer",
                         "FeatureVectorizer", "Imputer", "LabelEncoder", "LinearClassifier", "LinearRegressor",
                         "Normalizer", "OneHotEncoder", "RandomUniformLike", "SVMClassifier", "SVMRegressor",
                         "Scaler", "TreeEnsembleClassifier", "TreeEnsembleRegressor", "ZipMap", "NonMaxSuppression",
                         "TopK", "RoiAlign", "Range", "CumSum", "Min", "Max", "Upsample"]
_CONTROL_FLOW = {"If", "Loop", "Scan", "SequenceMap"}
#: inputs (by position) that the op's schema types as float32 only
_FLOAT32_INPUTS = {"Resize": {2}, "Dropout": {1}, "Upsample": {1}}


def _to_fp16(a: np.ndarray, min_positive: float, max_finite: float) -> np.ndarray:
    a = a.astype(np.float32)
    tiny = (np.abs(a) < min_positive) & (a != 0)
    a = np.where(tiny, np.sign(a) * min_positive, a)
    return np.clip(a, -max_finite, max_finite).astype(np.float16)


def convert_float_to_float16(model, min_positive_val: float = 1e-7, max_finite_val: float = 1e4,
                             keep_io_types: bool = False, disable_shape_infer: bool = False,
                             op_block_list=None, node_block_list=None, force_fp16_initializers: bool = False,
                             force_fp16_inputs=None, use_bfloat16_as_blocked_nodes_dtype: bool = False
                             ) -> onnx.ModelProto:
    """A float16 copy of ``model`` (a ModelProto or a path); the argument is not changed."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model))
    if use_bfloat16_as_blocked_nodes_dtype:
        raise InvalidArgumentError("use_bfloat16_as_blocked_nodes_dtype is not supported")
    m = onnx.ModelProto()
    m.CopyFrom(model)
    if not disable_shape_infer:
        try:
            m = infer_shapes(m)
        except Exception:  # types of declared values still guide the conversion
            pass
    g = m.graph
    blocked_ops = set(DEFAULT_OP_BLOCK_LIST if op_block_list is None else op_block_list) | _CONTROL_FLOW
    blocked_nodes = set(node_block_list or [])
    types = {vi.name: vi.type.tensor_type.elem_type for vi in list(g.value_info) + list(g.input) + list(g.output)
             if vi.type.HasField("tensor_type")}
    for t in g.initializer:
        types[t.name] = t.data_type
    is_f32 = {n for n, t in types.items() if t == TensorProto.FLOAT}

    fp32_copies: dict[str, str] = {}
    new_inits = []
    for t in g.initializer:
        if t.data_type == TensorProto.FLOAT:
            a = numpy_helper.to_array(t)
            new_inits.append(numpy_helper.from_array(_to_fp16(a, min_positive_val, max_finite_val), t.name))
            fp32_copies[t.name] = t.name + "_fp32"
            new_inits.append(numpy_helper.from_array(a.astype(np.float32), t.name + "_fp32"))
        else:
            new_inits.append(t)
    del g.initializer[:]
    g.initializer.extend(new_inits)

    nodes = []
    counter = [0]

    def cast(src: str, to: int) -> str:
        counter[0] += 1
        dst = f"{src}_cast{'16' if to == TensorProto.FLOAT16 else '32'}_{counter[0]}"
        nodes.append(helper.make_node("Cast", [src], [dst], f"{dst}_node", to=to))
        return dst

    renamed_out: dict[str, str] = {}
    io_in = {i.name for i in g.input} - {t.name for t in g.initializer}
    if keep_io_types:
        for name in io_in:
            if name in is_f32:
                renamed_out[name] = cast(name, TensorProto.FLOAT16)
    fp16_values = set(renamed_out.values())
    for node in g.node:
        for i, x in enumerate(node.input):
            if x in renamed_out:
                node.input[i] = renamed_out[x]
        blocked = node.op_type in blocked_ops or node.name in blocked_nodes
        keep32 = _FLOAT32_INPUTS.get(node.op_type, set())
        if blocked or keep32:
            for i, x in enumerate(node.input):
                if not x or not (blocked or i in keep32):
                    continue
                if x in fp32_copies:
                    node.input[i] = fp32_copies[x]
                elif x in is_f32 or x in fp16_values:
                    node.input[i] = cast(x, TensorProto.FLOAT)
        if blocked:
            nodes.append(node)
            for j, y in enumerate(node.output):
                if y in is_f32:
                    node.output[j] = y + "_fp32out"
                    nodes.append(helper.make_node("Cast", [y + "_fp32out"], [y], y + "_to16", to=TensorProto.FLOAT16))
            continue
        for a in node.attribute:
            if node.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.FLOAT16
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(
                    _to_fp16(numpy_helper.to_array(a.t), min_positive_val, max_finite_val), a.t.name))
        nodes.append(node)
    outs = {o.name for o in g.output}
    if keep_io_types:
        for o in g.output:
            if o.name in is_f32:
                for n in nodes:
                    for j, y in enumerate(n.output):
                        if y == o.name:
                            n.output[j] = o.name + "_fp16"
                    for j, x in enumerate(n.input):
                        if x == o.name:
                            n.input[j] = o.name + "_fp16"
                nodes.append(helper.make_node("Cast", [o.name + "_fp16"], [o.name], o.name + "_to32",
                                              to=TensorProto.FLOAT))
    del g.node[:]
    g.node.extend(nodes)
    for vi in list(g.input) + list(g.output):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT and not (keep_io_types and (vi.name in io_in
                                                                                           or vi.name in outs)):
            vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    del g.value_info[:]
    used = {x for n in g.node for x in n.input}
    keep = [t for t in g.initializer if t.name in used or t.name in outs]
    del g.initializer[:]
    g.initializer.extend(keep)
    from ._quantizer import topological_sort

    topological_sort(g)
    return m
