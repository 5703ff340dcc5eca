"""Packaging, probe reasons, selection, fallback with a warning and strict refusal."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from importlib import metadata

import numpy as np
import pytest
from onnx import helper

import runtime_core as rt
from conftest import CUDA_REASON
from runtime_core.errors import FallbackRefusedError, ProviderOptionsError, ProviderUnavailableError

CUDA = "CUDAExecutionProvider"
no_gpu = pytest.mark.skipif(CUDA_REASON is None, reason="a CUDA device is available here")


def relu_model() -> bytes:
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                          [helper.make_tensor_value_info("x", 1, [2, 3])],
                          [helper.make_tensor_value_info("y", 1, [2, 3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_distribution_metadata_and_single_version_source():
    import runtime_provider_cuda
    from runtime_provider_cuda.plugin import CUDAExecutionProvider

    dist = metadata.distribution("runtime-provider-cuda")
    assert dist.version == runtime_provider_cuda.__version__ == CUDAExecutionProvider.version
    reqs = [r.replace(" ", "") for r in dist.requires or []]
    assert any(r.startswith("runtime-core") and ">=0.1" in r and "<0.2" in r for r in reqs), reqs
    assert any(r.startswith("cupy-cuda12x") and 'extra=="cuda12"' in r for r in reqs), reqs
    assert any(r.startswith("cupy-cuda13x") and 'extra=="cuda13"' in r for r in reqs), reqs
    eps = [ep for ep in dist.entry_points if ep.group == "runtime_core.providers"]
    assert [(ep.name, ep.value) for ep in eps] == [("cuda", "runtime_provider_cuda.plugin")]


def test_identity():
    from runtime_core.plugin import ExecutionProvider
    from runtime_provider_cuda.plugin import CUDAExecutionProvider as P

    assert issubclass(P, ExecutionProvider)
    assert (P.name, P.alias, P.device_type, P.dlpack_device_type, P.distribution) == (
        CUDA, "cuda", "cuda", 2, "runtime-provider-cuda")


def test_import_and_registration_do_not_import_cupy():
    code = ("import sys, runtime_provider_cuda.plugin as p\n"
            "class R:\n    def __init__(s): s.c = []\n    def register(s, c): s.c.append(c)\n"
            "r = R(); p.runtime_core_register_providers(r)\n"
            "assert r.c == [p.CUDAExecutionProvider]\n"
            "assert 'cupy' not in sys.modules, 'cupy imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


# -- probe reasons ---------------------------------------------------------------------

BLOCK_CUPY = textwrap.dedent("""
    import sys
    class _Block:
        def find_spec(self, name, path=None, target=None):
            if name == "cupy" or name.startswith(("cupy.", "cupyx", "cupy_backends")):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None
    sys.meta_path.insert(0, _Block())
