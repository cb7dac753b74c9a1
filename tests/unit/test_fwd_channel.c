/* Forward channels (cluster/fwd_channel.h) over loopback: the control loop runs on its own thread,
 * as in `strata serve`, and the test's main thread plays the relay.
 *
 * A channel opened under the cluster key carries bytes both ways unchanged (a request, then an
 * answer), its OPEN names the channel CHAN_FWD and the sender's id, and closing the sender's end
 * ends the receiver's (that is how a client leaving cancels a forwarded request); an answer of
 * 4 MiB written and closed at once, with nobody reading yet, arrives whole. A sender with
 * another key gets -1 naming the refusal, and the receiver hands nothing to its front. Nothing
 * listening: -1 at once. A peer that accepts and never answers the handshake: -1 after the
 * timeout, or -2 as soon as the relay is cancelled. Timing is never a pass criterion. */
#include "check.h"

#include "cluster/cluster_cmd.h"
#include "cluster/fwd_channel.h"
#include "os/common/errmsg.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

static uv_loop_t loop;
static uv_async_t stop_async;
static pthread_t loop_thread;
static struct cluster_key key, other;
static struct slisten lis;
static char lis_addr[64];
static struct fwd_channels *good, *bad; /* senders under the key, and under another */
static atomic_int srv_fd = -1, refused, opened_by;

/* ---------------------------------------------------------------- the receiving node */

static void first_msg(struct sconn *c, const uint8_t *msg, size_t len)
{
    struct cl_msg m;
    char err[ERRMSG_LEN];
    if (cluster_cmd_msg_decode(&m, msg, len, err) || m.type != MSGC_OPEN ||
        m.u.open.channel != CHAN_FWD)
        return sealed_conn_close(c, "not a forward channel");
    c->cb = (struct sconn_cbs){0};
    atomic_store(&opened_by, (int)m.u.open.id);
    atomic_store(&srv_fd, fwd_channels_accept(c, err));
}

static void on_accept(struct slisten *l, struct sconn *c)
{
    (void)l;
    c->cb.on_msg = first_msg;
}

static void on_refused(struct slisten *l, const char *peer, const char *why, int timed_out)
{
    (void)l, (void)peer, (void)why, (void)timed_out;
    atomic_fetch_add(&refused, 1);
}

/* ---------------------------------------------------------------- the loop's thread */

/* The loop ends once the connections still open have closed themselves (each through
 * sealed_conn_close, which frees it). */
static void on_stop(uv_async_t *a)
{
    fwd_channels_stop(good);
    fwd_channels_stop(bad);
    slisten_stop(&lis, NULL);
    uv_close((uv_handle_t *)a, NULL);
}

static void *loop_main(void *arg)
{
    (void)arg;
    uv_run(&loop, UV_RUN_DEFAULT);
    return NULL;
}

static int start(void)
{
    char err[ERRMSG_LEN];
    if (auth_init(err) ||
        cluster_key_parse(&key, "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
                          err) ||
        cluster_key_parse(&other,
                          "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100", err))
        return -1;
    uv_loop_init(&loop);
    lis = (struct slisten){.key = &key, .id = 1, .on_accept = on_accept, .on_refused = on_refused};
    if (slisten_start(&lis, &loop, "127.0.0.1:0", err)) return -1;
    struct sockaddr_in sa;
    int len = sizeof sa;
    uv_tcp_getsockname(&lis.tcp, (struct sockaddr *)&sa, &len);
    snprintf(lis_addr, sizeof lis_addr, "127.0.0.1:%d", ntohs(sa.sin_port));
    good = fwd_channels_new(&loop, &key, 5, "127.0.0.5:7100", err);
    bad = fwd_channels_new(&loop, &other, 6, "127.0.0.6:7100", err);
    uv_async_init(&loop, &stop_async, on_stop);
    if (!good || !bad) return -1;
    return pthread_create(&loop_thread, NULL, loop_main, NULL);
}

static void stop(void)
{
    uv_async_send(&stop_async);
    pthread_join(loop_thread, NULL);
    uv_loop_close(&loop);
    fwd_channels_free(good);
    fwd_channels_free(bad);
}

/* ---------------------------------------------------------------- helpers */

static int wait_srv_fd(void)
{
    for (int i = 0; i < 5000 && atomic_load(&srv_fd) < 0; i++) usleep(1000);
    return atomic_exchange(&srv_fd, -1);
}

/* Reads exactly n bytes (10 s at most); 0 when they came. */
static int read_exact(int fd, char *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 10000) != 1) return -1;
        ssize_t k = recv(fd, buf + got, n - got, 0);
        if (k <= 0) return -1;
        got += (size_t)k;
    }
    return 0;
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

/* ---------------------------------------------------------------- tests */

