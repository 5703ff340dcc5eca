"""Fixtures for the OpenCL provider tests (helpers live in ``opencl_helpers.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

# the helper module sits beside this file; its name is unique in the test suite
sys.path.insert(0, str(Path(__file__).parent))

from opencl_helpers import (HAVE_PACKAGE, HAVE_POCL, POCL_INSTALLED, REQUIRED, SKIP_REASON,  # noqa: E402,F401
                            TEST_PLATFORM)

# RUNTIME_CORE_OPENCL_REQUIRED=1 (the nox sessions) or CI=true: no usable device fails the run
# instead of skipping every device test. That covers a PoCL whose compiler cannot target this
# CPU (PyPI's PoCL 3.0 on AMD family-0x1A CPUs): install one that can (.ci/run installs
# Debian's pocl-opencl-icd as root), or pick another platform with RUNTIME_CORE_OPENCL_PLATFORM.
if REQUIRED and not HAVE_POCL:
    raise pytest.UsageError(
        f"an OpenCL device is required here (CI=true or RUNTIME_CORE_OPENCL_REQUIRED=1) but "
        f"{SKIP_REASON if POCL_INSTALLED else 'pyopencl/PoCL or runtime-provider-opencl is not installed'}")


def pytest_report_header(config):
    if not HAVE_POCL:
        return [f"opencl: device tests skipped: {SKIP_REASON}"]
    from runtime_provider_opencl.device import select_device

    return [f"opencl: device tests on {select_device(TEST_PLATFORM)}"]


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
