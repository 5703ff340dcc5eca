"""LayerScaleFusion: ConvNeXt's ``Transpose(MatMul(x, W) + b) * gamma`` -> the scale folded
into W and b; outputs equal onnxruntime's on the unoptimized graph, and the fold is left
alone where gamma is not on the channel axis or an intermediate has another reader."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt
from oracle import run_oracle

L = rt.GraphOptimizationLevel
RNG = np.random.default_rng(7)


def _model(gamma_shape=(6, 1, 1), perm=(0, 3, 1, 2), extra_reader=False, gamma_first=True):
    """x [2, 3, 5, 4] (NHWC) @ W [4, 6] + b, Transpose(perm), times gamma, plus a residual."""
    inits = [numpy_helper.from_array(RNG.standard_normal((4, 6)).astype(np.float32), "w"),
             numpy_helper.from_array(RNG.standard_normal(6).astype(np.float32), "b"),
             numpy_helper.from_array((RNG.standard_normal(gamma_shape) * 0.1).astype(np.float32), "g")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["b", "m"], ["a"]),
             helper.make_node("Transpose", ["a"], ["t"], perm=list(perm)),
             helper.make_node("Mul", ["g", "t"] if gamma_first else ["t", "g"], ["y"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["a"], ["r"]))
        outs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5, 4])],
                          outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _ops(m):
    feeds = {"x": RNG.standard_normal((2, 3, 5, 4)).astype(np.float32)}
    so = rt.SessionOptions()
    so.graph_optimization_level = L.ORT_ENABLE_ALL
    s = rt.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    for a, r in zip(s.run(None, feeds), run_oracle(m, feeds)):
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-5)
    return [n.op_type for n in s._graph.nodes]


@pytest.mark.parametrize("kw", [{}, {"gamma_first": False}, {"gamma_shape": (1, 6, 1, 1)}, {"gamma_shape": (1,)},
                                {"perm": (0, 1, 3, 2), "gamma_shape": (6, 1)}])
def test_layer_scale_folded(kw):
    assert "Mul" not in _ops(_model(**kw))


@pytest.mark.parametrize("kw", [{"gamma_shape": (1, 1, 5)}, {"perm": (0, 1, 3, 2), "gamma_shape": (5,)},
                                {"gamma_shape": (6, 3, 1)}, {"extra_reader": True}])
def test_layer_scale_left_alone(kw):
    assert "Mul" in _ops(_model(**kw))
