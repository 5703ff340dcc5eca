"""scikit-learn (skl2onnx), LightGBM and XGBoost (onnxmltools) models on CPU vs onnxruntime."""

import warnings

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn", reason="scikit-learn is a test-only dependency")
skl2onnx = pytest.importorskip("skl2onnx", reason="skl2onnx is a test-only dependency")

from skl2onnx import to_onnx  # noqa: E402
from skl2onnx.common.data_types import FloatTensorType  # noqa: E402
from sklearn.compose import ColumnTransformer  # noqa: E402
from sklearn.datasets import make_classification, make_regression  # noqa: E402
from sklearn.ensemble import (  # noqa: E402
    GradientBoostingClassifier,
    GradientBoostingRegressor,
    RandomForestClassifier,
    RandomForestRegressor,
)
from sklearn.linear_model import LinearRegression, LogisticRegression  # noqa: E402
from sklearn.pipeline import Pipeline  # noqa: E402
from sklearn.preprocessing import Binarizer, MinMaxScaler, Normalizer, OneHotEncoder, StandardScaler  # noqa: E402
from sklearn.svm import SVC, SVR  # noqa: E402

import runtime_core as rt  # noqa: E402
from oracle import run_oracle  # noqa: E402

RTOL, ATOL = 1e-3, 1e-4


def compare(model, feeds):
    data = model.SerializeToString()
    sess = rt.InferenceSession(data, providers=["CPUExecutionProvider"])
    ours = sess.run(None, feeds)
    ref = run_oracle(model, feeds)
    assert len(ours) == len(ref)
    for o, r, info in zip(ours, ref, sess.get_outputs()):
        if isinstance(r, list):  # ZipMap: a list of dicts
            assert isinstance(o, list) and len(o) == len(r), info.name
            for a, b in zip(o, r):
                assert a.keys() == b.keys()
                for k in b:
                    np.testing.assert_allclose(a[k], b[k], rtol=RTOL, atol=ATOL)
            continue
        o, r = np.asarray(o), np.asarray(r)
        assert o.shape == r.shape, (info.name, o.shape, r.shape)
        if r.dtype.kind in "OUS":
            assert o.tolist() == r.tolist()
        else:
            assert o.dtype == r.dtype, (info.name, o.dtype, r.dtype)
            if r.dtype.kind == "f":
                np.testing.assert_allclose(o, r, rtol=RTOL, atol=ATOL, err_msg=info.name)
            else:
                np.testing.assert_array_equal(o, r, err_msg=info.name)
    assert all(n.provider == "CPUExecutionProvider" for n in sess.get_partition_report().nodes)
    return ours


Xc, yc = make_classification(200, 8, n_informative=5, random_state=0)
Xc = Xc.astype(np.float32)
Xm, ym = make_classification(200, 8, n_informative=6, n_classes=3, random_state=1)
Xm = Xm.astype(np.float32)
Xr, yr = make_regression(200, 8, random_state=2)
Xr = Xr.astype(np.float32)


