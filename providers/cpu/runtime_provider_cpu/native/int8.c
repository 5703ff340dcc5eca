/* int8 GEMM with int32 accumulation (MatMulInteger, QLinearMatMul) and DynamicQuantizeLinear.
 *
 * Every product runs as u8 x s8: A (u8, or s8 + 128) against B (s8, or u8 - 128), packed in
 * the VNNI layout (panels of 16 columns, K in groups of 4 bytes); the offsets and both zero
 * points are folded into a row-sum / column-sum correction afterwards, so the int32 results
 * are exact (mod 2^32, as the spec allows) whatever the inner loop. Four inner loops read the
 * same layout, chosen once at load by the CPU: AVX-512 VNNI (vpdpbusd zmm), AVX-VNNI (VEX
 * vpdpbusd ymm), AVX2 (bytes widened to int16 pairs, vpmaddwd: exact, no vpmaddubsw saturation)
 * and portable C. The AVX-VNNI loop has an EVEX twin (one macro body, AVX512_VNNI + VL) that
 * tests force on AVX-512 machines, since the VEX form cannot run there. */
#include "native.h"

#define QG_MR 8  /* rows a tile */
#define QG_NR 32 /* columns a tile: two 16-column panels */
#define QG_RB 32 /* row blocks a unit of work: 256 rows of A, in L2 while the unit's tiles pass */

/* which inner loop runs here (set by rc_int8_init): an index of QG_NAMES */
enum { QG_PORTABLE, QG_AVX2, QG_VNNI512, QG_AVXVNNI, QG_VNNI256_EVEX, QG_NPATHS };
static const char *const QG_NAMES[QG_NPATHS] = {"portable", "avx2", "avx512vnni", "avxvnni", "vnni256-evex"};
static int qg_path;

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#define QG_X86 1
#else
#define QG_X86 0
#endif

/* the dispatch order, on flags given (qgemm_dispatch tests it with flags no CPU here has):
 * AVX-512 VNNI (zmm), else AVX-VNNI (VEX ymm), else AVX2, else portable */
static int qg_choose(int vnni512, int avx_vnni, int avx2)
{
    return vnni512 ? QG_VNNI512 : avx_vnni ? QG_AVXVNNI : avx2 ? QG_AVX2 : QG_PORTABLE;
}

/* whether this CPU runs inner loop p (the EVEX twin included, which dispatch never picks) */
static int qg_runs(int p)
{
#if QG_X86
    __builtin_cpu_init();
    const int vnni = __builtin_cpu_supports("avx512vnni");
    switch (p) {
    case QG_PORTABLE: return 1;
    case QG_AVX2: return __builtin_cpu_supports("avx2");
    case QG_VNNI512: return vnni && __builtin_cpu_supports("avx512bw");
    case QG_AVXVNNI: return rc_avx_vnni;
    case QG_VNNI256_EVEX: return vnni && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2");
    default: return 0;
    }
#else
    return p == QG_PORTABLE;
#endif
}

void rc_int8_init(void)
{
    qg_path = qg_choose(qg_runs(QG_VNNI512), qg_runs(QG_AVXVNNI), qg_runs(QG_AVX2));
}

/* packed B: Np = N rounded up to QG_NR, Kq = ceil(K / 4): Np / 16 panels of Kq x 16 x 4 bytes,
 * then Np int32 column sums of the (signed) bytes */
static Py_ssize_t qg_np(Py_ssize_t N) { return (N + QG_NR - 1) / QG_NR * QG_NR; }
static Py_ssize_t qg_kq(Py_ssize_t K) { return (K + 3) / 4; }

/* c[8][32] = sum over kq of the packed rows ap[kq][8] (4 bytes each) x the two panels b0, b1 */
#if QG_X86
/* acc += u8 a x s8 w in 4-byte groups, the accumulator tied to its register: GCC's own
 * vpdpbusd pattern copies each accumulator to another register and back every step */
#define QG_DPBUSD(acc, a, w) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(w))
/* one packed row's step (its 4 bytes broadcast against both panels), and its row of c */
#define QG_ROW_STEP(r)                                                                                           \
    do {                                                                                                         \
        const __m512i a_ = _mm512_set1_epi32(ap[q * QG_MR + (r)]);                                             \
        QG_DPBUSD(c##r##0, a_, w0);                                                                              \
        QG_DPBUSD(c##r##1, a_, w1);                                                                              \
    } while (0)
#define QG_ROW_OUT(r)                                                                                            \
    do {                                                                                                         \
        _mm512_storeu_si512((void *)(c + (r) * QG_NR), c##r##0);                                               \
        _mm512_storeu_si512((void *)(c + (r) * QG_NR + 16), c##r##1);                                          \
    } while (0)

/* the 16 accumulators are named, so that they stay in registers through the loop */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void
qg_tile_vnni(const int32_t *restrict ap, const int8_t *restrict b0, const int8_t *restrict b1, Py_ssize_t Kq,
             int32_t *restrict c)
{
    _Static_assert(QG_MR == 8 && QG_NR == 32, "qg_tile_vnni is written for 8 x 32 tiles");
    __m512i c00 = _mm512_setzero_si512(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00;
    __m512i c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
    for (Py_ssize_t q = 0; q < Kq; q++) {
        const __m512i w0 = _mm512_loadu_si512((const void *)(b0 + q * 64));
        const __m512i w1 = _mm512_loadu_si512((const void *)(b1 + q * 64));
        QG_ROW_STEP(0);
        QG_ROW_STEP(1);
        QG_ROW_STEP(2);
        QG_ROW_STEP(3);
        QG_ROW_STEP(4);
        QG_ROW_STEP(5);
        QG_ROW_STEP(6);
        QG_ROW_STEP(7);
    }
    QG_ROW_OUT(0);
    QG_ROW_OUT(1);
    QG_ROW_OUT(2);
    QG_ROW_OUT(3);
    QG_ROW_OUT(4);
    QG_ROW_OUT(5);
    QG_ROW_OUT(6);
    QG_ROW_OUT(7);
}

/* one row (a batch-1 GEMV: the 8-row tile would compute 7 rows of padding) x the two panels */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void
qg_row_vnni(const int32_t *restrict ap, const int8_t *restrict b0, const int8_t *restrict b1, Py_ssize_t Kq,
            int32_t *restrict c)
{
    __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
    __m512i e0 = _mm512_setzero_si512(), e1 = _mm512_setzero_si512();
    Py_ssize_t q = 0;
    for (; q + 2 <= Kq; q += 2) { /* two K groups in flight: independent accumulators */
        const __m512i x = _mm512_set1_epi32(ap[q * QG_MR]), y = _mm512_set1_epi32(ap[(q + 1) * QG_MR]);
        a0 = _mm512_dpbusd_epi32(a0, x, _mm512_loadu_si512((const void *)(b0 + q * 64)));
        a1 = _mm512_dpbusd_epi32(a1, x, _mm512_loadu_si512((const void *)(b1 + q * 64)));
        e0 = _mm512_dpbusd_epi32(e0, y, _mm512_loadu_si512((const void *)(b0 + q * 64 + 64)));
        e1 = _mm512_dpbusd_epi32(e1, y, _mm512_loadu_si512((const void *)(b1 + q * 64 + 64)));
    }
    if (q < Kq) {
        const __m512i x = _mm512_set1_epi32(ap[q * QG_MR]);
        a0 = _mm512_dpbusd_epi32(a0, x, _mm512_loadu_si512((const void *)(b0 + q * 64)));
        a1 = _mm512_dpbusd_epi32(a1, x, _mm512_loadu_si512((const void *)(b1 + q * 64)));
    }
    _mm512_storeu_si512((void *)c, _mm512_add_epi32(a0, e0));
    _mm512_storeu_si512((void *)(c + 16), _mm512_add_epi32(a1, e1));
}

/* 4 rows x one 16-column panel: each 4-byte group split into its even and odd bytes as int16
 * (A zero-extended, B sign-extended) and multiplied pairwise by vpmaddwd */
__attribute__((target("avx2"))) static void qg_quad_avx2(const int32_t *restrict ap, const int8_t *restrict b,
                                                         Py_ssize_t Kq, int32_t *restrict c)
{
    __m256i acc[4][2];
    for (int r = 0; r < 4; r++)
        acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    const __m256i lo8 = _mm256_set1_epi16(0xff);
    for (Py_ssize_t q = 0; q < Kq; q++) {
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)(b + q * 64));
        const __m256i w1 = _mm256_loadu_si256((const __m256i *)(b + q * 64 + 32));
        const __m256i e0 = _mm256_srai_epi16(_mm256_slli_epi16(w0, 8), 8), o0 = _mm256_srai_epi16(w0, 8);
        const __m256i e1 = _mm256_srai_epi16(_mm256_slli_epi16(w1, 8), 8), o1 = _mm256_srai_epi16(w1, 8);
        for (int r = 0; r < 4; r++) {
            const __m256i a = _mm256_set1_epi32(ap[q * QG_MR + r]);
            const __m256i ae = _mm256_and_si256(a, lo8), ao = _mm256_srli_epi16(a, 8);
            acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_add_epi32(_mm256_madd_epi16(ae, e0), _mm256_madd_epi16(ao, o0)));
            acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_add_epi32(_mm256_madd_epi16(ae, e1), _mm256_madd_epi16(ao, o1)));
        }
    }
    for (int r = 0; r < 4; r++) {
        _mm256_storeu_si256((__m256i *)(c + r * QG_NR), acc[r][0]);
        _mm256_storeu_si256((__m256i *)(c + r * QG_NR + 8), acc[r][1]);
    }
}

/* 4 rows x one 16-column panel in ymm vpdpbusd, the 8 accumulators tied to registers 0-15 ("x":
 * the VEX form reaches no others); `insn` spells the encoding, so the VEX loop and its EVEX twin
 * are one body. Columns 0-7 of a group are the panel's first 32 bytes, 8-15 the next 32. */
#define QG_VNNI256_QUAD(name, tgt, insn)                                                                         \
    __attribute__((target(tgt), noinline)) static void name(const int32_t *restrict ap, const int8_t *restrict b, \
                                                            Py_ssize_t Kq, int32_t *restrict c)                   \
    {                                                                                                            \
        __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00;                                   \
        __m256i c20 = c00, c21 = c00, c30 = c00, c31 = c00;                                                      \
        for (Py_ssize_t q = 0; q < Kq; q++) {                                                                    \
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)(b + q * 64));                                \
            const __m256i w1 = _mm256_loadu_si256((const __m256i *)(b + q * 64 + 32));                           \
            __m256i a_ = _mm256_set1_epi32(ap[q * QG_MR]);                                                       \
            __asm__(insn " %2, %1, %0" : "+x"(c00) : "x"(a_), "x"(w0));                                        \
            __asm__(insn " %2, %1, %0" : "+x"(c01) : "x"(a_), "x"(w1));                                        \
            a_ = _mm256_set1_epi32(ap[q * QG_MR + 1]);                                                           \
            __asm__(insn " %2, %1, %0" : "+x"(c10) : "x"(a_), "x"(w0));                                        \
            __asm__(insn " %2, %1, %0" : "+x"(c11) : "x"(a_), "x"(w1));                                        \
            a_ = _mm256_set1_epi32(ap[q * QG_MR + 2]);                                                           \
            __asm__(insn " %2, %1, %0" : "+x"(c20) : "x"(a_), "x"(w0));                                        \
            __asm__(insn " %2, %1, %0" : "+x"(c21) : "x"(a_), "x"(w1));                                        \
            a_ = _mm256_set1_epi32(ap[q * QG_MR + 3]);                                                           \
            __asm__(insn " %2, %1, %0" : "+x"(c30) : "x"(a_), "x"(w0));                                        \
            __asm__(insn " %2, %1, %0" : "+x"(c31) : "x"(a_), "x"(w1));                                        \
        }                                                                                                        \
        _mm256_storeu_si256((__m256i *)c, c00);                                                                  \
        _mm256_storeu_si256((__m256i *)(c + 8), c01);                                                            \
        _mm256_storeu_si256((__m256i *)(c + QG_NR), c10);                                                        \
        _mm256_storeu_si256((__m256i *)(c + QG_NR + 8), c11);                                                    \
        _mm256_storeu_si256((__m256i *)(c + 2 * QG_NR), c20);                                                    \
        _mm256_storeu_si256((__m256i *)(c + 2 * QG_NR + 8), c21);                                                \
        _mm256_storeu_si256((__m256i *)(c + 3 * QG_NR), c30);                                                    \
        _mm256_storeu_si256((__m256i *)(c + 3 * QG_NR + 8), c31);                                                \
    }

