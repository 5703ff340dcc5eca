#include "native.h"

#if DWF_OK

/* The AVX-512 depthwise path: 3x3, 5x5 or 7x7, dilation 1, stride 1 or 2 both ways. Convolutions
 * run the direct rows below (dwd_plane: dwr_* for 3x3 and 5x5, dwd_vec for 7x7); maxpool2d's
 * 3x3 and depthwise2d(fast=2) the phase
 * planes described here. Each channel's input
 * goes once into zero-padded phase planes (stride 1: the padded plane; stride 2: its four
 * even / odd row x column phases, the column split by two-register permutes), each Wq floats
 * wide. The output is then computed over the flat index oy * Wq + ox, 16 at a time, every tap
 * one unaligned load at a fixed offset into its phase plane: the two (stride 1) or one
 * (stride 2) columns past OW a row are computed and dropped when the rows are copied out.
 * A 7 x 7 plane is 4 vectors a tap instead of 7 row vectors, and no row is copied with scalar
 * code (see docs/performance.md). Windows larger than 3x3 (MobileNetV3's 5x5, ConvNeXt's 7x7)
 * sum four output vectors at once, each tap's weight broadcast once for the four. */

/* exp(x) as simd.h's RC_VMATH computes it in the x86-64-v4 clones, step for step (the argument
   clamped to [-87.3, 88.3], rounding by the magic number, Cody-Waite reduction by ln 2, Cephes's
   degree-5 polynomial, the multiply-adds GCC contracts there), with vscalefps for the integer
   exponent's build and multiply (exact here: 2^n * p is normal in the clamped range): the same
   bits; NaN stays NaN */
