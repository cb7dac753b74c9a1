#include "cluster/sealed_conn.h"

#include "os/common/errmsg.h"
#include "os/runtime/log.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { SC_HANDSHAKE, SC_OPEN, SC_CLOSED };

/* Relay reads at most this much from raft's end per frame. */
#define RELAY_CHUNK (64u << 10)

int sealed_conn_parse_addr(const char *hostport, struct sockaddr_in *sa, char *err)
{
    char host[64];
    const char *colon = strrchr(hostport, ':');
    if (!colon || (size_t)(colon - hostport) >= sizeof host)
        return errmsg_set(err, "%s: want IPv4:PORT", hostport);
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = 0;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || end == colon + 1 || port < 0 || port > 65535)
        return errmsg_set(err, "%s: bad port", hostport);
    if (uv_ip4_addr(host, (int)port, sa)) return errmsg_set(err, "%s: bad IPv4 address", hostport);
    return 0;
}

static atomic_ullong forged;

/* Every open sconn, of every loop (tests run several loops in several threads). */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sconn *live;

static void live_add(struct sconn *c)
{
    pthread_mutex_lock(&live_mu);
    c->live_next = live;
    if (live) live->live_prev = c;
    live = c;
    pthread_mutex_unlock(&live_mu);
}

static void live_remove(struct sconn *c)
{
    pthread_mutex_lock(&live_mu);
    if (c->live_prev)
        c->live_prev->live_next = c->live_next;
    else if (live == c)
        live = c->live_next;
    if (c->live_next) c->live_next->live_prev = c->live_prev;
    c->live_prev = c->live_next = NULL;
    pthread_mutex_unlock(&live_mu);
}

void sealed_conn_close_all(uv_loop_t *loop, const char *why)
{
    for (;;) {
        struct sconn *c = NULL;
        pthread_mutex_lock(&live_mu);
        for (struct sconn *p = live; p && !c; p = p->live_next)
            if (p->loop == loop) c = p;
        pthread_mutex_unlock(&live_mu);
        if (!c) return;
        sealed_conn_close(c, why); /* leaves the list */
    }
}

unsigned long long sconn_forged_frames(void)
{
    return atomic_load(&forged);
}

int sealed_conn_is_open(const struct sconn *c)
{
    return c->state == SC_OPEN;
}

/* ---------------------------------------------------------------- closing */

static void handle_closed(uv_handle_t *h)
{
    struct sconn *c = h->data;
    if (--c->open_handles) return;
    if (c->cb.on_close) c->cb.on_close(c, c->why);
    free(c->in);
    free(c->pt);
    free(c);
}

void sealed_conn_close(struct sconn *c, const char *why)
{
    if (c->state == SC_CLOSED) return;
    live_remove(c);
    int was_handshake = c->state == SC_HANDSHAKE;
    c->state = SC_CLOSED;
    snprintf(c->why, sizeof c->why, "%s", why ? why : "closed");
    if (was_handshake && c->is_client && c->cb.on_ready) c->cb.on_ready(c, -1, c->why);
    uv_close((uv_handle_t *)&c->deadline, handle_closed);
    uv_close((uv_handle_t *)&c->tcp, handle_closed);
    if (c->piped) uv_close((uv_handle_t *)&c->pipe, handle_closed);
}

/* ---------------------------------------------------------------- writing */

struct wreq {
    uv_write_t req;
    uint8_t buf[];
};

static void write_done(uv_write_t *req, int status)
{
    struct sconn *c = req->handle->data;
    free(req);
    if (status < 0 && status != UV_ECANCELED) {
        char why[128];
        snprintf(why, sizeof why, "write: %s", uv_strerror(status));
        sealed_conn_close(c, why);
    }
}

/* Queue a copy of frame[0..len) on the TCP stream. */
static int write_tcp(struct sconn *c, const uint8_t *frame, size_t len)
{
    struct wreq *w = malloc(sizeof *w + len);
    if (!w) {
        sealed_conn_close(c, "out of memory");
        return -1;
    }
    memcpy(w->buf, frame, len);
    uv_buf_t b = uv_buf_init((char *)w->buf, (unsigned)len);
    int rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, write_done);
    if (rc) {
        free(w);
        sealed_conn_close(c, uv_strerror(rc));
        return -1;
    }
    return 0;
}

