/* The whole front in one process against the fake model: HTTP server thread + scheduler thread,
 * real sockets on loopback. Completions (plain and streamed), 16 concurrent clients each getting
 * exactly their output alone, cancellation on disconnect, and every kind of bad input answered
 * in OpenAI's error shape while the server keeps serving. Timing is never a pass criterion. */
#include "check.h"
#include "fake_model.h"
#include "os/common/errmsg.h"
#include "serving/api/http_server.h"
#include "serving/api/serve_front.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#define CTX              256
#define CHECK_TEXT(a, b) CHECKF(!strcmp((a), (b)), "got \"%.200s\", want \"%.200s\"", (a), (b))

static struct {
    struct kv_cache kv;
    void *mem;
    struct fake_model fm;
    struct serve_metrics m;
    struct scheduler *s;
    struct front *f;
    struct http_server *http;
    pthread_t th;
    int port, joined;
} G;

static void *http_thread(void *arg)
{
    char err[ERRMSG_LEN];
    (void)arg;
    http_server_run(G.http, err);
    return NULL;
}

static const char *fake_decode_piece(void *ctx, int id, char *scratch, size_t *len)
{
    return fake_decode(ctx, -1, id, scratch, len);
}

static int start(const char *api_key)
{
    char err[ERRMSG_LEN];
    memset(&G, 0, sizeof G);
    G.mem = calloc(1, kv_cache_bytes(KV_F32, 1, 1, 8, 512));
    if (kv_cache_init(&G.kv, G.mem, KV_F32, 1, 1, 1, 8, 512, err)) return -1;
    G.fm.kv = &G.kv;
    metrics_init(&G.m);
    struct front_config fc = {.api_key = api_key};
    G.f = front_new(&fc, &G.m, err);
    struct http_server_config hc = {.host = "127.0.0.1",
                                    .port = 0,
                                    .max_conns = 40,
                                    .max_head = 8192,
                                    .max_body = 64 * 1024,
                                    .read_timeout_ms = 400,
                                    .idle_timeout_ms = 5000,
                                    .write_timeout_ms = 2000,
                                    .max_pending_write = 1 << 20};
    struct http_handler h = front_handler(G.f);
    G.http = http_server_new(&hc, &h, &G.m, err);
    if (!G.http) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    front_set_server(G.f, G.http);
    G.port = http_server_port(G.http);
    pthread_create(&G.th, NULL, http_thread, NULL);
    return 0;
}

/* /tokenize through the fake "tokenizer": BOS (0) when add_special, then fake_encode's ids;
 * pieces are fake_chars ("#" for BOS). */
static int fake_tokenize(void *tok, const char *text, size_t len, int add_special,
                         int parse_special, int *out, int cap, int *n, char *err)
{
    (void)parse_special;
    if (fake_encode(tok, text, len, out, cap, n, err)) return -1;
    if (!add_special) memmove(out, out + 1, (size_t)-- * n * sizeof *out);
    return 0;
}

static void make_ready(void)
{
    char err[ERRMSG_LEN];
    struct sched_config sc = {.max_seqs = 8, .max_step_tokens = 64, .ctx = CTX};
    struct sched_ops ops = {.ctx = &G.fm,
                            .vocab_size = FAKE_VOCAB,
                            .eos_id = FAKE_EOS,
                            .bos_id = -1,
                            .forward = fake_forward,
                            .decode = fake_decode,
                            .notify = front_notify,
                            .wake = front_wake};
    ops.notify_ctx = G.f;
    G.s = sched_new(&sc, &ops, &G.kv, &G.m, err);
    sched_start(G.s, err);
    struct front_model fm = {.name = "fake",
                             .ctx = CTX,
                             .vocab_size = FAKE_VOCAB,
                             .tmpl = CHAT_PLAIN,
                             .encode = fake_encode,
                             .tokenize = fake_tokenize,
                             .piece = fake_decode_piece};
    front_set_ready(G.f, &fm, G.s);
}

static void stop(void)
{
    if (!G.joined) {
        http_server_stop(G.http);
        pthread_join(G.th, NULL);
    }
    if (G.s) sched_free(G.s);
    http_server_free(G.http);
    front_free(G.f);
    free(G.mem);
}

static int dial_rcvbuf(int rcvbuf)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    /* before connect, so the advertised window stays that small */
    if (rcvbuf) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)G.port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static int dial(void)
{
    return dial_rcvbuf(0);
}

