/* What the source files of runtime_provider_cpu._native share: the build's clone macros, the
 * buffer checks every entry point makes, the kernel thread pool and work buffers, the CPU's
 * features, the sgemm taken from SciPy, the register tiles several kernels reuse, and the
 * entry points the module table lists. Internal: the extension is built with hidden
 * visibility, so nothing here is exported but PyInit__native. */
#ifndef RC_NATIVE_H
#define RC_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* RC_BUILD_ISA (setup.py's RUNTIME_CORE_NATIVE_ISA): 0 the clones below, 1 without their AVX-512
   builds (what an AVX2 CPU runs of them: CV_CLONES's baseline), 2 the baseline x86-64 alone; also
   the run-time cap's default (cpu_features.c) */
#ifndef RC_BUILD_ISA
#define RC_BUILD_ISA 0
#endif

#if RC_BUILD_ISA == 1 && defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define RC_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#define CV_CLONES
#elif RC_BUILD_ISA == 0 && defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
/* one x86-64-v4 (AVX-512), one x86-64-v3 (AVX2 + FMA) and one baseline build of a kernel,
   picked at load time by the CPU */
#define RC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
/* an AVX-512 build (32 vector registers: the 24 accumulators of a tile fit) and a portable one; no
   x86-64-v3 build: 16-float vectors in 16 ymm registers spilled, and gemm_rows's v3 clone ran at
   0.55-0.65x its baseline one's rate (providers/cpu/docs/performance.md) */
#define CV_CLONES __attribute__((target_clones("arch=x86-64-v4", "default")))
#else
#define RC_CLONES
#define CV_CLONES
#endif

#define RC_INLINE static inline __attribute__((always_inline))

#include "simd.h"

static inline float clipf(float v, float lo, float hi)
{
    /* NaN stays NaN (both comparisons are false), as numpy's maximum / clip keep it */
    v = v < lo ? lo : v;
    return v > hi ? hi : v;
}

/* ---- overflow-checked sizes ------------------------------------------------------------ */

/* Every size, offset and loop bound that sizes a buffer or indexes memory is computed with
 * these: the first failure is kept (which quantity) and every later result is 0, so a kernel
 * computes its sizes in a row and tests once, before it allocates or reads anything. */
typedef struct {
    const char *what; /* the first quantity that overflowed (NULL: none) */
} rc_sz;

static inline Py_ssize_t sz_fail(rc_sz *s, const char *what)
{
    if (!s->what)
        s->what = what;
    return 0;
}
/* a * b for a, b >= 0 */
static inline Py_ssize_t sz_mul(rc_sz *s, const char *what, Py_ssize_t a, Py_ssize_t b)
{
    Py_ssize_t r;
    if (s->what || a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r))
        return sz_fail(s, what);
    return r;
}
/* a + b for a, b >= 0 */
static inline Py_ssize_t sz_add(rc_sz *s, const char *what, Py_ssize_t a, Py_ssize_t b)
{
    Py_ssize_t r;
    if (s->what || a < 0 || b < 0 || __builtin_add_overflow(a, b, &r))
        return sz_fail(s, what);
    return r;
}
static inline Py_ssize_t sz_mul3(rc_sz *s, const char *what, Py_ssize_t a, Py_ssize_t b, Py_ssize_t c)
{
    return sz_mul(s, what, sz_mul(s, what, a, b), c);
}
static inline Py_ssize_t sz_mul4(rc_sz *s, const char *what, Py_ssize_t a, Py_ssize_t b, Py_ssize_t c,
                                 Py_ssize_t d)
{
    return sz_mul(s, what, sz_mul3(s, what, a, b, c), d);
}
/* the padded extent n windows read: (n - 1) * stride + (k - 1) * dilation + 1 (0 for n = 0) */
static inline Py_ssize_t sz_extent(rc_sz *s, const char *what, Py_ssize_t n, Py_ssize_t stride, Py_ssize_t k,
                                   Py_ssize_t dilation)
{
    if (n <= 0)
        return 0;
    return sz_add(s, what, sz_add(s, what, sz_mul(s, what, n - 1, stride), sz_mul(s, what, k - 1, dilation)), 1);
}
/* -1 with exc (ValueError for a size the caller's buffers cannot have, MemoryError for work
 * memory no machine has) naming the op and the quantity, where a size overflowed; else 0 */
