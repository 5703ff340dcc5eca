/* int8 GEMM with int32 accumulation (MatMulInteger, QLinearMatMul) and DynamicQuantizeLinear.
 *
 * Every product runs as u8 x s8: A (u8, or s8 + 128) against B (s8, or u8 - 128), packed in
 * the VNNI layout (panels of 16 columns, K in groups of 4 bytes); the offsets and both zero
 * points are folded into a row-sum / column-sum correction afterwards, so the int32 results
 * are exact (mod 2^32, as the spec allows) whatever the inner loop. Three inner loops read the
 * same layout, chosen once at load by the CPU: AVX-512 VNNI (vpdpbusd), AVX2 (bytes widened to
 * int16 pairs, vpmaddwd: exact, no vpmaddubsw saturation) and portable C. */
#include "native.h"

#define QG_MR 8  /* rows a tile */
#define QG_NR 32 /* columns a tile: two 16-column panels */
#define QG_RB 32 /* row blocks a unit of work: 256 rows of A, in L2 while the unit's tiles pass */

/* which inner loop runs here: 2 VNNI, 1 AVX2, 0 portable (set by rc_int8_init) */
static int qg_path;

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#define QG_X86 1
#else
#define QG_X86 0
#endif

void rc_int8_init(void)
{
#if QG_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw"))
        qg_path = 2;
    else if (__builtin_cpu_supports("avx2"))
        qg_path = 1;
    else
#endif
        qg_path = 0;
}

/* packed B: Np = N rounded up to QG_NR, Kq = ceil(K / 4): Np / 16 panels of Kq x 16 x 4 bytes,
 * then Np int32 column sums of the (signed) bytes */
static Py_ssize_t qg_np(Py_ssize_t N) { return (N + QG_NR - 1) / QG_NR * QG_NR; }
static Py_ssize_t qg_kq(Py_ssize_t K) { return (K + 3) / 4; }

/* c[8][32] = sum over kq of the packed rows ap[kq][8] (4 bytes each) x the two panels b0, b1 */
#if QG_X86
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void
qg_tile_vnni(const int32_t *restrict ap, const int8_t *restrict b0, const int8_t *restrict b1, Py_ssize_t Kq,
             int32_t *restrict c)
{
    __m512i acc[QG_MR][2];
    for (int r = 0; r < QG_MR; r++)
        acc[r][0] = acc[r][1] = _mm512_setzero_si512();
    for (Py_ssize_t q = 0; q < Kq; q++) {
        const __m512i w0 = _mm512_loadu_si512((const void *)(b0 + q * 64));
        const __m512i w1 = _mm512_loadu_si512((const void *)(b1 + q * 64));
        for (int r = 0; r < QG_MR; r++) {
            const __m512i a = _mm512_set1_epi32(ap[q * QG_MR + r]);
            acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], a, w0);
            acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], a, w1);
        }
    }
    for (int r = 0; r < QG_MR; r++) {
        _mm512_storeu_si512((void *)(c + r * QG_NR), acc[r][0]);
        _mm512_storeu_si512((void *)(c + r * QG_NR + 16), acc[r][1]);
    }
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