static void send_all(int fd, const char *s, size_t n)
{
    while (n) {
        ssize_t k = send(fd, s, n, MSG_NOSIGNAL);
        if (k <= 0) return;
        s += k, n -= (size_t)k;
    }
}

/* Read until EOF. */
static char *read_all(int fd, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    for (;;) {
        if (n + 1 >= cap) b = realloc(b, cap *= 2);
        ssize_t k = recv(fd, b + n, cap - n - 1, 0);
        if (k <= 0) break;
        n += (size_t)k;
    }
    b[n] = 0;
    if (len) *len = n;
    return b;
}

struct resp {
    int status;
    char *raw, *body; /* body: de-chunked */
};

static void dechunk(char *body)
{
    char *in = body, *out = body;
    for (;;) {
        unsigned long n = strtoul(in, &in, 16);
        in = strstr(in, "\r\n");
        if (!in || !n) break;
        in += 2;
        memmove(out, in, n);
        out += n;
        in += n + 2;
    }
    *out = 0;
}

static struct resp http(const char *method, const char *path, const char *body, const char *extra)
{
    struct resp r = {0};
    int fd = dial();
    if (fd < 0) return r;
    char head[1024];
    int hn = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%sContent-Length: "
                      "%zu\r\n\r\n",
                      method, path, extra ? extra : "", body ? strlen(body) : 0);
    send_all(fd, head, (size_t)hn);
    if (body) send_all(fd, body, strlen(body));
    r.raw = read_all(fd, NULL);
    close(fd);
    sscanf(r.raw, "HTTP/1.1 %d", &r.status);
    char *b = strstr(r.raw, "\r\n\r\n");
    r.body = strdup(b ? b + 4 : "");
    if (strstr(r.raw, "Transfer-Encoding: chunked")) dechunk(r.body);
    return r;
}

static void resp_free(struct resp *r)
{
    free(r->raw);
    free(r->body);
}

static void check_error_shape(const struct resp *r, int status)
{
    CHECKF(r->status == status, "status %d, want %d: %s", r->status, status, r->raw);
    cJSON *o = cJSON_Parse(r->body);
    CHECKF(o, "body is not JSON: %s", r->body);
    cJSON *e = cJSON_GetObjectItem(o, "error");
    CHECKF(cJSON_IsString(cJSON_GetObjectItem(e, "message")), "no error.message: %s", r->body);
    CHECK(cJSON_IsString(cJSON_GetObjectItem(e, "type")));
    cJSON_Delete(o);
}

/* The oracle for a completion prompt through the fake tokenizer. */
static void expect_text(const char *prompt, int max_tokens, char *want, int *eos)
{
    int ids[1024], n = 0;
    fake_encode(NULL, prompt, strlen(prompt), ids, 1024, &n, NULL);
    fake_oracle(ids, n, max_tokens, CTX, want, eos);
}

/* Thread-local results: the concurrent-clients test calls this from 20 threads at once. */
static const char *completion_text(const char *body, const char **finish)
{
    static _Thread_local char buf[4096];
    cJSON *o = cJSON_Parse(body);
    cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    cJSON *t = cJSON_GetObjectItem(c0, "text");
    if (!t) t = cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "message"), "content");
    snprintf(buf, sizeof buf, "%s", cJSON_IsString(t) ? t->valuestring : "<none>");
    static _Thread_local char fin[16];
    cJSON *f = cJSON_GetObjectItem(c0, "finish_reason");
    snprintf(fin, sizeof fin, "%s", cJSON_IsString(f) ? f->valuestring : "null");
    if (finish) *finish = fin;
    cJSON_Delete(o);
    return buf;
}

TEST(loading_then_ready)
{
    struct resp r = http("GET", "/health", NULL, NULL);
    CHECKF(r.status == 503, "%s", r.raw);
    CHECK(strstr(r.body, "\"status\":\"loading\"") && strstr(r.body, "\"pid\":"));
    CHECK(strstr(r.raw, "Retry-After:"));
    resp_free(&r);
    r = http("POST", "/v1/completions", "{\"prompt\":\"x\"}", NULL);
    check_error_shape(&r, 503);
    resp_free(&r);
    r = http("POST", "/tokenize", "{\"content\":\"x\"}", NULL);
    check_error_shape(&r, 503);
    resp_free(&r);
    make_ready();
    r = http("GET", "/health", NULL, NULL);
    CHECKF(r.status == 200, "%s", r.raw);
    CHECK(strstr(r.body, "\"processes\":"));
    resp_free(&r);
    r = http("GET", "/v1/models", NULL, NULL);
    CHECK(r.status == 200 && strstr(r.body, "\"id\":\"fake\""));
    resp_free(&r);
}

