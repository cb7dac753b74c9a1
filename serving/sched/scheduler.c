#include "serving/sched/scheduler.h"
#include "serving/sched/prefix_cache.h"

#include "os/runtime/clock.h"
#include "os/common/errmsg.h"
#include "os/runtime/log.h"
#include "serving/api/stop_string.h"
#include "serving/api/utf8.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MIN_CHUNK 8 /* smallest prompt chunk worth admitting under SLO pressure */

/* ---------------------------------------------------------------- requests */

/* The scheduler's side of a request (scheduler.h: struct sreq's st). */
struct sreq_state {
    pthread_mutex_t mu; /* guards the output below */
    char *text;
    size_t text_len, text_cap;
    int n_generated;
    int n_cached; /* prompt tokens whose KV came from the prefix cache (first admission) */
    int finish;
    double t_first_token, t_done;
    char error[ERRMSG_LEN];
    atomic_int cancelled;    /* sched_cancel: seen at the next step boundary */
    atomic_int refs;         /* front + scheduler + pending notification */
    struct sreq *queue_next; /* submission queue */
};

struct sreq *sreq_new(void)
{
    struct sreq *r = calloc(1, sizeof *r + sizeof *r->st);
    if (!r) return NULL;
    r->st = (struct sreq_state *)(r + 1);
    pthread_mutex_init(&r->st->mu, NULL);
    atomic_init(&r->st->refs, 1);
    return r;
}

void sreq_get(struct sreq *r)
{
    atomic_fetch_add(&r->st->refs, 1);
}

void sreq_put(struct sreq *r)
{
    if (!r || atomic_fetch_sub(&r->st->refs, 1) != 1) return;
    free(r->prompt);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->st->text);
    pthread_mutex_destroy(&r->st->mu);
    free(r);
}

int sreq_output(struct sreq *r, struct sreq_output *out)
{
    struct sreq_state *st = r->st;
    pthread_mutex_lock(&st->mu);
    out->finish = st->finish;
    out->n_generated = st->n_generated;
    out->n_cached = st->n_cached;
    out->text_len = st->text_len;
    out->t_first_token = st->t_first_token;
    out->t_done = st->t_done;
    memcpy(out->error, st->error, sizeof out->error);
    out->text = malloc(st->text_len + 1);
    if (out->text) {
        if (st->text_len) memcpy(out->text, st->text, st->text_len);
        out->text[st->text_len] = 0;
    }
    pthread_mutex_unlock(&st->mu);
    return out->text ? 0 : -1;
}

int sreq_finish(struct sreq *r)
{
    pthread_mutex_lock(&r->st->mu);
    int f = r->st->finish;
    pthread_mutex_unlock(&r->st->mu);
    return f;
}

int sreq_n_generated(struct sreq *r)
{
    pthread_mutex_lock(&r->st->mu);
    int n = r->st->n_generated;
    pthread_mutex_unlock(&r->st->mu);
    return n;
}

/* ---------------------------------------------------------------- sequences */

struct seq {
    struct sreq *r;
    unsigned id; /* names the sequence to a coop helper */
    int *tok;    /* prompt + generated, capacity ctx */
    int n_tok, n_computed;
    int *blocks; /* block table, capacity max_blocks */
    int n_blocks;
    struct sampler smp;
    char *text; /* all generated text (stop strings still in) */
    size_t text_len, text_cap, sent;
    int n_gen;
    long admit_order;
    double ttft, tpot; /* seconds */
    double t_admitted, t_first, t_last;
    int ever_admitted;
    int in_flight; /* coop pipelining: steps sent with rows of it and not answered yet */
    int awaiting;  /* one of them ends in its logit row: no row of it goes out until it is back */
    int alone_refused; /* split steps refused with it running alone, since its last token */
    int px;            /* its full blocks go to the prefix cache (every layer computed here) */
};

struct plan {
    struct seq *s;
    int n;
};

/* coop pipelining: a split step sent and not answered yet (sched_coop.send). Its plan's
 * sequences already count its positions as computed; one that is retired meanwhile is NULL here
 * (its answer is dropped). logit[p]: plan entry p ends in a logit row. */
struct flight {
    int active;
    struct plan *plan;
    unsigned char *logit;
    int n_plan, n_rows;
    double t0;
};

/* Static batching's padding: a sequence that finished while the rest of its batch runs keeps its
 * slot (and its KV blocks) and goes on decoding, output discarded, like a row of a fixed-shape
 * batch, until the batch is done. Its client already has its answer. */
struct pad {
    int *blocks; /* the finished sequence's block table (taken over), capacity max_blocks */
    int n_blocks;
    int pos, tok; /* next position to compute and the token fed there */
};

struct scheduler {
    _Atomic uint64_t step_started_ns; /* 0 between steps: sched_step_running_for() */
    struct sched_config cfg;
    struct sched_ops ops;
    struct kv_cache *kv;
    struct prefix_cache *px; /* NULL: off (--no-prefix-cache, static batching) */
    struct serve_metrics *m;
    struct step_online sm; /* the step model, refitted from every step (step_model.h) */
    int cal_done;          /* idle calibration: 1 every shape covered (or cached), -1 given up */
    int cal_steps;         /* calibration steps run */
    int max_blocks;        /* per sequence */

    struct seq **running;
    int n_running;
    struct seq **waiting;
    int n_waiting, cap_waiting;
    long admit_counter;

    /* step buffers, max_step_tokens each */
    int *b_token, *b_pos, *b_logit_rows;
    const int **b_blocks;
    /* coop: the step's sequence ids, and per logit row its sampler, EOS mask and token */
    unsigned *b_seq;
    struct sampler **b_smp;
    unsigned char *b_mask;
    int *b_out;
    int k;     /* layers run here (cfg n_layers when alone) */
    int fused; /* this iteration's step went through coop.forward (held remote steps ran) */
    unsigned next_id;
    unsigned long long n_steps;
    atomic_int poked;
    char step_err[ERRMSG_LEN];
    float *logits; /* max_seqs x vocab */
    struct plan *plan;
    int n_plan;
    struct pad *pads; /* static batching: max_seqs */
    int n_pads;
    struct flight fl[2]; /* coop pipelining: fl[cur] is in flight when active */
    int cur;
    int *fl_tok;             /* max_seqs: a flight's tokens */
    uint64_t *fl_rng;        /* and generator states */
    unsigned long n_retired; /* sequences retired so far */
    unsigned long n_refused; /* split steps the helper refused for lack of KV */
    char land_err[ERRMSG_LEN];

    /* submission queue */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct sreq *inbox_head, *inbox_tail;
    int stopping;
    char fail_all[ERRMSG_LEN]; /* sched_fail_all's reason, "" none: the next iteration acts */
    pthread_t thread;
    int started;
};

static void kv_gauges(struct scheduler *s)
{
    atomic_store_explicit(&s->m->kv_blocks_used, s->kv->n_blocks - s->kv->n_free,
                          memory_order_relaxed);
    atomic_store_explicit(&s->m->running, s->n_running, memory_order_relaxed);
    atomic_store_explicit(&s->m->waiting, s->n_waiting, memory_order_relaxed);
}

static void free_blocks(struct scheduler *s, struct seq *q)
{
    for (int i = q->n_blocks - 1; i >= 0; i--) kv_block_free(s->kv, q->blocks[i]);
    q->n_blocks = 0;
    q->n_computed = 0;
}

static void drop_pad(struct scheduler *s, int i)
{
    struct pad *p = &s->pads[i];
    for (int k = p->n_blocks - 1; k >= 0; k--) kv_block_free(s->kv, p->blocks[k]);
    free(p->blocks);
    s->pads[i] = s->pads[--s->n_pads];
}

static void drop_pads(struct scheduler *s)
{
    while (s->n_pads) drop_pad(s, s->n_pads - 1);
}

static void seq_free(struct scheduler *s, struct seq *q)
{
    if (!q) return;
    if (s && s->ops.coop.seq_end) s->ops.coop.seq_end(s->ops.coop.ctx, q->id);
    sampler_free(&q->smp);
    free(q->tok);
    free(q->blocks);
    free(q->text);
    free(q);
}

