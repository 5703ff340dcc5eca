#include "native.h"

/* mha: the core of onnxruntime's com.microsoft.Attention after its projection, one unit of
 * (batch, head, block of query rows) at a time on the kernel threads: the scores
 * q k^T * scale as one single-threaded sgemm (set_sgemm's) into a per-thread buffer, the
 * additive mask, the causal cut and the attention bias added row by row, softmax_rows, and
 * p v as a second sgemm written straight into the head's columns of y (numpy looped over
 * the heads with threaded BLAS calls whose workers then spun through the next nodes). With
 * the causal cut a block of rows s0..s1 reads keys t < s1 only: the keys every row of it
 * masks are neither scored nor summed (exp of a masked score is 0 either way). */
/* rows a causal block: smaller skips more of the masked keys, larger keeps the sgemm calls long */
#define MH_CAUSAL_ROWS 32
/* most rows a block: its scores (rows x S) stay a few MiB at most per thread at long sequences
 * (Whisper's 1500), and a few heads still split into enough units to balance the threads */
#define MH_ROWS_MAX 256

typedef struct {
    const float *q, *k, *v;  /* element (b, s, h, d) at q[b * xb + s * xs + h * dq + d] */
    Py_ssize_t xb, xs;
    const float *m1, *m2;    /* additive biases (b, h, s, t), t contiguous; NULL if absent */
    Py_ssize_t m1b, m1h, m1s, m2b, m2h, m2s;
    float *y;                /* (b, s, h * dv) */
    Py_ssize_t B, H, S, dq, dv, rb;
    float scale;
    int causal, oom;
} mh_job;

/* query row s's scores zr[0, T) of (batch b, head h): the first additive mask, the causal cut
 * (keys past s at -FLT_MAX), the second additive mask, in the numpy path's order */
static inline void mh_mask_row(const mh_job *j, Py_ssize_t b, Py_ssize_t h, Py_ssize_t s, float *zr, Py_ssize_t T)
{
    if (j->m1) {
        const float *m = j->m1 + b * j->m1b + h * j->m1h + s * j->m1s;
        for (Py_ssize_t t = 0; t < T; t++)
            zr[t] += m[t];
    }
    if (j->causal)
        for (Py_ssize_t t = s + 1; t < T; t++)
            zr[t] = -FLT_MAX;
    if (j->m2) {
        const float *m = j->m2 + b * j->m2b + h * j->m2h + s * j->m2s;
        for (Py_ssize_t t = 0; t < T; t++)
            zr[t] += m[t];
    }
}

static void mh_part(void *arg, int part, int parts)
{
    const mh_job *j = (const mh_job *)arg;
    const Py_ssize_t nrb = (j->S + j->rb - 1) / j->rb, units = j->B * j->H * nrb;
    const Py_ssize_t u0 = units * part / parts, u1 = units * (part + 1) / parts;
    if (u0 >= u1)
        return;
    const Py_ssize_t yw = j->H * j->dv;
    const size_t zn = sizeof(float) * (size_t)j->rb * (size_t)j->S;
    float *z = (float *)rc_work(zn);
    if (!z) {
        __atomic_store_n(&((mh_job *)arg)->oom, 1, __ATOMIC_RELAXED);
        return;
    }
    char tn = 'T', nn = 'N';
    float one = 1.0f, zero = 0.0f, sc = j->scale;
    int idq = (int)j->dq, idv = (int)j->dv, lx = (int)j->xs, ly = (int)yw;
    for (Py_ssize_t u = u0; u < u1; u++) {
        const Py_ssize_t bh = u / nrb, b = bh / j->H, h = bh - b * j->H;
        const Py_ssize_t s0 = (u - bh * nrb) * j->rb;
        const Py_ssize_t s1 = s0 + j->rb < j->S ? s0 + j->rb : j->S;
        const Py_ssize_t T = j->causal ? s1 : j->S; /* the keys this block reads */
        int n = (int)(s1 - s0), iT = (int)T;
        const float *q = j->q + b * j->xb + s0 * j->xs + h * j->dq;
        const float *k = j->k + b * j->xb + h * j->dq;
        const float *v = j->v + b * j->xb + h * j->dv;
        /* column-major z^T (T x n) = k (T x dq, read transposed) q^T: row-major z (n x T) */
        rc_sgemm(&tn, &nn, &iT, &n, &idq, &sc, (float *)k, &lx, (float *)q, &lx, &zero, z, &iT);
        for (Py_ssize_t s = s0; s < s1; s++) {
            float *zr = z + (s - s0) * T;
            mh_mask_row(j, b, h, s, zr, T);
        }
        softmax_rows(z, n, T);
        /* column-major y^T (dv x n, ld yw) = v^T (dv x T) p^T (T x n) */
        rc_sgemm(&nn, &nn, &idv, &n, &iT, &one, (float *)v, &lx, z, &iT, &zero,
                 j->y + b * j->S * yw + s0 * yw + h * j->dv, &ly);
    }
    rc_work_done(z, zn);
}

