import sys
from pathlib import Path

import pytest

from runtime_core.plugin import reload_plugins

SITE = Path(__file__).parent / "fixtures" / "site"


@pytest.fixture
def fixture_plugins(monkeypatch):
    """Put the fixture distribution (real dist-info with entry points) on sys.path."""
    monkeypatch.syspath_prepend(str(SITE))
    for mod in [m for m in sys.modules if m.startswith("rt_fixture_providers")]:
        del sys.modules[mod]
    reg = reload_plugins()
    yield reg
    monkeypatch.undo()
    reload_plugins()


@pytest.fixture
def fakegpu(fixture_plugins):
    from rt_fixture_providers import fakegpu as mod

    for k in mod.COUNTERS:
        mod.COUNTERS[k] = 0
    return mod
