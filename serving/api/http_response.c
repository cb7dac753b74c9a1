#include "serving/api/http_response.h"

#include "os/common/errmsg.h"

#include <string.h>
#include <strings.h>

/* Body sizes are bounded by the caller's buffers, not here: a relayed stream may be long. */
#define BODY_UNBOUNDED ((size_t)1 << 46)

void http_response_init(struct http_response *r)
{
    memset(r, 0, sizeof *r);
    r->content_length = -1;
    http_chunked_init(&r->ch);
}

static int is_tchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

static void trim(const char **v, size_t *n)
{
    while (*n && (**v == ' ' || **v == '\t')) (*v)++, (*n)--;
    while (*n && ((*v)[*n - 1] == ' ' || (*v)[*n - 1] == '\t')) (*n)--;
}

static int name_is(const char *p, size_t n, const char *name)
{
    return strlen(name) == n && !strncasecmp(p, name, n);
}

static void copy_value(char *out, size_t cap, const char *v, size_t n)
{
    if (n >= cap) n = cap - 1;
    memcpy(out, v, n);
    out[n] = 0;
}

/* "HTTP/1.x SSS reason" */
static int status_line(struct http_response *r, const char *p, size_t n, char *err)
{
    if (n < 12 || memcmp(p, "HTTP/1.", 7) || (p[7] != '0' && p[7] != '1') || p[8] != ' ')
        return errmsg_set(err, "http response: malformed status line");
    int s = 0;
    for (int i = 9; i < 12; i++) {
        if (p[i] < '0' || p[i] > '9') return errmsg_set(err, "http response: bad status code");
        s = s * 10 + (p[i] - '0');
    }
    if (s < 100 || (n > 12 && p[12] != ' '))
        return errmsg_set(err, "http response: bad status code");
    r->status = s;
    r->keep_alive = p[7] == '1'; /* the version's default, until a Connection header */
    return 0;
}

static int header_line(struct http_response *r, const char *p, size_t ln, int *have_te, char *err)
{
    const char *colon = memchr(p, ':', ln);
    if (!colon || colon == p) return errmsg_set(err, "http response: header without a name");
    size_t nl = (size_t)(colon - p);
    for (size_t k = 0; k < nl; k++)
        if (!is_tchar((unsigned char)p[k]))
            return errmsg_set(err, "http response: bad header name");
    const char *v = colon + 1;
    size_t vn = ln - nl - 1;
    trim(&v, &vn);
    for (size_t k = 0; k < vn; k++) {
        unsigned char c = (unsigned char)v[k];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return errmsg_set(err, "http response: control character in a header");
    }
    if (name_is(p, nl, "content-length")) {
        if (vn == 0 || vn > 18) return errmsg_set(err, "http response: bad Content-Length");
        long long cl = 0;
        for (size_t k = 0; k < vn; k++) {
            if (v[k] < '0' || v[k] > '9')
                return errmsg_set(err, "http response: bad Content-Length");
            cl = cl * 10 + (v[k] - '0');
        }
        if (r->content_length >= 0 && r->content_length != cl)
            return errmsg_set(err, "http response: conflicting Content-Lengths");
        r->content_length = cl;
    } else if (name_is(p, nl, "transfer-encoding")) {
        if (*have_te || vn != 7 || strncasecmp(v, "chunked", 7))
            return errmsg_set(err, "http response: a transfer coding other than chunked");
        *have_te = 1;
        r->chunked = 1;
    } else if (name_is(p, nl, "content-type")) {
        copy_value(r->content_type, sizeof r->content_type, v, vn);
    } else if (name_is(p, nl, "retry-after")) {
        copy_value(r->retry_after, sizeof r->retry_after, v, vn);
    } else if (name_is(p, nl, "www-authenticate")) {
        copy_value(r->www_authenticate, sizeof r->www_authenticate, v, vn);
    } else if (name_is(p, nl, "connection")) {
        if (vn == 5 && !strncasecmp(v, "close", 5)) r->keep_alive = 0;
        if (vn == 10 && !strncasecmp(v, "keep-alive", 10)) r->keep_alive = 1;
    }
    return 0;
}

