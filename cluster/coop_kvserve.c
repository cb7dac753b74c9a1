/* coop_kvserve: the helper's KV answers (compute thread): a joiner whose k rose asks for the KV
 * of layers [k0, k1) of its sequences; the rows are read from our blocks and sent in chunks,
 * between our steps, at most kv_window bytes per window, so a transfer delays a step of ours by
 * that much at most. A sequence that cannot be sent is refused with the reason; --test-kv-fault
 * answers wrongly on purpose (tests). */
#include "cluster/coop_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* A helper sends at most this many bytes of KV answers between two of its steps (coop_kvserve_pump): about
 * 4 ms of copying, CRC and queueing at ~1 GB/s, the delay a transfer may add to one of its steps.
 * A request of more (a 22-layer model's rise of 11 layers over 8 sequences of 1000 positions of
 * 256-wide f16 KV is 90 MB) takes several windows, with our steps between them. */
#define KV_WINDOW_BYTES (4u << 20)

/* A KV answer under way (helper, compute thread): request q of `peer`, at sequence q.seq[i],
 * layer, pos. Sent in between-step windows of at most KV_WINDOW_BYTES (coop_kvserve_pump). */
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
 * from our blocks and sent by coop_kvserve_pump. A newer request of the same peer replaces an older one
 * still under way (the joiner gave that one up). */
void coop_kvserve_request(struct coop *c, const struct work *w)
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
        struct hseq *h = coop_helper_find(c, j->peer, q->seq[j->i]);
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
int coop_kvserve_pump(struct coop *c)
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
void coop_kvserve_drop(struct coop *c, int peer)
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
