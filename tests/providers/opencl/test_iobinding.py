"""OrtValue and IOBinding on OpenCL (PoCL): device-resident loops, counted transfers.

Transfers are observed twice: by the session (``get_transfer_stats``) and by the
device context itself (``DeviceContext.transfers`` counts every upload, download and
on-device copy), so a copy the core forgot to count would still show up.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

import runtime_core as rt
from oracle import assert_close, make_model, run_oracle
from runtime_core.errors import InvalidArgumentError, UnsupportedDeviceOperationError

from opencl_helpers import CPU, OCL, TEST_PLATFORM, RTOL, ATOL, ocl, placement, requires_pocl, session

pytestmark = requires_pocl

rng = np.random.default_rng(11)


def w(*shape, scale=0.3):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


X = w(6, 16, scale=1.0)


def block_model():
    """y = LayerNorm(Tanh(x @ W + b) + x): the output has the input's shape (a loop)."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b"], ["hb"], name="add"),
             helper.make_node("Tanh", ["hb"], ["t"], name="tanh"),
             helper.make_node("Add", ["t", "x"], ["res"], name="res"),
             helper.make_node("LayerNormalization", ["res", "g", "beta"], ["y"], name="ln", axis=-1)]
    inits = {"W": w(16, 16), "b": w(16), "g": 1 + w(16, scale=0.1), "beta": w(16, scale=0.1)}
    return make_model(nodes, {"x": X}, ["y"], initializers=inits)


@pytest.fixture(scope="module")
def device_id():
    """The device_id of the device the sessions here run on (the test platform's)."""
    from runtime_provider_opencl.device import list_devices, select_device

    chosen = select_device(TEST_PLATFORM)
    return next(i for i, d in enumerate(list_devices()) if (d.platform, d.device) == (chosen.platform, chosen.device))


def traffic(sess):
    """The PoCL context's own counters (shared by every session on the device)."""
    prov = next(p for p in sess._providers if p.name == OCL)
    return dict(prov.dev.transfers)


def delta(after, before):
    return {k: after[k] - before[k] for k in after}


def test_ortvalue_from_numpy_on_opencl(device_id):
    from runtime_provider_opencl.tensor import OpenCLTensor

    v = rt.OrtValue.ortvalue_from_numpy(X, "opencl", device_id)
    assert v.device_name() == "opencl"
    assert isinstance(v._value, OpenCLTensor)
    assert (v.shape(), v.data_type(), v.element_type(), v.tensor_size_in_bytes()) == (
        [6, 16], "tensor(float)", TensorProto.FLOAT, X.nbytes)
    np.testing.assert_array_equal(v.numpy(), X)
    assert v.__dlpack_device__() == (4, device_id)  # kDLOpenCL
    e = rt.OrtValue.ortvalue_from_shape_and_type([3, 5], np.float32, "OpenCLExecutionProvider", device_id)
    assert (e.shape(), e.device_name()) == ([3, 5], "opencl")
    with pytest.raises(InvalidArgumentError, match="OpenCL device_id 99 is out of range; devices: "):
        rt.OrtValue.ortvalue_from_numpy(X, "opencl", 99)
    with pytest.raises(InvalidArgumentError, match="strings"):
        rt.OrtValue.ortvalue_from_numpy(np.array(["a"]), "opencl", device_id)


def test_iobinding_loop_stays_on_opencl_without_host_copies(device_id):
    m = block_model()
    sess = session(m)
    assert set(placement(sess).values()) == {OCL}
    x = rt.OrtValue.ortvalue_from_numpy(X, "opencl", device_id)
    b = sess.io_binding()
    b.bind_output("y", "opencl", device_id)
    before = traffic(sess)
    expected = X
    for _ in range(5):
        b.bind_ortvalue_input("x", x)
        sess.run_with_iobinding(b)
        (x,) = b.get_outputs()
        assert x.device_name() == "opencl"
        assert b.get_transfer_stats().copies == []
        expected = run_oracle(m, {"x": expected})[0]
    d = delta(traffic(sess), before)
    assert (d["uploads"], d["downloads"]) == (0, 0)  # the device saw no host transfer
    st = sess.get_transfer_stats()
    assert (st.to_host, st.to_device, st.runs) == (0, 0, 5)
    assert_close(b.copy_outputs_to_cpu(), [expected], RTOL, ATOL)
    d = delta(traffic(sess), before)
    assert (d["downloads"], d["bytes_down"]) == (1, X.nbytes) and stats_pair(sess) == (1, 0)


