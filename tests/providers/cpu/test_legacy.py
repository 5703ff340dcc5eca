"""Legacy (and deprecated) nn/rnn schema versions on the CPU provider.

No backend case covers most of these versions and onnxruntime / onnx's reference evaluator
run only some of them. Oracles, per op:

* onnxruntime or ``onnx.reference.ReferenceEvaluator`` where one runs the version itself
  (LpPool-1, MaxRoiPool-1, GRU-1/3, GroupNormalization-18, Upsample-10);
* the same node at the modern version, run by the oracle, where the legacy schema differs only
  by an attribute without effect on values (consumed_inputs, output_sequence) or by a type
  (InstanceNormalization-1, LSTM-1, RNN-1, Upsample-1 vs Upsample-7);
* a hand computation in numpy of the schema text elsewhere (Gemm-1, GlobalLpPool-1,
  BatchNormalization-1/6, Dropout-1/6, MaxRoiPool with negative values and opset 22).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import runtime_core as rt
from runtime_core.errors import InvalidModelError, PartitionError
from oracle import assert_close, check_node, make_model, run_oracle, run_ours

RNG = np.random.default_rng(20250301)
F32 = dict(rtol=1e-4, atol=1e-5)


def rnd(*shape, dtype=np.float32, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def pos(*shape, dtype=np.float32):
    return (RNG.random(shape) + 0.5).astype(dtype)


def one_node(op, inputs, outputs=("y",), *, opset, initializers=None, **attrs):
    node = helper.make_node(op, list(inputs) + list(initializers or {}), list(outputs), **attrs)
    return make_model([node], inputs, [o for o in outputs if o], opset=opset, initializers=initializers)


def ours_of(op, inputs, outputs=("y",), *, opset, initializers=None, **attrs):
    model = one_node(op, inputs, outputs, opset=opset, initializers=initializers, **attrs)
    out, sess = run_ours(model, dict(inputs))
    assert all(n.provider == "CPUExecutionProvider" for n in sess.get_partition_report().nodes)
    return out


def oracle_of(op, inputs, outputs=("y",), *, opset, initializers=None, **attrs):
    model = one_node(op, inputs, outputs, opset=opset, initializers=initializers, **attrs)
    return run_oracle(model, dict(inputs))


def expect_declined(op, inputs, outputs=("y",), *, opset, initializers=None, reason="", **attrs):
    model = one_node(op, inputs, outputs, opset=opset, initializers=initializers, **attrs)
    with pytest.raises(PartitionError) as ei:
        rt.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert reason in str(ei.value)


@pytest.fixture
def no_checker(monkeypatch):
    """Deprecated schemas (GroupNormalization-18, Upsample-10) fail onnx.checker, which the
    core's loader runs; the kernels are exercised with the checker switched off."""
    monkeypatch.setattr(onnx.checker, "check_model", lambda *a, **k: None)


# ------------------------------------------------------------------------------ Gemm-1

@pytest.mark.parametrize("transA,transB", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("c_shape,broadcast", [((3, 5), 0), ((5,), 1), ((1, 5), 1), ((3, 1), 1), ((), 1)])
def test_gemm_1(transA, transB, c_shape, broadcast):
    a = rnd(4, 3) if transA else rnd(3, 4)
    b = rnd(5, 4) if transB else rnd(4, 5)
    c = rnd(*c_shape)
    (y,) = ours_of("Gemm", {"a": a}, opset=1, initializers={"b": b, "c": c}, alpha=0.7, beta=-1.3,
                   broadcast=broadcast, transA=transA, transB=transB)
    A = a.T if transA else a
    B = b.T if transB else b
    want = (0.7 * A.astype(np.float64) @ B - 1.3 * c.astype(np.float64)).astype(np.float32)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, want, **F32)


