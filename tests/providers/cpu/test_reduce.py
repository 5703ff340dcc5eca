"""CPU kernels, reduce family: Reduce*, ArgMax/ArgMin, CumSum, compared with the oracle
(onnxruntime, or onnx.reference where ORT cannot run a case)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import runtime_core as rt
from oracle import assert_close, check_node, make_model, np_to_elem, run_oracle, run_ours
from runtime_core.errors import InvalidModelError

RNG = np.random.default_rng(4321)
F32, F64, F16 = np.float32, np.float64, np.float16

REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


def axes_input_since(op):
    return 13 if op == "ReduceSum" else 18


def rand(shape, dtype, op=""):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return RNG.random(shape) > 0.5
    if dtype.kind in "iu":
        hi = 3 if op in ("ReduceProd", "ReduceSumSquare", "ReduceL2") else 50
        lo = 1 if op == "ReduceLogSum" or dtype.kind == "u" else -hi
        return RNG.integers(lo, hi + 1, size=shape).astype(dtype)
    if op == "ReduceLogSum":
        return RNG.uniform(0.1, 2.0, size=shape).astype(dtype)
    if op == "ReduceProd":
        return RNG.uniform(0.5, 1.5, size=shape).astype(dtype)
    return RNG.uniform(-2.0, 2.0, size=shape).astype(dtype)


def tol(dtype):
    dtype = np.dtype(dtype)
    if dtype == F16:
        return dict(rtol=5e-3, atol=5e-3)
    return dict(rtol=2e-5, atol=2e-5)


def reduce_case(op, x, axes, keepdims, opset, **extra):
    """check_node with ``axes`` as attribute or as a constant input, per the op's version."""
    attrs = dict(extra)
    if keepdims is not None:
        attrs["keepdims"] = keepdims
    inits = None
    if opset >= axes_input_since(op):
        if axes is not None:
            inits = {"axes": np.array(axes, np.int64)}
    elif axes is not None:
        attrs["axes"] = axes
    return check_node(op, {"x": x}, opset=opset, initializers=inits, **tol(x.dtype), **attrs)


AXES = [None, [0], [-1], [0, 2], [1, -1], [2, 0, 1]]


@pytest.mark.parametrize("opset", [11, 13, 18, 20])
@pytest.mark.parametrize("keepdims", [1, 0])
@pytest.mark.parametrize("axes", AXES, ids=[str(a) for a in AXES])
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_float32(op, axes, keepdims, opset):
    reduce_case(op, rand((3, 4, 5), F32, op), axes, keepdims, opset)


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("dtype", [F64, F16, np.int32, np.int64])
@pytest.mark.parametrize("axes", [None, [1], [0, 2]], ids=["all", "1", "0,2"])
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_dtypes(op, dtype, axes, opset):
    reduce_case(op, rand((3, 4, 5), dtype, op), axes, 1, opset)  # rand keeps each op's inputs in its domain


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64, np.int8, np.uint8])
@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_max_min_small_ints(op, dtype):
    reduce_case(op, rand((4, 6), dtype, op), [1], 0, 18)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_max_min_bool_20(op):
    x = rand((4, 6), np.bool_)
    x[0] = True
    x[1] = False
    reduce_case(op, x, [1], 0, 20)
    reduce_case(op, x, None, 1, 20)


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("keepdims", [1, 0])
@pytest.mark.parametrize("axes", [[2, 3], [-1, -2], [1, 2, 3], [3]])
def test_reduce_mean_trailing_axes(axes, keepdims, dtype):
    # squeeze-excite's spatial mean: the trailing axes as rows of one contiguous axis
    # (pool.row_means), planes below and above einsum's 4096-float limit
    for shape in [(2, 5, 7, 7), (1, 3, 70, 65)]:
        reduce_case("ReduceMean", rand(shape, dtype), axes, keepdims, 18)


def test_reduce_mean_int_truncates():
    x = np.array([[-7, 2, 0], [7, 1, 1], [-1, -1, 0]], np.int32)
    reduce_case("ReduceMean", x, [1], 0, 18)
    reduce_case("ReduceMean", x.astype(np.int64), [0], 1, 13)


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_rank0(op, opset):
    reduce_case(op, np.array(1.5 if op != "ReduceLogSum" else 2.5, F32), None, 1, opset)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_empty_set(op):
    """Reducing over an empty axis gives the identity the spec names."""
    if op == "ReduceMean":
        pytest.skip("the mean of an empty set is undefined")
    x = np.zeros((2, 0, 3), F32)
    reduce_case(op, x, [1], 1, 18)
    reduce_case(op, x, [1], 0, 18)
    reduce_case(op, x, [0], 0, 18)  # a non-empty axis of an empty tensor: empty result


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_empty_set_int(op):
    x = np.zeros((2, 0), np.int32)
    ours = run_ours(make_model([helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)], {"x": x}, ["y"],
                               opset=18, initializers={"axes": np.array([1], np.int64)}), {"x": x})[0][0]
    info = np.iinfo(np.int32)
    np.testing.assert_array_equal(ours, np.full((2,), info.min if op == "ReduceMax" else info.max, np.int32))


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_noop_with_empty_axes(op):
    x = rand((3, 4), F32, op)
    opset = axes_input_since(op)
    for noop in (0, 1):
        check_node(op, {"x": x}, opset=opset, noop_with_empty_axes=noop)
        check_node(op, {"x": x}, opset=opset, initializers={"axes": np.zeros((0,), np.int64)},
                   noop_with_empty_axes=noop, keepdims=0)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_opset1_attr(op):
    x = rand((3, 4, 5), F32, op)
    got = run_typed(helper.make_node(op, ["x"], ["y"], axes=[1], keepdims=0), {"x": x}, F32, (3, 5), 1)
    ref = reduce_case(op, x, [1], 0, 11)
    assert_close(got, ref)


