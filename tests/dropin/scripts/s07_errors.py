# Error handling as users write it: catch onnxruntime's exception classes.
import os
import tempfile

import numpy as np
from onnx import TensorProto, helper

import onnxruntime as ort
from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument, InvalidProtobuf, NoSuchFile

m = helper.make_model(helper.make_graph(
    [helper.make_node("Abs", ["x"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])]), opset_imports=[helper.make_opsetid("", 13)])
sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])

try:
    sess.run(None, {"x": np.ones((2, 2), dtype=np.float64)})
    raise SystemExit("a float64 feed was accepted")
except InvalidArgument as e:
    print("InvalidArgument:", str(e)[:80])

try:
    sess.run(None, {"x": np.ones((3, 2), dtype=np.float32)})
    raise SystemExit("a wrong shape was accepted")
except InvalidArgument as e:
    print("InvalidArgument:", str(e)[:80])

try:
    sess.run(["nope"], {"x": np.ones((2, 2), dtype=np.float32)})
    raise SystemExit("a wrong output name was accepted")
except InvalidArgument as e:
    print("InvalidArgument:", str(e)[:80])

try:
    sess.run(None, {"wrong": np.ones((2, 2), dtype=np.float32)})
    raise SystemExit("a wrong input name was accepted")
except ValueError as e:
    print("ValueError:", str(e)[:80])

try:
    ort.InferenceSession(os.path.join(tempfile.gettempdir(), "no_such_model_here.onnx"))
    raise SystemExit("a missing file loaded")
except NoSuchFile as e:
    print("NoSuchFile:", str(e)[:80])

try:
    ort.InferenceSession(b"this is not a model")
    raise SystemExit("garbage loaded")
except InvalidProtobuf as e:
    print("InvalidProtobuf:", str(e)[:80])

bad = helper.make_model(helper.make_graph(
    [helper.make_node("Abs", ["x"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
    [helper.make_tensor_value_info("y", TensorProto.INT32, [2])]), opset_imports=[helper.make_opsetid("", 13)])
try:
    ort.InferenceSession(bad.SerializeToString(), providers=["CPUExecutionProvider"])
    raise SystemExit("a model with a type error loaded")
except Fail as e:
    print("Fail:", str(e)[:80])
print("ok")
