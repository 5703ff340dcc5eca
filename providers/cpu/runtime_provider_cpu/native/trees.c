/* tree_leaves: the walk of a tree ensemble (float32 or float64 thresholds, every comparison
 * mode, missing values), each tree's nodes one block of 16- or 24-byte records, 8 rows walking
 * it at once. */
#include "native.h"

/* ------------------------------------------------------------------------------------- */
/* tree_leaves: the walk of a compiled tree ensemble (ops/ml.py, _Forest)                */
/* ------------------------------------------------------------------------------------- */

/* One step from branch node q is q' = q->next - cond(x[q->feat], q->thr): the true child
 * directly precedes the false one, and a leaf's next is itself, so rows walk in lock-step
 * (below). Comparison modes are TreeEnsemble-5's codes: 0 LEQ, 1 LT, 2 GTE, 3 GT, 4 EQ,
 * 5 NEQ, -1 mixed (q->bits = which of {<, ==, >} are true). With nan_check a NaN feature goes
 * to the true child where q->nan_true is set. */

#define RC_TREE_COND(mode, v, th, bq)                                                            \
    ((mode) == 0 ? (v) <= (th) : (mode) == 1 ? (v) < (th) : (mode) == 2 ? (v) >= (th)            \
     : (mode) == 3 ? (v) > (th) : (mode) == 4 ? (v) == (th) : (mode) == 5 ? (v) != (th)        \
     : (((bq) & (((v) < (th)) | (((v) == (th)) << 1) | (((v) > (th)) << 2))) != 0))

/* one node, 16 bytes for float thresholds and 24 for double: the whole step reads one node.
 * The provider lays each tree's nodes out contiguously (breadth first inside the tree), so
 * while a tree's rows walk it the tree stays in L1. A leaf's next is itself. */
typedef struct { int32_t feat; float thr; int32_t next; uint8_t branch, nan_true, bits, pad; } rc_node_f;
typedef struct { double thr; int32_t feat; int32_t next; uint8_t branch, nan_true, bits, pad[5]; } rc_node_d;

/* Rows walk in lock-step, RC_LANES at a time (independent loads in flight), until all of
 * them are at leaves. A feature id outside the row (1) or a child outside the nodes (-1) fails
 * the call where the walk meets it: a branch that is never taken costs nothing, where checking
 * every node first cost a pass over the whole ensemble per call (most of a one-row run). */
#define RC_LANES 8
/* one step of lane j (row xj): fails the walk on a feature outside the row or a child outside
 * the nodes. Branch-free: a NaN test that mispredicts costs more than the step. */
#define RC_TREE_STEP(T, NODE, MODE, NANC, j, xj)                                                 \
    do {                                                                                         \
        const NODE *q = nd + idx[j];                                                             \
        any |= q->branch;                                                                        \
        if ((uint32_t)q->feat >= (uint32_t)c)                                                    \
            return 1;                                                                            \
        const T v = (xj)[q->feat], th = q->thr;                                                  \
        const int cond = RC_TREE_COND(MODE, v, th, q->bits) | ((NANC) & q->nan_true & (v != v)); \
        const int32_t nq = q->next - cond;                                                       \
        if ((uint32_t)nq >= (uint32_t)L)                                                         \
            return -1;                                                                           \
        idx[j] = nq;                                                                             \
    } while (0)

/* MODE and NANC (NaN routing) are constants: each pair has its own loop. A whole block of
 * RC_LANES rows steps in a loop of constant length (unrolled, the lanes' ids in registers);
 * the last, partial block in a loop of its own. */
