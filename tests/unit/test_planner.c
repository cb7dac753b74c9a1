/* The planner's decisions on small hand-built views: the scale-up trigger at the slack boundary,
 * the leading signal (Holt's smoothing, proactive scale-up, capacity scale-in with hand-over,
 * standbys),
 * chain order, the last copy, restoring R (spread over racks; drops that keep the spread), nodes
 * of one model slot (restores only into a free slot, switches that never drop a last copy),
 * routing to a joiner by its split point, the faster of two GPU types, determinism. Step models
 * use powers of two so predictions are exact. */
#include "check.h"
#include "cluster/planner.h"
#include "os/common/errmsg.h"

enum { NT = 2, NM = 2 }; /* GPU types, models (the view has 1 unless two_models()) */

struct rig {
    struct plan_node nodes[16];
    struct plan_model models[NM];
    struct plan_scaleout so[4];
    double tput[NT * NM];
    struct step_model step[NT * NM];
    struct plan_view v;
    struct plan_config cfg;
};

static void rig_init(struct rig *g, int n_nodes)
{
    memset(g, 0, sizeof *g);
    g->models[0] = (struct plan_model){.layers = 32,
                                       .bytes = 14e9,
                                       .ttft_slo_ms = 250,
                                       .tpot_slo_ms = 100,
                                       .replicas_cached = 1,
                                       .keep_alive_ms = 1000};
    g->models[1] = g->models[0];
    for (int t = 0; t < NT * NM; t++) {
        g->step[t] = (struct step_model){.a = 1.0 / 1024, .b = 0, .c = 0, .corr = 1};
        g->tput[t] = 1000;
    }
    for (int i = 0; i < n_nodes; i++)
        g->nodes[i] = (struct plan_node){.id = i,
                                         .alive = 1,
                                         .domain = i,
                                         .link_Bps = 12.5e9,
                                         .fail_prob = 0.01,
                                         .engine_model = -1,
                                         .helper = -1,
                                         .load = {.idle_since_ms = -1}};
    g->v = (struct plan_view){.now_ms = 10000,
                              .nodes = g->nodes,
                              .n_nodes = n_nodes,
                              .models = g->models,
                              .n_models = 1,
                              .scaleouts = g->so,
                              .n_gpu_types = NT,
                              .tput = g->tput,
                              .step = g->step};
    plan_config_default(&g->cfg);
    g->cfg.max_step_tokens = 1024;
}

static void serve(struct rig *g, int i, int queue, long tokens)
{
    g->nodes[i].engine_model = 0;
    g->nodes[i].layers_resident = g->models[0].layers;
    g->nodes[i].load.queue_len = queue;
    g->nodes[i].load.queued_tokens = tokens;
    g->nodes[i].load.idle_since_ms = queue ? -1 : 0;
}

/* Two models, R = 2 each, and nodes of one model slot (the serving process). */
static void two_models(struct rig *g)
{
    g->v.n_models = 2;
    g->models[0].replicas_cached = g->models[1].replicas_cached = 2;
    for (int i = 0; i < g->v.n_nodes; i++) g->nodes[i].model_slots = 1;
}

/* Node i serves model m alone (engine and host copy, as `strata serve -m`). */
static void serve_model(struct rig *g, int i, int m, int queue, long tokens)
{
    serve(g, i, queue, tokens);
    g->nodes[i].engine_model = m;
    g->nodes[i].host_cached = 1ull << m;
}

static int step(struct rig *g, struct plan_action *a, int cap)
{
    char err[ERRMSG_LEN] = "";
    int n = planner_step(&g->cfg, &g->v, a, cap, err);
    CHECKF(n >= 0, "planner_step: %s", err);
    return n;
}

/* Node 0 serves with 2 queued requests of 128 tokens: a new request of the mean (128) is
 * predicted at (256 + 128) / 1024 s = 375 ms. The boundary is the SLO itself. */
TEST(scale_up_exactly_at_slack_boundary)
{
    struct rig g;
    struct plan_action a[8];
    rig_init(&g, 3);
    g.nodes[0].host_cached = 1;
    serve(&g, 0, 2, 256);
    g.models[0].ttft_slo_ms = 375; /* slack == 0: on time, no action */
    CHECK_EQ_INT(step(&g, a, 8), 0);
    g.models[0].ttft_slo_ms = 374.99; /* slack < 0 by 10 us: scale up */
    int n = step(&g, a, 8);
    CHECK_EQ_INT(n, 1);
    CHECK_EQ_INT(a[0].kind, PLAN_SCALE_UP);
    CHECK_EQ_INT(a[0].source, 0);
    CHECK(a[0].n_chain >= 1);
    /* what the reason compared, for the event's text: the best prediction and the SLO */
    CHECK_EQ_INT(a[0].reason, PLAN_WHY_SLACK);
    CHECK(a[0].why_value == 375.0 && a[0].why_limit == 374.99);
    struct plan_node *n0 = &g.nodes[0];
    CHECK(planner_predict_ttft_ms(&g.cfg, &g.v, n0, 0, 128) == 375.0);
}

TEST(cold_model_with_held_requests_scales_up)
{
    struct rig g;
    struct plan_action a[8];
    rig_init(&g, 2);
    g.nodes[1].host_cached = 1;
    CHECK_EQ_INT(step(&g, a, 8), 0);
    g.models[0].held = 1;
    g.models[0].held_tokens = 100;
    CHECK_EQ_INT(step(&g, a, 8), 1);
    /* node 1 caches the model: it loads over its own PCIe (source = itself) */
    CHECK_EQ_INT(a[0].kind, PLAN_SCALE_UP);
    CHECK_EQ_INT(a[0].node, 1);
    CHECK_EQ_INT(a[0].source, 1);
}

/* Source 0 (12.5 GB/s NIC, NVLink in server 0). Joiners: 1 (3.125 GB/s), 2 (12.5 GB/s),
 * 3 (6.25 GB/s), 4 (server 0: NVLink 100 GB/s). Greedy: 4 (NVLink), 2, 3, 1. */
