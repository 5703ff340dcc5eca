"""Seeded, time-bounded fuzzing of runtime-core: no input may crash, hang or raise an untyped error.

    python -m runtime_core.testing.fuzz --seed 7 --seconds 600 --out fuzz-findings
    nox -s fuzz -- --seconds 900          # the same from the repository's noxfile

Two families of cases, both a pure function of ``(seed, index)`` (:func:`make_case`):

* ``op``: single-op models aimed at the compiled and value-sized kernels (Conv plans, pools,
  LSTM/GRU/RNN, Attention, the norms, Gelu/Softmax, Gemm/MatMul, tree ensembles, and the ops
  whose output size comes from input values: Expand, ConstantOfShape, Tile, Range, Pad,
  Resize, OneHot), with attributes and feeds from valid to extreme (0, -1, 2**31, 2**62, ...),
  and the quantized ops (``quant``: :mod:`runtime_core.testing.fuzz_quant`);
* ``mutate``: the ONNX backend node-test models shipped with onnx (generated once into the
  conformance cache), one attribute or one feed changed (extreme ints, NaN/inf, shapes).

``--target quant,conv`` runs only those generators. ``--compare`` also runs each case on
onnxruntime (installed separately) and checks our outputs against its outputs where it computes
them (:func:`compare_outputs`); a difference is a ``mismatch`` finding.

Sessions use ``--providers`` (default: the CPU provider alone). Cases run in slices of
``--batch`` in ``--jobs`` worker children (``--worker``) at once, each under a memory limit
(``resource.setrlimit(RLIMIT_AS)``, default 4 GiB) with one intra-op thread and a per-case
tensor-size cap (``--max-tensor-mb``, default 256: a size bomb fails fast). A case ends as
``ok`` (a result, or an exception from :mod:`runtime_core.errors`), ``untyped`` (any other
exception), ``crash`` (the child died: a signal or an exit) or ``hang`` (no answer within
``--case-timeout``). The parent restarts the child after a crash or hang. For each finding it
writes a self-contained reproducer, ``<out>/<kind>-<seed>-<index>.py`` (the model and feeds
embedded; ``python FILE`` runs the case), and ``<out>/summary.json`` holds the counts (rewritten
after each finding and with each ``--progress`` line, so a killed run still reports).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import random
import select
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .fuzz_quant import NOT_COMPARED  # a case whose values onnxruntime is no reference for

F = TensorProto.FLOAT
I64 = TensorProto.INT64

#: ints from valid to extreme, mixed into attributes and shape-like feeds
EXTREME = [0, -1, -2, 2**31 - 1, 2**31, -(2**31), 2**32 + 1, 2**62, 2**63 - 1, -(2**63), 1 << 40]
SELFTEST_ENV = "RUNTIME_CORE_FUZZ_SELFTEST"
FLOAT_EXTREME = [0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1e38, -1e38, 1e-45]


@dataclass
class Case:
    """One fuzz case: a serialized model and its feeds."""

    family: str
    index: int
    what: str
    model: bytes
    feeds: dict = field(default_factory=dict)


# -- value pickers ---------------------------------------------------------------------------

def _i(rng: random.Random, valid, p_extreme: float = 0.15) -> int:
    return rng.choice(EXTREME) if rng.random() < p_extreme else rng.choice(list(valid))


def _ints(rng: random.Random, n: int, valid, p_extreme: float = 0.1) -> list[int]:
    if rng.random() < 0.05:  # a wrong length
        n = max(1, n + rng.choice([-1, 1, 2]))
    return [_i(rng, valid, p_extreme) for _ in range(n)]


def _f(rng: random.Random, lo: float, hi: float, p_extreme: float = 0.1) -> float:
    return rng.choice(FLOAT_EXTREME) if rng.random() < p_extreme else rng.uniform(lo, hi)


def _arr(nrng: np.random.Generator, shape, dtype=np.float32) -> np.ndarray:
    a = nrng.standard_normal(shape).astype(dtype)
    if a.size and nrng.random() < 0.05:
        a.flat[int(nrng.integers(a.size))] = nrng.choice([np.nan, np.inf, -np.inf])
    return a


def _dims(rng: random.Random, n: int, lo: int = 1, hi: int = 9) -> list[int]:
    return [0 if rng.random() < 0.03 else rng.randint(lo, hi) for _ in range(n)]


def _vi(name: str, arr_or_elem, shape=None):
    if isinstance(arr_or_elem, np.ndarray):
        elem = helper.np_dtype_to_tensor_dtype(arr_or_elem.dtype)
        return helper.make_tensor_value_info(name, elem, list(arr_or_elem.shape))
    return helper.make_tensor_value_info(name, arr_or_elem, shape)


def _model(nodes, feeds: dict, inits: dict, outputs: dict, opsets: dict | None = None) -> bytes:
    """The serialized model and its feeds. ``outputs``: name -> (elem type, rank); dims are
    symbolic (the checker wants a shape field)."""
    outs = [helper.make_tensor_value_info(n, et, [f"{n}_{k}" for k in range(rank)]) if rank is not None
            else helper.make_tensor_value_info(n, et, ["?"]) for n, (et, rank) in outputs.items()]
    g = helper.make_graph(list(nodes), "fuzz", [_vi(n, a) for n, a in feeds.items()], outs,
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    ops = [helper.make_opsetid(d, v) for d, v in (opsets or {"": 17}).items()]
    m = helper.make_model(g, opset_imports=ops)
    m.ir_version = 8 if max(v for d, v in (opsets or {"": 17}).items() if d == "") <= 18 else 10
    return m.SerializeToString(), dict(feeds)


# -- single-op generators (family "op") --------------------------------------------------------

def _gen_conv(rng, nrng):
    sp = rng.choice([1, 2, 2, 2, 3])
    n, group = rng.choice([1, 2]), 1
    cin = rng.choice([1, 2, 3, 4, 8])
    kind = rng.choice(["plain", "depthwise", "grouped", "pointwise", "transpose"])
    if kind == "depthwise":
        group = cin
    elif kind == "grouped" and cin % 2 == 0:
        group = 2
    m = rng.choice([1, 2, 4, 8]) * (group if kind != "depthwise" else rng.choice([1, 2]))
    k = [1] * sp if kind == "pointwise" else [rng.choice([1, 2, 3, 3, 5]) for _ in range(sp)]
    x = _arr(nrng, [n, cin] + _dims(rng, sp, 1, 12))
    op = "ConvTranspose" if kind == "transpose" else "Conv"
    w = _arr(nrng, ([cin, m // group] if op == "ConvTranspose" else [m, cin // group]) + k)
    attrs = {"kernel_shape": k if rng.random() < 0.8 else _ints(rng, sp, range(1, 4))}
    if group != 1:
        attrs["group"] = group
    if rng.random() < 0.6:
        attrs["strides"] = _ints(rng, sp, [1, 1, 2, 3])
    if rng.random() < 0.5:
        attrs["dilations"] = _ints(rng, sp, [1, 1, 2])
    if rng.random() < 0.3:
        attrs["auto_pad"] = rng.choice(["SAME_UPPER", "SAME_LOWER", "VALID", "NOTSET"])
    elif rng.random() < 0.6:
        attrs["pads"] = _ints(rng, 2 * sp, [0, 0, 1, 2])
    inits = {"w": w}
    ins = ["x", "w"]
    if rng.random() < 0.5:
        bshape = [m] if rng.random() < 0.9 else [m, 1]
        inits["b"] = _arr(nrng, bshape)
        ins.append("b")
    return _model([helper.make_node(op, ins, ["y"], **attrs)], {"x": x}, inits, {"y": (F, 2 + sp)}), op


def _gen_pool(rng, nrng):
    op = rng.choice(["MaxPool", "MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool"])
    sp = rng.choice([1, 2, 2, 3])
    x = _arr(nrng, [rng.choice([1, 2]), rng.choice([1, 3])] + _dims(rng, sp, 1, 12))
    attrs = {}
    if not op.startswith("Global"):
        attrs["kernel_shape"] = _ints(rng, sp, [1, 2, 3])
        if rng.random() < 0.6:
            attrs["strides"] = _ints(rng, sp, [1, 2, 3])
        if rng.random() < 0.5:
            attrs["pads"] = _ints(rng, 2 * sp, [0, 0, 1])
        if op == "MaxPool" and rng.random() < 0.4:
            attrs["dilations"] = _ints(rng, sp, [1, 2])
        if op != "LpPool" and rng.random() < 0.3:
            attrs["ceil_mode"] = rng.choice([0, 1])
        if op == "AveragePool" and rng.random() < 0.3:
            attrs["count_include_pad"] = rng.choice([0, 1])
        if rng.random() < 0.15:
            attrs["auto_pad"] = rng.choice(["SAME_UPPER", "SAME_LOWER", "VALID"])
    outs = ["y", "idx"] if op == "MaxPool" and rng.random() < 0.2 else ["y"]
    types = {"y": (F, 2 + sp), **({"idx": (I64, 2 + sp)} if len(outs) == 2 else {})}
    return _model([helper.make_node(op, ["x"], outs, **attrs)], {"x": x}, {}, types, {"": 19}), op


def _gen_rnn(rng, nrng):
    op = rng.choice(["LSTM", "GRU", "RNN"])
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    direction = rng.choice(["forward", "reverse", "bidirectional"])
    nd = 2 if direction == "bidirectional" else 1
    if rng.random() < 0.05:
        nd = 3 - nd
    hidden = _i(rng, [1, 2, 4, 8], 0.08)
    h = hidden if 0 < hidden < 64 else 4
    seq, batch, inp = rng.randint(1, 6), rng.randint(1, 3), rng.randint(1, 5)
    layout = _i(rng, [0, 0, 1], 0.05)
    x = _arr(nrng, [batch, seq, inp] if layout == 1 else [seq, batch, inp])
    inits = {"w": _arr(nrng, [nd, gates * h, inp]) * 0.3, "r": _arr(nrng, [nd, gates * h, h]) * 0.3}
    feeds = {"x": x}
    ins = ["x", "w", "r", "", ""]
    if rng.random() < 0.5:
        inits["b"] = _arr(nrng, [nd, 2 * gates * h])
        ins[3] = "b"
    if rng.random() < 0.4:
        lens = [rng.choice([seq, seq, rng.randint(0, seq), _i(rng, [1], 1.0)]) for _ in range(batch)]
        feeds["lens"] = np.array(lens, np.int64).astype(np.int32) if all(
            abs(v) < 2**31 for v in lens) else np.array([seq] * batch, np.int32)
        ins[4] = "lens"
    while ins and not ins[-1]:
        ins.pop()
    attrs = {"hidden_size": hidden, "direction": direction}
    if layout:
        attrs["layout"] = layout
    if rng.random() < 0.2:
        attrs["clip"] = _f(rng, 0.1, 5.0)
    if op == "GRU" and rng.random() < 0.5:
        attrs["linear_before_reset"] = rng.choice([0, 1])
    outs = ["y", "yh"] + (["yc"] if op == "LSTM" and rng.random() < 0.5 else [])
    types = {o: (F, 4 if o == "y" else 3) for o in outs}
    return _model([helper.make_node(op, ins, outs, **attrs)], feeds, inits, types), op


def _gen_attention(rng, nrng):
    b, s, kv = rng.randint(1, 2), rng.randint(1, 8), rng.randint(1, 8)
    heads = rng.choice([1, 2, 4])
    d = rng.choice([1, 4, 8])
    if rng.random() < 0.5:  # 4-D [B, heads, S, D]
        q, k, v = (_arr(nrng, [b, heads, s, d]), _arr(nrng, [b, heads, kv, d]), _arr(nrng, [b, heads, kv, d]))
        attrs = {}
        rank = 4
    else:  # 3-D [B, S, heads*D] with head counts as attributes
        q, k, v = (_arr(nrng, [b, s, heads * d]), _arr(nrng, [b, kv, heads * d]), _arr(nrng, [b, kv, heads * d]))
        attrs = {"q_num_heads": _i(rng, [heads], 0.1), "kv_num_heads": _i(rng, [heads], 0.1)}
        rank = 3
    if rng.random() < 0.4:
        attrs["is_causal"] = rng.choice([0, 1])
    if rng.random() < 0.3:
        attrs["scale"] = _f(rng, 0.01, 2.0)
    if rng.random() < 0.2:
        attrs["softcap"] = _f(rng, 0.0, 50.0)
    feeds = {"q": q, "k": k, "v": v}
    ins = ["q", "k", "v"]
    if rng.random() < 0.3:
        feeds["mask"] = (nrng.random([s, kv]) > 0.3) if rng.random() < 0.5 else _arr(nrng, [s, kv])
        ins.append("mask")
    node = helper.make_node("Attention", ins, ["y"], **attrs)
    return _model([node], feeds, {}, {"y": (F, rank)}, {"": 23}), "Attention"


def _gen_norm(rng, nrng):
    op = rng.choice(["LayerNormalization", "BatchNormalization", "InstanceNormalization",
                     "GroupNormalization", "RMSNormalization", "LRN"])
    r = rng.randint(2, 4)
    shape = [rng.randint(1, 3), rng.choice([1, 2, 4, 6])] + _dims(rng, r - 2, 1, 6)
    x = _arr(nrng, shape)
    c = shape[1]
    attrs = {}
    inits = {}
    ins = ["x"]
    outs = {"y": (F, r)}
    opset = {"": 23}
    if op in ("LayerNormalization", "RMSNormalization"):
        axis = _i(rng, range(-r, r), 0.15)
        attrs["axis"] = axis
        norm = shape[axis:] if -r <= axis < r else shape[-1:]
        inits["s"] = _arr(nrng, norm)
        ins.append("s")
        if op == "LayerNormalization" and rng.random() < 0.5:
            inits["bias"] = _arr(nrng, norm)
            ins.append("bias")
    elif op == "BatchNormalization":
        for n in ("s", "b", "mean"):
            inits[n] = _arr(nrng, [c])
        inits["var"] = np.abs(_arr(nrng, [c]))
        ins += ["s", "b", "mean", "var"]
    elif op == "InstanceNormalization":
        inits["s"], inits["b"] = _arr(nrng, [c]), _arr(nrng, [c])
        ins += ["s", "b"]
    elif op == "GroupNormalization":
        groups = _i(rng, [1, c], 0.15)
        attrs["num_groups"] = groups
        inits["s"], inits["b"] = _arr(nrng, [c]), _arr(nrng, [c])
        ins += ["s", "b"]
        opset = {"": 21}
    else:  # LRN
        attrs["size"] = _i(rng, [1, 3, 5], 0.2)
        opset = {"": 17}
    if op != "LRN" and rng.random() < 0.3:
        attrs["epsilon"] = _f(rng, 1e-6, 1e-2)
    return _model([helper.make_node(op, ins, ["y"], **attrs)], {"x": x}, inits, outs, opset), op


def _gen_act(rng, nrng):
    op = rng.choice(["Gelu", "Softmax", "LogSoftmax", "Hardmax", "Gelu"])
    r = rng.randint(1, 4)
    x = _arr(nrng, _dims(rng, r, 1, 9)) * rng.choice([1.0, 10.0, 1e4])
    attrs = {}
    if op == "Gelu":
        if rng.random() < 0.5:
            attrs["approximate"] = rng.choice(["none", "tanh"])
    else:
        attrs["axis"] = _i(rng, range(-r, r), 0.15)
    return _model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": x}, {}, {"y": (F, r)}, {"": 20}), op


def _gen_gemm(rng, nrng):
    if rng.random() < 0.5:
        m, k, n = _dims(rng, 3, 1, 40)
        ta, tb = rng.choice([0, 1]), rng.choice([0, 1])
        a = _arr(nrng, [k, m] if ta else [m, k])
        b = _arr(nrng, [n, k] if tb else [k, n])
        attrs = {"transA": ta, "transB": tb}
        if rng.random() < 0.3:
            attrs["alpha"] = _f(rng, -2, 2)
            attrs["beta"] = _f(rng, -2, 2)
        ins = ["a", "b"]
        inits = {"b": b} if rng.random() < 0.5 else {}
        feeds = {"a": a, **({} if inits else {"b": b})}
        if rng.random() < 0.6:
            inits["c"] = _arr(nrng, rng.choice([[n], [m, n], [1, n], [m, 1], []]))
            ins.append("c")
        return _model([helper.make_node("Gemm", ins, ["y"], **attrs)], feeds, inits, {"y": (F, 2)}), "Gemm"
    batch = _dims(rng, rng.randint(0, 2), 1, 3)
    m, k, n = _dims(rng, 3, 1, 64)
    a = _arr(nrng, batch + [m, k])
    w = _arr(nrng, [k, n])
    nodes = [helper.make_node("MatMul", ["a", "w"], ["t"]), helper.make_node("Add", ["t", "bias"], ["y"])]
    return _model(nodes, {"a": a}, {"w": w, "bias": _arr(nrng, [n])}, {"y": (F, len(batch) + 2)}), "Linear"


def _gen_tree(rng, nrng):
    """A random tree ensemble; ids are sometimes out of range or cyclic (the kernel must refuse)."""
    nfeat = rng.randint(1, 4)
    ntrees = rng.randint(1, 3)
    a = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_values",
                         "nodes_modes", "nodes_truenodeids", "nodes_falsenodeids")}
    leaves = []
    for t in range(ntrees):
        nn = rng.choice([1, 3, 7])
        for i in range(nn):
            leaf = 2 * i + 1 >= nn
            a["nodes_treeids"].append(t)
            a["nodes_nodeids"].append(i)
            a["nodes_featureids"].append(_i(rng, range(nfeat), 0.05))
            a["nodes_values"].append(_f(rng, -1, 1, 0.05))
            a["nodes_modes"].append("LEAF" if leaf else rng.choice(["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GT",
                                                                      "BRANCH_EQ", "BRANCH_NEQ", "BRANCH_GTE"]))
            a["nodes_truenodeids"].append(0 if leaf else _i(rng, [2 * i + 1], 0.05))
            a["nodes_falsenodeids"].append(0 if leaf else _i(rng, [2 * i + 2], 0.05))
            if leaf:
                leaves.append((t, i))
    x = _arr(nrng, [rng.randint(0, 5), nfeat])
    if rng.random() < 0.5:
        ntargets = rng.randint(1, 3)
        ids = [_i(rng, range(ntargets), 0.05) for _ in leaves]
        node = helper.make_node(
            "TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml", n_targets=ntargets,
            target_treeids=[t for t, _ in leaves], target_nodeids=[i for _, i in leaves], target_ids=ids,
            target_weights=[_f(rng, -1, 1, 0.02) for _ in leaves],
            aggregate_function=rng.choice(["SUM", "AVERAGE", "MIN", "MAX"]), **a)
        outs = {"y": (F, 2)}
    else:
        ncls = rng.randint(2, 3)
        node = helper.make_node(
            "TreeEnsembleClassifier", ["x"], ["label", "y"], domain="ai.onnx.ml",
            class_treeids=[t for t, _ in leaves], class_nodeids=[i for _, i in leaves],
            class_ids=[_i(rng, range(ncls), 0.05) for _ in leaves],
            class_weights=[_f(rng, 0, 1, 0.02) for _ in leaves], classlabels_int64s=list(range(ncls)),
            post_transform=rng.choice(["NONE", "SOFTMAX", "LOGISTIC"]), **a)
        outs = {"label": (I64, 1), "y": (F, 2)}
    return _model([node], {"x": x}, {}, outs, {"": 17, "ai.onnx.ml": 3}), node.op_type


def _shape_feed(rng, n, valid=(1, 2, 3)):
    return np.array([_i(rng, valid, 0.25) for _ in range(n)], np.int64)


def _gen_size(rng, nrng):
    """Ops whose output size comes from input values: shape bombs must be typed errors."""
    op = rng.choice(["Expand", "ConstantOfShape", "Tile", "Range", "Pad", "Resize", "OneHot"])
    as_init = rng.random() < 0.25  # a constant input: load-time folding sees it
    x = _arr(nrng, _dims(rng, 2, 1, 4))
    feeds, inits = {"x": x}, {}

    def put(name, arr):
        (inits if as_init else feeds)[name] = arr

    if op == "Expand":
        put("s", _shape_feed(rng, rng.randint(1, 3)))
        node = helper.make_node("Expand", ["x", "s"], ["y"])
        rank = None
    elif op == "ConstantOfShape":
        feeds.pop("x")
        put("s", _shape_feed(rng, rng.randint(1, 3)))
        node = helper.make_node("ConstantOfShape", ["s"], ["y"])
        rank = None
    elif op == "Tile":
        put("r", _shape_feed(rng, 2))
        node = helper.make_node("Tile", ["x", "r"], ["y"])
        rank = 2
    elif op == "Range":
        feeds.pop("x")
        for n, v in (("start", [0, 1]), ("limit", [5, 10]), ("delta", [1, 2, -1])):
            put(n, np.array(_i(rng, v, 0.2), np.int64))
        node = helper.make_node("Range", ["start", "limit", "delta"], ["y"])
        rank = 1
    elif op == "Pad":
        put("p", _shape_feed(rng, 4, (0, 1, 2)))
        node = helper.make_node("Pad", ["x", "p"], ["y"], mode=rng.choice(["constant", "reflect", "edge", "wrap"]))
        rank = 2
    elif op == "Resize":
        x = _arr(nrng, [1, 1] + _dims(rng, 2, 1, 4))
        feeds["x"] = x
        if rng.random() < 0.5:
            put("scales", np.array([1, 1] + [_f(rng, 0.5, 3, 0.2) for _ in range(2)], np.float32))
            ins = ["x", "", "scales"]
        else:
            put("sizes", _shape_feed(rng, 4, (1, 2, 5)))
            ins = ["x", "", "", "sizes"]
        node = helper.make_node("Resize", ins, ["y"], mode=rng.choice(["nearest", "linear", "cubic"]))
        rank = 4
    else:
        feeds["x"] = nrng.integers(-3, 6, _dims(rng, 2, 1, 4)).astype(np.int64)
        put("depth", np.array(_i(rng, [2, 5], 0.3), np.int64))
        inits["vals"] = np.array([0, 1], np.float32)
        node = helper.make_node("OneHot", ["x", "depth", "vals"], ["y"], axis=_i(rng, [-1, 0], 0.1))
        rank = 3
    return _model([node], feeds, inits, {"y": (F, rank)}, {"": 18}), op


def _gen_quant(rng, nrng):
    from .fuzz_quant import gen_quant

    return gen_quant(rng, nrng)


OP_GENERATORS = {
    "conv": _gen_conv, "pool": _gen_pool, "rnn": _gen_rnn, "attention": _gen_attention, "norm": _gen_norm,
    "act": _gen_act, "gemm": _gen_gemm, "tree": _gen_tree, "size": _gen_size, "quant": _gen_quant,
}


# -- mutations of the backend node tests (family "mutate") -------------------------------------

_NODE_CASES: list | None = None


def _node_cases() -> list:
    global _NODE_CASES
    if _NODE_CASES is None:
        from ..conformance.cases import load_cases

        _NODE_CASES = [c for c in load_cases(["node"]) if c.data_dirs]
    return _NODE_CASES


def _mutate_attr(rng, model: onnx.ModelProto) -> str:
    attrs = [(n, a) for n in model.graph.node for a in n.attribute
             if a.type in (onnx.AttributeProto.INT, onnx.AttributeProto.INTS, onnx.AttributeProto.FLOAT,
                           onnx.AttributeProto.FLOATS, onnx.AttributeProto.STRING)]
    if not attrs:
        return ""
    node, a = rng.choice(attrs)
    if a.type == onnx.AttributeProto.INT:
        a.i = rng.choice(EXTREME + [min(a.i + 1, 2**63 - 1), max(a.i - 1, -(2**63))])  # int64 bounds
    elif a.type == onnx.AttributeProto.INTS and len(a.ints):
        a.ints[rng.randrange(len(a.ints))] = rng.choice(EXTREME)
    elif a.type == onnx.AttributeProto.INTS:
        a.ints.extend([rng.choice(EXTREME)])
    elif a.type == onnx.AttributeProto.FLOAT:
        a.f = rng.choice(FLOAT_EXTREME)
    elif a.type == onnx.AttributeProto.FLOATS and len(a.floats):
        a.floats[rng.randrange(len(a.floats))] = rng.choice(FLOAT_EXTREME)
    elif a.type == onnx.AttributeProto.STRING:
        a.s = rng.choice([b"", b"\xff\xfe", b"bogus", a.s.upper()])
    else:
        return ""
    return f"{node.op_type}.{a.name}"


def _mutate_feed(rng, nrng, feeds: dict, model: onnx.ModelProto) -> str:
    # a huge Loop trip count is a legitimately long run (RunOptions.terminate stops it), not a hang
    trips = {n.input[0] for n in model.graph.node if n.op_type == "Loop" and n.input}
    names = [n for n, v in feeds.items() if isinstance(v, np.ndarray) and n not in trips]
    if not names:
        return ""
    name = rng.choice(names)
    v = feeds[name]
    how = rng.choice(["values", "shape", "dtype", "empty", "strided"])
    if how == "values" and v.size:
        v = v.copy()
        if v.dtype.kind == "f":
            v.flat[rng.randrange(v.size)] = rng.choice(FLOAT_EXTREME)
        elif v.dtype.kind in "iu":
            info = np.iinfo(v.dtype)
            v.flat[rng.randrange(v.size)] = rng.choice([info.min, info.max, 0, max(info.min, -1), min(info.max, 2**20)])
    elif how == "shape":
        shape = list(v.shape)
        if shape and rng.random() < 0.5:
            shape[rng.randrange(len(shape))] = rng.randint(0, 7)
        else:
            shape = shape + [1] if rng.random() < 0.5 else shape[1:]
        v = (np.resize(v, shape) if v.dtype != object else np.full(shape, "a", object))
    elif how == "dtype" and v.dtype.kind in "fiub":
        v = v.astype(rng.choice([np.float64, np.int32, np.int64, np.float16, np.uint8, np.bool_]))
    elif how == "empty":
        shape = list(v.shape) or [0]
        shape[rng.randrange(len(shape))] = 0
        v = np.zeros(shape, v.dtype)
    elif how == "strided" and v.ndim and v.size:
        v = np.broadcast_to(v.reshape(-1)[:1].reshape((1,) * v.ndim), tuple(max(d, 1) for d in v.shape))
    feeds[name] = v
    return f"feed {name} {how}"


def _gen_mutation(rng, nrng):
    cases = _node_cases()
    case = cases[rng.randrange(len(cases))]
    model = case.load_model()
    inputs, _ = case.data_sets()[0]
    inits = {i.name for i in model.graph.initializer}
    names = [v.name for v in model.graph.input if v.name not in inits]
    feeds = {n: v for n, v in zip(names, inputs)}
    what = []
    for _ in range(rng.choice([1, 1, 2])):
        what.append(_mutate_attr(rng, model) if rng.random() < 0.5 else _mutate_feed(rng, nrng, feeds, model))
    return model.SerializeToString(), feeds, f"{case.name}: {', '.join(w for w in what if w) or 'unchanged'}"


def make_case(seed: int, index: int, targets: tuple = ()) -> Case:
    """The case ``index`` of the run seeded ``seed`` (deterministic: a reproducer needs only these);
    ``targets`` (names of :data:`OP_GENERATORS`, or ``mutate``) narrows the run to those."""
    rng = random.Random(f"{seed}/{index}")
    nrng = np.random.default_rng([seed & 0xFFFFFFFF, index])
    if targets:
        gen = rng.choice(sorted(targets))
        if gen == "mutate":
            model, feeds, what = _gen_mutation(rng, nrng)
            return Case("mutate", index, what, model, feeds)
        (model, feeds), what = OP_GENERATORS[gen](rng, nrng)
        return Case("op", index, f"{gen}/{what}", model, feeds)
    if rng.random() < 0.6:
        gen = rng.choice(sorted(OP_GENERATORS))
        (model, feeds), what = OP_GENERATORS[gen](rng, nrng)
        return Case("op", index, f"{gen}/{what}", model, feeds)
    model, feeds, what = _gen_mutation(rng, nrng)
    return Case("mutate", index, what, model, feeds)


# -- running a case ----------------------------------------------------------------------------

def _oracle(case: Case):
    """onnxruntime's outputs for the case, or None where it refuses the model or the feeds."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.intra_op_num_threads = 1
    try:
        return ort.InferenceSession(case.model, so, providers=["CPUExecutionProvider"]).run(None, case.feeds)
    except Exception:  # noqa: BLE001 - any refusal: nothing to compare with
        return None


