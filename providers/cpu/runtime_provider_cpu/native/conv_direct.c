#include "native.h"

/* ---------------------------------------------------------------------------------------
 * conv2d: a dense 2-D convolution (group 1) of float32 NCHW tensors without an im2col
 * matrix. The zero-padded input is copied once into its stride phases (sh * sw planes per
 * channel: rows and columns congruent mod the stride; one plane for stride 1), each of
 * width Wq. On that grid every kernel tap is a constant offset, so output position
 * q = oh * Wq + ow reads plane[q + off(tap)] for every tap: the convolution is a GEMM whose
 * B matrix rows are contiguous runs of the planes, read in place (the Wq - OW columns past
 * each output row are computed and dropped). The micro-kernel keeps CV_MR output channels x
 * CV_NV * 16 positions in registers over the whole K = C * KH * KW sum, the weights packed
 * as [M / CV_MR][K][CV_MR] (ops/nn._pack_direct), and its epilogue adds the bias and the
 * residual Z and clips while writing the tile to Y. Output channel blocks x position tiles
 * are split between the threads of a small pthread pool (rc_parallel).
 * --------------------------------------------------------------------------------------- */

/* one tile: o[i][0 .. 16 * NV) (+)= sum over c, t of wp[(c * T + t) * MR + i] * xb[c * cs + toff[t] + ...],
 * added to what o holds when add is set (o: 64-byte aligned) */
#define CV_TILE(NV)                                                                              \
    CV_CLONES static void cv_tile##NV(const float *restrict xb, const Py_ssize_t *restrict toff,  \
                                      Py_ssize_t T, Py_ssize_t C, Py_ssize_t cs,                  \
                                      const float *restrict wp, float *restrict o, int add)       \
    {                                                                                            \
        v16f acc[CV_MR][NV];                                                                     \
        for (int i = 0; i < CV_MR; i++)                                                          \
            for (int v = 0; v < NV; v++)                                                         \
                acc[i][v] = add ? *(const v16f *)(o + (i * NV + v) * 16) : (v16f){0};            \
        for (Py_ssize_t c = 0; c < C; c++) {                                                     \
            const float *xc = xb + c * cs;                                                       \
            for (Py_ssize_t t = 0; t < T; t++) {                                                 \
                const float *xt = xc + toff[t];                                                  \
                v16f xv[NV];                                                                     \
                for (int v = 0; v < NV; v++)                                                     \
                    xv[v] = *(const v16f_u *)(xt + 16 * v);                                      \
                for (int i = 0; i < CV_MR; i++) {                                                \
                    const v16f wv = cv_bcast(wp[i]);                                           \
                    for (int v = 0; v < NV; v++)                                                 \
                        acc[i][v] += wv * xv[v];                                                 \
                }                                                                                \
                wp += CV_MR;                                                                     \
            }                                                                                    \
        }                                                                                        \
        for (int i = 0; i < CV_MR; i++)                                                          \
            for (int v = 0; v < NV; v++)                                                         \
                *(v16f *)(o + (i * NV + v) * 16) = acc[i][v];                                    \
    }
CV_TILE(1)
CV_TILE(2)
CV_TILE(3)

const cv_tile_f cv_tiles[CV_NV + 1] = {NULL, cv_tile1, cv_tile2, cv_tile3}; /* by 16-float vectors */

typedef struct {
    const float *planes, *wp, *b, *z; /* z: this image's residual (M x OH x OW) or NULL */
    float *y;                         /* this image's output (M x OH x OW) */
    const Py_ssize_t *toff;
    float *scratch;                   /* CV_SUB tiles a part, 64-byte aligned */
    Py_ssize_t T, C, cs, M, Mb, Q, nq, Wq, OH, OW;
    Py_ssize_t kc;                    /* input channels a pass over the tiles of a group */
    float lo, hi;
    int tiles_outer;
    int lanes;                        /* output channels in the lanes (ct_run): Mb blocks of 32 */
    const rc_act *act;                /* FusedConv's activation after the clip, or NULL */
} cv_job;

/* a's activation of y[0 .. n) in place, 16 at a time, the tail through a local vector (the
 * epilogues' rows are L1-hot: a pass of its own over the output was a single-threaded read and
 * write of it after the kernel) */
CV_CLONES static void cv_act_row(float *y, Py_ssize_t n, const rc_act *a)
{
    Py_ssize_t k = 0;
    for (; k + 16 <= n; k += 16)
        *(v16f_u *)(y + k) = rc_act16(*(const v16f_u *)(y + k), a);
    if (k < n) {
        v16f t = {0};
        for (Py_ssize_t i = 0; k + i < n; i++)
            t[i] = y[k + i];
        t = rc_act16(t, a);
        for (Py_ssize_t i = 0; k + i < n; i++)
            y[k + i] = t[i];
    }
}

/* the epilogue of one tile: bias, residual and clip, written to the OW real columns of Y
 * (cloned: the baseline build of this loop was a large share of a short sum's time; see
 * docs/performance.md) */
