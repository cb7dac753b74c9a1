/* sim_strata: Strata's own planner (cluster/planner.h, the code the live control plane runs) as a
 * simulator controller. Every tick it tells the model's forecast (struct plan_forecast) the prompt
 * tokens that arrived, copies it into the planner's view of the model, and runs planner_step;
 * every request is placed by planner_route. The policy's flags become the planner's config
 * (proactive, handover, standby_max; the sim_config's fc_* and util_* knobs), so `strata-reactive`
 * is the same planner with its leading signal and scale-in mechanisms off. */
#include "cluster/planner.h"
#include "cluster/sim/sim.h"
#include "cluster/sim/sim_policy.h"

#include <stdlib.h>

struct strata {
    struct plan_config cfg;
    struct plan_forecast fc;
    struct plan_model pm; /* the view's model with the forecast filled in */
};

static void *init(const struct sim_obs *o)
{
    struct strata *st = calloc(1, sizeof *st);
    if (!st) abort();
    const struct sim_config *c = o->c;
    plan_config_default(&st->cfg);
    st->cfg.max_step_tokens = c->max_step_tokens;
    st->cfg.max_seqs = c->max_seqs;
    st->cfg.max_joiners = c->max_joiners;
    st->cfg.ignore_matrix = o->p->ignore_matrix;
    st->cfg.proactive = o->p->proactive;
    st->cfg.handover = o->p->handover;
    st->cfg.standby_max = o->p->standby ? c->standby_max : 0;
    st->cfg.util_high = c->util_high;
    st->cfg.util_low = c->util_low;
    st->cfg.fc_z = c->fc_z;
    st->cfg.fc_z_in = c->fc_z_in;
    st->cfg.onset_ratio = c->onset_ratio;
    st->cfg.fc_queue = c->fc_queue;
    planner_forecast_init(&st->fc, o->now_s * 1000, c->fc_period_ms, c->fc_alpha, c->fc_beta);
    st->fc.fast_ms = c->fc_fast_ms;
    return st;
}

/* The view with the forecast in its model (the planner reads models[0].fc_*). */
static struct plan_view with_forecast(struct strata *st, const struct sim_obs *o)
{
    struct plan_view v = *o->v;
    st->pm = o->v->models[0];
    if (st->cfg.proactive || st->cfg.handover || st->cfg.standby_max > 0)
        planner_forecast_fill(&st->fc, &st->pm);
    v.models = &st->pm;
    return v;
}

static int tick(void *state, const struct sim_obs *o, struct plan_action *out, int cap, char *err)
{
    struct strata *st = state;
    planner_forecast_observe(&st->fc, o->now_s * 1000, (double)o->arrived_tokens);
    struct plan_view v = with_forecast(st, o);
    return planner_step(&st->cfg, &v, out, cap, err);
}

static int route(void *state, const struct sim_obs *o, int prompt_tokens, int *node, char *err)
{
    struct strata *st = state;
    struct plan_view v = with_forecast(st, o);
    struct plan_route rt;
    if (planner_route(&st->cfg, &v, 0, prompt_tokens, &rt, err)) return -1;
    *node = rt.node;
    return 0;
}

const struct sim_controller sim_ctl_strata = {
    .name = "strata", .init = init, .tick = tick, .route = route};