def compare_outputs(ours: list, ref: list) -> str | None:
    """Why ``ours`` differs from the oracle's ``ref``, or None: shapes and dtypes exactly; integer
    outputs within 1 (one quantization step: a rounding tie resolved in another float order);
    floats within 1e-3 of the output's largest magnitude; NaN where the oracle has NaN."""
    if len(ours) != len(ref):
        return f"{len(ours)} outputs, oracle {len(ref)}"
    for i, (a, b) in enumerate(zip(ours, ref)):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"output {i}: {a.dtype}{list(a.shape)}, oracle {b.dtype}{list(b.shape)}"
        if not a.size or a.dtype.kind not in "fiub":
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        nan = np.isnan(b64)
        if not np.array_equal(np.isnan(a64), nan):
            return f"output {i}: NaN at other positions than the oracle"
        with np.errstate(invalid="ignore"):
            diff = np.where(nan | (a64 == b64), 0.0, np.abs(a64 - b64))
        finite = np.abs(b64[np.isfinite(b64)])
        tol = 1.0 if a.dtype.kind in "iub" else 1e-3 * (1.0 + (float(finite.max()) if finite.size else 0.0))
        if float(diff.max()) > tol:
            j = int(diff.argmax())
            return f"output {i}: differs by {float(diff.max()):.6g} (> {tol:.3g}) at flat index {j}: {a64.flat[j]} vs oracle {b64.flat[j]}"
    return None


