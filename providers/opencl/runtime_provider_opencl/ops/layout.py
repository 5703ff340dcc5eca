"""Layout ops: metadata-only views, Transpose, Concat, Slice, Expand, Gather, and Shape.

Reshape/Flatten/Squeeze/Unsqueeze/Identity are views (no copy). Their shape or axes
inputs are read on the host as values (see ``value_inputs`` in the registry): constants,
or small int64 tensors computed by a CPU partition (read at specialization time).
"""

from __future__ import annotations

import numpy as np

from ..registry import (DATA, FLOAT_ONLY, INDEX, INT64, ConstStep, In, KernelStep, Launch, Out, ViewStep,
                        check_inputs,
                        host_value, is_static, op, present, rank, shape)
from ..shapes import (broadcast_strides, coalesce, contiguous_strides, int32_array, meta_array, normalize_axis,
                      size_of)
from ..tensor import OpenCLTensor

FILE = "copy.cl"
COPY = {4: "copy_f32", 2: "copy_u16", 1: "copy_u8"}


def _copy_kernel(ctx, dtype):
    return ctx.kernel(FILE, COPY[np.dtype(dtype).itemsize])


def _copy_step(node, ctx, out_shape, src_strides, xbase=0):
    """One strided-copy launch of input 0 into output 0 (``src_strides`` per output dim)."""
    dims, (sx, sy) = coalesce(out_shape, src_strides, contiguous_strides(out_shape))
    n = size_of(out_shape)
    g, ls = ctx.grid_1d(n)
    meta = ctx.upload(meta_array(dims, [sx, sy], 2))
    args = [In(0), Out(0), np.int32(n), np.int32(len(dims)), meta, np.int32(xbase), np.int32(0)]
    return ctx.step(node, [Launch(_copy_kernel(ctx, node.input_info[0].dtype), g, ls, args)],
                    inputs=node.inputs[:1])


def _value_input_reason(node, i, what, required=True):
    """Why the value input ``i`` cannot be used (it must be an int64 tensor), or None."""
    if not present(node, i):
        return f"{node.op_type} {what} is missing" if required else None
    vi = node.input_info[i]
    if vi is None or vi.dtype is None or np.dtype(vi.dtype) != INT64:
        return f"{node.op_type} {what} is not an int64 tensor"
    if vi.shape is not None and len(vi.shape) != 1 and not (len(vi.shape) == 0 and what == "axes"):
        return f"{node.op_type} {what} is not 1-D"
    return None


# -- views ----------------------------------------------------------------------------

def _check_view(node):
    why = check_inputs(node, DATA, [0], any_rank=node.op_type in ("Identity", "Reshape"))
    if why:
        return why
    vals = REG_VALUES.get(node.op_type, lambda n: ())(node)
    for i in vals:
        why = _value_input_reason(node, i, "shape" if node.op_type == "Reshape" else "axes",
                                  required=node.op_type == "Reshape")
        if why:
            return why
    if is_static(node) and all(host_value(node, i) is not None for i in vals):
        try:
            out = VIEW_INFER[node.op_type](node)[0]
        except Exception as exc:  # noqa: BLE001
            return f"{node.op_type}: {exc}"
        if size_of(out) != size_of(shape(node, 0)):
            return f"{node.op_type} output {out} has another size than its input {shape(node, 0)}"
        o = node.output_info[0]
        if o is not None and o.static_shape is not None and tuple(o.static_shape) != tuple(out):
            return f"{node.op_type} inferred output {o.static_shape} differs from the computed {out}"
    return None


def _view(node, ctx):
    return ViewStep(node, node.inputs[0], node.outputs[0], shape(node, 0, out=True))


def _reshape_infer(node):
    x = shape(node, 0)
    target = [int(v) for v in host_value(node, 1).reshape(-1)]
    allowzero = int(node.attrs.get("allowzero", 0) or 0)
    out = []
    for i, d in enumerate(target):
        if d == 0 and not allowzero:
            if i >= len(x):
                raise ValueError(f"Reshape 0 at position {i} beyond the input rank {len(x)}")
            out.append(x[i])
        else:
            out.append(d)
    if out.count(-1) > 1:
        raise ValueError(f"Reshape target {target} has several -1")
    if -1 in out:
        known = size_of([d for d in out if d != -1])
        total = size_of(x)
        if known == 0 or total % known:
            raise ValueError(f"cannot reshape {x} to {target}")
        out[out.index(-1)] = total // known
    if any(d < 0 for d in out) or size_of(out) != size_of(x):
        raise ValueError(f"cannot reshape {x} to {target}")
    return [tuple(out)]


