"""Basic (semantics-preserving) passes beyond the original three.

Every pass here leaves each graph output bit-for-bit what it was (constant
folding runs the CPU provider's own kernels, so a folded value is exactly what
the node would have computed at run time).
"""

from __future__ import annotations

import hashlib

import numpy as np
import onnx

from ..graph.ir import Graph, Node
from ..graph.types import elem_to_dtype
from .base import BASIC, NONDETERMINISTIC, Editor, Pass, logger
from .shapes import scalar_dim, shape_tensor


def _has_subgraph(n: Node) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.proto_attrs)


class DropoutElimination(Pass):
    """Inference-mode ``Dropout`` (no training_mode, or a constant false) whose mask nobody
    reads is the identity."""

    name = "DropoutElimination"
    level = BASIC

    def apply(self, graph: Graph) -> int:
        ed = Editor(graph, self.name)
        count = 0
        for n in list(graph.nodes):
            if n.op_type != "Dropout" or n.domain != "" or not n.inputs or not n.inputs[0]:
                continue
            if len(n.inputs) > 2 and n.inputs[2]:
                tm = ed.const(n.inputs[2])
                if tm is None or bool(tm.reshape(-1)[0]):
                    continue
            if n.attrs.get("is_test") == 0 and n.since_version is not None and n.since_version < 7:
                continue
            if len(n.outputs) > 1 and n.outputs[1] and (ed.consumers(n.outputs[1]) or ed.is_output(n.outputs[1])):
                continue
            if ed.bypass(n, n.outputs[0], n.inputs[0]):
                ed.log("removed %s", n.name)
                count += 1
        return count


class ShapeFolding(Pass):
    """Shape computations whose result is known at session creation become constants:
    ``Shape``/``Size`` of a value whose (needed) dims are static, and ``Gather``/``Slice``/
    ``Concat``/``Unsqueeze``/``Squeeze``/``Cast`` of shape tensors once every element they
    produce is a known number (even where other dims of the source are symbolic)."""

    name = "ShapeFolding"
    level = BASIC
    OPS = {"Shape", "Gather", "Slice", "Concat", "Unsqueeze", "Squeeze", "Cast"}

    def apply(self, graph: Graph) -> int:
        ed = Editor(graph, self.name)
        count = 0
        keep = []
        for n in graph.nodes:
            val = None
            if n.domain == "" and len(n.outputs) == 1 and n.outputs[0] and not ed.is_output(n.outputs[0]):
                if n.op_type == "Size":
                    s = ed.static_shape(n.inputs[0])
                    if s is not None:
                        val = np.array(int(np.prod(s, dtype=np.int64)), dtype=np.int64)
                elif n.op_type in self.OPS and not all(ed.const(i) is not None for i in n.inputs if i):
                    val = self._fold(ed, n)
            if val is not None:
                graph.initializers[n.outputs[0]] = val
                ed.log("%s (%s) -> constant %s", n.name, n.op_type, val.tolist())
                count += 1
                ed.touch()
                continue
            keep.append(n)
        graph.nodes = keep
        return count

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


class ConstantFolding(Pass):
    """Nodes whose inputs are all constants are computed once, with the CPU provider's
    kernel, and become initializers. Never: non-deterministic ops, nodes with subgraphs,
    outputs over ``MAX_ELEMENTS`` elements, non-tensor outputs, or a kernel that declines
    or whose result's dtype differs from the inferred type."""

    name = "ConstantFolding"
    level = BASIC
    MAX_ELEMENTS = 1 << 20

    def apply(self, graph: Graph) -> int:
        try:
            from runtime_provider_cpu.plugin import decline_reason
            from runtime_provider_cpu.registry import REGISTRY, KernelContext
        except ImportError:  # pragma: no cover - the CPU provider is a dependency
            logger.info("ConstantFolding: runtime_provider_cpu is not importable; skipped")
            return 0
        ed = Editor(graph, self.name)
        count = 0
        keep = []
        for n in graph.nodes:
            vals = self._fold(ed, n, decline_reason, REGISTRY, KernelContext)
            if vals is None:
                keep.append(n)
                continue
            for o, v in zip(n.outputs, vals):
                if o:
                    graph.initializers[o] = v
            ed.log("folded %s (%s)", n.name, n.op_type)
            count += 1
        graph.nodes = keep
        return count

    def _fold(self, ed: Editor, n: Node, decline_reason, registry, context_cls):
        if n.op_type in NONDETERMINISTIC or n.implicit_inputs or _has_subgraph(n):
            return None
        ins = [i for i in n.inputs if i]
        if not ins or any(ed.const(i) is None for i in ins):
            return None
        if n.op_type in ("Constant",):
            return None
        g = ed.g
        view = g.node_view(n)
        if decline_reason(view) is not None:
            return None
        spec = registry.lookup(n.domain, n.op_type, n.since_version)
        if spec is None:
            return None
        args = [ed.const(i) if i else None for i in n.inputs]
        while args and args[-1] is None:
            args.pop()
        ctx = context_cls(node=view, n_outputs=len(n.outputs),
                          input_dtypes=tuple(i.dtype if i is not None else None for i in view.input_info),
                          output_dtypes=tuple(o.dtype if o is not None else None for o in view.output_info))
        try:
            with np.errstate(all="ignore"):
                res = spec.fn(ctx, *args, **dict(n.attrs))
        except Exception as exc:  # noqa: BLE001 - the run would fail the same way; leave it to the run
            ed.log("not folding %s (%s): kernel raised %s: %s", n.name, n.op_type, type(exc).__name__, exc)
            return None
        if type(res) is not tuple:
            res = (res,)
        out = []
        total = 0
        for name, r, info in zip(n.outputs, res, view.output_info):
            if not name:
                out.append(None)
                continue
            if isinstance(r, (list, dict)) or r is None:
                return None
            r = np.asarray(r)
            if r.dtype == object and r.size and not isinstance(r.reshape(-1)[0], (str, bytes)):
                return None
            if info is not None and info.dtype is not None:
                want = np.dtype(info.dtype)
                if r.dtype != want and not (want == np.dtype(object) and r.dtype.kind in "OUS"):
                    return None
            total += r.size
            out.append(r)
        if len(out) < sum(1 for o in n.outputs if o) or total > self.MAX_ELEMENTS:
            return None
        return out