TEST(completion_plain_and_stream)
{
    char want[4096];
    int eos;
    expect_text("hello world", 20, want, &eos);
    struct resp r = http("POST", "/v1/completions",
                         "{\"prompt\":\"hello world\",\"max_tokens\":20,\"temperature\":0}", NULL);
    CHECKF(r.status == 200, "%s", r.raw);
    const char *fin;
    CHECK_TEXT(completion_text(r.body, &fin), want);
    CHECK_STR(fin, eos ? "stop" : "length");
    CHECK(strstr(r.body, "\"usage\":{\"prompt_tokens\":12,"));
    resp_free(&r);

    r = http("POST", "/v1/completions",
             "{\"prompt\":\"hello world\",\"max_tokens\":20,\"temperature\":0,\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true}}",
             NULL);
    CHECKF(r.status == 200 && strstr(r.raw, "text/event-stream"), "%s", r.raw);
    /* concatenate the chunks */
    char got[4096] = "";
    int events = 0, done = 0, usage = 0;
    for (char *p = r.body; (p = strstr(p, "data: ")); p += 6) {
        events++;
        if (!strncmp(p + 6, "[DONE]\n\n", 8)) {
            done = 1;
            continue;
        }
        char *end = strstr(p, "\n\n");
        CHECK(end);
        *end = 0;
        cJSON *o = cJSON_Parse(p + 6);
        CHECKF(o, "bad chunk %s", p + 6);
        cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
        if (c0) strcat(got, cJSON_GetObjectItem(c0, "text")->valuestring);
        if (cJSON_GetObjectItem(o, "usage")) usage = 1;
        cJSON_Delete(o);
        *end = '\n';
    }
    CHECK(done && usage && events >= 3);
    CHECK_TEXT(got, want);
    resp_free(&r);
}

TEST(chat_completion)
{
    /* the plain template */
    char want[4096];
    int eos;
    expect_text("User: hi\nAssistant:", 8, want, &eos);
    struct resp r = http("POST", "/v1/chat/completions",
                         "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":8,"
                         "\"temperature\":0}",
                         NULL);
    CHECKF(r.status == 200, "%s", r.raw);
    CHECK(strstr(r.body, "\"object\":\"chat.completion\""));
    CHECK_TEXT(completion_text(r.body, NULL), want);
    resp_free(&r);
}

struct client {
    char prompt[64];
    int max_tokens;
    int ok;
    char got[4096], want[4096];
};

static void *client_main(void *arg)
{
    struct client *c = arg;
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0}",
             c->prompt, c->max_tokens);
    struct resp r = http("POST", "/v1/completions", body, NULL);
    int eos;
    expect_text(c->prompt, c->max_tokens, c->want, &eos);
    snprintf(c->got, sizeof c->got, "%s", r.status == 200 ? completion_text(r.body, NULL) : r.raw);
    c->ok = r.status == 200 && !strcmp(c->got, c->want);
    resp_free(&r);
    return NULL;
}

TEST(concurrent_clients_get_their_output_alone)
{
    struct client c[20];
    pthread_t th[20];
    G.fm.sleep_us_per_token = 50; /* keep steps slow enough that requests overlap */
    for (int i = 0; i < 20; i++) {
        snprintf(c[i].prompt, sizeof c[i].prompt, "prompt %d %.*s", i, i * 2,
                 "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz");
        c[i].max_tokens = 5 + i * 3;
        pthread_create(&th[i], NULL, client_main, &c[i]);
    }
    for (int i = 0; i < 20; i++) pthread_join(th[i], NULL);
    G.fm.sleep_us_per_token = 0;
    for (int i = 0; i < 20; i++)
        CHECKF(c[i].ok, "client %d: got '%.100s' want '%.100s'", i, c[i].got, c[i].want);
}

