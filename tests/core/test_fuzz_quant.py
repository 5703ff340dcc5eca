"""The fuzzer's ``quant`` target and its onnxruntime comparison (runtime_core/testing/fuzz_quant.py,
``--target``, ``--compare``), and the reproducers of what its runs found, each kept as a test."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from runtime_core.testing import fuzz
from runtime_core.testing.fuzz_quant import NOT_COMPARED

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the comparison's oracle")
quant = pytest.importorskip("runtime_provider_cpu.ops.quant")

SEED = 31028


def test_short_seeded_quant_run_is_clean_against_onnxruntime(tmp_path):
    s = fuzz.fuzz(SEED, 50.0, tmp_path, max_cases=150, batch=150, targets=("quant",), compare=True,
                  progress=0, log=lambda *a: None)
    found = "; ".join(f"{f['kind']} {f['index']}: {f['detail']}" for f in s.findings)
    assert (s.crashes, s.hangs, s.untyped, s.mismatches) == (0, 0, 0, 0), found
    assert s.cases >= 60, s.to_dict()
    assert set(s.by_target) == {"op:quant"}
    # most cases are compared; some are refused by both runtimes (the deliberately broken ones)
    # (older onnxruntime releases, at the lowest bounds, refuse more of them: a third at least)
    assert s.oracle.get("result+oracle", 0) > s.cases // 3, s.oracle
    assert sum(v for k, v in s.oracle.items() if k.endswith("Error")) > 0, s.oracle


def test_quant_cases_cover_the_ops():
    ops = {fuzz.make_case(SEED, i, ("quant",)).what.split("/")[1].split(" ")[0] for i in range(300)}
    assert {"Q", "DQ", "QDQ", "DynamicQuantizeLinear", "Dynamic+MatMulInteger", "MatMulInteger", "QLinearMatMul",
            "QLinearConv", "ConvInteger", "MatMulNBits", "QLinearAdd", "QLinearMul"} <= ops, ops


def test_unknown_target_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown fuzz target"):
        fuzz.fuzz(SEED, 1.0, tmp_path, max_cases=1, targets=("quantum",))
    with pytest.raises(SystemExit) as e:
        fuzz.main(["--target", "quantum", "--out", str(tmp_path)])
    assert e.value.code == 2


def test_compare_outputs_notices_differences():
    u8 = np.array([3, 4, 5], np.uint8)
    assert fuzz.compare_outputs([u8], [u8 + np.uint8(1)]) is None  # one quantization step: a rounding tie
    assert "differs by 2" in fuzz.compare_outputs([u8], [u8 + np.uint8(2)])
    assert "oracle int8" in fuzz.compare_outputs([u8], [u8.astype(np.int8)])
    f = np.array([1.0, np.nan, 100.0], np.float32)
    assert fuzz.compare_outputs([f], [f.copy()]) is None
    assert "NaN" in fuzz.compare_outputs([np.nan_to_num(f)], [f])
    assert "differs" in fuzz.compare_outputs([f + np.float32(1)], [f])
    assert "outputs" in fuzz.compare_outputs([f], [f, f])


def _dql_model(shape, with_matmul):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "qs", "qz"])]
    outs = [helper.make_tensor_value_info(n, t, None) for n, t in
            (("q", TensorProto.UINT8), ("qs", TensorProto.FLOAT), ("qz", TensorProto.UINT8))]
    inits = []
    if with_matmul:
        w = np.arange(-12, 12, dtype=np.int8).reshape(shape[-1], -1)
        inits = [helper.make_tensor("w", TensorProto.INT8, w.shape, w.ravel().tolist())]
        nodes.append(helper.make_node("MatMulInteger", ["q", "w", "qz"], ["acc"]))
        outs.append(helper.make_tensor_value_info("acc", TensorProto.INT32, None))
    m = helper.make_model(helper.make_graph(nodes, "dql", [x], outs, inits),
                          opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m.SerializeToString()


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("with_matmul", [False, True])
@pytest.mark.parametrize("where", [0, 5, 17])
def test_dynamic_quantize_leaves_nan_out_of_the_range(native, with_matmul, where, monkeypatch):
    """Fuzz finding (DynamicQuantizeLinear, and MatMulInteger after it): a NaN in the input made the
    whole range NaN, so every value quantized to the zero point with scale 1; onnxruntime leaves
    NaNs out of the range and saturates them to 0."""
    import runtime_core as rt

    if not native:
        monkeypatch.setattr(quant, "_native", None)
    x = np.random.default_rng(3).normal(0, 0.01, (3, 6)).astype(np.float32)
    x.flat[where] = np.nan  # (all NaN: onnxruntime's scale is NaN; ours 1, every value 0)
    model = _dql_model(x.shape, with_matmul)
    ours = rt.InferenceSession(model, providers=["cpu"]).run(None, {"x": x})
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert fuzz.compare_outputs(ours, ref) is None, fuzz.compare_outputs(ours, ref)
    for a, b in zip(ours[:3], ref[:3]):
        np.testing.assert_array_equal(a, b)


def test_undefined_values_are_not_compared():
    """A zero or non-finite scale leaves the values undefined: the case must end in a result or a
    typed error, and is not held to onnxruntime's values."""
    found = []
    for i in range(400):
        case = fuzz.make_case(SEED, i, ("quant",))
        if case.what.endswith(NOT_COMPARED):
            found.append(fuzz.run_case(case, compare=True))
    assert found, "no case with an undefined scale among 400"
    assert all(status == "ok" and not detail.startswith(("result+oracle", "result-oracle"))
               for status, detail in found), found


@pytest.mark.parametrize("native", [True, False])
def test_matmul_integer_over_an_empty_k_is_zero(native, monkeypatch):
    """Fuzz finding (seed 31028, cases 8498 and 9218, Dynamic+MatMulInteger with K = 0): the values
    differed from onnxruntime's, which leaves the output uninitialized there (the empty sum is 0,
    numpy's a @ b); ours must be zeros. Not compared with onnxruntime by the fuzzer since."""
    import runtime_core as rt

    if not native:
        monkeypatch.setattr(quant, "_native", None)
    a = np.zeros((5, 0), np.uint8)
    b = helper.make_tensor("b", TensorProto.INT8, [0, 7], [])
    g = helper.make_graph([helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "mmi",
                          [helper.make_tensor_value_info("a", TensorProto.UINT8, [5, 0])],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, None)], [b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    y = rt.InferenceSession(m.SerializeToString(), providers=["cpu"]).run(None, {"a": a})[0]
    want = a.astype(np.int32) @ np.zeros((0, 7), np.int32)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, want)
