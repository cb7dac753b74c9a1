/* transport_dpdk: a reliable datagram protocol over UDP/IPv4 on a DPDK port (drivers/nic).
 *
 * Each application message is cut into fragments that fit one datagram; every fragment is a
 * sealed MSG frame with its own sequence number (WIRE_F_END on the last). The sender keeps each
 * sealed frame in a ring until it is acknowledged, sends at most `window` beyond the oldest
 * unacknowledged one, paces to rate_gbps, and retransmits a frame when its timer (srtt + 4 rttvar,
 * Karn's rule: no RTT samples from retransmissions) runs out or when the receiver's selective
 * acknowledgements show a hole that later frames have passed. The receiver opens every frame
 * before trusting any field, keeps out-of-order fragments in a window, delivers whole messages in
 * order, and answers with one sealed ACK (cumulative + WIRE_SACK_BITS of SACK bitmap) per poll
 * that received data, and every 100 ms as a keepalive. A peer silent for dead_ms is dead.
 *
 * Frames that fail the CRC or authentication, or come from no known connection, are dropped and
 * counted: a node without the key can neither join (HELLO MAC) nor inject data. The peer's MAC
 * address is learned from the authenticated handshake (the first HELLO goes to broadcast), so the
 * fabric needs no ARP of its own; ARP for the node's address belongs to the kernel on the
 * exception path.
 *
 * Test-only impairment (--impair loss=P,reorder=P,delay=MS,corrupt=P,forge=P; percentages): on
 * receive, drop, delay or reorder Strata datagrams (for kernels without sch_netem); on send,
 * flip a bit after the CRC (corrupt) or add a forged copy with a valid CRC but a bad tag (forge).
 */
#include "drivers/nic/nic.h"
#include "os/runtime/clock.h"
#include "os/common/errmsg.h"
#include "os/runtime/log.h"
#include "transport/crc32c.h"
#include "transport/transport.h"

#include <arpa/inet.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SQ_SLOTS      2048 /* sealed frames kept per connection (sent or waiting) */
#define RQ_SLOTS      1024 /* receive window in fragments */
#define MSGQ_LEN      64   /* whole messages waiting for tp_recv */
#define KEEPALIVE_S   0.1
#define HELLO_EVERY_S 0.1
#define RTO_MIN_S     0.010 /* the peer's fabric loop also verifies and copies: not a NIC's RTT */
#define ACK_EVERY     16    /* fragments between acknowledgements inside one receive burst */
#define RTO_MAX_S     0.25
#define MAX_IMPAIR    8192

struct sq_slot {
    uint8_t *frame;
    uint16_t len;
    uint8_t acked, tx_count, resend; /* resend: a SACK hole, send again now */
    double sent_at;
};

struct rq_slot {
    uint8_t *data;
    uint16_t len;
    uint8_t have, end;
};

struct dconn {
    struct tp_conn_base b;
    uint32_t peer_ip;
    uint16_t peer_port;
    uint8_t peer_mac[6];
    int mac_known, server, reported, closing_sent;
    uint8_t nonce[WIRE_NONCE_LEN];
    struct session s;
    uint8_t hello_ack[WIRE_HDR_LEN + WIRE_HELLO_ACK_LEN];
    double hello_next, hello_deadline;
    /* send */
    struct sq_slot *sq;
    uint8_t *sq_mem;
    uint64_t snd_una, snd_nxt, snd_end;
    double srtt, rttvar, rto, tokens, tok_last;
    /* receive */
    struct rq_slot *rq;
    uint8_t *rq_mem;
    uint64_t rcv_nxt;
    uint8_t *asm_buf;
    size_t asm_len;
    int asm_bad;
    uint8_t *msgq[MSGQ_LEN];
    size_t msgq_len[MSGQ_LEN];
    int mq_head, mq_count;
    uint8_t *delivered; /* the message tp_recv handed out last; freed on the next call */
    int ack_pending, unacked_rx;
    uint64_t ack_seq;
    double last_rx, last_ack_tx;
    int peer_closed;
    struct dconn *next;
};

struct impaired {
    uint8_t *frame;
    uint16_t len;
    uint32_t src_ip;
    uint16_t src_port;
    uint8_t src_mac[6];
    double at;
};