/* AVX-VNNI CPUs (no AVX-512): nothing EVEX may reach this function, hence target avx2 alone */
QG_VNNI256_QUAD(qg_quad_avxvnni, "avx2", "%{vex%} vpdpbusd")
/* the same body EVEX-encoded, run where AVX512_VNNI + VL are: how tests reach the VEX loop's logic */
QG_VNNI256_QUAD(qg_quad_vnni256_evex, "avx2,avx512f,avx512vl,avx512vnni", "%{evex%} vpdpbusd")

/* the 8 x 32 tile as four quads (the AVX2 tile's order) */
#define QG_QUADS(quad)                                                                                           \
    do {                                                                                                         \
        quad(ap, b0, Kq, c);                                                                                     \
        quad(ap + 4, b0, Kq, c + 4 * QG_NR);                                                                     \
        quad(ap, b1, Kq, c + 16);                                                                                \
        quad(ap + 4, b1, Kq, c + 4 * QG_NR + 16);                                                                \
    } while (0)

static void qg_tile_avxvnni(const int32_t *restrict ap, const int8_t *restrict b0, const int8_t *restrict b1,
                            Py_ssize_t Kq, int32_t *restrict c)
{
    QG_QUADS(qg_quad_avxvnni);
}

static void qg_tile_vnni256_evex(const int32_t *restrict ap, const int8_t *restrict b0, const int8_t *restrict b1,
                                 Py_ssize_t Kq, int32_t *restrict c)
{
    QG_QUADS(qg_quad_vnni256_evex);
}

__attribute__((target("avx2"))) static void qg_tile_avx2(const int32_t *restrict ap, const int8_t *restrict b0,
                                                         const int8_t *restrict b1, Py_ssize_t Kq, int32_t *restrict c)
{
    qg_quad_avx2(ap, b0, Kq, c);
    qg_quad_avx2(ap + 4, b0, Kq, c + 4 * QG_NR);
    qg_quad_avx2(ap, b1, Kq, c + 16);
    qg_quad_avx2(ap + 4, b1, Kq, c + 4 * QG_NR + 16);
}
#endif

static void qg_tile_c(const int32_t *restrict ap, const int8_t *restrict b0, const int8_t *restrict b1, Py_ssize_t Kq,
                      int32_t *restrict c)
{
    uint32_t acc[QG_MR][QG_NR];
    memset(acc, 0, sizeof acc);
    for (Py_ssize_t q = 0; q < Kq; q++)
        for (int r = 0; r < QG_MR; r++) {
            const uint8_t *a = (const uint8_t *)(ap + q * QG_MR + r);
            for (int n = 0; n < QG_NR; n++) {
                const int8_t *w = (n < 16 ? b0 + n * 4 : b1 + (n - 16) * 4) + q * 64;
                acc[r][n] += (uint32_t)(a[0] * w[0] + a[1] * w[1] + a[2] * w[2] + a[3] * w[3]);
            }
        }
    memcpy(c, acc, sizeof acc);
}

/* one 8 x 32 tile of raw sums on the inner loop qg_path names */
static void qg_tile(const int32_t *restrict ap, const int8_t *restrict b0, const int8_t *restrict b1, Py_ssize_t Kq,
                    int32_t *restrict c)
{
#if QG_X86
    switch (qg_path) {
    case QG_VNNI512: qg_tile_vnni(ap, b0, b1, Kq, c); return;
    case QG_AVXVNNI: qg_tile_avxvnni(ap, b0, b1, Kq, c); return;
    case QG_VNNI256_EVEX: qg_tile_vnni256_evex(ap, b0, b1, Kq, c); return;
    case QG_AVX2: qg_tile_avx2(ap, b0, b1, Kq, c); return;
    default: break;
    }
#endif
    qg_tile_c(ap, b0, b1, Kq, c);
}

typedef struct {
    const int32_t *ap;  /* packed A: [Mb][Kq][8] groups of 4 unsigned bytes */
    const int32_t *rs;  /* the row sums of A's unsigned bytes [Mb * 8] */
    const int8_t *bp;   /* packed B */
    const int32_t *cs;  /* B's column sums [Np] */
    const int32_t *zb;  /* B's zero point per column [N] (NULL: 0) */
    const int32_t *bias; /* added to the int32 sums per column [N] (NULL: none): QLinearConv's B */
    const float *mult;  /* the requantizing multiplier per column [N] (mode != 0) */
    void *y;
    Py_ssize_t M, K, N, Kq, Mb, ncols, nunits;
    int32_t ZA, ob, yz;  /* A's zero point plus its offset, B's offset, Y's zero point */
    Py_ssize_t yP;       /* 0: Y is M x N; else Y is (M / yP) x N x yP (NCHW planes of yP pixels) */
    int mode;            /* 0: int32 out; 1: uint8; 2: int8 */
    Py_ssize_t lda;      /* A on the AMX tiles (int8_amx.c): its rows lda bytes apart; 0: the layout above */
} qg_job;


/* a tile's rows [m0, m0 + mm) x columns [n0, n0 + nn) of Y from the raw sums c: the zero-point
 * and offset correction sum (a - za)(b - zb) = sum a_u b_s - ZB sum a_u - ZA sum b_s + K ZA ZB
 * (a_u = a + oa, b_s = b - ob, ZA = za + oa, ZB = zb - ob, wrapping), zbv[n] = ZB and
 * ct[n] = K ZA ZB - ZA sum b_s, then int32 out or the requantized bytes; branch-free inner
 * loops, vectorized in the clones */
RC_CLONES static void qg_epilogue(const qg_job *j, const int32_t *restrict c, const uint32_t *restrict zbv,
                                  const uint32_t *restrict ct, Py_ssize_t m0, Py_ssize_t mm, Py_ssize_t n0,
                                  Py_ssize_t nn)
{
    const float *restrict mult = j->mult ? j->mult + n0 : NULL;
    const float yz = (float)j->yz, lo = j->mode == 1 ? 0.0f : -128.0f, hi = j->mode == 1 ? 255.0f : 127.0f;
#if RC_SSE2
    const Py_ssize_t P = j->yP;
    if (P && j->mode && mm == QG_MR && m0 % P + QG_MR <= P) {
        /* 8 rows of a tile inside one image's planes: its bytes, then 8 pixels of a column (a plane)
         * a store, through two 16 x 16 byte transposes (rows 8..15 unused) */
        uint8_t tb[2 * QG_MR][QG_NR] __attribute__((aligned(16)));
        float mt[QG_NR];
        for (int n = 0; n < QG_NR; n++)
            mt[n] = mult[n < nn ? n : nn - 1];
        for (int r = 0; r < QG_MR; r++) {
            const uint32_t rs = (uint32_t)j->rs[m0 + r];
            const uint32_t *restrict cr = (const uint32_t *)c + r * QG_NR;
            for (int n = 0; n < QG_NR; n++) { /* columns past nn: computed (zbv, ct hold the last one's), not stored */
                float t = rintf((float)(int32_t)(cr[n] - zbv[n] * rs + ct[n]) * mt[n]) + yz;
                t = t > lo ? t : lo;
                t = t < hi ? t : hi;
                tb[r][n] = (uint8_t)(int32_t)t; /* the low byte: int8 as two's complement */
            }
        }
        memset(tb[QG_MR], 0, sizeof tb / 2);
        uint8_t *y = (uint8_t *)j->y + (m0 / P) * j->N * P + n0 * P + m0 % P;
        for (int h = 0; h < 2 && 16 * h < nn; h++) {
            __m128i in[16], out[16];
            for (int r = 0; r < 16; r++)
                in[r] = _mm_load_si128((const __m128i *)(tb[r] + 16 * h));
            rc_tr16_bytes(in, out);
            for (int n = 0; n < 16 && 16 * h + n < nn; n++)
                _mm_storel_epi64((__m128i *)(y + (16 * h + n) * P), out[n]);
        }
        return;
    }
#endif
    for (Py_ssize_t r = 0; r < mm; r++) {
        const uint32_t rs = (uint32_t)j->rs[m0 + r];
        const uint32_t *restrict cr = (const uint32_t *)c + r * QG_NR;
        const Py_ssize_t m = m0 + r, P = j->yP;
        /* Y's item of column n is at + n * ys: a row of Y, or a pixel of N planes */
        const Py_ssize_t at = P ? (m / P) * j->N * P + n0 * P + m % P : m * j->N + n0, ys = P ? P : 1;
        if (j->mode == 0) {
            int32_t *restrict y = (int32_t *)j->y + at;
            for (Py_ssize_t n = 0; n < nn; n++)
                y[n * ys] = (int32_t)(cr[n] - zbv[n] * rs + ct[n]);
            continue;
        }
        float f[QG_NR];
        for (Py_ssize_t n = 0; n < nn; n++) {
            float t = rintf((float)(int32_t)(cr[n] - zbv[n] * rs + ct[n]) * mult[n]) + yz;
            t = t > lo ? t : lo; /* one-sided selects: vmaxps / vminps (a nested one is not vectorized) */
            f[n] = t < hi ? t : hi;
        }
        if (j->mode == 1) {
            uint8_t *restrict y = (uint8_t *)j->y + at;
            for (Py_ssize_t n = 0; n < nn; n++)
                y[n * ys] = (uint8_t)(int32_t)f[n];
        } else {
            int8_t *restrict y = (int8_t *)j->y + at;
            for (Py_ssize_t n = 0; n < nn; n++)
                y[n * ys] = (int8_t)(int32_t)f[n];
        }
    }
}

