# Session config entries (thread spinning, denormals) as in the threading docs.
import numpy as np
from onnx import TensorProto, helper

import onnxruntime as ort

so = ort.SessionOptions()
so.add_session_config_entry("session.intra_op.allow_spinning", "0")
so.add_session_config_entry("session.set_denormal_as_zero", "1")
so.add_session_config_entry("session.use_env_allocators", "0")
assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
so.intra_op_num_threads = 1
so.use_deterministic_compute = True
m = helper.make_model(helper.make_graph(
    [helper.make_node("Softmax", ["x"], ["y"], axis=1)], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])]), opset_imports=[helper.make_opsetid("", 13)])
sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
y = sess.run(None, {"x": np.zeros((2, 3), np.float32)})[0]
np.testing.assert_allclose(y, np.full((2, 3), 1 / 3, np.float32), rtol=1e-6)
print("ok")
