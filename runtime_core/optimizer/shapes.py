"""Symbolic shape reasoning for the optimizer.

Two tools:

* :func:`shape_tensor` / :func:`scalar_dim` evaluate the small integer subgraphs
  exporters emit to compute shapes (``Shape``, ``Gather``, ``Slice``, ``Concat``,
  ``Unsqueeze``, ``Squeeze``, ``Cast``) into lists of *dims*: an ``int``, a
  symbol ``str`` (same symbol = same size, onnx's convention), or
  ``("dim", value, axis)`` for a dim nothing more is known about. Fusions use it
  to prove that a ``Reshape`` only splits or merges the last axis; shape folding
  uses it to turn fully known shape computations into constants.
* :func:`fill_missing_shapes` propagates shapes through common ops where onnx
  shape inference gave up (it does for ``Reshape`` to a computed shape with
  symbolic dims, which leaves every value after it rank-less in TorchScript
  exports). It only fills values whose type has no shape; it never changes a
  shape onnx inferred.
"""

from __future__ import annotations

import re

import numpy as np
import onnx

from ..graph.ir import Graph
from .editor import Editor

def dim_of(ed: Editor, value: str, axis: int):
    """Canonical dim ``axis`` of ``value``: int, symbol, or ``("dim", value, axis)``."""
    s = ed.shape(value)
    if s is not None and 0 <= axis < len(s) and s[axis] is not None:
        return s[axis]
    return ("dim", value, axis)


def dims_of(ed: Editor, value: str) -> list | None:
    r = ed.rank(value)
    if r is None:
        return None
    return [dim_of(ed, value, i) for i in range(r)]


def _const_ints(ed: Editor, name: str):
    v = ed.const(name)
    if v is None or v.dtype.kind not in "iu":
        return None
    return [int(x) for x in v.reshape(-1)]


def shape_tensor(ed: Editor, name: str, depth: int = 0) -> list | None:
    """The 1-D integer tensor ``name`` as a list of dims, or ``None`` when unknown."""
    if depth > 32 or not name:
        return None
    c = ed.const(name)
    if c is not None:
        if c.dtype.kind in "iu" and c.ndim == 1:
            return [int(x) for x in c]
        return None
    node = ed.producer(name)
    if node is None or node.domain != "":
        return None
    op = node.op_type
    if op == "Shape":
        r = ed.rank(node.inputs[0])
        if r is None:
            return None
        start = node.attrs.get("start") or 0
        end = node.attrs.get("end")
        start = max(0, start + r if start < 0 else start)
        end = r if end is None else (end + r if end < 0 else end)
        end = min(max(end, 0), r)
        return [dim_of(ed, node.inputs[0], i) for i in range(start, end)]
    if op == "Concat":
        out = []
        for i in node.inputs:
            part = shape_tensor(ed, i, depth + 1)
            if part is None:
                return None
            out.extend(part)
        return out
    if op == "Cast":
        if node.attrs.get("to") not in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
            return None
        return shape_tensor(ed, node.inputs[0], depth + 1)
    if op == "Unsqueeze":
        axes = node.attrs.get("axes")
        if axes is None and len(node.inputs) > 1:
            axes = _const_ints(ed, node.inputs[1])
        if axes is None or list(axes) not in ([0], [-1]):
            return None
        d = scalar_dim(ed, node.inputs[0], depth + 1)
        return None if d is None else [d]
    if op == "Gather":
        if (node.attrs.get("axis") or 0) != 0:
            return None
        idx = ed.const(node.inputs[1])
        if idx is None or idx.ndim != 1:
            return None
        src = shape_tensor(ed, node.inputs[0], depth + 1)
        if src is None:
            return None
        try:
            return [src[int(i)] for i in idx]
        except IndexError:
            return None
    if op == "Slice":
        src = shape_tensor(ed, node.inputs[0], depth + 1)
        if src is None:
            return None
        if len(node.inputs) > 1:  # opset 10+: inputs
            starts = _const_ints(ed, node.inputs[1])
            ends = _const_ints(ed, node.inputs[2]) if len(node.inputs) > 2 else None
            axes = _const_ints(ed, node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] else [0]
            steps = _const_ints(ed, node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] else [1]
        else:
            starts, ends = node.attrs.get("starts"), node.attrs.get("ends")
            axes, steps = node.attrs.get("axes") or [0], [1]
        if starts is None or ends is None or axes is None or steps is None:
            return None
        if len(starts) != 1 or axes not in ([0], [-1]) or steps != [1]:
            return None
        return src[slice(*slice(starts[0], ends[0]).indices(len(src)))]
    return None


