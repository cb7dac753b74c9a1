#include "cluster/planner.h"

#include "os/common/errmsg.h"

#include <math.h>
#include <string.h>

#define INF_MS 1e300
/* KV use that asks for another replica, and below which one fewer will do (BlitzScale's Eq.1
 * bounds; the simulator and the scheduler reserve a request's whole KV at admission, so a
 * fraction here is an upper bound of the blocks in use). */
#define PLAN_KV_HIGH 0.95
#define PLAN_KV_LOW  0.75
/* Sequences (running and waiting) per replica over its batch slots (cfg->max_seqs): past the
 * high bound requests wait for a slot, not for prefill, which neither the prefill capacity nor the
 * TTFT prediction sees; scale-in keeps them under the low one. */
#define PLAN_SLOTS_HIGH 1.25
#define PLAN_SLOTS_LOW  0.75

void plan_config_default(struct plan_config *cfg)
{
    cfg->max_step_tokens = 512;
    cfg->max_seqs = 0;
    cfg->max_joiners = 16;
    cfg->ignore_matrix = 0;
    cfg->proactive = 1;
    cfg->handover = 0;
    cfg->standby_max = 0;
    cfg->util_high = 1.3;
    cfg->util_low = 0.9;
    cfg->fc_z = 0;
    cfg->fc_z_in = 0;
    cfg->onset_ratio = 1.5;
    cfg->fc_queue = 0;
}

double planner_loss_probability(const double *fail_prob, int n)
{
    double p = 1;
    for (int i = 0; i < n; i++) p *= fail_prob[i];
    return n > 0 ? p : 1;
}

double planner_loss_probability_racks(const double *fail_prob, const int *rack, int n,
                                      double rack_fail)
{
    if (n <= 0) return 1;
    double p = 1;
    for (int i = 0; i < n; i++) {
        int first = 1; /* each rack once: at its first holder */
        for (int j = 0; j < i && first; j++) first = rack[j] != rack[i];
        if (!first) continue;
        double all = 1;
        for (int j = i; j < n; j++)
            if (rack[j] == rack[i]) all *= fail_prob[j];
        p *= rack_fail + (1 - rack_fail) * all;
    }
    return p;
}

double planner_drain_ms(const struct step_model *sm, long tokens, int running, int max_step_tokens)
{
    if (tokens <= 0) return 0;
    if (max_step_tokens < 1) max_step_tokens = 1;
    /* Each step prefills up to max_step_tokens of the queue and decodes every running sequence
     * once (the scheduler's mixed steps); the queue's own sequence counts as one more. */
    long full = tokens / max_step_tokens, rem = tokens % max_step_tokens;
    double t = (double)full * step_model_predict(sm, max_step_tokens + running, running + 1);
    if (rem) t += step_model_predict(sm, (int)rem + running, running + 1);
    return t * 1000;
}

static const struct plan_node *node_by_id(const struct plan_view *v, int id)
{
    for (int i = 0; i < v->n_nodes; i++)
        if (v->nodes[i].id == id) return &v->nodes[i];
    return NULL;
}

static const struct step_model *step_of(const struct plan_view *v, const struct plan_node *n, int m)
{
    if (n->step_own.a > 0 || n->step_own.c > 0) return &n->step_own; /* measured on the node */
    return &v->step[n->gpu_type * v->n_models + m];
}

static double tput_of(const struct plan_view *v, const struct plan_node *n, int m)
{
    return v->tput ? v->tput[n->gpu_type * v->n_models + m] : 1;
}

static int serves_alone(const struct plan_view *v, const struct plan_node *n, int m)
{
    return n->alive && n->engine_model == m && n->layers_resident >= v->models[m].layers;
}

static int host_holds(const struct plan_node *n, int m)
{
    return n->alive && (n->host_cached >> m & 1);
}

double planner_predict_ttft_ms(const struct plan_config *cfg, const struct plan_view *v,
                               const struct plan_node *n, int m, int prompt_tokens)
{
    int L = v->models[m].layers, k = n->layers_resident;
    double own = planner_drain_ms(step_of(v, n, m), n->load.queued_tokens + prompt_tokens,
                                  n->load.running_seqs, cfg->max_step_tokens);
    if (k >= L) return own;
    const struct plan_node *h = n->helper >= 0 ? node_by_id(v, n->helper) : NULL;
    if (!h || !serves_alone(v, h, m)) return INF_MS; /* cannot run the missing layers */
    /* Layers [0,k) here, [k,L) on the helper, which also serves its own queue. */
    double helper =
        planner_drain_ms(step_of(v, h, m), h->load.queued_tokens + prompt_tokens,
                         h->load.running_seqs + n->load.running_seqs, cfg->max_step_tokens);
    return own * k / L + helper * (L - k) / L;
}

static int check_view(const struct plan_view *v, char *err)
{
    if (v->n_models < 0 || v->n_models > PLAN_MAX_MODELS)
        return errmsg_set(err, "planner: %d models (at most %d)", v->n_models, PLAN_MAX_MODELS);
    if (v->n_nodes < 0 || v->n_nodes > PLAN_MAX_NODES)
        return errmsg_set(err, "planner: %d nodes (at most %d)", v->n_nodes, PLAN_MAX_NODES);
    if (v->n_models > 0 && !v->step) return errmsg_set(err, "planner: no step models");
    for (int m = 0; m < v->n_models; m++)
        if (v->models[m].layers < 1 || v->models[m].ttft_slo_ms <= 0)
            return errmsg_set(err, "planner: model %d: %d layers, TTFT SLO %g ms", m,
                              v->models[m].layers, v->models[m].ttft_slo_ms);
    for (int i = 0; i < v->n_nodes; i++) {
        const struct plan_node *n = &v->nodes[i];
        if (n->gpu_type < 0 || n->gpu_type >= v->n_gpu_types)
            return errmsg_set(err, "planner: node %d: GPU type %d not in the matrix (%d types)",
                              n->id, n->gpu_type, v->n_gpu_types);
        if (n->engine_model < -1 || n->engine_model >= v->n_models)
            return errmsg_set(err, "planner: node %d: engine model %d of %d", n->id,
                              n->engine_model, v->n_models);
        if (n->engine_model >= 0 &&
            (n->layers_resident < 0 || n->layers_resident > v->models[n->engine_model].layers))
            return errmsg_set(err, "planner: node %d: %d layers resident of %d", n->id,
                              n->layers_resident, v->models[n->engine_model].layers);
        if (n->engine_model >= 0 && n->layers_resident < v->models[n->engine_model].layers &&
            n->helper >= 0 && !node_by_id(v, n->helper))
            return errmsg_set(err, "planner: node %d: helper %d is not a node", n->id, n->helper);
        for (int j = 0; j < i; j++)
            if (v->nodes[j].id == n->id)
                return errmsg_set(err, "planner: node id %d appears twice", n->id);
    }
    for (int s = 0; s < v->n_scaleouts; s++)
        if (v->scaleouts[s].model < 0 || v->scaleouts[s].model >= v->n_models ||
            v->scaleouts[s].n_chain < 0 || v->scaleouts[s].n_chain > PLAN_MAX_CHAIN)
            return errmsg_set(err, "planner: scale-out %d: model %d, chain of %d", s,
                              v->scaleouts[s].model, v->scaleouts[s].n_chain);
    return 0;
}

