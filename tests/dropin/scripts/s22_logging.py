# Quieting onnxruntime's logs, globally and per session.
import numpy as np
from onnx import TensorProto, helper

import onnxruntime as ort

ort.set_default_logger_severity(3)
ort.set_default_logger_verbosity(0)
so = ort.SessionOptions()
so.log_severity_level = 3
so.log_verbosity_level = 0
so.logid = "my-session"
m = helper.make_model(helper.make_graph(
    [helper.make_node("Floor", ["x"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])]), opset_imports=[helper.make_opsetid("", 13)])
sess = ort.InferenceSession(m.SerializeToString(), sess_options=so, providers=["CPUExecutionProvider"])
np.testing.assert_array_equal(sess.run(None, {"x": np.array([1.5, -1.5, 2.0], np.float32)})[0], [1, -2, 2])
ort.set_default_logger_severity(2)
print("ok")
