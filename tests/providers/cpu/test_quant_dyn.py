"""Dynamic-int8 matmuls: the com.microsoft DynamicQuantizeMatMul / MatMulIntegerToFloat kernels
(ops/quant_dyn.py on ``_native.dqmm``) against onnxruntime and a numpy reference of the unfused
steps, on every inner loop this CPU runs; and the EXTENDED fusion (optimizer/dynq_fusions.py) on
models quantized by onnxruntime's tool and by runtime_core.quantization (onnx.helper graphs,
TorchScript and dynamo exports)."""

from __future__ import annotations

import os
import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt
from runtime_core import errors

ort = pytest.importorskip("onnxruntime")

MS = "com.microsoft"
RNG = np.random.default_rng(31)


@pytest.fixture(autouse=True)
def _seeded():
    global RNG
    RNG = np.random.default_rng(zlib.crc32(os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0].encode()))


def _native():
    from runtime_provider_cpu.fast.policy import NATIVE

    return NATIVE


# the portable quantizing loop runs int8.c's tile (an AVX-VNNI CPU has no AVX-512): with avxvnni,
# and with its EVEX twin vnni256-evex where the VEX form cannot run
@pytest.fixture(params=[("portable", "portable"), ("avx2", "portable"), ("avx512vnni", "portable"),
                        ("avxvnni", "portable"), ("vnni256-evex", "portable"), ("vnni256-evex", "avx512"),
                        ("avx512vnni", "avx512"), ("avx512vnni", "avx512vnni")], ids=lambda p: "-".join(p))
def inner_loop(request):
    """Each int8 inner loop (qgemm_path) and quantizing loop (dqmm_path) this CPU runs, forced,
    restored after."""
    nat = _native()
    if nat is None:
        pytest.skip("the compiled extension is not built")
    gemm, quant = request.param
    order, qorder = ["portable", "avx2", "avx512vnni", "avxvnni", "vnni256-evex"], ["portable", "avx512", "avx512vnni"]
    best_q = nat.dqmm_path()
    if qorder.index(quant) > qorder.index(best_q):
        pytest.skip(f"this CPU runs up to {best_q}")
    if nat.qgemm_path(order.index(gemm)) != gemm:
        nat.qgemm_path(9)
        pytest.skip(f"this CPU does not run the {gemm} loop")
    assert nat.dqmm_path(qorder.index(quant)) == quant
    yield request.param
    nat.qgemm_path(9)
    nat.dqmm_path(qorder.index(best_q))


# -- the numpy reference: DynamicQuantizeLinear, MatMulInteger, Cast, Mul, Add ---------------------

def _dql(x):
    hi = np.float32(max(0.0, float(x.max())))
    lo = np.float32(min(0.0, float(x.min())))
    s = np.float32(1.0) if hi == lo else np.float32((hi - lo) / np.float32(255))
    z = np.float32(np.rint(np.clip(-lo / s, 0, 255)))
    return np.clip(np.rint(x / s) + z, 0, 255).astype(np.uint8), s, np.uint8(z)


def _ref(aq, za, b, zb, scale, bias):
    acc = (aq.astype(np.int64) - np.int64(za)) @ (b.astype(np.int64) - (0 if zb is None else zb.astype(np.int64)))
    y = acc.astype(np.int32).astype(np.float32) * scale
    return y if bias is None else y + bias


def _model(nodes, inputs, inits, opset=17):
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m.SerializeToString()


def _vi(name, v):
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)