int sz_check(const rc_sz *s, const char *fn, PyObject *exc);
/* whether n floats of work memory are reasonable beside data floats of the call's own input and
 * output: the kernels that pad take a slower path that needs none where they are not */
static inline int sz_scratch_ok(Py_ssize_t n, Py_ssize_t data)
{
    return n <= ((Py_ssize_t)1 << 26) || n / 8 <= data;
}

/* a wider integer for index arithmetic that may exceed Py_ssize_t on the slow, exact paths
 * (windows of extreme strides, dilations and pads) */
#if defined(__SIZEOF_INT128__) && PY_SSIZE_T_MAX > INT32_MAX
typedef __int128 rc_wide;
#else
typedef int64_t rc_wide;
#endif

/* ---- buffers (module.c) ---------------------------------------------------------------- */

#define RC_F32 ((Py_ssize_t)sizeof(float))

/* what a kernel takes: an object, its item count and size, whether it is written, whether
 * None may stand for it (an absent optional input), and its name in errors */
typedef struct {
    PyObject *obj;
    Py_ssize_t n, itemsize;
    int writable, optional;
    const char *name;
} rc_buf;

/* one C-contiguous buffer of n items of itemsize bytes (writable when asked), else a
 * ValueError naming it (and nothing held) */
int get_items(const char *fn, PyObject *obj, Py_buffer *view, int writable, Py_ssize_t n,
              Py_ssize_t itemsize, const char *what);
/* every buffer of spec[0..k) into v (an absent optional one: buf NULL); on a failure those
 * already held are released and -1 is returned with the error set */
int get_buffers(const char *fn, const rc_buf *spec, Py_buffer *v, int k);
void release_buffers(Py_buffer *v, int k);

/* ---- the kernel thread pool (threadpool.c) and work buffers (threads.c) ---------------- */

#define RC_POOL_MAX 64 /* threads a job runs on, at most */

/* fn(arg, part, parts) for every part */
typedef void (*rc_part_f)(void *arg, int part, int parts);
/* fn(arg, part, parts) for every part in [0, parts), on the caller's thread and up to
 * threads - 1 pool workers (fewer while other runs or jobs keep the cores busy), parts claimed
 * one at a time by whichever thread runs; returns when all have finished. Once the calling
 * thread's run scope's stop flag is set, the parts not started are skipped: the kernel's
 * output is then garbage, which the ending run discards. */
void rc_parallel(rc_part_f fn, void *arg, int parts, int threads);
/* the threads a job opened now by this thread would run on: 1 where rc_parallel would run it on
 * its caller alone (run_solo, or the machine's load, counted then as a job run alone for it),
 * else threads; for a kernel whose split costs per part (a head packed by each part that has
 * some of its rows), so that a job run alone is split as for one thread */
int rc_job_threads(int threads);
/* nonzero once the stop flag of the run whose kernel part this thread is running (or whose
 * run scope it is in) is set: a long part polls it between its units and returns early (the
 * ending run discards its output) */
int rc_stop_requested(void);
/* how a kernel splits its work over the pool: *threads lowered to one a min_work of work (a
 * thread's wake-up must pay for itself), at least 1; returns the parts, 4 a thread, no more
 * than the kernel's units (channel planes, tiles) */
int rc_parts(double work, double min_work, Py_ssize_t units, int *threads);
#define RC_PART_WORK 536870912.0 /* 2^29 flops: 10-30 ms on one core */
#define RC_PARTS_FINE_MAX 4096
/* rc_parts with at least one part a RC_PART_WORK of work (up to the units), for kernels that
 * keep no work buffer per part: a stopped run then ends within one part of a long kernel */
