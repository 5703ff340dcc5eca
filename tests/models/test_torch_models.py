"""PyTorch models exported at test time with both exporters, run on CPU, compared with onnxruntime.

Each (model, exporter, opset) is exported once (module-scoped fixture) by
``models/builders.py``; the tests then check runtime-core against onnxruntime at the export
batch and at another batch size (the batch axis, and the sequence axis of the transformers,
are dynamic), at every graph-optimization level, and that every node ran on the CPU provider.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is a test-only dependency (pip install torch==2.13.0)")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the test oracle")

import runtime_core as rt  # noqa: E402
from models import builders as B  # noqa: E402
from oracle import assert_close  # noqa: E402

RTOL, ATOL = 1e-3, 1e-4
CPU = "CPUExecutionProvider"

CASES = [(name, exporter, opset) for name in B.TORCH_MODELS for exporter, opset in B.TORCH_EXPORTS]


def _case_id(case):
    name, exporter, opset = case
    return f"{name}-{exporter}-op{opset}"


@pytest.fixture(scope="module", params=CASES, ids=[_case_id(c) for c in CASES])
def exported(request):
    name, exporter, opset = request.param
    if exporter == "dynamo":
        pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
    try:
        return B.export_torch(name, exporter, opset)
    except Exception as exc:
        why = B.TORCH_UNEXPORTABLE.get(request.param)
        if why is None:
            raise
        msg = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        pytest.skip(f"the {exporter} exporter cannot produce {name} at opset {opset}: {why} "
                    f"[{type(exc).__name__}: {msg}]")


class Oracle:
    """onnxruntime's session and its outputs for both feed sets."""

    def __init__(self, ex: B.TorchExport):
        so = ort.SessionOptions()
        so.log_severity_level = 3
        self.sess = ort.InferenceSession(ex.model, so, providers=[CPU])
        self.out = self.sess.run(None, ex.feeds)
        self.export_out = self.sess.run(None, ex.export_feeds)


@pytest.fixture(scope="module")
def oracle(exported):
    return Oracle(exported)


def assert_all_on_cpu(sess):
    rep = sess.get_partition_report()
    assert rep.nodes, "the partition report lists no nodes"
    off = [(n.name, n.op_type, n.provider) for n in rep.nodes if n.provider != CPU]
    assert not off, f"nodes not on {CPU}: {off[:10]}"


def test_matches_onnxruntime(exported, oracle):
    """Same outputs (values, dtypes, shapes) as onnxruntime, at another batch size and at the
    export's, from one session; every node on the CPU provider."""
    sess = rt.InferenceSession(exported.model, providers=[CPU])
    assert_all_on_cpu(sess)
    ours = sess.run(None, exported.feeds)
    assert_close(ours, oracle.out, rtol=RTOL, atol=ATOL)
    again = sess.run(None, exported.export_feeds)
    assert_close(again, oracle.export_out, rtol=RTOL, atol=ATOL)


def test_output_subset_in_reverse_order(exported, oracle):
    """run() with the output names given in reverse order (and only the last one)."""
    sess = rt.InferenceSession(exported.model, providers=[CPU])
    names = [o.name for o in oracle.sess.get_outputs()]
    assert_close(sess.run(names[::-1], exported.feeds), oracle.out[::-1], rtol=RTOL, atol=ATOL)
    assert_close(sess.run(names[-1:], exported.feeds), oracle.out[-1:], rtol=RTOL, atol=ATOL)


def test_concurrent_runs(exported, oracle):
    """One session, several threads at once (onnxruntime's run() is thread-safe too)."""
    from concurrent.futures import ThreadPoolExecutor

    sess = rt.InferenceSession(exported.model, providers=[CPU])
    feeds = [exported.feeds, exported.export_feeds] * 3
    with ThreadPoolExecutor(3) as pool:
        outs = list(pool.map(lambda f: sess.run(None, f), feeds))
    for f, out in zip(feeds, outs):
        assert_close(out, oracle.out if f is exported.feeds else oracle.export_out, rtol=RTOL, atol=ATOL)


