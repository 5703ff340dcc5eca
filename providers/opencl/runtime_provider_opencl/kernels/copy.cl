// Strided copies: Transpose, Concat (one launch per input) and any other gather.
//
// meta = [dims (rank) | source strides (rank) | destination strides (rank)], element
// strides; the copy walks the `dims` box: Y[ybase + sum c_d*ys_d] = X[xbase + sum c_d*xs_d].

#define STRIDED_COPY(NAME, T)                                                    \
__kernel void NAME(__global const T* X, __global T* Y, const int n,             \
                   const int rank, __global const int* meta,                    \
                   const int xbase, const int ybase) {                          \
    const int i = get_global_id(0);                                             \
    if (i >= n) return;                                                         \
    int r = i, xo = xbase, yo = ybase;                                          \
    for (int d = rank - 1; d >= 0; --d) {                                       \
        const int dim = meta[d];                                                \
        const int q = r / dim;                                                  \
        const int c = r - q * dim;                                              \
        xo += c * meta[rank + d];                                               \
        yo += c * meta[2 * rank + d];                                           \
        r = q;                                                                  \
    }                                                                           \
    Y[yo] = X[xo];                                                              \
}

STRIDED_COPY(copy_f32, float)
STRIDED_COPY(copy_u8, uchar)