int rc_parts_fine(double work, double min_work, Py_ssize_t units, int *threads);
/* the means of rows [r0, r1) of n floats (pool.c): GlobalAveragePool and squeeze_excite share it */
void rc_row_means(const float *x, float *y, Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t n);
/* fn's parts of job on up to threads threads without the GIL (none where *oom is already set:
 * the caller's own allocation failed), then the caller's nbuf buffers released: None, or NULL
 * with MemoryError where *oom is set */
PyObject *rc_run_job(rc_part_f fn, void *job, int parts, int threads, Py_buffer *v, int nbuf, const int *oom);
/* a 64-byte aligned work buffer of n bytes, kept by the calling thread between calls when it
 * is not too large; given back with rc_work_done (same n) */
void *rc_work(size_t n);
void rc_work_done(void *p, size_t n);
/* the pool's state after a fork (registered with pthread_atfork) */
void rc_pool_forked(void);

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

/* ---- CPU features (cpu_features.c) ----------------------------------------------------- */

/* whether this machine runs the AVX-512 kernels (the module's CONV_FAST), set once at load */
extern int rc_conv_fast;
/* RUNTIME_CORE_CPU_ISA's cap, read once at load: 0 none (avx512), 1 avx2, 2 baseline; -1: a
   value it does not name (the module's import fails, naming it) */
extern int rc_isa_cap;
/* the widest kernels that run here, under the cap: "avx512", "avx2" or "baseline" (CPU_ISA) */
extern const char *rc_isa_name;
void rc_cpu_init(void);
extern int rc_avx_vnni;
PyObject *rc_py_cpu_isa(PyObject *self, PyObject *noargs);
PyObject *rc_py_fma_peak(PyObject *self, PyObject *args);

/* ---- SciPy's sgemm (sgemm_bridge.c) ---------------------------------------------------- */

typedef void (*rc_sgemm_f)(char *, char *, int *, int *, int *, float *, float *, int *, float *,
                           int *, float *, float *, int *);
extern rc_sgemm_f rc_sgemm; /* NULL until set_sgemm */

/* ---- row kernels shared by the GEMM-shaped paths (rows.c) ------------------------------ */

/* y[m, p] = clip(y[m, p] + b[m] (+ z[m, p]), lo, hi) over M rows of P columns, ld apart */
void bias_clip_block(float *restrict y, Py_ssize_t ld, const float *restrict b, const float *restrict z,
                     Py_ssize_t M, Py_ssize_t P, float lo, float hi);
/* a's activation (rc_act, simd.h) of M rows of P floats, ld apart, in place; none for act 0 */
void act_block(float *y, Py_ssize_t ld, Py_ssize_t M, Py_ssize_t P, const rc_act *a);
/* the softmax of every row of t floats of z, in place */
void softmax_rows(float *z, Py_ssize_t rows, Py_ssize_t t);
/* exp(z - max) of a row of t floats in place, returning 1 / their sum (softmax_rows less its last pass) */
float softmax_exp_row(float *z, Py_ssize_t t);
/* the same on a row with room for t rounded up to 16 floats (zeros written past t) */
float softmax_exp_row_pad(float *z, Py_ssize_t t);

/* ---- the direct convolution's register tiles and phase planes (conv_direct.c) ---------- */

#define CV_MR 8   /* output channels a tile */
#define CV_NV 3   /* 16-float vectors of positions a tile */
#define CV_NR (16 * CV_NV)
#define CT_NB 2   /* lane tiles: 16-float vectors of output channels */
#define CT_MR (16 * CT_NB)
#define CT_NP 12  /* lane tiles: positions a tile */
_Static_assert(CT_NP * CT_MR == CV_MR * CV_NR, "a lane tile takes one conv2d tile's scratch");

/* o[i][0 .. 16 * NV) (+)= sum over c, t of wp[(c * T + t) * MR + i] * xb[c * cs + toff[t] + ...],
 * by 16-float vectors NV (1 to CV_NV) */
