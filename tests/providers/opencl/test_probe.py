"""probe(), provider options, unavailability reasons, packaging and plugin discovery."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import runtime_core as rt
from oracle import make_model
from runtime_core.errors import FallbackRefusedError, ProviderOptionsError

from opencl_helpers import OCL, OPTIONS, POCL_PLATFORM, requires_package, requires_pocl

X = np.ones((2, 3), np.float32)


def relu_model():
    return make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], {"x": X}, ["y"])


# -- packaging ------------------------------------------------------------------------

@requires_package
def test_distribution_metadata_and_single_version_source():
    import runtime_provider_opencl
    from runtime_provider_opencl.plugin import OpenCLExecutionProvider

    dist = metadata.distribution("runtime-provider-opencl")
    assert dist.version == runtime_provider_opencl.__version__ == OpenCLExecutionProvider.version
    reqs = " ".join(dist.requires or [])
    assert "runtime-core<0.2,>=0.1" in reqs.replace(" ", "") or "runtime-core>=0.1,<0.2" in reqs
    assert "pyopencl" in reqs and "pocl-binary-distribution" in reqs and 'extra == "pocl"' in reqs
    eps = [ep for ep in dist.entry_points if ep.group == "runtime_core.providers"]
    assert [(ep.name, ep.value) for ep in eps] == [("opencl", "runtime_provider_opencl.plugin")]


@requires_package
def test_identity_attributes():
    from runtime_core.plugin import ExecutionProvider
    from runtime_provider_opencl.plugin import OpenCLExecutionProvider as P

    assert issubclass(P, ExecutionProvider)
    assert (P.name, P.alias, P.device_type, P.plugin_api, P.distribution) == (
        "OpenCLExecutionProvider", "opencl", "opencl", ">=1.0,<2", "runtime-provider-opencl")


@requires_package
def test_import_and_registration_do_not_import_pyopencl():
    code = ("import sys, runtime_provider_opencl.plugin as p\n"
            "class R:\n    def __init__(s): s.c = []\n    def register(s, c): s.c.append(c)\n"
            "r = R(); p.runtime_core_register_providers(r)\n"
            "assert r.c == [p.OpenCLExecutionProvider]\n"
            "assert 'pyopencl' not in sys.modules, 'pyopencl imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


@requires_package
@pytest.mark.skipif(os.environ.get("RUNTIME_CORE_EXPECT_INSTALLED") != "1",
                    reason="only meaningful in the nox session that installs wheels")
def test_running_against_the_installed_wheel():
    import runtime_provider_opencl

    path = Path(runtime_provider_opencl.__file__).resolve()
    root = Path(__file__).resolve().parents[3]
    assert "site-packages" in path.parts, path
    assert path.parent != root / "providers" / "opencl" / "runtime_provider_opencl", path
    # every kernel source of the checkout (.cl and the shared .h) ships in the wheel
    src = root / "providers" / "opencl" / "runtime_provider_opencl" / "kernels"
    for pattern in ("*.cl", "*.h"):
        shipped = sorted(p.name for p in (path.parent / "kernels").glob(pattern))
        assert shipped and shipped == sorted(p.name for p in src.glob(pattern)), (pattern, shipped)


@requires_package
def test_kernel_sources_ship_as_package_data():
    from runtime_provider_opencl.device import KERNEL_FILES, kernel_source

    for f in KERNEL_FILES:
        assert "__kernel" in kernel_source(f)


# -- probe ----------------------------------------------------------------------------

@requires_pocl
def test_probe_lists_devices():
    from runtime_provider_opencl.plugin import OpenCLExecutionProvider

    res = OpenCLExecutionProvider.probe()
    # available: the reason says which device a session without options takes
    assert res.available and res.reason.startswith("uses ") and "by default" in res.reason
    assert any(POCL_PLATFORM in d for d in res.devices)
    assert sum(d.endswith(" [default]") for d in res.devices) == 1
    info = {p["alias"]: p for p in rt.get_provider_info()}["opencl"]
    assert info["available"] and info["status"] == "loaded" and info["devices"]
    assert OCL in rt.get_available_providers()


@requires_package
def test_unavailable_when_pyopencl_is_missing(monkeypatch, fresh_registry):
    from runtime_provider_opencl.plugin import OpenCLExecutionProvider

    monkeypatch.setitem(sys.modules, "pyopencl", None)  # "import pyopencl" raises ImportError
    res = OpenCLExecutionProvider.probe()
    assert not res.available and res.devices == []
    assert "pyopencl is not installed" in res.reason and "runtime-provider-opencl[pocl]" in res.reason
    fresh_registry()
    rec = rt.get_provider_info()
    assert any(r["alias"] == "opencl" and not r["available"] and "pyopencl" in r["reason"] for r in rec)
    assert OCL not in rt.get_available_providers()
    with pytest.warns(rt.ProviderFallbackWarning, match="pyopencl is not installed"):
        sess = rt.InferenceSession(relu_model().SerializeToString(), providers=["opencl", "cpu"])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert "pyopencl" in sess.get_partition_report().unavailable["opencl"]
    so = rt.SessionOptions()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(FallbackRefusedError, match="pyopencl is not installed"):
            rt.InferenceSession(relu_model().SerializeToString(), so, providers=["opencl", "cpu"])


class _FakePlatform:
    def __init__(self, name, devices=()):
        self.name = name
        self.vendor = "fake"
        self._devices = list(devices)

    def get_devices(self):
        if not self._devices:
            raise RuntimeError("clGetDeviceIDs failed: DEVICE_NOT_FOUND")
        return self._devices


@requires_pocl
@pytest.mark.parametrize("platforms,expect", [
    ("raise", "no OpenCL platform found"),
    ([], "no OpenCL platform found"),
    ([_FakePlatform("Empty Platform")], "'Empty Platform' found, but no available device"),
])
def test_unavailable_without_platform_or_device(monkeypatch, platforms, expect):
    import pyopencl as cl

    from runtime_provider_opencl.plugin import OpenCLExecutionProvider

    def fake():
        if platforms == "raise":
            raise RuntimeError("clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR")
        return platforms

    monkeypatch.setattr(cl, "get_platforms", fake)
    res = OpenCLExecutionProvider.probe()
    assert not res.available and expect in res.reason


@requires_package
def test_probe_never_raises(monkeypatch):
    from runtime_provider_opencl import device
    from runtime_provider_opencl.plugin import OpenCLExecutionProvider

    def boom():
        raise MemoryError("driver exploded")

    monkeypatch.setattr(device, "list_devices", boom)
    res = OpenCLExecutionProvider.probe()
    assert not res.available and "driver exploded" in res.reason


# -- options --------------------------------------------------------------------------

@requires_pocl
@pytest.mark.parametrize("opts", [{}, {"platform": "0"}, {"platform": "portable"}, {"device": "0"},
                                  {"platform": POCL_PLATFORM, "device": "pthread"}, {"device": "pthread"}])
def test_good_options_select_a_device(opts):
    sess = rt.InferenceSession(relu_model().SerializeToString(), providers=[("opencl", opts), "cpu"])
    got = sess.get_provider_options()[OCL]
    assert set(got) == {"platform", "device"} and got["platform"].isdigit() and got["device"].isdigit()
    # the effective options select the same device again
    again = rt.InferenceSession(relu_model().SerializeToString(), providers=[("opencl", got), "cpu"])
    assert again.get_provider_options()[OCL] == got


@requires_pocl
@pytest.mark.parametrize("opts,match", [
    ({"platform": "99"}, "platform index 99 is out of range"),
    ({"platform": "no-such-vendor"}, "no OpenCL platform matches 'no-such-vendor'"),
    ({"device": "7"}, r"device \(platform \d\) index 7 is out of range"),
    ({"device": "no-such-gpu"}, "no OpenCL device matches 'no-such-gpu'"),
    ({"devcie": "0"}, "unknown OpenCL provider option.*'devcie'.*known: platform, device"),
    ({"exclude_ops": "Frobnicate"}, "exclude_ops names op.*Frobnicate"),
])
def test_bad_options_list_the_choices(opts, match):
    from runtime_provider_opencl.plugin import OpenCLExecutionProvider

    with pytest.raises(ValueError, match=match) as info:
        OpenCLExecutionProvider(opts)
    if "devcie" not in opts and "exclude_ops" not in opts:
        assert POCL_PLATFORM in str(info.value)  # the available choices are listed
    with pytest.raises(ProviderOptionsError, match="OpenCLExecutionProvider rejected its options"):
        rt.InferenceSession(relu_model().SerializeToString(), providers=[("opencl", opts), "cpu"])


@requires_pocl
def test_exclude_ops_option_is_reported(provider):
    from runtime_provider_opencl.plugin import OpenCLExecutionProvider

    p = OpenCLExecutionProvider({**OPTIONS, "exclude_ops": "Relu, Softmax"})
    assert p.get_options()["exclude_ops"] == "Relu,Softmax"
    assert provider.get_options() == {"platform": p.get_options()["platform"],
                                      "device": p.get_options()["device"]}


class _FakeDevice:
    def __init__(self, name, kind):
        import pyopencl as cl

        self.name = name
        self.type = cl.device_type.GPU if kind == "gpu" else cl.device_type.CPU
        self.version = "OpenCL 3.0 fake"
        self.available = True


@requires_pocl
@pytest.mark.parametrize("opts,expect", [
    ({}, (1, 1)),                                     # the first GPU, on whichever platform
    ({"platform": "0"}, (0, 0)),                      # that platform's first device (no GPU there)
    ({"device": "0"}, (1, 0)),                        # an index is within the default platform
    ({"device": "cpu b"}, (1, 0)),                    # a name is searched on every platform
    ({"platform": "alpha", "device": "cpu a"}, (0, 0)),
])
def test_device_selection_rules(monkeypatch, opts, expect):
    from runtime_provider_opencl import device

    monkeypatch.delenv("RUNTIME_CORE_OPENCL_PLATFORM", raising=False)  # the rules without defaults
    monkeypatch.delenv("RUNTIME_CORE_OPENCL_DEVICE", raising=False)
    plats = [(_FakePlatform("Alpha CL"), [_FakeDevice("CPU A", "cpu")]),
             (_FakePlatform("Beta CL"), [_FakeDevice("CPU B", "cpu"), _FakeDevice("Fake GPU", "gpu")])]
    monkeypatch.setattr(device, "enumerate_devices", lambda: plats)
    info = device.select_device(opts.get("platform"), opts.get("device"))
    assert (info.platform, info.device) == expect
    assert info.device_type == ("GPU" if expect == (1, 1) else "CPU")


class _FakeCL:
    """pyopencl as far as device enumeration and the build check go: one platform whose
    devices build (or fail to build, as PoCL's LLVM does on a CPU it does not know)."""

    class Error(Exception):
        pass

    def __init__(self, fails):
        self.fails = fails
        cl = self

        class Dev:
            available = True
            name = "pthread-Future CPU"
            driver_version = "3.0"
            version = "OpenCL 3.0 Fake"
            type = 2  # CL_DEVICE_TYPE_CPU

            class platform:  # noqa: N801 - mirrors pyopencl's attribute
                name = "Fake PoCL"

        class Prog:
            def __init__(self, ctx, src):
                pass

            def build(self, options=None):
                if cl.fails:
                    raise RuntimeError("clBuildProgram failed: BUILD_PROGRAM_FAILURE\n\n"
                                       "error: unknown target CPU 'generic'\nDevice failed")
                return self

        self.Program = Prog
        self.Context = lambda devs: object()
        self.device_type = type("device_type", (), {"GPU": 4, "ACCELERATOR": 8, "CPU": 2})
        self.dev = Dev()

    def get_platforms(self):
        return [_FakePlatform("Fake PoCL", [self.dev])]


@requires_package
@pytest.mark.parametrize("fails", [True, False])
def test_a_device_whose_compiler_cannot_build_is_unusable_with_the_reason(monkeypatch, fails):
    # the driver lists the device, but every build on it fails: the probe says so (and why)
    # instead of every session failing later in compile
    from runtime_provider_opencl import device
    from runtime_provider_opencl.plugin import OpenCLExecutionProvider

    fake = _FakeCL(fails)
    monkeypatch.setattr(device, "import_pyopencl", lambda: fake)
    monkeypatch.setattr(device, "_BUILD_PROBLEMS", {})
    res = OpenCLExecutionProvider.probe()
    if fails:
        assert not res.available and res.devices == []
        assert "no usable device" in res.reason and "unknown target CPU 'generic'" in res.reason, res.reason
        assert "pthread-Future CPU" in res.reason
    else:
        assert res.available and len(res.devices) == 1 and "pthread-Future CPU" in res.devices[0]
    # checked once per device and process
    fake.fails = not fails
    assert OpenCLExecutionProvider.probe().available == (not fails)
