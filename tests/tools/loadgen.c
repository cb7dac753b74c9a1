/* loadgen: replays an LLM request trace against an OpenAI-compatible server and reports
 * throughput, goodput and latency percentiles.
 *
 *   loadgen --url http://127.0.0.1:8080 --trace ../shared/traces/azure_llm_2023_conv.csv
 *           [--requests N] [--skip N] [--speedup X] [--ctx N] [--scale F] [--vocab N]
 *           [--ttft-ms MS] [--tpot-ms MS] [--label NAME] [--seed S] [--dump-requests FILE]
 *   loadgen --url URL --clients C --prompt-len P --gen G [--requests N] [--vocab N] [--no-slo]
 *           [--label NAME] [--seed S]
 *
 * The trace (TIMESTAMP,ContextTokens,GeneratedTokens; the Azure LLM inference trace 2023) gives
 * arrival times and lengths; prompt text is not part of it, so each request sends ContextTokens
 * random token ids as its prompt (the API accepts token arrays) and forces GeneratedTokens output
 * tokens with "ignore_eos". Lengths are multiplied by --scale (default ctx/4096, so the trace's
 * 4k-token contexts fit the model's) and clamped to the context; arrival gaps are divided by
 * --speedup. Every request is streamed (server-sent events) on its own connection, open-loop: a
 * request is sent at its arrival time whether or not earlier ones finished.
 *
 * Per request: TTFT = first streamed chunk - send time; TPOT = (last - first) / (tokens - 1). A
 * request meets its SLO when TTFT <= --ttft-ms and TPOT <= --tpot-ms (also sent to the server
 * as the request's targets). Goodput = output tokens of requests that met their SLO per second of
 * the run. The last line is machine-readable: "RESULT label=... throughput=... goodput=...".
 *
 * Without --trace, --clients C runs closed-loop: N requests (default C) of P random prompt tokens
 * and G forced output tokens each, at most C in flight (a client sends its next request when its
 * last one ended); with a trace, --clients caps the requests in flight. The same --seed gives
 * the same prompts, so two servers get the same request set. --no-slo leaves ttft_ms / tpot_ms
 * out of the requests (the server's defaults apply; a server without the extension ignores
 * them anyway). The RESULT line also gives tokens (output tokens received in all).
 *
 * --dump-requests FILE writes what was sent, after the run, in the format of `strata sim
 * --requests` (header "seconds,in,out"; per request its send time in seconds from the start of
 * the replay, and its prompt and output tokens as sent; a comment line gives the start on the wall
 * clock), so the simulator can replay exactly this load (tests/bench/sim_validate_autoscale.sh). */
#include "os/runtime/clock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct lreq {
    double t_arrival; /* seconds from start */
    int prompt, out;
    int fd, state; /* 0 pending, 1 sending, 2 receiving, 3 done, 4 failed */
    char *wbuf;
    size_t wlen, woff;
    char *rbuf;
    size_t rlen, rcap;
    double t_sent, t_first, t_last;
    int events, tokens, status;
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
    if (!n) return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i = (int)ceil(p / 100.0 * n) - 1;
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

/* "2023-11-16 18:15:46.6805900" -> seconds of the day */
static double parse_time(const char *s)
{
    int y, mo, d, h, mi;
    double sec;
    if (sscanf(s, "%d-%d-%d %d:%d:%lf", &y, &mo, &d, &h, &mi, &sec) != 6) return -1;
    return d * 86400.0 + h * 3600.0 + mi * 60.0 + sec;
}

static unsigned long long rng_state = 88172645463325252ULL;
static unsigned rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (unsigned)(rng_state >> 11);
}

static void usage(void)
{
    fprintf(stderr,
            "usage: loadgen --url http://HOST:PORT --trace FILE [--requests N] [--skip N]\n"
            "               [--speedup X] [--ctx N] [--scale F] [--vocab N] [--ttft-ms MS]\n"
            "               [--tpot-ms MS] [--label NAME] [--seed S] [--dump-requests FILE]\n"
            "               [--clients C] [--no-slo]\n"
            "       loadgen --url URL --clients C --prompt-len P --gen G [--requests N]\n"
            "               [--vocab N] [--no-slo] [--label NAME] [--seed S]\n");
    exit(2);
}

