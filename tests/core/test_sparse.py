"""Sparse tensors where the ONNX format allows them: a Constant's ``sparse_value`` and a graph's
``sparse_initializer``, both with linearized and coordinate indices, against onnxruntime."""

import numpy as np
import onnxruntime as ort  # the oracle
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt

L = rt.GraphOptimizationLevel


def _sparse(coords: bool):
    vals = numpy_helper.from_array(np.array([1.5, -2.0, 3.0], np.float32), "v")
    idx = np.array([[0, 1], [1, 1], [2, 1]], np.int64) if coords else np.array([1, 4, 7], np.int64)
    return helper.make_sparse_tensor(vals, numpy_helper.from_array(idx, "i"), [3, 3])


def _model(where: str, coords: bool) -> bytes:
    sp = _sparse(coords)
    nodes = [helper.make_node("Add", ["c", "x"], ["y"])]
    if where == "constant":
        nodes.insert(0, helper.make_node("Constant", [], ["c"], sparse_value=sp))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 3])])
    if where == "initializer":
        sp.values.name = "c"
        g.sparse_initializer.append(sp)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


@pytest.mark.parametrize("level", [L.ORT_DISABLE_ALL, L.ORT_ENABLE_ALL])
@pytest.mark.parametrize("coords", [False, True])
@pytest.mark.parametrize("where", ["constant", "initializer"])
def test_sparse_tensors_run_like_onnxruntime(where, coords, level):
    model = _model(where, coords)
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    so = rt.SessionOptions()
    so.graph_optimization_level = level
    got = rt.InferenceSession(model, so, providers=["cpu"]).run(None, {"x": x})[0]
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
    assert got[1, 1] == x[1, 1] - 2.0  # the sparse values landed where their indices say
