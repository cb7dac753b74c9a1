/* Forwarding (serving/api/relay.h) and its response reader (serving/api/http_response.h).
 *
 * The reader: every way the bytes of a response arrive (whole, byte by byte) gives the same head
 * and body; framing it cannot trust is refused; a body cut short is an error, not an answer.
 * The relay, end to end on loopback: a front with NO model (an empty cluster member) whose route
 * names a fake upstream played by this test: the upstream sees the same body, the client's bearer
 * and X-Strata-Forwarded; a Content-Length answer comes back as it was; an SSE answer is streamed
 * (the client reads the first event while the upstream still holds the rest back, so it cannot
 * have been buffered to the end); an upstream dying mid-event gives the whole events, an error
 * event naming the node and [DONE], never the half event; an unreachable node gives 502 naming
 * it; a request already forwarded, arriving on a connection from a cluster member (adopted, as
 * forward channels are), is not forwarded again, while the same header from a client is ignored
 * and the request relayed like any other; no replica gives 503 after the hold; a client that goes
 * away closes the upstream connection. With a pool (a second front whose channels come from
 * open_channel): three requests on one channel, the request saying keep-alive; a kept channel the
 * node closed is dropped before use; one the node closes with the request unanswered is retried
 * once on a fresh channel; the counters say so. Timing is never a pass criterion. */
#include "check.h"
#include "os/common/errmsg.h"
#include "serving/api/http_response.h"
#include "serving/api/http_server.h"
#include "serving/api/relay.h"
#include "serving/api/serve_front.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---------------------------------------------------------------- the reader */

struct parsed {
    int rc, status;
    char ctype[128], retry[32];
    char body[4096];
    size_t body_len;
};

/* Feed in[0..n) `step` bytes at a time (0: all at once), then EOF if the reader still wants. */
static void parse(const char *in, size_t n, size_t step, struct parsed *p)
{
    static char buf[8192];
    char err[ERRMSG_LEN];
    struct http_response r;
    http_response_init(&r);
    memset(p, 0, sizeof *p);
    size_t len = 0, fed = 0;
    p->rc = 0;
    while (p->rc == 0 && fed < n) {
        size_t k = step ? step : n;
        if (k > n - fed) k = n - fed;
        memcpy(buf + len, in + fed, k);
        len += k;
        fed += k;
        size_t ready;
        p->rc = http_response_feed(&r, buf, &len, &ready, err);
        if (p->rc >= 0) {
            memcpy(p->body + p->body_len, buf, ready);
            p->body_len += ready;
            http_response_took(&r, buf, &len, ready);
        }
    }
    if (p->rc == 0) p->rc = http_response_eof(&r, err) == 1 ? 1 : -1;
    p->status = r.status;
    snprintf(p->ctype, sizeof p->ctype, "%.600s", r.content_type);
    snprintf(p->retry, sizeof p->retry, "%.600s", r.retry_after);
}

static void same_whichever_way(const char *in, int rc, int status, const char *body)
{
    struct parsed whole, bytes;
    parse(in, strlen(in), 0, &whole);
    parse(in, strlen(in), 1, &bytes);
    CHECK_EQ_INT(whole.rc, rc);
    CHECK_EQ_INT(bytes.rc, rc);
    if (rc < 0) return;
    CHECK_EQ_INT(whole.status, status);
    CHECK_EQ_INT(bytes.status, status);
    CHECKF(whole.body_len == strlen(body) && !memcmp(whole.body, body, whole.body_len),
           "whole: %.*s", (int)whole.body_len, whole.body);
    CHECKF(bytes.body_len == strlen(body) && !memcmp(bytes.body, body, bytes.body_len),
           "bytes: %.*s", (int)bytes.body_len, bytes.body);
}

