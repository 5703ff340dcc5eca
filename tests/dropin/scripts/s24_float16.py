# A float16 model (as converted for GPUs), run on the CPU.
import numpy as np
from onnx import TensorProto, helper, numpy_helper

import onnxruntime as ort

w = (np.random.default_rng(0).standard_normal((8, 4)) / 4).astype(np.float16)
g = helper.make_graph(
    [helper.make_node("Cast", ["x"], ["xh"], to=TensorProto.FLOAT16), helper.make_node("MatMul", ["xh", "w"], ["h"]),
     helper.make_node("Relu", ["h"], ["r"]), helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT)], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], [numpy_helper.from_array(w, "w")])
sess = ort.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(),
                            providers=["CPUExecutionProvider"])
x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
want = np.maximum(x.astype(np.float16).astype(np.float32) @ w.astype(np.float32), 0)
np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=2e-2, atol=2e-2)
print("ok")
