/* Fused pairs of steps (the executable's pairs, chosen after a partition's first run), each
 * an intermediate tensor that never goes through memory whole: conv_maxpool (a stem
 * convolution and its MaxPool) and expand_dw (an inverted-residual block's expansion and
 * depthwise convolution). conv2d's `extra` (a 1x1 shortcut beside a 3x3) is in conv_direct.c.
 * AVX-512 only. */
#include "native.h"

#if DWF_OK
/* ---------------------------------------------------------------------------------------
 * conv_maxpool: conv2d's position tiles (8 channels x 48 positions, dilation 1, stride <= 2)
 * with bias and clip, then a 3x3 stride-2 MaxPool padded by 1 (ResNet's stem and its pool) of
 * one image, the convolution's output never whole: a unit is a channel block and a band of
 * CP_BAND pooled rows, whose 2 * CP_BAND + 1 convolution rows (one shared with the band
 * before, computed again) go to a per-part buffer in L2 and are pooled from there, the rows'
 * maxima first (unit stride) and then the columns' (even / odd split by two-register
 * permutes). NaN wherever a tap is NaN, as maxpool2d.
 * --------------------------------------------------------------------------------------- */
#define CP_BAND 8

typedef struct {
    const float *planes, *wp, *b;
    float *y;
    const Py_ssize_t *toff;
    float *scratch;             /* per part: band rows, then the row maxima, then a tile */
    Py_ssize_t T, C, cs, M, Mb, Wq, OH, OW, POH, POW, nband, bs, scratch_n;
    float lo, hi;
} cp_job;

/* the larger of a and b lane by lane, NaN where either is NaN */
DWF_TARGET static inline __m512 cp_max(__m512 a, __m512 b)
{
    return _mm512_mask_mov_ps(_mm512_max_ps(a, b), _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q), _mm512_set1_ps(NAN));
}

DWF_TARGET static void cp_pool(const cp_job *j, const float *band, Py_ssize_t a, Py_ssize_t pr0, Py_ssize_t pr1,
                               float *vm, float *ym)
{
    const Py_ssize_t Wq = j->Wq, OW = j->OW, POW = j->POW;
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (Py_ssize_t pr = pr0; pr < pr1; pr++) {
        /* convolution rows 2 pr - 1 .. 2 pr + 1 inside the output; at least 2pr is */
        const Py_ssize_t r0 = 2 * pr - 1 < 0 ? 0 : 2 * pr - 1, r1 = 2 * pr + 2 < j->OH ? 2 * pr + 2 : j->OH;
        for (Py_ssize_t c = 0; c < OW; c += 16) {
            __m512 m = _mm512_loadu_ps(band + (r0 - a) * Wq + c);
            for (Py_ssize_t r = r0 + 1; r < r1; r++)
                m = cp_max(m, _mm512_loadu_ps(band + (r - a) * Wq + c));
            _mm512_storeu_ps(vm + c, m);
        }
        /* padding: column -1 and columns from OW (the last vector's lanes past OW too) */
        vm[-1] = -INFINITY;
        _mm512_storeu_ps(vm + OW, ninf);
        _mm512_storeu_ps(vm + OW + 16, ninf);
        float *yr = ym + pr * POW;
        for (Py_ssize_t c = 0; c < POW; c += 16) {
            const __m512 lo = _mm512_loadu_ps(vm + 2 * c), hi = _mm512_loadu_ps(vm + 2 * c + 16);
            const __m512 plo = _mm512_loadu_ps(vm + 2 * c - 1), phi = _mm512_loadu_ps(vm + 2 * c + 15);
            const __m512 e = _mm512_permutex2var_ps(lo, ev, hi), o = _mm512_permutex2var_ps(lo, od, hi);
            const __m512 p = _mm512_permutex2var_ps(plo, ev, phi); /* column 2 c - 1 */
            _mm512_mask_storeu_ps(yr + c, dwf_mask(POW - c), cp_max(cp_max(e, o), p));
        }
    }
}

