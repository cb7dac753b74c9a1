#include "cluster/control.h"

#include "cluster/cluster_state.h"
#include "cluster/fwd_channel.h"
#include "cluster/planner.h"
#include "cluster/raft_transport.h"
#include "cluster/recover_req.h"
#include "cluster/voter_policy.h"
#include "os/common/errmsg.h"
#include "os/runtime/log.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <raft.h>
#include <raft/uv.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define CTL_MAX_EXECUTED 64

struct peer {
    uint64_t id;
    char addr[CL_STR_LEN + 1];
};

/* The latest load report of a node (the leader's table; every node keeps its own). */
struct report {
    uint64_t id;
    uint64_t at_ms; /* monotonic, local */
    uint32_t seen_scales;
    struct cl_node_up node;
    struct cl_load load;
    int n_hold;
    struct cl_holding hold[CL_MAX_HOLD];
    int n_refused;
    struct cl_refusal refused[CL_MAX_REFUSED];
};

/* The leader's memory of a node that refused (or failed) a scale-out of a model: no new copy or
 * joiner of that model goes there until `until` (monotonic; twice --cluster-dead-ms later: long
 * enough for its reports to correct a stale view, short enough that a transient refusal, a
 * switch asked while the old model is still leaving the engine, is asked again). */
struct refuser {
    uint64_t node, until;
    char model[CL_STR_LEN + 1];
};
#define CTL_MAX_REFUSERS 16

struct proposal {
    struct raft_apply req;
    struct control *c;
};

struct control {
    struct control_cfg cfg;
    char peers_s[1024], addr[CL_STR_LEN + 1], dir[256], http[CL_STR_LEN + 1], gpu[CL_STR_LEN + 1],
        rack[CL_STR_LEN + 1], model[CL_STR_LEN + 1], fabric[CL_STR_LEN + 1];
    struct peer peer[CL_MAX_NODES];
    int n_peers, bootstrap_member;
    struct cluster_key key;
    struct control_serving sv;
    struct cluster_exec ex;

    pthread_t thread;
    int thread_started;
    uv_loop_t loop;
    uv_async_t stop_async;
    uv_timer_t tick;
    struct raft_uv_transport transport;
    struct fwd_channels *fwd; /* forwarded API requests, both ways */
    struct raft_io io;
    struct raft_fsm fsm;
    struct raft raft;
    int raft_open, stopping;

    /* Guarded by mu: the replicated state (written by the FSM on the loop thread), this node's
     * holdings (written by the executor), the report table and the counters below it. */
    pthread_mutex_t mu;
    struct cl_state st;
    struct cl_holding my_hold[CL_MAX_HOLD];
    int n_my_hold;
    struct cl_refusal my_refused[CL_MAX_REFUSED]; /* decisions this node refused or failed */
    int n_my_refused;
    struct refuser refuser[CTL_MAX_REFUSERS]; /* the leader's, see struct refuser */
    int n_refusers;
    struct report rep[CL_MAX_NODES];
    int n_rep;
    int raft_state;
    uint64_t leader_id, term, commit_index, applied_index, last_index;
    char leader_addr[CL_STR_LEN + 1];
    uint64_t decisions, refused, handshake_timeouts, reports_in, proposals_failed, leaderships;
    struct vp_server conf[CL_MAX_NODES]; /* raft's configuration, as this node holds it */
    int n_conf;
    int outstanding[CL_MAX_NODES]; /* requests this node has relayed to member i, in flight */
    /* Loads the leader relayed to us (a follower's view of the others, for routing only). */
    struct {
        uint64_t id, at_ms; /* at_ms: local monotonic time the leader's copy was taken */
        struct cl_load load;
    } relayed[CL_MAX_NODES];
    int n_relayed;
    uint64_t suspect_until[CL_MAX_NODES]; /* member i refused a relay: not routed to until then */

    /* Loop thread only. */
    int inflight, was_leader;
    uint64_t leader_since, leader_since_wall, start_wall;
    uint64_t leader_seen; /* monotonic: the last tick raft knew a leader */
    uint64_t join_last;   /* monotonic: the last JOIN this node sent while leaderless */
    int conf_busy;        /* a change of raft's configuration of ours in flight */
    uint64_t keep_logged; /* the dead voter we last logged as kept */
    struct sconn *ctl;    /* to the leader */
    uint64_t ctl_leader;
    int ctl_open;
    int in_config;                /* this node is in raft's configuration */
    struct sconn *join;           /* a JOIN in flight */
    int join_next;                /* next peer to ask */
    char join_to[CL_STR_LEN + 1]; /* the leader a peer named: asked next */
    uint32_t executed[CTL_MAX_EXECUTED];
    int n_executed;
    uint32_t events_seen;
    uint32_t seen_scales; /* CMD_SCALEs this node has applied and acted on */

    /* Recovery from a lost quorum (control_recover, --cluster-recover). The request and its
     * answer are guarded by mu (rq_state: 0 none, 1 posted, 2 answered; recover_cv signals the
     * answer); the rest is the loop's. */
    uv_async_t recover_async;
    uv_timer_t recover_timer;
    pthread_cond_t recover_cv;
    int rq_state, rq_status;
    struct recover_req rq;
    char rq_msg[ERRMSG_LEN];
    struct peer recover_to[CL_MAX_NODES]; /* the named voters, at the addresses this node knows */
    int n_recover_to;
    struct peer recover_add[CL_MAX_NODES]; /* the others: added back as voters once we lead */
    int n_recover_add;
    int recovering;      /* raft is closed for a recovery: the tick does nothing */
    int recover_event;   /* a recovery to record in the log once this node leads */
    uint64_t recoveries; /* guarded by mu, like last_recovery_ms */
    uint64_t last_recovery_ms;
};

static uint64_t now_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint64_t now_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---------------------------------------------------------------- options */

int control_enabled(const struct control_cfg *cfg)
{
    return cfg->peers != NULL;
}

