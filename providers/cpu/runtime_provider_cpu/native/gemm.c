#include "native.h"

/* ---------------------------------------------------------------------------------------
 * gemm_rows: y[R][N] = a[R][K] @ B for a few rows (a classifier head at batch 1-8), B given
 * as b[N][K] (trans: ONNX Gemm's transB, a PyTorch Linear) or b[K][N], on the kernel
 * threads split over N: BLAS woke its worker threads for this, which then spun on the cores
 * into the next run.
 * --------------------------------------------------------------------------------------- */
typedef struct {
    const float *a, *b;
    float *y;
    Py_ssize_t R, K, N;
    int trans;
} gr_job;

#define GR_NB 4 /* columns of y (rows of b) a step, with trans */
#define GR_NV 4 /* 16-float vectors of y's columns a step, without */

CV_CLONES static void gr_range(const gr_job *j, Py_ssize_t n0, Py_ssize_t n1)
{
    const Py_ssize_t K = j->K, N = j->N, K16 = K & ~(Py_ssize_t)15;
    for (Py_ssize_t r0 = 0; r0 < j->R; r0 += 4) {
        const int rn = j->R - r0 < 4 ? (int)(j->R - r0) : 4;
        const float *a = j->a + r0 * K;
        if (j->trans) {
            for (Py_ssize_t n = n0; n < n1; n += GR_NB) {
                const int nn = n1 - n < GR_NB ? (int)(n1 - n) : GR_NB;
                v16f acc[4][GR_NB];
                for (int r = 0; r < 4; r++)
                    for (int c = 0; c < GR_NB; c++)
                        acc[r][c] = (v16f){0};
                for (Py_ssize_t k = 0; k < K16; k += 16) {
                    v16f bv[GR_NB];
                    for (int c = 0; c < GR_NB; c++)
                        bv[c] = c < nn ? *(const v16f_u *)(j->b + (n + c) * K + k) : (v16f){0};
                    for (int r = 0; r < rn; r++) {
                        const v16f av = *(const v16f_u *)(a + r * K + k);
                        for (int c = 0; c < GR_NB; c++)
                            acc[r][c] += av * bv[c];
                    }
                }
                for (int r = 0; r < rn; r++)
                    for (int c = 0; c < nn; c++) {
                        float t = 0.0f;
                        for (int l = 0; l < 16; l++)
                            t += acc[r][c][l];
                        for (Py_ssize_t k = K16; k < K; k++)
                            t += a[r * K + k] * j->b[(n + c) * K + k];
                        j->y[(r0 + r) * N + n + c] = t;
                    }
            }
        } else {
            for (Py_ssize_t n = n0; n < n1; n += 16 * GR_NV) {
                if (n + 16 * GR_NV > n1) { /* a short last step: scalar */
                    for (int r = 0; r < rn; r++)
                        for (Py_ssize_t c = n; c < n1; c++) {
                            float t = 0.0f;
                            for (Py_ssize_t k = 0; k < K; k++)
                                t += a[r * K + k] * j->b[k * N + c];
                            j->y[(r0 + r) * N + c] = t;
                        }
                    break;
                }
                v16f acc[4][GR_NV];
                for (int r = 0; r < 4; r++)
                    for (int v = 0; v < GR_NV; v++)
                        acc[r][v] = (v16f){0};
                for (Py_ssize_t k = 0; k < K; k++) {
                    v16f bv[GR_NV];
                    for (int v = 0; v < GR_NV; v++)
                        bv[v] = *(const v16f_u *)(j->b + k * N + n + 16 * v);
                    for (int r = 0; r < rn; r++) {
                        const v16f av = cv_bcast(a[r * K + k]);
                        for (int v = 0; v < GR_NV; v++)
                            acc[r][v] += av * bv[v];
                    }
                }
                for (int r = 0; r < rn; r++)
                    for (int v = 0; v < GR_NV; v++)
                        *(v16f_u *)(j->y + (r0 + r) * N + n + 16 * v) = acc[r][v];
            }
        }
    }
}

static void gr_part(void *arg, int part, int parts)
{
    const gr_job *j = (const gr_job *)arg;
    /* whole steps of columns a part */
    const Py_ssize_t step = j->trans ? GR_NB : 16 * GR_NV, steps = (j->N + step - 1) / step;
    Py_ssize_t n0 = steps * part / parts * step, n1 = steps * (part + 1) / parts * step;
    gr_range(j, n0, n1 < j->N ? n1 : j->N);
}

