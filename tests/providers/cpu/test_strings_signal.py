"""String, signal, random and image kernels against onnxruntime (or onnx's reference), beyond
what the backend suite covers: non-ASCII text, larger transforms, other lengths and types."""

import io

import numpy as np
import pytest
from onnx import TensorProto, helper

from oracle import assert_close, check_node, make_model, run_oracle, run_ours

rng = np.random.default_rng(11)


def S(*vals, shape=None):
    a = np.array(list(vals), dtype=object)
    return a.reshape(shape) if shape else a


# ---------------------------------------------------------------------------------------
# strings
# ---------------------------------------------------------------------------------------

# onnxruntime's StringNormalizer needs the en_US.UTF-8 system locale (often not installed)
# and onnx's reference strips accents and splits on spaces, which the spec does not say:
# expected values here are written out from the spec.
_SN_X = ["Über", "straße", "ÉCOLE", "naïve", "Ελλάδα", "привет", "ПРИВЕТ", "", "über"]


def _sn(x, shape=None, **attrs):
    x = S(*x, shape=shape)
    node = helper.make_node("StringNormalizer", ["x"], ["y"], **attrs)
    m = make_model([node], {"x": x}, ["y"], opset=17)
    (y,), _ = run_ours(m, {"x": x})
    assert y.dtype == object
    return y


@pytest.mark.parametrize("action,sensitive,expected", [
    ("LOWER", 1, ["Über", "straße", "ÉCOLE", "naïve", "Ελλάδα", "ПРИВЕТ", ""]),
    ("LOWER", 0, ["straße", "ÉCOLE", "naïve", "Ελλάδα", ""]),
    ("UPPER", 0, ["STRASSE", "ÉCOLE", "NAÏVE", "ΕΛΛΆΔΑ", ""]),
    ("NONE", 1, ["Über", "straße", "ÉCOLE", "naïve", "Ελλάδα", "ПРИВЕТ", ""]),
    ("NONE", 0, ["straße", "ÉCOLE", "naïve", "Ελλάδα", ""]),
])
def test_string_normalizer_non_ascii(action, sensitive, expected):
    y = _sn(_SN_X, shape=(1, 9), case_change_action=action, is_case_sensitive=sensitive,
            stopwords=["über", "привет"])
    if action == "LOWER":
        expected = [e.lower() for e in expected]
    assert y.shape == (1, len(expected)) and y.tolist() == [expected]


def test_string_normalizer_no_stopwords_unicode():
    y = _sn(["Ǆemal", "ÀÉÎÕÜ", "日本語", "ΑΒΓ"], case_change_action="LOWER")
    assert y.tolist() == ["ǆemal", "àéîõü", "日本語", "αβγ"]


def test_string_normalizer_all_removed():
    assert _sn(["A", "a"], shape=(1, 2), case_change_action="LOWER", stopwords=["a"]).tolist() == [[""]]
    assert _sn(["A", "a"], stopwords=["a"]).tolist() == [""]
    assert _sn(["A", "a"], is_case_sensitive=1, stopwords=["a"]).tolist() == ["A"]


def test_string_normalizer_full_case_mapping():
    # Python's full Unicode mapping, independent of installed locales (documented difference
    # with onnxruntime's simple per-character mapping)
    node = helper.make_node("StringNormalizer", ["x"], ["y"], case_change_action="UPPER")
    m = make_model([node], {"x": S("straße")}, ["y"], opset=17)
    (y,), _ = run_ours(m, {"x": S("straße")})
    assert y.tolist() == ["STRASSE"]


def test_string_normalizer_turkish_locale_declined():
    node = helper.make_node("StringNormalizer", ["x"], ["y"], case_change_action="UPPER", locale="tr_TR")
    m = make_model([node], {"x": S("i")}, ["y"], opset=17)
    with pytest.raises(Exception, match="locale"):
        run_ours(m, {"x": S("i")})


