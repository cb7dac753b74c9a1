#include "serving/sched/step_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAGIC     "strata-step-model"
#define MAX_BYTES 4096
#define CHECK_LEN 16 /* bytes of BLAKE2b over everything before the check line */

static void hex(char *out, const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", p[i]);
}

static void checksum(char out[2 * CHECK_LEN + 1], const char *p, size_t n)
{
    unsigned char h[CHECK_LEN];
    crypto_generichash(h, sizeof h, (const unsigned char *)p, n, NULL, 0);
    hex(out, h, sizeof h);
}

size_t step_cache_encode(char *out, size_t cap, const struct step_identity *id,
                         const struct step_cached *c)
{
    char body[MAX_BYTES];
    int n = snprintf(body, sizeof body,
                     MAGIC " %d\nmodel %s\nhardware %s\na %.9g\nb %.9g\nc %.9g\nerr %.9g\n"
                           "steps %ld\n",
                     STEP_CACHE_VERSION, id->model, id->hardware, c->m.a * c->m.corr,
                     c->m.b * c->m.corr, c->m.c * c->m.corr, c->err, c->steps);
    if (n < 0 || (size_t)n >= sizeof body) return 0;
    char sum[2 * CHECK_LEN + 1];
    checksum(sum, body, (size_t)n);
    int m = snprintf(out, cap, "%scheck %s\n", body, sum);
    return m < 0 || (size_t)m >= cap ? 0 : (size_t)m;
}

/* The next line of [*p, end) without its newline, NUL-terminated in place; NULL when there is no
 * complete line. */
static char *next_line(char **p, char *end)
{
    char *nl = memchr(*p, '\n', (size_t)(end - *p));
    if (!nl) return NULL;
    char *line = *p;
    *nl = 0;
    *p = nl + 1;
    return line;
}

/* "KEY VALUE" with a number: finite, in [0, max]. */
static int number(const char *line, const char *key, double max, double *v, char *err, int at)
{
    size_t k = strlen(key);
    if (strncmp(line, key, k) || line[k] != ' ')
        return errmsg_set(err, "corrupt: line %d is not \"%s ...\"", at, key);
    const char *s = line + k + 1;
    char *e;
    errno = 0;
    *v = strtod(s, &e);
    if (e == s || *e || errno || !isfinite(*v) || *v < 0 || *v > max)
        return errmsg_set(err, "corrupt: line %d: %s %.40s is not a number in [0, %g]", at, key, s,
                          max);
    return 0;
}

int step_cache_parse(const char *buf, size_t len, const struct step_identity *id,
                     struct step_cached *c, char *err)
{
    char copy[MAX_BYTES + 1];
    if (len > MAX_BYTES) return errmsg_set(err, "corrupt: %zu bytes, at most %d", len, MAX_BYTES);
    if (memchr(buf, 0, len)) return errmsg_set(err, "corrupt: a NUL byte");
    memcpy(copy, buf, len);
    copy[len] = 0;
    /* the check line is the last one; it covers every byte before it */
    char *end = copy + len;
    if (len < 2 || end[-1] != '\n') return errmsg_set(err, "corrupt: truncated (no final newline)");
    char *last = end - 1;
    while (last > copy && last[-1] != '\n') last--;
    char want[2 * CHECK_LEN + 1];
    checksum(want, copy, (size_t)(last - copy));
    if (strncmp(last, "check ", 6) || (size_t)(end - 1 - (last + 6)) != 2 * CHECK_LEN ||
        memcmp(last + 6, want, 2 * CHECK_LEN))
        return errmsg_set(err, "corrupt: checksum mismatch (a damaged or hand-edited file)");
    char *p = copy;
    const char *key[] = {MAGIC, "model", "hardware", "a", "b", "c", "err", "steps"};
    char *line[8];
    for (int i = 0; i < 8; i++) {
        line[i] = next_line(&p, last);
        if (!line[i]) return errmsg_set(err, "corrupt: %d lines, want 9", i + 1);
        size_t k = strlen(key[i]);
        if (strncmp(line[i], key[i], k) || line[i][k] != ' ')
            return errmsg_set(err, "corrupt: line %d is not \"%s ...\"", i + 1, key[i]);
    }
    if (p != last) return errmsg_set(err, "corrupt: lines after steps");
    char *ve;
    long version = strtol(line[0] + strlen(MAGIC) + 1, &ve, 10);
    if (*ve || ve == line[0] + strlen(MAGIC) + 1)
        return errmsg_set(err, "corrupt: line 1: bad version");
    if (version != STEP_CACHE_VERSION)
        return errmsg_set(err, "version %ld, this build reads %d", version, STEP_CACHE_VERSION);
    if (strcmp(line[1] + 6, id->model))
        return errmsg_set(err, "foreign: made for model %.80s, this is %.80s", line[1] + 6,
                          id->model);
    if (strcmp(line[2] + 9, id->hardware))
        return errmsg_set(err, "foreign: made on %.80s, this is %.80s", line[2] + 9, id->hardware);
    double v[5];
    const double max[5] = {1e3, 1e3, 1e3, 1e3, 1e15};
    for (int i = 0; i < 5; i++)
        if (number(line[3 + i], key[3 + i], max[i], &v[i], err, 4 + i)) return -1;
    if (v[4] != floor(v[4]))
        return errmsg_set(err, "corrupt: line 8: steps %.40s is not a whole number", line[7] + 6);
    if (v[0] <= 0) return errmsg_set(err, "corrupt: line 4: a must be above 0");
    *c = (struct step_cached){
        .m = {.a = v[0], .b = v[1], .c = v[2], .corr = 1}, .err = v[3], .steps = (long)v[4]};
    return 0;
}

