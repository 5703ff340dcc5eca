"""runtime_core.quantization against onnxruntime's own tool: same settings and calibration
data give models whose outputs agree within one quantization step (both run in
onnxruntime), our models run on runtime_core, and onnxruntime's quantized models run on
runtime_core with onnxruntime's results."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the test oracle")
oq = pytest.importorskip("onnxruntime.quantization")

sys.path.insert(0, str(Path(__file__).parent))
import quant_models as M  # noqa: E402

import runtime_core as rt  # noqa: E402
from runtime_core import quantization as rq  # noqa: E402
from runtime_core.errors import InvalidArgumentError  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.WARNING)  # onnxruntime's tool asks for pre-processing on every call
    yield
    logging.disable(logging.NOTSET)


class Reader:
    def __init__(self, feeds):
        self.it = iter(feeds)

    def get_next(self):
        return next(self.it, None)


def ort_run(path, feed, optimize=True):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if not optimize:  # Q/DQ computed as written (no int8 fusion): what runtime_core computes
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feed)[0]


def out_step(path, name) -> float:
    """The output's quantization step in a QDQ/QOperator model (0 when it is not quantized)."""
    m = onnx.load(str(path))
    for t in m.graph.initializer:
        if t.name in (name + "_scale",):
            return float(onnx.numpy_helper.to_array(t).max())
    return 0.0


def quantize_both(src, tmp, mode, feeds, **kw):
    ours, theirs = tmp / "ours.onnx", tmp / "theirs.onnx"
    if mode == "dynamic":
        rq.quantize_dynamic(src, ours, **kw)
        oq.quantize_dynamic(src, theirs, **kw)
    else:
        fmt = kw.pop("quant_format")
        rq.quantize_static(src, ours, Reader(feeds), quant_format=getattr(rq.QuantFormat, fmt), **kw)
        oq.quantize_static(src, theirs, Reader(feeds), quant_format=getattr(oq.QuantFormat, fmt),
                           **{k: (getattr(oq.CalibrationMethod, v.name) if k == "calibrate_method" else v)
                              for k, v in kw.items()})
    return ours, theirs


def op_counts(path):
    from collections import Counter

    return Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def check_pair(ours, theirs, feed, same_graph=True, ours_on_rt=True, theirs_on_rt=None):
    a, b = ort_run(ours, feed), ort_run(theirs, feed)
    step = max(out_step(theirs, "y"), 1e-6)
    assert np.abs(a - b).max() <= step + 1e-5, (np.abs(a - b).max(), step)
    if same_graph:
        assert op_counts(ours) == op_counts(theirs)
    if ours_on_rt:  # our model on runtime_core vs onnxruntime computing the same Q/DQ graph
        r = rt.InferenceSession(str(ours)).run(None, feed)[0]
        assert np.abs(r - ort_run(ours, feed, optimize=False)).max() <= step + 1e-5
    # the other direction: onnxruntime's quantized model on runtime_core
    r = rt.InferenceSession(str(theirs)).run(None, feed)[0] if (ours_on_rt if theirs_on_rt is None
                                                                else theirs_on_rt) else None
    if r is not None:
        assert np.abs(r - ort_run(theirs, feed, optimize=False)).max() <= step + 1e-5


@pytest.fixture(scope="module")
def cnn_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("cnn") / "cnn.onnx"
    onnx.save(M.cnn(), p)
    return p


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_cnn_static_qdq(cnn_path, tmp_path, per_channel):
    ours, theirs = quantize_both(cnn_path, tmp_path, "static", M.cnn_feeds(4), quant_format="QDQ",
                                 per_channel=per_channel)
    check_pair(ours, theirs, M.cnn_feeds(1, seed=7)[0])
    assert "Relu" not in op_counts(ours)  # folded into the zero point, as onnxruntime does


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_cnn_static_qoperator(cnn_path, tmp_path, per_channel):
    ours, theirs = quantize_both(cnn_path, tmp_path, "static", M.cnn_feeds(4), quant_format="QOperator",
                                 per_channel=per_channel, activation_type=rq.QuantType.QUInt8)
    check_pair(ours, theirs, M.cnn_feeds(1, seed=7)[0])  # QGemm / QLinearAdd: ops/quant_contrib.py
    assert {"QLinearConv", "QGemm", "QLinearAdd"} <= set(op_counts(ours))


