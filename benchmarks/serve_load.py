"""Load on ``runtime-core serve``: N concurrent clients x M requests to batchable CNNs, with and
without dynamic batching; reports p50/p99 latency, throughput, CPU per request of the server and
of the clients, and that nothing was lost.

The server runs in its own process (``python -m runtime_core serve``), as users run it; each
client is a thread with its own keep-alive HTTP connection sending a pre-encoded request with
binary tensors. Every answer is checked against an in-process session (after the timed part).
Needs ``runtime-core[serve]`` (and ``py-spy`` for ``--py-spy``).

Run: python benchmarks/serve_load.py [--model small|fchead|all] [--clients 16] [--requests 500]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
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


def _conv_blocks(rng, widths):
    """(Conv 3x3, Relu, MaxPool 2) per width from x's 3 channels: initializers, nodes, the last
    output's name and its channels."""
    inits, nodes, prev, cin = [], [], "x", 3
    for i, cout in enumerate(widths):
        inits += [numpy_helper.from_array((rng.standard_normal((cout, cin, 3, 3)) * (2 / (9 * cin)) ** 0.5)
                                          .astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(np.zeros(cout, np.float32), f"b{i}")]
        nodes += [helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"]),
                  helper.make_node("MaxPool", [f"r{i}"], [f"p{i}"], kernel_shape=[2, 2], strides=[2, 2])]
        prev, cin = f"p{i}", cout
    return inits, nodes, prev, cin


def build_cnn(path: Path, size: int = 32, ch: int = 16, classes: int = 10) -> None:
    """x[N,3,size,size] -> 3 x (Conv 3x3, Relu, MaxPool 2) -> GlobalAveragePool -> Gemm -> Softmax."""
    rng = np.random.default_rng(0)
    inits, nodes, prev, cin = _conv_blocks(rng, (ch, ch * 2, ch * 4))
    inits += [numpy_helper.from_array((rng.standard_normal((classes, cin)) * 0.1).astype(np.float32), "wf"),
              numpy_helper.from_array(np.zeros(classes, np.float32), "bf")]
    nodes += [helper.make_node("GlobalAveragePool", [prev], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
              helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1),
              helper.make_node("Softmax", ["logits"], ["probs"], axis=1)]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
                          [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", classes])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def build_fchead(path: Path, size: int = 32, classes: int = 10) -> None:
    """A LeNet/VGG-style classifier: x[N,3,size,size] -> 2 x (Conv 3x3, Relu, MaxPool 2) of 16/32
    channels -> Flatten (32 * (size/4)**2) -> Gemm to 1024 (8 MiB of weights at size 32), Relu -> Gemm
    -> Softmax. Its head is a matrix-vector product at batch 1 and a GEMM when batched."""
    rng = np.random.default_rng(0)
    inits, nodes, prev, cin = _conv_blocks(rng, (16, 32))
    flat, hidden = cin * (size // 4) ** 2, 1024
    inits += [numpy_helper.from_array((rng.standard_normal((hidden, flat)) * (2 / flat) ** 0.5).astype(np.float32),
                                      "wf1"),
              numpy_helper.from_array(np.zeros(hidden, np.float32), "bf1"),
              numpy_helper.from_array((rng.standard_normal((classes, hidden)) * 0.05).astype(np.float32), "wf2"),
              numpy_helper.from_array(np.zeros(classes, np.float32), "bf2")]
    nodes += [helper.make_node("Flatten", [prev], ["f"]),
              helper.make_node("Gemm", ["f", "wf1", "bf1"], ["h"], transB=1),
              helper.make_node("Relu", ["h"], ["hr"]),
              helper.make_node("Gemm", ["hr", "wf2", "bf2"], ["logits"], transB=1),
              helper.make_node("Softmax", ["logits"], ["probs"], axis=1)]
    g = helper.make_graph(nodes, "fchead",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
                          [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", classes])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


MODELS = {"small": build_cnn, "fchead": build_fchead}


def request(x: np.ndarray) -> tuple[bytes, dict]:
    head = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "parameters": {"binary_data_output": True}}).encode()
    return head + x.tobytes(), {"Inference-Header-Content-Length": str(len(head)),
                                "Content-Type": "application/octet-stream"}


class RawClient:
    """A keep-alive HTTP/1.1 client that sends one pre-encoded request and reads the answer with
    the least parsing (status, Content-Length, the response's binary-header length): the 16 client
    threads share the machine with the server, so each byte of client work is taken from it."""

    def __init__(self, port: int, path: str, body: bytes, headers: dict):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.wire = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{head}"
                     f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        self.buf = b""

    def call(self) -> tuple[int, int | None, bytes]:
        """(status, Inference-Header-Content-Length or None, body) of one request."""
        self.sock.sendall(self.wire)
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            self._more()
        head, self.buf = self.buf[:end].decode("latin-1"), self.buf[end + 4:]
        lines = head.split("\r\n")
        status, fields = int(lines[0].split(" ", 2)[1]), {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            fields[k.strip().lower()] = v.strip()
        n = int(fields["content-length"])
        while len(self.buf) < n:
            self._more()
        body, self.buf = self.buf[:n], self.buf[n:]
        hl = fields.get("inference-header-content-length")
        return status, int(hl) if hl is not None else None, body

    def _more(self) -> None:
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buf += chunk

    def close(self) -> None:
        self.sock.close()


class HttpClient:
    """The same through the standard library's ``http.client`` (the load generator before the raw one)."""

    def __init__(self, port: int, path: str, body: bytes, headers: dict):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.path, self.body, self.headers = path, body, headers

    def call(self) -> tuple[int, int | None, bytes]:
        self.conn.request("POST", self.path, body=self.body, headers=self.headers)
        r = self.conn.getresponse()
        raw = r.read()
        hl = r.getheader("Inference-Header-Content-Length")
        return r.status, int(hl) if hl is not None else None, raw

    def close(self) -> None:
        self.conn.close()


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc; 0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def run_load(model: Path, extra: list[str], clients: int, per: int, xs, want, client_kind: str = "raw",
             py_spy: Path | None = None) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "runtime_core", "serve", str(model), "--port", str(port), "--name", "cnn",
           "--no-access-log", "--log-level", "warning", *extra]
    if py_spy is not None:  # sample the server (Python and native frames) while it serves
        exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        cmd = [exe, "record", "--format", "raw", "--rate", "100", "--native", "-o", str(py_spy), "--", *cmd]
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    make = RawClient if client_kind == "raw" else HttpClient
    try:
        for _ in range(600):
            try:
                if urllib.request.urlopen(url + "/v2/health/ready").status == 200:
                    break
            except OSError:
                time.sleep(0.1)
        lat: list[list[float]] = [[] for _ in range(clients)]
        answers: list[list[tuple]] = [[] for _ in range(clients)]
        start = threading.Barrier(clients + 1)
        server_pid = proc.pid if py_spy is None else _child_of(proc.pid)

        def client(c: int) -> None:
            try:
                body, headers = request(xs[c])
                cl = make(port, "/v2/models/cnn/infer", body, headers)
                for _ in range(5):  # warm-up, not timed
                    cl.call()
            except Exception:
                start.abort()  # the others (and the timer) stop waiting; the run reports its failure
                raise
            start.wait()
            try:
                for _ in range(per):
                    t0 = time.perf_counter()
                    answer = cl.call()
                    lat[c].append(time.perf_counter() - t0)
                    answers[c].append(answer)  # checked after the timed part: the check is client CPU too
            finally:
                cl.close()

        threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
        for t in threads:
            t.start()
        try:
            start.wait()
        except threading.BrokenBarrierError:
            raise SystemExit(f"the clients could not reach the server at {url} ({' '.join(cmd)})") from None
        t0, c0, s0 = time.perf_counter(), time.process_time(), _cpu_s(server_pid)
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        client_cpu, server_cpu = time.process_time() - c0, _cpu_s(server_pid) - s0
        metrics = urllib.request.urlopen(url + "/metrics").read().decode()
    finally:
        proc.send_signal(signal.SIGTERM if py_spy is None else signal.SIGINT)
        proc.wait(120)
    bad = 0
    for c in range(clients):
        for status, hlen, raw in answers[c]:
            if status != 200 or hlen is None:
                bad += 1
                continue
            got = np.frombuffer(raw[hlen:], np.float32).reshape(want[c].shape)
            bad += not np.allclose(got, want[c], rtol=1e-4, atol=1e-6)
    rows = runs = 0.0
    for line in metrics.splitlines():
        if line.startswith("runtime_core_inference_batch_rows_sum"):
            rows = float(line.split()[-1])
        elif line.startswith("runtime_core_inference_batch_rows_count"):
            runs = float(line.split()[-1])
    all_lat = np.array([v for c in lat for v in c]) * 1e3
    done = len(all_lat)
    return {"requests": done, "failed_or_wrong": bad, "lost": clients * per - done,
            "p50_ms": float(np.percentile(all_lat, 50)), "p99_ms": float(np.percentile(all_lat, 99)),
            "throughput_rps": done / wall, "mean_batch_rows": rows / runs if runs else 0.0,
            "client_cpu_s": client_cpu, "server_cpu_s": server_cpu, "wall_s": wall,
            "client_us_per_request": client_cpu / max(done, 1) * 1e6,
            "server_us_per_request": server_cpu / max(done, 1) * 1e6}


def _child_of(pid: int) -> int:
    """The server under ``py-spy record`` (its only child), for its CPU time."""
    for _ in range(100):
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                kids = f.read().split()
            if kids:
                return int(kids[0])
        except OSError:
            break
        time.sleep(0.05)
    return pid


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=[*MODELS, "all"], default="all",
                    help="small: 3 x conv3x3 (16-64 channels), GAP, Gemm; fchead: 2 convs and an 8 MiB "
                         "fully connected head (default: all, one after the other)")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=500, help="per client")
    ap.add_argument("--max-batch-size", type=int, default=16)
    ap.add_argument("--max-queue-delay-ms", type=float, default=2.0)
    ap.add_argument("--max-concurrency", type=int, default=1, help="runs at a time (both configurations)")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads of the server's session")
    ap.add_argument("--client", choices=["raw", "http.client"], default="raw",
                    help="raw: pre-encoded request bytes on a socket (cheap); http.client: the standard library")
    ap.add_argument("--py-spy", metavar="DIR", type=Path,
                    help="record the server with py-spy (collapsed stacks, one file per model and configuration)")
    args = ap.parse_args()
    ok = True
    for name in (MODELS if args.model == "all" else [args.model]):
        ok &= run_model(name, args)
    return 0 if ok else 1


def model_alone(sess, batch: int) -> str:
    """The session's own gain per row from batching (in this process; batch 1 and ``batch``
    alternate for 9 rounds, best of each): the bound on what dynamic batching can give."""
    xs = [np.random.default_rng(2).standard_normal((n, 3, 32, 32)).astype(np.float32) for n in (1, batch)]
    best = [float("inf"), float("inf")]
    for x in xs:
        sess.run(None, {"x": x})
    for _ in range(9):
        for i, x in enumerate(xs):
            reps = max(1, batch // len(x))  # the same rows each time
            t0 = time.perf_counter()
            for _ in range(reps):
                sess.run(None, {"x": x})
            best[i] = min(best[i], (time.perf_counter() - t0) / reps * 1e3)
    return f"{best[0]:.2f} ms at batch 1, {best[1]:.2f} ms at batch {batch} ({best[0] * batch / best[1]:.2f}x a row)"


def run_model(name: str, args) -> bool:
    with tempfile.TemporaryDirectory() as d:
        model = Path(d) / f"{name}.onnx"
        MODELS[name](model)
        sess = rt.InferenceSession(str(model))
        rng = np.random.default_rng(1)
        xs = [rng.standard_normal((1, 3, 32, 32)).astype(np.float32) for _ in range(args.clients)]
        want = [sess.run(None, {"x": x})[0] for x in xs]
        alone = model_alone(sess, args.max_batch_size)
        common = ["--max-concurrency", str(args.max_concurrency)]
        common += ["--threads", str(args.threads)] if args.threads else []
        results = {}
        for label, extra in (("no batching", []),
                             ("dynamic batching", ["--max-batch-size", str(args.max_batch_size),
                                                   "--max-queue-delay-ms", str(args.max_queue_delay_ms)])):
            spy = None
            if args.py_spy is not None:
                args.py_spy.mkdir(parents=True, exist_ok=True)
                spy = args.py_spy / f"{name}-{'batching' if 'dynamic' in label else 'none'}.txt"
            r = run_load(model, common + extra, args.clients, args.requests, xs, want, args.client, spy)
            results[label] = r
            share = r["client_cpu_s"] / max(r["client_cpu_s"] + r["server_cpu_s"], 1e-9)
            print(f"{name} {label:17s}: {r['requests']} requests, {r['failed_or_wrong']} failed or wrong, "
                  f"{r['lost']} lost; p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
                  f"{r['throughput_rps']:.0f} req/s, mean batch {r['mean_batch_rows']:.2f} rows; CPU per request: "
                  f"server {r['server_us_per_request']:.0f} us, clients {r['client_us_per_request']:.0f} us "
                  f"({share:.0%} of the two)", flush=True)
        none, batched = results["no batching"], results["dynamic batching"]
        ratio = batched["throughput_rps"] / none["throughput_rps"]
        cpu = [r["server_us_per_request"] + r["client_us_per_request"] for r in (none, batched)]
        print(f"{name}: throughput ratio (batching / none): {ratio:.2f}x; CPU per request (server + clients) "
              f"{cpu[0]:.0f} us / {cpu[1]:.0f} us = {cpu[0] / cpu[1]:.2f}x; model alone {alone}; "
              f"{args.clients} clients x {args.requests} requests; {os.cpu_count()} CPUs; "
              f"load average {os.getloadavg()[0]:.1f}", flush=True)
        return all(r["failed_or_wrong"] == 0 and r["lost"] == 0 for r in results.values())


if __name__ == "__main__":
    sys.exit(main())
