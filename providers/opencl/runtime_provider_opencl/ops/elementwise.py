"""Elementwise ops: unary activations, broadcasting arithmetic, comparisons, Where."""

from __future__ import annotations

import numpy as np

from ..registry import (BOOL, F16, F32, FLOAT_ONLY, INT32, INT64, In, Launch, Out, check_inputs, is_static,
                        op, present, shape)
from ..shapes import broadcast_strides, coalesce, meta_array, size_of

FILE = "elementwise.cl"

# -- unary ---------------------------------------------------------------------------

# op type -> (kernel, schema versions)
UNARY = {
    "Relu": ("u_relu", (6, 13, 14)),
    "Sigmoid": ("u_sigmoid", (6, 13)),
    "Tanh": ("u_tanh", (6, 13)),
    "Erf": ("u_erf", (9, 13)),
    "Exp": ("u_exp", (6, 13)),
    "Log": ("u_log", (6, 13)),
    "Sqrt": ("u_sqrt", (6, 13)),
    "Neg": ("u_neg", (6, 13)),
    "Abs": ("u_abs", (6, 13)),
    "HardSwish": ("u_hard_swish", (14, 22)),
    "Reciprocal": ("u_reciprocal", (6, 13)),
    "Floor": ("u_floor", (6, 13)),
    "Ceil": ("u_ceil", (6, 13)),
    "Round": ("u_round", (11, 22)),
    "Sin": ("u_sin", (7, 22)),
    "Cos": ("u_cos", (7, 22)),
    "Softsign": ("u_softsign", (1, 22)),
    "Softplus": ("u_softplus", (1, 22)),
    "Sign": ("u_sign", (9, 13)),
}


def _check_unary(node):
    return check_inputs(node, FLOAT_ONLY, [0], any_rank=True)


def _unary_launch(ctx, node, kernel: str, p0: float = 0.0, p1: float = 0.0):
    n = size_of(shape(node, 0))
    g, ls = ctx.grid_1d(n)
    args = [In(0), Out(0), np.int32(n), np.float32(p0), np.float32(p1)]
    k = ctx.kernel(FILE, kernel, node.input_info[0].dtype)
    return ctx.step(node, [Launch(k, g, ls, args)], inputs=[node.inputs[0]])


def _make_unary(kernel):
    def build(node, ctx):
        return _unary_launch(ctx, node, kernel)
    return build


for _op, (_kernel, _versions) in UNARY.items():
    op(_op, *_versions, check=_check_unary)(_make_unary(_kernel))


def _check_gelu(node):
    if node.attrs.get("approximate") not in ("none", "tanh"):
        return f"Gelu approximate={node.attrs.get('approximate')!r} is not 'none' or 'tanh'"
    return _check_unary(node)


@op("Gelu", 20, check=_check_gelu)
def _gelu(node, ctx):
    return _unary_launch(ctx, node, "u_gelu_tanh" if node.attrs["approximate"] == "tanh" else "u_gelu")


@op("LeakyRelu", 6, 16, check=_check_unary)
def _leaky_relu(node, ctx):
    return _unary_launch(ctx, node, "u_leaky_relu", node.attrs["alpha"])


@op("Elu", 6, 22, check=_check_unary)
def _elu(node, ctx):
    return _unary_launch(ctx, node, "u_elu", node.attrs["alpha"])


@op("Selu", 6, 22, check=_check_unary)
def _selu(node, ctx):
    return _unary_launch(ctx, node, "u_selu", node.attrs["alpha"], node.attrs["gamma"])


@op("HardSigmoid", 6, 22, check=_check_unary)
def _hard_sigmoid(node, ctx):
    return _unary_launch(ctx, node, "u_hard_sigmoid", node.attrs["alpha"], node.attrs["beta"])


def _check_clip(node):
    why = _check_unary(node)
    if why:
        return why
    if node.since_version >= 11:
        for i, what in ((1, "min"), (2, "max")):
            if not present(node, i):
                continue
            vi = node.input_info[i]
            if vi is None or vi.const is None:
                return f"Clip {what} is not a constant initializer (it is read at compile time)"
            if np.asarray(vi.const).size != 1 or np.asarray(vi.const).dtype != node.input_info[0].dtype:
                return f"Clip {what} must be a scalar of the input's dtype"
    return None


@op("Clip", 6, 11, 12, 13, check=_check_clip)
def _clip(node, ctx):
    if node.since_version < 11:
        lo, hi = node.attrs["min"], node.attrs["max"]
    else:
        lo_v, hi_v = ctx.const(node, 1), ctx.const(node, 2)
        lo = -np.inf if lo_v is None else float(lo_v.reshape(()))
        hi = np.inf if hi_v is None else float(hi_v.reshape(()))
    return _unary_launch(ctx, node, "u_clip", lo, hi)


