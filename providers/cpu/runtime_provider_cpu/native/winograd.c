#include "native.h"

/* ---------------------------------------------------------------------------------------
 * winograd3x3: a dense 3x3, stride 1, dilation 1 float32 convolution as Winograd's F(2x2, 3x3):
 * every 2 x 2 block of outputs (a tile) from a 4 x 4 patch of the padded input, in 16 products
 * a channel pair instead of 36 (2.25x fewer multiply-adds). For each tile,
 *     V = B^T d B (the patch, per input channel),
 *     M[xi] = sum over c of U[xi][m][c] * V[xi][c]   (16 GEMMs, one per xi = 4 * i + j),
 *     Y = A^T M A (the 2 x 2 outputs, per output channel),
 * with U = G g G^T the transformed weights (ops/nn._pack_winograd). Every coefficient of B, G
 * and A is 0, +-1 or +-1/2: the transforms round only in their sums.
 *
 * Layout: the padded input in its four stride-2 phases (cv_fill with sh = sw = 2): tile q =
 * ti * Wq + tj (Wq = OW2 + 1: one dropped tile a row) reads patch element (r, k) at phase
 * (r % 2, k % 2), offset (r / 2) * Wq + k / 2 + q: 16 tiles in a row are one unit-stride vector.
 * A block of CV_NR = 48 tiles is transformed into V[16][C][48], then for each block of 8
 * output channels the 16 GEMMs run on conv2d's 8 x 48 register tile (cv_tile3, K = C) into
 * M[16][8 x 48], and the output transform writes the tiles' outputs with bias, residual and
 * clip. Parts of the (tile block, channel block) grid go to the kernel threads; a part
 * transforms the input blocks it touches.
 * --------------------------------------------------------------------------------------- */
typedef struct {
    const float *planes, *u, *b, *z;
    float *y, *scratch;         /* per part: V (16 x C x 48) then M (16 x 8 x 48) */
    Py_ssize_t C, M, Mb, OH, OW, OH2, OW2, Wq, L, nblk, scratch_n;
    float lo, hi;
    int by_block;               /* parts take whole tile blocks */
} wg_job;

/* V = B^T d B of the 16 tiles from pc (a tile's 4 x 4 patch element (r, k) in stride-2 phase
 * (r % 2, k % 2), L floats a phase, at (r / 2) * Wq + k / 2): element xi of the 16 tiles at
 * v + xi * vs (unaligned stores) */
RC_INLINE void wg_in16(const float *pc, Py_ssize_t L, Py_ssize_t Wq, float *v, Py_ssize_t vs)
{
    v16f d[4][4], t[4][4];
    for (int r = 0; r < 4; r++)
        for (int k = 0; k < 4; k++)
            d[r][k] = *(const v16f_u *)(pc + ((r & 1) * 2 + (k & 1)) * L + (r >> 1) * Wq + (k >> 1));
    for (int k = 0; k < 4; k++) { /* B^T d */
        t[0][k] = d[0][k] - d[2][k];
        t[1][k] = d[1][k] + d[2][k];
        t[2][k] = d[2][k] - d[1][k];
        t[3][k] = d[1][k] - d[3][k];
    }
    for (int i = 0; i < 4; i++) { /* (B^T d) B */
        *(v16f_u *)(v + (4 * i + 0) * vs) = t[i][0] - t[i][2];
        *(v16f_u *)(v + (4 * i + 1) * vs) = t[i][1] + t[i][2];
        *(v16f_u *)(v + (4 * i + 2) * vs) = t[i][2] - t[i][1];
        *(v16f_u *)(v + (4 * i + 3) * vs) = t[i][1] - t[i][3];
    }
}

