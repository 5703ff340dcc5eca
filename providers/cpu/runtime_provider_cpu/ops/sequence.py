"""CPU kernels: sequences and optionals.

A sequence value is a Python ``list`` of arrays (kernels return new lists, never
mutate an input), an optional value is its element or ``None`` when empty.
"""

from __future__ import annotations

import numpy as np

from ..registry import kernel
from .control import check_bodies


def _position(pos, n: int, *, insert: bool) -> int:
    p = int(np.asarray(pos).reshape(-1)[0])
    hi = n if insert else n - 1
    if not -n <= p <= hi:
        raise ValueError(f"position {p} is out of range [{-n}, {hi}] for a sequence of {n} tensors")
    return p + n if p < 0 else p


def _seq(x, what="input_sequence") -> list:
    if not isinstance(x, list):
        raise TypeError(f"{what} must be a sequence, got {type(x).__name__}")
    return x


@kernel("SequenceEmpty", 11)
def sequence_empty(ctx, *, dtype=None):
    return []


@kernel("SequenceConstruct", 11)
def sequence_construct(ctx, *inputs):
    dts = {np.asarray(x).dtype for x in inputs}
    if len(dts) > 1:
        raise TypeError(f"SequenceConstruct inputs must share one element type, got {sorted(map(str, dts))}")
    return list(inputs)


@kernel("SequenceInsert", 11)
def sequence_insert(ctx, seq, tensor, position=None):
    seq = _seq(seq)
    if seq and np.asarray(seq[0]).dtype != np.asarray(tensor).dtype:
        raise TypeError(f"inserting a {np.asarray(tensor).dtype} tensor into a sequence of "
                        f"{np.asarray(seq[0]).dtype}")
    out = list(seq)
    if position is None:
        out.append(tensor)
    else:
        out.insert(_position(position, len(seq), insert=True), tensor)
    return out


@kernel("SequenceAt", 11)
def sequence_at(ctx, seq, position):
    seq = _seq(seq)
    return seq[_position(position, len(seq), insert=False)]


@kernel("SequenceErase", 11)
def sequence_erase(ctx, seq, position=None):
    seq = _seq(seq)
    out = list(seq)
    if position is None:
        if not out:
            raise ValueError("SequenceErase on an empty sequence")
        out.pop()
    else:
        del out[_position(position, len(seq), insert=False)]
    return out


@kernel("SequenceLength", 11)
def sequence_length(ctx, seq):
    return np.array(len(_seq(seq)), dtype=np.int64)


@kernel("SplitToSequence", 11, 24)  # 24 widens the types
def split_to_sequence(ctx, x, split=None, *, axis, keepdims):
    x = np.asarray(x)
    ax = axis + x.ndim if axis < 0 else axis
    if not 0 <= ax < x.ndim:
        raise ValueError(f"axis {axis} is out of range for rank {x.ndim}")
    n = x.shape[ax]
    if split is None:
        parts = np.split(x, n, axis=ax) if n else []
        if not keepdims:
            parts = [np.squeeze(p, axis=ax) for p in parts]
        return [np.ascontiguousarray(p) for p in parts]
    s = np.asarray(split)
    if s.ndim == 0:
        size = int(s)
        if size <= 0:
            raise ValueError(f"split must be positive, got {size}")
        sizes = [size] * (n // size) + ([n % size] if n % size else [])
    else:
        sizes = [int(v) for v in s.reshape(-1)]
        if any(v < 0 for v in sizes) or sum(sizes) != n:
            raise ValueError(f"split sizes {sizes} must be non-negative and sum to dim {ax} ({n})")
    idx = np.cumsum(sizes)[:-1]
    return [np.ascontiguousarray(p) for p in np.split(x, idx, axis=ax)]


@kernel("ConcatFromSequence", 11)
def concat_from_sequence(ctx, seq, *, axis, new_axis):
    seq = _seq(seq)
    if not seq:
        raise ValueError("ConcatFromSequence of an empty sequence")
    r = np.asarray(seq[0]).ndim
    if new_axis:
        ax = axis + r + 1 if axis < 0 else axis
        if not 0 <= ax <= r:
            raise ValueError(f"axis {axis} is out of range [{-r - 1}, {r}] with new_axis=1")
        return np.stack(seq, axis=ax)
    ax = axis + r if axis < 0 else axis
    if not 0 <= ax < r:
        raise ValueError(f"axis {axis} is out of range [{-r}, {r - 1}]")
    return np.concatenate(seq, axis=ax)


@kernel("SequenceMap", 17, control=True, check=check_bodies)
def sequence_map(ctx, input_sequence, *additional_inputs, body, outer):
    sub = ctx.subgraphs["body"]
    seq = _seq(input_sequence)
    n = len(seq)
    for j, a in enumerate(additional_inputs):
        if isinstance(a, list) and len(a) != n:
            raise ValueError(f"additional input {j} is a sequence of {len(a)} tensors, "
                             f"input_sequence has {n}")
    res = [[] for _ in sub.output_names]
    for i in range(n):
        args = [seq[i]] + [a[i] if isinstance(a, list) else a for a in additional_inputs]
        for k, o in enumerate(sub.run(args, outer)):
            res[k].append(o)
    return tuple(res)


# -- optionals ------------------------------------------------------------------------------

def _check_optional(node) -> str | None:
    if not (node.inputs and node.inputs[0]) and node.attrs.get("type") is None:
        return "Optional without an input needs the 'type' attribute"
    return None


@kernel("Optional", 15, 28, check=_check_optional)  # 28 widens the types
def optional(ctx, x=None, *, type=None):
    return x


@kernel("OptionalHasElement", 15, 18, 28)  # 18: tensors/sequences and an omitted input allowed
def optional_has_element(ctx, x=None):
    return np.array(x is not None)


@kernel("OptionalGetElement", 15, 18, 28)  # 18: a tensor or sequence input is returned as is
def optional_get_element(ctx, x):
    if x is None:
        raise ValueError("OptionalGetElement of an empty optional")
    return x
