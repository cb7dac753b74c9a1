/* threadpool: a fixed set of worker threads that run one parallel job at a time.
 *
 * threadpool_run(tp, fn, ctx) calls fn(ctx, i, n) once on each of the n threads (the caller is
 * thread 0) and returns when all have finished. Workers spin briefly on a generation counter and
 * then sleep on a futex, so back-to-back jobs in the forward pass cost well under 10 us to
 * dispatch. One caller at a time: the pool belongs to the compute thread that created it. */
#ifndef STRATA_THREADPOOL_H
#define STRATA_THREADPOOL_H

typedef void (*threadpool_fn)(void *ctx, int ith, int nth);

struct threadpool;

/* n_threads >= 1 counts the caller. */
struct threadpool *threadpool_new(int n_threads, char *err);
void threadpool_free(struct threadpool *tp);
int threadpool_size(const struct threadpool *tp);
void threadpool_run(struct threadpool *tp, threadpool_fn fn, void *ctx);

#endif
