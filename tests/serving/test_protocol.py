"""The Open Inference Protocol v2 through Triton's own HTTP client: health, metadata, inference with
JSON and binary tensors, requested outputs; results equal an in-process session's."""

from __future__ import annotations

import numpy as np
import pytest
from serve_http import http_json

import runtime_core as rt
from runtime_core.serving import BackgroundServer, ModelConfig, ServerConfig

httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is a test dependency")


@pytest.fixture(scope="module")
def server(model_dir):
    cfg = ServerConfig(models=[
        ModelConfig(str(model_dir / "cnn.onnx"), max_batch_size=8, max_queue_delay_ms=5, max_concurrency=2),
        ModelConfig(str(model_dir / "cnn.onnx"), name="cnn-single"),
        ModelConfig(str(model_dir / "mixed.onnx")),
        ModelConfig(str(model_dir / "strings.onnx")),
    ])
    with BackgroundServer(cfg) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    c = httpclient.InferenceServerClient(server.url.removeprefix("http://"), concurrency=4)
    yield c
    c.close()


@pytest.fixture(scope="module")
def cnn_session(model_dir):
    return rt.InferenceSession(str(model_dir / "cnn.onnx"))


def test_health_and_server_metadata(client, server):
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "runtime-core" and meta["version"] == rt.__version__
    assert "binary_tensor_data" in meta["extensions"]
    assert http_json(server.url + "/v2/health/live") == (200, {"live": True})
    assert client.is_model_ready("cnn") and client.is_model_ready("cnn", "1")
    assert not client.is_model_ready("nope")


def test_model_metadata_matches_the_session(client, cnn_session, server):
    meta = client.get_model_metadata("cnn")
    assert meta["name"] == "cnn" and meta["versions"] == ["1"]
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        (i.name, "FP32", [-1 if isinstance(d, str) else d for d in i.shape]) for i in cnn_session.get_inputs()]
    assert [t["name"] for t in meta["outputs"]] == [o.name for o in cnn_session.get_outputs()]
    assert client.get_model_metadata("cnn", "1") == meta
    cfg = client.get_model_config("cnn")
    assert cfg["max_batch_size"] == 8 and cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 5000
    assert client.get_model_config("cnn-single")["max_batch_size"] == 0
    # the routes with /versions/1 and without answer the same
    assert http_json(server.url + "/v2/models/mixed/versions/1")[1] == http_json(server.url + "/v2/models/mixed")[1]


@pytest.mark.parametrize("model", ["cnn", "cnn-single"])
@pytest.mark.parametrize("binary", [False, True])
def test_infer_equals_in_process_session(client, cnn_session, model, binary):
    x = np.random.default_rng(7).standard_normal((3, 3, 16, 16)).astype(np.float32)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    res = client.infer(model, [inp], request_id="r-1",
                       outputs=[httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("probs", "logits")])
    want = cnn_session.run(None, {"x": x})
    assert res.get_response()["id"] == "r-1" and res.get_response()["model_name"] == model
    for name, w in zip(("probs", "logits"), want):
        got = res.as_numpy(name)
        assert got.dtype == np.float32 and got.shape == w.shape
        np.testing.assert_array_equal(got, w)  # float32 survives JSON exactly; same kernels, same batch


def test_requested_outputs_only(client, cnn_session):
    x = np.random.default_rng(8).standard_normal((1, 3, 16, 16)).astype(np.float32)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    res = client.infer("cnn", [inp], outputs=[httpclient.InferRequestedOutput("logits")])
    assert [o["name"] for o in res.get_response()["outputs"]] == ["logits"]
    np.testing.assert_array_equal(res.as_numpy("logits"), cnn_session.run(["logits"], {"x": x})[0])
    assert res.as_numpy("probs") is None


@pytest.mark.parametrize("binary", [False, True])
def test_int_and_bool_tensors(client, binary):
    a = np.array([3, -4, 5, 2**40, 0], dtype=np.int64)
    s = np.array([True, False, True, False, True])
    ia, is_ = httpclient.InferInput("a", [5], "INT64"), httpclient.InferInput("s", [5], "BOOL")
    ia.set_data_from_numpy(a, binary_data=binary)
    is_.set_data_from_numpy(s, binary_data=binary)
    res = client.infer("mixed", [ia, is_], outputs=[httpclient.InferRequestedOutput("y", binary_data=binary),
                                                    httpclient.InferRequestedOutput("yf", binary_data=binary)])
    want = np.where(s, a + a, -a)
    np.testing.assert_array_equal(res.as_numpy("y"), want)
    assert res.as_numpy("y").dtype == np.int64 and res.as_numpy("yf").dtype == np.float64
    np.testing.assert_array_equal(res.as_numpy("yf"), want.astype(np.float64))


@pytest.mark.parametrize("binary", [False, True])
def test_bytes_tensors(client, binary):
    s = np.array(["héllo", "", "a b c"], dtype=object)
    inp = httpclient.InferInput("s", [3], "BYTES")
    inp.set_data_from_numpy(s, binary_data=binary)
    res = client.infer("strings", [inp], outputs=[httpclient.InferRequestedOutput("t", binary_data=binary)])
    got = [v.decode() if isinstance(v, bytes) else v for v in res.as_numpy("t").tolist()]
    assert got == list(s)


def test_async_requests_are_batched_and_answer_each_caller(client, cnn_session, server):
    """Concurrent single-row requests to the batching model run as fewer, bigger runs; each
    caller still gets its own row."""
    xs = [np.random.default_rng(100 + i).standard_normal((1, 3, 16, 16)).astype(np.float32) for i in range(12)]
    pending = []
    for x in xs:
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        pending.append(client.async_infer("cnn", [inp]))
    for x, p in zip(xs, pending):
        got = p.get_result().as_numpy("probs")
        np.testing.assert_allclose(got, cnn_session.run(["probs"], {"x": x})[0], rtol=1e-5, atol=1e-7)
    from prometheus_client.parser import text_string_to_metric_families

    status, _ = http_json(server.url + "/v2/health/ready")
    assert status == 200
    import urllib.request

    text = urllib.request.urlopen(server.url + "/metrics").read().decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    rows = {s.name: s.value for s in fams["runtime_core_inference_batch_rows"].samples
            if s.labels.get("model") == "cnn" and s.name.endswith(("_count", "_sum"))}
    assert rows["runtime_core_inference_batch_rows_sum"] >= 12
    # at least one run joined two or more requests (runs < rows)
    assert rows["runtime_core_inference_batch_rows_count"] < rows["runtime_core_inference_batch_rows_sum"]
