"""The numexpr provider's own tests: fusion, materialization, options, fallback, results.

Results are compared with numpy computed independently in the test.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

import runtime_core as rt
from runtime_core.errors import ProviderOptionsError

NAME = "NumexprExecutionProvider"
ALL = {"min_elements": "0", "transcendentals": "always"}
N = helper.make_node


def model(nodes, inputs, outputs=("y",), elem=TensorProto.FLOAT, shape=(3, 4), initializers=()):
    g = helper.make_graph(list(nodes), "g", [helper.make_tensor_value_info(i, elem, list(shape)) for i in inputs],
                          [helper.make_tensor_value_info(o, elem, list(shape)) for o in outputs],
                          initializer=list(initializers))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def session(m, **options):
    return rt.InferenceSession(m, providers=[("numexpr", {**ALL, **options}), "cpu"])


def executables(sess):
    """The numexpr executables of a session (white-box: the plan's steps)."""
    from runtime_provider_numexpr.fusion import FusedExecutable

    return [st.executable for st in sess._plan.steps if isinstance(getattr(st, "executable", None), FusedExecutable)]


def placement(sess):
    return {n.op_type: n.provider for n in sess.get_partition_report().nodes}


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def test_a_chain_is_one_program(rng):
    m = model([N("Add", ["a", "b"], ["s"]), N("Mul", ["s", "a"], ["p"]), N("Tanh", ["p"], ["t"]),
               N("Relu", ["t"], ["y"])], ["a", "b"])
    sess = session(m)
    assert set(placement(sess).values()) == {NAME}
    (exe,) = executables(sess)
    assert len(exe.programs) == 1
    assert exe.describe() == ["y = where(tanh(((a + b) * a)) < __const_float32_0.0, __const_float32_0.0, "
                              "tanh(((a + b) * a)))"]
    a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    (y,) = sess.run(None, {"a": a, "b": b})
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, np.maximum(np.tanh((a + b) * a), 0), rtol=1e-6, atol=1e-7)


def test_a_value_read_twice_is_computed_once(rng):
    m = model([N("Exp", ["a"], ["e"]), N("Mul", ["e", "e"], ["y"])], ["a"])
    sess = session(m)
    (exe,) = executables(sess)
    assert [p.out for p in exe.programs] == ["e", "y"]
    a = rng.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"a": a})[0], np.exp(a) ** 2, rtol=1e-6)


def test_non_elementwise_nodes_fall_back_to_cpu_with_a_reason(rng):
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], rng.standard_normal(16).tolist())
    m = model([N("Add", ["a", "b"], ["s"]), N("MatMul", ["s", "w"], ["mm"]), N("Sigmoid", ["mm"], ["y"])],
              ["a", "b"], initializers=[w])
    sess = session(m)
    rep = sess.get_partition_report()
    assert placement(sess) == {"Add": NAME, "MatMul": "CPUExecutionProvider", "Sigmoid": NAME}
    (mm,) = [n for n in rep.nodes if n.op_type == "MatMul"]
    assert "not one of the elementwise ops" in mm.declined[NAME]
    assert len(rep.partitions) == 3
    a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    wv = np.array(w.float_data, np.float32).reshape(4, 4)
    np.testing.assert_allclose(sess.run(None, {"a": a, "b": b})[0], 1 / (1 + np.exp(-((a + b) @ wv))),
                               rtol=1e-5, atol=1e-6)


def test_min_elements_declines_small_tensors():
    m = model([N("Add", ["a", "b"], ["y"])], ["a", "b"])
    sess = rt.InferenceSession(m, providers=["numexpr", "cpu"])  # default min_elements
    (node,) = sess.get_partition_report().nodes
    assert node.provider == "CPUExecutionProvider"
    assert "below min_elements=1048576" in node.declined[NAME]
    assert placement(session(m, min_elements="12")) == {"Add": NAME}
    assert placement(session(m, min_elements="13"))["Add"] == "CPUExecutionProvider"


def test_transcendentals_option():
    import numexpr

    m = model([N("Tanh", ["a"], ["y"])], ["a"])
    assert placement(session(m, transcendentals="always")) == {"Tanh": NAME}
    never = session(m, transcendentals="never").get_partition_report().nodes[0]
    assert never.provider == "CPUExecutionProvider" and "transcendentals=never" in never.declined[NAME]
    auto = session(m, transcendentals="auto").get_partition_report().nodes[0]
    if numexpr.use_vml:
        assert auto.provider == NAME
    else:
        assert "without Intel VML" in auto.declined[NAME]
    # arithmetic is claimed whatever the option says
    assert placement(session(model([N("Mul", ["a", "a"], ["y"])], ["a"]), transcendentals="never")) == {"Mul": NAME}


