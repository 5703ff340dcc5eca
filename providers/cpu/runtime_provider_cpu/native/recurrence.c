/* recurrence: the time loop of LSTM and GRU (default activations, no clip, peepholes or
 * sequence lengths) in float32, a step one pass over the recurrence matrix packed by chunks of
 * hidden units, the gate nonlinearities applied while the chunk's sums are in registers. One
 * thread: BLAS's spinning workers made a second thread of ours slower right after a BLAS call
 * (docs/performance.md). */
#include "native.h"

typedef struct {
    int lstm, lbr, reverse;
    Py_ssize_t seq, B, H, nchunk;
    const float *xw;   /* [seq, B, G*H]: input projection with the biases folded in */
    const float *p1;   /* [nchunk, H, G1, RC_U]: the gates of the first product */
    const float *p2;   /* GRU, linear_before_reset=0: [nchunk, H, 1, RC_U], the n gate */
    const float *rbn;  /* GRU, linear_before_reset=1: [H], Rb of the n gate */
    const float *h0;   /* [B, H] */
    float *c;          /* LSTM: [B, H], c0 in, the last cell state out */
    float *ys;         /* [seq, B, H] */
    float *zbuf, *rh;  /* GRU, linear_before_reset=0: [B, H] each */
} rc_job;

/* out[i] = sum_k h[k] * p[k, i] for the G * RC_U outputs of one chunk; products of
   even and odd k go to separate accumulators so that G = 1, 2 still keep eight FMAs in
   flight */
#define RC_GEMV(G)                                                                          \
    RC_INLINE void rc_gemv##G(const float *restrict h, const float *restrict p, Py_ssize_t K, \
                              float *restrict out)                                          \
    {                                                                                       \
        v8f a0[2 * G], a1[2 * G];                                                           \
        for (int i = 0; i < 2 * G; i++)                                                     \
            a0[i] = a1[i] = v8_set1(0.0f);                                                  \
        Py_ssize_t k = 0;                                                                   \
        for (; k + 1 < K; k += 2) {                                                         \
            const v8f h0 = v8_set1(h[k]), h1 = v8_set1(h[k + 1]);                           \
            const float *q = p + k * (G * RC_U);                                            \
            for (int i = 0; i < 2 * G; i++) {                                               \
                a0[i] += h0 * v8_load(q + 8 * i);                                           \
                a1[i] += h1 * v8_load(q + G * RC_U + 8 * i);                                \
            }                                                                               \
        }                                                                                   \
        if (k < K) {                                                                        \
            const v8f h0 = v8_set1(h[k]);                                                   \
            const float *q = p + k * (G * RC_U);                                            \
            for (int i = 0; i < 2 * G; i++)                                                 \
                a0[i] += h0 * v8_load(q + 8 * i);                                           \
        }                                                                                   \
        for (int i = 0; i < 2 * G; i++)                                                     \
            v8_store(out + 8 * i, a0[i] + a1[i]);                                           \
    }
RC_GEMV(1)
RC_GEMV(2)
RC_GEMV(3)
RC_GEMV(4)

/* RC_U floats of a row that may end early (the last chunk when H % RC_U != 0): loaded
   through a zero-padded copy so nothing past the row is read */
RC_INLINE void rc_load16(const float *p, int nu, v8f *lo, v8f *hi)
{
    if (nu == RC_U) {
        *lo = v8_load(p);
        *hi = v8_load(p + 8);
        return;
    }
    float tmp[RC_U] = {0};
    memcpy(tmp, p, (size_t)nu * sizeof(float));
    *lo = v8_load(tmp);
    *hi = v8_load(tmp + 8);
}

RC_INLINE void rc_store16(float *p, int nu, v8f lo, v8f hi)
{
    if (nu == RC_U) {
        v8_store(p, lo);
        v8_store(p + 8, hi);
        return;
    }
    float tmp[RC_U];
    v8_store(tmp, lo);
    v8_store(tmp + 8, hi);
    memcpy(p, tmp, (size_t)nu * sizeof(float));
}

