# One session shared by worker threads (a web server's pattern).
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from onnx import TensorProto, helper

import onnxruntime as ort

w = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
m = helper.make_model(helper.make_graph(
    [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Tanh", ["h"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])],
    [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.flatten().tolist())]), opset_imports=[helper.make_opsetid("", 13)])
opts = ort.SessionOptions()
opts.intra_op_num_threads = 1
sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
inputs = [np.random.default_rng(i).standard_normal((i + 1, 16)).astype(np.float32) for i in range(32)]


def predict(x):
    return sess.run(None, {"x": x})[0]


with ThreadPoolExecutor(max_workers=8) as pool:
    results = list(pool.map(predict, inputs))
for x, y in zip(inputs, results):
    np.testing.assert_allclose(y, np.tanh(x @ w), rtol=1e-4, atol=1e-5)
print("ok")