struct dpdk_tp {
    struct nic *nic;
    uint32_t ip_be;
    uint16_t port;
    size_t frag; /* plaintext bytes per fragment */
    size_t slot; /* bytes per sealed frame slot */
    uint32_t next_id;
    struct dconn *conns;
    uint8_t *scratch;
    int idle;
    /* impairment */
    double loss, reorder, delay, corrupt, forge;
    struct impaired *imp;
    int n_imp;
};

static int chance(double pct)
{
    return pct > 0 && randombytes_uniform(1000000) < (uint32_t)(pct * 10000);
}

static void conn_fail(struct dconn *c, const char *why)
{
    if (c->b.state == TP_CLOSED) return;
    snprintf(c->b.err, sizeof c->b.err, "%s: %s", c->b.peer, why);
    c->b.state = TP_CLOSED;
}

static int parse_impair(struct dpdk_tp *d, const char *spec, char *err)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *kv = strtok(buf, ","); kv; kv = strtok(NULL, ",")) {
        char *eq = strchr(kv, '=');
        if (!eq) return errmsg_set(err, "--impair: '%s' is not KEY=VALUE", kv);
        *eq = 0;
        double v = atof(eq + 1);
        if (!strcmp(kv, "loss"))
            d->loss = v;
        else if (!strcmp(kv, "reorder"))
            d->reorder = v;
        else if (!strcmp(kv, "delay"))
            d->delay = v * 1e-3;
        else if (!strcmp(kv, "corrupt"))
            d->corrupt = v;
        else if (!strcmp(kv, "forge"))
            d->forge = v;
        else
            return errmsg_set(err, "--impair: unknown key '%s'", kv);
    }
    return 0;
}

static int dpdk_open(struct tp *t, char *err)
{
    struct dpdk_tp *d = calloc(1, sizeof *d);
    if (!d) return errmsg_set(err, "out of memory");
    t->impl = d;
    if (!t->cfg.listen) return errmsg_set(err, "needs --listen IP:PORT (the node's own address)");
    if (tp_parse_addr(t->cfg.listen, &d->ip_be, &d->port, err)) return -1;
    if (t->cfg.impair && parse_impair(d, t->cfg.impair, err)) return -1;
    struct nic_config nc = {t->cfg.eal, t->cfg.exception_vdev, t->cfg.mtu, d->ip_be, d->port};
    if (nic_open(&d->nic, &nc, err)) return -1;
    d->frag = nic_max_payload(d->nic) - WIRE_HDR_LEN - WIRE_TAG_LEN;
    d->slot = WIRE_HDR_LEN + d->frag + WIRE_TAG_LEN;
    d->next_id = 1 + randombytes_uniform(1u << 20);
    d->scratch = malloc(d->slot);
    d->imp = calloc(MAX_IMPAIR, sizeof *d->imp);
    if (!d->scratch || !d->imp) return errmsg_set(err, "out of memory");
    uint8_t mac[6];
    nic_mac(d->nic, mac);
    log_info("fabric", "dpdk: %s on port %02x:%02x:%02x:%02x:%02x:%02x, %zu-byte fragments",
             t->cfg.listen, mac[0], mac[1], mac[2], mac[3], mac[4], mac[5], d->frag);
    return 0;
}

static struct dconn *conn_new(struct tp *t, uint32_t ip, uint16_t port)
{
    struct dpdk_tp *d = t->impl;
    struct dconn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->sq = calloc(SQ_SLOTS, sizeof *c->sq);
    c->sq_mem = malloc(SQ_SLOTS * d->slot);
    c->rq = calloc(RQ_SLOTS, sizeof *c->rq);
    c->rq_mem = malloc(RQ_SLOTS * d->frag);
    c->asm_buf = malloc(WIRE_MAX_MSG);
    if (!c->sq || !c->sq_mem || !c->rq || !c->rq_mem || !c->asm_buf) {
        free(c->sq), free(c->sq_mem), free(c->rq), free(c->rq_mem), free(c->asm_buf), free(c);
        return NULL;
    }
    for (int i = 0; i < SQ_SLOTS; i++) c->sq[i].frame = c->sq_mem + (size_t)i * d->slot;
    for (int i = 0; i < RQ_SLOTS; i++) c->rq[i].data = c->rq_mem + (size_t)i * d->frag;
    c->b.t = t;
    c->peer_ip = ip;
    c->peer_port = port;
    char a[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &ip, a, sizeof a);
    snprintf(c->b.peer, sizeof c->b.peer, "%s:%u", a, port);
    c->rto = 0.05;
    c->last_rx = clock_now();
    c->next = d->conns;
    d->conns = c;
    return c;
}

