"""Elementwise ops: unary activations, broadcasting arithmetic, comparisons, Where."""

from __future__ import annotations

import numpy as np

from ..registry import BOOL, F32, FLOAT_ONLY, In, Launch, Out, check_inputs, op, present, shape
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
}


def _check_unary(node):
    return check_inputs(node, FLOAT_ONLY, [0])


def _unary_launch(ctx, node, kernel: str, p0: float = 0.0, p1: float = 0.0):
    n = size_of(shape(node, 0))
    g, ls = ctx.grid_1d(n)
    args = [In(0), Out(0), np.int32(n), np.float32(p0), np.float32(p1)]
    return ctx.step(node, [Launch(ctx.kernel(FILE, kernel), g, ls, args)], inputs=[node.inputs[0]])


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
            if np.asarray(vi.const).size != 1 or np.asarray(vi.const).dtype != F32:
                return f"Clip {what} must be a float32 scalar"
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
}
COMPARE = {
    "Equal": ("c_equal", (7, 11, 13, 19)),
    "Less": ("c_less", (7, 9, 13)),
    "Greater": ("c_greater", (7, 9, 13)),
    "LessOrEqual": ("c_less_equal", (12, 16)),
    "GreaterOrEqual": ("c_greater_equal", (12, 16)),
}


def _check_broadcast(node, n_inputs, dtypes):
    for i in range(n_inputs):
        if not present(node, i):
            return f"input {i} is missing"
        why = check_inputs(node, (dtypes[i],), [i])
        if why:
            return why
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
    return ctx.step(node, [Launch(ctx.kernel(FILE, kernel), g, ls, args)],
                    inputs=node.inputs[:n_inputs])


def _make_broadcast(kernel, n_inputs):
    def build(node, ctx):
        return _broadcast_step(node, ctx, kernel, n_inputs)
    return build


def _check_binary(node):
    return _check_broadcast(node, 2, (F32, F32))


for _op, (_kernel, _versions) in BINARY.items():
    op(_op, *_versions, check=_check_binary)(_make_broadcast(_kernel, 2))
for _op, (_kernel, _versions) in COMPARE.items():
    op(_op, *_versions, check=_check_binary, out_dtypes=(BOOL,))(_make_broadcast(_kernel, 2))


@op("Where", 9, 16, check=lambda node: _check_broadcast(node, 3, (BOOL, F32, F32)))
def _where(node, ctx):
    return _broadcast_step(node, ctx, "t_where", 3)
