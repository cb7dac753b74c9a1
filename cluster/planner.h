/* planner: the cluster's scale and routing decisions, as a pure function of a view of the cluster.
 *
 * Contract:
 * - No I/O, no clock, no globals, no allocation: every input is in `struct plan_view` (time is
 *   view->now_ms), every output goes into caller-provided arrays. The same view and config give
 *   the same actions in the same order (ties are broken by node id, then model index), so the
 *   live control thread (cluster/control) and the simulator (cluster/sim) run this very code.
 * - Node ids are the caller's (any int >= 0); models are named by their index in view->models
 *   (at most PLAN_MAX_MODELS; plan_node.host_cached is a bit set over those indices).
 * - One call to planner_step() returns the actions for this tick; the caller carries them out and
 *   reflects their effect in the next view (a scale-out appears in view->scaleouts and its joiners
 *   get engine_model = M, layers_resident = k < L, helper = a serving node until k = L). The
 *   planner never assumes an action happened: what is not in the next view did not happen.
 *
 * Decisions (DESIGN.md "Cluster and autoscaling", BlitzScale OSDI'25, Gavel OSDI'20):
 * - Predictions come from serving/sched/step_model.h (the scheduler's own step-time model, one per
 *   GPU type x model in the view): the TTFT a new request would see on a node is the time to
 *   prefill the node's queued prompt tokens plus its own in steps of cfg->max_step_tokens, each
 *   step also decoding the node's running sequences (planner_predict_ttft_ms). A joining node
 *   with k of L layers resident runs layers [0,k) itself and its helper runs [k,L): its
 *   prediction is k/L of its own plus (L-k)/L of its helper's (the helper's queue included).
 * - Scale up model M when the best prediction over M's replicas (serving or joining) for a
 *   request of M's mean queued prompt exceeds M's TTFT SLO: slack = SLO - predicted < 0, the
 *   scheduler's test (serving/sched/scheduler.c waiting_slack) applied to the cluster. Exactly at
 *   the SLO (slack == 0) is not a trigger. A model with queued requests and no replica scales up
 *   (a cold start). How many: enough replicas that the queued work, spread evenly, drains within
 *   the SLO, minus the replicas serving and joining; at most cfg->max_joiners per tick.
 * - Placement: a joiner is a live node with no model in its engine, in no scale-out in progress,
 *   that has not refused M lately (plan_node.refused), and with a free model slot (plan_node.model_slots) or else a switch: it holds other models in
 *   host memory only, each with another live host copy (one not itself switching away); the
 *   scale-up drops them first (never a model's last host copy). With the matrix (default) the
 *   candidates are ranked by effective throughput of M on their GPU type (tokens/s, Gavel's
 *   matrix) per waiting request of M it would absorb, then by host-cached M (PCIe instead of the
 *   network), then a free slot before a switch, then by id. cfg->ignore_matrix ranks by
 *   host-cached, free slot, then id (the ablation).
 * - A joiner holding M in host memory loads it over its own PCIe (source = itself) unless the
 *   network hop from the chosen source is faster (NVLink within a server usually is).
 * - Source: a live node holding all of M (host cache or engine with k = L), not switching to
 *   another model (this tick, or in a scale-out in progress), whose link is not
 *   already a source of another scale-out, fastest link first, then id; if every holder is busy,
 *   the holder serving the fewest scale-outs. Chain order: see planner.c (greedy, fastest link
 * next).
 * - Scale down: per model and tick at most one engine replica, one that has been idle (empty
 *   queue, nothing running) for the model's keep-alive and is no helper, source or joiner of a
 *   scale-out in progress; the model may go to zero engine replicas
 *   while host-cached. Host copies above R are dropped one per tick after the keep-alive; never
 *   the last host copy, never below R. Of the idle copies, one whose rack holds another copy goes
 *   first (the copies stay in as many racks), then the highest failure probability, then id.
 * - Restore R: when fewer than R live nodes hold M in host memory (a holder died), copy M from a
 *   live holder to the live non-holder with a free model slot that has not refused M lately
 *   (nothing is evicted for it; a model on its way there takes a slot): one in a rack that holds
 *   no copy of M yet (finished, on its way, or picked this tick) first, then the lowest failure
 *   probability, then id. With no such node R waits until one frees up (an idle extra copy of
 *   another model is dropped, a node joins). Copies already in one rack are not moved (only new copies and drops spread them).
 * - Routing (planner_route): the replica of M with the least predicted TTFT, ties by id.
 *
 * Beyond the reactive trigger (each acts only on the inputs it needs; all off or inert with the
 * defaults a caller that fills none of them gets, as cluster/control.c does today):
 * - Proactive scale-up (cfg->proactive, needs models[m].fc_valid): a Holt forecast of m's prompt
 *   tokens/s (planner_forecast_*, the caller keeps its state) at the horizon of one scale-out
 *   (never below its level), plus fc_z times its error, plus the queued prompt tokens over the
 *   SLO, against the replicas' prefill capacity (planner_prefill_tok_s: a full prompt chunk per
 *   step within the TPOT guard) times cfg->util_high; the shortfall in replicas is added (reason
 *   PLAN_WHY_FORECAST). Also replicas for the KV in use at 95% (BlitzScale's Eq.1 bound), and
 *   where cfg->max_seqs is known, for the running and waiting requests at 1.25 x the replicas'
 *   batch slots: requests that wait for a slot (short prompts, long answers) are a shortfall the
 *   prefill capacity and the TTFT prediction do not see (scale-in keeps them under 0.75 x).
 * - Onset detector (cfg->onset_ratio > 0, needs fc_valid): a clump of arrivals shows in the fast
 *   rate (models[m].fc_fast, a 300 ms exponential window updated every tick) before a forecast
 *   period closes; where it passes onset_ratio x the forecast, the demand is the fast rate, both
 *   to scale up on (at once, for the whole clump) and for scale-in to keep capacity for.
 * - Capacity scale-in (cfg->handover, needs fc_valid): down to the replicas the same demand (with
 *   fc_z_in errors) needs at cfg->util_low and the KV at 75%, as many a tick as that allows, the
 *   fewest running sequences first; a busy one hands its sequences to the serving replica with
 *   the most KV room (plan_action.handover): the executor moves them (KV transfer), so none fails
 *   or restarts. Not while m scales out or is late, nor where the replicas left (the receiver
 *   with the leaver's queue and sequences) would predict the queue's mean prompt a TTFT past
 *   util_low x the SLO: that is scale-up's trigger, and without this test a backlog left once
 *   arrivals stop (the forecast near 0) had a replica scaled in and out again every tick
 *   (test scale_in_keeps_what_the_queue_needs). A replica running other nodes' sequences
 *   (load.helping: a receiver of a hand-over, a helper), or picked as a receiver this tick, does
 *   not leave; nor is a helping node idle (scale-down, host-copy drop).
 * - Partial residency (cfg->standby_max > 0): a replica that leaves keeps layers [0, k) resident
 *   as a standby (plan_action.keep_layers, plan_node.standby) while fewer than S standbys exist,
 *   S = ceil(fc_err / one replica's capacity) (one forecast error's burst, in replicas), k the
 *   share of the model that cannot stream within the TTFT SLO, k = L (1 - SLO / load time). A
 *   scale-up takes standbys first and streams only layers [k, L) to each; extra standbys drop
 *   one a tick.
 * - Measured inputs: link_Bps, nvlink_Bps, host_Bps, fail_prob and step_own are what the caller
 *   measured (the simulator gives its configured truths), read alike by live and simulated runs. */
