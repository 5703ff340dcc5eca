"""Chains of convolutions in the blocked layout (NCHW16c), as onnxruntime's NCHWc transformer.

A blocked tensor is ``[N][ceil(C / 16)][H * W][16]``: channels in blocks of 16 as the innermost
dimension, the lanes past C zero on entry (a padded lane may hold ``act(0)`` later: every reader
ignores it, as the packed weights of the padded channels are zero). There a 1x1 convolution is
a GEMM with the positions as rows and the channel blocks as lanes (``_native.nchwc_pointwise``:
no packing of x, no padded columns on a 7 x 7 plane), a depthwise tap one vector FMA a position
(``nchwc_depthwise``), squeeze-excite and the global mean passes over whole vectors
(``nchwc_se``).

:func:`regions` finds, in a compiled partition's steps, maximal runs of steps the blocked
kernels take (FusedConv / Conv 1x1 stride 1 and depthwise 3x3/5x5/7x7 stride 1 or 2 with their
Relu / Clip / HardSwish / HardSigmoid / Sigmoid / SiLU and residual ``Z``; ``SqueezeExcite``;
``GlobalAveragePool`` of a blocked value) and makes each one step (:class:`Region`): a reorder
in for each value entering the run, one out for each value leaving it. Plain sequential runs
execute the regions; profiled and parallel runs keep one step per node (the NCHW kernels), so a
profile still times each node. The weights are packed once when the partition compiles; the
per-shape program (sizes, buffers' shapes) is made on a region's first run at that shape.

Off with the session config entry ``session.cpu.nchwc`` = "0"; not used where the kernels are
not built (``_native.NCHWC`` 0: no AVX-512) nor under ``RUNTIME_CORE_CPU_NATIVE=0``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .policy import NATIVE as _native

#: the session config entry that turns the blocked path off ("0")
NCHWC_CONFIG = "session.cpu.nchwc"
#: fewest convolutions a run must hold to be worth its two reorders
MIN_CONVS = 3
#: an expand 1x1 whose only reader is a depthwise runs with it as one kernel (``nchwc_expand_dw``)
FUSE_EXPAND = True
BLOCK = 16
_MS = "com.microsoft"
_RC_FUSED = "runtime_core.fused"
_INF = float("inf")
#: activation -> (lo, hi, kind, alpha, beta) from its params: the clip, then ``activate``'s kind
_ACTS: dict[Any, Callable[[list], tuple]] = {
    None: lambda p: (-_INF, _INF, -1, 1.0 / 6.0, 0.5),
    "Relu": lambda p: (0.0, _INF, -1, 1.0 / 6.0, 0.5),
    "Clip": lambda p: (float(p[0]), float(p[1]), -1, 1.0 / 6.0, 0.5),
    "HardSwish": lambda p: (-_INF, _INF, 0, 1.0 / 6.0, 0.5),
    "HardSigmoid": lambda p: (-_INF, _INF, 1, float(p[0]), float(p[1])),
    "Sigmoid": lambda p: (-_INF, _INF, 2, 1.0 / 6.0, 0.5),
    "SiLU": lambda p: (-_INF, _INF, 3, 1.0 / 6.0, 0.5),
}
_ACT_PARAMS = {"Clip": 2, "HardSigmoid": 2}


def available() -> bool:
    """Whether the blocked kernels run here (the extension built, AVX-512)."""
    return _native is not None and bool(getattr(_native, "NCHWC", 0))


def enabled(partition) -> bool:
    """Whether this partition may run blocked regions: the kernels run here and the session's
    ``session.cpu.nchwc`` is not "0"."""
    config = getattr(partition, "config", None) or {}
    return available() and str(config.get(NCHWC_CONFIG, "1")).strip() != "0"


def blocks(c: int) -> int:
    """Blocks of 16 holding ``c`` channels."""
    return (int(c) + BLOCK - 1) // BLOCK


# -- layouts and packing --------------------------------------------------------------------

def to_blocked(x: np.ndarray, threads: int = 1) -> np.ndarray:
    """NCHW float32 ``x`` as ``[N][CB][H*W][16]``, the lanes past C zero."""
    n, c = x.shape[:2]
    hw = int(np.prod(x.shape[2:], dtype=np.int64))
    y = np.empty((n, blocks(c), hw, BLOCK), np.float32)
    _native.nchwc_reorder(np.ascontiguousarray(x, np.float32), y, (n, c, hw), True, threads)
    return y


def from_blocked(y: np.ndarray, c: int, spatial: tuple, threads: int = 1) -> np.ndarray:
    """Blocked ``y`` back as NCHW ``[N][c][*spatial]``."""
    n = y.shape[0]
    hw = y.shape[2]
    x = np.empty((n, c, *spatial), np.float32)
    _native.nchwc_reorder(x, y, (n, c, hw), False, threads)
    return x


def pack_pointwise(w: np.ndarray, b: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """A 1x1 convolution's weights ``[M][C](1, 1)`` as ``nchwc_pointwise`` reads them: pairs of
    output blocks ``[CIB*16][32]`` (the last ``[CIB*16][16]`` when the blocks are odd), zero rows
    and lanes past C and M; the bias padded to ``COB * 16``."""
    m, c = w.shape[:2]
    cib, cob = blocks(c), blocks(m)
    wt = np.zeros((cib * BLOCK, cob * BLOCK), np.float32)
    wt[:c, :m] = w.reshape(m, c).T
    groups = [wt[:, 32 * g:32 * g + 32] for g in range((cob + 1) // 2)]
    wp = np.concatenate([np.ascontiguousarray(g).ravel() for g in groups])
    bias = np.zeros(cob * BLOCK, np.float32)
    if b is not None:
        bias[:m] = b
    return wp, bias


def pack_depthwise(w: np.ndarray, b: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """A depthwise convolution's weights ``[C][1][KH][KW]`` as ``[CB][KH*KW][16]`` (zero lanes
    past C), the bias padded to ``CB * 16``."""
    c = w.shape[0]
    cb, taps = blocks(c), int(w.shape[2] * w.shape[3])
    wpad = np.zeros((cb * BLOCK, taps), np.float32)
    wpad[:c] = w.reshape(c, taps)
    wp = np.ascontiguousarray(wpad.reshape(cb, BLOCK, taps).transpose(0, 2, 1))
    bias = np.zeros(cb * BLOCK, np.float32)
    if b is not None:
        bias[:c] = b
    return wp, bias


# -- the nodes a region takes ---------------------------------------------------------------

def _text(v):
    return v.decode() if isinstance(v, bytes) else v


def _act_of(attrs, name="activation", params="activation_params"):
    """The node's activation as (lo, hi, kind, alpha, beta), or None where the kernels lack it."""
    act = _text(attrs.get(name))
    if act not in _ACTS:
        return None
    p = list(attrs.get(params) or [])
    if len(p) < _ACT_PARAMS.get(act, 0):
        return None
    return _ACTS[act](p)