def run_case(case: Case, providers=("CPUExecutionProvider",), max_tensor_bytes: int = 0,
             compare: bool = False, on_oracle=None) -> tuple[str, str]:
    """``("ok", what)`` for a result or a typed error, ``("untyped", type: message)`` otherwise;
    ``max_tensor_bytes`` (0: the default) is the session's tensor-size cap. ``compare``: the
    result is checked against onnxruntime's where onnxruntime runs the case (``("mismatch",
    why)``); ``what`` then says ``result``, ``result+oracle``, ``refused+oracle`` (a typed error
    where onnxruntime computes) or ``result-oracle`` (onnxruntime refuses what we compute).
    ``on_oracle()`` is called once our side is done, before onnxruntime runs the case: a crash or
    hang after it is onnxruntime's, not ours."""
    import runtime_core as rt
    from runtime_core.errors import RuntimeCoreError

    try:
        so = rt.SessionOptions()
        so.intra_op_num_threads = 1
        if max_tensor_bytes:
            so.add_session_config_entry("session.max_tensor_bytes", str(max_tensor_bytes))
        sess = rt.InferenceSession(case.model, so, providers=list(providers))
        ours = sess.run(None, case.feeds)
        if not compare:
            return "ok", "result"
        if case.what.endswith(NOT_COMPARED):  # undefined values, or onnxruntime's are wrong
            return "ok", "result"
        if on_oracle:
            on_oracle()
        ref = _oracle(case)
        if ref is None:
            return "ok", "result-oracle"
        why = compare_outputs(ours, ref)
        return ("mismatch", why) if why else ("ok", "result+oracle")
    except RuntimeCoreError as exc:
        if compare and not case.what.endswith(NOT_COMPARED) and on_oracle:
            on_oracle()
        if compare and not case.what.endswith(NOT_COMPARED) and _oracle(case) is not None:
            return "ok", f"refused+oracle {type(exc).__name__}: {str(exc)[:200]}"
        return "ok", type(exc).__name__
    except Exception as exc:  # noqa: BLE001 - what the fuzzer is looking for
        tb = traceback.extract_tb(exc.__traceback__)
        where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
        return "untyped", f"{type(exc).__name__}{where}: {str(exc)[:300]}"