#ifndef STRATA_PLANNER_H
#define STRATA_PLANNER_H

#include "serving/sched/step_model.h"

#include <stdint.h>

#define PLAN_MAX_MODELS 64
#define PLAN_MAX_CHAIN  128
#define PLAN_MAX_NODES  4096

struct plan_model {
    int layers;           /* L */
    double bytes;         /* weights */
    double ttft_slo_ms;   /* TTFT target */
    double tpot_slo_ms;   /* time per output token target */
    int replicas_cached;  /* R: host-memory copies to keep (>= 1) */
    double keep_alive_ms; /* idle time before an engine replica (or extra host copy) goes */
    int held;             /* requests of this model held by the router for lack of a replica */
    long held_tokens;     /* their prompt tokens */
    /* The leading signal (planner_forecast_fill): prompt tokens/s arriving for m, smoothed. */
    int fc_valid;    /* 0: no forecast (proactive scale-up and capacity scale-in stay off) */
    double fc_level; /* tokens/s now */
    double fc_trend; /* tokens/s per second */
    double fc_err;   /* mean absolute one-period forecast error, tokens/s */
    double fc_fast;  /* the onset signal: tokens/s over the last plan_forecast.fast_ms or so,
                      * updated at every observation (planner_forecast_observe) */
};

/* What a node's scheduler reports (serve_metrics + step model), as of the view's time. */
struct plan_load {
    int queue_len;        /* waiting requests (not yet admitted) */
    long queued_tokens;   /* prompt tokens of those requests not yet prefilled */
    int running_seqs;     /* admitted sequences (decoding or mid-prefill) */
    double kv_used;       /* fraction of KV blocks in use, 0..1 */
    double idle_since_ms; /* view time since when queue and running are both empty; < 0: busy */
    int helping; /* other nodes' sequences whose layers run here (a joiner's, a hand-over's): the
                  * node is not idle and does not leave (they would fail) */
};

