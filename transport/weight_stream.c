#include "transport/weight_stream.h"

#include "os/runtime/clock.h"
#include "os/common/errmsg.h"
#include "os/runtime/log.h"
#include "transport/crc32c.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_FEEDERS    32
#define MAX_REDO       16
#define DEFAULT_CHUNK  (256u << 10)
#define PULLS_PER_STEP 16

/* ---- store ---- */

static uint64_t unit_size(const struct wire_manifest *m, uint32_t u)
{
    return u == 0 ? m->header_len : m->span[u - 1].size;
}

static uint8_t *unit_base(const struct weight_store *s, uint32_t u)
{
    return u == 0 ? s->header : s->image + s->man->span[u - 1].offset;
}

static int unit_verify(struct weight_store *s, uint32_t u)
{
    const struct wire_manifest *m = s->man;
    uint64_t n = unit_size(m, u);
    uint32_t want = u == 0 ? m->header_crc : m->span[u - 1].crc;
    if (crc32c(0, unit_base(s, u), n) != want) return -1;
    if (u == 0) {
        uint8_t id[WIRE_ID_LEN];
        crypto_generichash(id, sizeof id, s->header, n, NULL, 0);
        if (memcmp(id, m->model_id, WIRE_ID_LEN)) return -1;
    }
    return 0;
}

static void unit_mark_verified(struct weight_store *s, uint32_t u)
{
    if (atomic_load(&s->verified[u])) return;
    atomic_store(&s->verified[u], 1);
    atomic_fetch_add(&s->n_verified, 1);
    if (u > 0 && s->on_ready) s->on_ready(s->ctx, (int)u - 1);
}

/* Chunk tables for s->man. */
static int store_layout(struct weight_store *s, char *err)
{
    const struct wire_manifest *m = s->man;
    s->n_units = m->n_spans + 1;
    s->unit_first = calloc(s->n_units, sizeof *s->unit_first);
    s->unit_chunks = calloc(s->n_units, sizeof *s->unit_chunks);
    s->unit_missing = calloc(s->n_units, sizeof *s->unit_missing);
    s->verified = calloc(s->n_units, sizeof *s->verified);
    if (!s->unit_first || !s->unit_chunks || !s->unit_missing || !s->verified)
        return errmsg_set(err, "weight store: out of memory");
    uint64_t total = 0;
    for (uint32_t u = 0; u < s->n_units; u++) {
        uint64_t n = (unit_size(m, u) + m->chunk_size - 1) / m->chunk_size;
        if (total + n > UINT32_MAX) return errmsg_set(err, "weight store: too many chunks");
        s->unit_first[u] = (uint32_t)total;
        s->unit_chunks[u] = s->unit_missing[u] = (uint32_t)n;
        total += n;
    }
    s->n_chunks = (uint32_t)total;
    s->chunk_have = calloc(total ? total : 1, 1);
    if (!s->chunk_have) return errmsg_set(err, "weight store: out of memory");
    atomic_store(&s->n_verified, 0);
    return 0;
}

int weight_store_init_full(struct weight_store *s, const char *name, const uint8_t *header,
                           uint64_t header_len, uint8_t *image, uint64_t image_size,
                           const struct wire_span *spans, uint32_t n_spans, uint32_t chunk_size,
                           char *err)
{
    weight_store_init_empty(s);
    if (n_spans < 1 || n_spans > WIRE_MAX_SPANS)
        return errmsg_set(err, "weight store: %u spans, must be 1..%d", n_spans, WIRE_MAX_SPANS);
    if (!chunk_size) chunk_size = DEFAULT_CHUNK;
    if (chunk_size < WIRE_MIN_CHUNK || chunk_size > WIRE_MAX_CHUNK)
        return errmsg_set(err, "weight store: chunk size %u outside %d..%d", chunk_size,
                          WIRE_MIN_CHUNK, WIRE_MAX_CHUNK);
    if (header_len > WIRE_MAX_HEADER_BYTES)
        return errmsg_set(err, "weight store: header of %llu bytes is too large",
                          (unsigned long long)header_len);
    struct wire_manifest *m = calloc(1, sizeof *m);
    if (!m) return errmsg_set(err, "weight store: out of memory");
    s->man = m;
    snprintf(m->name, sizeof m->name, "%s", name);
    m->header_len = header_len;
    m->header_crc = crc32c(0, header, header_len);
    crypto_generichash(m->model_id, WIRE_ID_LEN, header, header_len, NULL, 0);
    m->image_size = image_size;
    m->chunk_size = chunk_size;
    m->n_spans = n_spans;
    uint64_t end = 0;
    for (uint32_t i = 0; i < n_spans; i++) {
        if (spans[i].offset < end || spans[i].offset > image_size ||
            spans[i].size > image_size - spans[i].offset)
            return errmsg_set(err,
                              "weight store: span %u [%llu, +%llu) is out of order or outside "
                              "the %llu-byte image",
                              i, (unsigned long long)spans[i].offset,
                              (unsigned long long)spans[i].size, (unsigned long long)image_size);
        m->span[i] = spans[i];
        m->span[i].crc = crc32c(0, image + spans[i].offset, spans[i].size);
        end = spans[i].offset + spans[i].size;
    }
    s->header = (uint8_t *)header;
    s->image = image;
    if (store_layout(s, err)) return -1;
    memset(s->chunk_have, 1, s->n_chunks);
    for (uint32_t u = 0; u < s->n_units; u++) {
        s->unit_missing[u] = 0;
        atomic_store(&s->verified[u], 1);
    }
    atomic_store(&s->n_verified, (int)s->n_units);
    return 0;
}