PyObject *rc_py_gemm_rows(PyObject *self, PyObject *args)
{
    PyObject *ao, *bo, *yo;
    Py_ssize_t R, K, N;
    int trans, threads;
    if (!PyArg_ParseTuple(args, "OOO(nnn)pi:gemm_rows", &ao, &bo, &yo, &R, &K, &N, &trans, &threads))
        return NULL;
    if (R < 1 || K < 1 || N < 1) {
        PyErr_SetString(PyExc_ValueError, "gemm_rows: zero or negative size");
        return NULL;
    }
    rc_sz sz = {NULL};
    const Py_ssize_t an = sz_mul(&sz, "A's size", R, K), bn = sz_mul(&sz, "B's size", K, N);
    const Py_ssize_t yn = sz_mul(&sz, "Y's size", R, N);
    sz_add(&sz, "B's size", N, 16 * GR_NV); /* a step of columns past N */
    if (sz_check(&sz, "gemm_rows", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[3];
    const rc_buf spec[3] = {{ao, an, RC_F32, 0, 0, "A"}, {bo, bn, RC_F32, 0, 0, "B"},
                            {yo, yn, RC_F32, 1, 0, "Y"}};
    if (get_buffers("gemm_rows", spec, v, 3) < 0)
        return NULL;
    gr_job j = {(const float *)v[0].buf, (const float *)v[1].buf, (float *)v[2].buf, R, K, N, trans};
    const Py_ssize_t step = trans ? GR_NB : 16 * GR_NV;
    /* a thread from about 64K multiply-adds (the weights stream from memory) */
    const int parts = rc_parts((double)R * (double)K * (double)N, 65536.0, (N + step - 1) / step, &threads);
    Py_BEGIN_ALLOW_THREADS
    rc_parallel(gr_part, &j, parts, threads);
    Py_END_ALLOW_THREADS
    release_buffers(v, 3);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------
 * pointwise: a 1x1 stride-1 convolution of one image, y[M][P] = w[M][K] @ x[K][P], then bias,
 * residual and clip, as column (or row) blocks of y split between the kernel threads, each
 * block one single-threaded BLAS sgemm (SciPy's, from scipy.linalg.cython_blas: set_sgemm)
 * and its epilogue while the block is in cache: OpenBLAS's own threads spun on the cores the
 * nodes between two GEMMs wanted, and the epilogue was a second pass over y.
 * --------------------------------------------------------------------------------------- */

typedef struct {
    const float *w, *x, *b, *z;
    float *y;
    Py_ssize_t M, K, P, step;
    float lo, hi;
    int by_cols;    /* parts of columns of y (else of rows) */
} pw_job;

static void pw_epilogue(const pw_job *j, Py_ssize_t m0, Py_ssize_t m1, Py_ssize_t p0, Py_ssize_t p1)
{
    bias_clip_block(j->y + m0 * j->P + p0, j->P, j->b ? j->b + m0 : NULL, j->z ? j->z + m0 * j->P + p0 : NULL,
                    m1 - m0, p1 - p0, j->lo, j->hi);
}

static void pw_part(void *arg, int part, int parts)
{
    const pw_job *j = (const pw_job *)arg;
    const Py_ssize_t n = j->by_cols ? j->P : j->M, units = (n + j->step - 1) / j->step;
    Py_ssize_t a = units * part / parts * j->step, e = units * (part + 1) / parts * j->step;
    if (e > n)
        e = n;
    if (a >= e)
        return;
    /* row-major y = w x is column-major y^T = x^T w^T: x^T is P x K (ld P), w^T K x M (ld K) */
    char nn = 'N';
    float one = 1.0f, zero = 0.0f;
    int K = (int)j->K, ldx = (int)j->P, ldw = (int)j->K, ldy = (int)j->P;
    if (j->by_cols) {
        int pn = (int)(e - a), M = (int)j->M;
        rc_sgemm(&nn, &nn, &pn, &M, &K, &one, (float *)j->x + a, &ldx, (float *)j->w, &ldw, &zero,
                 j->y + a, &ldy);
        pw_epilogue(j, 0, j->M, a, e);
    } else {
        int P = (int)j->P, mn = (int)(e - a);
        rc_sgemm(&nn, &nn, &P, &mn, &K, &one, (float *)j->x, &ldx, (float *)j->w + a * j->K, &ldw,
                 &zero, j->y + a * j->P, &ldy);
        pw_epilogue(j, a, e, 0, j->P);
    }
}

PyObject *rc_py_pointwise(PyObject *self, PyObject *args)
{
    PyObject *wo, *xo, *bo, *zo, *yo;
    Py_ssize_t M, K, P;
    float lo, hi;
    int threads;
    if (!PyArg_ParseTuple(args, "OOOOO(nnn)ffi:pointwise", &wo, &xo, &bo, &zo, &yo, &M, &K, &P, &lo,
                          &hi, &threads))
        return NULL;
    if (!rc_sgemm) {
        PyErr_SetString(PyExc_RuntimeError, "pointwise: no sgemm (set_sgemm was not called)");
        return NULL;
    }
    if (M < 1 || K < 1 || P < 1 || M > INT32_MAX || K > INT32_MAX || P > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "pointwise: sizes must be in [1, 2^31)");
        return NULL;
    }
    rc_sz sz = {NULL}; /* each size < 2^31: their products fit, checked all the same */
    const Py_ssize_t wn = sz_mul(&sz, "W's size", M, K), xn = sz_mul(&sz, "X's size", K, P);
    const Py_ssize_t yn = sz_mul(&sz, "Y's size", M, P);
    if (sz_check(&sz, "pointwise", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[5];
    const rc_buf spec[5] = {{wo, wn, RC_F32, 0, 0, "W"}, {xo, xn, RC_F32, 0, 0, "X"},
                            {bo, M, RC_F32, 0, 1, "B"}, {zo, yn, RC_F32, 0, 1, "Z"},
                            {yo, yn, RC_F32, 1, 0, "Y"}};
    if (get_buffers("pointwise", spec, v, 5) < 0)
        return NULL;
    /* columns of y in blocks of 64 when there are enough of them (an image of 112 x 112),
       else rows in blocks of 16 (a 7 x 7 image of 960 channels) */
    const int by_cols = P >= 128 * (Py_ssize_t)threads || P >= M;
    const Py_ssize_t step = by_cols ? 64 : 16, n = by_cols ? P : M;
    const int parts = rc_parts(2.0 * (double)M * (double)K * (double)P, 2.5e5, (n + step - 1) / step, &threads);
    pw_job j = {(const float *)v[0].buf, (const float *)v[1].buf, (const float *)v[2].buf,
                (const float *)v[3].buf, (float *)v[4].buf, M, K, P, step, lo, hi, by_cols};
    Py_BEGIN_ALLOW_THREADS
    rc_parallel(pw_part, &j, parts, threads);
    Py_END_ALLOW_THREADS
    release_buffers(v, 5);
    Py_RETURN_NONE;
}
