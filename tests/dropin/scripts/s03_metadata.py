# Reading a model's metadata, inputs and outputs (a "model inspector" script).
import numpy as np
import onnx
from onnx import TensorProto, helper

import onnxruntime

g = helper.make_graph([helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)], "classifier",
                      [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
                      [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 10])])
g.doc_string = "graph doc"
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="my-exporter",
                      producer_version="1.2", doc_string="A tiny classifier", domain="com.example", model_version=7)
onnx.helper.set_model_props(m, {"author": "me", "labels": "a,b,c"})

sess = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
meta = sess.get_modelmeta()
print(meta.producer_name, meta.graph_name, meta.domain, meta.description, meta.version)
assert meta.producer_name == "my-exporter"
assert meta.graph_name == "classifier"
assert meta.domain == "com.example"
assert meta.description == "A tiny classifier"
assert meta.graph_description == "graph doc"
assert meta.version == 7
assert meta.custom_metadata_map == {"author": "me", "labels": "a,b,c"}
for i in sess.get_inputs():
    print("input:", i.name, i.type, i.shape)
    assert i.shape == ["batch", 10]
for o in sess.get_outputs():
    print("output:", o.name, o.type, o.shape)
assert sess.get_overridable_initializers() == []
out = sess.run(None, {"logits": np.zeros((2, 10), np.float32)})[0]
np.testing.assert_allclose(out, np.full((2, 10), 0.1, np.float32), rtol=1e-6)
print("ok")
