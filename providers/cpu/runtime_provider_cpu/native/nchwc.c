#include "native.h"

/* The blocked layout (NCHW16c) kernels: a tensor [N][CB][H][W][16], CB = ceil(C / 16), the
 * channels in blocks of 16 as the innermost dimension, lanes past C padded. A 1x1 convolution is
 * then a GEMM with the positions as rows and the 16-channel blocks as lanes (x broadcast straight
 * from the blocked input, no packing of x, no padded columns); a depthwise tap is one vector FMA a
 * position (no column masks); squeeze-excite and the global mean are passes over whole vectors.
 * fast/nchwc.py runs chains of convolutions this way between one reorder in and one out.
 * AVX-512 only (CONV_FAST): elsewhere NCHWC is 0 and the path is not used. */

#if DWF_OK

typedef struct {
    float lo, hi;
    rc_act act; /* act 0: none */
} nc_epi;

DWF_TARGET static inline __m512 nc_fin(__m512 v, const nc_epi *e)
{
    /* the bound first: a NaN stays NaN, as clipf keeps it */
    v = _mm512_max_ps(_mm512_set1_ps(e->lo), v);
    v = _mm512_min_ps(_mm512_set1_ps(e->hi), v);
    return e->act.act ? (__m512)rc_act16((v16f)v, &e->act) : v;
}

/* The padded row width of a depthwise window pass: it covers every window of the row (the right
 * pad may exceed the given one) and the whole input row. */
static inline Py_ssize_t nc_padded_w(Py_ssize_t OW, Py_ssize_t sw, Py_ssize_t KW, Py_ssize_t pl, Py_ssize_t W)
{
    const Py_ssize_t wp = (OW - 1) * sw + KW;
    return wp < pl + W ? pl + W : wp;
}

/* Output rows a unit of a depthwise pass: whole planes, or where there are fewer than 4 planes a
 * thread, bands of rows (at least min_rows, or OH where fewer) making about 4 units a thread. */
static inline Py_ssize_t nc_band(Py_ssize_t OH, Py_ssize_t planes, int th, Py_ssize_t min_rows)
{
    const Py_ssize_t want = (Py_ssize_t)th * 4;
    if (planes >= want)
        return OH;
    const Py_ssize_t band = (OH * planes + want - 1) / want, low = OH < min_rows ? (OH > 0 ? OH : 1) : min_rows;
    return band < low ? low : band;
}

/* ---- reorders ---------------------------------------------------------------------------- */

typedef struct {
    float *x, *y; /* x NCHW [N][C][HW], y blocked [N][CB][HW][16] */
    Py_ssize_t N, C, CB, HW;
    int to_blocked;
} nc_reorder_job;

DWF_TARGET static void nc_reorder_part(void *arg, int part, int parts)
{
    const nc_reorder_job *j = (const nc_reorder_job *)arg;
    const Py_ssize_t units = j->N * j->CB, HW = j->HW;
    for (Py_ssize_t u = units * part / parts; u < units * (part + 1) / parts; u++) {
        const Py_ssize_t n = u / j->CB, cb = u % j->CB, c0 = cb * 16;
        const int nc = (int)(j->C - c0 < 16 ? j->C - c0 : 16);
        float *xc = j->x + (n * j->C + c0) * HW, *yb = j->y + u * HW * 16;
        for (Py_ssize_t p = 0; p < HW; p += 16) {
            const int np = (int)(HW - p < 16 ? HW - p : 16);
            const __mmask16 pm = dwf_mask(np);
            __m512 r[16];
            if (j->to_blocked) {
                for (int c = 0; c < 16; c++)
                    r[c] = c < nc ? _mm512_maskz_loadu_ps(pm, xc + c * HW + p) : _mm512_setzero_ps();
                rc_tr16_ps(r);
                for (int i = 0; i < np; i++)
                    _mm512_storeu_ps(yb + (p + i) * 16, r[i]);
            } else {
                for (int i = 0; i < 16; i++)
                    r[i] = i < np ? _mm512_loadu_ps(yb + (p + i) * 16) : _mm512_setzero_ps();
                rc_tr16_ps(r);
                for (int c = 0; c < nc; c++)
                    _mm512_mask_storeu_ps(xc + c * HW + p, pm, r[c]);
            }
        }
    }
}

/* ---- 1x1 convolution ------------------------------------------------------------------- */

#define NC_R 12 /* positions a tile: 12 x 2 accumulators, 2 FMAs a broadcast */

typedef struct {
    const float *x, *w, *b, *z;
    float *y;
    Py_ssize_t N, CIB, COB, P, G, T; /* G output groups of 2 blocks (the last maybe 1), T tiles */
    nc_epi e;
} nc_pw_job;

/* R positions x NB blocks over CIB input blocks: x at its first position ([CIB][P][16], block
   stride xs, as y's and z's), w [CIB*16][16 NB]; first: start from zero (else from y's partial
   sums), last: the bias, z and the epilogue (else the partial sums stored) */
