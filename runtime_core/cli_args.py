"""Argument checks of the ``runtime-core`` command line: every user mistake becomes one
``error: ...`` line (exit 2) that names the file or value and what is wrong, raised before
anything is written.
"""

from __future__ import annotations

import argparse
import os
import zipfile

import numpy as np

__all__ = ["Parser", "UsageError", "check_output_dir", "check_output_file", "check_readable",
           "int_at_least", "float_at_least", "load_npy", "load_npz"]

_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"


class UsageError(Exception):
    """A user mistake on the command line; ``main`` prints ``error: <message>`` and exits 2."""


class Parser(argparse.ArgumentParser):
    """argparse, with its usage errors as one ``error:`` line (subparsers inherit it)."""

    def error(self, message):  # noqa: D401 - argparse override
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def int_at_least(low: int):
    """An argparse ``type`` for ints >= ``low``."""

    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {s!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {v}")
        return v

    parse.__name__ = f"int>={low}"
    return parse


def float_at_least(low: float):
    """An argparse ``type`` for finite floats >= ``low``."""

    def parse(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number >= {low}, got {s!r}") from None
        if not np.isfinite(v) or v < low:
            raise argparse.ArgumentTypeError(f"must be a finite number >= {low}, got {s}")
        return v

    parse.__name__ = f"float>={low}"
    return parse


def check_readable(path: str, what: str) -> str:
    """``path`` if it is a readable regular file, else :class:`UsageError` naming it."""
    if not path:
        raise UsageError(f"{what}: no file given")
    if not os.path.lexists(path):
        raise UsageError(f"{what} {path!r} does not exist")
    if os.path.isdir(path):
        raise UsageError(f"{what} {path!r} is a directory, not a file")
    if not os.path.exists(path):
        raise UsageError(f"{what} {path!r} is a broken symbolic link")
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise UsageError(f"{what} {path!r} cannot be read: {exc.strerror or exc}") from None
    return path


def _head(path: str, n: int) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def load_npy(path: str, what: str) -> np.ndarray:
    """One array from a ``.npy`` file (no pickles), or :class:`UsageError` saying why not."""
    check_readable(path, what)
    head = _head(path, 6)
    if head[:4] == _ZIP_MAGIC:
        raise UsageError(f"{what} {path!r} is an .npz archive; give one array per .npy file "
                         "(numpy.save)")
    if head != _NPY_MAGIC:
        raise UsageError(f"{what} {path!r} is not a .npy file (it does not start with numpy's "
                         "format header); write arrays with numpy.save")
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as exc:
        if "pickle" in str(exc).lower():
            raise UsageError(f"{what} {path!r} holds Python objects (an object array), which are not "
                             "loaded; save a numeric or string array") from None
        raise UsageError(f"{what} {path!r} is a damaged .npy file: {exc}") from None
    except (OSError, EOFError) as exc:
        raise UsageError(f"{what} {path!r} is a damaged .npy file: {exc}") from None


def load_npz(path: str, what: str) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` archive (no pickles), or :class:`UsageError` saying why not."""
    check_readable(path, what)
    head = _head(path, 6)
    if head == _NPY_MAGIC:
        raise UsageError(f"{what} {path!r} is a single .npy array; give an .npz archive with one "
                         "array per model input (numpy.savez)")
    if head[:4] != _ZIP_MAGIC:
        raise UsageError(f"{what} {path!r} is not an .npz archive (numpy.savez)")
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except ValueError as exc:
        if "pickle" in str(exc).lower():
            raise UsageError(f"{what} {path!r} holds Python objects (an object array), which are not "
                             "loaded") from None
        raise UsageError(f"{what} {path!r} is a damaged .npz archive: {exc}") from None
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise UsageError(f"{what} {path!r} is a damaged .npz archive: {exc}") from None


def check_output_dir(path: str, what: str) -> str:
    """``path`` if it is an existing, writable folder."""
    if not os.path.isdir(path):
        why = "is a file, not a folder" if os.path.exists(path) else "does not exist (create it first)"
        raise UsageError(f"{what} {path!r} {why}")
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{what} {path!r} is not writable")
    return path


def check_output_file(path: str, what: str, *, not_same_as: str | None = None) -> str:
    """``path`` if a file can be written there: its folder exists and is writable, it is not a
    folder, and it is not the file ``not_same_as`` (an input it would overwrite)."""
    if not path:
        raise UsageError(f"{what}: no file given")
    if os.path.isdir(path):
        raise UsageError(f"{what} {path!r} is a directory; give a file name")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"{what} {path!r}: its folder {os.path.dirname(path) or '.'!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise UsageError(f"{what} {path!r} is not writable")
    if not_same_as is not None and os.path.exists(path) and os.path.exists(not_same_as) \
            and os.path.samefile(path, not_same_as):
        raise UsageError(f"{what} {path!r} is the input model; writing it would overwrite the input")
    return path
