#include "serving/api/http.h"

#include "os/common/errmsg.h"

#include <string.h>
#include <strings.h>

static int fail(int *status, int code, char *err, const char *why)
{
    *status = code;
    return errmsg_set(err, "http: %s", why);
}

/* RFC 9110 tchar */
static int is_tchar(unsigned char c)
{
    if (c >= '0' && c <= '9') return 1;
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return 1;
    return c && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* Trim optional whitespace around a header value. */
static void trim(const char **v, size_t *n)
{
    while (*n && (**v == ' ' || **v == '\t')) (*v)++, (*n)--;
    while (*n && ((*v)[*n - 1] == ' ' || (*v)[*n - 1] == '\t')) (*n)--;
}

static int name_is(const char *name, size_t n, const char *want)
{
    return strlen(want) == n && strncasecmp(name, want, n) == 0;
}

/* Does a comma-separated header value contain `tok` (case-insensitive)? */
static int has_token(const char *v, size_t n, const char *tok)
{
    size_t tl = strlen(tok);
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && v[j] != ',') j++;
        const char *p = v + i;
        size_t m = j - i;
        trim(&p, &m);
        if (m == tl && strncasecmp(p, tok, tl) == 0) return 1;
        i = j + 1;
    }
    return 0;
}

static int parse_request_line(const char *p, size_t n, struct http_request *req, int *status,
                              char *err)
{
    size_t i = 0, m = 0;
    while (i < n && p[i] != ' ') {
        if (!is_tchar((unsigned char)p[i])) return fail(status, 400, err, "bad method");
        if (m + 1 >= sizeof req->method) return fail(status, 501, err, "method too long");
        req->method[m++] = p[i++];
    }
    req->method[m] = 0;
    if (m == 0 || i >= n) return fail(status, 400, err, "malformed request line");
    i++;
    size_t t0 = i;
    while (i < n && p[i] != ' ') {
        unsigned char c = (unsigned char)p[i];
        if (c <= 0x20 || c >= 0x7f) return fail(status, 400, err, "bad character in target");
        i++;
    }
    size_t tl = i - t0;
    if (tl == 0 || i >= n) return fail(status, 400, err, "malformed request line");
    if (p[t0] != '/') return fail(status, 400, err, "target must be an absolute path");
    size_t pl = 0;
    while (pl < tl && p[t0 + pl] != '?' && p[t0 + pl] != '#') pl++;
    if (pl >= sizeof req->path) return fail(status, 414, err, "target too long");
    memcpy(req->path, p + t0, pl);
    req->path[pl] = 0;
    i++;
    if (n - i != 8 || memcmp(p + i, "HTTP/1.", 7) != 0) {
        if (n - i >= 5 && memcmp(p + i, "HTTP/", 5) == 0)
            return fail(status, 505, err, "only HTTP/1.0 and HTTP/1.1 are served");
        return fail(status, 400, err, "malformed HTTP version");
    }
    if (p[i + 7] != '0' && p[i + 7] != '1') return fail(status, 505, err, "unsupported HTTP/1.x");
    req->minor = p[i + 7] - '0';
    return 0;
}

/* What the header lines say beyond what goes into the request itself. */
struct head_state {
    int connection_close, connection_keep, n_headers, have_te, te_other;
};

static int content_length(const char *v, size_t vn, struct http_request *req, int *status,
                          char *err)
{
    if (vn == 0 || vn > 18) return fail(status, 400, err, "bad Content-Length");
    long long cl = 0;
    for (size_t k = 0; k < vn; k++) {
        if (v[k] < '0' || v[k] > '9') return fail(status, 400, err, "bad Content-Length");
        cl = cl * 10 + (v[k] - '0');
    }
    if (req->content_length >= 0 && req->content_length != cl)
        return fail(status, 400, err, "conflicting Content-Length headers");
    req->content_length = cl;
    return 0;
}

/* Only "chunked", exactly once over all Transfer-Encoding lines: another coding (gzip, chunked)
 * is not served, and chunked twice is malformed. */
