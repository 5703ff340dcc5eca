/* Dynamic-int8 matmul with the dequantization in the GEMM (com.microsoft DynamicQuantizeMatMul and
 * MatMulIntegerToFloat, the groups dynq_fusions.py makes of DynamicQuantizeLinear -> MatMulInteger
 * -> Cast -> Mul(scales) [-> Add(bias)]).
 *
 * A float32 A is quantized as DynamicQuantizeLinear does (uint8, the range with 0 in it, one
 * scale and zero point for the tensor) straight into the packed rows the GEMM reads: its range in
 * one threaded pass, its bytes and row sums in a second (AVX-512 loops where the CPU has them);
 * no uint8 copy of A. B is packed by int8.c's qgemm_pack; the tiles are a VNNI tile with the
 * epilogue on its accumulators where AVX-512 VNNI runs, else int8.c's (rc_qg_tile: AVX2 or
 * portable) and dq_epilogue. The epilogue writes y = float(acc) * (a_scale * b_scale[n]) + bias[n],
 * the float32 steps of the unfused Cast, Mul and Add in their order (no FMA contraction: bit for
 * bit the same), so no int32 Y and no float passes follow. */
#include "native.h"

/* the unfused graph rounds the product and the sum apart: keep them apart here */
#pragma GCC optimize("fp-contract=off")

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#define DQ_X86 1
#else
#define DQ_X86 0
#endif

#define DQ_MR RC_QG_MR
#define DQ_NR RC_QG_NR
#define DQ_RB 32     /* row blocks a unit of work, as qgemm's */
#define DQ_CHUNK 256 /* bytes of a row quantized at a time before they are packed */
#define DQ_AMX_ROWS 16 /* tile -1: the AMX tiles from this many rows (the Python plan measures it) */

typedef struct {
    const float *x;         /* float A (kind 0) */
    const uint8_t *a8;      /* byte A (kinds 1, 2) */
    int32_t *ap, *rs;       /* packed rows [Mb][Kq][8] and their sums [Mb * 8] */
    float *lo, *hi;         /* the range pass: a part's minimum and maximum */
    Py_ssize_t M, K, Kq, Mb;
    float scale, zpf;
    uint8_t flip; /* 0x80 for an int8 A: its bytes as unsigned */
    Py_ssize_t lda; /* AMX (int8_amx.c): A's rows as bytes, lda apart, rows padded to 16 (0: the VNNI layout) */
} dq_pack_job;

#if DQ_X86
/* whether the AVX-512 quantizing loops run here (set by the first call, or by dqmm_path) */
static int dq_avx512 = -1;
/* and whether the VNNI tile with the epilogue on its registers does (AVX-512 VNNI as well) */
static int dq_vnni;

static void dq_init(int force)
{
    __builtin_cpu_init();
    dq_avx512 = force != 0 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
                && __builtin_cpu_supports("avx512vl");
    dq_vnni = force != 1 && dq_avx512 && __builtin_cpu_supports("avx512vnni");
}

/* acc += u8 a x s8 w in 4-byte groups, the accumulator tied to its register: GCC's own
 * vpdpbusd pattern copies each accumulator to another register and back every step */
