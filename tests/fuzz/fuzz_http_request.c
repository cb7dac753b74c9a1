/* libFuzzer target: the HTTP request reader on arbitrary bytes.
 *
 * 1. http_parse_head's contract: it returns -1/0/1, a parsed head lies inside the input, an error
 *    comes with a 4xx/5xx status.
 * 2. http_parse_request (head + Content-Length or chunked body, decoded in place) fed the input
 *    whole and fed it in three pieces (cut points from the first two bytes) must agree: same
 *    result, same status, same body, same bytes left over for the next request. A body never
 *    exceeds max_body, and the buffer never grows past what was fed. */
#include "os/common/errmsg.h"
#include "serving/api/http.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_HEAD 2048
#define MAX_BODY 1024

struct result {
    int rc, status;
    char *body, *rest;
    size_t body_len, rest_len;
};

static void run(const char *in, size_t n, size_t c1, size_t c2, struct result *r)
{
    /* exactly n bytes, so ASan catches any access past what was received */
    char *buf = malloc(n ? n : 1);
    if (!buf) abort();
    struct http_parser p;
    http_parser_reset(&p);
    char err[ERRMSG_LEN];
    size_t len = 0, fed = 0;
    size_t cuts[3] = {c1, c2, n};
    r->rc = 0;
    for (int i = 0; i < 3 && r->rc == 0; i++) {
        if (cuts[i] < fed) continue;
        memcpy(buf + len, in + fed, cuts[i] - fed);
        len += cuts[i] - fed;
        fed = cuts[i];
        size_t before = len;
        r->rc = http_parse_request(&p, buf, &len, MAX_HEAD, MAX_BODY, &r->status, err);
        if (len > before) abort();
        if (r->rc < -1 || r->rc > 1) abort();
        if (r->rc == -1 && (r->status < 400 || r->status > 599)) abort();
    }
    r->body = r->rest = NULL;
    r->body_len = r->rest_len = 0;
    if (r->rc == 1) {
        if (p.body_len > MAX_BODY || p.consumed > len || p.body < buf ||
            p.body + p.body_len > buf + len || p.req.path[0] != '/')
            abort();
        r->body = malloc(p.body_len + 1);
        r->rest = malloc(len - p.consumed + n - fed + 1);
        if (!r->body || !r->rest) abort();
        memcpy(r->body, p.body, p.body_len);
        r->body_len = p.body_len;
        memcpy(r->rest, buf + p.consumed, len - p.consumed);
        memcpy(r->rest + len - p.consumed, in + fed, n - fed);
        r->rest_len = len - p.consumed + n - fed;
    }
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    struct http_request r;
    int status;
    char err[ERRMSG_LEN];
    int rc = http_parse_head(buf, size, 8192, &r, &status, err);
    if (rc == 1 && (r.head_len > size || r.path[0] != '/' || strlen(r.method) == 0)) abort();
    if (rc == -1 && (status < 400 || status > 599)) abort();
    if (rc != -1 && rc != 0 && rc != 1) abort();
    free(buf);

    if (size < 2) return 0;
    const char *in = (const char *)data + 2;
    size_t n = size - 2;
    size_t c1 = data[0] * n / 255, c2 = c1 + data[1] * (n - c1) / 255;
    struct result whole, split;
    run(in, n, n, n, &whole);
    run(in, n, c1, c2, &split);
    if (whole.rc != split.rc || whole.status != split.status || whole.body_len != split.body_len ||
        whole.rest_len != split.rest_len ||
        (whole.body_len && memcmp(whole.body, split.body, whole.body_len)) ||
        (whole.rest_len && memcmp(whole.rest, split.rest, whole.rest_len)))
        abort();
    free(whole.body);
    free(whole.rest);
    free(split.body);
    free(split.rest);
    return 0;
}
