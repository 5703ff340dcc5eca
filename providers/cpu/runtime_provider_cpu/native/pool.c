/* maxpool2d: MaxPool of float32 NCHW planes, separable and unit-stride (its 3x3 windows of
 * stride 1 or 2 go to depthwise_avx512.c on AVX-512 machines); row_means: GlobalAveragePool. */
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
    float *scratch; /* a part's: a row's nph column phases (nph x Lq) and the row maxima (H x OW) */
    Py_ssize_t scratch_n, Lq;
    Py_ssize_t nph; /* column phases held: sw, or the padded row's width where that is less */
    int direct;     /* windows too sparse for phases (extreme strides, dilations, pads): mp_direct */
} mp_job;

RC_INLINE float mp_max(float m, float v) { return ((v > m) | (v != v)) ? v : m; }

/* taps [*t0, *t1) of a window of k taps, dilation d, from padded position base (may be
 * negative) that land inside [0, n) */
static void mp_taps(rc_wide base, Py_ssize_t d, Py_ssize_t k, Py_ssize_t n, Py_ssize_t *t0, Py_ssize_t *t1)
{
    const rc_wide lo = base >= 0 ? 0 : (-base + d - 1) / d, last = n - 1 - base;
    const rc_wide hi = last < 0 ? 0 : last / d + 1;
    *t0 = lo < k ? (Py_ssize_t)lo : k;
    *t1 = hi < k ? (Py_ssize_t)hi : k;
    if (*t1 < *t0)
        *t1 = *t0;
}

