/* The control plane's wire (cluster/sealed_conn.h) over loopback TCP: a message crosses sealed
 * both ways under the cluster key, and each end knows the other's node id from the handshake; a
 * client that meant another node refuses the one that answers; a client with another key is
 * refused at the handshake and delivers nothing; a peer that connects and sends nothing, or half
 * a HELLO, is closed at the handshake deadline and counted, while a connection whose handshake
 * finished stays open past it; a CLOSE or a message injected into the stream in plaintext or
 * sealed under another session is dropped (counted) and the connection goes on, while a sealed
 * CLOSE in sequence closes it; the relay carries a byte stream (what raft writes) unchanged in
 * both directions. */
#include "check.h"

#include "cluster/sealed_conn.h"
#include "os/common/errmsg.h"
#include "transport/crc32c.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static uv_loop_t loop;
static struct cluster_key key, other;
static struct slisten lis;
static char lis_addr[64];
static int accepted, refused, timeouts, ready_status = 99, got_msgs, closed;
static char refused_why[256];
static char got[256];
static struct sconn *srv_conn, *cli_conn; /* open connections, closed by drain() */

/* ---------------------------------------------------------------- listener side */

static void srv_msg(struct sconn *c, const uint8_t *m, size_t n)
{
    snprintf(got, sizeof got, "%.*s", (int)n, (const char *)m);
    got_msgs++;
    sealed_conn_send(c, "pong", 4);
}

/* An accepted connection frees itself when it closes: forget it then. */
static void srv_closed(struct sconn *c, const char *why)
{
    (void)why;
    if (c == srv_conn) srv_conn = NULL;
}

static void on_accept(struct slisten *l, struct sconn *c)
{
    (void)l;
    accepted++;
    srv_conn = c;
    c->cb.on_msg = srv_msg;
    c->cb.on_close = srv_closed;
}

static void on_refused(struct slisten *l, const char *peer, const char *why, int timed_out)
{
    (void)l, (void)peer;
    refused++;
    timeouts += timed_out != 0;
    snprintf(refused_why, sizeof refused_why, "%s", why);
}

static void listen_any(void)
{
    char err[ERRMSG_LEN];
    lis = (struct slisten){.key = &key, .id = 7, .on_accept = on_accept, .on_refused = on_refused};
    CHECKF(!slisten_start(&lis, &loop, "127.0.0.1:0", err), "%s", err);
    struct sockaddr_in sa;
    int len = sizeof sa;
    uv_tcp_getsockname(&lis.tcp, (struct sockaddr *)&sa, &len);
    snprintf(lis_addr, sizeof lis_addr, "127.0.0.1:%d", ntohs(sa.sin_port));
}

/* ---------------------------------------------------------------- client side */

static char reply[64];

static void cli_ready(struct sconn *c, int status, const char *why)
{
    (void)why;
    ready_status = status;
    if (!status) sealed_conn_send(c, "ping", 4);
}

static void cli_msg(struct sconn *c, const uint8_t *m, size_t n)
{
    snprintf(reply, sizeof reply, "%.*s", (int)n, (const char *)m);
    sealed_conn_close(c, "done");
}

static void cli_closed(struct sconn *c, const char *why)
{
    (void)why;
    closed++;
    if (c == cli_conn) cli_conn = NULL;
}

static void run_until(int *flag, int want)
{
    for (int i = 0; i < 2000 && *flag < want; i++) uv_run(&loop, UV_RUN_NOWAIT), usleep(1000);
}

static void setup(void)
{
    char err[ERRMSG_LEN];
    CHECK(!auth_init(err));
    CHECK(!cluster_key_parse(
        &key, "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", err));
    CHECK(!cluster_key_parse(
        &other, "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100", err));
    uv_loop_init(&loop);
    accepted = refused = timeouts = got_msgs = closed = 0;
    refused_why[0] = 0;
    ready_status = 99;
    got[0] = reply[0] = 0;
    listen_any();
}

static void close_all(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h)) uv_close(h, NULL);
}

/* Connections still open close through sealed_conn_close (each frees itself once its handles have
 * closed; a plain uv_close would leave it allocated), then every other handle. */
static void drain(void)
{
    if (cli_conn) sealed_conn_close(cli_conn, "done");
    if (srv_conn) sealed_conn_close(srv_conn, "done");
    for (int i = 0; i < 100 && (cli_conn || srv_conn); i++) uv_run(&loop, UV_RUN_NOWAIT);
    uv_walk(&loop, close_all, NULL);
    for (int i = 0; i < 100; i++) uv_run(&loop, UV_RUN_NOWAIT);
    uv_loop_close(&loop);
}