static void send_raw(struct dpdk_tp *d, struct dconn *c, const uint8_t *frame, size_t len)
{
    if (d->forge > 0 && len > WIRE_HDR_LEN + WIRE_TAG_LEN && chance(d->forge)) {
        /* A forged copy: same header, random "ciphertext", a CRC that matches it. */
        memcpy(d->scratch, frame, len);
        randombytes_buf(d->scratch + WIRE_HDR_LEN, len - WIRE_HDR_LEN);
        struct wire_hdr h;
        char err[ERRMSG_LEN];
        if (wire_hdr_decode(&h, d->scratch, len, err) == 0) {
            h.crc = crc32c(0, d->scratch + WIRE_HDR_LEN, h.length);
            wire_hdr_encode(d->scratch, &h);
            nic_tx(d->nic, c->mac_known ? c->peer_mac : NULL, c->peer_ip, c->peer_port, d->scratch,
                   len, NULL, 0);
        }
    }
    if (d->corrupt > 0 && chance(d->corrupt)) {
        memcpy(d->scratch, frame, len);
        d->scratch[WIRE_HDR_LEN + randombytes_uniform((uint32_t)(len - WIRE_HDR_LEN))] ^= 0x10;
        frame = d->scratch;
    }
    nic_tx(d->nic, c->mac_known ? c->peer_mac : NULL, c->peer_ip, c->peer_port, frame, len, NULL,
           0);
}

static struct tp_conn *dpdk_connect(struct tp *t, const char *addr, char *err)
{
    uint32_t ip;
    uint16_t port;
    if (tp_parse_addr(addr, &ip, &port, err)) return NULL;
    struct dconn *c = conn_new(t, ip, port);
    if (!c) {
        errmsg_set(err, "%s: out of memory", addr);
        return NULL;
    }
    c->b.state = TP_CONNECTING;
    c->hello_deadline = clock_now() + t->cfg.dead_ms * 1e-3;
    auth_nonce(c->nonce); /* one nonce per attempt: a repeated HELLO is recognised as such */
    return (struct tp_conn *)c;
}

static struct dconn *find_conn(struct dpdk_tp *d, uint32_t ip, uint16_t port, uint32_t id)
{
    for (struct dconn *c = d->conns; c; c = c->next)
        if (c->peer_ip == ip && c->peer_port == port && c->s.conn == id &&
            c->b.state != TP_CONNECTING)
            return c;
    return NULL;
}

/* ---- receive ---- */

static void push_message(struct dconn *c)
{
    uint8_t *m = malloc(c->asm_len ? c->asm_len : 1);
    if (!m) return conn_fail(c, "out of memory");
    memcpy(m, c->asm_buf, c->asm_len);
    int i = (c->mq_head + c->mq_count) % MSGQ_LEN;
    c->msgq[i] = m;
    c->msgq_len[i] = c->asm_len;
    c->mq_count++;
    c->asm_len = 0;
}

/* Deliver in-order fragments into whole messages while the message queue has room. */
static void deliver(struct dconn *c)
{
    struct tp *t = c->b.t;
    while (c->mq_count < MSGQ_LEN) {
        struct rq_slot *r = &c->rq[c->rcv_nxt % RQ_SLOTS];
        if (!r->have) break;
        if (c->asm_len + r->len > WIRE_MAX_MSG) {
            c->asm_bad = 1; /* a message larger than the limit: drop it whole */
        } else {
            memcpy(c->asm_buf + c->asm_len, r->data, r->len);
            c->asm_len += r->len;
        }
        r->have = 0;
        c->rcv_nxt++;
        if (r->end) {
            if (c->asm_bad) {
                t->stats.dropped_bad++;
                c->asm_len = 0;
                c->asm_bad = 0;
            } else {
                push_message(c);
                t->stats.frames_rx++;
            }
        }
    }
}

