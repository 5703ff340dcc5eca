"""The com.microsoft quantized ops (ops/quant_contrib.py) against onnxruntime, and models made
by runtime_core.quantization (QOperator, MatMulNBits) running on runtime_core."""

from __future__ import annotations

import os
import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt

ort = pytest.importorskip("onnxruntime")

MS = "com.microsoft"
RNG = np.random.default_rng(31)


@pytest.fixture(autouse=True)
def _seeded():
    """Each test draws the same data whatever the selection (exact comparisons stay stable)."""
    global RNG
    RNG = np.random.default_rng(zlib.crc32(os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0].encode()))


def _model(nodes, inputs, outputs, inits):
    g = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m.SerializeToString()


def _run_both(nodes, feeds, inits, out_type):
    ins = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for k, v in feeds.items()]
    outs = [helper.make_tensor_value_info("y", out_type, None)]
    m = _model(nodes, ins, outs, inits)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(m, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = rt.InferenceSession(m).run(None, feeds)[0]
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    return got, want


def _q(dt, shape):
    info = np.iinfo(dt)
    return RNG.integers(info.min, info.max + 1, size=shape).astype(dt)


def _params(dt, scale):
    zp = np.array(3 if dt == np.int8 else 120, dt)
    return np.array(scale, np.float32), zp


def _close_codes(got, want, steps=0):
    d = np.abs(got.astype(np.int32) - want.astype(np.int32))
    assert d.max() <= steps, (d.max(), np.argwhere(d > steps)[:5])


DTS = [np.uint8, np.int8]
# pools: an average that is an exact tie in real arithmetic (sum * sx / (cnt * sy) = k + 0.5) lands
# either side of it in float32 depending on the order of operations; one code apart at most
POOL_STEPS = 1


@pytest.mark.parametrize("dt", DTS, ids=["u8", "s8"])
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_binary(op, dt):
    a, b = _q(dt, (2, 3, 8)), _q(dt, (3, 1))
    sa, za = _params(dt, 0.05)
    sb, zb = _params(dt, 0.03)
    sc, zc = _params(dt, 0.08 if op == "QLinearAdd" else 0.2)
    n = helper.make_node(op, ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["y"], domain=MS)
    got, want = _run_both([n], {"a": a, "b": b}, dict(sa=sa, za=za, sb=sb, zb=zb, sc=sc, zc=zc),
                          helper.np_dtype_to_tensor_dtype(np.dtype(dt)))
    _close_codes(got, want)


@pytest.mark.parametrize("dt", DTS, ids=["u8", "s8"])
def test_add_same_shape_compiled(dt, monkeypatch):
    """Same-shaped QLinearAdd (a residual sum) on the compiled lookup kernel: within a code of
    onnxruntime's (its same-shape kernel rounds some ties the other way), and the numpy path's
    bit for bit (saturating both ways: scales chosen to overflow the range)."""
    from runtime_provider_cpu.ops import quant_contrib

    if quant_contrib._native is None:
        pytest.skip("the compiled extension is not built here")
    a, b = _q(dt, (2, 5, 37, 9)), _q(dt, (2, 5, 37, 9))
    sa, za = _params(dt, 0.05)
    sb, zb = _params(dt, 0.03)
    sc, zc = _params(dt, 0.06)
    n = helper.make_node("QLinearAdd", ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["y"], domain=MS)
    inits = dict(sa=sa, za=za, sb=sb, zb=zb, sc=sc, zc=zc)
    got, want = _run_both([n], {"a": a, "b": b}, inits, helper.np_dtype_to_tensor_dtype(np.dtype(dt)))
    _close_codes(got, want, 1)
    info = np.iinfo(dt)
    assert np.count_nonzero(got == info.min) and np.count_nonzero(got == info.max)
    monkeypatch.setattr(quant_contrib, "_native", None)
    ref, _ = _run_both([n], {"a": a, "b": b}, inits, helper.np_dtype_to_tensor_dtype(np.dtype(dt)))
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("dt", DTS, ids=["u8", "s8"])
def test_add_kept_call_across_runs(dt, monkeypatch):
    """With constant scales and zero points the compiled QLinearAdd call is kept after the first
    run: later runs (new data, then a new shape, which sets it up again) give the numpy path's
    bytes and stay within a code of onnxruntime's, and same-shaped runs skip the set-up."""
    from runtime_provider_cpu.ops import quant_contrib

    if quant_contrib._native is None:
        pytest.skip("the compiled extension is not built here")
    sa, za = _params(dt, 0.05)
    sb, zb = _params(dt, 0.03)
    sc, zc = _params(dt, 0.06)
    n = helper.make_node("QLinearAdd", ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["y"], domain=MS)
    tt = helper.np_dtype_to_tensor_dtype(np.dtype(dt))
    ins = [helper.make_tensor_value_info(k, tt, ["n", 24, 7]) for k in ("a", "b")]
    m = _model([n], ins, [helper.make_tensor_value_info("y", tt, None)], dict(sa=sa, za=za, sb=sb, zb=zb, sc=sc, zc=zc))
    sess, oracle = rt.InferenceSession(m), ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    calls = []
    set_up = quant_contrib._qlinear_add_native
    monkeypatch.setattr(quant_contrib, "_qlinear_add_native", lambda *a: calls.append(1) or set_up(*a))
    feeds = [{"a": _q(dt, (nb, 24, 7)), "b": _q(dt, (nb, 24, 7))} for nb in (2, 2, 2, 3, 3)]
    got = [sess.run(None, f)[0] for f in feeds]
    assert len(calls) == 2  # the first run and the first of the new shape
    for f, y in zip(feeds, got):
        _close_codes(y, oracle.run(None, f)[0], 1)
    monkeypatch.setattr(quant_contrib, "_native", None)
    ref = rt.InferenceSession(m)
    for f, y in zip(feeds, got):
        np.testing.assert_array_equal(y, ref.run(None, f)[0])


@pytest.mark.parametrize("dt", DTS, ids=["u8", "s8"])
@pytest.mark.parametrize("op", ["QLinearSigmoid", "QLinearLeakyRelu"])
def test_unary(op, dt):
    x = _q(dt, (4, 64))
    sx, zx = _params(dt, 0.05)
    sy, zy = _params(dt, 1 / 256 if op == "QLinearSigmoid" else 0.04)
    kw = {"alpha": 0.2} if op == "QLinearLeakyRelu" else {}
    n = helper.make_node(op, ["x", "sx", "zx", "sy", "zy"], ["y"], domain=MS, **kw)
    got, want = _run_both([n], {"x": x}, dict(sx=sx, zx=zx, sy=sy, zy=zy),
                          helper.np_dtype_to_tensor_dtype(np.dtype(dt)))
    _close_codes(got, want)


@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize("dt", DTS, ids=["u8", "s8"])
def test_global_average_pool(dt, channels_last):
    x = _q(dt, (2, 5, 6, 3) if channels_last else (2, 3, 5, 6))
    sx, zx = _params(dt, 0.05)
    sy, zy = _params(dt, 0.02)
    n = helper.make_node("QLinearGlobalAveragePool", ["x", "sx", "zx", "sy", "zy"], ["y"], domain=MS,
                         channels_last=channels_last)
    got, want = _run_both([n], {"x": x}, dict(sx=sx, zx=zx, sy=sy, zy=zy),
                          helper.np_dtype_to_tensor_dtype(np.dtype(dt)))
    _close_codes(got, want, POOL_STEPS)


@pytest.mark.parametrize("dt", DTS, ids=["u8", "s8"])
def test_global_average_pool_planes_match_integer_sums(dt):
    """NCHW planes summed as a float32 product with ones (exact below 2^24) give the codes of the
    integer reduction the channels-last layout takes, on saturating data and wide planes."""
    x = _q(dt, (2, 40, 19, 23))
    sx, zx = _params(dt, 0.05)
    sy, zy = _params(dt, 0.004)
    y = {}
    for cl in (0, 1):
        n = helper.make_node("QLinearGlobalAveragePool", ["x", "sx", "zx", "sy", "zy"], ["y"], domain=MS,
                             channels_last=cl)
        xin = np.ascontiguousarray(np.moveaxis(x, 1, -1)) if cl else x
        ins = [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(np.dtype(dt)), xin.shape)]
        m = _model([n], ins, [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(dt)), None)],
                   dict(sx=sx, zx=zx, sy=sy, zy=zy))
        y[cl] = rt.InferenceSession(m).run(None, {"x": xin})[0].reshape(2, 40)
    np.testing.assert_array_equal(y[0], y[1])
    info = np.iinfo(dt)
    assert np.count_nonzero((y[0] != info.min) & (y[0] != info.max))