TEST(disconnect_cancels_and_frees_blocks)
{
    unsigned long long cancelled0 = atomic_load(&G.m.requests[OUTCOME_CANCELLED]);
    G.fm.sleep_us_per_token = 2000;
    int fd = dial();
    const char *body = "{\"prompt\":\"cancel me\",\"max_tokens\":200,\"ignore_eos\":true,"
                       "\"stream\":true}";
    char head[256];
    int hn = snprintf(head, sizeof head,
                      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n",
                      strlen(body));
    send_all(fd, head, (size_t)hn);
    send_all(fd, body, strlen(body));
    char buf[4096];
    size_t got = 0;
    while (got < sizeof buf - 1) { /* the headers, then the first chunk */
        ssize_t k = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        CHECK(k > 0);
        got += (size_t)k;
        buf[got] = 0;
        if (strstr(buf, "data: ")) break;
    }
    CHECK(atomic_load(&G.m.kv_blocks_used) > 0);
    close(fd);
    for (int i = 0; i < 200 && atomic_load(&G.m.requests[OUTCOME_CANCELLED]) == cancelled0; i++)
        usleep(10000);
    G.fm.sleep_us_per_token = 0;
    CHECK_EQ_INT(atomic_load(&G.m.requests[OUTCOME_CANCELLED]), cancelled0 + 1);
    for (int i = 0; i < 100 && atomic_load(&G.m.kv_blocks_used); i++) usleep(10000);
    CHECK_EQ_INT(atomic_load(&G.m.kv_blocks_used), 0);
}

TEST(bad_input_gets_openai_errors)
{
    struct resp r;
    r = http("POST", "/v1/completions", "{\"prompt\":", NULL);
    check_error_shape(&r, 400);
    resp_free(&r);
    r = http("POST", "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":-1}", NULL);
    check_error_shape(&r, 400);
    resp_free(&r);
    r = http("POST", "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":100000}", NULL);
    check_error_shape(&r, 400);
    CHECK(strstr(r.body, "maximum context length is 256 tokens") && strstr(r.body, "100002"));
    resp_free(&r);
    char big[400];
    memset(big, 'a', 300);
    big[300] = 0;
    char body[512];
    snprintf(body, sizeof body, "{\"prompt\":\"%s\"}", big);
    r = http("POST", "/v1/completions", body, NULL);
    check_error_shape(&r, 400);
    CHECK(strstr(r.body, "256") && strstr(r.body, "301"));
    resp_free(&r);
    r = http("POST", "/v1/completions", "{\"prompt\":\"\xc3\x28\"}", NULL);
    check_error_shape(&r, 400);
    resp_free(&r);
    r = http("GET", "/v1/nothing", NULL, NULL);
    check_error_shape(&r, 404);
    resp_free(&r);
    r = http("GET", "/v1/completions", NULL, NULL);
    check_error_shape(&r, 405);
    resp_free(&r);
    /* oversized body: refused from the Content-Length, without reading it */
    r = http("POST", "/v1/completions", NULL, "Content-Length: 10000000\r\n");
    CHECK(r.status == 400 || r.status == 413); /* duplicate CL header differs: 400 */
    resp_free(&r);
    int fd = dial();
    const char *h = "POST /v1/completions HTTP/1.1\r\nContent-Length: 10000000\r\n\r\n";
    send_all(fd, h, strlen(h));
    char *raw = read_all(fd, NULL);
    close(fd);
    CHECKF(!strncmp(raw, "HTTP/1.1 413", 12) && strstr(raw, "\"error\""), "%s", raw);
    free(raw);
    /* the server still serves */
    r = http("POST", "/v1/completions", "{\"prompt\":\"still\",\"max_tokens\":3}", NULL);
    CHECK_EQ_INT(r.status, 200);
    resp_free(&r);
}

TEST(slow_client_times_out)
{
    int fd = dial();
    const char *h = "POST /v1/completions HTTP/1.1\r\nContent-Length: 50\r\n\r\n{\"pro";
    send_all(fd, h, strlen(h));
    char *raw = read_all(fd, NULL); /* the server answers 408 after read_timeout (400 ms) */
    close(fd);
    CHECKF(!strncmp(raw, "HTTP/1.1 408", 12) && strstr(raw, "\"error\""), "%s", raw);
    free(raw);
}

TEST(too_many_connections_get_503)
{
    int fds[45], n = 0;
    for (int i = 0; i < 45; i++) {
        fds[i] = dial();
        if (fds[i] >= 0) n++;
    }
    CHECK(n == 45);
    /* connection 41.. are answered 503 and closed */
    int got503 = 0;
    for (int i = 40; i < 45; i++) {
        char *raw = read_all(fds[i], NULL);
        if (!strncmp(raw, "HTTP/1.1 503", 12) && strstr(raw, "Retry-After: 1") &&
            strstr(raw, "\"error\""))
            got503++;
        free(raw);
    }
    for (int i = 0; i < 45; i++) close(fds[i]);
    CHECK(got503 >= 4);
    usleep(100000);
    struct resp r = http("GET", "/health", NULL, NULL);
    CHECK_EQ_INT(r.status, 200);
    resp_free(&r);
}

