/* The kernel thread pool (rc_parallel), shared by every kernel of every session and by
 * concurrent runs, and the run scope (run_enter / run_exit) that hands it a run's stop flag.
 *
 * - Jobs of concurrent callers are open at once; each job's parts are claimed one at a time
 *   from an atomic counter by whichever thread is running: the caller always works on its own
 *   job, so a job finishes even when no worker is ever scheduled (a worker descheduled by
 *   another process holds at most the one part it claimed).
 * - A worker joins a job only while the threads working (workers busy plus the larger of the
 *   callers in the pool and the runs in flight) are fewer than the job's threads: eight runs
 *   on two cores run their kernels on their own threads instead of stacking workers on them.
 * - Every part first reads the caller's stop flag (run_enter's): once set, the remaining parts
 *   are skipped (the run that set it is ending and discards what the kernel wrote).
 * - When other processes' runnable threads fill the cores (at least one a core, fewer than two:
 *   /proc/loadavg, read at most every RC_LOAD_NS), a job runs on its caller alone: a worker
 *   then waits for a core behind them, joins late or is descheduled holding a part the caller
 *   waits on (beside two busy processes on two cores most jobs ended before a worker came, and
 *   a ResNet-50 run took 1.1-1.3x its one-thread time); with more of them the second thread's
 *   larger share of the cores pays for its waits (pool_load_rule).
 * - Stalls are counted (pool_stats): a caller that finished its parts and then waited on a
 *   worker's part so long that it would have done the job sooner alone (a worker descheduled
 *   mid-part, or a part much slower than the caller's). Counted only: acting on them (running
 *   jobs alone for a while) fired on a quiet virtual machine's uneven parts and halved conv
 *   models' speed.
 * - Runs are admitted (the gate, run_enter at depth 0): while as many runs as a run's limit
 *   (default: the cores the process may use) are in flight, it waits its turn, first come first
 *   served, the GIL released; eight runs on two cores otherwise mean eight runnable threads, and
 *   one descheduled while it holds the GIL stalls every other run. */
#include "native.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef struct rc_job {
    rc_part_f fn;
    void *arg;
    int parts;
    int next;                          /* atomic: the next part not claimed */
    int threads;                       /* the most threads that may work on it, the caller's included */
    int slots;                         /* workers that may still join (under mu) */
    int helpers_in;                    /* atomic: workers inside it; the caller leaves at 0 */
    int ran;                           /* atomic: threads that ran at least one part */
    int waiting;                       /* the caller sleeps on done (under mu) */
    int stopped;                       /* atomic: parts were skipped for the stop flag */
    const volatile unsigned char *stop; /* the caller's run's stop flag, or NULL */
    struct rc_job *older, *newer;      /* in the list of open jobs (under mu) */
    int asked;                         /* the threads the kernel asked for (before a solo run) */
} rc_job;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    int started;                /* workers running */
    int idle;                   /* workers asleep on go */
    int busy;                   /* workers inside a job */
    int callers;                /* callers inside rc_parallel with an open job */
    unsigned long gen;          /* atomic: bumped when a job opens */
    rc_job *first, *last;       /* open jobs, oldest first */
    int last_threads;           /* threads that ran parts of the last pooled job */
    int waking;                 /* of the idle, those signalled that have not run yet (the load rule's) */
} rc_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
             0, 0, 0, 0, 0, NULL, NULL, 0, 0};

static int rc_runs;                   /* atomic: runs in flight (run_enter at depth 0) */
static unsigned long rc_skipped;      /* atomic: parts skipped for a stop flag, ever */
static unsigned long rc_started;      /* atomic: parts started in pooled jobs, ever */
static _Thread_local const volatile unsigned char *rc_tls_stop;
/* the stop flag of the job whose part this thread is running (rc_stop_requested's) */
static _Thread_local const volatile unsigned char *rc_part_stop;
static _Thread_local int rc_tls_depth;
static _Thread_local int rc_tls_worker; /* this thread is a pool worker */
static _Thread_local int rc_tls_solo;   /* this thread's jobs run on it alone (run_solo) */

#define RC_SPIN_NS 100000L
/* a wait on helpers past this (and past the caller's own work) is a stall, not a late part */
#define RC_STALL_NS 500000L

static unsigned long rc_stalls;       /* atomic: stalls seen, ever */
static unsigned long rc_jobs;         /* atomic: jobs opened to workers (more than one thread), ever */
static unsigned long rc_alone;        /* atomic: of those, jobs no worker ran a part of */
static unsigned long rc_job_ns;       /* atomic: their wall time, open to close, ns */
static unsigned long rc_wait_ns;      /* atomic: their callers' waits on workers after their own parts, ns */
static unsigned long rc_load_alone;   /* atomic: jobs their caller ran alone for the machine's load */
static void rc_gate_forked(void);

/* ---- the load rule: other processes' runnable threads, from /proc/loadavg ---------------- */