DWF_TARGET static inline __m512 dwf_exp(__m512 x)
{
    x = _mm512_min_ps(_mm512_set1_ps(88.3f), _mm512_max_ps(_mm512_set1_ps(-87.3f), x));
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), magic), magic);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.9875691500e-4f), r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* 1 / (1 + exp(-x)) */
DWF_TARGET static inline __m512 dwf_sigmoid(__m512 x)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    return _mm512_div_ps(one, _mm512_add_ps(one, dwf_exp(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

/* rc_act16 on one register: the same activations, NaN staying NaN (max and min with the bound
   first return a NaN operand) */
DWF_TARGET static inline __m512 dwf_act(__m512 x, const rc_act *a)
{
    if (a->act == 3)
        return dwf_sigmoid(x);
    if (a->act == 4)
        return _mm512_mul_ps(x, dwf_sigmoid(x));
    __m512 h = _mm512_fmadd_ps(x, _mm512_set1_ps(a->alpha), _mm512_set1_ps(a->beta));
    h = _mm512_min_ps(_mm512_set1_ps(1.0f), _mm512_max_ps(_mm512_setzero_ps(), h));
    return a->act == 1 ? _mm512_mul_ps(x, h) : h;
}

/* acc clipped to [lo, hi] (max, then min, with the bound first: a NaN stays NaN as clipf
   keeps it), then a's activation when given */
DWF_TARGET static inline __m512 dwf_epi(__m512 acc, __m512 lo, __m512 hi, const rc_act *a)
{
    const __m512 r = _mm512_min_ps(hi, _mm512_max_ps(lo, acc));
    return a ? dwf_act(r, a) : r;
}

/* channel p's input into its phase planes ph (zero-padded: only the data region is written) */
DWF_TARGET static void dwf_fill(const dwf_job *j, const float *xc, float *ph)
{
    const Py_ssize_t H = j->H, W = j->W, s = j->s, Wq = j->Wq, Hq = j->Hq, pn = j->pn, pt = j->pt, pl = j->pl;
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for (Py_ssize_t r = 0; r < H; r++) {
        const Py_ssize_t R = r + pt, i = s == 1 ? R : R >> 1; /* no division a row */
        if (i >= Hq)
            break;
        const float *src = xc + r * W;
        if (s == 1) {
            float *dst = ph + i * Wq + pl;
            const Py_ssize_t n = W < Wq - pl ? W : Wq - pl;
            Py_ssize_t c0 = 0;
            for (; c0 + 16 <= n; c0 += 16) /* whole vectors: no mask to build */
                _mm512_storeu_ps(dst + c0, _mm512_loadu_ps(src + c0));
            for (; c0 < n; c0 += 16) {
                const __mmask16 m = dwf_mask(n - c0);
                _mm512_mask_storeu_ps(dst + c0, m, _mm512_maskz_loadu_ps(m, src + c0));
            }
            continue;
        }
        /* input column c lands at padded column c + pl: phase (c + pl) & 1, index (c + pl) >> 1 */
        float *rowb = ph + (R & 1) * 2 * pn + i * Wq;
        float *de = rowb + (pl & 1) * pn, *dod = rowb + ((pl + 1) & 1) * pn;
        const Py_ssize_t je = pl >> 1, jo = (pl + 1) >> 1; /* where columns 0 and 1 go */
        Py_ssize_t c0 = 0;
        /* whole 32-column chunks whose halves land inside the row: no masks, no clamps (the
           general loop's index and mask arithmetic was most of a large plane's fill) */
        for (; c0 + 32 <= W && c0 / 2 + (je > jo ? je : jo) + 16 <= Wq; c0 += 32) {
            const __m512 a = _mm512_loadu_ps(src + c0), b = _mm512_loadu_ps(src + c0 + 16);
            _mm512_storeu_ps(de + c0 / 2 + je, _mm512_permutex2var_ps(a, ev, b));
            _mm512_storeu_ps(dod + c0 / 2 + jo, _mm512_permutex2var_ps(a, od, b));
        }
        for (; c0 < W; c0 += 32) {
            const __m512 a = _mm512_maskz_loadu_ps(dwf_mask(W - c0), src + c0);
            const __m512 b = W - c0 > 16 ? _mm512_maskz_loadu_ps(dwf_mask(W - c0 - 16), src + c0 + 16)
                                         : _mm512_setzero_ps();
            /* even columns c0 + 2k (k < ne), odd ones c0 + 2k + 1 (k < no), each inside Wq */
            Py_ssize_t ne = (W - c0 + 1) / 2, no = (W - c0) / 2;
            ne = ne > 16 ? 16 : ne;
            no = no > 16 ? 16 : no;
            const Py_ssize_t ke = c0 / 2 + je, ko = c0 / 2 + jo;
            if (ke + ne > Wq)
                ne = Wq - ke > 0 ? Wq - ke : 0;
            if (ko + no > Wq)
                no = Wq - ko > 0 ? Wq - ko : 0;
            _mm512_mask_storeu_ps(de + ke, dwf_mask(ne), _mm512_permutex2var_ps(a, ev, b));
            _mm512_mask_storeu_ps(dod + ko, dwf_mask(no), _mm512_permutex2var_ps(a, od, b));
        }
    }
}

/* vb + the 9 taps' products at f, as two chains of multiply-adds (one chain of 9 waited on
 * each multiply-add's latency: a 7 x 7 plane is only 4 vectors, too few to overlap) */
DWF_TARGET static inline __m512 dwf_sum9(const __m512 *w, const float *const *tp, Py_ssize_t f, __m512 vb)
{
    __m512 a = _mm512_fmadd_ps(w[0], _mm512_loadu_ps(tp[0] + f), vb);
    __m512 b = _mm512_mul_ps(w[5], _mm512_loadu_ps(tp[5] + f));
    for (int t = 1; t < 5; t++)
        a = _mm512_fmadd_ps(w[t], _mm512_loadu_ps(tp[t] + f), a);
    for (int t = 6; t < 9; t++)
        b = _mm512_fmadd_ps(w[t], _mm512_loadu_ps(tp[t] + f), b);
    return _mm512_add_ps(a, b);
}

/* the maximum of each 16 outputs' 9 taps tp[t] + f; NaN where any tap is NaN (as mp_max: the
 * instruction's own max drops a NaN in its first operand) */
DWF_TARGET static inline __m512 dwf_max16(const float *const *tp, Py_ssize_t f)
{
    __m512 acc = _mm512_loadu_ps(tp[0] + f);
    __mmask16 nan = _mm512_cmp_ps_mask(acc, acc, _CMP_UNORD_Q);
    for (int t = 1; t < 9; t++) {
        const __m512 v = _mm512_loadu_ps(tp[t] + f);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        acc = _mm512_max_ps(acc, v);
    }
    return _mm512_mask_mov_ps(acc, nan, _mm512_set1_ps(NAN));
}

/* maxpool's dwf_compute */
DWF_TARGET static void dwf_max(const dwf_job *j, Py_ssize_t p, const float *const *tp, float *out, int row)
{
    const Py_ssize_t Wq = j->Wq, OH = j->OH, OW = j->OW;
    if (row) {
        float *yc = j->y + p * OH * OW;
        for (Py_ssize_t oy = 0; oy < OH; oy++)
            for (Py_ssize_t ox = 0; ox < OW; ox += 16)
                _mm512_mask_storeu_ps(yc + oy * OW + ox, dwf_mask(OW - ox), dwf_max16(tp, oy * Wq + ox));
        return;
    }
    for (Py_ssize_t v = 0; v < j->nv; v++)
        _mm512_store_ps(out + v * 16, dwf_max16(tp, v * 16));
}

/* dwf_compute for a k x k window (k > 3): the outputs in groups of four vectors (row: four
 * (row, column) vectors of y, the last of each row masked; else four of the flat index into
 * out), each tap one weight broadcast and four multiply-adds on independent sums */
DWF_TARGET static void dwf_compute_k(const dwf_job *j, Py_ssize_t p, Py_ssize_t c, const float *ph, float *out,
                                     int row)
{
    const Py_ssize_t Wq = j->Wq, OH = j->OH, OW = j->OW, kk = j->k * j->k;
    const float *wk = j->w + c * kk;
    const __m512 vb = _mm512_set1_ps(j->b ? j->b[c] : 0.0f);
    const __m512 lo = _mm512_set1_ps(j->lo), hi = _mm512_set1_ps(j->hi);
    const Py_ssize_t *toff = j->toff;
    const Py_ssize_t nvr = (OW + 15) / 16; /* vectors a row (row) */
    const Py_ssize_t n = row ? OH * nvr : j->nv;
    float *yc = j->y + p * OH * OW;
    for (Py_ssize_t v0 = 0; v0 < n; v0 += 4) {
        const int m = n - v0 < 4 ? (int)(n - v0) : 4;
        Py_ssize_t f[4];
        float *d[4];
        __mmask16 mk[4];
        for (int i = 0; i < 4; i++) {
            const Py_ssize_t v = v0 + (i < m ? i : 0);
            if (row) {
                const Py_ssize_t oy = v / nvr, ox = (v - oy * nvr) * 16;
                f[i] = oy * Wq + ox;
                d[i] = yc + oy * OW + ox;
                mk[i] = dwf_mask(OW - ox);
            } else {
                f[i] = v * 16;
                d[i] = out + v * 16;
                mk[i] = 0xffff;
            }
        }
        __m512 a0 = vb, a1 = vb, a2 = vb, a3 = vb;
        for (Py_ssize_t t = 0; t < kk; t++) {
            const float *q = ph + toff[t];
            const __m512 wv = _mm512_set1_ps(wk[t]);
            a0 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(q + f[0]), a0);
            a1 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(q + f[1]), a1);
            a2 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(q + f[2]), a2);
            a3 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(q + f[3]), a3);
        }
        const __m512 r[4] = {a0, a1, a2, a3};
        for (int i = 0; i < m; i++)
            _mm512_mask_storeu_ps(d[i], mk[i], dwf_epi(r[i], lo, hi, j->act));
    }
}

/* channel p's outputs from its phase planes ph: rows of 16-float vectors straight into y when
 * a row holds at least 16 (row), else over the flat index into out (the caller copies the rows
 * out) */
DWF_TARGET static void dwf_compute(const dwf_job *j, Py_ssize_t p, Py_ssize_t c, const float *ph, float *out,
                                   int row)
{
    /* the tap offsets come from the job: nine divisions by s a channel were a third of a
       7 x 7 plane's time */
    const Py_ssize_t Wq = j->Wq, OH = j->OH, OW = j->OW;
    if (j->k > 3 && !j->max) {
        dwf_compute_k(j, p, c, ph, out, row);
        return;
    }
    const float *tp[9];
    __m512 w[9];
    const float *wk = j->w ? j->w + c * 9 : NULL;
    for (int t = 0; t < 9; t++) {
        tp[t] = ph + j->toff[t];
        w[t] = _mm512_set1_ps(wk ? wk[t] : 0.0f);
    }
    if (j->max) {
        dwf_max(j, p, tp, out, row);
        return;
    }
    const __m512 vb = _mm512_set1_ps(j->b ? j->b[c] : 0.0f);
    const __m512 lo = _mm512_set1_ps(j->lo), hi = _mm512_set1_ps(j->hi);
    if (row) {
        float *yc = j->y + p * OH * OW;
        for (Py_ssize_t oy = 0; oy < OH; oy++)
            for (Py_ssize_t ox = 0; ox < OW; ox += 16) {
                const Py_ssize_t f = oy * Wq + ox;
                const __m512 acc = dwf_sum9(w, tp, f, vb);
                _mm512_mask_storeu_ps(yc + oy * OW + ox, dwf_mask(OW - ox), dwf_epi(acc, lo, hi, j->act));
            }
        return;
    }
    for (Py_ssize_t v = 0; v < j->nv; v++) {
        const Py_ssize_t f = v * 16;
        const __m512 acc = dwf_sum9(w, tp, f, vb);
        _mm512_store_ps(out + f, dwf_epi(acc, lo, hi, j->act));
    }
}

