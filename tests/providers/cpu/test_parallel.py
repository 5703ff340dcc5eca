"""``ExecutionMode.ORT_PARALLEL``: independent nodes of a CPU partition run concurrently.

Concurrency is proven without timing: test-only hooks around kernels of the compiled
executable wait on a ``threading.Barrier`` that only passes when two nodes are inside
their kernels at the same time (a sequential run breaks it after its timeout and fails).
"""

from __future__ import annotations

import gc
import json
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import pytest
import runtime_provider_cpu.executable as ex
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from oracle import compiled_partitions
from runtime_provider_cpu.execution import inplace

import runtime_core as rt
from runtime_core.errors import ExecutionError, InvalidArgumentError
from runtime_core.session.options import default_thread_count

F = T.FLOAT
BARRIER_TIMEOUT_S = 30  # only reached when the nodes do NOT overlap (the test then fails)
POOL_PREFIX = "runtime_core-inter-op"


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _branches(k=4, n=32, d=48, seed=0):
    """``k`` independent MatMul+Sigmoid chains on ``x``, joined by Sum and Concat (not Relu: MatMul +
    Relu fuses into one node at level ALL). The Sigmoid nodes are named ``relu{b}``."""
    rng = np.random.default_rng(seed)
    ws = [(rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32) for _ in range(k)]
    nodes = []
    for b in range(k):
        nodes += [helper.make_node("MatMul", ["x", f"w{b}"], [f"m{b}"], name=f"mm{b}"),
                  helper.make_node("Sigmoid", [f"m{b}"], [f"r{b}"], name=f"relu{b}")]
    nodes += [helper.make_node("Sum", [f"r{b}" for b in range(k)], ["y"], name="sum"),
              helper.make_node("Concat", [f"r{b}" for b in range(k)], ["cat"], axis=1, name="concat")]
    m = _model(nodes, [_vi("x", F, [n, d])], [_vi("y", F, [n, d]), _vi("cat", F, [n, k * d])],
               [numpy_helper.from_array(w, f"w{b}") for b, w in enumerate(ws)])
    return m, ws


def _numpy_branches(x, ws):
    rs = [1 / (1 + np.exp(-(x @ w))) for w in ws]
    return sum(rs[1:], rs[0]), np.concatenate(rs, axis=1)


def _session(model, mode=rt.ExecutionMode.ORT_PARALLEL, threads=2, profile_prefix=None, level=None):
    so = rt.SessionOptions()
    so.execution_mode = mode
    so.inter_op_num_threads = threads
    if level is not None:
        so.graph_optimization_level = level
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return rt.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _hook(sess, wrap):
    """Replace each step's kernel by ``wrap(node_name, kernel)`` (``None``: keep it); a hooked
    step loses its in-place variant (the step's last field), which would bypass the hook."""
    for exe in compiled_partitions(sess):
        for i, st in enumerate(exe.steps):
            new = wrap(st[1].node.name, st[0])
            if new is not None:
                exe.steps[i] = (new,) + tuple(st[1:6]) + (None,)


def _pool_threads():
    return [t for t in threading.enumerate() if t.name.startswith(POOL_PREFIX)]


def _x(n=32, d=48, seed=1):
    return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


# -- results -------------------------------------------------------------------------------


@pytest.mark.parametrize("threads", [0, 2, 4])
def test_branches_equal_sequential_and_numpy(threads):
    m, ws = _branches()
    x = _x()
    seq = _session(m, rt.ExecutionMode.ORT_SEQUENTIAL)
    par = _session(m, threads=threads)
    assert compiled_partitions(par)[0].parallel == (threads != 0 or default_thread_count() > 1)
    assert not compiled_partitions(seq)[0].parallel
    want = seq.run(None, {"x": x})
    y_np, cat_np = _numpy_branches(x, ws)
    for _ in range(20):
        got = par.run(None, {"x": x})
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[0], y_np, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], cat_np, rtol=1e-5, atol=1e-5)


