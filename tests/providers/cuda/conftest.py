"""Fixtures for the CUDA provider tests.

Without a GPU (or without cupy) the provider's code is exercised through
``standin_provider`` (the real provider on the numpy stand-in for cupy); the tests
in ``test_gpu.py`` need a working CUDA device and are skipped otherwise, unless
``RUNTIME_CORE_CUDA_REQUIRED=1`` (the ``nox -s gpu`` session) makes that an error.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


def _cuda_reason():
    try:
        from runtime_provider_cuda.plugin import CUDAExecutionProvider
    except Exception as exc:  # noqa: BLE001
        return f"runtime-provider-cuda not importable: {exc}"
    res = CUDAExecutionProvider.probe()
    return None if res.available else res.reason


CUDA_REASON = _cuda_reason()
if os.environ.get("RUNTIME_CORE_CUDA_REQUIRED") == "1" and CUDA_REASON:
    raise pytest.UsageError(f"RUNTIME_CORE_CUDA_REQUIRED=1 but CUDA is unavailable: {CUDA_REASON}")


@pytest.fixture
def standin():
    """The registry with the stand-in provider ('cudastandin') added; restored afterwards."""
    import standin_provider
    from runtime_core.plugin import reload_plugins

    reg = standin_provider.register()
    yield reg
    reload_plugins()