/* the per-column terms of the 32 columns from n0 (the last column repeated past N): B's zero
   point less the output's, and K za zb - za colsum + bias (uint32: wraps as int32 does) */
static void qg_columns(const qg_job *j, Py_ssize_t n0, uint32_t *zbv, uint32_t *ct)
{
    const uint32_t K = (uint32_t)j->K, ZA = (uint32_t)j->ZA;
    for (Py_ssize_t n = 0; n < QG_NR; n++) {
        const Py_ssize_t col = n0 + n < j->N ? n0 + n : j->N - 1;
        zbv[n] = (uint32_t)((j->zb ? j->zb[col] : 0) - j->ob);
        ct[n] = K * ZA * zbv[n] - ZA * (uint32_t)j->cs[col] + (j->bias ? (uint32_t)j->bias[col] : 0u);
    }
}

static void qg_part(void *arg, int part, int parts)
{
    const qg_job *j = (const qg_job *)arg;
    int32_t c[QG_MR * QG_NR] __attribute__((aligned(64)));
    uint32_t zbv[QG_NR], ct[QG_NR];
    const Py_ssize_t u0 = j->nunits * part / parts, u1 = j->nunits * (part + 1) / parts;
    for (Py_ssize_t u = u0; u < u1; u++) {
        /* a unit: one 32-column tile column x up to QG_RB row blocks (B's panels in L1) */
        const Py_ssize_t n0 = (u % j->ncols) * QG_NR, rb0 = (u / j->ncols) * QG_RB;
        const Py_ssize_t rb1 = rb0 + QG_RB < j->Mb ? rb0 + QG_RB : j->Mb;
        qg_columns(j, n0, zbv, ct);
        const int8_t *b0 = j->bp + (n0 / 16) * j->Kq * 64, *b1 = b0 + j->Kq * 64;
        const Py_ssize_t nn = j->N - n0 < QG_NR ? j->N - n0 : QG_NR;
        for (Py_ssize_t mb = rb0; mb < rb1; mb++) {
            const int32_t *ap = j->ap + mb * j->Kq * QG_MR;
            const Py_ssize_t m0 = mb * QG_MR, mm = j->M - m0 < QG_MR ? j->M - m0 : QG_MR;
            if (qg_path == QG_VNNI512 && mm == 1)
                qg_row_vnni(ap, b0, b1, j->Kq, c);
            else
                qg_tile(ap, b0, b1, j->Kq, c);
            qg_epilogue(j, c, zbv, ct, m0, mm, n0, nn);
        }
    }
}

/* qg_part on the AMX tiles: 32 x 32 int32 blocks, each through qg_epilogue 8 rows at a time */
static void qg_part_amx(void *arg, int part, int parts)
{
    const qg_job *j = (const qg_job *)arg;
    int32_t c[32 * QG_NR] __attribute__((aligned(64)));
    uint32_t zbv[QG_NR], ct[QG_NR];
    const Py_ssize_t u0 = j->nunits * part / parts, u1 = j->nunits * (part + 1) / parts;
    rc_amx_begin();
    for (Py_ssize_t u = u0; u < u1; u++) {
        const Py_ssize_t n0 = (u % j->ncols) * QG_NR, rb0 = (u / j->ncols) * QG_RB;
        const Py_ssize_t rb1 = rb0 + QG_RB < j->Mb ? rb0 + QG_RB : j->Mb; /* Mb even: 16-row blocks */
        qg_columns(j, n0, zbv, ct);
        const int8_t *b0 = j->bp + (n0 / 16) * j->Kq * 64, *b1 = b0 + j->Kq * 64;
        const Py_ssize_t nn = j->N - n0 < QG_NR ? j->N - n0 : QG_NR;
        for (Py_ssize_t mb = rb0; mb < rb1; mb += 4) {
            const int r16 = rb1 - mb >= 4 ? 2 : 1;
            rc_amx_tile((const uint8_t *)j->ap + mb * QG_MR * j->lda, j->lda, b0, b1, j->Kq, r16, c);
            for (int i = 0; i < 2 * r16 && (mb + i) * QG_MR < j->M; i++) {
                const Py_ssize_t m0 = (mb + i) * QG_MR, mm = j->M - m0 < QG_MR ? j->M - m0 : QG_MR;
                qg_epilogue(j, c + i * QG_MR * QG_NR, zbv, ct, m0, mm, n0, nn);
            }
        }
    }
    rc_amx_end();
}

PyObject *rc_py_qgemm_packed_size(PyObject *self, PyObject *args)
{
    Py_ssize_t K, N;
    if (!PyArg_ParseTuple(args, "(nn):qgemm_packed_size", &K, &N))
        return NULL;
    rc_sz sz = {NULL};
    const Py_ssize_t n = sz_add(&sz, "the packed size", sz_mul3(&sz, "the packed size", qg_np(N), qg_kq(K), 4),
                                sz_mul(&sz, "the packed size", qg_np(N), 4));
    if (K < 1 || N < 1) {
        PyErr_SetString(PyExc_ValueError, "qgemm_packed_size: sizes must be positive");
        return NULL;
    }
    if (sz_check(&sz, "qgemm_packed_size", PyExc_ValueError) < 0)
        return NULL;
    return PyLong_FromSsize_t(n);
}

PyObject *rc_py_qgemm_pack(PyObject *self, PyObject *args)
{
    PyObject *bo, *po;
    Py_ssize_t K, N;
    int bsigned;
    if (!PyArg_ParseTuple(args, "OO(nn)p:qgemm_pack", &bo, &po, &K, &N, &bsigned))
        return NULL;
    if (K < 1 || N < 1) {
        PyErr_SetString(PyExc_ValueError, "qgemm_pack: sizes must be positive");
        return NULL;
    }
    rc_sz sz = {NULL};
    const Py_ssize_t Np = qg_np(N), Kq = qg_kq(K);
    const Py_ssize_t bn = sz_mul(&sz, "B's size", K, N);
    const Py_ssize_t body = sz_mul3(&sz, "the packed size", Np, Kq, 4);
    const Py_ssize_t pn = sz_add(&sz, "the packed size", body, sz_mul(&sz, "the packed size", Np, 4));
    if (sz_check(&sz, "qgemm_pack", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[2];
    const rc_buf spec[2] = {{bo, bn, 1, 0, 0, "B"}, {po, pn, 1, 1, 0, "packed"}};
    if (get_buffers("qgemm_pack", spec, v, 2) < 0)
        return NULL;
    const uint8_t *b = (const uint8_t *)v[0].buf;
    int8_t *p = (int8_t *)v[1].buf;
    int32_t cs_local;
    Py_BEGIN_ALLOW_THREADS
    memset(p, 0, (size_t)pn);
    int8_t *csb = p + body;
    for (Py_ssize_t n = 0; n < N; n++) {
        int8_t *panel = p + (n / 16) * Kq * 64 + (n % 16) * 4;
        uint32_t s = 0;
        for (Py_ssize_t k = 0; k < K; k++) {
            /* a u8 B is stored as b - 128 (the offset comes back in the correction) */
            const int8_t w = bsigned ? (int8_t)b[k * N + n] : (int8_t)((int)b[k * N + n] - 128);
            panel[(k / 4) * 64 + (k % 4)] = w;
            s += (uint32_t)(int32_t)w;
        }
        cs_local = (int32_t)s;
        memcpy(csb + 4 * n, &cs_local, 4);
    }
    Py_END_ALLOW_THREADS
    release_buffers(v, 2);
    Py_RETURN_NONE;
}

/* y[p][c] = x[c][p] for bytes and pixels [p0, p1) of one image: its planes as pixel rows (a
 * pointwise QLinearConv's A, im2col's NHWC copy), 16 x 16 blocks through byte transposes, the edges
 * item by item */
static void qt_range(const uint8_t *restrict x, uint8_t *restrict y, Py_ssize_t C, Py_ssize_t P, Py_ssize_t p0,
                     Py_ssize_t p1)
{
    Py_ssize_t c0 = 0;
#if RC_SSE2
    for (; c0 + 16 <= C; c0 += 16) {
        Py_ssize_t p = p0;
        for (; p + 16 <= p1; p += 16) {
            __m128i in[16], out[16];
            for (int c = 0; c < 16; c++)
                in[c] = _mm_loadu_si128((const __m128i *)(x + (c0 + c) * P + p));
            rc_tr16_bytes(in, out);
            for (int q = 0; q < 16; q++)
                _mm_storeu_si128((__m128i *)(y + (p + q) * C + c0), out[q]);
        }
        for (; p < p1; p++)
            for (int c = 0; c < 16; c++)
                y[p * C + c0 + c] = x[(c0 + c) * P + p];
    }
#endif
    for (Py_ssize_t p = p0; p < p1; p++)
        for (Py_ssize_t c = c0; c < C; c++)
            y[p * C + c] = x[c * P + p];
}

/* im2col rows of NCHW bytes for a convolution's GEMM: row (n, oh, ow), items in (kh, kw, c)
 * order, taps outside the image the pad byte (x's zero point). The image is first copied to NHWC
 * (xt, qt_range), so that a tap is a run of C bytes and, at unit dilation, a window row's KW taps one
 * run of KW * C bytes: gathering each byte from its plane cost more than the GEMM itself. */
typedef struct {
    const uint8_t *x;
    uint8_t *cols, *xt; /* xt: x as NHWC (pixel rows) */
    Py_ssize_t N, C, H, W, KH, KW, OH, OW, sh, sw, dh, dw, pt, pl;
    Py_ssize_t tblocks; /* pixel blocks an image for the NHWC copy */
    uint8_t pad;
} qi_job;

#define QI_TBLOCK 1024 /* pixels a part of the NHWC copy */

static void qi_nhwc_part(void *arg, int part, int parts)
{
    const qi_job *j = (const qi_job *)arg;
    const Py_ssize_t units = j->N * j->tblocks, u0 = units * part / parts, u1 = units * (part + 1) / parts;
    const Py_ssize_t P = j->H * j->W, CP = j->C * P;
    for (Py_ssize_t u = u0; u < u1; u++) {
        const Py_ssize_t n = u / j->tblocks, p0 = (u % j->tblocks) * QI_TBLOCK;
        qt_range(j->x + n * CP, j->xt + n * CP, j->C, P, p0, p0 + QI_TBLOCK < P ? p0 + QI_TBLOCK : P);
    }
}

/* the im2col row of output pixel (n, oh, ow) into d (KH * KW * C bytes) from the NHWC copy */
static void qi_pixel(const qi_job *j, Py_ssize_t n, Py_ssize_t oh, Py_ssize_t ow, uint8_t *restrict d)
{
    const Py_ssize_t C = j->C, KW = j->KW, run = KW * C;
    const uint8_t *xn = j->xt + n * C * j->H * j->W;
    const Py_ssize_t iw0 = ow * j->sw - j->pl;
    const int inside = iw0 >= 0 && iw0 + (KW - 1) * j->dw < j->W;
    for (Py_ssize_t i = 0; i < j->KH; i++, d += run) {
        const Py_ssize_t ih = oh * j->sh - j->pt + i * j->dh;
        if (ih < 0 || ih >= j->H) {
            memset(d, j->pad, (size_t)run);
            continue;
        }
        const uint8_t *xr = xn + ih * j->W * C;
        if (inside && j->dw == 1) {
            memcpy(d, xr + iw0 * C, (size_t)run);
            continue;
        }
        for (Py_ssize_t k = 0; k < KW; k++) {
            const Py_ssize_t iw = iw0 + k * j->dw;
            if (iw < 0 || iw >= j->W)
                memset(d + k * C, j->pad, (size_t)C);
            else
                memcpy(d + k * C, xr + iw * C, (size_t)C);
        }
    }
}

static void qi_part(void *arg, int part, int parts)
{
    const qi_job *j = (const qi_job *)arg;
    const Py_ssize_t rows = j->N * j->OH, r0 = rows * part / parts, r1 = rows * (part + 1) / parts;
    const Py_ssize_t row = j->KH * j->KW * j->C;
    for (Py_ssize_t r = r0; r < r1; r++)
        for (Py_ssize_t ow = 0; ow < j->OW; ow++)
            qi_pixel(j, r / j->OH, r % j->OH, ow, j->cols + (r * j->OW + ow) * row);
}

/* A's rows as unsigned bytes (an s8 A shifted by 128) in groups of 4 a row, [Mb][Kq][8], zeros
 * past K and M, and their sums: a part's share of the row blocks. With conv set, A is a
 * convolution's im2col rows, never stored whole: each block's 8 rows are gathered from the image's
 * NHWC copy into a buffer of the part (in L1 / L2) and packed from there (an implicit GEMM). */
typedef struct {
    const uint8_t *a;
    int32_t *ap, *rs;
    Py_ssize_t M, K, Kq, Mb;
    uint32_t flip;      /* 0x80808080 for an s8 A */
    const qi_job *conv; /* NULL: A is M x K bytes */
    uint8_t *rows;      /* with conv: QG_MR x K bytes a part */
} qg_pack_job;

#if RC_SSE2
/* the first q4 groups (a multiple of 4) of a full block's 8 rows: 16 bytes of each row a step, two
 * 4 x 4 transposes of their 4-byte groups, the row sums by vpsadbw (sum[r] gets them); the scalar
 * loop, a 4-byte store 32 bytes apart per group and a byte-serial sum, cost half the GEMM's time */
static void qg_pack8_sse2(const qg_pack_job *j, const uint8_t *a, uint32_t *restrict dst, Py_ssize_t q4,
                          uint32_t *restrict sum)
{
    const uint8_t *row[QG_MR];
    for (int r = 0; r < QG_MR; r++)
        row[r] = a + r * j->K;
    const __m128i flip = _mm_set1_epi32((int)j->flip), z = _mm_setzero_si128();
    __m128i s[QG_MR];
    for (int r = 0; r < QG_MR; r++)
        s[r] = z;
    for (Py_ssize_t q = 0; q < q4; q += 4) {
        __m128i v[QG_MR];
        for (int r = 0; r < QG_MR; r++) {
            v[r] = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(row[r] + 4 * q)), flip);
            s[r] = _mm_add_epi64(s[r], _mm_sad_epu8(v[r], z));
        }
        for (int h = 0; h < 2; h++) { /* rows 4h..4h+3: group q+i of the four into the quarter at 4h */
            const __m128i *w = v + 4 * h;
            const __m128i t0 = _mm_unpacklo_epi32(w[0], w[1]), t1 = _mm_unpacklo_epi32(w[2], w[3]);
            const __m128i t2 = _mm_unpackhi_epi32(w[0], w[1]), t3 = _mm_unpackhi_epi32(w[2], w[3]);
            _mm_storeu_si128((__m128i *)(dst + q * QG_MR + 4 * h), _mm_unpacklo_epi64(t0, t1));
            _mm_storeu_si128((__m128i *)(dst + (q + 1) * QG_MR + 4 * h), _mm_unpackhi_epi64(t0, t1));
            _mm_storeu_si128((__m128i *)(dst + (q + 2) * QG_MR + 4 * h), _mm_unpacklo_epi64(t2, t3));
            _mm_storeu_si128((__m128i *)(dst + (q + 3) * QG_MR + 4 * h), _mm_unpackhi_epi64(t2, t3));
        }
    }
    for (int r = 0; r < QG_MR; r++)
        sum[r] = (uint32_t)_mm_cvtsi128_si32(s[r]) + (uint32_t)_mm_cvtsi128_si32(_mm_unpackhi_epi64(s[r], s[r]));
}
#endif

