/* scheduler: continuous (iteration-level), SLO-aware batching over a paged KV cache.
 *
 * One compute thread owns the model, the KV cache and every sequence. Each step it runs the next
 * decode token of every running sequence plus chunks of waiting prompts up to a token budget
 * (prefill and decode share a step; requests join and leave at step boundaries).
 *
 * KV: a sequence owns a block table; blocks come from the kv_cache free list as it grows. When the
 * list runs dry the newest running sequence is preempted (blocks freed, requeued, recomputed from
 * its prompt + generated tokens later), so a running request never fails for lack of blocks that
 * waiting would free; only a sequence that cannot fit the whole pool alone ends ("length").
 *
 * SLOs: each request has ttft_ms / tpot_ms targets (config defaults). A step model predicts the
 * step time: it starts from a prior (sched_set_prior) and is refitted from every step timed
 * (step_model.h: struct step_online); a waiting request (or chunk of it) is admitted only if the
 * predicted step, widened by the model's own error estimate, still lets every running request
 * keep its slack (its next token due by t_first + n_generated * tpot, prefills by arrival + ttft;
 * a step may always take one TPOT, so a request already behind cannot starve the queue). The
 * waiting queue is served least slack first. Nothing is timed before serving: while the compute
 * thread is idle it runs the calibration shapes the steps have not covered yet, one step at a
 * time, each no longer than half the TTFT target, and says when the model is calibrated.
 * --static-batch N instead admits N requests at once and runs them to the end (the baseline).
 *
 * Threads: the front submits requests (sched_submit) and cancels them (sched_cancel: a flag the
 * scheduler sees at the next step boundary, freeing the blocks at once). The scheduler appends
 * text to the request's outbox under its small mutex and calls notify(); no lock is held across a
 * model step. A request is reference-counted (front + scheduler + pending notification). */
#ifndef STRATA_SCHEDULER_H
#define STRATA_SCHEDULER_H

#include "os/common/errmsg.h"
#include "serving/api/metrics.h"
#include "serving/sched/step_model.h"
#include "serving/engine/engine.h"
#include "serving/engine/kv_cache.h"
#include "serving/engine/sampler.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#define SREQ_MAX_STOP 4

enum sreq_finish {
    FINISH_NONE,
    FINISH_STOP,
    FINISH_LENGTH,
    FINISH_CANCELLED,
    FINISH_ERROR,
    FINISH_REJECTED /* shed: could not start within its TTFT (sched_config.shed_late) */
};

struct sreq {
    /* Input: set before sched_submit, never changed after. Owned (freed by sreq_put). */
    int *prompt;
    int n_prompt;
    int max_tokens, min_tokens, ignore_eos;
    struct sampler_params sp;
    char *stop[SREQ_MAX_STOP];
    int n_stop;
    double ttft_ms, tpot_ms; /* 0: scheduler defaults */
    double t_arrival;        /* clock_now() */

    /* The caller's. */
    void *user;
    /* The notifier's list link: serve_front strings the requests it must deliver through these
     * (front_notify); nobody else touches them. */
    struct sreq *notify_next;
    atomic_int notify_pending;
    /* The scheduler's: the output so far, its lock, the reference count (scheduler.c). Read the
     * output with sreq_output() / sreq_finish() / sreq_n_generated(). */
    struct sreq_state *st;
};

/* A consistent copy of what the scheduler produced for a request so far. */
struct sreq_output {
    int finish; /* enum sreq_finish; final once set */
    int n_generated;
    int n_cached; /* prompt tokens taken from the prefix cache when it was admitted */
    char *text;   /* sendable text so far (stop strings cut, partial UTF-8 held back): a malloc'd,
                   NUL-terminated copy the caller frees */
    size_t text_len;
    double t_first_token, t_done;
    char error[ERRMSG_LEN];
};

/* Fills out under the request's lock; -1 when the text could not be copied (out of memory). */
int sreq_output(struct sreq *r, struct sreq_output *out);
int sreq_finish(struct sreq *r);      /* enum sreq_finish, FINISH_NONE while running */
int sreq_n_generated(struct sreq *r); /* tokens generated so far */

struct sreq *sreq_new(void); /* refs = 1 */
void sreq_get(struct sreq *r);
void sreq_put(struct sreq *r);

/* Cooperative execution (cluster/coop.h). A joiner runs layers [0, k) of each step itself and the
 * rest on a helper; a helper runs other nodes' steps inside its own (forward) or between them
 * (serve). Every hook runs on the compute thread; a NULL hook is not used (all NULL: a node that
 * serves alone). */
#define SCHED_COOP_REFUSED (-2) /* sched_coop.step / recv: the helper had no KV blocks for it */

