"""The compiled int8 kernels of the CPU provider (``_native.qgemm``, ``_native.qconv_nchw``,
``_native.qdwconv``, ``_native.dyn_quantize``, ``_native.qadd_lut``)
against the numpy paths they replace, bit for bit: every inner loop this machine runs (VNNI, the
AVX-VNNI body as its EVEX twin, AVX2, portable), odd K and N, signed and unsigned operands, scalar
and per-column B zero points, int32 wrap-around, a constant (packed once) and a run-time B."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from oracle import make_model, run_oracle, run_ours

quant = pytest.importorskip("runtime_provider_cpu.ops.quant")
if quant._native is None:
    pytest.skip("the compiled extension is not built here", allow_module_level=True)

RNG = np.random.default_rng(97)
F32, I8, U8 = np.float32, np.int8, np.uint8
# qgemm_path's indices; vnni256-evex is the AVX-VNNI loop's body EVEX-encoded, run on AVX512_VNNI + VL
# CPUs in its stead (the VEX form runs on no CPU here), avxvnni runs only where CPUID says AVX-VNNI
PATHS = ["portable", "avx2", "avx512vnni", "avxvnni", "vnni256-evex"]


@pytest.fixture(params=range(len(PATHS)), ids=PATHS)
def path(request):
    got = quant._native.qgemm_path(request.param)
    if got != PATHS[request.param]:
        quant._native.qgemm_path(9)
        pytest.skip(f"this CPU does not run the {PATHS[request.param]} loop")
    yield got
    quant._native.qgemm_path(9)  # back to the best this CPU runs


def ints(shape, dtype):
    info = np.iinfo(dtype)
    return RNG.integers(int(info.min), int(info.max) + 1, size=shape).astype(dtype)


def both(model, feeds, monkeypatch):
    """The model's outputs on the compiled kernels, then on the numpy paths."""
    native, _ = run_ours(model, feeds)
    with monkeypatch.context() as m:
        m.setattr(quant, "_native", None)
        ref, _ = run_ours(model, feeds)
    return native, ref


SHAPES = [(1, 1, 1), (3, 5, 7), (9, 33, 31), (17, 64, 48), (2, 130, 70)]


@pytest.mark.parametrize("M,K,N", SHAPES)
@pytest.mark.parametrize("a_t,b_t", [(U8, I8), (U8, U8), (I8, I8), (I8, U8)])
@pytest.mark.parametrize("const_b", [True, False])
def test_matmul_integer_exact(path, M, K, N, a_t, b_t, const_b, monkeypatch):
    b = ints((K, N), b_t)
    zb = ints((N,), b_t) if N > 1 and K % 2 else ints((), b_t)
    feeds = {"a": ints((2, M, K), a_t), "za": ints((), a_t), "zb": zb}
    inits = {}
    (inits if const_b else feeds)["b"] = b
    node = helper.make_node("MatMulInteger", ["a", "b", "za", "zb"], ["y"])
    model = make_model([node], {k: v for k, v in feeds.items()}, ["y"], opset=10, initializers=inits)
    for _ in range(2):  # the second run reuses a constant B's packing
        native, ref = both(model, feeds, monkeypatch)
        assert native[0].dtype == np.int32
        np.testing.assert_array_equal(native[0], ref[0])
        np.testing.assert_array_equal(
            native[0], (feeds["a"].astype(np.int64) - feeds["za"].astype(np.int64)) @ (b.astype(np.int64) - zb.astype(np.int64)))
        feeds["a"] = ints((2, M, K), a_t)


def test_matmul_integer_wraps_like_int32(path, monkeypatch):
    # 255 * 255 * 40000 > 2**31: the accumulator wraps, as the spec allows and numpy's path does
    a, b = np.full((2, 40000), 255, U8), np.full((40000, 3), 255, U8)
    feeds = {"a": a, "b": b, "za": np.array(0, U8), "zb": np.array(0, U8)}
    model = make_model([helper.make_node("MatMulInteger", list(feeds), ["y"])], feeds, ["y"], opset=10)
    native, ref = both(model, feeds, monkeypatch)
    np.testing.assert_array_equal(native[0], ref[0])
    assert int(native[0][0, 0]) == np.int64(255 * 255 * 40000).astype(np.int32)


