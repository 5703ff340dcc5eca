/* Row kernels, one pass a row where numpy needs several: bias_clip (a GEMM's epilogue),
 * gelu_erf (Gelu, erf and tanh forms), activate (HardSwish, HardSigmoid, Sigmoid, SiLU),
 * skip_layer_norm (also LayerNormalization), softmax. */
#include "native.h"

/* bias_clip: y[m, p] = clip(y[m, p] + b[m] (+ z[m, p]), lo, hi) in place, one pass (the
   epilogue of a convolution computed as a GEMM, which numpy would do in two or three); M rows
   of P columns, ld floats apart in y and z (the pointwise and Linear kernels' epilogues on a
   block of the output too) */
RC_CLONES
void bias_clip_block(float *restrict y, Py_ssize_t ld, const float *restrict b,
                            const float *restrict z, Py_ssize_t M, Py_ssize_t P, float lo, float hi)
{
    for (Py_ssize_t m = 0; m < M; m++) {
        float *row = y + m * ld;
        const float bv = b ? b[m] : 0.0f;
        if (z) {
            const float *zr = z + m * ld;
            for (Py_ssize_t p = 0; p < P; p++)
                row[p] = clipf(row[p] + bv + zr[p], lo, hi);
        } else {
            for (Py_ssize_t p = 0; p < P; p++)
                row[p] = clipf(row[p] + bv, lo, hi);
        }
    }
}