def test_gemm_1_matches_gemm_6_oracle():
    a, b, c = rnd(3, 4), rnd(4, 5), rnd(5)
    ours = ours_of("Gemm", {"a": a}, opset=1, initializers={"b": b, "c": c}, broadcast=1, alpha=2.0)
    ref = oracle_of("Gemm", {"a": a}, opset=6, initializers={"b": b, "c": c}, broadcast=1, alpha=2.0)
    assert_close(ours, ref, **F32)


def test_gemm_1_c_shape_without_broadcast_fails():
    with pytest.raises(Exception, match="Gemm-1: C must have shape"):
        ours_of("Gemm", {"a": rnd(3, 4)}, opset=1, initializers={"b": rnd(4, 5), "c": rnd(5)})


# ------------------------------------------------------------------------------ LpPool-1 / GlobalLpPool-1

@pytest.mark.parametrize("p", [1.0, 2.0, 3.0, 1.5])
@pytest.mark.parametrize("kw", [dict(kernel_shape=[2, 2]), dict(kernel_shape=[3, 2], strides=[2, 1]),
                                dict(kernel_shape=[2, 3], pads=[1, 0, 1, 1]),
                                dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER")])
def test_lppool_1(p, kw):
    check_node("LpPool", {"x": rnd(2, 3, 5, 6)}, opset=1, p=p, **kw, **F32)


def test_lppool_1_default_p_and_1d():
    x = rnd(2, 3, 7)
    (y,) = ours_of("LpPool", {"x": x}, opset=1, kernel_shape=[3])
    want = np.sqrt(sum(x[:, :, i:i + 5].astype(np.float64) ** 2 for i in range(3))).astype(np.float32)
    np.testing.assert_allclose(y, want, **F32)


def test_lppool_1_without_kernel_shape_declined():
    expect_declined("LpPool", {"x": rnd(1, 1, 4, 4)}, opset=1, reason="LpPool-1 without kernel_shape")


@pytest.mark.parametrize("p", [None, 1.0, 3.0, 2.5])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 2, 6), (2, 2, 2, 3, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_global_lppool_1(p, shape, dtype):
    x = rnd(*shape, dtype=dtype)
    attrs = {} if p is None else {"p": p}
    (y,) = ours_of("GlobalLpPool", {"x": x}, opset=1, **attrs)
    pp = 2.0 if p is None else p
    axes = tuple(range(2, x.ndim))
    want = (np.sum(np.abs(x.astype(np.float64)) ** pp, axis=axes, keepdims=True) ** (1 / pp)).astype(dtype)
    assert y.dtype == dtype
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_global_lppool_1_matches_opset_2_oracle():
    x = rnd(2, 3, 4, 5)
    (ours,) = ours_of("GlobalLpPool", {"x": x}, opset=1, p=3.0)
    (ref,) = oracle_of("GlobalLpPool", {"x": x}, opset=2, p=3)
    np.testing.assert_allclose(ours, ref, **F32)


# ------------------------------------------------------------------------------ BatchNormalization-1 / -6

def bn_hand(x, s, b, m, v, eps, shape):
    xd = x.astype(np.float64)
    return ((xd - m.reshape(shape)) / np.sqrt(v.reshape(shape) + eps) * s.reshape(shape)
            + b.reshape(shape)).astype(x.dtype)


def bn_inits(C, dtype=np.float32, shape=None):
    shape = shape or (C,)
    return {"s": rnd(*shape, dtype=dtype), "b": rnd(*shape, dtype=dtype), "m": rnd(*shape, dtype=dtype),
            "v": pos(*shape, dtype=dtype)}


@pytest.mark.parametrize("opset", [1, 6])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 4), (2, 3, 5)])
@pytest.mark.parametrize("spatial", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batchnorm_legacy_test_mode(opset, shape, spatial, dtype):
    x = rnd(*shape, dtype=dtype)
    inits = bn_inits(shape[1], dtype)
    extra = {"consumed_inputs": [0, 0, 0, 1, 1]} if opset == 1 else {}
    (y,) = ours_of("BatchNormalization", {"x": x}, opset=opset, initializers=inits, is_test=1,
                   spatial=spatial, epsilon=1e-3, **extra)
    want = bn_hand(x, *inits.values(), 1e-3, (shape[1],) + (1,) * (len(shape) - 2))
    assert y.dtype == dtype
    np.testing.assert_allclose(y, want, **F32)


@pytest.mark.parametrize("opset", [1, 6])
def test_batchnorm_legacy_test_mode_matches_opset_9_oracle(opset):
    x = rnd(2, 3, 4, 5)
    inits = bn_inits(3)
    extra = {"consumed_inputs": [0, 0, 0, 1, 1]} if opset == 1 else {}
    ours = ours_of("BatchNormalization", {"x": x}, opset=opset, initializers=inits, is_test=1, **extra)
    ref = oracle_of("BatchNormalization", {"x": x}, opset=9, initializers=inits)
    assert_close(ours, ref, **F32)


@pytest.mark.parametrize("opset", [1, 6])
def test_batchnorm_legacy_per_feature_params(opset):
    # spatial=0 with parameters of shape C x D1 x ... (per feature)
    x = rnd(2, 3, 4)
    inits = bn_inits(3, shape=(3, 4))
    extra = {"consumed_inputs": [0, 0, 0, 1, 1]} if opset == 1 else {}
    (y,) = ours_of("BatchNormalization", {"x": x}, opset=opset, initializers=inits, is_test=1, spatial=0, **extra)
    np.testing.assert_allclose(y, bn_hand(x, *inits.values(), 1e-5, (3, 4)), **F32)


@pytest.mark.parametrize("opset", [1, 6])
@pytest.mark.parametrize("spatial", [0, 1])
@pytest.mark.parametrize("is_test", [None, 0])  # the default is_test is 0: training
def test_batchnorm_legacy_training_y(opset, spatial, is_test):
    x = rnd(4, 3, 2, 5)
    inits = bn_inits(3)
    attrs = {"spatial": spatial, "epsilon": 1e-4}
    if is_test is not None:
        attrs["is_test"] = is_test
    if opset == 1:
        attrs["consumed_inputs"] = [0, 0, 0, 1, 1]
    (y,) = ours_of("BatchNormalization", {"x": x}, opset=opset, initializers=inits, **attrs)
    axes = (0, 2, 3) if spatial else (0,)
    xd = x.astype(np.float64)
    m, v = xd.mean(axis=axes, keepdims=True), xd.var(axis=axes, keepdims=True)
    sh = (3, 1, 1)
    want = ((xd - m) / np.sqrt(v + 1e-4) * inits["s"].reshape(sh) + inits["b"].reshape(sh)).astype(np.float32)
    np.testing.assert_allclose(y, want, **F32)


@pytest.mark.parametrize("opset", [1, 6])
def test_batchnorm_legacy_training_outputs_declined(opset):
    extra = {"consumed_inputs": [0, 0, 0, 1, 1]} if opset == 1 else {}
    expect_declined("BatchNormalization", {"x": rnd(2, 3, 4)}, ("y", "mean", "var", "sm", "sv"), opset=opset,
                    initializers=bn_inits(3), reason="saved_var", **extra)


# ------------------------------------------------------------------------------ InstanceNormalization-1

@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 4, 6), (2, 2, 3, 2, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_instance_norm_1(shape, dtype):
    x = rnd(*shape, dtype=dtype)
    inits = {"s": rnd(shape[1], dtype=dtype), "b": rnd(shape[1], dtype=dtype)}
    ours = ours_of("InstanceNormalization", {"x": x}, opset=1, initializers=inits, consumed_inputs=[0, 0, 0],
                   epsilon=1e-3)
    ref = oracle_of("InstanceNormalization", {"x": x}, opset=6, initializers=inits, epsilon=1e-3)
    assert_close(ours, ref, **F32)


# ------------------------------------------------------------------------------ GroupNormalization-18

def gn18_hand(x, s, b, G, eps):
    N = x.shape[0]
    xr = x.astype(np.float64).reshape(N, G, -1)
    xn = (xr - xr.mean(-1, keepdims=True)) / np.sqrt(xr.var(-1, keepdims=True) + eps)
    return (xn * s[:, None] + b[:, None]).reshape(x.shape).astype(x.dtype)


def test_group_norm_18_rejected_by_the_checker():
    model = one_node("GroupNormalization", {"x": rnd(2, 4, 3)}, opset=18,
                     initializers={"s": rnd(2), "b": rnd(2)}, num_groups=2)
    with pytest.raises(InvalidModelError, match="deprecated"):
        rt.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("shape,groups", [((2, 6, 4), 3), ((2, 6, 3, 4), 2), ((1, 4, 2, 2, 3), 4),
                                          ((2, 6, 5), 1), ((3, 4), 2)])
@pytest.mark.parametrize("opset", [18, 19, 20])
def test_group_norm_18(no_checker, shape, groups, opset):
    # scale/bias per GROUP, as the opset-18 text says; onnxruntime and onnx's reference agree
    x = rnd(*shape)
    inits = {"s": rnd(groups), "b": rnd(groups)}
    ours = check_node("GroupNormalization", {"x": x}, initializers=inits, num_groups=groups, epsilon=1e-3,
                      opset=opset, **F32)
    np.testing.assert_allclose(ours[0], gn18_hand(x, inits["s"], inits["b"], groups, 1e-3), **F32)


def test_group_norm_18_reference_evaluator(no_checker):
    from onnx.reference import ReferenceEvaluator

    x = rnd(2, 6, 5)
    inits = {"s": rnd(3), "b": rnd(3)}
    model = one_node("GroupNormalization", {"x": x}, opset=18, initializers=inits, num_groups=3)
    ours, _ = run_ours(model, {"x": x})
    assert_close(ours, ReferenceEvaluator(model).run(None, {"x": x}), **F32)


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_group_norm_18_dtypes(no_checker, dtype):
    x = rnd(2, 4, 5, dtype=dtype)
    s, b = rnd(2, dtype=dtype), rnd(2, dtype=dtype)
    (y,) = ours_of("GroupNormalization", {"x": x}, opset=18, initializers={"s": s, "b": b}, num_groups=2)
    assert y.dtype == dtype
    t = dict(rtol=1e-2, atol=1e-2) if dtype == np.float16 else dict(rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(y.astype(np.float64), gn18_hand(x.astype(np.float64), s.astype(np.float64),
                                                               b.astype(np.float64), 2, 1e-5), **t)


def test_group_norm_18_per_channel_scale_rejected(no_checker):
    with pytest.raises(Exception, match=r"shape \(2,\)"):
        ours_of("GroupNormalization", {"x": rnd(2, 4, 3)}, opset=18, initializers={"s": rnd(4), "b": rnd(4)},
                num_groups=2)


# ------------------------------------------------------------------------------ Dropout-1 / -6

def dropout_attrs(opset, **kw):
    return {**kw, "consumed_inputs": [0]} if opset == 1 else kw


@pytest.mark.parametrize("opset", [1, 6])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_dropout_legacy_test_mode(opset, dtype):
    x = rnd(3, 4, dtype=dtype)
    (y,) = ours_of("Dropout", {"x": x}, opset=opset, **dropout_attrs(opset, is_test=1, ratio=0.7))
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("opset", [1, 6])
def test_dropout_legacy_test_mode_mask_declined(opset):
    expect_declined("Dropout", {"x": rnd(3, 4)}, ("y", "mask"), opset=opset,
                    reason="is not filled", **dropout_attrs(opset, is_test=1))


@pytest.mark.parametrize("opset", [1, 6])
@pytest.mark.parametrize("ratio", [None, 0.0, 0.25, 0.75, 1.0])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dropout_legacy_training(opset, ratio, dtype):
    # is_test defaults to 0: training dropout, scaled by 1 / (1 - ratio); the mask has type T
    x = (np.abs(rnd(200, 50)) + np.float32(0.1)).astype(dtype)
    attrs = dropout_attrs(opset) if ratio is None else dropout_attrs(opset, ratio=ratio)
    y, mask = ours_of("Dropout", {"x": x}, ("y", "mask"), opset=opset, **attrs)
    r = 0.5 if ratio is None else ratio
    assert y.dtype == dtype and mask.dtype == dtype
    keep = mask == 1
    assert np.all((mask == 0) | keep)
    if r < 1:
        np.testing.assert_allclose(y[keep], x[keep] * dtype(1.0 / (1.0 - r)), rtol=1e-6)
    assert not y[~keep].any()
    assert abs((~keep).mean() - r) < 0.03


@pytest.mark.parametrize("opset", [1, 6])
def test_dropout_legacy_training_y_only(opset):
    x = np.abs(rnd(100, 40)) + np.float32(0.1)
    (y,) = ours_of("Dropout", {"x": x}, opset=opset, **dropout_attrs(opset, is_test=0, ratio=0.4))
    kept = y != 0
    np.testing.assert_allclose(y[kept], x[kept] / np.float32(0.6), rtol=1e-6)
    assert abs((~kept).mean() - 0.4) < 0.04


# ------------------------------------------------------------------------------ Upsample-1 / -10

@pytest.mark.parametrize("hs,ws", [(2.0, 2.0), (3.0, 1.0), (1.0, 2.0), (1.5, 2.5)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.bool_, np.float64])
def test_upsample_1_nearest(hs, ws, dtype):
    x = RNG.integers(0, 5, (2, 3, 3, 4)).astype(dtype)
    (y,) = ours_of("Upsample", {"x": x}, opset=1, height_scale=hs, width_scale=ws, mode="nearest")
    H, W = int(np.floor(3 * hs)), int(np.floor(4 * ws))
    hi = np.floor(np.arange(H) / hs).astype(int)
    wi = np.floor(np.arange(W) / ws).astype(int)
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(y, x[:, :, hi][:, :, :, wi])


def test_upsample_1_doc_example():
    x = np.array([[[[1, 2], [3, 4]]]], np.float32)
    (y,) = ours_of("Upsample", {"x": x}, opset=6, height_scale=2.0, width_scale=2.0)  # default mode nearest
    np.testing.assert_array_equal(y, [[[[1, 1, 2, 2], [1, 1, 2, 2], [3, 3, 4, 4], [3, 3, 4, 4]]]])


@pytest.mark.parametrize("hs,ws", [(2.0, 3.0), (1.5, 2.5)])
def test_upsample_1_matches_upsample_7_oracle(hs, ws):
    x = rnd(1, 2, 3, 4)
    ours = ours_of("Upsample", {"x": x}, opset=1, height_scale=hs, width_scale=ws)
    ref = oracle_of("Upsample", {"x": x}, opset=7, scales=[1.0, 1.0, hs, ws], mode="nearest")
    assert_close(ours, ref)


def test_upsample_1_bilinear_declined():
    expect_declined("Upsample", {"x": rnd(1, 1, 2, 2)}, opset=1, height_scale=2.0, width_scale=2.0,
                    mode="bilinear", reason="mode 'bilinear' is not implemented")


def test_upsample_10_rejected_by_the_checker():
    model = one_node("Upsample", {"x": rnd(1, 1, 2, 2)}, opset=10,
                     initializers={"s": np.array([1, 1, 2, 2], np.float32)})
    with pytest.raises(InvalidModelError, match="deprecated"):
        rt.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 2, 2], [1, 1, 3, 1.5], [1, 1, 1, 2]])