static void on_ack(struct dconn *c, const struct wire_ack *a)
{
    double t = clock_now();
    uint64_t cum = a->cum;
    if (cum > c->snd_nxt) return; /* acknowledges what was never sent: ignore */
    while (c->snd_una < cum) {
        struct sq_slot *s = &c->sq[c->snd_una % SQ_SLOTS];
        if (!s->acked && s->tx_count == 1 && !s->resend && c->snd_una + 1 == cum) {
            double rtt = t - s->sent_at;
            if (c->srtt == 0) {
                c->srtt = rtt;
                c->rttvar = rtt / 2;
            } else {
                c->rttvar = 0.75 * c->rttvar + 0.25 * fabs(c->srtt - rtt);
                c->srtt = 0.875 * c->srtt + 0.125 * rtt;
            }
            c->rto = c->srtt + 4 * c->rttvar;
            if (c->rto < RTO_MIN_S) c->rto = RTO_MIN_S;
            if (c->rto > RTO_MAX_S) c->rto = RTO_MAX_S;
        }
        s->acked = 1;
        c->snd_una++;
    }
    uint64_t highest = 0;
    for (int i = 0; i < WIRE_SACK_BITS; i++)
        if (a->sack[i / 64] >> (i % 64) & 1) {
            uint64_t seq = cum + 1 + (uint64_t)i;
            if (seq >= c->snd_nxt) break;
            if (seq < c->snd_una) continue; /* a stale, reordered ack: that slot is reused */
            c->sq[seq % SQ_SLOTS].acked = 1;
            highest = seq;
        }
    /* Holes that later frames have passed are lost (or badly reordered): resend them now
     * unless they were just resent. */
    for (uint64_t seq = c->snd_una; seq < highest; seq++) {
        struct sq_slot *s = &c->sq[seq % SQ_SLOTS];
        double guard = c->srtt > 0 ? c->srtt : c->rto;
        if (!s->acked && t - s->sent_at > guard) s->resend = 1;
    }
}

static void send_ack(struct dpdk_tp *d, struct dconn *c);

static void on_frame(struct tp *t, const uint8_t *frame, size_t len, uint32_t src_ip,
                     uint16_t src_port, const uint8_t *src_mac)
{
    struct dpdk_tp *d = t->impl;
    struct wire_hdr h;
    char err[ERRMSG_LEN];
    if (wire_frame_check(&h, frame, len, err)) {
        t->stats.dropped_bad++;
        return;
    }
    if (h.type == WIRE_HELLO) {
        uint8_t cn[WIRE_NONCE_LEN];
        if (auth_hello_check(&t->cfg.key, frame + WIRE_HDR_LEN, h.length, cn, err)) {
            if (t->stats.refused++ % 50 == 0) {
                char a[INET_ADDRSTRLEN];
                inet_ntop(AF_INET, &src_ip, a, sizeof a);
                log_warn("fabric", "refused %s:%u: %s", a, src_port, err);
            }
            return;
        }
        /* A repeated HELLO (our HELLO_ACK was lost) gets the same answer. */
        for (struct dconn *c = d->conns; c; c = c->next)
            if (c->server && c->peer_ip == src_ip && c->peer_port == src_port &&
                !memcmp(c->nonce, cn, WIRE_NONCE_LEN)) {
                send_raw(d, c, c->hello_ack, sizeof c->hello_ack);
                return;
            }
        struct dconn *c = conn_new(t, src_ip, src_port);
        if (!c) return;
        c->server = 1;
        memcpy(c->nonce, cn, WIRE_NONCE_LEN);
        memcpy(c->peer_mac, src_mac, 6);
        c->mac_known = 1;
        auth_hello_ack(&t->cfg.key, cn, d->next_id++, &c->s, c->hello_ack);
        c->b.state = TP_OPEN;
        send_raw(d, c, c->hello_ack, sizeof c->hello_ack);
        return;
    }
    if (h.type == WIRE_HELLO_ACK) {
        for (struct dconn *c = d->conns; c; c = c->next)
            if (!c->server && c->b.state == TP_CONNECTING && c->peer_ip == src_ip &&
                c->peer_port == src_port) {
                if (auth_hello_ack_check(&t->cfg.key, frame + WIRE_HDR_LEN, h.length, c->nonce,
                                         &c->s, err)) {
                    t->stats.refused++;
                    continue;
                }
                memcpy(c->peer_mac, src_mac, 6);
                c->mac_known = 1;
                c->b.state = TP_OPEN;
                c->last_rx = clock_now();
                return;
            }
        return;
    }
    struct dconn *c = find_conn(d, src_ip, src_port, h.conn);
    if (!c) {
        t->stats.dropped_dup++; /* a connection already closed here, or a stranger */
        return;
    }
    size_t ptlen;
    if (session_open(&c->s, frame, len, &h, d->scratch, &ptlen, err)) {
        t->stats.dropped_bad++;
        return;
    }
    c->last_rx = clock_now();
    if (h.type == WIRE_ACK) {
        struct wire_ack a;
        if (wire_ack_decode(&a, d->scratch, ptlen, err) == 0) on_ack(c, &a);
        return;
    }
    if (h.type == WIRE_CLOSE) {
        c->peer_closed = 1;
        return;
    }
    /* MSG fragment */
    c->ack_pending = 1;
    if (h.seq < c->rcv_nxt || h.seq >= c->rcv_nxt + RQ_SLOTS || ptlen > d->frag) {
        t->stats.dropped_dup++;
        return;
    }
    struct rq_slot *r = &c->rq[h.seq % RQ_SLOTS];
    if (r->have) {
        t->stats.dropped_dup++;
        return;
    }
    memcpy(r->data, d->scratch, ptlen);
    r->len = (uint16_t)ptlen;
    r->end = !!(h.flags & WIRE_F_END);
    r->have = 1;
    deliver(c);
    if (++c->unacked_rx >= ACK_EVERY) send_ack(d, c);
}