RC_CLONES
static void rc_loop(rc_job *j)
{
    const Py_ssize_t H = j->H, B = j->B, seq = j->seq, nc = j->nchunk;
    const Py_ssize_t XW = (j->lstm ? 4 : 3) * H;
    float acc[4 * RC_U];
    v8f x0[2], x1[2], x2[2], x3[2], hv[2], out[2];
    for (Py_ssize_t s = 0; s < seq; s++) {
        const Py_ssize_t t = j->reverse ? seq - 1 - s : s;
        const Py_ssize_t tp = j->reverse ? t + 1 : t - 1;
        for (Py_ssize_t b = 0; b < B; b++) {
            const float *hp = s == 0 ? j->h0 + b * H : j->ys + (tp * B + b) * H;
            const float *x = j->xw + (t * B + b) * XW;
            float *hn = j->ys + (t * B + b) * H;
            for (Py_ssize_t ci = 0; ci < nc; ci++) {
                /* every other step walks the chunks backwards: the weights read last are
                   still in L2 and are read first, where a same-order sweep of a matrix
                   larger than L2 would miss on every line */
                const Py_ssize_t c = (s & 1) ? nc - 1 - ci : ci;
                const Py_ssize_t j0 = c * RC_U;
                const int nu = H - j0 < RC_U ? (int)(H - j0) : RC_U;
                const float *xu = x + j0;
                rc_load16(xu, nu, &x0[0], &x0[1]);
                rc_load16(xu + H, nu, &x1[0], &x1[1]);
                if (j->lstm) {
                    float *cu = j->c + b * H + j0;
                    rc_gemv4(hp, j->p1 + c * H * 4 * RC_U, H, acc);
                    rc_load16(xu + 2 * H, nu, &x2[0], &x2[1]);
                    rc_load16(xu + 3 * H, nu, &x3[0], &x3[1]);
                    rc_load16(cu, nu, &hv[0], &hv[1]);
                    for (int q = 0; q < 2; q++) {
                        const v8f ig = v8_sigmoid(v8_load(acc + 8 * q) + x0[q]);
                        const v8f og = v8_sigmoid(v8_load(acc + RC_U + 8 * q) + x1[q]);
                        const v8f fg = v8_sigmoid(v8_load(acc + 2 * RC_U + 8 * q) + x2[q]);
                        const v8f cg = v8_tanh(v8_load(acc + 3 * RC_U + 8 * q) + x3[q]);
                        hv[q] = fg * hv[q] + ig * cg;  /* the new cell state */
                        out[q] = og * v8_tanh(hv[q]);
                    }
                    rc_store16(cu, nu, hv[0], hv[1]);
                    rc_store16(hn + j0, nu, out[0], out[1]);
                } else if (j->lbr) {
                    rc_gemv3(hp, j->p1 + c * H * 3 * RC_U, H, acc);
                    rc_load16(xu + 2 * H, nu, &x2[0], &x2[1]);
                    rc_load16(j->rbn + j0, nu, &x3[0], &x3[1]);
                    rc_load16(hp + j0, nu, &hv[0], &hv[1]);
                    for (int q = 0; q < 2; q++) {
                        const v8f z = v8_sigmoid(v8_load(acc + 8 * q) + x0[q]);
                        const v8f r = v8_sigmoid(v8_load(acc + RC_U + 8 * q) + x1[q]);
                        const v8f n = v8_tanh(x2[q] + r * (v8_load(acc + 2 * RC_U + 8 * q) + x3[q]));
                        out[q] = n + z * (hv[q] - n);
                    }
                    rc_store16(hn + j0, nu, out[0], out[1]);
                } else {
                    rc_gemv2(hp, j->p1 + c * H * 2 * RC_U, H, acc);
                    rc_load16(hp + j0, nu, &hv[0], &hv[1]);
                    v8f z[2];
                    for (int q = 0; q < 2; q++) {
                        z[q] = v8_sigmoid(v8_load(acc + 8 * q) + x0[q]);
                        out[q] = v8_sigmoid(v8_load(acc + RC_U + 8 * q) + x1[q]) * hv[q];
                    }
                    rc_store16(j->zbuf + b * H + j0, nu, z[0], z[1]);
                    rc_store16(j->rh + b * H + j0, nu, out[0], out[1]);
                }
            }
        }
        if (!j->lstm && !j->lbr) {
            for (Py_ssize_t b = 0; b < B; b++) {
                const float *hp = s == 0 ? j->h0 + b * H : j->ys + (tp * B + b) * H;
                const float *x = j->xw + (t * B + b) * XW;
                float *hn = j->ys + (t * B + b) * H;
                for (Py_ssize_t c = 0; c < nc; c++) {
                    const Py_ssize_t j0 = c * RC_U;
                    const int nu = H - j0 < RC_U ? (int)(H - j0) : RC_U;
                    rc_gemv1(j->rh + b * H, j->p2 + c * H * RC_U, H, acc);
                    rc_load16(x + 2 * H + j0, nu, &x2[0], &x2[1]);
                    rc_load16(hp + j0, nu, &hv[0], &hv[1]);
                    rc_load16(j->zbuf + b * H + j0, nu, &x0[0], &x0[1]);
                    for (int q = 0; q < 2; q++) {
                        const v8f n = v8_tanh(x2[q] + v8_load(acc + 8 * q));
                        out[q] = n + x0[q] * (hv[q] - n);
                    }
                    rc_store16(hn + j0, nu, out[0], out[1]);
                }
            }
        }
    }
}

