/* The cluster's replicated state: command and message codecs, the state machine, snapshots, and
 * the state machine under raft's deterministic fixture (elections, a dead leader, a partitioned
 * node that catches up); the voter policy (cluster/voter_policy.h), and under the fixture: four
 * voters lose one for good, the leader removes it, a second dies and the last two still commit
 * (without the removal they cannot), and the removed node comes back as a voter. */
#include "check.h"

#include "cluster/cluster_cmd.h"
#include "cluster/cluster_state.h"
#include "cluster/voter_policy.h"
#include "os/common/errmsg.h"

#include <raft.h>
#include <raft/fixture.h>

static struct cl_cmd node_up(uint64_t id, uint64_t t)
{
    struct cl_cmd c = {.type = CMD_NODE_UP, .t_ms = t};
    c.u.up.id = id;
    snprintf(c.u.up.addr, sizeof c.u.up.addr, "10.77.0.%llu:7100", (unsigned long long)id);
    snprintf(c.u.up.http, sizeof c.u.up.http, "10.77.0.%llu:8080", (unsigned long long)id);
    snprintf(c.u.up.gpu, sizeof c.u.up.gpu, "%s", id == 2 ? "h100" : "cpu");
    snprintf(c.u.up.rack, sizeof c.u.up.rack, "row1.rack-%llu_B", (unsigned long long)id % 3);
    c.u.up.role = ROLE_VOTER;
    c.u.up.tok_s = 100.0f * (float)id;
    return c;
}

static struct cl_cmd holding(uint64_t node, const char *model, int host, int engine, int k, int L)
{
    struct cl_cmd c = {.type = CMD_HOLDING, .t_ms = 5};
    c.u.hold.node = node;
    snprintf(c.u.hold.model, sizeof c.u.hold.model, "%s", model);
    c.u.hold.host = (uint8_t)host;
    c.u.hold.engine = (uint8_t)engine;
    c.u.hold.layers_resident = (uint16_t)k;
    c.u.hold.n_layers = (uint16_t)L;
    return c;
}

static struct cl_cmd scale(int kind, const char *model, uint64_t source, uint64_t node)
{
    struct cl_cmd c = {.type = CMD_SCALE, .t_ms = 7};
    c.u.scale.kind = (uint8_t)kind;
    snprintf(c.u.scale.model, sizeof c.u.scale.model, "%s", model);
    c.u.scale.source = source;
    c.u.scale.node = node;
    if (kind == SCALE_UP) c.u.scale.chain[c.u.scale.n_chain++] = node;
    if (kind == SCALE_UP)
        snprintf(c.u.scale.reason, sizeof c.u.scale.reason, "predicted TTFT 812 ms > SLO 300 ms");
    return c;
}

static size_t enc(const struct cl_cmd *c, uint8_t *buf)
{
    return cluster_cmd_encode(buf, CL_CMD_MAX, c);
}

TEST(cmd_roundtrip_every_type)
{
    struct cl_cmd in[] = {node_up(3, 1700000000123ull),
                          holding(3, "llama", 1, 1, 4, 22),
                          scale(SCALE_UP, "llama", 1, 3),
                          scale(SCALE_DOWN, "llama", 0, 2),
                          {.type = CMD_NODE_DOWN, .t_ms = 9, .u.down = 3},
                          {.type = CMD_SCALE_DONE, .t_ms = 10, .u.done = {4, 1}},
                          {.type = CMD_SCALE_DONE,
                           .t_ms = 10,
                           .u.done = {5, 0, 3, "this node holds b, not a (its host copy goes)"}},
                          {.type = CMD_RAFT_CONF, .t_ms = 11, .u.conf = {3, CONF_REMOVED}},
                          {.type = CMD_RAFT_CONF, .t_ms = 12, .u.conf = {1, CONF_RECOVERED}},
                          {.type = CMD_MODEL, .t_ms = 13, .u.model = {"llama", 1, 3, 22, 0}},
                          {.type = CMD_MODEL, .t_ms = 14, .u.model = {"llama", 0, 0, 22, 4}}};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
        uint8_t buf[CL_CMD_MAX], buf2[CL_CMD_MAX];
        char err[ERRMSG_LEN];
        size_t n = enc(&in[i], buf);
        CHECK(n > 10);
        struct cl_cmd out;
        CHECKF(!cluster_cmd_decode(&out, buf, n, err), "type %d: %s", in[i].type, err);
        CHECK_EQ_INT(out.type, in[i].type);
        CHECK_EQ_INT(out.t_ms, in[i].t_ms);
        CHECK_EQ_INT(enc(&out, buf2), n);
        CHECK(!memcmp(buf, buf2, n));
        /* Every strict prefix is refused, and so is one trailing byte. */
        for (size_t k = 0; k < n; k++)
            CHECKF(cluster_cmd_decode(&out, buf, k, err), "prefix %zu", k);
        buf[n] = 0;
        CHECK(cluster_cmd_decode(&out, buf, n + 1, err));
        CHECK(strstr(err, "trailing"));
    }
}