DWF_TARGET static void cp_part(void *arg, int part, int parts)
{
    const cp_job *j = (const cp_job *)arg;
    float *band = j->scratch + (Py_ssize_t)part * j->scratch_n;
    float *vm = band + CV_MR * j->bs + 16, *o = vm + (j->OW + 48 + 15) / 16 * 16;
    const Py_ssize_t units = j->Mb * j->nband, K = j->C * j->T, Wq = j->Wq;
    for (Py_ssize_t u = units * part / parts; u < units * (part + 1) / parts; u++) {
        const Py_ssize_t mb = u / j->nband, bd = u - mb * j->nband;
        const Py_ssize_t pr0 = bd * CP_BAND, pr1 = pr0 + CP_BAND < j->POH ? pr0 + CP_BAND : j->POH;
        /* the convolution rows its pooled rows read: 2 pr0 - 1 .. 2 pr1 - 1, inside the output */
        const Py_ssize_t a = 2 * pr0 - 1 < 0 ? 0 : 2 * pr0 - 1, b = 2 * pr1 < j->OH ? 2 * pr1 : j->OH;
        const float *wp = j->wp + mb * K * CV_MR;
        for (Py_ssize_t q = a * Wq; q < b * Wq; q += CV_NR) {
            const Py_ssize_t left = b * Wq - q;
            const int nv = left >= CV_NR ? CV_NV : (int)((left + 15) / 16);
            cv_tiles[nv](j->planes + q, j->toff, j->T, j->C, j->cs, wp, o, 0);
            for (int i = 0; i < CV_MR; i++) {
                const Py_ssize_t m = mb * CV_MR + i;
                const v16f bias = cv_bcast(j->b && m < j->M ? j->b[m] : 0.0f);
                const v16f lo = cv_bcast(j->lo), hi = cv_bcast(j->hi);
                float *dst = band + i * j->bs + (q - a * Wq);
                for (int v = 0; v < nv; v++)
                    *(v16f_u *)(dst + 16 * v) = v16_clip(*(const v16f *)(o + (i * nv + v) * 16) + bias, lo, hi);
            }
        }
        for (int i = 0; i < CV_MR && mb * CV_MR + i < j->M; i++)
            cp_pool(j, band + i * j->bs, a, pr0, pr1, vm, j->y + (mb * CV_MR + i) * j->POH * j->POW);
    }
}

