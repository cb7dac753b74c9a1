/* http: the HTTP/1.1 request-head parser of the API front (no sockets, no allocation).
 *
 * http_parse_head() looks at the bytes a connection has received so far. It returns 0 while the
 * head (request line + headers + blank line) is incomplete, 1 when it parsed a complete head
 * (req->head_len bytes), and -1 when the bytes can never become a valid request: *status is then
 * the HTTP status to answer (400, 414, 431, 501, 505) and err says why. It never reads past len.
 * Only what the API needs is kept: method, path (query string dropped), version, Content-Length,
 * chunked, keep-alive, Expect: 100-continue and the bearer token. Requests with both
 * Content-Length and Transfer-Encoding, or with conflicting Content-Lengths, are rejected
 * (request smuggling). */
#ifndef STRATA_HTTP_H
#define STRATA_HTTP_H

#include <stddef.h>

#define HTTP_MAX_HEADERS 64
#define HTTP_MAX_PATH    256
#define HTTP_MAX_TOKEN   256

struct http_request {
    char method[16];
    char path[HTTP_MAX_PATH];
    int minor;                   /* HTTP/1.<minor> */
    long long content_length;    /* -1 when absent */
    int chunked;                 /* Transfer-Encoding: chunked */
    int keep_alive;              /* after the defaults of the version and Connection: */
    int expect_continue;         /* Expect: 100-continue */
    int has_auth;                /* an Authorization: Bearer header was present */
    char bearer[HTTP_MAX_TOKEN]; /* its token (truncated tokens never match a key) */
    int bearer_truncated;
    size_t head_len;
};

int http_parse_head(const char *buf, size_t len, size_t max_head, struct http_request *req,
                    int *status, char *err);

/* "OK", "Bad Request", ... ("Unknown" for others). */
const char *http_status_text(int status);

#endif
