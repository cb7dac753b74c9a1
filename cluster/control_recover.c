/* control_recover: recovery from a lost quorum (POST /v1/cluster/recover, --cluster-recover).
 *
 * The HTTP thread posts a request and waits (control_recover); the control thread checks it
 * (cluster/recover_req.h), closes raft, opens it again on the same data dir with the configuration
 * "this node alone" appended and the term moved on, and once it leads adds the other named voters
 * back one at a time (control_recover_add_tick). docs/control.md says what is lost. */
#include "cluster/control_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* The other voters a recovery named, one change at a time: raft_add and assign VOTER, the join
 * path (a live node catches up from our log and counts; a dead one stays a non-voter until it
 * comes back, and we still commit alone meanwhile). 1 when it started one. */
int control_recover_add_tick(struct control *c)
{
    if (!c->n_recover_add || c->conf_busy || c->raft.configuration_uncommitted_index ||
        c->raft.leader_state.change || c->raft.leader_state.promotee_id)
        return 0;
    struct peer p = c->recover_add[--c->n_recover_add];
    log_info("cluster", "node %llu was named in the recovery: adding it back as a voter",
             (unsigned long long)p.id);
    control_conf_start_join(c, p.id, p.addr);
    return 1;
}

/* After raft_recover: the term on disk + 1. A lone voter elects itself without a new term, so
 * the recovered node would lead in the term of the leader that died; a node still holding that
 * leader's later entries (same index, same term, other commands) would then pass raft's log
 * check against ours. In a new term no entry of ours can look like one of theirs. (The forced
 * configuration entry itself has term 1, which only the bootstrap entry at index 1 shares.) */
static int bump_term(struct control *c, raft_term *term_out, char *err)
{
    raft_term term = 0;
    raft_id vote = 0;
    struct raft_snapshot *snap = NULL;
    raft_index start = 0;
    struct raft_entry *ents = NULL;
    size_t n = 0;
    int rc = c->io.load(&c->io, &term, &vote, &snap, &start, &ents, &n);
    if (rc) return errmsg_set(err, "raft data dir %s: load: %s", c->dir, c->io.errmsg);
    void *batch = NULL;
    for (size_t i = 0; i < n; i++) {
        if (!ents[i].batch)
            raft_free(ents[i].buf.base);
        else if (ents[i].batch != batch)
            raft_free(batch = ents[i].batch);
    }
    raft_free(ents);
    if (snap) {
        raft_configuration_close(&snap->configuration);
        for (unsigned i = 0; i < snap->n_bufs; i++) raft_free(snap->bufs[i].base);
        raft_free(snap->bufs);
        raft_free(snap);
    }
    rc = c->io.set_term(&c->io, term + 1);
    if (rc) return errmsg_set(err, "raft data dir %s: set term: %s", c->dir, c->io.errmsg);
    *term_out = term + 1;
    return 0;
}

/* Recovery at control_raft_setup: the configuration "this node alone" is appended to the log as it stands
 * (no bootstrap); the other named voters are added once it leads (control_recover_add_tick). raft
 * 0.15 writes the forced entry with term 1, so a configuration of several voters would need the
 * others' votes with a log that looks older than theirs: it could never elect. */
int control_recover_force(struct control *c, char *err)
{
    struct raft_configuration conf;
    raft_configuration_init(&conf);
    raft_configuration_add(&conf, c->cfg.id, c->addr, RAFT_VOTER);
    int rc = raft_recover(&c->raft, &conf);
    raft_configuration_close(&conf);
    if (rc) return errmsg_set(err, "raft_recover: %s", raft_errmsg(&c->raft));
    raft_term term = 0;
    if (bump_term(c, &term, err)) return -1;
    log_info("cluster", "%s: configuration forced, term now %llu", c->dir,
             (unsigned long long)term);
    return 0;
}

/* The address of a member this node knows: raft's configuration first (where raft talks to it),
 * then the replicated state, then --cluster. 0, or -1 when the id is unknown. */
static int known_addr(struct control *c, uint64_t id, char out[CL_STR_LEN + 1])
{
    for (unsigned i = 0; i < c->raft.configuration.n; i++)
        if (c->raft.configuration.servers[i].id == id) {
            snprintf(out, CL_STR_LEN + 1, "%s", c->raft.configuration.servers[i].address);
            return 0;
        }
    pthread_mutex_lock(&c->mu);
    const struct cl_member *m = cluster_state_member_c(&c->st, id);
    if (m && m->info.addr[0]) snprintf(out, CL_STR_LEN + 1, "%s", m->info.addr);
    pthread_mutex_unlock(&c->mu);
    if (m && m->info.addr[0]) return 0;
    for (int i = 0; i < c->n_peers; i++)
        if (c->peer[i].id == id) {
            snprintf(out, CL_STR_LEN + 1, "%s", c->peer[i].addr);
            return 0;
        }
    if (id == c->cfg.id) {
        snprintf(out, CL_STR_LEN + 1, "%s", c->addr);
        return 0;
    }
    return -1;
}