/* the count is read at most this often (a read costs a few microseconds) */
#define RC_LOAD_NS 10000000L
static int rc_load_on = 1;        /* atomic: the rule applies (RUNTIME_CORE_CPU_POOL_LOAD=0: never) */
static int rc_load_forced = -1;   /* atomic: >= 0: the other runnable threads to assume (tests) */
static long rc_load_next;         /* atomic: when the count is read next, ns */
static int rc_load_full;          /* atomic: the last reading left no core to a worker */
static pthread_once_t rc_load_once = PTHREAD_ONCE_INIT;

static void rc_load_init(void)
{
    const char *e = getenv("RUNTIME_CORE_CPU_POOL_LOAD");
    if (e && e[0] == '0' && e[1] == '\0')
        __atomic_store_n(&rc_load_on, 0, __ATOMIC_RELAXED);
}

/* runnable threads on the machine now (the loadavg's "R/T" field; the reader's included), or
 * -1 where it cannot be read */
static int rc_runnable(void)
{
    char b[128];
    const int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    const ssize_t n = read(fd, b, sizeof b - 1);
    close(fd);
    if (n <= 0)
        return -1;
    b[n] = '\0';
    /* "0.50 0.40 0.30 3/517 1234": the fourth field's runnable count */
    char *p = b;
    for (int f = 0; f < 3; f++) {
        while (*p && *p != ' ')
            p++;
        while (*p == ' ')
            p++;
    }
    char *end;
    const long r = strtol(p, &end, 10);
    return end == p || *end != '/' || r < 0 ? -1 : (int)r;
}

static int rc_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        const int c = CPU_COUNT(&set);
        if (c > 0)
            return c;
    }
    const long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int)c : 1;
}

/* whether other processes' runnable threads leave no core to a worker: at least one a core and
 * fewer than two (with more, a second thread's share of the cores grows toward twice one
 * thread's and pays for its waits) */
static int rc_load_rule(int others, int cores)
{
    return others >= cores && others < 2 * cores;
}

/* the rule's verdict for a job opened now (now_ns: CLOCK_MONOTONIC); the count read again
 * once RC_LOAD_NS has passed, by one caller */
static int rc_machine_full(long now_ns)
{
    pthread_once(&rc_load_once, rc_load_init);
    if (!__atomic_load_n(&rc_load_on, __ATOMIC_RELAXED))
        return 0;
    const int forced = __atomic_load_n(&rc_load_forced, __ATOMIC_RELAXED);
    if (forced >= 0)
        return rc_load_rule(forced, rc_cores());
    long next = __atomic_load_n(&rc_load_next, __ATOMIC_RELAXED);
    if (now_ns < next ||
        !__atomic_compare_exchange_n(&rc_load_next, &next, now_ns + RC_LOAD_NS, 0, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED))
        return __atomic_load_n(&rc_load_full, __ATOMIC_RELAXED);
    const int r = rc_runnable();
    int full = 0;
    if (r >= 0) {
        /* ours: the callers in flight (this one included) and the workers not asleep (a worker
           signalled but not yet run is runnable, though still counted idle) */
        const int runs = __atomic_load_n(&rc_runs, __ATOMIC_RELAXED);
        const int callers = __atomic_load_n(&rc_pool.callers, __ATOMIC_RELAXED) + 1;
        const int awake = __atomic_load_n(&rc_pool.started, __ATOMIC_RELAXED) -
                          __atomic_load_n(&rc_pool.idle, __ATOMIC_RELAXED) +
                          __atomic_load_n(&rc_pool.waking, __ATOMIC_RELAXED);
        const int ours = (runs > callers ? runs : callers) + (awake > 0 ? awake : 0);
        full = rc_load_rule(r - ours, rc_cores());
    }
    __atomic_store_n(&rc_load_full, full, __ATOMIC_RELAXED);
    return full;
}

#if defined(__x86_64__) || defined(__i386__)
#define RC_PAUSE() __asm__ __volatile__("pause")
#else
#define RC_PAUSE() ((void)0)
#endif

static long rc_ns_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1000000000L + (t.tv_nsec - t0->tv_nsec);
}

static long rc_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* a caller ran `mine` of its job's `parts` for `work` ns, then waited `wait` ns on helpers: a
 * stall when the job ended later than the caller alone would have ended it, at its own pace a
 * part (counted for pool_stats) */
static void rc_note_wait(long work, long wait, int mine, int parts)
{
    if (wait <= RC_STALL_NS || (mine > 0 && (double)wait <= (double)work * (parts - mine) / mine))
        return;
    __atomic_add_fetch(&rc_stalls, 1, __ATOMIC_RELAXED);
}

int rc_stop_requested(void)
{
    /* in a part: its job's flag; on a caller's thread outside rc_parallel: its run scope's */
    const volatile unsigned char *s = rc_part_stop ? rc_part_stop : rc_tls_stop;
    return s && __atomic_load_n(s, __ATOMIC_RELAXED);
}

