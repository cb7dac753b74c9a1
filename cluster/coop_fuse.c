/* coop_fuse: the helper's fused step (compute thread, --coop-fuse on): other nodes' steps join
 * our own step at their first layer, so each layer's weights are read once for all the rows that
 * run it; every row computes exactly what it would alone (the backend is batch_invariant). */
#include "cluster/coop_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A fused step under way (coop_fuse_forward). Rows [0, n) of the batch are in it, all at the layer the
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
    coop_helper_take_queue(c);
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
                    coop_helper_run_step(c, w);
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
    float *x = c->fused.x + (size_t)n * c->dim;
    if (wire_activations_decode(&a, w->msg, w->len, c->rows.seq, c->rows.pos, c->rows.tok,
                                c->rows.flags, x, c->hx_rows, (size_t)(T - n) * c->dim, why)) {
        coop_helper_reply_error(c, w->peer, w->step, 1, why);
        free(w);
        return -1;
    }
    int ready = coop_helper_rows_ready(c, w->peer, a.layer, c->rows.seq, c->rows.pos, a.n, why);
    if (ready) {
        coop_helper_reply_error(c, w->peer, a.step, ready < 0 ? 1 : ready, why);
        free(w);
        return -1;
    }
    struct fused_step *g = &f->grp[f->n_grp];
    *g = (struct fused_step){.w = w, .step = a.step, .r0 = n, .n = (int)a.n, .l0 = f->nl};
    for (uint32_t i = 0; i < a.n; i++) {
        struct hseq *h = coop_helper_find(c, w->peer, c->rows.seq[i]);
        c->fused.tok[n + i] = (int)c->rows.tok[i];
        c->fused.pos[n + i] = (int)c->rows.pos[i];
        c->fused.blocks[n + i] = h->blocks;
        c->fused.hs[n + i] = h;
        c->fused.flags[n + i] = c->rows.flags[i];
        if (c->rows.flags[i] & WIRE_ROW_LOGITS) c->fused.logit_rows[f->nl++] = n + (int)i;
    }
    g->nl = f->nl - g->l0;
    /* token rows (a joiner without its embedding) are embedded here; a late step's layers below
     * l run for its rows alone */
    struct batch late = {.n = (int)a.n,
                         .token = c->fused.tok + n,
                         .pos = c->fused.pos + n,
                         .blocks = c->fused.blocks + n};
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
        coop_helper_reply_error(c, w->peer, a.step, 1, why);
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
int coop_fuse_forward(void *ctx, const struct batch *b, float *logits, char *err)
{
    struct coop *c = ctx;
    coop_helper_take_queue(c);
    if (!c->n_hs && !c->held_head) return 1; /* no remote sequence: a plain step */
    struct fused f = {.own = b, .n = b->n, .nl = b->n_logits, .rows = b->n, .wants = b->n_logits};
    fused_take(c, &f, 1);
    for (int i = 0; i < b->n; i++) {
        c->fused.tok[i] = b->token[i];
        c->fused.pos[i] = b->pos[i];
        c->fused.blocks[i] = b->blocks[i];
    }
    memcpy(c->fused.logit_rows, b->logit_rows, (size_t)b->n_logits * sizeof *c->fused.logit_rows);
    int rc = engine_embed(c->e, b, c->fused.x);
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
        struct batch now = {
            .n = f.n, .token = c->fused.tok, .pos = c->fused.pos, .blocks = c->fused.blocks};
        rc = engine_layers(c->e, &now, l, l + 1, c->fused.x);
    }
    struct batch fb = {.n = f.n,
                       .token = c->fused.tok,
                       .pos = c->fused.pos,
                       .blocks = c->fused.blocks,
                       .n_logits = f.nl,
                       .logit_rows = c->fused.logit_rows};
    if (!rc) rc = engine_head(c->e, &fb, c->fused.x, c->fused.logits);
    if (rc)
        errmsg_set(err, "%s", engine_error(c->e));
    else
        memcpy(logits, c->fused.logits, (size_t)b->n_logits * c->vocab * sizeof *logits);
    for (int i = 0; i < f.n_pending; i++) { /* only when the step failed */
        coop_helper_reply_error(c, f.pending[i]->peer, f.pending[i]->step, 1,
                                "helper: the fused step failed");
        free(f.pending[i]);
    }
    for (int g = 0; g < f.n_grp; g++) {
        struct fused_step *s = &f.grp[g];
        if (rc) {
            char why[ERRMSG_LEN];
            snprintf(why, sizeof why, "helper: the fused step failed: %.300s", err);
            coop_helper_reply_error(c, s->w->peer, s->step, 1, why);
        } else {
            for (int l = 0; l < s->nl; l++) {
                int at = s->l0 + l, row = c->fused.logit_rows[at];
                c->toks[l] = coop_helper_token(c, c->fused.hs[row], c->fused.flags[row],
                                               c->fused.logits + (size_t)at * c->vocab);
            }
            coop_helper_reply_tokens(c, s->w->peer, s->step, (uint32_t)s->nl, (uint32_t)s->n);
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
