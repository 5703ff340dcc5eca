"""The docstring rule of the plugin API, and the guide covering all of it.

Every hook and every public class, function, method and constant that
``runtime_core.plugin`` exports documents itself; every hook parameter is typed; and
``docs/writing-a-provider.md`` (when the source tree is at hand) names each of them.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import runtime_core.plugin as plugin
from runtime_core.plugin import hookspecs

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "writing-a-provider.md"
PLUGIN_DIR = Path(plugin.__file__).parent


def _own_doc(obj) -> str:
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    doc = (doc or "").strip()
    if inspect.isclass(obj) and doc.startswith(f"{obj.__name__}("):  # dataclass's generated signature
        return ""
    return doc


def _attribute_docs() -> dict[str, str]:
    """Module-level names of runtime_core/plugin/*.py followed by a string literal (attribute docstrings)."""
    docs = {}
    for path in PLUGIN_DIR.glob("*.py"):
        body = ast.parse(path.read_text()).body
        for stmt, nxt in zip(body, body[1:]):
            targets = (stmt.targets if isinstance(stmt, ast.Assign)
                       else [stmt.target] if isinstance(stmt, ast.AnnAssign) else [])
            if (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                for t in targets:
                    if isinstance(t, ast.Name):
                        docs[t.id] = nxt.value.value.strip()
    return docs


def _exports():
    return [(name, getattr(plugin, name)) for name in plugin.__all__]


def _hooks():
    return [(n, f) for n, f in inspect.getmembers(hookspecs, inspect.isfunction) if n.startswith("runtime_core_")]


def test_there_are_hooks_and_exports():
    assert _hooks(), "hookspecs.py defines no runtime_core_ hook"
    assert len(plugin.__all__) == len(set(plugin.__all__))
    for name in plugin.__all__:
        assert hasattr(plugin, name), f"runtime_core.plugin.__all__ names {name!r}, which it does not define"


@pytest.mark.parametrize("name,hook", _hooks(), ids=[n for n, _ in _hooks()])
def test_every_hook_is_a_typed_documented_hookspec(name, hook):
    assert (hook.__doc__ or "").strip(), f"hook {name} has no docstring"
    assert getattr(hook, f"{hookspecs.PROJECT_NAME}_spec", None) is not None, f"{name} is not marked @hookspec"
    sig = inspect.signature(hook)
    untyped = [p for p, v in sig.parameters.items() if v.annotation is inspect.Parameter.empty]
    assert not untyped, f"hook {name} has untyped parameter(s) {untyped}"
    assert sig.return_annotation is not inspect.Signature.empty, f"hook {name} has no return annotation"


@pytest.mark.parametrize("name,obj", _exports(), ids=plugin.__all__)
def test_every_export_is_documented(name, obj):
    if inspect.isclass(obj) or inspect.isfunction(obj):
        assert _own_doc(obj), f"runtime_core.plugin.{name} has no docstring of its own"
    else:  # a constant or a marker object: an attribute docstring in the source
        assert _attribute_docs().get(name), (f"runtime_core.plugin.{name} has no attribute docstring "
                                              "(a string literal right after its assignment)")


def _public_members(cls):
    for attr, value in cls.__dict__.items():
        if attr.startswith("_"):
            continue
        if isinstance(value, (classmethod, staticmethod)):
            yield attr, value.__func__
        elif inspect.isfunction(value) or isinstance(value, property):
            yield attr, value


_CLASS_MEMBERS = [(f"{n}.{a}", m) for n, c in _exports() if inspect.isclass(c) for a, m in _public_members(c)]


@pytest.mark.parametrize("name,member", _CLASS_MEMBERS, ids=[n for n, _ in _CLASS_MEMBERS])
def test_every_public_method_and_property_is_documented(name, member):
    doc = member.__doc__ if not isinstance(member, property) else member.fget.__doc__
    assert (doc or "").strip(), f"runtime_core.plugin.{name} has no docstring"


def test_the_check_itself_catches_an_undocumented_class():
    class Undocumented:
        def method(self):
            return 1

    assert _own_doc(Undocumented) == ""
    assert [a for a, m in _public_members(Undocumented) if not (m.__doc__ or "").strip()] == ["method"]

    from dataclasses import dataclass

    @dataclass
    class Generated:
        x: int = 0

    assert _own_doc(Generated) == ""


def test_the_guide_names_every_hook_export_and_provider_method():
    text = GUIDE.read_text()
    names = [n for n, _ in _hooks()] + list(plugin.__all__)
    names += [a for a, _ in _public_members(plugin.ExecutionProvider)]
    names += ["name", "alias", "version", "distribution", "plugin_api", "device_type"]
    missing = [n for n in names if f"`{n}" not in text and f"{n}(" not in text]
    assert not missing, f"docs/writing-a-provider.md does not mention {missing}"
