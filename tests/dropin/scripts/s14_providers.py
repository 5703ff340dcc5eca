# Choosing providers as the docs show (with CPU as what every machine has).
import numpy as np
from onnx import TensorProto, helper

import onnxruntime as ort

print(ort.__version__, ort.get_device())
available = ort.get_available_providers()
print(available)
assert "CPUExecutionProvider" in available
m = helper.make_model(helper.make_graph(
    [helper.make_node("Sqrt", ["x"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])]), opset_imports=[helper.make_opsetid("", 13)])
providers = [p for p in ["CUDAExecutionProvider", "CPUExecutionProvider"] if p in available]
sess = ort.InferenceSession(m.SerializeToString(), providers=providers)
print(sess.get_providers())
assert sess.get_providers()[-1] == "CPUExecutionProvider"
assert "CPUExecutionProvider" in sess.get_provider_options()
sess = ort.InferenceSession(m.SerializeToString(), providers=[("CPUExecutionProvider", {})])
assert sess.get_providers() == ["CPUExecutionProvider"]
sess.set_providers(["CPUExecutionProvider"])
assert sess.get_providers() == ["CPUExecutionProvider"]
sess.disable_fallback()
sess.enable_fallback()
x = np.array([1, 4, 9, 16], np.float32)
np.testing.assert_array_equal(sess.run(None, {"x": x})[0], [1, 2, 3, 4])
# a session that names no providers runs on the CPU
assert ort.InferenceSession(m.SerializeToString()).get_providers() == ["CPUExecutionProvider"]
print("ok")