@pytest.mark.parametrize("options,match", [
    ({"min_elements": "many"}, "min_elements must be an integer"),
    ({"min_elements": "-1"}, "min_elements must be >= 0"),
    ({"transcendentals": "sometimes"}, "transcendentals must be auto, always or never"),
    ({"exclude_ops": "MatMul"}, "does not run: MatMul"),
    ({"threads": "4"}, "unknown numexpr provider option"),
])
def test_bad_options_are_refused(options, match):
    with pytest.raises(ProviderOptionsError, match=match):
        rt.InferenceSession(model([N("Add", ["a", "b"], ["y"])], ["a", "b"]), providers=[("numexpr", options)])


def test_exclude_ops():
    m = model([N("Add", ["a", "b"], ["s"]), N("Mul", ["s", "s"], ["y"])], ["a", "b"])
    assert placement(session(m, exclude_ops="Mul")) == {"Add": NAME, "Mul": "CPUExecutionProvider"}


def test_long_chains_are_split_below_the_depth_limit(rng):
    from runtime_provider_numexpr.fusion import MAX_DEPTH

    nodes, prev = [], "a"
    for i in range(3 * MAX_DEPTH):
        out = "y" if i == 3 * MAX_DEPTH - 1 else f"t{i}"
        nodes.append(N("Add", [prev, "b"], [out]) if i % 2 == 0 else N("Neg", [prev], [out]))
        prev = out
    sess = session(model(nodes, ["a", "b"]))
    (exe,) = executables(sess)
    assert 3 <= len(exe.programs) <= 5
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    a, b = a.astype(np.float32), b.astype(np.float32)
    want = a.copy()
    for i in range(3 * MAX_DEPTH):
        want = want + b if i % 2 == 0 else -want
    np.testing.assert_allclose(sess.run(None, {"a": a, "b": b})[0], want, rtol=1e-5, atol=1e-5)


def test_many_operands_are_split_below_the_operand_limit(rng):
    names = [f"x{i}" for i in range(40)]
    nodes, prev = [], names[0]
    for i, n in enumerate(names[1:]):
        out = "y" if i == len(names) - 2 else f"s{i}"
        nodes.append(N("Add", [prev, n], [out]))
        prev = out
    sess = session(model(nodes, names))
    (exe,) = executables(sess)
    assert len(exe.programs) >= 2
    feeds = {n: rng.standard_normal((3, 4)).astype(np.float32) for n in names}
    np.testing.assert_allclose(sess.run(None, feeds)[0], sum(feeds[n] for n in names), rtol=1e-5, atol=1e-5)


def test_integers_wrap_like_numpy_and_integer_division_is_declined():
    m = model([N("Mul", ["a", "b"], ["m"]), N("Add", ["m", "b"], ["y"])], ["a", "b"], elem=TensorProto.INT64)
    sess = session(m)
    assert set(placement(sess).values()) == {NAME}
    a = np.array([[2**62, -3, 7, 0]] * 3, np.int64)
    b = np.array([[4, 5, -6, 1]] * 3, np.int64)
    with np.errstate(over="ignore"):
        want = a * b + b
    np.testing.assert_array_equal(sess.run(None, {"a": a, "b": b})[0], want)
    div = session(model([N("Div", ["a", "b"], ["y"])], ["a", "b"], elem=TensorProto.INT64))
    (node,) = div.get_partition_report().nodes
    assert node.provider == "CPUExecutionProvider" and "Div on int64 is not implemented" in node.declined[NAME]


def test_broadcasting_and_comparisons(rng):
    g = helper.make_graph(
        [N("Greater", ["a", "b"], ["c"]), N("Where", ["c", "a", "b"], ["y"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.DOUBLE, [3, 1]),
         helper.make_tensor_value_info("b", TensorProto.DOUBLE, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [3, 4])])
    sess = session(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    assert set(placement(sess).values()) == {NAME}
    a, b = rng.standard_normal((3, 1)), rng.standard_normal((1, 4))
    (y,) = sess.run(None, {"a": a, "b": b})
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y, np.where(a > b, a, b))


def test_importing_the_plugin_does_not_import_numexpr():
    code = ("import sys, runtime_provider_numexpr.plugin as p; "
            "assert 'numexpr' not in sys.modules, 'numexpr imported at plugin import'; "
            "assert p.NumexprExecutionProvider.probe().available; assert 'numexpr' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_listed_by_runtime_core():
    info = {i["alias"]: i for i in rt.get_provider_info()}["numexpr"]
    assert info["status"] == "loaded" and info["available"]
    assert info["distribution"] == "runtime-provider-numexpr"
    from runtime_provider_numexpr import __version__

    assert info["version"] == __version__