/* the parts of j this thread can claim, until none is left or the stop flag is set; returns
 * how many it ran */
static int rc_job_work(rc_job *j)
{
    int mine = 0;
    for (;;) {
        const int p = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (p >= j->parts)
            break;
        if (j->stop && __atomic_load_n(j->stop, __ATOMIC_RELAXED)) {
            /* the rest are nobody's: claim them all at once */
            const int left = j->parts - p;
            __atomic_store_n(&j->next, j->parts, __ATOMIC_RELAXED);
            __atomic_store_n(&j->stopped, 1, __ATOMIC_RELAXED);
            __atomic_add_fetch(&rc_skipped, (unsigned long)(left > 0 ? left : 0), __ATOMIC_RELAXED);
            break;
        }
        if (j->asked > 1)
            __atomic_add_fetch(&rc_started, 1, __ATOMIC_RELAXED);
        const volatile unsigned char *outer = rc_part_stop;
        rc_part_stop = j->stop;
        j->fn(j->arg, p, j->parts);
        rc_part_stop = outer;
        mine++;
    }
    if (mine)
        __atomic_add_fetch(&j->ran, 1, __ATOMIC_RELAXED);
    return mine;
}

/* an open job a worker may join now (under mu): the oldest with parts left, a free slot,
 * and fewer threads working in the whole pool than it asks for */
static rc_job *rc_pick(void)
{
    const int runs = __atomic_load_n(&rc_runs, __ATOMIC_RELAXED);
    const int outside = rc_pool.callers > runs ? rc_pool.callers : runs;
    for (rc_job *j = rc_pool.first; j; j = j->newer)
        if (j->slots > 0 && __atomic_load_n(&j->next, __ATOMIC_RELAXED) < j->parts &&
            rc_pool.busy + outside < j->threads)
            return j;
    return NULL;
}

static void *rc_worker(void *unused)
{
    (void)unused;
    rc_tls_worker = 1;
    pthread_mutex_lock(&rc_pool.mu);
    for (;;) {
        rc_job *j = rc_pick();
        if (j) {
            j->slots--;
            __atomic_add_fetch(&j->helpers_in, 1, __ATOMIC_RELAXED);
            rc_pool.busy++;
            pthread_mutex_unlock(&rc_pool.mu);
            rc_job_work(j);
            pthread_mutex_lock(&rc_pool.mu);
            rc_pool.busy--;
            /* read before leaving: once helpers_in is 0 the caller may return and j is gone */
            const int waiting = j->waiting;
            if (__atomic_sub_fetch(&j->helpers_in, 1, __ATOMIC_RELEASE) == 0 && waiting)
                pthread_cond_broadcast(&rc_pool.done);
            continue;
        }
        /* kernels come one after another: look for the next job for about 0.1 ms before
           sleeping (a wake-up from the condition variable costs as much); yield, not just
           pause, so a runnable thread of this or another process gets the core meanwhile */
        const unsigned long seen = rc_pool.gen;
        pthread_mutex_unlock(&rc_pool.mu);
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        while (__atomic_load_n(&rc_pool.gen, __ATOMIC_ACQUIRE) == seen && rc_ns_since(&t0) < RC_SPIN_NS)
            sched_yield();
        pthread_mutex_lock(&rc_pool.mu);
        if (!rc_pick()) {
            rc_pool.idle++;
            pthread_cond_wait(&rc_pool.go, &rc_pool.mu);
            rc_pool.idle--;
            if (rc_pool.waking > 0)
                rc_pool.waking--;
        }
    }
    return NULL;
}

void rc_pool_forked(void)
{
    /* the child of a fork has none of the workers and none of the parent's jobs or runs */
    pthread_mutex_init(&rc_pool.mu, NULL);
    pthread_cond_init(&rc_pool.go, NULL);
    pthread_cond_init(&rc_pool.done, NULL);
    rc_pool.started = rc_pool.idle = rc_pool.busy = rc_pool.callers = rc_pool.waking = 0;
    rc_pool.first = rc_pool.last = NULL;
    rc_runs = 0;
    rc_tls_depth = 0;
    rc_tls_stop = NULL;
    rc_gate_forked();
}

int rc_job_threads(int threads)
{
    if (threads <= 1)
        return 1;
    if (rc_tls_solo)
        return 1;
    if (rc_machine_full(rc_now_ns())) {
        __atomic_add_fetch(&rc_load_alone, 1, __ATOMIC_RELAXED);
        return 1;
    }
    return threads;
}

/* fn(arg, part, parts) for every part in [0, parts), on the caller's thread and up to
 * threads - 1 workers, each taking the next part not taken yet; returns when all have
 * finished, or (the caller's run's stop flag set) when the parts already running have */