int planner_route(const struct plan_config *cfg, const struct plan_view *v, int m,
                  int prompt_tokens, struct plan_route *route, char *err)
{
    if (check_view(v, err)) return -1;
    if (m < 0 || m >= v->n_models) return errmsg_set(err, "planner: route: no model %d", m);
    route->node = route->helper = -1;
    route->k = 0;
    route->predicted_ttft_ms = INF_MS;
    int best_id = 0;
    for (int i = 0; i < v->n_nodes; i++) {
        const struct plan_node *n = &v->nodes[i];
        if (!n->alive || n->engine_model != m || n->standby) continue;
        double t = planner_predict_ttft_ms(cfg, v, n, m, prompt_tokens);
        if (t >= INF_MS) continue;
        if (route->node < 0 || t < route->predicted_ttft_ms ||
            (t == route->predicted_ttft_ms && n->id < best_id)) {
            route->node = best_id = n->id;
            route->k = n->layers_resident;
            route->helper = n->layers_resident < v->models[m].layers ? n->helper : -1;
            route->predicted_ttft_ms = t;
        }
    }
    return 0;
}

/* Per-tick scratch: which nodes (by index) this tick already gave a role. On the stack, bounded
 * by PLAN_MAX_NODES, so the planner allocates nothing. */
struct tick {
    unsigned char taken[PLAN_MAX_NODES];     /* joiner or replication target this tick */
    unsigned char sources[PLAN_MAX_NODES];   /* times chosen as a source this tick */
    unsigned char switching[PLAN_MAX_NODES]; /* 1 + the model a joiner switches to, 0: none */
    float kv_in[PLAN_MAX_NODES];             /* KV share a hand-over brings it this tick */
    long tok_in[PLAN_MAX_NODES];             /* queued prompt tokens a hand-over brings it */
    int seq_in[PLAN_MAX_NODES];              /* running sequences a hand-over brings it */
    unsigned char receiving[PLAN_MAX_NODES]; /* a hand-over's receiver this tick: it stays */
};

static int chain_has(const struct plan_scaleout *so, int id)
{
    for (int j = 0; j < so->n_chain; j++)
        if (so->chain[j] == id) return 1;
    return 0;
}

static int in_progress_chain(const struct plan_view *v, int id, int kind, int m)
{
    for (int s = 0; s < v->n_scaleouts; s++) {
        const struct plan_scaleout *so = &v->scaleouts[s];
        if ((kind >= 0 && so->kind != kind) || (m >= 0 && so->model != m)) continue;
        if (chain_has(so, id)) return 1;
    }
    return 0;
}

/* The models node n holds or is receiving: host copies, its engine's, and those of scale-outs in
 * progress that name it. */
static uint64_t node_models(const struct plan_view *v, const struct plan_node *n)
{
    uint64_t b = n->host_cached;
    if (n->engine_model >= 0) b |= 1ull << n->engine_model;
    for (int s = 0; s < v->n_scaleouts; s++)
        if (chain_has(&v->scaleouts[s], n->id)) b |= 1ull << v->scaleouts[s].model;
    return b;
}

/* Room for m on n without dropping anything. */
static int has_slot(const struct plan_view *v, const struct plan_node *n, int m)
{
    if (n->model_slots <= 0) return 1;
    return __builtin_popcountll(node_models(v, n) & ~(1ull << m)) < n->model_slots;
}

/* Is node index i switching away from what it holds (this tick, or joining another model than m
 * in a scale-out in progress)? Its host copies are on their way out: no source, no survivor. */
static int switching_away(const struct plan_view *v, const struct tick *t, int i, int m)
{
    const struct plan_node *n = &v->nodes[i];
    if (t->switching[i]) return t->switching[i] - 1 != m;
    if (n->model_slots <= 0) return 0;
    for (int s = 0; s < v->n_scaleouts; s++)
        if (v->scaleouts[s].model != m && chain_has(&v->scaleouts[s], n->id)) return 1;
    return 0;
}

/* Can node index i take m by dropping its host copies first (a switch)? Only with nothing in its
 * engine, and each model it holds cached on another live node that is not switching away too. */
static int can_switch(const struct plan_view *v, const struct tick *t, int i, int m)
{
    const struct plan_node *n = &v->nodes[i];
    uint64_t drop = node_models(v, n) & ~(1ull << m);
    if (n->engine_model >= 0) return 0;
    for (int x = 0; x < v->n_models; x++) {
        if (!(drop >> x & 1)) continue;
        int others = 0;
        for (int j = 0; j < v->n_nodes && !others; j++)
            others = j != i && host_holds(&v->nodes[j], x) && !switching_away(v, t, j, x);
        if (!others) return 0; /* its last host copy */
    }
    return 1;
}

/* A live node holding all of m (host memory, or engine with k = L) to stream it from: idle links
 * first (a source already streaming splits its link), then the fastest link, then the lowest id. */