@dataclass
class _Op:
    """One node of a region: ``kind`` pw / dw / se / gap (or ed: a pw and a dw made one), the value names it reads and writes,
    its packed constants and geometry."""

    kind: str
    x: str
    out: str
    z: str | None = None
    c_in: int = 0
    c_out: int = 0
    w: Any = None
    b: Any = None
    w2: Any = None
    b2: Any = None
    epi: tuple = ()
    gate: tuple = ()
    kernel: tuple = (1, 1)
    strides: tuple = (1, 1)
    pads: tuple = (0, 0, 0, 0)
    #: an expand + depthwise ("ed"): the depthwise's epilogue (``epi`` is the 1x1's)
    epi2: tuple = ()


def fuse_expand(ops: list[_Op], outputs: list[str]) -> list[_Op]:
    """``ops`` with each 1x1 (no residual) whose only reader is the next op, a depthwise, made one
    "ed" op: the expanded tensor is then never made whole (``nchwc_expand_dw``)."""
    readers: dict[str, int] = {}
    for op in ops:
        for name in (op.x, op.z):
            if name:
                readers[name] = readers.get(name, 0) + 1
    out, i = [], 0
    while i < len(ops):
        a = ops[i]
        b = ops[i + 1] if i + 1 < len(ops) else None
        if (b is not None and a.kind == "pw" and a.z is None and b.kind == "dw" and b.x == a.out
                and readers.get(a.out) == 1 and a.out not in outputs):
            out.append(_Op("ed", a.x, b.out, c_in=a.c_in, c_out=b.c_out, w=a.w, b=a.b, w2=b.w, b2=b.b, epi=a.epi,
                           epi2=b.epi, kernel=b.kernel, strides=b.strides, pads=b.pads))
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def _conv_op(node, consts) -> _Op | None:
    """A FusedConv or Conv node as a region op, or None where the blocked kernels do not take it."""
    a = node.attrs
    ins = list(node.inputs)
    if len(ins) < 2 or ins[1] not in consts or (len(ins) > 2 and ins[2] and ins[2] not in consts):
        return None
    w = consts[ins[1]]
    b = consts[ins[2]] if len(ins) > 2 and ins[2] else None
    if not isinstance(w, np.ndarray) or w.dtype != np.float32 or w.ndim != 4:
        return None
    if b is not None and (b.dtype != np.float32 or b.shape != (w.shape[0],)):
        return None
    epi = _act_of(a) if node.op_type == "FusedConv" else _ACTS[None]([])
    if epi is None or _text(a.get("auto_pad", "NOTSET")) not in ("NOTSET", None):
        return None
    if any(int(d) != 1 for d in (a.get("dilations") or ())):
        return None
    strides = tuple(int(s) for s in (a.get("strides") or (1, 1)))
    pads = tuple(int(p) for p in (a.get("pads") or (0, 0, 0, 0)))
    group = int(a.get("group") or 1)
    m, cg, kh, kw = (int(d) for d in w.shape)
    z = ins[3] if node.op_type == "FusedConv" and len(ins) > 3 and ins[3] else None
    if len(strides) != 2 or len(pads) != 4 or min(pads) < 0:
        return None
    if group == 1 and (kh, kw) == (1, 1) and strides == (1, 1) and pads == (0, 0, 0, 0):
        wp, bias = pack_pointwise(w, b)
        return _Op("pw", ins[0], node.outputs[0], z=z, c_in=cg, c_out=m, w=wp, b=bias, epi=epi)
    if (group == m and cg == 1 and kw in (3, 5, 7) and all(s in (1, 2) for s in strides) and z is None
            and pads[0] < kh and pads[1] < kw):
        wp, bias = pack_depthwise(w, b)
        return _Op("dw", ins[0], node.outputs[0], c_in=m, c_out=m, w=wp, b=bias, epi=epi, kernel=(kh, kw),
                   strides=strides, pads=pads)
    return None


