#include "cluster/raft_transport.h"

#include "cluster/cluster_cmd.h"
#include "os/common/errmsg.h"
#include "os/runtime/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rt_connect {
    struct rt *rt;
    struct raft_uv_connect *req;
    raft_uv_connect_cb cb;
    struct sconn *c;
    struct rt_connect *next;
};

struct rt {
    struct raft_transport_cfg cfg;
    struct raft_uv_transport *t;
    char bind[64], address[64];
    raft_id id;
    struct slisten lis;
    int listening, closing;
    raft_uv_accept_cb accept_cb;
    raft_uv_transport_close_cb close_cb;
    struct rt_connect *pending;
};

/* ---------------------------------------------------------------- incoming */

static void first_msg(struct sconn *c, const uint8_t *msg, size_t len)
{
    struct rt *rt = c->data;
    struct cl_msg m;
    char err[ERRMSG_LEN];
    if (rt->closing) return sealed_conn_close(c, "transport closing");
    if (cluster_cmd_msg_decode(&m, msg, len, err) || m.type != MSGC_OPEN) {
        log_warn("cluster", "%s: first message is not OPEN: %s", c->peer,
                 m.type != MSGC_OPEN ? "wrong type" : err);
        return sealed_conn_close(c, "protocol error");
    }
    /* The handshake proved who this is: an OPEN in another node's name is refused. */
    if (m.u.open.id != c->peer_id) {
        log_warn("cluster", "%s: OPEN in the name of node %llu from node %llu: refused", c->peer,
                 (unsigned long long)m.u.open.id, (unsigned long long)c->peer_id);
        if (rt->cfg.on_impostor) rt->cfg.on_impostor(rt->cfg.ctx);
        return sealed_conn_close(c, "OPEN claims another node's id");
    }
    if (m.u.open.channel == CHAN_CTL) {
        c->data = NULL;
        c->cb = (struct sconn_cbs){0};
        if (!rt->cfg.on_ctl) return sealed_conn_close(c, "no control handler");
        return rt->cfg.on_ctl(rt->cfg.ctx, c, m.u.open.id, m.u.open.addr);
    }
    if (m.u.open.channel == CHAN_FWD) {
        c->data = NULL;
        c->cb = (struct sconn_cbs){0};
        if (!rt->cfg.on_fwd) return sealed_conn_close(c, "no forward handler");
        return rt->cfg.on_fwd(rt->cfg.ctx, c, m.u.open.id, m.u.open.addr);
    }
    uv_stream_t *s = sealed_conn_relay(c, raft_malloc, err);
    if (!s) {
        log_warn("cluster", "%s", err);
        return sealed_conn_close(c, "relay failed");
    }
    c->data = NULL;
    c->cb = (struct sconn_cbs){0};
    rt->accept_cb(rt->t, m.u.open.id, m.u.open.addr, s);
}

static void on_accept(struct slisten *l, struct sconn *c)
{
    struct rt *rt = l->data;
    c->data = rt;
    c->cb.on_msg = first_msg;
}

static void on_refused(struct slisten *l, const char *peer, const char *why, int timed_out)
{
    struct rt *rt = l->data;
    if (rt->cfg.on_refused) rt->cfg.on_refused(rt->cfg.ctx, peer, why, timed_out);
}

/* ---------------------------------------------------------------- outgoing */

static void connect_finish(struct rt_connect *rc, uv_stream_t *s, int status)
{
    struct rt *rt = rc->rt;
    for (struct rt_connect **p = &rt->pending; *p; p = &(*p)->next)
        if (*p == rc) {
            *p = rc->next;
            break;
        }
    if (rc->c) {
        rc->c->data = NULL;
        rc->c->cb = (struct sconn_cbs){0};
    }
    rc->cb(rc->req, s, status);
    free(rc);
}

static void connect_ready(struct sconn *c, int status, const char *why)
{
    struct rt_connect *rc = c->data;
    struct rt *rt = rc->rt;
    char err[ERRMSG_LEN];
    (void)why; /* raft retries every second: no log line per attempt */
    if (status) {
        return connect_finish(rc, NULL, rt->closing ? RAFT_CANCELED : RAFT_NOCONNECTION);
    }
    struct cl_msg m = {.type = MSGC_OPEN};
    m.u.open.channel = CHAN_RAFT;
    m.u.open.id = rt->id;
    snprintf(m.u.open.addr, sizeof m.u.open.addr, "%s", rt->address);
    uint8_t buf[128];
    size_t n = cluster_cmd_msg_encode(buf, sizeof buf, &m);
    uv_stream_t *s =
        n && !sealed_conn_send(c, buf, n) ? sealed_conn_relay(c, raft_malloc, err) : NULL;
    if (!s) {
        sealed_conn_close(c, "cannot open the raft channel");
        return;
    }
    connect_finish(rc, s, 0);
}