TEST(reader_frames_every_way)
{
    same_whichever_way("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7"
                       "\r\n\r\n{\"a\":1}",
                       1, 200, "{\"a\":1}");
    same_whichever_way("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: "
                       "text/event-stream\r\n\r\n6\r\ndata: \r\n3;x=y\r\nab\n\r\n0\r\n\r\n",
                       1, 200, "data: ab\n");
    same_whichever_way("HTTP/1.0 503 Service Unavailable\r\nRetry-After: 1\r\n\r\nbusy", 1, 503,
                       "busy");
    same_whichever_way("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 400 Bad Request\r\nContent-Length: "
                       "2\r\n\r\n{}",
                       1, 400, "{}");
    same_whichever_way("HTTP/1.1 204 No Content\r\n\r\n", 1, 204, "");
    struct parsed p;
    const char *h =
        "HTTP/1.1 503 x\r\nRetry-After: 7\r\nContent-Type: a/b\r\nContent-Length: 0\r\n\r\n";
    parse(h, strlen(h), 0, &p);
    CHECK(!strcmp(p.retry, "7") && !strcmp(p.ctype, "a/b"));
}

TEST(reader_refuses_what_it_cannot_frame)
{
    same_whichever_way("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
                       -1, 0, "");
    same_whichever_way("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", -1, 0, "");
    same_whichever_way("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", -1, 0,
                       "");
    same_whichever_way("HTTP/2 200 OK\r\n\r\n", -1, 0, "");
    same_whichever_way("HTTP/1.1 2x0 OK\r\n\r\n", -1, 0, "");
    same_whichever_way("HTTP/1.1 200 OK\r\nbad header\r\n\r\n", -1, 0, "");
    same_whichever_way("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", -1, 0, "");
}

TEST(reader_body_cut_short_is_an_error)
{
    /* Content-Length not reached, chunked without its last chunk, no head at all */
    same_whichever_way("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345", -1, 0, "");
    same_whichever_way("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", -1, 0,
                       "");
    same_whichever_way("HTTP/1.1 200 OK\r\nContent-", -1, 0, "");
    same_whichever_way("", -1, 0, "");
}

TEST(request_text_is_exact)
{
    struct relay_config c = {.target = "10.0.0.2:8080",
                             .path = "/v1/completions",
                             .body = "{\"prompt\":\"x\"}",
                             .body_len = 14,
                             .bearer = "sk-1",
                             .self = 7};
    size_t n = 0;
    char *t = relay_request_text(&c, &n);
    const char *want = "POST /v1/completions HTTP/1.1\r\nHost: 10.0.0.2:8080\r\nContent-Type: "
                       "application/json\r\nContent-Length: 14\r\nAuthorization: Bearer sk-1\r\n"
                       "X-Strata-Forwarded: 7\r\nConnection: close\r\n\r\n{\"prompt\":\"x\"}";
    CHECKF(t && n == strlen(want) && !strcmp(t, want), "%.600s", t ? t : "(null)");
    free(t);
    c.bearer = NULL;
    t = relay_request_text(&c, &n);
    CHECK(t && !strstr(t, "Authorization"));
    free(t);
    /* A member's /metrics for the operator's page: GET, no body */
    c.method = "GET";
    c.path = "/metrics";
    c.bearer = "sk-1";
    t = relay_request_text(&c, &n);
    want = "GET /metrics HTTP/1.1\r\nHost: 10.0.0.2:8080\r\nContent-Length: 0\r\n"
           "Authorization: Bearer sk-1\r\nX-Strata-Forwarded: 7\r\nConnection: close\r\n\r\n";
    CHECKF(t && n == strlen(want) && !strcmp(t, want), "%.600s", t ? t : "(null)");
    free(t);
}

/* ---------------------------------------------------------------- end to end */

static struct {
    struct serve_metrics m;
    struct front *f;
    struct http_server *http;
    pthread_t th;
    int port;
    int up_fd, up_port; /* the fake upstream's listening socket */
    char route[64];     /* what the fake route answers */
    atomic_int routes;  /* how many times it was asked */
    int client_port;    /* the front clients talk to */
    /* the pooled front: channels from fake_open (TCP to the upstream), counted */
    struct serve_metrics pm;
    struct front *pf;
    struct http_server *phttp;
    pthread_t pth;
    int pport;
    atomic_int opens;
} G;

static int fake_route(void *ctx, const char *model, int prompt_tokens, char *addr, size_t cap,
                      uint64_t *node, char *err)
{
    (void)ctx, (void)model, (void)prompt_tokens, (void)err;
    atomic_fetch_add(&G.routes, 1);
    snprintf(addr, cap, "%.600s", G.route);
    *node = 2;
    return 0;
}

static void *http_thread(void *arg)
{
    char err[ERRMSG_LEN];
    http_server_run(arg, err);
    return NULL;
}

