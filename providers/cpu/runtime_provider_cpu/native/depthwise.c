/* depthwise2d: a 2-D depthwise convolution (one input and one output channel per group) in
 * float32 with the bias and a clip (Relu, Clip/ReLU6, or none) fused into the same pass: each
 * channel padded once into a small scratch plane that stays in cache, every output finished in
 * registers. 3x3 kernels of stride 1 or 2 run 8 outputs a vector (the stride-2 plane split
 * into its even and odd columns so that all loads are unit-stride); on AVX-512 machines 3x3,
 * 5x5 and 7x7 windows of stride 1 or 2 both ways go to depthwise_avx512.c instead. */
#include "native.h"

/* 3x3, dilation 1, stride 1 or 2, over planes whose rows are at least OWr + 2 floats
 * (OWr: OW rounded up to 8) so that every output row is whole 8-wide vectors; the last
 * vector's extra lanes go to a scratch row. Stride 1 reads one plane at columns ox + kx;
 * stride 2 reads the even columns (pe) at ox and ox + 1 and the odd ones (po) at ox, so
 * both are unit-stride loads. */
RC_CLONES
static void dw3x3(const float *restrict pe, const float *restrict po, Py_ssize_t Ws,
                  const float *restrict wk, float bias, float *restrict y, Py_ssize_t OH,
                  Py_ssize_t OW, Py_ssize_t sh, float lo, float hi)
{
    const v8f w0 = v8_set1(wk[0]), w1 = v8_set1(wk[1]), w2 = v8_set1(wk[2]), w3 = v8_set1(wk[3]),
              w4 = v8_set1(wk[4]), w5 = v8_set1(wk[5]), w6 = v8_set1(wk[6]), w7 = v8_set1(wk[7]),
              w8 = v8_set1(wk[8]), vb = v8_set1(bias), vlo = v8_set1(lo), vhi = v8_set1(hi);
    float tail[8];
    for (Py_ssize_t oy = 0; oy < OH; oy++) {
        const Py_ssize_t r = oy * sh * Ws;
        const float *e0 = pe + r, *e1 = e0 + Ws, *e2 = e1 + Ws;
        const float *o0 = po ? po + r : e0 + 1, *o1 = o0 + Ws, *o2 = o1 + Ws;
        /* stride 1: taps at e + ox, e + ox + 1 (= o), e + ox + 2; stride 2: e, o, e + 1 */
        const Py_ssize_t third = po ? 1 : 2;
        float *row = y + oy * OW;
        for (Py_ssize_t ox = 0; ox < OW; ox += 8) {
            v8f v = vb + w0 * v8_load(e0 + ox) + w1 * v8_load(o0 + ox) + w2 * v8_load(e0 + ox + third)
                    + w3 * v8_load(e1 + ox) + w4 * v8_load(o1 + ox) + w5 * v8_load(e1 + ox + third)
                    + w6 * v8_load(e2 + ox) + w7 * v8_load(o2 + ox) + w8 * v8_load(e2 + ox + third);
            /* clip as clipf does: NaN stays NaN */
            v = v8_select(v < vlo, vlo, v);
            v = v8_select(v > vhi, vhi, v);
            /* a short last vector may spill into the rows below, which are written after
               it, but never past the plane's end */
            if (ox + 8 <= OW || oy * OW + ox + 8 <= OH * OW)
                v8_store(row + ox, v);
            else {
                v8_store(tail, v);
                for (Py_ssize_t i = 0; i < OW - ox; i++)
                    row[ox + i] = tail[i];
            }
        }
    }
}

/* one channel, any kernel but the 3x3 ones dw3x3 takes: xp is the padded plane [Hp, Wp];
   y the output plane [OH, OW] */
