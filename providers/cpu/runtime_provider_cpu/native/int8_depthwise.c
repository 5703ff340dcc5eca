/* Depthwise int8 convolution (QLinearConv with group == C, one output channel per group) on
 * NCHW bytes, requantized as the numpy path does: saturate(rint((float)(acc + bias) * mult[c]) +
 * yz), bit for bit. Two loops:
 * - channel blocks (the default, KH * KW <= 256): 16 channels a vector; a band of input rows is
 *   transposed (16 x 16 byte blocks) into a float tile of (x - xz), every tap is one multiply-add
 *   for 4 neighbouring pixels kept in registers, and the band's bytes are transposed back into the
 *   NCHW planes. A band's rows are contiguous in each plane, so both transposes run over the band
 *   as one run of pixels, across row ends: small planes (MobileNet's late 7x7 and 14x14 layers)
 *   vectorize as well as large.
 * - whole planes (larger kernels, whose float sums could pass 2^24): each plane widened once into
 *   zero-padded int16 phase planes of (x - zero point) (padding then contributes 0, as zero-point
 *   padding does): sh x sw planes, the padded pixel (r, c) in plane (r % sh, c % sw) at
 *   (r / sh, c / sw), so that every tap of a strided kernel reads unit-stride rows; a tap is one
 *   long multiply-add over the whole plane (a few columns past OW computed and dropped). Exact
 *   while sum |x - xz| |w - wz| fits in int32 (KH * KW < 33000: always for real kernels). */
#include "native.h"

typedef struct {
    const uint8_t *x;      /* N x C x H x W bytes (int8 or uint8) */
    const uint8_t *w;      /* C x KH x KW bytes */
    const int32_t *wz;     /* C, or NULL */
    const int32_t *bias;   /* C, or NULL */
    const float *mult;     /* C */
    uint8_t *y;            /* N x C x OH x OW bytes */
    int16_t *work;         /* parts x wstride int16: phase planes, weights, the accumulator */
    Py_ssize_t wstride;
    Py_ssize_t N, C, H, W, KH, KW, OH, OW, sh, sw, dh, dw, pt, pl, PH, PW;
    Py_ssize_t PHs, PWs, phase; /* a phase plane's rows, pitch and items (with a pitch of slack) */
    int xsigned, wsigned, ysigned, xz, yz;
} qdw_job;

/* acc[q] += wv * r[q] over the plane's n outputs at the phase pitch */
RC_CLONES static void qdw_tap(int32_t *restrict acc, const int16_t *restrict r, int32_t wv, Py_ssize_t n)
{
    for (Py_ssize_t q = 0; q < n; q++)
        acc[q] += (int32_t)r[q] * wv;
}

/* y[o] = saturate(rint((float)(acc[o] + bias) * mult) + yz) as uint8 or int8 */
RC_CLONES static void qdw_store(const int32_t *restrict acc, uint8_t *restrict y, Py_ssize_t n, uint32_t bias,
                                float mult, float yz, float lo, float hi, int ysigned)
{
    for (Py_ssize_t o = 0; o < n; o++) {
        float t = rintf((float)(int32_t)((uint32_t)acc[o] + bias) * mult) + yz;
        t = t > lo ? t : lo; /* one-sided selects vectorize (vmaxps / vminps) */
        t = t < hi ? t : hi;
        y[o] = ysigned ? (uint8_t)(int8_t)(int32_t)t : (uint8_t)(int32_t)t;
    }
}