def test_upsample_10(no_checker, mode, scales):
    # same text as opset 9: compare with the opset-9 node on the oracle
    x = rnd(1, 2, 3, 4)
    inits = {"s": np.array(scales, np.float32)}
    ours = ours_of("Upsample", {"x": x}, opset=10, initializers=inits, mode=mode)
    ref = oracle_of("Upsample", {"x": x}, opset=9, initializers=inits, mode=mode)
    assert_close(ours, ref, **F32)


# ------------------------------------------------------------------------------ MaxRoiPool

def roi_pool_naive(x, rois, ph, pw, scale):
    """A loop over RoIs/bins (Caffe2's RoIPool), with a true max (-inf start)."""
    R, C = rois.shape[0], x.shape[1]
    H, W = x.shape[2:]
    y = np.zeros((R, C, ph, pw), dtype=np.float64)

    def rnd_away(v):
        return int(np.sign(v) * np.floor(abs(v) + 0.5))

    for n in range(R):
        b = int(rois[n, 0])
        xs, ys, xe, ye = (rnd_away(float(np.float32(rois[n, i]) * np.float32(scale))) for i in (1, 2, 3, 4))
        rh, rw = max(ye - ys + 1, 1), max(xe - xs + 1, 1)
        bh, bw = np.float32(rh) / np.float32(ph), np.float32(rw) / np.float32(pw)
        for i in range(ph):
            for j in range(pw):
                h0 = min(max(int(np.floor(np.float32(i) * bh)) + ys, 0), H)
                h1 = min(max(int(np.ceil(np.float32(i + 1) * bh)) + ys, 0), H)
                w0 = min(max(int(np.floor(np.float32(j) * bw)) + xs, 0), W)
                w1 = min(max(int(np.ceil(np.float32(j + 1) * bw)) + xs, 0), W)
                if h1 > h0 and w1 > w0:
                    y[n, :, i, j] = x[b, :, h0:h1, w0:w1].max(axis=(1, 2))
    return y.astype(x.dtype)