TEST(cmd_rejects_bad_fields)
{
    uint8_t buf[CL_CMD_MAX];
    char err[ERRMSG_LEN];
    struct cl_cmd out, c = node_up(1, 1);
    size_t n = enc(&c, buf);
    buf[0] = 9; /* version */
    CHECK(cluster_cmd_decode(&out, buf, n, err));
    CHECK(strstr(err, "version"));
    buf[0] = CL_CMD_VERSION;
    buf[1] = 77; /* type */
    CHECK(cluster_cmd_decode(&out, buf, n, err));
    CHECK(strstr(err, "unknown type"));
    buf[1] = CMD_NODE_UP;
    buf[2 + 8 + 8 + 1] = '\n'; /* first byte of the address: not printable */
    CHECK(cluster_cmd_decode(&out, buf, n, err));
    /* A rack name that is not letters, digits, '.', '-', '_' (it becomes a /metrics label). */
    for (const char *bad = "\"{ ,"; *bad; bad++) {
        c = node_up(1, 1);
        c.u.up.rack[2] = *bad;
        n = enc(&c, buf);
        CHECK(cluster_cmd_decode(&out, buf, n, err));
        CHECKF(strstr(err, "rack"), "%s", err);
    }
    c = node_up(1, 1);
    c.u.up.rack[0] = 0; /* none given: fine */
    n = enc(&c, buf);
    CHECKF(!cluster_cmd_decode(&out, buf, n, err), "%s", err);
    c = holding(1, "m", 1, 1, 9, 4); /* k > L */
    n = enc(&c, buf);
    CHECK(cluster_cmd_decode(&out, buf, n, err));
    CHECK(strstr(err, "layers resident"));
    c = scale(SCALE_UP, "m", 1, 2);
    c.u.scale.n_chain = CL_MAX_CHAIN; /* encodes all, then one more byte claims 17 */
    n = enc(&c, buf);
    buf[2 + 8 + 1 + 1 + 1 + 8 + 8] = CL_MAX_CHAIN + 1;
    CHECK(cluster_cmd_decode(&out, buf, n, err));
    CHECK(strstr(err, "chain"));
    c = scale(SCALE_UP, "m", 1, 2);
    n = enc(&c, buf);
    CHECKF(!cluster_cmd_decode(&out, buf, n, err), "%s", err);
    CHECK_STR(out.u.scale.reason, "predicted TTFT 812 ms > SLO 300 ms");
    buf[n - 1] = '\t'; /* the reason's last byte: not printable */
    CHECK(cluster_cmd_decode(&out, buf, n, err));
    c = (struct cl_cmd){.type = CMD_RAFT_CONF, .t_ms = 1, .u.conf = {3, CONF_VOTER}};
    n = enc(&c, buf);
    buf[n - 1] = CONF_RECOVERED + 1; /* no such change */
    CHECK(cluster_cmd_decode(&out, buf, n, err));
    CHECK(strstr(err, "unknown change"));
    c.u.conf.node = 0;
    n = enc(&c, buf);
    CHECK(cluster_cmd_decode(&out, buf, n, err));
    CHECK(strstr(err, "node id 0"));
    /* A finished scale-out names no refusing node and no reason; an abandoned one may. */
    c = (struct cl_cmd){.type = CMD_SCALE_DONE, .t_ms = 1, .u.done = {2, 1, 4, ""}};
    n = enc(&c, buf);
    CHECK(cluster_cmd_decode(&out, buf, n, err));
    CHECKF(strstr(err, "finished"), "%s", err);
    c.u.done.ok = 0;
    snprintf(c.u.done.reason, sizeof c.u.done.reason, "refused");
    n = enc(&c, buf);
    CHECKF(!cluster_cmd_decode(&out, buf, n, err), "%s", err);
    CHECK(out.u.done.node == 4 && !strcmp(out.u.done.reason, "refused"));
    buf[n - 2] = 0x7f; /* a reason byte that is not printable */
    CHECK(cluster_cmd_decode(&out, buf, n, err));
}