#define DQ_DPBUSD(acc, a, w) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(w))
/* one packed row's step: its 4 bytes broadcast against both panels' 4-byte groups */
#define DQ_ROW_STEP(r)                                                                                           \
    do {                                                                                                         \
        const __m512i a_ = _mm512_set1_epi32(ap[q * DQ_MR + (r)]);                                             \
        DQ_DPBUSD(c##r##0, a_, w0);                                                                              \
        DQ_DPBUSD(c##r##1, a_, w1);                                                                              \
    } while (0)
/* row r of the tile through the epilogue into y, unless past the rows there are (mm) */
#define DQ_ROW_OUT(r)                                                                                            \
    do {                                                                                                         \
        if ((r) < mm) {                                                                                          \
            const __m512i rv = _mm512_set1_epi32(rs[r]);                                                         \
            const __m512i v0 = _mm512_add_epi32(_mm512_sub_epi32(c##r##0, _mm512_mullo_epi32(zb0, rv)), ct0);   \
            const __m512i v1 = _mm512_add_epi32(_mm512_sub_epi32(c##r##1, _mm512_mullo_epi32(zb1, rv)), ct1);   \
            _mm512_mask_storeu_ps(y + (r) * ldy, k0, _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(v0), s0), bb0)); \
            _mm512_mask_storeu_ps(y + (r) * ldy + 16, k1,                                                        \
                                  _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(v1), s1), bb1));                \
        }                                                                                                        \
    } while (0)

/* the VNNI tile (int8.c's loop) with dq_epilogue's steps done on its accumulators: rows
 * [0, mm) and columns [0, nn) of y (ldy floats a row); the 16 accumulators are named, so that
 * they stay in registers through the loop */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void
dq_tile_vnni(const int32_t *restrict ap, const int8_t *restrict b0, const int8_t *restrict b1, Py_ssize_t Kq,
             const int32_t *restrict rs, const uint32_t *restrict zbv, const uint32_t *restrict ct,
             const float *restrict sc, const float *restrict bs, float *restrict y, Py_ssize_t ldy, Py_ssize_t mm,
             Py_ssize_t nn)
{
    _Static_assert(DQ_MR == 8 && DQ_NR == 32, "dq_tile_vnni is written for 8 x 32 tiles");
    __m512i c00 = _mm512_setzero_si512(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00;
    __m512i c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
    for (Py_ssize_t q = 0; q < Kq; q++) {
        const __m512i w0 = _mm512_loadu_si512((const void *)(b0 + q * 64));
        const __m512i w1 = _mm512_loadu_si512((const void *)(b1 + q * 64));
        DQ_ROW_STEP(0);
        DQ_ROW_STEP(1);
        DQ_ROW_STEP(2);
        DQ_ROW_STEP(3);
        DQ_ROW_STEP(4);
        DQ_ROW_STEP(5);
        DQ_ROW_STEP(6);
        DQ_ROW_STEP(7);
    }
    const __mmask16 k0 = nn >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nn) - 1u);
    const __mmask16 k1 = nn >= 32 ? (__mmask16)0xffff : nn <= 16 ? 0 : (__mmask16)((1u << (nn - 16)) - 1u);
    const __m512i zb0 = _mm512_loadu_si512((const void *)zbv), zb1 = _mm512_loadu_si512((const void *)(zbv + 16));
    const __m512i ct0 = _mm512_loadu_si512((const void *)ct), ct1 = _mm512_loadu_si512((const void *)(ct + 16));
    const __m512 s0 = _mm512_loadu_ps(sc), s1 = _mm512_loadu_ps(sc + 16);
    const __m512 bb0 = _mm512_loadu_ps(bs), bb1 = _mm512_loadu_ps(bs + 16);
    DQ_ROW_OUT(0);
    DQ_ROW_OUT(1);
    DQ_ROW_OUT(2);
    DQ_ROW_OUT(3);
    DQ_ROW_OUT(4);
    DQ_ROW_OUT(5);
    DQ_ROW_OUT(6);
    DQ_ROW_OUT(7);
}

/* dq_epilogue's steps on rows [0, mm) of an AMX block c[32][32] (int32, in memory) into y */
__attribute__((target("avx512f"))) static void dq_epilogue_avx512(const int32_t *restrict c, const int32_t *restrict rs,
                                                                  const uint32_t *restrict zbv,
                                                                  const uint32_t *restrict ct, const float *restrict sc,
                                                                  const float *restrict bs, float *restrict y,
                                                                  Py_ssize_t ldy, Py_ssize_t mm, Py_ssize_t nn)
{
    const __mmask16 k0 = nn >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nn) - 1u);
    const __mmask16 k1 = nn >= 32 ? (__mmask16)0xffff : nn <= 16 ? 0 : (__mmask16)((1u << (nn - 16)) - 1u);
    const __m512i zb0 = _mm512_loadu_si512((const void *)zbv), zb1 = _mm512_loadu_si512((const void *)(zbv + 16));
    const __m512i ct0 = _mm512_loadu_si512((const void *)ct), ct1 = _mm512_loadu_si512((const void *)(ct + 16));
    const __m512 s0 = _mm512_loadu_ps(sc), s1 = _mm512_loadu_ps(sc + 16);
    const __m512 bb0 = _mm512_loadu_ps(bs), bb1 = _mm512_loadu_ps(bs + 16);
    for (Py_ssize_t r = 0; r < mm; r++) {
        const __m512i rv = _mm512_set1_epi32(rs[r]);
        const __m512i c0 = _mm512_load_si512((const void *)(c + r * 32));
        const __m512i c1 = _mm512_load_si512((const void *)(c + r * 32 + 16));
        const __m512i v0 = _mm512_add_epi32(_mm512_sub_epi32(c0, _mm512_mullo_epi32(zb0, rv)), ct0);
        const __m512i v1 = _mm512_add_epi32(_mm512_sub_epi32(c1, _mm512_mullo_epi32(zb1, rv)), ct1);
        _mm512_mask_storeu_ps(y + r * ldy, k0, _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(v0), s0), bb0));
        _mm512_mask_storeu_ps(y + r * ldy + 16, k1, _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(v1), s1), bb1));
    }
}