/* the strides of a bias of dims (db, dh, ds, T), each 1 (broadcast: stride 0) or full */
static int mh_bias(PyObject *o, PyObject *dims, Py_ssize_t B, Py_ssize_t H, Py_ssize_t S,
                   const char *name, Py_buffer *view, Py_ssize_t *sb, Py_ssize_t *sh, Py_ssize_t *ss)
{
    view->obj = NULL;
    view->buf = NULL;
    if (o == Py_None)
        return 0;
    Py_ssize_t db, dh, ds;
    if (!PyArg_ParseTuple(dims, "nnn", &db, &dh, &ds))
        return -1;
    if ((db != 1 && db != B) || (dh != 1 && dh != H) || (ds != 1 && ds != S)) {
        PyErr_Format(PyExc_ValueError, "mha: %s of dims (%zd, %zd, %zd, T) does not broadcast to "
                     "(%zd, %zd, %zd, T)", name, db, dh, ds, B, H, S);
        return -1;
    }
    /* each of db, dh, ds is 1 or a size the checked QKV and Y already hold */
    if (get_items("mha", o, view, 0, db * dh * ds * S, RC_F32, name) < 0) {
        view->obj = NULL;
        return -1;
    }
    *ss = ds == 1 ? 0 : S;
    *sh = dh == 1 ? 0 : ds * S;
    *sb = db == 1 ? 0 : dh * ds * S;
    return 0;
}

/* rows in a unit of the batched kernels: whole matrices when there are 8 or more, else blocks of
 * rows, 8 units or more, at least min_blocks blocks a matrix; not a function of the thread count,
 * so that any number of threads gives the same bits */
static Py_ssize_t unit_rows(Py_ssize_t batch, Py_ssize_t rows, Py_ssize_t min_blocks)
{
    Py_ssize_t nrb = batch >= 8 ? 1 : (8 + batch - 1) / batch;
    if (nrb < min_blocks)
        nrb = min_blocks;
    if (nrb > rows)
        nrb = rows;
    return (rows + nrb - 1) / nrb;
}

/* rows in a unit of mha / sdpa: unit_rows's, or where that passes MH_ROWS_MAX, the fewest
 * blocks of at most that many, of even size (384 rows: 192 + 192, not 256 + 128); not a
 * function of the thread count (the same bits at any count) */
static Py_ssize_t mh_rows(Py_ssize_t heads, Py_ssize_t S, Py_ssize_t min_blocks)
{
    const Py_ssize_t rb = unit_rows(heads, S, min_blocks);
    if (rb <= MH_ROWS_MAX)
        return rb;
    const Py_ssize_t nrb = (S + MH_ROWS_MAX - 1) / MH_ROWS_MAX;
    return (S + nrb - 1) / nrb;
}

