/* http_fetch: see http_fetch.h. */
#include "os/runtime/http_fetch.h"

#include "os/common/errmsg.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define HEAD_MAX  8192
#define TIMEOUT_S 30

int http_url_parse(const char *url, struct http_url *u, char *err)
{
    if (strncmp(url, "http://", 7)) return errmsg_set(err, "%s: want http://HOST[:PORT]/PATH", url);
    const char *h = url + 7, *end = h + strcspn(h, ":/");
    size_t hl = (size_t)(end - h);
    if (!hl || hl >= sizeof u->host) return errmsg_set(err, "%s: bad host", url);
    memcpy(u->host, h, hl);
    u->host[hl] = 0;
    snprintf(u->port, sizeof u->port, "80");
    if (*end == ':') {
        const char *p = end + 1;
        size_t pl = strspn(p, "0123456789");
        if (!pl || pl > 5 || atoi(p) < 1 || atoi(p) > 65535 || (p[pl] && p[pl] != '/'))
            return errmsg_set(err, "%s: bad port", url);
        memcpy(u->port, p, pl);
        u->port[pl] = 0;
        end = p + pl;
    }
    const char *path = *end ? end : "/";
    if (strlen(path) >= sizeof u->path) return errmsg_set(err, "%s: path too long", url);
    for (const char *c = path; *c; c++)
        if ((unsigned char)*c <= ' ' || *c == 0x7f)
            return errmsg_set(err, "%s: space or control byte in the path", url);
    snprintf(u->path, sizeof u->path, "%s", path);
    return 0;
}

int http_head_parse(const char *buf, size_t n, int *status, long long *content_length,
                    size_t *head_len, char *err)
{
    size_t end = 0;
    for (size_t i = 0; i + 3 < n; i++)
        if (!memcmp(buf + i, "\r\n\r\n", 4)) {
            end = i + 4;
            break;
        }
    if (!end) return n >= HEAD_MAX ? errmsg_set(err, "response head over %d bytes", HEAD_MAX) : 1;
    if (end < 12 || memcmp(buf, "HTTP/1.", 7) || buf[8] != ' ' || !isdigit((unsigned char)buf[9]) ||
        !isdigit((unsigned char)buf[10]) || !isdigit((unsigned char)buf[11]))
        return errmsg_set(err, "not an HTTP/1.x response");
    *status = (buf[9] - '0') * 100 + (buf[10] - '0') * 10 + (buf[11] - '0');
    *content_length = -1;
    /* Header lines, each "Name: value\r\n", after the status line. */
    size_t i = 0;
    while (i < end && buf[i] != '\n') i++;
    for (i++; i + 2 < end;) {
        size_t j = i;
        while (j < end && buf[j] != '\n') j++;
        static const char cl[] = "content-length:";
        if (j - i > sizeof cl - 1 && !strncasecmp(buf + i, cl, sizeof cl - 1)) {
            size_t k = i + sizeof cl - 1;
            while (k < j && buf[k] == ' ') k++;
            long long v = 0;
            int nd = 0;
            while (k < j && isdigit((unsigned char)buf[k]) && nd < 18)
                v = v * 10 + (buf[k++] - '0'), nd++;
            while (k < j && (buf[k] == ' ' || buf[k] == '\r')) k++;
            if (!nd || k != j) return errmsg_set(err, "malformed Content-Length");
            *content_length = v;
        }
        i = j + 1;
    }
    *head_len = end;
    return 0;
}

static int dial(const struct http_url *u, char *err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *ai;
    int r = getaddrinfo(u->host, u->port, &hints, &res);
    if (r) return errmsg_set(err, "%s:%s: %s", u->host, u->port, gai_strerror(r));
    int fd = -1, e = 0;
    for (ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        struct timeval tv = {TIMEOUT_S, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen)) {
            e = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) return errmsg_set(err, "%s:%s: connect: %s", u->host, u->port, strerror(e));
    return fd;
}

