#include "cluster/fabric_node.h"

#include "os/common/errmsg.h"
#include "os/runtime/clock.h"
#include "os/runtime/log.h"
#include "transport/wire.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_HANDLERS  256
#define MAX_OBSERVERS 8

struct out_msg {
    struct out_msg *next;
    int peer;
    size_t len;
    uint8_t bytes[];
};

struct peer {
    struct tp_conn *conn;
    const char *addr; /* configured and dialed peers: where to (re)connect */
    char dialed[64];  /* a dialed peer's address (fabric_node_dial): addr points here */
    int used;         /* slot taken (configured, or an accepted connection) */
    int reported;     /* state last told to observers */
    int adopted;      /* a module owns the connection now */
    int warned;       /* a failed (re)connection was logged: quiet until it opens again */
    double next_try;
    int backoff_ms;   /* configured: the wait before the next attempt (doubles to 5 s) */
    atomic_int added; /* fabric_node_add_peer: tried at once on the next round, back-off reset */
    atomic_int open;
    atomic_int close_req;
    char name[48];
};

struct fabric_node {
    struct fabric_node_config cfg;
    struct tp *t;
    struct peer peer[FABRIC_MAX_NODE_PEERS];
    struct {
        fabric_handler_fn fn;
        void *ctx;
    } handler[MAX_HANDLERS];
    struct {
        fabric_peer_fn fn;
        void *ctx;
    } observer[MAX_OBSERVERS];
    int n_observers;
    struct {
        fabric_poll_fn fn;
        void *ctx;
    } poller[MAX_OBSERVERS];
    int n_pollers;
    pthread_mutex_t mu; /* the send queue and the peers' names */
    struct out_msg *q_head, *q_tail;
    pthread_t thread;
    int started;
    atomic_int stop;
};

struct fabric_node *fabric_node_new(const struct fabric_node_config *cfg, char *err)
{
    if (cfg->n_peers < 0 || cfg->n_peers > FABRIC_MAX_NODE_PEERS / 2) {
        errmsg_set(err, "fabric: %d peers (at most %d)", cfg->n_peers, FABRIC_MAX_NODE_PEERS / 2);
        return NULL;
    }
    struct fabric_node *fn = calloc(1, sizeof *fn);
    if (!fn) {
        errmsg_set(err, "fabric: out of memory");
        return NULL;
    }
    fn->cfg = *cfg;
    if (fn->cfg.retry_ms <= 0) fn->cfg.retry_ms = 300;
    if (fn->cfg.poll_ms <= 0) fn->cfg.poll_ms = 1;
    pthread_mutex_init(&fn->mu, NULL);
    fn->t = tp_open(&cfg->tp, err);
    if (!fn->t) {
        pthread_mutex_destroy(&fn->mu);
        free(fn);
        return NULL;
    }
    for (int i = 0; i < cfg->n_peers; i++) {
        fn->peer[i].used = 1;
        fn->peer[i].addr = cfg->peers[i];
        snprintf(fn->peer[i].name, sizeof fn->peer[i].name, "%s", cfg->peers[i]);
    }
    return fn;
}

int fabric_node_on(struct fabric_node *fn, int msg_type, fabric_handler_fn h, void *ctx)
{
    if (fn->started || msg_type < 0 || msg_type >= MAX_HANDLERS || fn->handler[msg_type].fn)
        return -1;
    fn->handler[msg_type].fn = h;
    fn->handler[msg_type].ctx = ctx;
    return 0;
}

int fabric_node_on_peer(struct fabric_node *fn, fabric_peer_fn f, void *ctx)
{
    if (fn->started || fn->n_observers == MAX_OBSERVERS) return -1;
    fn->observer[fn->n_observers].fn = f;
    fn->observer[fn->n_observers++].ctx = ctx;
    return 0;
}

int fabric_node_add_poller(struct fabric_node *fn, fabric_poll_fn f, void *ctx)
{
    if (fn->started || fn->n_pollers == MAX_OBSERVERS) return -1;
    fn->poller[fn->n_pollers].fn = f;
    fn->poller[fn->n_pollers++].ctx = ctx;
    return 0;
}

#define MAX_BACKOFF_MS 5000

/* A configured or dialed peer that failed: try again after its back-off, which doubles until it
 * opens. */