static int transfer_encoding(const char *v, size_t vn, struct http_request *req,
                             struct head_state *h, int *status, char *err)
{
    h->have_te = 1;
    size_t i = 0;
    do {
        size_t j = i;
        while (j < vn && v[j] != ',') j++;
        const char *t = v + i;
        size_t tn = j - i;
        trim(&t, &tn);
        if (tn == 7 && strncasecmp(t, "chunked", 7) == 0) {
            if (req->chunked++) return fail(status, 400, err, "chunked applied twice");
        } else if (tn) {
            h->te_other = 1;
        }
        i = j + 1;
    } while (i < vn);
    return 0;
}

static void authorization(const char *v, size_t vn, struct http_request *req)
{
    req->has_auth = 1;
    if (vn <= 7 || strncasecmp(v, "Bearer ", 7) != 0) return;
    const char *t = v + 7;
    size_t tn = vn - 7;
    trim(&t, &tn);
    if (tn >= sizeof req->bearer) {
        req->bearer_truncated = 1;
        tn = sizeof req->bearer - 1;
    }
    memcpy(req->bearer, t, tn);
    req->bearer[tn] = 0;
}

/* One header line p[0..ln) (no CRLF): syntax, then the headers the server acts on. */
static int header_line(const char *p, size_t ln, struct http_request *req, struct head_state *h,
                       int *status, char *err)
{
    if (++h->n_headers > HTTP_MAX_HEADERS) return fail(status, 431, err, "too many headers");
    if (ln == 0) return fail(status, 400, err, "empty header line");
    if (p[0] == ' ' || p[0] == '\t') return fail(status, 400, err, "folded header line");
    const char *colon = memchr(p, ':', ln);
    if (!colon || colon == p) return fail(status, 400, err, "header without name");
    size_t nl = (size_t)(colon - p);
    for (size_t k = 0; k < nl; k++)
        if (!is_tchar((unsigned char)p[k])) return fail(status, 400, err, "bad header name");
    const char *v = colon + 1;
    size_t vn = ln - nl - 1;
    trim(&v, &vn);
    for (size_t k = 0; k < vn; k++) {
        unsigned char c = (unsigned char)v[k];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return fail(status, 400, err, "control character in header value");
    }
    if (name_is(p, nl, "content-length")) return content_length(v, vn, req, status, err);
    if (name_is(p, nl, "transfer-encoding")) return transfer_encoding(v, vn, req, h, status, err);
    if (name_is(p, nl, "connection")) {
        if (has_token(v, vn, "close")) h->connection_close = 1;
        if (has_token(v, vn, "keep-alive")) h->connection_keep = 1;
    } else if (name_is(p, nl, "expect")) {
        if (vn != 12 || strncasecmp(v, "100-continue", 12) != 0)
            return fail(status, 417, err, "unsupported Expect");
        req->expect_continue = 1;
    } else if (name_is(p, nl, "authorization")) {
        authorization(v, vn, req);
    } else if (name_is(p, nl, "x-strata-forwarded")) {
        req->forwarded = 1;
        unsigned long long id = 0;
        for (size_t k = 0; k < vn && id != ~0ull; k++)
            id = v[k] >= '0' && v[k] <= '9' && id <= (~0ull - 9) / 10
                     ? id * 10 + (unsigned)(v[k] - '0')
                     : ~0ull;
        req->forwarded_by = vn && id != ~0ull ? id : 0;
    } else if (name_is(p, nl, "x-strata-route")) {
        if (vn != 5 || strncasecmp(v, "local", 5) != 0)
            return fail(status, 400, err, "X-Strata-Route: only 'local' is understood");
        req->route_local = 1;
    } else if (name_is(p, nl, "x-strata-signature")) {
        size_t n = vn < sizeof req->signature ? vn : sizeof req->signature - 1;
        req->signature_truncated = vn >= sizeof req->signature;
        memcpy(req->signature, v, n);
        req->signature[n] = 0;
    }
    return 0;
}

/* After the last header: the framing rules of RFC 9112 and keep-alive. */
static int finish_head(struct http_request *req, const struct head_state *h, int *status, char *err)
{
    if (h->have_te && req->content_length >= 0)
        return fail(status, 400, err, "both Transfer-Encoding and Content-Length");
    if (h->te_other) return fail(status, 501, err, "unsupported Transfer-Encoding");
    if (h->have_te && !req->chunked) return fail(status, 400, err, "empty Transfer-Encoding");
    if (h->have_te && req->minor == 0)
        return fail(status, 400, err, "Transfer-Encoding in an HTTP/1.0 request");
    if (req->minor == 1)
        req->keep_alive = !h->connection_close;
    else
        req->keep_alive = h->connection_keep && !h->connection_close;
    return 1;
}

