"""Raw HTTP helpers of the serving tests (urllib: no client library between the test and the server)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


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