void rc_parallel(rc_part_f fn, void *arg, int parts, int threads)
{
    if (parts < 1)
        parts = 1;
    if (threads > RC_POOL_MAX)
        threads = RC_POOL_MAX;
    if (threads > parts)
        threads = parts;
    const int asked = threads;
    if (rc_tls_solo)
        threads = 1;
    long t_open = 0;
    if (threads > 1)
        t_open = rc_now_ns();
    rc_job j = {fn, arg, parts, 0, threads, threads - 1, 0, 0, 0, 0, rc_tls_stop, NULL, NULL, asked};
    if (threads <= 1) {
        rc_job_work(&j);
        return;
    }
    const int full = rc_machine_full(t_open);
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
    if (full) {
        /* the workers would wait for a core behind other processes' threads */
        rc_pool.last_threads = 1;
        pthread_mutex_unlock(&rc_pool.mu);
        j.threads = 1;
        j.slots = 0;
        __atomic_add_fetch(&rc_load_alone, 1, __ATOMIC_RELAXED);
        rc_job_work(&j);
        return;
    }
    j.older = rc_pool.last;
    if (rc_pool.last)
        rc_pool.last->newer = &j;
    else
        rc_pool.first = &j;
    rc_pool.last = &j;
    rc_pool.callers++;
    __atomic_store_n(&rc_pool.gen, rc_pool.gen + 1, __ATOMIC_RELEASE);
    /* wake only the workers that may join: the spinning ones see gen move */
    const int runs = __atomic_load_n(&rc_runs, __ATOMIC_RELAXED);
    const int outside = rc_pool.callers > runs ? rc_pool.callers : runs;
    int wake = threads - rc_pool.busy - outside;
    if (wake > j.slots)
        wake = j.slots;
    if (wake > rc_pool.idle)
        wake = rc_pool.idle;
    for (int w = 0; w < wake; w++)
        pthread_cond_signal(&rc_pool.go);
    if (wake > 0) /* several callers may signal the same sleepers: at most the idle */
        rc_pool.waking = rc_pool.waking + wake < rc_pool.idle ? rc_pool.waking + wake : rc_pool.idle;
    pthread_mutex_unlock(&rc_pool.mu);

    const int mine = rc_job_work(&j);
    const long t_worked = rc_now_ns();
    long t_end = t_worked;

    pthread_mutex_lock(&rc_pool.mu);
    /* closed: no worker joins any more; those inside finish the part they hold */
    if (j.older)
        j.older->newer = j.newer;
    else
        rc_pool.first = j.newer;
    if (j.newer)
        j.newer->older = j.older;
    else
        rc_pool.last = j.older;
    rc_pool.callers--;
    if (__atomic_load_n(&j.helpers_in, __ATOMIC_ACQUIRE) > 0) {
        /* watched for up to RC_SPIN_NS before sleeping (a futex sleep and wake-up cost more
           than most parts take) */
        pthread_mutex_unlock(&rc_pool.mu);
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int n = 0; __atomic_load_n(&j.helpers_in, __ATOMIC_ACQUIRE) > 0; n++) {
            RC_PAUSE();
            if ((n & 63) == 63 && rc_ns_since(&t0) > RC_SPIN_NS)
                break;
        }
        pthread_mutex_lock(&rc_pool.mu);
        j.waiting = 1;
        while (__atomic_load_n(&j.helpers_in, __ATOMIC_ACQUIRE) > 0)
            pthread_cond_wait(&rc_pool.done, &rc_pool.mu);
        t_end = rc_now_ns();
        rc_note_wait(t_worked - t_open, t_end - t_worked, mine, parts);
    }
    const int ran = __atomic_load_n(&j.ran, __ATOMIC_RELAXED);
    rc_pool.last_threads = ran;
    pthread_mutex_unlock(&rc_pool.mu);
    __atomic_add_fetch(&rc_jobs, 1, __ATOMIC_RELAXED);
    if (ran <= 1 && mine > 0)
        __atomic_add_fetch(&rc_alone, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&rc_job_ns, (unsigned long)(t_end - t_open), __ATOMIC_RELAXED);
    __atomic_add_fetch(&rc_wait_ns, (unsigned long)(t_end - t_worked), __ATOMIC_RELAXED);
}

/* ---- the gate: runs admitted at once ------------------------------------------------------ */

/* a run waiting for its turn (on its thread's stack, in the queue under rc_gate.mu) */
typedef struct rc_waiter {
    pthread_cond_t cv;
    int limit;               /* admitted while fewer runs than this are in flight (-1: the default's) */
    int admitted;            /* the slot was handed to it (under mu) */
    struct rc_waiter *next;
} rc_waiter;

static struct {
    pthread_mutex_t mu;
    int admitted;            /* runs holding a slot */
    int queued;              /* runs waiting */
    rc_waiter *head, *tail;  /* the waiting runs, first come first */
} rc_gate = {PTHREAD_MUTEX_INITIALIZER, 0, 0, NULL, NULL};

