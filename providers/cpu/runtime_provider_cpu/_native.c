/* runtime_provider_cpu._native: the few CPU kernels that numpy cannot express without one
 * full memory pass per step.
 *
 * depthwise2d: a 2-D depthwise convolution (one input and one output channel per group) in
 * float32, with the bias and a clip activation (Relu, Clip/ReLU6, or none) fused into the
 * same pass. numpy needs one multiply and one add over the whole image per kernel tap (18
 * passes for a 3x3 kernel); here each channel is padded once into a small scratch plane that
 * stays in cache and every output pixel is finished in registers. 3x3 kernels of stride 1
 * or 2 (every MobileNet one) run 8 outputs a vector, the stride-2 plane split into its even
 * and odd columns so that all loads are unit-stride; the padding is zeroed once a call and
 * rows are copied inline (a 7-28 float row costs less than a libc call). On AVX-512, 3x3 of
 * stride 1 or 2 both ways goes through phase planes instead (dwf_*, 16 outputs a vector over
 * the flat index), which maxpool2d's 3x3 windows share.
 *
 * recurrence: the time loop of LSTM and GRU (default activations, no clip, peepholes or
 * sequence lengths) in float32. numpy needs ~12 ufunc calls and one BLAS gemv a step, each
 * about a microsecond of call overhead on a 256-wide state; here a step is one pass over the
 * recurrence matrix, packed by chunks of hidden units, with the gate nonlinearities applied
 * to the chunk's sums while they are in registers. One thread: a second thread of our own
 * was 2x faster alone but 5x or more slower right after any multi-threaded BLAS call, whose
 * worker threads keep spinning on the cores for a while (see benchmarks/README.md).
 *
 * bias_clip: the epilogue of a convolution computed as a GEMM: bias, residual sum and clip
 * in one pass over the result. im2col: not here; a compiled one was measured no faster
 * (it is bound by writing the patch matrix).
 *
 * gelu_erf: Gelu (erf form) of x plus an optional bias row in one pass, with the rational erf
 * the numpy path evaluates (ops/elementwise.py) in ~20 passes; 128x3072: 773 -> 136 us.
 *
 * conv2d: a dense float32 convolution without an im2col matrix (the input's stride phases
 * read in place; register tiles of 8 channels x 48 positions, or of 32 channels in the lanes
 * x 12 positions of a row for narrow outputs; bias / residual / clip in the tile epilogue),
 * on the kernel threads (rc_parallel: a small pthread pool sized by the session's
 * intra_op_num_threads). winograd3x3: 3x3 stride-1 convolutions as Winograd F(2x2, 3x3) on
 * the same register tiles (48 tiles x 8 channels; or, for 10-16 wide outputs, the lanes' 32
 * channels x 12 compact tiles). pointwise: 1x1 convolutions as blocks of single-threaded sgemm
 * calls (SciPy's BLAS, set_sgemm) on the kernel threads. gemm_rows: a Gemm of a few rows.
 * linear: y = a w with w packed once (an initializer) or a chunk at a time, 12 x 32 register
 * tiles on the kernel threads; pointwise_lanes: 1x1 convolutions on the same tiles with the
 * epilogue in registers. mha: multi-head attention after the projection, a head a unit,
 * single-threaded sgemm calls. maxpool2d, skip_layer_norm (also LayerNormalization), softmax:
 * one pass a row where numpy needs 5-9. gelu_erf also computes Gelu's tanh form (FastGelu).
 *
 * Fused steps (the executable's pairs and siblings, after a partition's first run):
 * expand_dw, an inverted-residual block's 1x1 expansion and 3x3 depthwise convolution, 12
 * expanded channels at a time through a per-thread buffer; conv_maxpool, a stem convolution
 * and its 3x3 stride-2 MaxPool by bands of pooled rows; conv2d's extra, a strided 1x1
 * shortcut from the phase planes its 3x3 neighbour filled.
 *
 * tree_leaves: the walk of a tree ensemble (float32 or float64 thresholds, every comparison
 * mode, missing values). numpy walks all rows x trees one level at a time, a gather per node
 * field per level; here each tree's nodes are one contiguous block of 16-byte records and 8
 * rows walk it at once, a record read per step (LightGBM 300 trees x 100 rows: 970 -> 430 us).
 *
 * Every buffer is checked against the shape it is said to have before anything is read, and
 * the GIL is released while the kernels run. Called from runtime_provider_cpu.ops.nn, .ops.rnn,
 * .ops.fused and .ops.ml, which make the arrays C-contiguous and of the kernel's type first.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
/* one x86-64-v3 (AVX2 + FMA) build and one baseline build, picked at load time by the CPU */
#define RC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define RC_CLONES
#endif

static inline float clipf(float v, float lo, float hi)
{
    /* NaN stays NaN (both comparisons are false), as numpy's maximum / clip keep it */
    v = v < lo ? lo : v;
    return v > hi ? hi : v;
}

#define RC_INLINE static inline __attribute__((always_inline))

/* the kernel thread pool (defined with conv2d below): fn(arg, part, parts) for every part */
typedef void (*rc_part_f)(void *arg, int part, int parts);
static void rc_parallel(rc_part_f fn, void *arg, int parts, int threads);

/* how a kernel splits its work over the pool: *threads lowered to one a min_work of work (a
 * thread's wake-up must pay for itself), at least 1; returns the parts, 4 a thread, no more
 * than the kernel's units (channel planes, tiles) */
static int rc_parts(double work, double min_work, Py_ssize_t units, int *threads)
{
    int t = *threads;
    if (t > work / min_work)
        t = (int)(work / min_work);
    if (t < 1)
        t = 1;
    Py_ssize_t parts = (Py_ssize_t)t * 4;
    if (parts > units)
        parts = units;
    *threads = t;
    return parts < 1 ? 1 : (int)parts;
}

/* a prefetch of nbytes from nx (NULL: none) spread over `helpers` callers in steps of `line`
 * bytes: the k-th caller's (0-based) first line in *pf, its count of steps returned (0: none).
 * The tiles that pass over a chunk after the first one ask the next chunk into L2 this way,
 * so that the first pass over it does not wait on memory. */
static inline Py_ssize_t rc_pf_share(const char *nx, Py_ssize_t nbytes, Py_ssize_t helpers, Py_ssize_t k,
                                     Py_ssize_t line, const char **pf)
{
    *pf = NULL;
    if (!nx || nbytes <= 0 || helpers < 1 || k < 0 || k >= helpers)
        return 0;
    const Py_ssize_t lines = (nbytes + line - 1) / line, share = (lines + helpers - 1) / helpers;
    const Py_ssize_t first = k * share;
    if (first >= lines)
        return 0;
    *pf = nx + first * line;
    return lines - first < share ? lines - first : share;
}

/* GCC / clang vector extensions: 8 floats, lowered to two SSE registers in the baseline
   clone and one AVX register in the x86-64-v3 and -v4 clones */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v8f_u __attribute__((vector_size(32), aligned(4)));  /* unaligned loads */

RC_INLINE v8f v8_load(const float *p) { return *(const v8f_u *)p; }
RC_INLINE void v8_store(float *p, v8f v) { *(v8f_u *)p = v; }
RC_INLINE v8f v8_set1(float x) { return (v8f){0} + x; }
/* a where m is set, else b (m from a vector comparison: all ones or all zeros) */
RC_INLINE v8f v8_select(v8i m, v8f a, v8f b) { return (v8f)((m & (v8i)a) | (~m & (v8i)b)); }

/* 3x3, dilation 1, stride 1 or 2, over planes whose rows are at least OWr + 2 floats
 * (OWr: OW rounded up to 8) so that every output row is whole 8-wide vectors; the last
 * vector's extra lanes go to a scratch row. Stride 1 reads one plane at columns ox + kx;
 * stride 2 reads the even columns (pe) at ox and ox + 1 and the odd ones (po) at ox, so
 * both are unit-stride loads. */
RC_CLONES
static void dw3x3(const float *restrict pe, const float *restrict po, Py_ssize_t Ws,
                  const float *restrict wk, float bias, float *restrict y, Py_ssize_t OH,
                  Py_ssize_t OW, Py_ssize_t sh, float lo, float hi)
{
    const v8f w0 = v8_set1(wk[0]), w1 = v8_set1(wk[1]), w2 = v8_set1(wk[2]), w3 = v8_set1(wk[3]),
              w4 = v8_set1(wk[4]), w5 = v8_set1(wk[5]), w6 = v8_set1(wk[6]), w7 = v8_set1(wk[7]),
              w8 = v8_set1(wk[8]), vb = v8_set1(bias), vlo = v8_set1(lo), vhi = v8_set1(hi);
    float tail[8];
    for (Py_ssize_t oy = 0; oy < OH; oy++) {
        const Py_ssize_t r = oy * sh * Ws;
        const float *e0 = pe + r, *e1 = e0 + Ws, *e2 = e1 + Ws;
        const float *o0 = po ? po + r : e0 + 1, *o1 = o0 + Ws, *o2 = o1 + Ws;
        /* stride 1: taps at e + ox, e + ox + 1 (= o), e + ox + 2; stride 2: e, o, e + 1 */
        const Py_ssize_t third = po ? 1 : 2;
        float *row = y + oy * OW;
        for (Py_ssize_t ox = 0; ox < OW; ox += 8) {
            v8f v = vb + w0 * v8_load(e0 + ox) + w1 * v8_load(o0 + ox) + w2 * v8_load(e0 + ox + third)
                    + w3 * v8_load(e1 + ox) + w4 * v8_load(o1 + ox) + w5 * v8_load(e1 + ox + third)
                    + w6 * v8_load(e2 + ox) + w7 * v8_load(o2 + ox) + w8 * v8_load(e2 + ox + third);
            /* clip as clipf does: NaN stays NaN */
            v = v8_select(v < vlo, vlo, v);
            v = v8_select(v > vhi, vhi, v);
            /* a short last vector may spill into the rows below, which are written after
               it, but never past the plane's end */
            if (ox + 8 <= OW || oy * OW + ox + 8 <= OH * OW)
                v8_store(row + ox, v);
            else {
                v8_store(tail, v);
                for (Py_ssize_t i = 0; i < OW - ox; i++)
                    row[ox + i] = tail[i];
            }
        }
    }
}

/* one channel, any kernel but the 3x3 ones dw3x3 takes: xp is the padded plane [Hp, Wp];
   y the output plane [OH, OW] */
RC_CLONES
static void dw_plane(const float *restrict xp, Py_ssize_t Wp, const float *restrict wk,
                     Py_ssize_t KH, Py_ssize_t KW, float bias, float *restrict y,
                     Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t sh, Py_ssize_t sw,
                     Py_ssize_t dh, Py_ssize_t dw, float lo, float hi)
{
    /* any other kernel: one multiply-add per tap over an output row that stays in L1 */
    for (Py_ssize_t oy = 0; oy < OH; oy++) {
        float *row = y + oy * OW;
        for (Py_ssize_t ox = 0; ox < OW; ox++)
            row[ox] = bias;
        for (Py_ssize_t ky = 0; ky < KH; ky++) {
            const float *src = xp + (oy * sh + ky * dh) * Wp;
            for (Py_ssize_t kx = 0; kx < KW; kx++) {
                const float wv = wk[ky * KW + kx];
                const float *s = src + kx * dw;
                if (sw == 1) {
                    for (Py_ssize_t ox = 0; ox < OW; ox++)
                        row[ox] += wv * s[ox];
                } else {
                    for (Py_ssize_t ox = 0; ox < OW; ox++)
                        row[ox] += wv * s[ox * sw];
                }
            }
        }
        for (Py_ssize_t ox = 0; ox < OW; ox++)
            row[ox] = clipf(row[ox], lo, hi);
    }
}

/* one C-contiguous buffer of n items of itemsize bytes (writable when asked), else a
 * ValueError naming it (and nothing held) */