/* the plane (x - xz) as int16 into the zeroed phase planes p */
RC_CLONES static void qdw_fill(const uint8_t *restrict x, int16_t *restrict p, const qdw_job *j)
{
    memset(p, 0, sizeof(int16_t) * (size_t)(j->sh * j->sw * j->phase));
    const int16_t xz = (int16_t)j->xz, flip = j->xsigned ? 128 : 0;
    const Py_ssize_t wn = j->W < j->PW - j->pl ? j->W : j->PW - j->pl;
    for (Py_ssize_t h = 0; h < j->H; h++) {
        const Py_ssize_t r = h + j->pt;
        if (r >= j->PH)
            break;
        const uint8_t *xr = x + h * j->W;
        int16_t *pr = p + (r % j->sh) * j->sw * j->phase + (r / j->sh) * j->PWs;
        if (j->sw == 1) {
            pr += j->pl;
            for (Py_ssize_t i = 0; i < wn; i++)  /* an s8 byte read as (b ^ 0x80) - 128 */
                pr[i] = (int16_t)((int16_t)(uint8_t)(xr[i] ^ (uint8_t)flip) - flip - xz);
        } else
            for (Py_ssize_t ph = 0; ph < j->sw; ph++) {  /* column phase ph: no division per pixel */
                Py_ssize_t i = ((ph - j->pl) % j->sw + j->sw) % j->sw;
                int16_t *d = pr + ph * j->phase + (i + j->pl) / j->sw;
                for (; i < wn; i += j->sw)
                    *d++ = (int16_t)((int16_t)(uint8_t)(xr[i] ^ (uint8_t)flip) - flip - xz);
            }
    }
}

static void qdw_part(void *arg, int part, int parts)
{
    const qdw_job *j = (const qdw_job *)arg;
    const Py_ssize_t planes = j->N * j->C, p0 = planes * part / parts, p1 = planes * (part + 1) / parts;
    const Py_ssize_t KK = j->KH * j->KW, nq = j->OH * j->PWs;
    int16_t *pad = j->work + (Py_ssize_t)part * j->wstride;
    int16_t *wc = pad + j->sh * j->sw * j->phase;
    int32_t *acc = (int32_t *)(wc + ((KK + 1) & ~(Py_ssize_t)1));
    const float lo = j->ysigned ? -128.0f : 0.0f, hi = j->ysigned ? 127.0f : 255.0f;
    for (Py_ssize_t pl = p0; pl < p1; pl++) {
        const Py_ssize_t c = pl % j->C;
        qdw_fill(j->x + pl * j->H * j->W, pad, j);
        const int32_t wz = j->wz ? j->wz[c] : 0;
        const uint8_t *wr = j->w + c * KK;
        for (Py_ssize_t k = 0; k < KK; k++)
            wc[k] = (int16_t)((j->wsigned ? (int32_t)(int8_t)wr[k] : (int32_t)wr[k]) - wz);
        memset(acc, 0, sizeof(int32_t) * (size_t)nq);
        for (Py_ssize_t i = 0; i < j->KH; i++)
            for (Py_ssize_t t = 0; t < j->KW; t++) {
                const Py_ssize_t r = i * j->dh, q = t * j->dw;
                const int16_t *src = pad + ((r % j->sh) * j->sw + q % j->sw) * j->phase + (r / j->sh) * j->PWs
                                     + q / j->sw;
                qdw_tap(acc, src, wc[i * j->KW + t], nq);
            }
        const uint32_t b = j->bias ? (uint32_t)j->bias[c] : 0u;
        uint8_t *y = j->y + pl * j->OH * j->OW;
        for (Py_ssize_t oh = 0; oh < j->OH; oh++)
            qdw_store(acc + oh * j->PWs, y + oh * j->OW, j->OW, b, j->mult[c], (float)j->yz, lo, hi, j->ysigned);
    }
}

/* ---- channel blocks: 16 channels a vector, for planes of any size ----
 * A unit is 16 channels x a band of output rows of one image. Its input rows are transposed
 * into a float tile [rows][PW][16] of (x - xz) (zeros in the padding: zero-point padding), so
 * that a tap is one vector multiply-add over 16 channels and 4 neighbouring output pixels stay
 * in registers; float sums are exact (|x - xz|, |w - wz| <= 255 and KH * KW <= QDW_KK_EXACT
 * keep every partial sum below 2^24) and are requantized as the plane path does. */
#define QDW_CB 16
#define QDW_KK_EXACT 256
#define QDW_TILE_BYTES (48 * 1024) /* a band's tile in L1/L2 while its taps pass */

typedef struct {
    const qdw_job *j;
    Py_ssize_t ncb, R, nb, trows, wstride; /* channel blocks, rows a band, bands, tile rows, floats a part */
    int fast;                              /* rows on qdc_row_avx512 */
    float *work;
} qdc_job;