TEST(msg_roundtrip_and_rejects)
{
    struct cl_msg m = {.type = MSGC_LOAD}, out;
    uint8_t buf[4096], buf2[4096];
    char err[ERRMSG_LEN];
    m.u.load.node = node_up(2, 0).u.up;
    m.u.load.load = (struct cl_load){.queue_len = 3,
                                     .running = 2,
                                     .queued_tokens = 300,
                                     .kv_used = 0.25f,
                                     .idle_ms = -1,
                                     .ttft_pred_ms = 120,
                                     .tok_s = 800,
                                     .step_a = 1e-4f,
                                     .step_c = 2e-3f,
                                     .step_corr = 1,
                                     .step_err = 0.25f,
                                     .step_steps = 40,
                                     .step_cal = 1,
                                     .step_id = 0x1234567890abcdefull,
                                     .link_Bps = 2.5e8f,
                                     .link_peer = 3,
                                     .model_bytes = 1054336,
                                     .prompt_in = 5000,
                                     .helping = 6};
    m.u.load.seen_scales = 7;
    m.u.load.n_hold = 1;
    m.u.load.hold[0] = holding(2, "llama", 1, 1, 22, 22).u.hold;
    /* requests waiting for a replica, and two decisions this node refused */
    m.u.load.load.held = 2;
    m.u.load.load.held_tokens = 77;
    snprintf(m.u.load.load.held_model, sizeof m.u.load.load.held_model, "llama");
    m.u.load.n_refused = 2;
    m.u.load.refused[0] = (struct cl_refusal){5, "--test-refuse replicate: not taking a"};
    m.u.load.refused[1] = (struct cl_refusal){9, "join failed: source gone"};
    size_t n = cluster_cmd_msg_encode(buf, sizeof buf, &m);
    CHECK(n);
    CHECKF(!cluster_cmd_msg_decode(&out, buf, n, err), "%s", err);
    CHECK_EQ_INT(out.u.load.seen_scales, 7);
    CHECK_EQ_INT(out.u.load.load.held, 2);
    CHECK_EQ_INT(out.u.load.load.held_tokens, 77);
    CHECK_STR(out.u.load.load.held_model, "llama");
    CHECK_EQ_INT(out.u.load.n_refused, 2);
    CHECK_EQ_INT(out.u.load.refused[1].scale_id, 9);
    CHECK_STR(out.u.load.refused[0].reason, "--test-refuse replicate: not taking a");
    /* the rack travels in the report */
    CHECKF(!strcmp(out.u.load.node.rack, "row1.rack-2_B"), "%s", out.u.load.node.rack);
    CHECK_EQ_INT(out.u.load.load.queued_tokens, 300);
    /* what the planner measures with */
    CHECK(out.u.load.load.step_err == 0.25f && out.u.load.load.link_Bps == 2.5e8f);
    CHECK_EQ_INT(out.u.load.load.step_steps, 40);
    CHECK_EQ_INT(out.u.load.load.step_cal, 1);
    CHECK(out.u.load.load.step_id == 0x1234567890abcdefull);
    CHECK_EQ_INT(out.u.load.load.link_peer, 3);
    CHECK_EQ_INT(out.u.load.load.model_bytes, 1054336);
    CHECK_EQ_INT(out.u.load.load.prompt_in, 5000);
    CHECK_EQ_INT(out.u.load.load.helping, 6);
    CHECK_EQ_INT(cluster_cmd_msg_encode(buf2, sizeof buf2, &out), n);
    CHECK(!memcmp(buf, buf2, n));
    for (size_t k = 0; k < n; k++) CHECK(cluster_cmd_msg_decode(&out, buf, k, err));
    buf[n] = 0;
    CHECK(cluster_cmd_msg_decode(&out, buf, n + 1, err));
    CHECK(strstr(err, "trailing"));
    /* More refusals than fit, one without a reason, negative held requests: refused. */
    m.u.load.n_refused = 1;
    n = cluster_cmd_msg_encode(buf, sizeof buf, &m);
    buf[n - 1 - 1 - strlen(m.u.load.refused[0].reason) - 4] = CL_MAX_REFUSED + 1;
    CHECK(cluster_cmd_msg_decode(&out, buf, n, err));
    CHECKF(strstr(err, "refusals"), "%s", err);
    m.u.load.refused[0].reason[0] = 0;
    n = cluster_cmd_msg_encode(buf, sizeof buf, &m);
    CHECK(cluster_cmd_msg_decode(&out, buf, n, err));
    CHECKF(strstr(err, "without a reason"), "%s", err);
    m.u.load.n_refused = 0;
    m.u.load.load.held = -1;
    n = cluster_cmd_msg_encode(buf, sizeof buf, &m);
    CHECK(cluster_cmd_msg_decode(&out, buf, n, err));
    CHECKF(strstr(err, "held"), "%s", err);
    m.u.load.load.held = 0;
    /* A report about another node's holding is refused. */
    m.u.load.hold[0].node = 3;
    n = cluster_cmd_msg_encode(buf, sizeof buf, &m);
    CHECK(cluster_cmd_msg_decode(&out, buf, n, err));
    CHECK(strstr(err, "reports a holding"));
    /* KV use outside [0, 1]. */
    m.u.load.hold[0].node = 2;
    m.u.load.load.kv_used = 2;
    n = cluster_cmd_msg_encode(buf, sizeof buf, &m);
    CHECK(cluster_cmd_msg_decode(&out, buf, n, err));
    /* OPEN with an unknown channel. */
    struct cl_msg o = {.type = MSGC_OPEN};
    o.u.open.channel = 9;
    o.u.open.id = 1;
    n = cluster_cmd_msg_encode(buf, sizeof buf, &o);
    CHECK(cluster_cmd_msg_decode(&out, buf, n, err));
    CHECK(strstr(err, "channel"));
    /* OPEN of a forward channel (a relayed API request) round-trips. */
    o.u.open.channel = CHAN_FWD;
    snprintf(o.u.open.addr, sizeof o.u.open.addr, "10.0.0.1:7100");
    n = cluster_cmd_msg_encode(buf, sizeof buf, &o);
    CHECKF(n && !cluster_cmd_msg_decode(&out, buf, n, err), "%s", err);
    CHECK(out.u.open.channel == CHAN_FWD && out.u.open.id == 1);
    CHECK_STR(out.u.open.addr, "10.0.0.1:7100");
    /* LOADS: the leader's copy of every node's load, exact both ways; every truncation, more
     * loads than fit, and node id 0 refused. */
    struct cl_msg l = {.type = MSGC_LOADS};
    l.u.loads.n = 2;
    l.u.loads.id[0] = 1, l.u.loads.id[1] = 3;
    l.u.loads.age_ms[0] = 40, l.u.loads.age_ms[1] = 95;
    l.u.loads.load[0] = (struct cl_load){.queue_len = 3, .kv_used = 0.5f, .idle_ms = -1};
    l.u.loads.load[1] = (struct cl_load){.queue_len = 9, .running = 4, .queued_tokens = 1234};
    n = cluster_cmd_msg_encode(buf, sizeof buf, &l);
    CHECK(n);
    CHECKF(!cluster_cmd_msg_decode(&out, buf, n, err), "%s", err);
    CHECK_EQ_INT(out.u.loads.n, 2);
    CHECK_EQ_INT(out.u.loads.id[1], 3);
    CHECK_EQ_INT(out.u.loads.age_ms[1], 95);
    CHECK_EQ_INT(out.u.loads.load[1].queued_tokens, 1234);
    CHECK_EQ_INT(cluster_cmd_msg_encode(buf2, sizeof buf2, &out), n);
    CHECK(!memcmp(buf, buf2, n));
    for (size_t k = 0; k < n; k++) CHECK(cluster_cmd_msg_decode(&out, buf, k, err));
    buf[2] = CL_MAX_LOADS + 1; /* version, type, n */
    CHECK(cluster_cmd_msg_decode(&out, buf, n, err));
    CHECK(strstr(err, "at most"));
    l.u.loads.id[0] = 0;
    n = cluster_cmd_msg_encode(buf, sizeof buf, &l);
    CHECK(cluster_cmd_msg_decode(&out, buf, n, err));
    CHECK(strstr(err, "node id 0"));
}