static int pick_source(const struct plan_view *v, const struct tick *t, int m)
{
    int best = -1;
    for (int i = 0; i < v->n_nodes; i++) {
        const struct plan_node *n = &v->nodes[i];
        if (!host_holds(n, m) && !serves_alone(v, n, m)) continue;
        if (switching_away(v, t, i, m)) continue;
        if (best < 0) {
            best = i;
            continue;
        }
        const struct plan_node *b = &v->nodes[best];
        int bn = n->sources_busy + t->sources[i], bb = b->sources_busy + t->sources[best];
        if (bn != bb) {
            if (bn < bb) best = i;
        } else if (n->link_Bps != b->link_Bps) {
            if (n->link_Bps > b->link_Bps) best = i;
        } else if (n->id < b->id) {
            best = i;
        }
    }
    return best;
}

/* Rate of one chain hop from a to b. */
static double hop_Bps(const struct plan_node *a, const struct plan_node *b)
{
    if (a->domain == b->domain && a->nvlink_Bps > 0 && b->nvlink_Bps > 0)
        return a->nvlink_Bps < b->nvlink_Bps ? a->nvlink_Bps : b->nvlink_Bps;
    return a->link_Bps < b->link_Bps ? a->link_Bps : b->link_Bps;
}

/* Chain order, greedy as BlitzScale builds its serial-forwarding chains: from the current tail,
 * the next node is the one reached by the fastest hop (NVLink within the tail's server first,
 * then the fastest NIC), ties to the faster GPU for the model, then the lower id. Why: chunks
 * are pipelined, so a node receives at the rate of the slowest hop before it; taking fast hops
 * first keeps every prefix's bottleneck as high as possible (with one rate per node this greedy
 * is exactly "sort by link rate, fastest first", which is optimal for the prefix minimum), slow
 * NICs sit at the tail where they delay only themselves, and the GPUs that help most finish first.
 * idx[0..n) holds node indices; it is reordered in place. */
static void order_chain(const struct plan_view *v, int m, int source, int *idx, int n)
{
    const struct plan_node *tail = &v->nodes[source];
    for (int pos = 0; pos < n; pos++) {
        int best = pos;
        for (int j = pos + 1; j < n; j++) {
            const struct plan_node *a = &v->nodes[idx[j]], *b = &v->nodes[idx[best]];
            double ra = hop_Bps(tail, a), rb = hop_Bps(tail, b);
            double ta = tput_of(v, a, m), tb = tput_of(v, b, m);
            if (ra > rb || (ra == rb && (ta > tb || (ta == tb && a->id < b->id)))) best = j;
        }
        int x = idx[pos];
        idx[pos] = idx[best];
        idx[best] = x;
        tail = &v->nodes[idx[pos]];
    }
}

/* Is candidate a better joiner for m than b? (placement) */
static int better_joiner(const struct plan_config *cfg, const struct plan_view *v, int m,
                         const struct plan_node *a, const struct plan_node *b)
{
    if (!cfg->ignore_matrix) {
        /* Throughput per waiting request: every candidate would absorb the same share of m's
         * queue, so the ranking is by m's effective throughput on the candidate's GPU type. */
        double ta = tput_of(v, a, m), tb = tput_of(v, b, m);
        if (ta != tb) return ta > tb;
    }
    int ha = (int)(a->host_cached >> m & 1), hb = (int)(b->host_cached >> m & 1);
    if (ha != hb) return ha > hb;
    int sa = has_slot(v, a, m), sb = has_slot(v, b, m); /* a free slot before a switch */
    if (sa != sb) return sa > sb;
    return a->id < b->id;
}

double planner_prefill_tok_s(const struct plan_config *cfg, const struct plan_view *v,
                             const struct plan_node *n, int m)
{
    const struct step_model *sm = step_of(v, n, m);
    int running = n->load.running_seqs, chunk = cfg->max_step_tokens;
    double tpot = v->models[m].tpot_slo_ms;
    if (running > 0 && tpot > 0) { /* the scheduler's TPOT guard bounds a step's prompt chunk */
        int lim = step_model_max_tokens(sm, running + 1, 0.9 * tpot / 1000) - running;
        if (lim < chunk) chunk = lim;
    }
    if (chunk < 1) chunk = 1;
    double t = step_model_predict(sm, chunk + running, running + 1);
    return t > 0 ? chunk / t : 0;
}

/* ---- the leading signal ---- */

void planner_forecast_init(struct plan_forecast *f, double now_ms, double period_ms, double alpha,
                           double beta)
{
    memset(f, 0, sizeof *f);
    f->alpha = alpha;
    f->beta = beta;
    f->period_ms = period_ms > 0 ? period_ms : 1000;
    f->start_ms = now_ms;
    f->fast_ms = 300;
    f->last_ms = now_ms;
}

/* Closes one period with rate x (tokens/s): Holt's update, the error measured against the
 * forecast one period ahead made at the previous close. */
static void forecast_close(struct plan_forecast *f, double x)
{
    double dt = f->period_ms / 1000;
    if (f->periods == 0) {
        f->level = x;
    } else if (f->periods == 1) {
        f->err = fabs(x - f->level);
        f->trend = (x - f->level) / dt;
        f->level = x;
    } else {
        double pred = f->level + f->trend * dt, prev = f->level;
        f->err = f->alpha * fabs(x - pred) + (1 - f->alpha) * f->err;
        f->level = f->alpha * x + (1 - f->alpha) * pred;
        f->trend = f->beta * (f->level - prev) / dt + (1 - f->beta) * f->trend;
    }
    f->periods++;
}

void planner_forecast_observe(struct plan_forecast *f, double now_ms, double tokens)
{
    /* Arrivals belong to the open period; the periods that ended before now close, empty ones
     * with rate 0 (a gap in the traffic is a measurement too). */
    while (now_ms >= f->start_ms + f->period_ms) {
        forecast_close(f, f->tokens / (f->period_ms / 1000));
        f->tokens = 0;
        f->start_ms += f->period_ms;
    }
    f->tokens += tokens;
    /* The fast rate: each token adds 1/fast_ms and decays with time constant fast_ms (the
     * signal of a shot-noise rate meter). Read right after an observation it leads a steady rate
     * r observed every dt by (dt / fast_ms) / (1 - exp(-dt / fast_ms)): 1.18 r at 100 ms ticks. */
    if (now_ms > f->last_ms) {
        f->fast *= exp(-(now_ms - f->last_ms) / f->fast_ms);
        f->last_ms = now_ms;
    }
    f->fast += tokens / (f->fast_ms / 1000);
}

