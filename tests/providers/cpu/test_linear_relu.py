"""Relu in the Linear kernel's epilogue: ``_native.linear``'s clip bounds against a float64
reference, and the optimizer's ``runtime_core.fused::MatMulActivation`` (MatMul, MatMul + Add
and Gemm followed by Relu, as T5's feed-forward) against onnxruntime, on every Linear plan and
on both torch exporters."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import runtime_core as rt
from oracle import assert_close, make_model, run_oracle

RNG = np.random.default_rng(20261206)
L = rt.GraphOptimizationLevel


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def session(model, level=L.ORT_ENABLE_ALL):
    so = rt.SessionOptions()
    so.graph_optimization_level = level
    so.intra_op_num_threads = 2
    return rt.InferenceSession(model.SerializeToString(), so, providers=["cpu"])


def op_types(sess):
    return [n.op_type for n in sess._graph.nodes]


# -- the kernel -----------------------------------------------------------------------------

@pytest.mark.kernel
@pytest.mark.native
@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("R,K,N,with_bias", [(1, 8, 32, True), (13, 300, 45, True), (25, 600, 96, False),
                                             (7, 64, 1, False)])
def test_linear_relu_epilogue_against_float64(R, K, N, with_bias, packed):
    """Clip bounds on the last chunk of K (one chunk, several, a short column panel), from
    the bias or from zeros, packed and unpacked weights."""
    from runtime_provider_cpu.fast.packing import pack_linear
    from runtime_provider_cpu.fast.policy import NATIVE

    a, w = rnd(R, K), rnd(K, N)
    b = rnd(N) if with_bias else None
    ref = a.astype(np.float64) @ w.astype(np.float64) + (0 if b is None else b)
    wp = pack_linear(w, False) if packed else w
    for lo, hi in ((0.0, float("inf")), (-0.5, 0.75)):
        y = np.full((R, N), np.nan, np.float32)
        NATIVE.linear(a, wp, b, y, (R, K, N), 2, packed, lo, hi)
        np.testing.assert_allclose(y, np.clip(ref, lo, hi), rtol=1e-4, atol=1e-4 * np.sqrt(K))


@pytest.mark.kernel
@pytest.mark.native
def test_linear_refuses_crossed_bounds():
    from runtime_provider_cpu.fast.policy import NATIVE

    a, w, y = rnd(2, 4), rnd(4, 3), np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="lo <= hi"):
        NATIVE.linear(a, w, None, y, (2, 4, 3), 1, False, 1.0, 0.0)
    assert not y.any()


# -- the fusion -------------------------------------------------------------------------------

def _ffn(kind):
    """x [2, 9, 48] (2-D for Gemm) through a 48 -> 80 linear, then Relu."""
    x, w, b = rnd(2, 9, 48), rnd(48, 80), rnd(80)
    n = helper.make_node
    if kind == "matmul":
        nodes, inits = [n("MatMul", ["x", "w"], ["h"]), n("Relu", ["h"], ["y"])], {"w": w}
    elif kind == "matmul_add":
        nodes = [n("MatMul", ["x", "w"], ["h"]), n("Add", ["b", "h"], ["s"]), n("Relu", ["s"], ["y"])]
        inits = {"w": w, "b": b}
    else:  # torch's 2-D nn.Linear at old opsets: Gemm with the weight [N, K]
        x = x.reshape(18, 48)
        nodes = [n("Gemm", ["x", "wt", "b"], ["h"], transB=1, beta=0.5), n("Relu", ["h"], ["y"])]
        inits = {"wt": np.ascontiguousarray(w.T), "b": b.reshape(1, 80)}
    return make_model(nodes, {"x": x}, ["y"], initializers=inits), {"x": x}


@pytest.mark.parametrize("plan", ["packed", "blas", "rows"])
@pytest.mark.parametrize("kind", ["matmul", "matmul_add", "gemm"])
def test_matmul_relu_fuses_and_matches_onnxruntime(kind, plan, cpu_policy):
    cpu_policy(linear_kernel=plan)
    model, feeds = _ffn(kind)
    want = run_oracle(model, feeds)
    sess = session(model)
    assert op_types(sess) == ["MatMulActivation"]
    for _ in range(2):  # the plan made on the first run, reused on the second
        got = sess.run(None, feeds)
        assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert (got[0] >= 0).all()
    # EXTENDED keeps onnxruntime's ops only (the fused op is private)
    assert "Relu" in op_types(session(model, L.ORT_ENABLE_EXTENDED))


@pytest.mark.parametrize("kind", ["matmul", "matmul_add", "gemm"])
def test_saved_optimized_model_has_standard_ops_and_loads_in_onnxruntime(kind, tmp_path):
    """A model optimized at ALL and written to a file gets MatMul (+ Add) + Relu back
    (portable.py): onnxruntime loads it and computes the same outputs."""
    import onnx
    import onnxruntime as ort

    model, feeds = _ffn(kind)
    so = rt.SessionOptions()
    so.graph_optimization_level = L.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    sess = rt.InferenceSession(model.SerializeToString(), so, providers=["cpu"])
    assert "MatMulActivation" in op_types(sess)
    written = onnx.load(so.optimized_model_filepath)
    onnx.checker.check_model(written)
    assert [n.op_type for n in written.graph.node if n.op_type in ("MatMul", "Relu", "MatMulActivation")] == [
        "MatMul", "Relu"]
    assert all(op.domain != "runtime_core.fused" for op in written.opset_import)
    want = run_oracle(model, feeds)
    loaded = ort.InferenceSession(so.optimized_model_filepath, providers=["CPUExecutionProvider"])
    assert_close(loaded.run(None, feeds), want, rtol=1e-4, atol=1e-4)
    assert_close(sess.run(None, feeds), want, rtol=1e-4, atol=1e-4)


def test_not_fused_where_the_product_is_read_twice_or_the_weight_is_fed():
    x, w = rnd(4, 16), rnd(16, 8)
    n = helper.make_node
    twice = make_model([n("MatMul", ["x", "w"], ["h"]), n("Relu", ["h"], ["y"]), n("Neg", ["h"], ["z"])],
                       {"x": x}, ["y", "z"], initializers={"w": w})
    assert "MatMulActivation" not in op_types(session(twice))
    fed = make_model([n("MatMul", ["x", "w"], ["h"]), n("Relu", ["h"], ["y"])], {"x": x, "w": w}, ["y"])
    sess = session(fed)
    assert "MatMulActivation" not in op_types(sess)
    assert_close(sess.run(None, {"x": x, "w": w}), run_oracle(fed, {"x": x, "w": w}))


def test_bad_input_is_a_typed_error_and_the_session_still_runs():
    model, feeds = _ffn("matmul")
    sess = session(model)
    with pytest.raises(rt.errors.RuntimeCoreError):
        sess.run(None, {"x": rnd(2, 9, 47)})
    assert_close(sess.run(None, feeds), run_oracle(model, feeds), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_t5_feed_forward_of_both_exporters(exporter, tmp_path):
    """T5's feed-forward (Linear without bias, ReLU, Linear) and a biased Linear + ReLU, as each
    exporter writes them: every ReLU fused, outputs as onnxruntime's."""
    import warnings

    import onnx
    import torch

    class FFN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wo = torch.nn.Linear(32, 96, bias=False), torch.nn.Linear(96, 32, bias=False)
            self.fc = torch.nn.Linear(32, 64)

        def forward(self, x):
            return self.wo(torch.relu(self.wi(x))), torch.relu(self.fc(x))

    torch.manual_seed(0)
    x = rnd(2, 7, 32)
    path = tmp_path / "ffn.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kw = dict(input_names=["x"], output_names=["y", "z"])
        if exporter == "torchscript":
            torch.onnx.export(FFN().eval(), (torch.from_numpy(x),), str(path), dynamo=False, opset_version=15, **kw)
        else:
            torch.onnx.export(FFN().eval(), (torch.from_numpy(x),), dynamo=True, opset_version=18,
                              **kw).save(str(path))
    model = onnx.load(str(path))
    sess = session(model)
    assert op_types(sess).count("MatMulActivation") == 2 and "Relu" not in op_types(sess)
    assert_close(sess.run(None, {"x": x}), run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-5)