RC_CLONES
static void mp_planes(const mp_job *j, float *scratch, Py_ssize_t p0, Py_ssize_t p1)
{
    const Py_ssize_t H = j->H, W = j->W, OH = j->OH, OW = j->OW, sw = j->sw, Lq = j->Lq;
    const Py_ssize_t KW = j->KW, pl = j->pl;
    /* phases past the padded row's width (a stride wider than it) hold nothing: not kept */
    const Py_ssize_t nph = j->nph;
    float *restrict ph = scratch;               /* nph phases of Lq floats */
    float *restrict hm = scratch + nph * Lq;    /* row maxima, H x OW */
    for (Py_ssize_t i = 0; i < nph * Lq; i++)
        ph[i] = -INFINITY;                      /* padding: written once, never overwritten */
    /* decided once, not a row at a time (their divisions were most of the time): for each
       column phase b its first input column k0, where it lands, and how many; for each tap
       where in the phases its output columns start */
    Py_ssize_t k0s[nph], doff[nph], cnt[nph], toff[KW];
    for (Py_ssize_t b = 0; b < nph; b++) {
        Py_ssize_t k0 = (b - pl) % sw;
        k0 = k0 < 0 ? k0 + sw : k0;
        k0s[b] = k0;
        doff[b] = b * Lq + (k0 + pl) / sw;
        cnt[b] = k0 < W ? (W - k0 - 1) / sw + 1 : 0;
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
                for (Py_ssize_t b = 0; b < nph; b++) {
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
            /* only the taps inside the input: a tall window is not a long loop */
            Py_ssize_t kh0, kh1;
            mp_taps((rc_wide)oh * j->sh - j->pt, j->dh, j->KH, H, &kh0, &kh1);
            for (Py_ssize_t kh = kh0; kh < kh1; kh++) {
                const Py_ssize_t ir = oh * j->sh - j->pt + kh * j->dh;
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

/* planes [p0, p1) without scratch: each output the maximum of its window's taps inside the
 * input, found by arithmetic (windows far wider than the input: phases of the padded row would
 * be sized by the padding) */
static void mp_direct(const mp_job *j, Py_ssize_t p0, Py_ssize_t p1)
{
    const Py_ssize_t H = j->H, W = j->W, OH = j->OH, OW = j->OW;
    for (Py_ssize_t p = p0; p < p1; p++) {
        const float *xp = j->x + p * H * W;
        float *yp = j->y + p * OH * OW;
        for (Py_ssize_t oh = 0; oh < OH; oh++) {
            Py_ssize_t h0, h1;
            mp_taps((rc_wide)oh * j->sh - j->pt, j->dh, j->KH, H, &h0, &h1);
            for (Py_ssize_t ow = 0; ow < OW; ow++) {
                Py_ssize_t w0, w1;
                const rc_wide cb = (rc_wide)ow * j->sw - j->pl;
                mp_taps(cb, j->dw, j->KW, W, &w0, &w1);
                float m = -INFINITY;
                for (Py_ssize_t kh = h0; kh < h1; kh++) {
                    const float *xr = xp + (Py_ssize_t)((rc_wide)oh * j->sh - j->pt + (rc_wide)kh * j->dh) * W;
                    for (Py_ssize_t kw = w0; kw < w1; kw++)
                        m = mp_max(m, xr[(Py_ssize_t)(cb + (rc_wide)kw * j->dw)]);
                }
                yp[oh * OW + ow] = m;
            }
        }
    }
}

static void mp_part(void *arg, int part, int parts)
{
    const mp_job *j = (const mp_job *)arg;
    if (j->direct) {
        mp_direct(j, j->planes * part / parts, j->planes * (part + 1) / parts);
        return;
    }
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
    rc_sz sz = {NULL};
    const Py_ssize_t xn = sz_mul4(&sz, "X's size", N, C, H, W), yn = sz_mul4(&sz, "Y's size", N, C, OH, OW);
    if (sz_check(&sz, "maxpool2d", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[2];
    const rc_buf spec[2] = {{xo, xn, RC_F32, 0, 0, "X"}, {yo, yn, RC_F32, 1, 0, "Y"}};
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
    /* a phase holds the padded row up to the last output's last tap, or the whole input row;
       a left pad past the windows reads the same as one at their end */
    rc_sz ps = {NULL};
    const Py_ssize_t Wext = sz_extent(&ps, "the padded row", OW, sw, KW, dw);
    sz_extent(&ps, "the padded column", OH, sh, KH, dh); /* the rows' index arithmetic */
    const Py_ssize_t plc = pl < Wext ? pl : Wext;
    Py_ssize_t Wr = sz_add(&ps, "the padded row", plc, W);
    Wr = Wr > Wext ? Wr : Wext;
    const Py_ssize_t Lq = sz_add(&ps, "a column phase", Wr / sw + (Wr % sw != 0), 1);
    const Py_ssize_t nph = sw > 64 && sw > Wr ? Wr : sw;
    const Py_ssize_t scratch_n = sz_add(&ps, "the scratch", sz_mul(&ps, "the scratch", nph, Lq),
                                        sz_mul(&ps, "the scratch", H, OW));
    /* phases only where they are small beside the data (their tables are on the stack) */
    const int direct = ps.what || nph > 4096 || KW > 4096 || !sz_scratch_ok(scratch_n, H * W + OH * OW);
    /* channel planes split between the kernel threads, a thread from about 64K window taps */
    const int parts = rc_parts((double)N * (double)C * (double)OH * (double)OW * (double)KH * (double)KW, 65536.0,
                               N * C, &threads);
    float *scratch = NULL;
    if (!direct) {
        const Py_ssize_t all = sz_mul3(&ps, "the scratch", parts, scratch_n, RC_F32);
        if (sz_check(&ps, "maxpool2d", PyExc_MemoryError) < 0 ||
            !(scratch = (float *)malloc((size_t)all))) {
            release_buffers(v, 2);
            return ps.what ? NULL : PyErr_NoMemory();
        }
    }
    mp_job j = {(const float *)v[0].buf, (float *)v[1].buf, N * C, H, W, OH, OW, KH, KW, sh, sw,
                dh, dw, pt, direct ? pl : plc, scratch, scratch_n, Lq, nph, direct};
    Py_BEGIN_ALLOW_THREADS
    rc_parallel(mp_part, &j, parts, threads);
    Py_END_ALLOW_THREADS
    free(scratch);
    release_buffers(v, 2);
    Py_RETURN_NONE;
}

/* row_means: the mean of each row of a float32 [rows][n] (GlobalAveragePool, ReduceMean over
 * trailing axes): one pass of rc_row_means, as squeeze_excite's means, so the fused
 * block and the unfused GlobalAveragePool agree bit for bit. Rows split between the threads by
 * the bytes they read (64 KB a thread, as squeeze_excite's passes). */
typedef struct {
    const float *x;
    float *y;
    Py_ssize_t rows, n;
} rm_job;

/* the means of rows [r0, r1) of n floats each: two 8-float sums a row, then the tail; shared
 * with squeeze_excite's means (rows.c), so the fused block and GlobalAveragePool agree */
RC_CLONES
void rc_row_means(const float *x, float *y, Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t n)
{
    for (Py_ssize_t r = r0; r < r1; r++) {
        const float *xr = x + r * n;
        v8f s0 = {0}, s1 = {0};
        Py_ssize_t i = 0;
        for (; i + 16 <= n; i += 16) {
            s0 += v8_load(xr + i);
            s1 += v8_load(xr + i + 8);
        }
        s0 += s1;
        float t = 0.0f;
        for (int k = 0; k < 8; k++)
            t += s0[k];
        for (; i < n; i++)
            t += xr[i];
        y[r] = t / (float)n;
    }
}

static void rm_part(void *arg, int part, int parts)
{
    const rm_job *j = (const rm_job *)arg;
    rc_row_means(j->x, j->y, j->rows * part / parts, j->rows * (part + 1) / parts, j->n);
}

PyObject *rc_py_row_means(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *xo, *yo;
    Py_ssize_t rows, n;
    int threads = 1;
    if (!PyArg_ParseTuple(args, "OO(nn)|i:row_means", &xo, &yo, &rows, &n, &threads))
        return NULL;
    if (rows < 0 || n < 1) {
        PyErr_SetString(PyExc_ValueError, "row_means: rows must be >= 0 and the row length positive");
        return NULL;
    }
    rc_sz sz = {NULL};
    const Py_ssize_t xn = sz_mul(&sz, "X's size", rows, n);
    if (sz_check(&sz, "row_means", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[2];
    const rc_buf spec[2] = {{xo, xn, RC_F32, 0, 0, "X"}, {yo, rows, RC_F32, 1, 0, "Y"}};
    if (get_buffers("row_means", spec, v, 2) < 0)
        return NULL;
    rm_job j = {(const float *)v[0].buf, (float *)v[1].buf, rows, n};
    int th = threads < 1 ? 1 : threads;
    const int parts = rows ? rc_parts(4.0 * (double)xn, 65536.0, rows, &th) : 0;
    Py_BEGIN_ALLOW_THREADS
    if (parts)
        rc_parallel(rm_part, &j, parts, th);
    Py_END_ALLOW_THREADS
    release_buffers(v, 2);
    Py_RETURN_NONE;
}