static int parse_peers(struct control *c, char *err)
{
    snprintf(c->peers_s, sizeof c->peers_s, "%s", c->cfg.peers);
    char *save = NULL;
    for (char *tok = strtok_r(c->peers_s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *at = strchr(tok, '@');
        char *end;
        unsigned long long id = at ? strtoull(tok, &end, 10) : 0;
        if (!at || end != at || !id || strlen(at + 1) > CL_STR_LEN || !at[1])
            return errmsg_set(err, "--cluster: '%s' is not ID@HOST:PORT", tok);
        if (c->n_peers == CL_MAX_NODES)
            return errmsg_set(err, "--cluster: more than %d peers", CL_MAX_NODES);
        struct sockaddr_in sa;
        if (sconn_parse_addr(at + 1, &sa, err)) return errmsg_prefix(err, "--cluster: ");
        c->peer[c->n_peers].id = id;
        snprintf(c->peer[c->n_peers].addr, sizeof c->peer[0].addr, "%s", at + 1);
        if (id == c->cfg.id) {
            snprintf(c->addr, sizeof c->addr, "%s", at + 1);
            c->bootstrap_member = 1;
        }
        c->n_peers++;
    }
    if (!c->n_peers) return errmsg_set(err, "--cluster: no peers");
    if (!c->bootstrap_member) {
        if (!c->cfg.addr)
            return errmsg_set(err,
                              "--node-id %llu is not in --cluster: give --cluster-addr "
                              "HOST:PORT to join",
                              (unsigned long long)c->cfg.id);
        snprintf(c->addr, sizeof c->addr, "%s", c->cfg.addr);
    }
    return 0;
}

/* The API address other nodes forward requests to. An API bound to every address (the
 * appliance's --host 0.0.0.0) is reached at the host of our control address. */
static void advertise_http(struct control *c)
{
    const char *colon = strrchr(c->http, ':'), *ccolon = strrchr(c->addr, ':');
    if (!colon || !ccolon) return;
    size_t hl = (size_t)(colon - c->http);
    int any = (hl == 7 && !strncmp(c->http, "0.0.0.0", 7)) ||
              (hl == 2 && !strncmp(c->http, "::", 2)) ||
              (hl == 4 && !strncmp(c->http, "[::]", 4)) || hl == 0;
    if (!any) return;
    char port[16];
    snprintf(port, sizeof port, "%s", colon + 1);
    snprintf(c->http, sizeof c->http, "%.*s:%s", (int)(ccolon - c->addr), c->addr, port);
}

/* ---------------------------------------------------------------- the state machine */

static struct control *fsm_control(struct raft_fsm *fsm)
{
    return fsm->data;
}

/* A log entry: u32 length of the command, the command, zeros to a multiple of 8 bytes. raft's
 * libuv I/O lays entries out 8-byte aligned in its batches; entries of other lengths arrived
 * shifted at a node catching up on several entries in one AppendEntries, so every entry is padded
 * here (as dqlite's are) and carries its own length. */
static size_t entry_encode(const struct cl_cmd *cmd, uint8_t *out, size_t cap)
{
    if (cap < 8) return 0;
    size_t n = cl_cmd_encode(out + 4, cap - 4, cmd);
    size_t padded = (4 + n + 7) & ~(size_t)7;
    if (!n || padded > cap) return 0;
    for (int i = 0; i < 4; i++) out[i] = (uint8_t)(n >> (8 * i));
    memset(out + 4 + n, 0, padded - 4 - n);
    return padded;
}

static int entry_decode(struct cl_cmd *cmd, const uint8_t *p, size_t len, char *err)
{
    if (len < 4 || len % 8) return errmsg_set(err, "log entry of %zu bytes: not framed", len);
    size_t n = (size_t)p[0] | (size_t)p[1] << 8 | (size_t)p[2] << 16 | (size_t)p[3] << 24;
    if (n > len - 4 || len - 4 - n >= 8)
        return errmsg_set(err, "log entry of %zu bytes claims a %zu-byte command", len, n);
    return cl_cmd_decode(cmd, p + 4, n, err);
}

static int fsm_apply(struct raft_fsm *fsm, const struct raft_buffer *buf, void **result)
{
    struct control *c = fsm_control(fsm);
    struct cl_cmd cmd;
    char err[ERRMSG_LEN];
    *result = NULL;
    pthread_mutex_lock(&c->mu);
    if (entry_decode(&cmd, buf->base, buf->len, err)) {
        /* Every node rejects the same bytes the same way: the state stays identical. */
        c->st.applied++;
        c->st.rejected++;
        pthread_mutex_unlock(&c->mu);
        log_warn("cluster", "log entry not applied: %s", err);
        return 0;
    }
    cl_state_apply(&c->st, &cmd);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

static int fsm_snapshot(struct raft_fsm *fsm, struct raft_buffer *bufs[], unsigned *n_bufs)
{
    struct control *c = fsm_control(fsm);
    size_t cap = cl_state_encoded_max();
    struct raft_buffer *b = raft_malloc(sizeof *b);
    uint8_t *p = raft_malloc(cap);
    if (!b || !p) {
        raft_free(b);
        raft_free(p);
        return RAFT_NOMEM;
    }
    pthread_mutex_lock(&c->mu);
    size_t n = cl_state_encode(&c->st, p, cap);
    pthread_mutex_unlock(&c->mu);
    b->base = p;
    b->len = n;
    *bufs = b;
    *n_bufs = 1;
    return n ? 0 : RAFT_TOOBIG;
}

static int fsm_restore(struct raft_fsm *fsm, struct raft_buffer *buf)
{
    struct control *c = fsm_control(fsm);
    struct cl_state *s = malloc(sizeof *s);
    char err[ERRMSG_LEN];
    if (!s) return RAFT_NOMEM;
    if (cl_state_decode(s, buf->base, buf->len, err)) {
        log_warn("cluster", "snapshot not restored: %s", err);
        free(s);
        return RAFT_CORRUPT;
    }
    pthread_mutex_lock(&c->mu);
    c->st = *s;
    pthread_mutex_unlock(&c->mu);
    free(s);
    raft_free(buf->base);
    log_info("cluster", "restored a snapshot: %u members, %llu commands applied", c->st.n_members,
             (unsigned long long)c->st.applied);
    return 0;
}

/* ---------------------------------------------------------------- proposing (leader) */

static void proposed(struct raft_apply *req, int status, void *result)
{
    struct proposal *p = req->data;
    struct control *c = p->c;
    (void)result;
    c->inflight--;
    if (status) {
        pthread_mutex_lock(&c->mu);
        c->proposals_failed++;
        pthread_mutex_unlock(&c->mu);
        log_warn("cluster", "proposal not committed: %s", raft_strerror(status));
    }
    free(p);
}

static int propose(struct control *c, struct cl_cmd *cmd)
{
    cmd->t_ms = now_wall_ms();
    uint8_t tmp[CL_CMD_MAX + 8];
    size_t n = entry_encode(cmd, tmp, sizeof tmp);
    struct proposal *p = calloc(1, sizeof *p);
    struct raft_buffer b = {.base = n ? raft_malloc(n) : NULL, .len = n};
    if (!p || !b.base) {
        free(p);
        raft_free(b.base);
        return -1;
    }
    memcpy(b.base, tmp, n);
    p->c = c;
    p->req.data = p;
    int rc = raft_apply(&c->raft, &p->req, &b, 1, proposed);
    if (rc) {
        raft_free(b.base);
        free(p);
        log_warn("cluster", "propose: %s", raft_strerror(rc));
        return -1;
    }
    c->inflight++;
    return 0;
}

/* ---------------------------------------------------------------- reports */

static struct report *report_slot(struct control *c, uint64_t id)
{
    for (int i = 0; i < c->n_rep; i++)
        if (c->rep[i].id == id) return &c->rep[i];
    if (c->n_rep == CL_MAX_NODES) return NULL;
    struct report *r = &c->rep[c->n_rep++];
    memset(r, 0, sizeof *r);
    r->id = id;
    return r;
}

static const struct cl_scaleout *scaleout_of(const struct cl_state *s, uint32_t scale_id)
{
    for (uint32_t i = 0; i < s->n_scaleouts; i++)
        if (s->scaleout[i].scale_id == scale_id) return &s->scaleout[i];
    return NULL;
}

static int scaleout_names(const struct cl_scaleout *so, uint64_t id)
{
    int mine = so->s.node == id;
    for (int k = 0; k < so->s.n_chain; k++) mine |= so->s.chain[k] == id;
    return mine;
}

/* A decision this node refused or failed, for its next reports (mu held). */
static void add_refusal(struct control *c, uint32_t scale_id, const char *why)
{
    for (int i = 0; i < c->n_my_refused; i++)
        if (c->my_refused[i].scale_id == scale_id) return;
    if (c->n_my_refused == CL_MAX_REFUSED) {
        memmove(c->my_refused, c->my_refused + 1, sizeof c->my_refused - sizeof c->my_refused[0]);
        c->n_my_refused--;
    }
    struct cl_refusal *r = &c->my_refused[c->n_my_refused++];
    r->scale_id = scale_id;
    cl_str_printable(r->reason, why && why[0] ? why : "refused");
}

/* This node's report (load from the serving process, holdings from the executor). */
static void own_report(struct control *c, struct cl_msg *m)
{
    memset(m, 0, sizeof *m);
    m->type = MSGC_LOAD;
    struct cl_node_up *n = &m->u.load.node;
    n->id = c->cfg.id;
    snprintf(n->addr, sizeof n->addr, "%s", c->addr);
    snprintf(n->http, sizeof n->http, "%s", c->http);
    snprintf(n->fabric, sizeof n->fabric, "%s", c->fabric);
    snprintf(n->gpu, sizeof n->gpu, "%s", c->gpu);
    snprintf(n->rack, sizeof n->rack, "%s", c->rack);
    n->role = c->bootstrap_member ? ROLE_VOTER : ROLE_JOINER;
    if (c->sv.load) c->sv.load(c->sv.ctx, &m->u.load.load);
    n->tok_s = m->u.load.load.tok_s;
    pthread_mutex_lock(&c->mu);
    m->u.load.n_hold = (uint8_t)c->n_my_hold;
    memcpy(m->u.load.hold, c->my_hold, sizeof c->my_hold);
    /* A refusal is reported until the leader has ended its scale-out (committed). */
    int k = 0;
    for (int i = 0; i < c->n_my_refused; i++)
        if (scaleout_of(&c->st, c->my_refused[i].scale_id)) c->my_refused[k++] = c->my_refused[i];
    c->n_my_refused = k;
    m->u.load.n_refused = (uint8_t)k;
    memcpy(m->u.load.refused, c->my_refused, sizeof c->my_refused);
    pthread_mutex_unlock(&c->mu);
    m->u.load.seen_scales = c->seen_scales;
}

static void store_report(struct control *c, const struct cl_msg *m)
{
    pthread_mutex_lock(&c->mu);
    struct report *r = report_slot(c, m->u.load.node.id);
    if (r) {
        r->at_ms = now_mono_ms();
        r->node = m->u.load.node;
        r->load = m->u.load.load;
        r->n_hold = m->u.load.n_hold;
        r->seen_scales = m->u.load.seen_scales;
        memcpy(r->hold, m->u.load.hold, sizeof r->hold);
        r->n_refused = m->u.load.n_refused;
        memcpy(r->refused, m->u.load.refused, sizeof r->refused);
        c->reports_in++;
    }
    pthread_mutex_unlock(&c->mu);
}

/* ---------------------------------------------------------------- control channel */

static void send_msg(struct sconn *s, const struct cl_msg *m)
{
    static uint8_t buf[CL_CMD_MAX * 4];
    size_t n = cl_msg_encode(buf, sizeof buf, m);
    if (n) sconn_send(s, buf, n);
}

static void on_join_done(struct raft_change *req, int status);

/* A change of raft's configuration, recorded in the log so /v1/cluster shows when it happened. */
static void conf_event(struct control *c, uint64_t id, int change)
{
    if (c->stopping || raft_state(&c->raft) != RAFT_LEADER) return;
    struct cl_cmd cmd = {.type = CMD_RAFT_CONF};
    cmd.u.conf.node = id;
    cmd.u.conf.change = (uint8_t)change;
    propose(c, &cmd);
}

struct join_req {
    struct raft_change req;
    struct control *c;
    uint64_t id;
    int assigned;
};

static void start_join(struct control *c, uint64_t id, const char *addr)
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
        conf_event(c, j->id, CONF_VOTER);
    }
    free(j);
}

/* A message on a control connection someone opened to us. */
static void ctl_in_msg(struct sconn *s, const uint8_t *buf, size_t len)
{
    struct control *c = s->data;
    struct cl_msg m, r;
    char err[ERRMSG_LEN];
    if (cl_msg_decode(&m, buf, len, err)) {
        log_warn("cluster", "%s: %s", s->peer, err);
        return sconn_close(s, "bad control message");
    }
    int leader = raft_state(&c->raft) == RAFT_LEADER;
    switch (m.type) {
    case MSGC_LOAD: {
        if (!leader) break;
        store_report(c, &m);
        /* Every node routes requests: it gets the others' loads back. */
        r = (struct cl_msg){.type = MSGC_LOADS};
        pthread_mutex_lock(&c->mu);
        uint64_t now = now_mono_ms();
        for (int i = 0; i < c->n_rep && r.u.loads.n < CL_MAX_LOADS; i++) {
            const struct report *p = &c->rep[i];
            if (p->id == m.u.load.node.id || now - p->at_ms > (uint64_t)c->cfg.dead_ms) continue;
            r.u.loads.id[r.u.loads.n] = p->id;
            r.u.loads.age_ms[r.u.loads.n] = (uint32_t)(now - p->at_ms);
            r.u.loads.load[r.u.loads.n++] = p->load;
        }
        pthread_mutex_unlock(&c->mu);
        send_msg(s, &r);
        break;
    }
    case MSGC_JOIN:
        memset(&r, 0, sizeof r);
        r.type = MSGC_REDIRECT;
        if (leader) {
            start_join(c, m.u.join.id, m.u.join.addr);
        } else {
            raft_id lid;
            const char *laddr;
            raft_leader(&c->raft, &lid, &laddr);
            r.u.redirect.status = 1;
            snprintf(r.u.redirect.addr, sizeof r.u.redirect.addr, "%s", laddr ? laddr : "");
        }
        send_msg(s, &r);
        break;
    case MSGC_STATE_REQ: {
        size_t cap = cl_state_encoded_max();
        uint8_t *snap = malloc(cap), *out = malloc(cap + 16);
        if (snap && out) {
            pthread_mutex_lock(&c->mu);
            size_t n = cl_state_encode(&c->st, snap, cap);
            pthread_mutex_unlock(&c->mu);
            r = (struct cl_msg){.type = MSGC_STATE};
            r.u.state.p = snap;
            r.u.state.len = (uint32_t)n;
            size_t k = cl_msg_encode(out, cap + 16, &r);
            if (k) sconn_send(s, out, k);
        }
        free(snap);
        free(out);
        break;
    }
    default:
        sconn_close(s, "unexpected control message");
    }
}

static void on_ctl(void *ctx, struct sconn *s, uint64_t id, const char *addr)
{
    (void)id, (void)addr;
    s->data = ctx;
    s->cb.on_msg = ctl_in_msg;
}

/* A member forwards an API request: the channel becomes a connection of our front. */
static void on_fwd(void *ctx, struct sconn *s, uint64_t id, const char *addr)
{
    struct control *c = ctx;
    char err[ERRMSG_LEN];
    (void)addr;
    if (c->stopping || !c->sv.forward_in) return sconn_close(s, "no front to forward to");
    int fd = fwd_channels_accept(s, err);
    if (fd < 0) {
        log_warn("cluster", "forward channel from node %llu: %s", (unsigned long long)id, err);
        return;
    }
    c->sv.forward_in(c->sv.ctx, fd, id);
}

