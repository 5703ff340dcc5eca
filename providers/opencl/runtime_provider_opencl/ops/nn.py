"""Softmax / LogSoftmax, LayerNormalization and Conv (1-D and 2-D)."""

from __future__ import annotations

import numpy as np

from ..registry import FLOAT_ONLY, In, Launch, Out, check_inputs, op, present, shape
from ..shapes import normalize_axis, size_of


# -- softmax --------------------------------------------------------------------------

def _check_softmax(node):
    why = check_inputs(node, FLOAT_ONLY, [0])
    if why:
        return why
    rank = len(shape(node, 0))
    try:
        normalize_axis(int(node.attrs["axis"]), rank)
    except ValueError as exc:
        return f"{node.op_type}: {exc}"
    return None


def _softmax(node, ctx, logmode):
    x = shape(node, 0)
    axis = normalize_axis(int(node.attrs["axis"]), len(x))
    outer = size_of(x[:axis])
    if node.since_version >= 13:  # one axis
        length, inner = x[axis], size_of(x[axis + 1:])
    else:  # versions 1 and 11: the input is coerced to 2-D at axis
        length, inner = size_of(x[axis:]), 1
    g, ls = ctx.grid_1d(outer * inner)
    args = [In(0), Out(0), np.int32(outer), np.int32(length), np.int32(inner), np.int32(logmode)]
    return ctx.step(node, [Launch(ctx.kernel("reduce.cl", "softmax"), g, ls, args)],
                    inputs=node.inputs[:1])


op("Softmax", 1, 11, 13, check=_check_softmax)(lambda node, ctx: _softmax(node, ctx, 0))
op("LogSoftmax", 1, 11, 13, check=_check_softmax)(lambda node, ctx: _softmax(node, ctx, 1))


# -- layer normalization --------------------------------------------------------------

def _strip(s):
    s = list(s)
    while s and s[0] == 1:
        s.pop(0)
    return tuple(s)


def _check_layernorm(node):
    why = check_inputs(node, FLOAT_ONLY, [0, 1, 2])
    if why:
        return why
    if int(node.attrs["stash_type"]) != 1:
        return f"LayerNormalization stash_type={node.attrs['stash_type']} (only 1, float32, is implemented)"
    x = shape(node, 0)
    try:
        axis = normalize_axis(int(node.attrs["axis"]), len(x))
    except ValueError as exc:
        return f"LayerNormalization: {exc}"
    norm = x[axis:]
    for i, what in ((1, "Scale"), (2, "B")):
        if present(node, i):
            s = shape(node, i)
            if size_of(s) != 1 and _strip(s) != _strip(norm):
                return f"LayerNormalization {what} of shape {s} is not the normalized shape {norm} or a scalar"
    return None


@op("LayerNormalization", 17, check=_check_layernorm)
def _layernorm(node, ctx):
    x = shape(node, 0)
    axis = normalize_axis(int(node.attrs["axis"]), len(x))
    rows, d = size_of(x[:axis]), size_of(x[axis:])
    ins = [node.inputs[0], node.inputs[1]]
    has_b = present(node, 2)
    if has_b:
        ins.append(node.inputs[2])
    sstride = 0 if size_of(shape(node, 1)) == 1 else 1
    bstride = 0 if not has_b or size_of(shape(node, 2)) == 1 else 1
    outs = node.outputs
    want_mean = len(outs) > 1 and bool(outs[1])
    want_inv = len(outs) > 2 and bool(outs[2])
    g, ls = ctx.grid_1d(rows)
    dummy = ctx.dev.dummy
    args = [In(0), In(1), In(2) if has_b else dummy, Out(0),
            Out(1) if want_mean else dummy, Out(2) if want_inv else dummy,
            np.int32(rows), np.int32(d), np.float32(node.attrs["epsilon"]), np.int32(sstride),
            np.int32(has_b), np.int32(bstride), np.int32(want_mean), np.int32(want_inv)]
    return ctx.step(node, [Launch(ctx.kernel("reduce.cl", "layernorm"), g, ls, args)], inputs=ins)


# -- conv -----------------------------------------------------------------------------

