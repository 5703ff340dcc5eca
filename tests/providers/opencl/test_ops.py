"""The ops added for issue 4 (pooling, normalization, reductions, indexing, Cast, float16)
against onnxruntime, one node per model, every node on OpenCL (rtol = atol = 1e-3)."""

from __future__ import annotations

import numpy as np
import pytest

from opencl_helpers import check_node, requires_pocl

pytestmark = requires_pocl

rng = np.random.default_rng(11)


def rand(*shape, lo=-2.0, hi=2.0, dtype=np.float32):
    return rng.uniform(lo, hi, size=shape).astype(dtype)


# -- pooling --------------------------------------------------------------------------

POOLS = [
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    dict(kernel_shape=[2, 2], strides=[2, 2]),
    dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    dict(kernel_shape=[3, 2], strides=[1, 2], pads=[0, 1, 2, 0], ceil_mode=1),
    dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER", strides=[2, 2]),
    dict(kernel_shape=[2, 3], auto_pad="SAME_LOWER"),
]


@pytest.mark.parametrize("attrs", POOLS, ids=[str(i) for i in range(len(POOLS))])
def test_maxpool(attrs):
    check_node("MaxPool", {"x": rand(2, 3, 9, 8)}, opset=12, **attrs)


def test_maxpool_dilations_and_1d():
    check_node("MaxPool", {"x": rand(2, 3, 11, 10)}, opset=12, kernel_shape=[2, 2], dilations=[2, 3])
    check_node("MaxPool", {"x": rand(2, 3, 17)}, opset=12, kernel_shape=[3], strides=[2], pads=[1, 1])


@pytest.mark.parametrize("include", [0, 1])
@pytest.mark.parametrize("attrs", POOLS, ids=[str(i) for i in range(len(POOLS))])
def test_averagepool(attrs, include):
    check_node("AveragePool", {"x": rand(2, 3, 9, 8)}, opset=19, count_include_pad=include, **attrs)


@pytest.mark.parametrize("op_type", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pools(op_type):
    check_node(op_type, {"x": rand(2, 5, 7, 6)})
    check_node(op_type, {"x": rand(3, 4, 9)})


# -- normalization --------------------------------------------------------------------

@pytest.mark.parametrize("opset", [9, 15])
def test_batchnorm(opset):
    c = 6
    inits = {"s": rand(c), "b": rand(c), "m": rand(c), "v": rand(c, lo=0.1, hi=2.0)}
    check_node("BatchNormalization", {"x": rand(2, c, 5, 4)}, initializers=inits, opset=opset, epsilon=1e-3)
    check_node("BatchNormalization", {"x": rand(3, c)}, initializers=inits, opset=opset)


# -- reductions -----------------------------------------------------------------------

REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
          "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("op_type", REDUCE)
def test_reductions_axes_attribute(op_type, keepdims):
    lo = 0.5 if op_type in ("ReduceLogSum", "ReduceProd") else -2.0
    x = rand(3, 4, 5, lo=lo, hi=1.5)
    check_node(op_type, {"x": x}, opset=13 if op_type != "ReduceSum" else 11, axes=[0, 2], keepdims=keepdims)
    check_node(op_type, {"x": x}, opset=13 if op_type != "ReduceSum" else 11, keepdims=keepdims)


@pytest.mark.parametrize("op_type", REDUCE)
def test_reductions_axes_input(op_type):
    lo = 0.5 if op_type in ("ReduceLogSum", "ReduceProd") else -2.0
    x = rand(2, 3, 4, lo=lo, hi=1.5)
    opset = 13 if op_type == "ReduceSum" else 18
    check_node(op_type, {"x": x}, initializers={"axes": np.array([-1], np.int64)}, opset=opset, keepdims=1)
    check_node(op_type, {"x": x}, initializers={"axes": np.array([], np.int64)}, opset=opset, keepdims=0,
               noop_with_empty_axes=1)


# -- indexing and layout --------------------------------------------------------------

@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([1, 0], [3, 10], [0, 2], [1, 2]),
    ([-1], [-100], [1], [-1]),
    ([4, 2], [0, 100], [2, 1], [-2, 1]),
    ([0], [2], None, None),
])
def test_slice(starts, ends, axes, steps):
    inits = {"starts": np.array(starts, np.int64), "ends": np.array(ends, np.int64)}
    names = ["x", "starts", "ends"]
    if axes is not None:
        inits["axes"] = np.array(axes, np.int64)
        names.append("axes")
    if steps is not None:
        inits["steps"] = np.array(steps, np.int64)
        names.append("steps")
    check_node("Slice", {"x": rand(4, 5, 6)}, initializers=inits, node_inputs=names, opset=13)


