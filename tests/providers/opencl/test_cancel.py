"""Cancellation inside an OpenCL partition (plugin API 1.3 ``run(..., stop=)``): the executable
checks ``stop`` before each kernel it enqueues, so a run whose ``RunOptions.terminate`` is set
while one kernel runs enqueues no further kernel and ends in ``RunTerminatedError``; the
session keeps working."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import runtime_core as rt
from oracle import make_model
from runtime_core.errors import RunTerminatedError

from opencl_helpers import OCL, ocl, requires_pocl, session

pytestmark = requires_pocl

OPS = ("Relu", "Neg", "Sigmoid", "Abs", "Relu", "Neg")


def _chain():
    x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(4, 6)
    names = ["x"] + [f"v{i}" for i in range(len(OPS) - 1)] + ["y"]
    nodes = [helper.make_node(op, [names[i]], [names[i + 1]], name=f"n{i}") for i, op in enumerate(OPS)]
    return make_model(nodes, {"x": x}, ["y"]), x


def _reference(x):
    for op in OPS:
        x = {"Relu": lambda v: np.maximum(v, 0), "Neg": np.negative, "Abs": np.abs,
             "Sigmoid": lambda v: 1 / (1 + np.exp(-v))}[op](x)
    return x


def _opencl_step(sess):
    steps = [st for st in sess._plan.steps if getattr(st, "provider", None) is not None
             and st.provider.name == OCL]
    assert len(steps) == 1, "the chain is one OpenCL partition"
    return steps[0]


class _Spy:
    """A kernel step that records that it ran (and may set the run's flag while it runs)."""

    def __init__(self, inner, ran: list, on_run=None):
        self.inner, self.ran, self.on_run = inner, ran, on_run
        self.node = inner.node

    def run(self, env, dev):
        self.ran.append(self.node.name)
        if self.on_run is not None:
            self.on_run()
        self.inner.run(env, dev)


def test_the_executor_passes_stop_to_the_opencl_executable():
    model, _ = _chain()
    sess = session(model, providers=[ocl()])
    assert all(n.provider == OCL for n in sess.get_partition_report().nodes)
    assert _opencl_step(sess).takes_stop


def test_stop_is_checked_before_each_kernel():
    model, x = _chain()
    sess = session(model, providers=[ocl()])
    exe = _opencl_step(sess).executable
    from runtime_provider_opencl.tensor import OpenCLTensor

    calls = []

    def stop():
        calls.append(1)
        if len(calls) == 3:
            raise RunTerminatedError("terminated (test)")

    with pytest.raises(RunTerminatedError):  # unwrapped: not an OpenCLKernelError
        exe.run([OpenCLTensor.from_numpy(x, exe.dev)], stop=stop)
    assert len(calls) == 3
    calls.clear()
    out = exe.run([OpenCLTensor.from_numpy(x, exe.dev)], stop=lambda: calls.append(1))
    n_steps = len(next(iter(exe._cache.values())).steps)
    assert len(calls) == n_steps >= len(OPS)
    np.testing.assert_allclose(out[0].numpy(), _reference(x), rtol=1e-5, atol=1e-6)


def test_terminate_set_during_a_kernel_stops_the_partition_there():
    model, x = _chain()
    sess = session(model, providers=[ocl()])
    exe = _opencl_step(sess).executable
    spec = next(iter(exe._cache.values()))  # a static partition: specialized once, at compile
    ro = rt.RunOptions()
    ran: list = []
    fired: list = []

    def fire_once():  # the flag is set while the second kernel runs, in the first run only
        if not fired:
            fired.append(1)
            ro.terminate = True

    spec.steps[:] = [_Spy(st, ran, fire_once if i == 1 else None) for i, st in enumerate(spec.steps)]
    with pytest.raises(RunTerminatedError):
        sess.run(None, {"x": x}, ro)
    assert ran == [spec.steps[0].node.name, spec.steps[1].node.name], "no kernel after the flag"
    ro.terminate = False
    ran.clear()
    np.testing.assert_allclose(sess.run(None, {"x": x}, ro)[0], _reference(x), rtol=1e-5, atol=1e-6)
    assert len(ran) == len(spec.steps)
