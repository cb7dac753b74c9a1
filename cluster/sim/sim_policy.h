/* sim_policy: the scaling policies `strata sim` compares, each a controller behind one interface.
 *
 * A controller sees the cluster as the planner does (struct plan_view: every instance a node whose
 * id is its instance index, their loads, the scale-outs in progress, the step models) plus what
 * the simulator knows of each instance (struct sim_inst_info), and answers with the planner's
 * actions (struct plan_action: scale up a chain from a source; scale down, with or without a
 * hand-over and standby layers) and, for each arriving request, an instance or none (the request
 * waits at the router until a later arrival, tick or joiner places it).
 *
 * Rules for every controller: its state lives in what init() returns; it sees time only as
 * obs->now_s; it breaks exact ties by node id and by nothing else about the listing (the
 * simulator shuffles instance ids with the seed, so a result that depended on ids would change
 * with the seed and show as spread). The data plane (where a joiner's layers come from, whether it
 * serves before it has them all) is the policy's (struct sim_policy in sim.h), not the
 * controller's.
 *
 * The controllers, each a module whose header cites its paper: sim_blitzscale.h (BlitzScale,
 * also driving stop-the-world and λScale's data plane), sim_serverlessllm.h, sim_tokenscale.h,
 * sim_fixed.h (a fixed deployment sized to the trace's peak), sim_strata.h (Strata's planner,
 * cluster/planner.h, with its leading signal). */
#ifndef STRATA_SIM_POLICY_H
#define STRATA_SIM_POLICY_H

#include "cluster/planner.h"

struct sim_config;
struct sim_policy;

struct sim_inst_info {
    long kv_cap, kv_used; /* KV tokens: capacity, reserved by admitted requests */
    int ongoing;          /* requests queued or running there */
    int gpus, server;     /* GPUs of the instance; its server (NVLink domain) */
    double prefill_tok_s; /* prompt tokens/s of back-to-back full chunks, nothing running */
    int loading_from_ssd; /* 1: loading from its server's SSD now */
    int ssd_cached;       /* its server's SSD holds the model (every server's does) */
};

struct sim_obs {
    double now_s;
    const struct plan_view *v; /* v->nodes[i].id == i; the one model is model 0 */
    const struct sim_inst_info *inst;
    int held;            /* requests waiting at the router */
    long held_tokens;    /* their prompt tokens */
    int arrived;         /* requests arrived since the previous tick */
    long arrived_tokens; /* their prompt tokens */
    const struct sim_config *c;
    const struct sim_policy *p;
    double tbt_slo_ms;
};

struct sim_controller {
    const char *name;
    double period_s; /* ticks this often; 0: the config's tick_ms */
    /* State for one run (NULL is allowed); called once, before the first tick. */
    void *(*init)(const struct sim_obs *o);
    /* Frees what init returned (NULL: a plain free()). */
    void (*fini)(void *state);
    /* Replicas serving at t = 0 (NULL: the config's `initial`). */
    int (*initial)(void *state, const struct sim_obs *o);
    /* This tick's actions into out[0..cap): how many, or -1 with err. */
    int (*tick)(void *state, const struct sim_obs *o, struct plan_action *out, int cap, char *err);
    /* Where a request with prompt_tokens goes: *node = an instance, or -1 (it waits). 0, or -1
     * with err. */
    int (*route)(void *state, const struct sim_obs *o, int prompt_tokens, int *node, char *err);
};

/* Ends a controller's state (its fini, or free()). */
void sim_controller_fini(const struct sim_controller *ctl, void *state);

extern const struct sim_controller sim_ctl_blitzscale, sim_ctl_serverlessllm, sim_ctl_tokenscale,
    sim_ctl_fixed, sim_ctl_strata;

/* Helpers the controllers share (sim_policy.c). */

/* The serving (k = L, not a standby) and joining instances of the model. */
int sim_obs_replicas(const struct sim_obs *o, int *serving, int *joining);
/* The usable instance with the least queued prompt tokens (then fewest running sequences, then
 * lowest id), skipping those with skip[i] set (may be NULL); -1 if none. Joiners count when the
 * data plane serves them live. */
int sim_route_least_loaded(const struct sim_obs *o, const unsigned char *skip);
/* Is instance i usable for a request now (serving, or a live joiner with a helper)? */
int sim_obs_usable(const struct sim_obs *o, int i);
/* The mean prompt tokens/s and KV capacity of one instance over the cluster (what a controller
 * that profiles one instance type offline uses). */
double sim_obs_mean_prefill_tok_s(const struct sim_obs *o);
double sim_obs_mean_kv_cap(const struct sim_obs *o);

#endif