@pytest.mark.parametrize("axis,indices", [(0, [2, 0, -1]), (1, [[0, 3], [-2, 1]]), (2, 1), (-1, [5, 0])])
def test_gather(axis, indices):
    check_node("Gather", {"x": rand(3, 4, 6)}, initializers={"i": np.array(indices, np.int64)}, axis=axis)


def test_gather_indices_from_a_feed():
    emb = rand(20, 8)
    check_node("Gather", {"ids": np.array([[1, 5, 19], [0, -1, 7]], np.int64)}, initializers={"emb": emb},
               node_inputs=["emb", "ids"], axis=0)


@pytest.mark.parametrize("x_shape,target", [((3, 1), (2, 3, 4)), ((1, 4), (3, 1)), ((2, 1, 3), (2, 5, 3))])
def test_expand(x_shape, target):
    check_node("Expand", {"x": rand(*x_shape)}, initializers={"s": np.array(target, np.int64)})


@pytest.mark.parametrize("opset,kwargs,n_out", [
    (13, {"axis": 1}, 2),
    (13, {"axis": 0, "split": [1, 3]}, 2),
    (18, {"axis": 2, "num_outputs": 3}, 3),
])
def test_split(opset, kwargs, n_out):
    inits = {}
    names = ["x"]
    attrs = dict(kwargs)
    if "split" in attrs:
        inits["split"] = np.array(attrs.pop("split"), np.int64)
        names.append("split")
    outs = [f"y{i}" for i in range(n_out)]
    check_node("Split", {"x": rand(4, 6, 7)}, initializers=inits, node_inputs=names, outputs=outs,
               opset=opset, **attrs)


# every claimed pair: each kernel must write the output's element size (int64 -> bool once wrote
# four bytes per one-byte element, past the buffer: the heap corruption of a BERT mask)
CASTS = [(a, b) for a in (np.float32, np.float16, np.bool_, np.int64, np.int32)
         for b in (np.float32, np.float16, np.bool_)]


@pytest.mark.parametrize("shape", [(3, 7), (37, 129)])
@pytest.mark.parametrize("src,dst", CASTS, ids=[f"{np.dtype(a).name}-{np.dtype(b).name}" for a, b in CASTS])
def test_cast(src, dst, shape):
    from onnx import helper

    if np.dtype(src) == np.bool_:
        x = rng.integers(0, 2, shape).astype(bool)
    elif np.dtype(src).kind == "i":
        x = rng.integers(-3, 3, shape).astype(src) * rng.integers(1, 1000, shape).astype(src)  # zeros included
    else:
        x = rand(*shape, lo=-70000.0, hi=70000.0).astype(src)
        x[0, :3] = [0.0, -0.0, 1.5]
    check_node("Cast", {"x": x}, to=helper.np_dtype_to_tensor_dtype(np.dtype(dst)))


# -- more elementwise -----------------------------------------------------------------

@pytest.mark.parametrize("op_type,attrs,bounds", [
    ("Reciprocal", {}, (0.5, 3.0)), ("Floor", {}, None), ("Ceil", {}, None), ("Round", {}, None),
    ("Sin", {}, None), ("Cos", {}, None), ("Softsign", {}, None), ("Softplus", {}, None), ("Sign", {}, None),
    ("Elu", {"alpha": 0.7}, None), ("Selu", {"alpha": 1.5, "gamma": 1.1}, None),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, None),
])
def test_more_unary(op_type, attrs, bounds):
    lo, hi = bounds or (-3.0, 3.0)
    x = rand(4, 9, lo=lo, hi=hi)
    if op_type == "Round":
        x[0, :4] = [0.5, 1.5, -2.5, 2.5]
    check_node(op_type, {"x": x}, **attrs)


@pytest.mark.parametrize("op_type", ["Max", "Min", "PRelu"])
def test_binary_extra(op_type):
    check_node(op_type, {"a": rand(2, 3, 4), "b": rand(3, 4)} if op_type != "PRelu"
               else {"a": rand(2, 3, 4), "b": rand(3, 1)})


def test_logic():
    a = rng.integers(0, 2, (3, 4)).astype(bool)
    b = rng.integers(0, 2, (4,)).astype(bool)
    for op_type in ("And", "Or", "Xor"):
        check_node(op_type, {"a": a, "b": b})
    check_node("Not", {"a": a})


# -- float16 --------------------------------------------------------------------------

