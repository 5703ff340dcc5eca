/* The Linear's register tiles for CPUs without AVX-512: an AVX2 + FMA build (x86-64-v3, 16 ymm
 * registers) and a baseline x86-64 one, both doing the 12 x 32 tile linear.c's driver asks for
 * (ln_tile_f, on the same layouts: a's 12-row panels [K][12], w's 32-column panels [K][32]) as
 * four 6 x 16 sub-tiles of 12 accumulators of 8 floats, two weight vectors and one broadcast (the
 * AVX-512 tile's 24 accumulators of 16 floats would need 48 ymm registers). Each sub-tile's 16
 * weight columns are one 64-byte line of a packed row, so the packed layout is the one the AVX-512
 * tiles read and pack_linear writes whatever runs. Which table linear runs is chosen once at load
 * (rc_ln_tiles, cpu_features.c). */
#include "native.h"

#define LA_MR 6 /* rows a sub-tile */

/* the AVX2 + FMA target (a real ymm FMA per multiply-add; GCC contracts acc += x * w) */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define LA_V3 __attribute__((target("avx2,fma")))
#define LA_V3_OK 1
#else
#define LA_V3
#define LA_V3_OK 0
#endif

RC_INLINE v8f la_bcast(float a) { return __builtin_shuffle((v8f){a}, (v8i){0}); }

/* one term k of a sub-tile: two weight vectors, NR broadcasts, 2 NR multiply-adds */
#define LA_STEP(NR, k)                                                                             \
    do {                                                                                           \
        const v8f w0_ = v8_load(wp + ldw * (k)), w1_ = v8_load(wp + ldw * (k) + 8);                \
        for (int p_ = 0; p_ < NR; p_++) {                                                          \
            const v8f x_ = la_bcast(ap[LN_RP * (k) + p_]);                                         \
            acc[p_][0] += x_ * w0_;                                                                \
            acc[p_][1] += x_ * w1_;                                                                \
        }                                                                                          \
    } while (0)

/* c[p][0 .. 16) = sum over k of ap[k * 12 + p] * wp[k * ldw + ...] for p < NR, plus (init ? bias
 * (or 0) : what c holds), then e's epilogue (rows r0 + p of e's row bias and residual, columns
 * c0 + ... of its residual); npf rows of 128 bytes from pf (pfs apart) asked into L2, one a step */
#define LA_SUB(NR, SFX, ATTR)                                                                      \
    ATTR static void la_sub##NR##SFX(const float *restrict ap, const float *restrict wp,           \
                                     Py_ssize_t kn, Py_ssize_t ldw, float *restrict c,             \
                                     Py_ssize_t ldc, const float *restrict bias, int init,         \
                                     const char *pf, Py_ssize_t pfs, Py_ssize_t npf,               \
                                     const ln_epi *e, Py_ssize_t r0, Py_ssize_t c0)                \
    {                                                                                              \
        v8f acc[NR][2];                                                                            \
        for (int p = 0; p < NR; p++)                                                               \
            acc[p][0] = acc[p][1] = (v8f){0};                                                      \
        const Py_ssize_t kp = npf < 0 ? 0 : npf < kn ? npf : kn;                                   \
        Py_ssize_t k = 0;                                                                          \
        for (; k < kp; k++) {                                                                      \
            __builtin_prefetch(pf, 0, 2);                                                          \
            __builtin_prefetch(pf + 64, 0, 2);                                                     \
            pf += pfs;                                                                             \
            LA_STEP(NR, k);                                                                        \
        }                                                                                          \
        /* by 2: by 4, GCC kept loads a step ahead and spilled 3 accumulators a pass (5-8% slower) */ \
        _Pragma("GCC unroll 2") for (; k < kn; k++) LA_STEP(NR, k);                                \
        for (int p = 0; p < NR; p++)                                                               \
            for (int v = 0; v < 2; v++) {                                                          \
                v8f t = acc[p][v];                                                                 \
                if (!init)                                                                         \
                    t += v8_load(c + p * ldc + 8 * v);                                             \
                else if (bias)                                                                     \
                    t += v8_load(bias + 8 * v);                                                    \
                if (e) {                                                                           \
                    if (e->rb)                                                                     \
                        t += la_bcast(e->rb[r0 + p]);                                              \
                    if (e->z)                                                                      \
                        t += v8_load(e->z + (r0 + p) * e->ldz + c0 + 8 * v);                       \
                    t = v8_clip(t, la_bcast(e->lo), la_bcast(e->hi));                              \
                    if (e->act)                                                                    \
                        t = rc_act8(t, e->act);                                                         \
                }                                                                                  \
                v8_store(c + p * ldc + 8 * v, t);                                                  \
            }                                                                                      \
    }

typedef void (*la_sub_f)(const float *restrict, const float *restrict, Py_ssize_t, Py_ssize_t, float *restrict,
                         Py_ssize_t, const float *restrict, int, const char *, Py_ssize_t, Py_ssize_t,
                         const ln_epi *, Py_ssize_t, Py_ssize_t);

/* the 12 x 32 tile of NP rows: up to 6 rows in one sub-tile, more in two as even as they go
 * (8 rows as 4 + 4: 6 + 2 left the 2-row one 4 accumulator chains, too few to cover the FMA
 * latency), for each 16-column half; the half's weights (kn lines of 64 bytes) read by both
 * sub-tiles while in L1 */