/* The pooled front's channels: plain TCP to the fake upstream (the cluster's are sealed). */
static int fake_open(void *ctx, uint64_t node, int timeout_ms, int cancel_fd, char *err)
{
    (void)ctx, (void)node, (void)timeout_ms, (void)cancel_fd;
    atomic_fetch_add(&G.opens, 1);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)G.up_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return errmsg_set(err, "connect: refused");
    }
    return fd;
}

static int listen_any(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 8) ||
        getsockname(fd, (struct sockaddr *)&a, &sl))
        return -1;
    *port = ntohs(a.sin_port);
    return fd;
}

static int start(void)
{
    char err[ERRMSG_LEN];
    metrics_init(&G.m);
    struct front_config fc = {.forward_hold_ms = 300};
    G.f = front_new(&fc, &G.m, err);
    struct http_server_config hc = {.host = "127.0.0.1",
                                    .max_conns = 16,
                                    .max_head = 8192,
                                    .max_body = 64 * 1024,
                                    .read_timeout_ms = 2000,
                                    .idle_timeout_ms = 5000,
                                    .write_timeout_ms = 5000,
                                    .max_pending_write = 1 << 20};
    struct http_handler h = front_handler(G.f);
    if (!G.f || !(G.http = http_server_new(&hc, &h, &G.m, err))) return -1;
    front_set_server(G.f, G.http);
    G.port = http_server_port(G.http);
    /* No front_set_ready: this node has no model. */
    struct front_ext x = {.route = fake_route, .node_id = 7};
    front_set_ext(G.f, &x);
    if ((G.up_fd = listen_any(&G.up_port)) < 0) return -1;
    snprintf(G.route, sizeof G.route, "127.0.0.1:%d", G.up_port);
    pthread_create(&G.th, NULL, http_thread, G.http);
    G.client_port = G.port;
    /* The pooled front: 2 idle channels per node. */
    metrics_init(&G.pm);
    struct front_config pc = {
        .forward_hold_ms = 300, .forward_pool = 2, .forward_deadline_ms = 1500};
    G.pf = front_new(&pc, &G.pm, err);
    struct http_handler ph = front_handler(G.pf);
    if (!G.pf || !(G.phttp = http_server_new(&hc, &ph, &G.pm, err))) return -1;
    front_set_server(G.pf, G.phttp);
    G.pport = http_server_port(G.phttp);
    struct front_ext px = {.route = fake_route, .forward_open = fake_open, .node_id = 8};
    front_set_ext(G.pf, &px);
    pthread_create(&G.pth, NULL, http_thread, G.phttp);
    return 0;
}

static void stop(void)
{
    http_server_stop(G.http);
    http_server_stop(G.phttp);
    pthread_join(G.th, NULL);
    pthread_join(G.pth, NULL);
    http_server_free(G.http);
    http_server_free(G.phttp);
    front_free(G.f);
    front_free(G.pf);
    close(G.up_fd);
}

static void send_str(int fd, const char *s)
{
    size_t n = strlen(s);
    while (n) {
        ssize_t k = send(fd, s, n, MSG_NOSIGNAL);
        if (k <= 0) return;
        s += k, n -= (size_t)k;
    }
}

/* The client: one request on its own connection; reads the answer in a thread, recording the
 * bytes as they come (events[]: how much had arrived when). */
struct client {
    const char *request;
    pthread_t th;
    int fd;
    char raw[16384];
    size_t len;
    atomic_int got_event; /* an SSE "data: " line has arrived */
    atomic_int finished;
};

static void *client_main(void *arg)
{
    struct client *c = arg;
    for (;;) {
        ssize_t k = recv(c->fd, c->raw + c->len, sizeof c->raw - 1 - c->len, 0);
        if (k <= 0) break;
        c->len += (size_t)k;
        c->raw[c->len] = 0;
        if (strstr(c->raw, "data: ")) atomic_store(&c->got_event, 1);
    }
    atomic_store(&c->finished, 1);
    return NULL;
}

static void client_start_to(struct client *c, const char *path, const char *body, const char *extra)
{
    memset(c, 0, sizeof *c);
    char req[2048];
    snprintf(req, sizeof req,
             "POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s"
             "Content-Length: %zu\r\n\r\n%s",
             path, extra ? extra : "", strlen(body), body);
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)G.client_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {.tv_sec = 20};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(c->fd, (struct sockaddr *)&a, sizeof a) == 0) send_str(c->fd, req);
    pthread_create(&c->th, NULL, client_main, c);
}

