/* The control plane's view of the cluster (control_view_of) and the leader's commands
 * (control_leader_commands), as pure functions of a committed state and load reports, without
 * raft: a joiner of a model deeper than model 0 gets its helper and is routed to; plan ids are
 * ranks (node ids past INT_MAX map back exactly); unknown plan kinds and actions outside the view
 * are left out, a scale-down carries its receiver; every model's bytes come from a holder's
 * report; what the planner is fed is measured (link rates from the latest weight stream, failure
 * probability from deaths over uptime, one domain per host, per-node step models once fitted,
 * the forecast) and reports older than the dead time count for nothing; two threads build views
 * at once without sharing scratch. */
#include "check.h"
#include "cluster/control_internal.h"

#include <pthread.h>

#define BIG (1ull << 40)

static struct cl_state st;
static struct report rep[CL_MAX_NODES];
static int n_rep;

static void apply(struct cl_cmd c)
{
    CHECK_EQ_INT(cluster_state_apply(&st, &c), 0);
}

static void up(uint64_t id, const char *host, uint64_t t)
{
    struct cl_cmd c = {.type = CMD_NODE_UP, .t_ms = t};
    c.u.up.id = id;
    snprintf(c.u.up.addr, sizeof c.u.up.addr, "%s:7100", host);
    snprintf(c.u.up.http, sizeof c.u.up.http, "%s:8080", host);
    snprintf(c.u.up.fabric, sizeof c.u.up.fabric, "%s:%d", host, 7200 + (int)(id % 1000));
    snprintf(c.u.up.gpu, sizeof c.u.up.gpu, "cpu");
    c.u.up.role = ROLE_VOTER;
    apply(c);
}

static void hold(uint64_t id, const char *model, int host, int engine, int k, int L)
{
    struct cl_cmd c = {.type = CMD_HOLDING, .t_ms = 1};
    c.u.hold = (struct cl_holding){.node = id,
                                   .host = (uint8_t)host,
                                   .engine = (uint8_t)engine,
                                   .layers_resident = (uint16_t)k,
                                   .n_layers = (uint16_t)L};
    snprintf(c.u.hold.model, sizeof c.u.hold.model, "%s", model);
    apply(c);
}

static struct cl_load *report(uint64_t id, uint64_t at)
{
    struct report *r = &rep[n_rep++];
    memset(r, 0, sizeof *r);
    r->id = id;
    r->at_ms = at;
    r->load.idle_ms = -1;
    r->load.step_a = 1e-4f;
    r->load.step_c = 1e-3f;
    r->load.step_corr = 1;
    return &r->load;
}

static struct view_in input(void)
{
    return (struct view_in){.st = &st,
                            .rep = rep,
                            .n_rep = n_rep,
                            .model = "a",
                            .model_bytes = 1000,
                            .ttft_slo_ms = 1000,
                            .tpot_slo_ms = 200,
                            .keep_alive_ms = 5000,
                            .replicas_cached = 1,
                            .dead_ms = 1000,
                            .now_mono = 10000,
                            .now_wall = 86400000};
}

/* Node 1 serves a (5 layers), node 2 serves b (22 layers), node 3 joins b from node 2 with 10
 * layers: the bug compared 10 with a's 5 layers. */
static void two_models(void)
{
    cluster_state_init(&st);
    n_rep = 0;
    up(1, "10.0.0.1", 0);
    up(2, "10.0.0.2", 0);
    up(3, "10.0.0.3", 0);
    hold(1, "a", 1, 1, 5, 5);
    hold(2, "b", 1, 1, 22, 22);
    struct cl_cmd s = {.type = CMD_SCALE, .t_ms = 2};
    s.u.scale = (struct cl_scale){.kind = SCALE_UP, .source = 2, .node = 3, .n_chain = 1};
    s.u.scale.chain[0] = 3;
    snprintf(s.u.scale.model, sizeof s.u.scale.model, "b");
    apply(s);
    hold(3, "b", 0, 1, 10, 22);
    for (uint64_t id = 1; id <= 3; id++) report(id, 9900);
}

