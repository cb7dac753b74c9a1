/* The simulator's policies: each published system's controller against closed forms and
 * hand-worked cases from its rules (sim_blitzscale.h, sim_serverlessllm.h, sim_tokenscale.h,
 * sim_fixed.h), on hand-built views; Strata against BlitzScale on a small stream whose first
 * scale-out times follow from their triggers; zero-loss scale-in (hundreds of forced hand-overs,
 * no request restarted, every token generated); no result depending on the instances' order
 * (seeds on a symmetric cluster, the GPU types listed either way). Simulations run in child
 * processes (SimGrid's engine is once per process). */
#include "check.h"
#include "cluster/sim/sim.h"
#include "cluster/sim/sim_blitzscale.h"
#include "cluster/sim/sim_fixed.h"
#include "cluster/sim/sim_policy.h"
#include "cluster/sim/sim_serverlessllm.h"
#include "cluster/sim/sim_tokenscale.h"
#include "os/common/errmsg.h"

/* ---- hand-built views ---- */

enum { N = 4, L = 32 };

struct obs_rig {
    struct plan_node nodes[N];
    struct plan_model model;
    struct step_model step;
    double tput;
    struct plan_view v;
    struct sim_inst_info inst[N];
    struct sim_config c;
    struct sim_policy p;
    struct sim_obs o;
};

/* N instances of 1000 prompt tokens/s and 10,000 KV tokens each, one per server; none serving. */
static void obs_init(struct obs_rig *g, const char *policy)
{
    memset(g, 0, sizeof *g);
    sim_config_default(&g->c);
    sim_policy_by_name(policy, &g->p);
    g->model = (struct plan_model){.layers = L, .bytes = 1e9, .ttft_slo_ms = 300};
    g->step = (struct step_model){.a = 1e-3, .corr = 1};
    g->tput = 1;
    for (int i = 0; i < N; i++) {
        g->nodes[i] = (struct plan_node){.id = i,
                                         .alive = 1,
                                         .domain = i,
                                         .link_Bps = 1e9,
                                         .host_Bps = 1e9,
                                         .engine_model = -1,
                                         .helper = -1,
                                         .load = {.idle_since_ms = 0}};
        g->inst[i] = (struct sim_inst_info){
            .kv_cap = 10000, .gpus = 1, .server = i, .prefill_tok_s = 1000, .ssd_cached = 1};
    }
    g->v = (struct plan_view){.nodes = g->nodes,
                              .n_nodes = N,
                              .models = &g->model,
                              .n_models = 1,
                              .n_gpu_types = 1,
                              .tput = &g->tput,
                              .step = &g->step};
    g->o = (struct sim_obs){.v = &g->v, .inst = g->inst, .c = &g->c, .p = &g->p};
}

static void obs_serve(struct obs_rig *g, int i, long queued, long kv)
{
    g->nodes[i].engine_model = 0;
    g->nodes[i].layers_resident = L;
    g->nodes[i].load.queued_tokens = queued;
    g->nodes[i].load.queue_len = queued > 0;
    g->nodes[i].load.idle_since_ms = queued || kv ? -1 : 0;
    g->inst[i].kv_used = kv;
    g->inst[i].ongoing = queued > 0 || kv > 0;
}

static void obs_at(struct obs_rig *g, double t)
{
    g->o.now_s = t;
    g->v.now_ms = t * 1000;
}

/* ---- BlitzScale ---- */

/* generate_scale_target by hand: W = 30,000 waiting tokens at V = 10,000 tokens/s: Eq.3's bounds
 * ceil(30000 / 7000) = 5 and ceil(30000 / 5000) = 6, so 2 instances become (5 + 6 + 1) / 2 = 6:
 * +4; KV of 2 C on 3: Eq.1's bounds 3 and 3: stay; nothing waiting and KV of C on 5: max 2 < 5:
 * one goes; one instance with nothing to do stays (the floor). */
