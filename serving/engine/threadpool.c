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
#include <sys/syscall.h>
#include <unistd.h>

/* About 20-50 us of pause on current x86 before a thread goes to sleep. */
#define SPIN_ITERS (1 << 13)

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
        int spins = 0;
        while ((g = atomic_load(&tp->gen)) == seen) {
            if (++spins < SPIN_ITERS) {
                cpu_relax();
                continue;
            }
            atomic_fetch_add(&tp->gen_sleepers, 1);
            if (atomic_load(&tp->gen) == seen) futex_wait(&tp->gen, seen);
            atomic_fetch_sub(&tp->gen_sleepers, 1);
            spins = 0;
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
    int spins = 0, p;
    while ((p = atomic_load(&tp->pending)) != 0) {
        if (++spins < SPIN_ITERS) {
            cpu_relax();
            continue;
        }
        atomic_store(&tp->caller_sleeping, 1);
        if ((p = atomic_load(&tp->pending)) != 0) futex_wait(&tp->pending, p);
        atomic_store(&tp->caller_sleeping, 0);
        spins = 0;
    }
}
