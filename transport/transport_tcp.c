/* transport_tcp: the fabric protocol over kernel TCP sockets.
 *
 * A byte stream of frames (wire.h). TCP already orders and retransmits, so a frame is opened in
 * place and its sequence number must be exactly the next one (no replays). A frame that fails its
 * CRC or authentication cannot be skipped in a stream, so it closes the connection. */
#include "transport/transport.h"

#include "os/common/errmsg.h"
#include "os/runtime/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#define OUT_HIGH  (8u << 20) /* queued bytes above which tcp_send answers TP_BUSY */
#define MAX_CONNS 64

struct tcp_conn {
    struct tp_conn_base b;
    int fd;
    int server;
    int connecting; /* client: non-blocking connect in progress */
    int open_reported;
    uint8_t nonce[WIRE_NONCE_LEN];
    struct session s;
    uint8_t *out;
    size_t out_len, out_off, out_cap;
    uint8_t *in;
    size_t in_len, in_off;
    uint8_t *msg;
    uint64_t tx_seq, rx_seq;
    int eof;
    struct tcp_conn *next;
};

struct tcp_tp {
    int lfd;
    uint32_t next_id;
    struct tcp_conn *conns;
};

static void conn_fail(struct tcp_conn *c, const char *fmt, const char *why)
{
    if (c->b.state != TP_CLOSED) {
        /* A message longer than ERRMSG_LEN is cut: the peer and the reason's start say enough. */
        if (snprintf(c->b.err, sizeof c->b.err, fmt, c->b.peer, why) >= (int)sizeof c->b.err)
            c->b.err[sizeof c->b.err - 1] = 0;
        c->b.state = TP_CLOSED;
    }
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static struct tcp_conn *conn_new(struct tp *t, int fd, const char *peer)
{
    struct tcp_conn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->in = malloc(WIRE_MAX_FRAME);
    c->msg = malloc(WIRE_MAX_MSG);
    if (!c->in || !c->msg) {
        free(c->in), free(c->msg), free(c);
        return NULL;
    }
    c->b.t = t;
    c->fd = fd;
    snprintf(c->b.peer, sizeof c->b.peer, "%s", peer);
    struct tcp_tp *tt = t->impl;
    c->next = tt->conns;
    tt->conns = c;
    int one = 1, prio = 6, tos = 0x10; /* serving by default: interactive band, low delay */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_PRIORITY, &prio, sizeof prio);
    setsockopt(fd, IPPROTO_IP, IP_TOS, &tos, sizeof tos);
    return c;
}

static int out_append(struct tcp_conn *c, size_t need, uint8_t **at)
{
    if (c->out_off && c->out_off == c->out_len) c->out_off = c->out_len = 0;
    if (c->out_cap - c->out_len < need) {
        if (c->out_off) { /* reclaim what was already written */
            memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
            c->out_len -= c->out_off;
            c->out_off = 0;
        }
        if (c->out_cap - c->out_len < need) {
            size_t cap = c->out_cap ? c->out_cap : 65536;
            while (cap - c->out_len < need) cap *= 2;
            uint8_t *p = realloc(c->out, cap);
            if (!p) return -1;
            c->out = p;
            c->out_cap = cap;
        }
    }
    *at = c->out + c->out_len;
    return 0;
}

static void tcp_set_bulk(struct tp_conn *conn)
{
    struct tcp_conn *c = (struct tcp_conn *)conn;
    if (c->fd < 0) return;
    int prio = 0, tos = 0x20; /* lowest band; DSCP CS1 */
    setsockopt(c->fd, SOL_SOCKET, SO_PRIORITY, &prio, sizeof prio);
    setsockopt(c->fd, IPPROTO_IP, IP_TOS, &tos, sizeof tos);
}

static int tcp_open(struct tp *t, char *err)
{
    struct tcp_tp *tt = calloc(1, sizeof *tt);
    if (!tt) return errmsg_set(err, "out of memory");
    tt->lfd = -1;
    tt->next_id = 1;
    t->impl = tt;
    if (!t->cfg.listen) return 0;
    uint32_t ip;
    uint16_t port;
    if (tp_parse_addr(t->cfg.listen, &ip, &port, err)) goto fail;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
        errmsg_set(err, "socket: %s", strerror(errno));
        goto fail;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = ip};
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 16) || set_nonblock(fd)) {
        errmsg_set(err, "listen on %s: %s", t->cfg.listen, strerror(errno));
        close(fd);
        goto fail;
    }
    tt->lfd = fd;
    return 0;
