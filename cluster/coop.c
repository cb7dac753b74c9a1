#include "cluster/coop.h"

#include "os/common/errmsg.h"
#include "os/runtime/clock.h"
#include "os/runtime/log.h"
#include "serving/engine/sampler.h"
#include "transport/wire.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_SCHEDULE 64
/* A helper sends at most this many bytes of KV answers between two of its steps (kv_pump): about
 * 4 ms of copying, CRC and queueing at ~1 GB/s, the delay a transfer may add to one of its steps.
 * A request of more (a 22-layer model's rise of 11 layers over 8 sequences of 1000 positions of
 * 256-wide f16 KV is 90 MB) takes several windows, with our steps between them. */
#define KV_WINDOW_BYTES (4u << 20)

/* Joiner: a sequence some of whose layers run on the helper. x holds, for every computed position,
 * a hidden state saved at the input of layer xl[pos] (what was sent at the time, or where the last
 * recompute left it): the input of a KV recompute. A transfer does not advance it, so after one
 * the older positions' inputs are of a lower layer than the newer ones'. xl[pos] = -1: the position
 * was sent as its token id (the embedding was not here yet) and only tok[pos] is saved; a
 * recompute runs the embedding first. */
struct jseq {
    unsigned id;
    unsigned session; /* the helper connection it was opened on */
    int helper;       /* that helper's fabric peer */
    int opened;
    float *x; /* ctx x dim */
    int *xl;  /* ctx */
    int *tok; /* ctx: every computed position's token id */
};

/* Joiner: a reply from the helper, queued by the fabric thread (on_tokens). */
struct reply {
    struct reply *next;
    size_t len;
    uint8_t msg[];
};

/* Joiner: a pipelined step in flight (hook_send): its message's step id, the helper session and
 * peer it went to, its rows, and the sequence of each logit row (to check the answer). */
#define COOP_MAX_FLIGHTS 2
struct flight {
    uint64_t step;
    unsigned session;
    int helper;
    int rows, want, token_rows;
    unsigned *seq; /* max_seqs */
};

/* Helper: another node's sequence; its KV blocks come from our pool. */
struct hseq {
    int peer;
    unsigned id;
    struct sampler smp;
    int *blocks;
    int n_blocks;
    int n_pos;     /* positions [0, n_pos) computed here */
    int max_layer; /* the highest first layer of any of its rows: layers [max_layer, L) of every
                      computed position are in our KV */
};

/* Fabric thread -> compute thread. */
enum { W_OPEN, W_ACT, W_CLOSE, W_GONE, W_KV_REQ };
struct work {
    struct work *next;
    int kind, peer;
    uint32_t layer, rows, wants; /* W_ACT: first layer, rows, rows that want a token */
    uint64_t step;               /* W_ACT: the sender's step id */
    size_t len;
    uint8_t msg[];
};

/* Fabric thread's view of a peer that sends us work, for validation. */
struct peer_state {
    uint64_t last_step;
    unsigned *open; /* sequence ids opened and not closed */
    int n_open, cap_open;
};

struct coop {
    struct coop_config cfg;
    struct engine *e;
    struct serve_metrics *m;
    int L, dim, ctx, vocab;
    atomic_int target, k_now;
    /* the embedding table is here (coop_set_embedding_local); emb_now: as the scheduler runs */
    atomic_int emb_target, emb_now;
    struct {
        unsigned long long step;
        int k;            /* -1: the embedding arrives */
    } plan[MAX_SCHEDULE]; /* --resident-schedule */
    int n_sched, next_sched;

    /* joiner (compute thread, except the reply slot) */
    struct jseq *js;
    int n_js, cap_js;
    uint64_t step_id;
    float *x; /* max_tokens x dim */
    uint8_t *out;
    pthread_mutex_t mu; /* replies and helper session */
    pthread_cond_t cv;
    struct reply *r_head, *r_tail; /* MSG_COOP_TOKENS received, oldest first */
    /* pipelined steps sent and not answered yet (hook_send / hook_recv), oldest first */
    struct flight fl[COOP_MAX_FLIGHTS];
    int fl_first, n_fl;
    unsigned session; /* bumped when the helper connection closes */
    int helper_open;
    atomic_int helper; /* the helper's fabric peer: cfg.helper_peer, or an alternative */
    char helper_why[256];
    /* KV transfers: the request being answered (0: none) and its chunks, under mu */
    uint64_t kv_want, kv_req_id;
    struct work *kv_head, *kv_tail;
    void *kv_k, *kv_v;       /* one chunk's keys and values in host order (helper too) */
    uint32_t *kq_seq, *kq_n; /* a request's sequences and position counts */
    /* the cost model (compute thread): measured KV transfer rate (bytes/s) and recompute time per
     * layer x position (s); before the first recompute, the local layers' time per row and layer */
    double link_bps, lp_s, lp_prior_s;
    /* while partial (logged when every layer is here): seconds in our layers and waiting for
     * answers, steps sent and of those sent with another in flight */
    double t_local, t_wait;
    unsigned long long n_sent, n_piped;
    int logged_k0, logged_k1;

    /* helper */
    struct scheduler *sched;
    pthread_mutex_t wmu;
    struct work *w_head, *w_tail;
    struct peer_state ps[FABRIC_MAX_NODE_PEERS]; /* fabric thread */
    uint32_t *v_seq, *v_pos, *v_tok;             /* fabric thread: validation scratch */
    uint8_t *v_flags;
    float *v_x;
    uint32_t *vq_seq, *vq_n; /* fabric thread: a KV request's sequences */
    struct kvjob *kv_jobs;   /* compute thread: KV answers under way (kv_pump) */
    struct hseq *hs;         /* compute thread */
    int n_hs, cap_hs;
    struct work *held_head, *held_tail; /* taken from the queue, not run yet (hook_serve) */
    float *hx, *logits;
    /* a fused step (hook_forward): our rows first, then the remote ones as they join; fx is
     * max_tokens x dim, flogits (2 max_seqs) x vocab: our logit rows, then theirs */
    float *fx, *flogits;
    int *f_tok, *f_pos, *f_rows;
    const int **f_blocks;
    struct hseq **f_hs;
    uint8_t *f_flags;
    uint32_t *a_seq, *a_pos, *a_tok;
    uint8_t *a_flags;
    int *b_pos, *b_tok, *b_rows;
    const int **b_blocks;
    struct wire_coop_token *toks;
    uint32_t hx_rows;
};

static void kv_jobs_drop(struct coop *c, int peer); /* -1: all */

/* Replies not taken (at the end, or a helper's that is gone). */
static void replies_drop(struct coop *c)
{
    while (c->r_head) {
        struct reply *r = c->r_head;
        c->r_head = r->next;
        free(r);
    }
    c->r_tail = NULL;
}

/* ---------------------------------------------------------------- set-up */

int coop_kv_parse(const char *s)
{
    return !strcmp(s, "auto")        ? COOP_KV_AUTO
           : !strcmp(s, "transfer")  ? COOP_KV_TRANSFER
           : !strcmp(s, "recompute") ? COOP_KV_RECOMPUTE
           : !strcmp(s, "compare")   ? COOP_KV_COMPARE
                                     : -1;
}

int coop_kv_fault_parse(const char *s)
{
    return !strcmp(s, "seq")      ? KV_FAULT_SEQ
           : !strcmp(s, "layer")  ? KV_FAULT_LAYER
           : !strcmp(s, "short")  ? KV_FAULT_SHORT
           : !strcmp(s, "die")    ? KV_FAULT_DIE
           : !strcmp(s, "refuse") ? KV_FAULT_REFUSE
                                  : -1;
}

static int parse_schedule(struct coop *c, const char *s, char *err)
{
    while (s && *s) {
        char *end;
        unsigned long long step = strtoull(s, &end, 10);
        if (end == s || *end != ':')
            return errmsg_set(err, "--resident-schedule: want STEP:K,STEP:K,... at '%s'", s);
        s = end + 1;
        long k;
        if (*s == 'e') { /* the embedding arrives (it is remote until then) */
            k = -1;
            end = (char *)s + 1;
            c->cfg.embedding_remote = 1;
        } else {
            k = strtol(s, &end, 10);
            if (end == s || k < 0 || k > c->L)
                return errmsg_set(err, "--resident-schedule: K in [0, %d] or 'e' at '%s'", c->L, s);
        }
        if (*end && *end != ',')
            return errmsg_set(err, "--resident-schedule: K in [0, %d] or 'e' at '%s'", c->L, s);
        if (c->n_sched == MAX_SCHEDULE)
            return errmsg_set(err, "--resident-schedule: at most %d entries", MAX_SCHEDULE);
        c->plan[c->n_sched].step = step;
        c->plan[c->n_sched++].k = (int)k;
        s = *end ? end + 1 : end;
    }
    return 0;
}

struct coop *coop_new(const struct coop_config *cfg, char *err)
{
    struct coop *c = calloc(1, sizeof *c);
    if (!c) {
        errmsg_set(err, "coop: out of memory");
        return NULL;
    }
    c->cfg = *cfg;
    c->e = cfg->e;
    c->m = cfg->m;
    c->L = cfg->e->cfg->n_layers;
    c->dim = cfg->e->cfg->dim;
    c->ctx = cfg->e->lim.ctx;
    c->vocab = cfg->e->cfg->vocab_size;
    if (c->cfg.timeout_ms <= 0) c->cfg.timeout_ms = 30000;
    if (cfg->resident < 0 || cfg->resident > c->L) {
        errmsg_set(err, "coop: %d resident layers of %d", cfg->resident, c->L);
        free(c);
        return NULL;
    }
    if (cfg->kv_mode < COOP_KV_AUTO || cfg->kv_mode > COOP_KV_COMPARE) {
        errmsg_set(err, "coop: KV mode %d unknown", cfg->kv_mode);
        free(c);
        return NULL;
    }
    if (cfg->dtype != WIRE_F32 && cfg->dtype != WIRE_F16 && cfg->dtype != WIRE_BF16) {
        errmsg_set(err, "coop: activation dtype %d unknown", cfg->dtype);
        free(c);
        return NULL;
    }
    if (parse_schedule(c, cfg->schedule, err)) {
        free(c);
        return NULL;
    }
    if (c->cfg.embedding_remote && cfg->resident > 0) {
        errmsg_set(err, "coop: %d layers resident without the embedding", cfg->resident);
        free(c);
        return NULL;
    }
    atomic_init(&c->helper, cfg->helper_peer);
    if (c->cfg.serve_remote && c->cfg.fuse && !c->e->be->batch_invariant) {
        log_info("coop",
                 "remote steps run apart from ours: the %s backend's rows depend on their "
                 "batch, so fusing them would change their bits",
                 c->e->be->name);
        c->cfg.fuse = 0;
    }
    atomic_init(&c->target, cfg->resident);
    atomic_init(&c->k_now, cfg->resident);
    atomic_init(&c->emb_target, !c->cfg.embedding_remote);
    atomic_init(&c->emb_now, !c->cfg.embedding_remote);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    pthread_mutex_init(&c->wmu, NULL);
    int T = c->e->lim.max_tokens, S = c->e->lim.max_seqs;
    uint32_t rows = wire_activations_max_rows((uint32_t)c->dim, WIRE_F16);
    c->hx_rows = rows;
    c->x = malloc((size_t)T * c->dim * sizeof *c->x);
    c->out = malloc(WIRE_MAX_MSG);
    for (int i = 0; i < COOP_MAX_FLIGHTS; i++) {
        c->fl[i].seq = malloc((size_t)S * sizeof *c->fl[i].seq);
        if (!c->fl[i].seq) {
            errmsg_set(err, "coop: out of memory for the step buffers");
            coop_free(c);
            return NULL;
        }
    }
    c->hx = malloc((size_t)rows * c->dim * sizeof *c->hx);
    c->logits = malloc((size_t)S * c->vocab * sizeof *c->logits);
    c->a_seq = malloc(WIRE_MAX_ACT_TOKENS * sizeof *c->a_seq); /* also a CLOSE's ids */
    c->a_pos = malloc(rows * sizeof *c->a_pos);
    c->a_tok = malloc(rows * sizeof *c->a_tok);
    c->a_flags = malloc(rows);
    c->b_pos = malloc((size_t)T * sizeof *c->b_pos);
    c->b_tok = calloc((size_t)T, sizeof *c->b_tok);
    c->b_rows = malloc((size_t)T * sizeof *c->b_rows);
    c->b_blocks = malloc((size_t)T * sizeof *c->b_blocks);
    c->toks = malloc(WIRE_MAX_ACT_TOKENS * sizeof *c->toks);
    c->kv_k = malloc(WIRE_MAX_MSG / 2);
    c->kv_v = malloc(WIRE_MAX_MSG / 2);
    c->kq_seq = malloc(WIRE_COOP_KV_MAX_SEQS * sizeof *c->kq_seq);
    c->kq_n = malloc(WIRE_COOP_KV_MAX_SEQS * sizeof *c->kq_n);
    c->vq_seq = malloc(WIRE_COOP_KV_MAX_SEQS * sizeof *c->vq_seq);
    c->vq_n = malloc(WIRE_COOP_KV_MAX_SEQS * sizeof *c->vq_n);
    c->v_seq = malloc(WIRE_MAX_ACT_TOKENS * sizeof *c->v_seq);
    c->v_pos = malloc(rows * sizeof *c->v_pos);
    c->v_tok = malloc(rows * sizeof *c->v_tok);
    c->v_flags = malloc(rows);
    c->v_x = malloc((size_t)rows * c->dim * sizeof *c->v_x);
    if (c->cfg.serve_remote && c->cfg.fuse) {
        c->fx = malloc((size_t)T * c->dim * sizeof *c->fx);
        c->flogits = malloc((size_t)2 * S * c->vocab * sizeof *c->flogits);
        c->f_tok = calloc((size_t)T, sizeof *c->f_tok);
        c->f_pos = malloc((size_t)T * sizeof *c->f_pos);
        c->f_rows = malloc((size_t)T * sizeof *c->f_rows);
        c->f_blocks = malloc((size_t)T * sizeof *c->f_blocks);
        c->f_hs = malloc((size_t)T * sizeof *c->f_hs);
        c->f_flags = malloc((size_t)T);
    }
    int fuse_ok = !c->cfg.serve_remote || !c->cfg.fuse ||
                  (c->fx && c->flogits && c->f_tok && c->f_pos && c->f_rows && c->f_blocks &&
                   c->f_hs && c->f_flags);
    if (!c->x || !c->out || !c->hx || !c->logits || !c->a_seq || !c->a_pos || !c->a_tok ||
        !c->a_flags || !c->b_pos || !c->b_tok || !c->b_rows || !c->b_blocks || !c->toks ||
        !c->kv_k || !c->kv_v || !c->v_seq || !c->v_pos || !c->v_tok || !c->v_flags || !c->v_x ||
        !fuse_ok || !c->kq_seq || !c->kq_n || !c->vq_seq || !c->vq_n) {
        errmsg_set(err, "coop: out of memory for the step buffers");
        coop_free(c);
        return NULL;
    }
    if (c->m) {
        atomic_store(&c->m->layers_total, c->L);
        atomic_store(&c->m->layers_resident, cfg->resident);
        atomic_store(&c->m->coop_k, cfg->resident);
        atomic_store(&c->m->coop_embedding_remote, c->cfg.embedding_remote);
    }
    return c;
}

