"""What an optimized model written to a file must not contain: nodes only runtime-core runs.

The optimizer's ``com.microsoft.FusedConv`` may carry activations onnxruntime's FusedConv does
not know (``HardSwish``, ``SiLU``: ours). A model written for others to load
(``SessionOptions.optimized_model_filepath``, ``runtime-core optimize``) gets those nodes back
as standard ops: ``Conv`` (+ ``Add`` of the residual) + the activation.
"""

from __future__ import annotations

import onnx
from onnx import helper

__all__ = ["OURS_ONLY_ACTIVATIONS", "portable_model"]

#: FusedConv activations only runtime-core's CPU provider runs
OURS_ONLY_ACTIVATIONS = frozenset({"HardSwish", "SiLU"})


def _activation(node: onnx.NodeProto) -> str | None:
    for a in node.attribute:
        if a.name == "activation":
            return a.s.decode() if isinstance(a.s, bytes) else str(a.s)
    return None


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
    if act == "HardSwish":
        nodes.append(helper.make_node("HardSwish", [pre], [out], name=fresh(f"{name}_hardswish")))
    else:  # SiLU: x * Sigmoid(x), as the exporters write it
        sig = fresh(f"{name}_sigmoid_out")
        nodes.append(helper.make_node("Sigmoid", [pre], [sig], name=fresh(f"{name}_sigmoid")))
        nodes.append(helper.make_node("Mul", [pre, sig], [out], name=fresh(f"{name}_silu")))
    return nodes


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
        act = _activation(n) if n.op_type == "FusedConv" and n.domain == "com.microsoft" else None
        if act in OURS_ONLY_ACTIVATIONS:
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

    _graph(model.graph, fresh)
    return model
