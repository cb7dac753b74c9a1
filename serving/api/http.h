/* http: the HTTP/1.1 request-head parser of the API front (no sockets, no allocation).
 *
 * http_parse_head() looks at the bytes a connection has received so far. It returns 0 while the
 * head (request line + headers + blank line) is incomplete, 1 when it parsed a complete head
 * (req->head_len bytes), and -1 when the bytes can never become a valid request: *status is then
 * the HTTP status to answer (400, 414, 431, 501, 505) and err says why. It never reads past len.
 * Only what the API needs is kept: method, path (query string dropped), version, Content-Length,
 * chunked, keep-alive, Expect: 100-continue, the bearer token and whether X-Strata-Forwarded is
 * present (serving/api/relay.h). Requests with both
 * Content-Length and Transfer-Encoding, with conflicting Content-Lengths, with a transfer coding
 * other than a single "chunked" (501; twice: 400), or with Transfer-Encoding in HTTP/1.0 (400)
 * are rejected (request smuggling).
 *
 * http_chunked_decode() decodes a chunked request body (RFC 9112 7.1) in place as it arrives;
 * http_parse_request() is the whole incremental request reader the server runs (head, then a
 * Content-Length or chunked body), kept here so unit tests and the fuzz target run exactly it. */
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
    int forwarded; /* X-Strata-Forwarded: another node's front relayed it (never forwarded again);
                      the server clears it unless the connection came from a cluster member */
    unsigned long long forwarded_by; /* its value: the relaying node's id (0: not a number) */
    int route_local; /* X-Strata-Route: local: served by the node the client reached, never
                        relayed (an operator asking one replica); any other value is a 400 */
    /* X-Strata-Signature: an operator's request signed with the cluster key
     * (cluster/signed_request.h), checked by the route it is for; "" when absent */
    char signature[HTTP_MAX_TOKEN];
    int signature_truncated;
    size_t head_len;
};

int http_parse_head(const char *buf, size_t len, size_t max_head, struct http_request *req,
                    int *status, char *err);

/* Chunked body decoder state (zero it, or http_chunked_init, before the first call). */
struct http_chunked {
    int state;               /* internal */
    unsigned long long left; /* data bytes left in the current chunk */
    size_t in;               /* encoded bytes of the body consumed so far */
    size_t out;              /* decoded bytes so far: body[0..out) */
    size_t trailers;         /* bytes of the trailer section so far */
};

#define HTTP_CHUNK_LINE_MAX 1024 /* a chunk-size line (with extensions) or a trailer line */
#define HTTP_TRAILERS_MAX   8192

void http_chunked_init(struct http_chunked *d);

/* body holds the *len bytes received after the head. Decodes from body + d->in on, writing the
 * data at body + d->out (decoded data is never longer than its encoding, so it never overtakes
 * the input). Returns
 *   1: the last chunk and the trailers are complete; the body is body[0..d->out) and the bytes
 *      after it (a pipelined request) start at body + d->in;
 *   0: more bytes are needed; the undecoded rest has been moved down to body + d->out and *len
 *      shrunk accordingly (so the buffer holds the decoded body plus at most one incomplete
 *      line, and the caller appends new bytes at body + *len);
 *  -1: *status is 400 (bad hex, a missing CRLF, a chunk-size line over HTTP_CHUNK_LINE_MAX, a
 *      control character in an extension or trailer), 413 (the decoded body would exceed
 *      max_body: refused from the chunk size, before its data is read) or 431 (trailers over
 *      HTTP_TRAILERS_MAX); err says why.
 * Chunk extensions and trailer fields are checked for syntax and ignored. */
int http_chunked_decode(struct http_chunked *d, char *body, size_t *len, size_t max_body,
                        int *status, char *err);

/* The incremental request reader of a connection. */
struct http_parser {
    struct http_request req;
    int have_head;          /* req is valid */
    struct http_chunked ch; /* when req.chunked */
    /* when http_parse_request returned 1: */
    const char *body;
    size_t body_len;
    size_t consumed; /* bytes of the buffer this request took (head + encoded body) */
};

void http_parser_reset(struct http_parser *p);

/* buf holds the *len bytes a connection has received since the start of this request (new bytes
 * are appended at buf + *len). Returns 1 with p->body/p->body_len/p->consumed when a whole
 * request is there, 0 when more bytes are needed (a chunked body may be compacted in place: *len
 * can shrink; p->have_head tells whether the head is in), -1 with *status on an error: those of
 * http_parse_head and http_chunked_decode, and 413 for a Content-Length over max_body (before
 * the body is read). A request without Content-Length or chunked has an empty body. */
int http_parse_request(struct http_parser *p, char *buf, size_t *len, size_t max_head,
                       size_t max_body, int *status, char *err);

/* "OK", "Bad Request", ... ("Unknown" for others). */
const char *http_status_text(int status);

#endif
