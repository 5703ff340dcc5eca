"""CPU kernels: Dropout (inference: the identity and an all-true mask; training mode with a
seeded mask)."""

from __future__ import annotations

import numpy as np

from ..registry import kernel
from ._nncommon import _FLOAT, _as, _attr, _cdtype


def _dropout1_check(node):
    if _attr(node, "is_test", 0) and len(node.outputs) > 1 and node.outputs[1]:
        return (f"Dropout-{node.since_version}: the mask output with is_test=1 is not implemented: "
                "the opset says it 'is not filled' in test mode, so its value is undefined")
    return None


def _dropout_legacy(ctx, data, ratio, is_test):
    # opsets 1 and 6: is_test=1 is the identity; is_test=0 (the default) is training dropout,
    # scaled by 1/(1-ratio). No seed attribute: a fresh generator each run (numpy's legacy
    # MT19937 stream, as Dropout-12 uses). The mask output has type T (the schema's type
    # constraint, whatever the prose says about Tensor<bool>): 1 where kept, 0 where dropped.
    if is_test:
        return (data,) + (None,) * (ctx.n_outputs - 1) if ctx.n_outputs > 1 else data
    r = float(ratio)
    if not 0.0 <= r <= 1.0:
        raise ValueError(f"Dropout ratio must be in [0, 1], got {r}")
    keep = np.random.RandomState(None).uniform(0.0, 1.0, data.shape) >= r
    if r >= 1.0:
        y = np.zeros_like(data)
    else:
        cd = _cdtype(data.dtype)
        y = _as(np.where(keep, _as(data, cd) * cd.type(1.0 / (1.0 - r)), cd.type(0)), data.dtype)
    if ctx.n_outputs < 2:
        return y
    return y, (keep.astype(data.dtype) if ctx.outputs_wanted[1] else None)


@kernel("Dropout", 1, dtypes=_FLOAT, check=_dropout1_check)
def dropout_1(ctx, data, *, consumed_inputs, is_test, ratio):
    # consumed_inputs: a legacy in-place hint, no effect on values
    return _dropout_legacy(ctx, data, ratio, is_test)


@kernel("Dropout", 6, dtypes=_FLOAT, check=_dropout1_check)
def dropout_6(ctx, data, *, is_test, ratio):
    return _dropout_legacy(ctx, data, ratio, is_test)


def _dropout7_check(node):
    if len(node.outputs) > 1 and node.outputs[1]:
        return (f"Dropout-{node.since_version} mask output is not implemented (its inference-mode value "
                "is defined differently by runtimes; opset 12+ is)")
    return None


@kernel("Dropout", 7, 10, check=_dropout7_check)
def dropout_7(ctx, data, *, ratio):
    # inference: identity (the mask output, when declared, is never requested: see the check)
    return (data,) + (None,) * (ctx.n_outputs - 1) if ctx.n_outputs > 1 else data


@kernel("Dropout", 12, 13, 22)
def dropout_12(ctx, data, ratio=None, training_mode=None, *, seed):
    training = training_mode is not None and bool(np.asarray(training_mode).reshape(-1)[0])
    r = 0.5 if ratio is None else float(np.asarray(ratio).reshape(-1)[0])
    want_mask = ctx.n_outputs > 1 and ctx.outputs_wanted[1]
    if not training or r == 0.0:
        if ctx.n_outputs < 2:
            return data
        return data, (np.ones(data.shape, dtype=bool) if want_mask else None)
    if not 0.0 <= r <= 1.0:
        raise ValueError(f"Dropout ratio must be in [0, 1), got {r}")
    # the spec leaves the generator unspecified; onnx's reference and the backend test data use
    # numpy's legacy MT19937 stream: RandomState(seed).uniform(0, 1, shape) >= ratio
    rs = np.random.RandomState(None if seed is None else int(seed) & 0xFFFFFFFF)
    keep = rs.uniform(0.0, 1.0, data.shape) >= r
    if r >= 1.0:
        y = np.zeros_like(data)
    else:
        cd = _cdtype(data.dtype) if data.dtype.kind == "f" else data.dtype
        y = _as(np.where(keep, _as(data, cd) * cd.type(1.0 / (1.0 - r)), cd.type(0)), data.dtype)
    if ctx.n_outputs < 2:
        return y
    return y, (keep if want_mask else None)


