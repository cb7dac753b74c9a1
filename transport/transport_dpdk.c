#include "transport/transport.h"

#include "os/errmsg.h"

static int dpdk_open(struct tp *t, char *err)
{
    (void)t;
    return errmsg_set(err, "not built yet");
}

const struct tp_ops tp_dpdk_ops = {.name = "dpdk", .open = dpdk_open};
