/* pointwise_rows: a 1x1 convolution as Linear over the output positions, y^T (P x M) =
 * x^T (P x C) w^T (C x M), on linear's 12 x 32 register tiles: the positions are the
 * broadcast rows, the output channels the vector lanes. The positions of an image are split
 * into ceil(P / 12) panels as even as they go (49 = 4 x 10 + 9, 196 = 9 x 12 + 8 x 11), so a
 * 7 x 7 or 14 x 14 plane fills whole tiles where pointwise_lanes's 32-position panels pad 49
 * to 64 and 196 to 224. x's panels are packed from NCHW (a strided 1x1 reads its subsampled
 * positions there: no gather copy first); each tile is transposed back into y's channel rows
 * in its epilogue, with bias, residual, clip and activation. */
#include "native.h"

#define PR_QB 8 /* most position panels a unit: their tiles' sums, [PR_QB][12][32], on the stack */

typedef struct {
    const float *wp, *x, *b, *z;
    float *y, *xp;
    Py_ssize_t M, C, HW, W, OW, P, sh, sw; /* P = OH * OW positions an image */
    Py_ssize_t npn, kc, bp, nqb, ncb, N;   /* panels an image; chunk; panels a unit; blocks */
    float lo, hi;
    const rc_act *act; /* after the clip, or NULL */
} pr_job;

/* the first position of panel q of an image's npn panels over P positions (at most 12 each) */
static inline Py_ssize_t pr_start(const pr_job *j, Py_ssize_t q) { return q * j->P / j->npn; }

#if DWF_OK
#define PR_CB 16 /* channel rows a unit of pr_pack_rows_part: 16 x 784 bytes at 14 x 14, in L1 */
/* pr_pack_part at stride 1 on AVX-512, a unit a block of PR_CB channel rows of an image, all
 * its panels: a panel's nr (at most 12) positions of a row one masked load and store (a panel
 * at a time over all the channels, memcpy calls of 44-48 bytes from rows 784 bytes apart took
 * 15-20% of the kernel at 14 x 14: docs/performance.md) */
DWF_TARGET static void pr_pack_rows_part(void *arg, int part, int parts)
{
    const pr_job *j = (const pr_job *)arg;
    const Py_ssize_t C = j->C, HW = j->HW, nb = (C + PR_CB - 1) / PR_CB, total = j->N * nb;
    for (Py_ssize_t u = total * part / parts; u < total * (part + 1) / parts; u++) {
        const Py_ssize_t n = u / nb, k0 = (u - n * nb) * PR_CB, k1 = k0 + PR_CB < C ? k0 + PR_CB : C;
        const float *xk = j->x + (n * C + k0) * HW;
        float *restrict dst = j->xp + (n * j->npn * C + k0) * LN_RP;
        Py_ssize_t p0 = 0;
        for (Py_ssize_t q = 0; q < j->npn; q++) {
            const Py_ssize_t p1 = pr_start(j, q + 1);
            const __mmask16 m = dwf_mask(p1 - p0);
            float *dq = dst + q * C * LN_RP;
            for (Py_ssize_t k = 0; k < k1 - k0; k++)
                _mm512_mask_storeu_ps(dq + k * LN_RP, m, _mm512_maskz_loadu_ps(m, xk + k * HW + p0));
            p0 = p1;
        }
    }
}
#endif