static void build_request(struct lreq *r, int vocab, double ttft_ms, double tpot_ms, int slo)
{
    size_t cap = (size_t)r->prompt * 7 + 512;
    char *body = malloc(cap);
    size_t n = (size_t)snprintf(body, cap, "{\"prompt\":[1");
    for (int i = 1; i < r->prompt; i++)
        n += (size_t)snprintf(body + n, cap - n, ",%u", 3 + rnd() % (unsigned)(vocab - 3));
    n += (size_t)snprintf(body + n, cap - n,
                          "],\"max_tokens\":%d,\"ignore_eos\":true,\"temperature\":0,"
                          "\"stream\":true,\"stream_options\":{\"include_usage\":true}",
                          r->out);
    if (slo)
        n +=
            (size_t)snprintf(body + n, cap - n, ",\"ttft_ms\":%g,\"tpot_ms\":%g", ttft_ms, tpot_ms);
    n += (size_t)snprintf(body + n, cap - n, "}");
    r->wbuf = malloc(n + 256);
    r->wlen =
        (size_t)sprintf(r->wbuf,
                        "POST /v1/completions HTTP/1.1\r\nHost: loadgen\r\nContent-Type: "
                        "application/json\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n",
                        n);
    memcpy(r->wbuf + r->wlen, body, n);
    r->wlen += n;
    free(body);
}

/* New bytes arrived: note the first and last SSE event times. */
static void on_bytes(struct lreq *r, size_t from, double t)
{
    if (!r->status && r->rlen >= 12) r->status = atoi(r->rbuf + 9);
    size_t start = from >= 6 ? from - 5 : 0;
    for (size_t i = start; i + 6 <= r->rlen; i++) {
        if (memcmp(r->rbuf + i, "data: ", 6)) continue;
        if (i + 12 <= r->rlen && !memcmp(r->rbuf + i + 6, "[DONE]", 6)) continue;
        /* the usage chunk has no choices: not a token */
        if (i + 40 < r->rlen &&
            memmem(r->rbuf + i, 120 < r->rlen - i ? 120 : r->rlen - i, "\"choices\":[]", 12))
            continue;
        if (!r->events) r->t_first = t;
        r->t_last = t;
        r->events++;
    }
}

struct opts {
    const char *url, *trace, *label, *dump;
    int n_req, skip, ctx, vocab;
    double speedup, scale, ttft_ms, tpot_ms;
    int clients, prompt_len, gen, slo; /* closed loop (without a trace): C in flight, P, G */
};

static void parse_opts(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){NULL, NULL, "run", NULL, 0, 0, 512, 512, 1, 0, 500, 50, 0, 0, 0, 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-slo")) {
            o->slo = 0;
            continue;
        }
        if (!v) usage();
        if (!strcmp(a, "--url"))
            o->url = v;
        else if (!strcmp(a, "--trace"))
            o->trace = v;
        else if (!strcmp(a, "--label"))
            o->label = v;
        else if (!strcmp(a, "--dump-requests"))
            o->dump = v;
        else if (!strcmp(a, "--requests"))
            o->n_req = atoi(v);
        else if (!strcmp(a, "--skip"))
            o->skip = atoi(v);
        else if (!strcmp(a, "--ctx"))
            o->ctx = atoi(v);
        else if (!strcmp(a, "--vocab"))
            o->vocab = atoi(v);
        else if (!strcmp(a, "--speedup"))
            o->speedup = atof(v);
        else if (!strcmp(a, "--scale"))
            o->scale = atof(v);
        else if (!strcmp(a, "--ttft-ms"))
            o->ttft_ms = atof(v);
        else if (!strcmp(a, "--tpot-ms"))
            o->tpot_ms = atof(v);
        else if (!strcmp(a, "--clients"))
            o->clients = atoi(v);
        else if (!strcmp(a, "--prompt-len"))
            o->prompt_len = atoi(v);
        else if (!strcmp(a, "--gen"))
            o->gen = atoi(v);
        else if (!strcmp(a, "--seed"))
            rng_state = strtoull(v, NULL, 10) * 2654435761ULL + 1;
        else
            usage();
        i++;
    }
    if (!o->n_req) o->n_req = o->trace ? 200 : o->clients;
    if (!o->url || o->n_req < 1 || o->ctx < 8 || o->vocab < 4 || o->speedup <= 0 ||
        o->clients < 0 || (!o->trace && (o->clients < 1 || o->prompt_len < 1 || o->gen < 1)))
        usage();
    if (o->scale <= 0) o->scale = o->ctx / 4096.0;
}

