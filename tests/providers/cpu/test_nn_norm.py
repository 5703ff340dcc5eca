"""CPU provider nn kernels against onnxruntime (the oracle), node by node: BatchNormalization,
InstanceNormalization, LayerNormalization, GroupNormalization, LRN, the softmax family and Dropout.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from oracle import check_node, make_model, run_oracle, run_ours
from providers.cpu.nn_cases import F32, expect_declined, node_check, rnd, tol


# ------------------------------------------------------------------------------ normalization

@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (2, 3, 4, 5), (1, 3, 2, 3, 4)])
@pytest.mark.parametrize("opset", [7, 9, 14, 15])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_batchnorm(shape, opset, dtype):
    C = shape[1]
    inits = {"s": rnd(C, dtype=dtype), "b": rnd(C, dtype=dtype), "m": rnd(C, dtype=dtype),
             "v": np.abs(rnd(C, dtype=dtype)) + dtype(0.5)}
    check_node("BatchNormalization", {"x": rnd(*shape, dtype=dtype)}, initializers=inits, epsilon=1e-3,
               opset=opset, **tol(dtype))


@pytest.mark.parametrize("spatial", [1, 0])
def test_batchnorm_6(spatial):
    # onnxruntime has no BatchNormalization-6: opset 7 (same inference arithmetic) is the oracle
    pshape = (3,) if spatial else (3, 4, 5)
    inits = {"s": rnd(*pshape), "b": rnd(*pshape), "m": rnd(*pshape), "v": np.abs(rnd(*pshape)) + np.float32(0.5)}
    x = rnd(2, 3, 4, 5)
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3, spatial=spatial)]
    ref = run_oracle(make_model(nodes, {"x": x}, ["y"], opset=7, initializers=inits), {"x": x})
    node_check("BatchNormalization", {"x": x}, opset=6, initializers=inits, oracle=lambda f: ref, epsilon=1e-3,
               is_test=1, spatial=spatial, **F32)


def test_batchnorm_6_training_outputs_declined():
    # is_test=0 with Y alone is implemented (test_legacy.py); the running/saved outputs are not
    inits = {"s": rnd(3), "b": rnd(3), "m": rnd(3), "v": np.abs(rnd(3)) + np.float32(0.5)}
    outs = ["y", "mean", "var", "saved_mean", "saved_var"]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], outs, is_test=0)
    expect_declined([node], {"x": rnd(2, 3, 4)}, outs, 6, inits, reason="saved_var")


def test_batchnorm_mixed_param_dtype():
    # opset 15: scale/bias (T1) and mean/var (T2) may differ from X (T)
    inits = {"s": rnd(3), "b": rnd(3), "m": rnd(3), "v": np.abs(rnd(3)) + np.float32(0.5)}
    check_node("BatchNormalization", {"x": rnd(2, 3, 4, 4, dtype=np.float16)}, initializers=inits,
               opset=15, rtol=1e-2, atol=1e-2)


def test_batchnorm_spatial0():
    inits = {"s": rnd(3, 4, 5), "b": rnd(3, 4, 5), "m": rnd(3, 4, 5), "v": np.abs(rnd(3, 4, 5)) + np.float32(0.5)}
    check_node("BatchNormalization", {"x": rnd(2, 3, 4, 5)}, initializers=inits, spatial=0, opset=7, **F32)


@pytest.mark.parametrize("opset", [14, 15])
@pytest.mark.parametrize("momentum", [0.9, 0.3])
def test_batchnorm_training(opset, momentum):
    inits = {"s": rnd(3), "b": rnd(3), "m": rnd(3), "v": np.abs(rnd(3)) + np.float32(0.5)}
    check_node("BatchNormalization", {"x": rnd(4, 3, 5, 6)}, ("y", "rm", "rv"), initializers=inits,
               training_mode=1, momentum=momentum, opset=opset, **F32)


def test_batchnorm_training_outputs_declined_before_14():
    inits = {"s": rnd(3), "b": rnd(3), "m": rnd(3), "v": np.abs(rnd(3)) + np.float32(0.5)}
    outs = ["y", "mean", "var", "saved_mean", "saved_var"]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], outs)
    expect_declined([node], {"x": rnd(2, 3, 4)}, outs, 9, inits, "training")


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 4, 5)])
@pytest.mark.parametrize("opset", [6, 22])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_instance_norm(shape, opset, dtype):
    C = shape[1]
    check_node("InstanceNormalization", {"x": rnd(*shape, dtype=dtype)},
               initializers={"s": rnd(C, dtype=dtype), "b": rnd(C, dtype=dtype)}, epsilon=1e-4,
               opset=opset if dtype != np.float16 else 6, **tol(dtype))


@pytest.mark.parametrize("shape,axis", [((2, 3, 4), -1), ((2, 3, 4), 1), ((2, 3, 4), 0), ((4, 6), -1),
                                        ((2, 3, 4, 5), 2), ((2, 3, 4, 5), -3)])
@pytest.mark.parametrize("with_bias", [0, 1])
@pytest.mark.parametrize("n_out", [1, 3])
def test_layer_norm(shape, axis, with_bias, n_out):
    nshape = shape[axis:] if axis >= 0 else shape[len(shape) + axis:]
    inits = {"s": rnd(*nshape)}
    if with_bias:
        inits["b"] = rnd(*nshape)
    outs = ("y", "mean", "inv")[:n_out]
    check_node("LayerNormalization", {"x": rnd(*shape)}, outs, initializers=inits, axis=axis, epsilon=1e-3,
               opset=17, **F32)


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_layer_norm_dtypes(dtype):
    check_node("LayerNormalization", {"x": rnd(3, 8, dtype=dtype)}, ("y", "mean", "inv"),
               initializers={"s": rnd(8, dtype=dtype), "b": rnd(8, dtype=dtype)}, opset=17,
               **(tol(dtype) if dtype == np.float16 else F32))


def test_layer_norm_scale_broadcast_and_only_inv():
    # scale broadcast from a lower rank; only InvStdDev wanted (Mean omitted)
    check_node("LayerNormalization", {"x": rnd(2, 3, 4)}, ("y", "", "inv"), initializers={"s": rnd(4)},
               axis=1, opset=17, **F32)


def test_layer_norm_stash_type_declined():
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y"], stash_type=16)
    expect_declined([node], {"x": rnd(2, 4)}, ["y"], 17, {"s": rnd(4)}, "stash_type 16")


@pytest.mark.parametrize("shape,groups", [((2, 6, 4), 3), ((2, 6, 3, 4), 2), ((1, 4, 2, 2, 3), 4), ((2, 6, 5), 1)])
@pytest.mark.parametrize("opset", [21, 22])
def test_group_norm(shape, groups, opset):
    # opset 21: scale/bias per channel (opset 18's per-group form: test_legacy.py)
    check_node("GroupNormalization", {"x": rnd(*shape)}, initializers={"s": rnd(shape[1]), "b": rnd(shape[1])},
               num_groups=groups, epsilon=1e-3, opset=opset, **F32)


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_group_norm_dtypes(dtype):
    check_node("GroupNormalization", {"x": rnd(2, 4, 5, dtype=dtype)},
               initializers={"s": rnd(4, dtype=dtype), "b": rnd(4, dtype=dtype)}, num_groups=2, opset=21,
               **(tol(dtype) if dtype == np.float16 else F32))


def naive_lrn(x, size, alpha, beta, bias):
    C = x.shape[1]
    xd = x.astype(np.float64)
    sq = np.zeros_like(xd)
    for c in range(C):
        lo, hi = max(0, c - (size - 1) // 2), min(C - 1, c + int(np.ceil((size - 1) / 2)))
        sq[:, c] = np.sum(xd[:, lo:hi + 1] ** 2, axis=1)
    return (xd / (bias + alpha / size * sq) ** beta).astype(x.dtype)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("shape", [(2, 7, 3, 4), (1, 5, 6, 2), (1, 5, 6), (1, 4, 2, 3, 2)])
@pytest.mark.parametrize("opset", [1, 13])
def test_lrn(size, shape, opset):
    x = rnd(*shape)
    kw = dict(size=size, alpha=0.01, beta=0.6, bias=1.5, opset=opset, **F32)
    if len(shape) == 4 and size % 2:
        check_node("LRN", {"x": x}, **kw)
    else:  # onnxruntime runs only 4-D LRN with an odd size (onnx.reference is broken): the spec formula
        node_check("LRN", {"x": x}, oracle=lambda f: [naive_lrn(x, size, 0.01, 0.6, 1.5)], **kw)


@pytest.mark.parametrize("dtype", [np.float16])  # onnxruntime has no float64 LRN
def test_lrn_dtypes(dtype):
    check_node("LRN", {"x": rnd(1, 6, 3, 3, dtype=dtype)}, size=3, opset=13, **tol(dtype))


# ------------------------------------------------------------------------------ softmax family

@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset", [1, 11, 13])
@pytest.mark.parametrize("shape,axis", [((3, 4), None), ((2, 3, 4), 0), ((2, 3, 4), 1), ((2, 3, 4), 2),
                                        ((2, 3, 4), -1), ((2, 3, 4, 5), -2), ((5,), 0)])
def test_softmax_family(op, opset, shape, axis):
    if opset == 1 and axis is not None and axis < 0:
        axis = len(shape) + axis  # negative axes arrive with opset 11
    kw = {} if axis is None else {"axis": axis}
    x = rnd(*shape, scale=3)
    if op == "Hardmax":
        x = np.round(x)  # ties: the first maximum wins
    check_node(op, {"x": x}, opset=opset, **kw, **F32)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_softmax_dtypes(op, dtype):
    check_node(op, {"x": rnd(3, 5, dtype=dtype)}, opset=13, **tol(dtype))


def test_softmax_large_values():
    check_node("Softmax", {"x": rnd(2, 6, scale=500)}, opset=13, **F32)
    check_node("LogSoftmax", {"x": rnd(2, 6, scale=500)}, opset=13, **F32)


# ------------------------------------------------------------------------------ Dropout

@pytest.mark.parametrize("opset,with_mask", [(o, m) for o in (7, 10, 12, 13, 22) for m in (False, True)
                                             if not (o < 12 and m)])  # the mask of Dropout-7/10 is declined
def test_dropout_inference(opset, with_mask):
    outs = ("y", "mask") if with_mask else ("y",)
    check_node("Dropout", {"x": rnd(3, 4)}, outs, opset=opset, ratio=0.3) if opset < 12 else \
        check_node("Dropout", {"x": rnd(3, 4)}, outs, opset=opset)


def test_dropout_10_mask_declined():
    node = helper.make_node("Dropout", ["x"], ["y", "mask"])
    expect_declined([node], {"x": rnd(3, 4)}, ["y", "mask"], 10, None, "Dropout-10 mask output is not implemented")


@pytest.mark.parametrize("opset", [12, 13, 22])
def test_dropout_inputs_training_false(opset):
    check_node("Dropout", {"x": rnd(3, 4)}, ("y", "mask"),
               initializers={"r": np.array(0.4, np.float32), "t": np.array(False)}, opset=opset)


@pytest.mark.parametrize("ratio", [0.0, 0.25, 0.75])
def test_dropout_training(ratio):
    x = np.abs(rnd(200, 50)) + np.float32(0.1)
    node = helper.make_node("Dropout", ["x", "r", "t"], ["y", "mask"], seed=3)
    model = make_model([node], {"x": x}, ["y", "mask"], opset=13,
                       initializers={"r": np.array(ratio, np.float32), "t": np.array(True)})
    (y, mask), _ = run_ours(model, {"x": x})
    assert y.dtype == np.float32 and mask.dtype == np.bool_
    scale = np.float32(1.0 / (1.0 - ratio))
    np.testing.assert_allclose(y[mask], x[mask] * scale, rtol=1e-6)
    assert not y[~mask].any()
    assert abs((~mask).mean() - ratio) < 0.03


@pytest.mark.parametrize("shape", [(2, 40, 5, 7), (1, 96, 8, 8), (1, 8, 3, 4, 5), (3, 5, 2)])
@pytest.mark.parametrize("n_out", [1, 3])
def test_layer_norm_over_channels_of_a_transpose(shape, n_out, monkeypatch):
    # ConvNeXt: LayerNormalization of the NHWC Transpose of an NCHW tensor, read in place by
    # the compiled kernel (the spy shows it ran) and written as the NHWC result
    from runtime_provider_cpu.fast.policy import current

    nat = current().native
    calls = []
    if nat is not None:
        real = nat.layer_norm_cf

        class Spy:
            def __getattr__(self, name):
                return getattr(nat, name)

            def layer_norm_cf(self, *a):
                calls.append(a[6])
                return real(*a)

        import runtime_provider_cpu.ops.norm as norm_mod

        monkeypatch.setattr(norm_mod, "current", lambda: current().replace(native=Spy()))
    perm = [0] + list(range(2, len(shape))) + [1]
    x = rnd(*shape) * np.float32(3) + np.float32(1)
    inits = {"s": rnd(shape[1]), "b": rnd(shape[1])}
    outs = ["y", "mean", "inv"][:n_out]
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=perm),
             helper.make_node("LayerNormalization", ["t", "s", "b"], outs, axis=-1, epsilon=1e-6)]
    model = make_model(nodes, {"x": x}, outs, opset=17, initializers=inits)
    ours, _ = run_ours(model, {"x": x})
    ref = run_oracle(model, {"x": x})
    for a, r in zip(ours, ref):
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-5)
        assert a.shape == r.shape
    if nat is not None:
        assert calls, "the channels-first kernel did not run"
