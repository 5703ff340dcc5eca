"""OrtValue, IOBinding and DLPack in the core: on the host (vs onnxruntime) and on the
fixture 'fakegpu' device, whose tensors are not arrays and whose copies are counted by
the provider itself (an observation independent of the session's transfer counter)."""

from __future__ import annotations

import ctypes
import sys
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import runtime_core as rt
from oracle import make_model, run_oracle
from runtime_core.errors import (
    InputNameError,
    InputShapeError,
    InputTypeError,
    InvalidArgumentError,
    MissingInputError,
    OutputNameError,
    ProviderUnavailableError,
    UnknownProviderError,
    UnsupportedDeviceOperationError,
)
from runtime_core.plugin import reload_plugins

SITE = Path(__file__).parents[1] / "plugins" / "fixtures" / "site"
FAKE = "FakeGpuExecutionProvider"
CPU = "CPUExecutionProvider"
rng = np.random.default_rng(0)
X = rng.standard_normal((4, 8)).astype(np.float32)
W = (rng.standard_normal((8, 8)) * 0.4).astype(np.float32)
B = rng.standard_normal((8,)).astype(np.float32)


@pytest.fixture
def fakegpu(monkeypatch):
    """The fixture distribution on sys.path (real entry points), its copy counters zeroed."""
    monkeypatch.syspath_prepend(str(SITE))
    for mod in [m for m in sys.modules if m.startswith("rt_fixture_providers")]:
        del sys.modules[mod]
    reload_plugins()
    from rt_fixture_providers import fakegpu as mod

    for k in mod.COUNTERS:
        mod.COUNTERS[k] = 0
    yield mod
    monkeypatch.undo()
    reload_plugins()


def session(model, providers=("cpu",)):
    return rt.InferenceSession(model.SerializeToString(), providers=list(providers))


def mlp_model():
    """y = Relu(x @ W + B): square, so the output can be fed back as the next input."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "B"], ["hb"], name="add"),
             helper.make_node("Relu", ["hb"], ["y"], name="relu")]
    return make_model(nodes, {"x": X}, ["y"], initializers={"W": W, "B": B})


def diamond_model():
    """a = Relu(x) and y = a + Sigmoid(a): Relu/Add on the fake device, Sigmoid on CPU."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Sigmoid", ["a"], ["b"], name="sig"),
             helper.make_node("Add", ["a", "b"], ["y"], name="add")]
    return make_model(nodes, {"x": X}, ["y", "a"])


def two_output_model():
    nodes = [helper.make_node("Add", ["x", "z"], ["s"], name="add"),
             helper.make_node("Mul", ["s", "z"], ["p"], name="mul")]
    return make_model(nodes, {"x": X, "z": X[::-1].copy()}, ["s", "p"])


def stats(obj) -> tuple[int, int]:
    st = obj.get_transfer_stats()
    return st.to_host, st.to_device


# -- host OrtValue ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64, np.int32, np.int8,
                                   np.uint8, np.bool_])
def test_host_ortvalue_metadata_matches_onnxruntime(dtype):
    a = (rng.standard_normal((2, 3, 4)) * 10).astype(dtype)
    ours = rt.OrtValue.ortvalue_from_numpy(a)
    theirs = ort.OrtValue.ortvalue_from_numpy(a)
    for method in ("shape", "data_type", "element_type", "device_name", "tensor_size_in_bytes",
                   "is_tensor", "has_value", "is_sparse_tensor", "is_tensor_sequence"):
        assert getattr(ours, method)() == getattr(theirs, method)(), method
    assert ours.numpy() is a  # wraps, no copy
    assert ours.data_ptr() == a.ctypes.data == theirs.data_ptr()
    np.testing.assert_array_equal(np.asarray(ours), theirs.numpy())


@pytest.mark.parametrize("element_type", [np.float32, np.int64, TensorProto.FLOAT, TensorProto.DOUBLE,
                                          TensorProto.BOOL, TensorProto.FLOAT16])
def test_shape_and_type_factory_matches_onnxruntime(element_type):
    ours = rt.OrtValue.ortvalue_from_shape_and_type([3, 0, 2], element_type)
    theirs = ort.OrtValue.ortvalue_from_shape_and_type([3, 0, 2], element_type)
    assert (ours.shape(), ours.data_type(), ours.element_type(), ours.device_name()) == (
        theirs.shape(), theirs.data_type(), theirs.element_type(), theirs.device_name())
    assert ours.numpy().dtype == theirs.numpy().dtype


