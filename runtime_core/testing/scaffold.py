"""``runtime-core new-provider NAME``: write a complete provider package from templates.

The package (``runtime-provider-NAME``, import package ``runtime_provider_NAME``)
has a ``pyproject.toml`` with the entry point and the runtime-core version range,
a provider class claiming ``Add`` and ``Relu`` with numpy kernels, a README, a
CHANGELOG, and tests that run the conformance kit. It installs with ``pip install``
and passes its own tests as written.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from ..errors import InvalidArgumentError

__all__ = ["ScaffoldError", "new_provider", "package_names"]

NAME_RE = re.compile(r"^[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*$")
RESERVED = {"cpu", "kit-split", "runtime", "core"}
TEMPLATE_SUFFIX = ".tmpl"


class ScaffoldError(InvalidArgumentError):
    """The scaffold cannot be written: a bad provider name or an output folder in the way."""


def package_names(name: str) -> dict[str, str]:
    """Every name derived from the provider alias ``name`` (``acme`` -> ``runtime_provider_acme`` ...)."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ScaffoldError(
            f"provider name {name!r} is not valid: use lowercase letters and digits, starting with a "
            "letter, with single '-' or '_' between words (for example 'acme' or 'my-npu')")
    if name in RESERVED:
        raise ScaffoldError(f"provider name {name!r} is reserved; reserved names: {', '.join(sorted(RESERVED))}")
    words = re.split(r"[-_]", name)
    snake = "_".join(words)
    return {
        "alias": name,
        "dist": f"runtime-provider-{'-'.join(words)}",
        "package": f"runtime_provider_{snake}",
        "Class": "".join(w[:1].upper() + w[1:] for w in words),
    }


def _ranges() -> dict[str, str]:
    from packaging.version import Version

    from .._version import __version__
    from ..plugin.registry import API_VERSION

    core = Version(__version__)
    # 0.x: minor releases may break; from 1.0 on, only major releases do
    core_range = (f">={core.major}.{core.minor},<{core.major}.{core.minor + 1}" if core.major == 0
                  else f">={core.major}.{core.minor},<{core.major + 1}")
    api = Version(API_VERSION)
    return {
        "core_range": core_range,
        "core_version": __version__,
        "api_version": API_VERSION,
        "plugin_api": f">={api.major}.{api.minor},<{api.major + 1}",
    }


def _templates():
    root = resources.files("runtime_core.testing") / "templates" / "provider"

    def walk(node, rel):
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            if child.is_dir():
                yield from walk(child, rel + (child.name,))
            elif child.name.endswith(TEMPLATE_SUFFIX):
                yield rel + (child.name[: -len(TEMPLATE_SUFFIX)],), child.read_text(encoding="utf-8")

    return list(walk(root, ()))


def render(text: str, values: dict[str, str]) -> str:
    """Replace every ``{{key}}`` of ``values`` in ``text``; an unknown ``{{key}}`` is an error."""
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    left = re.findall(r"\{\{(\w+)\}\}", text)
    if left:
        raise ScaffoldError(f"template placeholder(s) {sorted(set(left))} have no value")
    return text


def new_provider(name: str, output: str | Path | None = None, *, force: bool = False) -> list[Path]:
    """Write the package for provider ``name`` into ``output`` (default ``./runtime-provider-NAME``).

    ``output`` must not exist or be an empty folder, unless ``force`` (files are then
    overwritten). Returns the paths written.
    """
    values = {**package_names(name), **_ranges()}
    out = Path(output) if output is not None else Path.cwd() / values["dist"]
    if out.exists() and not out.is_dir():
        raise ScaffoldError(f"output {str(out)!r} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ScaffoldError(f"output folder {str(out)!r} is not empty; choose another --output "
                            "or pass --force to overwrite")
    written = []
    for rel, text in _templates():
        parts = [values["package"] if p == "__package__" else p for p in rel]
        path = out.joinpath(*parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(text, values), encoding="utf-8")
        written.append(path)
    return written
