/* coop_handover: this node's running sequences handed to another replica when it leaves the
 * engine (a capacity scale-in), and back (cluster/coop.h "Hand-over").
 *
 * The receiver becomes the helper of a joiner at k = 0: every sequence is opened there with its
 * sampler, its computed positions go as token ids in steps that want no token (the receiver
 * computes their KV: the recompute), and every later step's rows go as token ids too. Each
 * sequence keeps its token ids here (struct jseq, every position at "layer -1"), so when k rises
 * to L again the fill brings the KV back by transfer or by recomputing from them (coop_kvfill.c),
 * whether the node serves again, the last sequence there ended, or the receiver is gone.
 * coop_handover / _end on any thread; the rest on the compute thread. */
#include "cluster/coop_internal.h"

#include <stdlib.h>

int coop_handover(struct coop *c, const char *receiver, char *err)
{
    if (!c->cfg.handover) return errmsg_set(err, "hand-over: not a cluster member's engine");
    if (coop_resident(c) < c->L)
        return errmsg_set(err, "hand-over: %d of %d layers here (still joining)", coop_resident(c),
                          c->L);
    int peer = fabric_node_dial(c->cfg.fabric, receiver, err);
    if (peer < 0) return errmsg_prefix(err, "hand-over to %s: ", receiver);
    pthread_mutex_lock(&c->mu);
    if (atomic_load(&c->helper) != peer) {
        atomic_store(&c->helper, peer);
        c->session++; /* nothing of ours is open at the new helper */
    }
    c->helper_open = fabric_node_peer_open(c->cfg.fabric, peer);
    atomic_store(&c->ho_peer, peer);
    atomic_store(&c->ho_asked, clock_now());
    atomic_store(&c->ho_state, HO_ASKED);
    pthread_mutex_unlock(&c->mu);
    if (c->sched) sched_poke(c->sched);
    log_info("coop", "hand-over to %s asked: this node's sequences go there at the next step",
             receiver);
    return 0;
}

void coop_handover_end(struct coop *c)
{
    int st = HO_ASKED;
    if (atomic_compare_exchange_strong(&c->ho_state, &st, HO_NONE)) return;
    st = HO_AWAY;
    if (atomic_compare_exchange_strong(&c->ho_state, &st, HO_BACK) && c->sched)
        sched_poke(c->sched);
}

void coop_handover_counts(const struct coop *c, unsigned long long *done, unsigned long long *seqs,
                          unsigned long long *failed)
{
    struct coop *m = (struct coop *)c;
    *done = atomic_load(&m->ho_done);
    *seqs = atomic_load(&m->ho_seqs);
    *failed = atomic_load(&m->ho_failed);
}

/* Compute thread, at a step boundary: k, as the hand-over has it. */
int coop_handover_k(struct coop *c, int k)
{
    int st = atomic_load(&c->ho_state);
    if (st == HO_NONE) return k;
    pthread_mutex_lock(&c->mu);
    int open = c->helper_open && atomic_load(&c->helper) == atomic_load(&c->ho_peer);
    pthread_mutex_unlock(&c->mu);
    const char *peer = fabric_node_peer_name(c->cfg.fabric, atomic_load(&c->ho_peer));
    switch (st) {
    case HO_ASKED:
        if (k < c->L) { /* a joiner does not hand over (the planner never asks it) */
            atomic_store(&c->ho_state, HO_NONE);
            return k;
        }
        if (open) return 0; /* the scheduler lowers k: coop_handover_lower */
        if (clock_now() - atomic_load(&c->ho_asked) > HO_WAIT_S) {
            atomic_store(&c->ho_state, HO_NONE);
            atomic_fetch_add(&c->ho_failed, 1);
            log_warn("coop",
                     "hand-over to %s given up: not connected within %.0f s (this node's "
                     "sequences finish here)",
                     peer, HO_WAIT_S);
        }
        return k;
    case HO_AWAY:
        if (open && c->n_js) return 0;
        log_info("coop", "hand-over to %s over: %s; every layer runs here again", peer,
                 !open ? "the receiver is gone (the sequences still there are brought back)"
                       : "no sequence of this node is left there");
        break;
    case HO_BACK:
        log_info("coop", "this node serves again: its %d sequences at %s come back", c->n_js, peer);
        break;
    }
    atomic_store(&c->ho_state, HO_NONE);
    c->ho_tokens = 0;
    return k;
}

