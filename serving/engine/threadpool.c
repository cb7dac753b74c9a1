/* threadpool: workers wait on a generation counter; the caller bumps it to start a job, and
 * every thread, caller included, then claims the job's parts from one shared counter.
 *
 * Claiming (instead of "part i belongs to thread i") is what keeps a job from waiting on a
 * worker the OS has not scheduled: on a machine with more runnable threads than cores, the
 * threads that are running take all parts and the late worker finds nothing left. The counter
 * word holds the job's id, its part count and the next part, so a worker that wakes up late for
 * an old job can never claim a part of the next one with the old job's parameters; fn and ctx
 * are read only after a successful claim, and the job cannot end (nor the caller move on) while
 * a claimed part is unfinished.
 *
 * Waiting is spin-then-futex on both sides (see SPIN_NS). The sleeper flags let the waker skip
 * the futex syscall when nobody sleeps; they pair with the counters in the Dekker style (all
 * sequentially consistent atomics), so a wake is never lost. */
#include "serving/engine/threadpool.h"

#include "os/runtime/clock.h"
#include "os/common/errmsg.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* How long a waiting thread spins before it sleeps. It is a time, not a count of pause
 * instructions, because pause costs from ~10 ns (Intel before Skylake) to ~100 ns (Skylake and
 * later, and Zen under virtualization, measured here). A futex wake-up costs tens to hundreds of
 * microseconds in a VM, longer than a decode-sized job: a worker that has gone to sleep arrives
 * after the caller has done every part itself. With a 50 us budget that happened on most jobs
 * here (2 threads decoded no faster than 1); with 1 ms, stories110M Q8_0 decode went from 101 to
 * 213 tok/s on 2 threads. Yielding the core while waiting (sched_yield) lost it all again
 * whenever another process was runnable, so the wait spins; on the appliance the process owns
 * the machine, and an idle pool still sleeps 1 ms after its last job. */
#define SPIN_NS 1000000

/* The claim word: job id (24 bits) | part count (20 bits) | next part (20 bits). */
#define PART_BITS 20
#define PART_MASK ((1u << PART_BITS) - 1)
#define ID_MASK   0xffffffu
#define MAX_PARTS ((int)PART_MASK)

struct worker {
    struct threadpool *tp;
    pthread_t thread;
};

struct threadpool {
    int n;
    struct worker *workers; /* n - 1 of them; the caller is the n-th thread */
    threadpool_fn fn;
    void *ctx;
    _Alignas(64) atomic_int gen; /* bumped once per job (and once to stop) */
    atomic_int gen_sleepers;
    atomic_int stop;
    _Alignas(64) _Atomic uint64_t claim;
    _Alignas(64) atomic_int done; /* parts finished in the current job */
    atomic_int caller_sleeping;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Called on each turn of a wait loop: 1 while the spin budget lasts (it pauses), 0 when the
 * caller should sleep. The clock is read every 16 turns only. */
static int keep_spinning(unsigned *turn, uint64_t *start)
{
    if ((++*turn & 15) == 0) {
        uint64_t t = clock_now_ns();
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

/* Claim and run parts of job `id` until none are left. */
static void run_parts(struct threadpool *tp, unsigned id)
{
    uint64_t v = atomic_load(&tp->claim);
    for (;;) {
        unsigned next = (unsigned)(v & PART_MASK), n = (unsigned)(v >> PART_BITS) & PART_MASK;
        if ((unsigned)(v >> (2 * PART_BITS)) != id || next >= n) return;
        if (!atomic_compare_exchange_weak(&tp->claim, &v, v + 1)) continue;
        tp->fn(tp->ctx, (int)next, (int)n);
        if (atomic_fetch_add(&tp->done, 1) + 1 == (int)n && atomic_load(&tp->caller_sleeping))
            futex_wake(&tp->done);
        v = atomic_load(&tp->claim);
    }
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
        run_parts(tp, (unsigned)g & ID_MASK);
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

void threadpool_run_parts(struct threadpool *tp, threadpool_fn fn, void *ctx, int n_parts)
{
    if (n_parts < 1) return;
    if (tp->n == 1 || n_parts == 1 || n_parts > MAX_PARTS) {
        for (int i = 0; i < n_parts; i++) fn(ctx, i, n_parts);
        return;
    }
    tp->fn = fn;
    tp->ctx = ctx;
    atomic_store(&tp->done, 0);
    int g = (int)((unsigned)atomic_load(&tp->gen) + 1u); /* wraps, no signed overflow */
    unsigned id = (unsigned)g & ID_MASK;
    atomic_store(&tp->claim, ((uint64_t)id << (2 * PART_BITS)) | ((uint64_t)n_parts << PART_BITS));
    atomic_store(&tp->gen, g); /* the caller is the only writer of gen besides free */
    if (atomic_load(&tp->gen_sleepers)) futex_wake(&tp->gen);
    run_parts(tp, id);
    unsigned turn = 0;
    uint64_t start = 0;
    int d;
    while ((d = atomic_load(&tp->done)) != n_parts) {
        if (keep_spinning(&turn, &start)) continue;
        atomic_store(&tp->caller_sleeping, 1);
        if ((d = atomic_load(&tp->done)) != n_parts) futex_wait(&tp->done, d);
        atomic_store(&tp->caller_sleeping, 0);
        turn = 0;
        start = 0;
    }
}

void threadpool_run(struct threadpool *tp, threadpool_fn fn, void *ctx)
{
    threadpool_run_parts(tp, fn, ctx, tp->n);
}
