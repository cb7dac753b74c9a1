#include "serving/api/http.h"

#include "os/errmsg.h"

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

int http_parse_head(const char *buf, size_t len, size_t max_head, struct http_request *req,
                    int *status, char *err)
{
    memset(req, 0, sizeof *req);
    req->content_length = -1;
    *status = 0;
    /* Find the blank line that ends the head. Leading CRLFs before a request are allowed. */
    size_t start = 0;
    while (start + 1 < len && buf[start] == '\r' && buf[start + 1] == '\n') start += 2;
    size_t end = 0;
    int found = 0;
    for (size_t i = start; i + 3 < len; i++) {
        if (buf[i] == '\r' && buf[i + 1] == '\n' && buf[i + 2] == '\r' && buf[i + 3] == '\n') {
            end = i;
            found = 1;
            break;
        }
    }
    if (!found) {
        if (len > max_head) return fail(status, 431, err, "request head too large");
        return 0;
    }
    if (end + 4 > max_head) return fail(status, 431, err, "request head too large");
    req->head_len = end + 4;

    const char *p = buf + start;
    const char *stop = buf + end + 2; /* include the CRLF of the last header line */
    const char *eol = memchr(p, '\r', (size_t)(stop - p));
    if (!eol || eol + 1 >= stop + 0 || eol[1] != '\n')
        return fail(status, 400, err, "malformed request line");
    if (parse_request_line(p, (size_t)(eol - p), req, status, err)) return -1;
    p = eol + 2;

    int connection_close = 0, connection_keep = 0, n_headers = 0, have_te = 0;
    while (p < stop) {
        eol = memchr(p, '\r', (size_t)(stop - p));
        if (!eol || eol + 1 >= buf + len || eol[1] != '\n')
            return fail(status, 400, err, "header line without CRLF");
        size_t ln = (size_t)(eol - p);
        if (++n_headers > HTTP_MAX_HEADERS) return fail(status, 431, err, "too many headers");
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
        if (name_is(p, nl, "content-length")) {
            if (vn == 0 || vn > 18) return fail(status, 400, err, "bad Content-Length");
            long long cl = 0;
            for (size_t k = 0; k < vn; k++) {
                if (v[k] < '0' || v[k] > '9') return fail(status, 400, err, "bad Content-Length");
                cl = cl * 10 + (v[k] - '0');
            }
            if (req->content_length >= 0 && req->content_length != cl)
                return fail(status, 400, err, "conflicting Content-Length headers");
            req->content_length = cl;
        } else if (name_is(p, nl, "transfer-encoding")) {
            have_te = 1;
            if (has_token(v, vn, "chunked")) req->chunked = 1;
        } else if (name_is(p, nl, "connection")) {
            if (has_token(v, vn, "close")) connection_close = 1;
            if (has_token(v, vn, "keep-alive")) connection_keep = 1;
        } else if (name_is(p, nl, "expect")) {
            if (vn == 12 && strncasecmp(v, "100-continue", 12) == 0)
                req->expect_continue = 1;
            else
                return fail(status, 417, err, "unsupported Expect");
        } else if (name_is(p, nl, "authorization")) {
            req->has_auth = 1;
            if (vn > 7 && strncasecmp(v, "Bearer ", 7) == 0) {
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
        }
        p = eol + 2;
    }
    if (have_te && req->content_length >= 0)
        return fail(status, 400, err, "both Transfer-Encoding and Content-Length");
    if (have_te && !req->chunked) return fail(status, 501, err, "unsupported Transfer-Encoding");
    if (req->minor == 1)
        req->keep_alive = !connection_close;
    else
        req->keep_alive = connection_keep && !connection_close;
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
    case 503:
        return "Service Unavailable";
    case 505:
        return "HTTP Version Not Supported";
    default:
        return "Unknown";
    }
}