void planner_forecast_fill(const struct plan_forecast *f, struct plan_model *pm)
{
    pm->fc_valid = f->periods >= 2;
    pm->fc_level = f->level;
    pm->fc_trend = f->trend;
    pm->fc_err = f->err;
    pm->fc_fast = f->fast;
}

double planner_forecast_at(const struct plan_model *pm, double ahead_ms)
{
    double x = pm->fc_level + pm->fc_trend * ahead_ms / 1000;
    return x > 0 ? x : 0;
}

/* ---- scale up ---- */

struct demand {
    int m;
    int trigger;         /* scale up this tick */
    int add;             /* replicas wanted */
    int reason;          /* enum plan_reason of the scale-up */
    double slack;        /* SLO - best prediction (ms); the most negative goes first */
    double load_ms;      /* one replica's load time from the fastest holder's link */
    double rep_tok_s;    /* one replica's prefill capacity (tokens/s, the mean over replicas) */
    double demand_tok_s; /* the forecast's demand with fc_z errors and the queue's drain */
    double hold_tok_s;   /* the same with fc_z_in errors: what scale-in keeps capacity for */
    double kv_sum;       /* the replicas' KV use, summed fractions */
    int seqs;            /* the replicas' running and waiting requests */
    int n_serving;
    int mean_prompt; /* the queue's mean prompt tokens (1 when empty): what TTFT is asked of */
    double why_value, why_limit; /* plan_action's, for the scale-up */
};

/* The time to stream m to a new replica from its fastest live holder (the proactive horizon). */
static double load_ms_of(const struct plan_view *v, int m)
{
    double best = 0;
    for (int i = 0; i < v->n_nodes; i++) {
        const struct plan_node *n = &v->nodes[i];
        if ((host_holds(n, m) || serves_alone(v, n, m)) && n->link_Bps > best) best = n->link_Bps;
    }
    return best > 0 ? v->models[m].bytes / best * 1000 : 0;
}

/* The forecast's demand on m: tokens/s at the horizon (never below now: a falling trend does not
 * shrink what is arriving), or the fast rate where it passes onset_ratio x that (an onset), plus
 * fc_z errors, plus fc_queue x the queued prompts drained within the SLO. */
static double forecast_demand(const struct plan_config *cfg, double z, const struct plan_view *v,
                              int m, double horizon_ms, long queued_tokens)
{
    const struct plan_model *pm = &v->models[m];
    double ahead = planner_forecast_at(pm, horizon_ms);
    if (ahead < pm->fc_level) ahead = pm->fc_level;
    if (cfg->onset_ratio > 0 && pm->fc_fast > cfg->onset_ratio * ahead) ahead = pm->fc_fast;
    return ahead + z * pm->fc_err + cfg->fc_queue * queued_tokens / (pm->ttft_slo_ms / 1000);
}

static void model_demand(const struct plan_config *cfg, const struct plan_view *v, int m,
                         struct demand *d)
{
    const struct plan_model *pm = &v->models[m];
    memset(d, 0, sizeof *d);
    d->m = m;
    d->slack = INF_MS;
    d->mean_prompt = 1;
    int n_rep = 0, n_joining = 0, queued = pm->held;
    long tokens = pm->held_tokens;
    for (int i = 0; i < v->n_nodes; i++) {
        const struct plan_node *n = &v->nodes[i];
        if (!n->alive || n->engine_model != m || n->standby) continue;
        n_rep++;
        if (n->layers_resident < pm->layers) n_joining++;
        queued += n->load.queue_len;
        tokens += n->load.queued_tokens;
        d->seqs += n->load.running_seqs + n->load.queue_len;
        d->kv_sum += n->load.kv_used;
        d->rep_tok_s += planner_prefill_tok_s(cfg, v, n, m);
    }
    d->n_serving = n_rep - n_joining;
    d->load_ms = load_ms_of(v, m);
    if (n_rep > 0) d->rep_tok_s /= n_rep;
    if (pm->fc_valid) {
        d->demand_tok_s = forecast_demand(cfg, cfg->fc_z, v, m, d->load_ms, tokens);
        d->hold_tok_s = forecast_demand(cfg, cfg->fc_z_in, v, m, d->load_ms, tokens);
    }
    /* Proactive: the replicas the forecast asks for, beyond those serving and joining. */
    int add_fc = 0, fc_reason = PLAN_WHY_FORECAST;
    double fc_value = d->demand_tok_s, fc_limit = n_rep * d->rep_tok_s * cfg->util_high;
    if (cfg->proactive && pm->fc_valid && n_rep > 0 && d->rep_tok_s > 0) {
        int need = (int)ceil(d->demand_tok_s / (d->rep_tok_s * cfg->util_high));
        int need_kv = (int)ceil(d->kv_sum / PLAN_KV_HIGH); /* admissions stall on a full KV */
        if (need_kv > need) {
            need = need_kv;
            fc_reason = PLAN_WHY_KV, fc_value = d->kv_sum, fc_limit = n_rep * PLAN_KV_HIGH;
        }
        if (cfg->max_seqs > 0) { /* ... and on full batch slots */
            int need_slots = (int)ceil(d->seqs / (cfg->max_seqs * PLAN_SLOTS_HIGH));
            if (need_slots > need) {
                need = need_slots;
                fc_reason = PLAN_WHY_SLOTS, fc_value = d->seqs;
                fc_limit = n_rep * cfg->max_seqs * PLAN_SLOTS_HIGH;
            }
        }
        add_fc = need - n_rep;
    }
    if (queued == 0 && add_fc <= 0) return;
    double best = INF_MS, work = 0;
    const struct step_model *best_sm = NULL;
    int mean = queued ? (int)(tokens / queued) : 1;
    if (mean < 1) mean = 1;
    d->mean_prompt = mean;
    for (int i = 0; i < v->n_nodes; i++) {
        const struct plan_node *n = &v->nodes[i];
        if (!n->alive || n->engine_model != m || n->standby) continue;
        double t = planner_predict_ttft_ms(cfg, v, n, m, mean);
        if (t < best) best = t;
        const struct step_model *sm = step_of(v, n, m);
        if (n->layers_resident >= pm->layers) {
            work += planner_drain_ms(sm, n->load.queued_tokens, n->load.running_seqs,
                                     cfg->max_step_tokens);
            if (!best_sm) best_sm = sm;
        }
    }
    if (!best_sm) { /* no one serves m alone yet: the fastest type's model estimates the work */
        int bt = 0;
        for (int g = 1; g < v->n_gpu_types; g++)
            if (v->tput && v->tput[g * v->n_models + m] > v->tput[bt * v->n_models + m]) bt = g;
        best_sm = &v->step[bt * v->n_models + m];
    }
    work += planner_drain_ms(best_sm, pm->held_tokens, 0, cfg->max_step_tokens);
    if (n_rep == 0) { /* cold: requests wait for a replica that does not exist */
        d->trigger = queued > 0;
        d->slack = -INF_MS / 2;
        d->reason = PLAN_WHY_COLD;
        d->why_value = queued;
    } else if (queued > 0) {
        d->slack = pm->ttft_slo_ms - best;
        d->trigger = d->slack < 0; /* the scheduler's slack test; 0 is on time */
        d->reason = PLAN_WHY_SLACK;
        d->why_value = best;
        d->why_limit = pm->ttft_slo_ms;
    }
    if (d->trigger) {
        int needed = (int)ceil(work / pm->ttft_slo_ms);
        d->add = needed - n_rep;
        if (d->add < 1 && n_joining == 0) d->add = 1; /* late now and nobody on the way */
    }
    if (add_fc > d->add) { /* the forecast asks for more than the queue does */
        d->add = add_fc;
        if (!d->trigger) {
            d->reason = fc_reason;
            d->why_value = fc_value;
            d->why_limit = fc_limit;
        }
        d->trigger = 1;
        if (d->slack >= INF_MS) d->slack = 0;
    }
    if (d->add > cfg->max_joiners) d->add = cfg->max_joiners;
    if (d->add > PLAN_MAX_CHAIN) d->add = PLAN_MAX_CHAIN;
    if (d->add < 0) d->add = 0;
}

