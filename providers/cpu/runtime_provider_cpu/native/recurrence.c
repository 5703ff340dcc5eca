/* recurrence: the time loop of LSTM and GRU (default activations, no clip, peepholes or
 * sequence lengths) in float32, every direction of a node in one call. A step is one pass
 * over the recurrence matrix packed by chunks of hidden units for a block of batch rows at
 * once (each weight vector loaded once feeds every row of the block), the gate
 * nonlinearities applied to the chunk's sums while they are hot. The directions of a
 * bidirectional node are independent: one part each on the kernel pool. */
#include "native.h"

_Static_assert(RC_U == 16, "a chunk's gate is one 16-float vector");

typedef struct {
    int lstm, lbr, reverse, ndir;
    Py_ssize_t seq, B, H, nchunk, xld;
    const float *xw;   /* [seq, B, xld]: input projection, direction d's gates from d * G * H */
    const float *xb;   /* [ndir, G * H]: biases added to the input term (NULL: none) */
    const float *p1;   /* [ndir, nchunk, H, G1, RC_U]: the gates of the first product */
    const float *p2;   /* GRU, linear_before_reset=0: [ndir, nchunk, H, RC_U], the n gate */
    const float *rbn;  /* GRU, linear_before_reset=1: [ndir, H], Rb of the n gate */
    const float *h0;   /* [ndir, B, H] */
    float *c;          /* LSTM: [ndir, B, H], c0 in, the last cell state out */
    float *ys;         /* [seq, ndir, B, H] (Y as the op lays it out) or [seq, B, ndir, H] */
    Py_ssize_t ysd, ysb; /* floats between the directions and the batch rows of a step of ys */
    float *scratch;    /* GRU, linear_before_reset=0: [ndir, 2, B, H] (z, r * h) */
    int nbmax[5];      /* rows a block, by gates in the product: what keeps its sums in registers */
} rc_job;

/* out[r][g][0 .. RC_U) = sum_k hr[r][k] * p[k][g][0 .. RC_U) for NB rows and G gates: G vector
   loads a k feed G * NB FMAs (NB * G <= 24 sums: in registers with AVX-512's 32). Up to 8
   sums, even and odd k go to separate sums: enough FMAs in flight to hide their latency. */
RC_INLINE void rc_block(const float *const *hr, const float *restrict p, Py_ssize_t K, const int G,
                        const int NB, float *restrict out)
{
    const int S = NB * G <= 8 ? 2 : 1; /* sets of sums */
    const float *h[8];
    v16f acc[2][24];
    for (int r = 0; r < NB; r++)
        h[r] = hr[r];
    for (int u = 0; u < S; u++)
        for (int i = 0; i < NB * G; i++)
            acc[u][i] = (v16f){0};
    Py_ssize_t k = 0;
    for (; k + S <= K; k += S)
        for (int u = 0; u < S; u++) {
            const float *q = p + (k + u) * (G * RC_U);
            v16f w[4];
            for (int g = 0; g < G; g++)
                w[g] = *(const v16f_u *)(q + RC_U * g);
            for (int r = 0; r < NB; r++) {
                const v16f hb = cv_bcast(h[r][k + u]);
                for (int g = 0; g < G; g++)
                    acc[u][r * G + g] += hb * w[g];
            }
        }
    for (; k < K; k++) {
        const float *q = p + k * (G * RC_U);
        for (int r = 0; r < NB; r++) {
            const v16f hb = cv_bcast(h[r][k]);
            for (int g = 0; g < G; g++)
                acc[0][r * G + g] += hb * *(const v16f_u *)(q + RC_U * g);
        }
    }
    for (int i = 0; i < NB * G; i++)
        *(v16f_u *)(out + RC_U * i) = S == 2 ? acc[0][i] + acc[1][i] : acc[0][i];
}

/* rc_block with G and NB constants (nb one of 1, 2, 4, 6, 8) */
RC_INLINE void rc_block_any(const float *const *hr, const float *p, Py_ssize_t K, int G, int nb,
                            float *out)
{
#define RC_NB(G)                                                  \
    switch (nb) {                                                 \
    case 1: rc_block(hr, p, K, G, 1, out); break;                 \
    case 2: rc_block(hr, p, K, G, 2, out); break;                 \
    case 4: rc_block(hr, p, K, G, 4, out); break;                 \
    case 6: rc_block(hr, p, K, G, 6, out); break;                 \
    default: rc_block(hr, p, K, G, (G) == 4 ? 6 : 8, out); break; \
    }
    switch (G) {
    case 1: RC_NB(1) break;
    case 2: RC_NB(2) break;
    case 3: RC_NB(3) break;
    default: RC_NB(4) break;
    }
#undef RC_NB
}