def _worker(seed: int, start: int, count: int, mem_bytes: int, providers=("CPUExecutionProvider",),
            max_tensor_bytes: int = 0, targets: tuple = (), compare: bool = False) -> None:
    """Run cases ``start .. start+count-1``; report each on stdout ("S i" before, "O i" once our
    side is done and onnxruntime runs it (``compare``), "R i status detail" after)."""
    import resource
    import warnings

    warnings.simplefilter("ignore")
    if mem_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
    out = sys.stdout
    # the fuzzer's own test makes case N crash, hang or raise untyped ("crash:N"): proof it notices
    selftest = dict(reversed(p.split(":")) for p in os.environ.get(SELFTEST_ENV, "").split(",") if ":" in p)
    for i in range(start, start + count):
        out.write(f"S {i}\n")
        out.flush()
        if selftest.get(str(i)) == "crash":
            os.abort()
        elif selftest.get(str(i)) == "oracle-crash":  # dies after our side, as onnxruntime's segfaults do
            out.write(f"O {i}\n")
            out.flush()
            os.abort()
        elif selftest.get(str(i)) == "hang":
            time.sleep(3600)
        elif selftest.get(str(i)) == "untyped":
            out.write(f"R {i} untyped selftest | ZeroDivisionError: selftest\n")
            out.flush()
            continue
        try:
            case = make_case(seed, i, targets)
        except Exception as exc:  # noqa: BLE001 - a generator bug is not a finding
            out.write(f"R {i} skip generator {type(exc).__name__}: {exc}\n".replace("\n", " ") + "\n")
            out.flush()
            continue
        def oracle_starts(i=i):
            out.write(f"O {i}\n")
            out.flush()

        status, detail = run_case(case, providers, max_tensor_bytes, compare, oracle_starts)
        out.write(f"R {i} {status} {case.family}:{case.what} | {detail}".replace("\n", " ") + "\n")
        out.flush()