#define RC_TREE_WALK(T, NODE, NAME, MODE, NANC)                                                  \
    static int NAME(const T *restrict X, Py_ssize_t n, Py_ssize_t c, const NODE *restrict nd,   \
                    Py_ssize_t L, const int64_t *restrict roots, Py_ssize_t t,                  \
                    int64_t *restrict out, Py_ssize_t depth, Py_ssize_t ldo)                    \
    {                                                                                            \
        for (Py_ssize_t k = 0; k < t; k++) {                                                     \
            const int64_t r = roots[k];                                                          \
            if ((uint64_t)r >= (uint64_t)L)                                                      \
                return -1;                                                                       \
            int64_t *o = out + k * ldo;                                                          \
            for (Py_ssize_t i0 = 0; i0 < n; i0 += RC_LANES) {                                    \
                const int m = n - i0 < RC_LANES ? (int)(n - i0) : RC_LANES;                      \
                const T *xr = X + i0 * c;                                                        \
                int32_t idx[RC_LANES];                                                           \
                for (int j = 0; j < RC_LANES; j++)                                               \
                    idx[j] = (int32_t)r;                                                         \
                if (m == RC_LANES) {                                                             \
                    for (Py_ssize_t d = 0; d < depth; d++) {                                     \
                        int any = 0;                                                             \
                        for (int j = 0; j < RC_LANES; j++)                                       \
                            RC_TREE_STEP(T, NODE, MODE, NANC, j, xr + j * c);                    \
                        if (!any)                                                                \
                            break;                                                               \
                    }                                                                            \
                } else {                                                                         \
                    for (Py_ssize_t d = 0; d < depth; d++) {                                     \
                        int any = 0;                                                             \
                        for (int j = 0; j < m; j++)                                              \
                            RC_TREE_STEP(T, NODE, MODE, NANC, j, xr + j * c);                    \
                        if (!any)                                                                \
                            break;                                                               \
                    }                                                                            \
                }                                                                                \
                for (int j = 0; j < m; j++)                                                      \
                    o[i0 + j] = idx[j];                                                          \
            }                                                                                    \
        }                                                                                        \
        return 0;                                                                                \
    }

typedef int (*rc_walk_f)(const float *, Py_ssize_t, Py_ssize_t, const rc_node_f *, Py_ssize_t,
                         const int64_t *, Py_ssize_t, int64_t *, Py_ssize_t, Py_ssize_t);
typedef int (*rc_walk_d)(const double *, Py_ssize_t, Py_ssize_t, const rc_node_d *, Py_ssize_t,
                         const int64_t *, Py_ssize_t, int64_t *, Py_ssize_t, Py_ssize_t);