TEST(deeper_model_joiner_has_its_helper_and_is_routed_to)
{
    two_models();
    rep[1].load.queue_len = 40; /* node 2 is busy: the joiner is the better replica of b */
    rep[1].load.queued_tokens = 4000;
    static struct view_buf vb;
    struct view_in in = input();
    control_view_of(&in, &vb);
    int p2 = control_view_pid(&vb, 2), p3 = control_view_pid(&vb, 3);
    CHECK(p2 >= 0 && p3 >= 0);
    CHECK_EQ_INT(vb.model[1].layers, 22);
    CHECK_EQ_INT(vb.node[p3].engine_model, 1);
    CHECK_EQ_INT(vb.node[p3].layers_resident, 10);
    CHECK_EQ_INT(vb.node[p3].helper, p2);
    struct plan_config pc;
    plan_config_default(&pc);
    struct plan_route rt;
    char err[ERRMSG_LEN];
    CHECKF(!planner_route(&pc, &vb.v, 1, 16, &rt, err), "%s", err);
    CHECK_EQ_INT(rt.node, p3);
    CHECK_EQ_INT(vb.id[rt.node], 3);
    CHECK_EQ_INT(rt.helper, p2);
    CHECK_EQ_INT(rt.k, 10);
}

TEST(plan_ids_are_ranks_and_map_back)
{
    cluster_state_init(&st);
    n_rep = 0;
    up(BIG, "10.0.0.9", 0); /* joined first, the largest id */
    up(5, "10.0.0.5", 0);
    up(3, "10.0.0.3", 0);
    hold(BIG, "a", 1, 1, 5, 5);
    hold(3, "a", 1, 1, 5, 5);
    static struct view_buf vb;
    struct view_in in = input();
    control_view_of(&in, &vb);
    CHECK_EQ_INT(vb.v.n_nodes, 3);
    CHECK(vb.id[0] == 3 && vb.id[1] == 5 && vb.id[2] == BIG);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(vb.node[i].id, i);
    CHECK_EQ_INT(control_view_pid(&vb, BIG), 2);
    CHECK_EQ_INT(control_view_pid(&vb, 4), -1);
    /* a scale-down of the node with the big id, its sequences to node 3; a scale-up */
    struct plan_action act[2] = {
        {.kind = PLAN_SCALE_DOWN,
         .model = 0,
         .source = -1,
         .node = 2,
         .handover = 0,
         .reason = PLAN_WHY_CAPACITY,
         .why_value = 120,
         .why_limit = 300},
        {.kind = PLAN_SCALE_UP, .model = 0, .source = 0, .node = 1, .n_chain = 1, .handover = -1}};
    act[1].chain[0] = 1;
    struct cl_cmd cmd[4];
    char err[ERRMSG_LEN];
    CHECK_EQ_INT(control_leader_commands(&vb, &st, act, 2, cmd, 4, err), 2);
    CHECK_STR(err, "");
    CHECK(cmd[0].type == CMD_SCALE && cmd[0].u.scale.kind == SCALE_DOWN);
    CHECK(cmd[0].u.scale.node == BIG && cmd[0].u.scale.source == 3);
    CHECK_STR(cmd[0].u.scale.model, "a");
    CHECK(cmd[1].u.scale.kind == SCALE_UP && cmd[1].u.scale.node == 5);
    CHECK(cmd[1].u.scale.source == 3 && cmd[1].u.scale.n_chain == 1);
    CHECK(cmd[1].u.scale.chain[0] == 5);
    /* what the planner compared travels as the command's reason; the leader's decision line */
    CHECK_STR(cmd[0].u.scale.reason, "demand 120 tok/s fits one replica fewer (300)");
    char line[ERRMSG_LEN];
    control_scale_line(&cmd[0].u.scale, line, sizeof line);
    CHECK_STR(line,
              "scale down a on node 1099511627776, handing its sequences to node 3: demand 120 "
              "tok/s fits one replica fewer (300)");
    /* and it decodes as the log would carry it */
    uint8_t buf[CL_CMD_MAX];
    struct cl_cmd back;
    size_t n = cluster_cmd_encode(buf, sizeof buf, &cmd[0]);
    CHECK(n && !cluster_cmd_decode(&back, buf, n, err));
    CHECK(back.u.scale.node == BIG && back.u.scale.source == 3);
    CHECK_STR(back.u.scale.reason, cmd[0].u.scale.reason);
}