DWF_TARGET static inline __attribute__((always_inline)) void nc_pw_tile(const float *x, Py_ssize_t xs,
                                                                          Py_ssize_t ys, Py_ssize_t CIB,
                                                                          const float *w,
                                                                          const int NB, const int R,
                                                                          const float *b, const float *z,
                                                                          float *y, const nc_epi *e, int first,
                                                                          int last, const char *pf, int npf)
{
    __m512 a0[NC_R], a1[NC_R];
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) {
        a0[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(y + r * 16);
        a1[r] = first || NB == 1 ? _mm512_setzero_ps() : _mm512_loadu_ps(y + ys + r * 16);
    }
    for (Py_ssize_t cb = 0; cb < CIB; cb++) {
        const float *xb = x + cb * xs;
        /* the next chunk of the weight stream into L2, spread over the tiles' blocks */
        for (int q = 0; q < npf; q++, pf += 64)
            _mm_prefetch(pf, _MM_HINT_T1);
#pragma GCC unroll 2
        for (int k = 0; k < 16; k++) {
            const __m512 w0 = _mm512_loadu_ps(w);
            const __m512 w1 = NB == 2 ? _mm512_loadu_ps(w + 16) : w0;
            w += 16 * NB;
#pragma GCC unroll 12
            for (int r = 0; r < R; r++) {
                const __m512 xv = _mm512_set1_ps(xb[r * 16 + k]);
                a0[r] = _mm512_fmadd_ps(xv, w0, a0[r]);
                if (NB == 2)
                    a1[r] = _mm512_fmadd_ps(xv, w1, a1[r]);
            }
        }
    }
    if (!last) {
#pragma GCC unroll 12
        for (int r = 0; r < R; r++) {
            _mm512_storeu_ps(y + r * 16, a0[r]);
            if (NB == 2)
                _mm512_storeu_ps(y + ys + r * 16, a1[r]);
        }
        return;
    }
    const __m512 b0 = _mm512_loadu_ps(b), b1 = NB == 2 ? _mm512_loadu_ps(b + 16) : b0;
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) {
        __m512 v = _mm512_add_ps(a0[r], b0);
        if (z)
            v = _mm512_add_ps(v, _mm512_loadu_ps(z + r * 16));
        _mm512_storeu_ps(y + r * 16, nc_fin(v, e));
        if (NB == 2) {
            v = _mm512_add_ps(a1[r], b1);
            if (z)
                v = _mm512_add_ps(v, _mm512_loadu_ps(z + ys + r * 16));
            _mm512_storeu_ps(y + ys + r * 16, nc_fin(v, e));
        }
    }
}

#define NC_PW_CASE(R)                                                           \
    case R:                                                                     \
        if (nb == 2)                                                            \
            nc_pw_tile(x, xs, ys, CIB, w, 2, R, b, z, y, e, first, last, pf, npf); \
        else                                                                    \
            nc_pw_tile(x, xs, ys, CIB, w, 1, R, b, z, y, e, first, last, pf, npf); \
        break;

DWF_TARGET static void nc_pw_rows(const float *x, Py_ssize_t xs, Py_ssize_t ys, Py_ssize_t CIB, const float *w,
                                  int nb, int rows,
                                  const float *b, const float *z, float *y, const nc_epi *e, int first, int last,
                                  const char *pf, int npf)
{
    switch (rows) {
        NC_PW_CASE(1) NC_PW_CASE(2) NC_PW_CASE(3) NC_PW_CASE(4) NC_PW_CASE(5) NC_PW_CASE(6)
        NC_PW_CASE(7) NC_PW_CASE(8) NC_PW_CASE(9) NC_PW_CASE(10) NC_PW_CASE(11) NC_PW_CASE(12)
    default:
        break;
    }
}

#define NC_KB 16 /* input blocks a K chunk: 256 channels, a pair's chunk of weights 32 KB (L1) */

/* units (image, output group, tile) in that order; a part's tiles of one group run a K chunk
   at a time, so that the chunk's weights stay in L1 across the tiles */
DWF_TARGET static void nc_pw_part(void *arg, int part, int parts)
{
    const nc_pw_job *j = (const nc_pw_job *)arg;
    const Py_ssize_t units = j->N * j->T * j->G, P = j->P, K = j->CIB * 16, xs = P * 16;
    Py_ssize_t u = units * part / parts;
    const Py_ssize_t u1 = units * (part + 1) / parts;
    while (u < u1) {
        const Py_ssize_t ng = u / j->T, g = ng % j->G, n = ng / j->G;
        const Py_ssize_t t0 = u % j->T, t1 = (ng + 1) * j->T < u1 ? j->T : u1 - ng * j->T;
        const Py_ssize_t cob = 2 * g;
        const int nb = cob + 1 < j->COB ? 2 : 1;
        const float *xn = j->x + n * j->CIB * xs, *wg = j->w + g * K * 32;
        const char *wend = (const char *)(j->w + K * j->COB * 16);
        for (Py_ssize_t c0 = 0; c0 < j->CIB; c0 += NC_KB) {
            const Py_ssize_t cn = j->CIB - c0 < NC_KB ? j->CIB - c0 : NC_KB;
            const float *wc = wg + c0 * 16 * 16 * nb;
            /* the weights are one stream: the next chunk (or group) follows this one; its lines
               asked for across this chunk's tiles, a share of them each input block */
            const char *pf = (const char *)(wc + cn * 16 * 16 * nb);
            Py_ssize_t lines = (wend - pf) / 64;
            lines = lines < NC_KB * 16 * 2 ? lines : NC_KB * 16 * 2;
            const Py_ssize_t steps = (t1 - t0) * cn;
            const int per = lines > 0 ? (int)((lines + steps - 1) / steps) : 0;
            for (Py_ssize_t t = t0; t < t1; t++) {
                const Py_ssize_t p0 = P * t / j->T, p1 = P * (t + 1) / j->T;
                const Py_ssize_t yo = (n * j->COB + cob) * xs + p0 * 16;
                const Py_ssize_t done = (t - t0) * cn * per;
                const int npf = done >= lines ? 0 : per;
                nc_pw_rows(xn + c0 * xs + p0 * 16, xs, xs, cn, wc, nb, (int)(p1 - p0), j->b + cob * 16,
                           j->z ? j->z + yo : NULL, j->y + yo, &j->e, c0 == 0, c0 + cn >= j->CIB,
                           pf + done * 64, npf);
            }
        }
        u = ng * j->T + t1;
    }
}

