/* The incremental request reader (http_parse_request) with chunked bodies: every way the bytes
 * can arrive gives the same request, the same body and the same pipelined rest; every malformed
 * or oversized body gets its status whichever way it arrives; a truncated body is never taken
 * for a whole one; the buffer stays bounded by the decoded body. The reader is fed exactly as the
 * server feeds it: new bytes are appended after the (possibly compacted) buffer. */
#include "check.h"
#include "os/common/errmsg.h"
#include "serving/api/http.h"

#define MAX_HEAD 8192
#define MAX_BODY 4096

struct feed {
    int rc, status;
    char body[MAX_BODY + 1];
    size_t body_len;
    char rest[1 << 15]; /* bytes after the request: the buffer's leftover + unfed input */
    size_t rest_len;
    size_t max_buffered; /* the largest the buffer got */
    char method[16], path[HTTP_MAX_PATH];
};

/* Feed in[0..n) in pieces ending at the cut points cuts[0..ncut) (increasing), then the rest. */
static void feed(const char *in, size_t n, const size_t *cuts, int ncut, struct feed *f)
{
    static char buf[1 << 15];
    struct http_parser p;
    http_parser_reset(&p);
    memset(f, 0, sizeof *f);
    size_t len = 0, fed = 0;
    char err[ERRMSG_LEN];
    for (int i = 0; i <= ncut; i++) {
        size_t upto = i < ncut ? cuts[i] : n;
        if (upto < fed) continue;
        memcpy(buf + len, in + fed, upto - fed);
        len += upto - fed;
        fed = upto;
        if (len > f->max_buffered) f->max_buffered = len;
        f->rc = http_parse_request(&p, buf, &len, MAX_HEAD, MAX_BODY, &f->status, err);
        if (f->rc != 0) break;
    }
    if (f->rc == 1) {
        memcpy(f->body, p.body, p.body_len);
        f->body_len = p.body_len;
        memcpy(f->rest, buf + p.consumed, len - p.consumed);
        memcpy(f->rest + (len - p.consumed), in + fed, n - fed);
        f->rest_len = len - p.consumed + n - fed;
        snprintf(f->method, sizeof f->method, "%s", p.req.method);
        snprintf(f->path, sizeof f->path, "%s", p.req.path);
    }
}

static int same(const struct feed *a, const struct feed *b)
{
    return a->rc == b->rc && a->status == b->status && a->body_len == b->body_len &&
           !memcmp(a->body, b->body, a->body_len) && a->rest_len == b->rest_len &&
           !memcmp(a->rest, b->rest, a->rest_len);
}

/* A chunked request with an extension, upper-case hex, a zero-padded size, a trailer, then a
 * pipelined request. */
static const char REQ[] = "POST /v1/completions HTTP/1.1\r\n"
                          "Host: x\r\n"
                          "Transfer-Encoding: chunked\r\n"
                          "\r\n"
                          "7\r\n{\"promp\r\n"
                          "A;name=\"v a\"\r\nt\":\"hello \r\n"
                          "0001 \r\nw\r\n"
                          "18\r\norld\",\"max_tokens\":4}\n\r\n\r\n"
                          "0\r\n"
                          "X-Trailer: yes\r\n"
                          "\r\n"
                          "GET /health HTTP/1.1\r\n\r\n";
static const char BODY[] = "{\"prompt\":\"hello world\",\"max_tokens\":4}\n\r\n";
static const char REST[] = "GET /health HTTP/1.1\r\n\r\n";

TEST(whole_request)
{
    struct feed f;
    feed(REQ, strlen(REQ), NULL, 0, &f);
    CHECKF(f.rc == 1, "rc %d status %d", f.rc, f.status);
    CHECK_STR(f.method, "POST");
    CHECK_STR(f.path, "/v1/completions");
    CHECK_EQ_INT(f.body_len, strlen(BODY));
    CHECK(!memcmp(f.body, BODY, f.body_len));
    CHECK_EQ_INT(f.rest_len, strlen(REST));
    CHECK(!memcmp(f.rest, REST, f.rest_len));
}