/* NaNs are left out of the range, as onnxruntime does: vminps / vmaxps return their second
 * operand when either is NaN, so the running range goes second */
__attribute__((target("avx512f"))) static void dq_range_avx512(const float *x, Py_ssize_t n, float *lo, float *hi)
{
    __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
    for (Py_ssize_t i = 0; i < n; i += 16) {
        const __mmask16 m = i + 16 <= n ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        const __m512 t = _mm512_maskz_loadu_ps(m, x + i); /* lanes past n: 0, in the range anyway */
        a = _mm512_min_ps(t, a);
        b = _mm512_max_ps(t, b);
    }
    *lo = _mm512_reduce_min_ps(a);
    *hi = _mm512_reduce_max_ps(b);
}

/* dq_bytes's steps 16 lanes at a time (vdivps, round to nearest even, NaN -> 0, clamp) */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static uint32_t dq_bytes_avx512(const float *x, uint8_t *y, Py_ssize_t n,
                                                                            float scale, float zpf)
{
    const __m512 s = _mm512_set1_ps(scale), z = _mm512_set1_ps(zpf), lo = _mm512_setzero_ps();
    const __m512 hi = _mm512_set1_ps(255.0f);
    __m512i acc = _mm512_setzero_si512();
    for (Py_ssize_t i = 0; i < n; i += 16) {
        const __mmask16 m = i + 16 <= n ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        __m512 t = _mm512_div_ps(_mm512_maskz_loadu_ps(m, x + i), s);
        t = _mm512_add_ps(_mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), z);
        t = _mm512_mask_mov_ps(t, _mm512_cmp_ps_mask(t, t, _CMP_UNORD_Q), lo);
        t = _mm512_min_ps(_mm512_max_ps(t, lo), hi);
        const __m512i q = _mm512_maskz_cvtps_epi32(m, t);
        acc = _mm512_add_epi32(acc, q);
        _mm_mask_storeu_epi8(y + i, m, _mm512_cvtepi32_epi8(q));
    }
    return (uint32_t)_mm512_reduce_add_epi32(acc);
}

/* 8 rows' 16 bytes (4 groups each) as the packed layout's 128 bytes dst[0..3][8]: group q of row r
 * sits at dword 4r + q of rows 0-3, 16 + 4(r - 4) + q of rows 4-7 */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline void dq_store8(uint32_t *dst, const __m128i *b)
{
    const __m512i p0 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
    const __m512i p1 = _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
    __m512i l = _mm512_castsi128_si512(b[0]), h = _mm512_castsi128_si512(b[4]);
    l = _mm512_inserti32x4(_mm512_inserti32x4(_mm512_inserti32x4(l, b[1], 1), b[2], 2), b[3], 3);
    h = _mm512_inserti32x4(_mm512_inserti32x4(_mm512_inserti32x4(h, b[5], 1), b[6], 2), b[7], 3);
    _mm512_storeu_si512((void *)dst, _mm512_permutex2var_epi32(l, p0, h));
    _mm512_storeu_si512((void *)(dst + 16), _mm512_permutex2var_epi32(l, p1, h));
}

/* dq_pack8_avx512 for a byte A (MatMulIntegerToFloat): the bytes as unsigned (flip 0x80 for int8) */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
dq_pack8_bytes_avx512(const uint8_t *a, Py_ssize_t K, Py_ssize_t kn, uint32_t *dst, uint32_t *sums, uint8_t flip)
{
    const __m128i f = _mm_set1_epi8((char)flip), zero = _mm_setzero_si128();
    __m128i acc[8];
    for (int r = 0; r < 8; r++)
        acc[r] = zero;
    for (Py_ssize_t k0 = 0; k0 < kn; k0 += 16) {
        __m128i b[8];
        for (int r = 0; r < 8; r++) {
            b[r] = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(a + r * K + k0)), f);
            acc[r] = _mm_add_epi64(acc[r], _mm_sad_epu8(b[r], zero)); /* two 64-bit byte sums */
        }
        dq_store8(dst + (k0 / 4) * 8, b);
    }
    for (int r = 0; r < 8; r++)
        sums[r] = (uint32_t)(_mm_cvtsi128_si64(acc[r]) + _mm_extract_epi64(acc[r], 1));
}