def _flatten_infer(node):
    x = shape(node, 0)
    axis = int(node.attrs["axis"])
    axis = axis + len(x) if axis < 0 else axis
    return [(size_of(x[:axis]), size_of(x[axis:]))]


def _axes(node):
    if node.since_version >= 13:
        v = host_value(node, 1)
        return None if v is None else [int(a) for a in v.reshape(-1)]
    axes = node.attrs.get("axes")
    return None if axes is None else [int(a) for a in axes]


def _squeeze_infer(node):
    x = shape(node, 0)
    axes = _axes(node)
    if not axes:
        return [tuple(d for d in x if d != 1)]
    axes = {normalize_axis(a, len(x)) for a in axes}
    for a in axes:
        if x[a] != 1:
            raise ValueError(f"Squeeze axis {a} has size {x[a]}")
    return [tuple(d for i, d in enumerate(x) if i not in axes)]


def _unsqueeze_infer(node):
    x = list(shape(node, 0))
    axes = _axes(node)
    r = len(x) + len(axes)
    axes = sorted(normalize_axis(a, r) for a in axes)
    if len(set(axes)) != len(axes):
        raise ValueError(f"Unsqueeze axes {axes} repeat")
    out = list(x)
    for a in axes:
        out.insert(a, 1)
    return [tuple(out)]


def _identity_infer(node):
    return [shape(node, 0)]


VIEW_INFER = {"Reshape": _reshape_infer, "Flatten": _flatten_infer, "Squeeze": _squeeze_infer,
              "Unsqueeze": _unsqueeze_infer, "Identity": _identity_infer}
REG_VALUES = {"Reshape": lambda n: (1,),
              "Squeeze": lambda n: (1,) if n.since_version >= 13 else (),
              "Unsqueeze": lambda n: (1,) if n.since_version >= 13 else ()}

for _op, _versions in {
    "Reshape": (5, 13, 14, 19, 21, 23, 24, 25),
    "Flatten": (1, 9, 11, 13, 21, 23, 24, 25),
    "Squeeze": (1, 11, 13, 21, 23, 24, 25),
    "Unsqueeze": (1, 11, 13, 21, 23, 24, 25),
    "Identity": (1, 13, 14, 16, 19, 21, 23, 24, 25),
}.items():
    op(_op, *_versions, check=_check_view, out_dtypes=DATA, infer=VIEW_INFER[_op],
       value_inputs=REG_VALUES.get(_op, ()))(_view)


# -- copies ---------------------------------------------------------------------------

def _perm(node):
    r = rank(node, 0)
    perm = node.attrs.get("perm")
    return list(range(r - 1, -1, -1)) if not perm else [int(p) for p in perm]


def _check_transpose(node):
    why = check_inputs(node, DATA, [0])
    if why:
        return why
    perm = _perm(node)
    if sorted(perm) != list(range(rank(node, 0))):
        return f"Transpose perm {perm} is not a permutation of the input's axes"
    return None


def _transpose_infer(node):
    x = shape(node, 0)
    return [tuple(x[p] for p in _perm(node))]


@op("Transpose", 1, 13, 21, 23, 24, 25, check=_check_transpose, out_dtypes=DATA, infer=_transpose_infer)
def _transpose(node, ctx):
    x = shape(node, 0)
    perm = _perm(node)
    out = [x[p] for p in perm]
    xs = contiguous_strides(x)
    return _copy_step(node, ctx, out, [xs[p] for p in perm])


