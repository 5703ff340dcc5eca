# RunOptions: a tag, a log level, and config entries, passed to run().
import numpy as np
from onnx import TensorProto, helper

import onnxruntime as ort

m = helper.make_model(helper.make_graph(
    [helper.make_node("Neg", ["x"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])]), opset_imports=[helper.make_opsetid("", 13)])
sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
ro = ort.RunOptions()
ro.log_severity_level = 3
ro.log_verbosity_level = 0
ro.logid = "request-42"
ro.only_execute_path_to_fetches = True
ro.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
assert ro.get_run_config_entry("memory.enable_memory_arena_shrinkage") == "cpu:0"
assert ro.terminate is False
y = sess.run(None, {"x": np.array([1, -2, 3], np.float32)}, ro)[0]
np.testing.assert_array_equal(y, [-1, 2, -3])
y = sess.run(["y"], {"x": np.array([1, -2, 3], np.float32)}, run_options=ro)[0]
np.testing.assert_array_equal(y, [-1, 2, -3])
print("ok")
