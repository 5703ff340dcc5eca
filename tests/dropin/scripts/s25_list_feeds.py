# Feeding plain Python lists (onnxruntime converts them to the input's type).
import numpy as np
from onnx import TensorProto, helper

import onnxruntime as ort

g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["c"])], "g",
                      [helper.make_tensor_value_info("a", TensorProto.FLOAT, [None, 3]),
                       helper.make_tensor_value_info("b", TensorProto.FLOAT, [None, 3])],
                      [helper.make_tensor_value_info("c", TensorProto.FLOAT, [None, 3])])
sess = ort.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString(),
                            providers=["CPUExecutionProvider"])
c = sess.run(None, {"a": [[1, 2, 3]], "b": [[0.5, 0.5, 0.5]]})[0]
assert c.dtype == np.float32
np.testing.assert_array_equal(c, [[1.5, 2.5, 3.5]])
c = sess.run(None, {"a": [[1, 2, 3], [4, 5, 6]], "b": np.ones((2, 3), np.float32)})[0]
np.testing.assert_array_equal(c, [[2, 3, 4], [5, 6, 7]])
print("ok")