typedef void (*cv_tile_f)(const float *restrict, const Py_ssize_t *restrict, Py_ssize_t, Py_ssize_t, Py_ssize_t,
                          const float *restrict, float *restrict, int);
extern const cv_tile_f cv_tiles[CV_NV + 1];
/* o[p][0 .. 32) (+)= sum over c, t of xb[c * cs + toff[t] + p] * wp[(c * T + t) * 32 + ...], by
 * positions NP (1 to CT_NP), with a share of prefetches */
typedef void (*ct_tile_f)(const float *restrict, const Py_ssize_t *restrict, Py_ssize_t,
                          Py_ssize_t, Py_ssize_t, const float *restrict, float *restrict, int,
                          const char *, Py_ssize_t);
extern const ct_tile_f ct_tiles[CT_NP + 1];

/* a row's segment s of nseg: columns [ow0, ow0 + n), the row split as evenly as it goes */
RC_INLINE void ct_segment(Py_ssize_t OW, Py_ssize_t nseg, Py_ssize_t s, Py_ssize_t *ow0, int *n)
{
    *ow0 = OW * s / nseg;
    *n = (int)(OW * (s + 1) / nseg - *ow0);
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

/* the planes of the part's share of the channels (an rc_part_f over a cv_fill_job) */
void cv_fill_part(void *arg, int part, int parts);
/* the offset into a channel's planes of each tap of a KH x KW window (dilations dh, dw) from
 * window position (ty, tx) into toff, and the phases they read into f->used */
void cv_taps(Py_ssize_t KH, Py_ssize_t KW, Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t ty, Py_ssize_t tx,
             Py_ssize_t *toff, cv_fill_job *f);

/* ---- linear's register tiles (linear.c) ------------------------------------------------ */

#define LN_RP 12  /* rows a panel */
#define LN_KC 256 /* most terms a chunk */

/* an epilogue in a tile's last chunk: row p of the tile gets rb[p] (or 0; pointwise_lanes's
 * bias), the tile's column bias when it starts from it, plus z[p * ldz + ...] when z is set,
 * clipped to [lo, hi] (linear's Relu) */
typedef struct {
    const float *rb, *z;
    Py_ssize_t ldz;
    float lo, hi;
    const rc_act *act; /* after the clip, or NULL */
} ln_epi;

/* c[p][0 .. 32) = sum over k of ap[k * 12 + p] * wp[k * ldw + ...] (+ bias or what c holds,
 * then the epilogue), by rows NP (1 to LN_RP) */
typedef void (*ln_tile_f)(const float *restrict, const float *restrict, Py_ssize_t, Py_ssize_t,
                          float *restrict, Py_ssize_t, const float *restrict, int, const char *,
                          Py_ssize_t, Py_ssize_t, const ln_epi *);
extern const ln_tile_f ln_tiles[LN_RP + 1];
/* the same tiles as 6 x 16 sub-tiles for AVX2 + FMA and for the baseline x86-64 (linear_avx2.c) */
extern const ln_tile_f ln_tiles_avx2[LN_RP + 1];
extern const ln_tile_f ln_tiles_base[LN_RP + 1];
/* the tiles linear runs where they are not linear.c's own (NULL: an AVX-512 CPU, uncapped), set
   once at load (cpu_features.c) */
extern const ln_tile_f *rc_ln_tiles;
/* ln_pack_part's AVX2 transpose of a 12-row panel's first K - K % 8 terms; returns them */
Py_ssize_t ln_pack12_avx2(float *restrict dst, const float *restrict src, Py_ssize_t K);
/* rows of a [R][K] as 12-row panels ap [ceil(R / 12)][K][12], zeros past R: an rc_parallel job
   (a part's share of the panels), for the Linear and MatMulNBits kernels */
typedef struct {
    const float *a;
    float *ap;
    Py_ssize_t R, K;
} ln_pack_job;
void ln_pack_part(void *arg, int part, int parts);
/* the row panels a work unit takes (of np_) so that 32-column panels x row blocks make at least
   units units: all of them where the column panels alone are enough */
Py_ssize_t ln_row_block(Py_ssize_t np_, Py_ssize_t cols, Py_ssize_t units);
/* a 32-column panel's bias from column n0 (nn columns): bias + n0 as it is, or copied into
   tail [32] with zeros past nn; NULL without a bias */
RC_INLINE const float *ln_panel_bias(const float *bias, Py_ssize_t n0, Py_ssize_t nn, float *tail)
{
    if (!bias)
        return NULL;
    if (nn == 32)
        return bias + n0;
    for (Py_ssize_t i = 0; i < 32; i++)
        tail[i] = i < nn ? bias[n0 + i] : 0.0f;
    return tail;
}
/* rows of nn floats (at most 32) from src, ld apart, into dst [rows][32], zeros past nn */
void pl_pack32(float *restrict dst, const float *restrict src, Py_ssize_t rows, Py_ssize_t ld, Py_ssize_t nn);

/* ---- the AVX-512 square windows over phase planes (depthwise_avx512.c) ------------------ */

#if DWF_OK
#define DWF_SETS 4 /* sets of phase planes and outputs a part (a power of 2) */
#define DWF_KMAX 7 /* the largest window side the phase planes take (ConvNeXt's 7x7) */

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
    Py_ssize_t toff[DWF_KMAX * DWF_KMAX]; /* each tap's offset from a set of phase planes (dwf_setup) */
    Py_ssize_t k; /* the window's side (3, 5 or 7; 0 reads as 3: the callers that name only 3x3) */
    const rc_act *act; /* after the clip, or NULL */
    int direct; /* 1: each output row from the input rows themselves, no phase planes (dwd_plane) */
} dwf_job;