PyObject *rc_py_bias_clip(PyObject *self, PyObject *args)
{
    PyObject *yo, *bo, *zo = Py_None;
    Py_ssize_t M, P;
    float lo, hi;
    if (!PyArg_ParseTuple(args, "OO(nn)ff|O:bias_clip", &yo, &bo, &M, &P, &lo, &hi, &zo))
        return NULL;
    if (M < 0 || P < 0) {
        PyErr_SetString(PyExc_ValueError, "bias_clip: negative size");
        return NULL;
    }
    rc_sz sz = {NULL};
    const Py_ssize_t n = sz_mul(&sz, "Y's size", M, P);
    if (sz_check(&sz, "bias_clip", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[3]; /* Y, B, Z */
    const rc_buf spec[3] = {{yo, n, RC_F32, 1, 0, "Y"}, {bo, M, RC_F32, 0, 1, "B"},
                            {zo, n, RC_F32, 0, 1, "Z"}};
    if (get_buffers("bias_clip", spec, v, 3) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    bias_clip_block((float *)v[0].buf, P, (const float *)v[1].buf, (const float *)v[2].buf, M, P, lo, hi);
    Py_END_ALLOW_THREADS
    release_buffers(v, 3);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------------- */
/* gelu_erf: Gelu (erf form) of x (+ a bias over the last dim), one pass                  */
/* ------------------------------------------------------------------------------------- */

/* Eigen's rational erf (ops/elementwise.py's _ERF_P / _ERF_Q, the numerator halved so the
 * quotient is erf / 2), evaluated as the numpy path does: a = clip(s / sqrt 2, -4, 4),
 * y = s * (0.5 + p(a^2) a / q(a^2)), s = x + b. numpy needs ~20 passes over the tensor,
 * each a ufunc call per 64K block; here it is one, 8 floats at a time. */
static const float rc_erf_p_half[7] = {
    -2.72614225801306e-10f * 0.5f, 2.77068142495902e-08f * 0.5f, -2.10102402082508e-06f * 0.5f,
    -5.69250639462346e-05f * 0.5f, -7.34990630326855e-04f * 0.5f, -2.95459980854025e-03f * 0.5f,
    -1.60960333262415e-02f * 0.5f};
static const float rc_erf_q[5] = {-1.45660718464996e-05f, -2.13374055278905e-04f,
                                  -1.68282697438203e-03f, -7.37332916720468e-03f,
                                  -1.42647390514189e-02f};

RC_INLINE v8f rc_gelu8(v8f s)
{
    const v8f c = v8_set1(0.70710678118654752f), four = v8_set1(4.0f), mfour = v8_set1(-4.0f);
    v8f a = s * c;
    a = v8_select(a < mfour, mfour, a); /* NaN stays NaN */
    a = v8_select(a > four, four, a);
    const v8f x2 = a * a;
    v8f p = x2 * v8_set1(rc_erf_p_half[0]) + v8_set1(rc_erf_p_half[1]);
    for (int i = 2; i < 7; i++)
        p = p * x2 + v8_set1(rc_erf_p_half[i]);
    p = p * a;
    v8f q = x2 * v8_set1(rc_erf_q[0]) + v8_set1(rc_erf_q[1]);
    for (int i = 2; i < 5; i++)
        q = q * x2 + v8_set1(rc_erf_q[i]);
    return (p / q + v8_set1(0.5f)) * s;
}

/* Gelu's tanh form as s / (1 + exp(-2u)), u = sqrt(2/pi) (s + 0.044715 s^3): the numpy
   path's formula (ops/elementwise.gelu_tanh_f32), one exp and no cancellation for s < 0 */
RC_INLINE v8f rc_gelu_tanh8(v8f s)
{
    const float b = -1.5957691216057308f;            /* -2 sqrt(2/pi) */
    const float a = -1.5957691216057308f * 0.044715f;
    const v8f t = (s * s * a + b) * s;               /* -2u */
    /* past exp's range the quotient is 0 (the clamped exp would leave ~s / 2.4e38), and
       s * 0 keeps numpy's NaN for s = -inf */
    return v8_select(t > 88.0f, s * 0.0f, s / (1.0f + v8_exp(t)));
}

RC_INLINE v8f rc_gelu_any8(v8f s, int tanh_form) { return tanh_form ? rc_gelu_tanh8(s) : rc_gelu8(s); }

/* rc_gelu8 and rc_gelu_tanh8 on 16 lanes, the same operations lane by lane (the same bits): one
   AVX-512 register in the x86-64-v4 clone, where the 8-lane forms used half of each */
RC_INLINE v16f rc_gelu16(v16f s)
{
    const v16f c = cv_bcast(0.70710678118654752f), four = cv_bcast(4.0f), mfour = cv_bcast(-4.0f);
    v16f a = s * c;
    a = v16_select(a < mfour, mfour, a); /* NaN stays NaN */
    a = v16_select(a > four, four, a);
    const v16f x2 = a * a;
    v16f p = x2 * cv_bcast(rc_erf_p_half[0]) + cv_bcast(rc_erf_p_half[1]);
    for (int i = 2; i < 7; i++)
        p = p * x2 + cv_bcast(rc_erf_p_half[i]);
    p = p * a;
    v16f q = x2 * cv_bcast(rc_erf_q[0]) + cv_bcast(rc_erf_q[1]);
    for (int i = 2; i < 5; i++)
        q = q * x2 + cv_bcast(rc_erf_q[i]);
    return (p / q + cv_bcast(0.5f)) * s;
}

RC_INLINE v16f rc_gelu_tanh16(v16f s)
{
    const float b = -1.5957691216057308f;
    const float a = -1.5957691216057308f * 0.044715f;
    const v16f t = (s * s * a + b) * s;
    return v16_select(t > 88.0f, s * 0.0f, s / (1.0f + v16_exp(t)));
}

RC_CLONES
static void gelu_rows(const float *restrict x, const float *restrict b, float *y, Py_ssize_t rows,
                      Py_ssize_t d, int tanh_form)
{
    float tx[16], tb[16];
    for (Py_ssize_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        Py_ssize_t i = 0;
        if (tanh_form)
            for (; i + 16 <= d; i += 16) {
                v16f s = *(const v16f_u *)(xr + i);
                if (b)
                    s = s + *(const v16f_u *)(b + i);
                *(v16f_u *)(yr + i) = rc_gelu_tanh16(s);
            }
        else
            for (; i + 16 <= d; i += 16) {
                v16f s = *(const v16f_u *)(xr + i);
                if (b)
                    s = s + *(const v16f_u *)(b + i);
                *(v16f_u *)(yr + i) = rc_gelu16(s);
            }
        for (; i + 8 <= d; i += 8) {
            v8f s = v8_load(xr + i);
            if (b)
                s = s + v8_load(b + i);
            v8_store(yr + i, rc_gelu_any8(s, tanh_form));
        }
        if (i < d) { /* the row's tail through a scratch vector */
            const Py_ssize_t k = d - i;
            for (Py_ssize_t j = 0; j < 8; j++) {
                tx[j] = j < k ? xr[i + j] : 0.0f;
                tb[j] = b && j < k ? b[i + j] : 0.0f;
            }
            v8f v = rc_gelu_any8(v8_load(tx) + v8_load(tb), tanh_form);
            v8_store(tx, v);
            for (Py_ssize_t j = 0; j < k; j++)
                yr[i + j] = tx[j];
        }
    }
}

typedef struct {
    const float *x, *b;
    float *y;
    Py_ssize_t rows, d;
    int tanh_form;
} gelu_job;

static void gelu_part(void *arg, int part, int parts)
{
    const gelu_job *j = (const gelu_job *)arg;
    const Py_ssize_t r0 = j->rows * part / parts, r1 = j->rows * (part + 1) / parts;
    gelu_rows(j->x + r0 * j->d, j->b, j->y + r0 * j->d, r1 - r0, j->d, j->tanh_form);
}

/* the parts of a row kernel of n elements, flops_per an element, over up to *threads threads
   (a row a unit: every part's rows are computed as one thread computes them, the same bits) */
static int rows_parts(Py_ssize_t rows, Py_ssize_t n, double flops_per, int *threads)
{
    if (*threads < 1)
        *threads = 1;
    return rows ? rc_parts(flops_per * (double)n, 2.5e5, rows, threads) : 0;
}

PyObject *rc_py_gelu_erf(PyObject *self, PyObject *args)
{
    PyObject *xo, *bo, *yo;
    Py_ssize_t rows, d;
    int tanh_form = 0, threads = 1;
    if (!PyArg_ParseTuple(args, "OOO(nn)|pi:gelu_erf", &xo, &bo, &yo, &rows, &d, &tanh_form, &threads))
        return NULL;
    if (rows < 0 || d < 0) {
        PyErr_SetString(PyExc_ValueError, "gelu_erf: negative size");
        return NULL;
    }
    rc_sz sz = {NULL};
    const Py_ssize_t n = sz_mul(&sz, "X's size", rows, d);
    sz_add(&sz, "a row", d, 8); /* a row's last vector */
    if (sz_check(&sz, "gelu_erf", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[3]; /* X, B, Y */
    const rc_buf spec[3] = {{xo, n, RC_F32, 0, 0, "X"}, {bo, d, RC_F32, 0, 1, "B"},
                            {yo, n, RC_F32, 1, 0, "Y"}};
    if (get_buffers("gelu_erf", spec, v, 3) < 0)
        return NULL;
    gelu_job j = {(const float *)v[0].buf, (const float *)v[1].buf, (float *)v[2].buf, rows, d, tanh_form};
    const int parts = rows_parts(rows, n, 24.0, &threads);
    Py_BEGIN_ALLOW_THREADS
    if (parts)
        rc_parallel(gelu_part, &j, parts, threads);
    Py_END_ALLOW_THREADS
    release_buffers(v, 3);
    Py_RETURN_NONE;
}

/* activate: a convolution's activation in one pass, in place or into y (numpy needs 3-4
 * passes and a temporary): kind 0 HardSwish, 1 HardSigmoid (alpha, beta), 2 Sigmoid, 3 SiLU
 * (x * sigmoid(x)). NaN stays NaN. */
RC_CLONES
static void act_run(const float *x, float *y, Py_ssize_t n, int kind, float alpha, float beta)
{
    const rc_act a = {kind + 1, alpha, beta}; /* rc_act8's numbering: activate's kind + 1 */
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        v8_store(y + i, rc_act8(v8_load(x + i), &a));
    if (i < n) {
        float t[8];
        for (Py_ssize_t j = 0; j < 8; j++)
            t[j] = i + j < n ? x[i + j] : 0.0f;
        v8_store(t, rc_act8(v8_load(t), &a));
        for (Py_ssize_t j = 0; i + j < n; j++)
            y[i + j] = t[j];
    }
}

/* act_block: a's activation of M rows of P floats, ld apart, in place (none for act 0) */
void act_block(float *y, Py_ssize_t ld, Py_ssize_t M, Py_ssize_t P, const rc_act *a)
{
    if (!a || !a->act)
        return;
    for (Py_ssize_t m = 0; m < M; m++)
        act_run(y + m * ld, y + m * ld, P, a->act - 1, a->alpha, a->beta);
}

PyObject *rc_py_activate(PyObject *self, PyObject *args)
{
    PyObject *xo, *yo;
    Py_ssize_t n;
    int kind;
    float alpha = 1.0f / 6.0f, beta = 0.5f;
    if (!PyArg_ParseTuple(args, "OOni|ff:activate", &xo, &yo, &n, &kind, &alpha, &beta))
        return NULL;
    if (n < 0 || kind < 0 || kind > 3) {
        PyErr_SetString(PyExc_ValueError, "activate: negative size or kind not in 0..3");
        return NULL;
    }
    Py_buffer v[2]; /* X, Y */
    const rc_buf spec[2] = {{xo, n, RC_F32, 0, 0, "X"}, {yo, n, RC_F32, 1, 0, "Y"}};
    if (get_buffers("activate", spec, v, 2) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    act_run((const float *)v[0].buf, (float *)v[1].buf, n, kind, alpha, beta);
    Py_END_ALLOW_THREADS
    release_buffers(v, 2);
    Py_RETURN_NONE;
}

/* skip_layer_norm: onnxruntime's SkipLayerNormalization in float32, one pass a row: the sum
 * x + skip (+ bias) is written to y (or to the sum output when it is wanted), its mean and
 * variance from 16 float running sums added in double, then y = (s - mean) / sqrt(var + eps) * gamma (+ beta). numpy
 * needed ~9 passes over the activations. skip may
 * hold fewer rows than x (a rank-3 skip of batch 1): row r reads skip row r % skip_rows. y
 * may be x or skip (each element is read before it is written). rms: the RMSNorm variant
 * (SkipSimplifiedLayerNormalization): no centering, the mean output written as 0 (as onnxruntime). */
RC_CLONES
static void sln_rows(const float *x, const float *skip, const float *restrict gamma,
                     const float *restrict beta, const float *restrict bias, float *y,
                     float *restrict mean_out, float *restrict inv_out, float *sum_out,
                     Py_ssize_t rows, Py_ssize_t d, Py_ssize_t skip_rows, float eps, int rms)
{
    for (Py_ssize_t r = 0; r < rows; r++) {
        const float *xr = x + r * d, *sr = skip ? skip + (r % skip_rows) * d : NULL;
        float *s = sum_out ? sum_out + r * d : y + r * d;
        float *yr = y + r * d;
        /* 16 running sums a pass (vectorizable without reassociating one sum), added in
           double at the end */
        float part[16] = {0}, partq[16] = {0};
        Py_ssize_t i = 0;
        if (bias && sr) {
            for (; i + 16 <= d; i += 16)
                for (int k = 0; k < 16; k++) {
                    const float v = xr[i + k] + sr[i + k] + bias[i + k];
                    s[i + k] = v;
                    part[k] += v;
                }
        } else if (sr) {
            for (; i + 16 <= d; i += 16)
                for (int k = 0; k < 16; k++) {
                    const float v = xr[i + k] + sr[i + k];
                    s[i + k] = v;
                    part[k] += v;
                }
        } else if (bias) {
            for (; i + 16 <= d; i += 16)
                for (int k = 0; k < 16; k++) {
                    const float v = xr[i + k] + bias[i + k];
                    s[i + k] = v;
                    part[k] += v;
                }
        } else {
            /* plain LayerNormalization: the sums are x itself (s is y; x is read first) */
            for (; i + 16 <= d; i += 16)
                for (int k = 0; k < 16; k++) {
                    const float v = xr[i + k];
                    s[i + k] = v;
                    part[k] += v;
                }
        }
        double acc = 0.0;
        for (; i < d; i++) {
            const float v = xr[i] + (sr ? sr[i] : 0.0f) + (bias ? bias[i] : 0.0f);
            s[i] = v;
            acc += v;
        }
        for (int k = 0; k < 16; k++)
            acc += part[k];
        const float mean = rms ? 0.0f : (float)(acc / (double)d);
        for (i = 0; i + 16 <= d; i += 16)
            for (int k = 0; k < 16; k++) {
                const float dv = s[i + k] - mean;
                partq[k] += dv * dv;
            }
        double sq = 0.0;
        for (; i < d; i++) {
            const float dv = s[i] - mean;
            sq += (double)dv * dv;
        }
        for (int k = 0; k < 16; k++)
            sq += partq[k];
        const float inv = (float)(1.0 / sqrt(sq / (double)d + (double)eps));
        if (beta) {
            for (i = 0; i < d; i++)
                yr[i] = (s[i] - mean) * inv * gamma[i] + beta[i];
        } else {
            for (i = 0; i < d; i++)
                yr[i] = (s[i] - mean) * inv * gamma[i];
        }
        if (mean_out)
            mean_out[r] = mean;
        if (inv_out)
            inv_out[r] = inv;
    }
}

typedef struct {
    const float *x, *skip, *gamma, *beta, *bias;
    float *y, *mean, *inv, *sum;
    Py_ssize_t rows, d, skip_rows;
    float eps;
    int rms;
} sln_job;

static void sln_part(void *arg, int part, int parts)
{
    const sln_job *j = (const sln_job *)arg;
    const Py_ssize_t r0 = j->rows * part / parts, r1 = j->rows * (part + 1) / parts, d = j->d;
    if (r0 >= r1)
        return;
    /* skip row r % skip_rows: a part's first row r0 starts the skip at r0 % skip_rows, so the
       part passes skip rows from there (sln_rows reads (r - r0) % skip_rows of what it gets):
       where that would be off, the part runs in pieces that each start a skip period */
    Py_ssize_t r = r0;
    while (r < r1) {
        const Py_ssize_t off = j->skip ? r % j->skip_rows : 0;
        Py_ssize_t e = j->skip && off ? r - off + j->skip_rows : r1;
        if (e > r1)
            e = r1;
        sln_rows(j->x + r * d, j->skip ? j->skip + off * d : NULL, j->gamma, j->beta, j->bias, j->y + r * d,
                 j->mean ? j->mean + r : NULL, j->inv ? j->inv + r : NULL, j->sum ? j->sum + r * d : NULL,
                 e - r, d, off ? e - r : j->skip_rows, j->eps, j->rms);
        r = e;
    }
}

PyObject *rc_py_skip_layer_norm(PyObject *self, PyObject *args)
{
    PyObject *xo, *so, *go, *bo, *bio, *yo, *mo, *io, *sumo;
    Py_ssize_t rows, d, skip_rows;
    float eps;
    int rms = 0, threads = 1;
    if (!PyArg_ParseTuple(args, "OOOOOOOOO(nnn)f|pi:skip_layer_norm", &xo, &so, &go, &bo, &bio, &yo, &mo,
                          &io, &sumo, &rows, &d, &skip_rows, &eps, &rms, &threads))
        return NULL;
    if (rows < 0 || d < 1 || skip_rows < 1 || (rows > 0 && rows % skip_rows != 0)) {
        PyErr_SetString(PyExc_ValueError,
                        "skip_layer_norm: rows must be a multiple of skip_rows, d and skip_rows >= 1");
        return NULL;
    }
    rc_sz sz = {NULL};
    const Py_ssize_t n = sz_mul(&sz, "X's size", rows, d), sn = sz_mul(&sz, "skip's size", skip_rows, d);
    sz_add(&sz, "a row", d, 16); /* a row's last block */
    if (sz_check(&sz, "skip_layer_norm", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[9]; /* X, skip, gamma, beta, bias, Y, mean, inv_std_var, sum */
    const rc_buf spec[9] = {{xo, n, RC_F32, 0, 0, "X"}, {so, sn, RC_F32, 0, 1, "skip"},
                            {go, d, RC_F32, 0, 0, "gamma"}, {bo, d, RC_F32, 0, 1, "beta"},
                            {bio, d, RC_F32, 0, 1, "bias"}, {yo, n, RC_F32, 1, 0, "Y"},
                            {mo, rows, RC_F32, 1, 1, "mean"}, {io, rows, RC_F32, 1, 1, "inv_std_var"},
                            {sumo, n, RC_F32, 1, 1, "sum"}};
    if (get_buffers("skip_layer_norm", spec, v, 9) < 0)
        return NULL;
    sln_job j = {(const float *)v[0].buf, (const float *)v[1].buf, (const float *)v[2].buf,
                 (const float *)v[3].buf, (const float *)v[4].buf, (float *)v[5].buf, (float *)v[6].buf,
                 (float *)v[7].buf, (float *)v[8].buf, rows, d, skip_rows, eps, rms};
    const int parts = rows_parts(rows, n, 8.0, &threads);
    Py_BEGIN_ALLOW_THREADS
    if (parts)
        rc_parallel(sln_part, &j, parts, threads);
    Py_END_ALLOW_THREADS
    release_buffers(v, 9);
    Py_RETURN_NONE;
}

/* layer_norm_cf: LayerNormalization over the channels of channels-first x [n][d][p] (the
 * last axis of its NHWC transpose, as ConvNeXt exports it), y written [n][p][d]: the
 * transpose never made. LN_CF positions a step, their channel values read side by side
 * (contiguous in x); two passes for the mean and the centred squares, then the normalised
 * rows. Split over blocks of positions on the kernel threads. */
#define LN_CF 64 /* positions a step: 256 contiguous bytes of each channel row */
#define LN_CT 16 /* channels a tile of the transposed write */
typedef struct {
    const float *x, *gamma, *beta;
    float *y, *mean_out, *inv_out;
    Py_ssize_t n, d, p, blocks;
    float eps;
} lncf_job;

static inline __attribute__((always_inline)) void lncf_block(const lncf_job *j, Py_ssize_t img, Py_ssize_t p0,
                                                             Py_ssize_t nk)
{
    const Py_ssize_t d = j->d, P = j->p;
    const float *x = j->x + img * d * P + p0;
    float *y = j->y + (img * P + p0) * d;
    float sum[LN_CF] = {0}, sq[LN_CF] = {0}, mean[LN_CF] = {0}, inv[LN_CF] = {0};
    for (Py_ssize_t c = 0; c < d; c++)
        for (Py_ssize_t k = 0; k < nk; k++)
            sum[k] += x[c * P + k];
    for (Py_ssize_t k = 0; k < nk; k++)
        mean[k] = sum[k] / (float)d;
    for (Py_ssize_t c = 0; c < d; c++)
        for (Py_ssize_t k = 0; k < nk; k++) {
            const float dv = x[c * P + k] - mean[k];
            sq[k] += dv * dv;
        }
    for (Py_ssize_t k = 0; k < nk; k++)
        inv[k] = (float)(1.0 / sqrt((double)sq[k] / (double)d + (double)j->eps));
    /* LN_CT channels x the positions normalised side by side into t, then written as
       LN_CT-channel runs of each position's row */
    float t[LN_CT][LN_CF];
    Py_ssize_t c0 = 0;
    for (; c0 + LN_CT <= d; c0 += LN_CT) {
        for (int c = 0; c < LN_CT; c++) {
            const float g = j->gamma[c0 + c], bb = j->beta ? j->beta[c0 + c] : 0.0f;
            const float *xc = x + (c0 + c) * P;
            for (int k = 0; k < LN_CF; k++)
                t[c][k] = (xc[k < nk ? k : 0] - mean[k]) * inv[k] * g + bb;
        }
        for (Py_ssize_t k = 0; k < nk; k++)
            for (int c = 0; c < LN_CT; c++)
                y[k * d + c0 + c] = t[c][k];
    }
    for (Py_ssize_t k = 0; k < nk; k++)
        for (Py_ssize_t c = c0; c < d; c++)
            y[k * d + c] = (x[c * P + k] - mean[k]) * inv[k] * j->gamma[c] + (j->beta ? j->beta[c] : 0.0f);
    for (Py_ssize_t k = 0; k < nk; k++) {
        if (j->mean_out)
            j->mean_out[img * P + p0 + k] = mean[k];
        if (j->inv_out)
            j->inv_out[img * P + p0 + k] = inv[k];
    }
}

/* whole blocks with the step's width a constant (the loops over it vectorised) */
RC_CLONES
static void lncf_whole(const lncf_job *j, Py_ssize_t img, Py_ssize_t p0)
{
    lncf_block(j, img, p0, LN_CF);
}

RC_CLONES
static void lncf_tail(const lncf_job *j, Py_ssize_t img, Py_ssize_t p0, Py_ssize_t nk)
{
    lncf_block(j, img, p0, nk);
}

static void lncf_part(void *arg, int part, int parts)
{
    const lncf_job *j = (const lncf_job *)arg;
    const Py_ssize_t per = (j->p + LN_CF - 1) / LN_CF, all = j->n * per;
    for (Py_ssize_t u = all * part / parts; u < all * (part + 1) / parts; u++) {
        const Py_ssize_t img = u / per, p0 = (u - img * per) * LN_CF;
        if (j->p - p0 >= LN_CF)
            lncf_whole(j, img, p0);
        else
            lncf_tail(j, img, p0, j->p - p0);
    }
}

PyObject *rc_py_layer_norm_cf(PyObject *self, PyObject *args)
{
    PyObject *xo, *go, *bo, *yo, *mo, *io;
    Py_ssize_t n, d, p;
    float eps;
    int threads;
    if (!PyArg_ParseTuple(args, "OOOOOO(nnn)fi:layer_norm_cf", &xo, &go, &bo, &yo, &mo, &io, &n, &d, &p, &eps,
                          &threads))
        return NULL;
    if (n < 0 || d < 1 || p < 0) {
        PyErr_SetString(PyExc_ValueError, "layer_norm_cf: n and p must be >= 0, d >= 1");
        return NULL;
    }
    rc_sz sz = {NULL};
    const Py_ssize_t np_ = sz_mul(&sz, "the positions", n, p), all = sz_mul(&sz, "X's size", np_, d);
    if (sz_check(&sz, "layer_norm_cf", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[6]; /* X, gamma, beta, Y, mean, inv_std_var */
    const rc_buf spec[6] = {{xo, all, RC_F32, 0, 0, "X"}, {go, d, RC_F32, 0, 0, "gamma"},
                            {bo, d, RC_F32, 0, 1, "beta"}, {yo, all, RC_F32, 1, 0, "Y"},
                            {mo, np_, RC_F32, 1, 1, "mean"}, {io, np_, RC_F32, 1, 1, "inv_std_var"}};
    if (get_buffers("layer_norm_cf", spec, v, 6) < 0)
        return NULL;
    if (v[0].buf == v[3].buf && all > 0) {
        release_buffers(v, 6);
        PyErr_SetString(PyExc_ValueError, "layer_norm_cf: Y must not be X");
        return NULL;
    }
    lncf_job j = {(const float *)v[0].buf, (const float *)v[1].buf, (const float *)v[2].buf,
                  (float *)v[3].buf, (float *)v[4].buf, (float *)v[5].buf, n, d, p, 0, eps};
    const Py_ssize_t units = n * ((p + LN_CF - 1) / LN_CF);
    int th = threads < 1 ? 1 : threads;
    const int parts = units ? rc_parts(4.0 * (double)all, 2.5e5, units, &th) : 0;
    Py_BEGIN_ALLOW_THREADS
    if (parts)
        rc_parallel(lncf_part, &j, parts, th);
    Py_END_ALLOW_THREADS
    release_buffers(v, 6);
    Py_RETURN_NONE;
}

/* exp(d) for the softmax's d = z - max <= 0 (NaN stays NaN), 16 lanes: RC_VMATH's exp without
 * its upper clamp (never reached here) and with the lower one folded into the select to exactly
 * 0 below exp's float range (d < -87.3) that the caller needs anyway */
RC_INLINE v16f sm_exp16(v16f d)
{
    const v16f lo = cv_bcast(-87.3f), magic = cv_bcast(12582912.0f), zero = cv_bcast(0.0f);
    const v16i under = d < lo;
    const v16f x = v16_select(under, lo, d);
    const v16f n = (x * 1.44269504088896341f + magic) - magic; /* round to nearest */
    v16f r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    v16f p = cv_bcast(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const v16i e = (__builtin_convertvector(n, v16i) + 127) << 23;
    return v16_select(under, zero, p * (v16f)e);
}

RC_INLINE v16f sm_load16(const float *p) { return *(const v16f_u *)p; }
RC_INLINE void sm_store16(float *p, v16f v) { *(v16f_u *)p = v; }

/* exp(z - m) of a row of t floats in place: 16 running sums in *acc, the tail (t % 16 values,
 * on a padded copy of 16 lanes) summed in order and returned (softmax_rows and
 * softmax_exp_row reduce the two as they did) */
RC_INLINE float sm_exp_pass(float *zr, Py_ssize_t t, float m, v16f *acc)
{
    const v16f mv = cv_bcast(m);
    v16f a = cv_bcast(0.0f);
    Py_ssize_t i = 0;
    for (; i + 16 <= t; i += 16) {
        const v16f e = sm_exp16(sm_load16(zr + i) - mv);
        sm_store16(zr + i, e);
        a += e;
    }
    float sum = 0.0f;
    if (i < t) {
        float tail[16];
        const Py_ssize_t k = t - i;
        for (Py_ssize_t j = 0; j < 16; j++)
            tail[j] = j < k ? zr[i + j] - m : -INFINITY;
        sm_store16(tail, sm_exp16(sm_load16(tail)));
        for (Py_ssize_t j = 0; j < k; j++) {
            zr[i + j] = tail[j];
            sum += tail[j];
        }
    }
    *acc = a;
    return sum;
}

/* softmax_rows: the softmax of every row of z in place, the numpy path's arithmetic
 * (ops/fused._softmax_inplace) in three passes a row, 16 lanes wide (one AVX-512 register in
 * the x86-64-v4 clone, two AVX ones in -v3): the row maximum (0 where it is not finite), exp
 * of the differences (exactly 0 below exp's float range, as numpy's exp gives) stored with
 * their sum from 16 running sums, one multiply by its reciprocal (numpy took ~7 passes and a
 * BLAS call for the sums). The tail of a row runs on a padded copy of 16 lanes. */
RC_CLONES
static void softmax_rows_ex(float *z, Py_ssize_t rows, Py_ssize_t t, int inf_nan)
{
    for (Py_ssize_t r = 0; r < rows; r++) {
        float *zr = z + r * t;
        /* the maximum in 16 lanes (NaN never wins a comparison: a NaN row stays NaN through
           its exp and sum, as in numpy) */
        v16f mx = cv_bcast(-INFINITY);
        Py_ssize_t i0 = 0;
        for (; i0 + 16 <= t; i0 += 16) {
            const v16f x = sm_load16(zr + i0);
            mx = v16_select(x > mx, x, mx);
        }
        float m = -INFINITY;
        for (int j = 0; j < 16; j++)
            m = mx[j] > m ? mx[j] : m;
        for (; i0 < t; i0++)
            m = zr[i0] > m ? zr[i0] : m;
        if (inf_nan && m == INFINITY) {
            /* the Softmax op's numpy arithmetic (and onnxruntime): inf - inf makes the row NaN */
            for (Py_ssize_t k = 0; k < t; k++)
                zr[k] = NAN;
            continue;
        }
        if (!(m > -INFINITY && m < INFINITY))
            m = 0.0f;
        v16f acc;
        float sum = sm_exp_pass(zr, t, m, &acc);
        for (int j = 0; j < 16; j++)
            sum += acc[j];
        const float inv = 1.0f / sum;
        const v16f iv = cv_bcast(inv);
        Py_ssize_t i;
        for (i = 0; i + 16 <= t; i += 16)
            sm_store16(zr + i, sm_load16(zr + i) * iv);
        for (; i < t; i++)
            zr[i] *= inv;
    }
}

void softmax_rows(float *z, Py_ssize_t rows, Py_ssize_t t)
{
    softmax_rows_ex(z, rows, t, 0);
}

/* the largest and the sum of 16 lanes by halving (a short row's 16 scalar steps were most of
   its time), NaN lanes lose every comparison as in the scalar loop */
RC_INLINE float sm_hmax16(v16f v)
{
    const v8f a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
    const v8f b = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    const v8f c = v8_select(a > b, a, b);
    const v8f d = v8_select(c > __builtin_shufflevector(c, c, 4, 5, 6, 7, 0, 1, 2, 3), c,
                            __builtin_shufflevector(c, c, 4, 5, 6, 7, 0, 1, 2, 3));
    const float g = d[0] > d[1] ? d[0] : d[1], h = d[2] > d[3] ? d[2] : d[3];
    return g > h ? g : h;
}

RC_INLINE float sm_hsum16(v16f v)
{
    const v8f c = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                  __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    const v8f d = c + __builtin_shufflevector(c, c, 4, 5, 6, 7, 0, 1, 2, 3);
    return (d[0] + d[2]) + (d[1] + d[3]);
}

/* softmax_exp_row: exp(z - max) of one row of t floats in place (softmax_rows's first two
 * passes, its arithmetic) and 1 / their sum, for a caller that scales what it sums the
 * probabilities into (mha's tiles: a head's dv outputs a row instead of its t probabilities) */
RC_CLONES
static float softmax_exp_row_ex(float *zr, Py_ssize_t t)
{
    v16f mx = cv_bcast(-INFINITY);
    Py_ssize_t i = 0;
    for (; i + 16 <= t; i += 16) {
        const v16f x = sm_load16(zr + i);
        mx = v16_select(x > mx, x, mx);
    }
    float m = sm_hmax16(mx);
    for (; i < t; i++)
        m = zr[i] > m ? zr[i] : m;
    if (!(m > -INFINITY && m < INFINITY))
        m = 0.0f;
    v16f acc;
    const float sum = sm_exp_pass(zr, t, m, &acc);
    return 1.0f / (sum + sm_hsum16(acc));
}

float softmax_exp_row(float *zr, Py_ssize_t t)
{
    return softmax_exp_row_ex(zr, t);
}

/* softmax_exp_row for a row with room for t rounded up to 16 floats (mha's tiles: rows Sp apart,
 * their scores computed to a multiple of 32): the last t % 16 values as one more vector, the
 * lanes past t read as -inf (exp 0) and written back as zeros, summed with the others in the 16
 * running sums (a short row's padded scalar tail was a quarter of its time) */
RC_CLONES
static float softmax_exp_row_pad_ex(float *zr, Py_ssize_t t)
{
    const v16i lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const v16f ninf = cv_bcast(-INFINITY);
    const Py_ssize_t tf = t / 16 * 16;
    const v16i keep = lane < (int)(t - tf);
    v16f mx = ninf;
    for (Py_ssize_t i = 0; i < tf; i += 16) {
        const v16f x = sm_load16(zr + i);
        mx = v16_select(x > mx, x, mx);
    }
    const v16f xt = tf < t ? v16_select(keep, sm_load16(zr + tf), ninf) : ninf;
    mx = v16_select(xt > mx, xt, mx);
    float m = sm_hmax16(mx);
    if (!(m > -INFINITY && m < INFINITY))
        m = 0.0f;
    const v16f mv = cv_bcast(m);
    v16f a = cv_bcast(0.0f);
    for (Py_ssize_t i = 0; i < tf; i += 16) {
        const v16f e = sm_exp16(sm_load16(zr + i) - mv);
        sm_store16(zr + i, e);
        a += e;
    }
    if (tf < t) {
        const v16f e = sm_exp16(xt - mv);
        sm_store16(zr + tf, e);
        a += e;
    }
    return 1.0f / sm_hsum16(a);
}

float softmax_exp_row_pad(float *zr, Py_ssize_t t)
{
    return softmax_exp_row_pad_ex(zr, t);
}

typedef struct {
    float *z;
    Py_ssize_t rows, t;
    int inf_nan;
} softmax_job;

static void softmax_part(void *arg, int part, int parts)
{
    const softmax_job *j = (const softmax_job *)arg;
    const Py_ssize_t r0 = j->rows * part / parts, r1 = j->rows * (part + 1) / parts;
    softmax_rows_ex(j->z + r0 * j->t, r1 - r0, j->t, j->inf_nan);
}

PyObject *rc_py_softmax(PyObject *self, PyObject *args)
{
    PyObject *zo;
    Py_ssize_t rows, t;
    int inf_nan = 0, threads = 1;
    if (!PyArg_ParseTuple(args, "O(nn)|ii:softmax", &zo, &rows, &t, &inf_nan, &threads))
        return NULL;
    if (rows < 0 || t < 1) {
        PyErr_SetString(PyExc_ValueError, "softmax: negative size or empty rows");
        return NULL;
    }
    rc_sz sz = {NULL};
    const Py_ssize_t n = sz_mul(&sz, "Z's size", rows, t);
    sz_add(&sz, "a row", t, 8); /* a row's last vector */
    if (sz_check(&sz, "softmax", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[1];
    const rc_buf spec[1] = {{zo, n, RC_F32, 1, 0, "Z"}};
    if (get_buffers("softmax", spec, v, 1) < 0)
        return NULL;
    softmax_job j = {(float *)v[0].buf, rows, t, inf_nan};
    int th = threads < 1 ? 1 : threads;
    const int parts = rows ? rc_parts(8.0 * (double)n, 2.5e5, rows, &th) : 0;
    Py_BEGIN_ALLOW_THREADS
    if (parts)
        rc_parallel(softmax_part, &j, parts, th);
    Py_END_ALLOW_THREADS
    release_buffers(v, 1);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------------- */
/* squeeze_excite: y = x * gate(W2 act(clip(W1 mean_hw(x) + B1)) + B2), the SE block as one */
/* call in three passes over the kernel threads: the means split by channel rows, h by W1's */
/* rows, then each channel's gate (its W2 row) and gated product in one pass by channels    */
/* ------------------------------------------------------------------------------------- */

/* the bytes a pass streams for each thread it runs on, at least: at L2's pace about the time of the
   2.5e5 flops a thread the other kernels ask for */
#define SE_MIN_BYTES 65536.0

typedef struct {
    const float *x, *w1, *b1, *w2, *b2;
    float *y, *s, *h, *g; /* s: the means [N][C], h [N][CR], g: the gates [N][C] */
    Py_ssize_t N, C, CR, HW;
    int phase;            /* 0 means, 1 h, 2 the gates and the gated product */
    rc_act gate;
} se_job;

RC_CLONES
static float se_dot(const float *a, const float *b, Py_ssize_t n)
{
    v8f s0 = {0}, s1 = {0};
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 += v8_load(a + i) * v8_load(b + i);
        s1 += v8_load(a + i + 8) * v8_load(b + i + 8);
    }
    s0 += s1;
    float r = 0.0f;
    for (int k = 0; k < 8; k++)
        r += s0[k];
    for (; i < n; i++)
        r += a[i] * b[i];
    return r;
}

/* se_dot of four rows of w (n apart) with b at once (each row's sums as se_dot's, the same
   bits; the loads of b shared and eight sums in flight instead of two) into r[0..3] */
RC_CLONES
static void se_dot4(const float *a, const float *b, Py_ssize_t n, float *r)
{
    v8f s0[4] = {{0}, {0}, {0}, {0}}, s1[4] = {{0}, {0}, {0}, {0}};
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const v8f u = v8_load(b + i), v = v8_load(b + i + 8);
        for (int q = 0; q < 4; q++) {
            s0[q] += v8_load(a + q * n + i) * u;
            s1[q] += v8_load(a + q * n + i + 8) * v;
        }
    }
    for (int q = 0; q < 4; q++) {
        const v8f t = s0[q] + s1[q];
        float acc = 0.0f;
        for (int k = 0; k < 8; k++)
            acc += t[k];
        for (Py_ssize_t e = i; e < n; e++)
            acc += a[q * n + e] * b[e];
        r[q] = acc;
    }
}

/* out[m][i] = w[i] . in[m] + bias[i] for rows i in [i0, i1) of w ([rows][k]) and the N vectors of in */
static void se_matvec(const float *w, const float *bias, const float *in, float *out, Py_ssize_t i0,
                      Py_ssize_t i1, Py_ssize_t rows, Py_ssize_t k, Py_ssize_t N)
{
    float r[4];
    Py_ssize_t i = i0;
    for (; i + 4 <= i1; i += 4)
        for (Py_ssize_t m = 0; m < N; m++) {
            se_dot4(w + i * k, in + m * k, k, r);
            for (int q = 0; q < 4; q++)
                out[m * rows + i + q] = r[q] + (bias ? bias[i + q] : 0.0f);
        }
    for (; i < i1; i++)
        for (Py_ssize_t m = 0; m < N; m++)
            out[m * rows + i] = se_dot(w + i * k, in + m * k, k) + (bias ? bias[i] : 0.0f);
}

/* the gates of channels [c0, c1) of every image, then those channels' rows of y */
RC_CLONES
static void se_gated(const se_job *j, Py_ssize_t c0, Py_ssize_t c1)
{
    const Py_ssize_t C = j->C, HW = j->HW;
    se_matvec(j->w2, j->b2, j->h, j->g, c0, c1, C, j->CR, j->N);
    for (Py_ssize_t m = 0; m < j->N; m++) {
        act_block(j->g + m * C + c0, 0, 1, c1 - c0, &j->gate);
        for (Py_ssize_t c = c0; c < c1; c++) {
            const Py_ssize_t r = m * C + c;
            const float gv = j->g[r];
            const float *xr = j->x + r * HW;
            float *yr = j->y + r * HW;
            Py_ssize_t i = 0;
            for (; i + 8 <= HW; i += 8)
                v8_store(yr + i, v8_load(xr + i) * gv);
            for (; i < HW; i++)
                yr[i] = xr[i] * gv;
        }
    }
}

/* where part p of parts begins among n weight rows: a multiple of 4 (se_dot4's rows) but the end */
static Py_ssize_t se_cut(Py_ssize_t n, int p, int parts)
{
    return p >= parts ? n : (n / 4) * p / parts * 4;
}

static void se_part(void *arg, int part, int parts)
{
    const se_job *j = (const se_job *)arg;
    if (j->phase == 0) {
        const Py_ssize_t n = j->N * j->C;
        rc_row_means(j->x, j->s, n * part / parts, n * (part + 1) / parts, j->HW);
    } else if (j->phase == 1) {
        /* h[n][i] = W1[i] . s[n] + B1[i] */
        se_matvec(j->w1, j->b1, j->s, j->h, se_cut(j->CR, part, parts), se_cut(j->CR, part + 1, parts), j->CR,
                  j->C, j->N);
    } else {
        se_gated(j, se_cut(j->C, part, parts), se_cut(j->C, part + 1, parts));
    }
}

/* j's phase on the threads its bytes pay for (rc_parts lowers th before rc_parallel reads it:
   as one call's two arguments the order was the compiler's, and it passed the threads asked) */
static void se_pass(se_job *j, double bytes, Py_ssize_t units, int threads)
{
    int th = threads;
    const int parts = rc_parts(bytes, SE_MIN_BYTES, units, &th);
    rc_parallel(se_part, j, parts, th);
}

PyObject *rc_py_squeeze_excite(PyObject *self, PyObject *args)
{
    PyObject *xo, *w1o, *b1o, *w2o, *b2o, *yo;
    Py_ssize_t N, C, CR, HW;
    float lo, hi;
    rc_act act = {-1, 1.0f / 6.0f, 0.5f}, gate = {-1, 1.0f / 6.0f, 0.5f};
    int threads;
    if (!PyArg_ParseTuple(args, "OOOOOO(nnnn)ffiffiffi:squeeze_excite", &xo, &w1o, &b1o, &w2o, &b2o, &yo, &N, &C,
                          &CR, &HW, &lo, &hi, &act.act, &act.alpha, &act.beta, &gate.act, &gate.alpha, &gate.beta,
                          &threads))
        return NULL;
    if (N < 1 || C < 1 || CR < 1 || HW < 1) {
        PyErr_SetString(PyExc_ValueError, "squeeze_excite: sizes must be positive");
        return NULL;
    }
    if (act.act < -1 || act.act > 3 || gate.act < -1 || gate.act > 3) {
        PyErr_SetString(PyExc_ValueError, "squeeze_excite: activation kind not in -1..3");
        return NULL;
    }
    act.act += 1; /* activate's kind -> rc_act's */
    gate.act += 1;
    rc_sz sz = {NULL};
    const Py_ssize_t xn = sz_mul3(&sz, "X's size", N, C, HW), w1n = sz_mul(&sz, "W1's size", CR, C);
    const Py_ssize_t sn = sz_add(&sz, "the scratch", sz_mul(&sz, "the scratch", 2 * N, C), sz_mul(&sz, "the scratch", N, CR));
    if (sz_check(&sz, "squeeze_excite", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[6];
    const rc_buf spec[6] = {{xo, xn, RC_F32, 0, 0, "X"}, {w1o, w1n, RC_F32, 0, 0, "W1"},
                            {b1o, CR, RC_F32, 0, 1, "B1"}, {w2o, w1n, RC_F32, 0, 0, "W2"},
                            {b2o, C, RC_F32, 0, 1, "B2"}, {yo, xn, RC_F32, 1, 0, "Y"}};
    if (get_buffers("squeeze_excite", spec, v, 6) < 0)
        return NULL;
    float *scratch = (float *)malloc((size_t)sn * sizeof(float));
    if (!scratch) {
        release_buffers(v, 6);
        return PyErr_NoMemory();
    }
    se_job j = {(const float *)v[0].buf, (const float *)v[1].buf, (const float *)v[2].buf, (const float *)v[3].buf,
                (const float *)v[4].buf, (float *)v[5].buf, scratch, scratch + N * C, scratch + N * C + N * CR,
                N, C, CR, HW, 0, gate};
    /* split by the bytes each pass streams (in a model run the weights come from beyond L2; a
       flops count kept a batch-1 block's large passes on one thread) */
    const double x_bytes = 4.0 * (double)N * (double)C * (double)HW, w_bytes = 4.0 * (double)C * (double)CR;
    Py_BEGIN_ALLOW_THREADS
    se_pass(&j, x_bytes, N * C, threads);
    j.phase = 1;
    se_pass(&j, w_bytes, CR / 4 > 0 ? CR / 4 : 1, threads);
    for (Py_ssize_t i = 0; i < N * CR; i++)
        j.h[i] = clipf(j.h[i], lo, hi);
    act_block(j.h, 0, 1, N * CR, &act);
    j.phase = 2;
    se_pass(&j, w_bytes + 2.0 * x_bytes, C / 4 > 0 ? C / 4 : 1, threads);
    Py_END_ALLOW_THREADS
    free(scratch);
    release_buffers(v, 6);
    Py_RETURN_NONE;
}
