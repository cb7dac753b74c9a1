/* sealed_conn: an authenticated, sealed TCP connection in a libuv loop (the control plane's wire).
 *
 * It reuses the fabric's framing and seal (transport/auth.h, transport/wire.h) with the handshake
 * that binds node ids: the client sends HELLO_ID (nonce, its node id, MAC under its node key), the
 * server answers HELLO_ID_ACK (its own id too); a side without the key is refused there and the
 * connection is closed, and a client that named the node it meant to reach (want_id) refuses any
 * other. Both ends then know the other's id for the connection's life (peer_id): every message
 * that claims an id (OPEN, load reports, JOIN, a forwarded request's header) is checked against it
 * by its reader. Every later byte travels inside sealed WIRE_MSG frames (ChaCha20-Poly1305 under
 * per-direction session keys) whose sequence numbers must arrive in order, so a recorded HELLO
 * replayed by a keyless peer gets it nothing: it cannot derive the session keys, so it can neither
 * read nor forge a frame. A CLOSE frame is sealed too and counts only if it opens, at its place in
 * the sequence; a whole frame that does not open (a forged CLOSE or MSG injected into the stream)
 * is dropped, logged and counted (sconn_forged_frames), and the connection goes on.
 *
 * Two ways to use an open connection:
 * - messages: sealed_conn_send() seals one message (<= WIRE_MAX_MSG bytes) per frame; each received
 *   frame is handed to on_msg whole.
 * - relay: sealed_conn_relay() makes a socketpair, hands one end to the caller as a uv_pipe_t (raft's
 *   libuv transport wants a uv_stream_t it reads and writes itself) and pumps bytes between the
 *   other end and the TCP connection, sealing and opening on the way. Closing either end closes
 *   the other. sealed_conn_relay_fd() hands the caller's end over as a plain file descriptor instead,
 *   for a thread outside the loop (a forwarded API request: serving/api/relay.h on the sending
 *   node, the HTTP front on the receiving one).
 * A handshake must finish within a deadline (SCONN_HANDSHAKE_MS, or the listener's handshake_ms):
 * a peer that connects and sends nothing, or half a HELLO, is closed then instead of holding a
 * socket for as long as it likes; on the client side SCONN_HANDSHAKE_MS covers connect and
 * HELLO_ACK. Past the handshake the peer holds the key and is trusted to be the node it proved.
 * Everything runs on the loop's thread. on_close fires once, after which the sconn is freed. */
#ifndef STRATA_SEALED_CONN_H
#define STRATA_SEALED_CONN_H

#include "transport/auth.h"

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define SCONN_HANDSHAKE_MS 5000

struct sconn;

struct sconn_cbs {
    /* Handshake finished (status 0) or failed (status < 0, why says what); on failure the
     * connection closes right after. */
    void (*on_ready)(struct sconn *c, int status, const char *why);
    void (*on_msg)(struct sconn *c, const uint8_t *msg, size_t len);
    void (*on_close)(struct sconn *c, const char *why);
};

struct sconn {
    void *data;       /* the user's */
    char peer[64];    /* host:port, for logs */
    uint64_t peer_id; /* the node the handshake proved (0 until open) */
    /* the rest is private to sealed_conn.c */
    uv_loop_t *loop;
    uv_tcp_t tcp;
    uv_connect_t creq;
    uv_timer_t deadline; /* the handshake's */
    uv_pipe_t pipe;      /* relay: our end of the socketpair */
    const struct cluster_key *key;
    struct sconn_cbs cb;
    int is_client, state, piped, open_handles, timed_out;
    uint64_t self_id, want_id;
    unsigned forged;                     /* frames that did not open (logged: the first few) */
    struct sconn *live_prev, *live_next; /* every sconn not yet closed (sealed_conn_close_all) */
    uint8_t nonce[WIRE_NONCE_LEN];
    struct session s;
    uint64_t tx_seq, rx_seq;
    uint8_t *in, *pt;
    size_t in_len;
    char why[256];
};

/* Server side: listen on host:port ("0.0.0.0:7100"); on_accept gets each connection whose
 * handshake succeeded (cbs to fill in for it; its on_ready is not called); on_refused each one
 * closed before that (timed_out: it did not finish the handshake within handshake_ms). */
struct slisten {
    void *data;
    uv_tcp_t tcp;
    const struct cluster_key *key;
    uint64_t id;      /* this node's, proved to every client (>= 1) */
    int handshake_ms; /* 0: SCONN_HANDSHAKE_MS */
    void (*on_accept)(struct slisten *l, struct sconn *c);
    void (*on_refused)(struct slisten *l, const char *peer, const char *why, int timed_out);
};
int slisten_start(struct slisten *l, uv_loop_t *loop, const char *hostport, char *err);
/* Stops accepting; cb (may be NULL) once the handle is closed. */
void slisten_stop(struct slisten *l, uv_close_cb cb);

/* Client side: connect to host:port as node self_id (>= 1), to node want_id (0: whichever node
 * answers; its id is in peer_id once open); cbs->on_ready reports the handshake. NULL on an
 * immediate failure (bad address, out of memory), with err. */
struct sconn *sealed_conn_connect(uv_loop_t *loop, const struct cluster_key *key, uint64_t self_id,
                                  uint64_t want_id, const char *hostport,
                                  const struct sconn_cbs *cbs, void *data, char *err);
/* Seal and send one message. Returns -1 if the connection is not open or len is too large. */
int sealed_conn_send(struct sconn *c, const void *msg, size_t len);
/* Switch an open connection to relay mode; returns the caller's end as a uv_pipe_t allocated
 * with alloc_fn (raft_malloc for raft) and initialised on the loop, or NULL with err. */
uv_stream_t *sealed_conn_relay(struct sconn *c, void *(*alloc_fn)(size_t), char *err);
/* The same, the caller's end as a blocking-capable socket it owns (close it to end the relay);
 * -1 with err. */
int sealed_conn_relay_fd(struct sconn *c, char *err);
/* Close (idempotent); on_close fires once both handles are closed. */
void sealed_conn_close(struct sconn *c, const char *why);
int sealed_conn_is_open(const struct sconn *c);

/* Close every connection of this loop still open (a stopping control thread: the forward channels
 * a front keeps in its pool would otherwise keep the loop, and the process, running). On the
 * loop's thread. */
void sealed_conn_close_all(uv_loop_t *loop, const char *why);
/* Frames dropped because they did not open (forged or corrupted), every connection of the process. */
unsigned long long sconn_forged_frames(void);

/* "host:port" -> sockaddr_in (IPv4 dotted quad). */
int sealed_conn_parse_addr(const char *hostport, struct sockaddr_in *sa, char *err);

#endif