# -- reproducers -------------------------------------------------------------------------------

_REPRO = '''"""runtime-core fuzz finding: {kind} (seed {seed}, case {index}: {what}).
{detail}
Usage: python {name} [rc|ort]"""
import base64, io, sys, numpy as np
MODEL = base64.b64decode({model!r})
FEEDS = dict(np.load(io.BytesIO(base64.b64decode({feeds!r})), allow_pickle=True))
which = (sys.argv[1:] or ["rc"])[0]
if which == "ort":
    import onnxruntime as rt
else:
    import runtime_core as rt
so = rt.SessionOptions()
if {cap}:  # the fuzz run's tensor-size cap
    so.add_session_config_entry("session.max_tensor_bytes", "{cap}")
sess = rt.InferenceSession(MODEL, so, providers={providers!r})
print([getattr(o, "shape", o) for o in sess.run(None, FEEDS)])
'''


def write_reproducer(out: Path, kind: str, seed: int, index: int, detail: str,
                     providers=("CPUExecutionProvider",), max_tensor_bytes: int = 0, targets: tuple = ()) -> Path:
    case = make_case(seed, index, targets)
    buf = io.BytesIO()
    np.savez(buf, **{k: (np.ascontiguousarray(v) if isinstance(v, np.ndarray) else np.asarray(v, dtype=object))
                     for k, v in case.feeds.items() if v is not None})
    name = f"{kind}-{seed}-{index}.py"
    path = out / name
    path.write_text(_REPRO.format(kind=kind, seed=seed, index=index, what=case.what, detail=detail[:2000],
                                  name=name, providers=list(providers), cap=max_tensor_bytes, model=base64.b64encode(case.model).decode(),
                                  feeds=base64.b64encode(buf.getvalue()).decode()))
    return path


