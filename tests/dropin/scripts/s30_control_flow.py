# A model with an If subgraph (as torch.jit.script exports control flow).
import numpy as np
from onnx import TensorProto, helper

import onnxruntime as ort

then_g = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t"])], "then", [],
                           [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3])],
                           [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])])
else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                           [helper.make_tensor_value_info("e", TensorProto.FLOAT, [3])])
g = helper.make_graph(
    [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
     helper.make_node("Greater", ["s", "zero"], ["cond"]),
     helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])])
sess = ort.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString(),
                            providers=["CPUExecutionProvider"])
np.testing.assert_array_equal(sess.run(None, {"x": np.array([1, 2, 3], np.float32)})[0], [2, 4, 6])
np.testing.assert_array_equal(sess.run(None, {"x": np.array([-1, -2, 0], np.float32)})[0], [1, 2, 0])
print("ok")