def test_elementwise_branches_are_bit_identical_to_sequential():
    # a diamond of diamonds of ops whose results do not depend on BLAS blocking
    nodes = [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Neg", ["x"], ["n"]),
             helper.make_node("Tanh", ["e"], ["t"]), helper.make_node("Mul", ["e", "n"], ["p"]),
             helper.make_node("Sin", ["n"], ["s"]), helper.make_node("Add", ["t", "p"], ["a"]),
             helper.make_node("Sub", ["s", "a"], ["y"]), helper.make_node("Max", ["p", "s", "t"], ["z"])]
    m = _model(nodes, [_vi("x", F, [7, 9])], [_vi("y", F, [7, 9]), _vi("z", F, [7, 9]), _vi("e", F, [7, 9])])
    x = _x(7, 9)
    want = _session(m, rt.ExecutionMode.ORT_SEQUENTIAL).run(None, {"x": x})
    par = _session(m, threads=3, level=rt.GraphOptimizationLevel.ORT_DISABLE_ALL)
    assert compiled_partitions(par)[0].parallel
    for _ in range(20):
        for g, w in zip(par.run(None, {"x": x}), want):
            np.testing.assert_array_equal(g, w)


# -- concurrency evidence -------------------------------------------------------------------


def _meet_at_barrier(names, parties=2, timeout=BARRIER_TIMEOUT_S):
    """A hook: the kernels of ``names`` wait until ``parties`` of them run at the same time."""
    barrier = threading.Barrier(parties, timeout=timeout)
    seen = {}

    def wrap(name, fn):
        if name not in names:
            return None

        def hooked(ctx, *args, **attrs):
            seen[name] = threading.get_ident()
            barrier.wait()  # BrokenBarrierError (the node fails) if no other node comes
            return fn(ctx, *args, **attrs)
        return hooked
    return wrap, seen, barrier


def test_independent_branches_overlap():
    m, ws = _branches()
    x = _x()
    sess = _session(m, threads=2)
    wrap, seen, _ = _meet_at_barrier({"relu0", "relu3"})
    _hook(sess, wrap)
    y, _ = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, _numpy_branches(x, ws)[0], rtol=1e-5, atol=1e-5)
    assert len(set(seen.values())) == 2  # two threads, inside their kernels at once


def test_four_threads_run_four_branches_at_once():
    m, _ = _branches()
    sess = _session(m, threads=4)
    wrap, seen, _ = _meet_at_barrier({"relu0", "relu1", "relu2", "relu3"}, parties=4)
    _hook(sess, wrap)
    sess.run(None, {"x": _x()})
    assert len(set(seen.values())) == 4
    assert len(_pool_threads()) >= 3


def test_sequential_mode_does_not_overlap():
    # the barrier's counter-test: the same hook fails in ORT_SEQUENTIAL (nothing overlaps)
    m, _ = _branches()
    sess = _session(m, rt.ExecutionMode.ORT_SEQUENTIAL)
    wrap, _, _ = _meet_at_barrier({"relu0", "relu3"}, timeout=0.5)  # nothing else will come
    _hook(sess, wrap)
    with pytest.raises(ExecutionError, match="relu[03].*BrokenBarrierError"):
        sess.run(None, {"x": _x()})


def test_profile_shows_overlapping_nodes_on_two_threads(tmp_path):
    m, _ = _branches()
    sess = _session(m, threads=2, profile_prefix=str(tmp_path / "prof"))
    wrap, _, _ = _meet_at_barrier({"relu1", "relu2"})
    _hook(sess, wrap)
    sess.run(None, {"x": _x()})
    with open(sess.end_profiling()) as f:
        events = [e for e in json.load(f) if e["cat"] == "Node"]
    by_name = {e["name"][: -len("_kernel_time")]: e for e in events}
    assert sorted(by_name) == sorted(["concat", "sum"] + [f"{o}{b}" for o in ("mm", "relu") for b in range(4)])
    assert len(events) == len(by_name)  # every node recorded once
    a, b = by_name["relu1"], by_name["relu2"]
    assert a["tid"] != b["tid"]
    assert max(a["ts"], b["ts"]) <= min(a["ts"] + a["dur"], b["ts"] + b["dur"])  # intervals overlap
    # a node runs after the nodes it reads
    for k in range(4):
        assert by_name[f"relu{k}"]["ts"] >= by_name[f"mm{k}"]["ts"] + by_name[f"mm{k}"]["dur"] - 1