TEST(chain_order_fastest_hop_first)
{
    struct rig g;
    struct plan_action a[8];
    rig_init(&g, 5);
    serve(&g, 0, 64, 64 * 1024); /* predicted 65 s: far past the SLO */
    g.nodes[0].host_cached = 1;
    g.nodes[1].link_Bps = 3.125e9;
    g.nodes[3].link_Bps = 6.25e9;
    g.nodes[0].nvlink_Bps = g.nodes[4].nvlink_Bps = 100e9;
    g.nodes[4].domain = g.nodes[0].domain;
    int n = step(&g, a, 8);
    CHECK_EQ_INT(n, 1);
    CHECK_EQ_INT(a[0].kind, PLAN_SCALE_UP);
    CHECK_EQ_INT(a[0].source, 0);
    CHECK_EQ_INT(a[0].n_chain, 4);
    CHECK_EQ_INT(a[0].chain[0], 4);
    CHECK_EQ_INT(a[0].chain[1], 2);
    CHECK_EQ_INT(a[0].chain[2], 3);
    CHECK_EQ_INT(a[0].chain[3], 1);
    /* max_joiners caps it, keeping the best-ranked joiners (all equal: lowest ids 1, 2) */
    g.cfg.max_joiners = 2;
    n = step(&g, a, 8);
    CHECK_EQ_INT(n, 1);
    CHECK_EQ_INT(a[0].n_chain, 2);
    CHECK_EQ_INT(a[0].chain[0], 2);
    CHECK_EQ_INT(a[0].chain[1], 1);
}

TEST(never_drops_last_copy)
{
    struct rig g;
    struct plan_action a[8];
    rig_init(&g, 3);
    /* the only copy is in node 0's engine (no host copy anywhere), idle for ages: it stays, and
     * R is restored from it into node 1's host memory */
    serve(&g, 0, 0, 0);
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].kind, PLAN_REPLICATE_HOST);
    CHECK_EQ_INT(a[0].source, 0);
    CHECK_EQ_INT(a[0].node, 1);
    /* with a host copy elsewhere the idle engine replica goes, down to zero engine replicas */
    g.nodes[2].host_cached = 1;
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].kind, PLAN_SCALE_DOWN);
    CHECK_EQ_INT(a[0].node, 0);
    /* one host copy, R = 1: never dropped; two copies, R = 1: one dropped (highest id on a tie)
     */
    g.nodes[0].engine_model = -1;
    CHECK_EQ_INT(step(&g, a, 8), 0);
    g.nodes[1].host_cached = 1;
    g.nodes[1].load.idle_since_ms = g.nodes[2].load.idle_since_ms = 0;
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].kind, PLAN_DROP_HOST);
    CHECK_EQ_INT(a[0].node, 2);
    /* R = 2: both stay */
    g.models[0].replicas_cached = 2;
    CHECK_EQ_INT(step(&g, a, 8), 0);
    /* not idle for the keep-alive yet: stays */
    g.models[0].replicas_cached = 1;
    g.nodes[1].load.idle_since_ms = g.nodes[2].load.idle_since_ms = g.v.now_ms - 999;
    CHECK_EQ_INT(step(&g, a, 8), 0);
}

TEST(one_scale_down_per_tick)
{
    struct rig g;
    struct plan_action a[8];
    rig_init(&g, 4);
    g.nodes[3].host_cached = 1;
    serve(&g, 0, 0, 0);
    serve(&g, 1, 0, 0);
    serve(&g, 2, 0, 0);
    g.tput[1] = 500;
    g.nodes[1].gpu_type = 1; /* slowest goes first */
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].kind, PLAN_SCALE_DOWN);
    CHECK_EQ_INT(a[0].node, 1);
}

TEST(restores_r_after_holder_dies)
{
    struct rig g;
    struct plan_action a[8];
    rig_init(&g, 5);
    g.models[0].replicas_cached = 2;
    g.nodes[0].host_cached = g.nodes[1].host_cached = 1;
    CHECK_EQ_INT(step(&g, a, 8), 0);
    g.nodes[1].alive = 0;
    g.nodes[2].fail_prob = 0.05;
    g.nodes[3].fail_prob = 0.001; /* most reliable */
    int n = step(&g, a, 8);
    CHECK_EQ_INT(n, 1);
    CHECK_EQ_INT(a[0].kind, PLAN_REPLICATE_HOST);
    CHECK_EQ_INT(a[0].source, 0);
    CHECK_EQ_INT(a[0].node, 3);
    /* in progress: not asked again */
    g.so[0] = (struct plan_scaleout){.kind = PLAN_SO_HOST, .model = 0, .source = 0, .n_chain = 1};
    g.so[0].chain[0] = 3;
    g.v.n_scaleouts = 1;
    CHECK_EQ_INT(step(&g, a, 8), 0);
    /* every holder dead: nothing to copy from */
    g.v.n_scaleouts = 0;
    g.nodes[0].alive = 0;
    CHECK_EQ_INT(step(&g, a, 8), 0);
    double p[3] = {0.01, 0.02, 0.5};
    CHECK(fabs(planner_loss_probability(p, 3) - 1e-4) < 1e-15);
    CHECK(planner_loss_probability(p, 1) == 0.01);
    /* Racks (README, docs/control.md): p = 1%, q = 0.1% a day. Two copies in one rack:
     * q + (1 - q) p^2 = 1.0999e-3; in two racks: (q + (1 - q) p)^2 = 1.2078e-4; three in three
     * racks: 1.3274e-6; three in two (2 + 1): 1.2088e-5. No rack failures: p^R again. */
    double p1[3] = {0.01, 0.01, 0.01};
    int one[3] = {7, 7, 7}, two[3] = {1, 2, 1}, three[3] = {1, 2, 3};
    CHECK(fabs(planner_loss_probability_racks(p1, one, 2, 1e-3) - 1.0999e-3) < 1e-9);
    CHECK(fabs(planner_loss_probability_racks(p1, three, 2, 1e-3) - 0.01099 * 0.01099) < 1e-12);
    CHECK(fabs(planner_loss_probability_racks(p1, three, 3, 1e-3) - 0.01099 * 0.01099 * 0.01099) <
          1e-15);
    CHECK(fabs(planner_loss_probability_racks(p1, two, 3, 1e-3) - 1.0999e-3 * 0.01099) < 1e-12);
    CHECK(fabs(planner_loss_probability_racks(p, three, 3, 0) - 1e-4) < 1e-15);
    CHECK(fabs(planner_loss_probability_racks(p, one, 3, 0) - 1e-4) < 1e-15);
}

