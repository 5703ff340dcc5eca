"""The one compiled part of runtime-provider-cpu: ``runtime_provider_cpu._native`` (plain C
against the CPython API, no numpy headers), one source file per routine family under
``runtime_provider_cpu/native/`` (native.h declares what they share). Everything else is in
pyproject.toml."""

import os

from setuptools import Extension, setup

# listed, not globbed: a new file is a deliberate change to the build
SOURCES = [
    "module.c",            # the module table, buffer checks
    "threadpool.c",        # the kernel thread pool, run scopes (stop flag, runs in flight)
    "threadpool_blas.c",   # sgemm as tiles on the pool
    "threads.c",           # how kernels split work over the pool, work buffers
    "cpu_features.c",      # AVX-512 or not, asked once at load
    "sgemm_bridge.c",      # SciPy's sgemm for the GEMM-shaped kernels
    "rows.c",              # bias_clip, gelu_erf, skip_layer_norm, softmax
    "recurrence.c",        # the LSTM / GRU time loop
    "trees.c",             # tree ensemble walks
    "depthwise.c",         # depthwise2d
    "depthwise_avx512.c",  # the AVX-512 3x3 windows (depthwise, maxpool, expand_dw)
    "pool.c",              # maxpool2d
    "conv_direct.c",       # conv2d: register tiles over phase planes
    "winograd.c",          # winograd3x3
    "gemm.c",              # gemm_rows, pointwise
    "linear.c",            # linear, pointwise_lanes
    "pointwise.c",         # pointwise_rows (a 1x1 conv as Linear over the positions)
    "attention.c",         # mha
    "pairs.c",             # conv_maxpool, expand_dw: fused pairs
    "int8.c",              # qgemm (MatMulInteger, QLinearMatMul), dyn_quantize
    "int8_dyn.c",          # dqmm (DynamicQuantizeMatMul, MatMulIntegerToFloat)
    "int8_amx.c",          # the AMX int8 tiles dqmm runs where the OS grants them
    "int8_depthwise.c",    # qdwconv (depthwise QLinearConv)
    "nbits.c",             # nbits_matmul (MatMulNBits on the 4-bit codes)
    "nbits_int8.c",        # nbits_int8_matmul (MatMulNBits accuracy_level 4: int8 a, vpdpbusd)
    "linear_avx2.c",       # linear's tiles without AVX-512: AVX2 + FMA, and the baseline x86-64
    "nchwc.c",             # the blocked-layout (NCHW16c) kernels: chains of convolutions
]
HEADERS = ["native.h", "simd.h"]  # in the sdist through MANIFEST.in

# RUNTIME_CORE_NATIVE_ISA=avx2 | baseline: a build without the AVX-512 (or any wider than the
# baseline x86-64) clones, which also caps its dispatch (native.h's RC_BUILD_ISA): an AVX-512
# machine then runs, tests and measures what an AVX2 or an SSE2-only one runs
_ISA = {"": 0, "avx512": 0, "avx2": 1, "baseline": 2}
_isa = os.environ.get("RUNTIME_CORE_NATIVE_ISA", "")
if _isa not in _ISA:
    raise SystemExit(f"RUNTIME_CORE_NATIVE_ISA={_isa!r}: expected one of avx512, avx2, baseline (or unset)")

setup(
    # the C sources build the extension; the wheel carries only the built module
    exclude_package_data={"": ["*.c", "*.h"]},
    ext_modules=[Extension(
        "runtime_provider_cpu._native",
        [f"runtime_provider_cpu/native/{s}" for s in SOURCES],
        depends=[f"runtime_provider_cpu/native/{h}" for h in HEADERS],
        define_macros=[("RC_BUILD_ISA", str(_ISA[_isa]))],
        # hidden: the files share internal symbols; only PyInit__native is exported
        extra_compile_args=["-O3", "-funroll-loops", "-fno-math-errno", "-Wno-psabi", "-fvisibility=hidden"],
        # optional: where it cannot be built (no C compiler, MSVC, an unsupported target) the
        # wheel still installs and every op runs on its numpy path
        optional=True,
    )],
)