/* Open sequence i at the receiver with its sampler and its positions' token ids kept here. */
static int ho_open(struct coop *c, int hp, unsigned session, unsigned seq,
                   const struct sampler *smp, const int *tok, int n, char *err)
{
    struct jseq *j = coop_joiner_js_get(c, seq, err);
    if (!j) return -1;
    for (int p = 0; p < n; p++) j->tok[p] = tok[p], j->xl[p] = -1;
    struct wire_coop_open o = {.seq = seq,
                               .temperature = smp->p.temperature,
                               .top_p = smp->p.top_p,
                               .top_k = (uint32_t)(smp->p.top_k > 0 ? smp->p.top_k : 0),
                               .min_p = smp->p.min_p,
                               .rng = smp->rng};
    size_t len = wire_coop_open_encode(c->out, WIRE_MAX_MSG, &o);
    if (!len || fabric_node_send(c->cfg.fabric, hp, c->out, len, err)) return -1;
    j->opened = 1;
    j->session = session;
    j->helper = hp;
    return 0;
}

/* Send rows [0, n) of c->rows as one step that wants no token, and wait for its answer. */
static int ho_rows(struct coop *c, int hp, unsigned session, uint32_t n, char *err)
{
    uint64_t step = ++c->step_id;
    struct wire_activations a = {.step = step,
                                 .layer = 0,
                                 .n = n,
                                 .dim = (uint32_t)c->dim,
                                 .dtype = WIRE_TOKENS,
                                 .seq = c->rows.seq,
                                 .pos = c->rows.pos,
                                 .token = c->rows.tok,
                                 .flags = c->rows.flags,
                                 .x = c->x};
    size_t len = wire_activations_encode(c->out, WIRE_MAX_MSG, &a);
    if (!len) return errmsg_set(err, "%u rows do not fit one message", n);
    if (fabric_node_send(c->cfg.fabric, hp, c->out, len, err)) return -1;
    struct wire_coop_tokens t;
    return coop_joiner_wait_reply(c, hp, step, session, &t, err) ||
                   coop_joiner_reply_check(c, hp, &t, 0, NULL, err)
               ? -1
               : 0;
}

int coop_handover_lower(void *ctx, int n_seqs, const unsigned *seq, struct sampler *const *smp,
                        const int *const *tok, const int *n, char *err)
{
    struct coop *c = ctx;
    double t0 = clock_now();
    pthread_mutex_lock(&c->mu);
    unsigned session = c->session;
    int hp = atomic_load(&c->helper), open = c->helper_open && hp == atomic_load(&c->ho_peer);
    pthread_mutex_unlock(&c->mu);
    const char *who = fabric_node_peer_name(c->cfg.fabric, hp);
    int opened = 0, rc = open ? 0 : errmsg_set(err, "the receiver is not connected");
    long positions = 0;
    uint32_t per = wire_activations_max_rows((uint32_t)c->dim, (uint8_t)c->cfg.dtype), rows = 0;
    for (int i = 0; i < n_seqs && !rc; i++, opened++) {
        if (ho_open(c, hp, session, seq[i], smp[i], tok[i], n[i], err)) {
            rc = errmsg_prefix(err, "opening sequence %u: ", seq[i]);
            break;
        }
        /* its positions, as token ids that want no token: the receiver computes their KV */
        for (int p = 0; p < n[i] && !rc; p++) {
            c->rows.seq[rows] = seq[i];
            c->rows.pos[rows] = (uint32_t)p;
            c->rows.tok[rows] = (uint32_t)tok[i][p];
            c->rows.flags[rows++] = 0;
            positions++;
            if (rows == per) rc = ho_rows(c, hp, session, rows, err), rows = 0;
        }
    }
    if (!rc && rows) rc = ho_rows(c, hp, session, rows, err);
    if (rc) {
        /* nothing moved: the sequences stay here, whole, and are closed there */
        uint32_t *ids = malloc((size_t)(opened ? opened : 1) * sizeof *ids);
        for (int i = 0; ids && i < opened; i++) ids[i] = seq[i];
        char e2[ERRMSG_LEN];
        if (ids && opened) coop_joiner_send_close(c, hp, ids, (uint32_t)opened, e2);
        free(ids);
        for (int i = 0; i < n_seqs; i++) {
            struct jseq *j = coop_joiner_find(c, seq[i]);
            if (j) coop_joiner_js_drop(c, j);
        }
        atomic_store(&c->ho_state, HO_NONE);
        atomic_fetch_add(&c->ho_failed, 1);
        log_warn("coop", "hand-over to %s given up (its %d sequences finish here): %s", who, n_seqs,
                 err);
        return -1;
    }
    c->ho_tokens = 1;
    atomic_store(&c->ho_state, HO_AWAY);
    atomic_fetch_add(&c->ho_done, 1);
    atomic_fetch_add(&c->ho_seqs, (unsigned long long)n_seqs);
    log_info("coop",
             "handed %d sequences (%ld positions, their KV recomputed there) to %s in %.1f ms: "
             "their steps run there from now on",
             n_seqs, positions, who, (clock_now() - t0) * 1e3);
    return 0;
}