static void send_ack(struct dpdk_tp *d, struct dconn *c)
{
    struct wire_ack a;
    memset(&a, 0, sizeof a);
    a.cum = c->rcv_nxt;
    for (int i = 0; i < WIRE_SACK_BITS && i + 1 < RQ_SLOTS; i++)
        if (c->rq[(c->rcv_nxt + 1 + (uint64_t)i) % RQ_SLOTS].have)
            a.sack[i / 64] |= 1ull << (i % 64);
    uint8_t pt[WIRE_ACK_LEN], frame[WIRE_HDR_LEN + WIRE_ACK_LEN + WIRE_TAG_LEN];
    wire_ack_encode(pt, sizeof pt, &a);
    size_t n = session_seal(&c->s, frame, WIRE_ACK, 0, c->ack_seq++, pt, sizeof pt);
    send_raw(d, c, frame, n);
    c->ack_pending = 0;
    c->unacked_rx = 0;
    c->last_ack_tx = clock_now();
}

/* ---- send ---- */

static int dpdk_send(struct tp_conn *conn, const void *msg, size_t len)
{
    struct dconn *c = (struct dconn *)conn;
    struct dpdk_tp *d = c->b.t->impl;
    if (c->b.state == TP_CLOSED || c->peer_closed) return -1;
    if (c->b.state != TP_OPEN) return TP_BUSY;
    if (len > WIRE_MAX_MSG) return -1;
    size_t nfrag = len ? (len + d->frag - 1) / d->frag : 1;
    if (c->snd_end + nfrag - c->snd_una > SQ_SLOTS) return TP_BUSY;
    const uint8_t *p = msg;
    for (size_t i = 0; i < nfrag; i++) {
        size_t n = len - i * d->frag < d->frag ? len - i * d->frag : d->frag;
        struct sq_slot *s = &c->sq[c->snd_end % SQ_SLOTS];
        s->len = (uint16_t)session_seal(&c->s, s->frame, WIRE_MSG, i + 1 == nfrag ? WIRE_F_END : 0,
                                        c->snd_end, p + i * d->frag, n);
        s->acked = 0;
        s->resend = 0;
        s->tx_count = 0;
        s->sent_at = 0;
        c->snd_end++;
    }
    c->b.t->stats.frames_tx++;
    return TP_OK;
}

static int transmit(struct tp *t, struct dconn *c, double now)
{
    struct dpdk_tp *d = t->impl;
    int sent = 0;
    double rate = t->cfg.rate_gbps * 1e9 / 8;
    if (rate > 0) {
        c->tokens += (now - c->tok_last) * rate;
        double cap = 32.0 * d->slot;
        if (c->tokens > cap) c->tokens = cap;
        c->tok_last = now;
    }
    /* Timed-out or SACK-marked frames first, then new ones inside the window. */
    for (uint64_t seq = c->snd_una; seq < c->snd_nxt; seq++) {
        struct sq_slot *s = &c->sq[seq % SQ_SLOTS];
        if (s->acked || (!s->resend && now - s->sent_at < c->rto)) continue;
        if (rate > 0 && c->tokens < s->len) return sent;
        send_raw(d, c, s->frame, s->len);
        if (s->tx_count < 255) s->tx_count++;
        s->resend = 0;
        s->sent_at = now;
        c->tokens -= s->len;
        t->stats.retransmits++;
        sent++;
        if (sent > 64) return sent;
    }
    while (c->snd_nxt < c->snd_end && c->snd_nxt - c->snd_una < (uint64_t)t->cfg.window) {
        struct sq_slot *s = &c->sq[c->snd_nxt % SQ_SLOTS];
        if (rate > 0 && c->tokens < s->len) break;
        send_raw(d, c, s->frame, s->len);
        s->tx_count = 1;
        s->sent_at = now;
        c->tokens -= s->len;
        c->snd_nxt++;
        sent++;
        if (sent > 128) break;
    }
    return sent;
}