int http_parse_head(const char *buf, size_t len, size_t max_head, struct http_request *req,
                    int *status, char *err)
{
    memset(req, 0, sizeof *req);
    req->content_length = -1;
    *status = 0;
    /* Find the blank line that ends the head. Leading CRLFs before a request are allowed. */
    size_t start = 0;
    while (start + 1 < len && buf[start] == '\r' && buf[start + 1] == '\n') start += 2;
    const char *blank = NULL;
    for (size_t i = start; i + 3 < len && !blank; i++)
        if (!memcmp(buf + i, "\r\n\r\n", 4)) blank = buf + i;
    if (!blank) return len > max_head ? fail(status, 431, err, "request head too large") : 0;
    size_t end = (size_t)(blank - buf);
    if (end + 4 > max_head) return fail(status, 431, err, "request head too large");
    req->head_len = end + 4;

    const char *p = buf + start;
    const char *stop = buf + end + 2; /* include the CRLF of the last header line */
    const char *eol = memchr(p, '\r', (size_t)(stop - p));
    if (!eol || eol + 1 >= stop || eol[1] != '\n')
        return fail(status, 400, err, "malformed request line");
    if (parse_request_line(p, (size_t)(eol - p), req, status, err)) return -1;
    struct head_state h = {0};
    for (p = eol + 2; p < stop; p = eol + 2) {
        eol = memchr(p, '\r', (size_t)(stop - p));
        if (!eol || eol + 1 >= buf + len || eol[1] != '\n')
            return fail(status, 400, err, "header line without CRLF");
        if (header_line(p, (size_t)(eol - p), req, &h, status, err)) return -1;
    }
    return finish_head(req, &h, status, err);
}

/* ---------------------------------------------------------------- chunked bodies */

enum { CH_SIZE, CH_DATA, CH_DATA_CRLF, CH_TRAILER, CH_DONE };

void http_chunked_init(struct http_chunked *d)
{
    memset(d, 0, sizeof *d);
}

static int hexval(unsigned char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') return (c | 0x20) - 'a' + 10;
    return -1;
}

/* A complete line (ending in CRLF) at p[0..avail)? Returns its length without the CRLF, -2 when
 * more bytes are needed, -1 (with *status) when it can never be a line. Only the first
 * HTTP_CHUNK_LINE_MAX + 2 bytes are looked at, so the result does not depend on how the bytes
 * arrived. */
static long take_line(const char *p, size_t avail, int *status, char *err)
{
    size_t win = avail < HTTP_CHUNK_LINE_MAX + 2 ? avail : HTTP_CHUNK_LINE_MAX + 2;
    const char *nl = memchr(p, '\n', win);
    if (!nl) {
        if (win == HTTP_CHUNK_LINE_MAX + 2) return fail(status, 400, err, "chunk line too long");
        return -2;
    }
    size_t n = (size_t)(nl - p);
    if (n == 0 || p[n - 1] != '\r') return fail(status, 400, err, "chunk line without CRLF");
    for (size_t i = 0; i + 1 < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return fail(status, 400, err, "control character in a chunk line");
    }
    return (long)(n - 1);
}

/* chunk-size [ BWS ; chunk-ext ]: the extension's content is ignored. */
static int parse_size_line(const char *p, size_t n, unsigned long long room,
                           unsigned long long *size, int *status, char *err)
{
    size_t i = 0;
    unsigned long long v = 0;
    for (; i < n && hexval((unsigned char)p[i]) >= 0; i++) {
        /* checked at every digit, so v never overflows */
        v = v * 16 + (unsigned)hexval((unsigned char)p[i]);
        if (v > room || v > (~0ULL >> 8))
            return fail(status, 413, err, "chunked request body over the size limit");
    }
    if (i == 0) return fail(status, 400, err, "bad chunk size");
    while (i < n && (p[i] == ' ' || p[i] == '\t')) i++;
    if (i < n && p[i] != ';') return fail(status, 400, err, "bad chunk size");
    *size = v;
    return 0;
}

