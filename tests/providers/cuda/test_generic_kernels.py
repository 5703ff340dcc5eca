"""The CPU kernels reused by CUDA are array-module generic (numpy stand-in for cupy).

Every op in ``ops.GENERIC`` and ``ops.FAST`` runs its ONNX backend node cases through the
real CUDA provider code on the stand-in (``cudastandin``), with implicit host conversion
made to raise as cupy does: each case must pass, the op must actually run on the stand-in
in at least one case, and the executable checks that every output is still a device array.
"""

from __future__ import annotations

import collections
import functools
import re
import warnings

import numpy as np
import onnx
import pytest

import runtime_core as rt
from runtime_provider_cuda import ops
from runtime_provider_cuda.standin import DeviceStandIn, StandInBackend, strict_host_conversion, xp

STANDIN = "CUDAStandInExecutionProvider"


@functools.lru_cache(maxsize=1)
def cases_by_op():
    from runtime_core.conformance.cases import load_cases

    by = collections.defaultdict(list)
    for c in load_cases(["node"]):
        m = onnx.load(str(c.model_path), load_external_data=False)
        for op in {n.op_type for n in m.graph.node if n.domain in ("", "ai.onnx")}:
            by[op].append(c)
    return by


#: per case (model path): None where the CPU provider alone fails it, else the stand-in run's
#: (passed, message) and the op types the stand-in took. A case holds several ops (the expanded
#: function cases a dozen), and each op's test below asks for every case it appears in (about
#: 4460 asks for 1180 cases): each case's three sessions are made once and each op reads the answer.
_STANDIN_RUNS: dict[str, tuple[bool, str, frozenset] | None] = {}


def standin_run(case):
    from runtime_core.conformance.runner import run_case

    key = str(case.model_path)
    if key not in _STANDIN_RUNS:
        if not run_case(case, ["cpu"]).passed:
            _STANDIN_RUNS[key] = None  # the CPU provider's own gaps are not CUDA's
        else:
            with strict_host_conversion():
                r = run_case(case, ["cudastandin", "cpu"])
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    sess = rt.InferenceSession(str(case.model_path), providers=["cudastandin", "cpu"])
            took = frozenset(n.op_type for n in sess.get_partition_report().nodes if n.provider == STANDIN)
            _STANDIN_RUNS[key] = (r.passed, r.message, took)
    return _STANDIN_RUNS[key]


@pytest.mark.parametrize("op", sorted(ops.GENERIC | set(ops.FAST)))
def test_op_node_cases_on_the_standin(standin, op):
    cases = cases_by_op().get(op)
    assert cases, f"no ONNX node case uses {op}"
    ran, failures = 0, []
    for c in cases:
        run = standin_run(c)
        if run is None:
            continue
        passed, message, took = run
        if not passed:
            blamed = re.search(r"at node '[^']*' \((\w+)\)", message)
            if blamed is None or blamed.group(1) == op:
                failures.append(f"{c.name}: {message[:300]}")
        ran += op in took
    assert not failures, "\n".join(failures)
    assert ran, f"{op} never ran on the stand-in (every case was declined)"


def test_standin_dispatch_rules():
    a = np.arange(6, dtype=np.float32).reshape(2, 3).view(DeviceStandIn)
    assert type(np.add(a, a)) is DeviceStandIn
    assert type(np.concatenate([a, a])) is DeviceStandIn
    assert type(np.transpose(a)) is DeviceStandIn and type(a.sum()) is DeviceStandIn
    assert type(np.where(a > 1, a, 0)) is DeviceStandIn
    assert type(np.empty(3)) is np.ndarray and type(np.asarray(a)) is np.ndarray  # host from scratch
    assert type(xp.asarray([1, 2])) is DeviceStandIn
    with strict_host_conversion(), pytest.raises(TypeError, match="implicit conversion"):
        np.asarray(a)


def _node_view(op, inputs, outputs, attrs, since, dtypes):
    from runtime_core.plugin import NodeView, ValueInfo

    return NodeView(name=op, op_type=op, domain="", since_version=since, opset=since, attrs=attrs,
                    inputs=tuple(inputs), outputs=tuple(outputs),
                    input_info=tuple(ValueInfo(n, np.dtype(d)) for n, d in zip(inputs, dtypes)),
                    output_info=tuple(ValueInfo(n, np.dtype(dtypes[0])) for n in outputs))


def test_genericity_check_tells_generic_from_host_kernels():
    """Direct calls: a generic CPU kernel keeps the stand-in type; a kernel that makes host arrays
    (ArgMax here) does not, and the CUDA provider declines that op with its reason."""
    from runtime_provider_cpu.registry import REGISTRY, KernelContext

    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    dx = x.view(DeviceStandIn)
    ctx = KernelContext(node=None, n_outputs=1, input_dtypes=(x.dtype,), output_dtypes=(x.dtype,))
    relu = REGISTRY.lookup("", "Relu", 14).fn
    out = relu(ctx, dx)
    assert type(out) is DeviceStandIn and np.array_equal(out.view(np.ndarray), relu(ctx, x))
    argmax = REGISTRY.lookup("", "ArgMax", 13).fn
    with strict_host_conversion():
        try:
            res = argmax(ctx, dx, axis=1, keepdims=1, select_last_index=0)
        except TypeError:
            res = None
    assert not isinstance(res, DeviceStandIn)
    node = _node_view("ArgMax", ["x"], ["y"], {"axis": 1, "keepdims": 1, "select_last_index": 0}, 13,
                      ["float32"])
    assert ops.decline_reason(node) == "ArgMax: no CUDA kernel; runs on the CPU provider"
    assert "ArgMax" not in ops.GENERIC


def test_unsupported_dtypes_and_domains_are_declined_with_reasons():
    import ml_dtypes

    node = _node_view("Add", ["a", "b"], ["c"], {}, 14, [ml_dtypes.bfloat16] * 2)
    assert "cupy arrays cannot hold" in ops.decline_reason(node)
    from runtime_core.plugin import NodeView

    ms = NodeView(name="g", op_type="FastGelu", domain="com.microsoft", since_version=1, opset=1, attrs={},
                  inputs=("x",), outputs=("y",), input_info=(None,), output_info=(None,))
    assert ops.decline_reason(ms) == "com.microsoft::FastGelu: no CUDA kernel; runs on the CPU provider"


def test_host_parameters_are_read_on_the_host(standin):
    """Reshape's shape computed on the device is copied back (small) and used on the host."""
    from onnx import helper

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Shape", ["r"], ["s"]),
             helper.make_node("Reshape", ["r", "s"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [2, 3])],
                          [helper.make_tensor_value_info("y", 1, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    so = rt.SessionOptions()
    so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = rt.InferenceSession(m.SerializeToString(), so, providers=["cudastandin", "cpu"])
    assert {n.provider for n in sess.get_partition_report().nodes} == {STANDIN}
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    with strict_host_conversion():
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0))


def test_standin_backend_copies():
    be = StandInBackend()
    d = be.to_device(np.ones(3, np.float32))
    assert be.is_device(d) and not be.is_device(np.ones(3))
    assert type(be.to_host(d)) is np.ndarray and be.transfers == {"to_device": 1, "to_host": 1}
    with pytest.raises(TypeError, match="not a device array"):
        be.to_host(np.ones(3))
