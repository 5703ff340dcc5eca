"""The Softmax op on the compiled row softmax (float32, C-contiguous, last axis; opset 13 and
1-11's 2-D coercion, and the in-place variant) against its numpy path and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from oracle import cpu_session, make_model, run_oracle
from runtime_provider_cpu.execution import inplace
from runtime_provider_cpu.ops import softmax as sm_mod

RNG = np.random.default_rng(31)


def _model(shape, axis, opset, pre_exp=False):
    # pre_exp: Softmax reads an intermediate (its last reader), so the in-place variant runs
    nodes = [helper.make_node("Softmax", ["e" if pre_exp else "x"], ["y"], axis=axis)]
    if pre_exp:
        nodes.insert(0, helper.make_node("Identity", ["x"], ["x1"]))
        nodes.insert(1, helper.make_node("Mul", ["x1", "x1"], ["e"]))
    x = RNG.standard_normal(shape).astype(np.float32)
    return make_model(nodes, {"x": x}, ["y"], opset=opset)


def _runs(model, x, monkeypatch, spy=None):
    """(ours on the compiled kernel, ours on numpy, onnxruntime); spy records the native calls"""
    real = sm_mod._native
    calls = []

    class Spy:
        def softmax(self, *args):
            calls.append(args)
            return real.softmax(*args)

    real_fn = sm_mod._softmax_native

    def fn(ctx, x, axis, own):
        y = real_fn(ctx, x, axis, own)
        if y is not None:
            calls[-1] = calls[-1] + (own,)
        return y

    monkeypatch.setattr(sm_mod, "_softmax_native", fn)
    monkeypatch.setattr(sm_mod, "_native", Spy())
    (y_nat,) = cpu_session(model).run(None, {"x": x})
    monkeypatch.setattr(sm_mod, "_native", None)
    (y_np,) = cpu_session(model).run(None, {"x": x})
    monkeypatch.setattr(sm_mod, "_native", real)
    return y_nat, y_np, run_oracle(model, {"x": x})[0], calls


CASES = [((8, 2, 16, 16), -1, 13), ((3, 37), 1, 13), ((2, 5, 7), 2, 13), ((4, 1), -1, 13),
         ((2, 3, 4, 9), 2, 11), ((2, 3, 4, 9), -1, 11), ((6, 10), 1, 1), ((2, 3, 8), 2, 13)]


@pytest.mark.native
@pytest.mark.parametrize("shape, axis, opset", CASES)
@pytest.mark.parametrize("pre_exp", [False, True])
def test_softmax_native_matches_numpy_and_ort(shape, axis, opset, pre_exp, monkeypatch):
    assert sm_mod._native is not None
    x = (RNG.standard_normal(shape) * 4).astype(np.float32)
    m = _model(shape, axis, opset, pre_exp)
    y_nat, y_np, y_ort, calls = _runs(m, x, monkeypatch)
    assert calls, "the compiled row softmax did not run"
    if pre_exp and opset == 13 and inplace.ENABLED:
        assert calls[-1][-1] is True  # the in-place variant wrote into its input
    np.testing.assert_allclose(y_nat, y_np, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(y_nat, y_ort, rtol=1e-5, atol=1e-6)


@pytest.mark.native
def test_softmax_axis_not_last_uses_numpy(monkeypatch):
    x = RNG.standard_normal((3, 5, 7)).astype(np.float32)
    m = _model(x.shape, 1, 13)
    y_nat, y_np, y_ort, calls = _runs(m, x, monkeypatch)
    assert not calls
    np.testing.assert_array_equal(y_nat, y_np)
    np.testing.assert_allclose(y_nat, y_ort, rtol=1e-5, atol=1e-6)


@pytest.mark.native
@pytest.mark.parametrize("pre_exp", [False, True])
@pytest.mark.parametrize("t", [11, 37])
def test_softmax_native_special_values(pre_exp, t, monkeypatch):
    # masked rows (all -inf), partly masked rows, +inf, NaN, large magnitudes; rows shorter than
    # the kernel's 16 lanes (all tail) and rows of two full vectors and a tail
    x = RNG.standard_normal((7, t)).astype(np.float32)
    x[0] = -np.inf
    x[1, ::2] = -np.inf
    x[2, 3] = np.inf
    x[3, 4] = np.nan
    x[4] = np.float32(3e38)
    x[4, 5] = -3e38
    x[5] = np.linspace(-1e30, 1e30, t, dtype=np.float32)
    x[6, 9] = -1e4
    m = _model(x.shape, -1, 13, pre_exp)
    if pre_exp:  # Mul squares x: keep the specials' meaning through |x| ** 2 with sign lost
        x = np.sqrt(np.abs(x)).astype(np.float32)
        x[0] = np.inf  # (inf * inf) = inf: a row of +inf
    y_nat, y_np, y_ort, calls = _runs(m, x, monkeypatch)
    assert calls
    np.testing.assert_allclose(y_nat, y_np, rtol=2e-6, atol=1e-7, equal_nan=True)
    np.testing.assert_allclose(y_nat, y_ort, rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.native
def test_softmax_native_threads_split_rows(monkeypatch):
    # enough rows for the pool to split them: the same values as one thread
    x = (RNG.standard_normal((8, 2, 64, 128)) * 3).astype(np.float32)
    m = _model(x.shape, -1, 13)
    y_nat, y_np, y_ort, calls = _runs(m, x, monkeypatch)
    assert calls and calls[0][3] == 2
    np.testing.assert_allclose(y_nat, y_np, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(y_nat, y_ort, rtol=1e-5, atol=1e-6)


@pytest.mark.kernel
@pytest.mark.native
def test_native_softmax_rejects_bad_buffers():
    nat = sm_mod._native
    with pytest.raises(ValueError):
        nat.softmax(np.zeros((2, 4), np.float32), (2, 0), 1, 1)
    with pytest.raises((ValueError, TypeError, BufferError)):
        nat.softmax(np.zeros((2, 4), np.float32), (3, 4), 1, 1)
    with pytest.raises((ValueError, TypeError, BufferError)):
        nat.softmax(np.zeros((2, 4), np.float64), (2, 4), 1, 1)


@pytest.mark.parametrize("shape, axis, opset", CASES[:3] + CASES[4:5])
def test_softmax_session_matches_ort(shape, axis, opset):
    # whichever path this build takes (RUNTIME_CORE_CPU_NATIVE=0: numpy), masked rows included
    x = (RNG.standard_normal(shape) * 4).astype(np.float32)
    x.reshape(-1, shape[-1])[0] = -np.inf
    m = _model(shape, axis, opset)
    (y,) = cpu_session(m).run(None, {"x": x})
    np.testing.assert_allclose(y, run_oracle(m, {"x": x})[0], rtol=1e-5, atol=1e-6, equal_nan=True)