int control_forward_open(struct control *c, uint64_t node, int timeout_ms, int cancel_fd, char *err)
{
    char addr[CL_STR_LEN + 1] = "";
    pthread_mutex_lock(&c->mu);
    const struct cl_member *m = cl_state_member_c(&c->st, node);
    if (m) snprintf(addr, sizeof addr, "%s", m->info.addr);
    pthread_mutex_unlock(&c->mu);
    if (!addr[0])
        return errmsg_set(err, "node %llu has no control address in the cluster's state",
                          (unsigned long long)node);
    return fwd_channels_open(c->fwd, node, addr, timeout_ms, cancel_fd, err);
}

static void on_refused(void *ctx, const char *peer, const char *why, int timed_out)
{
    struct control *c = ctx;
    pthread_mutex_lock(&c->mu);
    c->refused++;
    c->handshake_timeouts += timed_out != 0;
    pthread_mutex_unlock(&c->mu);
    log_warn("cluster", "connection from %s refused: %s", peer, why);
}

/* Our outgoing control connection (to the leader, or to a peer for a JOIN). */
static void out_ready(struct sconn *s, int status, const char *why)
{
    struct control *c = s->data;
    if (status) {
        log_warn("cluster", "control connection to %s: %s", s->peer, why);
        return;
    }
    struct cl_msg m = {.type = MSGC_OPEN};
    m.u.open.channel = CHAN_CTL;
    m.u.open.id = c->cfg.id;
    snprintf(m.u.open.addr, sizeof m.u.open.addr, "%s", c->addr);
    send_msg(s, &m);
    if (s == c->ctl) {
        c->ctl_open = 1;
    } else if (s == c->join) {
        m = (struct cl_msg){.type = MSGC_JOIN};
        m.u.join.id = c->cfg.id;
        snprintf(m.u.join.addr, sizeof m.u.join.addr, "%s", c->addr);
        send_msg(s, &m);
    }
}

static void out_msg(struct sconn *s, const uint8_t *buf, size_t len)
{
    struct control *c = s->data;
    struct cl_msg m;
    char err[ERRMSG_LEN];
    if (cl_msg_decode(&m, buf, len, err)) {
        log_warn("cluster", "%s: %s", s->peer, err);
        return;
    }
    if (m.type == MSGC_LOADS && s == c->ctl) {
        pthread_mutex_lock(&c->mu);
        uint64_t now = now_mono_ms();
        c->n_relayed = 0;
        for (int i = 0; i < m.u.loads.n && c->n_relayed < CL_MAX_NODES; i++) {
            if (m.u.loads.id[i] == c->cfg.id) continue;
            c->relayed[c->n_relayed].id = m.u.loads.id[i];
            c->relayed[c->n_relayed].at_ms = now - m.u.loads.age_ms[i];
            c->relayed[c->n_relayed++].load = m.u.loads.load[i];
        }
        pthread_mutex_unlock(&c->mu);
        return;
    }
    if (m.type != MSGC_REDIRECT || s != c->join) return;
    if (m.u.redirect.status == 0) {
        log_info("cluster", "join accepted by %s", s->peer);
    } else if (m.u.redirect.status == 1 && m.u.redirect.addr[0]) {
        /* Ask the leader next (it may be a node that joined after --cluster was written). */
        snprintf(c->join_to, sizeof c->join_to, "%s", m.u.redirect.addr);
    }
    sconn_close(s, "join answered");
}

static void out_closed(struct sconn *s, const char *why)
{
    struct control *c = s->data;
    (void)why;
    if (s == c->ctl) {
        c->ctl = NULL;
        c->ctl_open = 0;
    }
    if (s == c->join) c->join = NULL;
}

static struct sconn *connect_out(struct control *c, const char *addr)
{
    struct sconn_cbs cbs = {.on_ready = out_ready, .on_msg = out_msg, .on_close = out_closed};
    char err[ERRMSG_LEN];
    struct sconn *s = sconn_connect(&c->loop, &c->key, addr, &cbs, c, err);
    if (!s) log_warn("cluster", "%s", err);
    return s;
}

/* ---------------------------------------------------------------- each heartbeat */

static void send_report(struct control *c)
{
    struct cl_msg m;
    own_report(c, &m);
    raft_id lid = 0;
    const char *laddr = NULL;
    raft_leader(&c->raft, &lid, &laddr);
    /* Every node keeps its own report (its /v1/cluster shows its load). */
    store_report(c, &m);
    if (!lid || lid == c->cfg.id || !laddr) return;
    if (c->ctl && c->ctl_leader != lid) {
        sconn_close(c->ctl, "the leader changed");
        c->ctl = NULL;
        c->ctl_open = 0;
    }
    if (!c->ctl) {
        c->ctl_leader = lid;
        c->ctl = connect_out(c, laddr);
        return;
    }
    if (c->ctl_open) send_msg(c->ctl, &m);
}

/* Ask a peer to add us (it redirects to the leader, which runs raft_add and assign VOTER).
 * force: even though our own configuration lists us as a voter. A node the leader removed while
 * it was away still holds the configuration it had: only the silence tells it (no leader
 * replicates to a server outside the configuration). */
static void join_tick(struct control *c, int force)
{
    c->in_config = 0;
    for (unsigned i = 0; i < c->raft.configuration.n; i++)
        if (c->raft.configuration.servers[i].id == c->cfg.id &&
            c->raft.configuration.servers[i].role == RAFT_VOTER)
            c->in_config = 1;
    if ((c->in_config && !force) || c->join) return;
    if (c->join_to[0]) {
        c->join = connect_out(c, c->join_to);
        c->join_to[0] = 0;
        return;
    }
    for (int tries = 0; tries < c->n_peers; tries++) {
        const struct peer *p = &c->peer[c->join_next % c->n_peers];
        c->join_next = (c->join_next + 1) % c->n_peers;
        if (p->id == c->cfg.id) continue;
        c->join = connect_out(c, p->addr);
        return;
    }
}

/* A bootstrap member that has known no leader for 20 heartbeats (4 election timeouts: an
 * election normally ends within 2) may have been removed while it was down: it asks to join,
 * at most once per election timeout. A voter of a cluster that lost its quorum asks too; the
 * answer is "no leader" and nothing changes. */
static void rejoin_tick(struct control *c, uint64_t now, int leader_known)
{
    uint64_t h = (uint64_t)c->cfg.heartbeat_ms;
    if (leader_known || !c->leader_seen) {
        c->leader_seen = now;
        c->join_last = 0;
        return;
    }
    if (now - c->leader_seen < 20 * h || now - c->join_last < 5 * h) return;
    if (!c->join_last)
        log_info("cluster", "no leader for %llu ms: asking the peers to (re)join",
                 (unsigned long long)(now - c->leader_seen));
    c->join_last = now;
    join_tick(c, 1);
}

/* ---------------------------------------------------------------- raft's configuration (leader) */

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
        conf_event(c, q->id, q->kind == VP_REMOVE ? CONF_REMOVED : CONF_VOTER);
    }
    free(q);
}

/* One change at a time, none while raft has one uncommitted or a promotion running (a join's),
 * and, like every decision, only on a state that applied everything proposed (the raft_voter
 * event of a node that just rejoined, say). */
static void conf_tick(struct control *c)
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

static int exec_done(struct control *c, uint32_t id)
{
    for (int i = 0; i < c->n_executed; i++)
        if (c->executed[i] == id) return 1;
    if (c->n_executed == CTL_MAX_EXECUTED) {
        memmove(c->executed, c->executed + 1, sizeof c->executed - sizeof c->executed[0]);
        c->n_executed--;
    }
    c->executed[c->n_executed++] = id;
    return 0;
}

/* Carry out committed decisions that name this node. Scale-outs in progress are re-run after a
 * restart (the work was lost with the process); scale-downs only if decided after we started. */
static void exec_tick(struct control *c)
{
    char err[ERRMSG_LEN];
    struct cl_scaleout todo[CL_MAX_SCALEOUTS];
    struct cl_event ev[CL_MAX_EVENTS];
    int n_todo = 0, n_ev = 0;
    pthread_mutex_lock(&c->mu);
    for (uint32_t i = 0; i < c->st.n_scaleouts; i++) todo[n_todo++] = c->st.scaleout[i];
    uint32_t first = c->st.n_events > CL_MAX_EVENTS ? c->st.n_events - CL_MAX_EVENTS : 0;
    if (c->events_seen > first) first = c->events_seen;
    for (uint32_t i = first; i < c->st.n_events; i++) ev[n_ev++] = c->st.event[i % CL_MAX_EVENTS];
    /* Never backwards: after a recovery the state is rebuilt from the log, and the events it
     * replays were carried out already. */
    if (c->st.n_events > c->events_seen) c->events_seen = c->st.n_events;
    uint32_t n_scales = c->st.n_scales;
    pthread_mutex_unlock(&c->mu);

    for (int i = 0; i < n_todo; i++) {
        const struct cl_scale *s = &todo[i].s;
        if (!scaleout_names(&todo[i], c->cfg.id) || exec_done(c, todo[i].scale_id)) continue;
        int rc = 0;
        if (s->kind == SCALE_UP && c->ex.scale_up)
            rc = c->ex.scale_up(c->ex.ctx, s->model, s->source, s->chain, s->n_chain, err);
        else if (s->kind == SCALE_REPLICATE && c->ex.replicate)
            rc = c->ex.replicate(c->ex.ctx, s->model, s->source, err);
        if (rc) {
            /* The leader hears it with the next report and abandons the scale-out. */
            log_warn("cluster", "refused decision %u (%s of %s from node %llu): %s",
                     todo[i].scale_id, s->kind == SCALE_UP ? "scale-up" : "replication", s->model,
                     (unsigned long long)s->source, err);
            pthread_mutex_lock(&c->mu);
            add_refusal(c, todo[i].scale_id, err);
            pthread_mutex_unlock(&c->mu);
            continue;
        }
        log_info("cluster", "executing %s of %s from node %llu",
                 s->kind == SCALE_UP ? "scale-up" : "replication", s->model,
                 (unsigned long long)s->source);
    }
    for (int i = 0; i < n_ev; i++) {
        const struct cl_event *e = &ev[i];
        if (e->type != CMD_SCALE || e->node != c->cfg.id || e->t_ms < c->start_wall) continue;
        int rc = 0;
        if (e->kind == SCALE_DOWN && c->ex.scale_down)
            rc = c->ex.scale_down(c->ex.ctx, e->model, err);
        else if (e->kind == SCALE_DROP_HOST && c->ex.drop_host)
            rc = c->ex.drop_host(c->ex.ctx, e->model, err);
        else
            continue;
        log_info("cluster", "executing %s of %s%s%s",
                 e->kind == SCALE_DOWN ? "scale-down" : "host-copy drop", e->model, rc ? ": " : "",
                 rc ? err : "");
    }
    c->seen_scales = n_scales;
}

