// Row reductions: Softmax / LogSoftmax and LayerNormalization.
//
// A row is `L` elements `inner` apart; rows are indexed by (outer, inner). One
// work-item per row (simple and exact; rows are short in the models this serves).

__kernel void softmax(__global const float* X, __global float* Y, const int outer,
                      const int L, const int inner, const int logmode) {
    const int gid = get_global_id(0);
    if (gid >= outer * inner) return;
    const int o = gid / inner;
    const int in = gid - o * inner;
    const int base = o * L * inner + in;
    float m = -INFINITY;
    for (int l = 0; l < L; ++l) m = fmax(m, X[base + l * inner]);
    float s = 0.0f;
    for (int l = 0; l < L; ++l) s += exp(X[base + l * inner] - m);
    if (logmode) {
        const float ls = log(s);
        for (int l = 0; l < L; ++l) Y[base + l * inner] = X[base + l * inner] - m - ls;
    } else {
        const float r = 1.0f / s;
        for (int l = 0; l < L; ++l) Y[base + l * inner] = exp(X[base + l * inner] - m) * r;
    }
}

// Y = (X - mean) / sqrt(var + eps) * S + B over the last D elements of each row.
// S and B have D elements (sstride/bstride 1) or one (stride 0). Mean and InvStdDev
// are written when requested (one value per row).
__kernel void layernorm(__global const float* X, __global const float* S,
                        __global const float* Bi, __global float* Y,
                        __global float* Mean, __global float* Inv,
                        const int rows, const int D, const float eps,
                        const int sstride, const int hasB, const int bstride,
                        const int writeMean, const int writeInv) {
    const int r = get_global_id(0);
    if (r >= rows) return;
    const int base = r * D;
    float sum = 0.0f;
    for (int j = 0; j < D; ++j) sum += X[base + j];
    const float mean = sum / (float)D;
    float sq = 0.0f;
    for (int j = 0; j < D; ++j) {
        const float d = X[base + j] - mean;
        sq += d * d;
    }
    const float inv = 1.0f / sqrt(sq / (float)D + eps);
    for (int j = 0; j < D; ++j) {
        float v = (X[base + j] - mean) * inv * S[j * sstride];
        if (hasB) v += Bi[j * bstride];
        Y[base + j] = v;
    }
    if (writeMean) Mean[r] = mean;
    if (writeInv) Inv[r] = inv;
}