/* ---- depthwise ------------------------------------------------------------------------- */

typedef struct {
    const float *x, *w, *b;
    float *y;
    Py_ssize_t N, CB, H, W, KH, KW, sh, sw, pt, pl, OH, OW;
    Py_ssize_t Wp, band; /* the padded rows' width, output rows a unit */
    int oom;             /* a part's scratch could not be had: MemoryError */
    nc_epi e;
} nc_dw_job;

/* NP output positions of a row from the zero-padded rows rows[kh] (every tap inside), from
   offset off, KW a constant: NP independent FMA chains */
DWF_TARGET static inline __attribute__((always_inline)) void nc_dw_run(const float *const *rows, Py_ssize_t off,
                                                                      const float *w, Py_ssize_t KH,
                                                                      const int KW, const int NP, Py_ssize_t s16,
                                                                      __m512 bv, float *yr, const nc_epi *e)
{
    __m512 a[8];
#pragma GCC unroll 8
    for (int i = 0; i < NP; i++)
        a[i] = bv;
    for (Py_ssize_t kh = 0; kh < KH; kh++) {
        const float *row = rows[kh] + off, *wk = w + kh * KW * 16;
#pragma GCC unroll 7
        for (int kw = 0; kw < KW; kw++) {
            const __m512 wv = _mm512_loadu_ps(wk + kw * 16);
#pragma GCC unroll 8
            for (int i = 0; i < NP; i++)
                a[i] = _mm512_fmadd_ps(_mm512_loadu_ps(row + i * s16 + kw * 16), wv, a[i]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < NP; i++)
        _mm512_storeu_ps(yr + i * 16, nc_fin(a[i], e));
}

/* an output row: 8 positions a step, the last step (and rows under 8) moved back to end at OW,
   recomputing a few positions with the same values rather than masking */
DWF_TARGET static inline __attribute__((always_inline)) void nc_dw_row(const float *const *rows, const float *w,
                                                                      Py_ssize_t KH, const int KW, Py_ssize_t OW,
                                                                      Py_ssize_t sw, __m512 bv, float *yr,
                                                                      const nc_epi *e)
{
    const Py_ssize_t s16 = sw * 16;
    if (OW >= 8) {
        for (Py_ssize_t ow = 0;; ow += 8) {
            if (ow + 8 > OW)
                ow = OW - 8;
            nc_dw_run(rows, ow * s16, w, KH, KW, 8, s16, bv, yr + ow * 16, e);
            if (ow + 8 >= OW)
                break;
        }
    } else if (OW >= 4) {
        nc_dw_run(rows, 0, w, KH, KW, 4, s16, bv, yr, e);
        nc_dw_run(rows, (OW - 4) * s16, w, KH, KW, 4, s16, bv, yr + (OW - 4) * 16, e);
    } else {
        for (Py_ssize_t ow = 0; ow < OW; ow++)
            nc_dw_run(rows, ow * s16, w, KH, KW, 1, s16, bv, yr + ow * 16, e);
    }
}

/* nc_dw_row with the window width a constant of each of its three instances */
DWF_TARGET static inline __attribute__((always_inline)) void nc_dw_row_kw(const float *const *rows, const float *w,
                                                                         Py_ssize_t KH, Py_ssize_t KW, Py_ssize_t OW,
                                                                         Py_ssize_t sw, __m512 bv, float *yr,
                                                                         const nc_epi *e)
{
    if (KW == 3)
        nc_dw_row(rows, w, KH, 3, OW, sw, bv, yr, e);
    else if (KW == 5)
        nc_dw_row(rows, w, KH, 5, OW, sw, bv, yr, e);
    else
        nc_dw_row(rows, w, KH, 7, OW, sw, bv, yr, e);
}

/* a unit: one band of output rows of one (image, block); the input rows it reads go one at a
   time into a ring of KH zero-padded rows [W + pl + pr][16] (in L1), so that no tap needs a
   bounds check and each input row is copied once */
DWF_TARGET static void nc_dw_part(void *arg, int part, int parts)
{
    const nc_dw_job *j = (const nc_dw_job *)arg;
    const Py_ssize_t bands = (j->OH + j->band - 1) / j->band, units = j->N * j->CB * bands;
    const Py_ssize_t Wp = j->Wp, rs = Wp * 16, KH = j->KH;
    const size_t bytes = (size_t)KH * (size_t)rs * sizeof(float);
    float *ring = (float *)rc_work(bytes);
    if (!ring) {
        ((nc_dw_job *)arg)->oom = 1; /* rc_run_job raises MemoryError */
        return;
    }
    const float *rows[7];
    for (Py_ssize_t u = units * part / parts; u < units * (part + 1) / parts; u++) {
        const Py_ssize_t band = u % bands, nb = u / bands, cb = nb % j->CB;
        const Py_ssize_t oh0 = band * j->band, oh1 = oh0 + j->band < j->OH ? oh0 + j->band : j->OH;
        const Py_ssize_t ih0 = oh0 * j->sh - j->pt;
        const float *xp = j->x + nb * j->H * j->W * 16, *w = j->w + cb * KH * j->KW * 16;
        const __m512 bv = _mm512_loadu_ps(j->b + cb * 16);
        Py_ssize_t filled = 0; /* input rows ih0 .. ih0 + filled - 1 copied so far */
        for (Py_ssize_t oh = oh0; oh < oh1; oh++) {
            const Py_ssize_t top = (oh - oh0) * j->sh;
            for (; filled < top + KH; filled++) {
                float *pr = ring + (filled % KH) * rs;
                const Py_ssize_t ih = ih0 + filled;
                if (ih < 0 || ih >= j->H) {
                    memset(pr, 0, (size_t)rs * sizeof(float));
                    continue;
                }
                memset(pr, 0, (size_t)j->pl * 16 * sizeof(float));
                memcpy(pr + j->pl * 16, xp + ih * j->W * 16, (size_t)j->W * 16 * sizeof(float));
                memset(pr + (j->pl + j->W) * 16, 0, (size_t)(Wp - j->pl - j->W) * 16 * sizeof(float));
            }
            for (Py_ssize_t kh = 0; kh < KH; kh++)
                rows[kh] = ring + ((top + kh) % KH) * rs;
            float *yr = j->y + (nb * j->OH + oh) * j->OW * 16;
            nc_dw_row_kw(rows, w, KH, j->KW, j->OW, j->sw, bv, yr, &j->e);
        }
    }
    rc_work_done(ring, bytes);
}

/* ---- expand 1x1 + depthwise, the expanded tensor never made whole ---------------------- */

typedef struct {
    const float *x, *we, *be, *wd, *bd;
    float *y;
    Py_ssize_t N, CIB, COB, H, W, KH, KW, sh, sw, pt, pl, OH, OW, Wp, band, G;
    int oom;
    nc_epi ee, ed; /* the expand's and the depthwise's epilogues */
} nc_ed_job;

/* a unit: a band of output rows of one (image, pair of expanded blocks); each input row the band
   reads is expanded once, by the 1x1 tiles, straight into the ring's padded rows of both blocks */
DWF_TARGET static void nc_ed_part(void *arg, int part, int parts)
{
    const nc_ed_job *j = (const nc_ed_job *)arg;
    const Py_ssize_t bands = (j->OH + j->band - 1) / j->band, units = j->N * j->G * bands;
    const Py_ssize_t Wp = j->Wp, rs = Wp * 16, KH = j->KH, HW = j->H * j->W, xs = HW * 16;
    const Py_ssize_t K = j->CIB * 16, rb = KH * rs; /* ring: [2][KH][Wp][16] */
    const size_t bytes = (size_t)(2 * rb) * sizeof(float);
    float *ring = (float *)rc_work(bytes);
    if (!ring) {
        ((nc_ed_job *)arg)->oom = 1;
        return;
    }
    const float *rows[7];
    const Py_ssize_t T = (j->W + NC_R - 1) / NC_R;
    for (Py_ssize_t u = units * part / parts; u < units * (part + 1) / parts; u++) {
        const Py_ssize_t band = u % bands, ng = u / bands, g = ng % j->G, n = ng / j->G, cob = 2 * g;
        const int nb = cob + 1 < j->COB ? 2 : 1;
        const Py_ssize_t oh0 = band * j->band, oh1 = oh0 + j->band < j->OH ? oh0 + j->band : j->OH;
        const Py_ssize_t ih0 = oh0 * j->sh - j->pt;
        const float *xn = j->x + n * j->CIB * xs, *wg = j->we + g * K * 32;
        Py_ssize_t filled = 0;
        for (Py_ssize_t oh = oh0; oh < oh1; oh++) {
            const Py_ssize_t top = (oh - oh0) * j->sh;
            for (; filled < top + KH; filled++) {
                float *pr = ring + (filled % KH) * rs;
                const Py_ssize_t ih = ih0 + filled;
                for (int b = 0; b < nb; b++) {
                    if (ih < 0 || ih >= j->H) {
                        memset(pr + b * rb, 0, (size_t)rs * sizeof(float));
                        continue;
                    }
                    memset(pr + b * rb, 0, (size_t)j->pl * 16 * sizeof(float));
                    memset(pr + b * rb + (j->pl + j->W) * 16, 0, (size_t)(Wp - j->pl - j->W) * 16 * sizeof(float));
                }
                if (ih < 0 || ih >= j->H)
                    continue;
                for (Py_ssize_t t = 0; t < T; t++) {
                    const Py_ssize_t p0 = j->W * t / T, p1 = j->W * (t + 1) / T;
                    for (Py_ssize_t c0 = 0; c0 < j->CIB; c0 += NC_KB) {
                        const Py_ssize_t cn = j->CIB - c0 < NC_KB ? j->CIB - c0 : NC_KB;
                        nc_pw_rows(xn + c0 * xs + (ih * j->W + p0) * 16, xs, rb, cn, wg + c0 * 16 * 16 * nb, nb,
                                   (int)(p1 - p0), j->be + cob * 16, NULL, pr + (j->pl + p0) * 16, &j->ee, c0 == 0,
                                   c0 + cn >= j->CIB, NULL, 0);
                    }
                }
            }
            for (int b = 0; b < nb; b++) {
                for (Py_ssize_t kh = 0; kh < KH; kh++)
                    rows[kh] = ring + b * rb + ((top + kh) % KH) * rs;
                const Py_ssize_t cb = cob + b;
                const float *w = j->wd + cb * KH * j->KW * 16;
                const __m512 bv = _mm512_loadu_ps(j->bd + cb * 16);
                float *yr = j->y + ((n * j->COB + cb) * j->OH + oh) * j->OW * 16;
                nc_dw_row_kw(rows, w, KH, j->KW, j->OW, j->sw, bv, yr, &j->ed);
            }
        }
    }
    rc_work_done(ring, bytes);
}

/* ---- squeeze-excite and the global mean ------------------------------------------------ */

typedef struct {
    const float *x, *w1, *b1, *w2, *b2;
    float *y, *s, *h, *g; /* s: means [N][CB * 16], h [N][CR], g: gates [N][CB * 16] */
    Py_ssize_t N, CB, C, CR, HW;
    int phase; /* 0 means, 3 the gated product */
} nc_se_job;

DWF_TARGET static void nc_se_part(void *arg, int part, int parts)
{
    const nc_se_job *j = (const nc_se_job *)arg;
    const Py_ssize_t units = j->N * j->CB, HW = j->HW;
    for (Py_ssize_t u = units * part / parts; u < units * (part + 1) / parts; u++) {
        const float *xb = j->x + u * HW * 16;
        if (j->phase == 0) {
            __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
            Py_ssize_t p = 0;
            for (; p + 4 <= HW; p += 4) {
                s0 = _mm512_add_ps(s0, _mm512_loadu_ps(xb + p * 16));
                s1 = _mm512_add_ps(s1, _mm512_loadu_ps(xb + p * 16 + 16));
                s2 = _mm512_add_ps(s2, _mm512_loadu_ps(xb + p * 16 + 32));
                s3 = _mm512_add_ps(s3, _mm512_loadu_ps(xb + p * 16 + 48));
            }
            for (; p < HW; p++)
                s0 = _mm512_add_ps(s0, _mm512_loadu_ps(xb + p * 16));
            s0 = _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3));
            _mm512_storeu_ps(j->s + u * 16, _mm512_mul_ps(s0, _mm512_set1_ps(1.0f / (float)HW)));
        } else {
            const __m512 gv = _mm512_loadu_ps(j->g + u * 16);
            float *yb = j->y + u * HW * 16;
            for (Py_ssize_t p = 0; p < HW; p++)
                _mm512_storeu_ps(yb + p * 16, _mm512_mul_ps(_mm512_loadu_ps(xb + p * 16), gv));
        }
    }
}