static void handle_rx(struct tp *t, const uint8_t *data, size_t len, uint32_t ip, uint16_t port,
                      const uint8_t *mac, double now)
{
    struct dpdk_tp *d = t->impl;
    if (d->loss <= 0 && d->reorder <= 0 && d->delay <= 0)
        return on_frame(t, data, len, ip, port, mac);
    if (chance(d->loss)) return;
    if (d->n_imp == MAX_IMPAIR) return;
    struct impaired *q = &d->imp[d->n_imp];
    q->frame = malloc(len);
    if (!q->frame) return;
    memcpy(q->frame, data, len);
    q->len = (uint16_t)len;
    q->src_ip = ip;
    q->src_port = port;
    memcpy(q->src_mac, mac, 6);
    q->at = now + d->delay + (chance(d->reorder) ? d->delay + 0.001 : 0);
    d->n_imp++;
}

static int dpdk_poll(struct tp *t, int timeout_ms)
{
    struct dpdk_tp *d = t->impl;
    struct nic_dgram g[32];
    int work = 0;
    double now = clock_now();
    for (int round = 0; round < 8; round++) {
        int k = nic_rx(d->nic, g, 32);
        for (int i = 0; i < k; i++) {
            t->stats.bytes_rx += g[i].len;
            handle_rx(t, g[i].data, g[i].len, g[i].src_ip_be, g[i].src_port, g[i].src_mac, now);
        }
        nic_rx_done(d->nic, g, k);
        work += k;
        if (k < 32) break;
    }
    for (int i = 0; i < d->n_imp; i++)
        if (d->imp[i].at <= now) {
            struct impaired q = d->imp[i];
            d->imp[i--] = d->imp[--d->n_imp];
            on_frame(t, q.frame, q.len, q.src_ip, q.src_port, q.src_mac);
            free(q.frame);
            work++;
        }
    /* Serving connections first; bulk (weight) connections send only when no serving
     * connection still has frames waiting inside its window. ACKs and keepalives always go. */
    int serving_backlog = 0;
    for (int pass = 0; pass < 2; pass++)
        for (struct dconn *c = d->conns; c; c = c->next) {
            if (c->b.bulk != pass) continue;
            if (c->b.state == TP_CONNECTING && !c->server) {
                if (now > c->hello_deadline) {
                    conn_fail(c, "no answer to HELLO (peer down, or it has another cluster key)");
                    continue;
                }
                if (now >= c->hello_next) {
                    uint8_t f[WIRE_HDR_LEN + WIRE_HELLO_LEN];
                    auth_hello(&t->cfg.key, c->nonce, f);
                    send_raw(d, c, f, sizeof f);
                    c->hello_next = now + HELLO_EVERY_S;
                }
                continue;
            }
            if (c->b.state != TP_OPEN) continue;
            if (!c->b.bulk || !serving_backlog) work += transmit(t, c, now);
            if (!c->b.bulk && c->snd_nxt < c->snd_end &&
                c->snd_nxt - c->snd_una < (uint64_t)t->cfg.window)
                serving_backlog = 1;
            if (c->ack_pending || now - c->last_ack_tx > KEEPALIVE_S) send_ack(d, c);
            if (c->peer_closed && c->mq_count == 0) conn_fail(c, "peer closed the connection");
            if (now - c->last_rx > t->cfg.dead_ms * 1e-3) {
                char why[64];
                snprintf(why, sizeof why, "peer silent for %d ms", t->cfg.dead_ms);
                conn_fail(c, why);
            }
        }
    nic_flush(d->nic);
    t->stats.frames_tx += 0;
    /* Poll mode on two shared cores: back off when idle instead of spinning. */
    if (work) {
        d->idle = 0;
    } else if (timeout_ms > 0 && ++d->idle > 64) {
        usleep(d->idle > 4096 ? 500 : 50);
    }
    return work;
}

