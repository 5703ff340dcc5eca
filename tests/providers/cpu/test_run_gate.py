"""The gate on concurrent runs (``_native.run_enter``'s limit; ``session.cpu.max_concurrent_runs``).

A run that would exceed the limit waits its turn, first come first served, the GIL released.
Concurrency is counted inside hooked kernels, never timed; every wait for a thread has a timeout,
so a deadlock fails the test instead of hanging it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper
from oracle import compiled_partitions

import runtime_core as rt
from runtime_core.errors import ExecutionError, InvalidArgumentError, RunTerminatedError

pytestmark = pytest.mark.native

NATIVE = pytest.importorskip("runtime_provider_cpu.fast.policy").NATIVE
F = T.FLOAT
JOIN_S = 60  # only reached by a deadlock (the test then fails)
GATE_WAITED, GATE_WAIT_NS, GATE_ADMITTED, GATE_QUEUED = 11, 12, 13, 14  # fields of pool_stats()
CONFIG = "session.cpu.max_concurrent_runs"


def _model(nodes, inputs, outputs, opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _neg_model():
    return _model([helper.make_node("Neg", ["x"], ["y"], name="neg")],
                  [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, [2, 3])])


def _session(model, config=None, parallel=False):
    so = rt.SessionOptions()
    so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    if parallel:
        so.execution_mode = rt.ExecutionMode.ORT_PARALLEL
        so.inter_op_num_threads = 3
    for k, v in (config or {}).items():
        so.add_session_config_entry(k, v)
    return rt.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _hook(sess, wrap):
    """Replace each step's kernel by ``wrap(node_name, kernel)`` (``None``: keep it)."""
    for exe in compiled_partitions(sess):
        for i, st in enumerate(exe.steps):
            new = wrap(st[1].node.name, st[0])
            if new is not None:
                exe.steps[i] = (new,) + tuple(st[1:6]) + (None,)


class Inside:
    """Counts the threads inside a hooked kernel at once (each stays ``hold_s``)."""

    def __init__(self, hold_s=0.02):
        self.lock = threading.Lock()
        self.now = self.most = 0
        self.hold_s = hold_s

    def wrap(self, name, fn):
        def hooked(ctx, *args, **attrs):
            with self.lock:
                self.now += 1
                self.most = max(self.most, self.now)
            try:
                time.sleep(self.hold_s)  # the GIL released: other runs may come in meanwhile
                return fn(ctx, *args, **attrs)
            finally:
                with self.lock:
                    self.now -= 1
        return hooked


@pytest.fixture
def gate():
    """``gate(n)`` sets the process's default limit for the test."""
    before = NATIVE.run_gate()
    yield NATIVE.run_gate
    NATIVE.run_gate(before)


def _clients(fn, n):
    """Run ``fn(i)`` on ``n`` threads at once; their errors, re-raised; fails on a deadlock."""
    errors = []
    start = threading.Barrier(n)

    def work(i):
        try:
            start.wait(JOIN_S)
            fn(i)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    ts = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(JOIN_S)
    assert not any(t.is_alive() for t in ts), "runs deadlocked"
    if errors:
        raise errors[0]


def _x(seed=0):
    return np.random.default_rng(seed).standard_normal((2, 3)).astype(np.float32)