/* mha on the Linear's 12 x 32 tiles (ln_tiles) instead of sgemm calls: a unit is one 12-row
 * panel of queries of a (batch, head); a part packs the k^T and v of each head its units reach
 * as the Linear's weights ([ceil(S / 32)][dq][32], [dv / 32][S][32]) in its own work buffer,
 * where they stay in L2 for all the head's panels (packed for every head up front, they went
 * through memory once more). A panel: q (scaled) packed [dq][12], its scores (12 x S) by the
 * tiles, the mask / causal cut / bias row by row, the exponentials and their sums
 * (softmax_exp_row), the unnormalised probabilities packed [S][12] (ln_pack_part), p v by the
 * tiles straight into y, and y's 12 rows times their 1 / sum (dv products a row, not S). The
 * sgemm calls packed k, the scores and v again for every block of rows and zeroed each product
 * first. dv a multiple of 32 (whole column panels of y). */
typedef struct {
    const mh_job *j;
    Py_ssize_t Sp, kps, vps; /* Sp: S rounded up to 32; a head's packed k^T and v in floats */
    int oom;
} mt_job;

#if DWF_OK
/* kp[cb][d][c] = k[32 cb + c][d] for dq a multiple of 16: blocks of 16 keys x 16 dims
   transposed in registers (rc_tr16_ps), zeros past S */
DWF_TARGET static void mt_pack_k16(float *restrict kp, const float *restrict k, Py_ssize_t S, Py_ssize_t Sp,
                                   Py_ssize_t dq, Py_ssize_t xs)
{
    for (Py_ssize_t s0 = 0; s0 < Sp; s0 += 16) {
        float *dst = kp + (s0 / 32) * dq * 32 + (s0 % 32);
        for (Py_ssize_t d0 = 0; d0 < dq; d0 += 16) {
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = s0 + i < S ? _mm512_loadu_ps(k + (s0 + i) * xs + d0) : _mm512_setzero_ps();
            rc_tr16_ps(r);
            for (int i = 0; i < 16; i++)
                _mm512_storeu_ps(dst + (d0 + i) * 32, r[i]);
        }
    }
}
#endif

#if DWF_OK
/* qp[d][p] = q[p * xs + d] * scale for p < nr (zeros past), dq a multiple of 16: blocks of 16
   dims of the 12 rows (4 rows of zeros) transposed in registers, the first 12 lanes stored (the
   scalar loop read 12 rows a column apart: a tenth of the tiles form's time at ViT's shapes) */
DWF_TARGET static void mt_pack_q16(float *restrict qp, const float *restrict q, Py_ssize_t nr, Py_ssize_t dq,
                                   Py_ssize_t xs, float scale)
{
    const __m512 sc = _mm512_set1_ps(scale);
    for (Py_ssize_t d0 = 0; d0 < dq; d0 += 16) {
        __m512 r[16];
        for (int i = 0; i < 16; i++)
            r[i] = i < nr ? _mm512_mul_ps(_mm512_loadu_ps(q + i * xs + d0), sc) : _mm512_setzero_ps();
        rc_tr16_ps(r);
        for (int i = 0; i < 16; i++)
            _mm512_mask_storeu_ps(qp + (d0 + i) * LN_RP, (__mmask16)((1u << LN_RP) - 1), r[i]);
    }
}
#endif

/* the tiles form runs on AVX-512 CPUs only (rc_conv_fast): its row loops (the masks, the v copy,
   y's scaling) built for them where the compiler can */
#if DWF_OK
#define MT_TARGET DWF_TARGET
#else
#define MT_TARGET
#endif