def random_rois(R, N, H, W, scale=1.0):
    b = RNG.integers(0, N, R)
    p = RNG.uniform(-2, max(H, W) + 2, (R, 4)) / scale
    x1, x2 = np.minimum(p[:, 0], p[:, 1]), np.maximum(p[:, 0], p[:, 1])
    y1, y2 = np.minimum(p[:, 2], p[:, 3]), np.maximum(p[:, 2], p[:, 3])
    return np.stack([b, x1, y1, x2, y2], axis=1).astype(np.float32)


@pytest.mark.parametrize("pooled", [[2, 2], [3, 2], [1, 1], [4, 5]])
@pytest.mark.parametrize("scale", [1.0, 0.5, 0.25])
def test_max_roi_pool_vs_onnxruntime(pooled, scale):
    # onnxruntime starts its max at FLT_MIN (the smallest positive float), so it is an oracle
    # only for positive inputs; see the negative-value test below
    x = pos(2, 3, 8, 10)
    rois = random_rois(6, 2, 8, 10, scale)
    ours = check_node("MaxRoiPool", {"x": x}, initializers={"rois": rois}, opset=1, pooled_shape=pooled,
                      spatial_scale=scale)
    np.testing.assert_array_equal(ours[0], roi_pool_naive(x, rois, *pooled, scale))