TEST(message_both_ways_under_the_key)
{
    char err[ERRMSG_LEN];
    setup();
    struct sconn_cbs cbs = {.on_ready = cli_ready, .on_msg = cli_msg, .on_close = cli_closed};
    CHECKF(sealed_conn_connect(&loop, &key, 3, 7, lis_addr, &cbs, NULL, err) != NULL, "%s", err);
    run_until(&closed, 1);
    CHECK_EQ_INT(ready_status, 0);
    CHECK_EQ_INT(accepted, 1);
    CHECK_STR(got, "ping");
    CHECK_STR(reply, "pong");
    CHECK_EQ_INT(refused, 0);
    drain();
}

/* Each end knows who the other is; a client that meant node 8 refuses node 7. */
static uint64_t seen_by_server, seen_by_client;

static void id_accept(struct slisten *l, struct sconn *c)
{
    on_accept(l, c);
    seen_by_server = c->peer_id;
}

static void id_ready(struct sconn *c, int status, const char *why)
{
    if (!status) seen_by_client = c->peer_id;
    cli_ready(c, status, why);
}

TEST(node_ids_proved_by_the_handshake)
{
    char err[ERRMSG_LEN];
    setup();
    lis.on_accept = id_accept;
    seen_by_server = seen_by_client = 0;
    struct sconn_cbs cbs = {.on_ready = id_ready, .on_msg = cli_msg, .on_close = cli_closed};
    CHECKF(sealed_conn_connect(&loop, &key, 3, 0, lis_addr, &cbs, NULL, err) != NULL, "%s", err);
    run_until(&closed, 1);
    CHECK_EQ_INT(ready_status, 0);
    CHECK_EQ_INT(seen_by_server, 3);
    CHECK_EQ_INT(seen_by_client, 7);
    drain();
    /* The client meant node 8: node 7's HELLO_ID_ACK is refused, nothing is sent. */
    setup();
    CHECKF(sealed_conn_connect(&loop, &key, 3, 8, lis_addr, &cbs, NULL, err) != NULL, "%s", err);
    run_until(&closed, 1);
    CHECK(ready_status < 0);
    CHECK_EQ_INT(got_msgs, 0);
    drain();
}

TEST(other_key_refused_nothing_delivered)
{
    char err[ERRMSG_LEN];
    setup();
    struct sconn_cbs cbs = {.on_ready = cli_ready, .on_msg = cli_msg, .on_close = cli_closed};
    CHECKF(sealed_conn_connect(&loop, &other, 3, 7, lis_addr, &cbs, NULL, err) != NULL, "%s", err);
    run_until(&closed, 1);
    run_until(&refused, 1);
    CHECK(ready_status < 0);
    CHECK_EQ_INT(refused, 1);
    CHECK_EQ_INT(accepted, 0);
    CHECK_EQ_INT(got_msgs, 0);
    drain();
}

/* ---------------------------------------------------------------- handshake deadline */

/* A plain TCP socket to the listener (the kernel completes the connect from its backlog). */
static int raw_connect(void)
{
    struct sockaddr_in sa;
    char err[ERRMSG_LEN];
    CHECK(!sealed_conn_parse_addr(lis_addr, &sa, err));
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    CHECK(!connect(fd, (struct sockaddr *)&sa, sizeof sa));
    return fd;
}

