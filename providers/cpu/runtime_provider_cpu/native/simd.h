/* The vector types and small vector helpers the kernels share, and the AVX-512 target the
 * hand-written intrinsic paths compile for (DWF_OK where the compiler can build them; whether
 * this machine runs them is decided once at load time: cpu_features.c). Included by native.h. */
#ifndef RC_SIMD_H
#define RC_SIMD_H

#include <stdint.h>

/* GCC / clang vector extensions: 8 floats, lowered to two SSE registers in the baseline
   clone and one AVX register in the x86-64-v3 and -v4 clones */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v8f_u __attribute__((vector_size(32), aligned(4)));  /* unaligned loads */

RC_INLINE v8f v8_load(const float *p) { return *(const v8f_u *)p; }
RC_INLINE void v8_store(float *p, v8f v) { *(v8f_u *)p = v; }
RC_INLINE v8f v8_set1(float x) { return (v8f){0} + x; }
/* a where m is set, else b (m from a vector comparison: all ones or all zeros) */
RC_INLINE v8f v8_select(v8i m, v8f a, v8f b) { return (v8f)((m & (v8i)a) | (~m & (v8i)b)); }

/* exp in float32 with no branches: Cody-Waite reduction by ln 2 and Cephes's degree-5
   polynomial on [-ln2/2, ln2/2], about 1 ulp. The argument is clamped to the normal
   range, so exp(x < -87.3) is ~1.2e-38 rather than 0 and exp(x > 88.3) is ~2.4e38 rather
   than inf; NaN stays NaN (both comparisons are false). tanh: (1 - e) / (1 + e) * sign(x)
   with e = exp(-2|x|) where that does not cancel (|x| >= 0.25), the odd Taylor polynomial to
   x^9 below (truncation < 1e-8 relative). Written once for any width: RC_VMATH(P, VF, VI,
   SET1, SEL) defines P##_exp, P##_sigmoid and P##_tanh on the vector types VF / VI. */
#define RC_VMATH(P, VF, VI, SET1, SEL)                                                         \
    RC_INLINE VF P##_exp(VF x)                                                                 \
    {                                                                                          \
        const VF lo = SET1(-87.3f), hi = SET1(88.3f), magic = SET1(12582912.0f);               \
        x = SEL(x < lo, lo, x);                                                                \
        x = SEL(x > hi, hi, x);                                                                \
        const VF n = (x * 1.44269504088896341f + magic) - magic; /* round to nearest */        \
        VF r = x - n * 0.693359375f;                                                           \
        r = r + n * 2.12194440e-4f;                                                            \
        VF p = SET1(1.9875691500e-4f);                                                         \
        p = p * r + 1.3981999507e-3f;                                                          \
        p = p * r + 8.3334519073e-3f;                                                          \
        p = p * r + 4.1665795894e-2f;                                                          \
        p = p * r + 1.6666665459e-1f;                                                          \
        p = p * r + 5.0000001201e-1f;                                                          \
        p = p * r * r + r + 1.0f;                                                              \
        const VI e = (__builtin_convertvector(n, VI) + 127) << 23;                             \
        return p * (VF)e;                                                                      \
    }                                                                                          \
    RC_INLINE VF P##_sigmoid(VF x) { return 1.0f / (1.0f + P##_exp(-x)); }                     \
    RC_INLINE VF P##_tanh(VF x)                                                                \
    {                                                                                          \
        const VI sign = (VI)x & (int32_t)0x80000000;                                           \
        const VF a = (VF)((VI)x & (int32_t)0x7fffffff);                                        \
        const VF e = P##_exp(-2.0f * a);                                                       \
        const VF big = (VF)((VI)((1.0f - e) / (1.0f + e)) | sign);                             \
        const VF x2 = x * x;                                                                   \
        const VF small = x * (1.0f + x2 * (-0.333333333333f + x2 * (0.133333333333f            \
                         + x2 * (-0.0539682539683f + x2 * 0.0218694885362f))));                \
        return SEL(a < 0.25f, small, big);                                                     \
    }

RC_VMATH(v8, v8f, v8i, v8_set1, v8_select)

/* 16 floats: one AVX-512 register in the x86-64-v4 clones (CV_CLONES), memory in the others */
typedef float v16f __attribute__((vector_size(64)));
typedef float v16f_u __attribute__((vector_size(64), aligned(4)));
typedef int32_t v16i __attribute__((vector_size(64)));

RC_INLINE v16f cv_bcast(float a)
{
    /* lane 0 to every lane: one vbroadcastss (a + (v16f){0} is an add, a lane list masked moves) */
    return __builtin_shuffle((v16f){a}, (v16i){0});
}

/* v clipped to [lo, hi] lane by lane, as clipf does (NaN stays NaN) */
RC_INLINE v16f v16_clip(v16f v, v16f lo, v16f hi)
{
    v16i m = v < lo;
    v = (v16f)((m & (v16i)lo) | (~m & (v16i)v));
    m = v > hi;
    return (v16f)((m & (v16i)hi) | (~m & (v16i)v));
}

