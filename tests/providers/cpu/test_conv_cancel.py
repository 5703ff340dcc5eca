"""``RunOptions.terminate`` inside one long compiled convolution: the kernels' parts poll the
run's stop flag between their units (``rc_stop_requested``), so a big Conv ends within 100 ms
of the flag instead of finishing the part it is in (a quarter of the run on one thread).

The flag is set at random times within a run; ``-s`` prints the measured latencies. The bound
is 100 ms or a twentieth of an uncancelled run, whichever is larger (a loaded machine stretches
both), where finishing the current part would take a quarter of a run.
"""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt
from cancelling import cancel_at
from oracle import cpu_policy  # noqa: F401 - the fixture

pytestmark = pytest.mark.skipif(
    __import__("runtime_provider_cpu.fast.policy", fromlist=["NATIVE"]).NATIVE is None,
    reason="the compiled kernels are not built here")

TRIALS = 8

#: kernel -> (input shape, weight shape, group): one run is ~0.3-1 s on one quiet core
SHAPES = {
    "direct": ((1, 128, 192, 192), (128, 128, 3, 3), 1),
    "winograd": ((1, 128, 256, 256), (128, 128, 3, 3), 1),
    "depthwise": ((1, 512, 200, 200), (512, 1, 5, 5), 512),
}


def _session(xshape, wshape, group):
    w = np.random.default_rng(0).standard_normal(wshape).astype(np.float32) * 0.05
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[wshape[2] // 2] * 4, group=group)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xshape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    so = rt.SessionOptions()
    so.intra_op_num_threads = 1
    return rt.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("kernel", sorted(SHAPES))
def test_a_big_conv_stops_within_100ms(cpu_policy, kernel):  # noqa: F811
    cpu_policy(conv_kernel=kernel)
    xshape, wshape, group = SHAPES[kernel]
    sess = _session(xshape, wshape, group)
    x = np.random.default_rng(1).standard_normal(xshape).astype(np.float32)
    (want,) = sess.run(None, {"x": x})  # first run: the plan is made and bound
    chosen = list(sess.get_partition_report().kernels.values())
    if chosen != [kernel] and kernel != "depthwise":
        # direct and Winograd are the AVX-512 build's (CONV_FAST); elsewhere (or under
        # RUNTIME_CORE_CPU_ISA=avx2) the conv is im2col + one BLAS call, which does not poll
        from runtime_provider_cpu import _native

        assert not getattr(_native, "CONV_FAST", 0), chosen
        pytest.skip(f"{kernel} is not offered on this CPU or ISA cap (ran {chosen})")
    assert chosen == [kernel], chosen
    full = float("inf")
    for _ in range(3):  # the fastest of three: one slow run would put the flags past the run's end
        t0 = time.perf_counter()
        sess.run(None, {"x": x})
        full = min(full, time.perf_counter() - t0)
    rnd = random.Random(7)
    lat = []
    for _ in range(TRIALS):
        got = cancel_at(sess, {"x": x}, rnd.uniform(0.1, 0.6) * full)
        if got is not None:
            lat.append(got)
    assert len(lat) >= TRIALS // 2, f"only {len(lat)} of {TRIALS} runs were still going at the flag"
    lat.sort()
    print(f"\n{kernel} conv ({full * 1e3:.0f} ms a run): latency max {lat[-1] * 1e3:.1f} ms, "
          f"median {lat[len(lat) // 2] * 1e3:.1f} ms, {sess.get_partition_report().kernels}")
    assert lat[len(lat) // 2] < max(0.1, full / 20), lat
    (y,) = sess.run(None, {"x": x})  # the session works afterwards
    np.testing.assert_array_equal(y, want)