CV_CLONES static void cv_store(const cv_job *j, Py_ssize_t mb, Py_ssize_t q0, int nv, float *o)
{
    const Py_ssize_t P = j->OH * j->OW, left = j->Q - q0;
    const Py_ssize_t qend = q0 + (left < 16 * nv ? left : 16 * nv);
    const v16f vlo = cv_bcast(j->lo), vhi = cv_bcast(j->hi);
    for (int i = 0; i < CV_MR; i++) {
        const Py_ssize_t m = mb * CV_MR + i;
        if (m >= j->M)
            break;
        float *row = o + i * nv * 16;
        const float *r = row - q0; /* r[q]: position q of this tile row */
        const float bias = j->b ? j->b[m] : 0.0f;
        const v16f vb = cv_bcast(bias);
        float *ym = j->y + m * P;
        const float *zm = j->z ? j->z + m * P : NULL;
        if (!zm) /* bias, clip and activation over the row's whole vectors (the columns past OW
                    too, dropped below), then its runs copied: a run's short tail no longer takes
                    scalar code and a partial vector's activation */
            for (int v = 0; v < nv; v++) {
                const v16f t = v16_clip(*(v16f *)(row + 16 * v) + vb, vlo, vhi);
                *(v16f *)(row + 16 * v) = j->act ? rc_act16(t, j->act) : t;
            }
        for (Py_ssize_t q = q0; q < qend;) {
            const Py_ssize_t oh = q / j->Wq, ow = q - oh * j->Wq;
            const Py_ssize_t rowend = oh * j->Wq + j->OW; /* past the row's last output */
            const Py_ssize_t e = rowend < qend ? rowend : qend;
            if (ow < j->OW) {
                float *dst = ym + oh * j->OW + ow;
                const float *src = r + q;
                const Py_ssize_t n = e - q;
                if (!zm) {
                    memcpy(dst, src, (size_t)n * sizeof(float));
                } else {
                    const float *zs = zm + oh * j->OW + ow;
                    Py_ssize_t k = 0;
                    for (; k + 16 <= n; k += 16) {
                        const v16f t = v16_clip(*(const v16f_u *)(src + k) + vb + *(const v16f_u *)(zs + k), vlo, vhi);
                        *(v16f_u *)(dst + k) = j->act ? rc_act16(t, j->act) : t;
                    }
                    for (Py_ssize_t i2 = k; i2 < n; i2++)
                        dst[i2] = clipf(src[i2] + bias + zs[i2], j->lo, j->hi);
                    if (j->act && k < n)
                        cv_act_row(dst + k, n - k, j->act);
                }
            }
            q = (oh + 1) * j->Wq;
        }
    }
}

#define CV_SUB 64 /* tiles that share one pass over a chunk of the input channels */

/* tiles [u0, u1) of the (channel block, position tile) grid, row-major, into scratch.
 * Position tiles are outer when the input is the larger operand (a stripe of it stays in L1
 * while every channel block passes), channel blocks otherwise. Up to CV_SUB tiles of one
 * outer index make a group, and the group takes the input channels kc at a time, each tile's
 * sums kept in scratch between chunks: the chunk of input (or of weights) the group shares
 * stays in L1 instead of coming from L2 for every tile */
static void cv_run(const cv_job *j, Py_ssize_t u0, Py_ssize_t u1, float *scratch)
{
    const Py_ssize_t K = j->C * j->T, inner_n = j->tiles_outer ? j->Mb : j->nq;
    for (Py_ssize_t u = u0; u < u1;) {
        if (rc_stop_requested()) /* the run was cancelled: its output is discarded */
            return;
        const Py_ssize_t outer = u / inner_n, i0 = u - outer * inner_n;
        Py_ssize_t i1 = outer * inner_n + inner_n <= u1 ? inner_n : u1 - outer * inner_n;
        if (i1 - i0 > CV_SUB)
            i1 = i0 + CV_SUB;
        for (Py_ssize_t c0 = 0; c0 < j->C; c0 += j->kc) {
            const Py_ssize_t cn = j->C - c0 < j->kc ? j->C - c0 : j->kc;
            for (Py_ssize_t i = i0; i < i1; i++) {
                const Py_ssize_t mb = j->tiles_outer ? i : outer;
                const Py_ssize_t q0 = (j->tiles_outer ? outer : i) * CV_NR;
                const Py_ssize_t left = j->Q - q0;
                const int nv = left >= CV_NR ? CV_NV : (int)((left + 15) / 16);
                const float *wp = j->wp + (mb * K + c0 * j->T) * CV_MR;
                const float *xb = j->planes + q0 + c0 * j->cs;
                float *o = scratch + (i - i0) * CV_MR * CV_NR;
                cv_tiles[nv](xb, j->toff, j->T, cn, j->cs, wp, o, c0 > 0);
            }
        }
        for (Py_ssize_t i = i0; i < i1; i++) {
            const Py_ssize_t mb = j->tiles_outer ? i : outer;
            const Py_ssize_t q0 = (j->tiles_outer ? outer : i) * CV_NR;
            const Py_ssize_t left = j->Q - q0;
            const int nv = left >= CV_NR ? CV_NV : (int)((left + 15) / 16);
            cv_store(j, mb, q0, nv, scratch + (i - i0) * CV_MR * CV_NR);
        }
        u = outer * inner_n + i1;
    }
}

