# Symbolic dims: get_inputs() shows their names; any size runs.
import numpy as np
from onnx import TensorProto, helper

import onnxruntime as ort

m = helper.make_model(helper.make_graph(
    [helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0, axes=[1])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])]), opset_imports=[helper.make_opsetid("", 11)])
sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
inp = sess.get_inputs()[0]
assert inp.shape == ["batch", "seq"], inp.shape
for b, s in [(1, 1), (3, 7), (8, 128)]:
    x = np.random.rand(b, s).astype(np.float32)
    y = sess.run(None, {inp.name: x})[0]
    assert y.shape == (b,)
    np.testing.assert_allclose(y, x.sum(1), rtol=1e-5)
print("ok")
