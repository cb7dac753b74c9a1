/* libFuzzer target: the HTTP request-head parser on arbitrary bytes. Checks the contract: it
 * returns -1/0/1, a parsed head lies inside the input, an error comes with a 4xx/5xx status. */
#include "os/errmsg.h"
#include "serving/api/http.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a copy of exactly `size` bytes, so ASan catches any read past the end */
    char *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    struct http_request r;
    int status;
    char err[ERRMSG_LEN];
    int rc = http_parse_head(buf, size, 8192, &r, &status, err);
    if (rc == 1 && (r.head_len > size || r.path[0] != '/' || strlen(r.method) == 0)) abort();
    if (rc == -1 && (status < 400 || status > 599)) abort();
    if (rc != -1 && rc != 0 && rc != 1) abort();
    free(buf);
    return 0;
}
