"""The optimizer's symbolic shapes: the ``unk__N`` dims onnx shape inference makes up are
resolved only where the graph proves them (``shapes.refine_symbols``)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from runtime_core.graph import Graph
from runtime_core.optimizer.editor import Editor
from runtime_core.optimizer.shapes import fill_missing_shapes, refine_symbols


def _model(end_from: str, rows: int = 32):
    """emb [batch, seq, 8] + pos[0:k] of a [rows, 8] table, k = dim 1 of ``end_from``."""
    nodes = [helper.make_node("Gather", ["wte", "ids"], ["emb"]),
             helper.make_node("Shape", [end_from], ["shp"]),
             helper.make_node("Gather", ["shp", "one"], ["k"], axis=0),
             helper.make_node("Unsqueeze", ["k", "zero_ax"], ["k1"]),
             helper.make_node("Slice", ["pos", "zero_v", "k1", "zero_v"], ["p"]),
             helper.make_node("Add", ["emb", "p"], ["y"])]
    inits = [helper.make_tensor("wte", TensorProto.FLOAT, [10, 8], np.zeros(80, np.float32)),
             helper.make_tensor("pos", TensorProto.FLOAT, [rows, 8], np.zeros(rows * 8, np.float32)),
             helper.make_tensor("one", TensorProto.INT64, [], [1]),
             helper.make_tensor("zero_ax", TensorProto.INT64, [1], [0]),
             helper.make_tensor("zero_v", TensorProto.INT64, [1], [0])]
    inputs = [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
              helper.make_tensor_value_info("other", TensorProto.INT64, ["batch", "n"])]
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _shapes(end_from, rows=32):
    g = Graph(_model(end_from, rows))
    fill_missing_shapes(g)
    refine_symbols(g)
    ed = Editor(g, "t")
    return ed.shape("y"), ed.shape("p")


def _y_shape(end_from):
    return _shapes(end_from)[0]


def test_a_table_sliced_to_the_sequence_length_broadcasts_to_it():
    # pos[0:seq] has min(seq, 32) rows: where the Add runs that is seq
    assert _y_shape("ids") == ("batch", "seq", 8)


def test_a_slice_to_another_length_stays_unknown():
    # pos[0:n] with n another input's dim: nothing says n is seq (or 1)
    s = _y_shape("other")
    assert s[0] == "batch" and s[2] == 8 and s[1] not in ("seq", "n")
    assert _shapes("other")[1][0] not in ("seq", "n")


def test_the_sliced_table_itself_has_the_sequence_length_where_the_add_runs():
    # min(seq, 32) rows broadcast against seq: seq, or 32 < seq, which no seq broadcasts with
    assert _shapes("ids")[1] == ("seq", 8)


def test_a_sliced_table_of_one_row_stays_unknown():
    # min(seq, 1) is 1 for every seq: it broadcasts against any seq and is not seq
    y, p = _shapes("ids", rows=1)
    assert y == ("batch", "seq", 8) and p[0] != "seq"


def test_bert_embeddings_layer_norm_fuses_with_the_sliced_position_table(tmp_path):
    """TorchScript's BERT embeddings at opset 14 (word + token type + position rows sliced to the
    sequence length, then LayerNorm) fuse to SkipLayerNormalization as onnxruntime fuses them (the
    position rows' unknown dim had kept the decomposed norm), with onnxruntime's results."""
    import warnings

    import onnx
    import torch

    import runtime_core as rt
    from oracle import assert_close, run_oracle

    class Emb(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.word, self.pos, self.typ = (torch.nn.Embedding(50, 32), torch.nn.Embedding(40, 32),
                                             torch.nn.Embedding(2, 32))
            self.ln = torch.nn.LayerNorm(32)
            self.register_buffer("position_ids", torch.arange(40).expand((1, -1)))

        def forward(self, ids, types):
            pos = self.position_ids[:, :ids.shape[1]]
            return self.ln(self.word(ids) + self.typ(types) + self.pos(pos))

    torch.manual_seed(0)
    rng = np.random.default_rng(5)
    feeds = {"ids": rng.integers(0, 50, (2, 9)), "types": rng.integers(0, 2, (2, 9))}
    path = tmp_path / "emb.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Emb().eval(), (torch.from_numpy(feeds["ids"]), torch.from_numpy(feeds["types"])),
                          str(path), dynamo=False, opset_version=14, input_names=["ids", "types"],
                          output_names=["y"], dynamic_axes={"ids": {0: "batch", 1: "seq"},
                                                            "types": {0: "batch", 1: "seq"}})
    model = onnx.load(str(path))
    sess = rt.InferenceSession(model.SerializeToString(), providers=["cpu"])
    ops = [n.op_type for n in sess._graph.nodes]
    assert "SkipLayerNormalization" in ops and "ReduceMean" not in ops, ops
    for seq in (9, 1, 40):
        f = {k: rng.integers(0, 2, (2, seq)) for k in feeds}
        assert_close(sess.run(None, f), run_oracle(model, f), rtol=1e-4, atol=1e-5)


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
