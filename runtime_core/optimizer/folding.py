"""Basic passes that compute at session creation what the run would compute: shape
arithmetic over static dims (ShapeFolding) and nodes whose inputs are all constants
(ConstantFolding, run by the registered CPU provider through ``fallback.py``).
"""

from __future__ import annotations

import math
from contextvars import ContextVar

import numpy as np

from ..errors import InvalidArgumentError
from ..graph.ir import Node
from ..graph.types import elem_to_dtype
from .editor import BASIC, NONDETERMINISTIC, Editor
from .elimination import has_subgraph
from .fallback import current as fallback_provider
from .qdq_fusions import feeds_qdq_group
from .rewrite import RewriteRule
from .shapes import scalar_dim, shape_tensor

#: session config entry: the most bytes one folded node may produce (all its outputs)
MAX_BYTES_KEY = "optimization.constant_folding_max_bytes"
DEFAULT_MAX_BYTES = 64 << 20

#: the cap of the ``optimize`` call in progress (set from the session config there)
MAX_BYTES: ContextVar[int] = ContextVar("runtime_core_constant_folding_max_bytes", default=DEFAULT_MAX_BYTES)

#: ops whose output can be much larger than their inputs, its size set by input values:
#: folded only when the output size is known beforehand (a shape bomb then costs nothing)
GROWING = frozenset({
    "ConstantOfShape", "Expand", "Tile", "Range", "Resize", "Upsample", "Pad", "OneHot", "Col2Im",
    "CenterCropPad", "StringSplit",
})


#: ops that repeat a body a number of times given by a value: never folded
LOOPING = frozenset({"Loop", "Scan", "SequenceMap"})


def max_bytes_from_config(config) -> int:
    """The folding cap from session config entries (``None`` or unset: the default)."""
    raw = None if config is None else config.get(MAX_BYTES_KEY)
    if raw is None:
        return DEFAULT_MAX_BYTES
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidArgumentError(f"session config entry {MAX_BYTES_KEY} must be a byte count >= 0, got {raw!r}")
    return value


class ShapeFolding(RewriteRule):
    """Shape computations whose result is known at session creation become constants:
    ``Shape``/``Size`` of a value whose (needed) dims are static, and ``Gather``/``Slice``/
    ``Concat``/``Unsqueeze``/``Squeeze``/``Cast`` of shape tensors once every element they
    produce is a known number (even where other dims of the source are symbolic)."""

    name = "ShapeFolding"
    level = BASIC
    OPS = frozenset({"Shape", "Gather", "Slice", "Concat", "Unsqueeze", "Squeeze", "Cast"})
    targets = OPS | {"Size"}

    def condition(self, ed: Editor, n: Node) -> bool:
        return len(n.outputs) == 1 and bool(n.outputs[0]) and not ed.is_output(n.outputs[0])

    def rewrite(self, ed: Editor, n: Node) -> bool:
        val = None
        if n.op_type == "Size":
            s = ed.static_shape(n.inputs[0])
            if s is not None:
                val = np.array(int(np.prod(s, dtype=np.int64)), dtype=np.int64)
        elif not all(ed.const(i) is not None for i in n.inputs if i):  # all-constant: ConstantFolding's
            val = self._fold(ed, n)
        if val is None:
            return False
        ed.g.initializers[n.outputs[0]] = val
        ed.drop(n)
        ed.log("%s (%s) -> constant %s", n.name, n.op_type, val.tolist())
        return True

    @staticmethod
    def _fold(ed: Editor, n: Node):
        out = n.outputs[0]
        if n.op_type == "Cast":
            want = elem_to_dtype(n.attrs.get("to") or 0)
        elif n.op_type == "Shape":
            want = np.dtype(np.int64)
        else:
            want = ed.dtype(out)
        if want is None or want.kind not in "iu":
            return None
        ndim = ed.rank(out)
        dims = shape_tensor(ed, out)
        if dims is not None:
            if ndim in (None, 1) and all(isinstance(d, int) for d in dims):
                return np.array(dims, dtype=want)
            return None
        d = scalar_dim(ed, out)
        if isinstance(d, int) and ndim in (None, 0):
            return np.array(d, dtype=want)
        return None


