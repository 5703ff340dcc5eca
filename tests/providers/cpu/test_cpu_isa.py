"""The CPU provider's ISA detection (``_native.cpu_isa``, ``_native.qgemm_path``): CPUID as the
kernel's /proc/cpuinfo reads it, and under an emulated CPU without AVX-512 (qemu-user), where the
int8 GEMM must fall to its AVX2 loop. AVX-VNNI is detected and reported; no int8 tile runs on it
(no emulator here executes VEX vpdpbusd, so such a tile could not be tested)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys

import pytest

quant = pytest.importorskip("runtime_provider_cpu.ops.quant")
if quant._native is None:
    pytest.skip("the compiled extension is not built here", allow_module_level=True)
nat = quant._native

X86_LINUX = sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")
PROBE = ("import json; from runtime_provider_cpu.ops import quant as q; "
         "print(json.dumps([q._native.cpu_isa(), q._native.qgemm_path()]))")


def cpuinfo_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.partition(":")[2].split())
    return set()


def kernel_at_least(major: int, minor: int) -> bool:
    try:
        got = tuple(int(p) for p in platform.release().split("-")[0].split(".")[:2])
    except ValueError:
        return False
    return got >= (major, minor)


@pytest.mark.skipif(not X86_LINUX, reason="CPUID and /proc/cpuinfo flags: x86-64 Linux only")
def test_cpu_isa_agrees_with_the_kernel():
    isa, flags = nat.cpu_isa(), cpuinfo_flags()
    assert set(isa) == {"avx2", "avx512f", "avx512_vnni", "avx_vnni"}
    for name in ("avx2", "avx512f", "avx512_vnni"):
        assert isa[name] == (name in flags), name
    if kernel_at_least(5, 12):  # the kernel names avx_vnni since 5.12
        assert isa["avx_vnni"] == ("avx_vnni" in flags)


def test_qgemm_path_follows_the_isa():
    isa = nat.cpu_isa()
    nat.qgemm_path(9)  # the best this CPU runs
    want = "avx512vnni" if isa["avx512_vnni"] and isa["avx512f"] else "avx2" if isa["avx2"] else "portable"
    if not X86_LINUX:
        want = "portable"
    assert nat.qgemm_path() == want


QEMU = shutil.which("qemu-x86_64")


@pytest.mark.skipif(not X86_LINUX, reason="qemu-user runs the x86-64 build on x86-64 Linux here")
@pytest.mark.skipif(QEMU is None, reason="qemu-user is not installed (apt-get install qemu-user)")
@pytest.mark.parametrize("model,avx512", [("Haswell", False), ("max", None)])
def test_detection_under_an_emulated_cpu(model, avx512):
    # Haswell: AVX2 without AVX-512 or VNNI of either width; max: whatever this qemu's TCG runs
    out = subprocess.run([QEMU, "-cpu", model, sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ))
    assert out.returncode == 0, out.stderr[-2000:]
    isa, path = json.loads(out.stdout.strip().splitlines()[-1])
    assert isa["avx2"] is True
    if avx512 is not None:
        assert isa["avx512f"] is avx512 and isa["avx512_vnni"] is avx512
        assert isa["avx_vnni"] is False
    want = "avx512vnni" if isa["avx512_vnni"] and isa["avx512f"] else "avx2"
    assert path == want
