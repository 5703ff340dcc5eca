"""The console script, run as a new user would (subprocesses)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from oracle import make_model

SITE = Path(__file__).resolve().parents[1] / "plugins" / "fixtures" / "site"


def cli(*args, env_extra=None, check=True):
    env = dict(os.environ)
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, "-m", "runtime_core", *args], capture_output=True, text=True,
                          env=env, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_console_script_is_installed():
    import shutil

    exe = shutil.which("runtime-core") or str(Path(sys.executable).parent / "runtime-core")
    proc = subprocess.run([exe, "providers"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "CPUExecutionProvider" in proc.stdout


def test_providers_table_lists_cpu():
    out = cli("providers").stdout
    header, row = out.splitlines()[:2]
    for col in ("name", "alias", "distribution", "version", "plugin API", "available", "reason"):
        assert col in header
    assert "CPUExecutionProvider" in row and "cpu" in row and "yes" in row


def test_providers_lists_broken_plugins_and_still_works():
    out = cli("providers", env_extra={"PYTHONPATH": str(SITE)}).stdout
    assert "FakeGpuExecutionProvider" in out
    assert "brokenimport" in out and "missing native library" in out
    assert "api-mismatch" in out
    info = json.loads(cli("providers", "--json", env_extra={"PYTHONPATH": str(SITE)}).stdout)
    assert {i["alias"]: i["status"] for i in info}["brokenimport"] == "import-error"


def test_run_sample():
    out = cli("run", "--sample", "--repeat", "3").stdout
    assert "probabilities" in out and "latency: median" in out
    assert "CPUExecutionProvider: 10 node(s)" in out


def test_run_with_inputs_and_save(tmp_path):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    m = make_model([helper.make_node("Identity", ["x"], ["y"])], {"x": x}, ["y"])
    onnx.save(m, tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", x)
    cli("run", str(tmp_path / "m.onnx"), "--input", f"x={tmp_path / 'x.npy'}", "--save", str(tmp_path))
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), x)


def test_partition_table_and_json():
    out = cli("partition", "sample").stdout
    assert "conv1" in out and "CPUExecutionProvider" in out
    d = json.loads(cli("partition", "--sample", "--json").stdout)
    assert len(d["nodes"]) == 10 and d["copies"] == []


def test_partition_with_fixture_device_shows_declines():
    out = cli("partition", "--sample", "--providers", "fakegpu,cpu", env_extra={"PYTHONPATH": str(SITE)}).stdout
    assert "FakeGpuExecutionProvider" in out and "not supported by the fake device" in out
    assert "copies:" in out


def test_errors_are_reported_not_tracebacks(tmp_path):
    proc = cli("run", str(tmp_path / "missing.onnx"), check=False)
    assert proc.returncode == 2
    assert "ModelLoadError" in proc.stderr and "Traceback" not in proc.stderr
    proc = cli("run", "--sample", "--strict", "--providers", "nosuch,cpu", check=False)
    assert proc.returncode == 2 and "FallbackRefusedError" in proc.stderr