static int emit(struct plan_action *out, int cap, int *n, const struct plan_action *a)
{
    if (*n >= cap) return -1;
    out[(*n)++] = *a;
    return 0;
}

static void scale_up(const struct plan_config *cfg, const struct plan_view *v, struct tick *t,
                     const struct demand *d, struct plan_action *out, int cap, int *n_out)
{
    int m = d->m, idx[PLAN_MAX_CHAIN], n = 0;
    /* Standbys of m first (they hold its first layers), then the best free nodes, by selection
     * (deterministic, no sort state). */
    while (n < d->add) {
        int best = -1;
        for (int i = 0; i < v->n_nodes; i++) {
            const struct plan_node *c = &v->nodes[i];
            if (!c->alive || !c->standby || c->engine_model != m || t->taken[i] ||
                in_progress_chain(v, c->id, -1, -1))
                continue;
            if (best < 0 || c->layers_resident > v->nodes[best].layers_resident ||
                (c->layers_resident == v->nodes[best].layers_resident &&
                 better_joiner(cfg, v, m, c, &v->nodes[best])))
                best = i;
        }
        if (best < 0) break;
        t->taken[best] = 1;
        idx[n++] = best;
    }
    int n_standby = n;
    while (n < d->add) {
        int best = -1;
        for (int i = 0; i < v->n_nodes; i++) {
            const struct plan_node *c = &v->nodes[i];
            if (!c->alive || c->engine_model >= 0 || t->taken[i] || (c->refused >> m & 1) ||
                in_progress_chain(v, c->id, -1, -1) ||
                (!has_slot(v, c, m) && !can_switch(v, t, i, m)))
                continue;
            if (best < 0 || better_joiner(cfg, v, m, c, &v->nodes[best])) best = i;
        }
        if (best < 0) break;
        t->taken[best] = 1;
        t->switching[best] = has_slot(v, &v->nodes[best], m) ? 0 : (unsigned char)(m + 1);
        idx[n++] = best;
    }
    if (n == 0) return;
    /* Joiners that hold m in host memory load over their own PCIe (source = themselves) unless
     * the hop from the network source is faster; standbys stream their missing layers alone
     * (each from its own layer on); the others form one chain from that source. */
    int src = pick_source(v, t, m);
    int chain[PLAN_MAX_CHAIN], nc = 0;
    for (int j = 0; j < n; j++) {
        const struct plan_node *c = &v->nodes[idx[j]];
        int local = (int)(c->host_cached >> m & 1);
        if (local && src >= 0 && c->host_Bps > 0 && hop_Bps(&v->nodes[src], c) > c->host_Bps)
            local = 0;
        if (local || (j < n_standby && src >= 0)) {
            struct plan_action a = {.kind = PLAN_SCALE_UP,
                                    .model = m,
                                    .source = local ? c->id : v->nodes[src].id,
                                    .node = c->id,
                                    .n_chain = 1,
                                    .reason = d->reason,
                                    .handover = -1,
                                    .why_value = d->why_value,
                                    .why_limit = d->why_limit};
            a.chain[0] = c->id;
            if (emit(out, cap, n_out, &a)) return;
        } else if (j >= n_standby) {
            chain[nc++] = idx[j];
        }
    }
    if (nc == 0) return;
    if (src < 0) { /* no copy anywhere live: give the nodes back, nothing to stream */
        for (int j = 0; j < nc; j++) t->taken[chain[j]] = t->switching[chain[j]] = 0;
        return;
    }
    order_chain(v, m, src, chain, nc);
    t->sources[src]++;
    struct plan_action a = {.kind = PLAN_SCALE_UP,
                            .model = m,
                            .source = v->nodes[src].id,
                            .n_chain = nc,
                            .reason = d->reason,
                            .handover = -1,
                            .why_value = d->why_value,
                            .why_limit = d->why_limit};
    for (int j = 0; j < nc; j++) a.chain[j] = v->nodes[chain[j]].id;
    a.node = a.chain[0];
    emit(out, cap, n_out, &a);
}