def scalar_dim(ed: Editor, name: str, depth: int = 0):
    """A 0-D (or one-element) integer tensor as one dim, or ``None``."""
    if depth > 32 or not name:
        return None
    c = ed.const(name)
    if c is not None:
        if c.dtype.kind in "iu" and c.ndim == 0:
            return int(c)
        return None
    node = ed.producer(name)
    if node is None or node.domain != "":
        return None
    if node.op_type == "Gather" and (node.attrs.get("axis") or 0) == 0:
        idx = ed.const(node.inputs[1])
        if idx is None or idx.ndim != 0:
            return None
        src = shape_tensor(ed, node.inputs[0], depth + 1)
        if src is None or not -len(src) <= int(idx) < len(src):
            return None
        return src[int(idx)]
    if node.op_type == "Squeeze":
        src = shape_tensor(ed, node.inputs[0], depth + 1)
        return src[0] if src is not None and len(src) == 1 else None
    if node.op_type == "Cast" and node.attrs.get("to") in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
        return scalar_dim(ed, node.inputs[0], depth + 1)
    if node.op_type in ("Sub", "Add", "Mul") and len(node.inputs) == 2:
        a, b = (scalar_dim(ed, i, depth + 1) for i in node.inputs)
        if isinstance(a, int) and isinstance(b, int):
            return a - b if node.op_type == "Sub" else (a + b if node.op_type == "Add" else a * b)
        if node.op_type == "Sub" and a is not None and a == b:  # kl - ql of one length
            return 0
        if node.op_type in ("Add", "Sub") and b == 0:
            return a
        if node.op_type == "Mul" and b == 1:
            return a
    return None


def reshape_target(ed: Editor, node) -> list | None:
    """The output dims of a Reshape node from its shape input (0 and -1 resolved where
    they can be), or ``None`` when the shape input is unknown."""
    tgt = shape_tensor(ed, node.inputs[1])
    if tgt is None:
        return None
    src = dims_of(ed, node.inputs[0])
    allowzero = node.attrs.get("allowzero") or 0
    out = []
    for i, d in enumerate(tgt):
        if d == 0 and not allowzero:
            if src is None or i >= len(src):
                return None
            d = src[i]
        out.append(d)
    if out.count(-1) == 1 and src is not None:
        known = [d for d in out if d != -1]
        total, rest = _prod(src), _prod(known)
        k = out.index(-1)
        if isinstance(total, int) and isinstance(rest, int) and rest > 0:
            out[k] = total // rest
        else:
            # cancel common factors symbolically: src dims that appear in the known part
            pool = list(src)
            leftover = []
            for d in known:
                if d in pool:
                    pool.remove(d)
                else:
                    leftover.append(d)
            ints_left = [d for d in leftover if isinstance(d, int)]
            if len(ints_left) == len(leftover):
                denom = int(np.prod(ints_left)) if ints_left else 1
                ints_pool = [d for d in pool if isinstance(d, int)]
                syms_pool = [d for d in pool if not isinstance(d, int)]
                num = int(np.prod(ints_pool)) if ints_pool else 1
                if num % denom == 0:
                    q = num // denom
                    if not syms_pool:
                        out[k] = q
                    elif len(syms_pool) == 1 and q == 1:
                        out[k] = syms_pool[0]
                    else:
                        out[k] = None
                else:
                    out[k] = None
            else:
                out[k] = None
    elif -1 in out:
        return None
    return out


def _at_most(m, d) -> bool:
    """``m`` is the marker ``("min", d, n)``: the size of a slice ``[0:d]`` of an axis of n."""
    return isinstance(m, tuple) and len(m) == 3 and m[0] == "min" and d is not None and m[1] == d


