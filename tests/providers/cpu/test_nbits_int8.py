"""MatMulNBits with accuracy_level=4 (onnxruntime's int8 compute, "CompInt8") on the compiled kernel
``_native.nbits_int8_matmul``: a quantized to int8 per block, int8 dots on the 4-bit codes, against
onnxruntime's own accuracy_level=4 outputs and a numpy reference of the same arithmetic, on both
of its loops (AVX-512 VNNI where the CPU has it, portable C), symmetric and asymmetric weights,
blocks of 32/64/128, odd K and N, one row and 128 rows."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt

ort = pytest.importorskip("onnxruntime")

from runtime_provider_cpu.fast.policy import NATIVE  # noqa: E402
from runtime_provider_cpu.ops import quant_contrib as qc  # noqa: E402

pytestmark = [pytest.mark.native,
              pytest.mark.skipif(NATIVE is None or not hasattr(NATIVE, "nbits_int8_matmul"),
                                 reason="a build without the compiled kernels: level 4 runs on float compute")]
MS = "com.microsoft"


def _model(K, N, bs, inits, ins, level=4):
    n = helper.make_node("MatMulNBits", ins, ["y"], domain=MS, K=K, N=N, bits=4, block_size=bs,
                         accuracy_level=level)
    g = helper.make_graph([n], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m.SerializeToString()


def _ort(m, a):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    return ort.InferenceSession(m, so, providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]


def _reference(a, b, s, z, bias, K, N, bs):
    """The int8 arithmetic in numpy (float64 sums): a per block to rint(a * 127 / amax), then
    sum over blocks of (amax / 127) * s * sum(aq * (q - z))."""
    nb = -(-K // bs)
    ap = np.zeros((a.shape[0], nb * bs), np.float32)
    ap[:, :K] = a
    ab = ap.reshape(-1, nb, bs)
    amax = np.abs(ab).max(axis=2, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    aq = np.rint(ab * inv).astype(np.float64)
    sa = (amax / np.float32(127)).astype(np.float32).astype(np.float64)
    q = qc._unpack4(b.reshape(N, nb, bs // 2), bs).astype(np.float64)
    zz = np.asarray(qc._nbits_zeros(z, N, nb, "t"), np.float64) * np.ones((N, nb, 1))
    dots = np.einsum("mbk,nbk->mnb", aq, q - zz)
    y = np.einsum("mnb,mb,nb->mn", dots, sa[..., 0], s.reshape(N, nb).astype(np.float64))
    return y + (0 if bias is None else bias.astype(np.float64))


# nbits_int8_path's indices; vnni256-evex is the AVX-VNNI loop's body EVEX-encoded, which AVX512_VNNI +
# VL CPUs run, so that its logic is tested there too (the VEX form runs only where CPUID says AVX-VNNI)
LOOPS = {"portable": 0, "avx2": 1, "avx512vnni": 2, "avxvnni": 3, "vnni256-evex": 4}


@pytest.fixture(params=["cpu", "portable", "avx2", "avxvnni", "vnni256-evex"])
def loop(request):
    """The kernel's loop the test names: the one this CPU picks, or the portable C, AVX2, AVX-VNNI
    loop or its EVEX twin (where this CPU runs it)."""
    if request.param != "cpu" and NATIVE.nbits_int8_path(LOOPS[request.param]) != request.param:
        NATIVE.nbits_int8_path(9)
        pytest.skip(f"this CPU does not run the {request.param} loop")
    yield request.param
    NATIVE.nbits_int8_path(9)


@pytest.mark.parametrize("rows", [1, 128])
@pytest.mark.parametrize("K,N,bs,sym,bias", [
    (96, 48, 32, True, False),
    (200, 45, 64, False, True),     # K not a multiple of the block, N not of 16
    (333, 37, 128, True, True),     # odd K and N
    (256, 17, 32, False, False),
])
def test_level4_matches_onnxruntime(loop, rows, K, N, bs, sym, bias):
    rng = np.random.default_rng(K * 7 + rows)
    nb = -(-K // bs)
    inits = dict(b=rng.integers(0, 256, (N, nb, bs // 2)).astype(np.uint8),
                 s=rng.uniform(0.01, 0.05, N * nb).astype(np.float32))
    ins = ["a", "b", "s", "" if sym else "z"]
    if not sym:
        inits["z"] = rng.integers(0, 256, N * (-(-nb // 2))).astype(np.uint8)
    if bias:
        inits["bias"] = rng.standard_normal(N).astype(np.float32)
        ins += ["", "bias"]  # g_idx absent
    m = _model(K, N, bs, inits, ins)
    a = rng.standard_normal((rows, K)).astype(np.float32)
    got = rt.InferenceSession(m).run(None, {"a": a})[0]
    want = _ort(m, a)
    ref = _reference(a, inits["b"], inits["s"], inits.get("z"), inits.get("bias"), K, N, bs)
    assert got.shape == want.shape == (rows, N)
    # the integer dots are exact: what is left is float32 rounding of nb block terms
    scale = np.abs(ref).max() + 1
    assert np.abs(got - ref).max() <= 1e-5 * scale, np.abs(got - ref).max()
    # onnxruntime quantizes a the same way: a code may differ by one where a * 127 / amax lands
    # on a half in one runtime's float rounding and not the other's, hence a looser bound
    assert np.abs(got - want).max() <= 1e-4 * scale, np.abs(got - want).max()
    # and it is int8 compute, not float: level 0 on the same weights differs by a's rounding
    f = rt.InferenceSession(_model(K, N, bs, inits, ins, level=0)).run(None, {"a": a})[0]
    assert np.abs(f - got).max() > 1e-6 * scale


@pytest.mark.kernel
def test_loops_agree_bit_for_bit():
    rng = np.random.default_rng(5)
    K, N, bs, M = 320, 50, 64, 13
    nb = -(-K // bs)
    b = rng.integers(0, 256, (N, nb, bs // 2)).astype(np.uint8)
    s = rng.uniform(0.01, 0.05, N * nb).astype(np.float32)
    z = rng.integers(0, 256, N * (-(-nb // 2))).astype(np.uint8)
    packed = qc._nbits_int8_pack(b, s, z, N, nb, bs, "t")
    a = rng.standard_normal((M, K)).astype(np.float32)
    out = {}
    for name, force in LOOPS.items():
        if NATIVE.nbits_int8_path(force) == name:
            out[name] = np.empty((M, N), np.float32)
            NATIVE.nbits_int8_matmul(a, *packed, None, out[name], (M, K, N, bs), 2)
    NATIVE.nbits_int8_path(9)
    assert "portable" in out
    for name, y in out.items():
        assert np.array_equal(y, out["portable"]), name


def test_zero_and_nonfinite_rows_do_not_crash():
    rng = np.random.default_rng(6)
    K, N, bs = 64, 16, 32
    b = rng.integers(0, 256, (N, 2, bs // 2)).astype(np.uint8)
    s = rng.uniform(0.01, 0.05, N * 2).astype(np.float32)
    m = _model(K, N, bs, dict(b=b, s=s), ["a", "b", "s"])
    a = np.zeros((3, K), np.float32)
    a[1, 5] = np.inf
    a[2, 7] = np.nan
    y = rt.InferenceSession(m).run(None, {"a": a})[0]
    assert np.array_equal(y[0], np.zeros(N, np.float32))  # an all-zero row: scale 0, no division


@pytest.mark.kernel
def test_bad_buffers_raise():
    y = np.empty((2, 16), np.float32)
    a = np.zeros((2, 64), np.float32)
    bp, sb, zs = np.zeros(2 * 64, np.uint8), np.zeros(32, np.float32), np.zeros(32, np.float32)
    NATIVE.nbits_int8_matmul(a, np.zeros(8 * 64, np.uint8), sb, zs, None, y, (2, 64, 16, 32), 1)
    with pytest.raises(ValueError, match=r"B \(packed\)"):
        NATIVE.nbits_int8_matmul(a, bp, sb, zs, None, y, (2, 64, 16, 32), 1)
    with pytest.raises(ValueError, match="block_size"):
        NATIVE.nbits_int8_matmul(a, bp, sb, zs, None, y, (2, 64, 16, 24), 1)
    with pytest.raises(ValueError):
        NATIVE.nbits_int8_matmul(a, np.zeros(8 * 64, np.uint8), sb, zs, None, y, (2 ** 40, 2 ** 40, 16, 32), 1)


def test_quantizer_sets_accuracy_level():
    from runtime_core.quantization import MatMulNBitsQuantizer

    rng = np.random.default_rng(7)
    w = rng.standard_normal((64, 24)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["y"], "mm")], "g",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, [3, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 24])],
                          [numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    q = MatMulNBitsQuantizer(model, block_size=32, is_symmetric=False, accuracy_level=4)
    q.process()
    (node,) = [n for n in q.model.model.graph.node if n.op_type == "MatMulNBits"]
    assert {a.name: a.i for a in node.attribute}["accuracy_level"] == 4
    a = rng.standard_normal((3, 64)).astype(np.float32)
    m = q.model.model.SerializeToString()
    got = rt.InferenceSession(m).run(None, {"a": a})[0]
    want = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    assert np.abs(got - want).max() <= 1e-4 * (np.abs(want).max() + 1)


def test_without_vnni_level4_keeps_float_compute(monkeypatch):
    rng = np.random.default_rng(8)
    K, N, bs = 96, 40, 32
    inits = dict(b=rng.integers(0, 256, (N, 3, bs // 2)).astype(np.uint8),
                 s=rng.uniform(0.01, 0.05, N * 3).astype(np.float32))
    a = rng.standard_normal((4, K)).astype(np.float32)
    f = rt.InferenceSession(_model(K, N, bs, inits, ["a", "b", "s"], level=0)).run(None, {"a": a})[0]
    monkeypatch.setattr(qc, "_nbits_int8_fast", lambda nat: False)
    got = rt.InferenceSession(_model(K, N, bs, inits, ["a", "b", "s"])).run(None, {"a": a})[0]
    assert np.array_equal(got, f)


def _biased_mlp(rng, level, bias_shape=None, extra_reader=False):
    """x -> MatMulNBits -> Add(bias) [-> Relu], K=64 N=48; the Add's output also a graph output
    where ``extra_reader``."""
    K, N, bs = 64, 48, 32
    inits = dict(b=rng.integers(0, 256, (N, 2, bs // 2)).astype(np.uint8),
                 s=rng.uniform(0.01, 0.05, N * 2).astype(np.float32),
                 bias=rng.standard_normal(bias_shape or (N,)).astype(np.float32))
    nodes = [helper.make_node("MatMulNBits", ["a", "b", "s"], ["mm"], "q4", domain=MS, K=K, N=N, bits=4,
                              block_size=bs, accuracy_level=level),
             helper.make_node("Add", ["bias", "mm"], ["t"], "add"),
             helper.make_node("Relu", ["t"], ["y"], "relu")]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader:
        outs.append(helper.make_tensor_value_info("mm", TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)], outs,
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m.SerializeToString()


def _ops(sess):
    return [n["op_type"] for n in sess.get_partition_report().to_dict()["nodes"]]


@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("rows", [1, 128])
def test_bias_add_goes_into_matmulnbits(level, rows):
    rng = np.random.default_rng(9 + rows)
    m = _biased_mlp(rng, level)
    a = rng.standard_normal((2, rows, 64)).astype(np.float32)
    sess = rt.InferenceSession(m)
    assert "Add" not in _ops(sess) and "MatMulNBits" in _ops(sess)
    so = rt.SessionOptions()
    so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    plain = rt.InferenceSession(m, so)
    assert "Add" in _ops(plain)
    got, want = sess.run(None, {"a": a})[0], plain.run(None, {"a": a})[0]
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert np.allclose(got, _ort(m, a), rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("case", ["broadcast_bias", "shared_output"])
def test_bias_add_stays_where_it_must(case):
    rng = np.random.default_rng(10)
    m = _biased_mlp(rng, 0, bias_shape=(3, 1, 48) if case == "broadcast_bias" else None,
                    extra_reader=case == "shared_output")
    sess = rt.InferenceSession(m)
    assert "Add" in _ops(sess)
    a = rng.standard_normal((1, 64)).astype(np.float32)
    got = sess.run(None, {"a": a})
    want = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"a": a})
    for g_, w_ in zip(got, want):
        assert g_.shape == w_.shape and np.allclose(g_, w_, rtol=1e-4, atol=1e-4 * np.abs(w_).max())


@pytest.mark.kernel
def test_cpu_choice_follows_the_isa():
    isa = NATIVE.cpu_isa()
    want = ("avx512vnni" if isa["avx512_vnni"] and isa["avx512f"] else "avxvnni" if isa["avx_vnni"]
            else "avx2" if isa["avx2"] else "portable")
    assert NATIVE.nbits_int8_path(9) == want
    assert NATIVE.nbits_int8_path(7) == want  # no such loop: the CPU's choice again


@pytest.mark.kernel
def test_fast_flag_names_the_cpu_choice():
    # accuracy_level 4 routes to int8 compute only where the CPU's own choice is a vector loop
    assert bool(NATIVE.NBITS_INT8_FAST) == (NATIVE.nbits_int8_path(9) != "portable")
    assert qc._nbits_int8_fast(NATIVE) == bool(NATIVE.NBITS_INT8_FAST)
