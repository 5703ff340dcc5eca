"""The compiled kernels (``runtime_provider_cpu._native``) at the limits of their size
arithmetic: extreme strides, dilations, pads and sizes end in a correct result or a typed
error, never a signal. Every case runs in a child process, so that a crash fails its test
instead of ending pytest. The first four are the crashes of issue 28 (models whose padded
extent wrapped the kernels' scratch sizes); the rest call the entry points directly."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

_native = pytest.importorskip("runtime_provider_cpu._native")


def _child(code: str, *args: str, timeout: int = 300) -> str:
    """stdout of ``python -c code args``; a signal or an untyped failure fails the test"""
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, check=False,
                       text=True, timeout=timeout)
    assert r.returncode >= 0, f"the child died of signal {-r.returncode}:\n{r.stderr[-3000:]}"
    assert r.returncode == 0, f"the child failed:\n{r.stderr[-3000:]}"
    return r.stdout


# ---- the models of the crash reproducers --------------------------------------------------

_RUN = """
import sys, numpy as np, runtime_core as rt
from runtime_core import errors
model, feed, out = sys.argv[1:4]
try:
    s = rt.InferenceSession(open(model, "rb").read(), providers=["CPUExecutionProvider"])
    y = s.run(None, {"x": np.load(feed)})[0]
except errors.RuntimeCoreError as e:
    print("TYPED", type(e).__name__, e)
else:
    np.save(out, y)
    print("RESULT")
"""


def _model(node, x_shape, inits=()):
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TP.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["a", "b", "c", "d"])],
                          [numpy_helper.from_array(a, n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _maxpool_ref(x, ks, strides, dil, pads):
    """MaxPool's values by window arithmetic: the maximum of the taps inside x (-inf if none)"""
    N, C, H, W = x.shape
    OH = (H + pads[0] + pads[2] - (ks[0] - 1) * dil[0] - 1) // strides[0] + 1
    OW = (W + pads[1] + pads[3] - (ks[1] - 1) * dil[1] - 1) // strides[1] + 1
    y = np.full((N, C, OH, OW), -np.inf, np.float32)
    for oh in range(OH):
        rows = [oh * strides[0] - pads[0] + k * dil[0] for k in range(min(ks[0], H + 1))]
        rows = [r for r in rows if 0 <= r < H]
        for ow in range(OW):
            base = ow * strides[1] - pads[1]
            cols = [base + k * dil[1] for k in range(ks[1]) if 0 <= base + k * dil[1] < W] if ks[1] < 64 else \
                [c for c in range(W) if (c - base) % dil[1] == 0 and 0 <= (c - base) // dil[1] < ks[1]]
            if rows and cols:
                y[:, :, oh, ow] = x[:, :, rows][:, :, :, cols].max(axis=(2, 3))
    return y


def _case(name):
    """(model, x, onnxruntime computes it, numpy reference or None) of a reproducer"""
    if name == "maxpool2d_huge_stride":
        node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[1, 1], strides=[1, 2 ** 62])
        x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
        return _model(node, x.shape), x, True, _maxpool_ref(x, (1, 1), (1, 2 ** 62), (1, 1), (0, 0, 0, 0))
    if name == "maxpool2d_huge_dilation":
        D = 2 ** 62 - 6
        pads = [0, 0, 0, D + 1 - 4]
        node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[1, 1], dilations=[1, D],
                                pads=pads)
        x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
        # onnxruntime refuses the model (a pad not smaller than the kernel)
        return _model(node, x.shape), x, False, _maxpool_ref(x, (2, 2), (1, 1), (1, D), pads)
    rs = np.random.default_rng(0)
    if name == "conv2d_direct_huge_dilation":
        D = 2 ** 58
        w = rs.standard_normal((1, 4, 2, 2)).astype(np.float32)
        node = helper.make_node("Conv", ["x", "w"], ["y"], dilations=[D, 1], pads=[0, 0, D - 3, 0])
        x = rs.standard_normal((1, 4, 4, 4)).astype(np.float32)
        return _model(node, x.shape, [("w", w)]), x, True, None
    assert name == "depthwise2d_huge_dilation"
    D, P = 2 ** 31 - 1, 2 ** 30
    w = np.ones((2, 1, 2, 2), np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=2, dilations=[D, D], pads=[P, P, P - 4, P - 4])
    x = np.ones((1, 2, 4, 4), np.float32)
    return _model(node, x.shape, [("w", w)]), x, True, None


@pytest.mark.parametrize("name", ["maxpool2d_huge_stride", "maxpool2d_huge_dilation",
                                  "conv2d_direct_huge_dilation", "depthwise2d_huge_dilation"])