# -- broadcasting ---------------------------------------------------------------------

BINARY = {
    "Add": ("b_add", (7, 13, 14)),
    "Sub": ("b_sub", (7, 13, 14)),
    "Mul": ("b_mul", (7, 13, 14)),
    "Div": ("b_div", (7, 13, 14)),
    "Pow": ("b_pow", (7, 12, 13, 15)),
    "PRelu": ("b_prelu", (7, 9, 16)),
}
# variadic ops with numpy broadcasting: one launch per input after the first two, each
# accumulating into the output (it reads and writes its own element only)
VARIADIC = {"Max": ("b_max", (8, 12, 13)), "Min": ("b_min", (8, 12, 13)), "Sum": ("b_add", (8, 13)),
            "Mean": ("b_add", (8, 13))}
COMPARE = {
    "Equal": ("c_equal", (7, 11, 13, 19)),
    "Less": ("c_less", (7, 9, 13)),
    "Greater": ("c_greater", (7, 9, 13)),
    "LessOrEqual": ("c_less_equal", (12, 16)),
    "GreaterOrEqual": ("c_greater_equal", (12, 16)),
}


def _check_broadcast(node, n_inputs, dtypes, same=()):
    if len(node.inputs) != n_inputs:
        return f"{node.op_type} with {len(node.inputs)} inputs (the OpenCL kernel takes {n_inputs})"
    for i in range(n_inputs):
        if not present(node, i):
            return f"input {i} is missing"
        why = check_inputs(node, dtypes[i], [i], any_rank=True)
        if why:
            return why
    if len({np.dtype(node.input_info[i].dtype) for i in same}) > 1:
        return f"{node.op_type} inputs {list(same)} have different dtypes"
    if not is_static(node):
        return None  # checked again with the run's shapes
    shapes = [shape(node, i) for i in range(n_inputs)]
    try:
        bshape = np.broadcast_shapes(*shapes)
    except ValueError:
        return f"input shapes {shapes} do not broadcast"
    out = node.output_info[0]
    if out is not None and out.static_shape is not None and tuple(out.static_shape) != tuple(bshape):
        return f"inferred output shape {out.static_shape} differs from the broadcast shape {bshape}"
    return None


def _broadcast_step(node, ctx, kernel, n_inputs):
    out_shape = shape(node, 0, out=True)
    strides = [broadcast_strides(shape(node, i), out_shape) for i in range(n_inputs)]
    dims, strides = coalesce(out_shape, *strides)
    meta = ctx.upload(meta_array(dims, strides, 3))
    n = size_of(out_shape)
    g, ls = ctx.grid_1d(n)
    args = [In(i) for i in range(n_inputs)] + [Out(0), np.int32(n), np.int32(len(dims)), meta]
    k = ctx.kernel(FILE, kernel, node.input_info[n_inputs - 1].dtype)
    return ctx.step(node, [Launch(k, g, ls, args)], inputs=node.inputs[:n_inputs])


def broadcast_infer(node):
    return [tuple(np.broadcast_shapes(*[shape(node, i) for i in range(len(node.inputs))]))]


def _make_broadcast(kernel, n_inputs):
    def build(node, ctx):
        return _broadcast_step(node, ctx, kernel, n_inputs)
    return build


def _check_binary(node):
    return _check_broadcast(node, 2, (FLOAT_ONLY, FLOAT_ONLY), same=(0, 1))


for _op, (_kernel, _versions) in BINARY.items():
    op(_op, *_versions, check=_check_binary, infer=broadcast_infer)(_make_broadcast(_kernel, 2))
for _op, (_kernel, _versions) in COMPARE.items():
    op(_op, *_versions, check=_check_binary, out_dtypes=(BOOL,),
       infer=broadcast_infer)(_make_broadcast(_kernel, 2))
for _op, _kernel in (("And", "l_and"), ("Or", "l_or"), ("Xor", "l_xor")):
    op(_op, 7, check=lambda node: _check_broadcast(node, 2, ((BOOL,), (BOOL,))), out_dtypes=(BOOL,),
       infer=broadcast_infer)(_make_broadcast(_kernel, 2))


@op("Where", 9, 16, check=lambda node: _check_broadcast(node, 3, ((BOOL,), FLOAT_ONLY, FLOAT_ONLY),
                                                        same=(1, 2)),
    infer=broadcast_infer)
def _where(node, ctx):
    return _broadcast_step(node, ctx, "t_where", 3)