DWF_TARGET static float nc_dot(const float *a, const float *b, Py_ssize_t n)
{
    __m512 s = _mm512_setzero_ps();
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16)
        s = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s);
    if (i < n) {
        const __mmask16 m = dwf_mask(n - i);
        s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s);
    }
    return _mm512_reduce_add_ps(s);
}

/* v[0..n) = fin(v) in place, 16 at a time */
DWF_TARGET static void nc_fin_row(float *v, Py_ssize_t n, const nc_epi *e)
{
    for (Py_ssize_t i = 0; i < n; i += 16) {
        const __mmask16 m = dwf_mask(n - i);
        _mm512_mask_storeu_ps(v + i, m, nc_fin(_mm512_maskz_loadu_ps(m, v + i), e));
    }
}

/* the cache lines of n floats from p into L1 (n 0: none) */
DWF_TARGET static inline void nc_pf_row(const float *p, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i += 16)
        _mm_prefetch((const char *)(p + i), _MM_HINT_T0);
}

/* the two small products of every image, on the caller */
DWF_TARGET static void nc_se_fc(const nc_se_job *j, const nc_epi *ea, const nc_epi *eg)
{
    const Py_ssize_t C = j->C, CR = j->CR, CP = j->CB * 16;
    for (Py_ssize_t n = 0; n < j->N; n++) {
        float *h = j->h + n * CR, *g = j->g + n * CP;
        const float *s = j->s + n * CP;
        /* the weights are read once a run, from memory: rows a few ahead asked for */
        for (Py_ssize_t i = 0; i < CR; i++) {
            nc_pf_row(j->w1 + (i + 4) * C, i + 4 < CR ? C : 0);
            h[i] = nc_dot(j->w1 + i * C, s, C) + (j->b1 ? j->b1[i] : 0.0f);
        }
        nc_fin_row(h, CR, ea);
        for (Py_ssize_t c = 0; c < C; c++) {
            nc_pf_row(j->w2 + (c + 16) * CR, c + 16 < C ? CR : 0);
            g[c] = nc_dot(j->w2 + c * CR, h, CR) + (j->b2 ? j->b2[c] : 0.0f);
        }
        nc_fin_row(g, C, eg);
        for (Py_ssize_t c = C; c < CP; c++)
            g[c] = 0.0f;
    }
}