int http_chunked_decode(struct http_chunked *d, char *body, size_t *len, size_t max_body,
                        int *status, char *err)
{
    *status = 0;
    while (d->state != CH_DONE) {
        size_t avail = *len - d->in;
        const char *p = body + d->in;
        if (d->state == CH_DATA) {
            if (!avail) break;
            size_t k = d->left < avail ? (size_t)d->left : avail;
            memmove(body + d->out, p, k);
            d->out += k;
            d->in += k;
            d->left -= k;
            if (!d->left) d->state = CH_DATA_CRLF;
            continue;
        }
        if (d->state == CH_DATA_CRLF) {
            if (!avail) break;
            if (p[0] != '\r' || (avail >= 2 && p[1] != '\n'))
                return fail(status, 400, err, "chunk data not followed by CRLF");
            if (avail < 2) break;
            d->in += 2;
            d->state = CH_SIZE;
            continue;
        }
        long n = take_line(p, avail, status, err);
        if (n == -2) break;
        if (n < 0) return -1;
        if (d->state == CH_SIZE) {
            unsigned long long size = 0;
            if (parse_size_line(p, (size_t)n, max_body - d->out, &size, status, err)) return -1;
            d->in += (size_t)n + 2;
            d->left = size;
            d->state = size ? CH_DATA : CH_TRAILER;
            continue;
        }
        /* CH_TRAILER: field lines until an empty line */
        d->in += (size_t)n + 2;
        if (n == 0) {
            d->state = CH_DONE;
            break;
        }
        d->trailers += (size_t)n + 2;
        if (d->trailers > HTTP_TRAILERS_MAX) return fail(status, 431, err, "trailers too large");
        const char *colon = memchr(p, ':', (size_t)n);
        if (!colon || colon == p) return fail(status, 400, err, "bad trailer field");
        for (const char *q = p; q < colon; q++)
            if (!is_tchar((unsigned char)*q)) return fail(status, 400, err, "bad trailer field");
    }
    if (d->state == CH_DONE) return 1;
    /* Keep only what is decoded plus the incomplete rest. */
    if (d->in > d->out) {
        memmove(body + d->out, body + d->in, *len - d->in);
        *len -= d->in - d->out;
        d->in = d->out;
    }
    return 0;
}

/* ---------------------------------------------------------------- whole requests */

void http_parser_reset(struct http_parser *p)
{
    memset(p, 0, sizeof *p);
}

int http_parse_request(struct http_parser *p, char *buf, size_t *len, size_t max_head,
                       size_t max_body, int *status, char *err)
{
    *status = 0;
    if (!p->have_head) {
        int rc = http_parse_head(buf, *len, max_head, &p->req, status, err);
        if (rc <= 0) return rc;
        p->have_head = 1;
        http_chunked_init(&p->ch);
        if (!p->req.chunked) {
            if (p->req.content_length < 0) p->req.content_length = 0;
            if ((unsigned long long)p->req.content_length > max_body) {
                *status = 413;
                return errmsg_set(err,
                                  "http: request body of %lld bytes exceeds the limit of %zu "
                                  "bytes",
                                  p->req.content_length, max_body);
            }
        }
    }
    size_t head = p->req.head_len;
    if (p->req.chunked) {
        size_t blen = *len - head;
        int rc = http_chunked_decode(&p->ch, buf + head, &blen, max_body, status, err);
        *len = head + blen;
        if (rc <= 0) return rc;
        p->body = buf + head;
        p->body_len = p->ch.out;
        p->consumed = head + p->ch.in;
        return 1;
    }
    size_t total = head + (size_t)p->req.content_length;
    if (*len < total) return 0;
    p->body = buf + head;
    p->body_len = (size_t)p->req.content_length;
    p->consumed = total;
    return 1;
}

const char *http_status_text(int s)
{
    switch (s) {
    case 100:
        return "Continue";
    case 200:
        return "OK";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 411:
        return "Length Required";
    case 413:
        return "Payload Too Large";
    case 414:
        return "URI Too Long";
    case 415:
        return "Unsupported Media Type";
    case 417:
        return "Expectation Failed";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    case 505:
        return "HTTP Version Not Supported";
    default:
        return "Unknown";
    }
}
