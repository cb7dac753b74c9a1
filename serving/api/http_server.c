#include "serving/api/http_server.h"

#include "os/runtime/clock.h"
#include "os/common/errmsg.h"
#include "os/runtime/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <linux/sockios.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum conn_state { C_READ, C_BUSY, C_STREAM };

#define LINGER_S 2.0

struct http_conn {
    struct http_server *srv;
    int fd;
    enum conn_state state;
    char *rbuf;
    size_t rlen, rcap;
    char *wbuf;
    size_t wlen, woff, wcap;
    struct http_parser p; /* the request being read (and, while busy, answered) */
    int sent_continue;
    size_t consumed; /* bytes of the current request (head + body) */
    double t_start;  /* first byte of the request being read */
    double t_idle;   /* when the connection became idle */
    /* Delivery progress: bytes the kernel took (sent_total) minus what it still holds unacked
     * (SIOCOUTQ) is what the client's TCP acknowledged. A client that stops reading stops
     * acknowledging once its receive window is full, however much the kernel buffers on our
     * side (loopback autotuning makes that megabytes, so "our queue is not draining" alone
     * would notice the stall late or never). */
    unsigned long long sent_total, acked_seen;
    double t_progress; /* last acknowledgement progress while output is outstanding */
    int outstanding;   /* output is queued here or unacknowledged in the kernel */
    int keep_alive, close_after_write, chunked_out, reading_paused;
    int lingering; /* answered and half-closed: discarding input until EOF */
    double t_linger;
    int dead, in_process, epoll_out;
    int from_cluster;   /* adopted (http_server_adopt): X-Strata-Forwarded counts on it */
    uint64_t from_node; /* adopted: the node the channel's handshake proved */
    void *user;
    struct http_conn *prev, *next;
};

struct http_server {
    struct http_server_config cfg;
    struct http_handler h;
    struct serve_metrics *m;
    int lfd, efd, wfd, port;
    volatile int stopping;
    volatile int drain_ms; /* > 0: graceful shutdown requested */
    double drain_deadline;
    struct http_conn *conns, *graveyard;
    int n_conns;
    pthread_mutex_t adopt_mu; /* sockets handed over by other threads, not yet connections */
    int *adopt;
    uint64_t *adopt_node;
    int n_adopt, adopt_cap;
};

static char listen_tag, wake_tag;

/* ---------------------------------------------------------------- setup */

struct http_server *http_server_new(const struct http_server_config *cfg,
                                    const struct http_handler *h, struct serve_metrics *m,
                                    char *err)
{
    struct http_server *s = calloc(1, sizeof *s);
    if (!s) {
        errmsg_set(err, "http: out of memory");
        return NULL;
    }
    s->cfg = *cfg;
    s->h = *h;
    s->m = m;
    s->lfd = s->efd = s->wfd = -1;
    pthread_mutex_init(&s->adopt_mu, NULL);
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(cfg->host, port, &hints, &ai);
    if (rc) {
        errmsg_set(err, "http: address %s: %s", cfg->host, gai_strerror(rc));
        goto fail;
    }
    s->lfd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s->lfd < 0) {
        errmsg_set(err, "http: socket: %s", strerror(errno));
        goto fail;
    }
    int one = 1;
    setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(s->lfd, ai->ai_addr, ai->ai_addrlen) || listen(s->lfd, 1024)) {
        errmsg_set(err, "http: bind %s:%d: %s", cfg->host, cfg->port, strerror(errno));
        goto fail;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(s->lfd, (struct sockaddr *)&ss, &sl);
    s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
    freeaddrinfo(ai);
    ai = NULL;
    s->efd = epoll_create1(EPOLL_CLOEXEC);
    s->wfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->efd < 0 || s->wfd < 0) {
        errmsg_set(err, "http: epoll/eventfd: %s", strerror(errno));
        goto fail;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &listen_tag};
    epoll_ctl(s->efd, EPOLL_CTL_ADD, s->lfd, &ev);
    ev.data.ptr = &wake_tag;
    epoll_ctl(s->efd, EPOLL_CTL_ADD, s->wfd, &ev);
    return s;
