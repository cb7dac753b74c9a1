/* fwd_channel: sealed channels that carry forwarded API requests between the nodes' fronts.
 *
 * A node whose routing table sends a completion elsewhere (serving/api/relay.h) asks for a
 * channel to that member: fwd_open(), from the relay's own thread, returns a socket whose other
 * end is pumped by the control thread's loop through a cluster/sealed_conn.h connection to the
 * member's control port: the fabric's HELLO/HELLO_ACK under the cluster key, then MSGC_OPEN
 * CHAN_FWD (cluster/cluster_cmd.h), then ChaCha20-Poly1305 frames. The relay writes plain
 * HTTP/1.1 into the socket and reads the answer back, exactly as it would over TCP; a peer
 * without the key fails the handshake and gets nothing. On the receiving node the listener
 * (cluster/raft_transport.h) hands the channel to the control plane, which turns it into a
 * socket too (sealed_conn_relay_fd) and gives that to the HTTP front as a connection from a cluster
 * member (http_server_adopt): the only connections on which X-Strata-Forwarded counts.
 *
 * Why the loop pumps and the relay thread does not seal itself: one implementation of the
 * handshake and the framing (sealed_conn.c, already tested for raft and the control channel),
 * and the relay stays a blocking page over a socket, the same code for a plain TCP upstream.
 * What it costs: every byte crosses a socketpair on each side, microseconds against a token.
 *
 * A channel stays open until either end closes it, so the relay keeps idle ones for the next
 * request to the same node (relay_pool in serving/api/relay.h); a channel costs the receiving
 * front one connection. */
#ifndef STRATA_FWD_CHANNEL_H
#define STRATA_FWD_CHANNEL_H

#include "cluster/sealed_conn.h"

#include <stdint.h>
#include <uv.h>

struct fwd_channels;

/* Before the loop's thread runs: the async handle that takes requests onto the loop. self and
 * self_addr go into each channel's OPEN (who is forwarding: the receiver's logs). */
struct fwd_channels *fwd_channels_new(uv_loop_t *loop, const struct cluster_key *key, uint64_t self,
                                      const char *self_addr, char *err);
/* Any thread but the loop's: a channel to the control address `addr` of member `node`, within
 * timeout_ms. The socket (blocking; the caller owns and closes it), or -1 with err (nothing was
 * sent: unreachable, refused at the handshake, timed out), or -2 when cancel_fd became readable
 * first. A channel that completes after its caller gave up is closed by the loop. */
int fwd_channels_open(struct fwd_channels *f, uint64_t node, const char *addr, int timeout_ms,
                      int cancel_fd, char *err);
/* Loop thread: an accepted channel (the OPEN said CHAN_FWD) as a socket for the front; -1 with
 * err (the connection is closed). */
int fwd_channels_accept(struct sconn *s, char *err);
/* Loop thread, when the loop stops: requests not yet started fail; the handle closes. Opens
 * after this fail at once. */
void fwd_channels_stop(struct fwd_channels *f);
/* After the loop's thread ended. */
void fwd_channels_free(struct fwd_channels *f);

#endif
