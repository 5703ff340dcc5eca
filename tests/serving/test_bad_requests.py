"""Every bad request gets a 4xx with ``{"error": message}`` (the session's own typed error message
where the session judges it), and the server keeps serving: good requests before, between and
alongside bad ones are answered correctly."""

from __future__ import annotations

import gzip
import http.client as httplib
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from serve_http import http, http_json

import runtime_core as rt
from runtime_core.errors import InputError, OutputNameError
from runtime_core.serving import BackgroundServer, ModelConfig, ServerConfig

LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def server(model_dir):
    cfg = ServerConfig(models=[
        ModelConfig(str(model_dir / "cnn.onnx"), max_batch_size=8, max_queue_delay_ms=2, max_concurrency=2),
        ModelConfig(str(model_dir / "cnn.onnx"), name="cnn-single"),
        ModelConfig(str(model_dir / "mixed.onnx")),
    ], max_request_bytes=LIMIT)
    with BackgroundServer(cfg) as s:
        yield s


@pytest.fixture(scope="module")
def sess(model_dir):
    return {"cnn": rt.InferenceSession(str(model_dir / "cnn.onnx")),
            "mixed": rt.InferenceSession(str(model_dir / "mixed.onnx"))}


def tensor(name, arr, datatype=None):
    dt = datatype or {"float32": "FP32", "float64": "FP64", "int64": "INT64", "bool": "BOOL"}[str(arr.dtype)]
    return {"name": name, "shape": list(arr.shape), "datatype": dt, "data": arr.reshape(-1).tolist()}


X = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)


def good(server, sess, model="cnn"):
    """A correct request still gets the right answer."""
    status, body = http_json(f"{server.url}/v2/models/{model}/infer", {"inputs": [tensor("x", X)]})
    assert status == 200, body
    out = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in body["outputs"]}
    np.testing.assert_allclose(out["probs"], sess["cnn"].run(["probs"], {"x": X})[0], rtol=1e-6)


def session_error(sess, names, feeds) -> str:
    with pytest.raises((InputError, OutputNameError)) as info:
        sess.run(names, feeds)
    return str(info.value)


@pytest.mark.parametrize("model", ["cnn", "cnn-single"])
@pytest.mark.parametrize("case", ["name", "dtype", "rank", "dim", "output"])
def test_bad_feeds_get_the_sessions_message(server, sess, model, case):
    feeds, names = {"x": X}, None
    if case == "name":
        feeds = {"xx": X}
    elif case == "dtype":
        feeds = {"x": X.astype(np.float64)}
    elif case == "rank":
        feeds = {"x": X[0]}
    elif case == "dim":
        feeds = {"x": np.zeros((1, 3, 8, 16), np.float32)}
    elif case == "output":
        names = ["nope"]
    want = session_error(sess["cnn"], names, feeds)
    req = {"inputs": [tensor(k, v) for k, v in feeds.items()]}
    if names:
        req["outputs"] = [{"name": n} for n in names]
    status, body = http_json(f"{server.url}/v2/models/{model}/infer", req)
    assert (status, body) == (400, {"error": want})
    good(server, sess, model)


def test_missing_input(server, sess):
    a = np.arange(4, dtype=np.int64)
    want = session_error(sess["mixed"], None, {"a": a})
    assert http_json(f"{server.url}/v2/models/mixed/infer", {"inputs": [tensor("a", a)]}) == (400, {"error": want})
    good(server, sess)


@pytest.mark.parametrize("url,needle", [
    ("/v2/models/nope/infer", "no model named 'nope'"),
    ("/v2/models/cnn/versions/2/infer", "has no version '2'"),
])
def test_unknown_model_or_version_is_404(server, sess, url, needle):
    status, body = http_json(server.url + url, {"inputs": [tensor("x", X)]})
    assert status == 404 and needle in body["error"] and "cnn" in body["error"]
    status, body = http_json(server.url + url.removesuffix("/infer"))
    assert status == 404 and needle in body["error"]
    good(server, sess)


def _post(server, body: bytes, headers=None, model="cnn"):
    status, _, raw = http(f"{server.url}/v2/models/{model}/infer", body,
                          {"Content-Type": "application/json", **(headers or {})})
    return status, json.loads(raw)


BIN = X.tobytes()
BIN_HEADER = json.dumps({"inputs": [{"name": "x", "shape": [1, 3, 16, 16], "datatype": "FP32",
                                     "parameters": {"binary_data_size": len(BIN)}}]}).encode()