void weight_store_init_empty(struct weight_store *s)
{
    memset(s, 0, sizeof *s);
}

void weight_store_free(struct weight_store *s)
{
    if (s->own_header) free(s->header);
    free(s->man), free(s->unit_first), free(s->unit_chunks), free(s->unit_missing);
    free(s->chunk_have), free((void *)s->verified);
    memset(s, 0, sizeof *s);
}

int weight_store_span_ready(const struct weight_store *s, int span)
{
    if (!s->man || span < 0 || (uint32_t)span >= s->man->n_spans) return 0;
    return atomic_load(&s->verified[span + 1]);
}

int weight_store_header_ready(const struct weight_store *s)
{
    return s->man && atomic_load(&s->verified[0]);
}

int weight_store_spans_ready(const struct weight_store *s)
{
    if (!s->man) return 0;
    return atomic_load(&s->n_verified) - (weight_store_header_ready(s) ? 1 : 0);
}

int weight_store_complete(const struct weight_store *s)
{
    return s->man && atomic_load(&s->n_verified) == (int)s->n_units;
}

/* A joiner learns the manifest from its first holder. */
static int store_adopt(struct weight_store *s, const struct wire_manifest *m, char *err)
{
    s->man = malloc(sizeof *s->man);
    if (!s->man) return errmsg_set(err, "weight store: out of memory");
    *s->man = *m;
    if (store_layout(s, err)) return -1;
    s->header = malloc(m->header_len ? m->header_len : 1);
    if (!s->header) return errmsg_set(err, "weight store: out of memory for the header");
    s->own_header = 1;
    if (!s->alloc_image) return errmsg_set(err, "weight store: no image allocator");
    if (s->unit_chunks[0] == 0 && unit_verify(s, 0) == 0) unit_mark_verified(s, 0);
    return 0;
}

/* A joiner forgets a manifest whose header its allocator rejected (no image was allocated). */
static void store_forget(struct weight_store *s)
{
    struct weight_store keep = *s;
    weight_store_free(s);
    s->on_ready = keep.on_ready;
    s->ctx = keep.ctx;
    s->alloc_image = keep.alloc_image;
    s->alloc_ctx = keep.alloc_ctx;
    s->read_image = keep.read_image;
    s->read_ctx = keep.read_ctx;
}

static int same_model(const struct wire_manifest *a, const struct wire_manifest *b)
{
    if (memcmp(a->model_id, b->model_id, WIRE_ID_LEN) || a->header_len != b->header_len ||
        a->header_crc != b->header_crc || a->image_size != b->image_size ||
        a->n_spans != b->n_spans)
        return 0;
    for (uint32_t i = 0; i < a->n_spans; i++)
        if (a->span[i].offset != b->span[i].offset || a->span[i].size != b->span[i].size ||
            a->span[i].crc != b->span[i].crc)
            return 0;
    return 1;
}

/* Are bytes [off, off+len) of unit u held (not necessarily verified)? */
static int range_held(const struct weight_store *s, uint32_t u, uint64_t off, uint64_t len)
{
    if (!s->man) return 0;
    if (atomic_load(&s->verified[u])) return 1;
    if (len == 0) return 1;
    uint32_t c = s->man->chunk_size;
    for (uint64_t k = off / c; k <= (off + len - 1) / c; k++)
        if (!s->chunk_have[s->unit_first[u] + k]) return 0;
    return 1;
}