class ConstantFolding(RewriteRule):
    """Nodes whose inputs are all constants are computed once, by the registered CPU
    provider (``fallback.py``: its ``get_capability`` and ``compile``), and become
    initializers. Never: non-deterministic ops, nodes with subgraphs (a ``Loop``'s trip
    count could be anything), nodes whose outputs would exceed the cap (session config
    ``optimization.constant_folding_max_bytes``, default 64 MiB; the size comes from the
    inferred shapes before anything runs), non-tensor outputs, or a node the provider
    declines, fails on, or answers with a dtype other than the inferred one."""

    name = "ConstantFolding"
    level = BASIC

    def start(self, ed: Editor) -> bool:
        self._cpu = fallback_provider()
        self._cap = MAX_BYTES.get()
        return self._cpu.available

    def condition(self, ed: Editor, n: Node) -> bool:
        if n.op_type in NONDETERMINISTIC or n.op_type in LOOPING or n.op_type == "Constant":
            return False
        if n.implicit_inputs or has_subgraph(n):
            return False
        ins = [i for i in n.inputs if i]
        if not (bool(ins) and all(ed.const(i) is not None for i in ins)):
            return False
        return not feeds_qdq_group(ed, n)  # kept for the EXTENDED QDQ fusions (qdq_fusions.py)

    def rewrite(self, ed: Editor, n: Node) -> bool:
        view = ed.g.node_view(n)
        size = _output_bytes(view)
        if size is None and n.op_type in GROWING and n.domain == "":
            size = _growing_bytes(ed, n)
        if size is None and n.op_type in GROWING:
            ed.log("not folding %s (%s): its output size is unknown before it runs", n.name, n.op_type)
            return False
        if size is not None and size > self._cap:
            ed.log("not folding %s (%s): %d bytes is over the %d-byte cap", n.name, n.op_type, size, self._cap)
            return False
        consts = {i: ed.const(i) for i in n.inputs if i}
        vals = self._cpu.evaluate(ed.g, n, view, consts)
        if vals is None or not self._acceptable(ed, n, view, vals):
            return False
        for o, v in zip(n.outputs, vals):
            if o:
                ed.g.initializers[o] = np.asarray(v)
        ed.drop(n)
        ed.log("folded %s (%s)", n.name, n.op_type)
        return True

    def _acceptable(self, ed: Editor, n: Node, view, vals: list) -> bool:
        total = 0
        for name, r, info in zip(n.outputs, vals, view.output_info):
            if not name:
                continue
            if r is None or isinstance(r, (list, dict)):
                return False
            r = np.asarray(r)
            if r.dtype == object and r.size and not isinstance(r.reshape(-1)[0], (str, bytes)):
                return False
            if info is not None and info.dtype is not None:
                want = np.dtype(info.dtype)
                if r.dtype != want and not (want == np.dtype(object) and r.dtype.kind in "OUS"):
                    return False
            total += r.nbytes
        if total > self._cap:  # shapes were not known beforehand
            ed.log("not folding %s (%s): %d bytes is over the %d-byte cap", n.name, n.op_type, total, self._cap)
            return False
        return True


def _output_bytes(view) -> int | None:
    """The bytes a node's outputs take, from their inferred shapes (``None`` if unknown)."""
    total = 0
    for name, info in zip(view.outputs, view.output_info):
        if not name:
            continue
        shape = None if info is None else info.static_shape
        if shape is None or info.dtype is None or info.dtype == np.dtype(object):
            return None
        total += math.prod(shape) * info.dtype.itemsize  # Python ints: a bomb's size cannot wrap
    return total


def _ints(ed: Editor, name: str) -> list[int] | None:
    v = ed.const(name) if name else None
    if v is None or v.dtype.kind not in "iu":
        return None
    return [int(d) for d in v.reshape(-1)]


def _growing_bytes(ed: Editor, n: Node) -> int | None:
    """The output bytes of a ``GROWING`` op from its constant inputs (Python ints: no
    overflow), for the ones whose shape inference may not say; ``None`` when unknown."""
    ins = n.inputs
    if n.op_type == "ConstantOfShape":
        dims = _ints(ed, ins[0])
        value = n.attrs.get("value")
        itemsize = 4 if value is None else np.asarray(value).dtype.itemsize
        return None if dims is None or min(dims, default=0) < 0 else math.prod(dims) * itemsize
    x = ed.const(ins[0])
    if x is None:
        return None
    if n.op_type == "Expand" and len(ins) > 1:
        dims = _ints(ed, ins[1])
        if dims is None:
            return None
        a, b = list(x.shape), dims
        r = max(len(a), len(b))
        a, b = [1] * (r - len(a)) + a, [1] * (r - len(b)) + b
        if any(p != q and 1 not in (p, q) for p, q in zip(a, b)) or min(b, default=0) < 0:
            return None
        return math.prod(max(p, q) if 1 in (p, q) else p for p, q in zip(a, b)) * x.dtype.itemsize
    if n.op_type == "Tile" and len(ins) > 1:
        reps = _ints(ed, ins[1])
        if reps is None or len(reps) != x.ndim or min(reps, default=0) < 0:
            return None
        return math.prod(d * k for d, k in zip(x.shape, reps)) * x.dtype.itemsize
    if n.op_type == "Range" and len(ins) == 3:
        vals = [ed.const(i) for i in ins]
        if any(v is None or v.size != 1 for v in vals):
            return None
        start, limit, delta = (float(v.reshape(-1)[0]) for v in vals)
        if delta == 0 or not all(map(math.isfinite, (start, limit, delta))):
            return None
        return max(math.ceil((limit - start) / delta), 0) * x.dtype.itemsize
    return None