/* A node that refused (or failed) a scale-out of model 0 lately (plan_node.refused) gets no new
 * copy of it and no joiner of it: the restore goes to the next node, a scale-up too; model 1
 * still may go there. */
TEST(refusing_node_left_out_for_that_model)
{
    struct rig g;
    struct plan_action a[8];
    rig_init(&g, 4);
    g.models[0].replicas_cached = 2;
    g.nodes[0].host_cached = 1;
    int n = step(&g, a, 8);
    CHECK_EQ_INT(n, 1);
    CHECK(a[0].kind == PLAN_REPLICATE_HOST && a[0].node == 1);
    g.nodes[1].refused = 1; /* node 1 refused that copy */
    n = step(&g, a, 8);
    CHECK_EQ_INT(n, 1);
    CHECK(a[0].kind == PLAN_REPLICATE_HOST && a[0].node == 2 && a[0].n_chain == 1);
    g.nodes[2].refused = g.nodes[3].refused = 1; /* nobody left: R waits */
    CHECK_EQ_INT(step(&g, a, 8), 0);
    /* A cold start of model 0 with held requests: never onto a node that refused it. */
    rig_init(&g, 3);
    g.nodes[0].host_cached = 1;
    g.nodes[0].refused = 1; /* it caches 0, but refused a scale-up of it */
    g.models[0].held = 1;
    g.models[0].held_tokens = 100;
    n = step(&g, a, 8);
    CHECK_EQ_INT(n, 1);
    CHECK(a[0].kind == PLAN_SCALE_UP && a[0].source == 0 && a[0].node == 1);
    g.nodes[1].refused = g.nodes[2].refused = 2; /* refused model 1 only: still joiners of 0 */
    g.nodes[0].refused = 0;
    n = step(&g, a, 8);
    CHECK(n == 1 && a[0].kind == PLAN_SCALE_UP && a[0].node == 0);
}

/* Racks: a rack's switch or power takes all its copies at once. Node 0 (rack 0) holds the only
 * copy, R = 3; nodes 1, 2 are in rack 0 too and more reliable, 3 and 4 in racks 1 and 2. The two
 * new copies go to racks 1 and 2 (one each), not to the reliable nodes beside the source; with
 * every rack already holding a copy the failure probability decides again. */
TEST(restore_r_spreads_over_racks)
{
    struct rig g;
    struct plan_action a[8];
    rig_init(&g, 6);
    g.models[0].replicas_cached = 3;
    g.nodes[0].host_cached = 1;
    g.nodes[1].fail_prob = g.nodes[2].fail_prob = 0.001;
    g.nodes[3].rack = 1;
    g.nodes[4].rack = 2;
    g.nodes[5].rack = 2;
    g.nodes[5].fail_prob = 0.005; /* the more reliable of rack 2: it gets that rack's copy */
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].kind, PLAN_REPLICATE_HOST);
    CHECK_EQ_INT(a[0].source, 0);
    CHECK_EQ_INT(a[0].n_chain, 2);
    CHECK_EQ_INT(a[0].chain[0], 5); /* racks 1 and 2 tie: then fail_prob (0.005 < 0.01) */
    CHECK_EQ_INT(a[0].chain[1], 3); /* rack 2 has one now: rack 1, not node 4 */
    /* A copy on its way to rack 1 counts: the next one goes to rack 2 (node 5), not rack 0. */
    g.so[0] = (struct plan_scaleout){.kind = PLAN_SO_HOST, .model = 0, .source = 0, .n_chain = 1};
    g.so[0].chain[0] = 3;
    g.v.n_scaleouts = 1;
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].n_chain, 1);
    CHECK_EQ_INT(a[0].node, 5);
    /* Every rack holds a copy (0, 1 on the way, 2 done): the most reliable node, node 1. */
    g.nodes[5].host_cached = 1;
    g.models[0].replicas_cached = 4;
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].node, 1);
}

/* R = 2 and three idle host copies, on nodes 1 and 2 (rack 0) and 3 (rack 1): the extra copy
 * dropped is one of rack 0 (the highest failure probability of those, then id), never node 3,
 * though node 3 is the least reliable and has the highest id; with all three in different racks
 * the old order decides again. */
TEST(drop_keeps_copies_spread_over_racks)
{
    struct rig g;
    struct plan_action a[8];
    rig_init(&g, 4);
    g.nodes[1].host_cached = g.nodes[2].host_cached = g.nodes[3].host_cached = 1;
    g.models[0].replicas_cached = 2;
    for (int i = 1; i <= 3; i++) g.nodes[i].load.idle_since_ms = 0;
    g.nodes[3].rack = 1;
    g.nodes[3].fail_prob = 0.05;
    g.nodes[1].fail_prob = 0.02;
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].kind, PLAN_DROP_HOST);
    CHECK_EQ_INT(a[0].node, 1);
    /* Node 1 busy: node 2, still not node 3. */
    g.nodes[1].load.idle_since_ms = -1;
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].node, 2);
    /* Only node 3 idle: it goes (no other choice now; the copies stay at R). */
    g.nodes[2].load.idle_since_ms = -1;
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].node, 3);
    /* Three racks: the least reliable goes, as without racks. */
    g.nodes[1].load.idle_since_ms = g.nodes[2].load.idle_since_ms = 0;
    g.nodes[2].rack = 2;
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].node, 3);
}