struct plan_node {
    int id;
    int alive;
    int gpu_type;         /* index into the view's matrix rows */
    int domain;           /* NVLink domain (server): same domain = NVLink between the two */
    int rack;             /* failure domain (rack: its switch, its power): same rack = lost
                           * together; any int, all 0 when the caller knows no racks */
    double link_Bps;      /* network bytes/s of this node's NIC (the chain's per-hop rate) */
    double nvlink_Bps;    /* bytes/s to a node of the same domain (0: no NVLink) */
    double host_Bps;      /* bytes/s host memory -> GPU (PCIe); 0: unknown (a local load wins) */
    double fail_prob;     /* probability this node is lost over the horizon that matters */
    uint64_t host_cached; /* bit m: model m in host memory (whole) */
    int engine_model;     /* model in the engine, -1: none */
    int layers_resident;  /* k of L of engine_model (L: serving alone) */
    int helper;           /* while k < L: the node id running layers [k,L) for it; else -1 */
    int sources_busy;     /* scale-outs this node is the source of right now */
    int model_slots;      /* models it can hold at once, host copies and engine together (the
                           * serving process: 1); 0: no limit (the simulator's servers) */
    uint64_t refused;     /* bit m: it refused (or failed) a scale-out of m lately: no joiner or
                           * new host copy of m goes there */
    int standby;          /* 1: holds layers [0, layers_resident) of engine_model and serves nothing
                           * (partial residency); a scale-up there streams only the rest */
    struct step_model step_own; /* this node's own fitted step model; a = c = 0: its type's */
    struct plan_load load;
};

enum plan_scaleout_kind { PLAN_SO_ENGINE, PLAN_SO_HOST };

struct plan_scaleout {
    int kind; /* enum plan_scaleout_kind */
    int model;
    int source; /* node id */
    int n_chain;
    int chain[PLAN_MAX_CHAIN]; /* node ids in forwarding order */
    double started_ms;
};

struct plan_view {
    double now_ms;
    const struct plan_node *nodes;
    int n_nodes;
    const struct plan_model *models;
    int n_models;
    const struct plan_scaleout *scaleouts; /* in progress */
    int n_scaleouts;
    int n_gpu_types;
    const double *tput;            /* [gpu_type * n_models + m]: tokens/s (Gavel's matrix) */
    const struct step_model *step; /* [gpu_type * n_models + m]: step time of m on that type */
};

