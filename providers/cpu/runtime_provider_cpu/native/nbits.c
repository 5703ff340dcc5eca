/* MatMulNBits (com.microsoft, 4 bits): y (M x N) = a (M x K) w^T (+ bias) on the codes as
 * stored, never a float copy of the whole weight. w[n][k] = (q - z) * s, q the 4-bit code
 * (two a byte, low nibble first, [N][n_blocks][block / 2]), s and z per block of `bs` terms
 * along K (z: packed 4-bit [N][ceil(n_blocks / 2)], float [N][n_blocks], or 8 when absent).
 *
 * Two paths, by the row count:
 * - a few rows (decode): per column, 16 codes at a time dequantized in registers and
 *   multiplied into each row's 16-lane accumulator (K in the lanes), one reduction at the end;
 *   the weights are read once, 0.5 byte a term;
 * - more rows (a prompt): per unit of 32 columns and chunk of NB_KC terms, the codes are
 *   dequantized into a float panel [kn][32] in L1 (a column at a time, then 16 x 16 register
 *   transposes) and linear's 12 x 32 register tiles pass every 12-row panel of a over it, as
 *   onnxruntime's MLAS dequantizes a column panel for its sgemm kernel; with the codes repacked once
 *   per session by nbits_pack_panels (a term's 32 columns in 16 bytes) a row of the panel is one
 *   widening load and two (q - z) * s, with no transposes and no column buffer.
 * Both are vector-extension C whose clones the CPU picks at load (RC_CLONES; linear's tiles
 * CV_CLONES), plus an AVX-512 intrinsic loop for the per-column path (blocks of 32 and more)
 * where rc_conv_fast says the CPU runs it; whether this beats the dequantized weight and BLAS
 * on a machine is measured (ops/quant_contrib.py, fast/autotune.py). */
#include "native.h"

#define NB_KC 256     /* terms a chunk: a multiple of every block size taken (16 to 256) */
#define NB_DOT_MAX RC_NBITS_DOT_ROWS
#define NB_GCOLS 16   /* columns a unit of the per-column path */
#define NB_DOT_NC 4   /* columns in flight in the per-column AVX-512 loop (2 ran slower here, 1 and 4 alike) */

typedef uint32_t nb_u32x16 __attribute__((vector_size(64)));

/* 1: the per-column path's portable clones even where the AVX-512 loop runs (nbits_path, tests) */
static int nb_portable;

typedef struct {
    const float *a, *s, *zf, *bias;
    const uint8_t *b, *zp;
    float *ap, *y;
    const float *asum; /* the AVX-512 per-column loop: a's sums per row and block, [M][nb] */
    Py_ssize_t M, K, N, bs, nb, zb, Kp, bp; /* Kp: a's padded rows (per-column path); bp: row panels a unit */
    int wide; /* the per-column path's AVX-512 loop: a's rows de-interleaved, even terms then odd, per 32 */
    /* the panel path's codes repacked by nbits_pack_panels (NULL: read as stored): [P][Kp][16] bytes,
     * P = ceil(N / 32); the scales and zero points are read where they are */
    const uint8_t *pq;
} nb_job;

/* column n's zero point of block blk */
static inline float nb_zero(const nb_job *j, Py_ssize_t n, Py_ssize_t blk)
{
    if (j->zf)
        return j->zf[n * j->nb + blk];
    if (j->zp) {
        const uint8_t v = j->zp[n * j->zb + blk / 2];
        return (float)(blk & 1 ? v >> 4 : v & 15);
    }
    return 8.0f;
}

/* block blk's scales and zero points of columns [n0, n0 + nn) into s[32], z[32] (zeros past nn) */
static inline void nb_block_sz(const nb_job *j, Py_ssize_t n0, Py_ssize_t nn, Py_ssize_t blk, float *s, float *z)
{
    for (Py_ssize_t c = 0; c < 32; c++) {
        s[c] = c < nn ? j->s[(n0 + c) * j->nb + blk] : 0.0f;
        z[c] = c < nn ? nb_zero(j, n0 + c, blk) : 0.0f;
    }
}

