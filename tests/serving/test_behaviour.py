"""Serving behaviour: the per-request timeout terminates the run, the concurrency bound holds,
metrics and JSON access logs, a 16-client load with nothing lost, the CLI with graceful shutdown."""

from __future__ import annotations

import http.client as httplib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from serve_http import http, http_json
from prometheus_client.parser import text_string_to_metric_families

import runtime_core as rt
from runtime_core.cli import main
from runtime_core.serving import BackgroundServer, ModelConfig, ServerConfig
from runtime_core.serving.model import ServedModel

import serve_models as models


def binary_request(x: np.ndarray, name: str = "x") -> tuple[bytes, dict]:
    head = json.dumps({"inputs": [{"name": name, "shape": list(x.shape), "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "parameters": {"binary_data_output": True}}).encode()
    return head + x.tobytes(), {"Inference-Header-Content-Length": str(len(head)),
                                "Content-Type": "application/octet-stream"}


def binary_outputs(raw: bytes, headers: dict) -> dict:
    hlen = int(headers["inference-header-content-length"] if "inference-header-content-length" in headers
               else headers["Inference-Header-Content-Length"])
    head, pos, out = json.loads(raw[:hlen]), hlen, {}
    for o in head["outputs"]:
        n = o["parameters"]["binary_data_size"]
        out[o["name"]] = np.frombuffer(raw[pos:pos + n], np.float32).reshape(o["shape"])
        pos += n
    return out


def metric(url: str, name: str, **labels) -> float:
    text = http(url + "/metrics")[2].decode()
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def test_timeout_terminates_the_run_and_the_model_keeps_serving(model_dir):
    cfg = ServerConfig(models=[ModelConfig(str(model_dir / "slow.onnx"), timeout_s=0.2)])
    # 12 products of 1400^3: ~66 GFLOP, seconds on any CPU (700 finished within the timeout)
    x = np.random.default_rng(0).standard_normal((1400, 1400)).astype(np.float32) / 40
    small = np.random.default_rng(1).standard_normal((8, 8)).astype(np.float32) / 3
    with BackgroundServer(cfg) as s:
        status, _, raw = http(s.url + "/v2/models/slow/infer", *binary_request(x))
        body = json.loads(raw)
        assert status == 504 and "was terminated" in body["error"] and "timeout_s=0.2" in body["error"]
        assert metric(s.url, "runtime_core_inference_terminated_total", model="slow") == 1
        assert metric(s.url, "runtime_core_inference_errors_total", model="slow", status="504") == 1
        status, headers, raw = http(s.url + "/v2/models/slow/infer", *binary_request(small))
        assert status == 200
        want = rt.InferenceSession(str(model_dir / "slow.onnx")).run(None, {"x": small})[0]
        np.testing.assert_allclose(binary_outputs(raw, headers)["y"], want, rtol=1e-5, atol=1e-6)


def test_concurrency_bound_holds(model_dir):
    model = ServedModel(ModelConfig(str(model_dir / "slow.onnx"), max_concurrency=2))
    run, lock, state = model.session.run, threading.Lock(), {"now": 0, "peak": 0}

    def counting_run(*a, **kw):
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        try:
            time.sleep(0.05)  # long enough for the others to pile up
            return run(*a, **kw)
        finally:
            with lock:
                state["now"] -= 1

    model.session.run = counting_run
    x = np.ones((16, 16), np.float32) / 16
    with BackgroundServer(ServerConfig(models=[]), models=[model]) as s, ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: http(s.url + "/v2/models/slow/infer", *binary_request(x))[0], range(8)))
    assert codes == [200] * 8
    assert state["peak"] == 2


def test_metrics_and_json_access_log(model_dir, caplog):
    cfg = ServerConfig(models=[ModelConfig(str(model_dir / "cnn.onnx"))])
    x = np.zeros((2, 3, 16, 16), np.float32)
    with caplog.at_level(logging.INFO, logger="runtime_core.serving.access"), BackgroundServer(cfg) as s:
        for _ in range(3):
            assert http(s.url + "/v2/models/cnn/infer", *binary_request(x))[0] == 200
        assert http(s.url + "/v2/models/cnn/infer", b"{", {"Content-Type": "application/json"})[0] == 400
        url = s.url
        text = http(url + "/metrics")[2].decode()
        assert metric(url, "runtime_core_inference_requests_total", model="cnn") == 4
        assert metric(url, "runtime_core_inference_errors_total", model="cnn", status="400") == 1
        assert metric(url, "runtime_core_inference_latency_seconds_count", model="cnn") == 4
        assert metric(url, "runtime_core_inference_batch_rows_sum", model="cnn") == 3  # the bad one never ran
        assert metric(url, "runtime_core_inference_queue_seconds_count", model="cnn") == 3
        assert metric(url, "runtime_core_http_requests_total", route="/v2/models/{name}/infer", status="200") == 3
        assert "# TYPE runtime_core_inference_latency_seconds histogram" in text
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "runtime_core.serving.access"]
    infers = [ln for ln in lines if ln["path"] == "/v2/models/cnn/infer"]
    assert [ln["status"] for ln in infers] == [200, 200, 200, 400]
    assert all(ln["method"] == "POST" and ln["ms"] >= 0 and ln["bytes"] > 0 and ln["client"] for ln in infers)


@pytest.mark.parametrize("batching", [False, True])
def test_load_16_clients_nothing_lost(model_dir, batching):
    """16 clients, each on its own keep-alive connection, 50 requests each: all answered, each with its own
    input's right result. (benchmarks/serve_load.py runs the full 16 x 500 and reports latency.)"""
    clients, per = 16, 50
    cfg = ServerConfig(models=[ModelConfig(str(model_dir / "cnn.onnx"), max_batch_size=16 if batching else 0,
                                           max_queue_delay_ms=2, max_concurrency=2)])
    sess = rt.InferenceSession(str(model_dir / "cnn.onnx"))
    xs = [np.random.default_rng(50 + c).standard_normal((1, 3, 16, 16)).astype(np.float32) for c in range(clients)]
    want = [sess.run(["probs"], {"x": x})[0] for x in xs]

    with BackgroundServer(cfg) as s:
        host, port = s.url.removeprefix("http://").split(":")

        def client(c):
            conn = httplib.HTTPConnection(host, int(port), timeout=60)
            body, headers = binary_request(xs[c])
            bad = 0
            for _ in range(per):
                conn.request("POST", "/v2/models/cnn/infer", body=body, headers=headers)
                r = conn.getresponse()
                raw = r.read()
                if r.status != 200:
                    bad += 1
                    continue
                got = binary_outputs(raw, {k.lower(): v for k, v in r.getheaders()})["probs"]
                bad += not np.allclose(got, want[c], rtol=1e-5, atol=1e-7)
            conn.close()
            return bad

        with ThreadPoolExecutor(clients) as pool:
            bad = sum(pool.map(client, range(clients)))
        assert bad == 0
        assert metric(s.url, "runtime_core_inference_requests_total", model="cnn") == clients * per
        rows = metric(s.url, "runtime_core_inference_batch_rows_sum", model="cnn")
        runs = metric(s.url, "runtime_core_inference_batch_rows_count", model="cnn")
        assert rows == clients * per
        assert (runs < rows) if batching else (runs == rows)


def _serve(args, env=None):
    return subprocess.Popen([sys.executable, "-m", "runtime_core", "serve", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def _wait_ready(url, proc, limit=60):
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited: {proc.stderr.read()}")
        try:
            if http(url + "/v2/health/ready")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError("the server did not get ready")


def test_cli_serves_and_sigterm_finishes_the_request_in_flight(model_dir, tmp_path):
    import socket

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    proc = _serve([str(model_dir / "slow.onnx"), "--name", "mm", "--port", str(port), "--timeout", "120"])
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc)
        x = np.random.default_rng(2).standard_normal((400, 400)).astype(np.float32) / 20
        result = {}
        t = threading.Thread(target=lambda: result.update(r=http(url + "/v2/models/mm/infer", *binary_request(x))))
        t.start()
        while metric(url, "runtime_core_inference_requests_total", model="mm") < 1:
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        t.join(120)
        status, headers, raw = result["r"]
        assert status == 200
        want = rt.InferenceSession(str(model_dir / "slow.onnx")).run(None, {"x": x})[0]
        np.testing.assert_allclose(binary_outputs(raw, headers)["y"], want, rtol=1e-4, atol=1e-5)
        # uvicorn re-raises the signal once it has shut down gracefully (the conventional exit status)
        assert proc.wait(60) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    logs = [json.loads(ln) for ln in proc.stderr.read().splitlines() if ln.startswith("{")]
    assert any(ln.get("path") == "/v2/models/mm/infer" and ln.get("status") == 200 for ln in logs)
    assert any(ln.get("msg") == "stopped" for ln in logs)


@pytest.mark.parametrize("argv,needle", [
    (["serve"], "give at least one MODEL"),
    (["serve", "missing.onnx"], "missing.onnx"),
    (["serve", "{cnn}", "--name", "a", "--name", "b"], "--name is given 2 time(s) for 1 model(s)"),
    (["serve", "{cnn}", "--name", "a/b"], "may hold only letters"),
    (["serve", "{cnn}", "{cnn}"], "two models are named 'cnn'"),
    (["serve", "--config", "{bad_config}"], "unknown key 'max_batch'"),
    (["serve", "--config", "{tmp}/none.json"], "cannot read it"),
    (["serve", "{tmp}/garbage.onnx"], "InvalidProtobufError"),
    (["serve", "{tmp}"], "is a directory"),
    (["serve", "{cnn}", "--port", "{busy}"], "cannot listen on 127.0.0.1:"),
    (["serve", "{cnn}", "--host", "no-such-host.invalid"], "--host 'no-such-host.invalid'"),
])
def test_cli_usage_errors(model_dir, tmp_path, capsys, argv, needle):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"models": [{"path": str(model_dir / "cnn.onnx"), "max_batch": 4}]}))
    (tmp_path / "garbage.onnx").write_bytes(b"\x00not a model" * 10)
    import socket

    with socket.socket() as busy:  # a port something listens on
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        argv = [a.format(cnn=model_dir / "cnn.onnx", bad_config=bad, tmp=tmp_path, busy=busy.getsockname()[1])
                for a in argv]
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and needle in err