static void identity_digest(const struct step_identity *id, unsigned char h[8])
{
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, 8);
    crypto_generichash_update(&st, (const unsigned char *)id->model, strlen(id->model) + 1);
    crypto_generichash_update(&st, (const unsigned char *)id->hardware, strlen(id->hardware) + 1);
    crypto_generichash_final(&st, h, 8);
}

uint64_t step_identity_hash(const struct step_identity *id)
{
    unsigned char h[8];
    identity_digest(id, h);
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)h[i] << (8 * i);
    return v ? v : 1; /* 0 means "none" on the wire */
}

void step_cache_path(char *out, size_t cap, const char *dir, const struct step_identity *id)
{
    unsigned char h[8];
    identity_digest(id, h);
    char x[2 * sizeof h + 1];
    hex(x, h, sizeof h);
    snprintf(out, cap, "%s/step-model-%s.txt", dir, x);
}

int step_cache_load(const char *dir, const struct step_identity *id, struct step_cached *c,
                    char *err)
{
    char path[4096], buf[MAX_BYTES + 1];
    step_cache_path(path, sizeof path, dir, id);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return 0;
        return errmsg_set(err, "%s: %s", path, strerror(errno));
    }
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, sizeof buf - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            return errmsg_set(err, "%s: read: %s", path, strerror(e));
        }
        if (r == 0 || (n += (size_t)r) == sizeof buf) break;
    }
    close(fd);
    if (step_cache_parse(buf, n, id, c, err)) return errmsg_prefix(err, "%s: ", path);
    return 1;
}

/* mkdir -p: the state directory's parents may not exist yet (~/.cache on a fresh machine). */
static int make_dirs(const char *dir, char *err)
{
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    for (char *s = p + 1;; s++) {
        if (*s && *s != '/') continue;
        char c = *s;
        *s = 0;
        if (mkdir(p, 0755) && errno != EEXIST)
            return errmsg_set(err, "%s: mkdir: %s", p, strerror(errno));
        if (!c) return 0;
        *s = c;
    }
}

int step_cache_save(const char *dir, const struct step_identity *id, const struct step_cached *c,
                    char *err)
{
    char path[4096], tmp[4200], buf[MAX_BYTES];
    size_t n = step_cache_encode(buf, sizeof buf, id, c);
    if (!n) return errmsg_set(err, "step model cache: the identity is too long");
    if (make_dirs(dir, err)) return -1;
    step_cache_path(path, sizeof path, dir, id);
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return errmsg_set(err, "%s: %s", tmp, strerror(errno));
    size_t off = 0;
    while (off < n) {
        ssize_t w = write(fd, buf + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        off += (size_t)w;
    }
    int e = off == n ? 0 : errno ? errno : EIO;
    if (!e && fsync(fd)) e = errno;
    if (close(fd) && !e) e = errno;
    if (!e && rename(tmp, path)) e = errno;
    if (e) {
        unlink(tmp);
        return errmsg_set(err, "%s: %s", path, strerror(e));
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* the rename is durable too */
    if (dfd >= 0) fsync(dfd), close(dfd);
    return 0;
}