#endif /* DWF_OK */

int rc_nchwc_ok(void)
{
#if DWF_OK
    return rc_conv_fast;
#else
    return 0;
#endif
}

static const int nc_no_oom = 0; /* rc_run_job: no allocation of ours failed */

static int nc_ready(const char *fn)
{
    if (!rc_nchwc_ok()) {
        PyErr_Format(PyExc_RuntimeError, "%s: the blocked-layout kernels need AVX-512 (NCHWC is 0 here)", fn);
        return 0;
    }
    return 1;
}

/* the epilogue from Python's (lo, hi, activate's kind or -1, alpha, beta) */
static int nc_epi_from(const char *fn, float lo, float hi, int kind, float alpha, float beta, void *out)
{
    if (kind < -1 || kind > 3) {
        PyErr_Format(PyExc_ValueError, "%s: activation kind %d not in -1..3", fn, kind);
        return -1;
    }
#if DWF_OK
    nc_epi *e = (nc_epi *)out;
    e->lo = lo;
    e->hi = hi;
    e->act.act = kind + 1;
    e->act.alpha = alpha;
    e->act.beta = beta;
#else
    (void)lo, (void)hi, (void)alpha, (void)beta, (void)out;
#endif
    return 0;
}

static int nc_sizes_ok(const char *fn, const Py_ssize_t *v, int k)
{
    for (int i = 0; i < k; i++)
        if (v[i] < 1) {
            PyErr_Format(PyExc_ValueError, "%s: sizes must be positive", fn);
            return 0;
        }
    return 1;
}

