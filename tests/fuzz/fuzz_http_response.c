/* libFuzzer target: the relay's response reader (serving/api/http_response.h) on arbitrary bytes.
 *
 * Fed the input whole and fed it in three pieces (cut points from the first two bytes), the
 * reader must agree: same result (http_response_eof at the end included), same status, same body
 * bytes handed out (on a malformed body, one's bytes are a prefix of the other's: what was
 * decoded before the bad bytes arrived went out); the buffer never grows past what was fed, a
 * result is -1, 0 or 1, and no more body comes out than went in. */
#include "os/common/errmsg.h"
#include "serving/api/http_response.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct result {
    int rc, status;
    char *body;
    size_t body_len;
};

static void run(const char *in, size_t n, size_t c1, size_t c2, struct result *r)
{
    char *buf = malloc(n ? n : 1); /* exactly n bytes: ASan catches a read past them */
    r->body = malloc(n ? n : 1);
    if (!buf || !r->body) abort();
    struct http_response h;
    http_response_init(&h);
    char err[ERRMSG_LEN];
    size_t len = 0, fed = 0, cuts[3] = {c1, c2, n};
    r->rc = 0;
    r->body_len = 0;
    for (int i = 0; i < 3 && r->rc == 0; i++) {
        if (cuts[i] < fed) continue;
        memcpy(buf + len, in + fed, cuts[i] - fed);
        len += cuts[i] - fed;
        fed = cuts[i];
        size_t before = len, ready = 0;
        r->rc = http_response_feed(&h, buf, &len, &ready, err);
        if (len > before || r->rc < -1 || r->rc > 1 || ready > len) abort();
        if (r->rc >= 0) {
            if (r->body_len + ready > n) abort();
            memcpy(r->body + r->body_len, buf, ready);
            r->body_len += ready;
            http_response_took(&h, buf, &len, ready);
        }
    }
    if (r->rc == 0) r->rc = http_response_eof(&h, err) == 1 ? 2 : -2;
    r->status = h.have_head ? h.status : 0;
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    const char *in = (const char *)data + 2;
    size_t n = size - 2;
    size_t c1 = data[0] * n / 255, c2 = c1 + data[1] * (n - c1) / 255;
    struct result whole, split;
    run(in, n, n, n, &whole);
    run(in, n, c1, c2, &split);
    size_t common = whole.body_len < split.body_len ? whole.body_len : split.body_len;
    if (whole.rc != split.rc || whole.status != split.status ||
        (whole.rc != -1 && whole.body_len != split.body_len) ||
        (common && memcmp(whole.body, split.body, common)))
        abort();
    free(whole.body);
    free(split.body);
    return 0;
}