PyObject *rc_py_recurrence(PyObject *self, PyObject *args)
{
    int lstm, lbr, reverse;
    PyObject *xo, *p1o, *p2o, *rbo, *h0o, *co, *yo;
    Py_ssize_t seq, B, H;
    if (!PyArg_ParseTuple(args, "pppOOOOOOO(nnn):recurrence", &lstm, &lbr, &reverse,
                          &xo, &p1o, &p2o, &rbo, &h0o, &co, &yo, &seq, &B, &H))
        return NULL;
    if (seq < 0 || B < 0 || H < 1) {
        PyErr_SetString(PyExc_ValueError, "recurrence: negative sequence or batch, or no hidden units");
        return NULL;
    }
    if (lstm)
        lbr = 0;
    const Py_ssize_t nchunk = H / RC_U + (H % RC_U != 0), G = lstm ? 4 : 3;
    const Py_ssize_t G1 = lstm ? 4 : (lbr ? 3 : 2);
    const int has_p2 = !lstm && !lbr, has_rb = !lstm && lbr, has_c = lstm;
    if ((p2o != Py_None) != has_p2 || (rbo != Py_None) != has_rb || (co != Py_None) != has_c) {
        PyErr_SetString(PyExc_ValueError,
                        "recurrence: p2 is for GRU with linear_before_reset=0, rbn for GRU with "
                        "linear_before_reset=1, c for LSTM; pass None otherwise");
        return NULL;
    }
    rc_sz sz = {NULL};
    const Py_ssize_t xn = sz_mul4(&sz, "xw's size", seq, B, G, H), p1n = sz_mul4(&sz, "p1's size", nchunk, H, G1, RC_U);
    const Py_ssize_t p2n = sz_mul3(&sz, "p2's size", nchunk, H, RC_U), bh = sz_mul3(&sz, "h0's size", B, H, 2);
    const Py_ssize_t yn = sz_mul3(&sz, "ys's size", seq, B, H);
    if (sz_check(&sz, "recurrence", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[7];
    /* p2, rbn and c were checked above: None exactly where the variant has none */
    const rc_buf spec[7] = {
        {xo, xn, RC_F32, 0, 0, "xw"}, {p1o, p1n, RC_F32, 0, 0, "p1"},
        {p2o, p2n, RC_F32, 0, 1, "p2"}, {rbo, H, RC_F32, 0, 1, "rbn"},
        {h0o, bh / 2, RC_F32, 0, 0, "h0"}, {co, bh / 2, RC_F32, 1, 1, "c"},
        {yo, yn, RC_F32, 1, 0, "ys"}};
    if (get_buffers("recurrence", spec, v, 7) < 0)
        return NULL;
    rc_job job;
    memset(&job, 0, sizeof job);
    job.lstm = lstm;
    job.lbr = lbr;
    job.reverse = reverse;
    job.seq = seq;
    job.B = B;
    job.H = H;
    job.nchunk = nchunk;
    job.xw = (const float *)v[0].buf;
    job.p1 = (const float *)v[1].buf;
    job.p2 = (const float *)v[2].buf; /* NULL where absent */
    job.rbn = (const float *)v[3].buf;
    job.h0 = (const float *)v[4].buf;
    job.c = (float *)v[5].buf;
    job.ys = (float *)v[6].buf;
    float *scratch = NULL;
    int ok = 1;
    if (has_p2 && B > 0) {
        scratch = (float *)malloc((size_t)(2 * B * H) * sizeof(float));
        ok = scratch != NULL;
        job.zbuf = scratch;
        job.rh = scratch ? scratch + B * H : NULL;
    }
    if (ok && seq > 0 && B > 0) {
        Py_BEGIN_ALLOW_THREADS
        rc_loop(&job);
        Py_END_ALLOW_THREADS
    }
    free(scratch);
    release_buffers(v, 7);
    if (!ok)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}