RC_CLONES static void qg_pack_part(void *arg, int part, int parts)
{
    const qg_pack_job *j = (const qg_pack_job *)arg;
    const Py_ssize_t b0 = j->Mb * part / parts, b1 = j->Mb * (part + 1) / parts, kf = j->K / 4;
    const qi_job *cv = j->conv;
    uint8_t *rows = cv ? j->rows + part * QG_MR * j->K : NULL; /* this part's block of im2col rows */
    for (Py_ssize_t mb = b0; mb < b1; mb++) {
        uint32_t *restrict dst = (uint32_t *)j->ap + mb * j->Kq * QG_MR;
        const uint8_t *a = j->a + mb * QG_MR * j->K; /* the block's first row; row r at a + r * K */
        if (cv) {
            const Py_ssize_t P = cv->OH * cv->OW;
            for (Py_ssize_t m = mb * QG_MR; m < j->M && m < mb * QG_MR + QG_MR; m++)
                qi_pixel(cv, m / P, m % P / cv->OW, m % cv->OW, rows + (m - mb * QG_MR) * j->K);
            a = rows;
        }
        Py_ssize_t q0 = 0; /* the groups packed before the loop below */
        uint32_t s0[QG_MR] = {0};
#if RC_SSE2
        if (mb * QG_MR + QG_MR <= j->M && kf >= 4) {
            q0 = kf / 4 * 4;
            qg_pack8_sse2(j, a, dst, q0, s0);
        }
#endif
        for (int r = 0; r < QG_MR; r++) {
            const Py_ssize_t m = mb * QG_MR + r;
            if (m >= j->M) {
                for (Py_ssize_t q = 0; q < j->Kq; q++)
                    dst[q * QG_MR + r] = 0;
                j->rs[m] = 0;
                continue;
            }
            const uint8_t *restrict row = a + r * j->K;
            uint32_t s = s0[r];
            for (Py_ssize_t k = 4 * q0; k < j->K; k++)
                s += (uint32_t)(uint8_t)(row[k] ^ (uint8_t)j->flip);
            j->rs[m] = (int32_t)s;
            for (Py_ssize_t q = q0; q < kf; q++) {
                uint32_t w;
                memcpy(&w, row + 4 * q, 4);
                dst[q * QG_MR + r] = w ^ j->flip;
            }
            if (kf < j->Kq) {
                uint8_t t[4] = {0, 0, 0, 0};
                for (Py_ssize_t k = 4 * kf; k < j->K; k++)
                    t[k - 4 * kf] = row[k] ^ (uint8_t)j->flip;
                uint32_t w;
                memcpy(&w, t, 4);
                dst[kf * QG_MR + r] = w;
            }
        }
    }
}

/* qg_pack_part for the AMX tiles: a part's 16-row blocks (Mb is even there) */
static void qg_pack_amx_part(void *arg, int part, int parts)
{
    const qg_pack_job *j = (const qg_pack_job *)arg;
    const Py_ssize_t nb = j->Mb / 2, r0 = nb * part / parts * 16, r1 = nb * (part + 1) / parts * 16;
    rc_amx_pack_rows(j->a, j->M, j->K, j->Kq, rc_amx_a_stride(j->Kq), (uint8_t)j->flip, r0, r1, (uint8_t *)j->ap,
                     j->rs);
}

/* qgemm(a, a_signed, za, packed, b_signed, zb, y, (M, K, N), mode, mult, yz, threads, bias=None,
 *       y_planes=0): with y_planes P, Y is (M / P) x N x P (a convolution's NCHW output, row m
 * of A a pixel), so that the result needs no layout transpose */
