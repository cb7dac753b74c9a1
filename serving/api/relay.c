#include "serving/api/relay.h"

#include "os/runtime/clock.h"
#include "serving/api/http_response.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define RBUF_CAP 65536
#define POOL_CAP 256 /* idle channels, all nodes together */

struct relay {
    struct relay_config cfg; /* strings below are our own copies */
    char target[RELAY_ADDR_LEN], path[64], bearer[HTTP_MAX_TOKEN], model[128];
    char *body;
    int cancel_fd;        /* eventfd: the front cancelled */
    int no_pool;          /* a kept channel was found dead: the next try opens a fresh one */
    double first_byte_by; /* clock_now() past which no first byte means 504 (cfg.deadline_ms) */

    pthread_mutex_t mu; /* everything below */
    int refs;           /* the front and the thread */
    int cancelled;
    struct relay_out q; /* queued for the front (q.data: pending bytes) */
    size_t q_cap;
    int q_new;
};

/* ---------------------------------------------------------------- the request */

char *relay_request_text(const struct relay_config *cfg, size_t *len)
{
    char head[1024];
    char auth[HTTP_MAX_TOKEN + 32] = "";
    if (cfg->bearer && cfg->bearer[0])
        snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", cfg->bearer);
    int get = cfg->method && !strcmp(cfg->method, "GET");
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: %s\r\n%sContent-Length: %zu\r\n%s"
                     "X-Strata-Forwarded: %llu\r\nConnection: %s\r\n\r\n",
                     get ? "GET" : "POST", cfg->path, cfg->target ? cfg->target : "",
                     get ? "" : "Content-Type: application/json\r\n", get ? 0 : cfg->body_len, auth,
                     (unsigned long long)cfg->self, cfg->keep_alive ? "keep-alive" : "close");
    if (n < 0 || (size_t)n >= sizeof head) return NULL;
    char *out = malloc((size_t)n + cfg->body_len + 1);
    if (!out) return NULL;
    memcpy(out, head, (size_t)n);
    size_t body_len = get ? 0 : cfg->body_len;
    if (body_len) memcpy(out + n, cfg->body, body_len);
    out[(size_t)n + body_len] = 0;
    *len = (size_t)n + body_len;
    return out;
}

/* ---------------------------------------------------------------- the pool */

struct relay_pool {
    pthread_mutex_t mu;
    int max_idle, idle_ms;
    struct {
        uint64_t node;
        int fd;
        double since;
    } e[POOL_CAP]; /* oldest first */
    int n;
    struct relay_pool_stats st;
};

struct relay_pool *relay_pool_new(int max_idle, int idle_ms)
{
    struct relay_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    pthread_mutex_init(&p->mu, NULL);
    p->max_idle = max_idle > 0 ? max_idle : 0;
    p->idle_ms = idle_ms > 0 ? idle_ms : 10000;
    return p;
}

