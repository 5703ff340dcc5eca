"""CPU provider nn kernels against onnxruntime (the oracle), node by node: MatMul and Gemm, and
the registry's schema versions. Conv and ConvTranspose: test_nn_conv.py; pooling: test_nn_pool.py;
normalization, softmax and Dropout: test_nn_norm.py; Resize and Upsample: test_nn_resize.py.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import runtime_core as rt
from runtime_core.errors import InvalidModelError
from oracle import check_node, make_model, run_oracle, run_ours
from providers.cpu.nn_cases import F32, RNG, node_check, rnd, tol


# ------------------------------------------------------------------------------ MatMul / Gemm

@pytest.mark.parametrize("shapes", [
    ((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((2, 3, 4), (4, 5)),
    ((2, 3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 6)), ((5, 4), (2, 3, 4, 6)), ((3, 0), (0, 2)),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int64])
def test_matmul(shapes, dtype):
    a, b = (rnd(*s, scale=3).astype(dtype) for s in shapes)
    t = tol(dtype) if np.dtype(dtype).kind == "f" else {}
    check_node("MatMul", {"a": a, "b": b}, opset=13, **t)


@pytest.mark.parametrize("opset", [1, 9, 13])
def test_matmul_opsets(opset):
    check_node("MatMul", {"a": rnd(2, 3, 4), "b": rnd(4, 3)}, opset=opset, **F32)


@pytest.mark.parametrize("transA,transB", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, 2.0), (1.5, 0.0)])
@pytest.mark.parametrize("c_shape", [None, (5,), (1, 5), (3, 1), (3, 5), ()])
def test_gemm(transA, transB, alpha, beta, c_shape):
    a = rnd(4, 3) if transA else rnd(3, 4)
    b = rnd(5, 4) if transB else rnd(4, 5)
    inits = {} if c_shape is None else {"c": rnd(*c_shape)}
    check_node("Gemm", {"a": a, "b": b}, initializers=inits, transA=transA, transB=transB, alpha=alpha,
               beta=beta, opset=13 if c_shape is None else 11, **F32)


@pytest.mark.parametrize("opset", [7, 9, 11, 13])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_gemm_opsets_dtypes(opset, dtype):
    check_node("Gemm", {"a": rnd(3, 4, dtype=dtype), "b": rnd(4, 2, dtype=dtype), "c": rnd(2, dtype=dtype)},
               alpha=0.7, beta=0.3, transB=0, opset=opset, **tol(dtype))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_gemm_int(dtype):
    a = RNG.integers(-5, 5, (3, 4)).astype(dtype)
    b = RNG.integers(-5, 5, (4, 2)).astype(dtype)
    c = RNG.integers(-5, 5, (2,)).astype(dtype)
    check_node("Gemm", {"a": a, "b": b, "c": c}, opset=13)


@pytest.mark.parametrize("broadcast,c_shape", [(1, (5,)), (1, (1, 5)), (1, ()), (0, (3, 5))])
@pytest.mark.parametrize("transA,transB", [(0, 0), (1, 1)])
def test_gemm_6(broadcast, c_shape, transA, transB):
    # onnxruntime has no Gemm-6: opset 7 (the same arithmetic, C broadcast) is the oracle
    a = rnd(4, 3) if transA else rnd(3, 4)
    b = rnd(5, 4) if transB else rnd(4, 5)
    c = rnd(*c_shape)
    feeds = {"a": a, "b": b, "c": c}
    attrs = dict(alpha=0.7, beta=1.3, transA=transA, transB=transB)
    ref = run_oracle(make_model([helper.make_node("Gemm", ["a", "b", "c"], ["y"], **attrs)], feeds, ["y"],
                                opset=7), feeds)
    node_check("Gemm", feeds, opset=6, oracle=lambda f: ref, broadcast=broadcast, **attrs, **F32)


def test_gemm_6_no_broadcast_needs_full_c():
    feeds = {"a": rnd(3, 4), "b": rnd(4, 5), "c": rnd(5)}
    model = make_model([helper.make_node("Gemm", ["a", "b", "c"], ["y"], broadcast=0)], feeds, ["y"], opset=6)
    with pytest.raises(Exception, match="broadcast=0"):
        run_ours(model, feeds)


@pytest.mark.parametrize("op,attrs", [("MatMul", {}), ("Softmax", {"axis": -1}), ("LogSoftmax", {"axis": 1})])
def test_bfloat16_computed_in_float32(op, attrs):
    import ml_dtypes

    bf = np.dtype(ml_dtypes.bfloat16)
    a = rnd(2, 3, 4).astype(bf)
    feeds = {"a": a, "b": rnd(4, 5).astype(bf)} if op == "MatMul" else {"a": a}
    node = helper.make_node(op, list(feeds), ["y"], **attrs)
    (y,), _ = run_ours(make_model([node], feeds, ["y"], opset=13), feeds)
    assert y.dtype == bf
    f32 = {k: v.astype(np.float32) for k, v in feeds.items()}
    (want,), _ = run_ours(make_model([node], f32, ["y"], opset=13), f32)
    np.testing.assert_allclose(y.astype(np.float32), want.astype(bf).astype(np.float32), rtol=1e-2, atol=1e-2)


# ------------------------------------------------------------------------------ declines / registry

def test_dtype_outside_the_schema_is_refused_at_load():
    # Conv-11 on int32 is an invalid graph (its schema allows float types only): refused at load
    # as onnxruntime does, naming the input and the allowed types
    node = helper.make_node("Conv", ["x", "w"], ["y"])
    model = make_model([node], {"x": np.zeros((1, 1, 3, 3), np.int32)}, ["y"], opset=11,
                       initializers={"w": np.zeros((1, 1, 1, 1), np.int32)})
    with pytest.raises(InvalidModelError, match=r"tensor\(int32\).*::Conv-11 accepts"):
        rt.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_every_schema_version_registered():
    from runtime_provider_cpu.registry import REGISTRY

    ops = ["MatMul", "Gemm", "Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool",
           "GlobalMaxPool", "LpPool", "GlobalLpPool", "BatchNormalization", "InstanceNormalization",
           "LayerNormalization", "GroupNormalization", "LRN", "Softmax", "LogSoftmax", "Hardmax", "Dropout",
           "Resize", "Upsample"]
    hist = {}
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain == "" and s.name in ops:
            hist.setdefault(s.name, []).append(s.since_version)
    for op in ops:
        ours = REGISTRY.versions("", op)
        assert ours, op
        newest = max(hist[op])
        assert newest in ours, (op, ours)
        # every version from the oldest we implement on is there
        assert [v for v in sorted(hist[op]) if min(ours) <= v <= newest] == ours, (op, ours, hist[op])