def _se_op(node, consts) -> _Op | None:
    a = node.attrs
    ins = list(node.inputs) + [""] * 5
    if ins[1] not in consts or ins[3] not in consts or any(ins[i] and ins[i] not in consts for i in (2, 4)):
        return None
    w1, w2 = consts[ins[1]], consts[ins[3]]
    b1 = consts[ins[2]] if ins[2] else None
    b2 = consts[ins[4]] if ins[4] else None
    if any(v is not None and (not isinstance(v, np.ndarray) or v.dtype != np.float32) for v in (w1, w2, b1, b2)):
        return None
    cr, c = w1.shape[:2]
    if w1.shape != (cr, c, 1, 1) or w2.shape != (c, cr, 1, 1):
        return None
    if (b1 is not None and b1.shape != (cr,)) or (b2 is not None and b2.shape != (c,)):
        return None
    epi = _act_of(a)
    gate = _act_of(a, "gate", "gate_params")
    if epi is None or gate is None or _text(a.get("gate")) not in ("Sigmoid", "HardSigmoid"):
        return None
    return _Op("se", ins[0], node.outputs[0], c_in=c, c_out=c, w=np.ascontiguousarray(w1.reshape(cr, c)),
               b=b1, w2=np.ascontiguousarray(w2.reshape(c, cr)), b2=b2, epi=epi, gate=gate[2:])


