/* sgemm on the kernel thread pool: y = a @ b in float32 as tiles of y, each one call of the
 * single-threaded sgemm set_sgemm took (SciPy's). BLAS's own threads split a call statically
 * and spin between calls: a thread another process or another run holds stalls the whole
 * call, and they compete with the pool for the cores. Tiles are small enough (about 2^29
 * flops) that a stopped run ends within one tile. */
#include "native.h"

#define SG_TILE_FLOPS RC_PART_WORK
#define SG_MAX_PARTS RC_PARTS_FINE_MAX

typedef struct {
    const float *a, *b;
    float *y;
    Py_ssize_t M, K, N;
    int gm, gn; /* tiles down, across */
    int tb;     /* b given as [N][K] (a transposed weight read in place) */
} sg_job;

static void sg_part(void *arg, int part, int parts)
{
    (void)parts;
    const sg_job *j = (const sg_job *)arg;
    const Py_ssize_t i = part / j->gn, c = part % j->gn;
    const Py_ssize_t r0 = j->M * i / j->gm, r1 = j->M * (i + 1) / j->gm;
    /* column edges on 16 floats: whole vectors for the kernel's stores */
    Py_ssize_t c0 = (j->N * c / j->gn + 15) & ~(Py_ssize_t)15, c1 = (j->N * (c + 1) / j->gn + 15) & ~(Py_ssize_t)15;
    if (c0 > j->N)
        c0 = j->N;
    if (c1 > j->N || c == j->gn - 1)
        c1 = j->N;
    if (r1 <= r0 || c1 <= c0)
        return;
    /* row-major y = a b is column-major y^T = b^T a^T: b^T is N x K (ld N), a^T K x M (ld K);
       with tb, b [N][K] is column-major K x N (ld K), read transposed */
    char nn = 'N', tt = j->tb ? 'T' : 'N';
    float one = 1.0f, zero = 0.0f;
    int n = (int)(c1 - c0), m = (int)(r1 - r0), K = (int)j->K, ldb = (int)(j->tb ? j->K : j->N), lda = (int)j->K;
    int ldy = (int)j->N;
    rc_sgemm(&tt, &nn, &n, &m, &K, &one, (float *)j->b + (j->tb ? c0 * j->K : c0), &ldb, (float *)j->a + r0 * j->K,
             &lda, &zero, j->y + r0 * j->N + c0, &ldy);
}

/* sgemm(a, b, y, (M, K, N), threads[, trans_b]): y[M][N] = a[M][K] @ b[K][N] (b given as
   [N][K] with trans_b), C-contiguous float32 */
PyObject *rc_py_sgemm(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *ao, *bo, *yo;
    Py_ssize_t M, K, N;
    int threads, tb = 0;
    if (!PyArg_ParseTuple(args, "OOO(nnn)i|p:sgemm", &ao, &bo, &yo, &M, &K, &N, &threads, &tb))
        return NULL;
    if (!rc_sgemm) {
        PyErr_SetString(PyExc_RuntimeError, "sgemm: no sgemm (set_sgemm was not called)");
        return NULL;
    }
    if (M < 1 || K < 1 || N < 1 || M > INT32_MAX || K > INT32_MAX || N > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "sgemm: sizes must be in [1, 2^31)");
        return NULL;
    }
    rc_sz sz = {NULL};
    const Py_ssize_t an = sz_mul(&sz, "A's size", M, K), bn = sz_mul(&sz, "B's size", K, N);
    const Py_ssize_t yn = sz_mul(&sz, "Y's size", M, N);
    if (sz_check(&sz, "sgemm", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[3];
    const rc_buf spec[3] = {{ao, an, RC_F32, 0, 0, "A"}, {bo, bn, RC_F32, 0, 0, "B"}, {yo, yn, RC_F32, 1, 0, "Y"}};
    if (get_buffers("sgemm", spec, v, 3) < 0)
        return NULL;
    const double flops = 2.0 * (double)M * (double)K * (double)N;
    /* a call its caller runs alone (run_solo, or other processes on every core) is tiled as on one
     * thread: each tile a separate sgemm packing its own panels, a two-thread tiling run alone was
     * 3-20% slower (128 x 768 x 768: 1.20x); the tiles' bits do not depend on the tiling */
    int t = rc_job_threads(threads < 1 ? 1 : threads);
    int want = rc_parts(flops, 2.5e5, SG_MAX_PARTS, &t);
    const double by_size = flops / SG_TILE_FLOPS;
    if (by_size > want)
        want = by_size > SG_MAX_PARTS ? SG_MAX_PARTS : (int)by_size + 1;
    /* halve the longer side (tiles of at least 32 rows, 128 columns) until there are enough */
    int gm = 1, gn = 1;
    while (gm * gn < want) {
        const double rows = (double)M / gm, cols = (double)N / gn;
        if (rows >= cols && rows >= 64)
            gm *= 2;
        else if (cols >= 256)
            gn *= 2;
        else if (rows >= 64)
            gm *= 2;
        else
            break;
    }
    sg_job j = {(const float *)v[0].buf, (const float *)v[1].buf, (float *)v[2].buf, M, K, N, gm, gn, tb};
    Py_BEGIN_ALLOW_THREADS
    rc_parallel(sg_part, &j, gm * gn, t);
    Py_END_ALLOW_THREADS
    release_buffers(v, 3);
    Py_RETURN_NONE;
}