def _check_concat(node):
    why = check_inputs(node, DATA)
    if why:
        return why
    dtypes = {np.dtype(vi.dtype) for vi in node.input_info}
    if len(dtypes) != 1:
        return f"Concat inputs have several dtypes {sorted(d.name for d in dtypes)}"
    ranks = {rank(node, i) for i in range(len(node.inputs))}
    if len(ranks) != 1:
        return f"Concat inputs have different ranks {sorted(ranks)}"
    r = ranks.pop()
    try:
        axis = normalize_axis(int(node.attrs["axis"]), r)
    except ValueError as exc:
        return f"Concat: {exc}"
    if not is_static(node):
        return None
    shapes = [shape(node, i) for i in range(len(node.inputs))]
    for s in shapes:
        if any(s[d] != shapes[0][d] for d in range(r) if d != axis):
            return f"Concat input shapes {shapes} differ outside axis {axis}"
    return None


def _concat_infer(node):
    shapes = [shape(node, i) for i in range(len(node.inputs))]
    axis = normalize_axis(int(node.attrs["axis"]), len(shapes[0]))
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    return [tuple(out)]


@op("Concat", 4, 11, 13, check=_check_concat, out_dtypes=DATA, infer=_concat_infer)
def _concat(node, ctx):
    out = shape(node, 0, out=True)
    axis = normalize_axis(int(node.attrs["axis"]), len(out))
    ys = contiguous_strides(out)
    kernel = _copy_kernel(ctx, node.input_info[0].dtype)
    launches, offset = [], 0
    for i in range(len(node.inputs)):
        s = shape(node, i)
        n = size_of(s)
        if n:
            dims, (sx, sy) = coalesce(s, contiguous_strides(s), ys)
            g, ls = ctx.grid_1d(n)
            meta = ctx.upload(meta_array(dims, [sx, sy], 2))
            args = [In(i), Out(0), np.int32(n), np.int32(len(dims)), meta, np.int32(0),
                    np.int32(offset * ys[axis])]
            launches.append(Launch(kernel, g, ls, args))
        offset += s[axis]
    return ctx.step(node, launches, inputs=node.inputs)


# -- Slice ----------------------------------------------------------------------------