/* 8 rows of x (K floats apart), columns [0, kn) (kn a multiple of 16), quantized as dq_bytes does
 * straight into the packed layout dst[k / 4][8] (dq_store8); the rows' byte sums go to sums[8] */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
dq_pack8_avx512(const float *x, Py_ssize_t K, Py_ssize_t kn, uint32_t *dst, uint32_t *sums, float scale, float zpf)
{
    const __m512 s = _mm512_set1_ps(scale), z = _mm512_set1_ps(zpf), lo = _mm512_setzero_ps();
    const __m512 hi = _mm512_set1_ps(255.0f);
    __m512i acc[8];
    for (int r = 0; r < 8; r++)
        acc[r] = _mm512_setzero_si512();
    for (Py_ssize_t k0 = 0; k0 < kn; k0 += 16) {
        __m128i b[8];
        for (int r = 0; r < 8; r++) {
            __m512 t = _mm512_div_ps(_mm512_loadu_ps(x + r * K + k0), s);
            t = _mm512_add_ps(_mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), z);
            t = _mm512_mask_mov_ps(t, _mm512_cmp_ps_mask(t, t, _CMP_UNORD_Q), lo);
            t = _mm512_min_ps(_mm512_max_ps(t, lo), hi);
            const __m512i q = _mm512_cvtps_epi32(t);
            acc[r] = _mm512_add_epi32(acc[r], q);
            b[r] = _mm512_cvtepi32_epi8(q);
        }
        dq_store8(dst + (k0 / 4) * 8, b);
    }
    for (int r = 0; r < 8; r++)
        sums[r] = (uint32_t)_mm512_reduce_add_epi32(acc[r]);
}
#endif

/* a part's share of x's items: their range with 0 in it, NaNs left out (a comparison with NaN is false) */
static void dq_range_part(void *arg, int part, int parts)
{
    dq_pack_job *j = (dq_pack_job *)arg;
    const Py_ssize_t n = j->M * j->K, i0 = n * part / parts, i1 = n * (part + 1) / parts;
    const float *restrict x = j->x;
#if DQ_X86
    if (dq_avx512) {
        dq_range_avx512(x + i0, i1 - i0, &j->lo[part], &j->hi[part]);
        return;
    }
#endif
    rc_dq_range(x + i0, i1 - i0, &j->lo[part], &j->hi[part]);
}

/* n floats as DynamicQuantizeLinear's bytes: saturate(rint(x / scale) + zp), NaN -> 0 (as onnxruntime); their sum */
RC_CLONES static uint32_t dq_bytes(const float *restrict x, uint8_t *restrict y, Py_ssize_t n, float scale,
                                   float zpf)
{
#if DQ_X86
    if (dq_avx512)
        return dq_bytes_avx512(x, y, n, scale, zpf);
#endif
    rc_dq_apply(x, y, n, scale, zpf);
    uint32_t s = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        s += y[i];
    return s;
}