/* Y = A^T M A of 16 lanes: element a of M at m + a * ms; the 2 x 2 outputs (row-major) into y[4] */
RC_INLINE void wg_out16(const float *m, Py_ssize_t ms, v16f y[4])
{
    v16f x[4][4], r0[4], r1[4];
    for (int a = 0; a < 16; a++)
        x[a >> 2][a & 3] = *(const v16f *)(m + a * ms);
    for (int k = 0; k < 4; k++) { /* A^T M */
        r0[k] = x[0][k] + x[1][k] + x[2][k];
        r1[k] = x[1][k] - x[2][k] - x[3][k];
    }
    y[0] = r0[0] + r0[1] + r0[2]; /* (A^T M) A */
    y[1] = r0[1] - r0[2] - r0[3];
    y[2] = r1[0] + r1[1] + r1[2];
    y[3] = r1[1] - r1[2] - r1[3];
}

/* V[16][C][48] of the 48 tiles from q0 */
CV_CLONES static void wg_input(const wg_job *j, Py_ssize_t q0, float *restrict V)
{
    const Py_ssize_t L = j->L, Wq = j->Wq, C = j->C;
    for (Py_ssize_t c = 0; c < C; c++) {
        const float *pc = j->planes + c * 4 * L + q0;
        for (int g = 0; g < CV_NV; g++)
            wg_in16(pc + 16 * g, L, Wq, V + c * CV_NR + 16 * g, C * CV_NR);
    }
}


/* yr[2t], yr[2t + 1] = clip(o0[t] or o1[t] + bias (+ zr[...])) for t in [0, n): 16 tiles a
 * step, interleaved into 32 outputs; a run of 16 or more ends with a step that overlaps the
 * one before (it writes the same values again), a shorter one is scalar */
RC_INLINE void wg_row(float *restrict yr, const float *restrict zr, const float *restrict o0,
                      const float *restrict o1, Py_ssize_t n, float bias, float lo, float hi)
{
    if (n < 16) {
        for (Py_ssize_t t = 0; t < n; t++) {
            yr[2 * t] = clipf(o0[t] + bias + (zr ? zr[2 * t] : 0.0f), lo, hi);
            yr[2 * t + 1] = clipf(o1[t] + bias + (zr ? zr[2 * t + 1] : 0.0f), lo, hi);
        }
        return;
    }
    const v16f vb = cv_bcast(bias), vlo = cv_bcast(lo), vhi = cv_bcast(hi);
    for (Py_ssize_t t = 0;; t += 16) {
        if (t + 16 > n)
            t = n - 16;
        const v16f a = *(const v16f_u *)(o0 + t), b = *(const v16f_u *)(o1 + t);
        v16f e0 = __builtin_shuffle(a, b, (v16i){0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23});
        v16f e1 = __builtin_shuffle(a, b, (v16i){8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31});
        e0 += vb;
        e1 += vb;
        if (zr) {
            e0 += *(const v16f_u *)(zr + 2 * t);
            e1 += *(const v16f_u *)(zr + 2 * t + 16);
        }
        *(v16f_u *)(yr + 2 * t) = v16_clip(e0, vlo, vhi);
        *(v16f_u *)(yr + 2 * t + 16) = v16_clip(e1, vlo, vhi);
        if (t + 16 >= n)
            break;
    }
}

