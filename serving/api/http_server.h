/* http_server: the front thread's HTTP/1.1 server on kernel sockets (epoll, level-triggered).
 *
 * One thread owns every connection. A connection reads a request (http_parse_request: head, then
 * a Content-Length or chunked body, decoded in place), then hands the request to the handler,
 * which answers at once (http_respond) or later from on_wake (after another thread called
 * http_server_wake), possibly as a chunked stream (http_stream_*; SSE uses this). Keep-alive and
 * pipelining: the next request on a connection is read after the previous answer is queued.
 *
 * Protection: at most max_conns connections (the next gets 503 with Retry-After and is closed);
 * heads over max_head get 431, bodies over max_body 413 (not read); a request that does not
 * arrive within read_timeout_ms gets 408; idle keep-alive connections close after
 * idle_timeout_ms; a client that stops reading (output outstanding, here or unacknowledged in
 * the kernel, and nothing acknowledged for write_timeout_ms; or more than max_pending_write bytes
 * queued) is dropped. Every error body is in OpenAI's error shape.
 *
 * A client that goes away while its request is with the handler (EOF, reset, timeout) triggers
 * on_abort(user) from the loop, never from inside an http_* call made by the handler; http_*
 * calls on a dead connection return -1 and do nothing.
 *
 * Connections come from the listening socket (clients) or from http_server_adopt (another node's
 * front, over a sealed forward channel: cluster/fwd_channel.h). Only on an adopted connection
 * does a request's X-Strata-Forwarded count (http_request.forwarded); from a client the header is
 * ignored, so a client can neither skip the routing table nor pose as a cluster member. */
#ifndef STRATA_HTTP_SERVER_H
#define STRATA_HTTP_SERVER_H

#include "serving/api/http.h"
#include "serving/api/metrics.h"

#include <stddef.h>
#include <stdint.h>

struct http_server_config {
    const char *host; /* "127.0.0.1", "0.0.0.0", "::" */
    int port;         /* 0 = any (see http_server_port) */
    int max_conns;
    size_t max_head, max_body;
    int read_timeout_ms, idle_timeout_ms, write_timeout_ms;
    size_t max_pending_write;
    /* Called once per loop iteration (at least every 100 ms) on the loop's thread, when set: the
     * serve loop's heartbeat (pid1_tick pets the hardware watchdog). */
    void (*tick)(void *ctx);
    void *tick_ctx;
};

struct http_conn;

struct http_handler {
    void *ctx;
    void (*on_request)(void *ctx, struct http_conn *c, const struct http_request *r,
                       const char *body, size_t len);
    void (*on_abort)(void *ctx, struct http_conn *c, void *user);
    void (*on_wake)(void *ctx);
    /* The body of an error the server answers itself (a bad head, too many connections, a
     * timeout): a malloc'd JSON document in the API's shape, or NULL for "{}". Optional. */
    char *(*error_body)(void *ctx, int status, const char *message);
};

struct http_server;

/* Binds and listens. m (optional) gets the connection gauge and rejected/invalid outcomes. */
struct http_server *http_server_new(const struct http_server_config *cfg,
                                    const struct http_handler *h, struct serve_metrics *m,
                                    char *err);
int http_server_port(const struct http_server *s);
/* Runs the loop until http_server_stop. */
int http_server_run(struct http_server *s, char *err);
void http_server_stop(struct http_server *s); /* any thread, async-signal-safe */
/* Graceful stop (any thread, async-signal-safe): close the listening socket and idle
 * connections, let requests in progress finish, then return from http_server_run; after
 * grace_ms whatever is left is closed. */
void http_server_shutdown(struct http_server *s, int grace_ms);
void http_server_wake(struct http_server *s); /* any thread */
/* Any thread: fd (a connected stream socket from cluster member from_node, the id its channel's
 * handshake proved; ours from now on) becomes a connection of this server, as a client's would,
 * but one whose X-Strata-Forwarded counts, and must name from_node (403 otherwise).
 * -1 when the server is stopping (fd is closed). */
int http_server_adopt(struct http_server *s, int fd, uint64_t from_node);
void http_server_free(struct http_server *s);

/* Front thread only. */
int http_respond(struct http_conn *c, int status, const char *content_type, const char *body,
                 size_t len, const char *extra_headers);
int http_stream_begin(struct http_conn *c, int status, const char *content_type);
int http_stream_write(struct http_conn *c, const char *data, size_t len);
int http_stream_end(struct http_conn *c);
void http_conn_set_user(struct http_conn *c, void *user);
void *http_conn_user(const struct http_conn *c);
int http_conn_alive(const struct http_conn *c);

#endif