/* a part's row blocks of A as unsigned bytes in groups of 4, [Kq][8] a block, zeros past K and M */
RC_CLONES static void dq_pack_part(void *arg, int part, int parts)
{
    const dq_pack_job *j = (const dq_pack_job *)arg;
    const Py_ssize_t b0 = j->Mb * part / parts, b1 = j->Mb * (part + 1) / parts;
    uint8_t t[DQ_CHUNK] __attribute__((aligned(64)));
    for (Py_ssize_t mb = b0; mb < b1; mb++) {
        uint32_t *restrict dst = (uint32_t *)j->ap + mb * j->Kq * DQ_MR;
        /* a whole block of rows: its columns up to the last 16 in one AVX-512 pass, the rest below */
        uint32_t s8[DQ_MR] = {0};
        Py_ssize_t kstart = 0;
#if DQ_X86
        if (dq_avx512 && (mb + 1) * DQ_MR <= j->M && j->K >= 16) {
            _Static_assert(DQ_MR == 8, "dq_pack8_avx512 packs 8 rows");
            kstart = j->K / 16 * 16;
            if (j->x)
                dq_pack8_avx512(j->x + mb * DQ_MR * j->K, j->K, kstart, dst, s8, j->scale, j->zpf);
            else
                dq_pack8_bytes_avx512(j->a8 + mb * DQ_MR * j->K, j->K, kstart, dst, s8, j->flip);
        }
#endif
        for (int r = 0; r < DQ_MR; r++) {
            const Py_ssize_t m = mb * DQ_MR + r;
            if (m >= j->M) {
                for (Py_ssize_t q = 0; q < j->Kq; q++)
                    dst[q * DQ_MR + r] = 0;
                j->rs[m] = 0;
                continue;
            }
            uint32_t s = s8[r];
            for (Py_ssize_t k0 = kstart; k0 < j->K; k0 += DQ_CHUNK) {
                const Py_ssize_t kn = j->K - k0 < DQ_CHUNK ? j->K - k0 : DQ_CHUNK;
                if (j->x)
                    s += dq_bytes(j->x + m * j->K + k0, t, kn, j->scale, j->zpf);
                else
                    for (Py_ssize_t k = 0; k < kn; k++) {
                        t[k] = j->a8[m * j->K + k0 + k] ^ j->flip;
                        s += t[k];
                    }
                for (Py_ssize_t k = kn; k % 4; k++)
                    t[k] = 0; /* the last group's bytes past K */
                for (Py_ssize_t q = 0; q < (kn + 3) / 4; q++) {
                    uint32_t w;
                    memcpy(&w, t + 4 * q, 4);
                    dst[(k0 / 4 + q) * DQ_MR + r] = w;
                }
            }
            j->rs[m] = (int32_t)s;
        }
    }
}

/* a part's 16-row blocks of A for the AMX tiles: bytes as dq_pack_part's, row-major, the groups
 * where rc_amx_a_offset puts them, zeros elsewhere (past K, the rows past M); byte A as qgemm's
 * rows (rc_amx_pack_rows), float A quantized on the way */
RC_CLONES static void dq_pack_amx_part(void *arg, int part, int parts)
{
    const dq_pack_job *j = (const dq_pack_job *)arg;
    const Py_ssize_t Mp = j->Mb * 16, r0 = Mp * part / parts / 16 * 16, r1 = Mp * (part + 1) / parts / 16 * 16;
    if (!j->x) {
        rc_amx_pack_rows(j->a8, j->M, j->K, j->Kq, j->lda, j->flip, r0, r1, (uint8_t *)j->ap, j->rs);
        return;
    }
    const Py_ssize_t full = j->Kq / 16 * 16 * 4 < j->K ? j->Kq / 16 * 16 * 4 : j->K;
    const Py_ssize_t tail_at = rc_amx_a_offset(j->Kq, j->Kq / 16 * 16);
    for (Py_ssize_t m = r0; m < r1; m++) {
        uint8_t *restrict dst = (uint8_t *)j->ap + m * j->lda;
        memset(dst, 0, (size_t)j->lda);
        if (m >= j->M) {
            j->rs[m] = 0;
            continue;
        }
        uint32_t s = dq_bytes(j->x + m * j->K, dst, full, j->scale, j->zpf);
        if (full < j->K)
            s += dq_bytes(j->x + m * j->K + full, dst + tail_at, j->K - full, j->scale, j->zpf);
        j->rs[m] = (int32_t)s;
    }
}

typedef struct {
    const int32_t *ap, *rs; /* packed A and its row sums */
    const int8_t *bp;       /* B as qgemm_pack packs it */
    const int32_t *cs;      /* B's column sums (after the panels) */
    const int32_t *zb;      /* B's zero point per column [N] (NULL: 0) */
    const float *bscale;    /* B's scale per column [N] */
    const float *bias;      /* [N] or NULL */
    float *y;               /* M x N */
    Py_ssize_t M, K, N, Kq, Mb, ncols, nunits;
    int32_t ZA, ob; /* A's zero point plus its offset (128 for int8), B's offset (128 for uint8) */
    float ascale;
    Py_ssize_t lda; /* the AMX tiles: A's row stride in bytes (0: the VNNI tiles) */
} dq_job;

/* rows [m0, m0 + mm) x columns [n0, n0 + nn) of Y from a tile's raw sums: the zero-point
 * correction of int8.c's qg_epilogue, then the float steps */
