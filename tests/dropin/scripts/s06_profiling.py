# Profiling as in the docs: enable_profiling, run, end_profiling, read the JSON trace.
import json
import os
import tempfile

import numpy as np
from onnx import TensorProto, helper

import onnxruntime as ort

m = helper.make_model(helper.make_graph(
    [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Exp", ["r"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])]), opset_imports=[helper.make_opsetid("", 13)])
options = ort.SessionOptions()
options.enable_profiling = True
options.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "prof")
sess = ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
for _ in range(3):
    sess.run(None, {"x": np.random.rand(4, 4).astype(np.float32)})
assert sess.get_profiling_start_time_ns() > 0
prof_file = sess.end_profiling()
print(prof_file)
assert os.path.basename(prof_file).startswith("prof") and prof_file.endswith(".json")
with open(prof_file) as f:
    events = json.load(f)
cats = {e["cat"] for e in events}
assert {"Session", "Node"} <= cats, cats
ops = {e["args"]["op_name"] for e in events if e["cat"] == "Node" and "op_name" in e.get("args", {})}
assert {"Relu", "Exp"} <= ops, ops
runs = [e for e in events if e["name"] == "model_run"]
assert len(runs) == 3
print("ok")
