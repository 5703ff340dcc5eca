"""Extended passes: subgraphs fused into single ops.

A fused op is an ordinary op with a schema: the standard ONNX op where the
model's opset has one (``Gemm``, ``LayerNormalization`` from opset 17, ``Gelu``
from opset 20), else the ``com.microsoft`` op onnxruntime defines (``Gelu``,
``FastGelu``, ``BiasGelu``, ``SkipLayerNormalization``, ``Attention``), whose
CPU reference kernels live in ``runtime_provider_cpu/ops/fused.py``. The
optimized model saved through ``optimized_model_filepath`` therefore also loads
in onnxruntime.

Every fusion checks all of its preconditions and leaves the graph untouched
otherwise: intermediates read only inside the pattern (and no graph outputs),
constant weights, the normalized / split axis being the last one, constant
epsilons and coefficients equal to the formula's, and shapes (static where a
weight must match, symbolically equal where two dynamic dims must agree).
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from ..graph.ir import Graph, Node
from .base import EXTENDED, MS_DOMAIN, Editor, Pass, same_dim

_FLOATS = {np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)}
_F32 = np.dtype(np.float32)


# -- matching helpers ----------------------------------------------------------------

def _op(ed: Editor, name: str, op: str) -> Node | None:
    """The node producing ``name`` when it is an ai.onnx ``op``."""
    n = ed.producer(name) if name else None
    return n if n is not None and n.op_type == op and n.domain == "" else None


def _other(node: Node, x: str) -> str | None:
    """The other input of a binary node one of whose inputs is ``x``."""
    if len(node.inputs) != 2:
        return None
    if node.inputs[0] == x:
        return node.inputs[1]
    if node.inputs[1] == x:
        return node.inputs[0]
    return None


def _reader(ed: Editor, name: str, op: str | tuple) -> Node | None:
    """The only reader of ``name`` when it is an ai.onnx ``op`` (and ``name`` is internal)."""
    if not ed.single_use(name):
        return None
    n = ed.consumers(name)[0]
    ops = (op,) if isinstance(op, str) else op
    return n if n.op_type in ops and n.domain == "" else None


def _near(v: float | None, target: float, rel: float = 1e-4) -> bool:
    return v is not None and abs(v - target) <= rel * abs(target)


def _scalar_operand(ed: Editor, node: Node, x: str) -> float | None:
    o = _other(node, x)
    return None if o is None else ed.scalar(o)


def _last_axis(axes, rank) -> bool:
    axes = list(axes) if axes is not None else None
    if axes is None or len(axes) != 1:
        return False
    return axes[0] == -1 or (rank is not None and axes[0] == rank - 1)


def _reduce_axes(ed: Editor, n: Node):
    axes = n.attrs.get("axes")
    if axes is None and len(n.inputs) > 1 and n.inputs[1]:
        c = ed.const(n.inputs[1])
        axes = None if c is None else [int(a) for a in c.reshape(-1)]
    return axes


def _vector(ed: Editor, name: str, size) -> np.ndarray | None:
    """A constant that is a vector of ``size`` elements (leading 1s allowed), flattened."""
    v = ed.const(name)
    if v is None or not isinstance(size, int) or v.size != size or any(d != 1 for d in v.shape[:-1]):
        return None
    return v.reshape(-1)


# -- Conv folds ---------------------------------------------------------------------

class _ConvFold(Pass):
    level = EXTENDED

    @staticmethod
    def _conv(ed: Editor, name: str):
        conv = _op(ed, name, "Conv")
        if conv is None or not ed.single_use(name):
            return None
        w = ed.const(conv.inputs[1])
        b = ed.const(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else None
        if w is None or w.dtype not in _FLOATS or (len(conv.inputs) > 2 and conv.inputs[2] and b is None):
            return None
        if b is not None and b.shape != (w.shape[0],):
            return None
        return conv, w, b

    @staticmethod
    def _emit(ed: Editor, conv: Node, w, b, out: str, remove: list[Node], why: str) -> bool:
        wn = ed.add_const(w, conv.inputs[1] + "_fused")
        bn = ed.add_const(b, (conv.inputs[2] if len(conv.inputs) > 2 and conv.inputs[2] else conv.name) + "_bias_fused")
        new = ed.g.make_node("Conv", [conv.inputs[0], wn, bn], [out], name=ed.fresh(conv.name + "_fused"),
                             proto_attrs=conv.proto_attrs)
        if ed.replace(remove, [new]):
            ed.log("%s: %s", why, new.name)
            return True
        return False


class ConvBatchNormFusion(_ConvFold):
    """``BatchNormalization`` (inference) after a ``Conv`` with constant weights is folded
    into the Conv's weights and bias. Not when the Conv output has other readers."""

    name = "ConvBatchNormFusion"

    def apply(self, graph: Graph) -> int:
        ed = Editor(graph, self.name)
        count = 0
        for bn in list(graph.nodes):
            if bn.op_type != "BatchNormalization" or bn.domain != "" or not ed.alive(bn):
                continue
            if bn.attrs.get("training_mode") or bn.attrs.get("spatial", 1) != 1 or bn.attrs.get("is_test", 1) == 0:
                continue
            if any(o and (ed.consumers(o) or ed.is_output(o)) for o in bn.outputs[1:]):
                continue
            got = self._conv(ed, bn.inputs[0])
            if got is None:
                if self._through_add(ed, bn):
                    count += 1
                continue
            conv, w, b = got
            params = [ed.const(i) for i in bn.inputs[1:5]]
            cout = w.shape[0]
            if any(p is None or p.shape != (cout,) for p in params):
                continue
            scale, bias, mean, var = (p.astype(np.float64) for p in params)
            f = scale / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
            w2 = (w.astype(np.float64) * f.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
            b0 = np.zeros(cout) if b is None else b.astype(np.float64)
            b2 = ((b0 - mean) * f + bias).astype(w.dtype)
            if self._emit(ed, conv, w2, b2, bn.outputs[0], [conv, bn], f"{conv.name} + {bn.name}"):
                count += 1
        return count


    def _through_add(self, ed: Editor, bn: Node) -> bool:
        """``BN(Conv1(x1) + Conv2(x2))`` (a residual join, each Conv read only by the Add): BN is
        affine per channel, so its scale goes into both Convs and its shift into the first one."""
        add = _op(ed, bn.inputs[0], "Add")
        if add is None or not ed.single_use(bn.inputs[0]) or len(add.inputs) != 2 or add.inputs[0] == add.inputs[1]:
            return False
        convs = [self._conv(ed, i) for i in add.inputs]
        if any(c is None for c in convs):
            return False
        (c1, w1, b1), (c2, w2, b2) = convs
        cout = w1.shape[0]
        params = [ed.const(i) for i in bn.inputs[1:5]]
        if w2.shape[0] != cout or w1.dtype != w2.dtype or w1.ndim != w2.ndim or any(
                p is None or p.shape != (cout,) for p in params):
            return False
        scale, bias, mean, var = (p.astype(np.float64) for p in params)
        f = scale / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
        fw = f.reshape((-1,) + (1,) * (w1.ndim - 1))
        new_convs = []
        for k, (conv, w, b) in enumerate(((c1, w1, b1), (c2, w2, b2))):
            b0 = np.zeros(cout) if b is None else b.astype(np.float64)
            b_new = b0 * f + ((bias - mean * f) if k == 0 else 0.0)
            wn = ed.add_const((w.astype(np.float64) * fw).astype(w.dtype), conv.inputs[1] + "_fused")
            bname = ed.add_const(b_new.astype(w.dtype), conv.name + "_bias_fused")
            new_convs.append(ed.g.make_node("Conv", [conv.inputs[0], wn, bname], [ed.fresh(conv.name + "_bn")],
                                            name=ed.fresh(conv.name + "_fused"), proto_attrs=conv.proto_attrs))
        new_add = ed.g.make_node("Add", [new_convs[0].outputs[0], new_convs[1].outputs[0]], [bn.outputs[0]],
                                 name=ed.fresh(add.name + "_fused"), proto_attrs=add.proto_attrs)
        for c in new_convs:
            ed.copy_type(c.outputs[0], bn.outputs[0])
        if ed.replace([c1, c2, add, bn], [*new_convs, new_add]):
            ed.log("%s + %s + %s + %s: BN folded through the Add", c1.name, c2.name, add.name, bn.name)
            return True
        return False


class ConvAddFusion(_ConvFold):
    """``Conv`` followed by ``Add`` of a per-channel (or scalar) constant: the constant goes
    into the Conv bias. ``Mul`` by such a constant scales weights and bias (ConvMulFusion)."""

    name = "ConvAddFusion"
    OP = "Add"

    def apply(self, graph: Graph) -> int:
        ed = Editor(graph, self.name)
        count = 0
        for n in list(graph.nodes):
            if n.op_type != self.OP or n.domain != "" or not ed.alive(n) or len(n.inputs) != 2:
                continue
            for y, c in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
                got = self._conv(ed, y)
                cv = ed.const(c)
                if got is None or cv is None:
                    continue
                conv, w, b = got
                per = self._per_channel(cv, w.shape[0], w.ndim)
                if per is None:
                    continue
                b0 = np.zeros(w.shape[0]) if b is None else b.astype(np.float64)
                if self.OP == "Add":
                    w2, b2 = w, (b0 + per).astype(w.dtype)
                else:
                    w2 = (w.astype(np.float64) * per.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
                    b2 = (b0 * per).astype(w.dtype)
                if self._emit(ed, conv, w2, b2, n.outputs[0], [conv, n], f"{conv.name} + {n.name}"):
                    count += 1
                break
        return count

    @staticmethod
    def _per_channel(c: np.ndarray, cout: int, out_rank: int):
        """The per-output-channel values of ``c`` (float64, shape [cout]) when adding it to a
        Conv output of rank ``out_rank`` broadcasts along channels only, else None."""
        if c.dtype.kind != "f" or c.ndim > out_rank:
            return None
        if c.size == 1:
            return np.full(cout, float(c.reshape(-1)[0]))
        full = (1,) * (out_rank - c.ndim) + c.shape
        if full[1] != cout or any(d != 1 for i, d in enumerate(full) if i != 1):
            return None
        return c.reshape(-1).astype(np.float64)


class ConvMulFusion(ConvAddFusion):
    name = "ConvMulFusion"
    OP = "Mul"


# -- Conv + activation -> FusedConv ---------------------------------------------------------

_LOWEST, _HIGHEST = float(np.finfo(np.float32).min), float(np.finfo(np.float32).max)


def _activation(ed: Editor, n: Node):
    """``(name, params)`` of an activation node ``FusedConv`` can take, else None (Clip
    bounds must be constants)."""
    if n.domain != "":
        return None
    op = n.op_type
    if op in ("Relu", "Tanh", "Sigmoid"):
        return op, []
    if op == "LeakyRelu":
        a = n.attrs.get("alpha")
        return op, [0.01 if a is None else float(a)]
    if op == "HardSigmoid":
        a, b = n.attrs.get("alpha"), n.attrs.get("beta")
        return op, [0.2 if a is None else float(a), 0.5 if b is None else float(b)]
    if op == "Clip":
        if (n.since_version or 1) < 11:
            lo, hi = n.attrs.get("min"), n.attrs.get("max")
            return op, [_LOWEST if lo is None else float(lo), _HIGHEST if hi is None else float(hi)]
        bounds = []
        for i, default in ((1, _LOWEST), (2, _HIGHEST)):
            if len(n.inputs) > i and n.inputs[i]:
                v = ed.const(n.inputs[i])
                if v is None or v.size != 1:
                    return None
                bounds.append(float(v.reshape(-1)[0]))
            else:
                bounds.append(default)
        return op, bounds
    return None


def _residual_conv(ed: Editor, add: Node):
    """``(conv, z)`` when ``add`` is ``Conv(...) + z`` with the Conv output read only there and
    ``z`` a float32 tensor of exactly its shape (FusedConv's ``Z``), else ``(None, None)``."""
    if len(add.inputs) != 2:
        return None, None
    for y, other in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        conv = _op(ed, y, "Conv")
        sy, so = ed.shape(y), ed.shape(other)
        if (conv is not None and ed.single_use(y, add) and y != other and sy is not None and so is not None
                and len(sy) == len(so) and all(same_dim(a, b) for a, b in zip(sy, so))
                and ed.dtype(other) == _F32):
            return conv, other
    return None, None


class ConvActivationFusion(Pass):
    """``Conv`` (float32) whose only reader is an activation (Relu, Clip with constant bounds,
    LeakyRelu, HardSigmoid, Sigmoid, Tanh), optionally through an ``Add`` of a tensor of the
    output's exact shape (a residual: ``act(Conv(x) + z)``) -> onnxruntime's
    ``com.microsoft.FusedConv`` (its ``Z`` input is the residual). The activation then runs
    in place on the convolution's result instead of as a node of its own."""

    name = "ConvActivationFusion"
    level = EXTENDED

    def apply(self, graph: Graph) -> int:
        ed = Editor(graph, self.name)
        if not ed.can_emit("FusedConv", MS_DOMAIN):
            return 0
        count = 0
        for act in list(graph.nodes):
            if not ed.alive(act) or not act.inputs:
                continue
            got = _activation(ed, act)
            if got is None:
                continue
            name, params = got
            src = act.inputs[0]
            z = None
            remove = [act]
            conv = _op(ed, src, "Conv")
            if conv is None:
                add = _op(ed, src, "Add")
                if add is None or not ed.single_use(src, act):
                    continue
                conv, z = _residual_conv(ed, add)
                if conv is None:
                    continue
                remove.append(add)
            elif not ed.single_use(src, act):
                continue
            if ed.dtype(conv.outputs[0]) != _F32 or ed.rank(conv.outputs[0]) is None:
                continue
            ins = list(conv.inputs) + [""] * (3 - len(conv.inputs))
            ins = ins[:3] + ([z] if z else [])
            while ins and not ins[-1]:
                ins.pop()
            attrs = list(conv.proto_attrs) + [onnx.helper.make_attribute("activation", name)]
            if params:
                attrs.append(onnx.helper.make_attribute("activation_params", [float(p) for p in params]))
            ed.ensure_opset(MS_DOMAIN)
            new = ed.g.make_node("FusedConv", ins, [act.outputs[0]], name=ed.fresh(conv.name + "_fused"),
                                 domain=MS_DOMAIN, proto_attrs=attrs)
            if ed.replace([conv, *remove], [new]):
                ed.log("%s + %s -> FusedConv%s", conv.name, act.name, " (+Z)" if z else "")
                count += 1
        # a residual Add with no activation after it: FusedConv without ``activation``
        for add in list(graph.nodes):
            if not ed.alive(add) or add.op_type != "Add" or add.domain != "" or len(add.inputs) != 2:
                continue
            readers = ed.consumers(add.outputs[0])
            if len(readers) == 1 and _activation(ed, readers[0]) is not None:
                continue  # left for the activation loop's next round
            conv, other = _residual_conv(ed, add)
            if conv is None or ed.dtype(conv.outputs[0]) != _F32 or ed.const(other) is not None:
                continue
            ins = (list(conv.inputs) + ["", ""])[:3] + [other]
            ed.ensure_opset(MS_DOMAIN)
            new = ed.g.make_node("FusedConv", ins, [add.outputs[0]], name=ed.fresh(conv.name + "_fused"),
                                 domain=MS_DOMAIN, proto_attrs=list(conv.proto_attrs))
            if ed.replace([conv, add], [new]):
                ed.log("%s + %s -> FusedConv (+Z)", conv.name, add.name)
                count += 1
        return count


# -- MatMul + Add -> Gemm -------------------------------------------------------------

class MatMulAddFusion(Pass):
    """``MatMul(A, B) + C`` -> ``Gemm(A, B, C)`` for 2-D A and B, when C broadcasts to the
    [M, N] result the way Gemm allows (rank <= 2, each dim 1 or the result's)."""

    name = "MatMulAddFusion"
    level = EXTENDED

    def apply(self, graph: Graph) -> int:
        ed = Editor(graph, self.name)
        count = 0
        if not ed.can_emit("Gemm"):
            return 0
        for add in list(graph.nodes):
            if add.op_type != "Add" or add.domain != "" or not ed.alive(add) or len(add.inputs) != 2:
                continue
            for y, c in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
                mm = _op(ed, y, "MatMul")
                if mm is None or not ed.single_use(y) or y == c:
                    continue
                a, b = mm.inputs
                sa, sb, sc = ed.shape(a), ed.shape(b), ed.shape(c)
                if sa is None or sb is None or sc is None or len(sa) != 2 or len(sb) != 2:
                    continue
                if ed.dtype(a) not in _FLOATS or ed.dtype(c) != ed.dtype(a):
                    continue
                m, nn = sa[0], sb[1]
                if len(sc) > 2 or not all(d == 1 or same_dim(d, want) for d, want in zip(sc[::-1], (nn, m))):
                    continue
                gemm = ed.new_node("Gemm", [a, b, c], [add.outputs[0]], base=mm.name + "_gemm",
                                   attrs={"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0})
                if ed.replace([mm, add], [gemm]):
                    ed.log("%s + %s -> Gemm %s", mm.name, add.name, gemm.name)
                    count += 1
                break
        return count


# -- Gelu -----------------------------------------------------------------------------

def _gelu_tail(ed: Editor, t_out: str, x: str):
    """``0.5 * x * (1 + t)`` in any of the exporters' orders, from ``t``'s output.
    Returns (final node, pattern nodes) or None."""
    a = _reader(ed, t_out, "Add")
    if a is None or not _near(_scalar_operand(ed, a, t_out), 1.0):
        return None
    m1 = _reader(ed, a.outputs[0], "Mul")
    if m1 is None:
        return None
    o = _other(m1, a.outputs[0])
    if o is None:
        return None
    if o == x:  # (x * (1 + t)) * 0.5
        m2 = _reader(ed, m1.outputs[0], "Mul")
        if m2 is not None and _near(_scalar_operand(ed, m2, m1.outputs[0]), 0.5):
            return m2, [a, m1, m2]
        return None
    half = _op(ed, o, "Mul")  # (x * 0.5) * (1 + t)
    if half is not None and ed.single_use(o, m1) and _near(_scalar_operand(ed, half, x), 0.5):
        return m1, [a, half, m1]
    if _near(ed.scalar(o), 0.5):  # ((1 + t) * 0.5) * x
        m2 = _reader(ed, m1.outputs[0], "Mul")
        if m2 is not None and _other(m2, m1.outputs[0]) == x:
            return m2, [a, m1, m2]
    return None


def _gelu_op(ed: Editor, x: str, approximate: str):
    """(op_type, domain, attrs) of the Gelu to emit for ``x``, or None when none fits."""
    dt = ed.dtype(x)
    if ed.opset("") >= 20 and dt in _FLOATS and ed.can_emit("Gelu"):
        return "Gelu", "", {"approximate": approximate}
    op = "Gelu" if approximate == "none" else "FastGelu"
    if dt == _F32 and ed.can_emit(op, MS_DOMAIN):
        return op, MS_DOMAIN, {}
    return None


class GeluFusion(Pass):
    """``x * 0.5 * (1 + erf(x / sqrt(2)))`` (any order; ``/ sqrt 2`` or ``* 1/sqrt 2``) ->
    ``Gelu`` (opset >= 20) or ``com.microsoft.Gelu``."""

    name = "GeluFusion"
    level = EXTENDED

    def apply(self, graph: Graph) -> int:
        ed = Editor(graph, self.name)
        count = 0
        for e in list(graph.nodes):
            if e.op_type != "Erf" or e.domain != "" or not ed.alive(e):
                continue
            u = e.inputs[0]
            pu = ed.producer(u)
            if pu is None or pu.domain != "" or not ed.single_use(u, e):
                continue
            x = None
            if pu.op_type == "Div" and _near(ed.scalar(pu.inputs[1]), math.sqrt(2.0)):
                x = pu.inputs[0]
            elif pu.op_type == "Mul":
                for cand in pu.inputs:
                    if _near(_scalar_operand(ed, pu, cand), 1.0 / math.sqrt(2.0)):
                        x = cand
                        break
            if x is None:
                continue
            tail = _gelu_tail(ed, e.outputs[0], x)
            op = _gelu_op(ed, x, "none")
            if tail is None or op is None:
                continue
            final, nodes = tail
            new = ed.new_node(op[0], [x], [final.outputs[0]], base=e.name + "_gelu", domain=op[1], attrs=op[2])
            if ed.replace([pu, e, *nodes], [new]):
                ed.log("erf form -> %s %s", op[0], new.name)
                count += 1
        return count


class FastGeluFusion(Pass):
    """``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`` (x^3 as ``Pow(x, 3)`` or
    ``x * x * x``) -> ``Gelu(approximate="tanh")`` (opset >= 20) or ``com.microsoft.FastGelu``."""

    name = "FastGeluFusion"
    level = EXTENDED

    def apply(self, graph: Graph) -> int:
        ed = Editor(graph, self.name)
        count = 0
        for t in list(graph.nodes):
            if t.op_type != "Tanh" or t.domain != "" or not ed.alive(t):
                continue
            got = self._inner(ed, t)
            if got is None:
                continue
            x, inner_nodes = got
            tail = _gelu_tail(ed, t.outputs[0], x)
            op = _gelu_op(ed, x, "tanh")
            if tail is None or op is None:
                continue
            final, nodes = tail
            new = ed.new_node(op[0], [x], [final.outputs[0]], base=t.name + "_gelu", domain=op[1], attrs=op[2])
            if ed.replace([*inner_nodes, t, *nodes], [new]):
                ed.log("tanh form -> %s %s", op[0], new.name)
                count += 1
        return count

    @staticmethod
    def _inner(ed: Editor, t: Node):
        u = t.inputs[0]
        k = _op(ed, u, "Mul")
        if k is None or not ed.single_use(u, t):
            return None
        for inner in k.inputs:
            if not _near(_scalar_operand(ed, k, inner), math.sqrt(2.0 / math.pi)):
                continue
            add = _op(ed, inner, "Add")
            if add is None or not ed.single_use(inner, k):
                continue
            for x in add.inputs:
                w = _other(add, x)
                cm = _op(ed, w, "Mul")
                if cm is None or not ed.single_use(w, add):
                    continue
                for cube in cm.inputs:
                    if not _near(_scalar_operand(ed, cm, cube), 0.044715):
                        continue
                    cn = _FastCube.match(ed, cube, x, cm)
                    if cn is not None:
                        return x, [*cn, cm, add, k]
        return None


class _FastCube:
    @staticmethod
    def match(ed: Editor, cube: str, x: str, reader: Node):
        """Nodes computing ``x**3`` into ``cube`` (read only by ``reader``), or None."""
        if not ed.single_use(cube, reader):
            return None
        p = _op(ed, cube, "Pow")
        if p is not None and p.inputs[0] == x and ed.scalar(p.inputs[1]) == 3.0:
            return [p]
        m = _op(ed, cube, "Mul")
        if m is None:
            return None
        sq = _other(m, x)
        if sq is None:
            return None
        s = _op(ed, sq, "Mul")
        if s is not None and s.inputs == [x, x] and ed.single_use(sq, m):
            return [s, m]
        return None


# -- BiasGelu -------------------------------------------------------------------------

class BiasGeluFusion(Pass):
    """``Add(x, bias)`` (bias a constant vector of x's last dim) feeding an erf ``Gelu`` ->
    ``com.microsoft.BiasGelu``; feeding a tanh Gelu / ``FastGelu`` -> ``FastGelu(x, bias)``."""

    name = "BiasGeluFusion"
    level = EXTENDED

    def apply(self, graph: Graph) -> int:
        ed = Editor(graph, self.name)
        count = 0
        for g in list(graph.nodes):
            if not ed.alive(g):
                continue
            if g.op_type == "Gelu" and g.domain == "":
                target = "BiasGelu" if g.attrs.get("approximate") == "none" else "FastGelu"
            elif g.op_type == "Gelu" and g.domain == MS_DOMAIN:
                target = "BiasGelu"
            elif g.op_type == "FastGelu" and g.domain == MS_DOMAIN and len([i for i in g.inputs if i]) == 1:
                target = "FastGelu"
            else:
                continue
            s = g.inputs[0]
            add = _op(ed, s, "Add")
            if add is None or not ed.single_use(s, g) or ed.dtype(s) != _F32 or not ed.can_emit(target, MS_DOMAIN):
                continue
            shape = ed.shape(s)
            if not shape or not isinstance(shape[-1], int):
                continue
            for x, b in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
                bv = ed.const(b)
                if bv is None or bv.shape != (shape[-1],) or ed.const(x) is not None:
                    continue
                sx = ed.shape(x)
                if sx is None or len(sx) != len(shape) or sx[-1] != shape[-1]:
                    continue
                new = ed.new_node(target, [x, b], [g.outputs[0]], base=g.name + "_bias", domain=MS_DOMAIN)
                if ed.replace([add, g], [new]):
                    ed.log("%s + %s -> %s", add.name, g.name, target)
                    count += 1
                break
        return count


# -- LayerNormalization ---------------------------------------------------------------

def _skip_layer_norm(ed: Editor, s: str, gamma: str, beta: str | None, eps: float, out: str,
                     pattern: list[Node], base: str) -> bool:
    """Replace ``LN(s)`` (its nodes: ``pattern``) by ``SkipLayerNormalization`` when ``s`` is
    an ``Add`` whose operands fit it (onnxruntime's shape rules: input rank 2 or 3, skip
    with the same last two dims, skip's batch equal or 1). A constant-vector ``Add`` on one
    operand becomes the ``bias`` input. ``s`` may have other readers: it is output 3."""
    add = _op(ed, s, "Add")
    if add is None or len(add.inputs) != 2 or ed.dtype(s) != _F32:
        return False
    if not ed.can_emit("SkipLayerNormalization", MS_DOMAIN):
        return False
    ss = ed.shape(s)
    if ss is None or len(ss) not in (2, 3) or not isinstance(ss[-1], int):
        return False
    d = ss[-1]
    for inp, skip in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        si, sk = ed.shape(inp), ed.shape(skip)
        if si is None or sk is None or len(si) != len(ss) or len(sk) not in (2, 3) or len(sk) > len(si):
            continue
        if not all(same_dim(a, b) for a, b in zip(si, ss)):
            continue
        if not (same_dim(sk[-1], d) and same_dim(sk[-2], si[-2])):
            continue
        if len(sk) == 3 and not (sk[0] == 1 or same_dim(sk[0], si[0])):
            continue
        if ed.const(inp) is not None or ed.const(skip) is not None:
            continue
        remove = [add, *pattern]
        inputs = [inp, skip, gamma, beta or ""]
        b_add = _op(ed, skip, "Add")
        if b_add is not None and ed.single_use(skip, add):
            for m, c in ((b_add.inputs[0], b_add.inputs[1]), (b_add.inputs[1], b_add.inputs[0])):
                cv = ed.const(c)
                sm = ed.shape(m)
                if (cv is not None and cv.shape == (d,) and cv.dtype == _F32 and sm is not None
                        and len(sm) == len(sk) and all(same_dim(a, b) for a, b in zip(sm, sk))
                        and ed.const(m) is None):
                    inputs = [inp, m, gamma, beta or "", c]
                    remove.append(b_add)
                    break
        while inputs and not inputs[-1]:
            inputs.pop()
        readers_outside = [c for c in ed.consumers(s) if all(c is not p for p in pattern)]
        outputs = [out] if not readers_outside and not ed.is_output(s) else [out, "", "", s]
        new = ed.new_node("SkipLayerNormalization", inputs, outputs, base=base + "_skipln", domain=MS_DOMAIN,
                          attrs={"epsilon": float(eps)})
        if ed.replace(remove, [new]):
            ed.log("%s -> SkipLayerNormalization %s%s", base, new.name, " (+bias)" if len(inputs) == 5 else "")
            return True
    return False


def _ln_params(ed: Editor, d, gamma: str | None, beta: str | None, dtype):
    """Names of a gamma/beta pair usable by LayerNormalization (vectors of size ``d``),
    creating them when the pattern had none; None when they do not fit."""
    if not isinstance(d, int):
        return None
    if gamma is None:
        g = ed.add_const(np.ones(d, dtype), "ln_scale")
    else:
        v = _vector(ed, gamma, d)
        if v is None or v.dtype != dtype:
            return None
        g = gamma if ed.const(gamma).shape == (d,) else ed.add_const(v, gamma + "_vec")
    b = None
    if beta is not None:
        v = _vector(ed, beta, d)
        if v is None or v.dtype != dtype:
            return None
        b = beta if ed.const(beta).shape == (d,) else ed.add_const(v, beta + "_vec")
    return g, b


class LayerNormFusion(Pass):
    """The decomposed layer norm ``(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * g + b``
    over the last axis (ReduceMean, Sub, Pow 2 or Mul, ReduceMean, Add eps, Sqrt, Div, Mul,
    Add) -> ``LayerNormalization`` (opset >= 17), or, below opset 17, when ``x`` is an
    ``Add`` that fits, ``com.microsoft.SkipLayerNormalization``."""

    name = "LayerNormFusion"
    level = EXTENDED

    def apply(self, graph: Graph) -> int:
        ed = Editor(graph, self.name)
        count = 0
        for r1 in list(graph.nodes):
            if r1.op_type != "ReduceMean" or r1.domain != "" or not ed.alive(r1):
                continue
            got = self._match(ed, r1)
            if got is None:
                continue
            x, gamma, beta, eps, out, nodes = got
            dt = ed.dtype(x)
            shape = ed.shape(x)
            d = shape[-1] if shape else None
            params = _ln_params(ed, d, gamma, beta, dt)
            if params is None:
                continue
            g, b = params
            if ed.opset("") >= 17:
                if not ed.can_emit("LayerNormalization"):
                    continue
                new = ed.new_node("LayerNormalization", [x, g] + ([b] if b else []), [out], base=r1.name + "_ln",
                                  attrs={"axis": -1, "epsilon": float(eps), "stash_type": 1})
                if ed.replace(nodes, [new]):
                    ed.log("decomposed form -> LayerNormalization %s", new.name)
                    count += 1
            elif _skip_layer_norm(ed, x, g, b, eps, out, nodes, r1.name):
                count += 1
        return count

    @staticmethod
    def _match(ed: Editor, r1: Node):
        x = r1.inputs[0]
        rank = ed.rank(x)
        if ed.dtype(x) not in _FLOATS or not _last_axis(_reduce_axes(ed, r1), rank) or not r1.attrs.get("keepdims", 1):
            return None
        sub = _reader(ed, r1.outputs[0], "Sub")
        if sub is None or sub.inputs != [x, r1.outputs[0]]:
            return None
        dd = sub.outputs[0]
        readers = ed.consumers(dd)
        if ed.is_output(dd) or ed.is_implicit(dd) or len(readers) != 2:
            return None
        sq = next((n for n in readers if n.domain == "" and (
            (n.op_type == "Pow" and n.inputs[0] == dd and ed.scalar(n.inputs[1]) == 2.0)
            or (n.op_type == "Mul" and n.inputs == [dd, dd]))), None)
        div = next((n for n in readers if n.op_type == "Div" and n.domain == "" and n.inputs[0] == dd), None)
        if sq is None or div is None or sq is div:
            return None
        r2 = _reader(ed, sq.outputs[0], "ReduceMean")
        if r2 is None or not _last_axis(_reduce_axes(ed, r2), rank) or not r2.attrs.get("keepdims", 1):
            return None
        ae = _reader(ed, r2.outputs[0], "Add")
        if ae is None:
            return None
        eps = _scalar_operand(ed, ae, r2.outputs[0])
        if eps is None or not eps >= 0:
            return None
        sq_root = _reader(ed, ae.outputs[0], "Sqrt")
        if sq_root is None or div.inputs[1] != sq_root.outputs[0] or not ed.single_use(sq_root.outputs[0], div):
            return None
        nodes = [r1, sub, sq, r2, ae, sq_root, div]
        out = div.outputs[0]
        gamma = beta = None
        mul = _reader(ed, out, "Mul")
        if mul is not None:
            g = _other(mul, out)
            if g is not None and ed.const(g) is not None:
                gamma, out = g, mul.outputs[0]
                nodes.append(mul)
        badd = _reader(ed, out, "Add")
        if badd is not None:
            b = _other(badd, out)
            if b is not None and ed.const(b) is not None:
                beta, out = b, badd.outputs[0]
                nodes.append(badd)
        return x, gamma, beta, eps, out, nodes


class SkipLayerNormFusion(Pass):
    """``LayerNormalization(a + b)`` over the last axis (constant vector scale and bias,
    stash_type 1, only output 0 used) -> ``com.microsoft.SkipLayerNormalization``, taking a
    bias ``Add`` on the skip operand along (see ``_skip_layer_norm`` for the shape rules)."""

    name = "SkipLayerNormFusion"
    level = EXTENDED

    def apply(self, graph: Graph) -> int:
        ed = Editor(graph, self.name)
        count = 0
        for ln in list(graph.nodes):
            if ln.op_type != "LayerNormalization" or ln.domain != "" or not ed.alive(ln):
                continue
            if any(o and (ed.consumers(o) or ed.is_output(o)) for o in ln.outputs[1:]):
                continue
            if ln.attrs.get("stash_type", 1) != 1 or not _last_axis([ln.attrs.get("axis", -1)], ed.rank(ln.inputs[0])):
                continue
            shape = ed.shape(ln.inputs[0])
            d = shape[-1] if shape else None
            gamma = ln.inputs[1]
            beta = ln.inputs[2] if len(ln.inputs) > 2 and ln.inputs[2] else None
            if _vector(ed, gamma, d) is None or ed.const(gamma).ndim != 1:
                continue
            if beta is not None and (_vector(ed, beta, d) is None or ed.const(beta).ndim != 1):
                continue
            if _skip_layer_norm(ed, ln.inputs[0], gamma, beta, ln.attrs.get("epsilon", 1e-5), ln.outputs[0],
                                [ln], ln.name):
                count += 1
        return count


from .attention import AttentionFusion  # noqa: E402 - uses the helpers above

#: in the order they run: activations first (BiasGelu needs Gelu), LayerNorm before SkipLN,
#: attention before SkipLN (the attention output feeds the residual Add)
EXTENDED_PASSES: list[Pass] = [
    ConvBatchNormFusion(), ConvAddFusion(), ConvMulFusion(), ConvActivationFusion(), GeluFusion(), FastGeluFusion(), LayerNormFusion(),
    AttentionFusion(), SkipLayerNormFusion(), BiasGeluFusion(), MatMulAddFusion(),
]
