"""The seam between runtime-core and the CPU provider: the core and the other providers use
the CPU provider's plugin contract or its documented API (``runtime_provider_cpu.api``),
never its internal modules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import runtime_provider_cpu.api as api
from oracle import make_model
from runtime_core.graph import Graph

ROOT = Path(__file__).resolve().parents[2]
DEPENDENTS = [ROOT / "runtime_core", ROOT / "providers" / "cuda", ROOT / "providers" / "opencl"]


def _cpu_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "runtime_provider_cpu":
            out.append(node.module)
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.split(".")[0] == "runtime_provider_cpu"]
    return out


def test_core_cuda_and_opencl_import_only_the_cpu_providers_api():
    bad = {}
    for folder in DEPENDENTS:
        for path in folder.rglob("*.py"):
            if "build" in path.parts:
                continue
            wrong = [m for m in _cpu_imports(path) if m != "runtime_provider_cpu.api"]
            if wrong:
                bad[str(path.relative_to(ROOT))] = wrong
    assert not bad, bad


@pytest.mark.parametrize("folder", ["cuda", "opencl"])
def test_providers_that_use_the_api_declare_the_cpu_distribution(folder):
    text = (ROOT / "providers" / folder / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'"runtime-provider-cpu>=[0-9.]+,<[0-9.]+"', text)


def test_api_names_are_documented_and_versioned():
    major, minor = (int(p) for p in api.API_VERSION.split("."))
    assert major >= 1 and minor >= 0
    for name in api.__all__:
        obj = getattr(api, name)
        assert name == "API_VERSION" or (obj.__doc__ or "").strip(), name


def test_api_answers_as_the_registered_provider_does():
    m = make_model([helper.make_node("Relu", ["x"], ["y"], name="r"),
                    helper.make_node("Gelu", ["y"], ["z"], name="g", approximate="bogus")],
                   {"x": np.zeros(3, np.float32)}, ["z"], opset=20)
    g = Graph(m)
    relu, gelu = (g.node_view(n) for n in g.nodes)
    assert api.decline_reason(relu) is None
    assert api.decline_reason(gelu)  # the attribute is refused, with a reason
    k = api.kernel_for("", "Relu", relu.since_version)
    assert k is not None and not k.control and api.kernel_for("", "NoSuchOp", 1) is None
    ctx = api.KernelContext(node=relu, n_outputs=1, input_dtypes=(np.dtype(np.float32),),
                            output_dtypes=(np.dtype(np.float32),))
    x = np.array([-1.0, 0.0, 2.0], np.float32)
    np.testing.assert_array_equal(k.fn(ctx, x, **dict(relu.attrs)), np.maximum(x, 0))
    ops = {(d, o) for d, o, _, _ in api.supported_ops()}
    assert ("", "Relu") in ops and ("com.microsoft", "FusedConv") in ops