static void client_start(struct client *c, const char *body, const char *extra)
{
    client_start_to(c, "/v1/completions", body, extra);
}

static void client_wait(struct client *c)
{
    pthread_join(c->th, NULL);
    close(c->fd);
}

/* The answer's body, de-chunked by the reader under test's sibling (http_response). */
static void client_body(const struct client *c, struct parsed *p)
{
    parse(c->raw, c->len, 0, p);
}

/* The upstream: read one request whole from fd (10 s at most); its length, 0 at EOF. */
static size_t upstream_read(int fd, char *req, size_t cap)
{
    size_t n = 0;
    req[0] = 0;
    for (;;) {
        char *end = strstr(req, "\r\n\r\n");
        const char *cl = strstr(req, "Content-Length: ");
        if (end && cl && n >= (size_t)(end + 4 - req) + strtoul(cl + 16, NULL, 10)) break;
        ssize_t k = recv(fd, req + n, cap - 1 - n, 0);
        if (k <= 0) break;
        n += (size_t)k;
        req[n] = 0;
    }
    return n;
}

/* The upstream: accept one connection (waiting at most 10 s), read the request whole. */
static int upstream_accept(char *req, size_t cap)
{
    struct pollfd p = {.fd = G.up_fd, .events = POLLIN};
    if (poll(&p, 1, 10000) != 1) return -1;
    int fd = accept(G.up_fd, NULL, NULL);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    upstream_read(fd, req, cap);
    return fd;
}

static const char *BODY = "{\"prompt\":\"Once upon a time\",\"max_tokens\":3,\"temperature\":0}";

TEST(forwards_and_returns_a_json_answer)
{
    struct client c;
    client_start(&c, BODY, "Authorization: Bearer sk-abc\r\n");
    char req[8192];
    int up = upstream_accept(req, sizeof req);
    CHECK(up >= 0);
    CHECKF(strstr(req, "POST /v1/completions HTTP/1.1\r\n") == req, "%.600s", req);
    CHECKF(strstr(req, "\r\nX-Strata-Forwarded: 7\r\n") && strstr(req, "Bearer sk-abc\r\n"),
           "%.600s", req);
    CHECKF(!strcmp(strstr(req, "\r\n\r\n") + 4, BODY), "%.600s", req);
    send_str(up, "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: "
                 "11\r\nRetry-After: 3\r\n\r\n{\"e\":\"bad\"}");
    close(up);
    client_wait(&c);
    struct parsed p;
    client_body(&c, &p);
    CHECK_EQ_INT(p.status, 400);
    CHECKF(p.body_len == 11 && !memcmp(p.body, "{\"e\":\"bad\"}", 11), "%.600s", c.raw);
    CHECK(!strcmp(p.retry, "3"));
}

/* /tokenize and /detokenize on a node without the model go where a completion would. */
TEST(tokenize_is_forwarded_like_a_completion)
{
    const char *paths[] = {"/tokenize", "/detokenize"};
    const char *bodies[] = {"{\"content\":\"Hello\",\"with_pieces\":true}", "{\"tokens\":[1,2]}"};
    for (int i = 0; i < 2; i++) {
        struct client c;
        client_start_to(&c, paths[i], bodies[i], "Authorization: Bearer sk-abc\r\n");
        char req[8192], line[64];
        int up = upstream_accept(req, sizeof req);
        CHECK(up >= 0);
        snprintf(line, sizeof line, "POST %s HTTP/1.1\r\n", paths[i]);
        CHECKF(strstr(req, line) == req, "%.600s", req);
        CHECKF(strstr(req, "\r\nX-Strata-Forwarded: 7\r\n") && strstr(req, "Bearer sk-abc\r\n"),
               "%.600s", req);
        CHECKF(!strcmp(strstr(req, "\r\n\r\n") + 4, bodies[i]), "%.600s", req);
        send_str(up, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                     "14\r\n\r\n{\"tokens\":[1]}");
        close(up);
        client_wait(&c);
        struct parsed p;
        client_body(&c, &p);
        CHECK_EQ_INT(p.status, 200);
        CHECKF(p.body_len == 14 && !memcmp(p.body, "{\"tokens\":[1]}", 14), "%.600s", c.raw);
    }
    /* a bad body is answered here, not forwarded */
    struct client c;
    client_start_to(&c, "/tokenize", "{\"content\":5}", NULL);
    client_wait(&c);
    struct parsed p;
    client_body(&c, &p);
    CHECK_EQ_INT(p.status, 400);
}

