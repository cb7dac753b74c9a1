/* threadpool: workers wait on a generation counter; the caller bumps it to start a job.
 *
 * Waiting is spin-then-futex on both sides: a worker spins (with pause) for a while on `gen`
 * before it sleeps on the futex, and the caller spins on `pending` before it sleeps. In the
 * forward pass jobs come microseconds apart, so nobody sleeps and a dispatch costs a cache-line
 * round trip; between requests everyone sleeps and the pool costs nothing. The sleeper counts
 * let the waker skip the futex syscall when nobody sleeps; they pair with the counters in the
 * Dekker style (both sides use sequentially consistent atomics), so a wake is never lost. */
#include "serving/engine/threadpool.h"

#include "os/errmsg.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* How long a waiting thread spins before it sleeps. It is a time, not a count of pause
 * instructions, because pause costs from ~10 ns (Intel before Skylake) to ~100 ns (Skylake and
 * later, and Zen under virtualization, measured here). 50 us covers the gaps between the jobs of
 * a forward pass and between tokens; longer spinning only takes CPU from the thread doing the
 * serial work when cores are oversubscribed. */
#define SPIN_NS 50000

struct worker {
    struct threadpool *tp;
    int ith;
    pthread_t thread;
};

struct threadpool {
    int n;
    struct worker *workers; /* n - 1 of them; the caller is thread 0 */
    threadpool_fn fn;
    void *ctx;
    _Alignas(64) atomic_int gen; /* bumped once per job (and once to stop) */
    atomic_int gen_sleepers;
    _Alignas(64) atomic_int pending; /* workers still running the current job */
    atomic_int caller_sleeping;
    atomic_int stop;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Called on each turn of a wait loop: 1 while the spin budget lasts (it pauses), 0 when the
 * caller should sleep. The clock is read every 16 turns only. */
static int keep_spinning(unsigned *turn, uint64_t *start)
{
    if ((++*turn & 15) == 0) {
        uint64_t t = now_ns();
        if (!*start)
            *start = t;
        else if (t - *start > SPIN_NS)
            return 0;
    }
    cpu_relax();
    return 1;
}

static void futex_wait(atomic_int *addr, int val)
{
    syscall(SYS_futex, (int *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(atomic_int *addr)
{
    syscall(SYS_futex, (int *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct threadpool *tp = w->tp;
    int seen = 0;
    for (;;) {
        int g;
        unsigned turn = 0;
        uint64_t start = 0;
        while ((g = atomic_load(&tp->gen)) == seen) {
            if (keep_spinning(&turn, &start)) continue;
            atomic_fetch_add(&tp->gen_sleepers, 1);
            if (atomic_load(&tp->gen) == seen) futex_wait(&tp->gen, seen);
            atomic_fetch_sub(&tp->gen_sleepers, 1);
            turn = 0;
            start = 0;
        }
        seen = g;
        if (atomic_load(&tp->stop)) return NULL;
        tp->fn(tp->ctx, w->ith, tp->n);
        if (atomic_fetch_sub(&tp->pending, 1) == 1 && atomic_load(&tp->caller_sleeping))
            futex_wake(&tp->pending);
    }
}

struct threadpool *threadpool_new(int n_threads, char *err)
{
    if (n_threads < 1 || n_threads > 1024) {
        errmsg_set(err, "threadpool: %d threads: must be 1..1024", n_threads);
        return NULL;
    }
    struct threadpool *tp = aligned_alloc(64, sizeof *tp);
    if (!tp) {
        errmsg_set(err, "threadpool: out of memory");
        return NULL;
    }
    memset(tp, 0, sizeof *tp);
    tp->n = n_threads;
    if (n_threads > 1) {
        tp->workers = calloc((size_t)n_threads - 1, sizeof *tp->workers);
        if (!tp->workers) {
            free(tp);
            errmsg_set(err, "threadpool: out of memory");
            return NULL;
        }
    }
    for (int i = 1; i < n_threads; i++) {
        struct worker *w = &tp->workers[i - 1];
        w->tp = tp;
        w->ith = i;
        int rc = pthread_create(&w->thread, NULL, worker_main, w);
        if (rc != 0) {
            errmsg_set(err, "threadpool: pthread_create for thread %d of %d: %s", i, n_threads,
                       strerror(rc));
            tp->n = i; /* free what was started */
            threadpool_free(tp);
            return NULL;
        }
    }
    return tp;
}

void threadpool_free(struct threadpool *tp)
{
    if (!tp) return;
    atomic_store(&tp->stop, 1);
    atomic_fetch_add(&tp->gen, 1);
    futex_wake(&tp->gen);
    for (int i = 1; i < tp->n; i++) pthread_join(tp->workers[i - 1].thread, NULL);
    free(tp->workers);
    free(tp);
}

int threadpool_size(const struct threadpool *tp)
{
    return tp->n;
}

void threadpool_run(struct threadpool *tp, threadpool_fn fn, void *ctx)
{
    if (tp->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    tp->fn = fn;
    tp->ctx = ctx;
    atomic_store(&tp->pending, tp->n - 1);
    atomic_fetch_add(&tp->gen, 1); /* publishes fn and ctx (seq_cst) */
    if (atomic_load(&tp->gen_sleepers)) futex_wake(&tp->gen);
    fn(ctx, 0, tp->n);
    unsigned turn = 0;
    uint64_t start = 0;
    int p;
    while ((p = atomic_load(&tp->pending)) != 0) {
        if (keep_spinning(&turn, &start)) continue;
        atomic_store(&tp->caller_sleeping, 1);
        if ((p = atomic_load(&tp->pending)) != 0) futex_wait(&tp->pending, p);
        atomic_store(&tp->caller_sleeping, 0);
        turn = 0;
        start = 0;
    }
}