def _conv_params(node):
    """Everything the kernel needs, as a dict, or a reason string."""
    x, w = shape(node, 0), shape(node, 1)
    if len(x) not in (3, 4):
        return f"Conv on a rank-{len(x)} input (only 1-D and 2-D convolutions are implemented)"
    if len(w) != len(x):
        return f"Conv weight rank {len(w)} differs from input rank {len(x)}"
    sp = len(x) - 2
    a = node.attrs
    group = int(a["group"])
    n, c = x[0], x[1]
    m = w[0]
    if group < 1 or c % group or m % group or w[1] * group != c:
        return f"Conv group={group} does not fit input channels {c} and weight {w}"
    ks = tuple(a["kernel_shape"]) if a.get("kernel_shape") else tuple(w[2:])
    if ks != tuple(w[2:]):
        return f"Conv kernel_shape {ks} differs from the weight's {tuple(w[2:])}"
    strides = tuple(a["strides"]) if a.get("strides") else (1,) * sp
    dil = tuple(a["dilations"]) if a.get("dilations") else (1,) * sp
    out = shape(node, 0, out=True)
    if len(out) != len(x) or out[0] != n or out[1] != m:
        return f"Conv inferred output shape {out} does not match input {x} and weight {w}"
    osp = out[2:]
    auto = a.get("auto_pad") or "NOTSET"
    if auto == "NOTSET":
        pads = tuple(a["pads"]) if a.get("pads") else (0,) * (2 * sp)
        begin = pads[:sp]
        end = pads[sp:]
    elif auto == "VALID":
        begin = end = (0,) * sp
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(sp):
            total = max(0, (osp[i] - 1) * strides[i] + (ks[i] - 1) * dil[i] + 1 - x[2 + i])
            small = total // 2
            b = small if auto == "SAME_UPPER" else total - small
            begin.append(b)
            end.append(total - b)
    else:
        return f"Conv auto_pad={auto!r} is not implemented"
    for i in range(sp):
        expect = (x[2 + i] + begin[i] + end[i] - dil[i] * (ks[i] - 1) - 1) // strides[i] + 1
        if expect != osp[i]:
            return f"Conv inferred output size {osp} differs from the computed one along axis {2 + i}"
    if sp == 1:  # 1-D as 2-D with height 1
        return dict(N=n, C=c, H=1, W=x[2], M=m, OH=1, OW=osp[0], KH=1, KW=ks[0], sh=1, sw=strides[0],
                    ph=0, pw=begin[0], dh=1, dw=dil[0], group=group)
    return dict(N=n, C=c, H=x[2], W=x[3], M=m, OH=osp[0], OW=osp[1], KH=ks[0], KW=ks[1],
                sh=strides[0], sw=strides[1], ph=begin[0], pw=begin[1], dh=dil[0], dw=dil[1], group=group)


def _check_conv(node):
    why = check_inputs(node, FLOAT_ONLY, [0, 1, 2])
    if why:
        return why
    if node.output_info[0] is None or node.output_info[0].static_shape is None:
        return "Conv output shape is not static"
    p = _conv_params(node)
    if isinstance(p, str):
        return p
    if present(node, 2) and shape(node, 2) != (p["M"],):
        return f"Conv bias of shape {shape(node, 2)} is not ({p['M']},)"
    return None


@op("Conv", 1, 11, 22, check=_check_conv)
def _conv(node, ctx):
    p = _conv_params(node)
    has_b = present(node, 2)
    ins = list(node.inputs[:3] if has_b else node.inputs[:2])
    n_out = p["N"] * p["M"] * p["OH"] * p["OW"]
    g, ls = ctx.grid_1d(n_out)
    names = ["N", "C", "H", "W", "M", "OH", "OW", "KH", "KW", "sh", "sw", "ph", "pw", "dh", "dw", "group"]
    args = [In(0), In(1), In(2) if has_b else ctx.dev.dummy, Out(0)]
    args += [np.int32(p[k]) for k in names] + [np.int32(has_b)]
    return ctx.step(node, [Launch(ctx.kernel("conv.cl", "conv2d"), g, ls, args)], inputs=ins)