static void retry_later(struct fabric_node *fn, struct peer *p, double now)
{
    if (p->backoff_ms < fn->cfg.retry_ms) p->backoff_ms = fn->cfg.retry_ms;
    p->next_try = now + p->backoff_ms * 1e-3;
    p->backoff_ms = p->backoff_ms * 2 < MAX_BACKOFF_MS ? p->backoff_ms * 2 : MAX_BACKOFF_MS;
}

int fabric_node_add_peer(struct fabric_node *fn, const char *addr)
{
    char err[ERRMSG_LEN];
    int slot = fabric_node_dial(fn, addr, err);
    if (slot >= 0) atomic_store(&fn->peer[slot].added, 1); /* the next round tries it at once */
    return slot;
}

/* Fabric thread: peers fabric_node_add_peer added or named again are tried now. */
static void take_added(struct fabric_node *fn)
{
    for (int i = 0; i < FABRIC_MAX_NODE_PEERS; i++) {
        struct peer *p = &fn->peer[i];
        if (!atomic_exchange(&p->added, 0)) continue;
        p->next_try = 0;
        p->backoff_ms = fn->cfg.retry_ms;
        p->warned = 0;
    }
}

static void tell(struct fabric_node *fn, int i, int state, const char *why)
{
    struct peer *p = &fn->peer[i];
    if (p->reported == state) return;
    p->reported = state;
    atomic_store(&p->open, state == TP_OPEN);
    if (state == TP_OPEN) p->warned = 0;
    if (state == TP_OPEN)
        log_info("fabric", "node %d: peer %d (%s) open", fn->cfg.node_id, i, p->name);
    else
        log_warn("fabric", "node %d: peer %d (%s) closed: %s", fn->cfg.node_id, i, p->name,
                 why && *why ? why : "closed");
    for (int k = 0; k < fn->n_observers; k++)
        fn->observer[k].fn(fn->observer[k].ctx, fn, i, state, why ? why : "");
}

/* Close peer i's connection (fabric thread). Configured peers retry later; accepted ones free
 * their slot. */
static void drop_peer(struct fabric_node *fn, int i, const char *why)
{
    struct peer *p = &fn->peer[i];
    char reason[256];
    snprintf(reason, sizeof reason, "%s", why);
    if (p->conn && !p->adopted) tp_close(p->conn);
    p->conn = NULL;
    p->adopted = 0;
    atomic_store(&p->close_req, 0);
    if (p->reported == TP_OPEN) tell(fn, i, TP_CLOSED, reason);
    p->reported = TP_CLOSED;
    if (p->addr) {
        retry_later(fn, p, clock_now());
    } else {
        pthread_mutex_lock(&fn->mu);
        p->used = 0;
        p->name[0] = 0;
        pthread_mutex_unlock(&fn->mu);
    }
}

static void connect_peers(struct fabric_node *fn, double now)
{
    take_added(fn);
    for (int i = 0; i < FABRIC_MAX_NODE_PEERS; i++) {
        struct peer *p = &fn->peer[i];
        pthread_mutex_lock(&fn->mu); /* a dial may be filling the slot in */
        int dial = p->used && p->addr;
        pthread_mutex_unlock(&fn->mu);
        if (!dial || p->conn || now < p->next_try) continue;
        char err[ERRMSG_LEN];
        p->conn = tp_connect(fn->t, p->addr, err);
        p->reported = TP_CONNECTING;
        if (!p->conn) {
            if (!p->warned++)
                log_warn("fabric", "node %d: peer %s: %s (retrying, %d ms apart doubling to %d)",
                         fn->cfg.node_id, p->addr, err, fn->cfg.retry_ms, MAX_BACKOFF_MS);
            retry_later(fn, p, now);
        }
    }
}

static void accept_peers(struct fabric_node *fn)
{
    struct tp_conn *c;
    while ((c = tp_accept(fn->t))) {
        int slot = -1;
        pthread_mutex_lock(&fn->mu);
        for (int i = fn->cfg.n_peers; i < FABRIC_MAX_NODE_PEERS && slot < 0; i++)
            if (!fn->peer[i].used) slot = i;
        if (slot >= 0) {
            struct peer *p = &fn->peer[slot];
            p->used = 1;
            p->conn = c;
            p->addr = NULL;
            p->adopted = 0;
            p->reported = TP_CONNECTING;
            snprintf(p->name, sizeof p->name, "%s", tp_conn_peer(c));
        }
        pthread_mutex_unlock(&fn->mu);
        if (slot < 0) {
            log_warn("fabric", "node %d: %s refused: %d peers already", fn->cfg.node_id,
                     tp_conn_peer(c), FABRIC_MAX_NODE_PEERS);
            tp_close(c);
        }
    }
}

