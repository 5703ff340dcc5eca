"""Plugin discovery through real entry points: good, broken and disabled plugins."""

import numpy as np
import pytest

import runtime_core as rt
from runtime_core.plugin import API_VERSION, reload_plugins


def _info(name):
    return {i["alias"]: i for i in rt.get_provider_info()}[name]


def test_cpu_is_always_available_and_last():
    assert rt.get_available_providers()[-1] == "CPUExecutionProvider"
    info = _info("cpu")
    assert info["available"] and info["status"] == "loaded"
    assert info["distribution"] == "runtime-provider-cpu"


def test_good_plugin_is_discovered(fixture_plugins):
    assert "FakeGpuExecutionProvider" in rt.get_available_providers()
    assert rt.get_available_providers()[-1] == "CPUExecutionProvider"
    info = _info("fakegpu")
    assert info["version"] == "1.0" and info["distribution"] == "rt-fixture-providers"
    assert info["plugin_api"] == ">=1.0,<2"


@pytest.mark.parametrize("alias,status,needle", [
    ("brokenimport", "import-error", "missing native library"),
    ("brokenprobe", "probe-error", "probe exploded"),
    ("oldapi", "api-mismatch", API_VERSION),
    ("badregister", "bad-registration", "lacks"),
    ("hookraises", "register-error", "registration exploded"),
])
def test_broken_plugins_are_reported_and_skipped(fixture_plugins, alias, status, needle):
    info = _info(alias)
    assert info["status"] == status
    assert needle in info["reason"]
    assert not info["available"]
    # the core still works
    assert "CPUExecutionProvider" in rt.get_available_providers()


def test_api_mismatch_names_both_versions(fixture_plugins):
    reason = _info("oldapi")["reason"]
    assert ">=0.1,<1" in reason and API_VERSION in reason


def test_unavailable_provider_is_listed_but_not_available(fixture_plugins):
    assert "NoDeviceExecutionProvider" in rt.get_all_providers()
    assert "NoDeviceExecutionProvider" not in rt.get_available_providers()
    assert "no fake accelerator" in _info("nodevice")["reason"]


def test_disable_all_plugins_keeps_cpu(fixture_plugins, monkeypatch):
    monkeypatch.setenv("RUNTIME_CORE_DISABLE_PLUGINS", "1")
    reload_plugins()
    assert rt.get_available_providers() == ["CPUExecutionProvider"]
    assert _info("fakegpu")["status"] == "disabled"


def test_disable_by_name(fixture_plugins, monkeypatch):
    monkeypatch.setenv("RUNTIME_CORE_DISABLE_PLUGINS", "fakegpu,nodevice")
    reload_plugins()
    assert "FakeGpuExecutionProvider" not in rt.get_all_providers()
    assert _info("nodevice")["status"] == "disabled"
    assert _info("brokenimport")["status"] == "import-error"


def test_allow_list(fixture_plugins, monkeypatch):
    monkeypatch.setenv("RUNTIME_CORE_PLUGINS", "fakegpu")
    reload_plugins()
    assert rt.get_available_providers() == ["FakeGpuExecutionProvider", "CPUExecutionProvider"]
    assert _info("brokenimport")["status"] == "disabled"


def test_session_works_with_broken_plugins_installed(fixture_plugins):
    from oracle import make_model
    from onnx import helper

    m = make_model([helper.make_node("Identity", ["x"], ["y"])], {"x": np.zeros((2,), np.float32)}, ["y"])
    sess = rt.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, {"x": np.arange(2, dtype=np.float32)})[0], [0, 1])


def test_allow_list_naming_nothing_installed_is_warned_about(fixture_plugins, monkeypatch, caplog):
    monkeypatch.setenv("RUNTIME_CORE_PLUGINS", "fakegpu,fakgpu")
    with caplog.at_level("WARNING", logger="runtime_core.plugin"):
        reg = reload_plugins()
    assert reg.unknown_allowed == ["fakgpu"]
    assert any("fakgpu" in r.getMessage() and "no installed plugin" in r.getMessage() for r in caplog.records)
    assert _info("nodevice")["reason"] == "disabled by not in RUNTIME_CORE_PLUGINS"


def test_installing_a_provider_does_not_change_default_sessions(fakegpu, monkeypatch):
    """A session that names no providers runs on the CPU only, whatever is installed."""
    from oracle import make_model
    from onnx import helper

    monkeypatch.delenv("RUNTIME_CORE_DEFAULT_PROVIDERS", raising=False)
    assert "FakeGpuExecutionProvider" in rt.get_available_providers()
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": np.zeros((2,), np.float32)}, ["y"])
    sess = rt.InferenceSession(m.SerializeToString())
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert {n.provider for n in sess.get_partition_report().nodes} == {"CPUExecutionProvider"}
    monkeypatch.setenv("RUNTIME_CORE_DEFAULT_PROVIDERS", "fakegpu,cpu")  # opting in
    sess = rt.InferenceSession(m.SerializeToString())
    assert sess.get_providers() == ["FakeGpuExecutionProvider", "CPUExecutionProvider"]


def test_a_probe_runs_only_when_its_provider_is_asked_about(fixture_plugins):
    reg = reload_plugins()
    rec = reg.lookup("brokenprobe")
    assert rec.pending is not None  # discovered and registered, not probed yet
    other = reg.lookup("fakegpu")
    assert other.available and rec.pending is not None  # asking about one probes only that one
    assert rec.status == "probe-error" and rec.pending is None and "probe exploded" in rec.reason


def test_a_cpu_only_session_does_not_probe_other_providers():
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from onnx import helper, TensorProto\n"
        "import runtime_core as rt\n"
        "g = helper.make_graph([helper.make_node('Relu', ['x'], ['y'])], 'g',\n"
        "    [helper.make_tensor_value_info('x', TensorProto.FLOAT, [2])],\n"
        "    [helper.make_tensor_value_info('y', TensorProto.FLOAT, [2])])\n"
        "m = helper.make_model(g, opset_imports=[helper.make_opsetid('', 17)])\n"
        "s = rt.InferenceSession(m.SerializeToString(), providers=['CPUExecutionProvider'])\n"
        "s.run(None, {'x': np.ones(2, np.float32)})\n"
        "reg = __import__('runtime_core.plugin', fromlist=['get_registry']).get_registry()\n"
        "print(sorted(r.alias for r in reg.records if r.pending is not None))\n"
        "print('pyopencl' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    unprobed, opencl_imported = out.strip().splitlines()
    installed = {i["alias"] for i in rt.get_provider_info() if i["status"] == "loaded"} - {"cpu"}
    assert sorted(installed) == eval(unprobed)  # noqa: S307 - our own repr of a list of names
    assert opencl_imported == "False"
