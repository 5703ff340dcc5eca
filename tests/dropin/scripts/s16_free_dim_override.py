# Fixing a symbolic batch dim for a deployment (add_free_dimension_override_by_name).
import numpy as np
from onnx import TensorProto, helper

import onnxruntime as ort

m = helper.make_model(helper.make_graph(
    [helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, "batch"])]), opset_imports=[helper.make_opsetid("", 13)])
so = ort.SessionOptions()
so.add_free_dimension_override_by_name("batch", 2)
sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
print(sess.get_inputs()[0].shape, sess.get_outputs()[0].shape)
assert sess.get_inputs()[0].shape == [2, 4]
x = np.arange(8, dtype=np.float32).reshape(2, 4)
np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x.T)
try:
    sess.run(None, {"x": np.zeros((3, 4), np.float32)})
    raise SystemExit("a batch of 3 was accepted after fixing it to 2")
except Exception as e:
    print(type(e).__name__)
print("ok")