/* the panels of x, [N * npn][C][12]: panel q's row k holds its positions of channel k */
static void pr_pack_part(void *arg, int part, int parts)
{
    const pr_job *j = (const pr_job *)arg;
    const Py_ssize_t total = j->N * j->npn, C = j->C;
    for (Py_ssize_t u = total * part / parts; u < total * (part + 1) / parts; u++) {
        const Py_ssize_t n = u / j->npn, q = u - n * j->npn;
        const Py_ssize_t p0 = pr_start(j, q), nr = pr_start(j, q + 1) - p0;
        const float *xs = j->x + n * C * j->HW;
        float *restrict dst = j->xp + u * C * LN_RP;
        if (j->sh == 1 && j->sw == 1) { /* positions are x's own: nr floats in a row */
            for (Py_ssize_t k = 0; k < C; k++)
                memcpy(dst + k * LN_RP, xs + k * j->HW + p0, (size_t)nr * sizeof(float));
            continue;
        }
        Py_ssize_t off[LN_RP];
        for (Py_ssize_t p = 0; p < nr; p++) {
            const Py_ssize_t oy = (p0 + p) / j->OW, ox = (p0 + p) - oy * j->OW;
            off[p] = oy * j->sh * j->W + ox * j->sw;
        }
        for (Py_ssize_t k = 0; k < C; k++) {
            const float *xk = xs + k * j->HW;
            for (Py_ssize_t p = 0; p < nr; p++)
                dst[k * LN_RP + p] = xk[off[p]];
        }
    }
}

/* the epilogue of a tile t [nr][32] (ld 32) of positions [p0, p0 + nr) and mn output channels
 * from m0: y[m][p] = act(clip(t[p][m] + b[m] (+ z[m][p]), lo, hi)); y and z at (m0, p0) */
static void pr_store_scalar(const pr_job *j, const float *t, Py_ssize_t nr, Py_ssize_t mn, const float *b,
                            const float *z, float *y)
{
    const Py_ssize_t P = j->P;
    for (Py_ssize_t m = 0; m < mn; m++) {
        const float bv = b ? b[m] : 0.0f;
        for (Py_ssize_t p = 0; p < nr; p++) {
            const float v = t[p * 32 + m] + bv + (z ? z[m * P + p] : 0.0f);
            y[m * P + p] = clipf(v, j->lo, j->hi);
        }
    }
    act_block(y, P, mn, nr, j->act);
}

#if DWF_OK
/* the same through two 16 x 16 transposes: a channel's nr positions one masked store */
DWF_TARGET static void pr_store_avx512(const pr_job *j, const float *t, Py_ssize_t nr, Py_ssize_t mn,
                                       const float *b, const float *z, float *y)
{
    const Py_ssize_t P = j->P;
    const __mmask16 mk = dwf_mask(nr);
    const v16f lo = cv_bcast(j->lo), hi = cv_bcast(j->hi);
    for (Py_ssize_t h = 0; h < mn; h += 16) {
        __m512 r[16];
        for (int p = 0; p < 16; p++)
            r[p] = p < nr ? _mm512_loadu_ps(t + p * 32 + h) : _mm512_setzero_ps();
        rc_tr16_ps(r);
        const Py_ssize_t cn = mn - h < 16 ? mn - h : 16;
        for (Py_ssize_t c = 0; c < cn; c++) {
            const Py_ssize_t m = h + c;
            v16f v = (v16f)r[c];
            if (b)
                v += cv_bcast(b[m]);
            if (z)
                v += (v16f)_mm512_maskz_loadu_ps(mk, z + m * P);
            v = v16_clip(v, lo, hi);
            if (j->act)
                v = rc_act16(v, j->act);
            _mm512_mask_storeu_ps(y + m * P, mk, (__m512)v);
        }
    }
}
#endif

/* a unit: image n, output-channel panel cb (32 channels), a block of position panels; per
 * chunk of the channels its weights stay in L1 while the block's panels pass over them */