PyObject *rc_py_conv_maxpool(PyObject *self, PyObject *args)
{
    PyObject *xo, *wo, *bo, *yo;
    Py_ssize_t C, H, W, M, KH, KW, sh, sw, pt, pl, OH, OW, POH, POW;
    float lo, hi;
    int threads;
    if (!PyArg_ParseTuple(args, "OOOO(nnn)(nnn)(nn)(nn)(nn)ff(nn)i:conv_maxpool", &xo, &wo, &bo, &yo, &C, &H, &W,
                          &M, &KH, &KW, &sh, &sw, &pt, &pl, &OH, &OW, &lo, &hi, &POH, &POW, &threads))
        return NULL;
    if (C < 1 || H < 1 || W < 1 || M < 1 || KH < 1 || KW < 1 || sh < 1 || sw < 1 || sh > 2 || sw > 2 ||
        pt < 0 || pl < 0 || OH < 1 || OW < 1 || POH != (OH - 1) / 2 + 1 || POW != (OW - 1) / 2 + 1) {
        PyErr_SetString(PyExc_ValueError, "conv_maxpool: bad sizes, strides (1 or 2) or pooled sizes "
                                          "(a 3x3 stride-2 pool padded by 1)");
        return NULL;
    }
    if (!rc_conv_fast) {
        PyErr_SetString(PyExc_ValueError, "conv_maxpool: needs AVX-512 (CONV_FAST)");
        return NULL;
    }
    rc_sz sz = {NULL};
    const Py_ssize_t T = sz_mul(&sz, "the kernel's taps", KH, KW), K = sz_mul(&sz, "W's size", C, T);
    const Py_ssize_t Mb = M / CV_MR + (M % CV_MR != 0);
    const Py_ssize_t xn = sz_mul3(&sz, "X's size", C, H, W), wn = sz_mul3(&sz, "W's size", Mb, K, CV_MR);
    const Py_ssize_t yn = sz_mul3(&sz, "Y's size", M, POH, POW);
    if (sz_check(&sz, "conv_maxpool", PyExc_ValueError) < 0)
        return NULL;
    const Py_ssize_t Hp = sz_extent(&sz, "the padded input", OH, sh, KH, 1);
    const Py_ssize_t Wp = sz_extent(&sz, "the padded input", OW, sw, KW, 1);
    const Py_ssize_t Hq = Hp / sh + (Hp % sh != 0), Wq = Wp / sw + (Wp % sw != 0);
    const Py_ssize_t L = sz_add(&sz, "the phase planes", sz_mul(&sz, "the phase planes", Hq, Wq), sz_add(&sz, "the phase planes", Wq, 32));
    const Py_ssize_t plane_n = sz_mul4(&sz, "the phase planes", C, sh, sw, L);
    const Py_ssize_t bs = sz_add(&sz, "a band", sz_mul(&sz, "a band", 2 * CP_BAND + 1, Wq), CV_NR + 15) / 16 * 16;
    const Py_ssize_t scratch_n = sz_add(&sz, "a band", sz_mul(&sz, "a band", CV_MR, bs),
                                        sz_add(&sz, "a band", OW, 48 + 15) / 16 * 16 + 16 + CV_MR * CV_NR);
    sz_mul(&sz, "the kernel's taps", T, (Py_ssize_t)sizeof(Py_ssize_t));
    if (sz_check(&sz, "conv_maxpool", PyExc_MemoryError) < 0)
        return NULL;
    pt = pt < Hp ? pt : Hp; /* a pad past the windows reads the same as one at their end */
    pl = pl < Wp ? pl : Wp;
    Py_buffer v[4];
    const rc_buf spec[4] = {{xo, xn, RC_F32, 0, 0, "X"}, {wo, wn, RC_F32, 0, 0, "W"},
                            {bo, M, RC_F32, 0, 1, "B"}, {yo, yn, RC_F32, 1, 0, "Y"}};
    if (get_buffers("conv_maxpool", spec, v, 4) < 0)
        return NULL;
    Py_ssize_t toff[64];
    Py_ssize_t *tp = T <= 64 ? toff : (Py_ssize_t *)malloc((size_t)T * sizeof(Py_ssize_t));
    if (!tp) {
        release_buffers(v, 4);
        return PyErr_NoMemory();
    }
    cv_fill_job f = {(const float *)v[0].buf, NULL, C, H, W, pt, pl, sh, sw, Hp, Wp, Wq, L, {0}};
    cv_taps(KH, KW, 1, 1, 0, 0, tp, &f);
    const Py_ssize_t nband = POH / CP_BAND + (POH % CP_BAND != 0);
    /* bs: a band's rows (2 CP_BAND + 1) and a tile's overrun, a channel each */
    int fthreads = threads;
    const int parts = rc_parts(2.0 * (double)Mb * CV_MR * (double)OH * (double)Wq * (double)K, 2.5e5, Mb * nband, &threads);
    const int fparts = rc_parts((double)plane_n, 16384.0, C, &fthreads);
    const Py_ssize_t plane_bytes = sz_add(&sz, "the phase planes", sz_mul(&sz, "the phase planes", plane_n, RC_F32), 63) & ~(Py_ssize_t)63;
    const Py_ssize_t work = sz_add(&sz, "the work buffer", plane_bytes, sz_mul3(&sz, "the work buffer", parts, scratch_n, RC_F32));
    float *planes = sz.what ? NULL : (float *)rc_work((size_t)work);
    if (!planes) {
        if (sz_check(&sz, "conv_maxpool", PyExc_MemoryError) == 0)
            PyErr_NoMemory();
        if (tp != toff)
            free(tp);
        release_buffers(v, 4);
        return NULL;
    }
    cp_job j = {planes, (const float *)v[1].buf, (const float *)v[2].buf, (float *)v[3].buf, tp,
                planes + plane_bytes / RC_F32, T, C, sh * sw * L, M, Mb, Wq, OH, OW, POH, POW, nband, bs,
                scratch_n, lo, hi};
    f.planes = planes;
    Py_BEGIN_ALLOW_THREADS
    rc_parallel(cv_fill_part, &f, fparts, fthreads);
    rc_parallel(cp_part, &j, parts, threads);
    Py_END_ALLOW_THREADS
    rc_work_done(planes, (size_t)work);
    if (tp != toff)
        free(tp);
    release_buffers(v, 4);
    Py_RETURN_NONE;
}
#endif