def test_reproducer_ends_in_a_result_or_a_typed_error(name, tmp_path):
    model, x, ort_computes, ref = _case(name)
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    np.save(tmp_path / "x.npy", x)
    out = _child(_RUN, str(tmp_path / "m.onnx"), str(tmp_path / "x.npy"), str(tmp_path / "y.npy"))
    if ort_computes:
        import onnxruntime as ort

        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"x": x})[0]
        assert out.startswith("RESULT"), f"onnxruntime computes it, we did not: {out}"
        np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-5, atol=1e-5)
    elif out.startswith("RESULT"):
        np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), ref)
    else:
        assert out.startswith("TYPED"), out


# ---- the entry points called directly ------------------------------------------------------

_PRELUDE = """
import sys, numpy as np
from runtime_provider_cpu import _native as nv
RNG = np.random.default_rng(int(sys.argv[1]))
BIG = [1, 2, 3, 5, 2 ** 20 + 1, 2 ** 31 - 1, 2 ** 40, 2 ** 58, 2 ** 62, 2 ** 63 - 1]


def pick(small=(1, 2, 3)):
    return int(RNG.choice(BIG)) if RNG.random() < 0.5 else int(RNG.choice(small))


def taps(o, s, k, d, p, n):
    # the window's taps (index into the input or None for padding) of output o
    if k > 64:
        base = o * s - p
        return [c for c in range(n) if (c - base) % d == 0 and 0 <= (c - base) // d < k]
    return [o * s - p + t * d if 0 <= o * s - p + t * d < n else None for t in range(k)]


def call(fn, *args):
    # None, or the name of a typed error (ValueError, MemoryError); anything else fails
    try:
        fn(*args)
    except (ValueError, MemoryError) as e:
        return type(e).__name__
    return None
"""


def test_pool_and_depthwise_windows_of_extreme_geometry():
    """maxpool2d and depthwise2d with strides, dilations, pads and kernels from 1 to 2^63 - 1
    (any output size the caller passes): the window arithmetic's answer, or a typed error"""
    code = _PRELUDE + textwrap.dedent("""
    done = typed = 0
    for case in range(250):
        N, C, H, W = 1, int(RNG.integers(1, 3)), int(RNG.integers(1, 6)), int(RNG.integers(1, 6))
        KH, KW = (pick(), pick()) if RNG.random() < 0.5 else (pick((1, 2, 3)), pick((1, 2, 3)))
        sh, sw, dh, dw, pt, pl = pick(), pick(), pick(), pick(), pick((0, 1, 2)), pick((0, 1, 2))
        OH, OW = int(RNG.integers(1, 4)), int(RNG.integers(1, 4))
        x = RNG.standard_normal((N, C, H, W)).astype(np.float32)
        rows = [taps(o, sh, KH, dh, pt, H) for o in range(OH)]
        cols = [taps(o, sw, KW, dw, pl, W) for o in range(OW)]
        for fast in (0, 1):
            y = np.empty((N, C, OH, OW), np.float32)
            err = call(nv.maxpool2d, x, y, (N, C, H, W), (OH, OW), (KH, KW), (sh, sw), (dh, dw), (pt, pl),
                       int(RNG.integers(1, 3)), fast)
            if err:
                typed += 1
                continue
            for oh in range(OH):
                for ow in range(OW):
                    r = [i for i in rows[oh] if i is not None]
                    c = [i for i in cols[ow] if i is not None]
                    want = x[:, :, r][:, :, :, c].max(axis=(2, 3)) if r and c else np.full((N, C), -np.inf)
                    assert np.array_equal(y[:, :, oh, ow], want), ("maxpool2d", case, oh, ow)
            done += 1
        if KH * KW > 64:
            continue  # depthwise weights hold every tap
        w = RNG.standard_normal((C, 1, KH, KW)).astype(np.float32)
        b = RNG.standard_normal(C).astype(np.float32)
        for fast in (0, 1):
            y = np.empty((N, C, OH, OW), np.float32)
            err = call(nv.depthwise2d, x, w, b, y, (N, C, H, W), (OH, OW), (KH, KW), (sh, sw), (dh, dw),
                       (pt, pl), -np.inf, np.inf, int(RNG.integers(1, 3)), fast)
            if err:
                typed += 1
                continue
            want = np.empty_like(y)
            for oh in range(OH):
                for ow in range(OW):
                    acc = b.astype(np.float64).copy()
                    for kh, r in enumerate(rows[oh]):
                        for kw, c in enumerate(cols[ow]):
                            if r is not None and c is not None:
                                acc += w[:, 0, kh, kw].astype(np.float64) * x[0, :, r, c]
                    want[0, :, oh, ow] = acc
            np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5, err_msg=f"depthwise2d {case}")
            done += 1
    print(done, typed)
    """)
    done, _typed = map(int, _child(code, "20261206").split())
    assert done > 300  # most cases compute (the window arithmetic needs no scratch)