static void dispatch(struct fabric_node *fn, int i)
{
    struct peer *p = &fn->peer[i];
    const uint8_t *msg;
    size_t len;
    int r;
    while (p->conn && !p->adopted && (r = tp_recv(p->conn, &msg, &len)) == 1) {
        int type = wire_msg_type(msg, len);
        if (type < 0 || type >= MAX_HANDLERS || !fn->handler[type].fn) {
            char why[96];
            snprintf(why, sizeof why, "message type %d that nothing here handles", type);
            log_warn("fabric", "node %d: peer %d (%s): %s", fn->cfg.node_id, i, p->name, why);
            drop_peer(fn, i, why);
            return;
        }
        if (fn->handler[type].fn(fn->handler[type].ctx, fn, i, msg, len)) {
            drop_peer(fn, i, "protocol error (see the log line above)");
            return;
        }
    }
}

static void flush_sends(struct fabric_node *fn)
{
    for (;;) {
        pthread_mutex_lock(&fn->mu);
        struct out_msg *m = fn->q_head;
        pthread_mutex_unlock(&fn->mu);
        if (!m) return;
        struct peer *p = &fn->peer[m->peer];
        int r = p->conn && !p->adopted && p->reported == TP_OPEN
                    ? tp_send(p->conn, m->bytes, m->len)
                    : -1;
        if (r == TP_BUSY) return; /* in order: the rest waits for the next round */
        if (r < 0)
            log_warn("fabric", "node %d: a %zu-byte message to peer %d (%s) was dropped: closed",
                     fn->cfg.node_id, m->len, m->peer, p->name);
        pthread_mutex_lock(&fn->mu);
        fn->q_head = m->next;
        if (!fn->q_head) fn->q_tail = NULL;
        pthread_mutex_unlock(&fn->mu);
        free(m);
    }
}

static void *fabric_main(void *arg)
{
    struct fabric_node *fn = arg;
    while (!atomic_load(&fn->stop)) {
        double now = clock_now();
        connect_peers(fn, now);
        tp_poll(fn->t, fn->cfg.poll_ms);
        accept_peers(fn);
        for (int i = 0; i < FABRIC_MAX_NODE_PEERS; i++) {
            struct peer *p = &fn->peer[i];
            if (!p->used || !p->conn || p->adopted) continue;
            if (atomic_load(&p->close_req)) {
                drop_peer(fn, i, "closed by this node");
                continue;
            }
            int st = tp_conn_state(p->conn);
            if (st == TP_OPEN && p->reported != TP_OPEN) {
                tell(fn, i, TP_OPEN, "");
                p->backoff_ms = fn->cfg.retry_ms;
            }
            if (st == TP_OPEN) dispatch(fn, i);
            if (p->conn && !p->adopted && tp_conn_state(p->conn) == TP_CLOSED) {
                const char *e = tp_conn_error(p->conn);
                if (p->reported != TP_OPEN && p->addr && !p->warned++)
                    log_warn("fabric",
                             "node %d: peer %s: %s (retrying, %d ms apart doubling to %d)",
                             fn->cfg.node_id, p->addr, e && *e ? e : "connection failed",
                             fn->cfg.retry_ms, MAX_BACKOFF_MS);
                drop_peer(fn, i, e ? e : "");
            }
        }
        flush_sends(fn);
        for (int k = 0; k < fn->n_pollers; k++) fn->poller[k].fn(fn->poller[k].ctx, fn);
    }
    return NULL;
}

int fabric_node_start(struct fabric_node *fn, char *err)
{
    int rc = pthread_create(&fn->thread, NULL, fabric_main, fn);
    if (rc) return errmsg_set(err, "fabric: pthread_create: %s", strerror(rc));
    fn->started = 1;
    log_info("fabric", "node %d: %s%s%s, %d configured peer(s)", fn->cfg.node_id, fn->t->ops->name,
             fn->cfg.tp.listen ? " listening on " : " (connect only)",
             fn->cfg.tp.listen ? fn->cfg.tp.listen : "", fn->cfg.n_peers);
    return 0;
}