static struct tp_conn *dpdk_accept(struct tp *t)
{
    struct dpdk_tp *d = t->impl;
    for (struct dconn *c = d->conns; c; c = c->next)
        if (c->server && c->b.state == TP_OPEN && !c->reported) {
            c->reported = 1;
            return (struct tp_conn *)c;
        }
    return NULL;
}

static int dpdk_recv(struct tp_conn *conn, const uint8_t **msg, size_t *len)
{
    struct dconn *c = (struct dconn *)conn;
    free(c->delivered);
    c->delivered = NULL;
    if (c->mq_count) {
        c->delivered = c->msgq[c->mq_head];
        *msg = c->delivered;
        *len = c->msgq_len[c->mq_head];
        c->mq_head = (c->mq_head + 1) % MSGQ_LEN;
        c->mq_count--;
        deliver(c); /* room again for fragments that waited */
        return 1;
    }
    return c->b.state == TP_CLOSED ? -1 : 0;
}

static size_t dpdk_pending(struct tp_conn *conn)
{
    struct dconn *c = (struct dconn *)conn;
    if (c->b.state == TP_CLOSED) return 0;
    return (size_t)(c->snd_end - c->snd_una);
}

static void conn_free(struct dconn *c)
{
    if (getenv("STRATA_RDP_DEBUG"))
        log_info("fabric", "%s: srtt %.2f ms rttvar %.2f ms rto %.2f ms", c->b.peer, c->srtt * 1e3,
                 c->rttvar * 1e3, c->rto * 1e3);
    for (int i = 0; i < c->mq_count; i++) free(c->msgq[(c->mq_head + i) % MSGQ_LEN]);
    free(c->delivered);
    free(c->sq), free(c->sq_mem), free(c->rq), free(c->rq_mem), free(c->asm_buf), free(c);
}

static void dpdk_close(struct tp_conn *conn)
{
    struct dconn *c = (struct dconn *)conn;
    struct dpdk_tp *d = c->b.t->impl;
    if (c->b.state == TP_OPEN && !c->peer_closed) {
        uint8_t f[WIRE_HDR_LEN + WIRE_TAG_LEN];
        /* Twice, as a courtesy against loss; a peer that misses both times out. */
        size_t n = session_seal(&c->s, f, WIRE_CLOSE, 0, c->ack_seq++, NULL, 0);
        send_raw(d, c, f, n);
        n = session_seal(&c->s, f, WIRE_CLOSE, 0, c->ack_seq++, NULL, 0);
        send_raw(d, c, f, n);
        nic_flush(d->nic);
    }
    for (struct dconn **pp = &d->conns; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    conn_free(c);
}

static void dpdk_destroy(struct tp *t)
{
    struct dpdk_tp *d = t->impl;
    if (!d) return;
    while (d->conns) dpdk_close((struct tp_conn *)d->conns);
    if (d->nic) {
        const struct nic_stats *s = nic_stats(d->nic);
        log_info("fabric", "dpdk: rx %llu tx %llu frames, tx dropped %llu, other %llu, own %llu",
                 (unsigned long long)s->rx_pkts, (unsigned long long)s->tx_pkts,
                 (unsigned long long)s->tx_dropped, (unsigned long long)s->rx_other,
                 (unsigned long long)s->rx_own);
        nic_close(d->nic);
    }
    for (int i = 0; i < d->n_imp; i++) free(d->imp[i].frame);
    free(d->imp);
    free(d->scratch);
    free(d);
}

static int dpdk_expose(struct tp *t, void *base, size_t len, char *err)
{
    struct dpdk_tp *d = t->impl;
    if (nic_register_memory(d->nic, base, len, (size_t)sysconf(_SC_PAGESIZE), err)) return -1;
    log_info("fabric", "dpdk: arena registered once (%zu MiB, rte_extmem_register)", len >> 20);
    return 0;
}

const struct tp_ops tp_dpdk_ops = {
    .name = "dpdk",
    .open = dpdk_open,
    .connect = dpdk_connect,
    .accept = dpdk_accept,
    .poll = dpdk_poll,
    .send = dpdk_send,
    .recv = dpdk_recv,
    .pending = dpdk_pending,
    .close = dpdk_close,
    .destroy = dpdk_destroy,
    .expose = dpdk_expose,
};