DWF_TARGET static void dwf_copy_out(const dwf_job *j, Py_ssize_t p, const float *out)
{
    const Py_ssize_t OH = j->OH, OW = j->OW, Wq = j->Wq;
    float *yc = j->y + p * OH * OW;
    for (Py_ssize_t oy = 0; oy < OH; oy++)
        for (Py_ssize_t c0 = 0; c0 < OW; c0 += 16) {
            const __mmask16 m = dwf_mask(OW - c0);
            _mm512_mask_storeu_ps(yc + oy * OW + c0, m, _mm512_maskz_loadu_ps(m, out + oy * Wq + c0));
        }
}

/* ---- direct rows: no phase planes ------------------------------------------------------
 * A large plane's phase planes (112 x 112: 59 KB at stride 1, four of 15 KB at stride 2) are
 * more than L1 holds, and their fill was half of a stride-2 layer's time; a small plane's
 * are mostly halo. Here each output
 * vector reads the input rows themselves: stride 1 one unaligned load a tap column, stride 2
 * two loads split into their even and odd columns by two permutes (columns kx and kx + 1 from
 * one pair), the padding masked off the loads and the rows outside the input skipped. Up to
 * DWD_R output rows a pass share the input rows between them (a 3x3 stride-1 row read by three). */
#define DWD_R 8

/* the lanes i of 16 whose column base + i lies in [0, W) */
DWF_TARGET static inline __mmask16 dwd_mask(Py_ssize_t base, Py_ssize_t W)
{
    const Py_ssize_t a = base < 0 ? (base < -16 ? 16 : -base) : 0, e = W - base;
    return e <= a ? 0 : (__mmask16)(dwf_mask(e > 16 ? 16 : e) & ~dwf_mask(a));
}

/* the DWD_R sums acc[r] += w[ky * k + kx] * v for the output rows r whose window holds input
   row i (ky = i - r * s) */
#define DWD_TAP(v, kx)                                                                    \
    _Pragma("GCC unroll 8") for (int r = 0; r < DWD_R; r++) {                                                     \
        const Py_ssize_t ky = i - r * s;                                                  \
        if (r < R && ky >= 0 && ky < k)                                                   \
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(wk[ky * k + (kx)]), (v), acc[r]);     \
    }

/* the output vector at column ox of the R rows from oy0 (R <= DWD_R), stored: k, s, R and
   the edge flags constants where inlined (the taps unrolled, the sums in registers). redge:
   some input rows are padding; cedge: some loads reach past the row's ends (masked). */
DWF_TARGET static inline __attribute__((always_inline)) void
dwd_vec(const dwf_job *j, const float *wk, const float *xc, float *yc, Py_ssize_t oy0, int R, Py_ssize_t ox,
        Py_ssize_t k, Py_ssize_t s, __m512 vb, int redge, int cedge)
{
    const Py_ssize_t H = j->H, W = j->W, OW = j->OW, pl = j->pl;
    const Py_ssize_t r0 = oy0 * s - j->pt, nrows = (R - 1) * s + k;
    __m512 acc[DWD_R];
    for (int r = 0; r < DWD_R; r++)
        acc[r] = vb;
    /* a column edge: each load's mask, the same for every row (ma: stride 1, or the even /
       odd pair's first vector; mb its second) */
    __mmask16 ma[DWF_KMAX + 1], mb[DWF_KMAX + 1];
    if (cedge)
        for (Py_ssize_t kx = 0; kx < k; kx++) {
            ma[kx] = dwd_mask(s * ox - pl + kx, W);
            mb[kx] = dwd_mask(s * ox - pl + kx + 16, W);
        }
#pragma GCC unroll 16
    for (Py_ssize_t i = 0; i < nrows; i++) {
        if (redge && (r0 + i < 0 || r0 + i >= H)) /* a padding row: no taps */
            continue;
        const float *src = xc + (r0 + i) * W;
        if (s == 1) {
#pragma GCC unroll 8
            for (Py_ssize_t kx = 0; kx < k; kx++) {
                const float *q = src + ox - pl + kx;
                const __m512 v = cedge ? _mm512_maskz_loadu_ps(ma[kx], q) : _mm512_loadu_ps(q);
                DWD_TAP(v, kx)
            }
            continue;
        }
        const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
#pragma GCC unroll 4
        for (Py_ssize_t kx = 0; kx < k; kx += 2) {
            const Py_ssize_t base = 2 * ox - pl + kx;
            const __m512 a = cedge ? _mm512_maskz_loadu_ps(ma[kx], src + base) : _mm512_loadu_ps(src + base);
            const __m512 b = cedge ? _mm512_maskz_loadu_ps(mb[kx], src + base + 16) : _mm512_loadu_ps(src + base + 16);
            const __m512 e = _mm512_permutex2var_ps(a, ev, b);
            DWD_TAP(e, kx)
            if (kx + 1 < k) {
                const __m512 o = _mm512_permutex2var_ps(a, od, b);
                DWD_TAP(o, kx + 1)
            }
        }
    }
    const __m512 lo = _mm512_set1_ps(j->lo), hi = _mm512_set1_ps(j->hi);
    const __mmask16 m = dwf_mask(OW - ox);
    for (int r = 0; r < DWD_R; r++)
        if (r < R)
            _mm512_mask_storeu_ps(yc + (oy0 + r) * OW + ox, m, dwf_epi(acc[r], lo, hi, j->act));
}

/* every output vector of the R rows from oy0: the columns whose loads all lie inside the row
   with plain loads */
