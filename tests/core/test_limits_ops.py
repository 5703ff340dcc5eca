"""The tensor-size cap (``session.max_tensor_bytes``) in the kernels whose output size comes from
attribute or input *values* beyond those of test_limits.py: Resize/Upsample, CenterCropPad,
Col2Im, MaxUnpool, the signal ops (DFT, STFT, windows, MelWeightMatrix), AffineGrid and the
random generators. Each bomb ends in the typed out-of-memory error naming the op and the cap
(raised by the check, before any allocation); an ordinary request in the same session still
matches onnxruntime (shape and dtype only for the random ops, whose numbers no two runtimes share).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import runtime_core as rt
from oracle import assert_close, run_oracle
from runtime_core.errors import OutOfMemoryError

F, I64 = TensorProto.FLOAT, TensorProto.INT64
CPU = ["CPUExecutionProvider"]
CAP = 1 << 20  # small: every bomb below asks for a few MiB, so no case depends on the machine's memory


def _model(node, inputs, out_rank, opset, out_type=F):
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info("y", out_type, [f"d{i}" for i in range(out_rank)])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m


def _capped(model):
    so = rt.SessionOptions()
    so.add_session_config_entry("session.max_tensor_bytes", str(CAP))
    return rt.InferenceSession(model.SerializeToString(), so, providers=CPU)


X23 = np.arange(6, dtype=np.float32).reshape(2, 3)
I = np.int64

#: id -> (op named in the error, model, bomb feeds, ordinary feeds)
CASES = {
    "Resize-sizes": ("Resize", _model(helper.make_node("Resize", ["x", "", "", "s"], ["y"]),
                                      [("x", F, [2, 3]), ("s", I64, [2])], 2, 18),
                     {"x": X23, "s": np.array([1024, 1024])}, {"x": X23, "s": np.array([4, 5])}),
    "Resize-scales-linear": ("Resize", _model(helper.make_node("Resize", ["x", "", "s"], ["y"], mode="linear"),
                                              [("x", F, [2, 3]), ("s", F, [2])], 2, 18),
                             {"x": X23, "s": np.array([512, 512], np.float32)},
                             {"x": X23, "s": np.array([1.5, 2], np.float32)}),
    "Upsample": ("Upsample", _model(helper.make_node("Upsample", ["x", "s"], ["y"]),
                                    [("x", F, [2, 3]), ("s", F, [2])], 2, 9),
                 {"x": X23, "s": np.array([1, 2**18], np.float32)}, {"x": X23, "s": np.array([2, 3], np.float32)}),
    "CenterCropPad": ("CenterCropPad", _model(helper.make_node("CenterCropPad", ["x", "s"], ["y"]),
                                              [("x", F, [2, 3]), ("s", I64, [2])], 2, 18),
                      {"x": X23, "s": np.array([1024, 1024])}, {"x": X23, "s": np.array([4, 2])}),
    "Col2Im": ("Col2Im", _model(helper.make_node("Col2Im", ["x", "i", "b"], ["y"], strides=[1024, 1024]),
                                [("x", F, [1, 1, 1]), ("i", I64, [2]), ("b", I64, [2])], 4, 18),
               {"x": np.ones((1, 1, 1), np.float32), "i": np.array([1024, 1024]), "b": np.array([1, 1])},
               {"x": np.full((1, 1, 1), 5, np.float32), "i": np.array([3, 3]), "b": np.array([1, 1])}),
    "MaxUnpool": ("MaxUnpool", _model(helper.make_node("MaxUnpool", ["x", "i", "o"], ["y"], kernel_shape=[2, 2],
                                                       strides=[2, 2]),
                                      [("x", F, [1, 1, 1, 1]), ("i", I64, [1, 1, 1, 1]), ("o", I64, [4])], 4, 11),
                  {"x": np.ones((1, 1, 1, 1), np.float32), "i": np.zeros((1, 1, 1, 1), I),
                   "o": np.array([1, 1, 1024, 1024])},
                  {"x": np.full((1, 1, 1, 1), 7, np.float32), "i": np.full((1, 1, 1, 1), 3, I),
                   "o": np.array([1, 1, 3, 3])}),
    "DFT": ("DFT", _model(helper.make_node("DFT", ["x", "n"], ["y"]), [("x", F, [1, 4, 1]), ("n", I64, [])], 3, 20),
            {"x": np.ones((1, 4, 1), np.float32), "n": np.array(2**17)},
            {"x": np.arange(4, dtype=np.float32).reshape(1, 4, 1), "n": np.array(6)}),
    "STFT": ("STFT", _model(helper.make_node("STFT", ["x", "step", "", "len"], ["y"]),
                            [("x", F, [1, 1024, 1]), ("step", I64, []), ("len", I64, [])], 4, 17),
             {"x": np.ones((1, 1024, 1), np.float32), "step": np.array(1), "len": np.array(512)},
             {"x": np.sin(np.arange(1024, dtype=np.float32) / 7).reshape(1, 1024, 1), "step": np.array(64),
              "len": np.array(16)}),
    "HannWindow": ("HannWindow", _model(helper.make_node("HannWindow", ["n"], ["y"]), [("n", I64, [])], 1, 17),
                   {"n": np.array(2**18)}, {"n": np.array(10)}),
    "MelWeightMatrix": ("MelWeightMatrix",
                        _model(helper.make_node("MelWeightMatrix", ["m", "d", "r", "lo", "hi"], ["y"]),
                               [("m", I64, []), ("d", I64, []), ("r", I64, []), ("lo", F, []), ("hi", F, [])], 2, 17),
                        {"m": np.array(8), "d": np.array(2**18), "r": np.array(16000),
                         "lo": np.array(0, np.float32), "hi": np.array(8000, np.float32)},
                        {"m": np.array(8), "d": np.array(64), "r": np.array(16000),
                         "lo": np.array(0, np.float32), "hi": np.array(8000, np.float32)}),
    "AffineGrid": ("AffineGrid", _model(helper.make_node("AffineGrid", ["t", "s"], ["y"]),
                                        [("t", F, [1, 2, 3]), ("s", I64, [4])], 4, 20),
                   {"t": np.array([[[1, 0, 0], [0, 1, 0]]], np.float32), "s": np.array([1, 1, 512, 512])},
                   {"t": np.array([[[0.8, -0.2, 0.1], [0.3, 1.1, -0.2]]], np.float32),
                    "s": np.array([1, 1, 3, 4])}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_value_sized_output_is_capped_before_allocation(case):
    op, model, bomb, ok = CASES[case]
    sess = _capped(model)
    with pytest.raises(OutOfMemoryError) as info:
        sess.run(None, bomb)
    assert isinstance(info.value, MemoryError)
    assert op in str(info.value) and "session.max_tensor_bytes" in str(info.value) and str(CAP) in str(info.value)
    # an ordinary request in the same session still computes, as onnxruntime does (MaxUnpool with an
    # output_shape larger than the unpooled one: onnx's reference, whose layout the ONNX test data have
    # and onnxruntime's does not)
    want = ReferenceEvaluator(model).run(None, ok) if op == "MaxUnpool" else run_oracle(model, ok)
    assert_close(sess.run(None, ok), want, rtol=1e-5, atol=1e-5)


def _random(op, inputs, opset=15, **attrs):
    node = helper.make_node(op, [n for n, _, _ in inputs], ["y"], seed=3.0, **attrs)
    out_type = TensorProto.INT32 if op == "Multinomial" else F
    return _model(node, inputs, 2, opset, out_type=out_type)


BIG = np.zeros((200, 1000), np.float32)  # 800 kB fed, 1.6 MB drawn in float64
SMALL = np.full((3, 4), 0.5, np.float32)

#: id -> (op, bomb model, bomb feeds, ordinary model, ordinary feeds)
RANDOM = {
    "RandomNormal": ("RandomNormal", _random("RandomNormal", [], shape=[1024, 1024]), {},
                     _random("RandomNormal", [], shape=[3, 4]), {}),
    "RandomUniform": ("RandomUniform", _random("RandomUniform", [], shape=[1024, 1024]), {},
                      _random("RandomUniform", [], shape=[3, 4]), {}),
    "RandomNormalLike": ("RandomNormalLike", _random("RandomNormalLike", [("x", F, ["a", "b"])]), {"x": BIG},
                         _random("RandomNormalLike", [("x", F, ["a", "b"])]), {"x": SMALL}),
    "RandomUniformLike": ("RandomUniformLike", _random("RandomUniformLike", [("x", F, ["a", "b"])]), {"x": BIG},
                          _random("RandomUniformLike", [("x", F, ["a", "b"])]), {"x": SMALL}),
    "Bernoulli": ("Bernoulli", _random("Bernoulli", [("x", F, ["a", "b"])]), {"x": BIG},
                  _random("Bernoulli", [("x", F, ["a", "b"])]), {"x": SMALL}),
    "Multinomial": ("Multinomial", _random("Multinomial", [("x", F, [1, 3])], sample_size=2**18),
                    {"x": np.zeros((1, 3), np.float32)},
                    _random("Multinomial", [("x", F, [1, 3])], sample_size=5), {"x": np.zeros((1, 3), np.float32)}),
}


@pytest.mark.parametrize("case", sorted(RANDOM))
def test_random_ops_are_capped_before_drawing(case):
    op, bomb_model, bomb, ok_model, ok = RANDOM[case]
    with pytest.raises(OutOfMemoryError) as info:
        _capped(bomb_model).run(None, bomb)
    assert isinstance(info.value, MemoryError)
    assert op in str(info.value) and str(CAP) in str(info.value)
    got = _capped(ok_model).run(None, ok)[0]
    want = ort.InferenceSession(ok_model.SerializeToString(), providers=CPU).run(None, ok)[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    if op == "Multinomial":
        assert ((got >= 0) & (got < 3)).all()
    elif op in ("RandomUniform", "RandomUniformLike"):
        assert ((got >= 0) & (got < 1)).all()
    elif op == "Bernoulli":
        assert set(np.unique(got).tolist()) <= {0.0, 1.0}
