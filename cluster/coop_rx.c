/* coop_rx: the fabric thread's side of cooperative execution: every coop message is decoded and
 * checked here (shape, layer, positions, that a sequence was opened, that steps only move
 * forward), then queued for the compute thread, never run here: a helper's work goes to the work
 * queue (wmu), a joiner's replies and KV chunks to their queues (mu). Also who the joiner's helper
 * is as peers come and go. Never blocks. */
#include "cluster/coop_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    if (wire_coop_close_decode(msg, len, c->check.seq, WIRE_MAX_ACT_TOKENS, &n, err)) {
        log_warn("coop", "peer %d (%s): %s", peer, fabric_node_peer_name(fn, peer), err);
        return -1;
    }
    for (uint32_t i = 0; i < n; i++) {
        int at = ps_find(p, c->check.seq[i]);
        if (at < 0) {
            log_warn("coop", "peer %d (%s): close of sequence %u, which it never opened", peer,
                     fabric_node_peer_name(fn, peer), c->check.seq[i]);
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
    uint32_t *seq = c->check.seq, *pos = c->check.pos, *tok = c->check.tok;
    uint8_t *flags = c->check.flags;
    float *x = c->check.x;
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
    if (atomic_load(&c->k_now) < c->L) {
        /* our own steps run on a helper right now (a hand-over): the compute thread may be
         * waiting on it, which may be waiting on this answer: refuse at once */
        uint8_t buf[WIRE_COOP_ERR_LEN + 64];
        struct wire_coop_tokens t = {.step = a.step, .status = 1};
        snprintf(t.error, sizeof t.error,
                 "this node runs %d of %d layers itself right now (its own sequences are "
                 "handed over): not a helper",
                 atomic_load(&c->k_now), c->L);
        size_t n = wire_coop_tokens_encode(buf, sizeof buf, &t);
        if (n) fabric_node_send(fn, peer, buf, n, err);
        return 0;
    }
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
    if (wire_coop_kv_req_decode(&q, msg, len, c->check.kv_seq, c->check.kv_n, WIRE_COOP_KV_MAX_SEQS,
                                err)) {
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

/* 1 when peer may be our helper: the configured one or an alternative (mu held). */
static int helper_candidate(const struct coop *c, int peer)
{
    if (peer == atomic_load(&((struct coop *)c)->ho_peer)) return 1; /* a hand-over's receiver */
    if (c->cfg.helper_peer < 0) return 0;
    if (peer == c->cfg.helper_peer) return 1;
    for (int i = 0; i < c->n_alt; i++)
        if (c->alt[i] == peer) return 1;
    return 0;
}

void coop_add_helper(struct coop *c, int peer)
{
    pthread_mutex_lock(&c->mu);
    if (c->cfg.helper_peer >= 0 && !helper_candidate(c, peer) && c->n_alt < COOP_MAX_ALT)
        c->alt[c->n_alt++] = peer;
    pthread_mutex_unlock(&c->mu);
}

static void on_peer(void *ctx, struct fabric_node *fn, int peer, int state, const char *why)
{
    struct coop *c = ctx;
    pthread_mutex_lock(&c->mu);
    int candidate = helper_candidate(c, peer);
    pthread_mutex_unlock(&c->mu);
    if (candidate) {
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
            for (int i = 0; i < c->n_alt && took < 0; i++)
                if (c->alt[i] != peer && fabric_node_peer_open(fn, c->alt[i])) took = c->alt[i];
        } else if (state == TP_OPEN && !c->helper_open && c->n_alt) {
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
    if (c->cfg.resident < c->L || c->n_sched || c->cfg.handover) {
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
