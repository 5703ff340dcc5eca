"""What an optimized model written to a file must not contain: nodes only runtime-core runs.

The optimizer's ``com.microsoft.FusedConv`` may carry activations onnxruntime's FusedConv does
not know (``HardSwish``, ``SiLU``: ours), and ``runtime_core.fused``'s ops (``SqueezeExcite``,
``MatMulActivation``, ``ScaledDotProductAttention``) are ours alone. A model written for others to load
(``SessionOptions.optimized_model_filepath``, ``runtime-core optimize``) gets those nodes back
as standard ops: ``Conv`` (+ ``Add`` of the residual) + the activation; ``GlobalAveragePool``,
two ``FusedConv`` (or ``Conv`` + the activation) and ``Mul``; ``MatMul`` (+ ``Add`` of the
bias) + ``Relu``; ``FusedMatMul`` (+ ``Add``) + ``Softmax`` + ``MatMul``.
"""

from __future__ import annotations

import onnx
from onnx import helper

__all__ = ["OURS_ONLY_ACTIVATIONS", "portable_model"]

#: FusedConv activations only runtime-core's CPU provider runs
OURS_ONLY_ACTIVATIONS = frozenset({"HardSwish", "SiLU"})
#: the domain of the fused ops only runtime-core runs
RC_FUSED = "runtime_core.fused"
MS = "com.microsoft"


def _activation(node: onnx.NodeProto, name: str = "activation") -> str | None:
    for a in node.attribute:
        if a.name == name:
            return a.s.decode() if isinstance(a.s, bytes) else str(a.s)
    return None


def _floats(node: onnx.NodeProto, name: str) -> list[float]:
    for a in node.attribute:
        if a.name == name:
            return list(a.floats)
    return []


def _act_nodes(act: str, src: str, out: str, name: str, fresh) -> list[onnx.NodeProto]:
    """``out = act(src)`` as standard nodes (the activations only runtime-core fuses)."""
    if act == "HardSwish":
        return [helper.make_node("HardSwish", [src], [out], name=fresh(f"{name}_hardswish"))]
    sig = fresh(f"{name}_sigmoid_out")  # SiLU: x * Sigmoid(x), as the exporters write it
    return [helper.make_node("Sigmoid", [src], [sig], name=fresh(f"{name}_sigmoid")),
            helper.make_node("Mul", [src, sig], [out], name=fresh(f"{name}_silu"))]


def _pointwise(x: str, w: str, b: str, act: str | None, params: list[float], out: str, name: str,
               fresh) -> list[onnx.NodeProto]:
    """``out = act(Conv(x, w, b))``: a FusedConv where onnxruntime's takes ``act``."""
    ins = [x, w] + ([b] if b else [])
    if act is None:
        return [helper.make_node("Conv", ins, [out], name=fresh(f"{name}_conv"))]
    if act not in OURS_ONLY_ACTIVATIONS:
        extra = {"activation_params": params} if params else {}
        return [helper.make_node("FusedConv", ins, [out], name=fresh(f"{name}_conv"), domain=MS,
                                 activation=act, **extra)]
    pre = fresh(f"{name}_conv_out")
    return [helper.make_node("Conv", ins, [pre], name=fresh(f"{name}_conv"))] + _act_nodes(act, pre, out, name, fresh)


def _split_se(node: onnx.NodeProto, fresh) -> list[onnx.NodeProto]:
    """A SqueezeExcite as GlobalAveragePool, two 1x1 convolutions with their activations and Mul."""
    x, w1, b1, w2, b2 = (list(node.input) + [""] * 5)[:5]
    name = node.name or node.output[0]
    pooled, hidden, gate = fresh(f"{name}_pool_out"), fresh(f"{name}_fc1_out"), fresh(f"{name}_gate_out")
    return ([helper.make_node("GlobalAveragePool", [x], [pooled], name=fresh(f"{name}_pool"))]
            + _pointwise(pooled, w1, b1, _activation(node), _floats(node, "activation_params"), hidden,
                         f"{name}_fc1", fresh)
            + _pointwise(hidden, w2, b2, _activation(node, "gate"), _floats(node, "gate_params"), gate,
                         f"{name}_fc2", fresh)
            + [helper.make_node("Mul", [x, gate], [node.output[0]], name=fresh(f"{name}_scale"))])


def _split_matmul_act(node: onnx.NodeProto, fresh) -> list[onnx.NodeProto]:
    """A MatMulActivation (x, W[, b]) as ``MatMul`` (+ ``Add`` of b) and its activation."""
    x, w, b = (list(node.input) + ["", ""])[:3]
    act = _activation(node) or "Relu"
    name = node.name or node.output[0]
    pre = fresh(f"{name}_matmul_out")
    nodes = [helper.make_node("MatMul", [x, w], [pre], name=fresh(f"{name}_matmul"))]
    if b:
        summed = fresh(f"{name}_bias_out")
        nodes.append(helper.make_node("Add", [pre, b], [summed], name=fresh(f"{name}_bias")))
        pre = summed
    return nodes + [helper.make_node(act, [pre], [node.output[0]], name=fresh(f"{name}_{act.lower()}"))]