static int fetch(const char *url, const char *dest, long long *bytes, char *err)
{
    struct http_url u;
    if (http_url_parse(url, &u, err)) return -1;
    int fd = dial(&u, err);
    if (fd < 0) return -1;
    char req[1400];
    int rl = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: %s\r\nUser-Agent: strata\r\n\r\n",
                      u.path, u.host);
    if (write(fd, req, (size_t)rl) != rl) {
        close(fd);
        return errmsg_set(err, "send: %s", strerror(errno));
    }
    static char buf[HEAD_MAX + 65536];
    size_t n = 0, head = 0;
    int status = 0;
    long long len = -1;
    for (;;) {
        ssize_t r = read(fd, buf + n, HEAD_MAX - n);
        if (r <= 0) {
            close(fd);
            return errmsg_set(err, "%s", r ? strerror(errno) : "connection closed in the head");
        }
        n += (size_t)r;
        int p = http_head_parse(buf, n, &status, &len, &head, err);
        if (p < 0) {
            close(fd);
            return -1;
        }
        if (p == 0) break;
    }
    if (status != 200) {
        close(fd);
        return errmsg_set(err, "HTTP status %d", status);
    }
    int out = open(dest, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
        close(fd);
        return errmsg_set(err, "%s: %s", dest, strerror(errno));
    }
    long long got = 0;
    int rc = 0;
    size_t have = n - head;
    const char *p = buf + head;
    for (;;) {
        if (have && write(out, p, have) != (ssize_t)have) {
            rc = errmsg_set(err, "%s: write: %s", dest, strerror(errno));
            break;
        }
        got += (long long)have;
        ssize_t r = read(fd, buf, sizeof buf);
        if (r < 0) {
            rc = errmsg_set(err, "read: %s (after %lld bytes)", strerror(errno), got);
            break;
        }
        if (r == 0) break;
        have = (size_t)r;
        p = buf;
    }
    close(fd);
    if (!rc && len >= 0 && got != len)
        rc = errmsg_set(err, "body is %lld bytes, Content-Length says %lld", got, len);
    if (!rc && fsync(out)) rc = errmsg_set(err, "%s: fsync: %s", dest, strerror(errno));
    if (close(out) && !rc) rc = errmsg_set(err, "%s: close: %s", dest, strerror(errno));
    *bytes = got;
    return rc;
}

int http_fetch(const char *url, const char *dest, long long *bytes, char *err)
{
    *bytes = 0;
    if (fetch(url, dest, bytes, err)) return errmsg_prefix(err, "%s: ", url);
    return 0;
}

int http_exchange(const char *method, const char *url, const char *extra, const void *body,
                  size_t len, int *status, char **resp, size_t *resp_len, char *err)
{
    struct http_url u;
    *resp = NULL;
    *resp_len = 0;
    if (http_url_parse(url, &u, err)) return -1;
    int fd = dial(&u, err);
    if (fd < 0) return errmsg_prefix(err, "%s: ", url);
    char head[2048];
    int hl = snprintf(head, sizeof head,
                      "%s %s HTTP/1.0\r\nHost: %s\r\nUser-Agent: strata\r\n"
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n%s\r\n",
                      method, u.path, u.host, len, extra ? extra : "");
    if (hl <= 0 || (size_t)hl >= sizeof head) {
        close(fd);
        return errmsg_set(err, "%s: request head too long", url);
    }
    if (write(fd, head, (size_t)hl) != hl || (len && write(fd, body, len) != (ssize_t)len)) {
        close(fd);
        return errmsg_set(err, "%s: send: %s", url, strerror(errno));
    }
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap + 1);
    int rc = buf ? 0 : errmsg_set(err, "out of memory");
    for (ssize_t r; !rc && (r = read(fd, buf + n, cap - n)) != 0;) {
        if (r < 0) {
            rc = errmsg_set(err, "%s: read: %s", url, strerror(errno));
            break;
        }
        n += (size_t)r;
        if (n == cap) rc = errmsg_set(err, "%s: answer over %zu bytes", url, cap);
    }
    close(fd);
    size_t head_len = 0;
    long long cl = -1;
    int hp = rc ? 0 : http_head_parse(buf, n, status, &cl, &head_len, err);
    if (hp < 0) rc = errmsg_prefix(err, "%s: ", url);
    if (hp > 0) rc = errmsg_set(err, "%s: the answer ended in its head", url);
    if (rc) {
        free(buf);
        return -1;
    }
    memmove(buf, buf + head_len, n - head_len);
    buf[n - head_len] = 0;
    *resp = buf;
    *resp_len = n - head_len;
    return 0;
}
