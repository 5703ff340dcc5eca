// Gather along one axis: Y[o, j, i] = X[o, idx[j] (negative: + L), i], with `outer` rows of
// L x inner elements in X and n_idx indices. Indices are int64 (or int32 with IDX32).
// An out-of-range index is clamped (the CPU provider raises instead; see the README).

#define GATHER(NAME, T, TI)                                                      \
__kernel void NAME(__global const T* X, __global const TI* I, __global T* Y,    \
                   const int n, const int L, const int inner, const int n_idx) { \
    const int g = get_global_id(0);                                             \
    if (g >= n) return;                                                         \
    const int i = g % inner;                                                    \
    const int t = g / inner;                                                    \
    const int j = t % n_idx;                                                    \
    const int o = t / n_idx;                                                    \
    long k = I[j];                                                              \
    if (k < 0) k += L;                                                          \
    k = k < 0 ? 0 : (k >= L ? L - 1 : k);                                       \
    Y[g] = X[((size_t)o * L + (int)k) * inner + i];                             \
}

GATHER(gather_u32_i64, uint, long)
GATHER(gather_u16_i64, ushort, long)
GATHER(gather_u8_i64, uchar, long)
GATHER(gather_u32_i32, uint, int)
GATHER(gather_u16_i32, ushort, int)
GATHER(gather_u8_i32, uchar, int)

// GatherElements: Y[c] = X[c with c[axis] = I[c] (negative: + L)]; meta = [index dims (rank) |
// X strides (rank)]; Y and I share the index shape. Out-of-range indices are clamped.
#define GATHER_ELEMENTS(NAME, T, TI)                                             \
__kernel void NAME(__global const T* X, __global const TI* I, __global T* Y,    \
                   const int n, const int rank, const int axis, const int L,    \
                   __global const int* meta) {                                  \
    const int g = get_global_id(0);                                             \
    if (g >= n) return;                                                         \
    long k = I[g];                                                              \
    if (k < 0) k += L;                                                          \
    k = k < 0 ? 0 : (k >= L ? L - 1 : k);                                       \
    int r = g;                                                                  \
    size_t xo = 0;                                                              \
    for (int d = rank - 1; d >= 0; --d) {                                       \
        const int dim = meta[d];                                                \
        const int q = r / dim;                                                  \
        const int c = r - q * dim;                                              \
        xo += (size_t)(d == axis ? (int)k : c) * meta[rank + d];                \
        r = q;                                                                  \
    }                                                                           \
    Y[g] = X[xo];                                                               \
}
GATHER_ELEMENTS(gather_el_u32_i64, uint, long)
GATHER_ELEMENTS(gather_el_u16_i64, ushort, long)
GATHER_ELEMENTS(gather_el_u8_i64, uchar, long)
GATHER_ELEMENTS(gather_el_u32_i32, uint, int)
GATHER_ELEMENTS(gather_el_u16_i32, ushort, int)
GATHER_ELEMENTS(gather_el_u8_i32, uchar, int)