/* Nodes 0 and 1 serve models 0 and 1; 2 and 3 are empty; one slot each, R = 2. Each model's copy
 * goes to an empty node: never to the node serving the other model (it has no room; without
 * slots the lowest id, the other model's node, would be picked). */
TEST(restore_r_into_a_free_slot)
{
    struct rig g;
    struct plan_action a[8];
    rig_init(&g, 4);
    two_models(&g);
    serve_model(&g, 0, 0, 0, 0);
    serve_model(&g, 1, 1, 0, 0);
    g.nodes[0].load.idle_since_ms = g.nodes[1].load.idle_since_ms = -1; /* busy: no scale-down */
    CHECK_EQ_INT(step(&g, a, 8), 2);
    CHECK_EQ_INT(a[0].kind, PLAN_REPLICATE_HOST);
    CHECK_EQ_INT(a[0].model, 0);
    CHECK_EQ_INT(a[0].source, 0);
    CHECK_EQ_INT(a[0].node, 2);
    CHECK_EQ_INT(a[1].kind, PLAN_REPLICATE_HOST);
    CHECK_EQ_INT(a[1].model, 1);
    CHECK_EQ_INT(a[1].source, 1);
    CHECK_EQ_INT(a[1].node, 3);
    /* model 0 on its way to node 2 takes its slot: model 1 goes to 3 */
    g.so[0] = (struct plan_scaleout){.kind = PLAN_SO_HOST, .model = 0, .source = 0, .n_chain = 1};
    g.so[0].chain[0] = 2;
    g.v.n_scaleouts = 1;
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].model, 1);
    CHECK_EQ_INT(a[0].node, 3);
    /* node 3 gone: no room anywhere for model 1, nothing is evicted for it */
    g.nodes[3].alive = 0;
    CHECK_EQ_INT(step(&g, a, 8), 0);
    /* a holder dies: restored from the survivor into the free slot */
    g.v.n_scaleouts = 0;
    g.nodes[2].host_cached = 1; /* model 0 arrived */
    g.nodes[3] = (struct plan_node){.id = 3,
                                    .alive = 1,
                                    .domain = 3,
                                    .link_Bps = 12.5e9,
                                    .fail_prob = 0.01,
                                    .engine_model = -1,
                                    .helper = -1,
                                    .model_slots = 1,
                                    .host_cached = 2,
                                    .load = {.idle_since_ms = -1}};
    CHECK_EQ_INT(step(&g, a, 8), 0); /* R = 2 for both */
    g.nodes[3].alive = 0;            /* model 1's copy on node 3 dies */
    g.nodes[2].alive = 0;            /* model 0's on node 2 too: no free slot left */
    CHECK_EQ_INT(step(&g, a, 8), 0);
    g.v.n_nodes = 5;
    g.nodes[4] = g.nodes[3];
    g.nodes[4].id = 4;
    g.nodes[4].domain = 4;
    g.nodes[4].alive = 1;
    g.nodes[4].host_cached = 0;
    CHECK_EQ_INT(step(&g, a, 8), 1); /* one free node: the first model gets it */
    CHECK_EQ_INT(a[0].kind, PLAN_REPLICATE_HOST);
    CHECK_EQ_INT(a[0].model, 0);
    CHECK_EQ_INT(a[0].source, 0);
    CHECK_EQ_INT(a[0].node, 4);
}

/* Node 0 serves model 0, late; node 1 serves model 1; node 2 holds model 1 in host memory only.
 * An empty node goes first; without one, node 2 switches (model 1 stays on node 1); never when
 * node 2 holds model 1's last host copy. */
TEST(switch_never_drops_a_last_copy)
{
    struct rig g;
    struct plan_action a[8];
    rig_init(&g, 4);
    two_models(&g);
    g.models[0].replicas_cached = g.models[1].replicas_cached = 1;
    serve_model(&g, 0, 0, 64, 64 * 1024); /* predicted 65 s: far past the SLO */
    serve_model(&g, 1, 1, 0, 0);
    g.nodes[1].load.idle_since_ms = -1;
    g.nodes[2].host_cached = 2;
    g.cfg.max_joiners = 1;
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].kind, PLAN_SCALE_UP);
    CHECK_EQ_INT(a[0].model, 0);
    CHECK_EQ_INT(a[0].node, 3); /* a free slot before a switch */
    g.nodes[3].alive = 0;
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].kind, PLAN_SCALE_UP);
    CHECK_EQ_INT(a[0].node, 2); /* the switch: model 1 is still on node 1 */
    CHECK_EQ_INT(a[0].source, 0);
    g.nodes[1].alive = 0; /* node 2 holds model 1's last host copy: no switch */
    CHECK_EQ_INT(step(&g, a, 8), 0);
    /* two holders of model 1, host only, and a scale-up that wants both: one switches, the other
     * keeps the copy */
    g.nodes[3].alive = 1;
    g.nodes[3].host_cached = 2;
    g.cfg.max_joiners = 16;
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].kind, PLAN_SCALE_UP);
    CHECK_EQ_INT(a[0].n_chain, 1);
    CHECK_EQ_INT(a[0].chain[0], 2);
}

/* A node switching away from model 1 (joining model 0, in progress) is no source of model 1 and
 * not counted as its copy: a scale-up of model 1 streams from node 1, though node 2's link is
 * faster, and restore R sees one copy of model 1. */