def test_non_contiguous_array_is_copied_to_contiguous():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    v = rt.OrtValue.ortvalue_from_numpy(a)
    assert v.numpy().flags.c_contiguous and not np.shares_memory(v.numpy(), a)
    np.testing.assert_array_equal(v.numpy(), a)


def test_reinterpreting_onnx_type_keeps_memory():
    a = np.array([1.0, -2.0], np.float16)
    v = rt.OrtValue.ortvalue_from_numpy_with_onnx_type(a.view(np.uint16), TensorProto.FLOAT16)
    assert v.data_type() == "tensor(float16)" and np.shares_memory(v.numpy(), a)
    with pytest.raises(InvalidArgumentError, match="item sizes must match"):
        rt.OrtValue.ortvalue_from_numpy_with_onnx_type(a, TensorProto.FLOAT)


@pytest.mark.parametrize("value", [[np.ones(2)], {"a": np.ones(2)}])
def test_non_tensors_are_declined(value):
    with pytest.raises(InvalidArgumentError, match="only dense tensors"):
        rt.OrtValue.ortvalue_from_numpy(value)


def test_update_inplace_writes_the_same_memory():
    a = np.zeros((2, 3), np.float32)
    v = rt.OrtValue.ortvalue_from_numpy(a)
    v.update_inplace(np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(a, np.arange(6).reshape(2, 3))
    with pytest.raises(InvalidArgumentError, match="update_inplace needs float32"):
        v.update_inplace(np.zeros((2, 3), np.float64))


def test_unknown_device_is_a_typed_error_naming_it():
    with pytest.raises(UnknownProviderError, match=r"unknown device 'tpu'.*devices: cpu"):
        rt.OrtValue.ortvalue_from_numpy(X, "tpu", 0)
    with pytest.raises(InvalidArgumentError, match="device_id"):
        rt.OrtValue.ortvalue_from_numpy(X, "cpu", 1)
    with pytest.raises(InvalidArgumentError, match="vendor_id"):
        rt.OrtValue.ortvalue_from_numpy(X, "cpu", 0, 4318)


def test_unavailable_device_gives_the_probe_reason(fakegpu):
    with pytest.raises(ProviderUnavailableError, match="nodevice.*no fake accelerator found"):
        rt.OrtValue.ortvalue_from_numpy(X, "nodevice")


# -- DLPack on the host --------------------------------------------------------------

@pytest.fixture
def torch():
    """torch (a test dependency), imported by the DLPack tests that exchange tensors with it
    only: importing it costs seconds and the rest of this module does not need it."""
    import torch

    return torch


def test_torch_tensor_round_trips_through_dlpack_without_a_copy(torch):
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    v = rt.OrtValue.from_dlpack(t)
    assert (v.shape(), v.data_type(), v.device_name()) == ([3, 4], "tensor(float)", "cpu")
    t[1, 2] = -5.0
    assert v.numpy()[1, 2] == -5.0  # shares the torch storage
    back = torch.from_dlpack(v)
    back[0, 0] = 42.0
    assert t[0, 0].item() == 42.0 and back.data_ptr() == t.data_ptr()
    assert v.__dlpack_device__() == (1, 0)


def test_capsules_are_accepted_both_ways(torch):
    a = np.arange(6, dtype=np.int64)
    v = rt.OrtValue.ortvalue_from_numpy(a)
    t = torch.utils.dlpack.from_dlpack(v.to_dlpack())
    t[2] = 100
    assert a[2] == 100
    src = torch.ones(5, dtype=torch.bool)
    w = rt.OrtValue.from_dlpack(torch.utils.dlpack.to_dlpack(src))  # a raw, legacy capsule
    assert w.data_type() == "tensor(bool)" and w.numpy().all()
    src[0] = False
    assert not w.numpy()[0]
    capsule = torch.zeros(2).__dlpack__()
    rt.OrtValue.from_dlpack(capsule)
    with pytest.raises(InvalidArgumentError, match="unused DLPack capsule"):
        rt.OrtValue.from_dlpack(capsule)  # consumed by the first import
    with pytest.raises(InvalidArgumentError, match="__dlpack__"):
        rt.OrtValue.from_dlpack(5)


def test_numpy_imports_an_ortvalue_through_dlpack():
    a = rng.standard_normal((2, 2)).astype(np.float32)
    assert np.shares_memory(np.from_dlpack(rt.OrtValue.ortvalue_from_numpy(a)), a)


def test_non_contiguous_dlpack_tensor_is_declined_like_onnxruntime(torch):
    with pytest.raises(InvalidArgumentError, match="only contiguous tensors"):
        rt.OrtValue.from_dlpack(torch.arange(6.0).reshape(2, 3).T)


def test_session_runs_on_a_dlpack_import(torch):
    m = mlp_model()
    t = torch.from_numpy(X.copy())
    out = session(m).run(None, {"x": rt.OrtValue.from_dlpack(t)})
    np.testing.assert_allclose(out[0], run_oracle(m, {"x": X})[0], rtol=1e-5, atol=1e-6)


# -- IOBinding on the host ------------------------------------------------------------

def test_cpu_binding_matches_onnxruntime_binding():
    m = two_output_model()
    feeds = {"x": X, "z": X[::-1].copy()}
    ref = ort.InferenceSession(m.SerializeToString(), providers=[CPU])
    rb = ref.io_binding()
    sess = session(m)
    b = sess.io_binding()
    for binding in (rb, b):
        binding.bind_cpu_input("x", feeds["x"])
        binding.bind_ortvalue_input("z", (rt if binding is b else ort).OrtValue.ortvalue_from_numpy(feeds["z"]))
        binding.bind_output("p")
        binding.bind_output("s")
        binding.bind_output("p")  # rebinding keeps the first position
    ref.run_with_iobinding(rb)
    sess.run_with_iobinding(b)
    ours, theirs = b.get_outputs(), rb.get_outputs()
    assert len(ours) == len(theirs) == 2
    for o, t in zip(ours, theirs):
        assert (o.device_name(), o.shape(), o.data_type()) == (t.device_name(), t.shape(), t.data_type())
        np.testing.assert_allclose(o.numpy(), t.numpy(), rtol=1e-6)
    host = b.copy_outputs_to_cpu()
    assert not np.shares_memory(host[0], ours[0].numpy())  # copies, as in onnxruntime
    np.testing.assert_allclose(host[1], rb.copy_outputs_to_cpu()[1], rtol=1e-6)
    assert stats(b) == (0, 0) and stats(sess) == (0, 0)


def test_preallocated_cpu_output_is_written_in_place():
    m = two_output_model()
    sess = session(m)
    b = sess.io_binding()
    b.bind_cpu_input("x", X)
    b.bind_cpu_input("z", X)
    dst = np.full(X.shape, np.nan, np.float32)
    b.bind_ortvalue_output("s", rt.OrtValue.ortvalue_from_numpy(dst))
    sess.run_with_iobinding(b)
    np.testing.assert_allclose(dst, X + X, rtol=1e-6)
    assert np.shares_memory(b.get_outputs()[0].numpy(), dst)
    b.bind_ortvalue_output("s", rt.OrtValue.ortvalue_from_shape_and_type([3, 8], np.float32))
    with pytest.raises(InvalidArgumentError, match=r"output 's' is tensor\(float\) of shape \[4, 8\]"):
        sess.run_with_iobinding(b)


def test_cpu_buffer_pointers_are_wrapped_without_a_copy():
    m = two_output_model()
    sess = session(m)
    b = sess.io_binding()
    z = np.ones_like(X)
    out = np.zeros_like(X)
    b.bind_cpu_input("x", X)
    b.bind_input("z", "cpu", 0, np.float32, list(z.shape), z.ctypes.data)
    b.bind_output("p", "cpu", 0, TensorProto.FLOAT, list(out.shape), out.ctypes.data)
    sess.run_with_iobinding(b)
    np.testing.assert_allclose(out, (X + z) * z, rtol=1e-6)
    with pytest.raises(InvalidArgumentError, match="element_type` and `shape`"):
        b.bind_output("p", "cpu", 0, None, None, out.ctypes.data)
    with pytest.raises(InvalidArgumentError, match="non-null"):
        b.bind_input("z", "cpu", 0, np.float32, [4, 8], 0)


def test_binding_errors_are_typed():
    sess = session(two_output_model())
    b = sess.io_binding()
    with pytest.raises(InputNameError, match="did you mean 'x'"):
        b.bind_cpu_input("xx", X)
    with pytest.raises(OutputNameError, match="did you mean 'p'"):
        b.bind_output("pp")
    with pytest.raises(InvalidArgumentError, match="takes an OrtValue"):
        b.bind_ortvalue_input("x", X)
    b.bind_cpu_input("x", X)
    b.bind_cpu_input("z", X)
    with pytest.raises(InvalidArgumentError, match="At least one output"):
        sess.run_with_iobinding(b)
    b.bind_output("s")
    with pytest.raises(InvalidArgumentError, match="session that created it"):
        session(two_output_model()).run_with_iobinding(b)
    b.bind_cpu_input("z", X.astype(np.float64))
    with pytest.raises(InputTypeError, match="'z' expects tensor\\(float\\)"):
        sess.run_with_iobinding(b)
    b.bind_cpu_input("z", X[:2])
    with pytest.raises(InputShapeError, match="'z' dim 0 must be 4"):
        sess.run_with_iobinding(b)
    assert b.get_outputs() == []  # a failed run leaves no stale result
    b.clear_binding_inputs()
    with pytest.raises(MissingInputError, match="missing input"):
        sess.run_with_iobinding(b)
    b.bind_cpu_input("x", X)
    b.bind_cpu_input("z", X)
    sess.run_with_iobinding(b)
    assert len(b.get_outputs()) == 1
    b.clear_binding_outputs()
    assert b.get_outputs() == []
    with pytest.raises(InvalidArgumentError, match="At least one output"):
        sess.run_with_iobinding(b)


# -- a device whose tensors are not arrays: fakegpu -----------------------------------

def test_device_ortvalue_lives_on_the_fake_device(fakegpu):
    v = rt.OrtValue.ortvalue_from_numpy(X, "fakegpu", 0)
    assert v.device_name() == "fakegpu"
    assert isinstance(v._value, fakegpu.DeviceTensor)
    assert (v.shape(), v.data_type(), v.element_type()) == ([4, 8], "tensor(float)", TensorProto.FLOAT)
    assert fakegpu.COUNTERS == {"to_device": 1, "to_host": 0}  # metadata needs no copy
    np.testing.assert_array_equal(v.numpy(), X)
    assert fakegpu.COUNTERS == {"to_device": 1, "to_host": 1}
    assert rt.OrtValue.ortvalue_from_numpy(X, "FakeGpuExecutionProvider").device_name() == "fakegpu"
    empty = rt.OrtValue.ortvalue_from_shape_and_type([2, 5], np.float32, "fakegpu")
    assert empty.shape() == [2, 5] and empty.device_name() == "fakegpu"
    with pytest.raises(InvalidArgumentError, match="no device_id 3"):
        rt.OrtValue.ortvalue_from_numpy(X, "fakegpu", 3)


def test_feeding_device_outputs_back_makes_no_host_copies(fakegpu):
    m = mlp_model()
    sess = session(m, ["fakegpu", "cpu"])
    assert {n.provider for n in sess.get_partition_report().nodes} == {FAKE}
    x = rt.OrtValue.ortvalue_from_numpy(X, "fakegpu", 0)
    assert fakegpu.COUNTERS == {"to_device": 1, "to_host": 0}
    b = sess.io_binding()
    b.bind_output("y", "fakegpu")
    expected = X
    for _ in range(4):
        b.bind_ortvalue_input("x", x)
        sess.run_with_iobinding(b)
        (x,) = b.get_outputs()
        assert x.device_name() == "fakegpu" and isinstance(x._value, fakegpu.DeviceTensor)
        assert b.get_transfer_stats().copies == []
        expected = run_oracle(m, {"x": expected})[0]
    assert fakegpu.COUNTERS == {"to_device": 1, "to_host": 0}  # the provider saw no copy
    st = sess.get_transfer_stats()
    assert (st.to_host, st.to_device, st.runs) == (0, 0, 4)
    np.testing.assert_allclose(b.copy_outputs_to_cpu()[0], expected, rtol=1e-5, atol=1e-6)
    assert fakegpu.COUNTERS == {"to_device": 1, "to_host": 1}
    assert stats(b) == (1, 0) and stats(sess) == (1, 0)


def test_only_boundary_copies_remain_with_device_bindings(fakegpu):
    m = diamond_model()
    sess = session(m, ["fakegpu", "cpu"])
    rep = sess.get_partition_report()
    assert {n.name: n.provider for n in rep.nodes} == {"relu": FAKE, "sig": CPU, "add": FAKE}
    inner = [(c.value, c.src, c.dst) for c in rep.copies if c.value not in ("x", "y", "a")]
    # a plain run copies the input up and both outputs down, plus the boundary copies
    sess.run(None, {"x": X})
    assert fakegpu.COUNTERS["to_device"] == sum(c.dst == FAKE for c in rep.copies)
    assert fakegpu.COUNTERS["to_host"] == sum(c.src == FAKE for c in rep.copies)
    assert stats(sess) == (fakegpu.COUNTERS["to_host"], fakegpu.COUNTERS["to_device"])
    sess.reset_transfer_stats()
    before = dict(fakegpu.COUNTERS)
    x = rt.OrtValue.ortvalue_from_numpy(X, "fakegpu")
    b = sess.io_binding()
    b.bind_ortvalue_input("x", x)
    b.bind_output("y", "fakegpu")
    b.bind_output("a", "fakegpu")
    sess.run_with_iobinding(b)
    copies = [(c.value, c.src, c.dst) for c in b.get_transfer_stats().copies]
    assert ("a", FAKE, CPU) in copies and len(copies) == len(inner) + 1  # a to Sigmoid, b back
    assert sorted(copies) == sorted(inner + [("a", FAKE, CPU)])
    ups = fakegpu.COUNTERS["to_device"] - before["to_device"] - 1  # minus making x
    downs = fakegpu.COUNTERS["to_host"] - before["to_host"]
    assert (downs, ups) == stats(b) == stats(sess)
    ref = run_oracle(m, {"x": X})
    y, a = b.get_outputs()
    assert y.device_name() == a.device_name() == "fakegpu"
    np.testing.assert_allclose(y.numpy(), ref[0], rtol=1e-6)
    np.testing.assert_allclose(a.numpy(), ref[1], rtol=1e-6)


def test_device_input_for_a_cpu_node_is_copied_once_and_counted(fakegpu):
    m = make_model([helper.make_node("Sigmoid", ["x"], ["y"], name="sig")], {"x": X}, ["y"])
    sess = session(m, ["fakegpu", "cpu"])
    b = sess.io_binding()
    b.bind_ortvalue_input("x", rt.OrtValue.ortvalue_from_numpy(X, "fakegpu"))
    b.bind_output("y", "fakegpu")
    sess.run_with_iobinding(b)
    st = b.get_transfer_stats()
    assert [(c.value, c.src, c.dst, c.bytes) for c in st.copies] == [
        ("x", FAKE, "host", X.nbytes), ("y", "host", FAKE, X.nbytes)]
    assert (st.to_host, st.bytes_to_host, st.to_device, st.bytes_to_device) == (1, X.nbytes, 1, X.nbytes)
    assert fakegpu.COUNTERS == {"to_device": 2, "to_host": 1}
    np.testing.assert_allclose(b.get_outputs()[0].numpy(), run_oracle(m, {"x": X})[0], rtol=1e-6)


def test_host_binding_of_a_device_output_copies_once(fakegpu):
    m = mlp_model()
    sess = session(m, ["fakegpu", "cpu"])
    b = sess.io_binding()
    b.bind_cpu_input("x", X)
    b.bind_output("y")  # cpu
    sess.run_with_iobinding(b)
    assert stats(b) == (1, 1) and fakegpu.COUNTERS == {"to_device": 1, "to_host": 1}
    assert b.get_outputs()[0].device_name() == "cpu"
    np.testing.assert_allclose(b.get_outputs()[0].numpy(), run_oracle(m, {"x": X})[0], rtol=1e-5, atol=1e-6)


def test_an_input_passed_through_as_an_output_stays_where_it_is(fakegpu):
    m = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], {"x": X}, ["y", "x"])
    sess = session(m, ["fakegpu", "cpu"])
    x = rt.OrtValue.ortvalue_from_numpy(X, "fakegpu")
    b = sess.io_binding()
    b.bind_ortvalue_input("x", x)
    b.bind_output("x", "fakegpu")
    b.bind_output("y", "fakegpu")
    sess.run_with_iobinding(b)
    assert b.get_outputs()[0]._value is x._value and stats(b) == (0, 0)
    b.bind_output("x")  # now wanted on the host: one copy
    sess.run_with_iobinding(b)
    assert stats(b) == (1, 0)
    np.testing.assert_array_equal(b.get_outputs()[0].numpy(), X)
    np.testing.assert_allclose(b.get_outputs()[1].numpy(), run_oracle(m, {"x": X})[0])


