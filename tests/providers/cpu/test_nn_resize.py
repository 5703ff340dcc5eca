"""CPU provider nn kernels against onnxruntime (the oracle), node by node: Resize (every
coordinate transform, nearest mode and interpolation) and Upsample.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import runtime_core as rt
from runtime_core.errors import PartitionError
from oracle import check_node, make_model, run_oracle, run_ours
from providers.cpu.nn_cases import F32, RNG, expect_declined, rnd, run_model, tol


# ------------------------------------------------------------------------------ Resize / Upsample

def resize_node(opset, roi=False, scales=False, sizes=False, **attrs):
    if opset == 10:
        return helper.make_node("Resize", ["x", "scales"], ["y"], **attrs)
    ins = ["x", "roi" if roi else "", "scales" if scales else "", "sizes" if sizes else ""]
    while ins[-1] == "":
        ins.pop()
    return helper.make_node("Resize", ins, ["y"], **attrs)


def run_resize(x, opset, scales=None, sizes=None, roi=None, rtol=1e-4, atol=1e-5, **attrs):
    inits = {}
    if roi is not None:
        inits["roi"] = np.asarray(roi, np.float32)
    if scales is not None:
        inits["scales"] = np.asarray(scales, np.float32)
    if sizes is not None:
        inits["sizes"] = np.asarray(sizes, np.int64)
    if opset == 11 and "roi" not in inits:  # roi and scales are required inputs in opset 11
        inits["roi"] = np.zeros(0, np.float32)
    if opset == 11 and "scales" not in inits:
        inits["scales"] = np.zeros(0, np.float32)
    node = resize_node(opset, roi="roi" in inits, scales="scales" in inits, sizes="sizes" in inits, **attrs)
    oracle = None
    if (attrs.get("coordinate_transformation_mode") == "align_corners" and scales is not None
            and any(float(np.float32(s) * np.float32(d)) % 1 for s, d in zip(scales, x.shape))):
        # a scale that does not land on an integer size: align_corners divides by
        # length_resized = scale * length_original (fractional), as the spec's
        # "scale = length_resized / length_original" and the ONNX reference (the backend
        # suite's expected data) have it; onnxruntime uses the integer output length instead
        model = make_model([node], {"x": x}, ["y"], opset=opset, initializers=inits)

        def oracle(feeds):
            from onnx.reference import ReferenceEvaluator

            return ReferenceEvaluator(model).run(None, feeds)
    return run_model([node], {"x": x}, ["y"], opset=opset, initializers=inits, rtol=rtol, atol=atol,
                     oracle=oracle)


CTMS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
SCALE_SETS = [[1, 1, 2, 2], [1, 1, 0.5, 0.5], [1, 1, 1.7, 0.6], [1, 1, 3, 1], [1, 1, 0.8, 2.5]]
SIZE_SETS = [[1, 2, 10, 12], [1, 2, 3, 3], [1, 2, 7, 13], [1, 2, 1, 4]]


@pytest.mark.parametrize("ctm", CTMS)
@pytest.mark.parametrize("nearest_mode", NEAREST_MODES)
@pytest.mark.parametrize("scales", SCALE_SETS)
def test_resize_nearest_scales(ctm, nearest_mode, scales):
    run_resize(rnd(1, 2, 5, 6), 13, scales=scales, mode="nearest", coordinate_transformation_mode=ctm,
               nearest_mode=nearest_mode)


@pytest.mark.parametrize("ctm", CTMS + ["half_pixel_symmetric"])
@pytest.mark.parametrize("nearest_mode", NEAREST_MODES)
@pytest.mark.parametrize("sizes", SIZE_SETS)
def test_resize_nearest_sizes(ctm, nearest_mode, sizes):
    if ctm == "tf_half_pixel_for_nn":
        opset = 13
    else:
        opset = 19
    run_resize(rnd(1, 2, 5, 6), opset, sizes=sizes, mode="nearest", coordinate_transformation_mode=ctm,
               nearest_mode=nearest_mode)


@pytest.mark.parametrize("ctm", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                                 "half_pixel_symmetric"])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("scales", SCALE_SETS)
def test_resize_interp_scales(ctm, mode, scales):
    run_resize(rnd(2, 3, 5, 6), 19, scales=scales, mode=mode, coordinate_transformation_mode=ctm)


@pytest.mark.parametrize("ctm", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("sizes", SIZE_SETS)
@pytest.mark.parametrize("exclude_outside", [0, 1])
def test_resize_interp_sizes(ctm, mode, sizes, exclude_outside):
    if mode == "linear" and exclude_outside:
        pytest.skip("onnxruntime rejects exclude_outside with linear (a no-op there)")
    run_resize(rnd(1, 2, 5, 6), 13, sizes=sizes, mode=mode, coordinate_transformation_mode=ctm,
               exclude_outside=exclude_outside, cubic_coeff_a=-0.5)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("scales", [[1, 1, 0.5, 0.5], [1, 1, 0.3, 0.7], [1, 1, 0.6, 1.8], [1, 1, 2, 2]])
@pytest.mark.parametrize("exclude_outside", [0, 1])
@pytest.mark.parametrize("ctm", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
def test_resize_antialias(mode, scales, exclude_outside, ctm):
    run_resize(rnd(1, 2, 10, 12), 18, scales=scales, mode=mode, antialias=1, exclude_outside=exclude_outside,
               coordinate_transformation_mode=ctm)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("roi", [[0, 0, 0.2, 0.1, 1, 1, 0.8, 0.9], [0, 0, -0.2, 0.3, 1, 1, 1.3, 0.7]])
@pytest.mark.parametrize("target", [("sizes", [1, 2, 7, 5]), ("scales", [1, 1, 1.5, 0.8])])
@pytest.mark.parametrize("extrapolation_value", [0.0, -3.5])
def test_resize_tf_crop_and_resize(mode, roi, target, extrapolation_value):
    kw = {target[0]: target[1]}
    run_resize(rnd(1, 2, 5, 6), 13, roi=roi, mode=mode, coordinate_transformation_mode="tf_crop_and_resize",
               extrapolation_value=extrapolation_value, **kw)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
@pytest.mark.parametrize("axes,sizes", [(None, [1, 2, 10, 7]), ([2, 3], [10, 7]), ([3, 2], [7, 10]), ([3], [9])])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_axes_keep_aspect_ratio(policy, axes, sizes, mode):
    kw = {"axes": axes} if axes else {}
    run_resize(rnd(1, 2, 5, 6), 18, sizes=sizes, mode=mode, keep_aspect_ratio_policy=policy, **kw)


@pytest.mark.parametrize("policy", ["stretch", "not_larger"])
def test_resize_negative_axes(policy):
    # onnxruntime mishandles negative axes: the same resize with the axes normalised is the oracle
    x = rnd(1, 2, 5, 6)
    sizes = np.array([9, 4], np.int64)

    def oracle(feeds):
        node = resize_node(18, sizes=True, mode="linear", axes=[3, 2], keep_aspect_ratio_policy=policy)
        return run_oracle(make_model([node], {"x": x}, ["y"], opset=18, initializers={"sizes": sizes}), feeds)

    node = resize_node(18, sizes=True, mode="linear", axes=[-1, -2], keep_aspect_ratio_policy=policy)
    run_model([node], {"x": x}, ["y"], opset=18, initializers={"sizes": sizes}, oracle=oracle)


@pytest.mark.parametrize("axes,scales", [([2, 3], [2.0, 0.5]), ([3], [1.5]), ([0, 2], [2.0, 3.0])])
def test_resize_axes_scales(axes, scales):
    run_resize(rnd(1, 2, 5, 6), 19, scales=scales, axes=axes, mode="nearest")
    if 0 not in axes:
        run_resize(rnd(1, 2, 5, 6), 19, scales=scales, axes=axes, mode="linear")


@pytest.mark.parametrize("opset", [10, 11, 13, 18, 19])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 2, 3], [1, 1, 0.5, 0.6], [1, 1, 1.5, 2.5]])
def test_resize_opsets(opset, mode, scales):
    run_resize(rnd(1, 2, 4, 5), opset, scales=scales, mode=mode)


@pytest.mark.parametrize("shape,scales", [((6,), [2.5]), ((4, 5), [0.5, 2]), ((2, 4, 5), [1, 2, 0.5]),
                                          ((1, 2, 3, 4, 5), [1, 1, 2, 0.5, 1.5])])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_ranks(shape, scales, mode):
    run_resize(rnd(*shape), 13, scales=scales, mode=mode)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.int64, np.uint8, np.int8])
def test_resize_nearest_dtypes(dtype):
    x = RNG.integers(0, 100, (1, 2, 4, 5)).astype(dtype)
    run_resize(x, 13, scales=[1, 1, 1.5, 0.6], mode="nearest")


def _nearest_gather_oracle(x, scales):
    """onnxruntime on the element indices (int32), mapped back to x: for types it lacks."""
    idx = np.arange(x.size, dtype=np.int32).reshape(x.shape)
    node = resize_node(13, scales=True, mode="nearest")
    model = make_model([node], {"x": idx}, ["y"], opset=13, initializers={"scales": np.asarray(scales, np.float32)})
    return x.reshape(-1)[run_oracle(model, {"x": idx})[0]]


@pytest.mark.parametrize("x", [RNG.integers(0, 2, (1, 2, 4, 5)).astype(bool),
                               np.array([["a", "bb", ""], ["ccc", "d", "e"]], dtype=object)])
def test_resize_nearest_bool_strings(x):
    scales = [1, 1, 1.5, 0.6] if x.ndim == 4 else [2.0, 1.5]
    node = resize_node(13, scales=True, mode="nearest")
    model = make_model([node], {"x": x}, ["y"], opset=13, initializers={"scales": np.asarray(scales, np.float32)})
    (y,), _ = run_ours(model, {"x": x})
    assert y.dtype == x.dtype
    assert y.tolist() == _nearest_gather_oracle(x, scales).tolist()


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_interp_dtypes(dtype, mode):
    t = tol(dtype) if dtype == np.float16 else F32
    run_resize(rnd(1, 2, 4, 5, dtype=dtype), 13, scales=[1, 1, 2, 1.5], mode=mode, **t)


def test_resize_sizes_from_graph_input():
    # sizes computed at run time (not a constant)
    x = rnd(1, 1, 4, 4)
    node = helper.make_node("Resize", ["x", "", "", "sz"], ["y"], mode="linear")
    run_model([node], {"x": x, "sz": np.array([1, 1, 7, 3], np.int64)}, ["y"], opset=13)


def test_resize_linear_int_declined():
    node = resize_node(13, scales=True, mode="linear")
    expect_declined([node], {"x": np.zeros((1, 1, 2, 2), np.int32)}, ["y"], 13,
                    {"scales": np.array([1, 1, 2, 2], np.float32)}, "mode 'linear' on int32 is not implemented")


def test_resize_half_pixel_symmetric_declined_before_19():
    node = resize_node(18, scales=True, mode="linear", coordinate_transformation_mode="half_pixel_symmetric")
    model = make_model([node], {"x": rnd(1, 1, 2, 2)}, ["y"], opset=18,
                       initializers={"scales": np.array([1, 1, 2, 2], np.float32)})
    with pytest.raises(PartitionError) as ei:
        rt.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert "half_pixel_symmetric" in str(ei.value)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 2, 2], [1, 1, 3, 1.5], [1, 1, 1, 2]])
@pytest.mark.parametrize("opset", [7, 9])
def test_upsample(mode, scales, opset):
    x = rnd(1, 2, 3, 4)
    if opset == 7:
        check_node("Upsample", {"x": x}, opset=7, mode=mode, scales=[float(v) for v in scales], **F32)
    else:
        check_node("Upsample", {"x": x}, initializers={"s": np.array(scales, np.float32)}, opset=9, mode=mode, **F32)


def test_upsample_int_nearest():
    x = RNG.integers(0, 9, (1, 1, 2, 3)).astype(np.int32)
    check_node("Upsample", {"x": x}, initializers={"s": np.array([1, 1, 2, 3], np.float32)}, opset=9)