TEST(switching_node_is_no_source)
{
    struct rig g;
    struct plan_action a[8];
    rig_init(&g, 5);
    two_models(&g);
    g.models[0].replicas_cached = 1;
    serve_model(&g, 0, 0, 0, 0);
    g.nodes[0].load.idle_since_ms = -1;
    serve_model(&g, 1, 1, 64, 64 * 1024);
    g.nodes[2].host_cached = 2;
    g.nodes[2].link_Bps = 100e9;
    g.so[0] = (struct plan_scaleout){.kind = PLAN_SO_ENGINE, .model = 0, .source = 0, .n_chain = 1};
    g.so[0].chain[0] = 2;
    g.v.n_scaleouts = 1;
    g.cfg.max_joiners = 1;
    int n = step(&g, a, 8);
    CHECK_EQ_INT(n, 2);
    CHECK_EQ_INT(a[0].kind, PLAN_REPLICATE_HOST); /* model 1: one copy that stays, R = 2 */
    CHECK_EQ_INT(a[0].model, 1);
    CHECK_EQ_INT(a[0].source, 1);
    CHECK_EQ_INT(a[0].node, 3);
    CHECK_EQ_INT(a[1].kind, PLAN_SCALE_UP);
    CHECK_EQ_INT(a[1].model, 1);
    CHECK_EQ_INT(a[1].source, 1);
    CHECK_EQ_INT(a[1].node, 4);
    /* without slots (the simulator's servers) node 2 keeps its copy: the faster source */
    for (int i = 0; i < 5; i++) g.nodes[i].model_slots = 0;
    n = step(&g, a, 8);
    CHECK(n >= 1);
    CHECK_EQ_INT(a[0].kind, PLAN_SCALE_UP);
    CHECK_EQ_INT(a[0].source, 2);
}

/* Node 0 serves with a 4096-token queue. Node 1 joins with helper 0: with k = 0 it is the helper
 * (a tie, node 0 wins on id); with k = L/2 half the layers run on the idle joiner. */
TEST(routes_to_joiner_by_k)
{
    struct rig g;
    rig_init(&g, 2);
    char err[ERRMSG_LEN];
    struct plan_route r;
    serve(&g, 0, 4, 4096);
    g.nodes[1].engine_model = 0;
    g.nodes[1].layers_resident = 0;
    g.nodes[1].helper = 0;
    CHECK_EQ_INT(planner_route(&g.cfg, &g.v, 0, 1024, &r, err), 0);
    CHECK_EQ_INT(r.node, 0);
    CHECK(r.predicted_ttft_ms == 5000.0);
    g.nodes[1].layers_resident = 16;
    CHECK_EQ_INT(planner_route(&g.cfg, &g.v, 0, 1024, &r, err), 0);
    CHECK_EQ_INT(r.node, 1);
    CHECK_EQ_INT(r.helper, 0);
    CHECK_EQ_INT(r.k, 16);
    CHECK(r.predicted_ttft_ms == 0.5 * 1000 + 0.5 * 5000); /* own 1 s x 16/32 + helper's */
    g.nodes[1].layers_resident = 32;
    CHECK_EQ_INT(planner_route(&g.cfg, &g.v, 0, 1024, &r, err), 0);
    CHECK_EQ_INT(r.node, 1);
    CHECK_EQ_INT(r.helper, -1);
    /* a joiner whose helper died cannot serve */
    g.nodes[1].layers_resident = 16;
    g.nodes[0].alive = 0;
    CHECK_EQ_INT(planner_route(&g.cfg, &g.v, 0, 1024, &r, err), 0);
    CHECK_EQ_INT(r.node, -1);
}

TEST(prefers_faster_of_two_unequal_nodes)
{
    struct rig g;
    struct plan_action a[8];
    rig_init(&g, 3);
    serve(&g, 0, 64, 64 * 1024);
    g.nodes[0].host_cached = 1;
    g.cfg.max_joiners = 1;
    g.tput[1] = 3000; /* node 2 is type 1: three times the tokens/s */
    g.nodes[2].gpu_type = 1;
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].chain[0], 2);
    g.cfg.ignore_matrix = 1; /* the ablation: lowest id */
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].chain[0], 1);
}

TEST(deterministic_and_order_independent)
{
    struct rig g, h;
    struct plan_action a[8], b[8];
    rig_init(&g, 8);
    serve(&g, 0, 64, 64 * 1024);
    g.nodes[0].host_cached = 1;
    g.nodes[5].host_cached = 1;
    g.nodes[3].gpu_type = 1;
    g.tput[1] = 2000;
    for (int i = 0; i < 8; i++) g.nodes[i].link_Bps = 1e9 * (1 + i % 3);
    int n = step(&g, a, 8);
    CHECK(n >= 1);
    CHECK_EQ_INT(step(&g, b, 8), n);
    CHECK(memcmp(a, b, sizeof a[0] * n) == 0);
    /* the same cluster listed in reverse gives the same actions */
    h = g;
    for (int i = 0; i < 8; i++) h.nodes[i] = g.nodes[7 - i];
    h.v.nodes = h.nodes;
    h.v.models = h.models;
    h.v.step = h.step;
    h.v.tput = h.tput;
    h.v.scaleouts = h.so;
    CHECK_EQ_INT(step(&h, b, 8), n);
    CHECK(memcmp(a, b, sizeof a[0] * n) == 0);
}

TEST(rejects_inconsistent_view)
{
    struct rig g;
    struct plan_action a[8];
    char err[ERRMSG_LEN] = "";
    rig_init(&g, 2);
    g.nodes[1].gpu_type = 7;
    CHECK_EQ_INT(planner_step(&g.cfg, &g.v, a, 8, err), -1);
    CHECK(strstr(err, "node 1") != NULL);
    g.nodes[1].gpu_type = 0;
    g.nodes[1].id = 0;
    CHECK_EQ_INT(planner_step(&g.cfg, &g.v, a, 8, err), -1);
    CHECK(strstr(err, "twice") != NULL);
}

/* Holt's linear smoothing over 1 s periods, alpha = beta = 0.5: a constant rate is its own level
 * with no trend and no error; a ramp of 1000 tokens/s per second is tracked exactly once its
 * slope is seen (level 3000, trend 1000, error 500 after three periods: 1000 at the second, then
 * halved), and forecast 2 s ahead as 5000; an empty period closes with rate 0. */