def test_plain_run_accepts_device_ortvalues_without_copying_them(fakegpu):
    m = mlp_model()
    sess = session(m, ["fakegpu", "cpu"])
    x = rt.OrtValue.ortvalue_from_numpy(X, "fakegpu")
    out = sess.run(None, {"x": x})
    assert fakegpu.COUNTERS == {"to_device": 1, "to_host": 1} and stats(sess) == (1, 0)
    np.testing.assert_allclose(out[0], run_oracle(m, {"x": X})[0], rtol=1e-5, atol=1e-6)
    (v,) = sess.run_with_ort_values(["y"], {"x": x})
    assert v.device_name() == "cpu"
    np.testing.assert_allclose(v.numpy(), out[0])


def test_bad_device_inputs_are_refused_before_any_copy(fakegpu):
    sess = session(mlp_model(), ["fakegpu", "cpu"])
    b = sess.io_binding()
    b.bind_output("y", "fakegpu")
    b.bind_ortvalue_input("x", rt.OrtValue.ortvalue_from_numpy(X.astype(np.float64), "fakegpu"))
    with pytest.raises(InputTypeError, match=r"'x' expects tensor\(float\).*tensor\(double\) on fakegpu"):
        sess.run_with_iobinding(b)
    b.bind_ortvalue_input("x", rt.OrtValue.ortvalue_from_numpy(X[:, :4], "fakegpu"))
    with pytest.raises(InputShapeError, match="'x' dim 1 must be 8"):
        sess.run_with_iobinding(b)
    assert fakegpu.COUNTERS["to_host"] == 0


