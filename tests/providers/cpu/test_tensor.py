"""Tensor and shape kernels against onnxruntime, across opsets and dtypes."""

import numpy as np
import pytest
from onnx import helper

import runtime_core as rt
from oracle import check_node, make_model
from runtime_core.errors import PartitionError

rng = np.random.default_rng(11)
DTYPES = [np.float32, np.float64, np.int64, np.int32, np.bool_]


def arr(*shape, dtype=np.float32):
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    return (rng.standard_normal(shape) * 5).astype(dtype)


I64 = lambda *v: np.array(v, np.int64)  # noqa: E731


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("opset", [13, 17, 21])
def test_reshape_transpose_flatten(dtype, opset):
    x = arr(2, 3, 4, dtype=dtype)
    check_node("Reshape", {"x": x}, initializers={"s": I64(0, -1)}, opset=opset)
    check_node("Reshape", {"x": x}, initializers={"s": I64(4, 6)}, opset=opset)
    check_node("Transpose", {"x": x}, perm=[2, 0, 1], opset=opset)
    check_node("Transpose", {"x": x}, opset=opset)
    check_node("Flatten", {"x": x}, axis=2, opset=opset)
    check_node("Flatten", {"x": x}, axis=-1, opset=opset)


@pytest.mark.parametrize("opset", [11, 13, 21])
def test_squeeze_unsqueeze(opset):
    x = arr(1, 3, 1, 4)
    if opset < 13:
        check_node("Squeeze", {"x": x}, axes=[0, -2], opset=opset)
        check_node("Unsqueeze", {"x": x}, axes=[0, 5], opset=opset)
    else:
        check_node("Squeeze", {"x": x}, initializers={"a": I64(0, -2)}, opset=opset)
        check_node("Unsqueeze", {"x": x}, initializers={"a": I64(0, 5)}, opset=opset)
    check_node("Squeeze", {"x": x}, opset=opset)


@pytest.mark.parametrize("opset", [11, 13])
def test_concat_split(opset):
    a, b = arr(2, 3), arr(2, 5)
    check_node("Concat", {"a": a, "b": b}, axis=-1, opset=opset)
    x = arr(6, 4)
    check_node("Split", {"x": x}, ("p", "q", "r"), axis=0, opset=opset)
    if opset >= 13:
        check_node("Split", {"x": x}, ("p", "q"), initializers={"s": I64(2, 4)}, axis=0, opset=opset)
    else:
        check_node("Split", {"x": x}, ("p", "q"), split=[1, 3], axis=1, opset=opset)


def test_split_num_outputs():
    check_node("Split", {"x": arr(7, 2)}, ("p", "q", "r"), axis=0, num_outputs=3, opset=18)


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([0], [2], [0], [1]), ([1, -3], [1000, -1], [0, 1], [1, 1]), ([-1], [-1000], [1], [-1]),
    ([0, 0], [3, 10], None, None), ([3], [0], [0], [-2]), ([0], [9223372036854775807], [1], [2]),
])
def test_slice(starts, ends, axes, steps):
    x = arr(4, 6)
    inits = {"s": I64(*starts), "e": I64(*ends)}
    if axes is not None:
        inits["a"] = I64(*axes)
    if steps is not None:
        inits["st"] = I64(*steps)
    check_node("Slice", {"x": x}, initializers=inits, opset=13)


def test_slice_v1():
    check_node("Slice", {"x": arr(4, 6)}, starts=[1, 0], ends=[3, -1], axes=[0, 1], opset=9)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gathers(axis):
    x = arr(4, 5, 3)
    idx = np.array([[0, -1], [2, 1]], np.int64)
    check_node("Gather", {"x": x}, initializers={"i": idx}, axis=axis, opset=13)
    gi = rng.integers(-3, 3, (4, 5, 3)).astype(np.int64)
    check_node("GatherElements", {"x": x}, initializers={"i": gi}, axis=axis, opset=13)


@pytest.mark.parametrize("axis,index", [(0, 2), (1, -1), (-1, 0), (2, -3)])
def test_gather_scalar_index(axis, index):
    # one index: the kernel returns a view of x; the oracle says what the copy would hold
    check_node("Gather", {"x": arr(4, 5, 3)}, initializers={"i": np.array(index, np.int64)}, axis=axis, opset=13)
    check_node("Gather", {"x": arr(6)}, initializers={"i": np.array(index, np.int64)}, axis=0, opset=13)


def test_gather_views_leave_their_source_alone():
    # q/k/v picked out of one packed tensor, each then changed by ops that may run in place:
    # a view written through would corrupt the source the other Gathers (and Add) still read
    x = arr(3, 4, 5)
    nodes = [helper.make_node("Mul", ["x", "two"], ["p"])]
    for i in range(3):
        nodes += [helper.make_node("Gather", ["p", f"i{i}"], [f"g{i}"], axis=0),
                  helper.make_node("Relu", [f"g{i}"], [f"r{i}"]),
                  helper.make_node("Neg", [f"r{i}"], [f"y{i}"])]
    nodes.append(helper.make_node("Add", ["p", "p"], ["s"]))
    inits = {"two": np.array(2.0, np.float32), **{f"i{i}": np.array(i, np.int64) for i in range(3)}}
    model = make_model(nodes, {"x": x}, ["y0", "y1", "y2", "s"], opset=13, initializers=inits)
    sess = rt.InferenceSession(model.SerializeToString())
    x0 = x.copy()
    for _ in range(2):
        y0, y1, y2, s = sess.run(None, {"x": x})
        for i, y in enumerate((y0, y1, y2)):
            np.testing.assert_array_equal(y, -np.maximum(2 * x0[i], 0))
        np.testing.assert_array_equal(s, 4 * x0)
    np.testing.assert_array_equal(x, x0)


