#include "cmd/cluster_opts.h"

#include "cmd/test_hooks.h"

#include "os/common/errmsg.h"

#include <string.h>

static int parse_planner(const char *v, void *dst, char *err)
{
    if (strcmp(v, "reactive") && strcmp(v, "proactive"))
        return errmsg_set(err, "--cluster-planner %s: want reactive or proactive", v);
    *(int *)dst = !strcmp(v, "proactive");
    return 0;
}

int cluster_options(struct control_cfg *c, struct opt *t)
{
    const struct opt table[CLUSTER_N_OPTS] = {
        {"--cluster", OPT_STR, &c->peers, 0, 0, NULL, "ID@HOST:PORT,..."},
        {"--cluster-addr", OPT_STR, &c->addr, 0, 0, NULL, "HOST:PORT"},
        {"--raft-dir", OPT_STR, &c->dir, 0, 0, NULL, "DIR"},
        {"--cluster-heartbeat-ms", OPT_INT, &c->heartbeat_ms, 10, 60000, NULL, "MS"},
        {"--cluster-dead-ms", OPT_INT, &c->dead_ms, 20, 600000, NULL, "MS"},
        {"--cluster-remove-ms", OPT_INT, &c->remove_ms, 0, 86400000, NULL, "MS"},
        {"--cluster-handshake-ms", OPT_INT, &c->handshake_ms, 10, 600000, NULL, "MS"},
        {"--keep-alive-ms", OPT_DOUBLE, &c->keep_alive_ms, 0, 86400000, NULL, "MS"},
        {"--scaleout-timeout-ms", OPT_INT, &c->scaleout_timeout_ms, 1000, 86400000, NULL, "MS"},
        {"--scaleout-stall-ms", OPT_INT, &c->scaleout_stall_ms, 1000, 86400000, NULL, "MS"},
        {"--replicas-cached", OPT_INT, &c->replicas_cached, 1, 64, NULL, "R"},
        {"--gpu-type", OPT_STR, &c->gpu, 0, 0, NULL, "NAME"},
        {"--rack", OPT_STR, &c->rack, 0, 0, NULL, "NAME"},
        {"--cluster-recover", OPT_STR, &c->recover, 0, 0, NULL, "ID,..."},
        {"--cluster-planner", OPT_PARSE, &c->proactive, 0, 0, parse_planner, "reactive|proactive"},
    };
    memcpy(t, table, sizeof table);
    /* the stand-in executor and the refusals: test hooks (cmd/test_hooks.h) */
    return CLUSTER_N_OPTS + test_hooks_cluster_options(c, t + CLUSTER_N_OPTS);
}
