/* sim_blitzscale: BlitzScale's controller; the rules and their sources are in the header. */
#include "cluster/sim/sim_blitzscale.h"

#include "cluster/sim/sim.h"
#include "cluster/sim/sim_policy.h"
#include "os/common/errmsg.h"

#include <math.h>
#include <stdlib.h>

void blitz_target(const struct blitz_in *in, struct blitz_out *out)
{
    double C = in->kv_cap_tokens > 0 ? in->kv_cap_tokens : 1;
    double V = in->prefill_tok_s > 0 ? in->prefill_tok_s : 1;
    int mem_min = (int)ceil(in->kv_used_tokens / BLITZ_DECODE_HIGH / C);
    int mem_max = (int)ceil(in->kv_used_tokens / BLITZ_DECODE_LOW / C);
    int pre_min = (int)ceil(in->waiting_tokens / BLITZ_PREFILL_HIGH / V);
    int pre_max = (int)ceil(in->waiting_tokens / BLITZ_PREFILL_LOW / V);
    out->min = mem_min > pre_min ? mem_min : pre_min;
    out->max = mem_max > pre_max ? mem_max : pre_max;
    if (out->max < out->min) out->max = out->min;
    if (out->min > in->n)
        out->delta = (out->min + out->max + 1) / 2 - in->n;
    else if (out->max < in->n)
        out->delta = -1; /* shut down one: the planner looks again next turn */
    else
        out->delta = 0;
    if (in->n + out->delta < in->floor) out->delta = in->floor - in->n;
    if (out->delta < -1) out->delta = -1;
}

struct blitz {
    int n;
    double *shut_since;  /* [n]: >= 0 shutting down since then; < 0 not */
    unsigned char *shut; /* [n]: 1 while shutting down (the router skips it) */
};

static void *init(const struct sim_obs *o)
{
    struct blitz *b = calloc(1, sizeof *b);
    if (!b) abort();
    b->n = o->v->n_nodes;
    b->shut_since = malloc(sizeof *b->shut_since * b->n);
    b->shut = calloc(b->n, 1);
    if (!b->shut_since || !b->shut) abort();
    for (int i = 0; i < b->n; i++) b->shut_since[i] = -1;
    return b;
}

static void fini(void *state)
{
    struct blitz *b = state;
    if (!b) return;
    free(b->shut_since);
    free(b->shut);
    free(b);
}

static int engine(const struct plan_node *n)
{
    return n->alive && n->engine_model == 0 && !n->standby;
}

static int in_chain(const struct plan_view *v, int id)
{
    for (int s = 0; s < v->n_scaleouts; s++)
        for (int j = 0; j < v->scaleouts[s].n_chain; j++)
            if (v->scaleouts[s].chain[j] == id) return 1;
    return 0;
}

static int drained(const struct sim_obs *o, int i)
{
    return o->inst[i].ongoing == 0 && o->v->nodes[i].load.idle_since_ms >= 0;
}

/* (4)/(3): one chain from a serving instance not shutting down (idle link first, then the fewest
 * KV blocks in use, then id): the inactive instances of its server first (NVLink), then the
 * others by id (RDMA, serial forwarding). Cold (nothing serving): from the host copy. */
static int new_instances(struct blitz *b, const struct sim_obs *o, int want, struct plan_action *a)
{
    const struct plan_view *v = o->v;
    int L = v->models[0].layers, src = -1;
    for (int i = 0; i < v->n_nodes; i++) {
        const struct plan_node *n = &v->nodes[i];
        if (!engine(n) || n->layers_resident < L || b->shut[i]) continue;
        if (src < 0 || n->sources_busy < v->nodes[src].sources_busy ||
            (n->sources_busy == v->nodes[src].sources_busy &&
             o->inst[i].kv_used < o->inst[src].kv_used))
            src = i;
    }
    if (src < 0)
        for (int i = 0; i < v->n_nodes && src < 0; i++)
            if (v->nodes[i].alive && (v->nodes[i].host_cached & 1)) src = i;
    if (src < 0) return 0;
    *a = (struct plan_action){
        .kind = PLAN_SCALE_UP, .model = 0, .source = src, .reason = PLAN_WHY_SLACK, .handover = -1};
    int cap = want < o->c->max_joiners ? want : o->c->max_joiners;
    for (int pass = 0; pass < 2; pass++) /* the source's server first */
        for (int i = 0; i < v->n_nodes && a->n_chain < cap; i++) {
            const struct plan_node *n = &v->nodes[i];
            int same = o->inst[i].server == o->inst[src].server;
            if (!n->alive || n->engine_model >= 0 || n->standby || (n->refused & 1) ||
                in_chain(v, i) || same != (pass == 0))
                continue;
            a->chain[a->n_chain++] = i;
        }
    if (a->n_chain == 0) return 0;
    a->node = a->chain[0];
    return 1;
}