def test_gather_nd_and_scatter():
    x = arr(2, 3, 4)
    check_node("GatherND", {"x": x}, initializers={"i": np.array([[0, 1], [1, 2]], np.int64)}, opset=13)
    check_node("GatherND", {"x": x}, initializers={"i": np.array([[1], [2]], np.int64)}, batch_dims=1, opset=13)
    upd = arr(2, 4)
    check_node("ScatterND", {"x": x}, initializers={"i": np.array([[0, 1], [1, 2]], np.int64), "u": upd}, opset=13)
    check_node("ScatterND", {"x": x}, initializers={"i": np.array([[0, 1], [0, 1]], np.int64), "u": upd},
               reduction="add", opset=16)
    idx = np.array([[[0], [2]]], np.int64).repeat(2, 0).repeat(4, 2)[:, :, :1]
    check_node("ScatterElements", {"x": x}, initializers={"i": idx, "u": arr(*idx.shape)}, axis=1, opset=13)
    check_node("ScatterElements", {"x": x}, initializers={"i": idx, "u": arr(*idx.shape)}, axis=1,
               reduction="mul", opset=18)


def test_expand_tile_range_constantofshape():
    check_node("Expand", {"x": arr(3, 1)}, initializers={"s": I64(2, 1, 4)}, opset=13)
    check_node("Tile", {"x": arr(2, 3)}, initializers={"r": I64(2, 3)}, opset=13)
    for dt in (np.float32, np.int64, np.int32):
        check_node("Range", {}, initializers={"a": np.array(1, dt), "b": np.array(10, dt), "c": np.array(3, dt)},
                   opset=11)
    check_node("ConstantOfShape", {}, initializers={"s": I64(2, 3)}, opset=20,
               value=helper.make_tensor("v", 7, [1], [5]))
    check_node("Shape", {"x": arr(2, 3, 4)}, opset=15, start=1, end=-1)
    check_node("Size", {"x": arr(2, 3, 4)}, opset=13)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad(mode):
    x = arr(3, 4)
    check_node("Pad", {"x": x}, initializers={"p": I64(1, 2, 2, 1), "v": np.array(1.5, np.float32)},
               mode=mode, opset=19)
    check_node("Pad", {"x": x}, initializers={"p": I64(1, -1, 0, 2)}, mode="constant", opset=13)
    if mode != "wrap":
        check_node("Pad", {"x": x}, pads=[0, 1, 1, 0], mode=mode, opset=2)


def test_trilu_topk_nonzero_onehot_where():
    x = arr(4, 5)
    check_node("Trilu", {"x": x}, upper=0, opset=14)
    check_node("Trilu", {"x": x}, initializers={"k": np.array(1, np.int64)}, upper=1, opset=14)
    ties = np.round(arr(3, 6) / 5)
    check_node("TopK", {"x": ties}, ("v", "i"), initializers={"k": I64(3)}, axis=1, opset=11)
    check_node("TopK", {"x": ties}, ("v", "i"), initializers={"k": I64(2)}, axis=0, largest=0, opset=11)
    check_node("NonZero", {"x": (x > 0)}, opset=13)
    check_node("OneHot", {"i": np.array([0, 2, -1], np.int64)},
               initializers={"d": np.array(4, np.int64), "v": np.array([0, 7], np.float32)}, axis=-1, opset=11)


def test_constant_and_strings_moving_through():
    s = np.array([["a", "bb", "c"], ["d", "e", "ffff"]], dtype=object)
    check_node("Transpose", {"x": s}, opset=13)
    check_node("Reshape", {"x": s}, initializers={"s": I64(3, 2)}, opset=13)
    check_node("Gather", {"x": s}, initializers={"i": I64(1, 0)}, axis=1, opset=13)
    so = rt.SessionOptions()
    so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    node = helper.make_node("Constant", [], ["y"], value_floats=[1.0, 2.5])
    m = make_model([node], {}, ["y"], opset=13)
    out = rt.InferenceSession(m.SerializeToString(), so).run(None, {})[0]
    assert out.dtype == np.float32 and out.tolist() == [1.0, 2.5]


def test_misc_layout_ops():
    x = arr(1, 8, 2, 3)
    for mode in ("DCR", "CRD"):
        check_node("DepthToSpace", {"x": x}, blocksize=2, mode=mode, opset=13)
    check_node("SpaceToDepth", {"x": arr(1, 2, 4, 6)}, blocksize=2, opset=13)
    check_node("EyeLike", {"x": arr(3, 4)}, k=1, opset=9)
    check_node("Compress", {"x": arr(3, 4)}, initializers={"c": np.array([1, 0, 1], bool)}, axis=0, opset=11)
    check_node("Einsum", {"a": arr(2, 3, 4), "b": arr(2, 4, 5)}, equation="bij,bjk->bik", opset=12, rtol=1e-5)
    check_node("ReverseSequence", {"x": arr(4, 3, 2)}, initializers={"l": I64(4, 2, 1)},
               batch_axis=1, time_axis=0, opset=10)
    check_node("Unique", {"x": np.array([2, 1, 1, 3, 4, 3], np.float32)}, ("y", "i", "inv", "c"), sorted=1, opset=11)


def test_undeclared_version_is_declined_with_reason():
    # Split-1 without axis: the version-1 schema gives no default axis: declined, not guessed
    node = helper.make_node("Split", ["a"], ["y", "z"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", 1, [4])],
                          [helper.make_tensor_value_info(n, 1, [2]) for n in ("y", "z")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 1)])
    m.ir_version = 3
    with pytest.raises(PartitionError, match=r"Split-1 without an axis"):
        rt.InferenceSession(m.SerializeToString())
