# Dynamic quantization of a MatMul model, then inference (onnxruntime.quantization docs).
import os
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic

rng = np.random.default_rng(0)
w = rng.standard_normal((64, 32)).astype(np.float32)
g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 32])], [numpy_helper.from_array(w, "w")])
d = tempfile.mkdtemp()
fp32, int8 = os.path.join(d, "model.onnx"), os.path.join(d, "model.quant.onnx")
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), fp32)
quantize_dynamic(fp32, int8, weight_type=QuantType.QInt8)
sess = ort.InferenceSession(int8, providers=["CPUExecutionProvider"])
x = rng.standard_normal((4, 64)).astype(np.float32)
y = sess.run(None, {"x": x})[0]
ref = x @ w
assert np.abs(y - ref).max() < 0.05 * np.abs(ref).max(), np.abs(y - ref).max()
print("ok")