@pytest.mark.parametrize("M,K,N", SHAPES)
@pytest.mark.parametrize("t", [U8, I8])
@pytest.mark.parametrize("per_column", [False, True])
def test_qlinear_matmul_exact(path, M, K, N, t, per_column, monkeypatch):
    a, b = ints((M, K), t), ints((K, N), t)
    sb = RNG.uniform(0.002, 0.02, (N,)).astype(F32) if per_column else np.array(0.01, F32)
    zb = ints((N,), t) if per_column else ints((), t)
    za = ints((), t)
    acc = (a.astype(np.int64) - za) @ (b.astype(np.int64) - zb)
    sy = np.float32(0.03 * float(np.max(sb)) * max(1, int(np.max(np.abs(acc)))) / 100)  # outputs mostly in range
    feeds = {"a": a, "sa": np.array(0.03, F32), "za": za, "b": b, "sb": sb, "zb": zb,
             "sy": np.array(sy, F32), "zy": np.array(128 if t == U8 else 3, t)}
    model = make_model([helper.make_node("QLinearMatMul", list(feeds), ["y"])], feeds, ["y"], opset=21)
    native, ref = both(model, feeds, monkeypatch)
    assert native[0].dtype == t
    np.testing.assert_array_equal(native[0], ref[0])
    assert M * N < 4 or 0 < np.count_nonzero((native[0] != np.iinfo(t).min) & (native[0] != np.iinfo(t).max))