/* the packed k^T and v of (batch, head) bh into kp (Sp x dq) and vp (S x dv) */
MT_TARGET static void mt_pack_head(const mt_job *t, Py_ssize_t bh, float *kp, float *vp)
{
    const mh_job *j = t->j;
    const Py_ssize_t b = bh / j->H, h = bh - b * j->H;
    const float *k = j->k + b * j->xb + h * j->dq, *v = j->v + b * j->xb + h * j->dv;
    /* kp[cb][d][c] = k[32 cb + c][d], zeros past S */
#if DWF_OK
    if (j->dq % 16 == 0)
        mt_pack_k16(kp, k, j->S, t->Sp, j->dq, j->xs);
    else
#endif
        for (Py_ssize_t cb = 0; cb < t->Sp / 32; cb++)
            for (Py_ssize_t c = 0; c < 32; c++) {
                const Py_ssize_t s = cb * 32 + c;
                float *dst = kp + cb * j->dq * 32 + c;
                if (s < j->S)
                    for (Py_ssize_t d = 0; d < j->dq; d++)
                        dst[d * 32] = k[s * j->xs + d];
                else
                    for (Py_ssize_t d = 0; d < j->dq; d++)
                        dst[d * 32] = 0.0f;
            }
    /* vp[cb][s][c] = v[s][32 cb + c] */
    for (Py_ssize_t cb = 0; cb < j->dv / 32; cb++)
        for (Py_ssize_t s = 0; s < j->S; s++)
            memcpy(vp + (cb * j->S + s) * 32, v + s * j->xs + cb * 32, 32 * sizeof(float));
}

/* rows a later panel reads, fetched while this one runs: q's rows of panel u (the next one), and
   panel u's share (1 / np_ of the rows) of the following head's k and v, so that head's packing
   finds them in cache (a head's rows are a page or more apart: the hardware's stream prefetch
   stays inside a page) */
static inline void mt_prefetch(const mh_job *j, Py_ssize_t u, Py_ssize_t np_)
{
    const Py_ssize_t bh = u / np_, b = bh / j->H, h = bh - b * j->H, pi = u - bh * np_;
    const Py_ssize_t s0 = pi * LN_RP, s1 = s0 + LN_RP < j->S ? s0 + LN_RP : j->S;
    const float *q = j->q + b * j->xb + h * j->dq;
    for (Py_ssize_t s = s0; s < s1; s++)
        for (Py_ssize_t d = 0; d < j->dq; d += 16)
            __builtin_prefetch(q + s * j->xs + d, 0, 3);
    if (bh + 1 >= j->B * j->H)
        return;
    const Py_ssize_t nb = (bh + 1) / j->H, nh = bh + 1 - nb * j->H;
    const float *k = j->k + nb * j->xb + nh * j->dq, *v = j->v + nb * j->xb + nh * j->dv;
    const Py_ssize_t r0 = j->S * pi / np_, r1 = j->S * (pi + 1) / np_;
    for (Py_ssize_t s = r0; s < r1; s++) {
        for (Py_ssize_t d = 0; d < j->dq; d += 16)
            __builtin_prefetch(k + s * j->xs + d, 0, 2);
        for (Py_ssize_t d = 0; d < j->dv; d += 16)
            __builtin_prefetch(v + s * j->xs + d, 0, 2);
    }
}