/* What the peer sees: 1 once the server closed the socket (EOF or reset). */
static int raw_closed(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char b[64];
    if (poll(&p, 1, 0) <= 0) return 0;
    ssize_t n = recv(fd, b, sizeof b, MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

static double mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

TEST(silent_and_partial_peers_closed_at_the_deadline)
{
    setup();
    lis.handshake_ms = 300;
    /* One peer sends nothing; the other the first 7 bytes of a HELLO frame's header. */
    int silent = raw_connect(), partial = raw_connect();
    static const uint8_t half[7] = {0x53, 0x54, 0x52, 0x41, 1, 0, 0}; /* "STRA", ... */
    CHECK(send(partial, half, sizeof half, 0) == (ssize_t)sizeof half);
    double t0 = mono_ms();
    for (int i = 0; i < 5000 && refused < 2; i++) uv_run(&loop, UV_RUN_NOWAIT), usleep(1000);
    double waited = mono_ms() - t0;
    CHECK_EQ_INT(refused, 2);
    CHECK_EQ_INT(timeouts, 2);
    CHECK_EQ_INT(accepted, 0);
    CHECKF(strstr(refused_why, "no handshake within 300 ms") != NULL, "%s", refused_why);
    for (int i = 0; i < 100 && !(raw_closed(silent) && raw_closed(partial)); i++)
        uv_run(&loop, UV_RUN_NOWAIT), usleep(1000);
    CHECK(raw_closed(silent));
    CHECK(raw_closed(partial));
    printf("# both closed by the server after %.0f ms (deadline 300 ms): %s\n", waited,
           refused_why);
    close(silent);
    close(partial);
    drain();
}

static void keep_ready(struct sconn *c, int status, const char *why)
{
    (void)why;
    ready_status = status;
    if (!status) cli_conn = c;
}

TEST(finished_handshake_outlives_the_deadline)
{
    char err[ERRMSG_LEN];
    setup();
    lis.handshake_ms = 100;
    cli_conn = srv_conn = NULL;
    struct sconn_cbs cbs = {.on_ready = keep_ready, .on_msg = cli_msg, .on_close = cli_closed};
    CHECKF(sealed_conn_connect(&loop, &key, 3, 7, lis_addr, &cbs, NULL, err) != NULL, "%s", err);
    for (int i = 0; i < 2000 && ready_status == 99; i++) uv_run(&loop, UV_RUN_NOWAIT), usleep(1000);
    CHECK_EQ_INT(ready_status, 0);
    CHECK_EQ_INT(accepted, 1);
    /* Three deadlines later both ends are still open and a message still crosses. */
    for (int i = 0; i < 300; i++) uv_run(&loop, UV_RUN_NOWAIT), usleep(1000);
    CHECK(cli_conn && srv_conn && sealed_conn_is_open(cli_conn) && sealed_conn_is_open(srv_conn));
    CHECK_EQ_INT(refused, 0);
    CHECK_EQ_INT(timeouts, 0);
    sealed_conn_send(cli_conn, "ping", 4);
    run_until(&got_msgs, 1);
    CHECK_STR(got, "ping");
    drain();
}

/* ---------------------------------------------------------------- forged frames */

static void send_all(int fd, const uint8_t *p, size_t n)
{
    CHECK(send(fd, p, n, 0) == (ssize_t)n);
}

/* A raw client: the handshake by hand (node 3), then frames of our choosing on the stream. */
static int raw_handshake(struct session *s)
{
    char err[ERRMSG_LEN];
    int fd = raw_connect();
    uint8_t cn[WIRE_NONCE_LEN], hello[WIRE_HDR_LEN + WIRE_HELLO_ID_LEN];
    uint8_t ack[WIRE_HDR_LEN + WIRE_HELLO_ID_ACK_LEN];
    auth_nonce(cn);
    send_all(fd, hello, auth_hello_id(&key, cn, 3, hello));
    size_t got_n = 0;
    for (int i = 0; i < 2000 && got_n < sizeof ack; i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        ssize_t k = recv(fd, ack + got_n, sizeof ack - got_n, MSG_DONTWAIT);
        if (k > 0) got_n += (size_t)k;
        usleep(500);
    }
    CHECK_EQ_INT(got_n, sizeof ack);
    uint64_t server = 0;
    CHECKF(!auth_hello_id_ack_check(&key, ack + WIRE_HDR_LEN, WIRE_HELLO_ID_ACK_LEN, cn, 3, 7,
                                    &server, s, err),
           "%s", err);
    return fd;
}

static size_t sealed(const struct session *s, uint8_t *f, uint8_t type, uint64_t seq,
                     const char *text)
{
    return session_seal(s, f, type, WIRE_F_END, seq, text, text ? strlen(text) : 0);
}

TEST(forged_close_and_messages_are_dropped)
{
    setup();
    srv_conn = NULL;
    struct session s, s2;
    int fd = raw_handshake(&s);
    uint8_t f[256];
    /* 1. a real message */
    send_all(fd, f, sealed(&s, f, WIRE_MSG, 0, "one"));
    run_until(&got_msgs, 1);
    CHECK_STR(got, "one");
    unsigned long long forged0 = sconn_forged_frames();
    /* 2. a CLOSE in plaintext, its CRC right (what an on-path attacker can write) */
    struct wire_hdr h = {WIRE_VERSION, WIRE_CLOSE, 0, 0, s.conn, 1, crc32c(0, f, 0)};
    wire_hdr_encode(f, &h);
    send_all(fd, f, WIRE_HDR_LEN);
    /* 3. a sealed CLOSE and a message from another session of the same key (a recording) */
    struct sconn *first = srv_conn;
    int fd2 = raw_handshake(&s2);
    srv_conn = first;
    close(fd2); /* that other connection ends (the server sees EOF); its keys live on here */
    send_all(fd, f, sealed(&s2, f, WIRE_CLOSE, 1, NULL));
    send_all(fd, f, sealed(&s2, f, WIRE_MSG, 1, "evil"));
    /* 4. our message altered on the way, its CRC fixed up */
    size_t n = sealed(&s, f, WIRE_MSG, 1, "two");
    f[WIRE_HDR_LEN] ^= 1;
    CHECK(!wire_hdr_decode(&h, f, n, NULL));
    h.crc = crc32c(0, f + WIRE_HDR_LEN, h.length);
    wire_hdr_encode(f, &h);
    send_all(fd, f, n);
    for (int i = 0; i < 200 && sconn_forged_frames() - forged0 < 4; i++)
        uv_run(&loop, UV_RUN_NOWAIT), usleep(1000);
    CHECK_EQ_INT(sconn_forged_frames() - forged0, 4);
    CHECK(srv_conn && sealed_conn_is_open(srv_conn) && !raw_closed(fd));
    CHECK_EQ_INT(got_msgs, 1);
    /* 5. the real next message still arrives, in sequence */
    send_all(fd, f, sealed(&s, f, WIRE_MSG, 1, "two"));
    run_until(&got_msgs, 2);
    CHECK_STR(got, "two");
    /* 6. our own sealed CLOSE, in sequence, closes it */
    send_all(fd, f, sealed(&s, f, WIRE_CLOSE, 2, NULL));
    for (int i = 0; i < 2000 && srv_conn; i++) uv_run(&loop, UV_RUN_NOWAIT), usleep(500);
    CHECK(srv_conn == NULL);
    close(fd);
    drain();
}

/* ---------------------------------------------------------------- relay */

#define STREAM_BYTES (3u << 20)
static uint8_t *pattern, *recv_buf;
static size_t recv_len;
static uv_stream_t *cli_end, *srv_end;

static void *plain_malloc(size_t n)
{
    return malloc(n);
}

static void pipe_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    (void)h, (void)hint;
    static char tmp[70000];
    b->base = tmp;
    b->len = sizeof tmp;
}

static void pipe_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    (void)s;
    if (n <= 0) return;
    if (recv_len + (size_t)n <= STREAM_BYTES) memcpy(recv_buf + recv_len, b->base, (size_t)n);
    recv_len += (size_t)n;
}