/* ---- stream ---- */

struct feeder {
    struct tp_conn *c;
    int joined, manifest_sent, done, pull, closing;
    uint32_t chunk_size;
    uint8_t skip[WIRE_MAX_SPANS + 1];
    uint32_t unit;
    uint64_t off;
    uint32_t redo[MAX_REDO];
    int n_redo;
    uint64_t redo_off;
    double tokens, last;
};

struct weight_stream {
    struct weight_stream_config cfg;
    struct weight_store *s;
    struct feeder f[MAX_FEEDERS];
    int n_f;
    int served;
    int corrupt_done;
    /* upstream */
    struct tp_conn *up;
    int up_peer, up_joined, had_upstream, done_sent, finished, refusals, skips;
    double up_next_try;
    int backoff_ms; /* the wait before the next attempt: retry_ms, doubling to WS_MAX_BACKOFF_MS */
    /* the holders to pull from: cfg.peers, then those weight_stream_add_peer added */
    char peer_buf[WS_MAX_PEERS][64];
    const char *peer[WS_MAX_PEERS];
    int n_peers;
    uint32_t refetch[MAX_REDO];
    int n_refetch;
    uint32_t pull_unit;
    uint64_t pull_off;
    uint8_t *msg;
    uint8_t *stage; /* a chunk as the manifest has it, when the store rewrote its image */
    struct weight_stream_stats st;
    int early_drops; /* image chunks that came before the image existed (header re-fetched) */
    int reject;      /* the header was rejected: forget this holder's model */
    char reject_err[ERRMSG_LEN];
    char up_err[ERRMSG_LEN];
    struct wire_join join;    /* decode/encode space, too large for the stack */
    struct wire_manifest man; /* the last manifest received */
};

const char *weight_stream_upstream_error(const struct weight_stream *ws)
{
    return ws->up_err;
}

struct weight_stream *weight_stream_new(const struct weight_stream_config *cfg, char *err)
{
    struct weight_stream *ws = calloc(1, sizeof *ws);
    if (!ws || !(ws->msg = malloc(WIRE_MAX_MSG))) {
        free(ws);
        errmsg_set(err, "weight stream: out of memory");
        return NULL;
    }
    ws->cfg = *cfg;
    ws->s = cfg->store;
    if (ws->cfg.retry_ms <= 0) ws->cfg.retry_ms = 200;
    ws->backoff_ms = ws->cfg.retry_ms;
    for (int i = 0; i < cfg->n_peers && ws->n_peers < WS_MAX_PEERS; i++) {
        snprintf(ws->peer_buf[ws->n_peers], sizeof ws->peer_buf[0], "%s", cfg->peers[i]);
        ws->peer[ws->n_peers] = ws->peer_buf[ws->n_peers];
        ws->n_peers++;
    }
    return ws;
}

void weight_stream_free(struct weight_stream *ws)
{
    if (!ws) return;
    for (int i = 0; i < ws->n_f; i++) tp_close(ws->f[i].c);
    tp_close(ws->up);
    free(ws->msg);
    free(ws->stage);
    free(ws);
}

int weight_stream_served(const struct weight_stream *ws)
{
    return ws->served;
}

int weight_stream_active(const struct weight_stream *ws)
{
    int n = 0;
    for (int i = 0; i < ws->n_f; i++) n += !ws->f[i].done;
    return n;
}

int weight_stream_finished(const struct weight_stream *ws)
{
    return ws->finished;
}

const struct weight_stream_stats *weight_stream_stats(const struct weight_stream *ws)
{
    return &ws->st;
}

/* ---- holder side: one feeder per downstream peer ---- */