def _split_sdpa(node: onnx.NodeProto, fresh) -> list[onnx.NodeProto]:
    """A ScaledDotProductAttention (q, k, v[, bias]) as onnxruntime's ``FusedMatMul`` (q k^T with
    the scale as alpha) (+ ``Add`` of the bias), ``Softmax`` and ``MatMul`` by v."""
    q, k, v, bias = (list(node.input) + [""])[:4]
    scale = next((a.f for a in node.attribute if a.name == "scale"), 1.0)
    name = node.name or node.output[0]
    z = fresh(f"{name}_scores")
    nodes = [helper.make_node("FusedMatMul", [q, k], [z], name=fresh(f"{name}_qk"), domain=MS, alpha=scale,
                              transB=1)]
    if bias:
        zb = fresh(f"{name}_biased")
        nodes.append(helper.make_node("Add", [z, bias], [zb], name=fresh(f"{name}_bias")))
        z = zb
    p = fresh(f"{name}_probs")
    return nodes + [helper.make_node("Softmax", [z], [p], name=fresh(f"{name}_softmax"), axis=-1),
                    helper.make_node("MatMul", [p, v], [node.output[0]], name=fresh(f"{name}_pv"))]


def _split(node: onnx.NodeProto, act: str, fresh) -> list[onnx.NodeProto]:
    """``act(Conv(x, w, b) + z)`` as standard nodes writing ``node``'s output."""
    ins = list(node.input)
    x, w, b, z = (ins + ["", "", "", ""])[:4]
    conv_attrs = [a for a in node.attribute if a.name not in ("activation", "activation_params")]
    out = node.output[0]
    name = node.name or out
    pre = fresh(f"{name}_conv_out")
    conv = helper.make_node("Conv", [x, w] + ([b] if b else []), [pre], name=fresh(f"{name}_conv"))
    conv.attribute.extend(conv_attrs)
    nodes = [conv]
    if z:
        summed = fresh(f"{name}_residual_out")
        nodes.append(helper.make_node("Add", [pre, z], [summed], name=fresh(f"{name}_residual")))
        pre = summed
    return nodes + _act_nodes(act, pre, out, name, fresh)


def _graph(g: onnx.GraphProto, fresh) -> bool:
    changed = False
    nodes: list[onnx.NodeProto] = []
    for n in g.node:
        for a in n.attribute:  # If/Loop/Scan bodies
            if a.type == onnx.AttributeProto.GRAPH:
                changed |= _graph(a.g, fresh)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sub in a.graphs:
                    changed |= _graph(sub, fresh)
        act = _activation(n) if n.op_type == "FusedConv" and n.domain == MS else None
        if n.op_type == "SqueezeExcite" and n.domain == RC_FUSED:
            nodes.extend(_split_se(n, fresh))
            changed = True
        elif n.op_type == "MatMulActivation" and n.domain == RC_FUSED:
            nodes.extend(_split_matmul_act(n, fresh))
            changed = True
        elif n.op_type == "ScaledDotProductAttention" and n.domain == RC_FUSED:
            nodes.extend(_split_sdpa(n, fresh))
            changed = True
        elif act in OURS_ONLY_ACTIVATIONS:
            nodes.extend(_split(n, act, fresh))
            changed = True
        else:
            nodes.append(n)
    if changed:
        del g.node[:]
        g.node.extend(nodes)
    return changed


def portable_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every FusedConv whose activation only runtime-core runs written as standard
    ops (in place; returned). No opset changes: a HardSwish FusedConv was fused from a HardSwish
    node (opset 14 on), SiLU from Sigmoid and Mul."""
    used: set[str] = set()

    def collect(g: onnx.GraphProto) -> None:
        used.update(v.name for v in g.input)
        used.update(t.name for t in g.initializer)
        for n in g.node:
            used.update(n.input)
            used.update(n.output)
            used.add(n.name)
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    collect(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for sub in a.graphs:
                        collect(sub)

    collect(model.graph)

    def fresh(base: str) -> str:
        name, i = base, 1
        while name in used:
            name, i = f"{base}_{i}", i + 1
        used.add(name)
        return name

    if _graph(model.graph, fresh):
        domains = {op.domain for op in model.opset_import}
        if MS not in domains and _uses(model.graph, MS):
            model.opset_import.append(helper.make_opsetid(MS, 1))
        if not _uses(model.graph, RC_FUSED):  # others would look for the domain's schemas
            keep = [op for op in model.opset_import if op.domain != RC_FUSED]
            del model.opset_import[:]
            model.opset_import.extend(keep)
    return model


def _uses(g: onnx.GraphProto, domain: str) -> bool:
    for n in g.node:
        if n.domain == domain:
            return True
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH and _uses(a.g, domain):
                return True
            if a.type == onnx.AttributeProto.GRAPHS and any(_uses(sub, domain) for sub in a.graphs):
                return True
    return False
