"""Shape bombs and other hostile inputs end in typed errors: the tensor-size cap
(``session.max_tensor_bytes``, runtime_provider_cpu/limits.py) in the kernels whose output
size comes from input values, huge stride-0 feeds, unknown Constant element types, and
external-data paths the OS refuses to examine."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt
from runtime_core.errors import (
    ExternalDataError,
    InputTooLargeError,
    InvalidArgumentError,
    InvalidModelError,
    OutOfMemoryError,
)

F, I64 = TensorProto.FLOAT, TensorProto.INT64
CPU = ["CPUExecutionProvider"]


def _model(node, inputs, out_rank, opset=18, inits=None, out_type=F):
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info("y", out_type, [f"d{i}" for i in range(out_rank)])],
                          [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


X1 = ("x", F, [1])
X2 = ("x", F, [2, 3])

#: op -> (model, bomb feeds, ordinary feeds)
BOMBS = {
    "Expand": (_model(helper.make_node("Expand", ["x", "s"], ["y"]), [X1, ("s", I64, [2])], 2),
               {"s": np.array([2**20, 2**20])}, {"s": np.array([3, 4])}),
    "ConstantOfShape": (_model(helper.make_node("ConstantOfShape", ["s"], ["y"]), [("s", I64, [1])], 1),
                        {"s": np.array([2**45])}, {"s": np.array([5])}),
    "Tile": (_model(helper.make_node("Tile", ["x", "r"], ["y"]), [X2, ("r", I64, [2])], 2),
             {"r": np.array([2**31, 2**31])}, {"r": np.array([2, 3])}),
    "Range": (_model(helper.make_node("Range", ["a", "b", "d"], ["y"]), [("a", I64, []), ("b", I64, []),
                                                                        ("d", I64, [])], 1, out_type=I64),
              {"a": np.array(0), "b": np.array(2**62), "d": np.array(1)},
              {"a": np.array(1), "b": np.array(9), "d": np.array(3)}),
    "Pad": (_model(helper.make_node("Pad", ["x", "p"], ["y"]), [X2, ("p", I64, [4])], 2),
            {"p": np.array([0, 2**40, 0, 2**40])}, {"p": np.array([1, 0, 2, 1])}),
    "OneHot": (_model(helper.make_node("OneHot", ["i", "depth", "v"], ["y"], axis=-1),
                      [("i", I64, [4]), ("depth", I64, [])], 2, inits={"v": np.array([0, 1], np.float32)}),
               {"i": np.arange(4), "depth": np.array(2**50)}, {"i": np.array([0, 3, -1, 1]), "depth": np.array(4)}),
}


def _feeds(op, extra):
    base = {"x": np.ones([1] if op == "Expand" else [2, 3], np.float32)}
    needed = {i.name for i in onnx.load_from_string(BOMBS[op][0]).graph.input}
    return {k: v for k, v in {**base, **extra}.items() if k in needed}


@pytest.mark.parametrize("op", sorted(BOMBS))
def test_shape_bomb_is_a_typed_out_of_memory_error(op):
    model, bomb, ok = BOMBS[op]
    sess = rt.InferenceSession(model, providers=CPU)
    with pytest.raises(OutOfMemoryError) as info:
        sess.run(None, _feeds(op, bomb))
    assert isinstance(info.value, MemoryError)
    assert op in str(info.value) and "session.max_tensor_bytes" in str(info.value)
    # ordinary sizes still compute, as onnxruntime does, and the session keeps working
    want = ort.InferenceSession(model, providers=CPU).run(None, _feeds(op, ok))[0]
    got = sess.run(None, _feeds(op, ok))[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_session_config_sets_the_cap():
    model = BOMBS["ConstantOfShape"][0]
    feeds = {"s": np.array([1000])}  # 4000 bytes of float32
    so = rt.SessionOptions()
    so.add_session_config_entry("session.max_tensor_bytes", "3999")
    with pytest.raises(OutOfMemoryError, match="3999"):
        rt.InferenceSession(model, so, providers=CPU).run(None, feeds)
    so.add_session_config_entry("session.max_tensor_bytes", "4000")
    assert rt.InferenceSession(model, so, providers=CPU).run(None, feeds)[0].shape == (1000,)
    # a session without the entry is back to the default cap
    assert rt.InferenceSession(model, providers=CPU).run(None, {"s": np.array([10**6])})[0].shape == (10**6,)


def test_each_session_keeps_its_own_cap():
    # the cap is per session: creating a session with another cap changes no other session
    model = BOMBS["ConstantOfShape"][0]
    feeds = {"s": np.array([1000])}  # 4000 bytes of float32
    small = rt.SessionOptions()
    small.add_session_config_entry("session.max_tensor_bytes", "3999")
    tight = rt.InferenceSession(model, small, providers=CPU)
    loose = rt.InferenceSession(model, providers=CPU)  # created after: the default cap
    with pytest.raises(OutOfMemoryError, match="3999"):
        tight.run(None, feeds)
    assert loose.run(None, feeds)[0].shape == (1000,)
    tight2 = rt.InferenceSession(model, small, providers=CPU)
    assert loose.run(None, feeds)[0].shape == (1000,)  # not lowered by tight2's creation
    with pytest.raises(OutOfMemoryError):
        tight2.run(None, feeds)


def test_loop_bodies_keep_the_sessions_cap():
    # a ConstantOfShape inside a Loop body is checked against the enclosing session's cap
    from onnx import TensorProto, helper

    body = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["s"], ["z"]),
         helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["d"])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "c"], ["zs"], body=body)], "g",
        [helper.make_tensor_value_info("n", TensorProto.INT64, []),
         helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("zs", TensorProto.FLOAT, ["n", "d"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    feeds = {"n": np.array(2), "c": np.array(True), "s": np.array([1000])}
    so = rt.SessionOptions()
    so.add_session_config_entry("session.max_tensor_bytes", "3999")
    with pytest.raises(OutOfMemoryError, match="3999"):
        rt.InferenceSession(model, so, providers=CPU).run(None, feeds)
    assert rt.InferenceSession(model, providers=CPU).run(None, feeds)[0].shape == (2, 1000)


@pytest.mark.parametrize("bad", ["-5", "0", "lots", "1e9"])
def test_bad_cap_entry_is_refused(bad):
    so = rt.SessionOptions()
    so.add_session_config_entry("session.max_tensor_bytes", bad)
    with pytest.raises(InvalidArgumentError, match="session.max_tensor_bytes"):
        rt.InferenceSession(BOMBS["Expand"][0], so, providers=CPU)


def test_huge_stride0_feed_is_refused_before_copying():
    model = _model(helper.make_node("Relu", ["x"], ["y"]), [("x", F, ["a", "b"])], 2)
    sess = rt.InferenceSession(model, providers=CPU)
    view = np.broadcast_to(np.float32(1), (2**20, 2**20))  # 4 TiB in 4 bytes
    with pytest.raises(InputTooLargeError) as info:
        sess.run(None, {"x": view})
    assert isinstance(info.value, MemoryError) and "'x'" in str(info.value)
    small = np.broadcast_to(np.float32(-1), (3, 4))
    np.testing.assert_array_equal(sess.run(None, {"x": small})[0], np.zeros((3, 4), np.float32))


@pytest.mark.parametrize("dtype", [99, 40])
def test_constant_of_unknown_element_type(dtype):
    t = onnx.TensorProto(name="c", data_type=dtype, dims=[2], raw_data=b"\0" * 8)
    model = _model(helper.make_node("Constant", [], ["y"], name="c0", value=t), [], 1)
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime's own error classes
        ort.InferenceSession(model, providers=CPU)
    with pytest.raises(InvalidModelError, match="'c0'.*'value'.*unknown element type"):
        rt.InferenceSession(model, providers=CPU)


@pytest.mark.parametrize("location", ["weights.bin/inner.bin", "x" * 300 + ".bin"])
def test_external_data_path_errors_are_typed(tmp_path, location):
    (tmp_path / "weights.bin").write_bytes(b"\0" * 64)
    w = numpy_helper.from_array(np.zeros(16, np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", "64")):
        w.external_data.add(key=k, value=v)
    model = onnx.load_from_string(_model(helper.make_node("Add", ["x", "w"], ["y"]), [("x", F, [16])], 1))
    model.graph.initializer.append(w)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ExternalDataError, match="cannot be examined|does not exist"):
        rt.InferenceSession(str(path), providers=CPU)
