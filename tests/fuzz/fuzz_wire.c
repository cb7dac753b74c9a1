/* libFuzzer target for every fabric decoder: frame header and CRC check, sealed-frame opening,
 * handshake bodies (the fabric's and the control plane's, with node ids), and each application message (the coop messages included: activations, with
 * values or token rows only, tokens, open, close, KV request of several sequences and KV chunk). The first byte picks the decoder; the round-trip
 * case (9) re-encodes whatever decodes and wants the same bytes. */
#include "os/common/errmsg.h"
#include "transport/auth.h"
#include "transport/wire.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static struct wire_manifest man;
static struct wire_join join;
static uint8_t pt[WIRE_MAX_MSG];
static uint8_t kv_k[WIRE_MAX_MSG], kv_v[WIRE_MAX_MSG];

/* A KV chunk's rows lie inside the message and convert; returns them ready to re-encode. */
static void kv_rows(struct wire_coop_kv *c, const uint8_t *p, size_t n)
{
    size_t count = (size_t)c->n * c->kv_dim, elt = c->dtype == WIRE_F32 ? 4 : 2;
    if (c->n && (c->k < p || c->v + count * elt > p + n || 2 * count * elt > sizeof kv_k)) abort();
    wire_coop_kv_elems(kv_k, c->k, count, c->dtype);
    wire_coop_kv_elems(kv_v, c->v, count, c->dtype);
    c->k_src = kv_k, c->v_src = kv_v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[ERRMSG_LEN];
    if (size < 1) return 0;
    uint8_t sel = data[0];
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    struct wire_hdr h;
    switch (sel % 10) {
    case 0:
        wire_frame_check(&h, p, n, err);
        break;
    case 1:
        wire_hdr_peek(&h, p, n, err);
        break;
    case 2:
        wire_manifest_decode(&man, p, n, err);
        break;
    case 3:
        wire_join_decode(&join, p, n, err);
        break;
    case 4: {
        struct wire_chunk c;
        if (wire_chunk_decode(&c, p, n, err) == 0 && c.len && c.data[c.len - 1] == 0xEE) pt[0] = 1;
        break;
    }
    case 5: {
        struct wire_ack a;
        wire_ack_decode(&a, p, n, err);
        uint32_t u;
        wire_refetch_decode(&u, p, n, err);
        wire_done_decode(p, n, err);
        break;
    }
    case 6: {
        struct wire_rdma_info i;
        wire_rdma_info_decode(&i, p, n, err);
        static uint32_t seq[WIRE_MAX_ACT_TOKENS], pos[WIRE_MAX_ACT_TOKENS],
            tok[WIRE_MAX_ACT_TOKENS];
        static uint8_t fl[WIRE_MAX_ACT_TOKENS];
        static float x[1 << 16];
        struct wire_activations a;
        wire_activations_decode(&a, p, n, seq, pos, tok, fl, x, WIRE_MAX_ACT_TOKENS, 1 << 16, err);
        static struct wire_coop_token tk[WIRE_MAX_ACT_TOKENS];
        struct wire_coop_tokens t;
        wire_coop_tokens_decode(&t, p, n, tk, WIRE_MAX_ACT_TOKENS, err);
        struct wire_coop_open o;
        wire_coop_open_decode(&o, p, n, err);
        uint32_t cn;
        wire_coop_close_decode(p, n, seq, WIRE_MAX_ACT_TOKENS, &cn, err);
        struct wire_coop_kv_req q;
        static uint32_t qs[WIRE_COOP_KV_MAX_SEQS], qn[WIRE_COOP_KV_MAX_SEQS];
        if (wire_coop_kv_req_decode(&q, p, n, qs, qn, WIRE_COOP_KV_MAX_SEQS, err) == 0 &&
            (q.count == 0 || q.seq != qs || q.n != qn))
            abort();
        wire_coop_kv_req_decode(&q, p, n, qs, qn, 3, err); /* a receiver with room for 3 */
        struct wire_coop_kv c;
        if (wire_coop_kv_decode(&c, p, n, err) == 0) kv_rows(&c, p, n);
        break;
    }
    case 7: {
        static struct session s;
        static int init;
        if (!init) {
            auth_init(err);
            memset(&s, 0, sizeof s);
            init = 1;
        }
        size_t ptlen;
        session_open(&s, p, n, &h, pt, &ptlen, err);
        break;
    }
    case 8: {
        static struct cluster_key k;
        uint8_t nonce[WIRE_NONCE_LEN];
        struct session s;
        uint64_t id;
        auth_hello_check(&k, p, n, nonce, err);
        auth_hello_ack_check(&k, p, n, nonce, &s, err);
        auth_hello_id_check(&k, p, n, nonce, &id, err);
        auth_hello_id_ack_check(&k, p, n, nonce, 3, 0, &id, &s, err);
        break;
    }
    default: {
        /* Round trip: whatever decodes must re-encode to the same bytes. */
        static uint8_t out[WIRE_MAX_MSG];
        if (wire_manifest_decode(&man, p, n, err) == 0) {
            size_t m = wire_manifest_encode(out, sizeof out, &man);
            if (m != n || memcmp(out, p, n)) abort();
        }
        if (wire_join_decode(&join, p, n, err) == 0) {
            size_t m = wire_join_encode(out, sizeof out, &join);
            if (m != n || memcmp(out, p, n)) abort();
        }
        /* token rows (no values) re-encode exactly; value rows need not (fp16 NaN payloads) */
        static uint32_t rseq[WIRE_MAX_ACT_TOKENS], rpos[WIRE_MAX_ACT_TOKENS],
            rtok[WIRE_MAX_ACT_TOKENS];
        static uint8_t rfl[WIRE_MAX_ACT_TOKENS];
        struct wire_activations a;
        if (wire_activations_decode(&a, p, n, rseq, rpos, rtok, rfl, NULL, WIRE_MAX_ACT_TOKENS, 0,
                                    err) == 0) {
            /* cap_x 0: only token rows (at layer 0) or no rows decode */
            if (a.n && (a.dtype != WIRE_TOKENS || a.layer != 0)) abort();
            size_t m = wire_activations_encode(out, sizeof out, &a);
            if (m != n || memcmp(out, p, n)) abort();
        }
        struct wire_coop_kv_req q;
        static uint32_t rqs[WIRE_COOP_KV_MAX_SEQS], rqn[WIRE_COOP_KV_MAX_SEQS];
        if (wire_coop_kv_req_decode(&q, p, n, rqs, rqn, WIRE_COOP_KV_MAX_SEQS, err) == 0) {
            size_t m = wire_coop_kv_req_encode(out, sizeof out, &q);
            if (m != n || memcmp(out, p, n)) abort();
        }
        struct wire_coop_kv c;
        if (wire_coop_kv_decode(&c, p, n, err) == 0) {
            kv_rows(&c, p, n);
            size_t m = wire_coop_kv_encode(out, sizeof out, &c);
            if (m != n || memcmp(out, p, n)) abort();
        }
        break;
    }
    }
    return 0;
}
