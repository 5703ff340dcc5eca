"""Extended passes on QDQ models: ``DequantizeLinear -> MatMul / Conv -> QuantizeLinear`` groups
become ``QLinearMatMul`` / ``QLinearConv`` (a Gemm ``com.microsoft.QGemm``), and
``DequantizeLinear x 2 -> Add -> QuantizeLinear``
becomes ``com.microsoft.QLinearAdd`` (``GlobalAveragePool`` ``com.microsoft.QLinearGlobalAveragePool``),
as onnxruntime's QDQ transformers do, so that a statically quantized model runs its products,
residual sums and pooling on the int8 kernels instead of in float.

A group is rewritten only when it is exactly that: the float product's output read by the
QuantizeLinear alone, 8-bit quantized input and weight, a constant weight, constant scales and
zero points, per tensor except the weight's (per output channel allowed: axis 0 of a Conv
weight, the last axis of a 2-D MatMul weight), no blocked quantization. A Conv bias may be a
float constant or a DequantizeLinear of a constant; it becomes QLinearConv's int32 bias in the
scale of input x weight. The DequantizeLinear nodes stay where something else reads them.
"""

from __future__ import annotations

import numpy as np

from ..graph.ir import Node
from .editor import EXTENDED, MS_DOMAIN, Editor
from .match import op_of
from .rewrite import RewriteRule

_8BIT = frozenset({np.dtype(np.int8), np.dtype(np.uint8)})
_F32 = np.dtype(np.float32)


def _dq(ed: Editor, name: str, *, rank: int | None = None, per_axis: int | None = None):
    """(node, x, scale, zero point or None) of the per-tensor (or, with ``per_axis``, per that
    axis of a constant ``x`` of ``rank``) 8-bit DequantizeLinear producing ``name``; else None."""
    dq = op_of(ed, name, "DequantizeLinear")
    if dq is None or dq.attrs.get("block_size", 0) or len(dq.inputs) < 2:
        return None
    x = dq.inputs[0]
    scale = ed.const(dq.inputs[1])
    zp_name = dq.inputs[2] if len(dq.inputs) > 2 and dq.inputs[2] else ""
    zp = ed.const(zp_name) if zp_name else None
    if scale is None or scale.dtype != _F32 or (zp_name and zp is None) or ed.dtype(x) not in _8BIT:
        return None
    if zp is not None and zp.dtype != ed.dtype(x):
        return None
    if scale.size == 1 and (zp is None or zp.size == 1):
        return dq, x, scale.reshape(()), None if zp is None else zp.reshape(())
    if per_axis is None or scale.ndim != 1 or (zp is not None and zp.shape != scale.shape):
        return None
    axis = int(dq.attrs.get("axis", 1))
    if rank is None or (axis + rank if axis < 0 else axis) != per_axis:
        return None
    return dq, x, scale, zp


def _q(ed: Editor, q: Node):
    """(y scale, y zero point, output dtype) of a per-tensor 8-bit QuantizeLinear; else None."""
    if q.attrs.get("block_size", 0) or len(q.inputs) < 2:
        return None
    scale = ed.const(q.inputs[1])
    zp_name = q.inputs[2] if len(q.inputs) > 2 and q.inputs[2] else ""
    zp = ed.const(zp_name) if zp_name else None
    if scale is None or scale.dtype != _F32 or scale.size != 1 or (zp_name and (zp is None or zp.size != 1)):
        return None
    out_dt = zp.dtype if zp is not None else ed.dtype(q.outputs[0])
    od = q.attrs.get("output_dtype", 0)
    if out_dt is None and not od:
        out_dt = np.dtype(np.uint8)  # QuantizeLinear's default
    if out_dt not in _8BIT:
        return None
    if zp is None:
        zp = np.zeros((), out_dt)
    return scale.reshape(()), zp.reshape(()), out_dt


def feeds_qdq_group(ed: Editor, dq: Node) -> bool:
    """Whether ``dq``, a DequantizeLinear, gives the weight or bias of a Conv / MatMul / Gemm whose output
    only a QuantizeLinear reads: a group these passes fuse, so constant folding leaves it (as
    onnxruntime's folding leaves DequantizeLinear to its QDQ transformers)."""
    if dq.op_type != "DequantizeLinear" or dq.domain or not dq.outputs or not dq.outputs[0]:
        return False
    readers = ed.consumers(dq.outputs[0])
    if not readers or ed.is_output(dq.outputs[0]):
        return False
    for r in readers:
        if r.domain or r.op_type not in ("Conv", "MatMul", "Gemm") or r.inputs[0] == dq.outputs[0]:
            return False
        if not ed.single_use(r.outputs[0]) or op_of(ed, r.inputs[0], "DequantizeLinear") is None:
            return False
        if ed.consumers(r.outputs[0])[0].op_type != "QuantizeLinear":
            return False
    return True


