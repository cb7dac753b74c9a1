/* transport_rdma: messages over the authenticated TCP control channel, weights by one-sided RDMA
 * READ from the holder's registered arena (drivers/rdma).
 *
 * A connection is the TCP connection (transport_tcp.c, handshake and sealing included) plus one
 * RC queue pair. As soon as the TCP side is open, each end sends MSG_RDMA_INFO: its QPN, PSN and
 * GID, and the region it exposes (address, length, rkey). Only a node that passed the handshake
 * learns the rkey, so a node without the cluster key cannot read weights. When the peer's info
 * arrives the queue pair is connected (RTR, RTS) and the connection reports TP_OPEN; from then on
 * tp_pull() reads ranges of the peer's region into the local one without involving the peer's
 * CPU (the holder keeps serving). The arena is registered once per device (tp_expose). */
#include "drivers/rdma/rdma.h"
#include "os/common/errmsg.h"
#include "os/runtime/log.h"
#include "transport/transport.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define READ_TIMEOUT_MS 5000

struct rconn {
    struct tp_conn_base b;
    struct tp_conn *tc;
    struct rdma_qp *qp;
    struct rdma_qp_info local;
    struct wire_rdma_info remote;
    int info_sent, ready, server, reported;
    struct rconn *next;
};

struct rdma_tp {
    struct tp *tcp;
    struct rdma_dev *dev;
    struct rdma_region region;
    int exposed;
    struct rconn *conns;
};

static int rdma_tp_open(struct tp *t, char *err)
{
    struct rdma_tp *r = calloc(1, sizeof *r);
    if (!r) return errmsg_set(err, "out of memory");
    t->impl = r;
    struct tp_config c = t->cfg;
    c.kind = "tcp";
    r->tcp = tp_open(&c, err);
    if (!r->tcp) {
        free(r);
        t->impl = NULL;
        return -1;
    }
    if (rdma_open(&r->dev, t->cfg.rdma_dev, 1, err)) {
        tp_destroy(r->tcp);
        free(r);
        t->impl = NULL;
        return -1;
    }
    log_info("fabric", "rdma: device %s, control channel tcp %s", rdma_dev_name(r->dev),
             t->cfg.listen ? t->cfg.listen : "(client)");
    return 0;
}

static struct rconn *wrap(struct tp *t, struct tp_conn *tc, int server)
{
    struct rdma_tp *r = t->impl;
    struct rconn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->b.t = t;
    c->b.state = TP_CONNECTING;
    c->tc = tc;
    c->server = server;
    snprintf(c->b.peer, sizeof c->b.peer, "%s", tp_conn_peer(tc));
    c->next = r->conns;
    r->conns = c;
    return c;
}

static struct tp_conn *rdma_tp_connect(struct tp *t, const char *addr, char *err)
{
    struct rdma_tp *r = t->impl;
    struct tp_conn *tc = tp_connect(r->tcp, addr, err);
    if (!tc) return NULL;
    struct rconn *c = wrap(t, tc, 0);
    if (!c) {
        tp_close(tc);
        errmsg_set(err, "%s: out of memory", addr);
        return NULL;
    }
    return (struct tp_conn *)c;
}

static void fail(struct rconn *c, const char *why)
{
    if (c->b.state == TP_CLOSED) return;
    snprintf(c->b.err, sizeof c->b.err, "%s", why);
    c->b.state = TP_CLOSED;
}

/* Queue pair set-up over the control channel, before the connection is handed out. */
static void setup(struct tp *t, struct rconn *c)
{
    struct rdma_tp *r = t->impl;
    char err[ERRMSG_LEN];
    int st = tp_conn_state(c->tc);
    if (st == TP_CLOSED) {
        c->b.refused = ((struct tp_conn_base *)c->tc)->refused;
        return fail(c, tp_conn_error(c->tc));
    }
    if (st != TP_OPEN || c->ready) return;
    if (!c->qp && rdma_qp_create(r->dev, &c->qp, &c->local, err)) return fail(c, err);
    /* A holder that has not registered its region yet (a chain node still waiting for the
     * manifest) answers once it has, so its peer always learns a usable rkey. */
    if (!c->info_sent && c->server && !r->exposed) return;
    if (!c->info_sent) {
        struct wire_rdma_info i = {.qpn = c->local.qpn, .psn = c->local.psn, .lid = c->local.lid};
        memcpy(i.gid, c->local.gid, 16);
        if (r->exposed) {
            i.rkey = r->region.rkey;
            i.addr = r->region.addr;
            i.len = r->region.len;
        }
        uint8_t buf[WIRE_RDMA_INFO_LEN];
        size_t n = wire_rdma_info_encode(buf, sizeof buf, &i);
        int s = tp_send(c->tc, buf, n);
        if (s < 0) return fail(c, "control channel closed");
        if (s == TP_BUSY) return;
        c->info_sent = 1;
    }
    const uint8_t *msg;
    size_t len;
    int got = tp_recv(c->tc, &msg, &len);
    if (got < 0) return fail(c, tp_conn_error(c->tc));
    if (got == 0) return;
    if (wire_rdma_info_decode(&c->remote, msg, len, err)) return fail(c, err);
    struct rdma_qp_info ri = {c->remote.qpn, c->remote.psn, c->remote.lid, {0}};
    memcpy(ri.gid, c->remote.gid, 16);
    if (rdma_qp_connect(c->qp, &ri, err)) return fail(c, err);
    c->ready = 1;
    c->b.state = TP_OPEN;
}

