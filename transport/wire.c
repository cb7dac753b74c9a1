#include "transport/wire.h"

#include "os/common/errmsg.h"
#include "serving/engine/quant.h"
#include "transport/crc32c.h"

#include <string.h>

/* ---- primitives ---- */

static uint8_t *w_room(struct wire_w *w, size_t n)
{
    if (w->bad || w->cap - w->off < n) {
        w->bad = 1;
        return NULL;
    }
    uint8_t *p = w->p + w->off;
    w->off += n;
    return p;
}

void wire_put_u8(struct wire_w *w, uint8_t v)
{
    uint8_t *p = w_room(w, 1);
    if (p) p[0] = v;
}

void wire_put_u16(struct wire_w *w, uint16_t v)
{
    uint8_t *p = w_room(w, 2);
    if (p) p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8);
}

void wire_put_u32(struct wire_w *w, uint32_t v)
{
    uint8_t *p = w_room(w, 4);
    if (!p) return;
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

void wire_put_u64(struct wire_w *w, uint64_t v)
{
    uint8_t *p = w_room(w, 8);
    if (!p) return;
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

uint32_t wire_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

float wire_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void wire_put_f32(struct wire_w *w, float v)
{
    wire_put_u32(w, wire_f32_bits(v));
}

void wire_put_bytes(struct wire_w *w, const void *src, size_t n)
{
    uint8_t *p = w_room(w, n);
    if (p && n) memcpy(p, src, n);
}

const uint8_t *wire_get_bytes(struct wire_r *r, size_t n)
{
    if (r->bad || r->len - r->off < n) {
        r->bad = 1;
        return NULL;
    }
    const uint8_t *p = r->p + r->off;
    r->off += n;
    return p;
}

uint8_t wire_get_u8(struct wire_r *r)
{
    const uint8_t *p = wire_get_bytes(r, 1);
    return p ? p[0] : 0;
}

uint16_t wire_get_u16(struct wire_r *r)
{
    const uint8_t *p = wire_get_bytes(r, 2);
    return p ? (uint16_t)(p[0] | p[1] << 8) : 0;
}

uint32_t wire_get_u32(struct wire_r *r)
{
    const uint8_t *p = wire_get_bytes(r, 4);
    if (!p) return 0;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

uint64_t wire_get_u64(struct wire_r *r)
{
    const uint8_t *p = wire_get_bytes(r, 8);
    if (!p) return 0;
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

float wire_get_f32(struct wire_r *r)
{
    return wire_bits_f32(wire_get_u32(r));
}

/* A decoder's last check: everything read, nothing short, nothing left over. */
static int r_done(const struct wire_r *r, const char *what, char *err)
{
    if (r->bad) return errmsg_set(err, "%s: truncated (%zu bytes)", what, r->len);
    if (r->off != r->len) return errmsg_set(err, "%s: %zu trailing bytes", what, r->len - r->off);
    return 0;
}

static int r_type(struct wire_r *r, int type, const char *what, char *err)
{
    int t = wire_get_u8(r);
    if (r->bad) return errmsg_set(err, "%s: empty message", what);
    if (t != type) return errmsg_set(err, "%s: message type %d, expected %d", what, t, type);
    return 0;
}

int wire_msg_type(const uint8_t *buf, size_t len)
{
    return len ? buf[0] : -1;
}

/* ---- frame header ---- */

void wire_hdr_encode(uint8_t out[WIRE_HDR_LEN], const struct wire_hdr *h)
{
    struct wire_w w = {out, WIRE_HDR_LEN, 0, 0};
    wire_put_u32(&w, WIRE_MAGIC);
    wire_put_u8(&w, h->version);
    wire_put_u8(&w, h->type);
    wire_put_u16(&w, h->flags);
    wire_put_u32(&w, h->length);
    wire_put_u32(&w, h->conn);
    wire_put_u64(&w, h->seq);
    wire_put_u32(&w, h->crc);
}

int wire_hdr_peek(struct wire_hdr *h, const uint8_t *buf, size_t len, char *err)
{
    if (len < WIRE_HDR_LEN)
        return errmsg_set(err, "frame: %zu bytes, header needs %d", len, WIRE_HDR_LEN);
    struct wire_r r = {buf, WIRE_HDR_LEN, 0, 0};
    uint32_t magic = wire_get_u32(&r);
    if (magic != WIRE_MAGIC) return errmsg_set(err, "frame: bad magic 0x%08x", magic);
    h->version = wire_get_u8(&r);
    h->type = wire_get_u8(&r);
    h->flags = wire_get_u16(&r);
    h->length = wire_get_u32(&r);
    h->conn = wire_get_u32(&r);
    h->seq = wire_get_u64(&r);
    h->crc = wire_get_u32(&r);
    if (h->version != WIRE_VERSION)
        return errmsg_set(err, "frame: version %u, this node speaks %d", h->version, WIRE_VERSION);
    if (h->type < WIRE_HELLO || h->type > WIRE_HELLO_ID_ACK)
        return errmsg_set(err, "frame: unknown type %u", h->type);
    if (h->length > WIRE_MAX_FRAME - WIRE_HDR_LEN)
        return errmsg_set(err, "frame: payload length %u exceeds %d", h->length,
                          WIRE_MAX_FRAME - WIRE_HDR_LEN);
    return 0;
}

int wire_hdr_decode(struct wire_hdr *h, const uint8_t *buf, size_t len, char *err)
{
    if (wire_hdr_peek(h, buf, len, err)) return -1;
    if (h->length > len - WIRE_HDR_LEN)
        return errmsg_set(err, "frame: payload length %u but only %zu bytes follow", h->length,
                          len - WIRE_HDR_LEN);
    return 0;
}

int wire_frame_check(struct wire_hdr *h, const uint8_t *frame, size_t len, char *err)
{
    if (wire_hdr_decode(h, frame, len, err)) return -1;
    if ((size_t)h->length != len - WIRE_HDR_LEN)
        return errmsg_set(err, "frame: payload length %u but frame has %zu bytes", h->length,
                          len - WIRE_HDR_LEN);
    uint32_t c = crc32c(0, frame + WIRE_HDR_LEN, h->length);
    if (c != h->crc) return errmsg_set(err, "frame: crc32c 0x%08x, header says 0x%08x", c, h->crc);
    return 0;
}

/* ---- ack ---- */

size_t wire_ack_encode(uint8_t *out, size_t cap, const struct wire_ack *a)
{
    struct wire_w w = {out, cap, 0, 0};
    wire_put_u64(&w, a->cum);
    for (int i = 0; i < WIRE_SACK_WORDS; i++) wire_put_u64(&w, a->sack[i]);
    return w.bad ? 0 : w.off;
}

int wire_ack_decode(struct wire_ack *a, const uint8_t *buf, size_t len, char *err)
{
    struct wire_r r = {buf, len, 0, 0};
    a->cum = wire_get_u64(&r);
    for (int i = 0; i < WIRE_SACK_WORDS; i++) a->sack[i] = wire_get_u64(&r);
    return r_done(&r, "ack", err);
}

/* ---- manifest ---- */

size_t wire_manifest_encode(uint8_t *out, size_t cap, const struct wire_manifest *m)
{
    struct wire_w w = {out, cap, 0, 0};
    size_t nlen = strnlen(m->name, WIRE_NAME_LEN);
    if (m->n_spans > WIRE_MAX_SPANS) return 0;
    wire_put_u8(&w, MSG_MANIFEST);
    wire_put_bytes(&w, m->model_id, WIRE_ID_LEN);
    wire_put_u8(&w, (uint8_t)nlen);
    wire_put_bytes(&w, m->name, nlen);
    wire_put_u64(&w, m->header_len);
    wire_put_u32(&w, m->header_crc);
    wire_put_u64(&w, m->image_size);
    wire_put_u32(&w, m->chunk_size);
    wire_put_u32(&w, m->n_spans);
    for (uint32_t i = 0; i < m->n_spans; i++) {
        wire_put_u64(&w, m->span[i].offset);
        wire_put_u64(&w, m->span[i].size);
        wire_put_u32(&w, m->span[i].crc);
    }
    return w.bad ? 0 : w.off;
}

int wire_manifest_decode(struct wire_manifest *m, const uint8_t *buf, size_t len, char *err)
{
    struct wire_r r = {buf, len, 0, 0};
    if (r_type(&r, MSG_MANIFEST, "manifest", err)) return -1;
    const uint8_t *id = wire_get_bytes(&r, WIRE_ID_LEN);
    uint8_t nlen = wire_get_u8(&r);
    if (nlen > WIRE_NAME_LEN)
        return errmsg_set(err, "manifest: name length %u > %d", nlen, WIRE_NAME_LEN);
    const uint8_t *name = wire_get_bytes(&r, nlen);
    m->header_len = wire_get_u64(&r);
    m->header_crc = wire_get_u32(&r);
    m->image_size = wire_get_u64(&r);
    m->chunk_size = wire_get_u32(&r);
    m->n_spans = wire_get_u32(&r);
    if (r.bad) return errmsg_set(err, "manifest: truncated (%zu bytes)", len);
    if (m->n_spans < 1 || m->n_spans > WIRE_MAX_SPANS)
        return errmsg_set(err, "manifest: %u spans, must be 1..%d", m->n_spans, WIRE_MAX_SPANS);
    if ((len - r.off) / 20 < m->n_spans)
        return errmsg_set(err, "manifest: %u spans need %u bytes, %zu left", m->n_spans,
                          m->n_spans * 20, len - r.off);
    memcpy(m->model_id, id, WIRE_ID_LEN);
    for (unsigned i = 0; i < nlen; i++)
        if (name[i] < 0x20 || name[i] > 0x7e)
            return errmsg_set(err, "manifest: name byte %u is not printable", i);
    memcpy(m->name, name, nlen);
    m->name[nlen] = 0;
    if (m->header_len > WIRE_MAX_HEADER_BYTES)
        return errmsg_set(err, "manifest: header length %llu exceeds %u",
                          (unsigned long long)m->header_len, WIRE_MAX_HEADER_BYTES);
    if (m->chunk_size < WIRE_MIN_CHUNK || m->chunk_size > WIRE_MAX_CHUNK)
        return errmsg_set(err, "manifest: chunk size %u outside %d..%d", m->chunk_size,
                          WIRE_MIN_CHUNK, WIRE_MAX_CHUNK);
    uint64_t end = 0;
    for (uint32_t i = 0; i < m->n_spans; i++) {
        struct wire_span *s = &m->span[i];
        s->offset = wire_get_u64(&r);
        s->size = wire_get_u64(&r);
        s->crc = wire_get_u32(&r);
        if (s->offset < end)
            return errmsg_set(err, "manifest: span %u at %llu overlaps the previous one", i,
                              (unsigned long long)s->offset);
        if (s->offset > m->image_size || s->size > m->image_size - s->offset)
            return errmsg_set(err, "manifest: span %u [%llu, +%llu) outside the %llu-byte image", i,
                              (unsigned long long)s->offset, (unsigned long long)s->size,
                              (unsigned long long)m->image_size);
        end = s->offset + s->size;
    }
    return r_done(&r, "manifest", err);
}

/* ---- join ---- */

size_t wire_join_encode(uint8_t *out, size_t cap, const struct wire_join *j)
{
    struct wire_w w = {out, cap, 0, 0};
    if (j->n_spans > WIRE_MAX_SPANS) return 0;
    wire_put_u8(&w, MSG_JOIN);
    wire_put_bytes(&w, j->model_id, WIRE_ID_LEN);
    wire_put_u8(&w, j->flags);
    wire_put_u32(&w, j->chunk_size);
    wire_put_u32(&w, j->n_spans);
    wire_put_bytes(&w, j->have, (j->n_spans + 7) / 8);
    return w.bad ? 0 : w.off;
}

int wire_join_decode(struct wire_join *j, const uint8_t *buf, size_t len, char *err)
{
    struct wire_r r = {buf, len, 0, 0};
    if (r_type(&r, MSG_JOIN, "join", err)) return -1;
    const uint8_t *id = wire_get_bytes(&r, WIRE_ID_LEN);
    j->flags = wire_get_u8(&r);
    j->chunk_size = wire_get_u32(&r);
    j->n_spans = wire_get_u32(&r);
    if (r.bad) return errmsg_set(err, "join: truncated (%zu bytes)", len);
    if (j->flags & ~(JOIN_HAVE_HEADER | JOIN_PULL))
        return errmsg_set(err, "join: unknown flags 0x%x", j->flags);
    if (j->chunk_size && (j->chunk_size < WIRE_MIN_CHUNK || j->chunk_size > WIRE_MAX_CHUNK))
        return errmsg_set(err, "join: chunk size %u outside %d..%d", j->chunk_size, WIRE_MIN_CHUNK,
                          WIRE_MAX_CHUNK);
    if (j->n_spans > WIRE_MAX_SPANS)
        return errmsg_set(err, "join: %u spans exceeds %d", j->n_spans, WIRE_MAX_SPANS);
    const uint8_t *have = wire_get_bytes(&r, (j->n_spans + 7) / 8);
    if (r_done(&r, "join", err)) return -1;
    memcpy(j->model_id, id, WIRE_ID_LEN);
    memset(j->have, 0, sizeof j->have);
    memcpy(j->have, have, (j->n_spans + 7) / 8);
    /* Bits past n_spans must be zero, so one bitmap has one encoding. */
    if (j->n_spans % 8 && (j->have[j->n_spans / 8] >> (j->n_spans % 8)))
        return errmsg_set(err, "join: bits set past span %u", j->n_spans);
    return 0;
}

/* ---- chunk ---- */

size_t wire_chunk_encode(uint8_t *out, size_t cap, const struct wire_chunk *c)
{
    struct wire_w w = {out, cap, 0, 0};
    if (c->len > WIRE_MAX_CHUNK) return 0;
    wire_put_u8(&w, MSG_CHUNK);
    wire_put_u8(&w, c->region);
    wire_put_u32(&w, c->span);
    wire_put_u64(&w, c->offset);
    wire_put_u32(&w, c->len);
    wire_put_u32(&w, c->crc);
    wire_put_bytes(&w, c->data, c->len);
    return w.bad ? 0 : w.off;
}

int wire_chunk_decode(struct wire_chunk *c, const uint8_t *buf, size_t len, char *err)
{
    struct wire_r r = {buf, len, 0, 0};
    if (r_type(&r, MSG_CHUNK, "chunk", err)) return -1;
    c->region = wire_get_u8(&r);
    c->span = wire_get_u32(&r);
    c->offset = wire_get_u64(&r);
    c->len = wire_get_u32(&r);
    c->crc = wire_get_u32(&r);
    if (r.bad) return errmsg_set(err, "chunk: truncated (%zu bytes)", len);
    if (c->region > REGION_IMAGE) return errmsg_set(err, "chunk: unknown region %u", c->region);
    if (c->len > WIRE_MAX_CHUNK)
        return errmsg_set(err, "chunk: length %u exceeds %d", c->len, WIRE_MAX_CHUNK);
    c->data = wire_get_bytes(&r, c->len);
    if (r_done(&r, "chunk", err)) return -1;
    uint32_t crc = crc32c(0, c->data, c->len);
    if (crc != c->crc)
        return errmsg_set(err, "chunk: span %u offset %llu: crc32c 0x%08x, expected 0x%08x",
                          c->span, (unsigned long long)c->offset, crc, c->crc);
    return 0;
}

/* ---- small messages ---- */

size_t wire_refetch_encode(uint8_t *out, size_t cap, uint32_t span)
{
    struct wire_w w = {out, cap, 0, 0};
    wire_put_u8(&w, MSG_REFETCH);
    wire_put_u32(&w, span);
    return w.bad ? 0 : w.off;
}

int wire_refetch_decode(uint32_t *span, const uint8_t *buf, size_t len, char *err)
{
    struct wire_r r = {buf, len, 0, 0};
    if (r_type(&r, MSG_REFETCH, "refetch", err)) return -1;
    *span = wire_get_u32(&r);
    if (r_done(&r, "refetch", err)) return -1;
    if (*span >= WIRE_MAX_SPANS) return errmsg_set(err, "refetch: span %u out of range", *span);
    return 0;
}

size_t wire_done_encode(uint8_t *out, size_t cap)
{
    struct wire_w w = {out, cap, 0, 0};
    wire_put_u8(&w, MSG_DONE);
    return w.bad ? 0 : w.off;
}

int wire_done_decode(const uint8_t *buf, size_t len, char *err)
{
    struct wire_r r = {buf, len, 0, 0};
    if (r_type(&r, MSG_DONE, "done", err)) return -1;
    return r_done(&r, "done", err);
}

size_t wire_rdma_info_encode(uint8_t *out, size_t cap, const struct wire_rdma_info *i)
{
    struct wire_w w = {out, cap, 0, 0};
    wire_put_u8(&w, MSG_RDMA_INFO);
    wire_put_u32(&w, i->qpn);
    wire_put_u32(&w, i->psn);
    wire_put_u16(&w, i->lid);
    wire_put_bytes(&w, i->gid, 16);
    wire_put_u32(&w, i->rkey);
    wire_put_u64(&w, i->addr);
    wire_put_u64(&w, i->len);
    return w.bad ? 0 : w.off;
}

int wire_rdma_info_decode(struct wire_rdma_info *i, const uint8_t *buf, size_t len, char *err)
{
    struct wire_r r = {buf, len, 0, 0};
    if (r_type(&r, MSG_RDMA_INFO, "rdma info", err)) return -1;
    i->qpn = wire_get_u32(&r);
    i->psn = wire_get_u32(&r);
    i->lid = wire_get_u16(&r);
    const uint8_t *gid = wire_get_bytes(&r, 16);
    i->rkey = wire_get_u32(&r);
    i->addr = wire_get_u64(&r);
    i->len = wire_get_u64(&r);
    if (r_done(&r, "rdma info", err)) return -1;
    memcpy(i->gid, gid, 16);
    if (i->qpn >= 1u << 24) return errmsg_set(err, "rdma info: qpn 0x%x exceeds 24 bits", i->qpn);
    if (i->psn >= 1u << 24) return errmsg_set(err, "rdma info: psn 0x%x exceeds 24 bits", i->psn);
    if (i->addr + i->len < i->addr) return errmsg_set(err, "rdma info: region wraps");
    return 0;
}

/* ---- cooperative execution ---- */

/* Append the CRC-32C of everything written so far. */
static void w_crc(struct wire_w *w)
{
    if (!w->bad) wire_put_u32(w, crc32c(0, w->p, w->off));
}

/* The message ends with the CRC-32C of the bytes before it. */
static int r_crc(const uint8_t *buf, size_t len, const char *what, char *err)
{
    if (len < 5) return errmsg_set(err, "%s: truncated (%zu bytes)", what, len);
    const uint8_t *c = buf + len - 4;
    uint32_t want =
        (uint32_t)c[0] | (uint32_t)c[1] << 8 | (uint32_t)c[2] << 16 | (uint32_t)c[3] << 24;
    uint32_t got = crc32c(0, buf, len - 4);
    if (got != want)
        return errmsg_set(err, "%s: CRC-32C 0x%08x, the message says 0x%08x", what, got, want);
    return 0;
}

static size_t dtype_size(uint8_t dtype)
{
    return dtype == WIRE_F32 ? 4 : dtype == WIRE_F16 || dtype == WIRE_BF16 ? 2 : 0;
}

static int act_dtype_known(uint8_t dtype)
{
    return dtype_size(dtype) || dtype == WIRE_TOKENS;
}

size_t wire_activations_size(uint32_t n, uint32_t dim, uint8_t dtype)
{
    return WIRE_ACT_HDR_LEN + (size_t)n * WIRE_ACT_ROW_LEN + (size_t)n * dim * dtype_size(dtype) +
           4;
}

uint32_t wire_activations_max_rows(uint32_t dim, uint8_t dtype)
{
    size_t row = WIRE_ACT_ROW_LEN + (size_t)dim * dtype_size(dtype);
    size_t n = (WIRE_MAX_MSG - WIRE_ACT_HDR_LEN - 4) / (row ? row : 1);
    return n > WIRE_MAX_ACT_TOKENS ? WIRE_MAX_ACT_TOKENS : (uint32_t)n;
}

size_t wire_activations_encode(uint8_t *out, size_t cap, const struct wire_activations *a)
{
    if (!act_dtype_known(a->dtype) || (a->dtype == WIRE_TOKENS && a->layer != 0) ||
        a->n > WIRE_MAX_ACT_TOKENS || a->dim > WIRE_MAX_ACT_DIM ||
        wire_activations_size(a->n, a->dim, a->dtype) > cap)
        return 0;
    struct wire_w w = {out, cap, 0, 0};
    wire_put_u8(&w, MSG_ACTIVATIONS);
    wire_put_u64(&w, a->step);
    wire_put_u32(&w, a->layer);
    wire_put_u32(&w, a->n);
    wire_put_u32(&w, a->dim);
    wire_put_u8(&w, a->dtype);
    for (uint32_t i = 0; i < a->n; i++) {
        wire_put_u32(&w, a->seq[i]);
        wire_put_u32(&w, a->pos[i]);
        wire_put_u32(&w, a->token[i]);
        wire_put_u8(&w, a->flags[i]);
    }
    size_t m = a->dtype == WIRE_TOKENS ? 0 : (size_t)a->n * a->dim;
    for (size_t i = 0; i < m; i++) {
        float v = a->x[i];
        if (a->dtype == WIRE_F32)
            wire_put_f32(&w, v);
        else
            wire_put_u16(&w, a->dtype == WIRE_F16 ? f32_to_fp16(v) : f32_to_bf16(v));
    }
    w_crc(&w);
    return w.bad ? 0 : w.off;
}

int wire_activations_decode(struct wire_activations *a, const uint8_t *buf, size_t len,
                            uint32_t *seq, uint32_t *pos, uint32_t *token, uint8_t *flags, float *x,
                            uint32_t cap_n, size_t cap_x, char *err)
{
    struct wire_r r = {buf, len, 0, 0};
    if (r_type(&r, MSG_ACTIVATIONS, "activations", err)) return -1;
    a->step = wire_get_u64(&r);
    a->layer = wire_get_u32(&r);
    a->n = wire_get_u32(&r);
    a->dim = wire_get_u32(&r);
    a->dtype = wire_get_u8(&r);
    if (r.bad) return errmsg_set(err, "activations: truncated (%zu bytes)", len);
    if (!act_dtype_known(a->dtype))
        return errmsg_set(err, "activations: unknown dtype %u", a->dtype);
    if (a->dtype == WIRE_TOKENS && a->layer != 0)
        return errmsg_set(err, "activations: token rows for layer %u (they enter at layer 0)",
                          a->layer);
    if (a->n > WIRE_MAX_ACT_TOKENS || a->n > cap_n)
        return errmsg_set(err, "activations: %u rows, room for %u", a->n, cap_n);
    if (a->dim == 0 || a->dim > WIRE_MAX_ACT_DIM)
        return errmsg_set(err, "activations: dim %u out of range", a->dim);
    if (a->dtype != WIRE_TOKENS && (size_t)a->n * a->dim > cap_x)
        return errmsg_set(err, "activations: %u x %u values, room for %zu", a->n, a->dim, cap_x);
    if (len != wire_activations_size(a->n, a->dim, a->dtype))
        return errmsg_set(err, "activations: %zu bytes, %u x %u of dtype %u need %zu", len, a->n,
                          a->dim, a->dtype, wire_activations_size(a->n, a->dim, a->dtype));
    if (r_crc(buf, len, "activations", err)) return -1;
    for (uint32_t i = 0; i < a->n; i++) {
        seq[i] = wire_get_u32(&r);
        pos[i] = wire_get_u32(&r);
        token[i] = wire_get_u32(&r);
        flags[i] = wire_get_u8(&r);
        if (flags[i] & ~(WIRE_ROW_LOGITS | WIRE_ROW_MASK_EOS))
            return errmsg_set(err, "activations: row %u: unknown flags 0x%x", i, flags[i]);
    }
    size_t m = a->dtype == WIRE_TOKENS ? 0 : (size_t)a->n * a->dim;
    for (size_t i = 0; i < m; i++)
        x[i] = a->dtype == WIRE_F32   ? wire_get_f32(&r)
               : a->dtype == WIRE_F16 ? fp16_to_f32(wire_get_u16(&r))
                                      : bf16_to_f32(wire_get_u16(&r));
    wire_get_u32(&r); /* the CRC, checked above */
    a->seq = seq;
    a->pos = pos;
    a->token = token;
    a->flags = flags;
    a->x = x;
    return r_done(&r, "activations", err);
}

size_t wire_coop_tokens_encode(uint8_t *out, size_t cap, const struct wire_coop_tokens *t)
{
    if (t->n > WIRE_MAX_ACT_TOKENS || (t->status && t->n)) return 0;
    size_t elen = t->status ? strnlen(t->error, WIRE_COOP_ERR_LEN) : 0;
    struct wire_w w = {out, cap, 0, 0};
    wire_put_u8(&w, MSG_COOP_TOKENS);
    wire_put_u64(&w, t->step);
    wire_put_u8(&w, t->status);
    wire_put_u32(&w, t->n);
    for (uint32_t i = 0; i < t->n; i++) {
        wire_put_u32(&w, t->tok[i].seq);
        wire_put_u32(&w, t->tok[i].token);
        wire_put_u64(&w, t->tok[i].rng);
    }
    wire_put_u16(&w, (uint16_t)elen);
    wire_put_bytes(&w, t->error, elen);
    w_crc(&w);
    return w.bad ? 0 : w.off;
}

int wire_coop_tokens_decode(struct wire_coop_tokens *t, const uint8_t *buf, size_t len,
                            struct wire_coop_token *tok, uint32_t cap_n, char *err)
{
    struct wire_r r = {buf, len, 0, 0};
    if (r_type(&r, MSG_COOP_TOKENS, "coop tokens", err)) return -1;
    if (r_crc(buf, len, "coop tokens", err)) return -1;
    r.len = len - 4;
    t->step = wire_get_u64(&r);
    t->status = wire_get_u8(&r);
    t->n = wire_get_u32(&r);
    if (r.bad) return errmsg_set(err, "coop tokens: truncated (%zu bytes)", len);
    if (t->status > WIRE_COOP_REFUSED)
        return errmsg_set(err, "coop tokens: status %u unknown", t->status);
    if (t->n > cap_n || t->n > WIRE_MAX_ACT_TOKENS)
        return errmsg_set(err, "coop tokens: %u tokens, room for %u", t->n, cap_n);
    if (t->status && t->n)
        return errmsg_set(err, "coop tokens: a failed step with %u tokens", t->n);
    if (r.len - r.off < (size_t)t->n * 16 + 2)
        return errmsg_set(err, "coop tokens: %zu bytes, %u tokens need more", len, t->n);
    for (uint32_t i = 0; i < t->n; i++) {
        tok[i].seq = wire_get_u32(&r);
        tok[i].token = wire_get_u32(&r);
        tok[i].rng = wire_get_u64(&r);
    }
    uint16_t elen = wire_get_u16(&r);
    const uint8_t *e = wire_get_bytes(&r, elen);
    if (r_done(&r, "coop tokens", err)) return -1;
    if (elen > WIRE_COOP_ERR_LEN) return errmsg_set(err, "coop tokens: %u-byte error", elen);
    for (uint16_t i = 0; i < elen; i++)
        t->error[i] = e[i] >= 0x20 && e[i] < 0x7f ? (char)e[i] : '?';
    t->error[elen] = 0;
    t->tok = tok;
    return 0;
}

size_t wire_coop_open_encode(uint8_t *out, size_t cap, const struct wire_coop_open *o)
{
    struct wire_w w = {out, cap, 0, 0};
    wire_put_u8(&w, MSG_COOP_OPEN);
    wire_put_u32(&w, o->seq);
    wire_put_f32(&w, o->temperature);
    wire_put_f32(&w, o->top_p);
    wire_put_u32(&w, o->top_k);
    wire_put_f32(&w, o->min_p);
    wire_put_u64(&w, o->rng);
    w_crc(&w);
    return w.bad ? 0 : w.off;
}

int wire_coop_open_decode(struct wire_coop_open *o, const uint8_t *buf, size_t len, char *err)
{
    struct wire_r r = {buf, len, 0, 0};
    if (r_type(&r, MSG_COOP_OPEN, "coop open", err)) return -1;
    if (len != WIRE_COOP_OPEN_LEN)
        return errmsg_set(err, "coop open: %zu bytes, expected %d", len, WIRE_COOP_OPEN_LEN);
    if (r_crc(buf, len, "coop open", err)) return -1;
    o->seq = wire_get_u32(&r);
    o->temperature = wire_get_f32(&r);
    o->top_p = wire_get_f32(&r);
    o->top_k = wire_get_u32(&r);
    o->min_p = wire_get_f32(&r);
    o->rng = wire_get_u64(&r);
    wire_get_u32(&r);
    if (r_done(&r, "coop open", err)) return -1;
    /* written so that NaN fails every test */
    if (!(o->temperature >= 0 && o->temperature <= 1e6f) || !(o->top_p > 0 && o->top_p <= 1) ||
        !(o->min_p >= 0 && o->min_p < 1))
        return errmsg_set(err, "coop open: sequence %u: sampler out of range", o->seq);
    if (o->top_k > (1u << 24)) return errmsg_set(err, "coop open: top_k %u", o->top_k);
    return 0;
}

size_t wire_coop_close_encode(uint8_t *out, size_t cap, const uint32_t *seq, uint32_t n)
{
    if (!n || n > WIRE_MAX_ACT_TOKENS) return 0;
    struct wire_w w = {out, cap, 0, 0};
    wire_put_u8(&w, MSG_COOP_CLOSE);
    wire_put_u32(&w, n);
    for (uint32_t i = 0; i < n; i++) wire_put_u32(&w, seq[i]);
    w_crc(&w);
    return w.bad ? 0 : w.off;
}

int wire_coop_close_decode(const uint8_t *buf, size_t len, uint32_t *seq, uint32_t cap_n,
                           uint32_t *n, char *err)
{
    struct wire_r r = {buf, len, 0, 0};
    if (r_type(&r, MSG_COOP_CLOSE, "coop close", err)) return -1;
    if (r_crc(buf, len, "coop close", err)) return -1;
    *n = wire_get_u32(&r);
    if (r.bad) return errmsg_set(err, "coop close: truncated (%zu bytes)", len);
    if (*n == 0 || *n > cap_n || *n > WIRE_MAX_ACT_TOKENS)
        return errmsg_set(err, "coop close: %u sequences, room for %u", *n, cap_n);
    if (len != 1 + 4 + (size_t)*n * 4 + 4)
        return errmsg_set(err, "coop close: %zu bytes for %u sequences", len, *n);
    for (uint32_t i = 0; i < *n; i++) seq[i] = wire_get_u32(&r);
    wire_get_u32(&r);
    return r_done(&r, "coop close", err);
}

size_t wire_coop_kv_req_size(uint32_t count)
{
    return WIRE_COOP_KV_REQ_HDR_LEN + (size_t)count * 8 + 4;
}

size_t wire_coop_kv_req_encode(uint8_t *out, size_t cap, const struct wire_coop_kv_req *q)
{
    if (!q->count || q->count > WIRE_COOP_KV_MAX_SEQS) return 0;
    struct wire_w w = {out, cap, 0, 0};
    wire_put_u8(&w, MSG_COOP_KV_REQ);
    wire_put_u64(&w, q->req);
    wire_put_u32(&w, q->layer0);
    wire_put_u32(&w, q->layer1);
    wire_put_u8(&w, q->dtype);
    wire_put_u32(&w, q->count);
    for (uint32_t i = 0; i < q->count; i++) {
        wire_put_u32(&w, q->seq[i]);
        wire_put_u32(&w, q->n[i]);
    }
    w_crc(&w);
    return w.bad ? 0 : w.off;
}

int wire_coop_kv_req_decode(struct wire_coop_kv_req *q, const uint8_t *buf, size_t len,
                            uint32_t *seq, uint32_t *n, uint32_t cap, char *err)
{
    struct wire_r r = {buf, len, 0, 0};
    if (r_type(&r, MSG_COOP_KV_REQ, "coop kv request", err)) return -1;
    if (len < WIRE_COOP_KV_REQ_HDR_LEN + 4)
        return errmsg_set(err, "coop kv request: %zu bytes, at least %d", len,
                          WIRE_COOP_KV_REQ_HDR_LEN + 4);
    q->req = wire_get_u64(&r);
    q->layer0 = wire_get_u32(&r);
    q->layer1 = wire_get_u32(&r);
    q->dtype = wire_get_u8(&r);
    q->count = wire_get_u32(&r);
    if (q->count == 0 || q->count > WIRE_COOP_KV_MAX_SEQS || q->count > cap)
        return errmsg_set(err, "coop kv request: %u sequences, room for %u", q->count,
                          cap < WIRE_COOP_KV_MAX_SEQS ? cap : WIRE_COOP_KV_MAX_SEQS);
    if (len != wire_coop_kv_req_size(q->count))
        return errmsg_set(err, "coop kv request: %zu bytes for %u sequences, expected %zu", len,
                          q->count, wire_coop_kv_req_size(q->count));
    if (r_crc(buf, len, "coop kv request", err)) return -1;
    for (uint32_t i = 0; i < q->count; i++) {
        seq[i] = wire_get_u32(&r);
        n[i] = wire_get_u32(&r);
    }
    wire_get_u32(&r);
    if (r_done(&r, "coop kv request", err)) return -1;
    q->seq = seq, q->n = n;
    if (q->layer0 >= q->layer1)
        return errmsg_set(err, "coop kv request: layers [%u, %u) are empty", q->layer0, q->layer1);
    if (q->dtype != WIRE_F32 && q->dtype != WIRE_F16)
        return errmsg_set(err, "coop kv request: dtype %u is not a KV type", q->dtype);
    for (uint32_t i = 0; i < q->count; i++)
        if (n[i] == 0) return errmsg_set(err, "coop kv request: sequence %u: no positions", seq[i]);
    return 0;
}

static size_t kv_elt(uint8_t dtype)
{
    return dtype == WIRE_F32 ? 4 : dtype == WIRE_F16 ? 2 : 0;
}

size_t wire_coop_kv_size(uint32_t n, uint32_t kv_dim, uint8_t dtype, size_t error_len)
{
    return WIRE_COOP_KV_HDR_LEN + 2 * (size_t)n * kv_dim * kv_elt(dtype) + 2 + error_len + 4;
}

uint32_t wire_coop_kv_max_rows(uint32_t kv_dim, uint8_t dtype)
{
    size_t row = 2 * (size_t)kv_dim * kv_elt(dtype);
    size_t n = (WIRE_MAX_MSG - WIRE_COOP_KV_HDR_LEN - 2 - 4) / (row ? row : 1);
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

static void put_elems(struct wire_w *w, const void *src, size_t count, uint8_t dtype)
{
    if (dtype == WIRE_F32) {
        const float *f = src;
        for (size_t i = 0; i < count; i++) wire_put_f32(w, f[i]);
    } else {
        const uint16_t *h = src;
        for (size_t i = 0; i < count; i++) wire_put_u16(w, h[i]);
    }
}

size_t wire_coop_kv_encode(uint8_t *out, size_t cap, const struct wire_coop_kv *m)
{
    size_t elen = m->status ? strnlen(m->error, WIRE_COOP_ERR_LEN) : 0;
    if (!kv_elt(m->dtype) || m->kv_dim == 0 || m->kv_dim > WIRE_MAX_ACT_DIM || m->status > 1 ||
        (m->status ? m->n != 0 : m->n == 0) ||
        wire_coop_kv_size(m->n, m->kv_dim, m->dtype, elen) > cap)
        return 0;
    struct wire_w w = {out, cap, 0, 0};
    wire_put_u8(&w, MSG_COOP_KV);
    wire_put_u64(&w, m->req);
    wire_put_u32(&w, m->seq);
    wire_put_u8(&w, m->status);
    wire_put_u32(&w, m->layer);
    wire_put_u32(&w, m->pos0);
    wire_put_u32(&w, m->n);
    wire_put_u32(&w, m->kv_dim);
    wire_put_u8(&w, m->dtype);
    put_elems(&w, m->k_src, (size_t)m->n * m->kv_dim, m->dtype);
    put_elems(&w, m->v_src, (size_t)m->n * m->kv_dim, m->dtype);
    wire_put_u16(&w, (uint16_t)elen);
    wire_put_bytes(&w, m->error, elen);
    w_crc(&w);
    return w.bad ? 0 : w.off;
}

int wire_coop_kv_decode(struct wire_coop_kv *m, const uint8_t *buf, size_t len, char *err)
{
    struct wire_r r = {buf, len, 0, 0};
    if (r_type(&r, MSG_COOP_KV, "coop kv", err)) return -1;
    m->req = wire_get_u64(&r);
    m->seq = wire_get_u32(&r);
    m->status = wire_get_u8(&r);
    m->layer = wire_get_u32(&r);
    m->pos0 = wire_get_u32(&r);
    m->n = wire_get_u32(&r);
    m->kv_dim = wire_get_u32(&r);
    m->dtype = wire_get_u8(&r);
    if (r.bad) return errmsg_set(err, "coop kv: truncated (%zu bytes)", len);
    if (!kv_elt(m->dtype)) return errmsg_set(err, "coop kv: dtype %u is not a KV type", m->dtype);
    if (m->kv_dim == 0 || m->kv_dim > WIRE_MAX_ACT_DIM)
        return errmsg_set(err, "coop kv: kv_dim %u out of range", m->kv_dim);
    /* the shape, before anything is read past the header (n is checked against the length
     * without overflowing: at most WIRE_MAX_MSG bytes of rows) */
    size_t row = 2 * (size_t)m->kv_dim * kv_elt(m->dtype);
    if (len < WIRE_COOP_KV_HDR_LEN + 2 + 4 || m->n > (len - WIRE_COOP_KV_HDR_LEN - 2 - 4) / row)
        return errmsg_set(err, "coop kv: %zu bytes, %u rows of kv_dim %u need more", len, m->n,
                          m->kv_dim);
    m->k = wire_get_bytes(&r, (size_t)m->n * row / 2);
    m->v = wire_get_bytes(&r, (size_t)m->n * row / 2);
    uint16_t elen = wire_get_u16(&r);
    if (r.bad || len != wire_coop_kv_size(m->n, m->kv_dim, m->dtype, elen))
        return errmsg_set(err, "coop kv: %zu bytes, not the %u rows of kv_dim %u it declares", len,
                          m->n, m->kv_dim);
    if (r_crc(buf, len, "coop kv", err)) return -1;
    if (m->status > 1) return errmsg_set(err, "coop kv: status %u unknown", m->status);
    if (m->status ? m->n != 0 : m->n == 0)
        return errmsg_set(err, "coop kv: status %u with %u rows", m->status, m->n);
    if (!m->status && elen) return errmsg_set(err, "coop kv: an error text with status 0");
    if (elen > WIRE_COOP_ERR_LEN) return errmsg_set(err, "coop kv: %u-byte error", elen);
    const uint8_t *e = wire_get_bytes(&r, elen);
    for (uint16_t i = 0; i < elen; i++)
        m->error[i] = e[i] >= 0x20 && e[i] < 0x7f ? (char)e[i] : '?';
    m->error[elen] = 0;
    m->k_src = m->v_src = NULL;
    wire_get_u32(&r); /* the CRC, checked above */
    return r_done(&r, "coop kv", err);
}

void wire_coop_kv_elems(void *dst, const uint8_t *src, size_t count, uint8_t dtype)
{
    struct wire_r r = {src, count * kv_elt(dtype), 0, 0};
    if (dtype == WIRE_F32) {
        float *f = dst;
        for (size_t i = 0; i < count; i++) f[i] = wire_get_f32(&r);
    } else if (dtype == WIRE_F16) {
        uint16_t *h = dst;
        for (size_t i = 0; i < count; i++) h[i] = wire_get_u16(&r);
    }
}