MT_TARGET static void mt_part(void *arg, int part, int parts)
{
    mt_job *t = (mt_job *)arg;
    const mh_job *j = t->j;
    const Py_ssize_t S = j->S, Sp = t->Sp, dq = j->dq, np_ = (S + LN_RP - 1) / LN_RP;
    const Py_ssize_t units = j->B * j->H * np_, u0 = units * part / parts, u1 = units * (part + 1) / parts;
    if (u0 >= u1)
        return;
    const Py_ssize_t yw = j->H * j->dv;
    /* the scores (12 x Sp), the probabilities' panel (Sp x 12), q's panel (dq x 12), a head's
       packed k^T and v, 64-byte aligned each (Sp, kps, vps: multiples of 16 floats) */
    const size_t zn = sizeof(float) * ((size_t)LN_RP * (size_t)Sp * 2 + ((size_t)dq * LN_RP + 15) / 16 * 16 +
                                       (size_t)t->kps + (size_t)t->vps);
    float *z = (float *)rc_work(zn);
    if (!z) {
        __atomic_store_n(&t->oom, 1, __ATOMIC_RELAXED);
        return;
    }
    float *pp = z + LN_RP * Sp, *qp = pp + LN_RP * Sp;
    float *kp = qp + (dq * LN_RP + 15) / 16 * 16, *vp = kp + t->kps;
    float inv[LN_RP];
    Py_ssize_t packed = -1;
    for (Py_ssize_t u = u0; u < u1; u++) {
        const Py_ssize_t bh = u / np_, b = bh / j->H, h = bh - b * j->H;
        const Py_ssize_t s0 = (u - bh * np_) * LN_RP, nr = S - s0 < LN_RP ? S - s0 : LN_RP;
        if (u > u0 && rc_stop_requested()) /* a part is a whole head on one thread (mt_run) */
            break;
        if (bh != packed) {
            mt_pack_head(t, bh, kp, vp);
            packed = bh;
        }
        mt_prefetch(j, u + 1 < u1 ? u + 1 : u, np_);
        /* the keys this panel reads: with the causal cut, none past its last row (their
           probabilities are exact zeros: the same sums) */
        const Py_ssize_t T = j->causal ? s0 + nr : S;
        const float *q = j->q + b * j->xb + s0 * j->xs + h * dq;
#if DWF_OK
        if (dq % 16 == 0)
            mt_pack_q16(qp, q, nr, dq, j->xs, j->scale);
        else
#endif
            for (Py_ssize_t d = 0; d < dq; d++)
                for (Py_ssize_t p = 0; p < LN_RP; p++)
                    qp[d * LN_RP + p] = p < nr ? q[p * j->xs + d] * j->scale : 0.0f;
        for (Py_ssize_t cb = 0; cb < (T + 31) / 32; cb++)
            ln_tiles[nr](qp, kp + cb * dq * 32, dq, 32, z + cb * 32, Sp, NULL, 1, NULL, 0, 0, NULL);
        for (Py_ssize_t p = 0; p < nr; p++) {
            float *zr = z + p * Sp;
            mh_mask_row(j, b, h, s0 + p, zr, T);
            inv[p] = softmax_exp_row_pad(zr, T); /* rows Sp >= T rounded up to 32 apart */
        }
        /* the rows Sp apart, all Sp terms packed (those past T are not read) */
        ln_pack_job pj = {z, pp, nr, Sp};
        ln_pack_part(&pj, 0, 1);
        float *y = j->y + b * S * yw + s0 * yw + h * j->dv;
        for (Py_ssize_t cb = 0; cb < j->dv / 32; cb++)
            for (Py_ssize_t k0 = 0; k0 < T; k0 += LN_KC) {
                const Py_ssize_t kn = T - k0 < LN_KC ? T - k0 : LN_KC;
                ln_tiles[nr](pp + k0 * LN_RP, vp + (cb * S + k0) * 32, kn, 32, y + cb * 32, yw, NULL, k0 == 0,
                             NULL, 0, 0, NULL);
            }
        for (Py_ssize_t p = 0; p < nr; p++)
            for (Py_ssize_t d = 0; d < j->dv; d++)
                y[p * yw + d] *= inv[p];
    }
    rc_work_done(z, zn);
}

