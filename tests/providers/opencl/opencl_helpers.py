"""Helpers of the OpenCL provider tests: run small models on PoCL, compare with onnxruntime.

Everything that needs a device is skipped with "pyopencl/PoCL not installed" when
pyopencl cannot be imported or has no PoCL platform; the tests of unavailability
reasons and packaging need only runtime-provider-opencl itself.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
from onnx import helper

import runtime_core as rt
from oracle import assert_close, make_model, run_oracle

SKIP_REASON = "pyopencl/PoCL not installed"
POCL_PLATFORM = "Portable Computing Language"
#: the platform the device tests run on: $RUNTIME_CORE_OPENCL_PLATFORM (an index, or a substring
#: of a platform's name, vendor or version: "debian" or "3.0-rc2" pick one of two PoCLs), else
#: PoCL (of two PoCLs, the first whose compiler builds a kernel here)
TEST_PLATFORM = os.environ.get("RUNTIME_CORE_OPENCL_PLATFORM", "").strip() or POCL_PLATFORM
#: why the selected platform cannot run kernels (None when it can, or when nothing is installed)
POCL_UNUSABLE = None
OCL = "OpenCLExecutionProvider"
CPU = "CPUExecutionProvider"
RTOL = ATOL = 1e-3


def _pocl_present() -> bool:
    if importlib.util.find_spec("pyopencl") is None:
        return False
    try:
        import pyopencl as cl

        return any(p.get_devices() for p in cl.get_platforms())
    except Exception:  # noqa: BLE001 - no platform, broken ICD loader
        return False


def _unusable() -> str | None:
    """Why the provider cannot run on TEST_PLATFORM here (its own selection and build check)."""
    from runtime_provider_opencl.device import OpenCLUnavailable, select_device

    try:
        select_device(TEST_PLATFORM)
    except (OpenCLUnavailable, ValueError) as exc:
        return str(exc)
    return None


HAVE_PACKAGE = importlib.util.find_spec("runtime_provider_opencl") is not None
POCL_INSTALLED = HAVE_PACKAGE and _pocl_present()
if POCL_INSTALLED:
    POCL_UNUSABLE = _unusable()
    if POCL_UNUSABLE:
        SKIP_REASON = f"no usable OpenCL device on platform {TEST_PLATFORM!r}: {POCL_UNUSABLE}"
HAVE_POCL = POCL_INSTALLED and not POCL_UNUSABLE
#: under CI (CI=true) or RUNTIME_CORE_OPENCL_REQUIRED=1, a missing or unusable device fails the run
REQUIRED = (os.environ.get("RUNTIME_CORE_OPENCL_REQUIRED") == "1"
            or os.environ.get("CI", "").strip().lower() in ("true", "1"))

requires_pocl = pytest.mark.skipif(not HAVE_POCL, reason=SKIP_REASON)
requires_package = pytest.mark.skipif(not HAVE_PACKAGE, reason="runtime-provider-opencl not installed")

# every session in these tests pins the test platform, whatever other OpenCL driver the machine has
OPTIONS = {"platform": TEST_PLATFORM}


def ocl(**extra):
    """The providers entry for OpenCL on PoCL, with extra options."""
    return ("opencl", {**OPTIONS, **{k: str(v) for k, v in extra.items()}})


def session(model, providers=None, **kw):
    return rt.InferenceSession(model.SerializeToString(), providers=providers or [ocl(), "cpu"], **kw)


def placement(sess) -> dict[str, str]:
    return {n.name: n.provider for n in sess.get_partition_report().nodes}


def assert_on_opencl(sess, names=None):
    rep = sess.get_partition_report()
    for n in rep.nodes:
        if names is None or n.name in names:
            assert n.provider == OCL, f"{n.name} ({n.op_type}) ran on {n.provider}: {n.declined}"


def check_model(model, feeds, rtol=RTOL, atol=ATOL, names=None):
    """Run on OpenCL, assert the nodes (all, or ``names``) ran there, compare with the oracle."""
    sess = session(model)
    assert_on_opencl(sess, names)
    ours = sess.run(None, feeds)
    assert all(isinstance(o, np.ndarray) for o in ours)
    assert_close(ours, run_oracle(model, feeds), rtol, atol)
    return ours, sess


def check_node(op_type, inputs: dict, *, initializers=None, node_inputs=None, outputs=("y",),
               opset=17, rtol=RTOL, atol=ATOL, **attrs):
    """One node on OpenCL vs onnxruntime; ``node_inputs`` overrides the input list ('' omits one)."""
    ins = node_inputs if node_inputs is not None else list(inputs) + list(initializers or {})
    node = helper.make_node(op_type, ins, list(outputs), name="n", **attrs)
    model = make_model([node], inputs, [o for o in outputs if o], opset=opset, initializers=initializers)
    return check_model(model, dict(inputs), rtol, atol)


def vi(name, shape, dtype=np.float32, const=None):
    """A ValueInfo (dtype None for unknown)."""
    from runtime_core.plugin import ValueInfo

    return ValueInfo(name, None if dtype is None else np.dtype(dtype), shape, "tensor", const)


def node_view(op_type, inputs, outputs, *, since=13, attrs=None, domain="", name=None):
    """A NodeView built from the public contract: ``inputs``/``outputs`` are ValueInfos (or None)."""
    from runtime_core.plugin import NodeView

    return NodeView(name=name or op_type.lower(), op_type=op_type, domain=domain, since_version=since,
                    opset=since, attrs=dict(attrs or {}),
                    inputs=tuple("" if v is None else v.name for v in inputs),
                    outputs=tuple("" if v is None else v.name for v in outputs),
                    input_info=tuple(inputs), output_info=tuple(outputs))


def graph_view(*nodes):
    from runtime_core.plugin import GraphView

    values = {}
    for n in nodes:
        for v in n.input_info + n.output_info:
            if v is not None:
                values[v.name] = v
    return GraphView(nodes, values, {"": 17})


def relu_model_bytes() -> bytes:
    """A one-Relu model (2 x 3 float32)."""
    x = np.ones((2, 3), np.float32)
    return make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], {"x": x}, ["y"]).SerializeToString()