struct plan_config {
    int max_step_tokens; /* the scheduler's per-step token budget (prefill chunking) */
    int max_seqs;        /* the scheduler's sequences at once per replica (0: unknown, no bound) */
    int max_joiners;     /* at most this many joiners per model per tick (<= PLAN_MAX_CHAIN) */
    int ignore_matrix;   /* 1: placement ignores the throughput matrix (ablation) */
    int proactive;       /* 1 (default): scale up on the forecast where models[m].fc_valid */
    int handover;        /* 1: capacity scale-in, busy replicas hand their sequences over (the
                          * executor must move them); 0 (default): only idle replicas leave */
    int standby_max;     /* partial residency: standbys per model (0, default: none) */
    /* capacity targets (chosen on the Azure traces in the simulator, docs/simulator.md): scale up
     * when the demand passes util_high x the replicas' nominal prefill capacity (which assumes a
     * full chunk every step, more than a short queue gives: hence above 1), in while it stays
     * under util_low x one replica fewer */
    double util_high; /* 1.1 */
    double util_low;  /* 0.9 */
    double fc_z;      /* forecast error multiple added to the demand to scale up on (0) */
    double fc_z_in;   /* ... and to the demand scale-in keeps capacity for (0) */
    /* Onset detector: where the fast rate (models[m].fc_fast) passes onset_ratio x the
     * forecast, the demand is the fast rate, to scale up on and for scale-in to keep (1.5; 0:
     * off). The forecast's periods close too late for a clump that arrives within one. */
    double onset_ratio;
    double fc_queue; /* weight of the queued prompt tokens over the SLO in the forecast's demand
                      * (0: the reactive trigger alone drains queues; 1: the old rule) */
};

enum plan_action_kind {
    PLAN_SCALE_UP,       /* load model onto chain[] from source (engine, layer-wise, live) */
    PLAN_SCALE_DOWN,     /* drop model from node's engine (host copy, if any, stays) */
    PLAN_REPLICATE_HOST, /* copy model from source into node's host memory (restore R) */
    PLAN_DROP_HOST       /* drop model from node's host memory (above R, idle) */
};

/* Why an action was taken: the simulator counts a forecast's scale-ups that served nothing (its
 * false positives) in GPU-seconds. */
enum plan_reason {
    PLAN_WHY_SLACK,      /* predicted TTFT past the SLO (reactive) */
    PLAN_WHY_COLD,       /* requests held, no replica */
    PLAN_WHY_FORECAST,   /* the forecast's demand exceeds capacity (proactive) */
    PLAN_WHY_IDLE,       /* idle for the keep-alive */
    PLAN_WHY_CAPACITY,   /* demand fits fewer replicas (capacity scale-in) */
    PLAN_WHY_DURABILITY, /* host copies: restore R, drop extras */
    PLAN_WHY_STANDBY,    /* a standby beyond what the forecast's error asks for */
    PLAN_WHY_KV,         /* the replicas' KV in use past 95% of theirs (proactive) */
    PLAN_WHY_SLOTS       /* running and waiting requests past 1.25 x the batch slots (proactive) */
};

struct plan_action {
    int kind; /* enum plan_action_kind */
    int model;
    int source; /* node id, -1 when not a copy */
    int node;   /* target node id (scale down, replicate, drop); chain[0] for scale up */
    int n_chain;
    int chain[PLAN_MAX_CHAIN];
    int reason;      /* enum plan_reason */
    int handover;    /* PLAN_SCALE_DOWN: the node taking its running and queued requests (-1:
                      * none, the node is idle) */
    int keep_layers; /* PLAN_SCALE_DOWN: layers [0, keep_layers) stay resident (a standby) */
    /* What the reason compared, for people (the log, /v1/cluster's events): SLACK the best
     * predicted TTFT and the SLO (ms); COLD the requests held (limit 0); FORECAST the demand and
     * the replicas' capacity (prompt tokens/s); KV the KV in use and the bound (summed fractions);
 * SLOTS the requests and the bound; IDLE the idle time and the keep-alive (ms);
     * CAPACITY the demand and what one replica fewer takes (tokens/s); DURABILITY the host
     * copies and R; STANDBY the standbys and how many are wanted. */
    double why_value, why_limit;
};

