/* coop_joiner: the joiner's steps (compute thread): the embedding and layers [0, k) here, the
 * hidden states (or token ids, before the embedding) sent to the helper, its tokens awaited; one
 * step at a time (coop_joiner_step) or up to COOP_MAX_FLIGHTS in flight (coop_joiner_send/recv).
 * Each row's input is saved for a later KV recompute (coop_kvfill.c). Also k's rises as the
 * scheduler picks them up, and a sequence's end at the helper. */
#include "cluster/coop_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct jseq *coop_joiner_find(struct coop *c, unsigned id)
{
    for (int i = 0; i < c->n_js; i++)
        if (c->js[i].id == id) return &c->js[i];
    return NULL;
}

struct jseq *coop_joiner_js_get(struct coop *c, unsigned id, char *err)
{
    struct jseq *j = coop_joiner_find(c, id);
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

void coop_joiner_js_drop(struct coop *c, struct jseq *j)
{
    free(j->x), free(j->xl), free(j->tok);
    *j = c->js[--c->n_js];
}

/* Tell the helper to drop sequences ids[0..n): 0, or -1 with err. */
int coop_joiner_send_close(struct coop *c, int helper, const uint32_t *ids, uint32_t n, char *err)
{
    while (n) {
        uint32_t m = n > 4096 ? 4096 : n;
        size_t len = wire_coop_close_encode(c->out, WIRE_MAX_MSG, ids, m);
        if (!len) return errmsg_set(err, "a CLOSE of %u sequences did not encode", m);
        if (fabric_node_send(c->cfg.fabric, helper, c->out, len, err)) return -1;
        ids += m, n -= m;
    }
    return 0;
}

int coop_joiner_resident(void *ctx, unsigned long long steps)
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
    k = coop_handover_k(c, k); /* 0 while this node's sequences run on a receiver */
    if (k != atomic_load(&c->k_now) && c->n_sent)
        log_info("coop",
                 "k %d -> %d; so far %llu steps sent (%llu with another in flight), %.3f s in our "
                 "layers, %.3f s waiting for the helper's answers",
                 atomic_load(&c->k_now), k, c->n_sent, c->n_piped, c->t_local, c->t_wait);
    atomic_store(&c->k_now, k);
    if (c->m) atomic_store(&c->m->coop_k, k);
    return k;
}

