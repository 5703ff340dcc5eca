"""Build the sample CNN bundled in runtime_core/samples (deterministic weights).

Run: python scripts/make_sample.py
"""

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(2026)


def w(*shape):
    return (rng.standard_normal(shape) * (2.0 / np.prod(shape[1:])) ** 0.5).astype(np.float32)


inits = {
    "conv1.w": w(8, 1, 3, 3), "conv1.b": np.zeros(8, np.float32),
    "bn.scale": np.ones(8, np.float32), "bn.bias": np.zeros(8, np.float32),
    "bn.mean": (rng.standard_normal(8) * 0.1).astype(np.float32),
    "bn.var": (1 + rng.random(8)).astype(np.float32),
    "conv2.w": w(16, 8, 3, 3), "conv2.b": np.zeros(16, np.float32),
    "fc.w": w(10, 16 * 7 * 7), "fc.b": np.zeros(10, np.float32),
    "flat": np.array([0, -1], np.int64),
}
nodes = [
    helper.make_node("Conv", ["image", "conv1.w", "conv1.b"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
    helper.make_node("BatchNormalization", ["c1", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["b1"], name="bn1"),
    helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
    helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
    helper.make_node("Conv", ["p1", "conv2.w", "conv2.b"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
    helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
    helper.make_node("MaxPool", ["r2"], ["p2"], name="pool2", kernel_shape=[2, 2], strides=[2, 2]),
    helper.make_node("Reshape", ["p2", "flat"], ["f"], name="flatten"),
    helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["logits"], name="fc", transB=1),
    helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=-1),
]
graph = helper.make_graph(
    nodes, "sample_cnn",
    [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 1, 28, 28])],
    [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 10])],
    initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="runtime-core")
model.ir_version = 8
model.doc_string = "A small MNIST-shaped CNN with random weights, bundled as runtime-core's sample."
onnx.checker.check_model(model)
out = Path(__file__).resolve().parents[1] / "runtime_core" / "samples" / "sample_cnn.onnx"
onnx.save(model, out)
print(f"wrote {out} ({out.stat().st_size} bytes)")