PyObject *rc_py_qgemm(PyObject *self, PyObject *args)
{
    PyObject *ao, *po, *zbo, *yo, *mo, *bo = Py_None, *co = Py_None;
    Py_ssize_t M, K, N, yP = 0;
    int asigned, bsigned, za, mode, yz, threads;
    if (!PyArg_ParseTuple(args, "OpiOpOO(nnn)iOii|OnO:qgemm", &ao, &asigned, &za, &po, &bsigned, &zbo, &yo, &M, &K,
                          &N, &mode, &mo, &yz, &threads, &bo, &yP, &co))
        return NULL;
    if (M < 1 || K < 1 || N < 1 || mode < 0 || mode > 2 || yP < 0 || (yP && M % yP)) {
        PyErr_SetString(PyExc_ValueError, "qgemm: sizes must be positive, mode 0, 1 or 2 and y_planes divide M");
        return NULL;
    }
    qi_job cv;
    memset(&cv, 0, sizeof cv);
    const int conv = co != Py_None;
    if (conv) {
        if (!PyArg_ParseTuple(co, "nnnnnnnnnnnnn:qgemm conv", &cv.C, &cv.H, &cv.W, &cv.KH, &cv.KW, &cv.OH, &cv.OW,
                              &cv.sh, &cv.sw, &cv.dh, &cv.dw, &cv.pt, &cv.pl))
            return NULL;
        if (cv.C < 1 || cv.H < 1 || cv.W < 1 || cv.KH < 1 || cv.KW < 1 || cv.OH < 1 || cv.OW < 1 || cv.sh < 1
            || cv.sw < 1 || cv.dh < 1 || cv.dw < 1 || cv.pt < 0 || cv.pl < 0
            || (double)cv.C * (double)cv.KH * (double)cv.KW != (double)K || (double)cv.OH * (double)cv.OW > (double)M
            || M % (cv.OH * cv.OW)) {
            PyErr_SetString(PyExc_ValueError, "qgemm: conv (C, H, W, KH, KW, OH, OW, sh, sw, dh, dw, pt, pl) must "
                                              "have positive sizes, strides and dilations, pads not negative, "
                                              "K = KH * KW * C and OH * OW dividing M");
            return NULL;
        }
        cv.N = M / (cv.OH * cv.OW);
        cv.pad = (uint8_t)za; /* x's zero point as its byte: zeros after centering */
    }
    rc_sz sz = {NULL};
    const Py_ssize_t Np = qg_np(N), Kq = qg_kq(K);
    /* the AMX tiles (int8_amx.c) for a product of RC_AMX_QG_ROWS+ rows and 16+ groups of K: rows padded to 16 */
    const int amx = rc_qg_amx && !conv && M >= RC_AMX_QG_ROWS && Kq >= 16;
    const Py_ssize_t Mb = amx ? (M + 15) / 16 * 2 : (M + QG_MR - 1) / QG_MR;
    const Py_ssize_t an = conv ? sz_mul4(&sz, "X's size", cv.N, cv.C, cv.H, cv.W) : sz_mul(&sz, "A's size", M, K);
    const Py_ssize_t yn = sz_mul(&sz, "Y's size", M, N);
    const Py_ssize_t body = sz_mul3(&sz, "the packed size", Np, Kq, 4);
    const Py_ssize_t pn = sz_add(&sz, "the packed size", body, sz_mul(&sz, "the packed size", Np, 4));
    if (sz_check(&sz, "qgemm", PyExc_ValueError) < 0)
        return NULL;
    const Py_ssize_t apn = amx ? sz_mul3(&sz, "the packed rows", Mb, QG_MR, rc_amx_a_stride(Kq))
                               : sz_mul4(&sz, "the packed rows", Mb, Kq, QG_MR, 4);
    if (sz_check(&sz, "qgemm", PyExc_MemoryError) < 0)
        return NULL;
    Py_buffer v[6];
    const rc_buf spec[6] = {{ao, an, 1, 0, 0, "A"}, {po, pn, 1, 0, 0, "packed"}, {zbo, N, 4, 0, 1, "zb"},
                            {yo, yn, mode == 0 ? 4 : 1, 1, 0, "Y"}, {mo, N, RC_F32, 0, mode == 0, "mult"},
                            {bo, N, 4, 0, 1, "bias"}};
    if (get_buffers("qgemm", spec, v, 6) < 0)
        return NULL;
    int pth = threads;
    const int pparts = rc_parts((double)M * (double)K * 4.0, 2.5e5, Mb, &pth);
    /* the packed rows and their sums; with conv also X's NHWC copy and each part's block of rows */
    const size_t pbytes = ((size_t)apn + sizeof(int32_t) * (size_t)Mb * QG_MR + 63) & ~(size_t)63;
    const size_t xbytes = conv ? ((size_t)an + 63) & ~(size_t)63 : 0;
    const size_t abytes = pbytes + xbytes + (conv ? (size_t)pparts * QG_MR * (size_t)K : 0);
    int32_t *ap = (int32_t *)rc_work(abytes);
    int oom = ap == NULL;
    int32_t *rsum = ap ? (int32_t *)((uint8_t *)ap + apn) : NULL; /* A's row sums after its rows */
    qg_job j = {ap, rsum, (const int8_t *)v[1].buf,
                (const int32_t *)((const int8_t *)v[1].buf + body), (const int32_t *)v[2].buf, (const int32_t *)v[5].buf, (const float *)v[4].buf,
                v[3].buf, M, K, N, Kq, Mb, Np / QG_NR, Np / QG_NR * ((Mb + QG_RB - 1) / QG_RB), (int32_t)za + (asigned ? 128 : 0), bsigned ? 0 : 128, yz, yP, mode};
    if (!oom) {
        const uint8_t *a = (const uint8_t *)v[0].buf;
        Py_BEGIN_ALLOW_THREADS
        qg_pack_job pj = {a, ap, rsum, M, K, Kq, Mb, asigned ? 0x80808080u : 0u, NULL, NULL};
        j.lda = amx ? rc_amx_a_stride(Kq) : 0;
        if (conv) {
            cv.x = a;
            cv.xt = (uint8_t *)ap + pbytes;
            cv.tblocks = (cv.H * cv.W + QI_TBLOCK - 1) / QI_TBLOCK;
            int tth = threads;
            { /* rc_parts may lower tth: called before tth is read */
                int parts_ = rc_parts((double)an, 2.5e5, cv.N * cv.tblocks, &tth);
                rc_parallel(qi_nhwc_part, &cv, parts_, tth);
            }
            pj.conv = &cv;
            pj.rows = cv.xt + xbytes;
        }
        rc_parallel(amx ? qg_pack_amx_part : qg_pack_part, &pj, pparts, pth);
        const int parts = rc_parts_fine(2.0 * (double)M * (double)K * (double)N, 2.5e5, j.nunits, &threads);
        rc_parallel(amx ? qg_part_amx : qg_part, &j, parts, threads);
        Py_END_ALLOW_THREADS
        rc_work_done(ap, abytes);
    }
    release_buffers(v, 6);
    if (oom)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* ---- a convolution as W (M x K) times an image's K x P bytes, Y in NCHW planes ----------
 * The weight takes A's place (its rows packed per call: M x K is 1/P of the product) and the
 * image (a pointwise convolution's planes, or K x P im2col rows) B's, packed per call from its
 * rows: four K rows interleaved into the VNNI groups, no transpose; a tile's 8 x 32 results are
 * 8 output channels x 32 pixels, stored as runs of a plane. */

typedef struct {
    const uint8_t *b;   /* N x K x P bytes */
    int8_t *bp;         /* N x (Np / 16) panels of Kq x 16 x 4, as signed bytes */
    int32_t *cs;        /* N x Np column sums of the signed bytes */
    Py_ssize_t N, K, P, Kq, Np;
    uint8_t flip;       /* 0x80 for a u8 B: stored as b - 128 */
} qc_bpack_job;

/* a part's share of the (image, 16-pixel panel) pairs: four rows of 16 bytes interleaved into
 * 16 columns of 4 bytes (byte unpacks), sums per column */
RC_CLONES static void qc_bpack_part(void *arg, int part, int parts)
{
    const qc_bpack_job *j = (const qc_bpack_job *)arg;
    const Py_ssize_t np = j->Np / 16, units = j->N * np;
    const Py_ssize_t u0 = units * part / parts, u1 = units * (part + 1) / parts;
    for (Py_ssize_t u = u0; u < u1; u++) {
        const Py_ssize_t n = u / np, p0 = (u % np) * 16;
        const uint8_t *src = j->b + n * j->K * j->P + p0;
        int8_t *dst = j->bp + n * np * j->Kq * 64 + (p0 / 16) * j->Kq * 64;
        int32_t *cs = j->cs + n * j->Np + p0;
        const Py_ssize_t pp = j->P - p0 < 16 ? j->P - p0 : 16;
        int32_t s[16] = {0};
#if RC_SSE2
        /* the full groups' column sums in vectors: the 4 rows' bytes sign-extended to int16 and
         * added, then widened into 4 x 4 int32 sums (pixels 0-3, 4-7, 8-11, 12-15) */
        __m128i sv[4] = {_mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128()};
#endif
        for (Py_ssize_t q = 0; q < j->Kq; q++) {
            int8_t *d = dst + q * 64;
#if RC_SSE2
            if (pp == 16 && 4 * q + 4 <= j->K) {
                const __m128i fl = _mm_set1_epi8((char)j->flip);
                const uint8_t *r = src + 4 * q * j->P;
                const __m128i r0 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)r), fl);
                const __m128i r1 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(r + j->P)), fl);
                const __m128i r2 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(r + 2 * j->P)), fl);
                const __m128i r3 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(r + 3 * j->P)), fl);
                const __m128i a = _mm_unpacklo_epi8(r0, r1), b = _mm_unpackhi_epi8(r0, r1);
                const __m128i c = _mm_unpacklo_epi8(r2, r3), e = _mm_unpackhi_epi8(r2, r3);
                _mm_storeu_si128((__m128i *)d, _mm_unpacklo_epi16(a, c));
                _mm_storeu_si128((__m128i *)(d + 16), _mm_unpackhi_epi16(a, c));
                _mm_storeu_si128((__m128i *)(d + 32), _mm_unpacklo_epi16(b, e));
                _mm_storeu_si128((__m128i *)(d + 48), _mm_unpackhi_epi16(b, e));
#define QC_SX16(v, lohi) _mm_srai_epi16(_mm_unpack##lohi##_epi8(v, v), 8)
                const __m128i tl = _mm_add_epi16(_mm_add_epi16(QC_SX16(r0, lo), QC_SX16(r1, lo)),
                                                 _mm_add_epi16(QC_SX16(r2, lo), QC_SX16(r3, lo)));
                const __m128i th = _mm_add_epi16(_mm_add_epi16(QC_SX16(r0, hi), QC_SX16(r1, hi)),
                                                 _mm_add_epi16(QC_SX16(r2, hi), QC_SX16(r3, hi)));
#undef QC_SX16
                sv[0] = _mm_add_epi32(sv[0], _mm_srai_epi32(_mm_unpacklo_epi16(tl, tl), 16));
                sv[1] = _mm_add_epi32(sv[1], _mm_srai_epi32(_mm_unpackhi_epi16(tl, tl), 16));
                sv[2] = _mm_add_epi32(sv[2], _mm_srai_epi32(_mm_unpacklo_epi16(th, th), 16));
                sv[3] = _mm_add_epi32(sv[3], _mm_srai_epi32(_mm_unpackhi_epi16(th, th), 16));
                continue;
            }
#endif
            for (int i = 0; i < 16; i++)
                for (int k = 0; k < 4; k++) {
                    const Py_ssize_t kk = 4 * q + k;
                    const int8_t v = i < pp && kk < j->K ? (int8_t)(src[kk * j->P + i] ^ j->flip) : 0;
                    d[i * 4 + k] = v;
                    s[i] += v;
                }
        }
#if RC_SSE2
        for (int h = 0; h < 4; h++) {
            int32_t t[4];
            _mm_storeu_si128((__m128i *)t, sv[h]);
            for (int i = 0; i < 4; i++)
                s[4 * h + i] += t[i];
        }
#endif
        memcpy(cs, s, sizeof s);
    }
}

typedef struct {
    const int32_t *ap;  /* the weight's rows packed: [Mb][Kq][8] unsigned byte groups */
    const int32_t *rt;  /* per output channel: K ZA ZB - ZB rowsum + bias (wrapping) */
    const uint32_t *za; /* per output channel: its zero point plus A's offset */
    const int8_t *bp;
    const int32_t *cs;
    const float *mult;
    uint8_t *y;          /* N x M x P */
    Py_ssize_t N, M, K, P, Kq, Mb, Np, ncols, nunits;
    int yz, ysigned;
    int za_same; /* every row's za is za[0] (symmetric weights): za * cs once a tile */
} qc_job;

/* rows [m0, m0 + mm) x pixels [p0, p0 + pp) of one image's Y from the raw sums c */
RC_CLONES static void qc_epilogue(const qc_job *j, const int32_t *restrict c, const int32_t *restrict cs,
                                  uint8_t *restrict y, Py_ssize_t m0, Py_ssize_t mm, Py_ssize_t pp)
{
    const float yz = (float)j->yz, lo = j->ysigned ? -128.0f : 0.0f, hi = j->ysigned ? 127.0f : 255.0f;
    for (Py_ssize_t r = 0; r < mm; r++) {
        const Py_ssize_t m = m0 + r;
        const uint32_t rt = (uint32_t)j->rt[m], za = j->za[m];
        const float mu = j->mult[m];
        const uint32_t *restrict cr = (const uint32_t *)c + r * QG_NR;
        uint8_t t8[QG_NR];
        for (int n = 0; n < QG_NR; n++) {
            float t = rintf((float)(int32_t)(cr[n] + rt - za * (uint32_t)cs[n]) * mu) + yz;
            t = t > lo ? t : lo;
            t = t < hi ? t : hi;
            t8[n] = j->ysigned ? (uint8_t)(int8_t)(int32_t)t : (uint8_t)(int32_t)t;
        }
        memcpy(y + m * j->P, t8, (size_t)pp);
    }
}