TEST(channel_carries_a_request_and_its_answer)
{
    char err[ERRMSG_LEN];
    int fd = fwd_channels_open(good, 1, lis_addr, 5000, -1, err);
    CHECKF(fd >= 0, "%s", err);
    int s = wait_srv_fd();
    CHECK(s >= 0);
    CHECK_EQ_INT(atomic_load(&opened_by), 5);
    const char *req = "POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}";
    const char *ans = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
    char buf[256] = "";
    send_str(fd, req);
    CHECK(!read_exact(s, buf, strlen(req)));
    CHECKF(!memcmp(buf, req, strlen(req)), "%.200s", buf);
    send_str(s, ans);
    memset(buf, 0, sizeof buf);
    CHECK(!read_exact(fd, buf, strlen(ans)));
    CHECKF(!memcmp(buf, ans, strlen(ans)), "%.200s", buf);
    /* The sender closes (a client left): the receiver's end reads EOF. */
    close(fd);
    struct pollfd p = {.fd = s, .events = POLLIN};
    CHECK_EQ_INT(poll(&p, 1, 10000), 1);
    CHECK_EQ_INT(recv(s, buf, sizeof buf, 0), 0);
    close(s);
    CHECK_EQ_INT(atomic_load(&refused), 0);
}

/* A server answers and closes at once (Connection: close): every byte still queued in the loops
 * arrives before the end, however much the reader lags. */
TEST(an_answer_followed_by_the_close_arrives_whole)
{
    char err[ERRMSG_LEN];
    int fd = fwd_channels_open(good, 1, lis_addr, 5000, -1, err);
    CHECKF(fd >= 0, "%s", err);
    int s = wait_srv_fd();
    CHECK(s >= 0);
    enum { BIG = 4 << 20 };
    char *out = malloc(BIG), *in = malloc(BIG + 1);
    for (size_t i = 0; i < BIG; i++) out[i] = (char)(i * 7 + i / 4093);
    for (size_t off = 0; off < BIG;) { /* nobody reads fd meanwhile: the loops queue it */
        ssize_t k = send(s, out + off, BIG - off, MSG_NOSIGNAL);
        if (k <= 0) break;
        off += (size_t)k;
    }
    close(s);
    size_t got = 0;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 10000) != 1) break;
        ssize_t k = recv(fd, in + got, BIG + 1 - got, 0);
        if (k <= 0) break;
        got += (size_t)k;
    }
    CHECK_EQ_INT(got, BIG);
    CHECK(got == BIG && !memcmp(in, out, BIG));
    close(fd);
    free(out);
    free(in);
}

TEST(another_key_is_refused_and_delivers_nothing)
{
    char err[ERRMSG_LEN] = "";
    int fd = fwd_channels_open(bad, 1, lis_addr, 5000, -1, err);
    CHECK_EQ_INT(fd, -1);
    CHECKF(strstr(err, "refused") || strstr(err, "closed"), "%s", err);
    for (int i = 0; i < 5000 && !atomic_load(&refused); i++) usleep(1000);
    CHECK_EQ_INT(atomic_load(&refused), 1);
    usleep(50000);
    CHECK_EQ_INT(atomic_load(&srv_fd), -1); /* nothing reached the front */
}

TEST(nothing_listening_fails_at_once)
{
    char err[ERRMSG_LEN] = "";
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof a;
    bind(l, (struct sockaddr *)&a, sizeof a);
    getsockname(l, (struct sockaddr *)&a, &sl);
    close(l); /* nothing listens there now */
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(a.sin_port));
    CHECK_EQ_INT(fwd_channels_open(good, 2, addr, 5000, -1, err), -1);
    CHECKF(strstr(err, "connect"), "%s", err);
}

TEST(silent_peer_times_out_or_is_cancelled)
{
    char err[ERRMSG_LEN] = "";
    /* A socket that accepts (the kernel's backlog) and never answers a HELLO. */
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof a;
    bind(l, (struct sockaddr *)&a, sizeof a);
    listen(l, 8);
    getsockname(l, (struct sockaddr *)&a, &sl);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(a.sin_port));
    CHECK_EQ_INT(fwd_channels_open(good, 3, addr, 200, -1, err), -1);
    CHECKF(strstr(err, "no handshake within 200 ms"), "%s", err);
    int cancel = eventfd(1, EFD_CLOEXEC); /* already cancelled */
    CHECK_EQ_INT(fwd_channels_open(good, 3, addr, 5000, cancel, err), -2);
    close(cancel);
    close(l);
}

int main(void)
{
    if (start()) {
        printf("not ok - start: cannot start the loop\n");
        return 1;
    }
    RUN(channel_carries_a_request_and_its_answer);
    RUN(an_answer_followed_by_the_close_arrives_whole);
    RUN(another_key_is_refused_and_delivers_nothing);
    RUN(nothing_listening_fails_at_once);
    RUN(silent_peer_times_out_or_is_cancelled);
    stop();
    CHECK_DONE();
}