@pytest.mark.parametrize("attrs", [{}, {"delimiter": ","}, {"delimiter": ", "}, {"maxsplit": 1},
                                   {"delimiter": "é", "maxsplit": 2}])
def test_string_split(attrs):
    x = S("a,b,,c", " x  y z ", "", "日本,語, été", "éaébéc", ",", shape=(2, 3))
    check_node("StringSplit", {"x": x}, outputs=("y", "n"), opset=20, **attrs)


def test_string_split_unicode_whitespace():
    # the spec's "whitespace characters" (onnxruntime splits on ' ' only)
    x = S("a\tb\u3000 c\n", " x y  z \t")
    node = helper.make_node("StringSplit", ["x"], ["y", "n"], maxsplit=1)
    m = make_model([node], {"x": x}, ["y", "n"], opset=20)
    (y, n), _ = run_ours(m, {"x": x})
    assert y.tolist() == [["a", "b\u3000 c"], ["x", "y  z"]] and n.tolist() == [2, 2]


def test_string_concat_broadcast_unicode():
    a = S("α", "b", "", "日", shape=(4, 1))
    b = S("-x", "β", shape=(1, 2))
    check_node("StringConcat", {"a": a, "b": b}, outputs=("c",), opset=20)


@pytest.mark.parametrize("pattern", [r"\d+", r"[a-z]+@[a-z]+\.(com|org)", r"(?i)hello", r"ab*c?",
                                     r".{2,3}", r"\w+\s\w+", r"[^\d]*"])
def test_regex_full_match(pattern):
    x = S("123", "abc@def.com", "HeLLo", "abbb", "日本", "a b", "٣٤", "x y z", "", "ab\n", shape=(2, 5))
    check_node("RegexFullMatch", {"x": x}, opset=20, pattern=pattern)


@pytest.mark.parametrize("pattern", [r"(a)\1", r"a(?=b)", r"(?<!x)y", r"\p{L}+", r"(?>a+)"])
def test_regex_non_re2_declined(pattern):
    node = helper.make_node("RegexFullMatch", ["x"], ["y"], pattern=pattern)
    m = make_model([node], {"x": S("ab")}, ["y"], opset=20)
    with pytest.raises(Exception, match="pattern"):
        run_ours(m, {"x": S("ab")})


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("skip,minn,maxn", [(0, 1, 1), (0, 1, 3), (2, 2, 3), (3, 1, 2)])
def test_tfidf_int(mode, skip, minn, maxn):
    x = rng.integers(0, 6, (3, 17)).astype(np.int64)
    pool = [1, 2, 3, 4, 5,  1, 2, 2, 3, 3, 1, 4, 4, 5,  1, 2, 3, 2, 3, 1]
    counts = [0, 5, 14]
    idx = list(range(5 + 4 + 2))
    w = [0.5 + 0.1 * i for i in range(len(idx))]
    check_node("TfIdfVectorizer", {"x": x}, opset=17, mode=mode, min_gram_length=minn,
               max_gram_length=maxn, max_skip_count=skip, ngram_counts=counts, ngram_indexes=idx,
               pool_int64s=pool, weights=w)


def test_tfidf_strings_1d():
    words = np.array(["a", "b", "c", "é", "日"], dtype=object)
    x = words[rng.integers(0, 5, 30)]
    check_node("TfIdfVectorizer", {"x": x}, opset=17, mode="TF", min_gram_length=1,
               max_gram_length=2, max_skip_count=2, ngram_counts=[0, 3],
               ngram_indexes=[4, 3, 2, 1, 0], pool_strings=["a", "é", "日", "a", "b", "c", "é"])


# ---------------------------------------------------------------------------------------
# signal
# ---------------------------------------------------------------------------------------

def _i64(v):
    return np.array(v, dtype=np.int64)