typedef float qdc_v16f __attribute__((vector_size(64)));
typedef int32_t qdc_v16i __attribute__((vector_size(64)));
typedef uint8_t qdc_v16b __attribute__((vector_size(16)));
typedef float qdc_v16fu __attribute__((vector_size(64), aligned(4))); /* unaligned loads */
typedef int32_t qdc_v16iu __attribute__((vector_size(64), aligned(4)));


/* np pixels of 16 channels' planes (rows[c]: the channel's first pixel; consecutive image rows
 * of W pixels, contiguous) as float (b ^ flip) - off into the tile rows from t (rowf floats
 * apart, 16 floats a pixel): 16 pixels a 16 x 16 byte transpose across row ends, so narrow
 * planes (MobileNet's 7x7 and 14x14) pay no per-row gather; columns past wn dropped */
RC_CLONES static void qdc_fill_flat(const uint8_t *const *rows, Py_ssize_t np, Py_ssize_t W, Py_ssize_t wn,
                                    Py_ssize_t rowf, uint8_t flip, float off, float *restrict t)
{
    const qdc_v16f offv = {off, off, off, off, off, off, off, off, off, off, off, off, off, off, off, off};
    Py_ssize_t w = 0;
    for (Py_ssize_t p0 = 0; p0 < np; p0 += QDW_CB) {
        const Py_ssize_t m = np - p0 < QDW_CB ? np - p0 : QDW_CB;
        qdc_v16b px[QDW_CB];
#if RC_SSE2
        if (m == QDW_CB) {
            __m128i in[QDW_CB];
            for (int c = 0; c < QDW_CB; c++)
                in[c] = _mm_loadu_si128((const __m128i *)(rows[c] + p0));
            rc_tr16_bytes(in, (__m128i *)px);
        } else
#endif
        {
            uint8_t b[QDW_CB][QDW_CB];
            for (Py_ssize_t p = 0; p < m; p++) /* only the m pixels converted below */
                for (int c = 0; c < QDW_CB; c++)
                    b[p][c] = rows[c][p0 + p];
            memcpy(px, b, sizeof(b[0]) * (size_t)m);
        }
        for (Py_ssize_t p = 0; p < m; p++) {
            if (w < wn) {
                const qdc_v16b v = px[p] ^ flip;
                const qdc_v16f f = __builtin_convertvector(__builtin_convertvector(v, qdc_v16i), qdc_v16f) - offv;
                memcpy(t + w * QDW_CB, &f, sizeof f);
            }
            if (++w == W) {
                w = 0;
                t += rowf;
            }
        }
    }
}

#if DWF_OK
/* qdc_fill_flat on AVX-512: a block of 16 pixels that stays inside one row and the stored
 * columns is converted straight from the transposed registers, no per-pixel test; the rest (row
 * ends, the last block) as qdc_fill_flat. The same floats. */
DWF_TARGET static void qdc_fill_flat_avx512(const uint8_t *const *rows, Py_ssize_t np, Py_ssize_t W, Py_ssize_t wn,
                                            Py_ssize_t rowf, uint8_t flip, float off, float *restrict t)
{
    const __m512 offv = _mm512_set1_ps(off);
    const __m128i fl = _mm_set1_epi8((char)flip);
    Py_ssize_t w = 0, p0 = 0;
    for (; p0 + QDW_CB <= np; p0 += QDW_CB) {
        __m128i in[QDW_CB], px[QDW_CB];
        for (int c = 0; c < QDW_CB; c++)
            in[c] = _mm_loadu_si128((const __m128i *)(rows[c] + p0));
        rc_tr16_bytes(in, px);
        if (w + QDW_CB <= wn) { /* wn <= W: the block is inside the row */
            for (int p = 0; p < QDW_CB; p++)
                _mm512_storeu_ps(t + (w + p) * QDW_CB,
                                 _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_xor_si128(px[p], fl))), offv));
            w += QDW_CB;
            if (w == W) {
                w = 0;
                t += rowf;
            }
            continue;
        }
        for (int p = 0; p < QDW_CB; p++) {
            if (w < wn)
                _mm512_storeu_ps(t + w * QDW_CB,
                                 _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_xor_si128(px[p], fl))), offv));
            if (++w == W) {
                w = 0;
                t += rowf;
            }
        }
    }
    if (p0 < np) { /* the last 1-15 pixels: the portable loop from where this one stopped */
        const uint8_t *rest[QDW_CB];
        for (int c = 0; c < QDW_CB; c++)
            rest[c] = rows[c] + p0;
        /* it counts columns from 0: hand it a row start, or finish this row here */
        Py_ssize_t p = p0;
        for (; p < np && w != 0; p++) {
            if (w < wn) {
                for (int c = 0; c < QDW_CB; c++)
                    t[w * QDW_CB + c] = (float)(uint8_t)(rows[c][p] ^ flip) - off;
            }
            if (++w == W) {
                w = 0;
                t += rowf;
            }
        }
        if (p < np) {
            for (int c = 0; c < QDW_CB; c++)
                rest[c] = rows[c] + p;
            qdc_fill_flat(rest, np - p, W, wn, rowf, flip, off, t);
        }
    }
}
#endif