#if QG_X86
/* qc_epilogue on AVX-512 (the VNNI path's CPUs): 16 pixels a vector, converted with the default
 * round-to-nearest-even (rintf's), the product clamped first so the conversion cannot overflow;
 * the same bytes as qc_epilogue */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
qc_epilogue_avx512(const qc_job *j, const int32_t *restrict c, const int32_t *restrict cs, uint8_t *restrict y,
                   Py_ssize_t m0, Py_ssize_t mm, Py_ssize_t pp)
{
    /* clamped to [lo - yz, hi - yz] before the rounding: the bounds are integers, so this is
     * rint-then-clamp, and rint(f) + yz then lies in [lo, hi] with no clamp after it */
    const float fyz = (float)j->yz;
    const __m512 flo = _mm512_set1_ps((j->ysigned ? -128.0f : 0.0f) - fyz);
    const __m512 fhi = _mm512_set1_ps((j->ysigned ? 127.0f : 255.0f) - fyz);
    const __m512i yz = _mm512_set1_epi32(j->yz);
    const __m512i cs0 = _mm512_loadu_si512((const void *)cs), cs1 = _mm512_loadu_si512((const void *)(cs + 16));
    const __m512i za0 = _mm512_set1_epi32((int32_t)j->za[m0]);
    const __m512i zc0 = _mm512_mullo_epi32(za0, cs0), zc1 = _mm512_mullo_epi32(za0, cs1);
    const __mmask16 k0 = pp >= 16 ? 0xffff : (__mmask16)((1u << pp) - 1);
    const __mmask16 k1 = pp >= 32 ? 0xffff : pp <= 16 ? 0 : (__mmask16)((1u << (pp - 16)) - 1);
    for (Py_ssize_t r = 0; r < mm; r++) {
        const Py_ssize_t m = m0 + r;
        const __m512i rt = _mm512_set1_epi32(j->rt[m]), za = _mm512_set1_epi32((int32_t)j->za[m]);
        const __m512 mu = _mm512_set1_ps(j->mult[m]);
        uint8_t *yr = y + m * j->P;
        for (int h = 0; h < 2; h++) {
            const __m512i zc = j->za_same ? (h ? zc1 : zc0) : _mm512_mullo_epi32(za, h ? cs1 : cs0);
            const __m512i acc = _mm512_sub_epi32(
                _mm512_add_epi32(_mm512_load_si512((const void *)(c + r * QG_NR + 16 * h)), rt), zc);
            __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), mu);
            f = _mm512_min_ps(_mm512_max_ps(f, flo), fhi);
            const __m512i q = _mm512_add_epi32(_mm512_cvtps_epi32(f), yz);
            _mm_mask_storeu_epi8(yr + 16 * h, h ? k1 : k0, _mm512_cvtepi32_epi8(q));
        }
    }
}
#endif

static void qc_part(void *arg, int part, int parts)
{
    const qc_job *j = (const qc_job *)arg;
    int32_t c[QG_MR * QG_NR] __attribute__((aligned(64)));
    const Py_ssize_t u0 = j->nunits * part / parts, u1 = j->nunits * (part + 1) / parts;
    const Py_ssize_t per_image = j->nunits / j->N;
    for (Py_ssize_t u = u0; u < u1; u++) {
        /* a unit: one image's 32-pixel tile column x up to QG_RB row blocks of the weight */
        const Py_ssize_t n = u / per_image, v = u % per_image;
        const Py_ssize_t p0 = (v % j->ncols) * QG_NR, rb0 = (v / j->ncols) * QG_RB;
        const Py_ssize_t rb1 = rb0 + QG_RB < j->Mb ? rb0 + QG_RB : j->Mb;
        const int8_t *b0 = j->bp + n * j->Np * j->Kq * 4 + (p0 / 16) * j->Kq * 64, *b1 = b0 + j->Kq * 64;
        const int32_t *cs = j->cs + n * j->Np + p0;
        const Py_ssize_t pp = j->P - p0 < QG_NR ? j->P - p0 : QG_NR;
        uint8_t *y = j->y + n * j->M * j->P + p0;
        for (Py_ssize_t mb = rb0; mb < rb1; mb++) {
            const int32_t *ap = j->ap + mb * j->Kq * QG_MR;
            qg_tile(ap, b0, b1, j->Kq, c);
            const Py_ssize_t m0 = mb * QG_MR, mm = j->M - m0 < QG_MR ? j->M - m0 : QG_MR;
#if QG_X86
            if (qg_path == QG_VNNI512)
                qc_epilogue_avx512(j, c, cs, y, m0, mm, pp);
            else
#endif
                qc_epilogue(j, c, cs, y, m0, mm, pp);
        }
    }
}

/* qconv_nchw(b, b_signed, bz, w, w_signed, wz, y, (N, M, K, P), mult, bias, y_signed, yz, threads):
 * Y[n][m][p] = saturate(rint((sum_k (w[m][k] - wz[m])(b[n][k][p] - bz) + bias[m]) * mult[m]) + yz),
 * the numpy path's arithmetic bit for bit (int32 sums wrapping); wz and bias may be None */
PyObject *rc_py_qconv_nchw(PyObject *self, PyObject *args)
{
    PyObject *bo, *wo, *wzo, *yo, *mo, *biaso;
    Py_ssize_t N, M, K, P;
    int bsigned, bz, wsigned, ysigned, yz, threads;
    if (!PyArg_ParseTuple(args, "OpiOpOO(nnnn)OOpii:qconv_nchw", &bo, &bsigned, &bz, &wo, &wsigned, &wzo, &yo, &N,
                          &M, &K, &P, &mo, &biaso, &ysigned, &yz, &threads))
        return NULL;
    if (N < 1 || M < 1 || K < 1 || P < 1) {
        PyErr_SetString(PyExc_ValueError, "qconv_nchw: sizes must be positive");
        return NULL;
    }
    rc_sz sz = {NULL};
    const Py_ssize_t Mb = (M + QG_MR - 1) / QG_MR, Kq = qg_kq(K), Np = qg_np(P);
    const Py_ssize_t bn = sz_mul3(&sz, "B's size", N, K, P), wn = sz_mul(&sz, "W's size", M, K);
    const Py_ssize_t yn = sz_mul3(&sz, "Y's size", N, M, P);
    if (sz_check(&sz, "qconv_nchw", PyExc_ValueError) < 0)
        return NULL;
    const Py_ssize_t apn = sz_mul4(&sz, "the packed weight", Mb, Kq, QG_MR, 4);
    const Py_ssize_t bpn = sz_mul4(&sz, "the packed image", N, Np, Kq, 4);
    const Py_ssize_t csn = sz_mul(&sz, "the column sums", N, Np);
    if (sz_check(&sz, "qconv_nchw", PyExc_MemoryError) < 0)
        return NULL;
    Py_buffer v[6];
    const rc_buf spec[6] = {{bo, bn, 1, 0, 0, "B"}, {wo, wn, 1, 0, 0, "W"}, {wzo, M, 4, 0, 1, "wz"},
                            {yo, yn, 1, 1, 0, "Y"}, {mo, M, RC_F32, 0, 0, "mult"}, {biaso, M, 4, 0, 1, "bias"}};
    if (get_buffers("qconv_nchw", spec, v, 6) < 0)
        return NULL;
    /* the packed weight, its row sums, rt and za per row, the packed image and its column sums */
    const size_t abytes = (size_t)apn + 4 * (size_t)(3 * Mb * QG_MR) + (size_t)bpn + 4 * (size_t)csn;
    int32_t *ap = (int32_t *)rc_work(abytes);
    if (ap == NULL) {
        release_buffers(v, 6);
        return PyErr_NoMemory();
    }
    int32_t *rs = ap + Mb * Kq * QG_MR, *rt = rs + Mb * QG_MR;
    uint32_t *za = (uint32_t *)(rt + Mb * QG_MR);
    int8_t *bp = (int8_t *)(za + Mb * QG_MR);
    int32_t *cs = (int32_t *)(bp + bpn);
    const int32_t *wz = (const int32_t *)v[2].buf, *bias = (const int32_t *)v[5].buf;
    Py_BEGIN_ALLOW_THREADS
    qg_pack_job pa = {(const uint8_t *)v[1].buf, ap, rs, M, K, Kq, Mb, wsigned ? 0x80808080u : 0u};
    int pth = threads;
    { /* rc_parts may lower pth: called before pth is read */
        int parts_ = rc_parts((double)M * (double)K * 4.0, 2.5e5, Mb, &pth);
        rc_parallel(qg_pack_part, &pa, parts_, pth);
    }
    /* B's bytes are stored as b - ob, A's as a + oa: ZB = bz - ob, ZA = wz + oa */
    const uint32_t ZB = (uint32_t)(bz - (bsigned ? 0 : 128)), Ku = (uint32_t)K;
    for (Py_ssize_t m = 0; m < M; m++) {
        za[m] = (uint32_t)((wz ? wz[m] : 0) + (wsigned ? 128 : 0));
        rt[m] = (int32_t)(Ku * za[m] * ZB - ZB * (uint32_t)rs[m] + (bias ? (uint32_t)bias[m] : 0u));
    }
    qc_bpack_job pb = {(const uint8_t *)v[0].buf, bp, cs, N, K, P, Kq, Np, bsigned ? 0 : 0x80};
    pth = threads;
    { /* rc_parts may lower pth: called before pth is read */
        int parts_ = rc_parts((double)bn * 4.0, 2.5e5, N * (Np / 16), &pth);
        rc_parallel(qc_bpack_part, &pb, parts_, pth);
    }
    const Py_ssize_t ncols = Np / QG_NR, nunits = N * ncols * ((Mb + QG_RB - 1) / QG_RB);
    qc_job j = {ap, rt, za, bp, cs, (const float *)v[4].buf, (uint8_t *)v[3].buf, N, M, K, P, Kq, Mb, Np, ncols,
                nunits, yz, ysigned};
    j.za_same = 1;
    for (Py_ssize_t m = 1; m < M; m++)
        j.za_same &= za[m] == za[0];
    const int parts = rc_parts_fine(2.0 * (double)N * (double)M * (double)K * (double)P, 2.5e5, nunits, &threads);
    rc_parallel(qc_part, &j, parts, threads);
    Py_END_ALLOW_THREADS
    rc_work_done(ap, abytes);
    release_buffers(v, 6);
    Py_RETURN_NONE;
}

static void qt_image(const uint8_t *restrict x, uint8_t *restrict y, Py_ssize_t C, Py_ssize_t P)
{
    qt_range(x, y, C, P, 0, P);
}