@pytest.mark.parametrize("opset", [1, 22])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_max_roi_pool_naive(opset, dtype):
    x = rnd(3, 4, 7, 9, dtype=dtype)  # negative values: a true max, not onnxruntime's FLT_MIN floor
    rois = random_rois(9, 3, 7, 9, 0.5)
    rois = np.concatenate([rois, [[0, 20, 20, 30, 30], [1, 3, 2, 1, 1], [2, -5, -5, -3, -4]]]).astype(np.float32)
    (y,) = ours_of("MaxRoiPool", {"x": x}, opset=opset, initializers={"rois": rois}, pooled_shape=[3, 4],
                   spatial_scale=0.5)
    assert y.dtype == dtype and y.shape == (12, 4, 3, 4)
    np.testing.assert_array_equal(y, roi_pool_naive(x, rois, 3, 4, 0.5))
    assert not y[9].any()  # a RoI outside the input: every bin empty -> 0


def test_max_roi_pool_doc_shape_and_defaults():
    x = rnd(1, 2, 6, 6)
    rois = np.array([[0, 0, 0, 5, 5], [0, 1.4, 2.5, 3.5, 4.49]], np.float32)  # 2.5 rounds away from 0
    (y,) = ours_of("MaxRoiPool", {"x": x}, opset=22, initializers={"rois": rois}, pooled_shape=[2, 3])
    np.testing.assert_array_equal(y, roi_pool_naive(x, rois, 2, 3, 1.0))
    np.testing.assert_array_equal(y[0, :, 0, 0], x[0, :, 0:3, 0:2].max(axis=(1, 2)))


