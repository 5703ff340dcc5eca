"""Concurrent runs on one session and the kernel pool they share: many threads calling ``run``
get what a run alone gets and never deadlock; a run finishes when its pool workers are
starved of cores; a stop flag ends one long compiled kernel part-way and the session works
afterwards. No timing is asserted (the machine is shared)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt
from runtime_core.errors import RunTerminatedError
from runtime_provider_cpu.fast.policy import NATIVE
from runtime_provider_cpu.fast.sgemm import sgemm_ready

JOIN_S = 300  # a thread still alive after this is a deadlock

needs_native = pytest.mark.skipif(NATIVE is None, reason="the compiled extension is not built here")


def _encoder_block(d=128, ff=512, heads=2):
    """An attention block as exporters write it: projections by constant weights (the Linear or
    pooled-sgemm path), per-head scores as a MatMul of two activations, Softmax, the output
    projection, a residual and a ReLU feed-forward; tokens a symbolic dimension."""
    rng = np.random.default_rng(1)

    def w(*shape):
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32))

    inits = []
    for name, shape in (("wq", (d, d)), ("wk", (d, d)), ("wv", (d, d)), ("wo", (d, d)), ("w1", (d, ff)),
                        ("w2", (ff, d))):
        t = w(*shape)
        t.name = name
        inits.append(t)
    dh = d // heads
    inits += [numpy_helper.from_array(np.array([0, -1, heads, dh], np.int64), "split"),
              numpy_helper.from_array(np.array([0, -1, d], np.int64), "merge"),
              numpy_helper.from_array(np.array(1 / np.sqrt(dh), np.float32), "scale")]
    n = helper.make_node
    nodes = [n("MatMul", ["x", "wq"], ["q0"]), n("MatMul", ["x", "wk"], ["k0"]), n("MatMul", ["x", "wv"], ["v0"]),
             n("Reshape", ["q0", "split"], ["q1"]), n("Reshape", ["k0", "split"], ["k1"]),
             n("Reshape", ["v0", "split"], ["v1"]),
             n("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]), n("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
             n("Transpose", ["v1"], ["v"], perm=[0, 2, 1, 3]),
             n("MatMul", ["q", "kt"], ["s0"]), n("Mul", ["s0", "scale"], ["s"]), n("Softmax", ["s"], ["p"], axis=-1),
             n("MatMul", ["p", "v"], ["c0"]), n("Transpose", ["c0"], ["c1"], perm=[0, 2, 1, 3]),
             n("Reshape", ["c1", "merge"], ["c"]), n("MatMul", ["c", "wo"], ["o"]), n("Add", ["o", "x"], ["h"]),
             n("MatMul", ["h", "w1"], ["f0"]), n("Relu", ["f0"], ["f1"]), n("MatMul", ["f1", "w2"], ["f2"]),
             n("Add", ["f2", "h"], ["y"])]
    g = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T", d])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "T", d])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _session(model, threads):
    so = rt.SessionOptions()
    so.intra_op_num_threads = threads  # the pool is used even where the machine has one core
    return rt.InferenceSession(model, so, providers=["cpu"])


def _feeds(count, tokens=128, d=128):
    rng = np.random.default_rng(7)
    return [{"x": rng.standard_normal((1, tokens, d)).astype(np.float32)} for _ in range(count)]


def _run_threads(target, n):
    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
    assert not any(t.is_alive() for t in threads), "concurrent runs did not finish (deadlock)"


def test_many_threads_on_one_session_get_the_sequential_results():
    sess = _session(_encoder_block(), 2)
    feeds = _feeds(6)
    want = [sess.run(None, f)[0] for f in feeds]
    # the same results again in turn: a kernel's split over the pool does not depend on what
    # else runs, so results are bit-identical, not just close
    ref = np.asarray(want[0], np.float64)
    assert np.isfinite(ref).all() and np.abs(ref).max() > 0
    got: dict = {}
    errors: list = []

    def client(i):
        try:
            for r in range(8):
                k = (i + r) % len(feeds)
                got.setdefault((i, r), (k, sess.run(None, feeds[k])[0]))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    _run_threads(client, 12)
    assert not errors, errors
    assert len(got) == 12 * 8
    for k, y in got.values():
        assert np.array_equal(y, want[k])
    if NATIVE is not None:
        assert NATIVE.pool_stats()[2] == 0  # every run scope was closed


def test_concurrent_runs_match_a_numpy_reference_of_the_block():
    # the sequential results themselves are right (a reference computed in float64)
    model = _encoder_block()
    sess = _session(model, 2)
    import onnx
    from onnx import numpy_helper as nh

    m = onnx.load_from_string(model)
    w = {t.name: nh.to_array(t).astype(np.float64) for t in m.graph.initializer}
    x = _feeds(1)[0]["x"].astype(np.float64)[0]
    heads, d = 2, 128
    q, k, v = x @ w["wq"], x @ w["wk"], x @ w["wv"]
    ctx = []
    for h in range(heads):
        sl = slice(h * d // heads, (h + 1) * d // heads)
        s = q[:, sl] @ k[:, sl].T * float(w["scale"])
        p = np.exp(s - s.max(-1, keepdims=True))
        ctx.append((p / p.sum(-1, keepdims=True)) @ v[:, sl])
    hh = np.concatenate(ctx, 1) @ w["wo"] + x
    ref = np.maximum(hh @ w["w1"], 0) @ w["w2"] + hh
    np.testing.assert_allclose(sess.run(None, _feeds(1)[0])[0][0], ref, rtol=1e-3, atol=1e-3)


_STARVED = r"""
import os, sys, threading
import numpy as np
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core for everything
sys.path.insert(0, sys.argv[1])
from test_concurrency import _encoder_block, _feeds
import runtime_core as rt
so = rt.SessionOptions(); so.intra_op_num_threads = 16   # 15 workers on one core
sess = rt.InferenceSession(_encoder_block(), so, providers=["cpu"])
so1 = rt.SessionOptions(); so1.intra_op_num_threads = 1
ref = rt.InferenceSession(_encoder_block(), so1, providers=["cpu"])
feeds = _feeds(3, tokens=256)
want = [ref.run(None, f)[0] for f in feeds]
bad = []
def client(i):
    for r in range(4):
        y = sess.run(None, feeds[(i + r) % 3])[0]
        if not np.allclose(y, want[(i + r) % 3], rtol=1e-4, atol=1e-4):
            bad.append(i)