class _QDQFusion(RewriteRule):
    level = EXTENDED
    targets = frozenset({"QuantizeLinear"})
    OP = ""

    def rewrite(self, ed: Editor, q: Node) -> bool:
        prod = op_of(ed, q.inputs[0], self.OP)
        if prod is None or not ed.single_use(q.inputs[0], q):
            return False
        qy = _q(ed, q)
        if qy is None:
            return False
        return self._fuse(ed, prod, q, *qy)

    def _fuse(self, ed: Editor, prod: Node, q: Node, sy, zy, out_dt) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    @staticmethod
    def _const_in(ed: Editor, base: str, v: np.ndarray) -> str:
        return ed.add_const(np.asarray(v), base)

    def _emit(self, ed: Editor, prod: Node, q: Node, dqs: list[Node], node: Node) -> bool:
        # a DequantizeLinear goes with the group only where the group's product was its only reader
        remove = [prod, q] + [d for d in dqs if ed.single_use(d.outputs[0], prod)]
        if ed.replace(remove, [node]):
            ed.log("%s + %s: %s", prod.name, q.name, node.name)
            return True
        return False


class QDQMatMulFusion(_QDQFusion):
    """``Q(MatMul(DQ(a), DQ(w)))`` with a constant 2-D 8-bit ``w`` -> ``QLinearMatMul``."""

    name = "QDQMatMulFusion"
    OP = "MatMul"

    def _fuse(self, ed: Editor, mm: Node, q: Node, sy, zy, out_dt) -> bool:
        a = _dq(ed, mm.inputs[0])
        dqw = op_of(ed, mm.inputs[1], "DequantizeLinear")
        wv = ed.const(dqw.inputs[0]) if dqw is not None else None
        if a is None or wv is None or wv.ndim != 2:
            return False
        w = _dq(ed, mm.inputs[1], rank=2, per_axis=1)
        if w is None:
            return False
        (dqa, xa, sa, za), (dqw, xw, sw, zw) = a, w
        za = np.zeros((), ed.dtype(xa)) if za is None else za
        zw = np.zeros(sw.shape, ed.dtype(xw)) if zw is None else zw
        ins = [xa, self._const_in(ed, mm.name + "_a_scale", sa), self._const_in(ed, mm.name + "_a_zp", za),
               xw, self._const_in(ed, mm.name + "_w_scale", sw), self._const_in(ed, mm.name + "_w_zp", zw),
               self._const_in(ed, q.name + "_y_scale", sy), self._const_in(ed, q.name + "_y_zp", zy)]
        node = ed.new_node("QLinearMatMul", ins, [q.outputs[0]], base=mm.name + "_qlinear")
        return self._emit(ed, mm, q, [dqa, dqw], node)


