"""Kernels chosen on this machine (``fast/autotune.py``): every candidate, forced, gives the
library call's result; a measured choice is cached on disk per machine and shape and read
back; a corrupt cache is ignored; ``session.cpu.autotune`` = "0" takes the library call."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import helper

import runtime_core as rt
from oracle import assert_close, make_model, run_oracle

RNG = np.random.default_rng(27)


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def session(model, tune="1", threads=2):
    so = rt.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.cpu.autotune", tune)
    return rt.InferenceSession(model.SerializeToString(), so, providers=["cpu"])


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    from runtime_provider_cpu.fast import autotune

    monkeypatch.setenv(autotune.DIR_ENV, str(tmp_path))
    autotune.forget()
    yield tmp_path
    autotune.forget()


def _linear_models():
    a = rnd(3, 5, 48)
    yield "matmul", make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": a}, ["y"],
                               initializers={"b": rnd(48, 40)}), {"a": a}
    a = rnd(6, 64)
    yield "gemm", make_model([helper.make_node("Gemm", ["a", "b", "c"], ["y"], transB=1, alpha=0.5)], {"a": a},
                             ["y"], opset=13, initializers={"b": rnd(33, 64), "c": rnd(33)}), {"a": a}
    a, b = rnd(20, 30), rnd(30, 50)
    yield "fed", make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": a, "b": b}, ["y"]), \
        {"a": a, "b": b}


@pytest.mark.parametrize("case", ["matmul", "gemm", "fed"])
@pytest.mark.parametrize("name", ["packed", "stream", "rows"])
def test_every_linear_candidate_gives_the_library_result(case, name, cpu_policy):
    from runtime_provider_cpu.fast import policy

    if policy.NATIVE is None:
        pytest.skip(policy.NATIVE_ERROR)
    model, feeds = next((m, f) for c, m, f in _linear_models() if c == case)
    cpu_policy(linear_kernel="blas")
    want = session(model).run(None, feeds)
    cpu_policy(linear_kernel=name)
    sess = session(model)
    got = sess.run(None, feeds)
    applies = (name == "packed" and case != "fed" and policy.current().linear) or (
        name == "stream" and case == "fed" and policy.current().linear) or (name == "rows" and case == "gemm")
    assert set(sess.get_partition_report().kernels.values()) == {name if applies else "blas"}
    assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert_close(got, run_oracle(model, feeds), rtol=1e-4, atol=1e-4)


CONVS = [  # (x shape, w shape, group, strides, pads): each algorithm applies to one at least
    ((1, 16, 12, 12), (24, 16, 3, 3), 1, [1, 1], [1, 1, 1, 1]),    # winograd, direct
    ((2, 8, 11, 9), (12, 8, 5, 5), 1, [2, 2], [2, 1, 2, 1]),       # direct at batch 2
    ((1, 24, 10, 10), (40, 24, 1, 1), 1, [1, 1], [0, 0, 0, 0]),    # pointwise
    ((1, 24, 10, 10), (40, 24, 1, 1), 1, [2, 2], [0, 0, 0, 0]),    # strided pointwise
    ((2, 16, 9, 9), (16, 1, 3, 3), 16, [2, 2], [1, 1, 1, 1]),      # depthwise
]


@pytest.mark.parametrize("conv", range(len(CONVS)))
@pytest.mark.parametrize("name", ["im2col_sgemm", "winograd", "direct", "pointwise", "depthwise", "depthwise_lanes"])
def test_every_conv_candidate_gives_the_library_result(conv, name, cpu_policy):
    from runtime_provider_cpu.fast import policy

    if policy.NATIVE is None:
        pytest.skip(policy.NATIVE_ERROR)
    xs, ws, group, strides, pads = CONVS[conv]
    x = rnd(*xs)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=group, strides=strides, pads=pads)
    model = make_model([node], {"x": x}, ["y"], opset=11, initializers={"w": rnd(*ws) * 0.2, "b": rnd(ws[0])})
    cpu_policy(conv_kernel="im2col", direct=True)
    want = session(model).run(None, {"x": x})
    cpu_policy(conv_kernel=name)
    sess = session(model)
    got = sess.run(None, {"x": x})
    assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert_close(got, run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-5)
    chosen = sess.get_partition_report().kernels
    assert list(chosen.values())[0] in (name, "im2col")


def test_every_attention_candidate_gives_the_library_result(cpu_policy):
    from runtime_provider_cpu.fast import policy

    if policy.NATIVE is None:
        pytest.skip(policy.NATIVE_ERROR)
    B, S, D, H = 2, 9, 32, 4
    x, mask = rnd(B, S, D), (RNG.random((B, S)) > 0.3).astype(np.int32)
    node = helper.make_node("Attention", ["x", "w", "bias", "m"], ["y"], domain="com.microsoft", num_heads=H)
    model = make_model([node], {"x": x, "m": mask}, ["y"], opset=13,
                       initializers={"w": rnd(D, 3 * D) * 0.2, "bias": rnd(3 * D)},
                       extra_opsets={"com.microsoft": 1})
    cpu_policy(mha_kernel="numpy", linear_kernel="blas")
    want = session(model).run(None, {"x": x, "m": mask})
    cpu_policy(mha_kernel="native")
    got = session(model).run(None, {"x": x, "m": mask})
    assert_close(got, want, rtol=1e-5, atol=1e-5)


def _mlp():
    a = rnd(16, 96)
    nodes = [helper.make_node("MatMul", ["a", "w1"], ["h"], name="first"),
             helper.make_node("Sigmoid", ["h"], ["r"]),  # not Relu: MatMul + Relu fuses at ALL
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="second")]
    return make_model(nodes, {"a": a}, ["y"], initializers={"w1": rnd(96, 128), "w2": rnd(128, 64)}), {"a": a}


@pytest.mark.native  # a choice among compiled candidates and the library call
def test_a_measured_choice_is_cached_on_disk_and_read_back(cache_dir, monkeypatch, linear_tiles):
    from runtime_provider_cpu.fast import autotune

    monkeypatch.setattr(autotune, "NOISY_SHARE", float("inf"))  # written even beside busy processes
    model, feeds = _mlp()
    want = run_oracle(model, feeds)
    sess = session(model)
    assert_close(sess.run(None, feeds), want, rtol=1e-4, atol=1e-4)
    chosen = sess.get_partition_report().kernels
    assert set(chosen) == {"first", "second"} and set(chosen.values()) <= {"blas", "packed", "rows"}
    files = [p for p in os.listdir(cache_dir) if p.startswith("autotune-")]
    assert len(files) == 1 and files[0].endswith(".json")  # no temporary file left behind
    data = json.loads((cache_dir / files[0]).read_text())
    assert data["machine"] == autotune.machine() and len(data["choices"]) == 2
    assert "kernels chosen on this machine" in str(sess.get_partition_report())
    # a new process (memory forgotten) takes the file's choices without measuring
    autotune.forget()

    def no_measuring(*args):
        raise AssertionError("measured again")

    monkeypatch.setattr(autotune, "measure", no_measuring)
    again = session(model)
    assert_close(again.run(None, feeds), want, rtol=1e-4, atol=1e-4)
    assert again.get_partition_report().kernels == chosen


@pytest.mark.native  # a choice among compiled candidates and the library call
def test_a_corrupt_cache_is_ignored_with_a_warning(cache_dir, caplog, monkeypatch, linear_tiles):
    from runtime_provider_cpu.fast import autotune

    monkeypatch.setattr(autotune, "NOISY_SHARE", float("inf"))  # written even beside busy processes
    path = autotune.cache_path()
    with open(path, "w") as f:
        f.write('{"choices": [1, 2')
    model, feeds = _mlp()
    with caplog.at_level(logging.WARNING, logger="runtime_provider_cpu"):
        out = session(model).run(None, feeds)
    assert any("ignoring the kernel choice cache" in r.getMessage() for r in caplog.records)
    assert_close(out, run_oracle(model, feeds), rtol=1e-4, atol=1e-4)
    assert len(json.loads(open(path).read())["choices"]) == 2  # replaced by a valid file


@pytest.mark.native  # a choice among compiled candidates and the library call
def test_tuning_off_takes_the_library_calls(cache_dir):
    model, feeds = _mlp()
    sess = session(model, tune="0")
    assert_close(sess.run(None, feeds), run_oracle(model, feeds), rtol=1e-4, atol=1e-4)
    assert sess.get_partition_report().kernels == {"first": "blas", "second": "blas"}
    assert not os.listdir(cache_dir)  # nothing measured, nothing written
    with pytest.raises(rt.errors.InvalidArgumentError, match="session.cpu.autotune"):
        session(model, tune="yes")


def test_without_the_compiled_kernels(tmp_path):
    """``RUNTIME_CORE_CPU_NATIVE=0``: the provider behaves as a build without ``_native``:
    the probe says so and a model with Linear, Conv and Gelu runs on the numpy paths."""
    code = """if True:
        import numpy as np, runtime_core as rt
        from onnx import helper
        from oracle import make_model, run_oracle, assert_close
        from runtime_provider_cpu.fast import policy
        assert policy.NATIVE is None and "RUNTIME_CORE_CPU_NATIVE" in policy.NATIVE_ERROR
        r = np.random.default_rng(0)
        x = r.standard_normal((1, 4, 8, 8)).astype(np.float32)
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                 helper.make_node("Flatten", ["c"], ["f"]), helper.make_node("MatMul", ["f", "m"], ["y"])]
        inits = {"w": r.standard_normal((6, 4, 3, 3)).astype(np.float32),
                 "m": r.standard_normal((384, 10)).astype(np.float32)}
        model = make_model(nodes, {"x": x}, ["y"], opset=13, initializers=inits)
        s = rt.InferenceSession(model.SerializeToString(), providers=["cpu"])
        assert_close(s.run(None, {"x": x}), run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-4)
        print(rt.get_provider_info())
    """
    env = dict(os.environ, RUNTIME_CORE_CPU_NATIVE="0")
    tests = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = tests + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "no compiled kernels (disabled by RUNTIME_CORE_CPU_NATIVE=0)" in out.stdout


@pytest.mark.parametrize("k,s", [(3, 1), (5, 2), (7, 1)])
def test_depthwise_on_the_phase_planes_is_not_timed_against_numpy(k, s, cache_dir, monkeypatch):
    # the AVX-512 depthwise kernels are taken without timing numpy's per-tap passes against
    # them (a loaded machine could cache the slow one): only the two layouts are timed
    from runtime_provider_cpu.fast import autotune, policy

    if not getattr(policy.NATIVE, "CONV_FAST", 0):
        pytest.skip("the phase-plane depthwise kernel needs the AVX-512 build (CONV_FAST)")
    timed = []
    real = autotune.measure
    monkeypatch.setattr(autotune, "measure", lambda key, runners: (timed.append(sorted(runners)), real(key, runners))[1])
    x = rnd(1, 8, 15, 15)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=8, strides=[s, s], pads=[k // 2] * 4)
    model = make_model([node], {"x": x}, ["y"], opset=11, initializers={"w": rnd(8, 1, k, k), "b": rnd(8)})
    sess = session(model)
    for _ in range(2):
        assert_close(sess.run(None, {"x": x}), run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-5)
    assert list(sess.get_partition_report().kernels.values())[0] in ("depthwise", "depthwise_lanes")
    assert timed == [["depthwise", "depthwise_lanes"]]


def test_quick_candidates_get_more_rounds_so_one_preempted_call_cannot_decide(cache_dir, monkeypatch):
    from runtime_provider_cpu.fast import autotune

    clock = {"t": 0.0}
    monkeypatch.setattr(autotune.time, "perf_counter", lambda: clock["t"])
    # "fast" takes 1 us but was preempted (1 ms) in each of its first three timed calls;
    # "slow" always takes 8 us: three rounds would keep "slow"
    calls = {"fast": 0, "slow": 0}

    def runner(name, cost):
        def run():
            calls[name] += 1
            clock["t"] += cost(calls[name])
        return run

    name, best = autotune.measure("k-quick", {
        "fast": runner("fast", lambda i: 1e-3 if 2 <= i <= 4 else 1e-6),
        "slow": runner("slow", lambda i: 8e-6)})
    assert name == "fast" and best["fast"] == pytest.approx(1e-6)
    assert calls["fast"] == 1 + autotune.MAX_ROUNDS  # the untimed call and every round

    # a candidate that takes longer than QUICK_S a call stops at ROUNDS as before
    calls.update(fast=0, slow=0)
    autotune.measure("k-long", {"fast": runner("fast", lambda i: 0.02), "slow": runner("slow", lambda i: 0.03)})
    assert calls["fast"] == 1 + autotune.ROUNDS


def test_a_choice_measured_beside_busy_threads_is_not_kept_on_disk(cache_dir, monkeypatch):
    from runtime_provider_cpu.fast import autotune

    clock = {"t": 0.0}
    monkeypatch.setattr(autotune.time, "perf_counter", lambda: clock["t"])
    waited = {"ns": 0}  # this process's threads' time runnable without a core
    monkeypatch.setattr(autotune, "contention", lambda: (waited["ns"], 0.0))
    monkeypatch.setattr(autotune, "GROUP_S", 0.0)  # a reading after every round
    monkeypatch.setattr(autotune, "crowded", lambda: False)  # the machine's own load out of the test

    def runner(cost, wait):
        def run():
            clock["t"] += cost
            waited["ns"] += int(wait * 1e9)
        return run

    def on_disk():
        files = [p for p in os.listdir(cache_dir) if p.startswith("autotune-")]
        return json.loads((cache_dir / files[0]).read_text())["choices"] if files else {}

    # quiet: the waits stay under NOISY_SHARE of the measurement: written
    name, _ = autotune.measure("k-quiet", {"a": runner(1e-3, 0.0), "b": runner(2e-3, 1e-5)})
    assert name == "a" and on_disk() == {"k-quiet": "a"}
    # busy: the threads waited a quarter of every call: held in memory only
    name, _ = autotune.measure("k-busy", {"a": runner(2e-3, 5e-4), "b": runner(1e-3, 2.5e-4)})
    assert name == "b" and on_disk() == {"k-quiet": "a"}
    assert autotune.decide("linear", "k-busy", ["a", "b"], "a") == "b"  # this process keeps it
    autotune.forget()  # a new process measures it again
    assert autotune.decide("linear", "k-busy", ["a", "b"], "a") is None
    assert autotune.decide("linear", "k-quiet", ["a", "b"], "b") == "a"


def test_contention_reads_this_process_and_the_machine():
    from runtime_provider_cpu.fast import autotune

    got = autotune.contention()
    if not os.path.exists("/proc/self/task"):
        assert got is None
        return
    assert got is not None and got[0] >= 0 and got[1] >= 0
    later = autotune.contention()
    assert later[0] >= got[0] and later[1] >= got[1]  # counted since boot: never backwards
    assert autotune.noise(got, None, 1.0) == 0.0 and autotune.noise(None, later, 1.0) == 0.0
    assert autotune.noise((0, 0.0), (int(2e8), 1e8), 1.0) == pytest.approx(0.3)


def test_a_noisy_measurement_is_kept_on_disk_where_its_quiet_rounds_agree(cache_dir, monkeypatch):
    from runtime_provider_cpu.fast import autotune

    clock = {"t": 0.0}
    monkeypatch.setattr(autotune.time, "perf_counter", lambda: clock["t"])
    waited = {"ns": 0}
    monkeypatch.setattr(autotune, "contention", lambda: (waited["ns"], 0.0))
    monkeypatch.setattr(autotune, "GROUP_S", 0.0)  # a reading after every round
    monkeypatch.setattr(autotune, "crowded", lambda: False)  # the machine's own load out of the test
    noisy_rounds = 10  # of MAX_ROUNDS: the threads waited as long as the calls ran

    def runner(noisy_cost, quiet_cost):
        calls = {"n": 0}

        def run():
            calls["n"] += 1
            rnd = calls["n"] - 1  # the first call is untimed
            cost = noisy_cost if rnd <= noisy_rounds else quiet_cost
            clock["t"] += cost
            if rnd <= noisy_rounds:
                waited["ns"] += int(cost * 1e9)
        return run

    def on_disk():
        files = [p for p in os.listdir(cache_dir) if p.startswith("autotune-")]
        return json.loads((cache_dir / files[0]).read_text())["choices"] if files else {}

    # most of the time noisy, but the quiet rounds pick the same candidate: written
    name, _ = autotune.measure("k-agree", {"a": runner(1e-4, 1e-4), "b": runner(2e-4, 2e-4)})
    assert name == "a" and on_disk() == {"k-agree": "a"}
    # the best times come from noisy rounds and the quiet rounds pick the other: memory only
    name, _ = autotune.measure("k-disagree", {"a": runner(1e-4, 3e-4), "b": runner(2e-4, 2e-4)})
    assert name == "a" and on_disk() == {"k-agree": "a"}
    assert autotune.decide("linear", "k-disagree", ["a", "b"], "b") == "a"


def test_a_wait_counted_only_in_the_next_round_still_makes_a_round_noisy(cache_dir, monkeypatch):
    """A worker queued when a round ends has its wait counted when it gets a core back: in the
    next reading. A round is quiet only when the reading after the next round is quiet too."""
    from runtime_provider_cpu.fast import autotune

    clock = {"t": 0.0}
    monkeypatch.setattr(autotune.time, "perf_counter", lambda: clock["t"])
    waited = {"ns": 0, "owed": 0}
    monkeypatch.setattr(autotune, "contention", lambda: (waited["ns"], 0.0))
    monkeypatch.setattr(autotune, "GROUP_S", 0.0)  # a reading after every round
    monkeypatch.setattr(autotune, "crowded", lambda: False)  # the machine's own load out of the test

    calls = {"n": 0}

    def pooled():  # truly 0.1 ms, but every timed call lost 0.2 ms to a worker's wait, seen a call late
        calls["n"] += 1
        waited["ns"] += waited["owed"]
        clock["t"] += 3e-4
        waited["owed"] = int(2e-4 * 1e9) if calls["n"] > 1 else 0  # the first call is untimed

    def alone():
        clock["t"] += 2e-4

    name, _ = autotune.measure("k-late", {"pooled": pooled, "alone": alone})
    # the first round's reading shows no wait (it comes a round late): alone, the faster only
    # because pooled was slowed, must not be kept on disk on that round's word
    files = [p for p in os.listdir(cache_dir) if p.startswith("autotune-")]
    assert name == "alone" and not files


def test_rounds_on_a_crowded_machine_do_not_confirm_a_noisy_choice(cache_dir, monkeypatch):
    """Every round looked quiet to this process's counters, but more threads were runnable than
    cores (a queued worker's wait not counted yet): the noisy measurement stays in memory."""
    from runtime_provider_cpu.fast import autotune

    clock = {"t": 0.0}
    monkeypatch.setattr(autotune.time, "perf_counter", lambda: clock["t"])
    waited = {"ns": 0}
    monkeypatch.setattr(autotune, "contention", lambda: (waited["ns"], 0.0))
    monkeypatch.setattr(autotune, "GROUP_S", 0.0)  # a reading after every round

    def runner(cost):
        def run():
            clock["t"] += cost
        return run

    def run(key, crowded, wait_at_end):
        monkeypatch.setattr(autotune, "crowded", lambda: crowded)
        clock["t"] = 0.0
        measured = {"a": runner(1e-4), "b": runner(2e-4)}
        # the whole measurement noisy: a wait counted at the last reading
        last = measured["b"]

        def b_then_wait():
            last()
            if clock["t"] > 3e-3:
                waited["ns"] += wait_at_end
        measured["b"] = b_then_wait
        autotune.measure(key, measured)
        files = [p for p in os.listdir(cache_dir) if p.startswith("autotune-")]
        return json.loads((cache_dir / files[0]).read_text())["choices"] if files else {}

    assert run("k-crowded", True, int(1e9)) == {}
    assert run("k-uncrowded", False, int(1e9)) == {"k-uncrowded": "a"}


def test_quick_rounds_are_read_for_noise_in_groups(cache_dir, monkeypatch):
    from runtime_provider_cpu.fast import autotune

    clock = {"t": 0.0}
    monkeypatch.setattr(autotune.time, "perf_counter", lambda: clock["t"])
    reads = []
    monkeypatch.setattr(autotune, "contention", lambda: reads.append(clock["t"]) or (0, 0.0))
    monkeypatch.setattr(autotune, "crowded", lambda: False)

    def runner(cost):
        def run():
            clock["t"] += cost
        return run

    # 15 rounds of 0.1 ms: one reading before, one a GROUP_S (1 ms), one at the end
    autotune.measure("k-groups", {"a": runner(4e-5), "b": runner(6e-5)})
    assert len(reads) == 1 + int(15 * 1e-4 / autotune.GROUP_S) + 1
    assert all(b - a >= autotune.GROUP_S - 1e-9 for a, b in zip(reads[1:-1], reads[2:-1]))
