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

void rc_cpu_init(void) { rc_conv_fast = cv_fast(); }
