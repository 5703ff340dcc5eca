"""Every output is the caller's own array, as onnxruntime returns them: writing into one changes
no feed, no weight (the next run) and no other output. Views are what our kernels return for
Reshape / Identity of an input or Gather / Slice of a weight, so the session copies those."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import runtime_core as rt

W = np.arange(12, dtype=np.float32).reshape(4, 3)
OUTS = ["r", "g", "s", "idn", "idn2", "x", "y"]


def _model() -> bytes:
    g = h.make_graph([
        h.make_node("Reshape", ["x", "shp"], ["r"]),
        h.make_node("Gather", ["W", "i"], ["g"], axis=0),
        h.make_node("Slice", ["W", "st", "en"], ["s"]),
        h.make_node("Identity", ["x"], ["idn"]),
        h.make_node("Identity", ["x"], ["idn2"]),
        h.make_node("Add", ["x", "x"], ["y"]),
    ], "g", [h.make_tensor_value_info("x", T.FLOAT, [2, 3]), h.make_tensor_value_info("i", T.INT64, []),
             h.make_tensor_value_info("st", T.INT64, [1]), h.make_tensor_value_info("en", T.INT64, [1])],
        [h.make_tensor_value_info(n, T.FLOAT, None) for n in OUTS],
        [nh.from_array(W, "W"), nh.from_array(np.array([6], np.int64), "shp")])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=9).SerializeToString()


def _feeds():
    return dict(x=np.ones((2, 3), np.float32), i=np.array(1, np.int64), st=np.array([1], np.int64),
                en=np.array([3], np.int64))


@pytest.mark.parametrize("runtime", ["runtime_core", "onnxruntime"])
def test_outputs_are_the_callers_own(runtime):
    data = _model()
    if runtime == "onnxruntime":  # the oracle: the behaviour we match
        sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    else:
        sess = rt.InferenceSession(data, providers=["cpu"])
    feeds = _feeds()
    first = sess.run(None, feeds)
    expect = [o.copy() for o in first]
    for k, o in enumerate(first):
        assert o.flags.writeable, OUTS[k]
        o[...] = -7.0  # each output written in turn: nothing else may change
        for j, other in enumerate(first[k + 1:], k + 1):
            np.testing.assert_array_equal(other, expect[j], err_msg=f"{OUTS[k]} -> {OUTS[j]}")
    np.testing.assert_array_equal(feeds["x"], np.ones((2, 3), np.float32))
    again = sess.run(None, _feeds())
    for name, got, want in zip(OUTS, again, expect):
        np.testing.assert_array_equal(got, want, err_msg=name)