def _slice_params(node):
    """[(start, stop, step) per axis of the input] as Python slice indices."""
    x = shape(node, 0)
    if node.since_version >= 10:
        starts = host_value(node, 1).reshape(-1).tolist()
        ends = host_value(node, 2).reshape(-1).tolist()
        axes = host_value(node, 3)
        axes = list(range(len(starts))) if axes is None else axes.reshape(-1).tolist()
        steps = host_value(node, 4)
        steps = [1] * len(starts) if steps is None else steps.reshape(-1).tolist()
    else:
        starts, ends = list(node.attrs["starts"]), list(node.attrs["ends"])
        axes = node.attrs.get("axes")
        axes = list(range(len(starts))) if not axes else list(axes)
        steps = [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ValueError("Slice starts, ends, axes and steps differ in length")
    sl = [(0, d, 1) for d in x]
    seen = set()
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = normalize_axis(int(a), len(x))
        if a in seen:
            raise ValueError(f"Slice axis {a} repeats")
        seen.add(a)
        if st == 0:
            raise ValueError("Slice step 0")
        sl[a] = slice(int(s), int(e), int(st)).indices(x[a])
    return sl


def _check_slice(node):
    why = check_inputs(node, DATA, [0])
    if why:
        return why
    if node.since_version >= 10:
        for i, what in ((1, "starts"), (2, "ends"), (3, "axes"), (4, "steps")):
            why = _value_input_reason(node, i, what, required=i < 3)
            if why:
                return why
    if is_static(node) and (node.since_version < 10 or all(
            host_value(node, i) is not None for i in range(1, len(node.inputs)) if present(node, i))):
        try:
            _slice_params(node)
        except Exception as exc:  # noqa: BLE001
            return f"Slice: {exc}"
    return None


def _slice_infer(node):
    return [tuple(len(range(*p)) for p in _slice_params(node))]


@op("Slice", 1, 10, 11, 13, check=_check_slice, out_dtypes=DATA, infer=_slice_infer,
    value_inputs=lambda n: (1, 2, 3, 4) if n.since_version >= 10 else ())
def _slice(node, ctx):
    x = shape(node, 0)
    xs = contiguous_strides(x)
    params = _slice_params(node)
    out = [len(range(*p)) for p in params]
    base = sum(p[0] * s for p, s in zip(params, xs))
    return _copy_step(node, ctx, out, [p[2] * s for p, s in zip(params, xs)], xbase=base)


# -- Expand ---------------------------------------------------------------------------

def _check_expand(node):
    why = check_inputs(node, DATA, [0]) or _value_input_reason(node, 1, "shape")
    if why:
        return why
    if is_static(node) and host_value(node, 1) is not None:
        try:
            _expand_infer(node)
        except ValueError as exc:
            return f"Expand: {exc}"
    return None


def _expand_infer(node):
    target = tuple(int(v) for v in host_value(node, 1).reshape(-1))
    return [tuple(np.broadcast_shapes(shape(node, 0), target))]


@op("Expand", 8, 13, check=_check_expand, out_dtypes=DATA, infer=_expand_infer, value_inputs=(1,))
def _expand(node, ctx):
    out = shape(node, 0, out=True)
    return _copy_step(node, ctx, out, broadcast_strides(shape(node, 0), out))


# -- Gather ---------------------------------------------------------------------------

GATHER = {4: "u32", 2: "u16", 1: "u8"}


def _check_gather(node):
    why = check_inputs(node, DATA, [0]) or check_inputs(node, INDEX, [1])
    if why:
        return why
    try:
        axis = normalize_axis(int(node.attrs["axis"]), rank(node, 0))
    except ValueError as exc:
        return f"Gather: {exc}"
    idx = host_value(node, 1)
    if idx is not None and node.input_info[0].static_shape is not None:
        L = shape(node, 0)[axis]
        if idx.size and (idx.min() < -L or idx.max() >= L):
            return f"Gather indices out of range for an axis of size {L}"
    return None


def _gather_infer(node):
    x = shape(node, 0)
    axis = normalize_axis(int(node.attrs["axis"]), len(x))
    return [tuple(x[:axis]) + tuple(shape(node, 1)) + tuple(x[axis + 1:])]


@op("Gather", 1, 11, 13, check=_check_gather, out_dtypes=DATA, infer=_gather_infer)
def _gather(node, ctx):
    x = shape(node, 0)
    axis = normalize_axis(int(node.attrs["axis"]), len(x))
    n = size_of(shape(node, 0, out=True))
    n_idx = size_of(shape(node, 1))
    it = np.dtype(node.input_info[1].dtype)
    name = f"gather_{GATHER[np.dtype(node.input_info[0].dtype).itemsize]}_{'i64' if it == INT64 else 'i32'}"
    g, ls = ctx.grid_1d(n)
    args = [In(0), In(1), Out(0), np.int32(n), np.int32(x[axis]), np.int32(size_of(x[axis + 1:])),
            np.int32(n_idx)]
    step = ctx.step(node, [Launch(ctx.kernel("index.cl", name), g, ls, args)], inputs=node.inputs[:2])
    return GatherStep(step.node, step.inputs, step.outputs, step.out_specs, step.launches, x[axis])


class GatherStep(KernelStep):
    """Gather whose indices are checked on the host when their value is there (a constant
    or a fed tensor with its upload mirror, e.g. token ids): an out-of-range index raises
    IndexError as on the CPU provider. Indices computed on the device are clamped."""

    def __init__(self, node, inputs, outputs, out_specs, launches, length):
        super().__init__(node, inputs, outputs, out_specs, launches)
        self.length = length

    def run(self, env, dev):
        idx = env[self.inputs[1]].host
        if idx is not None and idx.size and (idx.min() < -self.length or idx.max() >= self.length):
            bad = idx[(idx < -self.length) | (idx >= self.length)].reshape(-1)[0]
            raise IndexError(f"Gather index {int(bad)} is out of bounds for an axis of size {self.length}")
        super().run(env, dev)


# -- Shape ----------------------------------------------------------------------------

def _check_shape(node):
    vi = node.input_info[0]
    if vi is None or vi.kind != "tensor":
        return "Shape of a value that is not a tensor"
    return None


def _shape_value(node):
    dims = list(shape(node, 0))
    if node.since_version >= 15:
        r = len(dims)
        start = node.attrs.get("start") or 0
        end = node.attrs.get("end")
        start = min(max(start + r if start < 0 else start, 0), r)
        end = r if end is None else min(max(end + r if end < 0 else end, 0), r)
        dims = dims[start:end]
    return np.asarray(dims, dtype=np.int64)


@op("Shape", 1, 13, 15, 19, 21, 23, 24, 25, check=_check_shape, out_dtypes=(INT64,),
    infer=lambda node: [_shape_value(node).shape])
def _shape(node, ctx):
    value = _shape_value(node)
    return ConstStep(node, node.outputs[0], OpenCLTensor.from_numpy(value, ctx.dev, mirror=True), value)


# -- Split ----------------------------------------------------------------------------

def _split_sizes(node):
    x = shape(node, 0)
    axis = normalize_axis(int(node.attrs["axis"]), len(x))
    n_out = len(node.outputs)
    if node.since_version >= 13 and present(node, 1):
        sizes = [int(v) for v in host_value(node, 1).reshape(-1)]
    elif node.since_version < 13 and node.attrs.get("split"):
        sizes = [int(v) for v in node.attrs["split"]]
    else:
        L = x[axis]
        if node.since_version >= 18:
            n_out = int(node.attrs["num_outputs"])
            chunk = -(-L // n_out)
            sizes = [min(chunk, max(0, L - i * chunk)) for i in range(n_out)]
        else:
            if L % n_out:
                raise ValueError(f"Split of {L} into {n_out} equal parts")
            sizes = [L // n_out] * n_out
    if len(sizes) != len(node.outputs) or sum(sizes) != x[axis] or min(sizes) < 0:
        raise ValueError(f"Split sizes {sizes} do not fit axis {axis} of {x} and {len(node.outputs)} outputs")
    return axis, sizes


def _check_split(node):
    why = check_inputs(node, DATA, [0])
    if why:
        return why
    if node.since_version >= 13:
        why = _value_input_reason(node, 1, "split", required=False)
        if why:
            return why
    try:
        normalize_axis(int(node.attrs["axis"]), rank(node, 0))
    except ValueError as exc:
        return f"Split: {exc}"
    if node.since_version >= 18 and int(node.attrs.get("num_outputs") or 0) not in (0, len(node.outputs)) \
            and not present(node, 1):
        return "Split num_outputs differs from the number of outputs"
    if is_static(node) and (node.since_version < 13 or not present(node, 1) or host_value(node, 1) is not None):
        try:
            _split_sizes(node)
        except ValueError as exc:
            return f"Split: {exc}"
    return None


def _split_infer(node):
    x = shape(node, 0)
    axis, sizes = _split_sizes(node)
    return [tuple(s if d == axis else x[d] for d in range(len(x))) for s in sizes]


@op("Split", 2, 11, 13, 18, check=_check_split, out_dtypes=DATA, infer=_split_infer,
    value_inputs=lambda n: (1,) if n.since_version >= 13 else ())
def _split(node, ctx):
    x = shape(node, 0)
    axis, sizes = _split_sizes(node)
    xs = contiguous_strides(x)
    kernel = _copy_kernel(ctx, node.input_info[0].dtype)
    launches, offset = [], 0
    for i, s in enumerate(sizes):
        out = [s if d == axis else x[d] for d in range(len(x))]
        n = size_of(out)
        if n and node.outputs[i]:
            dims, (sx, sy) = coalesce(out, xs, contiguous_strides(out))
            g, ls = ctx.grid_1d(n)
            meta = ctx.upload(meta_array(dims, [sx, sy], 2))
            args = [In(0), Out(i), np.int32(n), np.int32(len(dims)), meta, np.int32(offset * xs[axis]),
                    np.int32(0)]
            launches.append(Launch(kernel, g, ls, args))
        offset += s
    return ctx.step(node, launches, inputs=node.inputs[:1])


# -- ConstantOfShape ------------------------------------------------------------------

def _cos_value(node):
    v = node.attrs.get("value")
    return np.zeros(1, np.float32) if v is None else np.asarray(v).reshape(-1)


def _check_constant_of_shape(node):
    why = _value_input_reason(node, 0, "shape")
    if why:
        return why
    if _cos_value(node).size != 1:
        return "ConstantOfShape value is not a one-element tensor"
    return None


@op("ConstantOfShape", 9, 20, 21, 23, 24, 25, check=_check_constant_of_shape, out_dtypes=DATA,
    infer=lambda node: [tuple(int(d) for d in host_value(node, 0).reshape(-1))], value_inputs=(0,))
def _constant_of_shape(node, ctx):
    out = node.output_info[0]
    value = np.full(tuple(out.shape), _cos_value(node)[0], dtype=np.dtype(out.dtype))
    # known once the partition is specialized: uploaded once per specialization
    return ConstStep(node, node.outputs[0], OpenCLTensor.from_numpy(value, ctx.dev))


# -- Dropout (inference) --------------------------------------------------------------

def _check_dropout(node):
    why = check_inputs(node, DATA, [0], any_rank=True)
    if why:
        return why
    if len(node.outputs) > 1 and node.outputs[1]:
        return "Dropout mask output is not implemented"
    if node.since_version >= 12 and present(node, 2):
        tm = host_value(node, 2)
        if tm is None or node.input_info[2].const is None:
            return "Dropout training_mode is not a constant (it decides whether the op is random)"
        if bool(np.asarray(tm).reshape(-1)[0]):
            return "Dropout in training mode (random) stays on CPU"
    return None


@op("Dropout", 7, 10, 12, 13, 22, check=_check_dropout, out_dtypes=DATA,
    infer=lambda node: [shape(node, 0)] * len(node.outputs))
def _dropout(node, ctx):
    return ViewStep(node, node.inputs[0], node.outputs[0], shape(node, 0))


# -- Pad ------------------------------------------------------------------------------

PAD_MODES = {"constant": 0, "reflect": 1, "edge": 2, "wrap": 3}


def _pad_params(node):
    """(per-dim (begin, end) pads, constant value) for a node with static input."""
    x = shape(node, 0)
    r = len(x)
    if node.since_version < 11:
        pads = list(node.attrs["pads"] if node.since_version >= 2 else node.attrs["paddings"])
        value = float(node.attrs.get("value") or 0.0)
        axes = list(range(r))
    else:
        pads = [int(v) for v in host_value(node, 1).reshape(-1)]
        cv = host_value(node, 2)
        value = 0.0 if cv is None or cv.size == 0 else float(cv.reshape(-1)[0])
        ax = host_value(node, 3)
        axes = list(range(r)) if ax is None else [normalize_axis(int(a), r) for a in ax.reshape(-1)]
    if len(pads) != 2 * len(axes):
        raise ValueError(f"Pad pads {pads} do not have 2 x {len(axes)} values")
    width = [(0, 0)] * r
    for i, a in enumerate(axes):
        width[a] = (int(pads[i]), int(pads[i + len(axes)]))
    return width, value


def _check_pad(node):
    why = check_inputs(node, FLOAT_ONLY, [0])
    if why:
        return why
    mode = node.attrs.get("mode") or "constant"
    if mode not in PAD_MODES:
        return f"Pad mode {mode!r} is not implemented"
    if node.since_version >= 11:
        why = _value_input_reason(node, 1, "pads") or _value_input_reason(node, 3, "axes", required=False)
        if why:
            return why
        if present(node, 2):
            vi = node.input_info[2]
            if vi is None or vi.const is None:
                return "Pad constant_value is not a constant initializer (it is read at compile time)"
    if is_static(node) and (node.since_version < 11 or host_value(node, 1) is not None):
        try:
            width, _ = _pad_params(node)
        except Exception as exc:  # noqa: BLE001
            return f"Pad: {exc}"
        x = shape(node, 0)
        for d, (b, e) in enumerate(width):
            if x[d] + min(b, 0) + min(e, 0) <= 0:
                return f"Pad crops axis {d} of {x} to nothing"
    return None


def _pad_infer(node):
    width, _ = _pad_params(node)
    return [tuple(d + b + e for d, (b, e) in zip(shape(node, 0), width))]


@op("Pad", 2, 11, 13, 18, 19, 21, 23, 24, 25, check=_check_pad, infer=_pad_infer,
    value_inputs=lambda n: (1, 3) if n.since_version >= 11 else ())
def _pad(node, ctx):
    x = shape(node, 0)
    width, value = _pad_params(node)
    xs = contiguous_strides(x)
    out = [d + b + e for d, (b, e) in zip(x, width)]
    ieff = [d + min(b, 0) + min(e, 0) for d, (b, e) in zip(x, width)]
    begin = [max(b, 0) for b, _ in width]
    xbase = sum(max(-b, 0) * s for (b, _), s in zip(width, xs))
    n = size_of(out)
    g, ls = ctx.grid_1d(n)
    meta = ctx.upload(int32_array(out + ieff + begin + xs))
    mode = PAD_MODES[node.attrs.get("mode") or "constant"]
    args = [In(0), Out(0), np.int32(n), np.int32(len(x)), meta, np.int32(xbase), np.int32(mode),
            np.float32(value)]
    k = ctx.kernel(FILE, "pad", node.input_info[0].dtype)
    return ctx.step(node, [Launch(k, g, ls, args)], inputs=node.inputs[:1])


# -- Trilu ----------------------------------------------------------------------------

def _check_trilu(node):
    why = check_inputs(node, DATA, [0])
    if why:
        return why
    if rank(node, 0) < 2:
        return "Trilu of an input of rank < 2"
    if present(node, 1):
        vi = node.input_info[1]
        if vi is None or vi.dtype is None or np.dtype(vi.dtype) != INT64:
            return "Trilu k is not an int64 tensor"
    return None


@op("Trilu", 14, check=_check_trilu, out_dtypes=DATA, value_inputs=(1,))
def _trilu(node, ctx):
    x = shape(node, 0)
    kv = host_value(node, 1)
    k = 0 if kv is None else int(kv.reshape(-1)[0])
    k = max(min(k, 2**30), -(2**30))
    n = size_of(x)
    g, ls = ctx.grid_1d(n)
    name = {4: "trilu_u32", 2: "trilu_u16", 1: "trilu_u8"}[np.dtype(node.input_info[0].dtype).itemsize]
    args = [In(0), Out(0), np.int32(n), np.int32(x[-2]), np.int32(x[-1]), np.int32(k),
            np.int32(int(node.attrs["upper"]))]
    return ctx.step(node, [Launch(ctx.kernel(FILE, name), g, ls, args)], inputs=node.inputs[:1])


# -- GatherElements -------------------------------------------------------------------

def _check_gather_elements(node):
    why = check_inputs(node, DATA, [0]) or check_inputs(node, INDEX, [1])
    if why:
        return why
    if rank(node, 0) != rank(node, 1) or rank(node, 0) == 0:
        return "GatherElements data and indices ranks differ (or are 0)"
    try:
        axis = normalize_axis(int(node.attrs["axis"]), rank(node, 0))
    except ValueError as exc:
        return f"GatherElements: {exc}"
    if is_static(node):
        x, i = shape(node, 0), shape(node, 1)
        if any(i[d] > x[d] for d in range(len(x)) if d != axis):
            return f"GatherElements indices {i} exceed data {x} outside the axis"
        idx = host_value(node, 1)
        if idx is not None and idx.size and (idx.min() < -x[axis] or idx.max() >= x[axis]):
            return f"GatherElements indices out of range for an axis of size {x[axis]}"
    return None


@op("GatherElements", 11, 13, check=_check_gather_elements, out_dtypes=DATA,
    infer=lambda node: [shape(node, 1)])
def _gather_elements(node, ctx):
    x, i = shape(node, 0), shape(node, 1)
    axis = normalize_axis(int(node.attrs["axis"]), len(x))
    n = size_of(i)
    it = np.dtype(node.input_info[1].dtype)
    name = (f"gather_el_{GATHER[np.dtype(node.input_info[0].dtype).itemsize]}_"
            f"{'i64' if it == INT64 else 'i32'}")
    meta = ctx.upload(int32_array(list(i) + contiguous_strides(x)))
    g, ls = ctx.grid_1d(n)
    args = [In(0), In(1), Out(0), np.int32(n), np.int32(len(x)), np.int32(axis), np.int32(x[axis]), meta]
    step = ctx.step(node, [Launch(ctx.kernel("index.cl", name), g, ls, args)], inputs=node.inputs[:2])
    return GatherStep(step.node, step.inputs, step.outputs, step.out_specs, step.launches, x[axis])
