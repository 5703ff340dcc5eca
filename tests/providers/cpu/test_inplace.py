"""In-place execution in the CPU executable: a kernel may write into an input only when that
input is exclusively the call's (an intermediate whose last reader it is, with no other
reference: no other slot, view, cache, caller). Values read by two nodes, graph inputs,
graph outputs and initializers are never written."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from oracle import make_model
from runtime_provider_cpu.execution import inplace

import runtime_core as rt

RNG = np.random.default_rng(7)


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.fixture
def donations(monkeypatch):
    """Counts the in-place calls the executable makes (the positions it hands over)."""
    if not inplace.ENABLED:
        pytest.skip("in-place execution is off on this interpreter (reference counts calibrated otherwise)")
    seen = []
    orig = inplace.owned

    def spy(args, slots, cands):
        r = orig(args, slots, cands)
        seen.append(r)
        return r

    monkeypatch.setattr(inplace, "owned", spy)
    return seen


def session(nodes, inputs, outputs, initializers=None, opset=17):
    m = make_model(nodes, inputs, outputs, opset=opset, initializers=initializers)
    so = rt.SessionOptions()
    so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep the nodes as built
    return rt.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def test_chain_runs_in_place_and_is_exact(donations):
    x = rnd(3, 5)
    s = session([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
                 helper.make_node("Exp", ["b"], ["c"]), helper.make_node("Clip", ["c", "lo", "hi"], ["y"])],
                {"x": x}, ["y"], initializers={"lo": np.float32(0.2), "hi": np.float32(0.9)})
    x0 = x.copy()
    (y,) = s.run(None, {"x": x})
    np.testing.assert_array_equal(y, np.clip(np.exp(-np.maximum(x0, 0)), 0.2, 0.9))
    np.testing.assert_array_equal(x, x0)  # the feed is never written (Relu reads it)
    assert sum(1 for r in donations if r >= 0) == 3  # Neg, Exp and Clip ran in place


def test_value_read_by_two_nodes_is_not_overwritten(donations):
    x = rnd(4, 6)
    # a is read by Neg and by Exp: the first reader must never write it; the last may
    s = session([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
                 helper.make_node("Exp", ["a"], ["c"]), helper.make_node("Add", ["b", "c"], ["y"])],
                {"x": x}, ["y"])
    a = np.maximum(x, 0)
    (y,) = s.run(None, {"x": x})
    np.testing.assert_array_equal(y, -a + np.exp(a))


def test_graph_input_output_and_initializer_are_never_written(donations):
    x = rnd(2, 3)
    w = rnd(2, 3)
    # Identity hands the feed (and the initializer) on under another name: the reference count
    # (the caller's feeds, the executable's constants) keeps the in-place kernels off them
    s = session([helper.make_node("Identity", ["x"], ["xi"]), helper.make_node("Neg", ["xi"], ["n"]),
                 helper.make_node("Identity", ["w"], ["wi"]), helper.make_node("Add", ["wi", "n"], ["s"]),
                 helper.make_node("Relu", ["s"], ["out1"]), helper.make_node("Exp", ["out1"], ["out2"])],
                {"x": x}, ["out1", "out2", "n"], initializers={"w": w})
    x0, w0 = x.copy(), w.copy()
    for _ in range(3):  # an initializer written once would change the next run
        out1, out2, n = s.run(None, {"x": x})
        np.testing.assert_array_equal(n, -x0)
        np.testing.assert_array_equal(out1, np.maximum(w0 - x0, 0))
        np.testing.assert_array_equal(out2, np.exp(np.maximum(w0 - x0, 0)))
        np.testing.assert_array_equal(x, x0)


def test_read_only_feed_is_not_written():
    x = rnd(3, 3)
    x.flags.writeable = False
    s = session([helper.make_node("Identity", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
                {"x": x}, ["y"])
    (y,) = s.run(None, {"x": x})
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_live_view_keeps_its_base_from_being_written(donations):
    x = rnd(2, 6)
    # v is a view of a (Reshape) that stays alive as an output: Neg, a's last reader, must not
    # write a; once nothing views it, a fresh value is handed over
    s = session([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Reshape", ["a", "shape"], ["v"]),
                 helper.make_node("Neg", ["a"], ["y"])],
                {"x": x}, ["v", "y"], initializers={"shape": np.array([3, 4], np.int64)})
    v, y = s.run(None, {"x": x})
    np.testing.assert_array_equal(v, np.maximum(x, 0).reshape(3, 4))
    np.testing.assert_array_equal(y, -np.maximum(x, 0))
    assert all(r < 0 for r in donations)


def test_view_of_a_dead_fresh_value_runs_in_place(donations):
    x = rnd(2, 6)
    s = session([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Reshape", ["a", "shape"], ["v"]),
                 helper.make_node("Neg", ["v"], ["y"])],
                {"x": x}, ["y"], initializers={"shape": np.array([3, 4], np.int64)})
    (y,) = s.run(None, {"x": x})
    np.testing.assert_array_equal(y, -np.maximum(x, 0).reshape(3, 4))
    assert sum(1 for r in donations if r >= 0) == 1


@pytest.mark.parametrize("op,f", [("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply),
                                  ("Div", np.divide)])
def test_binary_in_place_either_side_and_broadcast(op, f, donations):
    a, b = rnd(3, 4), rnd(1, 4)
    # p (3, 4) and q (1, 4) are both fresh and die at the op: only an input of the result's
    # shape may take the result
    s = session([helper.make_node("Exp", ["a"], ["p"]), helper.make_node("Exp", ["b"], ["q"]),
                 helper.make_node(op, ["q", "p"], ["y"]), helper.make_node("Exp", ["a"], ["p2"]),
                 helper.make_node("Exp", ["b"], ["q2"]), helper.make_node(op, ["p2", "q2"], ["z"])],
                {"a": a, "b": b}, ["y", "z"])
    y, z = s.run(None, {"a": a, "b": b})
    np.testing.assert_array_equal(y, f(np.exp(b), np.exp(a)))
    np.testing.assert_array_equal(z, f(np.exp(a), np.exp(b)))
    assert y.shape == z.shape == (3, 4)
    assert sum(1 for r in donations if r >= 0) == 2  # into p (right side), then into p2 (left)


def test_same_value_twice_is_not_handed_over():
    a = rnd(3, 4)
    s = session([helper.make_node("Exp", ["a"], ["p"]), helper.make_node("Sub", ["p", "p"], ["y"]),
                 helper.make_node("Exp", ["a"], ["q"]), helper.make_node("Mul", ["q", "q"], ["z"])],
                {"a": a}, ["y", "z"])
    y, z = s.run(None, {"a": a})
    np.testing.assert_array_equal(y, np.zeros((3, 4), np.float32))
    np.testing.assert_array_equal(z, np.exp(a) * np.exp(a))


def test_softmax_layernorm_in_place_match(donations):
    x = rnd(2, 3, 8)
    sc, bi = rnd(8), rnd(8)
    s = session([helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Softmax", ["e"], ["sm"], axis=-1),
                 helper.make_node("LayerNormalization", ["sm", "sc", "bi"], ["y"], axis=-1, epsilon=1e-5)],
                {"x": x}, ["y"], initializers={"sc": sc, "bi": bi})
    (y,) = s.run(None, {"x": x})
    e = np.exp(x)
    sm = np.exp(e - e.max(-1, keepdims=True))
    sm /= sm.sum(-1, keepdims=True)
    mu = sm.mean(-1, keepdims=True)
    ref = (sm - mu) / np.sqrt(((sm - mu) ** 2).mean(-1, keepdims=True) + np.float32(1e-5)) * sc + bi
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    assert sum(1 for r in donations if r >= 0) == 2


def test_skip_layernorm_and_biasgelu_in_place_match_fresh():
    from runtime_provider_cpu.ops import fused

    class Ctx:
        n_outputs = 4

    x, skip = rnd(2, 5, 8), rnd(2, 5, 8)
    g, b, bias = rnd(8), rnd(8), rnd(8)
    ref = fused.skip_layer_norm(Ctx, x, skip, g, b, bias, epsilon=1e-6)
    for owned in (0, 1):
        args = [x.copy(), skip.copy()]
        got = fused.skip_layer_norm_inplace(Ctx, owned, *args, g, b, bias, epsilon=1e-6)
        for r, o in zip(ref, got):
            np.testing.assert_array_equal(r, o)
    h = rnd(3, 8)
    np.testing.assert_array_equal(fused.bias_gelu(None, h, bias), fused.bias_gelu_inplace(None, 0, h.copy(), bias))
    for bv in (None, bias):
        np.testing.assert_array_equal(fused.fast_gelu(None, h, bv), fused.fast_gelu_inplace(None, 0, h.copy(), bv))
    with pytest.raises(ValueError, match="does not match"):
        fused.fast_gelu_inplace(None, 0, h.copy(), rnd(5))


def _gelu_refs(x):
    import math

    from scipy.special import erf

    xd = x.astype(np.float64)
    with np.errstate(all="ignore"):
        exact = 0.5 * xd * (1 + erf(xd / math.sqrt(2)))
        # 0.5 x (1 + tanh(u)) written as x sigmoid(2u): the same function, without float64's
        # own cancellation of 1 + tanh(u) (about 1e-16 absolute) in the negative tail
        tanh_form = xd / (1 + np.exp(-2 * math.sqrt(2 / math.pi) * (xd + 0.044715 * xd ** 3)))
    return exact, tanh_form


@pytest.mark.parametrize("native", [pytest.param(True, marks=pytest.mark.native), False])
def test_gelu_f32_accuracy_and_specials(native):
    from functools import partial

    from runtime_provider_cpu.ops import elementwise as ew

    if native:
        assert ew._native is not None, "runtime_provider_cpu._native did not build"
    gelu_erf_f32 = partial(ew.gelu_erf_f32, native=native)
    gelu_tanh_f32 = partial(ew.gelu_tanh_f32, native=native)
    x = np.linspace(-12, 12, 300_001).astype(np.float32)
    exact, tanh_form = _gelu_refs(x)
    with np.errstate(all="ignore"):
        g, t = gelu_erf_f32(x), gelu_tanh_f32(x)
    assert g.dtype == t.dtype == np.float32
    np.testing.assert_allclose(g, exact, rtol=0, atol=1.5e-6)
    np.testing.assert_allclose(t, tanh_form, rtol=0, atol=1e-6)
    # the sigmoid form keeps relative accuracy in the negative tail (1 + tanh would cancel:
    # the old float32 form was off by up to 10% of values there)
    big = np.abs(tanh_form) > 1e-30
    np.testing.assert_allclose(t[big], tanh_form[big], rtol=3e-5)  # (the exponent itself is ~70 there)
    with np.errstate(all="ignore"):
        for f in (gelu_erf_f32, gelu_tanh_f32):
            sp = f(np.float32([np.nan, np.inf, 0.0, -30.0, 30.0]))
            assert np.isnan(sp[0]) and sp[1] == np.inf and sp[2] == 0 and sp[3] == 0 and sp[4] == 30


@pytest.mark.parametrize("shape", [(9, 40), (3, 7), (2, 5, 19), (1,), (0, 8), (4, 0)])
@pytest.mark.native
def test_compiled_gelu_tanh_with_bias_matches_the_numpy_blocks(shape):
    # _native.gelu_erf with tanh_form: FastGelu's bias add and the tanh form in one pass
    from runtime_provider_cpu.ops import elementwise as ew

    assert ew._native is not None, "runtime_provider_cpu._native did not build"
    x = rnd(*shape) * 4
    b = rnd(shape[-1])
    with np.errstate(over="ignore"):  # the numpy blocks' exp overflows to inf in the tail (exact: x / inf)
        want = ew.gelu_tanh_f32(x, b, native=False)
    got = ew.gelu_tanh_f32(x, b)
    assert got.shape == x.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=2e-6)
    y = x.copy()
    assert ew.gelu_tanh_f32(y, b, out=y) is y
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=2e-6)


@pytest.mark.kernel
@pytest.mark.parametrize("shape", [(9, 40), (3, 7), (2, 5, 19), (1,), (0, 8), (4, 0)])
@pytest.mark.native
def test_compiled_gelu_with_bias_matches_the_numpy_blocks(shape):
    # _native.gelu_erf: the bias add and Gelu in one pass, rows of any width (a scalar tail
    # below 8), in place or not
    from runtime_provider_cpu.ops import elementwise as ew

    assert ew._native is not None, "runtime_provider_cpu._native did not build"
    x = rnd(*shape) * 4
    b = rnd(shape[-1])
    want = ew.gelu_erf_f32(x + b, native=False)
    got = ew.gelu_erf_f32(x, bias=b)
    assert got.shape == x.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=2e-6)
    y = x.copy()
    assert ew.gelu_erf_f32(y, out=y, bias=b) is y
    np.testing.assert_array_equal(y, got)
    with pytest.raises(ValueError, match="B holds"):
        ew._native.gelu_erf(np.zeros((2, 3), np.float32), np.zeros(2, np.float32), np.zeros((2, 3), np.float32), (2, 3))
    with pytest.raises(ValueError, match="Y holds"):
        ew._native.gelu_erf(np.zeros((2, 3), np.float32), None, np.zeros((2, 3)), (2, 3))


@pytest.mark.parametrize("block", [7, 64, 65536])
def test_gelu_f32_blocks_bias_and_aliasing(block, monkeypatch):
    from runtime_provider_cpu.ops import elementwise as ew

    x, b = rnd(9, 40), rnd(40)
    whole_erf, whole_tanh = ew.gelu_erf_f32(x, native=False), ew.gelu_tanh_f32(x + b)
    monkeypatch.setattr(ew, "_BLOCK", block)
    np.testing.assert_array_equal(ew.gelu_erf_f32(x, native=False), whole_erf)
    np.testing.assert_array_equal(ew.gelu_tanh_f32(x, b), whole_tanh)
    y = x.copy()
    assert ew.gelu_erf_f32(y, out=y, native=False) is y
    np.testing.assert_array_equal(y, whole_erf)
    y = x.copy()
    assert ew.gelu_tanh_f32(y, b, out=y) is y
    np.testing.assert_array_equal(y, whole_tanh)
    xt = np.asfortranarray(x)  # a non-contiguous input (and out) is read and written correctly
    np.testing.assert_array_equal(ew.gelu_tanh_f32(xt, b, out=xt), whole_tanh)
    np.testing.assert_array_equal(xt, whole_tanh)
    assert ew.gelu_tanh_f32(np.zeros((0, 4), np.float32)).shape == (0, 4)


def test_erf_f32_accuracy():
    from runtime_provider_cpu.ops.elementwise import erf_f32
    from scipy.special import erf

    x = np.linspace(-6, 6, 200_001).astype(np.float32)
    x = np.concatenate([x, np.float32([0.0, -0.0, 1e-30, -1e-30, np.inf, -np.inf])])
    got = erf_f32(x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, erf(x.astype(np.float64)), rtol=0, atol=5e-7)
    assert np.isnan(erf_f32(np.float32([np.nan]))[0])
    y = x.copy()
    assert erf_f32(y, out=y) is y
    np.testing.assert_array_equal(y, got)


def _inplace_steps(sess):
    return sum(getattr(getattr(st, "executable", None), "n_inplace_steps", 0) for st in sess._plan.steps)


def test_small_static_outputs_skip_the_inplace_test(monkeypatch):
    if not inplace.ENABLED:
        pytest.skip("in-place execution is off on this interpreter")
    monkeypatch.delenv("RUNTIME_CORE_CPU_INPLACE_MIN", raising=False)
    default = inplace.min_elements()
    assert default == 4096
    monkeypatch.setattr(inplace, "MIN_ELEMENTS", default)
    chain = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["y"])]
    for shape, want in (((3, 4), 0), ((63, 65), 0), ((64, 64), 1), ((2, 3000), 1)):
        x = rnd(*shape)
        s = session(chain, {"x": x}, ["y"])
        assert _inplace_steps(s) == want, shape
        np.testing.assert_array_equal(s.run(None, {"x": x})[0], -np.maximum(x, 0))
    # a symbolic dimension: the size is only known at run time, so the variant stays
    m = make_model(chain, {"x": rnd(3, 4)}, ["y"], opset=17)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    for vi in m.graph.output:
        vi.type.tensor_type.shape.dim[0].dim_param = "n"
    so = rt.SessionOptions()
    so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = rt.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    assert _inplace_steps(s) == 1
    for raw, want in (("0", 0), ("100", 100), ("-5", 0), ("x", 4096)):
        monkeypatch.setenv("RUNTIME_CORE_CPU_INPLACE_MIN", raw)
        assert inplace.min_elements() == want


def test_calibration_and_switch(monkeypatch):
    # the import-time check accepts exclusive arrays and refuses held ones on this interpreter
    assert inplace.ENABLED == inplace.calibrate()
    monkeypatch.setenv("RUNTIME_CORE_CPU_INPLACE", "0")
    assert inplace.calibrate() is False
    monkeypatch.setattr(inplace, "ENABLED", False)
    x = rnd(3, 4)
    s = session([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["y"])], {"x": x}, ["y"])
    (y,) = s.run(None, {"x": x})
    np.testing.assert_array_equal(y, -np.maximum(x, 0))