# -- the driver --------------------------------------------------------------------------------

@dataclass
class Summary:
    seed: int
    cases: int = 0
    ok: int = 0
    crashes: int = 0
    hangs: int = 0
    untyped: int = 0
    mismatches: int = 0
    skipped: int = 0
    seconds: float = 0.0
    jobs: int = 1
    done: bool = False
    findings: list = field(default_factory=list)
    by_target: dict = field(default_factory=dict)
    #: with ``compare``: how cases ended against onnxruntime (result+oracle, refused+oracle, ...)
    oracle: dict = field(default_factory=dict)
    #: with ``compare``: cases whose child died or hung while onnxruntime ran them, after our
    #: side had finished (onnxruntime's crash, not ours: counted apart, with a reproducer)
    oracle_crashes: int = 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _spawn(seed, start, count, mem_bytes, providers, max_tensor_bytes=0, targets=(), compare=False):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    cmd = [sys.executable, "-m", "runtime_core.testing.fuzz", "--worker", "--seed", str(seed),
           "--start", str(start), "--count", str(count), "--memory-mb", str(mem_bytes >> 20),
           "--max-tensor-mb", str(max_tensor_bytes >> 20), "--providers", ",".join(providers)]
    if targets:
        cmd += ["--target", ",".join(targets)]
    if compare:
        cmd.append("--compare")
    # stderr goes to a file: a pipe nobody reads fills up over thousands of cases and blocks the child
    err = tempfile.TemporaryFile()
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env, bufsize=0), err