def test_max_roi_pool_many_rois_chunked():
    x = rnd(2, 16, 20, 24)
    rois = random_rois(300, 2, 20, 24)
    (y,) = ours_of("MaxRoiPool", {"x": x}, opset=22, initializers={"rois": rois}, pooled_shape=[7, 7])
    np.testing.assert_array_equal(y, roi_pool_naive(x, rois, 7, 7, 1.0))


# ------------------------------------------------------------------------------ RNN / GRU / LSTM legacy

def rnn_inputs(op, seq=5, batch=3, inp=4, H=6, dirs=1, bias=True, init=True, lens=False, peep=False):
    k = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    inits = {"W": rnd(dirs, k * H, inp, scale=0.5), "R": rnd(dirs, k * H, H, scale=0.5)}
    names = ["x", "W", "R"]
    if bias or init or lens or peep:
        if bias:
            inits["B"] = rnd(dirs, 2 * k * H, scale=0.5)
        names.append("B" if bias else "")
    if init or lens or peep:
        if lens:
            inits["L"] = RNG.integers(1, seq + 1, batch).astype(np.int32)
        names.append("L" if lens else "")
    if init or peep:
        if init:
            inits["h0"] = rnd(dirs, batch, H)
        names.append("h0" if init else "")
    if op == "LSTM" and (init or peep):
        if init:
            inits["c0"] = rnd(dirs, batch, H)
        names.append("c0" if init else "")
        if peep:
            inits["P"] = rnd(dirs, 3 * H, scale=0.5)
            names.append("P")
    return {"x": rnd(seq, batch, inp)}, names, inits


