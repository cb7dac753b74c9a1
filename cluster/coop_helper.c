/* coop_helper: the helper's side (compute thread): other nodes' sequences (their sampler, their
 * KV blocks from our pool), their steps run between ours (layers [k, L), the head, a token drawn
 * with the sequence's own sampler and answered), and the work queue the fabric thread fills, run
 * in order per peer. coop_fuse.c runs those steps inside ours instead; coop_kvserve.c answers the
 * KV requests. */
#include "cluster/coop_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

void coop_helper_seq_free(struct coop *c, struct hseq *h)
{
    for (int i = h->n_blocks - 1; i >= 0; i--) kv_block_free(&c->e->kv, h->blocks[i]);
    free(h->blocks);
    sampler_free(&h->smp);
}

struct hseq *coop_helper_find(struct coop *c, int peer, unsigned id)
{
    for (int i = 0; i < c->n_hs; i++)
        if (c->hs[i].peer == peer && c->hs[i].id == id) return &c->hs[i];
    return NULL;
}

static void hs_drop(struct coop *c, struct hseq *h)
{
    coop_helper_seq_free(c, h);
    *h = c->hs[--c->n_hs];
    if (c->m) atomic_store(&c->m->coop_remote_seqs, c->n_hs);
}

void coop_helper_reply_error(struct coop *c, int peer, uint64_t step, int status, const char *msg)
{
    struct wire_coop_tokens t = {.step = step, .status = (uint8_t)status};
    snprintf(t.error, sizeof t.error, "%s", msg);
    size_t len = wire_coop_tokens_encode(c->out, WIRE_MAX_MSG, &t);
    char err[ERRMSG_LEN];
    if (status == WIRE_COOP_REFUSED) {
        c->n_refused++;
        if (c->n_refused == 1 || c->n_refused % 100 == 0)
            log_info("coop", "peer %d: step %llu refused (%lu so far): %s", peer,
                     (unsigned long long)step, c->n_refused, msg);
    } else {
        log_warn("coop", "peer %d: step %llu failed: %s", peer, (unsigned long long)step, msg);
    }
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
int coop_helper_rows_ready(struct coop *c, int peer, uint32_t layer, const uint32_t *seq,
                           const uint32_t *pos, uint32_t n, char *err)
{
    for (uint32_t i = 0; i < n; i++) {
        struct hseq *h = coop_helper_find(c, peer, seq[i]);
        if (!h) return errmsg_set(err, "sequence %u is not open here", seq[i]);
        if ((int)pos[i] + 1 > h->n_pos) h->n_pos = (int)pos[i] + 1;
        if ((int)layer > h->max_layer) h->max_layer = (int)layer;
        int need = kv_blocks_for(&c->e->kv, (int)pos[i] + 1);
        while (h->n_blocks < need) {
            int blk = kv_block_alloc(&c->e->kv);
            if (blk < 0) {
                errmsg_set(err, "helper out of KV blocks for sequence %u", h->id);
                return WIRE_COOP_REFUSED;
            }
            h->blocks[h->n_blocks++] = blk;
        }
    }
    return 0;
}

/* A remote row's token from its logits (lg, clobbered): end-of-sequence masked where the joiner
 * asks, drawn with the sequence's sampler, whose generator state goes back with it. */
struct wire_coop_token coop_helper_token(struct coop *c, struct hseq *h, uint8_t flags, float *lg)
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
void coop_helper_reply_tokens(struct coop *c, int peer, uint64_t step, uint32_t n_tok,
                              uint32_t rows)
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
void coop_helper_run_step(struct coop *c, const struct work *w)
{
    struct wire_activations a;
    char err[ERRMSG_LEN];
    if (wire_activations_decode(&a, w->msg, w->len, c->rows.seq, c->rows.pos, c->rows.tok,
                                c->rows.flags, c->hx, c->hx_rows, (size_t)c->hx_rows * c->dim, err))
        return coop_helper_reply_error(c, w->peer, 0, 1, err);
    int ready = coop_helper_rows_ready(c, w->peer, a.layer, c->rows.seq, c->rows.pos, a.n, err);
    if (ready) return coop_helper_reply_error(c, w->peer, a.step, ready < 0 ? 1 : ready, err);
    int T = c->e->lim.max_tokens, S = c->e->lim.max_seqs;
    uint32_t n_tok = 0;
    for (uint32_t r0 = 0; r0 < a.n;) {
        int m = 0, nl = 0;
        while (r0 + (uint32_t)m < a.n && m < T) {
            uint32_t i = r0 + (uint32_t)m;
            if ((c->rows.flags[i] & WIRE_ROW_LOGITS) && nl == S) break;
            struct hseq *h = coop_helper_find(c, w->peer, c->rows.seq[i]);
            c->batch.pos[m] = (int)c->rows.pos[i];
            c->batch.tok[m] = (int)c->rows.tok[i];
            c->batch.blocks[m] = h->blocks;
            if (c->rows.flags[i] & WIRE_ROW_LOGITS) c->batch.logit_rows[nl++] = m;
            m++;
        }
        struct batch b = {.n = m,
                          .token = c->batch.tok,
                          .pos = c->batch.pos,
                          .blocks = c->batch.blocks,
                          .n_logits = nl,
                          .logit_rows = c->batch.logit_rows};
        float *x = c->hx + (size_t)r0 * c->dim;
        if (a.dtype == WIRE_TOKENS && engine_embed(c->e, &b, x)) {
            snprintf(err, sizeof err, "helper: the embedding failed: %.300s", engine_error(c->e));
            return coop_helper_reply_error(c, w->peer, a.step, 1, err);
        }
        if (engine_layers(c->e, &b, (int)a.layer, c->L, x) || engine_head(c->e, &b, x, c->logits)) {
            snprintf(err, sizeof err, "helper: layers [%u, %d) failed: %.300s", a.layer, c->L,
                     engine_error(c->e));
            return coop_helper_reply_error(c, w->peer, a.step, 1, err);
        }
        for (int l = 0; l < nl; l++) {
            uint32_t i = r0 + (uint32_t)b.logit_rows[l];
            struct hseq *h = coop_helper_find(c, w->peer, c->rows.seq[i]);
            c->toks[n_tok++] =
                coop_helper_token(c, h, c->rows.flags[i], c->logits + (size_t)l * c->vocab);
        }
        r0 += (uint32_t)m;
    }
    coop_helper_reply_tokens(c, w->peer, a.step, n_tok, a.n);
}

static void do_close(struct coop *c, const struct work *w)
{
    uint32_t n;
    char err[ERRMSG_LEN];
    if (wire_coop_close_decode(w->msg, w->len, c->rows.seq, WIRE_MAX_ACT_TOKENS, &n, err)) return;
    for (uint32_t i = 0; i < n; i++) {
        struct hseq *h = coop_helper_find(c, w->peer, c->rows.seq[i]);
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
        coop_helper_run_step(c, w);
        break;
    case W_CLOSE:
        do_close(c, w);
        break;
    case W_KV_REQ:
        coop_kvserve_request(c, w);
        break;
    case W_GONE: {
        int dropped = 0;
        for (int i = c->n_hs - 1; i >= 0; i--)
            if (c->hs[i].peer == w->peer) hs_drop(c, &c->hs[i]), dropped++;
        coop_kvserve_drop(c, w->peer);
        if (dropped) log_info("coop", "peer %d left: its %d sequences' KV freed", w->peer, dropped);
        break;
    }
    }
}

/* What the fabric thread queued, appended to the held list (compute thread). */
void coop_helper_take_queue(struct coop *c)
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
 * (coop_fuse_forward), and so does all that came after them from that peer. */
int coop_helper_serve(void *ctx, int hold)
{
    struct coop *c = ctx;
    struct work *w;
    coop_helper_take_queue(c);
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
    return coop_kvserve_pump(c) | did;
}