def stats_pair(obj):
    st = obj.get_transfer_stats()
    return st.to_host, st.to_device


def test_cpu_input_is_uploaded_once_and_the_output_stays(device_id):
    m = block_model()
    sess = session(m)
    b = sess.io_binding()
    b.bind_cpu_input("x", X)
    b.bind_output("y", "opencl", device_id)
    before = traffic(sess)
    sess.run_with_iobinding(b)
    d = delta(traffic(sess), before)
    assert (d["uploads"], d["bytes_up"], d["downloads"]) == (1, X.nbytes, 0)
    st = b.get_transfer_stats()
    assert [(c.value, c.src, c.dst, c.bytes) for c in st.copies] == [("x", "host", OCL, X.nbytes)]
    (y,) = b.get_outputs()
    assert y.device_name() == "opencl"
    assert_close([y.numpy()], run_oracle(m, {"x": X}), RTOL, ATOL)


def test_outputs_of_one_session_feed_another_on_the_same_device(device_id):
    m = block_model()
    first, second = session(m), session(m)
    b1, b2 = first.io_binding(), second.io_binding()
    b1.bind_ortvalue_input("x", rt.OrtValue.ortvalue_from_numpy(X, "opencl", device_id))
    b1.bind_output("y", "opencl", device_id)
    first.run_with_iobinding(b1)
    before = traffic(second)
    b2.bind_ortvalue_input("x", b1.get_outputs()[0])
    b2.bind_output("y", "opencl", device_id)
    second.run_with_iobinding(b2)
    d = delta(traffic(second), before)
    assert (d["uploads"], d["downloads"]) == (0, 0) and stats_pair(second) == (0, 0)
    ref = run_oracle(m, {"x": run_oracle(m, {"x": X})[0]})
    assert_close([b2.get_outputs()[0].numpy()], ref, RTOL, ATOL)


def test_preallocated_opencl_output_is_written_on_the_device(device_id):
    m = block_model()
    sess = session(m)
    dst = rt.OrtValue.ortvalue_from_shape_and_type([6, 16], np.float32, "opencl", device_id)
    buffer = dst._value.buffer
    b = sess.io_binding()
    b.bind_ortvalue_input("x", rt.OrtValue.ortvalue_from_numpy(X, "opencl", device_id))
    b.bind_ortvalue_output("y", dst)
    before = traffic(sess)
    sess.run_with_iobinding(b)
    d = delta(traffic(sess), before)
    assert (d["uploads"], d["downloads"], d["device_copies"]) == (0, 0, 1)
    st = b.get_transfer_stats()
    assert (st.to_host, st.to_device, st.device_to_device) == (0, 0, 1)
    assert b.get_outputs()[0] is dst and dst._value.buffer is buffer
    assert_close([dst.numpy()], run_oracle(m, {"x": X}), RTOL, ATOL)
    b.bind_ortvalue_output("y", rt.OrtValue.ortvalue_from_shape_and_type([6, 8], np.float32, "opencl",
                                                                         device_id))
    with pytest.raises(InvalidArgumentError, match=r"shape \[6, 16\].*shape \[6, 8\]"):
        sess.run_with_iobinding(b)


