/* The control plane's view of the cluster (cluster/control_view.c): the committed state turned into
 * the planner's shapes, routing on it, and the leader's decisions on it (control_leader_decide).
 * A joiner in a scale-out has the scale-out's source as its helper while it holds fewer than its
 * own model's layers (not model 0's), so a joiner of a model deeper than the cluster's first one
 * is predicted and routed to. */
#include "check.h"

#include "cluster/control_internal.h"

static void apply(struct cl_state *s, struct cl_cmd c)
{
    CHECK(!cluster_state_apply(s, &c));
}

static struct cl_cmd node_up(uint64_t id)
{
    struct cl_cmd c = {.type = CMD_NODE_UP, .t_ms = 1};
    c.u.up.id = id;
    snprintf(c.u.up.addr, sizeof c.u.up.addr, "10.77.0.%llu:7100", (unsigned long long)id);
    snprintf(c.u.up.http, sizeof c.u.up.http, "10.77.0.%llu:8080", (unsigned long long)id);
    snprintf(c.u.up.gpu, sizeof c.u.up.gpu, "cpu");
    c.u.up.role = ROLE_VOTER;
    return c;
}

static struct cl_cmd holding(uint64_t node, const char *model, int host, int engine, int k, int L)
{
    struct cl_cmd c = {.type = CMD_HOLDING, .t_ms = 2};
    c.u.hold.node = node;
    snprintf(c.u.hold.model, sizeof c.u.hold.model, "%s", model);
    c.u.hold.host = (uint8_t)host;
    c.u.hold.engine = (uint8_t)engine;
    c.u.hold.layers_resident = (uint16_t)k;
    c.u.hold.n_layers = (uint16_t)L;
    return c;
}

static const struct plan_node *node_of(const struct view_buf *vb, int id)
{
    for (int i = 0; i < vb->v.n_nodes; i++)
        if (vb->node[i].id == id) return &vb->node[i];
    return NULL;
}

/* Model 0 "a" has 2 layers (node 1), model 1 "b" 8 (node 2); node 3 joins b from node 2 and holds
 * k of its 8 layers. */
static struct control *two_models(int k)
{
    struct control *c = calloc(1, sizeof *c);
    CHECK(c);
    cluster_state_init(&c->st);
    snprintf(c->model, sizeof c->model, "a");
    c->cfg.dead_ms = 1000;
    c->cfg.ttft_slo_ms = 300;
    c->cfg.replicas_cached = 1;
    c->cfg.keep_alive_ms = 60000;
    for (uint64_t id = 1; id <= 3; id++) apply(&c->st, node_up(id));
    apply(&c->st, holding(1, "a", 1, 1, 2, 2));
    apply(&c->st, holding(2, "b", 1, 1, 8, 8));
    struct cl_cmd so = {.type = CMD_SCALE, .t_ms = 3};
    so.u.scale.kind = SCALE_UP;
    snprintf(so.u.scale.model, sizeof so.u.scale.model, "b");
    so.u.scale.source = 2;
    so.u.scale.node = 3;
    so.u.scale.chain[so.u.scale.n_chain++] = 3;
    apply(&c->st, so);
    apply(&c->st, holding(3, "b", 0, 1, k, 8));
    CHECK_EQ_INT(c->st.n_scaleouts, 1);
    return c;
}

