// Row reductions: Softmax / LogSoftmax, LayerNormalization, BatchNormalization (inference)
// and the Reduce* family. Elements are `real` (float or half), arithmetic is float.
//
// A row is `L` elements `inner` apart; rows are indexed by (outer, inner). One
// work-item per row (simple and exact; rows are short in the models this serves).

__kernel void softmax(__global const real* X, __global real* Y, const int outer,
                      const int L, const int inner, const int logmode) {
    const int gid = get_global_id(0);
    if (gid >= outer * inner) return;
    const int o = gid / inner;
    const int in = gid - o * inner;
    const int base = o * L * inner + in;
    float m = -INFINITY;
    for (int l = 0; l < L; ++l) m = fmax(m, LD(X, base + l * inner));
    float s = 0.0f;
    for (int l = 0; l < L; ++l) s += exp(LD(X, base + l * inner) - m);
    if (logmode) {
        const float ls = log(s);
        for (int l = 0; l < L; ++l) ST(Y, base + l * inner, LD(X, base + l * inner) - m - ls);
    } else {
        const float r = 1.0f / s;
        for (int l = 0; l < L; ++l) ST(Y, base + l * inner, exp(LD(X, base + l * inner) - m) * r);
    }
}

// Y = (X - mean) / sqrt(var + eps) * S + B over the last D elements of each row.
// S and B have D elements (sstride/bstride 1) or one (stride 0). Mean and InvStdDev
// are written when requested (one value per row).
__kernel void layernorm(__global const real* X, __global const real* S,
                        __global const real* Bi, __global real* Y,
                        __global real* Mean, __global real* Inv,
                        const int rows, const int D, const float eps,
                        const int sstride, const int hasB, const int bstride,
                        const int writeMean, const int writeInv) {
    const int r = get_global_id(0);
    if (r >= rows) return;
    const int base = r * D;
    float sum = 0.0f;
    for (int j = 0; j < D; ++j) sum += LD(X, base + j);
    const float mean = sum / (float)D;
    float sq = 0.0f;
    for (int j = 0; j < D; ++j) {
        const float d = LD(X, base + j) - mean;
        sq += d * d;
    }
    const float inv = 1.0f / sqrt(sq / (float)D + eps);
    for (int j = 0; j < D; ++j) {
        float v = (LD(X, base + j) - mean) * inv * LD(S, j * sstride);
        if (hasB) v += LD(Bi, j * bstride);
        ST(Y, base + j, v);
    }
    if (writeMean) ST(Mean, r, mean);
    if (writeInv) ST(Inv, r, inv);
}

// RMSNormalization: Y = X / sqrt(mean(X^2) + eps) * S over the last D elements of each row.
__kernel void rmsnorm(__global const real* X, __global const real* S, __global real* Y,
                      const int rows, const int D, const float eps, const int sstride) {
    const int r = get_global_id(0);
    if (r >= rows) return;
    const int base = r * D;
    float sq = 0.0f;
    for (int j = 0; j < D; ++j) {
        const float x = LD(X, base + j);
        sq += x * x;
    }
    const float rms = sqrt(sq / (float)D + eps);
    for (int j = 0; j < D; ++j) ST(Y, base + j, (LD(X, base + j) / rms) * LD(S, j * sstride));
}

// BatchNormalization in inference mode: channel c = (i / inner) % C.
__kernel void batchnorm(__global const real* X, __global const real* S, __global const real* B,
                        __global const real* Mean, __global const real* Var, __global real* Y,
                        const int n, const int C, const int inner, const float eps) {
    const int i = get_global_id(0);
    if (i >= n) return;
    const int c = (i / inner) % C;
    const float inv = LD(S, c) / sqrt(LD(Var, c) + eps);  // the CPU provider's form
    ST(Y, i, LD(X, i) * inv + (LD(B, c) - LD(Mean, c) * inv));
}

// Reduce*: one work-item per output element. meta = [output dims (ro) | their strides
// in X (ro) | reduced dims (rr) | their strides in X (rr)]; nred = product of reduced dims.
// op: 0 sum, 1 mean, 2 max, 3 min, 4 prod, 5 L1, 6 L2, 7 log-sum, 8 log-sum-exp, 9 sum-square
inline int red_offset(int j, const int rr, __global const int* rm) {
    int off = 0;
    for (int d = rr - 1; d >= 0; --d) {
        const int dim = rm[d];
        const int q = j / dim;
        off += (j - q * dim) * rm[rr + d];
        j = q;
    }
    return off;
}

__kernel void reduce(__global const real* X, __global real* Y, const int n_out, const int ro,
                     const int rr, const int nred, const int op, __global const int* meta) {
    const int o = get_global_id(0);
    if (o >= n_out) return;
    int base = 0, r = o;
    for (int d = ro - 1; d >= 0; --d) {
        const int dim = meta[d];
        const int q = r / dim;
        base += (r - q * dim) * meta[ro + d];
        r = q;
    }
    __global const int* rm = meta + 2 * ro;
    float acc;
    if (op == 2 || op == 3) {
        acc = op == 2 ? -INFINITY : INFINITY;
        for (int j = 0; j < nred; ++j) {
            const float x = LD(X, base + red_offset(j, rr, rm));
            if (isnan(x)) { acc = x; break; }
            acc = op == 2 ? fmax(acc, x) : fmin(acc, x);
        }
    } else if (op == 4) {
        acc = 1.0f;
        for (int j = 0; j < nred; ++j) acc *= LD(X, base + red_offset(j, rr, rm));
    } else if (op == 8) {
        float m = -INFINITY;
        for (int j = 0; j < nred; ++j) m = fmax(m, LD(X, base + red_offset(j, rr, rm)));
        const float shift = isfinite(m) ? m : 0.0f;
        float s = 0.0f;
        for (int j = 0; j < nred; ++j) s += exp(LD(X, base + red_offset(j, rr, rm)) - shift);
        acc = log(s) + shift;
    } else {
        acc = 0.0f;
        for (int j = 0; j < nred; ++j) {
            const float x = LD(X, base + red_offset(j, rr, rm));
            acc += (op == 5) ? fabs(x) : (op == 6 || op == 9) ? x * x : x;
        }
        if (op == 1) acc /= (float)nred;
        else if (op == 6) acc = sqrt(acc);
        else if (op == 7) acc = log(acc);
    }
    ST(Y, o, acc);
}

// CumSum along one axis: one work-item per (outer, inner) line of L elements, sequential
// float accumulation in the line's order (reversed when `reverse`), as numpy's accumulate.
__kernel void cumsum(__global const real* X, __global real* Y, const int outer, const int L,
                     const int inner, const int exclusive, const int reverse) {
    const int g = get_global_id(0);
    if (g >= outer * inner) return;
    const int o = g / inner;
    const int in = g - o * inner;
    const int base = o * L * inner + in;
    float acc = 0.0f;
    for (int t = 0; t < L; ++t) {
        const int l = reverse ? L - 1 - t : t;
        const float x = LD(X, base + l * inner);
        if (exclusive) { ST(Y, base + l * inner, acc); acc += x; }
        else { acc += x; ST(Y, base + l * inner, acc); }
    }
}