def test_cnn_qoperator_standard_ops_run_on_runtime_core(cnn_path, tmp_path):
    ours, theirs = quantize_both(cnn_path, tmp_path, "static", M.cnn_feeds(3), quant_format="QOperator",
                                 per_channel=True, activation_type=rq.QuantType.QUInt8,
                                 op_types_to_quantize=["Conv", "Relu", "MaxPool"])
    feed = M.cnn_feeds(1, seed=7)[0]
    assert op_counts(ours) == op_counts(theirs)
    for p in (ours, theirs):
        r = rt.InferenceSession(str(p)).run(None, feed)[0]
        np.testing.assert_allclose(r, ort_run(p, feed, optimize=False), atol=1e-4)


def test_cnn_dynamic(cnn_path, tmp_path):
    ours, theirs = quantize_both(cnn_path, tmp_path, "dynamic", None)
    feed = M.cnn_feeds(1, seed=7)[0]
    check_pair(ours, theirs, feed)
    assert {"ConvInteger", "MatMulInteger", "DynamicQuantizeLinear"} <= set(op_counts(ours))


BLOCKS = [("bert", "torchscript"), ("gpt", "torchscript"), ("gpt", "dynamo")]  # dynamo exports cost seconds each


@pytest.fixture(scope="module", params=BLOCKS, ids=["-".join(b) for b in BLOCKS])
def block_path(request, tmp_path_factory):
    pytest.importorskip("torch")
    if request.param[1] == "dynamo":
        pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
    p = tmp_path_factory.mktemp("blk") / "block.onnx"
    onnx.save(M.torch_block(*request.param), p)
    return p, request.param


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_block_dynamic(block_path, tmp_path, per_channel):
    path, _ = block_path
    ours, theirs = quantize_both(path, tmp_path, "dynamic", None, per_channel=per_channel)
    check_pair(ours, theirs, M.block_feeds(1, seed=9)[0])
    assert op_counts(ours)["MatMulInteger"] == 4


def test_block_static_qdq(block_path, tmp_path):
    path, _ = block_path  # torchscript's scalar Constants get Q/DQ (as in onnxruntime): 0-d QuantizeLinear
    ours, theirs = quantize_both(path, tmp_path, "static", M.block_feeds(4), quant_format="QDQ", per_channel=True)
    a, b = ort_run(ours, M.block_feeds(1, seed=9)[0]), ort_run(theirs, M.block_feeds(1, seed=9)[0])
    assert np.abs(a - b).max() <= out_step(theirs, "y") + 1e-5
    check_pair(ours, theirs, M.block_feeds(1, seed=9)[0], same_graph=False)


def test_block_static_qoperator_matches_ort(block_path, tmp_path):
    path, _ = block_path
    ours, theirs = quantize_both(path, tmp_path, "static", M.block_feeds(3), quant_format="QOperator",
                                 activation_type=rq.QuantType.QUInt8)
    check_pair(ours, theirs, M.block_feeds(1, seed=9)[0])
    assert {"QLinearMatMul", "QLinearSoftmax", "QLinearAdd"} <= set(op_counts(ours))


@pytest.mark.parametrize("act", ["QUInt8", "QInt8"])
def test_qoperator_activation_and_pool_ops(tmp_path, act):
    path = tmp_path / "u.onnx"
    onnx.save(M.unary_ops(), path)
    feeds = M.unary_feeds(4)
    ours, theirs = quantize_both(path, tmp_path, "static", feeds, quant_format="QOperator",
                                 activation_type=getattr(rq.QuantType, act))
    check_pair(ours, theirs, M.unary_feeds(1, seed=3)[0])
    assert {"QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat", "QLinearAveragePool",
            "QLinearGlobalAveragePool", "QLinearSoftmax", "Split", "Pad"} <= set(op_counts(ours))


@pytest.mark.parametrize("method", ["Percentile", "Entropy", "Distribution", "MinMax"])
def test_calibration_methods_match_ort(cnn_path, tmp_path, method):
    ours, theirs = quantize_both(cnn_path, tmp_path, "static", M.cnn_feeds(5), quant_format="QDQ",
                                 calibrate_method=getattr(rq.CalibrationMethod, method))
    feed = M.cnn_feeds(1, seed=7)[0]
    a, b = ort_run(ours, feed), ort_run(theirs, feed)
    # histograms merged batch by batch may put a threshold one bin away from onnxruntime's
    # all-at-once histogram: allow one output step per quantized layer (4)
    assert np.abs(a - b).max() <= 4 * out_step(theirs, "y") + 1e-5