def node_op(node, consts) -> _Op | None:
    """The region op for ``node`` (a NodeView), or None where the blocked kernels do not take it."""
    if any(d is not None and d != np.float32 for d in (getattr(i, "dtype", None) for i in node.input_info[:1])):
        return None
    if node.domain == _MS and node.op_type == "FusedConv" or node.domain in ("", "ai.onnx") and node.op_type == "Conv":
        return _conv_op(node, consts)
    if node.domain == _RC_FUSED and node.op_type == "SqueezeExcite":
        return _se_op(node, consts)
    if node.domain in ("", "ai.onnx") and node.op_type == "GlobalAveragePool" and node.outputs[0]:
        return _Op("gap", node.inputs[0], node.outputs[0])
    return None


# -- a region: one step for a run of nodes --------------------------------------------------

@dataclass
class RegionNode:
    """The node a region's step names (errors, partition report): the run's first and last."""

    name: str
    inputs: tuple
    outputs: tuple
    op_type: str = "NchwcRegion"
    domain: str = "runtime_core.nchwc"
    attrs: dict = field(default_factory=dict)
    members: tuple = ()


class Region:
    """Runs a region's ops on blocked buffers: called as a step kernel ``(ctx, *inputs)``,
    returns its outputs (NCHW) in ``outputs``' order."""

    def __init__(self, ops: list[_Op], inputs: list[str], outputs: list[str], threads: int,
                 members: list, template: list, slot_of: dict):
        self.ops = fuse_expand(ops, outputs) if FUSE_EXPAND else ops
        self.inputs = inputs
        self.outputs = outputs
        self.threads = max(1, int(threads))
        self._programs: dict = {}
        # the run's own steps and where they read: inputs the blocked program does not take
        # (not float32 NCHW, a window that does not fit) run them as they were
        self._members = members
        self._template = template
        self._in_slots = [slot_of[n] for n in inputs]
        self._out_slots = [slot_of[n] for n in outputs]

    def __call__(self, ctx, *args):
        key = tuple((getattr(a, "shape", None), getattr(a, "dtype", None)) for a in args)
        prog = self._programs.get(key)
        if prog is None:
            try:
                prog = self._program([a.shape for a in args], [a.dtype for a in args])
            except (ValueError, AttributeError):
                prog = self._steps
            self._programs[key] = prog
        return prog(args)

    def _steps(self, args):
        """The run's nodes as their own steps (the NCHW kernels)."""
        local = dict(zip(self._in_slots, args))
        template = self._template
        for fn, ctx, in_slots, out_slots, attrs, _, _ in self._members:
            res = fn(ctx, *[local[s] if s in local else template[s] for s in in_slots], **attrs)
            if type(res) is not tuple:
                res = (res,)
            for s, r in zip(out_slots, res):
                if s >= 0:
                    local[s] = r
        return tuple(local[s] for s in self._out_slots)

    def _program(self, shapes, dtypes):
        """The calls of one input signature: each op a closure over its sizes and packed weights."""
        th = self.threads
        nat = _native
        info: dict[str, tuple] = {}  # name -> (N, C, H, W) of a value known here
        for name, shape, dt in zip(self.inputs, shapes, dtypes):
            info[name] = tuple(shape) if len(shape) == 4 and dt == np.float32 else None
        blocked: set[str] = set()
        calls: list = []
        reads: list = []  # the slots each call reads
        slot: dict[str, int] = {}

        def idx(name):
            if name not in slot:
                slot[name] = len(slot)
            return slot[name]

        for i, name in enumerate(self.inputs):
            slot[name] = i

        def enter(name):
            """The blocked slot of ``name``, reordering it in where it arrives as NCHW."""
            if name in blocked:
                return slot["#" + name]
            shape = info.get(name)
            if shape is None:
                raise ValueError(f"blocked region: input {name!r} is not a float32 NCHW tensor")
            n, c, h, w = shape
            src, dst = slot[name], idx("#" + name)
            blocked.add(name)

            def reorder(v, src=src, dst=dst, n=n, c=c, hw=h * w, cb=blocks(c)):
                y = np.empty((n, cb, hw, BLOCK), np.float32)
                x = v[src]
                nat.nchwc_reorder(x if x.flags.c_contiguous else np.ascontiguousarray(x), y, (n, c, hw), True, th)
                v[dst] = y
            calls.append(reorder)
            reads.append((src,))
            return dst

        for op in self.ops:
            xs = enter(op.x)
            n, c, h, w = info[op.x]
            if op.kind != "gap" and c != op.c_in:
                raise ValueError(f"blocked region: {op.x!r} has {c} channels, the node takes {op.c_in}")
            if op.kind == "gap":
                dst = idx(op.out)

                def gap(v, xs=xs, dst=dst, n=n, c=c, hw=h * w):
                    y = np.empty((n, c, 1, 1), np.float32)
                    nat.nchwc_se(v[xs], None, None, None, None, y, (n, blocks(c), c, 1, hw),
                                 -_INF, _INF, -1, 0.0, 0.0, -1, 0.0, 0.0, th)
                    v[dst] = y
                calls.append(gap)
                reads.append((xs,))
                info[op.out] = (n, c, 1, 1)
                continue
            if op.kind == "pw":
                oh, ow = h, w
            elif op.kind in ("dw", "ed"):
                (kh, kw), (sh, sw), (pt, pl, pb, pr) = op.kernel, op.strides, op.pads
                oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
                if oh < 1 or ow < 1:
                    raise ValueError(f"blocked region: a {kh}x{kw} window does not fit {h}x{w}")
            else:
                oh, ow = h, w
            zs = None
            if op.z is not None:
                zs = enter(op.z)
                if info[op.z] != (n, op.c_out, oh, ow):
                    raise ValueError(f"blocked region: Z {op.z!r} of shape {info[op.z]} is not the output's")
            dst = idx("#" + op.out)
            info[op.out] = (n, op.c_out, oh, ow)
            blocked.add(op.out)
            cb_out, shape_out = blocks(op.c_out), (n, blocks(op.c_out), oh * ow, BLOCK)
            if op.kind == "pw":
                def pw(v, xs=xs, zs=zs, dst=dst, op=op, dims=(n, blocks(c), cb_out, h * w), shape=shape_out):
                    y = np.empty(shape, np.float32)
                    nat.nchwc_pointwise(v[xs], op.w, op.b, None if zs is None else v[zs], y, dims, *op.epi, th)
                    v[dst] = y
                calls.append(pw)
                reads.append((xs,) if zs is None else (xs, zs))
            elif op.kind == "dw":
                def dw(v, xs=xs, dst=dst, op=op, dims=(n, cb_out, h, w), out=(oh, ow), shape=shape_out):
                    y = np.empty(shape, np.float32)
                    nat.nchwc_depthwise(v[xs], op.w, op.b, y, dims, op.kernel, op.strides, op.pads[:2], out,
                                        *op.epi, th)
                    v[dst] = y
                calls.append(dw)
                reads.append((xs,))
            elif op.kind == "ed":
                def ed(v, xs=xs, dst=dst, op=op, dims=(n, blocks(c), cb_out, h, w), out=(oh, ow), shape=shape_out):
                    y = np.empty(shape, np.float32)
                    nat.nchwc_expand_dw(v[xs], op.w, op.b, op.w2, op.b2, y, dims, op.kernel, op.strides,
                                        op.pads[:2], out, op.epi, op.epi2, th)
                    v[dst] = y
                calls.append(ed)
                reads.append((xs,))
            else:
                def se(v, xs=xs, dst=dst, op=op, dims=(n, cb_out, c, op.w.shape[0], h * w), shape=shape_out):
                    y = np.empty(shape, np.float32)
                    nat.nchwc_se(v[xs], op.w, op.b, op.w2, op.b2, y, dims, *op.epi, *op.gate, th)
                    v[dst] = y
                calls.append(se)
                reads.append((xs,))
        outs = []
        for name in self.outputs:
            if name in blocked:
                n, c, h, w = info[name]
                src, dst = slot["#" + name], idx(name)

                def leave(v, src=src, dst=dst, n=n, c=c, h=h, w=w):
                    x = np.empty((n, c, h, w), np.float32)
                    nat.nchwc_reorder(x, v[src], (n, c, h * w), False, th)
                    v[dst] = x
                calls.append(leave)
                reads.append((src,))
            outs.append(slot[name])
        size = len(slot)
        n_in = len(self.inputs)
        # each buffer dropped after its last reader: the next one of its size reuses its memory,
        # still in cache, instead of the run holding every intermediate to its end
        last = {s: i for i, rd in enumerate(reads) for s in rd}
        frees: list[list[int]] = [[] for _ in calls]
        for s, i in last.items():
            if s not in outs:
                frees[i].append(s)
        plan = list(zip(calls, [tuple(f) for f in frees]))

        def run(args):
            v = list(args) + [None] * (size - n_in)
            for call, dead in plan:
                call(v)
                for s in dead:
                    v[s] = None
            return tuple(v[s] for s in outs)
        return run


