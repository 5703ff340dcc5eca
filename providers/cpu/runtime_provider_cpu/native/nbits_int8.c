/* MatMulNBits with accuracy_level 4 (onnxruntime's "CompInt8"): a's rows quantized to int8 per
 * block of the weight's block size (scale = amax / 127, codes rint(a * 127 / amax), as MLAS's
 * QuantizeARow_CompInt8), the 4-bit codes q kept unsigned, and per block
 *     y[m][n] += (sa * sb) * sum(aq * q) - (sa * sum(aq)) * (z * sb)
 * so that the integer dot needs no zero point (u8 codes x s8 a: vpdpbusd's operand types).
 *
 * B is packed once by the caller (ops/quant_contrib.py, _nbits_int8_pack): panels of 16 columns,
 * K in groups of 8 terms, 64 bytes a group: byte 4c + i holds column c's codes of terms i (low
 * nibble) and 4 + i (high nibble), so one load and two masks give vpdpbusd's two operands; the
 * scales sb and z * sb as [panel][block][16] floats (zeros past N). Loops, by the CPU: AVX-512
 * VNNI (up to 6 rows x 16 columns a tile, two accumulators a row), AVX-VNNI (VEX ymm vpdpbusd, up
 * to 4 rows a pass: Intel's AVX-512-less cores from Alder Lake on; its body EVEX-encoded runs on
 * AVX512_VNNI + VL CPUs as `vnni256-evex`, so that tests reach its logic there), AVX2 (vpmaddubsw
 * + vpmaddwd) and portable C; their float steps are the same fused multiply-adds in the same order
 * and the integer dots exact, so they all agree bit for bit. */
#include "native.h"

#define NI_MR 6 /* rows a tile */

typedef struct {
    const int8_t *aq;   /* [M][Kp] int8, zeros past K */
    const float *sa;    /* [M][nb]: a's scale */
    const float *sas;   /* [M][nb]: a's scale times its codes' sum */
    const uint8_t *bp;  /* [P][Kp / 8][64] */
    const float *sb;    /* [P][nb][16] */
    const float *zs;    /* [P][nb][16] */
    const float *bias;  /* [N] or NULL */
    float *y;           /* [M][N] */
    Py_ssize_t M, N, Kp, nb, bs, P;
    int path;
} ni_job;

#define QN_X86 DWF_OK /* GCC on x86-64 Linux: where simd.h includes the intrinsics */

enum { NI_PORTABLE, NI_AVX2, NI_VNNI512, NI_AVXVNNI, NI_VNNI256_EVEX, NI_NPATHS };
static const char *const NI_NAMES[NI_NPATHS] = {"portable", "avx2", "avx512vnni", "avxvnni", "vnni256-evex"};
/* the loop forced by nbits_int8_path (tests reach every loop this CPU runs), -1: the CPU's choice */
static int ni_forced = -1;

/* 16 columns of panel p for rows [r0, r0 + mr) into c (16 a row, `ldc` apart) */
static void ni_tile_portable(const ni_job *j, Py_ssize_t p, Py_ssize_t r0, int mr, float *c, Py_ssize_t ldc)
{
    const Py_ssize_t bs = j->bs, Kp = j->Kp, nb = j->nb;
    for (int m = 0; m < mr; m++) {
        const int8_t *a = j->aq + (r0 + m) * Kp;
        for (int col = 0; col < 16; col++) {
            float f = 0.0f;
            for (Py_ssize_t blk = 0; blk < nb; blk++) {
                int32_t acc = 0;
                for (Py_ssize_t g = blk * bs / 8; g < (blk + 1) * bs / 8; g++) {
                    const uint8_t *b = j->bp + (p * (Kp / 8) + g) * 64 + 4 * col;
                    for (int i = 0; i < 4; i++)
                        acc += (b[i] & 15) * a[8 * g + i] + (b[i] >> 4) * a[8 * g + 4 + i];
                }
                const float sb = j->sb[(p * nb + blk) * 16 + col], zs = j->zs[(p * nb + blk) * 16 + col];
                f = fmaf((float)acc, sb * j->sa[(r0 + m) * nb + blk], f);
                f = fmaf(-zs, j->sas[(r0 + m) * nb + blk], f);
            }
            c[m * ldc + col] = f;
        }
    }
}

#if DWF_OK
#define NI_TARGET __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx512vnni,avx2,fma")))