def _hold_a_slot(sess, hold_s=JOIN_S):
    """Start a run of ``sess`` on another thread that holds its slot inside its kernel until the
    returned event is set (or ``hold_s`` passes); returns (that event, the run's thread) once the
    run is inside."""
    entered, release = threading.Event(), threading.Event()

    def wrap(name, fn):
        def hooked(ctx, *args, **attrs):
            entered.set()
            release.wait(hold_s)
            return fn(ctx, *args, **attrs)
        return hooked

    _hook(sess, wrap)
    holder = threading.Thread(target=sess.run, args=(None, {"x": _x()}), daemon=True)
    holder.start()
    assert entered.wait(JOIN_S)
    return release, holder


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_the_gate_bounds_the_runs_inside_kernels(gate, limit):
    gate(limit)
    sess = _session(_neg_model())
    inside = Inside()
    _hook(sess, inside.wrap)
    before = NATIVE.pool_stats()

    def client(i):
        x = _x(i)
        for _ in range(4):
            np.testing.assert_array_equal(sess.run(None, {"x": x})[0], -x)

    _clients(client, 6)
    after = NATIVE.pool_stats()
    assert inside.most == limit  # six clients holding 20 ms each: the limit is reached, never passed
    assert after[GATE_WAITED] > before[GATE_WAITED]
    assert after[GATE_WAIT_NS] > before[GATE_WAIT_NS]
    assert after[GATE_ADMITTED] == 0 and after[GATE_QUEUED] == 0


def test_the_session_entry_overrides_the_process_default(gate):
    gate(1)
    unlimited = _session(_neg_model(), {CONFIG: "0"})
    meet = threading.Barrier(3, timeout=JOIN_S)  # passes only with three runs inside at once

    def wrap(name, fn):
        def hooked(ctx, *args, **attrs):
            meet.wait()
            return fn(ctx, *args, **attrs)
        return hooked

    _hook(unlimited, wrap)
    _clients(lambda i: unlimited.run(None, {"x": _x(i)}), 3)

    two = _session(_neg_model(), {CONFIG: "2"})
    counted = Inside()
    _hook(two, counted.wrap)
    _clients(lambda i: [two.run(None, {"x": _x(i)}) for _ in range(3)], 5)
    assert counted.most == 2
    assert NATIVE.pool_stats()[GATE_ADMITTED] == 0


@pytest.mark.parametrize("raw", ["-1", "two", "1.5", str((1 << 20) + 1)])
def test_a_bad_entry_is_a_typed_error(raw):
    with pytest.raises(InvalidArgumentError, match="max_concurrent_runs"):
        _session(_neg_model(), {CONFIG: raw})


def test_bad_native_arguments_are_typed_errors():
    with pytest.raises(ValueError, match="run_gate"):
        NATIVE.run_gate(-1)
    with pytest.raises(ValueError, match="run_enter"):
        NATIVE.run_enter(None, -2)
    assert NATIVE.pool_stats()[GATE_ADMITTED] == 0


def _if_model():
    then_g = helper.make_graph([helper.make_node("Neg", ["x"], ["t"], name="body_neg")], "then", [],
                               [helper.make_tensor_value_info("t", F, [2, 3])])
    else_g = helper.make_graph([helper.make_node("Abs", ["x"], ["e"], name="body_abs")], "else", [],
                               [helper.make_tensor_value_info("e", F, [2, 3])])
    return _model([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="if")],
                  [helper.make_tensor_value_info("c", T.BOOL, []), helper.make_tensor_value_info("x", F, [2, 3])],
                  [helper.make_tensor_value_info("y", F, [2, 3])])


def test_if_bodies_inside_an_admitted_run_never_wait(gate):
    gate(1)
    sess = _session(_if_model())

    def client(i):
        x = _x(i)
        for k in range(10):
            c = np.array((i + k) % 2 == 0)
            y = sess.run(None, {"c": c, "x": x})[0]
            np.testing.assert_array_equal(y, -x if c else np.abs(x))

    _clients(client, 4)
    assert NATIVE.pool_stats()[GATE_ADMITTED] == 0


def test_a_session_run_inside_a_kernel_never_waits(gate):
    gate(1)
    inner = _session(_neg_model())
    outer = _session(_neg_model())

    def wrap(name, fn):
        def hooked(ctx, x, **attrs):
            return inner.run(None, {"x": fn(ctx, x, **attrs)})[0]  # -(-x) on the same thread
        return hooked

    _hook(outer, wrap)

    def client(i):
        x = _x(i)
        for _ in range(5):
            np.testing.assert_array_equal(outer.run(None, {"x": x})[0], x)

    _clients(client, 4)
    assert NATIVE.pool_stats()[GATE_ADMITTED] == 0