/* Adds rack to the distinct racks racks[0..*n) (capacity PLAN_MAX_NODES). */
static void rack_add(int *racks, int *n, int rack)
{
    for (int i = 0; i < *n; i++)
        if (racks[i] == rack) return;
    if (*n < PLAN_MAX_NODES) racks[(*n)++] = rack;
}

static int rack_in(const int *racks, int n, int rack)
{
    for (int i = 0; i < n; i++)
        if (racks[i] == rack) return 1;
    return 0;
}

static void restore_r(const struct plan_view *v, struct tick *t, int m, struct plan_action *out,
                      int cap, int *n_out)
{
    const struct plan_model *pm = &v->models[m];
    /* The racks that hold a copy of m, finished or on its way (and, below, picked this tick). */
    int racks[PLAN_MAX_NODES], n_racks = 0;
    int holders = 0, pending = 0;
    for (int i = 0; i < v->n_nodes; i++)
        if (host_holds(&v->nodes[i], m) && !switching_away(v, t, i, m)) {
            holders++;
            rack_add(racks, &n_racks, v->nodes[i].rack);
        }
    for (int s = 0; s < v->n_scaleouts; s++)
        if (v->scaleouts[s].kind == PLAN_SO_HOST && v->scaleouts[s].model == m)
            for (int j = 0; j < v->scaleouts[s].n_chain; j++) {
                const struct plan_node *c = node_by_id(v, v->scaleouts[s].chain[j]);
                pending += c && c->alive;
                if (c && c->alive) rack_add(racks, &n_racks, c->rack);
            }
    int want = pm->replicas_cached - holders - pending;
    if (want <= 0) return;
    int src = pick_source(v, t, m);
    if (src < 0) return; /* lost: nothing live holds m (see planner_loss_probability) */
    struct plan_action a = {.kind = PLAN_REPLICATE_HOST,
                            .model = m,
                            .source = v->nodes[src].id,
                            .reason = PLAN_WHY_DURABILITY,
                            .handover = -1,
                            .why_value = holders + pending,
                            .why_limit = pm->replicas_cached};
    while (a.n_chain < want && a.n_chain < PLAN_MAX_CHAIN) {
        /* A rack with no copy yet first (a rack's switch or power takes all its copies at
         * once), then the lowest failure probability, then the lowest id. */
        int best = -1, best_new = 0;
        for (int i = 0; i < v->n_nodes; i++) {
            const struct plan_node *c = &v->nodes[i];
            if (!c->alive || host_holds(c, m) || i == src || t->taken[i] || (c->refused >> m & 1) ||
                in_progress_chain(v, c->id, PLAN_SO_HOST, m) || !has_slot(v, c, m))
                continue;
            int is_new = !rack_in(racks, n_racks, c->rack);
            const struct plan_node *b = best >= 0 ? &v->nodes[best] : NULL;
            if (!b || is_new > best_new ||
                (is_new == best_new && (c->fail_prob < b->fail_prob ||
                                        (c->fail_prob == b->fail_prob && c->id < b->id)))) {
                best = i;
                best_new = is_new;
            }
        }
        if (best < 0) break;
        t->taken[best] = 1;
        rack_add(racks, &n_racks, v->nodes[best].rack);
        a.chain[a.n_chain++] = v->nodes[best].id;
    }
    if (a.n_chain == 0) return;
    a.node = a.chain[0];
    t->sources[src]++;
    emit(out, cap, n_out, &a);
}

static int in_scaleout(const struct plan_view *v, int id)
{
    for (int i = 0; i < v->n_nodes; i++) {
        const struct plan_node *n = &v->nodes[i];
        if (n->alive && n->engine_model >= 0 &&
            n->layers_resident < v->models[n->engine_model].layers && n->helper == id)
            return 1;
    }
    for (int s = 0; s < v->n_scaleouts; s++) {
        if (v->scaleouts[s].source == id) return 1;
        for (int j = 0; j < v->scaleouts[s].n_chain; j++)
            if (v->scaleouts[s].chain[j] == id) return 1; /* still joining: not idle, new */
    }
    return 0;
}

static int idle_for(const struct plan_view *v, const struct plan_node *n, double ms)
{
    return n->load.queue_len == 0 && n->load.running_seqs == 0 && n->load.helping == 0 &&
           n->load.idle_since_ms >= 0 && v->now_ms - n->load.idle_since_ms >= ms;
}

/* Partial residency: how many standbys m should have (the burst the forecast may miss, in
 * replicas) and how many layers each keeps (what cannot stream within the TTFT SLO). */
static int standby_target(const struct plan_config *cfg, const struct plan_view *v,
                          const struct demand *d, int *keep)
{
    const struct plan_model *pm = &v->models[d->m];
    *keep = 0;
    if (cfg->standby_max <= 0 || !pm->fc_valid || d->rep_tok_s <= 0 ||
        d->load_ms <= pm->ttft_slo_ms)
        return 0;
    int k = (int)ceil(pm->layers * (1 - pm->ttft_slo_ms / d->load_ms));
    if (k < 1) k = 1;
    if (k > pm->layers - 1) k = pm->layers - 1;
    if (k < 1) return 0;
    *keep = k;
    int want = (int)ceil(pm->fc_err / d->rep_tok_s); /* one forecast error, in replicas */
    return want < cfg->standby_max ? want : cfg->standby_max;
}

static int standbys_of(const struct plan_view *v, int m)
{
    int n = 0;
    for (int i = 0; i < v->n_nodes; i++)
        n += v->nodes[i].alive && v->nodes[i].standby && v->nodes[i].engine_model == m;
    return n;
}

