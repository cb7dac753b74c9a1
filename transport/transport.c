#include "transport/transport.h"

#include "os/common/errmsg.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct tp_ops *find_ops(const char *kind)
{
    if (!kind || !strcmp(kind, "tcp")) return &tp_tcp_ops;
    if (!strcmp(kind, "dpdk")) return &tp_dpdk_ops;
    if (!strcmp(kind, "rdma")) return &tp_rdma_ops;
    return NULL;
}

struct tp *tp_open(const struct tp_config *cfg, char *err)
{
    const struct tp_ops *ops = find_ops(cfg->kind);
    if (!ops) {
        errmsg_set(err, "transport: unknown kind '%s' (tcp, dpdk, rdma)", cfg->kind);
        return NULL;
    }
    struct tp *t = calloc(1, sizeof *t);
    if (!t) {
        errmsg_set(err, "transport: out of memory");
        return NULL;
    }
    t->ops = ops;
    t->cfg = *cfg;
    if (t->cfg.dead_ms <= 0) t->cfg.dead_ms = 2000;
    if (t->cfg.mtu <= 0) t->cfg.mtu = 1500;
    if (t->cfg.window <= 0) t->cfg.window = 256;
    if (ops->open(t, err)) {
        errmsg_prefix(err, "transport %s: ", ops->name);
        if (t->impl) ops->destroy(t); /* what the backend set up before it failed */
        free(t);
        return NULL;
    }
    return t;
}

void tp_destroy(struct tp *t)
{
    if (!t) return;
    t->ops->destroy(t);
    free(t);
}

struct tp_conn *tp_connect(struct tp *t, const char *addr, char *err)
{
    return t->ops->connect(t, addr, err);
}

struct tp_conn *tp_accept(struct tp *t)
{
    return t->ops->accept(t);
}

int tp_poll(struct tp *t, int timeout_ms)
{
    return t->ops->poll(t, timeout_ms);
}

#define OPS(c) (((struct tp_conn_base *)(c))->t->ops)

int tp_send(struct tp_conn *c, const void *msg, size_t len)
{
    return OPS(c)->send(c, msg, len);
}

int tp_recv(struct tp_conn *c, const uint8_t **msg, size_t *len)
{
    return OPS(c)->recv(c, msg, len);
}

int tp_conn_state(struct tp_conn *c)
{
    return ((struct tp_conn_base *)c)->state;
}

const char *tp_conn_error(struct tp_conn *c)
{
    return ((struct tp_conn_base *)c)->err;
}

const char *tp_conn_peer(struct tp_conn *c)
{
    return ((struct tp_conn_base *)c)->peer;
}

size_t tp_pending(struct tp_conn *c)
{
    return OPS(c)->pending(c);
}

void tp_close(struct tp_conn *c)
{
    if (c) OPS(c)->close(c);
}

int tp_expose(struct tp *t, void *base, size_t len, char *err)
{
    if (!t->ops->expose) return errmsg_set(err, "transport %s: no one-sided access", t->ops->name);
    return t->ops->expose(t, base, len, err);
}

int tp_pull(struct tp_conn *c, uint64_t remote_off, void *dst, size_t len, char *err)
{
    if (!OPS(c)->pull) return errmsg_set(err, "transport %s: no one-sided access", OPS(c)->name);
    return OPS(c)->pull(c, remote_off, dst, len, err);
}

int tp_can_expose(const struct tp *t)
{
    return t->ops->expose != NULL;
}

int tp_can_pull(const struct tp *t)
{
    return t->ops->pull != NULL;
}

int tp_parse_addr(const char *s, uint32_t *ip_be, uint16_t *port, char *err)
{
    char host[64];
    const char *colon = strrchr(s, ':');
    if (!colon || (size_t)(colon - s) >= sizeof host)
        return errmsg_set(err, "address '%s': expected IP:PORT", s);
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = 0;
    struct in_addr a;
    if (inet_pton(AF_INET, host, &a) != 1)
        return errmsg_set(err, "address '%s': bad IPv4 address", s);
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || p <= 0 || p > 65535) return errmsg_set(err, "address '%s': bad port", s);
    *ip_be = a.s_addr;
    *port = (uint16_t)p;
    return 0;
}

void tp_set_bulk(struct tp_conn *c)
{
    struct tp_conn_base *b = (struct tp_conn_base *)c;
    b->bulk = 1;
    if (b->t->ops->set_bulk) b->t->ops->set_bulk(c);
}
