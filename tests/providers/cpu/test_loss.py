"""CPU provider loss and extra nn kernels (ops/loss.py, sampling.py, roi.py, unfold.py, crop.py,
norm.py, detection.py) against onnxruntime.

The ONNX backend suite covers the documented examples; these add dtypes, shapes and
attribute combinations it does not (onnx's reference evaluator answers where onnxruntime
lacks the op or type, see ``oracle.run_oracle``).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from oracle import assert_close, check_node, make_model, run_oracle, run_ours

RNG = np.random.default_rng(20261203)
F32 = dict(rtol=1e-4, atol=1e-5)


def rnd(*shape, dtype=np.float32, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


# ------------------------------------------------------------------------------ losses

@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("shape", [(5, 4), (3, 4, 6), (2, 3, 2, 5)])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("tdtype", [np.int64, np.int32])
def test_losses(op, reduction, shape, weighted, tdtype):
    C = shape[1]
    target = RNG.integers(0, C, (shape[0],) + shape[2:]).astype(tdtype)
    target.reshape(-1)[::3] = 1  # some hits of ignore_index
    inputs = {"x": rnd(*shape), "t": target}
    if weighted:
        inputs["w"] = np.abs(rnd(C)) + 0.1
    check_node(op, inputs, ("y",), opset=13, reduction=reduction, ignore_index=1, **F32)


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_sce_log_prob_output_and_dtypes(dtype):
    tol = F32 if dtype == np.float64 else dict(rtol=1e-2, atol=1e-2)
    inputs = {"x": rnd(4, 5, 3, dtype=dtype), "t": RNG.integers(0, 5, (4, 3)).astype(np.int64)}
    check_node("SoftmaxCrossEntropyLoss", inputs, ("y", "lp"), opset=13, reduction="mean", **tol)


def test_nll_target_out_of_range_raises():
    model = make_model([helper.make_node("NegativeLogLikelihoodLoss", ["x", "t"], ["y"])],
                       {"x": rnd(2, 3), "t": np.array([0, 3], np.int64)}, ["y"], opset=13)
    with pytest.raises(Exception, match="out of range"):
        run_ours(model, {"x": rnd(2, 3), "t": np.array([0, 3], np.int64)})


# ------------------------------------------------------------------------------ GridSample / AffineGrid

@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_gridsample_2d(mode, padding_mode, align_corners):
    x = rnd(2, 3, 5, 6)
    grid = RNG.uniform(-1.4, 1.4, (2, 4, 7, 2)).astype(np.float32)
    check_node("GridSample", {"x": x, "g": grid}, opset=20, mode=mode, padding_mode=padding_mode,
               align_corners=align_corners, **F32)


@pytest.mark.parametrize("mode", ["linear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_gridsample_3d_float64(mode, padding_mode):
    x = rnd(1, 2, 3, 4, 5, dtype=np.float64)
    grid = RNG.uniform(-1.3, 1.3, (1, 2, 3, 4, 3))
    check_node("GridSample", {"x": x, "g": grid}, opset=20, mode=mode, padding_mode=padding_mode,
               rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("align_corners", [0, 1])
@pytest.mark.parametrize("size", [[2, 3, 4, 5], [2, 3, 3, 4, 5]])
def test_affine_grid(align_corners, size):
    nd = len(size) - 2
    theta = rnd(2, nd, nd + 1)
    check_node("AffineGrid", {"theta": theta}, opset=20, initializers={"size": np.array(size, np.int64)},
               align_corners=align_corners, **F32)


# ------------------------------------------------------------------------------ RoiAlign

@pytest.mark.parametrize("opset,ctm", [(10, None), (16, "half_pixel"), (16, "output_half_pixel")])
@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("sampling_ratio", [0, 2])
def test_roialign(opset, ctm, mode, sampling_ratio):
    x = rnd(2, 3, 10, 12)
    rois = np.array([[0, 0, 9, 9], [1.5, 2.2, 7.7, 8.1], [-2, -1, 4, 3], [3, 3, 30, 20], [5, 5, 5.5, 5.2]],
                    np.float32)
    bi = np.array([0, 1, 1, 0, 1], np.int64)
    attrs = dict(mode=mode, output_height=3, output_width=4, sampling_ratio=sampling_ratio, spatial_scale=0.8)
    if ctm:
        attrs["coordinate_transformation_mode"] = ctm
    check_node("RoiAlign", {"x": x, "rois": rois, "bi": bi}, opset=opset, **attrs, **F32)


# ------------------------------------------------------------------------------ NonMaxSuppression

@pytest.mark.parametrize("center_point_box", [0, 1])
@pytest.mark.parametrize("score_threshold", [None, 0.3])
@pytest.mark.parametrize("max_out", [2, 50])
def test_nms(center_point_box, score_threshold, max_out):
    B, N, C = 2, 30, 3
    xy = RNG.uniform(0, 10, (B, N, 2))
    wh = RNG.uniform(0.5, 4, (B, N, 2))
    if center_point_box:
        boxes = np.concatenate([xy, wh], -1)
    else:
        boxes = np.concatenate([xy[..., ::-1], xy[..., ::-1] + wh[..., ::-1]], -1)
        boxes[0, ::4] = boxes[0, ::4][:, [2, 3, 0, 1]]  # flipped corners
    scores = RNG.uniform(0, 1, (B, C, N)).astype(np.float32)
    scores[0, 0, 5] = scores[0, 0, 6]  # a tie
    inits = {"m": np.array([max_out], np.int64), "iou": np.array([0.4], np.float32)}
    if score_threshold is not None:
        inits["st"] = np.array([score_threshold], np.float32)
    check_node("NonMaxSuppression", {"boxes": boxes.astype(np.float32), "scores": scores}, opset=11,
               initializers=inits, center_point_box=center_point_box)


# ------------------------------------------------------------------------------ DeformConv / Col2Im / MaxUnpool

@pytest.mark.parametrize("group,offset_group", [(1, 1), (2, 1), (1, 2), (2, 2)])
@pytest.mark.parametrize("with_mask", [False, True])
def test_deform_conv(group, offset_group, with_mask):
    x = rnd(2, 4, 7, 8)
    w = rnd(6, 4 // group, 3, 2)
    strides, pads, dil = [2, 1], [1, 0, 1, 1], [1, 2]
    oh = (7 + 2 - 3) // 2 + 1
    ow = (8 + 1 - ((2 - 1) * 2 + 1)) // 1 + 1
    inputs = {"x": x, "w": w, "off": rnd(2, offset_group * 6 * 2, oh, ow, scale=1.5), "b": rnd(6)}
    if with_mask:
        inputs["mask"] = RNG.uniform(0, 1, (2, offset_group * 6, oh, ow)).astype(np.float32)
    check_node("DeformConv", inputs, opset=19, group=group, offset_group=offset_group, strides=strides,
               pads=pads, dilations=dil, **F32)


@pytest.mark.parametrize("image,block,strides,pads,dil", [
    ([5, 6], [2, 3], [1, 1], [0, 0, 0, 0], [1, 1]),
    ([7, 6], [3, 2], [2, 1], [1, 0, 1, 1], [1, 2]),
    ([4, 5, 6], [2, 2, 3], [1, 2, 1], [0, 1, 0, 1, 0, 1], [1, 1, 1]),
])
def test_col2im(image, block, strides, pads, dil):
    nd = len(image)
    L = 1
    for i in range(nd):
        L *= (image[i] + pads[i] + pads[nd + i] - (dil[i] * (block[i] - 1) + 1)) // strides[i] + 1
    x = rnd(2, 3 * int(np.prod(block)), L)
    check_node("Col2Im", {"x": x}, opset=18,
               initializers={"image": np.array(image, np.int64), "block": np.array(block, np.int64)},
               strides=strides, pads=pads, dilations=dil, **F32)


def test_maxunpool_of_maxpool():
    x = rnd(2, 3, 6, 8)
    nodes = [helper.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("MaxUnpool", ["p", "i"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    model = make_model(nodes, {"x": x}, ["y"], opset=11)
    ours, _ = run_ours(model, {"x": x})
    assert_close(ours, run_oracle(model, {"x": x}))


# ------------------------------------------------------------------------------ small ops

@pytest.mark.parametrize("shape,axes", [([3, 9], [1, 2]), ([7, 2], [-2, -1]), ([4, 4, 5], None)])
def test_center_crop_pad(shape, axes):
    x = rnd(4, 5, 6)
    attrs = {"axes": axes} if axes else {}
    check_node("CenterCropPad", {"x": x}, opset=18, initializers={"s": np.array(shape, np.int64)}, **attrs)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_lp_normalization(p, axis):
    x = rnd(3, 4, 5)
    x[0, :, 0] = 0
    x[:, 0, 0] = 0
    check_node("LpNormalization", {"x": x}, opset=22, p=p, axis=axis, **F32)


@pytest.mark.parametrize("axes", [[0, 2, 3], [1], [2, 3]])
def test_mvn(axes):
    check_node("MeanVarianceNormalization", {"x": rnd(2, 3, 4, 5, scale=3.0) + 1.0}, opset=13, axes=axes,
               **F32)