/* Move new text (and the final state) into the request's outbox. */
static void publish(struct scheduler *s, struct seq *q, int finish)
{
    struct sreq *r = q->r;
    size_t upto = q->text_len;
    if (!finish) {
        upto = stop_safe_len(q->text, q->text_len, r->stop, r->n_stop);
        upto = utf8_complete_prefix(q->text, upto);
    }
    pthread_mutex_lock(&r->st->mu);
    if (upto > q->sent) {
        size_t add = upto - q->sent;
        if (r->st->text_len + add + 1 > r->st->text_cap) {
            size_t cap = (r->st->text_len + add + 1) * 2;
            char *p = realloc(r->st->text, cap);
            if (p) r->st->text = p, r->st->text_cap = cap;
        }
        if (r->st->text_len + add + 1 <= r->st->text_cap) {
            memcpy(r->st->text + r->st->text_len, q->text + q->sent, add);
            r->st->text_len += add;
            r->st->text[r->st->text_len] = 0;
            q->sent = upto;
        }
    }
    r->st->n_generated = q->n_gen;
    if (q->n_gen && !r->st->t_first_token) r->st->t_first_token = q->t_first;
    if (finish) {
        r->st->finish = finish;
        r->st->t_done = clock_now();
    }
    pthread_mutex_unlock(&r->st->mu);
    if (s->ops.notify) s->ops.notify(s->ops.notify_ctx, r);
}

static void finish_metrics(struct scheduler *s, struct seq *q, int finish)
{
    struct serve_metrics *m = s->m;
    if (finish == FINISH_CANCELLED)
        metrics_request(m, OUTCOME_CANCELLED);
    else if (finish == FINISH_ERROR)
        metrics_request(m, OUTCOME_ERROR);
    else if (finish == FINISH_REJECTED)
        metrics_request(m, OUTCOME_REJECTED);
    else
        metrics_request(m, finish == FINISH_STOP ? OUTCOME_STOP : OUTCOME_LENGTH);
    if (finish != FINISH_STOP && finish != FINISH_LENGTH) return;
    double now = clock_now();
    hist_observe(&m->e2e, now - q->r->t_arrival);
    if (!q->n_gen) return;
    double ttft = q->t_first - q->r->t_arrival;
    double tpot = q->n_gen > 1 ? (q->t_last - q->t_first) / (q->n_gen - 1) : 0;
    hist_observe(&m->ttft, ttft);
    if (q->n_gen > 1) hist_observe(&m->tpot, tpot);
    if (ttft <= q->ttft && tpot <= q->tpot) {
        atomic_fetch_add_explicit(&m->slo_met, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&m->goodput_tokens, (unsigned long long)q->n_gen,
                                  memory_order_relaxed);
    } else {
        atomic_fetch_add_explicit(&m->slo_missed, 1, memory_order_relaxed);
    }
}

/* Retire a sequence (already removed from running/waiting): blocks back, outbox final. */
static void retire(struct scheduler *s, struct seq *q, int finish, const char *why)
{
    for (int f = 0; f < 2; f++)
        for (int p = 0; p < s->fl[f].n_plan; p++)
            if (s->fl[f].plan[p].s == q) s->fl[f].plan[p].s = NULL;
    s->n_retired++;
    free_blocks(s, q);
    kv_gauges(s); /* before the client can see its answer, so /metrics is never behind it */
    if (why) {
        pthread_mutex_lock(&q->r->st->mu);
        snprintf(q->r->st->error, sizeof q->r->st->error, "%s", why);
        pthread_mutex_unlock(&q->r->st->mu);
    }
    finish_metrics(s, q, finish);
    publish(s, q, finish);
    sreq_put(q->r);
    seq_free(s, q);
}

static void remove_at(struct seq **arr, int *n, int i)
{
    memmove(arr + i, arr + i + 1, (size_t)(*n - i - 1) * sizeof *arr);
    (*n)--;
}

static int push_waiting(struct scheduler *s, struct seq *q)
{
    if (s->n_waiting == s->cap_waiting) {
        int cap = s->cap_waiting ? s->cap_waiting * 2 : 64;
        struct seq **w = realloc(s->waiting, (size_t)cap * sizeof *w);
        if (!w) return -1;
        s->waiting = w;
        s->cap_waiting = cap;
    }
    s->waiting[s->n_waiting++] = q;
    return 0;
}

static void preempt(struct scheduler *s, int i)
{
    struct seq *q = s->running[i];
    remove_at(s->running, &s->n_running, i);
    free_blocks(s, q);
    atomic_fetch_add_explicit(&s->m->preemptions, 1, memory_order_relaxed);
    if (push_waiting(s, q)) retire(s, q, FINISH_ERROR, "out of memory requeueing a sequence");
}

static struct seq *seq_from(struct scheduler *s, struct sreq *r, char *err)
{
    struct seq *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    q->r = r;
    q->tok = malloc((size_t)s->cfg.ctx * sizeof *q->tok);
    q->blocks = malloc((size_t)s->max_blocks * sizeof *q->blocks);
    if (!q->tok || !q->blocks || sampler_init(&q->smp, &r->sp, s->ops.vocab_size, err)) {
        free(q->tok);
        free(q->blocks);
        free(q);
        return NULL;
    }
    q->id = ++s->next_id;
    memcpy(q->tok, r->prompt, (size_t)r->n_prompt * sizeof *q->tok);
    q->n_tok = r->n_prompt;
    q->ttft = (r->ttft_ms > 0 ? r->ttft_ms : s->cfg.ttft_ms) / 1e3;
    q->tpot = (r->tpot_ms > 0 ? r->tpot_ms : s->cfg.tpot_ms) / 1e3;
    return q;
}

/* ---------------------------------------------------------------- lifecycle */

static void calibration_init(struct scheduler *s);

