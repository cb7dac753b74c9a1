/* http_fetch: download one file over plain HTTP/1.0 from a peer (`strata update URL`). No TLS,
 * no redirects, no chunked encoding: peers in the cluster serve files as they are (any static
 * HTTP server does). The response head is external input: http_head_parse is fuzzed
 * (tests/fuzz/fuzz_http_head.c).
 *   http_url_parse("http://10.0.0.2:8000/strata.efi", ...)  host "10.0.0.2", port "8000", path
 *   http_head_parse(buf, n, ...)   status, Content-Length (-1 when absent), bytes of the head
 *   http_fetch(url, dest, ...)     the body into the file dest; an error names the URL and why */
#ifndef STRATA_HTTP_FETCH_H
#define STRATA_HTTP_FETCH_H

#include <stddef.h>

struct http_url {
    char host[256];
    char port[8];
    char path[1024];
};

int http_url_parse(const char *url, struct http_url *u, char *err);

/* 0 with *status, *content_length (-1 when absent) and *head_len (through the blank line) when
 * buf[0..n) holds a complete head; 1 when it needs more bytes; -1 with err when malformed. */
int http_head_parse(const char *buf, size_t n, int *status, long long *content_length,
                    size_t *head_len, char *err);

/* Writes the body to dest (created or truncated); *bytes gets its size. */
int http_fetch(const char *url, const char *dest, long long *bytes, char *err);

/* One request (HTTP/1.0, the answer read to its end): method, url, extra header lines ("Name:
 * value\r\n" each, or NULL), a JSON body of len bytes. 0 with *status and the answer's body
 * (malloc'd, NUL-terminated) in *resp, *resp_len; -1 with err (no answer: connect, send, a
 * malformed head, over 64 KiB). */
int http_exchange(const char *method, const char *url, const char *extra, const void *body,
                  size_t len, int *status, char **resp, size_t *resp_len, char *err);

#endif