RC_CLONES static void dq_epilogue(const dq_job *j, const int32_t *restrict c, const uint32_t *restrict zbv,
                                  const uint32_t *restrict ct, const float *restrict sc, const float *restrict bs,
                                  Py_ssize_t m0, Py_ssize_t mm, Py_ssize_t n0, Py_ssize_t nn)
{
    for (Py_ssize_t r = 0; r < mm; r++) {
        const uint32_t rs = (uint32_t)j->rs[m0 + r];
        const uint32_t *restrict cr = (const uint32_t *)c + r * DQ_NR;
        float f[DQ_NR];
        for (int n = 0; n < DQ_NR; n++) {
            const float p = (float)(int32_t)(cr[n] - zbv[n] * rs + ct[n]) * sc[n];
            f[n] = p + bs[n];
        }
        float *restrict y = j->y + (m0 + r) * j->N + n0;
        if (nn == DQ_NR)
            memcpy(y, f, sizeof f);
        else
            memcpy(y, f, (size_t)nn * sizeof(float));
    }
}

/* the epilogue's vectors of columns [n0, n0 + 32): zero-point terms, scales, bias */
static void dq_columns(const dq_job *j, Py_ssize_t n0, uint32_t *zbv, uint32_t *ct, float *sc, float *bs)
{
    const uint32_t K = (uint32_t)j->K, ZA = (uint32_t)j->ZA;
    for (Py_ssize_t n = 0; n < DQ_NR; n++) {
        /* columns past N repeat the last one's (computed, never stored) */
        const Py_ssize_t col = n0 + n < j->N ? n0 + n : j->N - 1;
        zbv[n] = (uint32_t)((j->zb ? j->zb[col] : 0) - j->ob);
        ct[n] = K * ZA * zbv[n] - ZA * (uint32_t)j->cs[col];
        sc[n] = j->ascale * j->bscale[col]; /* the graph's Mul of the two scales, in float32 */
        bs[n] = j->bias ? j->bias[col] : 0.0f;
    }
}

/* unit u's columns [n0, n0 + nn) (B's two 16-column panels b0, b1) and its row blocks [rb0, rb1) */
typedef struct {
    Py_ssize_t n0, nn, rb0, rb1;
    const int8_t *b0, *b1;
} dq_unit;

static dq_unit dq_unit_at(const dq_job *j, Py_ssize_t u)
{
    dq_unit t;
    t.n0 = (u % j->ncols) * DQ_NR;
    t.rb0 = (u / j->ncols) * DQ_RB;
    t.rb1 = t.rb0 + DQ_RB < j->Mb ? t.rb0 + DQ_RB : j->Mb;
    t.nn = j->N - t.n0 < DQ_NR ? j->N - t.n0 : DQ_NR;
    t.b0 = j->bp + (t.n0 / 16) * j->Kq * 64;
    t.b1 = t.b0 + j->Kq * 64;
    return t;
}

/* a part's units on the AMX tiles (int8_amx.c): 32 x 32 int32 blocks, then dq_epilogue */
static void dq_part_amx(void *arg, int part, int parts)
{
    const dq_job *j = (const dq_job *)arg;
    int32_t c[32 * DQ_NR] __attribute__((aligned(64)));
    uint32_t zbv[DQ_NR], ct[DQ_NR];
    float sc[DQ_NR], bs[DQ_NR];
    const Py_ssize_t u0 = j->nunits * part / parts, u1 = j->nunits * (part + 1) / parts;
    rc_amx_begin();
    for (Py_ssize_t u = u0; u < u1; u++) {
        if (rc_stop_requested())
            break;
        /* Mb counts 16-row blocks here; a unit DQ_RB of them */
        const dq_unit t = dq_unit_at(j, u);
        const Py_ssize_t n0 = t.n0, rb1 = t.rb1, nn = t.nn;
        dq_columns(j, n0, zbv, ct, sc, bs);
        for (Py_ssize_t mb = t.rb0; mb < rb1; mb += 2) {
            const Py_ssize_t m0 = mb * 16, mm = j->M - m0 < 32 ? j->M - m0 : 32;
            rc_amx_tile((const uint8_t *)j->ap + m0 * j->lda, j->lda, t.b0, t.b1, j->Kq, mb + 1 < rb1 ? 2 : 1, c);
#if DQ_X86
            if (dq_avx512) { /* every AMX CPU has AVX-512 */
                dq_epilogue_avx512(c, j->rs + m0, zbv, ct, sc, bs, j->y + m0 * j->N + n0, j->N, mm, nn);
                continue;
            }
#endif
            dq_epilogue(j, c, zbv, ct, sc, bs, m0, mm, n0, nn);
        }
    }
    rc_amx_end();
}