TEST(view_joiner_of_a_deeper_model_has_its_helper)
{
    struct control *c = two_models(4);
    static struct view_buf vb;
    control_view_build(c, &vb, 1000000);
    CHECK_EQ_INT(vb.v.n_models, 2);
    CHECK_EQ_INT(vb.model[0].layers, 2);
    CHECK_EQ_INT(vb.model[1].layers, 8);
    const struct plan_node *j = node_of(&vb, 3);
    CHECK(j);
    CHECK_EQ_INT(j->engine_model, 1);
    CHECK_EQ_INT(j->layers_resident, 4);
    CHECK_EQ_INT(j->helper, 2); /* k = 4 < 8 (model 0's 2 layers said "whole": no helper) */
    CHECK_EQ_INT(node_of(&vb, 2)->helper, -1);
    CHECK_EQ_INT(node_of(&vb, 2)->sources_busy, 1);
    CHECK_EQ_INT(vb.v.n_scaleouts, 1);
    CHECK_EQ_INT(vb.so[0].model, 1);
    /* Routing: the joiner is predicted (layers [4, 8) on node 2) and, node 2 busy, chosen. One
     * GPU type (cpu): its step model for b, 10 ms a step + 0.1 ms a token. */
    struct plan_config pc;
    plan_config_default(&pc);
    CHECK_EQ_INT(vb.v.n_gpu_types, 1);
    vb.step[1] = (struct step_model){.a = 0.0001, .b = 0, .c = 0.010, .corr = 1};
    vb.node[1].load.queue_len = 40;
    vb.node[1].load.queued_tokens = 40 * 200;
    vb.node[1].load.running_seqs = 8;
    CHECK(planner_predict_ttft_ms(&pc, &vb.v, j, 1, 16) < 1e12);
    struct plan_route rt;
    char err[ERRMSG_LEN];
    CHECKF(!planner_route(&pc, &vb.v, 1, 16, &rt, err), "%s", err);
    CHECK_EQ_INT(rt.node, 3);
    CHECK_EQ_INT(rt.k, 4);
    CHECK_EQ_INT(rt.helper, 2);
    free(c);
}

TEST(view_whole_joiner_serves_alone)
{
    struct control *c = two_models(8);
    static struct view_buf vb;
    control_view_build(c, &vb, 1000000);
    const struct plan_node *j = node_of(&vb, 3);
    CHECK(j);
    CHECK_EQ_INT(j->layers_resident, 8);
    CHECK_EQ_INT(j->helper, -1);
    free(c);
}

/* The leader: node 2's report says b is queued far past the SLO; the planner scales b out onto
 * the empty node 3 from node 2, with its reason, and nothing else. */
TEST(leader_decides_scale_up_of_the_queued_model)
{
    struct control *c = calloc(1, sizeof *c);
    CHECK(c);
    cluster_state_init(&c->st);
    snprintf(c->model, sizeof c->model, "a");
    c->cfg.dead_ms = 1000;
    c->cfg.ttft_slo_ms = 300;
    c->cfg.replicas_cached = 1;
    c->cfg.keep_alive_ms = 60000;
    for (uint64_t id = 1; id <= 3; id++) apply(&c->st, node_up(id));
    apply(&c->st, holding(1, "a", 1, 1, 2, 2));
    apply(&c->st, holding(2, "b", 1, 1, 8, 8));
    uint64_t now = 1000000;
    c->rep[c->n_rep++] = (struct report){.id = 2,
                                         .at_ms = now - 10,
                                         .load = {.queue_len = 40,
                                                  .running = 4,
                                                  .queued_tokens = 8000,
                                                  .idle_ms = -1,
                                                  .step_a = 0.0001f,
                                                  .step_c = 0.010f,
                                                  .step_corr = 1,
                                                  .tok_s = 100}};
    struct cl_cmd cmd[16];
    char err[ERRMSG_LEN];
    int n = control_leader_decide(c, now, cmd, 16, err);
    CHECKF(n == 1, "%d decisions (%s)", n, n < 0 ? err : "");
    const struct cl_scale *s = &cmd[0].u.scale;
    CHECK_EQ_INT(cmd[0].type, CMD_SCALE);
    CHECK_EQ_INT(s->kind, SCALE_UP);
    CHECK_STR(s->model, "b");
    CHECK_EQ_INT(s->source, 2);
    CHECK_EQ_INT(s->node, 3);
    CHECK_EQ_INT(s->n_chain, 1);
    CHECK_EQ_INT(s->chain[0], 3);
    CHECKF(!strncmp(s->reason, "predicted TTFT ", 15) && strstr(s->reason, "> SLO 300 ms"), "%s",
           s->reason);
    free(c);
}

int main(void)
{
    RUN(view_joiner_of_a_deeper_model_has_its_helper);
    RUN(view_whole_joiner_serves_alone);
    RUN(leader_decides_scale_up_of_the_queued_model);
    CHECK_DONE();
}
