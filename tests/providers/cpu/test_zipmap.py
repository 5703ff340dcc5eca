"""ZipMap's per-node row builder (one dict display compiled from the labels) against onnxruntime:
labels that need quoting, negative and large integers, more labels than the display takes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import runtime_core as rt
from runtime_core.errors import ExecutionError

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the test oracle")


def _zipmap(n_cols, **labels) -> bytes:
    strings = "classlabels_strings" in labels
    node = helper.make_node("ZipMap", ["X"], ["Z"], domain="ai.onnx.ml", **labels)
    key = TensorProto.STRING if strings else TensorProto.INT64
    out = helper.make_value_info("Z", helper.make_sequence_type_proto(helper.make_map_type_proto(
        key, helper.make_tensor_type_proto(TensorProto.FLOAT, []))))
    g = helper.make_graph([node], "zipmap", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, n_cols])],
                          [out])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)])
    m.ir_version = 8
    return m.SerializeToString()


@pytest.mark.parametrize("labels", [
    {"classlabels_strings": ["a'b", 'c"d', "e\\nf", "{g}", "ü"]},
    {"classlabels_int64s": [-3, 0, 2**40, 7, 1]},
    {"classlabels_int64s": list(range(70))},  # past the display's size: dict(zip(...))
], ids=["quoted-strings", "ints", "many"])
def test_zipmap_rows_match_onnxruntime(labels):
    k = len(next(iter(labels.values())))
    blob = _zipmap(k, **labels)
    X = np.random.default_rng(k).normal(size=(9, k)).astype(np.float32)
    sess = rt.InferenceSession(blob, providers=["cpu"])
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"X": X})[0]
    for _ in range(2):  # the first run compiles the builder, the second uses the node's cached one
        got = sess.run(None, {"X": X})[0]
        assert got == want


def test_zipmap_wrong_width_is_a_typed_error():
    blob = _zipmap(None, classlabels_int64s=[1, 2, 3])
    sess = rt.InferenceSession(blob, providers=["cpu"])
    sess.run(None, {"X": np.zeros((2, 3), np.float32)})
    with pytest.raises(ExecutionError, match="3 class labels"):
        sess.run(None, {"X": np.zeros((2, 4), np.float32)})
