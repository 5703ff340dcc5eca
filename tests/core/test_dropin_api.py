"""The onnxruntime API a user script calls, written as a user writes it and compared with
onnxruntime where it runs here (CPU package)."""

import logging
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt
from runtime_core.capi import onnxruntime_pybind11_state as S
from runtime_core.errors import (InputShapeError, InputTypeError, ModelTypeError, ProviderUnavailableError,
                                 UnknownProviderError)

ort = pytest.importorskip("onnxruntime")
from onnxruntime.capi import onnxruntime_pybind11_state as OS  # noqa: E402


def model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m.SerializeToString()


def relu(shape=("N", 3), elem=TensorProto.FLOAT, out_elem=None):
    return model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", elem, list(shape))],
                 [helper.make_tensor_value_info("y", out_elem or elem, list(shape))])


def matmul_with_overridable_weight():
    w = np.arange(6, dtype=np.float32).reshape(3, 2)
    return model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3]),
                  helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, 2])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
                 inits=[numpy_helper.from_array(w, "w")])


def both(m, so_setup=None, **kw):
    out = []
    for mod in (ort, rt):
        so = mod.SessionOptions()
        if so_setup:
            so_setup(so)
        out.append(mod.InferenceSession(m, so, providers=["CPUExecutionProvider"], **kw))
    return out


# -- exceptions -----------------------------------------------------------------------------

NAMES = ["Fail", "InvalidArgument", "NoSuchFile", "NoModel", "EngineError", "RuntimeException",
         "InvalidProtobuf", "ModelLoaded", "NotImplemented", "InvalidGraph", "EPFail"]


def test_capi_has_onnxruntimes_exception_classes():
    for n in NAMES:
        assert hasattr(OS, n)
        assert issubclass(getattr(S, n), Exception)
    assert rt.capi.onnxruntime_pybind11_state is S


def _raised(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return exc
    raise AssertionError("no exception")


def _ort_class_name(exc):
    return type(exc).__name__ if type(exc).__module__.endswith("pybind11_state") else None


@pytest.mark.parametrize("case", ["dtype", "rank", "dim", "output_name", "missing_file", "garbage_bytes",
                                  "type_mismatch", "unknown_op"])
def test_each_error_is_catchable_as_the_class_onnxruntime_raises(case, tmp_path):
    """Whatever class onnxruntime raises in a situation, ours is an instance of it."""
    m = relu(shape=(2, 3))
    calls = {
        "dtype": lambda mod: mod.InferenceSession(m).run(None, {"x": np.zeros((2, 3), np.float64)}),
        "rank": lambda mod: mod.InferenceSession(m).run(None, {"x": np.zeros(3, np.float32)}),
        "dim": lambda mod: mod.InferenceSession(m).run(None, {"x": np.zeros((4, 3), np.float32)}),
        "output_name": lambda mod: mod.InferenceSession(m).run(["q"], {"x": np.zeros((2, 3), np.float32)}),
        "missing_file": lambda mod: mod.InferenceSession(str(tmp_path / "missing.onnx")),
        "garbage_bytes": lambda mod: mod.InferenceSession(b"\x08\x07 not a protobuf at all"),
        "type_mismatch": lambda mod: mod.InferenceSession(relu((2,), TensorProto.FLOAT, TensorProto.INT64)),
        "unknown_op": lambda mod: mod.InferenceSession(model(
            [helper.make_node("NoSuchOp", ["x"], ["y"])], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])),
    }
    theirs = _raised(lambda: calls[case](ort))
    ours = _raised(lambda: calls[case](rt))
    name = _ort_class_name(theirs)
    assert name is not None, f"onnxruntime raised {type(theirs)}"
    assert isinstance(ours, getattr(S, name)), f"{case}: onnxruntime raises {name}; ours {type(ours).__mro__}"
    assert isinstance(ours, rt.errors.RuntimeCoreError)


def test_user_code_catching_invalid_argument_catches_a_dtype_error():
    s = rt.InferenceSession(relu())
    try:
        s.run(None, {"x": np.zeros((1, 3), np.int32)})
    except S.InvalidArgument as exc:
        assert isinstance(exc, InputTypeError)
    else:
        raise AssertionError("no error")


