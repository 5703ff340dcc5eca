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

__all__ = ["ScaffoldError", "class_name", "new_provider", "package_names"]

NAME_RE = re.compile(r"^[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*$")
RESERVED = {"cpu", "kit-split", "runtime", "core"}
TEMPLATE_SUFFIX = ".tmpl"


#: words a run-together alias is split into for its class name (``ortdelegate`` -> ``OrtDelegate``)
WORDS = frozenset("""
    accel acme ai ane apu arm bridge cl cloud compiler compute core cpu cuda delegate device dml
    dnn dsp edge engine fast fpga gl gpu graph hexagon hw intel ipu lite metal ml mps my neural
    nn npu nvidia onnx openvino ort qnn remote rocm rt runtime tensor tensorrt tpu trt tvm vendor
    vulkan web webgpu xla xnn xnnpack
""".split())


class ScaffoldError(InvalidArgumentError):
    """The scaffold cannot be written: a bad provider name or an output folder in the way."""


def _segment(word: str) -> list[str] | None:
    """``word`` as two or more :data:`WORDS` (fewest pieces), or ``None``."""
    best: list[list[str] | None] = [[]] + [None] * len(word)
    for end in range(1, len(word) + 1):
        for start in range(end):
            head = best[start]
            if head is not None and word[start:end] in WORDS:
                cand = head + [word[start:end]]
                if best[end] is None or len(cand) < len(best[end]):
                    best[end] = cand
    found = best[len(word)]
    return found if found is not None and len(found) > 1 else None


def class_name(name: str) -> str:
    """The CamelCase stem of the provider class for alias ``name``: words split at ``-``/``_``
    and at digits, and a run-together word split into known words (``ortdelegate`` ->
    ``OrtDelegate``); anything else is capitalized as is (``--class-name`` chooses another)."""
    parts: list[str] = []
    for w in re.split(r"[-_]", name):
        for piece in re.findall(r"[a-z]+|[0-9]+", w):
            parts.extend(_segment(piece) or [piece])
    return "".join(p[:1].upper() + p[1:] for p in parts)


CLASS_RE = re.compile(r"^[A-Z][A-Za-z0-9]*$")


def package_names(name: str, cls: str | None = None) -> dict[str, str]:
    """Every name derived from the provider alias ``name`` (``acme`` -> ``runtime_provider_acme`` ...);
    ``cls`` is the class-name stem (``OrtDelegate`` for ``OrtDelegateExecutionProvider``;
    default :func:`class_name`)."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ScaffoldError(
            f"provider name {name!r} is not valid: use lowercase letters and digits, starting with a "
            "letter, with single '-' or '_' between words (for example 'acme' or 'my-npu')")
    if name in RESERVED:
        raise ScaffoldError(f"provider name {name!r} is reserved; reserved names: {', '.join(sorted(RESERVED))}")
    words = re.split(r"[-_]", name)
    snake = "_".join(words)
    if cls is not None:
        cls = cls.removesuffix("ExecutionProvider")
        if not CLASS_RE.match(cls):
            raise ScaffoldError(f"class name {cls!r} is not valid: use CamelCase letters and digits, "
                                "starting with an uppercase letter (for example 'OrtDelegate')")
    return {
        "alias": name,
        "dist": f"runtime-provider-{'-'.join(words)}",
        "package": f"runtime_provider_{snake}",
        "Class": cls or class_name(name),
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


def new_provider(name: str, output: str | Path | None = None, *, force: bool = False,
                 class_name: str | None = None) -> list[Path]:
    """Write the package for provider ``name`` into ``output`` (default ``./runtime-provider-NAME``).

    ``output`` must not exist or be an empty folder, unless ``force`` (files are then
    overwritten). ``class_name`` is the provider class's stem (``OrtDelegate`` gives
    ``OrtDelegateExecutionProvider``; default: from ``name``). Returns the paths written.
    """
    values = {**package_names(name, class_name), **_ranges()}
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