DWF_TARGET static inline __attribute__((always_inline)) void
dwd_rows(const dwf_job *j, const float *wk, const float *xc, float *yc, Py_ssize_t oy0, int R, Py_ssize_t k,
         Py_ssize_t s, __m512 vb, int redge)
{
    const Py_ssize_t W = j->W, OW = j->OW, pl = j->pl;
    for (Py_ssize_t ox = 0; ox < OW; ox += 16) {
        /* the loads read columns [s * ox - pl, s * ox - pl + k - 1 + 16 * s) */
        const Py_ssize_t c0 = s * ox - pl, c1 = c0 + k - 1 + 16 * s;
        if (c0 >= 0 && c1 <= W)
            dwd_vec(j, wk, xc, yc, oy0, R, ox, k, s, vb, redge, 0);
        else
            dwd_vec(j, wk, xc, yc, oy0, R, ox, k, s, vb, redge, 1);
    }
}

/* channel p (weights c) from its input plane xc straight into y: blocks of RM rows, the last
   one moved up to end at the last row (rows computed twice, the same values); a plane of fewer
   rows in blocks of DWD_R / 2, one of fewer still a row at a time. RM: DWD_R at stride 1
   (eight sums in flight for the two FMA ports), DWD_R / 2 at stride 2 (a pass of 8 rows
   spills its registers; performance.md has the figures) */
DWF_TARGET static inline __attribute__((always_inline)) void
dwd_plane_ks(const dwf_job *j, Py_ssize_t p, Py_ssize_t c, const float *xc, Py_ssize_t k, Py_ssize_t s)
{
    const int RM = s == 1 ? DWD_R : DWD_R / 2;
    const Py_ssize_t OH = j->OH;
    const float *wk = j->w + c * k * k;
    const __m512 vb = _mm512_set1_ps(j->b ? j->b[c] : 0.0f);
    float *yc = j->y + p * OH * j->OW;
    if (OH < DWD_R / 2) {
        for (Py_ssize_t oy = 0; oy < OH; oy++)
            dwd_rows(j, wk, xc, yc, oy, 1, k, s, vb, 1);
        return;
    }
    const int R = OH < RM ? DWD_R / 2 : RM;
    for (Py_ssize_t oy0 = 0; oy0 < OH; oy0 += R) {
        const Py_ssize_t o = oy0 + R <= OH ? oy0 : OH - R, r0 = o * s - j->pt;
        const int redge = !(r0 >= 0 && r0 + (R - 1) * s + k <= j->H);
        if (R == DWD_R)
            redge ? dwd_rows(j, wk, xc, yc, o, DWD_R, k, s, vb, 1) : dwd_rows(j, wk, xc, yc, o, DWD_R, k, s, vb, 0);
        else
            redge ? dwd_rows(j, wk, xc, yc, o, DWD_R / 2, k, s, vb, 1)
                  : dwd_rows(j, wk, xc, yc, o, DWD_R / 2, k, s, vb, 0);
    }
}

/* the k x k, stride s instance of dwd_plane_ks */
#define DWD_INST(k, s)                                                                                  \
    DWF_TARGET static void dwd_##k##_##s(const dwf_job *j, Py_ssize_t p, Py_ssize_t c, const float *xc) \
    {                                                                                                   \
        dwd_plane_ks(j, p, c, xc, k, s);                                                                \
    }
DWD_INST(7, 1)
DWD_INST(7, 2)

/* ---- 3x3 and 5x5, stride 1 or 2: the weights in registers ------------------------------
 * dwd_vec above leaves the compiler its generic row and tap conditions, the edge masks in
 * arrays and the activation's kind read a vector: its code kept pointers in vector registers,
 * broadcast a weight a multiply-add and ran the activation out of line. Here the window's
 * weights are broadcast once a channel (the compiler keeps what fits in registers), a pass is
 * R output rows of one 16-column vector whose loads are all masked (the same code at the
 * plane's edges), and the activation's kind is a constant of the instance. The taps are summed
 * in dwd_vec's order (rows, then columns): the same sums. */

DWF_TARGET static inline __attribute__((always_inline)) __m512 dwr_epi(__m512 acc, __m512 lo, __m512 hi,
                                                                       const rc_act *a, int kind)
{
    const __m512 r = _mm512_min_ps(hi, _mm512_max_ps(lo, acc));
    if (kind == 0)
        return r;
    if (kind == 3)
        return dwf_sigmoid(r);
    if (kind == 4)
        return _mm512_mul_ps(r, dwf_sigmoid(r));
    __m512 h = _mm512_fmadd_ps(r, _mm512_set1_ps(a->alpha), _mm512_set1_ps(a->beta));
    h = _mm512_min_ps(_mm512_set1_ps(1.0f), _mm512_max_ps(_mm512_setzero_ps(), h));
    return kind == 1 ? _mm512_mul_ps(r, h) : h;
}

/* acc[r] += the taps of input row i (ky = i - r * S) for the R rows, v[kx] the row's values */
#define DWR_TAPS(kx, val)                                                                    \
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                    \
        const int ky = i - r * S;                                                            \
        if (ky >= 0 && ky < K)                                                               \
            acc[r] = _mm512_fmadd_ps(w[ky * K + (kx)], (val), acc[r]);                       \
    }

/* the R output rows from oy0 of the 16 columns from ox (K, S, R and kind constants where
   inlined): input rows from r0, columns from c0 = S * ox - pl, loads masked by m (S 1: one a tap
   column; S 2: the even / odd pair kx, kx + 1 as two loads, masks m[kx] and m[kx + 1]) */
DWF_TARGET static inline __attribute__((always_inline)) void
dwr_pass(const float *xc, float *yc, Py_ssize_t H, Py_ssize_t W, Py_ssize_t OW, Py_ssize_t r0, Py_ssize_t c0,
         Py_ssize_t ox, Py_ssize_t oy0, const int K, const int S, const int R, const __m512 *w, __m512 vb,
         const __mmask16 *m, __mmask16 ms, __m512 lo, __m512 hi, const rc_act *a, const int kind)
{
    __m512 acc[8];
    for (int r = 0; r < R; r++)
        acc[r] = vb;
    const float *q = xc + r0 * W + c0;
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
#pragma GCC unroll 16
    for (int i = 0; i < (R - 1) * S + K; i++, q += W) {
        if (r0 + i < 0 || r0 + i >= H) /* a padding row: no taps */
            continue;
        if (S == 1) {
#pragma GCC unroll 8
            for (int kx = 0; kx < K; kx++) {
                const __m512 v = _mm512_maskz_loadu_ps(m[kx], q + kx);
                DWR_TAPS(kx, v)
            }
            continue;
        }
#pragma GCC unroll 4
        for (int kx = 0; kx < K; kx += 2) {
            const __m512 va = _mm512_maskz_loadu_ps(m[kx], q + kx), vc = _mm512_maskz_loadu_ps(m[kx + 1], q + kx + 16);
            const __m512 e = _mm512_permutex2var_ps(va, ev, vc);
            DWR_TAPS(kx, e)
            if (kx + 1 < K) {
                const __m512 o = _mm512_permutex2var_ps(va, od, vc);
                DWR_TAPS(kx + 1, o)
            }
        }
    }
    float *o = yc + oy0 * OW + ox;
    for (int r = 0; r < R; r++, o += OW)
        _mm512_mask_storeu_ps(o, ms, dwr_epi(acc[r], lo, hi, a, kind));
}
#undef DWR_TAPS