void relay_pool_free(struct relay_pool *p)
{
    if (!p) return;
    for (int i = 0; i < p->n; i++) close(p->e[i].fd);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

void relay_pool_stats(struct relay_pool *p, struct relay_pool_stats *out)
{
    pthread_mutex_lock(&p->mu);
    *out = p->st;
    out->idle = p->n;
    pthread_mutex_unlock(&p->mu);
}

/* The newest idle channel to node that is still open, or -1. Readable means the node closed it
 * (or sent what no request asked for): either way it cannot carry a request. */
static int pool_take(struct relay_pool *p, uint64_t node)
{
    for (;;) {
        int fd = -1, old = 0;
        pthread_mutex_lock(&p->mu);
        for (int i = p->n - 1; i >= 0; i--) {
            if (p->e[i].node != node) continue;
            fd = p->e[i].fd;
            old = (clock_now() - p->e[i].since) * 1e3 > p->idle_ms;
            memmove(&p->e[i], &p->e[i + 1], (size_t)(p->n - i - 1) * sizeof p->e[0]);
            p->n--;
            break;
        }
        pthread_mutex_unlock(&p->mu);
        if (fd < 0) return -1;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (!old && poll(&pf, 1, 0) == 0) {
            pthread_mutex_lock(&p->mu);
            p->st.reused++;
            pthread_mutex_unlock(&p->mu);
            return fd;
        }
        close(fd);
        pthread_mutex_lock(&p->mu);
        p->st.stale += !old;
        pthread_mutex_unlock(&p->mu);
    }
}

/* Keep fd for node's next request, or close it (the node has its share, or the pool is full:
 * the oldest goes). */
static void pool_put(struct relay_pool *p, uint64_t node, int fd)
{
    int drop = -1;
    pthread_mutex_lock(&p->mu);
    int have = 0;
    for (int i = 0; i < p->n; i++) have += p->e[i].node == node;
    if (have >= p->max_idle) {
        drop = fd;
    } else {
        if (p->n == POOL_CAP) {
            drop = p->e[0].fd;
            memmove(&p->e[0], &p->e[1], (size_t)(p->n - 1) * sizeof p->e[0]);
            p->n--;
        }
        p->e[p->n].node = node;
        p->e[p->n].fd = fd;
        p->e[p->n++].since = clock_now();
    }
    pthread_mutex_unlock(&p->mu);
    if (drop >= 0) close(drop);
}

static void pool_opened(struct relay_pool *p, double seconds)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->st.opened++;
    p->st.open_us += (unsigned long long)(seconds * 1e6 + 0.5);
    pthread_mutex_unlock(&p->mu);
}

/* ---------------------------------------------------------------- the queue */

static void release(struct relay *r)
{
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left) return;
    close(r->cancel_fd);
    pthread_mutex_destroy(&r->mu);
    free(r->q.data);
    free(r->body);
    free(r);
}

/* Under r->mu: tell the front (never after it cancelled). */
static void notify_locked(struct relay *r)
{
    r->q_new = 1;
    if (!r->cancelled && r->cfg.wake) r->cfg.wake(r->cfg.wake_ctx);
}

static int queue_bytes(struct relay *r, const char *p, size_t n)
{
    pthread_mutex_lock(&r->mu);
    int rc = 0;
    if (r->q.len + n > RELAY_MAX_PENDING) {
        rc = -1;
    } else if (r->q.len + n > r->q_cap) {
        size_t cap = (r->q.len + n) * 2 + 4096;
        char *d = realloc(r->q.data, cap);
        if (d) {
            r->q.data = d;
            r->q_cap = cap;
        } else {
            rc = -1;
        }
    }
    if (!rc) {
        memcpy(r->q.data + r->q.len, p, n);
        r->q.len += n;
        if (r->q.streamed) notify_locked(r);
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

static void queue_head(struct relay *r, const struct http_response *h)
{
    pthread_mutex_lock(&r->mu);
    r->q.head = 1;
    r->q.status = h->status;
    snprintf(r->q.content_type, sizeof r->q.content_type, "%s",
             h->content_type[0] ? h->content_type : "application/json");
    int n = 0;
    if (h->retry_after[0])
        n += snprintf(r->q.extra_headers, sizeof r->q.extra_headers, "Retry-After: %s\r\n",
                      h->retry_after);
    if (h->www_authenticate[0] && n < (int)sizeof r->q.extra_headers)
        snprintf(r->q.extra_headers + n, sizeof r->q.extra_headers - (size_t)n,
                 "WWW-Authenticate: %s\r\n", h->www_authenticate);
    r->q.streamed = h->chunked;
    notify_locked(r);
    pthread_mutex_unlock(&r->mu);
}

static void queue_end(struct relay *r, int failed, int status, const char *msg)
{
    pthread_mutex_lock(&r->mu);
    if (failed) {
        r->q.failed = 1;
        r->q.fail_status = status;
        snprintf(r->q.error, sizeof r->q.error, "%s", msg);
    } else {
        r->q.done = 1;
    }
    notify_locked(r);
    pthread_mutex_unlock(&r->mu);
}

int relay_take(struct relay *r, struct relay_out *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&r->mu);
    int any = r->q_new;
    r->q_new = 0;
    if (any) {
        *out = r->q;
        /* Streamed bytes go as they come; a whole body only with its end. */
        if (r->q.streamed || r->q.done) {
            r->q.data = NULL;
            r->q.len = r->q_cap = 0;
        } else {
            out->data = NULL;
            out->len = 0;
        }
        if (!out->data || !out->len) {
            free(out->data);
            out->data = NULL;
            out->len = 0;
        }
        r->q.head = 0; /* once */
    }
    pthread_mutex_unlock(&r->mu);
    return any;
}

void relay_cancel(struct relay *r)
{
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    r->cancelled = 1;
    pthread_mutex_unlock(&r->mu);
    uint64_t one = 1;
    ssize_t w = write(r->cancel_fd, &one, sizeof one);
    (void)w;
    release(r);
}

/* ---------------------------------------------------------------- the thread */

/* Waits up to ms for fd (events) or the cancel; 1: fd ready, 0: timeout, -1: cancelled. */
static int wait_fd(struct relay *r, int fd, short events, int ms)
{
    struct pollfd p[2] = {{.fd = r->cancel_fd, .events = POLLIN}, {.fd = fd, .events = events}};
    for (;;) {
        int n = poll(p, fd >= 0 ? 2 : 1, ms);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 || (p[0].revents & POLLIN)) return -1;
        return n > 0;
    }
}