#if DWF_OK
/* expand_dw: an inverted-residual block's expansion (a 1x1 convolution, bias, clip and an
 * optional activation) and the k x k depthwise convolution after it (k 3, 5 or 7; stride 1 or
 * 2 both ways; bias, clip and activation) of one image, without the expanded tensor going through memory. A unit is a panel of 12 expanded
 * channels: their 1x1 sums (pointwise_lanes's tiles, x read in place) into a per-part plane
 * buffer E (12 x H x W: 600 KB at MobileNetV2's 112 x 112, in L2), then each channel's depthwise
 * convolution from E through the phase planes (dwf_range). Apart, the expansion wrote a
 * tensor that the depthwise layer read back from memory for its planes. */
typedef struct {
    const float *wp, *x, *b1;
    Py_ssize_t M, C, P;
    float lo1, hi1;
    const rc_act *act1; /* the expansion's activation after its clip, or NULL */
    dwf_job dw;          /* the depthwise step (its x unused: E is its input) */
    Py_ssize_t scratch_n; /* a part's work buffer: E, 12 x 32 tail tiles, C x 32 tail of x, dw.scratch_n */
    int oom;
} ed_job;

static void ed_part(void *arg, int part, int parts)
{
    const ed_job *j = (const ed_job *)arg;
    const Py_ssize_t P = j->P, C = j->C, np_ = (j->M + LN_RP - 1) / LN_RP, full = P / 32, tn = P - full * 32;
    /* the thread's own buffer, kept between calls: its E stays in that core's L2 */
    float *E = (float *)rc_work(sizeof(float) * (size_t)j->scratch_n);
    if (!E) {
        __atomic_store_n(&((ed_job *)arg)->oom, 1, __ATOMIC_RELAXED);
        return;
    }
    float *tail = E + (LN_RP * P + 15) / 16 * 16, *xt = tail + LN_RP * 32, *dws = xt + C * 32;
    if (tn) /* the last 32 positions' x, zeros past P: read in place, its rows would run past x */
        pl_pack32(xt, j->x + full * 32, C, P, tn);
    for (Py_ssize_t q = np_ * part / parts; q < np_ * (part + 1) / parts; q++) {
        const Py_ssize_t r0 = q * LN_RP, nr = j->M - r0 < LN_RP ? j->M - r0 : LN_RP;
        const float *ap = j->wp + q * C * LN_RP;
        const ln_epi e = {j->b1 ? j->b1 + r0 : NULL, NULL, 0, j->lo1, j->hi1, j->act1};
        for (Py_ssize_t cb = 0; cb < full; cb++)
            ln_tiles[nr](ap, j->x + cb * 32, C, P, E + cb * 32, P, NULL, 1, NULL, 0, 0, &e);
        if (tn) {
            ln_tiles[nr](ap, xt, C, 32, tail, 32, NULL, 1, NULL, 0, 0, &e);
            for (Py_ssize_t r = 0; r < nr; r++)
                memcpy(E + r * P + full * 32, tail + r * 32, (size_t)tn * sizeof(float));
        }
        dwf_range(&j->dw, E, r0, dws, r0, r0 + nr);
    }
    rc_work_done(E, sizeof(float) * (size_t)j->scratch_n);
}