/* channel p (weights c) of a K x K window of stride S: blocks of RM rows, the last moved up to
   end at the last row (rows computed twice, the same values); fewer rows one a pass */
DWF_TARGET static inline __attribute__((always_inline)) void
dwr_plane(const dwf_job *j, Py_ssize_t p, Py_ssize_t c, const float *xc, const int K, const int S, const int RM,
          const int kind)
{
    const Py_ssize_t H = j->H, W = j->W, OH = j->OH, OW = j->OW, pt = j->pt, pl = j->pl;
    const float *wk = j->w + c * K * K;
    __m512 w[25];
    for (int t = 0; t < K * K; t++)
        w[t] = _mm512_set1_ps(wk[t]);
    const __m512 vb = _mm512_set1_ps(j->b ? j->b[c] : 0.0f);
    const __m512 lo = _mm512_set1_ps(j->lo), hi = _mm512_set1_ps(j->hi);
    const rc_act *a = j->act;
    float *yc = j->y + p * OH * OW;
    for (Py_ssize_t ox = 0; ox < OW; ox += 16) {
        const Py_ssize_t c0 = S * ox - pl;
        __mmask16 m[6];
        for (int kx = 0; kx < (S == 1 ? K : K + 1); kx++) /* S 2: the pair's first and second loads */
            m[kx] = S == 1 ? dwd_mask(c0 + kx, W) : dwd_mask(c0 + (kx & ~1) + (kx & 1) * 16, W);
        const __mmask16 ms = dwf_mask(OW - ox);
        if (OH < RM) {
            for (Py_ssize_t oy = 0; oy < OH; oy++)
                dwr_pass(xc, yc, H, W, OW, oy * S - pt, c0, ox, oy, K, S, 1, w, vb, m, ms, lo, hi, a, kind);
            continue;
        }
        for (Py_ssize_t oy0 = 0; oy0 < OH; oy0 += RM) {
            const Py_ssize_t o = oy0 + RM <= OH ? oy0 : OH - RM;
            dwr_pass(xc, yc, H, W, OW, o * S - pt, c0, ox, o, K, S, RM, w, vb, m, ms, lo, hi, a, kind);
        }
    }
}

/* the instances: K, S, rows a pass (8 at stride 1, where a 3x3 input row serves three; 4 at
   stride 2 and for 5x5, whose 25 weights leave fewer registers), each activation kind */
#define DWR_INST(K, S, RM, kind)                                                                          \
    DWF_TARGET static void dwr_##K##_##S##_##kind(const dwf_job *j, Py_ssize_t p, Py_ssize_t c, const float *xc) \
    {                                                                                                     \
        dwr_plane(j, p, c, xc, K, S, RM, kind);                                                           \
    }
#define DWR_KINDS(K, S, RM) DWR_INST(K, S, RM, 0) DWR_INST(K, S, RM, 1) DWR_INST(K, S, RM, 2) \
    DWR_INST(K, S, RM, 3) DWR_INST(K, S, RM, 4)
DWR_KINDS(3, 1, 8)
DWR_KINDS(3, 2, 4)
DWR_KINDS(5, 1, 4)
DWR_KINDS(5, 2, 4)
#undef DWR_KINDS
#undef DWR_INST

typedef void (*dwr_fn)(const dwf_job *, Py_ssize_t, Py_ssize_t, const float *);
#define DWR_ROW(K, S) {dwr_##K##_##S##_0, dwr_##K##_##S##_1, dwr_##K##_##S##_2, dwr_##K##_##S##_3, dwr_##K##_##S##_4}
static const dwr_fn dwr_fns[2][2][5] = {{DWR_ROW(3, 1), DWR_ROW(3, 2)}, {DWR_ROW(5, 1), DWR_ROW(5, 2)}};
#undef DWR_ROW

/* channel p (weights c) from its input plane xc: the k, s (and activation kind) instance; 7x7
   (ConvNeXt's, 49 weights) keeps dwd_vec's broadcasts */
DWF_TARGET static void dwd_plane(const dwf_job *j, Py_ssize_t p, Py_ssize_t c, const float *xc)
{
    if (j->k == 7) {
        (j->s == 1 ? dwd_7_1 : dwd_7_2)(j, p, c, xc);
        return;
    }
    dwr_fns[j->k / 5][j->s - 1][j->act ? j->act->act : 0](j, p, c, xc); /* kinds 0..4: rc_act's */
}

/* channels [p0, p1), channel p's input at xs + (p - pbase) * H * W: rows of 16 or more a
 * channel at a time, smaller planes pipelined */
void dwf_range(const dwf_job *j, const float *xs, Py_ssize_t pbase, float *scratch, Py_ssize_t p0,
                      Py_ssize_t p1)
{
    const Py_ssize_t hw = j->H * j->W;
    const Py_ssize_t ps = j->s * j->s * j->pn, os = j->nv * 16;
    if (j->direct && !j->max) {
        for (Py_ssize_t p = p0, c = p0 % j->C; p < p1; p++, c = c + 1 == j->C ? 0 : c + 1)
            dwd_plane(j, p, c, xs + (p - pbase) * hw);
        return;
    }
    const int row = j->OW >= 16;
    float *ph = scratch, *out = row ? NULL : scratch + DWF_SETS * ps;
    /* padding (0, or -inf for a maximum): written once; each channel writes only the same
       data region. Rows of 16 or more use one set of planes, smaller planes DWF_SETS. */
    const Py_ssize_t pad_n = (row ? 1 : DWF_SETS) * ps;
    if (j->max)
        for (Py_ssize_t i = 0; i < pad_n; i++)
            ph[i] = -INFINITY;
    else
        memset(ph, 0, sizeof(float) * (size_t)pad_n);
    if (row) {
        for (Py_ssize_t p = p0, c = p0 % j->C; p < p1; p++, c = c + 1 == j->C ? 0 : c + 1) {
            dwf_fill(j, xs + (p - pbase) * hw, ph);
            dwf_compute(j, p, c, ph, NULL, 1);
        }
        return;
    }
    /* a pipeline over DWF_SETS sets of planes and outputs: the fill of plane q, the sums of
       plane q - L, the copy-out of plane q - L - 1, so that no load reads what a masked store
       wrote just before (a store-forwarding stall on every tap in the plain order) */
    const Py_ssize_t L = DWF_SETS / 2, m = DWF_SETS - 1;
    for (Py_ssize_t q = p0, c = ((p0 - L) % j->C + j->C) % j->C; q < p1 + L + 1; q++) {
        /* c: the channel of plane q - L */
        if (q < p1)
            dwf_fill(j, xs + (q - pbase) * hw, ph + (q & m) * ps);
        if (q - L >= p0 && q - L < p1)
            dwf_compute(j, q - L, c, ph + ((q - L) & m) * ps, out + ((q - L) & m) * os, 0);
        c = c + 1 == j->C ? 0 : c + 1;
        if (q - L - 1 >= p0 && q - L - 1 < p1)
            dwf_copy_out(j, q - L - 1, out + ((q - L - 1) & m) * os);
    }
}