/* Held for lack of a replica: ask the route until it names a node, or give up. 0: a target is
 * set; 1: the relay ended (local, failed or cancelled). */
static int hold(struct relay *r)
{
    double end = clock_now() + r->cfg.hold_ms / 1e3;
    if (end > r->first_byte_by) end = r->first_byte_by;
    for (;;) {
        char addr[RELAY_ADDR_LEN] = "";
        uint64_t node = 0;
        /* Under mu: relay_cancel waits for a route call in progress, so nothing the route
         * reads (the control thread's state) is touched after the front let go. */
        pthread_mutex_lock(&r->mu);
        int rt = r->cancelled    ? -1
                 : !r->cfg.route ? RELAY_ROUTE_NONE
                                 : r->cfg.route(r->cfg.route_ctx, r->model, r->cfg.prompt_tokens,
                                                addr, sizeof addr, &node);
        pthread_mutex_unlock(&r->mu);
        if (rt < 0) return 1;
        char why[ERRMSG_LEN];
        if (rt == RELAY_ROUTE_NONE && r->cfg.lost &&
            r->cfg.lost(r->cfg.route_ctx, r->model, why, sizeof why)) {
            pthread_mutex_lock(&r->mu);
            r->q.lost = 1;
            pthread_mutex_unlock(&r->mu);
            queue_end(r, 1, 503, why);
            return 1;
        }
        if (rt == RELAY_ROUTE_REMOTE) {
            snprintf(r->target, sizeof r->target, "%s", addr);
            r->cfg.target_node = node;
            return 0;
        }
        if (rt == RELAY_ROUTE_LOCAL) {
            pthread_mutex_lock(&r->mu);
            r->q.local = 1;
            notify_locked(r);
            pthread_mutex_unlock(&r->mu);
            return 1;
        }
        if (clock_now() >= end) {
            char msg[ERRMSG_LEN];
            snprintf(msg, sizeof msg,
                     "No node of the cluster serves model %s yet (held %d ms); retry shortly.",
                     r->model[0] ? r->model : "(default)", r->cfg.hold_ms);
            queue_end(r, 1, 503, msg);
            return 1;
        }
        if (wait_fd(r, -1, 0, RELAY_HOLD_POLL_MS) < 0) return 1;
    }
}