fail:
    free(tt);
    t->impl = NULL;
    return -1;
}

static struct tp_conn *tcp_connect(struct tp *t, const char *addr, char *err)
{
    uint32_t ip;
    uint16_t port;
    if (tp_parse_addr(addr, &ip, &port, err)) return NULL;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || set_nonblock(fd)) {
        errmsg_set(err, "%s: socket: %s", addr, strerror(errno));
        if (fd >= 0) close(fd);
        return NULL;
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = ip};
    struct tcp_conn *c = conn_new(t, fd, addr);
    if (!c) {
        close(fd);
        errmsg_set(err, "%s: out of memory", addr);
        return NULL;
    }
    c->b.state = TP_CONNECTING;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) && errno != EINPROGRESS)
        conn_fail(c, "%s: connect: %s", strerror(errno));
    else
        c->connecting = 1;
    return (struct tp_conn *)c;
}

static void send_hello(struct tcp_conn *c)
{
    uint8_t *at;
    if (out_append(c, WIRE_HDR_LEN + WIRE_HELLO_LEN, &at))
        return conn_fail(c, "%s: %s", "out of memory");
    auth_nonce(c->nonce);
    c->out_len += auth_hello(&c->b.t->cfg.key, c->nonce, at);
}

/* Handshake frames, before the connection is open. */
static void handshake(struct tcp_conn *c, const struct wire_hdr *h, const uint8_t *body)
{
    struct tp *t = c->b.t;
    char err[ERRMSG_LEN];
    if (c->server) {
        uint8_t cn[WIRE_NONCE_LEN];
        if (h->type != WIRE_HELLO) return conn_fail(c, "%s: %s", "expected HELLO");
        if (auth_hello_check(&t->cfg.key, body, h->length, cn, err)) {
            t->stats.refused++;
            log_warn("fabric", "refused %s: %s", c->b.peer, err);
            return conn_fail(c, "%s: refused: %s", err);
        }
        struct tcp_tp *tt = t->impl;
        uint8_t *at;
        if (out_append(c, WIRE_HDR_LEN + WIRE_HELLO_ACK_LEN, &at))
            return conn_fail(c, "%s: %s", "out of memory");
        c->out_len += auth_hello_ack(&t->cfg.key, cn, tt->next_id++, &c->s, at);
        c->b.state = TP_OPEN;
    } else {
        if (h->type != WIRE_HELLO_ACK) return conn_fail(c, "%s: %s", "expected HELLO_ACK");
        if (auth_hello_ack_check(&t->cfg.key, body, h->length, c->nonce, &c->s, err)) {
            t->stats.refused++;
            c->b.refused = 1;
            return conn_fail(c, "%s: refused: %s", err);
        }
        c->b.state = TP_OPEN;
    }
}

/* A whole frame at the front of the input buffer: its length, or 0 if incomplete. Fails the
 * connection on a malformed header. */
static size_t front_frame(struct tcp_conn *c, struct wire_hdr *h)
{
    size_t avail = c->in_len - c->in_off;
    if (avail < WIRE_HDR_LEN) return 0;
    char err[ERRMSG_LEN];
    if (wire_hdr_peek(h, c->in + c->in_off, avail, err)) {
        c->b.t->stats.dropped_bad++;
        conn_fail(c, "%s: %s", err);
        return 0;
    }
    if (avail < WIRE_HDR_LEN + (size_t)h->length) return 0;
    return WIRE_HDR_LEN + h->length;
}

