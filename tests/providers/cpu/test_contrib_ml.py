"""The com.microsoft ops scikit-learn converters emit (CDist, MurmurHash3, Tokenizer) and
ai.onnx.ml Scaler, against onnxruntime: one-node models built with onnx.helper, then whole
models from skl2onnx's converters."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import runtime_core as rt
from runtime_core.errors import PartitionError

ort = pytest.importorskip("onnxruntime")

MS = "com.microsoft"
rng = np.random.default_rng(37)


def _model(op, inputs, out_type, domain=MS, **attrs):
    names = [f"X{i}" for i in range(len(inputs))]
    node = h.make_node(op, names, ["Y"], domain=domain, **attrs)
    g = h.make_graph([node], "g", [h.make_tensor_value_info(n, t, None) for n, (t, _) in zip(names, inputs)],
                     [h.make_tensor_value_info("Y", out_type, None)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(domain, 1)])
    return m.SerializeToString(), {n: v for n, (_, v) in zip(names, inputs)}


def _both(model, feeds):
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    return want, got


# -- CDist ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,elem", [(np.float32, T.FLOAT), (np.float64, T.DOUBLE)])
@pytest.mark.parametrize("metric", [None, "sqeuclidean", "euclidean"])
def test_cdist_matches_onnxruntime(dtype, elem, metric):
    a = rng.standard_normal((9, 6)).astype(dtype)
    b = rng.standard_normal((5, 6)).astype(dtype)
    b[2] = a[4]  # a zero distance: the GEMM form's rounding must not give NaN
    attrs = {} if metric is None else {"metric": metric}
    (want,), (got,) = _both(*_model("CDist", [(elem, a), (elem, b)], elem, **attrs))
    assert got.dtype == want.dtype and got.shape == want.shape == (9, 5)
    tol = 1e-5 if dtype == np.float32 else 1e-7  # euclidean: sqrt of a rounding-level value at zero
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=tol)


def test_cdist_other_metric_declined_by_name():
    model, _ = _model("CDist", [(T.FLOAT, np.ones((2, 2), np.float32))] * 2, T.FLOAT, metric="cityblock")
    with pytest.raises(PartitionError, match="metric 'cityblock'"):
        rt.InferenceSession(model, providers=["CPUExecutionProvider"])


def test_cdist_with_an_attribute_its_schema_lacks_is_refused_at_load_as_by_onnxruntime():
    # skl2onnx writes p=3 beside metric="minkowski"; onnxruntime's schema has metric only
    model, _ = _model("CDist", [(T.FLOAT, None)] * 2, T.FLOAT, metric="minkowski", p=3.0)
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidGraph, match="Unrecognized attribute: p"):
        ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    with pytest.raises(rt.errors.InvalidModelError, match="Unrecognized attribute: p for operator CDist") as info:
        rt.InferenceSession(model, providers=["CPUExecutionProvider"])
    assert isinstance(info.value, rt.capi.onnxruntime_pybind11_state.InvalidGraph)


def test_cdist_mismatched_columns_is_a_typed_error():
    model, _ = _model("CDist", [(T.FLOAT, None), (T.FLOAT, None)], T.FLOAT)
    sess = rt.InferenceSession(model, providers=["CPUExecutionProvider"])
    with pytest.raises(rt.errors.ExecutionError, match="columns"):
        sess.run(None, {"X0": np.ones((2, 3), np.float32), "X1": np.ones((2, 4), np.float32)})


# -- MurmurHash3 ------------------------------------------------------------------------

_STRINGS = np.array(["", "a", "ab", "abc", "abcd", "abcde", "héllo wörld", "feature_12=3", "日本語"], dtype=object)


@pytest.mark.parametrize("seed", [0, 42, 2**31 + 5])
@pytest.mark.parametrize("positive", [1, 0, None])
@pytest.mark.parametrize("kind", ["string", "int32", "uint32"])
def test_murmurhash3_matches_onnxruntime(seed, positive, kind):
    if kind == "string":
        x, elem = _STRINGS.reshape(3, 3), T.STRING
    elif kind == "int32":
        x, elem = rng.integers(-2**31, 2**31, (4, 5)).astype(np.int32), T.INT32
    else:
        x, elem = rng.integers(0, 2**32, 17).astype(np.uint32), T.UINT32
    attrs = {"seed": seed}
    if positive is not None:
        attrs["positive"] = positive
    out = T.INT32 if positive == 0 else T.UINT32
    (want,), (got,) = _both(*_model("MurmurHash3", [(elem, x)], out, **attrs))
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_murmurhash3_float_input_declined():
    model, _ = _model("MurmurHash3", [(T.FLOAT, None)], T.UINT32)
    with pytest.raises(PartitionError, match="MurmurHash3: input dtype float32"):
        rt.InferenceSession(model, providers=["CPUExecutionProvider"])


# -- Tokenizer --------------------------------------------------------------------------

_TEXT = [["ab cd, éf", "a  bb"], ["", "xyz"]]
_TOKENIZER_CASES = [
    (_TEXT, {"mark": 0, "pad_value": "#", "mincharnum": 1, "separators": [" ", ","]}),
    (_TEXT, {"mark": 1, "pad_value": "#", "mincharnum": 2, "separators": [" ", ","]}),
    (_TEXT, {"mark": 0, "pad_value": "#", "mincharnum": 1, "tokenexp": r"\w\w+"}),
    (_TEXT, {"mark": 1, "pad_value": "#", "mincharnum": 1, "tokenexp": r"(\w)(\w+)"}),
    (_TEXT, {"mark": 0, "pad_value": "#", "mincharnum": 1, "tokenexp": r"[a-z]+", "separators": [" "]}),
    (_TEXT, {"mark": 0, "pad_value": "#", "mincharnum": 1, "separators": [""]}),
    (["ab", "c"], {"mark": 1, "pad_value": "#", "mincharnum": 1, "separators": [""]}),
    (["Hello World-foo", "x"], {"mark": 1, "pad_value": "#", "mincharnum": 1, "tokenexp": "."}),
    (["ab  cd"], {"mark": 0, "pad_value": "#", "mincharnum": 1, "separators": ["a", "b c"]}),
    (["", ""], {"mark": 1, "pad_value": "#", "mincharnum": 1, "separators": [" "]}),
    (["a b", "c"], {"mark": 0, "pad_value": "#", "mincharnum": 3, "separators": [" "]}),
    (["abab", "c"], {"mark": 0, "pad_value": "#", "mincharnum": 1, "tokenexp": "x*"}),
    (["aaa bab", "c"], {"mark": 0, "pad_value": "#", "mincharnum": 2, "tokenexp": "a+"}),
    (["a.b;c d", "x..y"], {"mark": 0, "pad_value": "", "mincharnum": 1, "separators": [" ", "[.]", ";", "\\?"]}),
    ([["a b"]], {"mark": 0, "pad_value": "#", "mincharnum": 1, "separators": [" +"]}),
]


@pytest.mark.parametrize("text,attrs", _TOKENIZER_CASES)
def test_tokenizer_matches_onnxruntime(text, attrs):
    x = np.array(text, dtype=object)
    (want,), (got,) = _both(*_model("Tokenizer", [(T.STRING, x)], T.STRING, **attrs))
    assert got.shape == want.shape
    assert got.tolist() == want.tolist()


def test_tokenizer_alternation_declined_with_reason():
    model, _ = _model("Tokenizer", [(T.STRING, None)], T.STRING, mark=0, pad_value="#", mincharnum=1,
                      separators=["a|ab"])
    with pytest.raises(PartitionError, match="alternation"):
        rt.InferenceSession(model, providers=["CPUExecutionProvider"])


# -- Scaler on every type onnxruntime registers --------------------------------------------

@pytest.mark.parametrize("dtype,elem", [(np.float32, T.FLOAT), (np.float64, T.DOUBLE),
                                        (np.int64, T.INT64), (np.int32, T.INT32)])
def test_scaler_types_match_onnxruntime(dtype, elem):
    x = (rng.standard_normal((6, 3)) * 10).astype(dtype)
    (want,), (got,) = _both(*_model("Scaler", [(elem, x)], T.FLOAT, domain="ai.onnx.ml",
                                    offset=[1.5, -2.0, 0.25], scale=[0.5, 2.0, -1.0]))
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6)


# -- through skl2onnx's converters -----------------------------------------------------------

skl2onnx = pytest.importorskip("skl2onnx")


def test_local_outlier_factor_with_cdist():
    from sklearn.neighbors import LocalOutlierFactor

    x = rng.standard_normal((40, 3)).astype(np.float32)
    lof = LocalOutlierFactor(n_neighbors=5, novelty=True).fit(x)
    onx = skl2onnx.to_onnx(lof, x, target_opset=18, options={"optim": "cdist"})
    assert any(n.op_type == "CDist" for n in onx.graph.node)
    model = onx.SerializeToString()
    feeds = {"X": (x + 0.05).astype(np.float32)}
    want, got = _both(model, feeds)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(got[0].ravel(), lof.predict(feeds["X"]))


def test_feature_hasher():
    from skl2onnx.common.data_types import StringTensorType
    from sklearn.feature_extraction import FeatureHasher

    words = np.array([["cat"], ["dog"], ["pélican"], ["cat"], [""], ["a much longer string, with spaces"]])
    hasher = FeatureHasher(n_features=16, input_type="string", alternate_sign=True)
    hasher.fit(words)
    onx = skl2onnx.convert_sklearn(hasher, "fh", [("input", StringTensorType([None, 1]))], target_opset=18)
    assert any(n.op_type == "MurmurHash3" for n in onx.graph.node)
    want, got = _both(onx.SerializeToString(), {"input": words})
    np.testing.assert_allclose(got[0], want[0])
    np.testing.assert_allclose(got[0], hasher.transform(words).toarray(), rtol=1e-6)


@pytest.mark.parametrize("options", [{"tokenexp": r"\w+"}, {"tokenexp": None},
                                     {"separators": [" ", "[.]", "\\?", ",", ";", ":", "\\!"]}])
def test_text_pipeline_with_tokenizer(options):
    from skl2onnx.common.data_types import StringTensorType
    from sklearn.feature_extraction.text import TfidfVectorizer

    corpus = np.array(["This is the first document.", "This document is the second document.",
                       "And this is the third one.", "Is this the first document?"]).reshape(-1, 1)
    tfidf = TfidfVectorizer(lowercase=False).fit(corpus.ravel())  # onnxruntime lowercases only with a locale
    onx = skl2onnx.convert_sklearn(tfidf, "t", [("input", StringTensorType([None, 1]))],
                                   options={TfidfVectorizer: options}, target_opset=18)
    assert any(n.op_type == "Tokenizer" for n in onx.graph.node)
    want, got = _both(onx.SerializeToString(), {"input": corpus})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[0], tfidf.transform(corpus.ravel()).toarray(), rtol=1e-5, atol=1e-6)