static void feeder_msg(struct weight_stream *ws, struct feeder *f, const uint8_t *msg, size_t len)
{
    char err[ERRMSG_LEN];
    const char *peer = tp_conn_peer(f->c);
    {
        int type = wire_msg_type(msg, len);
        if (type == MSG_JOIN && !f->joined) {
            struct wire_join *j = &ws->join;
            if (wire_join_decode(j, msg, len, err)) {
                log_warn("fabric", "%s: bad join: %s", peer, err);
                f->closing = 1;
                return;
            }
            static const uint8_t zero[WIRE_ID_LEN];
            if (ws->s->man && memcmp(j->model_id, zero, WIRE_ID_LEN) &&
                memcmp(j->model_id, ws->s->man->model_id, WIRE_ID_LEN)) {
                log_warn("fabric", "%s: asks for another model than ours (%s); closing", peer,
                         ws->s->man->name);
                f->closing = 1;
                return;
            }
            f->joined = 1;
            f->pull = !!(j->flags & JOIN_PULL);
            f->chunk_size = j->chunk_size ? j->chunk_size
                            : ws->s->man
                                ? ws->s->man->chunk_size
                                : (ws->cfg.chunk_size ? ws->cfg.chunk_size : DEFAULT_CHUNK);
            memset(f->skip, 0, sizeof f->skip);
            f->skip[0] = !!(j->flags & JOIN_HAVE_HEADER);
            int have = 0;
            for (uint32_t i = 0; i < j->n_spans; i++)
                if (j->have[i / 8] >> (i % 8) & 1) f->skip[i + 1] = 1, have++;
            f->last = 0;
            log_info("fabric", "%s joined%s%s (has %d spans)", peer, f->pull ? ", pulling" : "",
                     have ? ", resuming" : "", have);
        } else if (type == MSG_REFETCH && f->joined) {
            uint32_t u;
            if (wire_refetch_decode(&u, msg, len, err) || !ws->s->man || u >= ws->s->n_units) {
                log_warn("fabric", "%s: bad refetch: %s", peer, err);
                return;
            }
            log_warn("fabric", "%s: unit %u failed its CRC there; sending it again", peer, u);
            ws->st.refetches++;
            int dup = 0;
            for (int i = 0; i < f->n_redo; i++) dup |= f->redo[i] == u;
            if (!dup && f->n_redo < MAX_REDO) {
                if (f->n_redo == 0) f->redo_off = 0;
                f->redo[f->n_redo++] = u;
            }
        } else if (type == MSG_DONE && f->joined) {
            if (!f->done) {
                f->done = 1;
                ws->served++;
                log_info("fabric", "%s: every span verified there", peer);
            }
        } else {
            log_warn("fabric", "%s: unexpected message type %d", peer, type);
        }
    }
}

static void feeder_recv(struct weight_stream *ws, struct feeder *f)
{
    const uint8_t *msg;
    size_t len;
    while (!f->closing && tp_recv(f->c, &msg, &len) == 1) feeder_msg(ws, f, msg, len);
}

static struct feeder *feeder_add(struct weight_stream *ws, struct tp_conn *c)
{
    if (ws->n_f == MAX_FEEDERS) {
        log_warn("fabric", "%s: too many downstream peers; closing", tp_conn_peer(c));
        tp_close(c);
        return NULL;
    }
    struct feeder *f = &ws->f[ws->n_f++];
    memset(f, 0, sizeof *f);
    f->c = c;
    tp_set_bulk(c);
    return f;
}

int weight_stream_adopt(struct weight_stream *ws, struct tp_conn *c, const uint8_t *msg, size_t len)
{
    struct feeder *f = feeder_add(ws, c);
    if (!f) return -1;
    feeder_msg(ws, f, msg, len);
    return 0;
}

/* Encode and send one chunk of unit u at off (len bytes). TP_OK, TP_BUSY or -1. */
static int send_chunk(struct weight_stream *ws, struct feeder *f, uint32_t u, uint64_t off,
                      uint32_t len)
{
    const struct wire_manifest *m = ws->s->man;
    struct wire_chunk ch = {
        .region = u == 0 ? REGION_HEADER : REGION_IMAGE,
        .span = u == 0 ? 0 : u - 1,
        .offset = u == 0 ? off : m->span[u - 1].offset + off,
        .len = len,
        .data = unit_base(ws->s, u) + off,
    };
    if (u > 0 && ws->s->read_image) {
        if (!ws->stage && !(ws->stage = malloc(WIRE_MAX_MSG))) return -1;
        ws->s->read_image(ws->s->read_ctx, ch.offset, len, ws->stage);
        ch.data = ws->stage;
    }
    ch.crc = crc32c(0, ch.data, len);
    size_t n = wire_chunk_encode(ws->msg, WIRE_MAX_MSG, &ch);
    if (!n) return -1;
    if ((int)u == ws->cfg.corrupt_unit && !ws->corrupt_done && len) {
        /* Fault injection: the bytes go bad before the chunk CRC is taken (as a memory error
         * would), so only the span CRC at the receiver can catch it. */
        uint8_t *data = ws->msg + WIRE_CHUNK_HDR_LEN;
        data[len / 2] ^= 0x5a;
        struct wire_w w = {ws->msg + WIRE_CHUNK_HDR_LEN - 4, 4, 0, 0};
        wire_put_u32(&w, crc32c(0, data, len));
        ws->corrupt_done = 1;
        log_warn("fabric", "fault injection: corrupted unit %u at offset %llu", u,
                 (unsigned long long)off);
    }
    int r = tp_send(f->c, ws->msg, n);
    if (r == TP_OK) {
        ws->st.chunks_tx++;
        ws->st.bytes_tx += len;
    }
    return r;
}

