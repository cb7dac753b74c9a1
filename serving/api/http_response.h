/* http_response: the incremental reader of an HTTP/1.1 response (no sockets, no allocation).
 *
 * The relay (serving/api/relay.h) reads another node's answer with it: the status line and the
 * headers it passes on (Content-Type, Retry-After, WWW-Authenticate) and whether the connection
 * stays open (Connection: close / keep-alive, the version's default), then the body framed by
 * Content-Length, chunked, or the end of the connection (decoded in place with
 * http_chunked_decode, so a streamed answer comes out chunk by chunk as it arrives). Interim
 * 1xx responses are skipped. A response with both Content-Length and Transfer-Encoding, a
 * transfer coding other than chunked, or conflicting lengths is refused: the relay never guesses
 * where an answer ends.
 *
 * Use: zero the reader (http_response_init), append received bytes at buf + *len, call
 * http_response_feed; it returns -1 (malformed: err says why), 0 (more bytes needed) or 1 (the
 * response is complete). After each call buf[0..*ready) are body bytes to take; the caller takes
 * them, then calls http_response_took(), which drops them from buf (the head is dropped by feed
 * itself once parsed). At the end of the connection, http_response_eof() says whether the body
 * was complete (1: it ends with the connection) or cut short (-1). */
#ifndef STRATA_HTTP_RESPONSE_H
#define STRATA_HTTP_RESPONSE_H

#include "serving/api/http.h"

#include <stddef.h>

#define HTTP_RESPONSE_MAX_HEAD 16384

struct http_response {
    /* the head, valid once have_head */
    int have_head;
    int status;
    long long content_length; /* -1 when absent */
    int chunked;              /* Transfer-Encoding: chunked */
    int until_close;          /* neither: the body ends with the connection */
    int keep_alive;           /* the connection may carry another request (version, Connection) */
    char content_type[128];
    char retry_after[32];
    char www_authenticate[128];
    /* body progress */
    long long left; /* Content-Length bytes not yet received */
    struct http_chunked ch;
    size_t taken; /* chunked: decoded bytes the caller took already (the size limit counts them) */
    int done;
};

void http_response_init(struct http_response *r);

int http_response_feed(struct http_response *r, char *buf, size_t *len, size_t *ready, char *err);
/* The caller took buf[0..ready): drop them (ready as the last feed returned it). */
void http_response_took(struct http_response *r, char *buf, size_t *len, size_t ready);
/* The peer closed the connection. */
int http_response_eof(const struct http_response *r, char *err);

#endif
