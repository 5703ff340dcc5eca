"""Attribute validation at load time, and onnx shape inference that cannot take the process down.

:func:`validate_model` runs one table of per-op rules (:data:`RULES`) over every node,
subgraphs included, before anything else reads the attributes: what onnxruntime refuses
at session creation (negative pads, pads not smaller than a pool's kernel, strides or
dilations <= 0, a Conv bias that is not 1-D, an RNN's ``hidden_size``/``layout``/
``direction`` or weights for the wrong number of directions, ...) is refused here with an
:class:`~runtime_core.errors.InvalidModelError` naming the node and the attribute. Some of
these values also crash onnx's C++ shape inference (LayerNormalization ``axis = 2**31``).

:func:`infer_shapes` is the loader's call into ``onnx.shape_inference.infer_shapes``. For a
model holding an op on :data:`KNOWN_CRASHES` (patterns on which onnx 1.23.2's inference
crashes the interpreter even on a valid model), or with an int attribute outside int32 (the
class of values its inference was seen to crash on), it runs in a long-lived child process
(started on first need, restarted after a crash or a timeout); a crash there means "no inferred shapes" (inference is advisory: every kernel checks what it gets).
Other models are inferred in-process, as before (no start-up cost).
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import select
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import onnx

from ..errors import InvalidModelError

logger = logging.getLogger("runtime_core.graph")

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

#: (domain, op type) -> the highest opset of that domain whose schema crashes onnx's C++
#: shape inference on valid models: ai.onnx.ml TreeEnsemble* before ml opset 3 followed by a
#: consumer (skl2onnx's decision_path models: TreeEnsembleRegressor -> LabelEncoder).
KNOWN_CRASHES: dict[tuple[str, str], int] = {
    ("ai.onnx.ml", "TreeEnsembleRegressor"): 2,
    ("ai.onnx.ml", "TreeEnsembleClassifier"): 2,
}

#: seconds a child process may spend on shape inference before it is abandoned
INFER_TIMEOUT_S = 120.0


class _Node:
    """What a rule sees of one node: its name, attributes and known input shapes."""

    __slots__ = ("attrs", "name", "proto", "shapes")

    def __init__(self, proto: onnx.NodeProto, name: str, shapes: _Shapes):
        self.proto = proto
        self.name = name
        self.attrs = {a.name: a for a in proto.attribute}
        self.shapes = shapes

    def ints(self, name: str) -> list[int] | None:
        a = self.attrs.get(name)
        if a is None:
            return None
        if a.type == onnx.AttributeProto.INTS:
            return list(a.ints)
        if a.type == onnx.AttributeProto.INT:
            return [a.i]
        return None

    def int(self, name: str) -> int | None:
        a = self.attrs.get(name)
        return a.i if a is not None and a.type == onnx.AttributeProto.INT else None

    def string(self, name: str) -> str | None:
        a = self.attrs.get(name)
        if a is None or a.type != onnx.AttributeProto.STRING:
            return None
        return a.s.decode("utf-8", "replace")

    def input_shape(self, i: int) -> tuple | None:
        """The input's shape (ints, or None for an unknown dim) when its rank is known."""
        if i >= len(self.proto.input) or not self.proto.input[i]:
            return None
        return self.shapes.get(self.proto.input[i])


Rule = Callable[[_Node], "str | None"]


def _positive(attr: str) -> Rule:
    def rule(n: _Node):
        v = n.ints(attr)
        if v is not None and any(x <= 0 for x in v):
            return f"attribute {attr!r} must be positive, got {v}"
        return None
    return rule


def _non_negative(attr: str) -> Rule:
    def rule(n: _Node):
        v = n.ints(attr)
        if v is not None and any(x < 0 for x in v):
            return f"attribute {attr!r} must not be negative, got {v}"
        return None
    return rule


def _pads_smaller_than_kernel(n: _Node):
    pads, kernel = n.ints("pads"), n.ints("kernel_shape")
    if not pads or not kernel or len(pads) != 2 * len(kernel):
        return None
    k = len(kernel)
    for d in range(k):
        if pads[d] >= kernel[d] or pads[d + k] >= kernel[d]:
            return (f"attribute 'pads' {pads} must be smaller than 'kernel_shape' {kernel} "
                    f"(axis {d}: pads {pads[d]}, {pads[d + k]}, kernel {kernel[d]})")
    return None