def test_conv2d_of_extreme_geometry():
    """conv2d (direct and lane tiles, with the extra 1x1) whose padded extent is far larger
    than its data: the sums of the taps inside the input, or a typed error"""
    code = _PRELUDE + textwrap.dedent("""
    done = 0
    for case in range(120):
        N, C, H, W, M = 1, int(RNG.integers(1, 4)), int(RNG.integers(1, 6)), int(RNG.integers(1, 6)), int(RNG.integers(1, 10))
        KH, KW = int(RNG.integers(1, 4)), int(RNG.integers(1, 4))
        sh, sw, dh, dw, pt, pl = pick(), pick(), pick(), pick(), pick((0, 1, 2)), pick((0, 1, 2))
        OH, OW = int(RNG.integers(1, 4)), int(RNG.integers(1, 4))
        lanes = int(RNG.integers(0, 2))
        mr = nv.CONV_LANES if lanes else nv.CONV_MR
        x = RNG.standard_normal((N, C, H, W)).astype(np.float32)
        w = RNG.standard_normal((M, C, KH, KW)).astype(np.float32)
        b = RNG.standard_normal(M).astype(np.float32)
        Mb, T = -(-M // mr), KH * KW
        buf = np.zeros(Mb * C * T * mr + 16, np.float32)
        off = (-buf.ctypes.data % 64) // 4
        wp = buf[off:off + Mb * C * T * mr]
        wp.reshape(Mb, C * T, mr)[:] = np.pad(w.reshape(M, C * T), ((0, Mb * mr - M), (0, 0))).reshape(Mb, mr, C * T).transpose(0, 2, 1)
        y = np.empty((N, M, OH, OW), np.float32)
        err = call(nv.conv2d, x, wp, b, None, y, (N, C, H, W), (M, KH, KW), (sh, sw), (dh, dw), (pt, pl), (OH, OW),
                   -np.inf, np.inf, int(RNG.integers(1, 3)), lanes)
        if err:
            continue
        rows = [taps(o, sh, KH, dh, pt, H) for o in range(OH)]
        cols = [taps(o, sw, KW, dw, pl, W) for o in range(OW)]
        want = np.empty_like(y)
        for oh in range(OH):
            for ow in range(OW):
                acc = b.astype(np.float64).copy()
                for kh, r in enumerate(rows[oh]):
                    for kw, c in enumerate(cols[ow]):
                        if r is not None and c is not None:
                            acc += w[:, :, kh, kw].astype(np.float64) @ x[0, :, r, c].astype(np.float64)
                want[0, :, oh, ow] = acc
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4, err_msg=f"conv2d {case}")
        done += 1
    print(done)
    """)
    assert int(_child(code, "7")) > 80


