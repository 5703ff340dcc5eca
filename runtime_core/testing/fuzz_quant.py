"""The fuzzer's ``quant`` target: single quantized-op models, valid by construction or broken on purpose.

QuantizeLinear / DequantizeLinear (per tensor, per axis, blocked from opset 21; int8, uint8,
int16, uint16, int4, uint4 where the opset has them), DynamicQuantizeLinear, MatMulInteger,
QLinearMatMul, ConvInteger, QLinearConv (plain, grouped, depthwise, pointwise), MatMulNBits and
the com.microsoft QLinearAdd / QLinearMul. About one case in five breaks one thing on purpose: a
zero point of the wrong type or shape, a scale of the wrong length, an axis out of range, a block
size that does not divide, a kernel wider than the input, a packed weight of the wrong size, a
zero or non-finite scale. Each generator is ``gen(rng, nrng) -> ((model, feeds), what)`` as
:mod:`runtime_core.testing.fuzz` wants; ``what`` ends with :data:`NOT_COMPARED` where
onnxruntime's values are no reference (the spec leaves them undefined: a zero or non-finite scale; onnxruntime leaves MatMulInteger's
output uninitialized for K = 0): such a case must end in a result or a typed error, but its values
are not compared with onnxruntime's.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

F = TensorProto.FLOAT

#: element type -> (numpy dtype, low, high) of the quantized types, and the opset they need
_QTYPES = {
    TensorProto.INT8: (np.int8, -128, 127, 10), TensorProto.UINT8: (np.uint8, 0, 255, 10),
    TensorProto.INT16: (np.int16, -32768, 32767, 21), TensorProto.UINT16: (np.uint16, 0, 65535, 21),
}


#: the end of a case's ``what`` whose output values onnxruntime gives no reference for
NOT_COMPARED = " [values not compared]"


def _undefined(*scales) -> str:
    """:data:`NOT_COMPARED` where a scale is zero or not finite (undefined values), else ''."""
    return NOT_COMPARED if any(np.any(~np.isfinite(s) | (s == 0)) for s in scales) else ""


def _bad(rng) -> bool:
    return rng.random() < 0.2


def _scale(nrng, shape, rng=None, bad=False):
    s = (nrng.random(shape) * 0.05 + 0.002).astype(np.float32)
    if bad and s.size:
        s.flat[0] = rng.choice([0.0, -0.01, np.inf, np.nan])
    return s


def _ints(nrng, dt, lo, hi, shape):
    return nrng.integers(lo, hi + 1, shape).astype(dt)


def _model(nodes, feeds, inits, outputs, opsets):
    from .fuzz import _model as build

    return build(nodes, feeds, inits, outputs, opsets)


def _gen_qdq(rng, nrng):
    """QuantizeLinear or DequantizeLinear, alone or as a Q -> DQ pair; per tensor, per axis or
    blocked (opset 21)."""
    opset = rng.choice([10, 13, 19, 21, 21])
    elem = rng.choice([e for e, v in _QTYPES.items() if v[3] <= opset])
    dt, lo, hi, _ = _QTYPES[elem]
    rank = rng.randint(1, 4)
    shape = [rng.randint(1, 6) for _ in range(rank)]
    mode = rng.choice(["tensor", "axis", "block"] if opset >= 21 else (["tensor", "axis"] if opset >= 13 else ["tensor"]))
    attrs, axis, block = {}, None, 0
    bad = _bad(rng)
    if mode == "tensor":
        pshape = [] if rng.random() < 0.8 else [1]
    else:
        axis = rng.randrange(-rank, rank)
        if bad and rng.random() < 0.3:
            axis = rng.choice([rank, -rank - 1, 2**31])
        attrs["axis"] = axis
        ax = axis % rank if -rank <= axis < rank else 0
        if mode == "axis":
            pshape = [shape[ax] + (1 if bad and rng.random() < 0.3 else 0)]
        else:
            block = rng.choice([1, 2, 3, 4])
            shape[ax] = block * rng.randint(1, 3) + (1 if rng.random() < 0.3 else 0)
            attrs["block_size"] = block if not (bad and rng.random() < 0.3) else rng.choice([0, -1, 5])
            pshape = list(shape)
            pshape[ax] = -(-shape[ax] // block)
    scale = _scale(nrng, pshape, rng, bad and rng.random() < 0.4)
    zp = _ints(nrng, dt, lo, hi, pshape)
    if bad and rng.random() < 0.3:  # a zero point of another type or shape
        zp = rng.choice([zp.astype(np.int32), _ints(nrng, dt, lo, hi, [2] + list(pshape))])
    inits = {"s": scale}
    with_zp = rng.random() < 0.85
    if with_zp:
        inits["z"] = zp
    ins = ["x", "s"] + (["z"] if with_zp else [])
    which = rng.choice(["Q", "DQ", "QDQ"])
    if which == "DQ":
        x = _ints(nrng, dt, lo, hi, shape)
        nodes = [helper.make_node("DequantizeLinear", ins, ["y"], **attrs)]
        outs = {"y": (F, rank)}
    else:
        x = (nrng.standard_normal(shape) * rng.choice([0.1, 1.0, 30.0])).astype(np.float32)
        if x.size and rng.random() < 0.05:  # saturated; NaN's quantized value is left undefined by the spec
            x.flat[0] = rng.choice([np.inf, -np.inf])
        q_attrs = dict(attrs)
        if opset >= 19 and rng.random() < 0.2:
            q_attrs["saturate"] = rng.choice([0, 1])
        if which == "Q":
            nodes = [helper.make_node("QuantizeLinear", ins, ["y"], **q_attrs)]
            outs = {"y": (elem if with_zp else TensorProto.UINT8, rank)}
        else:
            nodes = [helper.make_node("QuantizeLinear", ins, ["q"], **q_attrs),
                     helper.make_node("DequantizeLinear", ["q"] + ins[1:], ["y"], **attrs)]
            outs = {"y": (F, rank)}
    return _model(nodes, {"x": x}, inits, outs, {"": opset}), f"{which}/{mode}" + _undefined(scale)


def _gen_dynamic(rng, nrng):
    """DynamicQuantizeLinear, alone or feeding MatMulInteger (onnxruntime's dynamic quantization)."""
    shape = [rng.randint(0 if rng.random() < 0.05 else 1, 7) for _ in range(rng.randint(1, 3))]
    x = (nrng.standard_normal(shape) * rng.choice([0.01, 1.0, 100.0])).astype(np.float32)
    if x.size and rng.random() < 0.1:
        x.flat[0] = rng.choice([np.nan, np.inf, 0.0])
    if rng.random() < 0.5 or len(shape) < 2:
        node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "ys", "yz"])
        return _model([node], {"x": x}, {}, {"y": (TensorProto.UINT8, len(shape)), "ys": (F, 0),
                                              "yz": (TensorProto.UINT8, 0)}, {"": 13}), "DynamicQuantizeLinear"
    k, n = shape[-1], rng.randint(1, 9)
    w = _ints(nrng, np.int8, -127, 127, [k + (1 if _bad(rng) else 0), n])
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "qs", "qz"]),
             helper.make_node("MatMulInteger", ["q", "w", "qz"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=F),
             helper.make_node("Mul", ["accf", "qs"], ["y"])]
    # K = 0: onnxruntime returns uninitialized memory (the empty sum is 0)
    return (_model(nodes, {"x": x}, {"w": w}, {"y": (F, len(shape))}, {"": 13}),
            "Dynamic+MatMulInteger" + (NOT_COMPARED if k == 0 else ""))


