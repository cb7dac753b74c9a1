#include "transport/transport.h"

#include "os/errmsg.h"

static int rdma_open(struct tp *t, char *err)
{
    (void)t;
    return errmsg_set(err, "not built yet");
}

const struct tp_ops tp_rdma_ops = {.name = "rdma", .open = rdma_open};