/* the band's input rows into the tile (rows outside the image and the pad columns zero) */
static void qdc_fill(const qdw_job *j, const qdc_job *q, Py_ssize_t n, Py_ssize_t c0, Py_ssize_t r0, float *restrict t)
{
    const uint8_t *rows[QDW_CB];
    const Py_ssize_t rowf = j->PW * QDW_CB, wn = j->W < j->PW - j->pl ? j->W : j->PW - j->pl;
    Py_ssize_t h0 = -1, h1 = -1; /* the image rows the tile holds */
    for (Py_ssize_t r = 0; r < q->trows; r++) {
        float *tr = t + r * rowf;
        const Py_ssize_t h = r0 + r - j->pt;
        if (h < 0 || h >= j->H) {
            memset(tr, 0, sizeof(float) * (size_t)rowf);
            continue;
        }
        h0 = h0 < 0 ? h : h0;
        h1 = h + 1;
        memset(tr, 0, sizeof(float) * (size_t)(j->pl * QDW_CB));
        if (j->pl + wn < j->PW)
            memset(tr + (j->pl + wn) * QDW_CB, 0, sizeof(float) * (size_t)((j->PW - j->pl - wn) * QDW_CB));
    }
    if (h0 < 0)
        return;
    for (int c = 0; c < QDW_CB; c++) {
        const Py_ssize_t cc = c0 + c < j->C ? c0 + c : j->C - 1; /* past C: a copy, never stored */
        rows[c] = j->x + ((n * j->C + cc) * j->H + h0) * j->W;
    }
    float *t0 = t + (h0 + j->pt - r0) * rowf + j->pl * QDW_CB;
    const uint8_t flip = j->xsigned ? 0x80 : 0;
    const float off = (float)(j->xz + (j->xsigned ? 128 : 0));
#if DWF_OK
    if (q->fast) {
        qdc_fill_flat_avx512(rows, (h1 - h0) * j->W, j->W, wn, rowf, flip, off, t0);
        return;
    }
#endif
    qdc_fill_flat(rows, (h1 - h0) * j->W, j->W, wn, rowf, flip, off, t0);
}

/* pixels [ow, ow + NP) of an output row: every tap a 16-channel multiply-add (the sums of NP
 * neighbouring pixels in registers), stored in sums[ow + p][16] */
#define QDC_PIXELS(NP)                                                                                                  \
    do {                                                                                                                \
        qdc_v16f a[NP];                                                                                                 \
        for (int p = 0; p < NP; p++)                                                                                    \
            a[p] = zero;                                                                                                \
        for (Py_ssize_t i = 0; i < KH; i++)                                                                             \
            for (Py_ssize_t k = 0; k < KW; k++) {                                                                       \
                const float *tp = t + i * dh + k * dw + ow * sw;                                                        \
                const qdc_v16f w = *(const qdc_v16fu *)(wf + (i * KW + k) * QDW_CB);                                    \
                for (int p = 0; p < NP; p++)                                                                            \
                    a[p] += *(const qdc_v16fu *)(tp + p * sw) * w;                                                      \
            }                                                                                                           \
        for (int p = 0; p < NP; p++)                                                                                    \
            *(qdc_v16fu *)(sums + (ow + p) * QDW_CB) = a[p];                                                            \
    } while (0)

