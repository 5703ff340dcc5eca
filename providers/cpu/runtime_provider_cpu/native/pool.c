/* maxpool2d: MaxPool of float32 NCHW planes, separable and unit-stride (its 3x3 windows of
 * stride 1 or 2 go to depthwise_avx512.c on AVX-512 machines). */
#include "native.h"

/* maxpool2d: MaxPool values of float32 NCHW planes (no indices). Taps in the padding are
 * skipped, as a -inf fill would skip them; NaN propagates as with numpy's maximum. Separable
 * and unit-stride: each input row, padded with -inf and split into its sw column phases, gives
 * the row maximum of every output column (a tap is one phase at one offset), then each output
 * row is the maximum of its window's row maxima. Planes are split between the kernel threads. */
typedef struct {
    const float *x;
    float *y;
    Py_ssize_t planes, H, W, OH, OW, KH, KW, sh, sw, dh, dw, pt, pl;
    float *scratch; /* a part's: a row's sw column phases (sw x Lq) and the row maxima (H x OW) */
    Py_ssize_t scratch_n, Lq;
} mp_job;

RC_INLINE float mp_max(float m, float v) { return ((v > m) | (v != v)) ? v : m; }

RC_CLONES
static void mp_planes(const mp_job *j, float *scratch, Py_ssize_t p0, Py_ssize_t p1)
{
    const Py_ssize_t H = j->H, W = j->W, OH = j->OH, OW = j->OW, sw = j->sw, Lq = j->Lq;
    const Py_ssize_t KW = j->KW, pl = j->pl;
    float *restrict ph = scratch;               /* sw phases of Lq floats */
    float *restrict hm = scratch + sw * Lq;     /* row maxima, H x OW */
    for (Py_ssize_t i = 0; i < sw * Lq; i++)
        ph[i] = -INFINITY;                      /* padding: written once, never overwritten */
    /* decided once, not a row at a time (their divisions were most of the time): for each
       column phase b its first input column k0, where it lands, and how many; for each tap
       where in the phases its output columns start */
    Py_ssize_t k0s[sw], doff[sw], cnt[sw], toff[KW];
    for (Py_ssize_t b = 0; b < sw; b++) {
        const Py_ssize_t k0 = ((b - pl) % sw + sw) % sw;
        k0s[b] = k0;
        doff[b] = b * Lq + (k0 + pl) / sw;
        cnt[b] = k0 < W ? (W - k0 + sw - 1) / sw : 0;
    }
    for (Py_ssize_t kw = 0; kw < KW; kw++) {
        const Py_ssize_t c = kw * j->dw;
        toff[kw] = (c % sw) * Lq + c / sw;
    }
    for (Py_ssize_t p = p0; p < p1; p++) {
        const float *xp = j->x + p * H * W;
        float *yp = j->y + p * OH * OW;
        for (Py_ssize_t r = 0; r < H; r++) {
            const float *restrict xr = xp + r * W;
            if (sw == 1) {
                float *restrict d = ph + doff[0];
                for (Py_ssize_t i = 0; i < W; i++)
                    d[i] = xr[i];
            } else if (sw == 2) {
                for (Py_ssize_t b = 0; b < 2; b++) {
                    float *restrict d = ph + doff[b];
                    const float *restrict s0 = xr + k0s[b];
                    for (Py_ssize_t i = 0; i < cnt[b]; i++)
                        d[i] = s0[2 * i];
                }
            } else {
                for (Py_ssize_t b = 0; b < sw; b++) {
                    float *restrict d = ph + doff[b];
                    const float *restrict s0 = xr + k0s[b];
                    for (Py_ssize_t i = 0; i < cnt[b]; i++)
                        d[i] = s0[i * sw];
                }
            }
            /* the first tap sets the row maxima (max(-inf, v) is v, NaN included) */
            float *restrict hr = hm + r * OW;
            const float *restrict s0 = ph + toff[0];
            for (Py_ssize_t ow = 0; ow < OW; ow++)
                hr[ow] = s0[ow];
            for (Py_ssize_t kw = 1; kw < KW; kw++) {
                const float *restrict src = ph + toff[kw];
                for (Py_ssize_t ow = 0; ow < OW; ow++)
                    hr[ow] = mp_max(hr[ow], src[ow]);
            }
        }
        for (Py_ssize_t oh = 0; oh < OH; oh++) {
            float *restrict yr = yp + oh * OW;
            int first = 1;
            for (Py_ssize_t kh = 0; kh < j->KH; kh++) {
                const Py_ssize_t ir = oh * j->sh - j->pt + kh * j->dh;
                if (ir < 0 || ir >= H)
                    continue;
                const float *restrict hr = hm + ir * OW;
                if (first)
                    for (Py_ssize_t ow = 0; ow < OW; ow++)
                        yr[ow] = hr[ow];
                else
                    for (Py_ssize_t ow = 0; ow < OW; ow++)
                        yr[ow] = mp_max(yr[ow], hr[ow]);
                first = 0;
            }
            if (first) /* a window of padding only */
                for (Py_ssize_t ow = 0; ow < OW; ow++)
                    yr[ow] = -INFINITY;
        }
    }
}