int coop_joiner_ready(void *ctx)
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
int coop_joiner_wait_reply(struct coop *c, int helper_peer, uint64_t step, unsigned session,
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
        struct jseq *j = coop_joiner_js_get(c, seq[i], err);
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
    int emb = coop_rows_embedded(c);
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
        struct jseq *j = coop_joiner_find(c, seq[i]);
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
    int emb = coop_rows_embedded(c);
    uint8_t dtype = emb ? (uint8_t)c->cfg.dtype : WIRE_TOKENS;
    *want = 0;
    for (int i = 0; i < n; i++) {
        c->rows.seq[i] = seq[r0 + i];
        c->rows.pos[i] = (uint32_t)b->pos[r0 + i];
        c->rows.tok[i] = (uint32_t)b->token[r0 + i];
        c->rows.flags[i] = 0;
        if (*lr < b->n_logits && b->logit_rows[*lr] == r0 + i) {
            c->rows.flags[i] = WIRE_ROW_LOGITS | (mask[*lr] ? WIRE_ROW_MASK_EOS : 0);
            (*lr)++, (*want)++;
        }
    }
    uint64_t step = ++c->step_id;
    struct wire_activations a = {.step = step,
                                 .layer = (uint32_t)k,
                                 .n = (uint32_t)n,
                                 .dim = (uint32_t)c->dim,
                                 .dtype = dtype,
                                 .seq = c->rows.seq,
                                 .pos = c->rows.pos,
                                 .token = c->rows.tok,
                                 .flags = c->rows.flags,
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
int coop_joiner_reply_check(struct coop *c, int hp, const struct wire_coop_tokens *t, int want,
                            const unsigned *seq_of_row, char *err)
{
    const char *helper = fabric_node_peer_name(c->cfg.fabric, hp);
    if (t->status == WIRE_COOP_REFUSED) {
        errmsg_set(err, "helper %s refused the step: %s", helper, t->error);
        return SCHED_COOP_REFUSED;
    }
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

int coop_joiner_step(void *ctx, const struct batch *b, int k, const unsigned *seq,
                     struct sampler *const *smp, const unsigned char *mask, int *tokens, char *err)
{
    struct coop *c = ctx;
    unsigned session;
    int hp;
    if (step_prepare(c, b, k, seq, smp, &session, &hp, err)) return -1;
    /* The rest, in messages of at most WIRE_MAX_MSG bytes, each answered before the next (token
     * rows in chunks of the configured dtype's rows too: the helper's scratch is sized by them). */
    int tok_rows = !coop_rows_embedded(c);
    uint32_t per = wire_activations_max_rows((uint32_t)c->dim, (uint8_t)c->cfg.dtype);
    int lr = 0; /* logit rows handled */
    for (int r0 = 0; r0 < b->n; r0 += (int)per) {
        int n = b->n - r0 < (int)per ? b->n - r0 : (int)per;
        int want = 0, lr0 = lr;
        uint64_t step;
        if (step_send_rows(c, b, k, seq, mask, hp, r0, n, &lr, &want, &step, err)) return -1;
        struct wire_coop_tokens t;
        if (coop_joiner_wait_reply(c, hp, step, session, &t, err)) return -1;
        for (int i = 0; i < want; i++) c->rows.seq[i] = seq[b->logit_rows[lr0 + i]];
        int rc = coop_joiner_reply_check(c, hp, &t, want, c->rows.seq, err);
        /* refused: nothing of the step ran there, unless an earlier message of it did */
        if (rc) return rc == SCHED_COOP_REFUSED && r0 == 0 ? rc : -1;
        for (int i = 0; i < want; i++) {
            tokens[lr0 + i] = (int)t.tok[i].token;
            smp[b->logit_rows[lr0 + i]]->rng = t.tok[i].rng;
        }
        count_remote(c, n, want, tok_rows);
    }
    return 0;
}

/* Pipelined: step b goes out as one message and is answered later (coop_joiner_recv), while the
 * scheduler computes the next step's rows here. 1 when b needs more than one message (run it with
 * coop_joiner_step once the steps in flight are back) or COOP_MAX_FLIGHTS are in flight already. */
int coop_joiner_send(void *ctx, const struct batch *b, int k, const unsigned *seq,
                     struct sampler *const *smp, const unsigned char *mask, char *err)
{
    struct coop *c = ctx;
    uint32_t per = wire_activations_max_rows((uint32_t)c->dim, (uint8_t)c->cfg.dtype);
    if (b->n > (int)per || c->n_fl == COOP_MAX_FLIGHTS || b->n_logits > c->e->lim.max_seqs)
        return 1;
    struct flight *f = &c->fl[(c->fl_first + c->n_fl) % COOP_MAX_FLIGHTS];
    if (step_prepare(c, b, k, seq, smp, &f->session, &f->helper, err)) return -1;
    int lr = 0;
    f->token_rows = !coop_rows_embedded(c);
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
int coop_joiner_recv(void *ctx, int *tokens, uint64_t *rng, char *err)
{
    struct coop *c = ctx;
    if (!c->n_fl) return errmsg_set(err, "coop: no step in flight");
    struct flight *f = &c->fl[c->fl_first];
    c->fl_first = (c->fl_first + 1) % COOP_MAX_FLIGHTS;
    c->n_fl--;
    struct wire_coop_tokens t;
    int rc = coop_joiner_wait_reply(c, f->helper, f->step, f->session, &t, err);
    if (!rc) rc = coop_joiner_reply_check(c, f->helper, &t, f->want, f->seq, err);
    if (rc == SCHED_COOP_REFUSED) return rc; /* the scheduler sends it again */
    if (rc) {
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

const char *coop_joiner_lost(void *ctx, unsigned seq)
{
    struct coop *c = ctx;
    struct jseq *j = coop_joiner_find(c, seq);
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

void coop_joiner_all_local(void *ctx)
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
    char err[ERRMSG_LEN];
    if (open && n && coop_joiner_send_close(c, hp, ids, n, err))
        log_warn("coop", "could not tell the helper to drop %u sequences: %s", n, err);
    else if (n)
        log_info("coop", "all layers local: the helper drops %u sequences", n);
    log_info("coop",
             "while partial: %llu steps sent (%llu with another in flight), %.3f s in our layers, "
             "%.3f s waiting for the helper's answers",
             c->n_sent, c->n_piped, c->t_local, c->t_wait);
    free(ids);
    while (c->n_js) coop_joiner_js_drop(c, &c->js[c->n_js - 1]);
}

void coop_joiner_seq_end(void *ctx, unsigned seq)
{
    struct coop *c = ctx;
    struct jseq *j = coop_joiner_find(c, seq);
    if (!j) return;
    pthread_mutex_lock(&c->mu);
    int live = c->helper_open && j->opened && j->session == c->session;
    int hp = atomic_load(&c->helper);
    pthread_mutex_unlock(&c->mu);
    uint32_t id = seq;
    char err[ERRMSG_LEN];
    if (live && coop_joiner_send_close(c, hp, &id, 1, err))
        log_warn("coop", "could not tell the helper to drop sequence %u: %s", seq, err);
    coop_joiner_js_drop(c, j);
}
