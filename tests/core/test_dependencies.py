"""Declared = imported: every third-party module a distribution imports is one of its declared
dependencies, or belongs to one of its extras and is imported lazily (inside a function or a
``try``) so that a missing extra gives an error that names it; every declared dependency is
imported. The imports are read from the source with ``ast`` (lazy ones included), the
declarations from each distribution's ``pyproject.toml``.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")

ROOT = Path(__file__).resolve().parents[2]
#: distribution folder -> its import package
PACKAGES = {
    ROOT: "runtime_core",
    ROOT / "providers" / "cpu": "runtime_provider_cpu",
    ROOT / "providers" / "cuda": "runtime_provider_cuda",
    ROOT / "providers" / "opencl": "runtime_provider_opencl",
}
OURS = set(PACKAGES.values())
#: import names of distributions that need not be installed here (a GPU's cupy), or whose
#: import name differs from the distribution's and may be missing from this environment
KNOWN = {
    "cupy": {"cupy-cuda12x", "cupy-cuda13x"},
    "cupyx": {"cupy-cuda12x", "cupy-cuda13x"},
    "PIL": {"pillow"},
    "pyopencl": {"pyopencl"},
    "ml_dtypes": {"ml-dtypes"},
    "onnxruntime": {"onnxruntime", "onnxruntime-gpu"},
    "starlette": {"starlette"},
    "uvicorn": {"uvicorn"},
    "prometheus_client": {"prometheus-client"},
    "ray": {"ray"},
}
#: modules that exist only for one extra and are imported only behind a check that names it
#: (module -> extra): their top-level imports of that extra's requirements are fine
EXTRA_ONLY = {
    "runtime_core.serving.app": "serve",  # behind cmd_serve's check and serving.__getattr__
    "runtime_core.serving.server": "serve",
}
#: declared but never imported, on purpose: (distribution, requirement name) -> why
NOT_IMPORTED = {
    ("runtime-provider-opencl", "pocl-binary-distribution"): "an OpenCL driver (ICD) that pyopencl loads",
    ("runtime-core", "httptools"): "uvicorn's fast HTTP parser, which uvicorn loads when it is installed",
    ("runtime-core", "jinja2"): "the ray extra's: Ray 2.58's Serve imports it without declaring it",
}
#: modules loaded only by a program that brings the import itself: (package prefix, module) -> why
PROVIDED = {
    ("runtime_core.testing", "pytest"): "the provider kit is a pytest plugin (entry point pytest11): pytest loads it",
    ("runtime_core.quantization.calibrate", "tqdm"): "optional: the calibration progress bar uses tqdm when the "
                                                     "user has it, a stderr line otherwise (never required)",
    ("runtime_core.integrations.ray", "pandas"): "only to hand back a pandas batch in the form Ray Data handed it "
                                                 "over: pandas is loaded already",
    ("runtime_core.integrations.ray", "pyarrow"): "only for pyarrow batches and output_format='pyarrow': "
                                                  "ray[data], which the ray extra names, requires pyarrow",
}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared(folder: Path) -> tuple[str, dict[str, set[str]]]:
    """(distribution name, {requirement name: {"" for a dependency, else the extras naming it}})."""
    project = tomllib.loads((folder / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    out: dict[str, set[str]] = {}
    for line in project.get("dependencies", []):
        out.setdefault(_norm(Requirement(line).name), set()).add("")
    for extra, lines in project.get("optional-dependencies", {}).items():
        for line in lines:
            out.setdefault(_norm(Requirement(line).name), set()).add(extra)
    return _norm(project["name"]), out


class _Imports(ast.NodeVisitor):
    """Top-level module names imported, each with whether it is lazy (in a function or a try)."""

    def __init__(self):
        self.found: list[tuple[str, bool, int]] = []
        self._depth = 0

    def _nested(self, node):
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Try = _nested
    visit_TryStar = _nested

    def visit_Import(self, node):
        for a in node.names:
            self.found.append((a.name.split(".")[0], self._depth > 0, node.lineno))

    def visit_ImportFrom(self, node):
        if node.level == 0 and node.module:
            self.found.append((node.module.split(".")[0], self._depth > 0, node.lineno))


def _imports(package_dir: Path, package: str):
    """(module path, top-level import, lazy, line) for every .py file of the package."""
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir.parent)
        if "templates" in rel.parts:  # the new-provider scaffold: files of the package it generates
            continue
        module = ".".join(rel.with_suffix("").parts)
        v = _Imports()
        v.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        for name, lazy, line in v.found:
            if name in sys.stdlib_module_names or name == "__future__":
                continue
            yield module, name, lazy, line


@functools.cache
def _installed() -> dict[str, list[str]]:
    return packages_distributions()


def _dists_of(module: str) -> set[str]:
    found = {_norm(d) for d in _installed().get(module, [])}
    return found | {_norm(d) for d in KNOWN.get(module, ())}


@pytest.mark.parametrize("folder", list(PACKAGES), ids=list(PACKAGES.values()))
def test_every_import_is_declared(folder):
    package = PACKAGES[folder]
    dist, declared = _declared(folder)
    problems = []
    for module, name, lazy, line in _imports(folder / package, package):
        if name == package:
            continue
        where = f"{module}:{line}: import {name}"
        if any(module.startswith(p) and name == m for p, m in PROVIDED):
            continue
        dists = _dists_of(name)
        if not dists:
            problems.append(f"{where}: no distribution is known to provide {name!r} (add it to KNOWN)")
            continue
        hits = {d: declared[d] for d in dists if d in declared}
        if not hits:
            problems.append(f"{where}: {sorted(dists)} is not declared by {dist}")
        elif (not any("" in how for how in hits.values()) and not lazy
              and EXTRA_ONLY.get(module) not in set().union(*hits.values())):
            extras = sorted(set().union(*hits.values()))
            problems.append(f"{where}: only the extra(s) {extras} bring it, but it is imported at load time "
                            "(import it in a function or a try, with an error that names the extra)")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("folder", list(PACKAGES), ids=list(PACKAGES.values()))
def test_every_dependency_is_imported(folder):
    package = PACKAGES[folder]
    dist, declared = _declared(folder)
    names = {name for _, name, _, _ in _imports(folder / package, package)}
    imported = {d for name in names for d in _dists_of(name)} | {_norm(n) for n in names & OURS}
    unused = sorted(r for r in declared if r not in imported and (dist, r) not in NOT_IMPORTED)
    assert not unused, f"{dist} declares {unused} but never imports them"


def test_the_cpu_provider_does_not_import_the_core():
    """runtime-provider-cpu depends on numpy & co only: no dependency back on runtime-core (no cycle)."""
    folder = ROOT / "providers" / "cpu"
    bad = [f"{m}:{line}" for m, name, _, line in _imports(folder / "runtime_provider_cpu", "runtime_provider_cpu")
           if name == "runtime_core"]
    assert not bad, bad