TEST(forecast_is_holt_smoothing)
{
    struct plan_forecast f;
    struct plan_model pm = {0};
    planner_forecast_init(&f, 0, 1000, 0.5, 0.5);
    for (int k = 0; k <= 5; k++) planner_forecast_observe(&f, 1000.0 * k + 500, 1000);
    planner_forecast_fill(&f, &pm);
    CHECK_EQ_INT(pm.fc_valid, 1);
    CHECK(pm.fc_level == 1000 && pm.fc_trend == 0 && pm.fc_err == 0);
    planner_forecast_init(&f, 0, 1000, 0.5, 0.5);
    for (int k = 0; k < 3; k++) planner_forecast_observe(&f, 1000.0 * k, 1000.0 * (k + 1));
    planner_forecast_fill(&f, &pm); /* two periods closed: the slope is seen */
    CHECKF(pm.fc_valid == 1 && pm.fc_level == 2000 && pm.fc_trend == 1000 && pm.fc_err == 1000,
           "level %g trend %g err %g", pm.fc_level, pm.fc_trend, pm.fc_err);
    planner_forecast_observe(&f, 3000, 0); /* closes the third */
    planner_forecast_fill(&f, &pm);
    CHECK_EQ_INT(pm.fc_valid, 1);
    CHECKF(pm.fc_level == 3000 && pm.fc_trend == 1000 && pm.fc_err == 500,
           "level %g trend %g err %g", pm.fc_level, pm.fc_trend, pm.fc_err);
    CHECK(planner_forecast_at(&pm, 2000) == 5000);
    planner_forecast_observe(&f, 5000, 0); /* periods 4 and 5: nothing arrived */
    CHECK(f.periods == 5 && f.level < 3000);
}

/* The onset signal: 3000 tokens observed at 100 ms (after nothing at 0) read 3000 / 0.3 s =
 * 10000 tokens/s at once, while no 500 ms period has closed; 300 ms later, with nothing more,
 * 10000 / e; planner_forecast_fill copies it. */
TEST(forecast_fast_rate_sees_a_clump)
{
    struct plan_forecast f;
    struct plan_model pm = {0};
    planner_forecast_init(&f, 0, 500, 0.3, 0.1);
    planner_forecast_observe(&f, 0, 0);
    planner_forecast_observe(&f, 100, 3000);
    CHECKF(fabs(f.fast - 10000) < 1e-6 && f.periods == 0, "fast %g, %d periods", f.fast, f.periods);
    planner_forecast_observe(&f, 400, 0);
    planner_forecast_fill(&f, &pm);
    CHECKF(fabs(pm.fc_fast - 10000 / M_E) < 1e-6, "fast %g", pm.fc_fast);
}

/* Batch slots (the live bench that the forecast missed: short prompts, 29-token answers, max
 * batch 8): one replica runs 8 and queues 3 short prompts, a forecast of 100 tokens/s it takes
 * easily and a queue it prefills in 48 ms. Without max_seqs nothing happens; with 8 slots, 11
 * requests pass 1.25 x 8 = 10: ceil(11 / 10) = 2 replicas, one more, reason SLOTS (11 > 10).
 * Scale-in keeps ceil(seqs / (0.75 x 8)) replicas: two serving 4 + 3 running stay (7 > 6). */
TEST(full_batch_slots_scale_up)
{
    struct rig g;
    struct plan_action a[8];
    rig_init(&g, 4);
    serve(&g, 0, 3, 48);
    g.nodes[0].load.running_seqs = 8;
    g.nodes[0].host_cached = 1;
    g.models[0].tpot_slo_ms = 0;
    g.models[0].fc_valid = 1;
    g.models[0].fc_level = 100;
    CHECK_EQ_INT(step(&g, a, 8), 0);
    g.cfg.max_seqs = 8;
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].kind, PLAN_SCALE_UP);
    CHECK_EQ_INT(a[0].reason, PLAN_WHY_SLOTS);
    CHECK_EQ_INT(a[0].n_chain, 1);
    CHECK(a[0].why_value == 11 && a[0].why_limit == 10);
    g.nodes[0].load.running_seqs = 7;
    g.nodes[0].load.queue_len = 0;
    g.nodes[0].load.queued_tokens = 0;
    CHECK_EQ_INT(step(&g, a, 8), 0); /* 7 of 10: no more */
    g.cfg.handover = 1;
    serve(&g, 1, 0, 0);
    g.nodes[0].load.running_seqs = 4;
    g.nodes[1].load.running_seqs = 3;
    g.nodes[1].load.idle_since_ms = -1;
    CHECK_EQ_INT(step(&g, a, 8), 0); /* 7 > 0.75 x 8: both stay */
    g.nodes[0].load.running_seqs = 3;
    CHECK_EQ_INT(step(&g, a, 8), 1); /* 6: one goes */
    CHECK_EQ_INT(a[0].kind, PLAN_SCALE_DOWN);
    CHECK_EQ_INT(a[0].reason, PLAN_WHY_CAPACITY);
}

/* Onset: one replica of 1024 tokens/s, a forecast of 500 tokens/s (fits). A fast rate of 5000
 * (past 1.5 x 500) is the demand: ceil(5000 / (1024 x 1.3)) = 4 replicas, 3 more, reason
 * FORECAST; 700 (under 750) is not an onset, nor is 5000 with onset_ratio 0. Scale-in keeps
 * capacity for it too: three busy replicas with a forecast of 100 tokens/s would go down to one,
 * but not while the fast rate is 2500 (ceil(2500 / (1024 x 0.9)) = 3). */
