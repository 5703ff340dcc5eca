"""Cancellation inside a CUDA partition (plugin API 1.3 ``run(..., stop=)``), exercised on the
numpy stand-in for cupy: the executable checks ``stop`` before each step it launches, so a run
whose ``RunOptions.terminate`` is set while one step runs launches no further step and ends in
``RunTerminatedError``; the session keeps working."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt
from runtime_core.errors import RunTerminatedError

STANDIN = "CUDAStandInExecutionProvider"
rng = np.random.default_rng(0)
W1 = rng.standard_normal((6, 5)).astype(np.float32)
W2 = rng.standard_normal((5, 4)).astype(np.float32)
X = rng.standard_normal((3, 6)).astype(np.float32)


def _model():
    """MatMul -> Softmax -> MatMul -> Softmax -> Transpose: five steps (none of them fusible)."""
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w1"], ["a"], name="mm1"), n("Softmax", ["a"], ["b"], name="sm1", axis=-1),
             n("MatMul", ["b", "w2"], ["c"], name="mm2"), n("Softmax", ["c"], ["d"], name="sm2", axis=-1),
             n("Transpose", ["d"], ["y"], name="tr")]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])],
                          [numpy_helper.from_array(W1, "w1"), numpy_helper.from_array(W2, "w2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m.SerializeToString()


def _softmax(v):
    e = np.exp(v - v.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _reference():
    return _softmax(_softmax(X @ W1) @ W2).T


def _session(standin):
    sess = rt.InferenceSession(_model(), providers=["cudastandin"])
    assert all(n.provider == STANDIN for n in sess.get_partition_report().nodes)
    steps = [st for st in sess._plan.steps if getattr(st, "provider", None) is not None
             and st.provider.name == STANDIN]
    assert len(steps) == 1, "the chain is one partition"
    return sess, steps[0]


def test_the_executor_passes_stop_to_the_cuda_executable(standin):
    _, step = _session(standin)
    assert step.takes_stop


def test_stop_is_checked_before_each_step(standin):
    _, step = _session(standin)
    exe = step.executable
    calls = []

    def stop():
        calls.append(1)
        if len(calls) == 3:
            raise RunTerminatedError("terminated (test)")

    with pytest.raises(RunTerminatedError):  # unwrapped: not a CUDAKernelError
        exe.run([exe.backend.to_device(X)], stop=stop)
    assert len(calls) == 3
    calls.clear()
    out = exe.run([exe.backend.to_device(X)], stop=lambda: calls.append(1))
    assert len(calls) == len(exe.steps) == 5
    np.testing.assert_allclose(exe.backend.to_host(out[0]), _reference(), rtol=1e-5, atol=1e-6)


def test_terminate_set_during_a_step_stops_the_partition_there(standin):
    sess, step = _session(standin)
    exe = step.executable
    ro = rt.RunOptions()
    ran: list = []
    fired: list = []

    def spy(st, fire):
        fn = st.fn

        def run(*args, **kw):
            ran.append(st.node.name)
            if fire and not fired:  # the flag is set while the second step runs, in the first run only
                fired.append(1)
                ro.terminate = True
            return fn(*args, **kw)
        return run

    for i, st in enumerate(exe.steps):
        st.fn = spy(st, i == 1)
    with pytest.raises(RunTerminatedError):
        sess.run(None, {"x": X}, ro)
    assert ran == ["mm1", "sm1"], "no step after the flag"
    ro.terminate = False
    ran.clear()
    np.testing.assert_allclose(sess.run(None, {"x": X}, ro)[0], _reference(), rtol=1e-5, atol=1e-6)
    assert ran == ["mm1", "sm1", "mm2", "sm2", "tr"]
