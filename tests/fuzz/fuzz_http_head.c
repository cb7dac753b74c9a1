/* fuzz_http_head: any bytes as an HTTP response head (what `strata update URL` reads from a peer),
 * and as a URL. The parsers must stay in bounds, report a head length within the input, and
 * never a negative Content-Length other than -1 (absent). */
#include "os/common/errmsg.h"
#include "os/runtime/http_fetch.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int status;
    long long len;
    size_t head;
    char err[ERRMSG_LEN];
    int rc = http_head_parse((const char *)data, size, &status, &len, &head, err);
    if (rc == 0 && (head > size || head < 4 || status < 0 || status > 999 || len < -1)) abort();
    char *url = malloc(size + 1);
    if (!url) return 0;
    memcpy(url, data, size);
    url[size] = 0;
    struct http_url u;
    if (http_url_parse(url, &u, err) == 0 &&
        (strlen(u.host) >= sizeof u.host || u.path[0] != '/' || atoi(u.port) < 1))
        abort();
    free(url);
    return 0;
}