RC_CLONES
static void dw_plane(const float *restrict xp, Py_ssize_t Wp, const float *restrict wk,
                     Py_ssize_t KH, Py_ssize_t KW, float bias, float *restrict y,
                     Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t sh, Py_ssize_t sw,
                     Py_ssize_t dh, Py_ssize_t dw, float lo, float hi)
{
    /* any other kernel: one multiply-add per tap over an output row that stays in L1 */
    for (Py_ssize_t oy = 0; oy < OH; oy++) {
        float *row = y + oy * OW;
        for (Py_ssize_t ox = 0; ox < OW; ox++)
            row[ox] = bias;
        for (Py_ssize_t ky = 0; ky < KH; ky++) {
            const float *src = xp + (oy * sh + ky * dh) * Wp;
            for (Py_ssize_t kx = 0; kx < KW; kx++) {
                const float wv = wk[ky * KW + kx];
                const float *s = src + kx * dw;
                if (sw == 1) {
                    for (Py_ssize_t ox = 0; ox < OW; ox++)
                        row[ox] += wv * s[ox];
                } else {
                    for (Py_ssize_t ox = 0; ox < OW; ox++)
                        row[ox] += wv * s[ox * sw];
                }
            }
        }
        for (Py_ssize_t ox = 0; ox < OW; ox++)
            row[ox] = clipf(row[ox], lo, hi);
    }
}

typedef struct {
    const float *x, *w, *b;
    float *y;
    Py_ssize_t N, C, H, W, OH, OW, sh, sw, pt, pl, Hp, Ws;
    float lo, hi;
    float *planes; /* one scratch plane of plane_n floats a part */
    Py_ssize_t plane_n;
    Py_ssize_t KH, KW, dh, dw; /* dw_direct's window */
} dw_job;

/* the vector (3x3, dilation 1) depthwise path over channel planes [p0, p1) of the N * C
 * (cloned: the row copies and the even / odd split of stride 2 are vector code too) */
RC_CLONES
static void dw_vec_range(const dw_job *j, float *plane, Py_ssize_t p0, Py_ssize_t p1)
{
    const Py_ssize_t H = j->H, W = j->W, OH = j->OH, OW = j->OW, sh = j->sh, sw = j->sw;
    const Py_ssize_t pt = j->pt, pl = j->pl, Hp = j->Hp, Ws = j->Ws, C = j->C;
    float *pe = plane, *po = plane + Hp * Ws, *tmp = plane + 2 * Hp * Ws;
    const Py_ssize_t span = sw == 1 ? Ws : 2 * Ws + 2; /* padded columns a plane row holds */
    /* input columns [0, ic1) land at padded columns [pl, pl + ic1); input rows
       [0, ir1) at plane rows [pt, pt + ir1). Everything else is padding, zeroed once
       here and never written: each channel overwrites only the same data region. */
    const Py_ssize_t ic1 = W < span - pl ? W : (span - pl > 0 ? span - pl : 0);
    const Py_ssize_t ir1 = H < Hp - pt ? H : (Hp - pt > 0 ? Hp - pt : 0);
    memset(plane, 0, (size_t)(2 * Hp * Ws + 2 * Ws + 2) * sizeof(float));
    for (Py_ssize_t p = p0; p < p1; p++) {
        if (rc_stop_requested()) /* the run was cancelled: its output is discarded */
            return;
        const Py_ssize_t c = p % C;
        const float *xc = j->x + p * H * W;
        for (Py_ssize_t xr = 0; xr < ir1; xr++) {
            const float *src = xc + xr * W;
            const Py_ssize_t r = xr + pt;
            /* inline copies: a row is often 7-28 floats, where a libc call costs
               more than the copy */
            if (sw == 1) {
                float *dst = pe + r * Ws + pl;
                for (Py_ssize_t i = 0; i < ic1; i++)
                    dst[i] = src[i];
            } else {
                float *dst = tmp + pl;
                for (Py_ssize_t i = 0; i < ic1; i++)
                    dst[i] = src[i];
                float *er = pe + r * Ws, *orow = po + r * Ws;
                for (Py_ssize_t i = 0; i < Ws; i++) {
                    er[i] = tmp[2 * i];
                    orow[i] = tmp[2 * i + 1];
                }
            }
        }
        dw3x3(pe, sw == 2 ? po : NULL, Ws, j->w + c * 9, j->b ? j->b[c] : 0.0f,
              j->y + p * OH * OW, OH, OW, sh, j->lo, j->hi);
    }
}

