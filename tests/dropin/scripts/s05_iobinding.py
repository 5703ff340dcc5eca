# IOBinding as in the docs (CPU): bind inputs and outputs, run, copy outputs back.
import numpy as np
from onnx import TensorProto, helper

import onnxruntime

m = helper.make_model(helper.make_graph(
    [helper.make_node("Sigmoid", ["X"], ["Y"])], "g",
    [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, 2])],
    [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 2])]), opset_imports=[helper.make_opsetid("", 13)])
session = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
x = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=np.float32)
want = 1 / (1 + np.exp(-x))

io_binding = session.io_binding()
io_binding.bind_cpu_input("X", x)
io_binding.bind_output("Y")
session.run_with_iobinding(io_binding)
Y = io_binding.copy_outputs_to_cpu()[0]
np.testing.assert_allclose(Y, want, rtol=1e-6)

# inputs and outputs as OrtValues
X_ortvalue = onnxruntime.OrtValue.ortvalue_from_numpy(x, "cpu", 0)
Y_ortvalue = onnxruntime.OrtValue.ortvalue_from_shape_and_type([3, 2], np.float32, "cpu", 0)
io_binding = session.io_binding()
io_binding.bind_ortvalue_input("X", X_ortvalue)
io_binding.bind_ortvalue_output("Y", Y_ortvalue)
session.run_with_iobinding(io_binding)
np.testing.assert_allclose(Y_ortvalue.numpy(), want, rtol=1e-6)

# bind_input with an explicit element type and shape (host memory)
io_binding = session.io_binding()
io_binding.bind_input(name="X", device_type="cpu", device_id=0, element_type=np.float32, shape=x.shape,
                      buffer_ptr=X_ortvalue.data_ptr())
io_binding.bind_output("Y", "cpu")
session.run_with_iobinding(io_binding)
outs = io_binding.get_outputs()
np.testing.assert_allclose(outs[0].numpy(), want, rtol=1e-6)
io_binding.clear_binding_inputs()
io_binding.clear_binding_outputs()
print("ok")
