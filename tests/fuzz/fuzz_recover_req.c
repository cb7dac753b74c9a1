/* libFuzzer target for the operator's recovery request (cluster/recover_req.h): the JSON body of
 * POST /v1/cluster/recover and the --cluster-recover list. Whatever parses names 1 to
 * CL_MAX_NODES distinct ids >= 1, and the check of it never fails to answer. */
#include "cluster/recover_req.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check_parsed(const struct recover_req *r)
{
    char err[512];
    if (r->n_voters < 1 || r->n_voters > CL_MAX_NODES) abort();
    for (int i = 0; i < r->n_voters; i++) {
        if (!r->voters[i]) abort();
        for (int k = 0; k < i; k++)
            if (r->voters[k] == r->voters[i]) abort();
    }
    const uint64_t known[] = {1, 2, 3};
    struct recover_view v = {.self = 1, .known = known, .n_known = 3, .need_ms = 1};
    int s = recover_check(r, &v, err);
    if (s != 0 && s != 400 && s != 409) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct recover_req r;
    char err[512];
    if (!recover_req_parse(&r, (const char *)data, size, err)) check_parsed(&r);
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = 0;
    if (!recover_list_parse(&r, s, err)) check_parsed(&r);
    free(s);
    return 0;
}