void control_recover_answer(struct control *c, int status, const char *msg)
{
    pthread_mutex_lock(&c->mu);
    c->rq_status = status;
    snprintf(c->rq_msg, sizeof c->rq_msg, "%s", msg);
    c->rq_state = 2;
    pthread_cond_broadcast(&c->recover_cv);
    pthread_mutex_unlock(&c->mu);
}

static void recover_voters_str(const struct control *c, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = 0;
    for (int i = 0; i < c->n_recover_to && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, "%s%llu@%s", i ? "," : "",
                              (unsigned long long)c->recover_to[i].id, c->recover_to[i].addr);
}

/* The named voters other than this node wait for it to lead (control_recover_add_tick). */
static void recover_queue_others(struct control *c)
{
    c->n_recover_add = 0;
    for (int i = 0; i < c->n_recover_to; i++)
        if (c->recover_to[i].id != c->cfg.id) c->recover_add[c->n_recover_add++] = c->recover_to[i];
    c->n_recover_to = 0;
}

/* raft recovered at start (--cluster-recover): counted, and recorded in the log once we lead. */
void control_recover_started(struct control *c)
{
    char voters[512];
    recover_voters_str(c, voters, sizeof voters);
    log_warn("cluster",
             "node %llu: raft recovered as its only voter, named %s, from --cluster-recover "
             "(term %llu, last index %llu); drop the option before the next start",
             (unsigned long long)c->cfg.id, voters, (unsigned long long)c->raft.current_term,
             (unsigned long long)raft_last_index(&c->raft));
    c->recoveries = 1;
    c->last_recovery_ms = now_wall_ms();
    c->recover_event = 1;
    recover_queue_others(c);
}

/* raft is closed and its libuv I/O freed: open it again on the same data dir with the new
 * configuration appended (control_raft_setup sees n_recover_to), from the next loop iteration. */
static void on_recover_timer(uv_timer_t *t)
{
    struct control *c = t->data;
    char err[ERRMSG_LEN], voters[512], msg[ERRMSG_LEN];
    if (c->stopping) return control_recover_answer(c, 503, "the node is stopping");
    raft_transport_free(&c->transport);
    pthread_mutex_lock(&c->mu);
    cluster_state_init(&c->st); /* raft applies the log again from its snapshot */
    c->n_rep = 0;
    pthread_mutex_unlock(&c->mu);
    recover_voters_str(c, voters, sizeof voters);
    if (control_raft_setup(c, err)) {
        log_error("cluster", "recovery failed, raft is not running (restart this node): %s", err);
        snprintf(msg, sizeof msg, "recovery failed, raft is not running: %.400s", err);
        return control_recover_answer(c, 500, msg);
    }
    c->recovering = 0;
    c->recover_event = 1;
    c->was_leader = 0;
    c->leader_seen = 0;
    pthread_mutex_lock(&c->mu);
    c->recoveries++;
    c->last_recovery_ms = now_wall_ms();
    pthread_mutex_unlock(&c->mu);
    log_warn("cluster",
             "node %llu: raft recovered as its only voter, named %s (term %llu, last index %llu); "
             "the other named voters are added back, the rest rejoin",
             (unsigned long long)c->cfg.id, voters, (unsigned long long)c->raft.current_term,
             (unsigned long long)raft_last_index(&c->raft));
    snprintf(msg, sizeof msg,
             "raft restarted on node %llu as its only voter; the others named (%.300s) are added "
             "back as voters once it leads",
             (unsigned long long)c->cfg.id, voters);
    recover_queue_others(c);
    control_recover_answer(c, 0, msg);
}

static void recover_closed(struct raft *r)
{
    struct control *c = r->data;
    raft_uv_close(&c->io);
    uv_timer_start(&c->recover_timer, on_recover_timer, 0, 0);
}