static PyObject *mt_run(mh_job *j, int threads, Py_buffer *v, int nbuf)
{
    mt_job t = {j, (j->S + 31) / 32 * 32, 0, 0, 0};
    t.kps = t.Sp * j->dq;
    t.vps = (j->S * j->dv + 15) / 16 * 16;
    const Py_ssize_t heads = j->B * j->H, np_ = (j->S + LN_RP - 1) / LN_RP;
    rc_sz sz = {NULL};
    sz_mul(&sz, "a head's packed keys and values", t.kps + t.vps + 2 * LN_RP * t.Sp, RC_F32);
    if (sz_check(&sz, "mha", PyExc_MemoryError) < 0) {
        release_buffers(v, nbuf);
        return NULL;
    }
    const double work = 2.0 * (double)heads * (double)j->S * (double)j->S * (double)(j->dq + j->dv);
    /* a job run on its caller alone (one thread, run_solo, or the machine's load) is split as for
       one thread: a session of two threads beside busy processes packed each of BERT-tiny's heads
       four times against one thread's two (189 against 177 us an Attention) */
    threads = rc_job_threads(threads);
    int parts = rc_parts(work, 2.5e5, heads * np_, &threads);
    /* a head a part where that leaves two or more a thread, or on one thread: a head split between
       parts is packed by each (Whisper's 1500 keys: 6 heads in 4 parts packed 9 times); the units
       stay the panels */
    if ((heads >= 2 * (Py_ssize_t)threads || threads == 1) && heads <= RC_PARTS_FINE_MAX)
        parts = (int)heads;
    return rc_run_job(mt_part, &t, parts, threads, v, nbuf, &t.oom);
}

