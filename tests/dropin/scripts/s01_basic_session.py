# The first script of onnxruntime's Python docs: build a model, open a session, run it.
import os
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper

import onnxruntime as ort

X = helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 4])
Y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 2])
W = helper.make_tensor("W", TensorProto.FLOAT, [4, 2], np.linspace(-1, 1, 8).astype(np.float32).tolist())
B = helper.make_tensor("B", TensorProto.FLOAT, [2], [0.5, -0.5])
graph = helper.make_graph([helper.make_node("Gemm", ["X", "W", "B"], ["H"]), helper.make_node("Relu", ["H"], ["Y"])],
                          "linear", [X], [Y], [W, B])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
onnx.checker.check_model(model)
path = os.path.join(tempfile.mkdtemp(), "linear.onnx")
onnx.save(model, path)

sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
input_name = sess.get_inputs()[0].name
output_name = sess.get_outputs()[0].name
print("input", input_name, sess.get_inputs()[0].shape, sess.get_inputs()[0].type)
print("output", output_name, sess.get_outputs()[0].shape, sess.get_outputs()[0].type)
x = np.random.rand(3, 4).astype(np.float32)
result = sess.run([output_name], {input_name: x})
expected = np.maximum(x @ np.linspace(-1, 1, 8).astype(np.float32).reshape(4, 2) + [0.5, -0.5], 0)
np.testing.assert_allclose(result[0], expected, rtol=1e-5, atol=1e-6)
assert sess.get_inputs()[0].type == "tensor(float)"
print("ok")
