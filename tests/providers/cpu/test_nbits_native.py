"""MatMulNBits on the compiled kernel (``_native.nbits_matmul``: the 4-bit codes as stored, no
float copy of the weight) against onnxruntime: single nodes over block sizes, zero-point forms,
bias, K not a multiple of the block and both of its paths (a few rows, many rows), and MLPs
quantized by onnxruntime's MatMulNBitsQuantizer and by runtime_core.quantization."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt

ort = pytest.importorskip("onnxruntime")

from runtime_provider_cpu.fast.policy import NATIVE  # noqa: E402
from runtime_provider_cpu.ops import quant_contrib as qc  # noqa: E402

pytestmark = pytest.mark.skipif(NATIVE is None or not hasattr(NATIVE, "nbits_matmul"),
                                reason="a build without the compiled kernels: the numpy path runs (tested elsewhere)")
MS = "com.microsoft"
EPS = np.finfo(np.float32).eps


def _model(nodes, inits, inputs=("a",)):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(i, TensorProto.FLOAT, None) for i in inputs],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m.SerializeToString()


def _ort(m, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(m, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _inputs(rng, K, N, bs, zp):
    nb = -(-K // bs)
    inits = dict(b=rng.integers(0, 256, (N, nb, bs // 2)).astype(np.uint8),
                 s=rng.uniform(0.01, 0.05, N * nb).astype(np.float32))
    if zp == "packed":
        inits["z"] = rng.integers(0, 256, N * (-(-nb // 2))).astype(np.uint8)
    elif zp == "float":
        inits["z"] = rng.uniform(0, 15, N * nb).astype(np.float32)
    return inits


def _dot_bound(a, w):
    """float32 rounding of a K-term dot product (both orders of summation within it)."""
    K = a.shape[-1]
    return 2 * K * EPS * (np.abs(a.reshape(-1, K)).astype(np.float64) @ np.abs(w).astype(np.float64)) + 1e-30


@pytest.fixture
def dot_loop(request):
    """The per-column path's loop the test names: the one this CPU runs, or the portable clones."""
    NATIVE.nbits_path(1 if request.param == "portable" else 0)
    yield request.param
    NATIVE.nbits_path(0)


# the per-column path (up to NBITS_DOT_ROWS rows) on both of its loops, the panel path (130 rows)
@pytest.mark.parametrize("rows,dot_loop", [(1, "cpu"), (1, "portable"), (3, "cpu"), (3, "portable"), (130, "cpu")],
                         indirect=["dot_loop"])
