"""Fixtures for the OpenCL provider tests (helpers live in ``opencl_helpers.py``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

# the helper module sits beside this file; its name is unique in the test suite
sys.path.insert(0, str(Path(__file__).parent))

from opencl_helpers import HAVE_PACKAGE, HAVE_POCL, POCL_INSTALLED, SKIP_REASON  # noqa: E402,F401

# the nox session sets this so that a missing PoCL fails the run instead of skipping it all.
# A PoCL that is installed but whose compiler cannot target this CPU is not something an
# install can fix: the device tests are skipped with that reason, shown in the summary.
if os.environ.get("RUNTIME_CORE_OPENCL_REQUIRED") == "1" and not POCL_INSTALLED:
    raise pytest.UsageError(f"RUNTIME_CORE_OPENCL_REQUIRED=1 but {SKIP_REASON} "
                            "(or runtime-provider-opencl is not installed)")


@pytest.fixture
def fresh_registry(monkeypatch):
    """For tests that patch pyopencl: yields ``reload_plugins``; after the test the
    patches are undone first, then the plugins are rescanned."""
    from runtime_core.plugin import reload_plugins

    yield reload_plugins
    monkeypatch.undo()
    reload_plugins()


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def provider():
    """A provider instance on PoCL (tests that use it are marked requires_pocl)."""
    if not HAVE_PACKAGE:
        pytest.skip("runtime-provider-opencl not installed")
    from runtime_provider_opencl.plugin import OpenCLExecutionProvider

    from opencl_helpers import OPTIONS

    return OpenCLExecutionProvider(dict(OPTIONS))