struct scheduler *sched_new(const struct sched_config *cfg, const struct sched_ops *ops,
                            struct kv_cache *kv, struct serve_metrics *m, char *err)
{
    if (cfg->max_seqs < 1 || cfg->max_step_tokens < 1 || cfg->ctx < 2) {
        errmsg_set(err, "scheduler: bad limits (max_seqs %d, step tokens %d, ctx %d)",
                   cfg->max_seqs, cfg->max_step_tokens, cfg->ctx);
        return NULL;
    }
    struct scheduler *s = calloc(1, sizeof *s);
    if (!s) {
        errmsg_set(err, "scheduler: out of memory");
        return NULL;
    }
    s->cfg = *cfg;
    if (s->cfg.static_batch > 0) s->cfg.max_seqs = s->cfg.static_batch;
    if (s->cfg.ttft_ms <= 0) s->cfg.ttft_ms = 1000;
    if (s->cfg.tpot_ms <= 0) s->cfg.tpot_ms = 100;
    s->ops = *ops;
    s->kv = kv;
    s->m = m;
    s->max_blocks = kv_blocks_for(kv, cfg->ctx);
    int T = s->cfg.max_step_tokens, S = s->cfg.max_seqs;
    calibration_init(s);
    s->running = calloc((size_t)S, sizeof *s->running);
    s->b_token = malloc((size_t)T * sizeof(int));
    s->b_pos = malloc((size_t)T * sizeof(int));
    s->b_logit_rows = malloc((size_t)T * sizeof(int));
    s->b_blocks = malloc((size_t)T * sizeof *s->b_blocks);
    s->logits = malloc((size_t)(S < T ? S : T) * ops->vocab_size * sizeof(float));
    s->plan = malloc((size_t)S * sizeof *s->plan);
    s->pads = calloc((size_t)S, sizeof *s->pads);
    s->b_seq = malloc((size_t)T * sizeof *s->b_seq);
    s->b_smp = malloc((size_t)T * sizeof *s->b_smp);
    s->b_mask = malloc((size_t)T);
    s->b_out = malloc((size_t)T * sizeof *s->b_out);
    int fl_ok = 1;
    for (int f = 0; f < 2; f++) {
        s->fl[f].plan = malloc((size_t)S * sizeof *s->fl[f].plan);
        s->fl[f].logit = malloc((size_t)S);
        fl_ok &= s->fl[f].plan && s->fl[f].logit;
    }
    s->fl_tok = malloc((size_t)S * sizeof *s->fl_tok);
    s->fl_rng = malloc((size_t)S * sizeof *s->fl_rng);
    fl_ok &= s->fl_tok && s->fl_rng;
    s->k = s->ops.coop.resident ? s->ops.coop.start_k : s->ops.coop.n_layers;
    if (!s->running || !s->b_token || !s->b_pos || !s->b_logit_rows || !s->b_blocks || !s->logits ||
        !s->plan || !s->pads || !s->b_seq || !s->b_smp || !s->b_mask || !s->b_out || !fl_ok) {
        errmsg_set(err, "scheduler: out of memory for %d sequences x %d tokens", S, T);
        sched_free(s);
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (!s->cfg.no_prefix_cache && s->cfg.static_batch <= 0 &&
        !(s->px = prefix_cache_new(kv, err))) {
        sched_free(s);
        return NULL;
    }
    atomic_store(&m->kv_blocks_total, kv->n_blocks);
    kv_gauges(s);
    return s;
}

static void retire_all(struct scheduler *s, const char *why)
{
    while (s->n_running) {
        struct seq *q = s->running[s->n_running - 1];
        s->n_running--;
        retire(s, q, FINISH_ERROR, why);
    }
    while (s->n_waiting) {
        struct seq *q = s->waiting[s->n_waiting - 1];
        s->n_waiting--;
        retire(s, q, FINISH_ERROR, why);
    }
}

void sched_free(struct scheduler *s)
{
    if (!s) return;
    if (s->started) sched_stop(s);
    retire_all(s, "server shutting down");
    drop_pads(s);
    free(s->pads);
    struct sreq *r = s->inbox_head;
    while (r) {
        struct sreq *n = r->st->queue_next;
        sreq_put(r);
        r = n;
    }
    free(s->running);
    free(s->waiting);
    free(s->b_token);
    free(s->b_pos);
    free(s->b_logit_rows);
    free(s->b_blocks);
    free(s->logits);
    free(s->plan);
    free(s->b_seq);
    free(s->b_smp);
    free(s->b_mask);
    free(s->b_out);
    for (int f = 0; f < 2; f++) free(s->fl[f].plan), free(s->fl[f].logit);
    free(s->fl_tok);
    free(s->fl_rng);
    prefix_cache_free(s->px);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

const struct step_model *sched_step_model(const struct scheduler *s)
{
    return &s->sm.m;
}

double sched_step_err(const struct scheduler *s)
{
    return s->sm.err;
}

void sched_set_step_model(struct scheduler *s, const struct step_model *m, double err)
{
    step_online_init(&s->sm, m, err, 1);
    s->cal_done = 1;
}

void sched_set_prior(struct scheduler *s, const struct step_model *m, double err, int calibrated)
{
    struct step_sample sh[STEP_MAX_SHAPES];
    memcpy(sh, s->sm.shape, sizeof sh);
    int n = s->sm.n_shapes;
    step_online_init(&s->sm, m, err, 0);
    step_online_shapes(&s->sm, sh, n);
    s->cal_done = calibrated;
}

int sched_calibrated(const struct scheduler *s)
{
    return s->cal_done == 1;
}

int sched_submit(struct scheduler *s, struct sreq *r, char *err)
{
    if (r->n_prompt < 1) return errmsg_set(err, "the prompt is empty (no tokens, not even BOS)");
    if (r->n_prompt >= s->cfg.ctx)
        return errmsg_set(err, "the prompt has %d tokens; the context holds %d", r->n_prompt,
                          s->cfg.ctx);
    int need = kv_blocks_for(s->kv, r->n_prompt + 1);
    if (need > s->kv->n_blocks)
        return errmsg_set(err, "the prompt needs %d KV blocks; the pool has %d", need,
                          s->kv->n_blocks);
    r->t_arrival = r->t_arrival ? r->t_arrival : clock_now();
    atomic_fetch_add_explicit(&s->m->prompt_in, (unsigned long long)r->n_prompt,
                              memory_order_relaxed);
    sreq_get(r);
    pthread_mutex_lock(&s->mu);
    r->st->queue_next = NULL;
    if (s->inbox_tail)
        s->inbox_tail->st->queue_next = r;
    else
        s->inbox_head = r;
    s->inbox_tail = r;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void sched_poke(struct scheduler *s)
{
    atomic_store(&s->poked, 1);
    pthread_mutex_lock(&s->mu);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

int sched_resident(const struct scheduler *s)
{
    return s->k;
}

void sched_cancel(struct scheduler *s, struct sreq *r)
{
    atomic_store(&r->st->cancelled, 1);
    pthread_mutex_lock(&s->mu);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* ---------------------------------------------------------------- one step */

static void take_inbox(struct scheduler *s)
{
    pthread_mutex_lock(&s->mu);
    struct sreq *r = s->inbox_head;
    s->inbox_head = s->inbox_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    while (r) {
        struct sreq *next = r->st->queue_next;
        char err[ERRMSG_LEN] = "out of memory";
        struct seq *q = seq_from(s, r, err);
        if (!q || push_waiting(s, q)) {
            struct seq tmp = {.r = r};
            if (q) seq_free(NULL, q);
            pthread_mutex_lock(&r->st->mu);
            snprintf(r->st->error, sizeof r->st->error, "%s", err);
            pthread_mutex_unlock(&r->st->mu);
            metrics_request(s->m, OUTCOME_ERROR);
            publish(s, &tmp, FINISH_ERROR);
            sreq_put(r);
        }
        r = next;
    }
}

static int drop_cancelled(struct scheduler *s)
{
    int n = 0;
    for (int i = s->n_running - 1; i >= 0; i--) {
        if (!atomic_load_explicit(&s->running[i]->r->st->cancelled, memory_order_relaxed)) continue;
        struct seq *q = s->running[i];
        remove_at(s->running, &s->n_running, i);
        retire(s, q, FINISH_CANCELLED, NULL);
        n++;
    }
    for (int i = s->n_waiting - 1; i >= 0; i--) {
        if (!atomic_load_explicit(&s->waiting[i]->r->st->cancelled, memory_order_relaxed)) continue;
        struct seq *q = s->waiting[i];
        remove_at(s->waiting, &s->n_waiting, i);
        retire(s, q, FINISH_CANCELLED, NULL);
        n++;
    }
    return n;
}

/* Time left before this sequence's next token is due. */
/* Streaming requests are paced against TPOT_AIM x their TPOT target, not the target itself: the
 * scheduler spends every bit of slack on prompt chunks, so a request paced at the target line
 * ends a coin flip away from it (step times vary); 10% below leaves room for that noise. */
#define TPOT_AIM 0.9

static double slack_of(const struct seq *q, double now)
{
    if (q->n_gen == 0) return q->r->t_arrival + q->ttft - now;
    return q->t_first + q->n_gen * q->tpot * TPOT_AIM - now;
}

/* Waiting order: least slack first, after subtracting the predicted prefill time. */
static double waiting_slack(const struct scheduler *s, const struct seq *q, double now)
{
    return slack_of(q, now) - s->sm.m.a * s->sm.m.corr * (q->n_tok - q->n_computed);
}

/* Least slack first among requests that can still meet their target; requests that cannot
 * (negative slack) go after them in arrival order. Pure least-slack-first collapses under
 * overload (every request is served just too late); serving the feasible ones first keeps
 * goodput up, and the late ones are still served, in order, when capacity frees. */
static double waiting_key(const struct scheduler *s, const struct seq *q, double now)
{
    double sl = waiting_slack(s, q, now);
    return sl >= 0 ? sl : 1e9 + q->r->t_arrival;
}

static void sort_waiting(struct scheduler *s, double now)
{
    /* insertion sort: the queue is mostly sorted from the last step */
    for (int i = 1; i < s->n_waiting; i++) {
        struct seq *q = s->waiting[i];
        double k = waiting_key(s, q, now);
        int j = i - 1;
        while (j >= 0 && waiting_key(s, s->waiting[j], now) > k) {
            s->waiting[j + 1] = s->waiting[j];
            j--;
        }
        s->waiting[j + 1] = q;
    }
}

static int index_of(struct seq **arr, int n, const struct seq *q)
{
    for (int i = 0; i < n; i++)
        if (arr[i] == q) return i;
    return -1;
}

static int in_plan(const struct scheduler *s, const struct seq *q)
{
    for (int p = 0; p < s->n_plan; p++)
        if (s->plan[p].s == q) return 1;
    return 0;
}

/* The index of the newest running sequence that may give way (none in flight; with planned,
 * none in this step's plan either), or -1. */
static int newest_preemptible(const struct scheduler *s, int planned)
{
    int victim = -1;
    for (int i = 0; i < s->n_running; i++) {
        const struct seq *c = s->running[i];
        if (c->in_flight || (planned && in_plan(s, c))) continue;
        if (victim < 0 || c->admit_order > s->running[victim]->admit_order) victim = i;
    }
    return victim;
}

/* Grow q's block table to hold `positions` positions, preempting the newest running sequences
 * when the pool is dry. Returns 0, or -1 when q itself had to be preempted (or retired). */
static int ensure_blocks(struct scheduler *s, struct seq *q, int positions)
{
    int need = kv_blocks_for(s->kv, positions);
    if (need > s->max_blocks || need > s->kv->n_blocks) return -1;
    while (q->n_blocks < need) {
        int b = kv_block_alloc(s->kv);
        if (b >= 0) {
            q->blocks[q->n_blocks++] = b;
            continue;
        }
        if (s->n_pads) { /* padding gives way before any real sequence */
            drop_pads(s);
            continue;
        }
        int victim = newest_preemptible(s, 1);
        if (victim < 0) return -1;
        int self = s->running[victim] == q;
        preempt(s, victim);
        if (self) return -1;
    }
    return 0;
}

/* Every layer runs here: what this node computes is the whole KV (not a split step's part). */
static int all_here(const struct scheduler *s)
{
    return s->k >= s->ops.coop.n_layers;
}

/* A waiting sequence with nothing computed takes the blocks of its longest cached prefix, leaving
 * at least its last position to compute (that step gives its logits). Returns the positions taken. */
static int take_prefix(struct scheduler *s, struct seq *q)
{
    if (q->n_blocks || q->n_computed) return 0;
    q->px = s->px && all_here(s);
    if (!q->px) return 0;
    q->n_blocks = prefix_cache_match(s->px, q->tok, q->n_tok - 1, q->blocks, s->max_blocks);
    q->n_computed = q->n_blocks * s->kv->block_size;
    return q->n_computed;
}

/* A step computed q's positions [before, n_computed) with every layer here: its blocks that are
 * full now go to the prefix cache. */
static void add_prefix(struct scheduler *s, struct seq *q, int before)
{
    if (!s->px || !q->px) return;
    int bs = s->kv->block_size;
    for (int j = before / bs; j < q->n_computed / bs; j++)
        prefix_cache_add(s->px, q->tok, q->blocks, j);
}

/* The layers run here changed: no block computed so far is the whole KV of this node's model. */
static void forget_prefixes(struct scheduler *s)
{
    if (!s->px) return;
    prefix_cache_clear(s->px);
    for (int i = 0; i < s->n_running; i++) s->running[i]->px = 0;
}

static void plan_add(struct scheduler *s, struct seq *q, int n, int *budget)
{
    s->plan[s->n_plan++] = (struct plan){q, n};
    *budget -= n;
}

static int planned_tokens(const struct scheduler *s)
{
    int t = 0;
    for (int i = 0; i < s->n_plan; i++) t += s->plan[i].n;
    return t;
}

/* Tokens one more sequence may add to the step so far and still end within `allowed` seconds,
 * by the step model widened by its own error estimate (an uncertain model admits less). */
static int fit_tokens(const struct scheduler *s, double allowed)
{
    double widened = allowed / (1 + s->sm.err);
    return step_model_max_tokens(&s->sm.m, s->n_plan + 1, widened) - planned_tokens(s);
}

/* The smallest time any running sequence can give the next step (decode_only: only those
 * already streaming tokens, which a prompt chunk must not stall). Admitting a waiting request
 * (lend), a streaming sequence also gives what it will gain back over its next tokens (at most
 * AMORTIZE_TOKENS, no more than it may still draw) where the decode step, predicted for every
 * request running and waiting, is shorter than its pace: its TPOT is a mean over the request, and
 * a burst's prompts admitted in one longer step cost each stream a little of it, where admitting
 * them a few per step left the last ones waiting seconds for their first token. What a stream is
 * behind its pace comes out of that credit first, and the credit shrinks as its end nears. Prompt
 * chunks of requests already admitted get no credit: the steps after a loan are the decode steps
 * that pay it back. */
#define AMORTIZE_TOKENS 16
static double allowed_step_time(const struct scheduler *s, double now, int decode_only, int lend)
{
    int n = s->n_running + s->n_waiting;
    if (n > s->cfg.max_seqs) n = s->cfg.max_seqs;
    double decode = step_model_predict(&s->sm.m, n, n) * (1 + s->sm.err);
    double allowed = INFINITY;
    for (int i = 0; i < s->n_running; i++) {
        const struct seq *q = s->running[i];
        if (decode_only && !q->n_gen) continue;
        double sl = slack_of(q, now);
        /* what it is behind its pace is paid back from that credit first, and the credit shrinks
         * as its end nears: it ends on its pace */
        int left = lend && q->n_gen ? q->r->max_tokens - q->n_gen - 1 : 0;
        if (left > AMORTIZE_TOKENS) left = AMORTIZE_TOKENS;
        if (left > 0 && q->tpot * TPOT_AIM > decode) sl += left * (q->tpot * TPOT_AIM - decode);
        double floor_t = q->n_gen ? q->tpot * TPOT_AIM : 0;
        if (sl < floor_t) sl = floor_t;
        if (sl < allowed) allowed = sl;
    }
    return allowed;
}

/* Running sequences first: every decode token, then prompt chunks, oldest first (running[] is in
 * admission order). A sequence that cannot get blocks was preempted (it was the newest: the last
 * element) or cannot fit the pool alone and is retired; either way the next one is at index i. */
static void plan_running(struct scheduler *s, double now, int *budget)
{
    int slo = !s->cfg.no_slo_admission && s->cfg.static_batch <= 0;
    for (int pass = 0; pass < 2; pass++) {
        double allowed = pass == 1 && slo ? allowed_step_time(s, now, 1, 0) : INFINITY;
        for (int i = 0; *budget > 0 && i < s->n_running; i++) {
            struct seq *q = s->running[i];
            int want = q->n_tok - q->n_computed;
            if (q->awaiting || want <= 0) continue; /* its token is in flight */
            if ((pass == 0) != (want == 1) || in_plan(s, q)) continue;
            int n = want < *budget ? want : *budget;
            if (pass == 1 && allowed < INFINITY) {
                /* prompt chunks too must leave the streaming requests their slack (chunked
                 * prefill sized by the step model), but always make some progress */
                int fit = fit_tokens(s, allowed);
                int least = want < MIN_CHUNK ? want : MIN_CHUNK;
                if (fit < n) n = fit > least ? fit : least;
            }
            if (ensure_blocks(s, q, q->n_computed + n) == 0) {
                plan_add(s, q, n, budget);
                continue;
            }
            int j = index_of(s->running, s->n_running, q);
            if (j >= 0 && (q->in_flight || s->fl[s->cur].active)) {
                /* sequences in flight cannot give way: decided once the step is back */
                i = j;
                continue;
            }
            if (j >= 0) {
                remove_at(s->running, &s->n_running, j);
                retire(s, q, q->n_gen ? FINISH_LENGTH : FINISH_ERROR,
                       q->n_gen ? NULL : "the KV pool is too small for this prompt");
            }
            i--;
        }
    }
}

static void admit(struct scheduler *s, int i, int n, int *budget, double now)
{
    struct seq *q = s->waiting[i];
    remove_at(s->waiting, &s->n_waiting, i);
    q->admit_order = ++s->admit_counter;
    if (!q->ever_admitted) {
        q->ever_admitted = 1;
        q->t_admitted = now;
        hist_observe(&s->m->queue, now - q->r->t_arrival);
        atomic_fetch_add_explicit(&s->m->prompt_tokens, (unsigned long long)q->r->n_prompt,
                                  memory_order_relaxed);
    }
    s->running[s->n_running++] = q;
    if (n > 0) plan_add(s, q, n, budget); /* n == 0: no budget left, prefill from the next step */
}

static void plan_waiting(struct scheduler *s, int *budget, double now)
{
    if (s->cfg.static_batch > 0) {
        /* Baseline: a new batch only when the last one is done; whole batch or a timeout. */
        if (s->n_running || !s->n_waiting) return;
        double oldest = INFINITY;
        for (int i = 0; i < s->n_waiting; i++)
            if (s->waiting[i]->r->t_arrival < oldest) oldest = s->waiting[i]->r->t_arrival;
        if (s->n_waiting < s->cfg.static_batch && (now - oldest) * 1e3 < s->cfg.static_wait_ms)
            return;
        /* FIFO: arrival order */
        while (s->n_running < s->cfg.static_batch && s->n_waiting) {
            int best = 0;
            for (int i = 1; i < s->n_waiting; i++)
                if (s->waiting[i]->r->t_arrival < s->waiting[best]->r->t_arrival) best = i;
            struct seq *q = s->waiting[best];
            int n = q->n_tok < *budget ? q->n_tok : *budget;
            if (kv_blocks_for(s->kv, n ? n : 1) > s->kv->n_free) break;
            ensure_blocks(s, q, n ? n : 1);
            admit(s, best, n, budget, now);
        }
        return;
    }
    if (s->cfg.shed_late) {
        for (int i = s->n_waiting - 1; i >= 0; i--) {
            struct seq *q = s->waiting[i];
            if (q->ever_admitted || slack_of(q, now) >= 0) continue;
            remove_at(s->waiting, &s->n_waiting, i);
            char why[ERRMSG_LEN];
            snprintf(why, sizeof why,
                     "overloaded: the request could not start within its "
                     "TTFT target of %.0f ms; retry",
                     q->ttft * 1e3);
            retire(s, q, FINISH_REJECTED, why);
        }
    }
    sort_waiting(s, now);
    int reserve = s->kv->n_blocks / 100 + 1; /* headroom so decodes rarely preempt at once */
    while (*budget > 0 && s->n_waiting && s->n_running < s->cfg.max_seqs) {
        struct seq *q = s->waiting[0];
        int cached = take_prefix(s, q);
        int want = q->n_tok - q->n_computed;
        int n = want < *budget ? want : *budget;
        if (s->n_running && !s->cfg.no_slo_admission) {
            double allowed = allowed_step_time(s, now, 0, 1);
            int fit = fit_tokens(s, allowed);
            if (fit < n) {
                int least = want < MIN_CHUNK ? want : MIN_CHUNK;
                n = fit < least ? -1 : fit;
            }
        }
        int blocks = n < 0 ? 0 : kv_blocks_for(s->kv, q->n_computed + n) - q->n_blocks;
        if (n < 0 || (blocks > 0 && s->kv->n_free - blocks < (s->n_running ? reserve : 0)) ||
            ensure_blocks(s, q, q->n_computed + n)) {
            /* not yet: a waiting sequence holds no blocks (the cached ones stay cached) */
            free_blocks(s, q);
            break;
        }
        if (cached && !q->ever_admitted) {
            atomic_fetch_add_explicit(&s->m->prompt_cached_tokens, (unsigned long long)cached,
                                      memory_order_relaxed);
            pthread_mutex_lock(&q->r->st->mu);
            q->r->st->n_cached = cached; /* below n_prompt: never generated tokens yet */
            pthread_mutex_unlock(&q->r->st->mu);
        }
        admit(s, 0, n, budget, now);
    }
}

/* The end-of-sequence tokens may not be drawn yet (ignore_eos, min_tokens). */
static int mask_eos(const struct seq *q)
{
    return q->r->ignore_eos || q->n_gen < q->r->min_tokens;
}

static void advance_token(struct scheduler *s, struct seq *q, int t, double now);

/* Sample the next token of q from its logits row and handle the end conditions. */
static void advance(struct scheduler *s, struct seq *q, float *logits, double now)
{
    int eos = s->ops.eos_id, bos = s->ops.bos_id, V = s->ops.vocab_size;
    if (mask_eos(q)) {
        if (eos >= 0 && eos < V) logits[eos] = -INFINITY;
        if (bos >= 0 && bos < V) logits[bos] = -INFINITY;
        for (int i = 0; i < s->ops.n_eog; i++)
            if (s->ops.eog_ids[i] >= 0 && s->ops.eog_ids[i] < V)
                logits[s->ops.eog_ids[i]] = -INFINITY;
    }
    advance_token(s, q, sampler_sample(&q->smp, logits), now);
}

/* q's next token is t: append it, handle the end conditions, publish. */
static void advance_token(struct scheduler *s, struct seq *q, int t, double now)
{
    q->alone_refused = 0;
    struct sreq *r = q->r;
    int eos = s->ops.eos_id, bos = s->ops.bos_id;
    int finish = FINISH_NONE, eog = t == eos || (bos >= 0 && t == bos);
    for (int i = 0; i < s->ops.n_eog && !eog; i++) eog = t == s->ops.eog_ids[i];
    if (eog) {
        finish = FINISH_STOP;
    } else {
        int prev = q->tok[q->n_tok - 1];
        q->tok[q->n_tok++] = t;
        q->n_gen++;
        if (q->n_gen == 1) q->t_first = now;
        q->t_last = now;
        atomic_fetch_add_explicit(&s->m->generated_tokens, 1, memory_order_relaxed);
        char scratch[8];
        size_t len = 0;
        const char *piece =
            s->ops.decode ? s->ops.decode(s->ops.decode_ctx, prev, t, scratch, &len) : "";
        if (len) {
            if (q->text_len + len + 1 > q->text_cap) {
                size_t cap = (q->text_len + len + 1) * 2;
                char *p = realloc(q->text, cap);
                if (p) q->text = p, q->text_cap = cap;
            }
            if (q->text_len + len + 1 <= q->text_cap) {
                size_t from = q->text_len;
                memcpy(q->text + q->text_len, piece, len);
                q->text_len += len;
                q->text[q->text_len] = 0;
                size_t at = stop_find(q->text, q->text_len, from, r->stop, r->n_stop);
                if (at != (size_t)-1 && at >= q->sent) {
                    q->text_len = at;
                    q->text[at] = 0;
                    finish = FINISH_STOP;
                }
            }
        }
        if (!finish && q->n_gen >= r->max_tokens) finish = FINISH_LENGTH;
        if (!finish && q->n_tok >= s->cfg.ctx) finish = FINISH_LENGTH;
    }
    if (finish) {
        int i = index_of(s->running, s->n_running, q);
        if (i >= 0) remove_at(s->running, &s->n_running, i);
        if (s->cfg.static_batch > 0 && !s->cfg.static_shrink && s->n_running &&
            s->n_pads < s->cfg.max_seqs && q->n_computed < s->cfg.ctx - 1) {
            s->pads[s->n_pads++] = (struct pad){.blocks = q->blocks,
                                                .n_blocks = q->n_blocks,
                                                .pos = q->n_computed,
                                                .tok = q->tok[q->n_tok - 1]};
            q->blocks = NULL;
            q->n_blocks = 0;
        }
        retire(s, q, finish, NULL);
    } else {
        publish(s, q, 0);
    }
}

/* coop: k rose to k1 between steps. Every sequence with computed positions gets the KV of the
 * layers that became local, all in one fill call; one that cannot is failed (its text so far stays
 * exact). */
static void raise_k(struct scheduler *s, int k1)
{
    const struct sched_coop *c = &s->ops.coop;
    double t0 = clock_now();
    int n_seqs = 0, moved = 0, failed = 0;
    long positions = 0;
    int cap = s->n_running ? s->n_running : 1;
    struct seq **qs = malloc((size_t)cap * sizeof *qs);
    unsigned *ids = malloc((size_t)cap * sizeof *ids);
    const int **blocks = malloc((size_t)cap * sizeof *blocks);
    int *n = malloc((size_t)cap * sizeof *n), *rc = malloc((size_t)cap * sizeof *rc);
    char *errs = malloc((size_t)cap * ERRMSG_LEN);
    if (!qs || !ids || !blocks || !n || !rc || !errs) {
        /* nothing can run at k1 without its KV: fail them (their text so far stays exact) */
        for (int i = s->n_running - 1; i >= 0; i--) {
            struct seq *q = s->running[i];
            if (!q->n_computed) continue;
            remove_at(s->running, &s->n_running, i);
            retire(s, q, FINISH_ERROR, "out of memory bringing the KV of new local layers");
            failed++;
        }
    } else {
        for (int i = 0; i < s->n_running; i++) {
            struct seq *q = s->running[i];
            if (!q->n_computed) continue;
            qs[n_seqs] = q, ids[n_seqs] = q->id, blocks[n_seqs] = q->blocks;
            n[n_seqs] = q->n_computed;
            positions += q->n_computed;
            n_seqs++;
        }
        if (n_seqs) c->fill(c->ctx, n_seqs, ids, blocks, n, s->k, k1, rc, errs);
        for (int j = 0; j < n_seqs; j++) {
            if (rc[j] >= 0) {
                moved += rc[j] > 0;
                continue;
            }
            int i = index_of(s->running, s->n_running, qs[j]);
            if (i >= 0) remove_at(s->running, &s->n_running, i);
            retire(s, qs[j], FINISH_ERROR, errs + (size_t)j * ERRMSG_LEN);
            failed++;
        }
    }
    free(qs), free(ids), free(blocks), free(n), free(rc), free(errs);
    log_info("sched",
             "layers [0, %d) of %d run here now%s (KV of layers [%d, %d) for %d sequences, %ld "
             "positions: %d transferred, %d recomputed, %d failed, in %.1f ms)",
             k1, c->n_layers, k1 == c->n_layers ? ": serving alone" : "", s->k, k1, n_seqs,
             positions, moved, n_seqs - moved - failed, failed, (clock_now() - t0) * 1e3);
    s->k = k1;
    forget_prefixes(s);
    if (k1 == c->n_layers && c->all_local) c->all_local(c->ctx);
}

/* coop: k fell to k1 between steps (a hand-over): every sequence with computed positions moves to
 * the helper with its KV (the hook), or none does and k stays. */
static void lower_k(struct scheduler *s, int k1)
{
    const struct sched_coop *c = &s->ops.coop;
    int cap = s->n_running ? s->n_running : 1, n_seqs = 0;
    unsigned *ids = malloc((size_t)cap * sizeof *ids);
    struct sampler **smp = malloc((size_t)cap * sizeof *smp);
    const int **tok = malloc((size_t)cap * sizeof *tok);
    int *n = malloc((size_t)cap * sizeof *n);
    char err[ERRMSG_LEN] = "out of memory";
    int rc = -1;
    if (ids && smp && tok && n) {
        for (int i = 0; i < s->n_running; i++) {
            struct seq *q = s->running[i];
            if (!q->n_computed) continue;
            ids[n_seqs] = q->id, smp[n_seqs] = &q->smp, tok[n_seqs] = q->tok;
            n[n_seqs++] = q->n_computed;
        }
        rc = c->lower(c->ctx, n_seqs, ids, smp, tok, n, err);
    }
    free(ids), free(smp), free(tok), free(n);
    if (rc) {
        log_warn("sched", "layers [%d, %d) stay here: %s", k1, s->k, err);
        return;
    }
    log_info("sched", "layers [0, %d) of %d run here now (%d sequences handed over)", k1,
             c->n_layers, n_seqs);
    s->k = k1;
    forget_prefixes(s);
}

static void step_observe(struct scheduler *s, int n, int n_seqs, double secs)
{
    step_online_observe(&s->sm, n, n_seqs, secs);
    hist_observe(&s->m->step, secs);
    atomic_fetch_add_explicit(&s->m->steps, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->m->step_tokens, (unsigned long long)n, memory_order_relaxed);
}

/* Takes back chunk n of q that was sent but not run (a refused split step): its positions go out
 * again, in order, from the next step. */
static void unsend(struct seq *q, int n, int logit)
{
    q->n_computed -= n;
    q->in_flight--;
    if (logit) q->awaiting = 0;
}

/* The helper refused a split step for lack of KV blocks (SCHED_COOP_REFUSED): nothing of it ran
 * there. Its sequences stay (the caller took their chunks back); the newest running sequence not
 * in flight gives way, as when this node's own pool runs dry (ensure_blocks): requeued, recomputed
 * later, and closed at the helper (seq_end), which frees its blocks there. No request fails, but
 * one the helper refuses SCHED_ALONE_REFUSALS times running alone, without a token between: the
 * helper has no room for it at all (its pool smaller than the sequence), and waiting would hang. */
#define SCHED_ALONE_REFUSALS 32
static void refused(struct scheduler *s, const char *why)
{
    s->n_refused++;
    if (s->n_running == 1 && !s->running[0]->in_flight &&
        ++s->running[0]->alone_refused >= SCHED_ALONE_REFUSALS) {
        struct seq *q = s->running[0];
        char msg[ERRMSG_LEN];
        snprintf(msg, sizeof msg, "refused %d times running alone: %.400s", q->alone_refused, why);
        remove_at(s->running, &s->n_running, 0);
        retire(s, q, FINISH_ERROR, msg);
        return;
    }
    int victim = newest_preemptible(s, 0);
    unsigned id = victim >= 0 ? s->running[victim]->id : 0;
    if (victim >= 0) {
        preempt(s, victim);
        if (s->ops.coop.seq_end) s->ops.coop.seq_end(s->ops.coop.ctx, id);
    }
    if (s->n_refused == 1 || s->n_refused % 100 == 0)
        log_info("sched", "split step refused (%lu so far): %s; %s", s->n_refused, why,
                 victim >= 0 ? "the newest sequence waits, to be recomputed"
                             : "its sequences go again");
}

/* coop pipelining: the step in flight is answered (or failed, or refused): its sequences get their
 * tokens (or fail with why, or go again). Returns 1 if there was one. */
static int flight_land(struct scheduler *s)
{
    struct flight *f = &s->fl[s->cur];
    if (!f->active) return 0;
    const struct sched_coop *co = &s->ops.coop;
    f->active = 0;
    int rc = co->recv(co->ctx, s->fl_tok, s->fl_rng, s->land_err);
    double t1 = clock_now();
    if (rc == SCHED_COOP_REFUSED) {
        /* Its chunks go again; so do those of the same sequences in the step sent after it
         * (computed there on KV that is missing), which is discarded for them. */
        struct flight *g = &s->fl[!s->cur];
        for (int p = 0; p < f->n_plan; p++) {
            struct seq *q = f->plan[p].s;
            f->plan[p].s = NULL;
            if (!q) continue;
            unsend(q, f->plan[p].n, f->logit[p]);
            for (int r = 0; g->active && r < g->n_plan; r++)
                if (g->plan[r].s == q) {
                    unsend(q, g->plan[r].n, g->logit[r]);
                    g->plan[r].s = NULL;
                }
        }
        f->n_plan = 0;
        refused(s, s->land_err);
        return 1;
    }
    step_observe(s, f->n_rows, f->n_plan, t1 - f->t0);
    int row = 0;
    for (int p = 0; p < f->n_plan; p++) {
        struct seq *q = f->plan[p].s;
        int lg = f->logit[p];
        if (!q) { /* retired while in flight */
            row += lg;
            continue;
        }
        f->plan[p].s = NULL;
        q->in_flight--;
        if (lg) q->awaiting = 0;
        if (rc) {
            int i = index_of(s->running, s->n_running, q);
            if (i >= 0) remove_at(s->running, &s->n_running, i);
            retire(s, q, FINISH_ERROR, s->land_err);
            continue;
        }
        if (lg) {
            q->smp.rng = s->fl_rng[row];
            advance_token(s, q, s->fl_tok[row++], t1);
        }
    }
    f->n_plan = 0;
    return 1;
}

/* coop, at the step boundary: the layers that became local (their KV with them), the sequences
 * whose helper failed, and whether a step can run at all. 0: split, and no helper to run the
 * rest (wait for our own layers or the helper's return). */
static int coop_boundary(struct scheduler *s)
{
    const struct sched_coop *co = &s->ops.coop;
    if (!co->resident) return 1;
    int k = co->resident(co->ctx, s->n_steps);
    if (k > co->n_layers) k = co->n_layers;
    if (k > s->k) {
        flight_land(s); /* k rises with nothing in flight */
        raise_k(s, k);
    } else if (k < s->k && co->lower) {
        flight_land(s);
        lower_k(s, k);
    }
    /* a helper that failed took the upper layers' KV of its sequences with it */
    for (int i = s->n_running - 1; co->lost && s->k < co->n_layers && i >= 0; i--) {
        struct seq *q = s->running[i];
        const char *why = q->n_computed ? co->lost(co->ctx, q->id) : NULL;
        if (!why) continue;
        remove_at(s->running, &s->n_running, i);
        retire(s, q, FINISH_ERROR, why);
    }
    return s->k >= co->n_layers || co->ready(co->ctx);
}

/* The step's plan within its token budget: running sequences first, then waiting ones admitted.
 * Returns the number of planned sequences. */
static int plan_step(struct scheduler *s, double now)
{
    int budget = s->cfg.max_step_tokens;
    s->n_plan = 0;
    if (!s->n_running) drop_pads(s); /* the batch ended by cancellation */
    plan_running(s, now, &budget);
    plan_waiting(s, &budget, now);
    return s->n_plan;
}

/* The plan as a batch: each planned sequence's tokens, a logit row where its chunk ends. */
static void batch_plan(struct scheduler *s, int *n, int *n_logits)
{
    *n = *n_logits = 0;
    for (int p = 0; p < s->n_plan; p++) {
        struct seq *q = s->plan[p].s;
        for (int k = 0; k < s->plan[p].n; k++) {
            s->b_token[*n] = q->tok[q->n_computed + k];
            s->b_pos[*n] = q->n_computed + k;
            s->b_blocks[*n] = q->blocks;
            (*n)++;
        }
        if (q->n_computed + s->plan[p].n == q->n_tok) s->b_logit_rows[(*n_logits)++] = *n - 1;
    }
}

/* Static batching: the padding rows ride along while room and blocks allow. Returns how many. */
static int batch_pads(struct scheduler *s, int *n, int *n_logits)
{
    int n_padded = 0;
    for (int i = 0; i < s->n_pads; i++) {
        struct pad *pd = &s->pads[i];
        if (*n == s->cfg.max_step_tokens || *n_logits == s->cfg.max_seqs) break;
        int need = kv_blocks_for(s->kv, pd->pos + 1);
        if (pd->pos >= s->cfg.ctx - 1 || need > s->max_blocks) {
            drop_pad(s, i--); /* at the end of its context the row stops */
            continue;
        }
        if (need > pd->n_blocks) {
            int blk = kv_block_alloc(s->kv);
            if (blk < 0) {
                drop_pad(s, i--); /* the pool is dry: padding never takes a real request's block */
                continue;
            }
            pd->blocks[pd->n_blocks++] = blk;
        }
        s->b_token[*n] = pd->tok;
        s->b_pos[*n] = pd->pos++;
        s->b_blocks[*n] = pd->blocks;
        s->b_logit_rows[(*n_logits)++] = *n;
        (*n)++;
        n_padded++;
    }
    return n_padded;
}

/* coop: sequence ids per row, sampler and EOS mask per logit row */
static void split_rows(struct scheduler *s)
{
    int row = 0, lr = 0;
    for (int p = 0; p < s->n_plan; p++) {
        struct seq *q = s->plan[p].s;
        for (int k = 0; k < s->plan[p].n; k++) {
            s->b_smp[row] = &q->smp;
            s->b_seq[row++] = q->id;
        }
        if (q->n_computed + s->plan[p].n == q->n_tok) s->b_mask[lr++] = (unsigned char)mask_eos(q);
    }
}

/* coop pipelining: the step went out (sent, not answered): its plan becomes the flight, and the
 * step in flight before it is answered meanwhile. */
static void fly(struct scheduler *s, int n, double t0)
{
    if (s->cfg.step_delay_us > 0) usleep((useconds_t)s->cfg.step_delay_us);
    struct flight *f = &s->fl[!s->cur];
    *f = (struct flight){.active = 1, .plan = f->plan, .logit = f->logit, .n_rows = n, .t0 = t0};
    for (int p = 0; p < s->n_plan; p++) {
        struct seq *q = s->plan[p].s;
        q->n_computed += s->plan[p].n;
        q->in_flight++;
        f->logit[p] = q->n_computed == q->n_tok;
        q->awaiting |= f->logit[p];
        f->plan[p] = s->plan[p];
    }
    f->n_plan = s->n_plan;
    s->n_steps++;
    s->n_plan = 0;
    flight_land(s);
    s->cur = !s->cur;
    atomic_store(&s->step_started_ns, 0);
    if (!s->n_running) drop_pads(s);
}

/* coop: run b with layers [0, k) here and the rest on the helper, pipelined when it can go in
 * flight. Returns 1 when the iteration is over already (the step went in flight, or the step in
 * flight before it retired sequences of this plan: plan again); 0 when it ran, *rc its status. */
static int run_split(struct scheduler *s, const struct batch *b, int n_padded, double t0, int *rc,
                     const char **fail)
{
    const struct sched_coop *co = &s->ops.coop;
    split_rows(s);
    *rc = 1;
    if (co->send && !n_padded) {
        *rc = co->send(co->ctx, b, s->k, s->b_seq, s->b_smp, s->b_mask, s->step_err);
        if (*rc == 0) {
            fly(s, b->n, t0);
            return 1;
        }
    }
    if (s->fl[s->cur].active) {
        /* it runs alone: the step in flight first (which may retire sequences of this plan:
         * then plan again) */
        unsigned long retired = s->n_retired, n_refused = s->n_refused;
        flight_land(s);
        if (s->n_retired != retired || s->n_refused != n_refused) {
            s->n_plan = 0;
            atomic_store(&s->step_started_ns, 0);
            return 1;
        }
    }
    if (*rc == 1)
        *rc = co->step(co->ctx, b, s->k, s->b_seq, s->b_smp, s->b_mask, s->b_out, s->step_err);
    if (*rc) *fail = s->step_err;
    return 0;
}

/* All layers here; a helper fuses the remote steps that wait into this one (cluster/coop.h). */
static int run_local(struct scheduler *s, const struct batch *b, const char **fail)
{
    const struct sched_coop *co = &s->ops.coop;
    int rc = co->forward ? co->forward(co->ctx, b, s->logits, s->step_err) : 1;
    s->fused = co->forward != NULL;
    if (rc == 1) rc = s->ops.forward(s->ops.ctx, b, s->logits, s->step_err);
    if (rc) *fail = s->step_err;
    return rc;
}

/* The step ran (rc 0) or failed: each planned sequence advances by its chunk and, where the chunk
 * ends its prompt or is a decode, gets its next token; on failure each one fails with `fail`. */
static void land_plan(struct scheduler *s, int rc, int split, const char *fail, double t1)
{
    /* Copy the plan: advance() retires sequences and reshapes running[]. */
    int row = 0;
    if (rc == SCHED_COOP_REFUSED) { /* nothing ran remote: the plan goes again */
        s->n_plan = 0;
        refused(s, fail);
        return;
    }
    for (int p = 0; p < s->n_plan; p++) {
        struct seq *q = s->plan[p].s;
        q->n_computed += s->plan[p].n;
        if (rc) {
            int i = index_of(s->running, s->n_running, q);
            if (i >= 0) remove_at(s->running, &s->n_running, i);
            retire(s, q, FINISH_ERROR, fail);
            continue;
        }
        if (!split) add_prefix(s, q, q->n_computed - s->plan[p].n);
        if (q->n_computed == q->n_tok) {
            if (split)
                advance_token(s, q, s->b_out[row++], t1);
            else
                advance(s, q, s->logits + (size_t)row++ * s->ops.vocab_size, t1);
        }
    }
    s->n_plan = 0;
    if (!s->n_running) drop_pads(s); /* the batch is done */
}

/* One step: the coop boundary, the plan, its batch (with static batching's padding), the model
 * (split with a helper, or here), its time into the step model, the tokens to their sequences. */
static int run_step(struct scheduler *s)
{
    double now = clock_now();
    if (!coop_boundary(s) || !plan_step(s, now)) return flight_land(s);
    int n, n_logits;
    batch_plan(s, &n, &n_logits);
    int n_padded = batch_pads(s, &n, &n_logits);
    struct batch b = {.n = n,
                      .token = s->b_token,
                      .pos = s->b_pos,
                      .blocks = s->b_blocks,
                      .n_logits = n_logits,
                      .logit_rows = s->b_logit_rows};
    double t0 = clock_now();
    atomic_store(&s->step_started_ns, clock_now_ns());
    int split = s->ops.coop.step && s->k < s->ops.coop.n_layers, rc;
    const char *fail = "the model step failed";
    if (split) {
        if (run_split(s, &b, n_padded, t0, &rc, &fail)) return 1;
    } else {
        rc = run_local(s, &b, &fail);
    }
    /* Tests: a slower device. Inside the step's time, so the step model learns it as a device's
     * would (the cluster's planner predicts with it). */
    if (s->cfg.step_delay_us > 0) usleep((useconds_t)s->cfg.step_delay_us);
    double t1 = clock_now();
    atomic_store(&s->step_started_ns, 0);
    s->n_steps++;
    step_observe(s, n, s->n_plan + n_padded, t1 - t0);
    land_plan(s, rc, split, fail, t1);
    return 1;
}

void sched_fail_all(struct scheduler *s, const char *why)
{
    pthread_mutex_lock(&s->mu);
    snprintf(s->fail_all, sizeof s->fail_all, "%s", why);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* sched_fail_all asked: whatever is in flight lands, then every sequence fails with the reason. */
static int fail_all_now(struct scheduler *s)
{
    char why[ERRMSG_LEN];
    pthread_mutex_lock(&s->mu);
    snprintf(why, sizeof why, "%s", s->fail_all);
    s->fail_all[0] = 0;
    pthread_mutex_unlock(&s->mu);
    if (!why[0] || (!s->n_running && !s->n_waiting)) return 0;
    flight_land(s);
    while (s->n_running) retire(s, s->running[--s->n_running], FINISH_REJECTED, why);
    while (s->n_waiting) retire(s, s->waiting[--s->n_waiting], FINISH_REJECTED, why);
    return 1;
}

int sched_iterate(struct scheduler *s)
{
    take_inbox(s);
    if (fail_all_now(s)) {
        kv_gauges(s);
        if (s->ops.wake) s->ops.wake(s->ops.notify_ctx);
        return 1;
    }
    int did = drop_cancelled(s);
    atomic_store(&s->poked, 0);
    const struct sched_coop *co = &s->ops.coop;
    /* a helper with `forward` holds remote steps back for its own step to fuse; when it runs
     * none, they run apart at once */
    if (co->serve) did |= co->serve(co->ctx, co->forward != NULL);
    s->fused = 0;
    did |= run_step(s);
    if (co->serve && co->forward && !s->fused) did |= co->serve(co->ctx, 0);
    kv_gauges(s);
    if (s->ops.wake) s->ops.wake(s->ops.notify_ctx);
    return did;
}

/* ---------------------------------------------------------------- thread */

static void *sched_main(void *arg)
{
    struct scheduler *s = arg;
    double busy_at = clock_now();
    double idle_s = (s->cfg.idle_calibrate_ms ? s->cfg.idle_calibrate_ms : 500) / 1e3;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int stop = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (stop) break;
        if (sched_iterate(s)) {
            busy_at = clock_now();
            continue;
        }
        if (idle_s >= 0 && !s->cal_done && clock_now() - busy_at >= idle_s &&
            sched_calibrate_idle(s) > 0)
            continue;
        /* Idle (or a static batch filling up): sleep until a submission, a cancel or a tick. */
        pthread_mutex_lock(&s->mu);
        if (!s->inbox_head && !s->stopping && !atomic_load(&s->poked)) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            long ns = ts.tv_nsec + (s->n_waiting ? 2000000L : 200000000L);
            ts.tv_sec += ns / 1000000000L;
            ts.tv_nsec = ns % 1000000000L;
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        }
        pthread_mutex_unlock(&s->mu);
    }
    retire_all(s, "server shutting down");
    kv_gauges(s);
    if (s->ops.wake) s->ops.wake(s->ops.notify_ctx);
    return NULL;
}

int sched_start(struct scheduler *s, char *err)
{
    int rc = pthread_create(&s->thread, NULL, sched_main, s);
    if (rc) return errmsg_set(err, "scheduler: pthread_create: %s", strerror(rc));
    s->started = 1;
    return 0;
}

void sched_stop(struct scheduler *s)
{
    if (!s->started) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    s->started = 0;
}

/* ---------------------------------------------------------------- calibration */

/* Nothing is timed before serving: the model starts from its prior and learns from the steps it
 * runs. What the steps have not covered yet (a node that has served only decodes knows little of
 * long prefills) is timed while the thread is idle, one calibration step at a time, so a request
 * that arrives meanwhile waits for one step at most, the cheapest first; a shape predicted to take
 * over half the TTFT target is left to the steps. */

#define CAL_SEEN 3 /* steps of a shape that cover it */

static void calibration_init(struct scheduler *s)
{
    /* decode-only batches of several widths and prefill chunks of several lengths, cheapest
     * first: each one timed scales the model before the next is judged */
    int T = s->cfg.max_step_tokens, S = s->cfg.max_seqs;
    int want[][2] = {{1, 1},         {S / 2 + 1, S / 2 + 1},     {S, S},
                     {T / 4 + 1, 1}, {T / 2 + S / 2, S / 2 + 1}, {T / 2 + 1, 1},
                     {T, 1}};
    struct step_sample sh[STEP_MAX_SHAPES];
    int n = 0;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int tokens = want[i][0] < T ? want[i][0] : T;
        if (tokens > s->cfg.ctx - 1) tokens = s->cfg.ctx - 1;
        int seqs = want[i][1] < tokens ? want[i][1] : tokens;
        if (seqs > S) seqs = S;
        int k = n++;
        while (k > 0 && sh[k - 1].tokens > tokens) sh[k] = sh[k - 1], k--;
        sh[k] = (struct step_sample){tokens, seqs, 0};
    }
    step_online_init(&s->sm, &(struct step_model){.a = 1e-4, .c = 1e-3, .corr = 1}, 1.0, 0);
    step_online_shapes(&s->sm, sh, n);
}

/* Time one step of `tokens` tokens over `seqs` sequences on free KV blocks (every sequence shares
 * one block table: the cost of a step does not depend on which blocks it touches). */
static int calibration_step(struct scheduler *s, int tokens, int seqs, int *table)
{
    int bs = s->kv->block_size;
    int per = tokens - (seqs - 1); /* the first sequence takes the chunk */
    int nb = kv_blocks_for(s->kv, per + 1);
    for (int i = 0; i < nb; i++) table[i] = kv_block_alloc(s->kv);
    int n = 0;
    for (int q = 0; q < seqs; q++) {
        int cnt = q == 0 ? per : 1;
        for (int k = 0; k < cnt; k++) {
            s->b_token[n] = (n * 7 + 1) % s->ops.vocab_size;
            s->b_pos[n] = q == 0 ? k : (q * bs + 3) % (per + 1);
            s->b_blocks[n] = table;
            n++;
        }
        s->b_logit_rows[q] = n - 1;
    }
    struct batch b = {.n = n,
                      .token = s->b_token,
                      .pos = s->b_pos,
                      .blocks = s->b_blocks,
                      .n_logits = seqs,
                      .logit_rows = s->b_logit_rows};
    double t0 = clock_now();
    atomic_store(&s->step_started_ns, clock_now_ns());
    int rc = s->ops.forward(s->ops.ctx, &b, s->logits, s->step_err);
    if (s->cfg.step_delay_us > 0) usleep((useconds_t)s->cfg.step_delay_us); /* as run_step */
    double t = clock_now() - t0;
    atomic_store(&s->step_started_ns, 0);
    for (int i = nb - 1; i >= 0; i--) kv_block_free(s->kv, table[i]);
    if (rc) return -1;
    step_online_observe(&s->sm, n, seqs, t);
    return 0;
}

static void calibration_done(struct scheduler *s, int timed, int left)
{
    s->cal_done = 1;
    s->sm.err = step_online_fit_error(&s->sm); /* not the prior's misses on the way */
    const struct step_model *m = &s->sm.m;
    log_info("sched",
             "step model: %.1f us/token + %.1f us/sequence + %.1f us, error %.0f%% (calibrated "
             "while idle: %d calibration steps, %d shape%s over half the TTFT target left to the "
             "steps)",
             m->a * 1e6, m->b * 1e6, m->c * 1e6, s->sm.err * 100, timed, left,
             left == 1 ? "" : "s");
    if (s->ops.calibrated) s->ops.calibrated(s->ops.model_ctx, m, s->sm.err, s->sm.steps);
}

int sched_calibrate_idle(struct scheduler *s)
{
    const struct sched_coop *co = &s->ops.coop;
    if (s->cal_done || s->n_running || s->n_waiting || s->n_pads || s->fl[0].active ||
        s->fl[1].active)
        return 0;
    if (co->resident && s->k < co->n_layers) return 0; /* layers still remote: not ours to time */
    pthread_mutex_lock(&s->mu);
    int queued = s->inbox_head != NULL;
    pthread_mutex_unlock(&s->mu);
    if (queued) return 0;
    /* the cheapest shape not covered yet, by the model as it stands (each step timed refines
     * the prediction of the next) */
    double cap = s->cfg.ttft_ms / 2e3, best = INFINITY;
    int left = 0;
    const struct step_sample *next = NULL;
    for (int i = 0; i < s->sm.n_shapes; i++) {
        const struct step_sample *sh = &s->sm.shape[i];
        if (step_online_seen(&s->sm, sh->tokens, sh->seqs) >= CAL_SEEN) continue;
        int nb = kv_blocks_for(s->kv, sh->tokens - sh->seqs + 2);
        double t = step_model_predict(&s->sm.m, sh->tokens, sh->seqs);
        if (t > cap || nb > s->kv->n_free || nb > s->max_blocks) {
            left++;
            continue;
        }
        if (t < best) best = t, next = sh;
    }
    if (!next) {
        calibration_done(s, s->cal_steps, left);
        return 0;
    }
    int *table = malloc((size_t)s->max_blocks * sizeof *table);
    if (!table || calibration_step(s, next->tokens, next->seqs, table)) {
        log_warn("sched", "idle calibration stopped (%s): the step model goes on from the steps",
                 table ? s->step_err : "out of memory");
        s->cal_done = -1;
        free(table);
        return -1;
    }
    free(table);
    s->cal_steps++;
    return 1;
}

double sched_step_running_for(struct scheduler *s)
{
    uint64_t t = atomic_load(&s->step_started_ns);
    return t ? (double)(clock_now_ns() - t) * 1e-9 : 0;
}