def test_session_metadata_matches_onnxruntime(exported, oracle):
    """get_inputs()/get_outputs(): the same names, type strings and ranks as onnxruntime, and
    the same sizes wherever both give a number. (onnxruntime replaces a declared symbolic
    output dim by the size its own shape inference found, so a symbol on one side may be a
    number on the other.)"""
    sess = rt.InferenceSession(exported.model, providers=[CPU])
    for ours, ref in ((sess.get_inputs(), oracle.sess.get_inputs()), (sess.get_outputs(), oracle.sess.get_outputs())):
        assert [a.name for a in ours] == [b.name for b in ref]
        assert [a.type for a in ours] == [b.type for b in ref]
        for a, b in zip(ours, ref):
            assert len(a.shape) == len(b.shape), (a, b)
            for da, db in zip(a.shape, b.shape):
                if isinstance(da, int) and isinstance(db, int):
                    assert da == db, (a, b)


@pytest.mark.parametrize("level", ["ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL"])
def test_every_optimization_level(exported, oracle, level, tmp_path):
    """Loaded from a file path, at each graph-optimization level: still onnxruntime's outputs."""
    path = tmp_path / f"{exported.name}.onnx"
    path.write_bytes(exported.model)
    so = rt.SessionOptions()
    so.graph_optimization_level = getattr(rt.GraphOptimizationLevel, level)
    sess = rt.InferenceSession(str(path), so, providers=[CPU])
    assert_all_on_cpu(sess)
    assert_close(sess.run(None, exported.feeds), oracle.out, rtol=RTOL, atol=ATOL)


def test_external_data_from_path(exported, oracle, tmp_path):
    """Saved with every initializer in one external-data file next to the model, loaded by path."""
    import onnx

    path = tmp_path / "model.onnx"
    onnx.save_model(exported.proto(), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    assert (tmp_path / "weights.bin").stat().st_size > 0
    sess = rt.InferenceSession(str(path), providers=[CPU])
    assert_all_on_cpu(sess)
    assert_close(sess.run(None, exported.feeds), oracle.out, rtol=RTOL, atol=ATOL)


def test_dynamic_axes_are_exercised(exported):
    """The declared dynamic axes are symbolic in the exported model, and the test feeds use a
    different size on them than the export did (so the tests above really re-shape)."""
    m = exported.proto()
    inputs = {i.name: i for i in m.graph.input}
    assert exported.dynamic, "every model declares a dynamic batch axis"
    for name, axes in exported.dynamic.items():
        dims = inputs[name].type.tensor_type.shape.dim
        for ax in axes:
            assert dims[ax].dim_param and not dims[ax].HasField("dim_value"), (name, ax, dims[ax])
    batch_in = next(iter(exported.dynamic))
    assert exported.feeds[batch_in].shape[0] != exported.export_feeds[batch_in].shape[0]


def test_onnxruntime_matches_torch(exported, oracle):
    """The oracle itself agrees with PyTorch (guards the exported model, not runtime-core)."""
    for got, want in ((oracle.out, exported.expected), (oracle.export_out, exported.export_expected)):
        assert len(got) == len(want)
        for i, (a, b) in enumerate(zip(got, want)):
            assert a.shape == b.shape, (i, a.shape, b.shape)
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=f"output {i}")


def test_every_level_equals_disable_all(exported):
    """Each optimization level gives ORT_DISABLE_ALL's outputs within rtol 1e-4 (the optimizer's
    equivalence rule); at ORT_ENABLE_ALL no BatchNormalization is left in a CNN."""
    def session(level):
        so = rt.SessionOptions()
        so.graph_optimization_level = level
        return rt.InferenceSession(exported.model, so, providers=[CPU])

    L = rt.GraphOptimizationLevel
    ref = session(L.ORT_DISABLE_ALL).run(None, exported.feeds)
    for level in (L.ORT_ENABLE_BASIC, L.ORT_ENABLE_EXTENDED, L.ORT_ENABLE_ALL):
        sess = session(level)
        assert_close(sess.run(None, exported.feeds), ref, rtol=1e-4, atol=1e-5)
    had_bn = any(n.op_type == "BatchNormalization" for n in exported.proto().graph.node)
    left = [n.name for n in sess.get_partition_report().nodes if n.op_type == "BatchNormalization"]
    if had_bn:
        assert not left, f"BatchNormalization left at ORT_ENABLE_ALL: {left}"
