# A model saved with external data (as large models are), loaded from its path.
import os
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnxruntime as ort

rng = np.random.default_rng(0)
w = rng.standard_normal((256, 128)).astype(np.float32)
b = rng.standard_normal(128).astype(np.float32)
m = helper.make_model(helper.make_graph(
    [helper.make_node("Gemm", ["x", "w", "b"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 256])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 128])],
    [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]), opset_imports=[helper.make_opsetid("", 13)])
d = tempfile.mkdtemp()
path = os.path.join(d, "model.onnx")
onnx.save_model(m, path, save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin",
                size_threshold=1024)
assert os.path.exists(os.path.join(d, "weights.bin"))
sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
x = rng.standard_normal((4, 256)).astype(np.float32)
np.testing.assert_allclose(sess.run(None, {"x": x})[0], x @ w + b, rtol=1e-4, atol=1e-4)
print("ok")