def _pads_rank(n: _Node):
    pads, kernel = n.ints("pads"), n.ints("kernel_shape")
    if pads is not None and kernel and len(pads) != 2 * len(kernel):
        return f"attribute 'pads' has {len(pads)} values, expected {2 * len(kernel)} (2 per axis of 'kernel_shape' {kernel})"
    return None


def _conv_bias(n: _Node):
    shape = n.input_shape(2)
    if shape is not None and len(shape) != 1:
        return f"input 'B' (bias, {n.proto.input[2]!r}) must be 1-D (M,), got shape {list(shape)}"
    w = n.input_shape(1)
    if shape is not None and w is not None and w and isinstance(w[0], int) and isinstance(shape[0], int) \
            and shape[0] != w[0] and n.proto.op_type == "Conv":
        return f"input 'B' (bias) has {shape[0]} values, but 'W' has {w[0]} output channels"
    return None


def _rnn(gates: int) -> Rule:
    def rule(n: _Node):
        hidden = n.int("hidden_size")
        if hidden is not None and not 0 < hidden <= INT32_MAX:
            return f"attribute 'hidden_size' must be in [1, {INT32_MAX}], got {hidden}"
        layout = n.int("layout")
        if layout is not None and layout not in (0, 1):
            return f"attribute 'layout' must be 0 or 1, got {layout}"
        direction = n.string("direction")
        dirs = {"forward": 1, "reverse": 1, "bidirectional": 2, "foward": 1}.get(direction or "forward")
        if dirs is None:
            return f"attribute 'direction' must be forward, reverse or bidirectional, got {direction!r}"
        for i, what in ((1, "W"), (2, "R")):
            shape = n.input_shape(i)
            if shape is None:
                continue
            if len(shape) != 3:
                return f"input {what!r} must be 3-D [num_directions, {gates}*hidden_size, ...], got {list(shape)}"
            if isinstance(shape[0], int) and shape[0] != dirs:
                return (f"input {what!r} holds weights for {shape[0]} direction(s), but attribute "
                        f"'direction' {direction or 'forward'!r} needs {dirs}")
            if hidden is not None and isinstance(shape[1], int) and shape[1] != gates * hidden:
                return (f"input {what!r} dim 1 is {shape[1]}, expected {gates}*hidden_size = {gates * hidden} "
                        f"(attribute 'hidden_size' {hidden})")
        return None
    return rule


def _axis_in_rank(n: _Node):
    axis = n.int("axis")
    if axis is None:
        return None
    if not -INT32_MAX <= axis <= INT32_MAX:
        return f"attribute 'axis' {axis} is out of range"
    shape = n.input_shape(0)
    if shape is not None and not -len(shape) <= axis < len(shape):
        return f"attribute 'axis' {axis} is out of range for input rank {len(shape)}"
    return None


_EINSUM_TERM = re.compile(r"[A-Za-z]*(\.\.\.)?[A-Za-z]*")


def _einsum_equation(n: _Node):
    """Terms of letters (one ``...`` each), ``,`` between inputs, at most one ``->``: onnx's
    inference loops forever on a stray ``-`` ("a-") and on bytes that are not ASCII."""
    eq = n.attrs.get("equation")
    if eq is None or eq.type != onnx.AttributeProto.STRING:
        return None
    try:
        text = eq.s.decode("ascii").replace(" ", "")
    except UnicodeDecodeError:
        return f"attribute 'equation' {eq.s!r} is not ASCII"
    sides = text.split("->")
    ok = len(sides) <= 2 and all(_EINSUM_TERM.fullmatch(t) for t in sides[0].split(","))
    if ok and len(sides) == 2:
        ok = _EINSUM_TERM.fullmatch(sides[1]) is not None
    if not ok:
        return f"attribute 'equation' {text!r} is not an einsum equation (like 'ij,jk->ik')"
    return None


def _extent_fits(n: _Node):
    """The padded kernel extent ``(k - 1) * d + 1 + pads`` of each axis must be an int64, as every
    kernel's size arithmetic assumes (onnxruntime: an integer-overflow error)."""
    kernel = n.ints("kernel_shape")
    if not kernel:
        return None
    dil = n.ints("dilations") or [1] * len(kernel)
    pads = n.ints("pads") or [0] * (2 * len(kernel))
    k = len(kernel)
    for d in range(min(k, len(dil))):
        extent = (kernel[d] - 1) * dil[d] + 1
        extent += sum(p for p in (pads[d:d + 1] + pads[d + k:d + k + 1]) if p > 0)
        if extent > INT64_MAX:
            return (f"attributes 'kernel_shape' {kernel}, 'dilations' {dil} and 'pads' {pads} give axis {d} "
                    f"an extent of {extent}, past int64")
    return None


