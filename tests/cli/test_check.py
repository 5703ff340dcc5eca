"""``runtime-core check`` and ``runtime-core ops``, run as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
from onnx import TensorProto as TP
from onnx import helper

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(__file__).resolve().parents[1] / "plugins" / "fixtures" / "site"


def cli(*args, env_extra=None):
    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "runtime_core", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def _model(tmp_path, nodes, opsets):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    return str(path)


def test_check_names_the_unsupported_op_and_every_providers_reason(tmp_path):
    path = _model(tmp_path, [helper.make_node("Relu", ["x"], ["r"]),
                             helper.make_node("Frobnicate", ["r"], ["y"], domain="acme.ops")],
                  {"": 17, "acme.ops": 3})
    proc = cli("check", path, env_extra={"PYTHONPATH": str(SITE)})
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    assert "acme.ops::Frobnicate" in out and "NO PROVIDER CAN RUN IT" in out
    assert "op acme.ops::Frobnicate is not implemented by the CPU provider" in out
    info = json.loads(cli("providers", "--json", env_extra={"PYTHONPATH": str(SITE)}).stdout)
    for p in info:
        if p.get("status") == "loaded":  # every installed provider gives its answer or why it is unavailable
            assert p["name"] in out, p["name"]
    assert "ai.onnx::Relu-14 (1 node): runs on" in out


def test_check_a_runnable_model_exits_0_and_json_lists_the_ops(tmp_path):
    path = _model(tmp_path, [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Tanh", ["r"], ["y"])],
                  {"": 13})
    proc = cli("check", path, "--providers", "cpu", "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["runnable"] and {o["op_type"]: o["runs_on"] for o in d["ops"]} == {
        "Relu": "CPUExecutionProvider", "Tanh": "CPUExecutionProvider"}


def test_check_says_why_a_version_is_declined(tmp_path):
    # Hardmax-1 (coerced 2-D semantics) next to a newer opset: check names the version
    path = _model(tmp_path, [helper.make_node("Hardmax", ["x"], ["y"])], {"": 9})
    out = cli("check", path, "--providers", "cpu").stdout
    assert "ai.onnx::Hardmax-1" in out


def test_supported_ops_doc_is_generated_from_the_registry():
    doc = ROOT / "docs" / "supported-ops.md"
    proc = cli("ops")
    assert proc.returncode == 0, proc.stderr
    assert "| ai.onnx | Conv |" in proc.stdout and "| ai.onnx.ml | TreeEnsembleClassifier |" in proc.stdout
    if doc.exists() and (ROOT / "runtime_core").is_dir():
        body = lambda s: s.split("\n| domain |", 1)[1]  # noqa: E731 - the header names the version
        assert body(doc.read_text()) == body(proc.stdout), \
            "docs/supported-ops.md is stale: regenerate it with `runtime-core ops > docs/supported-ops.md`"