static void qg_part(void *arg, int part, int parts)
{
    const qg_job *j = (const qg_job *)arg;
    int32_t c[QG_MR * QG_NR] __attribute__((aligned(64)));
    uint32_t zbv[QG_NR], ct[QG_NR];
    const Py_ssize_t u0 = j->nunits * part / parts, u1 = j->nunits * (part + 1) / parts;
    const uint32_t K = (uint32_t)j->K, ZA = (uint32_t)j->ZA;
    for (Py_ssize_t u = u0; u < u1; u++) {
        /* a unit: one 32-column tile column x up to QG_RB row blocks (B's panels in L1) */
        const Py_ssize_t n0 = (u % j->ncols) * QG_NR, rb0 = (u / j->ncols) * QG_RB;
        const Py_ssize_t rb1 = rb0 + QG_RB < j->Mb ? rb0 + QG_RB : j->Mb;
        for (Py_ssize_t n = 0; n < QG_NR; n++) {
            const Py_ssize_t col = n0 + n < j->N ? n0 + n : j->N - 1;
            zbv[n] = (uint32_t)((j->zb ? j->zb[col] : 0) - j->ob);
            ct[n] = K * ZA * zbv[n] - ZA * (uint32_t)j->cs[col] + (j->bias ? (uint32_t)j->bias[col] : 0u);
        }
        const int8_t *b0 = j->bp + (n0 / 16) * j->Kq * 64, *b1 = b0 + j->Kq * 64;
        const Py_ssize_t nn = j->N - n0 < QG_NR ? j->N - n0 : QG_NR;
        for (Py_ssize_t mb = rb0; mb < rb1; mb++) {
            const int32_t *ap = j->ap + mb * j->Kq * QG_MR;
#if QG_X86
            if (qg_path == 2)
                qg_tile_vnni(ap, b0, b1, j->Kq, c);
            else if (qg_path == 1)
                qg_tile_avx2(ap, b0, b1, j->Kq, c);
            else
#endif
                qg_tile_c(ap, b0, b1, j->Kq, c);
            const Py_ssize_t m0 = mb * QG_MR, mm = j->M - m0 < QG_MR ? j->M - m0 : QG_MR;
            qg_epilogue(j, c, zbv, ct, m0, mm, n0, nn);
        }
    }
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

/* A's rows as unsigned bytes (an s8 A shifted by 128) in groups of 4 a row, [Mb][Kq][8], zeros
 * past K and M, and their sums: a part's share of the row blocks */
typedef struct {
    const uint8_t *a;
    int32_t *ap, *rs;
    Py_ssize_t M, K, Kq, Mb;
    uint32_t flip; /* 0x80808080 for an s8 A */
} qg_pack_job;

RC_CLONES static void qg_pack_part(void *arg, int part, int parts)
{
    const qg_pack_job *j = (const qg_pack_job *)arg;
    const Py_ssize_t b0 = j->Mb * part / parts, b1 = j->Mb * (part + 1) / parts, kf = j->K / 4;
    for (Py_ssize_t mb = b0; mb < b1; mb++) {
        uint32_t *restrict dst = (uint32_t *)j->ap + mb * j->Kq * QG_MR;
        for (int r = 0; r < QG_MR; r++) {
            const Py_ssize_t m = mb * QG_MR + r;
            if (m >= j->M) {
                for (Py_ssize_t q = 0; q < j->Kq; q++)
                    dst[q * QG_MR + r] = 0;
                j->rs[m] = 0;
                continue;
            }
            const uint8_t *restrict row = j->a + m * j->K;
            uint32_t s = 0;
            for (Py_ssize_t k = 0; k < j->K; k++)
                s += (uint32_t)(uint8_t)(row[k] ^ (uint8_t)j->flip);
            j->rs[m] = (int32_t)s;
            for (Py_ssize_t q = 0; q < kf; q++) {
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

/* qgemm(a, a_signed, za, packed, b_signed, zb, y, (M, K, N), mode, mult, yz, threads, bias=None,
 *       y_planes=0): with y_planes P, Y is (M / P) x N x P (a convolution's NCHW output, row m
 * of A a pixel), so that the result needs no layout transpose */
PyObject *rc_py_qgemm(PyObject *self, PyObject *args)
{
    PyObject *ao, *po, *zbo, *yo, *mo, *bo = Py_None;
    Py_ssize_t M, K, N, yP = 0;
    int asigned, bsigned, za, mode, yz, threads;
    if (!PyArg_ParseTuple(args, "OpiOpOO(nnn)iOii|On:qgemm", &ao, &asigned, &za, &po, &bsigned, &zbo, &yo, &M, &K,
                          &N, &mode, &mo, &yz, &threads, &bo, &yP))
        return NULL;
    if (M < 1 || K < 1 || N < 1 || mode < 0 || mode > 2 || yP < 0 || (yP && M % yP)) {
        PyErr_SetString(PyExc_ValueError, "qgemm: sizes must be positive, mode 0, 1 or 2 and y_planes divide M");
        return NULL;
    }
    rc_sz sz = {NULL};
    const Py_ssize_t Np = qg_np(N), Kq = qg_kq(K), Mb = (M + QG_MR - 1) / QG_MR;
    const Py_ssize_t an = sz_mul(&sz, "A's size", M, K), yn = sz_mul(&sz, "Y's size", M, N);
    const Py_ssize_t body = sz_mul3(&sz, "the packed size", Np, Kq, 4);
    const Py_ssize_t pn = sz_add(&sz, "the packed size", body, sz_mul(&sz, "the packed size", Np, 4));
    if (sz_check(&sz, "qgemm", PyExc_ValueError) < 0)
        return NULL;
    const Py_ssize_t apn = sz_mul4(&sz, "the packed rows", Mb, Kq, QG_MR, 4);
    if (sz_check(&sz, "qgemm", PyExc_MemoryError) < 0)
        return NULL;
    Py_buffer v[6];
    const rc_buf spec[6] = {{ao, an, 1, 0, 0, "A"}, {po, pn, 1, 0, 0, "packed"}, {zbo, N, 4, 0, 1, "zb"},
                            {yo, yn, mode == 0 ? 4 : 1, 1, 0, "Y"}, {mo, N, RC_F32, 0, mode == 0, "mult"},
                            {bo, N, 4, 0, 1, "bias"}};
    if (get_buffers("qgemm", spec, v, 6) < 0)
        return NULL;
    const size_t abytes = (size_t)apn + sizeof(int32_t) * (size_t)Mb * QG_MR;
    int32_t *ap = (int32_t *)rc_work(abytes);
    int oom = ap == NULL;
    qg_job j = {ap, ap ? ap + Mb * Kq * QG_MR : NULL, (const int8_t *)v[1].buf,
                (const int32_t *)((const int8_t *)v[1].buf + body), (const int32_t *)v[2].buf, (const int32_t *)v[5].buf, (const float *)v[4].buf,
                v[3].buf, M, K, N, Kq, Mb, Np / QG_NR, Np / QG_NR * ((Mb + QG_RB - 1) / QG_RB), (int32_t)za + (asigned ? 128 : 0), bsigned ? 0 : 128, yz, yP, mode};
    if (!oom) {
        const uint8_t *a = (const uint8_t *)v[0].buf;
        Py_BEGIN_ALLOW_THREADS
        qg_pack_job pj = {a, ap, ap + Mb * Kq * QG_MR, M, K, Kq, Mb, asigned ? 0x80808080u : 0u};
        int pth = threads;
        const int pparts = rc_parts((double)M * (double)K * 4.0, 2.5e5, Mb, &pth);
        rc_parallel(qg_pack_part, &pj, pparts, pth);
        const int parts = rc_parts_fine(2.0 * (double)M * (double)K * (double)N, 2.5e5, j.nunits, &threads);
        rc_parallel(qg_part, &j, parts, threads);
        Py_END_ALLOW_THREADS
        rc_work_done(ap, abytes);
    }
    release_buffers(v, 6);
    if (oom)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* y[n][p][c] = x[n][c][p] for bytes: an image's planes as pixel rows (a pointwise QLinearConv's A),
 * 16 x 16 blocks through byte transposes, the edges item by item */
static void qt_image(const uint8_t *restrict x, uint8_t *restrict y, Py_ssize_t C, Py_ssize_t P)
{
    Py_ssize_t c0 = 0;
#if RC_SSE2
    for (; c0 + 16 <= C; c0 += 16) {
        Py_ssize_t p0 = 0;
        for (; p0 + 16 <= P; p0 += 16) {
            __m128i in[16], out[16];
            for (int c = 0; c < 16; c++)
                in[c] = _mm_loadu_si128((const __m128i *)(x + (c0 + c) * P + p0));
            rc_tr16_bytes(in, out);
            for (int p = 0; p < 16; p++)
                _mm_storeu_si128((__m128i *)(y + (p0 + p) * C + c0), out[p]);
        }
        for (; p0 < P; p0++)
            for (int c = 0; c < 16; c++)
                y[p0 * C + c0 + c] = x[(c0 + c) * P + p0];
    }
#endif
    for (Py_ssize_t p = 0; p < P; p++)
        for (Py_ssize_t c = c0; c < C; c++)
            y[p * C + c] = x[c * P + p];
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

/* im2col rows of NCHW bytes for a convolution's GEMM: row (n, oh, ow), items in (kh, kw, c)
 * order, taps outside the image the pad byte (x's zero point) */
typedef struct {
    const uint8_t *x;
    uint8_t *cols;
    Py_ssize_t N, C, H, W, KH, KW, OH, OW, sh, sw, dh, dw, pt, pl;
    uint8_t pad;
} qi_job;

static void qi_part(void *arg, int part, int parts)
{
    const qi_job *j = (const qi_job *)arg;
    const Py_ssize_t rows = j->N * j->OH, r0 = rows * part / parts, r1 = rows * (part + 1) / parts;
    const Py_ssize_t row = j->KH * j->KW * j->C, HW = j->H * j->W;
    for (Py_ssize_t r = r0; r < r1; r++) {
        const Py_ssize_t n = r / j->OH, oh = r % j->OH;
        const uint8_t *xn = j->x + n * j->C * HW;
        uint8_t *d = j->cols + r * j->OW * row;
        for (Py_ssize_t ow = 0; ow < j->OW; ow++)
            for (Py_ssize_t i = 0; i < j->KH; i++) {
                const Py_ssize_t ih = oh * j->sh - j->pt + i * j->dh;
                for (Py_ssize_t k = 0; k < j->KW; k++, d += j->C) {
                    const Py_ssize_t iw = ow * j->sw - j->pl + k * j->dw;
                    if (ih < 0 || ih >= j->H || iw < 0 || iw >= j->W)
                        memset(d, j->pad, (size_t)j->C);
                    else
                        for (Py_ssize_t c = 0; c < j->C; c++)
                            d[c] = xn[c * HW + ih * j->W + iw];
                }
            }
    }
}

/* qim2col(x, cols, (N, C, H, W), (KH, KW), (OH, OW), (sh, sw), (dh, dw), (pt, pl), pad, threads) */
PyObject *rc_py_qim2col(PyObject *self, PyObject *args)
{
    PyObject *xo, *co;
    int pad, threads;
    qi_job j;
    memset(&j, 0, sizeof j);
    if (!PyArg_ParseTuple(args, "OO(nnnn)(nn)(nn)(nn)(nn)(nn)ii:qim2col", &xo, &co, &j.N, &j.C, &j.H, &j.W, &j.KH,
                          &j.KW, &j.OH, &j.OW, &j.sh, &j.sw, &j.dh, &j.dw, &j.pt, &j.pl, &pad, &threads))
        return NULL;
    if (j.N < 1 || j.C < 1 || j.H < 1 || j.W < 1 || j.KH < 1 || j.KW < 1 || j.OH < 1 || j.OW < 1 || j.sh < 1
        || j.sw < 1 || j.dh < 1 || j.dw < 1 || j.pt < 0 || j.pl < 0 || pad < -128 || pad > 255) {
        PyErr_SetString(PyExc_ValueError, "qim2col: sizes, strides and dilations must be positive, pads not "
                                          "negative and the pad a byte");
        return NULL;
    }
    rc_sz sz = {NULL};
    const Py_ssize_t xn = sz_mul4(&sz, "X's size", j.N, j.C, j.H, j.W);
    const Py_ssize_t cn = sz_mul(&sz, "the rows' size", sz_mul3(&sz, "the rows' size", j.N, j.OH, j.OW),
                                 sz_mul3(&sz, "the rows' size", j.KH, j.KW, j.C));
    if (sz_check(&sz, "qim2col", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[2];
    const rc_buf spec[2] = {{xo, xn, 1, 0, 0, "x"}, {co, cn, 1, 1, 0, "cols"}};
    if (get_buffers("qim2col", spec, v, 2) < 0)
        return NULL;
    j.x = (const uint8_t *)v[0].buf;
    j.cols = (uint8_t *)v[1].buf;
    j.pad = (uint8_t)pad;
    Py_BEGIN_ALLOW_THREADS
    const int parts = rc_parts((double)cn, 2.5e5, j.N * j.OH, &threads);
    rc_parallel(qi_part, &j, parts, threads);
    Py_END_ALLOW_THREADS
    release_buffers(v, 2);
    Py_RETURN_NONE;
}

/* qgemm_path(force=-1) -> the inner loop's name; force (0 portable, 1 AVX2, 2 VNNI, at most
 * what this CPU runs) sets it, so that tests reach every loop on one machine */
PyObject *rc_py_qgemm_path(PyObject *self, PyObject *args)
{
    static const char *names[] = {"portable", "avx2", "avx512vnni"};
    int force = -1;
    if (!PyArg_ParseTuple(args, "|i:qgemm_path", &force))
        return NULL;
    if (force >= 0) {
        rc_int8_init();
        if (force < qg_path)
            qg_path = force;
    }
    return PyUnicode_FromString(names[qg_path]);
}

/* the range of n floats with 0 in it, 16 lanes at a time (vectorized in the clones); NaNs are
 * left out of it (a comparison with NaN is false), as onnxruntime does */
RC_CLONES static void dq_range(const float *restrict x, Py_ssize_t n, float *lo_out, float *hi_out)
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
RC_CLONES static void dq_apply(const float *restrict x, uint8_t *restrict y, Py_ssize_t n, float scale, float zpf)
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
    dq_range(x, n, &lo, &hi);
    scale = hi == lo ? 1.0f : (hi - lo) / 255.0f;
    zpf = rintf(clipf(0.0f - lo / scale, 0.0f, 255.0f));
    dq_apply(x, y, n, scale, zpf);
    Py_END_ALLOW_THREADS
    release_buffers(v, 2);
    return Py_BuildValue("(fi)", scale, (int)zpf);
}