/* a row's exact sums [OW][16] requantized as the plane path does, into bytes [OW][16] */
RC_CLONES static void qdc_requant(const qdw_job *j, const float *restrict sums, const int32_t *restrict bias,
                                  const float *restrict mult, uint8_t *restrict ob)
{
    const float yz = (float)j->yz, lo = j->ysigned ? -128.0f : 0.0f, hi = j->ysigned ? 127.0f : 255.0f;
    for (Py_ssize_t p = 0; p < j->OW; p++)
        for (int c = 0; c < QDW_CB; c++) {
            float t = rintf((float)(int32_t)((uint32_t)(int32_t)sums[p * QDW_CB + c] + (uint32_t)bias[c]) * mult[c]) + yz;
            t = t > lo ? t : lo; /* one-sided selects: vmaxps / vminps */
            t = t < hi ? t : hi;
            ob[p * QDW_CB + c] = (uint8_t)(int32_t)t; /* the low byte: int8 as two's complement */
        }
}

/* one output row of a band, 4 pixels at a time (the last 1-3 together), requantized into its
 * bytes ob [OW][16] */
RC_CLONES static void qdc_row(const qdw_job *j, const float *restrict t, const float *restrict wf,
                              const int32_t *restrict bias, const float *restrict mult, float *restrict sums,
                              uint8_t *restrict ob)
{
    const Py_ssize_t KH = j->KH, KW = j->KW, rowf = j->PW * QDW_CB, sw = j->sw * QDW_CB, dw = j->dw * QDW_CB;
    const Py_ssize_t dh = j->dh * rowf, OW = j->OW;
    const qdc_v16f zero = {0};
    Py_ssize_t ow = 0;
    for (; ow + 4 <= OW; ow += 4)
        QDC_PIXELS(4);
    if (OW - ow == 3)
        QDC_PIXELS(3);
    else if (OW - ow == 2)
        QDC_PIXELS(2);
    else if (OW - ow == 1)
        QDC_PIXELS(1);
    qdc_requant(j, sums, bias, mult, ob);
}

#if DWF_OK
/* qdc_row on AVX-512 (the CONV_FAST CPUs): the same sums, requantized in the registers they were
 * summed in (no pass over a row of stored sums): rounded in the current mode (rintf's), + yz,
 * clamped and truncated to the low byte as qdc_requant does; the same bytes */
#define QDC_PIXELS_512(NP)                                                                                              \
    do {                                                                                                                \
        __m512 a[NP];                                                                                                   \
        for (int p = 0; p < NP; p++)                                                                                    \
            a[p] = _mm512_setzero_ps();                                                                                 \
        for (Py_ssize_t i = 0; i < KH; i++)                                                                             \
            for (Py_ssize_t k = 0; k < KW; k++) {                                                                       \
                const float *tp = t + i * dh + k * dw + ow * sw;                                                        \
                const __m512 w = _mm512_loadu_ps(wf + (i * KW + k) * QDW_CB);                                           \
                for (int p = 0; p < NP; p++)                                                                            \
                    a[p] = _mm512_fmadd_ps(_mm512_loadu_ps(tp + p * sw), w, a[p]);                                      \
            }                                                                                                           \
        for (int p = 0; p < NP; p++) {                                                                                  \
            const __m512i s = _mm512_add_epi32(_mm512_cvttps_epi32(a[p]), bv);                                          \
            __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s), mv), _MM_FROUND_CUR_DIRECTION);        \
            v = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(v, yzv), lov), hiv);                                          \
            _mm_storeu_si128((__m128i *)(ob + (ow + p) * QDW_CB), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(v)));        \
        }                                                                                                               \
    } while (0)