@pytest.mark.parametrize("case,body,headers,needle", [
    ("malformed JSON", b'{"inputs": [', None, "not valid JSON"),
    ("not an object", b"[1, 2]", None, "must be a JSON object"),
    ("no inputs", b'{"outputs": []}', None, "needs 'inputs'"),
    ("unknown datatype", json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP8", "data": [1]}]}).encode(),
     None, "unknown datatype 'FP8'"),
    ("count mismatch", json.dumps({"inputs": [{"name": "x", "shape": [1, 3, 16, 16], "datatype": "FP32",
                                               "data": [1.0, 2.0]}]}).encode(), None, "needs 768 element(s)"),
    ("bad shape", json.dumps({"inputs": [{"name": "x", "shape": [1, -3], "datatype": "FP32", "data": []}]}).encode(),
     None, "non-negative integers"),
    ("ragged data", json.dumps({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32",
                                            "data": [[1.0, 2.0], [3.0]]}]}).encode(), None, "not a regular array"),
    ("strings as FP32", json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32",
                                                "data": ["a"]}]}).encode(), None, "needs numbers"),
    ("truncated binary", BIN_HEADER + BIN[:-10], {"Inference-Header-Content-Length": str(len(BIN_HEADER))},
     "only 3062 byte(s) of binary data are left"),
    ("header length past the body", BIN_HEADER, {"Inference-Header-Content-Length": str(len(BIN_HEADER) + 5)},
     "but the body has"),
    ("header length not a number", BIN_HEADER, {"Inference-Header-Content-Length": "ten"}, "must be an integer"),
    ("unclaimed binary bytes", BIN_HEADER + BIN + b"xx", {"Inference-Header-Content-Length": str(len(BIN_HEADER))},
     "2 byte(s) of binary data follow"),
    ("bad gzip", b"not gzip", {"Content-Encoding": "gzip"}, "not valid gzip"),
    ("unknown encoding", b"{}", {"Content-Encoding": "br"}, "is not supported"),
])
def test_malformed_requests_are_400(server, sess, case, body, headers, needle):
    status, reply = _post(server, body, headers)
    assert status == 400 and needle in reply["error"], (case, reply)
    good(server, sess)


def test_int_data_must_be_integers(server, sess):
    req = {"inputs": [{"name": "a", "shape": [2], "datatype": "INT64", "data": [1.5, 2]},
                      tensor("s", np.array([True, False]))]}
    status, body = http_json(f"{server.url}/v2/models/mixed/infer", req)
    assert status == 400 and "needs integers" in body["error"]


def test_binary_and_gzip_requests_work(server, sess):
    status, reply = _post(server, BIN_HEADER + BIN, {"Inference-Header-Content-Length": str(len(BIN_HEADER))})
    assert status == 200 and len(reply["outputs"]) == 2
    status, reply = _post(server, gzip.compress(json.dumps({"inputs": [tensor("x", X)]}).encode()),
                          {"Content-Encoding": "gzip"})
    assert status == 200


def test_oversized_bodies_are_413(server, sess):
    big = json.dumps({"inputs": [tensor("x", np.zeros((1, 3, 96, 96), np.float32))]}).encode()
    assert len(big) > LIMIT
    status, reply = _post(server, big)
    assert status == 413 and f"at most {LIMIT}" in reply["error"]
    # no Content-Length: the body is counted as it streams in
    host, port = server.url.removeprefix("http://").split(":")
    conn = httplib.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/v2/models/cnn/infer", body=iter([big[i:i + 8192] for i in range(0, len(big), 8192)]),
                 headers={"Content-Type": "application/json"}, encode_chunked=True)
    r = conn.getresponse()
    assert r.status == 413 and "passed" in json.loads(r.read())["error"]
    conn.close()
    # gzip that inflates past the limit (a small body on the wire)
    status, reply = _post(server, gzip.compress(big), {"Content-Encoding": "gzip"})
    assert status == 413 and "inflates past" in reply["error"]
    good(server, sess)


def test_wrong_method_and_unknown_route(server):
    status, _, raw = http(server.url + "/v2/models/cnn/infer")
    assert status == 405 and "error" in json.loads(raw)
    status, _, raw = http(server.url + "/v3/nothing")
    assert status == 404 and "error" in json.loads(raw)


def test_bad_requests_among_good_ones_lose_nothing(server, sess):
    """Good and bad requests from 8 threads at once to the batching model: every good one gets its
    own right answer, every bad one its 400."""
    rng = np.random.default_rng(11)
    xs = [rng.standard_normal((1, 3, 16, 16)).astype(np.float32) for _ in range(24)]

    def one(i):
        if i % 3 == 2:  # a wrong shape: refused before it can join a batch
            return http_json(f"{server.url}/v2/models/cnn/infer",
                             {"inputs": [tensor("x", np.zeros((1, 3, 8, 8), np.float32))]})
        return http_json(f"{server.url}/v2/models/cnn/infer", {"inputs": [tensor("x", xs[i])]})

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(24)))
    for i, (status, body) in enumerate(results):
        if i % 3 == 2:
            assert status == 400 and "x" in body["error"]
        else:
            assert status == 200, body
            got = np.array(body["outputs"][0]["data"], np.float32).reshape(1, 10)
            np.testing.assert_allclose(got, sess["cnn"].run(["probs"], {"x": xs[i]})[0], rtol=1e-5, atol=1e-7)
