"""The kernel pool's load rule: while other processes' runnable threads fill the cores (at least
one a core, fewer than two), a job runs on its caller alone, and its result is the pooled one's
bit for bit (the kernel's parts do not depend on who runs them). The count of other threads is
forced here (``pool_load_rule(others=n)``); the conftest forces 0 for every other test."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt
from runtime_provider_cpu.fast.policy import NATIVE

pytestmark = pytest.mark.skipif(NATIVE is None, reason="the compiled extension is not built here")

JOBS, ALONE, JOB_NS, WAIT_NS, LOAD_ALONE = 6, 7, 8, 9, 10  # fields of pool_stats()


def _cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


@pytest.fixture
def others():
    """Set the other runnable threads the rule assumes; restored after the test."""
    before = NATIVE.pool_load_rule()

    def force(n, on=True):
        NATIVE.pool_load_rule(on, n)

    yield force
    NATIVE.pool_load_rule(*before)


def _probe(threads=2, part_us=200):
    counts = np.zeros(64, np.int32)
    by_workers = NATIVE.pool_probe(counts, threads, 0, part_us)
    np.testing.assert_array_equal(counts, np.ones(64, np.int32))  # each part exactly once
    return by_workers


@pytest.mark.kernel
def test_the_rule_says_full_only_while_other_threads_fill_the_cores(others):
    c = _cores()
    verdict = {}
    for n in (0, c - 1, c, 2 * c - 1, 2 * c, 10 * c):
        others(n)
        verdict[n] = NATIVE.pool_load_full()
    assert verdict == {0: False, c - 1: False, c: True, 2 * c - 1: True, 2 * c: False, 10 * c: False}
    others(c, on=False)  # the rule off: never full
    assert NATIVE.pool_load_full() is False


@pytest.mark.kernel
def test_a_full_machine_runs_each_job_on_its_caller_alone(others):
    others(_cores())
    before = NATIVE.pool_stats()
    for _ in range(20):
        assert _probe() == 0  # no worker ran a part
    after = NATIVE.pool_stats()
    assert after[LOAD_ALONE] - before[LOAD_ALONE] == 20
    assert after[JOBS] == before[JOBS]  # none was opened to the workers
    assert NATIVE.pool_stats()[1] == 1


@pytest.mark.kernel
def test_past_the_band_and_below_it_the_workers_join_again(others):
    for n in (0, 2 * _cores()):
        others(n)
        before = NATIVE.pool_stats()
        for _ in range(200):
            if _probe():
                break
        else:
            pytest.fail(f"no pool worker joined a 2-thread job in 200 tries with {n} other threads")
        after = NATIVE.pool_stats()
        assert after[LOAD_ALONE] == before[LOAD_ALONE]
        assert after[JOBS] > before[JOBS]


@pytest.mark.kernel
def test_the_pooled_jobs_are_counted_with_their_time_and_waits(others):
    others(0)
    before = NATIVE.pool_stats()
    joined = sum(_probe() > 0 for _ in range(50))
    after = NATIVE.pool_stats()
    jobs, alone = after[JOBS] - before[JOBS], after[ALONE] - before[ALONE]
    assert jobs == 50
    assert jobs - alone >= joined  # a job a worker ran a part of is not counted alone
    job_ns, wait_ns = after[JOB_NS] - before[JOB_NS], after[WAIT_NS] - before[WAIT_NS]
    assert job_ns >= 50 * 64 * 200_000 / 2  # 64 parts of 200 us each, at most two threads a job
    assert 0 <= wait_ns <= job_ns


@pytest.mark.kernel
def test_the_count_read_from_proc_loadavg_gives_a_verdict(others):
    others(-1)
    full = NATIVE.pool_load_full()
    assert isinstance(full, bool)
    _probe()  # the parts run once whatever the verdict


@pytest.mark.kernel
def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="others"):
        NATIVE.pool_load_rule(True, -2)
    with pytest.raises(TypeError):
        NATIVE.pool_load_rule(True, "2")


def test_the_environment_variable_turns_the_rule_off():
    code = (
        "from runtime_provider_cpu.fast.policy import NATIVE as N; import os\n"
        "c = len(os.sched_getaffinity(0)); before = N.pool_load_rule(others=c)\n"
        "print(before[0], N.pool_load_full())"
    )
    env = dict(os.environ, RUNTIME_CORE_CPU_POOL_LOAD="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
    env["RUNTIME_CORE_CPU_POOL_LOAD"] = "1"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]


def _model():
    rng = np.random.default_rng(7)
    w1 = numpy_helper.from_array(rng.standard_normal((32, 16, 3, 3)).astype(np.float32) * 0.1, "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((48, 32, 1, 1)).astype(np.float32) * 0.1, "w2")
    wm = numpy_helper.from_array(rng.standard_normal((48, 20)).astype(np.float32) * 0.1, "wm")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["r", "w2"], ["b"]),
        helper.make_node("GlobalAveragePool", ["b"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("MatMul", ["f", "wm"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16, 48, 48])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, None),
        ],
        [w1, w2, wm],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_a_session_run_alone_for_the_load_matches_its_pooled_run_bit_for_bit(others):
    ort = pytest.importorskip("onnxruntime")
    data = _model()
    x = np.random.default_rng(8).standard_normal((2, 16, 48, 48)).astype(np.float32)
    so = rt.SessionOptions()
    so.intra_op_num_threads = 2
    sess = rt.InferenceSession(data, so, providers=["cpu"])
    others(0)
    pooled = sess.run(None, {"x": x})
    others(_cores())
    before = NATIVE.pool_stats()
    alone = sess.run(None, {"x": x})
    assert NATIVE.pool_stats()[LOAD_ALONE] > before[LOAD_ALONE]  # its kernels' jobs ran alone
    for p, a in zip(pooled, alone):
        np.testing.assert_array_equal(p, a)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for a, w in zip(alone, want):
        np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-4)


def test_the_concurrency_benchmark_pairs_the_rule_on_and_off(tmp_path):
    import json
    from pathlib import Path

    script = Path(__file__).resolve().parents[3] / "benchmarks" / "concurrency.py"
    model = tmp_path / "m.onnx"
    model.write_bytes(_model())
    np.savez(tmp_path / "m.npz", x=np.zeros((2, 16, 48, 48), np.float32))
    cmd = [sys.executable, str(script), "--model", str(model), "--worker", "latency", "--runtime", "runtime_core",
           "--paired", "--pool-load-ab", "--block", "2", "--seconds", "0", "--min-runs", "4"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(got) == {"0", "1", "0-off", "loop"}  # "loop": the scheduler's floor, no runtime
    for key, v in got.items():
        assert v["n"] >= 4 and v["p10"] <= v["p50"] <= v["p90"]
        if key != "loop":
            assert {"stalls", "jobs", "unjoined", "wait_ms", "load_alone"} <= set(v)
            assert 0 <= v["unjoined"] <= v["jobs"]
    assert got["1"]["jobs"] == 0  # one thread opens no job to the workers
    # the loop is sized to a default run's uninterrupted time: a busy machine lengthens either, but
    # the loop is not a no-op beside the runs
    assert got["loop"]["p50"] > 0.25 * min(got["0"]["p10"], got["1"]["p10"])
    assert got["0-off"]["load_alone"] == 0  # the rule off never runs a job alone for the load


def test_the_concurrency_benchmark_times_a_no_runtime_floor_and_pauses_between_runs(tmp_path):
    import json
    import time
    from pathlib import Path

    script = Path(__file__).resolve().parents[3] / "benchmarks" / "concurrency.py"
    # the floor: a fixed CPU loop calibrated to --floor-ms on its uninterrupted time, no model loaded
    cmd = [sys.executable, str(script), "--model", str(tmp_path / "absent.onnx"), "--worker", "floor",
           "--floor-ms", "3", "--seconds", "0", "--min-runs", "15"]
    got = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True,
                                    timeout=300).stdout.strip().splitlines()[-1])
    assert got["n"] >= 15 and got["p10"] <= got["p50"] <= got["p90"]
    assert got["p10"] > 0.75  # calibrated to ~3 ms: a busy machine lengthens a call, never shortens it
    # --gap-ms: an untimed pause after each run; the runs' own times stay the runs' alone
    model = tmp_path / "m.onnx"
    model.write_bytes(_model())
    np.savez(tmp_path / "m.npz", x=np.zeros((2, 16, 48, 48), np.float32))
    cmd = [sys.executable, str(script), "--model", str(model), "--worker", "latency", "--runtime", "runtime_core",
           "--paired", "--block", "2", "--seconds", "0", "--min-runs", "6", "--gap-ms", "50", "--no-floor"]
    t0 = time.perf_counter()
    got = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True,
                                    timeout=300).stdout.strip().splitlines()[-1])
    assert time.perf_counter() - t0 > 12 * 0.05  # 6 runs of each series, a pause after each
    assert set(got) == {"0", "1"} and all(v["n"] >= 6 for v in got.values())
    assert got["1"]["p50"] < 50  # the pause is not in a run's time
