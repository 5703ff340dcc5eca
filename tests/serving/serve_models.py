"""Small real models for the serving tests, built with onnx.helper (seeded weights)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def cnn(path, channels: int = 8, size: int = 16, classes: int = 10, seed: int = 0) -> str:
    """A batchable CNN: x[N,3,size,size] -> Conv-Relu-MaxPool-Conv-Relu-GlobalAveragePool-Flatten-Gemm-Softmax
    -> probs[N,classes], plus logits[N,classes]."""
    rng = np.random.default_rng(seed)
    f = np.float32
    inits = [
        _init("w1", (rng.standard_normal((channels, 3, 3, 3)) * 0.3).astype(f)),
        _init("b1", (rng.standard_normal(channels) * 0.1).astype(f)),
        _init("w2", (rng.standard_normal((channels * 2, channels, 3, 3)) * 0.2).astype(f)),
        _init("b2", (rng.standard_normal(channels * 2) * 0.1).astype(f)),
        _init("wf", (rng.standard_normal((classes, channels * 2)) * 0.3).astype(f)),
        _init("bf", (rng.standard_normal(classes) * 0.1).astype(f)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["fl"], name="flatten"),
        helper.make_node("Gemm", ["fl", "wf", "bf"], ["logits"], name="fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=1),
    ]
    g = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", classes]),
         helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return str(path)


def mixed(path) -> str:
    """Two inputs of other types: a[K] int64 and s[K] bool -> where(s, a * 2, -a) int64, and a
    cast to float; fixed shapes nowhere batch-major (not batchable: a 1-D model)."""
    nodes = [
        helper.make_node("Add", ["a", "a"], ["twice"], name="add"),
        helper.make_node("Neg", ["a"], ["neg"], name="neg"),
        helper.make_node("Where", ["s", "twice", "neg"], ["y"], name="where"),
        helper.make_node("Cast", ["y"], ["yf"], name="cast", to=TensorProto.DOUBLE),
    ]
    g = helper.make_graph(
        nodes, "mixed", [helper.make_tensor_value_info("a", TensorProto.INT64, ["K"]),
                         helper.make_tensor_value_info("s", TensorProto.BOOL, ["K"])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, ["K"]),
         helper.make_tensor_value_info("yf", TensorProto.DOUBLE, ["K"])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return str(path)


def slow(path, steps: int = 12) -> str:
    """x[n,n] -> a chain of ``steps`` MatMul+Tanh: its run time grows as n**3 (timeouts, shutdown)."""
    nodes, prev = [], "x"
    for i in range(steps):
        nodes.append(helper.make_node("MatMul", [prev, "x"], [f"m{i}"], name=f"mm{i}"))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [f"t{i}"], name=f"tanh{i}"))
        prev = f"t{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"], name="out"))
    g = helper.make_graph(nodes, "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "n"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "n"])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, str(path))
    return str(path)


def strings(path) -> str:
    """s[K] string -> Identity -> t[K] string (the BYTES datatype both ways)."""
    g = helper.make_graph([helper.make_node("Identity", ["s"], ["t"], name="id")], "strings",
                          [helper.make_tensor_value_info("s", TensorProto.STRING, ["K"])],
                          [helper.make_tensor_value_info("t", TensorProto.STRING, ["K"])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, str(path))
    return str(path)


def wide(path, blocks: int = 400) -> str:
    """x[4] -> ``blocks`` times (Sin, Cos, Add): 3 * blocks nodes (a picture of 1000+ nodes)."""
    nodes, prev = [], "x"
    for i in range(blocks):
        nodes += [helper.make_node("Sin", [prev], [f"s{i}"], name=f"sin{i}"),
                  helper.make_node("Cos", [prev], [f"c{i}"], name=f"cos{i}"),
                  helper.make_node("Add", [f"s{i}", f"c{i}"], [f"a{i}"], name=f"add{i}")]
        prev = f"a{i}"
    g = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, str(path))
    return str(path)


def row_sum(path) -> str:
    """x[N,4] -> ReduceSum over axis 0 (keepdims) -> y declared [N,4]: looks batch-major, is not."""
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    g = helper.make_graph([helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="sum", keepdims=1)], "rowsum",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [axes])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, str(path))
    return str(path)


def log_scale(path, dtype=TensorProto.FLOAT) -> str:
    """x[N,4] -> y = Log(x) and z = 2 * x: Log makes NaN (x < 0) and -Infinity (x = 0) from finite
    inputs; z carries the non-finite values a request sends."""
    np_dt = helper.tensor_dtype_to_np_dtype(dtype)
    g = helper.make_graph([helper.make_node("Log", ["x"], ["y"], name="log"),
                           helper.make_node("Mul", ["x", "two"], ["z"], name="twice")], "logscale",
                          [helper.make_tensor_value_info("x", dtype, ["N", 4])],
                          [helper.make_tensor_value_info("y", dtype, ["N", 4]),
                           helper.make_tensor_value_info("z", dtype, ["N", 4])],
                          [_init("two", np.array(2, np_dt))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, str(path))
    return str(path)


def control_flow(path) -> str:
    """x[4] -> If(ReduceSum(x) > 0: then Mul(x, 2) -> Sin; else Neg) -> y, then Loop (3 trips) whose body
    adds x and holds a nested If: If, Loop and nested bodies to draw."""
    f = TensorProto.FLOAT
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t0"], name="t_mul"),
                                helper.make_node("Sin", ["t0"], ["t_out"], name="t_sin")], "then", [],
                               [helper.make_tensor_value_info("t_out", f, [4])],
                               [_init("two", np.array(2, np.float32))])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e_out"], name="e_neg")], "else", [],
                               [helper.make_tensor_value_info("e_out", f, [4])])
    in_then = helper.make_graph([helper.make_node("Add", ["acc", "x"], ["n_a"], name="n_add")], "nthen", [],
                                [helper.make_tensor_value_info("n_a", f, [4])])
    in_else = helper.make_graph([helper.make_node("Sub", ["acc", "x"], ["n_s"], name="n_sub")], "nelse", [],
                                [helper.make_tensor_value_info("n_s", f, [4])])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="b_cond"),
         helper.make_node("If", ["cond_in"], ["acc_out"], name="b_if", then_branch=in_then, else_branch=in_else)],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc", f, [4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", f, [4])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"], name="positive"),
             helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g, else_branch=else_g),
             helper.make_node("Loop", ["trips", "c", "y"], ["z"], name="repeat", body=body)]
    g = helper.make_graph(nodes, "control", [helper.make_tensor_value_info("x", f, [4])],
                          [helper.make_tensor_value_info("z", f, [4])],
                          [_init("zero", np.array(0, np.float32)), _init("trips", np.array(3, np.int64))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, str(path))
    return str(path)


def bert_layers(path, layers: int = 12, d: int = 32) -> str:
    """A BERT-style encoder of ``layers`` identical blocks exported from PyTorch (TorchScript exporter,
    opset 17): the repeated blocks of a real transformer export."""
    import io
    import warnings
    from pathlib import Path

    import torch
    from models.builders import _cls

    torch.manual_seed(0)
    m = _cls("Bert")(vocab=100, d=d, heads=4, layers=layers, max_len=32).eval()
    ids = torch.randint(1, 100, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (ids, mask), buf, dynamo=False, opset_version=17,
                          input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state", "pooler"],
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}})
    Path(path).write_bytes(buf.getvalue())
    return str(path)
