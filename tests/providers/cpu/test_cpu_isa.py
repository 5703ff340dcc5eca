"""The CPU provider's ISA detection (``_native.cpu_isa``, ``_native.qgemm_path``): CPUID as the
kernel's /proc/cpuinfo reads it, and under an emulated CPU without AVX-512 (qemu-user), where the
int8 GEMM must fall to its AVX2 loop. The AVX-VNNI tile (VEX vpdpbusd ymm) runs on no CPU or
emulator here: its dispatch is checked on given flags (``qgemm_dispatch``), its machine code for
being VEX-encoded (objdump), and its arithmetic through its EVEX twin in test_quant_native.py."""

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
    assert set(isa) == {"avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8"}
    for name in ("avx2", "avx512f", "avx512_vnni"):
        assert isa[name] == (name in flags), name
    if kernel_at_least(5, 12):  # the kernel names avx_vnni since 5.12
        # the AVX-VNNI tile is dispatched from AVX2 up: a baseline cap (CPU_ISA) turns it off
        assert isa["avx_vnni"] == ("avx_vnni" in flags and nat.CPU_ISA != "baseline")
    # the AMX tiles run only where the kernel lists them (it clears the flags when it does not
    # enable the tile state) and granted the permission (Linux 5.16+), which AMX_INT8 reports
    assert isa["amx_int8"] == (nat.AMX_INT8 == "granted")
    if isa["amx_int8"]:
        assert {"amx_tile", "amx_int8"} <= flags
    elif nat.AMX_INT8.startswith("capped by RUNTIME_CORE_CPU_ISA"):  # off on purpose (an AVX2 CPU's dispatch)
        assert nat.CPU_ISA != "avx512", nat.CPU_ISA
    elif {"amx_tile", "amx_int8"} <= flags and kernel_at_least(5, 16):
        pytest.fail(f"the kernel lists AMX but the tiles do not run: {nat.AMX_INT8}")


def test_the_api_and_the_bench_header_report_the_amx_state():
    from runtime_core.bench_protocol import _amx_state
    from runtime_provider_cpu import api

    assert api.amx_int8_state() == nat.AMX_INT8
    assert _amx_state() == nat.AMX_INT8
    assert (nat.AMX_INT8 == "granted") == nat.cpu_isa()["amx_int8"]


def test_qgemm_path_follows_the_isa():
    isa = nat.cpu_isa()
    nat.qgemm_path(9)  # the best this CPU runs
    want = ("avx512vnni" if isa["avx512_vnni"] and isa["avx512f"] else "avxvnni" if isa["avx_vnni"]
            else "avx2" if isa["avx2"] else "portable")
    if not X86_LINUX:
        want = "portable"
    assert nat.qgemm_path() == want


@pytest.mark.parametrize("vnni512,avx_vnni,avx2,want", [
    (True, True, True, "avx512vnni"), (True, False, True, "avx512vnni"), (False, True, True, "avxvnni"),
    (False, False, True, "avx2"), (False, False, False, "portable")])
def test_dispatch_order(vnni512, avx_vnni, avx2, want):
    # AVX-512 VNNI first, then AVX-VNNI (Alder Lake, Zen 5 clients ...), then AVX2
    assert nat.qgemm_dispatch(vnni512, avx_vnni, avx2) == want


def test_forcing_never_runs_a_loop_this_cpu_lacks():
    isa = nat.cpu_isa()
    try:
        got = nat.qgemm_path(3)  # avxvnni
        assert got == ("avxvnni" if isa["avx_vnni"] else nat.qgemm_dispatch(
            isa["avx512_vnni"] and isa["avx512f"], False, isa["avx2"]))
        got = nat.qgemm_path(4)  # the EVEX twin: AVX512_VNNI + VL
        assert (got == "vnni256-evex") == (X86_LINUX and isa["avx512_vnni"] and "avx512vl" in cpuinfo_flags())
    finally:
        nat.qgemm_path(9)


def _function_code(so: str, name: str) -> list[tuple[str, str]]:
    """(hex bytes, mnemonic and operands) of each instruction of the function `name` in `so`."""
    out = subprocess.run(["objdump", "-d", "--insn-width=16", "--disassemble=" + name, so], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = []
    for line in out.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[0].strip().endswith(":"):
            rows.append((parts[1].strip(), parts[2].strip()))
    return rows


@pytest.mark.skipif(not X86_LINUX, reason="the VNNI tiles are built for x86-64 Linux only")
@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) is not installed")
def test_avx_vnni_tile_is_vex_encoded():
    so = nat.__file__
    vex, evex = _function_code(so, "qg_quad_avxvnni"), _function_code(so, "qg_quad_vnni256_evex")
    if not vex or not evex:
        pytest.skip("the extension's symbols are stripped: its functions cannot be found")
    vex_dp = [b for b, ins in vex if "vpdpbusd" in ins]
    evex_dp = [b for b, ins in evex if "vpdpbusd" in ins]
    assert vex_dp and len(vex_dp) == len(evex_dp)  # one body: as many dot products in each
    for b in vex_dp:  # 3-byte VEX: C4, RXB.map (map 0F38 = 2), W.vvvv.L.pp (L = 1: ymm, pp = 66), opcode 50
        by = bytes.fromhex(b.replace(" ", ""))
        assert by[0] == 0xC4 and by[1] & 0x1F == 2 and by[2] & 0x07 == 0b101 and by[3] == 0x50, b
    # no EVEX instruction at all (0x62 leads only EVEX in 64-bit mode): an AVX-VNNI CPU has no AVX-512
    assert not [ins for b, ins in vex if b.startswith("62")]
    assert not [ins for b, ins in vex if "zmm" in ins or "%k" in ins]
    for b in evex_dp:
        assert b.startswith("62"), b


