# Re-using one IOBinding in a loop (a streaming pattern).
import numpy as np
from onnx import TensorProto, helper

import onnxruntime as ort

g = helper.make_graph([helper.make_node("CumSum", ["x", "axis"], ["y"])], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
                      [helper.make_tensor("axis", TensorProto.INT64, [], [1])])
sess = ort.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)]).SerializeToString(),
                            providers=["CPUExecutionProvider"])
binding = sess.io_binding()
for step in range(5):
    chunk = np.full((1, 8), step, np.float32)
    binding.bind_cpu_input("x", chunk)
    binding.bind_output("y")
    binding.synchronize_inputs()
    sess.run_with_iobinding(binding)
    binding.synchronize_outputs()
    (out,) = binding.copy_outputs_to_cpu()
    np.testing.assert_array_equal(out, np.cumsum(chunk, axis=1))
print("ok")
