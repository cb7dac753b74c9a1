/* fwd_probe: a forward channel (cluster/fwd_channel.h) driven by hand, for the cluster scenarios
 * and the forwarding benchmark.
 *
 *   build/tools/fwd_probe KEYFILE CONTROL_ADDR < request
 *       opens a forward channel to a node's control port under KEYFILE, sends the HTTP request
 *       read from stdin (it should say Connection: close) and writes the answer to stdout until
 *       the node closes. Exit 0: the channel opened; 3: refused or unreachable (the reason on
 *       stderr). A node whose key differs refuses at the handshake: nothing reaches its front.
 *
 *   build/tools/fwd_probe --bench N KEYFILE CONTROL_ADDR API_ADDR BODY
 *       what forwarding one request costs, sealed and plain, kept and fresh: N one-token
 *       completions (BODY, JSON) each way to the same node, X-Strata-Forwarded set so it serves
 *       them itself. Prints the median microseconds of: a fresh channel's open (TCP connect,
 *       HELLO/HELLO_ACK, OPEN), a request on a fresh channel, on a kept one, and over plain TCP
 *       to the API, fresh and kept. Figures, never a pass criterion. */
#include "cluster/fwd_channel.h"
#include "os/common/errmsg.h"
#include "os/runtime/clock.h"
#include "serving/api/http_response.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static uv_loop_t loop;
static uv_async_t stop_async;
static struct fwd_channels *chans;

static void on_stop(uv_async_t *a)
{
    fwd_channels_stop(chans);
    uv_close((uv_handle_t *)a, NULL);
}

static void *loop_main(void *arg)
{
    (void)arg;
    uv_run(&loop, UV_RUN_DEFAULT);
    return NULL;
}

static int send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) return -1;
        p += k, n -= (size_t)k;
    }
    return 0;
}

/* One answer read whole with the relay's reader; 0 when it is complete and a 200. */
static int read_answer(int fd)
{
    static char buf[1 << 16];
    struct http_response h;
    http_response_init(&h);
    size_t len = 0;
    char err[ERRMSG_LEN];
    for (;;) {
        ssize_t k = recv(fd, buf + len, sizeof buf - len, 0);
        if (k <= 0) return http_response_eof(&h, err) == 1 && h.status == 200 ? 0 : -1;
        len += (size_t)k;
        size_t ready = 0;
        int fr = http_response_feed(&h, buf, &len, &ready, err);
        if (fr < 0) return -1;
        http_response_took(&h, buf, &len, ready);
        if (fr == 1) return h.status == 200 ? 0 : -1;
    }
}

static int tcp_connect(const char *hostport)
{
    struct sockaddr_in sa;
    char err[ERRMSG_LEN];
    if (sealed_conn_parse_addr(hostport, &sa, err)) return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        close(fd);
        return -1;
    }
    return fd;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_us(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2] * 1e6;
}

static int bench(int n, const char *ctl, const char *api, const char *body)
{
    char req[4096], err[ERRMSG_LEN];
    double *open_s = calloc((size_t)n, sizeof(double)), *fresh = calloc((size_t)n, sizeof(double)),
           *kept = calloc((size_t)n, sizeof(double)), *pfresh = calloc((size_t)n, sizeof(double)),
           *pkept = calloc((size_t)n, sizeof(double));
    int rl = snprintf(req, sizeof req,
                      "POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json"
                      "\r\nContent-Length: %zu\r\nX-Strata-Forwarded: 99\r\nConnection: keep-alive"
                      "\r\n\r\n%s",
                      api, strlen(body), body);
    int kept_fd = fwd_channels_open(chans, 1, ctl, 5000, -1, err);
    int pkept_fd = tcp_connect(api);
    if (kept_fd < 0 || pkept_fd < 0) {
        fprintf(stderr, "fwd_probe: %s\n", kept_fd < 0 ? err : "cannot connect to the API");
        return 3;
    }
    for (int i = 0; i < n; i++) {
        double t0 = clock_now();
        int fd = fwd_channels_open(chans, 1, ctl, 5000, -1, err);
        double t1 = clock_now();
        if (fd < 0 || send_all(fd, req, (size_t)rl) || read_answer(fd)) return 4;
        double t2 = clock_now();
        close(fd);
        open_s[i] = t1 - t0;
        fresh[i] = t2 - t0;
        t0 = clock_now();
        if (send_all(kept_fd, req, (size_t)rl) || read_answer(kept_fd)) return 4;
        kept[i] = clock_now() - t0;
        t0 = clock_now();
        fd = tcp_connect(api);
        if (fd < 0 || send_all(fd, req, (size_t)rl) || read_answer(fd)) return 4;
        close(fd);
        pfresh[i] = clock_now() - t0;
        t0 = clock_now();
        if (send_all(pkept_fd, req, (size_t)rl) || read_answer(pkept_fd)) return 4;
        pkept[i] = clock_now() - t0;
    }
    printf("# %d one-token completions each way, median us\n", n);
    printf("sealed channel open (connect + handshake + OPEN): %.0f\n", median_us(open_s, n));
    printf("request: sealed fresh %.0f | sealed kept %.0f | plain TCP fresh %.0f | plain TCP kept "
           "%.0f\n",
           median_us(fresh, n), median_us(kept, n), median_us(pfresh, n), median_us(pkept, n));
    close(kept_fd);
    close(pkept_fd);
    return 0;
}

static int probe(const char *ctl)
{
    char err[ERRMSG_LEN];
    static char buf[1 << 16];
    int fd = fwd_channels_open(chans, 1, ctl, 5000, -1, err);
    if (fd < 0) {
        fprintf(stderr, "fwd_probe: %s: %s\n", ctl, err);
        return 3;
    }
    size_t n = fread(buf, 1, sizeof buf, stdin);
    if (send_all(fd, buf, n)) return 4;
    ssize_t k;
    while ((k = recv(fd, buf, sizeof buf, 0)) > 0) fwrite(buf, 1, (size_t)k, stdout);
    close(fd);
    return 0;
}

int main(int argc, char **argv)
{
    char err[ERRMSG_LEN];
    int nb = 0, a = 1;
    if (argc > 2 && !strcmp(argv[1], "--bench")) nb = atoi(argv[2]), a = 3;
    if (argc - a != (nb ? 4 : 2) || (argc > 1 && !strcmp(argv[1], "--bench") && nb < 1)) {
        fprintf(stderr, "usage: fwd_probe KEYFILE CONTROL_ADDR < request\n"
                        "       fwd_probe --bench N KEYFILE CONTROL_ADDR API_ADDR BODY\n");
        return 2;
    }
    struct cluster_key key;
    if (auth_init(err) || cluster_key_load(&key, argv[a], err)) {
        fprintf(stderr, "fwd_probe: %s\n", err);
        return 2;
    }
    uv_loop_init(&loop);
    chans = fwd_channels_new(&loop, &key, 99, "0.0.0.0:0", err);
    uv_async_init(&loop, &stop_async, on_stop);
    pthread_t th;
    if (!chans || pthread_create(&th, NULL, loop_main, NULL)) {
        fprintf(stderr, "fwd_probe: %s\n", chans ? "pthread_create failed" : err);
        return 2;
    }
    int rc = nb ? bench(nb, argv[a + 1], argv[a + 2], argv[a + 3]) : probe(argv[a + 1]);
    uv_async_send(&stop_async);
    pthread_join(th, NULL);
    fwd_channels_free(chans);
    return rc;
}