class QDQConvFusion(_QDQFusion):
    """``Q(Conv(DQ(x), DQ(w)[, b]))`` with a constant 8-bit ``w`` (per tensor or per output
    channel) and a constant or dequantized-constant bias -> ``QLinearConv`` (int32 bias)."""

    name = "QDQConvFusion"
    OP = "Conv"

    def _fuse(self, ed: Editor, conv: Node, q: Node, sy, zy, out_dt) -> bool:
        a = _dq(ed, conv.inputs[0])
        dqw = op_of(ed, conv.inputs[1], "DequantizeLinear")
        wv = ed.const(dqw.inputs[0]) if dqw is not None else None
        if a is None or wv is None or wv.ndim < 3:
            return False
        w = _dq(ed, conv.inputs[1], rank=wv.ndim, per_axis=0)
        if w is None or (w[2].ndim == 1 and w[2].shape[0] != wv.shape[0]):
            return False
        (dqa, xa, sa, za), (dqw, xw, sw, zw) = a, w
        dqs = [dqa, dqw]
        ins = [xa, self._const_in(ed, conv.name + "_x_scale", sa),
               self._const_in(ed, conv.name + "_x_zp", np.zeros((), ed.dtype(xa)) if za is None else za),
               xw, self._const_in(ed, conv.name + "_w_scale", sw),
               self._const_in(ed, conv.name + "_w_zp", np.zeros(sw.shape, ed.dtype(xw)) if zw is None else zw),
               self._const_in(ed, q.name + "_y_scale", sy), self._const_in(ed, q.name + "_y_zp", zy)]
        if len(conv.inputs) > 2 and conv.inputs[2]:
            bq = self._int32_bias(ed, conv.inputs[2], wv.shape[0], sa, sw, dqs, conv.name + "_bias_int32")
            if bq is None:
                return False
            ins.append(bq)
        node = ed.g.make_node("QLinearConv", ins, [q.outputs[0]], name=ed.fresh(conv.name + "_qlinear"),
                              proto_attrs=conv.proto_attrs)
        return self._emit(ed, conv, q, dqs, node)

    @classmethod
    def _int32_bias(cls, ed: Editor, name: str, m: int, sa, sw, dqs: list, base: str) -> str | None:
        """The constant int32 input of a float or dequantized bias ``name`` [m] in the
        accumulator's scale (input scale x weight scale, per channel); its DequantizeLinear joins
        ``dqs``. None where it is neither, or does not fit int32."""
        got = cls._bias(ed, name, m)
        if got is None:
            return None
        bias, dqb = got
        bscale = (sa.astype(np.float64) * sw.astype(np.float64)).reshape(-1)
        with np.errstate(all="ignore"):
            bq = np.rint(bias.astype(np.float64) / bscale)
        if not np.all(np.isfinite(bq)) or np.any(np.abs(bq) >= 2 ** 31):
            return None
        if dqb is not None:
            dqs.append(dqb)
        return cls._const_in(ed, base, bq.astype(np.int32))

    @staticmethod
    def _bias(ed: Editor, name: str, m: int):
        """(float bias [m], its DequantizeLinear or None) of a constant or dequantized bias."""
        v = ed.const(name)
        if v is not None:
            return (v.reshape(-1), None) if v.dtype.kind == "f" and v.size == m else None
        dq = op_of(ed, name, "DequantizeLinear")
        if dq is None or dq.attrs.get("block_size", 0) or len(dq.inputs) < 2:
            return None
        b, s = ed.const(dq.inputs[0]), ed.const(dq.inputs[1])
        z = ed.const(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2] else None
        if (b is None or s is None or b.size != m or b.dtype.kind not in "iu" or s.size not in (1, m)
                or (len(dq.inputs) > 2 and dq.inputs[2] and z is None)):
            return None
        zz = 0 if z is None else z.astype(np.float64).reshape(-1)
        return ((b.astype(np.float64).reshape(-1) - zz) * s.astype(np.float32).astype(np.float64).reshape(-1)), dq


class QDQAddFusion(_QDQFusion):
    """``Q(Add(DQ(a), DQ(b)))`` with per-tensor 8-bit ``a``, ``b`` and output of one type ->
    ``com.microsoft.QLinearAdd`` (onnxruntime's binary-op QDQ transformer): a residual sum stays
    in int8 instead of two dequantizations, a float sum and a quantization."""

    name = "QDQAddFusion"
    OP = "Add"

    def _fuse(self, ed: Editor, add: Node, q: Node, sy, zy, out_dt) -> bool:
        if len(add.inputs) != 2 or add.inputs[0] == add.inputs[1]:
            return False
        a, b = _dq(ed, add.inputs[0]), _dq(ed, add.inputs[1])
        if a is None or b is None or ed.dtype(a[1]) != out_dt or ed.dtype(b[1]) != out_dt:
            return False
        ins = []
        for (_, x, s, z), base in ((a, add.name + "_a"), (b, add.name + "_b")):
            ins += [x, self._const_in(ed, base + "_scale", s),
                    self._const_in(ed, base + "_zp", np.zeros((), out_dt) if z is None else z)]
        ins += [self._const_in(ed, q.name + "_y_scale", sy), self._const_in(ed, q.name + "_y_zp", zy)]
        node = ed.new_node("QLinearAdd", ins, [q.outputs[0]], base=add.name + "_qlinear", domain=MS_DOMAIN)
        return self._emit(ed, add, q, [a[0], b[0]], node)