#define LA_TILE(NP, SFX)                                                                           \
    static void la_tile##NP##SFX(const float *restrict ap, const float *restrict wp, Py_ssize_t kn, \
                                 Py_ssize_t ldw, float *restrict c, Py_ssize_t ldc,                \
                                 const float *restrict bias, int init, const char *pf,             \
                                 Py_ssize_t pfs, Py_ssize_t npf, const ln_epi *e)                  \
    {                                                                                              \
        const int n0 = NP <= LA_MR ? NP : (NP + 1) / 2, n1 = NP - n0;                             \
        for (int h = 0; h < 2; h++) {                                                              \
            const float *b = bias ? bias + 16 * h : NULL;                                          \
            la_subs##SFX[n0](ap, wp + 16 * h, kn, ldw, c + 16 * h, ldc, b, init, pf, pfs,          \
                             h == 0 ? npf : 0, e, 0, 16 * h);                                      \
            if (n1 > 0)                                                                            \
                la_subs##SFX[n1](ap + n0, wp + 16 * h, kn, ldw, c + n0 * ldc + 16 * h, ldc, b,     \
                                 init, NULL, 0, 0, e, n0, 16 * h);                                 \
        }                                                                                          \
    }

#define LA_TABLES(SFX, ATTR)                                                                       \
    LA_SUB(1, SFX, ATTR)                                                                           \
    LA_SUB(2, SFX, ATTR)                                                                           \
    LA_SUB(3, SFX, ATTR)                                                                           \
    LA_SUB(4, SFX, ATTR)                                                                           \
    LA_SUB(5, SFX, ATTR)                                                                           \
    LA_SUB(6, SFX, ATTR)                                                                           \
    static const la_sub_f la_subs##SFX[LA_MR + 1] = {NULL,         la_sub1##SFX, la_sub2##SFX,     \
                                                     la_sub3##SFX, la_sub4##SFX, la_sub5##SFX,     \
                                                     la_sub6##SFX};                                \
    LA_TILE(1, SFX)                                                                                \
    LA_TILE(2, SFX)                                                                                \
    LA_TILE(3, SFX)                                                                                \
    LA_TILE(4, SFX)                                                                                \
    LA_TILE(5, SFX)                                                                                \
    LA_TILE(6, SFX)                                                                                \
    LA_TILE(7, SFX)                                                                                \
    LA_TILE(8, SFX)                                                                                \
    LA_TILE(9, SFX)                                                                                \
    LA_TILE(10, SFX)                                                                               \
    LA_TILE(11, SFX)                                                                               \
    LA_TILE(12, SFX)                                                                               \
    const ln_tile_f ln_tiles##SFX[LN_RP + 1] = {                                                   \
        NULL,          la_tile1##SFX, la_tile2##SFX, la_tile3##SFX,  la_tile4##SFX,                \
        la_tile5##SFX, la_tile6##SFX, la_tile7##SFX, la_tile8##SFX,  la_tile9##SFX,                \
        la_tile10##SFX, la_tile11##SFX, la_tile12##SFX};

LA_TABLES(_avx2, LA_V3)   /* ln_tiles_avx2 */
LA_TABLES(_base, )        /* ln_tiles_base: the baseline x86-64 build (SSE2), a cap's or another CPU's */

#if LA_V3_OK
#include <immintrin.h>

/* an 8 x 8 float transpose in registers */
LA_V3 static inline void la_tr8(__m256 *r)
{
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    /* u[q] (rows 0-3) and u[4 + q] (rows 4-7), 128-bit lane L: column 4L + q */
    for (int q = 0; q < 4; q++) {
        r[q] = _mm256_permute2f128_ps(u[q], u[4 + q], 0x20);
        r[4 + q] = _mm256_permute2f128_ps(u[q], u[4 + q], 0x31);
    }
}

/* a whole 12-row panel's first K - K % 8 terms, 8 at a time: rows 0-7 and rows 8-11 (and 4 of
   zeros) transposed in registers, each term's 12 floats an 8-float and a 4-float store; returns
   the terms done (the scalar loop in ln_pack_part does the rest) */
LA_V3 Py_ssize_t ln_pack12_avx2(float *restrict dst, const float *restrict src, Py_ssize_t K)
{
    Py_ssize_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 r[8], s[8];
        for (int p = 0; p < 8; p++)
            r[p] = _mm256_loadu_ps(src + p * K + k);
        for (int p = 0; p < 4; p++)
            s[p] = _mm256_loadu_ps(src + (8 + p) * K + k);
        for (int p = 4; p < 8; p++)
            s[p] = _mm256_setzero_ps();
        la_tr8(r);
        la_tr8(s);
        for (int i = 0; i < 8; i++) {
            _mm256_storeu_ps(dst + (k + i) * LN_RP, r[i]);
            _mm_storeu_ps(dst + (k + i) * LN_RP + 8, _mm256_castps256_ps128(s[i]));
        }
    }
    return k;
}
#else
Py_ssize_t ln_pack12_avx2(float *restrict dst, const float *restrict src, Py_ssize_t K)
{
    (void)dst, (void)src, (void)K;
    return 0;
}
#endif