def compare_legacy_rnn(op, legacy_opset, modern_opset, feeds, names, inits, outputs, legacy_attrs, attrs):
    def model(opset, extra):
        node = helper.make_node(op, names, list(outputs), **attrs, **extra)
        return make_model([node], feeds, [o for o in outputs if o], opset=opset, initializers=inits)

    ours, sess = run_ours(model(legacy_opset, legacy_attrs), dict(feeds))
    assert all(n.provider == "CPUExecutionProvider" for n in sess.get_partition_report().nodes)
    ref = run_oracle(model(modern_opset, {}), dict(feeds))
    assert_close(ours, ref, **F32)
    return ours


RNN_CASES = [dict(direction="forward"), dict(direction="reverse"), dict(direction="bidirectional"),
             dict(direction="forward", clip=0.8)]


@pytest.mark.parametrize("attrs", RNN_CASES)
@pytest.mark.parametrize("output_sequence", [0, 1])
@pytest.mark.parametrize("lens", [False, True])
def test_rnn_1(attrs, output_sequence, lens):
    dirs = 2 if attrs["direction"] == "bidirectional" else 1
    feeds, names, inits = rnn_inputs("RNN", dirs=dirs, lens=lens)
    compare_legacy_rnn("RNN", 1, 7, feeds, names, inits, ("Y", "Yh"), {"output_sequence": output_sequence},
                       dict(hidden_size=6, **attrs))