def _gen_matmul(rng, nrng):
    """MatMulInteger or QLinearMatMul with batch dims, per-row / per-column zero points and scales."""
    op = rng.choice(["MatMulInteger", "QLinearMatMul"])
    batch = [rng.randint(1, 3) for _ in range(rng.choice([0, 0, 1, 2]))]
    m, k, n = rng.randint(1, 17), rng.randint(1, 40), rng.randint(1, 17)
    a_dt = rng.choice([np.int8, np.uint8])
    b_dt = rng.choice([np.int8, np.uint8]) if op == "MatMulInteger" or rng.random() < 0.5 else a_dt
    bad = _bad(rng)

    def q(dt, shape):
        info = np.iinfo(dt)
        return _ints(nrng, dt, info.min, info.max, shape)

    a = q(a_dt, batch + [m, k])
    b = q(b_dt, [k + (1 if bad and rng.random() < 0.3 else 0), n])
    per_col = rng.random() < 0.4
    zb_shape = [n + (1 if bad and rng.random() < 0.3 else 0)] if per_col else []
    if op == "MatMulInteger":
        inits = {"b": b, "za": q(a_dt, []), "zb": q(b_dt, zb_shape)}
        if bad and rng.random() < 0.3:
            inits["za"] = q(a_dt, [m + 1])
        node = helper.make_node("MatMulInteger", ["a", "b", "za", "zb"], ["y"])
        return _model([node], {"a": a}, inits, {"y": (TensorProto.INT32, len(batch) + 2)}, {"": 13}), op
    y_dt = a_dt
    inits = {"sa": _scale(nrng, [], rng, bad and rng.random() < 0.3), "za": q(a_dt, []),
             "b": b, "sb": _scale(nrng, zb_shape), "zb": q(b_dt, zb_shape),
             "sy": _scale(nrng, [], rng, bad and rng.random() < 0.3) * 20, "zy": q(y_dt, [])}
    node = helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"])
    elem = TensorProto.INT8 if y_dt == np.int8 else TensorProto.UINT8
    return (_model([node], {"a": a}, inits, {"y": (elem, len(batch) + 2)}, {"": rng.choice([10, 21])}),
            op + _undefined(inits["sa"], inits["sy"]))