/* a where m is set, else b (m from a vector comparison) */
RC_INLINE v16f v16_select(v16i m, v16f a, v16f b) { return (v16f)((m & (v16i)a) | (~m & (v16i)b)); }

RC_VMATH(v16, v16f, v16i, cv_bcast, v16_select)  /* v16_exp, v16_sigmoid, v16_tanh */

/* a FusedConv activation in a kernel's epilogue, after its clip: act 0 none, else activate's
   kind + 1 (1 HardSwish, 2 HardSigmoid (alpha, beta), 3 Sigmoid, 4 SiLU); NaN stays NaN */
typedef struct {
    int act;
    float alpha, beta;
} rc_act;

RC_INLINE v16f rc_act16(v16f x, const rc_act *a)
{
    if (a->act == 3)
        return v16_sigmoid(x);
    if (a->act == 4)
        return x * v16_sigmoid(x);
    v16f h = x * a->alpha + a->beta;
    h = v16_select(h < 0.0f, cv_bcast(0.0f), h);
    h = v16_select(h > 1.0f, cv_bcast(1.0f), h);
    return a->act == 1 ? x * h : h;
}

/* the same on 8 floats (activate's passes, the AVX2 Linear's epilogue) */
RC_INLINE v8f rc_act8(v8f x, const rc_act *a)
{
    if (a->act == 3)
        return v8_sigmoid(x);
    if (a->act == 4)
        return x * v8_sigmoid(x);
    v8f h = x * v8_set1(a->alpha) + v8_set1(a->beta);
    h = v8_select(h < v8_set1(0.0f), v8_set1(0.0f), h);
    h = v8_select(h > v8_set1(1.0f), v8_set1(1.0f), h);
    return a->act == 1 ? x * h : h;
}

/* v clipped to [lo, hi] lane by lane, as clipf does (NaN stays NaN): v16_clip on 8 floats */
RC_INLINE v8f v8_clip(v8f v, v8f lo, v8f hi)
{
    v = v8_select(v < lo, lo, v);
    return v8_select(v > hi, hi, v);
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#define DWF_OK 1
#define DWF_TARGET __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))

/* the lanes below n (all 16 from n = 16) */
DWF_TARGET static inline __mmask16 dwf_mask(Py_ssize_t n)
{
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
}

/* a 16 x 16 float transpose, r[i][k] -> r[k][i]: unpacks within 128-bit lanes, then lanes across
   four rows at a time (the depthwise lanes' layout changes, the Linear's row panels) */
DWF_TARGET static inline void rc_tr16_ps(__m512 *r)
{
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    /* r[4g + q], 128-bit lane L: rows 4g..4g+3 of column 4L + q */
    for (int q = 0; q < 4; q++) {
        const __m512 u0 = _mm512_shuffle_f32x4(r[q], r[4 + q], 0x88), u1 = _mm512_shuffle_f32x4(r[q], r[4 + q], 0xdd);
        const __m512 u2 = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], 0x88),
                     u3 = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], 0xdd);
        t[q] = _mm512_shuffle_f32x4(u0, u2, 0x88);
        t[8 + q] = _mm512_shuffle_f32x4(u0, u2, 0xdd);
        t[4 + q] = _mm512_shuffle_f32x4(u1, u3, 0x88);
        t[12 + q] = _mm512_shuffle_f32x4(u1, u3, 0xdd);
    }
    for (int i = 0; i < 16; i++)
        r[i] = t[i];
}
#else
#define DWF_OK 0
#endif

#if defined(__x86_64__) || defined(__SSE2__)
#include <emmintrin.h>
#define RC_SSE2 1
/* a 16 x 16 byte transpose (SSE2, every x86-64): out[i] = column i of the rows in[] (the int8
   kernels' layout changes between NCHW planes and pixel rows) */
RC_INLINE void rc_tr16_bytes(const __m128i *in, __m128i *out)
{
    static const int rev[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
    __m128i a[16], b[16];
    for (int i = 0; i < 16; i++)
        a[i] = in[i];
#define RC_TR_STAGE(lo, hi)                                                                    \
    for (int i = 0; i < 8; i++) {                                                              \
        b[i] = lo(a[2 * i], a[2 * i + 1]);                                                     \
        b[i + 8] = hi(a[2 * i], a[2 * i + 1]);                                                 \
    }                                                                                          \
    for (int i = 0; i < 16; i++)                                                               \
        a[i] = b[i];
    RC_TR_STAGE(_mm_unpacklo_epi8, _mm_unpackhi_epi8)
    RC_TR_STAGE(_mm_unpacklo_epi16, _mm_unpackhi_epi16)
    RC_TR_STAGE(_mm_unpacklo_epi32, _mm_unpackhi_epi32)
    RC_TR_STAGE(_mm_unpacklo_epi64, _mm_unpackhi_epi64)
#undef RC_TR_STAGE
    for (int i = 0; i < 16; i++)
        out[rev[i]] = a[i]; /* the network leaves column i at bit-reversed position */
}
#else
#define RC_SSE2 0
#endif

#endif
