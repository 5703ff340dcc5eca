# String tensors: a LabelEncoder (ai.onnx.ml) from strings to ids, and string passthrough.
import numpy as np
from onnx import TensorProto, helper

import onnxruntime as ort

g = helper.make_graph(
    [helper.make_node("LabelEncoder", ["words"], ["ids"], domain="ai.onnx.ml",
                      keys_strings=["cat", "dog", "fish"], values_int64s=[1, 2, 3], default_int64=-1),
     helper.make_node("Identity", ["words"], ["echo"])], "g",
    [helper.make_tensor_value_info("words", TensorProto.STRING, ["n"])],
    [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"]),
     helper.make_tensor_value_info("echo", TensorProto.STRING, ["n"])])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 2)])
sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
assert sess.get_inputs()[0].type == "tensor(string)"
words = np.array(["dog", "bird", "cat", "fish"])
ids, echo = sess.run(None, {"words": words})
np.testing.assert_array_equal(ids, [2, -1, 1, 3])
assert list(echo) == ["dog", "bird", "cat", "fish"]
ids2 = sess.run(["ids"], {"words": np.array(["fish"], dtype=object)})[0]
np.testing.assert_array_equal(ids2, [3])
print("ok")
