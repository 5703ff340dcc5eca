"""The partitioner with two providers at once: the fixture 'fakegpu' device and CPU."""

import threading
import warnings

import numpy as np
import pytest
from onnx import helper

import runtime_core as rt
from oracle import make_model
from runtime_core.errors import FallbackRefusedError, ProviderOptionsError

FAKE = "FakeGpuExecutionProvider"
CPU = "CPUExecutionProvider"
rng = np.random.default_rng(0)
X = rng.standard_normal((4, 8)).astype(np.float32)
W = rng.standard_normal((8, 8)).astype(np.float32)
B = rng.standard_normal((8,)).astype(np.float32)


def mlp_model():
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "B"], ["hb"], name="add"),
        helper.make_node("Relu", ["hb"], ["r"], name="relu"),
        helper.make_node("Softmax", ["r"], ["s"], name="softmax", axis=-1),
        helper.make_node("Mul", ["s", "r"], ["y"], name="mul"),
    ]
    return make_model(nodes, {"x": X}, ["y"], initializers={"W": W, "B": B})


def diamond_model():
    # a -> b -> c and a -> c: a and c on the fake device, b on CPU
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="a"),
        helper.make_node("Sigmoid", ["a"], ["b"], name="b"),
        helper.make_node("Add", ["a", "b"], ["y"], name="c"),
    ]
    return make_model(nodes, {"x": X}, ["y"])


def session(model, providers, **kw):
    return rt.InferenceSession(model.SerializeToString(), providers=providers, **kw)


def cpu_result(model, feeds):
    return session(model, [CPU]).run(None, feeds)


def test_nodes_split_between_providers_with_reasons(fakegpu):
    m = mlp_model()
    sess = session(m, ["fakegpu", "cpu"])
    assert sess.get_providers() == [FAKE, CPU]
    rep = sess.get_partition_report()
    where = {n.name: n.provider for n in rep.nodes}
    assert where == {"mm": FAKE, "add": FAKE, "relu": FAKE, "softmax": CPU, "mul": FAKE}
    soft = next(n for n in rep.nodes if n.name == "softmax")
    assert "Softmax is not supported by the fake device" in soft.declined[FAKE]
    assert all(n.declined == {} for n in rep.nodes if n.provider == FAKE)
    # mm/add/relu share one partition; mul is another (softmax sits between)
    parts = {n.name: n.partition for n in rep.nodes}
    assert parts["mm"] == parts["add"] == parts["relu"] != parts["mul"] != parts["softmax"]
    copies = [(c.value, c.src, c.dst, c.bytes) for c in rep.copies]
    assert ("x", "host", FAKE, X.nbytes) in copies
    assert ("r", FAKE, CPU, 4 * 8 * 4) in copies
    assert ("s", CPU, FAKE, 4 * 8 * 4) in copies
    assert ("y", FAKE, "host", 4 * 8 * 4) in copies
    assert len(copies) == 4
    out = sess.run(None, {"x": X})
    np.testing.assert_allclose(out[0], cpu_result(m, {"x": X})[0], rtol=1e-6)
    assert isinstance(out[0], np.ndarray)
    assert fakegpu.COUNTERS == {"to_device": 2, "to_host": 2}
    d = rep.to_dict()
    assert d["counts"] == {FAKE: 4, CPU: 1}
    text = str(rep)
    assert "softmax" in text and "fake device" in text and "copies:" in text


def test_single_claims_never_make_a_non_convex_partition(fakegpu):
    m = diamond_model()
    sess = session(m, ["fakegpu", "cpu"])
    rep = sess.get_partition_report()
    parts = {n.name: (n.provider, n.partition) for n in rep.nodes}
    assert parts["a"][0] == parts["c"][0] == FAKE and parts["b"][0] == CPU
    assert parts["a"][1] != parts["c"][1]
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], cpu_result(m, {"x": X})[0], rtol=1e-6)


def test_non_convex_group_claim_is_rejected_with_reason(fakegpu):
    m = diamond_model()
    sess = session(m, [("fakegpu", {"mode": "group"}), "cpu"])
    rep = sess.get_partition_report()
    assert {n.provider for n in rep.nodes} == {CPU}
    a = next(n for n in rep.nodes if n.name == "a")
    assert "not convex" in a.declined[FAKE] and "'b'" in a.declined[FAKE]
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], cpu_result(m, {"x": X})[0], rtol=1e-6)


