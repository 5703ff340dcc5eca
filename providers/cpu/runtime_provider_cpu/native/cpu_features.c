/* The CPU features the kernels dispatch on, asked once when the module loads. */
#include "native.h"

/* cv_fast(), asked once when the module loads (CONV_FAST) */
int rc_conv_fast;

/* whether conv2d runs its AVX-512 clone here (the portable one holds its 24 accumulators
 * in memory: slower than im2col and a BLAS GEMM) */
static int cv_fast(void)
{
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
#else
    return 0;
#endif
}

/* AVX-VNNI (VEX vpdpbusd on ymm, Alder Lake and later clients, Sierra Forest, Zen 5), asked
 * once when the module loads (AVX_VNNI): int8.c dispatches its VEX ymm vpdpbusd tile on it */
int rc_avx_vnni;

#if defined(__GNUC__) && defined(__x86_64__)
#include <cpuid.h>
#endif

/* CPUID.(EAX=7,ECX=1):EAX bit 4, with AVX2 (CPUID.7.0:EBX bit 5) and the OS saving YMM state
 * (OSXSAVE, then XCR0 bits 1 and 2): without the last, a ymm instruction faults */
static int avx_vnni(void)
{
#if defined(__GNUC__) && defined(__x86_64__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27)))
        return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 6u) != 6u)
        return 0;
    unsigned sub_max;
    if (!__get_cpuid_count(7, 0, &sub_max, &b, &c, &d) || !(b & (1u << 5)) || sub_max < 1)
        return 0;
    __cpuid_count(7, 1, a, b, c, d);
    return (a >> 4) & 1u;
#else
    return 0;
#endif
}

int rc_isa_cap;
const char *rc_isa_name = "baseline";
const ln_tile_f *rc_ln_tiles;

/* RUNTIME_CORE_CPU_ISA: the widest kernels this process dispatches to, so that an AVX-512 machine
 * runs (and tests, and measures) what an AVX2 or a baseline x86-64 one runs: "avx512" (none),
 * "avx2" or "baseline"; unset, the build's (RC_BUILD_ISA). It lowers the flags set here (the
 * AVX-512 paths, AMX, the Linear's tiles); the clones GCC's loader picks (RC_CLONES, CV_CLONES) and
 * the int8 kernels' own CPUID checks follow the CPU, which only a build with RC_BUILD_ISA caps. */
static int isa_cap(void)
{
    const char *s = getenv("RUNTIME_CORE_CPU_ISA");
    if (!s || !*s)
        return RC_BUILD_ISA;
    if (!strcmp(s, "avx512"))
        return RC_BUILD_ISA;
    if (!strcmp(s, "avx2"))
        return RC_BUILD_ISA > 1 ? RC_BUILD_ISA : 1;
    if (!strcmp(s, "baseline"))
        return 2;
    return -1;
}

void rc_cpu_init(void)
{
    rc_isa_cap = isa_cap();
    rc_conv_fast = rc_isa_cap == 0 && cv_fast();
    rc_avx_vnni = rc_isa_cap <= 1 && avx_vnni();
    rc_amx_init();
    if (rc_isa_cap != 0 && rc_amx) {
        rc_amx = rc_qg_amx = 0;
        rc_amx_why = "capped by RUNTIME_CORE_CPU_ISA (or the build's ISA)";
    }
    /* the Linear: linear.c's AVX-512 tiles, else the AVX2 ones where the CPU has AVX2 and FMA (and
       the OS saves ymm state), else the baseline's */
    int v3 = 0;
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
    __builtin_cpu_init();
    v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    rc_ln_tiles = rc_conv_fast ? NULL : rc_isa_cap <= 1 && v3 ? ln_tiles_avx2 : ln_tiles_base;
    rc_isa_name = rc_conv_fast ? "avx512" : rc_ln_tiles == ln_tiles_avx2 ? "avx2" : "baseline";
}

/* cpu_isa() -> {flag: bool} for the ISA extensions the kernels dispatch on, as this process's
 * CPUID and the OS's saved state say (an emulator's CPU model included) */
PyObject *rc_py_cpu_isa(PyObject *self, PyObject *noargs)
{
    int avx2 = 0, avx512vnni = 0, avx512f = 0;
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
    __builtin_cpu_init();
    avx2 = __builtin_cpu_supports("avx2");
    avx512f = __builtin_cpu_supports("avx512f");
    avx512vnni = __builtin_cpu_supports("avx512vnni");
#endif
    /* amx_int8: the tiles run here (CPU, XCR0 and the OS's permission; the module's AMX_INT8 says why not) */
    return Py_BuildValue("{sOsOsOsOsO}", "avx2", avx2 ? Py_True : Py_False, "avx512f", avx512f ? Py_True : Py_False,
                         "avx512_vnni", avx512vnni ? Py_True : Py_False, "avx_vnni",
                         rc_avx_vnni ? Py_True : Py_False, "amx_int8", rc_amx ? Py_True : Py_False);
}