TEST(blitzscale_bounds_by_hand)
{
    struct blitz_out o;
    blitz_target(&(struct blitz_in){2, 30000, 0, 10000, 1000, 1}, &o);
    CHECK(o.min == 5 && o.max == 6 && o.delta == 4);
    blitz_target(&(struct blitz_in){3, 0, 2000, 10000, 1000, 1}, &o);
    CHECK(o.min == 3 && o.max == 3 && o.delta == 0);
    blitz_target(&(struct blitz_in){5, 0, 1000, 10000, 1000, 1}, &o);
    CHECK(o.min == 2 && o.max == 2 && o.delta == -1);
    blitz_target(&(struct blitz_in){1, 0, 0, 10000, 1000, 1}, &o);
    CHECK_EQ_INT(o.delta, 0);
}

/* Its scale-up order and shut-down: two instances with nothing waiting and KV of 1,500 tokens
 * (Eq.1: one will do) -> the one with less KV (1) starts shutting down: no action, the router
 * skips it. Then 5,000 tokens wait on 0: Eq.3 asks for (8 + 10 + 1) / 2 = 9, eight more: 1 is
 * revived first, then a free instance (2, the lower id; max_joiners 1) loads by chain from 1, the
 * serving instance with the fewest KV blocks in use. Shut again at t = 1.0 with the KV low, 1 is not released at 1.2 (under
 * 333 ms) and is at 1.4, drained. */
TEST(blitzscale_revives_before_loading_and_shuts_after_333_ms)
{
    static struct obs_rig g;
    struct plan_action a[8];
    char err[ERRMSG_LEN];
    obs_init(&g, "blitzscale");
    g.c.max_joiners = 1;
    obs_serve(&g, 0, 0, 1000);
    obs_serve(&g, 1, 0, 500);
    const struct sim_controller *ctl = &sim_ctl_blitzscale;
    void *st = ctl->init(&g.o);
    obs_at(&g, 0.1);
    CHECK_EQ_INT(ctl->tick(st, &g.o, a, 8, err), 0);
    int node = -2;
    g.nodes[0].load.queued_tokens = 100; /* 0 busier than 1: still 0, 1 is shutting down */
    CHECK(ctl->route(st, &g.o, 10, &node, err) == 0 && node == 0);
    obs_serve(&g, 0, 5000, 1000);
    obs_at(&g, 0.2);
    CHECK_EQ_INT(ctl->tick(st, &g.o, a, 8, err), 1);
    CHECK_EQ_INT(a[0].kind, PLAN_SCALE_UP);
    CHECK_EQ_INT(a[0].source, 1);  /* idle links alike: the fewest KV blocks in use */
    CHECK_EQ_INT(a[0].n_chain, 1); /* max_joiners */
    CHECK_EQ_INT(a[0].chain[0], 2);
    g.nodes[0].load.queued_tokens = 6000;
    CHECK(ctl->route(st, &g.o, 10, &node, err) == 0 && node == 1); /* revived */
    obs_serve(&g, 0, 0, 1000);
    obs_serve(&g, 1, 0, 0);
    obs_at(&g, 1.0);
    CHECK_EQ_INT(ctl->tick(st, &g.o, a, 8, err), 0); /* 1 shuts down (least KV) */
    obs_at(&g, 1.2);
    CHECK_EQ_INT(ctl->tick(st, &g.o, a, 8, err), 0); /* n = 1 (0 alone): stay; 1 too young */
    obs_at(&g, 1.4);
    CHECK_EQ_INT(ctl->tick(st, &g.o, a, 8, err), 1);
    CHECK_EQ_INT(a[0].kind, PLAN_SCALE_DOWN);
    CHECK_EQ_INT(a[0].node, 1);
    sim_controller_fini(ctl, st);
}

/* ---- ServerlessLLM ---- */

