# Several outputs: ask for one, some, all (None or []), in any order.
import numpy as np
from onnx import TensorProto, helper

import onnxruntime as ort

g = helper.make_graph(
    [helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=-1),
     helper.make_node("ReduceMax", ["x"], ["maximum"], keepdims=0)], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
    [helper.make_tensor_value_info("values", TensorProto.FLOAT, [2, 3]),
     helper.make_tensor_value_info("indices", TensorProto.INT64, [2, 3]),
     helper.make_tensor_value_info("maximum", TensorProto.FLOAT, [])],
    [helper.make_tensor("k", TensorProto.INT64, [1], [3])])
sess = ort.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(),
                            providers=["CPUExecutionProvider"])
x = np.array([[3, 1, 4, 1, 5, 9], [2, 6, 5, 3, 5, 8]], np.float32)
v, i, mx = sess.run(None, {"x": x})
np.testing.assert_array_equal(v, [[9, 5, 4], [8, 6, 5]])
np.testing.assert_array_equal(i, [[5, 4, 2], [5, 1, 2]])
assert mx == 9
(only_idx,) = sess.run(["indices"], {"x": x})
np.testing.assert_array_equal(only_idx, i)
mx2, v2 = sess.run(["maximum", "values"], {"x": x})
assert mx2 == 9 and (v2 == v).all()
everything = sess.run([], {"x": x})
assert len(everything) == 3
print([o.name for o in sess.get_outputs()])
print("ok")
