# Image classification the model-zoo way: preprocess with numpy, run, softmax, top-5.
import numpy as np
from onnx import TensorProto, helper, numpy_helper

import onnxruntime

rng = np.random.default_rng(0)
conv_w = (rng.standard_normal((8, 3, 3, 3)) * 0.2).astype(np.float32)
fc_w = (rng.standard_normal((10, 8 * 8 * 8)) * 0.05).astype(np.float32)
fc_b = np.zeros(10, np.float32)
g = helper.make_graph(
    [helper.make_node("Conv", ["data", "conv_w"], ["c"], pads=[1, 1, 1, 1]),
     helper.make_node("Relu", ["c"], ["r"]),
     helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
     helper.make_node("Flatten", ["p"], ["f"]),
     helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], transB=1)], "cnn",
    [helper.make_tensor_value_info("data", TensorProto.FLOAT, ["N", 3, 16, 16])],
    [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
    [numpy_helper.from_array(conv_w, "conv_w"), numpy_helper.from_array(fc_w, "fc_w"), numpy_helper.from_array(fc_b, "fc_b")])
model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
session = onnxruntime.InferenceSession(model, None, providers=["CPUExecutionProvider"])

image = rng.integers(0, 256, size=(16, 16, 3)).astype(np.uint8)  # an HWC RGB image
mean = np.array([0.485, 0.456, 0.406])
std = np.array([0.229, 0.224, 0.225])
img = ((image / 255.0 - mean) / std).transpose(2, 0, 1)[None].astype("float32")
input_name = session.get_inputs()[0].name
raw_result = session.run([], {input_name: img})
logits = np.array(raw_result[0]).squeeze()
probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
top5 = np.argsort(probs)[::-1][:5]
print("top5", top5)

# the same network in numpy
pad = np.pad(img[0], ((0, 0), (1, 1), (1, 1)))
conv = np.zeros((8, 16, 16), np.float32)
for o in range(8):
    for i in range(16):
        for j in range(16):
            conv[o, i, j] = (pad[:, i:i + 3, j:j + 3] * conv_w[o]).sum()
pooled = np.maximum(conv, 0).reshape(8, 8, 2, 8, 2).max(axis=(2, 4))
want = pooled.reshape(-1) @ fc_w.T + fc_b
np.testing.assert_allclose(logits, want, rtol=1e-3, atol=1e-4)
print("ok")