/* ---------------------------------------------------------------- the leader's decisions */

static int hold_differs(const struct cl_hold *h, const struct cl_holding *r)
{
    return h->host != r->host || h->engine != r->engine ||
           h->layers_resident != r->layers_resident || h->n_layers != r->n_layers;
}

/* Membership and holdings from the reports; returns how many commands it proposed. */
static int leader_membership(struct control *c, uint64_t now)
{
    struct cl_cmd cmd[CL_MAX_NODES * 2];
    int n = 0;
    pthread_mutex_lock(&c->mu);
    for (uint32_t i = 0; i < c->st.n_members; i++) {
        const struct cl_member *m = &c->st.member[i];
        struct report *r = NULL;
        for (int k = 0; k < c->n_rep; k++)
            if (c->rep[k].id == m->info.id) r = &c->rep[k];
        uint64_t last = r ? r->at_ms : 0;
        if (last < c->leader_since) last = c->leader_since;
        if (m->alive && now - last > (uint64_t)c->cfg.dead_ms) {
            cmd[n] = (struct cl_cmd){.type = CMD_NODE_DOWN};
            cmd[n++].u.down = m->info.id;
            log_warn("cluster", "node %llu silent for %llu ms: down",
                     (unsigned long long)m->info.id, (unsigned long long)(now - last));
        }
    }
    for (int k = 0; k < c->n_rep && n < CL_MAX_NODES * 2 - 1; k++) {
        const struct report *r = &c->rep[k];
        if (now - r->at_ms > (uint64_t)c->cfg.dead_ms) continue;
        const struct cl_member *m = cl_state_member_c(&c->st, r->id);
        int tok_changed = m && (r->node.tok_s > 1.2f * m->info.tok_s + 1 ||
                                r->node.tok_s < 0.8f * m->info.tok_s - 1);
        if (!m || !m->alive || tok_changed || strcmp(m->info.http, r->node.http) ||
            strcmp(m->info.addr, r->node.addr) || strcmp(m->info.fabric, r->node.fabric) ||
            strcmp(m->info.rack, r->node.rack)) {
            cmd[n] = (struct cl_cmd){.type = CMD_NODE_UP};
            cmd[n++].u.up = r->node;
            continue; /* holdings once it is a member */
        }
        /* A node that has not yet acted on the latest decisions may report stale holdings. */
        if (r->seen_scales < c->st.n_scales) continue;
        for (int h = 0; h < r->n_hold && n < CL_MAX_NODES * 2; h++) {
            int mi = cl_state_model(&c->st, r->hold[h].model);
            if (mi >= 0 && !hold_differs(&m->hold[mi], &r->hold[h])) continue;
            cmd[n] = (struct cl_cmd){.type = CMD_HOLDING};
            cmd[n++].u.hold = r->hold[h];
            break; /* one per node per tick */
        }
    }
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < n; i++) propose(c, &cmd[i]);
    return n;
}

/* Scale-outs whose joiners all serve alone (or that lost their source or a joiner, or whose joiner
 * refused) end. */
/* A report's refusal of scale-out scale_id, or NULL (mu held). */
static const char *refusal_of(struct control *c, uint64_t node, uint32_t scale_id)
{
    for (int k = 0; k < c->n_rep; k++) {
        if (c->rep[k].id != node) continue;
        for (int j = 0; j < c->rep[k].n_refused; j++)
            if (c->rep[k].refused[j].scale_id == scale_id) return c->rep[k].refused[j].reason;
    }
    return NULL;
}

static void refuser_add(struct control *c, uint64_t node, const char *model, uint64_t now)
{
    struct refuser *r = NULL;
    for (int i = 0; i < c->n_refusers && !r; i++)
        if (c->refuser[i].node == node && !strcmp(c->refuser[i].model, model)) r = &c->refuser[i];
    for (int i = 0; i < c->n_refusers && !r; i++)
        if (c->refuser[i].until <= now) r = &c->refuser[i];
    if (!r && c->n_refusers < CTL_MAX_REFUSERS) r = &c->refuser[c->n_refusers++];
    if (!r) r = &c->refuser[0];
    r->node = node;
    r->until = now + 2 * (uint64_t)c->cfg.dead_ms;
    snprintf(r->model, sizeof r->model, "%s", model);
}

static int leader_scaleouts(struct control *c)
{
    struct cl_cmd cmd[CL_MAX_SCALEOUTS];
    int n = 0;
    uint64_t now = now_mono_ms();
    pthread_mutex_lock(&c->mu);
    for (uint32_t i = 0; i < c->st.n_scaleouts; i++) {
        const struct cl_scaleout *so = &c->st.scaleout[i];
        int mi = cl_state_model(&c->st, so->s.model), done = mi >= 0, lost = 0;
        uint64_t who = 0; /* the node that refused or failed it */
        char why[CL_STR_LEN + 1] = "";
        const struct cl_member *src = cl_state_member_c(&c->st, so->s.source);
        if (so->s.source && (!src || !src->alive)) {
            lost = 1;
            snprintf(why, sizeof why, "source node %llu is down", (unsigned long long)so->s.source);
        }
        /* A copy that never finishes (a stream stuck below its pacing, a target that stopped
         * reporting its refusal) must not hold the model's host-copy decisions forever. */
        if (now_wall_ms() > so->started_ms + (uint64_t)c->cfg.scaleout_timeout_ms) {
            if (!lost) {
                log_warn("cluster", "scale-out %u of %s: not done after %d ms: abandoned",
                         so->scale_id, so->s.model, c->cfg.scaleout_timeout_ms);
                snprintf(why, sizeof why, "not done after %d ms", c->cfg.scaleout_timeout_ms);
            }
            lost = 1;
        }
        uint64_t targets[CL_MAX_CHAIN + 1];
        int nt = 0;
        if (so->s.kind == SCALE_UP)
            for (int k = 0; k < so->s.n_chain; k++) targets[nt++] = so->s.chain[k];
        else
            targets[nt++] = so->s.node;
        for (int k = 0; k < nt && mi >= 0; k++) {
            const struct cl_member *m = cl_state_member_c(&c->st, targets[k]);
            if (!m || !m->alive) {
                if (!lost) {
                    who = targets[k];
                    snprintf(why, sizeof why, "node %llu is down", (unsigned long long)who);
                }
                lost = 1;
                continue;
            }
            /* The target refused the decision or its work failed, and says so in its report:
             * abandoned now, and the planner leaves that node out for this model. */
            const char *refused = refusal_of(c, targets[k], so->scale_id);
            if (refused) {
                if (!lost || !who) {
                    who = targets[k];
                    snprintf(why, sizeof why, "%s", refused);
                }
                lost = 1;
                refuser_add(c, targets[k], so->s.model, now);
                log_warn("cluster", "node %llu refused decision %u (%s of %s): %s: abandoned",
                         (unsigned long long)targets[k], so->scale_id,
                         so->s.kind == SCALE_UP ? "scale-up" : "replication", so->s.model, refused);
                continue;
            }
            const struct cl_hold *h = &m->hold[mi];
            /* The decision set the joiner's engine; its own report took it back: it refused or
             * its join failed (its log says why). The planner decides again. */
            if (so->s.kind == SCALE_UP && !h->engine) {
                if (!lost) {
                    who = targets[k];
                    snprintf(why, sizeof why, "node %llu took it out of its engine",
                             (unsigned long long)who);
                }
                lost = 1;
            }
            if (so->s.kind == SCALE_UP
                    ? !(h->engine && h->layers_resident == h->n_layers && h->n_layers)
                    : !h->host)
                done = 0;
        }
        if (done || lost) {
            cmd[n] = (struct cl_cmd){.type = CMD_SCALE_DONE};
            cmd[n].u.done.scale_id = so->scale_id;
            cmd[n].u.done.ok = !lost;
            if (lost) {
                cmd[n].u.done.node = who;
                cl_str_printable(cmd[n].u.done.reason, why[0] ? why : "abandoned");
            }
            n++;
        }
    }
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < n; i++) propose(c, &cmd[i]);
    return n;
}

/* The planner's view: the committed state plus the latest reports. */
struct view_buf {
    struct plan_node node[CL_MAX_NODES];
    struct plan_model model[CL_MAX_MODELS];
    struct plan_scaleout so[CL_MAX_SCALEOUTS];
    char gpu[CL_MAX_NODES][CL_STR_LEN + 1];
    double tput[CL_MAX_NODES * CL_MAX_MODELS];
    struct step_model step[CL_MAX_NODES * CL_MAX_MODELS];
    struct plan_view v;
};

static int gpu_index(struct view_buf *vb, const char *gpu)
{
    for (int i = 0; i < vb->v.n_gpu_types; i++)
        if (!strcmp(vb->gpu[i], gpu)) return i;
    snprintf(vb->gpu[vb->v.n_gpu_types], sizeof vb->gpu[0], "%s", gpu);
    return vb->v.n_gpu_types++;
}

