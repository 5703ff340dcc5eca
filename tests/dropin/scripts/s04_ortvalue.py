# OrtValue from numpy, and run_with_ort_values (the docs' "Data on device" section, on CPU).
import numpy as np
from onnx import TensorProto, helper

import onnxruntime

m = helper.make_model(helper.make_graph(
    [helper.make_node("MatMul", ["a", "b"], ["c"])], "mm",
    [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]), helper.make_tensor_value_info("b", TensorProto.FLOAT, [3, 4])],
    [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 4])]), opset_imports=[helper.make_opsetid("", 13)])
session = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])

a = np.random.rand(2, 3).astype(np.float32)
b = np.random.rand(3, 4).astype(np.float32)
a_ort = onnxruntime.OrtValue.ortvalue_from_numpy(a)
b_ort = onnxruntime.OrtValue.ortvalue_from_numpy(b, "cpu", 0)
print(a_ort.device_name(), a_ort.shape(), a_ort.data_type(), a_ort.is_tensor())
assert a_ort.device_name() == "cpu"
assert a_ort.shape() == [2, 3]
assert a_ort.data_type() == "tensor(float)"
assert a_ort.is_tensor()
np.testing.assert_array_equal(a_ort.numpy(), a)

res = session.run(["c"], {"a": a_ort, "b": b_ort})
np.testing.assert_allclose(res[0], a @ b, rtol=1e-5)
outs = session.run_with_ort_values(["c"], {"a": a_ort, "b": b_ort})
assert outs[0].shape() == [2, 4]
np.testing.assert_allclose(outs[0].numpy(), a @ b, rtol=1e-5)
empty = onnxruntime.OrtValue.ortvalue_from_shape_and_type([2, 4], np.float32, "cpu", 0)
assert empty.shape() == [2, 4] and empty.data_type() == "tensor(float)"
print("ok")