def test_one_inter_op_thread_runs_on_the_callers_thread(tmp_path):
    m, ws = _branches()
    x = _x()
    sess = _session(m, threads=1, profile_prefix=str(tmp_path / "one"))
    assert not compiled_partitions(sess)[0].parallel
    y, cat = sess.run(None, {"x": x})
    y_np, cat_np = _numpy_branches(x, ws)
    np.testing.assert_allclose(y, y_np, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(cat, cat_np, rtol=1e-5, atol=1e-5)
    with open(sess.end_profiling()) as f:
        tids = {e["tid"] for e in json.load(f) if e["cat"] == "Node"}
    assert tids == {threading.get_native_id()}


def test_a_chain_stays_on_the_sequential_loop():
    nodes = [helper.make_node("Neg" if i % 2 else "Relu", [f"v{i}"], [f"v{i + 1}"]) for i in range(6)]
    m = _model(nodes, [_vi("v0", F, [3])], [_vi("v6", F, [3])])
    sess = _session(m, threads=4, level=rt.GraphOptimizationLevel.ORT_DISABLE_ALL)
    assert not compiled_partitions(sess)[0].parallel  # nothing could overlap: no scheduling cost
    x = np.array([-1, 0, 2], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"v0": x})[0], np.maximum(np.maximum(x, 0) * -1, 0) * -1)


# -- errors ----------------------------------------------------------------------------------


def _failing_model(chain=30):
    """Branch A: a Gather whose indices come from a feed; branch B: a chain of ``chain`` Negs."""
    nodes = [helper.make_node("Gather", ["x", "idx"], ["g"], axis=0, name="bad_gather")]
    prev = "x"
    for i in range(chain):
        nodes.append(helper.make_node("Neg", [prev], [f"b{i}"], name=f"b{i}"))
        prev = f"b{i}"
    nodes.append(helper.make_node("ReduceSum", ["g"], ["gs"], keepdims=0, name="after_gather"))
    return _model(nodes, [_vi("x", F, [4, 3]), _vi("idx", T.INT64, [2])],
                  [_vi("gs", F, []), _vi(prev, F, [4, 3])])


def test_error_in_a_branch_is_the_sequential_error():
    m = _failing_model()
    feeds = {"x": _x(4, 3), "idx": np.array([0, 7], np.int64)}
    level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    with pytest.raises(ExecutionError) as seq:
        _session(m, rt.ExecutionMode.ORT_SEQUENTIAL, level=level).run(None, feeds)
    par = _session(m, threads=2, level=level)
    assert compiled_partitions(par)[0].parallel
    for _ in range(5):
        with pytest.raises(ExecutionError) as err:
            par.run(None, feeds)
        assert str(err.value) == str(seq.value)
        assert "'bad_gather' (Gather)" in str(err.value)
        assert isinstance(err.value.__cause__, ex.CPUKernelError)
        assert err.value.__cause__.node_name == "bad_gather"
    # the session still works afterwards, with good feeds
    out = par.run(None, {"x": feeds["x"], "idx": np.array([0, 3], np.int64)})
    np.testing.assert_allclose(out[0], feeds["x"][[0, 3]].sum(), rtol=1e-6)


