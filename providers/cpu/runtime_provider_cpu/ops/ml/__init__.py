"""CPU kernels: the ``ai.onnx.ml`` operators (traditional machine learning), one module per family.

Semantics are those of the ONNX-ML specification as onnxruntime implements them
(the project's oracle): output dtypes and shapes, the binary-classifier label and
score conventions, which post transforms apply to single-column scores, and the
float32 arithmetic of scores. Where onnxruntime's behaviour is undefined (reads of
uninitialised memory) the kernels write zeros.

- :mod:`.trees`: TreeEnsembleRegressor, TreeEnsembleClassifier, TreeEnsemble (the compiled
  forest they share is :mod:`.forest`);
- :mod:`.linear`: LinearClassifier, LinearRegressor, SVMClassifier, SVMRegressor;
- :mod:`.preprocess`: Scaler, Normalizer, Binarizer, Imputer, ArrayFeatureExtractor,
  OneHotEncoder, FeatureVectorizer;
- :mod:`.encoders`: LabelEncoder, CategoryMapper, ZipMap, DictVectorizer, CastMap;
- :mod:`._common`: the score transforms and input helpers they share.
"""

from . import encoders, linear, preprocess, trees  # noqa: F401 - each registers its kernels
