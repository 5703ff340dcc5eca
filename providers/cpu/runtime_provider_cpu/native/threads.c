/* The kernel thread pool (rc_parallel: a small pthread pool sized by the session's
 * intra_op_num_threads, shared by every kernel), how a kernel splits its work over it, and
 * the per-thread work buffers. */
#include "native.h"

#include <pthread.h>
#include <sched.h>
#include <time.h>

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

void rc_pool_forked(void)
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
void rc_parallel(rc_part_f fn, void *arg, int parts, int threads)
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
PyObject *rc_py_pool_stats(PyObject *self, PyObject *args)
{
    (void)args;
    pthread_mutex_lock(&rc_pool.mu);
    const int started = rc_pool.started, last = rc_pool.last_threads;
    pthread_mutex_unlock(&rc_pool.mu);
    return Py_BuildValue("(ii)", started, last);
}

/* a work buffer of the calling thread, 64-byte aligned and kept between calls up to
 * RC_KEEP bytes: a fresh multi-megabyte malloc each call is a fresh mmap whose pages fault in
 * on first touch (docs/performance.md).
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