/* the block size for n rows left (at most nbmax of them): the smallest of 1, 2, 4, 6, 8 that
   holds them (the rows past n repeat a real row; their sums are dropped) */
static int rc_nb(Py_ssize_t n, int nbmax)
{
    const int m = n < nbmax ? (int)n : nbmax;
    return m <= 2 ? m : m <= 4 ? 4 : m <= 6 ? 6 : 8;
}

/* RC_U floats of a row that may end early (the last chunk when H % RC_U != 0): loaded
   through a zero-padded copy so nothing past the row is read */
RC_INLINE v16f rc_ld(const float *p, int nu)
{
    if (nu == RC_U)
        return *(const v16f_u *)p;
    float tmp[RC_U] = {0};
    memcpy(tmp, p, (size_t)nu * sizeof(float));
    return *(const v16f_u *)tmp;
}

RC_INLINE void rc_st(float *p, int nu, v16f v)
{
    if (nu == RC_U) {
        *(v16f_u *)p = v;
        return;
    }
    float tmp[RC_U];
    *(v16f_u *)tmp = v;
    memcpy(p, tmp, (size_t)nu * sizeof(float));
}

/* the input term of one chunk of a gate: xw plus its bias */
RC_INLINE v16f rc_xin(const float *x, const float *xb, Py_ssize_t off, int nu)
{
    const v16f v = rc_ld(x + off, nu);
    return xb ? v + rc_ld(xb + off, nu) : v;
}

