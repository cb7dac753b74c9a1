/* fabric_node: two nodes in one process over loopback TCP. Messages reach the handler of their
 * type in order, sends from another thread arrive, peer events come for open and closed, a
 * handler's -1 closes that peer, a configured peer is reconnected after it went away, and a node
 * without the cluster key never opens. */
#include "cluster/fabric_node.h"
#include "os/common/errmsg.h"
#include "os/runtime/clock.h"
#include "tests/unit/check.h"
#include "tests/unit/free_port.h"
#include "transport/auth.h"
#include "transport/wire.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static char err[ERRMSG_LEN];

struct seen {
    atomic_int n, last, opened, closed, bad_peer;
    int reply;     /* echo back to the sender */
    int refuse_at; /* return -1 for this payload value */
};

static int on_msg(void *ctx, struct fabric_node *fn, int peer, const uint8_t *msg, size_t len)
{
    struct seen *s = ctx;
    if (len != 5) return -1;
    int v = msg[1] | msg[2] << 8 | msg[3] << 16 | msg[4] << 24;
    if (v == s->refuse_at) return -1;
    atomic_store(&s->last, v);
    atomic_fetch_add(&s->n, 1);
    if (s->reply) fabric_node_send(fn, peer, msg, len, err);
    return 0;
}

static void on_peer(void *ctx, struct fabric_node *fn, int peer, int state, const char *why)
{
    (void)fn, (void)peer, (void)why;
    struct seen *s = ctx;
    atomic_fetch_add(state == TP_OPEN ? &s->opened : &s->closed, 1);
}

static void msg5(uint8_t *m, int v)
{
    m[0] = MSG_DONE;
    m[1] = (uint8_t)v, m[2] = (uint8_t)(v >> 8), m[3] = (uint8_t)(v >> 16),
    m[4] = (uint8_t)(v >> 24);
}

static int wait_for(atomic_int *a, int want, double s)
{
    double until = clock_now() + s;
    while (atomic_load(a) < want && clock_now() < until) usleep(2000);
    return atomic_load(a) >= want;
}

static struct fabric_node *node(const char *listen, const char *peer, uint8_t key_byte)
{
    static const char *peers[1];
    peers[0] = peer;
    struct fabric_node_config c = {.tp = {.kind = "tcp", .listen = listen},
                                   .peers = peers,
                                   .n_peers = peer ? 1 : 0,
                                   .retry_ms = 50};
    memset(c.tp.key.k, key_byte, sizeof c.tp.key.k);
    return fabric_node_new(&c, err);
}

static char addr[32];

TEST(messages_replies_events_and_protocol_close)
{
    struct seen hs = {.reply = 1, .refuse_at = 999}, js = {.refuse_at = -7};
    struct fabric_node *h = node(addr, NULL, 1);
    CHECK(h != NULL);
    struct fabric_node *j = node(NULL, addr, 1);
    CHECK(j != NULL);
    CHECK(fabric_node_on(h, MSG_DONE, on_msg, &hs) == 0);
    CHECK(fabric_node_on(h, MSG_DONE, on_msg, &hs) == -1); /* one handler per type */
    CHECK(fabric_node_on_peer(h, on_peer, &hs) == 0);
    CHECK(fabric_node_on(j, MSG_DONE, on_msg, &js) == 0);
    CHECK(fabric_node_on_peer(j, on_peer, &js) == 0);
    CHECK(fabric_node_start(h, err) == 0 && fabric_node_start(j, err) == 0);
    CHECK(fabric_node_on(j, MSG_JOIN, on_msg, &js) == -1); /* not after start */
    CHECKF(wait_for(&js.opened, 1, 5), "the joiner's peer never opened");
    CHECK(wait_for(&hs.opened, 1, 5));
    CHECK(fabric_node_peer_open(j, 0) && !strcmp(fabric_node_peer_name(j, 0), addr));
    /* 200 messages from this thread, answered one by one, in order */
    uint8_t m[5];
    for (int i = 1; i <= 200; i++) {
        msg5(m, i);
        CHECK(fabric_node_send(j, 0, m, sizeof m, err) == 0);
    }
    CHECKF(wait_for(&js.n, 200, 10), "%d of 200 replies", atomic_load(&js.n));
    CHECK(atomic_load(&js.last) == 200 && atomic_load(&hs.last) == 200);
    /* a message the helper's handler refuses closes that peer; the joiner reconnects */
    msg5(m, 999);
    CHECK(fabric_node_send(j, 0, m, sizeof m, err) == 0);
    CHECKF(wait_for(&js.closed, 1, 5), "the refused peer was not closed");
    CHECK(wait_for(&hs.closed, 1, 5));
    CHECKF(wait_for(&js.opened, 2, 5), "the configured peer was not reconnected");
    msg5(m, 1234);
    for (int i = 0; i < 500 && fabric_node_send(j, 0, m, sizeof m, err); i++) usleep(2000);
    CHECK(wait_for(&js.n, 201, 5) && atomic_load(&js.last) == 1234);
    /* a type nobody handles closes the peer too */
    m[0] = MSG_JOIN;
    CHECK(fabric_node_send(j, 0, m, sizeof m, err) == 0);
    CHECK(wait_for(&js.closed, 2, 5));
    /* sending to a peer that is not open fails at once */
    CHECK(fabric_node_send(j, 7, m, sizeof m, err) == -1);
    fabric_node_free(j);
    fabric_node_free(h);
}

TEST(keyless_node_never_opens)
{
    struct seen hs = {0}, js = {0};
    struct fabric_node *h = node(addr, NULL, 1);
    struct fabric_node *j = node(NULL, addr, 2);
    CHECK(h && j);
    fabric_node_on_peer(h, on_peer, &hs);
    fabric_node_on_peer(j, on_peer, &js);
    CHECK(fabric_node_start(h, err) == 0 && fabric_node_start(j, err) == 0);
    usleep(500000);
    CHECK(atomic_load(&js.opened) == 0 && atomic_load(&hs.opened) == 0);
    CHECK(!fabric_node_peer_open(j, 0));
    fabric_node_free(j);
    fabric_node_free(h);
}

int main(void)
{
    if (auth_init(err)) return printf("not ok - auth_init: %s\n", err), 1;
    int port = free_port();
    if (port < 0) return printf("not ok - free_port: no loopback port\n"), 1;
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    RUN(messages_replies_events_and_protocol_close);
    RUN(keyless_node_never_opens);
    CHECK_DONE();
}