TEST(keep_alive_and_pipelining)
{
    int fd = dial();
    const char *two =
        "GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n"
        "Connection: close\r\n\r\n";
    send_all(fd, two, strlen(two));
    char *raw = read_all(fd, NULL);
    close(fd);
    char *second = strstr(raw + 1, "HTTP/1.1 200");
    CHECKF(!strncmp(raw, "HTTP/1.1 200", 12) && second && strstr(second, "\"object\":\"list\""),
           "%s", raw);
    free(raw);
}

TEST(pipelined_completions_answer_in_order)
{
    const char *b1 = "{\"prompt\":\"first\",\"max_tokens\":6,\"temperature\":0}";
    const char *b2 = "{\"prompt\":\"second\",\"max_tokens\":9,\"temperature\":0,\"stream\":true}";
    char req[1024];
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nContent-Length: %zu\r\n\r\n%s"
                     "POST /v1/completions HTTP/1.1\r\nConnection: close\r\nContent-Length: "
                     "%zu\r\n\r\n%s",
                     strlen(b1), b1, strlen(b2), b2);
    int fd = dial();
    send_all(fd, req, (size_t)n);
    char *raw = read_all(fd, NULL);
    close(fd);
    char w1[4096], w2[4096];
    int eos;
    expect_text("first", 6, w1, &eos);
    expect_text("second", 9, w2, &eos);
    char *second = strstr(raw + 1, "HTTP/1.1 200");
    CHECKF(!strncmp(raw, "HTTP/1.1 200", 12) && second, "%.300s", raw);
    *second = 0;
    char *body1 = strstr(raw, "\r\n\r\n") + 4;
    CHECK_TEXT(completion_text(body1, NULL), w1);
    *second = 'H';
    CHECK(strstr(second, "text/event-stream") && strstr(second, "data: [DONE]"));
    free(raw);
}

TEST(metrics_add_up)
{
    struct resp r = http("GET", "/metrics", NULL, NULL);
    CHECK_EQ_INT(r.status, 200);
    /* every line is a comment or "name{labels} value" */
    unsigned long long stop = 0, length = 0, cancelled = 0;
    for (char *line = strtok(r.body, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#') continue;
        char name[160];
        double v;
        CHECKF(sscanf(line, "%159s %lf", name, &v) == 2, "bad line '%s'", line);
        if (!strcmp(name, "strata_requests_total{outcome=\"stop\"}")) stop = (unsigned long long)v;
        if (!strcmp(name, "strata_requests_total{outcome=\"length\"}"))
            length = (unsigned long long)v;
        if (!strcmp(name, "strata_requests_total{outcome=\"cancelled\"}"))
            cancelled = (unsigned long long)v;
    }
    /* 2 (plain+stream) + 1 chat + 20 clients + 1 "still" + 2 pipelined finished; 1 cancelled */
    CHECK_EQ_INT(stop + length, 26);
    CHECK_EQ_INT(cancelled, 1);
    resp_free(&r);
}

/* A chunked request (as curl -H 'Transfer-Encoding: chunked' or a generator body in Python send
 * it): pieces with pauses between them, an extension and a trailer; the completion is exactly
 * the one the same prompt gets with Content-Length. */
TEST(chunked_request_body)
{
    char want[4096];
    int eos;
    expect_text("hello chunked", 12, want, &eos);
    const char *pieces[] = {"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                            "Transfer-Encoding: chunked\r\n\r\n",
                            "b\r\n{\"prompt\":\"", "\r\nd;x=1\r\nhello chunked\r\n",
                            "22\r\n\",\"max_tokens\":12,\"tempe",
                            "rature\":0}\r\n0\r\nX-Check: 1\r\n\r\n"};
    int fd = dial();
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) {
        send_all(fd, pieces[i], strlen(pieces[i]));
        usleep(20000);
    }
    char *raw = read_all(fd, NULL);
    close(fd);
    CHECKF(!strncmp(raw, "HTTP/1.1 200", 12), "%.300s", raw);
    CHECK_TEXT(completion_text(strstr(raw, "\r\n\r\n") + 4, NULL), want);
    free(raw);

    /* Expect: 100-continue: the server asks for the body, then answers */
    fd = dial();
    const char *head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                       "Transfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n";
    send_all(fd, head, strlen(head));
    char cont[64] = "";
    size_t got = 0;
    while (got < 25) {
        ssize_t k = recv(fd, cont + got, 25 - got, 0);
        if (k <= 0) break;
        got += (size_t)k;
    }
    CHECKF(!strcmp(cont, "HTTP/1.1 100 Continue\r\n\r\n"), "got '%s'", cont);
    const char *body = "2a\r\n{\"prompt\":\"hello chunked\",\"max_tokens\":12}\r\n0\r\n\r\n";
    send_all(fd, body, strlen(body));
    raw = read_all(fd, NULL);
    close(fd);
    CHECKF(!strncmp(raw, "HTTP/1.1 200", 12), "%.300s", raw);
    free(raw);
}

