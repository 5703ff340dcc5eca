"""The distributions as installed: versions, entry points, no dependency cycle, docs."""

import inspect
import os
from importlib import metadata
from pathlib import Path

import pytest

import runtime_core as rt
import runtime_provider_cpu
from runtime_core import plugin
from runtime_core.plugin import hookspecs

ROOT = Path(__file__).resolve().parents[2]


def test_versions_are_single_sourced():
    assert rt.__version__ == metadata.version("runtime-core")
    assert runtime_provider_cpu.__version__ == metadata.version("runtime-provider-cpu")


def test_core_depends_on_a_cpu_range_and_cpu_not_on_core():
    core_reqs = metadata.requires("runtime-core") or []
    cpu_req = [r for r in core_reqs if r.startswith("runtime-provider-cpu")]
    assert cpu_req and ("<" in cpu_req[0] and ">=" in cpu_req[0])
    cpu_reqs = metadata.requires("runtime-provider-cpu") or []
    assert not any(r.startswith("runtime-core") for r in cpu_reqs)
    # no plugin machinery either; onnx itself is allowed (subgraph bodies are typed with onnx's inference)
    assert not any(r.split()[0].startswith(("pluggy", "runtime-core", "runtime_core")) for r in cpu_reqs)


def test_cpu_entry_point():
    eps = {e.name: e for e in metadata.entry_points(group="runtime_core.providers")}
    assert eps["cpu"].value == "runtime_provider_cpu.plugin"
    assert eps["cpu"].dist.metadata["Name"] == "runtime-provider-cpu"


@pytest.mark.skipif(os.environ.get("RUNTIME_CORE_EXPECT_INSTALLED") != "1",
                    reason="only meaningful in the nox session that installs wheels")
def test_running_against_installed_wheels_not_the_source_tree():
    sources = {ROOT / "runtime_core", ROOT / "providers" / "cpu" / "runtime_provider_cpu"}
    for mod in (rt, runtime_provider_cpu):
        path = Path(mod.__file__).resolve()
        assert "site-packages" in path.parts, path
        assert path.parent not in sources, path
    assert (Path(rt.__file__).parent / "samples" / "sample_cnn.onnx").is_file()


def test_every_hook_is_prefixed_typed_and_documented():
    hooks = [n for n, f in vars(hookspecs).items() if callable(f) and hasattr(f, "runtime_core_spec")]
    assert hooks, "no hook specs found"
    for name in hooks:
        fn = getattr(hookspecs, name)
        assert name.startswith("runtime_core_")
        assert fn.__doc__ and len(fn.__doc__.strip()) > 40, f"{name} is undocumented"
        sig = inspect.signature(fn)
        assert all(p.annotation is not inspect.Parameter.empty for p in sig.parameters.values()), name


def test_plugin_surface_is_documented():
    for name in plugin.__all__:
        obj = getattr(plugin, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__doc__, f"runtime_core.plugin.{name} has no docstring"
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") or not callable(member) and not isinstance(member, (classmethod, property)):
                    continue
                target = member.__func__ if isinstance(member, classmethod) else member
                assert getattr(target, "__doc__", None), f"{name}.{attr} has no docstring"


def test_public_api_names():
    for name in ("get_available_providers", "get_all_providers", "get_provider_info", "InferenceSession",
                 "SessionOptions", "RunOptions", "GraphOptimizationLevel", "ExecutionMode"):
        assert hasattr(rt, name)
        assert getattr(rt, name).__doc__


def test_ci_runs_the_readme_quick_start_second_line_verbatim():
    readme, ci = ROOT / "README.md", ROOT / ".ci" / "run"
    if not (readme.exists() and ci.exists()):
        pytest.skip("only meaningful in a checkout (README.md and .ci/run next to the tests)")
    text = readme.read_text()
    block = text.split("## Quick start", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    lines = [ln for ln in block.strip().splitlines() if ln.strip()]
    assert len(lines) == 2, lines
    assert lines[1] in [ln.strip() for ln in ci.read_text().splitlines()]
