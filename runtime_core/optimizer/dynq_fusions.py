"""Extended pass on dynamically quantized models: the group ``quantize_dynamic`` writes for each
MatMul (onnxruntime's tool and ``runtime_core.quantization`` alike)::

    x_q, x_scale, x_zp = DynamicQuantizeLinear(x)
    acc = MatMulInteger(x_q, W_q, x_zp[, W_zp])
    y = Mul(Cast(acc, to=FLOAT), Mul(x_scale, W_scale))   [+ Add(y, bias)]

becomes one ``com.microsoft`` op, as onnxruntime's DynamicQuantizeMatMul / MatMulIntegerToFloat
fusions do: ``DynamicQuantizeMatMul(x, W_q, W_scale, W_zp, bias)`` where nothing else reads the
DynamicQuantizeLinear's outputs, else ``MatMulIntegerToFloat(x_q, W_q, x_scale, W_scale, x_zp,
W_zp, bias)`` (the quantization stays, shared). The CPU kernels do the dequantization and bias in
the int8 GEMM's epilogue, with the unfused steps' float32 rounding.

Rewritten only when exactly that: a constant 2-D 8-bit ``W_q``, constant float32 ``W_scale`` and
``W_zp`` per tensor or per column, a per-tensor A side, each intermediate read by the next step
alone, and a constant float32 bias of N elements (a bias with another shape stays an Add).
"""

from __future__ import annotations

import numpy as np

from ..graph.ir import Node
from .editor import EXTENDED, MS_DOMAIN, Editor
from .match import op_of, other_input, only_reader
from .rewrite import RewriteRule

_8BIT = frozenset({np.dtype(np.int8), np.dtype(np.uint8)})
_F32 = np.dtype(np.float32)


def _per_tensor_or_column(v: np.ndarray, n: int) -> bool:
    return v.size == 1 or (v.ndim == 1 and v.shape[0] == n)


class DynamicQuantizeMatMulFusion(RewriteRule):
    """``Mul(Cast(MatMulInteger(DQL(x), W)), Mul(scale, W_scale)) [+ bias]`` ->
    ``DynamicQuantizeMatMul`` (or ``MatMulIntegerToFloat`` where the quantization is shared)."""

    name = "DynamicQuantizeMatMulFusion"
    level = EXTENDED
    targets = frozenset({"MatMulInteger"})

    def rewrite(self, ed: Editor, mmi: Node) -> bool:
        if mmi.domain or len(mmi.inputs) < 3 or not mmi.inputs[2]:
            return False
        dql = op_of(ed, mmi.inputs[0], "DynamicQuantizeLinear")
        if dql is None or len(dql.outputs) < 3 or mmi.inputs[2] != dql.outputs[2]:
            return False
        w = ed.const(mmi.inputs[1])
        if w is None or w.ndim != 2 or w.dtype not in _8BIT:
            return False
        n = w.shape[1]
        wzp_name = mmi.inputs[3] if len(mmi.inputs) > 3 else ""
        wzp = ed.const(wzp_name) if wzp_name else None
        if wzp_name and (wzp is None or not _per_tensor_or_column(wzp, n) or wzp.dtype != w.dtype):
            return False
        cast = only_reader(ed, mmi.outputs[0], "Cast")
        if cast is None or cast.attrs.get("to") != 1:  # FLOAT
            return False
        mul = only_reader(ed, cast.outputs[0], "Mul")
        if mul is None:
            return False
        smul = op_of(ed, other_input(mul, cast.outputs[0]) or "", "Mul")
        if smul is None or not ed.single_use(smul.outputs[0], mul):
            return False
        wscale_name = other_input(smul, dql.outputs[1]) or ""
        wscale = ed.const(wscale_name) if wscale_name else None
        if wscale is None or wscale.dtype != _F32 or not _per_tensor_or_column(wscale, n):
            return False
        group: list[Node] = [mmi, cast, smul, mul]
        out, bias_name = mul.outputs[0], ""
        add = only_reader(ed, out, "Add")
        b = other_input(add, out) if add is not None else None
        if add is not None and b:
            bv = ed.const(b)
            # [N] only: a bias of more dims could change the output's rank
            if bv is not None and bv.dtype == _F32 and bv.shape == (n,):
                bias_name = b
                group.append(add)
                out = add.outputs[0]
        # the quantization goes into the op where this group reads all of it alone
        alone = ed.internal(dql.outputs[0], [mmi]) and ed.internal(dql.outputs[2], [mmi]) \
            and ed.internal(dql.outputs[1], [smul])
        if alone:
            ins = [dql.inputs[0], mmi.inputs[1], wscale_name, wzp_name, bias_name]
            op, remove = "DynamicQuantizeMatMul", [dql] + group
        else:
            ins = [dql.outputs[0], mmi.inputs[1], dql.outputs[1], wscale_name, dql.outputs[2], wzp_name, bias_name]
            op, remove = "MatMulIntegerToFloat", group
        while ins and not ins[-1]:
            ins.pop()
        node = ed.new_node(op, ins, [out], base=mmi.name + "_dynq", domain=MS_DOMAIN)
        if ed.replace(remove, [node]):
            ed.log("%s: %s (%d nodes)", mmi.name, op, len(remove))
            return True
        return False