def test_no_new_work_after_a_failure_and_in_flight_nodes_finish_first():
    m = _failing_model(chain=30)
    sess = _session(m, threads=2, level=rt.GraphOptimizationLevel.ORT_DISABLE_ALL)
    b0_started, raised, b0_returned = threading.Event(), threading.Event(), threading.Event()
    ran = []

    def wrap(name, fn):
        if name == "bad_gather":
            def gather(ctx, *args, **attrs):
                assert b0_started.wait(BARRIER_TIMEOUT_S)
                try:
                    return fn(ctx, *args, **attrs)
                finally:
                    raised.set()
            return gather
        if name.startswith("b"):
            def neg(ctx, *args, **attrs):
                ran.append(name)
                if name == "b0":
                    b0_started.set()
                    assert raised.wait(BARRIER_TIMEOUT_S)
                    # leave the failing thread the moment it needs to record its error
                    threading.Event().wait(0.5)
                    b0_returned.set()
                return fn(ctx, *args, **attrs)
            return neg
        return None

    _hook(sess, wrap)
    with pytest.raises(ExecutionError, match="bad_gather"):
        sess.run(None, {"x": _x(4, 3), "idx": np.array([9, 9], np.int64)})
    assert b0_returned.is_set()  # run() returned only after the node in flight had finished
    assert ran == ["b0"]  # b1..b29 were never started


def test_concurrent_runs_with_failures_do_not_hang():
    m = _failing_model(chain=5)
    sess = _session(m, threads=2, level=rt.GraphOptimizationLevel.ORT_DISABLE_ALL)
    x = _x(4, 3)

    def one(i):
        idx = np.array([0, 1 if i % 2 else 99], np.int64)
        try:
            out = sess.run(None, {"x": x, "idx": idx})
        except ExecutionError as exc:
            assert i % 2 == 0 and "bad_gather" in str(exc)
            return "error"
        np.testing.assert_allclose(out[0], x[[0, 1]].sum(), rtol=1e-6)
        np.testing.assert_array_equal(out[1], -x if 5 % 2 else x)
        return "ok"

    with ThreadPoolExecutor(4) as pool:
        res = list(pool.map(one, range(40), timeout=120))
    assert res.count("error") == 20 and res.count("ok") == 20


# -- sessions shared between threads, thread lifetime --------------------------------------------