static char *raw_exchange(const char *req)
{
    int fd = dial();
    send_all(fd, req, strlen(req));
    char *raw = read_all(fd, NULL);
    close(fd);
    return raw;
}

TEST(chunked_bad_bodies_get_errors)
{
    const char *te =
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    char req[512];
    /* over max_body (64 KiB): refused from the chunk size */
    snprintf(req, sizeof req, "%s10001\r\n{\"prompt\":", te);
    char *raw = raw_exchange(req);
    CHECKF(!strncmp(raw, "HTTP/1.1 413", 12) && strstr(raw, "\"error\""), "%.300s", raw);
    free(raw);
    snprintf(req, sizeof req, "%sfffffffffffffffffffffff\r\n", te);
    raw = raw_exchange(req);
    CHECKF(!strncmp(raw, "HTTP/1.1 413", 12), "%.300s", raw);
    free(raw);
    snprintf(req, sizeof req, "%sxyz\r\n", te);
    raw = raw_exchange(req);
    CHECKF(!strncmp(raw, "HTTP/1.1 400", 12) && strstr(raw, "\"error\""), "%.300s", raw);
    free(raw);
    snprintf(req, sizeof req, "%s2\r\n{}XX0\r\n\r\n", te);
    raw = raw_exchange(req);
    CHECKF(!strncmp(raw, "HTTP/1.1 400", 12), "%.300s", raw);
    free(raw);
    /* a truncated stream: 408 after the read timeout (400 ms) */
    snprintf(req, sizeof req, "%s20\r\n{\"prompt\":", te);
    raw = raw_exchange(req);
    CHECKF(!strncmp(raw, "HTTP/1.1 408", 12), "%.300s", raw);
    free(raw);
    /* the server still serves */
    struct resp r =
        http("POST", "/v1/completions", "{\"prompt\":\"still\",\"max_tokens\":3}", NULL);
    CHECK_EQ_INT(r.status, 200);
    resp_free(&r);
}

/* A streaming client that reads its first event and then never reads again (its socket stays
 * open; a small receive buffer fills at once). The loop and the scheduler go on serving others;
 * after write_timeout_ms without acknowledged progress the connection is dropped, the request
 * cancelled and its KV blocks freed. */
TEST(stalled_stream_reader_is_dropped)
{
    unsigned long long cancelled0 = atomic_load(&G.m.requests[OUTCOME_CANCELLED]);
    G.fm.sleep_us_per_token = 10000; /* 240 tokens: several seconds, longer than the timeout */
    int fd = dial_rcvbuf(1024);
    const char *body = "{\"prompt\":\"stall\",\"max_tokens\":240,\"ignore_eos\":true,"
                       "\"stream\":true}";
    char head[256];
    int hn = snprintf(head, sizeof head,
                      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n",
                      strlen(body));
    send_all(fd, head, (size_t)hn);
    send_all(fd, body, strlen(body));
    char buf[4096];
    size_t got = 0;
    while (got < sizeof buf - 1) {
        ssize_t k = recv(fd, buf + got, 1, 0); /* byte by byte: read nothing past the event */
        CHECK(k > 0);
        got += (size_t)k;
        buf[got] = 0;
        if (strstr(buf, "data: ") && strstr(strstr(buf, "data: "), "\n\n")) break;
    }
    /* Others are served while the stalled stream holds its blocks. */
    struct client c[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        snprintf(c[i].prompt, sizeof c[i].prompt, "meanwhile %d", i);
        c[i].max_tokens = 4 + i;
        pthread_create(&th[i], NULL, client_main, &c[i]);
    }
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 3; i++)
        CHECKF(c[i].ok, "client %d: got '%.100s' want '%.100s'", i, c[i].got, c[i].want);
    CHECKF(atomic_load(&G.m.requests[OUTCOME_CANCELLED]) == cancelled0 &&
               atomic_load(&G.m.running) == 1 && atomic_load(&G.m.kv_blocks_used) > 0,
           "the stalled stream was not running while the others were served");
    int unread = 0;
    ioctl(fd, FIONREAD, &unread);
    CHECKF(unread > 0, "the client's receive buffer is empty (%d)", unread);
    /* write_timeout_ms (2 s) later: dropped, cancelled, blocks freed */
    for (int i = 0; i < 1000 && atomic_load(&G.m.requests[OUTCOME_CANCELLED]) == cancelled0; i++)
        usleep(10000);
    CHECK_EQ_INT(atomic_load(&G.m.requests[OUTCOME_CANCELLED]), cancelled0 + 1);
    for (int i = 0; i < 100 && atomic_load(&G.m.kv_blocks_used); i++) usleep(10000);
    CHECK_EQ_INT(atomic_load(&G.m.kv_blocks_used), 0);
    CHECK_EQ_INT(atomic_load(&G.m.running), 0);
    G.fm.sleep_us_per_token = 0;
    /* the client finds the stream cut short: no [DONE] */
    size_t n;
    char *rest = read_all(fd, &n);
    close(fd);
    CHECK(!strstr(rest, "[DONE]"));
    free(rest);
    struct resp r =
        http("POST", "/v1/completions", "{\"prompt\":\"after\",\"max_tokens\":3}", NULL);
    CHECK_EQ_INT(r.status, 200);
    resp_free(&r);
}