def test_update_inplace_and_raw_buffer_handles(device_id):
    m = block_model()
    sess = session(m)
    v = rt.OrtValue.ortvalue_from_shape_and_type([6, 16], np.float32, "opencl", device_id)
    v.update_inplace(X)
    np.testing.assert_array_equal(v.numpy(), X)
    copy = rt.OrtValue.ortvalue_from_shape_and_type([6, 16], np.float32, "opencl", device_id)
    copy.update_inplace(v)  # on the device
    np.testing.assert_array_equal(copy.numpy(), X)
    out = rt.OrtValue.ortvalue_from_shape_and_type([6, 16], np.float32, "opencl", device_id)
    assert v.data_ptr() == v._value.buffer.int_ptr != out.data_ptr()
    b = sess.io_binding()
    b.bind_input("x", "opencl", device_id, np.float32, [6, 16], v.data_ptr())
    b.bind_output("y", "opencl", device_id, TensorProto.FLOAT, [6, 16], out.data_ptr())
    before = traffic(sess)
    sess.run_with_iobinding(b)
    assert delta(traffic(sess), before)["uploads"] == 0
    assert_close([out.numpy()], run_oracle(m, {"x": X}), RTOL, ATOL)
    with pytest.raises(InvalidArgumentError, match="needs 1536"):
        b.bind_input("x", "opencl", device_id, np.float32, [6, 64], v.data_ptr())


def test_boundary_copies_only_when_a_node_runs_on_cpu(device_id):
    m = block_model()
    sess = session(m, [ocl(exclude_ops="Tanh"), "cpu"])
    where = placement(sess)
    assert where["tanh"] == CPU and where["mm"] == where["ln"] == OCL
    inner = sorted((c.value, c.src, c.dst) for c in sess.get_partition_report().copies
                   if c.value not in ("x", "y"))
    assert inner == [("hb", OCL, CPU), ("t", CPU, OCL)]
    b = sess.io_binding()
    b.bind_ortvalue_input("x", rt.OrtValue.ortvalue_from_numpy(X, "opencl", device_id))
    b.bind_output("y", "opencl", device_id)
    before = traffic(sess)
    sess.run_with_iobinding(b)
    st = b.get_transfer_stats()
    assert sorted((c.value, c.src, c.dst) for c in st.copies) == inner
    d = delta(traffic(sess), before)
    assert (d["downloads"], d["uploads"]) == (st.to_host, st.to_device) == (1, 1)
    assert (d["bytes_down"], d["bytes_up"]) == (st.bytes_to_host, st.bytes_to_device)
    assert_close([b.get_outputs()[0].numpy()], run_oracle(m, {"x": X}), RTOL, ATOL)


def test_compile_time_outputs_are_not_shared_with_the_caller(device_id):
    # Shape of a device value is a compile-time constant of the partition; a caller
    # writing into its output must not change the next run's result
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Shape", ["r"], ["s"], name="shape")]
    m = make_model(nodes, {"x": X}, ["s", "r"])
    opts = rt.SessionOptions()
    opts.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = session(m, sess_options=opts)
    assert placement(sess) == {"relu": OCL, "shape": OCL}
    b = sess.io_binding()
    b.bind_cpu_input("x", X)
    b.bind_output("s", "opencl", device_id)
    sess.run_with_iobinding(b)
    (s,) = b.get_outputs()
    s.update_inplace(np.zeros(2, np.int64))
    sess.run_with_iobinding(b)
    np.testing.assert_array_equal(b.copy_outputs_to_cpu()[0], run_oracle(m, {"x": X})[0])


def test_dlpack_is_declined_with_the_reason(device_id):
    v = rt.OrtValue.ortvalue_from_numpy(X, "opencl", device_id)
    with pytest.raises(UnsupportedDeviceOperationError, match="pyopencl implements neither DLPack"):
        v.to_dlpack()
    with pytest.raises(UnsupportedDeviceOperationError, match="OpenCLExecutionProvider cannot export"):
        torch.from_dlpack(v)
    with pytest.raises(UnsupportedDeviceOperationError, match="cannot import DLPack device kDLOpenCL"):
        rt.OrtValue.from_dlpack(_OpenCLClaim())


class _OpenCLClaim:
    def __dlpack_device__(self):
        return (4, 0)

    def __dlpack__(self, stream=None):
        raise AssertionError("must not be exported")
