"""CPU kernels beyond the backend suite: Det, CumProd, the preview.training optimizers,
the opset-28 versions of layout ops and the opset-1 versions of shape ops.

The oracle is onnxruntime, else onnx.reference (oracle.run_oracle); the opset-1 shape
ops, which neither runs, are checked against numpy expressions of their old schema.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import helper

from oracle import assert_close, check_node, make_model, run_oracle, run_ours

RNG = np.random.default_rng(2026)
TRAINING = "ai.onnx.preview.training"
I64 = lambda *v: np.array(v, np.int64)  # noqa: E731


def rnd(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# -- Det -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (2, 1, 2, 2), (1, 1)])
@pytest.mark.parametrize("opset", [11, 22])
def test_det(dtype, shape, opset):
    check_node("Det", {"x": rnd(*shape, dtype=dtype)}, opset=opset, rtol=1e-4, atol=1e-5)


def test_det_singular_and_float16():
    x = np.array([[1, 2], [2, 4]], np.float32)
    (y,), _ = run_ours(make_model([helper.make_node("Det", ["x"], ["y"])], {"x": x}, ["y"], opset=22),
                       {"x": x})
    assert y.shape == () and y.dtype == np.float32 and abs(float(y)) < 1e-6
    h = rnd(3, 3, 3, dtype=np.float16)
    (yh,), _ = run_ours(make_model([helper.make_node("Det", ["x"], ["y"])], {"x": h}, ["y"], opset=22),
                        {"x": h})
    assert yh.dtype == np.float16
    np.testing.assert_allclose(yh.astype(np.float64), np.linalg.det(h.astype(np.float64)), rtol=2e-2, atol=2e-2)


# -- CumProd ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint32, np.uint64])
@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("axis", [0, 2, -1])
def test_cumprod(dtype, exclusive, reverse, axis):
    if np.dtype(dtype).kind in "iu":
        x = RNG.integers(1, 4, (3, 2, 4)).astype(dtype)
    else:
        x = (RNG.random((3, 2, 4)) + 0.5).astype(dtype)
    ours = check_node("CumProd", {"x": x}, initializers={"a": np.array(axis, np.int64)}, opset=26,
                      exclusive=exclusive, reverse=reverse)
    # independent of the oracle: exclusive/reverse by their definition
    ax = axis % 3
    y = np.flip(x, ax) if reverse else x
    c = np.cumprod(y, axis=ax, dtype=x.dtype)
    if exclusive:
        c = np.concatenate([np.ones_like(np.take(c, [0], axis=ax)), np.take(c, range(c.shape[ax] - 1), axis=ax)],
                           axis=ax)
    np.testing.assert_allclose(ours[0], np.flip(c, ax) if reverse else c, rtol=1e-6)


def test_cumprod_int32_axis_and_bfloat16():
    x = np.array([1, 2, 3, 4], ml_dtypes.bfloat16)
    m = make_model([helper.make_node("CumProd", ["x", "a"], ["y"], exclusive=1)], {"x": x}, ["y"], opset=26,
                   initializers={"a": np.array(0, np.int32)})
    (y,), _ = run_ours(m, {"x": x})
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(y.astype(np.float32), [1, 1, 2, 6])


# -- optimizers (ai.onnx.preview.training) -----------------------------------------------

def _training(op, n_in, n_out, inputs, dtype, **attrs):
    names = [f"i{k}" for k in range(n_in)]
    outs = [f"o{k}" for k in range(n_out)]
    node = helper.make_node(op, names, outs, domain=TRAINING, **attrs)
    feeds = dict(zip(names, inputs))
    m = make_model([node], feeds, outs, opset=17, extra_opsets={TRAINING: 1})
    ours, _ = run_ours(m, feeds)
    ref = run_oracle(m, feeds)
    for o, r, x in zip(ours, ref, inputs[2:]):
        assert o.dtype == np.dtype(dtype) and o.shape == x.shape
    assert_close(ours, [np.asarray(r).astype(dtype) for r in ref], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("t", [0, 3])
def test_adagrad(dtype, n, t):
    xs = [rnd(3, 2, dtype=dtype) for _ in range(n)]
    gs = [rnd(3, 2, dtype=dtype) for _ in range(n)]
    hs = [np.abs(rnd(3, 2, dtype=dtype)) for _ in range(n)]
    _training("Adagrad", 2 + 3 * n, 2 * n, [np.array(0.1, dtype), np.array(t, np.int64), *xs, *gs, *hs], dtype,
              decay_factor=0.1, epsilon=1e-5, norm_coefficient=0.01)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("t", [0, 4])
@pytest.mark.parametrize("mode", ["standard", "nesterov"])
def test_momentum(dtype, n, t, mode):
    xs = [rnd(4, dtype=dtype) for _ in range(n)]
    gs = [rnd(4, dtype=dtype) for _ in range(n)]
    vs = [rnd(4, dtype=dtype) for _ in range(n)]
    _training("Momentum", 2 + 3 * n, 2 * n, [np.array(0.05, dtype), np.array(t, np.int64), *xs, *gs, *vs],
              dtype, alpha=0.9, beta=0.7, mode=mode, norm_coefficient=0.02)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("t", [0, 5])
def test_adam(dtype, n, t):
    xs = [rnd(2, 3, dtype=dtype) for _ in range(n)]
    gs = [rnd(2, 3, dtype=dtype) for _ in range(n)]
    vs = [rnd(2, 3, dtype=dtype) for _ in range(n)]
    hs = [np.abs(rnd(2, 3, dtype=dtype)) for _ in range(n)]
    _training("Adam", 2 + 4 * n, 3 * n, [np.array(0.1, dtype), np.array(t, np.int64), *xs, *gs, *vs, *hs],
              dtype, alpha=0.85, beta=0.95, epsilon=1e-4, norm_coefficient=0.01, norm_coefficient_post=0.02)


# -- opset-28 versions of layout ops ---------------------------------------------------------

@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_space_depth_28_roundtrip(mode, dtype):
    x = (RNG.random((2, 3, 4, 6)) * 10).astype(dtype)
    nodes = [helper.make_node("SpaceToDepth", ["x"], ["s"], blocksize=2, mode=mode),
             helper.make_node("DepthToSpace", ["s"], ["y"], blocksize=2, mode=mode)]
    m = make_model(nodes, {"x": x}, ["s", "y"], opset=28)
    (s, y), _ = run_ours(m, {"x": x})
    np.testing.assert_array_equal(y, x)  # DepthToSpace inverts SpaceToDepth in the same mode
    t = x.reshape(2, 3, 2, 2, 3, 2)
    t = t.transpose(0, 3, 5, 1, 2, 4) if mode == "DCR" else t.transpose(0, 1, 3, 5, 2, 4)
    np.testing.assert_array_equal(s, t.reshape(2, 12, 2, 3))


def test_space_to_depth_28_matches_13_in_dcr():
    x = rnd(1, 2, 4, 6)
    a = check_node("SpaceToDepth", {"x": x}, blocksize=2, opset=13)
    m = make_model([helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2)], {"x": x}, ["y"], opset=28)
    (b,), _ = run_ours(m, {"x": x})
    np.testing.assert_array_equal(a[0], b)


def test_layout_ops_28_bfloat16():
    bf = ml_dtypes.bfloat16
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4).astype(bf)
    cases = [
        (helper.make_node("Compress", ["x", "c"], ["y"], axis=1), {"c": np.array([1, 0, 1], bool)},
         np.compress([1, 0, 1], x, axis=1)),
        (helper.make_node("ReverseSequence", ["x", "l"], ["y"], batch_axis=0, time_axis=1), {"l": I64(2, 3)},
         np.stack([x[0, [1, 0, 2]], x[1, ::-1]])),
        (helper.make_node("Einsum", ["x", "x2"], ["y"], equation="bij,bkj->bik"), {"x2": x},
         np.einsum("bij,bkj->bik", x.astype(np.float32), x.astype(np.float32)).astype(bf)),
    ]
    for node, inits, want in cases:
        m = make_model([node], {"x": x}, ["y"], opset=28, initializers=inits)
        (y,), _ = run_ours(m, {"x": x})
        assert y.dtype == bf
        np.testing.assert_array_equal(y.astype(np.float32), want.astype(np.float32))


def test_onehot_28_and_unique_28():
    idx = np.array([[0, 3], [-1, 7]], np.int64)
    vals = np.array([0, 1], ml_dtypes.bfloat16)
    m = make_model([helper.make_node("OneHot", ["i", "d", "v"], ["y"], axis=0)], {"i": idx}, ["y"], opset=28,
                   initializers={"d": np.array(4, np.int64), "v": vals})
    (y,), _ = run_ours(m, {"i": idx})
    want = np.zeros((4, 2, 2), np.float32)
    want[0, 0, 0] = want[3, 0, 1] = want[3, 1, 0] = 1  # 7 is out of range: all off
    np.testing.assert_array_equal(y.astype(np.float32), want)
    x = np.array([[1, 0, 0], [1, 0, 0], [2, 3, 4]], np.int64)
    # Unique-28 only adds bfloat16: the same results as Unique-11 (which onnxruntime checks;
    # onnxruntime has no Unique-28 and onnx.reference mishandles unsorted flattened input)
    outs = ("y", "i", "inv", "c")
    for attrs in ({"sorted": 1, "axis": 0}, {"sorted": 0}):
        want = check_node("Unique", {"x": x}, outs, opset=11, **attrs)
        m = make_model([helper.make_node("Unique", ["x"], list(outs), **attrs)], {"x": x}, list(outs), opset=28)
        got, _ = run_ours(m, {"x": x})
        assert_close(got, want)


@pytest.mark.parametrize("eq", ["ij,jk", "ii->i", "...ij,...jk->...ik", "Ab,bA->", "i,i"])
def test_einsum_28(eq):
    shapes = {"ij,jk": [(2, 3), (3, 4)], "ii->i": [(3, 3)], "...ij,...jk->...ik": [(2, 2, 3), (2, 3, 2)],
              "Ab,bA->": [(2, 3), (3, 2)], "i,i": [(5,), (5,)]}[eq]
    feeds = {f"x{k}": rnd(*s) for k, s in enumerate(shapes)}
    check_node("Einsum", feeds, equation=eq, opset=28, rtol=1e-5, atol=1e-5)


# -- opset-1 versions of shape ops (no oracle runs them: numpy by the old schema) -----------

def _run_v1(node, feeds, out_shapes):
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(k, 1, list(v.shape)) for k, v in feeds.items()],
                          [helper.make_tensor_value_info(n, 1, list(s)) for n, s in out_shapes.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 1)])
    m.ir_version = 3
    return run_ours(m, feeds)[0]


def test_shape_ops_v1():
    x = rnd(2, 3, 4)
    (y,) = _run_v1(helper.make_node("Reshape", ["x"], ["y"], shape=[0, -1]), {"x": x}, {"y": (2, 12)})
    np.testing.assert_array_equal(y, x.reshape(2, 12))
    b = rnd(2, 1, 4)
    (y,) = _run_v1(helper.make_node("Concat", ["x", "b"], ["y"]), {"x": x, "b": b}, {"y": (2, 4, 4)})
    np.testing.assert_array_equal(y, np.concatenate([x, b], axis=1))  # default axis 1
    y, z = _run_v1(helper.make_node("Split", ["x"], ["y", "z"], axis=2, split=[1, 3]), {"x": x},
                   {"y": (2, 3, 1), "z": (2, 3, 3)})
    np.testing.assert_array_equal(y, x[:, :, :1])
    np.testing.assert_array_equal(z, x[:, :, 1:])
    (y,) = _run_v1(helper.make_node("Pad", ["x"], ["y"], paddings=[0, 1, 0, 0, 0, 2], value=1.5),
                   {"x": x}, {"y": (2, 4, 6)})
    np.testing.assert_array_equal(y, np.pad(x, [(0, 0), (1, 0), (0, 2)], constant_values=1.5))


def test_tile_v1():
    x = rnd(2, 3)
    node = helper.make_node("Tile", ["x", "t", "a"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, [2, 3]),
                                        helper.make_tensor_value_info("t", 1, []),
                                        helper.make_tensor_value_info("a", 1, [])],
                          [helper.make_tensor_value_info("y", 1, [2, 9])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 1)])
    m.ir_version = 3
    # Tile-1's tiles and axis share the input's type T (float types), as its schema says
    (y,), _ = run_ours(m, {"x": x, "t": np.array(3, np.float32), "a": np.array(1, np.float32)})
    np.testing.assert_array_equal(y, np.tile(x, (1, 3)))


# -- Gradient (ai.onnx.preview.training) ------------------------------------------------------

def _grad_model(nodes, feeds, xs, y, outs, zs=None):
    g = helper.make_node("Gradient", list(xs) + list(zs or []), outs, domain=TRAINING, xs=list(xs), y=y,
                         **({"zs": list(zs)} if zs else {}))
    return make_model(list(nodes) + [g], feeds, [y] + outs, opset=17, extra_opsets={TRAINING: 1})


def test_gradient_matmul_broadcast_chain():
    # loss = Sum(Tanh(X @ W + b) * X2) with b broadcast over rows: analytic gradients
    x, w, b = rnd(4, 3, dtype=np.float64), rnd(3, 2, dtype=np.float64), rnd(2, dtype=np.float64)
    c = rnd(4, 2, dtype=np.float64)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Tanh", ["a"], ["t"]), helper.make_node("Mul", ["t", "c"], ["y"])]
    feeds = {"x": x, "w": w, "b": b, "c": c}
    m = _grad_model(nodes, feeds, ["w", "b"], "y", ["dw", "db"], zs=["x", "c"])
    (y, dw, db), _ = run_ours(m, feeds)
    t = np.tanh(x @ w + b)
    ga = c * (1 - t * t)
    np.testing.assert_allclose(y, t * c, rtol=1e-12)
    np.testing.assert_allclose(dw, x.T @ ga, rtol=1e-10)
    np.testing.assert_allclose(db, ga.sum(axis=0), rtol=1e-10)
    assert dw.dtype == np.float64 and dw.shape == w.shape and db.shape == b.shape


def test_gradient_reused_value_and_finite_difference():
    # y = (a - b) / (a * a + 1) + Sqrt(Exp(a)): a is used several times (gradients add up)
    a, b = np.array(0.7, np.float64), np.array(-1.3, np.float64)
    one = np.array(1.0, np.float64)
    nodes = [helper.make_node("Sub", ["a", "b"], ["s"]), helper.make_node("Mul", ["a", "a"], ["aa"]),
             helper.make_node("Add", ["aa", "one"], ["d"]), helper.make_node("Div", ["s", "d"], ["q"]),
             helper.make_node("Exp", ["a"], ["e"]), helper.make_node("Sqrt", ["e"], ["r"]),
             helper.make_node("Add", ["q", "r"], ["y"])]
    g = helper.make_node("Gradient", ["a", "b"], ["da", "db"], domain=TRAINING, xs=["a", "b"], y="y")
    m = make_model(nodes + [g], {"a": a, "b": b}, ["y", "da", "db"], opset=17, extra_opsets={TRAINING: 1},
                   initializers={"one": one})
    (y, da, db), _ = run_ours(m, {"a": a, "b": b})
    f = lambda a_, b_: (a_ - b_) / (a_ * a_ + 1) + np.sqrt(np.exp(a_))  # noqa: E731
    eps = 1e-6
    np.testing.assert_allclose(da, (f(a + eps, b) - f(a - eps, b)) / (2 * eps), rtol=1e-6)
    np.testing.assert_allclose(db, (f(a, b + eps) - f(a, b - eps)) / (2 * eps), rtol=1e-6)


def test_gradient_through_unsupported_op_is_declined():
    import runtime_core as rt
    from runtime_core.errors import PartitionError

    x = rnd(2, 3)
    m = _grad_model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], {"x": x}, ["x"], "y", ["dx"])
    with pytest.raises(PartitionError, match=r"Gradient through Softmax is not implemented"):
        rt.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])


def test_gradient_gemm_transposed():
    a, b, c = rnd(3, 4, dtype=np.float64), rnd(5, 3, dtype=np.float64), rnd(1, 5, dtype=np.float64)
    nodes = [helper.make_node("Gemm", ["a", "b", "c"], ["y"], alpha=0.5, beta=2.0, transA=1, transB=1)]
    feeds = {"a": a, "b": b, "c": c}
    m = _grad_model(nodes, feeds, ["a", "b", "c"], "y", ["da", "db", "dc"])
    (y, da, db, dc), _ = run_ours(m, feeds)
    g = np.ones((4, 5))
    np.testing.assert_allclose(y, 0.5 * a.T @ b.T + 2.0 * c, rtol=1e-12)
    np.testing.assert_allclose(da, 0.5 * (g @ b).T, rtol=1e-12)  # d/dA of sum(alpha A^T B^T)
    np.testing.assert_allclose(db, 0.5 * (a @ g).T, rtol=1e-12)
    np.testing.assert_allclose(dc, 2.0 * g.sum(axis=0, keepdims=True), rtol=1e-12)