static void feeder_push(struct weight_stream *ws, struct feeder *f)
{
    struct weight_store *s = ws->s;
    if (!f->joined || !s->man || f->closing) return;
    if (!f->manifest_sent) {
        struct wire_manifest *m = malloc(sizeof *m);
        if (!m) return;
        *m = *s->man;
        m->chunk_size = f->chunk_size;
        size_t n = wire_manifest_encode(ws->msg, WIRE_MAX_MSG, m);
        free(m);
        int r = n ? tp_send(f->c, ws->msg, n) : -1;
        if (r != TP_OK) {
            if (r < 0) f->closing = 1;
            return;
        }
        f->manifest_sent = 1;
    }
    double t = clock_now();
    if (ws->cfg.rate_bytes > 0) {
        /* The bucket holds 50 ms of the rate: a fabric thread that a busy machine runs only every
         * few tens of ms still keeps the average (with 10 ms it got a third of it here). */
        double cap = ws->cfg.rate_bytes * 0.05;
        if (cap < f->chunk_size) cap = f->chunk_size;
        f->tokens = f->last ? f->tokens + (t - f->last) * ws->cfg.rate_bytes : f->chunk_size;
        if (f->tokens > cap) f->tokens = cap;
        f->last = t;
    }
    for (int budget = 64; budget > 0; budget--) {
        uint32_t u;
        uint64_t off;
        int redo = f->n_redo > 0;
        if (redo) {
            u = f->redo[0];
            off = f->redo_off;
            if (off >= unit_size(s->man, u) || (f->pull && u > 0)) {
                memmove(f->redo, f->redo + 1, (size_t)--f->n_redo * sizeof *f->redo);
                f->redo_off = 0;
                continue;
            }
        } else {
            while (f->unit < s->n_units &&
                   (f->skip[f->unit] || f->off >= unit_size(s->man, f->unit) ||
                    (f->pull && f->unit > 0))) {
                f->unit++;
                f->off = 0;
            }
            if (f->unit >= s->n_units) return;
            u = f->unit;
            off = f->off;
        }
        uint64_t left = unit_size(s->man, u) - off;
        uint32_t len = left < f->chunk_size ? (uint32_t)left : f->chunk_size;
        if (!range_held(s, u, off, len)) return; /* chain: forward it when it lands here */
        if (ws->cfg.rate_bytes > 0 && f->tokens < len) return;
        int r = send_chunk(ws, f, u, off, len);
        if (r == TP_BUSY) return;
        if (r < 0) {
            f->closing = 1;
            return;
        }
        f->tokens -= len;
        if (redo)
            f->redo_off += len;
        else
            f->off += len;
    }
}

static void feeders_step(struct weight_stream *ws)
{
    struct tp_conn *c;
    while (!ws->cfg.no_accept && (c = tp_accept(ws->cfg.t))) feeder_add(ws, c);
    for (int i = 0; i < ws->n_f; i++) {
        struct feeder *f = &ws->f[i];
        feeder_recv(ws, f);
        if (!f->done) feeder_push(ws, f);
        int closed = tp_conn_state(f->c) == TP_CLOSED;
        if (closed && !f->done)
            log_warn("fabric", "downstream %s lost: %s", tp_conn_peer(f->c), tp_conn_error(f->c));
        if (closed || f->closing || (f->done && tp_pending(f->c) == 0)) {
            tp_close(f->c);
            ws->f[i--] = ws->f[--ws->n_f];
        }
    }
}

/* ---- joiner side ---- */

static void queue_refetch(struct weight_stream *ws, uint32_t u)
{
    for (int i = 0; i < ws->n_refetch; i++)
        if (ws->refetch[i] == u) return;
    if (ws->n_refetch < MAX_REDO) ws->refetch[ws->n_refetch++] = u;
}

/* The header has verified: the image is allocated now (the engine plans from the header) and
 * registered once with the device. */