/* qtranspose(x, y, (N, C, P)): N images of C planes of P bytes into N x P x C */
PyObject *rc_py_qtranspose(PyObject *self, PyObject *args)
{
    PyObject *xo, *yo;
    Py_ssize_t N, C, P;
    if (!PyArg_ParseTuple(args, "OO(nnn):qtranspose", &xo, &yo, &N, &C, &P))
        return NULL;
    if (N < 1 || C < 1 || P < 1) {
        PyErr_SetString(PyExc_ValueError, "qtranspose: sizes must be positive");
        return NULL;
    }
    rc_sz sz = {NULL};
    const Py_ssize_t n = sz_mul3(&sz, "the size", N, C, P);
    if (sz_check(&sz, "qtranspose", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[2];
    const rc_buf spec[2] = {{xo, n, 1, 0, 0, "x"}, {yo, n, 1, 1, 0, "y"}};
    if (get_buffers("qtranspose", spec, v, 2) < 0)
        return NULL;
    const uint8_t *x = (const uint8_t *)v[0].buf;
    uint8_t *y = (uint8_t *)v[1].buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < N; i++)
        qt_image(x + i * C * P, y + i * C * P, C, P);
    Py_END_ALLOW_THREADS
    release_buffers(v, 2);
    Py_RETURN_NONE;
}

/* im2col of NCHW bytes as K x P rows for qconv_nchw: row (c, kh, kw) of an image holds that tap
 * of every output pixel, taps outside the image the pad byte (x's zero point) */
static void qk_part(void *arg, int part, int parts)
{
    const qi_job *j = (const qi_job *)arg;
    const Py_ssize_t K = j->C * j->KH * j->KW, rows = j->N * K, P = j->OH * j->OW;
    const Py_ssize_t r0 = rows * part / parts, r1 = rows * (part + 1) / parts;
    for (Py_ssize_t r = r0; r < r1; r++) {
        const Py_ssize_t n = r / K, k = r % K, c = k / (j->KH * j->KW), i = k / j->KW % j->KH, t = k % j->KW;
        const uint8_t *xp = j->x + (n * j->C + c) * j->H * j->W;
        uint8_t *d = j->cols + r * P;
        for (Py_ssize_t oh = 0; oh < j->OH; oh++, d += j->OW) {
            const Py_ssize_t ih = oh * j->sh - j->pt + i * j->dh;
            if (ih < 0 || ih >= j->H) {
                memset(d, j->pad, (size_t)j->OW);
                continue;
            }
            const uint8_t *xr = xp + ih * j->W;
            const Py_ssize_t iw0 = t * j->dw - j->pl, sw = j->sw;
            /* outputs [lo, hi) read inside the row, the rest is padding */
            Py_ssize_t lo = iw0 < 0 ? (-iw0 + sw - 1) / sw : 0, hi = iw0 < j->W ? (j->W - 1 - iw0) / sw + 1 : 0;
            lo = lo < j->OW ? lo : j->OW;
            hi = hi < j->OW ? hi : j->OW;
            hi = hi > lo ? hi : lo;
            memset(d, j->pad, (size_t)lo);
            memset(d + hi, j->pad, (size_t)(j->OW - hi));
            const uint8_t *xs = xr + iw0;
            Py_ssize_t ow = lo;
            if (sw == 1) {
                memcpy(d + lo, xs + lo, (size_t)(hi - lo));
                continue;
            }
#if RC_SSE2
            if (sw == 2) { /* the even bytes of 32: 16 taps a step, reads kept inside the row */
                const __m128i even = _mm_set1_epi16(0x00ff);
                for (; ow + 16 <= hi && iw0 + 2 * ow + 32 <= j->W; ow += 16) {
                    const __m128i a = _mm_loadu_si128((const __m128i *)(xs + 2 * ow));
                    const __m128i b = _mm_loadu_si128((const __m128i *)(xs + 2 * ow + 16));
                    _mm_storeu_si128((__m128i *)(d + ow),
                                     _mm_packus_epi16(_mm_and_si128(a, even), _mm_and_si128(b, even)));
                }
            }
#endif
            for (; ow < hi; ow++)
                d[ow] = xs[ow * sw];
        }
    }
}

/* qim2col and qim2col_rows: (x, cols, (N, C, H, W), (KH, KW), (OH, OW), (sh, sw), (dh, dw),
 * (pt, pl), pad, threads); pixel rows (qi_part) or K x P tap rows (qk_part, see there) */
static PyObject *qim2col_call(PyObject *args, const char *name, int taps)
{
    PyObject *xo, *co;
    int pad, threads;
    qi_job j;
    memset(&j, 0, sizeof j);
    if (!PyArg_ParseTuple(args, "OO(nnnn)(nn)(nn)(nn)(nn)(nn)ii", &xo, &co, &j.N, &j.C, &j.H, &j.W, &j.KH, &j.KW,
                          &j.OH, &j.OW, &j.sh, &j.sw, &j.dh, &j.dw, &j.pt, &j.pl, &pad, &threads))
        return NULL;
    if (j.N < 1 || j.C < 1 || j.H < 1 || j.W < 1 || j.KH < 1 || j.KW < 1 || j.OH < 1 || j.OW < 1 || j.sh < 1
        || j.sw < 1 || j.dh < 1 || j.dw < 1 || j.pt < 0 || j.pl < 0 || pad < -128 || pad > 255) {
        PyErr_Format(PyExc_ValueError, "%s: sizes, strides and dilations must be positive, pads not negative and "
                                       "the pad a byte", name);
        return NULL;
    }
    rc_sz sz = {NULL};
    const Py_ssize_t xn = sz_mul4(&sz, "X's size", j.N, j.C, j.H, j.W);
    const Py_ssize_t cn = sz_mul(&sz, "the rows' size", sz_mul3(&sz, "the rows' size", j.N, j.OH, j.OW),
                                 sz_mul3(&sz, "the rows' size", j.KH, j.KW, j.C));
    if (sz_check(&sz, name, PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[2];
    const rc_buf spec[2] = {{xo, xn, 1, 0, 0, "x"}, {co, cn, 1, 1, 0, "cols"}};
    if (get_buffers(name, spec, v, 2) < 0)
        return NULL;
    j.x = (const uint8_t *)v[0].buf;
    j.cols = (uint8_t *)v[1].buf;
    j.pad = (uint8_t)pad;
    int oom = 0;
    Py_BEGIN_ALLOW_THREADS
    if (!taps) {
        j.xt = (uint8_t *)rc_work((size_t)xn);
        oom = j.xt == NULL;
        if (!oom) {
            j.tblocks = (j.H * j.W + QI_TBLOCK - 1) / QI_TBLOCK;
            int tth = threads;
            { /* rc_parts may lower tth: called before tth is read */
                int parts_ = rc_parts((double)xn, 2.5e5, j.N * j.tblocks, &tth);
                rc_parallel(qi_nhwc_part, &j, parts_, tth);
            }
        }
    }
    if (!oom) {
        const int parts = rc_parts((double)cn, 2.5e5, taps ? j.N * j.C * j.KH * j.KW : j.N * j.OH, &threads);
        rc_parallel(taps ? qk_part : qi_part, &j, parts, threads);
    }
    if (j.xt)
        rc_work_done(j.xt, (size_t)xn);
    Py_END_ALLOW_THREADS
    release_buffers(v, 2);
    if (oom)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

PyObject *rc_py_qim2col(PyObject *self, PyObject *args)
{
    (void)self;
    return qim2col_call(args, "qim2col", 0);
}

PyObject *rc_py_qim2col_rows(PyObject *self, PyObject *args)
{
    (void)self;
    return qim2col_call(args, "qim2col_rows", 1);
}

/* y = saturate(rint(ta[a] + tb[b] + zc)): QLinearAdd of same-shaped bytes through the per-code
 * float32 tables of (a - za) * ra and (b - zb) * rb (the numpy path's products, so the sums and
 * roundings are its own, bit for bit) */
RC_CLONES static void qa_apply(const uint8_t *restrict a, const uint8_t *restrict b, const float *restrict ta,
                               const float *restrict tb, float zc, float lo, float hi, int ysigned,
                               uint8_t *restrict y, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        float t = ta[a[i]] + tb[b[i]];
        t = rintf(t + zc);
        t = t > lo ? t : lo;
        t = t < hi ? t : hi;
        y[i] = ysigned ? (uint8_t)(int8_t)(int32_t)t : (uint8_t)(int32_t)t;
    }
}

#if QG_X86
/* qa_apply's first n / 16 * 16 items on AVX-512, 16 a step, where the tables are known to be
 * (code - z) * r in float32 (checked by the caller): the same products computed in the lanes, then
 * the same float32 sum, rounding (to nearest even) and clamps. The scalar loop's table reads are not
 * vectorized (1.6 ns an item: a ResNet's residual sums cost a tenth of its convs); gathers from the
 * tables were slower than it on Zen 4 (providers/cpu/docs/performance.md) */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static Py_ssize_t
qa_apply_avx512(const uint8_t *restrict a, const uint8_t *restrict b, const float *aff, float zc, float lo,
                float hi, int ysigned, uint8_t *restrict y, Py_ssize_t n)
{
    const __m512 ra = _mm512_set1_ps(aff[0]), rb = _mm512_set1_ps(aff[2]), vz = _mm512_set1_ps(zc);
    const __m512 vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
    const __m512i za = _mm512_set1_epi32((int32_t)aff[1]), zb = _mm512_set1_epi32((int32_t)aff[3]);
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m128i ba = _mm_loadu_si128((const __m128i *)(a + i)), bb = _mm_loadu_si128((const __m128i *)(b + i));
        const __m512i ia = ysigned ? _mm512_cvtepi8_epi32(ba) : _mm512_cvtepu8_epi32(ba);
        const __m512i ib = ysigned ? _mm512_cvtepi8_epi32(bb) : _mm512_cvtepu8_epi32(bb);
        /* products rounded on their own, as the tables hold them: GCC would contract a plain
         * _mm512_mul_ps into the sum's FMA (-ffp-contract=fast) and round ties the other way */
        const __m512 fa = _mm512_mul_round_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(ia, za)), ra,
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512 fb = _mm512_mul_round_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(ib, zb)), rb,
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512 t = _mm512_roundscale_ps(_mm512_add_ps(_mm512_add_ps(fa, fb), vz),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        t = _mm512_min_ps(_mm512_max_ps(t, vlo), vhi);
        /* in [lo, hi]: the low byte of the int32 is the code, signed or not */
        _mm_storeu_si128((__m128i *)(y + i), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(t)));
    }
    return i;
}
#endif

/* whether ta[c] == (code(c) - za) * ra and tb likewise for every byte c (code(c): c as the signed or
 * unsigned type), in float32 as the tables were built: then the vector loop may compute them */