DWF_TARGET static void qdc_row_avx512(const qdw_job *j, const float *restrict t, const float *restrict wf,
                                      const int32_t *restrict bias, const float *restrict mult, uint8_t *restrict ob)
{
    const Py_ssize_t KH = j->KH, KW = j->KW, rowf = j->PW * QDW_CB, sw = j->sw * QDW_CB, dw = j->dw * QDW_CB;
    const Py_ssize_t dh = j->dh * rowf, OW = j->OW;
    const __m512i bv = _mm512_loadu_si512((const void *)bias);
    const __m512 mv = _mm512_loadu_ps(mult), yzv = _mm512_set1_ps((float)j->yz);
    const __m512 lov = _mm512_set1_ps(j->ysigned ? -128.0f : 0.0f), hiv = _mm512_set1_ps(j->ysigned ? 127.0f : 255.0f);
    Py_ssize_t ow = 0;
    for (; ow + 4 <= OW; ow += 4)
        QDC_PIXELS_512(4);
    if (OW - ow == 3)
        QDC_PIXELS_512(3);
    else if (OW - ow == 2)
        QDC_PIXELS_512(2);
    else if (OW - ow == 1)
        QDC_PIXELS_512(1);
}
#endif

/* a band's bytes ob [np][16] (np pixels, pixel-major) into the nc channels' output runs o[c]
 * (a band's rows are contiguous in each plane): 16 pixels a byte transpose, across row ends */
RC_CLONES static void qdc_store(const uint8_t *restrict ob, uint8_t *const *o, Py_ssize_t np, Py_ssize_t nc)
{
    Py_ssize_t p = 0;
#if RC_SSE2
    for (; p + QDW_CB <= np; p += QDW_CB) {
        __m128i tr[QDW_CB];
        rc_tr16_bytes((const __m128i *)(ob + p * QDW_CB), tr);
        for (Py_ssize_t c = 0; c < nc; c++)
            _mm_storeu_si128((__m128i *)(o[c] + p), tr[c]);
    }
#endif
    for (Py_ssize_t c = 0; c < nc; c++)
        for (Py_ssize_t i = p; i < np; i++)
            o[c][i] = ob[i * QDW_CB + c];
}

static void qdc_part(void *arg, int part, int parts)
{
    const qdc_job *q = (const qdc_job *)arg;
    const qdw_job *j = q->j;
    const Py_ssize_t units = j->N * q->ncb * q->nb, u0 = units * part / parts, u1 = units * (part + 1) / parts;
    const Py_ssize_t KK = j->KH * j->KW, tilef = q->trows * j->PW * QDW_CB;
    float *t = q->work + (Py_ssize_t)part * q->wstride, *wf = t + tilef, *mult = wf + KK * QDW_CB;
    int32_t *bias = (int32_t *)(mult + QDW_CB);
    float *sums = (float *)(bias + QDW_CB);      /* a row's sums, pixel-major */
    uint8_t *ob = (uint8_t *)(sums + j->OW * QDW_CB); /* the band's bytes, pixel-major */
    Py_ssize_t have = -1; /* the channel block whose weights wf holds */
    for (Py_ssize_t u = u0; u < u1; u++) {
        const Py_ssize_t band = u % q->nb, cb = (u / q->nb) % q->ncb, n = u / (q->nb * q->ncb);
        const Py_ssize_t c0 = cb * QDW_CB, nc = j->C - c0 < QDW_CB ? j->C - c0 : QDW_CB;
        if (have != cb) {
            for (Py_ssize_t k = 0; k < KK; k++)
                for (int c = 0; c < QDW_CB; c++) {
                    const Py_ssize_t cc = c0 + c;
                    int32_t v = 0;
                    if (c < nc) {
                        const uint8_t b = j->w[cc * KK + k];
                        v = (j->wsigned ? (int32_t)(int8_t)b : (int32_t)b) - (j->wz ? j->wz[cc] : 0);
                    }
                    wf[k * QDW_CB + c] = (float)v;
                }
            for (int c = 0; c < QDW_CB; c++) {
                mult[c] = c < nc ? j->mult[c0 + c] : 0.0f;
                bias[c] = c < nc && j->bias ? j->bias[c0 + c] : 0;
            }
            have = cb;
        }
        const Py_ssize_t oh0 = band * q->R, oh1 = oh0 + q->R < j->OH ? oh0 + q->R : j->OH;
        qdc_fill(j, q, n, c0, oh0 * j->sh, t);
        for (Py_ssize_t oh = oh0; oh < oh1; oh++) {
            const float *tr = t + (oh - oh0) * j->sh * j->PW * QDW_CB;
            uint8_t *orow = ob + (oh - oh0) * j->OW * QDW_CB;
#if DWF_OK
            if (q->fast) {
                qdc_row_avx512(j, tr, wf, bias, mult, orow);
                continue;
            }
#endif
            qdc_row(j, tr, wf, bias, mult, sums, orow);
        }
        uint8_t *rows[QDW_CB];
        for (Py_ssize_t c = 0; c < nc; c++)
            rows[c] = j->y + ((n * j->C + c0 + c) * j->OH + oh0) * j->OW;
        qdc_store(ob, rows, (oh1 - oh0) * j->OW, nc);
    }
}