def test_moving_average_and_symmetric_options(cnn_path, tmp_path):
    opts = {"CalibMovingAverage": True, "CalibMovingAverageConstant": 0.1, "ActivationSymmetric": True}
    ours, theirs = quantize_both(cnn_path, tmp_path, "static", M.cnn_feeds(4), quant_format="QDQ",
                                 extra_options=opts)
    check_pair(ours, theirs, M.cnn_feeds(1, seed=7)[0], same_graph=False)
    assert "Relu" in op_counts(ours)  # symmetric activations keep the Relu (as onnxruntime)


def test_histogram_memory_is_bounded():
    from runtime_core.quantization.calibrate import _Histogram

    h = _Histogram("percentile", True, 2048, 128, 99.999, "same")
    r = np.random.default_rng(0)
    h.collect("t", np.float32(4.0) * np.ones(3, np.float32))  # the first batch sets the widest range
    for _ in range(200):
        h.collect("t", r.uniform(-4, 4, 10_000).astype(np.float32))
    assert h.h["t"][0].size == 2048 and h.h["t"][0].sum() == 200 * 10_000 + 3


def test_histogram_merge_equals_one_histogram():
    from runtime_core.quantization.calibrate import _Histogram

    r = np.random.default_rng(1)
    batches = [r.normal(0, s, 5000).astype(np.float32) for s in (1.0, 0.5, 3.0, 2.0)]
    h = _Histogram("entropy", False, 128, 128, 0, "same")
    for b in batches:
        h.collect("t", b)
    hist, edges = h.h["t"][0], h.h["t"][1]
    ref, _ = np.histogram(np.concatenate(batches), bins=edges)
    assert hist.sum() == ref.sum() == 20000
    # re-binning only moves a value to a neighbouring bin at a widened edge
    assert np.abs(np.cumsum(hist) - np.cumsum(ref)).max() <= 0.01 * hist.sum()


def test_accuracy_report_and_errors(cnn_path, tmp_path):
    q = tmp_path / "q.onnx"
    rq.quantize_static(cnn_path, q, Reader(M.cnn_feeds(3)), per_channel=True)
    feeds = M.cnn_feeds(2, seed=5)
    rows = rq.accuracy_report(cnn_path, q, feeds)
    assert [r.sqnr_db for r in rows] == sorted(r.sqnr_db for r in rows)
    y = next(r for r in rows if r.name == "y")
    assert y.is_output
    f = [ort_run(cnn_path, fd) for fd in feeds]
    g = [ort_run(q, fd, optimize=False) for fd in feeds]
    err = max(np.abs(a - b).max() for a, b in zip(f, g))
    assert y.max_abs_error == pytest.approx(err, rel=1e-3, abs=1e-5)
    sig = sum(float((a.astype(np.float64) ** 2).sum()) for a in f)
    noise = sum(float(((a.astype(np.float64) - b) ** 2).sum()) for a, b in zip(f, g))
    assert y.sqnr_db == pytest.approx(10 * np.log10(sig / noise), abs=0.05)
    assert "SQNR" in rq.format_report(rows)
    with pytest.raises(InvalidArgumentError):
        rq.quantize_static(cnn_path, tmp_path / "x.onnx", Reader([]))
    with pytest.raises(InvalidArgumentError):
        rq.quantize_dynamic(cnn_path, tmp_path / "x.onnx", weight_type="QInt3")
    with pytest.raises(InvalidArgumentError):
        rq.quantize_static(cnn_path, tmp_path / "x.onnx", Reader(M.cnn_feeds(1)), activation_type=rq.QuantType.QInt8,
                           weight_type=rq.QuantType.QUInt8)
    assert not (tmp_path / "x.onnx").exists()
    assert rt.quantization.quantize_dynamic is rq.quantize_dynamic


def test_cli_quantize(cnn_path, tmp_path, capsys):
    from runtime_core.cli import main

    calib = tmp_path / "calib"
    calib.mkdir()
    for i, fd in enumerate(M.cnn_feeds(3)):
        np.savez(calib / f"{i:03d}.npz", **fd)
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(cnn_path), str(out), "--mode", "static", "--calib", str(calib), "--report",
                 "--per-channel", "--format", "qdq"]) == 0
    text = capsys.readouterr().out
    assert "SQNR" in text and "y (output)" in text
    assert "QuantizeLinear" in op_counts(out)
    assert main(["quantize", str(cnn_path), str(tmp_path / "z.onnx"), "--mode", "static"]) == 2
    assert "--calib" in capsys.readouterr().err


