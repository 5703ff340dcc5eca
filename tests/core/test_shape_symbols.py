"""The optimizer's symbolic shapes: the ``unk__N`` dims onnx shape inference makes up are
resolved only where the graph proves them (``shapes.refine_symbols``)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from runtime_core.graph import Graph
from runtime_core.optimizer.editor import Editor
from runtime_core.optimizer.shapes import fill_missing_shapes, refine_symbols


def _model(end_from: str):
    """emb [batch, seq, 8] + pos[0:k] of a [32, 8] table, k = dim 1 of ``end_from``."""
    nodes = [helper.make_node("Gather", ["wte", "ids"], ["emb"]),
             helper.make_node("Shape", [end_from], ["shp"]),
             helper.make_node("Gather", ["shp", "one"], ["k"], axis=0),
             helper.make_node("Unsqueeze", ["k", "zero_ax"], ["k1"]),
             helper.make_node("Slice", ["pos", "zero_v", "k1", "zero_v"], ["p"]),
             helper.make_node("Add", ["emb", "p"], ["y"])]
    inits = [helper.make_tensor("wte", TensorProto.FLOAT, [10, 8], np.zeros(80, np.float32)),
             helper.make_tensor("pos", TensorProto.FLOAT, [32, 8], np.zeros(256, np.float32)),
             helper.make_tensor("one", TensorProto.INT64, [], [1]),
             helper.make_tensor("zero_ax", TensorProto.INT64, [1], [0]),
             helper.make_tensor("zero_v", TensorProto.INT64, [1], [0])]
    inputs = [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
              helper.make_tensor_value_info("other", TensorProto.INT64, ["batch", "n"])]
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _y_shape(end_from):
    g = Graph(_model(end_from))
    fill_missing_shapes(g)
    refine_symbols(g)
    return Editor(g, "t").shape("y")


def test_a_table_sliced_to_the_sequence_length_broadcasts_to_it():
    # pos[0:seq] has min(seq, 32) rows: where the Add runs that is seq
    assert _y_shape("ids") == ("batch", "seq", 8)


def test_a_slice_to_another_length_stays_unknown():
    # pos[0:n] with n another input's dim: nothing says n is seq (or 1)
    s = _y_shape("other")
    assert s[0] == "batch" and s[2] == 8 and s[1] not in ("seq", "n")


def _heads_chain(layers: int):
    """``layers`` times DistilBERT's head split and merge of [batch, seq, 8]: Reshape to 2 heads,
    Transpose there and back, Reshape to [Shape(x)[0], -1, 8] (onnx names each merge's -1 anew)."""
    nodes, x = [], "x"
    for i in range(layers):
        nodes += [helper.make_node("Shape", [x], [f"shp{i}"]),
                  helper.make_node("Gather", [f"shp{i}", "zero"], [f"b{i}"], axis=0),
                  helper.make_node("Unsqueeze", [f"b{i}", "zero_ax"], [f"b1{i}"]),
                  helper.make_node("Concat", [f"b1{i}", "minus_one", "eight"], [f"tgt{i}"], axis=0),
                  helper.make_node("Reshape", [x, "heads"], [f"h{i}"]),
                  helper.make_node("Transpose", [f"h{i}"], [f"t{i}"], perm=[0, 2, 1, 3]),
                  helper.make_node("Transpose", [f"t{i}"], [f"u{i}"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", [f"u{i}", f"tgt{i}"], [f"x{i + 1}"])]
        x = f"x{i + 1}"
    inits = [helper.make_tensor("zero", TensorProto.INT64, [], [0]),
             helper.make_tensor("zero_ax", TensorProto.INT64, [1], [0]),
             helper.make_tensor("minus_one", TensorProto.INT64, [1], [-1]),
             helper.make_tensor("eight", TensorProto.INT64, [1], [8]),
             helper.make_tensor("heads", TensorProto.INT64, [4], [0, 0, 2, 4])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])]
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), x


def test_a_chain_of_merged_heads_keeps_the_sequence_dim_through_every_layer():
    # each layer's -1 is a fresh unk__N that only the layer before it proves: six layers, six
    # symbols resolved one after another (a fixed number of rounds left the last layers unknown)
    m, y = _heads_chain(6)
    g = Graph(m)
    fill_missing_shapes(g)
    refine_symbols(g)
    ed = Editor(g, "t")
    assert [ed.shape(f"x{i}") for i in range(1, 7)] == [("batch", "seq", 8)] * 6
