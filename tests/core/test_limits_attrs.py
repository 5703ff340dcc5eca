"""The tensor-size cap (``session.max_tensor_bytes``) in the kernels whose output or scratch size
comes from *attributes*: ConvTranspose's output_shape, Conv's and the pools' pads, RoiAlign's
output size and sampling_ratio, MaxRoiPool's pooled_shape. Each bomb ends in the typed
out-of-memory error naming the op and the cap (the check's message: raised before any
allocation); the same op with ordinary attributes under the same cap matches onnxruntime.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt
from runtime_core.errors import OutOfMemoryError

F = TensorProto.FLOAT
CPU = ["CPUExecutionProvider"]
CAP = 1 << 20  # small: every bomb asks for a few MiB, so no case depends on the machine's memory
RNG = np.random.default_rng(0)
X = RNG.standard_normal((1, 2, 6, 6)).astype(np.float32)
ROIS = np.array([[0.5, 0.5, 4.0, 5.0], [1.0, 0.0, 5.5, 3.5]], np.float32)


def _model(op, inputs, inits, opset, **attrs):
    node = helper.make_node(op, [n for n, _ in inputs] + list(inits), ["y"], **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, t, None) for n, t in inputs],
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m.SerializeToString()


def _conv(**a):
    return _model("Conv", [("x", F)], {"w": RNG.standard_normal((3, 2, 3, 3)).astype(np.float32)}, 17, **a)


def _convt(**a):
    return _model("ConvTranspose", [("x", F)], {"w": RNG.standard_normal((2, 3, 3, 3)).astype(np.float32)}, 17, **a)


def _pool(op, **a):
    return _model(op, [("x", F)], {}, 18, **a)


def _roialign(**a):
    return _model("RoiAlign", [("x", F), ("rois", F), ("bi", TensorProto.INT64)], {}, 16, **a)


def _maxroipool(**a):
    return _model("MaxRoiPool", [("x", F), ("rois", F)], {}, 17, **a)


ROI_FEEDS = {"x": X, "rois": ROIS, "bi": np.array([0, 0], np.int64)}
MRP_FEEDS = {"x": X, "rois": np.concatenate([np.zeros((2, 1), np.float32), ROIS], axis=1)}
XF = {"x": X}
BIG_PADS = dict(kernel_shape=[700, 700], pads=[699] * 4)  # pads stay below the kernel: a valid model

#: id -> (op named in the error, bomb model, ordinary model, feeds)
CASES = {
    "ConvTranspose-output_shape": ("ConvTranspose", _convt(output_shape=[1024, 1024]), _convt(output_shape=[8, 8]), XF),
    "ConvTranspose-strides": ("ConvTranspose", _convt(strides=[300, 300]), _convt(strides=[2, 2]), XF),
    "Conv-pads": ("Conv", _conv(pads=[300, 300, 300, 300]), _conv(pads=[1, 2, 1, 0]), XF),
    "MaxPool-pads": ("MaxPool", _pool("MaxPool", **BIG_PADS), _pool("MaxPool", kernel_shape=[3, 3], pads=[1] * 4), XF),
    "AveragePool-pads": ("AveragePool", _pool("AveragePool", **BIG_PADS),
                         _pool("AveragePool", kernel_shape=[3, 3], pads=[1] * 4), XF),
    "LpPool-pads": ("LpPool", _pool("LpPool", **BIG_PADS), _pool("LpPool", kernel_shape=[2, 2], pads=[1] * 4), XF),
    "RoiAlign-output": ("RoiAlign", _roialign(output_height=512, output_width=512),
                        _roialign(output_height=3, output_width=2), ROI_FEEDS),
    "RoiAlign-sampling_ratio": ("RoiAlign samples", _roialign(output_height=2, output_width=2, sampling_ratio=2**20),
                                _roialign(output_height=2, output_width=2, sampling_ratio=3), ROI_FEEDS),
    "RoiAlign-max-sampling_ratio": ("RoiAlign samples",
                                    _roialign(mode="max", output_height=2, output_width=2, sampling_ratio=200),
                                    _roialign(mode="max", output_height=2, output_width=2, sampling_ratio=2),
                                    ROI_FEEDS),
    "MaxRoiPool-pooled_shape": ("MaxRoiPool", _maxroipool(pooled_shape=[512, 512]), _maxroipool(pooled_shape=[2, 3]),
                                MRP_FEEDS),
}


def _capped(model):
    so = rt.SessionOptions()
    so.add_session_config_entry("session.max_tensor_bytes", str(CAP))
    return rt.InferenceSession(model, so, providers=CPU)


@pytest.mark.parametrize("case", sorted(CASES))
def test_attribute_bomb_is_refused_before_allocation(case):
    op, bomb, ordinary, feeds = CASES[case]
    with pytest.raises(OutOfMemoryError) as ei:
        _capped(bomb).run(None, feeds)
    msg = str(ei.value)
    assert f"{op}:" in msg and f"tensor size cap of {CAP} bytes" in msg, msg
    got = _capped(ordinary).run(None, feeds)[0]
    want = ort.InferenceSession(ordinary, providers=CPU).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv_pads_near_2p31_under_the_default_cap():
    """A fuzz case (Conv with a pad of 2**31 - 1): the output needs tens of GiB; it was allocated
    (killed the process where memory was not limited); now the default cap refuses it."""
    x = RNG.standard_normal((1, 4, 10, 7, 2)).astype(np.float32)
    w = RNG.standard_normal((16, 2, 1, 1, 1)).astype(np.float32)
    m = _model("Conv", [("x", F)], {"w": w}, 17, group=2, kernel_shape=[1, 1, 1], pads=[0, 0, 2**31 - 1, 0, 0, 2])
    with pytest.raises(OutOfMemoryError, match="tensor size cap"):
        rt.InferenceSession(m, providers=CPU).run(None, {"x": x})
