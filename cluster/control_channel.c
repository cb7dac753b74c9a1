/* control_channel: the sealed control connections between nodes: load reports, JOIN, forward
 * channels.
 *
 * Every heartbeat each node sends its report (its load from the serving process, its holdings and
 * refusals) to the leader over a control connection it keeps open; the leader stores it and answers
 * with the others' loads (MSGC_LOADS: every node routes). A node outside raft's configuration asks
 * a peer to JOIN (redirected to the leader, which adds it: control_conf.c). An incoming forward
 * channel becomes a connection of this node's front. Runs on the control thread, except
 * control_forward_open (a relay's thread). */
#include "cluster/control_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static void send_msg(struct sconn *s, const struct cl_msg *m)
{
    static uint8_t buf[CL_CMD_MAX * 4];
    size_t n = cluster_cmd_msg_encode(buf, sizeof buf, m);
    if (n) sealed_conn_send(s, buf, n);
}

/* A message on a control connection someone opened to us. */
static void ctl_in_msg(struct sconn *s, const uint8_t *buf, size_t len)
{
    struct control *c = s->data;
    struct cl_msg m, r;
    char err[ERRMSG_LEN];
    if (cluster_cmd_msg_decode(&m, buf, len, err)) {
        log_warn("cluster", "%s: %s", s->peer, err);
        return sealed_conn_close(s, "bad control message");
    }
    int leader = raft_state(&c->raft) == RAFT_LEADER;
    /* A report or a join speaks for the node the handshake proved, never another. */
    uint64_t claimed = m.type == MSGC_LOAD   ? m.u.load.node.id
                       : m.type == MSGC_JOIN ? m.u.join.id
                                             : 0;
    if (claimed && claimed != s->peer_id) {
        log_warn("cluster", "%s: node %llu sent a %s in the name of node %llu: refused", s->peer,
                 (unsigned long long)s->peer_id, m.type == MSGC_LOAD ? "load report" : "JOIN",
                 (unsigned long long)claimed);
        control_channel_on_impostor(c);
        return sealed_conn_close(s, "a message in another node's name");
    }
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
            control_conf_start_join(c, m.u.join.id, m.u.join.addr);
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
        size_t cap = cluster_state_encoded_max();
        uint8_t *snap = malloc(cap), *out = malloc(cap + 16);
        if (snap && out) {
            pthread_mutex_lock(&c->mu);
            size_t n = cluster_state_encode(&c->st, snap, cap);
            pthread_mutex_unlock(&c->mu);
            r = (struct cl_msg){.type = MSGC_STATE};
            r.u.state.p = snap;
            r.u.state.len = (uint32_t)n;
            size_t k = cluster_cmd_msg_encode(out, cap + 16, &r);
            if (k) sealed_conn_send(s, out, k);
        }
        free(snap);
        free(out);
        break;
    }
    default:
        sealed_conn_close(s, "unexpected control message");
    }
}

void control_channel_on_ctl(void *ctx, struct sconn *s, uint64_t id, const char *addr)
{
    (void)id, (void)addr;
    s->data = ctx;
    s->cb.on_msg = ctl_in_msg;
}

/* A member forwards an API request: the channel becomes a connection of our front. */
void control_channel_on_fwd(void *ctx, struct sconn *s, uint64_t id, const char *addr)
{
    struct control *c = ctx;
    char err[ERRMSG_LEN];
    (void)addr;
    if (c->stopping || !c->sv.forward_in) return sealed_conn_close(s, "no front to forward to");
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
    const struct cl_member *m = cluster_state_member_c(&c->st, node);
    if (m) snprintf(addr, sizeof addr, "%s", m->info.addr);
    pthread_mutex_unlock(&c->mu);
    if (!addr[0])
        return errmsg_set(err, "node %llu has no control address in the cluster's state",
                          (unsigned long long)node);
    return fwd_channels_open(c->fwd, node, addr, timeout_ms, cancel_fd, err);
}

void control_channel_on_refused(void *ctx, const char *peer, const char *why, int timed_out)
{
    struct control *c = ctx;
    pthread_mutex_lock(&c->mu);
    c->refused++;
    c->handshake_timeouts += timed_out != 0;
    pthread_mutex_unlock(&c->mu);
    log_warn("cluster", "connection from %s refused: %s", peer, why);
}

void control_channel_on_impostor(void *ctx)
{
    struct control *c = ctx;
    pthread_mutex_lock(&c->mu);
    c->impostors++;
    pthread_mutex_unlock(&c->mu);
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
    if (cluster_cmd_msg_decode(&m, buf, len, err)) {
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
    sealed_conn_close(s, "join answered");
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

/* want: the node we mean to reach (0: whoever listens at addr, a leader a peer named). */
static struct sconn *connect_out(struct control *c, uint64_t want, const char *addr)
{
    struct sconn_cbs cbs = {.on_ready = out_ready, .on_msg = out_msg, .on_close = out_closed};
    char err[ERRMSG_LEN];
    struct sconn *s = sealed_conn_connect(&c->loop, &c->key, c->cfg.id, want, addr, &cbs, c, err);
    if (!s) log_warn("cluster", "%s", err);
    return s;
}

void control_channel_report(struct control *c)
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
        sealed_conn_close(c->ctl, "the leader changed");
        c->ctl = NULL;
        c->ctl_open = 0;
    }
    if (!c->ctl) {
        c->ctl_leader = lid;
        c->ctl = connect_out(c, lid, laddr);
        return;
    }
    if (c->ctl_open) send_msg(c->ctl, &m);
}

/* Ask a peer to add us (it redirects to the leader, which runs raft_add and assign VOTER).
 * force: even though our own configuration lists us as a voter. A node the leader removed while
 * it was away still holds the configuration it had: only the silence tells it (no leader
 * replicates to a server outside the configuration). */
void control_channel_join_tick(struct control *c, int force)
{
    c->in_config = 0;
    for (unsigned i = 0; i < c->raft.configuration.n; i++)
        if (c->raft.configuration.servers[i].id == c->cfg.id &&
            c->raft.configuration.servers[i].role == RAFT_VOTER)
            c->in_config = 1;
    if ((c->in_config && !force) || c->join) return;
    if (c->join_to[0]) {
        c->join = connect_out(c, 0, c->join_to);
        c->join_to[0] = 0;
        return;
    }
    for (int tries = 0; tries < c->n_peers; tries++) {
        const struct peer *p = &c->peer[c->join_next % c->n_peers];
        c->join_next = (c->join_next + 1) % c->n_peers;
        if (p->id == c->cfg.id) continue;
        c->join = connect_out(c, p->id, p->addr);
        return;
    }
}

/* A bootstrap member that has known no leader for 20 heartbeats (4 election timeouts: an
 * election normally ends within 2) may have been removed while it was down: it asks to join,
 * at most once per election timeout. A voter of a cluster that lost its quorum asks too; the
 * answer is "no leader" and nothing changes. */
void control_channel_rejoin_tick(struct control *c, uint64_t now, int leader_known)
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
    control_channel_join_tick(c, 1);
}