def _check_inputs(op, names, inputs, initializers, opset, rtol, atol, oracle=None, **attrs):
    """Like check_node, with explicit node input names ("" for an omitted optional input)."""
    node = helper.make_node(op, names, ["y"], **attrs)
    m = make_model([node], inputs, ["y"], opset=opset, initializers=initializers)
    ours, sess = run_ours(m, dict(inputs))
    assert all(n.provider == "CPUExecutionProvider" for n in sess.get_partition_report().nodes)
    if oracle == "reference":
        from onnx.reference import ReferenceEvaluator

        ref = ReferenceEvaluator(m).run(None, dict(inputs))
    else:
        ref = run_oracle(m, dict(inputs))
    assert_close(ours, ref, rtol, atol)


@pytest.mark.parametrize("inverse,onesided,complex_in", [(0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 1), (1, 1, 1)])
@pytest.mark.parametrize("axis", [1, -2, 2])
@pytest.mark.parametrize("length", [None, 37, 96])
def test_dft_20_big(inverse, onesided, complex_in, axis, length):
    x = rng.standard_normal((2, 64, 48, 2 if complex_in else 1)).astype(np.float32)
    init = {"axis": _i64(axis)}
    if length is not None:
        init["n"] = _i64(length)
    names = ["x", "n" if length is not None else "", "axis"]
    # onnxruntime's IRFFT with a dft_length other than 2 * (bins - 1) or 2 * (bins - 1) + 1 does
    # not follow numpy's irfft (truncate / zero-pad the one-sided bins): onnx's reference does
    oracle = "reference" if inverse and onesided and length is not None else None
    _check_inputs("DFT", names, {"x": x}, init, 20, 1e-3, 2e-3, oracle=oracle, inverse=inverse,
                  onesided=onesided)


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
@pytest.mark.parametrize("onesided", [0, 1])
def test_dft_17_dtypes(dtype, onesided):
    x = rng.standard_normal((3, 50, 1)).astype(dtype)
    tol = 2e-2 if dtype == np.float16 else 1e-9
    check_node("DFT", {"x": x}, opset=17, initializers={"n": _i64(64)}, axis=1, onesided=onesided,
               rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("onesided", [0, 1])
@pytest.mark.parametrize("with_window", [False, True])
def test_stft_big(onesided, with_window):
    x = rng.standard_normal((2, 1000, 1)).astype(np.float32)
    init = {"step": _i64(37)}
    if with_window:
        init["win"] = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(128) / 128)).astype(np.float32)
    else:
        init["win"] = np.ones(128, np.float32)
    init["len"] = _i64(128)
    check_node("STFT", {"x": x}, opset=17, initializers=init, onesided=onesided, rtol=1e-3, atol=1e-3)


def test_stft_complex():
    x = rng.standard_normal((1, 300, 2)).astype(np.float64)
    init = {"step": _i64(20), "win": np.hanning(64).astype(np.float64)}
    check_node("STFT", {"x": x}, opset=17, initializers=init, onesided=0, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("odt", [TensorProto.FLOAT, TensorProto.DOUBLE])
def test_windows(op, periodic, odt):
    check_node(op, {}, opset=17, initializers={"size": _i64(257)}, periodic=periodic, output_datatype=odt,
               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bins,dft,sr,lo,hi", [(8, 256, 8000, 0.0, 4000.0), (40, 512, 16000, 20.0, 7600.0),
                                              (13, 1024, 22050, 100.0, 11025.0)])