TEST(state_apply_membership_holdings_scaling)
{
    static struct cl_state s;
    cluster_state_init(&s);
    struct cl_cmd c;
    for (uint64_t id = 1; id <= 3; id++)
        CHECK_EQ_INT(cluster_state_apply(&s, (c = node_up(id, id), &c)), 0);
    CHECK_EQ_INT(s.n_members, 3);
    CHECK_EQ_INT(s.n_events, 3);
    /* Up again while alive: info refreshed, no new event. */
    CHECK_EQ_INT(cluster_state_apply(&s, (c = node_up(2, 50), &c)), 0);
    CHECK_EQ_INT(s.n_events, 3);
    CHECK_EQ_INT(cluster_state_apply(&s, (c = holding(1, "llama", 1, 1, 22, 22), &c)), 0);
    CHECK_EQ_INT(s.n_models, 1);
    /* A holding of an unknown node is a no-op, counted. */
    CHECK_EQ_INT(cluster_state_apply(&s, (c = holding(9, "llama", 1, 1, 22, 22), &c)), 1);
    CHECK_EQ_INT(s.rejected, 1);
    /* Scale up node 2 from node 1: in progress, node 2 joins with k = 0 of 22. */
    CHECK_EQ_INT(cluster_state_apply(&s, (c = scale(SCALE_UP, "llama", 1, 2), &c)), 0);
    CHECK_EQ_INT(s.n_scaleouts, 1);
    /* The planner's reason travels with the decision into the event (every node shows it). */
    CHECK_STR(s.event[(s.n_events - 1) % CL_MAX_EVENTS].reason,
              "predicted TTFT 812 ms > SLO 300 ms");
    CHECK_STR(s.scaleout[0].s.reason, "predicted TTFT 812 ms > SLO 300 ms");
    const struct cl_member *m2 = cluster_state_member_c(&s, 2);
    CHECK(m2->hold[0].engine && m2->hold[0].layers_resident == 0 && m2->hold[0].n_layers == 22);
    CHECK_EQ_INT(cluster_state_apply(&s, (c = holding(2, "llama", 0, 1, 22, 22), &c)), 0);
    c = (struct cl_cmd){.type = CMD_SCALE_DONE, .t_ms = 60, .u.done = {s.scaleout[0].scale_id, 1}};
    CHECK_EQ_INT(cluster_state_apply(&s, &c), 0);
    CHECK_EQ_INT(s.n_scaleouts, 0);
    /* Done twice: no-op. */
    CHECK_EQ_INT(cluster_state_apply(&s, &c), 1);
    /* A replication onto node 3 that node 3 refused: abandoned, the event names node 3 and why. */
    CHECK_EQ_INT(cluster_state_apply(&s, (c = scale(SCALE_REPLICATE, "llama", 1, 3), &c)), 0);
    c = (struct cl_cmd){.type = CMD_SCALE_DONE,
                        .t_ms = 65,
                        .u.done = {s.scaleout[0].scale_id, 0, 3, "its slot is taken"}};
    CHECK_EQ_INT(cluster_state_apply(&s, &c), 0);
    CHECK_EQ_INT(s.n_scaleouts, 0);
    const struct cl_event *ab = &s.event[(s.n_events - 1) % CL_MAX_EVENTS];
    CHECK(ab->type == CMD_SCALE_DONE && ab->kind == 0 && ab->node == 3 && ab->source == 1);
    CHECK_STR(ab->reason, "its slot is taken");
    CHECK_STR(ab->model, "llama");
    /* Scale down node 1: its engine is gone at once, the host copy stays. */
    CHECK_EQ_INT(cluster_state_apply(&s, (c = scale(SCALE_DOWN, "llama", 0, 1), &c)), 0);
    const struct cl_member *m1 = cluster_state_member_c(&s, 1);
    CHECK(!m1->hold[0].engine && m1->hold[0].host);
    c = (struct cl_cmd){.type = CMD_NODE_DOWN, .t_ms = 70, .u.down = 3};
    CHECK_EQ_INT(cluster_state_apply(&s, &c), 0);
    CHECK(!cluster_state_member_c(&s, 3)->alive);
    CHECK_EQ_INT(cluster_state_member_c(&s, 3)->since_ms, 70);
    /* its death and the time it was up count (its failure rate's evidence) */
    CHECK_EQ_INT(cluster_state_member_c(&s, 3)->downs, 1);
    CHECK_EQ_INT(cluster_state_member_c(&s, 3)->up_ms, 70 - 3);
    CHECK_EQ_INT(cluster_state_apply(&s, &c), 1); /* already down */
    CHECK_EQ_INT(cluster_state_member_c(&s, 3)->downs, 1);
    const struct cl_event *e = &s.event[(s.n_events - 1) % CL_MAX_EVENTS];
    CHECK_EQ_INT(e->type, CMD_NODE_DOWN);
    CHECK_EQ_INT(e->t_ms, 70);
    /* A change of raft's configuration is an event, nothing else. */
    uint32_t members = s.n_members;
    c = (struct cl_cmd){.type = CMD_RAFT_CONF, .t_ms = 80, .u.conf = {3, CONF_REMOVED}};
    CHECK_EQ_INT(cluster_state_apply(&s, &c), 0);
    e = &s.event[(s.n_events - 1) % CL_MAX_EVENTS];
    CHECK(e->type == CMD_RAFT_CONF && e->kind == CONF_REMOVED && e->node == 3 && e->t_ms == 80);
    CHECK_EQ_INT(s.n_members, members);
    static uint8_t buf[1 << 16];
    static struct cl_state t;
    char err[ERRMSG_LEN];
    size_t n = cluster_state_encode(&s, buf, sizeof buf);
    CHECKF(n && !cluster_state_decode(&t, buf, n, err), "%s", err);
    CHECK_EQ_INT(t.event[(t.n_events - 1) % CL_MAX_EVENTS].kind, CONF_REMOVED);
}

/* ---------------------------------------------------------------- the voter policy */

/* A state whose members 1..n are up, those in down[] down since t_ms 1000. */
static void policy_state(struct cl_state *s, int n, const uint64_t *down, int n_down)
{
    struct cl_cmd c;
    cluster_state_init(s);
    for (int id = 1; id <= n; id++) cluster_state_apply(s, (c = node_up((uint64_t)id, 10), &c));
    for (int i = 0; i < n_down; i++) {
        c = (struct cl_cmd){.type = CMD_NODE_DOWN, .t_ms = 1000, .u.down = down[i]};
        cluster_state_apply(s, &c);
    }
}

static struct vp_action policy(const struct cl_state *s, const struct vp_server *conf, int n,
                               uint64_t now, uint64_t remove_ms)
{
    struct vp_input in = {.st = s,
                          .conf = conf,
                          .n_conf = n,
                          .self = 1,
                          .now_ms = now,
                          .leader_since = 500,
                          .remove_ms = remove_ms};
    return voter_policy_step(&in);
}

TEST(voter_policy_removes_promotes_keeps)
{
    static struct cl_state s;
    struct vp_action a;
    const struct vp_server four[] = {{1, 1}, {2, 1}, {3, 1}, {4, 1}};
    /* Four voters, node 4 down at t = 1000: removed once down for remove_ms, not before. */
    policy_state(&s, 4, (uint64_t[]){4}, 1);
    a = policy(&s, four, 4, 1000 + 5999, 6000);
    CHECK_EQ_INT(a.kind, VP_NONE);
    a = policy(&s, four, 4, 1000 + 6000, 6000);
    CHECK(a.kind == VP_REMOVE && a.node == 4);
    /* Node 4 rejoined (raft_voter at t = 50000) and has not reported yet: remove_ms from then. */
    struct cl_cmd back = {.type = CMD_RAFT_CONF, .t_ms = 50000, .u.conf = {4, CONF_VOTER}};
    cluster_state_apply(&s, &back);
    CHECK_EQ_INT(policy(&s, four, 4, 50000 + 5999, 6000).kind, VP_NONE);
    a = policy(&s, four, 4, 50000 + 6000, 6000);
    CHECK(a.kind == VP_REMOVE && a.node == 4);
    policy_state(&s, 4, (uint64_t[]){4}, 1);
    /* remove_ms 0: never. */
    CHECK_EQ_INT(policy(&s, four, 4, 1000000, 0).kind, VP_NONE);
    /* Three voters, one dead: removing it leaves two (quorum 2 either way), so it stays. */
    const struct vp_server three[] = {{1, 1}, {2, 1}, {4, 1}};
    a = policy(&s, three, 3, 100000, 6000);
    CHECK(a.kind == VP_KEEP && a.node == 4);
    /* ... unless a live non-voter can take its place: promoted first, then the dead one goes. */
    const struct vp_server spare[] = {{1, 1}, {2, 1}, {4, 1}, {3, 0}};
    a = policy(&s, spare, 4, 100000, 6000);
    CHECK(a.kind == VP_PROMOTE && a.node == 3);
    const struct vp_server promoted[] = {{1, 1}, {2, 1}, {4, 1}, {3, 1}};
    a = policy(&s, promoted, 4, 100000, 6000);
    CHECK(a.kind == VP_REMOVE && a.node == 4);
    /* A dead non-voter goes first, whatever the voters. */
    const struct vp_server dead_spare[] = {{1, 1}, {2, 1}, {3, 1}, {4, 0}};
    a = policy(&s, dead_spare, 4, 100000, 6000);
    CHECK(a.kind == VP_REMOVE && a.node == 4);
    /* A server the state never saw counts from the leader's election (t = 500); the leader
     * itself is never removed, even if the state says it is down. */
    const struct vp_server ghost[] = {{1, 1}, {2, 1}, {3, 1}, {4, 1}, {9, 1}};
    policy_state(&s, 4, (uint64_t[]){1}, 1);
    CHECK_EQ_INT(policy(&s, ghost, 5, 500 + 5999, 6000).kind, VP_NONE);
    a = policy(&s, ghost, 5, 500 + 6000, 6000);
    CHECK(a.kind == VP_REMOVE && a.node == 9);
    /* Two voters and a live non-voter (a join cut short): promoted. */
    policy_state(&s, 3, NULL, 0);
    const struct vp_server two[] = {{1, 1}, {2, 1}, {3, 0}};
    a = policy(&s, two, 3, 2000, 6000);
    CHECK(a.kind == VP_PROMOTE && a.node == 3);
}