/* channel planes [p0, p1) without a padded plane: every output the sum of its window's taps
 * in dw_plane's order, a tap in the padding reading 0 (windows of extreme strides, dilations
 * or pads, whose padded plane would be sized by the padding) */
RC_CLONES
static void dw_direct(const dw_job *j, Py_ssize_t p0, Py_ssize_t p1)
{
    const Py_ssize_t H = j->H, W = j->W, OH = j->OH, OW = j->OW, KH = j->KH, KW = j->KW;
    for (Py_ssize_t p = p0; p < p1; p++) {
        if (rc_stop_requested()) /* the run was cancelled: its output is discarded */
            return;
        const Py_ssize_t c = p % j->C;
        const float *xc = j->x + p * H * W, *wk = j->w + c * KH * KW;
        float *yc = j->y + p * OH * OW;
        for (Py_ssize_t oy = 0; oy < OH; oy++)
            for (Py_ssize_t ox = 0; ox < OW; ox++) {
                float acc = j->b ? j->b[c] : 0.0f;
                for (Py_ssize_t ky = 0; ky < KH; ky++) {
                    const rc_wide r = (rc_wide)oy * j->sh + (rc_wide)ky * j->dh - j->pt;
                    for (Py_ssize_t kx = 0; kx < KW; kx++) {
                        const rc_wide q = (rc_wide)ox * j->sw + (rc_wide)kx * j->dw - j->pl;
                        const float xv = r >= 0 && r < H && q >= 0 && q < W ? xc[(Py_ssize_t)r * W + (Py_ssize_t)q] : 0.0f;
                        acc += wk[ky * KW + kx] * xv;
                    }
                }
                yc[oy * OW + ox] = clipf(acc, j->lo, j->hi);
            }
    }
}

static void dw_direct_part(void *arg, int part, int parts)
{
    const dw_job *j = (const dw_job *)arg;
    const Py_ssize_t n = j->N * j->C;
    dw_direct(j, n * part / parts, n * (part + 1) / parts);
}

static void dw_part(void *arg, int part, int parts)
{
    const dw_job *j = (const dw_job *)arg;
    const Py_ssize_t n = j->N * j->C;
    dw_vec_range(j, j->planes + part * j->plane_n, n * part / parts, n * (part + 1) / parts);
}

