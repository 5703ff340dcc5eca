"""Extended passes around the linear ops: Conv with a following BatchNormalization, Add or
Mul folded into its weights; Conv with an activation (and a residual Add) fused into
``com.microsoft.FusedConv``; a squeeze-excite block into ``runtime_core.fused::SqueezeExcite``;
MatMul + Add into ``Gemm``.

Every fusion checks all of its preconditions and leaves the graph untouched otherwise:
intermediates read only inside the pattern (and no graph outputs), constant weights,
constant coefficients and shapes that fit. The emitted nodes are checked with the CPU
provider (``Editor.replace``): a fusion never introduces a node it would not run.
"""

from __future__ import annotations

import numpy as np
import onnx

from ..graph.ir import Node
from .editor import ALL, EXTENDED, FUSED_DOMAIN, MS_DOMAIN, Editor, same_dim
from .match import F32, FLOATS, op_of
from .rewrite import RewriteRule


# -- Conv folds ---------------------------------------------------------------------

class _ConvFold(RewriteRule):
    level = EXTENDED

    @staticmethod
    def _conv(ed: Editor, name: str):
        conv = op_of(ed, name, "Conv")
        if conv is None or not ed.single_use(name):
            return None
        w = ed.const(conv.inputs[1])
        b = ed.const(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else None
        if w is None or w.dtype not in FLOATS or (len(conv.inputs) > 2 and conv.inputs[2] and b is None):
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
    targets = frozenset({"BatchNormalization"})

    def condition(self, ed: Editor, bn: Node) -> bool:
        if bn.attrs.get("training_mode") or bn.attrs.get("spatial", 1) != 1 or bn.attrs.get("is_test", 1) == 0:
            return False
        return not any(o and (ed.consumers(o) or ed.is_output(o)) for o in bn.outputs[1:])

    def rewrite(self, ed: Editor, bn: Node) -> bool:
        got = self._conv(ed, bn.inputs[0])
        if got is None:
            return self._through_add(ed, bn)
        conv, w, b = got
        params = [ed.const(i) for i in bn.inputs[1:5]]
        cout = w.shape[0]
        if any(p is None or p.shape != (cout,) for p in params):
            return False
        scale, bias, mean, var = (p.astype(np.float64) for p in params)
        f = scale / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
        w2 = (w.astype(np.float64) * f.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
        b0 = np.zeros(cout) if b is None else b.astype(np.float64)
        b2 = ((b0 - mean) * f + bias).astype(w.dtype)
        return self._emit(ed, conv, w2, b2, bn.outputs[0], [conv, bn], f"{conv.name} + {bn.name}")

    def _through_add(self, ed: Editor, bn: Node) -> bool:
        """``BN(Conv1(x1) + Conv2(x2))`` (a residual join, each Conv read only by the Add): BN is
        affine per channel, so its scale goes into both Convs and its shift into the first one."""
        add = op_of(ed, bn.inputs[0], "Add")
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
    targets = frozenset({"Add"})

    def condition(self, ed: Editor, n: Node) -> bool:
        return len(n.inputs) == 2

    def rewrite(self, ed: Editor, n: Node) -> bool:
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
            return self._emit(ed, conv, w2, b2, n.outputs[0], [conv, n], f"{conv.name} + {n.name}")
        return False

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
    targets = frozenset({"Mul"})


class Conv1dAs2dFusion(RewriteRule):
    """A 1-D ``Conv`` or ``com.microsoft.FusedConv`` (3-D input, float32 constant weight;
    Whisper's front end) -> ``Squeeze(Conv(Unsqueeze(x, 2), W[:, :, None, :]), 2)``: the same
    convolution over an image one row high, which takes the 2-D plans chosen by measurement
    (``fast/conv.py``) instead of the N-D numpy path. The reshapes are views (a FusedConv's
    residual ``Z`` gets its own Unsqueeze). After the Conv folds (BatchNormalization, Add
    and Mul go into the 1-D weights first) and after ConvActivationFusion, so that an
    activation after the 1-D Conv is fused before the Squeeze would come between them."""

    name = "Conv1dAs2dFusion"
    level = EXTENDED
    targets = frozenset({"Conv", MS_DOMAIN + "::FusedConv"})
    stage = 2

    def rewrite(self, ed: Editor, conv: Node) -> bool:
        x, y = conv.inputs[0], conv.outputs[0]
        w = ed.const(conv.inputs[1]) if len(conv.inputs) > 1 else None
        sx, sy = ed.shape(x), ed.shape(y)
        if (w is None or w.dtype != F32 or w.ndim != 3 or ed.dtype(x) != F32 or sx is None or len(sx) != 3
                or sy is None or len(sy) != 3):
            return False
        at = conv.attrs
        ks = list(at.get("kernel_shape") or w.shape[2:])
        one = lambda key, default: [default] + [int(v) for v in (at.get(key) or [default])]  # noqa: E731
        pads = [int(v) for v in (at.get("pads") or [0, 0])]
        if len(ks) != 1 or len(pads) != 2:
            return False
        attrs = {"kernel_shape": [1, int(ks[0])], "strides": one("strides", 1), "dilations": one("dilations", 1),
                 "pads": [0, pads[0], 0, pads[1]], "group": int(at.get("group", 1) or 1)}
        if at.get("auto_pad") and at.get("auto_pad") != "NOTSET":
            attrs["auto_pad"] = at["auto_pad"]  # one row, kernel height 1: no padding on that axis
            del attrs["pads"]
        fused = conv.domain == MS_DOMAIN
        if fused:  # the activation and its parameters go along unchanged
            attrs.update({k: at[k] for k in ("activation", "activation_params") if at.get(k) is not None})
        ins = [ed.fresh(x + "_row"), ed.add_const(np.ascontiguousarray(w[:, :, None, :]), conv.inputs[1] + "_2d")]
        ins += [i for i in conv.inputs[2:3]]
        z = conv.inputs[3] if fused and len(conv.inputs) > 3 and conv.inputs[3] else None
        if z is not None:
            ins.append(ed.fresh(z + "_row"))
        while ins and not ins[-1]:
            ins.pop()
        y2 = ed.fresh(y + "_row")
        ed.set_type(ins[0], F32, [sx[0], sx[1], 1, sx[2]])
        ed.set_type(y2, F32, [sy[0], sy[1], 1, sy[2]])
        rows = [(x, ins[0])] + ([(z, ins[3])] if z is not None else [])
        if z is not None:
            ed.set_type(ins[3], F32, [sy[0], sy[1], 1, sy[2]])
        if ed.opset("") >= 13:
            axes = ed.add_const(np.array([2], np.int64), "row_axis")
            unsq = [ed.new_node("Unsqueeze", [a, axes], [b], base=conv.name + "_row") for a, b in rows]
            sq = ed.new_node("Squeeze", [y2, axes], [y], base=conv.name + "_unrow")
        else:
            unsq = [ed.new_node("Unsqueeze", [a], [b], base=conv.name + "_row", attrs={"axes": [2]}) for a, b in rows]
            sq = ed.new_node("Squeeze", [y2], [y], base=conv.name + "_unrow", attrs={"axes": [2]})
        if fused:
            new = ed.new_node("FusedConv", ins, [y2], base=conv.name + "_2d", domain=MS_DOMAIN, attrs=attrs)
        else:
            new = ed.new_node("Conv", ins, [y2], base=conv.name + "_2d", attrs=attrs)
        if ed.replace([conv], [*unsq, new, sq]):
            ed.log("%s: 1-D %s as a 2-D one over one row", conv.name, conv.op_type)
            return True
        return False


# -- Conv + activation -> FusedConv ---------------------------------------------------------

_LOWEST, _HIGHEST = float(np.finfo(np.float32).min), float(np.finfo(np.float32).max)


def _activation(ed: Editor, n: Node):
    """``(name, params)`` of an activation node ``FusedConv`` can take, else None (Clip
    bounds must be constants)."""
    if n.domain != "":
        return None
    op = n.op_type
    if op in ("Relu", "Tanh", "Sigmoid", "HardSwish"):
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
        conv = op_of(ed, y, "Conv")
        sy, so = ed.shape(y), ed.shape(other)
        if (conv is not None and ed.single_use(y, add) and y != other and sy is not None and so is not None
                and len(sy) == len(so) and all(same_dim(a, b) for a, b in zip(sy, so))
                and ed.dtype(other) == F32):
            return conv, other
    return None, None


_ACTIVATIONS = frozenset({"Relu", "Tanh", "Sigmoid", "LeakyRelu", "HardSigmoid", "HardSwish", "Clip"})


class ConvActivationFusion(RewriteRule):
    """``Conv`` (float32) whose only reader is an activation (Relu, Clip with constant bounds,
    LeakyRelu, HardSigmoid, HardSwish, Sigmoid, Tanh), optionally through an ``Add`` of a tensor of the
    output's exact shape (a residual: ``act(Conv(x) + z)``) -> onnxruntime's
    ``com.microsoft.FusedConv`` (its ``Z`` input is the residual). The activation then runs
    in place on the convolution's result instead of as a node of its own. A residual
    ``Add`` with no activation after it becomes a ``FusedConv`` without ``activation``;
    ``Conv(x) * Sigmoid(Conv(x))`` one with ``activation`` ``SiLU`` (ours, as ``HardSwish``:
    not in onnxruntime's list)."""

    name = "ConvActivationFusion"
    level = EXTENDED
    targets = _ACTIVATIONS | {"Add", "Mul"}
    stage = 1  # after the Conv folds: a BatchNormalization after a residual Add folds first

    def rewrite(self, ed: Editor, n: Node) -> bool:
        if n.op_type == "Mul":
            return self._silu(ed, n)
        return self._residual(ed, n) if n.op_type == "Add" else self._activation(ed, n)

    @staticmethod
    def _silu(ed: Editor, mul: Node) -> bool:
        """``c * Sigmoid(c)``, ``c`` a Conv's output read only by the two (SiLU as the
        exporters write it: EfficientNet's) -> FusedConv with our ``SiLU`` activation."""
        if len(mul.inputs) != 2 or mul.domain != "":
            return False
        for c, s in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
            sig, conv = op_of(ed, s, "Sigmoid"), op_of(ed, c, "Conv")
            if sig is None or conv is None or sig.inputs[:1] != [c] or not ed.single_use(s, mul):
                continue
            readers = ed.consumers(c)
            if (len(readers) != 2 or {id(r) for r in readers} != {id(sig), id(mul)} or ed.is_output(c)
                    or ed.is_implicit(c) or ed.dtype(c) != F32 or ed.rank(c) is None):
                continue
            ins = list(conv.inputs)
            while ins and not ins[-1]:
                ins.pop()
            attrs = list(conv.proto_attrs) + [onnx.helper.make_attribute("activation", "SiLU")]
            ed.ensure_opset(MS_DOMAIN)
            new = ed.g.make_node("FusedConv", ins, [mul.outputs[0]], name=ed.fresh(conv.name + "_fused"),
                                 domain=MS_DOMAIN, proto_attrs=attrs)
            if ed.replace([conv, sig, mul], [new]):
                ed.log("%s + %s + %s -> FusedConv (SiLU)", conv.name, sig.name, mul.name)
                return True
        return False

    @staticmethod
    def _activation(ed: Editor, act: Node) -> bool:
        if not act.inputs:
            return False
        got = _activation(ed, act)
        if got is None:
            return False
        name, params = got
        src = act.inputs[0]
        z = None
        remove = [act]
        conv = op_of(ed, src, "Conv")
        if conv is None:
            add = op_of(ed, src, "Add")
            if add is None or not ed.single_use(src, act):
                return False
            conv, z = _residual_conv(ed, add)
            if conv is None:
                return False
            remove.append(add)
        elif not ed.single_use(src, act):
            return False
        if ed.dtype(conv.outputs[0]) != F32 or ed.rank(conv.outputs[0]) is None:
            return False
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
            return True
        return False

    @staticmethod
    def _residual(ed: Editor, add: Node) -> bool:
        if len(add.inputs) != 2:
            return False
        readers = ed.consumers(add.outputs[0])
        if len(readers) == 1 and _activation(ed, readers[0]) is not None:
            return False  # the activation takes the Add along when the walk reaches it
        conv, other = _residual_conv(ed, add)
        if conv is None or ed.dtype(conv.outputs[0]) != F32 or ed.const(other) is not None:
            return False
        ins = (list(conv.inputs) + ["", ""])[:3] + [other]
        ed.ensure_opset(MS_DOMAIN)
        new = ed.g.make_node("FusedConv", ins, [add.outputs[0]], name=ed.fresh(conv.name + "_fused"),
                             domain=MS_DOMAIN, proto_attrs=list(conv.proto_attrs))
        if ed.replace([conv, add], [new]):
            ed.log("%s + %s -> FusedConv (+Z)", conv.name, add.name)
            return True
        return False


# -- squeeze-excite -> one op ------------------------------------------------------------

#: the domain of the fused ops only runtime-core runs (written back as standard ops in a saved
#: model: ``portable.py``)
#: activations the excitation's first 1x1 convolution may carry; its gate's
_SE_ACTS = frozenset({"Relu", "Tanh", "Sigmoid", "LeakyRelu", "HardSigmoid", "HardSwish", "Clip", "SiLU"})
_SE_GATES = frozenset({"Sigmoid", "HardSigmoid"})


def _fused_act(n: Node):
    """``(activation, params)`` of a ``FusedConv`` (activation None: none), of a ``Conv``
    ``(None, [])``; None for anything else or a FusedConv with a residual."""
    if n.domain == "" and n.op_type == "Conv":
        return None, []
    if n.domain != MS_DOMAIN or n.op_type != "FusedConv" or (len(n.inputs) > 3 and n.inputs[3]):
        return None
    act = n.attrs.get("activation")
    act = act.decode() if isinstance(act, bytes) else act
    return act, [float(p) for p in (n.attrs.get("activation_params") or [])]


def _pointwise_on_pooled(ed: Editor, n: Node, c_in: int):
    """The [c_out, c_in, 1, 1] constant weight of ``n`` (a Conv / FusedConv) when it is a plain
    1x1 convolution of a [N, c_in, 1, 1] tensor (group 1, no pads, unit strides), else None."""
    a = n.attrs
    if len(n.inputs) < 2 or (a.get("group") or 1) != 1 or any(a.get("pads") or []) or any(
            s != 1 for s in (a.get("strides") or [])):
        return None
    ap = a.get("auto_pad") or "NOTSET"
    if (ap.decode() if isinstance(ap, bytes) else ap) not in ("NOTSET", "VALID"):
        return None
    w = ed.const(n.inputs[1])
    if w is None or w.dtype != F32 or w.ndim != 4 or w.shape[1:] != (c_in, 1, 1):
        return None
    if len(n.inputs) > 2 and n.inputs[2]:
        b = ed.const(n.inputs[2])
        if b is None or b.dtype != F32 or b.shape != (w.shape[0],):
            return None
    return w


def _bias_of(n: Node) -> str:
    return n.inputs[2] if len(n.inputs) > 2 else ""


def _spatial_mean(ed: Editor, n: Node) -> bool:
    """``n`` is GlobalAveragePool or ReduceMean over axes 2 and 3 of a rank-4 tensor, keepdims."""
    if n.domain != "" or ed.rank(n.inputs[0]) != 4:
        return False
    if n.op_type == "GlobalAveragePool":
        return True
    if n.op_type != "ReduceMean" or not (n.attrs.get("keepdims", 1)):
        return False
    if (n.since_version or 1) >= 18:
        axes = ed.const(n.inputs[1]) if len(n.inputs) > 1 and n.inputs[1] else None
        axes = None if axes is None else [int(v) for v in axes.reshape(-1)]
    else:
        axes = n.attrs.get("axes")
    return axes is not None and sorted(v % 4 for v in axes) == [2, 3]


class SqueezeExciteFusion(RewriteRule):
    """A squeeze-excite block, ``x * gate(conv2(act(conv1(mean_hw(x)))))`` (MobileNetV3's:
    GlobalAveragePool or ReduceMean, 1x1 Conv, Relu, 1x1 Conv, HardSigmoid, Mul;
    EfficientNet's: SiLU and Sigmoid), the convolutions already ``FusedConv`` with their
    activations -> one ``runtime_core.fused::SqueezeExcite``: five steps on [N, C, 1, 1]
    tensors (two of them matrix-vector products that would each wake the kernel threads)
    become one, and the gate's product can be written into ``x`` where nothing else reads it.
    Every intermediate read only inside the pattern; constant float32 weights."""

    name = "SqueezeExciteFusion"
    level = EXTENDED
    targets = frozenset({"Mul"})
    stage = 2  # after ConvActivationFusion (stage 1) has put the activations into FusedConv

    def rewrite(self, ed: Editor, mul: Node) -> bool:
        if len(mul.inputs) != 2 or mul.domain != "":
            return False
        for x, g in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
            if ed.dtype(x) != F32 or ed.rank(x) != 4 or not ed.single_use(g, mul):
                continue
            fc2 = ed.producer(g)
            got2 = None if fc2 is None else _fused_act(fc2)
            if got2 is None or got2[0] not in _SE_GATES:
                continue
            fc1 = ed.producer(fc2.inputs[0])
            got1 = None if fc1 is None or not ed.single_use(fc2.inputs[0], fc2) else _fused_act(fc1)
            if got1 is None or (got1[0] is not None and got1[0] not in _SE_ACTS):
                continue
            pool = ed.producer(fc1.inputs[0])
            if (pool is None or pool.inputs[:1] != [x] or not ed.single_use(fc1.inputs[0], fc1)
                    or not _spatial_mean(ed, pool)):
                continue
            shape = ed.shape(x)
            c = shape[1] if shape is not None else None
            if not isinstance(c, int):
                continue
            w1 = _pointwise_on_pooled(ed, fc1, c)
            w2 = None if w1 is None else _pointwise_on_pooled(ed, fc2, w1.shape[0])
            if w2 is None or w2.shape[0] != c:
                continue
            attrs: dict = {"gate": got2[0]}
            if got2[1]:
                attrs["gate_params"] = got2[1]
            if got1[0] is not None:
                attrs["activation"] = got1[0]
            if got1[1]:
                attrs["activation_params"] = got1[1]
            ins = [x, fc1.inputs[1], _bias_of(fc1), fc2.inputs[1], _bias_of(fc2)]
            while not ins[-1]:
                ins.pop()
            new = ed.new_node("SqueezeExcite", ins, [mul.outputs[0]], base=fc1.name + "_se",
                              domain=FUSED_DOMAIN, attrs=attrs)
            if ed.replace([pool, fc1, fc2, mul], [new]):
                ed.log("%s + %s + %s + %s -> SqueezeExcite", pool.name, fc1.name, fc2.name, mul.name)
                return True
        return False


# -- MatMul + Add -> Gemm -------------------------------------------------------------

class MatMulAddFusion(RewriteRule):
    """``MatMul(A, B) + C`` -> ``Gemm(A, B, C)`` for 2-D A and B, when C broadcasts to the
    [M, N] result the way Gemm allows (rank <= 2, each dim 1 or the result's)."""

    name = "MatMulAddFusion"
    level = EXTENDED
    targets = frozenset({"Add"})
    stage = 1  # after SkipLayerNormFusion, which takes a bias Add along as its bias input

    def condition(self, ed: Editor, add: Node) -> bool:
        return len(add.inputs) == 2

    def rewrite(self, ed: Editor, add: Node) -> bool:
        for y, c in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
            mm = op_of(ed, y, "MatMul")
            if mm is None or not ed.single_use(y) or y == c:
                continue
            a, b = mm.inputs
            sa, sb, sc = ed.shape(a), ed.shape(b), ed.shape(c)
            if sa is None or sb is None or sc is None or len(sa) != 2 or len(sb) != 2:
                continue
            if ed.dtype(a) not in FLOATS or ed.dtype(c) != ed.dtype(a):
                continue
            m, nn = sa[0], sb[1]
            if len(sc) > 2 or not all(d == 1 or same_dim(d, want) for d, want in zip(sc[::-1], (nn, m))):
                continue
            gemm = ed.new_node("Gemm", [a, b, c], [add.outputs[0]], base=mm.name + "_gemm",
                               attrs={"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0})
            if ed.replace([mm, add], [gemm]):
                ed.log("%s + %s -> Gemm %s", mm.name, add.name, gemm.name)
                return True
            return False
        return False


class LayerScaleFusion(RewriteRule):
    """``Transpose(MatMul(x, W) + b) * gamma`` (ConvNeXt's layer scale after its second
    Linear and the permute back to NCHW: gamma [C, 1, 1] on the channel axis the Transpose
    moved the product's last axis to) -> ``Transpose(MatMul(x, W * gamma) + b * gamma)``:
    one pass over the activations fewer, the scale folded into the constant weights. W, b
    and gamma float32 constants, b of shape [N], gamma 1 on every axis but that one;
    the intermediates read only inside the pattern."""

    name = "LayerScaleFusion"
    level = EXTENDED
    targets = frozenset({"Mul"})

    def rewrite(self, ed: Editor, mul: Node) -> bool:
        if len(mul.inputs) != 2:
            return False
        for t, g in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
            tr = op_of(ed, t, "Transpose")
            gamma = ed.const(g)
            if tr is None or gamma is None or gamma.dtype != F32 or not ed.single_use(t, mul) or t == g:
                continue
            add = op_of(ed, tr.inputs[0], "Add")
            if add is None or len(add.inputs) != 2 or not ed.single_use(tr.inputs[0], tr):
                return False
            for y, bn in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
                mm = op_of(ed, y, "MatMul")
                w, b = (ed.const(mm.inputs[1]), ed.const(bn)) if mm is not None else (None, None)
                if mm is None or w is None or b is None or not ed.single_use(y, add) or y == bn:
                    continue
                if w.dtype != F32 or w.ndim != 2 or b.dtype != F32 or b.shape != (w.shape[1],):
                    return False
                n = w.shape[1]
                ys = ed.shape(y)
                if ys is None or len(ys) < 2:
                    return False
                rk = len(ys)
                perm = list(tr.attrs.get("perm") or range(rk)[::-1])
                if sorted(perm) != list(range(rk)) or gamma.ndim > rk:
                    return False
                at = perm.index(rk - 1)  # where the product's last axis (N) lands
                gs = (1,) * (rk - gamma.ndim) + gamma.shape
                if any(d != 1 for i, d in enumerate(gs) if i != at) or gs[at] not in (1, n):
                    return False
                gv = np.broadcast_to(gamma.reshape(-1), (n,)).astype(F32)
                wn = ed.add_const(np.ascontiguousarray(w * gv[None, :], dtype=F32), mm.inputs[1] + "_scaled")
                bsc = ed.add_const((b * gv).astype(F32), bn + "_scaled")
                new = [ed.new_node("MatMul", [mm.inputs[0], wn], [y], base=mm.name + "_scaled"),
                       ed.new_node("Add", [y, bsc] if add.inputs[0] == y else [bsc, y], [add.outputs[0]],
                                   base=add.name + "_scaled"),
                       ed.g.make_node("Transpose", [add.outputs[0]], [mul.outputs[0]],
                                      name=ed.fresh(tr.name + "_scaled"), proto_attrs=tr.proto_attrs)]
                if ed.replace([mm, add, tr, mul], new):
                    ed.log("%s folded into %s's weights", mul.name, mm.name)
                    return True
                return False
            return False
        return False


class FlattenedGemmFusion(RewriteRule):
    """``Reshape(Gemm(Reshape(x, [*, D]), W, c), [*x.shape[:-1], N])`` (GPT-2's Conv1D, and
    ``nn.Linear`` in TorchScript exports at opset < 14 style) -> ``MatMul(x, W) + c``: the
    same row-wise linear without the flatten, and without the ``Shape`` computations that
    size the two Reshapes (several nodes per linear with dynamic axes). The bias ``Add`` is
    then free for SkipLayerNormalization, BiasGelu and the attention fusion."""

    name = "FlattenedGemmFusion"
    level = EXTENDED
    targets = frozenset({"Gemm"})

    def rewrite(self, ed: Editor, gemm: Node) -> bool:
        from .shapes import dims_of, reshape_target

        if gemm.attrs.get("transA") or len(gemm.inputs) < 2:
            return False
        inner = op_of(ed, gemm.inputs[0], "Reshape")
        y = gemm.outputs[0]
        outs = ed.consumers(y)
        if inner is None or not ed.single_use(gemm.inputs[0], gemm) or len(outs) != 1 or ed.is_output(y):
            return False
        outer = outs[0]
        if outer.op_type != "Reshape" or outer.domain != "" or outer.inputs[0] != y:
            return False
        w = ed.const(gemm.inputs[1])
        x = inner.inputs[0]
        xd = dims_of(ed, x)
        if w is None or w.ndim != 2 or w.dtype != F32 or ed.dtype(x) != F32 or xd is None or len(xd) < 2:
            return False
        if gemm.attrs.get("transB"):
            w = w.T
        d, n = w.shape
        t_in, t_out = reshape_target(ed, inner), reshape_target(ed, outer)
        # the flatten keeps rows whole (last dim D), the Reshape back restores x's leading dims
        if xd[-1] != d or t_in is None or len(t_in) != 2 or t_in[1] != d or t_out != xd[:-1] + [n]:
            return False
        alpha, beta = float(gemm.attrs.get("alpha", 1.0)), float(gemm.attrs.get("beta", 1.0))
        c = None
        if len(gemm.inputs) > 2 and gemm.inputs[2]:
            c = ed.const(gemm.inputs[2])
            if c is None or c.dtype != F32 or c.size not in (1, n) or (c.ndim == 2 and c.shape[0] != 1) or c.ndim > 2:
                return False
            c = (np.broadcast_to(c.reshape(-1), (n,)) * np.float32(beta)).astype(F32)
        if alpha != 1.0 or gemm.attrs.get("transB"):
            wn = ed.add_const(np.ascontiguousarray(w * np.float32(alpha), dtype=F32), gemm.inputs[1] + "_kn")
        else:
            wn = gemm.inputs[1]
        out = outer.outputs[0]
        mm_out = ed.fresh(gemm.name + "_matmul") if c is not None else out
        new = [ed.new_node("MatMul", [x, wn], [mm_out], base=gemm.name + "_matmul")]
        if c is not None:
            ed.set_type(mm_out, F32, [v if isinstance(v, (int, str)) else None for v in xd[:-1]] + [n])
            new.append(ed.new_node("Add", [mm_out, ed.add_const(c, gemm.name + "_bias")], [out],
                                   base=gemm.name + "_bias"))
        if ed.replace([inner, gemm, outer], new):
            ed.log("%s between flattening Reshapes -> MatMul%s", gemm.name, " + Add" if c is not None else "")
            return True
        return False


# -- MatMul (+ bias) + Relu -> runtime_core.fused::MatMulActivation --------------------------



class MatMulActivationFusion(RewriteRule):
    """``Relu(MatMul(x, W))``, ``Relu(MatMul(x, W) + b)`` and ``Relu(Gemm(x, W, b))`` (T5's
    feed-forward; W a float32 2-D constant, b a constant of N values, x of rank >= 2) ->
    ``runtime_core.fused::MatMulActivation(x, W[, b])`` with ``activation`` ``Relu``: the
    Linear kernel applies it in its epilogue instead of a pass over the result. A private op
    (onnxruntime has no N-D MatMul + activation), hence level ALL, as the channels-last ops:
    a model saved at EXTENDED still loads in onnxruntime."""

    name = "MatMulActivationFusion"
    level = ALL
    targets = frozenset({"Relu"})

    def rewrite(self, ed: Editor, relu: Node) -> bool:
        if relu.domain != "" or len(relu.inputs) != 1 or ed.dtype(relu.inputs[0]) != F32:
            return False
        src = relu.inputs[0]
        if not ed.single_use(src, relu):
            return False
        remove, bias = [relu], None
        mm = op_of(ed, src, "MatMul")
        if mm is None and (gemm := op_of(ed, src, "Gemm")) is not None:
            return self._gemm(ed, gemm, relu)
        if mm is None:
            add = op_of(ed, src, "Add")
            if add is None or len(add.inputs) != 2:
                return False
            for y, c in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
                cand = op_of(ed, y, "MatMul")
                if cand is not None and y != c and ed.single_use(y, add) and ed.const(c) is not None:
                    mm, bias = cand, ed.const(c)
                    break
            if mm is None:
                return False
            remove.append(add)
        w = ed.const(mm.inputs[1])
        if w is None or w.dtype != F32 or w.ndim != 2 or (ed.rank(mm.inputs[0]) or 0) < 2:
            return False
        return self._emit(ed, mm, mm.inputs[0], mm.inputs[1], w.shape[1], bias, [mm, *remove], relu)

    def _gemm(self, ed: Editor, gemm: Node, relu: Node) -> bool:
        at = gemm.attrs
        w = ed.const(gemm.inputs[1]) if len(gemm.inputs) > 1 else None
        if (at.get("transA") or float(at.get("alpha", 1.0)) != 1.0 or w is None or w.dtype != F32
                or w.ndim != 2 or ed.rank(gemm.inputs[0]) != 2):
            return False
        wname = gemm.inputs[1]
        if at.get("transB"):
            w = np.ascontiguousarray(w.T)
            wname = ed.add_const(w, gemm.inputs[1] + "_kn")
        bias = None
        if len(gemm.inputs) > 2 and gemm.inputs[2]:
            bias = ed.const(gemm.inputs[2])
            if bias is None:
                return False
            bias = bias * np.float32(at.get("beta", 1.0))
        return self._emit(ed, gemm, gemm.inputs[0], wname, w.shape[1], bias, [gemm, relu], relu)

    @staticmethod
    def _emit(ed: Editor, mm: Node, x: str, w: str, n: int, bias, remove: list[Node], relu: Node) -> bool:
        ins = [x, w]
        if bias is not None:
            # a bias that broadcasts along the rows only: N values (or one)
            if bias.dtype != F32 or bias.size not in (1, n) or any(d != 1 for d in bias.shape[:-1]):
                return False
            ins.append(ed.add_const(np.ascontiguousarray(np.broadcast_to(bias.reshape(-1), (n,)), F32),
                                    mm.name + "_bias"))
        new = ed.new_node("MatMulActivation", ins, [relu.outputs[0]], base=mm.name + "_relu", domain=FUSED_DOMAIN,
                          attrs={"activation": "Relu"})
        if ed.replace(remove, [new]):
            ed.log("%s -> MatMulActivation (Relu) %s", " + ".join(r.name for r in remove), new.name)
            return True
        return False