NI_TARGET static inline __attribute__((always_inline)) void ni_tile_vnni_body(const ni_job *j, Py_ssize_t p,
                                                                              Py_ssize_t r0, float *c,
                                                                              Py_ssize_t ldc, const int MR)
{
    const Py_ssize_t bs = j->bs, Kp = j->Kp, nb = j->nb, gb = bs / 8;
    const __m512i lo4 = _mm512_set1_epi8(15);
    const uint8_t *bq = j->bp + p * (Kp / 8) * 64;
    const int8_t *a[NI_MR];
    __m512 f[NI_MR];
    for (int m = 0; m < MR; m++) {
        a[m] = j->aq + (r0 + m) * Kp;
        f[m] = _mm512_setzero_ps();
    }
    for (Py_ssize_t blk = 0; blk < nb; blk++) {
        __m512i x[NI_MR], h[NI_MR]; /* two chains a row: vpdpbusd's latency hidden even for one row */
        for (int m = 0; m < MR; m++)
            x[m] = h[m] = _mm512_setzero_si512();
        for (Py_ssize_t g = blk * gb; g < (blk + 1) * gb; g++) {
            const __m512i v = _mm512_loadu_si512((const void *)(bq + g * 64));
            const __m512i lo = _mm512_and_si512(v, lo4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
            for (int m = 0; m < MR; m++) {
                int32_t a0, a1;
                memcpy(&a0, a[m] + 8 * g, 4);
                memcpy(&a1, a[m] + 8 * g + 4, 4);
                x[m] = _mm512_dpbusd_epi32(x[m], lo, _mm512_set1_epi32(a0));
                h[m] = _mm512_dpbusd_epi32(h[m], hi, _mm512_set1_epi32(a1));
            }
        }
        const __m512 sb = _mm512_loadu_ps(j->sb + (p * nb + blk) * 16);
        const __m512 nzs = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_loadu_ps(j->zs + (p * nb + blk) * 16));
        for (int m = 0; m < MR; m++) {
            const __m512 d = _mm512_cvtepi32_ps(_mm512_add_epi32(x[m], h[m]));
            f[m] = _mm512_fmadd_ps(d, _mm512_mul_ps(sb, _mm512_set1_ps(j->sa[(r0 + m) * nb + blk])), f[m]);
            f[m] = _mm512_fmadd_ps(nzs, _mm512_set1_ps(j->sas[(r0 + m) * nb + blk]), f[m]);
        }
    }
    for (int m = 0; m < MR; m++)
        _mm512_storeu_ps(c + m * ldc, f[m]);
}

NI_TARGET static void ni_tile_vnni(const ni_job *j, Py_ssize_t p, Py_ssize_t r0, int mr, float *c, Py_ssize_t ldc)
{
    switch (mr) { /* the row count a constant in each copy: the accumulators in registers */
    case 1: ni_tile_vnni_body(j, p, r0, c, ldc, 1); break;
    case 2: ni_tile_vnni_body(j, p, r0, c, ldc, 2); break;
    case 3: ni_tile_vnni_body(j, p, r0, c, ldc, 3); break;
    case 4: ni_tile_vnni_body(j, p, r0, c, ldc, 4); break;
    case 5: ni_tile_vnni_body(j, p, r0, c, ldc, 5); break;
    default: ni_tile_vnni_body(j, p, r0, c, ldc, 6); break;
    }
}
#endif

#if QN_X86
/* AVX2 without VNNI: vpmaddubsw (u8 codes x s8 a, pairs to s16: at most 2 * 2 * 15 * 127, no
 * saturation) and vpmaddwd by ones to s32; 16 columns as two 8-lane halves, up to 3 rows a pass
 * (the 16 ymm registers) */
#define NI_AVX2_TARGET __attribute__((target("avx2,fma")))

