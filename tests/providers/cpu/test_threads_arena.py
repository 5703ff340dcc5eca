"""The convolution paths against a direct sum, per-thread scratch memory (Scratch) and the CPU
memory arena (arena.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from runtime_provider_cpu.ops._common import Scratch
from runtime_provider_cpu.ops.conv import _conv_core

RNG = np.random.default_rng(5)


@pytest.mark.parametrize("case", [
    dict(C=16, M=8, group=1, k=3, stride=1, pads=[1, 1], dil=1),
    dict(C=16, M=8, group=2, k=3, stride=2, pads=[0, 2], dil=1),
    dict(C=12, M=12, group=12, k=3, stride=1, pads=[1, 1], dil=1),   # depthwise, einsum path
    dict(C=12, M=12, group=12, k=3, stride=2, pads=[1, 1], dil=1),   # depthwise, strided
    dict(C=12, M=12, group=12, k=3, stride=1, pads=[0, 2], dil=2),
    dict(C=8, M=4, group=1, k=3, stride=1, pads=[2, 2], dil=2),
    dict(C=6, M=6, group=6, k=3, stride=1, pads=[1, 1], dil=1, size=64),   # depthwise, flat-shift path
    dict(C=6, M=6, group=6, k=3, stride=2, pads=[0, 1], dil=1, size=90),
    dict(C=6, M=6, group=6, k=3, stride=1, pads=[2, 2], dil=2, size=64),
])
def test_im2col_and_depthwise_paths_match_a_direct_convolution(case):
    size = case.get("size")
    x = RNG.standard_normal((2, case["C"], size or 40, size or 37)).astype(np.float32)
    w = RNG.standard_normal((case["M"], case["C"] // case["group"], case["k"], case["k"])).astype(np.float32)
    args = (x, w, None, case["group"], [case["stride"]] * 2, [case["dil"]] * 2, case["pads"], case["pads"])
    np.testing.assert_allclose(_conv_core(*args), _direct_conv(*args), rtol=1e-4, atol=1e-4)


def _direct_conv(x, w, b, group, strides, dil, pb, pe):
    N, C, H, W = x.shape
    M, Cg, KH, KW = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pb[0], pe[0]), (pb[1], pe[1])))
    OH = (xp.shape[2] - (KH - 1) * dil[0] - 1) // strides[0] + 1
    OW = (xp.shape[3] - (KW - 1) * dil[1] - 1) // strides[1] + 1
    y = np.zeros((N, M, OH, OW))
    Mg = M // group
    for m in range(M):
        g = m // Mg
        for i in range(KH):
            for j in range(KW):
                patch = xp[:, g * Cg:(g + 1) * Cg, i * dil[0]:i * dil[0] + (OH - 1) * strides[0] + 1:strides[0],
                           j * dil[1]:j * dil[1] + (OW - 1) * strides[1] + 1:strides[1]]
                y[:, m] += np.einsum("nchw,c->nhw", patch, w[m, :, i, j].astype(np.float64))
    return y


def test_scratch_is_reused_per_thread_and_grows():
    a = Scratch.get((4, 5), np.float32)
    b = Scratch.get((2, 3), np.float32)
    assert np.shares_memory(a, b)
    big = Scratch.get((100, 100), np.float32)
    assert big.shape == (100, 100)
    other = []
    t = threading.Thread(target=lambda: other.append(Scratch.get((4, 5), np.float32)))
    t.start()
    t.join()
    assert not np.shares_memory(other[0], big)
    assert Scratch.get((3,), np.float64).dtype == np.float64


def test_convs_of_different_sizes_in_turn_stay_correct():
    """The im2col buffer is shared by every conv of a thread: a big one, a small one, the big
    one again must each give their own result."""
    xs = [RNG.standard_normal(s).astype(np.float32) for s in [(1, 8, 30, 30), (1, 4, 6, 6)]]
    ws = [RNG.standard_normal(s).astype(np.float32) for s in [(6, 8, 3, 3), (5, 4, 3, 3)]]
    first = [_conv_core(x, w, None, 1, [1, 1], [1, 1], [1, 1], [1, 1]).copy() for x, w in zip(xs, ws)]
    again = [_conv_core(x, w, None, 1, [1, 1], [1, 1], [1, 1], [1, 1]) for x, w in zip(xs[::-1], ws[::-1])][::-1]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)


def _run(code: str, **env) -> str:
    e = dict(os.environ)
    e.update(env)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         env=e, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


GLIBC = sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else False


CHURN = """
    import resource, sys, numpy as np
    from runtime_provider_cpu import arena
    if sys.argv[-1] == "on":
        assert arena.enable() and arena.enabled()
    def churn():  # a run's pattern: a few live activations of varying sizes, then all freed
        live = []
        for mb in [1, 3, 2, 6, 12, 5, 9]:
            a = np.empty(mb * 262144, np.float32); a.fill(1.0); live.append(a)
            if len(live) > 2:
                live.pop(0)
        live.clear()
    churn(); churn()
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        churn()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)
"""


@pytest.mark.kernel
@pytest.mark.skipif(not GLIBC, reason="the arena is glibc's mallopt; other C libraries keep their defaults")
def test_arena_keeps_freed_memory_so_reallocation_does_not_fault():
    pages = 20 * sum([1, 3, 2, 6, 12, 5, 9]) * 256  # every page of every array, if each faulted
    off = int(_run(CHURN.replace("sys.argv[-1]", "'off'")))
    on = int(_run(CHURN.replace("sys.argv[-1]", "'on'")))
    assert on < pages // 50
    assert off > pages // 10  # glibc's defaults give the memory back and fault it in again


@pytest.mark.skipif(not GLIBC, reason="the arena is glibc's mallopt")
@pytest.mark.parametrize("arena_on,env,want", [(True, "1", "True"), (False, "1", "False"), (True, "0", "False")])
def test_session_option_and_environment_decide_the_arena(arena_on, env, want):
    out = _run(f"""
        import numpy as np, onnx
        from onnx import helper, TensorProto
        import runtime_core as rt
        from runtime_provider_cpu import arena
        g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
        so = rt.SessionOptions()
        so.enable_cpu_mem_arena = {arena_on}
        s = rt.InferenceSession(helper.make_model(g).SerializeToString(), so, providers=["cpu"])
        s.run(None, {{"x": np.ones(2, np.float32)}})
        print(arena.enabled())
    """, RUNTIME_CORE_CPU_ARENA=env)
    assert out == want


RELEASE = """
    import numpy as np
    from runtime_provider_cpu import arena
    def rss():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) / 1024.0
    assert arena.enable()
    base = rss()
    live = [np.ones(mb * 262144, np.float32) for mb in (3, 5, 2, 7, 4, 6, 1, 8)]  # 36 MiB
    del live  # freed, and kept by the arena
    kept = rss()
    assert arena.release()
    print(kept - base, rss() - base)
"""


@pytest.mark.skipif(not GLIBC, reason="the arena is glibc's mallopt")
def test_release_gives_memory_the_arena_kept_back():
    """``arena.release``: memory the arena keeps after one-off work (an autotune measurement's
    trial results) goes back to the system."""
    kept, after = map(float, _run(RELEASE).split())
    assert kept > 30 and after < 6, (kept, after)


def test_a_measurement_releases_its_trial_memory(monkeypatch):
    """``autotune.measure`` gives the freed trial results back once it has timed the candidates
    (the arena would keep them resident for the process's life)."""
    from runtime_provider_cpu import arena
    from runtime_provider_cpu.fast import autotune

    calls = []
    monkeypatch.setattr(arena, "release", lambda: calls.append(1) or True)
    monkeypatch.setenv(autotune.DIR_ENV, "0")
    autotune.forget()
    try:
        name, best = autotune.measure("test|release", {"a": lambda: np.ones(1000), "b": lambda: np.zeros(1000)})
    finally:
        autotune.forget()
    assert name in ("a", "b") and set(best) == {"a", "b"} and calls == [1]