def _branches(k=4):
    nodes = [helper.make_node("Neg", ["x"], [f"n{b}"], name=f"neg{b}") for b in range(k)]
    nodes.append(helper.make_node("Sum", [f"n{b}" for b in range(k)], ["y"], name="sum"))
    return _model(nodes, [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, [2, 3])])


def test_parallel_executor_helpers_never_wait(gate):
    gate(1)
    sess = _session(_branches(), parallel=True)
    assert compiled_partitions(sess)[0].parallel
    meet = threading.Barrier(2, timeout=JOIN_S)
    seen = []

    def wrap(name, fn):
        if name not in ("neg0", "neg1"):
            return None

        def hooked(ctx, *args, **attrs):
            seen.append(threading.get_ident())
            meet.wait()  # two nodes of one run at once: a helper thread runs while the gate is full
            return fn(ctx, *args, **attrs)
        return hooked

    _hook(sess, wrap)

    def client(i):
        x = _x(i)
        for _ in range(5):
            np.testing.assert_allclose(sess.run(None, {"x": x})[0], -4 * x, rtol=1e-6)

    _clients(client, 4)
    assert len(set(seen)) >= 2
    assert NATIVE.pool_stats()[GATE_ADMITTED] == 0


def test_terminate_while_waiting_raises_and_takes_no_slot(gate):
    gate(1)
    sess = _session(_neg_model())
    release, holder = _hold_a_slot(sess)
    opts = rt.RunOptions()
    result = {}

    def waiter():
        try:
            sess.run(None, {"x": _x()}, opts)
            result["ok"] = True
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            result["error"] = exc

    w = threading.Thread(target=waiter, daemon=True)
    w.start()
    deadline = time.monotonic() + JOIN_S
    while NATIVE.pool_stats()[GATE_QUEUED] < 1:
        assert time.monotonic() < deadline, "the second run never queued"
        time.sleep(0.001)
    opts.terminate = True
    w.join(JOIN_S)
    assert not w.is_alive(), "a cancelled waiting run did not end"
    assert isinstance(result.get("error"), RunTerminatedError)
    assert NATIVE.pool_stats()[GATE_QUEUED] == 0
    assert NATIVE.pool_stats()[GATE_ADMITTED] == 1  # the holder's slot only
    release.set()
    holder.join(JOIN_S)
    assert not holder.is_alive()
    assert NATIVE.pool_stats()[GATE_ADMITTED] == 0


def test_a_failing_run_releases_its_slot(gate):
    gate(1)
    sess = _session(_neg_model())
    fail = threading.local()

    def wrap(name, fn):
        def hooked(ctx, *args, **attrs):
            if getattr(fail, "on", False):
                raise RuntimeError("kernel failed on purpose")
            return fn(ctx, *args, **attrs)
        return hooked

    _hook(sess, wrap)

    def client(i):
        fail.on = i % 2 == 0
        x = _x(i)
        for _ in range(5):
            if fail.on:
                with pytest.raises(ExecutionError, match="on purpose"):
                    sess.run(None, {"x": x})
            else:
                np.testing.assert_array_equal(sess.run(None, {"x": x})[0], -x)

    _clients(client, 4)
    assert NATIVE.pool_stats()[GATE_ADMITTED] == 0


def test_a_scope_dropped_without_exit_frees_its_slot(gate):
    gate(1)

    def leak():
        scope = NATIVE.run_enter(None, 1)  # this thread ends inside it
        assert NATIVE.pool_stats()[GATE_ADMITTED] == 1
        del scope

    t = threading.Thread(target=leak)
    t.start()
    t.join(JOIN_S)
    assert NATIVE.pool_stats()[GATE_ADMITTED] == 0
    sess = _session(_neg_model())
    x = _x()
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], -x)


