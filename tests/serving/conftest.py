"""Fixtures of the serving tests: small real models, and servers on free loopback ports (uvicorn in
a thread of the test process)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


def _have_extra() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) for m in ("starlette", "uvicorn", "prometheus_client"))


# without the optional runtime-core[serve] extra there is nothing to test here (the tests session
# installs it and sets RUNTIME_CORE_EXPECT_INSTALLED=1: there, a missing extra fails the imports)
if os.environ.get("RUNTIME_CORE_EXPECT_INSTALLED") != "1" and not _have_extra():
    collect_ignore_glob = ["test_*.py"]

import serve_models as models  # noqa: E402  (tests/serving/serve_models.py)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("serve-models")
    models.cnn(d / "cnn.onnx")
    models.mixed(d / "mixed.onnx")
    models.slow(d / "slow.onnx")
    models.strings(d / "strings.onnx")
    return d
