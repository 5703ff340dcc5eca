"""The ORT-compatible session surface and input validation."""

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import runtime_core as rt
from oracle import make_model
from runtime_core.errors import (
    InputNameError,
    InputShapeError,
    InputTypeError,
    MissingInputError,
    OutputNameError,
    RuntimeCoreError,
)


def two_input_model():
    g = helper.make_graph(
        [helper.make_node("Identity", ["tokens"], ["out_tokens"]), helper.make_node("Identity", ["mask"], ["out_mask"])],
        "two", [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", "seq", 4]),
                helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("out_tokens", TensorProto.FLOAT, ["batch", "seq", 4]),
         helper.make_tensor_value_info("out_mask", TensorProto.INT64, ["batch", "seq"])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="tests",
                          doc_string="two inputs")
    m.ir_version = 9
    m.model_version = 3
    onnx.helper.set_model_props(m, {"author": "runtime-core"})
    return m


@pytest.fixture(scope="module")
def sess():
    return rt.InferenceSession(two_input_model().SerializeToString(), providers=["CPUExecutionProvider"])


def feeds(b=2, s=5):
    return {"tokens": np.ones((b, s, 4), np.float32), "mask": np.ones((b, s), np.int64)}


def test_inputs_outputs_and_meta(sess):
    ins = sess.get_inputs()
    assert [(i.name, i.type, i.shape) for i in ins] == [
        ("tokens", "tensor(float)", ["batch", "seq", 4]), ("mask", "tensor(int64)", ["batch", "seq"])]
    assert [o.name for o in sess.get_outputs()] == ["out_tokens", "out_mask"]
    meta = sess.get_modelmeta()
    assert meta.producer_name == "tests" and meta.version == 3 and meta.description == "two inputs"
    assert meta.custom_metadata_map == {"author": "runtime-core"}
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert rt.get_device() == "CPU"


def test_run_all_and_selected_outputs(sess):
    f = feeds()
    a, b = sess.run(None, f)
    np.testing.assert_array_equal(a, f["tokens"])
    np.testing.assert_array_equal(b, f["mask"])
    (only,) = sess.run(["out_mask"], f)
    np.testing.assert_array_equal(only, f["mask"])
    assert sess.run(["out_mask"], f, rt.RunOptions())[0].dtype == np.int64


def test_unknown_input_name_lists_expected_and_nearest(sess):
    f = feeds()
    f["tokenz"] = f.pop("tokens")
    with pytest.raises(InputNameError) as ei:
        sess.run(None, f)
    msg = str(ei.value)
    assert "'tokenz'" in msg and "did you mean 'tokens'" in msg and "tokens, mask" in msg
    assert isinstance(ei.value, KeyError) and isinstance(ei.value, RuntimeCoreError)


def test_missing_input_names_it(sess):
    with pytest.raises(MissingInputError, match=r"'mask'.*tensor\(int64\).*'batch', 'seq'"):
        sess.run(None, {"tokens": feeds()["tokens"]})


def test_wrong_dtype_names_input_expected_and_received(sess):
    f = feeds()
    f["tokens"] = f["tokens"].astype(np.float64)
    with pytest.raises(InputTypeError, match=r"'tokens'.*tensor\(float\).*float64"):
        sess.run(None, f)
    f = feeds()
    f["mask"] = "not an array"
    with pytest.raises(InputTypeError, match="'mask'"):
        sess.run(None, f)


def test_wrong_rank_and_dim_name_symbolic_dims(sess):
    f = feeds()
    f["mask"] = np.ones((2, 5, 1), np.int64)
    with pytest.raises(InputShapeError, match=r"'mask'.*rank 2.*'batch', 'seq'.*rank 3"):
        sess.run(None, f)
    f = feeds()
    f["tokens"] = np.ones((2, 5, 3), np.float32)
    with pytest.raises(InputShapeError, match=r"'tokens' dim 2 must be 4"):
        sess.run(None, f)


def test_unknown_output_name(sess):
    with pytest.raises(OutputNameError, match="out_mask"):
        sess.run(["out_mask", "out_tokenz"], feeds())


def test_bad_feed_container(sess):
    with pytest.raises(InputTypeError):
        sess.run(None, [np.ones(3)])


@pytest.mark.parametrize("kind", ["fortran", "strided", "readonly", "byteswapped"])
def test_unusual_arrays_are_read_correctly(sess, kind):
    base = np.arange(2 * 5 * 4, dtype=np.float32).reshape(2, 5, 4)
    if kind == "fortran":
        x = np.asfortranarray(base)
    elif kind == "strided":
        big = np.zeros((4, 10, 8), np.float32)
        big[::2, ::2, ::2] = base
        x = big[::2, ::2, ::2]
    elif kind == "readonly":
        x = base.copy()
        x.setflags(write=False)
    else:
        x = base.astype(base.dtype.newbyteorder(">"))
    f = feeds()
    f["tokens"] = x
    np.testing.assert_array_equal(sess.run(None, f)[0], base)


def test_session_options_surface():
    so = rt.SessionOptions()
    assert so.graph_optimization_level == rt.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = rt.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    so.add_session_config_entry("session.some_key", "v")
    assert so.get_session_config_entry("session.some_key") == "v"
    with pytest.raises(KeyError):
        so.get_session_config_entry("session.unset")
    s = rt.InferenceSession(two_input_model().SerializeToString(), so, providers=["cpu"])
    assert s.get_session_options() is so
    assert int(rt.GraphOptimizationLevel.ORT_ENABLE_ALL) == 99


def test_provider_tuple_and_alias_forms():
    m = two_input_model().SerializeToString()
    for providers in (["cpu"], [("CPUExecutionProvider", {})], ("CPUExecutionProvider",), "cpu"):
        assert rt.InferenceSession(m, providers=providers).get_providers() == ["CPUExecutionProvider"]
    # no providers given: the CPU provider only (as onnxruntime's CPU package), whatever is installed
    assert rt.InferenceSession(m).get_providers() == ["CPUExecutionProvider"]


def test_eight_threads_share_one_session():
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    nodes = [helper.make_node("Identity", ["x"], ["y"])]
    s = rt.InferenceSession(make_model(nodes, {"x": x}, ["y"]).SerializeToString())
    inputs = [np.full((3, 5), i, np.float32) for i in range(8)]
    results = [[] for _ in range(8)]
    barrier = threading.Barrier(8)

    def work(i):
        barrier.wait()
        for _ in range(50):
            results[i].append(s.run(None, {"x": inputs[i]})[0])

    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    for i in range(8):
        assert all(np.array_equal(r, inputs[i]) for r in results[i])


def test_initializer_output_and_input_passthrough():
    w = np.arange(4, dtype=np.float32)
    g = helper.make_graph([], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
                           helper.make_tensor_value_info("w", TensorProto.FLOAT, [4])],
                          initializer=[onnx.numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    s = rt.InferenceSession(m.SerializeToString())
    x = np.ones(4, np.float32)
    a, b = s.run(None, {"x": x})
    np.testing.assert_array_equal(a, x)
    np.testing.assert_array_equal(b, w)
    b[0] = 42  # the caller owns its outputs: the next run is unaffected
    assert s.run(None, {"x": x})[1][0] == 0


def test_eight_threads_on_a_real_model_get_identical_outputs():
    from runtime_core.cli import sample_model_path

    s = rt.InferenceSession(str(sample_model_path()))
    rng = np.random.default_rng(7)
    imgs = [rng.standard_normal((2, 1, 28, 28)).astype(np.float32) for _ in range(8)]
    expected = [s.run(None, {"image": im})[0] for im in imgs]
    got = [[] for _ in range(8)]
    barrier = threading.Barrier(8)

    def work(i):
        barrier.wait()
        for _ in range(10):
            got[i].append(s.run(None, {"image": imgs[i]})[0])

    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    for i in range(8):
        assert all(np.array_equal(g, expected[i]) for g in got[i])


def test_failed_run_leaves_the_session_usable():
    from runtime_core.cli import sample_model_path

    s = rt.InferenceSession(str(sample_model_path()))
    img = np.zeros((1, 1, 28, 28), np.float32)
    ok = s.run(None, {"image": img})[0]
    with pytest.raises(InputShapeError):
        s.run(None, {"image": np.zeros((1, 1, 27, 28), np.float32)})
    np.testing.assert_array_equal(s.run(None, {"image": img})[0], ok)


def test_output_declared_with_a_wrong_type_is_an_error_not_a_silent_result(monkeypatch):
    from runtime_core.errors import ModelTypeError

    monkeypatch.setenv("RUNTIME_CORE_CHECK_KERNELS", "0")  # the session-level check, not the debug one
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    # refused at session creation, as onnxruntime refuses it (Fail: "Type Error"), not at the first run
    ort = pytest.importorskip("onnxruntime")
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail as OrtFail

    with pytest.raises(OrtFail):
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(ModelTypeError, match=r"'y' is declared tensor\(double\).*Identity.*tensor\(float\)"):
        rt.InferenceSession(m.SerializeToString())