static void build_view(struct control *c, struct view_buf *vb, uint64_t now_mono)
{
    const struct cl_state *s = &c->st;
    memset(vb, 0, sizeof *vb);
    struct plan_view *v = &vb->v;
    v->now_ms = (double)now_wall_ms();
    v->n_models = (int)s->n_models;
    for (uint32_t m = 0; m < s->n_models; m++) {
        struct plan_model *pm = &vb->model[m];
        pm->layers = 1;
        for (uint32_t i = 0; i < s->n_members; i++)
            if (s->member[i].hold[m].n_layers) pm->layers = s->member[i].hold[m].n_layers;
        pm->bytes = !strcmp(s->model[m], c->model) ? c->cfg.model_bytes : 0;
        pm->ttft_slo_ms = c->cfg.ttft_slo_ms;
        pm->tpot_slo_ms = 0;
        pm->replicas_cached = c->cfg.replicas_cached;
        pm->keep_alive_ms = c->cfg.keep_alive_ms;
    }
    for (uint32_t i = 0; i < s->n_members; i++) {
        const struct cl_member *m = &s->member[i];
        struct plan_node *pn = &vb->node[v->n_nodes++];
        pn->id = (int)m->info.id;
        pn->alive = m->alive;
        pn->gpu_type = gpu_index(vb, m->info.gpu);
        pn->domain = (int)m->info.id;
        /* Racks by name: the index of the first member in the same rack ("" is one rack too). */
        for (uint32_t k = 0; k <= i; k++)
            if (!strcmp(s->member[k].info.rack, m->info.rack)) {
                pn->rack = (int)k;
                break;
            }
        pn->link_Bps = 1.25e9;
        pn->fail_prob = 0.01;
        pn->model_slots = 1; /* the serving process holds one model (docs/control.md) */
        for (int k = 0; k < c->n_refusers; k++) {
            int rm = cl_state_model(s, c->refuser[k].model);
            if (c->refuser[k].node == m->info.id && rm >= 0 && c->refuser[k].until > now_mono)
                pn->refused |= 1ull << rm;
        }
        pn->engine_model = -1;
        pn->helper = -1;
        for (uint32_t k = 0; k < s->n_models; k++) {
            if (m->hold[k].host) pn->host_cached |= 1ull << k;
            if (m->hold[k].engine && pn->engine_model < 0) {
                pn->engine_model = (int)k;
                pn->layers_resident = m->hold[k].layers_resident;
            }
        }
        for (uint32_t k = 0; k < s->n_scaleouts; k++) {
            const struct cl_scale *sc = &s->scaleout[k].s;
            if ((int)sc->source == pn->id) pn->sources_busy++;
            for (int j = 0; j < sc->n_chain; j++)
                if (sc->chain[j] == m->info.id && pn->layers_resident < vb->model[0].layers)
                    pn->helper = (int)sc->source;
        }
        pn->load.idle_since_ms = -1;
        /* Its own report (the leader has everyone's), else the copy the leader relayed. */
        const struct cl_load *ld = NULL;
        for (int k = 0; k < c->n_rep && !ld; k++)
            if (c->rep[k].id == m->info.id &&
                now_mono - c->rep[k].at_ms <= (uint64_t)c->cfg.dead_ms)
                ld = &c->rep[k].load;
        for (int k = 0; k < c->n_relayed && !ld; k++)
            if (c->relayed[k].id == m->info.id &&
                now_mono - c->relayed[k].at_ms <= (uint64_t)c->cfg.dead_ms)
                ld = &c->relayed[k].load;
        if (!ld) continue;
        pn->load.queue_len = ld->queue_len;
        pn->load.queued_tokens = (long)ld->queued_tokens;
        pn->load.running_seqs = ld->running;
        pn->load.kv_used = ld->kv_used;
        pn->load.idle_since_ms = ld->idle_ms >= 0 ? v->now_ms - ld->idle_ms : -1;
        /* Requests the node took while its route found no replica wait for one: the planner
         * counts them as held (a cold start). Not the rest of its queue: what a host copy runs
         * because it was sent there (routed while it was a replica) waits for nothing. */
        if (ld->held > 0) {
            int hm = cl_state_model(s, ld->held_model);
            if (hm < 0 && s->n_models == 1) hm = 0; /* "the model" of a one-model cluster */
            if (hm >= 0) {
                vb->model[hm].held += ld->held;
                vb->model[hm].held_tokens += (long)ld->held_tokens;
            }
        }
        if (pn->engine_model >= 0) {
            int cell = pn->gpu_type * CL_MAX_MODELS + pn->engine_model;
            if (ld->tok_s > vb->tput[cell]) vb->tput[cell] = ld->tok_s;
            if (ld->step_a > 0 || ld->step_c > 0)
                vb->step[cell] =
                    (struct step_model){ld->step_a, ld->step_b, ld->step_c, ld->step_corr};
        }
    }
    /* The matrix as the planner indexes it: [gpu_type * n_models + m]. */
    static double tput[CL_MAX_NODES * CL_MAX_MODELS];
    static struct step_model step[CL_MAX_NODES * CL_MAX_MODELS];
    for (int g = 0; g < v->n_gpu_types; g++)
        for (int m = 0; m < v->n_models; m++) {
            tput[g * v->n_models + m] = vb->tput[g * CL_MAX_MODELS + m];
            step[g * v->n_models + m] = vb->step[g * CL_MAX_MODELS + m];
        }
    memcpy(vb->tput, tput, sizeof tput);
    memcpy(vb->step, step, sizeof step);
    for (uint32_t k = 0; k < s->n_scaleouts; k++) {
        const struct cl_scaleout *so = &s->scaleout[k];
        struct plan_scaleout *ps = &vb->so[v->n_scaleouts++];
        ps->kind = so->s.kind == SCALE_UP ? PLAN_SO_ENGINE : PLAN_SO_HOST;
        ps->model = cl_state_model(s, so->s.model);
        ps->source = (int)so->s.source;
        ps->n_chain = so->s.n_chain;
        for (int j = 0; j < so->s.n_chain; j++) ps->chain[j] = (int)so->s.chain[j];
        if (so->s.kind != SCALE_UP) ps->chain[ps->n_chain++] = (int)so->s.node;
        ps->started_ms = (double)so->started_ms;
    }
    v->nodes = vb->node;
    v->models = vb->model;
    v->scaleouts = vb->so;
    v->tput = vb->tput;
    v->step = vb->step;
}

static int leader_plan(struct control *c, uint64_t now_mono)
{
    static struct view_buf vb;
    static struct plan_action act[16];
    struct plan_config pc;
    char err[ERRMSG_LEN];
    plan_config_default(&pc);
    pthread_mutex_lock(&c->mu);
    build_view(c, &vb, now_mono);
    int n = vb.v.n_models ? planner_step(&pc, &vb.v, act, 16, err) : 0;
    struct cl_cmd cmd[16];
    int nc = 0;
    for (int i = 0; i < n; i++) {
        const struct plan_action *a = &act[i];
        if (a->model < 0 || a->model >= (int)c->st.n_models) continue;
        struct cl_cmd *k = &cmd[nc++];
        *k = (struct cl_cmd){.type = CMD_SCALE};
        k->u.scale.kind = a->kind == PLAN_SCALE_UP         ? SCALE_UP
                          : a->kind == PLAN_SCALE_DOWN     ? SCALE_DOWN
                          : a->kind == PLAN_REPLICATE_HOST ? SCALE_REPLICATE
                                                           : SCALE_DROP_HOST;
        snprintf(k->u.scale.model, sizeof k->u.scale.model, "%s", c->st.model[a->model]);
        k->u.scale.source = a->source > 0 ? (uint64_t)a->source : 0;
        k->u.scale.node = (uint64_t)a->node;
        for (int j = 0; j < a->n_chain && j < CL_MAX_CHAIN; j++)
            k->u.scale.chain[k->u.scale.n_chain++] = (uint64_t)a->chain[j];
        c->decisions++;
    }
    pthread_mutex_unlock(&c->mu);
    if (n < 0) log_warn("cluster", "planner: %s", err);
    for (int i = 0; i < nc; i++) {
        const struct cl_scale *s = &cmd[i].u.scale;
        log_info("cluster", "decision: %s %s on node %llu (source %llu)",
                 s->kind == SCALE_UP          ? "scale up"
                 : s->kind == SCALE_DOWN      ? "scale down"
                 : s->kind == SCALE_REPLICATE ? "replicate"
                                              : "drop host copy",
                 s->model, (unsigned long long)s->node, (unsigned long long)s->source);
        propose(c, &cmd[i]);
    }
    return nc;
}

static int member_index(const struct cl_state *s, uint64_t id)
{
    const struct cl_member *m = cl_state_member_c(s, id);
    return m ? (int)(m - s->member) : -1;
}

int control_route(struct control *c, const char *model, int prompt_tokens, char *http_out,
                  size_t cap, uint64_t *node, char *err)
{
    struct view_buf *vb = malloc(sizeof *vb);
    if (!vb) return errmsg_set(err, "route: out of memory");
    struct plan_config pc;
    plan_config_default(&pc);
    struct plan_route rt = {.node = -1};
    int rc = 0;
    *node = 0;
    snprintf(http_out, cap, "none");
    pthread_mutex_lock(&c->mu);
    const struct cl_state *s = &c->st;
    int mi = model && model[0] ? cl_state_model(s, model) : -1;
    if (mi < 0 && c->model[0]) mi = cl_state_model(s, c->model);
    if (mi < 0 && s->n_models == 1) mi = 0;
    if (mi >= 0) {
        build_view(c, vb, now_mono_ms());
        /* What we relayed and is still in flight there, beyond what that node last reported
         * (a follower has no one's report but its own): queued work of that size. */
        for (int i = 0; i < vb->v.n_nodes; i++) {
            struct plan_node *pn = &vb->node[i];
            int k = member_index(s, (uint64_t)pn->id);
            int o = k >= 0 ? c->outstanding[k] : 0,
                have = pn->load.queue_len + pn->load.running_seqs;
            if (k >= 0 && c->suspect_until[k] > now_mono_ms()) pn->alive = 0;
            if ((uint64_t)pn->id == c->cfg.id || o <= have) continue;
            pn->load.queue_len += o - have;
            pn->load.queued_tokens += (long)(o - have) * (prompt_tokens > 16 ? prompt_tokens : 16);
            pn->load.idle_since_ms = -1;
        }
        rc = planner_route(&pc, &vb->v, mi, prompt_tokens, &rt, err);
    }
    if (!rc && rt.node >= 0) {
        /* Equal predictions: serve here rather than pay a hop. */
        for (int i = 0; i < vb->v.n_nodes; i++) {
            const struct plan_node *pn = &vb->node[i];
            if ((uint64_t)pn->id != c->cfg.id || !pn->alive || pn->engine_model != mi) continue;
            if (planner_predict_ttft_ms(&pc, &vb->v, pn, mi, prompt_tokens) <= rt.predicted_ttft_ms)
                rt.node = pn->id;
        }
        const struct cl_member *m = cl_state_member_c(s, (uint64_t)rt.node);
        if ((uint64_t)rt.node == c->cfg.id) {
            snprintf(http_out, cap, "local");
            *node = c->cfg.id;
        } else if (m && m->info.http[0]) {
            snprintf(http_out, cap, "%s", m->info.http);
            *node = (uint64_t)rt.node;
        }
    }
    pthread_mutex_unlock(&c->mu);
    free(vb);
    return rc;
}

void control_routed(struct control *c, uint64_t node, int delta)
{
    pthread_mutex_lock(&c->mu);
    int k = member_index(&c->st, node);
    if (k >= 0) {
        c->outstanding[k] += delta;
        if (c->outstanding[k] < 0) c->outstanding[k] = 0;
    }
    pthread_mutex_unlock(&c->mu);
}

void control_unreachable(struct control *c, uint64_t node)
{
    pthread_mutex_lock(&c->mu);
    int k = member_index(&c->st, node);
    if (k >= 0) c->suspect_until[k] = now_mono_ms() + (uint64_t)c->cfg.dead_ms;
    pthread_mutex_unlock(&c->mu);
}

static void leader_tick(struct control *c)
{
    uint64_t now = now_mono_ms();
    if (c->inflight) return; /* one batch at a time: decide on what committed */
    if (raft_last_applied(&c->raft) < raft_last_index(&c->raft)) return;
    if (leader_membership(c, now)) return;
    if (leader_scaleouts(c)) return;
    leader_plan(c, now);
}