static int split_addr(const char *addr, char *host, size_t hcap, char *port, size_t pcap)
{
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr || !colon[1]) return -1;
    const char *h = addr;
    size_t hl = (size_t)(colon - addr);
    if (h[0] == '[' && hl >= 2 && h[hl - 1] == ']') h++, hl -= 2;
    if (hl >= hcap || strlen(colon + 1) >= pcap) return -1;
    memcpy(host, h, hl);
    host[hl] = 0;
    snprintf(port, pcap, "%s", colon + 1);
    return 0;
}

/* A connected socket to the target, or -1 with err (-2: cancelled). */
static int connect_target(struct relay *r, char *err)
{
    char host[RELAY_ADDR_LEN], port[16];
    if (split_addr(r->target, host, sizeof host, port, sizeof port))
        return errmsg_set(err, "its API address '%s' is not HOST:PORT", r->target);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(host, port, &hints, &ai);
    if (rc) return errmsg_set(err, "address %s: %s", r->target, gai_strerror(rc));
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(ai);
        return errmsg_set(err, "socket: %s", strerror(errno));
    }
    int one = 1, idle = 5, intvl = 2, cnt = 3;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    if (rc && errno != EINPROGRESS) {
        errmsg_set(err, "connect: %s", strerror(errno));
        close(fd);
        return -1;
    }
    if (rc) {
        int w = wait_fd(r, fd, POLLOUT, r->cfg.connect_timeout_ms);
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (w < 0) {
            close(fd);
            return -2;
        }
        if (w == 0) {
            close(fd);
            return errmsg_set(err, "connect: no answer within %d ms", r->cfg.connect_timeout_ms);
        }
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        if (soerr) {
            close(fd);
            return errmsg_set(err, "connect: %s", strerror(soerr));
        }
    }
    return fd;
}

static int send_all(struct relay *r, int fd, const char *p, size_t n, char *err)
{
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int w = wait_fd(r, fd, POLLOUT, r->cfg.idle_timeout_ms);
            if (w < 0) return -2;
            if (w == 0) return errmsg_set(err, "sending the request: timed out");
            continue;
        }
        return errmsg_set(err, "sending the request: %s", strerror(errno));
    }
    return 0;
}

/* Body bytes to pass on now: for an event stream only whole events (up to the last blank line),
 * so a dying upstream never leaves half an event at the client. */
static size_t passable(const struct http_response *h, const char *p, size_t n, int final)
{
    if (final || !h->chunked || strncmp(h->content_type, "text/event-stream", 17)) return n;
    while (n >= 2 && !(p[n - 2] == '\n' && p[n - 1] == '\n')) n--;
    return n < 2 ? 0 : n;
}

/* Reads the answer into the queue. 0: complete; -1 with *status and err; -2: cancelled. *got:
 * some byte of an answer arrived; *reusable: it ended by its framing, the node keeps the
 * connection open and nothing followed it (the channel may carry the next request). */