static void scale_down(const struct plan_config *cfg, const struct plan_view *v,
                       const struct tick *t, const struct demand *d, struct plan_action *out,
                       int cap, int *n_out)
{
    int m = d->m, keep = 0;
    int standby_want = standby_target(cfg, v, d, &keep);
    const struct plan_model *pm = &v->models[m];
    int holders = 0, serving = 0, best = -1;
    for (int i = 0; i < v->n_nodes; i++) {
        const struct plan_node *n = &v->nodes[i];
        holders += host_holds(n, m) && !switching_away(v, t, i, m); /* its copy is going */
        serving += serves_alone(v, n, m);
    }
    for (int i = 0; i < v->n_nodes; i++) {
        const struct plan_node *n = &v->nodes[i];
        if (!n->alive || n->engine_model != m || n->standby || !idle_for(v, n, pm->keep_alive_ms) ||
            in_scaleout(v, n->id))
            continue;
        /* never the last copy: an engine replica that is the only whole copy stays */
        if (serves_alone(v, n, m) && holders == 0 && serving <= 1) continue;
        /* keep the fastest GPUs: drop the slowest, then the highest id */
        if (best < 0 || tput_of(v, n, m) < tput_of(v, &v->nodes[best], m) ||
            (tput_of(v, n, m) == tput_of(v, &v->nodes[best], m) && n->id > v->nodes[best].id))
            best = i;
    }
    if (best >= 0) {
        struct plan_action a = {.kind = PLAN_SCALE_DOWN,
                                .model = m,
                                .source = -1,
                                .node = v->nodes[best].id,
                                .reason = PLAN_WHY_IDLE,
                                .handover = -1,
                                .why_value = v->now_ms - v->nodes[best].load.idle_since_ms,
                                .why_limit = pm->keep_alive_ms};
        if (standbys_of(v, m) < standby_want && serves_alone(v, &v->nodes[best], m))
            a.keep_layers = keep;
        emit(out, cap, n_out, &a);
    }
    /* Host copies above R, on nodes not serving m and idle for the keep-alive: one per tick. */
    if (holders <= pm->replicas_cached || holders <= 1) return;
    for (int s = 0; s < v->n_scaleouts; s++)
        if (v->scaleouts[s].model == m) return; /* a copy may be a source right now */
    /* A copy that shares its rack with another copy first: dropping it leaves the copies in as
     * many racks; then the highest failure probability, then the highest id. */
    best = -1;
    int best_shared = 0;
    for (int i = 0; i < v->n_nodes; i++) {
        const struct plan_node *n = &v->nodes[i];
        if (!host_holds(n, m) || n->engine_model == m || !idle_for(v, n, pm->keep_alive_ms) ||
            switching_away(v, t, i, m))
            continue;
        int shared = 0;
        for (int j = 0; j < v->n_nodes && !shared; j++)
            shared = j != i && v->nodes[j].rack == n->rack && host_holds(&v->nodes[j], m) &&
                     !switching_away(v, t, j, m);
        const struct plan_node *b = best >= 0 ? &v->nodes[best] : NULL;
        if (!b || shared > best_shared ||
            (shared == best_shared &&
             (n->fail_prob > b->fail_prob || (n->fail_prob == b->fail_prob && n->id > b->id)))) {
            best = i;
            best_shared = shared;
        }
    }
    if (best >= 0) {
        struct plan_action a = {.kind = PLAN_DROP_HOST,
                                .model = m,
                                .source = -1,
                                .node = v->nodes[best].id,
                                .reason = PLAN_WHY_DURABILITY,
                                .handover = -1,
                                .why_value = holders,
                                .why_limit = pm->replicas_cached};
        emit(out, cap, n_out, &a);
    }
}

/* The best TTFT the replicas of m predict for the queue's mean prompt once `leaving` (an index)
 * has gone and its queue and sequences went to `to` (an index, -1: nobody), with what this tick's
 * earlier scale-ins took away and handed over: the test scale-up makes (model_demand), so a
 * scale-in never leaves the model late by its own trigger (each would undo the other a tick
 * later: the queue is no longer in the forecast's demand, and arrivals that stop leave one). */
static double ttft_after_leave(const struct plan_config *cfg, const struct plan_view *v,
                               const struct tick *t, const struct demand *d, int leaving, int to)
{
    double best = INF_MS;
    for (int i = 0; i < v->n_nodes; i++) {
        struct plan_node n = v->nodes[i];
        if (i == leaving || t->taken[i] || !n.alive || n.engine_model != d->m || n.standby)
            continue;
        n.load.queued_tokens += t->tok_in[i];
        n.load.running_seqs += t->seq_in[i];
        if (i == to) {
            n.load.queued_tokens += v->nodes[leaving].load.queued_tokens;
            n.load.running_seqs += v->nodes[leaving].load.running_seqs;
        }
        double ttft = planner_predict_ttft_ms(cfg, v, &n, d->m, d->mean_prompt);
        if (ttft < best) best = ttft;
    }
    return best;
}

/* Capacity scale-in: down to the replicas the forecast's demand (with fc_z_in errors) needs at
 * util_low and their KV at PLAN_KV_LOW, as many as that allows this tick: each time the replica
 * with the fewest running sequences (then the fewest queued tokens, then the highest id); a busy
 * one hands its requests to the serving replica with the most KV room that can take them. Only
 * while the replicas left still predict the queue a TTFT within util_low x the SLO; not while m
 * scales out or is late. */