def test_waiting_runs_go_first_come_first_served(gate):
    gate(1)
    order = []
    hold = NATIVE.run_enter(None)  # the slot, held by this thread while the others queue
    try:
        def client(i):
            s = NATIVE.run_enter(None)
            order.append(i)
            NATIVE.run_exit(s)

        ts = []
        for i in range(4):
            t = threading.Thread(target=client, args=(i,), daemon=True)
            t.start()
            ts.append(t)
            deadline = time.monotonic() + JOIN_S
            while NATIVE.pool_stats()[GATE_QUEUED] < i + 1:  # queued in this order
                assert time.monotonic() < deadline
                time.sleep(0.001)
    finally:
        NATIVE.run_exit(hold)
    for t in ts:
        t.join(JOIN_S)
    assert not any(t.is_alive() for t in ts)
    assert order == [0, 1, 2, 3]


def test_a_higher_limit_admits_the_waiting_runs(gate):
    gate(1)
    hold = NATIVE.run_enter(None)
    done = threading.Event()

    def client():
        NATIVE.run_exit(NATIVE.run_enter(None))
        done.set()

    t = threading.Thread(target=client, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + JOIN_S
        while NATIVE.pool_stats()[GATE_QUEUED] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        gate(2)  # admitted while this thread still holds its slot
        assert done.wait(JOIN_S)
    finally:
        NATIVE.run_exit(hold)
    t.join(JOIN_S)


@pytest.mark.parametrize("env, want", [("3", "3"), ("0", "0"), ("", "cores"), ("-2", "cores"), ("x", "cores")])
def test_the_environment_sets_the_default(env, want):
    code = "from runtime_provider_cpu.fast.policy import NATIVE; print(NATIVE.run_gate())"
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, RUNTIME_CORE_CPU_MAX_RUNS=env),
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == (str(len(os.sched_getaffinity(0))) if want == "cores" else want)


CTRL_C_CHILD = r"""
import os, signal, sys, threading, time
sys.path[:0] = sys.argv[1:3]
from test_run_gate import GATE_ADMITTED, GATE_QUEUED, JOIN_S, NATIVE, _hold_a_slot, _neg_model, _session, _x

NATIVE.run_gate(1)
sess = _session(_neg_model())
release, holder = _hold_a_slot(sess, float(sys.argv[3]))  # held this long unless released first

def interrupt():
    while NATIVE.pool_stats()[GATE_QUEUED] < 1:
        time.sleep(0.001)
    os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C in a terminal

threading.Thread(target=interrupt, daemon=True).start()
t0 = time.monotonic()
try:
    sess.run(None, {"x": _x(1)})  # the main thread, waiting behind the holder
    print("RETURNED", flush=True)
except KeyboardInterrupt:
    stats = NATIVE.pool_stats()
    print("INTERRUPTED", round(time.monotonic() - t0, 3), stats[GATE_QUEUED], stats[GATE_ADMITTED], flush=True)
release.set()
holder.join(JOIN_S)
print("AFTER", NATIVE.pool_stats()[GATE_ADMITTED], flush=True)
"""


def test_ctrl_c_while_waiting_interrupts_the_run_and_takes_no_slot():
    """A run waiting for its turn on the main thread raises KeyboardInterrupt at Ctrl-C (a real
    SIGINT) within the gate's poll, not when the run ahead of it ends (held 30 s here), leaving
    the queue without a slot."""
    here = os.path.dirname(os.path.abspath(__file__))
    tests = os.path.dirname(os.path.dirname(here))
    out = subprocess.run([sys.executable, "-c", CTRL_C_CHILD, here, tests, "30"], capture_output=True, text=True,
                         timeout=JOIN_S + 30)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.split()
    assert lines[0] == "INTERRUPTED", out.stdout
    waited, queued, admitted = float(lines[1]), int(lines[2]), int(lines[3])
    assert waited < 10, f"Ctrl-C took {waited} s to end the waiting run"
    assert (queued, admitted) == (0, 1)  # the holder's slot only
    assert lines[4:] == ["AFTER", "0"]
