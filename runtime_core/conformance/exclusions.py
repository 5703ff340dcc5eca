"""The commented list of conformance cases known not to pass (``exclusions.txt``).

One case per line, ``folder/name  # reason``; blank lines and lines starting with
``#`` are comments. The file documents gaps; it does not hide them: the runner still
runs every excluded case, and the test suite fails both when a case outside the list
fails and when a listed case passes (the list must be kept true). The one exception is a
reason that starts with ``[platform-dependent]``: a case whose expected output hinges on
float32 rounding that differs between BLAS kernels (it passes on some CPUs and fails on
others); such a case may pass without the list going stale, and each one has a test of its
own that checks what *can* be checked (see ``tests/conformance/test_conformance.py``). The
same holds for ``[random]``: an unseeded random op whose expected data are one past draw, which
our draws match by chance now and then (10 Bernoulli bits: about one run in a thousand).
"""

from __future__ import annotations

from importlib import resources

__all__ = ["PLATFORM_DEPENDENT", "RANDOM", "load_exclusions", "may_pass"]

PLATFORM_DEPENDENT = "[platform-dependent]"
RANDOM = "[random]"


def may_pass(reason: str) -> bool:
    """Whether an excluded case may also pass (its reason is tagged ``[platform-dependent]``
    or ``[random]``)."""
    return reason.startswith((PLATFORM_DEPENDENT, RANDOM))


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