/* Its auto_scaler: ceil(5 / 2) = 3, at least the floor. Its startup estimate: 1 GB over 1 GB/s of
 * PCIe from host memory = 1 s; from the SSD (6 GB/s) with one load already reading it: 2 x 1/6 s.
 * It starts one instance per loop, on the least estimate; routes round robin over instances
 * holding fewer than sllm_max_queue requests. */
TEST(serverlessllm_by_hand)
{
    static struct obs_rig g;
    struct plan_action a[8];
    char err[ERRMSG_LEN];
    CHECK_EQ_INT(sllm_desired(5, 2, 1), 3);
    CHECK_EQ_INT(sllm_desired(0, 2, 1), 1);
    obs_init(&g, "serverlessllm");
    obs_serve(&g, 0, 0, 0);
    g.nodes[1].host_cached = 1;
    g.inst[3].server = 2;
    g.inst[3].loading_from_ssd = 1;
    CHECK(fabs(sllm_startup_s(&g.o, 1) - 1.0) < 1e-12);
    CHECK(fabs(sllm_startup_s(&g.o, 2) - 2 * 1e9 / 6e9) < 1e-12);
    const struct sim_controller *ctl = &sim_ctl_serverlessllm;
    void *st = ctl->init(&g.o);
    g.inst[0].ongoing = 5;
    CHECK_EQ_INT(ctl->tick(st, &g.o, a, 8, err), 1);
    CHECK(a[0].kind == PLAN_SCALE_UP && a[0].n_chain == 1 && a[0].chain[0] == 2);
    g.inst[2].loading_from_ssd = 0; /* then the SSD is free: 1/6 s beats host memory's 1 s */
    g.inst[3].loading_from_ssd = 0;
    CHECK(ctl->tick(st, &g.o, a, 8, err) == 1 && a[0].chain[0] == 2);
    obs_serve(&g, 1, 0, 0);
    int node;
    CHECK(ctl->route(st, &g.o, 10, &node, err) == 0 && node == 0);
    CHECK(ctl->route(st, &g.o, 10, &node, err) == 0 && node == 1);
    g.inst[0].ongoing = 10; /* full */
    CHECK(ctl->route(st, &g.o, 10, &node, err) == 0 && node == 1);
    g.inst[1].ongoing = 10;
    CHECK(ctl->route(st, &g.o, 10, &node, err) == 0 && node == -1);
    sim_controller_fini(ctl, st);
}

/* ---- TokenScale, the fixed deployment ---- */

/* ceil(7000 / (0.7 x 1000)) = 10 instances for prefill; ceil(20000 / 9000) = 3 for the KV. A
 * fixed deployment for 10 prompts of 7,000 tokens in one second (10 s window: 7,000 tokens/s,
 * over 0.7 x 1000: 10) and for 10 long generations holding 1,100 tokens each for 100 s (KV
 * 11,000 over 0.95 x 10,000: 2). */
TEST(tokenscale_and_fixed_by_hand)
{
    CHECK_EQ_INT(tokenscale_target(7000, 1000, 0, 10000), 10);
    CHECK_EQ_INT(tokenscale_target(100, 1000, 20000, 10000), 3);
    CHECK_EQ_INT(tokenscale_target(0, 1000, 0, 10000), 1);
    struct sim_request r[10];
    for (int i = 0; i < 10; i++) r[i] = (struct sim_request){0.1 * i, 7000, 10};
    CHECK_EQ_INT(fixed_size(r, 10, 1000, 10000, 0.1), 10);
    for (int i = 0; i < 10; i++) r[i] = (struct sim_request){0.1 * i, 100, 1000};
    CHECK_EQ_INT(fixed_size(r, 10, 1000, 10000, 0.1), 2);
}

/* ---- whole runs ---- */

struct run_out {
    int rc;
    char err[ERRMSG_LEN];
    struct sim_result r;
};

static void run_policy(const struct sim_config *c, const struct sim_policy *p, struct run_out *o)
{
    memset(o, 0, sizeof *o);
    o->rc = sim_run(c, p, &o->r, NULL, o->err);
}

