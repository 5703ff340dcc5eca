"""The commented list of conformance cases known not to pass (``exclusions.txt``).

One case per line, ``folder/name  # reason``; blank lines and lines starting with
``#`` are comments. The file documents gaps; it does not hide them: the runner still
runs every excluded case, and the test suite fails both when a case outside the list
fails and when a listed case passes (the list must be kept true).
"""

from __future__ import annotations

from importlib import resources

__all__ = ["load_exclusions"]


def load_exclusions(path=None) -> dict[str, str]:
    """``{case id: reason}`` from ``path`` or the packaged ``exclusions.txt``."""
    if path is None:
        text = resources.files(__package__).joinpath("exclusions.txt").read_text(encoding="utf-8")
    else:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    out: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        case, _, reason = line.partition("#")
        case, reason = case.strip(), reason.strip()
        if not reason:
            raise ValueError(f"exclusions line {lineno}: {case!r} has no reason (write 'folder/name  # reason')")
        out[case] = reason
    return out