TEST(unknown_kinds_and_outsiders_are_left_out)
{
    two_models();
    static struct view_buf vb;
    struct view_in in = input();
    control_view_of(&in, &vb);
    struct plan_action act[5] = {
        {.kind = 7, .model = 0, .source = -1, .node = 0, .handover = -1},
        {.kind = PLAN_DROP_HOST, .model = 5, .source = -1, .node = 0, .handover = -1},
        {.kind = PLAN_SCALE_DOWN, .model = 0, .source = -1, .node = 9, .handover = -1},
        {.kind = PLAN_SCALE_DOWN, .model = 0, .source = -1, .node = 0, .handover = 12},
        {.kind = PLAN_DROP_HOST, .model = 1, .source = -1, .node = 1, .handover = -1}};
    struct cl_cmd cmd[8];
    char err[ERRMSG_LEN];
    CHECK_EQ_INT(control_leader_commands(&vb, &st, act, 5, cmd, 8, err), 1);
    CHECK(strstr(err, "left out"));
    CHECK(cmd[0].u.scale.kind == SCALE_DROP_HOST && cmd[0].u.scale.node == 2);
    CHECK_STR(cmd[0].u.scale.model, "b");
    CHECK_EQ_INT(cmd[0].u.scale.source, 0);
    /* the unknown kind alone */
    CHECK_EQ_INT(control_leader_commands(&vb, &st, act, 1, cmd, 8, err), 0);
    CHECKF(strstr(err, "kind the log has no command for"), "%s", err);
}

TEST(the_leader_decides_on_the_view)
{
    two_models();
    rep[1].load.queue_len = 40; /* b's replicas: 4 s of prompts each, against a 1 s SLO */
    rep[1].load.queued_tokens = 40000;
    /* node 3 finished its join; node 4, empty, is where b goes */
    hold(3, "b", 1, 1, 22, 22);
    struct cl_cmd d = {.type = CMD_SCALE_DONE, .t_ms = 3, .u.done = {st.scaleout[0].scale_id, 1}};
    apply(d);
    up(4, "10.0.0.4", 0);
    report(4, 9900);
    rep[2].load.queue_len = 40;
    rep[2].load.queued_tokens = 40000;
    static struct view_buf vb;
    struct view_in in = input();
    control_view_of(&in, &vb);
    struct plan_config pc;
    plan_config_default(&pc);
    struct plan_action act[16];
    char err[ERRMSG_LEN];
    int n = planner_step(&pc, &vb.v, act, 16, err);
    CHECKF(n == 1, "%d actions: %s", n, err);
    struct cl_cmd cmd[16];
    CHECK_EQ_INT(control_leader_commands(&vb, &st, act, n, cmd, 16, err), 1);
    CHECK(cmd[0].u.scale.kind == SCALE_UP && cmd[0].u.scale.node == 4);
    CHECK_STR(cmd[0].u.scale.model, "b");
    CHECK(cmd[0].u.scale.source == 2 || cmd[0].u.scale.source == 3);
    CHECKF(!strncmp(cmd[0].u.scale.reason, "predicted TTFT ", 15) &&
               strstr(cmd[0].u.scale.reason, " ms > SLO 1000 ms"),
           "%s", cmd[0].u.scale.reason);
}

TEST(every_models_bytes_from_a_holder)
{
    two_models();
    rep[1].load.model_bytes = 22000000; /* node 2 holds b */
    static struct view_buf vb;
    struct view_in in = input();
    control_view_of(&in, &vb);
    CHECK(vb.model[0].bytes == 1000);     /* ours */
    CHECK(vb.model[1].bytes == 22000000); /* was 0: "nothing to copy" */
    in.model = NULL;                      /* an empty member: a's from a report too */
    rep[0].load.model_bytes = 5000;
    control_view_of(&in, &vb);
    CHECK(vb.model[0].bytes == 5000);
}