static int get_items(const char *fn, PyObject *obj, Py_buffer *view, int writable, Py_ssize_t n,
                     Py_ssize_t itemsize, const char *what)
{
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    if (view->len != n * itemsize || view->itemsize != itemsize) {
        PyErr_Format(PyExc_ValueError,
                     "%s: %s holds %zd bytes of %zd-byte items, expected %zd items of %zd bytes",
                     fn, what, view->len, view->itemsize, n, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* what a kernel takes: an object, its item count and size, whether it is written, whether
 * None may stand for it (an absent optional input), and its name in errors */
typedef struct {
    PyObject *obj;
    Py_ssize_t n, itemsize;
    int writable, optional;
    const char *name;
} rc_buf;

static void release_buffers(Py_buffer *v, int k)
{
    for (int i = 0; i < k; i++)
        if (v[i].obj != NULL)
            PyBuffer_Release(&v[i]);
}

/* every buffer of spec[0..k) into v (an absent optional one: buf NULL); on a failure those
 * already held are released and -1 is returned with the error set */
static int get_buffers(const char *fn, const rc_buf *spec, Py_buffer *v, int k)
{
    for (int i = 0; i < k; i++) {
        if (spec[i].optional && spec[i].obj == Py_None) {
            v[i].obj = NULL;
            v[i].buf = NULL;
            continue;
        }
        if (get_items(fn, spec[i].obj, &v[i], spec[i].writable, spec[i].n, spec[i].itemsize,
                      spec[i].name) < 0) {
            v[i].obj = NULL;
            release_buffers(v, i);
            return -1;
        }
    }
    return 0;
}

#define RC_F32 ((Py_ssize_t)sizeof(float))

typedef struct {
    const float *x, *w, *b;
    float *y;
    Py_ssize_t N, C, H, W, OH, OW, sh, sw, pt, pl, Hp, Ws;
    float lo, hi;
    float *planes; /* one scratch plane of plane_n floats a part */
    Py_ssize_t plane_n;
} dw_job;

/* the vector (3x3, dilation 1) depthwise path over channel planes [p0, p1) of the N * C
 * (cloned: the row copies and the even / odd split of stride 2 were baseline SSE2 code,
 * about half the depthwise layers' time in perf) */
RC_CLONES
static void dw_vec_range(const dw_job *j, float *plane, Py_ssize_t p0, Py_ssize_t p1)
{
    const Py_ssize_t H = j->H, W = j->W, OH = j->OH, OW = j->OW, sh = j->sh, sw = j->sw;
    const Py_ssize_t pt = j->pt, pl = j->pl, Hp = j->Hp, Ws = j->Ws, C = j->C;
    float *pe = plane, *po = plane + Hp * Ws, *tmp = plane + 2 * Hp * Ws;
    const Py_ssize_t span = sw == 1 ? Ws : 2 * Ws + 2; /* padded columns a plane row holds */
    /* input columns [0, ic1) land at padded columns [pl, pl + ic1); input rows
       [0, ir1) at plane rows [pt, pt + ir1). Everything else is padding, zeroed once
       here and never written: each channel overwrites only the same data region. */
    const Py_ssize_t ic1 = W < span - pl ? W : (span - pl > 0 ? span - pl : 0);
    const Py_ssize_t ir1 = H < Hp - pt ? H : (Hp - pt > 0 ? Hp - pt : 0);
    memset(plane, 0, (size_t)(2 * Hp * Ws + 2 * Ws + 2) * sizeof(float));
    for (Py_ssize_t p = p0; p < p1; p++) {
        const Py_ssize_t c = p % C;
        const float *xc = j->x + p * H * W;
        for (Py_ssize_t xr = 0; xr < ir1; xr++) {
            const float *src = xc + xr * W;
            const Py_ssize_t r = xr + pt;
            /* inline copies: a row is often 7-28 floats, where a libc call costs
               more than the copy */
            if (sw == 1) {
                float *dst = pe + r * Ws + pl;
                for (Py_ssize_t i = 0; i < ic1; i++)
                    dst[i] = src[i];
            } else {
                float *dst = tmp + pl;
                for (Py_ssize_t i = 0; i < ic1; i++)
                    dst[i] = src[i];
                float *er = pe + r * Ws, *orow = po + r * Ws;
                for (Py_ssize_t i = 0; i < Ws; i++) {
                    er[i] = tmp[2 * i];
                    orow[i] = tmp[2 * i + 1];
                }
            }
        }
        dw3x3(pe, sw == 2 ? po : NULL, Ws, j->w + c * 9, j->b ? j->b[c] : 0.0f,
              j->y + p * OH * OW, OH, OW, sh, j->lo, j->hi);
    }
}

static void dw_part(void *arg, int part, int parts)
{
    const dw_job *j = (const dw_job *)arg;
    const Py_ssize_t n = j->N * j->C;
    dw_vec_range(j, j->planes + part * j->plane_n, n * part / parts, n * (part + 1) / parts);
}

/* fn's parts of job on up to threads threads without the GIL (none where *oom is already set:
 * the caller's own allocation failed), then the caller's nbuf buffers released: None, or NULL
 * with MemoryError where *oom is set */
static PyObject *rc_run_job(rc_part_f fn, void *job, int parts, int threads, Py_buffer *v, int nbuf,
                            const int *oom)
{
    if (!*oom) {
        Py_BEGIN_ALLOW_THREADS
        rc_parallel(fn, job, parts, threads);
        Py_END_ALLOW_THREADS
    }
    release_buffers(v, nbuf);
    if (*oom)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* The AVX-512 depthwise path: 3x3, dilation 1, stride 1 or 2 both ways. Each channel's input
 * goes once into zero-padded phase planes (stride 1: the padded plane; stride 2: its four
 * even / odd row x column phases, the column split by two-register permutes), each Wq floats
 * wide. The output is then computed over the flat index oy * Wq + ox, 16 at a time, every tap
 * one unaligned load at a fixed offset into its phase plane: the two (stride 1) or one
 * (stride 2) columns past OW a row are computed and dropped when the rows are copied out.
 * A 7 x 7 plane is 4 vectors a tap instead of 7 row vectors, and no row is copied with scalar
 * code (the 8-float path copied and split each row element by element: 576 7 x 7 channels
 * stride 2 took 160 us against onnxruntime's 34). */
/* cv_fast(), asked once when the module loads (CONV_FAST) */
static int rc_conv_fast;

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#define DWF_OK 1
#define DWF_SETS 4 /* sets of phase planes and outputs a part (a power of 2) */
#define DWF_TARGET __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))

typedef struct {
    const float *x, *w, *b;
    float *y;
    Py_ssize_t planes, C, H, W, OH, OW, s, pt, pl;
    Py_ssize_t Wq, Hq, pn, nv; /* phase plane width, rows, floats (with slack); output vectors */
    float lo, hi;
    float *scratch; /* per part: DWF_SETS sets of s * s phase planes of pn floats, then as many of nv * 16
                       outputs (one set of planes alone when rows hold 16 or more) */
    Py_ssize_t scratch_n;
    int max; /* maxpool2d's 3x3: the window's maximum (w, b, lo and hi unused), padding -inf */
    Py_ssize_t toff[9]; /* each tap's offset from a set of phase planes (dwf_run) */
} dwf_job;

DWF_TARGET static inline __mmask16 dwf_mask(Py_ssize_t n)
{
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
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
            for (Py_ssize_t c0 = 0; c0 < n; c0 += 16) {
                const __mmask16 m = dwf_mask(n - c0);
                _mm512_mask_storeu_ps(dst + c0, m, _mm512_maskz_loadu_ps(m, src + c0));
            }
            continue;
        }
        /* input column c lands at padded column c + pl: phase (c + pl) & 1, index (c + pl) >> 1 */
        float *rowb = ph + (R & 1) * 2 * pn + i * Wq;
        float *de = rowb + (pl & 1) * pn, *dod = rowb + ((pl + 1) & 1) * pn;
        const Py_ssize_t je = pl >> 1, jo = (pl + 1) >> 1; /* where columns 0 and 1 go */
        for (Py_ssize_t c0 = 0; c0 < W; c0 += 32) {
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

/* channel p's outputs from its phase planes ph: rows of 16-float vectors straight into y when
 * a row holds at least 16 (row), else over the flat index into out (the caller copies the rows
 * out) */
DWF_TARGET static void dwf_compute(const dwf_job *j, Py_ssize_t p, Py_ssize_t c, const float *ph, float *out,
                                   int row)
{
    /* the tap offsets come from the job: nine divisions by s a channel were a third of a
       7 x 7 plane's time */
    const Py_ssize_t Wq = j->Wq, OH = j->OH, OW = j->OW;
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
                /* max, then min, with the bound first: a NaN stays NaN as clipf keeps it */
                _mm512_mask_storeu_ps(yc + oy * OW + ox, dwf_mask(OW - ox), _mm512_min_ps(hi, _mm512_max_ps(lo, acc)));
            }
        return;
    }
    for (Py_ssize_t v = 0; v < j->nv; v++) {
        const Py_ssize_t f = v * 16;
        const __m512 acc = dwf_sum9(w, tp, f, vb);
        _mm512_store_ps(out + f, _mm512_min_ps(hi, _mm512_max_ps(lo, acc)));
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

/* channels [p0, p1), channel p's input at xs + (p - pbase) * H * W: rows of 16 or more a
 * channel at a time, smaller planes pipelined */
static void dwf_range(const dwf_job *j, const float *xs, Py_ssize_t pbase, float *scratch, Py_ssize_t p0,
                      Py_ssize_t p1)
{
    const Py_ssize_t hw = j->H * j->W;
    const Py_ssize_t ps = j->s * j->s * j->pn, os = j->nv * 16;
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
       wrote just before (a store-forwarding stall on every tap: 960 7 x 7 planes took 74 us
       in the plain order against 48 for the 8-float path; two sets 65, four 55, one thread) */
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
static int dwf_takes(Py_ssize_t KH, Py_ssize_t KW, Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t dh,
                     Py_ssize_t dw, Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t planes)
{
    return KH == 3 && KW == 3 && dh == 1 && dw == 1 && sh == sw && sh <= 2 && OH > 0 && OW > 0 &&
           planes > 0 && rc_conv_fast;
}

/* j's phase-plane geometry from its sizes: plane width and rows, floats a plane (with slack),
 * output vectors, scratch floats a part and the taps' offsets */
static void dwf_setup(dwf_job *j)
{
    const Py_ssize_t s = j->s, OH = j->OH, OW = j->OW;
    j->Wq = OW + 2 / s;
    j->Hq = OH + 2 / s;
    j->nv = (OH * j->Wq + 15) / 16;
    /* the last vector of each tap reads up to 2 rows + 2 columns + 15 floats past the flat
       domain: slack after each plane, never written */
    const Py_ssize_t need = j->nv * 16 + 2 * j->Wq + 2, hw = j->Hq * j->Wq;
    j->pn = ((hw > need ? hw : need) + 16 + 15) / 16 * 16;
    j->scratch_n = OW >= 16 ? s * s * j->pn : DWF_SETS * (s * s * j->pn + j->nv * 16);
    for (int ky = 0; ky < 3; ky++)
        for (int kx = 0; kx < 3; kx++)
            j->toff[ky * 3 + kx] = ((ky % s) * s + kx % s) * j->pn + (ky / s) * j->Wq + kx / s;
}

/* j (geometry, buffers and max set) on up to threads threads, its planes' sizes and scratch
 * set here; then the caller's nbuf buffers v are released. None, or NULL with MemoryError.
 * Called with the GIL, which it releases while it runs. */
static PyObject *dwf_run(dwf_job *j, int threads, Py_buffer *v, int nbuf)
{
    dwf_setup(j);
    const int parts = rc_parts((double)j->planes * (double)(j->OH * j->OW) * (j->max ? 9.0 / 8.0 : 1.0), 8192.0,
                               j->planes, &threads);
    j->scratch = (float *)aligned_alloc(64, sizeof(float) * (size_t)(parts * j->scratch_n));
    const int oom = !j->scratch;
    PyObject *r = rc_run_job(dwf_part, j, parts, threads, v, nbuf, &oom);
    free(j->scratch);
    return r;
}
#else
#define DWF_OK 0
#endif

static PyObject *depthwise2d(PyObject *self, PyObject *args)
{
    PyObject *xo, *wo, *bo, *yo;
    Py_ssize_t N, C, H, W, OH, OW, KH, KW, sh, sw, dh, dw, pt, pl;
    float lo, hi;
    int threads = 1, fast = 1;
    if (!PyArg_ParseTuple(args, "OOOO(nnnn)(nn)(nn)(nn)(nn)(nn)ff|ip:depthwise2d", &xo, &wo, &bo, &yo,
                          &N, &C, &H, &W, &OH, &OW, &KH, &KW, &sh, &sw, &dh, &dw, &pt, &pl, &lo, &hi,
                          &threads, &fast))
        return NULL;
    if (N < 0 || C < 0 || H < 0 || W < 0 || OH < 0 || OW < 0 || KH < 1 || KW < 1 || sh < 1 ||
        sw < 1 || dh < 1 || dw < 1 || pt < 0 || pl < 0) {
        PyErr_SetString(PyExc_ValueError, "depthwise2d: negative or zero size, stride or dilation");
        return NULL;
    }
    /* the padded extent every output reads: rows [-pt, Hp - pt), columns [-pl, Wp - pl) */
    const Py_ssize_t Hp = OH ? (OH - 1) * sh + (KH - 1) * dh + 1 : 0;
    const Py_ssize_t Wp = OW ? (OW - 1) * sw + (KW - 1) * dw + 1 : 0;
    Py_buffer v[4]; /* X, W, B, Y */
    const rc_buf spec[4] = {{xo, N * C * H * W, RC_F32, 0, 0, "X"}, {wo, C * KH * KW, RC_F32, 0, 0, "W"},
                            {bo, C, RC_F32, 0, 1, "B"}, {yo, N * C * OH * OW, RC_F32, 1, 0, "Y"}};
    if (get_buffers("depthwise2d", spec, v, 4) < 0)
        return NULL;
#if DWF_OK
    if (fast && dwf_takes(KH, KW, sh, sw, dh, dw, OH, OW, N * C)) {
        dwf_job fj = {(const float *)v[0].buf, (const float *)v[1].buf, (const float *)v[2].buf,
                      (float *)v[3].buf, N * C, C, H, W, OH, OW, sh, pt, pl, 0, 0, 0, 0, lo, hi, NULL, 0, 0};
        return dwf_run(&fj, threads, v, 4);
    }
#endif
    /* 3x3, dilation 1, column stride 1 or 2: the vector kernel (dw3x3) over planes of row
       stride Ws, the stride-2 input split into even and odd columns */
    const int vec = KH == 3 && KW == 3 && dh == 1 && dw == 1 && (sw == 1 || sw == 2) && OW > 0 && OH > 0;
    const Py_ssize_t OWr = (OW + 7) / 8 * 8, Ws = OWr + 2;
    float *plane = NULL;
    /* channel planes split between the kernel threads (a thread from about 8K outputs: 960 7x7
       planes went 156 -> 84 us on 2 threads; 64K before left them on one),
       each part with its own scratch plane */
    const int parts = rc_parts((double)(N * C) * (double)(OH * OW), 8192.0, N * C, &threads);
    /* [even or whole plane][odd plane][one padded input row of 2 * Ws + 2], one a part */
    const Py_ssize_t plane_n = 2 * Hp * Ws + 2 * Ws + 2;
    if (vec) {
        plane = (float *)malloc((size_t)(parts * plane_n) * sizeof(float));
    } else if (Hp * Wp > 0) {
        plane = (float *)malloc((size_t)(Hp * Wp) * sizeof(float));
    }
    if (!plane && (vec || Hp * Wp > 0)) {
        release_buffers(v, 4);
        return PyErr_NoMemory();
    }
    const float *x = (const float *)v[0].buf, *w = (const float *)v[1].buf;
    const float *b = (const float *)v[2].buf; /* NULL without a bias */
    float *y = (float *)v[3].buf;
    /* the input rows and columns that land inside the padded plane */
    const Py_ssize_t r0 = pt, r1 = pt + H < Hp ? pt + H : Hp;   /* plane rows holding input */
    const Py_ssize_t c0 = pl, c1 = pl + W < Wp ? pl + W : Wp;
    dw_job dj = {x, w, b, y, N, C, H, W, OH, OW, sh, sw, pt, pl, Hp, Ws, lo, hi, plane, plane_n};
    Py_BEGIN_ALLOW_THREADS
    if (vec)
        rc_parallel(dw_part, &dj, parts, threads);
    for (Py_ssize_t n = 0; n < N && plane && !vec; n++) {
        for (Py_ssize_t c = 0; c < C; c++) {
            const float *xc = x + (n * C + c) * H * W;
            if (r0 < r1 && c0 < c1) {
                memset(plane, 0, (size_t)(r0 * Wp) * sizeof(float));
                for (Py_ssize_t r = r0; r < r1; r++) {
                    float *dst = plane + r * Wp;
                    memset(dst, 0, (size_t)c0 * sizeof(float));
                    memcpy(dst + c0, xc + (r - pt) * W, (size_t)(c1 - c0) * sizeof(float));
                    memset(dst + c1, 0, (size_t)(Wp - c1) * sizeof(float));
                }
                memset(plane + r1 * Wp, 0, (size_t)((Hp - r1) * Wp) * sizeof(float));
            } else {
                memset(plane, 0, (size_t)(Hp * Wp) * sizeof(float));
            }
            dw_plane(plane, Wp, w + c * KH * KW, KH, KW, b ? b[c] : 0.0f,
                     y + (n * C + c) * OH * OW, OH, OW, sh, sw, dh, dw, lo, hi);
        }
    }
    Py_END_ALLOW_THREADS
    free(plane);
    release_buffers(v, 4);
    Py_RETURN_NONE;
}

/* bias_clip: y[m, p] = clip(y[m, p] + b[m] (+ z[m, p]), lo, hi) in place, one pass (the
   epilogue of a convolution computed as a GEMM, which numpy would do in two or three); M rows
   of P columns, ld floats apart in y and z (the pointwise and Linear kernels' epilogues on a
   block of the output too) */
RC_CLONES
static void bias_clip_block(float *restrict y, Py_ssize_t ld, const float *restrict b,
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

static PyObject *bias_clip(PyObject *self, PyObject *args)
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
    Py_buffer v[3]; /* Y, B, Z */
    const rc_buf spec[3] = {{yo, M * P, RC_F32, 1, 0, "Y"}, {bo, M, RC_F32, 0, 1, "B"},
                            {zo, M * P, RC_F32, 0, 1, "Z"}};
    if (get_buffers("bias_clip", spec, v, 3) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    bias_clip_block((float *)v[0].buf, P, (const float *)v[1].buf, (const float *)v[2].buf, M, P, lo, hi);
    Py_END_ALLOW_THREADS
    release_buffers(v, 3);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------------- */
/* recurrence: the LSTM / GRU time loop                                                   */
/* ------------------------------------------------------------------------------------- */

/* hidden units per packed chunk: the recurrence matrix is packed as
   [chunk][k][gate][RC_U] so one chunk's gates for one k are contiguous */
#define RC_U 16


/* exp in float32 with no branches: Cody-Waite reduction by ln 2 and Cephes's degree-5
   polynomial on [-ln2/2, ln2/2], about 1 ulp. The argument is clamped to the normal
   range, so exp(x < -87.3) is ~1.2e-38 rather than 0 and exp(x > 88.3) is ~2.4e38 rather
   than inf; NaN stays NaN (both comparisons are false) */
RC_INLINE v8f v8_exp(v8f x)
{
    const v8f lo = v8_set1(-87.3f), hi = v8_set1(88.3f), magic = v8_set1(12582912.0f);
    x = v8_select(x < lo, lo, x);
    x = v8_select(x > hi, hi, x);
    const v8f n = (x * 1.44269504088896341f + magic) - magic; /* round to nearest */
    v8f r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    v8f p = v8_set1(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const v8i e = (__builtin_convertvector(n, v8i) + 127) << 23;
    return p * (v8f)e;
}

RC_INLINE v8f v8_sigmoid(v8f x) { return 1.0f / (1.0f + v8_exp(-x)); }

/* tanh: (1 - e) / (1 + e) * sign(x) with e = exp(-2|x|) where that does not cancel
   (|x| >= 0.25), the odd Taylor polynomial to x^9 below (truncation < 1e-8 relative) */
RC_INLINE v8f v8_tanh(v8f x)
{
    const v8i sign = (v8i)x & (int32_t)0x80000000;
    const v8f a = (v8f)((v8i)x & (int32_t)0x7fffffff);
    const v8f e = v8_exp(-2.0f * a);
    const v8f big = (v8f)((v8i)((1.0f - e) / (1.0f + e)) | sign);
    const v8f x2 = x * x;
    const v8f small = x * (1.0f + x2 * (-0.333333333333f + x2 * (0.133333333333f
                      + x2 * (-0.0539682539683f + x2 * 0.0218694885362f))));
    return v8_select(a < 0.25f, small, big);
}

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

static PyObject *recurrence(PyObject *self, PyObject *args)
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
    const Py_ssize_t nchunk = (H + RC_U - 1) / RC_U, G = lstm ? 4 : 3;
    const Py_ssize_t G1 = lstm ? 4 : (lbr ? 3 : 2);
    const int has_p2 = !lstm && !lbr, has_rb = !lstm && lbr, has_c = lstm;
    if ((p2o != Py_None) != has_p2 || (rbo != Py_None) != has_rb || (co != Py_None) != has_c) {
        PyErr_SetString(PyExc_ValueError,
                        "recurrence: p2 is for GRU with linear_before_reset=0, rbn for GRU with "
                        "linear_before_reset=1, c for LSTM; pass None otherwise");
        return NULL;
    }
    Py_buffer v[7];
    /* p2, rbn and c were checked above: None exactly where the variant has none */
    const rc_buf spec[7] = {
        {xo, seq * B * G * H, RC_F32, 0, 0, "xw"}, {p1o, nchunk * H * G1 * RC_U, RC_F32, 0, 0, "p1"},
        {p2o, nchunk * H * RC_U, RC_F32, 0, 1, "p2"}, {rbo, H, RC_F32, 0, 1, "rbn"},
        {h0o, B * H, RC_F32, 0, 0, "h0"}, {co, B * H, RC_F32, 1, 1, "c"},
        {yo, seq * B * H, RC_F32, 1, 0, "ys"}};
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
 * them are at leaves. Feature ids were checked before the walk; a child outside the nodes
 * fails the call (a branch that is never taken costs nothing). */
#define RC_LANES 8
#define RC_TREE_WALK(T, NODE, NAME, MODE)                                                        \
    static int NAME(const T *restrict X, Py_ssize_t n, Py_ssize_t c, const NODE *restrict nd,   \
                    Py_ssize_t L, const int64_t *restrict roots, Py_ssize_t t,                  \
                    int64_t *restrict out, int nan_check, Py_ssize_t depth)                     \
    {                                                                                            \
        const int mode = (MODE); /* a constant: each mode has its own loop */                   \
        for (Py_ssize_t k = 0; k < t; k++) {                                                     \
            const int64_t r = roots[k];                                                          \
            if ((uint64_t)r >= (uint64_t)L)                                                      \
                return -1;                                                                       \
            int64_t *o = out + k * n;                                                            \
            for (Py_ssize_t i0 = 0; i0 < n; i0 += RC_LANES) {                                    \
                const int m = n - i0 < RC_LANES ? (int)(n - i0) : RC_LANES;                      \
                const T *xr = X + i0 * c;                                                        \
                int32_t idx[RC_LANES];                                                           \
                for (int j = 0; j < RC_LANES; j++)                                               \
                    idx[j] = (int32_t)r;                                                         \
                for (Py_ssize_t d = 0; d < depth; d++) {                                         \
                    int any = 0;                                                                 \
                    for (int j = 0; j < m; j++) {                                                \
                        const NODE *q = nd + idx[j];                                             \
                        any |= q->branch;                                                        \
                        const T v = xr[j * c + q->feat], th = q->thr;                            \
                        /* branch-free: a NaN test that mispredicts costs more than the step */ \
                        const int cond = RC_TREE_COND(mode, v, th, q->bits)                      \
                                         | (nan_check & q->nan_true & (v != v));                 \
                        const int32_t nq = q->next - cond;                                       \
                        if ((uint32_t)nq >= (uint32_t)L)                                         \
                            return -1;                                                           \
                        idx[j] = nq;                                                             \
                    }                                                                            \
                    if (!any)                                                                    \
                        break;                                                                   \
                }                                                                                \
                for (int j = 0; j < m; j++)                                                      \
                    o[i0 + j] = idx[j];                                                          \
            }                                                                                    \
        }                                                                                        \
        return 0;                                                                                \
    }

typedef int (*rc_walk_f)(const float *, Py_ssize_t, Py_ssize_t, const rc_node_f *, Py_ssize_t,
                         const int64_t *, Py_ssize_t, int64_t *, int, Py_ssize_t);
typedef int (*rc_walk_d)(const double *, Py_ssize_t, Py_ssize_t, const rc_node_d *, Py_ssize_t,
                         const int64_t *, Py_ssize_t, int64_t *, int, Py_ssize_t);
#define RC_TREE_MODES(T, NODE, P)                                                                \
    RC_TREE_WALK(T, NODE, P##_mixed, -1)                                                         \
    RC_TREE_WALK(T, NODE, P##_leq, 0)                                                            \
    RC_TREE_WALK(T, NODE, P##_lt, 1)                                                             \
    RC_TREE_WALK(T, NODE, P##_gte, 2)                                                            \
    RC_TREE_WALK(T, NODE, P##_gt, 3)                                                             \
    RC_TREE_WALK(T, NODE, P##_eq, 4)                                                             \
    RC_TREE_WALK(T, NODE, P##_neq, 5)
RC_TREE_MODES(float, rc_node_f, walk_f)
RC_TREE_MODES(double, rc_node_d, walk_d)
/* indexed by mode + 1 */
static const rc_walk_f walks_f[7] = {walk_f_mixed, walk_f_leq, walk_f_lt, walk_f_gte, walk_f_gt,
                                     walk_f_eq, walk_f_neq};
static const rc_walk_d walks_d[7] = {walk_d_mixed, walk_d_leq, walk_d_lt, walk_d_gte, walk_d_gt,
                                     walk_d_eq, walk_d_neq};

static PyObject *tree_leaves(PyObject *self, PyObject *args)
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
    Py_buffer v[4]; /* X, nodes, roots, out */
    const rc_buf spec[4] = {{o[0], n * c, isz, 0, 0, "X"}, {o[1], L * nsz, 1, 0, 0, "nodes"},
                            {o[2], t, 8, 0, 0, "roots"}, {o[3], t * n, 8, 1, 0, "out"}};
    const int got = get_buffers("tree_leaves", spec, v, 4) < 0 ? 0 : 4;
    int rc = -2;
    if (got == 4) {
        rc = 0;
        for (Py_ssize_t q = 0; q < L; q++) { /* every feature id inside a row */
            int32_t f = isz == 4 ? ((const rc_node_f *)v[1].buf)[q].feat
                                 : ((const rc_node_d *)v[1].buf)[q].feat;
            rc |= f < 0 || f >= c;
        }
        if (rc == 0) {
            Py_BEGIN_ALLOW_THREADS
            if (isz == 4)
                rc = walks_f[mode + 1](v[0].buf, n, c, v[1].buf, L, v[2].buf, t, v[3].buf,
                                       nan_check != 0, depth);
            else
                rc = walks_d[mode + 1](v[0].buf, n, c, v[1].buf, L, v[2].buf, t, v[3].buf,
                                       nan_check != 0, depth);
            Py_END_ALLOW_THREADS
        }
    }
    release_buffers(v, got);
    if (rc == -2)
        return NULL;
    if (rc == 1)
        return PyErr_Format(PyExc_ValueError, "tree_leaves: a feature id is outside [0, %zd)", c);
    if (rc == -1)
        return PyErr_Format(PyExc_ValueError, "tree_leaves: a root or child is outside the %zd "
                            "nodes (out is not meaningful)", L);
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

RC_CLONES
static void gelu_rows(const float *restrict x, const float *restrict b, float *y, Py_ssize_t rows,
                      Py_ssize_t d, int tanh_form)
{
    float tx[8], tb[8];
    for (Py_ssize_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        Py_ssize_t i = 0;
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

static PyObject *gelu_erf(PyObject *self, PyObject *args)
{
    PyObject *xo, *bo, *yo;
    Py_ssize_t rows, d;
    int tanh_form = 0;
    if (!PyArg_ParseTuple(args, "OOO(nn)|p:gelu_erf", &xo, &bo, &yo, &rows, &d, &tanh_form))
        return NULL;
    if (rows < 0 || d < 0) {
        PyErr_SetString(PyExc_ValueError, "gelu_erf: negative size");
        return NULL;
    }
    Py_buffer v[3]; /* X, B, Y */
    const rc_buf spec[3] = {{xo, rows * d, RC_F32, 0, 0, "X"}, {bo, d, RC_F32, 0, 1, "B"},
                            {yo, rows * d, RC_F32, 1, 0, "Y"}};
    if (get_buffers("gelu_erf", spec, v, 3) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    gelu_rows((const float *)v[0].buf, (const float *)v[1].buf, (float *)v[2].buf, rows, d, tanh_form);
    Py_END_ALLOW_THREADS
    release_buffers(v, 3);
    Py_RETURN_NONE;
}

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
#include <pthread.h>
#include <sched.h>
#include <time.h>

#define CV_MR 8   /* output channels a tile */
#define CV_NV 3   /* 16-float vectors of positions a tile */
#define CV_NR (16 * CV_NV)

typedef float v16f __attribute__((vector_size(64)));
typedef float v16f_u __attribute__((vector_size(64), aligned(4)));
typedef int32_t v16i __attribute__((vector_size(64)));

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
/* an AVX-512 build (32 vector registers: the 24 accumulators fit) and a portable one */
#define CV_CLONES __attribute__((target_clones("arch=x86-64-v4", "default")))
#else
#define CV_CLONES
#endif

RC_INLINE v16f cv_bcast(float a)
{
    /* lane 0 to every lane: one vbroadcastss (a + (v16f){0} is an add, a lane list masked moves) */
    return __builtin_shuffle((v16f){a}, (v16i){0});
}

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
typedef void (*cv_tile_f)(const float *restrict, const Py_ssize_t *restrict, Py_ssize_t, Py_ssize_t, Py_ssize_t,
                          const float *restrict, float *restrict, int);
static const cv_tile_f cv_tiles[CV_NV + 1] = {NULL, cv_tile1, cv_tile2, cv_tile3}; /* by 16-float vectors */

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
} cv_job;

/* the epilogue of one tile: bias, residual and clip, written to the OW real columns of Y (in
 * the AVX-512 clone its row runs are 16-wide vector loops: the SSE2 build took about a third
 * of the ResNet stem's time, 147 terms a sum leaving little to hide it) */
CV_CLONES static void cv_store(const cv_job *j, Py_ssize_t mb, Py_ssize_t q0, int nv, const float *o)
{
    const Py_ssize_t P = j->OH * j->OW, left = j->Q - q0;
    const Py_ssize_t qend = q0 + (left < 16 * nv ? left : 16 * nv);
    for (int i = 0; i < CV_MR; i++) {
        const Py_ssize_t m = mb * CV_MR + i;
        if (m >= j->M)
            break;
        const float *r = o + i * nv * 16 - q0;  /* r[q]: position q of this tile row */
        const float bias = j->b ? j->b[m] : 0.0f;
        float *ym = j->y + m * P;
        const float *zm = j->z ? j->z + m * P : NULL;
        for (Py_ssize_t q = q0; q < qend;) {
            const Py_ssize_t oh = q / j->Wq, ow = q - oh * j->Wq;
            const Py_ssize_t rowend = oh * j->Wq + j->OW; /* past the row's last output */
            const Py_ssize_t e = rowend < qend ? rowend : qend;
            if (ow < j->OW) {
                float *dst = ym + oh * j->OW + ow;
                const float *src = r + q;
                const Py_ssize_t n = e - q;
                if (zm) {
                    const float *zs = zm + oh * j->OW + ow;
                    for (Py_ssize_t k = 0; k < n; k++)
                        dst[k] = clipf(src[k] + bias + zs[k], j->lo, j->hi);
                } else {
                    for (Py_ssize_t k = 0; k < n; k++)
                        dst[k] = clipf(src[k] + bias, j->lo, j->hi);
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
 * stays in L1 instead of coming from L2 for every tile (C = 256: ~105 against ~160 GFLOP/s) */
static void cv_run(const cv_job *j, Py_ssize_t u0, Py_ssize_t u1, float *scratch)
{
    const Py_ssize_t K = j->C * j->T, inner_n = j->tiles_outer ? j->Mb : j->nq;
    for (Py_ssize_t u = u0; u < u1;) {
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
#define CT_NB 2
#define CT_MR (16 * CT_NB)
#define CT_NP 12
_Static_assert(CT_NP * CT_MR == CV_MR * CV_NR, "a lane tile takes one conv2d tile's scratch");

typedef void (*ct_tile_f)(const float *restrict, const Py_ssize_t *restrict, Py_ssize_t,
                          Py_ssize_t, Py_ssize_t, const float *restrict, float *restrict, int,
                          const char *, Py_ssize_t);

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
static const ct_tile_f ct_tiles[CT_NP + 1] = {NULL, ct_tile1, ct_tile2, ct_tile3, ct_tile4,
                                              ct_tile5, ct_tile6, ct_tile7, ct_tile8, ct_tile9,
                                              ct_tile10, ct_tile11, ct_tile12};

/* a row's segment s of nseg: columns [ow0, ow0 + n), the row split as evenly as it goes */
RC_INLINE void ct_segment(Py_ssize_t OW, Py_ssize_t nseg, Py_ssize_t s, Py_ssize_t *ow0, int *n)
{
    *ow0 = OW * s / nseg;
    *n = (int)(OW * (s + 1) / nseg - *ow0);
}

/* units [u0, u1) of the (channel block, row segment) grid, channel blocks outer: a group of
 * up to CV_SUB segments takes the input channels kc at a time, the chunk of weights they
 * share staying in L1 */
static void ct_run(const cv_job *j, Py_ssize_t u0, Py_ssize_t u1, float *scratch)
{
    const Py_ssize_t K = j->C * j->T, nseg = (j->OW + CT_NP - 1) / CT_NP, S = j->OH * nseg;
    const Py_ssize_t P = j->OH * j->OW;
    for (Py_ssize_t u = u0; u < u1;) {
        const Py_ssize_t mb = u / S, i0 = u - mb * S;
        Py_ssize_t i1 = mb * S + S <= u1 ? S : u1 - mb * S;
        if (i1 - i0 > CV_SUB)
            i1 = i0 + CV_SUB;
        for (Py_ssize_t c0 = 0; c0 < j->C; c0 += j->kc) {
            const Py_ssize_t cn = j->C - c0 < j->kc ? j->C - c0 : j->kc;
            const float *wp = j->wp + (mb * K + c0 * j->T) * CT_MR;
            /* the next chunk of weights (the next block's first at the last chunk), asked
               into L2 a share by each segment after the first, one line a step of its tile:
               the weights come from memory once (ResNet's 7 x 7 stage: 9.4 MB a
               convolution), and the first segment's pass waited on them */
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
            const float *o = scratch + (i - i0) * CT_NP * CT_MR;
            for (Py_ssize_t k = 0; k < CT_MR; k++) {
                const Py_ssize_t m = mb * CT_MR + k;
                if (m >= j->M)
                    break;
                const float bias = j->b ? j->b[m] : 0.0f;
                float *dst = j->y + m * P + oh * j->OW + ow0;
                const float *zs = j->z ? j->z + m * P + oh * j->OW + ow0 : NULL;
                if (zs)
                    for (int p = 0; p < n; p++)
                        dst[p] = clipf(o[p * CT_MR + k] + bias + zs[p], j->lo, j->hi);
                else
                    for (int p = 0; p < n; p++)
                        dst[p] = clipf(o[p * CT_MR + k] + bias, j->lo, j->hi);
            }
        }
        u = mb * S + i1;
    }
}

/* a pool of worker threads that run parts of one job beside the caller's thread. One job at
 * a time: a caller that finds the pool busy (another thread's convolution) runs its whole
 * job itself. Workers sleep on a condition variable between jobs. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    pthread_mutex_t busy;       /* held by the caller whose job the pool runs */
    int started;                /* workers running */
    unsigned long gen;          /* job number */
    rc_part_f fn;
    void *arg;
    int parts, next, pending;
    int slots;                  /* workers that may still join the job: its threads - 1 */
    int last_threads;           /* threads that ran parts of the last job, the caller's included */
} rc_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
             PTHREAD_MUTEX_INITIALIZER, 0, 0, NULL, NULL, 0, 0, 0, 0, 0};
#define RC_POOL_MAX 64
#define RC_SPIN_NS 100000L
#if defined(__x86_64__) || defined(__i386__)
#define RC_PAUSE() __asm__ __volatile__("pause")
#else
#define RC_PAUSE() ((void)0)
#endif

static void *rc_worker(void *unused)
{
    (void)unused;
    unsigned long seen = 0;
    pthread_mutex_lock(&rc_pool.mu);
    seen = rc_pool.gen;
    for (;;) {
        /* a network's convolutions come one after another: look for the next job for about
           0.1 ms before sleeping (a wake-up from the condition variable costs as much) */
        pthread_mutex_unlock(&rc_pool.mu);
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        while (__atomic_load_n(&rc_pool.gen, __ATOMIC_ACQUIRE) == seen) {
            /* yield, not just pause: another runnable thread (BLAS's worker in the GEMM
               between two of our jobs) gets this core while we wait */
            sched_yield();
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) > RC_SPIN_NS)
                break;
        }
        pthread_mutex_lock(&rc_pool.mu);
        while (rc_pool.gen == seen)
            pthread_cond_wait(&rc_pool.go, &rc_pool.mu);
        seen = rc_pool.gen;
        /* a job with fewer threads than the pool has workers (another session's
           intra_op_num_threads) takes only as many */
        if (rc_pool.slots <= 0)
            continue;
        rc_pool.slots--;
        if (rc_pool.next < rc_pool.parts)
            rc_pool.last_threads++;
        while (rc_pool.next < rc_pool.parts) {
            const int part = rc_pool.next++;
            rc_part_f fn = rc_pool.fn;
            void *arg = rc_pool.arg;
            const int parts = rc_pool.parts;
            pthread_mutex_unlock(&rc_pool.mu);
            fn(arg, part, parts);
            pthread_mutex_lock(&rc_pool.mu);
            if (__atomic_sub_fetch(&rc_pool.pending, 1, __ATOMIC_RELEASE) == 0)
                pthread_cond_signal(&rc_pool.done);
        }
    }
    return NULL;
}

static void rc_pool_forked(void)
{
    /* the child of a fork has none of the workers: start again from none */
    pthread_mutex_init(&rc_pool.mu, NULL);
    pthread_mutex_init(&rc_pool.busy, NULL);
    pthread_cond_init(&rc_pool.go, NULL);
    pthread_cond_init(&rc_pool.done, NULL);
    rc_pool.started = 0;
    rc_pool.parts = rc_pool.next = rc_pool.pending = rc_pool.slots = 0;
}

/* fn(arg, part, parts) for every part in [0, parts), on the caller's thread and up to
 * threads - 1 workers, each taking the next part not taken yet (a thread slowed by another
 * process on its core takes fewer); returns when all have finished */
static void rc_parallel(rc_part_f fn, void *arg, int parts, int threads)
{
    if (parts < 1)
        parts = 1;
    if (threads > RC_POOL_MAX)
        threads = RC_POOL_MAX;
    if (threads > parts)
        threads = parts;
    if (threads <= 1 || pthread_mutex_trylock(&rc_pool.busy) != 0) {
        for (int p = 0; p < parts; p++)
            fn(arg, p, parts);
        return;
    }
    pthread_mutex_lock(&rc_pool.mu);
    while (rc_pool.started < threads - 1) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const int ok = pthread_create(&t, &attr, rc_worker, NULL) == 0;
        pthread_attr_destroy(&attr);
        if (!ok)
            break;
        rc_pool.started++;
    }
    const int helpers = rc_pool.started < threads - 1 ? rc_pool.started : threads - 1;
    rc_pool.fn = fn;
    rc_pool.arg = arg;
    rc_pool.parts = parts;
    rc_pool.next = 1;           /* part 0 is the caller's */
    rc_pool.pending = parts - 1;
    rc_pool.slots = helpers;
    rc_pool.last_threads = 1;
    __atomic_store_n(&rc_pool.gen, rc_pool.gen + 1, __ATOMIC_RELEASE);
    for (int h = 0; h < helpers; h++)
        pthread_cond_signal(&rc_pool.go);
    pthread_mutex_unlock(&rc_pool.mu);
    fn(arg, 0, parts);
    pthread_mutex_lock(&rc_pool.mu);
    /* parts no worker took yet are the caller's too */
    while (rc_pool.next < rc_pool.parts) {
        const int part = rc_pool.next++;
        pthread_mutex_unlock(&rc_pool.mu);
        fn(arg, part, parts);
        pthread_mutex_lock(&rc_pool.mu);
        rc_pool.pending--;
    }
    if (rc_pool.pending > 0) {
        /* the workers' last parts: watched for up to RC_SPIN_NS before sleeping on the
           condition (a futex sleep and wake-up cost more than most of those parts take) */
        pthread_mutex_unlock(&rc_pool.mu);
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int n = 0; __atomic_load_n(&rc_pool.pending, __ATOMIC_ACQUIRE) > 0; n++) {
            RC_PAUSE();
            if ((n & 63) == 63) {
                clock_gettime(CLOCK_MONOTONIC, &t);
                if ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) > RC_SPIN_NS)
                    break;
            }
        }
        pthread_mutex_lock(&rc_pool.mu);
    }
    while (rc_pool.pending > 0)
        pthread_cond_wait(&rc_pool.done, &rc_pool.mu);
    rc_pool.parts = 0;
    pthread_mutex_unlock(&rc_pool.mu);
    pthread_mutex_unlock(&rc_pool.busy);
}

/* pool_stats() -> (workers started, threads that ran parts of the last pooled job) */
static PyObject *pool_stats(PyObject *self, PyObject *args)
{
    (void)args;
    pthread_mutex_lock(&rc_pool.mu);
    const int started = rc_pool.started, last = rc_pool.last_threads;
    pthread_mutex_unlock(&rc_pool.mu);
    return Py_BuildValue("(ii)", started, last);
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

/* the planes of channels [c0, c1) of one image: plane (a, b) of channel c at
 * planes + (c * sh * sw + a * sw + b) * L holds padded input position (a + sh * i, b + sw * j)
 * at i * Wq + j, zeros elsewhere. Only the phases some tap reads are written (a 1x1 stride-2
 * convolution reads one of four), and each element once: the input where it lands, zeros
 * around it (memset of the whole planes and then the copy cost about twice the traffic) */
typedef struct {
    const float *x;
    float *planes;
    Py_ssize_t C, H, W, pt, pl, sh, sw, Hp, Wp, Wq, L;
    unsigned char used[16]; /* phase a * sw + b read by some tap (sh, sw <= 4 where used) */
} cv_fill_job;

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
static void cv_taps(Py_ssize_t KH, Py_ssize_t KW, Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t ty, Py_ssize_t tx,
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

static void cv_fill_part(void *arg, int part, int parts)
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

/* a work buffer of the calling thread, 64-byte aligned and kept between calls up to
 * RC_KEEP bytes: a fresh multi-megabyte malloc each call is a fresh mmap whose pages fault in
 * on first touch (about a tenth of a ResNet convolution's time went to filling new pages).
 * rc_work_done frees what was not kept. The buffer goes with its thread (a key destructor). */
#define RC_KEEP ((size_t)32 << 20)
typedef struct { void *p; size_t n; } rc_work_buf;
static pthread_key_t rc_work_key;
static pthread_once_t rc_work_once = PTHREAD_ONCE_INIT;
static int rc_work_ok;

static void rc_work_free(void *b)
{
    if (b) {
        free(((rc_work_buf *)b)->p);
        free(b);
    }
}

static void rc_work_init(void) { rc_work_ok = pthread_key_create(&rc_work_key, rc_work_free) == 0; }

static void *rc_work(size_t n)
{
    n = (n + 63) & ~(size_t)63;
    pthread_once(&rc_work_once, rc_work_init);
    if (n > RC_KEEP || !rc_work_ok)
        return aligned_alloc(64, n ? n : 64);
    rc_work_buf *b = (rc_work_buf *)pthread_getspecific(rc_work_key);
    if (!b) {
        b = (rc_work_buf *)calloc(1, sizeof(rc_work_buf));
        if (!b || pthread_setspecific(rc_work_key, b) != 0) {
            free(b);
            return aligned_alloc(64, n ? n : 64);
        }
    }
    if (b->n < n) {
        free(b->p);
        b->p = aligned_alloc(64, n);
        b->n = b->p ? n : 0;
    }
    return b->p;
}

static void rc_work_done(void *p, size_t n)
{
    n = (n + 63) & ~(size_t)63;
    if (n > RC_KEEP || !rc_work_ok)
        free(p);
    else {
        rc_work_buf *b = (rc_work_buf *)pthread_getspecific(rc_work_key);
        if (!b || b->p != p)
            free(p);
    }
}

/* whether conv2d runs its AVX-512 clone here (the portable one holds its 24 accumulators
 * in memory: slower than im2col and a BLAS GEMM) */
static int cv_fast(void)
{
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
#else
    return 0;
#endif
}

static PyObject *conv2d(PyObject *self, PyObject *args)
{
    PyObject *xo, *wo, *bo, *zo, *yo, *extra = Py_None;
    Py_ssize_t N, C, H, W, M, KH, KW, sh, sw, dh, dw, pt, pl, OH, OW;
    float lo, hi;
    int threads, lanes = 0;
    if (!PyArg_ParseTuple(args, "OOOOO(nnnn)(nnn)(nn)(nn)(nn)(nn)ffi|pO:conv2d", &xo, &wo, &bo, &zo, &yo,
                          &N, &C, &H, &W, &M, &KH, &KW, &sh, &sw, &dh, &dw, &pt, &pl, &OH, &OW,
                          &lo, &hi, &threads, &lanes, &extra))
        return NULL;
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
        if (M2 < 1 || ty < 0 || tx < 0 || ty > (KH - 1) * dh || tx > (KW - 1) * dw) {
            PyErr_SetString(PyExc_ValueError, "conv2d: the extra convolution needs M2 >= 1 and its tap inside "
                                              "the first one's window");
            return NULL;
        }
    }
    /* channel blocks of CV_MR, or of CT_MR with the channels in the lanes */
    const Py_ssize_t mr = lanes ? CT_MR : CV_MR, mr2 = lanes2 ? CT_MR : CV_MR;
    const Py_ssize_t T = KH * KW, K = C * T, Mb = (M + mr - 1) / mr, Mb2 = (M2 + mr2 - 1) / mr2;
    /* the padded extent the outputs read, split into phases of Hq x Wq */
    const Py_ssize_t Hp = (OH - 1) * sh + (KH - 1) * dh + 1, Wp = (OW - 1) * sw + (KW - 1) * dw + 1;
    const Py_ssize_t Hq = (Hp + sh - 1) / sh, Wq = (Wp + sw - 1) / sw;
    const Py_ssize_t Q = OH * Wq, nq = (Q + CV_NR - 1) / CV_NR;
    /* a tile reads up to 15 positions past Q, plus the largest tap offset (< Wq + Hq * Wq - Q) */
    const Py_ssize_t L = Hq * Wq + Wq + 32;
    const int nb = extra != Py_None ? 9 : 5;
    Py_buffer v[9]; /* X, packed W, B, Z, Y; then W2, B2, Z2, Y2 */
    const rc_buf spec[9] = {{xo, N * C * H * W, RC_F32, 0, 0, "X"}, {wo, Mb * K * mr, RC_F32, 0, 0, "W"},
                            {bo, M, RC_F32, 0, 1, "B"}, {zo, N * M * OH * OW, RC_F32, 0, 1, "Z"},
                            {yo, N * M * OH * OW, RC_F32, 1, 0, "Y"},
                            {wo2, Mb2 * C * mr2, RC_F32, 0, 0, "W2"}, {bo2, M2, RC_F32, 0, 1, "B2"},
                            {zo2, N * M2 * OH * OW, RC_F32, 0, 1, "Z2"}, {yo2, N * M2 * OH * OW, RC_F32, 1, 0, "Y2"}};
    if (get_buffers("conv2d", spec, v, nb) < 0)
        return NULL;
    if ((lanes && ((uintptr_t)v[1].buf & 63)) || (nb > 5 && lanes2 && ((uintptr_t)v[5].buf & 63))) {
        release_buffers(v, nb);
        PyErr_SetString(PyExc_ValueError, "conv2d: the lane-packed weights must be 64-byte aligned");
        return NULL;
    }
    Py_ssize_t *toff = (Py_ssize_t *)malloc((size_t)(T + 1) * sizeof(Py_ssize_t));
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
    const double flops = 2.0 * (double)Mb * mr * (double)(lanes ? OH * OW : Q) * (double)K;
    const int parts = rc_parts(flops, 2.5e5, units, &threads);
    const Py_ssize_t units2 = lanes2 ? Mb2 * OH * ((OW + CT_NP - 1) / CT_NP) : Mb2 * nq;
    const int parts2 = nb > 5 ? rc_parts(2.0 * (double)Mb2 * mr2 * (double)(lanes2 ? OH * OW : Q) * (double)C,
                                         2.5e5, units2, &threads2) : 0;
    /* the planes filled by channels, a thread from about 64 KiB of them */
    const int fparts = rc_parts((double)(C * sh * sw * L), 16384.0, C, &fthreads);
    const int tiles_outer = C * sh * sw * L >= Mb * K * CV_MR;
    const int tiles_outer2 = C * sh * sw * L >= Mb2 * C * CV_MR;
    /* the planes, then the parts' tile sums */
    const int sparts = parts > parts2 ? parts : parts2;
    const size_t plane_bytes = ((size_t)(C * sh * sw * L) * sizeof(float) + 63) & ~(size_t)63;
    const size_t work = plane_bytes + (size_t)sparts * CV_SUB * CV_MR * CV_NR * sizeof(float);
    float *planes = (float *)rc_work(work);
    if (!planes) {
        free(toff);
        release_buffers(v, nb);
        return PyErr_NoMemory();
    }
    float *scratch = planes + plane_bytes / sizeof(float);
    const float *x = (const float *)v[0].buf;
    cv_job j = {planes, (const float *)v[1].buf, (const float *)v[2].buf, NULL, NULL, toff, scratch,
                T, C, sh * sw * L, M, Mb, Q, nq, Wq, OH, OW,
                lanes ? cv_lane_chunk(T) : cv_chunk(toff, T, tiles_outer), lo, hi, tiles_outer, lanes};
    cv_job j2 = {planes, nb > 5 ? (const float *)v[5].buf : NULL, nb > 5 ? (const float *)v[6].buf : NULL, NULL,
                 NULL, toff + T, scratch, 1, C, sh * sw * L, M2, Mb2, Q, nq, Wq, OH, OW,
                 lanes2 ? cv_lane_chunk(1) : cv_chunk(toff + T, 1, tiles_outer2), lo2, hi2, tiles_outer2, lanes2};
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
    rc_work_done(planes, work);
    free(toff);
    release_buffers(v, nb);
    Py_RETURN_NONE;
}

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

/* v clipped to [lo, hi] lane by lane, as clipf does (NaN stays NaN) */
RC_INLINE v16f v16_clip(v16f v, v16f lo, v16f hi)
{
    v16i m = v < lo;
    v = (v16f)((m & (v16i)lo) | (~m & (v16i)v));
    m = v > hi;
    return (v16f)((m & (v16i)hi) | (~m & (v16i)v));
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
        const Py_ssize_t blk = u / j->Mb, mb = u - blk * j->Mb, q0 = blk * CV_NR;
        if (blk != have) {
            wg_input(j, q0, V);
            have = blk;
        }
        for (int xi = 0; xi < 16; xi++)
            cv_tile3(V + xi * j->C * CV_NR, &zero, 1, j->C, CV_NR,
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
        const Py_ssize_t mb = u / j->ngrp, g = u - mb * j->ngrp;
        const Py_ssize_t s0 = j->nseg * g / j->ngrp, s1 = j->nseg * (g + 1) / j->ngrp;
        for (int xi = 0; xi < 16; xi++)
            for (Py_ssize_t c0 = 0; c0 < C; c0 += WL_KC) {
                /* a chunk of the weights (16 KB) stays in L1 while the group's segments pass */
                const Py_ssize_t cn = C - c0 < WL_KC ? C - c0 : WL_KC;
                const float *wp = j->u + (((Py_ssize_t)xi * j->Mb + mb) * C + c0) * CT_MR;
                /* the next chunk (the next xi's first after the last), asked into L2 a share by
                   each segment after the first: U comes from memory (4.2 MB at 256 x 14 x 14)
                   and the first segment's pass waited on it */
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

static PyObject *winograd3x3(PyObject *self, PyObject *args)
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
    const Py_ssize_t Mb = (M + mr - 1) / mr, OH2 = (OH + 1) / 2, OW2 = (OW + 1) / 2;
    /* the padded input of the tiles: 2 * OH2 + 2 rows, 2 * OW2 + 2 columns, in stride-2 phases
       of Hq x Wq; a block reads up to 47 tiles past the last and Wq + 1 past a tile */
    const Py_ssize_t Hp = 2 * OH2 + 2, Wp = 2 * OW2 + 2, Hq = OH2 + 1, Wq = OW2 + 1;
    const Py_ssize_t L = Hq * Wq + Wq + 2 * CV_NR, Q = OH2 * Wq, nblk = (Q + CV_NR - 1) / CV_NR;
    Py_buffer v[5];
    const rc_buf spec[5] = {{xo, N * C * H * W, RC_F32, 0, 0, "X"}, {uo, 16 * Mb * C * mr, RC_F32, 0, 0, "U"},
                            {bo, M, RC_F32, 0, 1, "B"}, {zo, N * M * OH * OW, RC_F32, 0, 1, "Z"},
                            {yo, N * M * OH * OW, RC_F32, 1, 0, "Y"}};
    if (get_buffers("winograd3x3", spec, v, 5) < 0)
        return NULL;
    int fthreads = threads;
    if (lanes) {
        if ((uintptr_t)v[1].buf & 63) {
            release_buffers(v, 5);
            PyErr_SetString(PyExc_ValueError, "winograd3x3: the lane-packed weights must be 64-byte aligned");
            return NULL;
        }
        const Py_ssize_t NT = OH2 * OW2, NTs = NT + 16, nseg = (NT + CT_NP - 1) / CT_NP;
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

#if DWF_OK
/* ---------------------------------------------------------------------------------------
 * conv_maxpool: conv2d's position tiles (8 channels x 48 positions, dilation 1, stride <= 2)
 * with bias and clip, then a 3x3 stride-2 MaxPool padded by 1 (ResNet's stem and its pool) of
 * one image, the convolution's output never whole: a unit is a channel block and a band of
 * CP_BAND pooled rows, whose 2 * CP_BAND + 1 convolution rows (one shared with the band
 * before, computed again) go to a per-part buffer in L2 and are pooled from there, the rows'
 * maxima first (unit stride) and then the columns' (even / odd split by two-register
 * permutes). NaN wherever a tap is NaN, as maxpool2d.
 * --------------------------------------------------------------------------------------- */
#define CP_BAND 8

typedef struct {
    const float *planes, *wp, *b;
    float *y;
    const Py_ssize_t *toff;
    float *scratch;             /* per part: band rows, then the row maxima, then a tile */
    Py_ssize_t T, C, cs, M, Mb, Wq, OH, OW, POH, POW, nband, bs, scratch_n;
    float lo, hi;
} cp_job;

/* the larger of a and b lane by lane, NaN where either is NaN */
DWF_TARGET static inline __m512 cp_max(__m512 a, __m512 b)
{
    return _mm512_mask_mov_ps(_mm512_max_ps(a, b), _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q), _mm512_set1_ps(NAN));
}

DWF_TARGET static void cp_pool(const cp_job *j, const float *band, Py_ssize_t a, Py_ssize_t pr0, Py_ssize_t pr1,
                               float *vm, float *ym)
{
    const Py_ssize_t Wq = j->Wq, OW = j->OW, POW = j->POW;
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (Py_ssize_t pr = pr0; pr < pr1; pr++) {
        /* convolution rows 2 pr - 1 .. 2 pr + 1 inside the output; at least 2pr is */
        const Py_ssize_t r0 = 2 * pr - 1 < 0 ? 0 : 2 * pr - 1, r1 = 2 * pr + 2 < j->OH ? 2 * pr + 2 : j->OH;
        for (Py_ssize_t c = 0; c < OW; c += 16) {
            __m512 m = _mm512_loadu_ps(band + (r0 - a) * Wq + c);
            for (Py_ssize_t r = r0 + 1; r < r1; r++)
                m = cp_max(m, _mm512_loadu_ps(band + (r - a) * Wq + c));
            _mm512_storeu_ps(vm + c, m);
        }
        /* padding: column -1 and columns from OW (the last vector's lanes past OW too) */
        vm[-1] = -INFINITY;
        _mm512_storeu_ps(vm + OW, ninf);
        _mm512_storeu_ps(vm + OW + 16, ninf);
        float *yr = ym + pr * POW;
        for (Py_ssize_t c = 0; c < POW; c += 16) {
            const __m512 lo = _mm512_loadu_ps(vm + 2 * c), hi = _mm512_loadu_ps(vm + 2 * c + 16);
            const __m512 plo = _mm512_loadu_ps(vm + 2 * c - 1), phi = _mm512_loadu_ps(vm + 2 * c + 15);
            const __m512 e = _mm512_permutex2var_ps(lo, ev, hi), o = _mm512_permutex2var_ps(lo, od, hi);
            const __m512 p = _mm512_permutex2var_ps(plo, ev, phi); /* column 2 c - 1 */
            _mm512_mask_storeu_ps(yr + c, dwf_mask(POW - c), cp_max(cp_max(e, o), p));
        }
    }
}

DWF_TARGET static void cp_part(void *arg, int part, int parts)
{
    const cp_job *j = (const cp_job *)arg;
    float *band = j->scratch + (Py_ssize_t)part * j->scratch_n;
    float *vm = band + CV_MR * j->bs + 16, *o = vm + (j->OW + 48 + 15) / 16 * 16;
    const Py_ssize_t units = j->Mb * j->nband, K = j->C * j->T, Wq = j->Wq;
    for (Py_ssize_t u = units * part / parts; u < units * (part + 1) / parts; u++) {
        const Py_ssize_t mb = u / j->nband, bd = u - mb * j->nband;
        const Py_ssize_t pr0 = bd * CP_BAND, pr1 = pr0 + CP_BAND < j->POH ? pr0 + CP_BAND : j->POH;
        /* the convolution rows its pooled rows read: 2 pr0 - 1 .. 2 pr1 - 1, inside the output */
        const Py_ssize_t a = 2 * pr0 - 1 < 0 ? 0 : 2 * pr0 - 1, b = 2 * pr1 < j->OH ? 2 * pr1 : j->OH;
        const float *wp = j->wp + mb * K * CV_MR;
        for (Py_ssize_t q = a * Wq; q < b * Wq; q += CV_NR) {
            const Py_ssize_t left = b * Wq - q;
            const int nv = left >= CV_NR ? CV_NV : (int)((left + 15) / 16);
            cv_tiles[nv](j->planes + q, j->toff, j->T, j->C, j->cs, wp, o, 0);
            for (int i = 0; i < CV_MR; i++) {
                const Py_ssize_t m = mb * CV_MR + i;
                const v16f bias = cv_bcast(j->b && m < j->M ? j->b[m] : 0.0f);
                const v16f lo = cv_bcast(j->lo), hi = cv_bcast(j->hi);
                float *dst = band + i * j->bs + (q - a * Wq);
                for (int v = 0; v < nv; v++)
                    *(v16f_u *)(dst + 16 * v) = v16_clip(*(const v16f *)(o + (i * nv + v) * 16) + bias, lo, hi);
            }
        }
        for (int i = 0; i < CV_MR && mb * CV_MR + i < j->M; i++)
            cp_pool(j, band + i * j->bs, a, pr0, pr1, vm, j->y + (mb * CV_MR + i) * j->POH * j->POW);
    }
}

static PyObject *conv_maxpool(PyObject *self, PyObject *args)
{
    PyObject *xo, *wo, *bo, *yo;
    Py_ssize_t C, H, W, M, KH, KW, sh, sw, pt, pl, OH, OW, POH, POW;
    float lo, hi;
    int threads;
    if (!PyArg_ParseTuple(args, "OOOO(nnn)(nnn)(nn)(nn)(nn)ff(nn)i:conv_maxpool", &xo, &wo, &bo, &yo, &C, &H, &W,
                          &M, &KH, &KW, &sh, &sw, &pt, &pl, &OH, &OW, &lo, &hi, &POH, &POW, &threads))
        return NULL;
    if (C < 1 || H < 1 || W < 1 || M < 1 || KH < 1 || KW < 1 || sh < 1 || sw < 1 || sh > 2 || sw > 2 ||
        pt < 0 || pl < 0 || OH < 1 || OW < 1 || POH != (OH - 1) / 2 + 1 || POW != (OW - 1) / 2 + 1) {
        PyErr_SetString(PyExc_ValueError, "conv_maxpool: bad sizes, strides (1 or 2) or pooled sizes "
                                          "(a 3x3 stride-2 pool padded by 1)");
        return NULL;
    }
    if (!rc_conv_fast) {
        PyErr_SetString(PyExc_ValueError, "conv_maxpool: needs AVX-512 (CONV_FAST)");
        return NULL;
    }
    const Py_ssize_t T = KH * KW, K = C * T, Mb = (M + CV_MR - 1) / CV_MR;
    const Py_ssize_t Hp = (OH - 1) * sh + KH, Wp = (OW - 1) * sw + KW;
    const Py_ssize_t Hq = (Hp + sh - 1) / sh, Wq = (Wp + sw - 1) / sw, L = Hq * Wq + Wq + 32;
    Py_buffer v[4];
    const rc_buf spec[4] = {{xo, C * H * W, RC_F32, 0, 0, "X"}, {wo, Mb * K * CV_MR, RC_F32, 0, 0, "W"},
                            {bo, M, RC_F32, 0, 1, "B"}, {yo, M * POH * POW, RC_F32, 1, 0, "Y"}};
    if (get_buffers("conv_maxpool", spec, v, 4) < 0)
        return NULL;
    Py_ssize_t toff[64];
    Py_ssize_t *tp = T <= 64 ? toff : (Py_ssize_t *)malloc((size_t)T * sizeof(Py_ssize_t));
    if (!tp) {
        release_buffers(v, 4);
        return PyErr_NoMemory();
    }
    cv_fill_job f = {(const float *)v[0].buf, NULL, C, H, W, pt, pl, sh, sw, Hp, Wp, Wq, L, {0}};
    cv_taps(KH, KW, 1, 1, 0, 0, tp, &f);
    const Py_ssize_t nband = (POH + CP_BAND - 1) / CP_BAND;
    /* a band's rows (2 CP_BAND + 1) and a tile's overrun, a channel each */
    const Py_ssize_t bs = ((2 * CP_BAND + 1) * Wq + CV_NR + 15) / 16 * 16;
    const Py_ssize_t scratch_n = CV_MR * bs + 16 + (OW + 48 + 15) / 16 * 16 + CV_MR * CV_NR;
    int fthreads = threads;
    const int parts = rc_parts(2.0 * (double)Mb * CV_MR * (double)(OH * Wq) * (double)K, 2.5e5, Mb * nband, &threads);
    const int fparts = rc_parts((double)(C * sh * sw * L), 16384.0, C, &fthreads);
    const size_t plane_bytes = ((size_t)(C * sh * sw * L) * sizeof(float) + 63) & ~(size_t)63;
    const size_t work = plane_bytes + (size_t)parts * scratch_n * sizeof(float);
    float *planes = (float *)rc_work(work);
    if (!planes) {
        if (tp != toff)
            free(tp);
        release_buffers(v, 4);
        return PyErr_NoMemory();
    }
    cp_job j = {planes, (const float *)v[1].buf, (const float *)v[2].buf, (float *)v[3].buf, tp,
                planes + plane_bytes / sizeof(float), T, C, sh * sw * L, M, Mb, Wq, OH, OW, POH, POW, nband, bs,
                scratch_n, lo, hi};
    f.planes = planes;
    Py_BEGIN_ALLOW_THREADS
    rc_parallel(cv_fill_part, &f, fparts, fthreads);
    rc_parallel(cp_part, &j, parts, threads);
    Py_END_ALLOW_THREADS
    rc_work_done(planes, work);
    if (tp != toff)
        free(tp);
    release_buffers(v, 4);
    Py_RETURN_NONE;
}
#endif

/* ---------------------------------------------------------------------------------------
 * gemm_rows: y[R][N] = a[R][K] @ B for a few rows (a classifier head at batch 1-8), B given
 * as b[N][K] (trans: ONNX Gemm's transB, a PyTorch Linear) or b[K][N], on the kernel
 * threads split over N. BLAS woke its worker threads for this, which then spun on the
 * cores into the next run; numpy's einsum took 2.5x BLAS's time.
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

static PyObject *gemm_rows(PyObject *self, PyObject *args)
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
    Py_buffer v[3];
    const rc_buf spec[3] = {{ao, R * K, RC_F32, 0, 0, "A"}, {bo, K * N, RC_F32, 0, 0, "B"},
                            {yo, R * N, RC_F32, 1, 0, "Y"}};
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
 * and its epilogue while the block is in cache. numpy's matmul ran OpenBLAS's own threads,
 * whose workers then spun (a quarter of MobileNetV2's CPU time) on the cores the depthwise
 * layer between two GEMMs wanted, and the epilogue was a second pass over y.
 * --------------------------------------------------------------------------------------- */
#include <dlfcn.h>

typedef void (*rc_sgemm_f)(char *, char *, int *, int *, int *, float *, float *, int *, float *,
                           int *, float *, float *, int *);
static rc_sgemm_f rc_sgemm = NULL;

/* set_sgemm(capsule) -> the path of the library it lives in (or None) */
static PyObject *set_sgemm(PyObject *self, PyObject *cap)
{
    if (!PyCapsule_CheckExact(cap)) {
        PyErr_SetString(PyExc_TypeError, "set_sgemm: a capsule of scipy.linalg.cython_blas is needed");
        return NULL;
    }
    void *f = PyCapsule_GetPointer(cap, PyCapsule_GetName(cap));
    if (!f)
        return NULL;
    rc_sgemm = (rc_sgemm_f)f;
    /* the capsule holds cython_blas's wrapper: the BLAS library is the one its sgemm symbol
       resolves to among the wrapper module's dependencies (SciPy's OpenBLAS names it
       scipy_sgemm_, a system BLAS sgemm_) */
    Dl_info info;
    if (!dladdr(f, &info) || !info.dli_fname)
        Py_RETURN_NONE;
    void *h = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        Py_RETURN_NONE;
    const char *names[] = {"scipy_sgemm_", "sgemm_", "scipy_sgemm", "sgemm"};
    PyObject *path = NULL;
    for (int i = 0; i < 4 && !path; i++) {
        void *g = dlsym(h, names[i]);
        Dl_info gi;
        if (g && dladdr(g, &gi) && gi.dli_fname && strcmp(gi.dli_fname, info.dli_fname) != 0)
            path = PyUnicode_DecodeFSDefault(gi.dli_fname);
    }
    dlclose(h);
    if (path)
        return path;
    Py_RETURN_NONE;
}

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

static PyObject *pointwise(PyObject *self, PyObject *args)
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
    Py_buffer v[5];
    const rc_buf spec[5] = {{wo, M * K, RC_F32, 0, 0, "W"}, {xo, K * P, RC_F32, 0, 0, "X"},
                            {bo, M, RC_F32, 0, 1, "B"}, {zo, M * P, RC_F32, 0, 1, "Z"},
                            {yo, M * P, RC_F32, 1, 0, "Y"}};
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

/* skip_layer_norm: onnxruntime's SkipLayerNormalization in float32, one pass a row: the sum
 * x + skip (+ bias) is written to y (or to the sum output when it is wanted), its mean and
 * variance from 16 float running sums added in double, then y = (s - mean) / sqrt(var + eps) * gamma (+ beta). numpy
 * needed ~9 passes over the activations (ViT-tiny's 197 x 192: ~220 us a call). skip may
 * hold fewer rows than x (a rank-3 skip of batch 1): row r reads skip row r % skip_rows. y
 * may be x or skip (each element is read before it is written). */
RC_CLONES
static void sln_rows(const float *x, const float *skip, const float *restrict gamma,
                     const float *restrict beta, const float *restrict bias, float *y,
                     float *restrict mean_out, float *restrict inv_out, float *sum_out,
                     Py_ssize_t rows, Py_ssize_t d, Py_ssize_t skip_rows, float eps)
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
        const float mean = (float)(acc / (double)d);
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

static PyObject *skip_layer_norm(PyObject *self, PyObject *args)
{
    PyObject *xo, *so, *go, *bo, *bio, *yo, *mo, *io, *sumo;
    Py_ssize_t rows, d, skip_rows;
    float eps;
    if (!PyArg_ParseTuple(args, "OOOOOOOOO(nnn)f:skip_layer_norm", &xo, &so, &go, &bo, &bio, &yo, &mo,
                          &io, &sumo, &rows, &d, &skip_rows, &eps))
        return NULL;
    if (rows < 0 || d < 1 || skip_rows < 1 || (rows > 0 && rows % skip_rows != 0)) {
        PyErr_SetString(PyExc_ValueError,
                        "skip_layer_norm: rows must be a multiple of skip_rows, d and skip_rows >= 1");
        return NULL;
    }
    Py_buffer v[9]; /* X, skip, gamma, beta, bias, Y, mean, inv_std_var, sum */
    const rc_buf spec[9] = {{xo, rows * d, RC_F32, 0, 0, "X"}, {so, skip_rows * d, RC_F32, 0, 1, "skip"},
                            {go, d, RC_F32, 0, 0, "gamma"}, {bo, d, RC_F32, 0, 1, "beta"},
                            {bio, d, RC_F32, 0, 1, "bias"}, {yo, rows * d, RC_F32, 1, 0, "Y"},
                            {mo, rows, RC_F32, 1, 1, "mean"}, {io, rows, RC_F32, 1, 1, "inv_std_var"},
                            {sumo, rows * d, RC_F32, 1, 1, "sum"}};
    if (get_buffers("skip_layer_norm", spec, v, 9) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    sln_rows((const float *)v[0].buf, (const float *)v[1].buf, (const float *)v[2].buf,
             (const float *)v[3].buf, (const float *)v[4].buf, (float *)v[5].buf, (float *)v[6].buf,
             (float *)v[7].buf, (float *)v[8].buf, rows, d, skip_rows, eps);
    Py_END_ALLOW_THREADS
    release_buffers(v, 9);
    Py_RETURN_NONE;
}

/* maxpool2d: MaxPool values of float32 NCHW planes (no indices). Taps in the padding are
 * skipped, as a -inf fill would skip them; NaN propagates as with numpy's maximum. Separable
 * and unit-stride: each input row, padded with -inf and split into its sw column phases, gives
 * the row maximum of every output column (a tap is one phase at one offset), then each output
 * row is the maximum of its window's row maxima. Planes are split between the kernel threads. */
typedef struct {
    const float *x;
    float *y;
    Py_ssize_t planes, H, W, OH, OW, KH, KW, sh, sw, dh, dw, pt, pl;
    float *scratch; /* a part's: a row's sw column phases (sw x Lq) and the row maxima (H x OW) */
    Py_ssize_t scratch_n, Lq;
} mp_job;

RC_INLINE float mp_max(float m, float v) { return ((v > m) | (v != v)) ? v : m; }

RC_CLONES
static void mp_planes(const mp_job *j, float *scratch, Py_ssize_t p0, Py_ssize_t p1)
{
    const Py_ssize_t H = j->H, W = j->W, OH = j->OH, OW = j->OW, sw = j->sw, Lq = j->Lq;
    const Py_ssize_t KW = j->KW, pl = j->pl;
    float *restrict ph = scratch;               /* sw phases of Lq floats */
    float *restrict hm = scratch + sw * Lq;     /* row maxima, H x OW */
    for (Py_ssize_t i = 0; i < sw * Lq; i++)
        ph[i] = -INFINITY;                      /* padding: written once, never overwritten */
    /* decided once, not a row at a time (their divisions were most of the time): for each
       column phase b its first input column k0, where it lands, and how many; for each tap
       where in the phases its output columns start */
    Py_ssize_t k0s[sw], doff[sw], cnt[sw], toff[KW];
    for (Py_ssize_t b = 0; b < sw; b++) {
        const Py_ssize_t k0 = ((b - pl) % sw + sw) % sw;
        k0s[b] = k0;
        doff[b] = b * Lq + (k0 + pl) / sw;
        cnt[b] = k0 < W ? (W - k0 + sw - 1) / sw : 0;
    }
    for (Py_ssize_t kw = 0; kw < KW; kw++) {
        const Py_ssize_t c = kw * j->dw;
        toff[kw] = (c % sw) * Lq + c / sw;
    }
    for (Py_ssize_t p = p0; p < p1; p++) {
        const float *xp = j->x + p * H * W;
        float *yp = j->y + p * OH * OW;
        for (Py_ssize_t r = 0; r < H; r++) {
            const float *restrict xr = xp + r * W;
            if (sw == 1) {
                float *restrict d = ph + doff[0];
                for (Py_ssize_t i = 0; i < W; i++)
                    d[i] = xr[i];
            } else if (sw == 2) {
                for (Py_ssize_t b = 0; b < 2; b++) {
                    float *restrict d = ph + doff[b];
                    const float *restrict s0 = xr + k0s[b];
                    for (Py_ssize_t i = 0; i < cnt[b]; i++)
                        d[i] = s0[2 * i];
                }
            } else {
                for (Py_ssize_t b = 0; b < sw; b++) {
                    float *restrict d = ph + doff[b];
                    const float *restrict s0 = xr + k0s[b];
                    for (Py_ssize_t i = 0; i < cnt[b]; i++)
                        d[i] = s0[i * sw];
                }
            }
            /* the first tap sets the row maxima (max(-inf, v) is v, NaN included) */
            float *restrict hr = hm + r * OW;
            const float *restrict s0 = ph + toff[0];
            for (Py_ssize_t ow = 0; ow < OW; ow++)
                hr[ow] = s0[ow];
            for (Py_ssize_t kw = 1; kw < KW; kw++) {
                const float *restrict src = ph + toff[kw];
                for (Py_ssize_t ow = 0; ow < OW; ow++)
                    hr[ow] = mp_max(hr[ow], src[ow]);
            }
        }
        for (Py_ssize_t oh = 0; oh < OH; oh++) {
            float *restrict yr = yp + oh * OW;
            int first = 1;
            for (Py_ssize_t kh = 0; kh < j->KH; kh++) {
                const Py_ssize_t ir = oh * j->sh - j->pt + kh * j->dh;
                if (ir < 0 || ir >= H)
                    continue;
                const float *restrict hr = hm + ir * OW;
                if (first)
                    for (Py_ssize_t ow = 0; ow < OW; ow++)
                        yr[ow] = hr[ow];
                else
                    for (Py_ssize_t ow = 0; ow < OW; ow++)
                        yr[ow] = mp_max(yr[ow], hr[ow]);
                first = 0;
            }
            if (first) /* a window of padding only */
                for (Py_ssize_t ow = 0; ow < OW; ow++)
                    yr[ow] = -INFINITY;
        }
    }
}

static void mp_part(void *arg, int part, int parts)
{
    const mp_job *j = (const mp_job *)arg;
    mp_planes(j, j->scratch + part * j->scratch_n, j->planes * part / parts,
              j->planes * (part + 1) / parts);
}

static PyObject *maxpool2d(PyObject *self, PyObject *args)
{
    PyObject *xo, *yo;
    Py_ssize_t N, C, H, W, OH, OW, KH, KW, sh, sw, dh, dw, pt, pl;
    int threads, fast = 1;
    if (!PyArg_ParseTuple(args, "OO(nnnn)(nn)(nn)(nn)(nn)(nn)i|p:maxpool2d", &xo, &yo, &N, &C, &H, &W,
                          &OH, &OW, &KH, &KW, &sh, &sw, &dh, &dw, &pt, &pl, &threads, &fast))
        return NULL;
    if (N < 0 || C < 0 || H < 1 || W < 1 || OH < 0 || OW < 0 || KH < 1 || KW < 1 || sh < 1 ||
        sw < 1 || dh < 1 || dw < 1 || pt < 0 || pl < 0) {
        PyErr_SetString(PyExc_ValueError, "maxpool2d: negative or zero size, stride or dilation");
        return NULL;
    }
    Py_buffer v[2];
    const rc_buf spec[2] = {{xo, N * C * H * W, RC_F32, 0, 0, "X"}, {yo, N * C * OH * OW, RC_F32, 1, 0, "Y"}};
    if (get_buffers("maxpool2d", spec, v, 2) < 0)
        return NULL;
#if DWF_OK
    /* 3x3, dilation 1, stride 1 or 2 both ways (ResNet's): depthwise2d's AVX-512 phase planes,
       the window's maximum instead of its weighted sum (64 x 112 x 112 stride 2: ~300 us
       against onnxruntime's ~110 with row maxima over scalar column phases) */
    if (fast && dwf_takes(KH, KW, sh, sw, dh, dw, OH, OW, N * C)) {
        dwf_job fj = {(const float *)v[0].buf, NULL, NULL, (float *)v[1].buf, N * C, 1, H, W, OH, OW, sh,
                      pt, pl, 0, 0, 0, 0, 0.0f, 0.0f, NULL, 0, 1};
        return dwf_run(&fj, threads, v, 2);
    }
#endif
    /* a phase holds the padded row up to the last output's last tap, or the whole input row */
    Py_ssize_t Wr = (OW ? (OW - 1) * sw + (KW - 1) * dw + 1 : 0);
    if (Wr < pl + W)
        Wr = pl + W;
    const Py_ssize_t Lq = (Wr + sw - 1) / sw + 1;
    /* channel planes split between the kernel threads, a thread from about 64K window taps */
    const int parts = rc_parts((double)(N * C) * (double)(OH * OW) * (double)(KH * KW), 65536.0, N * C,
                               &threads);
    const Py_ssize_t scratch_n = sw * Lq + H * OW;
    float *scratch = (float *)malloc((size_t)(parts * scratch_n) * sizeof(float));
    if (!scratch) {
        release_buffers(v, 2);
        return PyErr_NoMemory();
    }
    mp_job j = {(const float *)v[0].buf, (float *)v[1].buf, N * C, H, W, OH, OW, KH, KW, sh, sw,
                dh, dw, pt, pl, scratch, scratch_n, Lq};
    Py_BEGIN_ALLOW_THREADS
    rc_parallel(mp_part, &j, parts, threads);
    Py_END_ALLOW_THREADS
    free(scratch);
    release_buffers(v, 2);
    Py_RETURN_NONE;
}

/* softmax_rows: the softmax of every row of z in place, the numpy path's arithmetic
 * (ops/fused._softmax_inplace) in one pass a row: the row maximum (0 where it is not finite),
 * exp of the differences (exactly 0 below exp's float range, as numpy's exp gives), their sum
 * from 8 running sums, one multiply by its reciprocal. numpy took ~7 passes and a BLAS call
 * for the sums (12 heads x 128 x 128 scores: ~1.9 ms a call). */
RC_CLONES
static void softmax_rows(float *z, Py_ssize_t rows, Py_ssize_t t)
{
    float tail[8];
    for (Py_ssize_t r = 0; r < rows; r++) {
        float *zr = z + r * t;
        /* the maximum in 8 lanes (NaN never wins a comparison: a NaN row stays NaN through
           its exp and sum, as in numpy) */
        v8f mx = v8_set1(-INFINITY);
        Py_ssize_t i0 = 0;
        for (; i0 + 8 <= t; i0 += 8) {
            const v8f x = v8_load(zr + i0);
            mx = v8_select(x > mx, x, mx);
        }
        float m = -INFINITY;
        for (int j = 0; j < 8; j++)
            m = mx[j] > m ? mx[j] : m;
        for (; i0 < t; i0++)
            m = zr[i0] > m ? zr[i0] : m;
        if (!(m > -INFINITY && m < INFINITY))
            m = 0.0f;
        const v8f mv = v8_set1(m), lo = v8_set1(-87.3f), zero = v8_set1(0.0f);
        v8f acc = zero;
        Py_ssize_t i = 0;
        for (; i + 8 <= t; i += 8) {
            const v8f d = v8_load(zr + i) - mv;
            const v8f e = v8_select(d < lo, zero, v8_exp(d));
            v8_store(zr + i, e);
            acc += e;
        }
        float sum = 0.0f;
        if (i < t) {
            const Py_ssize_t k = t - i;
            for (Py_ssize_t j = 0; j < 8; j++)
                tail[j] = j < k ? zr[i + j] - m : -INFINITY;
            const v8f d = v8_load(tail);
            v8_store(tail, v8_select(d < lo, zero, v8_exp(d)));
            for (Py_ssize_t j = 0; j < k; j++) {
                zr[i + j] = tail[j];
                sum += tail[j];
            }
        }
        for (int j = 0; j < 8; j++)
            sum += acc[j];
        const float inv = 1.0f / sum;
        for (i = 0; i < t; i++)
            zr[i] *= inv;
    }
}

static PyObject *softmax(PyObject *self, PyObject *args)
{
    PyObject *zo;
    Py_ssize_t rows, t;
    if (!PyArg_ParseTuple(args, "O(nn):softmax", &zo, &rows, &t))
        return NULL;
    if (rows < 0 || t < 1) {
        PyErr_SetString(PyExc_ValueError, "softmax: negative size or empty rows");
        return NULL;
    }
    Py_buffer v[1];
    const rc_buf spec[1] = {{zo, rows * t, RC_F32, 1, 0, "Z"}};
    if (get_buffers("softmax", spec, v, 1) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    softmax_rows((float *)v[0].buf, rows, t);
    Py_END_ALLOW_THREADS
    release_buffers(v, 1);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------
 * linear: y (R x N) = a (R x K) w (K x N) (+ bias), w packed once as [ceil(N / 32)][K][32]
 * (ops/nn._pack_linear, 64-byte aligned), or given as it is (K x N) and packed a chunk at a
 * time. The rows of a are first packed in 12-row panels [ceil(R / 12)][K][12] (zeros past
 * R), shared by the threads; then each unit (a 32-column
 * panel of y and a block of row panels) sums K in chunks of at most LN_KC terms whose 32 KB
 * of weights stay in L1 while every row panel of the block passes over them, 12 rows x 32
 * columns in 24 AVX-512 accumulators, each step two weight vectors and 12 broadcasts.
 * numpy's threaded OpenBLAS ran BERT-base's projections at about 160 GFLOP/s on this
 * machine's two cores against onnxruntime's prepacked MLAS at 190-230, and its worker
 * threads spun through the nodes between two GEMMs.
 * --------------------------------------------------------------------------------------- */
#define LN_RP 12  /* rows a panel */
#define LN_KC 256 /* most terms a chunk */

/* pointwise_lanes's epilogue in a tile's last chunk: row p of the tile gets rb[p] (or 0),
 * plus z[p * ldz + ...] when z is set, clipped to [lo, hi] */
typedef struct {
    const float *rb, *z;
    Py_ssize_t ldz;
    float lo, hi;
} ln_epi;

typedef void (*ln_tile_f)(const float *restrict, const float *restrict, Py_ssize_t, Py_ssize_t,
                          float *restrict, Py_ssize_t, const float *restrict, int, const char *,
                          Py_ssize_t, Py_ssize_t, const ln_epi *);

/* c[p][0 .. 32) = sum over k of ap[k * 12 + p] * wp[k * ldw + ...], plus (init ? bias (or 0) :
 * what c[p] holds), then e's epilogue when given; and npf rows of 128 bytes from pf (pfs
 * bytes apart) asked into L2, one a step */
#define LN_TILE(NP)                                                                              \
    CV_CLONES static void ln_tile##NP(const float *restrict ap, const float *restrict wp,          \
                                      Py_ssize_t kn, Py_ssize_t ldw, float *restrict c,            \
                                      Py_ssize_t ldc,                                              \
                                      const float *restrict bias, int init, const char *pf,        \
                                      Py_ssize_t pfs, Py_ssize_t npf, const ln_epi *e)             \
    {                                                                                            \
        /* from zeros, what c holds (or the bias) added at the end: the accumulators stay in \
           registers (loaded before the loop, GCC moved them through the stack) */              \
        v16f acc[NP][2];                                                                         \
        for (int p = 0; p < NP; p++) {                                                           \
            acc[p][0] = (v16f){0};                                                               \
            acc[p][1] = (v16f){0};                                                               \
        }                                                                                        \
        for (Py_ssize_t k = 0; k < kn; k++) {                                                    \
            if (npf > 0) {                                                                       \
                __builtin_prefetch(pf, 0, 2);                                                    \
                __builtin_prefetch(pf + 64, 0, 2);                                               \
                pf += pfs;                                                                       \
                npf--;                                                                           \
            }                                                                                    \
            const v16f w0 = *(const v16f_u *)(wp + ldw * k);                                     \
            const v16f w1 = *(const v16f_u *)(wp + ldw * k + 16);                                \
            for (int p = 0; p < NP; p++) {                                                       \
                const v16f x = cv_bcast(ap[LN_RP * k + p]);                                      \
                acc[p][0] += x * w0;                                                             \
                acc[p][1] += x * w1;                                                             \
            }                                                                                    \
        }                                                                                        \
        if (!init)                                                                               \
            for (int p = 0; p < NP; p++) {                                                       \
                acc[p][0] += *(const v16f_u *)(c + p * ldc);                                     \
                acc[p][1] += *(const v16f_u *)(c + p * ldc + 16);                                \
            }                                                                                    \
        if (e) {                                                                                 \
            const v16f lo = cv_bcast(e->lo), hi = cv_bcast(e->hi);                               \
            for (int p = 0; p < NP; p++)                                                         \
                for (int v = 0; v < 2; v++) {                                                    \
                    v16f t = acc[p][v] + cv_bcast(e->rb ? e->rb[p] : 0.0f);                      \
                    if (e->z)                                                                    \
                        t += *(const v16f_u *)(e->z + p * e->ldz + 16 * v);                      \
                    *(v16f_u *)(c + p * ldc + 16 * v) = v16_clip(t, lo, hi);                     \
                }                                                                                \
        } else if (!init || !bias)                                                               \
            for (int p = 0; p < NP; p++) {                                                       \
                *(v16f_u *)(c + p * ldc) = acc[p][0];                                            \
                *(v16f_u *)(c + p * ldc + 16) = acc[p][1];                                       \
            }                                                                                    \
        else                                                                                     \
            for (int p = 0; p < NP; p++) {                                                       \
                *(v16f_u *)(c + p * ldc) = acc[p][0] + *(const v16f_u *)bias;                    \
                *(v16f_u *)(c + p * ldc + 16) = acc[p][1] + *(const v16f_u *)(bias + 16);        \
            }                                                                                    \
    }
LN_TILE(1)
LN_TILE(2)
LN_TILE(3)
LN_TILE(4)
LN_TILE(5)
LN_TILE(6)
LN_TILE(7)
LN_TILE(8)
LN_TILE(9)
LN_TILE(10)
LN_TILE(11)
LN_TILE(12)
static const ln_tile_f ln_tiles[LN_RP + 1] = {NULL, ln_tile1, ln_tile2, ln_tile3, ln_tile4,
                                              ln_tile5, ln_tile6, ln_tile7, ln_tile8, ln_tile9,
                                              ln_tile10, ln_tile11, ln_tile12};

typedef struct {
    const float *a, *wp, *bias;
    float *ap, *y;
    Py_ssize_t R, K, N, kc, bp; /* bp: row panels a unit */
    int packed;                 /* wp packed [ceil(N / 32)][K][32], else w itself, K x N */
} ln_job;

/* the weights of column panel cb, terms [k0, k0 + kn), from an unpacked K x N w into buf
 * [kn][32] (zeros past N) */
static void ln_pack_w(const ln_job *j, Py_ssize_t cb, Py_ssize_t k0, Py_ssize_t kn, float *restrict buf)
{
    const Py_ssize_t n0 = cb * 32, nn = j->N - n0 < 32 ? j->N - n0 : 32;
    const float *w = j->wp + k0 * j->N + n0;
    for (Py_ssize_t k = 0; k < kn; k++) {
        if (nn == 32)
            memcpy(buf + k * 32, w + k * j->N, 32 * sizeof(float));
        else {
            memcpy(buf + k * 32, w + k * j->N, (size_t)nn * sizeof(float));
            memset(buf + k * 32 + nn, 0, (size_t)(32 - nn) * sizeof(float));
        }
    }
}

static void ln_pack_part(void *arg, int part, int parts)
{
    const ln_job *j = (const ln_job *)arg;
    const Py_ssize_t np_ = (j->R + LN_RP - 1) / LN_RP;
    for (Py_ssize_t q = np_ * part / parts; q < np_ * (part + 1) / parts; q++) {
        float *restrict dst = j->ap + q * j->K * LN_RP;
        const Py_ssize_t r0 = q * LN_RP, nr = j->R - r0 < LN_RP ? j->R - r0 : LN_RP;
        const float *src = j->a + r0 * j->K;
        if (nr == LN_RP) {
            /* 12 rows read side by side, the panel written in order */
            for (Py_ssize_t k = 0; k < j->K; k++)
                for (int p = 0; p < LN_RP; p++)
                    dst[k * LN_RP + p] = src[p * j->K + k];
            continue;
        }
        for (Py_ssize_t k = 0; k < j->K; k++)
            for (int p = 0; p < LN_RP; p++)
                dst[k * LN_RP + p] = p < nr ? src[p * j->K + k] : 0.0f;
    }
}

static void ln_part(void *arg, int part, int parts)
{
    const ln_job *j = (const ln_job *)arg;
    const Py_ssize_t np_ = (j->R + LN_RP - 1) / LN_RP, nb = (np_ + j->bp - 1) / j->bp;
    const Py_ssize_t cols = (j->N + 31) / 32, units = cols * nb;
    float tail[LN_RP * 32] __attribute__((aligned(64)));
    float btail[32];
    /* a chunk of unpacked weights, packed here (kc <= LN_KC; the caller's work buffer
       holds the packed rows of a) */
    float wbuf[LN_KC * 32] __attribute__((aligned(64)));
    for (Py_ssize_t u = units * part / parts; u < units * (part + 1) / parts; u++) {
        const Py_ssize_t cb = u / nb, q0 = (u - cb * nb) * j->bp;
        const Py_ssize_t q1 = q0 + j->bp < np_ ? q0 + j->bp : np_;
        const Py_ssize_t n0 = cb * 32, nn = j->N - n0 < 32 ? j->N - n0 : 32;
        const float *bias = j->bias ? j->bias + n0 : NULL;
        if (bias && nn < 32) {
            for (Py_ssize_t i = 0; i < 32; i++)
                btail[i] = i < nn ? bias[i] : 0.0f;
            bias = btail;
        }
        for (Py_ssize_t k0 = 0; k0 < j->K; k0 += j->kc) {
            const Py_ssize_t kn = j->K - k0 < j->kc ? j->K - k0 : j->kc;
            const float *wp = j->wp + (cb * j->K + k0) * 32;
            /* unpacked weights: this chunk packed here, and the next one (the next panel's
               first after the last) asked into L2 by the first row panel, a row a step:
               its rows are 128 bytes N floats apart, which the hardware's prefetcher does
               not follow */
            const char *pf = NULL;
            Py_ssize_t npf = 0;
            if (!j->packed) {
                ln_pack_w(j, cb, k0, kn, wbuf);
                wp = wbuf;
                if (k0 + kn < j->K) {
                    pf = (const char *)(j->wp + (k0 + kn) * j->N + n0);
                    npf = j->K - k0 - kn < j->kc ? j->K - k0 - kn : j->kc;
                } else if (cb + 1 < cols) {
                    pf = (const char *)(j->wp + n0 + 32);
                    npf = j->kc < j->K ? j->kc : j->K;
                }
            }
            /* packed weights: the next chunk (or the next unit's first), contiguous, asked
               into L2 a share by each row panel after the first (rc_pf_share, rows of 128
               bytes): BERT-base's weights, 28 MB a layer, come from memory every run */
            const char *nx = NULL;
            Py_ssize_t nbytes = 0;
            if (j->packed) {
                if (k0 + kn < j->K) {
                    nx = (const char *)(wp + kn * 32);
                    nbytes = (Py_ssize_t)sizeof(float) * 32 * (j->K - k0 - kn < j->kc ? j->K - k0 - kn : j->kc);
                } else if (u + 1 < units * (part + 1) / parts) {
                    nx = (const char *)(j->wp + ((u + 1) / nb) * j->K * 32);
                    nbytes = (Py_ssize_t)sizeof(float) * 32 * (j->kc < j->K ? j->kc : j->K);
                }
            }
            for (Py_ssize_t q = q0; q < q1; q++) {
                const Py_ssize_t r0 = q * LN_RP, nr = j->R - r0 < LN_RP ? j->R - r0 : LN_RP;
                const float *ap = j->ap + (q * j->K + k0) * LN_RP;
                float *c = j->y + r0 * j->N + n0;
                const char *qpf = pf;
                Py_ssize_t qnpf = q == q0 ? npf : 0, pfs = (Py_ssize_t)sizeof(float) * j->N;
                if (nx) {
                    qnpf = rc_pf_share(nx, nbytes, q1 - q0 - 1, q - q0 - 1, 128, &qpf);
                    pfs = 128;
                }
                if (nn == 32) {
                    ln_tiles[nr](ap, wp, kn, 32, c, j->N, bias, k0 == 0, qpf, pfs, qnpf, NULL);
                    continue;
                }
                /* the last panel of an N not a multiple of 32: through a whole-width tile */
                if (k0 > 0)
                    for (Py_ssize_t p = 0; p < nr; p++)
                        memcpy(tail + p * 32, c + p * j->N, sizeof(float) * nn);
                ln_tiles[nr](ap, wp, kn, 32, tail, 32, bias, k0 == 0, qpf, pfs, qnpf, NULL);
                for (Py_ssize_t p = 0; p < nr; p++)
                    memcpy(c + p * j->N, tail + p * 32, sizeof(float) * nn);
            }
        }
    }
}

/* the products of j on up to threads threads (j->ap packed; j->kc and j->bp set here) */
static void ln_run(ln_job *j, int threads)
{
    const Py_ssize_t cols = (j->N + 31) / 32, np_ = (j->R + LN_RP - 1) / LN_RP;
    /* K in chunks of at most LN_KC terms, as even as they go */
    const Py_ssize_t nk = (j->K + LN_KC - 1) / LN_KC;
    j->kc = (j->K + nk - 1) / nk;
    /* row panels split into blocks only when the column panels are too few for the threads */
    j->bp = np_;
    if (cols < 4 * (Py_ssize_t)threads) {
        Py_ssize_t nb = (4 * (Py_ssize_t)threads + cols - 1) / cols;
        if (nb > np_)
            nb = np_;
        j->bp = (np_ + nb - 1) / nb;
    }
    const Py_ssize_t units = cols * ((np_ + j->bp - 1) / j->bp);
    const int parts = rc_parts(2.0 * (double)j->R * (double)j->K * (double)j->N, 2.5e5, units, &threads);
    rc_parallel(ln_part, j, parts, threads);
}

static PyObject *linear(PyObject *self, PyObject *args)
{
    PyObject *ao, *wo, *bo, *yo;
    Py_ssize_t R, K, N;
    int threads, packed = 1;
    if (!PyArg_ParseTuple(args, "OOOO(nnn)i|p:linear", &ao, &wo, &bo, &yo, &R, &K, &N, &threads, &packed))
        return NULL;
    if (R < 1 || K < 1 || N < 1 || R > PY_SSIZE_T_MAX / 64 / K || N > PY_SSIZE_T_MAX / 64 / K) {
        PyErr_SetString(PyExc_ValueError, "linear: sizes must be positive (and not overflow)");
        return NULL;
    }
    const Py_ssize_t cols = (N + 31) / 32, np_ = (R + LN_RP - 1) / LN_RP;
    Py_buffer v[4];
    const rc_buf spec[4] = {{ao, R * K, RC_F32, 0, 0, "A"}, {wo, packed ? cols * K * 32 : K * N, RC_F32, 0, 0, "W"},
                            {bo, N, RC_F32, 0, 1, "bias"}, {yo, R * N, RC_F32, 1, 0, "Y"}};
    if (get_buffers("linear", spec, v, 4) < 0)
        return NULL;
    if (packed && ((uintptr_t)v[1].buf & 63) != 0) {
        release_buffers(v, 4);
        PyErr_SetString(PyExc_ValueError, "linear: packed weights must be 64-byte aligned");
        return NULL;
    }
    const size_t apn = sizeof(float) * (size_t)np_ * (size_t)K * LN_RP;
    /* the caller's kept work buffer (the parts below use none): a fresh allocation of this
       size faulted its pages in again on many calls */
    float *ap = (float *)rc_work(apn);
    if (!ap) {
        release_buffers(v, 4);
        return PyErr_NoMemory();
    }
    ln_job j = {(const float *)v[0].buf, (const float *)v[1].buf, (const float *)v[2].buf, ap,
                (float *)v[3].buf, R, K, N, 0, np_, packed};
    int pth = threads;
    const int pparts = rc_parts((double)R * (double)K * 8.0, 2.5e5, np_, &pth);
    Py_BEGIN_ALLOW_THREADS
    rc_parallel(ln_pack_part, &j, pparts, pth);
    ln_run(&j, threads);
    Py_END_ALLOW_THREADS
    rc_work_done(ap, apn);
    release_buffers(v, 4);
    Py_RETURN_NONE;
}

/* pointwise_lanes's work: a unit is a group of G 32-position column panels x a block of row
 * panels; per chunk of the channels, every row panel of the block passes over the group's
 * panels one after another. x is read in place (a column panel's rows are P floats apart);
 * only the last, short column panel is copied, zero-padded, into a whole-width one. */
#define PL_XB 8192 /* floats of x a unit's chunk holds: 32 KB, in L1 beside the weights */
typedef struct {
    const float *wp, *x, *b, *z;
    float *y;
    Py_ssize_t M, C, P, kc, G, ngroups, bp, nqb;
    float lo, hi;
} pl_job;

/* rows of nn floats (at most 32) from src, ld apart, into dst [rows][32], zeros past nn */
static void pl_pack32(float *restrict dst, const float *restrict src, Py_ssize_t rows, Py_ssize_t ld, Py_ssize_t nn)
{
    /* a whole row is a constant-size copy (two vector moves), not a libc call */
    if (nn == 32)
        for (Py_ssize_t k = 0; k < rows; k++)
            memcpy(dst + k * 32, src + k * ld, 32 * sizeof(float));
    else
        for (Py_ssize_t k = 0; k < rows; k++) {
            memcpy(dst + k * 32, src + k * ld, (size_t)nn * sizeof(float));
            memset(dst + k * 32 + nn, 0, (size_t)(32 - nn) * sizeof(float));
        }
}

static void pl_part(void *arg, int part, int parts)
{
    const pl_job *j = (const pl_job *)arg;
    const Py_ssize_t P = j->P, C = j->C, np_ = (j->M + LN_RP - 1) / LN_RP, cols = (P + 31) / 32;
    const Py_ssize_t units = j->ngroups * j->nqb, tn = P - (cols - 1) * 32;
    float tail[LN_RP * 32] __attribute__((aligned(64)));
    float xb[PL_XB] __attribute__((aligned(64))); /* the group's chunk of x, [G][kn][32] */
    for (Py_ssize_t u = units * part / parts; u < units * (part + 1) / parts; u++) {
        const Py_ssize_t g = u / j->nqb, qb = u - g * j->nqb;
        const Py_ssize_t cb0 = g * j->G, cb1 = cb0 + j->G < cols ? cb0 + j->G : cols;
        const Py_ssize_t q0 = qb * j->bp, q1 = q0 + j->bp < np_ ? q0 + j->bp : np_;
        if (q0 >= q1)
            continue;
        for (Py_ssize_t k0 = 0; k0 < C; k0 += j->kc) {
            const Py_ssize_t kn = C - k0 < j->kc ? C - k0 : j->kc;
            const int last = k0 + kn == C;
            for (Py_ssize_t cb = cb0; cb < cb1; cb++) {
                const Py_ssize_t n0 = cb * 32, nn = P - n0 < 32 ? P - n0 : 32;
                pl_pack32(xb + (cb - cb0) * kn * 32, j->x + k0 * P + n0, kn, P, nn);
            }
            for (Py_ssize_t q = q0; q < q1; q++) {
                const Py_ssize_t r0 = q * LN_RP, nr = j->M - r0 < LN_RP ? j->M - r0 : LN_RP;
                const float *ap = j->wp + (q * C + k0) * LN_RP;
                for (Py_ssize_t cb = cb0; cb < cb1; cb++) {
                    const Py_ssize_t n0 = cb * 32;
                    const float *xs = xb + (cb - cb0) * kn * 32;
                    float *c = j->y + r0 * P + n0;
                    /* the first row panel's tiles ask the x this panel needs next into L2 (its
                       next chunk, or the next group's first), a row a step: rows P floats
                       apart, which the hardware's prefetcher does not follow */
                    const char *pf = NULL;
                    Py_ssize_t npf = 0;
                    if (q > q0 && q + 1 < q1 && cb == cb0) {
                        /* the other row panels' first tiles ask the next panel's weights of
                           this chunk into L2: panels C * 12 floats apart, each a fresh
                           stream from memory for large weights (1280 x 320: 1.6 MB) */
                        pf = (const char *)(j->wp + ((q + 1) * C + k0) * LN_RP);
                        npf = (kn * LN_RP * (Py_ssize_t)sizeof(float) + 127) / 128;
                    } else if (q == q0 && !last) {
                        pf = (const char *)(j->x + (k0 + kn) * P + n0);
                        npf = C - k0 - kn < j->kc ? C - k0 - kn : j->kc;
                    } else if (q == q0 && cb + j->G < cols) {
                        pf = (const char *)(j->x + n0 + j->G * 32);
                        npf = j->kc;
                    }
                    if (n0 + 32 <= P) {
                        ln_epi e = {j->b ? j->b + r0 : NULL, j->z ? j->z + r0 * P + n0 : NULL, P, j->lo,
                                    j->hi};
                        ln_tiles[nr](ap, xs, kn, 32, c, P, NULL, k0 == 0, pf, q > q0 ? 128 : sizeof(float) * P,
                                     npf, last ? &e : NULL);
                        continue;
                    }
                    if (k0 > 0)
                        for (Py_ssize_t p = 0; p < nr; p++)
                            memcpy(tail + p * 32, c + p * P, sizeof(float) * tn);
                    ln_tiles[nr](ap, xs, kn, 32, tail, 32, NULL, k0 == 0, NULL, 0, 0, NULL);
                    for (Py_ssize_t p = 0; p < nr; p++)
                        memcpy(c + p * P, tail + p * 32, sizeof(float) * tn);
                    if (last)
                        bias_clip_block(c, P, j->b ? j->b + r0 : NULL, j->z ? j->z + r0 * P + n0 : NULL,
                                        nr, tn, j->lo, j->hi);
                }
            }
        }
    }
}

/* pointwise_lanes: a 1x1 convolution of one image, y (M x P) = w (M x C) x (C x P), with
 * linear's tiles: w (constant) packed once in 12-row panels (_pack_rows), x packed 32
 * positions x a chunk of channels at a time, bias, residual and clip in the epilogue while
 * the tile is in cache. */
static PyObject *pointwise_lanes(PyObject *self, PyObject *args)
{
    PyObject *wo, *xo, *bo, *zo, *yo;
    Py_ssize_t M, C, P;
    float lo, hi;
    int threads;
    if (!PyArg_ParseTuple(args, "OOOOO(nnn)ffi:pointwise_lanes", &wo, &xo, &bo, &zo, &yo, &M, &C, &P, &lo,
                          &hi, &threads))
        return NULL;
    if (M < 1 || C < 1 || P < 1 || M > PY_SSIZE_T_MAX / 64 / C || P > PY_SSIZE_T_MAX / 64 / C) {
        PyErr_SetString(PyExc_ValueError, "pointwise_lanes: sizes must be positive (and not overflow)");
        return NULL;
    }
    const Py_ssize_t np_ = (M + LN_RP - 1) / LN_RP;
    Py_buffer v[5];
    const rc_buf spec[5] = {{wo, np_ * C * LN_RP, RC_F32, 0, 0, "W"}, {xo, C * P, RC_F32, 0, 0, "X"},
                            {bo, M, RC_F32, 0, 1, "B"}, {zo, M * P, RC_F32, 0, 1, "Z"},
                            {yo, M * P, RC_F32, 1, 0, "Y"}};
    if (get_buffers("pointwise_lanes", spec, v, 5) < 0)
        return NULL;
    const Py_ssize_t cols = (P + 31) / 32, nk = (C + LN_KC - 1) / LN_KC, kc = (C + nk - 1) / nk;
    /* each row of y written in runs of G panels, the group's chunk of x in L1: a panel at a
       time, MobileNetV2's 96 x 112 x 112 expansion wrote 96 rows of 128 bytes at once, which
       the hardware's prefetcher does not follow (in the model: 0.91-0.95x the run time) */
    Py_ssize_t G = PL_XB / (kc * 32);
    if (G < 1)
        G = 1;
    /* groups enough for the threads: 8 a thread where the positions allow */
    const Py_ssize_t want = 8 * (Py_ssize_t)threads;
    if (G > (cols + want - 1) / want)
        G = (cols + want - 1) / want;
    if (G < 1)
        G = 1;
    const Py_ssize_t ngroups = (cols + G - 1) / G;
    const Py_ssize_t wantq = 4 * (Py_ssize_t)threads;
    Py_ssize_t nqb = ngroups >= wantq ? 1 : (wantq + ngroups - 1) / ngroups;
    if (nqb > np_)
        nqb = np_;
    const Py_ssize_t bp = (np_ + nqb - 1) / nqb;
    nqb = (np_ + bp - 1) / bp;
    pl_job j = {(const float *)v[0].buf, (const float *)v[1].buf, (const float *)v[2].buf,
                (const float *)v[3].buf, (float *)v[4].buf, M, C, P, kc, G, ngroups, bp, nqb, lo, hi};
    const int parts = rc_parts(2.0 * (double)M * (double)C * (double)P, 2.5e5, ngroups * nqb, &threads);
    Py_BEGIN_ALLOW_THREADS
    rc_parallel(pl_part, &j, parts, threads);
    Py_END_ALLOW_THREADS
    release_buffers(v, 5);
    Py_RETURN_NONE;
}

#if DWF_OK
/* expand_dw: an inverted-residual block's expansion (a 1x1 convolution, bias and clip) and
 * the 3x3 depthwise convolution after it (stride 1 or 2 both ways, bias and clip) of one
 * image, without the expanded tensor going through memory. A unit is a panel of 12 expanded
 * channels: their 1x1 sums (pointwise_lanes's tiles, x read in place) into a per-part plane
 * buffer E (12 x H x W: 600 KB at MobileNetV2's 112 x 112, in L2), then each channel's depthwise
 * convolution from E through the phase planes (dwf_range). Apart, the expansion wrote 4.8 MB
 * that the depthwise layer read back from memory for its planes. */
typedef struct {
    const float *wp, *x, *b1;
    Py_ssize_t M, C, P;
    float lo1, hi1;
    dwf_job dw;          /* the depthwise step (its x unused: E is its input) */
    Py_ssize_t scratch_n; /* a part's work buffer: E, 12 x 32 tail tiles, C x 32 tail of x, dw.scratch_n */
    int oom;
} ed_job;

static void ed_part(void *arg, int part, int parts)
{
    const ed_job *j = (const ed_job *)arg;
    const Py_ssize_t P = j->P, C = j->C, np_ = (j->M + LN_RP - 1) / LN_RP, full = P / 32, tn = P - full * 32;
    /* the thread's own buffer, kept between calls: its E stays in that core's L2 */
    float *E = (float *)rc_work(sizeof(float) * (size_t)j->scratch_n);
    if (!E) {
        __atomic_store_n(&((ed_job *)arg)->oom, 1, __ATOMIC_RELAXED);
        return;
    }
    float *tail = E + (LN_RP * P + 15) / 16 * 16, *xt = tail + LN_RP * 32, *dws = xt + C * 32;
    if (tn) /* the last 32 positions' x, zeros past P: read in place, its rows would run past x */
        pl_pack32(xt, j->x + full * 32, C, P, tn);
    for (Py_ssize_t q = np_ * part / parts; q < np_ * (part + 1) / parts; q++) {
        const Py_ssize_t r0 = q * LN_RP, nr = j->M - r0 < LN_RP ? j->M - r0 : LN_RP;
        const float *ap = j->wp + q * C * LN_RP;
        const ln_epi e = {j->b1 ? j->b1 + r0 : NULL, NULL, 0, j->lo1, j->hi1};
        for (Py_ssize_t cb = 0; cb < full; cb++)
            ln_tiles[nr](ap, j->x + cb * 32, C, P, E + cb * 32, P, NULL, 1, NULL, 0, 0, &e);
        if (tn) {
            ln_tiles[nr](ap, xt, C, 32, tail, 32, NULL, 1, NULL, 0, 0, &e);
            for (Py_ssize_t r = 0; r < nr; r++)
                memcpy(E + r * P + full * 32, tail + r * 32, (size_t)tn * sizeof(float));
        }
        dwf_range(&j->dw, E, r0, dws, r0, r0 + nr);
    }
    rc_work_done(E, sizeof(float) * (size_t)j->scratch_n);
}

static PyObject *expand_dw(PyObject *self, PyObject *args)
{
    PyObject *wo, *xo, *bo, *wdo, *bdo, *yo;
    Py_ssize_t M, C, H, W, OH, OW, s, pt, pl;
    float lo1, hi1, lo, hi;
    int threads;
    if (!PyArg_ParseTuple(args, "OOOffOOO(nnnn)(nnnnn)ffi:expand_dw", &wo, &xo, &bo, &lo1, &hi1, &wdo, &bdo,
                          &yo, &M, &C, &H, &W, &OH, &OW, &s, &pt, &pl, &lo, &hi, &threads))
        return NULL;
    if (M < 1 || C < 1 || H < 1 || W < 1 || OH < 1 || OW < 1 || pt < 0 || pl < 0 || (s != 1 && s != 2) ||
        M > PY_SSIZE_T_MAX / 64 / C || H > PY_SSIZE_T_MAX / 64 / W) {
        PyErr_SetString(PyExc_ValueError, "expand_dw: bad sizes, stride (1 or 2) or padding");
        return NULL;
    }
    if (!rc_conv_fast) {
        PyErr_SetString(PyExc_ValueError, "expand_dw: needs AVX-512 (CONV_FAST)");
        return NULL;
    }
    const Py_ssize_t P = H * W, np_ = (M + LN_RP - 1) / LN_RP;
    Py_buffer v[6];
    const rc_buf spec[6] = {{wo, np_ * C * LN_RP, RC_F32, 0, 0, "W"}, {xo, C * P, RC_F32, 0, 0, "X"},
                            {bo, M, RC_F32, 0, 1, "B"}, {wdo, M * 9, RC_F32, 0, 0, "WD"},
                            {bdo, M, RC_F32, 0, 1, "BD"}, {yo, M * OH * OW, RC_F32, 1, 0, "Y"}};
    if (get_buffers("expand_dw", spec, v, 6) < 0)
        return NULL;
    ed_job j = {(const float *)v[0].buf, (const float *)v[1].buf, (const float *)v[2].buf, M, C, P, lo1, hi1,
                {NULL, (const float *)v[3].buf, (const float *)v[4].buf, (float *)v[5].buf, M, M, H, W, OH, OW,
                 s, pt, pl, 0, 0, 0, 0, lo, hi, NULL, 0, 0},
                0, 0};
    dwf_setup(&j.dw);
    /* E, the tails and the phase planes, each from a 64-byte boundary */
    j.scratch_n = (LN_RP * P + 15) / 16 * 16 + LN_RP * 32 + C * 32 + j.dw.scratch_n;
    const int parts = rc_parts(2.0 * (double)M * (double)C * (double)P, 2.5e5, np_, &threads);
    return rc_run_job(ed_part, &j, parts, threads, v, 6, &j.oom);
}
#endif

/* mha: the core of onnxruntime's com.microsoft.Attention after its projection, one unit of
 * (batch, head, block of query rows) at a time on the kernel threads: the scores
 * q k^T * scale as one single-threaded sgemm (set_sgemm's) into a per-thread buffer, the
 * additive mask, the causal cut and the attention bias added row by row, softmax_rows, and
 * p v as a second sgemm written straight into the head's columns of y. numpy looped over
 * the heads with threaded BLAS calls on 128 x 64 matrices (about a third of BERT-base's
 * attention time beside the projection) and woke BLAS worker threads that then spun
 * through the next nodes. */
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

static void mh_part(void *arg, int part, int parts)
{
    const mh_job *j = (const mh_job *)arg;
    const Py_ssize_t nrb = (j->S + j->rb - 1) / j->rb, units = j->B * j->H * nrb;
    const Py_ssize_t u0 = units * part / parts, u1 = units * (part + 1) / parts;
    if (u0 >= u1)
        return;
    const Py_ssize_t T = j->S, yw = j->H * j->dv;
    const size_t zn = sizeof(float) * (size_t)j->rb * (size_t)T;
    float *z = (float *)rc_work(zn);
    if (!z) {
        __atomic_store_n(&((mh_job *)arg)->oom, 1, __ATOMIC_RELAXED);
        return;
    }
    char tn = 'T', nn = 'N';
    float one = 1.0f, zero = 0.0f, sc = j->scale;
    int iT = (int)T, idq = (int)j->dq, idv = (int)j->dv, lx = (int)j->xs, ly = (int)yw;
    for (Py_ssize_t u = u0; u < u1; u++) {
        const Py_ssize_t bh = u / nrb, b = bh / j->H, h = bh - b * j->H;
        const Py_ssize_t s0 = (u - bh * nrb) * j->rb;
        const Py_ssize_t s1 = s0 + j->rb < j->S ? s0 + j->rb : j->S;
        int n = (int)(s1 - s0);
        const float *q = j->q + b * j->xb + s0 * j->xs + h * j->dq;
        const float *k = j->k + b * j->xb + h * j->dq;
        const float *v = j->v + b * j->xb + h * j->dv;
        /* column-major z^T (T x n) = k (T x dq, read transposed) q^T: row-major z (n x T) */
        rc_sgemm(&tn, &nn, &iT, &n, &idq, &sc, (float *)k, &lx, (float *)q, &lx, &zero, z, &iT);
        for (Py_ssize_t s = s0; s < s1; s++) {
            float *zr = z + (s - s0) * T;
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
    if (get_items("mha", o, view, 0, db * dh * ds * S, RC_F32, name) < 0) {
        view->obj = NULL;
        return -1;
    }
    *ss = ds == 1 ? 0 : S;
    *sh = dh == 1 ? 0 : ds * S;
    *sb = db == 1 ? 0 : dh * ds * S;
    return 0;
}

static PyObject *mha(PyObject *self, PyObject *args)
{
    PyObject *xo, *yo, *m1o, *m1d, *m2o, *m2d;
    Py_ssize_t B, S, W, oq, ok, ov, H, dq, dv;
    float scale;
    int causal, threads;
    if (!PyArg_ParseTuple(args, "O(nnnnnn)(nnn)fpOOOOOi:mha", &xo, &B, &S, &W, &oq, &ok, &ov, &H, &dq,
                          &dv, &scale, &causal, &m1o, &m1d, &m2o, &m2d, &yo, &threads))
        return NULL;
    if (!rc_sgemm) {
        PyErr_SetString(PyExc_RuntimeError, "mha: no sgemm (set_sgemm was not called)");
        return NULL;
    }
    if (B < 1 || S < 1 || H < 1 || dq < 1 || dv < 1 || W > INT32_MAX || S > INT32_MAX / 4 ||
        oq < 0 || ok < 0 || ov < 0 || oq + H * dq > W || ok + H * dq > W || ov + H * dv > W ||
        H * dv > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "mha: sizes out of range (or a head's columns past W)");
        return NULL;
    }
    Py_buffer v[4];
    mh_job j;
    memset(&j, 0, sizeof j);
    if (get_items("mha", xo, &v[0], 0, B * S * W, RC_F32, "QKV") < 0)
        return NULL;
    v[1].obj = v[2].obj = v[3].obj = NULL;
    if (mh_bias(m1o, m1d, B, H, S, "mask", &v[1], &j.m1b, &j.m1h, &j.m1s) < 0 ||
        mh_bias(m2o, m2d, B, H, S, "attention bias", &v[2], &j.m2b, &j.m2h, &j.m2s) < 0 ||
        get_items("mha", yo, &v[3], 1, B * S * H * dv, RC_F32, "Y") < 0) {
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
    /* whole heads when there are 8 or more, else blocks of rows, 8 units or more: not a
       function of the thread count, so that any number of threads gives the same bits */
    const Py_ssize_t heads = B * H;
    Py_ssize_t nrb = heads >= 8 ? 1 : (8 + heads - 1) / heads;
    if (nrb > S)
        nrb = S;
    j.rb = (S + nrb - 1) / nrb;
    const double work = 2.0 * (double)heads * (double)S * (double)S * (double)(dq + dv);
    const int parts = rc_parts(work, 2.5e5, heads * ((S + j.rb - 1) / j.rb), &threads);
    return rc_run_job(mh_part, &j, parts, threads, v, 4, &j.oom);
}

static PyMethodDef methods[] = {
    {"depthwise2d", depthwise2d, METH_VARARGS,
     "depthwise2d(x, w, b, y, (N, C, H, W), (OH, OW), (KH, KW), (sh, sw), (dh, dw), (pt, pl), lo, hi)\n"
     "Depthwise 2-D convolution of C-contiguous float32 buffers into y, clipped to [lo, hi]."},
    {"bias_clip", bias_clip, METH_VARARGS,
     "bias_clip(y, b, (M, P), lo, hi, z=None)\n"
     "y[m, p] = clip(y[m, p] + b[m] + z[m, p], lo, hi) in place over C-contiguous float32 buffers\n"
     "(b and z may be None)."},
    {"recurrence", recurrence, METH_VARARGS,
     "recurrence(lstm, linear_before_reset, reverse, xw, p1, p2, rbn, h0, c, ys, (seq, B, H))\n"
     "The LSTM (gates i, o, f, c) or GRU (z, r, h) time loop with default activations over\n"
     "C-contiguous float32 buffers; p1/p2 are the recurrence weights packed by unit chunks of\n"
     "RECURRENCE_UNITS. Writes every hidden state into ys (and the last cell state into c)."},
    {"gelu_erf", gelu_erf, METH_VARARGS,
     "gelu_erf(x, b, y, (rows, d), tanh_form=False)\n"
     "y = Gelu(x + b) (erf form, or with tanh_form its tanh approximation; b a vector of the d\n"
     "columns, or None) over C-contiguous float32 buffers; y may be x."},
    {"conv2d", conv2d, METH_VARARGS,
     "conv2d(x, wp, b, z, y, (N, C, H, W), (M, KH, KW), (sh, sw), (dh, dw), (pt, pl), (OH, OW), lo, hi, threads,\n"
     "       lanes=False, extra=None)\n"
     "Dense 2-D convolution (group 1) of C-contiguous float32 NCHW buffers into y, plus b and z,\n"
     "clipped to [lo, hi]; wp are the weights packed by CONV_MR output channels\n"
     "([ceil(M / CONV_MR)][C * KH * KW][CONV_MR], zeros past M). Up to threads threads.\n"
     "lanes: output channels in the vector lanes, wp packed by CONV_LANES channels instead and\n"
     "64-byte aligned (for outputs a few columns wide: no column past OW is computed).\n"
     "extra = (wp2, b2, z2, y2, M2, ty, tx, lo2, hi2, lanes2): also a 1x1 convolution of the same\n"
     "strides and output size from the same padded input at window position (ty, tx), packed\n"
     "as its own tiling reads it ([..][C][..]), into y2 (a 1x1 strided shortcut beside a 3x3)."},
#if DWF_OK
    {"conv_maxpool", conv_maxpool, METH_VARARGS,
     "conv_maxpool(x, wp, b, y, (C, H, W), (M, KH, KW), (sh, sw), (pt, pl), (OH, OW), lo, hi, (POH, POW), threads)\n"
     "One image's dense convolution (conv2d's packing and position tiles, dilation 1, strides 1\n"
     "or 2), plus b, clipped to [lo, hi], then its 3x3 stride-2 MaxPool padded by 1 into y\n"
     "(M x POH x POW), the convolution's output never written whole. AVX-512 only (CONV_FAST)."},
    {"expand_dw", expand_dw, METH_VARARGS,
     "expand_dw(w, x, b, lo1, hi1, wd, bd, y, (M, C, H, W), (OH, OW, s, pt, pl), lo, hi, threads)\n"
     "One image's 1x1 convolution e = clip(w x + b, lo1, hi1) (w packed as pointwise_lanes reads\n"
     "it, x C x H x W) and then y = clip(depthwise3x3(e, wd, stride s, pads pt, pl) + bd, lo, hi)\n"
     "(wd M x 1 x 3 x 3, y M x OH x OW), e never written whole. AVX-512 only (CONV_FAST)."},
#endif
    {"winograd3x3", winograd3x3, METH_VARARGS,
     "winograd3x3(x, u, b, z, y, (N, C, H, W), M, (pt, pl), (OH, OW), lo, hi, threads, lanes=False)\n"
     "Dense 3x3 stride-1 convolution (group 1, dilation 1) of C-contiguous float32 NCHW buffers\n"
     "into y as Winograd F(2x2, 3x3), plus b and z, clipped to [lo, hi]; u are the transformed\n"
     "weights G g G^T packed [16][ceil(M / CONV_MR)][C][CONV_MR], zeros past M. lanes: output\n"
     "channels in the vector lanes, u packed [16][ceil(M / CONV_LANES)][C][CONV_LANES] instead\n"
     "and 64-byte aligned."},
    {"gemm_rows", gemm_rows, METH_VARARGS,
     "gemm_rows(a, b, y, (R, K, N), trans, threads)\n"
     "y[R][N] = a[R][K] @ B in float32 for a few rows, B = b[N][K] transposed (trans) or\n"
     "b[K][N]; C-contiguous buffers; up to threads threads."},
    {"set_sgemm", set_sgemm, METH_O,
     "set_sgemm(capsule) -> path\n"
     "Take the sgemm of scipy.linalg.cython_blas.__pyx_capi__ for pointwise; returns the path of\n"
     "the library it lives in (or None). Its callers keep that library at one thread."},
    {"pointwise", pointwise, METH_VARARGS,
     "pointwise(w, x, b, z, y, (M, K, P), lo, hi, threads)\n"
     "y[M][P] = clip(w[M][K] @ x[K][P] + b (+ z), lo, hi) in float32, blocks of y split between\n"
     "the kernel threads, each one single-threaded sgemm (set_sgemm's) and its epilogue."},
    {"skip_layer_norm", skip_layer_norm, METH_VARARGS,
     "skip_layer_norm(x, skip, gamma, beta, bias, y, mean, inv_std_var, sum, (rows, d, skip_rows), eps)\n"
     "SkipLayerNormalization of C-contiguous float32 rows (skip, beta, bias and the outputs mean,\n"
     "inv_std_var and sum may be None: without skip, LayerNormalization; skip row r % skip_rows\n"
     "goes with row r; y may be x or skip)."},
    {"maxpool2d", maxpool2d, METH_VARARGS,
     "maxpool2d(x, y, (N, C, H, W), (OH, OW), (KH, KW), (sh, sw), (dh, dw), (pt, pl), threads)\n"
     "MaxPool values of C-contiguous float32 NCHW x into y (taps in the padding skipped)."},
    {"linear", linear, METH_VARARGS,
     "linear(a, w, bias, y, (R, K, N), threads, packed=True)\n"
     "y (R x N) = a (R x K) w (+ bias) in float32 on the kernel threads, w packed as\n"
     "[ceil(N / 32)][K][32] (64-byte aligned, zeros past N), or (packed false) w itself, K x N."},
    {"pointwise_lanes", pointwise_lanes, METH_VARARGS,
     "pointwise_lanes(wp, x, b, z, y, (M, C, P), lo, hi, threads)\n"
     "y (M x P) = clip(w x + b (+ z), lo, hi) in float32 on the kernel threads, w packed in\n"
     "12-row panels [ceil(M / 12)][C][12] (zeros past M)."},
    {"mha", mha, METH_VARARGS,
     "mha(qkv, (B, S, W, oq, ok, ov), (H, dq, dv), scale, causal, mask, mask_dims, bias, bias_dims, y, threads)\n"
     "Multi-head attention from the projected (B, S, W) float32 qkv (heads' columns from oq, ok,\n"
     "ov): softmax(q k^T * scale + mask [causal cut] + bias) v into y (B, S, H * dv); mask and bias\n"
     "(or None) are float32 (db, dh, ds, S) with each d 1 or full. Single-threaded sgemm calls\n"
     "(set_sgemm's) on the kernel threads, a unit a (batch, head, block of rows)."},
    {"softmax", softmax, METH_VARARGS,
     "softmax(z, (rows, t))\n"
     "The softmax of every row of t floats of the C-contiguous float32 buffer z, in place."},
    {"pool_stats", pool_stats, METH_NOARGS,
     "pool_stats() -> (workers, last_threads)\n"
     "The kernel thread pool's started workers and how many threads ran the last pooled job."},
    {"tree_leaves", tree_leaves, METH_VARARGS,
     "tree_leaves(X, nodes, roots, out, (n, c, L, t), itemsize, depth, mode, nan_check)\n"
     "The node every row of X reaches in every tree (out[tree, row]) over C-contiguous buffers:\n"
     "X of the item size (4: float32, 8: float64), nodes L packed nodes (16 or 24 bytes: see\n"
     "rc_node_f / rc_node_d), roots and out int64."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native",
                                    "Fused CPU kernels of runtime-provider-cpu.", -1, methods};

PyMODINIT_FUNC PyInit__native(void)
{
    pthread_atfork(NULL, NULL, rc_pool_forked);
    rc_conv_fast = cv_fast();
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddIntConstant(m, "RECURRENCE_UNITS", RC_U) < 0 ||
              PyModule_AddIntConstant(m, "CONV_MR", CV_MR) < 0 ||
              PyModule_AddIntConstant(m, "CONV_LANES", CT_MR) < 0 ||
              PyModule_AddIntConstant(m, "CONV_FAST", rc_conv_fast) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
