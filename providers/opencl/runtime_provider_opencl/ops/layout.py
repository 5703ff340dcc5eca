"""Layout ops: metadata-only views, Transpose, Concat, and Shape of a static tensor."""

from __future__ import annotations

import numpy as np

from ..registry import (BOOL, DATA, INT64, ConstStep, In, Launch, Out, ViewStep, check_inputs, op,
                        shape)
from ..shapes import coalesce, contiguous_strides, meta_array, normalize_axis, size_of
from ..tensor import OpenCLTensor

FILE = "copy.cl"


def _copy_kernel(ctx, dtype):
    return ctx.kernel(FILE, "copy_u8" if np.dtype(dtype) == BOOL else "copy_f32")


# -- views ----------------------------------------------------------------------------

def _check_view(node):
    why = check_inputs(node, DATA, [0])
    if why:
        return why
    out = node.output_info[0]
    if out is None or out.static_shape is None:
        return f"{node.op_type} output shape is not static"
    if size_of(out.static_shape) != size_of(shape(node, 0)):
        return f"{node.op_type} output {out.static_shape} has another size than its input {shape(node, 0)}"
    return None


def _view(node, ctx):
    return ViewStep(node, node.inputs[0], node.outputs[0], shape(node, 0, out=True))


# the output shape comes from shape inference (static by the check); the shape/axes
# inputs of these ops are therefore never read on the device
for _op, _versions in {
    "Reshape": (5, 13, 14, 19, 21, 23, 24, 25),
    "Flatten": (1, 9, 11, 13, 21, 23, 24, 25),
    "Squeeze": (1, 11, 13, 21, 23, 24, 25),
    "Unsqueeze": (1, 11, 13, 21, 23, 24, 25),
    "Identity": (1, 13, 14, 16, 19, 21, 23, 24, 25),
}.items():
    op(_op, *_versions, check=_check_view, out_dtypes=DATA)(_view)


# -- copies ---------------------------------------------------------------------------

def _perm(node):
    rank = len(shape(node, 0))
    perm = node.attrs.get("perm")
    return list(range(rank - 1, -1, -1)) if not perm else [int(p) for p in perm]


def _check_transpose(node):
    why = check_inputs(node, DATA, [0])
    if why:
        return why
    perm = _perm(node)
    if sorted(perm) != list(range(len(shape(node, 0)))):
        return f"Transpose perm {perm} is not a permutation of the input's axes"
    return None


@op("Transpose", 1, 13, 21, 23, 24, 25, check=_check_transpose, out_dtypes=DATA)
def _transpose(node, ctx):
    x = shape(node, 0)
    perm = _perm(node)
    out = [x[p] for p in perm]
    xs = contiguous_strides(x)
    dims, (sx, sy) = coalesce(out, [xs[p] for p in perm], contiguous_strides(out))
    n = size_of(out)
    g, ls = ctx.grid_1d(n)
    meta = ctx.upload(meta_array(dims, [sx, sy], 2))
    args = [In(0), Out(0), np.int32(n), np.int32(len(dims)), meta, np.int32(0), np.int32(0)]
    kernel = _copy_kernel(ctx, node.input_info[0].dtype)
    return ctx.step(node, [Launch(kernel, g, ls, args)], inputs=node.inputs[:1])


def _check_concat(node):
    why = check_inputs(node, DATA)
    if why:
        return why
    dtypes = {np.dtype(vi.dtype) for vi in node.input_info}
    if len(dtypes) != 1:
        return f"Concat inputs have several dtypes {sorted(d.name for d in dtypes)}"
    shapes = [shape(node, i) for i in range(len(node.inputs))]
    rank = len(shapes[0])
    try:
        axis = normalize_axis(int(node.attrs["axis"]), rank)
    except ValueError as exc:
        return f"Concat: {exc}"
    for s in shapes:
        if len(s) != rank or any(s[d] != shapes[0][d] for d in range(rank) if d != axis):
            return f"Concat input shapes {shapes} differ outside axis {axis}"
    return None


@op("Concat", 4, 11, 13, check=_check_concat, out_dtypes=DATA)
def _concat(node, ctx):
    out = shape(node, 0, out=True)
    axis = normalize_axis(int(node.attrs["axis"]), len(out))
    ys = contiguous_strides(out)
    kernel = _copy_kernel(ctx, node.input_info[0].dtype)
    launches, offset = [], 0
    for i in range(len(node.inputs)):
        s = shape(node, i)
        dims, (sx, sy) = coalesce(s, contiguous_strides(s), ys)
        n = size_of(s)
        g, ls = ctx.grid_1d(n)
        meta = ctx.upload(meta_array(dims, [sx, sy], 2))
        args = [In(i), Out(0), np.int32(n), np.int32(len(dims)), meta, np.int32(0),
                np.int32(offset * ys[axis])]
        launches.append(Launch(kernel, g, ls, args))
        offset += s[axis]
    return ctx.step(node, launches, inputs=node.inputs)


# -- Shape ----------------------------------------------------------------------------

def _check_shape(node):
    vi = node.input_info[0]
    if vi is None or vi.kind != "tensor" or vi.static_shape is None:
        return "Shape of a tensor whose shape is not static stays on CPU"
    return None


def _shape_value(node):
    dims = list(shape(node, 0))
    if node.since_version >= 15:
        rank = len(dims)
        start = node.attrs.get("start") or 0
        end = node.attrs.get("end")
        start = min(max(start + rank if start < 0 else start, 0), rank)
        end = rank if end is None else min(max(end + rank if end < 0 else end, 0), rank)
        dims = dims[start:end]
    return np.asarray(dims, dtype=np.int64)


@op("Shape", 1, 13, 15, 19, 21, 23, 24, 25, check=_check_shape, out_dtypes=(INT64,))
def _shape(node, ctx):
    value = _shape_value(node)
    return ConstStep(node, node.outputs[0], OpenCLTensor.from_numpy(value, ctx.dev))
