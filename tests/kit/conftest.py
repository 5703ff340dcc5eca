"""Fixtures of the kit's tests (helpers live in ``kit_helpers.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# the helper module sits beside this file; its name is unique in the test suite
sys.path.insert(0, str(Path(__file__).parent))

from kit_helpers import SITE  # noqa: E402
from runtime_core.plugin import reload_plugins  # noqa: E402


@pytest.fixture
def kit_site(monkeypatch):
    """Put the fault providers (a real dist-info with entry points) on sys.path."""
    monkeypatch.syspath_prepend(str(SITE))
    for mod in [m for m in sys.modules if m.startswith("rt_kit_faults")]:
        del sys.modules[mod]
    reg = reload_plugins()
    yield reg
    monkeypatch.undo()
    reload_plugins()