TEST(measured_inputs)
{
    cluster_state_init(&st);
    n_rep = 0;
    up(1, "10.0.0.1", 0);
    up(2, "10.0.0.1", 0); /* another process on host 10.0.0.1 */
    up(3, "10.0.0.3", 0);
    up(4, "10.0.0.4", 0);
    hold(1, "a", 1, 1, 5, 5);
    hold(2, "a", 1, 1, 5, 5);
    hold(3, "a", 1, 1, 5, 5);
    static struct view_buf vb;
    struct view_in in = input();
    for (uint64_t id = 1; id <= 4; id++) report(id, 9900);
    in.n_rep = n_rep;
    control_view_of(&in, &vb);
    /* nothing measured yet: the assumed rate; a day up, no death: about 1% a day */
    for (int i = 0; i < 4; i++) CHECK(vb.node[i].link_Bps == VIEW_LINK_ASSUMED);
    double p0 = vb.node[0].fail_prob;
    CHECKF(fabs(p0 - 0.0090) < 1e-12, "%g", p0); /* 0.1 failures over 11 days, 2 digits */
    /* seconds of uptime are no evidence: node 4, up 10 s less, is as reliable */
    CHECK(control_view_fail_prob(0, 86400000) == control_view_fail_prob(0, 86390000));
    CHECK(vb.node[0].domain == vb.node[1].domain && vb.node[2].domain != vb.node[0].domain);
    /* node 3 pulled from node 1 at 2 MB/s: both ends measured, the others at the mean */
    rep[2].load.link_Bps = 2e6f;
    rep[2].load.link_peer = 1;
    control_view_of(&in, &vb);
    CHECK(vb.node[0].link_Bps == 2e6 && vb.node[2].link_Bps == 2e6);
    CHECK(vb.node[1].link_Bps == 2e6 && vb.node[3].link_Bps == 2e6);
    rep[1].load.link_Bps = 4e6f; /* node 2 measured 4 MB/s from an unknown end */
    control_view_of(&in, &vb);
    CHECK(vb.node[1].link_Bps == 4e6);
    CHECKF(vb.node[3].link_Bps == (2e6 + 4e6 + 2e6) / 3, "%g", vb.node[3].link_Bps);
    /* node 4 died twice in its first 12 hours */
    struct cl_cmd c = {.type = CMD_NODE_DOWN, .t_ms = 21600000, .u.down = 4};
    apply(c);
    up(4, "10.0.0.4", 21600001);
    c.t_ms = 43200000;
    apply(c);
    up(4, "10.0.0.4", 43200001);
    control_view_of(&in, &vb);
    double p4 = vb.node[3].fail_prob;
    CHECKF(fabs(p4 - control_view_fail_prob(2, 86400000 - 2)) < 1e-9, "%g", p4);
    CHECKF(fabs(p4 - 0.17) < 1e-12, "%g", p4); /* 2.1 failures over 11 days */
    CHECK(p4 > 10 * p0);
    /* step models: a prior nobody timed is not a node's own; a fitted one is; the type's is
     * the most-timed report's */
    CHECK(vb.node[0].step_own.a == 0 && vb.node[0].step_own.c == 0);
    rep[0].load.step_steps = 100;
    rep[0].load.step_a = 2e-4f;
    rep[1].load.step_steps = 20;
    rep[1].load.step_a = 3e-4f;
    rep[2].load.step_cal = 1;
    rep[2].load.step_a = 5e-4f;
    control_view_of(&in, &vb);
    CHECK(vb.node[0].step_own.a == (double)2e-4f && vb.node[1].step_own.a == (double)3e-4f);
    CHECK(vb.node[2].step_own.a == (double)5e-4f && vb.node[3].step_own.a == 0);
    CHECK(vb.step[0].a == (double)5e-4f); /* calibrated beats timed */
    /* a stale report is no load, and no measurement */
    rep[0].at_ms = 1000;
    rep[0].load.queue_len = 9;
    control_view_of(&in, &vb);
    CHECK(vb.node[0].load.queue_len == 0 && vb.node[0].step_own.a == 0);
    /* the relayed copy stands in when the node's own report is missing */
    struct relayed_load rl = {.id = 1, .at_ms = 9950, .load = rep[0].load};
    rl.load.queue_len = 4;
    in.relayed = &rl;
    in.n_relayed = 1;
    control_view_of(&in, &vb);
    CHECK_EQ_INT(vb.node[0].load.queue_len, 4);
}

TEST(the_forecast_reaches_the_model)
{
    two_models();
    struct plan_forecast fc[2];
    for (int m = 0; m < 2; m++) planner_forecast_init(&fc[m], 0, 1000, 0.3, 0.1);
    planner_forecast_observe(&fc[1], 500, 300);
    planner_forecast_observe(&fc[1], 1500, 600);
    planner_forecast_observe(&fc[1], 2500, 0);
    static struct view_buf vb;
    struct view_in in = input();
    in.fc = fc;
    control_view_of(&in, &vb);
    CHECK(!vb.model[0].fc_valid);
    CHECK(vb.model[1].fc_valid && vb.model[1].fc_level == 600 && vb.model[1].fc_trend == 300);
    CHECK(vb.model[1].tpot_slo_ms == 200);
    in.fc = NULL; /* no forecast: the planner's leading signal stays off */
    control_view_of(&in, &vb);
    CHECK(!vb.model[1].fc_valid);
}