/* whether a k x k depthwise window (k 3, 5 or 7) of these strides and dilations, on this
   machine, goes to dwf_run (set the job's k) */
int dwf_takes_k(Py_ssize_t KH, Py_ssize_t KW, Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t dh, Py_ssize_t dw,
                Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t planes);

/* whether a 3x3 window of these strides and dilations, on this machine, goes to dwf_run */
int dwf_takes(Py_ssize_t KH, Py_ssize_t KW, Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t dh, Py_ssize_t dw,
              Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t planes);
/* j's phase-plane geometry from its sizes: 0, or -1 with MemoryError where they overflow */
int dwf_setup(dwf_job *j, const char *fn);
/* channels [p0, p1), channel p's input at xs + (p - pbase) * H * W, with scratch's planes */
void dwf_range(const dwf_job *j, const float *xs, Py_ssize_t pbase, float *scratch, Py_ssize_t p0, Py_ssize_t p1);
/* j on up to threads threads, then the caller's nbuf buffers released: None, or NULL with an error */
PyObject *dwf_run(dwf_job *j, int threads, Py_buffer *v, int nbuf);
/* whether the channels-in-lanes depthwise kernel takes a window of these sizes and dilations */
int dwl_takes(Py_ssize_t KH, Py_ssize_t KW, Py_ssize_t dh, Py_ssize_t dw);
/* depthwise2d with 16 channels of an image in the vector lanes; g: N, C, H, W, OH, OW, KH, KW,
   sh, sw, pt, pl; packed: w as [ceil(C / 16)][KH * KW][16]. Then the caller's nbuf buffers released */
PyObject *dwl_run(const float *x, const float *w, const float *b, float *y, const Py_ssize_t *g, float lo, float hi,
                  const rc_act *act, int threads, Py_buffer *v, int nbuf, int packed);
#endif

/* ---- the entry points (module.c lists them) -------------------------------------------- */

/* hidden units per packed chunk of the recurrence (RECURRENCE_UNITS): the recurrence matrix
   is packed as [chunk][k][gate][RC_U] so one chunk's gates for one k are contiguous */
