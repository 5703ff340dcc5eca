# Session options from the performance-tuning docs: optimization level, threads, offline model.
import os
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper

import onnxruntime as rt

d = tempfile.mkdtemp()
nodes = [helper.make_node("Add", ["x", "c"], ["a"]), helper.make_node("Mul", ["a", "c"], ["b"]),
         helper.make_node("Identity", ["b"], ["y"])]
c = helper.make_tensor("c", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
model = helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [c]),
                          opset_imports=[helper.make_opsetid("", 17)])
onnx.save(model, os.path.join(d, "m.onnx"))

sess_options = rt.SessionOptions()
sess_options.graph_optimization_level = rt.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
sess_options.optimized_model_filepath = os.path.join(d, "optimized.onnx")
sess_options.intra_op_num_threads = 2
sess_options.inter_op_num_threads = 1
sess_options.execution_mode = rt.ExecutionMode.ORT_SEQUENTIAL
sess_options.log_severity_level = 3
sess_options.enable_mem_pattern = True
sess_options.enable_cpu_mem_arena = False
session = rt.InferenceSession(os.path.join(d, "m.onnx"), sess_options, providers=["CPUExecutionProvider"])
x = np.ones((2, 3), np.float32)
y = session.run(None, {"x": x})[0]
np.testing.assert_allclose(y, (x + [1, 2, 3]) * [1, 2, 3])
assert os.path.exists(sess_options.optimized_model_filepath)
onnx.checker.check_model(onnx.load(sess_options.optimized_model_filepath))
assert session.get_session_options().intra_op_num_threads == 2
for level in (rt.GraphOptimizationLevel.ORT_DISABLE_ALL, rt.GraphOptimizationLevel.ORT_ENABLE_BASIC,
              rt.GraphOptimizationLevel.ORT_ENABLE_ALL):
    so = rt.SessionOptions()
    so.graph_optimization_level = level
    s = rt.InferenceSession(os.path.join(d, "m.onnx"), so, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(s.run(None, {"x": x})[0], y)
so = rt.SessionOptions()
so.execution_mode = rt.ExecutionMode.ORT_PARALLEL
so.inter_op_num_threads = 2
s = rt.InferenceSession(os.path.join(d, "m.onnx"), so, providers=["CPUExecutionProvider"])
np.testing.assert_allclose(s.run(None, {"x": x})[0], y)
print("ok")