static void attach_image(struct weight_stream *ws)
{
    struct weight_store *s = ws->s;
    char err[ERRMSG_LEN] = "";
    s->image = s->alloc_image(s->alloc_ctx, s->man->image_size, err);
    if (!s->image) {
        ws->reject = 1;
        snprintf(ws->reject_err, sizeof ws->reject_err, "%s", *err ? err : "no image");
        return;
    }
    if (tp_can_expose(ws->cfg.t)) {
        char xerr[ERRMSG_LEN];
        if (tp_expose(ws->cfg.t, s->image, s->man->image_size, xerr)) {
            if (tp_can_pull(ws->cfg.t)) {
                ws->reject = 1;
                snprintf(ws->reject_err, sizeof ws->reject_err, "%s", xerr);
                return;
            }
            log_warn("fabric", "%s", xerr);
        }
    }
    for (uint32_t u = 1; u < s->n_units; u++)
        if (s->unit_chunks[u] == 0 && unit_verify(s, u) == 0) unit_mark_verified(s, u);
}

/* A chunk has landed in unit u at off: mark it, verify the unit when it is whole. */
static void chunk_landed(struct weight_stream *ws, uint32_t u, uint64_t off)
{
    struct weight_store *s = ws->s;
    uint32_t k = s->unit_first[u] + (uint32_t)(off / s->man->chunk_size);
    if (s->chunk_have[k]) {
        ws->st.dup_chunks++;
        return;
    }
    s->chunk_have[k] = 1;
    if (--s->unit_missing[u]) return;
    if (unit_verify(s, u) == 0) {
        unit_mark_verified(s, u);
        if (u == 0) {
            log_info("fabric", "header verified (%llu bytes, model %s)",
                     (unsigned long long)s->man->header_len, s->man->name);
            attach_image(ws);
        } else
            log_info("fabric", "span %u/%u verified", u - 1, s->man->n_spans);
        return;
    }
    log_warn("fabric", "unit %u failed its CRC; fetching it again", u);
    ws->st.refetches++;
    memset(s->chunk_have + s->unit_first[u], 0, s->unit_chunks[u]);
    s->unit_missing[u] = s->unit_chunks[u];
    queue_refetch(ws, u);
}

static void put_chunk(struct weight_stream *ws, const uint8_t *msg, size_t len)
{
    struct weight_store *s = ws->s;
    struct wire_chunk ch;
    char err[ERRMSG_LEN];
    const char *peer = tp_conn_peer(ws->up);
    if (wire_chunk_decode(&ch, msg, len, err)) {
        log_warn("fabric", "%s: dropped chunk: %s", peer, err);
        return;
    }
    const struct wire_manifest *m = s->man;
    uint32_t u;
    uint64_t off;
    if (ch.region == REGION_HEADER) {
        u = 0;
        off = ch.offset;
    } else {
        if (ch.span >= m->n_spans || ch.offset < m->span[ch.span].offset) goto bad;
        u = ch.span + 1;
        off = ch.offset - m->span[ch.span].offset;
    }
    uint64_t size = unit_size(m, u);
    if (off % m->chunk_size || off >= size ||
        ch.len != (size - off < m->chunk_size ? size - off : m->chunk_size))
        goto bad;
    ws->st.chunks_rx++;
    ws->st.bytes_rx += ch.len;
    if (u > 0 && !s->image) {
        ws->early_drops++; /* the header is being fetched again: resume once it verifies */
        return;
    }
    if (atomic_load(&s->verified[u])) {
        ws->st.dup_chunks++;
        return; /* the engine may be reading it: never write a verified unit */
    }
    memcpy(unit_base(s, u) + off, ch.data, ch.len);
    chunk_landed(ws, u, off);
    return;
bad:
    log_warn("fabric",
             "%s: dropped chunk: region %u span %u offset %llu length %u does not fit "
             "the manifest",
             peer, ch.region, ch.span, (unsigned long long)ch.offset, ch.len);
}

/* One-sided reads of the image (rdma), a few chunks per step. */
static int pull_some(struct weight_stream *ws, char *err)
{
    struct weight_store *s = ws->s;
    if (!s->image) return 0;
    for (int n = 0; n < PULLS_PER_STEP; n++) {
        while (ws->pull_unit < s->n_units &&
               (ws->pull_unit == 0 || atomic_load(&s->verified[ws->pull_unit]) ||
                ws->pull_off >= unit_size(s->man, ws->pull_unit))) {
            ws->pull_unit++;
            ws->pull_off = 0;
        }
        if (ws->pull_unit >= s->n_units) {
            ws->pull_unit = 1; /* again from the start: units that failed their CRC */
            ws->pull_off = 0;
            return 0;
        }
        uint32_t u = ws->pull_unit;
        uint64_t left = unit_size(s->man, u) - ws->pull_off;
        uint32_t len = left < s->man->chunk_size ? (uint32_t)left : s->man->chunk_size;
        uint64_t roff = s->man->span[u - 1].offset + ws->pull_off;
        uint32_t k = s->unit_first[u] + (uint32_t)(ws->pull_off / s->man->chunk_size);
        if (!s->chunk_have[k]) {
            if (tp_pull(ws->up, roff, s->image + roff, len, err)) return -1;
            ws->st.chunks_rx++;
            ws->st.bytes_rx += len;
            chunk_landed(ws, u, ws->pull_off);
        }
        ws->pull_off += len;
    }
    return 0;
}

