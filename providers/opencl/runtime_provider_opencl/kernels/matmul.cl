// Tiled, batched GEMM: Y[b] = alpha * op(A[b]) @ op(B[b]) + beta * C.
//
// op(A) is M x K: A is stored M x K, or K x M when transA. op(B) is K x N: B is
// stored K x N, or N x K when transB. boffs holds, per batch b, the element offsets
// of A[b] and B[b] (numpy batch broadcasting is resolved on the host). C (Gemm only)
// is read at row*csm + col*csn: strides of 0 broadcast it. TS (the tile edge) is a
// build option; a work-group is TS x TS work-items, one output element each.

#ifndef TS
#define TS 16
#endif

__kernel __attribute__((reqd_work_group_size(TS, TS, 1)))
void gemm(__global const real* A, __global const real* B, __global const real* C,
          __global real* Y, const int M, const int N, const int K,
          const int transA, const int transB, const float alpha, const float beta,
          const int hasC, const int csm, const int csn, __global const int* boffs,
          const int nbatch) {
    const int col = get_global_id(0);
    const int row = get_global_id(1);
    const int b = get_global_id(2);
    const int lc = get_local_id(0);
    const int lr = get_local_id(1);
    // a work-group shares b (local size 1 along it), so this return keeps the barriers uniform
    if (b >= nbatch) return;
    __local float As[TS][TS];
    __local float Bs[TS][TS];
    const int offA = boffs[2 * b];
    const int offB = boffs[2 * b + 1];
    float acc = 0.0f;
    for (int t = 0; t < K; t += TS) {
        const int ka = t + lc;
        As[lr][lc] = (row < M && ka < K)
            ? (transA ? LD(A, offA + ka * M + row) : LD(A, offA + row * K + ka)) : 0.0f;
        const int kb = t + lr;
        Bs[lr][lc] = (kb < K && col < N)
            ? (transB ? LD(B, offB + col * K + kb) : LD(B, offB + kb * N + col)) : 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < TS; ++k) {
            acc = fma(As[lr][k], Bs[k][lc], acc);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (row < M && col < N) {
        float v = alpha * acc;
        if (hasC) {
            v += beta * LD(C, row * csm + col * csn);
        }
        ST(Y, (size_t)b * M * N + row * N + col, v);
    }
}