RC_CLONES
static void rc_direction(const rc_job *j, int d)
{
    const Py_ssize_t H = j->H, B = j->B, seq = j->seq, nc = j->nchunk, xld = j->xld;
    const int G = j->lstm ? 4 : 3, G1 = j->lstm ? 4 : (j->lbr ? 3 : 2);
    const int rev = j->ndir == 2 ? d == 1 : j->reverse;
    const Py_ssize_t ystep = j->ndir * B * H, ysb = j->ysb; /* floats between steps, rows of ys */
    const float *p1 = j->p1 + d * nc * H * G1 * RC_U;
    const float *p2 = j->p2 ? j->p2 + d * nc * H * RC_U : NULL;
    const float *xb = j->xb ? j->xb + d * G * H : NULL;
    const float *rbn = j->rbn ? j->rbn + d * H : NULL;
    const float *h0 = j->h0 + d * B * H;
    float *cst = j->c ? j->c + d * B * H : NULL;
    float *zbuf = j->scratch ? j->scratch + d * 2 * B * H : NULL, *rh = zbuf ? zbuf + B * H : NULL;
    float acc[8 * 4 * RC_U];
    const float *hr[8];
    for (Py_ssize_t s = 0; s < seq; s++) {
        const Py_ssize_t t = rev ? seq - 1 - s : s;
        const Py_ssize_t tp = rev ? t + 1 : t - 1;
        /* the previous state: row b at hprev + b * hs */
        const float *hprev = s == 0 ? h0 : j->ys + tp * ystep + d * j->ysd;
        const Py_ssize_t hs = s == 0 ? H : ysb;
        float *hnew = j->ys + t * ystep + d * j->ysd;
        const float *xt = j->xw + t * B * xld + d * G * H;
        for (Py_ssize_t b0 = 0; b0 < B; ) {
            const int nb = rc_nb(B - b0, j->nbmax[G1]);
            const Py_ssize_t n = B - b0 < nb ? B - b0 : nb; /* real rows of the block */
            for (int r = 0; r < nb; r++)
                hr[r] = hprev + (b0 + (r < n ? r : n - 1)) * hs;
            for (Py_ssize_t ci = 0; ci < nc; ci++) {
                /* every other step walks the chunks backwards: the weights read last are
                   still in L2 and are read first, where a same-order sweep of a matrix
                   larger than L2 would miss on every line */
                const Py_ssize_t c = (s & 1) ? nc - 1 - ci : ci;
                const Py_ssize_t j0 = c * RC_U;
                const int nu = H - j0 < RC_U ? (int)(H - j0) : RC_U;
                if (s + 1 < seq) {
                    /* the next step's input terms of this chunk, asked for while the sums
                       take their time: xw streams from memory, a line a gate and row */
                    const float *xn = j->xw + (rev ? t - 1 : t + 1) * B * xld + d * G * H + j0;
                    for (Py_ssize_t r = 0; r < n; r++)
                        for (int g = 0; g < G; g++) {
                            __builtin_prefetch(xn + (b0 + r) * xld + g * H);
                            __builtin_prefetch(xn + (b0 + r) * xld + g * H + nu - 1);
                        }
                }
                rc_block_any(hr, p1 + c * H * G1 * RC_U, H, G1, nb, acc);
                for (Py_ssize_t r = 0; r < n; r++) {
                    const Py_ssize_t b = b0 + r;
                    const float *x = xt + b * xld, *a = acc + r * G1 * RC_U;
                    const v16f s0 = *(const v16f_u *)a + rc_xin(x, xb, j0, nu);
                    const v16f s1 = *(const v16f_u *)(a + RC_U) + rc_xin(x, xb, H + j0, nu);
                    if (j->lstm) {
                        float *cu = cst + b * H + j0;
                        const v16f ig = v16_sigmoid(s0), og = v16_sigmoid(s1);
                        const v16f fg = v16_sigmoid(*(const v16f_u *)(a + 2 * RC_U) + rc_xin(x, xb, 2 * H + j0, nu));
                        const v16f cg = v16_tanh(*(const v16f_u *)(a + 3 * RC_U) + rc_xin(x, xb, 3 * H + j0, nu));
                        const v16f cn = fg * rc_ld(cu, nu) + ig * cg; /* the new cell state */
                        rc_st(cu, nu, cn);
                        rc_st(hnew + b * ysb + j0, nu, og * v16_tanh(cn));
                    } else if (j->lbr) {
                        const v16f z = v16_sigmoid(s0), rg = v16_sigmoid(s1);
                        const v16f rn = *(const v16f_u *)(a + 2 * RC_U) + rc_ld(rbn + j0, nu);
                        const v16f nn = v16_tanh(rc_xin(x, xb, 2 * H + j0, nu) + rg * rn);
                        rc_st(hnew + b * ysb + j0, nu, nn + z * (rc_ld(hprev + b * hs + j0, nu) - nn));
                    } else {
                        rc_st(zbuf + b * H + j0, nu, v16_sigmoid(s0));
                        rc_st(rh + b * H + j0, nu, v16_sigmoid(s1) * rc_ld(hprev + b * hs + j0, nu));
                    }
                }
            }
            b0 += n;
        }
        if (j->lstm || j->lbr)
            continue;
        /* GRU, linear_before_reset=0: the n gate's product takes r * h of the whole row */
        for (Py_ssize_t b0 = 0; b0 < B; ) {
            const int nb = rc_nb(B - b0, j->nbmax[1]);
            const Py_ssize_t n = B - b0 < nb ? B - b0 : nb;
            for (int r = 0; r < nb; r++)
                hr[r] = rh + (b0 + (r < n ? r : n - 1)) * H;
            for (Py_ssize_t c = 0; c < nc; c++) {
                const Py_ssize_t j0 = c * RC_U;
                const int nu = H - j0 < RC_U ? (int)(H - j0) : RC_U;
                rc_block_any(hr, p2 + c * H * RC_U, H, 1, nb, acc);
                for (Py_ssize_t r = 0; r < n; r++) {
                    const Py_ssize_t b = b0 + r;
                    const v16f nn = v16_tanh(rc_xin(xt + b * xld, xb, 2 * H + j0, nu) + *(const v16f_u *)(acc + r * RC_U));
                    const v16f z = rc_ld(zbuf + b * H + j0, nu);
                    rc_st(hnew + b * ysb + j0, nu, nn + z * (rc_ld(hprev + b * hs + j0, nu) - nn));
                }
            }
            b0 += n;
        }
    }
}

static void rc_part(void *arg, int part, int parts)
{
    (void)parts;
    rc_direction((const rc_job *)arg, part);
}

