"""The CPU provider's tuning policy (``fast/policy.py``) and its conv plans (``fast/conv.py``):
a frozen object installed for a block, and plans whose every slot is set on every branch."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from onnx import helper

from oracle import assert_close, make_model, record_plan_kinds, run_oracle, run_ours

RNG = np.random.default_rng(34)


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_policy_is_frozen_and_installed_for_a_block():
    from runtime_provider_cpu.fast import policy

    before = policy.current()
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.direct = not before.direct
    with policy.installed(direct=not before.direct, wino_min_c=7) as p:
        assert policy.current() is p and p.direct != before.direct and p.wino_min_c == 7
        assert p.linear == before.linear  # the rest as it was
    assert policy.current() is before
    with pytest.raises(TypeError, match="Policy"):
        policy.install({"direct": True})
    with pytest.raises(TypeError):
        policy.current().replace(no_such_field=1)


def test_policy_steers_a_session(monkeypatch, cpu_policy):
    # the same model under two policies: the compiled plan, then none (the general path),
    # both onnxruntime's result
    from runtime_provider_cpu.fast import policy

    if policy.NATIVE is None:
        pytest.skip(policy.NATIVE_ERROR)
    x, w = rnd(1, 16, 12, 12), rnd(8, 16, 3, 3)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], {"x": x}, ["y"],
                       opset=11, initializers={"w": w})
    ref = run_oracle(model, {"x": x})
    kinds = record_plan_kinds(monkeypatch)
    cpu_policy(direct=True, conv_kernel="direct")
    assert_close(run_ours(model, {"x": x})[0], ref, rtol=1e-4, atol=1e-5)
    assert kinds == ["direct"]
    cpu_policy(direct=False, native=None, conv_kernel="")
    assert_close(run_ours(model, {"x": x})[0], ref, rtol=1e-4, atol=1e-5)
    assert kinds == ["direct", "im2col"]  # without the compiled kernels: the library call


def test_every_plan_sets_every_slot(cpu_policy):
    # each plan class sets all of its slots whichever branch chose it (no AttributeError later)
    from runtime_provider_cpu.fast import policy
    from runtime_provider_cpu.fast.conv import candidates

    if policy.NATIVE is None:
        pytest.skip(policy.NATIVE_ERROR)
    cpu_policy(direct=True, wino_min_ow=1, wino_min_c=1)
    kinds = set()
    for n, (c, m, g), k, s, p, bias, clip in itertools.product(
            (1, 2), ((8, 8, 1), (8, 8, 8), (4, 6, 2)), (1, 3), (1, 2), (0, 1), (False, True), (None, (0.0, 6.0))):
        x, w = rnd(n, c, 9, 10), rnd(m, c // g, k, k)
        for name, make in candidates(x, w, rnd(m) if bias else None, clip, g, [s, s], [1, 1], [p, p], [p, p],
                                     2).items():
            plan = make()
            assert plan.kind == name
            kinds.add(plan.kind)
            for cls in type(plan).__mro__:
                for slot in getattr(cls, "__slots__", ()):
                    getattr(plan, slot)  # raises AttributeError where a branch left one unset
    lanes = {"im2col_lanes", "pointwise_rows"} if policy.current().pw_lanes and policy.current().linear else set()
    lanes |= {"depthwise_lanes"} if getattr(policy.NATIVE, "CONV_FAST", 0) else set()
    assert kinds == {"im2col", "im2col_sgemm", "winograd", "direct", "pointwise", "depthwise"} | lanes, kinds