def _gen_conv(rng, nrng):
    """QLinearConv or ConvInteger: plain, grouped, depthwise or pointwise, 1-D or 2-D, per-channel
    weight scales; some windows wider than the padded input."""
    op = rng.choice(["QLinearConv", "QLinearConv", "ConvInteger"])
    kind = rng.choice(["depthwise", "pointwise", "grouped", "plain"])
    sp = rng.choice([1, 2, 2, 2])
    c = rng.randint(1, 12)
    group = c if kind == "depthwise" else (2 if kind == "grouped" and c % 2 == 0 else 1)
    mo = (c * rng.choice([1, 2])) if kind == "depthwise" else rng.randint(1, 10) * group
    ks = [1] * sp if kind == "pointwise" else [rng.randint(1, 5) for _ in range(sp)]
    spatial = [rng.randint(1, 14) for _ in range(sp)]
    bad = _bad(rng)
    x_dt = rng.choice([np.int8, np.uint8])
    info = np.iinfo(x_dt)
    x = _ints(nrng, x_dt, info.min, info.max, [rng.choice([1, 2]), c] + spatial)
    w = _ints(nrng, np.int8, -127, 127, [mo, c // group + (1 if bad and rng.random() < 0.2 else 0)] + ks)
    attrs = {"group": group} if group != 1 else {}
    if rng.random() < 0.6:
        attrs["strides"] = [rng.choice([1, 1, 2, 3]) for _ in range(sp)]
    if rng.random() < 0.4:
        attrs["dilations"] = [rng.choice([1, 1, 2]) for _ in range(sp)]
    if rng.random() < 0.2:
        attrs["auto_pad"] = rng.choice(["SAME_UPPER", "SAME_LOWER", "VALID"])
    elif rng.random() < 0.6:
        attrs["pads"] = [rng.choice([0, 0, 1, 2]) for _ in range(2 * sp)]
    per_ch = rng.random() < 0.6
    pshape = [mo + (1 if bad and rng.random() < 0.3 else 0)] if per_ch else []
    if op == "ConvInteger":
        inits = {"xz": _ints(nrng, x_dt, info.min, info.max, []), "w": w, "wz": np.zeros(pshape, np.int8)}
        node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], **attrs)
        return _model([node], {"x": x}, inits, {"y": (TensorProto.INT32, 2 + sp)}, {"": 13}), f"{op}/{kind}"
    inits = {"xs": _scale(nrng, [], rng, bad and rng.random() < 0.3), "xz": _ints(nrng, x_dt, info.min, info.max, []),
             "w": w, "ws": _scale(nrng, pshape), "wz": np.zeros(pshape, np.int8),
             "ys": _scale(nrng, []) * 10, "yz": _ints(nrng, x_dt, info.min, info.max, [])}
    ins = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]
    if rng.random() < 0.6:
        inits["b"] = nrng.integers(-2000, 2000, [mo + (1 if bad and rng.random() < 0.2 else 0)]).astype(np.int32)
        ins.append("b")
    elem = TensorProto.INT8 if x_dt == np.int8 else TensorProto.UINT8
    node = helper.make_node("QLinearConv", ins, ["y"], **attrs)
    return _model([node], {"x": x}, inits, {"y": (elem, 2 + sp)}, {"": 13}), f"{op}/{kind}" + _undefined(inits["xs"])