TEST(every_split_point_parses_the_same)
{
    size_t n = strlen(REQ);
    struct feed whole, f;
    feed(REQ, n, NULL, 0, &whole);
    CHECK(whole.rc == 1);
    for (size_t i = 0; i <= n; i++) {
        feed(REQ, n, &i, 1, &f);
        CHECKF(same(&f, &whole), "split at %zu: rc %d status %d", i, f.rc, f.status);
        for (size_t j = i; j <= n; j += 3) {
            size_t cuts[2] = {i, j};
            feed(REQ, n, cuts, 2, &f);
            CHECKF(same(&f, &whole), "splits at %zu,%zu: rc %d", i, j, f.rc);
        }
    }
    /* one byte at a time */
    size_t cuts[sizeof REQ];
    for (size_t i = 0; i < n; i++) cuts[i] = i + 1;
    feed(REQ, n, cuts, (int)n, &f);
    CHECK(same(&f, &whole));
}

TEST(truncated_body_is_never_complete)
{
    /* every proper prefix that ends before the final CRLF: more bytes needed, no error */
    size_t n = strlen(REQ) - strlen(REST);
    char err[ERRMSG_LEN];
    static char buf[sizeof REQ];
    for (size_t k = 0; k < n; k++) {
        struct http_parser p;
        http_parser_reset(&p);
        memcpy(buf, REQ, k);
        size_t len = k;
        int st;
        CHECKF(http_parse_request(&p, buf, &len, MAX_HEAD, MAX_BODY, &st, err) == 0,
               "prefix of %zu bytes: %s", k, err);
    }
}

/* Every split point of a bad request gives the same error status. */
static void check_bad(const char *chunks, int want)
{
    char in[16384];
    int hn =
        snprintf(in, sizeof in,
                 "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n%s", chunks);
    size_t n = (size_t)hn;
    struct feed f;
    feed(in, n, NULL, 0, &f);
    CHECKF(f.rc == -1 && f.status == want, "'%.60s': rc %d status %d, want %d", chunks, f.rc,
           f.status, want);
    for (size_t i = 0; i <= n; i++) {
        feed(in, n, &i, 1, &f);
        CHECKF(f.rc == -1 && f.status == want, "'%.60s' split at %zu: rc %d status %d", chunks, i,
               f.rc, f.status);
    }
}

TEST(malformed_chunks_get_400)
{
    check_bad("zz\r\nab\r\n0\r\n\r\n", 400);               /* not hex */
    check_bad("\r\nab\r\n0\r\n\r\n", 400);                 /* empty size */
    check_bad("-1\r\nab\r\n0\r\n\r\n", 400);               /* sign */
    check_bad("0x2\r\nab\r\n0\r\n\r\n", 400);              /* C prefix */
    check_bad("2 3\r\nab\r\n0\r\n\r\n", 400);              /* junk after the size */
    check_bad("2\nab\r\n0\r\n\r\n", 400);                  /* LF without CR */
    check_bad("2\r\nabc\r\n0\r\n\r\n", 400);               /* data longer than its size */
    check_bad("2\r\nab0\r\n\r\n", 400);                    /* no CRLF after the data */
    check_bad("2\r\nab\r0\r\n\r\n", 400);                  /* CR without LF */
    check_bad("2;a\x01\r\nab\r\n0\r\n\r\n", 400);          /* control character in an extension */
    check_bad("2\r\nab\r\n0\r\nno colon\r\n\r\n", 400);    /* bad trailer */
    check_bad("2\r\nab\r\n0\r\n: empty\r\n\r\n", 400);     /* trailer without a name */
    check_bad("2\r\nab\r\n0\r\nBad Name: x\r\n\r\n", 400); /* space in the trailer's name */
    char longext[2100] = "2;";
    memset(longext + 2, 'e', 2000);
    strcpy(longext + 2002, "\r\nab\r\n0\r\n\r\n");
    check_bad(longext, 400); /* a chunk line over HTTP_CHUNK_LINE_MAX */
}

