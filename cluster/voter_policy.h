/* voter_policy: which server the leader takes out of raft's configuration, or promotes, next.
 *
 * A member the replicated state has held down (CMD_NODE_DOWN) for remove_ms is still a raft voter:
 * it counts in every quorum, so a rack that loses half its voters for good stops committing even
 * with a working majority of the nodes it still has. The leader removes such a server from the
 * configuration (raft_remove), one change at a time, as long as at least VOTERS_MIN voters stay;
 * when the removal would leave fewer, it first promotes a live non-voter (raft_assign VOTER), and
 * when there is none it keeps the dead voter (removing it would not let one more node fail: with
 * 3 voters, 2 live, quorum is 2 either way). A dead non-voter is removed at once. A server raft
 * lists that the state has never seen report counts as down since this leader took office, and a
 * node raft made a voter again (a raft_voter event) counts from then, until its NODE_UP. With
 * fewer than VOTERS_MIN voters and a live non-voter (a join cut short), the live one is promoted.
 * Of several live non-voters, the one whose rack (cl_node_up.rack, as the state holds it) has the
 * fewest voters that are not down past remove_ms is promoted, then the first in raft's order: a
 * rack's switch or power takes all its voters at once, so the voters spread over racks.
 *
 * Pure: the caller passes raft's configuration and the committed state, and carries out the
 * answer (cluster/control_conf.c). A removed node that comes back rejoins like a new node: JOIN, then
 * raft_add and raft_assign VOTER. */
#ifndef STRATA_CLUSTER_VOTER_POLICY_H
#define STRATA_CLUSTER_VOTER_POLICY_H

#include "cluster/cluster_state.h"

#include <stdint.h>

#define VOTERS_MIN 3

struct vp_server {
    uint64_t id;
    int voter; /* raft role VOTER (standby and spare: 0) */
};

enum vp_kind {
    VP_NONE = 0,
    VP_REMOVE,  /* raft_remove(node) */
    VP_PROMOTE, /* raft_assign(node, VOTER): a live non-voter, so that a dead voter can go */
    VP_KEEP,    /* node is dead past remove_ms but stays: removing it would leave fewer than
                   VOTERS_MIN voters and no live non-voter can take its place (for a log line) */
};

struct vp_action {
    int kind; /* enum vp_kind */
    uint64_t node;
};

struct vp_input {
    const struct cl_state *st;    /* the committed state: alive and since_ms per member */
    const struct vp_server *conf; /* raft's configuration, as the leader holds it */
    int n_conf;
    uint64_t self;         /* the leader: never removed */
    uint64_t now_ms;       /* wall clock, the clock of the state's since_ms */
    uint64_t leader_since; /* wall clock when this node became leader */
    uint64_t remove_ms;    /* 0: never remove */
};

struct vp_action voter_policy_step(const struct vp_input *in);

#endif