/* ---------------------------------------------------------------------------------------
 * The same convolution with output channels in the vector lanes, for small outputs (ResNet's
 * 14 x 14 and 7 x 7 stages): a tile is CT_MR = 32 output channels x up to CT_NP positions of
 * one output row, each position's input broadcast from the planes (positions of a row are
 * contiguous in its phase plane), the weights packed as [M / 32][K][32] and read as two
 * vectors. No column past OW is computed: on the Wq grid above a 7-wide output computes
 * 9 columns a row (22% of the work dropped), 14-wide 16. The tile's sums are written
 * position-major to the scratch and turned to NCHW by the epilogue.
 * --------------------------------------------------------------------------------------- */

/* o[p][0 .. 32) (+)= sum over c, t of xb[c * cs + toff[t] + p] * wp[(c * T + t) * 32 + ...];
 * and npf cache lines from pf asked into L2, one a step (a burst of them stalled the core) */
#define CT_TILE(NP)                                                                              \
    CV_CLONES static void ct_tile##NP(const float *restrict xb, const Py_ssize_t *restrict toff,  \
                                      Py_ssize_t T, Py_ssize_t C, Py_ssize_t cs,                  \
                                      const float *restrict wp, float *restrict o, int add,       \
                                      const char *pf, Py_ssize_t npf)                             \
    {                                                                                            \
        v16f acc[NP][CT_NB];                                                                     \
        for (int p = 0; p < NP; p++)                                                             \
            for (int v = 0; v < CT_NB; v++)                                                      \
                acc[p][v] = add ? *(const v16f *)(o + p * CT_MR + v * 16) : (v16f){0};           \
        for (Py_ssize_t c = 0; c < C; c++) {                                                     \
            const float *xc = xb + c * cs;                                                       \
            for (Py_ssize_t t = 0; t < T; t++) {                                                 \
                const float *xt = xc + toff[t];                                                  \
                if (npf > 0) {                                                                   \
                    __builtin_prefetch(pf, 0, 2);                                                \
                    pf += 64;                                                                    \
                    npf--;                                                                       \
                }                                                                                \
                v16f wv[CT_NB];                                                                  \
                for (int v = 0; v < CT_NB; v++)                                                  \
                    wv[v] = *(const v16f *)(wp + 16 * v);                                        \
                for (int p = 0; p < NP; p++) {                                                   \
                    const v16f xv = cv_bcast(xt[p]);                                             \
                    for (int v = 0; v < CT_NB; v++)                                              \
                        acc[p][v] += xv * wv[v];                                                 \
                }                                                                                \
                wp += CT_MR;                                                                     \
            }                                                                                    \
        }                                                                                        \
        for (int p = 0; p < NP; p++)                                                             \
            for (int v = 0; v < CT_NB; v++)                                                      \
                *(v16f *)(o + p * CT_MR + v * 16) = acc[p][v];                                   \
    }
CT_TILE(1)
CT_TILE(2)
CT_TILE(3)
CT_TILE(4)
CT_TILE(5)
CT_TILE(6)
CT_TILE(7)
CT_TILE(8)
CT_TILE(9)
CT_TILE(10)
CT_TILE(11)
CT_TILE(12)
const ct_tile_f ct_tiles[CT_NP + 1] = {NULL, ct_tile1, ct_tile2, ct_tile3, ct_tile4,
                                              ct_tile5, ct_tile6, ct_tile7, ct_tile8, ct_tile9,
                                              ct_tile10, ct_tile11, ct_tile12};

/* a lane tile's n positions in o (position-major, CT_MR channels from m0 a position): the bias,
 * clip and activation on whole 16-channel vectors, in place, before they are scattered to the
 * channel planes (a's activation over each channel's n <= 12 positions took a partial vector) */
CV_CLONES static void ct_epi(float *o, int n, const float *b, Py_ssize_t m0, Py_ssize_t M, float lo, float hi,
                             const rc_act *a)
{
    v16f bb[CT_NB];
    for (int v = 0; v < CT_NB; v++)
        for (int l = 0; l < 16; l++) {
            const Py_ssize_t m = m0 + v * 16 + l;
            bb[v][l] = b && m < M ? b[m] : 0.0f;
        }
    const v16f vlo = cv_bcast(lo), vhi = cv_bcast(hi);
    for (int p = 0; p < n; p++)
        for (int v = 0; v < CT_NB; v++) {
            v16f *t = (v16f *)(o + p * CT_MR + v * 16);
            *t = rc_act16(v16_clip(*t + bb[v], vlo, vhi), a);
        }
}

/* units [u0, u1) of the (channel block, row segment) grid, channel blocks outer: a group of
 * up to CV_SUB segments takes the input channels kc at a time, the chunk of weights they
 * share staying in L1 */