/* 16 codes (8 bytes, low nibble first) as (q - z) * s, the reference's two float steps: the
 * two 32-bit halves spread over the lanes and shifted by each lane's nibble (byte vectors
 * converted to float were taken apart lane by lane) */
RC_INLINE v16f nb_deq16(const uint8_t *p, float z, float s)
{
    uint32_t h[2];
    memcpy(h, p, 8);
    const nb_u32x16 x = __builtin_shuffle((nb_u32x16){h[0], h[1]}, (v16i){0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1});
    const nb_u32x16 c = (x >> (nb_u32x16){0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28}) & 15;
    return (__builtin_convertvector((v16i)c, v16f) - z) * s;
}

RC_INLINE float nb_hsum(v16f v)
{
    v = v + __builtin_shuffle(v, (v16i){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
    v = v + __builtin_shuffle(v, (v16i){4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
    v = v + __builtin_shuffle(v, (v16i){2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
    v = v + __builtin_shuffle(v, (v16i){1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
    return v[0];
}

/* ---- the per-column path --------------------------------------------------------------- */

/* columns [n0, n1) for MR rows of the zero-padded rows ap (Kp apart); the lanes of the last
 * block past K are zeroed (its padding codes are not the weight's) */
RC_INLINE void nb_dot_body(const nb_job *j, Py_ssize_t n0, Py_ssize_t n1, const int MR)
{
    const Py_ssize_t bs = j->bs, nb = j->nb, bb = bs / 2, K = j->K;
    const v16i lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    for (Py_ssize_t n = n0; n < n1; n++) {
        v16f acc[NB_DOT_MAX];
        for (int m = 0; m < MR; m++)
            acc[m] = (v16f){0};
        const uint8_t *q = j->b + n * nb * bb;
        for (Py_ssize_t blk = 0; blk < nb; blk++, q += bb) {
            const float s = j->s[n * nb + blk], z = nb_zero(j, n, blk);
            for (Py_ssize_t g = 0; g < bs / 16; g++) {
                const Py_ssize_t k = blk * bs + 16 * g;
                if (k >= K)
                    break;
                v16f w = nb_deq16(q + 8 * g, z, s);
                if (k + 16 > K)
                    w = (v16f)((v16i)w & (lane < (int32_t)(K - k)));
                for (int m = 0; m < MR; m++)
                    acc[m] += w * *(const v16f_u *)(j->ap + m * j->Kp + k);
            }
        }
        const float b = j->bias ? j->bias[n] : 0.0f;
        for (int m = 0; m < MR; m++)
            j->y[m * j->N + n] = nb_hsum(acc[m]) + b;
    }
}

RC_CLONES static void nb_dot_cols(const nb_job *j, Py_ssize_t n0, Py_ssize_t n1)
{
    switch (j->M) { /* the row count a constant in each copy: the accumulators in registers */
    case 1: nb_dot_body(j, n0, n1, 1); break;
    case 2: nb_dot_body(j, n0, n1, 2); break;
    case 3: nb_dot_body(j, n0, n1, 3); break;
    default: nb_dot_body(j, n0, n1, 4); break;
    }
}

#if DWF_OK
#define NB_PF 1024 /* bytes of codes prefetched ahead of the columns being read (a few columns at GPT-2's K) */

/* sum over column n's blocks of s * z * asum[m][blk], the zero points' term, 16 blocks a step where
 * they are absent (8) or float; packed ones a block at a time */
DWF_TARGET static inline __attribute__((always_inline)) void nb_zterm(const nb_job *j, Py_ssize_t n, const int MR,
                                                                      float *zt)
{
    const Py_ssize_t nb = j->nb;
    const float *s = j->s + n * nb;
    if (j->zp) {
        for (int m = 0; m < MR; m++) {
            float t = 0.0f;
            for (Py_ssize_t blk = 0; blk < nb; blk++)
                t += s[blk] * nb_zero(j, n, blk) * j->asum[m * nb + blk];
            zt[m] = t;
        }
        return;
    }
    __m512 acc[NB_DOT_MAX];
    for (int m = 0; m < MR; m++)
        acc[m] = _mm512_setzero_ps();
    for (Py_ssize_t blk = 0; blk < nb; blk += 16) {
        const __mmask16 k = nb - blk >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nb - blk)) - 1);
        __m512 sz = _mm512_maskz_loadu_ps(k, s + blk);
        sz = _mm512_mul_ps(sz, j->zf ? _mm512_maskz_loadu_ps(k, j->zf + n * nb + blk) : _mm512_set1_ps(8.0f));
        for (int m = 0; m < MR; m++)
            acc[m] = _mm512_fmadd_ps(sz, _mm512_maskz_loadu_ps(k, j->asum + m * nb + blk), acc[m]);
    }
    for (int m = 0; m < MR; m++)
        zt[m] = _mm512_reduce_add_ps(acc[m]);
}

/* the per-column path's AVX-512 loop for blocks of 32 and more, on y[n] = sum_blk s (sum_k q a - z asum[blk]):
 * 32 codes a step widened by one vpmovzxbd and split into the even (low nibble) and odd (high nibble)
 * terms against a's rows de-interleaved the same way, the codes' products summed per block and scaled
 * once; a's padding past K is zero, so the last block's padding codes add nothing. NC columns at a
 * time (independent chains, several code streams in flight) with a prefetch NB_PF bytes ahead: a
 * thread's columns are one stream, which the hardware prefetcher alone followed at half the speed. */
DWF_TARGET static inline __attribute__((always_inline)) void nb_dot512_cols(const nb_job *j, Py_ssize_t n,
                                                                            const int MR, const int NC)
{
    const Py_ssize_t bs = j->bs, nb = j->nb, bb = bs / 2, Kp = j->Kp;
    const __m512i lo4 = _mm512_set1_epi32(15);
    __m512 acc[4][NB_DOT_MAX];
    for (int c = 0; c < NC; c++)
        for (int m = 0; m < MR; m++)
            acc[c][m] = _mm512_setzero_ps();
    const uint8_t *q = j->b + n * nb * bb;
    const float *s = j->s + n * nb;
    for (Py_ssize_t blk = 0; blk < nb; blk++, q += bb) {
        __m512 t[4][NB_DOT_MAX] = {{_mm512_setzero_ps()}}; /* set by the first step (g = 0) */
        for (Py_ssize_t g = 0; g < bb; g += 16) {
            const Py_ssize_t k = blk * bs + 2 * g;
            if (!(g & 63))
                for (int c = 0; c < NC; c++)
                    _mm_prefetch((const char *)(q + c * nb * bb + g + NB_PF), _MM_HINT_T0);
            for (int c = 0; c < NC; c++) {
                const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + c * nb * bb + g)));
                const __m512 we = _mm512_cvtepi32_ps(_mm512_and_si512(x, lo4));
                const __m512 wo = _mm512_cvtepi32_ps(_mm512_srli_epi32(x, 4));
                for (int m = 0; m < MR; m++) {
                    const __m512 ae = _mm512_loadu_ps(j->ap + m * Kp + k);
                    t[c][m] = g ? _mm512_fmadd_ps(we, ae, t[c][m]) : _mm512_mul_ps(we, ae);
                    t[c][m] = _mm512_fmadd_ps(wo, _mm512_loadu_ps(j->ap + m * Kp + k + 16), t[c][m]);
                }
            }
        }
        for (int c = 0; c < NC; c++) {
            const __m512 sc = _mm512_set1_ps(s[c * nb + blk]);
            for (int m = 0; m < MR; m++)
                acc[c][m] = _mm512_fmadd_ps(sc, t[c][m], acc[c][m]);
        }
    }
    for (int c = 0; c < NC; c++) {
        float zt[NB_DOT_MAX];
        nb_zterm(j, n + c, MR, zt);
        const float b = j->bias ? j->bias[n + c] : 0.0f;
        for (int m = 0; m < MR; m++)
            j->y[m * j->N + n + c] = (_mm512_reduce_add_ps(acc[c][m]) - zt[m]) + b;
    }
}

DWF_TARGET static inline __attribute__((always_inline)) void nb_dot512_body(const nb_job *j, Py_ssize_t n0,
                                                                            Py_ssize_t n1, const int MR)
{
    Py_ssize_t n = n0;
    for (; n + NB_DOT_NC <= n1; n += NB_DOT_NC)
        nb_dot512_cols(j, n, MR, NB_DOT_NC);
    for (; n < n1; n++)
        nb_dot512_cols(j, n, MR, 1);
}

DWF_TARGET static void nb_dot512(const nb_job *j, Py_ssize_t n0, Py_ssize_t n1)
{
    switch (j->M) {
    case 1: nb_dot512_body(j, n0, n1, 1); break;
    case 2: nb_dot512_body(j, n0, n1, 2); break;
    case 3: nb_dot512_body(j, n0, n1, 3); break;
    default: nb_dot512_body(j, n0, n1, 4); break;
    }
}
#endif

static void nb_dot_part(void *arg, int part, int parts)
{
    const nb_job *j = (const nb_job *)arg;
    const Py_ssize_t units = (j->N + NB_GCOLS - 1) / NB_GCOLS;
    const Py_ssize_t u0 = units * part / parts, u1 = units * (part + 1) / parts;
    const Py_ssize_t n1 = u1 * NB_GCOLS < j->N ? u1 * NB_GCOLS : j->N;
    if (u0 >= u1)
        return;
#if DWF_OK
    if (j->wide) {
        nb_dot512(j, u0 * NB_GCOLS, n1);
        return;
    }
#endif
    nb_dot_cols(j, u0 * NB_GCOLS, n1);
}

/* ---- the panel path ------------------------------------------------------------------- */

/* the 16 x 16 transpose in four steps: rows i and i + S swap their off-diagonal S-lane blocks */
#define NB_SWAP(S, LO, HI)                                                                       \
    for (int i = 0; i < 16; i++)                                                                 \
        if (!(i & S)) {                                                                          \
            const v16f x = r[i], y = r[i + S];                                                   \
            r[i] = __builtin_shuffle(x, y, (v16i)LO);                                            \
            r[i + S] = __builtin_shuffle(x, y, (v16i)HI);                                        \
        }

/* columns [n0, n0 + nn) (nn <= 32), terms [k0, k0 + kn) (k0 a multiple of the block size),
 * dequantized a column at a time into t [32][NB_KC] and transposed into w [kn][32] (zeros past
 * nn; rows up to kn rounded up to 16 written) */
RC_CLONES static void nb_panel(const nb_job *j, Py_ssize_t n0, Py_ssize_t nn, Py_ssize_t k0, Py_ssize_t kn,
                               float *restrict t, float *restrict w)
{
    const Py_ssize_t bs = j->bs, nb = j->nb, bb = bs / 2, k16 = (kn + 15) & ~(Py_ssize_t)15;
    const Py_ssize_t b0 = k0 / bs, b1 = (k0 + kn + bs - 1) / bs;
    for (Py_ssize_t c = 0; c < 32; c++) {
        float *d = t + c * NB_KC;
        if (c >= nn) {
            memset(d, 0, sizeof(float) * (size_t)k16);
            continue;
        }
        const Py_ssize_t n = n0 + c;
        const uint8_t *q = j->b + (n * nb + b0) * bb;
        for (Py_ssize_t blk = b0; blk < b1; blk++, q += bb) {
            const float s = j->s[n * nb + blk], z = nb_zero(j, n, blk);
            for (Py_ssize_t g = 0; g < bs / 16; g++)
                *(v16f_u *)(d + (blk - b0) * bs + 16 * g) = nb_deq16(q + 8 * g, z, s);
        }
    }
    for (Py_ssize_t kb = 0; kb < k16; kb += 16)
        for (int h = 0; h < 2; h++) {
            v16f r[16];
            for (int i = 0; i < 16; i++)
                r[i] = *(const v16f_u *)(t + (16 * h + i) * NB_KC + kb);
            NB_SWAP(8, ((v16i){0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}),
                    ((v16i){8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}))
            NB_SWAP(4, ((v16i){0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27}),
                    ((v16i){4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}))
            NB_SWAP(2, ((v16i){0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29}),
                    ((v16i){2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31}))
            NB_SWAP(1, ((v16i){0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}),
                    ((v16i){1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}))
            for (int i = 0; i < 16; i++)
                *(v16f_u *)(w + (kb + i) * 32 + 16 * h) = r[i];
        }
}

/* panel cb's terms [k0, k0 + kn) from the repacked codes into w [kn][32]: a term's 32 codes are 16
 * bytes (columns 0-15 in the low nibbles, 16-31 in the high), so a row of w is one widening load and
 * two (q - z) * s with the block's scales in the lanes: no transpose, no column buffer */
RC_CLONES static void nb_panel_packed(const nb_job *j, Py_ssize_t cb, Py_ssize_t nn, Py_ssize_t k0, Py_ssize_t kn,
                                       float *restrict w)
{
    const Py_ssize_t bs = j->bs;
    const uint8_t *q = j->pq + (cb * j->Kp + k0) * 16;
    float ps[32] __attribute__((aligned(64))), pz[32] __attribute__((aligned(64)));
    for (Py_ssize_t k = 0; k < kn;) {
        const Py_ssize_t blk = (k0 + k) / bs, end = (blk + 1) * bs - k0 < kn ? (blk + 1) * bs - k0 : kn;
        nb_block_sz(j, cb * 32, nn, blk, ps, pz);
        const v16f s0 = *(const v16f *)ps, s1 = *(const v16f *)(ps + 16);
        const v16f z0 = *(const v16f *)pz, z1 = *(const v16f *)(pz + 16);
        for (; k < end; k++) { /* a 32-bit word to 4 lanes, each shifted to its byte (a byte vector
                                  widened by convertvector was taken apart lane by lane) */
            uint32_t h[4];
            memcpy(h, q + 16 * k, 16);
            const nb_u32x16 x = __builtin_shuffle((nb_u32x16){h[0], h[1], h[2], h[3]},
                                                  (v16i){0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3});
            const nb_u32x16 sh = {0, 8, 16, 24, 0, 8, 16, 24, 0, 8, 16, 24, 0, 8, 16, 24};
            *(v16f_u *)(w + 32 * k) = (__builtin_convertvector((v16i)((x >> sh) & 15), v16f) - z0) * s0;
            *(v16f_u *)(w + 32 * k + 16) = (__builtin_convertvector((v16i)((x >> (sh + 4)) & 15), v16f) - z1) * s1;
        }
    }
}

#if DWF_OK
/* the same with one vpmovzxbd a term (the vector-extension clones go through the stack) */
DWF_TARGET static void nb_panel_packed512(const nb_job *j, Py_ssize_t cb, Py_ssize_t nn, Py_ssize_t k0, Py_ssize_t kn,
                                           float *restrict w)
{
    const Py_ssize_t bs = j->bs;
    const uint8_t *q = j->pq + (cb * j->Kp + k0) * 16;
    float ps[32] __attribute__((aligned(64))), pz[32] __attribute__((aligned(64)));
    const __m512i lo4 = _mm512_set1_epi32(15);
    for (Py_ssize_t k = 0; k < kn;) {
        const Py_ssize_t blk = (k0 + k) / bs, end = (blk + 1) * bs - k0 < kn ? (blk + 1) * bs - k0 : kn;
        nb_block_sz(j, cb * 32, nn, blk, ps, pz);
        const __m512 s0 = _mm512_load_ps(ps), s1 = _mm512_load_ps(ps + 16);
        const __m512 z0 = _mm512_load_ps(pz), z1 = _mm512_load_ps(pz + 16);
        for (; k < end; k++) {
            const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16 * k)));
            _mm512_storeu_ps(w + 32 * k, _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_and_si512(x, lo4)), z0), s0));
            _mm512_storeu_ps(w + 32 * k + 16, _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(x, 4)), z1), s1));
        }
    }
}
#endif