def _ort(m, feeds, level=None):
    so = ort.SessionOptions()
    so.graph_optimization_level = level or ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(m, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _b_params(n, b_dt, per_col, with_zp):
    b_scale = (RNG.uniform(0.002, 0.02, n) if per_col else RNG.uniform(0.002, 0.02, ())).astype(np.float32)
    zp = None
    if with_zp:
        info = np.iinfo(b_dt)
        zp = (RNG.integers(info.min, info.max + 1, n) if per_col else RNG.integers(info.min, info.max + 1, ())
              ).astype(b_dt)
    return b_scale, zp


def _bytes(dt, shape):
    info = np.iinfo(dt)
    return RNG.integers(info.min, info.max + 1, size=shape).astype(dt)


# M not a multiple of the tile's 8 rows, K of the 4-byte groups, N of the 32 columns
SHAPES = [((2, 3, 37), 37, 45), ((1, 16, 64), 64, 96), ((5, 19), 19, 33), ((9, 130), 130, 7)]


@pytest.mark.parametrize("shape,K,N", SHAPES)
@pytest.mark.parametrize("b_dt", [np.int8, np.uint8])
@pytest.mark.parametrize("per_col,with_zp,with_bias", [(False, False, False), (True, True, True),
                                                       (False, True, True), (True, False, False)])
def test_dynamic_quantize_matmul(inner_loop, shape, K, N, b_dt, per_col, with_zp, with_bias):
    a = RNG.standard_normal(shape).astype(np.float32)
    a[..., 0] += 3.0  # an asymmetric range: a zero point away from the middle
    b = _bytes(b_dt, (K, N))
    b_scale, b_zp = _b_params(N, b_dt, per_col, with_zp)
    bias = RNG.standard_normal(N).astype(np.float32) if with_bias else None
    inits = {"B": b, "b_scale": b_scale}
    ins = ["A", "B", "b_scale", "b_zp" if with_zp else "", "bias" if with_bias else ""]
    if with_zp:
        inits["b_zp"] = b_zp
    if with_bias:
        inits["bias"] = bias
    while not ins[-1]:
        ins.pop()
    m = _model([helper.make_node("DynamicQuantizeMatMul", ins, ["y"], domain=MS)], [_vi("A", a)], inits)
    got = rt.InferenceSession(m).run(None, {"A": a})[0]
    aq, sa, za = _dql(a)
    want = _ref(aq, za, b, b_zp, sa * b_scale, bias)
    np.testing.assert_array_equal(got, want)  # the unfused steps' float32 rounding, bit for bit
    theirs = _ort(m, {"A": a})[0]
    tol = float(np.abs(want).max()) * 2e-6 + 1e-6  # onnxruntime's epilogue may contract to an FMA
    np.testing.assert_allclose(got, theirs, rtol=0, atol=tol)


@pytest.mark.parametrize("shape,K,N", SHAPES[:3])
@pytest.mark.parametrize("a_dt,b_dt", [(np.uint8, np.int8), (np.int8, np.int8), (np.uint8, np.uint8)])
@pytest.mark.parametrize("per_col,with_zp,with_bias", [(False, True, False), (True, True, True), (True, False, True)])
def test_matmul_integer_to_float(inner_loop, shape, K, N, a_dt, b_dt, per_col, with_zp, with_bias):
    a = _bytes(a_dt, shape)
    b = _bytes(b_dt, (K, N))
    a_scale = np.array(0.05, np.float32)
    a_zp = _bytes(a_dt, ())
    b_scale, b_zp = _b_params(N, b_dt, per_col, with_zp)
    bias = RNG.standard_normal(N).astype(np.float32) if with_bias else None
    inits = {"B": b, "a_scale": a_scale, "b_scale": b_scale, "a_zp": a_zp}
    ins = ["A", "B", "a_scale", "b_scale", "a_zp", "b_zp" if with_zp else "", "bias" if with_bias else ""]
    if with_zp:
        inits["b_zp"] = b_zp
    if with_bias:
        inits["bias"] = bias
    while not ins[-1]:
        ins.pop()
    m = _model([helper.make_node("MatMulIntegerToFloat", ins, ["y"], domain=MS)], [_vi("A", a)], inits)
    got = rt.InferenceSession(m).run(None, {"A": a})[0]
    want = _ref(a, a_zp, b, b_zp, a_scale * b_scale, bias)
    np.testing.assert_array_equal(got, want)
    theirs = _ort(m, {"A": a})[0]
    np.testing.assert_allclose(got, theirs, rtol=0, atol=float(np.abs(want).max()) * 2e-6 + 1e-6)


def test_runtime_b_is_packed_each_run():
    """B fed at run time (not a constant): packed every run, never a stale copy."""
    a = RNG.standard_normal((4, 24)).astype(np.float32)
    b_scale = np.array(0.01, np.float32)
    m = _model([helper.make_node("DynamicQuantizeMatMul", ["A", "B", "b_scale"], ["y"], domain=MS)],
               [_vi("A", a), helper.make_tensor_value_info("B", TensorProto.INT8, (24, 40))], {"b_scale": b_scale})
    s = rt.InferenceSession(m)
    for _ in range(2):
        b = _bytes(np.int8, (24, 40))
        aq, sa, za = _dql(a)
        np.testing.assert_array_equal(s.run(None, {"A": a, "B": b})[0], _ref(aq, za, b, None, sa * b_scale, None))


# (11, 37): a whole block of 8 rows, whose first 32 columns are quantized by the 8-row AVX-512 pass
@pytest.mark.parametrize("M,K", [(3, 16), (11, 37)])
def test_nan_and_constant_inputs(M, K):
    """An all-zero A (scale 1) and a NaN in A (left out of the range and quantized to 0, as onnxruntime does) as the reference."""
    b = _bytes(np.int8, (K, 8))
    m = _model([helper.make_node("DynamicQuantizeMatMul", ["A", "B", "b_scale"], ["y"], domain=MS)],
               [helper.make_tensor_value_info("A", TensorProto.FLOAT, (M, K))],
               {"B": b, "b_scale": np.array(0.5, np.float32)})
    s = rt.InferenceSession(m)
    z = np.zeros((M, K), np.float32)
    np.testing.assert_array_equal(s.run(None, {"A": z})[0], np.zeros((M, 8), np.float32))
    x = RNG.standard_normal((M, K)).astype(np.float32)
    x[1, 2] = x[M - 1, K - 1] = np.nan
    got = s.run(None, {"A": x})[0]
    from runtime_provider_cpu.ops.quant import dynamic_quantize_linear

    class _Ctx:
        pass

    aq, sa, za = dynamic_quantize_linear(_Ctx(), x)
    np.testing.assert_array_equal(got, _ref(aq, za, b, None, sa * np.float32(0.5), None))


def test_bad_b_scale_is_a_typed_error():
    a = RNG.standard_normal((2, 8)).astype(np.float32)
    m = _model([helper.make_node("DynamicQuantizeMatMul", ["A", "B", "b_scale"], ["y"], domain=MS)],
               [_vi("A", a)], {"B": _bytes(np.int8, (8, 6)), "b_scale": np.ones(5, np.float32)})
    s = rt.InferenceSession(m)
    with pytest.raises(errors.RuntimeCoreError, match="b_scale"):
        s.run(None, {"A": a})
    with pytest.raises(errors.RuntimeCoreError):
        s.run(None, {"A": RNG.standard_normal((2, 7)).astype(np.float32)})


# -- the fusion on quantized models ----------------------------------------------------------------

def _float_mlp(seq, d, h, shared):
    """x -> MatMul+Add (x2 reading one input when ``shared``) -> Relu -> MatMul (no bias) + residual."""
    w1 = (RNG.standard_normal((d, h)) * 0.2).astype(np.float32)
    w2 = (RNG.standard_normal((h, d)) * 0.2).astype(np.float32)
    w3 = (RNG.standard_normal((d, h)) * 0.2).astype(np.float32)
    b1 = RNG.standard_normal(h).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["r1"]), helper.make_node("MatMul", ["r1", "w2"], ["m2"])]
    if shared:
        nodes += [helper.make_node("MatMul", ["x", "w3"], ["m3"]), helper.make_node("MatMul", ["m3", "w2"], ["m4"]),
                  helper.make_node("Add", ["m2", "m4"], ["y"])]
    else:
        nodes += [helper.make_node("Add", ["m2", "x"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, seq, d))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in {"w1": w1, "w2": w2, "w3": w3, "b1": b1}.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _quantize(tmp_path, model, tool, name):
    src, dst = tmp_path / f"{name}.onnx", tmp_path / f"{name}.{tool}.q.onnx"
    if isinstance(model, onnx.ModelProto):
        onnx.save(model, str(src))
    else:
        src = model
    if tool == "ort":
        from onnxruntime.quantization import QuantType, quantize_dynamic
    else:
        from runtime_core.quantization import QuantType, quantize_dynamic
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
    return dst.read_bytes()


def _fused_ops(sess):
    return [n.op_type for n in sess.get_partition_report().nodes]


def _check_model(qm, feeds, expect_ops, exact=True):
    so = rt.SessionOptions()  # every other pass as in the fused session
    so.add_session_config_entry("optimization.disable_specified_optimizers", "DynamicQuantizeMatMulFusion")
    plain = rt.InferenceSession(qm, so).run(None, feeds)
    s = rt.InferenceSession(qm)
    ops = _fused_ops(s)
    assert "MatMulInteger" not in ops and set(expect_ops) <= set(ops), ops
    got = s.run(None, feeds)
    want = _ort(qm, feeds, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    for g, p, w in zip(got, plain, want):
        if exact:  # the fused op's float steps are the unfused graph's: bit for bit
            np.testing.assert_array_equal(g, p)
        else:  # other fusions (LayerNorm, Gelu) round differently where the bias Add went into the op
            np.testing.assert_allclose(g, p, rtol=1e-5, atol=1e-5 * float(np.abs(p).max()))
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * float(np.abs(w).max()))


@pytest.mark.parametrize("tool", ["ort", "ours"])
@pytest.mark.parametrize("shared", [False, True])
def test_fusion_on_quantized_mlp(tmp_path, tool, shared):
    m = _float_mlp(12, 32, 48, shared)
    qm = _quantize(tmp_path, m, tool, "mlp")
    x = RNG.standard_normal((2, 12, 32)).astype(np.float32)
    # shared: x feeds two MatMulIntegers through one DynamicQuantizeLinear -> MatMulIntegerToFloat
    _check_model(qm, {"x": x}, ["DynamicQuantizeMatMul"] + (["MatMulIntegerToFloat"] if shared else []))


def _encoder():
    """A BERT-style block: separate q/k/v projections of one input (a shared quantization),
    attention in float, output projection, a GELU feed-forward and two LayerNorms."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, d=32, h=2, f=64):
            super().__init__()
            self.h, self.q, self.k, self.v, self.o = h, nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
            self.f1, self.f2, self.n1, self.n2 = nn.Linear(d, f), nn.Linear(f, d), nn.LayerNorm(d), nn.LayerNorm(d)

        def forward(self, x):
            b, t, d = x.shape
            heads = [p(x).reshape(b, t, self.h, d // self.h).transpose(1, 2) for p in (self.q, self.k, self.v)]
            a = torch.softmax(heads[0] @ heads[1].transpose(-1, -2) / (d // self.h) ** 0.5, -1) @ heads[2]
            x = self.n1(x + self.o(a.transpose(1, 2).reshape(b, t, d)))
            return self.n2(x + self.f2(torch.nn.functional.gelu(self.f1(x))))

    return torch, Block().eval()


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("tool", ["ort", "ours"])
def test_fusion_on_torch_encoder(tmp_path, exporter, tool):
    torch, enc = _encoder()
    x = torch.randn(2, 10, 32)
    path = tmp_path / f"enc_{exporter}.onnx"
    with torch.no_grad():
        if exporter == "torchscript":
            torch.onnx.export(enc, (x,), str(path), input_names=["x"], output_names=["y"], opset_version=17,
                              dynamo=False)
        else:
            try:
                torch.onnx.export(enc, (x,), str(path), input_names=["x"], output_names=["y"], dynamo=True,
                                  optimize=True, verbose=False)
            except Exception as e:  # noqa: BLE001 - an exporter this torch lacks (onnxscript missing)
                pytest.skip(f"the dynamo exporter does not run here: {type(e).__name__}: {e}")
    qm = _quantize(tmp_path, path, tool, f"enc_{exporter}")
    _check_model(qm, {"x": x.numpy()}, ["DynamicQuantizeMatMul", "MatMulIntegerToFloat"], exact=False)


def _dyn_group(w_as_input=False, extra_reader=False):
    """DQL -> MatMulInteger -> Cast -> Mul(Mul(scale, w_scale)) -> Add(bias), as quantize_dynamic
    writes it; ``w_as_input``: W fed at run time; ``extra_reader``: the Mul's output also a graph output."""
    w = _bytes(np.int8, (16, 24))
    inits = {"ws": np.array(0.01, np.float32), "bias": RNG.standard_normal(24).astype(np.float32)}
    if not w_as_input:
        inits["w"] = w
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("MatMulInteger", ["xq", "w", "xz"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["xs", "ws"], ["s"]),
             helper.make_node("Mul", ["accf", "s"], ["m"]),
             helper.make_node("Add", ["m", "bias"], ["y"])]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, (3, 16))]
    if w_as_input:
        ins.append(helper.make_tensor_value_info("w", TensorProto.INT8, (16, 24)))
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader:
        outs.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "g", ins, outs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    feeds = {"x": RNG.standard_normal((3, 16)).astype(np.float32)}
    if w_as_input:
        feeds["w"] = w
    return m.SerializeToString(), feeds