TEST(oversized_bodies_get_413_from_the_chunk_size)
{
    check_bad("1001\r\n", 413);                                   /* MAX_BODY + 1 in one chunk */
    check_bad("ffffffffffffffffffffffffffffffff\r\n", 413);       /* overflows 64 bits */
    check_bad("00000000000000000000000000000000001001\r\n", 413); /* zero-padded */
    /* the sum of chunks: 4096 bytes fit exactly, one more does not */
    static char many[40000];
    size_t n = 0;
    for (int i = 0; i < 4096 / 64; i++) {
        n += (size_t)sprintf(many + n, "40\r\n");
        memset(many + n, 'x', 64);
        n += 64;
        n += (size_t)sprintf(many + n, "\r\n");
    }
    strcpy(many + n, "1\r\nx\r\n0\r\n\r\n");
    check_bad(many, 413);
    strcpy(many + n, "0\r\n\r\n");
    char in[45000];
    int hn =
        snprintf(in, sizeof in, "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n%s", many);
    struct feed f;
    feed(in, (size_t)hn, NULL, 0, &f);
    CHECKF(f.rc == 1 && f.body_len == 4096, "rc %d status %d len %zu", f.rc, f.status, f.body_len);
    /* Content-Length over the limit: 413 before the body is read */
    const char *cl = "POST / HTTP/1.1\r\nContent-Length: 4097\r\n\r\n";
    feed(cl, strlen(cl), NULL, 0, &f);
    CHECK(f.rc == -1 && f.status == 413);
}

TEST(trailers_over_the_limit_get_431)
{
    static char t[20000];
    size_t n = (size_t)sprintf(t, "1\r\nx\r\n0\r\n");
    for (int i = 0; i < 200; i++) n += (size_t)sprintf(t + n, "X-T%d: %060d\r\n", i, i);
    strcpy(t + n, "\r\n");
    check_bad(t, 431);
}

TEST(buffer_stays_bounded_by_the_decoded_body)
{
    /* 4096 one-byte chunks: 6 encoded bytes per decoded byte; fed 100 bytes at a time, the buffer
     * never holds more than the head, the decoded body and one piece */
    static char in[40000];
    int n = sprintf(in, "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
    size_t head = (size_t)n;
    for (int i = 0; i < 4096; i++) n += sprintf(in + n, "1\r\n%c\r\n", 'a' + i % 26);
    n += sprintf(in + n, "0\r\n\r\n");
    static size_t cuts[1000];
    int nc = 0;
    for (int k = 100; k < n && nc < 1000; k += 100) cuts[nc++] = (size_t)k;
    struct feed f;
    feed(in, (size_t)n, cuts, nc, &f);
    CHECKF(f.rc == 1 && f.body_len == 4096, "rc %d status %d", f.rc, f.status);
    for (int i = 0; i < 4096; i++) CHECK(f.body[i] == 'a' + i % 26);
    CHECKF(f.max_buffered <= head + 4096 + 100, "buffer reached %zu bytes", f.max_buffered);
}

TEST(transfer_encoding_heads)
{
    struct feed f;
    const struct {
        const char *in;
        int rc, status;
    } cases[] = {
        {"POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n0\r\n\r\n", 1, 0},
        {"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", -1, 501},
        {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", -1, 400},
        {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", -1,
         400},
        {"POST / HTTP/1.1\r\nTransfer-Encoding: \r\n\r\n", -1, 400},
        {"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", -1, 400},
        {"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", -1, 400},
        /* no body framing at all: an empty body */
        {"POST / HTTP/1.1\r\n\r\n", 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        feed(cases[i].in, strlen(cases[i].in), NULL, 0, &f);
        CHECKF(f.rc == cases[i].rc && f.status == cases[i].status, "case %zu: rc %d status %d", i,
               f.rc, f.status);
    }
}

int main(void)
{
    RUN(whole_request);
    RUN(every_split_point_parses_the_same);
    RUN(truncated_body_is_never_complete);
    RUN(malformed_chunks_get_400);
    RUN(oversized_bodies_get_413_from_the_chunk_size);
    RUN(trailers_over_the_limit_get_431);
    RUN(buffer_stays_bounded_by_the_decoded_body);
    RUN(transfer_encoding_heads);
    CHECK_DONE();
}
