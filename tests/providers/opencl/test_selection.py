"""Which device the provider takes among several platforms (two PoCLs, one of which cannot
build a kernel on this CPU), how it says so, and that CI fails instead of skipping when no
device works."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from opencl_helpers import HAVE_POCL, POCL_PLATFORM, TEST_PLATFORM, requires_package, requires_pocl

HERE = Path(__file__).resolve().parent


class _Platform:
    def __init__(self, name, version, devices):
        self.name = name
        self.vendor = "The pocl project"
        self.version = version
        self._devices = devices

    def get_devices(self):
        return self._devices


class _CL:
    """pyopencl as far as enumeration and the build check go: PyPI's PoCL 3.0 (LLVM 14), whose
    compiler fails on this CPU, listed before Debian's PoCL 3.1 (LLVM 15), which builds."""

    class Error(Exception):
        pass

    device_type = type("device_type", (), {"GPU": 4, "ACCELERATOR": 8, "CPU": 2})

    def __init__(self, order=("pypi", "debian")):
        cl = self
        versions = {"pypi": "OpenCL 3.0 PoCL 3.0-rc2  Linux, Release, RELOC, LLVM 14.0.6, SLEEF, DISTRO",
                    "debian": "OpenCL 3.0 PoCL 3.1+debian  Linux, None+Asserts, RELOC, SPIR, LLVM 15.0.6, SLEEF"}
        self.platforms = []
        for which in order:
            plat = _Platform("Portable Computing Language", versions[which], [])

            class Dev:
                available = True
                name = f"pthread-{which}"
                driver_version = which
                version = "OpenCL 3.0 PoCL"
                type = 2
                platform = plat

            plat._devices = [Dev()]
            self.platforms.append(plat)

        class Prog:
            def __init__(self, ctx, src):
                self.dev = ctx

            def build(self, options=None):
                if "pypi" in self.dev:
                    raise RuntimeError("clBuildProgram failed: BUILD_PROGRAM_FAILURE\n\n"
                                       "error: unknown target CPU 'generic'")
                return self

        cl.Program = Prog
        cl.Context = lambda devs: devs[0].name

    def get_platforms(self):
        return self.platforms


@pytest.fixture
def two_pocls(monkeypatch):
    from runtime_provider_opencl import device

    monkeypatch.delenv("RUNTIME_CORE_OPENCL_PLATFORM", raising=False)
    monkeypatch.delenv("RUNTIME_CORE_OPENCL_DEVICE", raising=False)
    monkeypatch.setattr(device, "_BUILD_PROBLEMS", {})

    def use(order=("pypi", "debian")):
        fake = _CL(order)
        monkeypatch.setattr(device, "import_pyopencl", lambda: fake)
        return fake

    return use


@requires_package
@pytest.mark.parametrize("order", [("pypi", "debian"), ("debian", "pypi")])
def test_the_first_device_that_builds_a_kernel_is_taken_and_named(two_pocls, order):
    from runtime_provider_opencl import device
    from runtime_provider_opencl.plugin import OpenCLExecutionProvider

    two_pocls(order)
    info = device.select_device()
    assert info.device_name == "pthread-debian" and info.platform == order.index("debian")
    assert info.platform_version == "PoCL 3.1+debian, LLVM 15.0.6"
    res = OpenCLExecutionProvider.probe()
    assert res.available
    # which platform, device and PoCL version a session takes, and why the other is skipped
    assert res.reason.startswith(f"uses {info.platform}:0 pthread-debian (CPU, Portable Computing Language, "
                                 "PoCL 3.1+debian, LLVM 15.0.6"), res.reason
    assert "skipped: 'pthread-pypi' (Portable Computing Language, PoCL 3.0-rc2, LLVM 14.0.6)" in res.reason
    assert "unknown target CPU 'generic'" in res.reason
    assert res.devices == [str(info) + " [default]"]
    # a platform name shared by both PoCLs selects the one that works
    assert device.select_device(POCL_PLATFORM).device_name == "pthread-debian"


@requires_package
def test_the_version_selects_one_of_two_pocls(two_pocls):
    from runtime_provider_opencl import device

    two_pocls(("debian", "pypi"))
    assert device.select_device("debian").device_name == "pthread-debian"
    assert device.select_device("PoCL 3.1").device_name == "pthread-debian"
    with pytest.raises(ValueError, match=r"platform 1 \('Portable Computing Language'\) has no usable device"):
        device.select_device("3.0-rc2")  # matched, but its compiler fails here


@requires_package
def test_the_environment_sets_the_default_platform(two_pocls, monkeypatch):
    from runtime_provider_opencl import device
    from runtime_provider_opencl.plugin import OpenCLExecutionProvider

    two_pocls(("debian", "pypi"))
    monkeypatch.setenv("RUNTIME_CORE_OPENCL_PLATFORM", "debian")
    assert device.select_device().device_name == "pthread-debian"
    monkeypatch.setenv("RUNTIME_CORE_OPENCL_PLATFORM", "no-such-platform")
    with pytest.raises(ValueError, match="no OpenCL platform matches 'no-such-platform'"):
        device.select_device()
    assert device.select_device("0").device_name == "pthread-debian"  # an option wins over it
    res = OpenCLExecutionProvider.probe()
    assert res.available and "default device is invalid" in res.reason


@requires_package
def test_no_device_that_builds_gives_every_reason(two_pocls):
    from runtime_provider_opencl import device
    from runtime_provider_opencl.plugin import OpenCLExecutionProvider

    fake = two_pocls(("pypi",))
    res = OpenCLExecutionProvider.probe()
    assert not res.available and res.devices == []
    assert "no usable device" in res.reason and "PoCL 3.0-rc2, LLVM 14.0.6" in res.reason
    assert "unknown target CPU 'generic'" in res.reason
    assert fake.platforms and device.survey()[1]


@requires_package
@pytest.mark.parametrize("env", [{"CI": "true"}, {"RUNTIME_CORE_OPENCL_REQUIRED": "1"}, {}])
def test_ci_fails_instead_of_skipping_when_no_device_works(env, tmp_path):
    # a platform that matches nothing stands for a machine where no PoCL builds a kernel
    test = tmp_path / "test_one.py"
    test.write_text("from opencl_helpers import requires_pocl\n\n"
                    "@requires_pocl\ndef test_device():\n    pass\n")
    (tmp_path / "conftest.py").write_text((HERE / "conftest.py").read_text())
    clean = {k: v for k, v in os.environ.items()
             if k not in ("CI", "RUNTIME_CORE_OPENCL_REQUIRED", "RUNTIME_CORE_OPENCL_PLATFORM")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(test)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**clean, **env, "RUNTIME_CORE_OPENCL_PLATFORM": "no-such-platform",
                               "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parents[1])])})
    out = proc.stdout + proc.stderr
    if env:
        assert proc.returncode != 0 and "an OpenCL device is required here" in out, out[-2000:]
        assert "no OpenCL platform matches 'no-such-platform'" in out
    else:
        assert proc.returncode == 0 and "1 skipped" in out, out[-2000:]


@requires_pocl
def test_the_test_platform_is_the_one_sessions_use():
    import runtime_core as rt

    from opencl_helpers import ocl, relu_model_bytes

    from runtime_provider_opencl.device import select_device

    chosen = select_device(TEST_PLATFORM)
    sess = rt.InferenceSession(relu_model_bytes(), providers=[ocl(), "cpu"])
    opts = sess.get_provider_options()["OpenCLExecutionProvider"]
    assert (int(opts["platform"]), int(opts["device"])) == (chosen.platform, chosen.device)
    assert HAVE_POCL