def test_type_mismatch_is_refused_at_creation_not_at_run():
    with pytest.raises(ModelTypeError, match="'y' is declared tensor\\(int64\\).*Relu.*tensor\\(float\\)") as ei:
        rt.InferenceSession(relu((2,), TensorProto.FLOAT, TensorProto.INT64))
    assert isinstance(ei.value, S.Fail) and isinstance(ei.value, S.InvalidGraph)


# -- run ------------------------------------------------------------------------------------

def test_run_with_empty_output_list_returns_every_output():
    m = model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["x"], ["b"])],
              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2]),
               helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])])
    theirs, ours = both(m)
    x = np.array([-1, 2], np.float32)
    want = theirs.run([], {"x": x})
    got = ours.run([], {"x": x})
    assert len(got) == len(want) == 2
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("feed", [[[1, 2, 3]], [[1.7, -2.0, 3.5], [0, 0, 1]], [[True, False, True]]])
def test_python_lists_are_fed_as_onnxruntime_converts_them(feed):
    for elem in (TensorProto.FLOAT, TensorProto.INT64):
        m = model([helper.make_node("Identity", ["x"], ["y"])],
                  [helper.make_tensor_value_info("x", elem, ["N", 3])], [helper.make_tensor_value_info("y", elem, ["N", 3])])
        theirs, ours = both(m)
        want = theirs.run(None, {"x": feed})[0]
        got = ours.run(None, {"x": feed})[0]
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_ragged_list_is_a_typed_error():
    s = rt.InferenceSession(relu())
    with pytest.raises(InputTypeError, match="'x'"):
        s.run(None, {"x": [[1, 2, 3], [4, 5]]})
    with pytest.raises(InputTypeError):
        s.run(None, {"x": [["a", "b", "c"]]})


# -- overridable initializers and free dimensions -------------------------------------------

def test_overridable_initializer_fed_by_name_is_used():
    theirs, ours = both(matmul_with_overridable_weight())
    assert [(i.name, i.shape, i.type) for i in ours.get_overridable_initializers()] == \
           [(i.name, i.shape, i.type) for i in theirs.get_overridable_initializers()]
    x = np.ones((4, 3), np.float32)
    w2 = np.full((3, 2), -2.0, np.float32)
    for feed in ({"x": x, "w": w2}, {"x": x}, {"x": x, "w": w2 * 3}):
        np.testing.assert_allclose(ours.run(None, feed)[0], theirs.run(None, feed)[0], rtol=1e-6)
    with pytest.raises(InputShapeError, match="'w'"):
        ours.run(None, {"x": x, "w": np.ones((3, 3), np.float32)})


def test_free_dimension_override_by_name_fixes_the_dim():
    def setup(so):
        so.add_free_dimension_override_by_name("batch", 5)

    theirs, ours = both(matmul_with_overridable_weight(), setup)
    assert [i.shape for i in ours.get_inputs()] == [i.shape for i in theirs.get_inputs()] == [[5, 3]]
    assert [o.shape for o in ours.get_outputs()] == [o.shape for o in theirs.get_outputs()]
    x = np.ones((5, 3), np.float32)
    np.testing.assert_allclose(ours.run(None, {"x": x})[0], theirs.run(None, {"x": x})[0])
    with pytest.raises(OS.InvalidArgument):
        theirs.run(None, {"x": np.ones((2, 3), np.float32)})
    with pytest.raises(S.InvalidArgument):
        ours.run(None, {"x": np.ones((2, 3), np.float32)})


def test_free_dimension_override_by_denotation():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 3])
    x.type.tensor_type.shape.dim[0].denotation = "DATA_BATCH"
    m = model([helper.make_node("Relu", ["x"], ["y"])], [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 3])])

    def setup(so):
        so.add_free_dimension_override_by_denotation("DATA_BATCH", 2)

    theirs, ours = both(m, setup)
    assert ours.get_inputs()[0].shape == theirs.get_inputs()[0].shape == [2, 3]
    assert ours.get_outputs()[0].shape == theirs.get_outputs()[0].shape


def test_free_dimension_override_refuses_a_bad_value():
    so = rt.SessionOptions()
    with pytest.raises(rt.errors.InvalidArgumentError, match="int >= 0"):
        so.add_free_dimension_override_by_name("batch", -1)
    with pytest.raises(rt.errors.InvalidArgumentError):
        so.add_free_dimension_override_by_name("", 1)


