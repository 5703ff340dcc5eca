"""ORT-compatible profiling: the trace's schema is checked against onnxruntime's own trace."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt

ort = pytest.importorskip("onnxruntime")

SITE = Path(__file__).resolve().parents[1] / "plugins" / "fixtures" / "site"
NODE_ARGS = {"op_name", "provider", "node_index", "input_type_shape", "output_type_shape", "output_size",
             "activation_size", "parameter_size"}
EVENT_FIELDS = {"cat", "pid", "tid", "dur", "ts", "ph", "name", "args"}


def _model() -> bytes:
    w = numpy_helper.from_array(np.arange(3, dtype=np.float32).reshape(1, 3), "w")
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["m"], name="mul0"),
        helper.make_node("Relu", ["m"], ["r"], name="relu0"),
        helper.make_node("Cast", ["r"], ["c"], name="cast0", to=TensorProto.INT64),
        helper.make_node("Shape", ["c"], ["s"], name="shape0"),
        helper.make_node("Greater", ["r", "m"], ["b"], name="greater0"),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("c", TensorProto.INT64, [2, 3]),
                           helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
                           helper.make_tensor_value_info("b", TensorProto.BOOL, [2, 3])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


FEEDS = {"x": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)}


def _trace(mod, model, prefix, runs=2, level=0, providers=("CPUExecutionProvider",)):
    so = mod.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(prefix)
    so.graph_optimization_level = mod.GraphOptimizationLevel.ORT_DISABLE_ALL if level == 0 else \
        mod.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = mod.InferenceSession(model, so, providers=list(providers))
    for _ in range(runs):
        sess.run(None, FEEDS)
    path = sess.end_profiling()
    with open(path) as f:
        return sess, path, json.load(f)


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("prof")
    model = _model()
    ours = _trace(rt, model, d / "ours")
    theirs = _trace(ort, model, d / "ort")
    return ours, theirs


def test_end_profiling_returns_the_written_file(traces):
    (sess, path, events), _ = traces
    assert os.path.isfile(path) and os.path.basename(path).startswith("ours_") and path.endswith(".json")
    assert isinstance(events, list) and events


def test_event_fields_are_onnxruntimes(traces):
    (_, _, ours), (_, _, theirs) = traces
    for e in theirs:
        assert set(e) == EVENT_FIELDS, e  # what onnxruntime writes (the test's premise)
    for e in ours:
        assert set(e) == EVENT_FIELDS, e
        assert e["ph"] == "X"
        assert isinstance(e["ts"], int) and isinstance(e["dur"], int) and e["ts"] >= 0 and e["dur"] >= 0
        assert e["pid"] == os.getpid() and isinstance(e["tid"], int)
    assert {e["cat"] for e in ours} == {e["cat"] for e in theirs} == {"Session", "Node"}


def test_session_events_are_onnxruntimes(traces):
    (_, _, ours), (_, _, theirs) = traces

    def names(evs):
        return sorted(e["name"] for e in evs if e["cat"] == "Session")

    assert names(ours) == names(theirs)
    assert names(ours).count("model_run") == 2  # one per run
    assert "model_loading_array" in names(ours) and "session_initialization" in names(ours)


def test_node_events_match_onnxruntime_per_node(traces):
    (_, _, ours), (_, _, theirs) = traces

    def nodes(evs):
        out = {}
        for e in evs:
            if e["cat"] == "Node":
                out.setdefault(e["name"], []).append(e["args"])
        return out

    a, b = nodes(ours), nodes(theirs)
    assert sorted(a) == sorted(b) == sorted(f"{n}_kernel_time" for n in
                                          ("mul0", "relu0", "cast0", "shape0", "greater0"))
    for name in a:
        assert len(a[name]) == len(b[name]) == 2
        ours_args, ort_args = a[name][0], b[name][0]
        assert set(ours_args) == NODE_ARGS
        assert NODE_ARGS <= set(ort_args)
        for k in ("op_name", "provider", "input_type_shape", "output_type_shape", "output_size",
                  "node_index", "parameter_size", "activation_size"):
            assert ours_args[k] == ort_args[k], (name, k, ours_args[k], ort_args[k])


def test_node_events_lie_inside_their_run(traces):
    (_, _, ours), _ = traces
    runs = [e for e in ours if e["name"] == "model_run"]
    for e in ours:
        if e["cat"] == "Node":
            assert any(r["ts"] <= e["ts"] and e["ts"] + e["dur"] <= r["ts"] + r["dur"] + 1 for r in runs), e


def test_profiling_off_returns_empty_and_wraps_nothing(tmp_path):
    sess = rt.InferenceSession(_model(), providers=["CPUExecutionProvider"])
    sess.run(None, FEEDS)
    assert sess.end_profiling() == ""
    from runtime_provider_cpu.executable import CPUExecutable

    exes = [st.executable for st in sess._plan.steps if hasattr(st, "executable")]
    assert exes and all(type(e) is CPUExecutable for e in exes)  # the plain run loop, no timing


def test_after_end_profiling_runs_are_not_recorded(tmp_path):
    so = rt.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "p")
    sess = rt.InferenceSession(_model(), so, providers=["CPUExecutionProvider"])
    first = sess.run(None, FEEDS)
    path = sess.end_profiling()
    assert sess.end_profiling() == ""
    again = sess.run(None, FEEDS)
    for x, y in zip(first, again):
        np.testing.assert_array_equal(x, y)
    with open(path) as f:
        assert sum(e["name"] == "model_run" for e in json.load(f)) == 1
    assert sess.get_profiling_start_time_ns() > 0


def test_profiled_outputs_equal_unprofiled(tmp_path):
    plain = rt.InferenceSession(_model(), providers=["CPUExecutionProvider"]).run(None, FEEDS)
    so = rt.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "p")
    prof = rt.InferenceSession(_model(), so, providers=["CPUExecutionProvider"]).run(None, FEEDS)
    for x, y in zip(plain, prof):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


def test_model_from_path_is_model_loading_uri(tmp_path):
    p = tmp_path / "m.onnx"
    p.write_bytes(_model())
    so = rt.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "p")
    sess = rt.InferenceSession(str(p), so, providers=["CPUExecutionProvider"])
    with open(sess.end_profiling()) as f:
        names = [e["name"] for e in json.load(f)]
    assert "model_loading_uri" in names and "model_loading_array" not in names


def test_parameter_size_counts_initializers(traces):
    (_, _, ours), _ = traces
    mm = next(e for e in ours if e["name"] == "mul0_kernel_time")
    assert mm["args"]["parameter_size"] == str(3 * 4)
    assert mm["args"]["activation_size"] == str(6 * 4)


def test_a_provider_without_per_node_timing_gets_one_event_per_partition(tmp_path):
    # the fixture's fake device runs whole partitions: each becomes one "Partition" event
    code = f"""
import json, numpy as np, runtime_core as rt
so = rt.SessionOptions(); so.enable_profiling = True; so.profile_file_prefix = {str(tmp_path / 'f')!r}
s = rt.InferenceSession(rt.cli.sample_model_path().read_bytes() if False else str(__import__('runtime_core.cli').cli.sample_model_path()), so, providers=['fakegpu', 'cpu'])
i = s.get_inputs()[0]
s.run(None, {{i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.float32)}})
ev = json.load(open(s.end_profiling()))
print(json.dumps(sorted({{(e['args']['provider'], e['args']['op_name'] == 'Partition') for e in ev if e['cat'] == 'Node'}})))
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SITE), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    kinds = {tuple(x) for x in json.loads(r.stdout.strip().splitlines()[-1])}
    assert ("FakeGpuExecutionProvider", True) in kinds
    assert ("CPUExecutionProvider", False) in kinds or all(p == "FakeGpuExecutionProvider" for p, _ in kinds)