static void run_named(const struct sim_config *c, const char *name, struct run_out *o)
{
    struct sim_policy p;
    memset(o, 0, sizeof *o);
    if (sim_policy_by_name(name, &p)) {
        o->rc = -1;
        snprintf(o->err, sizeof o->err, "no policy %s", name);
        return;
    }
    run_policy(c, &p, o);
}

/* Four single-GPU nodes of 1000 prompt tokens/s (1 ms a token), a 4 MB model over 1 GB/s, TTFT
 * SLO 300 ms: a request of 100 tokens every 50 ms for 3 s, twice what one node prefills. The
 * queue grows by ~1000 tokens a second. BlitzScale adds a node once Eq.3's lower bound passes
 * one, W > 0.7 V = 700 tokens: about 0.7 s in (the tick after). Strata's trigger is a new
 * request's predicted TTFT past the SLO, (queue + 100) / 1000 s > 0.3: about 0.2 s in. So Strata
 * scales out about half a second earlier and its tail is shorter. */
static const char *pair_conf = "gpus = CPU:4\ngpus_per_server = 1\ngpus_per_inst = 1\n"
                               "model_spans = 1000000x4\nnic_gbps = 8\nlatency_us = 0\n"
                               "step = CPU:0.001,0,0\nmax_step_tokens = 100\nmax_seqs = 64\n"
                               "ttft_floor_ms = 300\nttft_per_tok_ms = 0\ntbt_slo_ms = 1000\n";

TEST(strata_scales_out_before_blitzscale)
{
    static struct sim_config c;
    static struct sim_request req[60];
    char err[ERRMSG_LEN];
    for (int i = 0; i < 60; i++) req[i] = (struct sim_request){0.05 * i, 100, 2};
    sim_config_default(&c);
    CHECKF(sim_config_parse(&c, pair_conf, err) == 0, "%s", err);
    c.req = req;
    c.n_req = 60;
    c.horizon_s = 3;
    struct run_out b, s;
    run_named(&c, "blitzscale", &b);
    run_named(&c, "strata", &s);
    CHECKF(b.rc == 0, "%s", b.err);
    CHECKF(s.rc == 0, "%s", s.err);
    CHECK_EQ_INT(b.r.n_done, 60);
    CHECK_EQ_INT(s.r.n_done, 60);
    CHECKF(b.r.first_scaleout_s >= 0.65 && b.r.first_scaleout_s <= 0.85,
           "blitzscale's first scale-out at %.3f s, want 0.7-0.8", b.r.first_scaleout_s);
    CHECKF(s.r.first_scaleout_s >= 0.15 && s.r.first_scaleout_s <= 0.35,
           "strata's first scale-out at %.3f s, want 0.2-0.3", s.r.first_scaleout_s);
    CHECKF(s.r.ttft_p99 < b.r.ttft_p99, "P99 TTFT strata %.0f ms, blitzscale %.0f ms", s.r.ttft_p99,
           b.r.ttft_p99);
}

/* A controller that forces churn for 45 s: every tick, with two nodes serving it scales in the
 * busier one, handing its sequences to the other (or, for the check that this can fail, to
 * nobody); with one it scales out again from it. */
static int force_handover = 1;