static void read_some(struct tcp_conn *c)
{
    struct tp *t = c->b.t;
    if (c->in_off == c->in_len) c->in_off = c->in_len = 0;
    if (c->in_off && c->in_len == WIRE_MAX_FRAME) {
        memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
        c->in_len -= c->in_off;
        c->in_off = 0;
    }
    while (c->fd >= 0 && c->in_len < WIRE_MAX_FRAME) {
        ssize_t n = read(c->fd, c->in + c->in_len, WIRE_MAX_FRAME - c->in_len);
        if (n > 0) {
            c->in_len += (size_t)n;
            t->stats.bytes_rx += (uint64_t)n;
            continue;
        }
        if (n == 0) {
            c->eof = 1;
            if (c->fd >= 0) close(c->fd);
            c->fd = -1;
        } else if (errno != EAGAIN && errno != EINTR) {
            conn_fail(c, "%s: read: %s", strerror(errno));
        }
        break;
    }
    /* Handshake frames are consumed here; messages wait for tcp_recv. */
    while (c->b.state == TP_CONNECTING) {
        struct wire_hdr h;
        size_t n = front_frame(c, &h);
        if (!n) break;
        char err[ERRMSG_LEN];
        if (wire_frame_check(&h, c->in + c->in_off, n, err)) {
            t->stats.dropped_bad++;
            conn_fail(c, "%s: handshake: %s", err);
            break;
        }
        handshake(c, &h, c->in + c->in_off + WIRE_HDR_LEN);
        c->in_off += n;
    }
    if (c->eof && c->b.state == TP_CONNECTING) c->b.refused = 1;
    if (c->eof && c->b.state == TP_CONNECTING)
        conn_fail(c, "%s: %s", "peer closed during the handshake (wrong cluster key?)");
}

static void write_some(struct tcp_conn *c)
{
    while (c->fd >= 0 && c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
            c->b.t->stats.bytes_tx += (uint64_t)n;
        } else {
            if (n < 0 && errno != EAGAIN && errno != EINTR)
                conn_fail(c, "%s: write: %s", strerror(errno));
            break;
        }
    }
}

static void tcp_close(struct tp_conn *conn);

static int tcp_poll(struct tp *t, int timeout_ms)
{
    struct tcp_tp *tt = t->impl;
    /* Refused or failed handshakes on the listening side were never handed out: free them. */
    for (struct tcp_conn *c = tt->conns, *next; c; c = next) {
        next = c->next;
        if (c->server && !c->open_reported && c->b.state == TP_CLOSED)
            tcp_close((struct tp_conn *)c);
    }
    struct pollfd pf[MAX_CONNS + 1];
    struct tcp_conn *who[MAX_CONNS + 1];
    int n = 0;
    if (tt->lfd >= 0) pf[n] = (struct pollfd){tt->lfd, POLLIN, 0}, who[n++] = NULL;
    for (struct tcp_conn *c = tt->conns; c && n <= MAX_CONNS; c = c->next) {
        if (c->fd < 0) continue;
        short ev = 0;
        if (c->in_len - c->in_off < WIRE_MAX_FRAME || c->in_off) ev |= POLLIN;
        if (c->connecting || c->out_off < c->out_len) ev |= POLLOUT;
        pf[n] = (struct pollfd){c->fd, ev, 0}, who[n++] = c;
    }
    int r = poll(pf, (nfds_t)n, timeout_ms);
    if (r <= 0) return 0;
    for (int i = 0; i < n; i++) {
        if (!pf[i].revents) continue;
        if (!who[i]) {
            struct sockaddr_in sa;
            socklen_t sl = sizeof sa;
            int fd;
            while ((fd = accept(tt->lfd, (struct sockaddr *)&sa, &sl)) >= 0) {
                char peer[48], ip[INET_ADDRSTRLEN];
                inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
                snprintf(peer, sizeof peer, "%s:%u", ip, ntohs(sa.sin_port));
                struct tcp_conn *c = set_nonblock(fd) ? NULL : conn_new(t, fd, peer);
                if (!c) {
                    close(fd);
                    continue;
                }
                c->server = 1;
                c->b.state = TP_CONNECTING;
                sl = sizeof sa;
            }
            continue;
        }
        struct tcp_conn *c = who[i];
        if (c->connecting && (pf[i].revents & (POLLOUT | POLLERR | POLLHUP))) {
            int e = 0;
            socklen_t el = sizeof e;
            getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &el);
            if (e) {
                conn_fail(c, "%s: connect: %s", strerror(e));
                continue;
            }
            c->connecting = 0;
            send_hello(c);
        }
        if (pf[i].revents & (POLLIN | POLLHUP | POLLERR)) read_some(c);
        write_some(c);
    }
    return r;
}