def _gen_nbits(rng, nrng):
    """MatMulNBits (4 bits): block sizes 16-256, no / packed / float zero points, a bias; some
    packed weights, K or N attributes of the wrong size."""
    bs = rng.choice([16, 32, 64, 128, 256])
    k, n = rng.randint(1, 300), rng.randint(1, 48)
    m = rng.choice([1, 2, 3, 5, 13])
    nb = -(-k // bs)
    bad = _bad(rng)
    b = nrng.integers(0, 256, [n, nb + (1 if bad and rng.random() < 0.4 else 0), bs // 2]).astype(np.uint8)
    inits = {"b": b, "s": _scale(nrng, [n * nb], rng, bad and rng.random() < 0.2)}
    ins = ["a", "b", "s"]
    zkind = rng.choice(["none", "packed", "float"])
    if zkind == "packed":
        inits["z"] = nrng.integers(0, 256, [n * (-(-nb // 2))]).astype(np.uint8)
        ins.append("z")
    elif zkind == "float":
        inits["z"] = (nrng.random([n * nb]) * 15).astype(np.float32)
        ins.append("z")
    if rng.random() < 0.3:
        ins += [""] * (5 - len(ins)) + ["bias"]
        inits["bias"] = nrng.standard_normal([n + (1 if bad and rng.random() < 0.3 else 0)]).astype(np.float32)
    attrs = {"K": k + (1 if bad and rng.random() < 0.3 else 0), "N": n, "bits": 4, "block_size": bs}
    if rng.random() < 0.2:
        attrs["accuracy_level"] = rng.choice([0, 1])  # 4: onnxruntime quantizes A to int8, not a reference
    a = nrng.standard_normal([m, k]).astype(np.float32)
    node = helper.make_node("MatMulNBits", ins, ["y"], domain="com.microsoft", **attrs)
    return (_model([node], {"a": a}, inits, {"y": (F, 2)}, {"": 21, "com.microsoft": 1}),
            f"MatMulNBits/{zkind}" + _undefined(inits["s"]))


def _gen_qbinary(rng, nrng):
    """com.microsoft QLinearAdd / QLinearMul with broadcasting."""
    op = rng.choice(["QLinearAdd", "QLinearMul"])
    dt = rng.choice([np.int8, np.uint8])
    info = np.iinfo(dt)
    shape = [rng.randint(1, 5) for _ in range(rng.randint(1, 4))]
    bshape = [d if rng.random() < 0.6 else 1 for d in shape][rng.randint(0, len(shape) - 1):]
    if _bad(rng):
        bshape = [d + 1 for d in bshape]
    a, b = _ints(nrng, dt, info.min, info.max, shape), _ints(nrng, dt, info.min, info.max, bshape)
    inits = {"sa": _scale(nrng, []), "za": _ints(nrng, dt, info.min, info.max, []), "b": b, "sb": _scale(nrng, []),
             "zb": _ints(nrng, dt, info.min, info.max, []), "sy": _scale(nrng, []) * 3,
             "zy": _ints(nrng, dt, info.min, info.max, [])}
    node = helper.make_node(op, ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"], domain="com.microsoft")
    elem = TensorProto.INT8 if dt == np.int8 else TensorProto.UINT8
    return _model([node], {"a": a}, inits, {"y": (elem, len(shape))}, {"": 13, "com.microsoft": 1}), op


_GENERATORS = [_gen_qdq, _gen_qdq, _gen_dynamic, _gen_matmul, _gen_conv, _gen_conv, _gen_nbits, _gen_qbinary]


def gen_quant(rng, nrng):
    """One quantized-op case (the ``quant`` target)."""
    return rng.choice(_GENERATORS)(rng, nrng)