def test_reduce_special_values():
    x = np.array([[1.0, np.inf, 2.0], [-np.inf, -np.inf, 1.0], [np.nan, 1.0, 2.0]], F32)
    for op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceLogSumExp", "ReduceL1", "ReduceSumSquare"):
        reduce_case(op, x, [1], 0, 18)
    big = np.array([[1000.0, 1000.0], [-1000.0, 0.0]], F32)
    reduce_case("ReduceLogSumExp", big, [1], 0, 18)


def typed_model(node, inputs, out_dtype, out_shape, opset, initializers=None):
    ins = [helper.make_tensor_value_info(n, np_to_elem(a.dtype), list(a.shape)) for n, a in inputs.items()]
    out = helper.make_tensor_value_info(node.output[0], np_to_elem(np.dtype(out_dtype)), list(out_shape))
    inits = [helper.make_tensor(k, np_to_elem(v.dtype), v.shape, v.reshape(-1).tolist())
             for k, v in (initializers or {}).items()]
    m = helper.make_model(helper.make_graph([node], "g", ins, [out], initializer=inits),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def run_typed(node, inputs, out_dtype, out_shape, opset):
    return run_ours(typed_model(node, inputs, out_dtype, out_shape, opset), dict(inputs))[0]


@pytest.mark.parametrize("axes", [[1], [0, 2], [-1], []], ids=["1", "0,2", "-1", "empty"])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2"])
def test_reduce_axes_at_run_time(op, axes):
    """``axes`` as a graph input: nothing known about it when the session is built."""
    x = rand((3, 4, 5), F32, op)
    ax = np.array(axes, np.int64)
    shape = [1 if (i in axes or i - 3 in axes or not axes) else d for i, d in enumerate(x.shape)]
    model = typed_model(helper.make_node(op, ["x", "axes"], ["y"]), {"x": x, "axes": ax}, F32, shape,
                        axes_input_since(op))
    ours, _ = run_ours(model, {"x": x, "axes": ax})
    assert_close(ours, run_oracle(model, {"x": x, "axes": ax}))


def test_reduce_does_not_modify_input():
    x = rand((3, 4), F32)
    x.setflags(write=False)
    for op in REDUCE_OPS:
        if op != "ReduceLogSum":
            reduce_case(op, x, [1], 1, 18)
    check_node("CumSum", {"x": x}, opset=14, initializers={"axis": np.array(1)}, exclusive=1, reverse=1)


def test_reduce_dtype_outside_the_schema_is_refused_at_load():
    # ReduceLogSum-28 on int32 is an invalid graph: refused at load as onnxruntime does
    x = rand((3, 4), np.int32)
    node = helper.make_node("ReduceLogSum", ["x"], ["y"])
    with pytest.raises(InvalidModelError, match=r"tensor\(int32\).*::ReduceLogSum-28 accepts"):
        rt.InferenceSession(make_model([node], {"x": x}, ["y"], opset=28).SerializeToString(),
                            providers=["CPUExecutionProvider"])


# -- ArgMax / ArgMin ---------------------------------------------------------------------------

@pytest.mark.parametrize("opset", [11, 12, 13])
@pytest.mark.parametrize("keepdims", [1, 0])
@pytest.mark.parametrize("axis", [0, 1, -1, -3])
@pytest.mark.parametrize("dtype", [F32, F64, F16, np.int32, np.int64, np.uint8])
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg(op, dtype, axis, keepdims, opset):
    x = RNG.integers(0, 4, size=(3, 4, 5)).astype(dtype)  # many ties
    attrs = dict(axis=axis, keepdims=keepdims)
    check_node(op, {"x": x}, opset=opset, **attrs)
    if opset >= 12:
        check_node(op, {"x": x}, opset=opset, select_last_index=1, **attrs)


def test_arg_opset1():
    x = RNG.integers(0, 4, size=(3, 4)).astype(F32)
    for op in ("ArgMax", "ArgMin"):
        got = run_typed(helper.make_node(op, ["x"], ["y"], axis=1, keepdims=0), {"x": x}, np.int64, (3,), 1)
        assert_close(got, check_node(op, {"x": x}, opset=11, axis=1, keepdims=0))


# -- CumSum -------------------------------------------------------------------------------------

@pytest.mark.parametrize("opset", [11, 14])
@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [F32, F64, np.int32, np.int64, F16])
def test_cumsum(dtype, axis, exclusive, reverse, opset):
    if dtype == F16 and opset < 14:
        pytest.skip("float16 CumSum from opset 14")
    x = rand((3, 4, 5), dtype)
    check_node("CumSum", {"x": x}, opset=opset, initializers={"axis": np.array(axis, np.int32)},
               exclusive=exclusive, reverse=reverse, **tol(dtype))


def test_cumsum_axis_input_and_1d():
    x = rand((7,), F32)
    check_node("CumSum", {"x": x, "axis": np.array(0, np.int64)}, opset=14)
    check_node("CumSum", {"x": x}, opset=14, initializers={"axis": np.array([-1], np.int64)}, reverse=1)
    check_node("CumSum", {"x": np.zeros((0, 3), F32)}, opset=14, initializers={"axis": np.array(0)}, exclusive=1)