def _prod(dims):
    p = 1
    for d in dims:
        if not isinstance(d, int):
            return None
        p *= d
    return p


# -- propagation -----------------------------------------------------------------

def _bcast(a: list, b: list) -> list:
    """Numpy broadcasting of two dim lists (None: unknown). An int other than 1 wins over
    an unknown dim: a valid broadcast forces the other to equal it or be 1."""
    n = max(len(a), len(b))
    a = [1] * (n - len(a)) + list(a)
    b = [1] * (n - len(b)) + list(b)
    out = []
    for x, y in zip(a, b):
        if x == 1:
            out.append(y)
        elif y == 1:
            out.append(x)
        elif x is not None and x == y:
            out.append(x)
        elif _at_most(y, x):  # min(x, n) is x, or 1 (then x is 1 too), or not x: no broadcast
            out.append(x)
        elif _at_most(x, y):
            out.append(y)
        elif isinstance(x, int):
            out.append(x)
        elif isinstance(y, int):
            out.append(y)
        else:
            out.append(None)
    return out


_UNARY = {"Relu", "Sigmoid", "Tanh", "Erf", "Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal",
          "Cast", "Softmax", "LogSoftmax", "Identity", "Dropout", "LayerNormalization", "Gelu",
          "LeakyRelu", "HardSigmoid", "HardSwish", "Clip", "Not", "Floor", "Ceil", "Round", "Sign",
          "Sin", "Cos", "Softplus", "Elu", "Selu", "Mish", "IsNaN", "IsInf", "CastLike"}
_MS_UNARY = {"Gelu", "FastGelu", "BiasGelu", "SkipLayerNormalization", "Attention", "MultiHeadAttention",
             "BiasAdd"}
_BINARY = {"Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "Greater", "LessOrEqual",
           "GreaterOrEqual", "And", "Or", "Xor", "Max", "Min", "Mod", "PRelu", "Sum", "Mean"}


_SAME_ELEM = (_UNARY - {"Cast", "CastLike", "IsNaN", "IsInf", "Not"}) | {
    "Add", "Sub", "Mul", "Div", "Pow", "MatMul", "Transpose", "Reshape", "Split", "Gemm", "ReduceMean",
    "ReduceSum", "ReduceMax", "ReduceMin", "Gather", "Where", "Max", "Min", "Sum", "Mean", "Mod", "PRelu", "MatMulNBits"}


def _clean(dims):
    return [d if isinstance(d, (int, str)) else None for d in dims]