def conv(est, X, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return to_onnx(est, X[:1], target_opset={"": 17, "ai.onnx.ml": 3}, **kw)


SKLEARN = {
    "logreg_pipeline": lambda: (Pipeline([("s", StandardScaler()), ("m", LogisticRegression(max_iter=500))]), Xm, ym),
    "rf_binary": lambda: (RandomForestClassifier(20, max_depth=6, random_state=0), Xc, yc),
    "rf_multiclass": lambda: (RandomForestClassifier(20, max_depth=6, random_state=0), Xm, ym),
    "rf_regressor": lambda: (RandomForestRegressor(20, max_depth=6, random_state=0), Xr, yr),
    "gb_regressor": lambda: (GradientBoostingRegressor(n_estimators=30, random_state=0), Xr, yr),
    "gb_classifier": lambda: (GradientBoostingClassifier(n_estimators=20, random_state=0), Xm, ym),
    "svc_proba": lambda: (SVC(probability=True, random_state=0), Xc, yc),
    "svr": lambda: (SVR(), Xr, yr),
    "linreg": lambda: (LinearRegression(), Xr, yr),
    "minmax_normalizer": lambda: (Pipeline([("a", MinMaxScaler()), ("b", Normalizer()), ("c", Binarizer(threshold=0.1))]), Xr, None),
}


@pytest.mark.parametrize("name", sorted(SKLEARN))
def test_sklearn(name):
    est, X, y = SKLEARN[name]()
    est.fit(X, y) if y is not None else est.fit(X)
    compare(conv(est, X), {"X": X[:50]})


@pytest.mark.parametrize("zipmap", [True, False])
def test_classifier_zipmap_on_and_off(zipmap):
    est = RandomForestClassifier(10, max_depth=4, random_state=0).fit(Xm, ym)
    options = None if zipmap else {id(est): {"zipmap": False}}
    compare(conv(est, Xm, options=options), {"X": Xm[:20]})


def test_string_labels():
    labels = np.array(["cat", "dog", "eel"])[ym]
    est = LogisticRegression(max_iter=500).fit(Xm, labels)
    out = compare(conv(est, Xm), {"X": Xm[:20]})
    assert set(out[0].tolist()) <= {"cat", "dog", "eel"}


def test_column_transformer_with_one_hot():
    rng = np.random.default_rng(0)
    num = rng.standard_normal((100, 3)).astype(np.float32)
    cat = rng.integers(0, 4, (100, 1)).astype(np.float32)
    X = np.hstack([num, cat])
    y = (num[:, 0] + cat[:, 0] > 1.5).astype(int)
    ct = ColumnTransformer([("num", StandardScaler(), [0, 1, 2]),
                            ("cat", OneHotEncoder(handle_unknown="ignore"), [3])])
    pipe = Pipeline([("ct", ct), ("m", LogisticRegression())]).fit(X, y)
    compare(conv(pipe, X), {"X": X[:40]})


lightgbm = pytest.importorskip("lightgbm", reason="lightgbm is a test-only dependency")
onnxmltools = pytest.importorskip("onnxmltools", reason="onnxmltools is a test-only dependency")


def _lgbm(kind):
    import lightgbm as lgb

    if kind == "classifier":
        return lgb.LGBMClassifier(n_estimators=100, num_leaves=15, verbose=-1).fit(Xm, ym), Xm
    if kind == "binary":
        return lgb.LGBMClassifier(n_estimators=100, num_leaves=15, verbose=-1).fit(Xc, yc), Xc
    return lgb.LGBMRegressor(n_estimators=100, num_leaves=15, verbose=-1).fit(Xr, yr), Xr


@pytest.mark.parametrize("kind", ["classifier", "binary", "regressor"])
def test_lightgbm(kind):
    from onnxmltools import convert_lightgbm
    from onnxmltools.convert.common.data_types import FloatTensorType as MLFloat

    est, X = _lgbm(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = convert_lightgbm(est, initial_types=[("X", MLFloat([None, X.shape[1]]))], target_opset=15,
                             zipmap=False)
    compare(m, {"X": X[:100]})


@pytest.mark.parametrize("kind", ["classifier", "binary", "regressor"])
def test_xgboost(kind):
    xgb = pytest.importorskip("xgboost", reason="xgboost is a test-only dependency")
    from onnxmltools import convert_xgboost
    from onnxmltools.convert.common.data_types import FloatTensorType as MLFloat

    if kind == "regressor":
        est, X = xgb.XGBRegressor(n_estimators=100, max_depth=4).fit(Xr, yr), Xr
    elif kind == "binary":
        est, X = xgb.XGBClassifier(n_estimators=100, max_depth=4).fit(Xc, yc), Xc
    else:
        est, X = xgb.XGBClassifier(n_estimators=100, max_depth=4).fit(Xm, ym), Xm
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = convert_xgboost(est, initial_types=[("X", MLFloat([None, X.shape[1]]))], target_opset=15)
    compare(m, {"X": X[:100]})