PyObject *rc_py_nchwc_reorder(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *xo, *yo;
    Py_ssize_t N, C, HW;
    int to_blocked, threads;
    if (!PyArg_ParseTuple(args, "OO(nnn)pi:nchwc_reorder", &xo, &yo, &N, &C, &HW, &to_blocked, &threads))
        return NULL;
    const Py_ssize_t dims[3] = {N, C, HW};
    if (!nc_ready("nchwc_reorder") || !nc_sizes_ok("nchwc_reorder", dims, 3))
        return NULL;
    const Py_ssize_t CB = (C + 15) / 16;
    rc_sz sz = {NULL};
    const Py_ssize_t xn = sz_mul3(&sz, "X's size", N, C, HW), yn = sz_mul3(&sz, "Y's size", N, CB * 16, HW);
    if (sz_check(&sz, "nchwc_reorder", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[2];
    const rc_buf spec[2] = {{xo, xn, RC_F32, !to_blocked, 0, "NCHW"}, {yo, yn, RC_F32, to_blocked, 0, "blocked"}};
    if (get_buffers("nchwc_reorder", spec, v, 2) < 0)
        return NULL;
#if DWF_OK
    nc_reorder_job j = {(float *)v[0].buf, (float *)v[1].buf, N, C, CB, HW, to_blocked};
    int th = threads < 1 ? 1 : threads;
    const int parts = rc_parts(2.0 * (double)yn, 2.5e5, N * CB, &th);
    return rc_run_job(nc_reorder_part, &j, parts, th, v, 2, &nc_no_oom);
#else
    release_buffers(v, 2);
    Py_RETURN_NONE;
#endif
}

PyObject *rc_py_nchwc_pointwise(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *xo, *wo, *bo, *zo, *yo;
    Py_ssize_t N, CIB, COB, P;
    float lo, hi, alpha, beta;
    int kind, threads;
    if (!PyArg_ParseTuple(args, "OOOOO(nnnn)ffiffi:nchwc_pointwise", &xo, &wo, &bo, &zo, &yo, &N, &CIB, &COB, &P,
                          &lo, &hi, &kind, &alpha, &beta, &threads))
        return NULL;
    const Py_ssize_t dims[4] = {N, CIB, COB, P};
    if (!nc_ready("nchwc_pointwise") || !nc_sizes_ok("nchwc_pointwise", dims, 4))
        return NULL;
#if DWF_OK
    nc_pw_job j;
    if (nc_epi_from("nchwc_pointwise", lo, hi, kind, alpha, beta, &j.e) < 0)
        return NULL;
    const Py_ssize_t G = (COB + 1) / 2;
    rc_sz sz = {NULL};
    const Py_ssize_t xn = sz_mul3(&sz, "X's size", N, CIB * 16, P), yn = sz_mul3(&sz, "Y's size", N, COB * 16, P);
    const Py_ssize_t wn = sz_mul(&sz, "W's size", CIB * 16, COB * 16);
    if (sz_check(&sz, "nchwc_pointwise", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[5];
    const rc_buf spec[5] = {{xo, xn, RC_F32, 0, 0, "X"}, {wo, wn, RC_F32, 0, 0, "W"}, {bo, COB * 16, RC_F32, 0, 0, "B"},
                            {zo, yn, RC_F32, 0, 1, "Z"}, {yo, yn, RC_F32, 1, 0, "Y"}};
    if (get_buffers("nchwc_pointwise", spec, v, 5) < 0)
        return NULL;
    j.x = (const float *)v[0].buf;
    j.w = (const float *)v[1].buf;
    j.b = (const float *)v[2].buf;
    j.z = (const float *)v[3].buf;
    j.y = (float *)v[4].buf;
    j.N = N, j.CIB = CIB, j.COB = COB, j.P = P, j.G = G, j.T = (P + NC_R - 1) / NC_R;
    int th = threads < 1 ? 1 : threads;
    const int parts = rc_parts(2.0 * (double)N * (double)P * (double)wn, 2.5e5, N * j.T * G, &th);
    return rc_run_job(nc_pw_part, &j, parts, th, v, 5, &nc_no_oom);
#else
    (void)xo, (void)wo, (void)bo, (void)zo, (void)yo, (void)lo, (void)hi, (void)kind, (void)alpha, (void)beta;
    (void)threads;
    return NULL;
#endif
}

PyObject *rc_py_nchwc_depthwise(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *xo, *wo, *bo, *yo;
    Py_ssize_t N, CB, H, W, KH, KW, sh, sw, pt, pl, OH, OW;
    float lo, hi, alpha, beta;
    int kind, threads;
    if (!PyArg_ParseTuple(args, "OOOO(nnnn)(nn)(nn)(nn)(nn)ffiffi:nchwc_depthwise", &xo, &wo, &bo, &yo, &N, &CB, &H,
                          &W, &KH, &KW, &sh, &sw, &pt, &pl, &OH, &OW, &lo, &hi, &kind, &alpha, &beta, &threads))
        return NULL;
    const Py_ssize_t dims[10] = {N, CB, H, W, KH, KW, sh, sw, OH, OW};
    if (!nc_ready("nchwc_depthwise") || !nc_sizes_ok("nchwc_depthwise", dims, 10))
        return NULL;
    if (pt < 0 || pl < 0 || pt >= KH || pl >= KW || (OH - 1) * sh - pt >= H || (OW - 1) * sw - pl >= W ||
        (KW != 3 && KW != 5 && KW != 7) || KH > 7) {
        PyErr_SetString(PyExc_ValueError, "nchwc_depthwise: KW must be 3, 5 or 7, KH at most 7, and the pads and output size fit the window");
        return NULL;
    }
#if DWF_OK
    nc_dw_job j;
    if (nc_epi_from("nchwc_depthwise", lo, hi, kind, alpha, beta, &j.e) < 0)
        return NULL;
    rc_sz sz = {NULL};
    const Py_ssize_t xn = sz_mul3(&sz, "X's size", N * CB, H * W, 16), yn = sz_mul3(&sz, "Y's size", N * CB, OH * OW, 16);
    const Py_ssize_t wn = sz_mul3(&sz, "W's size", CB, KH * KW, 16);
    if (sz_check(&sz, "nchwc_depthwise", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[4];
    const rc_buf spec[4] = {{xo, xn, RC_F32, 0, 0, "X"}, {wo, wn, RC_F32, 0, 0, "W"}, {bo, CB * 16, RC_F32, 0, 0, "B"},
                            {yo, yn, RC_F32, 1, 0, "Y"}};
    if (get_buffers("nchwc_depthwise", spec, v, 4) < 0)
        return NULL;
    j.x = (const float *)v[0].buf;
    j.w = (const float *)v[1].buf;
    j.b = (const float *)v[2].buf;
    j.y = (float *)v[3].buf;
    j.N = N, j.CB = CB, j.H = H, j.W = W, j.KH = KH, j.KW = KW, j.sh = sh, j.sw = sw, j.pt = pt, j.pl = pl;
    j.OH = OH, j.OW = OW;
    j.Wp = nc_padded_w(OW, sw, KW, pl, W);
    int th = threads < 1 ? 1 : threads;
    /* bands of rows: a unit a few tens of us */
    j.band = nc_band(OH, N * CB, th, 1);
    const Py_ssize_t bands = (OH + j.band - 1) / j.band;
    const int parts = rc_parts(2.0 * (double)yn * (double)(KH * KW), 2.5e5, N * CB * bands, &th);
    j.oom = 0;
    return rc_run_job(nc_dw_part, &j, parts, th, v, 4, &j.oom);
#else
    (void)xo, (void)wo, (void)bo, (void)yo, (void)lo, (void)hi, (void)kind, (void)alpha, (void)beta, (void)threads;
    return NULL;
#endif
}

/* se: y = x * gate(...) (y may be x); gap (w1 None): y [N][C] the means */
PyObject *rc_py_nchwc_se(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *xo, *w1o, *b1o, *w2o, *b2o, *yo;
    Py_ssize_t N, CB, C, CR, HW;
    float lo, hi, aa, ab, ga, gb;
    int ak, gk, threads;
    if (!PyArg_ParseTuple(args, "OOOOOO(nnnnn)ffiffiffi:nchwc_se", &xo, &w1o, &b1o, &w2o, &b2o, &yo, &N, &CB, &C, &CR,
                          &HW, &lo, &hi, &ak, &aa, &ab, &gk, &ga, &gb, &threads))
        return NULL;
    const Py_ssize_t dims[5] = {N, CB, C, CR, HW};
    if (!nc_ready("nchwc_se") || !nc_sizes_ok("nchwc_se", dims, 5))
        return NULL;
    if (C > CB * 16 || C <= (CB - 1) * 16) {
        PyErr_SetString(PyExc_ValueError, "nchwc_se: C does not fit CB blocks of 16");
        return NULL;
    }
#if DWF_OK
    nc_epi ea, eg;
    if (nc_epi_from("nchwc_se", lo, hi, ak, aa, ab, &ea) < 0 ||
        nc_epi_from("nchwc_se", -INFINITY, INFINITY, gk, ga, gb, &eg) < 0)
        return NULL;
    const int gap = w1o == Py_None;
    rc_sz sz = {NULL};
    const Py_ssize_t xn = sz_mul3(&sz, "X's size", N * CB, HW, 16), wn = sz_mul(&sz, "W1's size", CR, C);
    const Py_ssize_t sn = sz_add(&sz, "the scratch", sz_mul(&sz, "the scratch", 2 * N, CB * 16), sz_mul(&sz, "the scratch", N, CR));
    if (sz_check(&sz, "nchwc_se", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[6];
    const rc_buf spec[6] = {{xo, xn, RC_F32, 0, 0, "X"}, {w1o, wn, RC_F32, 0, 1, "W1"}, {b1o, CR, RC_F32, 0, 1, "B1"},
                            {w2o, wn, RC_F32, 0, 1, "W2"}, {b2o, C, RC_F32, 0, 1, "B2"},
                            {yo, gap ? N * C : xn, RC_F32, 1, 0, "Y"}};
    if (get_buffers("nchwc_se", spec, v, 6) < 0)
        return NULL;
    if (!gap && !v[3].buf) {
        release_buffers(v, 6);
        PyErr_SetString(PyExc_ValueError, "nchwc_se: W2 is missing");
        return NULL;
    }
    float *scratch = (float *)malloc((size_t)sn * sizeof(float));
    if (!scratch) {
        release_buffers(v, 6);
        return PyErr_NoMemory();
    }
    nc_se_job j = {(const float *)v[0].buf, (const float *)v[1].buf, (const float *)v[2].buf, (const float *)v[3].buf,
                   (const float *)v[4].buf, (float *)v[5].buf, scratch, scratch + N * CB * 16,
                   scratch + N * CB * 16 + N * CR, N, CB, C, CR, HW, 0};
    const double work = 2.0 * (double)xn;
    Py_BEGIN_ALLOW_THREADS
    int th = threads < 1 ? 1 : threads;
    { /* rc_parts may lower th: called before th is read */
        int parts_ = rc_parts(work, 2.5e5, N * CB, &th);
        rc_parallel(nc_se_part, &j, parts_, th);
    }
    if (gap) {
        for (Py_ssize_t n = 0; n < N; n++)
            memcpy(j.y + n * C, j.s + n * CB * 16, (size_t)C * sizeof(float));
    } else {
        nc_se_fc(&j, &ea, &eg);
        j.phase = 3;
        th = threads < 1 ? 1 : threads;
        { /* rc_parts may lower th: called before th is read */
            int parts_ = rc_parts(work, 2.5e5, N * CB, &th);
            rc_parallel(nc_se_part, &j, parts_, th);
        }
    }
    Py_END_ALLOW_THREADS
    free(scratch);
    release_buffers(v, 6);
    Py_RETURN_NONE;
#else
    (void)xo, (void)w1o, (void)b1o, (void)w2o, (void)b2o, (void)yo, (void)lo, (void)hi, (void)ak, (void)aa, (void)ab;
    (void)gk, (void)ga, (void)gb, (void)threads;
    return NULL;
#endif
}

PyObject *rc_py_nchwc_expand_dw(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *xo, *weo, *beo, *wdo, *bdo, *yo;
    Py_ssize_t N, CIB, COB, H, W, KH, KW, sh, sw, pt, pl, OH, OW;
    float el, eh, ea, eb, dl, dh, da, db;
    int ek, dk, threads;
    if (!PyArg_ParseTuple(args, "OOOOOO(nnnnn)(nn)(nn)(nn)(nn)(ffiff)(ffiff)i:nchwc_expand_dw", &xo, &weo, &beo, &wdo,
                          &bdo, &yo, &N, &CIB, &COB, &H, &W, &KH, &KW, &sh, &sw, &pt, &pl, &OH, &OW, &el, &eh, &ek,
                          &ea, &eb, &dl, &dh, &dk, &da, &db, &threads))
        return NULL;
    const Py_ssize_t dims[11] = {N, CIB, COB, H, W, KH, KW, sh, sw, OH, OW};
    if (!nc_ready("nchwc_expand_dw") || !nc_sizes_ok("nchwc_expand_dw", dims, 11))
        return NULL;
    if (pt < 0 || pl < 0 || pt >= KH || pl >= KW || (OH - 1) * sh - pt >= H || (OW - 1) * sw - pl >= W ||
        (KW != 3 && KW != 5 && KW != 7) || KH > 7) {
        PyErr_SetString(PyExc_ValueError, "nchwc_expand_dw: KW must be 3, 5 or 7, KH at most 7, and the pads and output "
                                          "size fit the window");
        return NULL;
    }
#if DWF_OK
    nc_ed_job j;
    if (nc_epi_from("nchwc_expand_dw", el, eh, ek, ea, eb, &j.ee) < 0 ||
        nc_epi_from("nchwc_expand_dw", dl, dh, dk, da, db, &j.ed) < 0)
        return NULL;
    rc_sz sz = {NULL};
    const Py_ssize_t xn = sz_mul3(&sz, "X's size", N * CIB, H * W, 16), yn = sz_mul3(&sz, "Y's size", N * COB, OH * OW, 16);
    const Py_ssize_t wen = sz_mul(&sz, "We's size", CIB * 16, COB * 16), wdn = sz_mul3(&sz, "Wd's size", COB, KH * KW, 16);
    if (sz_check(&sz, "nchwc_expand_dw", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[6];
    const rc_buf spec[6] = {{xo, xn, RC_F32, 0, 0, "X"}, {weo, wen, RC_F32, 0, 0, "We"},
                            {beo, COB * 16, RC_F32, 0, 0, "Be"}, {wdo, wdn, RC_F32, 0, 0, "Wd"},
                            {bdo, COB * 16, RC_F32, 0, 0, "Bd"}, {yo, yn, RC_F32, 1, 0, "Y"}};
    if (get_buffers("nchwc_expand_dw", spec, v, 6) < 0)
        return NULL;
    j.x = (const float *)v[0].buf;
    j.we = (const float *)v[1].buf;
    j.be = (const float *)v[2].buf;
    j.wd = (const float *)v[3].buf;
    j.bd = (const float *)v[4].buf;
    j.y = (float *)v[5].buf;
    j.N = N, j.CIB = CIB, j.COB = COB, j.H = H, j.W = W, j.KH = KH, j.KW = KW, j.sh = sh, j.sw = sw, j.pt = pt;
    j.pl = pl, j.OH = OH, j.OW = OW, j.G = (COB + 1) / 2, j.oom = 0;
    j.Wp = nc_padded_w(OW, sw, KW, pl, W);
    int th = threads < 1 ? 1 : threads;
    /* bands: each re-expands its first KH - sh input rows, so a band is at least 4 rows where it can be */
    j.band = nc_band(OH, N * j.G, th, 4);
    const Py_ssize_t bands = (OH + j.band - 1) / j.band;
    const double work = 2.0 * (double)N * (double)H * (double)W * (double)wen + 2.0 * (double)yn * (double)(KH * KW);
    const int parts = rc_parts(work, 2.5e5, N * j.G * bands, &th);
    return rc_run_job(nc_ed_part, &j, parts, th, v, 6, &j.oom);
#else
    (void)xo, (void)weo, (void)beo, (void)wdo, (void)bdo, (void)yo, (void)el, (void)eh, (void)ek, (void)ea, (void)eb;
    (void)dl, (void)dh, (void)dk, (void)da, (void)db, (void)threads;
    return NULL;
#endif
}