#define RC_U 16

PyObject *rc_py_depthwise2d(PyObject *self, PyObject *args);
PyObject *rc_py_bias_clip(PyObject *self, PyObject *args);
PyObject *rc_py_recurrence(PyObject *self, PyObject *args);
PyObject *rc_py_gelu_erf(PyObject *self, PyObject *args);
PyObject *rc_py_activate(PyObject *self, PyObject *args);
PyObject *rc_py_squeeze_excite(PyObject *self, PyObject *args);
/* nchwc.c: the blocked-layout (NCHW16c) kernels; rc_nchwc_ok: whether they run here */
int rc_nchwc_ok(void);
PyObject *rc_py_nchwc_reorder(PyObject *self, PyObject *args);
PyObject *rc_py_nchwc_pointwise(PyObject *self, PyObject *args);
PyObject *rc_py_nchwc_depthwise(PyObject *self, PyObject *args);
PyObject *rc_py_nchwc_se(PyObject *self, PyObject *args);
PyObject *rc_py_nchwc_expand_dw(PyObject *self, PyObject *args);
PyObject *rc_py_conv2d(PyObject *self, PyObject *args);
PyObject *rc_py_winograd3x3(PyObject *self, PyObject *args);
PyObject *rc_py_gemm_rows(PyObject *self, PyObject *args);
PyObject *rc_py_set_sgemm(PyObject *self, PyObject *cap);
PyObject *rc_py_pointwise(PyObject *self, PyObject *args);
PyObject *rc_py_skip_layer_norm(PyObject *self, PyObject *args);
PyObject *rc_py_layer_norm_cf(PyObject *self, PyObject *args);
PyObject *rc_py_maxpool2d(PyObject *self, PyObject *args);
PyObject *rc_py_row_means(PyObject *self, PyObject *args);
PyObject *rc_py_linear(PyObject *self, PyObject *args);
PyObject *rc_py_pointwise_lanes(PyObject *self, PyObject *args);
PyObject *rc_py_pointwise_rows(PyObject *self, PyObject *args);
PyObject *rc_py_mha(PyObject *self, PyObject *args);
PyObject *rc_py_bmm(PyObject *self, PyObject *args);
PyObject *rc_py_sdpa(PyObject *self, PyObject *args);
PyObject *rc_py_softmax(PyObject *self, PyObject *args);
PyObject *rc_py_pool_stats(PyObject *self, PyObject *args);
PyObject *rc_py_pool_probe(PyObject *self, PyObject *args);
PyObject *rc_py_run_solo(PyObject *self, PyObject *on);
PyObject *rc_py_pool_load_rule(PyObject *self, PyObject *args, PyObject *kw);
PyObject *rc_py_pool_load_full(PyObject *self, PyObject *args);
PyObject *rc_py_run_enter(PyObject *self, PyObject *args, PyObject *kw);
PyObject *rc_py_run_gate(PyObject *self, PyObject *args);
PyObject *rc_py_run_exit(PyObject *self, PyObject *scope);
PyObject *rc_py_sgemm(PyObject *self, PyObject *args);
PyObject *rc_py_tree_leaves(PyObject *self, PyObject *args);
PyObject *rc_py_tree_sums(PyObject *self, PyObject *args);
/* int8.c: the int8 GEMM and DynamicQuantizeLinear; rc_int8_init picks the inner loop at load */
void rc_int8_init(void);
PyObject *rc_py_qgemm_packed_size(PyObject *self, PyObject *args);
PyObject *rc_py_qgemm_pack(PyObject *self, PyObject *args);
PyObject *rc_py_qgemm(PyObject *self, PyObject *args);
PyObject *rc_py_qgemm_path(PyObject *self, PyObject *args);
PyObject *rc_py_qgemm_dispatch(PyObject *self, PyObject *args);
PyObject *rc_py_qconv_nchw(PyObject *self, PyObject *args);
PyObject *rc_py_qim2col_rows(PyObject *self, PyObject *args);
PyObject *rc_py_qadd_lut(PyObject *self, PyObject *args);
PyObject *rc_py_qquantize(PyObject *self, PyObject *args);
PyObject *rc_py_qtranspose(PyObject *self, PyObject *args);
PyObject *rc_py_qim2col(PyObject *self, PyObject *args);
PyObject *rc_py_dyn_quantize(PyObject *self, PyObject *args);
/* int8.c's tile for int8_dyn.c: RC_QG_MR rows x RC_QG_NR columns of raw int32 sums of A's rows packed
 * as [Kq][RC_QG_MR] groups of 4 unsigned bytes against two 16-column panels of B as qgemm_pack packs it */