/* The next attempt after a failed one: the wait doubles, up to WS_MAX_BACKOFF_MS, until an upstream
 * opens (a dead holder is not hammered; weight_stream_add_peer cuts the wait short). */
static void retry_later(struct weight_stream *ws, double t)
{
    ws->up_peer = (ws->up_peer + 1) % ws->n_peers;
    ws->up_next_try = t + ws->backoff_ms * 1e-3;
    ws->backoff_ms =
        ws->backoff_ms * 2 < WS_MAX_BACKOFF_MS ? ws->backoff_ms * 2 : WS_MAX_BACKOFF_MS;
}

int weight_stream_add_peer(struct weight_stream *ws, const char *addr)
{
    int i = 0;
    while (i < ws->n_peers && strcmp(ws->peer[i], addr)) i++;
    if (i == ws->n_peers) {
        if (ws->n_peers == WS_MAX_PEERS || !ws->n_peers) return -1;
        snprintf(ws->peer_buf[i], sizeof ws->peer_buf[0], "%s", addr);
        ws->peer[i] = ws->peer_buf[i];
        ws->n_peers++;
    }
    ws->backoff_ms = ws->cfg.retry_ms;
    ws->skips = ws->refusals = 0;
    if (!ws->up && !ws->finished) {
        ws->up_peer = i;
        ws->up_next_try = 0;
    }
    return 0;
}

/* This holder cannot serve us (another model, a header we reject): say why, try the next peer;
 * fatal once every peer has been tried a few times. */
static int skip_holder(struct weight_stream *ws, char *err)
{
    log_warn("fabric", "%s; trying the next peer", ws->up_err);
    tp_close(ws->up);
    ws->up = NULL;
    retry_later(ws, clock_now());
    if (++ws->skips >= 3 * ws->n_peers)
        return errmsg_set(err, "no peer can serve this node: %s", ws->up_err);
    return 0;
}

