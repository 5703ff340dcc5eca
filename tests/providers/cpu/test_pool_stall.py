"""The kernel pool under a stalled worker, and the per-run choice between the pool and the caller
alone (execution/solo.py). A stall (a caller left waiting on a part a descheduled worker holds)
still runs every part exactly once and is counted in pool_stats; the pool does not act on it (a
guard that ran jobs alone after one fired on a quiet virtual machine's uneven parts). No timing
is asserted beyond the simulated stall itself (20 ms against parts of 20 us)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt
from runtime_provider_cpu.fast.policy import NATIVE

pytestmark = pytest.mark.skipif(NATIVE is None, reason="the compiled extension is not built here")

STALLS = 5  # the field of pool_stats()


@pytest.mark.kernel
def test_a_stalled_worker_still_runs_each_part_once_and_the_stall_is_counted():
    for _ in range(100):
        before = NATIVE.pool_stats()
        counts = np.zeros(64, np.int32)
        by_workers = NATIVE.pool_probe(counts, 2, 20000, 20)
        # each part exactly once, whoever ran it and however long it stalled
        np.testing.assert_array_equal(counts, np.ones(64, np.int32))
        after = NATIVE.pool_stats()
        if by_workers and after[STALLS] > before[STALLS]:
            # the pool is not held back by it: a worker joins the next job
            for _ in range(200):
                counts = np.zeros(64, np.int32)
                if NATIVE.pool_probe(counts, 2, 0, 200):
                    np.testing.assert_array_equal(counts, np.ones(64, np.int32))
                    return
            pytest.fail("no pool worker joined a job after a stall")
    pytest.fail("no pool worker joined a 2-thread job in 100 tries")


@pytest.mark.kernel
def test_probe_rejects_bad_arguments():
    with pytest.raises(ValueError):
        NATIVE.pool_probe(np.zeros(0, np.int32), 2, 0)
    with pytest.raises(ValueError):
        NATIVE.pool_probe(np.zeros(4, np.int32), 2, -1)
    with pytest.raises(ValueError):
        NATIVE.pool_probe(np.zeros(4, np.int32), 2, 0, 10**6)


def _conv_model():
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((32, 16, 3, 3)).astype(np.float32) * 0.1, "w")
    b = numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b")
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])
    g = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 40, 40])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


class _FakeNative:
    def __init__(self):
        self.solo = False

    def run_solo(self, on):
        before, self.solo = self.solo, bool(on)
        return before


def _drive(chooser, native, runs, alone_ms, pooled_ms):
    """Runs through ``chooser`` whose time is the mode's (fed to record, not slept);
    ``pooled_ms`` may be a function of the run's index (a loaded machine's uneven times)."""
    modes = []
    for i in range(runs):
        alone = chooser.alone("sig")
        modes.append(alone)
        ms = alone_ms if alone else (pooled_ms(i) if callable(pooled_ms) else pooled_ms)
        chooser.record("sig", alone, int(ms * 1e6))
    return modes


def _loaded(i):  # pooled runs beside busy processes: most lose a scheduler slice
    return 10.0 if i % 4 == 0 else 40.0


def test_a_quiet_machine_never_runs_alone():
    from runtime_provider_cpu.execution import solo

    c = solo.SoloChooser(_FakeNative())
    # even where alone would be faster, steady pooled times show no load: the pool is kept
    assert not any(_drive(c, None, 300, alone_ms=5.0, pooled_ms=lambda i: 10.0 + (i % 3) * 0.5))


def test_under_load_the_solo_chooser_picks_the_faster_mode_and_keeps_exploring():
    from runtime_provider_cpu.execution import solo

    c = solo.SoloChooser(_FakeNative())
    modes = _drive(c, None, 200, alone_ms=12.0, pooled_ms=_loaded)
    assert not any(modes[: solo._WARM + solo._SAMPLES])  # warm-up, then pooled until the load shows
    late = modes[100:]
    assert sum(late) > 0.75 * len(late) and not all(late)  # mostly alone, the pool tried now and then
    c = solo.SoloChooser(_FakeNative())
    late = _drive(c, None, 200, alone_ms=60.0, pooled_ms=_loaded)[100:]
    assert sum(late) < 0.1 * len(late) and any(late)  # loaded, but alone is slower still
    c = solo.SoloChooser(_FakeNative())  # within the margin the pool stays
    late = _drive(c, None, 200, alone_ms=31.0, pooled_ms=lambda i: 10.0 if i % 4 else 40.0)[100:]
    assert sum(late) < 0.1 * len(late)


def test_the_solo_chooser_follows_a_change_of_load():
    from runtime_provider_cpu.execution import solo

    c = solo.SoloChooser(_FakeNative())
    assert sum(_drive(c, None, 100, alone_ms=12.0, pooled_ms=_loaded)[-50:]) > 40
    # the load goes: pooled runs back at 10 ms, alone 20 ms; the pool is taken and alone no longer tried
    late = _drive(c, None, 600, alone_ms=20.0, pooled_ms=10.0)[-200:]
    assert not any(late)


def _choosers():
    import gc

    from runtime_provider_cpu.execution import solo

    return [o for o in gc.get_objects() if isinstance(o, solo.SoloChooser)]


def test_a_run_alone_restores_the_threads_setting_and_matches_a_pooled_run(monkeypatch):
    ort = pytest.importorskip("onnxruntime")
    from runtime_provider_cpu.execution import solo

    monkeypatch.setattr(solo, "_CONTENDED", 0.0)  # any pooled time looks loaded: runs alternate
    data = _conv_model()
    x = np.random.default_rng(5).standard_normal((1, 16, 40, 40)).astype(np.float32)
    so = rt.SessionOptions()
    so.intra_op_num_threads = 2
    so.add_session_config_entry("session.cpu.solo_choice", "1")
    before = {id(c) for c in _choosers()}
    sess = rt.InferenceSession(data, so, providers=["cpu"])
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for _ in range(16):  # past the warm-up and 5 pooled runs: runs alternate between the modes
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)
    assert NATIVE.run_solo(False) is False  # the run put this thread's setting back
    mine = [c for c in _choosers() if id(c) not in before]
    assert len(mine) == 1 and any(len(t.alone) for t in mine[0]._by_sig.values())


def test_the_solo_choice_is_off_unless_asked_and_its_value_is_checked():
    so = rt.SessionOptions()
    so.intra_op_num_threads = 2
    before = {id(c) for c in _choosers()}
    sess = rt.InferenceSession(_conv_model(), so, providers=["cpu"])
    assert not [c for c in _choosers() if id(c) not in before]
    del sess
    so.add_session_config_entry("session.cpu.solo_choice", "yes")
    with pytest.raises(rt.errors.InvalidArgumentError, match="solo_choice"):
        rt.InferenceSession(_conv_model(), so, providers=["cpu"])