def _infer_node(ed: Editor, n, shape) -> list | None:
    """Output 0's dims of ``n`` from its inputs' dims (``shape(name)`` gives those)."""
    op = n.op_type
    if n.domain == "com.microsoft" and op == "MatMulNBits":
        # a 4-bit weight-only MatMul (onnx knows no contrib schema): A's dims with the last as N; without
        # it the fusions after it (SkipLayerNormalization on the residual Add) never see a shape
        a, nn = shape(n.inputs[0]) if n.inputs else None, n.attrs.get("N")
        return None if a is None or len(a) < 1 or not isinstance(nn, int) else list(a[:-1]) + [nn]
    if n.domain not in ("", "ai.onnx"):
        return None
    ins = [shape(i) if i else None for i in n.inputs]
    if op in _UNARY:
        return ins[0]
    if op in _BINARY or op == "Where":
        if any(s is None for s in ins if True):
            return None
        out = ins[0]
        for s in ins[1:]:
            out = _bcast(out, s)
        return out
    if op == "MatMul":
        a, b = ins
        if a is None or b is None or len(a) < 2 or len(b) < 2:
            return None
        batch = _bcast(a[:-2], b[:-2])
        return batch + [a[-2], b[-1]]
    if op == "Transpose":
        a = ins[0]
        if a is None:
            return None
        perm = n.attrs.get("perm") or list(range(len(a)))[::-1]
        if len(perm) != len(a):
            return None
        return [a[p] for p in perm]
    if op == "Reshape":
        tgt = reshape_target(ed, n)
        if tgt is None:
            return None
        return [d if isinstance(d, (int, str)) else (dim_if_known(d, shape)) for d in tgt]
    if op == "Split":
        a = ins[0]
        if a is None:
            return None
        ax = n.attrs.get("axis") or 0
        ax = ax + len(a) if ax < 0 else ax
        k = len(n.outputs)
        split = None
        if len(n.inputs) > 1 and n.inputs[1]:
            split = _const_ints(ed, n.inputs[1])
        elif n.attrs.get("split"):
            split = n.attrs.get("split")
        out = list(a)
        if split is not None:
            if len(set(split)) != 1:
                return None
            out[ax] = split[0]
        elif isinstance(a[ax], int) and a[ax] % k == 0:
            out[ax] = a[ax] // k
        else:
            out[ax] = None
        return out
    if op == "Gemm":
        a, b = ins[0], ins[1]
        if a is None or b is None or len(a) != 2 or len(b) != 2:
            return None
        m = a[1] if n.attrs.get("transA") else a[0]
        nn = b[0] if n.attrs.get("transB") else b[1]
        return [m, nn]
    if op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"):
        a = ins[0]
        if a is None:
            return None
        axes = n.attrs.get("axes")
        if axes is None and len(n.inputs) > 1 and n.inputs[1]:
            axes = _const_ints(ed, n.inputs[1])
        if axes is None:
            return None
        axes = {x + len(a) if x < 0 else x for x in axes}
        if n.attrs.get("keepdims", 1):
            return [1 if i in axes else d for i, d in enumerate(a)]
        return [d for i, d in enumerate(a) if i not in axes]
    if op == "Unsqueeze":
        a = ins[0]
        axes = n.attrs.get("axes")
        if axes is None and len(n.inputs) > 1:
            axes = _const_ints(ed, n.inputs[1])
        if a is None or axes is None:
            return None
        r = len(a) + len(axes)
        axes = sorted(x + r if x < 0 else x for x in axes)
        if len(set(axes)) != len(axes) or not all(0 <= x < r for x in axes):
            return None
        out = list(a)
        for x in axes:
            out.insert(x, 1)
        return out
    if op == "Range":
        start, limit, delta = (scalar_dim(ed, i) for i in n.inputs[:3])
        if start == 0 and delta == 1 and isinstance(limit, (int, str)):
            return [max(limit, 0) if isinstance(limit, int) else limit]
        return None
    if op == "ConstantOfShape":
        return shape_tensor(ed, n.inputs[0])
    if op == "Slice" and len(n.inputs) >= 3:
        return _slice_dims(ed, n, ins[0])
    if op == "Expand":
        tgt = shape_tensor(ed, n.inputs[1])
        if ins[0] is None or tgt is None:
            return None
        return _bcast(ins[0], tgt)
    if op == "Concat":
        # onnx names the joined axis of static pieces unk__N when one piece's shape came late
        if not ins or any(s is None or len(s) != len(ins[0]) for s in ins):
            return None
        ax = n.attrs.get("axis")
        if ax is None or not -len(ins[0]) <= ax < len(ins[0]):
            return None
        ax = ax + len(ins[0]) if ax < 0 else ax
        out = [next((s[i] for s in ins if isinstance(s[i], int)), ins[0][i]) for i in range(len(ins[0]))]
        out[ax] = sum(s[ax] for s in ins) if all(isinstance(s[ax], int) for s in ins) else None
        return out
    if op == "Gather":
        a, idx = ins[0], ins[1]
        if a is None or idx is None:
            return None
        ax = n.attrs.get("axis") or 0
        ax = ax + len(a) if ax < 0 else ax
        return list(a[:ax]) + list(idx) + list(a[ax + 1:])
    return None


_INT_MAX = 1 << 62