static void dwf_part(void *arg, int part, int parts)
{
    const dwf_job *j = (const dwf_job *)arg;
    dwf_range(j, j->x, 0, j->scratch + part * j->scratch_n, j->planes * part / parts,
              j->planes * (part + 1) / parts);
}

/* whether a 3x3 window of these strides and dilations, on this machine, goes to dwf_run */
int dwf_takes(Py_ssize_t KH, Py_ssize_t KW, Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t dh,
                     Py_ssize_t dw, Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t planes)
{
    return KH == 3 && KW == 3 && dh == 1 && dw == 1 && sh == sw && sh <= 2 && OH > 0 && OW > 0 &&
           planes > 0 && rc_conv_fast;
}

int dwf_takes_k(Py_ssize_t KH, Py_ssize_t KW, Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t dh,
                Py_ssize_t dw, Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t planes)
{
    return KH == KW && (KH == 3 || KH == 5 || KH == 7) && dh == 1 && dw == 1 && sh == sw && sh <= 2 && OH > 0 &&
           OW > 0 && planes > 0 && rc_conv_fast;
}

/* j's phase-plane geometry from its sizes: plane width and rows, floats a plane (with slack),
 * output vectors, scratch floats a part and the taps' offsets */
int dwf_setup(dwf_job *j, const char *fn)
{
    if (j->k == 0)
        j->k = 3;
    const Py_ssize_t s = j->s, OH = j->OH, OW = j->OW, k = j->k, halo = (k - 1) / s; /* k odd */
    rc_sz sz = {NULL};
    j->Wq = sz_add(&sz, "a phase plane's width", OW, halo);
    if (OW >= 16) /* rows of vectors (dwf_range's row mode): each row's taps of column offset 0 are aligned loads */
        j->Wq = sz_add(&sz, "a phase plane's width", j->Wq, 15) / 16 * 16;
    j->Hq = sz_add(&sz, "a phase plane's rows", OH, halo);
    j->nv = sz_add(&sz, "the output vectors", sz_mul(&sz, "the output vectors", OH, j->Wq), 15) / 16;
    /* the last vector of each tap reads up to halo rows + halo columns + 15 floats past the
       flat domain: slack after each plane, never written */
    const Py_ssize_t need = sz_add(&sz, "a phase plane", sz_mul(&sz, "a phase plane", j->nv, 16),
                                   sz_add(&sz, "a phase plane", sz_mul(&sz, "a phase plane", halo, j->Wq), halo));
    const Py_ssize_t hw = sz_mul(&sz, "a phase plane", j->Hq, j->Wq);
    j->pn = sz_add(&sz, "a phase plane", hw > need ? hw : need, 16 + 15) / 16 * 16;
    const Py_ssize_t planes = sz_mul3(&sz, "the phase planes", s, s, j->pn);
    j->scratch_n = OW >= 16 ? planes
                            : sz_mul(&sz, "the phase planes", DWF_SETS,
                                     sz_add(&sz, "the phase planes", planes, sz_mul(&sz, "the phase planes", j->nv, 16)));
    if (sz_check(&sz, fn, PyExc_MemoryError) < 0)
        return -1;
    /* an input row or column that lands past the planes is never read: a larger pad reads the
       same as one at their end (and keeps the fill's index arithmetic in range) */
    if (j->pt > s * j->Hq)
        j->pt = s * j->Hq;
    if (j->pl > s * j->Wq)
        j->pl = s * j->Wq;
    for (Py_ssize_t ky = 0; ky < k; ky++)
        for (Py_ssize_t kx = 0; kx < k; kx++)
            j->toff[ky * k + kx] = ((ky % s) * s + kx % s) * j->pn + (ky / s) * j->Wq + kx / s;
    return 0;
}

/* j (geometry, buffers and max set) on up to threads threads, its planes' sizes and scratch
 * set here; then the caller's nbuf buffers v are released. None, or NULL with MemoryError.
 * Called with the GIL, which it releases while it runs. */
PyObject *dwf_run(dwf_job *j, int threads, Py_buffer *v, int nbuf)
{
    if (dwf_setup(j, j->max ? "maxpool2d" : "depthwise2d") < 0) {
        release_buffers(v, nbuf);
        return NULL;
    }
    const int parts = rc_parts((double)j->planes * (double)j->OH * (double)j->OW * (j->max ? 9.0 / 8.0 : 1.0)
                                   * (double)(j->k * j->k) / 9.0, 8192.0,
                               j->planes, &threads);
    rc_sz sz = {NULL};
    const Py_ssize_t bytes = sz_mul3(&sz, "the phase planes", parts, j->scratch_n, RC_F32);
    if (sz_check(&sz, j->max ? "maxpool2d" : "depthwise2d", PyExc_MemoryError) < 0) {
        release_buffers(v, nbuf);
        return NULL;
    }
    j->scratch = (float *)aligned_alloc(64, (size_t)bytes);
    const int oom = !j->scratch;
    PyObject *r = rc_run_job(dwf_part, j, parts, threads, v, nbuf, &oom);
    free(j->scratch);
    return r;
}
/* ---- channels in the vector lanes: 16 channels of one image a block ------------------------
 * A small plane (MobileNetV3's and EfficientNet's 7x7 and 14x14 maps under a 5x5 window) is
 * mostly halo and tail in the phase planes above: a 7 x 7 output under 5 x 5 is 5 vectors of
 * 25 taps for 49 outputs a channel. Here a block's input goes once into a zero-padded
 * [Hp][Wp][16] scratch (channel c in lane c), every output pixel is one vector of 16 channels
 * (KH * KW multiply-adds, four pixels on independent sums), and the [OH * OW][16] result goes
 * back to the NCHW planes, bias and clip applied on the way. */