PyObject *rc_py_recurrence(PyObject *self, PyObject *args)
{
    int lstm, lbr, reverse, threads;
    PyObject *xo, *xbo, *p1o, *p2o, *rbo, *h0o, *co, *yo;
    int batch_major;
    Py_ssize_t seq, ndir, B, H, xld;
    if (!PyArg_ParseTuple(args, "pppOOOOOOOO(nnnnn)pi:recurrence", &lstm, &lbr, &reverse, &xo, &xbo, &p1o,
                          &p2o, &rbo, &h0o, &co, &yo, &seq, &ndir, &B, &H, &xld, &batch_major, &threads))
        return NULL;
    if (seq < 0 || B < 0 || H < 1 || (ndir != 1 && ndir != 2)) {
        PyErr_SetString(PyExc_ValueError,
                        "recurrence: negative sequence or batch, no hidden units, or not 1 or 2 directions");
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
    const Py_ssize_t gates = sz_mul3(&sz, "xw's row", ndir, G, H);
    if (!sz.what && xld < gates) {
        PyErr_Format(PyExc_ValueError, "recurrence: xw's rows of %zd floats cannot hold %zd gates", xld, gates);
        return NULL;
    }
    const Py_ssize_t xn = sz_mul3(&sz, "xw's size", seq, B, xld);
    const Py_ssize_t p1n = sz_mul(&sz, "p1's size", sz_mul4(&sz, "p1's size", ndir, nchunk, H, G1), RC_U);
    const Py_ssize_t p2n = sz_mul4(&sz, "p2's size", ndir, nchunk, H, RC_U);
    const Py_ssize_t bh = sz_mul3(&sz, "h0's size", ndir, B, H), rbn = sz_mul(&sz, "rbn's size", ndir, H);
    const Py_ssize_t yn = sz_mul(&sz, "ys's size", seq, bh), scr = sz_mul(&sz, "the work buffer", bh, 2);
    if (sz_check(&sz, "recurrence", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[8];
    /* p2, rbn and c were checked above: None exactly where the variant has none */
    const rc_buf spec[8] = {
        {xo, xn, RC_F32, 0, 0, "xw"}, {xbo, gates, RC_F32, 0, 1, "xb"}, {p1o, p1n, RC_F32, 0, 0, "p1"},
        {p2o, p2n, RC_F32, 0, 1, "p2"}, {rbo, rbn, RC_F32, 0, 1, "rbn"}, {h0o, bh, RC_F32, 0, 0, "h0"},
        {co, bh, RC_F32, 1, 1, "c"}, {yo, yn, RC_F32, 1, 0, "ys"}};
    if (get_buffers("recurrence", spec, v, 8) < 0)
        return NULL;
    rc_job job;
    memset(&job, 0, sizeof job);
    job.lstm = lstm;
    job.lbr = lbr;
    job.reverse = reverse;
    job.ndir = (int)ndir;
    job.seq = seq;
    job.B = B;
    job.H = H;
    job.nchunk = nchunk;
    job.xld = xld;
    job.xw = (const float *)v[0].buf;
    job.xb = (const float *)v[1].buf; /* NULL where absent */
    job.p1 = (const float *)v[2].buf;
    job.p2 = (const float *)v[3].buf;
    job.rbn = (const float *)v[4].buf;
    job.h0 = (const float *)v[5].buf;
    job.c = (float *)v[6].buf;
    job.ys = (float *)v[7].buf;
    job.ysd = batch_major ? H : B * H;
    job.ysb = batch_major ? ndir * H : H;
    /* rows a block: 24 sums in the 32 AVX-512 registers, 12 halves of 16 in AVX2's 16 */
    static const int wide[5] = {0, 8, 8, 8, 6}, narrow[5] = {0, 6, 4, 2, 2};
    memcpy(job.nbmax, rc_conv_fast ? wide : narrow, sizeof job.nbmax);
    int oom = 0;
    if (has_p2 && B > 0 && seq > 0) {
        job.scratch = (float *)malloc((size_t)scr * sizeof(float));
        oom = job.scratch == NULL;
    }
    if (!oom && seq > 0 && B > 0) {
        const int th = threads < 1 ? 1 : (threads > (int)ndir ? (int)ndir : threads);
        Py_BEGIN_ALLOW_THREADS
        if (th > 1)
            rc_parallel(rc_part, &job, (int)ndir, th);
        else
            for (int d = 0; d < (int)ndir; d++)
                rc_direction(&job, d);
        Py_END_ALLOW_THREADS
    }
    free(job.scratch);
    release_buffers(v, 8);
    if (oom)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}