fail:
    if (ai) freeaddrinfo(ai);
    http_server_free(s);
    return NULL;
}

int http_server_port(const struct http_server *s)
{
    return s->port;
}

void http_server_stop(struct http_server *s)
{
    s->stopping = 1;
    uint64_t one = 1;
    ssize_t w = write(s->wfd, &one, sizeof one);
    (void)w;
}

void http_server_shutdown(struct http_server *s, int grace_ms)
{
    s->drain_ms = grace_ms > 0 ? grace_ms : 1;
    uint64_t one = 1;
    ssize_t w = write(s->wfd, &one, sizeof one);
    (void)w;
}

void http_server_wake(struct http_server *s)
{
    uint64_t one = 1;
    ssize_t w = write(s->wfd, &one, sizeof one);
    (void)w;
}

/* ---------------------------------------------------------------- connections */

static void conn_events(struct http_conn *c)
{
    if (c->dead) return;
    uint32_t ev = EPOLLRDHUP;
    if (!c->reading_paused) ev |= EPOLLIN;
    if (c->wlen > c->woff) ev |= EPOLLOUT;
    struct epoll_event e = {.events = ev, .data.ptr = c};
    epoll_ctl(c->srv->efd, EPOLL_CTL_MOD, c->fd, &e);
    c->epoll_out = (ev & EPOLLOUT) != 0;
}