static void dq_part(void *arg, int part, int parts)
{
    const dq_job *j = (const dq_job *)arg;
    int32_t c[DQ_MR * DQ_NR] __attribute__((aligned(64)));
    uint32_t zbv[DQ_NR], ct[DQ_NR];
    float sc[DQ_NR], bs[DQ_NR];
    const Py_ssize_t u0 = j->nunits * part / parts, u1 = j->nunits * (part + 1) / parts;
    for (Py_ssize_t u = u0; u < u1; u++) {
        if (rc_stop_requested())
            return;
        const dq_unit t = dq_unit_at(j, u);
        const Py_ssize_t n0 = t.n0, rb1 = t.rb1, nn = t.nn;
        dq_columns(j, n0, zbv, ct, sc, bs);
        for (Py_ssize_t mb = t.rb0; mb < rb1; mb++) {
            const Py_ssize_t m0 = mb * DQ_MR, mm = j->M - m0 < DQ_MR ? j->M - m0 : DQ_MR;
#if DQ_X86
            if (dq_vnni) {
                dq_tile_vnni(j->ap + mb * j->Kq * DQ_MR, t.b0, t.b1, j->Kq, j->rs + m0, zbv, ct, sc, bs,
                             j->y + m0 * j->N + n0, j->N, mm, nn);
                continue;
            }
#endif
            rc_qg_tile(j->ap + mb * j->Kq * DQ_MR, t.b0, t.b1, j->Kq, c);
            dq_epilogue(j, c, zbv, ct, sc, bs, m0, mm, n0, nn);
        }
    }
}

/* dqmm(a, a_kind, a_scale, a_zp, packed, b_signed, zb, b_scale, bias, y, (M, K, N), threads)
 *   -> (a_scale, a_zp) used */