struct plan_route {
    int node;   /* node id to send the request to, -1: no replica (queue at planner) */
    int helper; /* node running layers [k,L) for it, -1: node serves alone */
    int k;      /* layers resident on node */
    double predicted_ttft_ms;
};

void plan_config_default(struct plan_config *cfg);

/* This tick's actions into out[0..cap). Returns how many (>= 0), or -1 with err when the view
 * is inconsistent (a node's model index out of range, a helper that is not a node, ...). */
int planner_step(const struct plan_config *cfg, const struct plan_view *v, struct plan_action *out,
                 int cap, char *err);

/* Where a request of model m with prompt_tokens goes now. Returns 0 (route->node may be -1 when
 * M has no replica: the caller holds the request until a scale-up lands), -1 on a bad view. */
int planner_route(const struct plan_config *cfg, const struct plan_view *v, int m,
                  int prompt_tokens, struct plan_route *route, char *err);

/* TTFT (ms) a request of prompt_tokens would see on node n (which must run m, k = L or joining). */
double planner_predict_ttft_ms(const struct plan_config *cfg, const struct plan_view *v,
                               const struct plan_node *n, int m, int prompt_tokens);

/* Time (ms) to prefill `tokens` queued prompt tokens while `running` sequences decode, in steps of
 * max_step_tokens, by step model sm. */
double planner_drain_ms(const struct step_model *sm, long tokens, int running, int max_step_tokens);

/* Prompt tokens/s node n can take for m: a full prompt chunk per step (max_step_tokens, or less
 * where the TPOT guard on its running sequences allows less), one step after another. */
double planner_prefill_tok_s(const struct plan_config *cfg, const struct plan_view *v,
                             const struct plan_node *n, int m);

/* The leading signal: Holt's linear exponential smoothing (level and trend; Holt-Winters without
 * its season, which a window of minutes does not show) of the prompt tokens/s arriving for a
 * model, over periods of period_ms. The caller owns it (one per model) and tells it, every tick,
 * the prompt tokens that arrived since the last call; a period closes when now_ms passes its end.
 * err is the mean absolute error of the forecast one period ahead (an EWMA with weight alpha). */
struct plan_forecast {
    double alpha, beta, period_ms;
    double level, trend, err;
    double start_ms, tokens; /* the open period */
    int periods;             /* closed so far */
    /* The onset signal: arrivals decaying with time constant fast_ms (300 ms by default; an
     * exponential window, so a steady rate reads as itself), updated at every observation. */
    double fast_ms, fast, last_ms;
};
void planner_forecast_init(struct plan_forecast *f, double now_ms, double period_ms, double alpha,
                           double beta);
void planner_forecast_observe(struct plan_forecast *f, double now_ms, double tokens);
/* Copies the forecast into pm's fc_* fields (valid after two closed periods). */
void planner_forecast_fill(const struct plan_forecast *f, struct plan_model *pm);
/* pm's forecast tokens/s ahead_ms from now (level + trend x ahead, at least 0). */
double planner_forecast_at(const struct plan_model *pm, double ahead_ms);

/* P(all n holders lost) = the product of their failure probabilities (independent failures). */
double planner_loss_probability(const double *fail_prob, int n);

/* The same with racks: holder i is in rack[i], and each rack fails as a whole (its switch, its
 * power) with probability rack_fail, independently of the others and of the nodes. The copies
 * of a rack are lost if the rack fails or, if it does not, all of them fail:
 *   P(loss) = prod over racks r holding copies of (q + (1 - q) prod_{i in r} p_i),  q = rack_fail.
 * All R copies in one rack: about q, whatever R; one copy per rack: about (q + p)^R. */
double planner_loss_probability_racks(const double *fail_prob, const int *rack, int n,
                                      double rack_fail);

#endif