/* Racks: node 4 (rack b) is dead past remove_ms and only three voters remain, so a live
 * non-voter is promoted first: node 5 (rack b, no live voter there), not node 3 (rack a, which
 * already has voters 1 and 2), though node 3 comes first in raft's order. */
static void set_rack(struct cl_state *s, uint64_t id, const char *rack)
{
    struct cl_member *m = cluster_state_member(s, id);
    snprintf(m->info.rack, sizeof m->info.rack, "%s", rack);
}

TEST(voter_policy_promotes_into_the_rack_with_fewest_voters)
{
    static struct cl_state s;
    struct vp_action a;
    policy_state(&s, 5, (uint64_t[]){4}, 1);
    set_rack(&s, 1, "a");
    set_rack(&s, 2, "a");
    set_rack(&s, 3, "a");
    set_rack(&s, 4, "b");
    set_rack(&s, 5, "b");
    const struct vp_server conf[] = {{1, 1}, {2, 1}, {4, 1}, {3, 0}, {5, 0}};
    a = policy(&s, conf, 5, 100000, 6000);
    CHECK(a.kind == VP_PROMOTE && a.node == 5);
    /* Two voters (a join cut short), both in rack a: the spare of rack b again. */
    policy_state(&s, 5, NULL, 0);
    set_rack(&s, 1, "a");
    set_rack(&s, 2, "a");
    set_rack(&s, 3, "a");
    set_rack(&s, 5, "b");
    const struct vp_server two[] = {{1, 1}, {2, 1}, {3, 0}, {5, 0}};
    a = policy(&s, two, 4, 2000, 6000);
    CHECK(a.kind == VP_PROMOTE && a.node == 5);
    /* A dead non-voter of the empty rack is no candidate: the live one of rack a is. */
    policy_state(&s, 5, (uint64_t[]){5}, 1);
    set_rack(&s, 5, "b");
    const struct vp_server spare_dead[] = {{1, 1}, {2, 1}, {3, 0}, {5, 0}};
    a = policy(&s, spare_dead, 4, 100000, 6000);
    CHECK(a.kind == VP_REMOVE && a.node == 5); /* the dead non-voter goes first */
    const struct vp_server spare_gone[] = {{1, 1}, {2, 1}, {3, 0}};
    a = policy(&s, spare_gone, 3, 100000, 6000);
    CHECK(a.kind == VP_PROMOTE && a.node == 3);
}

TEST(snapshot_roundtrip_and_rejects)
{
    static struct cl_state s, t;
    static uint8_t buf[1 << 16], buf2[1 << 16];
    char err[ERRMSG_LEN];
    cluster_state_init(&s);
    struct cl_cmd c;
    for (uint64_t id = 1; id <= 5; id++) cluster_state_apply(&s, (c = node_up(id, id), &c));
    for (int i = 0; i < 40; i++) /* wraps the event ring */
        cluster_state_apply(&s, (c = scale(i % 2 ? SCALE_DOWN : SCALE_UP, "m", 1, 2 + i % 3), &c));
    cluster_state_apply(&s, (c = holding(4, "other", 1, 0, 0, 30), &c));
    c = (struct cl_cmd){
        .type = CMD_SCALE_DONE, .t_ms = 90, .u.done = {s.scaleout[0].scale_id, 0, 2, "no"}};
    CHECK_EQ_INT(cluster_state_apply(&s, &c), 0);
    c = (struct cl_cmd){.type = CMD_NODE_DOWN, .t_ms = 95, .u.down = 4};
    CHECK_EQ_INT(cluster_state_apply(&s, &c), 0);
    CHECK(cluster_state_encoded_max() <= sizeof buf);
    size_t n = cluster_state_encode(&s, buf, sizeof buf);
    CHECK(n);
    CHECKF(!cluster_state_decode(&t, buf, n, err), "%s", err);
    CHECK_EQ_INT(cluster_state_encode(&t, buf2, sizeof buf2), n);
    CHECK(!memcmp(buf, buf2, n));
    CHECK_EQ_INT(t.n_events, s.n_events);
    CHECK_EQ_INT(t.n_scaleouts, s.n_scaleouts);
    CHECKF(!strcmp(t.member[3].info.rack, "row1.rack-1_B"), "%s", t.member[3].info.rack);
    CHECK(t.member[3].downs == 1 && t.member[3].up_ms == 95 - 4 && !t.member[3].alive);
    /* version 6 carries both: a member's deaths and uptime (above), a scale-out's reason */
    CHECK(t.n_scaleouts > 0);
    CHECK_STR(t.scaleout[0].s.reason, "predicted TTFT 812 ms > SLO 300 ms");
    CHECK_STR(t.event[(t.n_events - 2) % CL_MAX_EVENTS].reason, "no"); /* the abandon's reason */
    for (size_t k = 0; k < n; k += 7) CHECK(cluster_state_decode(&t, buf, k, err));
    CHECK(cluster_state_decode(&t, buf, n - 1, err));
    buf[n] = 0;
    CHECK(cluster_state_decode(&t, buf, n + 1, err));
    buf[4] = 200; /* 200 members */
    CHECK(cluster_state_decode(&t, buf, n, err));
    CHECK(strstr(err, "exceed"));
    buf[4] = 5;
    buf[24] = CL_CMD_VERSION - 1; /* a snapshot of the previous encoding */
    CHECK(cluster_state_decode(&t, buf, n, err));
    CHECKF(strstr(err, "version"), "%s", err);
}