static void publish(struct control *c)
{
    raft_id lid = 0;
    const char *laddr = NULL;
    raft_leader(&c->raft, &lid, &laddr);
    pthread_mutex_lock(&c->mu);
    c->raft_state = raft_state(&c->raft);
    c->leader_id = lid;
    snprintf(c->leader_addr, sizeof c->leader_addr, "%s", laddr ? laddr : "");
    c->term = c->raft.current_term;
    c->commit_index = c->raft.commit_index;
    c->applied_index = raft_last_applied(&c->raft);
    c->last_index = raft_last_index(&c->raft);
    c->n_conf = 0;
    for (unsigned i = 0; i < c->raft.configuration.n && c->n_conf < CL_MAX_NODES; i++)
        c->conf[c->n_conf++] =
            (struct vp_server){.id = c->raft.configuration.servers[i].id,
                               .voter = c->raft.configuration.servers[i].role == RAFT_VOTER};
    pthread_mutex_unlock(&c->mu);
}

/* The other voters a recovery named, one change at a time: raft_add and assign VOTER, the join
 * path (a live node catches up from our log and counts; a dead one stays a non-voter until it
 * comes back, and we still commit alone meanwhile). 1 when it started one. */
static int recover_add_tick(struct control *c)
{
    if (!c->n_recover_add || c->conf_busy || c->raft.configuration_uncommitted_index ||
        c->raft.leader_state.change || c->raft.leader_state.promotee_id)
        return 0;
    struct peer p = c->recover_add[--c->n_recover_add];
    log_info("cluster", "node %llu was named in the recovery: adding it back as a voter",
             (unsigned long long)p.id);
    start_join(c, p.id, p.addr);
    return 1;
}

static void on_tick(uv_timer_t *t)
{
    struct control *c = t->data;
    if (c->stopping || c->recovering) return;
    publish(c);
    int leader = raft_state(&c->raft) == RAFT_LEADER;
    if (leader && !c->was_leader) {
        c->leader_since = now_mono_ms();
        c->leader_since_wall = now_wall_ms();
        pthread_mutex_lock(&c->mu);
        c->leaderships++;
        pthread_mutex_unlock(&c->mu);
        log_info("cluster", "node %llu is the leader (term %llu)", (unsigned long long)c->cfg.id,
                 (unsigned long long)c->raft.current_term);
    }
    c->was_leader = leader;
    exec_tick(c);
    send_report(c);
    if (!c->bootstrap_member) join_tick(c, 0);
    raft_id lid = 0;
    const char *laddr = NULL;
    raft_leader(&c->raft, &lid, &laddr);
    rejoin_tick(c, now_mono_ms(), lid != 0);
    if (leader && c->recover_event && !c->inflight) {
        /* Every node's /v1/cluster shows when the configuration was forced, and by whom. */
        c->recover_event = 0;
        conf_event(c, c->cfg.id, CONF_RECOVERED);
        return;
    }
    if (leader && recover_add_tick(c)) return;
    if (leader) conf_tick(c);
    if (leader) leader_tick(c);
}

/* ---------------------------------------------------------------- the thread */

static void recover_answer(struct control *c, int status, const char *msg);

static void raft_closed(struct raft *r)
{
    struct control *c = r->data;
    raft_uv_close(&c->io);
    c->raft_open = 0;
}

static void close_walk(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h)) uv_close(h, NULL);
}

static void on_stop(uv_async_t *a)
{
    struct control *c = a->data;
    c->stopping = 1;
    uv_timer_stop(&c->tick);
    uv_close((uv_handle_t *)&c->tick, NULL);
    uv_close((uv_handle_t *)&c->stop_async, NULL);
    uv_close((uv_handle_t *)&c->recover_async, NULL);
    uv_timer_stop(&c->recover_timer);
    uv_close((uv_handle_t *)&c->recover_timer, NULL);
    pthread_mutex_lock(&c->mu);
    int waiting = c->rq_state == 1;
    pthread_mutex_unlock(&c->mu);
    if (waiting) recover_answer(c, 503, "the node is stopping");
    if (c->ctl) sconn_close(c->ctl, "stopping");
    if (c->join) sconn_close(c->join, "stopping");
    fwd_channels_stop(c->fwd);
    if (c->raft_open) raft_close(&c->raft, raft_closed);
}

static void *control_main(void *arg)
{
    struct control *c = arg;
    uv_run(&c->loop, UV_RUN_DEFAULT);
    /* Connections raft handed back may still be open: close whatever is left. */
    uv_walk(&c->loop, close_walk, NULL);
    uv_run(&c->loop, UV_RUN_DEFAULT);
    return NULL;
}

static int mkdir_p(const char *dir, char *err)
{
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(tmp, 0700);
            *p = '/';
        }
    if (mkdir(tmp, 0700) && errno != EEXIST) return errmsg_set(err, "mkdir %s: %m", dir);
    return 0;
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

static int raft_setup(struct control *c, char *err)
{
    struct rtransport_cfg tc = {.loop = &c->loop,
                                .key = &c->key,
                                .ctx = c,
                                .on_ctl = on_ctl,
                                .on_fwd = on_fwd,
                                .on_refused = on_refused,
                                .handshake_ms = c->cfg.handshake_ms};
    if (rtransport_init(&c->transport, &tc, err)) return -1;
    int rc = raft_uv_init(&c->io, &c->loop, c->dir, &c->transport);
    if (rc) return errmsg_set(err, "raft data dir %s: %s", c->dir, c->io.errmsg);
    raft_uv_set_connect_retry_delay(&c->io, (unsigned)c->cfg.heartbeat_ms);
    c->fsm = (struct raft_fsm){.version = 1,
                               .data = c,
                               .apply = fsm_apply,
                               .snapshot = fsm_snapshot,
                               .restore = fsm_restore};
    rc = raft_init(&c->raft, &c->io, &c->fsm, c->cfg.id, c->addr);
    if (rc) return errmsg_set(err, "raft_init: %s", raft_errmsg(&c->raft));
    c->raft.data = c;
    raft_set_heartbeat_timeout(&c->raft, (unsigned)c->cfg.heartbeat_ms);
    raft_set_election_timeout(&c->raft, (unsigned)(c->cfg.heartbeat_ms * 5));
    raft_set_pre_vote(&c->raft, true);
    raft_set_snapshot_threshold(&c->raft, 64);
    raft_set_snapshot_trailing(&c->raft, 16);
    if (c->n_recover_to) {
        /* Recovery: the configuration "this node alone" is appended to the log as it stands (no
         * bootstrap); the other named voters are added once it leads (recover_add_tick). raft
         * 0.15 writes the forced entry with term 1, so a configuration of several voters would
         * need the others' votes with a log that looks older than theirs: it could never elect. */
        struct raft_configuration conf;
        raft_configuration_init(&conf);
        raft_configuration_add(&conf, c->cfg.id, c->addr, RAFT_VOTER);
        rc = raft_recover(&c->raft, &conf);
        raft_configuration_close(&conf);
        if (rc) return errmsg_set(err, "raft_recover: %s", raft_errmsg(&c->raft));
        raft_term term = 0;
        if (bump_term(c, &term, err)) return -1;
        log_info("cluster", "%s: configuration forced, term now %llu", c->dir,
                 (unsigned long long)term);
    } else if (c->bootstrap_member) {
        struct raft_configuration conf;
        raft_configuration_init(&conf);
        for (int i = 0; i < c->n_peers; i++)
            raft_configuration_add(&conf, c->peer[i].id, c->peer[i].addr, RAFT_VOTER);
        rc = raft_bootstrap(&c->raft, &conf);
        raft_configuration_close(&conf);
        if (rc && rc != RAFT_CANTBOOTSTRAP)
            return errmsg_set(err, "raft_bootstrap: %s", raft_errmsg(&c->raft));
        if (rc == RAFT_CANTBOOTSTRAP)
            log_info("cluster", "%s holds a log already: rejoining from it", c->dir);
    }
    rc = raft_start(&c->raft);
    if (rc) return errmsg_set(err, "raft_start: %s", raft_errmsg(&c->raft));
    c->raft_open = 1;
    return 0;
}

/* ---------------------------------------------------------------- recovery from a lost quorum */

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
    const struct cl_member *m = cl_state_member_c(&c->st, id);
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

static void recover_answer(struct control *c, int status, const char *msg)
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

/* The named voters other than this node wait for it to lead (recover_add_tick). */
static void recover_queue_others(struct control *c)
{
    c->n_recover_add = 0;
    for (int i = 0; i < c->n_recover_to; i++)
        if (c->recover_to[i].id != c->cfg.id) c->recover_add[c->n_recover_add++] = c->recover_to[i];
    c->n_recover_to = 0;
}

/* raft is closed and its libuv I/O freed: open it again on the same data dir with the new
 * configuration appended (raft_setup sees n_recover_to), from the next loop iteration. */