/* "http://A.B.C.D:PORT" -> addr; exits with status 2 on anything else. */
static int parse_url(const char *url, struct sockaddr_in *addr)
{
    char host[64];
    int port;
    if (sscanf(url, "http://%63[^:]:%d", host, &port) != 2) {
        fprintf(stderr, "loadgen: --url must be http://HOST:PORT\n");
        return -1;
    }
    *addr = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &addr->sin_addr) != 1) {
        fprintf(stderr, "loadgen: %s is not an IPv4 address\n", host);
        return -1;
    }
    return 0;
}

/* Up to o->n_req requests from the trace (after o->skip rows), lengths scaled and clamped to the
 * context. Returns the number read, -1 if the trace cannot be opened. */
static int read_trace(const struct opts *o, struct lreq *rq)
{
    FILE *f = fopen(o->trace, "r");
    if (!f) {
        perror(o->trace);
        return -1;
    }
    char line[256];
    int n = 0, row = 0;
    double t0 = -1;
    while (n < o->n_req && fgets(line, sizeof line, f)) {
        char ts[64];
        int c, g;
        if (sscanf(line, "%63[^,],%d,%d", ts, &c, &g) != 3) continue; /* header */
        if (row++ < o->skip) continue;
        double t = parse_time(ts);
        if (t < 0) continue;
        if (t0 < 0) t0 = t;
        struct lreq *r = &rq[n++];
        r->t_arrival = (t - t0) / o->speedup;
        r->prompt = (int)lround(c * o->scale);
        r->out = (int)lround(g * o->scale);
        int max_prompt = o->ctx * 3 / 4;
        if (r->prompt < 1) r->prompt = 1;
        if (r->prompt > max_prompt) r->prompt = max_prompt;
        if (r->out < 1) r->out = 1;
        if (r->prompt + r->out > o->ctx - 1) r->out = o->ctx - 1 - r->prompt;
        r->fd = -1;
    }
    fclose(f);
    return n;
}

/* Without a trace: n_req requests of prompt_len tokens and gen outputs, all due at once (the
 * cap on requests in flight makes it closed-loop). */
static int synth_requests(const struct opts *o, struct lreq *rq)
{
    for (int i = 0; i < o->n_req; i++)
        rq[i] = (struct lreq){.prompt = o->prompt_len, .out = o->gen, .fd = -1};
    return o->n_req;
}

/* The replay's state: requests in arrival order, the next to send, how many have ended. */
struct replay {
    struct lreq *rq;
    int n_req, next, open_n, finished;
    int ep, max_open; /* max_open: requests in flight at most (0: no cap) */
    struct sockaddr_in addr;
    double start;
};