def test_four_callers_share_one_parallel_session():
    m, ws = _branches()
    before = set(_pool_threads())
    sess = _session(m, threads=3)
    xs = [_x(seed=s) for s in range(8)]
    want = [_numpy_branches(x, ws) for x in xs]

    def caller(c):
        for r in range(15):
            k = (c + r) % len(xs)
            y, cat = sess.run(None, {"x": xs[k]})
            np.testing.assert_allclose(y, want[k][0], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(cat, want[k][1], rtol=1e-5, atol=1e-5)
        return c

    with ThreadPoolExecutor(4) as pool:
        assert sorted(pool.map(caller, range(4), timeout=300)) == [0, 1, 2, 3]
    # the helpers of one session are bounded by its thread count, however many callers
    assert 1 <= len(set(_pool_threads()) - before) <= 2


def test_helper_threads_end_when_the_session_is_collected():
    m, _ = _branches()
    before = set(_pool_threads())
    sess = _session(m, threads=4)
    wrap, _, _ = _meet_at_barrier({"relu0", "relu1", "relu2", "relu3"}, parties=4)
    _hook(sess, wrap)
    sess.run(None, {"x": _x()})
    mine = [t for t in _pool_threads() if t not in before]
    assert len(mine) == 3
    ref = weakref.ref(sess)
    del sess, wrap
    gc.collect()
    assert ref() is None
    for t in mine:
        t.join(BARRIER_TIMEOUT_S)
        assert not t.is_alive()


def test_many_short_lived_sessions_do_not_accumulate_threads():
    m, ws = _branches(k=3)
    x = _x()
    before = set(_pool_threads())
    for _ in range(8):
        s = _session(m, threads=3)
        np.testing.assert_allclose(s.run(None, {"x": x})[0], _numpy_branches(x, ws)[0], rtol=1e-5, atol=1e-5)
        del s
    gc.collect()
    for t in set(_pool_threads()) - before:
        t.join(BARRIER_TIMEOUT_S)
        assert not t.is_alive()


# -- lifetimes and in-place execution -------------------------------------------------------------


def test_intermediates_are_freed_after_their_last_reader():
    m, _ = _branches()
    sess = _session(m, threads=2)
    made = {}  # MatMul output -> weak reference
    at_sum = {}

    def wrap(name, fn):
        if name.startswith("mm"):
            def mm(ctx, *args, **attrs):
                out = fn(ctx, *args, **attrs)
                made[name] = weakref.ref(out)
                return out
            return mm
        if name in ("sum", "concat"):
            def join(ctx, *args, **attrs):
                # every Sigmoid has finished: the MatMul results (read only by them) must be gone
                at_sum[name] = sorted(k for k, r in made.items() if r() is not None)
                return fn(ctx, *args, **attrs)
            return join
        return None

    _hook(sess, wrap)
    for _ in range(5):
        sess.run(None, {"x": _x()})
        assert len(made) == 4
        assert at_sum == {"sum": [], "concat": []}


def test_in_place_kernels_are_off_in_parallelcompiled_partitions(monkeypatch):
    if not inplace.ENABLED:
        pytest.skip("in-place execution is off on this interpreter")
    calls = []
    orig = inplace.owned
    monkeypatch.setattr(inplace, "owned", lambda *a: calls.append(1) or orig(*a))
    # two branches of elementwise chains whose intermediates die at their readers
    nodes = []
    for b in range(2):
        nodes += [helper.make_node("Relu", ["x"], [f"a{b}"]), helper.make_node("Neg", [f"a{b}"], [f"n{b}"]),
                  helper.make_node("Exp", [f"n{b}"], [f"e{b}"])]
    nodes.append(helper.make_node("Add", ["e0", "e1"], ["y"]))
    m = _model(nodes, [_vi("x", F, [5, 4])], [_vi("y", F, [5, 4])])
    x = _x(5, 4)
    level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    seq = _session(m, rt.ExecutionMode.ORT_SEQUENTIAL, level=level)
    par = _session(m, threads=2, level=level)
    assert compiled_partitions(seq)[0].n_inplace_steps > 0
    assert compiled_partitions(par)[0].n_inplace_steps == 0
    want = seq.run(None, {"x": x})[0]
    assert calls  # the sequential executable writes in place
    calls.clear()
    for _ in range(10):
        np.testing.assert_array_equal(par.run(None, {"x": x})[0], want)
    assert not calls
    np.testing.assert_allclose(want, 2 * np.exp(-np.maximum(x, 0)), rtol=1e-6)


# -- options ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("attr, value", [("inter_op_num_threads", -1), ("intra_op_num_threads", -2),
                                         ("inter_op_num_threads", 1.5), ("inter_op_num_threads", "2"),
                                         ("execution_mode", 7)])
def test_invalid_threading_options_fail_at_session_creation(attr, value):
    m, _ = _branches(k=2)
    so = rt.SessionOptions()
    so.execution_mode = rt.ExecutionMode.ORT_PARALLEL
    setattr(so, attr, value)
    with pytest.raises(InvalidArgumentError) as err:
        rt.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    assert isinstance(err.value, ValueError)
    msg = str(err.value)
    assert f"SessionOptions.{attr}" in msg
    assert repr(value) in msg or str(value) in msg
    if attr == "execution_mode":
        assert "ORT_SEQUENTIAL" in msg and "ORT_PARALLEL" in msg


def test_negative_threads_are_refused_in_sequential_mode_too():
    so = rt.SessionOptions()
    so.inter_op_num_threads = -3
    with pytest.raises(InvalidArgumentError, match="inter_op_num_threads"):
        rt.InferenceSession(_branches(k=2)[0].SerializeToString(), so, providers=["cpu"])


