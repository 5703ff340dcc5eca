"""The inference path's shortcuts keep the protocol: one write per response head and body (HEAD,
keep-alive and pipelining still answered), ``/infer`` answered past the router with the same
routes, access log and metrics, and the validation of a known feed signature skipped only while
the session would take the feed unchanged."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import numpy as np
import pytest
from serve_http import http, http_json

import runtime_core as rt
from runtime_core.errors import InputShapeError, InputTypeError
from runtime_core.serving import BackgroundServer, ModelConfig, ServerConfig
from runtime_core.serving.model import ServedModel
from runtime_core.serving.server import HeadWithBody

X = np.random.default_rng(5).standard_normal((1, 3, 16, 16)).astype(np.float32)


class _Recorder:
    def __init__(self):
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data):
        self.writes.append(bytes(data))

    def close(self):
        self.closed = True

    def get_extra_info(self, name, default=None):
        return ("peer", name)


def test_head_waits_for_its_body():
    t = _Recorder()
    w = HeadWithBody(t)
    w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    assert t.writes == []
    w.write(b"ok")
    assert t.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]
    w.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # the client waits for it: never held
    assert t.writes[-1] == b"HTTP/1.1 100 Continue\r\n\r\n"
    w.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    w.flush()  # a response without a body (the protocol flushes when it completes)
    assert t.writes[-1] == b"HTTP/1.1 204 No Content\r\n\r\n"
    w.write(b"HTTP/1.1 500 Internal Server Error\r\n\r\n")
    w.close()
    assert t.writes[-1].startswith(b"HTTP/1.1 500") and t.closed
    assert w.get_extra_info("peername") == ("peer", "peername")  # the rest is the transport's


@pytest.fixture(scope="module")
def server(model_dir):
    cfg = ServerConfig(models=[ModelConfig(str(model_dir / "cnn.onnx"), max_batch_size=8, max_queue_delay_ms=1)])
    with BackgroundServer(cfg) as s:
        yield s


def _binary(x):
    head = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "outputs": [{"name": "probs", "parameters": {"binary_data": True}}]}).encode()
    return head + x.tobytes(), len(head)


def _read_response(sock, buf: bytes) -> tuple[bytes, bytes, bytes]:
    """(head, body, rest) of one response from a keep-alive socket."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        buf += chunk
    head, _, buf = buf.partition(b"\r\n\r\n")
    n = int(next(v for k, _, v in (ln.partition(b":") for ln in head.split(b"\r\n")[1:])
                 if k.strip().lower() == b"content-length"))
    while len(buf) < n:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        buf += chunk
    return head, buf[:n], buf[n:]


def test_pipelined_and_head_requests_on_one_connection(server, model_dir):
    """Two pipelined inferences and a HEAD (a response with no body write) on one keep-alive
    connection: each is answered in order, and the HEAD does not hang."""
    want = rt.InferenceSession(str(model_dir / "cnn.onnx")).run(["probs"], {"x": X})[0]
    body, hlen = _binary(X)
    port = int(server.url.rsplit(":", 1)[1])
    req = (f"POST /v2/models/cnn/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: {hlen}\r\n"
           f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(req + req)
        buf = b""
        for _ in range(2):
            head, payload, buf = _read_response(sock, buf)
            assert head.startswith(b"HTTP/1.1 200")
            got = np.frombuffer(payload[int(dict(ln.split(b": ", 1) for ln in head.split(b"\r\n")[1:])
                                             [b"inference-header-content-length"]):], np.float32)
            np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5)
        sock.sendall(b"HEAD /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        while b"\r\n\r\n" not in buf:
            buf += sock.recv(65536)
        assert buf.startswith(b"HTTP/1.1 200") and b"content-length" in buf.lower()
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")  # the connection still serves
        head, payload, _ = _read_response(sock, buf.partition(b"\r\n\r\n")[2])
        assert head.startswith(b"HTTP/1.1 200") and json.loads(payload) == {"live": True}


@pytest.mark.parametrize(("method", "path", "status"), [
    ("POST", "/v2/models/cnn/versions/1/infer", 200),
    ("POST", "/v2/models/cnn/versions/7/infer", 404),
    ("POST", "/v2/models/nope/infer", 404),
    ("POST", "/v2/models//infer", 404),
    ("POST", "/v2/models/cnn/versions/1/x/infer", 404),
    ("POST", "/v2/models/cnn/extra/infer", 404),
    ("GET", "/v2/models/cnn/infer", 405),
])
def test_infer_routes_match_as_before(server, method, path, status):
    body, hlen = _binary(X)
    got, _, raw = http(server.url + path, body if method == "POST" else None,
                       {"Inference-Header-Content-Length": str(hlen)} if method == "POST" else None, method=method)
    assert got == status, raw
    if status != 200:
        assert "error" in json.loads(raw)


def test_fast_path_counts_and_logs(server, caplog):
    def count() -> float:
        text = http(server.url + "/metrics")[2].decode()
        line = [ln for ln in text.splitlines()
                if ln.startswith('runtime_core_http_requests_total{route="/v2/models/{name}/infer",status="200"}')]
        return float(line[0].split()[-1]) if line else 0.0

    before = count()
    body, hlen = _binary(X)
    with caplog.at_level("INFO", logger="runtime_core.serving.access"):
        for _ in range(3):
            assert http(server.url + "/v2/models/cnn/infer", body, {"Inference-Header-Content-Length": str(hlen)})[0] \
                == 200

        def posts() -> list:
            lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "runtime_core.serving.access"]
            return [(d["path"], d["route"], d["status"]) for d in lines if d["method"] == "POST"]

        t0 = time.monotonic()  # the line and the count follow the response's last byte
        while (len(posts()) < 3 or count() < before + 3) and time.monotonic() - t0 < 10:
            time.sleep(0.02)
    assert count() == before + 3
    assert posts() == [("/v2/models/cnn/infer", "/v2/models/{name}/infer", 200)] * 3
    assert http_json(server.url + "/v2/models/cnn")[0] == 200  # other routes go through the router


def test_known_signature_skips_validation_but_not_errors(model_dir):
    """The second feed of a signature is not validated again; a feed that differs in dtype or
    shape is, and gets the session's own error."""
    m = ServedModel(ModelConfig(str(model_dir / "cnn.onnx"), max_batch_size=4, max_queue_delay_ms=0))
    calls = []
    real = m.session.validate_inputs
    m.session.validate_inputs = lambda feeds, names=None: calls.append(1) or real(feeds, names)
    want = rt.InferenceSession(str(model_dir / "cnn.onnx")).run(None, {"x": X})

    async def go():
        await m.start()
        try:
            for _ in range(3):
                outs, _ = await m.infer({"x": X.copy()}, None)
                for o, w in zip(outs, want):
                    np.testing.assert_allclose(o, w, rtol=1e-5)
            assert len(calls) == 1
            with pytest.raises(InputTypeError):
                await m.infer({"x": X.astype(np.float64)}, None)
            with pytest.raises(InputShapeError):
                await m.infer({"x": X[:, :, :8]}, None)
            with pytest.raises(InputShapeError):  # the same again: an error is never remembered as good
                await m.infer({"x": X[:, :, :8]}, None)
            assert len(calls) == 4
            strings = {"x": X.astype(object)}  # element checks: never cached
            for _ in range(2):
                with pytest.raises(InputTypeError):
                    await m.infer(strings, None)
            assert len(calls) == 6
        finally:
            await m.stop()

    asyncio.run(go())