/* Y of channel block mb for the 48 tiles from q0, from M[16][8 x 48] */
CV_CLONES static void wg_output(const wg_job *j, Py_ssize_t mb, Py_ssize_t q0, const float *restrict Mx)
{
    float out[4][CV_NR] __attribute__((aligned(64)));
    const Py_ssize_t P = j->OH * j->OW, Wq = j->Wq;
    const Py_ssize_t qend = q0 + CV_NR < j->OH2 * Wq ? q0 + CV_NR : j->OH2 * Wq;
    for (int i = 0; i < CV_MR; i++) {
        const Py_ssize_t m = mb * CV_MR + i;
        if (m >= j->M)
            break;
        for (int g = 0; g < CV_NV; g++) {
            v16f o[4];
            wg_out16(Mx + (i * CV_NV + g) * 16, CV_MR * CV_NR, o);
            for (int a = 0; a < 4; a++)
                *(v16f *)(out[a] + 16 * g) = o[a];
        }
        const float bias = j->b ? j->b[m] : 0.0f;
        float *ym = j->y + m * P;
        const float *zm = j->z ? j->z + m * P : NULL;
        for (Py_ssize_t q = q0; q < qend;) {
            const Py_ssize_t ti = q / Wq, tj = q - ti * Wq;
            const Py_ssize_t rowend = ti * Wq + j->OW2, e = rowend < qend ? rowend : qend;
            for (int a = 0; a < 2 && tj < j->OW2; a++) {
                const Py_ssize_t oh = 2 * ti + a;
                if (oh >= j->OH)
                    break;
                const float *o0 = out[2 * a] - q0, *o1 = out[2 * a + 1] - q0;
                float *yr = ym + oh * j->OW;
                const float *zr = zm ? zm + oh * j->OW : NULL;
                /* whole pairs of columns, then a last lone column of an odd width */
                const Py_ssize_t pe = e == rowend && (j->OW & 1) ? e - 1 : e;
                const Py_ssize_t ow0 = 2 * (q - ti * Wq);
                wg_row(yr + ow0, zr ? zr + ow0 : NULL, o0 + q, o1 + q, pe - q, bias, j->lo, j->hi);
                if (pe < e) {
                    const Py_ssize_t ow = 2 * (pe - ti * Wq);
                    yr[ow] = clipf(o0[pe] + bias + (zr ? zr[ow] : 0.0f), j->lo, j->hi);
                }
            }
            q = (ti + 1) * Wq;
        }
    }
}

static void wg_part(void *arg, int part, int parts)
{
    const wg_job *j = (const wg_job *)arg;
    float *V = j->scratch + (Py_ssize_t)part * j->scratch_n;
    float *Mx = V + 16 * j->C * CV_NR;
    /* units: tile blocks, each with all its channel blocks (one input transform a block);
       or, with fewer blocks than parts, (tile block, channel block) pairs */
    const Py_ssize_t per = j->by_block ? j->Mb : 1;
    const Py_ssize_t units = j->nblk * j->Mb / per;
    const Py_ssize_t u0 = units * part / parts * per, u1 = units * (part + 1) / parts * per;
    const Py_ssize_t zero = 0;
    Py_ssize_t have = -1; /* the tile block whose V this part holds */
    for (Py_ssize_t u = u0; u < u1; u++) {
        if (rc_stop_requested()) /* the run was cancelled: its output is discarded */
            return;
        const Py_ssize_t blk = u / j->Mb, mb = u - blk * j->Mb, q0 = blk * CV_NR;
        if (blk != have) {
            wg_input(j, q0, V);
            have = blk;
        }
        for (int xi = 0; xi < 16; xi++)
            cv_tiles[CV_NV](V + xi * j->C * CV_NR, &zero, 1, j->C, CV_NR,
                     j->u + ((Py_ssize_t)xi * j->Mb + mb) * j->C * CV_MR, Mx + xi * CV_MR * CV_NR, 0);
        wg_output(j, mb, q0, Mx);
    }
}

/* ---------------------------------------------------------------------------------------
 * The same F(2x2, 3x3) with the output channels in the vector lanes (lanes=1), for the small
 * planes where a block of 48 tiles is mostly waste (ResNet's 14 x 14 stage: 49 tiles, 96
 * computed): the input transform of the whole image first, V[16][C][NT] with the NT = OH2 *
 * OW2 tiles compact (no dropped tile a row), on the kernel threads by channels; then units of
 * (32 output channels, a group of row segments of up to CT_NP tiles), the 16 GEMMs on the lane
 * tiles (ct_tile*, weights U packed [16][ceil(M / 32)][C][32]), the output transform 16
 * channels a vector and its 2 x 2 outputs scattered into NCHW by channel.
 * --------------------------------------------------------------------------------------- */