PyObject *rc_py_expand_dw(PyObject *self, PyObject *args)
{
    PyObject *wo, *xo, *bo, *wdo, *bdo, *yo;
    Py_ssize_t M, C, H, W, OH, OW, s, pt, pl;
    float lo1, hi1, lo, hi;
    int threads;
    Py_ssize_t k = 3;
    rc_act a1 = {-1, 1.0f / 6.0f, 0.5f}, a2 = {-1, 1.0f / 6.0f, 0.5f};
    if (!PyArg_ParseTuple(args, "OOOffOOO(nnnn)(nnnnn)ffi|n(iff)(iff):expand_dw", &wo, &xo, &bo, &lo1, &hi1, &wdo,
                          &bdo, &yo, &M, &C, &H, &W, &OH, &OW, &s, &pt, &pl, &lo, &hi, &threads, &k, &a1.act,
                          &a1.alpha, &a1.beta, &a2.act, &a2.alpha, &a2.beta))
        return NULL;
    if (M < 1 || C < 1 || H < 1 || W < 1 || OH < 1 || OW < 1 || pt < 0 || pl < 0 || (s != 1 && s != 2) ||
        (k != 3 && k != 5 && k != 7)) {
        PyErr_SetString(PyExc_ValueError, "expand_dw: bad sizes, window (3, 5 or 7), stride (1 or 2) or padding");
        return NULL;
    }
    if (a1.act < -1 || a1.act > 3 || a2.act < -1 || a2.act > 3) {
        PyErr_SetString(PyExc_ValueError, "expand_dw: activation kind not in -1..3");
        return NULL;
    }
    a1.act += 1; /* activate's kind -> rc_act's */
    a2.act += 1;
    if (!rc_conv_fast) {
        PyErr_SetString(PyExc_ValueError, "expand_dw: needs AVX-512 (CONV_FAST)");
        return NULL;
    }
    rc_sz sz = {NULL};
    const Py_ssize_t P = sz_mul(&sz, "X's size", H, W), np_ = M / LN_RP + (M % LN_RP != 0);
    const Py_ssize_t wn = sz_mul3(&sz, "W's size", np_, C, LN_RP), xn = sz_mul(&sz, "X's size", C, P);
    const Py_ssize_t wdn = sz_mul3(&sz, "WD's size", M, k, k), yn = sz_mul3(&sz, "Y's size", M, OH, OW);
    if (sz_check(&sz, "expand_dw", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[6];
    const rc_buf spec[6] = {{wo, wn, RC_F32, 0, 0, "W"}, {xo, xn, RC_F32, 0, 0, "X"},
                            {bo, M, RC_F32, 0, 1, "B"}, {wdo, wdn, RC_F32, 0, 0, "WD"},
                            {bdo, M, RC_F32, 0, 1, "BD"}, {yo, yn, RC_F32, 1, 0, "Y"}};
    if (get_buffers("expand_dw", spec, v, 6) < 0)
        return NULL;
    ed_job j = {(const float *)v[0].buf, (const float *)v[1].buf, (const float *)v[2].buf, M, C, P, lo1, hi1,
                a1.act ? &a1 : NULL,
                {NULL, (const float *)v[3].buf, (const float *)v[4].buf, (float *)v[5].buf, M, M, H, W, OH, OW,
                 s, pt, pl, 0, 0, 0, 0, lo, hi, NULL, 0, 0},
                0, 0};
    j.dw.k = k;
    j.dw.act = a2.act ? &a2 : NULL;
    j.dw.direct = 1; /* from E's rows, no phase planes (depthwise_avx512.c's direct rows) */
    if (dwf_setup(&j.dw, "expand_dw") < 0) {
        release_buffers(v, 6);
        return NULL;
    }
    /* E, the tails and the phase planes, each from a 64-byte boundary */
    j.scratch_n = sz_add(&sz, "the work buffer", sz_mul(&sz, "the work buffer", LN_RP, P), 15) / 16 * 16;
    j.scratch_n = sz_add(&sz, "the work buffer", j.scratch_n, sz_mul(&sz, "the work buffer", sz_add(&sz, "the work buffer", C, LN_RP), 32));
    j.scratch_n = sz_add(&sz, "the work buffer", j.scratch_n, j.dw.scratch_n);
    sz_mul(&sz, "the work buffer", j.scratch_n, RC_F32);
    if (sz_check(&sz, "expand_dw", PyExc_MemoryError) < 0) {
        release_buffers(v, 6);
        return NULL;
    }
    const int parts = rc_parts(2.0 * (double)M * (double)C * (double)P, 2.5e5, np_, &threads);
    return rc_run_job(ed_part, &j, parts, threads, v, 6, &j.oom);
}
#endif