@pytest.mark.parametrize("kw", [dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
                                dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
                                dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
                                dict(kernel_shape=[3, 3], channels_last=1)],
                         ids=["pads", "count-pad", "ceil", "nhwc"])
@pytest.mark.parametrize("dt", DTS, ids=["u8", "s8"])
def test_average_pool(dt, kw):
    x = _q(dt, (1, 7, 7, 3) if kw.get("channels_last") else (1, 3, 7, 7))
    sx, zx = _params(dt, 0.05)
    sy, zy = _params(dt, 0.03)
    n = helper.make_node("QLinearAveragePool", ["x", "sx", "zx", "sy", "zy"], ["y"], domain=MS, **kw)
    got, want = _run_both([n], {"x": x}, dict(sx=sx, zx=zx, sy=sy, zy=zy),
                          helper.np_dtype_to_tensor_dtype(np.dtype(dt)))
    _close_codes(got, want, POOL_STEPS)


@pytest.mark.parametrize("dt", DTS, ids=["u8", "s8"])
def test_concat(dt):
    a, b, c = _q(dt, (2, 3, 4)), _q(dt, (2, 2, 4)), _q(dt, (2, 1, 4))
    sy, zy = _params(dt, 0.05)
    sb, zb = _params(dt, 0.02)
    sc = np.array(0.11, np.float32)
    zc = np.array(-7 if dt == np.int8 else 9, dt)
    n = helper.make_node("QLinearConcat", ["sy", "zy", "a", "sy", "zy", "b", "sb", "zb", "c", "sc", "zc"], ["y"],
                         domain=MS, axis=1)
    got, want = _run_both([n], {"a": a, "b": b, "c": c}, dict(sy=sy, zy=zy, sb=sb, zb=zb, sc=sc, zc=zc),
                          helper.np_dtype_to_tensor_dtype(np.dtype(dt)))
    _close_codes(got, want)
    np.testing.assert_array_equal(got[:, :3], a)  # same parameters: copied