def _slice_dims(ed: Editor, n, a) -> list | None:
    """Output dims of Slice (opset 10+): exact for constant bounds on a known dim; for
    ``[0:d]`` with d a symbol, the marker ``("min", d, size)`` (what broadcasting against d
    resolves, see ``_bcast``)."""
    if a is None:
        return None
    r = len(a)
    starts, ends = shape_tensor(ed, n.inputs[1]), shape_tensor(ed, n.inputs[2])
    axes = (shape_tensor(ed, n.inputs[3]) if len(n.inputs) > 3 and n.inputs[3]
            else (None if starts is None else list(range(len(starts)))))
    steps = shape_tensor(ed, n.inputs[4]) if len(n.inputs) > 4 and n.inputs[4] else (
        None if axes is None else [1] * len(axes))
    if axes is not None and steps is not None and (starts is None or ends is None):
        # bounds computed from something else: the sliced axes become unknown, the others stay
        if not all(isinstance(ax, int) and -r <= ax < r for ax in axes):
            return None
        out = list(a)
        for ax in axes:
            out[ax + r if ax < 0 else ax] = None
        return out
    if None in (starts, ends, axes, steps) or not len(starts) == len(ends) == len(axes) == len(steps):
        return None
    out = list(a)
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        if not isinstance(ax, int) or not -r <= ax < r:
            return None
        ax = ax + r if ax < 0 else ax
        d = a[ax]
        if isinstance(st, int) and isinstance(en, int) and isinstance(sp, int) and isinstance(d, int) and sp:
            out[ax] = len(range(*slice(st, en, sp).indices(d)))
        elif st == 0 and sp == 1 and isinstance(en, int) and en >= _INT_MAX:
            out[ax] = d
        elif st == 0 and sp == 1 and isinstance(en, str):
            out[ax] = en if d == en else ("min", en, d)
        else:
            out[ax] = None
    return out


def dim_if_known(d, shape):
    if isinstance(d, tuple) and len(d) == 3 and d[0] == "dim":
        s = shape(d[1])
        if s is not None and d[2] < len(s):
            return s[d[2]]
    return None


_GENERATED = re.compile(r"unk__\d+$")


def _broadcast_hints(ed: Editor, graph: Graph, hint: dict, sub: dict, declared: set, resolve) -> None:
    """A symbol hinted ``("min", d, n)`` (a slice ``[0:d]`` of an axis of int n > 1) that a
    broadcasting node lines up against ``d`` itself is ``d`` wherever that node runs: min(d, n) is
    d, or n < d, which broadcasts against d only if one of them is 1 (n > 1: d would be 1, less
    than n). The Add of a sliced position table to the embeddings proves the table's rows (BERT's
    TorchScript export: its skip operand of the embeddings' LayerNorm had that unknown dim)."""
    if not hint:
        return
    for n in graph.nodes:
        if n.domain not in ("", "ai.onnx") or not (n.op_type in _BINARY or n.op_type == "Where"):
            continue
        ins = [ed.shape(i) if i else None for i in n.inputs]
        if len(ins) < 2 or any(x is None for x in ins):
            continue
        rank = max(len(x) for x in ins)
        cols = list(zip(*[[1] * (rank - len(x)) + list(x) for x in ins]))
        for col in cols:
            for o in col:
                if not isinstance(o, str) or o not in hint or o in sub or o in declared:
                    continue
                _, d, size = hint[o]
                if isinstance(size, int) and size > 1 and any(x is not o and x != o and resolve(x) == d for x in col):
                    sub[o] = d