ts = [threading.Thread(target=client, args=(i,)) for i in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
print("OK" if not bad else f"WRONG {bad}")
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity (Linux)")
def test_runs_finish_when_the_pool_has_more_workers_than_cores():
    # one core, sixteen kernel threads a run and four runs at once: the workers are mostly
    # descheduled, so each caller must take back the parts no worker got to
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", _STARVED, here], capture_output=True, text=True,
                         timeout=JOIN_S)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("OK"), out.stdout + out.stderr[-3000:]


def _matmul_model():
    g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "mm",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["M", "K"]),
                           helper.make_tensor_value_info("b", TensorProto.FLOAT, ["K", "N"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", "N"])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@needs_native
@pytest.mark.skipif(not sgemm_ready(), reason="SciPy's sgemm is not usable here: MatMul stays on numpy")
def test_the_stop_flag_ends_one_long_compiled_kernel_part_way():
    # one MatMul of 3072^3 (58 GFLOP: seconds on two cores) as sgemm tiles on the pool; the
    # flag is set once the kernel's parts are running, and the rest are skipped
    sess = _session(_matmul_model(), 2)
    rng = np.random.default_rng(3)
    n = 3072
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    ro = rt.RunOptions()
    before = NATIVE.pool_stats()
    outcome: list = []

    def run():
        try:
            sess.run(None, {"a": a, "b": b}, ro)
            outcome.append("finished")
        except RunTerminatedError:
            outcome.append("terminated")

    t = threading.Thread(target=run, daemon=True)
    t.start()
    while NATIVE.pool_stats()[4] == before[4] and t.is_alive():  # until the first tile starts
        time.sleep(0.002)
    ro.terminate = True
    t.join(JOIN_S)
    assert not t.is_alive()
    assert outcome == ["terminated"]
    after = NATIVE.pool_stats()
    assert after[3] > before[3]  # tiles were skipped: stopped inside the kernel, not after it
    # the session still works (new options; the same ones refuse while the flag is set)
    small_a, small_b = a[:300, :200].copy(), b[:200, :500].copy()
    y = sess.run(None, {"a": small_a, "b": small_b})[0]
    np.testing.assert_allclose(y, small_a.astype(np.float64) @ small_b, rtol=1e-3, atol=1e-3)
    ro.terminate = False
    y = sess.run(None, {"a": small_a, "b": small_b}, ro)[0]
    np.testing.assert_allclose(y, small_a.astype(np.float64) @ small_b, rtol=1e-3, atol=1e-3)


def test_a_run_stays_stopped_when_the_flag_is_cleared_again():
    # a kernel cut short never hands on its output: clearing the flag does not revive the run
    from runtime_core.execution.cancel import make_stop

    ro = rt.RunOptions()
    stop = make_stop(ro)
    ro.terminate = True
    assert stop.flag[0] == 1
    ro.terminate = False
    with pytest.raises(RunTerminatedError):
        stop()
    stop.close()
    assert not ro._run_flags
    stop2 = make_stop(ro)  # a new run with the cleared options runs
    stop2()
    stop2.close()