static int seal_and_write(struct sconn *c, const void *msg, size_t len)
{
    struct wreq *w = malloc(sizeof *w + WIRE_HDR_LEN + len + WIRE_TAG_LEN);
    if (!w) {
        sealed_conn_close(c, "out of memory");
        return -1;
    }
    size_t n = session_seal(&c->s, w->buf, WIRE_MSG, WIRE_F_END, c->tx_seq++, msg, len);
    uv_buf_t b = uv_buf_init((char *)w->buf, (unsigned)n);
    int rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, write_done);
    if (rc) {
        free(w);
        sealed_conn_close(c, uv_strerror(rc));
        return -1;
    }
    return 0;
}

int sealed_conn_send(struct sconn *c, const void *msg, size_t len)
{
    if (c->state != SC_OPEN || c->piped || len > WIRE_MAX_MSG) return -1;
    return seal_and_write(c, msg, len);
}

/* ---------------------------------------------------------------- relay */

static void relay_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    (void)hint;
    struct sconn *c = h->data;
    buf->base = (char *)c->pt; /* free between reads: frames are sealed at once */
    buf->len = RELAY_CHUNK;
}

struct shut {
    uv_shutdown_t req;
    struct sconn *c;
    char why[64];
};

static void shut_done(uv_shutdown_t *req, int status)
{
    struct shut *sh = (struct shut *)req;
    (void)status;
    sealed_conn_close(sh->c, sh->why);
    free(sh);
}

/* A relay's source ended (EOF): what is still queued for the other side goes out first, then the
 * connection closes. uv_close alone would drop writes the kernel has not taken yet (an answer's
 * last bytes, with the server's Connection: close right behind them). */
static void relay_finish(struct sconn *c, uv_stream_t *dest, const char *why)
{
    if (c->state == SC_CLOSED) return;
    struct shut *sh = malloc(sizeof *sh);
    if (sh) {
        sh->c = c;
        snprintf(sh->why, sizeof sh->why, "%s", why);
        uv_read_stop(c->piped && dest == (uv_stream_t *)&c->tcp ? (uv_stream_t *)&c->pipe
                                                                : (uv_stream_t *)&c->tcp);
        if (!uv_shutdown(&sh->req, dest, shut_done)) return;
        free(sh);
    }
    sealed_conn_close(c, why);
}

static void relay_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    struct sconn *c = s->data;
    if (n == UV_EOF) return relay_finish(c, (uv_stream_t *)&c->tcp, "local end closed");
    if (n < 0) return sealed_conn_close(c, uv_strerror((int)n));
    if (n > 0 && c->state == SC_OPEN) seal_and_write(c, buf->base, (size_t)n);
}

/* Plaintext from the peer to raft's end: copied, since uv_write keeps the buffer. */
static void relay_deliver(struct sconn *c, const uint8_t *p, size_t n)
{
    struct wreq *w = malloc(sizeof *w + n);
    if (!w) return sealed_conn_close(c, "out of memory");
    memcpy(w->buf, p, n);
    uv_buf_t b = uv_buf_init((char *)w->buf, (unsigned)n);
    int rc = uv_write(&w->req, (uv_stream_t *)&c->pipe, &b, 1, write_done);
    if (rc) {
        free(w);
        sealed_conn_close(c, uv_strerror(rc));
    }
}

int sealed_conn_relay_fd(struct sconn *c, char *err)
{
    int fd[2];
    if (c->state != SC_OPEN || c->piped) {
        errmsg_set(err, "%s: relay on a connection that is not open", c->peer);
        return -1;
    }
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fd)) {
        errmsg_set(err, "%s: socketpair: %m", c->peer);
        return -1;
    }
    if (uv_pipe_init(c->loop, &c->pipe, 0)) {
        close(fd[0]);
        close(fd[1]);
        errmsg_set(err, "%s: relay: cannot set up its pipe", c->peer);
        return -1;
    }
    c->pipe.data = c;
    c->piped = 1;
    c->open_handles++;
    uv_pipe_open(&c->pipe, fd[0]);
    uv_read_start((uv_stream_t *)&c->pipe, relay_alloc, relay_read);
    return fd[1];
}

