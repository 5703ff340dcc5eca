"""Recurrent speech-style models (torch LSTM / GRU, TorchScript exporter) and tree ensembles
(scikit-learn RandomForest via skl2onnx, LightGBM and XGBoost via onnxmltools)."""

from __future__ import annotations

import numpy as np

from ._export import export


def rnn(path, size, *, exporter, opset, dynamic, batch, seq, cell="lstm"):
    """A speech-style recurrent encoder: 80 features per frame, a 2-layer bidirectional ``cell``
    (hidden 256) and a 32-way per-frame Linear head; ``dynamic`` makes batch and frames symbolic."""
    import torch
    from torch import nn

    hidden, layers = (256, 2) if size != "tiny" else (16, 1)
    if size == "tiny":
        batch, seq = min(batch, 2), min(seq, 12)
    cls = nn.LSTM if cell == "lstm" else nn.GRU

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = cls(80, hidden, num_layers=layers, batch_first=True, bidirectional=True)
            self.head = nn.Linear(2 * hidden, 32)

        def forward(self, x):
            y, _ = self.rnn(x)
            return self.head(y)

    torch.manual_seed(0)
    x = np.random.default_rng(0).standard_normal((batch, seq, 80)).astype(np.float32)
    axes = {"x": {0: "batch", 1: "frames"}, "y": {0: "batch", 1: "frames"}} if dynamic else None
    export(M(), (torch.from_numpy(x),), path, inputs=["x"], outputs=["y"], exporter=exporter, opset=opset,
           dynamic=axes)
    return {"x": x}


def _data(size):
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=2000 if size != "tiny" else 200, n_features=20, n_informative=10,
                               n_classes=3, random_state=0)
    return X.astype(np.float32), y


def random_forest(path, size, *, opset, batch):
    """scikit-learn RandomForestClassifier (100 trees of depth 10; 5 of depth 4 tiny), skl2onnx,
    probabilities as a tensor (no ZipMap)."""
    from skl2onnx import to_onnx
    from sklearn.ensemble import RandomForestClassifier

    X, y = _data(size)
    n, depth = (100, 10) if size != "tiny" else (5, 4)
    est = RandomForestClassifier(n_estimators=n, max_depth=depth, random_state=0).fit(X, y)
    onx = to_onnx(est, X[:1], options={id(est): {"zipmap": False}}, target_opset={"": opset, "ai.onnx.ml": 3})
    path.write_bytes(onx.SerializeToString())
    return {onx.graph.input[0].name: X[:batch]}


def lightgbm(path, size, *, opset, batch):
    """LightGBM LGBMClassifier (100 rounds x 3 classes, 31 leaves; 5 rounds tiny), onnxmltools."""
    import lightgbm as lgb
    from onnxmltools import convert_lightgbm
    from onnxmltools.convert.common.data_types import FloatTensorType

    X, y = _data(size)
    n = 100 if size != "tiny" else 5
    est = lgb.LGBMClassifier(n_estimators=n, num_leaves=31, random_state=0, verbose=-1).fit(X, y)
    onx = convert_lightgbm(est, initial_types=[("X", FloatTensorType([None, X.shape[1]]))], zipmap=False,
                           target_opset=opset)
    path.write_bytes(onx.SerializeToString())
    return {"X": X[:batch]}


def xgboost(path, size, *, opset, batch):
    """XGBoost XGBClassifier (100 rounds x 3 classes, depth 6; 5 rounds tiny), onnxmltools."""
    import xgboost as xgb
    from onnxmltools import convert_xgboost
    from onnxmltools.convert.common.data_types import FloatTensorType

    X, y = _data(size)
    n = 100 if size != "tiny" else 5
    est = xgb.XGBClassifier(n_estimators=n, max_depth=6, random_state=0).fit(X, y)
    onx = convert_xgboost(est, initial_types=[("X", FloatTensorType([None, X.shape[1]]))], target_opset=opset)
    path.write_bytes(onx.SerializeToString())
    return {"X": X[:batch]}
