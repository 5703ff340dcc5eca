"""Classic ML on CPU vs onnxruntime: scikit-learn models converted with skl2onnx, LightGBM and
XGBoost converted with onnxmltools.

Each model is fitted and converted once (module-scoped fixture) by ``models/builders.py``.
Labels must match onnxruntime's exactly, probabilities and values within rtol 1e-3 / atol 1e-4,
ZipMap outputs (lists of dicts) key by key; every node must run on the CPU provider.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sklearn", reason="scikit-learn is a test-only dependency")
pytest.importorskip("skl2onnx", reason="skl2onnx is a test-only dependency")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the test oracle")

import runtime_core as rt  # noqa: E402
from models import builders as B  # noqa: E402

RTOL, ATOL = 1e-3, 1e-4
CPU = "CPUExecutionProvider"

_NEEDS = {**{n: ("lightgbm", "onnxmltools") for n in B.LIGHTGBM_MODELS},
          **{n: ("xgboost", "onnxmltools") for n in B.XGBOOST_MODELS}}


@pytest.fixture(scope="module", params=B.CLASSIC_MODELS)
def classic(request):
    for mod in _NEEDS.get(request.param, ()):
        pytest.importorskip(mod, reason=f"{mod} is a test-only dependency")
    return B.build_classic(request.param)


class Oracle:
    def __init__(self, cm: B.ClassicModel):
        so = ort.SessionOptions()
        so.log_severity_level = 3
        self.sess = ort.InferenceSession(cm.model, so, providers=[CPU])
        self.out = self.sess.run(None, cm.feeds)


@pytest.fixture(scope="module")
def oracle(classic):
    return Oracle(classic)


def _kind(k):
    if isinstance(k, (str, np.str_)):
        return "str"
    if isinstance(k, (int, np.integer)):
        return "int"
    return type(k).__name__


def assert_zipmap_equal(ours, ref, name):
    """A ZipMap output: a list (one per row) of {class label: probability}."""
    assert isinstance(ours, list), f"{name}: ZipMap output is {type(ours).__name__}, onnxruntime gives a list"
    assert len(ours) == len(ref), f"{name}: {len(ours)} rows vs {len(ref)}"
    for row, (a, b) in enumerate(zip(ours, ref)):
        assert isinstance(a, dict), f"{name}[{row}] is {type(a).__name__}, not a dict"
        assert sorted(map(str, a)) == sorted(map(str, b)), f"{name}[{row}]: keys {list(a)} vs {list(b)}"
        assert {_kind(k) for k in a} == {_kind(k) for k in b}, f"{name}[{row}]: key types {list(a)} vs {list(b)}"
        for k in b:
            np.testing.assert_allclose(float(a[k]), float(b[k]), rtol=RTOL, atol=ATOL,
                                       err_msg=f"{name}[{row}][{k!r}]")


def assert_outputs_equal(ours, ref, names):
    assert len(ours) == len(ref), f"{len(ours)} outputs vs onnxruntime's {len(ref)}"
    for o, r, name in zip(ours, ref, names):
        if isinstance(r, list):
            assert_zipmap_equal(o, r, name)
            continue
        o, r = np.asarray(o), np.asarray(r)
        assert o.shape == r.shape, f"{name}: shape {o.shape} vs onnxruntime {r.shape}"
        if r.dtype.kind in "OUS":  # string labels: exact
            assert o.dtype.kind in "OUS", f"{name}: dtype {o.dtype} vs onnxruntime {r.dtype}"
            assert o.tolist() == r.tolist(), f"{name}: labels differ"
            continue
        assert o.dtype == r.dtype, f"{name}: dtype {o.dtype} vs onnxruntime {r.dtype}"
        if r.dtype.kind == "f":
            np.testing.assert_allclose(o, r, rtol=RTOL, atol=ATOL, err_msg=name)
        else:  # labels: exact
            np.testing.assert_array_equal(o, r, err_msg=name)


def test_matches_onnxruntime(classic, oracle):
    sess = rt.InferenceSession(classic.model, providers=[CPU])
    rep = sess.get_partition_report()
    assert rep.nodes, "the partition report lists no nodes"
    off = [(n.name, n.op_type, n.provider) for n in rep.nodes if n.provider != CPU]
    assert not off, f"nodes not on {CPU}: {off[:10]}"
    ours = sess.run(None, classic.feeds)
    assert_outputs_equal(ours, oracle.out, [o.name for o in oracle.sess.get_outputs()])


def test_single_row_and_output_subset(classic, oracle):
    """One row at a time, asking for the outputs in reverse order by name."""
    sess = rt.InferenceSession(classic.model, providers=[CPU])
    names = [o.name for o in oracle.sess.get_outputs()][::-1]
    row = {k: v[3:4] for k, v in classic.feeds.items()}
    assert_outputs_equal(sess.run(names, row), oracle.sess.run(names, row), names)


def test_session_metadata_matches_onnxruntime(classic, oracle):
    """get_inputs()/get_outputs(): the same names and type strings as onnxruntime (including
    ZipMap's ``seq(map(...))``)."""
    sess = rt.InferenceSession(classic.model, providers=[CPU])
    for ours, ref in ((sess.get_inputs(), oracle.sess.get_inputs()), (sess.get_outputs(), oracle.sess.get_outputs())):
        assert [(a.name, a.type) for a in ours] == [(b.name, b.type) for b in ref]


def test_onnxruntime_matches_estimator(classic, oracle):
    """The oracle agrees with the fitted estimator itself (guards the conversion, not
    runtime-core): labels on at least 95% of the rows, regression values close."""
    est = classic.estimator
    if classic.name.startswith("column_transformer_"):
        X = np.hstack([classic.feeds["num"].astype(object), classic.feeds["cat"]])
    else:
        X = classic.feeds["X"]
    if classic.name == "scalers_binarizer":
        want = est.transform(X)
    else:
        want = est.predict(X)
    got = oracle.out[0]
    if isinstance(got, np.ndarray) and got.dtype.kind == "f" and got.ndim == 2 and got.shape[1] == 1:
        got = got[:, 0]
    want = np.asarray(want)
    if want.dtype.kind == "f":
        close = np.isclose(np.asarray(got, dtype=np.float64), want, rtol=1e-3, atol=1e-3 * (np.abs(want).max() + 1))
        assert close.mean() >= 0.95, f"only {close.mean():.0%} of the values match the estimator"
    else:
        agree = np.asarray(got).astype(str) == want.astype(str)
        assert agree.mean() >= 0.95, f"only {agree.mean():.0%} of the labels match the estimator"


TREE_MODELS = [n for n in B.CLASSIC_MODELS if n.startswith(("rf_", "gb_", "lgbm_", "xgb_"))]


@pytest.mark.parametrize("name", TREE_MODELS)
def test_missing_values_match_onnxruntime(name):
    """NaN features follow each node's missing-value branch as in onnxruntime; the same session
    then runs a NaN-free batch (which skips the missing-value test) and still agrees."""
    for mod in _NEEDS.get(name, ()):
        pytest.importorskip(mod, reason=f"{mod} is a test-only dependency")
    cm = B.build_classic(name)
    X = np.array(cm.feeds["X"], dtype=np.float32)
    holes = X.copy()
    rows = np.arange(holes.shape[0])
    holes[rows % 3 == 0, 0] = np.nan
    holes[rows % 4 == 1, -1] = np.nan
    holes[rows % 5 == 2, :] = np.nan
    so = ort.SessionOptions()
    so.log_severity_level = 3
    ref = ort.InferenceSession(cm.model, so, providers=[CPU])
    sess = rt.InferenceSession(cm.model, providers=[CPU])
    names = [o.name for o in ref.get_outputs()]
    for feed in (holes, X):
        assert_outputs_equal(sess.run(None, {"X": feed}), ref.run(None, {"X": feed}), names)
