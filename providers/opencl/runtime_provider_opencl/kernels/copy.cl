// Strided copies: Transpose, Concat (one launch per input), Slice, Expand, and any other
// gather that is a box walk.
//
// meta = [dims (rank) | source strides (rank) | destination strides (rank)], element
// strides (a source stride may be 0 (Expand) or negative (Slice with negative steps));
// the copy walks the `dims` box: Y[ybase + sum c_d*ys_d] = X[xbase + sum c_d*xs_d].

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
STRIDED_COPY(copy_u16, ushort)
STRIDED_COPY(copy_u8, uchar)
STRIDED_COPY(copy_u64, ulong)
STRIDED_COPY(copy_u32, uint)

// Pad: meta = [output dims | input dims (after cropping) | begin pads (>= 0) | input strides];
// mode 0 constant, 1 reflect (period 2 (d - 1)), 2 edge, 3 wrap; xbase skips cropped elements.
__kernel void pad(__global const real* X, __global real* Y, const int n, const int rank,
                  __global const int* meta, const int xbase, const int mode, const float cval) {
    const int i = get_global_id(0);
    if (i >= n) return;
    int r = i, xo = xbase;
    for (int d = rank - 1; d >= 0; --d) {
        const int od = meta[d];
        const int id = meta[rank + d];
        const int q = r / od;
        int c = r - q * od - meta[2 * rank + d];
        r = q;
        if (c < 0 || c >= id) {
            if (mode == 0) { ST(Y, i, cval); return; }
            if (mode == 1) {
                if (id == 1) c = 0;
                else {
                    const int p = 2 * (id - 1);
                    c %= p;
                    if (c < 0) c += p;
                    if (c >= id) c = p - c;
                }
            } else if (mode == 2) {
                c = c < 0 ? 0 : id - 1;
            } else {
                c %= id;
                if (c < 0) c += id;
            }
        }
        xo += c * meta[3 * rank + d];
    }
    ST(Y, i, LD(X, xo));
}

// Trilu: keep element (i, j) of each trailing matrix when j - i >= k (upper) or <= k (lower),
// else write zero bits (+0.0, false). Element types by size.
#define TRILU(NAME, T)                                                           \
__kernel void NAME(__global const T* X, __global T* Y, const int n, const int R, \
                   const int C, const int k, const int upper) {                 \
    const int g = get_global_id(0);                                             \
    if (g >= n) return;                                                         \
    const int j = g % C;                                                        \
    const int i = (g / C) % R;                                                  \
    const int keep = upper ? (j - i >= k) : (j - i <= k);                       \
    Y[g] = keep ? X[g] : (T)0;                                                  \
}
TRILU(trilu_u32, uint)
TRILU(trilu_u16, ushort)
TRILU(trilu_u8, uchar)