TEST(onset_scales_for_the_clump)
{
    struct rig g;
    struct plan_action a[8];
    rig_init(&g, 6);
    serve(&g, 0, 0, 0);
    g.nodes[0].load.idle_since_ms = -1;
    g.nodes[0].host_cached = 1;
    g.models[0].tpot_slo_ms = 0;
    g.models[0].fc_valid = 1;
    g.models[0].fc_level = 500;
    g.models[0].fc_fast = 5000;
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].kind, PLAN_SCALE_UP);
    CHECK_EQ_INT(a[0].reason, PLAN_WHY_FORECAST);
    CHECK_EQ_INT(a[0].n_chain, 3);
    CHECK(a[0].why_value == 5000);
    g.models[0].fc_fast = 700;
    CHECK_EQ_INT(step(&g, a, 8), 0);
    g.models[0].fc_fast = 5000;
    g.cfg.onset_ratio = 0;
    CHECK_EQ_INT(step(&g, a, 8), 0);
    g.cfg.onset_ratio = 1.5;
    g.cfg.handover = 1;
    g.models[0].fc_level = 100;
    g.models[0].fc_fast = 2500;
    for (int i = 0; i < 3; i++) {
        serve(&g, i, 0, 0);
        g.nodes[i].load.running_seqs = 1;
        g.nodes[i].load.kv_used = 0.1;
        g.nodes[i].load.idle_since_ms = -1;
    }
    CHECK_EQ_INT(step(&g, a, 8), 0);
    g.models[0].fc_fast = 0;
    CHECK_EQ_INT(step(&g, a, 8), 2);
    CHECK(a[0].kind == PLAN_SCALE_DOWN && a[0].reason == PLAN_WHY_CAPACITY);
}

/* One replica of 1024 prompt tokens/s (1/1024 s a token, no TPOT guard). A forecast of 3000
 * tokens/s asks for ceil(3000 / (1024 x 1.3)) = 3 replicas: 2 more, reason FORECAST; 1000 fits
 * one; a trend of 1000 tokens/s per second over the 1.12 s load (14 GB at 12.5 GB/s) makes it
 * 2120: one more. Off with cfg.proactive = 0, and without a valid forecast. */
TEST(proactive_scale_up_on_the_forecast)
{
    struct rig g;
    struct plan_action a[8];
    rig_init(&g, 4);
    serve(&g, 0, 0, 0);
    g.nodes[0].load.idle_since_ms = -1; /* busy: no keep-alive scale-down */
    g.nodes[0].host_cached = 1;
    g.models[0].tpot_slo_ms = 0;
    g.models[0].fc_valid = 1;
    g.models[0].fc_level = 3000;
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].kind, PLAN_SCALE_UP);
    CHECK_EQ_INT(a[0].reason, PLAN_WHY_FORECAST);
    CHECK_EQ_INT(a[0].n_chain, 2);
    CHECKF(a[0].why_value == 3000 && fabs(a[0].why_limit - 1024 * 1.3) < 1e-6, "%g vs %g",
           a[0].why_value, a[0].why_limit);
    g.models[0].fc_level = 1000;
    CHECK_EQ_INT(step(&g, a, 8), 0);
    g.models[0].fc_trend = 1000;
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].n_chain, 1);
    g.cfg.proactive = 0;
    CHECK_EQ_INT(step(&g, a, 8), 0);
    g.cfg.proactive = 1;
    g.models[0].fc_valid = 0;
    CHECK_EQ_INT(step(&g, a, 8), 0);
}

/* Nodes 0-2 serve model 0 busy (running[i] sequences, KV kv[i]), node 0 with the host copy; the
 * forecast valid at `level` tokens/s, hand-over on (capacity scale-in), no TPOT guard. */
static void busy_three(struct rig *g, int n_nodes, const int *running, const double *kv,
                       double level)
{
    rig_init(g, n_nodes);
    g->models[0].tpot_slo_ms = 0;
    g->models[0].fc_valid = 1;
    g->models[0].fc_level = level;
    g->cfg.handover = 1;
    for (int i = 0; i < 3; i++) {
        serve(g, i, 0, 0);
        g->nodes[i].load.running_seqs = running[i];
        g->nodes[i].load.kv_used = kv[i];
        g->nodes[i].load.idle_since_ms = -1;
    }
    g->nodes[0].host_cached = 1;
}

/* Three busy replicas (running 3, 1, 2; KV 30%, 20%, 10%), a forecast of 1000 tokens/s: at
 * util_low 0.9 one replica of ~1022 tokens/s would be short (1000 / 920 -> 2 needed), so one of
 * three leaves: node 1 (fewest running), handing its sequences to node 2 (least KV, room for
 * both). At 3000 tokens/s nobody leaves; without hand-over (the live default) nobody does. With
 * partial residency (standby_max 2, an error of 1500 tokens/s: 2 standbys wanted) the leaver keeps
 * k = ceil(32 x (1 - 250 / 1120)) = 25 layers. */
TEST(capacity_scale_in_hands_over)
{
    struct rig g;
    struct plan_action a[8];
    busy_three(&g, 4, (int[]){3, 1, 2}, (double[]){0.3, 0.2, 0.1}, 1000);
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].kind, PLAN_SCALE_DOWN);
    CHECK_EQ_INT(a[0].node, 1);
    CHECK_EQ_INT(a[0].handover, 2);
    CHECK_EQ_INT(a[0].reason, PLAN_WHY_CAPACITY);
    CHECK_EQ_INT(a[0].keep_layers, 0);
    g.cfg.standby_max = 2;
    g.models[0].fc_err = 1500;
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].keep_layers, 25);
    g.models[0].fc_level = 3000;
    g.models[0].fc_err = 0;
    int n = step(&g, a, 8);
    for (int k = 0; k < n; k++) CHECK(a[k].kind != PLAN_SCALE_DOWN);
    g.models[0].fc_level = 1000;
    g.cfg.handover = 0;
    CHECK_EQ_INT(step(&g, a, 8), 0);
}

/* The live proactive run that flapped: arrivals over (the forecast says 0 tok/s) while node 0
 * still queues a 200-token prompt. Capacity scale-in keeps the replicas that queue needs: node 2
 * may go (node 1 still answers a new prompt in 201 ms, within 0.9 x the 250 ms SLO), node 1 may
 * not (node 0 alone, with node 1's and node 2's sequences, would predict 400+ ms and scale up
 * again at the next tick). Once node 0's queue is gone both go. */