/* Close now; the struct is freed (and on_abort called) from the loop. */
static void conn_kill(struct http_conn *c)
{
    if (c->dead) return;
    c->dead = 1;
    epoll_ctl(c->srv->efd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    struct http_server *s = c->srv;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    c->prev = NULL;
    c->next = s->graveyard;
    s->graveyard = c;
    s->n_conns--;
    if (s->m) atomic_store(&s->m->connections, s->n_conns);
}

static void bury(struct http_server *s)
{
    while (s->graveyard) {
        struct http_conn *c = s->graveyard;
        s->graveyard = c->next;
        if (c->user && s->h.on_abort) s->h.on_abort(s->h.ctx, c, c->user);
        free(c->rbuf);
        free(c->wbuf);
        free(c);
    }
}

static int flush(struct http_conn *c)
{
    while (c->woff < c->wlen) {
        ssize_t k = send(c->fd, c->wbuf + c->woff, c->wlen - c->woff, MSG_NOSIGNAL);
        if (k > 0) {
            c->woff += (size_t)k;
            c->sent_total += (unsigned long long)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        conn_kill(c);
        return -1;
    }
    if (c->woff == c->wlen) {
        c->woff = c->wlen = 0;
        if (c->close_after_write && !c->lingering) {
            /* Lingering close: half-close, then read and discard until the client closes (or
             * LINGER_S), so unread input (a refused body) does not turn into a reset that
             * destroys the answer before the client reads it. */
            shutdown(c->fd, SHUT_WR);
            c->lingering = 1;
            c->t_linger = clock_now();
            c->reading_paused = 0;
            conn_events(c);
            return -1;
        }
    }
    if ((c->wlen > c->woff) != c->epoll_out) conn_events(c);
    return 0;
}

static int conn_write(struct http_conn *c, const char *data, size_t len)
{
    if (c->dead) return -1;
    if (c->wlen - c->woff + len > c->srv->cfg.max_pending_write) {
        log_warn("http", "dropping a client that does not read (%zu bytes pending)",
                 c->wlen - c->woff + len);
        conn_kill(c);
        return -1;
    }
    if (c->wlen + len > c->wcap) {
        if (c->woff) {
            memmove(c->wbuf, c->wbuf + c->woff, c->wlen - c->woff);
            c->wlen -= c->woff;
            c->woff = 0;
        }
        if (c->wlen + len > c->wcap) {
            size_t cap = (c->wlen + len) * 2 + 1024;
            char *p = realloc(c->wbuf, cap);
            if (!p) {
                conn_kill(c);
                return -1;
            }
            c->wbuf = p;
            c->wcap = cap;
        }
    }
    if (!c->outstanding) {
        c->outstanding = 1;
        c->t_progress = clock_now();
    }
    memcpy(c->wbuf + c->wlen, data, len);
    c->wlen += len;
    return 0;
}

static int conn_printf(struct http_conn *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int conn_printf(struct http_conn *c, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof buf) return -1;
    return conn_write(c, buf, (size_t)n);
}

static void process_input(struct http_conn *c);

/* The answer to the current request is queued: get ready for the next one. */
static void request_done(struct http_conn *c)
{
    c->user = NULL;
    c->state = C_READ;
    if (c->consumed > c->rlen) c->consumed = c->rlen;
    memmove(c->rbuf, c->rbuf + c->consumed, c->rlen - c->consumed);
    c->rlen -= c->consumed;
    c->consumed = 0;
    http_parser_reset(&c->p);
    c->sent_continue = 0;
    c->t_start = c->rlen ? clock_now() : 0;
    c->t_idle = clock_now();
    if (!c->keep_alive) c->close_after_write = 1;
    if (c->reading_paused) {
        c->reading_paused = 0;
        conn_events(c);
    }
    if (flush(c)) return;
    if (!c->in_process && c->rlen) process_input(c);
}

int http_respond(struct http_conn *c, int status, const char *content_type, const char *body,
                 size_t len, const char *extra_headers)
{
    if (c->dead) return -1;
    if (conn_printf(c,
                    "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s"
                    "Connection: %s\r\n\r\n",
                    status, http_status_text(status), content_type, len,
                    extra_headers ? extra_headers : "", c->keep_alive ? "keep-alive" : "close"))
        return -1;
    if (conn_write(c, body, len)) return -1;
    request_done(c);
    return c->dead ? -1 : 0;
}

int http_stream_begin(struct http_conn *c, int status, const char *content_type)
{
    if (c->dead) return -1;
    /* HTTP/1.0 has no chunked encoding: the stream ends with the connection. */
    c->chunked_out = c->p.req.minor >= 1;
    if (!c->chunked_out) c->keep_alive = 0;
    c->state = C_STREAM;
    if (conn_printf(c,
                    "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nCache-Control: no-cache\r\n%s"
                    "Connection: %s\r\n\r\n",
                    status, http_status_text(status), content_type,
                    c->chunked_out ? "Transfer-Encoding: chunked\r\n" : "",
                    c->keep_alive ? "keep-alive" : "close"))
        return -1;
    return flush(c);
}

int http_stream_write(struct http_conn *c, const char *data, size_t len)
{
    if (c->dead) return -1;
    if (!len) return 0;
    if (c->chunked_out && conn_printf(c, "%zx\r\n", len)) return -1;
    if (conn_write(c, data, len)) return -1;
    if (c->chunked_out && conn_write(c, "\r\n", 2)) return -1;
    return flush(c);
}

int http_stream_end(struct http_conn *c)
{
    if (c->dead) return -1;
    if (c->chunked_out && conn_write(c, "0\r\n\r\n", 5)) return -1;
    request_done(c);
    return c->dead ? -1 : 0;
}

void http_conn_set_user(struct http_conn *c, void *user)
{
    c->user = user;
}

void *http_conn_user(const struct http_conn *c)
{
    return c->user;
}

int http_conn_alive(const struct http_conn *c)
{
    return !c->dead;
}

/* An error the server itself answers (bad head, too large, timeout), then closes. */
static char *error_body(const struct http_server *s, int status, const char *msg)
{
    return s->h.error_body ? s->h.error_body(s->h.ctx, status, msg) : NULL;
}

static void respond_error(struct http_conn *c, int status, const char *msg, const char *extra)
{
    char *body = error_body(c->srv, status, msg);
    c->keep_alive = 0;
    c->consumed = c->rlen;
    if (c->srv->m) metrics_request(c->srv->m, status == 503 ? OUTCOME_REJECTED : OUTCOME_INVALID);
    http_respond(c, status, "application/json", body ? body : "{}", body ? strlen(body) : 2, extra);
    free(body);
}

static void process_input(struct http_conn *c)
{
    struct http_server *s = c->srv;
    c->in_process = 1;
    while (!c->dead && c->state == C_READ && c->rlen && !c->close_after_write) {
        int status;
        char err[ERRMSG_LEN];
        /* A chunked body is decoded in place as it arrives (rlen may shrink), so the buffer
         * holds at most head + max_body + one incomplete chunk line. */
        int rc = http_parse_request(&c->p, c->rbuf, &c->rlen, s->cfg.max_head, s->cfg.max_body,
                                    &status, err);
        if (rc < 0) {
            respond_error(c, status, err, NULL);
            break;
        }
        if (c->p.have_head) c->keep_alive = c->p.req.keep_alive;
        if (rc == 0) {
            /* The head is in and the body is not: a client waiting for 100 Continue gets it. */
            if (c->p.have_head && c->p.req.expect_continue && !c->sent_continue &&
                (c->p.req.chunked || c->p.req.content_length > 0)) {
                c->sent_continue = 1;
                if (conn_printf(c, "HTTP/1.1 100 Continue\r\n\r\n")) break;
                flush(c);
            }
            break;
        }
        c->consumed = c->p.consumed;
        c->state = C_BUSY;
        /* The header counts only from another node's front; from a client it means nothing. On
         * a member's channel it must name the node the channel's handshake proved. */
        if (!c->from_cluster) c->p.req.forwarded = 0;
        if (c->from_cluster && c->p.req.forwarded && c->p.req.forwarded_by != c->from_node) {
            char why[160];
            snprintf(why, sizeof why,
                     "X-Strata-Forwarded names node %llu on a channel from node %llu: refused",
                     c->p.req.forwarded_by, (unsigned long long)c->from_node);
            log_warn("http", "%s", why);
            respond_error(c, 403, why, NULL);
            break;
        }
        s->h.on_request(s->h.ctx, c, &c->p.req, c->p.body, c->p.body_len);
    }
    c->in_process = 0;
}

static void on_readable(struct http_conn *c)
{
    struct http_server *s = c->srv;
    if (c->lingering) {
        char sink[4096];
        for (;;) {
            ssize_t k = recv(c->fd, sink, sizeof sink, 0);
            if (k > 0 || (k < 0 && errno == EINTR)) continue;
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            conn_kill(c);
            return;
        }
    }
    size_t limit = s->cfg.max_head + s->cfg.max_body + 4096;
    for (;;) {
        if (c->rlen == c->rcap) {
            if (c->rcap >= limit) {
                /* Busy with a request and the client keeps sending: stop reading (EPOLLRDHUP
                 * still reports a hang-up). */
                if (c->state != C_READ) {
                    c->reading_paused = 1;
                    conn_events(c);
                }
                break;
            }
            size_t cap = c->rcap ? c->rcap * 2 : 4096;
            if (cap > limit) cap = limit;
            char *p = realloc(c->rbuf, cap);
            if (!p) {
                conn_kill(c);
                return;
            }
            c->rbuf = p;
            c->rcap = cap;
        }
        ssize_t k = recv(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen, 0);
        if (k > 0) {
            if (!c->rlen && c->state == C_READ) c->t_start = clock_now();
            c->rlen += (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        /* EOF or error: the client is gone (a half-closed client cannot read our answer to a
         * request it has not finished sending, and streaming needs both directions). */
        conn_kill(c);
        return;
    }
    if (c->state == C_READ) process_input(c);
}

/* A new connection on fd: refused with 503 over the limit, else watched. */
static void conn_add(struct http_server *s, int fd, int from_cluster, uint64_t from_node)
{
    if (s->n_conns >= s->cfg.max_conns) {
        char msg[96];
        snprintf(msg, sizeof msg,
                 "The server is handling %d connections, its limit; retry shortly.", s->n_conns);
        char *body = error_body(s, 503, msg);
        char head[256];
        int hn = snprintf(head, sizeof head,
                          "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json"
                          "\r\nContent-Length: %zu\r\nRetry-After: 1\r\nConnection: close"
                          "\r\n\r\n",
                          body ? strlen(body) : 0);
        ssize_t w = send(fd, head, (size_t)hn, MSG_NOSIGNAL);
        if (body && w == hn) w = send(fd, body, strlen(body), MSG_NOSIGNAL);
        (void)w;
        free(body);
        shutdown(fd, SHUT_WR);
        close(fd);
        if (s->m) metrics_request(s->m, OUTCOME_REJECTED);
        return;
    }
    struct http_conn *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return;
    }
    c->srv = s;
    c->fd = fd;
    c->from_cluster = from_cluster;
    c->from_node = from_node;
    c->t_idle = clock_now();
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    s->n_conns++;
    if (s->m) atomic_store(&s->m->connections, s->n_conns);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
    epoll_ctl(s->efd, EPOLL_CTL_ADD, fd, &ev);
}

static void on_accept(struct http_server *s)
{
    for (;;) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        conn_add(s, fd, 0, 0);
    }
}

int http_server_adopt(struct http_server *s, int fd, uint64_t from_node)
{
    pthread_mutex_lock(&s->adopt_mu);
    int ok = !s->stopping && !s->drain_ms;
    if (ok && s->n_adopt == s->adopt_cap) {
        int cap = s->adopt_cap ? s->adopt_cap * 2 : 16;
        int *a = realloc(s->adopt, (size_t)cap * sizeof *a);
        if (a) s->adopt = a;
        uint64_t *an = a ? realloc(s->adopt_node, (size_t)cap * sizeof *an) : NULL;
        if (an) s->adopt_node = an;
        if (a && an)
            s->adopt_cap = cap;
        else
            ok = 0;
    }
    if (ok) {
        s->adopt_node[s->n_adopt] = from_node;
        s->adopt[s->n_adopt++] = fd;
    }
    pthread_mutex_unlock(&s->adopt_mu);
    if (!ok) {
        close(fd);
        return -1;
    }
    http_server_wake(s);
    return 0;
}

/* Front thread: the sockets other threads handed over become connections. */
static void take_adopted(struct http_server *s)
{
    pthread_mutex_lock(&s->adopt_mu);
    if (!s->n_adopt) {
        pthread_mutex_unlock(&s->adopt_mu);
        return;
    }
    int n = s->n_adopt;
    int fds[64];
    uint64_t nodes[64];
    if (n > 64) n = 64;
    memcpy(fds, s->adopt, (size_t)n * sizeof *fds);
    memcpy(nodes, s->adopt_node, (size_t)n * sizeof *nodes);
    memmove(s->adopt, s->adopt + n, (size_t)(s->n_adopt - n) * sizeof *fds);
    memmove(s->adopt_node, s->adopt_node + n, (size_t)(s->n_adopt - n) * sizeof *nodes);
    s->n_adopt -= n;
    int more = s->n_adopt > 0;
    pthread_mutex_unlock(&s->adopt_mu);
    for (int i = 0; i < n; i++) {
        int fl = fcntl(fds[i], F_GETFL);
        if (fl < 0 || fcntl(fds[i], F_SETFL, fl | O_NONBLOCK)) {
            close(fds[i]);
            continue;
        }
        conn_add(s, fds[i], 1, nodes[i]);
    }
    if (more) http_server_wake(s);
}

/* Has the client acknowledged nothing for write_timeout_ms while output is outstanding? */
static int write_stalled(struct http_conn *c, double now)
{
    int outq = 0;
    if (ioctl(c->fd, SIOCOUTQ, &outq) < 0 || outq < 0) outq = 0;
    unsigned long long acked = c->sent_total - (unsigned long long)outq;
    if (acked != c->acked_seen) {
        c->acked_seen = acked;
        c->t_progress = now;
    }
    if (c->wlen == c->woff && outq == 0) {
        c->outstanding = 0;
        return 0;
    }
    return (now - c->t_progress) * 1e3 > c->srv->cfg.write_timeout_ms;
}

static void check_timeouts(struct http_server *s)
{
    double now = clock_now();
    struct http_conn *c = s->conns, *next;
    for (; c; c = next) {
        next = c->next;
        if (c->lingering) {
            if (now - c->t_linger > LINGER_S) conn_kill(c);
            continue;
        }
        if (c->outstanding && write_stalled(c, now)) {
            log_warn("http",
                     "dropping a client that stopped reading (nothing acknowledged for "
                     "%d ms)",
                     s->cfg.write_timeout_ms);
            conn_kill(c);
            continue;
        }
        if (c->state != C_READ) continue;
        if (c->rlen || c->p.have_head) {
            if (c->t_start && (now - c->t_start) * 1e3 > s->cfg.read_timeout_ms && !c->wlen)
                respond_error(c, 408, "http: the request did not arrive in time", NULL);
        } else if (!c->wlen && (now - c->t_idle) * 1e3 > s->cfg.idle_timeout_ms) {
            conn_kill(c);
        }
    }
}

/* Graceful shutdown: no new connections, idle ones closed; done when nothing is in flight. */
static int drain_step(struct http_server *s, double now)
{
    if (!s->drain_deadline) {
        s->drain_deadline = now + s->drain_ms / 1e3;
        epoll_ctl(s->efd, EPOLL_CTL_DEL, s->lfd, NULL);
        close(s->lfd);
        s->lfd = -1;
    }
    int busy = 0;
    struct http_conn *c = s->conns, *next;
    for (; c; c = next) {
        next = c->next;
        if (c->lingering || (c->state == C_READ && !c->rlen && c->wlen == c->woff))
            conn_kill(c);
        else
            busy = 1;
    }
    return !busy || now > s->drain_deadline;
}

int http_server_run(struct http_server *s, char *err)
{
    struct epoll_event evs[64];
    double last_check = 0;
    while (!s->stopping) {
        int n = epoll_wait(s->efd, evs, 64, 100);
        if (n < 0) {
            if (errno == EINTR) continue;
            return errmsg_set(err, "http: epoll_wait: %s", strerror(errno));
        }
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &listen_tag) {
                on_accept(s);
            } else if (p == &wake_tag) {
                uint64_t v;
                ssize_t r = read(s->wfd, &v, sizeof v);
                (void)r;
                take_adopted(s);
                if (s->h.on_wake) s->h.on_wake(s->h.ctx);
            } else {
                struct http_conn *c = p;
                if (c->dead) continue;
                uint32_t e = evs[i].events;
                if (e & (EPOLLERR | EPOLLHUP)) {
                    conn_kill(c);
                    continue;
                }
                if (e & EPOLLOUT) flush(c);
                if (!c->dead && (e & (EPOLLIN | EPOLLRDHUP))) {
                    if (c->reading_paused && (e & EPOLLRDHUP))
                        conn_kill(c);
                    else
                        on_readable(c);
                }
            }
        }
        if (s->cfg.tick) s->cfg.tick(s->cfg.tick_ctx);
        double now = clock_now();
        if (s->drain_ms && drain_step(s, now)) break;
        if (now - last_check > 0.05) {
            check_timeouts(s);
            last_check = now;
        }
        bury(s);
    }
    /* Flush what is queued, best effort, then close everything. */
    for (struct http_conn *c = s->conns; c; c = c->next)
        if (c->wlen > c->woff) {
            ssize_t w = send(c->fd, c->wbuf + c->woff, c->wlen - c->woff, MSG_NOSIGNAL);
            (void)w;
        }
    while (s->conns) conn_kill(s->conns);
    bury(s);
    return 0;
}

void http_server_free(struct http_server *s)
{
    if (!s) return;
    while (s->conns) conn_kill(s->conns);
    bury(s);
    if (s->lfd >= 0) close(s->lfd);
    if (s->efd >= 0) close(s->efd);
    if (s->wfd >= 0) close(s->wfd);
    for (int i = 0; i < s->n_adopt; i++) close(s->adopt[i]);
    free(s->adopt);
    free(s->adopt_node);
    pthread_mutex_destroy(&s->adopt_mu);
    free(s);
}