static void ct_run(const cv_job *j, Py_ssize_t u0, Py_ssize_t u1, float *scratch)
{
    const Py_ssize_t K = j->C * j->T, nseg = (j->OW + CT_NP - 1) / CT_NP, S = j->OH * nseg;
    const Py_ssize_t P = j->OH * j->OW;
    for (Py_ssize_t u = u0; u < u1;) {
        if (rc_stop_requested()) /* the run was cancelled: its output is discarded */
            return;
        const Py_ssize_t mb = u / S, i0 = u - mb * S;
        Py_ssize_t i1 = mb * S + S <= u1 ? S : u1 - mb * S;
        if (i1 - i0 > CV_SUB)
            i1 = i0 + CV_SUB;
        for (Py_ssize_t c0 = 0; c0 < j->C; c0 += j->kc) {
            const Py_ssize_t cn = j->C - c0 < j->kc ? j->C - c0 : j->kc;
            const float *wp = j->wp + (mb * K + c0 * j->T) * CT_MR;
            /* the next chunk of weights (the next block's first at the last chunk), asked
               into L2 a share by each segment after the first, one line a step of its tile:
               the weights come from memory once, and the first segment's pass waited on
               them */
            const char *nx = (const char *)(wp + cn * j->T * CT_MR);
            const Py_ssize_t left = (const char *)(j->wp + j->Mb * K * CT_MR) - nx;
            const Py_ssize_t chunk = (Py_ssize_t)sizeof(float) * j->kc * j->T * CT_MR;
            const Py_ssize_t nbytes = chunk < left ? chunk : left;
            for (Py_ssize_t i = i0; i < i1; i++) {
                const char *pf;
                const Py_ssize_t npf = rc_pf_share(nx, nbytes, i1 - i0 - 1, i - i0 - 1, 64, &pf);
                const Py_ssize_t oh = i / nseg;
                Py_ssize_t ow0;
                int n;
                ct_segment(j->OW, nseg, i - oh * nseg, &ow0, &n);
                ct_tiles[n](j->planes + oh * j->Wq + ow0 + c0 * j->cs, j->toff, j->T, cn, j->cs, wp,
                            scratch + (i - i0) * CT_NP * CT_MR, c0 > 0, pf, npf);
            }
        }
        for (Py_ssize_t i = i0; i < i1; i++) {
            const Py_ssize_t oh = i / nseg;
            Py_ssize_t ow0;
            int n;
            ct_segment(j->OW, nseg, i - oh * nseg, &ow0, &n);
            float *o = scratch + (i - i0) * CT_NP * CT_MR;
            const int pre = j->act && !j->z; /* bias, clip and activation done in o (ct_epi) */
            if (pre)
                ct_epi(o, n, j->b, mb * CT_MR, j->M, j->lo, j->hi, j->act);
            for (Py_ssize_t k = 0; k < CT_MR; k++) {
                const Py_ssize_t m = mb * CT_MR + k;
                if (m >= j->M)
                    break;
                const float bias = j->b ? j->b[m] : 0.0f;
                float *dst = j->y + m * P + oh * j->OW + ow0;
                const float *zs = j->z ? j->z + m * P + oh * j->OW + ow0 : NULL;
                if (pre)
                    for (int p = 0; p < n; p++)
                        dst[p] = o[p * CT_MR + k];
                else if (zs)
                    for (int p = 0; p < n; p++)
                        dst[p] = clipf(o[p * CT_MR + k] + bias + zs[p], j->lo, j->hi);
                else
                    for (int p = 0; p < n; p++)
                        dst[p] = clipf(o[p * CT_MR + k] + bias, j->lo, j->hi);
                if (j->act && !pre)
                    cv_act_row(dst, n, j->act);
            }
        }
        u = mb * S + i1;
    }
}

static void cv_part(void *arg, int part, int parts)
{
    const cv_job *j = (const cv_job *)arg;
    float *scratch = j->scratch + (Py_ssize_t)part * CV_SUB * CV_MR * CV_NR;
    if (j->lanes) {
        const Py_ssize_t units = j->Mb * j->OH * ((j->OW + CT_NP - 1) / CT_NP);
        ct_run(j, units * part / parts, units * (part + 1) / parts, scratch);
        return;
    }
    const Py_ssize_t units = j->Mb * j->nq;
    cv_run(j, units * part / parts, units * (part + 1) / parts, scratch);
}