NI_AVX2_TARGET static inline __attribute__((always_inline)) void ni_tile_avx2_body(const ni_job *j, Py_ssize_t p,
                                                                                   Py_ssize_t r0, float *c,
                                                                                   Py_ssize_t ldc, const int MR)
{
    const Py_ssize_t bs = j->bs, Kp = j->Kp, nb = j->nb, gb = bs / 8;
    const __m256i lo4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    const uint8_t *bq = j->bp + p * (Kp / 8) * 64;
    const int8_t *a[3];
    __m256 f0[3], f1[3];
    for (int m = 0; m < MR; m++) {
        a[m] = j->aq + (r0 + m) * Kp;
        f0[m] = f1[m] = _mm256_setzero_ps();
    }
    for (Py_ssize_t blk = 0; blk < nb; blk++) {
        __m256i x0[3], x1[3];
        for (int m = 0; m < MR; m++)
            x0[m] = x1[m] = _mm256_setzero_si256();
        for (Py_ssize_t g = blk * gb; g < (blk + 1) * gb; g++) {
            const __m256i v0 = _mm256_loadu_si256((const __m256i *)(bq + g * 64));
            const __m256i v1 = _mm256_loadu_si256((const __m256i *)(bq + g * 64 + 32));
            const __m256i l0 = _mm256_and_si256(v0, lo4), h0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), lo4);
            const __m256i l1 = _mm256_and_si256(v1, lo4), h1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), lo4);
            for (int m = 0; m < MR; m++) {
                int32_t a0, a1;
                memcpy(&a0, a[m] + 8 * g, 4);
                memcpy(&a1, a[m] + 8 * g + 4, 4);
                const __m256i b0 = _mm256_set1_epi32(a0), b1 = _mm256_set1_epi32(a1);
                const __m256i s0 = _mm256_add_epi16(_mm256_maddubs_epi16(l0, b0), _mm256_maddubs_epi16(h0, b1));
                const __m256i s1 = _mm256_add_epi16(_mm256_maddubs_epi16(l1, b0), _mm256_maddubs_epi16(h1, b1));
                x0[m] = _mm256_add_epi32(x0[m], _mm256_madd_epi16(s0, ones));
                x1[m] = _mm256_add_epi32(x1[m], _mm256_madd_epi16(s1, ones));
            }
        }
        const float *sbp = j->sb + (p * nb + blk) * 16, *zsp = j->zs + (p * nb + blk) * 16;
        const __m256 sb0 = _mm256_loadu_ps(sbp), sb1 = _mm256_loadu_ps(sbp + 8);
        const __m256 nz0 = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_loadu_ps(zsp));
        const __m256 nz1 = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_loadu_ps(zsp + 8));
        for (int m = 0; m < MR; m++) {
            const __m256 sa = _mm256_set1_ps(j->sa[(r0 + m) * nb + blk]);
            const __m256 sas = _mm256_set1_ps(j->sas[(r0 + m) * nb + blk]);
            f0[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(x0[m]), _mm256_mul_ps(sb0, sa), f0[m]);
            f1[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(x1[m]), _mm256_mul_ps(sb1, sa), f1[m]);
            f0[m] = _mm256_fmadd_ps(nz0, sas, f0[m]);
            f1[m] = _mm256_fmadd_ps(nz1, sas, f1[m]);
        }
    }
    for (int m = 0; m < MR; m++) {
        _mm256_storeu_ps(c + m * ldc, f0[m]);
        _mm256_storeu_ps(c + m * ldc + 8, f1[m]);
    }
}

NI_AVX2_TARGET static void ni_tile_avx2(const ni_job *j, Py_ssize_t p, Py_ssize_t r0, int mr, float *c, Py_ssize_t ldc)
{
    for (int r = 0; r < mr; r += 3)
        switch (mr - r < 3 ? mr - r : 3) {
        case 1: ni_tile_avx2_body(j, p, r0 + r, c + r * ldc, ldc, 1); break;
        case 2: ni_tile_avx2_body(j, p, r0 + r, c + r * ldc, ldc, 2); break;
        default: ni_tile_avx2_body(j, p, r0 + r, c + r * ldc, ldc, 3); break;
        }
}
#endif

#if QN_X86
/* AVX-VNNI: the AVX2 tile's layout (16 columns as two 8-lane halves) with vpdpbusd doing
 * vpmaddubsw + vpmaddwd's work in one step, up to 4 rows a pass (8 accumulators, 4 code vectors,
 * 2 broadcasts: 14 of the 16 ymm registers). The instruction is written as inline assembly, as
 * int8.c's, so any GCC that assembles it builds this file; `insn` picks the VEX form (AVX-VNNI)
 * or the EVEX one (AVX512_VNNI + VL, the same operation). */