typedef struct {
    const float *x, *w, *b;
    float *y;
    Py_ssize_t N, C, H, W, OH, OW, KH, KW, sh, sw, pt, pl, Hp, Wp;
    float lo, hi;
    float *scratch;
    Py_ssize_t scratch_n; /* floats a part: the padded input, then the outputs */
    const rc_act *act;    /* after the clip, or NULL */
    int packed;           /* w as [ceil(C / 16)][KH * KW][16] (a plan's, packed once), else [C][KH * KW] */
} dwl_job;

/* DWL_G output pixels of a row a pass, on independent sums: two FMA ports of 4-cycle latency
   want 8 in flight; a row tail computes the whole group (its extra reads land in the scratch's
   slack) and stores the pixels it has */
#define DWL_G 8

/* the taps of one block: every output row in groups of DWL_G pixels. KW and SW constants where
   inlined with them; at stride 1 a window row's input vectors are loaded once into registers and
   shared by the pixels whose taps read them (DWL_G - 1 + KW loads for DWL_G * KW multiply-adds) */
DWF_TARGET static inline __attribute__((always_inline)) void
dwl_taps(const dwl_job *j, const float *in, float *out, const __m512 *wt, __m512 vb, Py_ssize_t KW, Py_ssize_t SW)
{
    const Py_ssize_t OH = j->OH, OW = j->OW, KH = j->KH, sh = j->sh, Wp = j->Wp;
    const __m512 lo = _mm512_set1_ps(j->lo), hi = _mm512_set1_ps(j->hi);
    for (Py_ssize_t oy = 0; oy < OH; oy++) {
        for (Py_ssize_t ox = 0; ox < OW; ox += DWL_G) {
            __m512 a[DWL_G];
            for (int i = 0; i < DWL_G; i++)
                a[i] = vb;
            for (Py_ssize_t ky = 0; ky < KH; ky++) {
                const float *rp = in + ((oy * sh + ky) * Wp + ox * SW) * 16;
                const __m512 *wr = wt + ky * KW;
                if (SW == 1) {
                    __m512 v[DWL_G - 1 + DWF_KMAX];
                    for (Py_ssize_t c = 0; c < DWL_G - 1 + KW; c++)
                        v[c] = _mm512_load_ps(rp + c * 16);
                    for (Py_ssize_t kx = 0; kx < KW; kx++)
                        for (int i = 0; i < DWL_G; i++)
                            a[i] = _mm512_fmadd_ps(wr[kx], v[i + kx], a[i]);
                } else { /* stride 2: 2 * DWL_G + KW vectors would spill; loads as operands */
                    for (Py_ssize_t kx = 0; kx < KW; kx++)
                        for (int i = 0; i < DWL_G; i++)
                            a[i] = _mm512_fmadd_ps(wr[kx], _mm512_load_ps(rp + (i * SW + kx) * 16), a[i]);
                }
            }
            const int m = OW - ox < DWL_G ? (int)(OW - ox) : DWL_G;
            for (int i = 0; i < m; i++)
                _mm512_store_ps(out + (oy * OW + ox + i) * 16, dwf_epi(a[i], lo, hi, j->act));
        }
    }
}

#define DWL_TAPS(k, s)                                                                             \
    DWF_TARGET static void dwl_taps_##k##_##s(const dwl_job *j, const float *in, float *out,       \
                                              const __m512 *wt, __m512 vb)                         \
    {                                                                                              \
        dwl_taps(j, in, out, wt, vb, k, s);                                                        \
    }
DWL_TAPS(3, 1)
DWL_TAPS(3, 2)
DWL_TAPS(5, 1)
DWL_TAPS(5, 2)
DWL_TAPS(7, 1)
DWL_TAPS(7, 2)
#undef DWL_TAPS

/* any other window width or column stride: the same loop on the values as they come */
DWF_TARGET static void dwl_taps_any(const dwl_job *j, const float *in, float *out, const __m512 *wt, __m512 vb)
{
    const Py_ssize_t OH = j->OH, OW = j->OW, KH = j->KH, KW = j->KW, sh = j->sh, sw = j->sw, Wp = j->Wp;
    const __m512 lo = _mm512_set1_ps(j->lo), hi = _mm512_set1_ps(j->hi);
    for (Py_ssize_t oy = 0; oy < OH; oy++) {
        for (Py_ssize_t ox = 0; ox < OW; ox += DWL_G) {
            __m512 a[DWL_G];
            for (int i = 0; i < DWL_G; i++)
                a[i] = vb;
            for (Py_ssize_t ky = 0; ky < KH; ky++) {
                const float *rp = in + ((oy * sh + ky) * Wp + ox * sw) * 16;
                for (Py_ssize_t kx = 0; kx < KW; kx++) {
                    const __m512 w = wt[ky * KW + kx];
                    for (int i = 0; i < DWL_G; i++)
                        a[i] = _mm512_fmadd_ps(w, _mm512_load_ps(rp + (i * sw + kx) * 16), a[i]);
                }
            }
            const int m = OW - ox < DWL_G ? (int)(OW - ox) : DWL_G;
            for (int i = 0; i < m; i++)
                _mm512_store_ps(out + (oy * OW + ox + i) * 16, dwf_epi(a[i], lo, hi, j->act));
        }
    }
}

