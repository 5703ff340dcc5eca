"""Calibration work saved without changing a result: a rearranged tensor (Reshape, Transpose,
Identity, ...) takes its calibrated source's range instead of being fetched and binned, and a
tensor computed from initializers only is measured once. Every method's ranges, histograms
and statistics must be bit for bit those of calibrating every tensor in every batch."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from runtime_core.quantization import CalibrationMethod
from runtime_core.quantization import calibrate as C

METHODS = [(CalibrationMethod.MinMax, {}), (CalibrationMethod.MinMax, {"moving_average": True}),
           (CalibrationMethod.MinMax, {"symmetric": True}), (CalibrationMethod.Percentile, {}),
           (CalibrationMethod.Percentile, {"symmetric": False}), (CalibrationMethod.Entropy, {}),
           (CalibrationMethod.Distribution, {})]


class Feeds:
    def __init__(self, feeds):
        self.it = iter(feeds)

    def get_next(self):
        return next(self.it, None)


def encoder() -> onnx.ModelProto:
    """Two cloned torch TransformerEncoder layers: the exporter turns the second layer's
    (identical) weights into Identity nodes, and attention reshapes and transposes."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(enc, (torch.randn(1, 6, 16),), buf, dynamo=False, opset_version=17, input_names=["x"])
    return onnx.shape_inference.infer_shapes(onnx.load_from_string(buf.getvalue()))


def helper_model() -> onnx.ModelProto:
    """Constants made by arithmetic on initializers, a Constant node, a fed initializer (a
    default the user may override), a NaN-bearing constant and a chain of rearrangements."""
    w = np.array([[0.5, -2.0, 1.0], [3.0, 0.25, -1.5]], np.float32)
    nanw = np.array([np.nan, 1.0, -4.0, np.nan, 2.0, 0.0], np.float32).reshape(2, 3)
    inits = [nh.from_array(w, "w"), nh.from_array(nanw, "nanw"), nh.from_array(np.float32(1.5), "bias"),
             nh.from_array(np.array([3, 2], np.int64), "shape")]
    nodes = [h.make_node("Constant", [], ["c"], value=nh.from_array(np.full((2, 3), 0.75, np.float32))),
             h.make_node("Mul", ["w", "c"], ["wc"]),            # constant: initializer x Constant
             h.make_node("Transpose", ["wc"], ["wct"]),         # constant, and a rearrangement of wc
             h.make_node("Add", ["nanw", "wc"], ["nanc"]),      # a constant with NaNs
             h.make_node("Add", ["x", "wc"], ["xa"]),
             h.make_node("Add", ["xa", "bias"], ["xb"]),        # bias is fed: not constant
             h.make_node("Reshape", ["xb", "shape"], ["xr"]),
             h.make_node("Transpose", ["xr"], ["xt"]),          # a chain back to xb
             h.make_node("Mul", ["xt", "wc"], ["p"]),
             h.make_node("Add", ["xr", "wct"], ["q"]),
             h.make_node("Add", ["p", "nanc"], ["y"], name="y_add")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [2, 3]),
                                  h.make_tensor_value_info("bias", T.FLOAT, [])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2, 3]), h.make_tensor_value_info("q", T.FLOAT, [3, 2])],
                     inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    return onnx.shape_inference.infer_shapes(m)


def calibrate(model, method, opts, feeds, share: bool, monkeypatch):
    from runtime_provider_cpu.fast.policy import installed

    with monkeypatch.context() as mp:
        if not share:  # the plain way: every tensor fetched and binned in every batch
            mp.setattr(C, "value_aliases", lambda m, t: {})
            mp.setattr(C, "constant_tensors", lambda m: set())
        cal = C.create_calibrator(model, None, method, extra_options=opts, progress=False)
    # the two augmented graphs differ (a weight behind an Identity that is an output is not a
    # constant there), so measured kernel choices may differ by an ulp: the library call in both
    with installed(linear_kernel="blas", mha_kernel="numpy"):
        cal.collect_data(Feeds(feeds))
    return cal, cal.compute_data()


def same(a, b):
    if a is None or b is None:
        return a is None and b is None
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def assert_identical(fast, ref):
    assert list(fast) == list(ref)
    for k in ref:
        for f in ("lowest", "highest", "hist", "hist_edges", "avg", "std"):
            assert same(getattr(fast[k], f), getattr(ref[k], f)), (k, f)


@pytest.fixture(scope="module")
def enc():
    return encoder()


@pytest.mark.parametrize("method,opts", METHODS, ids=lambda v: getattr(v, "name", str(v)))
def test_encoder_ranges_identical_to_calibrating_every_tensor(enc, method, opts, monkeypatch):
    r = np.random.default_rng(3)
    # the input scale grows and shrinks, so that histograms widen across batches
    feeds = [{"x": (s * r.normal(0, 1, (1, 6, 16))).astype(np.float32)} for s in (1.0, 5.0, 0.2, 12.0)]
    cal, fast = calibrate(enc, method, opts, feeds, True, monkeypatch)
    plain, ref = calibrate(enc, method, opts, feeds, False, monkeypatch)
    assert len(cal.aliases) >= 8 and sum(cal.constant) >= 8  # the saving is there to test
    assert len(cal.output_names) + len(cal.aliases) == len(plain.output_names) == len(ref)
    assert_identical(fast, ref)


@pytest.mark.parametrize("method,opts", METHODS, ids=lambda v: getattr(v, "name", str(v)))
def test_helper_model_ranges_identical(method, opts, monkeypatch):
    m = helper_model()
    r = np.random.default_rng(4)
    feeds = [{"x": (s * r.normal(0, 1, (2, 3))).astype(np.float32), "bias": np.float32(b)}
             for s, b in ((1.0, 0.0), (8.0, -3.0), (0.1, 40.0))]
    cal, fast = calibrate(m, method, opts, feeds, True, monkeypatch)
    _, ref = calibrate(m, method, opts, feeds, False, monkeypatch)
    assert cal.aliases == {"wct": "wc", "xr": "xb", "xt": "xb"}
    assert {n for n, c in zip(cal.output_names, cal.constant) if c} == {"c", "wc", "nanc"}
    assert_identical(fast, ref)


def test_constant_and_alias_detection_is_conservative():
    m = helper_model()
    const = C.constant_tensors(m)
    assert {"w", "nanw", "c", "wc", "wct", "nanc"} <= const
    assert not const & {"x", "bias", "xa", "xb", "xr", "xt", "p", "q", "y"}
    # a random op on constants, and a node of another domain, are not constant
    g = m.graph
    g.node.extend([h.make_node("RandomUniformLike", ["w"], ["rnd"]),
                   h.make_node("Custom", ["w"], ["cus"], domain="example.custom"),
                   h.make_node("Identity", ["rnd"], ["rndi"])])
    const = C.constant_tensors(m)
    assert not const & {"rnd", "cus", "rndi"}
    # a rearrangement of a tensor that is not calibrated is calibrated itself
    assert C.value_aliases(m, ["xr", "xt"]) == {"xt": "xr"}
    assert C.value_aliases(m, ["xb", "xt"]) == {}
