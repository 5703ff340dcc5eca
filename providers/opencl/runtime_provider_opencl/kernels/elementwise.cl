// Elementwise float32 kernels of runtime-provider-opencl.
//
// Unary kernels read X[i]. Broadcasting kernels (binary, comparison, Where) read
// their inputs through per-dimension element strides, 0 along broadcast dimensions:
// meta = [dims (rank) | strides of input 0 (rank) | input 1 (rank) | input 2 (rank)],
// computed on the host once per node, after adjacent dimensions are merged.
// Every kernel guards i < n: the global size is rounded up to the work-group size.

inline void bcast_offsets(int i, const int rank, __global const int* meta,
                          int* o0, int* o1, int* o2) {
    int a = 0, b = 0, c = 0;
    for (int d = rank - 1; d >= 0; --d) {
        const int dim = meta[d];
        const int q = i / dim;
        const int r = i - q * dim;
        a += r * meta[rank + d];
        b += r * meta[2 * rank + d];
        c += r * meta[3 * rank + d];
        i = q;
    }
    *o0 = a;
    *o1 = b;
    *o2 = c;
}

#define UNARY(NAME, EXPR)                                                        \
__kernel void NAME(__global const float* X, __global float* Y, const int n,     \
                   const float p0, const float p1) {                            \
    const int i = get_global_id(0);                                             \
    if (i >= n) return;                                                         \
    const float x = X[i];                                                       \
    Y[i] = (EXPR);                                                              \
}

// comparisons with 0 keep NaN (x < 0 is false for NaN), as numpy does
UNARY(u_relu, (x < 0.0f ? 0.0f : x))
UNARY(u_sigmoid, 1.0f / (1.0f + exp(-x)))
UNARY(u_tanh, tanh(x))
UNARY(u_erf, erf(x))
UNARY(u_gelu, 0.5f * x * (1.0f + erf(x * 0.70710678118654752f)))
UNARY(u_gelu_tanh, 0.5f * x * (1.0f + tanh(0.79788456080286536f * (x + 0.044715f * x * x * x))))
UNARY(u_clip, (x < p0 ? p0 : (x > p1 ? p1 : x)))
UNARY(u_leaky_relu, (x < 0.0f ? p0 * x : x))
UNARY(u_hard_swish, x * clamp(x / 6.0f + 0.5f, 0.0f, 1.0f))
UNARY(u_exp, exp(x))
UNARY(u_log, log(x))
UNARY(u_sqrt, sqrt(x))
UNARY(u_neg, -x)
UNARY(u_abs, fabs(x))

#define BINARY(NAME, TOUT, EXPR)                                                 \
__kernel void NAME(__global const float* A, __global const float* B,            \
                   __global TOUT* Y, const int n, const int rank,               \
                   __global const int* meta) {                                  \
    const int i = get_global_id(0);                                             \
    if (i >= n) return;                                                         \
    int ia, ib, ic;                                                             \
    bcast_offsets(i, rank, meta, &ia, &ib, &ic);                                \
    const float a = A[ia];                                                      \
    const float b = B[ib];                                                      \
    Y[i] = (EXPR);                                                              \
}

BINARY(b_add, float, a + b)
BINARY(b_sub, float, a - b)
BINARY(b_mul, float, a * b)
BINARY(b_div, float, a / b)
BINARY(b_pow, float, pow(a, b))
BINARY(c_equal, uchar, (a == b ? 1 : 0))
BINARY(c_less, uchar, (a < b ? 1 : 0))
BINARY(c_greater, uchar, (a > b ? 1 : 0))
BINARY(c_less_equal, uchar, (a <= b ? 1 : 0))
BINARY(c_greater_equal, uchar, (a >= b ? 1 : 0))

__kernel void t_where(__global const uchar* C, __global const float* A, __global const float* B,
                      __global float* Y, const int n, const int rank, __global const int* meta) {
    const int i = get_global_id(0);
    if (i >= n) return;
    int ic, ia, ib;
    bcast_offsets(i, rank, meta, &ic, &ia, &ib);
    Y[i] = C[ic] ? A[ia] : B[ib];
}