#define WL_GROUP 8 /* row segments a unit: each of the 16 weight blocks (C x 32) is read once for them */
#define WL_KC 128  /* input channels a pass of the group's segments */

typedef struct {
    const float *planes, *u, *b, *z;
    float *y, *V, *scratch; /* scratch per part: WL_GROUP x 16 x CT_NP x 32, then 4 x CT_NP x 32 */
    Py_ssize_t C, M, Mb, OH, OW, OH2, OW2, Wq, L, NT, NTs, nseg, ngrp, scratch_n;
    float lo, hi;
} wl_job;

/* V rows of channels [c0, c1): tile t = ti * OW2 + tj at V[(xi * C + c) * NTs + t]; each tile
 * row is written 16 tiles a vector in increasing order, a vector's lanes past the row's end
 * overwritten by the next row (NTs leaves room for the last one's) */
CV_CLONES static void wl_input(const wl_job *j, Py_ssize_t c0, Py_ssize_t c1)
{
    const Py_ssize_t L = j->L, Wq = j->Wq, C = j->C, NTs = j->NTs;
    for (Py_ssize_t c = c0; c < c1; c++)
        for (Py_ssize_t ti = 0; ti < j->OH2; ti++)
            for (Py_ssize_t tj = 0; tj < j->OW2; tj += 16)
                wg_in16(j->planes + c * 4 * L + ti * Wq + tj, L, Wq, j->V + c * NTs + ti * j->OW2 + tj, C * NTs);
}

static void wl_input_part(void *arg, int part, int parts)
{
    const wl_job *j = (const wl_job *)arg;
    wl_input(j, j->C * part / parts, j->C * (part + 1) / parts);
}

/* the outputs of channel block mb for tiles [t0, t0 + n) from Mx[16][n][32]: A^T M A of 16
 * channels a vector plus bias into O[4][n][32], then by channel, residual and clip, into Y */
CV_CLONES static void wl_output(const wl_job *j, Py_ssize_t mb, Py_ssize_t t0, int n, const float *restrict Mx,
                                float *restrict O)
{
    float bias[CT_MR] __attribute__((aligned(64)));
    for (int k = 0; k < CT_MR; k++) {
        const Py_ssize_t m = mb * CT_MR + k;
        bias[k] = j->b && m < j->M ? j->b[m] : 0.0f;
    }
    for (int p = 0; p < n; p++)
        for (int v = 0; v < CT_NB; v++) {
            v16f o[4];
            wg_out16(Mx + p * CT_MR + 16 * v, CT_NP * CT_MR, o);
            const v16f vb = *(const v16f *)(bias + 16 * v);
            for (int a = 0; a < 4; a++)
                *(v16f *)(O + (a * CT_NP + p) * CT_MR + 16 * v) = o[a] + vb;
        }
    const Py_ssize_t P = j->OH * j->OW, OW = j->OW;
    for (int k = 0; k < CT_MR; k++) {
        const Py_ssize_t m = mb * CT_MR + k;
        if (m >= j->M)
            break;
        float *ym = j->y + m * P;
        const float *zm = j->z ? j->z + m * P : NULL;
        Py_ssize_t ti = t0 / j->OW2, tj = t0 - ti * j->OW2;
        for (int p = 0; p < n; p++) {
            for (int a = 0; a < 4; a++) {
                const Py_ssize_t oh = 2 * ti + (a >> 1), ow = 2 * tj + (a & 1);
                if (oh < j->OH && ow < OW) {
                    const float r = O[(a * CT_NP + p) * CT_MR + k] + (zm ? zm[oh * OW + ow] : 0.0f);
                    ym[oh * OW + ow] = clipf(r, j->lo, j->hi);
                }
            }
            if (++tj == j->OW2) {
                tj = 0;
                ti++;
            }
        }
    }
}

