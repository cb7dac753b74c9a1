/* raft_transport: raft's libuv transport (struct raft_uv_transport) over sealed connections.
 *
 * raft's own TCP transport (raft_uv_tcp_init) accepts anyone. This one listens on the node's
 * control address and speaks cluster/sealed_conn.h: a peer without the cluster key fails the
 * handshake and never reaches raft. After the handshake the client's first sealed message
 * (MSGC_OPEN, cluster/cluster_cmd.h) names the channel: CHAN_RAFT connections become a relay
 * whose local end is the uv_stream_t raft reads and writes (its own messages, unchanged); CHAN_CTL
 * connections (load reports, joins, state reads) are handed to on_ctl, CHAN_FWD ones (a forwarded
 * API request) to on_fwd. One port per node carries all three, so one firewall rule and one
 * address per node.
 *
 * Everything runs on the loop's thread. The transport struct must outlive raft_uv_close. */
#ifndef STRATA_RAFT_TRANSPORT_H
#define STRATA_RAFT_TRANSPORT_H

#include "cluster/sealed_conn.h"

#include <raft.h>
#include <raft/uv.h>

struct raft_transport_cfg {
    uv_loop_t *loop;
    const struct cluster_key *key;
    const char *bind; /* host:port to listen on (NULL: the raft address) */
    void *ctx;
    /* A control connection from node `id` (its first message was MSGC_OPEN CHAN_CTL). The
     * callee owns c from here: it sets c->cb and c->data. */
    void (*on_ctl)(void *ctx, struct sconn *c, uint64_t id, const char *addr);
    /* A forward channel from node `id` (MSGC_OPEN CHAN_FWD): the callee owns c (NULL: refused). */
    void (*on_fwd)(void *ctx, struct sconn *c, uint64_t id, const char *addr);
    /* A connection refused at the handshake (no or wrong key, or timed_out: no handshake within
     * handshake_ms): for logs and counters. */
    void (*on_refused)(void *ctx, const char *peer, const char *why, int timed_out);
    /* An OPEN in another node's name than the handshake proved (refused, logged): a counter. */
    void (*on_impostor)(void *ctx);
    int handshake_ms; /* 0: SCONN_HANDSHAKE_MS */
};

/* Fills t's methods; the state lives in t->impl (freed by raft_transport_free after raft_uv_close). */
int raft_transport_init(struct raft_uv_transport *t, const struct raft_transport_cfg *cfg,
                        char *err);
void raft_transport_free(struct raft_uv_transport *t);

#endif