struct sched_coop {
    void *ctx;
    int n_layers;
    int start_k; /* with `resident`: the layers run here before the first boundary (0: none) */
    /* Step boundary: the layers this node runs itself from now on (n_layers: all). Lower than
     * before only with `lower` (a hand-over). `steps` counts the steps run so far. */
    int (*resident)(void *ctx, unsigned long long steps);
    /* 1 when a split step can run now (a helper is connected). */
    int (*ready)(void *ctx);
    /* k rose from k0 to k1: make layers [k0, k1) of the KV of the n_seqs running sequences
     * seq[i], whose positions [0, n[i]) are computed, valid here (blocks[i]: its block table),
     * all of them at once (one transfer, one batched recompute). rc[i]: 1 transferred, 0
     * recomputed, -1 failed (errs + i * ERRMSG_LEN: why). */
    void (*fill)(void *ctx, int n_seqs, const unsigned *seq, const int *const *blocks, const int *n,
                 int k0, int k1, int *rc, char *errs);
    /* k fell (a hand-over, cluster/coop.h): open the n_seqs running sequences seq[i], whose
     * positions [0, n[i]) are computed (their token ids tok[i]), at the helper with their
     * samplers, and have it compute their KV of every layer, all at once. 0: done, the steps run
     * there from now on; -1 (err): none moved (k stays; they keep running here). NULL: k never
     * falls. */
    int (*lower)(void *ctx, int n_seqs, const unsigned *seq, struct sampler *const *smp,
                 const int *const *tok, const int *n, char *err);
    /* Run b with layers [0, k) here and [k, L) + head remote. Row i belongs to sequence seq[i]
     * whose sampler is smp[i]; tokens[j] is logit row j's token (its sampler's generator state
     * updated), end-of-sequence excluded where mask[j]. 0, -1 failed (err: its sequences fail),
     * or SCHED_COOP_REFUSED: the helper ran none of it for lack of KV blocks (err: why); its
     * sequences stay, their rows to be sent again, and the newest running sequence gives way
     * (requeued as a preemption, seq_end called: its blocks at the helper freed). */
    int (*step)(void *ctx, const struct batch *b, int k, const unsigned *seq,
                struct sampler *const *smp, const unsigned char *mask, int *tokens, char *err);
    /* Pipelined split steps (NULL: every split step through `step`). send starts b like step
     * (layers [0, k) here, the rest sent) and returns without its tokens: 0 in flight, 1 cannot
     * go in flight (run it with step once nothing is in flight), -1 failed (err). recv waits
     * for the oldest step in flight: tokens[j] and the sampler's generator state rng[j] after
     * drawing it, per logit row j (the caller updates its samplers); -1 (err) the step failed;
     * SCHED_COOP_REFUSED as for step (a later step in flight with rows of the same sequences is
     * discarded for them: they are sent again in order). */
    int (*send)(void *ctx, const struct batch *b, int k, const unsigned *seq,
                struct sampler *const *smp, const unsigned char *mask, char *err);
    int (*recv)(void *ctx, int *tokens, uint64_t *rng, char *err);
    /* k reached n_layers: nothing of this node's runs remote any more. */
    void (*all_local)(void *ctx);
    /* Step boundary, for each running sequence with computed positions: NULL, or why its state
     * at the helper is gone (the helper failed): the sequence fails with that message. */
    const char *(*lost)(void *ctx, unsigned seq);
    /* A sequence is gone (finished, failed, cancelled). */
    void (*seq_end)(void *ctx, unsigned seq);
    /* Helper: run queued remote work; 1 if any ran. hold = 1 (only with `forward`): other nodes'
     * activations stay queued for the next step's forward to fuse, and so does whatever came
     * after them from the same peer; hold = 0: everything runs now. */
    int (*serve)(void *ctx, int hold);
    /* Helper: this node's own step b, computed as sched_ops.forward computes it (logits of b's
     * logit rows), with the activations serve held (and those that arrive meanwhile) fused in;
     * their tokens are sampled with their own samplers and answered inside. 1: no remote work
     * (run sched_ops.forward); 0 done; -1 failed (err; the fused remote steps are answered with
     * the error). Activations that did not fit stay held for the next step (or serve(ctx, 0)).
     * NULL: remote steps always run apart. */
    int (*forward)(void *ctx, const struct batch *b, float *logits, char *err);
};