def test_fake_device_declines_what_it_cannot_do_with_typed_errors(fakegpu):
    sess = session(mlp_model(), ["fakegpu", "cpu"])
    v = rt.OrtValue.ortvalue_from_numpy(X, "fakegpu")
    with pytest.raises(UnsupportedDeviceOperationError, match="FakeGpuExecutionProvider.*DLPack"):
        v.__dlpack__()
    with pytest.raises(UnsupportedDeviceOperationError, match="no DLPack device type"):
        v.__dlpack_device__()
    with pytest.raises(UnsupportedDeviceOperationError, match="raw device pointers"):
        v.data_ptr()
    with pytest.raises(UnsupportedDeviceOperationError, match="write into an existing device tensor"):
        v.update_inplace(X)
    b = sess.io_binding()
    with pytest.raises(UnsupportedDeviceOperationError, match="cannot wrap raw device pointers"):
        b.bind_input("x", "fakegpu", 0, np.float32, [4, 8], 1234)
    b.bind_cpu_input("x", X)
    b.bind_ortvalue_output("y", rt.OrtValue.ortvalue_from_shape_and_type([4, 8], np.float32, "fakegpu"))
    with pytest.raises(UnsupportedDeviceOperationError, match="write output 'y' into a preallocated"):
        sess.run_with_iobinding(b)
    # kDLCUDA memory needs a CUDA provider: none installed (unknown) or one without a GPU (unavailable)
    with pytest.raises((UnknownProviderError, ProviderUnavailableError), match="kDLCUDA|'cuda'"):
        rt.OrtValue.from_dlpack(_FakeCudaArray())