/* 1: a head was parsed (its bytes dropped from buf), 0: incomplete, -1: malformed. */
static int parse_head(struct http_response *r, char *buf, size_t *len, char *err)
{
    size_t n = *len < HTTP_RESPONSE_MAX_HEAD ? *len : HTTP_RESPONSE_MAX_HEAD;
    const char *blank = NULL;
    for (size_t i = 0; i + 3 < n && !blank; i++)
        if (!memcmp(buf + i, "\r\n\r\n", 4)) blank = buf + i;
    if (!blank) {
        if (*len >= HTTP_RESPONSE_MAX_HEAD)
            return errmsg_set(err, "http response: head over %d bytes", HTTP_RESPONSE_MAX_HEAD);
        return 0;
    }
    size_t head_len = (size_t)(blank - buf) + 4;
    http_response_init(r);
    const char *stop = blank + 2, *p = buf;
    const char *eol = memchr(p, '\r', (size_t)(stop - p));
    if (!eol || eol[1] != '\n') return errmsg_set(err, "http response: malformed status line");
    if (status_line(r, p, (size_t)(eol - p), err)) return -1;
    int have_te = 0;
    for (p = eol + 2; p < stop; p = eol + 2) {
        eol = memchr(p, '\r', (size_t)(stop - p));
        if (!eol || eol[1] != '\n')
            return errmsg_set(err, "http response: header line without CRLF");
        if (header_line(r, p, (size_t)(eol - p), &have_te, err)) return -1;
    }
    if (r->chunked && r->content_length >= 0)
        return errmsg_set(err, "http response: both Transfer-Encoding and Content-Length");
    memmove(buf, buf + head_len, *len - head_len);
    *len -= head_len;
    if (r->status < 200) { /* interim: the real head follows */
        http_response_init(r);
        return 0;
    }
    r->have_head = 1;
    if (r->status == 204 || r->status == 304) {
        r->done = 1;
    } else if (r->content_length >= 0) {
        r->left = r->content_length;
        r->done = r->left == 0;
    } else if (!r->chunked) {
        r->until_close = 1;
    }
    return 1;
}

int http_response_feed(struct http_response *r, char *buf, size_t *len, size_t *ready, char *err)
{
    *ready = 0;
    while (!r->have_head) {
        size_t before = *len;
        int rc = parse_head(r, buf, len, err);
        if (rc < 0) return -1;
        if (rc == 0 && *len == before) return 0;
    }
    if (r->done) return 1;
    if (r->chunked) {
        int status;
        /* the limit is on the whole body, however much of it was taken between feeds */
        int rc = http_chunked_decode(&r->ch, buf, len, BODY_UNBOUNDED - r->taken, &status, err);
        if (rc < 0) return errmsg_prefix(err, "http response: ");
        *ready = r->ch.out;
        if (rc == 1) r->done = 1;
        return r->done;
    }
    if (r->until_close) {
        *ready = *len;
        return 0;
    }
    *ready = (long long)*len < r->left ? *len : (size_t)r->left;
    if ((long long)*ready == r->left) r->done = 1;
    return r->done;
}

void http_response_took(struct http_response *r, char *buf, size_t *len, size_t ready)
{
    if (!ready) return;
    memmove(buf, buf + ready, *len - ready);
    *len -= ready;
    if (r->chunked) {
        r->ch.in -= ready;
        r->ch.out -= ready;
        r->taken += ready;
    } else if (!r->until_close) {
        r->left -= (long long)ready;
    }
}

int http_response_eof(const struct http_response *r, char *err)
{
    if (!r->have_head) return errmsg_set(err, "the connection closed before the response head");
    if (r->done || r->until_close) return 1;
    return errmsg_set(err, "the connection closed in the middle of the response body");
}