# -- providers --------------------------------------------------------------------------------

def test_session_without_providers_uses_cpu_only(monkeypatch):
    monkeypatch.delenv("RUNTIME_CORE_DEFAULT_PROVIDERS", raising=False)
    s = rt.InferenceSession(relu())
    assert s.get_providers() == ["CPUExecutionProvider"]
    assert "CPUExecutionProvider" in rt.get_available_providers()


def test_default_providers_from_env_and_config(monkeypatch):
    avail = rt.get_available_providers()
    monkeypatch.setenv("RUNTIME_CORE_DEFAULT_PROVIDERS", "all")
    assert rt.InferenceSession(relu()).get_providers() == avail
    monkeypatch.setenv("RUNTIME_CORE_DEFAULT_PROVIDERS", "cpu")
    so = rt.SessionOptions()
    so.add_session_config_entry("session.default_providers", "all")  # the entry wins over the env
    assert rt.InferenceSession(relu(), so).get_providers() == avail
    # explicit providers win over both
    assert rt.InferenceSession(relu(), so, providers=["cpu"]).get_providers() == ["CPUExecutionProvider"]


def test_set_providers_rebuilds_the_session():
    s = rt.InferenceSession(relu(), providers=["CPUExecutionProvider"])
    x = np.array([[-1, 0, 2]], np.float32)
    before = s.run(None, {"x": x})[0]
    avail = rt.get_available_providers()
    s.set_providers(avail)
    assert s.get_providers() == avail
    np.testing.assert_array_equal(s.run(None, {"x": x})[0], before)
    s.set_providers(["CPUExecutionProvider"], [{}])
    assert s.get_providers() == ["CPUExecutionProvider"]


def test_set_providers_unknown_name_raises_like_onnxruntime():
    theirs, ours = both(relu())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError):
            theirs.set_providers(["NoSuchExecutionProvider"])
    with pytest.raises(UnknownProviderError) as ei:
        ours.set_providers(["NoSuchExecutionProvider"])
    assert isinstance(ei.value, RuntimeError)
    assert ours.get_providers() == ["CPUExecutionProvider"]  # unchanged


def test_disable_fallback_makes_an_unavailable_provider_an_error():
    unavailable = [i["name"] for i in rt.get_provider_info() if i["status"] == "loaded" and not i["available"]]
    if not unavailable:
        pytest.skip("every installed provider is available here")
    s = rt.InferenceSession(relu(), providers=["cpu"])
    s.disable_fallback()
    with pytest.raises(ProviderUnavailableError, match="fallback is disabled"):
        s.set_providers([unavailable[0], "cpu"])
    s.enable_fallback()
    with pytest.warns(rt.ProviderFallbackWarning) as rec:
        s.set_providers([unavailable[0], "cpu"])
    assert s.get_providers() == ["CPUExecutionProvider"]
    assert rec[0].filename == __file__  # the warning points at this (the user's) line


def test_fallback_warning_points_at_the_users_line():
    with pytest.warns(rt.ProviderFallbackWarning) as rec:
        rt.InferenceSession(relu(), providers=["NoSuchExecutionProvider", "cpu"])
    assert rec[0].filename == __file__


# -- logging --------------------------------------------------------------------------------

def test_default_logger_severity_sets_the_logging_level():
    log = logging.getLogger("runtime_core")
    old = log.level
    try:
        for sev, level in [(0, logging.DEBUG), (1, logging.INFO), (2, logging.WARNING), (3, logging.ERROR),
                           (4, logging.CRITICAL)]:
            ort.set_default_logger_severity(sev)  # both accept the same values
            rt.set_default_logger_severity(sev)
            assert log.level == level
        rt.set_default_logger_severity(3)
        rt.set_default_logger_verbosity(0)
        assert log.level == logging.ERROR
        for bad in (5, -1, "x", 1.5):
            with pytest.raises(rt.errors.InvalidArgumentError):
                rt.set_default_logger_severity(bad)
        with pytest.raises(rt.errors.InvalidArgumentError):
            rt.set_default_logger_verbosity(-1)
    finally:
        ort.set_default_logger_severity(2)
        log.setLevel(old)