/* ---------------------------------------------------------------- under raft's fixture */

struct fx_fsm {
    struct raft_fsm fsm;
    struct cl_state st;
};

static int fx_apply(struct raft_fsm *fsm, const struct raft_buffer *buf, void **result)
{
    struct fx_fsm *f = fsm->data;
    struct cl_cmd c;
    *result = NULL;
    if (cluster_cmd_decode(&c, buf->base, buf->len, NULL)) {
        f->st.applied++;
        f->st.rejected++;
        return 0;
    }
    cluster_state_apply(&f->st, &c);
    return 0;
}

static int fx_snapshot(struct raft_fsm *fsm, struct raft_buffer *bufs[], unsigned *n)
{
    struct fx_fsm *f = fsm->data;
    *bufs = raft_malloc(sizeof **bufs);
    (*bufs)[0].base = raft_malloc(cluster_state_encoded_max());
    (*bufs)[0].len = cluster_state_encode(&f->st, (*bufs)[0].base, cluster_state_encoded_max());
    *n = 1;
    return 0;
}

static int restores;

static int fx_restore(struct raft_fsm *fsm, struct raft_buffer *buf)
{
    struct fx_fsm *f = fsm->data;
    restores++;
    int rc = cluster_state_decode(&f->st, buf->base, buf->len, NULL);
    if (!rc) raft_free(buf->base);
    return rc ? RAFT_CORRUPT : 0;
}

static struct fx_fsm fx[4];
static struct raft_fixture F;

static void fx_setup_n(unsigned n)
{
    struct raft_configuration conf;
    memset(&F, 0, sizeof F);
    CHECK(!raft_fixture_initialize(&F));
    for (unsigned i = 0; i < n; i++) {
        fx[i].fsm = (struct raft_fsm){.version = 1,
                                      .data = &fx[i],
                                      .apply = fx_apply,
                                      .snapshot = fx_snapshot,
                                      .restore = fx_restore};
        cluster_state_init(&fx[i].st);
        CHECK(!raft_fixture_grow(&F, &fx[i].fsm));
    }
    CHECK(!raft_fixture_configuration(&F, n, &conf));
    CHECK(!raft_fixture_bootstrap(&F, &conf));
    raft_configuration_close(&conf);
    for (unsigned i = 0; i < n; i++) {
        raft_set_snapshot_threshold(raft_fixture_get(&F, i), 8);
        raft_set_snapshot_trailing(raft_fixture_get(&F, i), 2);
        raft_set_pre_vote(raft_fixture_get(&F, i), true); /* as cluster/control.c sets raft up */
    }
    CHECK(!raft_fixture_start(&F));
}

static void fx_setup(void)
{
    fx_setup_n(3);
}

static struct raft_apply reqs[64];
static int n_reqs;

/* Propose a command on the leader; returns the index it will have. */
static raft_index propose(unsigned leader, const struct cl_cmd *c)
{
    struct raft *r = raft_fixture_get(&F, leader);
    struct raft_buffer b = {.base = raft_malloc(CL_CMD_MAX)};
    b.len = cluster_cmd_encode(b.base, CL_CMD_MAX, c);
    CHECK(n_reqs < 64);
    CHECK(!raft_apply(r, &reqs[n_reqs++], &b, 1, NULL));
    return raft_last_index(r);
}

static int same_state(unsigned a, unsigned b)
{
    static uint8_t x[1 << 16], y[1 << 16];
    size_t nx = cluster_state_encode(&fx[a].st, x, sizeof x),
           ny = cluster_state_encode(&fx[b].st, y, sizeof y);
    return nx == ny && !memcmp(x, y, nx);
}

TEST(raft_fixture_leader_dies_state_survives)
{
    fx_setup();
    raft_fixture_elect(&F, 0);
    CHECK_EQ_INT(raft_fixture_leader_index(&F), 0);
    struct cl_cmd c;
    raft_index idx = 0;
    for (uint64_t id = 1; id <= 3; id++) idx = propose(0, (c = node_up(id, id), &c));
    idx = propose(0, (c = scale(SCALE_UP, "llama", 1, 2), &c));
    CHECK(raft_fixture_step_until_applied(&F, 3, idx, 5000));
    CHECK(same_state(0, 1) && same_state(0, 2));
    CHECK_EQ_INT(fx[1].st.n_scaleouts, 1);
    /* The leader dies: another is elected by the survivors and the state is intact. */
    raft_fixture_kill(&F, 0);
    CHECK(raft_fixture_step_until_has_no_leader(&F, 10000));
    CHECK(raft_fixture_step_until_has_leader(&F, 10000));
    unsigned l = raft_fixture_leader_index(&F);
    CHECK(l == 1 || l == 2);
    c = (struct cl_cmd){.type = CMD_NODE_DOWN, .t_ms = 99, .u.down = 1};
    idx = propose(l, &c);
    CHECK(raft_fixture_step_until_applied(&F, l, idx, 5000));
    CHECK(raft_fixture_step_until_applied(&F, 3 - l, idx, 5000));
    CHECK(same_state(1, 2));
    CHECK_EQ_INT(fx[l].st.n_scaleouts, 1);
    CHECK(!cluster_state_member_c(&fx[l].st, 1)->alive);
    raft_fixture_close(&F);
    n_reqs = 0;
}