PyObject *rc_py_mha(PyObject *self, PyObject *args)
{
    PyObject *xo, *yo, *m1o, *m1d, *m2o, *m2d;
    Py_ssize_t B, S, W, oq, ok, ov, H, dq, dv;
    float scale;
    int causal, threads, tiles = 0;
    if (!PyArg_ParseTuple(args, "O(nnnnnn)(nnn)fpOOOOOi|p:mha", &xo, &B, &S, &W, &oq, &ok, &ov, &H, &dq,
                          &dv, &scale, &causal, &m1o, &m1d, &m2o, &m2d, &yo, &threads, &tiles))
        return NULL;
    /* the tiles where they apply (an AVX-512 CPU, whole 32-column panels of a head's output) */
    tiles = tiles && rc_conv_fast && dv % 32 == 0;
    if (!tiles && !rc_sgemm) {
        PyErr_SetString(PyExc_RuntimeError, "mha: no sgemm (set_sgemm was not called)");
        return NULL;
    }
    if (B < 1 || S < 1 || H < 1 || dq < 1 || dv < 1 || W > INT32_MAX || S > INT32_MAX / 4 ||
        oq < 0 || ok < 0 || ov < 0 || oq + (rc_wide)H * dq > W || ok + (rc_wide)H * dq > W ||
        ov + (rc_wide)H * dv > W || (rc_wide)H * dv > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "mha: sizes out of range (or a head's columns past W)");
        return NULL;
    }
    rc_sz sz = {NULL};
    const Py_ssize_t xn = sz_mul3(&sz, "QKV's size", B, S, W), yn = sz_mul4(&sz, "Y's size", B, S, H, dv);
    if (sz_check(&sz, "mha", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[4];
    mh_job j;
    memset(&j, 0, sizeof j);
    if (get_items("mha", xo, &v[0], 0, xn, RC_F32, "QKV") < 0)
        return NULL;
    v[1].obj = v[2].obj = v[3].obj = NULL;
    if (mh_bias(m1o, m1d, B, H, S, "mask", &v[1], &j.m1b, &j.m1h, &j.m1s) < 0 ||
        mh_bias(m2o, m2d, B, H, S, "attention bias", &v[2], &j.m2b, &j.m2h, &j.m2s) < 0 ||
        get_items("mha", yo, &v[3], 1, yn, RC_F32, "Y") < 0) {
        release_buffers(v, 3);
        return NULL;
    }
    const float *x = (const float *)v[0].buf;
    j.q = x + oq;
    j.k = x + ok;
    j.v = x + ov;
    j.xb = S * W;
    j.xs = W;
    j.m1 = (const float *)v[1].buf;
    j.m2 = (const float *)v[2].buf;
    j.y = (float *)v[3].buf;
    j.B = B, j.H = H, j.S = S, j.dq = dq, j.dv = dv;
    j.scale = scale;
    j.causal = causal;
    if (tiles)
        return mt_run(&j, threads, v, 4);
    /* causal: blocks of at most MH_CAUSAL_ROWS rows, the finer the more masked work is skipped */
    const Py_ssize_t heads = B * H;
    j.rb = mh_rows(heads, S, causal ? (S + MH_CAUSAL_ROWS - 1) / MH_CAUSAL_ROWS : 1);
    const double work = (causal ? 1.0 : 2.0) * (double)heads * (double)S * (double)S * (double)(dq + dv);
    const int parts = rc_parts(work, 2.5e5, heads * ((S + j.rb - 1) / j.rb), &threads);
    return rc_run_job(mh_part, &j, parts, threads, v, 4, &j.oom);
}

/* bmm: y[i] = alpha * op(a[i]) op(b[i]) over a batch of row-major matrices (op: the transpose
 * of the last two axes where asked, read in place), a or b broadcast when its stride is 0; a
 * unit a (matrix, block of rows) on the kernel threads, each a single-threaded sgemm, for the
 * attention's Q K^T and P V products (numpy loops its batch on one BLAS thread) */
typedef struct {
    const float *a, *b;
    float *y;
    Py_ssize_t sa, sb, batch, M, K, N, rb;
    int ta, tb, oom;
    float alpha;
} bmm_job;

static void bmm_part(void *arg, int part, int parts)
{
    const bmm_job *j = (const bmm_job *)arg;
    const Py_ssize_t nrb = (j->M + j->rb - 1) / j->rb, units = j->batch * nrb;
    const Py_ssize_t u0 = units * part / parts, u1 = units * (part + 1) / parts;
    char ca = j->ta ? 'T' : 'N', cb = j->tb ? 'T' : 'N';
    int iN = (int)j->N, iK = (int)j->K, lda = (int)(j->ta ? j->M : j->K), ldb = (int)(j->tb ? j->K : j->N);
    float alpha = j->alpha, zero = 0.0f;
    for (Py_ssize_t u = u0; u < u1; u++) {
        const Py_ssize_t i = u / nrb, s0 = (u - i * nrb) * j->rb;
        const Py_ssize_t s1 = s0 + j->rb < j->M ? s0 + j->rb : j->M;
        int n = (int)(s1 - s0);
        const float *a = j->a + i * j->sa + (j->ta ? s0 : s0 * j->K);
        const float *b = j->b + i * j->sb;
        float *y = j->y + (i * j->M + s0) * j->N;
        /* column-major y^T (N x n) = op(b)^T (N x K) op(a)^T (K x n) */
        rc_sgemm(&cb, &ca, &iN, &n, &iK, &alpha, (float *)b, &ldb, (float *)a, &lda, &zero, y, &iN);
    }
}

PyObject *rc_py_bmm(PyObject *self, PyObject *args)
{
    PyObject *ao, *bo, *yo;
    Py_ssize_t batch, M, K, N;
    int ba, bb, ta, tb, threads;
    float alpha;
    if (!PyArg_ParseTuple(args, "OOO(nnnnpp)ppfi:bmm", &ao, &bo, &yo, &batch, &M, &K, &N, &ba, &bb, &ta, &tb,
                          &alpha, &threads))
        return NULL;
    if (!rc_sgemm) {
        PyErr_SetString(PyExc_RuntimeError, "bmm: no sgemm (set_sgemm was not called)");
        return NULL;
    }
    if (batch < 1 || M < 1 || K < 1 || N < 1 || M > INT32_MAX || K > INT32_MAX || N > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "bmm: sizes out of range");
        return NULL;
    }
    rc_sz sz = {NULL};
    const Py_ssize_t an = sz_mul3(&sz, "a's size", ba ? batch : 1, M, K);
    const Py_ssize_t bn = sz_mul3(&sz, "b's size", bb ? batch : 1, K, N);
    const Py_ssize_t yn = sz_mul3(&sz, "y's size", batch, M, N);
    if (sz_check(&sz, "bmm", PyExc_ValueError) < 0)
        return NULL;
    rc_buf spec[3] = {{ao, an, RC_F32, 0, 0, "a"}, {bo, bn, RC_F32, 0, 0, "b"}, {yo, yn, RC_F32, 1, 0, "y"}};
    Py_buffer v[3];
    if (get_buffers("bmm", spec, v, 3) < 0)
        return NULL;
    bmm_job j;
    memset(&j, 0, sizeof j);
    j.a = (const float *)v[0].buf;
    j.b = (const float *)v[1].buf;
    j.y = (float *)v[2].buf;
    j.sa = ba ? M * K : 0;
    j.sb = bb ? K * N : 0;
    j.batch = batch, j.M = M, j.K = K, j.N = N;
    j.ta = ta, j.tb = tb;
    j.alpha = alpha;
    j.rb = unit_rows(batch, M, 1);
    const double work = 2.0 * (double)batch * (double)M * (double)K * (double)N;
    const int parts = rc_parts(work, 2.5e5, batch * ((M + j.rb - 1) / j.rb), &threads);
    return rc_run_job(bmm_part, &j, parts, threads, v, 3, &j.oom);
}