PyObject *rc_py_dqmm(PyObject *self, PyObject *args)
{
    PyObject *ao, *po, *zbo, *so, *bo, *yo;
    Py_ssize_t M, K, N;
    int kind, za, bsigned, threads, tile = -1;
    float ascale;
    if (!PyArg_ParseTuple(args, "OifiOpOOOO(nnn)i|i:dqmm", &ao, &kind, &ascale, &za, &po, &bsigned, &zbo, &so, &bo,
                          &yo, &M, &K, &N, &threads, &tile))
        return NULL;
    if (tile < -1 || tile > 1 || (tile == 1 && !rc_amx)) {
        PyErr_Format(PyExc_ValueError, "dqmm: tile must be -1 (the default), 0 (VNNI) or 1 (AMX, where it runs: "
                                       "here %s), got %d", rc_amx_why, tile);
        return NULL;
    }
    if (M < 1 || K < 1 || N < 1 || kind < 0 || kind > 2 || (kind == 1 && (za < 0 || za > 255))
        || (kind == 2 && (za < -128 || za > 127))) {
        PyErr_SetString(PyExc_ValueError, "dqmm: sizes must be positive, a_kind 0 (float32), 1 (uint8) or 2 "
                                          "(int8) and a_zp in the byte's range");
        return NULL;
    }
#if DQ_X86
    if (dq_avx512 < 0)
        dq_init(-1);
#endif
    rc_sz sz = {NULL};
    const Py_ssize_t Np = (N + DQ_NR - 1) / DQ_NR * DQ_NR, Kq = (K + 3) / 4;
    /* the AMX tiles where asked (or, by default, from DQ_AMX_ROWS rows) and K fills a tile's 16 groups */
    const int amx = rc_amx && Kq >= 16 && (tile == 1 || (tile == -1 && M >= DQ_AMX_ROWS));
    const Py_ssize_t Mb = amx ? (M + 15) / 16 : (M + DQ_MR - 1) / DQ_MR, lda = amx ? rc_amx_a_stride(Kq) : 0;
    const Py_ssize_t an = sz_mul(&sz, "A's size", M, K), yn = sz_mul(&sz, "Y's size", M, N);
    const Py_ssize_t body = sz_mul3(&sz, "the packed size", Np, Kq, 4);
    const Py_ssize_t pn = sz_add(&sz, "the packed size", body, sz_mul(&sz, "the packed size", Np, 4));
    if (sz_check(&sz, "dqmm", PyExc_ValueError) < 0)
        return NULL;
    const Py_ssize_t apn = amx ? sz_mul3(&sz, "the packed rows", Mb, 16, lda)
                               : sz_mul4(&sz, "the packed rows", Mb, Kq, DQ_MR, 4);
    if (sz_check(&sz, "dqmm", PyExc_MemoryError) < 0)
        return NULL;
    Py_buffer v[6];
    const rc_buf spec[6] = {{ao, an, kind == 0 ? RC_F32 : 1, 0, 0, "A"}, {po, pn, 1, 0, 0, "packed"},
                            {zbo, N, 4, 0, 1, "zb"}, {so, N, RC_F32, 0, 0, "b_scale"}, {bo, N, RC_F32, 0, 1, "bias"},
                            {yo, yn, RC_F32, 1, 0, "Y"}};
    if (get_buffers("dqmm", spec, v, 6) < 0)
        return NULL;
    const Py_ssize_t rows = amx ? Mb * 16 : Mb * DQ_MR; /* A's rows packed, M padded */
    const size_t abytes = (size_t)apn + sizeof(int32_t) * (size_t)rows;
    int32_t *ap = (int32_t *)rc_work(abytes);
    if (!ap) {
        release_buffers(v, 6);
        return PyErr_NoMemory();
    }
    float zpf = (float)za;
    Py_BEGIN_ALLOW_THREADS
    int32_t *rsum = (int32_t *)((uint8_t *)ap + apn);
    dq_pack_job pj = {kind == 0 ? (const float *)v[0].buf : NULL, kind ? (const uint8_t *)v[0].buf : NULL, ap,
                      rsum, NULL, NULL, M, K, Kq, Mb, 1.0f, 0.0f, kind == 2 ? 0x80 : 0, lda};
    if (kind == 0) {
        float lo[RC_POOL_MAX * 4], hi[RC_POOL_MAX * 4];
        pj.lo = lo, pj.hi = hi;
        int rth = threads;
        const int rparts = rc_parts((double)M * (double)K, 2.5e5, RC_POOL_MAX * 4, &rth);
        rc_parallel(dq_range_part, &pj, rparts, rth);
        float a = 0.0f, b = 0.0f;
        for (int p = 0; p < rparts; p++) {
            a = lo[p] < a ? lo[p] : a;
            b = hi[p] > b ? hi[p] : b;
        }
        ascale = b == a ? 1.0f : (b - a) / 255.0f;
        zpf = rintf(clipf(0.0f - a / ascale, 0.0f, 255.0f));
        pj.scale = ascale, pj.zpf = zpf;
    }
    int pth = threads;
    const int pparts = rc_parts((double)M * (double)K * 4.0, 2.5e5, Mb, &pth);
    rc_parallel(amx ? dq_pack_amx_part : dq_pack_part, &pj, pparts, pth);
    const int8_t *bp = (const int8_t *)v[1].buf;
    dq_job j = {ap, rsum, bp, (const int32_t *)(bp + body), (const int32_t *)v[2].buf,
                (const float *)v[3].buf, (const float *)v[4].buf, (float *)v[5].buf, M, K, N, Kq, Mb, Np / DQ_NR,
                Np / DQ_NR * ((Mb + DQ_RB - 1) / DQ_RB), (int32_t)zpf + (kind == 2 ? 128 : 0), bsigned ? 0 : 128,
                ascale, lda};
    int gth = threads;
    const int parts = rc_parts_fine(2.0 * (double)M * (double)K * (double)N, 2.5e5, j.nunits, &gth);
    rc_parallel(amx ? dq_part_amx : dq_part, &j, parts, gth);
    Py_END_ALLOW_THREADS
    rc_work_done(ap, abytes);
    release_buffers(v, 6);
    return Py_BuildValue("(fi)", ascale, (int)zpf);
}

/* dqmm_path(force=-1) -> the quantizing loop and tile: "portable" (the portable quantizing loop,
 * int8.c's tile as qgemm_path names it: AVX-VNNI, AVX2 or C, and dq_epilogue), "avx512" (the AVX-512
 * quantizing loops, the same tile and dq_epilogue) or "avx512vnni" (and the VNNI tile with its
 * epilogue on the registers); force (0, 1, 2: at most what this CPU runs) sets it, so that tests
 * reach each one */
PyObject *rc_py_dqmm_path(PyObject *self, PyObject *args)
{
    int force = -1;
    if (!PyArg_ParseTuple(args, "|i:dqmm_path", &force))
        return NULL;
#if DQ_X86
    if (dq_avx512 < 0 || force >= 0)
        dq_init(force);
    return PyUnicode_FromString(dq_vnni ? "avx512vnni" : dq_avx512 ? "avx512" : "portable");
#else
    return PyUnicode_FromString("portable");
#endif
}