TEST(streams_events_as_they_come)
{
    struct client c;
    client_start(&c, BODY, NULL);
    char req[8192];
    int up = upstream_accept(req, sizeof req);
    CHECK(up >= 0);
    send_str(up, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: "
                 "chunked\r\n\r\nf\r\ndata: {\"t\":1}\n\n\r\n");
    /* The rest is held back until the client has the first event: streamed, not buffered. */
    for (int i = 0; i < 1000 && !atomic_load(&c.got_event) && !atomic_load(&c.finished); i++)
        usleep(10000);
    int streamed = atomic_load(&c.got_event) && !atomic_load(&c.finished);
    send_str(up, "e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n");
    close(up);
    client_wait(&c);
    CHECKF(streamed, "the first event did not arrive before the rest: %.600s", c.raw);
    struct parsed p;
    client_body(&c, &p);
    CHECK_EQ_INT(p.rc, 1);
    CHECK(!strcmp(p.ctype, "text/event-stream"));
    CHECKF(p.body_len == 29 && !memcmp(p.body, "data: {\"t\":1}\n\ndata: [DONE]\n\n", 29), "%.*s",
           (int)p.body_len, p.body);
}

TEST(upstream_dying_mid_event_gives_an_error_event)
{
    struct client c;
    client_start(&c, BODY, NULL);
    char req[8192];
    int up = upstream_accept(req, sizeof req);
    CHECK(up >= 0);
    /* one whole event, then half of the next, then the node dies */
    send_str(up, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: "
                 "chunked\r\n\r\nf\r\ndata: {\"t\":1}\n\n\r\nf\r\ndata: {\"t\":2");
    close(up);
    client_wait(&c);
    struct parsed p;
    client_body(&c, &p);
    CHECK_EQ_INT(p.rc, 1); /* a complete chunked answer ... */
    p.body[p.body_len] = 0;
    /* ... the whole event, then the error naming the node */
    const char *want = "data: {\"t\":1}\n\ndata: {\"error\":{\"message\":\"Forwarding to node 2 "
                       "(127.0.0.1:";
    CHECKF(!strncmp(p.body, want, strlen(want)), "%.600s", p.body);
    CHECKF(!strstr(p.body, "\"t\":2"), "half an event reached the client: %.600s", p.body);
    CHECKF(strlen(p.body) > 14 && !strcmp(p.body + strlen(p.body) - 14, "data: [DONE]\n\n"),
           "%.600s", p.body);
}

TEST(unreachable_node_gives_502)
{
    int port, fd = listen_any(&port);
    close(fd); /* nothing listens there now */
    snprintf(G.route, sizeof G.route, "127.0.0.1:%d", port);
    struct client c;
    client_start(&c, BODY, NULL);
    client_wait(&c);
    snprintf(G.route, sizeof G.route, "127.0.0.1:%d", G.up_port);
    struct parsed p;
    client_body(&c, &p);
    p.body[p.body_len] = 0;
    CHECK_EQ_INT(p.status, 502);
    CHECKF(!strncmp(c.raw, "HTTP/1.1 502 Bad Gateway\r\n", 26), "%.600s", c.raw);
    CHECKF(strstr(p.body, "Forwarding to node 2 (127.0.0.1:") && strstr(p.body, "refused"),
           "%.600s", p.body);
}

TEST(a_clients_forwarded_header_is_ignored)
{
    int before = atomic_load(&G.routes);
    struct client c;
    client_start(&c, BODY, "X-Strata-Forwarded: 3\r\n");
    char req[8192];
    int up = upstream_accept(req, sizeof req);
    CHECK(up >= 0);
    /* routed like any request, and marked by this node, not by the client */
    CHECKF(strstr(req, "\r\nX-Strata-Forwarded: 7\r\n") && !strstr(req, ": 3\r\n"), "%.600s", req);
    send_str(up,
             "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}");
    close(up);
    client_wait(&c);
    struct parsed p;
    client_body(&c, &p);
    CHECK_EQ_INT(p.status, 200);
    CHECK(atomic_load(&G.routes) > before);
}