static int churn_tick(void *state, const struct sim_obs *o, struct plan_action *out, int cap,
                      char *err)
{
    (void)state, (void)cap, (void)err;
    const struct plan_view *v = o->v;
    int serving[N], n = 0, joining = 0;
    for (int i = 0; i < v->n_nodes; i++) {
        const struct plan_node *p = &v->nodes[i];
        if (!p->alive || p->engine_model != 0) continue;
        if (p->layers_resident < v->models[0].layers)
            joining = 1;
        else if (n < N)
            serving[n++] = i;
    }
    if (joining || v->n_scaleouts) return 0;
    if (n >= 2 && o->now_s < 45) { /* then the cluster drains what the churn left */
        int a = serving[0], b = serving[1];
        if (o->inst[b].ongoing > o->inst[a].ongoing) a = b, b = serving[0];
        out[0] = (struct plan_action){
            .kind = PLAN_SCALE_DOWN, .node = a, .source = -1, .handover = force_handover ? b : -1};
        return 1;
    }
    for (int i = 0; i < v->n_nodes && n == 1; i++)
        if (v->nodes[i].alive && v->nodes[i].engine_model < 0 && !(v->nodes[i].refused & 1)) {
            out[0] = (struct plan_action){.kind = PLAN_SCALE_UP,
                                          .source = serving[0],
                                          .node = i,
                                          .n_chain = 1,
                                          .handover = -1};
            out[0].chain[0] = i;
            return 1;
        }
    return 0;
}

static int churn_route(void *state, const struct sim_obs *o, int prompt_tokens, int *node,
                       char *err)
{
    (void)state, (void)prompt_tokens, (void)err;
    *node = sim_route_least_loaded(o, NULL);
    return 0;
}

static const struct sim_controller churn = {
    .name = "churn", .tick = churn_tick, .route = churn_route};

/* Two of three nodes serve; about 480 requests of 50 tokens generating 100 each over 60 s, at
 * 100 ms ticks: a busy node leaves as soon as two serve (its running sequences' KV, 64 KiB a
 * token, moved to the other node), hundreds of times. No request restarts or is lost: every one completes with all its
 * tokens. Without the hand-over the same churn restarts requests. */
TEST(zero_loss_scale_in)
{
    static struct sim_config c;
    char err[ERRMSG_LEN];
    struct sim_request *req;
    int n;
    sim_config_default(&c);
    CHECKF(sim_config_parse(&c, pair_conf, err) == 0, "%s", err);
    CHECKF(sim_config_parse(&c,
                            "gpus = CPU:3\nstep = CPU:0.001,0,0\ninitial = 2\n"
                            "kv_bytes_tok = 65536\n",
                            err) == 0,
           "%s", err);
    CHECKF(sim_synthetic("rps=8,dur=60,in=50,out=100", 3, &req, &n, err) == 0, "%s", err);
    c.req = req;
    c.n_req = n;
    c.horizon_s = 60;
    struct sim_policy p;
    sim_policy_by_name("strata", &p);
    p.ctl = &churn;
    struct run_out o;
    force_handover = 1;
    run_policy(&c, &p, &o);
    CHECKF(o.rc == 0, "%s", o.err);
    CHECKF(o.r.handovers >= 200, "%d hand-overs, %d scale-outs", o.r.handovers, o.r.scaleouts);
    CHECK_EQ_INT(o.r.restarts, 0);
    CHECK_EQ_INT(o.r.n_done, n);
    CHECK(o.r.moved_seqs >= o.r.handovers);
    force_handover = 0;
    run_policy(&c, &p, &o);
    free(req);
    CHECKF(o.rc == 0, "%s", o.err);
    CHECKF(o.r.restarts > 0, "%d restarts without hand-over", o.r.restarts);
}

/* The results a seed gives that do not depend on which instance is which. */
static int same_result(const struct sim_result *a, const struct sim_result *b)
{
    return a->n_done == b->n_done && a->n_attained == b->n_attained && a->ttft_p50 == b->ttft_p50 &&
           a->ttft_p99 == b->ttft_p99 && a->ttft_mean == b->ttft_mean &&
           a->tpot_p99 == b->tpot_p99 && a->gpu_s == b->gpu_s && a->scaleouts == b->scaleouts &&
           a->max_replicas == b->max_replicas;
}

/* Every policy on a symmetric cluster (one GPU per server) gives the same figures whatever the
 * shuffle (seeds 1, 2, 3); and on a mixed one the same for A100s and H100s listed either way. */
