"""``runtime-core new-provider``: the files, the names, the errors, and a package that passes its tests."""

from __future__ import annotations

import ast
import tomllib

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import runtime_core
from kit_helpers import pip_install_target, run_pytest
from runtime_core.cli import main
from runtime_core.errors import InvalidArgumentError
from runtime_core.plugin import API_VERSION
from runtime_core.testing.scaffold import ScaffoldError, class_name, new_provider, package_names, render

FILES = {"pyproject.toml", "README.md", "CHANGELOG.md", "runtime_provider_acme/__init__.py",
         "runtime_provider_acme/_version.py", "runtime_provider_acme/plugin.py",
         "runtime_provider_acme/kernels.py", "runtime_provider_acme/py.typed",
         "tests/test_conformance.py", "tests/test_kernels.py"}


def test_names():
    assert package_names("acme") == {"alias": "acme", "dist": "runtime-provider-acme",
                                     "package": "runtime_provider_acme", "Class": "Acme"}
    assert package_names("my-npu") == {"alias": "my-npu", "dist": "runtime-provider-my-npu",
                                       "package": "runtime_provider_my_npu", "Class": "MyNpu"}
    assert package_names("x2_y")["Class"] == "X2Y"


@pytest.mark.parametrize("name,cls", [("ortdelegate", "OrtDelegate"), ("acmegpu", "AcmeGpu"),
                                      ("my-npu", "MyNpu"), ("xyzzy", "Xyzzy"), ("tvm_remote", "TvmRemote"),
                                      ("npu2", "Npu2")])
def test_class_names_are_camel_case(name, cls):
    assert class_name(name) == cls == package_names(name)["Class"]


def test_the_class_name_can_be_chosen(tmp_path, capsys):
    assert package_names("ortdelegate", "ORTDelegateExecutionProvider")["Class"] == "ORTDelegate"
    with pytest.raises(ScaffoldError, match="class name"):
        package_names("acme", "not-a-class")
    assert main(["new-provider", "ortdelegate", "--output", str(tmp_path / "o")]) == 0
    assert "provider class OrtDelegateExecutionProvider (--class-name chooses another)" in capsys.readouterr().out
    plugin = (tmp_path / "o" / "runtime_provider_ortdelegate" / "plugin.py").read_text()
    assert "class OrtDelegateExecutionProvider(ExecutionProvider)" in plugin
    assert main(["new-provider", "ortdelegate", "--class-name", "OrtD", "--output", str(tmp_path / "p")]) == 0
    plugin = (tmp_path / "p" / "runtime_provider_ortdelegate" / "plugin.py").read_text()
    assert "class OrtDExecutionProvider(ExecutionProvider)" in plugin
    ast.parse(plugin)


@pytest.mark.parametrize("bad", ["", "Acme", "2x", "a--b", "a b", "acme!", "-a", "cpu", "kit-split"])
def test_bad_names_are_refused(bad, tmp_path):
    with pytest.raises(ScaffoldError):
        new_provider(bad, tmp_path / "out")
    assert issubclass(ScaffoldError, InvalidArgumentError)
    assert not (tmp_path / "out").exists()


def test_the_files_and_their_contents(tmp_path):
    out = tmp_path / "pkg"
    written = new_provider("acme", out)
    assert {p.relative_to(out).as_posix() for p in written} == FILES
    meta = tomllib.loads((out / "pyproject.toml").read_text())
    assert meta["project"]["name"] == "runtime-provider-acme"
    assert meta["project"]["entry-points"]["runtime_core.providers"] == {"acme": "runtime_provider_acme.plugin"}
    (core_dep,) = [d for d in meta["project"]["dependencies"] if d.startswith("runtime-core")]
    assert Version(runtime_core.__version__) in SpecifierSet(core_dep[len("runtime-core"):])
    for p in written:
        text = p.read_text()
        assert "{{" not in text, f"{p} has an unfilled placeholder"
        if p.suffix == ".py":
            ast.parse(text, str(p))
    plugin = (out / "runtime_provider_acme" / "plugin.py").read_text()
    assert 'alias = "acme"' in plugin and "class AcmeExecutionProvider(ExecutionProvider)" in plugin
    (spec,) = [line.split("=", 1)[1].strip().strip('"') for line in plugin.splitlines()
               if line.strip().startswith("plugin_api =")]
    assert Version(API_VERSION) in SpecifierSet(spec)


def test_an_existing_folder_is_not_overwritten(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(ScaffoldError, match="is not empty"):
        new_provider("acme", tmp_path)
    new_provider("acme", tmp_path, force=True)
    assert (tmp_path / "keep.txt").read_text() == "mine"
    assert (tmp_path / "pyproject.toml").exists()


def test_unknown_placeholders_are_an_error():
    with pytest.raises(ScaffoldError, match="have no value"):
        render("{{alias}} {{nope}}", {"alias": "a"})


def test_the_command_line(tmp_path, capsys):
    assert main(["new-provider", "acme", "--output", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "created runtime-provider-acme" in out and "tests/test_conformance.py" in out
    assert main(["new-provider", "acme", "--output", str(tmp_path / "a")]) == 2
    assert "ScaffoldError" in capsys.readouterr().err
    assert main(["new-provider", "Bad Name", "--output", str(tmp_path / "b")]) == 2


def test_the_generated_package_installs_and_passes_its_tests(tmp_path):
    """Acceptance: pip install the package (a real wheel build), then its own tests and the kit pass."""
    pkg = tmp_path / "runtime-provider-acme"
    new_provider("acme", pkg)
    target = tmp_path / "site"
    pip_install_target(pkg, target)
    assert (target / "runtime_provider_acme" / "plugin.py").exists()
    run = tmp_path / "run"
    run.mkdir()
    proc = run_pytest([str(pkg / "tests"), "-q", "-rf"], run, [target])
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-2000:]
    assert "runtime-core provider kit: AcmeExecutionProvider" in out
    assert "claimed cases: 3 run, 3 passed, 0 failed" in out
    assert " failed" not in out.strip().splitlines()[-1]