/* Open a connection for every request whose arrival time has come. */
static void send_due(struct replay *p, double t)
{
    while (p->next < p->n_req && p->rq[p->next].t_arrival <= t &&
           (!p->max_open || p->open_n < p->max_open)) {
        struct lreq *r = &p->rq[p->next++];
        r->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        int one = 1;
        setsockopt(r->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        r->t_sent = clock_now();
        if (connect(r->fd, (struct sockaddr *)&p->addr, sizeof p->addr) && errno != EINPROGRESS) {
            r->state = 4, p->finished++;
            close(r->fd);
            continue;
        }
        r->state = 1;
        struct epoll_event e = {.events = EPOLLOUT | EPOLLIN, .data.ptr = r};
        epoll_ctl(p->ep, EPOLL_CTL_ADD, r->fd, &e);
        p->open_n++;
    }
}

/* Wait no longer than until the next arrival, and at most 100 ms. */
static int wait_ms(const struct replay *p)
{
    int timeout = 100;
    if (p->next < p->n_req) {
        double dt = p->rq[p->next].t_arrival - (clock_now() - p->start);
        timeout = dt <= 0 ? 0 : (int)(dt * 1000) + 1;
        if (timeout > 100) timeout = 100;
    }
    return timeout;
}

/* Send more of the request; once all is sent, wait only for the response. */
static void on_writable(struct replay *p, struct lreq *r)
{
    ssize_t w = send(r->fd, r->wbuf + r->woff, r->wlen - r->woff, MSG_NOSIGNAL);
    if (w > 0)
        r->woff += (size_t)w;
    else if (w < 0 && errno != EAGAIN)
        r->state = 4;
    if (r->woff == r->wlen) {
        r->state = 2;
        struct epoll_event e = {.events = EPOLLIN, .data.ptr = r};
        epoll_ctl(p->ep, EPOLL_CTL_MOD, r->fd, &e);
    }
}

/* Read all that is there; EOF (Connection: close) or an error ends the request. */
static void on_readable(struct lreq *r, double tnow)
{
    for (;;) {
        if (r->rcap - r->rlen < 4096) {
            r->rcap = r->rcap ? r->rcap * 2 : 16384;
            r->rbuf = realloc(r->rbuf, r->rcap + 1);
        }
        ssize_t got = recv(r->fd, r->rbuf + r->rlen, r->rcap - r->rlen, 0);
        if (got > 0) {
            size_t from = r->rlen;
            r->rlen += (size_t)got;
            r->rbuf[r->rlen] = 0;
            on_bytes(r, from, tnow);
            continue;
        }
        if (got < 0 && errno == EAGAIN) break;
        r->state = 3; /* EOF (Connection: close) or error */
        break;
    }
}

/* The request ended: it succeeded (state 3) only with status 200, tokens and the [DONE] line. */
static void on_done(struct replay *p, struct lreq *r)
{
    epoll_ctl(p->ep, EPOLL_CTL_DEL, r->fd, NULL);
    close(r->fd);
    p->open_n--;
    p->finished++;
    if (r->state == 3) {
        char *u = r->rbuf ? strstr(r->rbuf, "\"completion_tokens\":") : NULL;
        r->tokens = u ? atoi(u + 20) : 0;
        if (r->status != 200 || !r->tokens || !strstr(r->rbuf, "data: [DONE]")) r->state = 4;
    }
    r->state = r->state == 3 ? 3 : 4;
}

/* Send every request at its arrival time and read every response; returns the makespan. */
static double replay(struct lreq *rq, int n_req, int max_open, const struct sockaddr_in *addr,
                     double *start, double *start_unix)
{
    struct replay p = {rq, n_req, 0, 0, 0, epoll_create1(0), max_open, *addr, 0};
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    p.start = clock_now();
    *start = p.start;
    *start_unix = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
    struct epoll_event evs[256];
    while (p.finished < n_req) {
        send_due(&p, clock_now() - p.start);
        int k = epoll_wait(p.ep, evs, 256, wait_ms(&p));
        double tnow = clock_now();
        for (int i = 0; i < k; i++) {
            struct lreq *r = evs[i].data.ptr;
            if (r->state == 1 && (evs[i].events & EPOLLOUT)) on_writable(&p, r);
            if (r->state == 2 && (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
                on_readable(r, tnow);
            if (r->state >= 3) on_done(&p, r);
        }
    }
    double makespan = clock_now() - p.start;
    close(p.ep);
    return makespan;
}

/* The requests as sent, as `strata sim --requests` reads them. Returns 0, -1 (with a message on
 * stderr) when the file cannot be written. */
static int dump_requests(const char *path, const struct lreq *rq, int n_req, double start,
                         double start_unix, const char *label)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return -1;
    }
    /* when 0 s was on the wall clock, to put the servers' logged events on the same time line */
    fprintf(f, "# loadgen %s: 0 s = unix time %.3f s\nseconds,in,out\n", label, start_unix);
    double t_prev = 0;
    for (int i = 0; i < n_req; i++) {
        /* a request never sent (it cannot be: replay sends all) keeps its planned time */
        double t = rq[i].t_sent > 0 ? rq[i].t_sent - start : rq[i].t_arrival;
        if (t < t_prev) t = t_prev; /* the file's times never go backwards */
        t_prev = t;
        fprintf(f, "%.6f,%d,%d\n", t, rq[i].prompt, rq[i].out);
    }
    if (fclose(f)) {
        perror(path);
        return -1;
    }
    return 0;
}

/* Per-request TTFT and TPOT against the SLO, percentiles, and the RESULT line. Returns the number
 * of failed requests. */
static int report(const struct opts *o, struct lreq *rq, int n_req, double makespan)
{
    double *ttft = malloc(sizeof(double) * (size_t)n_req),
           *tpot = malloc(sizeof(double) * (size_t)n_req);
    int n_ok = 0, n_fail = 0, n_tpot = 0, n_slo = 0, miss_ttft = 0, miss_tpot = 0;
    long long tokens = 0, good = 0;
    for (int i = 0; i < n_req; i++) {
        struct lreq *r = &rq[i];
        if (r->state != 3) {
            n_fail++;
            continue;
        }
        n_ok++;
        tokens += r->tokens;
        double a = r->t_first - r->t_sent;
        double b = r->tokens > 1 ? (r->t_last - r->t_first) / (r->tokens - 1) : 0;
        ttft[n_ok - 1] = a * 1e3;
        if (r->tokens > 1) tpot[n_tpot++] = b * 1e3;
        if (a * 1e3 <= o->ttft_ms && b * 1e3 <= o->tpot_ms) n_slo++, good += r->tokens;
        miss_ttft += a * 1e3 > o->ttft_ms;
        miss_tpot += b * 1e3 > o->tpot_ms;
    }
    double thr = tokens / makespan, gp = good / makespan;
    double t50 = pct(ttft, n_ok, 50), t99 = pct(ttft, n_ok, 99);
    double p50 = pct(tpot, n_tpot, 50), p99 = pct(tpot, n_tpot, 99);
    printf("%-12s %4d ok %3d failed in %6.2f s | throughput %8.1f tok/s | goodput %8.1f tok/s "
           "(%5.1f%% of requests in SLO) | TTFT p50 %7.1f p99 %7.1f ms | TPOT p50 %6.2f p99 %6.2f "
           "ms | missed TTFT %d, TPOT %d\n",
           o->label, n_ok, n_fail, makespan, thr, gp, n_ok ? 100.0 * n_slo / n_req : 0, t50, t99,
           p50, p99, miss_ttft, miss_tpot);
    printf("RESULT label=%s ok=%d failed=%d seconds=%.3f throughput=%.1f goodput=%.1f slo_pct=%.1f "
           "ttft_p50_ms=%.2f ttft_p99_ms=%.2f tpot_p50_ms=%.3f tpot_p99_ms=%.3f tokens=%lld\n",
           o->label, n_ok, n_fail, makespan, thr, gp, 100.0 * n_slo / n_req, t50, t99, p50, p99,
           tokens);
    free(ttft), free(tpot);
    return n_fail;
}

int main(int argc, char **argv)
{
    struct opts o;
    parse_opts(argc, argv, &o);
    struct sockaddr_in addr;
    if (parse_url(o.url, &addr) < 0) return 2;
    struct lreq *rq = calloc((size_t)o.n_req, sizeof *rq);
    int n_req = o.trace ? read_trace(&o, rq) : synth_requests(&o, rq);
    if (n_req < 0) {
        free(rq);
        return 1;
    }
    long long sent_prompt = 0, sent_out = 0;
    for (int i = 0; i < n_req; i++) {
        build_request(&rq[i], o.vocab, o.ttft_ms, o.tpot_ms, o.slo);
        sent_prompt += rq[i].prompt, sent_out += rq[i].out;
    }
    if (o.trace)
        fprintf(stderr,
                "loadgen %s: %d requests over %.1f s (%.1f req/s), mean prompt %.0f, mean output "
                "%.0f tokens\n",
                o.label, n_req, rq[n_req - 1].t_arrival, n_req / (rq[n_req - 1].t_arrival + 1e-9),
                (double)sent_prompt / n_req, (double)sent_out / n_req);
    else
        fprintf(stderr, "loadgen %s: %d requests, %d clients, prompt %d, output %d tokens\n",
                o.label, n_req, o.clients, o.prompt_len, o.gen);
    double start, start_unix;
    double makespan = replay(rq, n_req, o.clients, &addr, &start, &start_unix);
    int n_fail = report(&o, rq, n_req, makespan);
    if (o.dump && dump_requests(o.dump, rq, n_req, start, start_unix, o.label) < 0) n_fail++;
    for (int i = 0; i < n_req; i++) free(rq[i].wbuf), free(rq[i].rbuf);
    free(rq);
    return n_fail ? 1 : 0;
}