@pytest.mark.parametrize("w_as_input,extra_reader,fused", [(False, False, True), (True, False, False),
                                                          (False, True, True)])
def test_fusion_only_on_the_exact_group(w_as_input, extra_reader, fused):
    m, feeds = _dyn_group(w_as_input, extra_reader)
    s = rt.InferenceSession(m)
    ops = _fused_ops(s)
    assert ("DynamicQuantizeMatMul" in ops) == fused and ("MatMulInteger" in ops) != fused, ops
    # the bias goes into the op only where the product is read by the Add alone
    assert ("Add" in ops) == (extra_reader or not fused), ops
    so = rt.SessionOptions()
    so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    for g, w in zip(s.run(None, feeds), rt.InferenceSession(m, so).run(None, feeds)):
        np.testing.assert_array_equal(g, w)


def test_threaded_range_and_rows():
    """An A large enough that the range, quantizing and GEMM passes split over two threads (the
    parts' ranges merged): the same bytes as one pass."""
    a = RNG.standard_normal((1030, 520)).astype(np.float32)
    a[1029, 519] = -9.0  # the extremes in the last part
    a[0, 0] = 7.0
    b = _bytes(np.uint8, (520, 40))
    b_scale, b_zp = _b_params(40, np.uint8, True, True)
    m = _model([helper.make_node("DynamicQuantizeMatMul", ["A", "B", "b_scale", "b_zp"], ["y"], domain=MS)],
               [_vi("A", a)], {"B": b, "b_scale": b_scale, "b_zp": b_zp})
    so = rt.SessionOptions()
    so.intra_op_num_threads = 2
    got = rt.InferenceSession(m, so).run(None, {"A": a})[0]
    aq, sa, za = _dql(a)
    np.testing.assert_array_equal(got, _ref(aq, za, b, b_zp, sa * b_scale, None))
