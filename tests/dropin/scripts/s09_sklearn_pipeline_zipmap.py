# A pipeline with a tree ensemble and the default ZipMap output (a list of dicts).
import numpy as np
from skl2onnx import convert_sklearn
from skl2onnx.common.data_types import FloatTensorType
from sklearn.datasets import load_breast_cancer
from sklearn.ensemble import RandomForestClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import onnxruntime as rt

X, y = load_breast_cancer(return_X_y=True)
X = X.astype(np.float32)
pipe = make_pipeline(StandardScaler(), RandomForestClassifier(n_estimators=10, max_depth=5, random_state=0))
pipe.fit(X, y)
onx = convert_sklearn(pipe, initial_types=[("input", FloatTensorType([None, X.shape[1]]))])
sess = rt.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
labels, probas = sess.run(None, {"input": X[:20]})
assert (labels == pipe.predict(X[:20])).all()
assert isinstance(probas, list) and isinstance(probas[0], dict)
got = np.array([[p[0], p[1]] for p in probas])
np.testing.assert_allclose(got, pipe.predict_proba(X[:20]), atol=1e-5)
print("ok")