/* sdpa: softmax(q k^T * scale + bias) v per head of q, k, v laid out (heads, S, d), each
 * C-contiguous (what the exporters' head splits leave): mh_part with a head as its batch */
PyObject *rc_py_sdpa(PyObject *self, PyObject *args)
{
    PyObject *qo, *ko, *vo, *mo, *md, *yo;
    Py_ssize_t BH, S, d;
    float scale;
    int threads;
    if (!PyArg_ParseTuple(args, "OOO(nnn)fOOOi:sdpa", &qo, &ko, &vo, &BH, &S, &d, &scale, &mo, &md, &yo, &threads))
        return NULL;
    if (!rc_sgemm) {
        PyErr_SetString(PyExc_RuntimeError, "sdpa: no sgemm (set_sgemm was not called)");
        return NULL;
    }
    if (BH < 1 || S < 1 || d < 1 || d > INT32_MAX || S > INT32_MAX / 4) {
        PyErr_SetString(PyExc_ValueError, "sdpa: sizes out of range");
        return NULL;
    }
    rc_sz sz = {NULL};
    const Py_ssize_t n = sz_mul3(&sz, "q's size", BH, S, d);
    if (sz_check(&sz, "sdpa", PyExc_ValueError) < 0)
        return NULL;
    rc_buf spec[4] = {{qo, n, RC_F32, 0, 0, "q"}, {ko, n, RC_F32, 0, 0, "k"}, {vo, n, RC_F32, 0, 0, "v"},
                      {yo, n, RC_F32, 1, 0, "y"}};
    Py_buffer v[5];
    if (get_buffers("sdpa", spec, v, 4) < 0)
        return NULL;
    mh_job j;
    memset(&j, 0, sizeof j);
    if (mh_bias(mo, md, BH, 1, S, "bias", &v[4], &j.m1b, &j.m1h, &j.m1s) < 0) {
        release_buffers(v, 4);
        return NULL;
    }
    j.q = (const float *)v[0].buf;
    j.k = (const float *)v[1].buf;
    j.v = (const float *)v[2].buf;
    j.y = (float *)v[3].buf;
    j.m1 = (const float *)v[4].buf;
    j.xb = S * d;
    j.xs = d;
    j.B = BH, j.H = 1, j.S = S, j.dq = d, j.dv = d;
    j.scale = scale;
    j.rb = mh_rows(BH, S, 1); /* the units of mha */
    const double work = 4.0 * (double)BH * (double)S * (double)S * (double)d;
    const int parts = rc_parts(work, 2.5e5, BH * ((S + j.rb - 1) / j.rb), &threads);
    return rc_run_job(mh_part, &j, parts, threads, v, 5, &j.oom);
}