static void nb_tile_part(void *arg, int part, int parts)
{
    const nb_job *j = (const nb_job *)arg;
    const Py_ssize_t np_ = (j->M + LN_RP - 1) / LN_RP, nbk = (np_ + j->bp - 1) / j->bp;
    const Py_ssize_t cols = (j->N + 31) / 32, units = cols * nbk;
    float t[32 * NB_KC] __attribute__((aligned(64))); /* the stored codes' column buffer (unused with pq) */
    float w[NB_KC * 32] __attribute__((aligned(64)));
    float tail[LN_RP * 32] __attribute__((aligned(64)));
    float btail[32];
    for (Py_ssize_t u = units * part / parts; u < units * (part + 1) / parts; u++) {
        const Py_ssize_t cb = u / nbk, q0 = (u - cb * nbk) * j->bp;
        const Py_ssize_t q1 = q0 + j->bp < np_ ? q0 + j->bp : np_;
        const Py_ssize_t n0 = cb * 32, nn = j->N - n0 < 32 ? j->N - n0 : 32;
        const float *bias = ln_panel_bias(j->bias, n0, nn, btail);
        for (Py_ssize_t k0 = 0; k0 < j->K; k0 += NB_KC) {
            const Py_ssize_t kn = j->K - k0 < NB_KC ? j->K - k0 : NB_KC;
#if DWF_OK
            if (j->pq && rc_conv_fast && !nb_portable)
                nb_panel_packed512(j, cb, nn, k0, kn, w);
            else
#endif
            if (j->pq)
                nb_panel_packed(j, cb, nn, k0, kn, w);
            else
                nb_panel(j, n0, nn, k0, kn, t, w);
            for (Py_ssize_t q = q0; q < q1; q++) {
                const Py_ssize_t r0 = q * LN_RP, nr = j->M - r0 < LN_RP ? j->M - r0 : LN_RP;
                const float *ap = j->ap + (q * j->K + k0) * LN_RP;
                float *c = j->y + r0 * j->N + n0;
                if (nn == 32) {
                    ln_tiles[nr](ap, w, kn, 32, c, j->N, bias, k0 == 0, NULL, 0, 0, NULL);
                    continue;
                }
                /* the last panel of an N not a multiple of 32: through a whole-width tile */
                if (k0 > 0)
                    for (Py_ssize_t p = 0; p < nr; p++)
                        memcpy(tail + p * 32, c + p * j->N, sizeof(float) * nn);
                ln_tiles[nr](ap, w, kn, 32, tail, 32, bias, k0 == 0, NULL, 0, 0, NULL);
                for (Py_ssize_t p = 0; p < nr; p++)
                    memcpy(c + p * j->N, tail + p * 32, sizeof(float) * nn);
            }
        }
    }
}