@pytest.mark.parametrize("act,weight", [("QInt16", "QInt8"), ("QUInt8", "QUInt4")])
def test_wide_and_narrow_types_qdq(cnn_path, tmp_path, act, weight):
    ours, theirs = quantize_both(cnn_path, tmp_path, "static", M.cnn_feeds(3), quant_format="QDQ", per_channel=True,
                                 activation_type=getattr(rq.QuantType, act), weight_type=getattr(rq.QuantType, weight))
    # onnxruntime writes 4-bit Q/DQ as com.microsoft ops, which runtime-core has no kernel for
    check_pair(ours, theirs, M.cnn_feeds(1, seed=7)[0], same_graph=False, theirs_on_rt=act == "QInt16")
    m = onnx.load(str(ours))
    assert next(o.version for o in m.opset_import if o.domain == "") == 21  # 16/4-bit Q/DQ are opset 21


def test_pre_process_cache_and_reader_protocol(cnn_path, tmp_path):
    pre = tmp_path / "pre.onnx"
    rq.quant_pre_process(cnn_path, pre)
    m = onnx.load(str(pre))
    assert {p.key: p.value for p in m.metadata_props}["onnx.quant.pre_process"] == "onnxruntime.quant"
    feed = M.cnn_feeds(1, seed=7)[0]
    np.testing.assert_allclose(ort_run(pre, feed), ort_run(cnn_path, feed), atol=1e-5)
    assert isinstance(Reader([]), rq.CalibrationDataReader)  # get_next is enough, as in onnxruntime
    cache = tmp_path / "ranges.json"
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    rq.quantize_static(pre, a, Reader(M.cnn_feeds(3)), calibration_cache_path=cache)
    assert cache.is_file()
    rq.quantize_static(pre, b, None, calibration_cache_path=cache)  # ranges read back, no calibration
    np.testing.assert_array_equal(ort_run(a, feed), ort_run(b, feed))


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_tiny_weights_widen_scale_for_int32_bias(tmp_path, per_channel):
    m = M.cnn()
    for t in m.graph.initializer:  # weights so small that input_scale * weight_scale cannot hold the bias in int32
        if t.name in ("W1", "B1"):
            a = onnx.numpy_helper.to_array(t) * (1e-10 if t.name == "W1" else 50.0)
            t.CopyFrom(onnx.numpy_helper.from_array(a.astype(np.float32), t.name))
    path = tmp_path / "tiny.onnx"
    onnx.save(m, path)
    ours, theirs = quantize_both(path, tmp_path, "static", M.cnn_feeds(3), quant_format="QDQ",
                                 per_channel=per_channel)
    check_pair(ours, theirs, M.cnn_feeds(1, seed=7)[0])
    w_ours = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(ours)).graph.initializer}["W1_scale"]
    w_theirs = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(theirs)).graph.initializer}["W1_scale"]
    np.testing.assert_allclose(w_ours, w_theirs, rtol=1e-6)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_torch_cnn_all_forms(tmp_path, exporter):
    pytest.importorskip("torch")
    if exporter == "dynamo":
        pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
    path = tmp_path / "tcnn.onnx"
    onnx.save(M.torch_cnn(exporter), path)
    feed = M.torch_cnn_feeds(1, seed=8)[0]
    for mode, kw, on_rt in [("dynamic", {"per_channel": True}, True),
                            ("static", {"quant_format": "QDQ", "per_channel": True}, True),
                            ("static", {"quant_format": "QOperator", "per_channel": True,
                                        "activation_type": rq.QuantType.QUInt8}, True)]:
        ours, theirs = quantize_both(path, tmp_path, mode, M.torch_cnn_feeds(3), **kw)
        check_pair(ours, theirs, feed, ours_on_rt=on_rt)


def test_progress_bar_on_long_calibrations(capsys, monkeypatch):
    from runtime_core.quantization import calibrate

    monkeypatch.setitem(sys.modules, "tqdm", None)  # the fallback line, whether or not tqdm is installed
    bar = calibrate._Progress(total=3, enabled=True, delay=0.0)
    for _ in range(3):
        bar.update()
    bar.close()
    assert "calibrating: 3/3 batches" in capsys.readouterr().err
    quiet = calibrate._Progress(total=3, enabled=True, delay=60.0)  # short calibrations stay silent
    quiet.update()
    quiet.close()
    assert capsys.readouterr().err == ""
