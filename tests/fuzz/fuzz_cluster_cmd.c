/* libFuzzer target for the control plane's decoders: log commands, control messages and state
 * snapshots (cluster/cluster_cmd.h, cluster/cluster_state.h). The first byte picks the decoder.
 * What decodes must encode back to the same bytes, and applying a decoded command must keep the
 * state encodable. */
#include "cluster/cluster_cmd.h"
#include "cluster/cluster_state.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static struct cl_state st, st2;
static uint8_t out[1 << 16];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    if (size < 1) return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    switch (data[0] % 3) {
    case 0: {
        struct cl_cmd c;
        if (cluster_cmd_decode(&c, p, n, err)) break;
        size_t k = cluster_cmd_encode(out, sizeof out, &c);
        if (k != n || memcmp(out, p, n)) abort();
        cluster_state_apply(&st, &c);
        if (!cluster_state_encode(&st, out, sizeof out)) abort();
        break;
    }
    case 1: {
        struct cl_msg m;
        if (cluster_cmd_msg_decode(&m, p, n, err)) break;
        size_t k = cluster_cmd_msg_encode(out, sizeof out, &m);
        if (k != n || memcmp(out, p, n)) abort();
        break;
    }
    case 2:
        if (cluster_state_decode(&st2, p, n, err)) break;
        if (!cluster_state_encode(&st2, out, sizeof out)) abort();
        break;
    }
    return 0;
}