@pytest.mark.parametrize("opset,axis", [(13, -1), (13, 1), (12, 1)])
@pytest.mark.parametrize("dt", DTS, ids=["u8", "s8"])
def test_softmax(dt, opset, axis):
    x = _q(dt, (2, 4, 10))
    sx, zx = _params(dt, 0.06)
    sy = np.array(1 / 256, np.float32)
    zy = np.array(-128 if dt == np.int8 else 0, dt)
    n = helper.make_node("QLinearSoftmax", ["x", "sx", "zx", "sy", "zy"], ["y"], domain=MS, axis=axis,
                         opset=opset)
    got, want = _run_both([n], {"x": x}, dict(sx=sx, zx=zx, sy=sy, zy=zy),
                          helper.np_dtype_to_tensor_dtype(np.dtype(dt)))
    _close_codes(got, want)


@pytest.mark.parametrize("case", ["quant-out", "float-out", "per-col-transB", "transA-no-bias"])
@pytest.mark.parametrize("dt", DTS, ids=["u8", "s8"])
def test_qgemm(dt, case):
    M, K, N = 5, 24, 7
    transA = int(case == "transA-no-bias")
    transB = int(case == "per-col-transB")
    a = _q(dt, (K, M) if transA else (M, K))
    b = _q(np.int8, (N, K) if transB else (K, N))
    sa, za = _params(dt, 0.04)
    if case == "per-col-transB":
        sb = RNG.uniform(0.01, 0.03, N).astype(np.float32)
        zb = np.zeros(N, np.int8)
    else:
        sb, zb = np.array(0.02, np.float32), np.array(0, np.int8)
    inits = dict(sa=sa, za=za, b=b, sb=sb, zb=zb)
    ins = ["a", "sa", "za", "b", "sb", "zb"]
    if case != "transA-no-bias":
        inits["c"] = RNG.integers(-5000, 5000, N).astype(np.int32)
        ins.append("c")
    else:
        ins.append("")
    out_t = TensorProto.FLOAT
    if case != "float-out":
        sy, zy = _params(dt, 0.5)
        inits.update(sy=sy, zy=zy)
        ins += ["sy", "zy"]
        out_t = helper.np_dtype_to_tensor_dtype(np.dtype(dt))
    n = helper.make_node("QGemm", ins, ["y"], domain=MS, alpha=0.75, transA=transA, transB=transB)
    got, want = _run_both([n], {"a": a}, inits, out_t)
    if out_t == TensorProto.FLOAT:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    else:
        _close_codes(got, want)


