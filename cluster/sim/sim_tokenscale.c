/* sim_tokenscale: TokenScale's signal on a colocated pool; rules and what is approximated are in
 * the header. */
#include "cluster/sim/sim_tokenscale.h"

#include "cluster/sim/sim.h"
#include "cluster/sim/sim_policy.h"

#include <math.h>
#include <stdlib.h>

int tokenscale_target(double v_in, double v_p, double kv, double cap)
{
    int p = v_p > 0 ? (int)ceil(v_in / (TOKENSCALE_UTIL * v_p)) : 1;
    int d = cap > 0 ? (int)ceil(kv / (0.9 * cap)) : 1;
    int n = p > d ? p : d;
    return n > 1 ? n : 1;
}

struct tokenscale {
    double velocity, last_s; /* smoothed prompt tokens/s; the last tick */
    unsigned char *draining;
};

static void *init(const struct sim_obs *o)
{
    struct tokenscale *t = calloc(1, sizeof *t);
    if (!t) abort();
    t->draining = calloc(o->v->n_nodes, 1);
    if (!t->draining) abort();
    t->last_s = o->now_s;
    return t;
}

static void fini(void *state)
{
    struct tokenscale *t = state;
    if (!t) return;
    free(t->draining);
    free(t);
}

static int tick(void *state, const struct sim_obs *o, struct plan_action *out, int cap, char *err)
{
    (void)err;
    struct tokenscale *t = state;
    const struct plan_view *v = o->v;
    double dt = o->now_s - t->last_s;
    t->last_s = o->now_s;
    if (dt > 0) { /* an exponential average with a one-second time constant */
        double w = 1 - exp(-dt);
        t->velocity = w * (o->arrived_tokens / dt) + (1 - w) * t->velocity;
    }
    int n = 0, L = v->models[0].layers, n_out = 0;
    double kv = 0;
    for (int i = 0; i < v->n_nodes; i++) {
        const struct plan_node *p = &v->nodes[i];
        if (!p->alive || p->engine_model != 0 || p->standby) {
            t->draining[i] = 0;
            continue;
        }
        if (t->draining[i]) continue;
        n++;
        kv += (double)o->inst[i].kv_used;
    }
    int target =
        tokenscale_target(t->velocity, sim_obs_mean_prefill_tok_s(o), kv, sim_obs_mean_kv_cap(o));
    int add = target - n;
    for (int i = 0; i < v->n_nodes && add > 0; i++) /* draining ones come back first */
        if (t->draining[i]) t->draining[i] = 0, add--;
    if (add > 0 && n_out < cap) {
        int src = -1;
        for (int i = 0; i < v->n_nodes; i++) {
            const struct plan_node *p = &v->nodes[i];
            if (!p->alive || p->engine_model != 0 || p->standby || p->layers_resident < L ||
                t->draining[i])
                continue;
            if (src < 0 || p->sources_busy < v->nodes[src].sources_busy) src = i;
        }
        if (src >= 0) {
            struct plan_action *a = &out[n_out];
            *a = (struct plan_action){.kind = PLAN_SCALE_UP,
                                      .model = 0,
                                      .source = src,
                                      .reason = PLAN_WHY_FORECAST,
                                      .handover = -1};
            int lim = add < o->c->max_joiners ? add : o->c->max_joiners;
            for (int pass = 0; pass < 2; pass++) /* the source's server first */
                for (int i = 0; i < v->n_nodes && a->n_chain < lim; i++) {
                    const struct plan_node *p = &v->nodes[i];
                    int same = o->inst[i].server == o->inst[src].server, busy = 0;
                    for (int s = 0; s < v->n_scaleouts && !busy; s++)
                        for (int j = 0; j < v->scaleouts[s].n_chain; j++)
                            busy |= v->scaleouts[s].chain[j] == i;
                    if (!p->alive || p->engine_model >= 0 || (p->refused & 1) || busy ||
                        same != (pass == 0))
                        continue;
                    a->chain[a->n_chain++] = i;
                }
            if (a->n_chain > 0) {
                a->node = a->chain[0];
                n_out++;
            }
        }
    }
    if (add < 0 && n > 1) { /* one more drains: the fewest KV tokens in use */
        int pick = -1;
        for (int i = 0; i < v->n_nodes; i++) {
            const struct plan_node *p = &v->nodes[i];
            if (!p->alive || p->engine_model != 0 || p->standby || p->layers_resident < L ||
                t->draining[i] || p->sources_busy > 0)
                continue;
            if (pick < 0 || o->inst[i].kv_used < o->inst[pick].kv_used) pick = i;
        }
        if (pick >= 0) t->draining[pick] = 1;
    }
    for (int i = 0; i < v->n_nodes && n_out < cap; i++) /* drained: the GPUs go */
        if (t->draining[i] && o->inst[i].ongoing == 0 && v->nodes[i].sources_busy == 0) {
            out[n_out++] = (struct plan_action){.kind = PLAN_SCALE_DOWN,
                                                .model = 0,
                                                .source = -1,
                                                .node = i,
                                                .reason = PLAN_WHY_CAPACITY,
                                                .handover = -1};
            t->draining[i] = 0;
            break;
        }
    return n_out;
}

static int route(void *state, const struct sim_obs *o, int prompt_tokens, int *node, char *err)
{
    (void)prompt_tokens, (void)err;
    struct tokenscale *t = state;
    *node = sim_route_least_loaded(o, t->draining);
    return 0;
}

const struct sim_controller sim_ctl_tokenscale = {
    .name = "tokenscale", .init = init, .fini = fini, .tick = tick, .route = route};