/* The exact answer (status, JSON body) to POST path with body. */
static void expect_answer(const char *path, const char *body, int status, const char *want)
{
    struct resp r = http("POST", path, body, NULL);
    CHECKF(r.status == status && !strcmp(r.body, want), "%s %s: %d %s, want %d %s", path, body,
           r.status, r.body, status, want);
    CHECKF(strstr(r.raw, "\r\nContent-Type: application/json\r\n"), "%s", r.raw);
    resp_free(&r);
}

TEST(tokenize_and_detokenize)
{
    /* fake ids: 2 + byte % 38 ("ab" -> 23 24), pieces fake_chars[id] ("v", "w") */
    expect_answer("/tokenize", "{\"content\":\"ab\"}", 200, "{\"tokens\":[23,24]}");
    expect_answer("/tokenize", "{\"content\":[\"a\",7,\"b\"],\"add_special\":true}", 200,
                  "{\"tokens\":[0,23,7,24]}");
    expect_answer("/tokenize", "{\"content\":\"ab\",\"with_pieces\":true,\"add_special\":true}",
                  200,
                  "{\"tokens\":[{\"id\":0,\"piece\":\"#\"},{\"id\":23,\"piece\":\"v\"},"
                  "{\"id\":24,\"piece\":\"w\"}]}");
    expect_answer("/detokenize", "{\"tokens\":[0,23,24,39]}", 200, "{\"content\":\"#vw.\"}");
    expect_answer("/detokenize", "{}", 200, "{\"content\":\"\"}");
    expect_answer("/detokenize", "{\"tokens\":[40]}", 400,
                  "{\"error\":{\"message\":\"Invalid value for 'tokens': token id 40 at index 0 "
                  "is outside the vocabulary (40 tokens).\",\"type\":\"invalid_request_error\","
                  "\"param\":\"tokens\",\"code\":null}}");
    struct resp r = http("POST", "/tokenize", "{\"content\":", NULL);
    check_error_shape(&r, 400);
    resp_free(&r);
    r = http("GET", "/detokenize", NULL, NULL);
    check_error_shape(&r, 405);
    resp_free(&r);
}

TEST(api_key)
{
    stop();
    CHECK(start("sk-test") == 0);
    make_ready();
    struct resp r = http("GET", "/v1/models", NULL, NULL);
    check_error_shape(&r, 401);
    resp_free(&r);
    r = http("GET", "/v1/models", NULL, "Authorization: Bearer wrong\r\n");
    check_error_shape(&r, 401);
    resp_free(&r);
    r = http("GET", "/v1/models", NULL, "Authorization: Bearer sk-test\r\n");
    CHECK_EQ_INT(r.status, 200);
    resp_free(&r);
    r = http("POST", "/tokenize", "{\"content\":\"a\"}", NULL);
    check_error_shape(&r, 401);
    resp_free(&r);
    r = http("POST", "/detokenize", "{}", "Authorization: Bearer wrong\r\n");
    check_error_shape(&r, 401);
    resp_free(&r);
    r = http("POST", "/tokenize", "{\"content\":\"a\"}", "Authorization: Bearer sk-test\r\n");
    CHECKF(r.status == 200 && !strcmp(r.body, "{\"tokens\":[23]}"), "%s", r.raw);
    resp_free(&r);
    r = http("GET", "/health", NULL, NULL);
    CHECK_EQ_INT(r.status, 200);
    resp_free(&r);
    /* the operator's page is open (it holds nothing; its fetches carry the key) */
    r = http("GET", "/", NULL, NULL);
    CHECK_EQ_INT(r.status, 200);
    resp_free(&r);
    /* a member's metrics through this node: behind the key */
    r = http("GET", "/v1/cluster/nodes/2/metrics", NULL, NULL);
    check_error_shape(&r, 401);
    resp_free(&r);
}