static void wl_part(void *arg, int part, int parts)
{
    const wl_job *j = (const wl_job *)arg;
    float *Mx = j->scratch + (Py_ssize_t)part * j->scratch_n;
    float *O = Mx + (Py_ssize_t)WL_GROUP * 16 * CT_NP * CT_MR;
    const Py_ssize_t units = j->Mb * j->ngrp, C = j->C, NTs = j->NTs;
    const Py_ssize_t zero = 0;
    for (Py_ssize_t u = units * part / parts; u < units * (part + 1) / parts; u++) {
        if (rc_stop_requested()) /* the run was cancelled: its output is discarded */
            return;
        const Py_ssize_t mb = u / j->ngrp, g = u - mb * j->ngrp;
        const Py_ssize_t s0 = j->nseg * g / j->ngrp, s1 = j->nseg * (g + 1) / j->ngrp;
        for (int xi = 0; xi < 16; xi++)
            for (Py_ssize_t c0 = 0; c0 < C; c0 += WL_KC) {
                /* a chunk of the weights (16 KB) stays in L1 while the group's segments pass */
                const Py_ssize_t cn = C - c0 < WL_KC ? C - c0 : WL_KC;
                const float *wp = j->u + (((Py_ssize_t)xi * j->Mb + mb) * C + c0) * CT_MR;
                /* the next chunk (the next xi's first after the last), asked into L2 a share by
                   each segment after the first: U comes from memory and the first
                   segment's pass waited on it */
                const char *nx = NULL;
                Py_ssize_t nbytes = 0;
                if (c0 + cn < C) {
                    nx = (const char *)(wp + cn * CT_MR);
                    nbytes = (Py_ssize_t)sizeof(float) * CT_MR * (C - c0 - cn < WL_KC ? C - c0 - cn : WL_KC);
                } else if (xi + 1 < 16) {
                    nx = (const char *)(j->u + ((Py_ssize_t)(xi + 1) * j->Mb + mb) * C * CT_MR);
                    nbytes = (Py_ssize_t)sizeof(float) * CT_MR * (C < WL_KC ? C : WL_KC);
                }
                for (Py_ssize_t s = s0; s < s1; s++) {
                    Py_ssize_t t0;
                    int n;
                    ct_segment(j->NT, j->nseg, s, &t0, &n);
                    const char *pf;
                    const Py_ssize_t npf = rc_pf_share(nx, nbytes, s1 - s0 - 1, s - s0 - 1, 64, &pf);
                    ct_tiles[n](j->V + ((Py_ssize_t)xi * C + c0) * NTs + t0, &zero, 1, cn, NTs, wp,
                                Mx + ((s - s0) * 16 + xi) * CT_NP * CT_MR, c0 > 0, pf, npf);
                }
            }
        for (Py_ssize_t s = s0; s < s1; s++) {
            Py_ssize_t t0;
            int n;
            ct_segment(j->NT, j->nseg, s, &t0, &n);
            wl_output(j, mb, t0, n, Mx + (s - s0) * 16 * CT_NP * CT_MR, O);
        }
    }
}

/* winograd3x3 with lanes: the buffers checked, the planes filled; see wl_job */
static void wl_run(wl_job *j, cv_fill_job *f, const float *x, float *y, const float *z, Py_ssize_t N,
                   int fparts, int fthreads, int vparts, int vthreads, int parts, int threads)
{
    for (Py_ssize_t n = 0; n < N; n++) {
        f->x = x + n * j->C * f->H * f->W;
        rc_parallel(cv_fill_part, f, fparts, fthreads);
        rc_parallel(wl_input_part, j, vparts, vthreads);
        j->y = y + n * j->M * j->OH * j->OW;
        j->z = z ? z + n * j->M * j->OH * j->OW : NULL;
        rc_parallel(wl_part, j, parts, threads);
    }
}