QEMU = shutil.which("qemu-x86_64")


@pytest.mark.skipif(not X86_LINUX, reason="qemu-user runs the x86-64 build on x86-64 Linux here")
@pytest.mark.parametrize("model,avx512", [("Haswell", False), ("max", None)])
def test_detection_under_an_emulated_cpu(model, avx512):
    if QEMU is None:  # CI installs it (.ci/run) and sets RUNTIME_CORE_QEMU_REQUIRED: a skip there would hide the check
        if os.environ.get("RUNTIME_CORE_QEMU_REQUIRED") == "1":
            pytest.fail("RUNTIME_CORE_QEMU_REQUIRED=1 but qemu-x86_64 (Debian: qemu-user) is not installed")
        pytest.skip("qemu-user is not installed (apt-get install qemu-user)")
    # Haswell: AVX2 without AVX-512 or VNNI of either width; max: whatever this qemu's TCG runs
    out = subprocess.run([QEMU, "-cpu", model, sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ))
    assert out.returncode == 0, out.stderr[-2000:]
    isa, path = json.loads(out.stdout.strip().splitlines()[-1])
    assert isa["avx2"] is True
    if avx512 is not None:
        assert isa["avx512f"] is avx512 and isa["avx512_vnni"] is avx512
        assert isa["avx_vnni"] is False
    want = "avx512vnni" if isa["avx512_vnni"] and isa["avx512f"] else "avxvnni" if isa["avx_vnni"] else "avx2"
    assert path == want


#: the implicit-GEMM QLinearConv (qgemm's conv mode) and qadd_lut's affine form on seeded inputs:
#: their bytes' digest, for the same script on this CPU and under an emulated one
INT8_PROBE = """
import hashlib, numpy as np
from runtime_provider_cpu.ops import quant as q
nat, r = q._native, np.random.default_rng(4)
h = hashlib.sha256()
x = r.integers(-128, 128, (2, 19, 11, 9)).astype(np.int8)
K, M, oh, ow = 19 * 9, 37, 6, 9
w = r.integers(-128, 128, (K, M)).astype(np.int8)
buf = np.empty(nat.qgemm_packed_size((K, M)), np.int8)
nat.qgemm_pack(w, buf, (K, M), True)
mult = r.uniform(1e-4, 1e-3, M).astype(np.float32)
bias = r.integers(-3000, 3000, M).astype(np.int32)
y = np.empty((2, M, oh * ow), np.int8)
nat.qgemm(x, True, -5, buf, True, None, y, (2 * oh * ow, K, M), 2, mult, 3, 2, bias, oh * ow,
          (19, 11, 9, 3, 3, oh, ow, 2, 1, 1, 1, 1, 1))
h.update(y.tobytes())
codes = np.arange(256, dtype=np.uint8).view(np.int8)
ta = (codes.astype(np.int32) - 3).astype(np.float32) * np.float32(0.37)
tb = (codes.astype(np.int32) + 9).astype(np.float32) * np.float32(-0.5)
a, b = r.integers(0, 256, 1000).astype(np.uint8), r.integers(0, 256, 1000).astype(np.uint8)
s = np.empty(1000, np.int8)
nat.qadd_lut(a, b, ta, tb, 2.0, s, True, 1000, 2, (0.37, 3, -0.5, -9))
h.update(s.tobytes())
print(h.hexdigest())
"""


@pytest.mark.skipif(not X86_LINUX, reason="qemu-user runs the x86-64 build on x86-64 Linux here")
def test_int8_conv_and_add_bytes_under_haswell():
    """The implicit-GEMM QLinearConv and QLinearAdd give the same bytes on an AVX2-only CPU (qemu's
    Haswell model: the AVX2 tile, the v3 clones, no AVX-512 loop) as on this one."""
    if QEMU is None:
        if os.environ.get("RUNTIME_CORE_QEMU_REQUIRED") == "1":
            pytest.fail("RUNTIME_CORE_QEMU_REQUIRED=1 but qemu-x86_64 (Debian: qemu-user) is not installed")
        pytest.skip("qemu-user is not installed (apt-get install qemu-user)")
    here = subprocess.run([sys.executable, "-c", INT8_PROBE], capture_output=True, text=True, timeout=120)
    assert here.returncode == 0, here.stderr[-2000:]
    out = subprocess.run([QEMU, "-cpu", "Haswell", sys.executable, "-c", INT8_PROBE], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == here.stdout.split()
