"""Helpers of the CPU provider's nn kernel tests (test_nn*.py): random inputs, tolerances,
one-node and small models run on runtime-core and on the oracle (onnxruntime)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import runtime_core as rt
from runtime_core.errors import PartitionError
from oracle import assert_close, make_model, run_oracle, run_ours

RNG = np.random.default_rng(20240611)

F32 = dict(rtol=1e-4, atol=1e-5)
TOL = {np.float32: F32, np.float64: dict(rtol=1e-7, atol=1e-9), np.float16: dict(rtol=1e-2, atol=1e-2)}


def rnd(*shape, dtype=np.float32, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def tol(dtype):
    return TOL[np.dtype(dtype).type]


def run_model(nodes, inputs, outputs, *, opset, initializers=None, rtol=1e-4, atol=1e-5, oracle=None):
    """Build a model (nodes may use '' for omitted inputs), run ours and the oracle, compare.

    ``oracle(feeds) -> list`` replaces onnxruntime where it departs from the spec or lacks a case.
    """
    model = make_model(nodes, inputs, outputs, opset=opset, initializers=initializers)
    ours, sess = run_ours(model, dict(inputs))
    assert all(n.provider == "CPUExecutionProvider" for n in sess.get_partition_report().nodes)
    ref = oracle(dict(inputs)) if oracle is not None else run_oracle(model, dict(inputs))
    assert_close(ours, ref, rtol, atol)
    return ours


def node_check(op, inputs, outputs=("y",), *, opset, initializers=None, oracle=None,
               rtol=1e-4, atol=1e-5, **attrs):
    """check_node with a replacement oracle (``oracle(feeds) -> list of arrays``)."""
    node = helper.make_node(op, list(inputs) + list(initializers or {}), list(outputs), **attrs)
    return run_model([node], inputs, [o for o in outputs if o], opset=opset, initializers=initializers,
                     rtol=rtol, atol=atol, oracle=oracle)


def expect_declined(nodes, inputs, outputs, opset, initializers=None, reason=""):
    model = make_model(nodes, inputs, outputs, opset=opset, initializers=initializers)
    with pytest.raises(PartitionError) as ei:
        rt.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert reason in str(ei.value)