/* A hand-over in the committed state: node 1 scaled down naming node 2 as the receiver of its
 * sequences, out of its engine, still running 3: node 2 runs them (load.helping) before its own
 * report says so; node 1 back in the engine (its latest decision a scale-up): no longer. */
TEST(a_handovers_receiver_is_helping)
{
    cluster_state_init(&st);
    n_rep = 0;
    up(1, "10.0.0.1", 0);
    up(2, "10.0.0.2", 0);
    hold(1, "a", 1, 1, 5, 5);
    hold(2, "a", 1, 1, 5, 5);
    struct cl_cmd d = {.type = CMD_SCALE, .t_ms = 5};
    d.u.scale = (struct cl_scale){.kind = SCALE_DOWN, .source = 2, .node = 1};
    snprintf(d.u.scale.model, sizeof d.u.scale.model, "a");
    apply(d);
    report(1, 9900)->running = 3;
    report(2, 9900)->helping = 1; /* its report lags */
    static struct view_buf vb;
    struct view_in in = input();
    control_view_of(&in, &vb);
    CHECK_EQ_INT(vb.node[0].engine_model, -1);
    CHECK_EQ_INT(vb.node[1].load.helping, 3);
    rep[1].load.helping = 5; /* its report, once larger, wins */
    control_view_of(&in, &vb);
    CHECK_EQ_INT(vb.node[1].load.helping, 5);
    rep[1].load.helping = 0;
    struct cl_cmd u = {.type = CMD_SCALE, .t_ms = 6};
    u.u.scale = (struct cl_scale){.kind = SCALE_UP, .source = 1, .node = 1, .n_chain = 1};
    u.u.scale.chain[0] = 1;
    snprintf(u.u.scale.model, sizeof u.u.scale.model, "a");
    apply(u);
    control_view_of(&in, &vb);
    CHECK_EQ_INT(vb.node[1].load.helping, 0);
}

/* Two threads build views of two different clusters at once: each gets its own. */
static struct cl_state st_b;
static struct report rep_b[CL_MAX_NODES];
static int race_bad;

static void *builder(void *arg)
{
    int which = (int)(intptr_t)arg;
    static struct view_buf vbs[2];
    struct view_buf *vb = &vbs[which];
    struct view_in in = input();
    if (which) in.st = &st_b, in.rep = rep_b;
    for (int i = 0; i < 3000; i++) {
        control_view_of(&in, vb);
        double want = which ? 7e-4 : 1e-4;
        if (fabs(vb->step[0].a - want) > 1e-9 || vb->tput[0] != (which ? 70 : 10)) race_bad = 1;
    }
    return NULL;
}

/* The holdings the leader commits from a node's report (control_report_holding): a change is
 * committed; a model the state says a node holds and the node no longer reports is committed as
 * held nowhere on it. Chaos soak seed 3: node 3, restarted, reported nothing, its lost host copy
 * stayed in the state, and the planner revived the model "onto 3 from node 3", a join that
 * waited 245 s for a header nobody would send. */