/* a waiting run reads its stop flag this often (RunOptions.terminate ends a run within 100 ms),
 * and on the main thread Python's pending signals (Ctrl-C) */
#define RC_GATE_POLL_NS 10000000L

static int rc_gate_limit = -1;        /* atomic: the default limit (0: none); -1 until read */
static pthread_once_t rc_gate_once = PTHREAD_ONCE_INIT;
static unsigned long rc_gate_waited;  /* atomic: runs that waited for a slot, ever */
static unsigned long rc_gate_wait_ns; /* atomic: their waits, ns */

static void rc_gate_init(void)
{
    /* RUNTIME_CORE_CPU_MAX_RUNS: a count (0: no limit); otherwise the cores the process may use */
    int limit = rc_cores();
    const char *e = getenv("RUNTIME_CORE_CPU_MAX_RUNS");
    if (e && *e) {
        char *end;
        const long v = strtol(e, &end, 10);
        if (*end == '\0' && v >= 0 && v <= 1L << 20)
            limit = (int)v;
    }
    int unset = -1;
    __atomic_compare_exchange_n(&rc_gate_limit, &unset, limit, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

static int rc_gate_default(void)
{
    pthread_once(&rc_gate_once, rc_gate_init);
    return __atomic_load_n(&rc_gate_limit, __ATOMIC_RELAXED);
}

static void rc_gate_forked(void)
{
    /* the child has none of the parent's runs; waiters' stacks belong to threads it lacks */
    pthread_mutex_init(&rc_gate.mu, NULL);
    rc_gate.admitted = rc_gate.queued = 0;
    rc_gate.head = rc_gate.tail = NULL;
}

static int rc_gate_of(int limit)
{
    return limit < 0 ? rc_gate_default() : limit;
}

/* hand free slots to the waiting runs in order (under mu): the first waits while the runs in
 * flight reach its limit, and those behind it wait behind it */
static void rc_gate_admit(void)
{
    while (rc_gate.head) {
        const int limit = rc_gate_of(rc_gate.head->limit);
        if (limit > 0 && rc_gate.admitted >= limit)
            break;
        rc_waiter *w = rc_gate.head;
        rc_gate.head = w->next;
        if (!rc_gate.head)
            rc_gate.tail = NULL;
        rc_gate.queued--;
        rc_gate.admitted++;
        w->admitted = 1;
        pthread_cond_signal(&w->cv);
    }
}

static void rc_gate_leave(void)
{
    pthread_mutex_lock(&rc_gate.mu);
    rc_gate.admitted--;
    rc_gate_admit();
    pthread_mutex_unlock(&rc_gate.mu);
}

/* take w out of the queue, not admitted (under rc_gate.mu): those behind it may now go */
static void rc_gate_unqueue(rc_waiter *w)
{
    rc_waiter **p = &rc_gate.head, *prev = NULL;
    while (*p != w) {
        prev = *p;
        p = &(*p)->next;
    }
    *p = w->next;
    if (rc_gate.tail == w)
        rc_gate.tail = prev;
    rc_gate.queued--;
    rc_gate_admit();
}

/* whether this is Python's main thread, the one its signal handlers run on (with the GIL; read
 * only when a run must wait) */
static int rc_gate_on_main(void)
{
    int yes = 0;
    PyObject *threading = PyImport_ImportModule("threading");
    PyObject *main = threading ? PyObject_CallMethod(threading, "main_thread", NULL) : NULL;
    PyObject *ident = main ? PyObject_GetAttrString(main, "ident") : NULL;
    if (ident && PyLong_Check(ident))
        yes = PyLong_AsUnsignedLong(ident) == PyThread_get_thread_ident();
    Py_XDECREF(ident);
    Py_XDECREF(main);
    Py_XDECREF(threading);
    PyErr_Clear();
    return yes;
}

/* take a slot for a run of this limit (0: none, it still counts as in flight; -1: run_gate's,
 * read again while it waits), waiting behind the runs that came first; called with the GIL,
 * released while waiting. Returns 1; 0 when stop's first byte was set while it waited; -1 with
 * the exception set when a signal handler raised while it waited on the main thread (Ctrl-C's
 * KeyboardInterrupt); no slot is held after 0 or -1 */
static int rc_gate_enter(int limit, const volatile unsigned char *stop)
{
    const int now = rc_gate_of(limit);
    pthread_mutex_lock(&rc_gate.mu);
    if (now == 0 || (!rc_gate.head && rc_gate.admitted < now)) {
        rc_gate.admitted++;
        pthread_mutex_unlock(&rc_gate.mu);
        return 1;
    }
    pthread_mutex_unlock(&rc_gate.mu);
    const int on_main = rc_gate_on_main(); /* Python code: not under the gate's mutex */
    pthread_mutex_lock(&rc_gate.mu);
    if (now == 0 || (!rc_gate.head && rc_gate.admitted < now)) { /* a slot freed meanwhile */
        rc_gate.admitted++;
        pthread_mutex_unlock(&rc_gate.mu);
        return 1;
    }
    rc_waiter w;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w.cv, &ca);
    pthread_condattr_destroy(&ca);
    w.limit = limit;
    w.admitted = 0;
    w.next = NULL;
    if (rc_gate.tail)
        rc_gate.tail->next = &w;
    else
        rc_gate.head = &w;
    rc_gate.tail = &w;
    rc_gate.queued++;
    const long t0 = rc_now_ns();
    int ok = 1;
    Py_BEGIN_ALLOW_THREADS
    while (!w.admitted) {
        if (stop && __atomic_load_n(stop, __ATOMIC_RELAXED)) { /* cancelled while waiting */
            rc_gate_unqueue(&w);
            ok = 0;
            break;
        }
        if (stop || on_main) {
            const long until = rc_now_ns() + RC_GATE_POLL_NS;
            const struct timespec ts = {until / 1000000000L, until % 1000000000L};
            pthread_cond_timedwait(&w.cv, &rc_gate.mu, &ts);
        } else {
            pthread_cond_wait(&w.cv, &rc_gate.mu);
        }
        if (on_main && !w.admitted) {
            /* the handlers run with the GIL, never under the gate's mutex (a thread holding the
             * GIL may be taking it) */
            pthread_mutex_unlock(&rc_gate.mu);
            Py_BLOCK_THREADS
            const int raised = PyErr_CheckSignals() < 0;
            Py_UNBLOCK_THREADS
            pthread_mutex_lock(&rc_gate.mu);
            if (raised) {
                if (w.admitted) { /* handed a slot meanwhile: back to the next in line */
                    rc_gate.admitted--;
                    rc_gate_admit();
                } else {
                    rc_gate_unqueue(&w);
                }
                ok = -1;
                break;
            }
        }
    }
    pthread_mutex_unlock(&rc_gate.mu);
    Py_END_ALLOW_THREADS
    pthread_cond_destroy(&w.cv);
    __atomic_add_fetch(&rc_gate_waited, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&rc_gate_wait_ns, (unsigned long)(rc_now_ns() - t0), __ATOMIC_RELAXED);
    return ok;
}

/* run_gate(limit=None) -> the default limit before: the runs a run (run_enter's limit -1) lets
 * be in flight before it waits; 0: no limit; None reads it */
PyObject *rc_py_run_gate(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o = Py_None;
    if (!PyArg_ParseTuple(args, "|O:run_gate", &o))
        return NULL;
    const int before = rc_gate_default();
    if (o != Py_None) {
        const long v = PyLong_AsLong(o);
        if (v == -1 && PyErr_Occurred())
            return NULL;
        if (v < 0 || v > 1L << 20) {
            PyErr_Format(PyExc_ValueError, "run_gate: the limit must be a count in [0, 2^20] (0: none), got %ld", v);
            return NULL;
        }
        __atomic_store_n(&rc_gate_limit, (int)v, __ATOMIC_RELAXED);
        /* a higher limit may admit waiting runs now */
        pthread_mutex_lock(&rc_gate.mu);
        rc_gate_admit();
        pthread_mutex_unlock(&rc_gate.mu);
    }
    return PyLong_FromLong(before);
}

/* pool_stats() -> (workers started, threads that ran parts of the last pooled job, runs in
 * flight, parts skipped for a stop flag and parts of jobs asking for several threads (run
 * alone or not) started since the module loaded,
 * stalls seen since then, jobs opened to workers, of those the jobs no worker ran a part of,
 * their wall time and their callers' waits on workers after their own parts (ns), and the
 * jobs their callers ran alone for the machine's load; then the runs that waited for the gate
 * since the module loaded, their waits (ns), and the runs holding a slot and waiting now) */
PyObject *rc_py_pool_stats(PyObject *self, PyObject *args)
{
    (void)self;
    (void)args;
    pthread_mutex_lock(&rc_pool.mu);
    const int started = rc_pool.started, last = rc_pool.last_threads;
    pthread_mutex_unlock(&rc_pool.mu);
    pthread_mutex_lock(&rc_gate.mu);
    const int admitted = rc_gate.admitted, queued = rc_gate.queued;
    pthread_mutex_unlock(&rc_gate.mu);
    return Py_BuildValue("(iiikkkkkkkkkkii)", started, last, __atomic_load_n(&rc_runs, __ATOMIC_RELAXED),
                         __atomic_load_n(&rc_skipped, __ATOMIC_RELAXED),
                         __atomic_load_n(&rc_started, __ATOMIC_RELAXED),
                         __atomic_load_n(&rc_stalls, __ATOMIC_RELAXED),
                         __atomic_load_n(&rc_jobs, __ATOMIC_RELAXED),
                         __atomic_load_n(&rc_alone, __ATOMIC_RELAXED),
                         __atomic_load_n(&rc_job_ns, __ATOMIC_RELAXED),
                         __atomic_load_n(&rc_wait_ns, __ATOMIC_RELAXED),
                         __atomic_load_n(&rc_load_alone, __ATOMIC_RELAXED),
                         __atomic_load_n(&rc_gate_waited, __ATOMIC_RELAXED),
                         __atomic_load_n(&rc_gate_wait_ns, __ATOMIC_RELAXED), admitted, queued);
}

typedef struct {
    int *counts;
    long stall_us, part_us;
    int by_workers; /* atomic: parts pool workers ran */
} rc_probe_job;

static void rc_sleep_us(long us)
{
    const struct timespec d = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&d, NULL);
}

