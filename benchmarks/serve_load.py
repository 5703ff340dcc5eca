"""Load on ``runtime-core serve``: N concurrent clients x M requests to a batchable CNN, with and
without dynamic batching; reports p50/p99 latency, throughput, and that nothing was lost.

The server runs in its own process (``python -m runtime_core serve``), as users run it; each
client is a thread with its own keep-alive HTTP connection sending binary tensors. Every answer
is checked against an in-process session. Needs ``runtime-core[serve]``.

Run: python benchmarks/serve_load.py [--clients 16] [--requests 500]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt


def build_cnn(path: Path, size: int = 32, ch: int = 16, classes: int = 10) -> None:
    """x[N,3,size,size] -> 3 x (Conv 3x3, Relu, MaxPool 2) -> GlobalAveragePool -> Gemm -> Softmax."""
    rng = np.random.default_rng(0)
    inits, nodes, prev, cin = [], [], "x", 3
    for i, cout in enumerate((ch, ch * 2, ch * 4)):
        inits += [numpy_helper.from_array((rng.standard_normal((cout, cin, 3, 3)) * (2 / (9 * cin)) ** 0.5)
                                          .astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(np.zeros(cout, np.float32), f"b{i}")]
        nodes += [helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"]),
                  helper.make_node("MaxPool", [f"r{i}"], [f"p{i}"], kernel_shape=[2, 2], strides=[2, 2])]
        prev, cin = f"p{i}", cout
    inits += [numpy_helper.from_array((rng.standard_normal((classes, cin)) * 0.1).astype(np.float32), "wf"),
              numpy_helper.from_array(np.zeros(classes, np.float32), "bf")]
    nodes += [helper.make_node("GlobalAveragePool", [prev], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
              helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1),
              helper.make_node("Softmax", ["logits"], ["probs"], axis=1)]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
                          [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", classes])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def request(x: np.ndarray) -> tuple[bytes, dict]:
    head = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "parameters": {"binary_data_output": True}}).encode()
    return head + x.tobytes(), {"Inference-Header-Content-Length": str(len(head)),
                                "Content-Type": "application/octet-stream"}


def run_load(model: Path, extra: list[str], clients: int, per: int, xs, want) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "runtime_core", "serve", str(model), "--port", str(port),
                             "--no-access-log", "--log-level", "warning", *extra])
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if urllib.request.urlopen(url + "/v2/health/ready").status == 200:
                    break
            except OSError:
                time.sleep(0.1)
        lat: list[list[float]] = [[] for _ in range(clients)]
        bad = [0] * clients
        start = threading.Barrier(clients + 1)

        def client(c: int) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            body, headers = request(xs[c])
            for _ in range(5):  # warm-up, not timed
                conn.request("POST", "/v2/models/cnn/infer", body=body, headers=headers)
                conn.getresponse().read()
            start.wait()
            for _ in range(per):
                t0 = time.perf_counter()
                conn.request("POST", "/v2/models/cnn/infer", body=body, headers=headers)
                r = conn.getresponse()
                raw = r.read()
                lat[c].append(time.perf_counter() - t0)
                if r.status != 200:
                    bad[c] += 1
                    continue
                hlen = int(r.getheader("Inference-Header-Content-Length"))
                got = np.frombuffer(raw[hlen:], np.float32).reshape(want[c].shape)
                bad[c] += not np.allclose(got, want[c], rtol=1e-4, atol=1e-6)
            conn.close()

        threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
        for t in threads:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        metrics = urllib.request.urlopen(url + "/metrics").read().decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    rows = runs = 0.0
    for line in metrics.splitlines():
        if line.startswith("runtime_core_inference_batch_rows_sum"):
            rows = float(line.split()[-1])
        elif line.startswith("runtime_core_inference_batch_rows_count"):
            runs = float(line.split()[-1])
    all_lat = np.array([v for c in lat for v in c]) * 1e3
    done = len(all_lat)
    return {"requests": done, "failed_or_wrong": sum(bad), "lost": clients * per - done,
            "p50_ms": float(np.percentile(all_lat, 50)), "p99_ms": float(np.percentile(all_lat, 99)),
            "throughput_rps": done / wall, "mean_batch_rows": rows / runs if runs else 0.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=500, help="per client")
    ap.add_argument("--max-batch-size", type=int, default=16)
    ap.add_argument("--max-queue-delay-ms", type=float, default=2.0)
    ap.add_argument("--max-concurrency", type=int, default=1, help="runs at a time (both configurations)")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads of the server's session")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        model = Path(d) / "cnn.onnx"
        build_cnn(model)
        sess = rt.InferenceSession(str(model))
        rng = np.random.default_rng(1)
        xs = [rng.standard_normal((1, 3, 32, 32)).astype(np.float32) for _ in range(args.clients)]
        want = [sess.run(None, {"x": x})[0] for x in xs]
        common = ["--max-concurrency", str(args.max_concurrency)] + (["--threads", str(args.threads)] if args.threads else [])
        results = {}
        for label, extra in (("no batching", []),
                             ("dynamic batching", ["--max-batch-size", str(args.max_batch_size),
                                                   "--max-queue-delay-ms", str(args.max_queue_delay_ms)])):
            r = run_load(model, common + extra, args.clients, args.requests, xs, want)
            results[label] = r
            print(f"{label:17s}: {r['requests']} requests, {r['failed_or_wrong']} failed or wrong, {r['lost']} lost; "
                  f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, {r['throughput_rps']:.0f} req/s, "
                  f"mean batch {r['mean_batch_rows']:.2f} rows", flush=True)
        ratio = results["dynamic batching"]["throughput_rps"] / results["no batching"]["throughput_rps"]
        print(f"throughput ratio (batching / none): {ratio:.2f}x; {args.clients} clients x {args.requests} requests; "
              f"{os.cpu_count()} CPUs")
        return 0 if all(r["failed_or_wrong"] == 0 and r["lost"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