TEST(raft_fixture_partitioned_node_stops_then_catches_up)
{
    fx_setup();
    raft_fixture_elect(&F, 0);
    struct cl_cmd c;
    raft_index idx = propose(0, (c = node_up(1, 1), &c));
    CHECK(raft_fixture_step_until_applied(&F, 3, idx, 5000));
    /* Cut node 2 off from both others. */
    raft_fixture_disconnect(&F, 2, 0);
    raft_fixture_disconnect(&F, 0, 2);
    raft_fixture_disconnect(&F, 2, 1);
    raft_fixture_disconnect(&F, 1, 2);
    /* The majority keeps deciding (enough entries for a snapshot); node 2 applies none, and is
     * never a leader on its own: it cannot win a vote. */
    uint64_t applied2 = fx[2].st.applied;
    for (uint64_t id = 2; id <= 20; id++) idx = propose(0, (c = node_up(id, id), &c));
    CHECK(raft_fixture_step_until_applied(&F, 0, idx, 10000));
    raft_fixture_step_until_elapsed(&F, 3000);
    CHECK_EQ_INT(fx[2].st.applied, applied2);
    CHECK(raft_state(raft_fixture_get(&F, 2)) != RAFT_LEADER);
    CHECK(raft_state(raft_fixture_get(&F, 0)) == RAFT_LEADER);
    /* Heal: node 2 catches up (from a snapshot: the log was compacted) to the same state. */
    raft_fixture_reconnect(&F, 2, 0);
    raft_fixture_reconnect(&F, 0, 2);
    raft_fixture_reconnect(&F, 2, 1);
    raft_fixture_reconnect(&F, 1, 2);
    restores = 0;
    CHECK(raft_fixture_step_until_applied(&F, 2, idx, 10000));
    CHECK(same_state(0, 2));
    CHECK_EQ_INT(restores, 1);
    CHECK_EQ_INT(fx[2].st.n_members, 20);
    raft_fixture_close(&F);
    n_reqs = 0;
}

/* ---------------------------------------------------------------- removal under the fixture */

static int change_status = -1;

static void change_done(struct raft_change *req, int status)
{
    (void)req;
    change_status = status;
}

/* Raft's configuration on server i, for the policy. */
static int fx_conf(unsigned i, struct vp_server *out)
{
    const struct raft_configuration *c = &raft_fixture_get(&F, i)->configuration;
    for (unsigned k = 0; k < c->n; k++)
        out[k] = (struct vp_server){c->servers[k].id, c->servers[k].role == RAFT_VOTER};
    return (int)c->n;
}

static bool change_finished(struct raft_fixture *f, void *arg)
{
    (void)f, (void)arg;
    return change_status >= 0;
}

/* Run the policy on the leader and carry out what it says (as cluster/control_conf.c's control_conf_tick). */
static struct vp_action fx_policy_step(unsigned leader, uint64_t now)
{
    struct vp_server conf[8];
    struct vp_input in = {.st = &fx[leader].st,
                          .n_conf = fx_conf(leader, conf),
                          .conf = conf,
                          .self = leader + 1,
                          .now_ms = now,
                          .leader_since = 0,
                          .remove_ms = 6000};
    struct vp_action a = voter_policy_step(&in);
    static struct raft_change req;
    change_status = -1;
    struct raft *r = raft_fixture_get(&F, leader);
    if (a.kind == VP_REMOVE) CHECK(!raft_remove(r, &req, a.node, change_done));
    if (a.kind == VP_PROMOTE) CHECK(!raft_assign(r, &req, a.node, RAFT_VOTER, change_done));
    if (a.kind == VP_REMOVE || a.kind == VP_PROMOTE) {
        CHECK(raft_fixture_step_until(&F, change_finished, NULL, 10000));
        CHECK_EQ_INT(change_status, 0);
    }
    return a;
}

static int fx_voters(unsigned i)
{
    struct vp_server conf[8];
    int n = fx_conf(i, conf), v = 0;
    for (int k = 0; k < n; k++) v += conf[k].voter;
    return v;
}

/* Four voters; node 4 dies for good and is committed down. Then node 3 dies too. */
static void four_lose_two(int remove_first, raft_index *idx_out, int *committed)
{
    fx_setup_n(4);
    raft_fixture_elect(&F, 0);
    struct cl_cmd c;
    raft_index idx = 0;
    for (uint64_t id = 1; id <= 4; id++) idx = propose(0, (c = node_up(id, id), &c));
    CHECK(raft_fixture_step_until_applied(&F, 4, idx, 5000));
    raft_fixture_kill(&F, 3);
    c = (struct cl_cmd){.type = CMD_NODE_DOWN, .t_ms = 1000, .u.down = 4};
    idx = propose(0, &c);
    CHECK(raft_fixture_step_until_applied(&F, 0, idx, 5000));
    if (remove_first) {
        /* Before remove_ms nothing; after, node 4 leaves the configuration. */
        CHECK_EQ_INT(fx_policy_step(0, 1000 + 5999).kind, VP_NONE);
        struct vp_action a = fx_policy_step(0, 1000 + 6000);
        CHECK(a.kind == VP_REMOVE && a.node == 4);
        CHECK_EQ_INT(fx_voters(0), 3);
        c = (struct cl_cmd){.type = CMD_RAFT_CONF, .t_ms = 7000, .u.conf = {4, CONF_REMOVED}};
        idx = propose(0, &c);
        CHECK(raft_fixture_step_until_applied(&F, 1, idx, 5000));
        CHECK(raft_fixture_step_until_applied(&F, 2, idx, 5000));
        CHECK_EQ_INT(fx_voters(1), 3);
        /* Three voters, all alive: the policy keeps the quorum at 3 from here. */
        CHECK_EQ_INT(fx_policy_step(0, 100000).kind, VP_NONE);
    }
    /* Node 3 dies as well: the leader (node 1) proposes node 3 down. */
    raft_fixture_kill(&F, 2);
    c = (struct cl_cmd){.type = CMD_NODE_DOWN, .t_ms = 9000, .u.down = 3};
    idx = propose(0, &c);
    *committed = raft_fixture_step_until_applied(&F, 1, idx, 10000);
    *idx_out = idx;
}

