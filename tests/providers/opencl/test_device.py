"""Device tensors, memory methods, the program cache, and thread safety."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import helper

from oracle import make_model, run_oracle

from opencl_helpers import TEST_PLATFORM, graph_view, node_view, requires_pocl, session, vi

pytestmark = requires_pocl


@pytest.mark.parametrize("arr", [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.array(2.5, np.float32),
    np.array([True, False, True]),
    np.arange(5, dtype=np.int64),
    np.zeros((0, 3), np.float32),
    np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2],  # not contiguous
    np.arange(4, dtype=">f4"),  # not native byte order
])
def test_copy_round_trip(provider, arr):
    from runtime_provider_opencl.tensor import OpenCLTensor

    t = provider.copy_to_device(arr)
    assert isinstance(t, OpenCLTensor) and t.shape == arr.shape and t.nbytes == arr.size * arr.itemsize
    back = provider.copy_to_host(t)
    assert isinstance(back, np.ndarray) and back.shape == arr.shape
    np.testing.assert_array_equal(back, arr)
    assert back.dtype == arr.dtype.newbyteorder("=")
    assert provider.copy_to_device(t) is t  # already on this device


def test_allocate_view_and_synchronize(provider):
    t = provider.allocate((2, 3), np.float32)
    assert t.shape == (2, 3) and t.dtype == np.float32
    v = t.view((3, 2))
    assert v.buffer is t.buffer and v.shape == (3, 2)
    with pytest.raises(ValueError, match="cannot view"):
        t.view((4,))
    provider.synchronize()
    assert "OpenCLTensor(shape=(2, 3)" in repr(t)


def test_copy_rejects_what_is_not_a_device_tensor(provider):
    with pytest.raises(TypeError, match="not an OpenCLTensor"):
        provider.copy_to_host(np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="cannot live on an OpenCL device"):
        provider.copy_to_device(np.array(["a"], dtype=object))


def test_programs_are_built_once_per_context():
    from runtime_provider_opencl.device import get_context, select_device

    dev = get_context(select_device(TEST_PLATFORM))
    x = np.ones((2, 8), np.float32)
    model = make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Softmax", ["r"], ["y"])],
                       {"x": x}, ["y"])
    session(model).run(None, {"x": x})
    builds = dev.builds
    assert builds >= 2 and set(dev._programs) >= {"elementwise.cl", "reduce.cl"}
    session(model).run(None, {"x": x})
    assert dev.builds == builds


def test_compile_and_run_a_partition_directly(provider):
    from runtime_core.plugin import Partition

    x, y = vi("x", (2, 3)), vi("y", (2, 3))
    node = node_view("Relu", [x], [y], since=14)
    assert provider.get_capability(graph_view(node)).claims == [node]
    exe = provider.compile(Partition(0, provider.name, (node,), ("x",), ("y",), {}, {"x": x, "y": y}))
    arr = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    out = exe.run([provider.copy_to_device(arr)])
    np.testing.assert_array_equal(provider.copy_to_host(out[0]), np.maximum(arr, 0))
    with pytest.raises(TypeError, match="not an OpenCLTensor"):
        exe.run([arr])
    with pytest.raises(ValueError, match=r"compiled for \(2, 3\)"):
        exe.run([provider.copy_to_device(np.ones((3, 2), np.float32))])


def test_concurrent_runs_share_one_queue():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 16)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Tanh", ["h"], ["t"]),
             helper.make_node("Softmax", ["t"], ["y"], axis=-1)]
    model = make_model(nodes, {"x": w[:4]}, ["y"], initializers={"w": w})
    sess = session(model)
    feeds = [rng.standard_normal((4, 16)).astype(np.float32) for _ in range(6)]
    expected = [run_oracle(model, {"x": f})[0] for f in feeds]
    got = [None] * len(feeds)
    errors = []

    def work(i):
        try:
            for _ in range(15):
                got[i] = sess.run(None, {"x": feeds[i]})[0]
                np.testing.assert_allclose(got[i], expected[i], rtol=1e-3, atol=1e-3)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(feeds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
