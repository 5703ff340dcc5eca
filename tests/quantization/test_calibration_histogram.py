"""The chunked, in-place histogram collection of the calibrators against a straightforward
reference: numpy.histogram of the same float32 bin coordinate, whole tensor at once. The
histograms must be identical, bin for bin, for both layouts (signed, and |x| anchored at 0)
on a real model's activations, across widening batches, NaNs, all-zero and empty tensors."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from runtime_core.quantization import calibrate as C

sys.path.insert(0, str(Path(__file__).parent))
import quant_models as M  # noqa: E402


class RefBinner:
    """Whole-tensor reference: float32 coordinate (x - lo) / width, clamped, numpy.histogram."""

    def count(self, a, lo, width, nbins, absolute=False):
        if a.size == 0 or width <= 0:
            h = np.zeros(nbins, np.int64)
            h[nbins // 2 if lo < 0 else 0] += a.size
            return h
        x = np.abs(a) if absolute else a
        v = (x - np.float32(lo)) * np.float32(1.0 / width)
        v = np.clip(v, 0, nbins - 1)
        return np.histogram(v, bins=nbins, range=(0, nbins))[0].astype(np.int64)


LAYOUTS = {  # method, symmetric, num_bins: the |x| layout and three signed ones
    "percentile-abs": ("percentile", True, 2048),
    "percentile-signed": ("percentile", False, 2048),
    "entropy": ("entropy", False, 128),
    "distribution": ("distribution", False, 2048),
}


def pair(layout, chunk):
    method, sym, nbins = LAYOUTS[layout]
    fast = C._Histogram(method, sym, nbins, 128, 99.9, "same")
    fast.binner = C._Binner(chunk)
    ref = C._Histogram(method, sym, nbins, 128, 99.9, "same")
    ref.binner = RefBinner()
    return fast, ref


def assert_identical(fast, ref):
    assert fast.h.keys() == ref.h.keys()
    for k in ref.h:
        assert np.array_equal(fast.h[k][0], ref.h[k][0]), k
        assert np.array_equal(fast.h[k][1], ref.h[k][1]), k
        assert fast.h[k][2:] == ref.h[k][2:], k
        assert fast.h[k][1].size == fast.h[k][0].size + 1, k
    rf, rr = fast.result(), ref.result()
    for k in rr:
        assert rf[k].lowest == rr[k].lowest and rf[k].highest == rr[k].highest, k


@pytest.fixture(scope="module")
def activations():
    """A BERT-style block's activations (every float tensor), for batches whose input scale
    grows and shrinks, so that histograms widen."""
    pytest.importorskip("torch")
    model = onnx.shape_inference.infer_shapes(M.torch_block("bert", "torchscript"))
    cal = C.create_calibrator(model, None, C.CalibrationMethod.MinMax,
                              progress=False)
    feeds = M.block_feeds(4)
    for f, s in zip(feeds, (1.0, 4.0, 0.25, 9.0)):
        f["x"] = f["x"] * np.float32(s)
    return cal.output_names, [cal.session.run(cal.output_names, f) for f in feeds]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_model_activations_bin_identically(activations, layout):
    names, batches = activations
    fast, ref = pair(layout, chunk=37)  # a small chunk: most tensors span several chunks
    for values in batches:
        for n, v in zip(names, values):
            fast.collect(n, np.asarray(v))
            ref.collect(n, np.asarray(v))
    assert len(ref.h) > 20
    assert_identical(fast, ref)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_edge_cases_bin_identically(layout):
    r = np.random.default_rng(5)
    big = r.standard_t(3, 3 * C._CHUNK + 11).astype(np.float32)  # heavy tails, several default chunks
    nan = r.normal(0, 1, 1000).astype(np.float32)
    nan[::7] = np.nan
    batches = {
        "zero-first": [np.zeros(50, np.float32), r.normal(0, 2, 300).astype(np.float32),
                       np.zeros(10, np.float32)],
        "widening": [r.normal(0, s, 2000).astype(np.float32) for s in (0.5, 1.0, 0.1, 7.0, 3.0)],
        "nan": [nan, np.full(5, np.nan, np.float32), 3 * nan],
        "empty": [np.zeros(0, np.float32), r.normal(0, 1, 100).astype(np.float32), np.zeros(0, np.float32)],
        "big": [big, big[: C._CHUNK + 1] * np.float32(2.5)],
        "float64": [r.normal(0, 1, 500)],
    }
    fast, ref = pair(layout, chunk=C._CHUNK)
    for name, bs in batches.items():
        for b in bs:
            fast.collect(name, b.copy())
            ref.collect(name, b.copy())
    assert_identical(fast, ref)
    assert fast.h["empty"][0].sum() == 100 and fast.h["nan"][0].sum() == 2 * (1000 - 143)


def test_binner_reuses_its_buffers_and_leaves_input_alone():
    b = C._Binner(64)
    a = np.linspace(-3, 3, 1000, dtype=np.float32)
    before = a.copy()
    f, i = b.f, b.i
    h = b.count(a, np.float32(-3), np.float32(6 / 16), 16)
    assert np.array_equal(a, before) and b.f is f and b.i is i
    assert np.array_equal(h, RefBinner().count(a, np.float32(-3), np.float32(6 / 16), 16))
    assert h.sum() == 1000


@pytest.mark.parametrize("method", ["Percentile", "Entropy", "Distribution"])
def test_an_infinite_activation_is_a_typed_error_naming_the_tensor(tmp_path, method):
    from onnx import TensorProto as T
    from onnx import helper as h

    from runtime_core import quantization as q
    from runtime_core.errors import InvalidArgumentError

    g = h.make_graph([h.make_node("Log", ["x"], ["lx"]), h.make_node("Conv", ["lx", "w"], ["y"])], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 1, 4, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 1, 4, 4])],
                     [onnx.numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "w")])
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), src)
    x = np.abs(np.random.default_rng(0).standard_normal((1, 1, 4, 4))).astype(np.float32)
    x[0, 0, 0, 0] = 0.0  # Log(0) = -inf

    class Reader(q.CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": x}])

        def get_next(self):
            return next(self.it, None)

    with pytest.raises(InvalidArgumentError, match="'lx'.*infinite.*MinMax"):
        q.quantize_static(str(src), str(dst), Reader(), calibrate_method=getattr(q.CalibrationMethod, method))
    assert not dst.exists()  # nothing written