@pytest.mark.parametrize("M", [1, 3])  # 1: the one-row (GEMV) tile
@pytest.mark.parametrize("transB", [0, 1])
def test_qgemm_compiled_matches_numpy(transB, M, monkeypatch):
    """QGemm's int32 sums on the compiled GEMM (B packed once, transposed or not; C in its
    epilogue) give the numpy path's codes exactly, over two runs (the second reuses the pack)."""
    from runtime_provider_cpu.ops import quant

    if quant._native is None:
        pytest.skip("the compiled extension is not built here")
    K, N = 40, 19
    b = _q(np.int8, (N, K) if transB else (K, N))
    sa, za = _params(np.uint8, 0.04)
    sy, zy = _params(np.uint8, 0.3)
    inits = dict(sa=sa, za=za, b=b, sb=RNG.uniform(0.01, 0.03, N).astype(np.float32), zb=np.zeros(N, np.int8),
                 c=RNG.integers(-5000, 5000, N).astype(np.int32), sy=sy, zy=zy)
    n = helper.make_node("QGemm", ["a", "sa", "za", "b", "sb", "zb", "c", "sy", "zy"], ["y"], domain=MS,
                         transB=transB)
    ins = [helper.make_tensor_value_info("a", TensorProto.UINT8, (M, K))]
    m = _model([n], ins, [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    sess = rt.InferenceSession(m)
    feeds = [{"a": _q(np.uint8, (M, K))} for _ in range(2)]
    got = [sess.run(None, f)[0] for f in feeds]
    monkeypatch.setattr(quant, "_native", None)
    ref = rt.InferenceSession(m)
    for g, f in zip(got, feeds):
        np.testing.assert_array_equal(g, ref.run(None, f)[0])


def _nbits_inputs(K, N, bs, zp):
    nb = -(-K // bs)
    b = RNG.integers(0, 256, (N, nb, bs // 2)).astype(np.uint8)
    scales = RNG.uniform(0.01, 0.05, N * nb).astype(np.float32)
    inits = dict(b=b, s=scales)
    if zp == "packed":
        inits["z"] = RNG.integers(0, 256, N * (-(-nb // 2))).astype(np.uint8)
    elif zp == "float":
        inits["z"] = RNG.uniform(0, 15, N * nb).astype(np.float32)
    return inits


@pytest.mark.parametrize("K,bs,zp,bias", [(64, 32, None, False), (80, 16, "packed", True), (96, 32, "packed", False),
                                          (128, 128, "float", True)])
def test_matmul_nbits(K, bs, zp, bias):
    N = 12
    inits = _nbits_inputs(K, N, bs, zp)
    ins = ["a", "b", "s", "z" if zp else ""]
    if bias:
        inits["bias"] = RNG.standard_normal(N).astype(np.float32)
        ins += ["", "bias"]
    a = RNG.standard_normal((2, 3, K)).astype(np.float32)
    n = helper.make_node("MatMulNBits", ins, ["y"], domain=MS, K=K, N=N, bits=4, block_size=bs)
    got, want = _run_both([n], {"a": a}, inits, TensorProto.FLOAT)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dt", [np.uint8, np.int8, np.int16, "int4", "uint4"])
def test_ms_qdq(dt):
    import ml_dtypes

    npdt = np.dtype(getattr(ml_dtypes, dt)) if isinstance(dt, str) else np.dtype(dt)
    x = (RNG.standard_normal((4, 6)) * 2).astype(np.float32)
    s = RNG.uniform(0.05, 0.5, 6).astype(np.float32)
    z = np.full(6, 1, npdt)
    inits = dict(s=s, z=z)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], domain=MS, axis=1),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], domain=MS, axis=1)]
    got, want = _run_both(nodes, {"x": x}, inits, TensorProto.FLOAT)
    np.testing.assert_array_equal(got, want)
    # the scalar (0-d) input TorchScript exports produce
    got, want = _run_both(nodes[:1] + [helper.make_node("DequantizeLinear", ["q", "s0"], ["y"], domain=MS)],
                          {"x": np.array(1.3, np.float32)},
                          dict(s=np.array(0.1, np.float32), z=np.array(1, npdt), s0=np.array(0.1, np.float32)),
                          TensorProto.FLOAT)
    np.testing.assert_array_equal(got, want)


# -- models made by runtime_core.quantization -----------------------------------------------------

def _float_model(tmp_path):
    """A small CNN + dense head with every op the QOperator format rewrites."""
    w = lambda *s: numpy_helper.from_array(RNG.standard_normal(s).astype(np.float32) * 0.3)  # noqa: E731
    inits = {"w1": w(4, 3, 3, 3), "b1": w(4), "w2": w(8 * 2 * 2, 10), "b2": w(10), "m": w(1, 4, 1, 1)}
    for k, v in inits.items():
        v.name = k
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("LeakyRelu", ["c"], ["r"], alpha=0.1),
             helper.make_node("Mul", ["r", "m"], ["rm"]),
             helper.make_node("Sigmoid", ["rm"], ["sg"]),
             helper.make_node("Add", ["rm", "sg"], ["ad"]),
             helper.make_node("AveragePool", ["ad"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["p"], ["gp"]),
             helper.make_node("Mul", ["p", "gp"], ["pg"]),
             helper.make_node("Concat", ["pg", "p"], ["cc"], axis=1),
             helper.make_node("MaxPool", ["cc"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["mp"], ["f"]),
             helper.make_node("Gemm", ["f", "w2", "b2"], ["g"]),
             helper.make_node("Softmax", ["g"], ["y"], axis=-1)]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], list(inits.values()))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    p = tmp_path / "f.onnx"
    onnx.save(m, p)
    return p


def test_qoperator_model_runs_on_runtime_core(tmp_path):
    from runtime_core import quantization as rq

    src = _float_model(tmp_path)
    feeds = [{"x": RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(4)]

    class Reader(rq.CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    dst = tmp_path / "q.onnx"
    rq.quantize_static(str(src), str(dst), Reader(), quant_format=rq.QuantFormat.QOperator,
                       activation_type=rq.QuantType.QUInt8, weight_type=rq.QuantType.QInt8)
    ops = {n.op_type for n in onnx.load(str(dst)).graph.node}
    assert {"QLinearConv", "QGemm", "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu",
            "QLinearAveragePool", "QLinearGlobalAveragePool", "QLinearConcat", "QLinearSoftmax"} <= ops, ops
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    o = ort.InferenceSession(str(dst), so, providers=["CPUExecutionProvider"])
    r = rt.InferenceSession(str(dst))
    for f in feeds:
        want, got = o.run(None, f)[0], r.run(None, f)[0]
        assert np.abs(got - want).max() <= 1 / 256 + 1e-6  # one step of the softmax output (1/256)


@pytest.mark.parametrize("sym", [True, False])
def test_matmul_nbits_model_runs_on_runtime_core(tmp_path, sym):
    from runtime_core import quantization as rq

    K, N = 64, 16
    w = numpy_helper.from_array(RNG.standard_normal((K, N)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, K])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, N])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    src, dst = tmp_path / "mm.onnx", tmp_path / "mm4.onnx"
    onnx.save(m, src)
    rq.quantize_matmul_nbits(str(src), str(dst), block_size=32, is_symmetric=sym)
    assert [n.op_type for n in onnx.load(str(dst)).graph.node] == ["MatMulNBits"]
    x = RNG.standard_normal((2, 5, K)).astype(np.float32)
    want = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = rt.InferenceSession(str(dst)).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("wt,at", [("QInt8", "QUInt8"), ("QInt4", "QUInt16")])
def test_contrib_qdq_model_runs_on_runtime_core(tmp_path, wt, at):
    """quantize_static(QDQ, UseQDQContribOps): com.microsoft Q/DQ, 4-bit weights / 16-bit activations."""
    from runtime_core import quantization as rq

    src = _float_model(tmp_path)
    feeds = [{"x": RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(3)]

    class Reader(rq.CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    dst = tmp_path / "qdq.onnx"
    rq.quantize_static(str(src), str(dst), Reader(), quant_format=rq.QuantFormat.QDQ, per_channel=True,
                       activation_type=getattr(rq.QuantType, at), weight_type=getattr(rq.QuantType, wt),
                       extra_options={"UseQDQContribOps": True})
    domains = {(n.domain, n.op_type) for n in onnx.load(str(dst)).graph.node}
    assert (MS, "DequantizeLinear") in domains and (MS, "QuantizeLinear") in domains, domains
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    o = ort.InferenceSession(str(dst), so, providers=["CPUExecutionProvider"])
    r = rt.InferenceSession(str(dst))
    step = 1 / (255 if at == "QUInt8" else 65535)  # the softmax output's range is within [0, 1]
    for f in feeds:
        want, got = o.run(None, f)[0], r.run(None, f)[0]
        assert np.abs(got - want).max() <= step + 1e-7, (np.abs(got - want).max(), step)


def test_bad_inputs_give_typed_errors():
    from runtime_core.errors import ExecutionError, PartitionError

    inits = _nbits_inputs(64, 4, 32, None)

    def session(**kw):
        args = dict(K=64, N=4, bits=4, block_size=32)
        args.update(kw)
        n = helper.make_node("MatMulNBits", ["a", "b", "s"], ["y"], domain=MS, **args)
        return rt.InferenceSession(_model([n], [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)],
                                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits))

    with pytest.raises(PartitionError, match="bits=8 is not implemented"):
        session(bits=8)
    with pytest.raises(PartitionError, match="block_size=8"):
        session(block_size=8)
    with pytest.raises(ExecutionError, match="differs from K=64"):
        session().run(None, {"a": np.zeros((1, 60), np.float32)})
    a = _q(np.uint8, (3,))
    n = helper.make_node("QLinearAdd", ["a", "s", "z", "b", "s", "z8", "s", "z"], ["y"], domain=MS)
    m = _model([n], [helper.make_tensor_value_info("a", TensorProto.UINT8, None),
                     helper.make_tensor_value_info("b", TensorProto.INT8, None)],
               [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
               dict(s=np.array(0.1, np.float32), z=np.array(0, np.uint8), z8=np.array(0, np.int8)))
    with pytest.raises(ExecutionError, match="same type"):
        rt.InferenceSession(m).run(None, {"a": a, "b": a.astype(np.int8)})


def test_matmul_nbits_weight_kept_only_when_constant(monkeypatch, cpu_policy):
    from runtime_provider_cpu.ops import quant_contrib as qc

    cpu_policy(nbits_kernel="dequant")  # the float copy's path (the compiled one makes none)
    calls = []
    real = qc._nbits_weight
    monkeypatch.setattr(qc, "_nbits_weight", lambda *a: calls.append(1) or real(*a))
    K, N, bs = 64, 8, 32
    inits = _nbits_inputs(K, N, bs, "packed")
    n = helper.make_node("MatMulNBits", ["a", "b", "s", "z"], ["y"], domain=MS, K=K, N=N, bits=4, block_size=bs)
    a = RNG.standard_normal((3, K)).astype(np.float32)
    got, want = _run_both([n], {"a": a}, inits, TensorProto.FLOAT)  # constant B: dequantized once
    sess = rt.InferenceSession(_model([n], [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)],
                                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits))
    calls.clear()
    for _ in range(3):
        np.testing.assert_allclose(sess.run(None, {"a": a})[0], want, rtol=1e-4, atol=1e-4)
    assert len(calls) == 1
    # B fed at run time: read afresh every run
    b = inits.pop("b")
    for _ in range(2):
        b = RNG.integers(0, 256, b.shape).astype(np.uint8)
        got, want = _run_both([n], {"a": a, "b": b}, inits, TensorProto.FLOAT)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
