"""Basic optimization passes: what they remove, when they must not, and equal outputs."""

import numpy as np
import onnx
import pytest
from onnx import helper

import runtime_core as rt
from oracle import make_model, run_oracle
from runtime_core.cli import sample_model_path

L = rt.GraphOptimizationLevel
X = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)


def opts(level, disable=None, path=None):
    so = rt.SessionOptions()
    so.graph_optimization_level = level
    if disable:
        so.add_session_config_entry("optimization.disable_specified_optimizers", disable)
    if path:
        so.optimized_model_filepath = str(path)
    return so


def chain_model():
    nodes = [
        helper.make_node("Constant", [], ["c"], name="const", value=onnx.numpy_helper.from_array(np.float32(2.0) * np.ones(4, np.float32))),
        helper.make_node("Identity", ["x"], ["xi"], name="ident"),
        helper.make_node("Mul", ["xi", "c"], ["m"], name="mul"),
        helper.make_node("Relu", ["x"], ["dead"], name="unused"),
        helper.make_node("Identity", ["m"], ["y"], name="ident_out"),
    ]
    return make_model(nodes, {"x": X}, ["y"])


def ops(sess):
    return [n.name for n in sess.get_partition_report().nodes]


def test_disable_all_keeps_every_node():
    s = rt.InferenceSession(chain_model().SerializeToString(), opts(L.ORT_DISABLE_ALL))
    assert ops(s) == ["const", "ident", "mul", "unused", "ident_out"]
    np.testing.assert_allclose(s.run(None, {"x": X})[0], X * 2)


def test_basic_removes_constant_identity_and_dead_nodes_but_keeps_output_identity():
    s = rt.InferenceSession(chain_model().SerializeToString(), opts(L.ORT_ENABLE_BASIC))
    assert ops(s) == ["mul", "ident_out"]
    assert s.optimizations == {"ConstantToInitializer": 1, "IdentityElimination": 1, "DeadNodeElimination": 1}
    np.testing.assert_allclose(s.run(None, {"x": X})[0], X * 2)


def test_disable_specified_optimizers():
    s = rt.InferenceSession(chain_model().SerializeToString(),
                            opts(L.ORT_ENABLE_ALL, disable="IdentityElimination,DeadNodeElimination"))
    assert ops(s) == ["ident", "mul", "unused", "ident_out"]


def test_optimized_model_file_runs_in_onnxruntime(tmp_path):
    out = tmp_path / "opt.onnx"
    rt.InferenceSession(chain_model().SerializeToString(), opts(L.ORT_ENABLE_ALL, path=out))
    m = onnx.load(out)
    onnx.checker.check_model(m)
    assert [n.op_type for n in m.graph.node] == ["Mul", "Identity"]
    np.testing.assert_allclose(run_oracle(m, {"x": X})[0], X * 2)


@pytest.mark.parametrize("level", list(L))
def test_every_level_gives_the_same_outputs(level):
    img = np.random.default_rng(0).standard_normal((2, 1, 28, 28)).astype(np.float32)
    ref = rt.InferenceSession(str(sample_model_path()), opts(L.ORT_DISABLE_ALL)).run(None, {"image": img})[0]
    got = rt.InferenceSession(str(sample_model_path()), opts(level)).run(None, {"image": img})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4)