static int upstream_step(struct weight_stream *ws, char *err)
{
    struct weight_store *s = ws->s;
    if (ws->n_peers == 0 || ws->finished) return 0;
    double t = clock_now();
    if (!ws->up) {
        if (t < ws->up_next_try) return 0;
        const char *peer = ws->peer[ws->up_peer];
        char cerr[ERRMSG_LEN];
        ws->up = tp_connect(ws->cfg.t, peer, cerr);
        ws->up_joined = 0;
        if (!ws->up) {
            log_warn("fabric", "%s (next attempt in %d ms)", cerr, ws->backoff_ms);
            retry_later(ws, t);
            return 0;
        }
        tp_set_bulk(ws->up);
        if (ws->had_upstream) ws->st.resumes++;
        log_info("fabric", "%s from %s", ws->had_upstream ? "resuming" : "joining", peer);
        ws->had_upstream = 1;
    }
    if (tp_conn_state(ws->up) == TP_OPEN) ws->refusals = 0, ws->backoff_ms = ws->cfg.retry_ms;
    if (tp_conn_state(ws->up) == TP_OPEN && !ws->up_joined) {
        struct wire_join *j = &ws->join;
        memset(j, 0, sizeof *j);
        if (s->man) {
            memcpy(j->model_id, s->man->model_id, WIRE_ID_LEN);
            j->chunk_size = s->man->chunk_size;
            j->n_spans = s->man->n_spans;
            if (atomic_load(&s->verified[0])) j->flags |= JOIN_HAVE_HEADER;
            for (uint32_t i = 0; i < j->n_spans; i++)
                if (atomic_load(&s->verified[i + 1])) j->have[i / 8] |= (uint8_t)(1u << (i % 8));
        } else {
            j->chunk_size = ws->cfg.chunk_size;
        }
        if (tp_can_pull(ws->cfg.t)) j->flags |= JOIN_PULL;
        size_t n = wire_join_encode(ws->msg, WIRE_MAX_MSG, j);
        if (tp_send(ws->up, ws->msg, n) == TP_OK) ws->up_joined = 1;
        ws->n_refetch = 0; /* the join lists what is verified: the holder resends the rest */
    }
    const uint8_t *msg;
    size_t len;
    while (ws->up && tp_recv(ws->up, &msg, &len) == 1) {
        int type = wire_msg_type(msg, len);
        if (type == MSG_MANIFEST) {
            struct wire_manifest *m = &ws->man;
            if (wire_manifest_decode(m, msg, len, err))
                return errmsg_prefix(err, "%s: ", tp_conn_peer(ws->up));
            if (s->man) {
                if (!same_model(s->man, m) || m->chunk_size != s->man->chunk_size) {
                    snprintf(ws->up_err, sizeof ws->up_err,
                             "%s holds another model (%s) than the one being received (%s)",
                             tp_conn_peer(ws->up), m->name, s->man->name);
                    return skip_holder(ws, err);
                }
            } else {
                if (store_adopt(s, m, err)) return -1;
                log_info("fabric", "manifest: %s, %u spans, %llu-byte image, %llu-byte header",
                         m->name, m->n_spans, (unsigned long long)m->image_size,
                         (unsigned long long)m->header_len);
            }
            ws->pull_unit = 1;
            ws->pull_off = 0;
        } else if (type == MSG_CHUNK && s->man) {
            put_chunk(ws, msg, len);
            if (ws->reject) {
                ws->reject = 0;
                snprintf(ws->up_err, sizeof ws->up_err, "%.47s: %.440s", tp_conn_peer(ws->up),
                         ws->reject_err);
                store_forget(s);
                return skip_holder(ws, err);
            }
            if (ws->early_drops && s->image) {
                log_info("fabric",
                         "%s: header verified after a re-fetch; resuming for the %d "
                         "chunks that came before it",
                         tp_conn_peer(ws->up), ws->early_drops);
                ws->early_drops = 0;
                tp_close(ws->up);
                ws->up = NULL;
                ws->up_next_try = 0;
                return 0;
            }
        } else {
            log_warn("fabric", "%s: unexpected message type %d", tp_conn_peer(ws->up), type);
        }
    }
    if (s->man && tp_can_pull(ws->cfg.t) && tp_conn_state(ws->up) == TP_OPEN &&
        !weight_store_complete(s)) {
        char perr[ERRMSG_LEN];
        if (pull_some(ws, perr)) {
            log_warn("fabric", "%s: %s", tp_conn_peer(ws->up), perr);
            tp_close(ws->up);
            ws->up = NULL;
            retry_later(ws, t);
            return 0;
        }
    }
    while (ws->n_refetch && ws->up_joined) {
        size_t n = wire_refetch_encode(ws->msg, WIRE_MAX_MSG, ws->refetch[0]);
        if (tp_send(ws->up, ws->msg, n) != TP_OK) break;
        memmove(ws->refetch, ws->refetch + 1, (size_t)--ws->n_refetch * sizeof *ws->refetch);
    }
    if (weight_store_complete(s) && ws->up_joined && !ws->done_sent) {
        size_t n = wire_done_encode(ws->msg, WIRE_MAX_MSG);
        if (tp_send(ws->up, ws->msg, n) == TP_OK) ws->done_sent = 1;
    }
    if (ws->done_sent && tp_pending(ws->up) == 0) {
        ws->finished = 1;
        tp_close(ws->up);
        ws->up = NULL;
        return 0;
    }
    if (tp_conn_state(ws->up) == TP_CLOSED) {
        snprintf(ws->up_err, sizeof ws->up_err, "%s", tp_conn_error(ws->up));
        if (((struct tp_conn_base *)ws->up)->refused && ++ws->refusals >= 3 * ws->n_peers)
            return errmsg_set(err, "refused by every peer: %s", tp_conn_error(ws->up));
        if (!weight_store_complete(s) || !ws->done_sent)
            log_warn("fabric", "upstream %s lost: %s (next attempt in %d ms)", tp_conn_peer(ws->up),
                     tp_conn_error(ws->up), ws->backoff_ms);
        if (weight_store_complete(s))
            ws->finished = 1; /* everything verified; the holder learns it some other way */
        else
            retry_later(ws, t);
        tp_close(ws->up);
        ws->up = NULL;
    }
    return 0;
}

int weight_stream_step(struct weight_stream *ws, char *err)
{
    if (upstream_step(ws, err)) return -1;
    feeders_step(ws);
    return 0;
}