TEST(scale_in_keeps_what_the_queue_needs)
{
    struct rig g;
    struct plan_action a[8];
    busy_three(&g, 3, (int[]){2, 1, 1}, (double[]){0.05, 0.05, 0.05}, 0);
    g.nodes[0].load.queue_len = 1;
    g.nodes[0].load.queued_tokens = 200;
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].kind, PLAN_SCALE_DOWN);
    CHECK_EQ_INT(a[0].node, 2);
    CHECK_EQ_INT(a[0].handover, 0);
    g.nodes[0].load.queue_len = 0;
    g.nodes[0].load.queued_tokens = 0;
    CHECK_EQ_INT(step(&g, a, 8), 2);
    CHECK_EQ_INT(a[0].node, 2);
    CHECK_EQ_INT(a[1].node, 1);
}

/* A standby of 25 layers (node 3) is the first joiner when the queue asks for one more, streamed
 * on its own from the serving node; and it is trimmed when the forecast's error no longer asks
 * for any. */
/* Two leave in one tick: the second is never the first's receiver (its sequences would run on a
 * node that left), nor is a node that runs other nodes' sequences (load.helping: a receiver of an
 * earlier hand-over) ever the one to leave, or idle. */
TEST(receivers_and_helpers_stay)
{
    struct rig g;
    struct plan_action a[8];
    /* a forecast of 500 tokens/s: one replica is enough, two of three leave */
    busy_three(&g, 4, (int[]){3, 1, 2}, (double[]){0.3, 0.2, 0.1}, 500);
    CHECK_EQ_INT(step(&g, a, 8), 2);
    CHECK(a[0].node == 1 && a[0].handover == 2); /* the fewest running, to the most room */
    CHECK(a[1].node == 0 && a[1].handover == 2); /* node 2 (2 running) receives: it stays */
    /* node 2 runs sequences of another node: node 1 leaves to it, node 0 too */
    g.nodes[2].load.helping = 4;
    g.nodes[2].load.running_seqs = 0;
    CHECK_EQ_INT(step(&g, a, 8), 2);
    for (int k = 0; k < 2; k++) CHECK(a[k].node != 2 && a[k].handover == 2);
    /* idle but helping: not idle (no keep-alive scale-down); once it helps none, it goes */
    g.cfg.handover = 0;
    for (int i = 0; i < 3; i++) serve(&g, i, 0, 0), g.nodes[i].load.running_seqs = 0;
    g.v.now_ms = 100000;
    g.nodes[0].load.helping = g.nodes[1].load.helping = 3;
    g.nodes[2].load.helping = 1;
    CHECK_EQ_INT(step(&g, a, 8), 0);
    g.nodes[2].load.helping = 0;
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK(a[0].kind == PLAN_SCALE_DOWN && a[0].node == 2 && a[0].reason == PLAN_WHY_IDLE);
}

TEST(standby_joins_first_and_is_trimmed)
{
    struct rig g;
    struct plan_action a[8];
    rig_init(&g, 4);
    serve(&g, 0, 4, 4096); /* 4 s of queue: late */
    g.nodes[0].host_cached = 1;
    g.nodes[3].engine_model = 0;
    g.nodes[3].layers_resident = 25;
    g.nodes[3].standby = 1;
    g.cfg.max_joiners = 1;
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].kind, PLAN_SCALE_UP);
    CHECK_EQ_INT(a[0].n_chain, 1);
    CHECK_EQ_INT(a[0].chain[0], 3);
    CHECK_EQ_INT(a[0].source, 0);
    /* no queue, no forecast error: no standby wanted, node 3 gives its layers back */
    serve(&g, 0, 0, 0);
    g.nodes[0].load.idle_since_ms = -1;
    g.cfg.standby_max = 2;
    g.models[0].fc_valid = 1;
    g.models[0].fc_level = 100;
    CHECK_EQ_INT(step(&g, a, 8), 1);
    CHECK_EQ_INT(a[0].kind, PLAN_SCALE_DOWN);
    CHECK_EQ_INT(a[0].node, 3);
    CHECK_EQ_INT(a[0].reason, PLAN_WHY_STANDBY);
    /* a standby is no replica: it takes no request */
    char err[ERRMSG_LEN];
    struct plan_route r;
    g.nodes[0].alive = 0;
    CHECK_EQ_INT(planner_route(&g.cfg, &g.v, 0, 10, &r, err), 0);
    CHECK_EQ_INT(r.node, -1);
}

int main(void)
{
    RUN(scale_up_exactly_at_slack_boundary);
    RUN(cold_model_with_held_requests_scales_up);
    RUN(chain_order_fastest_hop_first);
    RUN(never_drops_last_copy);
    RUN(one_scale_down_per_tick);
    RUN(restores_r_after_holder_dies);
    RUN(restore_r_into_a_free_slot);
    RUN(restore_r_spreads_over_racks);
    RUN(drop_keeps_copies_spread_over_racks);
    RUN(switch_never_drops_a_last_copy);
    RUN(switching_node_is_no_source);
    RUN(routes_to_joiner_by_k);
    RUN(prefers_faster_of_two_unequal_nodes);
    RUN(deterministic_and_order_independent);
    RUN(rejects_inconsistent_view);
    RUN(refusing_node_left_out_for_that_model);
    RUN(forecast_is_holt_smoothing);
    RUN(forecast_fast_rate_sees_a_clump);
    RUN(onset_scales_for_the_clump);
    RUN(proactive_scale_up_on_the_forecast);
    RUN(capacity_scale_in_hands_over);
    RUN(full_batch_slots_scale_up);
    RUN(scale_in_keeps_what_the_queue_needs);
    RUN(standby_joins_first_and_is_trimmed);
    RUN(receivers_and_helpers_stay);
    CHECK_DONE();
}