def _fp16_device():
    from runtime_provider_opencl.plugin import OpenCLExecutionProvider

    from opencl_helpers import OPTIONS

    return OpenCLExecutionProvider(dict(OPTIONS)).dev.fp16


@pytest.mark.parametrize("op_type,inputs,attrs", [
    ("Add", {"a": rand(3, 4, dtype=np.float16), "b": rand(4, dtype=np.float16)}, {}),
    ("Tanh", {"a": rand(3, 4, dtype=np.float16)}, {}),
    ("MatMul", {"a": rand(2, 5, 8, dtype=np.float16), "b": rand(8, 3, dtype=np.float16)}, {}),
    ("Softmax", {"a": rand(3, 10, dtype=np.float16)}, {"axis": -1}),
    ("ReduceMean", {"a": rand(3, 10, dtype=np.float16)}, {"axes": [1]}),
    ("Transpose", {"a": rand(3, 10, 2, dtype=np.float16)}, {"perm": [2, 0, 1]}),
])
def test_float16(op_type, inputs, attrs):
    if not _fp16_device():
        pytest.skip("the OpenCL device lacks cl_khr_fp16")
    ours, _ = check_node(op_type, inputs, rtol=2e-3, atol=2e-3, **attrs)
    assert ours[0].dtype == np.float16


def test_gather_out_of_range_index_raises_like_the_cpu_provider():
    from onnx import helper

    import runtime_core as rt
    from oracle import make_model

    from opencl_helpers import placement, session

    node = helper.make_node("Gather", ["emb", "ids"], ["y"], name="n", axis=0)
    ids = np.array([1, 2], np.int64)
    model = make_model([node], {"ids": ids}, ["y"], initializers={"emb": rand(4, 3)})
    sess = session(model)
    assert placement(sess) == {"n": "OpenCLExecutionProvider"}
    sess.run(None, {"ids": ids})
    with pytest.raises(rt.errors.RuntimeCoreError, match="out of bounds"):
        sess.run(None, {"ids": np.array([1, 4], np.int64)})


@pytest.mark.parametrize("op_type", ["Sum", "Mean", "Max", "Min"])
def test_variadic(op_type):
    check_node(op_type, {"a": rand(2, 3, 4), "b": rand(3, 1), "c": rand(4)})
    check_node(op_type, {"a": rand(3, 4)})


def test_constant_of_shape_from_a_fed_shape():
    from onnx import numpy_helper

    value = numpy_helper.from_array(np.array([1.5], np.float32))
    check_node("ConstantOfShape", {"s": np.array([2, 3], np.int64)}, opset=21, value=value)


def test_castlike_and_inference_dropout():
    check_node("CastLike", {"x": rand(3, 4), "like": rand(1).astype(np.float16)}, opset=21)
    check_node("Dropout", {"x": rand(3, 4)}, initializers={"r": np.array(0.3, np.float32),
                                                           "t": np.array(False)}, opset=13)


@pytest.mark.parametrize("scale_shape", [(8,), (1,)])
def test_rms_normalization(scale_shape):
    check_node("RMSNormalization", {"x": rand(3, 4, 8)}, initializers={"s": rand(*scale_shape)}, opset=23,
               axis=-1, epsilon=1e-5)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [[1, 2, 0, 3, 1, 2], [0, -1, 2, 1, 2, -2], [3, 0, 1, 2, 4, 0]])
def test_pad(mode, pads):
    inits = {"p": np.array(pads, np.int64)}
    names = ["x", "p"]
    if mode == "constant":
        inits["v"] = np.array(0.75, np.float32)
        names.append("v")
    check_node("Pad", {"x": rand(3, 4, 5)}, initializers=inits, node_inputs=names, opset=19, mode=mode)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 1, -2, 10])
def test_trilu(upper, k):
    inits, names = {}, ["x"]
    if k is not None:
        inits["k"] = np.array(k, np.int64)
        names.append("k")
    check_node("Trilu", {"x": rand(2, 4, 5)}, initializers=inits, node_inputs=names, upper=upper)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, -1])
def test_cumsum(exclusive, reverse, axis):
    check_node("CumSum", {"x": rand(3, 4, 5)}, initializers={"a": np.array(axis, np.int32)},
               node_inputs=["x", "a"], exclusive=exclusive, reverse=reverse)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(axis):
    x = rand(3, 4, 5)
    idx_shape = [2, 3, 4]
    L = x.shape[axis]
    idx = rng.integers(-L, L, idx_shape).astype(np.int64)
    check_node("GatherElements", {"x": x}, initializers={"i": idx}, axis=axis)