#define RC_QG_MR 8
#define RC_QG_NR 32
void rc_qg_tile(const int32_t *ap, const int8_t *b0, const int8_t *b1, Py_ssize_t Kq, int32_t *c);
/* DynamicQuantizeLinear's portable steps (int8.c), shared with int8_dyn.c: the range of n floats
 * with 0 in it, NaNs left out; y = saturate(rint(x / scale) + zp) as uint8, NaN -> 0 */
void rc_dq_range(const float *x, Py_ssize_t n, float *lo_out, float *hi_out);
void rc_dq_apply(const float *x, uint8_t *y, Py_ssize_t n, float scale, float zpf);
/* int8_dyn.c: DynamicQuantizeMatMul / MatMulIntegerToFloat, the dequantization in the epilogue */
PyObject *rc_py_dqmm(PyObject *self, PyObject *args);
PyObject *rc_py_dqmm_path(PyObject *self, PyObject *args);

/* int8_amx.c: the AMX int8 tiles (rc_amx: CPUID, XCR0 and the OS's permission, asked at load) */
extern int rc_amx;
extern const char *rc_amx_why;
void rc_amx_init(void);
Py_ssize_t rc_amx_a_stride(Py_ssize_t Kq);
Py_ssize_t rc_amx_a_offset(Py_ssize_t Kq, Py_ssize_t g);
void rc_amx_begin(void);
void rc_amx_end(void);
void rc_amx_tile(const uint8_t *a, Py_ssize_t lda, const int8_t *b0, const int8_t *b1, Py_ssize_t Kq, int r16,
                 int32_t *c);
void rc_amx_pack_rows(const uint8_t *a, Py_ssize_t M, Py_ssize_t K, Py_ssize_t Kq, Py_ssize_t lda, uint8_t flip,
                      Py_ssize_t r0, Py_ssize_t r1, uint8_t *dst, int32_t *rs);
extern int rc_qg_amx;
#define RC_AMX_QG_ROWS 16 /* qgemm on the tiles from this many rows */
PyObject *rc_py_qgemm_amx(PyObject *self, PyObject *args);
/* int8_depthwise.c: depthwise QLinearConv on NCHW planes */
PyObject *rc_py_qdwconv(PyObject *self, PyObject *args);
/* nbits.c: MatMulNBits on the 4-bit codes as stored */
#define RC_NBITS_DOT_ROWS 4 /* rows that take its per-column path (NBITS_DOT_ROWS) */
PyObject *rc_py_nbits_matmul(PyObject *self, PyObject *args);
PyObject *rc_py_nbits_path(PyObject *self, PyObject *args);
PyObject *rc_py_nbits_pack_panels(PyObject *self, PyObject *args);
/* nbits_int8.c: MatMulNBits accuracy_level 4 (int8 a per block, the codes widened to bytes) */
PyObject *rc_py_nbits_int8_matmul(PyObject *self, PyObject *args);
PyObject *rc_py_nbits_int8_path(PyObject *self, PyObject *args);
int rc_nbits_int8_fast(void);
#if DWF_OK
PyObject *rc_py_conv_maxpool(PyObject *self, PyObject *args);
PyObject *rc_py_expand_dw(PyObject *self, PyObject *args);
#endif

#endif
