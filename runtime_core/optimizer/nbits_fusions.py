"""Extended pass on 4-bit weight-only models: ``MatMulNBits(x) + bias`` -> ``MatMulNBits(x, bias)``.

onnxruntime's MatMulNBitsQuantizer (and ``runtime_core.quantization``) rewrites the MatMul of a
``MatMul -> Add(bias)`` pair and leaves the Add, which the float model's MatMul + Add -> Gemm /
Linear fusions would have taken in: the bias then costs a pass over the output per layer. The
MatMulNBits kernels add an [N] bias in their epilogue (input 5), so the Add goes into the node.

Rewritten only when the Add alone reads the MatMulNBits output, the node has no bias yet and the
other operand is a constant float32 of shape [N] (another shape could broadcast the output to a
different rank).
"""

from __future__ import annotations

import numpy as np

from ..graph.ir import Node
from .editor import EXTENDED, MS_DOMAIN, Editor
from .match import only_reader, other_input
from .rewrite import RewriteRule

_F32 = np.dtype(np.float32)


class MatMulNBitsBiasFusion(RewriteRule):
    """``Add(MatMulNBits(x, ...), bias[N])`` -> ``MatMulNBits(x, ..., bias)``."""

    name = "MatMulNBitsBiasFusion"
    level = EXTENDED
    targets = frozenset({f"{MS_DOMAIN}::MatMulNBits"})

    def rewrite(self, ed: Editor, mm: Node) -> bool:
        if mm.domain != MS_DOMAIN or (len(mm.inputs) > 5 and mm.inputs[5]) or len(mm.inputs) < 3:
            return False
        n = mm.attrs.get("N")
        add = only_reader(ed, mm.outputs[0], "Add")
        b = other_input(add, mm.outputs[0]) if add is not None else None
        bv = ed.const(b) if b else None
        if bv is None or bv.dtype != _F32 or n is None or bv.shape != (n,):
            return False
        ins = list(mm.inputs) + [""] * (5 - len(mm.inputs)) + [b]
        node = ed.new_node("MatMulNBits", ins, [add.outputs[0]], base=mm.name + "_bias", domain=MS_DOMAIN,
                           attrs=dict(mm.attrs))
        if ed.replace([mm, add], [node]):
            ed.log("%s: MatMulNBits + bias Add", mm.name)
            return True
        return False