TEST(forwarded_requests_from_a_member_are_not_forwarded_again)
{
    int before = atomic_load(&G.routes);
    int sv[2];
    CHECK(!socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
    CHECK(!http_server_adopt(G.http, sv[0], 3)); /* as node 3's forward channel is */
    char req[512];
    snprintf(req, sizeof req,
             "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
             "X-Strata-Forwarded: 3\r\nContent-Length: %zu\r\n\r\n%s",
             strlen(BODY), BODY);
    send_str(sv[1], req);
    struct timeval tv = {.tv_sec = 20};
    setsockopt(sv[1], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    static char raw[8192];
    size_t n = 0;
    ssize_t k;
    while ((k = recv(sv[1], raw + n, sizeof raw - 1 - n, 0)) > 0) n += (size_t)k;
    close(sv[1]);
    struct parsed p;
    parse(raw, n, 0, &p);
    CHECK_EQ_INT(p.status, 503); /* no model here, and no second hop */
    CHECK_EQ_INT(atomic_load(&G.routes), before);
    struct pollfd pf = {.fd = G.up_fd, .events = POLLIN};
    CHECK_EQ_INT(poll(&pf, 1, 0), 0); /* the upstream saw no connection */
}

/* A member's channel is the node its handshake proved: a request on it in another node's name is
 * refused, and routed nowhere. */
TEST(forwarded_in_another_nodes_name_is_refused)
{
    int before = atomic_load(&G.routes);
    int sv[2];
    CHECK(!socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
    CHECK(!http_server_adopt(G.http, sv[0], 3));
    char req[512];
    snprintf(req, sizeof req,
             "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
             "X-Strata-Forwarded: 4\r\nContent-Length: %zu\r\n\r\n%s",
             strlen(BODY), BODY);
    send_str(sv[1], req);
    struct timeval tv = {.tv_sec = 20};
    setsockopt(sv[1], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    static char raw[8192];
    size_t n = 0;
    ssize_t k;
    while ((k = recv(sv[1], raw + n, sizeof raw - 1 - n, 0)) > 0) n += (size_t)k;
    close(sv[1]);
    struct parsed p;
    parse(raw, n, 0, &p);
    p.body[p.body_len] = 0;
    CHECK_EQ_INT(p.status, 403);
    CHECKF(strstr(p.body, "names node 4 on a channel from node 3"), "%.600s", p.body);
    CHECK_EQ_INT(atomic_load(&G.routes), before);
}

TEST(no_replica_is_held_then_503)
{
    snprintf(G.route, sizeof G.route, "none");
    int before = atomic_load(&G.routes);
    struct client c;
    client_start(&c, BODY, NULL);
    client_wait(&c);
    snprintf(G.route, sizeof G.route, "127.0.0.1:%d", G.up_port);
    struct parsed p;
    client_body(&c, &p);
    p.body[p.body_len] = 0;
    CHECK_EQ_INT(p.status, 503);
    CHECK(!strcmp(p.retry, "1"));
    CHECKF(strstr(p.body, "No node of the cluster serves model"), "%.600s", p.body);
    CHECKF(atomic_load(&G.routes) - before >= 2, "asked %d times", atomic_load(&G.routes) - before);
}

TEST(client_leaving_closes_the_upstream)
{
    struct client c;
    client_start(&c, BODY, NULL);
    char req[8192];
    int up = upstream_accept(req, sizeof req);
    CHECK(up >= 0);
    shutdown(c.fd, SHUT_RDWR); /* the client goes away before any answer */
    client_wait(&c);
    char b[16];
    ssize_t k = recv(up, b, sizeof b, 0); /* SO_RCVTIMEO 10 s: a hang fails here */
    close(up);
    CHECK_EQ_INT(k, 0);
}

TEST(metrics_count_forwards_and_failures)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)G.port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    send_str(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    static char m[1 << 16];
    size_t n = 0;
    ssize_t k;
    while ((k = recv(fd, m + n, sizeof m - 1 - n, 0)) > 0) n += (size_t)k;
    m[n] = 0;
    close(fd);
    /* to node 2: the JSON answer, /tokenize and /detokenize, the client's marked request, the
     * stream, the dying stream, the unreachable node, the client that left; failed: the dying
     * stream and the unreachable node; held without a replica: one; received as forwarded: the
     * member's only */
    CHECKF(strstr(m, "strata_forwarded_requests_total{to=\"2\"} 8\n"), "%.600s", m);
    CHECKF(strstr(m, "strata_forward_failures_total{to=\"2\"} 2\n"), "%.600s", m);
    CHECKF(strstr(m, "strata_forward_failures_total{to=\"none\"} 1\n"), "%.600s", m);
    CHECKF(strstr(m, "strata_forwarded_received_total 1\n"), "%.600s", m);
}

/* The node takes the request and dies before a byte of answer (a killed node): the route is
 * asked again and the request served there; the client sees only the second node's answer. */
TEST(node_dying_before_answering_is_retried_elsewhere)
{
    int before = atomic_load(&G.routes);
    struct client c;
    client_start(&c, BODY, NULL);
    char req[8192];
    int up = upstream_accept(req, sizeof req);
    CHECK(up >= 0);
    CHECKF(!strcmp(strstr(req, "\r\n\r\n") + 4, BODY), "%.600s", req);
    close(up); /* read, never answered */
    up = upstream_accept(req, sizeof req);
    CHECK(up >= 0);
    CHECKF(!strcmp(strstr(req, "\r\n\r\n") + 4, BODY), "%.600s", req);
    send_str(up, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n"
                 "\r\n{\"n\":6}");
    close(up);
    client_wait(&c);
    struct parsed p;
    client_body(&c, &p);
    CHECK_EQ_INT(p.status, 200);
    CHECKF(p.body_len == 7 && !memcmp(p.body, "{\"n\":6}", 7), "%.600s", c.raw);
    CHECK_EQ_INT(atomic_load(&G.routes) - before, 2);

    /* Dying after the first event of a stream is not retried: the client has seen a prefix. */
    client_start(&c, BODY, NULL);
    up = upstream_accept(req, sizeof req);
    CHECK(up >= 0);
    send_str(up, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: "
                 "chunked\r\n\r\nf\r\ndata: {\"t\":1}\n\n\r\n");
    close(up);
    client_wait(&c);
    client_body(&c, &p);
    p.body[p.body_len] = 0;
    CHECKF(strstr(p.body, "data: {\"t\":1}\n\ndata: {\"error\"") == p.body, "%.600s", p.body);
    struct pollfd pf = {.fd = G.up_fd, .events = POLLIN};
    CHECK_EQ_INT(poll(&pf, 1, 100), 0); /* no second connection */
}

/* ---------------------------------------------------------------- the pool */

static char *fetch_metrics(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) return NULL;
    send_str(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    static char m[1 << 16];
    size_t n = 0;
    ssize_t k;
    while ((k = recv(fd, m + n, sizeof m - 1 - n, 0)) > 0) n += (size_t)k;
    m[n] = 0;
    close(fd);
    return m;
}

/* One request through the pooled front; the upstream (on *up, or a new connection when *up is
 * -1) answers `answer` keep-alive; 1 when the client got 200 and that body. */
static int pooled_request(int *up, const char *answer)
{
    struct client c;
    char req[8192], resp[256];
    client_start(&c, BODY, NULL);
    if (*up < 0)
        *up = upstream_accept(req, sizeof req);
    else if (!upstream_read(*up, req, sizeof req))
        return 0;
    int ok = *up >= 0 && strstr(req, "\r\nConnection: keep-alive\r\n") != NULL;
    snprintf(resp, sizeof resp,
             "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
             "Connection: keep-alive\r\n\r\n%s",
             strlen(answer), answer);
    send_str(*up, resp);
    client_wait(&c);
    struct parsed p;
    client_body(&c, &p);
    return ok && p.status == 200 && p.body_len == strlen(answer) &&
           !memcmp(p.body, answer, p.body_len);
}

TEST(pool_keeps_a_channel_for_the_next_requests)
{
    G.client_port = G.pport;
    int up = -1;
    CHECK(pooled_request(&up, "{\"n\":1}"));
    CHECK(pooled_request(&up, "{\"n\":2}")); /* the same upstream connection */
    CHECK(pooled_request(&up, "{\"n\":3}"));
    struct pollfd pf = {.fd = G.up_fd, .events = POLLIN};
    CHECK_EQ_INT(poll(&pf, 1, 0), 0); /* no second connection */
    CHECK_EQ_INT(atomic_load(&G.opens), 1);

    /* The node closes the idle channel (its keep-alive timeout): dropped, a fresh one. */
    close(up);
    usleep(100000);
    up = -1;
    CHECK(pooled_request(&up, "{\"n\":4}"));
    CHECK_EQ_INT(atomic_load(&G.opens), 2);

    /* The node closes it with the request unanswered: once more on a fresh channel. */
    struct client c;
    char req[8192];
    client_start(&c, BODY, NULL);
    CHECK(upstream_read(up, req, sizeof req) > 0);
    close(up);
    up = upstream_accept(req, sizeof req);
    CHECK(up >= 0);
    send_str(up, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n"
                 "\r\n{\"n\":5}");
    client_wait(&c);
    struct parsed p;
    client_body(&c, &p);
    CHECK_EQ_INT(p.status, 200);
    CHECK_EQ_INT(atomic_load(&G.opens), 3);
    close(up);

    char *m = fetch_metrics(G.pport);
    CHECK(m != NULL);
    m = m ? strstr(m, "strata_forwarded_requests_total") : NULL;
    CHECKF(m && strstr(m, "strata_forward_channels_opened_total 3\n"), "%.900s", m ? m : "");
    CHECKF(m && strstr(m, "strata_forward_channels_reused_total 3\n"), "%.900s", m ? m : "");
    CHECKF(m && strstr(m, "strata_forward_channels_stale_total 2\n"), "%.900s", m ? m : "");
    CHECKF(m && strstr(m, "strata_forwarded_requests_total{to=\"2\"} 5\n"), "%.900s", m ? m : "");
    G.client_port = G.port;
}

/* The pooled front's deadline (1500 ms from the request's arrival, whatever nodes were tried): a
 * node that dies unanswered is retried elsewhere, one that then sits on the request ends it in a
 * 504 naming the deadline, not after the 120 s a node may stay silent. */
TEST(no_first_byte_by_the_deadline_gives_504_across_reroutes)
{
    G.client_port = G.pport;
    struct client c;
    char req[8192];
    client_start(&c, BODY, NULL);
    int up = upstream_accept(req, sizeof req);
    CHECK(up >= 0);
    close(up); /* died without a byte: asked again */
    up = upstream_accept(req, sizeof req);
    CHECK(up >= 0);
    CHECKF(!strcmp(strstr(req, "\r\n\r\n") + 4, BODY), "%.600s", req);
    client_wait(&c); /* never answered */
    struct parsed p;
    client_body(&c, &p);
    CHECK_EQ_INT(p.status, 504);
    p.body[p.body_len] = 0;
    CHECKF(strstr(p.body, "no answer within 1500 ms of the request's arrival") != NULL, "%.600s",
           p.body);
    close(up);
    G.client_port = G.port;
}

int main(void)
{
    RUN(reader_frames_every_way);
    RUN(reader_refuses_what_it_cannot_frame);
    RUN(reader_body_cut_short_is_an_error);
    RUN(request_text_is_exact);
    if (start()) {
        printf("not ok - start: cannot start the front\n");
        return 1;
    }
    RUN(forwards_and_returns_a_json_answer);
    RUN(tokenize_is_forwarded_like_a_completion);
    RUN(streams_events_as_they_come);
    RUN(upstream_dying_mid_event_gives_an_error_event);
    RUN(unreachable_node_gives_502);
    RUN(a_clients_forwarded_header_is_ignored);
    RUN(forwarded_requests_from_a_member_are_not_forwarded_again);
    RUN(forwarded_in_another_nodes_name_is_refused);
    RUN(no_replica_is_held_then_503);
    RUN(client_leaving_closes_the_upstream);
    RUN(metrics_count_forwards_and_failures);
    RUN(node_dying_before_answering_is_retried_elsewhere);
    RUN(pool_keeps_a_channel_for_the_next_requests);
    RUN(no_first_byte_by_the_deadline_gives_504_across_reroutes);
    stop();
    CHECK_DONE();
}