TEST(no_result_depends_on_the_order)
{
    static struct sim_config c;
    char err[ERRMSG_LEN];
    struct sim_request *req;
    int n;
    CHECKF(sim_synthetic("rps=15,dur=20,burst=60,at=5,len=5,in=512,out=32", 5, &req, &n, err) == 0,
           "%s", err);
    const char *const *lists[] = {sim_policy_names, sim_policy_extra_names};
    for (int l = 0; l < 2; l++)
        for (int k = 0; lists[l][k]; k++) {
            const char *name = lists[l][k];
            if (!strcmp(name, "strata-stop-the-world")) continue; /* a replay policy */
            struct run_out o[3];
            for (int seed = 1; seed <= 3; seed++) {
                sim_config_default(&c);
                CHECK(sim_config_parse(&c,
                                       "gpus = H100:8\ngpus_per_server = 1\nmodel = 7B\n"
                                       "keep_alive_s = 5\n",
                                       err) == 0);
                c.seed = (unsigned)seed;
                c.req = req;
                c.n_req = n;
                c.horizon_s = 20;
                run_named(&c, name, &o[seed - 1]);
                CHECKF(o[seed - 1].rc == 0, "%s: %s", name, o[seed - 1].err);
            }
            CHECKF(o[0].r.scaleouts > 0 || !strcmp(name, "fixed"), "%s never scaled", name);
            CHECKF(same_result(&o[0].r, &o[1].r) && same_result(&o[0].r, &o[2].r),
                   "%s: P99 TTFT %.3f / %.3f / %.3f ms, GPU-s %.3f / %.3f / %.3f by seed", name,
                   o[0].r.ttft_p99, o[1].r.ttft_p99, o[2].r.ttft_p99, o[0].r.gpu_s, o[1].r.gpu_s,
                   o[2].r.gpu_s);
            for (int order = 0; order < 2; order++) {
                sim_config_default(&c);
                CHECK(sim_config_parse(&c,
                                       order ? "gpus = H100:4,A100:4\n" : "gpus = A100:4,H100:4\n",
                                       err) == 0);
                CHECK(sim_config_parse(&c, "gpus_per_server = 1\nmodel = 7B\nkeep_alive_s = 5\n",
                                       err) == 0);
                c.seed = 7;
                c.req = req;
                c.n_req = n;
                c.horizon_s = 20;
                run_named(&c, name, &o[order]);
                CHECKF(o[order].rc == 0, "%s: %s", name, o[order].err);
            }
            CHECKF(same_result(&o[0].r, &o[1].r),
                   "%s: A100s first P99 %.3f ms GPU-s %.3f, H100s first %.3f ms %.3f", name,
                   o[0].r.ttft_p99, o[0].r.gpu_s, o[1].r.ttft_p99, o[1].r.gpu_s);
        }
    free(req);
}

/* Every key sim_config_keys lists is one sim_config_set knows (a bad value is refused for the
 * value, not as an unknown key), and the command line's --KEY list is that list. */
TEST(config_keys_are_known)
{
    static struct sim_config c;
    char err[ERRMSG_LEN];
    int n = 0;
    for (int k = 0; sim_config_keys[k]; k++, n++) {
        sim_config_default(&c);
        err[0] = 0;
        sim_config_set(&c, sim_config_keys[k], "?", err);
        CHECKF(!strstr(err, "unknown setting"), "%s: %s", sim_config_keys[k], err);
    }
    CHECK(n > 40);
    CHECK(sim_config_set(&c, "no_such_key", "1", err) == -1 && strstr(err, "unknown setting"));
}

int main(void)
{
    RUN(blitzscale_bounds_by_hand);
    RUN(blitzscale_revives_before_loading_and_shuts_after_333_ms);
    RUN(serverlessllm_by_hand);
    RUN(tokenscale_and_fixed_by_hand);
    RUN(strata_scales_out_before_blitzscale);
    RUN(zero_loss_scale_in);
    RUN(no_result_depends_on_the_order);
    RUN(config_keys_are_known);
    CHECK_DONE();
}
