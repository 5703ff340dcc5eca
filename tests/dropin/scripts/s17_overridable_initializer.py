# Overriding an initializer that is also a graph input (older exporters write such models).
import numpy as np
from onnx import TensorProto, helper, numpy_helper

import onnxruntime as ort

scale = np.array([2.0], np.float32)
m = helper.make_model(helper.make_graph(
    [helper.make_node("Mul", ["x", "scale"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]), helper.make_tensor_value_info("scale", TensorProto.FLOAT, [1])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], [numpy_helper.from_array(scale, "scale")]),
    opset_imports=[helper.make_opsetid("", 13)])
m.ir_version = 8
sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
print([i.name for i in sess.get_inputs()], [i.name for i in sess.get_overridable_initializers()])
assert [i.name for i in sess.get_overridable_initializers()] == ["scale"]
x = np.array([1, 2, 3], np.float32)
np.testing.assert_array_equal(sess.run(None, {"x": x})[0], [2, 4, 6])
np.testing.assert_array_equal(sess.run(None, {"x": x, "scale": np.array([10], np.float32)})[0], [10, 20, 30])
np.testing.assert_array_equal(sess.run(None, {"x": x})[0], [2, 4, 6])
print("ok")