@op("Not", 1, check=lambda node: check_inputs(node, (BOOL,), [0], any_rank=True), out_dtypes=(BOOL,))
def _not(node, ctx):
    n = size_of(shape(node, 0))
    g, ls = ctx.grid_1d(n)
    return ctx.step(node, [Launch(ctx.kernel(FILE, "l_not"), g, ls, [In(0), Out(0), np.int32(n)])])


def _check_variadic(node):
    if not node.inputs or not all(node.inputs):
        return f"{node.op_type} with a missing input"
    why = check_inputs(node, FLOAT_ONLY, any_rank=True)
    if why:
        return why
    if len({np.dtype(vi.dtype) for vi in node.input_info}) > 1:
        return f"{node.op_type} inputs have different dtypes"
    if is_static(node):
        try:
            np.broadcast_shapes(*[shape(node, i) for i in range(len(node.inputs))])
        except ValueError:
            return f"{node.op_type} input shapes do not broadcast"
    return None


def _make_variadic(kernel, mean):
    def build(node, ctx):
        from ..registry import ViewStep

        n_in = len(node.inputs)
        out_shape = shape(node, 0, out=True)
        if n_in == 1:
            return ViewStep(node, node.inputs[0], node.outputs[0], out_shape)
        dt = node.input_info[0].dtype
        k = ctx.kernel(FILE, kernel, dt)
        n = size_of(out_shape)
        g, ls = ctx.grid_1d(n)
        launches = []
        for j in range(1, n_in):
            a = broadcast_strides(shape(node, 0), out_shape) if j == 1 else broadcast_strides(out_shape, out_shape)
            b = broadcast_strides(shape(node, j), out_shape)
            dims, strides = coalesce(out_shape, a, b)
            meta = ctx.upload(meta_array(dims, strides, 3))
            launches.append(Launch(k, g, ls, [In(0) if j == 1 else Out(0), In(j), Out(0), np.int32(n),
                                              np.int32(len(dims)), meta]))
        if mean:
            launches.append(Launch(ctx.kernel(FILE, "u_div_scalar", dt), g, ls,
                                   [Out(0), Out(0), np.int32(n), np.float32(n_in), np.float32(0)]))
        return ctx.step(node, launches, inputs=node.inputs)
    return build


for _op, (_kernel, _versions) in VARIADIC.items():
    op(_op, *_versions, check=_check_variadic, infer=broadcast_infer)(_make_variadic(_kernel, _op == "Mean"))


# -- Cast -----------------------------------------------------------------------------

CAST_IN = (F32, F16, BOOL, INT64, INT32)
CAST_OUT = (F32, F16, BOOL)


def _check_cast(node):
    return check_inputs(node, CAST_IN, [0], any_rank=True)


def _cast_kernel(src, dst):
    """(kernel name, dtype the program is built for)."""
    if src == BOOL:
        return ("cast_bool_real", dst) if dst != BOOL else ("copy", None)
    if src in (INT64, INT32):
        if dst == BOOL:  # a bool output is one byte: the *_real kernels would write four
            return ("cast_long_bool" if src == INT64 else "cast_int_bool"), None
        return ("cast_long_real" if src == INT64 else "cast_int_real"), dst
    # src is a float type
    return {F32: "cast_real_float", F16: "cast_real_half", BOOL: "cast_real_bool"}[dst], src


def _check_castlike(node):
    why = _check_cast(node)
    if why:
        return why
    vi = node.input_info[1] if len(node.input_info) > 1 else None
    if vi is None or vi.dtype is None:
        return "CastLike target_type has an unknown element type"
    return None


@op("CastLike", 15, 19, 21, 23, 24, 25, check=_check_castlike, out_dtypes=CAST_OUT,
    infer=lambda node: [shape(node, 0)])
def _castlike(node, ctx):
    return _cast(node, ctx)  # only input 1's dtype matters (it is the output's dtype)


@op("Cast", 6, 9, 13, 19, 21, 23, 24, 25, 28, check=_check_cast, out_dtypes=CAST_OUT)
def _cast(node, ctx):
    src = np.dtype(node.input_info[0].dtype)
    dst = np.dtype(node.output_info[0].dtype)
    n = size_of(shape(node, 0))
    g, ls = ctx.grid_1d(n)
    if src == dst:
        from ..registry import ViewStep

        # a copy, not a view: Cast to the same type is still a new value, but the buffers
        # are immutable, so sharing is exact
        return ViewStep(node, node.inputs[0], node.outputs[0], shape(node, 0))
    name, real = _cast_kernel(src, dst)
    k = ctx.kernel(FILE, name, real)
    return ctx.step(node, [Launch(k, g, ls, [In(0), Out(0), np.int32(n)])], inputs=node.inputs[:1])