static void connect_closed(struct sconn *c, const char *why)
{
    struct rt_connect *rc = c->data;
    (void)why;
    if (rc) connect_finish(rc, NULL, rc->rt->closing ? RAFT_CANCELED : RAFT_NOCONNECTION);
}

static int rt_connect(struct raft_uv_transport *t, struct raft_uv_connect *req, raft_id id,
                      const char *address, raft_uv_connect_cb cb)
{
    struct rt *rt = t->impl;
    if (rt->closing) return RAFT_CANCELED;
    struct rt_connect *rc = calloc(1, sizeof *rc);
    if (!rc) return RAFT_NOMEM;
    *rc = (struct rt_connect){.rt = rt, .req = req, .cb = cb};
    struct sconn_cbs cbs = {.on_ready = connect_ready, .on_close = connect_closed};
    char err[ERRMSG_LEN];
    rc->c = sealed_conn_connect(rt->cfg.loop, rt->cfg.key, rt->id, id, address, &cbs, rc, err);
    if (!rc->c) {
        snprintf(t->errmsg, sizeof t->errmsg, "%.200s", err);
        free(rc);
        return RAFT_NOCONNECTION;
    }
    rc->next = rt->pending;
    rt->pending = rc;
    return 0;
}

/* ---------------------------------------------------------------- lifecycle */

static int rt_init(struct raft_uv_transport *t, raft_id id, const char *address)
{
    struct rt *rt = t->impl;
    rt->id = id;
    snprintf(rt->address, sizeof rt->address, "%s", address);
    if (!rt->bind[0]) snprintf(rt->bind, sizeof rt->bind, "%s", address);
    return 0;
}

static int rt_listen(struct raft_uv_transport *t, raft_uv_accept_cb cb)
{
    struct rt *rt = t->impl;
    char err[ERRMSG_LEN];
    rt->accept_cb = cb;
    rt->lis = (struct slisten){.data = rt,
                               .key = rt->cfg.key,
                               .id = rt->id,
                               .handshake_ms = rt->cfg.handshake_ms,
                               .on_accept = on_accept,
                               .on_refused = on_refused};
    if (slisten_start(&rt->lis, rt->cfg.loop, rt->bind, err)) {
        snprintf(t->errmsg, sizeof t->errmsg, "%.200s", err);
        return RAFT_IOERR;
    }
    rt->listening = 1;
    return 0;
}

static void listener_closed(uv_handle_t *h)
{
    struct rt *rt = ((struct slisten *)h->data)->data;
    if (rt->close_cb) rt->close_cb(rt->t);
}

static void rt_close(struct raft_uv_transport *t, raft_uv_transport_close_cb cb)
{
    struct rt *rt = t->impl;
    rt->closing = 1;
    rt->close_cb = cb;
    struct rt_connect *rc;
    while ((rc = rt->pending)) {
        struct sconn *c = rc->c;
        connect_finish(rc, NULL, RAFT_CANCELED); /* detaches c first */
        sealed_conn_close(c, "transport closing");
    }
    if (rt->listening) {
        rt->listening = 0;
        slisten_stop(&rt->lis, listener_closed);
    } else if (cb) {
        cb(t);
    }
}

int raft_transport_init(struct raft_uv_transport *t, const struct raft_transport_cfg *cfg,
                        char *err)
{
    struct rt *rt = calloc(1, sizeof *rt);
    if (!rt) return errmsg_set(err, "raft transport: out of memory");
    rt->cfg = *cfg;
    rt->t = t;
    if (cfg->bind) snprintf(rt->bind, sizeof rt->bind, "%s", cfg->bind);
    memset(t, 0, sizeof *t);
    t->impl = rt;
    t->init = rt_init;
    t->listen = rt_listen;
    t->connect = rt_connect;
    t->close = rt_close;
    return 0;
}

void raft_transport_free(struct raft_uv_transport *t)
{
    free(t->impl);
    t->impl = NULL;
}