#define RC_TREE_MODES(T, NODE, P, NANC)                                                          \
    RC_TREE_WALK(T, NODE, P##_mixed, -1, NANC)                                                   \
    RC_TREE_WALK(T, NODE, P##_leq, 0, NANC)                                                      \
    RC_TREE_WALK(T, NODE, P##_lt, 1, NANC)                                                       \
    RC_TREE_WALK(T, NODE, P##_gte, 2, NANC)                                                      \
    RC_TREE_WALK(T, NODE, P##_gt, 3, NANC)                                                       \
    RC_TREE_WALK(T, NODE, P##_eq, 4, NANC)                                                       \
    RC_TREE_WALK(T, NODE, P##_neq, 5, NANC)
RC_TREE_MODES(float, rc_node_f, walk_f, 0)
RC_TREE_MODES(double, rc_node_d, walk_d, 0)
RC_TREE_MODES(float, rc_node_f, walk_fn, 1)
RC_TREE_MODES(double, rc_node_d, walk_dn, 1)
/* indexed by [NaN routing][mode + 1] */
static const rc_walk_f walks_f[2][7] = {
    {walk_f_mixed, walk_f_leq, walk_f_lt, walk_f_gte, walk_f_gt, walk_f_eq, walk_f_neq},
    {walk_fn_mixed, walk_fn_leq, walk_fn_lt, walk_fn_gte, walk_fn_gt, walk_fn_eq, walk_fn_neq}};
static const rc_walk_d walks_d[2][7] = {
    {walk_d_mixed, walk_d_leq, walk_d_lt, walk_d_gte, walk_d_gt, walk_d_eq, walk_d_neq},
    {walk_dn_mixed, walk_dn_leq, walk_dn_lt, walk_dn_gte, walk_dn_gt, walk_dn_eq, walk_dn_neq}};

/* one walk over rows split in parts of whole RC_LANES blocks; reached (t x n) and, with
 * weights, the per-row sums of the rows' leaf weights (k a node) added tree after tree */
typedef struct {
    const void *X, *nodes, *W;
    const int64_t *roots;
    int64_t *reached;
    void *S;
    Py_ssize_t n, c, L, t, k, isz, depth;
    int mode, nan_check, blocks, err;
} tw_job;

/* rows [r0, r1) of S: each row's leaf weights (K a node, in W's type T) added tree after tree */
#define TW_SUMS_K(T, j, r0, r1, K)                                                               \
    do {                                                                                         \
        const Py_ssize_t n_ = (j)->n, k_ = (K);                                                  \
        const T *W_ = (j)->W;                                                                    \
        T *S_ = (T *)(j)->S + (r0) * k_;                                                         \
        memset(S_, 0, (size_t)(((r1) - (r0)) * k_) * sizeof(T));                                \
        for (Py_ssize_t q = 0; q < (j)->t; q++) {                                                \
            const int64_t *rq = (j)->reached + q * n_;                                           \
            for (Py_ssize_t i = (r0); i < (r1); i++) {                                           \
                const T *w = W_ + rq[i] * k_;                                                    \
                T *s = S_ + (i - (r0)) * k_;                                                     \
                for (Py_ssize_t m = 0; m < k_; m++)                                              \
                    s[m] += w[m];                                                                \
            }                                                                                    \
        }                                                                                        \
    } while (0)
/* a constant K for the usual few targets (regression, classes of a small classifier): the
 * inner loop unrolled, where a count known only at run time kept a loop per row and tree */
#define TW_SUMS(T, j, r0, r1)                                                                    \
    do {                                                                                         \
        switch ((j)->k) {                                                                        \
        case 1: TW_SUMS_K(T, j, r0, r1, 1); break;                                               \
        case 2: TW_SUMS_K(T, j, r0, r1, 2); break;                                               \
        case 3: TW_SUMS_K(T, j, r0, r1, 3); break;                                               \
        case 4: TW_SUMS_K(T, j, r0, r1, 4); break;                                               \
        default: TW_SUMS_K(T, j, r0, r1, (j)->k); break;                                         \
        }                                                                                        \
    } while (0)

static void tw_part(void *arg, int part, int parts)
{
    tw_job *j = arg;
    const Py_ssize_t b0 = (Py_ssize_t)j->blocks * part / parts, b1 = (Py_ssize_t)j->blocks * (part + 1) / parts;
    const Py_ssize_t r0 = b0 * RC_LANES, r1 = b1 * RC_LANES < j->n ? b1 * RC_LANES : j->n;
    if (r1 <= r0)
        return;
    int rc;
    if (j->isz == 4)
        rc = walks_f[j->nan_check][j->mode + 1]((const float *)j->X + r0 * j->c, r1 - r0, j->c, j->nodes, j->L,
                                                j->roots, j->t, j->reached + r0, j->depth, j->n);
    else
        rc = walks_d[j->nan_check][j->mode + 1]((const double *)j->X + r0 * j->c, r1 - r0, j->c, j->nodes, j->L,
                                                j->roots, j->t, j->reached + r0, j->depth, j->n);
    if (rc) {
        __atomic_store_n(&j->err, rc, __ATOMIC_RELAXED);
        return;
    }
    if (!j->W) /* every reached id below is a node: the walk checked each step */
        return;
    if (j->isz == 4)
        TW_SUMS(float, j, r0, r1);
    else
        TW_SUMS(double, j, r0, r1);
}

/* the walk (and the sums where v[4] is given) on up to threads threads: 0, 1 (a feature id
 * outside [0, c) met on the way) or -1 (a root or child outside the nodes) */
static int tree_walk(const Py_buffer *v, Py_ssize_t n, Py_ssize_t c, Py_ssize_t L, Py_ssize_t t,
                     Py_ssize_t k, Py_ssize_t isz, Py_ssize_t depth, int mode, int nan_check, int threads)
{
    const Py_ssize_t blocks = (n + RC_LANES - 1) / RC_LANES;
    if (blocks > INT_MAX)
        return -1;
    tw_job j = {v[0].buf, v[1].buf, k ? v[4].buf : NULL, v[2].buf, v[3].buf, k ? v[5].buf : NULL,
                n, c, L, t, k, isz, depth, mode, nan_check != 0, (int)blocks, 0};
    /* a node step is a few ns: a helper's wake-up pays from about 2^15 steps */
    const int parts = rc_parts((double)n * (double)t * (double)(depth ? depth : 1), 32768.0, blocks, &threads);
    Py_BEGIN_ALLOW_THREADS
    if (threads > 1)
        rc_parallel(tw_part, &j, parts, threads);
    else
        tw_part(&j, 0, 1);
    Py_END_ALLOW_THREADS
    return j.err;
}

static PyObject *tree_error(int rc, Py_ssize_t c, Py_ssize_t L, const char *fn)
{
    if (rc == 1)
        return PyErr_Format(PyExc_ValueError, "%s: a feature id is outside [0, %zd) (out is not meaningful)",
                            fn, c);
    return PyErr_Format(PyExc_ValueError, "%s: a root or child is outside the %zd nodes (out is not "
                        "meaningful)", fn, L);
}

PyObject *rc_py_tree_leaves(PyObject *self, PyObject *args)
{
    PyObject *o[4];
    int mode, nan_check;
    Py_ssize_t n, c, L, t, depth, isz;
    if (!PyArg_ParseTuple(args, "OOOO(nnnn)nnii:tree_leaves", &o[0], &o[1], &o[2], &o[3], &n, &c,
                          &L, &t, &isz, &depth, &mode, &nan_check))
        return NULL;
    if (n < 0 || c < 1 || L < 1 || L > 0x7fffffff || t < 0 || depth < 0 || (isz != 4 && isz != 8) ||
        mode < -1 || mode > 5) {
        PyErr_SetString(PyExc_ValueError, "tree_leaves: bad sizes or mode");
        return NULL;
    }
    const Py_ssize_t nsz = isz == 4 ? (Py_ssize_t)sizeof(rc_node_f) : (Py_ssize_t)sizeof(rc_node_d);
    rc_sz sz = {NULL};
    const Py_ssize_t xn = sz_mul(&sz, "X's size", n, c), on = sz_mul(&sz, "out's size", t, n);
    sz_add(&sz, "a block of rows", n, RC_LANES);
    if (sz_check(&sz, "tree_leaves", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[4]; /* X, nodes, roots, out */
    const rc_buf spec[4] = {{o[0], xn, isz, 0, 0, "X"}, {o[1], L * nsz, 1, 0, 0, "nodes"},
                            {o[2], t, 8, 0, 0, "roots"}, {o[3], on, 8, 1, 0, "out"}};
    const int got = get_buffers("tree_leaves", spec, v, 4) < 0 ? 0 : 4;
    int rc = -2;
    if (got == 4)
        rc = tree_walk(v, n, c, L, t, 0, isz, depth, mode, nan_check, 1);
    release_buffers(v, got);
    if (rc == -2)
        return NULL;
    if (rc != 0)
        return tree_error(rc, c, L, "tree_leaves");
    Py_RETURN_NONE;
}

/* tree_sums: the walk, then each row's leaf weights summed tree after tree (the order
 * onnxruntime and the numpy path add in), in one call: a small batch's gathers and reduction
 * cost more in numpy calls than in arithmetic. weights holds k values per node (thr type). */
PyObject *rc_py_tree_sums(PyObject *self, PyObject *args)
{
    PyObject *o[6];
    int mode, nan_check, threads;
    Py_ssize_t n, c, L, t, k, depth, isz;
    if (!PyArg_ParseTuple(args, "OOOOOO(nnnnn)nniii:tree_sums", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                          &n, &c, &L, &t, &k, &isz, &depth, &mode, &nan_check, &threads))
        return NULL;
    if (n < 0 || c < 1 || L < 1 || L > 0x7fffffff || t < 0 || k < 1 || depth < 0 || threads < 1 || (isz != 4 && isz != 8) ||
        mode < -1 || mode > 5) {
        PyErr_SetString(PyExc_ValueError, "tree_sums: bad sizes or mode");
        return NULL;
    }
    const Py_ssize_t nsz = isz == 4 ? (Py_ssize_t)sizeof(rc_node_f) : (Py_ssize_t)sizeof(rc_node_d);
    rc_sz sz = {NULL};
    const Py_ssize_t xn = sz_mul(&sz, "X's size", n, c), on = sz_mul(&sz, "reached's size", t, n);
    const Py_ssize_t wn = sz_mul(&sz, "weights' size", L, k), sn = sz_mul(&sz, "sums' size", n, k);
    sz_add(&sz, "a block of rows", n, RC_LANES);
    if (sz_check(&sz, "tree_sums", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[6]; /* X, nodes, roots, reached, weights, sums */
    const rc_buf spec[6] = {{o[0], xn, isz, 0, 0, "X"}, {o[1], L * nsz, 1, 0, 0, "nodes"},
                            {o[2], t, 8, 0, 0, "roots"}, {o[3], on, 8, 1, 0, "reached"},
                            {o[4], wn, isz, 0, 0, "weights"}, {o[5], sn, isz, 1, 0, "sums"}};
    const int got = get_buffers("tree_sums", spec, v, 6) < 0 ? 0 : 6;
    int rc = -2;
    if (got == 6)
        rc = tree_walk(v, n, c, L, t, k, isz, depth, mode, nan_check, threads);
    release_buffers(v, got);
    if (rc == -2)
        return NULL;
    if (rc != 0)
        return tree_error(rc, c, L, "tree_sums");
    Py_RETURN_NONE;
}