def test_execution_mode_given_as_int_and_numpy_thread_count():
    m, ws = _branches(k=2)
    so = rt.SessionOptions()
    so.execution_mode = 1
    so.inter_op_num_threads = np.int64(2)
    sess = rt.InferenceSession(m.SerializeToString(), so, providers=["cpu"])
    assert compiled_partitions(sess)[0].parallel
    x = _x()
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _numpy_branches(x, ws)[0], rtol=1e-5, atol=1e-5)


def test_blas_threads_never_compete_with_the_kernel_pool_in_parallel_mode():
    # numpy's BLAS is held at one thread once a CPU partition compiles (GEMMs run as tiles
    # on the kernel pool), or at the session's threads where SciPy's sgemm is missing
    from threadpoolctl import threadpool_info

    from runtime_provider_cpu.fast import sgemm

    m, _ = _branches(k=2)
    so = rt.SessionOptions()
    so.execution_mode = rt.ExecutionMode.ORT_PARALLEL
    so.inter_op_num_threads = 2
    so.intra_op_num_threads = 1
    rt.InferenceSession(m.SerializeToString(), so, providers=["cpu"]).run(None, {"x": _x()})
    held = sgemm._BLAS[0]
    assert held == 1 or not sgemm.sgemm_ready()
    assert {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"} == {held}


# -- control flow ------------------------------------------------------------------------------------


@pytest.mark.parametrize("cond", [True, False])
def test_if_and_loop_in_parallel_branches(cond):
    then = helper.make_graph([helper.make_node("Mul", ["x", "s"], ["t"])], "then", [], [_vi("t", F, [2, 3])])
    els = helper.make_graph([helper.make_node("Sub", ["s", "x"], ["e"])], "else", [], [_vi("e", F, [2, 3])])
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("Add", ["acc_in", "x"], ["acc_out"]),
         helper.make_node("Neg", ["acc_out"], ["scan"])],
        "body", [_vi("i", T.INT64, []), _vi("c_in", T.BOOL, []), _vi("acc_in", F, [2, 3])],
        [_vi("c_out", T.BOOL, []), _vi("acc_out", F, [2, 3]), _vi("scan", F, [2, 3])])
    nodes = [helper.make_node("Exp", ["x"], ["s"], name="exp"),
             helper.make_node("If", ["c"], ["z"], then_branch=then, else_branch=els, name="if"),
             helper.make_node("Loop", ["n", "", "x"], ["acc", "scans"], body=body, name="loop"),
             helper.make_node("Tanh", ["x"], ["th"], name="tanh"),
             helper.make_node("ReduceSum", ["scans"], ["rs"], keepdims=0, axes=[0], name="rsum")]
    nodes.append(helper.make_node("Add", ["z", "acc"], ["za"], name="join"))
    nodes.append(helper.make_node("Add", ["za", "th"], ["y"], name="out"))
    m = _model(nodes, [_vi("c", T.BOOL, []), _vi("x", F, [2, 3]), _vi("n", T.INT64, [])],
               [_vi("y", F, [2, 3]), _vi("rs", F, [2, 3])], opset=11)
    x = _x(2, 3)
    feeds = {"c": np.array(cond), "x": x, "n": np.array(3, np.int64)}
    want = _session(m, rt.ExecutionMode.ORT_SEQUENTIAL).run(None, feeds)
    s = np.exp(x)
    z = x * s if cond else s - x
    acc = x + 3 * x
    np.testing.assert_allclose(want[0], z + acc + np.tanh(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(want[1], -(2 * x + 3 * x + 4 * x), rtol=1e-5, atol=1e-6)
    par = _session(m, threads=3)
    assert compiled_partitions(par)[0].parallel
    # the If and the Loop are inside their kernels at the same time
    wrap, seen, _ = _meet_at_barrier({"if", "loop"})
    _hook(par, wrap)
    for _ in range(3):
        for g, w in zip(par.run(None, feeds), want):
            np.testing.assert_array_equal(g, w)
    assert len(set(seen.values())) == 2