uv_stream_t *sealed_conn_relay(struct sconn *c, void *(*alloc_fn)(size_t), char *err)
{
    int fd = sealed_conn_relay_fd(c, err);
    if (fd < 0) return NULL;
    uv_pipe_t *theirs = alloc_fn(sizeof *theirs);
    if (!theirs) {
        close(fd); /* our end reads EOF: the connection closes */
        errmsg_set(err, "%s: relay: out of memory", c->peer);
        return NULL;
    }
    uv_pipe_init(c->loop, theirs, 0);
    uv_pipe_open(theirs, fd);
    return (uv_stream_t *)theirs;
}

/* ---------------------------------------------------------------- reading */

static void tcp_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    (void)hint;
    struct sconn *c = h->data;
    buf->base = (char *)c->in + c->in_len;
    buf->len = WIRE_MAX_FRAME - c->in_len;
}

static void handshake(struct sconn *c, const struct wire_hdr *h, const uint8_t *frame, size_t n)
{
    char err[ERRMSG_LEN], why[ERRMSG_LEN + 32];
    const uint8_t *body = frame + WIRE_HDR_LEN;
    if (wire_frame_check((struct wire_hdr *)h, frame, n, err)) return sealed_conn_close(c, err);
    if (!c->is_client) {
        uint8_t cn[WIRE_NONCE_LEN], ack[WIRE_HDR_LEN + WIRE_HELLO_ID_ACK_LEN];
        uint64_t who = 0;
        if (h->type != WIRE_HELLO_ID) return sealed_conn_close(c, "expected HELLO_ID");
        if (auth_hello_id_check(c->key, body, h->length, cn, &who, err)) {
            snprintf(why, sizeof why, "refused: %s", err);
            return sealed_conn_close(c, why);
        }
        uint32_t conn;
        uint8_t scratch[WIRE_NONCE_LEN];
        auth_nonce(scratch);
        memcpy(&conn, scratch, sizeof conn);
        size_t an = auth_hello_id_ack(c->key, cn, who, conn ? conn : 1, c->self_id, &c->s, ack);
        c->peer_id = who;
        c->state = SC_OPEN;
        uv_timer_stop(&c->deadline);
        write_tcp(c, ack, an);
        return;
    }
    if (h->type != WIRE_HELLO_ID_ACK) return sealed_conn_close(c, "expected HELLO_ID_ACK");
    if (auth_hello_id_ack_check(c->key, body, h->length, c->nonce, c->self_id, c->want_id,
                                &c->peer_id, &c->s, err)) {
        snprintf(why, sizeof why, "refused: %s", err);
        return sealed_conn_close(c, why);
    }
    c->state = SC_OPEN;
    uv_timer_stop(&c->deadline);
    if (c->cb.on_ready) c->cb.on_ready(c, 0, NULL);
}

/* A whole frame after the handshake. Sealed MSG and CLOSE frames count only if they open under
 * the session, in sequence; one that does not open is dropped (the framing stays in step: the
 * header said how long it was). */
static void frame_in(struct sconn *c, const struct wire_hdr *h, const uint8_t *frame, size_t n)
{
    char err[ERRMSG_LEN];
    if (c->state == SC_HANDSHAKE) return handshake(c, h, frame, n);
    if (h->type != WIRE_MSG && h->type != WIRE_CLOSE)
        return sealed_conn_close(c, "unexpected frame type");
    struct wire_hdr hh;
    size_t ptlen;
    if (session_open(&c->s, frame, n, &hh, c->pt, &ptlen, err)) {
        atomic_fetch_add(&forged, 1);
        if (c->forged++ < 3)
            log_warn("cluster", "%s (node %llu): a %s frame dropped: %s", c->peer,
                     (unsigned long long)c->peer_id, h->type == WIRE_CLOSE ? "CLOSE" : "MSG", err);
        return;
    }
    if (hh.seq != c->rx_seq) return sealed_conn_close(c, "frame out of sequence (replay?)");
    c->rx_seq++;
    if (hh.type == WIRE_CLOSE) return sealed_conn_close(c, "peer closed");
    if (c->piped)
        relay_deliver(c, c->pt, ptlen);
    else if (c->cb.on_msg)
        c->cb.on_msg(c, c->pt, ptlen);
}