static void on_recover_timer(uv_timer_t *t)
{
    struct control *c = t->data;
    char err[ERRMSG_LEN], voters[512], msg[ERRMSG_LEN];
    if (c->stopping) return recover_answer(c, 503, "the node is stopping");
    rtransport_free(&c->transport);
    pthread_mutex_lock(&c->mu);
    cl_state_init(&c->st); /* raft applies the log again from its snapshot */
    c->n_rep = 0;
    pthread_mutex_unlock(&c->mu);
    recover_voters_str(c, voters, sizeof voters);
    if (raft_setup(c, err)) {
        log_error("cluster", "recovery failed, raft is not running (restart this node): %s", err);
        snprintf(msg, sizeof msg, "recovery failed, raft is not running: %.400s", err);
        return recover_answer(c, 500, msg);
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
    recover_answer(c, 0, msg);
}

static void recover_closed(struct raft *r)
{
    struct control *c = r->data;
    raft_uv_close(&c->io);
    uv_timer_start(&c->recover_timer, on_recover_timer, 0, 0);
}

/* The HTTP thread posted a request: check it against what this node sees, then close raft. */
static void on_recover_async(uv_async_t *a)
{
    struct control *c = a->data;
    char err[ERRMSG_LEN];
    pthread_mutex_lock(&c->mu);
    int posted = c->rq_state == 1;
    struct recover_req rq = c->rq;
    pthread_mutex_unlock(&c->mu);
    if (!posted || c->recovering) return;
    if (c->stopping || !c->raft_open) return recover_answer(c, 503, "raft is not running");
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
        return recover_answer(c, status, err);
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
    if (c->ctl) sconn_close(c->ctl, "raft recovering");
    if (c->join) sconn_close(c->join, "raft recovering");
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
static int recover_at_start(struct control *c, char *err)
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

struct control *control_start(const struct control_cfg *cfg, const struct control_serving *sv,
                              const struct cluster_exec *ex, char *err)
{
    struct control *c = calloc(1, sizeof *c);
    if (!c) {
        errmsg_set(err, "cluster: out of memory");
        return NULL;
    }
    c->cfg = *cfg;
    if (cfg->test_refuse && strcmp(cfg->test_refuse, "replicate") &&
        strcmp(cfg->test_refuse, "scale-up")) {
        errmsg_set(err, "--test-refuse %s: not replicate or scale-up", cfg->test_refuse);
        free(c);
        return NULL;
    }
    if (!c->cfg.heartbeat_ms) c->cfg.heartbeat_ms = 200;
    if (!c->cfg.dead_ms) c->cfg.dead_ms = 5 * c->cfg.heartbeat_ms;
    if (!c->cfg.replicas_cached) c->cfg.replicas_cached = 1;
    if (c->cfg.keep_alive_ms <= 0) c->cfg.keep_alive_ms = 10000;
    if (c->cfg.scaleout_timeout_ms <= 0) c->cfg.scaleout_timeout_ms = 600000;
    if (c->cfg.ttft_slo_ms <= 0) c->cfg.ttft_slo_ms = 1000;
    if (sv) c->sv = *sv;
    if (ex) c->ex = *ex;
    snprintf(c->http, sizeof c->http, "%s", cfg->http ? cfg->http : "");
    snprintf(c->gpu, sizeof c->gpu, "%s", cfg->gpu ? cfg->gpu : "cpu");
    snprintf(c->rack, sizeof c->rack, "%s", cfg->rack ? cfg->rack : "");
    snprintf(c->model, sizeof c->model, "%s", cfg->model ? cfg->model : "");
    snprintf(c->fabric, sizeof c->fabric, "%s", cfg->fabric ? cfg->fabric : "");
    c->start_wall = now_wall_ms();
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->recover_cv, NULL);
    cl_state_init(&c->st);
    if (!cfg->id) {
        errmsg_set(err, "cluster: --node-id is required with --cluster");
        goto fail;
    }
    if (cfg->rack && !cl_rack_ok(cfg->rack)) {
        errmsg_set(err, "cluster: --rack %s: want 1..%d letters, digits, '.', '-' or '_'",
                   cfg->rack, CL_STR_LEN);
        goto fail;
    }
    if (!cfg->key_file) {
        errmsg_set(err, "cluster: --key-file is required with --cluster");
        goto fail;
    }
    if (auth_init(err) || cluster_key_load(&c->key, cfg->key_file, err) || parse_peers(c, err))
        goto fail;
    advertise_http(c);
    if (cfg->dir)
        snprintf(c->dir, sizeof c->dir, "%s", cfg->dir);
    else
        snprintf(c->dir, sizeof c->dir, "/run/strata-raft-%llu", (unsigned long long)cfg->id);
    if (mkdir_p(c->dir, err)) goto fail;
    if (cfg->recover && recover_at_start(c, err)) goto fail;
    if (c->model[0])
        control_set_holding(c, c->model, 1, !cfg->standby, cfg->standby ? 0 : cfg->n_layers,
                            cfg->n_layers);
    if (uv_loop_init(&c->loop)) {
        errmsg_set(err, "cluster: uv_loop_init failed");
        goto fail;
    }
    if (!(c->fwd = fwd_channels_new(&c->loop, &c->key, cfg->id, c->addr, err))) goto fail_loop;
    if (raft_setup(c, err)) goto fail_loop;
    if (c->n_recover_to) {
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
    uv_timer_init(&c->loop, &c->tick);
    c->tick.data = c;
    uv_timer_start(&c->tick, on_tick, (uint64_t)c->cfg.heartbeat_ms, (uint64_t)c->cfg.heartbeat_ms);
    uv_async_init(&c->loop, &c->stop_async, on_stop);
    c->stop_async.data = c;
    uv_async_init(&c->loop, &c->recover_async, on_recover_async);
    c->recover_async.data = c;
    uv_timer_init(&c->loop, &c->recover_timer);
    c->recover_timer.data = c;
    if (pthread_create(&c->thread, NULL, control_main, c)) {
        errmsg_set(err, "cluster: pthread_create failed");
        goto fail_loop;
    }
    c->thread_started = 1;
    log_info("cluster", "node %llu: control on %s, raft data in %s, %d peers, heartbeat %d ms",
             (unsigned long long)cfg->id, c->addr, c->dir, c->n_peers, c->cfg.heartbeat_ms);
    return c;
fail_loop:
    /* raft may hold handles on the loop: let the failure be fatal for the process instead of
     * unwinding half a raft instance. */
    return NULL;
fail:
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->recover_cv);
    free(c);
    return NULL;
}

void control_stop(struct control *c)
{
    if (!c) return;
    if (c->thread_started) {
        uv_async_send(&c->stop_async);
        pthread_join(c->thread, NULL);
    }
    uv_loop_close(&c->loop);
    rtransport_free(&c->transport);
    fwd_channels_free(c->fwd);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->recover_cv);
    free(c);
}

void control_exec_failed(struct control *c, const char *model, const char *why)
{
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    for (uint32_t i = 0; i < c->st.n_scaleouts; i++)
        if (!strcmp(c->st.scaleout[i].s.model, model) &&
            scaleout_names(&c->st.scaleout[i], c->cfg.id))
            add_refusal(c, c->st.scaleout[i].scale_id, why);
    pthread_mutex_unlock(&c->mu);
}

void control_set_holding(struct control *c, const char *model, int host, int engine,
                         int layers_resident, int n_layers)
{
    pthread_mutex_lock(&c->mu);
    int i = 0;
    while (i < c->n_my_hold && strcmp(c->my_hold[i].model, model)) i++;
    if (i == c->n_my_hold && c->n_my_hold < CL_MAX_HOLD) c->n_my_hold++;
    if (i < CL_MAX_HOLD) {
        struct cl_holding *h = &c->my_hold[i];
        h->node = c->cfg.id;
        snprintf(h->model, sizeof h->model, "%s", model);
        h->host = host ? 1 : 0;
        h->engine = engine ? 1 : 0;
        h->n_layers = (uint16_t)n_layers;
        h->layers_resident = (uint16_t)(layers_resident > n_layers ? n_layers : layers_resident);
    }
    pthread_mutex_unlock(&c->mu);
}

void control_set_model(struct control *c, const char *model, int n_layers, double bytes)
{
    pthread_mutex_lock(&c->mu);
    snprintf(c->model, sizeof c->model, "%s", model);
    c->cfg.n_layers = n_layers;
    c->cfg.model_bytes = bytes;
    pthread_mutex_unlock(&c->mu);
}

uint64_t control_id(const struct control *c)
{
    return c->cfg.id;
}

int control_node_fabric(struct control *c, uint64_t id, char out[CL_STR_LEN + 1])
{
    pthread_mutex_lock(&c->mu);
    const struct cl_member *m = cl_state_member_c(&c->st, id);
    int ok = m && m->info.fabric[0];
    snprintf(out, CL_STR_LEN + 1, "%s", ok ? m->info.fabric : "");
    pthread_mutex_unlock(&c->mu);
    return ok ? 0 : -1;
}

int control_holders_fabric(struct control *c, const char *model, const uint64_t *skip, int n_skip,
                           char (*out)[CL_STR_LEN + 1], int cap)
{
    int n = 0;
    pthread_mutex_lock(&c->mu);
    int mi = cl_state_model(&c->st, model);
    for (uint32_t i = 0; mi >= 0 && i < c->st.n_members && n < cap; i++) {
        const struct cl_member *m = &c->st.member[i];
        int skipped = m->info.id == c->cfg.id;
        for (int k = 0; k < n_skip; k++) skipped |= m->info.id == skip[k];
        if (skipped || !m->alive || !m->hold[mi].host || !m->info.fabric[0]) continue;
        snprintf(out[n++], CL_STR_LEN + 1, "%s", m->info.fabric);
    }
    pthread_mutex_unlock(&c->mu);
    return n;
}

int control_fabric_serves(struct control *c, const char *model, const char *fabric)
{
    int yes = 0;
    pthread_mutex_lock(&c->mu);
    int mi = cl_state_model(&c->st, model);
    for (uint32_t i = 0; mi >= 0 && i < c->st.n_members && !yes; i++) {
        const struct cl_member *m = &c->st.member[i];
        yes = m->alive && m->hold[mi].engine &&
              m->hold[mi].layers_resident == m->hold[mi].n_layers && m->hold[mi].n_layers > 0 &&
              !strcmp(m->info.fabric, fabric);
    }
    pthread_mutex_unlock(&c->mu);
    return yes;
}

/* ---------------------------------------------------------------- /v1/cluster and /metrics */

static const char *raft_state_name(int s)
{
    return s == RAFT_LEADER      ? "leader"
           : s == RAFT_CANDIDATE ? "candidate"
           : s == RAFT_FOLLOWER  ? "follower"
                                 : "unavailable";
}

static const char *event_name(const struct cl_event *e)
{
    switch (e->type) {
    case CMD_NODE_UP:
        return "node_up";
    case CMD_NODE_DOWN:
        return "node_down";
    case CMD_SCALE:
        return e->kind == SCALE_UP          ? "scale_up"
               : e->kind == SCALE_DOWN      ? "scale_down"
               : e->kind == SCALE_REPLICATE ? "replicate_host"
                                            : "drop_host";
    case CMD_SCALE_DONE:
        return e->kind ? "scale_done" : "scale_abandoned";
    case CMD_RAFT_CONF:
        return e->kind == CONF_REMOVED ? "raft_removed"
               : e->kind == CONF_VOTER ? "raft_voter"
                                       : "raft_recovered";
    }
    return "?";
}

