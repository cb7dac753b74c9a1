/* coop: set-up and the scheduler's hooks of cooperative execution (cluster/coop.h).
 *
 * coop_new sizes every buffer once from the engine's limits; coop_sched_hooks hands the scheduler
 * the joiner's hooks (coop_joiner.c, coop_kvfill.c) and the helper's (coop_helper.c,
 * coop_fuse.c). The fabric thread's handlers are in coop_rx.c, the KV answers in coop_kvserve.c.
 * The struct they all share, and which thread owns each field, is in coop_internal.h. */
#include "cluster/coop_internal.h"

#include <stdlib.h>
#include <string.h>

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
    for (int i = 0; i < cfg->n_alt_helpers && c->n_alt < COOP_MAX_ALT; i++)
        c->alt[c->n_alt++] = cfg->alt_helpers[i];
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
    atomic_init(&c->ho_peer, -1);
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
    c->rows.seq = malloc(WIRE_MAX_ACT_TOKENS * sizeof *c->rows.seq); /* also a CLOSE's ids */
    c->rows.pos = malloc(rows * sizeof *c->rows.pos);
    c->rows.tok = malloc(rows * sizeof *c->rows.tok);
    c->rows.flags = malloc(rows);
    c->batch.pos = malloc((size_t)T * sizeof *c->batch.pos);
    c->batch.tok = calloc((size_t)T, sizeof *c->batch.tok);
    c->batch.logit_rows = malloc((size_t)T * sizeof *c->batch.logit_rows);
    c->batch.blocks = malloc((size_t)T * sizeof *c->batch.blocks);
    c->toks = malloc(WIRE_MAX_ACT_TOKENS * sizeof *c->toks);
    c->kv_k = malloc(WIRE_MAX_MSG / 2);
    c->kv_v = malloc(WIRE_MAX_MSG / 2);
    c->kv_ask.seq = malloc(WIRE_COOP_KV_MAX_SEQS * sizeof *c->kv_ask.seq);
    c->kv_ask.n = malloc(WIRE_COOP_KV_MAX_SEQS * sizeof *c->kv_ask.n);
    c->check.kv_seq = malloc(WIRE_COOP_KV_MAX_SEQS * sizeof *c->check.kv_seq);
    c->check.kv_n = malloc(WIRE_COOP_KV_MAX_SEQS * sizeof *c->check.kv_n);
    c->check.seq = malloc(WIRE_MAX_ACT_TOKENS * sizeof *c->check.seq);
    c->check.pos = malloc(rows * sizeof *c->check.pos);
    c->check.tok = malloc(rows * sizeof *c->check.tok);
    c->check.flags = malloc(rows);
    c->check.x = malloc((size_t)rows * c->dim * sizeof *c->check.x);
    if (c->cfg.serve_remote && c->cfg.fuse) {
        c->fused.x = malloc((size_t)T * c->dim * sizeof *c->fused.x);
        c->fused.logits = malloc((size_t)2 * S * c->vocab * sizeof *c->fused.logits);
        c->fused.tok = calloc((size_t)T, sizeof *c->fused.tok);
        c->fused.pos = malloc((size_t)T * sizeof *c->fused.pos);
        c->fused.logit_rows = malloc((size_t)T * sizeof *c->fused.logit_rows);
        c->fused.blocks = malloc((size_t)T * sizeof *c->fused.blocks);
        c->fused.hs = malloc((size_t)T * sizeof *c->fused.hs);
        c->fused.flags = malloc((size_t)T);
    }
    int fuse_ok = !c->cfg.serve_remote || !c->cfg.fuse ||
                  (c->fused.x && c->fused.logits && c->fused.tok && c->fused.pos &&
                   c->fused.logit_rows && c->fused.blocks && c->fused.hs && c->fused.flags);
    if (!c->x || !c->out || !c->hx || !c->logits || !c->rows.seq || !c->rows.pos || !c->rows.tok ||
        !c->rows.flags || !c->batch.pos || !c->batch.tok || !c->batch.logit_rows ||
        !c->batch.blocks || !c->toks || !c->kv_k || !c->kv_v || !c->check.seq || !c->check.pos ||
        !c->check.tok || !c->check.flags || !c->check.x || !fuse_ok || !c->kv_ask.seq ||
        !c->kv_ask.n || !c->check.kv_seq || !c->check.kv_n) {
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
    free(c->kv_ask.seq), free(c->kv_ask.n), free(c->check.kv_seq), free(c->check.kv_n);
    coop_kvserve_drop(c, -1);
    for (int i = 0; i < c->n_hs; i++) coop_helper_seq_free(c, &c->hs[i]);
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
    free(c->fused.x), free(c->fused.logits), free(c->fused.tok), free(c->fused.pos);
    free(c->fused.logit_rows), free(c->fused.blocks), free(c->fused.hs), free(c->fused.flags);
    free(c->x), free(c->out), free(c->hx), free(c->logits);
    for (int i = 0; i < COOP_MAX_FLIGHTS; i++) free(c->fl[i].seq);
    replies_drop(c);
    free(c->rows.seq), free(c->rows.pos), free(c->rows.tok), free(c->rows.flags);
    free(c->batch.pos), free(c->batch.tok), free(c->batch.logit_rows), free(c->batch.blocks),
        free(c->toks);
    free(c->check.seq), free(c->check.pos), free(c->check.tok), free(c->check.flags),
        free(c->check.x);
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

struct sched_coop coop_sched_hooks(struct coop *c)
{
    struct sched_coop h = {.ctx = c, .n_layers = c->L};
    if (c->cfg.resident < c->L || c->n_sched || c->cfg.handover) {
        h.resident = coop_joiner_resident;
        h.ready = coop_joiner_ready;
        h.fill = coop_kvfill_fill;
        h.step = coop_joiner_step;
        if (c->cfg.pipeline) h.send = coop_joiner_send, h.recv = coop_joiner_recv;
        h.all_local = coop_joiner_all_local;
        h.seq_end = coop_joiner_seq_end;
        h.lost = coop_joiner_lost;
        if (c->cfg.handover) h.lower = coop_handover_lower;
        /* a node that serves alone from the start runs every layer from the first step */
        if (c->cfg.resident == c->L && !c->n_sched) h.start_k = c->L;
    }
    if (c->cfg.serve_remote) h.serve = coop_helper_serve;
    if (c->cfg.serve_remote && c->cfg.fuse) h.forward = coop_fuse_forward;
    return h;
}