@pytest.mark.parametrize("K,N,bs,zp,bias", [
    (64, 32, 16, None, False),
    (200, 45, 64, "packed", True),     # K not a multiple of the block, N not of 32
    (96, 70, 32, "float", False),
    (300, 33, 128, "packed", False),
    (520, 40, 256, None, True),        # K past one 256-term chunk
])
def test_native_matches_onnxruntime(cpu_policy, dot_loop, rows, K, N, bs, zp, bias):
    cpu_policy(nbits_kernel="native")
    rng = np.random.default_rng(K * 1000 + rows)
    inits = _inputs(rng, K, N, bs, zp)
    ins = ["a", "b", "s", "z" if zp else ""]
    if bias:
        inits["bias"] = rng.standard_normal(N).astype(np.float32)
        ins += ["", "bias"]
    n = helper.make_node("MatMulNBits", ins, ["y"], domain=MS, K=K, N=N, bits=4, block_size=bs)
    m = _model([n], inits)
    a = rng.standard_normal((rows, K)).astype(np.float32)
    sess = rt.InferenceSession(m)
    got = sess.run(None, {"a": a})[0]
    want = _ort(m, {"a": a})
    assert got.shape == want.shape and got.dtype == want.dtype
    nb = -(-K // bs)
    w = qc._nbits_weight(inits["b"], inits["s"], inits.get("z"), K, N, nb, bs, "t")
    assert np.all(np.abs(got - want) <= _dot_bound(a, w)), np.abs(got - want).max()
    # a batch of 3-D input takes the same kernel (rows flattened)
    a3 = rng.standard_normal((2, rows, K)).astype(np.float32)
    got3 = sess.run(None, {"a": a3})[0]
    assert np.all(np.abs(got3 - _ort(m, {"a": a3})) <= _dot_bound(a3, w).reshape(got3.shape))


def _spy(monkeypatch, name, arg):
    """Records argument ``arg`` of every call of ``qc.<name>`` (which still runs)."""
    calls = []
    real = getattr(qc, name)
    monkeypatch.setattr(qc, name, lambda *a: calls.append(a[arg]) or real(*a))
    return calls


def _packed_node(rng):
    """One MatMulNBits node (K 128, N 64, block 32, packed zero points): its inputs and model."""
    inits = _inputs(rng, 128, 64, 32, "packed")
    n = helper.make_node("MatMulNBits", ["a", "b", "s", "z"], ["y"], domain=MS, K=128, N=64, bits=4, block_size=32)
    return inits, _model([n], inits)


def test_native_keeps_no_float_weight(cpu_policy, monkeypatch):
    cpu_policy(nbits_kernel="native")
    calls = _spy(monkeypatch, "_nbits_weight", 4)
    rng = np.random.default_rng(3)
    inits, m = _packed_node(rng)
    sess = rt.InferenceSession(m)
    for rows in (1, 20, 1):
        sess.run(None, {"a": rng.standard_normal((rows, 128)).astype(np.float32)})
    assert sess.run(None, {"a": np.zeros((0, 128), np.float32)})[0].shape == (0, 64)  # an empty batch too
    assert calls == []


def test_measured_choice_dequantizes_a_slice_only(cpu_policy, monkeypatch):
    """Choosing between the kernel and the dequantized weight by measurement never makes a
    float copy of the whole weight: both are timed on NBITS_TUNE_COLS columns."""
    from runtime_provider_cpu.fast import autotune

    cpu_policy(nbits_kernel="", tune=True)
    autotune.forget()
    calls = []
    real = qc._nbits_weight
    monkeypatch.setattr(qc, "_nbits_weight", lambda *a: calls.append(a[4]) or real(*a))
    K, N = 64, qc.NBITS_TUNE_COLS + 100
    rng = np.random.default_rng(4)
    inits = _inputs(rng, K, N, 32, None)
    n = helper.make_node("MatMulNBits", ["a", "b", "s"], ["y"], domain=MS, K=K, N=N, bits=4, block_size=32)
    m = _model([n], inits)
    a = rng.standard_normal((16, K)).astype(np.float32)
    got = rt.InferenceSession(m).run(None, {"a": a})[0]
    assert calls[0] == qc.NBITS_TUNE_COLS
    # the kernel chosen, the weight is never dequantized whole; the dequantized one, once
    assert calls[1:] in ([], [N])
    w = real(inits["b"], inits["s"], None, K, N, 2, 32, "t")
    assert np.all(np.abs(got - _ort(m, {"a": a})) <= _dot_bound(a, w))


def _mlp(rng, K=96, H=160, N=48):
    """x [batch, K] -> MatMul -> Relu -> MatMul (+ bias) -> y, weights as initializers."""
    inits = {"w1": (rng.standard_normal((K, H)) * 0.2).astype(np.float32),
             "w2": (rng.standard_normal((H, N)) * 0.2).astype(np.float32),
             "c": rng.standard_normal(N).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["p"]), helper.make_node("Add", ["p", "c"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", K])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", N])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("tool", ["onnxruntime", "runtime_core"])
@pytest.mark.parametrize("symmetric,bs", [(True, 32), (False, 64)], ids=["sym32", "asym64"])
def test_quantized_mlp_matches_onnxruntime(cpu_policy, tool, symmetric, bs):
    cpu_policy(nbits_kernel="native")
    rng = np.random.default_rng(7)
    fm = _mlp(rng)
    if tool == "onnxruntime":
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    else:
        from runtime_core.quantization import MatMulNBitsQuantizer
    q = MatMulNBitsQuantizer(copy.deepcopy(fm), block_size=bs, is_symmetric=symmetric)
    q.process()
    qm = q.model.model
    assert [n.op_type for n in qm.graph.node].count("MatMulNBits") == 2
    data = qm.SerializeToString()
    sess = rt.InferenceSession(data)
    for rows in (1, 2, 150):
        x = rng.standard_normal((rows, 96)).astype(np.float32)
        got, want = sess.run(None, {"x": x})[0], _ort(data, {"x": x})
        # two products in a row: each within a dot product's rounding, the second's input
        # differing by the first's
        scale = np.abs(want).max() + 1.0
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * scale)