/* The HTTP thread posted a request: check it against what this node sees, then close raft. */
void control_recover_on_async(uv_async_t *a)
{
    struct control *c = a->data;
    char err[ERRMSG_LEN];
    pthread_mutex_lock(&c->mu);
    int posted = c->rq_state == 1;
    struct recover_req rq = c->rq;
    pthread_mutex_unlock(&c->mu);
    if (!posted || c->recovering) return;
    if (c->stopping || !c->raft_open) return control_recover_answer(c, 503, "raft is not running");
    uint64_t known[3 * CL_MAX_NODES];
    int n = 0;
    for (unsigned i = 0; i < c->raft.configuration.n && n < CL_MAX_NODES; i++)
        known[n++] = c->raft.configuration.servers[i].id;
    pthread_mutex_lock(&c->mu);
    for (uint32_t i = 0; i < c->st.n_members; i++) known[n++] = c->st.member[i].info.id;
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < c->n_peers; i++) known[n++] = c->peer[i].id;
    raft_id lid = 0;
    const char *laddr = NULL;
    raft_leader(&c->raft, &lid, &laddr);
    uint64_t now = now_mono_ms();
    struct recover_view v = {.self = c->cfg.id,
                             .known = known,
                             .n_known = n,
                             .leader = lid,
                             .leaderless_ms = lid || !c->leader_seen ? 0 : now - c->leader_seen,
                             .need_ms = 20 * (uint64_t)c->cfg.heartbeat_ms};
    int status = recover_check(&rq, &v, err);
    if (status) {
        log_warn("cluster", "recovery refused: %s", err);
        return control_recover_answer(c, status, err);
    }
    c->n_recover_to = 0;
    for (int i = 0; i < rq.n_voters; i++) {
        struct peer *p = &c->recover_to[c->n_recover_to++];
        p->id = rq.voters[i];
        known_addr(c, p->id, p->addr); /* known: recover_check found it */
    }
    char voters[512];
    recover_voters_str(c, voters, sizeof voters);
    log_warn("cluster",
             "node %llu: recovering raft with voters %s%s (leader %llu, none for %llu ms, term "
             "%llu, last index %llu): closing raft",
             (unsigned long long)c->cfg.id, voters, rq.force ? ", forced" : "",
             (unsigned long long)lid, (unsigned long long)v.leaderless_ms,
             (unsigned long long)c->raft.current_term,
             (unsigned long long)raft_last_index(&c->raft));
    c->recovering = 1;
    c->raft_open = 0; /* on_stop must not close it again */
    if (c->ctl) sealed_conn_close(c->ctl, "raft recovering");
    if (c->join) sealed_conn_close(c->join, "raft recovering");
    raft_close(&c->raft, recover_closed);
}

int control_recover(struct control *c, const struct recover_req *r, char *msg, size_t cap)
{
    pthread_mutex_lock(&c->mu);
    if (c->rq_state == 1) {
        pthread_mutex_unlock(&c->mu);
        snprintf(msg, cap, "a recovery is already running on this node");
        return 409;
    }
    c->rq = *r;
    c->rq_state = 1;
    uv_async_send(&c->recover_async);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    while (c->rq_state != 2)
        if (pthread_cond_timedwait(&c->recover_cv, &c->mu, &until) == ETIMEDOUT) break;
    int status = c->rq_state == 2 ? c->rq_status : 504;
    snprintf(msg, cap, "%s",
             c->rq_state == 2 ? c->rq_msg : "the control thread did not answer within 10 s");
    /* A late answer still lands in rq_*: the next request sees 2 and may start. */
    c->rq_state = c->rq_state == 2 ? 0 : c->rq_state;
    pthread_mutex_unlock(&c->mu);
    return status;
}

/* --cluster-recover: the list, checked against --cluster, on a data dir that holds a log. */
int control_recover_at_start(struct control *c, char *err)
{
    struct recover_req rq;
    struct stat sb;
    char path[300];
    if (recover_list_parse(&rq, c->cfg.recover, err))
        return errmsg_prefix(err, "--cluster-recover: ");
    uint64_t known[CL_MAX_NODES + 1];
    int n = 0;
    for (int i = 0; i < c->n_peers; i++) known[n++] = c->peer[i].id;
    known[n++] = c->cfg.id;
    struct recover_view v = {.self = c->cfg.id, .known = known, .n_known = n};
    rq.force = 1; /* nothing runs yet: the operator says the quorum is gone */
    if (recover_check(&rq, &v, err)) return errmsg_prefix(err, "--cluster-recover: ");
    snprintf(path, sizeof path, "%s/metadata1", c->dir);
    int has_log = !stat(path, &sb);
    snprintf(path, sizeof path, "%s/metadata2", c->dir);
    has_log |= !stat(path, &sb);
    if (!has_log)
        return errmsg_set(err, "--cluster-recover: %s holds no raft log: nothing to recover",
                          c->dir);
    for (int i = 0; i < rq.n_voters; i++) {
        c->recover_to[i].id = rq.voters[i];
        known_addr(c, rq.voters[i], c->recover_to[i].addr);
    }
    c->n_recover_to = rq.n_voters;
    return 0;
}

int control_check_signed(struct control *c, const char *method, const char *path, const char *sig,
                         size_t sig_len, const void *body, size_t len, char *err)
{
    if (!signed_request_verify(sig, sig_len, &c->key, c->cfg.id, now_wall_ms(), method, path, body,
                               len, &c->signed_seen, err))
        return 0;
    pthread_mutex_lock(&c->mu);
    c->signed_refused++;
    pthread_mutex_unlock(&c->mu);
    log_warn("cluster", "%s %s: signed request refused: %s", method, path, err);
    return -1;
}