PyObject *rc_py_depthwise2d(PyObject *self, PyObject *args)
{
    PyObject *xo, *wo, *bo, *yo;
    Py_ssize_t N, C, H, W, OH, OW, KH, KW, sh, sw, dh, dw, pt, pl;
    float lo, hi;
    int threads = 1, fast = 1, lanes = 0;
    rc_act act = {-1, 1.0f / 6.0f, 0.5f};
    if (!PyArg_ParseTuple(args, "OOOO(nnnn)(nn)(nn)(nn)(nn)(nn)ff|iiiiff:depthwise2d", &xo, &wo, &bo, &yo,
                          &N, &C, &H, &W, &OH, &OW, &KH, &KW, &sh, &sw, &dh, &dw, &pt, &pl, &lo, &hi,
                          &threads, &fast, &lanes, &act.act, &act.alpha, &act.beta))
        return NULL;
    if (act.act < -1 || act.act > 3) {
        PyErr_SetString(PyExc_ValueError, "depthwise2d: activation kind not in -1..3");
        return NULL;
    }
    if (fast < 0 || fast > 3) {
        PyErr_SetString(PyExc_ValueError, "depthwise2d: fast not in 0..3");
        return NULL;
    }
    if (lanes < 0 || lanes > 2) {
        PyErr_SetString(PyExc_ValueError, "depthwise2d: lanes not in 0..2");
        return NULL;
    }
    act.act += 1; /* activate's kind -> rc_act's */
    const rc_act *ap = act.act ? &act : NULL;
    if (N < 0 || C < 0 || H < 0 || W < 0 || OH < 0 || OW < 0 || KH < 1 || KW < 1 || sh < 1 ||
        sw < 1 || dh < 1 || dw < 1 || pt < 0 || pl < 0) {
        PyErr_SetString(PyExc_ValueError, "depthwise2d: negative or zero size, stride or dilation");
        return NULL;
    }
    /* lanes 2: W packed for the lanes kernel, [ceil(C / 16)][KH * KW][16], which no other path reads */
#if DWF_OK
    const int packed_ok = dwl_takes(KH, KW, dh, dw);
#else
    const int packed_ok = 0;
#endif
    if (lanes == 2 && !packed_ok) {
        PyErr_SetString(PyExc_ValueError, "depthwise2d: packed weights (lanes=2) need the AVX-512 lanes kernel: "
                                          "dilation 1, windows up to 7x7, CONV_FAST");
        return NULL;
    }
    rc_sz sz = {NULL};
    const Py_ssize_t xn = sz_mul4(&sz, "X's size", N, C, H, W),
                     wn = sz_mul3(&sz, "W's size", lanes == 2 ? sz_add(&sz, "W's size", C, 15) / 16 * 16 : C, KH, KW);
    const Py_ssize_t yn = sz_mul4(&sz, "Y's size", N, C, OH, OW);
    if (sz_check(&sz, "depthwise2d", PyExc_ValueError) < 0)
        return NULL;
    /* the padded extent every output reads: rows [-pt, Hp - pt), columns [-pl, Wp - pl) */
    rc_sz ps = {NULL};
    const Py_ssize_t Hp = sz_extent(&ps, "the padded plane", OH, sh, KH, dh);
    const Py_ssize_t Wp = sz_extent(&ps, "the padded plane", OW, sw, KW, dw);
    Py_buffer v[4]; /* X, W, B, Y */
    const rc_buf spec[4] = {{xo, xn, RC_F32, 0, 0, "X"}, {wo, wn, RC_F32, 0, 0, "W"},
                            {bo, C, RC_F32, 0, 1, "B"}, {yo, yn, RC_F32, 1, 0, "Y"}};
    if (get_buffers("depthwise2d", spec, v, 4) < 0)
        return NULL;
#if DWF_OK
    /* lanes: 16 channels of an image in the vector lanes (small planes, chosen by measurement) */
    if (lanes && dwl_takes(KH, KW, dh, dw) && OH > 0 && OW > 0 && N * C > 0) {
        const Py_ssize_t g[12] = {N, C, H, W, OH, OW, KH, KW, sh, sw, pt, pl};
        return dwl_run((const float *)v[0].buf, (const float *)v[1].buf, (const float *)v[2].buf, (float *)v[3].buf,
                       g, lo, hi, ap, threads, v, 4, lanes == 2);
    }
    if (lanes == 2) { /* no output to compute */
        release_buffers(v, 4);
        Py_RETURN_NONE;
    }
    if (fast && dwf_takes_k(KH, KW, sh, sw, dh, dw, OH, OW, N * C)) {
        dwf_job fj = {(const float *)v[0].buf, (const float *)v[1].buf, (const float *)v[2].buf,
                      (float *)v[3].buf, N * C, C, H, W, OH, OW, sh, pt, pl, 0, 0, 0, 0, lo, hi, NULL, 0, 0};
        fj.k = KH;
        fj.act = ap;
        /* fast 2: the phase planes (kept for maxpool2d, and to compare); 1 and 3 the direct
           rows, measured faster on every MobileNet / EfficientNet / ConvNeXt shape (issue 27) */
        fj.direct = fast != 2;
        return dwf_run(&fj, threads, v, 4);
    }
#endif
    /* 3x3, dilation 1, column stride 1 or 2: the vector kernel (dw3x3) over planes of row
       stride Ws, the stride-2 input split into even and odd columns */
    const int vec = KH == 3 && KW == 3 && dh == 1 && dw == 1 && (sw == 1 || sw == 2) && OW > 0 && OH > 0;
    const Py_ssize_t OWr = sz_add(&ps, "the padded plane", OW, 7) / 8 * 8, Ws = sz_add(&ps, "the padded plane", OWr, 2);
    float *plane = NULL;
    /* channel planes split between the kernel threads (a thread from about 8K outputs), each
       part with its own scratch plane */
    const int parts = rc_parts((double)N * (double)C * (double)OH * (double)OW, 8192.0, N * C, &threads);
    /* [even or whole plane][odd plane][one padded input row of 2 * Ws + 2], one a part */
    const Py_ssize_t plane_n = sz_add(&ps, "the padded plane", sz_mul3(&ps, "the padded plane", 2, Hp, Ws),
                                      sz_add(&ps, "the padded plane", sz_mul(&ps, "the padded plane", 2, Ws), 2));
    const Py_ssize_t gen_n = sz_mul(&ps, "the padded plane", Hp, Wp);
    /* a padded plane far larger than the data (extreme strides, dilations or pads): no plane */
    if (ps.what || !sz_scratch_ok(vec ? plane_n : gen_n, H * W + OH * OW)) {
        dw_job dj = {(const float *)v[0].buf, (const float *)v[1].buf, (const float *)v[2].buf, (float *)v[3].buf,
                     N, C, H, W, OH, OW, sh, sw, pt, pl, 0, 0, lo, hi, NULL, 0, KH, KW, dh, dw};
        Py_BEGIN_ALLOW_THREADS
        rc_parallel(dw_direct_part, &dj, parts, threads);
        act_block((float *)v[3].buf, 0, 1, yn, ap);
        Py_END_ALLOW_THREADS
        release_buffers(v, 4);
        Py_RETURN_NONE;
    }
    /* a pad past the extent reads the same as one at its end (and keeps the copies in range) */
    pt = pt < Hp ? pt : Hp;
    pl = pl < Wp ? pl : Wp;
    const Py_ssize_t bytes = sz_mul(&ps, "the padded plane", vec ? sz_mul(&ps, "the padded plane", parts, plane_n) : gen_n,
                                    RC_F32);
    if (sz_check(&ps, "depthwise2d", PyExc_MemoryError) < 0) {
        release_buffers(v, 4);
        return NULL;
    }
    if (vec || gen_n > 0) {
        plane = (float *)malloc((size_t)bytes);
        if (!plane) {
            release_buffers(v, 4);
            return PyErr_NoMemory();
        }
    }
    const float *x = (const float *)v[0].buf, *w = (const float *)v[1].buf;
    const float *b = (const float *)v[2].buf; /* NULL without a bias */
    float *y = (float *)v[3].buf;
    /* the input rows and columns that land inside the padded plane */
    const Py_ssize_t r0 = pt, r1 = pt + H < Hp ? pt + H : Hp;   /* plane rows holding input */
    const Py_ssize_t c0 = pl, c1 = pl + W < Wp ? pl + W : Wp;
    dw_job dj = {x, w, b, y, N, C, H, W, OH, OW, sh, sw, pt, pl, Hp, Ws, lo, hi, plane, plane_n, KH, KW, dh, dw};
    Py_BEGIN_ALLOW_THREADS
    if (vec)
        rc_parallel(dw_part, &dj, parts, threads);
    for (Py_ssize_t n = 0; n < N && plane && !vec; n++) {
        for (Py_ssize_t c = 0; c < C && !rc_stop_requested(); c++) { /* stops with its run */
            const float *xc = x + (n * C + c) * H * W;
            if (r0 < r1 && c0 < c1) {
                memset(plane, 0, (size_t)(r0 * Wp) * sizeof(float));
                for (Py_ssize_t r = r0; r < r1; r++) {
                    float *dst = plane + r * Wp;
                    memset(dst, 0, (size_t)c0 * sizeof(float));
                    memcpy(dst + c0, xc + (r - pt) * W, (size_t)(c1 - c0) * sizeof(float));
                    memset(dst + c1, 0, (size_t)(Wp - c1) * sizeof(float));
                }
                memset(plane + r1 * Wp, 0, (size_t)((Hp - r1) * Wp) * sizeof(float));
            } else {
                memset(plane, 0, (size_t)(Hp * Wp) * sizeof(float));
            }
            dw_plane(plane, Wp, w + c * KH * KW, KH, KW, b ? b[c] : 0.0f,
                     y + (n * C + c) * OH * OW, OH, OW, sh, sw, dh, dw, lo, hi);
        }
    }
    /* the paths without the activation in their epilogue: one pass after */
    act_block(y, 0, 1, yn, ap);
    Py_END_ALLOW_THREADS
    free(plane);
    release_buffers(v, 4);
    Py_RETURN_NONE;
}