/* GET /: one self-contained page: HTML with its style and script inline, nothing fetched from
 * anywhere else (no URL with a scheme, the policy allows this node only), the build's page and
 * not the stand-in. Without --cluster a member's metrics are a 404 naming why. */
TEST(operators_page)
{
    struct resp r = http("GET", "/", NULL, NULL);
    CHECK_EQ_INT(r.status, 200);
    CHECK(r.raw && strstr(r.raw, "Content-Type: text/html; charset=utf-8\r\n"));
    CHECK(r.raw && strstr(r.raw, "Content-Security-Policy: default-src 'none'; "));
    CHECK(r.body && !strncmp(r.body, "<!doctype html>", 15));
    CHECK(r.body && strstr(r.body, "<style>") && strstr(r.body, "<script>"));
    CHECK(r.body && strstr(r.body, "function parseProm(") && strstr(r.body, ".kbar {"));
    CHECK(r.body && !strstr(r.body, "<!-- strata:"));
    CHECK(r.body && !strstr(r.body, "http://") && !strstr(r.body, "https://") &&
          !strstr(r.body, " src="));
    resp_free(&r);
    r = http("POST", "/", "{}", NULL);
    check_error_shape(&r, 405);
    resp_free(&r);
    r = http("GET", "/v1/cluster/nodes/2/metrics", NULL, NULL);
    check_error_shape(&r, 404);
    CHECK(r.body && strstr(r.body, "without --cluster"));
    resp_free(&r);
    r = http("GET", "/v1/cluster/nodes/2/metricsx", NULL, NULL);
    check_error_shape(&r, 404);
    resp_free(&r);
}

TEST(graceful_shutdown_finishes_streams)
{
    G.fm.sleep_us_per_token = 3000;
    int fd = dial();
    const char *body = "{\"prompt\":\"bye\",\"max_tokens\":40,\"ignore_eos\":true,\"stream\":true}";
    char head[256];
    int hn =
        snprintf(head, sizeof head,
                 "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test\r\n"
                 "Content-Length: %zu\r\n\r\n",
                 strlen(body));
    send_all(fd, head, (size_t)hn);
    send_all(fd, body, strlen(body));
    int idle = dial(); /* an idle keep-alive connection is closed at once */
    char first[64];
    CHECK(recv(fd, first, sizeof first, 0) > 0);
    http_server_shutdown(G.http, 5000);
    char *raw = read_all(fd, NULL);
    close(fd);
    CHECKF(strstr(raw, "data: [DONE]"), "stream cut: %.200s", raw);
    free(raw);
    char c;
    CHECK(recv(idle, &c, 1, 0) == 0);
    close(idle);
    pthread_join(G.th, NULL);
    G.joined = 1;
    G.fm.sleep_us_per_token = 0;
    CHECK(dial() < 0); /* no longer listening */
}

int main(void)
{
    if (start(NULL)) {
        printf("not ok - start: cannot start the server\n");
        return 1;
    }
    RUN(loading_then_ready);
    RUN(completion_plain_and_stream);
    RUN(chat_completion);
    RUN(concurrent_clients_get_their_output_alone);
    RUN(disconnect_cancels_and_frees_blocks);
    RUN(bad_input_gets_openai_errors);
    RUN(slow_client_times_out);
    RUN(too_many_connections_get_503);
    RUN(keep_alive_and_pipelining);
    RUN(pipelined_completions_answer_in_order);
    RUN(metrics_add_up);
    RUN(chunked_request_body);
    RUN(chunked_bad_bodies_get_errors);
    RUN(stalled_stream_reader_is_dropped);
    RUN(tokenize_and_detokenize);
    RUN(operators_page);
    RUN(api_key);
    RUN(graceful_shutdown_finishes_streams);
    stop();
    CHECK_DONE();
}