struct sched_ops {
    void *ctx; /* for forward */
    int vocab_size;
    int eos_id;         /* ends a completion ("stop") */
    int bos_id;         /* BOS: generating it ends a sequence too (llama2.c models emit it between
                   stories); -1 none */
    const int *eog_ids; /* the vocabulary's other end-of-generation tokens (tokenizer_is_eog: */
    int n_eog;          /* <|eot_id|>, <|im_end|>, ...): each ends a completion like eos_id */
    int (*forward)(void *ctx, const struct batch *b, float *logits, char *err); /* -1 + err */
    /* Bytes of token id following prev (tokenizer_decode). */
    void *decode_ctx;
    const char *(*decode)(void *decode_ctx, int prev, int id, char *scratch, size_t *len);
    /* A request has new output or finished. Called from the scheduler thread. */
    void *notify_ctx;
    void (*notify)(void *notify_ctx, struct sreq *r);
    /* After a step's notifications: wake the front once. */
    void (*wake)(void *notify_ctx);
    /* Idle calibration covered every shape (once; the compute thread): the fitted model, its
     * error estimate and the steps it was fitted from, e.g. to cache. NULL: not told. */
    void *model_ctx;
    void (*calibrated)(void *model_ctx, const struct step_model *m, double err, long steps);
    struct sched_coop coop;
};

struct sched_config {
    int max_seqs;            /* running sequences */
    int max_step_tokens;     /* token budget per step */
    int ctx;                 /* positions per sequence */
    int static_batch;        /* > 0: static batching baseline with this batch size */
    int static_shrink;       /* static: a finished sequence leaves the batch's compute at once
                                (default: it stays as padding, decoding into the void until the
                                whole batch is done, as a fixed-shape batch does) */
    double static_wait_ms;   /* static: start a partial batch when the oldest waited this long */
    double ttft_ms, tpot_ms; /* default SLOs */
    int no_slo_admission;    /* ablation: admit whenever blocks and budget allow */
    int no_prefix_cache;     /* compute every prompt whole (default: a prompt takes the KV blocks
                                of the longest prefix an earlier sequence computed and left
                                cached, serving/sched/prefix_cache.h; off with static batching) */
    int shed_late;           /* reject (503) a waiting request whose TTFT deadline passed before it
                                was ever admitted, instead of serving it late: under overload the
                                capacity goes to requests that can still meet their SLO */
    int step_delay_us; /* tests: sleep in each step (its time) so the tiny model is slow enough to cancel
                          mid-stream and to overlap requests */
    int idle_calibrate_ms; /* idle this long before a calibration step (0: 500; < 0: never) */
};

struct scheduler;

struct scheduler *sched_new(const struct sched_config *cfg, const struct sched_ops *ops,
                            struct kv_cache *kv, struct serve_metrics *m, char *err);
void sched_free(struct scheduler *s);
/* The step model to start from (before sched_start; default 100 us/token + 1 ms, error 100%): err
 * its uncertainty (0.2: steps may take 20% longer); calibrated: it was measured for this model on
 * this hardware (a cache), so idle calibration does not run. */
void sched_set_prior(struct scheduler *s, const struct step_model *m, double err, int calibrated);
const struct step_model *sched_step_model(const struct scheduler *s);
double sched_step_err(const struct scheduler *s);
/* Tests: pin the model (never refitted, err fixed, no idle calibration). */
void sched_set_step_model(struct scheduler *s, const struct step_model *m, double err);
/* Without the thread (tests): one idle calibration step if one is due (nothing running or waiting,
 * a shape not covered yet): 1 if one ran, 0 when there is none (calibration done or not idle),
 * -1 when it failed (calibration gives up, the model goes on from the steps alone). */
int sched_calibrate_idle(struct scheduler *s);
int sched_calibrated(const struct scheduler *s); /* 1 once every shape was covered (or cached) */
int sched_start(struct scheduler *s, char *err); /* the compute thread */
void sched_stop(struct scheduler *s);            /* finish: joins the thread, fails what's left */

/* Thread-safe. Takes a reference. Fails (returns -1, err) if the request can never fit. */
int sched_submit(struct scheduler *s, struct sreq *r, char *err);
void sched_cancel(struct scheduler *s, struct sreq *r);
/* Thread-safe: at its next iteration the compute thread fails every sequence it holds, waiting or
 * running, with `why` (FINISH_REJECTED: the front answers 503). For a model the cluster lost: the
 * helper those sequences wait for will not come back with the layers. */
void sched_fail_all(struct scheduler *s, const char *why);
/* Thread-safe: wake the compute thread (remote work arrived for sched_coop.serve). */
void sched_poke(struct scheduler *s);
/* The layers the compute thread ran itself at its last step boundary (n_layers when alone). */
int sched_resident(const struct scheduler *s);

/* Seconds the model step now running has taken (0 between steps), from any thread: a step that
 * never ends is a hung compute thread (serve stops petting the watchdog then). */
double sched_step_running_for(struct scheduler *s);

/* Without the thread (tests): take submissions, drop cancelled requests, run one step.
 * Returns 1 if a step ran or requests were retired, 0 when there was nothing to do. */
int sched_iterate(struct scheduler *s);

#endif