def test_sizes_that_overflow_are_typed_errors():
    """sizes whose products (buffers, planes, work memory) overflow: a ValueError or
    MemoryError naming the op, before anything is allocated or read"""
    code = _PRELUDE + textwrap.dedent("""
    z = np.zeros(16, np.float32)
    a64 = np.zeros(64, np.float32)
    big = 2 ** 62
    calls = [
        ("softmax", nv.softmax, z, (big, 4)),
        ("gelu_erf", nv.gelu_erf, z, None, z, (big, 4)),
        ("bias_clip", nv.bias_clip, z, None, (big, 4), 0.0, 1.0),
        ("skip_layer_norm", nv.skip_layer_norm, z, None, z[:4], None, None, z, None, None, None, (big, 4, 1), 1e-5),
        ("gemm_rows", nv.gemm_rows, z, z, z, (big, 4, 4), True, 1),
        ("linear", nv.linear, z, a64, None, z, (2 ** 40, 2 ** 40, 4), 1, False),
        ("pointwise_lanes", nv.pointwise_lanes, z, z, None, None, z, (2 ** 40, 2, 2 ** 40), 0.0, 1.0, 1),
        ("recurrence", nv.recurrence, True, False, False, z, None, z, None, None, z, z, z, (big, 1, 2, 4, 16), False, 1),
        ("maxpool2d", nv.maxpool2d, z, z, (big, 4, 1, 1), (1, 1), (1, 1), (1, 1), (1, 1), (0, 0), 1),
        ("maxpool2d", nv.maxpool2d, z, z, (1, 1, 4, 4), (2 ** 40, 2 ** 40), (1, 1), (1, 1), (1, 1), (0, 0), 1),
        ("depthwise2d", nv.depthwise2d, z, z, None, z, (1, big, 4, 4), (1, 1), (1, 1), (1, 1), (1, 1), (0, 0),
         0.0, 1.0),
        ("conv2d", nv.conv2d, z, z, None, None, z, (1, 1, 4, 4), (1, 2 ** 32, 2 ** 32), (1, 1), (1, 1), (0, 0),
         (1, 1), 0.0, 1.0, 1),
        ("conv2d", nv.conv2d, z, z, None, None, z, (big, 1, 4, 4), (1, 1, 1), (1, 1), (1, 1), (0, 0), (4, 4),
         0.0, 1.0, 1),
        ("winograd3x3", nv.winograd3x3, z, z, None, None, z, (1, 1, 4, 4), 1, (0, 0), (2 ** 40, 2 ** 40), 0.0, 1.0, 1),
        ("winograd3x3", nv.winograd3x3, z, z, None, None, z, (1, 1, 4, 4), 1, (big, big), (2, 2), 0.0, 1.0, 1),
        ("tree_leaves", nv.tree_leaves, z, z, np.zeros(1, np.int64), np.zeros(1, np.int64), (big, 8, 1, 1), 4, 1,
         0, 0),
        ("pointwise", nv.pointwise, z, z, None, None, z, (2 ** 31 - 1, 2 ** 31 - 1, 2 ** 31 - 1), 0.0, 1.0, 1),
        ("mha", nv.mha, z, (big, big, 4, 0, 0, 0), (1, 1, 1), 1.0, False, None, None, None, None, z, 1),
    ]
    if nv.CONV_FAST:
        calls += [
            ("conv_maxpool", nv.conv_maxpool, z, z, None, z, (1, 4, 4), (1, 2 ** 31, 2 ** 31), (1, 1), (0, 0),
             (1, 1), 0.0, 1.0, (1, 1), 1),
            ("expand_dw", nv.expand_dw, z, z, None, 0.0, 1.0, z, None, z, (big, 1, 4, 4), (2, 2, 1, 1, 1),
             0.0, 1.0, 1),
            ("expand_dw", nv.expand_dw, z, z, None, 0.0, 1.0, z, None, z, (1, 1, 4, 4), (big, big, 1, 1, 1),
             0.0, 1.0, 1),
        ]
    from scipy.linalg import cython_blas
    nv.set_sgemm(cython_blas.__pyx_capi__["sgemm"])
    for name, fn, *args in calls:
        try:
            fn(*args)
        except (ValueError, MemoryError) as e:
            assert str(e).startswith(name + ":"), (name, str(e))
            print(name, type(e).__name__)
        else:
            raise AssertionError(f"{name} took sizes that overflow")
    """)
    out = _child(code, "0")
    assert len(out.splitlines()) >= 18


def test_pads_past_the_windows_read_padding_only():
    """pads near 2^63 (every tap in the padding) on every padded kernel: the bias or -inf,
    as the window arithmetic says, or a typed error"""
    code = _PRELUDE + textwrap.dedent("""
    P = 2 ** 63 - 1
    x = RNG.standard_normal((1, 2, 5, 5)).astype(np.float32)
    for fast in (0, 1):
        y = np.empty((1, 2, 2, 2), np.float32)
        assert call(nv.maxpool2d, x, y, (1, 2, 5, 5), (2, 2), (3, 3), (1, 1), (1, 1), (P, P), 2, fast) is None
        assert np.all(y == -np.inf), y
        for k, s in ((3, 1), (3, 2), (2, 1)):
            w, b = np.ones((2, 1, k, k), np.float32), np.array([1.5, -2.0], np.float32)
            assert call(nv.depthwise2d, x, w, b, y, (1, 2, 5, 5), (2, 2), (k, k), (s, s), (1, 1), (P, P),
                        -np.inf, np.inf, 2, fast) is None
            assert np.array_equal(y, np.broadcast_to(b[None, :, None, None], y.shape)), y
    w = np.ones(8 * 2 * 9, np.float32)
    b = np.array([0.25], np.float32)
    y = np.empty((1, 1, 2, 2), np.float32)
    assert call(nv.conv2d, x, w, b, None, y, (1, 2, 5, 5), (1, 3, 3), (1, 1), (1, 1), (P, P), (2, 2),
                -np.inf, np.inf, 2) is None
    assert np.all(y == 0.25), y
    u = np.ones(16 * 8 * 2, np.float32)
    assert call(nv.winograd3x3, x, u, b, None, y, (1, 2, 5, 5), 1, (P, P), (2, 2), -np.inf, np.inf, 2) is None
    assert np.all(y == 0.25), y
    print("ok")
    """)
    assert _child(code, "1").strip() == "ok"