def test_convex_group_claim_is_one_partition(fakegpu):
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"),
             helper.make_node("Mul", ["a", "a"], ["b"], name="b"),
             helper.make_node("Add", ["b", "x"], ["y"], name="c")]
    m = make_model(nodes, {"x": X}, ["y"])
    sess = session(m, [("fakegpu", {"mode": "group"}), "cpu"])
    rep = sess.get_partition_report()
    assert {n.partition for n in rep.nodes} == {0} and {n.provider for n in rep.nodes} == {FAKE}
    # x is read twice inside the partition but copied once
    assert [c.value for c in rep.copies] == ["x", "y"]
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], cpu_result(m, {"x": X})[0], rtol=1e-6)


def test_value_read_by_two_device_partitions_is_copied_once(fakegpu):
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"),
             helper.make_node("Sigmoid", ["a"], ["b"], name="b"),
             helper.make_node("Mul", ["b", "x"], ["c"], name="c"),
             helper.make_node("Sigmoid", ["c"], ["d"], name="d"),
             helper.make_node("Add", ["d", "x"], ["y"], name="e")]
    m = make_model(nodes, {"x": X}, ["y"])
    sess = session(m, ["fakegpu", "cpu"])
    rep = sess.get_partition_report()
    assert sum(1 for c in rep.copies if c.value == "x") == 1
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], cpu_result(m, {"x": X})[0], rtol=1e-6)


def test_unknown_provider_warns_and_falls_back(fakegpu):
    m = mlp_model()
    with pytest.warns(rt.ProviderFallbackWarning, match="nosuch"):
        sess = session(m, ["nosuch", "cpu"])
    assert sess.get_providers() == [CPU]
    assert "nosuch" in sess.get_partition_report().unavailable
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], cpu_result(m, {"x": X})[0])


def test_unavailable_provider_warns_with_reason(fakegpu):
    with pytest.warns(rt.ProviderFallbackWarning, match="no fake accelerator"):
        sess = session(mlp_model(), ["nodevice", "cpu"])
    assert sess.get_providers() == [CPU]


def test_broken_plugin_requested_warns_with_its_error(fakegpu):
    with pytest.warns(rt.ProviderFallbackWarning, match="missing native library"):
        session(mlp_model(), ["brokenimport"])


def _strict():
    so = rt.SessionOptions()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    return so


@pytest.mark.parametrize("name", ["nodevice", "NoDeviceExecutionProvider", "nosuch"])
def test_strict_mode_refuses_unavailable_provider(fakegpu, name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(FallbackRefusedError, match=name):
            session(mlp_model(), [name, "cpu"], sess_options=_strict())


def test_strict_mode_refuses_cpu_fallback_of_a_node(fakegpu):
    with pytest.raises(FallbackRefusedError, match="softmax"):
        session(mlp_model(), ["fakegpu", "cpu"], sess_options=_strict())


def test_strict_mode_accepts_when_nothing_falls_back(fakegpu):
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    m = make_model(nodes, {"x": X}, ["y"], initializers={"W": W})
    sess = session(m, ["fakegpu"], sess_options=_strict())
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], np.maximum(X @ W, 0), rtol=1e-5)


def test_failing_get_capability_is_reported_not_fatal(fakegpu):
    sess = session(mlp_model(), [("fakegpu", {"mode": "fail-capability"}), "cpu"])
    rep = sess.get_partition_report()
    assert {n.provider for n in rep.nodes} == {CPU}
    assert "capability exploded" in rep.nodes[0].declined[FAKE]


def test_bad_provider_options_are_a_typed_error(fakegpu):
    with pytest.raises(ProviderOptionsError, match="Conv"):
        session(mlp_model(), [("fakegpu", {"ops": "Conv"})])
    with pytest.raises(ProviderOptionsError, match="one options dict per provider"):
        session(mlp_model(), ["fakegpu", "cpu"], provider_options=[{}])


def test_provider_options_argument_and_report(fakegpu):
    sess = session(mlp_model(), ["fakegpu", "cpu"], provider_options=[{"ops": "MatMul"}, {}])
    assert sess.get_provider_options()[FAKE] == {"ops": "MatMul"}
    assert [n.name for n in sess.get_partition_report().nodes if n.provider == FAKE] == ["mm"]


def test_concurrent_runs_across_devices(fakegpu):
    m = mlp_model()
    sess = session(m, ["fakegpu", "cpu"])
    feeds = [rng.standard_normal((4, 8)).astype(np.float32) for _ in range(8)]
    # concurrent runs give exactly what the same session gives one at a time; that is the
    # CPU result up to the two providers' rounding (BLAS on the fake device, numpy's own loop
    # for the CPU's small fused Gemm)
    expected = [sess.run(None, {"x": f})[0] for f in feeds]
    for e, f in zip(expected, feeds):
        np.testing.assert_allclose(e, cpu_result(m, {"x": f})[0], rtol=1e-5, atol=1e-7)
    got = [None] * 8

    def work(i):
        for _ in range(20):
            got[i] = sess.run(None, {"x": feeds[i]})[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)