char *control_json(struct control *c, size_t *len)
{
    cJSON *root = cJSON_CreateObject();
    pthread_mutex_lock(&c->mu);
    const struct cl_state *s = &c->st;
    cJSON_AddNumberToObject(root, "node_id", (double)c->cfg.id);
    cJSON_AddStringToObject(root, "raft_state", raft_state_name(c->raft_state));
    if (c->leader_id)
        cJSON_AddNumberToObject(root, "leader", (double)c->leader_id);
    else
        cJSON_AddNullToObject(root, "leader");
    cJSON_AddStringToObject(root, "leader_address", c->leader_addr);
    cJSON_AddNumberToObject(root, "term", (double)c->term);
    cJSON_AddNumberToObject(root, "commit_index", (double)c->commit_index);
    cJSON_AddNumberToObject(root, "applied_index", (double)c->applied_index);
    cJSON_AddNumberToObject(root, "last_log_index", (double)c->last_index);
    cJSON_AddNumberToObject(root, "commands_applied", (double)s->applied);
    cJSON_AddNumberToObject(root, "decisions", (double)c->decisions);
    cJSON_AddNumberToObject(root, "refused_connections", (double)c->refused);
    cJSON_AddNumberToObject(root, "handshake_timeouts", (double)c->handshake_timeouts);
    cJSON_AddNumberToObject(root, "recoveries", (double)c->recoveries);
    if (c->last_recovery_ms)
        cJSON_AddNumberToObject(root, "last_recovery_ms", (double)c->last_recovery_ms);
    else
        cJSON_AddNullToObject(root, "last_recovery_ms");
    /* raft's configuration as this node holds it (the latest, maybe not yet committed). */
    cJSON *voters = cJSON_AddArrayToObject(root, "voters");
    cJSON *others = cJSON_AddArrayToObject(root, "non_voters");
    for (int i = 0; i < c->n_conf; i++)
        cJSON_AddItemToArray(c->conf[i].voter ? voters : others,
                             cJSON_CreateNumber((double)c->conf[i].id));
    cJSON *nodes = cJSON_AddArrayToObject(root, "nodes");
    for (uint32_t i = 0; i < s->n_members; i++) {
        const struct cl_member *m = &s->member[i];
        cJSON *n = cJSON_CreateObject();
        cJSON_AddNumberToObject(n, "id", (double)m->info.id);
        cJSON_AddStringToObject(n, "address", m->info.addr);
        cJSON_AddStringToObject(n, "http", m->info.http);
        cJSON_AddStringToObject(n, "fabric", m->info.fabric);
        cJSON_AddStringToObject(n, "role",
                                m->info.id == c->leader_id   ? "leader"
                                : m->info.role == ROLE_VOTER ? "voter"
                                                             : "joined");
        cJSON_AddBoolToObject(n, "alive", m->alive);
        cJSON_AddNumberToObject(n, "since_ms", (double)m->since_ms);
        cJSON_AddStringToObject(n, "gpu", m->info.gpu);
        cJSON_AddStringToObject(n, "rack", m->info.rack);
        cJSON_AddNumberToObject(n, "tokens_per_s", m->info.tok_s);
        cJSON *models = cJSON_AddArrayToObject(n, "models");
        for (uint32_t k = 0; k < s->n_models; k++) {
            const struct cl_hold *h = &m->hold[k];
            if (!h->host && !h->engine) continue;
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "name", s->model[k]);
            cJSON_AddBoolToObject(o, "host", h->host);
            cJSON_AddBoolToObject(o, "engine", h->engine);
            cJSON_AddNumberToObject(o, "layers_resident", h->layers_resident);
            cJSON_AddNumberToObject(o, "layers", h->n_layers);
            cJSON_AddItemToArray(models, o);
        }
        /* Our own report of it (the leader has everyone's), else the leader's relayed copy. */
        const struct cl_load *ld = NULL;
        uint64_t at = 0;
        int relayed = 0;
        for (int k = 0; k < c->n_rep && !ld; k++)
            if (c->rep[k].id == m->info.id) ld = &c->rep[k].load, at = c->rep[k].at_ms;
        for (int k = 0; k < c->n_relayed && !ld; k++)
            if (c->relayed[k].id == m->info.id)
                ld = &c->relayed[k].load, at = c->relayed[k].at_ms, relayed = 1;
        if (ld) {
            cJSON *l = cJSON_AddObjectToObject(n, "load");
            cJSON_AddNumberToObject(l, "age_ms", (double)(now_mono_ms() - at));
            cJSON_AddBoolToObject(l, "relayed", relayed);
            cJSON_AddNumberToObject(l, "queue", ld->queue_len);
            cJSON_AddNumberToObject(l, "queued_tokens", (double)ld->queued_tokens);
            cJSON_AddNumberToObject(l, "running", ld->running);
            cJSON_AddNumberToObject(l, "held", ld->held);
            cJSON_AddNumberToObject(l, "kv_used", ld->kv_used);
            cJSON_AddNumberToObject(l, "predicted_ttft_ms", ld->ttft_pred_ms);
            cJSON_AddNumberToObject(l, "tokens_per_s", ld->tok_s);
            cJSON_AddNumberToObject(l, "idle_ms", ld->idle_ms);
        }
        cJSON_AddItemToArray(nodes, n);
    }
    cJSON *sos = cJSON_AddArrayToObject(root, "scaleouts");
    for (uint32_t i = 0; i < s->n_scaleouts; i++) {
        const struct cl_scaleout *so = &s->scaleout[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", so->scale_id);
        cJSON_AddStringToObject(o, "kind", so->s.kind == SCALE_UP ? "engine" : "host");
        cJSON_AddStringToObject(o, "model", so->s.model);
        cJSON_AddNumberToObject(o, "source", (double)so->s.source);
        cJSON *ch = cJSON_AddArrayToObject(o, "chain");
        for (int k = 0; k < so->s.n_chain; k++)
            cJSON_AddItemToArray(ch, cJSON_CreateNumber((double)so->s.chain[k]));
        cJSON_AddNumberToObject(o, "started_ms", (double)so->started_ms);
        cJSON_AddItemToArray(sos, o);
    }
    cJSON *evs = cJSON_AddArrayToObject(root, "events");
    uint32_t first = s->n_events > CL_MAX_EVENTS ? s->n_events - CL_MAX_EVENTS : 0;
    for (uint32_t i = first; i < s->n_events; i++) {
        const struct cl_event *e = &s->event[i % CL_MAX_EVENTS];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "seq", e->seq);
        cJSON_AddNumberToObject(o, "t_ms", (double)e->t_ms);
        cJSON_AddStringToObject(o, "event", event_name(e));
        cJSON_AddNumberToObject(o, "node", (double)e->node);
        if (e->type == CMD_SCALE || e->type == CMD_SCALE_DONE) {
            cJSON_AddStringToObject(o, "model", e->model);
            cJSON_AddNumberToObject(o, "source", (double)e->source);
        }
        if (e->reason[0]) cJSON_AddStringToObject(o, "reason", e->reason);
        cJSON_AddItemToArray(evs, o);
    }
    pthread_mutex_unlock(&c->mu);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    *len = text ? strlen(text) : 0;
    return text;
}

struct mbuf {
    char *p;
    size_t len, cap;
};

static void mprintf(struct mbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mprintf(struct mbuf *b, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap + (size_t)n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) return;
        b->p = p;
        b->cap = cap;
    }
}

char *control_metrics(struct control *c, size_t *len)
{
    struct mbuf b = {0};
    pthread_mutex_lock(&c->mu);
    const struct cl_state *s = &c->st;
    mprintf(&b, "# TYPE strata_cluster_leader gauge\nstrata_cluster_leader %llu\n",
            (unsigned long long)c->leader_id);
    mprintf(&b, "# TYPE strata_cluster_is_leader gauge\nstrata_cluster_is_leader %d\n",
            c->raft_state == RAFT_LEADER);
    mprintf(&b, "# TYPE strata_cluster_term gauge\nstrata_cluster_term %llu\n",
            (unsigned long long)c->term);
    mprintf(&b, "# TYPE strata_cluster_applied_index gauge\nstrata_cluster_applied_index %llu\n",
            (unsigned long long)c->applied_index);
    mprintf(&b,
            "# TYPE strata_cluster_commands_applied_total counter\n"
            "strata_cluster_commands_applied_total %llu\n",
            (unsigned long long)s->applied);
    mprintf(&b,
            "# TYPE strata_cluster_decisions_total counter\nstrata_cluster_decisions_total "
            "%llu\n",
            (unsigned long long)c->decisions);
    mprintf(&b, "# TYPE strata_cluster_refused_total counter\nstrata_cluster_refused_total %llu\n",
            (unsigned long long)c->refused);
    mprintf(&b,
            "# TYPE strata_cluster_handshake_timeouts_total counter\n"
            "strata_cluster_handshake_timeouts_total %llu\n",
            (unsigned long long)c->handshake_timeouts);
    mprintf(&b,
            "# TYPE strata_cluster_recoveries_total counter\n"
            "strata_cluster_recoveries_total %llu\n",
            (unsigned long long)c->recoveries);
    int n_voters = 0;
    for (int i = 0; i < c->n_conf; i++) n_voters += c->conf[i].voter;
    mprintf(&b, "# TYPE strata_cluster_voters gauge\nstrata_cluster_voters %d\n", n_voters);
    mprintf(&b,
            "# TYPE strata_cluster_load_reports_total counter\n"
            "strata_cluster_load_reports_total %llu\n",
            (unsigned long long)c->reports_in);
    mprintf(&b, "# TYPE strata_cluster_scaleouts gauge\nstrata_cluster_scaleouts %u\n",
            s->n_scaleouts);
    uint64_t kinds[5] = {0};
    uint32_t first = s->n_events > CL_MAX_EVENTS ? s->n_events - CL_MAX_EVENTS : 0;
    for (uint32_t i = first; i < s->n_events; i++)
        if (s->event[i % CL_MAX_EVENTS].type == CMD_SCALE)
            kinds[s->event[i % CL_MAX_EVENTS].kind]++;
    mprintf(&b, "# TYPE strata_cluster_scale_events gauge\n");
    const char *kn[] = {"", "up", "down", "replicate", "drop_host"};
    for (int k = 1; k < 5; k++)
        mprintf(&b, "strata_cluster_scale_events{kind=\"%s\"} %llu\n", kn[k],
                (unsigned long long)kinds[k]);
    mprintf(&b, "# TYPE strata_cluster_node_alive gauge\n");
    for (uint32_t i = 0; i < s->n_members; i++)
        mprintf(&b, "strata_cluster_node_alive{node=\"%llu\",rack=\"%s\"} %d\n",
                (unsigned long long)s->member[i].info.id, s->member[i].info.rack,
                s->member[i].alive);
    mprintf(&b, "# TYPE strata_cluster_layers_resident gauge\n");
    for (uint32_t i = 0; i < s->n_members; i++)
        for (uint32_t k = 0; k < s->n_models; k++)
            if (s->member[i].hold[k].engine || s->member[i].hold[k].host)
                mprintf(&b,
                        "strata_cluster_layers_resident{node=\"%llu\",model=\"%s\",engine=\"%d\","
                        "host=\"%d\"} %u\n",
                        (unsigned long long)s->member[i].info.id, s->model[k],
                        s->member[i].hold[k].engine, s->member[i].hold[k].host,
                        s->member[i].hold[k].layers_resident);
    mprintf(&b, "# TYPE strata_cluster_queue gauge\n");
    for (int k = 0; k < c->n_rep; k++)
        mprintf(&b, "strata_cluster_queue{node=\"%llu\"} %d\n", (unsigned long long)c->rep[k].id,
                c->rep[k].load.queue_len);
    pthread_mutex_unlock(&c->mu);
    *len = b.len;
    return b.p;
}