/* ---------------------------------------------------------------------------------------
 * fma_peak: this CPU's float32 multiply-add peak as measured, not looked up: each of
 * `threads` threads runs a loop of 12 independent accumulator chains of fused multiply-adds
 * in the widest vectors it has (12 chains cover 4-cycle latency on two FMA pipes), so the
 * rate is cores x clock x FMA pipes x lanes x 2, double-pumped AVX-512 (Zen 4) counted as
 * it runs. Each thread's time is its own CPU time (CLOCK_THREAD_CPUTIME_ID), so that other
 * processes on the cores do not lower the figure. Returns (flop/s of all threads together,
 * lanes a vector, the longest thread's CPU seconds).
 * --------------------------------------------------------------------------------------- */
#include <pthread.h>
#include <time.h>

#define FP_CHAINS 12

typedef struct {
    long iters;
    int lanes;
    double secs;
    float sink;
} fp_job;

#if DWF_OK
DWF_TARGET static float fp_avx512(long iters)
{
    __m512 acc[FP_CHAINS];
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < FP_CHAINS; i++)
        acc[i] = _mm512_set1_ps((float)i);
    for (long n = 0; n < iters; n++)
        for (int i = 0; i < FP_CHAINS; i++)
            acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    __m512 s = acc[0];
    for (int i = 1; i < FP_CHAINS; i++)
        s = _mm512_add_ps(s, acc[i]);
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float fp_avx2(long iters)
{
    __m256 acc[FP_CHAINS];
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < FP_CHAINS; i++)
        acc[i] = _mm256_set1_ps((float)i);
    for (long n = 0; n < iters; n++)
        for (int i = 0; i < FP_CHAINS; i++)
            acc[i] = _mm256_fmadd_ps(acc[i], a, b);
    __m256 s = acc[0];
    for (int i = 1; i < FP_CHAINS; i++)
        s = _mm256_add_ps(s, acc[i]);
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}
#endif

/* the portable loop: 4-lane vectors, a multiply and an add (what it runs counts as one FMA) */
static float fp_portable(long iters)
{
    typedef float v4f __attribute__((vector_size(16)));
    v4f acc[FP_CHAINS];
    const v4f a = (v4f){0.999999f, 0.999999f, 0.999999f, 0.999999f}, b = (v4f){1e-7f, 1e-7f, 1e-7f, 1e-7f};
    for (int i = 0; i < FP_CHAINS; i++)
        acc[i] = (v4f){(float)i, (float)i, (float)i, (float)i};
    for (long n = 0; n < iters; n++)
        for (int i = 0; i < FP_CHAINS; i++)
            acc[i] = acc[i] * a + b;
    float s = 0;
    for (int i = 0; i < FP_CHAINS; i++)
        s += acc[i][0] + acc[i][1] + acc[i][2] + acc[i][3];
    return s;
}

static int fp_lanes(void)
{
#if DWF_OK
    if (rc_conv_fast)
        return 16;
    __builtin_cpu_init();
    if (rc_isa_cap <= 1 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return 8;
#endif
    return 4;
}

static void *fp_run(void *arg)
{
    fp_job *j = (fp_job *)arg;
    struct timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
#if DWF_OK
    if (j->lanes == 16)
        j->sink = fp_avx512(j->iters);
    else if (j->lanes == 8)
        j->sink = fp_avx2(j->iters);
    else
#endif
        j->sink = fp_portable(j->iters);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    j->secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    return NULL;
}

PyObject *rc_py_fma_peak(PyObject *self, PyObject *args)
{
    int threads;
    long iters;
    if (!PyArg_ParseTuple(args, "il:fma_peak", &threads, &iters))
        return NULL;
    if (threads < 1 || threads > 1024 || iters < 1 || iters > (1L << 40)) {
        PyErr_SetString(PyExc_ValueError, "fma_peak: threads must be in [1, 1024] and iters in [1, 2**40]");
        return NULL;
    }
    fp_job *jobs = calloc((size_t)threads, sizeof(fp_job));
    pthread_t *tids = calloc((size_t)threads, sizeof(pthread_t));
    if (!jobs || !tids) {
        free(jobs);
        free(tids);
        return PyErr_NoMemory();
    }
    const int lanes = fp_lanes();
    int started = 0;
    Py_BEGIN_ALLOW_THREADS
    for (int t = 0; t < threads; t++) {
        jobs[t].iters = iters;
        jobs[t].lanes = lanes;
        if (t == 0 || pthread_create(&tids[t], NULL, fp_run, &jobs[t]) == 0)
            started = t + 1;
        else
            break;
    }
    fp_run(&jobs[0]);
    for (int t = 1; t < started; t++)
        pthread_join(tids[t], NULL);
    Py_END_ALLOW_THREADS
    double secs = 0, rate = 0;
    for (int t = 0; t < started; t++) {
        secs = jobs[t].secs > secs ? jobs[t].secs : secs;
        rate += jobs[t].secs > 0 ? 2.0 * lanes * FP_CHAINS * (double)iters / jobs[t].secs : 0.0;
    }
    free(jobs);
    free(tids);
    return Py_BuildValue("(did)", rate, lanes, secs);
}
