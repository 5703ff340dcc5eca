# A model whose output is a sequence of tensors (returned as a list of arrays).
import numpy as np
from onnx import TensorProto, helper

import onnxruntime as ort

g = helper.make_graph([helper.make_node("SplitToSequence", ["x"], ["parts"], axis=0, keepdims=0)], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2])],
                      [helper.make_tensor_sequence_value_info("parts", TensorProto.FLOAT, None)])
sess = ort.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString(),
                            providers=["CPUExecutionProvider"])
print(sess.get_outputs()[0].type)
assert sess.get_outputs()[0].type == "seq(tensor(float))"
x = np.arange(6, dtype=np.float32).reshape(3, 2)
parts = sess.run(None, {"x": x})[0]
assert isinstance(parts, list) and len(parts) == 3
for i, p in enumerate(parts):
    np.testing.assert_array_equal(p, x[i])
print("ok")
