/* recover_req: an operator's forced new raft configuration, for a cluster that lost its quorum
 * (POST /v1/cluster/recover, `strata serve --cluster-recover`; docs/control.md "Recovering a
 * cluster that lost its quorum").
 *
 *   body   {"voters":[1,3]} or {"voters":[1],"force":true}: 1 to CL_MAX_NODES distinct node ids
 *          (integers >= 1); "force" optional (a boolean); any other key is refused (a typo must
 *          not pass for a request that means something else).
 *   list   "1,3" (the command line's form): the same ids, comma-separated, no "force".
 *
 * recover_check decides whether this node may recover now: the list must name this node (it
 * re-initialises its own raft; a list without it would leave it outside the cluster it leads)
 * and only known members; and unless force, this node must see no leader and have seen none for
 * need_ms (a cluster that still elects is not stuck, and forcing a configuration beside a
 * working leader splits the cluster in two).
 *
 * Pure functions: 0, or -1 (parse) / an HTTP status (check: 400 for the list, 409 for the
 * cluster's state) with one line in err naming the reason. */
#ifndef STRATA_RECOVER_REQ_H
#define STRATA_RECOVER_REQ_H

#include "cluster/cluster_state.h"

#include <stddef.h>
#include <stdint.h>

struct recover_req {
    uint64_t voters[CL_MAX_NODES];
    int n_voters;
    int force;
};

int recover_req_parse(struct recover_req *r, const char *body, size_t len, char *err);
int recover_list_parse(struct recover_req *r, const char *list, char *err);

/* What this node sees when the request arrives. */
struct recover_view {
    uint64_t self;
    const uint64_t *known; /* ids of raft's configuration, the replicated state's members and
                              --cluster, in any order (duplicates allowed) */
    int n_known;
    uint64_t leader;        /* the leader this node knows, 0: none */
    uint64_t leaderless_ms; /* how long it has known none */
    uint64_t need_ms;       /* how long it must have known none (without force) */
};

int recover_check(const struct recover_req *r, const struct recover_view *v, char *err);

#endif