static int read_answer(struct relay *r, int fd, int *status, int *got, int *reusable, char *err)
{
    static const size_t cap = RBUF_CAP;
    char *buf = malloc(cap);
    if (!buf) return *status = 502, errmsg_set(err, "out of memory");
    struct http_response h;
    http_response_init(&h);
    size_t len = 0, held = 0; /* held: decoded bytes kept back (an incomplete event) */
    int rc = -1, head_sent = 0;
    *status = 502;
    *got = *reusable = 0;
    for (;;) {
        /* before the first byte, no later than the request's deadline */
        int ms = r->cfg.idle_timeout_ms, by_deadline = 0;
        if (!*got) {
            double left = (r->first_byte_by - clock_now()) * 1e3;
            if (left < ms) ms = left > 0 ? (int)left : 0, by_deadline = 1;
        }
        int w = wait_fd(r, fd, POLLIN, ms);
        if (w < 0) {
            rc = -2;
            break;
        }
        if (w == 0) {
            *status = 504;
            if (by_deadline)
                errmsg_set(err, "no answer within %d ms of the request's arrival",
                           r->cfg.deadline_ms);
            else
                errmsg_set(err, "no answer for %d ms", r->cfg.idle_timeout_ms);
            break;
        }
        if (len == cap) {
            errmsg_set(err, "an answer line or event over %zu bytes", cap);
            break;
        }
        ssize_t k = recv(fd, buf + len, cap - len, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (k < 0) {
            errmsg_set(err, "reading the answer: %s", strerror(errno));
            break;
        }
        if (k == 0) {
            if (http_response_eof(&h, err) < 0) break;
            if (held && queue_bytes(r, buf, held)) {
                errmsg_set(err, "the client does not take the answer");
                break;
            }
            rc = 0;
            break;
        }
        len += (size_t)k;
        *got = 1;
        size_t ready = 0;
        int fr = http_response_feed(&h, buf, &len, &ready, err);
        if (fr < 0) break;
        if (h.have_head && !head_sent) {
            queue_head(r, &h);
            head_sent = 1;
        }
        size_t pass = passable(&h, buf, ready, fr == 1);
        if (pass && queue_bytes(r, buf, pass)) {
            errmsg_set(err, "the client does not take the answer");
            break;
        }
        http_response_took(&h, buf, &len, pass);
        held = ready - pass;
        if (fr == 1) {
            *reusable = h.keep_alive && !len && !held;
            rc = 0;
            break;
        }
    }
    free(buf);
    return rc;
}

static int cancelled(struct relay *r)
{
    pthread_mutex_lock(&r->mu);
    int c = r->cancelled;
    pthread_mutex_unlock(&r->mu);
    return c;
}

/* A channel to the target: a kept one, or a fresh one (the cluster's sealed channel, or TCP).
 * The socket (*reused says which), -1 with err (nothing was sent), -2 cancelled. */
static int take_channel(struct relay *r, int *reused, char *err)
{
    *reused = 0;
    if (r->cfg.pool && !r->no_pool) {
        int fd = pool_take(r->cfg.pool, r->cfg.target_node);
        if (fd >= 0) return *reused = 1, fd;
    }
    double t0 = clock_now();
    int fd;
    if (r->cfg.open_channel) {
        fd = r->cfg.open_channel(r->cfg.channel_ctx, r->cfg.target_node, r->cfg.connect_timeout_ms,
                                 r->cancel_fd, err);
        int fl = fd >= 0 ? fcntl(fd, F_GETFL) : 0;
        if (fd >= 0 && (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK))) {
            close(fd);
            fd = errmsg_set(err, "forward channel: fcntl: %s", strerror(errno));
        }
    } else {
        fd = connect_target(r, err);
    }
    if (fd >= 0) pool_opened(r->cfg.pool, clock_now() - t0);
    return fd;
}

/* Whether the request's first byte may still come (cfg.deadline_ms from its arrival). */
static int in_time(const struct relay *r)
{
    return clock_now() < r->first_byte_by;
}