#define NI_VNNI256_BODY(name, tgt, insn)                                                                         \
    __attribute__((target(tgt))) static inline __attribute__((always_inline)) void name(                        \
        const ni_job *j, Py_ssize_t p, Py_ssize_t r0, float *c, Py_ssize_t ldc, const int MR)                   \
    {                                                                                                            \
        const Py_ssize_t bs = j->bs, Kp = j->Kp, nb = j->nb, gb = bs / 8;                                        \
        const __m256i lo4 = _mm256_set1_epi8(15);                                                                \
        const uint8_t *bq = j->bp + p * (Kp / 8) * 64;                                                           \
        const int8_t *a[4];                                                                                      \
        __m256 f0[4], f1[4];                                                                                     \
        for (int m = 0; m < MR; m++) {                                                                           \
            a[m] = j->aq + (r0 + m) * Kp;                                                                        \
            f0[m] = f1[m] = _mm256_setzero_ps();                                                                 \
        }                                                                                                        \
        for (Py_ssize_t blk = 0; blk < nb; blk++) {                                                              \
            __m256i x0[4], x1[4];                                                                                \
            for (int m = 0; m < MR; m++)                                                                         \
                x0[m] = x1[m] = _mm256_setzero_si256();                                                          \
            for (Py_ssize_t g = blk * gb; g < (blk + 1) * gb; g++) {                                             \
                const __m256i v0 = _mm256_loadu_si256((const __m256i *)(bq + g * 64));                           \
                const __m256i v1 = _mm256_loadu_si256((const __m256i *)(bq + g * 64 + 32));                      \
                const __m256i l0 = _mm256_and_si256(v0, lo4), h0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), lo4); \
                const __m256i l1 = _mm256_and_si256(v1, lo4), h1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), lo4); \
                for (int m = 0; m < MR; m++) {                                                                   \
                    int32_t a0, a1;                                                                              \
                    memcpy(&a0, a[m] + 8 * g, 4);                                                                \
                    memcpy(&a1, a[m] + 8 * g + 4, 4);                                                            \
                    const __m256i b0 = _mm256_set1_epi32(a0), b1 = _mm256_set1_epi32(a1);                        \
                    __asm__(insn " %2, %1, %0" : "+x"(x0[m]) : "x"(l0), "x"(b0));                                \
                    __asm__(insn " %2, %1, %0" : "+x"(x1[m]) : "x"(l1), "x"(b0));                                \
                    __asm__(insn " %2, %1, %0" : "+x"(x0[m]) : "x"(h0), "x"(b1));                                \
                    __asm__(insn " %2, %1, %0" : "+x"(x1[m]) : "x"(h1), "x"(b1));                                \
                }                                                                                                \
            }                                                                                                    \
            const float *sbp = j->sb + (p * nb + blk) * 16, *zsp = j->zs + (p * nb + blk) * 16;                  \
            const __m256 sb0 = _mm256_loadu_ps(sbp), sb1 = _mm256_loadu_ps(sbp + 8);                             \
            const __m256 nz0 = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_loadu_ps(zsp));                         \
            const __m256 nz1 = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_loadu_ps(zsp + 8));                     \
            for (int m = 0; m < MR; m++) {                                                                       \
                const __m256 sa = _mm256_set1_ps(j->sa[(r0 + m) * nb + blk]);                                    \
                const __m256 sas = _mm256_set1_ps(j->sas[(r0 + m) * nb + blk]);                                  \
                f0[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(x0[m]), _mm256_mul_ps(sb0, sa), f0[m]);               \
                f1[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(x1[m]), _mm256_mul_ps(sb1, sa), f1[m]);               \
                f0[m] = _mm256_fmadd_ps(nz0, sas, f0[m]);                                                        \
                f1[m] = _mm256_fmadd_ps(nz1, sas, f1[m]);                                                        \
            }                                                                                                    \
        }                                                                                                        \
        for (int m = 0; m < MR; m++) {                                                                           \
            _mm256_storeu_ps(c + m * ldc, f0[m]);                                                                \
            _mm256_storeu_ps(c + m * ldc + 8, f1[m]);                                                            \
        }                                                                                                        \
    }
#define NI_VNNI256_TILE(name, body, tgt)                                                                         \
    __attribute__((target(tgt))) static void name(const ni_job *j, Py_ssize_t p, Py_ssize_t r0, int mr, float *c, \
                                                  Py_ssize_t ldc)                                                \
    {                                                                                                            \
        for (int r = 0; r < mr; r += 4)                                                                          \
            switch (mr - r < 4 ? mr - r : 4) {                                                                   \
            case 1: body(j, p, r0 + r, c + r * ldc, ldc, 1); break;                                              \
            case 2: body(j, p, r0 + r, c + r * ldc, ldc, 2); break;                                              \
            case 3: body(j, p, r0 + r, c + r * ldc, ldc, 3); break;                                              \
            default: body(j, p, r0 + r, c + r * ldc, ldc, 4); break;                                             \
            }                                                                                                    \
    }