""")


def test_unavailable_when_cupy_is_missing_subprocess(tmp_path):
    """A real 'cupy not installed' process: a meta-path blocker in sitecustomize."""
    (tmp_path / "sitecustomize.py").write_text(BLOCK_CUPY)
    code = textwrap.dedent("""
        import json, runtime_core as rt
        info = {p["alias"]: p for p in rt.get_provider_info()}["cuda"]
        print(json.dumps([info["available"], info["reason"], rt.get_available_providers(),
                          rt.get_all_providers()]))
    """)
    import json
    import os

    env = dict(os.environ, PYTHONPATH=str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env)
    available, reason, avail, all_ = json.loads(out.stdout.strip().splitlines()[-1])
    assert available is False
    assert reason.startswith("cupy is not installed") and "runtime-provider-cuda[cuda12]" in reason
    assert CUDA in all_ and CUDA not in avail


def test_unavailable_when_cupy_is_missing_in_process(monkeypatch):
    from runtime_provider_cuda import probe
    from runtime_provider_cuda.plugin import CUDAExecutionProvider

    monkeypatch.setattr(probe, "_STATUS", None)
    for m in [m for m in sys.modules if m == "cupy" or m.startswith("cupy.")]:
        monkeypatch.delitem(sys.modules, m)
    monkeypatch.setitem(sys.modules, "cupy", None)  # "import cupy" raises ImportError
    res = CUDAExecutionProvider.probe()
    assert not res.available and res.devices == []
    assert "cupy is not installed" in res.reason


class _FakeRuntime:
    def __init__(self, driver=12080, runtime=12090, count=None, error=None):
        self.d, self.r, self.count, self.error = driver, runtime, count, error

    def runtimeGetVersion(self):
        return self.r

    def driverGetVersion(self):
        return self.d

    def getDeviceCount(self):
        if self.error:
            raise RuntimeError(self.error)
        return self.count


@pytest.mark.parametrize("fake,expect", [
    (_FakeRuntime(driver=0), "no CUDA driver found (cudaDriverGetVersion reports 0"),
    (_FakeRuntime(driver=11040, error="cudaErrorInsufficientDriver: CUDA driver version is insufficient"),
     "the CUDA driver is too old (cudaErrorInsufficientDriver): the driver supports CUDA 11.4"),
    (_FakeRuntime(error="cudaErrorNoDevice: no CUDA-capable device is detected"),
     "no CUDA device found (cudaErrorNoDevice)"),
    (_FakeRuntime(count=0), "no CUDA device found (cudaGetDeviceCount reports 0)"),
])
def test_driver_and_device_reasons(monkeypatch, fake, expect):
    pytest.importorskip("cupy")
    import cupy.cuda

    from runtime_provider_cuda import probe
    from runtime_provider_cuda.plugin import CUDAExecutionProvider

    monkeypatch.setattr(probe, "_STATUS", None)
    monkeypatch.setattr(cupy.cuda, "runtime", fake)
    res = CUDAExecutionProvider.probe()
    assert not res.available and expect in res.reason, res.reason
    if "too old" in expect:
        assert "needs CUDA 12.9" in res.reason


@no_gpu
def test_real_probe_reports_the_precise_reason():
    """On this machine (no GPU): the reason names what is missing, never 'available'."""
    from runtime_provider_cuda.plugin import CUDAExecutionProvider

    res = CUDAExecutionProvider.probe()
    assert not res.available
    try:
        import cupy  # noqa: F401
    except ImportError:
        assert res.reason.startswith("cupy is not installed")
    else:
        assert any(k in res.reason for k in ("no CUDA driver found", "the CUDA driver is too old",
                                              "no CUDA device found")), res.reason


def test_probe_never_raises(monkeypatch):
    from runtime_provider_cuda import probe
    from runtime_provider_cuda.plugin import CUDAExecutionProvider

    def boom():
        raise MemoryError("driver exploded")

    monkeypatch.setattr(probe, "cuda_status", boom)
    res = CUDAExecutionProvider.probe()
    assert not res.available and "driver exploded" in res.reason


# -- selection, fallback, strict refusal ------------------------------------------------

@no_gpu
def test_listed_but_not_available_with_reason():
    assert CUDA in rt.get_all_providers()
    assert CUDA not in rt.get_available_providers()
    info = {p["alias"]: p for p in rt.get_provider_info()}["cuda"]
    assert info["name"] == CUDA and info["status"] == "loaded" and not info["available"]
    assert info["reason"] == CUDA_REASON and info["distribution"] == "runtime-provider-cuda"


@no_gpu
@pytest.mark.parametrize("entry", ["cuda", CUDA, ("cuda", {"device_id": "0"})])
def test_session_warns_and_runs_on_cpu(entry):
    with pytest.warns(rt.ProviderFallbackWarning, match="(?i)cuda.*unavailable"):
        sess = rt.InferenceSession(relu_model(), providers=[entry, "cpu"])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert CUDA_REASON in str(sess.get_partition_report().unavailable)
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0))


@no_gpu
def test_strict_refuses_with_a_typed_error_naming_cuda():
    so = rt.SessionOptions()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(FallbackRefusedError, match="cuda") as info:
            rt.InferenceSession(relu_model(), so, providers=["cuda", "cpu"])
    assert CUDA_REASON in str(info.value)


@no_gpu
def test_device_values_on_unavailable_cuda_are_refused():
    with pytest.raises(ProviderUnavailableError, match="cuda"):
        rt.OrtValue.ortvalue_from_numpy(np.zeros(3, np.float32), "cuda", 0)


# -- options (on the stand-in, which shares the option handling) ------------------------------

@pytest.mark.parametrize("opts,match", [
    ({"devcie_id": "0"}, "unknown CUDA provider option.*'devcie_id'.*known: device_id, gpu_mem_limit"),
    ({"device_id": "x"}, "device_id='x' is not an integer"),
    ({"gpu_mem_limit": "0"}, "gpu_mem_limit=0 must be >= 1"),
    ({"exclude_ops": "Frobnicate"}, "exclude_ops names op.*Frobnicate"),
])
def test_bad_options(standin, opts, match):
    from standin_provider import StandInCUDAProvider

    with pytest.raises(ValueError, match=match):
        StandInCUDAProvider(opts)
    with pytest.raises(ProviderOptionsError):
        rt.InferenceSession(relu_model(), providers=[("cudastandin", opts), "cpu"])


def test_good_options_and_ort_options_accepted(standin):
    sess = rt.InferenceSession(relu_model(), providers=[
        ("cudastandin", {"device_id": "0", "gpu_mem_limit": str(2 ** 30), "arena_extend_strategy": "kSameAsRequested",
                         "exclude_ops": "Relu"}), "cpu"])
    assert sess.get_provider_options()["CUDAStandInExecutionProvider"] == {
        "device_id": "0", "gpu_mem_limit": str(2 ** 30), "exclude_ops": "Relu"}
    assert {n.provider for n in sess.get_partition_report().nodes} == {"CPUExecutionProvider"}
