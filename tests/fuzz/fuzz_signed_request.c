/* libFuzzer target for an operator's signed request (cluster/signed_request.h): the
 * X-Strata-Signature header's value, parsed and verified against a body. Whatever parses names a
 * node >= 1 and re-signs to a header of the same form; nothing verifies without the key's MAC. */
#include "cluster/signed_request.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct cluster_key key;
    static struct signed_replay rp;
    static int init;
    char err[512];
    if (!init) {
        auth_init(err);
        for (int i = 0; i < CLUSTER_KEY_LEN; i++) key.k[i] = (uint8_t)i;
        signed_replay_init(&rp);
        init = 1;
    }
    struct signed_hdr h;
    if (!signed_request_parse(&h, (const char *)data, size, err)) {
        if (!h.node) abort();
        char out[SIGNED_HEADER_MAX];
        size_t n = signed_request_sign(out, sizeof out, &key, h.node, h.ts_ms, h.nonce, "POST",
                                       "/v1/cluster/recover", NULL, 0);
        struct signed_hdr back;
        if (!n || signed_request_parse(&back, out, n, err) || back.node != h.node ||
            back.ts_ms != h.ts_ms || memcmp(back.nonce, h.nonce, sizeof h.nonce))
            abort();
        /* the fuzzer cannot know the key: what it wrote verifies only if it equals the MAC */
        int ok = !signed_request_verify((const char *)data, size, &key, h.node, h.ts_ms, "POST",
                                        "/v1/cluster/recover", NULL, 0, &rp, err);
        if (ok && memcmp(out, data, n < size ? n : size)) abort();
    }
    return 0;
}