static void cv_fill(const cv_fill_job *f, Py_ssize_t c0, Py_ssize_t c1)
{
    const Py_ssize_t sh = f->sh, sw = f->sw, L = f->L, W = f->W, Wq = f->Wq, pl = f->pl;
    const Py_ssize_t Hq = (f->Hp + sh - 1) / sh;
    const Py_ssize_t r1 = f->H < f->Hp - f->pt ? f->H : f->Hp - f->pt; /* input rows read */
    const Py_ssize_t cols = W < f->Wp - pl ? W : f->Wp - pl;           /* input columns read */
    for (Py_ssize_t c = c0; c < c1; c++)
        for (Py_ssize_t a = 0; a < sh; a++)
            for (Py_ssize_t b = 0; b < sw; b++) {
                if (sh * sw <= 16 && !f->used[a * sw + b])
                    continue;
                float *pp = f->planes + (c * sh * sw + a * sw + b) * L;
                /* this phase's columns j holding input: b + sw * j in [pl, pl + cols) */
                Py_ssize_t j0 = pl > b ? (pl - b + sw - 1) / sw : 0;
                Py_ssize_t j1 = cols > 0 && pl + cols > b ? (pl + cols - b + sw - 1) / sw : 0;
                if (j1 > Wq)
                    j1 = Wq;
                if (j0 > j1)
                    j0 = j1;
                const Py_ssize_t s0 = b + sw * j0 - pl; /* input column of j0 */
                for (Py_ssize_t i = 0; i < Hq; i++) {
                    float *row = pp + i * Wq;
                    const Py_ssize_t r = a + sh * i - f->pt;
                    if (r < 0 || r >= r1 || j1 == j0) {
                        memset(row, 0, (size_t)Wq * sizeof(float));
                        continue;
                    }
                    const float *src = f->x + (c * f->H + r) * W + s0;
                    memset(row, 0, (size_t)j0 * sizeof(float));
                    const Py_ssize_t n = j1 - j0;
                    float *restrict d = row + j0;
                    if (sw == 1)
                        memcpy(d, src, (size_t)n * sizeof(float));
                    else if (sw == 2)
                        for (Py_ssize_t k = 0; k < n; k++)
                            d[k] = src[2 * k];
                    else
                        for (Py_ssize_t k = 0; k < n; k++)
                            d[k] = src[k * sw];
                    memset(row + j1, 0, (size_t)(Wq - j1) * sizeof(float));
                }
                /* past the last row: read only for outputs that are dropped, zeros all the
                   same (no stale bits, no denormals in the sums) */
                memset(pp + Hq * Wq, 0, (size_t)(L - Hq * Wq) * sizeof(float));
            }
}

/* input channels a pass of the lane kernel's segment groups takes: their weights in about
 * 24 KiB of L1 */
static Py_ssize_t cv_lane_chunk(Py_ssize_t T)
{
    const Py_ssize_t kc = 24576 / (4 * T * CT_MR);
    return kc < 1 ? 1 : kc;
}

/* the offset into a channel's planes (f's phases: strides sh, sw, Wq wide, L floats apart) of
 * each tap of a KH x KW window (dilations dh, dw) from window position (ty, tx) into toff, and
 * the phases they read into f->used */
void cv_taps(Py_ssize_t KH, Py_ssize_t KW, Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t ty, Py_ssize_t tx,
                    Py_ssize_t *toff, cv_fill_job *f)
{
    const Py_ssize_t sh = f->sh, sw = f->sw, Wq = f->Wq, L = f->L;
    for (Py_ssize_t kh = 0; kh < KH; kh++)
        for (Py_ssize_t kw = 0; kw < KW; kw++) {
            const Py_ssize_t rr = ty + kh * dh, cc = tx + kw * dw;
            toff[kh * KW + kw] = ((rr % sh) * sw + cc % sw) * L + (rr / sh) * Wq + cc / sw;
            if (sh * sw <= 16)
                f->used[(rr % sh) * sw + cc % sw] = 1;
        }
}

void cv_fill_part(void *arg, int part, int parts)
{
    const cv_fill_job *f = (const cv_fill_job *)arg;
    cv_fill(f, f->C * part / parts, f->C * (part + 1) / parts);
}

/* input channels a pass of conv2d's tile groups takes: the chunk of the operand the group
 * shares (its input stripe when position tiles are outer, its weights otherwise) in about
 * 24 KiB of L1. A stripe is the union of the taps' 48-float runs in a channel's planes. */
static Py_ssize_t cv_chunk(const Py_ssize_t *toff, Py_ssize_t T, int tiles_outer)
{
    const double budget = 24576.0;
    Py_ssize_t per = T * CV_MR; /* weights: floats a channel */
    if (tiles_outer) {
        Py_ssize_t *o = (Py_ssize_t *)malloc((size_t)T * sizeof(Py_ssize_t));
        if (!o)
            return 16;
        memcpy(o, toff, (size_t)T * sizeof(Py_ssize_t));
        for (Py_ssize_t a = 1; a < T; a++) /* insertion sort: T is a kernel's taps */
            for (Py_ssize_t b = a; b > 0 && o[b - 1] > o[b]; b--) {
                const Py_ssize_t t = o[b];
                o[b] = o[b - 1];
                o[b - 1] = t;
            }
        per = 0;
        Py_ssize_t end = -1;
        for (Py_ssize_t t = 0; t < T; t++) {
            const Py_ssize_t a = o[t] > end ? o[t] : end, e = o[t] + CV_NR;
            if (e > a)
                per += e - a;
            if (e > end)
                end = e;
        }
        free(o);
    }
    const Py_ssize_t kc = (Py_ssize_t)(budget / (4.0 * (double)per));
    return kc < 1 ? 1 : kc;
}

/* conv2d without phase planes, for windows whose padded extent is far larger than the data
 * (extreme strides, dilations or pads): every output the sum over c, then the taps, as the
 * tiles sum, a tap in the padding reading 0, then the tiles' epilogue. A unit is an output
 * plane (image, channel). */
