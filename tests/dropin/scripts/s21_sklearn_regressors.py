# Regression and clustering models from scikit-learn, converted with skl2onnx.
import numpy as np
from skl2onnx import to_onnx
from sklearn.cluster import KMeans
from sklearn.datasets import make_regression
from sklearn.ensemble import GradientBoostingRegressor
from sklearn.svm import SVR

import onnxruntime as rt

X, y = make_regression(n_samples=200, n_features=6, noise=0.1, random_state=0)
X = X.astype(np.float32)
for model in (GradientBoostingRegressor(n_estimators=20, random_state=0), SVR(C=10.0)):
    model.fit(X, y)
    onx = to_onnx(model, X[:1])
    sess = rt.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
    pred = sess.run(None, {sess.get_inputs()[0].name: X})[0]
    np.testing.assert_allclose(pred.ravel(), model.predict(X), rtol=1e-3, atol=1e-3)
km = KMeans(n_clusters=3, n_init=3, random_state=0).fit(X)
onx = to_onnx(km, X[:1])
sess = rt.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
labels, scores = sess.run(None, {sess.get_inputs()[0].name: X})
assert (labels == km.predict(X)).all()
np.testing.assert_allclose(scores, km.transform(X), rtol=1e-3, atol=1e-3)
print("ok")
