/* sim_fixed: a fixed deployment sized to the trace's peak; see the header. */
#include "cluster/sim/sim_fixed.h"

#include "cluster/sim/sim.h"
#include "cluster/sim/sim_blitzscale.h"
#include "cluster/sim/sim_policy.h"

#include <math.h>
#include <stdlib.h>

#define WINDOW_S 10.0

struct edge {
    double t, tokens; /* + at arrival, - when its KV is freed */
};

static int cmp_edge(const void *a, const void *b)
{
    const struct edge *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    return x->tokens < y->tokens ? -1 : x->tokens > y->tokens; /* frees first */
}

int fixed_size(const struct sim_request *req, int n, double prefill_tok_s, double kv_cap,
               double step_s)
{
    double peak_rate = 0, sum = 0;
    for (int i = 0, j = 0; i < n; i++) { /* requests in [req[i].t - WINDOW_S, req[i].t] */
        sum += req[i].in;
        while (req[j].t < req[i].t - WINDOW_S) sum -= req[j++].in;
        if (sum / WINDOW_S > peak_rate) peak_rate = sum / WINDOW_S;
    }
    struct edge *e = malloc(sizeof *e * (2 * (size_t)n + 1));
    if (!e) abort();
    for (int i = 0; i < n; i++) {
        double kv = req[i].in + req[i].out;
        e[2 * i] = (struct edge){req[i].t, kv};
        e[2 * i + 1] = (struct edge){req[i].t + req[i].out * step_s, -kv};
    }
    qsort(e, 2 * (size_t)n, sizeof *e, cmp_edge);
    double now = 0, peak_kv = 0;
    for (int i = 0; i < 2 * n; i++) {
        now += e[i].tokens;
        if (now > peak_kv) peak_kv = now;
    }
    free(e);
    int a = prefill_tok_s > 0 ? (int)ceil(peak_rate / (BLITZ_PREFILL_HIGH * prefill_tok_s)) : 1;
    int b = kv_cap > 0 ? (int)ceil(peak_kv / (BLITZ_DECODE_HIGH * kv_cap)) : 1;
    return a > b ? a : b;
}

static void *init(const struct sim_obs *o)
{
    int *n = malloc(sizeof *n);
    if (!n) abort();
    *n = fixed_size(o->c->req, o->c->n_req, sim_obs_mean_prefill_tok_s(o), sim_obs_mean_kv_cap(o),
                    o->tbt_slo_ms / 1000);
    int floor = o->c->initial_replicas > 0 ? o->c->initial_replicas : 1;
    if (*n < floor) *n = floor;
    if (*n > o->v->n_nodes) *n = o->v->n_nodes;
    return n;
}

static int initial(void *state, const struct sim_obs *o)
{
    (void)o;
    return *(int *)state;
}

static int tick(void *state, const struct sim_obs *o, struct plan_action *out, int cap, char *err)
{
    (void)state, (void)o, (void)out, (void)cap, (void)err;
    return 0;
}

static int route(void *state, const struct sim_obs *o, int prompt_tokens, int *node, char *err)
{
    (void)state, (void)prompt_tokens, (void)err;
    *node = sim_route_least_loaded(o, NULL);
    return 0;
}

const struct sim_controller sim_ctl_fixed = {
    .name = "fixed", .init = init, .initial = initial, .tick = tick, .route = route};