typedef struct {
    const float *x, *wp, *b, *z; /* wp packed as the tiles read it: [ceil(M / mr)][C * KH * KW][mr] */
    float *y;
    Py_ssize_t N, C, H, W, M, KH, KW, sh, sw, dh, dw, pt, pl, ty, tx, OH, OW, mr;
    float lo, hi;
    const rc_act *act; /* after the clip, or NULL */
} cv_direct_job;

CV_CLONES static void cv_direct(const cv_direct_job *d, Py_ssize_t u0, Py_ssize_t u1)
{
    const Py_ssize_t T = d->KH * d->KW, K = d->C * T, P = d->OH * d->OW;
    for (Py_ssize_t u = u0; u < u1; u++) {
        if (rc_stop_requested()) /* the run was cancelled: its output is discarded */
            return;
        const Py_ssize_t n = u / d->M, m = u - n * d->M;
        const float *xn = d->x + n * d->C * d->H * d->W;
        const float *wm = d->wp + (m / d->mr) * K * d->mr + m % d->mr;
        const float bias = d->b ? d->b[m] : 0.0f;
        for (Py_ssize_t oh = 0; oh < d->OH; oh++)
            for (Py_ssize_t ow = 0; ow < d->OW; ow++) {
                float acc = 0.0f;
                for (Py_ssize_t c = 0; c < d->C; c++) {
                    const float *xc = xn + c * d->H * d->W;
                    for (Py_ssize_t kh = 0; kh < d->KH; kh++) {
                        const rc_wide r = (rc_wide)oh * d->sh + d->ty + (rc_wide)kh * d->dh - d->pt;
                        for (Py_ssize_t kw = 0; kw < d->KW; kw++) {
                            const rc_wide q = (rc_wide)ow * d->sw + d->tx + (rc_wide)kw * d->dw - d->pl;
                            const float xv = r >= 0 && r < d->H && q >= 0 && q < d->W
                                                 ? xc[(Py_ssize_t)r * d->W + (Py_ssize_t)q] : 0.0f;
                            acc += wm[(c * T + kh * d->KW + kw) * d->mr] * xv;
                        }
                    }
                }
                const Py_ssize_t o = (n * d->M + m) * P + oh * d->OW + ow;
                d->y[o] = clipf(acc + bias + (d->z ? d->z[o] : 0.0f), d->lo, d->hi);
            }
        if (d->act)
            cv_act_row(d->y + (n * d->M + m) * P, P, d->act);
    }
}

static void cv_direct_part(void *arg, int part, int parts)
{
    const cv_direct_job *d = (const cv_direct_job *)arg;
    const Py_ssize_t units = d->N * d->M;
    cv_direct(d, units * part / parts, units * (part + 1) / parts);
}

