"""Fixtures of the serving tests: small real models, and servers on free loopback ports (uvicorn in
a thread of the test process)."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
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


def http(url: str, body: bytes | None = None, headers: dict | None = None, method: str | None = None):
    """(status, headers, body bytes) of one raw HTTP request; error statuses are returned, not raised."""
    req = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def http_json(url: str, payload=None, **kw):
    """(status, decoded JSON body) of a request whose body is ``payload`` as JSON."""
    body = None if payload is None else json.dumps(payload).encode()
    status, _, raw = http(url, body, {"Content-Type": "application/json"} if body else None, **kw)
    return status, json.loads(raw)