def test_config_file(model_dir, tmp_path):
    from runtime_core.serving.cli import build_config
    from runtime_core.cli import build_parser

    conf = tmp_path / "serve.json"
    conf.write_text(json.dumps({"port": 9123, "max_request_bytes": 1000, "models": [
        {"path": os.path.relpath(model_dir / "cnn.onnx", tmp_path), "name": "c", "max_batch_size": 4,
         "providers": ["cpu"]}]}))
    args = build_parser().parse_args(["serve", str(model_dir / "mixed.onnx"), "--config", str(conf),
                                      "--max-concurrency", "3"])
    cfg = build_config(args)
    assert (cfg.port, cfg.max_request_bytes) == (9123, 1000)
    assert [(m.name, m.max_batch_size, m.max_concurrency, m.providers) for m in cfg.models] == [
        ("c", 4, 3, ["cpu"]), ("mixed", 0, 3, None)]
    with BackgroundServer(cfg) as s:
        assert http_json(s.url + "/v2/models/c/config")[1]["providers"] == ["CPUExecutionProvider"]


def test_batching_needs_a_real_batch_dimension(model_dir, tmp_path, caplog):
    """x[n, n] is not batch-major: batching stays off. A model that only looks batch-major (its
    output loses the rows) gets each request run alone after its batch fails, with a warning."""
    slow = ServedModel(ModelConfig(str(model_dir / "slow.onnx"), max_batch_size=8))
    assert not slow.batching and slow.config()["max_batch_size"] == 0
    rows = ServedModel(ModelConfig(models.row_sum(tmp_path / "rowsum.onnx"), max_batch_size=8,
                                   max_queue_delay_ms=300))
    assert rows.batching
    xs = [np.full((1, 4), i, np.float32) for i in range(6)]
    with caplog.at_level(logging.WARNING, logger="runtime_core.serving"), \
            BackgroundServer(ServerConfig(models=[]), models=[rows]) as s, ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda x: http(s.url + "/v2/models/rowsum/infer", *binary_request(x)), xs))
    for x, (status, headers, raw) in zip(xs, answers):
        assert status == 200
        np.testing.assert_array_equal(binary_outputs(raw, headers)["y"], x)  # its own row, not the batch's sum
    assert any("running each alone" in r.getMessage() for r in caplog.records)