static void hseq_free(struct coop *c, struct hseq *h)
{
    for (int i = h->n_blocks - 1; i >= 0; i--) kv_block_free(&c->e->kv, h->blocks[i]);
    free(h->blocks);
    sampler_free(&h->smp);
}

void coop_free(struct coop *c)
{
    if (!c) return;
    for (int i = 0; i < c->n_js; i++) free(c->js[i].x), free(c->js[i].xl), free(c->js[i].tok);
    free(c->js);
    for (struct work *w = c->kv_head, *n; w; w = n) {
        n = w->next;
        free(w);
    }
    free(c->kv_k), free(c->kv_v);
    free(c->kq_seq), free(c->kq_n), free(c->vq_seq), free(c->vq_n);
    kv_jobs_drop(c, -1);
    for (int i = 0; i < c->n_hs; i++) hseq_free(c, &c->hs[i]);
    free(c->hs);
    for (struct work *w = c->w_head, *n; w; w = n) {
        n = w->next;
        free(w);
    }
    for (struct work *w = c->held_head, *n; w; w = n) {
        n = w->next;
        free(w);
    }
    for (int i = 0; i < FABRIC_MAX_NODE_PEERS; i++) free(c->ps[i].open);
    free(c->fx), free(c->flogits), free(c->f_tok), free(c->f_pos);
    free(c->f_rows), free(c->f_blocks), free(c->f_hs), free(c->f_flags);
    free(c->x), free(c->out), free(c->hx), free(c->logits);
    for (int i = 0; i < COOP_MAX_FLIGHTS; i++) free(c->fl[i].seq);
    replies_drop(c);
    free(c->a_seq), free(c->a_pos), free(c->a_tok), free(c->a_flags);
    free(c->b_pos), free(c->b_tok), free(c->b_rows), free(c->b_blocks), free(c->toks);
    free(c->v_seq), free(c->v_pos), free(c->v_tok), free(c->v_flags), free(c->v_x);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->wmu);
    free(c);
}

void coop_set_resident(struct coop *c, int k)
{
    if (k > c->L) k = c->L;
    int cur = atomic_load(&c->target);
    while (k > cur && !atomic_compare_exchange_weak(&c->target, &cur, k)) {
    }
    if (c->m) atomic_store(&c->m->layers_resident, atomic_load(&c->target));
}

void coop_set_embedding_local(struct coop *c)
{
    atomic_store(&c->emb_target, 1);
}

int coop_embedding_remote(const struct coop *c)
{
    return !atomic_load(&((struct coop *)c)->emb_now);
}

int coop_resident(const struct coop *c)
{
    return atomic_load(&((struct coop *)c)->target);
}

int coop_current_k(const struct coop *c)
{
    return atomic_load(&((struct coop *)c)->k_now);
}

void coop_set_scheduler(struct coop *c, struct scheduler *s)
{
    c->sched = s;
}

/* ---------------------------------------------------------------- fabric thread */

static int ps_find(const struct peer_state *p, unsigned id)
{
    for (int i = 0; i < p->n_open; i++)
        if (p->open[i] == id) return i;
    return -1;
}

/* Queue a message for the compute thread; act: for activations, their shape as decoded here. */
static int queue_work(struct coop *c, int kind, int peer, const uint8_t *msg, size_t len,
                      const struct work *act)
{
    struct work *w = malloc(sizeof *w + len);
    if (!w) {
        log_error("coop", "out of memory queueing a %zu-byte message from peer %d", len, peer);
        return -1;
    }
    *w = act ? *act : (struct work){0};
    w->next = NULL;
    w->kind = kind;
    w->peer = peer;
    w->len = len;
    if (len) memcpy(w->msg, msg, len);
    pthread_mutex_lock(&c->wmu);
    if (c->w_tail)
        c->w_tail->next = w;
    else
        c->w_head = w;
    c->w_tail = w;
    pthread_mutex_unlock(&c->wmu);
    if (c->sched) sched_poke(c->sched);
    return 0;
}

static int on_open(void *ctx, struct fabric_node *fn, int peer, const uint8_t *msg, size_t len)
{
    struct coop *c = ctx;
    struct peer_state *p = &c->ps[peer];
    char err[ERRMSG_LEN];
    struct wire_coop_open o;
    if (wire_coop_open_decode(&o, msg, len, err)) {
        log_warn("coop", "peer %d (%s): %s", peer, fabric_node_peer_name(fn, peer), err);
        return -1;
    }
    if (coop_resident(c) < c->L) { /* a joiner helps only once it holds every layer */
        log_warn("coop", "peer %d (%s): asked to help with %d of %d layers here: refused", peer,
                 fabric_node_peer_name(fn, peer), coop_resident(c), c->L);
        return -1;
    }
    if (ps_find(p, o.seq) >= 0) {
        log_warn("coop", "peer %d (%s): sequence %u opened twice", peer,
                 fabric_node_peer_name(fn, peer), o.seq);
        return -1;
    }
    if (p->n_open == p->cap_open) {
        int cap = p->cap_open ? 2 * p->cap_open : 64;
        unsigned *n = realloc(p->open, (size_t)cap * sizeof *n);
        if (!n) return log_error("coop", "out of memory"), -1;
        p->open = n;
        p->cap_open = cap;
    }
    p->open[p->n_open++] = o.seq;
    return queue_work(c, W_OPEN, peer, msg, len, NULL);
}

static int on_close(void *ctx, struct fabric_node *fn, int peer, const uint8_t *msg, size_t len)
{
    struct coop *c = ctx;
    struct peer_state *p = &c->ps[peer];
    char err[ERRMSG_LEN];
    uint32_t n;
    if (wire_coop_close_decode(msg, len, c->v_seq, WIRE_MAX_ACT_TOKENS, &n, err)) {
        log_warn("coop", "peer %d (%s): %s", peer, fabric_node_peer_name(fn, peer), err);
        return -1;
    }
    for (uint32_t i = 0; i < n; i++) {
        int at = ps_find(p, c->v_seq[i]);
        if (at < 0) {
            log_warn("coop", "peer %d (%s): close of sequence %u, which it never opened", peer,
                     fabric_node_peer_name(fn, peer), c->v_seq[i]);
            return -1;
        }
        p->open[at] = p->open[--p->n_open];
    }
    return queue_work(c, W_CLOSE, peer, msg, len, NULL);
}

/* Everything the compute thread will trust is checked here: shape, layer, positions, that every
 * row's sequence was opened, that steps only move forward. */
static int on_activations(void *ctx, struct fabric_node *fn, int peer, const uint8_t *msg,
                          size_t len)
{
    struct coop *c = ctx;
    struct peer_state *p = &c->ps[peer];
    const char *who = fabric_node_peer_name(fn, peer);
    char err[ERRMSG_LEN];
    struct wire_activations a;
    /* decoded into the fabric thread's own scratch (the compute thread decodes again) */
    uint32_t *seq = c->v_seq, *pos = c->v_pos, *tok = c->v_tok;
    uint8_t *flags = c->v_flags;
    float *x = c->v_x;
    size_t cap_x = (size_t)c->hx_rows * c->dim;
    if (wire_activations_decode(&a, msg, len, seq, pos, tok, flags, x, c->hx_rows, cap_x, err)) {
        log_warn("coop", "peer %d (%s): %s", peer, who, err);
        return -1;
    }
    if (a.dim != (uint32_t)c->dim) {
        log_warn("coop", "peer %d (%s): activations of dim %u, the model's is %d", peer, who, a.dim,
                 c->dim);
        return -1;
    }
    if (a.layer >= (uint32_t)c->L) {
        log_warn("coop", "peer %d (%s): activations for layer %u of %d", peer, who, a.layer, c->L);
        return -1;
    }
    if (a.step <= p->last_step) {
        log_warn("coop", "peer %d (%s): step %llu after step %llu", peer, who,
                 (unsigned long long)a.step, (unsigned long long)p->last_step);
        return -1;
    }
    if (a.n == 0) {
        log_warn("coop", "peer %d (%s): step %llu has no rows", peer, who,
                 (unsigned long long)a.step);
        return -1;
    }
    for (uint32_t i = 0; i < a.n; i++) {
        if (ps_find(p, seq[i]) < 0) {
            log_warn("coop", "peer %d (%s): step %llu row %u: sequence %u was never opened", peer,
                     who, (unsigned long long)a.step, i, seq[i]);
            return -1;
        }
        if (pos[i] >= (uint32_t)c->ctx) {
            log_warn("coop", "peer %d (%s): step %llu row %u: position %u, the context is %d", peer,
                     who, (unsigned long long)a.step, i, pos[i], c->ctx);
            return -1;
        }
    }
    p->last_step = a.step;
    struct work shape = {.layer = a.layer, .rows = a.n, .step = a.step};
    for (uint32_t i = 0; i < a.n; i++) shape.wants += (flags[i] & WIRE_ROW_LOGITS) != 0;
    return queue_work(c, W_ACT, peer, msg, len, &shape);
}

/* A KV request: every sequence must be this peer's, the layers and positions inside the model. */
static int on_kv_req(void *ctx, struct fabric_node *fn, int peer, const uint8_t *msg, size_t len)
{
    struct coop *c = ctx;
    const char *who = fabric_node_peer_name(fn, peer);
    char err[ERRMSG_LEN];
    struct wire_coop_kv_req q;
    if (wire_coop_kv_req_decode(&q, msg, len, c->vq_seq, c->vq_n, WIRE_COOP_KV_MAX_SEQS, err)) {
        log_warn("coop", "peer %d (%s): %s", peer, who, err);
        return -1;
    }
    if (q.layer1 > (uint32_t)c->L) {
        log_warn("coop", "peer %d (%s): KV request for layers [%u, %u) of %d", peer, who, q.layer0,
                 q.layer1, c->L);
        return -1;
    }
    for (uint32_t i = 0; i < q.count; i++) {
        if (ps_find(&c->ps[peer], q.seq[i]) < 0) {
            log_warn("coop", "peer %d (%s): KV request for sequence %u, which it never opened",
                     peer, who, q.seq[i]);
            return -1;
        }
        if (q.n[i] > (uint32_t)c->ctx) {
            log_warn("coop", "peer %d (%s): KV request for %u positions of sequence %u of %d", peer,
                     who, q.n[i], q.seq[i], c->ctx);
            return -1;
        }
    }
    return queue_work(c, W_KV_REQ, peer, msg, len, NULL);
}