def _kernel_matches_w(n: _Node):
    """A convolution's ``kernel_shape`` must be W's spatial shape where W's shape is known here
    (onnxruntime refuses the node: "kernel_shape is not compatible with W shape"); the kernels
    read W's shape, so a mismatch would run a different model (the provider checks at run time
    what is only known then)."""
    kernel = n.ints("kernel_shape")
    if kernel is None:
        return None
    op = n.proto.op_type
    w = n.input_shape(3 if op == "QLinearConv" else 1)
    if w is None or len(w) < 3:
        return None
    spatial = list(w[2:])
    if len(kernel) != len(spatial) or any(d is not None and k != d for k, d in zip(kernel, spatial)):
        return (f"attribute 'kernel_shape' {kernel} is not compatible with W's shape {list(w)} "
                f"(its spatial axes {spatial}); drop the attribute or make it {spatial}")
    return None


def _known(shape) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)


def _same_pads(size: int, window: int, stride: int) -> int:
    """The total padding SAME_UPPER / SAME_LOWER give an axis (output ``ceil(size / stride)``)."""
    return max(0, (-(-size // stride) - 1) * stride + window - size)


def _window_fits(n: _Node):
    """With the input's and the kernel's shapes known, a geometry onnxruntime refuses when it runs
    the node (the kernels refuse it at run where shapes are only known then): a Conv,
    ConvInteger or QLinearConv window larger than an axis's padded input ("Invalid input shape");
    a pool's empty non-batch axis or an output size formula gone negative; a ConvTranspose
    output axis <= 0."""
    op = n.proto.op_type
    x = n.input_shape(0)
    if x is None or not _known(x) or len(x) < 3:
        return None
    sp = x[2:]
    nd = len(sp)
    w = n.input_shape(3 if op == "QLinearConv" else 1) if op not in _POOL_OPS else None
    kernel = n.ints("kernel_shape") or (list(w[2:]) if w is not None and _known(w) and len(w) == len(x) else None)
    if not kernel or len(kernel) != nd:
        return None
    strides = n.ints("strides") or [1] * nd
    dil = n.ints("dilations") or [1] * nd
    if len(strides) != nd or len(dil) != nd or min(strides) <= 0 or min(dil) <= 0:
        return None  # other rules' business
    window = [(kernel[i] - 1) * dil[i] + 1 for i in range(nd)]
    auto_pad = n.string("auto_pad") or "NOTSET"
    pads = n.ints("pads") if auto_pad == "NOTSET" else None
    pads = pads if pads and len(pads) == 2 * nd else [0] * (2 * nd)
    if op == "ConvTranspose":
        shape = n.ints("output_shape")
        if shape:
            bad = [v for v in shape[-nd:] if v <= 0]
            return f"attribute 'output_shape' {shape} must be positive" if bad else None
        opad = n.ints("output_padding") or [0] * nd
        if len(opad) != nd:
            return None
        for i in range(nd):
            out = sp[i] * strides[i] if auto_pad.startswith("SAME") else (
                strides[i] * (sp[i] - 1) + opad[i] + window[i] - pads[i] - pads[i + nd])
            if out <= 0:
                return f"the output's axis {i} would have size {out} (input shape {list(x)}), must be positive"
        return None
    if op in _POOL_OPS and x[0] != 0 and 0 in x[1:]:
        return f"input shape {list(x)} is invalid: only the batch dimension may be 0"
    for i in range(nd):
        total = _same_pads(sp[i], window[i], strides[i]) if auto_pad.startswith("SAME") else pads[i] + pads[i + nd]
        span = sp[i] + total - window[i]
        if op not in _POOL_OPS and span < 0:
            return (f"input shape {list(x)} is invalid: the kernel window of axis {i} ({window[i]} wide, "
                    f"'kernel_shape' {kernel}, 'dilations' {dil}) is larger than the padded input "
                    f"({sp[i]} + pads {total})")
        if op in _POOL_OPS and span <= -2 * strides[i]:
            return (f"the output size of axis {i} is negative: input {sp[i]}, pads {total}, window {window[i]} "
                    f"('kernel_shape' {kernel}, 'dilations' {dil}), stride {strides[i]}")
    return None


_POOL_OPS = frozenset({"MaxPool", "AveragePool", "LpPool"})


def _batch_dims(n: _Node):
    b = n.int("batch_dims")
    if b is None:
        return None
    shapes = [n.input_shape(0), n.input_shape(1)]
    ranks = [len(s) for s in shapes if s is not None]
    if b < 0 or (ranks and b >= min(ranks)):
        bound = f" smaller than the inputs' ranks {ranks}" if ranks else ""
        return f"attribute 'batch_dims' must be non-negative{bound}, got {b}"
    return None


def _split_outputs(n: _Node):
    """``num_outputs`` must be the node's output count (onnx's inference and onnxruntime abort)."""
    num = n.int("num_outputs")
    if num is not None and num != len(n.proto.output):
        return f"attribute 'num_outputs' is {num}, but the node has {len(n.proto.output)} outputs"
    return None


def _known_attrs(op: str, known: frozenset[str]) -> Rule:
    """A contrib op's schema in onnxruntime: an attribute it does not declare is refused at load
    (onnx's checker does not know these schemas), in onnxruntime's words."""
    def rule(n: _Node):
        extra = sorted(a for a in n.attrs if a not in known)
        return f"Unrecognized attribute: {extra[0]} for operator {op}" if extra else None
    return rule


_CONV = (_positive("strides"), _positive("dilations"), _positive("kernel_shape"), _non_negative("pads"),
         _extent_fits, _window_fits)
_POOL = _CONV + (_pads_rank, _pads_smaller_than_kernel)
_CONV_W = (_kernel_matches_w,)  # before the geometry rules: they read kernel_shape

#: (domain, op type) -> the rules its nodes must pass; the domain is "" for ai.onnx
RULES: dict[tuple[str, str], tuple[Rule, ...]] = {
    ("", "Conv"): _CONV_W + _CONV + (_pads_rank, _conv_bias),
    ("", "ConvInteger"): _CONV_W + _CONV + (_pads_rank,),
    ("", "QLinearConv"): _CONV_W + _CONV + (_pads_rank,),
    ("", "ConvTranspose"): _CONV_W + _CONV + (_pads_rank, _non_negative("output_padding"), _conv_bias),
    ("com.microsoft", "FusedConv"): _CONV_W + _CONV + (_pads_rank,),
    ("", "MaxPool"): _POOL,
    ("", "AveragePool"): _POOL,
    ("", "LpPool"): _POOL,
    ("", "MaxUnpool"): (_positive("strides"), _positive("kernel_shape"), _non_negative("pads")),
    ("", "LSTM"): (_rnn(4),),
    ("", "GRU"): (_rnn(3),),
    ("", "RNN"): (_rnn(1),),
    ("", "Einsum"): (_einsum_equation,),
    ("", "Split"): (_split_outputs,),
    # onnx 1.23.2's inference crashes (SIGSEGV) on batch_dims = -2**31
    ("", "GatherND"): (_batch_dims,),
    # even sizes are valid ONNX (onnxruntime refuses them; the onnx reference computes them)
    ("", "LRN"): (_positive("size"),),
    # onnx 1.23.2's inference crashes (SIGSEGV) on axis = 2**31
    ("", "LayerNormalization"): (_axis_in_rank,),
    # skl2onnx writes p for a minkowski CDist: onnxruntime's schema has metric only
    ("com.microsoft", "CDist"): (_known_attrs("CDist", frozenset({"metric"})),),
}


def _tensor_attrs(n: _Node):
    """Every node: a tensor attribute (Constant's ``value``, ...) of an element type onnx knows."""
    for a in n.attrs.values():
        if a.type == onnx.AttributeProto.TENSOR:
            tensors = [a.t]
        elif a.type == onnx.AttributeProto.TENSORS:
            tensors = list(a.tensors)
        elif a.type == onnx.AttributeProto.SPARSE_TENSOR:
            tensors = [a.sparse_tensor.values, a.sparse_tensor.indices]
        else:
            continue
        for t in tensors:
            if t.data_type not in _ELEM_TYPES:
                return f"attribute {a.name!r} holds a tensor of unknown element type {t.data_type}"
    return None


_ELEM_TYPES = frozenset(v for v in onnx.TensorProto.DataType.values() if v != onnx.TensorProto.UNDEFINED)

#: rules every node must pass, whatever its op
COMMON_RULES: tuple[Rule, ...] = (_tensor_attrs,)


def _shape_of(t: onnx.TypeProto) -> tuple | None:
    if t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in t.tensor_type.shape.dim)


class _Shapes:
    """Where a graph's values get their shapes (value infos, initializers, Constant nodes),
    indexed on first use and read per name: most nodes never ask, and reading every
    initializer's dims would cost more than the rules."""

    __slots__ = ("_where", "graph", "outer")

    def __init__(self, graph: onnx.GraphProto, outer: _Shapes | None):
        self.graph, self.outer, self._where = graph, outer, None

    def get(self, name: str) -> tuple | None:
        if self._where is None:
            g = self.graph
            where: dict = {}
            for vi in list(g.input) + list(g.value_info) + list(g.output):
                where[vi.name] = vi
            for t in g.initializer:
                where[t.name] = t
            for n in g.node:
                if n.op_type == "Constant" and n.output:
                    where[n.output[0]] = n
            self._where = where
        src = self._where.get(name)
        if src is None:
            return self.outer.get(name) if self.outer is not None else None
        if isinstance(src, onnx.ValueInfoProto):
            return _shape_of(src.type)
        if isinstance(src, onnx.TensorProto):
            return tuple(src.dims)
        for a in src.attribute:  # a Constant node: its value's dims
            if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                return tuple(a.t.dims)
        return None


_SUBGRAPH_OR_TENSOR = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS, onnx.AttributeProto.TENSOR,
                       onnx.AttributeProto.TENSORS, onnx.AttributeProto.SPARSE_TENSOR)


def _walk(g: onnx.GraphProto, outer: _Shapes | None, origin: str, prefix: str = "") -> None:
    shapes = _Shapes(g, outer)
    for idx, n in enumerate(g.node):
        op = n.op_type
        domain = n.domain
        rules = RULES.get(("" if domain == "ai.onnx" else domain, op), ())
        special = [a for a in n.attribute if a.type in _SUBGRAPH_OR_TENSOR]
        if not rules and not special:
            continue
        name = prefix + (n.name or f"{op}_{idx}")
        node = _Node(n, name, shapes)
        for rule in COMMON_RULES + rules:
            why = rule(node)
            if why:
                raise InvalidModelError(f"{origin}: node {name!r} ({op}): {why}")
        for a in special:
            subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else (
                list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else [])
            for sg in subs:
                _walk(sg, shapes, origin, f"{name}/{a.name}/")


def validate_model(model: onnx.ModelProto, origin: str = "the model") -> None:
    """Refuse attributes onnxruntime refuses at session creation (see :data:`RULES`): an
    :class:`InvalidModelError` naming the node, its op and the attribute."""
    _walk(model.graph, None, origin)


def _opsets(model: onnx.ModelProto) -> dict[str, int]:
    return {("" if i.domain == "ai.onnx" else i.domain): i.version for i in model.opset_import}


#: attributes whose int64 extremes are ordinary (Slice-1's open ends are INT64_MAX)
_WIDE_INTS_OK = {("", "Slice"): {"starts", "ends"}}

#: INTS longer than this are data tables (tree node ids, ...), not shape-like: not scanned
_SHAPE_LIKE_MAX = 64


def _extreme_int(dom: str, n: onnx.NodeProto) -> str | None:
    """The first int attribute outside int32 (onnx's C++ inference narrows them: LayerNormalization
    axis, GatherND batch_dims, ... crashed on such values), else None."""
    ok = _WIDE_INTS_OK.get((dom, n.op_type), ())
    for a in n.attribute:
        if a.type == onnx.AttributeProto.INT:
            if not -INT32_MAX - 1 <= a.i <= INT32_MAX and a.name not in ok:
                return a.name
        elif (a.type == onnx.AttributeProto.INTS and len(a.ints) <= _SHAPE_LIKE_MAX and a.name not in ok
              and any(not -INT32_MAX - 1 <= v <= INT32_MAX for v in a.ints)):
            return a.name
    return None


def crash_prone(model: onnx.ModelProto) -> str | None:
    """Why onnx's C++ inference might crash on ``model``: the first node on :data:`KNOWN_CRASHES`
    for its opset, or with an int attribute outside int32 (as ``domain::op``), else None."""
    opsets = _opsets(model)
    listed = any(opsets.get(dom, 1) <= hi for (dom, _), hi in KNOWN_CRASHES.items() if dom in opsets)
    graphs = [model.graph] + [f for f in model.functions]
    while graphs:
        g = graphs.pop()
        for n in g.node:
            dom = "" if n.domain == "ai.onnx" else n.domain
            if listed:
                hi = KNOWN_CRASHES.get((dom, n.op_type))
                if hi is not None and opsets.get(dom, 1) <= hi:
                    return f"{dom or 'ai.onnx'}::{n.op_type}"
            if not n.attribute:
                continue
            wide = _extreme_int(dom, n)
            if wide is not None:
                return f"{dom or 'ai.onnx'}::{n.op_type} attribute {wide!r} outside int32"
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    graphs.append(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    graphs.extend(a.graphs)
    return None


_CHILD = """\
import struct, sys, onnx
r, w = sys.stdin.buffer, sys.stdout.buffer
while True:
    head = r.read(9)
    if len(head) < 9:
        break
    n, data_prop = struct.unpack("<QB", head)
    m = onnx.ModelProto()
    m.ParseFromString(r.read(n))
    try:
        out, ok = onnx.shape_inference.infer_shapes(m, check_type=False, strict_mode=False,
                                                    data_prop=bool(data_prop)).SerializeToString(), 1
    except Exception as exc:
        out, ok = f"{type(exc).__name__}: {exc}".encode("utf-8", "replace"), 0
    w.write(struct.pack("<QB", len(out), ok))
    w.write(out)
    w.flush()
"""


class _InferServer:
    """One long-lived child process that runs onnx's shape inference for crash-prone models:
    a session (or a fuzzer running thousands) pays the interpreter start-up once, not per
    model. A crash or a timeout there kills only the child; the next call starts a new one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._pid = 0  # the process that started the child: a forked copy starts its own
        self._err = None

    def _start(self) -> subprocess.Popen:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self._err = tempfile.TemporaryFile()
        self._proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._err, env=env, bufsize=0)
        self._pid = os.getpid()
        return self._proc

    def _stop(self) -> str:
        """Kill the child; the last line it wrote on stderr."""
        proc, self._proc = self._proc, None
        if proc is None:
            return ""
        proc.kill()
        proc.wait()
        for f in (proc.stdin, proc.stdout):
            f.close()
        last = ""
        if self._err is not None:
            self._err.seek(0)
            lines = self._err.read().decode("utf-8", "replace").strip().splitlines()
            last = lines[-1] if lines else ""
            self._err.close()
            self._err = None
        return f"exit code {proc.returncode}" + (f": {last}" if last else "")

    def _read(self, fd: int, n: int, deadline: float) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError(f"no answer within {INFER_TIMEOUT_S:.0f} s")
            chunk = os.read(fd, min(n - len(buf), 1 << 20))
            if not chunk:
                raise EOFError("the child process died")
            buf += chunk
        return bytes(buf)

    def infer(self, data: bytes, data_prop: bool) -> tuple[bytes | None, str]:
        """(the inferred model's bytes, "") or (None, why not)."""
        with self._lock:
            proc = self._proc
            if proc is None or self._pid != os.getpid() or proc.poll() is not None:
                if proc is not None and self._pid == os.getpid():
                    self._stop()
                proc = self._start()
            try:
                proc.stdin.write(struct.pack("<QB", len(data), int(data_prop)) + data)
                fd = proc.stdout.fileno()
                deadline = time.monotonic() + INFER_TIMEOUT_S
                n, ok = struct.unpack("<QB", self._read(fd, 9, deadline))
                out = self._read(fd, n, deadline)
            except (OSError, EOFError, TimeoutError, struct.error) as exc:
                return None, f"{exc}; {self._stop()}"
            return (out, "") if ok else (None, out.decode("utf-8", "replace"))

    def close(self) -> None:
        with self._lock:
            if self._proc is not None and self._pid == os.getpid():
                self._stop()


_SERVER = _InferServer()
atexit.register(_SERVER.close)


def _infer_in_child(model: onnx.ModelProto, why: str, data_prop: bool = True) -> onnx.ModelProto:
    out, err = _SERVER.infer(model.SerializeToString(), data_prop)
    if out is None:
        logger.warning("onnx shape inference failed in its child process (model has %s: %s); "
                       "continuing without it", why, err)
        return model
    inferred = onnx.ModelProto()
    try:
        inferred.ParseFromString(out)
    except Exception as exc:  # noqa: BLE001 - a garbled reply is the same as no reply
        logger.warning("shape inference's child process answered garbage (%s); continuing without it", exc)
        return model
    return inferred


_TREES = {("ai.onnx.ml", "TreeEnsembleRegressor"), ("ai.onnx.ml", "TreeEnsembleClassifier")}


def _tree_outputs(n: onnx.NodeProto, batch: onnx.TensorShapeProto.Dimension | None) -> list[onnx.ValueInfoProto]:
    """The types a tree ensemble's outputs have by its schema: the classifier's labels [N]
    (string or int64) and scores [N, ?], the regressor's [N, n_targets] (N from its input)."""
    def vi(name, elem, rest):
        t = onnx.helper.make_tensor_value_info(name, elem, None)
        dims = t.type.tensor_type.shape.dim
        first = dims.add()
        if batch is not None:
            first.CopyFrom(batch)
        for d in rest:
            e = dims.add()
            if d is not None:
                e.dim_value = d
        return t

    attrs = {a.name: a for a in n.attribute}
    out = []
    if n.op_type == "TreeEnsembleClassifier":
        labels = onnx.TensorProto.STRING if "classlabels_strings" in attrs else onnx.TensorProto.INT64
        if len(n.output) > 0 and n.output[0]:
            out.append(vi(n.output[0], labels, []))
        if len(n.output) > 1 and n.output[1]:
            out.append(vi(n.output[1], onnx.TensorProto.FLOAT, [None]))
    elif n.output and n.output[0]:
        targets = attrs["n_targets"].i if "n_targets" in attrs else None
        out.append(vi(n.output[0], onnx.TensorProto.FLOAT, [targets]))
    return out


def _infer_around_trees(model: onnx.ModelProto, data_prop: bool) -> onnx.ModelProto | None:
    """onnx's inference in-process for a model that is crash-prone only through the tree
    ensembles of its main graph (every classic-ML export at ml opset <= 2): the trees are
    taken out, their outputs become graph inputs typed by :func:`_tree_outputs`, and the rest
    is inferred. ``model`` with the inferred types, or None where that does not apply (a tree
    in a subgraph or function, or another crash-prone node: the child process then)."""
    g = model.graph
    trees = [n for n in g.node if (n.domain or "ai.onnx", n.op_type) in _TREES]
    if not trees:
        return None
    known = {vi.name: vi for vi in list(g.input) + list(g.value_info)}
    stub = onnx.ModelProto()
    stub.CopyFrom(model)
    del stub.graph.node[:]
    stub.graph.node.extend(n for n in g.node if (n.domain or "ai.onnx", n.op_type) not in _TREES)
    typed = []
    for n in trees:
        src = known.get(n.input[0]) if n.input else None
        dims = src.type.tensor_type.shape.dim if src is not None and src.type.HasField("tensor_type") else []
        typed += _tree_outputs(n, dims[0] if len(dims) else None)
    listed = {i.name for i in stub.graph.input}
    stub.graph.input.extend(t for t in typed if t.name not in listed)
    if crash_prone(stub) is not None:
        return None
    inferred = onnx.shape_inference.infer_shapes(stub, check_type=False, strict_mode=False, data_prop=data_prop)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    outputs = {o.name for o in g.output}
    del out.graph.value_info[:]
    out.graph.value_info.extend(vi for vi in inferred.graph.value_info)
    out.graph.value_info.extend(t for t in typed if t.name not in outputs)
    del out.graph.output[:]
    out.graph.output.extend(inferred.graph.output)
    return out


def infer_shapes(model: onnx.ModelProto, data_prop: bool = True) -> onnx.ModelProto:
    """``onnx.shape_inference.infer_shapes`` (lenient, with data propagation unless
    ``data_prop`` is False), in a child process when the model holds an op on
    :data:`KNOWN_CRASHES` that cannot be taken out of the inference (tree ensembles in the main
    graph are typed by their schema instead: :func:`_infer_around_trees`). Raises what onnx
    raises in-process; a crash or failure in the child returns ``model`` as it is. The only
    door into onnx's shape inference."""
    why = crash_prone(model)
    if why is not None:
        around = _infer_around_trees(model, data_prop)
        return around if around is not None else _infer_in_child(model, why, data_prop)
    return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=data_prop)