NI_VNNI256_BODY(ni_body_avxvnni, "avx2,fma", "%{vex%} vpdpbusd")
NI_VNNI256_TILE(ni_tile_avxvnni, ni_body_avxvnni, "avx2,fma")
#if DWF_OK
NI_VNNI256_BODY(ni_body_vnni256_evex, "avx2,fma,avx512f,avx512vl,avx512vnni", "%{evex%} vpdpbusd")
NI_VNNI256_TILE(ni_tile_vnni256_evex, ni_body_vnni256_evex, "avx2,fma,avx512f,avx512vl,avx512vnni")
#endif
#endif

static void ni_part(void *arg, int part, int parts)
{
    const ni_job *j = (const ni_job *)arg;
    float t[NI_MR * 16];
    for (Py_ssize_t p = j->P * part / parts; p < j->P * (part + 1) / parts; p++) {
        const Py_ssize_t n0 = p * 16, nn = j->N - n0 < 16 ? j->N - n0 : 16;
        for (Py_ssize_t r0 = 0; r0 < j->M; r0 += NI_MR) {
            const int mr = (int)(j->M - r0 < NI_MR ? j->M - r0 : NI_MR);
#if DWF_OK
            if (j->path == NI_VNNI512)
                ni_tile_vnni(j, p, r0, mr, t, 16);
            else
#endif
#if DWF_OK
            if (j->path == NI_VNNI256_EVEX)
                ni_tile_vnni256_evex(j, p, r0, mr, t, 16);
            else
#endif
#if QN_X86
            if (j->path == NI_AVXVNNI)
                ni_tile_avxvnni(j, p, r0, mr, t, 16);
            else if (j->path == NI_AVX2)
                ni_tile_avx2(j, p, r0, mr, t, 16);
            else
#endif
                ni_tile_portable(j, p, r0, mr, t, 16);
            for (int m = 0; m < mr; m++) {
                float *y = j->y + (r0 + m) * j->N + n0;
                for (Py_ssize_t i = 0; i < nn; i++)
                    y[i] = t[m * 16 + i] + (j->bias ? j->bias[n0 + i] : 0.0f);
            }
        }
    }
}

/* row m of a: int8 codes per block (zeros past K), the block's scale and scale * sum of codes */
RC_CLONES static void ni_quantize_row(const float *a, Py_ssize_t K, Py_ssize_t bs, Py_ssize_t nb, int8_t *q,
                                      float *sa, float *sas)
{
    for (Py_ssize_t blk = 0; blk < nb; blk++) {
        const Py_ssize_t k0 = blk * bs, kn = K - k0 < bs ? K - k0 : bs;
        float amax = 0.0f;
        for (Py_ssize_t k = 0; k < kn; k++) {
            const float v = fabsf(a[k0 + k]);
            amax = v > amax ? v : amax;
        }
        const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (Py_ssize_t k = 0; k < bs; k++) {
            float x = k < kn ? a[k0 + k] * inv : 0.0f;
            x = x > 127.0f ? 127.0f : x < -127.0f ? -127.0f : x == x ? x : 0.0f; /* inf, NaN: no UB */
            const int32_t v = (int32_t)nearbyintf(x);
            q[k0 + k] = (int8_t)v;
            sum += v;
        }
        sa[blk] = amax / 127.0f;
        sas[blk] = sa[blk] * (float)sum;
    }
}

/* whether this CPU runs loop p */
static int ni_runs(int p)
{
#if QN_X86
    __builtin_cpu_init();
    switch (p) {
    case NI_PORTABLE: return 1;
    case NI_AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case NI_VNNI512:
        return DWF_OK && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("fma");
    case NI_AVXVNNI: return rc_avx_vnni && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case NI_VNNI256_EVEX:
        return DWF_OK && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    default: return 0;
    }
#else
    return p == NI_PORTABLE;
#endif
}

/* whether a vector loop (AVX-512 VNNI, AVX-VNNI or AVX2) runs here: the module's NBITS_INT8_FAST */
int rc_nbits_int8_fast(void)
{
    return ni_runs(NI_VNNI512) || ni_runs(NI_AVXVNNI) || ni_runs(NI_AVX2);
}

/* the loop a call takes: the forced one, else AVX-512 VNNI, else AVX-VNNI, else AVX2, else
 * portable (the EVEX twin only when forced) */
