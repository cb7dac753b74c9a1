/* coop_kvfill: the joiner's KV of the layers that became local when k rose (compute thread):
 * transferred from the helper in one request, or recomputed from the saved inputs in one batch,
 * whichever the measured costs say is faster (--coop-kv); what a transfer did not bring is
 * recomputed. --coop-kv compare does both and checks the bytes. */
#include "cluster/coop_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the KV of layers that became local */

static uint8_t kv_wire_dtype(const struct kv_cache *kv)
{
    return kv->type == KV_F32 ? WIRE_F32 : WIRE_F16;
}

/* The sequences of one rise of k (coop_kvfill_fill): the saved inputs, block tables and computed
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
                c->batch.pos[rows] = p;
                c->batch.tok[rows] = j->tok[p];
                c->batch.blocks[rows] = f->blocks[i];
                if (l >= 0)
                    memcpy(c->x + (size_t)rows * D, j->x + (size_t)p * D, (size_t)D * sizeof *c->x);
                rows++, t++;
            }
            take[i] = t;
        }
        struct batch b = {
            .n = rows, .token = c->batch.tok, .pos = c->batch.pos, .blocks = c->batch.blocks};
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
            c->kv_ask.seq[i] = f->js[ask[g0 + i]]->id;
            c->kv_ask.n[i] = (uint32_t)f->n[ask[g0 + i]];
        }
        struct wire_coop_kv_req q = {.req = ++c->kv_req_id,
                                     .layer0 = (uint32_t)k0,
                                     .layer1 = (uint32_t)k1,
                                     .dtype = kv_wire_dtype(&c->e->kv),
                                     .count = (uint32_t)gm,
                                     .seq = c->kv_ask.seq,
                                     .n = c->kv_ask.n};
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
void coop_kvfill_fill(void *ctx, int n_seqs, const unsigned *seq, const int *const *blocks,
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
        struct jseq *j = coop_joiner_find(c, seq[i]);
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
