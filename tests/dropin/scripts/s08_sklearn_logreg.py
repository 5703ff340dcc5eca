# scikit-learn -> skl2onnx -> onnxruntime, as in the skl2onnx tutorial.
import numpy as np
from skl2onnx import to_onnx
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split

import onnxruntime as rt

X, y = load_iris(return_X_y=True)
X = X.astype(np.float32)
X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0)
clr = LogisticRegression(max_iter=500).fit(X_train, y_train)
onx = to_onnx(clr, X_train[:1], options={"zipmap": False})

sess = rt.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
input_name = sess.get_inputs()[0].name
label_name = sess.get_outputs()[0].name
prob_name = sess.get_outputs()[1].name
pred_onx, prob = sess.run([label_name, prob_name], {input_name: X_test})
assert (pred_onx == clr.predict(X_test)).all()
np.testing.assert_allclose(prob, clr.predict_proba(X_test), rtol=1e-4, atol=1e-5)
print("labels", pred_onx[:5])
print("ok")