static struct tp_conn *tcp_accept(struct tp *t)
{
    struct tcp_tp *tt = t->impl;
    for (struct tcp_conn *c = tt->conns; c; c = c->next)
        if (c->server && c->b.state == TP_OPEN && !c->open_reported) {
            c->open_reported = 1;
            return (struct tp_conn *)c;
        }
    return NULL;
}

static int tcp_send(struct tp_conn *conn, const void *msg, size_t len)
{
    struct tcp_conn *c = (struct tcp_conn *)conn;
    if (c->b.state == TP_CLOSED || c->eof) return -1;
    if (c->b.state != TP_OPEN || c->out_len - c->out_off > OUT_HIGH) return TP_BUSY;
    if (len > WIRE_MAX_MSG) return -1;
    uint8_t *at;
    if (out_append(c, WIRE_HDR_LEN + len + WIRE_TAG_LEN, &at)) return -1;
    c->out_len += session_seal(&c->s, at, WIRE_MSG, WIRE_F_END, c->tx_seq++, msg, len);
    c->b.t->stats.frames_tx++;
    write_some(c);
    return TP_OK;
}

static int tcp_recv(struct tp_conn *conn, const uint8_t **msg, size_t *len)
{
    struct tcp_conn *c = (struct tcp_conn *)conn;
    struct tp *t = c->b.t;
    if (c->b.state == TP_OPEN) {
        struct wire_hdr h;
        size_t n = front_frame(c, &h);
        if (n) {
            char err[ERRMSG_LEN];
            size_t ptlen = 0;
            if (session_open(&c->s, c->in + c->in_off, n, &h, c->msg, &ptlen, err)) {
                t->stats.dropped_bad++;
                log_warn("fabric", "%s: dropped: %s", c->b.peer, err);
                conn_fail(c, "%s: %s", err);
                return -1;
            }
            c->in_off += n;
            if (h.type == WIRE_CLOSE) {
                conn_fail(c, "%s: %s", "peer closed the connection");
                return -1;
            }
            if (h.type != WIRE_MSG || h.seq != c->rx_seq) {
                t->stats.dropped_bad++;
                conn_fail(c, "%s: %s", "frame out of sequence (replay?)");
                return -1;
            }
            c->rx_seq++;
            t->stats.frames_rx++;
            *msg = c->msg;
            *len = ptlen;
            return 1;
        }
        if (c->eof) conn_fail(c, "%s: %s", "peer closed the connection");
    }
    return c->b.state == TP_CLOSED ? -1 : 0;
}

static size_t tcp_pending(struct tp_conn *conn)
{
    struct tcp_conn *c = (struct tcp_conn *)conn;
    if (c->fd < 0) return 0;
    int q = 0;
    /* Bytes the kernel has not had acknowledged yet count as pending too. */
    if (ioctl(c->fd, SIOCOUTQ, &q)) q = 0;
    return c->out_len - c->out_off + (size_t)q;
}

static void tcp_close(struct tp_conn *conn)
{
    struct tcp_conn *c = (struct tcp_conn *)conn;
    struct tcp_tp *tt = c->b.t->impl;
    for (struct tcp_conn **pp = &tt->conns; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    if (c->fd >= 0) close(c->fd);
    free(c->in), free(c->msg), free(c->out), free(c);
}

static void tcp_destroy(struct tp *t)
{
    struct tcp_tp *tt = t->impl;
    if (!tt) return;
    while (tt->conns) tcp_close((struct tp_conn *)tt->conns);
    if (tt->lfd >= 0) close(tt->lfd);
    free(tt);
}

const struct tp_ops tp_tcp_ops = {
    .name = "tcp",
    .open = tcp_open,
    .connect = tcp_connect,
    .accept = tcp_accept,
    .poll = tcp_poll,
    .send = tcp_send,
    .recv = tcp_recv,
    .pending = tcp_pending,
    .close = tcp_close,
    .destroy = tcp_destroy,
    .set_bulk = tcp_set_bulk,
};
