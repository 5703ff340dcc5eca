// Elementwise kernels (float32, or float16 stored as `real`) of runtime-provider-opencl.
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
__kernel void NAME(__global const real* X, __global real* Y, const int n,       \
                   const float p0, const float p1) {                            \
    const int i = get_global_id(0);                                             \
    if (i >= n) return;                                                         \
    const float x = LD(X, i);                                                   \
    ST(Y, i, (EXPR));                                                           \
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
UNARY(u_reciprocal, 1.0f / x)
UNARY(u_floor, floor(x))
UNARY(u_ceil, ceil(x))
UNARY(u_round, rint(x))
UNARY(u_sin, sin(x))
UNARY(u_cos, cos(x))
UNARY(u_softplus, (x > 0.0f ? x + log1p(exp(-x)) : log1p(exp(x))))
UNARY(u_softsign, x / (1.0f + fabs(x)))
UNARY(u_elu, (x < 0.0f ? p0 * (exp(x) - 1.0f) : x))
UNARY(u_selu, (x <= 0.0f ? p1 * (p0 * exp(x) - p0) : p1 * x))
UNARY(u_hard_sigmoid, fmax(0.0f, fmin(1.0f, p0 * x + p1)))
UNARY(u_sign, (x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x)))
UNARY(u_affine_scale, p0 * x + p1)
UNARY(u_identity, x)
UNARY(u_div_scalar, x / p0)

// Cast between the storage types: float32/float16 <-> float32/float16/bool, ints -> float/bool.
// Each kernel writes the output's own element type (a bool output is uchar, whatever `real` is).
#define CAST(NAME, TIN, TOUT, LOAD, STORE)                                       \
__kernel void NAME(__global const TIN* X, __global TOUT* Y, const int n) {      \
    const int i = get_global_id(0);                                             \
    if (i >= n) return;                                                         \
    STORE;                                                                      \
}
CAST(cast_real_float, real, float, 0, Y[i] = (float)LD(X, i))
CAST(cast_real_half, real, half, 0, vstore_half((float)LD(X, i), i, Y))
CAST(cast_real_bool, real, uchar, 0, Y[i] = (LD(X, i) != 0.0f ? 1 : 0))
CAST(cast_bool_real, uchar, real, 0, ST(Y, i, (X[i] ? 1.0f : 0.0f)))
CAST(cast_long_real, long, real, 0, ST(Y, i, (float)X[i]))
CAST(cast_int_real, int, real, 0, ST(Y, i, (float)X[i]))
CAST(cast_long_bool, long, uchar, 0, Y[i] = (X[i] != 0 ? 1 : 0))
CAST(cast_int_bool, int, uchar, 0, Y[i] = (X[i] != 0 ? 1 : 0))

#define BINARY(NAME, TOUT, EXPR)                                                 \
__kernel void NAME(__global const real* A, __global const real* B,              \
                   __global TOUT* Y, const int n, const int rank,               \
                   __global const int* meta) {                                  \
    const int i = get_global_id(0);                                             \
    if (i >= n) return;                                                         \
    int ia, ib, ic;                                                             \
    bcast_offsets(i, rank, meta, &ia, &ib, &ic);                                \
    const float a = LD(A, ia);                                                  \
    const float b = LD(B, ib);                                                  \
    STORE_##TOUT(Y, i, (EXPR));                                                 \
}

#define STORE_real(Y, i, v) ST(Y, i, v)
#define STORE_uchar(Y, i, v) (Y[i] = (v))

BINARY(b_add, real, a + b)
BINARY(b_sub, real, a - b)
BINARY(b_mul, real, a * b)
BINARY(b_div, real, a / b)
BINARY(b_pow, real, pow(a, b))
BINARY(b_max, real, (isnan(a) || isnan(b) ? NAN : fmax(a, b)))
BINARY(b_min, real, (isnan(a) || isnan(b) ? NAN : fmin(a, b)))
BINARY(b_prelu, real, (a < 0.0f ? a * b : a))
BINARY(c_equal, uchar, (a == b ? 1 : 0))
BINARY(c_less, uchar, (a < b ? 1 : 0))
BINARY(c_greater, uchar, (a > b ? 1 : 0))
BINARY(c_less_equal, uchar, (a <= b ? 1 : 0))
BINARY(c_greater_equal, uchar, (a >= b ? 1 : 0))

__kernel void t_where(__global const uchar* C, __global const real* A, __global const real* B,
                      __global real* Y, const int n, const int rank, __global const int* meta) {
    const int i = get_global_id(0);
    if (i >= n) return;
    int ic, ia, ib;
    bcast_offsets(i, rank, meta, &ic, &ia, &ib);
    ST(Y, i, C[ic] ? LD(A, ia) : LD(B, ib));
}

// boolean logic on uchar (And, Or, Xor) and Not
#define LOGIC(NAME, EXPR)                                                        \
__kernel void NAME(__global const uchar* A, __global const uchar* B,            \
                   __global uchar* Y, const int n, const int rank,              \
                   __global const int* meta) {                                  \
    const int i = get_global_id(0);                                             \
    if (i >= n) return;                                                         \
    int ia, ib, ic;                                                             \
    bcast_offsets(i, rank, meta, &ia, &ib, &ic);                                \
    const uchar a = A[ia] != 0, b = B[ib] != 0;                                 \
    Y[i] = (EXPR);                                                              \
}
LOGIC(l_and, a & b)
LOGIC(l_or, a | b)
LOGIC(l_xor, a ^ b)

__kernel void l_not(__global const uchar* X, __global uchar* Y, const int n) {
    const int i = get_global_id(0);
    if (i >= n) return;
    Y[i] = X[i] ? 0 : 1;
}