static void relay_accept(struct slisten *l, struct sconn *c)
{
    char err[ERRMSG_LEN];
    (void)l;
    accepted++;
    srv_conn = c;
    c->cb.on_close = srv_closed;
    srv_end = sealed_conn_relay(c, plain_malloc, err);
    if (srv_end) uv_read_start(srv_end, pipe_alloc, pipe_read);
}

static void relay_ready(struct sconn *c, int status, const char *why)
{
    char err[ERRMSG_LEN];
    (void)why;
    ready_status = status;
    if (!status) cli_conn = c, cli_end = sealed_conn_relay(c, plain_malloc, err);
}

static void write_done(uv_write_t *w, int status)
{
    (void)status;
    free(w);
}

TEST(relay_carries_a_stream_unchanged)
{
    char err[ERRMSG_LEN];
    setup();
    lis.on_accept = relay_accept;
    pattern = malloc(STREAM_BYTES);
    recv_buf = calloc(1, STREAM_BYTES);
    recv_len = 0;
    cli_end = srv_end = NULL;
    cli_conn = srv_conn = NULL;
    srand(7);
    for (size_t i = 0; i < STREAM_BYTES; i++) pattern[i] = (uint8_t)rand();
    struct sconn_cbs cbs = {.on_ready = relay_ready, .on_close = cli_closed};
    CHECKF(sealed_conn_connect(&loop, &key, 3, 7, lis_addr, &cbs, NULL, err) != NULL, "%s", err);
    for (int i = 0; i < 2000 && (!cli_end || !srv_end); i++)
        uv_run(&loop, UV_RUN_NOWAIT), usleep(1000);
    CHECK(cli_end && srv_end);
    /* Writes of uneven sizes, as raft's messages are. */
    for (size_t off = 0; off < STREAM_BYTES;) {
        size_t n = 1 + (size_t)rand() % 100000;
        if (n > STREAM_BYTES - off) n = STREAM_BYTES - off;
        uv_write_t *w = malloc(sizeof *w);
        uv_buf_t b = uv_buf_init((char *)pattern + off, (unsigned)n);
        CHECK(!uv_write(w, cli_end, &b, 1, write_done));
        off += n;
    }
    for (int i = 0; i < 20000 && recv_len < STREAM_BYTES; i++)
        uv_run(&loop, UV_RUN_NOWAIT), usleep(200);
    CHECK_EQ_INT(recv_len, STREAM_BYTES);
    CHECK(!memcmp(recv_buf, pattern, STREAM_BYTES));
    free(pattern);
    free(recv_buf);
    drain();
    free(cli_end);
    free(srv_end);
}

int main(void)
{
    RUN(message_both_ways_under_the_key);
    RUN(node_ids_proved_by_the_handshake);
    RUN(forged_close_and_messages_are_dropped);
    RUN(other_key_refused_nothing_delivered);
    RUN(silent_and_partial_peers_closed_at_the_deadline);
    RUN(finished_handshake_outlives_the_deadline);
    RUN(relay_carries_a_stream_unchanged);
    CHECK_DONE();
}
