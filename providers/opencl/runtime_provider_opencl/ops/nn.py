"""Softmax / LogSoftmax, LayerNormalization, BatchNormalization, Conv (1-D and 2-D),
pooling (Max/Average, 1-D and 2-D, and the global pools) and the Reduce* family."""

from __future__ import annotations

import numpy as np

from ..registry import (FLOAT_ONLY, INT64, In, Launch, Out, check_inputs, host_value, is_static, op,
                        present, rank, shape)
from ..shapes import contiguous_strides, int32_array, normalize_axis, size_of


def _same_dtype(node, idx):
    dts = {str(node.input_info[i].dtype) for i in idx if present(node, i)}
    return None if len(dts) <= 1 else f"{node.op_type} inputs have different dtypes {sorted(dts)}"


# -- softmax --------------------------------------------------------------------------

def _check_softmax(node):
    why = check_inputs(node, FLOAT_ONLY, [0])
    if why:
        return why
    try:
        normalize_axis(int(node.attrs["axis"]), rank(node, 0))
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
    return ctx.step(node, [Launch(ctx.kernel("reduce.cl", "softmax", node.input_info[0].dtype), g, ls, args)],
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
    why = check_inputs(node, FLOAT_ONLY, [0, 1, 2]) or _same_dtype(node, (0, 1, 2))
    if why:
        return why
    if int(node.attrs["stash_type"]) != 1:
        return f"LayerNormalization stash_type={node.attrs['stash_type']} (only 1, float32, is implemented)"
    for i in (1, 2):
        if len(node.outputs) > i and node.outputs[i] and str(node.input_info[0].dtype) != "float32":
            return "LayerNormalization Mean/InvStdDev outputs of a float16 input are not implemented"
    try:
        axis = normalize_axis(int(node.attrs["axis"]), rank(node, 0))
    except ValueError as exc:
        return f"LayerNormalization: {exc}"
    if not is_static(node):
        return None
    x = shape(node, 0)
    norm = x[axis:]
    for i, what in ((1, "Scale"), (2, "B")):
        if present(node, i):
            s = shape(node, i)
            if size_of(s) != 1 and _strip(s) != _strip(norm):
                return f"LayerNormalization {what} of shape {s} is not the normalized shape {norm} or a scalar"
    return None


@op("LayerNormalization", 17, check=_check_layernorm, infer=lambda n: _layernorm_infer(n))
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
    return ctx.step(node, [Launch(ctx.kernel("reduce.cl", "layernorm", node.input_info[0].dtype), g, ls,
                                  args)], inputs=ins)


def _layernorm_infer(node):
    x = shape(node, 0)
    axis = normalize_axis(int(node.attrs["axis"]), len(x))
    stat = tuple(x[:axis]) + (1,) * (len(x) - axis)
    return [x, stat, stat][:len(node.outputs)]


# -- conv -----------------------------------------------------------------------------

def _spatial(node, x_sp, ks, strides, dil, ceil_mode=0, same_rule="conv"):
    """(begin pads, end pads, output sizes) from the attributes, or a reason string."""
    a = node.attrs
    sp = len(x_sp)
    auto = a.get("auto_pad") or "NOTSET"
    if auto == "NOTSET":
        pads = tuple(a["pads"]) if a.get("pads") else (0,) * (2 * sp)
        if len(pads) != 2 * sp:
            return f"{node.op_type} pads {pads} do not have {2 * sp} values"
        begin, end = list(pads[:sp]), list(pads[sp:])
    elif auto == "VALID":
        begin, end = [0] * sp, [0] * sp
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end, out = [], [], []
        for i in range(sp):
            o = -(-x_sp[i] // strides[i])
            total = max(0, (o - 1) * strides[i] + (ks[i] - 1) * dil[i] + 1 - x_sp[i])
            small = total // 2
            b = small if auto == "SAME_UPPER" else total - small
            begin.append(b)
            end.append(total - b)
            out.append(o)
        return begin, end, out
    else:
        return f"{node.op_type} auto_pad={auto!r} is not implemented"
    out = []
    for i in range(sp):
        span = x_sp[i] + begin[i] + end[i] - (ks[i] - 1) * dil[i] - 1
        if ceil_mode:
            o = -(-span // strides[i]) + 1
            if (o - 1) * strides[i] >= x_sp[i] + begin[i]:
                o -= 1
        else:
            o = span // strides[i] + 1
        out.append(o)
    return begin, end, out


def _conv_params(node):
    """Everything the kernel needs, as a dict, or a reason string."""
    x, w = shape(node, 0), shape(node, 1)
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
    geo = _spatial(node, x[2:], ks, strides, dil)
    if isinstance(geo, str):
        return geo
    begin, _, osp = geo
    if any(o <= 0 for o in osp):
        return f"Conv output size {osp} is empty"
    if sp == 1:  # 1-D as 2-D with height 1
        return dict(N=n, C=c, H=1, W=x[2], M=m, OH=1, OW=osp[0], KH=1, KW=ks[0], sh=1, sw=strides[0],
                    ph=0, pw=begin[0], dh=1, dw=dil[0], group=group, out=(n, m, osp[0]))
    return dict(N=n, C=c, H=x[2], W=x[3], M=m, OH=osp[0], OW=osp[1], KH=ks[0], KW=ks[1],
                sh=strides[0], sw=strides[1], ph=begin[0], pw=begin[1], dh=dil[0], dw=dil[1], group=group,
                out=(n, m, osp[0], osp[1]))


def _check_conv(node):
    why = check_inputs(node, FLOAT_ONLY, [0, 1, 2]) or _same_dtype(node, (0, 1, 2))
    if why:
        return why
    if rank(node, 0) not in (3, 4):
        return f"Conv on a rank-{rank(node, 0)} input (only 1-D and 2-D convolutions are implemented)"
    if rank(node, 1) != rank(node, 0):
        return f"Conv weight rank {rank(node, 1)} differs from input rank {rank(node, 0)}"
    if not is_static(node):
        return None
    p = _conv_params(node)
    if isinstance(p, str):
        return p
    out = node.output_info[0]
    if out is not None and out.static_shape is not None and tuple(out.static_shape) != p["out"]:
        return f"Conv inferred output shape {out.static_shape} differs from the computed {p['out']}"
    if present(node, 2) and shape(node, 2) != (p["M"],):
        return f"Conv bias of shape {shape(node, 2)} is not ({p['M']},)"
    return None


def _conv_infer(node):
    p = _conv_params(node)
    if isinstance(p, str):
        raise ValueError(p)
    return [p["out"]]


@op("Conv", 1, 11, 22, check=_check_conv, infer=_conv_infer)
def _conv(node, ctx):
    p = _conv_params(node)
    has_b = present(node, 2)
    ins = list(node.inputs[:3] if has_b else node.inputs[:2])
    n_out = p["N"] * p["M"] * p["OH"] * p["OW"]
    g, ls = ctx.grid_1d(n_out)
    names = ["N", "C", "H", "W", "M", "OH", "OW", "KH", "KW", "sh", "sw", "ph", "pw", "dh", "dw", "group"]
    args = [In(0), In(1), In(2) if has_b else ctx.dev.dummy, Out(0)]
    args += [np.int32(p[k]) for k in names] + [np.int32(has_b)]
    return ctx.step(node, [Launch(ctx.kernel("conv.cl", "conv2d", node.input_info[0].dtype), g, ls, args)],
                    inputs=ins)


# -- batch normalization (inference) ----------------------------------------------------

def _check_batchnorm(node):
    why = check_inputs(node, FLOAT_ONLY, [0, 1, 2, 3, 4]) or _same_dtype(node, (0, 1, 2, 3, 4))
    if why:
        return why
    if int(node.attrs.get("training_mode", 0) or 0):
        return "BatchNormalization training_mode=1 is not implemented"
    if node.since_version < 9 and int(node.attrs.get("spatial", 1)) != 1:
        return "BatchNormalization spatial=0 is not implemented"
    if len([o for o in node.outputs if o]) != 1 or not node.outputs[0]:
        return "BatchNormalization with running-statistics outputs is not implemented"
    if rank(node, 0) < 2:
        return "BatchNormalization of an input of rank < 2"
    if is_static(node):
        c = shape(node, 0)[1]
        for i in range(1, 5):
            if size_of(shape(node, i)) != c:
                return f"BatchNormalization input {i} of shape {shape(node, i)} is not ({c},)"
    return None


@op("BatchNormalization", 7, 9, 14, 15, check=_check_batchnorm,
    infer=lambda node: [shape(node, 0)] + [()] * (len(node.outputs) - 1))
def _batchnorm(node, ctx):
    x = shape(node, 0)
    n = size_of(x)
    g, ls = ctx.grid_1d(n)
    args = [In(0), In(1), In(2), In(3), In(4), Out(0), np.int32(n), np.int32(x[1]),
            np.int32(size_of(x[2:])), np.float32(node.attrs["epsilon"])]
    k = ctx.kernel("reduce.cl", "batchnorm", node.input_info[0].dtype)
    return ctx.step(node, [Launch(k, g, ls, args)], inputs=node.inputs[:5])


# -- pooling --------------------------------------------------------------------------

def _pool_params(node):
    x = shape(node, 0)
    sp = len(x) - 2
    a = node.attrs
    ks = tuple(int(k) for k in a["kernel_shape"])
    strides = tuple(a["strides"]) if a.get("strides") else (1,) * sp
    dil = tuple(a["dilations"]) if a.get("dilations") else (1,) * sp
    geo = _spatial(node, x[2:], ks, strides, dil, int(a.get("ceil_mode", 0) or 0))
    if isinstance(geo, str):
        return geo
    begin, end, osp = geo
    if any(o <= 0 for o in osp):
        return f"{node.op_type} output size {osp} is empty"
    if sp == 1:
        return dict(NC=x[0] * x[1], H=1, W=x[2], OH=1, OW=osp[0], KH=1, KW=ks[0], sh=1, sw=strides[0],
                    ph=0, pw=begin[0], peh=0, pew=end[0], dh=1, dw=dil[0], out=(x[0], x[1], osp[0]))
    return dict(NC=x[0] * x[1], H=x[2], W=x[3], OH=osp[0], OW=osp[1], KH=ks[0], KW=ks[1], sh=strides[0],
                sw=strides[1], ph=begin[0], pw=begin[1], peh=end[0], pew=end[1], dh=dil[0], dw=dil[1],
                out=(x[0], x[1], osp[0], osp[1]))


def _check_pool(node):
    why = check_inputs(node, FLOAT_ONLY, [0])
    if why:
        return why
    if len(node.outputs) > 1 and node.outputs[1]:
        return "MaxPool Indices output is not implemented"
    if rank(node, 0) not in (3, 4):
        return f"{node.op_type} on a rank-{rank(node, 0)} input (only 1-D and 2-D pooling is implemented)"
    if len(node.attrs.get("kernel_shape") or ()) != rank(node, 0) - 2:
        return f"{node.op_type} kernel_shape does not match the input rank"
    if not is_static(node):
        return None
    p = _pool_params(node)
    if isinstance(p, str):
        return p
    out = node.output_info[0]
    if out is not None and out.static_shape is not None and tuple(out.static_shape) != p["out"]:
        return f"{node.op_type} inferred output shape {out.static_shape} differs from the computed {p['out']}"
    return None


def _pool_infer(node):
    p = _pool_params(node)
    if isinstance(p, str):
        raise ValueError(p)
    return [p["out"]] + [p["out"]] * (len(node.outputs) - 1)


def _pool(node, ctx, is_max):
    p = _pool_params(node)
    n_out = size_of(p["out"])
    g, ls = ctx.grid_1d(n_out)
    names = ["NC", "H", "W", "OH", "OW", "KH", "KW", "sh", "sw", "ph", "pw", "peh", "pew", "dh", "dw"]
    include = int(node.attrs.get("count_include_pad", 0) or 0)
    args = [In(0), Out(0)] + [np.int32(p[k]) for k in names] + [np.int32(is_max), np.int32(include)]
    k = ctx.kernel("pool.cl", "pool2d", node.input_info[0].dtype)
    return ctx.step(node, [Launch(k, g, ls, args)], inputs=node.inputs[:1])


op("MaxPool", 1, 8, 10, 11, 12, 22, check=_check_pool, infer=_pool_infer)(lambda n, c: _pool(n, c, 1))
op("AveragePool", 7, 10, 11, 19, 22, check=_check_pool, infer=_pool_infer)(lambda n, c: _pool(n, c, 0))


def _check_global_pool(node):
    why = check_inputs(node, FLOAT_ONLY, [0])
    if why:
        return why
    if rank(node, 0) < 3:
        return f"{node.op_type} of a rank-{rank(node, 0)} input"
    return None


def _global_pool(node, ctx, is_max):
    x = shape(node, 0)
    nc = x[0] * x[1]
    g, ls = ctx.grid_1d(nc)
    args = [In(0), Out(0), np.int32(nc), np.int32(size_of(x[2:])), np.int32(is_max)]
    k = ctx.kernel("pool.cl", "global_pool", node.input_info[0].dtype)
    return ctx.step(node, [Launch(k, g, ls, args)], inputs=node.inputs[:1])


def _global_infer(node):
    x = shape(node, 0)
    return [tuple(x[:2]) + (1,) * (len(x) - 2)]


op("GlobalAveragePool", 1, 22, check=_check_global_pool, infer=_global_infer)(
    lambda n, c: _global_pool(n, c, 0))
op("GlobalMaxPool", 1, 22, check=_check_global_pool, infer=_global_infer)(
    lambda n, c: _global_pool(n, c, 1))


# -- reductions -----------------------------------------------------------------------

REDUCE = {  # op -> (kernel op code, versions with an axes attribute, versions with an axes input)
    "ReduceSum": (0, (1, 11), (13,)),
    "ReduceMean": (1, (1, 11, 13), (18,)),
    "ReduceMax": (2, (1, 11, 12, 13), (18, 20)),
    "ReduceMin": (3, (1, 11, 12, 13), (18, 20)),
    "ReduceProd": (4, (1, 11, 13), (18,)),
    "ReduceL1": (5, (1, 11, 13), (18,)),
    "ReduceL2": (6, (1, 11, 13), (18,)),
    "ReduceLogSum": (7, (1, 11, 13), (18, 28)),  # 28 only drops the integer types
    "ReduceLogSumExp": (8, (1, 11, 13), (18, 28)),
    "ReduceSumSquare": (9, (1, 11, 13), (18,)),
}


def _axes_input(node) -> bool:
    return node.since_version in REDUCE[node.op_type][2]


def _reduce_axes(node):
    """The reduced axes (sorted, normalized); () for none."""
    r = len(shape(node, 0))
    if _axes_input(node):
        v = host_value(node, 1)
        axes = [] if v is None else [int(a) for a in v.reshape(-1)]
        if not axes:
            return () if int(node.attrs.get("noop_with_empty_axes", 0) or 0) else tuple(range(r))
    else:
        axes = list(node.attrs.get("axes") or [])
        if not axes:
            return tuple(range(r))
    return tuple(sorted({normalize_axis(a, r) for a in axes}))


def _check_reduce(node):
    why = check_inputs(node, FLOAT_ONLY, [0])
    if why:
        return why
    if _axes_input(node) and present(node, 1):
        vi = node.input_info[1]
        if vi is None or vi.dtype is None or vi.dtype != INT64:
            return f"{node.op_type} axes is not an int64 tensor"
    if is_static(node) and (not _axes_input(node) or not present(node, 1) or host_value(node, 1) is not None):
        try:
            _reduce_axes(node)
        except ValueError as exc:
            return f"{node.op_type}: {exc}"
    return None


def _reduce_infer(node):
    x = shape(node, 0)
    axes = _reduce_axes(node)
    if int(node.attrs["keepdims"]):
        return [tuple(1 if i in axes else d for i, d in enumerate(x))]
    return [tuple(d for i, d in enumerate(x) if i not in axes)]


def _reduce_build(node, ctx):
    x = shape(node, 0)
    axes = _reduce_axes(node)
    xs = contiguous_strides(x)
    odims = [x[i] for i in range(len(x)) if i not in axes] or [1]
    ostr = [xs[i] for i in range(len(x)) if i not in axes] or [0]
    rdims = [x[i] for i in axes]
    rstr = [xs[i] for i in axes]
    n_out = size_of(odims)
    meta = ctx.upload(int32_array(odims + ostr + rdims + rstr + [0]))
    g, ls = ctx.grid_1d(n_out)
    args = [In(0), Out(0), np.int32(n_out), np.int32(len(odims)), np.int32(len(rdims)),
            np.int32(size_of(rdims)), np.int32(REDUCE[node.op_type][0]), meta]
    k = ctx.kernel("reduce.cl", "reduce", node.input_info[0].dtype)
    return ctx.step(node, [Launch(k, g, ls, args)], inputs=node.inputs[:1])


for _op, (_code, _attr_v, _input_v) in REDUCE.items():
    op(_op, *(_attr_v + _input_v), check=_check_reduce, infer=_reduce_infer,
       value_inputs=lambda n: (1,) if _axes_input(n) else ())(_reduce_build)


# -- RMS normalization ----------------------------------------------------------------

def _check_rmsnorm(node):
    why = check_inputs(node, FLOAT_ONLY, [0, 1]) or _same_dtype(node, (0, 1))
    if why:
        return why
    if int(node.attrs["stash_type"]) != 1:
        return f"RMSNormalization stash_type={node.attrs['stash_type']} (only 1, float32, is implemented)"
    if str(node.input_info[0].dtype) != "float32":
        return "RMSNormalization of float16 is not implemented (the CPU provider rounds twice)"
    try:
        axis = normalize_axis(int(node.attrs["axis"]), rank(node, 0))
    except ValueError as exc:
        return f"RMSNormalization: {exc}"
    if is_static(node):
        s = shape(node, 1)
        norm = shape(node, 0)[axis:]
        if size_of(s) != 1 and _strip(s) != _strip(norm):
            return f"RMSNormalization scale of shape {s} is not the normalized shape {norm} or a scalar"
    return None


@op("RMSNormalization", 23, check=_check_rmsnorm)
def _rmsnorm(node, ctx):
    x = shape(node, 0)
    axis = normalize_axis(int(node.attrs["axis"]), len(x))
    rows, d = size_of(x[:axis]), size_of(x[axis:])
    g, ls = ctx.grid_1d(rows)
    args = [In(0), In(1), Out(0), np.int32(rows), np.int32(d), np.float32(node.attrs["epsilon"]),
            np.int32(0 if size_of(shape(node, 1)) == 1 else 1)]
    k = ctx.kernel("reduce.cl", "rmsnorm", node.input_info[0].dtype)
    return ctx.step(node, [Launch(k, g, ls, args)], inputs=node.inputs[:2])


# -- CumSum ---------------------------------------------------------------------------

def _check_cumsum(node):
    why = check_inputs(node, (FLOAT_ONLY[0],), [0])  # float16: numpy accumulates in float16
    if why:
        return why
    vi = node.input_info[1]
    if vi is None or vi.dtype is None or vi.dtype.kind != "i":
        return "CumSum axis is not an integer tensor"
    if rank(node, 0) == 0:
        return "CumSum of a scalar"
    return None


@op("CumSum", 11, 14, check=_check_cumsum, value_inputs=(1,))
def _cumsum(node, ctx):
    x = shape(node, 0)
    a = host_value(node, 1).reshape(-1)
    if a.size != 1:
        raise ValueError("CumSum axis must be a scalar")
    axis = normalize_axis(int(a[0]), len(x))
    outer, L, inner = size_of(x[:axis]), x[axis], size_of(x[axis + 1:])
    g, ls = ctx.grid_1d(outer * inner)
    args = [In(0), Out(0), np.int32(outer), np.int32(L), np.int32(inner),
            np.int32(int(node.attrs["exclusive"])), np.int32(int(node.attrs["reverse"]))]
    k = ctx.kernel("reduce.cl", "cumsum", node.input_info[0].dtype)
    return ctx.step(node, [Launch(k, g, ls, args)], inputs=node.inputs[:1])