def regions(steps, partition, slot_of: dict, template: list, threads: int, make_ctx) -> list:
    """The blocked regions of a partition's ``steps``: ``(first, last + 1, step)`` for each maximal
    run of steps the blocked kernels take that holds at least :data:`MIN_CONVS` convolutions, its
    ``step`` the one that replaces them (``make_ctx(region_node)`` gives its KernelContext)."""
    if not enabled(partition):
        return []
    consts = partition.constants
    reads_after: dict[str, int] = {}  # value -> the last step index reading it (bodies' outer reads too)
    for i, st in enumerate(steps):
        node = st[1].node
        for name in (*node.inputs, *(getattr(node, "implicit_inputs", None) or ())):
            if name:
                reads_after[name] = i
    graph_outputs = set(partition.outputs)
    found, run = [], []

    def close(run):
        ops = [op for _, op in run]
        if sum(op.kind in ("pw", "dw") for op in ops) < MIN_CONVS:
            return
        first, last = run[0][0], run[-1][0]
        produced = {op.out for op in ops}
        inputs: list[str] = []
        for op in ops:
            for name in (op.x, op.z):
                if name and name not in produced and name not in inputs:
                    inputs.append(name)
        outputs = [name for name in (op.out for op in ops)
                   if name in graph_outputs or reads_after.get(name, -1) > last]
        if not outputs:
            return
        members = tuple(steps[i][1].node.name for i in range(first, last + 1))
        node = RegionNode(f"nchwc[{members[0]}..{members[-1]}]", tuple(inputs), tuple(outputs), members=members)
        frees = tuple(sorted({s for i in range(first, last + 1) for s in steps[i][5]}))
        region = Region(ops, inputs, outputs, threads, [steps[i] for i in range(first, last + 1)], template, slot_of)
        step = (region, make_ctx(node), tuple(slot_of[n] for n in inputs),
                tuple(slot_of[n] for n in outputs), {}, frees, None)
        found.append((first, last + 1, step))

    produced_in_run: set[str] = set()
    for i, st in enumerate(steps):
        node = st[1].node
        op = node_op(node, consts)
        if op is not None and op.kind == "gap" and op.x not in produced_in_run:
            op = None
        if op is None:
            if run:
                close(run)
            run, produced_in_run = [], set()
            continue
        run.append((i, op))
        if op.kind != "gap":
            produced_in_run.add(op.out)
        else:  # the global mean leaves the blocked layout: it ends the run
            close(run)
            run, produced_in_run = [], set()
    if run:
        close(run)
    return found


def substitute(steps, found) -> list:
    """``steps`` with each region's run replaced by its one step."""
    if not found:
        return list(steps)
    out, i = [], 0
    for first, end, step in found:
        out.extend(steps[i:first])
        out.append(step)
        i = end
    out.extend(steps[i:])
    return out