class _Child:
    """One worker child and the slice of cases ``[nxt, end)`` it still owes."""

    def __init__(self, spawned, start: int, end: int, case_timeout: float):
        (self.proc, self.err), self.nxt, self.end = spawned, start, end
        self.started: int | None = None
        self.in_oracle = False  # the started case's our side is done; onnxruntime runs it
        self.buf = b""
        self.deadline = time.monotonic() + case_timeout + 60  # the first case also pays the imports

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.err.close()
        self.proc.stdout.close()

    def last_error(self) -> str:
        """The last line the child wrote on stderr."""
        err = self.err
        err.seek(0)
        lines = err.read().decode("utf-8", "replace").strip().splitlines()
        return lines[-1][:300] if lines else ""


def fuzz(seed: int, seconds: float, out: Path, *, max_cases: int | None = None, batch: int = 1000,
         case_timeout: float = 20.0, mem_bytes: int = 4 << 30, providers=("CPUExecutionProvider",),
         jobs: int = 1, max_tensor_bytes: int = 256 << 20, progress: float = 60.0, log=print,
         targets: tuple = (), compare: bool = False) -> Summary:
    """Run cases ``0, 1, ...`` of ``seed`` in ``jobs`` worker children (slices of ``batch`` cases
    each) until ``seconds`` pass or ``max_cases`` ran. Findings (crashes, hangs, untyped errors)
    get a reproducer in ``out``; ``out/summary.json`` is rewritten after each finding and every
    ``progress`` seconds (a killed run still reports), with a progress line to ``log``.
    ``max_tensor_bytes`` (0: the runtime's default) caps each case's tensors, so that a case
    aimed at a size bomb fails fast. ``targets`` narrows the cases to those generators
    (:data:`OP_GENERATORS` names, ``mutate``); ``compare`` checks results against onnxruntime's
    where it runs the case (a difference is a finding, ``mismatch``)."""
    unknown = set(targets) - set(OP_GENERATORS) - {"mutate"}
    if unknown:
        raise ValueError(f"unknown fuzz target(s) {sorted(unknown)}; known: {sorted(OP_GENERATORS) + ['mutate']}")
    out.mkdir(parents=True, exist_ok=True)
    s = Summary(seed, jobs=jobs)
    t0 = time.monotonic()
    limit = max_cases if max_cases is not None else 1 << 62
    handed = 0  # the next case not yet given to any child
    children: list[_Child] = []
    last_note = t0

    def save():
        s.seconds = round(time.monotonic() - t0, 1)
        tmp = out / "summary.json.tmp"
        tmp.write_text(json.dumps(s.to_dict(), indent=1, sort_keys=True))
        os.replace(tmp, out / "summary.json")

    def record(kind, index, detail):
        path = write_reproducer(out, kind, seed, index, detail, providers, max_tensor_bytes, targets)
        s.findings.append({"kind": kind, "index": index, "detail": detail, "reproducer": path.name})
        save()
        log(f"{kind}: case {index}: {detail} -> {path}")

    def spawn(start, end):
        children.append(_Child(_spawn(seed, start, end - start, mem_bytes, providers, max_tensor_bytes, targets,
                                      compare),
                               start, end, case_timeout))

    def time_up():
        return time.monotonic() - t0 >= seconds

    def refill():
        nonlocal handed
        while len(children) < jobs and handed < limit and not time_up():
            end = min(handed + batch, limit)
            spawn(handed, end)
            handed = end

    def finish(c: _Child, rest_from: int | None):
        """``c`` is gone; a new child takes what it still owed from ``rest_from``."""
        children.remove(c)
        if rest_from is not None and rest_from < c.end and not time_up():
            spawn(rest_from, c.end)

    def lost(c: _Child, kind: str, why: str, err: str = ""):
        """``c`` died or hung in its started case: ours (``kind``), or onnxruntime's when our side
        had finished (``--compare``); a new child takes the rest of its slice."""
        s.cases += 1
        if c.in_oracle:
            s.oracle_crashes += 1
            record("oracle-crash", c.started, f"onnxruntime's run of it: {why}")
        else:
            if kind == "crash":
                s.crashes += 1
            else:
                s.hangs += 1
            record(kind, c.started, why + err)
        finish(c, c.started + 1)

    def handle(c: _Child, line: str):
        parts = line.split(" ", 3)
        if parts[0] == "S":
            c.started = int(parts[1])
            c.in_oracle = False
            c.deadline = time.monotonic() + case_timeout
        elif parts[0] == "O":
            c.in_oracle = True
        elif parts[0] == "R":
            i, status, detail = int(parts[1]), parts[2], parts[3] if len(parts) > 3 else ""
            c.started = None
            c.nxt = i + 1
            fam, _, rest = detail.partition(":")
            target = f"{fam}:{rest.split('/', 1)[0]}" if fam == "op" else fam
            s.by_target[target] = s.by_target.get(target, 0) + 1
            if status == "skip":
                s.skipped += 1
                return
            s.cases += 1
            if compare:
                how = detail.partition(" | ")[2].split(" ", 1)[0] if status == "ok" else status
                s.oracle[how] = s.oracle.get(how, 0) + 1
            if status == "ok":
                s.ok += 1
            elif status == "mismatch":
                s.mismatches += 1
                record("mismatch", i, detail)
            else:
                s.untyped += 1
                record("untyped", i, detail)

    save()
    refill()
    while children:
        now = time.monotonic()
        if progress and now - last_note >= progress:
            last_note = now
            el = now - t0
            log(f"{s.cases} cases in {el:.0f} s ({s.cases / max(el, 1e-9):.1f}/s, {jobs} jobs): "
                f"{s.crashes} crashes, {s.hangs} hangs, {s.untyped} untyped"
                + (f", {s.mismatches} mismatches, {s.oracle_crashes} onnxruntime crashes" if compare else ""))
            save()
        wait = min(c.deadline for c in children) - now
        if progress:
            wait = min(wait, last_note + progress - now)
        ready, _, _ = select.select([c.proc.stdout for c in children], [], [], max(0.0, wait))
        now = time.monotonic()
        for c in list(children):
            if c.proc.stdout in ready:
                chunk = os.read(c.proc.stdout.fileno(), 1 << 16)
                if not chunk:  # the child exited
                    rc = c.proc.wait()
                    err = c.last_error()
                    c.kill()
                    if c.started is not None:
                        lost(c, "crash", f"child exited with {rc}", f": {err}" if err else "")
                    elif c.nxt < c.end:  # died between cases (or before its first): skip one
                        finish(c, c.nxt + 1)
                    else:
                        finish(c, None)
                    continue
                c.buf += chunk
                *lines, c.buf = c.buf.split(b"\n")
                for line in lines:
                    handle(c, line.decode("utf-8", "replace"))
                if time_up() and c.started is None:  # between cases: stop here
                    c.kill()
                    finish(c, None)
                    continue
            if now >= c.deadline and c in children:  # hang (or a start-up that never finished)
                c.kill()
                if c.started is not None:
                    lost(c, "hang", f"no answer within {case_timeout:.0f} s")
                else:
                    finish(c, c.nxt + 1)
        refill()
    s.done = True
    save()
    return s


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m runtime_core.testing.fuzz", description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=None, help="default: a fresh one from the clock")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--cases", type=int, default=None, help="stop after this many cases")
    p.add_argument("--out", default="fuzz-findings")
    p.add_argument("--batch", type=int, default=1000, help="cases per child process")
    p.add_argument("--jobs", type=int, default=1, help="worker children running at once")
    p.add_argument("--max-tensor-mb", type=int, default=256,
                   help="each case's tensor-size cap (0: the runtime's default); a size bomb fails fast")
    p.add_argument("--progress", type=float, default=60.0, help="seconds between progress lines")
    p.add_argument("--case-timeout", type=float, default=20.0)
    p.add_argument("--memory-mb", type=int, default=4096)
    p.add_argument("--providers", default="CPUExecutionProvider", help="comma-separated, in priority order")
    p.add_argument("--target", default="", help="comma-separated generators to run only: "
                   + ", ".join(sorted(OP_GENERATORS) + ["mutate"]) + " (default: all)")
    p.add_argument("--compare", action="store_true",
                   help="check results against onnxruntime's where it runs the case (needs onnxruntime)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--count", type=int, default=1, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    seed = a.seed if a.seed is not None else int(time.time()) % 1_000_000
    providers = tuple(p for p in a.providers.split(",") if p)
    targets = tuple(t for t in a.target.split(",") if t)
    unknown = set(targets) - set(OP_GENERATORS) - {"mutate"}
    if unknown:
        p.error(f"unknown --target {','.join(sorted(unknown))}; known: {', '.join(sorted(OP_GENERATORS) + ['mutate'])}")
    if a.worker:
        _worker(seed, a.start, a.count, a.memory_mb << 20, providers, a.max_tensor_mb << 20, targets, a.compare)
        return 0
    s = fuzz(seed, a.seconds, Path(a.out), max_cases=a.cases, batch=a.batch, case_timeout=a.case_timeout,
             mem_bytes=a.memory_mb << 20, providers=providers, jobs=max(1, a.jobs),
             max_tensor_bytes=a.max_tensor_mb << 20, progress=a.progress, targets=targets, compare=a.compare)
    print(f"seed {s.seed}: {s.cases} cases in {s.seconds} s: {s.crashes} crashes, {s.hangs} hangs, "
          f"{s.untyped} untyped errors" + (f", {s.mismatches} mismatches, {s.oracle_crashes} onnxruntime crashes or hangs {s.oracle}" if a.compare else "")
          + f" ({s.skipped} generator skips); findings in {a.out}")
    return 1 if s.crashes or s.hangs or s.untyped or s.mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
