// Direct 2-D convolution, NCHW, groups (depthwise included), strides, pads, dilations.
// One work-item per output element; 1-D convolutions run with H = KH = 1.
// W is M x (C/group) x KH x KW; pads are the begin pads (the output size is given).

__kernel void conv2d(__global const real* X, __global const real* W,
                     __global const real* Bias, __global real* Y,
                     const int N, const int C, const int H, const int Wd,
                     const int M, const int OH, const int OW, const int KH, const int KW,
                     const int sh, const int sw, const int ph, const int pw,
                     const int dh, const int dw, const int group, const int hasBias) {
    const int gid = get_global_id(0);
    if (gid >= N * M * OH * OW) return;
    const int ow = gid % OW;
    int t = gid / OW;
    const int oh = t % OH;
    t /= OH;
    const int m = t % M;
    const int n = t / M;
    const int cpg = C / group;
    const int mpg = M / group;
    const int g = m / mpg;
    float acc = 0.0f;
    for (int c = 0; c < cpg; ++c) {
        const int ic = g * cpg + c;
        const size_t xp = ((size_t)n * C + ic) * H * Wd;
        const size_t wp = ((size_t)m * cpg + c) * KH * KW;
        for (int kh = 0; kh < KH; ++kh) {
            const int ih = oh * sh - ph + kh * dh;
            if (ih < 0 || ih >= H) continue;
            for (int kw = 0; kw < KW; ++kw) {
                const int iw = ow * sw - pw + kw * dw;
                if (iw < 0 || iw >= Wd) continue;
                acc = fma(LD(X, xp + ih * Wd + iw), LD(W, wp + kh * KW + kw), acc);
            }
        }
    }
    if (hasBias) acc += LD(Bias, m);
    ST(Y, gid, acc);
}