class _FakeCudaArray:
    """Claims to be CUDA memory; nothing installed here handles kDLCUDA."""

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None):
        raise AssertionError("must not be exported")


def test_bindings_in_threads_are_independent(fakegpu):
    m = mlp_model()
    sess = session(m, ["fakegpu", "cpu"])
    inputs = [rng.standard_normal((4, 8)).astype(np.float32) for _ in range(4)]
    results: dict[int, np.ndarray] = {}
    errors = []

    def work(i):
        try:
            b = sess.io_binding()
            b.bind_ortvalue_input("x", rt.OrtValue.ortvalue_from_numpy(inputs[i], "fakegpu"))
            b.bind_output("y", "fakegpu")
            for _ in range(3):
                sess.run_with_iobinding(b)
                b.bind_ortvalue_input("x", b.get_outputs()[0])
            results[i] = b.copy_outputs_to_cpu()[0]
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, x in enumerate(inputs):
        for _ in range(3):
            x = run_oracle(m, {"x": x})[0]
        np.testing.assert_allclose(results[i], x, rtol=1e-5, atol=1e-6)
    st = sess.get_transfer_stats()
    assert (st.to_host, st.to_device, st.runs) == (4, 0, 12)


def test_pointer_helper_rejects_object_dtype():
    from runtime_core.session.ortvalue import host_array_from_pointer

    buf = (ctypes.c_char * 8)()
    with pytest.raises(InvalidArgumentError, match="strings/objects"):
        host_array_from_pointer(ctypes.addressof(buf), (1,), object)