CONVS = [  # (x shape, w shape, attributes)
    ((1, 3, 9, 8), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 4, 11, 10), (7, 4, 3, 2), {"strides": [2, 1], "dilations": [1, 2], "pads": [0, 1, 2, 0]}),
    ((1, 6, 7, 7), (33, 6, 1, 1), {}),
    ((1, 4, 6, 6), (4, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),  # grouped: the numpy path
    ((3, 7, 5, 3), (9, 7, 1, 1), {}),  # pointwise: 15 pixels an image, row blocks span images
    ((2, 5, 7, 6), (6, 5, 1, 1), {"strides": [2, 2]}),  # strided 1x1: im2col
    # 256+ output pixels: W times the image's rows (qconv_nchw), pointwise and through K x P im2col rows
    ((1, 6, 19, 17), (10, 6, 1, 1), {}),
    ((1, 24, 14, 14), (40, 24, 1, 1), {}),  # MobileNet's 14x14 planes: 196 pixels, 7 tiles (the last partial)
    ((2, 3, 33, 31), (9, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    # pixel-row im2col from the NHWC copy: 16-channel transposes and a tail, window rows as one run
    ((1, 20, 12, 11), (8, 20, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 17, 9, 10), (5, 17, 3, 3), {"strides": [2, 2], "dilations": [2, 1], "pads": [2, 1, 0, 2]}),
]


@pytest.mark.parametrize("xs,ws,attrs", CONVS)
@pytest.mark.parametrize("t", [U8, I8])
@pytest.mark.parametrize("per_channel,bias", [(False, False), (True, True)])
def test_qlinear_conv_exact(path, xs, ws, attrs, t, per_channel, bias, monkeypatch):
    x, w = ints(xs, t), ints(ws, I8)
    m = ws[0]
    feeds = {"x": x, "sx": np.array(0.02, F32), "zx": ints((), t), "w": w,
             "sw": RNG.uniform(0.002, 0.02, (m,)).astype(F32) if per_channel else np.array(0.01, F32),
             "zw": np.zeros(m if per_channel else (), I8), "sy": np.array(0.02 * 0.01 * 60 * np.sqrt(np.prod(ws[1:])), F32),
             "zy": np.array(128 if t == U8 else 0, t)}
    if bias:
        feeds["B"] = RNG.integers(-5000, 5000, (m,)).astype(np.int32)
    node = helper.make_node("QLinearConv", list(feeds), ["y"], **attrs)
    inits = {"w": feeds.pop("w")}
    model = make_model([node], feeds, ["y"], opset=10, initializers=inits)
    for _ in range(2):  # the second run reuses the packed weight
        native, ref = both(model, feeds, monkeypatch)
        assert native[0].dtype == t and native[0].shape == ref[0].shape
        np.testing.assert_array_equal(native[0], ref[0])
        feeds["x"] = ints(xs, t)


DEPTHWISE = [  # (x shape, kernel, attributes): MobileNet's 3x3 s1 / s2, and odd geometries
    ((1, 8, 10, 9), (3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 5, 11, 12), (3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 3, 13, 9), (5, 5), {"strides": [2, 1], "pads": [2, 0, 1, 2]}),
    ((1, 4, 9, 10), (3, 2), {"dilations": [2, 3], "pads": [0, 1, 2, 0]}),
    ((1, 6, 7, 7), (3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    # more than one 16-channel block (the last one partial), rows of 16+ pixels (transposed whole)
    ((1, 35, 20, 33), (3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 32, 18, 37), (3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    # MobileNet's late planes: a band is the whole plane, its pixels transposed 16 at a time across
    # row ends (7x7: 3 blocks and a 1-pixel tail; 14x14 stride 2: 7x7 out of 196 in)
    ((1, 40, 7, 7), (3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 24, 14, 14), (3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
]


@pytest.mark.parametrize("xs,k,attrs", DEPTHWISE)
@pytest.mark.parametrize("t,wt", [(U8, I8), (I8, I8), (U8, U8)])
@pytest.mark.parametrize("per_channel,bias", [(False, False), (True, True)])
def test_qlinear_conv_depthwise_exact(xs, k, attrs, t, wt, per_channel, bias, monkeypatch):
    """``_native.qdwconv`` against the numpy path bit for bit, and within one step of onnxruntime."""
    c = xs[1]
    x, w = ints(xs, t), ints((c, 1) + k, wt)
    # a uint8 weight's zero point near the middle, as a quantizer puts it (else every output saturates)
    zw = (RNG.integers(100, 156, (c,) if per_channel else ()).astype(U8) if wt == U8
          else np.zeros(c if per_channel else (), I8))
    feeds = {"x": x, "sx": np.array(0.02, F32), "zx": ints((), t), "w": w,
             "sw": RNG.uniform(0.002, 0.02, (c,)).astype(F32) if per_channel else np.array(0.01, F32), "zw": zw,
             "sy": np.array(0.02 * 0.01 * 40 * np.sqrt(np.prod(k)), F32), "zy": np.array(128 if t == U8 else 0, t)}
    if bias:
        feeds["B"] = RNG.integers(-5000, 5000, (c,)).astype(np.int32)
    node = helper.make_node("QLinearConv", list(feeds), ["y"], group=c, **attrs)
    inits = {"w": feeds.pop("w")}
    model = make_model([node], feeds, ["y"], opset=10, initializers=inits)
    native, ref = both(model, feeds, monkeypatch)
    assert native[0].dtype == t and native[0].shape == ref[0].shape
    np.testing.assert_array_equal(native[0], ref[0])
    assert 0 < np.count_nonzero((native[0] != np.iinfo(t).min) & (native[0] != np.iinfo(t).max))
    if wt == I8:  # onnxruntime's QLinearConv takes int8 weights only
        ort = run_oracle(model, feeds)
        assert np.max(np.abs(native[0].astype(np.int32) - ort[0].astype(np.int32))) <= 1


@pytest.mark.kernel
@pytest.mark.parametrize("shape,k,st,dl,pad", [((1, 35, 23, 40), 3, 1, 1, 1), ((2, 17, 30, 19), 5, 2, 1, 2),
                                               ((1, 48, 14, 14), 3, 2, 2, 0), ((1, 16, 3, 50), 7, 3, 1, 3)])
@pytest.mark.parametrize("xt,wt,yt", [(I8, I8, I8), (U8, U8, U8), (U8, I8, I8)])
@pytest.mark.parametrize("mult_hi", [4e-3, 0.5])
def test_qdwconv_channel_blocks_match_planes(shape, k, st, dl, pad, xt, wt, yt, mult_hi):
    """The depthwise loops (16-channel blocks, the default, their rows requantized in AVX-512
    registers where CONV_FAST; the same blocks on the portable rows; whole planes, kept for kernels
    past the blocks' exact float range) give the same bytes, saturating outputs included."""
    nat = quant._native
    n, c, h, w = shape
    x, wts = ints(shape, xt), ints((c, 1, k, k), wt)
    oh, ow = (h + 2 * pad - (k - 1) * dl - 1) // st + 1, (w + 2 * pad - (k - 1) * dl - 1) // st + 1
    wz = ints((c,), wt).astype(np.int32) if wt == U8 else None
    bias = RNG.integers(-4000, 4000, c).astype(np.int32)
    mult = RNG.uniform(2e-4, mult_hi, c).astype(F32)
    got = [np.empty((n, c, oh, ow), yt) for _ in range(3)]
    for method in (0, 1, 2):
        nat.qdwconv(x, xt == I8, 5, wts, wt == I8, wz, bias, mult, got[method], yt == I8, 3, shape, (k, k),
                    (oh, ow), (st, st), (dl, dl), (pad, pad), 2, method)
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_array_equal(got[0], got[2])
    inside = np.count_nonzero((got[1] != np.iinfo(yt).min) & (got[1] != np.iinfo(yt).max))
    if mult_hi > 0.1:  # the wide multipliers saturate
        assert inside < got[1].size
    else:
        assert 0 < inside


@pytest.mark.kernel
def test_qdwconv_rejects_bad_buffers():
    nat = quant._native
    args = [np.zeros(2 * 4 * 4, U8), False, 0, np.zeros(2 * 9, I8), True, None, None, np.ones(2, F32),
            np.zeros(2 * 4 * 4, U8), False, 0, (1, 2, 4, 4), (3, 3), (4, 4), (1, 1), (1, 1), (1, 1), 1]
    nat.qdwconv(*args)  # the well-formed call runs
    for i, bad in [(0, np.zeros(5, U8)), (7, np.ones(1, F32)), (8, np.zeros(3, U8)), (2, 300),
                   (14, (0, 1)), (17 - 1, (1, -1))]:
        with pytest.raises(ValueError):
            nat.qdwconv(*[bad if j == i else a for j, a in enumerate(args)])


@pytest.mark.parametrize("case", ["mixed", "zeros", "nan", "inf", "positive"])
def test_dynamic_quantize_exact(case, monkeypatch):
    x = RNG.uniform(-4, 7, (5, 77)).astype(F32)
    if case == "zeros":
        x[:] = 0
    elif case == "nan":
        x[1, 3] = np.nan
    elif case == "inf":
        x[2, 2] = np.inf
    elif case == "positive":
        x = np.abs(x) + 1
    model = make_model([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], {"x": x},
                       ["y", "s", "z"], opset=11)
    with np.errstate(all="ignore"):
        native, ref = both(model, {"x": x}, monkeypatch)
    for got, want in zip(native, ref):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


@pytest.mark.kernel
@pytest.mark.parametrize("P", [5, 8])
def test_qgemm_y_planes(path, P):
    """Y written as NCHW planes of P pixels: the row-major product rearranged, rows of A being
    pixels of n images (row blocks of 8 span images when P is 5)."""
    n, K, N = 3, 13, 35
    a = ints((n * P, K), U8)
    b = ints((K, N), I8)
    want = a.astype(np.int64) @ b.astype(np.int64) - 3 * b.astype(np.int64).sum(0)  # za = 3
    buf = np.empty(quant._native.qgemm_packed_size((K, N)), I8)
    quant._native.qgemm_pack(b, buf, (K, N), True)
    y = np.empty(n * P * N, np.int32)
    quant._native.qgemm(a, False, 3, buf, True, None, y, (n * P, K, N), 0, None, 0, 2, None, P)
    np.testing.assert_array_equal(y.reshape(n, N, P).transpose(0, 2, 1).reshape(n * P, N), want.astype(np.int32))
    with pytest.raises(ValueError):  # the planes must divide M
        quant._native.qgemm(a, False, 3, buf, True, None, y, (n * P, K, N), 0, None, 0, 2, None, 7)


@pytest.mark.kernel
@pytest.mark.parametrize("P", [5, 20, 64])
@pytest.mark.parametrize("mode,yt", [(1, U8), (2, I8)])
def test_qgemm_y_planes_requantized(path, P, mode, yt):
    """Requantized bytes in NCHW planes (whole 8 x 32 tiles inside a plane take a transposing
    store) equal the row-major result rearranged: tiles inside planes, across them, and a
    partial column tile."""
    n, K, N = 2, 40, 70
    a, b = ints((n * P, K), U8), ints((K, N), I8)
    buf = np.empty(quant._native.qgemm_packed_size((K, N)), I8)
    quant._native.qgemm_pack(b, buf, (K, N), True)
    mult = RNG.uniform(2e-4, 2e-3, N).astype(F32)
    bias = RNG.integers(-3000, 3000, N).astype(np.int32)
    rows = np.empty((n * P, N), yt)
    quant._native.qgemm(a, False, 7, buf, True, None, rows, (n * P, K, N), mode, mult, 3, 2, bias)
    planes = np.empty(n * P * N, yt)
    quant._native.qgemm(a, False, 7, buf, True, None, planes, (n * P, K, N), mode, mult, 3, 2, bias, P)
    np.testing.assert_array_equal(planes.reshape(n, N, P).transpose(0, 2, 1).reshape(n * P, N), rows)
    assert 0 < np.count_nonzero((rows != np.iinfo(yt).min) & (rows != np.iinfo(yt).max))


@pytest.mark.kernel
@pytest.mark.parametrize("shape", [(1, 16, 16), (2, 35, 50), (1, 7, 3), (3, 48, 17)])
def test_qtranspose(shape):
    """NCHW bytes to pixel rows (16 x 16 blocks and the edges) as numpy's transpose."""
    x = ints(shape, U8)
    y = np.empty((shape[0], shape[2], shape[1]), U8)
    quant._native.qtranspose(x, y, shape)
    np.testing.assert_array_equal(y, x.transpose(0, 2, 1))
    with pytest.raises(ValueError):
        quant._native.qtranspose(x, np.empty(3, U8), shape)


@pytest.mark.kernel
def test_qgemm_rejects_bad_buffers():
    nat = quant._native
    with pytest.raises(ValueError):
        nat.qgemm(np.zeros(5, U8), False, 0, np.zeros(3, I8), True, None, np.zeros(4, np.int32),
                  (2, 3, 2), 0, None, 0, 1)
    with pytest.raises(ValueError):
        nat.qgemm_pack(np.zeros(6, I8), np.zeros(4, I8), (3, 2), True)


def _qconv_reference(b, bz, w, wz, bias, mult, yz, yt):
    acc = np.einsum("mk,nkp->nmp", w.astype(np.int64) - (0 if wz is None else wz[:, None]), b.astype(np.int64) - bz)
    acc = (acc + (0 if bias is None else bias[None, :, None])).astype(np.int64)
    acc = ((acc + 2 ** 31) % 2 ** 32 - 2 ** 31).astype(np.int32)  # int32 sums wrap
    info = np.iinfo(yt)
    return np.clip(np.rint(acc.astype(F32) * mult[None, :, None]) + F32(yz), info.min, info.max).astype(yt)


@pytest.mark.kernel
@pytest.mark.parametrize("N,M,K,P", [(1, 1, 1, 1), (2, 13, 7, 45), (1, 24, 36, 300), (3, 9, 5, 17)])
@pytest.mark.parametrize("bt,wt,yt", [(U8, I8, U8), (I8, I8, I8), (U8, U8, I8), (I8, U8, U8)])
@pytest.mark.parametrize("wide", [1, 64])
def test_qconv_nchw_exact(path, N, M, K, P, bt, wt, yt, wide):
    """W times each image's K x P rows: odd sizes (partial panels, row blocks and K groups), every
    operand signedness, per-channel weight zero points (or one for all rows) and bias, against an
    exact reference; ``wide`` multipliers saturate many outputs at both ends."""
    b, w = ints((N, K, P), bt), ints((M, K), wt)
    bz = int(ints((), bt))
    wz = ints((M,), wt).astype(np.int32) if M % 2 else None
    bias = RNG.integers(-5000, 5000, M).astype(np.int32) if K % 2 else None
    mult = RNG.uniform(0.1, 2.0, M).astype(F32) * wide / (K * 64)
    yz = int(ints((), yt))
    y = np.empty((N, M, P), yt)
    quant._native.qconv_nchw(b, bt == I8, bz, w, wt == I8, wz, y, (N, M, K, P), mult, bias, yt == I8, yz, 2)
    np.testing.assert_array_equal(y, _qconv_reference(b, bz, w, wz, bias, mult, yz, yt))


@pytest.mark.kernel
@pytest.mark.parametrize("shape,kh,kw,st,dl,pt,pl,pe", [
    ((2, 3, 9, 8), 3, 2, (2, 1), (1, 2), 1, 2, (1, 0)),
    ((1, 3, 20, 71), 3, 3, (2, 2), (1, 1), 1, 1, (1, 1)),  # stride 2 rows past 32 bytes: the vector steps
    ((1, 2, 12, 66), 3, 3, (2, 2), (1, 1), 1, 1, (0, 0)),  # the last window ends at the row's last byte
    ((1, 2, 7, 40), 3, 5, (1, 3), (2, 1), 2, 4, (2, 6)),  # stride 3, windows past both edges
    ((1, 2, 6, 35), 1, 3, (1, 1), (1, 1), 0, 1, (0, 1)),  # stride 1: one copy a row
])
def test_qim2col_rows_matches_numpy(shape, kh, kw, st, dl, pt, pl, pe):
    """K x P im2col rows ((c, kh, kw) order, zero-point padding) as numpy's strided slices."""
    x = ints(shape, U8)
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pe[0]), (pl, pe[1])), constant_values=7)
    oh = (xp.shape[2] - (kh - 1) * dl[0] - 1) // st[0] + 1
    ow = (xp.shape[3] - (kw - 1) * dl[1] - 1) // st[1] + 1
    want = np.stack([xp[:, :, i * dl[0]:i * dl[0] + st[0] * (oh - 1) + 1:st[0],
                        k * dl[1]:k * dl[1] + st[1] * (ow - 1) + 1:st[1]] for i in range(kh) for k in range(kw)], 2)
    n, c = shape[:2]
    got = np.empty((n, c * kh * kw, oh * ow), U8)
    quant._native.qim2col_rows(x, got, x.shape, (kh, kw), (oh, ow), st, dl, (pt, pl), 7, 2)
    np.testing.assert_array_equal(got, want.reshape(n, c * kh * kw, oh * ow))


@pytest.mark.kernel
@pytest.mark.parametrize("xs,k,st,dl,pads", [
    ((2, 3, 9, 8), (3, 2), (2, 1), (1, 2), (1, 2)),
    ((1, 35, 40, 37), (3, 3), (1, 1), (1, 1), (1, 1)),  # two 16-channel blocks + 3, 1480 pixels (two copy parts)
    ((2, 16, 11, 13), (7, 7), (2, 2), (1, 1), (3, 3)),  # a stem: windows past both edges
    ((1, 18, 6, 7), (2, 3), (1, 2), (2, 1), (0, 2)),
])
@pytest.mark.parametrize("threads", [1, 2])
def test_qim2col_matches_numpy(xs, k, st, dl, pads, threads):
    """Pixel im2col rows ((kh, kw, c) order, zero-point padding), taken from the image's NHWC copy,
    as numpy's strided slices."""
    x = ints(xs, U8)
    (kh, kw), (pt, pl) = k, pads
    xp = np.pad(x, ((0, 0), (0, 0), (pt, 2), (pl, 1)), constant_values=9)
    oh = (x.shape[2] + pt + 1 - (kh - 1) * dl[0] - 1) // st[0] + 1
    ow = (x.shape[3] + pl + 1 - (kw - 1) * dl[1] - 1) // st[1] + 1
    taps = [xp[:, :, i * dl[0]:i * dl[0] + st[0] * (oh - 1) + 1:st[0],
               t * dl[1]:t * dl[1] + st[1] * (ow - 1) + 1:st[1]] for i in range(kh) for t in range(kw)]
    want = np.stack(taps, 1).transpose(0, 3, 4, 1, 2).reshape(xs[0] * oh * ow, kh * kw * xs[1])
    got = np.empty(want.shape, U8)
    quant._native.qim2col(x, got, x.shape, (kh, kw), (oh, ow), st, dl, (pt, pl), 9, threads)
    np.testing.assert_array_equal(got, want)


@pytest.mark.kernel
@pytest.mark.parametrize("xs,k,st,dl,pads,M", [
    ((1, 20, 9, 9), (3, 3), (1, 1), (1, 1), (1, 1), 33),  # 81 pixels: a partial last row block
    ((2, 3, 23, 21), (7, 7), (2, 2), (1, 1), (3, 3), 10),  # a stem: K = 147, windows past both edges
    ((1, 17, 9, 10), (3, 2), (2, 1), (2, 1), (1, 0), 40),
    ((3, 1, 5, 6), (1, 1), (2, 2), (1, 1), (0, 0), 5),
])
@pytest.mark.parametrize("at,yt", [(U8, U8), (I8, I8)])
def test_qgemm_conv_rows_as_im2col(path, xs, k, st, dl, pads, M, at, yt):
    """qgemm's conv mode (the im2col rows gathered block by block from the image's NHWC copy as A is
    packed) gives the stored-rows GEMM's bytes, on every inner loop and for both A types."""
    x = ints(xs, at)
    (kh, kw), (pt, pl) = k, pads
    oh = (xs[2] + 2 * pt - (kh - 1) * dl[0] - 1) // st[0] + 1
    ow = (xs[3] + 2 * pl - (kw - 1) * dl[1] - 1) // st[1] + 1
    K, rows = xs[1] * kh * kw, xs[0] * oh * ow
    za = int(ints((), at))
    cols = np.empty((rows, K), at)
    quant._native.qim2col(x, cols, xs, k, (oh, ow), st, dl, pads, za, 2)
    w = ints((K, M), I8)
    buf = np.empty(quant._native.qgemm_packed_size((K, M)), I8)
    quant._native.qgemm_pack(w, buf, (K, M), True)
    mult = RNG.uniform(0.1, 2.0, M).astype(F32) / (K * 64)
    bias = RNG.integers(-3000, 3000, M).astype(np.int32)
    want, got = np.empty((xs[0], M, oh * ow), yt), np.empty((xs[0], M, oh * ow), yt)
    mode = 1 if yt == U8 else 2
    quant._native.qgemm(cols, at == I8, za, buf, True, None, want, (rows, K, M), mode, mult, 3, 2, bias, oh * ow)
    conv = (xs[1], xs[2], xs[3], kh, kw, oh, ow, *st, *dl, pt, pl)
    quant._native.qgemm(x, at == I8, za, buf, True, None, got, (rows, K, M), mode, mult, 3, 2, bias, oh * ow, conv)
    np.testing.assert_array_equal(got, want)
    assert 0 < np.count_nonzero((want != np.iinfo(yt).min) & (want != np.iinfo(yt).max))
    acc = np.empty((rows, M), np.int32)
    quant._native.qgemm(x, at == I8, za, buf, True, None, acc, (rows, K, M), 0, None, 0, 1, None, 0, conv)
    np.testing.assert_array_equal(acc, (cols.astype(np.int64) - za) @ w.astype(np.int64))
    bad = [(xs[1] + 1, *conv[1:]), (*conv[:5], oh + 1, *conv[6:]), (*conv[:7], 0, *conv[8:]), conv[:12]]
    for c in bad:  # K not KH * KW * C, OH * OW not dividing M, a zero stride, a short tuple
        with pytest.raises((ValueError, TypeError)):
            quant._native.qgemm(x, at == I8, za, buf, True, None, acc, (rows, K, M), 0, None, 0, 1, None, 0, c)


@pytest.mark.kernel
def test_qconv_nchw_rejects_bad_buffers():
    nat = quant._native
    with pytest.raises(ValueError):
        nat.qconv_nchw(np.zeros(5, U8), False, 0, np.zeros(6, I8), True, None, np.zeros(4, U8), (1, 2, 3, 2),
                       np.ones(2, F32), None, False, 0, 1)
    with pytest.raises(ValueError):
        nat.qconv_nchw(np.zeros(6, U8), False, 0, np.zeros(6, I8), True, None, np.zeros(4, U8), (1, 2, 3, 0),
                       np.ones(2, F32), None, False, 0, 1)
    with pytest.raises(ValueError):
        nat.qim2col_rows(np.zeros(4, U8), np.zeros(3, U8), (1, 1, 2, 2), (1, 1), (2, 2), (1, 1), (1, 1), (0, 0), 0, 1)


@pytest.mark.parametrize("yt", [U8, I8])
def test_quantize_linear_exact(yt, monkeypatch):
    """Per-tensor QuantizeLinear of float32 on ``_native.qquantize``: the numpy path's codes for
    ties, saturation both ways, infinities and NaN (-> 0); a zero scale keeps the numpy rules."""
    x = RNG.normal(0, 3, (3, 50, 7)).astype(F32)
    x.flat[:8] = [0.5 * 0.04, 1.5 * 0.04, -2.5 * 0.04, 1e9, -1e9, np.inf, -np.inf, np.nan]
    for scale in (0.04, 0.0):
        feeds = {"x": x, "s": np.array(scale, F32), "z": np.array(7 if yt == I8 else 130, yt)}
        model = make_model([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])], feeds, ["y"], opset=13)
        native, ref = both(model, feeds, monkeypatch)
        assert native[0].dtype == yt
        np.testing.assert_array_equal(native[0], ref[0])


@pytest.mark.kernel
@pytest.mark.parametrize("yt", [U8, I8])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("affine", [None, (1.3, 3, -0.5, -5), (1.3, 3, -0.5, -4)],
                         ids=["tables", "affine", "not-affine"])
def test_qadd_lut_every_code_pair(yt, threads, affine):
    """``_native.qadd_lut`` on every (a, b) code pair and 9 more (a part's odd tail, past the AVX-512
    loop's 16-item steps, on the scalar loop): the float32 sum, round-half-even and clamp of the
    numpy formula, bit for bit, saturating both ways; with the tables' affine form given (the AVX-512
    loop computes them), and with one the tables are not (the table loop runs)."""
    codes = np.arange(256, dtype=U8)
    a = np.concatenate([np.repeat(codes, 256), codes[:9]])
    b = np.concatenate([np.tile(codes, 256), codes[-9:]])
    ta = ((codes.view(yt).astype(F32) - F32(3)) * F32(1.3)).astype(F32)
    tb = ((codes.view(yt).astype(F32) + F32(5)) * F32(-0.5)).astype(F32)  # x.5 sums: ties to even
    zc = 7.0 if yt == U8 else -2.0
    y = np.empty(a.size, yt)
    quant._native.qadd_lut(a, b, ta, tb, zc, y, yt == I8, a.size, threads, affine)
    info = np.iinfo(yt)
    want = np.clip(np.rint((ta[a] + tb[b]) + F32(zc)), info.min, info.max).astype(yt)
    np.testing.assert_array_equal(y, want)
    assert np.count_nonzero(y == info.min) and np.count_nonzero(y == info.max)


def _check_kept_call(model, feeds, chw, t, setups, monkeypatch):
    """Runs of x with batch sizes 1, 1, 2, 2 on one session: only the first run of the new batch
    size sets the QLinearConv calls up again (``setups`` geometry calls, none in the other runs),
    and every run equals the numpy path bit for bit, its outputs not all saturated."""
    _, sess = run_ours(model, feeds)
    calls = []
    real = quant._conv_geometry
    monkeypatch.setattr(quant, "_conv_geometry", lambda *a: calls.append(1) or real(*a))
    info = np.iinfo(t)
    for i, n in enumerate([1, 1, 2, 2]):
        x = ints((n, *chw), t)
        got = sess.run(None, {"x": x})[0]
        assert len(calls) == (setups if i == 2 else 0), (i, calls)
        with monkeypatch.context() as mp:
            mp.setattr(quant, "_native", None)
            want, _ = run_ours(model, {"x": x})
        calls.clear()
        np.testing.assert_array_equal(got, want[0])
        assert 0 < np.count_nonzero((got != info.min) & (got != info.max))


def test_qlinear_conv_kept_call(monkeypatch):
    """A QLinearConv whose inputs but x are constants keeps its compiled call: the second run with x
    of the same shape skips the checks and set-up (no geometry worked out again), a new batch size
    sets up again, and every run matches the numpy path bit for bit (depthwise, then a pointwise
    convolution on 196-pixel planes)."""
    c, m = 24, 40
    feeds = {"x": ints((1, c, 14, 14), U8)}
    inits = {"sx": np.array(0.02, F32), "zx": np.array(128, U8), "w1": ints((c, 1, 3, 3), I8),
             "s1": RNG.uniform(0.002, 0.02, c).astype(F32), "z1": np.zeros(c, I8), "sh": np.array(0.05, F32),
             "zh": np.array(120, U8), "B1": RNG.integers(-3000, 3000, c).astype(np.int32),
             "w2": ints((m, c, 1, 1), I8), "s2": RNG.uniform(0.002, 0.02, m).astype(F32), "z2": np.zeros(m, I8),
             "sy": np.array(0.12, F32), "zy": np.array(128, U8)}
    nodes = [helper.make_node("QLinearConv", ["x", "sx", "zx", "w1", "s1", "z1", "sh", "zh", "B1"], ["h"], group=c,
                              pads=[1, 1, 1, 1]),
             helper.make_node("QLinearConv", ["h", "sh", "zh", "w2", "s2", "z2", "sy", "zy"], ["y"])]
    model = make_model(nodes, feeds, ["y"], opset=10, initializers=inits)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    _check_kept_call(model, feeds, (c, 14, 14), U8, 2, monkeypatch)


@pytest.mark.parametrize("t", [U8, I8])
def test_qlinear_conv_implicit_gemm_kept_call(t, monkeypatch):
    """A 3x3 QLinearConv on the implicit GEMM (K = 180 > 64) with constant inputs but x keeps its
    call: later runs with x of the same shape skip the set-up, a new batch size sets up again, and
    every run matches the numpy path bit for bit."""
    c, m = 20, 12
    zx = np.array(128 if t == U8 else -3, t)
    inits = {"sx": np.array(0.02, F32), "zx": zx, "w": ints((m, c, 3, 3), I8),
             "sw": RNG.uniform(0.002, 0.02, m).astype(F32), "zw": np.zeros(m, I8), "sy": np.array(0.4, F32),
             "zy": np.array(128 if t == U8 else 5, t), "B": RNG.integers(-3000, 3000, m).astype(np.int32)}
    node = helper.make_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "B"], ["y"],
                            pads=[1, 1, 1, 1], strides=[2, 1])
    feeds = {"x": ints((1, c, 9, 11), t)}
    model = make_model([node], feeds, ["y"], opset=10, initializers=inits)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    _check_kept_call(model, feeds, (c, 9, 11), t, 1, monkeypatch)
