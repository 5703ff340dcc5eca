"""NaN and infinities in JSON tensors: responses stay strict JSON (the strings "NaN", "Infinity",
"-Infinity" in ``data``), requests may send those strings or Python's bare tokens; Triton's client
reads the values back; binary tensors carry them as they are."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto
from serve_http import http

import runtime_core as rt
from runtime_core.serving import BackgroundServer, ModelConfig, ServerConfig

import serve_models as models

httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is a test dependency")

X = np.array([[1.0, 0.0, -1.0, np.inf], [-np.inf, np.nan, 2.5, -0.0]], np.float32)


def _strict(raw: bytes):
    def refuse(token):
        raise AssertionError(f"the response is not strict JSON: bare {token}")

    return json.loads(raw, parse_constant=refuse)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("nonfinite")
    return {"f32": models.log_scale(d / "f32.onnx"), "f16": models.log_scale(d / "f16.onnx", TensorProto.FLOAT16),
            "f64": models.log_scale(d / "f64.onnx", TensorProto.DOUBLE)}


@pytest.fixture(scope="module")
def server(paths):
    cfg = ServerConfig(models=[ModelConfig(p, name=n) for n, p in paths.items()]
                       + [ModelConfig(paths["f32"], name="batched", max_batch_size=4, max_queue_delay_ms=1)])
    with BackgroundServer(cfg) as s:
        yield s


def _want(path, x):
    return rt.InferenceSession(path).run(None, {"x": x})


def _decode(values) -> np.ndarray:
    return np.array([{"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}.get(v, v) if isinstance(v, str)
                     else v for v in values], np.float64)


@pytest.mark.parametrize("model,dt,datatype", [("f32", np.float32, "FP32"), ("f16", np.float16, "FP16"),
                                               ("f64", np.float64, "FP64"), ("batched", np.float32, "FP32")])
def test_raw_http_strict_json_both_ways(server, paths, model, dt, datatype):
    x = X.astype(dt)
    data = [("NaN" if np.isnan(v) else "Infinity" if v == np.inf else "-Infinity" if v == -np.inf else float(v))
            for v in x.reshape(-1).tolist()]
    body = json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": [2, 4], "data": data}]},
                      allow_nan=False).encode()
    status, headers, raw = http(f"{server.url}/v2/models/{model}/infer", body, {"Content-Type": "application/json"})
    assert status == 200, raw
    out = {o["name"]: o for o in _strict(raw)["outputs"]}
    want = _want(paths["f32" if model == "batched" else model], x)
    for name, w in zip(("y", "z"), want):
        assert out[name]["datatype"] == datatype and out[name]["shape"] == [2, 4]
        assert any(isinstance(v, str) for v in out[name]["data"])  # the model makes NaN and infinities
        np.testing.assert_array_equal(_decode(out[name]["data"]), w.reshape(-1).astype(np.float64))
    # Python's own json (bare NaN / Infinity tokens) is read the same
    loose = json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": [2, 4],
                                    "data": x.astype(np.float64).reshape(-1).tolist()}]}).encode()
    assert b"NaN" in loose
    status, _, raw2 = http(f"{server.url}/v2/models/{model}/infer", loose, {"Content-Type": "application/json"})
    assert status == 200 and _strict(raw2)["outputs"] == _strict(raw)["outputs"]


@pytest.mark.parametrize("bad", ["nan", "inf", "1.5", "", "Infinity!"])
def test_other_strings_are_refused(server, bad):
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                                   "data": [1.0, bad, 2.0, 3.0]}]}).encode()
    status, _, raw = http(f"{server.url}/v2/models/f32/infer", body, {"Content-Type": "application/json"})
    assert status == 400
    msg = _strict(raw)["error"]
    assert "'x'" in msg and '"NaN", "Infinity", "-Infinity"' in msg
    # integers take no such strings
    body = json.dumps({"inputs": [{"name": "x", "datatype": "INT32", "shape": [1, 2], "data": [1, "NaN"]}]}).encode()
    status, _, raw = http(f"{server.url}/v2/models/f32/infer", body, {"Content-Type": "application/json"})
    assert status == 400 and "INT32" in _strict(raw)["error"]


@pytest.mark.parametrize("binary", [False, True])
def test_tritonclient_reads_the_values(server, paths, binary):
    c = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    try:
        inp = httpclient.InferInput("x", [2, 4], "FP32")
        inp.set_data_from_numpy(X, binary_data=binary)  # JSON: the client writes bare NaN tokens
        outs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("y", "z")]
        res = c.infer("f32", [inp], outputs=outs)
        want = _want(paths["f32"], X)
        for name, w in zip(("y", "z"), want):
            got = res.as_numpy(name)
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, w)
            assert np.isnan(got).any() and np.isinf(got).any()
    finally:
        c.close()
