/* control_conf: raft's configuration, changed by the leader one step at a time.
 *
 * A joining node is added (raft_add, then raft_assign VOTER); a member down past
 * --cluster-remove-ms is removed, or a non-voter promoted, as cluster/voter_policy.h says. Each
 * change is recorded in the log (CMD_RAFT_CONF) so /v1/cluster shows when it happened. Runs on
 * the control thread. */
#include "cluster/control_internal.h"

#include <stdlib.h>

static void on_join_done(struct raft_change *req, int status);

/* A change of raft's configuration, recorded in the log so /v1/cluster shows when it happened. */
void control_conf_event(struct control *c, uint64_t id, int change)
{
    if (c->stopping || raft_state(&c->raft) != RAFT_LEADER) return;
    struct cl_cmd cmd = {.type = CMD_RAFT_CONF};
    cmd.u.conf.node = id;
    cmd.u.conf.change = (uint8_t)change;
    control_fsm_propose(c, &cmd);
}

struct join_req {
    struct raft_change req;
    struct control *c;
    uint64_t id;
    int assigned;
};

void control_conf_start_join(struct control *c, uint64_t id, const char *addr)
{
    for (unsigned i = 0; i < c->raft.configuration.n; i++)
        if (c->raft.configuration.servers[i].id == id &&
            c->raft.configuration.servers[i].role == RAFT_VOTER)
            return; /* already a voter */
    struct join_req *j = calloc(1, sizeof *j);
    if (!j) return;
    j->c = c;
    j->id = id;
    j->req.data = j;
    int rc = raft_add(&c->raft, &j->req, id, addr, on_join_done);
    if (rc == RAFT_DUPLICATEID) {
        j->assigned = 1;
        rc = raft_assign(&c->raft, &j->req, id, RAFT_VOTER, on_join_done);
    }
    if (rc) {
        log_warn("cluster", "adding node %llu (%s): %s", (unsigned long long)id, addr,
                 raft_strerror(rc));
        free(j);
        return;
    }
    log_info("cluster", "adding node %llu at %s", (unsigned long long)id, addr);
}

static void on_join_done(struct raft_change *req, int status)
{
    struct join_req *j = req->data;
    struct control *c = j->c;
    if (status) {
        log_warn("cluster", "adding node %llu: %s", (unsigned long long)j->id,
                 raft_strerror(status));
        free(j);
        return;
    }
    if (!j->assigned && !c->stopping) {
        j->assigned = 1;
        int rc = raft_assign(&c->raft, &j->req, j->id, RAFT_VOTER, on_join_done);
        if (!rc) return;
        log_warn("cluster", "node %llu: assign voter: %s", (unsigned long long)j->id,
                 raft_strerror(rc));
    } else if (!status) {
        log_info("cluster", "node %llu is a voter", (unsigned long long)j->id);
        control_conf_event(c, j->id, CONF_VOTER);
    }
    free(j);
}

struct conf_req {
    struct raft_change req;
    struct control *c;
    uint64_t id;
    int kind; /* VP_REMOVE or VP_PROMOTE */
};

static void conf_done(struct raft_change *req, int status)
{
    struct conf_req *q = req->data;
    struct control *c = q->c;
    c->conf_busy = 0;
    if (status) {
        log_warn("cluster", "%s node %llu: %s", q->kind == VP_REMOVE ? "removing" : "promoting",
                 (unsigned long long)q->id, raft_strerror(status));
    } else {
        log_info("cluster", "node %llu %s raft's configuration", (unsigned long long)q->id,
                 q->kind == VP_REMOVE ? "removed from" : "promoted to a voter in");
        control_conf_event(c, q->id, q->kind == VP_REMOVE ? CONF_REMOVED : CONF_VOTER);
    }
    free(q);
}

/* One change at a time, none while raft has one uncommitted or a promotion running (a join's),
 * and, like every decision, only on a state that applied everything proposed (the raft_voter
 * event of a node that just rejoined, say). */
void control_conf_tick(struct control *c)
{
    if (c->conf_busy || c->raft.configuration_uncommitted_index || c->raft.leader_state.change ||
        c->raft.leader_state.promotee_id || c->inflight ||
        raft_last_applied(&c->raft) < raft_last_index(&c->raft))
        return;
    pthread_mutex_lock(&c->mu);
    struct vp_input in = {.st = &c->st,
                          .conf = c->conf,
                          .n_conf = c->n_conf,
                          .self = c->cfg.id,
                          .now_ms = now_wall_ms(),
                          .leader_since = c->leader_since_wall,
                          .remove_ms = c->cfg.remove_ms > 0 ? (uint64_t)c->cfg.remove_ms : 0};
    struct vp_action a = voter_policy_step(&in);
    pthread_mutex_unlock(&c->mu);
    if (a.kind == VP_KEEP && a.node != c->keep_logged)
        log_warn("cluster",
                 "node %llu is down past --cluster-remove-ms but stays a voter: removing it "
                 "would leave fewer than %d voters",
                 (unsigned long long)a.node, VOTERS_MIN);
    c->keep_logged = a.kind == VP_KEEP ? a.node : 0;
    if (a.kind != VP_REMOVE && a.kind != VP_PROMOTE) return;
    struct conf_req *q = calloc(1, sizeof *q);
    if (!q) return;
    *q = (struct conf_req){.c = c, .id = a.node, .kind = a.kind};
    q->req.data = q;
    int rc = a.kind == VP_REMOVE ? raft_remove(&c->raft, &q->req, a.node, conf_done)
                                 : raft_assign(&c->raft, &q->req, a.node, RAFT_VOTER, conf_done);
    if (rc) {
        log_warn("cluster", "%s node %llu: %s", a.kind == VP_REMOVE ? "removing" : "promoting",
                 (unsigned long long)a.node, raft_strerror(rc));
        free(q);
        return;
    }
    c->conf_busy = 1;
    log_info("cluster", "%s node %llu (%s)", a.kind == VP_REMOVE ? "removing" : "promoting",
             (unsigned long long)a.node,
             a.kind == VP_REMOVE ? "down past --cluster-remove-ms"
                                 : "a dead voter is to go and fewer than 3 would stay");
}
