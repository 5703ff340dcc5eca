"""The example provider package is a well-formed, separately versioned distribution.

Its behaviour is tested by its own tests and the kit in ``nox -s example`` (which
installs numexpr); here only what needs no numexpr: metadata and contract identity.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

import runtime_core
from runtime_core.plugin import API_VERSION

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "runtime-provider-numexpr"
PKG = EXAMPLE / "runtime_provider_numexpr"


def _class_attrs() -> dict[str, str]:
    tree = ast.parse((PKG / "plugin.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "NumexprExecutionProvider"]
    out = {}
    for stmt in cls.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
            v = stmt.value
            out[stmt.targets[0].id] = v.value if isinstance(v, ast.Constant) else ast.unparse(v)
    return out


def test_the_example_has_its_own_distribution_files():
    for name in ("pyproject.toml", "README.md", "CHANGELOG.md", "tests/test_conformance.py",
                 "tests/test_fusion.py", "runtime_provider_numexpr/_version.py", "benchmarks/bench_chain.py"):
        assert (EXAMPLE / name).is_file(), name


def test_its_metadata_matches_its_provider_class_and_runtime_core():
    meta = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())
    project = meta["project"]
    attrs = _class_attrs()
    assert project["name"] == attrs["distribution"] == "runtime-provider-numexpr"
    eps = project["entry-points"]["runtime_core.providers"]
    assert eps == {attrs["alias"]: "runtime_provider_numexpr.plugin"}
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "runtime_provider_numexpr._version.__version__"}
    assert attrs["version"] == "__version__"
    assert attrs["name"] == "NumexprExecutionProvider" and attrs["device_type"] == "cpu"
    (core,) = [d for d in project["dependencies"] if d.startswith("runtime-core")]
    assert Version(runtime_core.__version__) in SpecifierSet(core[len("runtime-core"):]), core
    assert Version(API_VERSION) in SpecifierSet(attrs["plugin_api"])
    assert any(d.startswith("numexpr") for d in project["dependencies"])


def test_its_version_is_written_once_and_has_a_changelog_entry():
    version = re.search(r'__version__ = "([^"]+)"', (PKG / "_version.py").read_text()).group(1)
    Version(version)
    assert f"## {version}" in (EXAMPLE / "CHANGELOG.md").read_text()
    hits = [p for p in PKG.rglob("*.py") if re.search(r'["\']' + re.escape(version) + r'["\']', p.read_text())]
    assert hits == [PKG / "_version.py"]


def test_it_imports_only_the_plugin_api_from_runtime_core():
    for path in list(PKG.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            for m in mods:
                if m.startswith("runtime_core"):
                    assert m == "runtime_core.plugin", f"{path.name} imports {m}"