static int ni_path(void)
{
    if (ni_forced >= 0)
        return ni_forced;
    return ni_runs(NI_VNNI512) ? NI_VNNI512 : ni_runs(NI_AVXVNNI) ? NI_AVXVNNI : ni_runs(NI_AVX2) ? NI_AVX2 : NI_PORTABLE;
}

/* nbits_int8_matmul(a, bp, sb, zs, bias, y, (M, K, N, block_size), threads) */
PyObject *rc_py_nbits_int8_matmul(PyObject *self, PyObject *args)
{
    PyObject *ao, *bo, *so, *zo, *biaso, *yo;
    Py_ssize_t M, K, N, bs;
    int threads;
    if (!PyArg_ParseTuple(args, "OOOOOO(nnnn)i:nbits_int8_matmul", &ao, &bo, &so, &zo, &biaso, &yo, &M, &K, &N, &bs,
                          &threads))
        return NULL;
    if (M < 1 || K < 1 || N < 1 || bs < 16 || bs > 4096 || (bs & (bs - 1))) {
        PyErr_SetString(PyExc_ValueError,
                        "nbits_int8_matmul: sizes must be positive and block_size a power of two in [16, 4096]");
        return NULL;
    }
    const Py_ssize_t nb = K / bs + (K % bs != 0), P = N / 16 + (N % 16 != 0);
    rc_sz sz = {NULL};
    const Py_ssize_t Kp = sz_mul(&sz, "the padded K", nb, bs);
    const Py_ssize_t an = sz_mul(&sz, "A's size", M, K), yn = sz_mul(&sz, "Y's size", M, N);
    const Py_ssize_t bn = sz_mul3(&sz, "the packed B's size", P, Kp / 8, 64);
    const Py_ssize_t sn = sz_mul3(&sz, "the packed scales' size", P, nb, 16);
    const Py_ssize_t qn = sz_mul(&sz, "A's codes", M, Kp), mn = sz_mul(&sz, "A's scales", M, nb);
    if (sz_check(&sz, "nbits_int8_matmul", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[6];
    const rc_buf spec[6] = {{ao, an, RC_F32, 0, 0, "A"}, {bo, bn, 1, 0, 0, "B (packed)"},
                            {so, sn, RC_F32, 0, 0, "scales (packed)"}, {zo, sn, RC_F32, 0, 0, "zero terms (packed)"},
                            {biaso, N, RC_F32, 0, 1, "bias"}, {yo, yn, RC_F32, 1, 0, "Y"}};
    if (get_buffers("nbits_int8_matmul", spec, v, 6) < 0)
        return NULL;
    const size_t wn = (size_t)qn + 2 * sizeof(float) * (size_t)mn + 64;
    char *w = (char *)rc_work(wn);
    const int oom = w == NULL;
    if (!oom) {
        float *sa = (float *)w, *sas = sa + mn;
        int8_t *aq = (int8_t *)(sas + mn);
        ni_job j = {aq, sa, sas, (const uint8_t *)v[1].buf, (const float *)v[2].buf, (const float *)v[3].buf,
                    (const float *)v[4].buf, (float *)v[5].buf, M, N, Kp, nb, bs, P, ni_path()};
        Py_BEGIN_ALLOW_THREADS
        const float *a = (const float *)v[0].buf;
        for (Py_ssize_t m = 0; m < M; m++)
            ni_quantize_row(a + m * K, K, bs, nb, aq + m * Kp, sa + m * nb, sas + m * nb);
        const double work = 2.0 * (double)M * (double)Kp * (double)N;
        const int parts = rc_parts_fine(work, 2.5e5, P, &threads);
        rc_parallel(ni_part, &j, parts, threads);
        Py_END_ALLOW_THREADS
        rc_work_done(w, wn);
    }
    release_buffers(v, 6);
    if (oom)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* nbits_int8_path(force=-1) -> the loop calls take here ("avx512vnni", "avxvnni", "avx2" or
 * "portable"); force 0 portable, 1 avx2, 2 avx512vnni, 3 avxvnni, 4 vnni256-evex sets it where this
 * CPU runs it, else (9, say) the CPU's own choice again (tests reach every loop on one machine) */
PyObject *rc_py_nbits_int8_path(PyObject *self, PyObject *args)
{
    int force = -1;
    if (!PyArg_ParseTuple(args, "|i:nbits_int8_path", &force))
        return NULL;
    if (force >= 0)
        ni_forced = force < NI_NPATHS && ni_runs(force) ? force : -1;
    return PyUnicode_FromString(NI_NAMES[ni_path()]);
}