static void pr_part(void *arg, int part, int parts)
{
    const pr_job *j = (const pr_job *)arg;
    const Py_ssize_t C = j->C, M = j->M, P = j->P, per = j->ncb * j->nqb, units = per * j->N;
    const Py_ssize_t u1 = units * (part + 1) / parts;
    float tb[PR_QB * LN_RP * 32] __attribute__((aligned(64)));
    for (Py_ssize_t u = units * part / parts; u < u1; u++) {
        const Py_ssize_t n = u / per, cb = (u - n * per) / j->nqb, qb = u - n * per - cb * j->nqb;
        const Py_ssize_t q0 = qb * j->bp, q1 = q0 + j->bp < j->npn ? q0 + j->bp : j->npn;
        if (q0 >= q1)
            continue;
        const Py_ssize_t m0 = cb * 32, mn = M - m0 < 32 ? M - m0 : 32;
        const float *xpn = j->xp + n * j->npn * C * LN_RP;
        for (Py_ssize_t k0 = 0; k0 < C; k0 += j->kc) {
            const Py_ssize_t kn = C - k0 < j->kc ? C - k0 : j->kc;
            const float *wp = j->wp + (cb * C + k0) * 32;
            /* the next chunk of weights (or the next unit's first), contiguous, asked into L2
               a share by each panel after the first: they come from memory every run */
            const char *nx = NULL;
            Py_ssize_t nbytes = 0;
            if (k0 + kn < C) {
                nx = (const char *)(wp + kn * 32);
                nbytes = (Py_ssize_t)sizeof(float) * 32 * (C - k0 - kn < j->kc ? C - k0 - kn : j->kc);
            } else if (u + 1 < u1) {
                const Py_ssize_t un = u + 1, cbn = (un - (un / per) * per) / j->nqb;
                if (cbn != cb || un / per != n) {
                    nx = (const char *)(j->wp + cbn * C * 32);
                    nbytes = (Py_ssize_t)sizeof(float) * 32 * (j->kc < C ? j->kc : C);
                }
            }
            for (Py_ssize_t q = q0; q < q1; q++) {
                const Py_ssize_t nr = pr_start(j, q + 1) - pr_start(j, q);
                const char *pf = NULL;
                const Py_ssize_t npf = rc_pf_share(nx, nbytes, q1 - q0 - 1, q - q0 - 1, 128, &pf);
                ln_tiles[nr](xpn + (q * C + k0) * LN_RP, wp, kn, 32, tb + (q - q0) * LN_RP * 32, 32, NULL, k0 == 0,
                             pf, 128, npf, NULL);
            }
        }
        for (Py_ssize_t q = q0; q < q1; q++) {
            const Py_ssize_t p0 = pr_start(j, q), nr = pr_start(j, q + 1) - p0;
            const float *t = tb + (q - q0) * LN_RP * 32, *b = j->b ? j->b + m0 : NULL;
            const float *z = j->z ? j->z + (n * M + m0) * P + p0 : NULL;
            float *y = j->y + (n * M + m0) * P + p0;
#if DWF_OK
            if (rc_conv_fast) {
                pr_store_avx512(j, t, nr, mn, b, z, y);
                continue;
            }
#endif
            pr_store_scalar(j, t, nr, mn, b, z, y);
        }
    }
}

