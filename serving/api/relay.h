/* relay: one API request forwarded to another node's front, its answer streamed back.
 *
 * The front (serving/api/serve_front.h) hands a completion request the routing table sends
 * elsewhere to relay_start(). A thread of the relay's own opens a channel to the chosen node
 * (cfg->open_channel: in a cluster a sealed forward channel under the cluster key to the node's
 * control port, cluster/fwd_channel.h, which the receiving node hands to its front as a
 * connection from a cluster member; without it, TCP to the node's API address), sends the same
 * request (HTTP/1.1, the same path and body, the client's bearer token, and X-Strata-Forwarded:
 * <this node's id>, which the receiving front honours, on a member's connection only, by never
 * forwarding it again: no loops), reads the answer with the http_response reader and queues what
 * arrives. The front takes it on its own thread (relay_take, after the relay's wake callback woke the loop) and
 * writes it to the client's connection as the server's framing requires: a Content-Length answer
 * as one body, a chunked one (SSE) chunk by chunk as it arrives, whole events only (an event cut
 * by a dying upstream never reaches the client).
 *
 * Why a thread per forwarded request and not non-blocking sockets in the front's loop: the loop
 * (serving/api/http_server.h) owns client connections and knows nothing of outgoing ones; a
 * blocking connect/poll/recv loop with timeouts is a page that reads top to bottom, a forwarded
 * request is a few hundred bytes and lives as long as its answer, and the front already has the
 * cross-thread path this needs (a mutex-guarded queue plus the loop's wake, as the scheduler
 * uses). Threads cost a stack each; the connection limit of the front bounds them.
 *
 * Failures are answers, never hangs: the upstream unreachable within connect_timeout_ms, silent
 * for idle_timeout_ms (TCP keepalive also notices a dead machine), closing mid-answer, or sending
 * something that is not HTTP ends the relay with `failed` set, a status (502, or 504 for a
 * timeout) and a message naming the node; except that a node that cannot be connected to (nothing
 * was sent), or that took the request and closed without a byte of answer (it died while the
 * request ran there; the client has seen nothing), is reported unreachable and the route asked
 * again, up to RELAY_MAX_TRIES targets, so a request whose node died before answering is served
 * elsewhere, not lost. A silent node (the idle timeout) is not retried: it may still run it. A request with no target yet (the routing table has no
 * replica) is held: the relay asks cfg->route again every RELAY_HOLD_POLL_MS for up to hold_ms,
 * then fails with 503 (Retry-After) or ends with `local` set when the route names this node.
 *
 * Channels are kept for the next request to the same node when cfg->pool keeps idle ones
 * (relay_pool_new): a request whose answer ended cleanly (Content-Length or the last chunk, the
 * node not saying Connection: close) puts its channel back; the next takes it instead of paying
 * connect + handshake. A kept channel that the node closed meanwhile (its idle timeout) is seen
 * before use (readable: EOF) and dropped; one that closes before the answer's first byte is
 * retried once on a fresh channel: a live front closes a kept connection only while it is idle
 * (the race with its idle timeout), so either the node never saw the request or the node died,
 * and then the fresh channel cannot be opened and the route is asked again as for any unreachable
 * node (a non-streamed request that was running there is served elsewhere rather than failed).
 * A cancelled or failed request's channel is closed, never kept (closing it cancels the request
 * there).
 *
 * relay_cancel() is the front's last call on a relay (the answer was delivered, or the client
 * went away): it stops the thread (the upstream connection is closed, which cancels the request
 * there too) and, once the thread is out, frees the relay. After relay_cancel returns the thread
 * makes no more callbacks. */
#ifndef STRATA_RELAY_H
#define STRATA_RELAY_H

#include "os/common/errmsg.h"

#include <stddef.h>
#include <stdint.h>

#define RELAY_HOLD_POLL_MS 50
#define RELAY_ADDR_LEN     64
#define RELAY_MAX_TRIES    3
#define RELAY_MAX_PENDING  (16u << 20) /* bytes queued for a client that does not take them */

enum relay_route { RELAY_ROUTE_LOCAL, RELAY_ROUTE_REMOTE, RELAY_ROUTE_NONE };

struct relay_pool;