static int tick(void *state, const struct sim_obs *o, struct plan_action *out, int cap, char *err)
{
    (void)err;
    struct blitz *b = state;
    const struct plan_view *v = o->v;
    int n_out = 0, L = v->models[0].layers;
    struct blitz_in in = {.prefill_tok_s = sim_obs_mean_prefill_tok_s(o),
                          .kv_cap_tokens = sim_obs_mean_kv_cap(o),
                          .waiting_tokens = (double)o->held_tokens,
                          .floor = o->c->initial_replicas > 0 ? o->c->initial_replicas : 1};
    for (int i = 0; i < v->n_nodes; i++) {
        if (!engine(&v->nodes[i])) {
            b->shut[i] = 0;
            b->shut_since[i] = -1;
            continue;
        }
        if (b->shut[i]) continue;
        in.n++;
        in.waiting_tokens += (double)v->nodes[i].load.queued_tokens;
        in.kv_used_tokens += (double)o->inst[i].kv_used;
    }
    struct blitz_out t;
    blitz_target(&in, &t);
    int delta = t.delta;
    /* Scale up: revive shutting instances (undrained first), then new ones. */
    for (int pass = 0; pass < 2 && delta > 0; pass++)
        for (int i = 0; i < v->n_nodes && delta > 0; i++)
            if (b->shut[i] && drained(o, i) == pass) {
                b->shut[i] = 0;
                b->shut_since[i] = -1;
                delta--;
            }
    if (delta > 0 && n_out < cap && new_instances(b, o, delta, &out[n_out])) n_out++;
    /* Scale down: drained instances go at once, else one more starts shutting down. */
    int released = 0;
    for (int i = 0; i < v->n_nodes && delta < 0 && n_out < cap; i++)
        if (b->shut[i] && drained(o, i)) {
            out[n_out++] = (struct plan_action){.kind = PLAN_SCALE_DOWN,
                                                .model = 0,
                                                .source = -1,
                                                .node = i,
                                                .reason = PLAN_WHY_CAPACITY,
                                                .handover = -1};
            b->shut[i] = 0;
            b->shut_since[i] = -1;
            delta++;
            released = 1;
        }
    if (delta < 0 && !released) {
        int pick = -1, normal = 0;
        for (int i = 0; i < v->n_nodes; i++) {
            const struct plan_node *n = &v->nodes[i];
            if (!engine(n) || b->shut[i] || n->layers_resident < L) continue;
            normal++;
            if (n->sources_busy > 0) continue; /* its link is streaming the model */
            if (pick < 0 || o->inst[i].kv_used < o->inst[pick].kv_used) pick = i;
        }
        if (normal > 1 && pick >= 0) {
            b->shut[pick] = 1;
            b->shut_since[pick] = o->now_s;
        }
    }
    /* Shut down for long enough and drained: the GPUs go (the longest shut first, one a tick). */
    int expire = -1;
    for (int i = 0; i < v->n_nodes; i++)
        if (b->shut[i] && drained(o, i) && o->now_s - b->shut_since[i] > BLITZ_SHUT_S &&
            v->nodes[i].sources_busy == 0 &&
            (expire < 0 || b->shut_since[i] < b->shut_since[expire]))
            expire = i;
    if (expire >= 0 && n_out < cap) {
        out[n_out++] = (struct plan_action){.kind = PLAN_SCALE_DOWN,
                                            .model = 0,
                                            .source = -1,
                                            .node = expire,
                                            .reason = PLAN_WHY_CAPACITY,
                                            .handover = -1};
        b->shut[expire] = 0;
        b->shut_since[expire] = -1;
    }
    return n_out;
}

static int route(void *state, const struct sim_obs *o, int prompt_tokens, int *node, char *err)
{
    (void)prompt_tokens, (void)err;
    struct blitz *b = state;
    *node = sim_route_least_loaded(o, b->shut);
    return 0;
}

const struct sim_controller sim_ctl_blitzscale = {
    .name = "blitzscale", .init = init, .fini = fini, .tick = tick, .route = route};
