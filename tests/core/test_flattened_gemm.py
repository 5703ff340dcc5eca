"""FlattenedGemmFusion: ``Reshape(Gemm(Reshape(x, [*, D]), W, c), [B, S, N])`` -> MatMul + Add,
outputs equal to the unoptimized graph; left alone where the Reshape back is not x's rows."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import runtime_core as rt
from oracle import run_oracle

L = rt.GraphOptimizationLevel
RNG = np.random.default_rng(5)


def _model(out_shape, trans_b=0, alpha=1.0, beta=1.0, bias_shape=(6,), dynamic=False):
    """x [2, 3, 4] flattened to [-1, 4], Gemm to 6 columns, reshaped to ``out_shape`` (a list,
    or "shape" for x.shape[:-1] + [6] computed from Shape(x))."""
    w = RNG.standard_normal((6, 4) if trans_b else (4, 6)).astype(np.float32)
    inits = [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.reshape(-1)),
             helper.make_tensor("c", TensorProto.FLOAT, bias_shape, RNG.standard_normal(bias_shape).astype(np.float32)),
             helper.make_tensor("flat", TensorProto.INT64, [2], [-1, 4])]
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["x2"]),
             helper.make_node("Gemm", ["x2", "w", "c"], ["g"], transB=trans_b, alpha=alpha, beta=beta)]
    if out_shape == "shape":
        inits += [helper.make_tensor("s0", TensorProto.INT64, [1], [0]),
                  helper.make_tensor("s2", TensorProto.INT64, [1], [2]),
                  helper.make_tensor("n", TensorProto.INT64, [1], [6])]
        nodes += [helper.make_node("Shape", ["x"], ["xs"]), helper.make_node("Slice", ["xs", "s0", "s2"], ["lead"]),
                  helper.make_node("Concat", ["lead", "n"], ["tgt"], axis=0)]
    else:
        inits.append(helper.make_tensor("tgt", TensorProto.INT64, [3], out_shape))
    nodes.append(helper.make_node("Reshape", ["g", "tgt"], ["y"]))
    dims = ["b", "s", 4] if dynamic else [2, 3, 4]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _ops(m, feeds):
    so = rt.SessionOptions()
    so.graph_optimization_level = L.ORT_ENABLE_ALL
    s = rt.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(s.run(None, feeds)[0], run_oracle(m, feeds)[0], rtol=1e-5, atol=1e-5)
    return [n.op_type for n in s._graph.nodes]


@pytest.mark.parametrize("kw", [{}, {"trans_b": 1, "alpha": 0.5, "beta": 2.0}, {"bias_shape": (1, 6)},
                                {"dynamic": True}])
def test_flattened_gemm_becomes_matmul_add(kw):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    ops = _ops(_model("shape", **kw), {"x": x})
    assert "Gemm" not in ops and "Reshape" not in ops and ops.count("MatMul") == 1


def test_flattened_gemm_stays_when_the_rows_are_regrouped():
    # [6, 6] -> [3, 2, 6]: the rows of x [2, 3, 4] are not given back as [2, 3]
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    assert "Gemm" in _ops(_model([3, 2, 6]), {"x": x})