PyObject *rc_py_conv2d(PyObject *self, PyObject *args)
{
    PyObject *xo, *wo, *bo, *zo, *yo, *extra = Py_None, *acto = Py_None;
    Py_ssize_t N, C, H, W, M, KH, KW, sh, sw, dh, dw, pt, pl, OH, OW;
    float lo, hi;
    int threads, lanes = 0;
    if (!PyArg_ParseTuple(args, "OOOOO(nnnn)(nnn)(nn)(nn)(nn)(nn)ffi|pOO:conv2d", &xo, &wo, &bo, &zo, &yo,
                          &N, &C, &H, &W, &M, &KH, &KW, &sh, &sw, &dh, &dw, &pt, &pl, &OH, &OW,
                          &lo, &hi, &threads, &lanes, &extra, &acto))
        return NULL;
    /* act: FusedConv's activation of the first convolution, after its clip, in the epilogue */
    rc_act act = {-1, 1.0f / 6.0f, 0.5f};
    if (acto != Py_None) {
        if (!PyArg_ParseTuple(acto, "iff:conv2d act", &act.act, &act.alpha, &act.beta))
            return NULL;
        if (act.act < -1 || act.act > 3) {
            PyErr_SetString(PyExc_ValueError, "conv2d: activation kind not in -1..3");
            return NULL;
        }
    }
    act.act += 1; /* activate's kind -> rc_act's */
    const rc_act *ap = act.act ? &act : NULL;
    if (N < 0 || C < 1 || H < 0 || W < 0 || M < 1 || KH < 1 || KW < 1 || sh < 1 || sw < 1 ||
        dh < 1 || dw < 1 || pt < 0 || pl < 0 || OH < 1 || OW < 1) {
        PyErr_SetString(PyExc_ValueError, "conv2d: negative or zero size, stride or dilation");
        return NULL;
    }
    /* extra: a second convolution, 1x1 of the same strides, read from the same planes at
       padded position (ty, tx) (ResNet's downsampling shortcut beside the block's first 3x3:
       ty = pt, tx = pl), its own weights, bias, residual, output, clip and tiling */
    PyObject *wo2 = NULL, *bo2 = NULL, *zo2 = NULL, *yo2 = NULL;
    Py_ssize_t M2 = 0, ty = 0, tx = 0;
    float lo2 = 0.0f, hi2 = 0.0f;
    int lanes2 = 0;
    if (extra != Py_None) {
        if (!PyArg_ParseTuple(extra, "OOOOnnnffp:conv2d extra", &wo2, &bo2, &zo2, &yo2, &M2, &ty, &tx, &lo2, &hi2,
                              &lanes2))
            return NULL;
        if (M2 < 1 || ty < 0 || tx < 0 || ty > (rc_wide)(KH - 1) * dh || tx > (rc_wide)(KW - 1) * dw) {
            PyErr_SetString(PyExc_ValueError, "conv2d: the extra convolution needs M2 >= 1 and its tap inside "
                                              "the first one's window");
            return NULL;
        }
    }
    /* channel blocks of CV_MR, or of CT_MR with the channels in the lanes */
    const Py_ssize_t mr = lanes ? CT_MR : CV_MR, mr2 = lanes2 ? CT_MR : CV_MR;
    rc_sz sz = {NULL};
    const Py_ssize_t T = sz_mul(&sz, "the kernel's taps", KH, KW), K = sz_mul(&sz, "W's size", C, T);
    const Py_ssize_t Mb = M / mr + (M % mr != 0), Mb2 = M2 / mr2 + (M2 % mr2 != 0);
    const Py_ssize_t xn = sz_mul4(&sz, "X's size", N, C, H, W), wn = sz_mul3(&sz, "W's size", Mb, K, mr);
    const Py_ssize_t yn = sz_mul4(&sz, "Y's size", N, M, OH, OW), wn2 = sz_mul3(&sz, "W2's size", Mb2, C, mr2);
    const Py_ssize_t yn2 = sz_mul4(&sz, "Y2's size", N, M2, OH, OW);
    if (sz_check(&sz, "conv2d", PyExc_ValueError) < 0)
        return NULL;
    /* the padded extent the outputs read, split into phases of Hq x Wq */
    rc_sz ps = {NULL};
    const Py_ssize_t Hp = sz_extent(&ps, "the padded input", OH, sh, KH, dh);
    const Py_ssize_t Wp = sz_extent(&ps, "the padded input", OW, sw, KW, dw);
    const Py_ssize_t Hq = Hp / sh + (Hp % sh != 0), Wq = Wp / sw + (Wp % sw != 0);
    const Py_ssize_t Q = sz_mul(&ps, "the phase planes", OH, Wq), nq = Q / CV_NR + (Q % CV_NR != 0);
    /* a tile reads up to 15 positions past Q, plus the largest tap offset (< Wq + Hq * Wq - Q) */
    const Py_ssize_t L = sz_add(&ps, "the phase planes", sz_mul(&ps, "the phase planes", Hq, Wq),
                                sz_add(&ps, "the phase planes", Wq, 32));
    const Py_ssize_t plane_n = sz_mul4(&ps, "the phase planes", C, sh, sw, L);
    const int nb = extra != Py_None ? 9 : 5;
    Py_buffer v[9]; /* X, packed W, B, Z, Y; then W2, B2, Z2, Y2 */
    const rc_buf spec[9] = {{xo, xn, RC_F32, 0, 0, "X"}, {wo, wn, RC_F32, 0, 0, "W"},
                            {bo, M, RC_F32, 0, 1, "B"}, {zo, yn, RC_F32, 0, 1, "Z"},
                            {yo, yn, RC_F32, 1, 0, "Y"},
                            {wo2, wn2, RC_F32, 0, 0, "W2"}, {bo2, M2, RC_F32, 0, 1, "B2"},
                            {zo2, yn2, RC_F32, 0, 1, "Z2"}, {yo2, yn2, RC_F32, 1, 0, "Y2"}};
    if (get_buffers("conv2d", spec, v, nb) < 0)
        return NULL;
    /* phase planes far larger than the data: the planeless path, sized by nothing */
    if (ps.what || !sz_scratch_ok(plane_n, C * H * W + (M + M2) * OH * OW)) {
        const double work = (double)N * (double)(M + M2) * (double)OH * (double)OW * (double)C * (double)T;
        int t2 = threads;
        cv_direct_job d = {(const float *)v[0].buf, (const float *)v[1].buf, (const float *)v[2].buf,
                           (const float *)v[3].buf, (float *)v[4].buf, N, C, H, W, M, KH, KW, sh, sw, dh, dw, pt, pl,
                           0, 0, OH, OW, mr, lo, hi, ap};
        cv_direct_job d2 = {(const float *)v[0].buf, nb > 5 ? (const float *)v[5].buf : NULL,
                            nb > 5 ? (const float *)v[6].buf : NULL, nb > 5 ? (const float *)v[7].buf : NULL,
                            nb > 5 ? (float *)v[8].buf : NULL, N, C, H, W, M2, 1, 1, sh, sw, 1, 1, pt, pl, ty, tx,
                            OH, OW, mr2, lo2, hi2, NULL};
        const int parts = rc_parts(work, 2.5e5, N * M, &threads), parts2 = rc_parts(work, 2.5e5, N * M2, &t2);
        Py_BEGIN_ALLOW_THREADS
        rc_parallel(cv_direct_part, &d, parts, threads);
        if (nb > 5)
            rc_parallel(cv_direct_part, &d2, parts2, t2);
        Py_END_ALLOW_THREADS
        release_buffers(v, nb);
        Py_RETURN_NONE;
    }
    /* a pad past the windows reads the same as one at their end (and keeps the fill in range) */
    pt = pt < Hp ? pt : Hp;
    pl = pl < Wp ? pl : Wp;
    if ((lanes && ((uintptr_t)v[1].buf & 63)) || (nb > 5 && lanes2 && ((uintptr_t)v[5].buf & 63))) {
        release_buffers(v, nb);
        PyErr_SetString(PyExc_ValueError, "conv2d: the lane-packed weights must be 64-byte aligned");
        return NULL;
    }
    Py_ssize_t *toff = (Py_ssize_t *)malloc(((size_t)T + 1) * sizeof(Py_ssize_t));
    if (!toff) {
        release_buffers(v, nb);
        return PyErr_NoMemory();
    }
    cv_fill_job f = {NULL, NULL, C, H, W, pt, pl, sh, sw, Hp, Wp, Wq, L, {0}};
    cv_taps(KH, KW, dh, dw, 0, 0, toff, &f);
    cv_taps(1, 1, 1, 1, ty, tx, toff + T, &f); /* the extra's one tap */
    /* tiles split between the kernel threads, a thread from about 1/4 MFLOP */
    int fthreads = threads, threads2 = threads;
    const Py_ssize_t units = lanes ? Mb * OH * ((OW + CT_NP - 1) / CT_NP) : Mb * nq;
    const double flops = 2.0 * (double)Mb * mr * (lanes ? (double)OH * (double)OW : (double)Q) * (double)K;
    const int parts = rc_parts(flops, 2.5e5, units, &threads);
    const Py_ssize_t units2 = lanes2 ? Mb2 * OH * ((OW + CT_NP - 1) / CT_NP) : Mb2 * nq;
    const int parts2 = nb > 5 ? rc_parts(2.0 * (double)Mb2 * mr2 * (lanes2 ? (double)OH * (double)OW : (double)Q)
                                         * (double)C, 2.5e5, units2, &threads2) : 0;
    /* the planes filled by channels, a thread from about 64 KiB of them */
    const int fparts = rc_parts((double)plane_n, 16384.0, C, &fthreads);
    const int tiles_outer = plane_n >= Mb * K * CV_MR;
    const int tiles_outer2 = plane_n >= Mb2 * C * CV_MR;
    /* the planes, then the parts' tile sums */
    const int sparts = parts > parts2 ? parts : parts2;
    const Py_ssize_t plane_bytes = sz_add(&ps, "the phase planes", sz_mul(&ps, "the phase planes", plane_n, RC_F32), 63)
                                   & ~(Py_ssize_t)63;
    const Py_ssize_t work = sz_add(&ps, "the work buffer", plane_bytes,
                                   sz_mul(&ps, "the work buffer", sparts, (Py_ssize_t)CV_SUB * CV_MR * CV_NR * RC_F32));
    float *planes = ps.what ? NULL : (float *)rc_work((size_t)work);
    if (!planes) {
        free(toff);
        release_buffers(v, nb);
        if (sz_check(&ps, "conv2d", PyExc_MemoryError) == 0)
            PyErr_NoMemory();
        return NULL;
    }
    float *scratch = planes + plane_bytes / sizeof(float);
    const float *x = (const float *)v[0].buf;
    cv_job j = {planes, (const float *)v[1].buf, (const float *)v[2].buf, NULL, NULL, toff, scratch,
                T, C, sh * sw * L, M, Mb, Q, nq, Wq, OH, OW,
                lanes ? cv_lane_chunk(T) : cv_chunk(toff, T, tiles_outer), lo, hi, tiles_outer, lanes, ap};
    cv_job j2 = {planes, nb > 5 ? (const float *)v[5].buf : NULL, nb > 5 ? (const float *)v[6].buf : NULL, NULL,
                 NULL, toff + T, scratch, 1, C, sh * sw * L, M2, Mb2, Q, nq, Wq, OH, OW,
                 lanes2 ? cv_lane_chunk(1) : cv_chunk(toff + T, 1, tiles_outer2), lo2, hi2, tiles_outer2, lanes2, NULL};
    f.planes = planes;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t n = 0; n < N; n++) {
        f.x = x + n * C * H * W;
        rc_parallel(cv_fill_part, &f, fparts, fthreads);
        j.y = (float *)v[4].buf + n * M * OH * OW;
        j.z = v[3].buf ? (const float *)v[3].buf + n * M * OH * OW : NULL;
        rc_parallel(cv_part, &j, parts, threads);
        if (nb > 5) {
            j2.y = (float *)v[8].buf + n * M2 * OH * OW;
            j2.z = v[7].buf ? (const float *)v[7].buf + n * M2 * OH * OW : NULL;
            rc_parallel(cv_part, &j2, parts2, threads2);
        }
    }
    Py_END_ALLOW_THREADS
    rc_work_done(planes, (size_t)work);
    free(toff);
    release_buffers(v, nb);
    Py_RETURN_NONE;
}