void fabric_node_stop(struct fabric_node *fn)
{
    if (!fn || !fn->started) return;
    atomic_store(&fn->stop, 1);
    pthread_join(fn->thread, NULL);
    fn->started = 0;
}

void fabric_node_free(struct fabric_node *fn)
{
    if (!fn) return;
    fabric_node_stop(fn);
    for (int i = 0; i < FABRIC_MAX_NODE_PEERS; i++)
        if (fn->peer[i].conn && !fn->peer[i].adopted) tp_close(fn->peer[i].conn);
    tp_destroy(fn->t);
    for (struct out_msg *m = fn->q_head, *n; m; m = n) {
        n = m->next;
        free(m);
    }
    pthread_mutex_destroy(&fn->mu);
    free(fn);
}

int fabric_node_dial(struct fabric_node *fn, const char *addr, char *err)
{
    if (strlen(addr) >= sizeof fn->peer[0].dialed)
        return errmsg_set(err, "fabric: address %.80s too long", addr);
    int slot = -1;
    pthread_mutex_lock(&fn->mu);
    for (int i = 0; i < FABRIC_MAX_NODE_PEERS && slot < 0; i++)
        if (fn->peer[i].used && fn->peer[i].addr && !strcmp(fn->peer[i].addr, addr)) slot = i;
    for (int i = fn->cfg.n_peers; i < FABRIC_MAX_NODE_PEERS && slot < 0; i++) {
        struct peer *p = &fn->peer[i];
        if (p->used) continue;
        slot = i;
        snprintf(p->dialed, sizeof p->dialed, "%s", addr);
        snprintf(p->name, sizeof p->name, "%s", addr);
        p->conn = NULL;
        p->adopted = p->warned = p->reported = 0;
        p->next_try = 0;
        p->addr = p->dialed;
        p->used = 1;
    }
    pthread_mutex_unlock(&fn->mu);
    if (slot < 0) return errmsg_set(err, "fabric: %d peers already", FABRIC_MAX_NODE_PEERS);
    return slot;
}

int fabric_node_send(struct fabric_node *fn, int peer, const void *msg, size_t len, char *err)
{
    if (peer < 0 || peer >= FABRIC_MAX_NODE_PEERS || !atomic_load(&fn->peer[peer].open))
        return errmsg_set(err, "fabric: peer %d is not connected", peer);
    if (len > WIRE_MAX_MSG)
        return errmsg_set(err, "fabric: a %zu-byte message exceeds %u", len, WIRE_MAX_MSG);
    struct out_msg *m = malloc(sizeof *m + len);
    if (!m) return errmsg_set(err, "fabric: out of memory for a %zu-byte message", len);
    m->next = NULL;
    m->peer = peer;
    m->len = len;
    memcpy(m->bytes, msg, len);
    pthread_mutex_lock(&fn->mu);
    if (fn->q_tail)
        fn->q_tail->next = m;
    else
        fn->q_head = m;
    fn->q_tail = m;
    pthread_mutex_unlock(&fn->mu);
    return 0;
}

void fabric_node_close_peer(struct fabric_node *fn, int peer, const char *why)
{
    if (peer < 0 || peer >= FABRIC_MAX_NODE_PEERS) return;
    log_warn("fabric", "node %d: closing peer %d: %s", fn->cfg.node_id, peer, why);
    atomic_store(&fn->peer[peer].close_req, 1);
}

int fabric_node_peer_open(struct fabric_node *fn, int peer)
{
    return peer >= 0 && peer < FABRIC_MAX_NODE_PEERS && atomic_load(&fn->peer[peer].open);
}

const char *fabric_node_peer_name(struct fabric_node *fn, int peer)
{
    if (peer < 0 || peer >= FABRIC_MAX_NODE_PEERS) return "";
    return fn->peer[peer].name;
}

int fabric_node_id(const struct fabric_node *fn)
{
    return fn->cfg.node_id;
}

struct tp *fabric_node_tp(struct fabric_node *fn)
{
    return fn->t;
}

struct tp_conn *fabric_node_adopt(struct fabric_node *fn, int peer)
{
    if (peer < 0 || peer >= FABRIC_MAX_NODE_PEERS || !fn->peer[peer].conn) return NULL;
    fn->peer[peer].adopted = 1;
    return fn->peer[peer].conn;
}