static void mp_part(void *arg, int part, int parts)
{
    const mp_job *j = (const mp_job *)arg;
    mp_planes(j, j->scratch + part * j->scratch_n, j->planes * part / parts,
              j->planes * (part + 1) / parts);
}

PyObject *rc_py_maxpool2d(PyObject *self, PyObject *args)
{
    PyObject *xo, *yo;
    Py_ssize_t N, C, H, W, OH, OW, KH, KW, sh, sw, dh, dw, pt, pl;
    int threads, fast = 1;
    if (!PyArg_ParseTuple(args, "OO(nnnn)(nn)(nn)(nn)(nn)(nn)i|p:maxpool2d", &xo, &yo, &N, &C, &H, &W,
                          &OH, &OW, &KH, &KW, &sh, &sw, &dh, &dw, &pt, &pl, &threads, &fast))
        return NULL;
    if (N < 0 || C < 0 || H < 1 || W < 1 || OH < 0 || OW < 0 || KH < 1 || KW < 1 || sh < 1 ||
        sw < 1 || dh < 1 || dw < 1 || pt < 0 || pl < 0) {
        PyErr_SetString(PyExc_ValueError, "maxpool2d: negative or zero size, stride or dilation");
        return NULL;
    }
    Py_buffer v[2];
    const rc_buf spec[2] = {{xo, N * C * H * W, RC_F32, 0, 0, "X"}, {yo, N * C * OH * OW, RC_F32, 1, 0, "Y"}};
    if (get_buffers("maxpool2d", spec, v, 2) < 0)
        return NULL;
#if DWF_OK
    /* 3x3, dilation 1, stride 1 or 2 both ways (ResNet's): depthwise2d's AVX-512 phase planes,
       the window's maximum instead of its weighted sum (see docs/performance.md) */
    if (fast && dwf_takes(KH, KW, sh, sw, dh, dw, OH, OW, N * C)) {
        dwf_job fj = {(const float *)v[0].buf, NULL, NULL, (float *)v[1].buf, N * C, 1, H, W, OH, OW, sh,
                      pt, pl, 0, 0, 0, 0, 0.0f, 0.0f, NULL, 0, 1};
        return dwf_run(&fj, threads, v, 2);
    }
#endif
    /* a phase holds the padded row up to the last output's last tap, or the whole input row */
    Py_ssize_t Wr = (OW ? (OW - 1) * sw + (KW - 1) * dw + 1 : 0);
    if (Wr < pl + W)
        Wr = pl + W;
    const Py_ssize_t Lq = (Wr + sw - 1) / sw + 1;
    /* channel planes split between the kernel threads, a thread from about 64K window taps */
    const int parts = rc_parts((double)(N * C) * (double)(OH * OW) * (double)(KH * KW), 65536.0, N * C,
                               &threads);
    const Py_ssize_t scratch_n = sw * Lq + H * OW;
    float *scratch = (float *)malloc((size_t)(parts * scratch_n) * sizeof(float));
    if (!scratch) {
        release_buffers(v, 2);
        return PyErr_NoMemory();
    }
    mp_job j = {(const float *)v[0].buf, (float *)v[1].buf, N * C, H, W, OH, OW, KH, KW, sh, sw,
                dh, dw, pt, pl, scratch, scratch_n, Lq};
    Py_BEGIN_ALLOW_THREADS
    rc_parallel(mp_part, &j, parts, threads);
    Py_END_ALLOW_THREADS
    free(scratch);
    release_buffers(v, 2);
    Py_RETURN_NONE;
}