#: casts that keep every value of the source type exactly
_LOSSLESS = {
    "bool": {"int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16",
             "float32", "float64"},
    "int8": {"int16", "int32", "int64", "float16", "float32", "float64"},
    "uint8": {"int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64"},
    "int16": {"int32", "int64", "float32", "float64"},
    "uint16": {"int32", "uint32", "int64", "uint64", "float32", "float64"},
    "int32": {"int64", "float64"},
    "uint32": {"int64", "uint64", "float64"},
    "float16": {"float32", "float64"},
    "float32": {"float64"},
}


class CastElimination(Pass):
    """``Cast`` to the type its input already has is dropped; ``Cast(Cast(x, T1), T2)``
    reads ``x`` directly when ``x -> T1`` is lossless (then it is a single cast, or none
    when ``T2`` is ``x``'s type)."""

    name = "CastElimination"
    level = BASIC

    def apply(self, graph: Graph) -> int:
        ed = Editor(graph, self.name)
        count = 0
        for n in list(graph.nodes):
            if n.op_type != "Cast" or n.domain != "" or not ed.alive(n) or not n.inputs[0]:
                continue
            to = elem_to_dtype(n.attrs.get("to") or 0)
            src = ed.dtype(n.inputs[0])
            if to is None or src is None:
                continue
            if src == to:
                if ed.bypass(n, n.outputs[0], n.inputs[0]):
                    ed.log("removed %s (cast to its own type %s)", n.name, to)
                    count += 1
                continue
            prev = ed.producer(n.inputs[0])
            if prev is None or prev.op_type != "Cast" or prev.domain != "" or not prev.inputs[0]:
                continue
            x = prev.inputs[0]
            xd = ed.dtype(x)
            mid = elem_to_dtype(prev.attrs.get("to") or 0)
            if xd is None or mid is None or mid.name not in _LOSSLESS.get(xd.name, ()):
                continue
            if xd == to:
                if ed.bypass(n, n.outputs[0], x):
                    ed.log("removed %s and read %s (lossless round trip %s->%s->%s)", n.name, x, xd, mid, to)
                    count += 1
            else:
                n.inputs = [x]
                ed.touch()
                ed.log("%s reads %s directly (lossless %s->%s)", n.name, x, xd, mid)
                count += 1
        return count


class TransposeElimination(Pass):
    """Identity ``Transpose`` is dropped; ``Transpose(Transpose(x))`` becomes one transpose
    with the composed permutation, or none when they cancel."""

    name = "TransposeElimination"
    level = BASIC

    @staticmethod
    def _perm(ed: Editor, n: Node):
        p = n.attrs.get("perm")
        if p:
            return list(p)
        r = ed.rank(n.inputs[0])
        return None if r is None else list(range(r))[::-1]

    def apply(self, graph: Graph) -> int:
        ed = Editor(graph, self.name)
        count = 0
        for n in list(graph.nodes):
            if n.op_type != "Transpose" or n.domain != "" or not ed.alive(n):
                continue
            p2 = self._perm(ed, n)
            if p2 is None:
                continue
            if p2 == sorted(p2):
                if ed.bypass(n, n.outputs[0], n.inputs[0]):
                    ed.log("removed identity %s", n.name)
                    count += 1
                continue
            prev = ed.producer(n.inputs[0])
            if prev is None or prev.op_type != "Transpose" or prev.domain != "":
                continue
            p1 = self._perm(ed, prev)
            if p1 is None or len(p1) != len(p2):
                continue
            q = [p1[k] for k in p2]
            x = prev.inputs[0]
            if q == sorted(q):
                if ed.bypass(n, n.outputs[0], x):
                    ed.log("%s and %s cancel", prev.name, n.name)
                    count += 1
            else:
                new = ed.new_node("Transpose", [x], list(n.outputs), base=n.name, attrs={"perm": q})
                ed.replace([n], [new])
                ed.log("%s + %s -> one Transpose %s", prev.name, n.name, q)
                count += 1
        return count