def refine_symbols(graph: Graph) -> int:
    """Replace the fresh symbols onnx shape inference makes up for dims it cannot name
    (``unk__N``, one per unknown, shared by the values it propagated to) by the int or the
    symbol our own rules prove, where the graph runs (e.g. ``Add`` of [batch, seq, D] and
    the [1, min(seq, n), D] of a sliced position table is [batch, seq, D], which onnx calls
    [unk__2, unk__3, D]). Returns how many symbols it resolved."""
    declared = set()
    for vi in list(graph.inputs) + list(graph.outputs):
        if vi.type.HasField("tensor_type"):
            declared.update(d.dim_param for d in vi.type.tensor_type.shape.dim if d.dim_param)
    ed = Editor(graph, "shapes")
    total = 0
    # to a fixed point: a round may resolve only the first of a chain of symbols (DistilBERT's
    # Reshape(context, [B, -1, D]) makes a fresh one per layer); a productive round replaces
    # generated symbols and introduces none, so there are at most as many rounds as symbols
    generated = {d.dim_param for tp in graph.types.values() if tp.HasField("tensor_type")
                 for d in tp.tensor_type.shape.dim if d.dim_param and _GENERATED.match(d.dim_param)}
    for _ in range(len(generated) + 1):
        sub: dict[str, object] = {}
        hint: dict[str, tuple] = {}

        def resolve(d):
            if isinstance(d, str) and d in sub:
                return sub[d]
            if isinstance(d, str) and d in hint:
                return hint[d]
            return d

        def shape(name):
            s = ed.shape(name)
            return None if s is None else [resolve(d) for d in s]

        for n in graph.nodes:
            if not n.outputs or not n.outputs[0]:
                continue
            old = ed.shape(n.outputs[0])
            if old is None or not any(isinstance(d, str) and _GENERATED.match(d) and d not in declared
                                      for d in old):
                continue
            try:
                dims = _infer_node(ed, n, shape)
            except Exception:  # noqa: BLE001 - refinement is advisory
                dims = None
            if dims is None or len(dims) != len(old):
                continue
            for o, d in zip(old, dims):
                if not (isinstance(o, str) and _GENERATED.match(o)) or o in declared or o in sub:
                    continue
                if isinstance(d, int) or (isinstance(d, str) and d != o and not _GENERATED.match(d)):
                    sub[o] = d
                elif isinstance(d, tuple) and d[:1] == ("min",) and o not in hint:
                    hint[o] = d
        _broadcast_hints(ed, graph, hint, sub, declared, resolve)
        if not sub:
            break
        total += len(sub)
        for name, tp in list(graph.types.items()):
            if not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
                continue
            dims = [d.dim_param if d.dim_param else (d.dim_value if d.HasField("dim_value") else None)
                    for d in tp.tensor_type.shape.dim]
            if any(isinstance(d, str) and d in sub for d in dims):
                graph.types[name] = onnx.helper.make_tensor_type_proto(
                    tp.tensor_type.elem_type, [sub.get(d, d) if isinstance(d, str) else d for d in dims])
    return total


def fill_missing_shapes(graph: Graph) -> int:
    """Give a shape to every output of a supported op whose type has none; returns how many."""
    ed = Editor(graph, "shapes")
    filled = 0
    cache: dict[str, list | None] = {}

    def shape(name):
        if name in cache:
            return cache[name]
        s = ed.shape(name)
        cache[name] = None if s is None else list(s)
        return cache[name]

    for n in graph.nodes:
        outs = [o for o in n.outputs if o]
        if not outs:
            continue
        missing = [o for o in outs if shape(o) is None]
        if not missing:
            continue
        try:
            dims = _infer_node(ed, n, shape)
        except Exception:  # noqa: BLE001 - propagation is advisory
            dims = None
        if dims is None:
            continue
        dims = _clean(dims)
        for o in missing:
            if n.op_type == "Split" or o == n.outputs[0]:
                tp = graph.types.get(o)
                elem = tp.tensor_type.elem_type if tp is not None and tp.HasField("tensor_type") else 0
                if not elem:
                    k = 1 if n.op_type == "Where" else 0
                    src = graph.types.get(n.inputs[k]) if len(n.inputs) > k and n.inputs[k] else None
                    if n.op_type not in _SAME_ELEM:
                        elem = 0
                    elif src is None and len(n.inputs) > k and n.inputs[k] in graph.initializers:
                        elem = onnx.helper.np_dtype_to_tensor_dtype(graph.initializers[n.inputs[k]].dtype)
                    elif src is not None and src.HasField("tensor_type"):
                        elem = src.tensor_type.elem_type
                if not elem:
                    continue
                graph.types[o] = onnx.helper.make_tensor_type_proto(elem, dims)
                cache[o] = dims
                filled += 1
    return filled


__all__ = ["dim_of", "dims_of", "shape_tensor", "scalar_dim", "reshape_target", "fill_missing_shapes",
           "refine_symbols"]
