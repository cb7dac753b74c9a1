/* threadpool: a fixed set of worker threads that run one parallel job at a time.
 *
 * threadpool_run(tp, fn, ctx) calls fn(ctx, i, n) once for each i in [0, n), n = the pool size,
 * and returns when all calls have finished. Each i is claimed by whichever pool thread (the
 * caller included) gets to it first, so the calls for different i may run concurrently or one
 * after another on the same thread: give each i its own data (e.g. scratch row i), never assume
 * "i is thread i". That way a worker the OS has descheduled delays nobody: the running threads
 * take its parts. threadpool_run_parts() does the same for any number of parts (finer parts
 * balance better when threads are slowed unevenly). Workers spin briefly (50 us) on a
 * generation counter and then sleep on a futex, so back-to-back jobs in the forward pass cost a
 * few microseconds to dispatch. One caller at a time: the pool belongs to the compute thread
 * that created it. */
#ifndef STRATA_THREADPOOL_H
#define STRATA_THREADPOOL_H

typedef void (*threadpool_fn)(void *ctx, int ith, int nth);

struct threadpool;

/* n_threads >= 1 counts the caller. */
struct threadpool *threadpool_new(int n_threads, char *err);
void threadpool_free(struct threadpool *tp);
int threadpool_size(const struct threadpool *tp);
void threadpool_run(struct threadpool *tp, threadpool_fn fn, void *ctx);
void threadpool_run_parts(struct threadpool *tp, threadpool_fn fn, void *ctx, int n_parts);

#endif