static int qa_tables_affine(const float *ta, const float *tb, const float *aff, int ysigned)
{
    for (int c = 0; c < 256; c++) {
        const int32_t code = ysigned ? (int32_t)(int8_t)(uint8_t)c : c;
        const float x = (float)(code - (int32_t)aff[1]) * aff[0], w = (float)(code - (int32_t)aff[3]) * aff[2];
        if (memcmp(&x, ta + c, 4) || memcmp(&w, tb + c, 4))
            return 0;
    }
    return 1;
}

typedef struct {
    const uint8_t *a, *b;
    const float *ta, *tb;
    uint8_t *y;
    Py_ssize_t n;
    float zc;
    int ysigned;
    float aff[4]; /* ra, za, rb, zb: the tables' affine form */
    int affine;   /* the tables are it (qa_tables_affine) */
} qa_job;

static void qa_part(void *arg, int part, int parts)
{
    const qa_job *j = (const qa_job *)arg;
    Py_ssize_t i0 = j->n * part / parts;
    const Py_ssize_t i1 = j->n * (part + 1) / parts;
#if QG_X86
    if (rc_conv_fast && j->affine)
        i0 += qa_apply_avx512(j->a + i0, j->b + i0, j->aff, j->zc, j->ysigned ? -128.0f : 0.0f,
                              j->ysigned ? 127.0f : 255.0f, j->ysigned, j->y + i0, i1 - i0);
#endif
    qa_apply(j->a + i0, j->b + i0, j->ta, j->tb, j->zc, j->ysigned ? -128.0f : 0.0f, j->ysigned ? 127.0f : 255.0f,
             j->ysigned, j->y + i0, i1 - i0);
}

/* qadd_lut(a, b, ta, tb, zc, y, y_signed, n, threads); a and b indexed as unsigned bytes (an
 * int8 code c at table index c & 255) */
PyObject *rc_py_qadd_lut(PyObject *self, PyObject *args)
{
    PyObject *ao, *bo, *tao, *tbo, *yo, *affo = Py_None;
    float zc;
    int ysigned, threads;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OOOOfOpni|O:qadd_lut", &ao, &bo, &tao, &tbo, &zc, &yo, &ysigned, &n, &threads,
                          &affo))
        return NULL;
    float aff[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int za = 0, zb = 0;
    if (affo != Py_None && !PyArg_ParseTuple(affo, "fifi:qadd_lut affine", &aff[0], &za, &aff[2], &zb))
        return NULL;
    if (za < -255 || za > 255 || zb < -255 || zb > 255) {
        PyErr_SetString(PyExc_ValueError, "qadd_lut: the zero points must be 8-bit codes");
        return NULL;
    }
    aff[1] = (float)za;
    aff[3] = (float)zb;
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "qadd_lut: size must be positive");
        return NULL;
    }
    Py_buffer v[5];
    const rc_buf spec[5] = {{ao, n, 1, 0, 0, "a"}, {bo, n, 1, 0, 0, "b"}, {tao, 256, RC_F32, 0, 0, "ta"},
                            {tbo, 256, RC_F32, 0, 0, "tb"}, {yo, n, 1, 1, 0, "y"}};
    if (get_buffers("qadd_lut", spec, v, 5) < 0)
        return NULL;
    qa_job j = {(const uint8_t *)v[0].buf, (const uint8_t *)v[1].buf, (const float *)v[2].buf,
                (const float *)v[3].buf, (uint8_t *)v[4].buf, n, zc, ysigned, {aff[0], aff[1], aff[2], aff[3]}, 0};
    j.affine = affo != Py_None && qa_tables_affine(j.ta, j.tb, aff, ysigned);
    Py_BEGIN_ALLOW_THREADS
    const int parts = rc_parts((double)n * 4.0, 2.5e5, (n + 4095) / 4096, &threads);
    rc_parallel(qa_part, &j, parts, threads);
    Py_END_ALLOW_THREADS
    release_buffers(v, 5);
    Py_RETURN_NONE;
}

/* y = saturate(rint(x / scale) + zp), NaN -> 0: per-tensor QuantizeLinear of float32 to 8 bits,
 * the numpy path's float32 steps (a true division, then the rounding, the zero point, the clip) */
RC_CLONES static void qq_apply(const float *restrict x, uint8_t *restrict y, Py_ssize_t n, float scale, float zp,
                               float lo, float hi, int ysigned)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        float t = rintf(x[i] / scale) + zp;
        t = t > lo ? t : lo;
        t = t < hi ? t : hi;
        t = x[i] != x[i] ? 0.0f : t;
        y[i] = ysigned ? (uint8_t)(int8_t)(int32_t)t : (uint8_t)(int32_t)t;
    }
}

typedef struct {
    const float *x;
    uint8_t *y;
    Py_ssize_t n;
    float scale, zp;
    int ysigned;
} qq_job;

static void qq_part(void *arg, int part, int parts)
{
    const qq_job *j = (const qq_job *)arg;
    const Py_ssize_t i0 = j->n * part / parts, i1 = j->n * (part + 1) / parts;
    qq_apply(j->x + i0, j->y + i0, i1 - i0, j->scale, j->zp, j->ysigned ? -128.0f : 0.0f,
             j->ysigned ? 127.0f : 255.0f, j->ysigned);
}

/* qquantize(x, y, n, scale, zp, y_signed, threads) */
PyObject *rc_py_qquantize(PyObject *self, PyObject *args)
{
    PyObject *xo, *yo;
    Py_ssize_t n;
    float scale;
    int zp, ysigned, threads;
    if (!PyArg_ParseTuple(args, "OOnfipi:qquantize", &xo, &yo, &n, &scale, &zp, &ysigned, &threads))
        return NULL;
    if (n < 1 || zp < (ysigned ? -128 : 0) || zp > (ysigned ? 127 : 255)) {
        PyErr_SetString(PyExc_ValueError, "qquantize: size must be positive and the zero point in the output type");
        return NULL;
    }
    Py_buffer v[2];
    const rc_buf spec[2] = {{xo, n, RC_F32, 0, 0, "x"}, {yo, n, 1, 1, 0, "y"}};
    if (get_buffers("qquantize", spec, v, 2) < 0)
        return NULL;
    qq_job j = {(const float *)v[0].buf, (uint8_t *)v[1].buf, n, scale, (float)zp, ysigned};
    Py_BEGIN_ALLOW_THREADS
    const int parts = rc_parts((double)n * 8.0, 2.5e5, (n + 4095) / 4096, &threads);
    rc_parallel(qq_part, &j, parts, threads);
    Py_END_ALLOW_THREADS
    release_buffers(v, 2);
    Py_RETURN_NONE;
}

/* qgemm_path(force=-1) -> the inner loop's name; force (0 portable, 1 avx2, 2 avx512vnni, 3 avxvnni,
 * 4 vnni256-evex) sets it where this CPU runs it, else (9, say) the one dispatch picks: tests reach
 * every loop this machine runs, and see by the name returned whether they got it */
PyObject *rc_py_qgemm_path(PyObject *self, PyObject *args)
{
    int force = -1;
    if (!PyArg_ParseTuple(args, "|i:qgemm_path", &force))
        return NULL;
    if (force >= 0) {
        rc_int8_init();
        if (force < QG_NPATHS && qg_runs(force))
            qg_path = force;
    }
    return PyUnicode_FromString(QG_NAMES[qg_path]);
}

/* qgemm_dispatch(avx512vnni, avx_vnni, avx2) -> the loop dispatch would pick on a CPU with these
 * flags (avx512vnni: with AVX-512 BW), so that tests check the order for CPUs not here */
PyObject *rc_py_qgemm_dispatch(PyObject *self, PyObject *args)
{
    int vnni512, avx_vnni, avx2;
    if (!PyArg_ParseTuple(args, "ppp:qgemm_dispatch", &vnni512, &avx_vnni, &avx2))
        return NULL;
    return PyUnicode_FromString(QG_NAMES[qg_choose(vnni512, avx_vnni, avx2)]);
}

/* the range of n floats with 0 in it, 16 lanes at a time (vectorized in the clones); NaNs are
 * left out of it (a comparison with NaN is false), as onnxruntime does */
RC_CLONES void rc_dq_range(const float *restrict x, Py_ssize_t n, float *lo_out, float *hi_out)
{
    float lo[16] = {0}, hi[16] = {0};
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) {
            const float t = x[i + l];
            lo[l] = t < lo[l] ? t : lo[l];
            hi[l] = t > hi[l] ? t : hi[l];
        }
    for (int l = 0; i + l < n; l++) {
        const float t = x[i + l];
        lo[l] = t < lo[l] ? t : lo[l];
        hi[l] = t > hi[l] ? t : hi[l];
    }
    float a = 0.0f, b = 0.0f;
    for (int l = 0; l < 16; l++) {
        a = lo[l] < a ? lo[l] : a;
        b = hi[l] > b ? hi[l] : b;
    }
    *lo_out = a;
    *hi_out = b;
}

/* y = saturate(rint(x / scale) + zp) as uint8, NaN -> 0 (onnxruntime's saturation of it; the
 * numpy path's float32 steps) */
RC_CLONES void rc_dq_apply(const float *restrict x, uint8_t *restrict y, Py_ssize_t n, float scale, float zpf)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        float t = rintf(x[i] / scale) + zpf;
        t = t != t ? 0.0f : t;
        t = t < 0.0f ? 0.0f : (t > 255.0f ? 255.0f : t);
        y[i] = (uint8_t)(int32_t)t;
    }
}

/* DynamicQuantizeLinear of n float32: the range (with 0), then the uint8 values; returns
 * (scale, zero point) */
PyObject *rc_py_dyn_quantize(PyObject *self, PyObject *args)
{
    PyObject *xo, *yo;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OOn:dyn_quantize", &xo, &yo, &n))
        return NULL;
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "dyn_quantize: size must be positive");
        return NULL;
    }
    Py_buffer v[2];
    const rc_buf spec[2] = {{xo, n, RC_F32, 0, 0, "x"}, {yo, n, 1, 1, 0, "y"}};
    if (get_buffers("dyn_quantize", spec, v, 2) < 0)
        return NULL;
    const float *x = (const float *)v[0].buf;
    uint8_t *y = (uint8_t *)v[1].buf;
    float scale, zpf, lo, hi;
    Py_BEGIN_ALLOW_THREADS
    rc_dq_range(x, n, &lo, &hi);
    scale = hi == lo ? 1.0f : (hi - lo) / 255.0f;
    zpf = rintf(clipf(0.0f - lo / scale, 0.0f, 255.0f));
    rc_dq_apply(x, y, n, scale, zpf);
    Py_END_ALLOW_THREADS
    release_buffers(v, 2);
    return Py_BuildValue("(fi)", scale, (int)zpf);
}

/* one tile of raw sums on the inner loop this CPU runs: int8_dyn.c's fused GEMM shares it */
_Static_assert(QG_MR == RC_QG_MR && QG_NR == RC_QG_NR, "native.h's int8 tile size");
void rc_qg_tile(const int32_t *ap, const int8_t *b0, const int8_t *b1, Py_ssize_t Kq, int32_t *c)
{
    qg_tile(ap, b0, b1, Kq, c);
}