/* block q (image q / CB, channels (q % CB) * 16 ...): fill, taps, copy-out */
DWF_TARGET static void dwl_block(const dwl_job *j, float *in, float *out, Py_ssize_t q)
{
    const Py_ssize_t CB = (j->C + 15) / 16, n = q / CB, c0 = (q % CB) * 16;
    const Py_ssize_t nc = j->C - c0 < 16 ? j->C - c0 : 16, H = j->H, W = j->W;
    const Py_ssize_t KW = j->KW, Wp = j->Wp, kk = j->KH * KW;
    const Py_ssize_t hr = H < j->Hp - j->pt ? H : j->Hp - j->pt, wc = W < Wp - j->pl ? W : Wp - j->pl;
    const float *xb = j->x + (n * j->C + c0) * H * W;
    /* the data region only: the padding was zeroed once a part, and lanes past nc are never
       stored. 16 channels x 16 pixels of the flat plane a register transpose, across row ends
       (a 7-wide plane is 4 transposes, not 7), each pixel then to its padded row and column. */
    const __mmask16 cm = dwf_mask(nc);
    __m512 t[16];
    const Py_ssize_t HW = H * W, hwr = hr * W;
    float *const d0 = in + (j->pt * Wp + j->pl) * 16;
    Py_ssize_t r = 0, col = 0; /* the pixel's row and column */
    for (Py_ssize_t p = 0; p < hwr; p += 16) {
        const Py_ssize_t e = hwr - p < 16 ? hwr - p : 16;
        const __mmask16 m = dwf_mask(e);
        for (Py_ssize_t c = 0; c < 16; c++)
            t[c] = c < nc ? _mm512_maskz_loadu_ps(m, xb + c * HW + p) : _mm512_setzero_ps();
        rc_tr16_ps(t);
        for (Py_ssize_t i = 0; i < e; i++) {
            if (col < wc)
                _mm512_store_ps(d0 + (r * Wp + col) * 16, t[i]);
            if (++col == W) {
                col = 0;
                r++;
            }
        }
    }
    __m512 wt[DWF_KMAX * DWF_KMAX];
    if (j->packed) { /* one load a tap: the gathers below touch kk lines each, cold in a model's run */
        const float *wb = j->w + c0 * kk;
        for (Py_ssize_t k = 0; k < kk; k++)
            wt[k] = _mm512_loadu_ps(wb + k * 16);
    } else {
        const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32((int)kk));
        const float *wb = j->w + c0 * kk;
        for (Py_ssize_t k = 0; k < kk; k++)
            wt[k] = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), cm, idx, wb + k, 4);
    }
    const __m512 vb = j->b ? _mm512_maskz_loadu_ps(cm, j->b + c0) : _mm512_setzero_ps();
    static void (*const taps[3][2])(const dwl_job *, const float *, float *, const __m512 *, __m512) = {
        {dwl_taps_3_1, dwl_taps_3_2}, {dwl_taps_5_1, dwl_taps_5_2}, {dwl_taps_7_1, dwl_taps_7_2}};
    const Py_ssize_t sw = j->sw;
    if ((KW == 3 || KW == 5 || KW == 7) && (sw == 1 || sw == 2))
        taps[KW / 2 - 1][sw - 1](j, in, out, wt, vb);
    else
        dwl_taps_any(j, in, out, wt, vb);
    const Py_ssize_t P = j->OH * j->OW;
    float *yb = j->y + (n * j->C + c0) * P;
    for (Py_ssize_t p = 0; p < P; p += 16) {
        const Py_ssize_t e = P - p < 16 ? P - p : 16;
        for (Py_ssize_t i = 0; i < 16; i++)
            t[i] = i < e ? _mm512_load_ps(out + (p + i) * 16) : _mm512_setzero_ps();
        rc_tr16_ps(t);
        const __mmask16 m = dwf_mask(e);
        for (Py_ssize_t c = 0; c < nc; c++)
            _mm512_mask_storeu_ps(yb + c * P + p, m, t[c]);
    }
}

static void dwl_part(void *arg, int part, int parts)
{
    const dwl_job *j = (const dwl_job *)arg;
    float *in = j->scratch + part * j->scratch_n, *out = in + j->Hp * j->Wp * 16 + (DWL_G * j->sw + j->KW) * 16;
    memset(in, 0, sizeof(float) * (size_t)j->scratch_n);
    const Py_ssize_t blocks = j->N * ((j->C + 15) / 16);
    const Py_ssize_t q0 = blocks * part / parts, q1 = blocks * (part + 1) / parts;
    for (Py_ssize_t q = q0; q < q1 && !rc_stop_requested(); q++)
        dwl_block(j, in, out, q);
}

/* whether the lanes kernel takes this window (dilation 1, up to 7 x 7, this machine) */
int dwl_takes(Py_ssize_t KH, Py_ssize_t KW, Py_ssize_t dh, Py_ssize_t dw)
{
    return KH >= 1 && KW >= 1 && KH <= DWF_KMAX && KW <= DWF_KMAX && dh == 1 && dw == 1 && rc_conv_fast;
}

PyObject *dwl_run(const float *x, const float *w, const float *b, float *y, const Py_ssize_t *g, float lo, float hi,
                  const rc_act *act, int threads, Py_buffer *v, int nbuf, int packed)
{
    /* g: N, C, H, W, OH, OW, KH, KW, sh, sw, pt, pl */
    dwl_job j = {x, w, b, y, g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11], 0, 0,
                 lo, hi, NULL, 0, act, packed};
    rc_sz sz = {NULL};
    j.Hp = sz_add(&sz, "the padded block", sz_mul(&sz, "the padded block", j.OH - 1, j.sh), j.KH);
    j.Wp = sz_add(&sz, "the padded block", sz_mul(&sz, "the padded block", j.OW - 1, j.sw), j.KW);
    /* the input, a tail's reads past it, then the outputs: 16 floats a pixel */
    const Py_ssize_t px = sz_add(&sz, "the padded block", sz_add(&sz, "the padded block", sz_mul(&sz, "the padded block", j.Hp, j.Wp),
                                                              DWL_G * j.sw + j.KW),
                                 sz_mul(&sz, "the padded block", j.OH, j.OW));
    j.scratch_n = sz_mul(&sz, "the padded block", px, 16);
    const Py_ssize_t blocks = sz_mul(&sz, "the blocks", j.N, (j.C + 15) / 16);
    if (j.pt > j.Hp)
        j.pt = j.Hp;
    if (j.pl > j.Wp)
        j.pl = j.Wp;
    const int parts = sz.what ? 1
                              : rc_parts((double)j.N * (double)j.C * (double)j.OH * (double)j.OW * (double)(j.KH * j.KW) / 9.0,
                                         8192.0, blocks, &threads);
    const Py_ssize_t bytes = sz_mul3(&sz, "the padded block", parts, j.scratch_n, RC_F32);
    if (sz_check(&sz, "depthwise2d", PyExc_MemoryError) < 0) {
        release_buffers(v, nbuf);
        return NULL;
    }
    j.scratch = (float *)aligned_alloc(64, (size_t)(bytes + 63) / 64 * 64);
    const int oom = !j.scratch;
    PyObject *r = rc_run_job(dwl_part, &j, parts, threads, v, nbuf, &oom);
    free(j.scratch);
    return r;
}
#endif