def _abs_terms_weight(inits, K, N, bs):
    """|q| s + |z| s, [K, N]: the per-column loop sums q a per block and subtracts z s sum(a) once,
    so its float32 rounding is bounded by the two terms' magnitudes, not by |(q - z) s|."""
    nb = -(-K // bs)
    q = qc._unpack4(inits["b"].reshape(N, nb, bs // 2), bs).astype(np.float64)
    z = np.abs(qc._nbits_zeros(inits.get("z"), N, nb, "t")).astype(np.float64)
    s = inits["s"].reshape(N, nb, 1).astype(np.float64)
    return ((q + z) * s).reshape(N, nb * bs)[:, :K].T


# the per-column path called directly: every row count it takes, both thread counts, the loop this
# CPU runs (AVX-512 from blocks of 32) and the portable clones, against the dequantized weight in float64
@pytest.mark.kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("loop", ["cpu", "portable"])
@pytest.mark.parametrize("K,N,bs,zp,bias", [
    (768, 77, 32, None, False),        # GPT-2's K; N not a multiple of the 4 columns in flight nor of 16
    (200, 45, 64, "packed", True),     # K not a multiple of the block
    (100, 19, 32, "float", True),      # a K tail inside a 32-term step
    (300, 33, 128, "packed", False),
    (520, 40, 256, "float", True),
    (80, 21, 16, "packed", True),      # blocks of 16: the portable clones on every CPU
    (1000, 5, 32, None, True),         # fewer columns than one unit; nb past 16 for the zero-point sums
])
def test_dot_path_matches_dequantized_reference(rows, threads, loop, K, N, bs, zp, bias):
    rng = np.random.default_rng(K * 7 + N * 3 + rows)
    inits = _inputs(rng, K, N, bs, zp)
    nb = -(-K // bs)
    w = qc._nbits_weight(inits["b"], inits["s"], inits.get("z"), K, N, nb, bs, "t")
    bv = rng.standard_normal(N).astype(np.float32) if bias else None
    a = rng.standard_normal((rows, K)).astype(np.float32)
    y = np.full((rows, N), np.nan, np.float32)
    NATIVE.nbits_path(1 if loop == "portable" else 0)
    try:
        NATIVE.nbits_matmul(a, inits["b"], inits["s"], inits.get("z"), zp == "float", bv, y, (rows, K, N, bs),
                            threads)
    finally:
        NATIVE.nbits_path(0)
    want = a.astype(np.float64) @ w.astype(np.float64) + (0 if bv is None else bv.astype(np.float64))
    bound = 2 * (K + 2) * EPS * (np.abs(a).astype(np.float64) @ _abs_terms_weight(inits, K, N, bs)
                                 + (0 if bv is None else np.abs(bv))) + 1e-30
    err = np.abs(y - want)
    assert np.all(err <= bound), (err / bound).max()


@pytest.mark.kernel
def test_bad_buffers_raise():
    K, N, bs = 64, 8, 32
    a = np.zeros((2, K), np.float32)
    b = np.zeros((N, 2, 16), np.uint8)
    s = np.ones(N * 2, np.float32)
    y = np.empty((2, N), np.float32)
    NATIVE.nbits_matmul(a, b, s, None, False, None, y, (2, K, N, bs), 1)
    with pytest.raises(ValueError, match="B holds"):
        NATIVE.nbits_matmul(a, b[:4], s, None, False, None, y, (2, K, N, bs), 1)
    with pytest.raises(ValueError, match="zero_points holds"):
        NATIVE.nbits_matmul(a, b, s, np.zeros(3, np.uint8), False, None, y, (2, K, N, bs), 1)
    with pytest.raises(ValueError, match="block_size"):
        NATIVE.nbits_matmul(a, b, s, None, False, None, y, (2, K, N, 48), 1)
    with pytest.raises(ValueError, match="block_size"):
        NATIVE.nbits_matmul(a, b, s, None, False, None, y, (2, K, N, 512), 1)
    with pytest.raises(ValueError, match="Y holds"):
        NATIVE.nbits_matmul(a, b, s, None, False, None, y[:1], (2, K, N, bs), 1)


@pytest.mark.parametrize("rows", [2, 16])
def test_large_weight_or_few_rows_take_the_kernel_unmeasured(cpu_policy, monkeypatch, rows):
    """A few rows (the per-column path reads the codes once), or many rows of a weight whose
    float copy passes NBITS_COPY_MAX on the AVX-512 tiles: the kernel, no float copy made at all;
    elsewhere (the tiles' portable build) both are measured on a slice."""
    from runtime_provider_cpu.fast import autotune

    cpu_policy(nbits_kernel="", tune=True)
    autotune.forget()
    calls = []
    real = qc._nbits_weight
    monkeypatch.setattr(qc, "_nbits_weight", lambda *a: calls.append(a[4]) or real(*a))
    K, N = 1024, qc.NBITS_COPY_MAX // 4096 + 32
    rng = np.random.default_rng(5)
    inits = _inputs(rng, K, N, 128, "packed")
    n = helper.make_node("MatMulNBits", ["a", "b", "s", "z"], ["y"], domain=MS, K=K, N=N, bits=4, block_size=128)
    m = _model([n], inits)
    a = rng.standard_normal((rows, K)).astype(np.float32)
    got = rt.InferenceSession(m).run(None, {"a": a})[0]
    if rows <= NATIVE.NBITS_DOT_ROWS or NATIVE.CONV_FAST:
        assert calls == []
    else:
        assert calls[0] == qc.NBITS_TUNE_COLS
    w = real(inits["b"], inits["s"], inits["z"], K, N, K // 128, 128, "t")
    assert np.all(np.abs(got - _ort(m, {"a": a})) <= _dot_bound(a, w))


def test_extreme_sizes_give_typed_errors():
    """Sizes up to 2^63 - 1 (their products overflowing): a ValueError or MemoryError, never a
    signal; in a child process, so that a crash fails this test instead of ending pytest."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import numpy as np
        from runtime_provider_cpu import _native as nv
        rng = np.random.default_rng(0)
        big = [1, 3, 16, 2 ** 31 - 1, 2 ** 32 + 1, 2 ** 40, 2 ** 62, 2 ** 63 - 1]
        a, b, s, y = (np.zeros(64, np.float32), np.zeros(64, np.uint8), np.ones(8, np.float32),
                      np.zeros(64, np.float32))
        typed = 0
        for case in range(300):
            M, K, N = (int(rng.choice(big)) for _ in range(3))
            bs = int(rng.choice([16, 32, 256]))
            zp = [None, np.zeros(8, np.uint8), np.zeros(8, np.float32)][case % 3]
            try:
                nv.nbits_matmul(a, b, s, zp, case % 3 == 2, None, y, (M, K, N, bs), 2)
            except (ValueError, MemoryError):
                typed += 1
        print(typed)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert int(r.stdout) > 0


def _panels_ref(b, N, K, bs):
    """nbits_pack_panels' layout built in numpy: [ceil(N / 32)][Kp][16] bytes, byte i of a term holding
    column 32p + i's code (low nibble) and 32p + 16 + i's (high), zeros past N."""
    nb = -(-K // bs)
    P, kp = -(-N // 32), nb * bs
    q = np.zeros((P * 32, kp), np.uint8)
    q[:N] = qc._unpack4(b.reshape(N, nb, bs // 2), bs).reshape(N, kp)
    q = q.reshape(P, 2, 16, kp)
    return (q[:, 0] | (q[:, 1] << 4)).transpose(0, 2, 1).reshape(-1)


@pytest.mark.parametrize("K,N,bs", [(64, 32, 16), (200, 45, 64), (96, 70, 32), (520, 40, 256), (300, 1, 128)])
def test_pack_panels_layout(K, N, bs):
    rng = np.random.default_rng(K + N)
    inits = _inputs(rng, K, N, bs, None)
    nb = -(-K // bs)
    q = qc._nbits_panels(NATIVE, inits["b"], N, K, nb, bs)
    np.testing.assert_array_equal(q, _panels_ref(inits["b"], N, K, bs))
    # the codes of column n, term k read back from the panels are the stored ones; 0 past N
    P = -(-N // 32)
    codes = q.reshape(P, nb * bs, 16)
    full = np.concatenate([codes & 15, codes >> 4], axis=2).transpose(0, 2, 1).reshape(P * 32, nb * bs)
    np.testing.assert_array_equal(full[:N], qc._unpack4(inits["b"].reshape(N, nb, bs // 2), bs).reshape(N, -1))
    assert not full[N:].any()


@pytest.mark.kernel
@pytest.mark.parametrize("loop", ["cpu", "portable"])
@pytest.mark.parametrize("rows,K,N,bs,zp,bias", [
    (5, 64, 32, 16, None, False),
    (13, 200, 45, 64, "packed", True),
    (130, 96, 70, 32, "float", False),
    (40, 520, 40, 256, None, True),
    (25, 300, 97, 128, "packed", True),
])
def test_panels_match_stored_codes(loop, rows, K, N, bs, zp, bias):
    """The panel path on the repacked codes gives the same bits as on the codes as stored (the same
    (q - z) * s, the same tiles), and stays within a dot product's rounding of the dequantized weight."""
    NATIVE.nbits_path(1 if loop == "portable" else 0)
    try:
        rng = np.random.default_rng(rows * K)
        inits = _inputs(rng, K, N, bs, zp)
        nb = -(-K // bs)
        z = inits.get("z")
        bv = rng.standard_normal(N).astype(np.float32) if bias else None
        a = rng.standard_normal((rows, K)).astype(np.float32)
        pan = qc._nbits_panels(NATIVE, inits["b"], N, K, nb, bs)
        y0, y1 = np.empty((rows, N), np.float32), np.empty((rows, N), np.float32)
        args = (inits["b"], inits["s"], z, zp == "float", bv)
        for t in (1, 2):
            NATIVE.nbits_matmul(a, *args, y0, (rows, K, N, bs), t)
            NATIVE.nbits_matmul(a, *args, y1, (rows, K, N, bs), t, pan)
            np.testing.assert_array_equal(y0, y1)
    finally:
        NATIVE.nbits_path(0)
    w = qc._nbits_weight(inits["b"], inits["s"], z, K, N, nb, bs, "t")
    want = a.astype(np.float64) @ w.astype(np.float64) + (0 if bv is None else bv)
    assert np.all(np.abs(y1 - want) <= _dot_bound(a, w) + 4 * EPS * np.abs(want))


def test_panels_made_once_per_node(cpu_policy, monkeypatch):
    """The repacked codes are made on the first call of more than NBITS_DOT_ROWS rows and shared by
    the node's other row counts; a few rows never make them."""
    cpu_policy(nbits_kernel="native")
    calls = _spy(monkeypatch, "_nbits_panels", 2)
    rng = np.random.default_rng(8)
    inits, m = _packed_node(rng)
    sess = rt.InferenceSession(m)
    sess.run(None, {"a": rng.standard_normal((1, 128)).astype(np.float32)})
    assert calls == []
    for rows in (20, 30, 20):
        a = rng.standard_normal((rows, 128)).astype(np.float32)
        got = sess.run(None, {"a": a})[0]
        w = qc._nbits_weight(inits["b"], inits["s"], inits["z"], 128, 64, 4, 32, "t")
        assert np.all(np.abs(got - _ort(m, {"a": a})) <= _dot_bound(a, w))
    assert calls == [64]


@pytest.mark.kernel
def test_bad_panels_raise():
    K, N, bs, M = 64, 40, 32, 6
    rng = np.random.default_rng(9)
    a = np.zeros((M, K), np.float32)
    b = rng.integers(0, 256, (N, 2, 16)).astype(np.uint8)
    s = np.ones(N * 2, np.float32)
    y = np.empty((M, N), np.float32)
    q = qc._nbits_panels(NATIVE, b, N, K, 2, bs)
    NATIVE.nbits_matmul(a, b, s, None, False, None, y, (M, K, N, bs), 1, q)
    with pytest.raises(ValueError, match="panels holds"):
        NATIVE.nbits_matmul(a, b, s, None, False, None, y, (M, K, N, bs), 1, q[:-1])
    with pytest.raises(TypeError):
        NATIVE.nbits_matmul(a, b, s, None, False, None, y, (M, K, N, bs), 1, (q,))
    with pytest.raises(ValueError, match="out holds"):
        NATIVE.nbits_pack_panels(b, q[:-16], (N, K, bs))
    with pytest.raises(ValueError, match="B holds"):
        NATIVE.nbits_pack_panels(b[:4], q, (N, K, bs))
    with pytest.raises(ValueError, match="block_size"):
        NATIVE.nbits_pack_panels(b, q, (N, K, 48))
    for big in (2 ** 40, 2 ** 62, 2 ** 63 - 1):  # products past Py_ssize_t: typed errors, no signal
        with pytest.raises((ValueError, MemoryError)):
            NATIVE.nbits_pack_panels(b, q, (big, big, bs))
        with pytest.raises((ValueError, MemoryError)):
            NATIVE.nbits_matmul(a, b, s, None, False, None, y, (M, big, big, bs), 1, q)
