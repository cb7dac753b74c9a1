/* fabric_node: the serving process's node on the fabric.
 *
 * One thread (the fabric thread) owns the transport (transport/transport.h): it opens it, listens,
 * connects to the configured peers (and reconnects to them every retry_ms while they are away),
 * accepts the peers that connect to us, polls, and hands every whole application message to the
 * handler registered for its type (transport/wire.h, enum wire_msg): the shape of DPDK's l2fwd,
 * one loop of receive a burst, dispatch, transmit what the other threads queued, repeat.
 *
 * Peers are small integers (0 .. FABRIC_MAX_NODE_PEERS-1): the configured ones first, in --peers
 * order, then accepted connections. A configured peer keeps its number across reconnections; an
 * accepted one's number is reused after it closed (its CLOSED event comes first).
 *
 * Plugging in a user (coop execution today; weight streaming and the control plane next):
 *   - before fabric_node_start, register a handler per message type it owns
 *     (fabric_node_on(fn, MSG_X, fn_x, ctx)), and, if it keeps per-peer state, a peer observer
 *     (fabric_node_on_peer) that hears TP_OPEN and TP_CLOSED for every peer;
 *   - handlers run ON THE FABRIC THREAD and must not block: decode, copy what they need, queue it
 *     for their own thread, return. The message bytes are valid only during the call. A handler
 *     returns -1 after logging why to close that peer (a protocol violation);
 *   - any thread sends with fabric_node_send (the bytes are copied and queued in order; the fabric
 *     thread transmits them on its next round, within about a millisecond);
 *   - a module that drives its own connections (weight_stream's chain, RDMA reads) registers a
 *     poller (fabric_node_add_poller): called every round on the fabric thread, with
 *     fabric_node_tp() for tp_connect/tp_pull/tp_expose. A connection accepted by the node whose
 *     first message belongs to such a module is handed over with fabric_node_adopt() from the
 *     handler of that message type: the node stops reading it and the module owns it from then on
 *     (it already has the first message, in the handler's arguments).
 * Everything is set up before fabric_node_start and torn down by fabric_node_free (which joins the
 * thread); registration after start is refused (a peer dialed later, fabric_node_dial, is not). */
#ifndef STRATA_FABRIC_NODE_H
#define STRATA_FABRIC_NODE_H

#include "transport/transport.h"

#include <stddef.h>
#include <stdint.h>

#define FABRIC_MAX_NODE_PEERS 64

struct fabric_node;

/* A message of a registered type from `peer`. 0, or -1 to close the peer (log the reason first). */
typedef int (*fabric_handler_fn)(void *ctx, struct fabric_node *fn, int peer, const uint8_t *msg,
                                 size_t len);
/* `peer` turned TP_OPEN or TP_CLOSED (why: the transport's reason, "" when none). */
typedef void (*fabric_peer_fn)(void *ctx, struct fabric_node *fn, int peer, int state,
                               const char *why);
typedef void (*fabric_poll_fn)(void *ctx, struct fabric_node *fn);

struct fabric_node_config {
    struct tp_config tp;
    const char *const *peers; /* "IP:PORT" to connect to (and reconnect) */
    int n_peers;
    int node_id;  /* this node's number, for logs */
    int retry_ms; /* the first wait before a reconnection (default 300; doubles to 5 s) */
    int poll_ms;  /* longest wait in tp_poll per round (default 1) */
};

struct fabric_node *fabric_node_new(const struct fabric_node_config *cfg, char *err);
int fabric_node_on(struct fabric_node *fn, int msg_type, fabric_handler_fn h, void *ctx);
int fabric_node_on_peer(struct fabric_node *fn, fabric_peer_fn f, void *ctx);
int fabric_node_add_poller(struct fabric_node *fn, fabric_poll_fn f, void *ctx);
int fabric_node_start(struct fabric_node *fn, char *err);
/* Stops the thread (idempotent): after it, modules that own adopted connections close them,
 * while the transport still exists. */
void fabric_node_stop(struct fabric_node *fn);
/* Stops the thread, closes every connection and the transport. */
void fabric_node_free(struct fabric_node *fn);

/* Any thread: queue one application message (at most WIRE_MAX_MSG bytes) for `peer`. -1 (err)
 * when the peer is not open or memory is short. Messages to one peer leave in order. */
int fabric_node_send(struct fabric_node *fn, int peer, const void *msg, size_t len, char *err);
/* Any thread: a peer to connect to from now on (and reconnect to, as a configured one), e.g. a
 * cluster member met at run time: its peer number (the same one when addr was configured or
 * dialed before), or -1 (err) when every slot is taken. Its TP_OPEN reaches the observers. */
int fabric_node_dial(struct fabric_node *fn, const char *addr, char *err);
/* Any thread: addr ("IP:PORT") holds something we need (a holder of our model came back, or a
 * new one): fabric_node_dial, and tried at once on the next round (a known one's back-off is
 * reset). Returns its peer number, -1 when every slot is taken. Configured and dialed peers that
 * fail are retried after retry_ms, doubling to 5 s, until they open. */
int fabric_node_add_peer(struct fabric_node *fn, const char *addr);
/* Any thread: close `peer` at the fabric thread's next round, logging `why`. */
void fabric_node_close_peer(struct fabric_node *fn, int peer, const char *why);
/* Any thread. */
int fabric_node_peer_open(struct fabric_node *fn, int peer);
const char *fabric_node_peer_name(struct fabric_node *fn, int peer); /* "IP:PORT" or "" */
int fabric_node_id(const struct fabric_node *fn);
/* Fabric thread only (handlers, pollers). */
struct tp *fabric_node_tp(struct fabric_node *fn);
struct tp_conn *fabric_node_adopt(struct fabric_node *fn, int peer);

#endif