TEST(raft_fixture_dead_voter_removed_two_of_three_still_commit)
{
    raft_index idx;
    int committed;
    /* Without the removal: 2 live of 4 voters, below the quorum of 3: nothing commits. */
    four_lose_two(0, &idx, &committed);
    CHECK(!committed);
    CHECK(raft_fixture_get(&F, 0)->commit_index < idx);
    raft_fixture_close(&F);
    n_reqs = 0;
    /* With it: 2 live of 3 voters is a quorum: node 3's NODE_DOWN commits on both. */
    four_lose_two(1, &idx, &committed);
    CHECK(committed);
    CHECK(raft_fixture_step_until_applied(&F, 0, idx, 5000));
    CHECK(!cluster_state_member_c(&fx[1].st, 3)->alive);
    CHECK(same_state(0, 1));
    /* Node 4 comes back: it learns nothing by itself (no one replicates to a server outside the
     * configuration) and rejoins the way control_conf.c's JOIN does: raft_add, then assign VOTER. */
    raft_fixture_revive(&F, 3);
    raft_fixture_step_until_elapsed(&F, 2000);
    CHECK(fx[3].st.applied < fx[0].st.applied);
    /* Nor does it disturb the leader (pre-vote; voters that hear their leader refuse it). */
    CHECK(raft_state(raft_fixture_get(&F, 0)) == RAFT_LEADER);
    CHECK(raft_state(raft_fixture_get(&F, 3)) != RAFT_LEADER);
    static struct raft_change add;
    change_status = -1;
    CHECK(!raft_add(raft_fixture_get(&F, 0), &add, 4, "4", change_done));
    CHECK(raft_fixture_step_until(&F, change_finished, NULL, 10000) && change_status == 0);
    change_status = -1;
    CHECK(!raft_assign(raft_fixture_get(&F, 0), &add, 4, RAFT_VOTER, change_done));
    CHECK(raft_fixture_step_until(&F, change_finished, NULL, 10000) && change_status == 0);
    CHECK_EQ_INT(fx_voters(0), 4);
    struct cl_cmd c = node_up(4, 10000);
    idx = propose(0, &c);
    CHECK(raft_fixture_step_until_applied(&F, 3, idx, 10000));
    CHECK(same_state(0, 3));
    CHECK_EQ_INT(fx_voters(3), 4);
    CHECK(cluster_state_member_c(&fx[3].st, 4)->alive);
    raft_fixture_close(&F);
    n_reqs = 0;
}

/* A model no live node holds whole: cluster_state_missing from the members alone, CMD_MODEL's
 * fields checked, its record and event, through a snapshot. */
TEST(model_lost_and_found)
{
    struct cl_state s;
    cluster_state_init(&s);
    struct cl_cmd c;
    for (uint64_t id = 1; id <= 3; id++) CHECK(!cluster_state_apply(&s, (c = node_up(id, 1), &c)));
    CHECK(!cluster_state_apply(&s, (c = holding(1, "m", 1, 1, 5, 5), &c)));
    CHECK(!cluster_state_apply(&s, (c = holding(2, "m", 0, 1, 2, 5), &c)));
    CHECK(!cluster_state_apply(&s, (c = holding(3, "m", 0, 0, 0, 5), &c)));
    uint16_t first, L;
    uint64_t holder;
    CHECK(!cluster_state_missing(&s, 0, &first, &L, &holder) && holder == 1);
    c = (struct cl_cmd){.type = CMD_NODE_DOWN, .t_ms = 20, .u.down = 1};
    CHECK(!cluster_state_apply(&s, &c));
    CHECK(cluster_state_missing(&s, 0, &first, &L, &holder));
    CHECK(first == 2 && L == 5 && holder == 0);
    /* node 2's partial engine dies too: nothing of it anywhere */
    c = (struct cl_cmd){.type = CMD_NODE_DOWN, .t_ms = 21, .u.down = 2};
    CHECK(!cluster_state_apply(&s, &c));
    CHECK(cluster_state_missing(&s, 0, &first, &L, &holder) && first == 0 && L == 5);
    c = (struct cl_cmd){.type = CMD_MODEL, .t_ms = 22, .u.model = {"m", 1, 0, 5, 0}};
    CHECK(!cluster_state_apply(&s, &c));
    CHECK(s.lost[0].lost && s.lost[0].first == 0 && s.lost[0].n_layers == 5 &&
          s.lost[0].since_ms == 22);
    const struct cl_event *e = &s.event[(s.n_events - 1) % CL_MAX_EVENTS];
    CHECK(e->type == CMD_MODEL && e->kind == 1 && !strcmp(e->model, "m"));
    CHECK_STR(e->reason, "layers [0, 5) of 5 held by no live node");
    /* the snapshot keeps the record */
    static uint8_t snap[1 << 20];
    size_t n = cluster_state_encode(&s, snap, sizeof snap);
    struct cl_state back;
    char err[ERRMSG_LEN];
    CHECKF(n && !cluster_state_decode(&back, snap, n, err), "%s", err);
    CHECK(back.lost[0].lost == 1 && back.lost[0].n_layers == 5 && back.lost[0].since_ms == 22);
    /* a holder returns, whole in host memory */
    c = node_up(4, 30);
    CHECK(!cluster_state_apply(&s, &c));
    CHECK(!cluster_state_apply(&s, (c = holding(4, "m", 1, 0, 0, 5), &c)));
    CHECK(!cluster_state_missing(&s, 0, &first, &L, &holder) && holder == 4);
    c = (struct cl_cmd){.type = CMD_MODEL, .t_ms = 31, .u.model = {"m", 0, 0, 5, 4}};
    CHECK(!cluster_state_apply(&s, &c));
    CHECK(!s.lost[0].lost);
    e = &s.event[(s.n_events - 1) % CL_MAX_EVENTS];
    CHECK(e->kind == 0 && e->node == 4);
    CHECK_STR(e->reason, "all 5 layers on node 4");
    /* inconsistent commands refused by the decoder */
    const struct cl_cmd bad[] = {
        {.type = CMD_MODEL, .u.model = {"m", 1, 5, 5, 0}}, /* first >= L */
        {.type = CMD_MODEL, .u.model = {"m", 1, 2, 5, 3}}, /* lost, with a holder */
        {.type = CMD_MODEL, .u.model = {"m", 0, 0, 5, 0}}, /* found, without one */
        {.type = CMD_MODEL, .u.model = {"m", 0, 1, 5, 3}}, /* found, with a first layer */
        {.type = CMD_MODEL, .u.model = {"", 1, 0, 5, 0}},  /* no name */
        {.type = CMD_MODEL, .u.model = {"m", 1, 0, 0, 0}}, /* no layers */
        {.type = CMD_MODEL, .u.model = {"m", 2, 0, 5, 0}}, /* lost is a flag */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t buf[CL_CMD_MAX];
        struct cl_cmd out;
        size_t k = enc(&bad[i], buf);
        CHECKF(k && cluster_cmd_decode(&out, buf, k, err), "bad %zu", i);
    }
}

int main(void)
{
    RUN(cmd_roundtrip_every_type);
    RUN(model_lost_and_found);
    RUN(cmd_rejects_bad_fields);
    RUN(msg_roundtrip_and_rejects);
    RUN(state_apply_membership_holdings_scaling);
    RUN(snapshot_roundtrip_and_rejects);
    RUN(raft_fixture_leader_dies_state_survives);
    RUN(raft_fixture_partitioned_node_stops_then_catches_up);
    RUN(voter_policy_removes_promotes_keeps);
    RUN(voter_policy_promotes_into_the_rack_with_fewest_voters);
    RUN(raft_fixture_dead_voter_removed_two_of_three_still_commit);
    CHECK_DONE();
}