class QDQGemmFusion(_QDQFusion):
    """``Q(Gemm(DQ(a), DQ(w)[, c]))`` with a constant 2-D 8-bit ``w`` (per tensor or per output
    column), alpha = beta = 1 and a 1-D constant or dequantized-constant bias ->
    ``com.microsoft.QGemm`` (int32 bias in the scale of a x w): a classifier head in int8."""

    name = "QDQGemmFusion"
    OP = "Gemm"

    def _fuse(self, ed: Editor, gemm: Node, q: Node, sy, zy, out_dt) -> bool:
        if gemm.attrs.get("alpha", 1.0) != 1.0 or gemm.attrs.get("beta", 1.0) != 1.0:
            return False
        trans_b = int(gemm.attrs.get("transB", 0))
        a = _dq(ed, gemm.inputs[0])
        dqw = op_of(ed, gemm.inputs[1], "DequantizeLinear")
        wv = ed.const(dqw.inputs[0]) if dqw is not None else None
        if a is None or wv is None or wv.ndim != 2:
            return False
        w = _dq(ed, gemm.inputs[1], rank=2, per_axis=0 if trans_b else 1)
        n = wv.shape[0 if trans_b else 1]
        if w is None or (w[2].ndim == 1 and w[2].shape[0] != n):
            return False
        (dqa, xa, sa, za), (dqw, xw, sw, zw) = a, w
        dqs = [dqa, dqw]
        ins = [xa, self._const_in(ed, gemm.name + "_a_scale", sa),
               self._const_in(ed, gemm.name + "_a_zp", np.zeros((), ed.dtype(xa)) if za is None else za),
               xw, self._const_in(ed, gemm.name + "_b_scale", sw),
               self._const_in(ed, gemm.name + "_b_zp", np.zeros(sw.shape, ed.dtype(xw)) if zw is None else zw)]
        if len(gemm.inputs) > 2 and gemm.inputs[2]:
            shape = ed.shape(gemm.inputs[2])
            if shape is None or len(shape) != 1:
                return False
            bq = QDQConvFusion._int32_bias(ed, gemm.inputs[2], n, sa, sw, dqs, gemm.name + "_c_int32")
            if bq is None:
                return False
            ins.append(bq)
        else:
            ins.append("")
        ins += [self._const_in(ed, q.name + "_y_scale", sy), self._const_in(ed, q.name + "_y_zp", zy)]
        attrs = {"transA": int(gemm.attrs.get("transA", 0)), "transB": trans_b, "alpha": 1.0}
        node = ed.new_node("QGemm", ins, [q.outputs[0]], base=gemm.name + "_qgemm", domain=MS_DOMAIN, attrs=attrs)
        return self._emit(ed, gemm, q, dqs, node)


class QDQGlobalAveragePoolFusion(_QDQFusion):
    """``Q(GlobalAveragePool(DQ(x)))`` with per-tensor 8-bit ``x`` and output of one type ->
    ``com.microsoft.QLinearGlobalAveragePool`` (onnxruntime's unary-op QDQ transformer): the
    pooled feature map is not dequantized."""

    name = "QDQGlobalAveragePoolFusion"
    OP = "GlobalAveragePool"

    def _fuse(self, ed: Editor, pool: Node, q: Node, sy, zy, out_dt) -> bool:
        a = _dq(ed, pool.inputs[0])
        if a is None or ed.dtype(a[1]) != out_dt or (ed.rank(a[1]) or 0) < 3:
            return False
        dq, x, sx, zx = a
        ins = [x, self._const_in(ed, pool.name + "_x_scale", sx),
               self._const_in(ed, pool.name + "_x_zp", np.zeros((), out_dt) if zx is None else zx),
               self._const_in(ed, q.name + "_y_scale", sy), self._const_in(ed, q.name + "_y_zp", zy)]
        node = ed.new_node("QLinearGlobalAveragePool", ins, [q.outputs[0]], base=pool.name + "_qlinear",
                           domain=MS_DOMAIN, attrs={"channels_last": 0})
        return self._emit(ed, pool, q, [dq], node)


class QDQMaxPoolFusion(_QDQFusion):
    """``Q(MaxPool(DQ(x)))`` where the QuantizeLinear takes back the DequantizeLinear's exact
    per-tensor scale, zero point and 8-bit type -> ``MaxPool(x)`` on the codes (onnxruntime's
    drop-QDQ rule; MaxPool takes int8/uint8 from opset 12): dequantizing is monotonic, so the
    maximum of the codes is the code of the maximum, and the float round trip is skipped."""

    name = "QDQMaxPoolFusion"
    OP = "MaxPool"

    def _fuse(self, ed: Editor, pool: Node, q: Node, sy, zy, out_dt) -> bool:
        if ed.opset() < 12 or len([o for o in pool.outputs if o]) != 1:
            return False
        a = _dq(ed, pool.inputs[0])
        if a is None or ed.dtype(a[1]) != out_dt:
            return False
        dq, x, sx, zx = a
        zx = np.zeros((), out_dt) if zx is None else zx
        if sx.tobytes() != sy.tobytes() or zx.dtype != zy.dtype or zx.tobytes() != zy.tobytes():
            return False
        node = ed.g.make_node("MaxPool", [x], [q.outputs[0]], name=ed.fresh(pool.name + "_int8"),
                              proto_attrs=pool.proto_attrs)
        return self._emit(ed, pool, q, [dq], node)