PyObject *rc_py_pointwise_rows(PyObject *self, PyObject *args)
{
    PyObject *wo, *xo, *bo, *zo, *yo;
    Py_ssize_t M, C, H, W, sh, sw, N = 1;
    float lo, hi;
    int threads;
    rc_act act = {-1, 1.0f / 6.0f, 0.5f};
    if (!PyArg_ParseTuple(args, "OOOOO(nnnn)(nn)ffi|iffn:pointwise_rows", &wo, &xo, &bo, &zo, &yo, &M, &C, &H, &W,
                          &sh, &sw, &lo, &hi, &threads, &act.act, &act.alpha, &act.beta, &N))
        return NULL;
    if (act.act < -1 || act.act > 3) {
        PyErr_SetString(PyExc_ValueError, "pointwise_rows: activation kind not in -1..3");
        return NULL;
    }
    act.act += 1; /* activate's kind -> rc_act's */
    if (M < 1 || C < 1 || H < 1 || W < 1 || sh < 1 || sw < 1 || N < 1) {
        PyErr_SetString(PyExc_ValueError, "pointwise_rows: sizes and strides must be positive");
        return NULL;
    }
    if (!(lo <= hi)) {
        PyErr_SetString(PyExc_ValueError, "pointwise_rows: the clip bounds must satisfy lo <= hi");
        return NULL;
    }
    const Py_ssize_t OH = (H - 1) / sh + 1, OW = (W - 1) / sw + 1, ncb = M / 32 + (M % 32 != 0);
    rc_sz sz = {NULL};
    const Py_ssize_t HW = sz_mul(&sz, "X's plane", H, W), P = sz_mul(&sz, "Y's plane", OH, OW);
    const Py_ssize_t wn = sz_mul3(&sz, "W's size", ncb, C, 32), xn = sz_mul3(&sz, "X's size", N, C, HW);
    const Py_ssize_t yn = sz_mul3(&sz, "Y's size", N, M, P);
    if (sz_check(&sz, "pointwise_rows", PyExc_ValueError) < 0)
        return NULL;
    const Py_ssize_t npn = P / LN_RP + (P % LN_RP != 0);
    sz_mul4(&sz, "the packed positions", N, npn, C, LN_RP * RC_F32);
    if (sz_check(&sz, "pointwise_rows", PyExc_MemoryError) < 0)
        return NULL;
    Py_buffer v[5];
    const rc_buf spec[5] = {{wo, wn, RC_F32, 0, 0, "W"}, {xo, xn, RC_F32, 0, 0, "X"},
                            {bo, M, RC_F32, 0, 1, "B"}, {zo, yn, RC_F32, 0, 1, "Z"},
                            {yo, yn, RC_F32, 1, 0, "Y"}};
    if (get_buffers("pointwise_rows", spec, v, 5) < 0)
        return NULL;
    if (((uintptr_t)v[0].buf & 63) != 0) {
        release_buffers(v, 5);
        PyErr_SetString(PyExc_ValueError, "pointwise_rows: packed weights must be 64-byte aligned");
        return NULL;
    }
    const size_t xpn = sizeof(float) * (size_t)N * (size_t)npn * (size_t)C * LN_RP;
    float *xp = (float *)rc_work(xpn);
    if (!xp) {
        release_buffers(v, 5);
        return PyErr_NoMemory();
    }
    /* the channels in chunks of at most LN_KC, as even as they go; units enough for the
       threads (4 a thread), the panels of an image split into blocks only when the images'
       channel panels are fewer */
    const Py_ssize_t nk = (C + LN_KC - 1) / LN_KC, kc = (C + nk - 1) / nk;
    const Py_ssize_t want = 4 * (Py_ssize_t)threads, have = N * ncb;
    Py_ssize_t nqb = have >= want ? 1 : (want + have - 1) / have;
    if (nqb < (npn + PR_QB - 1) / PR_QB)
        nqb = (npn + PR_QB - 1) / PR_QB;
    if (nqb > npn)
        nqb = npn;
    const Py_ssize_t bp = (npn + nqb - 1) / nqb;
    nqb = (npn + bp - 1) / bp;
    pr_job j = {(const float *)v[0].buf, (const float *)v[1].buf, (const float *)v[2].buf,
                (const float *)v[3].buf, (float *)v[4].buf, xp, M, C, HW, W, OW, P, sh, sw,
                npn, kc, bp, nqb, ncb, N, lo, hi, act.act ? &act : NULL};
    int pth = threads;
    void (*pack)(void *, int, int) = pr_pack_part;
    Py_ssize_t pack_units = N * npn;
#if DWF_OK
    if (rc_conv_fast && sh == 1 && sw == 1) {
        pack = pr_pack_rows_part;
        pack_units = N * ((C + PR_CB - 1) / PR_CB);
    }
#endif
    const int pparts = rc_parts((double)N * (double)C * (double)P * 8.0, 2.5e5, pack_units, &pth);
    const int parts = rc_parts(2.0 * (double)N * (double)M * (double)C * (double)P, 2.5e5, N * ncb * nqb,
                               &threads);
    Py_BEGIN_ALLOW_THREADS
    rc_parallel(pack, &j, pparts, pth);
    rc_parallel(pr_part, &j, parts, threads);
    Py_END_ALLOW_THREADS
    rc_work_done(xp, xpn);
    release_buffers(v, 5);
    Py_RETURN_NONE;
}