static void rc_probe_part(void *arg, int part, int parts)
{
    (void)parts;
    rc_probe_job *j = (rc_probe_job *)arg;
    if (rc_tls_worker) {
        __atomic_add_fetch(&j->by_workers, 1, __ATOMIC_RELAXED);
        if (j->stall_us > 0)
            rc_sleep_us(j->stall_us);
    }
    if (j->part_us > 0)
        rc_sleep_us(j->part_us);
    __atomic_add_fetch(&j->counts[part], 1, __ATOMIC_RELAXED);
}

/* pool_probe(counts, threads, stall_us, part_us=0) -> parts that pool workers ran: a job of one
 * part an int32 of counts, each adding 1 to its own after sleeping part_us; a part a worker runs
 * first sleeps stall_us more (a worker descheduled mid-part), for the tests of the pool */
PyObject *rc_py_pool_probe(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *co;
    int threads;
    long stall_us, part_us = 0;
    if (!PyArg_ParseTuple(args, "Oil|l:pool_probe", &co, &threads, &stall_us, &part_us))
        return NULL;
    Py_buffer v;
    if (PyObject_GetBuffer(co, &v, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    const Py_ssize_t n = v.len / (Py_ssize_t)sizeof(int);
    if (n < 1 || n > RC_PARTS_FINE_MAX || stall_us < 0 || stall_us > 1000000 || part_us < 0 || part_us > 100000) {
        PyBuffer_Release(&v);
        PyErr_SetString(PyExc_ValueError,
                        "pool_probe: 1 to 4096 int32 counts, stall_us in [0, 1e6] and part_us in [0, 1e5]");
        return NULL;
    }
    rc_probe_job j = {(int *)v.buf, stall_us, part_us, 0};
    Py_BEGIN_ALLOW_THREADS
    rc_parallel(rc_probe_part, &j, (int)n, threads);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    return PyLong_FromLong(__atomic_load_n(&j.by_workers, __ATOMIC_RELAXED));
}

/* pool_load_rule(on=None, others=None) -> (on, others) before: whether a job runs on its caller
 * alone while other processes' runnable threads fill the cores, and the count of them to assume
 * (-1: read /proc/loadavg; tests force one); None leaves a setting as it is */
PyObject *rc_py_pool_load_rule(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *names[] = {"on", "others", NULL};
    PyObject *on_o = Py_None, *others_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO:pool_load_rule", names, &on_o, &others_o))
        return NULL;
    int on = -1, others = -2;
    if (on_o != Py_None && (on = PyObject_IsTrue(on_o)) < 0)
        return NULL;
    if (others_o != Py_None) {
        const long v = PyLong_AsLong(others_o);
        if (v == -1 && PyErr_Occurred())
            return NULL;
        if (v < -1 || v > 1L << 20) {
            PyErr_Format(PyExc_ValueError,
                         "pool_load_rule: others must be -1 (read /proc/loadavg) or a count in [0, 2^20], got %ld", v);
            return NULL;
        }
        others = (int)v;
    }
    pthread_once(&rc_load_once, rc_load_init);
    const int was_on = __atomic_load_n(&rc_load_on, __ATOMIC_RELAXED);
    const int was = __atomic_load_n(&rc_load_forced, __ATOMIC_RELAXED);
    if (on >= 0)
        __atomic_store_n(&rc_load_on, on, __ATOMIC_RELAXED);
    if (others >= -1)
        __atomic_store_n(&rc_load_forced, others, __ATOMIC_RELAXED);
    /* the next job reads the count afresh */
    __atomic_store_n(&rc_load_next, 0L, __ATOMIC_RELAXED);
    __atomic_store_n(&rc_load_full, 0, __ATOMIC_RELAXED);
    return Py_BuildValue("(Ni)", PyBool_FromLong(was_on), was);
}

/* pool_load_full() -> whether a job opened now would run on its caller alone for the load
 * (the count read now) */
PyObject *rc_py_pool_load_full(PyObject *self, PyObject *args)
{
    (void)self;
    (void)args;
    __atomic_store_n(&rc_load_next, 0L, __ATOMIC_RELAXED);
    return PyBool_FromLong(rc_machine_full(rc_now_ns()));
}

/* run_solo(on) -> before: whether the jobs this thread opens run on it alone (a run whose
 * kernels were measured faster without the pool, execution/solo.py) */
PyObject *rc_py_run_solo(PyObject *self, PyObject *on)
{
    (void)self;
    const int v = PyObject_IsTrue(on);
    if (v < 0)
        return NULL;
    const int before = rc_tls_solo;
    rc_tls_solo = v;
    return PyBool_FromLong(before);
}

/* ---- the run scope --------------------------------------------------------------------- */

typedef struct {
    Py_buffer view;
    int held;                                 /* view is held */
    const volatile unsigned char *prev_stop;  /* the enclosing scope's flag */
    int thread_depth;                         /* rc_tls_depth after entering */
    int gated;                                /* holds a slot of the gate */
} rc_scope;

static void rc_scope_free(PyObject *cap)
{
    rc_scope *s = (rc_scope *)PyCapsule_GetPointer(cap, "runtime_provider_cpu._native.run_scope");
    if (!s)
        return;
    if (s->held)
        PyBuffer_Release(&s->view);
    if (s->gated) /* a scope dropped without run_exit still frees its run's slot */
        rc_gate_leave();
    PyMem_Free(s);
}

/* run_enter(flag, limit=-1, joined=False) -> scope, or None: this thread's kernels poll flag (a
 * writable buffer whose first byte becomes nonzero when the run is to end; None: the enclosing
 * scope's) until run_exit(scope); the outermost scope of a thread counts as a run in flight.
 * An outermost scope not joined first takes a slot of the gate: it waits while `limit` runs
 * (-1: run_gate's; 0: no limit) are in flight, and returns None, entering nothing, when flag
 * was set meanwhile. joined: a thread working for a run already admitted (never waits) */
PyObject *rc_py_run_enter(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *names[] = {"flag", "limit", "joined", NULL};
    PyObject *flag;
    int limit = -1, joined = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|ip:run_enter", names, &flag, &limit, &joined))
        return NULL;
    if (limit < -1) {
        PyErr_Format(PyExc_ValueError, "run_enter: limit must be -1 (the default), 0 (none) or a count, got %d",
                     limit);
        return NULL;
    }
    rc_scope *s = (rc_scope *)PyMem_Calloc(1, sizeof(rc_scope));
    if (!s)
        return PyErr_NoMemory();
    if (flag != Py_None) {
        if (PyObject_GetBuffer(flag, &s->view, PyBUF_WRITABLE) < 0) {
            PyMem_Free(s);
            return NULL;
        }
        s->held = 1;
        if (s->view.len < 1) {
            PyBuffer_Release(&s->view);
            PyMem_Free(s);
            PyErr_SetString(PyExc_ValueError, "run_enter: the stop flag must hold at least one byte");
            return NULL;
        }
    }
    PyObject *cap = PyCapsule_New(s, "runtime_provider_cpu._native.run_scope", rc_scope_free);
    if (!cap) {
        if (s->held)
            PyBuffer_Release(&s->view);
        PyMem_Free(s);
        return NULL;
    }
    if (rc_tls_depth == 0 && !joined) {
        const volatile unsigned char *stop =
            s->held ? (const volatile unsigned char *)s->view.buf : rc_tls_stop;
        const int got = rc_gate_enter(limit, stop);
        if (got <= 0) {
            Py_DECREF(cap); /* releases the view */
            if (got < 0)
                return NULL; /* a signal handler's exception: Ctrl-C while waiting */
            Py_RETURN_NONE;
        }
        s->gated = 1;
    }
    s->prev_stop = rc_tls_stop;
    if (s->held)
        rc_tls_stop = (const volatile unsigned char *)s->view.buf;
    if (rc_tls_depth++ == 0)
        __atomic_add_fetch(&rc_runs, 1, __ATOMIC_RELAXED);
    s->thread_depth = rc_tls_depth;
    return cap;
}

/* run_exit(scope): the scope run_enter opened on this thread ends (scopes end innermost first) */
PyObject *rc_py_run_exit(PyObject *self, PyObject *cap)
{
    (void)self;
    rc_scope *s = (rc_scope *)PyCapsule_GetPointer(cap, "runtime_provider_cpu._native.run_scope");
    if (!s)
        return NULL;
    if (s->thread_depth != rc_tls_depth || s->thread_depth <= 0) {
        PyErr_SetString(PyExc_RuntimeError, "run_exit: not the innermost run scope of this thread");
        return NULL;
    }
    rc_tls_stop = s->prev_stop;
    if (--rc_tls_depth == 0)
        __atomic_sub_fetch(&rc_runs, 1, __ATOMIC_RELAXED);
    s->thread_depth = -1;
    if (s->gated) {
        s->gated = 0;
        rc_gate_leave();
    }
    if (s->held) {
        PyBuffer_Release(&s->view);
        s->held = 0;
    }
    Py_RETURN_NONE;
}
