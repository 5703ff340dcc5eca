# A generic "run any model on random inputs" helper, as found in many repos.
import numpy as np
from onnx import TensorProto, helper

import onnxruntime as ort

TYPE_MAP = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(int64)": np.int64,
            "tensor(int32)": np.int32, "tensor(bool)": np.bool_, "tensor(float16)": np.float16}

g = helper.make_graph(
    [helper.make_node("Cast", ["ids"], ["idsf"], to=TensorProto.FLOAT),
     helper.make_node("Mul", ["idsf", "x"], ["p"]), helper.make_node("Where", ["mask", "p", "x"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 5]),
     helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 5]),
     helper.make_tensor_value_info("mask", TensorProto.BOOL, ["batch", 5])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])])
model_bytes = helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)]).SerializeToString()
sess = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])


def random_inputs(session, batch=2):
    feeds = {}
    for inp in session.get_inputs():
        shape = [d if isinstance(d, int) else batch for d in inp.shape]
        dtype = TYPE_MAP[inp.type]
        if dtype == np.bool_:
            feeds[inp.name] = np.random.rand(*shape) > 0.5
        elif np.issubdtype(dtype, np.integer):
            feeds[inp.name] = np.random.randint(0, 10, size=shape).astype(dtype)
        else:
            feeds[inp.name] = np.random.rand(*shape).astype(dtype)
    return feeds


feeds = random_inputs(sess)
outputs = sess.run(None, feeds)
out_names = [o.name for o in sess.get_outputs()]
result = dict(zip(out_names, outputs))
want = np.where(feeds["mask"], feeds["ids"].astype(np.float32) * feeds["x"], feeds["x"])
np.testing.assert_allclose(result["y"], want, rtol=1e-6)
print({k: v.shape for k, v in result.items()})
print("ok")