/* A KV chunk: queued for the compute thread if it answers the transfer under way; a chunk of a
 * transfer given up (refused, timed out) is dropped. */
static int on_kv(void *ctx, struct fabric_node *fn, int peer, const uint8_t *msg, size_t len)
{
    struct coop *c = ctx;
    if (peer != atomic_load(&c->helper)) {
        log_warn("coop", "peer %d (%s): KV from a node that is not our helper", peer,
                 fabric_node_peer_name(fn, peer));
        return -1;
    }
    uint64_t req = 0;
    for (size_t i = 0; i < 8 && 1 + i < len; i++) req |= (uint64_t)msg[1 + i] << (8 * i);
    struct work *w = malloc(sizeof *w + len);
    if (!w) return log_error("coop", "out of memory for a %zu-byte KV chunk", len), -1;
    *w = (struct work){.kind = W_KV_REQ, .peer = peer, .len = len};
    memcpy(w->msg, msg, len);
    pthread_mutex_lock(&c->mu);
    int want = c->kv_want && req == c->kv_want;
    if (want) {
        if (c->kv_tail)
            c->kv_tail->next = w;
        else
            c->kv_head = w;
        c->kv_tail = w;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    if (!want) free(w);
    return 0;
}

static int on_tokens(void *ctx, struct fabric_node *fn, int peer, const uint8_t *msg, size_t len)
{
    struct coop *c = ctx;
    if (peer != atomic_load(&c->helper)) {
        log_warn("coop", "peer %d (%s): tokens from a node that is not our helper", peer,
                 fabric_node_peer_name(fn, peer));
        return -1;
    }
    struct reply *r = malloc(sizeof *r + len);
    if (!r) return log_error("coop", "out of memory for a %zu-byte reply", len), -1;
    r->next = NULL;
    r->len = len;
    memcpy(r->msg, msg, len);
    pthread_mutex_lock(&c->mu);
    if (c->r_tail)
        c->r_tail->next = r;
    else
        c->r_head = r;
    c->r_tail = r;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

/* 1 when peer may be our helper: the configured one or an alternative. */
static int helper_candidate(const struct coop *c, int peer)
{
    if (c->cfg.helper_peer < 0) return 0;
    if (peer == c->cfg.helper_peer) return 1;
    for (int i = 0; i < c->cfg.n_alt_helpers; i++)
        if (c->cfg.alt_helpers[i] == peer) return 1;
    return 0;
}

static void on_peer(void *ctx, struct fabric_node *fn, int peer, int state, const char *why)
{
    struct coop *c = ctx;
    if (helper_candidate(c, peer)) {
        int cur = atomic_load(&c->helper), took = -1;
        pthread_mutex_lock(&c->mu);
        if (peer == cur && state == TP_OPEN) {
            c->helper_open = 1;
        } else if (peer == cur) {
            c->helper_open = 0;
            c->session++;
            snprintf(c->helper_why, sizeof c->helper_why, "%s", why && *why ? why : "closed");
            pthread_cond_broadcast(&c->cv);
            /* another node that serves the model, connected already, takes over */
            for (int i = 0; i < c->cfg.n_alt_helpers && took < 0; i++)
                if (c->cfg.alt_helpers[i] != peer &&
                    fabric_node_peer_open(fn, c->cfg.alt_helpers[i]))
                    took = c->cfg.alt_helpers[i];
        } else if (state == TP_OPEN && !c->helper_open && c->cfg.n_alt_helpers) {
            took = peer; /* ours is gone: the first candidate to connect takes over */
        }
        if (took >= 0) {
            atomic_store(&c->helper, took);
            c->helper_open = 1;
        }
        pthread_mutex_unlock(&c->mu);
        if (peer == cur && state == TP_OPEN)
            log_info("coop", "helper %s connected", fabric_node_peer_name(fn, peer));
        if (took >= 0)
            log_info("coop",
                     "helper %s is gone (%s): %s serves the model too and is the helper from now "
                     "on (the sequences open at %s fail)",
                     fabric_node_peer_name(fn, cur), c->helper_why, fabric_node_peer_name(fn, took),
                     fabric_node_peer_name(fn, cur));
    }
    if (state == TP_CLOSED && c->cfg.serve_remote) {
        struct peer_state *p = &c->ps[peer];
        int had = p->n_open;
        p->n_open = 0;
        p->last_step = 0;
        if (had) queue_work(c, W_GONE, peer, NULL, 0, NULL);
    }
}

int coop_attach(struct coop *c, char *err)
{
    struct fabric_node *fn = c->cfg.fabric;
    int bad = fabric_node_on_peer(fn, on_peer, c);
    if (c->cfg.resident < c->L || c->n_sched) {
        bad |= fabric_node_on(fn, MSG_COOP_TOKENS, on_tokens, c);
        bad |= fabric_node_on(fn, MSG_COOP_KV, on_kv, c);
    }
    if (c->cfg.serve_remote) {
        bad |= fabric_node_on(fn, MSG_ACTIVATIONS, on_activations, c);
        bad |= fabric_node_on(fn, MSG_COOP_OPEN, on_open, c);
        bad |= fabric_node_on(fn, MSG_COOP_CLOSE, on_close, c);
        bad |= fabric_node_on(fn, MSG_COOP_KV_REQ, on_kv_req, c);
    }
    return bad ? errmsg_set(err, "coop: registering on the fabric node failed") : 0;
}

/* ---------------------------------------------------------------- joiner (compute thread) */

static struct jseq *js_find(struct coop *c, unsigned id)
{
    for (int i = 0; i < c->n_js; i++)
        if (c->js[i].id == id) return &c->js[i];
    return NULL;
}

static struct jseq *js_get(struct coop *c, unsigned id, char *err)
{
    struct jseq *j = js_find(c, id);
    if (j) return j;
    if (c->n_js == c->cap_js) {
        int cap = c->cap_js ? 2 * c->cap_js : 16;
        struct jseq *n = realloc(c->js, (size_t)cap * sizeof *n);
        if (!n) return errmsg_set(err, "coop: out of memory"), NULL;
        c->js = n;
        c->cap_js = cap;
    }
    j = &c->js[c->n_js];
    *j = (struct jseq){.id = id};
    j->x = malloc((size_t)c->ctx * c->dim * sizeof *j->x);
    j->xl = malloc((size_t)c->ctx * sizeof *j->xl);
    j->tok = malloc((size_t)c->ctx * sizeof *j->tok);
    if (!j->x || !j->xl || !j->tok) {
        free(j->x), free(j->xl), free(j->tok);
        return errmsg_set(err, "coop: out of memory for sequence %u's inputs", id), NULL;
    }
    c->n_js++;
    return j;
}

static void js_drop(struct coop *c, struct jseq *j)
{
    free(j->x), free(j->xl), free(j->tok);
    *j = c->js[--c->n_js];
}

static int send_close(struct coop *c, int helper, const uint32_t *ids, uint32_t n)
{
    char err[ERRMSG_LEN];
    while (n) {
        uint32_t m = n > 4096 ? 4096 : n;
        size_t len = wire_coop_close_encode(c->out, WIRE_MAX_MSG, ids, m);
        if (!len || fabric_node_send(c->cfg.fabric, helper, c->out, len, err)) return -1;
        ids += m, n -= m;
    }
    return 0;
}

static int hook_resident(void *ctx, unsigned long long steps)
{
    struct coop *c = ctx;
    while (c->next_sched < c->n_sched && c->plan[c->next_sched].step <= steps) {
        int k = c->plan[c->next_sched++].k;
        if (k < 0)
            coop_set_embedding_local(c);
        else
            coop_set_resident(c, k);
    }
    if (!atomic_load(&c->emb_now) && atomic_load(&c->emb_target)) {
        atomic_store(&c->emb_now, 1);
        if (c->m) atomic_store(&c->m->coop_embedding_remote, 0);
        log_info("coop", "the embedding is here: steps send hidden states from now on (the "
                         "positions sent as token ids are embedded here when their KV is needed)");
    }
    /* no layer runs here before the embedding does (the puller's k counts blocks with it) */
    int k = atomic_load(&c->emb_now) ? atomic_load(&c->target) : 0;
    if (k != atomic_load(&c->k_now) && c->n_sent)
        log_info("coop",
                 "k %d -> %d; so far %llu steps sent (%llu with another in flight), %.3f s in our "
                 "layers, %.3f s waiting for the helper's answers",
                 atomic_load(&c->k_now), k, c->n_sent, c->n_piped, c->t_local, c->t_wait);
    atomic_store(&c->k_now, k);
    if (c->m) atomic_store(&c->m->coop_k, k);
    return k;
}

static int hook_ready(void *ctx)
{
    struct coop *c = ctx;
    pthread_mutex_lock(&c->mu);
    int open = c->helper_open;
    pthread_mutex_unlock(&c->mu);
    return open;
}

static int wait_reply_(struct coop *c, const char *helper, uint64_t step, unsigned session,
                       const struct timespec *until, struct wire_coop_tokens *t, char *err);
/* Wait for the reply to step `step`; the helper leaving or the timeout fail it. A reply to an
 * earlier step (one that failed here before its answer came) is dropped. */
static int wait_reply(struct coop *c, int helper_peer, uint64_t step, unsigned session,
                      struct wire_coop_tokens *t, char *err)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += c->cfg.timeout_ms / 1000;
    until.tv_nsec += (long)(c->cfg.timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    const char *helper = fabric_node_peer_name(c->cfg.fabric, helper_peer);
    double tw = clock_now();
    int rc = wait_reply_(c, helper, step, session, &until, t, err);
    c->t_wait += clock_now() - tw;
    return rc;
}

static int wait_reply_(struct coop *c, const char *helper, uint64_t step, unsigned session,
                       const struct timespec *until_p, struct wire_coop_tokens *t, char *err)
{
    struct timespec until = *until_p;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        if (c->session != session) {
            errmsg_set(err, "helper %s failed during step %llu: %s", helper,
                       (unsigned long long)step, c->helper_why);
            break;
        }
        struct reply *r = c->r_head;
        if (r) {
            c->r_head = r->next;
            if (!c->r_head) c->r_tail = NULL;
            pthread_mutex_unlock(&c->mu);
            int bad = wire_coop_tokens_decode(t, r->msg, r->len, c->toks, WIRE_MAX_ACT_TOKENS, err);
            free(r);
            if (bad) return errmsg_prefix(err, "helper %s: ", helper);
            if (t->step && t->step < step) { /* stale */
                pthread_mutex_lock(&c->mu);
                continue;
            }
            if (t->step != step && !(t->step == 0 && t->status))
                return errmsg_set(err, "helper %s answered step %llu, we wait for %llu", helper,
                                  (unsigned long long)t->step, (unsigned long long)step);
            return 0;
        }
        if (pthread_cond_timedwait(&c->cv, &c->mu, &until) == ETIMEDOUT) {
            errmsg_set(err, "helper %s did not answer step %llu within %d ms", helper,
                       (unsigned long long)step, c->cfg.timeout_ms);
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return -1;
}

/* A step's start: open the sequences new to the helper, run the embedding and layers [0, k) into
 * c->x and save each row's input for a later recompute. The session and helper it goes to in
 * *session, *hp. */
static int step_prepare(struct coop *c, const struct batch *b, int k, const unsigned *seq,
                        struct sampler *const *smp, unsigned *session_out, int *hp_out, char *err)
{
    pthread_mutex_lock(&c->mu);
    unsigned session = c->session;
    int open = c->helper_open, hp = atomic_load(&c->helper);
    pthread_mutex_unlock(&c->mu);
    const char *helper = fabric_node_peer_name(c->cfg.fabric, hp);
    if (!open) return errmsg_set(err, "helper %s is not connected", helper);
    /* Sequences new to the helper are opened with their sampler as it is now. */
    for (int i = 0; i < b->n; i++) {
        struct jseq *j = js_get(c, seq[i], err);
        if (!j) return -1;
        if (j->opened && j->session != session) {
            if (b->pos[i] != 0)
                return errmsg_set(err,
                                  "helper %s was lost: sequence %u's upper-layer KV went with it",
                                  fabric_node_peer_name(c->cfg.fabric, j->helper), seq[i]);
            j->opened = 0; /* recomputed from its start (preempted): open it again */
        }
        if (j->opened) continue;
        struct wire_coop_open o = {.seq = seq[i],
                                   .temperature = smp[i]->p.temperature,
                                   .top_p = smp[i]->p.top_p,
                                   .top_k = (uint32_t)(smp[i]->p.top_k > 0 ? smp[i]->p.top_k : 0),
                                   .min_p = smp[i]->p.min_p,
                                   .rng = smp[i]->rng};
        size_t len = wire_coop_open_encode(c->out, WIRE_MAX_MSG, &o);
        if (!len || fabric_node_send(c->cfg.fabric, hp, c->out, len, err))
            return errmsg_prefix(err, "helper %s: opening sequence %u: ", helper, seq[i]);
        j->opened = 1;
        j->session = session;
        j->helper = hp;
    }
    /* Our layers (their time per row and layer: the recompute cost model's prior); without the
     * embedding, none: the rows go as token ids (WIRE_TOKENS) and the helper embeds them. */
    int emb = atomic_load(&c->emb_now);
    if (!emb && k != 0) return errmsg_set(err, "coop: %d local layers without the embedding", k);
    double tl = clock_now();
    if (emb && engine_embed(c->e, b, c->x))
        return errmsg_set(err, "the embedding failed: %s", engine_error(c->e));
    double t0 = clock_now();
    if (emb && engine_layers(c->e, b, 0, k, c->x))
        return errmsg_set(err, "the local layers [0, %d) failed: %s", k, engine_error(c->e));
    if (k > 0) {
        double per = (clock_now() - t0) / ((double)b->n * k);
        if (c->lp_prior_s <= 0 || per < c->lp_prior_s) c->lp_prior_s = per;
    }
    c->t_local += clock_now() - tl;
    for (int i = 0; i < b->n; i++) {
        struct jseq *j = js_find(c, seq[i]);
        if (emb)
            memcpy(j->x + (size_t)b->pos[i] * c->dim, c->x + (size_t)i * c->dim,
                   (size_t)c->dim * sizeof(float));
        j->xl[b->pos[i]] = emb ? k : -1;
        j->tok[b->pos[i]] = b->token[i];
    }
    *session_out = session;
    *hp_out = hp;
    return 0;
}

/* Send rows [r0, r0 + n) of b (prepared in c->x) as one message of step id *step_out; lr: the
 * logit rows handled before r0, advanced past this message's (*want of them). */
static int step_send_rows(struct coop *c, const struct batch *b, int k, const unsigned *seq,
                          const unsigned char *mask, int hp, int r0, int n, int *lr, int *want,
                          uint64_t *step_out, char *err)
{
    int emb = atomic_load(&c->emb_now);
    uint8_t dtype = emb ? (uint8_t)c->cfg.dtype : WIRE_TOKENS;
    *want = 0;
    for (int i = 0; i < n; i++) {
        c->a_seq[i] = seq[r0 + i];
        c->a_pos[i] = (uint32_t)b->pos[r0 + i];
        c->a_tok[i] = (uint32_t)b->token[r0 + i];
        c->a_flags[i] = 0;
        if (*lr < b->n_logits && b->logit_rows[*lr] == r0 + i) {
            c->a_flags[i] = WIRE_ROW_LOGITS | (mask[*lr] ? WIRE_ROW_MASK_EOS : 0);
            (*lr)++, (*want)++;
        }
    }
    uint64_t step = ++c->step_id;
    struct wire_activations a = {.step = step,
                                 .layer = (uint32_t)k,
                                 .n = (uint32_t)n,
                                 .dim = (uint32_t)c->dim,
                                 .dtype = dtype,
                                 .seq = c->a_seq,
                                 .pos = c->a_pos,
                                 .token = c->a_tok,
                                 .flags = c->a_flags,
                                 .x = c->x + (size_t)r0 * c->dim};
    size_t len = wire_activations_encode(c->out, WIRE_MAX_MSG, &a);
    if (!len) return errmsg_set(err, "coop: %d rows do not fit one message", n);
    if (fabric_node_send(c->cfg.fabric, hp, c->out, len, err))
        return errmsg_prefix(err, "helper %s: ", fabric_node_peer_name(c->cfg.fabric, hp));
    *step_out = step;
    c->n_sent++;
    return 0;
}

/* The answer t to a message of `want` logit rows whose sequences are seq_of_row[0..want): 0, or
 * -1 (err) when it is an error or does not match. */
static int reply_check(struct coop *c, int hp, const struct wire_coop_tokens *t, int want,
                       const unsigned *seq_of_row, char *err)
{
    const char *helper = fabric_node_peer_name(c->cfg.fabric, hp);
    if (t->status) return errmsg_set(err, "helper %s: %s", helper, t->error);
    if (t->n != (uint32_t)want)
        return errmsg_set(err, "helper %s sent %u tokens for %d rows", helper, t->n, want);
    for (int i = 0; i < want; i++)
        if (t->tok[i].seq != seq_of_row[i] || t->tok[i].token >= (uint32_t)c->vocab)
            return errmsg_set(err, "helper %s: token %d is for sequence %u (id %u), want %u",
                              helper, i, t->tok[i].seq, t->tok[i].token, seq_of_row[i]);
    return 0;
}

static void count_remote(struct coop *c, int rows, int want, int token_rows)
{
    if (!c->m) return;
    atomic_fetch_add_explicit(&c->m->coop_remote_steps, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->m->coop_remote_rows, (unsigned long long)rows,
                              memory_order_relaxed);
    if (token_rows)
        atomic_fetch_add_explicit(&c->m->coop_token_rows, (unsigned long long)rows,
                                  memory_order_relaxed);
    atomic_fetch_add_explicit(&c->m->coop_partial_tokens, (unsigned long long)want,
                              memory_order_relaxed);
}

static int hook_step(void *ctx, const struct batch *b, int k, const unsigned *seq,
                     struct sampler *const *smp, const unsigned char *mask, int *tokens, char *err)
{
    struct coop *c = ctx;
    unsigned session;
    int hp;
    if (step_prepare(c, b, k, seq, smp, &session, &hp, err)) return -1;
    /* The rest, in messages of at most WIRE_MAX_MSG bytes, each answered before the next (token
     * rows in chunks of the configured dtype's rows too: the helper's scratch is sized by them). */
    int tok_rows = !atomic_load(&c->emb_now);
    uint32_t per = wire_activations_max_rows((uint32_t)c->dim, (uint8_t)c->cfg.dtype);
    int lr = 0; /* logit rows handled */
    for (int r0 = 0; r0 < b->n; r0 += (int)per) {
        int n = b->n - r0 < (int)per ? b->n - r0 : (int)per;
        int want = 0, lr0 = lr;
        uint64_t step;
        if (step_send_rows(c, b, k, seq, mask, hp, r0, n, &lr, &want, &step, err)) return -1;
        struct wire_coop_tokens t;
        if (wait_reply(c, hp, step, session, &t, err)) return -1;
        for (int i = 0; i < want; i++) c->a_seq[i] = seq[b->logit_rows[lr0 + i]];
        if (reply_check(c, hp, &t, want, c->a_seq, err)) return -1;
        for (int i = 0; i < want; i++) {
            tokens[lr0 + i] = (int)t.tok[i].token;
            smp[b->logit_rows[lr0 + i]]->rng = t.tok[i].rng;
        }
        count_remote(c, n, want, tok_rows);
    }
    return 0;
}

/* Pipelined: step b goes out as one message and is answered later (hook_recv), while the
 * scheduler computes the next step's rows here. 1 when b needs more than one message (run it with
 * hook_step once the steps in flight are back) or COOP_MAX_FLIGHTS are in flight already. */
static int hook_send(void *ctx, const struct batch *b, int k, const unsigned *seq,
                     struct sampler *const *smp, const unsigned char *mask, char *err)
{
    struct coop *c = ctx;
    uint32_t per = wire_activations_max_rows((uint32_t)c->dim, (uint8_t)c->cfg.dtype);
    if (b->n > (int)per || c->n_fl == COOP_MAX_FLIGHTS || b->n_logits > c->e->lim.max_seqs)
        return 1;
    struct flight *f = &c->fl[(c->fl_first + c->n_fl) % COOP_MAX_FLIGHTS];
    if (step_prepare(c, b, k, seq, smp, &f->session, &f->helper, err)) return -1;
    int lr = 0;
    f->token_rows = !atomic_load(&c->emb_now);
    if (step_send_rows(c, b, k, seq, mask, f->helper, 0, b->n, &lr, &f->want, &f->step, err))
        return -1;
    f->rows = b->n;
    for (int i = 0; i < f->want; i++) f->seq[i] = seq[b->logit_rows[i]];
    if (c->n_fl++) {
        c->n_piped++;
        if (c->m) atomic_fetch_add_explicit(&c->m->coop_pipelined_steps, 1, memory_order_relaxed);
    }
    return 0;
}

/* The oldest step in flight's answer: tokens[j] and rng[j] (the sampler's generator state after
 * drawing it) for its logit row j. The step leaves the flight either way. */
static int hook_recv(void *ctx, int *tokens, uint64_t *rng, char *err)
{
    struct coop *c = ctx;
    if (!c->n_fl) return errmsg_set(err, "coop: no step in flight");
    struct flight *f = &c->fl[c->fl_first];
    c->fl_first = (c->fl_first + 1) % COOP_MAX_FLIGHTS;
    c->n_fl--;
    struct wire_coop_tokens t;
    if (wait_reply(c, f->helper, f->step, f->session, &t, err) ||
        reply_check(c, f->helper, &t, f->want, f->seq, err)) {
        log_warn("coop", "pipelined step %llu (%d rows) failed with %d more in flight: %s",
                 (unsigned long long)f->step, f->rows, c->n_fl, err);
        return -1;
    }
    for (int i = 0; i < f->want; i++) {
        tokens[i] = (int)t.tok[i].token;
        rng[i] = t.tok[i].rng;
    }
    count_remote(c, f->rows, f->want, f->token_rows);
    return 0;
}

/* ---- the KV of layers that became local */

static uint8_t kv_wire_dtype(const struct kv_cache *kv)
{
    return kv->type == KV_F32 ? WIRE_F32 : WIRE_F16;
}

/* The sequences of one rise of k (hook_fill): the saved inputs, block tables and computed
 * positions of each, and what became of it. */
struct fillset {
    int m;
    struct jseq **js;
    const int *const *blocks;
    const int *n;
};

/* Layers x positions a recompute of [xl[p], k1) at positions [0, n) runs. */
static long recompute_work(const struct jseq *j, int n, int k1)
{
    long lp = 0;
    for (int p = 0; p < n; p++) lp += k1 - j->xl[p];
    return lp;
}

/* Bring the KV of layers [.., k1) of positions [0, n[i]) of every sequence of f up from the saved
 * inputs, all sequences in the same engine calls: each call takes, from every sequence whose next
 * position's input is of layer l (the first such sequence's), that sequence's run of positions of
 * layer l, up to the step size in all, gathers their inputs into one batch, runs
 * engine_layers(l, k1) (the embedding first where l = -1: positions sent as token ids) and puts
 * the inputs of layer k1 back. A sequence's positions go in position order (a position's attention
 * reads the earlier ones' KV, already written); rows of different sequences never interact. */
static int kv_recompute(struct coop *c, const struct fillset *f, int k1, char *err)
{
    int T = c->e->lim.max_tokens, D = c->dim;
    int *at = calloc((size_t)f->m, sizeof *at);      /* next position of each sequence */
    int *take = malloc((size_t)f->m * sizeof *take); /* rows of each in this call */
    if (!at || !take) {
        free(at), free(take);
        return errmsg_set(err, "coop: out of memory recomputing the KV of %d sequences", f->m);
    }
    int rc = 0;
    for (;;) {
        int l = 0, any = 0;
        for (int i = 0; i < f->m && !any; i++)
            if (at[i] < f->n[i]) l = f->js[i]->xl[at[i]], any = 1;
        if (!any) break;
        int rows = 0;
        for (int i = 0; i < f->m; i++) {
            const struct jseq *j = f->js[i];
            int t = 0;
            while (rows < T && at[i] + t < f->n[i] && j->xl[at[i] + t] == l) {
                int p = at[i] + t;
                c->b_pos[rows] = p;
                c->b_tok[rows] = j->tok[p];
                c->b_blocks[rows] = f->blocks[i];
                if (l >= 0)
                    memcpy(c->x + (size_t)rows * D, j->x + (size_t)p * D, (size_t)D * sizeof *c->x);
                rows++, t++;
            }
            take[i] = t;
        }
        struct batch b = {.n = rows, .token = c->b_tok, .pos = c->b_pos, .blocks = c->b_blocks};
        if (l < 0) {
            if (engine_embed(c->e, &b, c->x)) {
                rc = errmsg_set(err, "coop: embedding %d saved positions of %d sequences: %s", rows,
                                f->m, engine_error(c->e));
                break;
            }
            l = 0;
        }
        if (l < k1 && engine_layers(c->e, &b, l, k1, c->x)) {
            rc = errmsg_set(err, "coop: recomputing layers [%d, %d) of %d sequences failed: %s", l,
                            k1, f->m, engine_error(c->e));
            break;
        }
        for (int i = 0, r = 0; i < f->m; i++) {
            struct jseq *j = f->js[i];
            for (int t = 0; t < take[i]; t++, r++) {
                int p = at[i] + t;
                memcpy(j->x + (size_t)p * D, c->x + (size_t)r * D, (size_t)D * sizeof *c->x);
                j->xl[p] = k1;
            }
            at[i] += take[i];
        }
    }
    free(at), free(take);
    return rc;
}

/* The next chunk of the transfer under way: 0, -1 timed out, -2 the helper is gone. */
static int kv_next(struct coop *c, unsigned session, struct work **out, char *err)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += c->cfg.timeout_ms / 1000;
    until.tv_nsec += (long)(c->cfg.timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    int rc = 0;
    pthread_mutex_lock(&c->mu);
    while (!c->kv_head) {
        if (c->session != session) {
            rc = -2;
            errmsg_set(err, "the connection failed: %s", c->helper_why);
            break;
        }
        if (pthread_cond_timedwait(&c->cv, &c->mu, &until) == ETIMEDOUT) {
            rc = -1;
            errmsg_set(err, "no chunk within %d ms", c->cfg.timeout_ms);
            break;
        }
    }
    if (!rc) {
        *out = c->kv_head;
        c->kv_head = c->kv_head->next;
        if (!c->kv_head) c->kv_tail = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Stop accepting chunks of the transfer under way; drop what came. */
static void kv_forget(struct coop *c)
{
    pthread_mutex_lock(&c->mu);
    struct work *w = c->kv_head;
    c->kv_head = c->kv_tail = NULL;
    c->kv_want = 0;
    pthread_mutex_unlock(&c->mu);
    for (struct work *n; w; w = n) {
        n = w->next;
        free(w);
    }
}

/* Check one chunk against what we asked (request `req`, sequence `seq` of n positions) and where
 * the transfer is (layer, pos); install its rows. 0 installed (rows), 1 the helper refused this
 * sequence (why in err), -1 a wrong chunk (err). */
static int kv_install(struct coop *c, uint64_t req, unsigned seq, uint32_t n, const int *blocks,
                      const struct work *w, int layer, int pos, int *rows, char *err)
{
    struct wire_coop_kv m;
    const struct kv_cache *kv = &c->e->kv;
    uint8_t dt = kv_wire_dtype(kv);
    uint32_t per = wire_coop_kv_max_rows((uint32_t)kv->kv_dim, dt);
    if (wire_coop_kv_decode(&m, w->msg, w->len, err)) return -1;
    if (m.req != req)
        return errmsg_set(err, "a chunk of request %llu, we asked %llu", (unsigned long long)m.req,
                          (unsigned long long)req);
    if (m.seq != seq)
        return errmsg_set(err, "a chunk for sequence %u, we asked for sequence %u", m.seq, seq);
    if (m.status) return errmsg_set(err, "the helper could not send it: %s", m.error), 1;
    if (m.layer != (uint32_t)layer)
        return errmsg_set(err, "a chunk for layer %u, we expect layer %d", m.layer, layer);
    if (m.pos0 != (uint32_t)pos || m.n > n - (uint32_t)pos || m.n > per)
        return errmsg_set(err, "a chunk of positions [%u, %u) of layer %d, we expect from %d to %u",
                          m.pos0, m.pos0 + m.n, layer, pos, n);
    if (m.kv_dim != (uint32_t)kv->kv_dim || m.dtype != dt)
        return errmsg_set(err, "a chunk of kv_dim %u dtype %u, our cache has %d of dtype %u",
                          m.kv_dim, m.dtype, kv->kv_dim, dt);
    size_t count = (size_t)m.n * m.kv_dim;
    wire_coop_kv_elems(c->kv_k, m.k, count, m.dtype);
    wire_coop_kv_elems(c->kv_v, m.v, count, m.dtype);
    kv_rows_write(&c->e->kv, layer, blocks, pos, (int)m.n, c->kv_k, c->kv_v);
    *rows = (int)m.n;
    return 0;
}

/* Fetch the KV of layers [k0, k1) of every sequence of f from the helper into our blocks: one
 * request naming them all (WIRE_COOP_KV_MAX_SEQS at a time), its chunks installed as they arrive,
 * in the request's order. got[i]: 1 installed, -1 refused by the helper or opened at one that is gone (why at
 * errs + i * ERRMSG_LEN), 0 not (yet). Returns 0 (every sequence answered), -1 a wrong chunk, a
 * timeout, or no helper to ask (err: why; the caller recomputes what did not come, and the
 * scheduler's lost check fails what the helper took with it), -2 the helper went away during the
 * transfer. *bytes: what came. */
static int kv_transfer(struct coop *c, const struct fillset *f, int k0, int k1, int *got,
                       char *errs, size_t *bytes, char *err)
{
    pthread_mutex_lock(&c->mu);
    unsigned session = c->session;
    int open = c->helper_open, hp = atomic_load(&c->helper);
    pthread_mutex_unlock(&c->mu);
    *bytes = 0;
    if (!open) return errmsg_set(err, "the helper is not connected (%s)", c->helper_why);
    /* sequences opened at a helper that is gone (we took another) are not asked for */
    int *ask = malloc((size_t)f->m * sizeof *ask), n_ask = 0;
    if (!ask) return errmsg_set(err, "out of memory for a request of %d sequences", f->m);
    for (int i = 0; i < f->m; i++) {
        if (f->js[i]->opened && f->js[i]->session == session) {
            ask[n_ask++] = i;
            continue;
        }
        got[i] = -1;
        errmsg_set(errs + (size_t)i * ERRMSG_LEN, "sequence %u is not open at helper %s",
                   f->js[i]->id, fabric_node_peer_name(c->cfg.fabric, hp));
    }
    int rc = 0;
    for (int g0 = 0; !rc && g0 < n_ask; g0 += WIRE_COOP_KV_MAX_SEQS) {
        int gm = n_ask - g0 < WIRE_COOP_KV_MAX_SEQS ? n_ask - g0 : WIRE_COOP_KV_MAX_SEQS;
        for (int i = 0; i < gm; i++) {
            c->kq_seq[i] = f->js[ask[g0 + i]]->id;
            c->kq_n[i] = (uint32_t)f->n[ask[g0 + i]];
        }
        struct wire_coop_kv_req q = {.req = ++c->kv_req_id,
                                     .layer0 = (uint32_t)k0,
                                     .layer1 = (uint32_t)k1,
                                     .dtype = kv_wire_dtype(&c->e->kv),
                                     .count = (uint32_t)gm,
                                     .seq = c->kq_seq,
                                     .n = c->kq_n};
        pthread_mutex_lock(&c->mu);
        c->kv_want = q.req;
        pthread_mutex_unlock(&c->mu);
        size_t len = wire_coop_kv_req_encode(c->out, WIRE_MAX_MSG, &q);
        if (!len || fabric_node_send(c->cfg.fabric, hp, c->out, len, err))
            rc = len ? -1 : errmsg_set(err, "the request for %d sequences did not encode", gm);
        for (int i = 0, layer = k0, pos = 0; !rc && i < gm;) {
            struct work *w;
            if ((rc = kv_next(c, session, &w, err))) break;
            int rows = 0, s = ask[g0 + i];
            int r = kv_install(c, q.req, q.seq[i], q.n[i], f->blocks[s], w, layer, pos, &rows,
                               errs + (size_t)s * ERRMSG_LEN);
            if (r < 0) {
                snprintf(err, ERRMSG_LEN, "sequence %u: %s", q.seq[i],
                         errs + (size_t)s * ERRMSG_LEN);
                rc = -1;
            } else if (r > 0) { /* this one refused: the answer goes on with the next */
                got[s] = -1;
                i++, layer = k0, pos = 0;
            } else {
                *bytes += w->len;
                if ((pos += rows) == (int)q.n[i]) layer++, pos = 0;
                if (layer == k1) got[s] = 1, i++, layer = k0;
            }
            free(w);
        }
        kv_forget(c);
    }
    free(ask);
    return rc;
}

/* auto: transfer when bytes / link rate < layer-positions x recompute time, each as this node
 * measured it (the last transfers and recomputes), summed over the rise's sequences (one request,
 * one batched recompute). The first transfer is the link's probe: the split steps' round trips
 * include the helper's compute and say nothing useful about the link (on a 6-of-12-layer split
 * they showed 2.6 MB/s where a KV transfer ran at 129 MB/s), while the local layers' time per row
 * is a fair first estimate of recompute. */
static int want_transfer(struct coop *c, const struct fillset *f, int k0, int k1)
{
    const struct kv_cache *kv = &c->e->kv;
    double bytes = 0;
    long lp = 0, pos = 0;
    for (int i = 0; i < f->m; i++) {
        bytes += 2.0 * (k1 - k0) * f->n[i] * kv->kv_dim * (double)kv->elt;
        lp += recompute_work(f->js[i], f->n[i], k1);
        pos += f->n[i];
    }
    double per = c->lp_s > 0 ? c->lp_s : c->lp_prior_s;
    double est_t = c->link_bps > 0 ? bytes / c->link_bps : -1;
    double est_r = per > 0 ? (double)lp * per : -1;
    int transfer = est_t < 0 || est_r < 0 || est_t < est_r;
    if (c->logged_k0 != k0 || c->logged_k1 != k1) {
        char t[128];
        c->logged_k0 = k0, c->logged_k1 = k1;
        if (est_t < 0)
            snprintf(t, sizeof t, "%.2f MB, no transfer measured yet: this one measures the link",
                     bytes / 1e6);
        else
            snprintf(t, sizeof t, "%.1f ms, %.2f MB at a measured %.1f MB/s", est_t * 1e3,
                     bytes / 1e6, c->link_bps / 1e6);
        char r[128];
        if (est_r < 0) /* k was 0: no layer has run here yet (the embedding may not have) */
            snprintf(r, sizeof r, "%ld layer-positions, no layer has run here yet to time them",
                     lp);
        else
            snprintf(r, sizeof r, "%.1f ms, %ld layer-positions at %.2f us %s", est_r * 1e3, lp,
                     per * 1e6, c->lp_s > 0 ? "measured" : "as the local layers ran");
        log_info("coop",
                 "KV of layers [%d, %d): %s (%d sequences, %ld positions: transfer %s; "
                 "recompute %s)",
                 k0, k1, transfer ? "transfer" : "recompute", f->m, pos, t, r);
    }
    return transfer;
}

static void kv_measured(double *ewma, double v)
{
    *ewma = *ewma > 0 ? 0.5 * *ewma + 0.5 * v : v;
}

static int recompute_timed(struct coop *c, const struct fillset *f, int k0, int k1, double *secs,
                           char *err)
{
    long lp = 0;
    for (int i = 0; i < f->m; i++) lp += recompute_work(f->js[i], f->n[i], k1);
    double t0 = clock_now();
    if (kv_recompute(c, f, k1, err)) return -1;
    *secs = clock_now() - t0;
    if (lp > 0) kv_measured(&c->lp_s, *secs / (double)lp);
    if (c->m)
        atomic_fetch_add_explicit(&c->m->coop_fill_layers, (unsigned long long)(k1 - k0) * f->m,
                                  memory_order_relaxed);
    return 0;
}

/* compare: the transferred rows of [k0, k1) of the sequences of f are kept aside, one batched
 * recompute runs over them, and the two are compared byte for byte. */
static void compare_with_recompute(struct coop *c, const struct fillset *f, int k0, int k1,
                                   double t_x, size_t bytes)
{
    const struct kv_cache *kv = &c->e->kv;
    size_t lay = (size_t)(k1 - k0), total = 0, most = 0;
    long pos = 0;
    for (int i = 0; i < f->m; i++) {
        size_t row = (size_t)f->n[i] * kv->kv_dim * kv->elt;
        total += 2 * lay * row, pos += f->n[i];
        if (row > most) most = row;
    }
    uint8_t *saved = malloc(total ? total : 1), *now = malloc(2 * most + 1);
    char err[ERRMSG_LEN];
    double t_r = 0;
    if (!saved || !now) {
        free(saved), free(now);
        return log_warn("coop", "compare: out of memory for %zu bytes", total);
    }
    for (int i = 0, off = 0; i < f->m; i++) {
        size_t row = (size_t)f->n[i] * kv->kv_dim * kv->elt;
        for (size_t l = 0; l < lay; l++, off += (int)(2 * row))
            kv_rows_read(kv, k0 + (int)l, f->blocks[i], 0, f->n[i], saved + off, saved + off + row);
    }
    if (recompute_timed(c, f, k0, k1, &t_r, err)) {
        free(saved), free(now);
        return log_warn("coop", "compare: %s", err);
    }
    int differ = 0;
    size_t off = 0;
    for (int i = 0; i < f->m; i++) {
        size_t row = (size_t)f->n[i] * kv->kv_dim * kv->elt;
        for (size_t l = 0; l < lay; l++, off += 2 * row) {
            kv_rows_read(kv, k0 + (int)l, f->blocks[i], 0, f->n[i], now, now + row);
            differ += memcmp(now, saved + off, 2 * row) != 0;
        }
    }
    log_info("coop",
             "KV of layers [%d, %d) x %ld positions of %d sequences: transfer %.1f ms (%.2f MB, "
             "%.1f MB/s), recompute %.1f ms: %s",
             k0, k1, pos, f->m, t_x * 1e3, (double)bytes / 1e6,
             t_x > 0 ? (double)bytes / t_x / 1e6 : 0.0, t_r * 1e3,
             differ ? "DIFFERENT bytes" : "identical bytes");
    if (differ)
        log_warn("coop", "compare: %d of %zu layers x sequences differ", differ, lay * f->m);
    free(saved), free(now);
}

/* k rose from k0 to k1: the KV of layers [k0, k1) of the rise's sequences, transferred in one
 * request or recomputed in one batch (--coop-kv); the sequences a transfer did not bring (refused,
 * a wrong chunk) recomputed together. rc[i]: 1 transferred, 0 recomputed, -1 failed (errs). */
static void hook_fill(void *ctx, int n_seqs, const unsigned *seq, const int *const *blocks,
                      const int *n, int k0, int k1, int *rc, char *errs)
{
    struct coop *c = ctx;
    struct jseq **js = malloc((size_t)n_seqs * sizeof *js);
    const int **bl = malloc((size_t)n_seqs * sizeof *bl);
    int *nn = malloc((size_t)n_seqs * sizeof *nn), *idx = malloc((size_t)n_seqs * sizeof *idx);
    int *got = calloc((size_t)n_seqs, sizeof *got);
    if (!js || !bl || !nn || !idx || !got) {
        for (int i = 0; i < n_seqs; i++) {
            rc[i] = -1;
            errmsg_set(errs + (size_t)i * ERRMSG_LEN, "coop: out of memory for %d sequences' KV",
                       n_seqs);
        }
        goto out;
    }
    /* the sequences with saved inputs; f: their view for the transfer and the recompute */
    struct fillset f = {.js = js, .blocks = bl, .n = nn};
    for (int i = 0; i < n_seqs; i++) {
        struct jseq *j = js_find(c, seq[i]);
        rc[i] = 0;
        if (!j) {
            rc[i] = -1;
            errmsg_set(errs + (size_t)i * ERRMSG_LEN,
                       "coop: sequence %u has no saved inputs of layer %d", seq[i], k0);
            continue;
        }
        js[f.m] = j, bl[f.m] = blocks[i], nn[f.m] = n[i], idx[f.m] = i;
        f.m++;
    }
    if (!f.m) goto out;
    int mode = c->cfg.kv_mode, transfer = mode != COOP_KV_RECOMPUTE;
    if (transfer && c->e->be->kv_on_device) {
        if (mode != COOP_KV_AUTO)
            log_warn("coop", "--coop-kv %s: the %s backend keeps its KV on the device; recomputing",
                     mode == COOP_KV_TRANSFER ? "transfer" : "compare", c->e->be->name);
        transfer = 0;
    }
    if (transfer && mode == COOP_KV_AUTO) transfer = want_transfer(c, &f, k0, k1);
    if (transfer && mode == COOP_KV_COMPARE) want_transfer(c, &f, k0, k1); /* auto's estimate */
    const char *helper = fabric_node_peer_name(c->cfg.fabric, js[0]->helper);
    /* per-sequence scratch for the transfer's refusals (in f's order) */
    char *why = transfer ? malloc((size_t)f.m * ERRMSG_LEN) : NULL;
    if (transfer && !why) transfer = 0;
    if (transfer) {
        size_t bytes = 0;
        char whyall[ERRMSG_LEN];
        long pos = 0;
        for (int i = 0; i < f.m; i++) pos += nn[i];
        double t0 = clock_now();
        int r = kv_transfer(c, &f, k0, k1, got, why, &bytes, whyall);
        double secs = clock_now() - t0;
        int moved = 0, refused = 0;
        for (int i = 0; i < f.m; i++) moved += got[i] > 0, refused += got[i] < 0;
        if (moved && secs > 0) kv_measured(&c->link_bps, (double)bytes / secs);
        if (c->m && moved) {
            atomic_fetch_add_explicit(&c->m->coop_kv_layers, (unsigned long long)(k1 - k0) * moved,
                                      memory_order_relaxed);
            atomic_fetch_add_explicit(&c->m->coop_kv_bytes, (unsigned long long)bytes,
                                      memory_order_relaxed);
        }
        log_info("coop",
                 "KV of layers [%d, %d) of %d sequences (%ld positions) in one request: %d "
                 "transferred (%zu bytes in %.1f ms), %d refused%s",
                 k0, k1, f.m, pos, moved, bytes, secs * 1e3, refused,
                 r ? ", the rest not sent" : "");
        /* the helper went away: the upper layers' KV went with it, unless none is left there */
        if (r == -2 && k1 < c->L) {
            for (int i = 0; i < f.m; i++) {
                if (got[i] > 0) {
                    rc[idx[i]] = 1;
                    continue;
                }
                rc[idx[i]] = -1;
                errmsg_set(errs + (size_t)idx[i] * ERRMSG_LEN,
                           "helper %s failed during the KV transfer of layers [%d, %d) of "
                           "sequence %u: %s",
                           helper, k0, k1, js[i]->id, whyall);
            }
            goto out_why;
        }
        /* what came stays (compare recomputes over it); the rest is recomputed below */
        struct fillset moved_set = {.js = js, .blocks = bl, .n = nn};
        int m = 0;
        for (int i = 0; i < f.m; i++) {
            if (got[i] > 0) {
                rc[idx[i]] = 1;
                continue;
            }
            const char *reason = got[i] < 0 ? why + (size_t)i * ERRMSG_LEN : whyall;
            log_warn("coop",
                     "helper %s: KV of layers [%d, %d) of sequence %u refused: %s; recomputing it",
                     helper, k0, k1, js[i]->id, reason);
            /* compact the ones to recompute to the front (idx along) */
            struct jseq *tj = js[m];
            const int *tb = bl[m];
            int tn = nn[m], ti = idx[m], tg = got[m];
            js[m] = js[i], bl[m] = bl[i], nn[m] = nn[i], idx[m] = idx[i], got[m] = got[i];
            js[i] = tj, bl[i] = tb, nn[i] = tn, idx[i] = ti, got[i] = tg;
            m++;
        }
        if (mode == COOP_KV_COMPARE && moved) {
            moved_set.js = js + m, moved_set.blocks = bl + m, moved_set.n = nn + m;
            moved_set.m = f.m - m;
            compare_with_recompute(c, &moved_set, k0, k1, secs, bytes);
        }
        f.m = m; /* the rest */
    }
    if (f.m) {
        double secs;
        char err[ERRMSG_LEN];
        if (recompute_timed(c, &f, k0, k1, &secs, err))
            for (int i = 0; i < f.m; i++) {
                rc[idx[i]] = -1;
                snprintf(errs + (size_t)idx[i] * ERRMSG_LEN, ERRMSG_LEN, "%s", err);
            }
    }
out_why:
    free(why);
out:
    free(js), free(bl), free(nn), free(idx), free(got);
}

static const char *hook_lost(void *ctx, unsigned seq)
{
    struct coop *c = ctx;
    struct jseq *j = js_find(c, seq);
    if (!j || !j->opened) return NULL;
    static _Thread_local char why[ERRMSG_LEN];
    pthread_mutex_lock(&c->mu);
    int lost = j->session != c->session;
    if (lost)
        snprintf(why, sizeof why, "helper %s failed: %s; the KV of layers [%d, %d) went with it",
                 fabric_node_peer_name(c->cfg.fabric, j->helper), c->helper_why,
                 atomic_load(&c->k_now), c->L);
    pthread_mutex_unlock(&c->mu);
    return lost ? why : NULL;
}

static void hook_all_local(void *ctx)
{
    struct coop *c = ctx;
    uint32_t *ids = malloc((size_t)(c->n_js ? c->n_js : 1) * sizeof *ids);
    uint32_t n = 0;
    pthread_mutex_lock(&c->mu);
    unsigned session = c->session;
    int open = c->helper_open, hp = atomic_load(&c->helper);
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < c->n_js; i++)
        if (ids && c->js[i].opened && c->js[i].session == session) ids[n++] = c->js[i].id;
    if (open && n && send_close(c, hp, ids, n))
        log_warn("coop", "could not tell the helper to drop %u sequences", n);
    else if (n)
        log_info("coop", "all layers local: the helper drops %u sequences", n);
    log_info("coop",
             "while partial: %llu steps sent (%llu with another in flight), %.3f s in our layers, "
             "%.3f s waiting for the helper's answers",
             c->n_sent, c->n_piped, c->t_local, c->t_wait);
    free(ids);
    while (c->n_js) js_drop(c, &c->js[c->n_js - 1]);
}

static void hook_seq_end(void *ctx, unsigned seq)
{
    struct coop *c = ctx;
    struct jseq *j = js_find(c, seq);
    if (!j) return;
    pthread_mutex_lock(&c->mu);
    int live = c->helper_open && j->opened && j->session == c->session;
    int hp = atomic_load(&c->helper);
    pthread_mutex_unlock(&c->mu);
    uint32_t id = seq;
    if (live) send_close(c, hp, &id, 1);
    js_drop(c, j);
}

/* ---------------------------------------------------------------- helper (compute thread) */

static struct hseq *hs_find(struct coop *c, int peer, unsigned id)
{
    for (int i = 0; i < c->n_hs; i++)
        if (c->hs[i].peer == peer && c->hs[i].id == id) return &c->hs[i];
    return NULL;
}

static void hs_drop(struct coop *c, struct hseq *h)
{
    hseq_free(c, h);
    *h = c->hs[--c->n_hs];
    if (c->m) atomic_store(&c->m->coop_remote_seqs, c->n_hs);
}

static void reply_error(struct coop *c, int peer, uint64_t step, const char *msg)
{
    struct wire_coop_tokens t = {.step = step, .status = 1};
    snprintf(t.error, sizeof t.error, "%s", msg);
    size_t len = wire_coop_tokens_encode(c->out, WIRE_MAX_MSG, &t);
    char err[ERRMSG_LEN];
    log_warn("coop", "peer %d: step %llu failed: %s", peer, (unsigned long long)step, msg);
    if (len) fabric_node_send(c->cfg.fabric, peer, c->out, len, err);
}

static void do_open(struct coop *c, const struct work *w)
{
    struct wire_coop_open o;
    char err[ERRMSG_LEN];
    if (wire_coop_open_decode(&o, w->msg, w->len, err)) return; /* checked on the fabric thread */
    if (c->n_hs == c->cap_hs) {
        int cap = c->cap_hs ? 2 * c->cap_hs : 16;
        struct hseq *n = realloc(c->hs, (size_t)cap * sizeof *n);
        if (!n) return log_error("coop", "out of memory opening sequence %u", o.seq);
        c->hs = n;
        c->cap_hs = cap;
    }
    struct hseq *h = &c->hs[c->n_hs];
    *h = (struct hseq){.peer = w->peer, .id = o.seq};
    struct sampler_params sp = {
        .temperature = o.temperature, .top_p = o.top_p, .top_k = (int)o.top_k, .min_p = o.min_p};
    h->blocks = malloc((size_t)kv_blocks_for(&c->e->kv, c->ctx) * sizeof *h->blocks);
    if (!h->blocks || sampler_init(&h->smp, &sp, c->vocab, err)) {
        free(h->blocks);
        log_error("coop", "peer %d: sequence %u: %s", w->peer, o.seq,
                  h->blocks ? err : "out of memory");
        return;
    }
    h->smp.rng = o.rng;
    c->n_hs++;
    if (c->m) atomic_store(&c->m->coop_remote_seqs, c->n_hs);
}

/* Rows of another node's step: every row's sequence open here, KV blocks for its position. 0, or
 * -1 (err: why; the step is answered with it). */
static int remote_rows_ready(struct coop *c, int peer, uint32_t layer, const uint32_t *seq,
                             const uint32_t *pos, uint32_t n, char *err)
{
    for (uint32_t i = 0; i < n; i++) {
        struct hseq *h = hs_find(c, peer, seq[i]);
        if (!h) return errmsg_set(err, "sequence %u is not open here", seq[i]);
        if ((int)pos[i] + 1 > h->n_pos) h->n_pos = (int)pos[i] + 1;
        if ((int)layer > h->max_layer) h->max_layer = (int)layer;
        int need = kv_blocks_for(&c->e->kv, (int)pos[i] + 1);
        while (h->n_blocks < need) {
            int blk = kv_block_alloc(&c->e->kv);
            if (blk < 0) return errmsg_set(err, "helper out of KV blocks for sequence %u", h->id);
            h->blocks[h->n_blocks++] = blk;
        }
    }
    return 0;
}

/* A remote row's token from its logits (lg, clobbered): end-of-sequence masked where the joiner
 * asks, drawn with the sequence's sampler, whose generator state goes back with it. */
static struct wire_coop_token remote_token(struct coop *c, struct hseq *h, uint8_t flags, float *lg)
{
    int eos = c->cfg.eos_id, eos2 = c->cfg.bos_id;
    if (flags & WIRE_ROW_MASK_EOS) {
        if (eos >= 0 && eos < c->vocab) lg[eos] = -INFINITY;
        if (eos2 >= 0 && eos2 < c->vocab) lg[eos2] = -INFINITY;
        for (int i = 0; i < c->cfg.n_eog; i++)
            if (c->cfg.eog_ids[i] >= 0 && c->cfg.eog_ids[i] < c->vocab)
                lg[c->cfg.eog_ids[i]] = -INFINITY;
    }
    int t = sampler_sample(&h->smp, lg);
    return (struct wire_coop_token){h->id, (uint32_t)t, h->smp.rng};
}

/* Answer `peer`'s step with the first n_tok tokens of c->toks; count the step's rows served. */
static void reply_tokens(struct coop *c, int peer, uint64_t step, uint32_t n_tok, uint32_t rows)
{
    char err[ERRMSG_LEN];
    struct wire_coop_tokens t = {.step = step, .n = n_tok, .tok = c->toks};
    size_t len = wire_coop_tokens_encode(c->out, WIRE_MAX_MSG, &t);
    if (!len || fabric_node_send(c->cfg.fabric, peer, c->out, len, err))
        log_warn("coop", "peer %d: step %llu: the reply was not sent", peer,
                 (unsigned long long)step);
    if (c->m) {
        atomic_fetch_add_explicit(&c->m->coop_served_steps, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&c->m->coop_served_rows, rows, memory_order_relaxed);
    }
}

/* Another node's step on its own: layers [layer, L) and the head, in chunks the engine takes. */
static void do_activations(struct coop *c, const struct work *w)
{
    struct wire_activations a;
    char err[ERRMSG_LEN];
    if (wire_activations_decode(&a, w->msg, w->len, c->a_seq, c->a_pos, c->a_tok, c->a_flags, c->hx,
                                c->hx_rows, (size_t)c->hx_rows * c->dim, err))
        return reply_error(c, w->peer, 0, err);
    if (remote_rows_ready(c, w->peer, a.layer, c->a_seq, c->a_pos, a.n, err))
        return reply_error(c, w->peer, a.step, err);
    int T = c->e->lim.max_tokens, S = c->e->lim.max_seqs;
    uint32_t n_tok = 0;
    for (uint32_t r0 = 0; r0 < a.n;) {
        int m = 0, nl = 0;
        while (r0 + (uint32_t)m < a.n && m < T) {
            uint32_t i = r0 + (uint32_t)m;
            if ((c->a_flags[i] & WIRE_ROW_LOGITS) && nl == S) break;
            struct hseq *h = hs_find(c, w->peer, c->a_seq[i]);
            c->b_pos[m] = (int)c->a_pos[i];
            c->b_tok[m] = (int)c->a_tok[i];
            c->b_blocks[m] = h->blocks;
            if (c->a_flags[i] & WIRE_ROW_LOGITS) c->b_rows[nl++] = m;
            m++;
        }
        struct batch b = {.n = m,
                          .token = c->b_tok,
                          .pos = c->b_pos,
                          .blocks = c->b_blocks,
                          .n_logits = nl,
                          .logit_rows = c->b_rows};
        float *x = c->hx + (size_t)r0 * c->dim;
        if (a.dtype == WIRE_TOKENS && engine_embed(c->e, &b, x)) {
            snprintf(err, sizeof err, "helper: the embedding failed: %.300s", engine_error(c->e));
            return reply_error(c, w->peer, a.step, err);
        }
        if (engine_layers(c->e, &b, (int)a.layer, c->L, x) || engine_head(c->e, &b, x, c->logits)) {
            snprintf(err, sizeof err, "helper: layers [%u, %d) failed: %.300s", a.layer, c->L,
                     engine_error(c->e));
            return reply_error(c, w->peer, a.step, err);
        }
        for (int l = 0; l < nl; l++) {
            uint32_t i = r0 + (uint32_t)b.logit_rows[l];
            struct hseq *h = hs_find(c, w->peer, c->a_seq[i]);
            c->toks[n_tok++] = remote_token(c, h, c->a_flags[i], c->logits + (size_t)l * c->vocab);
        }
        r0 += (uint32_t)m;
    }
    reply_tokens(c, w->peer, a.step, n_tok, a.n);
}

/* A KV answer under way (helper, compute thread): request q of `peer`, at sequence q.seq[i],
 * layer, pos. Sent in between-step windows of at most KV_WINDOW_BYTES (kv_pump). */
struct kvjob {
    struct kvjob *next;
    int peer;
    struct wire_coop_kv_req q;
    uint32_t i, layer, pos;
    int chunks, windows;
    unsigned long long sent;
    double t0;
};

static void kv_reply_error(struct coop *c, int peer, const struct wire_coop_kv_req *q, uint32_t i,
                           const char *why)
{
    struct wire_coop_kv m = {.req = q->req,
                             .seq = q->seq[i],
                             .status = 1,
                             .layer = q->layer0,
                             .kv_dim = (uint32_t)c->e->kv.kv_dim,
                             .dtype = q->dtype};
    snprintf(m.error, sizeof m.error, "%.*s", WIRE_COOP_ERR_LEN, why);
    size_t len = wire_coop_kv_encode(c->out, WIRE_MAX_MSG, &m);
    char err[ERRMSG_LEN];
    log_warn("coop", "peer %d: KV of layers [%u, %u) of sequence %u not sent: %s", peer, q->layer0,
             q->layer1, q->seq[i], why);
    if (len) fabric_node_send(c->cfg.fabric, peer, c->out, len, err);
}

static void kvjob_free(struct coop *c, struct kvjob *j)
{
    if (c->m) atomic_fetch_add_explicit(&c->m->coop_kv_served_bytes, j->sent, memory_order_relaxed);
    free(j->q.seq), free(j->q.n), free(j);
}

/* A joiner raised its k: the KV rows of layers [layer0, layer1) of the request's sequences, read
 * from our blocks and sent by kv_pump. A newer request of the same peer replaces an older one
 * still under way (the joiner gave that one up). */
static void do_kv_req(struct coop *c, const struct work *w)
{
    struct kvjob *j = calloc(1, sizeof *j);
    uint32_t *seq = malloc(WIRE_COOP_KV_MAX_SEQS * sizeof *seq);
    uint32_t *n = malloc(WIRE_COOP_KV_MAX_SEQS * sizeof *n);
    char err[ERRMSG_LEN];
    if (!j || !seq || !n ||
        wire_coop_kv_req_decode(&j->q, w->msg, w->len, seq, n, WIRE_COOP_KV_MAX_SEQS, err)) {
        if (!j || !seq || !n) log_error("coop", "peer %d: out of memory for a KV request", w->peer);
        free(j), free(seq), free(n); /* a bad one was refused on the fabric thread */
        return;
    }
    j->peer = w->peer;
    j->layer = j->q.layer0;
    j->t0 = clock_now();
    struct kvjob **link = &c->kv_jobs;
    while (*link) {
        if ((*link)->peer == w->peer) {
            struct kvjob *old = *link;
            *link = old->next;
            log_warn("coop", "peer %d: KV request %llu replaces %llu, not finished", w->peer,
                     (unsigned long long)j->q.req, (unsigned long long)old->q.req);
            kvjob_free(c, old);
            continue;
        }
        link = &(*link)->next;
    }
    *link = j;
}

/* Why sequence i of job j cannot be sent (NULL: it can). */
static const char *kv_refusal(struct coop *c, const struct kvjob *j, const struct hseq *h,
                              char *err)
{
    const struct kv_cache *kv = &c->e->kv;
    uint8_t dt = kv->type == KV_F32 ? WIRE_F32 : WIRE_F16;
    const struct wire_coop_kv_req *q = &j->q;
    if (!h) return "the sequence is not open here";
    if (c->cfg.test_kv_fault == KV_FAULT_REFUSE && j->i == 1 && q->count > 1)
        return "test: the second sequence of a request is refused";
    if (c->e->be->kv_on_device) {
        snprintf(err, ERRMSG_LEN, "the helper's %s backend keeps its KV on the device",
                 c->e->be->name);
        return err;
    }
    if (q->dtype != dt) {
        snprintf(err, ERRMSG_LEN, "the helper's KV cache is %s, the request wants %s",
                 kv_type_name(kv->type), q->dtype == WIRE_F32 ? "f32" : "f16");
        return err;
    }
    if (q->n[j->i] > (uint32_t)h->n_pos || q->layer0 < (uint32_t)h->max_layer) {
        snprintf(err, ERRMSG_LEN,
                 "layers [%u, %u) of positions [0, %u) asked, layers [%d, %d) of positions [0, %d) "
                 "are here",
                 q->layer0, q->layer1, q->n[j->i], h->max_layer, c->L, h->n_pos);
        return err;
    }
    return NULL;
}

/* One between-step window of job j: chunks of at most WIRE_MAX_MSG bytes, sequence by sequence,
 * layer by layer, until the job ends or *budget bytes are spent. 1 when the job is done (or its
 * peer is gone), 0 when it goes on in the next window. */
static int kv_window(struct coop *c, struct kvjob *j, size_t *budget)
{
    const struct kv_cache *kv = &c->e->kv;
    uint8_t dt = kv->type == KV_F32 ? WIRE_F32 : WIRE_F16;
    uint32_t per = wire_coop_kv_max_rows((uint32_t)kv->kv_dim, dt);
    const struct wire_coop_kv_req *q = &j->q;
    char err[ERRMSG_LEN];
    j->windows++;
    while (j->i < q->count) {
        if (*budget == 0) return 0;
        struct hseq *h = hs_find(c, j->peer, q->seq[j->i]);
        if (j->layer == q->layer0 && j->pos == 0) {
            const char *why = kv_refusal(c, j, h, err);
            if (why) {
                kv_reply_error(c, j->peer, q, j->i, why);
                j->i++;
                continue;
            }
        } else if (!h) { /* closed while we sent it: the joiner gave the transfer up */
            return 1;
        }
        uint32_t total = q->n[j->i], n = total - j->pos < per ? total - j->pos : per;
        kv_rows_read(kv, (int)j->layer, h->blocks, (int)j->pos, (int)n, c->kv_k, c->kv_v);
        struct wire_coop_kv m = {.req = q->req,
                                 .seq = q->seq[j->i],
                                 .layer = j->layer,
                                 .pos0 = j->pos,
                                 .n = n,
                                 .kv_dim = (uint32_t)kv->kv_dim,
                                 .dtype = dt,
                                 .k_src = c->kv_k,
                                 .v_src = c->kv_v};
        int fault = j->chunks++ == 0 ? c->cfg.test_kv_fault : KV_FAULT_NONE;
        if (fault == KV_FAULT_SEQ) m.seq++;
        if (fault == KV_FAULT_LAYER) m.layer++;
        size_t len = wire_coop_kv_encode(c->out, WIRE_MAX_MSG, &m);
        if (fault == KV_FAULT_SHORT && len) len -= 3;
        if (!len || fabric_node_send(c->cfg.fabric, j->peer, c->out, len, err)) {
            log_warn("coop", "peer %d: KV of sequence %u: a chunk was not sent: %s", j->peer, m.seq,
                     len ? err : "encoding failed");
            return 1;
        }
        j->sent += len;
        *budget = len < *budget ? *budget - len : 0;
        if (fault == KV_FAULT_DIE) {
            log_warn("coop", "test: exiting during the KV transfer of sequence %u", m.seq);
            usleep(300000); /* the first chunk leaves */
            _exit(70);
        }
        if ((j->pos += n) == total) {
            j->pos = 0;
            if (++j->layer == q->layer1) j->layer = q->layer0, j->i++;
        }
    }
    return 1;
}

/* Between two of our steps: the KV answers under way, at most kv_window (KV_WINDOW_BYTES) bytes
 * in all, so that a transfer delays our next step by at most that much reading and sending; a
 * window always sends at least one chunk (at most WIRE_MAX_MSG).
 * 1 if any work was done (the scheduler comes back without sleeping while a job is left). */
static int kv_pump(struct coop *c)
{
    size_t budget = c->cfg.kv_window ? c->cfg.kv_window : KV_WINDOW_BYTES;
    int did = c->kv_jobs != NULL;
    for (struct kvjob **link = &c->kv_jobs; *link && budget;) {
        struct kvjob *j = *link;
        if (!kv_window(c, j, &budget)) break; /* the budget is spent: the rest next window */
        *link = j->next;
        log_info("coop",
                 "peer %d: KV of layers [%u, %u) of %u sequences sent: %llu bytes in %d chunks, %d "
                 "between-step windows, %.1f ms",
                 j->peer, j->q.layer0, j->q.layer1, j->q.count, j->sent, j->chunks, j->windows,
                 (clock_now() - j->t0) * 1e3);
        kvjob_free(c, j);
    }
    return did;
}

/* A peer left: its answers under way are dropped. */
static void kv_jobs_drop(struct coop *c, int peer)
{
    for (struct kvjob **link = &c->kv_jobs; *link;) {
        struct kvjob *j = *link;
        if (peer >= 0 && j->peer != peer) {
            link = &j->next;
            continue;
        }
        *link = j->next;
        kvjob_free(c, j);
    }
}

static void do_close(struct coop *c, const struct work *w)
{
    uint32_t n;
    char err[ERRMSG_LEN];
    if (wire_coop_close_decode(w->msg, w->len, c->a_seq, WIRE_MAX_ACT_TOKENS, &n, err)) return;
    for (uint32_t i = 0; i < n; i++) {
        struct hseq *h = hs_find(c, w->peer, c->a_seq[i]);
        if (h) hs_drop(c, h);
    }
}

static void run_work(struct coop *c, const struct work *w)
{
    switch (w->kind) {
    case W_OPEN:
        do_open(c, w);
        break;
    case W_ACT:
        do_activations(c, w);
        break;
    case W_CLOSE:
        do_close(c, w);
        break;
    case W_KV_REQ:
        do_kv_req(c, w);
        break;
    case W_GONE: {
        int dropped = 0;
        for (int i = c->n_hs - 1; i >= 0; i--)
            if (c->hs[i].peer == w->peer) hs_drop(c, &c->hs[i]), dropped++;
        kv_jobs_drop(c, w->peer);
        if (dropped) log_info("coop", "peer %d left: its %d sequences' KV freed", w->peer, dropped);
        break;
    }
    }
}

/* What the fabric thread queued, appended to the held list (compute thread). */
static void take_queue(struct coop *c)
{
    pthread_mutex_lock(&c->wmu);
    struct work *w = c->w_head, *tail = c->w_tail;
    c->w_head = c->w_tail = NULL;
    pthread_mutex_unlock(&c->wmu);
    if (!w) return;
    if (c->held_tail)
        c->held_tail->next = w;
    else
        c->held_head = w;
    c->held_tail = tail;
}

/* The queue's work, in order per peer. With hold, a peer's activations wait for our next step
 * (hook_forward), and so does all that came after them from that peer. */
static int hook_serve(void *ctx, int hold)
{
    struct coop *c = ctx;
    struct work *w;
    take_queue(c);
    unsigned char blocked[FABRIC_MAX_NODE_PEERS] = {0};
    int did = 0;
    struct work **link = &c->held_head, *kept = NULL;
    while ((w = *link)) {
        if (blocked[w->peer] || (hold && w->kind == W_ACT)) {
            blocked[w->peer] = 1;
            kept = w;
            link = &w->next;
            continue;
        }
        *link = w->next;
        run_work(c, w);
        free(w);
        did = 1;
    }
    c->held_tail = kept;
    return kv_pump(c) | did;
}

/* A fused step under way (hook_forward). Rows [0, n) of the batch are in it, all at the layer the
 * pass has reached; our own come first; each remote step's rows [r0, r0 + n) follow, its logit
 * rows [l0, l0 + nl) of the head's. Remote steps taken but not joined yet wait in `pending`, by
 * first layer. */
struct fused {
    const struct batch *own;
    int n, nl, rows, wants; /* rows and logit rows joined; rows and logit rows taken */
    struct fused_step {
        struct work *w;
        uint64_t step;
        int r0, n, l0, nl;
    } grp[FABRIC_MAX_NODE_PEERS];
    int n_grp;
    struct work *pending[FABRIC_MAX_NODE_PEERS];
    int n_pending;
    unsigned char taken[FABRIC_MAX_NODE_PEERS]; /* peers with a step in this one */
};

/* Take the activations that can join the step: each peer's first held message, when it is
 * activations and fits beside what the step holds (rows up to max_tokens, logit rows up to
 * max_seqs), in the order they came. At the start (`start`), one that could never fit beside our
 * own rows runs apart at once; later, one that does not fit waits for our next step. */
static void fused_take(struct coop *c, struct fused *f, int start)
{
    int T = c->e->lim.max_tokens, S = c->e->lim.max_seqs;
    struct work *w;
    take_queue(c);
    unsigned char seen[FABRIC_MAX_NODE_PEERS] = {0};
    struct work **link = &c->held_head, *kept = NULL;
    while ((w = *link)) {
        int first = !seen[w->peer];
        seen[w->peer] = 1;
        if (first && w->kind == W_ACT && !f->taken[w->peer]) {
            int fits = f->rows + (int)w->rows <= T && f->wants + (int)w->wants <= S;
            int never = f->own->n + (int)w->rows > T || f->own->n_logits + (int)w->wants > S;
            if (fits || (start && never)) {
                *link = w->next;
                w->next = NULL;
                if (!fits) {
                    do_activations(c, w);
                    free(w);
                    continue;
                }
                f->taken[w->peer] = 1;
                f->rows += (int)w->rows, f->wants += (int)w->wants;
                int at = f->n_pending++; /* by first layer, after equal ones */
                for (; at > 0 && f->pending[at - 1]->layer > w->layer; at--)
                    f->pending[at] = f->pending[at - 1];
                f->pending[at] = w;
                continue;
            }
        }
        kept = w;
        link = &w->next;
    }
    c->held_tail = kept;
}

/* Join remote step w at layer l: its rows go at the end of the batch; token rows are embedded, and
 * rows that start below l (they came late) run their layers up to l alone first. 0, or -1 when it
 * was answered with an error instead (it is freed then). */
static int fused_join(struct coop *c, struct fused *f, struct work *w, int l)
{
    int T = c->e->lim.max_tokens, n = f->n;
    struct wire_activations a;
    char why[ERRMSG_LEN];
    float *x = c->fx + (size_t)n * c->dim;
    if (wire_activations_decode(&a, w->msg, w->len, c->a_seq, c->a_pos, c->a_tok, c->a_flags, x,
                                c->hx_rows, (size_t)(T - n) * c->dim, why)) {
        reply_error(c, w->peer, w->step, why);
        free(w);
        return -1;
    }
    if (remote_rows_ready(c, w->peer, a.layer, c->a_seq, c->a_pos, a.n, why)) {
        reply_error(c, w->peer, a.step, why);
        free(w);
        return -1;
    }
    struct fused_step *g = &f->grp[f->n_grp];
    *g = (struct fused_step){.w = w, .step = a.step, .r0 = n, .n = (int)a.n, .l0 = f->nl};
    for (uint32_t i = 0; i < a.n; i++) {
        struct hseq *h = hs_find(c, w->peer, c->a_seq[i]);
        c->f_tok[n + i] = (int)c->a_tok[i];
        c->f_pos[n + i] = (int)c->a_pos[i];
        c->f_blocks[n + i] = h->blocks;
        c->f_hs[n + i] = h;
        c->f_flags[n + i] = c->a_flags[i];
        if (c->a_flags[i] & WIRE_ROW_LOGITS) c->f_rows[f->nl++] = n + (int)i;
    }
    g->nl = f->nl - g->l0;
    /* token rows (a joiner without its embedding) are embedded here; a late step's layers below
     * l run for its rows alone */
    struct batch late = {
        .n = (int)a.n, .token = c->f_tok + n, .pos = c->f_pos + n, .blocks = c->f_blocks + n};
    int bad = a.dtype == WIRE_TOKENS && engine_embed(c->e, &late, x);
    if (!bad && (int)a.layer < l) {
        if (c->m)
            atomic_fetch_add_explicit(&c->m->coop_fused_late_layers,
                                      (unsigned long long)(l - (int)a.layer), memory_order_relaxed);
        bad = engine_layers(c->e, &late, (int)a.layer, l, x);
    }
    if (bad) {
        snprintf(why, sizeof why, "helper: %s failed: %.300s",
                 a.dtype == WIRE_TOKENS ? "the embedding or the layers below" : "layers below",
                 engine_error(c->e));
        reply_error(c, w->peer, a.step, why);
        f->nl = g->l0;
        free(w);
        return -1;
    }
    f->n += (int)a.n;
    f->n_grp++;
    return 0;
}

/* Our own step b with other nodes' steps fused in. Our rows run the embedding and the layers one
 * at a time; before each layer, the remote steps that wait join: those held when the step began
 * at their first layer (layers [0, k_min) run our rows alone, then the rows of the joiners whose k
 * is reached come in, lowest k first), those that arrive during the step at once, their layers
 * below the current one run alone first (a joiner that sends its step while we run its layers
 * still gets its tokens from this step, not the next). The head runs once for all rows; our logits
 * go to `logits` for the scheduler to sample, each remote row's token is drawn here and answered
 * per step. Every row computes exactly what it would alone (the backend is batch_invariant), and
 * the weights of each layer are read once for all the rows that run it. */
static int hook_forward(void *ctx, const struct batch *b, float *logits, char *err)
{
    struct coop *c = ctx;
    take_queue(c);
    if (!c->n_hs && !c->held_head) return 1; /* no remote sequence: a plain step */
    struct fused f = {.own = b, .n = b->n, .nl = b->n_logits, .rows = b->n, .wants = b->n_logits};
    fused_take(c, &f, 1);
    for (int i = 0; i < b->n; i++) {
        c->f_tok[i] = b->token[i];
        c->f_pos[i] = b->pos[i];
        c->f_blocks[i] = b->blocks[i];
    }
    memcpy(c->f_rows, b->logit_rows, (size_t)b->n_logits * sizeof *c->f_rows);
    int rc = engine_embed(c->e, b, c->fx);
    for (int l = 0; !rc && l < c->L; l++) {
        if (l) fused_take(c, &f, 0);
        int keep = 0;
        for (int i = 0; i < f.n_pending; i++) {
            struct work *w = f.pending[i];
            if ((int)w->layer > l) {
                f.pending[keep++] = w;
            } else if (fused_join(c, &f, w, l)) {
                f.taken[w->peer] = 0;
            }
        }
        f.n_pending = keep;
        struct batch now = {.n = f.n, .token = c->f_tok, .pos = c->f_pos, .blocks = c->f_blocks};
        rc = engine_layers(c->e, &now, l, l + 1, c->fx);
    }
    struct batch fb = {.n = f.n,
                       .token = c->f_tok,
                       .pos = c->f_pos,
                       .blocks = c->f_blocks,
                       .n_logits = f.nl,
                       .logit_rows = c->f_rows};
    if (!rc) rc = engine_head(c->e, &fb, c->fx, c->flogits);
    if (rc)
        errmsg_set(err, "%s", engine_error(c->e));
    else
        memcpy(logits, c->flogits, (size_t)b->n_logits * c->vocab * sizeof *logits);
    for (int i = 0; i < f.n_pending; i++) { /* only when the step failed */
        reply_error(c, f.pending[i]->peer, f.pending[i]->step, "helper: the fused step failed");
        free(f.pending[i]);
    }
    for (int g = 0; g < f.n_grp; g++) {
        struct fused_step *s = &f.grp[g];
        if (rc) {
            char why[ERRMSG_LEN];
            snprintf(why, sizeof why, "helper: the fused step failed: %.300s", err);
            reply_error(c, s->w->peer, s->step, why);
        } else {
            for (int l = 0; l < s->nl; l++) {
                int at = s->l0 + l, row = c->f_rows[at];
                c->toks[l] = remote_token(c, c->f_hs[row], c->f_flags[row],
                                          c->flogits + (size_t)at * c->vocab);
            }
            reply_tokens(c, s->w->peer, s->step, (uint32_t)s->nl, (uint32_t)s->n);
            if (c->m) {
                atomic_fetch_add_explicit(&c->m->coop_fused_steps, 1, memory_order_relaxed);
                atomic_fetch_add_explicit(&c->m->coop_fused_rows, (unsigned long long)s->n,
                                          memory_order_relaxed);
            }
        }
        free(s->w);
    }
    return rc ? -1 : 0;
}

struct sched_coop coop_sched_hooks(struct coop *c)
{
    struct sched_coop h = {.ctx = c, .n_layers = c->L};
    if (c->cfg.resident < c->L || c->n_sched) {
        h.resident = hook_resident;
        h.ready = hook_ready;
        h.fill = hook_fill;
        h.step = hook_step;
        if (c->cfg.pipeline) h.send = hook_send, h.recv = hook_recv;
        h.all_local = hook_all_local;
        h.seq_end = hook_seq_end;
        h.lost = hook_lost;
    }
    if (c->cfg.serve_remote) h.serve = hook_serve;
    if (c->cfg.serve_remote && c->cfg.fuse) h.forward = hook_forward;
    return h;
}