static void *relay_main(void *arg)
{
    struct relay *r = arg;
    char err[ERRMSG_LEN], msg[ERRMSG_LEN];
    for (int tries = 1; r->target[0] || !hold(r); tries++) {
        pthread_mutex_lock(&r->mu);
        r->q.node = r->cfg.target_node;
        snprintf(r->q.addr, sizeof r->q.addr, "%s", r->target);
        pthread_mutex_unlock(&r->mu);
        int status = 502, reused = 0, got = 0, reusable = 0;
        int fd = take_channel(r, &reused, err), rc = fd;
        if (fd == -1 && r->cfg.unreachable && tries < RELAY_MAX_TRIES && in_time(r) &&
            !cancelled(r)) {
            /* nothing was sent: another node (or this one) may serve it */
            r->cfg.unreachable(r->cfg.route_ctx, r->cfg.target_node);
            r->target[0] = 0;
            continue;
        }
        if (fd >= 0) {
            struct relay_config c = r->cfg;
            c.target = r->target;
            size_t n = 0;
            char *req = relay_request_text(&c, &n);
            rc = req ? send_all(r, fd, req, n, err) : errmsg_set(err, "out of memory");
            free(req);
            if (!rc) rc = read_answer(r, fd, &status, &got, &reusable, err);
            if (rc == -1 && reused && !got && !cancelled(r)) {
                /* The node closed the kept channel as we took it: it never answered, so it
                 * never started the request. Once more on a fresh channel. */
                close(fd);
                pthread_mutex_lock(&r->cfg.pool->mu);
                r->cfg.pool->st.stale++;
                pthread_mutex_unlock(&r->cfg.pool->mu);
                r->no_pool = 1;
                tries--;
                continue;
            }
            if (rc == -1 && !got && status != 504 && r->cfg.unreachable &&
                tries < RELAY_MAX_TRIES && in_time(r) && !cancelled(r)) {
                /* The node took the request and closed without a byte of answer: it died (or
                 * is stopping) while the request ran there, and the client has seen nothing.
                 * A completion has no side effect, so it is served elsewhere rather than
                 * failed. A node that is slow (the idle timeout, 504) is not retried. */
                close(fd);
                r->cfg.unreachable(r->cfg.route_ctx, r->cfg.target_node);
                r->target[0] = 0;
                continue;
            }
            if (!rc && reusable && r->cfg.pool)
                pool_put(r->cfg.pool, r->cfg.target_node, fd);
            else
                close(fd);
        }
        if (rc == -1) {
            snprintf(msg, sizeof msg, "Forwarding to node %llu (%s) failed: %.380s",
                     (unsigned long long)r->cfg.target_node, r->target, err);
            queue_end(r, 1, status, msg);
        } else if (rc == 0) {
            queue_end(r, 0, 0, NULL);
        }
        break;
    }
    release(r);
    return NULL;
}

struct relay *relay_start(const struct relay_config *cfg, char *err)
{
    struct relay *r = calloc(1, sizeof *r);
    if (!r || !(r->body = malloc(cfg->body_len + 1))) {
        free(r);
        errmsg_set(err, "relay: out of memory");
        return NULL;
    }
    r->cfg = *cfg;
    memcpy(r->body, cfg->body, cfg->body_len);
    r->cfg.body = r->body;
    snprintf(r->target, sizeof r->target, "%s", cfg->target ? cfg->target : "");
    snprintf(r->path, sizeof r->path, "%s", cfg->path);
    snprintf(r->bearer, sizeof r->bearer, "%s", cfg->bearer ? cfg->bearer : "");
    snprintf(r->model, sizeof r->model, "%s", cfg->model ? cfg->model : "");
    r->cfg.path = r->path;
    r->cfg.bearer = r->bearer;
    r->cfg.model = r->model;
    r->cfg.target = NULL;
    r->cfg.keep_alive = cfg->pool && cfg->pool->max_idle > 0;
    if (r->cfg.connect_timeout_ms <= 0) r->cfg.connect_timeout_ms = 3000;
    if (r->cfg.idle_timeout_ms <= 0) r->cfg.idle_timeout_ms = 120000;
    if (r->cfg.deadline_ms <= 0) r->cfg.deadline_ms = r->cfg.idle_timeout_ms;
    r->first_byte_by = clock_now() + r->cfg.deadline_ms / 1e3;
    r->refs = 2;
    r->cancel_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    pthread_mutex_init(&r->mu, NULL);
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&at, 256 * 1024);
    pthread_t t;
    if (r->cancel_fd < 0 || pthread_create(&t, &at, relay_main, r)) {
        pthread_attr_destroy(&at);
        if (r->cancel_fd >= 0) close(r->cancel_fd);
        pthread_mutex_destroy(&r->mu);
        free(r->body);
        free(r);
        errmsg_set(err, "relay: cannot start its thread: %s", strerror(errno));
        return NULL;
    }
    pthread_attr_destroy(&at);
    return r;
}
