/* sim_serverlessllm: ServerlessLLM's controller; the rules and their sources are in the header. */
#include "cluster/sim/sim_serverlessllm.h"

#include "cluster/sim/sim.h"
#include "cluster/sim/sim_policy.h"

#include <math.h>
#include <stdlib.h>

struct sllm {
    double idle_s; /* since the model's last request, counted per loop as the router does */
    int rr;        /* round robin position */
};

int sllm_desired(int ongoing, double target, int floor)
{
    int d = (int)ceil(ongoing / (target > 0 ? target : 1));
    return d > floor ? d : floor;
}

double sllm_startup_s(const struct sim_obs *o, int i)
{
    const struct plan_node *n = &o->v->nodes[i];
    double bytes = o->v->models[0].bytes;
    if (n->host_cached & 1) return bytes / (n->host_Bps > 0 ? n->host_Bps : 1);
    int queued = 0; /* loads already reading this server's SSD */
    for (int j = 0; j < o->v->n_nodes; j++)
        queued += o->inst[j].server == o->inst[i].server && o->inst[j].loading_from_ssd;
    double ssd = o->c->tiers.ssd_Bps > 0 ? o->c->tiers.ssd_Bps : 1;
    return (queued + 1) * bytes / ssd;
}

static void *init(const struct sim_obs *o)
{
    (void)o;
    struct sllm *st = calloc(1, sizeof *st);
    if (!st) abort();
    return st;
}

static int tick(void *state, const struct sim_obs *o, struct plan_action *out, int cap, char *err)
{
    (void)err;
    struct sllm *st = state;
    const struct plan_view *v = o->v;
    if (cap < 1) return 0;
    if (o->arrived > 0) st->idle_s = 0;
    int ongoing = o->held, running = sim_obs_replicas(o, NULL, NULL);
    for (int i = 0; i < v->n_nodes; i++) ongoing += o->inst[i].ongoing;
    int floor = o->c->initial_replicas > 0 ? o->c->initial_replicas : 1;
    int desired = sllm_desired(ongoing, o->c->sllm_target, floor);
    if (desired > running) { /* start one: the least estimated startup time */
        int best = -1;
        double best_t = 0;
        for (int i = 0; i < v->n_nodes; i++) {
            const struct plan_node *n = &v->nodes[i];
            if (!n->alive || n->engine_model >= 0) continue;
            double t = sllm_startup_s(o, i);
            if (best < 0 || t < best_t) best = i, best_t = t;
        }
        if (best < 0) return 0;
        out[0] = (struct plan_action){.kind = PLAN_SCALE_UP,
                                      .model = 0,
                                      .source = best,
                                      .node = best,
                                      .n_chain = 1,
                                      .reason = PLAN_WHY_SLACK,
                                      .handover = -1};
        out[0].chain[0] = best;
        return 1;
    }
    if (desired < running) {
        if (st->idle_s < o->c->sllm_keep_alive_s) {
            st->idle_s += 1; /* the loop's period */
            return 0;
        }
        int pick = -1;
        for (int i = 0; i < v->n_nodes; i++) /* an idle ready instance, the last one */
            if (v->nodes[i].alive && v->nodes[i].engine_model == 0 &&
                v->nodes[i].layers_resident >= v->models[0].layers && o->inst[i].ongoing == 0)
                pick = i;
        if (pick < 0) return 0;
        st->idle_s = 0;
        out[0] = (struct plan_action){.kind = PLAN_SCALE_DOWN,
                                      .model = 0,
                                      .source = -1,
                                      .node = pick,
                                      .reason = PLAN_WHY_IDLE,
                                      .handover = -1};
        return 1;
    }
    return 0;
}

static int route(void *state, const struct sim_obs *o, int prompt_tokens, int *node, char *err)
{
    (void)prompt_tokens, (void)err;
    struct sllm *st = state;
    const struct plan_view *v = o->v;
    int n = v->n_nodes;
    *node = -1;
    for (int k = 0; k < n; k++) {
        int i = (st->rr + k) % n;
        const struct plan_node *p = &v->nodes[i];
        if (!p->alive || p->engine_model != 0 || p->standby ||
            p->layers_resident < v->models[0].layers || o->inst[i].ongoing >= o->c->sllm_max_queue)
            continue;
        *node = i;
        st->rr = (i + 1) % n;
        break;
    }
    return 0;
}

const struct sim_controller sim_ctl_serverlessllm = {
    .name = "serverlessllm", .period_s = 1, .init = init, .tick = tick, .route = route};