static void tcp_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    (void)buf;
    struct sconn *c = s->data;
    if (n == UV_EOF && c->piped) return relay_finish(c, (uv_stream_t *)&c->pipe, "peer closed");
    if (n < 0) return sealed_conn_close(c, n == UV_EOF ? "peer closed" : uv_strerror((int)n));
    c->in_len += (size_t)n;
    size_t off = 0;
    while (c->state != SC_CLOSED && c->in_len - off >= WIRE_HDR_LEN) {
        struct wire_hdr h;
        char err[ERRMSG_LEN];
        if (wire_hdr_peek(&h, c->in + off, c->in_len - off, err)) return sealed_conn_close(c, err);
        size_t whole = WIRE_HDR_LEN + (size_t)h.length;
        if (c->in_len - off < whole) break;
        frame_in(c, &h, c->in + off, whole);
        off += whole;
    }
    if (c->state == SC_CLOSED) return;
    memmove(c->in, c->in + off, c->in_len - off);
    c->in_len -= off;
}

/* ---------------------------------------------------------------- setup */

static void deadline_passed(uv_timer_t *t)
{
    struct sconn *c = t->data;
    char why[96];
    if (c->state != SC_HANDSHAKE) return;
    snprintf(why, sizeof why, "no handshake within %llu ms (%zu bytes received)",
             (unsigned long long)uv_timer_get_repeat(t), c->in_len);
    c->timed_out = 1;
    sealed_conn_close(c, why);
}

/* The handshake must be over within ms; the repeat value only remembers ms for the log line. */
static void deadline_start(struct sconn *c, int ms)
{
    uint64_t t = ms > 0 ? (uint64_t)ms : SCONN_HANDSHAKE_MS;
    uv_timer_start(&c->deadline, deadline_passed, t, t);
}

static struct sconn *sealed_conn_new(uv_loop_t *loop, const struct cluster_key *key)
{
    struct sconn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->in = malloc(WIRE_MAX_FRAME);
    c->pt = malloc(WIRE_MAX_MSG > RELAY_CHUNK ? WIRE_MAX_MSG : RELAY_CHUNK);
    if (!c->in || !c->pt) {
        free(c->in);
        free(c->pt);
        free(c);
        return NULL;
    }
    c->loop = loop;
    c->key = key;
    uv_tcp_init(loop, &c->tcp);
    c->tcp.data = c;
    uv_timer_init(loop, &c->deadline);
    c->deadline.data = c;
    c->open_handles = 2;
    live_add(c);
    return c;
}

static void connected(uv_connect_t *req, int status)
{
    struct sconn *c = req->data;
    if (c->state == SC_CLOSED) return;
    if (status < 0) {
        char why[128];
        snprintf(why, sizeof why, "connect: %s", uv_strerror(status));
        return sealed_conn_close(c, why);
    }
    uv_tcp_nodelay(&c->tcp, 1);
    uint8_t hello[WIRE_HDR_LEN + WIRE_HELLO_ID_LEN];
    auth_nonce(c->nonce);
    size_t n = auth_hello_id(c->key, c->nonce, c->self_id, hello);
    if (write_tcp(c, hello, n)) return;
    uv_read_start((uv_stream_t *)&c->tcp, tcp_alloc, tcp_read);
}

struct sconn *sealed_conn_connect(uv_loop_t *loop, const struct cluster_key *key, uint64_t self_id,
                                  uint64_t want_id, const char *hostport,
                                  const struct sconn_cbs *cbs, void *data, char *err)
{
    struct sockaddr_in sa;
    if (sealed_conn_parse_addr(hostport, &sa, err)) return NULL;
    struct sconn *c = sealed_conn_new(loop, key);
    if (!c) {
        errmsg_set(err, "%s: out of memory", hostport);
        return NULL;
    }
    c->is_client = 1;
    c->self_id = self_id;
    c->want_id = want_id;
    c->cb = *cbs;
    c->data = data;
    snprintf(c->peer, sizeof c->peer, "%s", hostport);
    c->creq.data = c;
    deadline_start(c, SCONN_HANDSHAKE_MS);
    int rc = uv_tcp_connect(&c->creq, &c->tcp, (const struct sockaddr *)&sa, connected);
    if (rc) {
        errmsg_set(err, "%s: connect: %s", hostport, uv_strerror(rc));
        c->cb = (struct sconn_cbs){0};
        sealed_conn_close(c, err);
        return NULL;
    }
    return c;
}