PyObject *rc_py_winograd3x3(PyObject *self, PyObject *args)
{
    PyObject *xo, *uo, *bo, *zo, *yo;
    Py_ssize_t N, C, H, W, M, pt, pl, OH, OW;
    float lo, hi;
    int threads, lanes = 0;
    if (!PyArg_ParseTuple(args, "OOOOO(nnnn)n(nn)(nn)ffi|p:winograd3x3", &xo, &uo, &bo, &zo, &yo,
                          &N, &C, &H, &W, &M, &pt, &pl, &OH, &OW, &lo, &hi, &threads, &lanes))
        return NULL;
    if (N < 0 || C < 1 || H < 0 || W < 0 || M < 1 || pt < 0 || pl < 0 || OH < 1 || OW < 1) {
        PyErr_SetString(PyExc_ValueError, "winograd3x3: negative or zero size");
        return NULL;
    }
    const Py_ssize_t mr = lanes ? CT_MR : CV_MR;
    const Py_ssize_t Mb = M / mr + (M % mr != 0), OH2 = OH / 2 + (OH & 1), OW2 = OW / 2 + (OW & 1);
    rc_sz sz = {NULL};
    const Py_ssize_t xn = sz_mul4(&sz, "X's size", N, C, H, W), un = sz_mul4(&sz, "U's size", 16, Mb, C, mr);
    const Py_ssize_t yn = sz_mul4(&sz, "Y's size", N, M, OH, OW);
    if (sz_check(&sz, "winograd3x3", PyExc_ValueError) < 0)
        return NULL;
    /* the padded input of the tiles: 2 * OH2 + 2 rows, 2 * OW2 + 2 columns, in stride-2 phases
       of Hq x Wq; a block reads up to 47 tiles past the last and Wq + 1 past a tile */
    const Py_ssize_t Hp = 2 * OH2 + 2, Wp = 2 * OW2 + 2, Hq = OH2 + 1, Wq = OW2 + 1;
    const Py_ssize_t L = sz_add(&sz, "the phase planes", sz_mul(&sz, "the phase planes", Hq, Wq), Wq + 2 * CV_NR);
    const Py_ssize_t Q = sz_mul(&sz, "the tiles", OH2, Wq), nblk = Q / CV_NR + (Q % CV_NR != 0);
    /* the largest work buffer either form takes (planes, V, 256 parts' scratch), in bytes */
    const Py_ssize_t NT = sz_mul(&sz, "the tiles", OH2, OW2);
    sz_add(&sz, "the work buffer",
           sz_add(&sz, "the work buffer", sz_mul4(&sz, "the phase planes", C, 4, L, RC_F32),
                  sz_mul4(&sz, "the transformed input", 16, C, sz_add(&sz, "the tiles", NT, 16 + 64), RC_F32)),
           sz_mul4(&sz, "the work buffer", 256, 16 * RC_F32, sz_add(&sz, "the work buffer", C, 1), CV_NR + WL_GROUP * CT_NP * CT_MR));
    if (sz_check(&sz, "winograd3x3", PyExc_MemoryError) < 0)
        return NULL;
    pt = pt < Hp ? pt : Hp; /* a pad past the tiles reads the same as one at their end */
    pl = pl < Wp ? pl : Wp;
    Py_buffer v[5];
    const rc_buf spec[5] = {{xo, xn, RC_F32, 0, 0, "X"}, {uo, un, RC_F32, 0, 0, "U"},
                            {bo, M, RC_F32, 0, 1, "B"}, {zo, yn, RC_F32, 0, 1, "Z"},
                            {yo, yn, RC_F32, 1, 0, "Y"}};
    if (get_buffers("winograd3x3", spec, v, 5) < 0)
        return NULL;
    int fthreads = threads;
    if (lanes) {
        if ((uintptr_t)v[1].buf & 63) {
            release_buffers(v, 5);
            PyErr_SetString(PyExc_ValueError, "winograd3x3: the lane-packed weights must be 64-byte aligned");
            return NULL;
        }
        const Py_ssize_t NTs = NT + 16, nseg = (NT + CT_NP - 1) / CT_NP;
        const Py_ssize_t ngrp = (nseg + WL_GROUP - 1) / WL_GROUP;
        const double flops = 2.0 * 16.0 * (double)Mb * CT_MR * (double)C * (double)NT;
        const int parts = rc_parts(flops, 2.5e5, Mb * ngrp, &threads);
        const int fparts = rc_parts((double)(C * 4 * L), 16384.0, C, &fthreads);
        int vthreads = fthreads;
        const int vparts = rc_parts((double)(C * 16 * NTs), 16384.0, C, &vthreads);
        const Py_ssize_t scratch_n = (Py_ssize_t)(WL_GROUP * 16 + 4) * CT_NP * CT_MR;
        const size_t plane_bytes = ((size_t)(C * 4 * L) * sizeof(float) + 63) & ~(size_t)63;
        const size_t v_bytes = ((size_t)(16 * C * NTs) * sizeof(float) + 63) & ~(size_t)63;
        const size_t work = plane_bytes + v_bytes + (size_t)parts * scratch_n * sizeof(float);
        float *planes = (float *)rc_work(work);
        if (!planes) {
            release_buffers(v, 5);
            return PyErr_NoMemory();
        }
        wl_job j = {planes, (const float *)v[1].buf, (const float *)v[2].buf, NULL, NULL,
                    planes + plane_bytes / sizeof(float), planes + (plane_bytes + v_bytes) / sizeof(float),
                    C, M, Mb, OH, OW, OH2, OW2, Wq, L, NT, NTs, nseg, ngrp, scratch_n, lo, hi};
        cv_fill_job f = {NULL, planes, C, H, W, pt, pl, 2, 2, Hp, Wp, Wq, L, {1, 1, 1, 1}};
        Py_BEGIN_ALLOW_THREADS
        wl_run(&j, &f, (const float *)v[0].buf, (float *)v[4].buf, (const float *)v[3].buf, N, fparts,
               fthreads, vparts, vthreads, parts, threads);
        Py_END_ALLOW_THREADS
        rc_work_done(planes, work);
        release_buffers(v, 5);
        Py_RETURN_NONE;
    }
    const double flops = 2.0 * 16.0 * (double)Mb * CV_MR * (double)C * (double)(nblk * CV_NR);
    const int by_block = nblk >= 2 * threads;
    const int parts = rc_parts(flops, 2.5e5, by_block ? nblk : nblk * Mb, &threads);
    const int fparts = rc_parts((double)(C * 4 * L), 16384.0, C, &fthreads);
    const Py_ssize_t scratch_n = 16 * C * CV_NR + 16 * CV_MR * CV_NR;
    const size_t plane_bytes = ((size_t)(C * 4 * L) * sizeof(float) + 63) & ~(size_t)63;
    const size_t work = plane_bytes + (size_t)parts * scratch_n * sizeof(float);
    float *planes = (float *)rc_work(work);
    if (!planes) {
        release_buffers(v, 5);
        return PyErr_NoMemory();
    }
    wg_job j = {planes, (const float *)v[1].buf, (const float *)v[2].buf, NULL, NULL,
                planes + plane_bytes / sizeof(float), C, M, Mb, OH, OW, OH2, OW2, Wq, L, nblk,
                scratch_n, lo, hi, by_block};
    cv_fill_job f = {NULL, planes, C, H, W, pt, pl, 2, 2, Hp, Wp, Wq, L, {1, 1, 1, 1}};
    const float *x = (const float *)v[0].buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t n = 0; n < N; n++) {
        f.x = x + n * C * H * W;
        rc_parallel(cv_fill_part, &f, fparts, fthreads);
        j.y = (float *)v[4].buf + n * M * OH * OW;
        j.z = v[3].buf ? (const float *)v[3].buf + n * M * OH * OW : NULL;
        rc_parallel(wg_part, &j, parts, threads);
    }
    Py_END_ALLOW_THREADS
    rc_work_done(planes, work);
    release_buffers(v, 5);
    Py_RETURN_NONE;
}