@pytest.mark.parametrize("attrs", RNN_CASES + [dict(direction="forward", activations=["Relu"])])
@pytest.mark.parametrize("output_sequence", [0, 1])
@pytest.mark.parametrize("lens", [False, True])
@pytest.mark.parametrize("outputs", [("Y", "Yh"), ("", "Yh")])
def test_gru_3(attrs, output_sequence, lens, outputs):
    dirs = 2 if attrs["direction"] == "bidirectional" else 1
    feeds, names, inits = rnn_inputs("GRU", dirs=dirs, lens=lens)
    for lbr in (0, 1):
        if "activations" in attrs:
            attrs = dict(attrs, activations=["Sigmoid", "Relu"])
        compare_legacy_rnn("GRU", 3, 7, feeds, names, inits, outputs, {"output_sequence": output_sequence},
                           dict(hidden_size=6, linear_before_reset=lbr, **attrs))


@pytest.mark.parametrize("attrs", [{}] + RNN_CASES)
@pytest.mark.parametrize("output_sequence", [0, 1])
def test_gru_1(attrs, output_sequence):
    # {} relies on GRU-1's misspelt default direction 'foward', read as forward
    dirs = 2 if attrs.get("direction") == "bidirectional" else 1
    feeds, names, inits = rnn_inputs("GRU", dirs=dirs, lens=True)
    compare_legacy_rnn("GRU", 1, 7, feeds, names, inits, ("Y", "Yh"), {"output_sequence": output_sequence},
                       dict(hidden_size=6, **attrs))


@pytest.mark.parametrize("op,opset", [("GRU", 1), ("GRU", 3)])
def test_gru_legacy_reference_evaluator(op, opset):
    # onnx's reference runs GRU-1/3 itself (with R transposed, as opset 7 states)
    feeds, names, inits = rnn_inputs("GRU", init=True)
    node = helper.make_node(op, names, ["Y", "Yh"], hidden_size=6)
    model = make_model([node], feeds, ["Y", "Yh"], opset=opset, initializers=inits)
    ours, _ = run_ours(model, dict(feeds))
    assert_close(ours, run_oracle(model, dict(feeds)), **F32)


@pytest.mark.parametrize("attrs", RNN_CASES + [dict(direction="forward", input_forget=1)])
@pytest.mark.parametrize("output_sequence", [0, 1])
@pytest.mark.parametrize("peep,lens", [(False, False), (True, True)])
def test_lstm_1(attrs, output_sequence, peep, lens):
    dirs = 2 if attrs["direction"] == "bidirectional" else 1
    feeds, names, inits = rnn_inputs("LSTM", dirs=dirs, peep=peep, lens=lens)
    compare_legacy_rnn("LSTM", 1, 7, feeds, names, inits, ("Y", "Yh", "Yc"), {"output_sequence": output_sequence},
                       dict(hidden_size=6, **attrs))


@pytest.mark.parametrize("op,opset", [("RNN", 1), ("GRU", 1), ("GRU", 3), ("LSTM", 1)])
def test_rnn_legacy_float64(op, opset):
    feeds, names, inits = rnn_inputs(op, bias=True, init=False)
    feeds = {k: v.astype(np.float64) for k, v in feeds.items()}
    inits = {k: v.astype(np.float64) for k, v in inits.items()}
    outs = ("Y", "Yh", "Yc") if op == "LSTM" else ("Y", "Yh")
    ours = compare_legacy_rnn(op, opset, 7, feeds, names, inits, outs, {"output_sequence": 1},
                              dict(hidden_size=6))
    assert all(o.dtype == np.float64 for o in ours)


def test_every_legacy_version_registered():
    from runtime_provider_cpu.registry import REGISTRY

    want = {"MaxRoiPool": [1, 22], "GroupNormalization": [18, 21], "Upsample": [1, 7, 9, 10],
            "BatchNormalization": [1, 6], "Dropout": [1, 6], "Gemm": [1, 6], "GlobalLpPool": [1, 2],
            "LpPool": [1, 2], "InstanceNormalization": [1, 6], "GRU": [1, 3, 7], "LSTM": [1, 7], "RNN": [1, 7]}
    for op, versions in want.items():
        ours = REGISTRY.versions("", op)
        assert set(versions) <= set(ours), (op, ours)