_RESHAPE_LIKE = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}


class ReshapeElimination(Pass):
    """``Reshape`` of a reshape-like op (Reshape/Flatten/Squeeze/Unsqueeze: element order
    unchanged) reads the original input when its target has no copy-dim 0; a ``Reshape``
    whose static output shape equals its static input shape is dropped."""

    name = "ReshapeElimination"
    level = BASIC

    def apply(self, graph: Graph) -> int:
        ed = Editor(graph, self.name)
        count = 0
        for n in list(graph.nodes):
            if n.op_type != "Reshape" or n.domain != "" or not ed.alive(n) or len(n.inputs) < 2:
                continue
            tgt = ed.const(n.inputs[1])
            ins = ed.static_shape(n.inputs[0])
            if tgt is not None and ins is not None:
                shape = self._resolve(ins, [int(v) for v in tgt.reshape(-1)], n.attrs.get("allowzero") or 0)
                if shape is not None and tuple(shape) == ins:
                    if ed.bypass(n, n.outputs[0], n.inputs[0]):
                        ed.log("removed %s (reshape to its own shape %s)", n.name, ins)
                        count += 1
                    continue
            prev = ed.producer(n.inputs[0])
            if prev is None or prev.op_type not in _RESHAPE_LIKE or prev.domain != "" or not prev.inputs[0]:
                continue
            dims = shape_tensor(ed, n.inputs[1])
            if dims is None:
                continue
            if 0 in dims and not (n.attrs.get("allowzero") or 0):
                continue
            n.inputs = [prev.inputs[0], n.inputs[1]]
            ed.touch()
            ed.log("%s reads %s (skips %s %s)", n.name, prev.inputs[0], prev.op_type, prev.name)
            count += 1
        return count

    @staticmethod
    def _resolve(ins, tgt, allowzero):
        out = []
        for i, d in enumerate(tgt):
            if d == 0 and not allowzero:
                if i >= len(ins):
                    return None
                d = ins[i]
            out.append(d)
        if out.count(-1) > 1:
            return None
        if -1 in out:
            rest = int(np.prod([d for d in out if d != -1], dtype=np.int64))
            total = int(np.prod(ins, dtype=np.int64))
            if rest == 0 or total % rest:
                return None
            out[out.index(-1)] = total // rest
        return out


class CommonSubexpressionElimination(Pass):
    """Identical constants are shared, then nodes with the same op, version, attributes and
    inputs are computed once (never non-deterministic ops or nodes with subgraphs)."""

    name = "CommonSubexpressionElimination"
    level = BASIC
    MAX_CONST_ELEMENTS = 1 << 20

    def apply(self, graph: Graph) -> int:
        ed = Editor(graph, self.name)
        rename: dict[str, str] = {}
        count = 0
        # identical initializers (not overridable graph inputs)
        inputs = set(graph.input_names)
        outputs = set(graph.output_names)
        implicit = {i for n in graph.nodes for i in n.implicit_inputs}
        seen_c: dict = {}
        for name, arr in graph.initializers.items():
            if (name in inputs or name in outputs or name in implicit or arr.dtype == object
                    or arr.size > self.MAX_CONST_ELEMENTS):
                continue
            key = (arr.dtype.str, arr.shape, hashlib.sha1(np.ascontiguousarray(arr).tobytes()).hexdigest())
            first = seen_c.get(key)
            if first is None:
                seen_c[key] = name
            elif np.array_equal(graph.initializers[first], arr):
                rename[name] = first
        n_const = len(rename)
        seen: dict = {}
        keep = []
        for n in graph.nodes:
            n.inputs = [rename.get(i, i) for i in n.inputs]
            if (n.op_type in NONDETERMINISTIC or n.implicit_inputs or _has_subgraph(n)
                    or not any(n.inputs)):
                keep.append(n)
                continue
            key = (n.domain, n.op_type, n.since_version, tuple(n.inputs), len(n.outputs),
                   tuple(sorted((a.name, a.SerializeToString()) for a in n.proto_attrs)))
            first = seen.get(key)
            if first is None or any(o and (o in outputs or o in implicit) for o in n.outputs):
                seen.setdefault(key, n)
                keep.append(n)
                continue
            if any(bool(a) != bool(b) for a, b in zip(first.outputs, n.outputs)):
                keep.append(n)
                continue
            for a, b in zip(first.outputs, n.outputs):
                if b:
                    rename[b] = a
            ed.log("%s (%s) is the same as %s", n.name, n.op_type, first.name)
            count += 1
        graph.nodes = keep
        if n_const:
            logger.debug("%s: %d duplicate constant(s) shared", self.name, n_const)
        return count + n_const
