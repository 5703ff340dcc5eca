// MaxPool / AveragePool (1-D and 2-D, NCHW; 1-D runs with H = KH = 1) and the global
// pools. One work-item per output element; pads are the begin pads, the output size is
// given (ceil_mode is resolved on the host). AveragePool divides by the taps inside the
// input (count_include_pad = 0) or inside the input plus its explicit pads
// (count_include_pad = 1: positions in [-ph, H + peh)), as the CPU provider does.

__kernel void pool2d(__global const real* X, __global real* Y, const int NC,
                     const int H, const int Wd, const int OH, const int OW,
                     const int KH, const int KW, const int sh, const int sw,
                     const int ph, const int pw, const int peh, const int pew,
                     const int dh, const int dw, const int is_max, const int include_pad) {
    const int gid = get_global_id(0);
    if (gid >= NC * OH * OW) return;
    const int ow = gid % OW;
    const int t = gid / OW;
    const int oh = t % OH;
    const int nc = t / OH;
    const size_t xb = (size_t)nc * H * Wd;
    float acc = is_max ? -INFINITY : 0.0f;
    int cnt = 0;
    for (int kh = 0; kh < KH; ++kh) {
        const int ih = oh * sh - ph + kh * dh;
        const int hin = ih >= 0 && ih < H;
        const int hpad = ih >= -ph && ih < H + peh;
        for (int kw = 0; kw < KW; ++kw) {
            const int iw = ow * sw - pw + kw * dw;
            const int win = iw >= 0 && iw < Wd;
            if (hin && win) {
                const float x = LD(X, xb + ih * Wd + iw);
                if (is_max) acc = (isnan(x) || x > acc) ? (isnan(acc) ? acc : x) : acc;
                else acc += x;
            }
            if (include_pad ? (hpad && iw >= -pw && iw < Wd + pew) : (hin && win)) ++cnt;
        }
    }
    if (!is_max) acc = acc / (float)cnt;
    ST(Y, gid, acc);
}

// GlobalAveragePool / GlobalMaxPool: one work-item per (n, c) over `L` spatial elements.
__kernel void global_pool(__global const real* X, __global real* Y, const int NC, const int L,
                          const int is_max) {
    const int r = get_global_id(0);
    if (r >= NC) return;
    const size_t b = (size_t)r * L;
    float acc = is_max ? -INFINITY : 0.0f;
    for (int j = 0; j < L; ++j) {
        const float x = LD(X, b + j);
        if (is_max) acc = (isnan(x) || x > acc) ? (isnan(acc) ? acc : x) : acc;
        else acc += x;
    }
    ST(Y, r, is_max ? acc : acc / (float)L);
}