/* Server side: the connection belongs to the listener until its handshake is done. */
static void accepted_close(struct sconn *c, const char *why)
{
    struct slisten *l = c->data;
    if (l && l->on_refused) l->on_refused(l, c->peer, why, c->timed_out);
}

static void accepted_msg(struct sconn *c, const uint8_t *m, size_t n)
{
    (void)m, (void)n;
    sealed_conn_close(c, "message before the listener handed the connection over");
}

/* The listener watches the first HELLO_ACK being sent: the connection is handed to on_accept
 * as soon as the handshake made it open. */
static void accept_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    struct sconn *c = s->data;
    int was = c->state;
    /* Handle the frames with the listener's callbacks, but stop at the end of the handshake so
     * that the user's callbacks see every message. */
    if (n < 0 || was != SC_HANDSHAKE) return tcp_read(s, n, buf);
    c->in_len += (size_t)n;
    if (c->in_len < WIRE_HDR_LEN) return;
    struct wire_hdr h;
    char err[ERRMSG_LEN];
    if (wire_hdr_peek(&h, c->in, c->in_len, err)) return sealed_conn_close(c, err);
    size_t whole = WIRE_HDR_LEN + (size_t)h.length;
    if (c->in_len < whole) return;
    handshake(c, &h, c->in, whole);
    if (c->state != SC_OPEN) return;
    memmove(c->in, c->in + whole, c->in_len - whole);
    c->in_len -= whole;
    struct slisten *l = c->data;
    c->data = NULL;
    c->cb = (struct sconn_cbs){0};
    uv_read_start((uv_stream_t *)&c->tcp, tcp_alloc, tcp_read);
    l->on_accept(l, c);
    /* Frames that arrived with the HELLO (the client's first messages). */
    if (c->state == SC_OPEN && c->in_len) tcp_read((uv_stream_t *)&c->tcp, 0, NULL);
}

static void on_connection(uv_stream_t *server, int status)
{
    struct slisten *l = server->data;
    if (status < 0) return;
    struct sconn *c = sealed_conn_new(server->loop, l->key);
    if (!c) return;
    if (uv_accept(server, (uv_stream_t *)&c->tcp)) return sealed_conn_close(c, "accept failed");
    struct sockaddr_storage ss;
    int len = sizeof ss;
    char ip[48] = "?";
    if (!uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) && ss.ss_family == AF_INET) {
        struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
        uv_ip4_name(sin, ip, sizeof ip);
        snprintf(c->peer, sizeof c->peer, "%s:%d", ip, ntohs(sin->sin_port));
    }
    c->data = l;
    c->self_id = l->id;
    deadline_start(c, l->handshake_ms);
    c->cb.on_msg = accepted_msg;
    c->cb.on_close = accepted_close;
    uv_tcp_nodelay(&c->tcp, 1);
    uv_read_start((uv_stream_t *)&c->tcp, tcp_alloc, accept_read);
}

int slisten_start(struct slisten *l, uv_loop_t *loop, const char *hostport, char *err)
{
    struct sockaddr_in sa;
    if (sealed_conn_parse_addr(hostport, &sa, err)) return -1;
    uv_tcp_init(loop, &l->tcp);
    l->tcp.data = l;
    int rc = uv_tcp_bind(&l->tcp, (const struct sockaddr *)&sa, 0);
    if (!rc) rc = uv_listen((uv_stream_t *)&l->tcp, 64, on_connection);
    if (rc) {
        uv_close((uv_handle_t *)&l->tcp, NULL);
        return errmsg_set(err, "listen on %s: %s", hostport, uv_strerror(rc));
    }
    return 0;
}

void slisten_stop(struct slisten *l, uv_close_cb cb)
{
    uv_close((uv_handle_t *)&l->tcp, cb);
}
