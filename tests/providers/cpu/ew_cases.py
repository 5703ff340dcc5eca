"""Helpers of the CPU provider's elementwise-family tests (test_elementwise.py, test_arith.py,
test_cast.py): random inputs of every dtype, tolerances, one-node models run on runtime-core
and on the oracle, and the decline assertion."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import helper

import runtime_core as rt
from oracle import assert_close, make_model, np_to_elem, run_oracle, run_ours
from runtime_core.errors import PartitionError

RNG = np.random.default_rng(1234)
F32, F64, F16 = np.float32, np.float64, np.float16
BF16 = ml_dtypes.bfloat16


def rand(shape, dtype=F32, lo=-3.0, hi=3.0):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return RNG.random(shape) > 0.5
    if dtype.kind in "iu":
        lo_i = max(int(lo), int(np.iinfo(dtype).min))
        return RNG.integers(lo_i, int(hi) + 1, size=shape).astype(dtype)
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


def tol(dtype):
    dtype = np.dtype(dtype)
    if dtype == F16:
        return dict(rtol=3e-3, atol=3e-3)
    if dtype == np.dtype(BF16):
        return dict(rtol=2e-2, atol=2e-2)
    if dtype == F64:
        return dict(rtol=1e-7, atol=1e-9)
    return dict(rtol=2e-5, atol=2e-6)


def run_model(model, feeds, **tolerance):
    """Run a ready model on both sides (for multi-node or hand-typed models)."""
    ours, sess = run_ours(model, dict(feeds))
    assert all(n.provider == "CPUExecutionProvider" for n in sess.get_partition_report().nodes)
    ref = run_oracle(model, dict(feeds))
    assert_close(ours, ref, **tolerance)
    return ours


def typed_model(node, inputs, out_dtype, out_shape, opset):
    """A one-node model whose output type is given (old opsets have no shape inference)."""
    ins = [helper.make_tensor_value_info(n, np_to_elem(a.dtype), list(a.shape)) for n, a in inputs.items()]
    out = helper.make_tensor_value_info(node.output[0], np_to_elem(np.dtype(out_dtype)), list(out_shape))
    m = helper.make_model(helper.make_graph([node], "g", ins, [out]), opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def run_typed(node, inputs, out_dtype, out_shape, opset):
    return run_ours(typed_model(node, inputs, out_dtype, out_shape, opset), dict(inputs))[0]


def session(node, inputs, opset, **kw):
    model = make_model([node], inputs, list(node.output), opset=opset, **kw)
    return rt.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def assert_declined(node, inputs, opset, *reason_parts, **kw):
    with pytest.raises(PartitionError) as ei:
        session(node, inputs, opset, **kw)
    msg = str(ei.value)
    for part in reason_parts:
        assert part in msg, msg
