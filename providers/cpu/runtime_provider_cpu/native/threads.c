/* How a kernel splits its work over the kernel thread pool (threadpool.c) and the
 * per-thread work buffers. */
#include "native.h"

#include <pthread.h>

/* how a kernel splits its work over the pool: *threads lowered to one a min_work of work (a
 * thread's wake-up must pay for itself), at least 1; returns the parts, 4 a thread, no more
 * than the kernel's units (channel planes, tiles) */
int rc_parts(double work, double min_work, Py_ssize_t units, int *threads)
{
    int t = *threads < RC_POOL_MAX ? *threads : RC_POOL_MAX; /* rc_parallel's most: at most 256 parts */
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

/* rc_parts, and more parts where the work is large (at least one a RC_PART_WORK, up to the
 * units): for kernels that keep no work buffer per part, so that a stopped run ends within
 * one part of a long kernel */
int rc_parts_fine(double work, double min_work, Py_ssize_t units, int *threads)
{
    int parts = rc_parts(work, min_work, units, threads);
    const double fine = work / RC_PART_WORK;
    if (fine > parts) {
        const Py_ssize_t most = units < RC_PARTS_FINE_MAX ? units : RC_PARTS_FINE_MAX;
        parts = fine > (double)most ? (int)most : (int)fine + 1;
        if (parts > most)
            parts = (int)most;
    }
    return parts < 1 ? 1 : parts;
}

/* fn's parts of job on up to threads threads without the GIL (none where *oom is already set:
 * the caller's own allocation failed), then the caller's nbuf buffers released: None, or NULL
 * with MemoryError where *oom is set */
PyObject *rc_run_job(rc_part_f fn, void *job, int parts, int threads, Py_buffer *v, int nbuf,
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

/* a work buffer of the calling thread, 64-byte aligned and kept between calls up to
 * RC_KEEP bytes: a fresh multi-megabyte malloc each call is a fresh mmap whose pages fault in
 * on first touch (docs/performance.md). rc_work_done frees what was not kept. The buffer goes
 * with its thread (a key destructor). */
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

void *rc_work(size_t n)
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

void rc_work_done(void *p, size_t n)
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