/* nbits_matmul(a, b, scales, zero_points, zp_float, bias, y, (M, K, N, block_size), threads, panels=None),
 * panels: the codes as nbits_pack_panels writes them, for the panel path */
PyObject *rc_py_nbits_matmul(PyObject *self, PyObject *args)
{
    PyObject *ao, *bo, *so, *zo, *biaso, *yo, *pano = Py_None;
    Py_ssize_t M, K, N, bs;
    int zfloat, threads;
    if (!PyArg_ParseTuple(args, "OOOOpOO(nnnn)i|O:nbits_matmul", &ao, &bo, &so, &zo, &zfloat, &biaso, &yo, &M, &K,
                          &N, &bs, &threads, &pano))
        return NULL;
    PyObject *pqo = pano == Py_None ? NULL : pano;
    if (M < 1 || K < 1 || N < 1 || bs < 16 || bs > NB_KC || (bs & (bs - 1))) {
        PyErr_SetString(PyExc_ValueError,
                        "nbits_matmul: sizes must be positive and block_size a power of two in [16, 256]");
        return NULL;
    }
    /* quotients rounded up without adding first: sizes up to PY_SSIZE_T_MAX do not wrap */
    const Py_ssize_t nb = K / bs + (K % bs != 0), zb = nb / 2 + (nb & 1), np_ = M / LN_RP + (M % LN_RP != 0);
    rc_sz sz = {NULL};
    const Py_ssize_t an = sz_mul(&sz, "A's size", M, K), yn = sz_mul(&sz, "Y's size", M, N);
    const Py_ssize_t bn = sz_mul3(&sz, "B's size", N, nb, bs / 2), sn = sz_mul(&sz, "the scales' size", N, nb);
    const Py_ssize_t zn = zfloat ? sn : sz_mul(&sz, "the zero points' size", N, zb);
    if (sz_check(&sz, "nbits_matmul", PyExc_ValueError) < 0)
        return NULL;
    const int dot = M <= NB_DOT_MAX;
    const Py_ssize_t Kp = sz_mul(&sz, "the padded rows", nb, bs);
    /* the per-column path: a's padded rows, then their block sums */
    const Py_ssize_t apn = dot ? sz_mul3(&sz, "the padded rows", M, Kp + nb, RC_F32)
                               : sz_mul4(&sz, "the packed rows", np_, K, LN_RP, RC_F32);
    if (sz_check(&sz, "nbits_matmul", PyExc_MemoryError) < 0)
        return NULL;
    const Py_ssize_t P = N / 32 + (N % 32 != 0);
    const Py_ssize_t pqn = pqo ? sz_mul3(&sz, "the panels' codes", P, Kp, 16) : 0;
    if (sz_check(&sz, "nbits_matmul", PyExc_ValueError) < 0)
        return NULL;
    const int nv = pqo ? 7 : 6;
    Py_buffer v[7];
    const rc_buf spec[7] = {{ao, an, RC_F32, 0, 0, "A"}, {bo, bn, 1, 0, 0, "B"}, {so, sn, RC_F32, 0, 0, "scales"},
                            {zo, zn, zfloat ? RC_F32 : 1, 0, 1, "zero_points"}, {biaso, N, RC_F32, 0, 1, "bias"},
                            {yo, yn, RC_F32, 1, 0, "Y"}, {pqo, pqn, 1, 0, 0, "panels"}};
    if (get_buffers("nbits_matmul", spec, v, nv) < 0)
        return NULL;
    float *ap = (float *)rc_work((size_t)apn);
    const int oom = ap == NULL;
    nb_job j = {(const float *)v[0].buf, (const float *)v[2].buf, zfloat ? (const float *)v[3].buf : NULL,
                (const float *)v[4].buf, (const uint8_t *)v[1].buf, zfloat ? NULL : (const uint8_t *)v[3].buf,
                ap, (float *)v[5].buf, NULL, M, K, N, bs, nb, zb, Kp, np_, DWF_OK && rc_conv_fast && bs >= 32 && !nb_portable,
                pqo ? (const uint8_t *)v[6].buf : NULL};
    if (!oom) {
        Py_BEGIN_ALLOW_THREADS
        const double work = 2.0 * (double)M * (double)K * (double)N;
        if (dot) {
            for (Py_ssize_t m = 0; m < M; m++) {
                float *d = ap + m * j.Kp;
                const float *src = j.a + m * K;
                if (!j.wide) {
                    memcpy(d, src, sizeof(float) * (size_t)K);
                    memset(d + K, 0, sizeof(float) * (size_t)(j.Kp - K));
                } else { /* each 32 terms in the order nb_dot512 reads the codes: even, then odd */
                    float *as = ap + M * j.Kp + m * nb;
                    for (Py_ssize_t k = 0; k < j.Kp; k++) {
                        const Py_ssize_t sk = (k & ~(Py_ssize_t)31) + 2 * (k & 15) + ((k >> 4) & 1);
                        d[k] = sk < K ? src[sk] : 0.0f;
                    }
                    for (Py_ssize_t blk = 0; blk < nb; blk++) {
                        float t = 0.0f;
                        for (Py_ssize_t k = blk * bs; k < (blk + 1) * bs; k++)
                            t += d[k];
                        as[blk] = t;
                    }
                }
            }
            j.asum = ap + M * j.Kp;
            const int parts = rc_parts_fine(work, 2.5e5, (N + NB_GCOLS - 1) / NB_GCOLS, &threads);
            rc_parallel(nb_dot_part, &j, parts, threads);
        } else {
            int pth = threads;
            ln_pack_job pj = {j.a, j.ap, M, K};
            { /* rc_parts may lower pth: called before pth is read */
                int parts_ = rc_parts((double)M * (double)K * 8.0, 2.5e5, np_, &pth);
                rc_parallel(ln_pack_part, &pj, parts_, pth);
            }
            const Py_ssize_t cols = (N + 31) / 32;
            j.bp = ln_row_block(np_, cols, 4 * (Py_ssize_t)threads);
            const Py_ssize_t units = cols * ((np_ + j.bp - 1) / j.bp);
            const int parts = rc_parts_fine(work, 2.5e5, units, &threads);
            rc_parallel(nb_tile_part, &j, parts, threads);
        }
        Py_END_ALLOW_THREADS
        rc_work_done(ap, (size_t)apn);
    }
    release_buffers(v, nv);
    if (oom)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* nbits_pack_panels(b, out, (N, K, block_size)): the codes of b (as nbits_matmul takes them) in the
 * panel path's layout, out [ceil(N / 32)][n_blocks * block_size][16] bytes: byte i of term k of panel p
 * holds column 32p + i's code (low nibble) and 32p + 16 + i's (high), 0 past N */
PyObject *rc_py_nbits_pack_panels(PyObject *self, PyObject *args)
{
    PyObject *bo, *oo;
    Py_ssize_t N, K, bs;
    if (!PyArg_ParseTuple(args, "OO(nnn):nbits_pack_panels", &bo, &oo, &N, &K, &bs))
        return NULL;
    if (N < 1 || K < 1 || bs < 16 || bs > NB_KC || (bs & (bs - 1))) {
        PyErr_SetString(PyExc_ValueError,
                        "nbits_pack_panels: sizes must be positive and block_size a power of two in [16, 256]");
        return NULL;
    }
    const Py_ssize_t nb = K / bs + (K % bs != 0), P = N / 32 + (N % 32 != 0);
    rc_sz sz = {NULL};
    const Py_ssize_t Kp = sz_mul(&sz, "the padded terms", nb, bs), bn = sz_mul(&sz, "B's size", N, Kp / 2);
    const Py_ssize_t on = sz_mul3(&sz, "the panels' codes", P, Kp, 16);
    if (sz_check(&sz, "nbits_pack_panels", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[2];
    const rc_buf spec[2] = {{bo, bn, 1, 0, 0, "B"}, {oo, on, 1, 1, 0, "out"}};
    if (get_buffers("nbits_pack_panels", spec, v, 2) < 0)
        return NULL;
    const uint8_t *b = (const uint8_t *)v[0].buf;
    uint8_t *o = (uint8_t *)v[1].buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t p = 0; p < P; p++)
        for (int h = 0; h < 2; h++)
            for (Py_ssize_t i = 0; i < 16; i++) {
                const Py_ssize_t n = 32 * p + 16 * h + i;
                uint8_t *d = o + p * Kp * 16 + i;
                if (n >= N) {
                    if (!h)
                        for (Py_ssize_t k = 0; k < Kp; k++)
                            d[16 * k] = 0;
                    continue;
                }
                const uint8_t *q = b + n * (Kp / 2);
                for (Py_ssize_t k = 0; k < Kp; k++) {
                    const uint8_t c = (uint8_t)(k & 1 ? q[k / 2] >> 4 : q[k / 2] & 15);
                    d[16 * k] = h ? (uint8_t)(d[16 * k] | c << 4) : c;
                }
            }
    Py_END_ALLOW_THREADS
    release_buffers(v, 2);
    Py_RETURN_NONE;
}

/* nbits_path(force=-1) -> the per-column path's loop here ("avx512" or "portable"); force 1 takes
 * the portable clones (the repacked panels' fill too), 0 the CPU's own choice again (tests reach
 * both on one machine) */
PyObject *rc_py_nbits_path(PyObject *self, PyObject *args)
{
    int force = -1;
    if (!PyArg_ParseTuple(args, "|i:nbits_path", &force))
        return NULL;
    if (force >= 0)
        nb_portable = force != 0;
    return PyUnicode_FromString(DWF_OK && rc_conv_fast && !nb_portable ? "avx512" : "portable");
}
