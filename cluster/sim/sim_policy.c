/* sim_policy: what the controllers share (see sim_policy.h). */
#include "cluster/sim/sim_policy.h"

#include "cluster/sim/sim.h"

#include <stdlib.h>

void sim_controller_fini(const struct sim_controller *ctl, void *state)
{
    if (ctl->fini)
        ctl->fini(state);
    else
        free(state);
}

static int engine_replica(const struct plan_node *n)
{
    return n->alive && n->engine_model == 0 && !n->standby;
}

int sim_obs_replicas(const struct sim_obs *o, int *serving, int *joining)
{
    int sv = 0, jn = 0, L = o->v->models[0].layers;
    for (int i = 0; i < o->v->n_nodes; i++) {
        const struct plan_node *n = &o->v->nodes[i];
        if (!engine_replica(n)) continue;
        if (n->layers_resident >= L)
            sv++;
        else
            jn++;
    }
    if (serving) *serving = sv;
    if (joining) *joining = jn;
    return sv + jn;
}

int sim_obs_usable(const struct sim_obs *o, int i)
{
    const struct plan_node *n = &o->v->nodes[i];
    int L = o->v->models[0].layers;
    if (!engine_replica(n)) return 0;
    if (n->layers_resident >= L) return 1;
    if (!o->p->live || n->layers_resident < o->c->live_min_layers || n->helper < 0) return 0;
    const struct plan_node *h = &o->v->nodes[n->helper];
    return engine_replica(h) && h->layers_resident >= L;
}

int sim_route_least_loaded(const struct sim_obs *o, const unsigned char *skip)
{
    int best = -1;
    for (int i = 0; i < o->v->n_nodes; i++) {
        if ((skip && skip[i]) || !sim_obs_usable(o, i)) continue;
        const struct plan_load *a = &o->v->nodes[i].load;
        if (best < 0) {
            best = i;
            continue;
        }
        const struct plan_load *b = &o->v->nodes[best].load;
        if (a->queued_tokens < b->queued_tokens ||
            (a->queued_tokens == b->queued_tokens && a->running_seqs < b->running_seqs))
            best = i;
    }
    return best;
}

double sim_obs_mean_prefill_tok_s(const struct sim_obs *o)
{
    double sum = 0;
    for (int i = 0; i < o->v->n_nodes; i++) sum += o->inst[i].prefill_tok_s;
    return o->v->n_nodes ? sum / o->v->n_nodes : 0;
}

double sim_obs_mean_kv_cap(const struct sim_obs *o)
{
    double sum = 0;
    for (int i = 0; i < o->v->n_nodes; i++) sum += (double)o->inst[i].kv_cap;
    return o->v->n_nodes ? sum / o->v->n_nodes : 0;
}