/* the channel-block path (KH * KW <= QDW_KK_EXACT), its rows on AVX-512 where fast; -1 with an
 * exception set */
static int qdc_run(qdw_job *j, int threads, int fast)
{
    qdc_job q;
    memset(&q, 0, sizeof q);
    q.j = j;
    q.fast = fast;
    q.ncb = (j->C + QDW_CB - 1) / QDW_CB;
    const Py_ssize_t eh = (j->KH - 1) * j->dh + 1, rowb = j->PW * QDW_CB * (Py_ssize_t)sizeof(float);
    Py_ssize_t R = (QDW_TILE_BYTES / rowb - eh) / j->sh + 1;
    R = R < 1 ? 1 : (R > j->OH ? j->OH : R);
    q.R = R;
    q.nb = (j->OH + R - 1) / R;
    q.trows = (R - 1) * j->sh + eh;
    rc_sz sz = {NULL};
    /* the tile, the weights, 16 multipliers, 16 biases, a row's sums, the band's bytes */
    q.wstride = sz_add(&sz, "the work size", sz_mul3(&sz, "the work size", q.trows, j->PW, QDW_CB),
                       sz_add(&sz, "the work size", (j->KH * j->KW + 2 + j->OW) * QDW_CB,
                              sz_mul3(&sz, "the work size", R, j->OW, QDW_CB / 4)));
    q.wstride = (q.wstride + 15) & ~(Py_ssize_t)15;
    const Py_ssize_t units = j->N * q.ncb * q.nb;
    const int parts = rc_parts(2.0 * (double)(j->N * j->C * j->OH * j->OW) * (double)(j->KH * j->KW), 2.5e5,
                               units, &threads);
    const Py_ssize_t workn = sz_mul3(&sz, "the work size", parts, q.wstride, (Py_ssize_t)sizeof(float));
    if (sz_check(&sz, "qdwconv", PyExc_MemoryError) < 0)
        return -1;
    q.work = (float *)rc_work((size_t)workn);
    if (q.work == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_BEGIN_ALLOW_THREADS
    rc_parallel(qdc_part, &q, parts, threads);
    Py_END_ALLOW_THREADS
    rc_work_done(q.work, (size_t)workn);
    return 0;
}

/* qdwconv(x, x_signed, xz, w, w_signed, wz, bias, mult, y, y_signed, yz,
 *         (N, C, H, W), (KH, KW), (OH, OW), (sh, sw), (dh, dw), (pt, pl), threads) */
PyObject *rc_py_qdwconv(PyObject *self, PyObject *args)
{
    PyObject *xo, *wo, *wzo, *bo, *mo, *yo;
    int xs, ws, ys, xz, yz, threads, method = 1;
    qdw_job j;
    memset(&j, 0, sizeof j);
    if (!PyArg_ParseTuple(args, "OpiOpOOOOpi(nnnn)(nn)(nn)(nn)(nn)(nn)i|i:qdwconv", &xo, &xs, &xz, &wo, &ws, &wzo,
                          &bo, &mo, &yo, &ys, &yz, &j.N, &j.C, &j.H, &j.W, &j.KH, &j.KW, &j.OH, &j.OW, &j.sh,
                          &j.sw, &j.dh, &j.dw, &j.pt, &j.pl, &threads, &method))
        return NULL;
    if (j.N < 1 || j.C < 1 || j.H < 1 || j.W < 1 || j.KH < 1 || j.KW < 1 || j.OH < 1 || j.OW < 1 || j.sh < 1
        || j.sw < 1 || j.dh < 1 || j.dw < 1 || j.pt < 0 || j.pl < 0 || j.KH * j.KW >= 33000
        || xz < (xs ? -128 : 0) || xz > (xs ? 127 : 255) || yz < (ys ? -128 : 0) || yz > (ys ? 127 : 255)) {
        PyErr_SetString(PyExc_ValueError, "qdwconv: sizes, strides and dilations must be positive, pads not "
                                          "negative, KH * KW < 33000 and the zero points in their types' ranges");
        return NULL;
    }
    rc_sz sz = {NULL};
    j.PH = sz_extent(&sz, "the padded height", j.OH, j.sh, j.KH, j.dh);
    j.PW = sz_extent(&sz, "the padded width", j.OW, j.sw, j.KW, j.dw);
    const Py_ssize_t xn = sz_mul4(&sz, "X's size", j.N, j.C, j.H, j.W);
    const Py_ssize_t yn = sz_mul4(&sz, "Y's size", j.N, j.C, j.OH, j.OW);
    const Py_ssize_t wn = sz_mul3(&sz, "W's size", j.C, j.KH, j.KW);
    j.PHs = (j.PH + j.sh - 1) / j.sh;
    j.PWs = (j.PW + j.sw - 1) / j.sw;
    /* a phase plane, with a row of slack: the dropped columns of the last output row read past it */
    j.phase = sz_mul(&sz, "the work size", j.PHs + 1, j.PWs);
    /* the phase planes, the weights (even count: the accumulator stays 4-byte aligned), the
     * accumulator of OH rows at the phase pitch */
    j.wstride = sz_add(&sz, "the work size",
                       sz_add(&sz, "the work size", sz_mul3(&sz, "the work size", j.sh, j.sw, j.phase),
                              ((j.KH * j.KW + 1) & ~(Py_ssize_t)1)),
                       sz_mul3(&sz, "the work size", j.OH, j.PWs, 2));
    j.wstride = (j.wstride + 31) & ~(Py_ssize_t)31; /* each part's area on its own cache lines */
    if (sz_check(&sz, "qdwconv", PyExc_ValueError) < 0)
        return NULL;
    const Py_ssize_t planes = j.N * j.C;
    const int parts = rc_parts(2.0 * (double)yn * (double)(j.KH * j.KW), 2.5e5, planes, &threads);
    const Py_ssize_t workn = sz_mul3(&sz, "the work size", parts, j.wstride, 2);
    if (sz_check(&sz, "qdwconv", PyExc_MemoryError) < 0)
        return NULL;
    Py_buffer v[6];
    const rc_buf spec[6] = {{xo, xn, 1, 0, 0, "x"}, {wo, wn, 1, 0, 0, "w"}, {wzo, j.C, 4, 0, 1, "wz"},
                            {bo, j.C, 4, 0, 1, "bias"}, {mo, j.C, RC_F32, 0, 0, "mult"}, {yo, yn, 1, 1, 0, "y"}};
    if (get_buffers("qdwconv", spec, v, 6) < 0)
        return NULL;
    j.x = (const uint8_t *)v[0].buf;
    j.w = (const uint8_t *)v[1].buf;
    j.wz = (const int32_t *)v[2].buf;
    j.bias = (const int32_t *)v[3].buf;
    j.mult = (const float *)v[4].buf;
    j.y = (uint8_t *)v[5].buf;
    j.xsigned = xs, j.wsigned = ws, j.ysigned = ys, j.xz = xz, j.yz = yz;
    if (method != 0 && j.KH * j.KW <= QDW_KK_EXACT) {
        const int rc = qdc_run(&j, threads, method == 1 && rc_conv_fast);
        release_buffers(v, 6);
        if (rc < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    j.work = (int16_t *)rc_work((size_t)workn);
    const int oom = j.work == NULL;
    if (!oom) {
        Py_BEGIN_ALLOW_THREADS
        rc_parallel(qdw_part, &j, parts, threads);
        Py_END_ALLOW_THREADS
        rc_work_done(j.work, (size_t)workn);
    }
    release_buffers(v, 6);
    if (oom)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}