def test_mel_weight_matrix(bins, dft, sr, lo, hi):
    init = {"bins": _i64(bins), "dft": _i64(dft), "sr": _i64(sr), "lo": np.array(lo, np.float32),
            "hi": np.array(hi, np.float32)}
    check_node("MelWeightMatrix", {}, opset=17, initializers=init, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------
# random (values depend on the generator: check shapes, dtypes, ranges, seeding)
# ---------------------------------------------------------------------------------------

def _run1(node, inputs, opset=22):
    m = make_model([node], inputs, ["y"], opset=opset)
    (y,), _ = run_ours(m, inputs)
    return y


def test_random_uniform_seeded_repeatable():
    node = helper.make_node("RandomUniform", [], ["y"], shape=[50, 40], low=-2.0, high=3.0, seed=5.0,
                            dtype=TensorProto.DOUBLE)
    a, b = _run1(node, {}), _run1(node, {})
    assert a.dtype == np.float64 and a.shape == (50, 40)
    assert np.array_equal(a, b) and a.min() >= -2.0 and a.max() < 3.0 and abs(a.mean() - 0.5) < 0.1


def test_random_normal_like_stats():
    x = np.zeros((200, 100), np.float16)
    node = helper.make_node("RandomNormalLike", ["x"], ["y"], mean=1.0, scale=2.0)
    y = _run1(node, {"x": x})
    assert y.dtype == np.float16 and abs(float(y.astype(np.float32).mean()) - 1.0) < 0.05
    assert abs(float(y.astype(np.float32).std()) - 2.0) < 0.05


def test_bernoulli_probabilities():
    p = np.repeat(np.array([[0.0, 0.25, 1.0]], np.float32), 4000, axis=0)
    node = helper.make_node("Bernoulli", ["x"], ["y"], dtype=TensorProto.INT32)
    y = _run1(node, {"x": p})
    assert y.dtype == np.int32 and y.shape == p.shape
    assert (y[:, 0] == 0).all() and (y[:, 2] == 1).all() and abs(y[:, 1].mean() - 0.25) < 0.03


def test_multinomial_distribution():
    logits = np.log(np.array([[0.1, 0.2, 0.7], [1.0, 1e-9, 1e-9]], np.float32))
    node = helper.make_node("Multinomial", ["x"], ["y"], sample_size=5000, seed=1.0)
    y = _run1(node, {"x": logits})
    assert y.dtype == np.int32 and y.shape == (2, 5000)
    freq = np.bincount(y[0], minlength=3) / 5000
    assert np.allclose(freq, [0.1, 0.2, 0.7], atol=0.03) and (y[1] == 0).mean() > 0.999


# ---------------------------------------------------------------------------------------
# image
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["PNG", "BMP", "TIFF", "PPM"])
@pytest.mark.parametrize("pixel_format", ["RGB", "BGR", "Grayscale"])
def test_image_decoder_lossless(fmt, pixel_format):
    Image = pytest.importorskip("PIL.Image")
    img = rng.integers(0, 256, (23, 31, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format=fmt)
    data = np.frombuffer(buf.getvalue(), np.uint8)
    node = helper.make_node("ImageDecoder", ["x"], ["y"], pixel_format=pixel_format)
    y = _run1(node, {"x": data}, opset=20)
    if pixel_format == "RGB":
        assert np.array_equal(y, img)
    elif pixel_format == "BGR":
        assert np.array_equal(y, img[:, :, ::-1])
    else:
        assert y.shape == (23, 31, 1)
        lum = (img[..., 0].astype(int) * 299 + img[..., 1].astype(int) * 587 + img[..., 2].astype(int) * 114) / 1000.0
        assert np.abs(y[..., 0].astype(float) - lum).max() <= 1.0


def test_image_decoder_garbage_is_empty():
    Image = pytest.importorskip("PIL.Image")
    buf = io.BytesIO()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(buf, format="GIF")  # not a spec format
    node = helper.make_node("ImageDecoder", ["x"], ["y"], pixel_format="RGB")
    for data in (np.arange(50, dtype=np.uint8), np.frombuffer(buf.getvalue(), np.uint8)):
        y = _run1(node, {"x": data}, opset=20)
        assert y.shape == (0, 0, 3) and y.dtype == np.uint8


def test_image_decoder_jpeg_close_to_pillow():
    Image = pytest.importorskip("PIL.Image")
    img = np.repeat(np.repeat(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), 6, 0), 6, 1)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=95, subsampling=0)
    node = helper.make_node("ImageDecoder", ["x"], ["y"], pixel_format="RGB")
    y = _run1(node, {"x": np.frombuffer(buf.getvalue(), np.uint8)}, opset=20)
    assert y.shape == (48, 48, 3) and np.abs(y.astype(int) - img).mean() < 4