struct relay_config {
    const char *target;   /* the chosen node's API "host:port"; NULL or "": hold, ask route */
    uint64_t target_node; /* its id (messages, metrics) */
    const char *path;     /* "/v1/completions", "/v1/chat/completions", "/tokenize", ... */
    const char *method;   /* a static string; NULL: "POST" ("GET": no body is sent) */
    const char *body;
    size_t body_len;
    const char *bearer; /* the client's bearer token, NULL: none */
    uint64_t self;      /* this node's id: the X-Strata-Forwarded value */
    const char *model;  /* for route while held */
    int prompt_tokens;
    int connect_timeout_ms, idle_timeout_ms, hold_ms;
    /* No first byte of an answer within deadline_ms of relay_start, whatever nodes were tried
     * (re-routes after a node died included): 504, no more tries (0: idle_timeout_ms). */
    int deadline_ms;
    /* Thread-safe: where the request goes now (enum relay_route; addr and node for REMOTE). */
    int (*route)(void *ctx, const char *model, int prompt_tokens, char *addr, size_t cap,
                 uint64_t *node);
    void *route_ctx;
    /* Thread-safe (route_ctx), NULL: none: 1 when the model is lost to the cluster (why names it
     * and the missing layers): a held request fails at once with 503 instead of waiting. */
    int (*lost)(void *ctx, const char *model, char *why, size_t cap);
    /* Thread-safe (route_ctx): the target could not be reached, or closed without answering:
     * the route should avoid it for a while. NULL: the relay fails instead of asking the route again. */
    void (*unreachable)(void *ctx, uint64_t node);
    /* Thread-safe, must not block: new output is queued (wakes the front's loop). */
    void (*wake)(void *ctx);
    void *wake_ctx;
    /* Thread-safe, may block up to timeout_ms: a connected socket to node that carries HTTP/1.1
     * (the caller's from then on), -1 with err when nothing could be sent (unreachable, refused),
     * -2 when cancel_fd became readable. NULL: TCP to target. */
    int (*open_channel)(void *ctx, uint64_t node, int timeout_ms, int cancel_fd, char *err);
    void *channel_ctx;
    struct relay_pool *pool; /* idle channels and the counters; NULL: neither */
    int keep_alive;          /* set by the relay (the pool keeps channels): the request's
                                Connection header says keep-alive instead of close */
};

/* Idle channels by node, at most max_idle each, none older than idle_ms (keep that under the
 * receiving server's keep-alive timeout); max_idle 0: a fresh channel per request, still counted.
 * Thread-safe. */
struct relay_pool *relay_pool_new(int max_idle, int idle_ms);
void relay_pool_free(struct relay_pool *p); /* closes the idle channels */
struct relay_pool_stats {
    unsigned long long opened;  /* fresh channels */
    unsigned long long open_us; /* their open time (connect + handshake), microseconds, total */
    unsigned long long reused;  /* requests that took an idle channel */
    unsigned long long stale;   /* idle channels found closed (dropped, or retried fresh) */
    int idle;                   /* kept now */
};
void relay_pool_stats(struct relay_pool *p, struct relay_pool_stats *out);

/* What the front takes from a relay; one call returns everything new since the last. */
struct relay_out {
    int head; /* the head arrived (once): status, content_type, extra_headers, streamed */
    int status;
    char content_type[128];
    char extra_headers[192]; /* "Retry-After: 1\r\n" ... as the upstream sent them */
    int streamed;            /* chunked upstream: written to the client as it comes */
    char *data;              /* malloc'd body bytes (streamed: since the last take; else the
                                whole body, with done), NULL when none */
    size_t len;
    int done;   /* the answer is complete */
    int failed; /* it failed: fail_status and error; nothing more comes */
    int fail_status;
    int lost; /* failed because the model is lost to the cluster (relay_config.lost) */
    char error[ERRMSG_LEN];
    int local;     /* held, and the route now names this node: serve it here */
    uint64_t node; /* the node the request went to (0: none yet) */
    char addr[RELAY_ADDR_LEN];
};

struct relay;

/* Starts the relay's thread; NULL with err when it cannot. */
struct relay *relay_start(const struct relay_config *cfg, char *err);
/* Front thread: fills out with what is new; returns 1 when there was anything, else 0. */
int relay_take(struct relay *r, struct relay_out *out);
void relay_cancel(struct relay *r);

/* The request bytes the relay sends (exposed for the unit test): malloc'd, *len its length. */
char *relay_request_text(const struct relay_config *cfg, size_t *len);

#endif