TEST(a_restarted_nodes_lost_copy_leaves_the_state)
{
    cluster_state_init(&st);
    n_rep = 0;
    up(1, "10.0.0.1", 1);
    up(3, "10.0.0.3", 1);
    hold(1, "tiny", 1, 0, 0, 5);
    hold(3, "tiny", 1, 1, 5, 5);
    hold(3, "b", 0, 0, 0, 22);
    struct cl_holding h;
    /* node 1 reports what the state has: nothing to commit */
    report(1, 1000);
    rep[0].n_hold = 1;
    rep[0].hold[0] = (struct cl_holding){.node = 1, .host = 1, .n_layers = 5};
    snprintf(rep[0].hold[0].model, sizeof rep[0].hold[0].model, "tiny");
    CHECK_EQ_INT(control_report_holding(&st, cluster_state_member_c(&st, 1), &rep[0], &h), 0);
    /* node 1's engine comes up: that change */
    rep[0].hold[0].engine = 1;
    rep[0].hold[0].layers_resident = 2;
    CHECK_EQ_INT(control_report_holding(&st, cluster_state_member_c(&st, 1), &rep[0], &h), 1);
    CHECK(h.node == 1 && !strcmp(h.model, "tiny") && h.engine && h.layers_resident == 2);
    /* node 3 restarted: it reports no holding at all; its copy of tiny is gone (b, held in
     * nothing, needs no command) */
    report(3, 1000);
    CHECK_EQ_INT(control_report_holding(&st, cluster_state_member_c(&st, 3), &rep[1], &h), 1);
    CHECK(h.node == 3 && !strcmp(h.model, "tiny") && !h.host && !h.engine && !h.layers_resident &&
          h.n_layers == 5);
    struct cl_cmd c = {.type = CMD_HOLDING, .t_ms = 2};
    c.u.hold = h;
    apply(c);
    int mi = cluster_state_model(&st, "tiny");
    const struct cl_member *m3 = cluster_state_member_c(&st, 3);
    CHECK(mi >= 0 && !m3->hold[mi].host && !m3->hold[mi].engine);
    /* and then the state is right: nothing more */
    CHECK_EQ_INT(control_report_holding(&st, m3, &rep[1], &h), 0);
}

/* A scale-up's progress clock (control_scaleout_stalled): a scale-up not seen before starts it,
 * a layer gained restarts it, none for more than the stall time ends the scale-up; the oldest
 * clock is forgotten when the table is full. */
TEST(a_scale_up_without_a_layer_stalls)
{
    struct stall_track t[CTL_MAX_STALL];
    int n = 0;
    CHECK_EQ_INT(control_scaleout_stalled(t, &n, 7, 0, 1000, 5000), 0); /* clock starts */
    CHECK_EQ_INT(control_scaleout_stalled(t, &n, 7, 0, 6000, 5000), 0); /* 5000: not more */
    CHECK_EQ_INT(control_scaleout_stalled(t, &n, 7, 0, 6001, 5000), 1);
    CHECK_EQ_INT(control_scaleout_stalled(t, &n, 7, 1, 6002, 5000), 0); /* a layer landed */
    CHECK_EQ_INT(control_scaleout_stalled(t, &n, 7, 1, 11002, 5000), 0);
    CHECK_EQ_INT(control_scaleout_stalled(t, &n, 7, 1, 11003, 5000), 1);
    CHECK_EQ_INT(n, 1);
    /* a full table: a new scale-up takes the oldest clock's place */
    for (uint32_t id = 100; n < CTL_MAX_STALL; id++)
        CHECK_EQ_INT(control_scaleout_stalled(t, &n, id, 0, 20000 + id, 5000), 0);
    CHECK_EQ_INT(control_scaleout_stalled(t, &n, 999, 0, 30000, 5000), 0);
    CHECK_EQ_INT(n, CTL_MAX_STALL);
    int seven = 0;
    for (int i = 0; i < n; i++) seven |= t[i].scale_id == 7;
    CHECK(!seven); /* scale-up 7's clock (since 6002) was the oldest */
    /* a new leader's table: every scale-up in flight has the whole stall time again */
    n = 0;
    CHECK_EQ_INT(control_scaleout_stalled(t, &n, 7, 1, 50000, 5000), 0);
}

TEST(views_share_no_scratch)
{
    two_models();
    for (int i = 0; i < n_rep; i++) rep[i].load.tok_s = 10;
    st_b = st;
    memcpy(rep_b, rep, sizeof rep);
    for (int i = 0; i < n_rep; i++) rep_b[i].load.step_a = 7e-4f, rep_b[i].load.tok_s = 70;
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, builder, (void *)(intptr_t)i);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    CHECK(!race_bad);
}

int main(void)
{
    RUN(deeper_model_joiner_has_its_helper_and_is_routed_to);
    RUN(plan_ids_are_ranks_and_map_back);
    RUN(unknown_kinds_and_outsiders_are_left_out);
    RUN(the_leader_decides_on_the_view);
    RUN(every_models_bytes_from_a_holder);
    RUN(measured_inputs);
    RUN(the_forecast_reaches_the_model);
    RUN(a_handovers_receiver_is_helping);
    RUN(a_restarted_nodes_lost_copy_leaves_the_state);
    RUN(a_scale_up_without_a_layer_stalls);
    RUN(views_share_no_scratch);
    CHECK_DONE();
}
