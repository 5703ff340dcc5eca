"""The memory-safety rules of the provider, and guard mode that checks them at run time:

* every kernel bounds-checks each global id against the real element count (a source check
  here; guard mode catches the kernels that still write past their buffer);
* every host buffer given to a copy lives until the copy completes: all host<->device copies
  are blocking (checked on a model run), and buffers created from host memory copy it at once;
* sizes are exact 64-bit integers and index tables refuse values that do not fit int32;
* ``RUNTIME_CORE_OPENCL_GUARD=1`` surrounds every buffer with guard zones checked after every
  kernel and copy, and poisons new buffers with NaN: an overrun raises OpenCLGuardError."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from opencl_helpers import TEST_PLATFORM, check_model, requires_package, requires_pocl
from oracle import make_model

HERE = Path(__file__).resolve().parent


@requires_package
def test_every_kernel_bounds_checks_its_global_ids():
    kernels = resources.files("runtime_provider_opencl").joinpath("kernels")
    seen = 0
    for f in kernels.iterdir():
        if not f.name.endswith(".cl"):
            continue
        src = f.read_text(encoding="utf-8")
        # each kernel (or kernel macro) body, from its __kernel to the next one
        for body in re.split(r"(?=__kernel)", src)[1:]:
            ids = re.findall(r"(\w+)\s*=\s*get_global_id\(\d\)", body)
            assert ids, f"{f.name}: a kernel without a named global id:\n{body[:200]}"
            for name in ids:
                assert re.search(rf"\b{name}\s*(>=|<)\s*\w", body), \
                    f"{f.name}: global id {name!r} is never compared with a bound:\n{body[:300]}"
            seen += 1
    assert seen >= 20  # kernels and kernel macros


@requires_package
def test_sizes_are_exact_and_index_tables_do_not_wrap():
    from runtime_provider_opencl.shapes import int32_array, nbytes_of, size_of

    assert size_of((2**40, 2**30)) == 2**70  # numpy's int64 product would wrap
    with pytest.raises(OverflowError, match="more than a 64-bit size holds"):
        nbytes_of((2**40, 2**30), np.float32)
    with pytest.raises(ValueError, match="negative dimension"):
        size_of((3, -1))
    with pytest.raises(OverflowError, match="do not fit a kernel's int32"):
        int32_array(np.array([0, 2**31], np.int64))
    assert int32_array(np.array([-(2**31), 2**31 - 1], np.int64)).dtype == np.int32


@requires_pocl
def test_a_buffer_larger_than_the_device_allows_is_refused(provider):
    with pytest.raises(MemoryError, match="exceeds the largest allocation"):
        provider.dev.buffer(provider.dev.max_alloc + 1)


@requires_pocl
def test_host_copies_are_blocking(monkeypatch, rng):
    """No host array is handed to a non-blocking copy (it could be freed before the copy ran)."""
    import pyopencl as cl

    calls = []
    real = cl.enqueue_copy

    def spy(queue, dst, src, **kw):
        if isinstance(dst, np.ndarray) or isinstance(src, np.ndarray):
            calls.append(kw.get("is_blocking", True))  # pyopencl's default is blocking
        return real(queue, dst, src, **kw)

    monkeypatch.setattr(cl, "enqueue_copy", spy)
    x = rng.standard_normal((3, 37)).astype(np.float32)
    ids = np.array([[0, 2, 1], [2, 2, 0]], np.int64)
    nodes = [helper.make_node("Gather", ["w", "ids"], ["g"], axis=0),
             helper.make_node("Softmax", ["g"], ["y"], axis=-1)]
    check_model(make_model(nodes, {"ids": ids}, ["y"], initializers={"w": x}), {"ids": ids})
    assert calls and all(calls), calls


GUARD_CHILD = r"""
import sys, numpy as np
from runtime_provider_opencl.device import GUARD_BYTE, OpenCLGuardError, get_context, select_device
dev = get_context(select_device(sys.argv[1]))
assert dev.guard and dev.guard_bytes >= 256
cl = dev.cl
src = "__kernel void over(__global float* y, const int n) { const int i = get_global_id(0); y[i] = 1.0f; }"
k = cl.Kernel(cl.Program(dev.context, src).build(), "over")
buf = dev.buffer(37 * 4)
fresh = np.empty(37, np.float32); dev.read(fresh, buf)
assert np.isnan(fresh).all(), "a new buffer is poisoned with NaN"
dev.launch(k, (37,), None, [buf, np.int32(37)])  # in bounds: passes
try:
    dev.launch(k, (64,), None, [buf, np.int32(37)])  # the bug class: global size rounded up, no check
except OpenCLGuardError as exc:
    print("CAUGHT", exc)
else:
    raise SystemExit("the overrun was not caught")
"""


@requires_pocl
def test_guard_mode_catches_a_kernel_that_writes_past_its_buffer():
    env = {**os.environ, "RUNTIME_CORE_OPENCL_GUARD": "1"}
    proc = subprocess.run([sys.executable, "-c", GUARD_CHILD, TEST_PLATFORM], capture_output=True, text=True,
                          timeout=300, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "CAUGHT kernel over (global size (64,)) wrote outside buffer argument 0 (148 bytes)" in out, out
    assert "108 bytes past its end" in out


@requires_pocl
def test_guard_mode_is_off_by_default(provider):
    if os.environ.get("RUNTIME_CORE_OPENCL_GUARD") == "1":
        pytest.skip("this run is in guard mode")
    assert not provider.dev.guard and provider.dev.guard_checks == 0


@requires_pocl
def test_the_op_tests_pass_in_guard_mode():
    """Every op's kernels, at sizes that are no multiple of the work-group size, in guard mode."""
    if os.environ.get("RUNTIME_CORE_OPENCL_GUARD") == "1":
        pytest.skip("this whole run is in guard mode")
    env = {**os.environ, "RUNTIME_CORE_OPENCL_GUARD": "1", "MALLOC_CHECK_": "3"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           str(HERE / "test_ops.py"), str(HERE / "test_kernels.py")],
                          capture_output=True, text=True, timeout=1200, env=env, cwd=HERE.parents[2])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert " passed" in out and " failed" not in out