static void scale_in(const struct plan_config *cfg, const struct plan_view *v, struct tick *t,
                     const struct demand *d, struct plan_action *out, int cap, int *n_out)
{
    int m = d->m;
    const struct plan_model *pm = &v->models[m];
    if (!cfg->handover || !pm->fc_valid || d->n_serving < 2 || d->rep_tok_s <= 0) return;
    for (int s = 0; s < v->n_scaleouts; s++)
        if (v->scaleouts[s].model == m && v->scaleouts[s].kind == PLAN_SO_ENGINE) return;
    int keep_n = (int)ceil(d->hold_tok_s / (d->rep_tok_s * cfg->util_low));
    int keep_kv = (int)ceil(d->kv_sum / PLAN_KV_LOW);
    if (keep_kv > keep_n) keep_n = keep_kv;
    if (cfg->max_seqs > 0) {
        int keep_slots = (int)ceil(d->seqs / (cfg->max_seqs * PLAN_SLOTS_LOW));
        if (keep_slots > keep_n) keep_n = keep_slots;
    }
    if (keep_n < 1) keep_n = 1;
    int standby_keep = 0, standby_want = standby_target(cfg, v, d, &standby_keep);
    int standbys = standbys_of(v, m);
    for (int left = d->n_serving - keep_n; left > 0; left--) {
        int best = -1;
        for (int i = 0; i < v->n_nodes; i++) {
            const struct plan_node *n = &v->nodes[i];
            if (!serves_alone(v, n, m) || n->standby || in_scaleout(v, n->id) || t->taken[i] ||
                t->receiving[i] || n->load.helping > 0)
                continue;
            const struct plan_node *b = best >= 0 ? &v->nodes[best] : NULL;
            if (!b || n->load.running_seqs < b->load.running_seqs ||
                (n->load.running_seqs == b->load.running_seqs &&
                 (n->load.queued_tokens < b->load.queued_tokens ||
                  (n->load.queued_tokens == b->load.queued_tokens && n->id > b->id))))
                best = i;
        }
        if (best < 0) return;
        const struct plan_node *leaving = &v->nodes[best];
        int to = -1;
        if (leaving->load.running_seqs > 0 || leaving->load.queue_len > 0) {
            /* the receiver with the most KV room left, counting what it takes this tick */
            for (int i = 0; i < v->n_nodes; i++) {
                const struct plan_node *n = &v->nodes[i];
                if (i == best || !serves_alone(v, n, m) || n->standby || t->taken[i] ||
                    n->load.kv_used + t->kv_in[i] + leaving->load.kv_used > 0.9)
                    continue;
                double ka = n->load.kv_used + t->kv_in[i];
                double kb = to >= 0 ? v->nodes[to].load.kv_used + t->kv_in[to] : 0;
                if (to < 0 || ka < kb || (ka == kb && n->id < v->nodes[to].id)) to = i;
            }
            if (to < 0) return; /* nobody can take its sequences now */
        }
        if (ttft_after_leave(cfg, v, t, d, best, to) > pm->ttft_slo_ms * cfg->util_low) return;
        if (to >= 0) {
            t->kv_in[to] += (float)leaving->load.kv_used;
            t->tok_in[to] += leaving->load.queued_tokens;
            t->seq_in[to] += leaving->load.running_seqs;
            t->receiving[to] = 1;
        }
        t->taken[best] = 1;
        struct plan_action a = {.kind = PLAN_SCALE_DOWN,
                                .model = m,
                                .source = -1,
                                .node = leaving->id,
                                .reason = PLAN_WHY_CAPACITY,
                                .handover = to >= 0 ? v->nodes[to].id : -1,
                                .keep_layers = standbys < standby_want ? standby_keep : 0,
                                .why_value = d->hold_tok_s,
                                .why_limit = (d->n_serving - 1) * d->rep_tok_s * cfg->util_low};
        standbys += a.keep_layers > 0;
        if (emit(out, cap, n_out, &a)) return;
    }
}

/* Standbys beyond what the forecast's error asks for give their layers back, one per tick. */
static void trim_standby(const struct plan_config *cfg, const struct plan_view *v,
                         const struct tick *t, const struct demand *d, struct plan_action *out,
                         int cap, int *n_out)
{
    int keep, want = standby_target(cfg, v, d, &keep), have = standbys_of(v, d->m);
    if (have <= want) return;
    int best = -1;
    for (int i = 0; i < v->n_nodes; i++) {
        const struct plan_node *n = &v->nodes[i];
        if (!n->alive || !n->standby || n->engine_model != d->m || t->taken[i] ||
            in_progress_chain(v, n->id, -1, -1))
            continue;
        if (best < 0 || n->id > v->nodes[best].id) best = i;
    }
    if (best < 0) return;
    struct plan_action a = {.kind = PLAN_SCALE_DOWN,
                            .model = d->m,
                            .source = -1,
                            .node = v->nodes[best].id,
                            .reason = PLAN_WHY_STANDBY,
                            .handover = -1,
                            .why_value = have,
                            .why_limit = want};
    emit(out, cap, n_out, &a);
}

int planner_step(const struct plan_config *cfg, const struct plan_view *v, struct plan_action *out,
                 int cap, char *err)
{
    if (check_view(v, err)) return -1;
    struct tick t;
    memset(&t, 0, sizeof t);
    int n_out = 0;
    /* 1. durability first: copies lost with a dead holder */
    for (int m = 0; m < v->n_models; m++) restore_r(v, &t, m, out, cap, &n_out);
    /* 2. scale up, the model with the least slack first (it gets the best free GPUs) */
    struct demand d[PLAN_MAX_MODELS];
    for (int m = 0; m < v->n_models; m++) model_demand(cfg, v, m, &d[m]);
    for (int round = 0; round < v->n_models; round++) {
        int pick = -1;
        for (int m = 0; m < v->n_models; m++)
            if (d[m].trigger && d[m].add > 0 && (pick < 0 || d[m].slack < d[pick].slack)) pick = m;
        if (pick < 0) break;
        scale_up(cfg, v, &t, &d[pick], out, cap, &n_out);
        d[pick].trigger = 0;
    }
    /* 3. scale down what has idled for its keep-alive, and (with the forecast) what the demand no
     * longer needs; not a model that is late or growing now */
    for (int m = 0; m < v->n_models; m++) {
        if (d[m].slack < 0 || d[m].add > 0) continue;
        int before = n_out;
        scale_down(cfg, v, &t, &d[m], out, cap, &n_out);
        int engine_left = 0;
        for (int k = before; k < n_out; k++) engine_left |= out[k].kind == PLAN_SCALE_DOWN;
        if (!engine_left) scale_in(cfg, v, &t, &d[m], out, cap, &n_out);
        trim_standby(cfg, v, &t, &d[m], out, cap, &n_out);
    }
    return n_out;
}