static int rdma_tp_poll(struct tp *t, int timeout_ms)
{
    struct rdma_tp *r = t->impl;
    int n = tp_poll(r->tcp, timeout_ms);
    struct tp_conn *tc;
    while ((tc = tp_accept(r->tcp)))
        if (!wrap(t, tc, 1)) tp_close(tc);
    for (struct rconn *c = r->conns; c; c = c->next) {
        if (!c->ready)
            setup(t, c);
        else if (tp_conn_state(c->tc) == TP_CLOSED)
            fail(c, tp_conn_error(c->tc));
    }
    t->stats = r->tcp->stats;
    return n;
}

static struct tp_conn *rdma_tp_accept(struct tp *t)
{
    struct rdma_tp *r = t->impl;
    for (struct rconn *c = r->conns; c; c = c->next)
        if (c->server && c->ready && !c->reported) {
            c->reported = 1;
            return (struct tp_conn *)c;
        }
    return NULL;
}

static int rdma_tp_send(struct tp_conn *conn, const void *msg, size_t len)
{
    struct rconn *c = (struct rconn *)conn;
    if (c->b.state == TP_CLOSED) return -1;
    if (!c->ready) return TP_BUSY;
    return tp_send(c->tc, msg, len);
}

static int rdma_tp_recv(struct tp_conn *conn, const uint8_t **msg, size_t *len)
{
    struct rconn *c = (struct rconn *)conn;
    if (!c->ready) return c->b.state == TP_CLOSED ? -1 : 0;
    int r = tp_recv(c->tc, msg, len);
    if (r < 0) fail(c, tp_conn_error(c->tc));
    return r;
}

static size_t rdma_tp_pending(struct tp_conn *c)
{
    return tp_pending(((struct rconn *)c)->tc);
}

static void rdma_tp_close(struct tp_conn *conn)
{
    struct rconn *c = (struct rconn *)conn;
    struct rdma_tp *r = c->b.t->impl;
    for (struct rconn **pp = &r->conns; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    rdma_qp_destroy(c->qp);
    tp_close(c->tc);
    free(c);
}

static void rdma_tp_destroy(struct tp *t)
{
    struct rdma_tp *r = t->impl;
    if (!r) return;
    while (r->conns) rdma_tp_close((struct tp_conn *)r->conns);
    tp_destroy(r->tcp);
    rdma_close(r->dev);
    free(r);
}

static int rdma_tp_expose(struct tp *t, void *base, size_t len, char *err)
{
    struct rdma_tp *r = t->impl;
    if (r->exposed) {
        uint64_t a = (uint64_t)(uintptr_t)base;
        if (a >= r->region.addr && a + len <= r->region.addr + r->region.len) return 0;
        return errmsg_set(err, "rdma: a second region; the arena is registered once");
    }
    if (rdma_register(r->dev, base, len, &r->region, err)) return -1;
    r->exposed = 1;
    log_info("fabric", "rdma: registered %zu MiB once (rkey 0x%x)", len >> 20, r->region.rkey);
    return 0;
}

static int rdma_tp_pull(struct tp_conn *conn, uint64_t remote_off, void *dst, size_t len, char *err)
{
    struct rconn *c = (struct rconn *)conn;
    struct rdma_tp *r = c->b.t->impl;
    if (!c->ready) return errmsg_set(err, "rdma: %s: not connected", c->b.peer);
    if (!c->remote.rkey || remote_off > c->remote.len || len > c->remote.len - remote_off)
        return errmsg_set(err, "rdma: %s: read of [%llu, +%zu) outside the peer's %llu-byte region",
                          c->b.peer, (unsigned long long)remote_off, len,
                          (unsigned long long)c->remote.len);
    uint64_t a = (uint64_t)(uintptr_t)dst;
    if (!r->exposed || a < r->region.addr || a + len > r->region.addr + r->region.len)
        return errmsg_set(err, "rdma: destination outside the registered arena");
    if (rdma_read(c->qp, dst, len, c->remote.addr + remote_off, c->remote.rkey, READ_TIMEOUT_MS,
                  err)) {
        fail(c, err);
        return -1;
    }
    c->b.t->stats.bytes_rx += len;
    return 0;
}

const struct tp_ops tp_rdma_ops = {
    .name = "rdma",
    .open = rdma_tp_open,
    .connect = rdma_tp_connect,
    .accept = rdma_tp_accept,
    .poll = rdma_tp_poll,
    .send = rdma_tp_send,
    .recv = rdma_tp_recv,
    .pending = rdma_tp_pending,
    .close = rdma_tp_close,
    .destroy = rdma_tp_destroy,
    .expose = rdma_tp_expose,
    .pull = rdma_tp_pull,
};
